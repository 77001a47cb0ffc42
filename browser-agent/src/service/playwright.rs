//! The Playwright RPCs: requests turned into `crate::playwright` calls and back.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use browser_agent_proto::v1::{
    ExecutorInfo, ExecutorList, PlaywrightRequest, PlaywrightResult, PlaywrightTab,
};
use tonic::Status;

use super::AgentService;
use crate::playwright::{DEFAULT_EXECUTOR, PlaywrightError};

impl From<PlaywrightError> for Status {
    fn from(error: PlaywrightError) -> Self {
        match error {
            PlaywrightError::Unavailable(message) => Status::unavailable(message),
            PlaywrightError::Conflict(message) => Status::resource_exhausted(message),
            PlaywrightError::NotFound(message) => Status::not_found(message),
        }
    }
}

fn unix_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

impl AgentService {
    pub(super) async fn execute_playwright(
        &self,
        request: PlaywrightRequest,
    ) -> Result<PlaywrightResult, Status> {
        if request.timeout_ms == 0 {
            return Err(Status::invalid_argument("timeout_ms must be positive"));
        }
        let executor = match request.executor.as_str() {
            "" => DEFAULT_EXECUTOR,
            name => name,
        };
        let outcome = self
            .executors
            .clone()
            .execute(
                executor,
                request.code,
                Duration::from_millis(request.timeout_ms.into()),
            )
            .await?;
        Ok(PlaywrightResult {
            success: outcome.success,
            error: outcome.error,
            result_json: outcome.result_json,
            stdout: outcome.stdout,
            stderr: outcome.stderr,
            tab: outcome
                .tab
                .map(|(target_id, created)| PlaywrightTab { target_id, created }),
        })
    }

    pub(super) async fn executor_list(&self) -> ExecutorList {
        let executors = self
            .executors
            .list()
            .await
            .into_iter()
            .map(|executor| ExecutorInfo {
                name: executor.name,
                busy: executor.busy,
                created_at_unix_ms: unix_ms(executor.created_at),
                last_used_at_unix_ms: unix_ms(executor.last_used_at),
                target_id: executor.target_id,
                url: executor.url,
            })
            .collect();
        ExecutorList { executors }
    }
}

//! The RPCs of code next to the browser: Playwright executors and the REPL
//! (`crate::playwright`), and the browser's own HTTP requests (`crate::curl`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use browser_agent_proto::v1::{
    CurlRequest, CurlResult, ExecutorInfo, ExecutorList, HttpHeader, PlaywrightRequest,
    PlaywrightResult, PlaywrightTab, ReplImage, ReplRequest, ReplResult, ReplText, repl_content,
};
use tonic::Status;

use super::AgentService;
use crate::curl::CurlError;
use crate::playwright::{DEFAULT_EXECUTOR, PlaywrightError, ReplContent};

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
    time.duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as i64)
}

impl AgentService {
    pub(super) async fn execute_playwright(
        &self, request: PlaywrightRequest,
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
            .execute(executor, request.code, Duration::from_millis(request.timeout_ms.into()))
            .await?;
        Ok(PlaywrightResult {
            success: outcome.success,
            error: outcome.error,
            result_json: outcome.result_json,
            stdout: outcome.stdout,
            stderr: outcome.stderr,
            tab: outcome.tab.map(|(target_id, created)| PlaywrightTab { target_id, created }),
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

    pub(super) async fn browser_curl(&self, request: CurlRequest) -> Result<CurlResult, Status> {
        if request.timeout_ms == 0 {
            return Err(Status::invalid_argument("timeout_ms must be positive"));
        }
        let browser_ws_url = self.browser.borrow().browser_ws_url.clone();
        let made = crate::curl::request(
            &browser_ws_url,
            crate::curl::CurlRequest {
                url: request.url,
                method: request.method,
                headers: request.headers.into_iter().collect(),
                body: request.body,
                timeout: Duration::from_millis(request.timeout_ms.into()),
            },
        )
        .await;
        match made {
            Ok(response) => Ok(CurlResult {
                status: response.status,
                headers: response
                    .headers
                    .into_iter()
                    .map(|(name, value)| HttpHeader { name, value })
                    .collect(),
                body: response.body,
                duration_ms: response.duration.as_millis() as u64,
                failure: None,
            }),
            Err(CurlError::Failed(failure)) => {
                Ok(CurlResult { failure: Some(failure), ..CurlResult::default() })
            }
            Err(CurlError::Invalid(message)) => Err(Status::invalid_argument(message)),
            Err(CurlError::NotRunning) => Err(Status::unavailable(
                "the browser is not running (it is starting or restarting)",
            )),
        }
    }

    pub(super) async fn repl_eval(&self, request: ReplRequest) -> Result<ReplResult, Status> {
        if request.timeout_ms == 0 {
            return Err(Status::invalid_argument("timeout_ms must be positive"));
        }
        let outcome = self
            .repl
            .clone()
            .eval(request.code, request.reset, Duration::from_millis(request.timeout_ms.into()))
            .await?;
        let content = outcome
            .content
            .into_iter()
            .map(|item| browser_agent_proto::v1::ReplContent {
                kind: Some(match item {
                    ReplContent::Text { channel, text } => {
                        repl_content::Kind::Text(ReplText { channel, text })
                    }
                    ReplContent::Image { data_b64, mime_type } => {
                        repl_content::Kind::Image(ReplImage { data_b64, mime_type })
                    }
                }),
            })
            .collect();
        Ok(ReplResult {
            repl_id: outcome.repl_id,
            success: outcome.success,
            content,
            content_truncated: outcome.content_truncated,
            error: outcome.error,
            stack: outcome.stack,
            repl_terminated: outcome.terminated,
            duration_ms: outcome.duration.as_millis() as u64,
        })
    }
}

//! Admission: whether an organization may have one more browser now. Everything that
//! counts an organization's browsers and then adds to them holds this process's turn
//! and the store's per-organization lock, so that replicas never admit past a limit
//! together.

use super::{LIMIT_RETRY_AFTER, Sessions, spec};
use crate::error::{ServiceError, ServiceResult};
use crate::store::{SessionFilter, SessionRecord, scope};

impl Sessions {
    /// This process's admission turn: held, with the store's per-organization lock,
    /// by anything that counts an organization's browsers and then adds to them (a
    /// create here, a pool's create or resize). SQLite's lock is this one alone.
    pub async fn admission_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.admission.lock().await
    }

    pub(super) async fn check_live_limit(&self, record: &SessionRecord) -> ServiceResult<()> {
        if record.pool_id.is_some() {
            return Ok(());
        }
        if let Some(project_id) = &record.project_id {
            self.check_project_limit(project_id).await?;
        }
        // The organization's limits count all of its projects.
        scope::organization_wide(self.check_organization_limits(record)).await
    }

    /// A project's own cap (`projects.limits`; the default project's is also
    /// `organization.limits`' `default_project_max_concurrent_sessions`), on its live
    /// browsers and its pools' reservations together.
    async fn check_project_limit(&self, project_id: &str) -> ServiceResult<()> {
        let Some(project) = self.store.project_by_id(project_id).await? else {
            return Ok(());
        };
        let Some(cap) = project.max_concurrent_sessions else {
            return Ok(());
        };
        let (live, reserved) = self.store.project_browsers(project_id).await?;
        if live + reserved >= cap {
            return Err(ServiceError::LimitReached {
                message: format!(
                    "project {} has {live} live browsers and {reserved} reserved by its pools: \
                     its max_concurrent_sessions is {cap}; end one or try again later",
                    project.name
                ),
                retry_after: LIMIT_RETRY_AFTER,
            });
        }
        Ok(())
    }

    async fn check_organization_limits(&self, record: &SessionRecord) -> ServiceResult<()> {
        let refused = |message: String| ServiceError::LimitReached {
            message,
            retry_after: LIMIT_RETRY_AFTER,
        };
        let live = self.store.live_browser_count(&record.org_id).await?;
        if live >= u64::from(self.live_limits.browsers) {
            return Err(refused(format!(
                "the organization has {live} live browsers, its limit; end one or try again later"
            )));
        }
        let memory_of = |session: &SessionRecord| {
            session
                .vm_settings
                .memory
                .as_deref()
                .map_or(0, spec::memory_bytes)
        };
        let in_use: u64 = self
            .store
            .list_sessions(&record.org_id, SessionFilter::Live, u32::MAX, 0)
            .await?
            .iter()
            .filter(|session| session.pool_id.is_none())
            .map(memory_of)
            .sum();
        let limit = u64::from(self.live_limits.memory_gib) << 30;
        if in_use + memory_of(record) > limit {
            return Err(refused(format!(
                "the organization's live browsers have {} GiB of memory and this one asks for {}; \
                 the limit is {} GiB: end one or try again later",
                in_use >> 30,
                record.vm_settings.memory.as_deref().unwrap_or("none"),
                self.live_limits.memory_gib
            )));
        }
        Ok(())
    }
}

//! Admission: whether an organization may have one more browser now. Everything that
//! counts an organization's browsers and then adds to them holds this process's turn
//! and the store's per-organization lock, so that replicas never admit past a limit
//! together.

use super::{LIMIT_RETRY_AFTER, Sessions, spec};
use crate::error::{ServiceError, ServiceResult};
use crate::store::{SessionFilter, SessionRecord};

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
        // The organization's own cap (`organization.limits`) counts its pools'
        // reservations too.
        if let Some(cap) = self.store.concurrency_cap(&record.org_id).await? {
            let reserved: i64 = self
                .store
                .list_pools(Some(&record.org_id))
                .await?
                .iter()
                .map(|pool| pool.size)
                .sum();
            if live as i64 + reserved >= cap {
                return Err(refused(format!(
                    "the organization has {live} live browsers and {reserved} reserved by its pools: \
                     its concurrency cap is {cap} (organization limits); end one or try again later"
                )));
            }
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

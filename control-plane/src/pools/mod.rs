//! Browser pools: warm browsers that callers lease (acquire) and give back (release).
//!
//! A pool's browsers are ordinary sessions carrying its `pool_id` and a lease state
//! (idle, leased, resetting), all in the store, so pools survive restarts. A reconciler
//! keeps every pool at `size` browsers, launching at most its fill rate and replacing
//! browsers that end. Leasing is one atomic store update, so no browser is leased twice.
//! A browser released for reuse restarts Chromium with a fresh profile before it is idle
//! again, so the next lessee never sees the previous one's data.

mod config;
mod reconciler;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::Notify;

pub use config::{
    DEFAULT_FILL_RATE, DEFAULT_POOL_TIMEOUT_SECONDS, MAX_FILL_RATE, MAX_POOL_SIZE, PoolChanges,
    PoolConfig,
};

use crate::error::{ServiceError, ServiceResult};
use crate::ids;
use crate::in_progress::InProgress;
use crate::replays::Replays;
use crate::replicas::Signal;
use crate::sessions::Sessions;
use crate::store::{PoolLease, PoolRecord, SessionRecord, SessionStatus, Store, StoreError, scope};

/// How long an acquire waits by default, at most.
pub const DEFAULT_ACQUIRE_TIMEOUT_CAP: Duration = Duration::from_secs(30);

/// A pool with its typed configuration and how many of its browsers are leased and idle.
#[derive(Clone, Debug)]
pub struct PoolView {
    pub record: PoolRecord,
    pub config: PoolConfig,
    pub acquired_count: i64,
    pub available_count: i64,
}

pub struct Pools {
    store: Arc<dyn Store>,
    sessions: Arc<Sessions>,
    replays: Arc<Replays>,
    /// Most browsers all pools of one organization may hold together.
    max_pooled_browsers: i64,
    /// A browser became idle: waiting acquirers try again.
    idle: Notify,
    /// A pool changed (created, resized, flushed, released): the reconciler looks now.
    changed: Notify,
    /// Browsers this process is resetting.
    resetting: InProgress,
}

impl Pools {
    pub fn new(
        store: Arc<dyn Store>, sessions: Arc<Sessions>, replays: Arc<Replays>,
        max_pooled_browsers: i64,
    ) -> Self {
        Self {
            store,
            sessions,
            replays,
            max_pooled_browsers,
            idle: Notify::new(),
            changed: Notify::new(),
            resetting: InProgress::default(),
        }
    }

    fn changed(&self) {
        self.changed.notify_one();
    }

    async fn find(&self, org_id: &str, id_or_name: &str) -> ServiceResult<PoolRecord> {
        self.store
            .pool(org_id, id_or_name)
            .await?
            .ok_or_else(|| ServiceError::NotFound(format!("browser pool {id_or_name} not found")))
    }

    async fn view(&self, record: PoolRecord) -> ServiceResult<PoolView> {
        let config = PoolConfig::stored(&record)?;
        let members = self.store.pool_members(&record.id).await?;
        let count = |lease: PoolLease| {
            members
                .iter()
                .filter(|m| m.pool_lease == Some(lease) && m.status == SessionStatus::Running)
                .count() as i64
        };
        Ok(PoolView {
            acquired_count: count(PoolLease::Leased),
            available_count: count(PoolLease::Idle),
            record,
            config,
        })
    }

    pub async fn get(&self, org_id: &str, id_or_name: &str) -> ServiceResult<PoolView> {
        let record = self.find(org_id, id_or_name).await?;
        self.view(record).await
    }

    pub async fn list(&self, org_id: &str) -> ServiceResult<Vec<PoolView>> {
        let mut pools = Vec::new();
        for record in self.store.list_pools(Some(org_id)).await? {
            pools.push(self.view(record).await?);
        }
        Ok(pools)
    }

    /// Validates a complete configuration as a create would (the browsers' fields too:
    /// extensions, proxy and profile must be the organization's) and checks the
    /// organization's and its project's capacity, counting every pool but `own_id`.
    async fn check(
        &self, org_id: &str, project_id: &str, config: &PoolConfig, own_id: Option<&str>,
    ) -> ServiceResult<()> {
        let own_size = match own_id {
            Some(id) => self.store.pool(org_id, id).await?.map_or(0, |pool| pool.size),
            None => 0,
        };
        let problems = config.problems();
        self.sessions.spec(org_id, &config.browser, None, problems).await?;
        if config.size > own_size {
            self.check_project_cap(project_id, config.size - own_size).await?;
        }
        scope::organization_wide(self.check_organization(org_id, config, own_id)).await
    }

    /// A project's own cap (`projects.limits`) on its live browsers and pool
    /// reservations, for a pool that grows by `growth`.
    async fn check_project_cap(&self, project_id: &str, growth: i64) -> ServiceResult<()> {
        let Some(project) = self.store.project_by_id(project_id).await? else {
            return Ok(());
        };
        let Some(cap) = project.max_concurrent_sessions else {
            return Ok(());
        };
        let (live, reserved) = self.store.project_browsers(project_id).await?;
        if live + reserved + growth > cap {
            return Err(ServiceError::Conflict(format!(
                "size: project {}'s max_concurrent_sessions is {cap}; {live} browsers are live \
                 and its pools reserve {reserved}",
                project.name
            )));
        }
        Ok(())
    }

    async fn check_organization(
        &self, org_id: &str, config: &PoolConfig, own_id: Option<&str>,
    ) -> ServiceResult<()> {
        let others: i64 = self
            .store
            .list_pools(Some(org_id))
            .await?
            .iter()
            .filter(|pool| Some(pool.id.as_str()) != own_id)
            .map(|pool| pool.size)
            .sum();
        let limit = self.max_pooled_browsers;
        if config.size > limit {
            return Err(ServiceError::invalid(format!(
                "size: the organization's pools may hold {limit} browsers in all"
            )));
        }
        // Possible once other pools shrink: a conflict with them, not bad input.
        if others + config.size > limit {
            return Err(ServiceError::Conflict(format!(
                "size: the organization's pools may hold {limit} browsers in all; {others} are in its other pools"
            )));
        }
        Ok(())
    }

    /// Most browsers one organization's pools may hold together.
    pub fn max_pooled_browsers(&self) -> i64 {
        self.max_pooled_browsers
    }

    /// Creates a pool; the reconciler starts filling it at once.
    pub async fn create(&self, org_id: &str, changes: PoolChanges) -> ServiceResult<PoolView> {
        let config = PoolConfig::default().changed(changes);
        let record = PoolRecord {
            id: ids::new_id("pool"),
            org_id: org_id.to_owned(),
            name: config.name.clone(),
            size: config.size,
            config: config.to_stored()?,
            created_at: Utc::now(),
            project_id: Some(scope::project_for_new(self.store.as_ref(), org_id).await?),
        };
        let project_id = record.project_id.as_deref().unwrap_or_default();
        // Checked and stored under the organization's admission lock, as a browser's
        // create is: the two never count each other's half.
        let _turn = self.sessions.admission_turn().await;
        let lock = self.store.lock_admission(org_id).await?;
        let stored = match self.check(org_id, project_id, &config, None).await {
            Ok(()) => self.store.insert_pool(&record).await.map_err(conflict_on_name),
            Err(error) => Err(error),
        };
        lock.release().await;
        stored?;
        self.changed();
        self.view(record).await
    }

    /// Changes a pool's size and browser configuration. Idle browsers keep the old
    /// configuration unless `discard_all_idle` ends them now (the pool refills).
    pub async fn update(
        &self, org_id: &str, id_or_name: &str, changes: PoolChanges, discard_all_idle: bool,
    ) -> ServiceResult<PoolView> {
        let mut record = self.find(org_id, id_or_name).await?;
        let config = PoolConfig::stored(&record)?.changed(changes);
        record.name = config.name.clone();
        record.size = config.size;
        record.config = config.to_stored()?;
        let _turn = self.sessions.admission_turn().await;
        let lock = self.store.lock_admission(org_id).await?;
        let project_id = record.project_id.clone().unwrap_or_default();
        let stored = match self.check(org_id, &project_id, &config, Some(&record.id)).await {
            Ok(()) => self.store.update_pool(&record).await.map_err(conflict_on_name),
            Err(error) => Err(error),
        };
        lock.release().await;
        stored?;
        if discard_all_idle {
            self.end_idle(&record, "pool configuration changed").await;
        }
        self.changed();
        self.view(record).await
    }

    /// Deletes a pool and its browsers; refused while browsers are leased, unless `force`
    /// ends them too.
    pub async fn delete(&self, org_id: &str, id_or_name: &str, force: bool) -> ServiceResult<()> {
        let record = self.find(org_id, id_or_name).await?;
        let members = self.store.pool_members(&record.id).await?;
        let leased = members.iter().filter(|m| m.pool_lease == Some(PoolLease::Leased)).count();
        if leased > 0 && !force {
            return Err(ServiceError::Conflict(format!(
                "{leased} browsers of the pool are leased; release them or delete with force=true"
            )));
        }
        if !self.store.delete_pool(&record.id, Utc::now()).await? {
            return Err(ServiceError::NotFound(format!("browser pool {id_or_name} not found")));
        }
        self.sessions.end_all(members, "pool deleted").await;
        self.changed();
        Ok(())
    }

    /// How long an acquire waits when the caller does not say: the time the pool takes to
    /// fill at its fill rate, at most `DEFAULT_ACQUIRE_TIMEOUT_CAP`.
    fn default_acquire_timeout(config: &PoolConfig) -> Duration {
        let per_minute = config.launches_per_minute();
        Duration::from_secs_f64(config.size as f64 / per_minute * 60.0)
            .min(DEFAULT_ACQUIRE_TIMEOUT_CAP)
    }

    /// Leases an idle browser of the pool, waiting up to `timeout` (default: see
    /// `default_acquire_timeout`) for one; `None` when none became available in time.
    pub async fn acquire(
        &self, org_id: &str, id_or_name: &str, timeout: Option<Duration>,
    ) -> ServiceResult<(PoolRecord, Option<SessionRecord>)> {
        let _pending = crate::metrics::METRICS.acquire_started();
        let pool = self.find(org_id, id_or_name).await?;
        let timeout = match timeout {
            Some(timeout) => timeout,
            None => Self::default_acquire_timeout(&PoolConfig::stored(&pool)?),
        };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Listen before looking, so an idle signal between the two is not missed.
            let became_idle = self.idle.notified();
            if let Some(session) =
                self.store.lease_pool_browser(&pool.id, &ids::new_secret(22)).await?
            {
                // A fresh inactivity period starts with the lease.
                self.sessions.touch(&session.id);
                self.sessions.promote(&session.id);
                return Ok((pool, Some(session)));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok((pool, None));
            }
            // Other replicas do not signal us: look again at least every 100 ms.
            let _ = tokio::time::timeout_at(
                deadline.min(tokio::time::Instant::now() + Duration::from_millis(100)),
                became_idle,
            )
            .await;
        }
    }

    /// Gives a leased browser back: with `reuse` it is reset and becomes idle again,
    /// otherwise it ends (and the reconciler replaces it).
    pub async fn release(
        self: &Arc<Self>, org_id: &str, id_or_name: &str, session_id: &str, reuse: bool,
    ) -> ServiceResult<()> {
        let pool = self.find(org_id, id_or_name).await?;
        let session = self
            .store
            .session(&pool.org_id, session_id)
            .await?
            .filter(|s| s.status != SessionStatus::Ended)
            .ok_or_else(|| {
                ServiceError::NotFound(format!("browser session {session_id} not found"))
            })?;
        let leased_here = session.pool_id.as_deref() == Some(&pool.id)
            && session.pool_lease == Some(PoolLease::Leased);
        if !leased_here {
            return Err(ServiceError::invalid(format!(
                "session_id: browser session {session_id} is not leased from pool {}",
                pool.name.as_deref().unwrap_or(&pool.id)
            )));
        }
        // A browser that saves into its profile ends (saving): a reset would start it again
        // from the profile's state as of before that save.
        let saves_profile = session.profile.as_ref().is_some_and(|p| p.save_changes);
        // A lessee that changed the browser's allowed_hosts gets a replacement for the next
        // lessee rather than a restored allowlist.
        let pool_allowed_hosts =
            PoolConfig::stored(&pool)?.browser.network.and_then(|network| network.allowed_hosts);
        let network_changed = session.vm_settings.allowed_hosts != pool_allowed_hosts;
        if !reuse || saves_profile || network_changed {
            self.sessions.end(&session, "released from its pool").await?;
            self.changed();
            return Ok(());
        }
        if !self.store.set_pool_lease(&session.id, PoolLease::Leased, PoolLease::Resetting).await? {
            return Err(ServiceError::Conflict(format!(
                "browser session {session_id} is already being released"
            )));
        }
        // The lessee's name and tags go with the release, before the answer.
        let session = match self.forget_lessee(&session).await {
            Ok(session) => session,
            Err(error) => {
                tracing::warn!(session_id = %session.id, %error, "could not clear the lessee's name and tags; ending the browser");
                self.sessions.end(&session, "released from its pool").await?;
                self.changed();
                return Ok(());
            }
        };
        // Reset by the replica that serves the browser (also when another adopts it).
        if self.sessions.replica().owns(&session) {
            self.reset_in_background(session);
        } else {
            self.sessions
                .replica()
                .publish(Signal::ResetRequested {
                    org_id: session.org_id.clone(),
                    session_id: session.id.clone(),
                })
                .await;
        }
        Ok(())
    }

    /// Ends every idle browser of the pool (leased ones stay, also those leased meanwhile).
    pub async fn flush(&self, org_id: &str, id_or_name: &str) -> ServiceResult<()> {
        let pool = self.find(org_id, id_or_name).await?;
        self.end_idle(&pool, "pool flushed").await;
        Ok(())
    }

    /// Claims an idle browser for ending, so that no acquire can lease it meanwhile; false
    /// if it is no longer idle (leased since it was listed).
    async fn retire(&self, session: &SessionRecord) -> bool {
        self.store
            .set_pool_lease(&session.id, PoolLease::Idle, PoolLease::Retiring)
            .await
            .unwrap_or(false)
    }

    /// Ends every idle browser of the pool; returns how many.
    async fn end_idle(&self, pool: &PoolRecord, reason: &str) -> usize {
        let mut claimed = Vec::new();
        match self.store.pool_members(&pool.id).await {
            Ok(members) => {
                for member in members {
                    if member.pool_lease == Some(PoolLease::Idle) && self.retire(&member).await {
                        claimed.push(member);
                    }
                }
            }
            Err(error) => {
                tracing::warn!(pool_id = %pool.id, %error, "could not list the pool's browsers")
            }
        }
        let ended = self.sessions.end_all(claimed, reason).await;
        self.changed();
        ended
    }

    /// Restarts the browser's Chromium with a fresh profile, then makes it idle; a browser
    /// that cannot be reset ends instead.
    fn reset_in_background(self: &Arc<Self>, session: SessionRecord) {
        if !self.resetting.claim(&session.id) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            this.reset(&session).await;
            this.resetting.release(&session.id);
            this.idle.notify_waiters();
            this.changed();
        });
    }

    async fn reset(&self, session: &SessionRecord) {
        let agent = self.sessions.agent(session);
        // Recordings the previous lessee started end with its lease.
        self.replays.finish_all(session, agent.as_ref().ok().cloned()).await;
        let reset = match agent {
            Ok(agent) => agent.reset_browser().await.map_err(ServiceError::from),
            Err(error) => Err(error),
        };
        // Also for resets resumed after a restart, which never went through `release`.
        let reset = match reset {
            Ok(()) => self.forget_lessee(session).await.map(drop),
            Err(error) => Err(error),
        };
        if let Ok(()) = &reset
            && let Some(url) = self
                .store
                .session(&session.org_id, &session.id)
                .await
                .ok()
                .flatten()
                .and_then(|current| current.vm_settings.start_url)
        {
            self.sessions.open_url(session, &url).await;
        }
        let idle = match reset {
            Ok(()) => self
                .store
                .set_pool_lease(&session.id, PoolLease::Resetting, PoolLease::Idle)
                .await
                .unwrap_or(false),
            Err(error) => {
                tracing::warn!(session_id = %session.id, %error, "resetting a pool browser failed; ending it");
                false
            }
        };
        // Not reset: end it, unless something else already claimed it.
        if !idle
            && self
                .store
                .set_pool_lease(&session.id, PoolLease::Resetting, PoolLease::Retiring)
                .await
                .unwrap_or(false)
        {
            let _ = self.sessions.end(session, "could not be reset for reuse").await;
        }
    }

    /// Takes the lessee's name and tags off a released browser; its start URL becomes
    /// the pool's again (opened once the browser is reset). Fails if the lessee changed
    /// the browser's allowlist meanwhile (the browser then ends rather than keep it).
    async fn forget_lessee(&self, session: &SessionRecord) -> ServiceResult<SessionRecord> {
        let pool_config = match &session.pool_id {
            Some(pool_id) => match self.store.pool(&session.org_id, pool_id).await? {
                Some(pool) => Some(PoolConfig::stored(&pool)?),
                None => None,
            },
            None => None,
        };
        let pool_allowed_hosts = pool_config
            .as_ref()
            .and_then(|config| config.browser.network.clone())
            .and_then(|network| network.allowed_hosts);
        let pool_telemetry = self.pool_telemetry(&session.org_id, pool_config.as_ref()).await?;
        let pool_start_url = pool_config.and_then(|config| config.browser.start_url);
        self.sessions
            .change_settings(session, |current| {
                if current.vm_settings.allowed_hosts != pool_allowed_hosts {
                    return Err(ServiceError::Conflict(
                        "the lessee changed the browser's allowlist".into(),
                    ));
                }
                let mut cleared = current.clone();
                cleared.name = None;
                cleared.vm_settings.tags.clear();
                cleared.vm_settings.start_url = pool_start_url;
                // A lease's telemetry override does not carry over to the next lease.
                cleared.vm_settings.telemetry = pool_telemetry;
                Ok(cleared)
            })
            .await
    }

    /// The telemetry a pool's browsers start with, its destination looked up.
    async fn pool_telemetry(
        &self, org_id: &str, config: Option<&PoolConfig>,
    ) -> ServiceResult<Option<crate::telemetry::TelemetrySettings>> {
        let request = config.and_then(|config| config.browser.telemetry.as_ref());
        let resolved =
            crate::telemetry::settings::on_create(request).map_err(ServiceError::Invalid)?;
        let Some(mut settings) = resolved.settings else {
            return Ok(None);
        };
        if let Some(Some(reference)) = resolved.export {
            let key = reference.id.or(reference.name).unwrap_or_default();
            settings.destination = self.store.destination(org_id, &key).await?.map(|d| d.id);
        }
        Ok(Some(settings))
    }
}

fn conflict_on_name(error: StoreError) -> ServiceError {
    match error {
        StoreError::Conflict(_) => {
            ServiceError::Conflict("the organization already has a pool of that name".into())
        }
        other => other.into(),
    }
}

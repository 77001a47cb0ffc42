//! Browser pools: warm browsers that callers lease (acquire) and give back (release).
//!
//! A pool's browsers are ordinary sessions carrying its `pool_id` and a lease state
//! (idle, leased, resetting), all in the store, so pools survive restarts. A reconciler
//! keeps every pool at `size` browsers, launching at most its fill rate and replacing
//! browsers that end. Leasing is one atomic store update, so no browser is leased twice.
//! A browser released for reuse restarts Chromium with a fresh profile before it is idle
//! again, so the next lessee never sees the previous one's data.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::api::browsers::{CreateBrowserRequest, new_session};
use crate::api::pools::DEFAULT_FILL_RATE;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{PoolLease, PoolRecord, SessionRecord, SessionStatus};

/// How often the reconciler looks at every pool (it is also woken by changes).
const RECONCILE_INTERVAL: Duration = Duration::from_millis(500);
/// Launches of one pool running at once.
const MAX_CONCURRENT_LAUNCHES: usize = 4;
/// How long an acquire waits by default, at most.
pub const DEFAULT_ACQUIRE_TIMEOUT_CAP: Duration = Duration::from_secs(30);

/// In-process coordination between the API and the reconciler.
#[derive(Default)]
pub struct PoolSignals {
    /// A browser became idle: waiting acquirers try again.
    idle: Notify,
    /// A pool changed (created, resized, flushed, released): the reconciler looks now.
    changed: Notify,
    /// Browsers this process is resetting.
    resetting: Mutex<HashSet<String>>,
}

impl PoolSignals {
    pub fn changed(&self) {
        self.changed.notify_one();
    }
}

/// Launches per minute a pool may make: its fill rate (percent of its size per minute),
/// at least one.
pub fn launches_per_minute(size: i64, fill_rate_percent: i64) -> f64 {
    ((size * fill_rate_percent) as f64 / 100.0).ceil().max(1.0)
}

/// The pool's stored browser configuration as a create request.
pub fn browser_request(pool: &PoolRecord) -> Result<CreateBrowserRequest, ApiError> {
    let config = &pool.config;
    let mut request = serde_json::Map::new();
    for key in [
        "headless",
        "stealth",
        "kiosk_mode",
        "timeout_seconds",
        "viewport",
        "extensions",
        "proxy_id",
        "profile",
    ] {
        if let Some(value) = config.get(key).filter(|v| !v.is_null()) {
            request.insert(key.to_owned(), value.clone());
        }
    }
    serde_json::from_value(serde_json::Value::Object(request))
        .map_err(|error| ApiError::invalid_field(format!("pool configuration: {error}")))
}

pub fn fill_rate(pool: &PoolRecord) -> i64 {
    pool.config
        .get("fill_rate_per_minute")
        .and_then(|v| v.as_i64())
        .unwrap_or(DEFAULT_FILL_RATE)
}

/// Per-pool launch budget: a token bucket refilled at the pool's launch rate.
struct Budget {
    tokens: f64,
    refilled: Instant,
    launching: usize,
}

/// Keeps every pool at its size. Runs forever.
pub async fn run_reconciler(state: AppState) {
    let budgets: Arc<Mutex<HashMap<String, Budget>>> = Arc::default();
    // Resets a previous process left unfinished are resumed once, at the start (later
    // passes would race this process's own reset tasks).
    let mut first_pass = true;
    loop {
        let first = std::mem::take(&mut first_pass);
        if let Err(error) = reconcile_once(&state, &budgets, first).await {
            tracing::warn!(%error, "pool reconciliation failed");
        }
        tokio::select! {
            () = state.pools.changed.notified() => {}
            () = tokio::time::sleep(RECONCILE_INTERVAL) => {}
        }
    }
}

async fn reconcile_once(
    state: &AppState,
    budgets: &Arc<Mutex<HashMap<String, Budget>>>,
    first_pass: bool,
) -> Result<(), ApiError> {
    let pools = state.store.list_pools(None).await?;
    if let Ok(mut budgets) = budgets.lock() {
        budgets.retain(|id, _| pools.iter().any(|pool| &pool.id == id));
    }
    for pool in pools {
        let members = state.store.pool_members(&pool.id).await?;
        if first_pass {
            resume_resets(state, &members);
        }
        // Smaller than it was: idle browsers beyond the size go, newest first.
        let excess = members.len().saturating_sub(pool.size.max(0) as usize);
        let idle_newest_first = members
            .iter()
            .rev()
            .filter(|m| m.pool_lease == Some(PoolLease::Idle));
        let mut retired = 0;
        for member in idle_newest_first {
            if retired == excess {
                break;
            }
            if retire(state, member).await {
                end_in_background(state, member.clone(), "pool shrunk");
                retired += 1;
            }
        }
        let launches = {
            let Ok(mut budgets) = budgets.lock() else {
                continue;
            };
            let per_minute = launches_per_minute(pool.size, fill_rate(&pool));
            let budget = budgets.entry(pool.id.clone()).or_insert(Budget {
                tokens: per_minute,
                refilled: Instant::now(),
                launching: 0,
            });
            let minutes = budget.refilled.elapsed().as_secs_f64() / 60.0;
            budget.tokens = (budget.tokens + minutes * per_minute).min(per_minute);
            budget.refilled = Instant::now();
            let missing =
                (pool.size.max(0) as usize).saturating_sub(members.len() + budget.launching);
            let allowed = missing
                .min(budget.tokens.floor() as usize)
                .min(MAX_CONCURRENT_LAUNCHES.saturating_sub(budget.launching));
            budget.tokens -= allowed as f64;
            budget.launching += allowed;
            allowed
        };
        if launches == 0 {
            continue;
        }
        let new = match browser_request(&pool) {
            Ok(request) => new_session(state, &pool.org_id, request).await,
            Err(error) => Err(error),
        };
        let new = match new {
            Ok(mut new) => {
                new.pool_id = Some(pool.id.clone());
                new
            }
            Err(error) => {
                tracing::warn!(pool_id = %pool.id, %error, "the pool's browsers cannot be created");
                if let Ok(mut budgets) = budgets.lock()
                    && let Some(budget) = budgets.get_mut(&pool.id)
                {
                    budget.launching -= launches;
                }
                continue;
            }
        };
        for _ in 0..launches {
            let (state, budgets, new, pool) =
                (state.clone(), budgets.clone(), new.clone(), pool.clone());
            tokio::spawn(async move {
                let created = state.sessions.create(&pool.org_id, new).await;
                match &created {
                    Err(error) => {
                        tracing::warn!(pool_id = %pool.id, %error, "launching a pool browser failed")
                    }
                    // Deleted while this browser started: nothing else would end it.
                    Ok(session)
                        if matches!(state.store.pool(&pool.org_id, &pool.id).await, Ok(None)) =>
                    {
                        let _ = state.sessions.end(session, "pool deleted").await;
                    }
                    Ok(_) => {}
                }
                if let Ok(mut budgets) = budgets.lock()
                    && let Some(budget) = budgets.get_mut(&pool.id)
                {
                    budget.launching = budget.launching.saturating_sub(1);
                }
                state.pools.idle.notify_waiters();
                state.pools.changed();
            });
        }
    }
    Ok(())
}

/// Claims an idle browser for ending, so that no acquire can lease it meanwhile; false
/// if it is no longer idle (leased since it was listed).
async fn retire(state: &AppState, session: &SessionRecord) -> bool {
    state
        .store
        .set_pool_lease(&session.id, PoolLease::Idle, PoolLease::Retiring)
        .await
        .unwrap_or(false)
}

fn end_in_background(state: &AppState, session: SessionRecord, reason: &'static str) {
    let sessions = state.sessions.clone();
    tokio::spawn(async move {
        if let Err(error) = sessions.end(&session, reason).await {
            tracing::warn!(session_id = %session.id, %error, "could not end a pool browser");
        }
    });
}

/// Leases an idle browser of the pool, waiting up to `timeout` for one.
pub async fn acquire(
    state: &AppState,
    pool: &PoolRecord,
    timeout: Duration,
) -> Result<SessionRecord, ApiError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        // Listen before looking, so an idle signal between the two is not missed.
        let became_idle = state.pools.idle.notified();
        if let Some(session) = state.store.lease_pool_browser(&pool.id).await? {
            // A fresh inactivity period starts with the lease.
            state.sessions.touch(&session.id);
            return Ok(session);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::NoBrowserAvailable(format!(
                "no browser of pool {} became available within {} s; retry, or raise the pool's size",
                pool.name.as_deref().unwrap_or(&pool.id),
                timeout.as_secs()
            )));
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
    state: &AppState,
    pool: &PoolRecord,
    session_id: &str,
    reuse: bool,
) -> Result<(), ApiError> {
    let session = state
        .store
        .session(&pool.org_id, session_id)
        .await?
        .filter(|s| s.status != SessionStatus::Ended)
        .ok_or_else(|| ApiError::NotFound(format!("browser session {session_id} not found")))?;
    let leased_here = session.pool_id.as_deref() == Some(&pool.id)
        && session.pool_lease == Some(PoolLease::Leased);
    if !leased_here {
        return Err(ApiError::invalid_field(format!(
            "session_id: browser session {session_id} is not leased from pool {}",
            pool.name.as_deref().unwrap_or(&pool.id)
        )));
    }
    // A browser that saves into its profile ends (saving): a reset would start it again
    // from the profile's state as of before that save.
    let saves_profile = session.profile.as_ref().is_some_and(|p| p.save_changes);
    if !reuse || saves_profile {
        // The caller may go away; the end must not be cut short.
        let sessions = state.sessions.clone();
        tokio::spawn(async move { sessions.end(&session, "released from its pool").await })
            .await
            .map_err(|error| ApiError::Internal(anyhow::anyhow!("end task failed: {error}")))??;
        state.pools.changed();
        return Ok(());
    }
    if !state
        .store
        .set_pool_lease(&session.id, PoolLease::Leased, PoolLease::Resetting)
        .await?
    {
        return Err(ApiError::Conflict(format!(
            "browser session {session_id} is already being released"
        )));
    }
    reset_in_background(state, session);
    Ok(())
}

/// Resets browsers left `resetting` by a previous process.
fn resume_resets(state: &AppState, members: &[SessionRecord]) {
    for member in members {
        if member.pool_lease == Some(PoolLease::Resetting)
            && member.status == SessionStatus::Running
        {
            reset_in_background(state, member.clone());
        }
    }
}

/// Restarts the browser's Chromium with a fresh profile, then makes it idle; a browser
/// that cannot be reset ends instead.
fn reset_in_background(state: &AppState, session: SessionRecord) {
    let newly = state
        .pools
        .resetting
        .lock()
        .map(|mut resetting| resetting.insert(session.id.clone()))
        .unwrap_or(false);
    if !newly {
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        let agent = state.sessions.agent(&session);
        // Recordings the previous lessee started end with its lease.
        state
            .replays
            .finish_all(&session, agent.as_ref().ok().cloned())
            .await;
        let reset = match agent {
            Ok(agent) => agent.reset_browser().await.map_err(ApiError::from),
            Err(error) => Err(error),
        };
        let idle = match reset {
            Ok(()) => state
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
            && state
                .store
                .set_pool_lease(&session.id, PoolLease::Resetting, PoolLease::Retiring)
                .await
                .unwrap_or(false)
        {
            let _ = state
                .sessions
                .end(&session, "could not be reset for reuse")
                .await;
        }
        if let Ok(mut resetting) = state.pools.resetting.lock() {
            resetting.remove(&session.id);
        }
        state.pools.idle.notify_waiters();
        state.pools.changed();
    });
}

/// Ends every idle browser of the pool (leased ones stay, also those leased while this
/// runs); returns how many.
pub async fn end_idle(
    state: &AppState,
    pool: &PoolRecord,
    reason: &str,
) -> Result<usize, ApiError> {
    let mut claimed = Vec::new();
    for member in state.store.pool_members(&pool.id).await? {
        if member.pool_lease == Some(PoolLease::Idle) && retire(state, &member).await {
            claimed.push(member);
        }
    }
    end_all(state, claimed, reason).await
}

/// Ends the sessions (in parallel, in a task of their own so that a caller going away
/// cannot cut it short); returns how many this call ended.
pub async fn end_all(
    state: &AppState,
    sessions: Vec<SessionRecord>,
    reason: &str,
) -> Result<usize, ApiError> {
    let (service, reason) = (state.sessions.clone(), reason.to_owned());
    let ended = tokio::spawn(async move {
        let ends = sessions.iter().map(|session| service.end(session, &reason));
        futures::future::join_all(ends)
            .await
            .into_iter()
            .filter(|outcome| matches!(outcome, Ok(true)))
            .count()
    })
    .await
    .map_err(|error| ApiError::Internal(anyhow::anyhow!("end task failed: {error}")))?;
    state.pools.changed();
    Ok(ended)
}

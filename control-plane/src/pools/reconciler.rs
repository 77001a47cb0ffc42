//! Keeps every pool at its size: retires idle browsers beyond it, launches the missing
//! ones within the pool's fill rate, and resumes resets a previous process left.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{PoolConfig, Pools};
use tokio::sync::broadcast;

use crate::error::ServiceResult;
use crate::replicas::Signal;
use crate::sessions::BrowserSpec;
use crate::store::{PoolLease, PoolRecord, SessionRecord, SessionStatus};

/// How often a replica looks for the resets it serves that nobody does.
const RESET_SWEEP_INTERVAL: Duration = Duration::from_secs(5);
/// How often the reconciler looks at every pool (it is also woken by changes).
const RECONCILE_INTERVAL: Duration = Duration::from_millis(500);
/// Launches of one pool running at once.
const MAX_CONCURRENT_LAUNCHES: usize = 4;

/// Per-pool launch budget: a token bucket refilled at the pool's launch rate.
struct Budget {
    tokens: f64,
    refilled: Instant,
    launching: usize,
}

type Budgets = Arc<Mutex<HashMap<String, Budget>>>;

impl Pools {
    /// Resets the browsers this replica serves when asked (by the replica that released
    /// one, or by adopting one that was being reset), and those whose request was lost.
    /// Call before sessions are adopted: an adoption may ask.
    pub fn listen_for_resets(self: &Arc<Self>) {
        tokio::spawn(self.clone().run_reset_requests(self.sessions.replica().subscribe()));
    }

    /// Keeps every pool at its size, on one replica at a time. Call once sessions were
    /// adopted (a launch must not race the reaping of strays at start).
    pub fn start_reconciler(self: &Arc<Self>) {
        tokio::spawn(self.clone().run_reconciler());
    }

    async fn run_reconciler(self: Arc<Self>) {
        let mut duty = self.sessions.replica().duty(crate::replicas::POOL_RECONCILER);
        let budgets: Budgets = Arc::default();
        for pass in 0.. {
            duty.held().await;
            if let Err(error) = self.reconcile_once(&budgets, pass).await {
                tracing::warn!(%error, "pool reconciliation failed");
            }
            tokio::select! {
                () = self.changed.notified() => {}
                () = tokio::time::sleep(RECONCILE_INTERVAL) => {}
            }
        }
    }

    async fn run_reset_requests(self: Arc<Self>, mut signals: broadcast::Receiver<Signal>) {
        let mut sweep = tokio::time::interval(RESET_SWEEP_INTERVAL);
        let mut resetting_before: HashSet<String> = HashSet::new();
        loop {
            let signal = tokio::select! {
                signal = signals.recv() => signal,
                _ = sweep.tick() => {
                    resetting_before = self.reset_forgotten(resetting_before).await;
                    continue;
                }
            };
            let (org_id, session_id) = match signal {
                Ok(Signal::ResetRequested { org_id, session_id })
                | Ok(Signal::Adopted { org_id, session_id }) => (org_id, session_id),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            };
            match self.store.session(&org_id, &session_id).await {
                Ok(Some(session))
                    if session.pool_lease == Some(PoolLease::Resetting)
                        && session.status == SessionStatus::Running
                        && self.sessions.replica().owns(&session) =>
                {
                    self.reset_in_background(session);
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(session_id, %error, "could not read a pool browser to reset")
                }
            }
        }
    }

    /// Resets the browsers this replica serves that were `resetting` at the previous
    /// sweep too and that no task here resets (their request was lost); returns those
    /// resetting now.
    async fn reset_forgotten(self: &Arc<Self>, before: HashSet<String>) -> HashSet<String> {
        let Ok(live) = self.store.live_sessions().await else {
            return before;
        };
        let mut now = HashSet::new();
        for session in live {
            if session.pool_lease != Some(PoolLease::Resetting)
                || session.status != SessionStatus::Running
                || !self.sessions.replica().owns(&session)
            {
                continue;
            }
            now.insert(session.id.clone());
            if before.contains(&session.id) && !self.resetting.contains(&session.id) {
                tracing::info!(session_id = %session.id, "resetting a pool browser whose reset request was lost");
                self.reset_in_background(session);
            }
        }
        now
    }

    async fn reconcile_once(self: &Arc<Self>, budgets: &Budgets, pass: usize) -> ServiceResult<()> {
        let pools = self.store.list_pools(None).await?;
        if let Ok(mut budgets) = budgets.lock() {
            budgets.retain(|id, _| pools.iter().any(|pool| &pool.id == id));
        }
        let mut short = Vec::new();
        for pool in pools {
            let members = self.store.pool_members(&pool.id).await?;
            self.retire_excess(&pool, &members).await;
            let config = match PoolConfig::stored(&pool) {
                Ok(config) => config,
                Err(error) => {
                    tracing::warn!(pool_id = %pool.id, %error, "the pool's browsers cannot be created");
                    continue;
                }
            };
            let (holding, missing) = holding_and_missing(budgets, &pool, members.len());
            if missing > 0 {
                short.push((pool, config, members.len(), holding, missing));
            }
        }
        if short.is_empty() {
            return Ok(());
        }
        let room = self.sessions.host_room_for_pools().await? as usize;
        let wants: Vec<Want> = short
            .iter()
            .map(|(pool, _, _, holding, missing)| Want {
                organization: &pool.org_id,
                holding: *holding,
                missing: *missing,
                standby: self.sessions.is_standby_pool(&pool.id),
            })
            .collect();
        let shares = fair_shares(&wants, room, pass);
        for ((pool, config, members, _, _), share) in short.into_iter().zip(shares) {
            let launches = take_launches(budgets, &pool, &config, members, share);
            if launches == 0 {
                continue;
            }
            let spec = match self
                .sessions
                .spec(&pool.org_id, &config.browser, None, Vec::new())
                .await
            {
                Ok(spec) => BrowserSpec {
                    pool_id: Some(pool.id.clone()),
                    project_id: pool.project_id.clone(),
                    ..spec
                },
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
                self.launch_in_background(budgets.clone(), pool.clone(), spec.clone());
            }
        }
        Ok(())
    }

    /// Smaller than it was: idle browsers beyond the size go, newest first.
    async fn retire_excess(&self, pool: &PoolRecord, members: &[SessionRecord]) {
        let excess = members.len().saturating_sub(pool.size.max(0) as usize);
        let idle_newest_first =
            members.iter().rev().filter(|m| m.pool_lease == Some(PoolLease::Idle));
        let mut retired = 0;
        for member in idle_newest_first {
            if retired == excess {
                break;
            }
            if self.retire(member).await {
                let (sessions, member) = (self.sessions.clone(), member.clone());
                tokio::spawn(async move {
                    if let Err(error) = sessions.end(&member, "pool shrunk").await {
                        tracing::warn!(session_id = %member.id, %error, "could not end a pool browser");
                    }
                });
                retired += 1;
            }
        }
    }

    fn launch_in_background(
        self: &Arc<Self>, budgets: Budgets, pool: PoolRecord, spec: BrowserSpec,
    ) {
        let this = self.clone();
        tokio::spawn(async move {
            let created = this.sessions.create(&pool.org_id, spec).await;
            match &created {
                Err(error) => {
                    tracing::warn!(pool_id = %pool.id, %error, "launching a pool browser failed")
                }
                // Deleted while this browser started: nothing else would end it.
                Ok(session)
                    if matches!(this.store.pool(&pool.org_id, &pool.id).await, Ok(None)) =>
                {
                    let _ = this.sessions.end(session, "pool deleted").await;
                }
                Ok(_) => {}
            }
            if let Ok(mut budgets) = budgets.lock()
                && let Some(budget) = budgets.get_mut(&pool.id)
            {
                budget.launching = budget.launching.saturating_sub(1);
            }
            this.idle.notify_waiters();
            this.changed();
        });
    }
}

/// How many browsers the pool has or is launching, and how many it lacks.
fn holding_and_missing(budgets: &Budgets, pool: &PoolRecord, members: usize) -> (usize, usize) {
    let launching = budgets
        .lock()
        .ok()
        .and_then(|budgets| budgets.get(&pool.id).map(|budget| budget.launching))
        .unwrap_or(0);
    let holding = members + launching;
    (holding, (pool.size.max(0) as usize).saturating_sub(holding))
}

/// A pool short of browsers.
struct Want<'a> {
    organization: &'a str,
    /// Browsers it has or is launching.
    holding: usize,
    missing: usize,
    /// The standby browsers' pools: they take only what no organization's pool wants.
    standby: bool,
}

/// How many of the `room` launches each short pool gets: one at a time, each to the
/// organization that holds the fewest pool browsers then (ties go to another one each
/// `pass`), and within it to its pool that holds the fewest; the standby pools last,
/// with what is left.
fn fair_shares(wants: &[Want], room: usize, pass: usize) -> Vec<usize> {
    let mut organizations: Vec<&str> = Vec::new();
    for want in wants.iter().filter(|want| !want.standby) {
        if !organizations.contains(&want.organization) {
            organizations.push(want.organization);
        }
    }
    if !organizations.is_empty() {
        let turn = pass % organizations.len();
        organizations.rotate_left(turn);
    }
    let mut shares = vec![0; wants.len()];
    let wanting = |i: usize, shares: &[usize]| shares[i] < wants[i].missing;
    let held = |i: usize, shares: &[usize]| wants[i].holding + shares[i];
    for _ in 0..room {
        let organization_holding = |organization: &str, shares: &[usize]| -> usize {
            (0..wants.len())
                .filter(|&i| !wants[i].standby && wants[i].organization == organization)
                .map(|i| held(i, shares))
                .sum()
        };
        let next_organization = organizations
            .iter()
            .filter(|organization| {
                (0..wants.len()).any(|i| {
                    !wants[i].standby
                        && wants[i].organization == **organization
                        && wanting(i, &shares)
                })
            })
            .min_by_key(|organization| organization_holding(organization, &shares));
        let pool = match next_organization {
            Some(organization) => (0..wants.len())
                .filter(|&i| {
                    !wants[i].standby
                        && wants[i].organization == *organization
                        && wanting(i, &shares)
                })
                .min_by_key(|&i| held(i, &shares)),
            None => (0..wants.len())
                .filter(|&i| wants[i].standby && wanting(i, &shares))
                .min_by_key(|&i| held(i, &shares)),
        };
        match pool {
            Some(i) => shares[i] += 1,
            None => break,
        }
    }
    shares
}

/// How many browsers the pool may launch now (missing ones, within its budget, the
/// concurrency limit and its `share` of the host's room); they count as launching until
/// each is done.
fn take_launches(
    budgets: &Budgets, pool: &PoolRecord, config: &PoolConfig, members: usize, share: usize,
) -> usize {
    let Ok(mut budgets) = budgets.lock() else {
        return 0;
    };
    let per_minute = config.launches_per_minute();
    let budget = budgets.entry(pool.id.clone()).or_insert(Budget {
        tokens: per_minute,
        refilled: Instant::now(),
        launching: 0,
    });
    let minutes = budget.refilled.elapsed().as_secs_f64() / 60.0;
    budget.tokens = (budget.tokens + minutes * per_minute).min(per_minute);
    budget.refilled = Instant::now();
    let missing = (pool.size.max(0) as usize).saturating_sub(members + budget.launching);
    let allowed = missing
        .min(share)
        .min(budget.tokens.floor() as usize)
        .min(MAX_CONCURRENT_LAUNCHES.saturating_sub(budget.launching));
    budget.tokens -= allowed as f64;
    budget.launching += allowed;
    allowed
}

#[cfg(test)]
mod tests {
    use super::{Want, fair_shares};

    fn wants<'a>(of: &[(&'a str, usize, usize, bool)]) -> Vec<Want<'a>> {
        of.iter()
            .map(|&(organization, holding, missing, standby)| Want {
                organization,
                holding,
                missing,
                standby,
            })
            .collect()
    }

    #[test]
    fn room_goes_to_the_organization_holding_least_and_standby_comes_last() {
        // Two pools of A, one of B, all empty and lacking 3; room for 4.
        let short = wants(&[("a", 0, 3, false), ("a", 0, 3, false), ("b", 0, 3, false)]);
        assert_eq!(fair_shares(&short, 4, 0), vec![1, 1, 2]);
        // An odd launch goes to another organization on the next pass.
        assert_eq!(fair_shares(&short, 1, 0), vec![1, 0, 0]);
        assert_eq!(fair_shares(&short, 1, 1), vec![0, 0, 1]);
        // More room than wanted: everyone gets what it lacks.
        assert_eq!(fair_shares(&short, 100, 0), vec![3, 3, 3]);
        // A already holds 2 (of 5): B catches up first.
        let uneven = wants(&[("a", 2, 3, false), ("b", 0, 5, false)]);
        assert_eq!(fair_shares(&uneven, 4, 0), vec![1, 3]);
        let with_standby = wants(&[("standby", 0, 5, true), ("b", 0, 2, false)]);
        assert_eq!(fair_shares(&with_standby, 3, 0), vec![1, 2]);
        assert_eq!(fair_shares(&with_standby, 1, 1), vec![0, 1]);
        assert_eq!(fair_shares(&with_standby, 0, 0), vec![0, 0]);
    }
}

//! Sessions' background work, correct with several replicas on one store: the inactivity
//! reaper (one replica at a time, on activity every replica records), agent heartbeats
//! (by each session's owner), adoption of the sessions of a replica that is gone (also
//! this process's previous life, after a restart), and acting on other replicas'
//! signals.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use browser_agent_proto::v1::DevtoolsState;
use chrono::Utc;

use super::Sessions;
use crate::agent::AgentClient;
use crate::egress::{HostAllowlist, VmEgress};
use crate::replicas::Signal;
use crate::store::{PoolLease, SessionRecord, SessionStatus};

/// How often the inactivity reaper looks.
const REAPER_INTERVAL: Duration = Duration::from_secs(1);
/// How often the reaper also looks for VMs of no live session (a pod whose launcher died
/// between creating it and recording it, say). A VM is a stray only if no live session
/// owned it at this sweep or the one before, and it is older than this: a session that
/// just ended keeps its VM while its recordings and profile are collected.
const STRAY_SWEEP_INTERVAL: Duration = Duration::from_secs(300);
/// How often this replica writes the activity it saw to the store, and looks for
/// sessions of replicas that are gone.
const SHARE_INTERVAL: Duration = Duration::from_secs(1);
/// A session still `starting` after this long lost its launcher (which always records an
/// outcome well within it) and is ended.
const STALE_START: Duration = Duration::from_secs(180);

/// Which sessions `adopt` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adopt {
    /// Those of replicas that are gone.
    Orphans,
    /// Also those this replica served before it restarted.
    AtStart,
}

impl Sessions {
    /// Starts the background work. At start, sessions of replicas that are gone (this
    /// process's previous life included) are adopted or ended, and VMs that no live
    /// session owns are reaped.
    pub async fn start_background(self: &Arc<Self>, heartbeat: Duration) -> anyhow::Result<()> {
        self.adopt(Adopt::AtStart).await?;
        let live: HashSet<String> =
            self.store.live_sessions().await?.into_iter().map(|session| session.id).collect();
        // With other replicas, a VM started since the list was read is spared.
        let spare = if self.replica.is_shared() { Duration::from_secs(60) } else { Duration::ZERO };
        self.runtime.reap_strays(&live, spare).await;
        tokio::spawn(self.clone().run_inactivity_reaper());
        tokio::spawn(self.clone().run_heartbeats(heartbeat));
        tokio::spawn(self.clone().run_activity_sharing());
        tokio::spawn(self.clone().run_adoption());
        tokio::spawn(self.clone().run_signals());
        Ok(())
    }

    /// Every second, the activity this replica saw goes to the store.
    async fn run_activity_sharing(self: Arc<Self>) {
        let mut tick = tokio::time::interval(SHARE_INTERVAL);
        loop {
            tick.tick().await;
            self.record_activity().await;
        }
    }

    /// Every second, sessions of replicas that are gone are adopted.
    async fn run_adoption(self: Arc<Self>) {
        let mut tick = tokio::time::interval(SHARE_INTERVAL);
        loop {
            tick.tick().await;
            if let Err(error) = self.adopt(Adopt::Orphans).await {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "could not adopt sessions of replicas that are gone"
                );
            }
        }
    }

    /// Writes to the store when sessions were last used here; an open CDP connection is
    /// use at every write.
    async fn record_activity(&self) {
        let now = Utc::now();
        let due: Vec<(String, chrono::DateTime<Utc>)> = match self.activity.lock() {
            Ok(mut activity) => activity
                .iter_mut()
                .filter(|(_, entry)| !entry.recorded || entry.open_cdp_connections > 0)
                .map(|(id, entry)| {
                    entry.recorded = true;
                    let ago = chrono::Duration::from_std(entry.last.elapsed()).unwrap_or_default();
                    let at = if entry.open_cdp_connections > 0 { now } else { now - ago };
                    (id.clone(), at)
                })
                .collect(),
            Err(_) => return,
        };
        for (id, at) in due {
            if let Err(error) = self.store.record_activity(&id, at).await {
                tracing::warn!(session_id = %id, %error, "could not record a session's activity");
                // Written again next time.
                if let Ok(mut activity) = self.activity.lock()
                    && let Some(entry) = activity.get_mut(&id)
                {
                    entry.recorded = false;
                }
            }
        }
    }

    /// How long the session has not been used through any replica; `None` while a CDP
    /// connection to it is open here.
    fn idle_for(
        &self, session: &SessionRecord, recorded: Option<chrono::DateTime<Utc>>,
    ) -> Option<Duration> {
        let here = match self.activity.lock() {
            Ok(activity) => match activity.get(&session.id) {
                Some(entry) if entry.open_cdp_connections > 0 => return None,
                Some(entry) => Some(entry.last.elapsed()),
                None => None,
            },
            Err(_) => return None,
        };
        // Used elsewhere later, or (never used) since it was created.
        let elsewhere =
            (Utc::now() - recorded.unwrap_or(session.created_at)).to_std().unwrap_or_default();
        Some(here.map_or(elsewhere, |here| here.min(elsewhere)))
    }

    /// Ends sessions that have been inactive for their `timeout_seconds`, and launches
    /// that never finished. Runs forever; acts while this replica holds the duty.
    async fn run_inactivity_reaper(self: Arc<Self>) {
        let mut duty = self.replica.duty(crate::replicas::INACTIVITY_REAPER);
        let mut tick = tokio::time::interval(REAPER_INTERVAL);
        let mut last_sweep = tokio::time::Instant::now();
        let mut live_at_last_sweep: Option<HashSet<String>> = None;
        loop {
            tick.tick().await;
            duty.held().await;
            if last_sweep.elapsed() >= STRAY_SWEEP_INTERVAL {
                last_sweep = tokio::time::Instant::now();
                live_at_last_sweep = self.sweep_strays(live_at_last_sweep.take()).await;
            }
            let (live, activity) =
                match (self.store.live_sessions().await, self.store.session_activity().await) {
                    (Ok(live), Ok(activity)) => (live, activity),
                    (Err(error), _) | (_, Err(error)) => {
                        tracing::warn!(%error, "inactivity reaper could not list sessions");
                        continue;
                    }
                };
            let activity: std::collections::HashMap<_, _> = activity.into_iter().collect();
            for session in live {
                // Pool browsers waiting to be leased (or being reset) are not in use by
                // anyone: only leased ones time out.
                let waiting_in_pool = matches!(
                    session.pool_lease,
                    Some(PoolLease::Idle | PoolLease::Resetting | PoolLease::Retiring)
                );
                let timeout = Duration::from_secs(session.timeout_seconds.max(0) as u64);
                let reason = match session.status {
                    SessionStatus::Running
                        if !waiting_in_pool
                            && self
                                .idle_for(&session, activity.get(&session.id).copied().flatten())
                                .is_some_and(|idle| idle >= timeout) =>
                    {
                        "inactivity timeout"
                    }
                    SessionStatus::Starting
                        if (Utc::now() - session.created_at).to_std().unwrap_or_default()
                            > STALE_START =>
                    {
                        "launch never finished"
                    }
                    _ => continue,
                };
                let this = self.clone();
                tokio::spawn(async move {
                    if let Err(error) = this.end(&session, reason).await {
                        tracing::warn!(session_id = %session.id, %error, "could not end a session");
                    }
                });
            }
        }
    }

    /// Reaps VMs that no session owned at this sweep or at the last one (`live_before`;
    /// the first sweep only takes note), sparing young ones. Returns the live sessions.
    async fn sweep_strays(&self, live_before: Option<HashSet<String>>) -> Option<HashSet<String>> {
        let live: HashSet<String> = match self.store.live_sessions().await {
            Ok(live) => live.into_iter().map(|session| session.id).collect(),
            Err(error) => {
                tracing::warn!(%error, "could not list sessions to reap stray VMs");
                return live_before;
            }
        };
        if let Some(before) = live_before {
            let owned = live.union(&before).cloned().collect();
            self.runtime.reap_strays(&owned, STRAY_SWEEP_INTERVAL).await;
        }
        Some(live)
    }

    /// Calls every running agent this replica serves periodically, so agents know their
    /// control plane is alive (they shut themselves down after a grace period otherwise),
    /// and ends sessions whose agent has died. Runs forever.
    async fn run_heartbeats(self: Arc<Self>, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            // Taken before the store is read: a session created meanwhile is not in it.
            let held = self.held();
            let Ok(live) = self.store.live_sessions().await else {
                continue;
            };
            // What this process still holds for a session no longer live goes: an end
            // whose signal was lost, a request that looked it up while it ended.
            let live_ids: HashSet<&str> = live.iter().map(|s| s.id.as_str()).collect();
            for id in held.iter().filter(|id| !live_ids.contains(id.as_str())) {
                self.forget(id);
            }
            // What this process may still hold for browsers another replica adopted
            // (while this one could not reach the database) goes.
            for session in live.iter().filter(|s| !self.replica.owns(s)) {
                self.runtime.forget(&session.id);
            }
            for session in live
                .into_iter()
                .filter(|s| s.status == SessionStatus::Running && self.replica.owns(s))
            {
                let this = self.clone();
                tokio::spawn(async move {
                    let Ok(client) = this.agent(&session) else {
                        return;
                    };
                    match client.status().await {
                        // The agent gave up restarting Chromium: the browser is gone.
                        Ok(status) if status.devtools_state() == DevtoolsState::Failed => {
                            let _ = this
                                .end(&session, "Chromium failed and could not be restarted")
                                .await;
                        }
                        Ok(_) => {}
                        Err(error) => {
                            let gone = session
                                .agent
                                .as_ref()
                                .and_then(|location| this.runtime.agent_exists(location))
                                == Some(false);
                            if gone {
                                this.end_exited(&session).await;
                            } else {
                                tracing::warn!(session_id = %session.id, %error, "agent heartbeat failed");
                            }
                        }
                    }
                });
            }
        }
    }

    /// The egress of a session as its record says: its proxy and its allowlist. `None`
    /// if it can no longer be served (its proxy is gone, its allowlist no longer passes).
    async fn egress_of(&self, session: &SessionRecord) -> Option<VmEgress> {
        let upstream = match &session.proxy_id {
            Some(proxy_id) => match self.resolve_proxy(&session.org_id, proxy_id).await {
                Ok((_, route)) => Some(route),
                Err(error) => {
                    tracing::warn!(session_id = %session.id, %error, "the session's proxy is gone");
                    return None;
                }
            },
            None => None,
        };
        // Checked when the session was created; one that no longer passes (stricter
        // rules since) ends the session rather than leave its egress unfiltered.
        let allowed_hosts = match session.vm_settings.allowed_hosts.as_deref() {
            None => None,
            Some(hosts) => match HostAllowlist::parse(hosts) {
                Ok(allowed) => Some(allowed),
                Err(problem) => {
                    tracing::warn!(session_id = %session.id, %problem, "the browser's allowlist no longer passes");
                    return None;
                }
            },
        };
        Some(VmEgress { upstream, allowed_hosts })
    }

    /// Serves an adopted VM's egress again; false if it cannot be.
    async fn reattach(&self, session: &SessionRecord) -> bool {
        let Some(egress) = self.egress_of(session).await else {
            return false;
        };
        match self.runtime.reattach(&session.id, egress) {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(session_id = %session.id, %error, "could not serve the VM's egress");
                false
            }
        }
    }

    /// Adopts the live sessions whose owner is gone (no live replica has its id) and, at
    /// start, those of this replica's previous life: a session whose agent still answers
    /// is served from now on by this replica, the others end. Of replicas adopting
    /// together, one gets each session.
    pub async fn adopt(self: &Arc<Self>, which: Adopt) -> anyhow::Result<()> {
        // A replica that cannot reach the database itself judges no other.
        if which == Adopt::Orphans && !self.replica.is_current() {
            return Ok(());
        }
        let replicas = self.replica.live_replicas().await?;
        for session in self.store.live_sessions().await? {
            let orphan = match session.owner.as_deref() {
                None => true,
                Some(owner) if owner == self.replica.id() => which == Adopt::AtStart,
                Some(owner) => !replicas.contains(owner),
            };
            if !orphan {
                continue;
            }
            let me = self.replica.id().to_owned();
            if !self.store.claim_session(&session.id, session.owner.as_deref(), &me).await? {
                continue;
            }
            let session = SessionRecord { owner: Some(me), ..session };
            let alive = match (&session.status, &session.agent) {
                (SessionStatus::Running, Some(location)) => match AgentClient::new(location) {
                    Ok(client) => client.status().await.is_ok(),
                    Err(_) => false,
                },
                // A launch that its replica did not finish.
                _ => false,
            };
            let alive = alive && self.reattach(&session).await;
            if alive {
                tracing::info!(session_id = %session.id, "adopted a running browser session");
                self.uncache(&session.id);
                // A fresh inactivity period: the time its replica was gone is no one's.
                self.touch(&session.id);
                self.watch_agent(session.clone());
                self.replays.resume_for(&session);
                self.replica.publish_here(Signal::Adopted {
                    org_id: session.org_id.clone(),
                    session_id: session.id.clone(),
                });
            } else {
                tracing::info!(session_id = %session.id, "browser of a session is gone; ending it");
                self.end(&session, "lost with the control plane that served it").await?;
            }
        }
        Ok(())
    }

    /// Acts on what other replicas changed. Runs forever.
    async fn run_signals(self: Arc<Self>) {
        let mut signals = self.replica.subscribe();
        loop {
            let signal = match signals.recv().await {
                Ok(signal) => signal,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "missed signals of other replicas");
                    continue;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            match signal {
                Signal::SessionChanged { session_id } => self.uncache(&session_id),
                Signal::SessionEnded { session_id } => {
                    self.forget(&session_id);
                    self.runtime.forget(&session_id);
                }
                Signal::EgressChanged { org_id, session_id, allowlist, proxy } => {
                    self.apply_egress(&org_id, &session_id, allowlist, proxy).await
                }
                Signal::ResetRequested { .. } | Signal::Adopted { .. } => {}
            }
        }
    }

    /// Applies a session's stored allowlist or proxy, if this replica serves it.
    async fn apply_egress(
        self: &Arc<Self>, org_id: &str, session_id: &str, allowlist: bool, proxy: bool,
    ) {
        let Ok(Some(session)) = self.store.session(org_id, session_id).await else {
            return;
        };
        if !self.replica.owns(&session) || session.status != SessionStatus::Running {
            return;
        }
        self.uncache(session_id);
        match self.egress_of(&session).await {
            Some(egress) => {
                if allowlist {
                    self.runtime.set_allowed_hosts(session_id, egress.allowed_hosts);
                }
                if proxy {
                    self.runtime.set_upstream(session_id, egress.upstream);
                }
            }
            None => {
                let _ = self.end(&session, "its egress settings can no longer be served").await;
            }
        }
    }
}

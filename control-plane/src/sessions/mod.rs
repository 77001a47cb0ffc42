//! Browser sessions: creation through the runtime, lookup, ending and reaping; their
//! background work (inactivity, heartbeats, adoption after a restart or from a replica
//! that is gone) is in `replication`.

mod admission;
mod clients;
pub mod labels;
mod replication;
mod spec;
pub mod standby;
#[cfg(test)]
mod tests;
pub mod update;

pub use clients::{CdpConnectionGuard, ClientKind};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;

pub use admission::HostLimits;
pub use spec::{
    BrowserConfig, BrowserSpec, DEFAULT_VIEWPORT, HEADFUL_MEMORY, HEADLESS_MEMORY,
    LibraryExtension, MAX_EXTENSIONS, NetworkConfig, ProfileReference, ResourceReference, Viewport,
    referenced, viewport_problems,
};
pub use update::{SessionUpdate, ViewportChange};

use crate::agent::{AgentClient, AgentClients};
use crate::blobs::BlobStore;
use crate::egress::{EgressPolicy, VmEgress};
use crate::error::{ServiceError, ServiceResult, run_to_completion};
use crate::ids;
use crate::profiles::Profiles;
use crate::proxies::ProxyUpstreams;
use crate::replays::Replays;
use crate::replicas::{Replica, Signal};
use crate::runtime::{LaunchSpec, Runtime, RuntimeError};
use crate::store::{PoolLease, SessionRecord, SessionStatus, Store, StoreError, scope};
use crate::telemetry::{Category, Telemetry};

/// When a session was last used through this replica and how many CDP connections it
/// has open here; written to the store every second (`replication`), where the reaper
/// reads what every replica saw.
#[derive(Debug)]
struct Activity {
    last: Instant,
    open_cdp_connections: usize,
    /// Written to the store since `last` changed.
    recorded: bool,
}

/// The session's activity record; a session first seen now (new, or adopted after a
/// restart) starts a fresh inactivity period.
fn activity_of<'a>(activity: &'a mut HashMap<String, Activity>, id: &str) -> &'a mut Activity {
    activity.entry(id.to_owned()).or_insert_with(|| Activity {
        last: Instant::now(),
        open_cdp_connections: 0,
        recorded: false,
    })
}

pub struct Sessions {
    store: Arc<dyn Store>,
    runtime: Arc<dyn Runtime>,
    agents: Arc<AgentClients>,
    replays: Arc<Replays>,
    profiles: Arc<Profiles>,
    /// Where library extensions' archives are.
    blobs: Arc<dyn BlobStore>,
    proxy_upstreams: Arc<ProxyUpstreams>,
    egress: Arc<EgressPolicy>,
    live_limits: LiveLimits,
    host_limits: HostLimits,
    /// Held from counting an organization's live browsers to recording a new one, so
    /// that concurrent creates cannot pass the limit together.
    admission: tokio::sync::Mutex<()>,
    /// Creates waiting here for room on the host, and the wake-up when a browser ends.
    host_queue: admission::HostQueue,
    activity: Mutex<HashMap<String, Activity>>,
    running: Mutex<RunningCache>,
    /// Serializes changes of live sessions' settings (`update`), each made on the stored
    /// record, so that none undoes another.
    settings_lock: tokio::sync::Mutex<()>,
    replica: Arc<Replica>,
    /// Set once at start when the operator keeps standby browsers.
    standby: std::sync::OnceLock<standby::Standby>,
    telemetry: Arc<Telemetry>,
}

/// What `Sessions` works with.
pub struct SessionsDeps {
    pub store: Arc<dyn Store>,
    pub runtime: Arc<dyn Runtime>,
    pub agents: Arc<AgentClients>,
    pub replays: Arc<Replays>,
    pub profiles: Arc<Profiles>,
    pub blobs: Arc<dyn BlobStore>,
    pub proxy_upstreams: Arc<ProxyUpstreams>,
    pub egress: Arc<EgressPolicy>,
    pub live_limits: LiveLimits,
    pub host_limits: HostLimits,
    pub replica: Arc<Replica>,
    pub telemetry: Arc<Telemetry>,
}

/// What one organization may have live outside its pools.
#[derive(Clone, Copy, Debug)]
pub struct LiveLimits {
    pub browsers: u32,
    /// The sum of the browsers' `memory`.
    pub memory_gib: u32,
}

/// Running sessions recently read from the store, so the hot path (a click) needs no
/// store round trip. Ending a session here evicts it and remembers the id for a while, so
/// a lookup that read the store just before the end cannot put it back; the short TTL
/// bounds how long a session ended by another replica can still be looked up.
#[derive(Default)]
struct RunningCache {
    sessions: HashMap<String, (Instant, SessionRecord)>,
    recently_ended: HashMap<String, Instant>,
}

const RUNNING_CACHE_TTL: Duration = Duration::from_secs(2);

/// When a caller at its live-browser limit is told to try again: browsers end when
/// deleted or after their inactivity timeout, which nothing here can predict.
const LIMIT_RETRY_AFTER: Duration = Duration::from_secs(10);
/// How long the teardown of a cut-off VM waits for the answer to the delete to go out.
const ANSWER_BEFORE_TEARDOWN: Duration = Duration::from_millis(20);
/// How long a persistent-id create waits for a concurrent create of the same id.
const STARTING_WAIT: Duration = Duration::from_secs(60);

impl Sessions {
    pub fn new(deps: SessionsDeps) -> Self {
        Self {
            store: deps.store,
            runtime: deps.runtime,
            agents: deps.agents,
            replays: deps.replays,
            profiles: deps.profiles,
            blobs: deps.blobs,
            proxy_upstreams: deps.proxy_upstreams,
            egress: deps.egress,
            live_limits: deps.live_limits,
            host_limits: deps.host_limits,
            admission: tokio::sync::Mutex::default(),
            host_queue: admission::HostQueue::default(),
            activity: Mutex::default(),
            running: Mutex::default(),
            settings_lock: tokio::sync::Mutex::default(),
            replica: deps.replica,
            standby: std::sync::OnceLock::new(),
            telemetry: deps.telemetry,
        }
    }

    /// Whether the pool is one of the standby browsers'.
    pub fn is_standby_pool(&self, pool_id: &str) -> bool {
        self.standby.get().is_some_and(|standby| standby.has_pool(pool_id))
    }

    /// Lets creates claim the standby pools' browsers (see `standby`); set once, at start.
    pub fn use_standby(&self, standby: standby::Standby) {
        if self.standby.set(standby).is_err() {
            tracing::warn!("the standby browsers were configured twice; keeping the first");
        }
    }

    /// Starts a browser, or returns the live session that already has the persistent id.
    pub async fn create(
        self: &Arc<Self>, org_id: &str, new: BrowserSpec,
    ) -> ServiceResult<SessionRecord> {
        if let Some(persistent_id) = &new.persistent_id
            && let Some(existing) = self.running_persistent(org_id, persistent_id).await?
        {
            return Ok(existing);
        }
        let started = std::time::Instant::now();
        let project_id = match &new.project_id {
            Some(project_id) => project_id.clone(),
            None => scope::project_for_new(self.store.as_ref(), org_id).await?,
        };
        let record = SessionRecord {
            id: ids::new_session_id(),
            org_id: org_id.to_owned(),
            persistent_id: new.persistent_id.clone(),
            headless: new.headless,
            stealth: new.stealth,
            kiosk_mode: new.kiosk_mode,
            timeout_seconds: new.timeout_seconds,
            viewport_width: new.viewport_width,
            viewport_height: new.viewport_height,
            viewport_refresh_rate: new.viewport_refresh_rate,
            status: SessionStatus::Starting,
            created_at: Utc::now(),
            ended_at: None,
            end_reason: None,
            agent: None,
            proxy_id: new.proxy.as_ref().map(|(id, _)| id.clone()),
            pool_lease: new.pool_id.as_ref().map(|_| PoolLease::Idle),
            pool_lease_id: None,
            vm_settings: new.vm_settings(),
            name: new.name.clone(),
            pool_id: new.pool_id.clone(),
            profile: new.profile.as_ref().map(|(profile, _)| profile.clone()),
            owner: Some(self.replica.id().to_owned()),
            project_id: Some(project_id),
        };
        if let Some(pool_id) = self.standby.get().and_then(|s| s.pool_for(&new))
            && let Some(claimed) = self.claim_standby(pool_id, &record, &new).await?
        {
            crate::metrics::METRICS.browser_created(started);
            return Ok(claimed);
        }
        let inserted = self.admit(&record).await?;
        match inserted {
            Ok(()) => {}
            // A concurrent create with the same persistent id won the race: answer its session.
            Err(StoreError::Conflict(_)) if new.persistent_id.is_some() => {
                let persistent_id = new.persistent_id.as_deref().unwrap_or_default();
                if let Some(existing) = self.running_persistent(org_id, persistent_id).await? {
                    return Ok(existing);
                }
                return Err(match &new.name {
                    Some(name) => update::name_taken(name),
                    None => ServiceError::Conflict(
                        "a session with this persistent id is being created or ended; retry".into(),
                    ),
                });
            }
            Err(StoreError::Conflict(_)) if new.name.is_some() => {
                return Err(update::name_taken(new.name.as_deref().unwrap_or_default()));
            }
            Err(error) => return Err(error.into()),
        }
        // The launch runs in a task of its own: if the caller goes away (disconnect,
        // client timeout) it still finishes and records its outcome, so no session is
        // left half-started and no browser is left without a session.
        let this = self.clone();
        let launched = run_to_completion(async move { this.launch(record, new).await }).await;
        if launched.is_ok() {
            crate::metrics::METRICS.browser_created(started);
        }
        launched
    }

    /// A standby browser of the pool made into this session, or `None` when none is idle
    /// or the one claimed could not take the session's settings (it ended: the caller
    /// starts a browser instead). Admitted as a create is.
    async fn claim_standby(
        self: &Arc<Self>, pool_id: &str, record: &SessionRecord, new: &BrowserSpec,
    ) -> ServiceResult<Option<SessionRecord>> {
        // A VM's egress is served by the replica that owns it: one owned elsewhere would
        // get the caller's proxy or allowlist only once that replica heard of it.
        let any_owner = new.proxy.is_none() && new.allowed_hosts.is_none();
        let claimed = {
            let _admission = self.admission.lock().await;
            let lock = self.store.lock_admission(&record.org_id).await?;
            let admitted = match self.check_live_limit(record).await {
                Ok(()) => Ok(self
                    .store
                    .claim_standby_browser(pool_id, self.replica.id(), any_owner, record)
                    .await),
                Err(refused) => Err(refused),
            };
            lock.release().await;
            admitted?
        };
        let claimed = match claimed {
            Ok(Some(claimed)) => claimed,
            // A name or persistent id already live: the cold path answers as it always has.
            Ok(None) | Err(StoreError::Conflict(_)) => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        // As a launch does: finishes even if the caller goes away.
        let (this, new) = (self.clone(), new.clone());
        run_to_completion(async move { this.take_over_standby(claimed, new).await }).await
    }

    async fn take_over_standby(
        self: &Arc<Self>, claimed: SessionRecord, new: BrowserSpec,
    ) -> ServiceResult<Option<SessionRecord>> {
        self.changed(&claimed.id).await;
        // In use from now on: what it takes on (a resize, a relaunch) runs at its weight.
        self.promote(&claimed.id);
        if let Err(error) = self.apply_to_claimed(&claimed, &new).await {
            tracing::warn!(session_id = %claimed.id, %error, "a standby browser could not take the session's settings; starting one instead");
            self.end(&claimed, "could not take the session's settings").await?;
            return Ok(None);
        }
        self.touch(&claimed.id);
        if let Some(url) = &claimed.vm_settings.start_url {
            self.open_url(&claimed, url).await;
        }
        Ok(Some(claimed))
    }

    /// What a launch would have given the browser and a running one can still take.
    async fn apply_to_claimed(
        &self, session: &SessionRecord, new: &BrowserSpec,
    ) -> ServiceResult<()> {
        if self.replica.owns(session) {
            self.runtime.set_allowed_hosts(&session.id, new.allowed_hosts.clone());
            self.runtime
                .set_upstream(&session.id, new.proxy.as_ref().map(|(_, route)| route.clone()));
        }
        // Claimed in the moment its agent died (before the watcher ended it).
        if let Some(location) = &session.agent
            && self.runtime.agent_exists(location) == Some(false)
        {
            return Err(ServiceError::Unavailable("the standby browser's agent is gone".into()));
        }
        let agent = self.agent(session)?;
        if (new.viewport_width, new.viewport_height) != standby::standby_viewport() {
            agent.resize_screen(new.viewport_width as u32, new.viewport_height as u32).await?;
        }
        if let Some(location) = &new.location {
            agent.relaunch(location.timezone.as_deref(), location.locale.as_deref()).await?;
        }
        Ok(())
    }

    /// Refuses a new session that would take its organization past its limit of live
    /// browsers outside pools (pools have a limit of their own). Called under
    /// `admission`, up to the session's insert.
    async fn launch(
        self: &Arc<Self>, record: SessionRecord, new: BrowserSpec,
    ) -> ServiceResult<SessionRecord> {
        let (extensions, proxy) = (new.extensions, new.proxy.map(|(_, route)| route));
        let profile_archive = new.profile.and_then(|(_, archive)| archive);
        let spec = LaunchSpec {
            egress: VmEgress { upstream: proxy, allowed_hosts: new.allowed_hosts },
            memory_limit_bytes: Some(new.memory.1),
            chrome_policy: new.chrome_policy.map(serde_json::Value::Object),
            timezone: new.location.as_ref().and_then(|l| l.timezone.clone()),
            locale: new.location.as_ref().and_then(|l| l.locale.clone()),
            profile_archive,
            session_id: record.id.clone(),
            headless: record.headless,
            width: record.viewport_width as u32,
            height: record.viewport_height as u32,
            kiosk: record.kiosk_mode,
            stealth: record.stealth,
            background: record.pool_id.is_some(),
            extensions: extensions.iter().map(|e| (e.name.clone(), e.archive.clone())).collect(),
        };
        let location = match self.runtime.launch(&spec).await {
            Ok(location) => location,
            Err(error) => {
                let ended_here =
                    self.store.end_session(&record.id, Utc::now(), "launch failed").await?;
                if !ended_here {
                    // A delete ended it first (and stopped the agent, failing the launch):
                    // a 5xx here would make the SDKs retry and start another browser.
                    return Err(ServiceError::NotFound(
                        "the browser session was deleted while starting".into(),
                    ));
                }
                return Err(match error {
                    RuntimeError::LaunchFailed(message) => ServiceError::Unavailable(message),
                    RuntimeError::Io(error) => ServiceError::Internal(error.into()),
                });
            }
        };
        if !self.store.set_session_running(&record.id, &location).await? {
            // Deleted while it was starting: the deleter could not reach the agent yet.
            self.runtime.destroy(&record.id, Some(&location)).await;
            return Err(ServiceError::NotFound(
                "the browser session was deleted while starting".into(),
            ));
        }
        if !extensions.is_empty() {
            let ids: Vec<String> = extensions.iter().map(|e| e.id.clone()).collect();
            self.store.mark_extensions_used(&ids, Utc::now()).await?;
        }
        if let Some(profile) = &record.profile {
            self.store.mark_profile_used(&profile.id, Utc::now()).await?;
        }
        self.touch(&record.id);
        let running =
            SessionRecord { status: SessionStatus::Running, agent: Some(location), ..record };
        self.watch_agent(running.clone());
        self.telemetry.prepare(&running, &self.agents).await;
        if let Some(url) = &running.vm_settings.start_url {
            self.open_url(&running, url).await;
        }
        Ok(running)
    }

    /// The live session with this persistent id, waiting while a concurrent create of
    /// the same id is still starting it.
    async fn running_persistent(
        &self, org_id: &str, persistent_id: &str,
    ) -> ServiceResult<Option<SessionRecord>> {
        let deadline = Instant::now() + STARTING_WAIT;
        loop {
            match self.store.live_session_by_persistent_id(org_id, persistent_id).await? {
                Some(session) if session.status == SessionStatus::Running => {
                    self.touch(&session.id);
                    return Ok(Some(session));
                }
                Some(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Some(_) => {
                    return Err(ServiceError::Conflict(
                        "the session with this persistent id is still starting; retry".into(),
                    ));
                }
                None => return Ok(None),
            }
        }
    }

    /// The running session of the organization read from the store less than
    /// `RUNNING_CACHE_TTL` ago. The cache is by id; names go to the store.
    fn cached(&self, org_id: &str, id: &str) -> Option<SessionRecord> {
        let running = self.running.lock().ok()?;
        running
            .sessions
            .get(id)
            .filter(|(read, session)| {
                read.elapsed() < RUNNING_CACHE_TTL
                    && session.org_id == org_id
                    && scope::admits(session.project_id.as_deref())
            })
            .map(|(_, session)| session.clone())
    }

    /// A session of the organization by id or name, live or ended, without counting as
    /// its activity (telemetry's view of a call that already happened).
    pub async fn peek(&self, org_id: &str, id_or_name: &str) -> Option<SessionRecord> {
        match self.cached(org_id, id_or_name) {
            Some(session) => Some(session),
            None => self.store.session(org_id, id_or_name).await.ok().flatten(),
        }
    }

    /// A live session of the organization, by id or name (foreign or ended: 404). Counts
    /// as activity.
    pub async fn live(&self, org_id: &str, id_or_name: &str) -> ServiceResult<SessionRecord> {
        if let Some(session) = self.cached(org_id, id_or_name) {
            self.touch(&session.id);
            return Ok(session);
        }
        match self.store.session(org_id, id_or_name).await? {
            Some(session) if session.status != SessionStatus::Ended => {
                if session.status == SessionStatus::Running
                    && let Ok(mut running) = self.running.lock()
                    && !running.recently_ended.contains_key(&session.id)
                {
                    running.sessions.insert(session.id.clone(), (Instant::now(), session.clone()));
                }
                self.touch(&session.id);
                Ok(session)
            }
            _ => Err(ServiceError::NotFound(format!("browser session {id_or_name} not found"))),
        }
    }

    /// What one organization may have live outside its pools.
    pub fn host_limits(&self) -> HostLimits {
        self.host_limits
    }

    pub fn live_limits(&self) -> LiveLimits {
        self.live_limits
    }

    /// This process among the replicas.
    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    /// A session's record changed: every replica drops its cached copy.
    async fn changed(&self, id: &str) {
        self.uncache(id);
        self.replica.publish(Signal::SessionChanged { session_id: id.to_owned() }).await;
    }

    /// Drops the cached copy of a session whose record changed.
    fn uncache(&self, id: &str) {
        if let Ok(mut running) = self.running.lock() {
            running.sessions.remove(id);
        }
    }

    /// Ends a session and reaps its browser. Only the caller that actually ends it
    /// reaps; returns whether this call did. Runs to its end even if the caller goes away:
    /// a session marked ended with its browser still running would never be reaped.
    pub async fn end(
        self: &Arc<Self>, session: &SessionRecord, reason: &str,
    ) -> ServiceResult<bool> {
        let (this, session, reason) = (self.clone(), session.clone(), reason.to_owned());
        run_to_completion(async move { this.end_now(&session, &reason).await }).await
    }

    /// Ends the sessions in parallel; returns how many this call ended.
    pub async fn end_all(self: &Arc<Self>, sessions: Vec<SessionRecord>, reason: &str) -> usize {
        let ends = sessions.iter().map(|session| self.end(session, reason));
        futures::future::join_all(ends)
            .await
            .into_iter()
            .filter(|outcome| matches!(outcome, Ok(true)))
            .count()
    }

    async fn end_now(&self, session: &SessionRecord, reason: &str) -> ServiceResult<bool> {
        if !self.store.end_session(&session.id, Utc::now(), reason).await? {
            // Ended already, maybe by another replica whose signal did not come (it is
            // lost while the database is away): what this process holds for it goes.
            self.forget(&session.id);
            self.runtime.forget(&session.id);
            return Ok(false);
        }
        tracing::info!(session_id = %session.id, reason, "ending browser session");
        self.forget(&session.id);
        self.replica.publish(Signal::SessionEnded { session_id: session.id.clone() }).await;
        let agent = session.agent.as_ref().and_then(|location| AgentClient::new(location).ok());
        // A pool browser never leased (idle, or claimed while idle) holds only the state
        // it started from: saving it would put that back over newer saves.
        let used = matches!(session.pool_lease, None | Some(PoolLease::Leased));
        let saved_profile = session
            .profile
            .as_ref()
            .filter(|profile| profile.save_changes && used && agent.is_some());
        if saved_profile.is_none()
            && !self.replays.has_unfinished(session).await
            && self.runtime.cut_off(&session.id, session.agent.as_ref()).await
        {
            // Nothing anyone can read back waits on the rest: the VM is cut off now (no
            // connection reaches it once this answers) and taken apart in the background.
            // Should this process die first, `reap_strays` takes apart what is left at
            // the next start.
            let (runtime, id, location) =
                (self.runtime.clone(), session.id.clone(), session.agent.clone());
            // Its processes are stopped: a create waiting for room may start its own.
            self.host_queue.room_freed();
            tokio::spawn(async move {
                // The answer goes out first: the teardown takes both cores for a moment.
                tokio::time::sleep(ANSWER_BEFORE_TEARDOWN).await;
                runtime.destroy(&id, location.as_ref()).await
            });
            return Ok(true);
        }
        // Recordings are finalized and kept, and the profile saved, before the browser
        // goes: both are readable as soon as the end is answered.
        let _place = admission::TearingDown::new(&self.host_queue);
        self.replays.finish_all(session, agent.clone()).await;
        if let (Some(profile), Some(agent)) = (saved_profile, &agent) {
            self.save_profile(&session.id, &profile.id, agent).await;
        }
        self.runtime.destroy(&session.id, session.agent.as_ref()).await;
        Ok(true)
    }

    /// Saves the browser's state into the profile; a failure keeps the profile's previous
    /// state (and is logged: the session ends either way).
    pub async fn save_profile(&self, session_id: &str, profile_id: &str, agent: &AgentClient) {
        if let Err(error) = self.profiles.save_from(profile_id, agent).await {
            tracing::warn!(
                session_id,
                profile_id,
                error = format!("{error:#}"),
                "the profile was not saved; it keeps its previous state"
            );
        }
    }

    /// The sessions this process holds something for: cached records, activity not yet
    /// shared, agent clients.
    fn held(&self) -> HashSet<String> {
        let mut held = self.agents.held();
        if let Ok(running) = self.running.lock() {
            held.extend(running.sessions.keys().cloned());
        }
        if let Ok(activity) = self.activity.lock() {
            held.extend(activity.keys().cloned());
        }
        held
    }

    fn forget(&self, id: &str) {
        if let Ok(mut running) = self.running.lock() {
            running.sessions.remove(id);
            running.recently_ended.insert(id.to_owned(), Instant::now());
            running.recently_ended.retain(|_, ended| ended.elapsed() < RUNNING_CACHE_TTL * 2);
        }
        if let Ok(mut activity) = self.activity.lock() {
            activity.remove(id);
        }
        self.agents.forget(id);
    }

    /// The gRPC client of a running session's agent (connections are reused).
    pub fn agent(&self, session: &SessionRecord) -> ServiceResult<AgentClient> {
        Ok(self.agents.get(&session.id, session.agent.as_ref())?)
    }

    /// Ends the session as soon as the runtime sees its agent gone (killed, crashed), so
    /// that the session stops answering as live and its recordings are kept as they were
    /// when it died.
    fn watch_agent(self: &Arc<Self>, session: SessionRecord) {
        let Some(location) = session.agent.clone() else {
            return;
        };
        let this = self.clone();
        tokio::spawn(async move {
            this.runtime.wait_for_exit(&location).await;
            // A standby browser's record has moved to the organization that claimed it.
            let session = match this.store.live_sessions().await {
                Ok(live) => {
                    live.into_iter().find(|current| current.id == session.id).unwrap_or(session)
                }
                Err(_) => session,
            };
            this.end_exited(&session).await;
        });
    }

    /// Ends a session whose agent is gone, with the reason the runtime knows (the
    /// kernel's out-of-memory kill, or what the VM noted), whichever watcher saw it first.
    pub(crate) async fn end_exited(self: &Arc<Self>, session: &SessionRecord) {
        let reason = self
            .runtime
            .exit_reason(&session.id)
            .unwrap_or_else(|| "browser agent exited".to_owned());
        self.telemetry.record(session, vm_end_event(session, &reason));
        if let Err(error) = self.end(session, &reason).await {
            tracing::warn!(session_id = %session.id, %error, "could not end a session whose agent exited");
        }
    }
}

/// The `system` event of a VM that ended on its own: the kernel's out-of-memory kill, or
/// its agent's crash.
fn vm_end_event(session: &SessionRecord, reason: &str) -> crate::telemetry::Event {
    use crate::telemetry::Event;
    let pid = session.agent.as_ref().and_then(|agent| agent.pid).unwrap_or_default();
    if reason.contains("more memory than its limit") {
        let limit_kb = crate::sessions::spec::memory_bytes(
            session.vm_settings.memory.as_deref().unwrap_or("1GiB"),
        ) / 1024;
        return Event::api(
            Category::System,
            "system_oom_kill",
            serde_json::json!({
                "pid": pid,
                "process_name": "browser-vm",
                "rss_kb": limit_kb,
                "constraint": "memcg",
            }),
        );
    }
    Event::api(
        Category::System,
        "service_crashed",
        serde_json::json!({ "service_name": "browser-agent", "phase": "running", "pid": pid }),
    )
}

//! Test doubles for the services' unit tests: a runtime whose "browsers" are entries in
//! memory, and a fake agent that speaks the real gRPC contract over loopback (answering
//! only the calls the services make in these tests). Races between sessions, pools and
//! replays are tested with them, without Chromium.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use browser_agent_proto_fake::v1::browser_agent_server::{BrowserAgent, BrowserAgentServer};
use browser_agent_proto_fake::v1::{
    DataChunk, DevtoolsState, Empty, RecordingInfo, RecordingRequest, RecordingState,
    ShutdownRequest, ShutdownResponse, StartRecordingRequest, StatusRequest, StatusResponse,
};
use tokio::sync::{Notify, Semaphore};
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use crate::app::{ServiceSettings, Services};
use crate::managed_auth::vault::Vault;
use crate::runtime::{LaunchSpec, Runtime, RuntimeError};
use crate::store::AgentLocation;

/// An agent that is always ready, resets instantly and records a tiny "video"; counts
/// what it was asked. With `recordings_unreachable` its recording calls fail as those of
/// a dead agent do.
#[derive(Clone, Default)]
pub struct FakeAgent {
    pub resets: Arc<AtomicUsize>,
    pub recording_stops: Arc<AtomicUsize>,
    pub recording_reads: Arc<AtomicUsize>,
    pub recordings_unreachable: Arc<AtomicBool>,
}

/// What the fake agent records.
pub const FAKE_VIDEO: &[u8] = b"fake video";

fn unix_ms_now() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl FakeAgent {
    fn reachable(&self) -> Result<(), Status> {
        if self.recordings_unreachable.load(Ordering::SeqCst) {
            return Err(Status::unavailable("connection refused"));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl BrowserAgent for FakeAgent {
    async fn status(
        &self, _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(StatusResponse {
            devtools_state: DevtoolsState::Ready.into(),
            ..Default::default()
        }))
    }

    async fn shutdown(
        &self, _request: Request<ShutdownRequest>,
    ) -> Result<Response<ShutdownResponse>, Status> {
        Ok(Response::new(ShutdownResponse::default()))
    }

    async fn reset_browser(&self, _request: Request<Empty>) -> Result<Response<Empty>, Status> {
        self.resets.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(Empty {}))
    }

    async fn start_recording(
        &self, request: Request<StartRecordingRequest>,
    ) -> Result<Response<RecordingInfo>, Status> {
        self.reachable()?;
        Ok(Response::new(RecordingInfo {
            recording_id: request.into_inner().recording_id,
            state: RecordingState::Recording.into(),
            started_at_unix_ms: unix_ms_now(),
            ..Default::default()
        }))
    }

    async fn stop_recording(
        &self, request: Request<RecordingRequest>,
    ) -> Result<Response<RecordingInfo>, Status> {
        self.reachable()?;
        self.recording_stops.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(RecordingInfo {
            recording_id: request.into_inner().recording_id,
            state: RecordingState::Finished.into(),
            finished_at_unix_ms: unix_ms_now(),
            size_bytes: FAKE_VIDEO.len() as u64,
            ..Default::default()
        }))
    }

    async fn read_recording(
        &self, _request: Request<RecordingRequest>,
    ) -> Result<Response<BoxStream<DataChunk>>, Status> {
        self.reachable()?;
        self.recording_reads.fetch_add(1, Ordering::SeqCst);
        let chunk = DataChunk { data: FAKE_VIDEO.to_vec() };
        Ok(Response::new(Box::pin(tokio_stream::iter([Ok(chunk)]))))
    }

    async fn delete_recording(
        &self, _request: Request<RecordingRequest>,
    ) -> Result<Response<Empty>, Status> {
        Ok(Response::new(Empty {}))
    }
}

/// Serves `agent` on a loopback port for the rest of the test; answers its endpoint.
pub async fn serve_fake_agent(agent: FakeAgent) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("loopback port");
    let address = listener.local_addr().expect("bound address");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(BrowserAgentServer::new(agent))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    format!("http://{address}")
}

/// A runtime whose browsers exist only in memory, all served by one fake agent. A
/// launch can be held (to race it), made to fail, or its agent "killed".
pub struct FakeRuntime {
    agent_endpoint: String,
    /// While set, launches wait for a permit.
    held_launches: Mutex<Option<Arc<Semaphore>>>,
    pub fail_launches: AtomicBool,
    pub launches: AtomicUsize,
    /// Session ids whose launch has begun.
    pub launched: Mutex<Vec<String>>,
    pub destroyed: Mutex<Vec<String>>,
    /// Sessions whose agent is gone.
    exited: Mutex<HashSet<String>>,
    exit: Notify,
    /// What the last `reap_strays` was told to keep.
    pub kept_by_reap: Mutex<Option<HashSet<String>>>,
    /// The file a dead agent "left" for every recording.
    pub leftover: Mutex<Option<PathBuf>>,
}

impl FakeRuntime {
    pub fn new(agent_endpoint: String) -> Self {
        Self {
            agent_endpoint,
            held_launches: Mutex::default(),
            fail_launches: AtomicBool::new(false),
            launches: AtomicUsize::new(0),
            launched: Mutex::default(),
            destroyed: Mutex::default(),
            exited: Mutex::default(),
            exit: Notify::new(),
            kept_by_reap: Mutex::default(),
            leftover: Mutex::default(),
        }
    }

    /// From now on launches wait until `release_launches`.
    pub fn hold_launches(&self) -> Arc<Semaphore> {
        let gate = Arc::new(Semaphore::new(0));
        *self.held_launches.lock().expect("lock") = Some(gate.clone());
        gate
    }

    /// The location a launch of `session_id` answers (the session id rides in `vm_root`).
    pub fn location(&self, session_id: &str) -> AgentLocation {
        AgentLocation {
            endpoint: self.agent_endpoint.clone(),
            secret: "fake".into(),
            pid: None,
            vm_root: session_id.to_owned(),
        }
    }

    /// The session's agent dies.
    pub fn kill(&self, session_id: &str) {
        self.exited.lock().expect("lock").insert(session_id.to_owned());
        self.exit.notify_waiters();
    }

    pub fn was_destroyed(&self, session_id: &str) -> bool {
        self.destroyed.lock().expect("lock").iter().any(|id| id == session_id)
    }

    fn is_gone(&self, session_id: &str) -> bool {
        self.exited.lock().expect("lock").contains(session_id)
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    async fn launch(&self, spec: &LaunchSpec) -> Result<AgentLocation, RuntimeError> {
        self.launches.fetch_add(1, Ordering::SeqCst);
        self.launched.lock().expect("lock").push(spec.session_id.clone());
        let gate = self.held_launches.lock().expect("lock").clone();
        if let Some(gate) = gate {
            gate.acquire().await.expect("gate open").forget();
        }
        if self.fail_launches.load(Ordering::SeqCst) || self.is_gone(&spec.session_id) {
            return Err(RuntimeError::LaunchFailed("the fake launch failed".into()));
        }
        Ok(self.location(&spec.session_id))
    }

    async fn destroy(&self, session_id: &str, _location: Option<&AgentLocation>) {
        self.destroyed.lock().expect("lock").push(session_id.to_owned());
        self.kill(session_id);
    }

    fn agent_exists(&self, location: &AgentLocation) -> Option<bool> {
        Some(!self.is_gone(&location.vm_root))
    }

    async fn wait_for_exit(&self, location: &AgentLocation) {
        loop {
            let exited = self.exit.notified();
            if self.is_gone(&location.vm_root) {
                return;
            }
            exited.await;
        }
    }

    async fn reap_strays(&self, live_session_ids: &HashSet<String>, _: std::time::Duration) {
        *self.kept_by_reap.lock().expect("lock") = Some(live_session_ids.clone());
    }

    fn leftover_recording(&self, _session_id: &str, _recording_id: &str) -> Option<std::fs::File> {
        let path = self.leftover.lock().expect("lock").clone()?;
        std::fs::File::open(path).ok()
    }

    fn isolation(&self) -> crate::runtime::IsolationReport {
        crate::runtime::IsolationReport::local(
            crate::runtime::isolation::HostCapabilities::detect(),
            None,
            &crate::runtime::KernelLimits::none("a fake runtime"),
        )
    }
}

/// Services over a SQLite store in `dir`, a fake runtime and one fake agent.
pub async fn services(dir: &Path) -> (Services, Arc<FakeRuntime>, FakeAgent) {
    let store = crate::store::open(None, dir).await.expect("store");
    services_over(store, dir).await
}

/// Services over `store` (e.g. the store of a "previous process", to test restarts).
pub async fn services_over(
    store: Arc<dyn crate::store::Store>, dir: &Path,
) -> (Services, Arc<FakeRuntime>, FakeAgent) {
    let agent = FakeAgent::default();
    let runtime = Arc::new(FakeRuntime::new(serve_fake_agent(agent.clone()).await));
    let blobs: Arc<dyn crate::blobs::BlobStore> =
        Arc::new(crate::blobs::LocalBlobStore::open(&dir.join("blobs")).expect("blobs"));
    let services = Services::new(
        store,
        blobs,
        runtime.clone(),
        ServiceSettings {
            media: crate::replays::VmMedia::new("ffmpeg", None),
            proxy_upstreams: Default::default(),
            max_pooled_browsers: 10,
            live_limits: crate::sessions::LiveLimits { browsers: 5, memory_gib: 1024 },
            host_limits: crate::sessions::HostLimits {
                browsers: 100,
                min_available_memory: None,
                queue_wait: std::time::Duration::ZERO,
            },
            egress: Default::default(),
            vault: Vault::open(None, dir).expect("vault"),
            onepassword_connect_url: None,
            min_health_check_interval: 300,
            app_runner: None,
            max_running_invocations: 4,
            replica_id: format!("rep_{}", crate::ids::new_secret(8)),
            replica_address: "http://127.0.0.1:9".into(),
            audit_retention: std::time::Duration::from_secs(86_400),
            aws: Default::default(),
            audit_export_delay: std::time::Duration::from_secs(1),
        },
    );
    (services, runtime, agent)
}

/// Polls `condition` every 10 ms for up to 5 s.
pub async fn eventually(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !condition().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The id of a test organization.
pub async fn organization(services: &Services) -> String {
    services.store.ensure_organization("acme").await.expect("org").id
}

/// A session as the store has it now.
pub async fn stored_session(
    store: &dyn crate::store::Store, org_id: &str, id: &str,
) -> crate::store::SessionRecord {
    store.session(org_id, id).await.expect("store").expect("the session is on record")
}

/// A running browser of the organization, with the default configuration.
pub async fn running_session(services: &Services, org_id: &str) -> crate::store::SessionRecord {
    let spec = services
        .sessions
        .spec(org_id, &crate::sessions::BrowserConfig::default(), None, Vec::new())
        .await
        .expect("the default configuration is valid");
    services.sessions.create(org_id, spec).await.expect("created")
}

/// Started services over fakes in a directory of their own (keep it while they run), and
/// a running session of their organization.
pub async fn one_running_session()
-> (tempfile::TempDir, Services, Arc<FakeRuntime>, String, crate::store::SessionRecord) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (services, runtime, _) = services(dir.path()).await;
    let org_id = organization(&services).await;
    let session = running_session(&services, &org_id).await;
    (dir, services, runtime, org_id, session)
}

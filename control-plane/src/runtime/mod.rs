//! How browser VMs come to exist. `local` spawns one browser-agent process per browser on
//! this host; other runtimes (agents on operators' hosts, Kubernetes pods) implement the
//! same trait.

pub mod cgroups;
pub mod disk;
pub mod isolation;
pub mod kubernetes;
mod local;
pub mod processes;
pub mod sandbox;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;

pub use isolation::IsolationReport;
pub use isolation::KernelLimits;
pub use local::{LocalRuntime, LocalRuntimeConfig, ZipLimits};
pub use sandbox::Sandbox;

use crate::egress::{HostAllowlist, ProxyFailures, VmEgress};
use crate::proxies::ProxyRoute;
use crate::store::AgentLocation;

/// What a new browser VM must look like.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    pub session_id: String,
    pub headless: bool,
    pub width: u32,
    pub height: u32,
    pub kiosk: bool,
    pub stealth: bool,
    /// Extensions to load from the start: (name, archive on this host).
    pub extensions: Vec<(String, std::path::PathBuf)>,
    /// What the browser's traffic may reach, and through which proxy.
    pub egress: VmEgress,
    /// The stored profile (ZIP of user data) Chromium starts from.
    pub profile_archive: Option<PathBuf>,
    /// The VM ends when it uses more memory than this.
    pub memory_limit_bytes: Option<u64>,
    /// Chromium enterprise policies for this browser (a JSON object).
    pub chrome_policy: Option<serde_json::Value>,
    /// IANA timezone and BCP 47 locale the browser's pages see (validated).
    pub timezone: Option<String>,
    pub locale: Option<String>,
    /// Started ahead of demand (a pool's or the standby's browser): the VM runs at idle
    /// priority (`cgroups`), so that browsers in use, the service and its clients go
    /// first, until it has settled (`BACKGROUND_START_SETTLE`), is put to use
    /// (`Runtime::promote`) or has been starting for `BACKGROUND_START_LIMIT`, whichever
    /// comes first.
    pub background: bool,
}

/// How long a VM started in the background keeps its idle priority: Chromium keeps
/// working for a moment after its DevTools first answers.
pub const BACKGROUND_START_SETTLE: std::time::Duration = std::time::Duration::from_secs(3);
/// The longest a VM started in the background keeps its idle priority, ready or not.
pub const BACKGROUND_START_LIMIT: std::time::Duration = std::time::Duration::from_secs(15);

/// What a runtime's VMs can be given at launch beyond the basics; each `Err` says why
/// not, for a 400 that the caller can act on.
#[derive(Clone, Debug)]
pub struct RuntimeCapabilities {
    /// Chromium enterprise policies (`chrome_policy`).
    pub chrome_policy: Result<(), String>,
    /// Per-browser egress rules: `network.allowed_hosts` and proxies.
    pub egress_rules: Result<(), String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("the browser could not be started: {0}")]
    LaunchFailed(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

#[async_trait]
pub trait Runtime: Send + Sync + 'static {
    /// Starts a browser VM and its agent; returns once Chromium's DevTools answers.
    async fn launch(&self, spec: &LaunchSpec) -> Result<AgentLocation, RuntimeError>;

    /// Stops the session's VM and reaps every process and file it had. Idempotent; works
    /// also for a session whose launch never finished (`location` unknown).
    async fn destroy(&self, session_id: &str, location: Option<&AgentLocation>);

    /// Makes a VM unreachable at once, before `destroy` takes it apart (later, in the
    /// background): its processes are stopped (the local runtime, whose `destroy` then
    /// kills them, closing every connection) or killed. Only for a VM with nothing left
    /// to flush (its recordings finished, its profile saved).
    /// Answers whether it did; a runtime that cannot do it faster than `destroy` answers
    /// false, and the caller destroys the VM before going on.
    async fn cut_off(&self, session_id: &str, location: Option<&AgentLocation>) -> bool {
        let _ = (session_id, location);
        false
    }

    /// Whether the agent still exists, if this runtime can tell without asking it.
    fn agent_exists(&self, location: &AgentLocation) -> Option<bool>;

    /// Resolves once the agent is gone (exited, killed); never, if this runtime cannot
    /// tell (its agents are then judged by heartbeats).
    async fn wait_for_exit(&self, location: &AgentLocation) {
        let _ = location;
        std::future::pending::<()>().await
    }

    /// Reaps VMs that belong to none of `live_session_ids` (left by a crash), except
    /// those younger than `spare_younger_than` (another replica on this host may be
    /// starting them: its session was recorded after the list was read).
    async fn reap_strays(
        &self, live_session_ids: &HashSet<String>, spare_younger_than: std::time::Duration,
    );

    /// The file of a recording that a session's agent left on this host (finished, or
    /// the fragmented MP4 of one cut short), opened for collecting it when the agent is
    /// gone: a regular file, reached through no link the VM could have planted.
    fn leftover_recording(&self, session_id: &str, recording_id: &str) -> Option<std::fs::File>;

    /// What keeps this runtime's browser VMs apart from the host and each other.
    fn isolation(&self) -> IsolationReport;

    /// What its VMs can be given at launch. By default: policies in sandboxed VMs only
    /// (outside one, a page could change them), and egress rules.
    fn capabilities(&self) -> RuntimeCapabilities {
        RuntimeCapabilities {
            chrome_policy: match self.isolation().sandboxed {
                true => Ok(()),
                false => Err("chrome_policy needs browsers in sandboxes of their own (this \
                              server runs with --isolation none)"
                    .to_owned()),
            },
            egress_rules: Ok(()),
        }
    }

    /// Why the VM ended itself (past its memory limit), once its agent is gone.
    fn exit_reason(&self, session_id: &str) -> Option<String> {
        let _ = session_id;
        None
    }

    /// Serves a live VM adopted after a restart: its egress again.
    fn reattach(&self, session_id: &str, egress: VmEgress) -> Result<(), RuntimeError> {
        let _ = (session_id, egress);
        Ok(())
    }

    /// Requests the VMs' egress proxies refused or could not carry, kept briefly for
    /// their sessions' telemetry (none where the runtime has no proxy of ours).
    fn proxy_failures(&self) -> Arc<ProxyFailures> {
        Arc::default()
    }

    /// Drops what this process holds for a VM that another replica ended (its egress).
    fn forget(&self, session_id: &str) {
        let _ = session_id;
    }

    /// Gives a VM started ahead of demand (`LaunchSpec::background`) the priority of a
    /// browser in use, now that it is one (a claimed standby or leased pool browser).
    fn promote(&self, session_id: &str) {
        let _ = session_id;
    }

    /// Replaces a live VM's `allowed_hosts`, for connections opened from now on.
    fn set_allowed_hosts(&self, session_id: &str, allowed_hosts: Option<HostAllowlist>) {
        let _ = (session_id, allowed_hosts);
    }

    /// Switches a live VM's proxy (`None`: direct) for requests from now on; open
    /// connections through the old route are closed.
    fn set_upstream(&self, session_id: &str, upstream: Option<ProxyRoute>) {
        let _ = (session_id, upstream);
    }
}

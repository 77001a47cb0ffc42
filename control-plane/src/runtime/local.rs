//! The local runtime: each browser is a detached `browser-agent` process on this host with
//! its own directory `<data-dir>/browsers/<session id>/` holding the VM root, the agent's
//! log, its pid and the address it listens on. Agents run in their own process group so
//! that stopping or crashing the control plane does not take live browsers down.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use browser_agent_proto::recording_files;
use browser_agent_proto::v1::DevtoolsState;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::sync::watch;

use super::isolation::{HostCapabilities, IsolationReport};
use super::processes::{group_members_mentioning, is_agent_for, is_running};
use super::{LaunchSpec, Runtime, RuntimeError};
use crate::agent::{AgentClient, UNIX_ENDPOINT_PREFIX};
use crate::ids;
use crate::store::AgentLocation;

#[derive(Clone, Debug)]
pub struct LocalRuntimeConfig {
    /// Where browser directories live (`<data-dir>/browsers`).
    pub browsers_dir: PathBuf,
    pub agent_binary: PathBuf,
    pub chromium: String,
    pub xvfb: String,
    pub ffmpeg: String,
    /// An agent shuts itself down after this long without hearing from a control plane.
    pub agent_idle_grace: Duration,
    pub zip_limits: ZipLimits,
}

/// Limits on archives extracted by `upload_zip`, enforced by the agent.
#[derive(Clone, Copy, Debug)]
pub struct ZipLimits {
    pub max_entries: u64,
    pub max_expanded_bytes: u64,
    pub max_ratio: u64,
}

pub struct LocalRuntime {
    config: LocalRuntimeConfig,
    isolation: IsolationReport,
}

const ADDRESS_TIMEOUT: Duration = Duration::from_secs(10);
const READY_TIMEOUT: Duration = Duration::from_secs(45);
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a live agent's process is checked: a dead agent's session ends within this.
const EXIT_POLL_INTERVAL: Duration = Duration::from_millis(250);
const ROOT_DIR: &str = "root";
/// Beside the root, not in it: uploads wait here before extraction.
const SCRATCH_DIR: &str = "scratch";
const PID_FILE: &str = "agent.pid";
const ADDR_FILE: &str = "agent.addr";
/// The agent's gRPC socket.
const SOCKET_FILE: &str = "agent.sock";
const LOG_FILE: &str = "agent.log";
/// Beside the root: where the agent writes screen recordings.
const RECORDINGS_DIR: &str = "recordings";

impl LocalRuntime {
    pub fn new(config: LocalRuntimeConfig) -> Self {
        Self {
            config,
            isolation: IsolationReport::local(HostCapabilities::detect()),
        }
    }

    fn browser_dir(&self, session_id: &str) -> PathBuf {
        self.config.browsers_dir.join(session_id)
    }

    async fn spawn_agent(
        &self,
        spec: &LaunchSpec,
        dir: &Path,
    ) -> Result<(AgentLocation, watch::Receiver<Option<String>>), RuntimeError> {
        let root = dir.join(ROOT_DIR);
        std::fs::create_dir_all(&root)?;
        // The VM's `/` reads as usual (our umask keeps the browser's directory private).
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        let log = std::fs::File::create(dir.join(LOG_FILE))?;
        let secret = ids::new_secret(43);
        let mut command = tokio::process::Command::new(&self.config.agent_binary);
        command
            .arg("--vm-root")
            .arg(&root)
            // A socket in the browser's directory, not a loopback port: pages (and anything
            // else on this host's network) cannot reach the agent.
            .arg("--listen-socket")
            .arg(dir.join(SOCKET_FILE))
            .arg("--addr-file")
            .arg(dir.join(ADDR_FILE))
            .arg(format!("--width={}", spec.width))
            .arg(format!("--height={}", spec.height))
            .arg(format!(
                "--idle-grace-seconds={}",
                self.config.agent_idle_grace.as_secs().max(1)
            ))
            .arg("--scratch-dir")
            .arg(dir.join(SCRATCH_DIR))
            .arg("--recordings-dir")
            .arg(dir.join(RECORDINGS_DIR))
            .arg(format!(
                "--zip-max-entries={}",
                self.config.zip_limits.max_entries
            ))
            .arg(format!(
                "--zip-max-expanded-bytes={}",
                self.config.zip_limits.max_expanded_bytes
            ))
            .arg(format!(
                "--zip-max-ratio={}",
                self.config.zip_limits.max_ratio
            ))
            .env("BROWSER_AGENT_SECRET", &secret)
            .env("BROWSER_AGENT_CHROMIUM", &self.config.chromium)
            .env("BROWSER_AGENT_XVFB", &self.config.xvfb)
            .env("BROWSER_AGENT_FFMPEG", &self.config.ffmpeg)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Detached from our process group: a Ctrl-C or crash of the control plane
            // must not reach live browsers.
            .process_group(0);
        if spec.headless {
            command.arg("--headless");
        }
        for (name, archive) in &spec.extensions {
            command
                .arg("--extension")
                .arg(format!("{name}={}", archive.display()));
        }
        if spec.kiosk {
            command.arg("--kiosk");
        }
        if let Some(archive) = &spec.profile_archive {
            command.arg("--profile-archive").arg(archive);
        }
        if let Some(proxy) = &spec.proxy {
            command.arg(format!("--proxy-upstream={}", proxy.address));
            // Credentials in the environment: the process list shows arguments.
            if let Some(username) = &proxy.username {
                command.env("BROWSER_AGENT_PROXY_USERNAME", username);
            }
            if let Some(password) = &proxy.password {
                command.env("BROWSER_AGENT_PROXY_PASSWORD", password);
            }
            for host in &proxy.bypass_hosts {
                command.arg(format!("--proxy-bypass={host}"));
            }
        }
        if spec.stealth {
            command.arg("--stealth");
        }
        let mut child = command.spawn().map_err(|error| {
            RuntimeError::LaunchFailed(format!(
                "starting {} failed: {error}",
                self.config.agent_binary.display()
            ))
        })?;
        let pid = child.id().map(i64::from);
        if let Some(pid) = pid
            && let Err(error) = std::fs::write(dir.join(PID_FILE), pid.to_string())
        {
            // Without its pid on record the agent could not be found again: stop it now
            // (its Xvfb and Chromium die with it).
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(error.into());
        }
        // While we are its parent, reap the agent when it exits, and tell the launcher.
        let (exited_tx, exited) = watch::channel(None);
        tokio::spawn(async move {
            let status = child.wait().await;
            let _ = exited_tx.send(Some(match status {
                Ok(status) => status.to_string(),
                Err(error) => error.to_string(),
            }));
        });
        let location = AgentLocation {
            endpoint: String::new(),
            secret,
            pid,
            vm_root: root.display().to_string(),
        };
        Ok((location, exited))
    }

    async fn wait_for_address(
        &self,
        dir: &Path,
        exited: &watch::Receiver<Option<String>>,
    ) -> Result<String, RuntimeError> {
        let addr_file = dir.join(ADDR_FILE);
        let deadline = tokio::time::Instant::now() + ADDRESS_TIMEOUT;
        loop {
            if let Ok(address) = std::fs::read_to_string(&addr_file) {
                let address = address.trim();
                // `unix:<path>` is an endpoint as it is; a TCP address needs its scheme.
                return Ok(if address.starts_with(UNIX_ENDPOINT_PREFIX) {
                    address.to_owned()
                } else {
                    format!("http://{address}")
                });
            }
            if let Some(status) = exited.borrow().clone() {
                return Err(RuntimeError::LaunchFailed(format!(
                    "the browser agent exited ({status}): {}",
                    log_tail(dir)
                )));
            }
            if tokio::time::Instant::now() > deadline {
                return Err(RuntimeError::LaunchFailed(
                    "the browser agent did not start listening".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// The last lines of an agent's log, for launch errors.
fn log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join(LOG_FILE)).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

#[async_trait]
impl Runtime for LocalRuntime {
    async fn launch(&self, spec: &LaunchSpec) -> Result<AgentLocation, RuntimeError> {
        let dir = self.browser_dir(&spec.session_id);
        let (mut location, exited) = self.spawn_agent(spec, &dir).await?;
        let outcome = async {
            location.endpoint = self.wait_for_address(&dir, &exited).await?;
            let client = AgentClient::new(&location)
                .map_err(|error| RuntimeError::LaunchFailed(error.to_string()))?;
            let status = client
                .wait_until_ready(READY_TIMEOUT)
                .await
                .map_err(|error| RuntimeError::LaunchFailed(error.to_string()))?;
            if status.devtools_state() != DevtoolsState::Ready {
                return Err(RuntimeError::LaunchFailed(format!(
                    "Chromium did not become ready: {}",
                    if status.last_chromium_exit.is_empty() {
                        "timed out".to_owned()
                    } else {
                        status.last_chromium_exit
                    }
                )));
            }
            Ok(())
        }
        .await;
        match outcome {
            Ok(()) => Ok(location),
            Err(error) => {
                tracing::warn!(session_id = %spec.session_id, %error, "launch failed; reaping");
                self.destroy(&spec.session_id, Some(&location)).await;
                Err(error)
            }
        }
    }

    async fn destroy(&self, session_id: &str, location: Option<&AgentLocation>) {
        let dir = self.browser_dir(session_id);
        let root = dir.join(ROOT_DIR);
        let pid = location.and_then(|l| l.pid).or_else(|| {
            std::fs::read_to_string(dir.join(PID_FILE))
                .ok()?
                .trim()
                .parse()
                .ok()
        });
        let mut shutdown_accepted = false;
        if let Some(location) = location.filter(|l| !l.endpoint.is_empty())
            && let Ok(client) = AgentClient::new(location)
        {
            match client.shutdown().await {
                Ok(()) => shutdown_accepted = true,
                Err(error) => {
                    tracing::debug!(session_id, %error, "agent did not take the shutdown call")
                }
            }
        }
        if let Some(pid) = pid {
            stop_agent_process(pid, &root, shutdown_accepted).await;
        }
        if let Err(error) = tokio::fs::remove_dir_all(&dir).await
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(session_id, %error, "could not remove the browser directory");
        }
    }

    fn agent_exists(&self, location: &AgentLocation) -> Option<bool> {
        let root = Path::new(&location.vm_root);
        location
            .pid
            .map(|pid| is_running(pid) && is_agent_for(pid, root))
    }

    async fn wait_for_exit(&self, location: &AgentLocation) {
        // Polled, not waited for: after a restart the agent is not our child.
        while self.agent_exists(location) != Some(false) {
            tokio::time::sleep(EXIT_POLL_INTERVAL).await;
        }
    }

    fn leftover_recording(&self, session_id: &str, recording_id: &str) -> Option<PathBuf> {
        // Finished, or else still recording (or cut short while finalizing).
        let dir = self.browser_dir(session_id).join(RECORDINGS_DIR);
        [
            recording_files::finished(recording_id),
            recording_files::in_progress(recording_id),
        ]
        .into_iter()
        .map(|name| dir.join(name))
        .find(|path| path.is_file())
    }

    fn isolation(&self) -> IsolationReport {
        self.isolation.clone()
    }

    async fn reap_strays(&self, live_session_ids: &HashSet<String>) {
        let Ok(entries) = std::fs::read_dir(&self.config.browsers_dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !live_session_ids.contains(&name) {
                tracing::info!(session_id = %name, "reaping a browser no live session owns");
                self.destroy(&name, None).await;
            }
        }
    }
}

/// Stops an agent process: one that accepted the Shutdown call gets time to stop by
/// itself, any other is sent SIGTERM at once; whatever is left at the deadline is
/// SIGKILLed with its process group. The agent's own children die with it
/// (parent-death signal).
async fn stop_agent_process(pid: i64, root: &Path, shutdown_accepted: bool) {
    let group = Pid::from_raw(pid as i32);
    let started = tokio::time::Instant::now();
    let mut terminated = false;
    while is_running(pid) && is_agent_for(pid, root) {
        let waited = started.elapsed();
        if waited > STOP_TIMEOUT {
            let _ = killpg(group, Signal::SIGKILL);
            break;
        }
        if !terminated && (!shutdown_accepted || waited > STOP_TIMEOUT / 2) {
            let _ = killpg(group, Signal::SIGTERM);
            terminated = true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A leader killed on its own leaves its group behind: a recording's encoder stays
    // (to finish its file on EOF), and is reaped here.
    if let Some(browser_dir) = root.parent() {
        for member in group_members_mentioning(pid, browser_dir) {
            let _ = nix::sys::signal::kill(Pid::from_raw(member as i32), Signal::SIGKILL);
        }
    }
}

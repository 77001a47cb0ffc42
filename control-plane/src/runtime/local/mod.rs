//! The local runtime: each browser is a detached `browser-agent` process on this host with
//! its own directory `<data-dir>/browsers/<session id>/` holding the VM root, the agent's
//! log, its pid and the address it listens on. Agents run in their own process group so
//! that stopping or crashing the control plane does not take live browsers down.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use browser_agent_proto::recording_files;
use browser_agent_proto::v1::DevtoolsState;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::sync::watch;

use super::cgroups::{self, VmCgroup, VmLimits};
use super::disk;
use super::isolation::{HostCapabilities, IsolationReport, KernelLimits};
use super::processes::{is_agent_for, is_running, process_group};
use super::sandbox::{self, Sandbox};
use super::{LaunchSpec, Runtime, RuntimeError};
use crate::agent::{AgentClient, UNIX_ENDPOINT_PREFIX};
use crate::egress::{
    EgressPolicy, EgressServer, FailureLog, HostAllowlist, ProxyFailures, VmEgress,
};
use crate::ids;
use crate::proxies::ProxyRoute;
use crate::store::AgentLocation;

mod agent_args;
mod agent_process;
use agent_process::{AgentFds, log_tail, sandbox_pid, start_log_relay, stop_agent_process, walk};

#[derive(Clone, Debug)]
pub struct LocalRuntimeConfig {
    /// Where browser directories live (`<data-dir>/browsers`).
    pub browsers_dir: PathBuf,
    pub agent_binary: PathBuf,
    /// The Node.js runtime of Playwright executors, if installed.
    pub node_runtime: Option<PathBuf>,
    pub chromium: String,
    pub xvfb: String,
    pub ffmpeg: String,
    /// An agent shuts itself down after this long without hearing from a control plane.
    pub agent_idle_grace: Duration,
    /// An agent stops its VM's processes after this long idle (`None`: never).
    pub freeze_idle_after: Option<Duration>,
    pub zip_limits: ZipLimits,
    /// Where browsers run: in a sandbox each, or (development only) on the host.
    pub sandbox: Option<Sandbox>,
    /// What VMs may reach besides public addresses.
    pub egress: EgressPolicy,
    /// Largest screen a running browser can be resized to (its framebuffer's size).
    pub max_resized_viewport: crate::config::ScreenSize,
    /// What the kernel enforces per VM (sandboxed VMs only).
    pub limits: KernelLimits,
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
    /// Each live VM's egress proxy, by session id.
    egress_servers: Mutex<HashMap<String, EgressServer>>,
    proxy_failures: Arc<ProxyFailures>,
    /// VMs `cut_off` stopped, which `destroy` kills without asking their agent first.
    stopped_vms: Mutex<std::collections::HashSet<String>>,
}

const ADDRESS_TIMEOUT: Duration = Duration::from_secs(10);
const READY_TIMEOUT: Duration = Duration::from_secs(45);
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a release waits for every process of a VM to stop before its place is
/// given to another (a process in uninterruptible sleep stops only when it wakes).
const STOP_BOUND: Duration = Duration::from_secs(1);
/// How often a live agent's process is checked: a dead agent's session ends within this.
const EXIT_POLL_INTERVAL: Duration = Duration::from_millis(250);
/// The VM's `/` (`/home/kernel` inside the sandbox).
const ROOT_DIR: &str = "root";
/// Beside the root, the VM's run directory (`/run/vm` inside), with what follows.
const RUN_DIR: &str = "run";
/// Uploads wait here before extraction.
const SCRATCH_DIR: &str = "scratch";
/// Where the agent writes screen recordings.
const RECORDINGS_DIR: &str = "recordings";
/// Archives the VM starts from (extensions, the profile), copied from the blob store.
const INPUTS_DIR: &str = "inputs";
const PROFILE_FILE: &str = "profile.zip";
/// Chromium's managed policies (`chrome_policy`).
const POLICIES_DIR: &str = "policies";
/// Beside the VM's directories, on the host only (0700, ours): the sockets the control
/// plane reaches the agent on. It binds them before the sandbox starts and hands them to
/// the agent as descriptors, so nothing inside the VM can replace them or point them
/// anywhere else (a link planted in a directory the VM writes would be followed by us).
const CONTROL_DIR: &str = "control";
/// The agent's gRPC socket, in the control directory.
const SOCKET_FILE: &str = "agent.sock";
/// The egress proxy's socket: the VM's only way out.
const EGRESS_SOCKET: &str = "egress.sock";
/// Why the VM ended itself, when it did (memory limit).
const EXIT_REASON_FILE: &str = "exit-reason";
/// Most tasks (processes and threads) one sandboxed VM may run: a busy Chromium runs a few
/// hundred; a fork bomb stops here instead of at the host's limits.
const MAX_VM_TASKS: u64 = 4096;
/// The X display of a sandboxed VM's Xvfb.
const VM_DISPLAY_NUMBER: u32 = 0;
/// The memory of a VM that was given no limit (its tmpfs directories' size too).
const DEFAULT_VM_MEMORY_BYTES: u64 = 16 << 30;
/// On the host only, beside the run directory.
const PID_FILE: &str = "agent.pid";
const LOG_FILE: &str = "agent.log";

impl LocalRuntime {
    pub fn new(config: LocalRuntimeConfig) -> Self {
        let isolation = IsolationReport::local(
            HostCapabilities::detect(),
            config.sandbox.as_ref(),
            &config.limits,
        );
        Self {
            config,
            isolation,
            egress_servers: Mutex::new(HashMap::new()),
            proxy_failures: Arc::default(),
            stopped_vms: Mutex::default(),
        }
    }

    fn failure_log(&self, session_id: &str) -> Option<FailureLog> {
        Some(FailureLog {
            failures: self.proxy_failures.clone(),
            session_id: session_id.to_owned(),
        })
    }

    /// Kills the VM's agent and, with the sandbox's PID 1 in its group, every process of
    /// the VM.
    fn kill_vm(&self, session_id: &str, location: Option<&AgentLocation>) {
        let root = self.browser_dir(session_id).join(ROOT_DIR);
        if let Some(pid) = self.agent_pid(session_id, location)
            && is_running(pid)
            && is_agent_for(pid, &root)
        {
            let group = Pid::from_raw(process_group(pid).unwrap_or(pid) as i32);
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            let _ = killpg(group, Signal::SIGKILL);
        }
    }

    /// The agent's process id: as launched, or as its pid file says after a restart.
    fn agent_pid(&self, session_id: &str, location: Option<&AgentLocation>) -> Option<i64> {
        location.and_then(|l| l.pid).or_else(|| {
            std::fs::read_to_string(self.browser_dir(session_id).join(PID_FILE))
                .ok()?
                .trim()
                .parse()
                .ok()
        })
    }

    fn browser_dir(&self, session_id: &str) -> PathBuf {
        self.config.browsers_dir.join(session_id)
    }

    /// A regular file of a VM's run directory, which the VM controls: opened beneath it
    /// (no link leads out), not through a link, and without blocking on a FIFO.
    fn open_in_run_dir(&self, session_id: &str, relative: &Path) -> Option<std::fs::File> {
        use cap_std::fs::OpenOptionsExt;
        let run = self.browser_dir(session_id).join(RUN_DIR);
        let run = cap_std::fs::Dir::open_ambient_dir(run, cap_std::ambient_authority()).ok()?;
        let mut options = cap_std::fs::OpenOptions::new();
        options.read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        let file = run.open_with(relative, &options).ok()?;
        file.metadata().is_ok_and(|metadata| metadata.is_file()).then(|| file.into_std())
    }

    /// The host user and group of the VM's run directory and sockets (its agent's), when
    /// not ours.
    fn vm_owner(&self) -> Option<(u32, u32)> {
        let user = self.config.sandbox.as_ref().and_then(Sandbox::user)?;
        Some((user.uid, user.gid))
    }

    /// The host user and group of the VM's home: its tenant's, when tenant code runs
    /// apart from the agent.
    fn home_owner(&self) -> Option<(u32, u32)> {
        let sandbox = self.config.sandbox.as_ref()?;
        let user = sandbox.tenant().or(sandbox.user())?;
        Some((user.uid, user.gid))
    }

    /// The agent's directories as the agent names them: inside the sandbox, or on the host.
    fn agent_paths(&self, dir: &Path) -> (PathBuf, PathBuf) {
        match &self.config.sandbox {
            Some(_) => (PathBuf::from(sandbox::VM_HOME), PathBuf::from(sandbox::VM_RUN)),
            None => (dir.join(ROOT_DIR), dir.join(RUN_DIR)),
        }
    }

    /// Creates the VM's directories, owned by the VM's user; copies the archives it
    /// starts from into its run directory (it cannot read the data directory).
    fn prepare_dirs(
        &self, spec: &LaunchSpec, dir: &Path,
    ) -> std::io::Result<Vec<(String, String)>> {
        let (root, run) = (dir.join(ROOT_DIR), dir.join(RUN_DIR));
        for sub in [&root, &run] {
            std::fs::create_dir_all(sub)?;
        }
        for sub in [SCRATCH_DIR, RECORDINGS_DIR, INPUTS_DIR, POLICIES_DIR] {
            std::fs::create_dir_all(run.join(sub))?;
        }
        let mut inputs = Vec::new();
        for (index, (name, archive)) in spec.extensions.iter().enumerate() {
            let file = format!("extension-{index}.zip");
            std::fs::copy(archive, run.join(INPUTS_DIR).join(&file))?;
            inputs.push((name.clone(), file));
        }
        if let Some(archive) = &spec.profile_archive {
            std::fs::copy(archive, run.join(INPUTS_DIR).join(PROFILE_FILE))?;
        }
        sandbox::write_identity(&run)?;
        if let Some(policy) = &spec.chrome_policy {
            std::fs::write(run.join(POLICIES_DIR).join("policy.json"), policy.to_string())?;
        }
        // The browser's directory: traversable, so the VM's user can mount its parts.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
        // The VM's root and run directory are its user's alone. What the VM only reads
        // (its policies and identity) stays ours: mounted read-only at start, it cannot
        // be changed from inside.
        let read_only = [run.join(POLICIES_DIR), run.join(sandbox::IDENTITY_DIR)];
        for path in walk(&run)?.into_iter().chain([root.clone()]) {
            let ours = read_only.iter().any(|dir| path.starts_with(dir));
            let mode = match (path.is_dir(), ours) {
                (true, true) => 0o755,
                (false, true) => 0o644,
                (true, false) => 0o700,
                (false, false) => 0o600,
            };
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
            let owner = if path == root { self.home_owner() } else { self.vm_owner() };
            if let Some((uid, gid)) = owner
                && !ours
            {
                std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
            }
        }
        Ok(inputs)
    }

    async fn spawn_agent(
        &self, spec: &LaunchSpec, dir: &Path,
    ) -> Result<(AgentLocation, watch::Receiver<Option<String>>), RuntimeError> {
        let (root, run) = (dir.join(ROOT_DIR), dir.join(RUN_DIR));
        let sandboxed = self.config.sandbox.is_some();
        if let (true, Ok(disks)) = (sandboxed, &self.config.limits.disks) {
            std::fs::create_dir_all(dir)?;
            disks.create(dir, &root).await?;
        }
        let inputs = self.prepare_dirs(spec, dir)?;
        let memory_bytes = spec.memory_limit_bytes.unwrap_or(DEFAULT_VM_MEMORY_BYTES);
        let cgroup = match (sandboxed, &self.config.limits.cgroups) {
            (true, Ok(cgroups)) => Some(cgroups.create(
                &spec.session_id,
                VmLimits {
                    memory_bytes,
                    max_tasks: MAX_VM_TASKS,
                    cpu_weight: self.config.limits.cpu_weight,
                },
                Some(dir),
                spec.background,
            )?),
            _ => None,
        };
        let owner = self.vm_owner();
        let egress = EgressServer::start(
            &run.join(EGRESS_SOCKET),
            owner,
            self.config.egress.clone(),
            spec.egress.clone(),
            self.failure_log(&spec.session_id),
        )?;
        let secret = ids::new_secret(43);
        let control = dir.join(CONTROL_DIR);
        let fds = AgentFds::new(&control, &secret)?;
        let args = self.agent_args(spec, &inputs, dir, &fds);
        let log = start_log_relay(std::fs::File::create(dir.join(LOG_FILE))?, self.vm_owner())?;
        let (mut command, info) = match &self.config.sandbox {
            Some(sandbox) => {
                let pipe = || {
                    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)
                };
                let (info_read, info_write) = pipe()?;
                let (block_read, block_write) = pipe()?;
                let command = sandbox.command(
                    (&self.config.agent_binary, self.config.node_runtime.as_deref()),
                    args,
                    (&root, &run),
                    memory_bytes,
                    (&info_write, &block_read),
                );
                let userns = (block_read, block_write);
                (command, Some((info_read, info_write, userns, sandbox)))
            }
            None => {
                let mut command = tokio::process::Command::new(&self.config.agent_binary);
                // Nothing of the service's environment (database URLs, keys) reaches it.
                command
                    .args(args)
                    .env_clear()
                    .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                    .env("HOME", &root)
                    .env("LANG", "C.UTF-8");
                if let Some(filter) = std::env::var_os("RUST_LOG") {
                    command.env("RUST_LOG", filter);
                }
                (command, None)
            }
        };
        fds.pass_to(&mut command);
        // The sandbox's first process enters the VM's group before it starts anything.
        let entry_points = match &cgroup {
            Some(group) => group.entry_points()?,
            None => Vec::new(),
        };
        let raw_entry_points = cgroups::raw(&entry_points);
        // SAFETY: `enter` only writes to descriptors this process holds.
        unsafe {
            command.pre_exec(move || cgroups::enter(&raw_entry_points));
        }
        command
            .env("BROWSER_AGENT_CHROMIUM", &self.config.chromium)
            .env("BROWSER_AGENT_XVFB", &self.config.xvfb)
            .env("BROWSER_AGENT_FFMPEG", &self.config.ffmpeg)
            .stdin(Stdio::null())
            .stdout(std::fs::File::from(log.try_clone()?))
            .stderr(std::fs::File::from(log));
        // A session of its own: a Ctrl-C or crash of the control plane does not reach
        // live browsers, and no VM process has a controlling terminal (through which it
        // could type into the operator's shell).
        // SAFETY: setsid is async-signal-safe and changes only the child.
        unsafe {
            command.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(|error| {
            RuntimeError::LaunchFailed(format!("starting the browser agent failed: {error}"))
        })?;
        // The agent holds the sockets now; ours would keep them open after it dies.
        drop((fds, entry_points));
        // The process that stands for the VM: the sandbox's PID 1 (all of the VM dies
        // with it), or the agent itself.
        let (pid, mapped) = match info {
            Some((info_read, info_write, (block_read, block_write), sandbox)) => {
                drop((info_write, block_read));
                let pid = sandbox_pid(info_read).await;
                // The sandbox waits for its users before it goes on.
                let mapped = match pid {
                    Some(pid) => sandbox
                        .map_users(pid)
                        .and_then(|()| std::fs::File::from(block_write).write_all(b"1")),
                    None => Ok(()),
                };
                (pid, mapped)
            }
            None => (child.id().map(i64::from), Ok(())),
        };
        let recorded = match (pid, mapped) {
            (Some(pid), Ok(())) => std::fs::write(dir.join(PID_FILE), pid.to_string()),
            (Some(_), Err(error)) => {
                Err(std::io::Error::other(format!("mapping the VM's users failed: {error}")))
            }
            (None, _) => {
                Err(std::io::Error::other(format!("the sandbox did not start: {}", log_tail(dir))))
            }
        };
        if let Err(error) = recorded {
            // Without its pid on record the VM could not be found again: stop it now,
            // with its sandbox's PID 1 (in the session the child leads).
            if let Some(leader) = child.id() {
                let _ = killpg(Pid::from_raw(leader as i32), Signal::SIGKILL);
            }
            let _ = child.wait().await;
            return Err(error.into());
        }
        if let Ok(mut servers) = self.egress_servers.lock() {
            servers.insert(spec.session_id.clone(), egress);
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
            endpoint: format!("{UNIX_ENDPOINT_PREFIX}{}", control.join(SOCKET_FILE).display()),
            secret,
            pid,
            vm_root: root.display().to_string(),
        };
        Ok((location, exited))
    }
}

#[async_trait]
impl Runtime for LocalRuntime {
    async fn launch(&self, spec: &LaunchSpec) -> Result<AgentLocation, RuntimeError> {
        let dir = self.browser_dir(&spec.session_id);
        let (location, exited) = match self.spawn_agent(spec, &dir).await {
            Ok(spawned) => spawned,
            Err(error) => {
                // Nothing half-made stays: the directory with its copied archives goes.
                self.destroy(&spec.session_id, None).await;
                return Err(error);
            }
        };
        let mut exited = exited;
        if spec.background {
            // On a host kept busy by browsers in use, an idle start could wait past its
            // deadline and be started again and again: a late one gets its weight.
            self.promote_after(&spec.session_id, super::BACKGROUND_START_LIMIT);
        }
        let outcome = async {
            let client = AgentClient::new(&location)
                .map_err(|error| RuntimeError::LaunchFailed(error.to_string()))?;
            // The socket listens from the start: the call waits for the agent to serve.
            let status = tokio::select! {
                status = client.wait_until_ready(READY_TIMEOUT) => status
                    .map_err(|error| RuntimeError::LaunchFailed(error.to_string()))?,
                Ok(status) = exited.wait_for(Option::is_some) => {
                    return Err(RuntimeError::LaunchFailed(format!(
                        "the browser agent exited ({}): {}",
                        status.clone().unwrap_or_default(),
                        log_tail(&dir)
                    )));
                }
            };
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
            Ok(()) if spec.background => {
                self.promote_after(&spec.session_id, super::BACKGROUND_START_SETTLE);
                Ok(location)
            }
            Ok(()) => Ok(location),
            Err(error) => {
                tracing::warn!(session_id = %spec.session_id, %error, "launch failed; reaping");
                self.destroy(&spec.session_id, Some(&location)).await;
                Err(error)
            }
        }
    }

    async fn destroy(&self, session_id: &str, location: Option<&AgentLocation>) {
        if let Ok(mut servers) = self.egress_servers.lock() {
            servers.remove(session_id);
        }
        let dir = self.browser_dir(session_id);
        let root = dir.join(ROOT_DIR);
        let pid = self.agent_pid(session_id, location);
        let mut shutdown_accepted = false;
        let stopped =
            self.stopped_vms.lock().map(|mut stopped| stopped.remove(session_id)).unwrap_or(false);
        if stopped {
            // Its agent cannot answer: no shutdown call. Its place went to another VM when
            // it was stopped, so nothing of it may run again: every process but the
            // sandbox's own two (bubblewrap, which the pid file's process is the group
            // of, and that process, the VM's PID 1) is killed while still stopped. Those
            // two are continued before their kill, so that each reaps its children as
            // they die: a stopped parent would leave them as zombies to the host's init.
            if let Some(group) = VmCgroup::noted(&dir) {
                let sandbox: Vec<i32> = pid
                    .into_iter()
                    .flat_map(|pid| [pid, process_group(pid).unwrap_or(pid)])
                    .filter_map(|pid| i32::try_from(pid).ok())
                    .collect();
                group.signal_all_but(Signal::SIGKILL, &sandbox);
                group.signal_all(Signal::SIGCONT);
            }
            self.kill_vm(session_id, location);
        } else if let Some(location) = location.filter(|l| !l.endpoint.is_empty())
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
        if let Some(group) = VmCgroup::noted(&dir) {
            group.remove().await;
        }
        disk::remove(&dir, &root);
        if let Err(error) = tokio::fs::remove_dir_all(&dir).await
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(session_id, %error, "could not remove the browser directory");
        }
    }

    async fn cut_off(&self, session_id: &str, location: Option<&AgentLocation>) -> bool {
        // Every process of the VM stopped: from now on it does nothing and answers no one,
        // and its place on the host may go to another VM. The kill (`destroy`) follows in
        // the background, so that the kernel's teardown of the VM's memory does not
        // compete with answering the caller.
        let dir = self.browser_dir(session_id);
        if let Some(group) = VmCgroup::noted(&dir)
            && group.stop_all(STOP_BOUND).await > 0
        {
            if let Ok(mut stopped) = self.stopped_vms.lock() {
                stopped.insert(session_id.to_owned());
            }
            return true;
        }
        self.kill_vm(session_id, location);
        // Killed now, or not running at all: either way nothing reaches it any more.
        true
    }

    fn agent_exists(&self, location: &AgentLocation) -> Option<bool> {
        let root = Path::new(&location.vm_root);
        location.pid.map(|pid| is_running(pid) && is_agent_for(pid, root))
    }

    async fn wait_for_exit(&self, location: &AgentLocation) {
        let root = Path::new(&location.vm_root);
        let group = root.parent().and_then(VmCgroup::noted);
        // Polled, not waited for: after a restart the agent is not our child.
        while self.agent_exists(location) != Some(false) {
            // The kernel killed a process of the VM for its memory: the VM, which may
            // hold that memory in files no kill frees, ends whole (`exit_reason` says why).
            if group.as_ref().is_some_and(VmCgroup::out_of_memory)
                && let Some(pid) = location.pid
            {
                tracing::info!(vm_root = %root.display(), "a VM went over its memory limit; ending it");
                stop_agent_process(pid, root, false).await;
            }
            tokio::time::sleep(EXIT_POLL_INTERVAL).await;
        }
    }

    fn leftover_recording(&self, session_id: &str, recording_id: &str) -> Option<std::fs::File> {
        // Finished, or else still recording (or cut short while finalizing).
        [recording_files::finished(recording_id), recording_files::in_progress(recording_id)]
            .into_iter()
            .find_map(|name| {
                self.open_in_run_dir(session_id, &Path::new(RECORDINGS_DIR).join(name))
            })
    }

    fn isolation(&self) -> IsolationReport {
        self.isolation.clone()
    }

    fn exit_reason(&self, session_id: &str) -> Option<String> {
        // The kernel's word first: the VM cannot forge it.
        if let Some(group) = VmCgroup::noted(&self.browser_dir(session_id))
            && group.out_of_memory()
        {
            let limit = group.memory_limit().unwrap_or(0) >> 20;
            return Some(format!(
                "the browser used more memory than its limit ({limit} MiB): the kernel ended it"
            ));
        }
        let file = self.open_in_run_dir(session_id, Path::new(EXIT_REASON_FILE))?;
        let mut reason = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(file, 4096), &mut reason).ok()?;
        // Written by the VM: keep it short and printable.
        let reason: String = reason.chars().filter(|c| !c.is_control()).take(300).collect();
        (!reason.is_empty()).then_some(reason)
    }

    fn reattach(&self, session_id: &str, egress: VmEgress) -> Result<(), RuntimeError> {
        let run = self.browser_dir(session_id).join(RUN_DIR);
        let owner = self.vm_owner();
        // A server this process still has goes first: its end forgets the session's
        // noted failures, which must not take the new server's with them.
        if let Ok(mut servers) = self.egress_servers.lock() {
            servers.remove(session_id);
        }
        let server = EgressServer::start(
            &run.join(EGRESS_SOCKET),
            owner,
            self.config.egress.clone(),
            egress,
            self.failure_log(session_id),
        )?;
        if let Ok(mut servers) = self.egress_servers.lock() {
            servers.insert(session_id.to_owned(), server);
        }
        // Its settle timer ended with the process that started it.
        self.promote(session_id);
        Ok(())
    }

    fn proxy_failures(&self) -> Arc<ProxyFailures> {
        self.proxy_failures.clone()
    }

    fn forget(&self, session_id: &str) {
        if let Ok(mut servers) = self.egress_servers.lock() {
            servers.remove(session_id);
        }
    }

    fn promote(&self, session_id: &str) {
        self.promote_after(session_id, Duration::ZERO);
    }

    fn set_allowed_hosts(&self, session_id: &str, allowed_hosts: Option<HostAllowlist>) {
        if let Ok(servers) = self.egress_servers.lock()
            && let Some(server) = servers.get(session_id)
        {
            server.set_allowed_hosts(allowed_hosts);
        }
    }

    fn set_upstream(&self, session_id: &str, upstream: Option<ProxyRoute>) {
        if let Ok(servers) = self.egress_servers.lock()
            && let Some(server) = servers.get(session_id)
        {
            server.set_upstream(upstream);
        }
    }

    async fn reap_strays(&self, live_session_ids: &HashSet<String>, spare_younger_than: Duration) {
        let Ok(entries) = std::fs::read_dir(&self.config.browsers_dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let young = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|modified| modified.elapsed().ok())
                .is_some_and(|age| age < spare_younger_than);
            if !live_session_ids.contains(&name) && !young {
                tracing::info!(session_id = %name, "reaping a browser no live session owns");
                self.destroy(&name, None).await;
            }
        }
    }
}

impl LocalRuntime {
    /// Ends the idle priority of the session's VM (`VmCgroup::promote`) `delay` from now,
    /// in the background; nothing if it has no group of ours by then.
    fn promote_after(&self, session_id: &str, delay: Duration) {
        let (dir, weight) = (self.browser_dir(session_id), self.config.limits.cpu_weight);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let Some(group) = VmCgroup::noted(&dir) else {
                return;
            };
            match tokio::task::spawn_blocking(move || group.promote(weight)).await {
                Ok(Err(error)) => {
                    tracing::warn!(%error, dir = %dir.display(), "could not end a VM's idle priority")
                }
                Err(error) => tracing::warn!(%error, "could not end a VM's idle priority"),
                Ok(Ok(())) => {}
            }
        });
    }
}

//! Runs one program in an app sandbox (`runtime::sandbox::Sandbox::app_command`): a
//! deployment's build, or an invocation's action. Each run has a directory of its own on
//! the host (the sandbox's `/run/app`) with its egress socket, the files the caller puts
//! there (scripts, payload) and the result file the program writes; it is removed when
//! the run ends. Output is passed on line by line; the run is killed, with every process
//! in its PID namespace, on timeout or cancellation.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::egress::{EgressPolicy, EgressServer, HostAllowlist, VmEgress};
use crate::ids;
use crate::runtime::Sandbox;
use crate::runtime::cgroups::{VmCgroup, VmLimits};
use crate::runtime::sandbox::{
    APP_EGRESS_SOCKET, APP_ENV_FILE, APP_EXIT_REASON_FILE, AppLimits, AppMounts, VmUser,
    write_identity,
};

/// The file a run's program writes its result to, in its run directory.
pub const RESULT_FILE: &str = "result.json";
/// Largest result file read back.
pub const MAX_RESULT_BYTES: u64 = 2 * 1024 * 1024;
/// Longest output line passed on; the rest of a longer line is dropped.
const MAX_LINE_BYTES: usize = 16 * 1024;
/// What one run may use: its memory-backed `/tmp` and `/dev/shm` (each), its memory in
/// all (those included), and its processes and threads.
const RUN_LIMITS: AppLimits =
    AppLimits { tmpfs_bytes: 512 << 20, memory_bytes: MEMORY_LIMIT_MIB << 20, max_tasks: 1024 };
/// The memory limit of one run, in MiB.
pub const MEMORY_LIMIT_MIB: u64 = 2048;

/// Where app sandboxes start from, and how they reach out.
pub struct AppRunner {
    pub sandbox: Sandbox,
    /// The agent binary the VM user can start (it opens the sandbox's ways out).
    pub agent_binary: PathBuf,
    /// The service's Node.js runtime, whose `typescript` compiles TypeScript apps.
    pub node_runtime: Option<PathBuf>,
    /// Runs' directories live in `<apps_dir>/runs`.
    pub apps_dir: PathBuf,
    /// The control plane's API, as app sandboxes reach it.
    pub api_socket: PathBuf,
    /// The loopback port the API is reached on inside.
    pub api_port: u16,
    pub egress: EgressPolicy,
    /// A control group per run holds it to its memory (memfds and tmpfs included) and
    /// tasks, where the host has them; otherwise its starter measures them.
    pub cgroups: Option<crate::runtime::cgroups::VmCgroups>,
    pub cpu_weight: u64,
}

/// One program to run.
pub struct Run<'a> {
    pub app_dir: &'a Path,
    pub app_writable: bool,
    pub cache: Option<&'a Path>,
    /// A path inside the sandbox, and its arguments.
    pub program: (&'a str, Vec<OsString>),
    /// The program's whole environment (the proxy variables are added inside).
    pub env: Vec<(String, String)>,
    /// Files written into the run directory before the program starts.
    pub files: Vec<(&'static str, Vec<u8>)>,
    pub timeout: Duration,
    pub cancel: CancellationToken,
    /// When set, the only hosts the program may reach (besides the API).
    pub allowed_hosts: Option<HostAllowlist>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    Exited(i32),
    /// Ended past its memory limit.
    OutOfMemory,
    TimedOut,
    Cancelled,
    /// The sandbox could not be set up or started (the reason is for the operator's log;
    /// callers tell users something generic).
    NotStarted(String),
}

pub struct Outcome {
    pub ended: Ended,
    /// What the program wrote to its result file, if anything (at most
    /// `MAX_RESULT_BYTES`; `Err` when it was larger or not a plain file).
    pub result: Option<Result<Vec<u8>, String>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl AppRunner {
    pub fn vm_user(&self) -> Option<VmUser> {
        self.sandbox.user()
    }

    /// Runs the program to its end; its output lines go to `output` as they come (a
    /// full channel slows the program down rather than losing lines).
    pub async fn run(&self, run: Run<'_>, output: mpsc::Sender<(Stream, String)>) -> Outcome {
        let dir = self.apps_dir.join("runs").join(ids::random_lowercase(20));
        let outcome = match self.prepare(&dir, &run) {
            Ok(egress) => {
                let ended = self.start_and_wait(&dir, &run, output).await;
                drop(egress);
                Outcome { ended, result: read_result(&dir.join(RESULT_FILE)) }
            }
            Err(error) => Outcome {
                ended: Ended::NotStarted(format!("preparing the run: {error}")),
                result: None,
            },
        };
        if let Err(error) = std::fs::remove_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), %error, "could not remove an app run's directory");
        }
        outcome
    }

    /// The run directory, owned by the VM user, with its identity files, the caller's
    /// files and the egress socket (served while the returned server lives).
    fn prepare(&self, dir: &Path, run: &Run<'_>) -> std::io::Result<EgressServer> {
        if let Some(parent) = dir.parent() {
            traversable_dir(parent)?;
        }
        std::fs::create_dir(dir)?;
        write_identity(dir)?;
        for (name, contents) in &run.files {
            std::fs::write(dir.join(name), contents)?;
        }
        let environment = serde_json::to_vec(&run.env).map_err(std::io::Error::other)?;
        std::fs::write(dir.join(APP_ENV_FILE), environment)?;
        let owner = self.vm_user().map(|user| (user.uid, user.gid));
        if let Some(owner) = owner {
            super::source::chown_tree(dir, owner)?;
        }
        EgressServer::start(
            &dir.join(APP_EGRESS_SOCKET),
            owner,
            self.egress.clone(),
            VmEgress { upstream: None, allowed_hosts: run.allowed_hosts.clone() },
            None,
        )
    }

    async fn start_and_wait(
        &self, dir: &Path, run: &Run<'_>, output: mpsc::Sender<(Stream, String)>,
    ) -> Ended {
        // Ended before it started: nothing is started that would have to be killed.
        if run.cancel.is_cancelled() {
            return Ended::Cancelled;
        }
        let (info_read, info_write) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
            Ok(pipe) => pipe,
            Err(error) => return Ended::NotStarted(format!("pipe: {error}")),
        };
        let mut command = self.sandbox.app_command(
            &self.agent_binary,
            AppMounts {
                app: run.app_dir,
                app_writable: run.app_writable,
                run: dir,
                api_socket: &self.api_socket,
                api_port: self.api_port,
                cache: run.cache,
                node_runtime: self.node_runtime.as_deref(),
            },
            RUN_LIMITS,
            &info_write,
            (run.program.0, run.program.1.clone()),
        );
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let group = match self.enter_group(dir, &mut command) {
            Ok(group) => group,
            Err(error) => return Ended::NotStarted(format!("its control group: {error}")),
        };
        // A session of its own: nothing of it has the operator's terminal.
        // SAFETY: setsid is async-signal-safe and changes only the child.
        unsafe {
            command.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => return Ended::NotStarted(format!("starting bubblewrap: {error}")),
        };
        drop(info_write);
        let readers = [
            child.stdout.take().map(|out| pass_lines(out, Stream::Stdout, output.clone())),
            child.stderr.take().map(|err| pass_lines(err, Stream::Stderr, output)),
        ];
        let sandbox_pid = tokio::task::spawn_blocking(move || {
            let mut info = String::new();
            std::fs::File::from(info_read).read_to_string(&mut info).ok()?;
            crate::runtime::sandbox::child_pid(&info)
        });
        let ended = tokio::select! {
            status = child.wait() => match status {
                Ok(status) => Ended::Exited(status.code().unwrap_or_else(|| {
                    128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
                })),
                Err(error) => Ended::NotStarted(format!("waiting for the sandbox: {error}")),
            },
            () = tokio::time::sleep(run.timeout) => Ended::TimedOut,
            () = run.cancel.cancelled() => Ended::Cancelled,
        };
        if matches!(ended, Ended::TimedOut | Ended::Cancelled) {
            // Bubblewrap's death kills the sandbox's PID 1 (--die-with-parent), which
            // takes its whole PID namespace with it; PID 1 is also killed directly.
            let _ = child.start_kill();
            if let Ok(Ok(Some(pid))) =
                tokio::time::timeout(Duration::from_secs(2), sandbox_pid).await
            {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
            // A process bubblewrap forked just as it was killed has no parent-death
            // signal yet, and no pid we were told: its control group still holds it.
            if let Some(group) = &group {
                group.kill_remaining();
            }
            let _ = child.wait().await;
        }
        // The output read to its end (the pipes close with the last process); a reader
        // still waiting then is given up.
        for reader in readers.into_iter().flatten() {
            let abort = reader.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), reader).await.is_err() {
                abort.abort();
            }
        }
        let out_of_memory = std::fs::symlink_metadata(dir.join(APP_EXIT_REASON_FILE)).is_ok()
            || group.as_ref().is_some_and(VmCgroup::out_of_memory);
        if let Some(group) = group {
            // Its processes may take a moment to go; the run has ended all the same.
            tokio::spawn(async move { group.remove().await });
        }
        match ended {
            Ended::Exited(_) if out_of_memory => Ended::OutOfMemory,
            other => other,
        }
    }
}

impl AppRunner {
    /// The run's control group (`None` where the host has none), which `command`'s
    /// process enters before it starts anything.
    fn enter_group(
        &self, dir: &Path, command: &mut tokio::process::Command,
    ) -> std::io::Result<Option<VmCgroup>> {
        let Some(cgroups) = &self.cgroups else {
            return Ok(None);
        };
        let name = format!("app-{}", dir.file_name().unwrap_or_default().to_string_lossy());
        let limits = VmLimits {
            memory_bytes: RUN_LIMITS.memory_bytes,
            max_tasks: RUN_LIMITS.max_tasks,
            cpu_weight: self.cpu_weight,
        };
        let group = cgroups.create(&name, limits, None, false)?;
        let entry_points = match group.entry_points() {
            Ok(entry_points) => entry_points,
            Err(error) => {
                tokio::spawn(async move { group.remove().await });
                return Err(error);
            }
        };
        let raw = crate::runtime::cgroups::raw(&entry_points);
        // SAFETY: `enter` only writes to descriptors the closure keeps open.
        unsafe {
            command.pre_exec(move || {
                let _open = &entry_points;
                crate::runtime::cgroups::enter(&raw)
            });
        }
        Ok(Some(group))
    }
}

/// Creates `dir` (and its parent) so that the VM user may pass through both, but not
/// list them: bubblewrap reaches what it mounts as that user. (Directories in the apps
/// directory are at most two levels deep.)
pub fn traversable_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for level in [dir.parent(), Some(dir)].into_iter().flatten() {
        std::fs::set_permissions(level, std::os::unix::fs::PermissionsExt::from_mode(0o711))?;
    }
    Ok(())
}

/// Passes `source`'s lines on (lossily decoded, cut at `MAX_LINE_BYTES`).
fn pass_lines(
    source: impl AsyncRead + Unpin + Send + 'static, stream: Stream,
    output: mpsc::Sender<(Stream, String)>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut reader = BufReader::new(source);
        let mut line = Vec::new();
        loop {
            line.clear();
            match read_line_capped(&mut reader, &mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line);
                    let text = text.trim_end_matches(['\n', '\r']).to_owned();
                    if output.send((stream, text)).await.is_err() {
                        // Nobody listens: keep reading so the program is not blocked.
                        continue;
                    }
                }
            }
        }
    })
}

/// Reads up to and including the next newline, keeping at most `MAX_LINE_BYTES`.
async fn read_line_capped(
    reader: &mut BufReader<impl AsyncRead + Unpin>, line: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let buffer = reader.fill_buf().await?;
        if buffer.is_empty() {
            return Ok(total);
        }
        let (taken, done) = match buffer.iter().position(|&byte| byte == b'\n') {
            Some(end) => (end + 1, true),
            None => (buffer.len(), false),
        };
        let room = MAX_LINE_BYTES.saturating_sub(line.len());
        line.extend_from_slice(&buffer[..taken.min(room)]);
        reader.consume(taken);
        total += taken;
        if done {
            return Ok(total);
        }
    }
}

/// The result file, if the program wrote one: never through a link it may have put there
/// (this process may read what the VM user cannot), and at most `MAX_RESULT_BYTES`.
fn read_result(path: &Path) -> Option<Result<Vec<u8>, String>> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(_) => return Some(Err("the result is not a plain file".into())),
    };
    match file.metadata() {
        Ok(metadata) if metadata.is_file() => {}
        _ => return Some(Err("the result is not a plain file".into())),
    }
    let mut contents = Vec::new();
    if file.take(MAX_RESULT_BYTES + 1).read_to_end(&mut contents).is_err() {
        return Some(Err("the result could not be read".into()));
    }
    if contents.len() as u64 > MAX_RESULT_BYTES {
        return Some(Err(format!("the result is larger than {} MiB", MAX_RESULT_BYTES >> 20)));
    }
    Some(Ok(contents))
}

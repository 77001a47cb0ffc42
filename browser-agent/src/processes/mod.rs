//! Commands run in the VM on request (`/browsers/{id}/process/*`): each in a process
//! group of its own that dies with the agent, with a clean environment (the VM's home,
//! display and egress proxy, never the agent's own variables), bounded in number, time
//! and kept output. `as_root` runs the command in a nested user namespace that maps root
//! to the VM's user (`unshare --map-root-user`): root there, and only there.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::process::GroupLeader;

mod spawned;

pub use spawned::{OutputEvent, SpawnOptions, Spawned};

/// Processes of one VM running at once (exec and spawn together).
pub const MAX_RUNNING: usize = 32;
/// Output of one stream kept for an exec's answer; the rest is read and dropped, so the
/// command never blocks on a full pipe.
pub const MAX_EXEC_OUTPUT: usize = 1024 * 1024;
/// Default and longest `timeout_sec`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// The exit code of a command killed for its timeout (a shell's 128 + SIGKILL).
pub const TIMED_OUT_EXIT_CODE: i32 = 137;

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("{0}")]
    Invalid(String),
    #[error("{MAX_RUNNING} processes already run in this browser")]
    TooMany,
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Failed(String),
}

/// What to run, as the API describes it.
#[derive(Debug, Default)]
pub struct ProcessSpec {
    /// A program (name or path) run with `args`, or, without `args`, a shell command
    /// line when it has spaces or shell syntax.
    pub command: String,
    pub args: Vec<String>,
    /// Absolute; the VM's home when empty.
    pub cwd: String,
    pub env: BTreeMap<String, String>,
    pub as_root: bool,
    /// Zero for the default.
    pub timeout_sec: u32,
}

pub struct ExecResult {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub duration: Duration,
    pub timed_out: bool,
}

pub struct Processes {
    home: PathBuf,
    display: Option<String>,
    /// The forwarder to the VM's egress (`http://127.0.0.1:port`), for tools that honour
    /// `HTTP(S)_PROXY`.
    proxy: Option<String>,
    running: Arc<AtomicUsize>,
    /// Spawned processes by id, the ended ones for a while.
    spawned: std::sync::Mutex<std::collections::HashMap<String, Arc<Spawned>>>,
    next_id: std::sync::atomic::AtomicU64,
}

/// Counts a running process until dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Processes {
    pub fn new(home: PathBuf, display: Option<String>, proxy: Option<String>) -> Self {
        Self {
            home,
            display,
            proxy,
            running: Arc::default(),
            spawned: std::sync::Mutex::default(),
            next_id: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// How many commands run now (exec and spawn together).
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    fn lock_spawned(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Arc<Spawned>>> {
        self.spawned.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Unique in this VM; ids are looked up within their browser only.
    fn next_id(&self) -> String {
        format!("proc_{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    fn slot(&self) -> Result<Slot, ProcessError> {
        let taken = self.running.fetch_update(Ordering::AcqRel, Ordering::Acquire, |running| {
            (running < MAX_RUNNING).then_some(running + 1)
        });
        match taken {
            Ok(_) => Ok(Slot(self.running.clone())),
            Err(_) => Err(ProcessError::TooMany),
        }
    }

    /// The command line and environment of `spec`, checked.
    fn command(&self, spec: &ProcessSpec) -> Result<std::process::Command, ProcessError> {
        let invalid = |message: String| Err(ProcessError::Invalid(message));
        if spec.command.trim().is_empty() {
            return invalid("command must not be empty".into());
        }
        if spec.command.contains('\0') || spec.args.iter().any(|arg| arg.contains('\0')) {
            return invalid("command and args must not contain NUL characters".into());
        }
        for (key, value) in &spec.env {
            if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
                return invalid(format!(
                    "env: {key:?} is not a variable name (no `=` or NUL) with a value without NUL"
                ));
            }
        }
        let cwd = if spec.cwd.is_empty() { self.home.clone() } else { PathBuf::from(&spec.cwd) };
        if !cwd.is_absolute() || !cwd.is_dir() {
            return invalid(format!(
                "cwd: {} is not an existing absolute directory",
                cwd.display()
            ));
        }
        // A command line with spaces or shell syntax, and no args, runs in a shell.
        let mut line: Vec<&str> = if spec.args.is_empty() && is_shell_line(&spec.command) {
            vec!["/bin/sh", "-c", &spec.command]
        } else {
            std::iter::once(spec.command.as_str())
                .chain(spec.args.iter().map(String::as_str))
                .collect()
        };
        if spec.as_root {
            line.splice(0..0, ["unshare", "--map-root-user", "--"]);
        }
        let mut command = self.in_vm_environment(line[0], spec.as_root);
        command.args(&line[1..]).current_dir(&cwd).envs(&spec.env);
        Ok(command)
    }

    /// `program` with the VM's environment and nothing of the agent's: its home,
    /// display, and egress proxy; started in the VM's home, as the tenant.
    pub fn in_vm_environment(&self, program: &str, as_root: bool) -> std::process::Command {
        let mut command = std::process::Command::new(program);
        crate::identity::as_tenant(&mut command);
        command.current_dir(&self.home).env_clear();
        command
            .env("HOME", &self.home)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("LANG", "C.UTF-8")
            .env("USER", if as_root { "root" } else { "kernel" });
        if let Some(display) = &self.display {
            command.env("DISPLAY", display);
        }
        if let Some(proxy) = &self.proxy {
            for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                command.env(name, proxy);
            }
            // No NO_PROXY: like Chromium (`<-loopback>`), tools reach even loopback
            // addresses the way out, so what they can reach is what the browser can.
        }
        command
    }

    /// Runs the command to its end (or its timeout, which kills its whole group) and
    /// answers its exit code and output.
    pub async fn exec(&self, spec: ProcessSpec) -> Result<ExecResult, ProcessError> {
        let timeout = timeout_of(spec.timeout_sec)?;
        let mut command = self.command(&spec)?;
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let _slot = self.slot()?;
        let started = Instant::now();
        let mut child = GroupLeader::spawn(command).map_err(|error| spawn_failed(&spec, &error))?;
        let (Some(stdout), Some(stderr)) = (child.child.stdout.take(), child.child.stderr.take())
        else {
            child.terminate(Duration::ZERO).await;
            return Err(ProcessError::Failed("the command's output pipes are missing".into()));
        };
        let run = async {
            let (stdout, stderr, status) =
                tokio::join!(bounded(stdout), bounded(stderr), child.wait());
            (stdout, stderr, status)
        };
        match tokio::time::timeout(timeout, run).await {
            Ok((stdout, stderr, status)) => {
                let status = status.map_err(|error| ProcessError::Failed(error.to_string()))?;
                // Whatever it left running in its group goes with it.
                child.terminate(Duration::ZERO).await;
                Ok(ExecResult {
                    exit_code: exit_code(status),
                    stdout,
                    stderr,
                    duration: started.elapsed(),
                    timed_out: false,
                })
            }
            Err(_) => {
                child.terminate(Duration::ZERO).await;
                Ok(ExecResult {
                    exit_code: TIMED_OUT_EXIT_CODE,
                    stdout: Vec::new(),
                    stderr: format!("killed after its timeout of {} s\n", timeout.as_secs())
                        .into_bytes(),
                    duration: started.elapsed(),
                    timed_out: true,
                })
            }
        }
    }
}

/// Whether a command is a shell command line rather than a program's name or path.
fn is_shell_line(command: &str) -> bool {
    command.chars().any(|c| c.is_whitespace() || ";&|<>()$`\\\"'*?[]#~={}!".contains(c))
}

fn timeout_of(seconds: u32) -> Result<Duration, ProcessError> {
    match seconds {
        0 => Ok(DEFAULT_TIMEOUT),
        seconds if u64::from(seconds) <= MAX_TIMEOUT.as_secs() => {
            Ok(Duration::from_secs(seconds.into()))
        }
        seconds => Err(ProcessError::Invalid(format!(
            "timeout_sec must be between 1 and {}, got {seconds}",
            MAX_TIMEOUT.as_secs()
        ))),
    }
}

/// A missing program or directory is the caller's mistake; anything else is ours.
fn spawn_failed(spec: &ProcessSpec, error: &std::io::Error) -> ProcessError {
    match error.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
            ProcessError::Invalid(format!("cannot run {:?}: {error}", spec.command))
        }
        _ => ProcessError::Failed(format!("starting {:?} failed: {error}", spec.command)),
    }
}

/// The exit code, or 128 + the signal that ended it, as shells report it.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|signal| 128 + signal)).unwrap_or(-1)
}

/// Everything the stream carries, of which the first `MAX_EXEC_OUTPUT` bytes are kept.
async fn bounded(mut stream: impl AsyncRead + Unpin) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return kept,
            Ok(read) => {
                let room = MAX_EXEC_OUTPUT.saturating_sub(kept.len());
                kept.extend_from_slice(&buffer[..read.min(room)]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn processes() -> Processes {
        Processes::new(std::env::temp_dir(), None, Some("http://127.0.0.1:9".into()))
    }

    fn run(command: &str) -> ProcessSpec {
        ProcessSpec { command: command.into(), ..ProcessSpec::default() }
    }

    #[tokio::test]
    async fn exec_answers_exit_code_output_and_a_clean_environment() {
        let processes = processes();
        let result = processes
            .exec(ProcessSpec {
                env: [("GREETING".to_owned(), "hi".to_owned())].into(),
                ..run("echo $GREETING; echo oops >&2; env | sort; exit 3")
            })
            .await
            .expect("exec");
        assert_eq!(result.exit_code, 3);
        let stdout = String::from_utf8_lossy(&result.stdout);
        assert!(stdout.starts_with("hi\n"), "{stdout}");
        assert!(stdout.contains("HTTPS_PROXY=http://127.0.0.1:9"), "{stdout}");
        assert!(!stdout.contains("CARGO"), "the agent's environment stays out: {stdout}");
        assert_eq!(result.stderr, b"oops\n");
    }

    #[tokio::test]
    async fn a_timeout_kills_the_whole_group() {
        let marker = tempfile::NamedTempFile::new().expect("marker");
        let path = marker.path().display().to_string();
        let result = processes()
            .exec(ProcessSpec {
                timeout_sec: 1,
                // A grandchild that would write the marker after the timeout.
                ..run(&format!("(sleep 2; echo late > {path}) & sleep 30"))
            })
            .await
            .expect("exec");
        assert!(result.timed_out && result.exit_code == TIMED_OUT_EXIT_CODE);
        assert!(result.duration < Duration::from_secs(3));
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(std::fs::read(marker.path()).expect("read"), b"", "the grandchild died too");
    }

    #[test]
    fn shell_lines_are_told_from_program_names() {
        for program in ["id", "/usr/bin/true", "python3", "./run.sh"] {
            assert!(!is_shell_line(program), "{program}");
        }
        for line in ["id -u", "echo $HOME", "a;b", "ls *", "x=1 env", "cat<f"] {
            assert!(is_shell_line(line), "{line}");
        }
    }

    #[tokio::test]
    async fn bad_specs_are_refused() {
        let processes = processes();
        for spec in [
            run(""),
            ProcessSpec { cwd: "relative".into(), ..run("true") },
            ProcessSpec { cwd: "/no/such/dir".into(), ..run("true") },
            ProcessSpec { env: [("A=B".to_owned(), "x".to_owned())].into(), ..run("true") },
            ProcessSpec { timeout_sec: 3601, ..run("true") },
            ProcessSpec { args: vec!["x".into()], ..run("/no/such/program") },
        ] {
            assert!(matches!(processes.exec(spec).await, Err(ProcessError::Invalid(_))));
        }
    }

    #[tokio::test]
    async fn output_past_the_bound_is_dropped_without_blocking_the_command() {
        let result =
            processes().exec(run("head -c 3000000 /dev/zero; echo done >&2")).await.expect("exec");
        assert_eq!(result.exit_code, 0);
        assert_eq!(result.stdout.len(), MAX_EXEC_OUTPUT);
        assert_eq!(result.stderr, b"done\n");
    }
}

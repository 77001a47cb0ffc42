//! Spawned processes: started and answered at once, then watched, fed, signalled and
//! resized by id until they end. Output (stdout and stderr, or the terminal's) is kept in
//! a bounded history that every stream replays before following it live.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{broadcast, watch};

use super::{ProcessError, ProcessSpec, Processes, Slot, exit_code, spawn_failed, timeout_of};
use crate::process::GroupLeader;

/// Output kept per process for streams that start late; older output is dropped.
pub const MAX_KEPT_OUTPUT: usize = 1024 * 1024;
/// Largest stdin write.
pub const MAX_STDIN_CHUNK: usize = 1024 * 1024;
/// Ended processes stay known (status, output) up to this many.
const MAX_REMEMBERED: usize = 64;

type Input = Box<dyn AsyncWrite + Send + Unpin>;
/// An output, and whether it is stderr.
type Output = (bool, Box<dyn AsyncRead + Send + Unpin>);

/// A piece of output, or the end.
#[derive(Clone, Debug)]
pub enum OutputEvent {
    Chunk { stderr: bool, data: Arc<Vec<u8>> },
    Exit(i32),
}

pub struct SpawnOptions {
    pub allocate_tty: bool,
    pub cols: u16,
    pub rows: u16,
}

#[derive(Default)]
struct History {
    chunks: VecDeque<(bool, Arc<Vec<u8>>)>,
    bytes: usize,
}

pub struct Spawned {
    pub id: String,
    pub pid: u32,
    pub started_at: SystemTime,
    started: Instant,
    group: Pid,
    stdin: tokio::sync::Mutex<Option<Input>>,
    /// The terminal's master side, for resizes; `None` without a TTY.
    terminal: Option<OwnedFd>,
    history: Mutex<History>,
    events: broadcast::Sender<OutputEvent>,
    exit: watch::Receiver<Option<i32>>,
}

/// What `status` answers.
pub struct ProcessStatus {
    pub exit_code: Option<i32>,
    pub cpu_pct: f64,
    pub mem_bytes: u64,
}

impl Spawned {
    fn lock(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record(&self, stderr: bool, data: Vec<u8>) {
        let data = Arc::new(data);
        let mut history = self.lock();
        history.bytes += data.len();
        history.chunks.push_back((stderr, data.clone()));
        while history.bytes > MAX_KEPT_OUTPUT {
            match history.chunks.pop_front() {
                Some((_, dropped)) => history.bytes -= dropped.len(),
                None => break,
            }
        }
        // Sent under the lock: a subscriber sees each chunk once, in the history or live.
        let _ = self.events.send(OutputEvent::Chunk { stderr, data });
    }

    /// The output kept so far, and a receiver of everything after it.
    pub fn follow(
        &self,
    ) -> (Vec<OutputEvent>, broadcast::Receiver<OutputEvent>, watch::Receiver<Option<i32>>) {
        let history = self.lock();
        let kept = history
            .chunks
            .iter()
            .map(|(stderr, data)| OutputEvent::Chunk { stderr: *stderr, data: data.clone() })
            .collect();
        (kept, self.events.subscribe(), self.exit.clone())
    }

    pub fn status(&self) -> ProcessStatus {
        let exit_code = *self.exit.borrow();
        let (cpu_seconds, mem_bytes) =
            if exit_code.is_none() { usage(self.pid).unwrap_or_default() } else { (0.0, 0) };
        let wall = self.started.elapsed().as_secs_f64().max(0.001);
        ProcessStatus {
            exit_code,
            cpu_pct: (cpu_seconds / wall * 100.0 * 10.0).round() / 10.0,
            mem_bytes,
        }
    }

    pub async fn write_stdin(&self, data: &[u8]) -> Result<usize, ProcessError> {
        if data.len() > MAX_STDIN_CHUNK {
            return Err(ProcessError::Invalid(format!(
                "data_b64: at most {MAX_STDIN_CHUNK} bytes at a time"
            )));
        }
        if self.exit.borrow().is_some() {
            return Err(ProcessError::Conflict(format!("process {} has exited", self.id)));
        }
        let mut stdin = self.stdin.lock().await;
        let Some(writer) = stdin.as_mut() else {
            return Err(ProcessError::Conflict(format!(
                "process {} has closed its input",
                self.id
            )));
        };
        let written = async {
            writer.write_all(data).await?;
            writer.flush().await
        };
        match written.await {
            Ok(()) => Ok(data.len()),
            // It stopped reading (exited, closed its input).
            Err(error) => {
                *stdin = None;
                Err(ProcessError::Conflict(format!(
                    "process {} does not take input any more: {error}",
                    self.id
                )))
            }
        }
    }

    /// Sends the signal to the process's whole group (a shell's children too).
    pub fn signal(&self, signal: Signal) -> Result<(), ProcessError> {
        if self.exit.borrow().is_some() {
            return Err(ProcessError::Conflict(format!("process {} has exited", self.id)));
        }
        killpg(self.group, signal).map_err(|error| {
            ProcessError::Failed(format!("signalling process {}: {error}", self.id))
        })
    }

    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), ProcessError> {
        let Some(terminal) = &self.terminal else {
            return Err(ProcessError::Invalid(format!(
                "process {} has no terminal (spawn it with allocate_tty)",
                self.id
            )));
        };
        set_size(terminal, cols, rows)
    }
}

/// CPU seconds and resident bytes of a running process, from /proc.
fn usage(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), from its closing ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let per_second =
        nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    let pages: u64 = fields.get(21)?.parse().ok()?;
    let page_size =
        nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().unwrap_or(4096)
            as u64;
    Some((ticks / per_second, pages * page_size))
}

/// Sizes checked by the caller (`service::processes::terminal_side`).
fn set_size(terminal: &OwnedFd, cols: u16, rows: u16) -> Result<(), ProcessError> {
    let size = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads a winsize the call borrows; the descriptor is ours.
    let done = unsafe { libc::ioctl(terminal.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    if done != 0 {
        return Err(ProcessError::Failed(format!(
            "resizing the terminal: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

impl Processes {
    /// Starts the command and answers at once; it runs until it exits, is killed, or
    /// reaches its timeout (if it has one), and in any case ends with the VM.
    pub async fn spawn(
        &self, spec: ProcessSpec, options: SpawnOptions,
    ) -> Result<Arc<Spawned>, ProcessError> {
        let timeout = (spec.timeout_sec > 0).then(|| timeout_of(spec.timeout_sec)).transpose()?;
        let mut command = self.command(&spec)?;
        let terminal = if options.allocate_tty {
            let size = libc::winsize {
                ws_row: options.rows.max(1),
                ws_col: options.cols.max(1),
                ws_xpixel: 0,
                ws_ypixel: 0,
            };
            let pty = nix::pty::openpty(Some(&size), None)
                .map_err(|error| ProcessError::Failed(format!("opening a terminal: {error}")))?;
            let slave = |pty: &OwnedFd| {
                pty.try_clone()
                    .map(Stdio::from)
                    .map_err(|error| ProcessError::Failed(error.to_string()))
            };
            command
                .stdin(slave(&pty.slave)?)
                .stdout(slave(&pty.slave)?)
                .stderr(slave(&pty.slave)?)
                .env("TERM", "xterm-256color");
            Some(pty.master)
        } else {
            command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
            None
        };
        let slot = self.slot()?;
        let spawned = if terminal.is_some() {
            GroupLeader::spawn_with_terminal(command)
        } else {
            GroupLeader::spawn(command)
        };
        let mut child = spawned.map_err(|error| spawn_failed(&spec, &error))?;
        let pid = child.pid();
        // Inputs and outputs: the terminal's master side, or the pipes.
        let (stdin, outputs): (Input, Vec<Output>) = match &terminal {
            Some(master) => {
                let file = |fd: &OwnedFd| {
                    fd.try_clone()
                        .map(|fd| tokio::fs::File::from_std(std::fs::File::from(fd)))
                        .map_err(|error| ProcessError::Failed(error.to_string()))
                };
                (Box::new(file(master)?), vec![(false, Box::new(file(master)?))])
            }
            None => {
                let (Some(stdin), Some(stdout), Some(stderr)) = (
                    child.child.stdin.take(),
                    child.child.stdout.take(),
                    child.child.stderr.take(),
                ) else {
                    child.terminate(Duration::ZERO).await;
                    return Err(ProcessError::Failed("the process's pipes are missing".into()));
                };
                (Box::new(stdin), vec![(false, Box::new(stdout)), (true, Box::new(stderr))])
            }
        };
        let (exit_tx, exit) = watch::channel(None);
        let (events, _) = broadcast::channel(256);
        let process = Arc::new(Spawned {
            id: self.next_id(),
            pid,
            started_at: SystemTime::now(),
            started: Instant::now(),
            group: Pid::from_raw(pid as i32),
            stdin: tokio::sync::Mutex::new(Some(stdin)),
            terminal,
            history: Mutex::default(),
            events,
            exit,
        });
        tokio::spawn(supervise(process.clone(), child, outputs, exit_tx, timeout, slot));
        self.remember(process.clone());
        Ok(process)
    }

    fn remember(&self, process: Arc<Spawned>) {
        let mut table = self.lock_spawned();
        if table.len() >= MAX_REMEMBERED {
            // Forget the ended ones that started first.
            let mut ended: Vec<(SystemTime, String)> = table
                .values()
                .filter(|p| p.exit.borrow().is_some())
                .map(|p| (p.started_at, p.id.clone()))
                .collect();
            ended.sort();
            for (_, id) in ended.into_iter().take(table.len() + 1 - MAX_REMEMBERED) {
                table.remove(&id);
            }
        }
        table.insert(process.id.clone(), process);
    }

    pub fn spawned(&self, id: &str) -> Result<Arc<Spawned>, ProcessError> {
        self.lock_spawned()
            .get(id)
            .cloned()
            .ok_or_else(|| ProcessError::NotFound(format!("process {id} not found")))
    }
}

/// Pumps the output into the history until both ends close, reaps the process (killing
/// its group at the timeout), and announces the exit.
async fn supervise(
    process: Arc<Spawned>, mut child: GroupLeader, outputs: Vec<Output>,
    exit: watch::Sender<Option<i32>>, timeout: Option<Duration>, _slot: Slot,
) {
    // Tasks of their own: they read while the process runs.
    let pumps = futures::future::join_all(outputs.into_iter().map(|(stderr, mut reader)| {
        let process = process.clone();
        tokio::spawn(async move {
            let mut buffer = vec![0u8; 16 * 1024];
            // A terminal's master answers EIO once the last slave closes: its end.
            while let Ok(read) = reader.read(&mut buffer).await {
                if read == 0 {
                    break;
                }
                process.record(stderr, buffer[..read].to_vec());
            }
        })
    }));
    let status = match timeout {
        Some(timeout) => tokio::time::timeout(timeout, child.wait()).await.ok(),
        None => Some(child.wait().await),
    };
    // Whatever is left of its group goes with it, and with them the last writers of its
    // output; what they wrote is still read. (One that left the group is not waited for.)
    child.terminate(Duration::ZERO).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), pumps).await;
    let code = match status {
        Some(Ok(status)) => exit_code(status),
        Some(Err(_)) => -1,
        None => super::TIMED_OUT_EXIT_CODE,
    };
    *process.stdin.lock().await = None;
    let _ = exit.send(Some(code));
    let _ = process.events.send(OutputEvent::Exit(code));
}

//! The agent process of a local VM: what it is started with besides its arguments (its
//! sockets and its secret), the relay of its log, its sandbox's pid, and its stop.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::{ADDRESS_TIMEOUT, LOG_FILE, SOCKET_FILE, STOP_TIMEOUT};
use crate::runtime::processes::{
    group_members_mentioning, is_agent_for, is_running, process_group,
};
use crate::runtime::sandbox;

/// What a local agent is started with besides its arguments: its two listening sockets,
/// bound in `control` (a directory only we can enter), and a pipe holding its secret
/// (never in its environment, which its children would inherit).
pub(super) struct AgentFds {
    pub(super) listener: std::os::unix::net::UnixListener,
    pub(super) handoff: std::os::unix::net::UnixListener,
    pub(super) secret: OwnedFd,
}

impl AgentFds {
    pub(super) fn new(control: &Path, secret: &str) -> std::io::Result<Self> {
        std::fs::create_dir_all(control)?;
        std::fs::set_permissions(control, std::fs::Permissions::from_mode(0o700))?;
        let bind = |name: &str| {
            let path = control.join(name);
            let _ = std::fs::remove_file(&path);
            let short = browser_agent_proto::unix_socket::short_path(&path)?;
            std::os::unix::net::UnixListener::bind(&short.path)
        };
        let listener = bind(SOCKET_FILE)?;
        let handoff = bind(browser_agent_proto::unix_socket::DEVTOOLS_HANDOFF_FILE)?;
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
        // A secret is far smaller than a pipe's buffer: this cannot block.
        std::fs::File::from(write).write_all(secret.as_bytes())?;
        Ok(Self { listener, handoff, secret: read })
    }

    /// Lets `command`'s process, and no other, inherit the descriptors.
    pub(super) fn pass_to(&self, command: &mut tokio::process::Command) {
        for fd in [self.listener.as_raw_fd(), self.handoff.as_raw_fd(), self.secret.as_raw_fd()] {
            sandbox::keep_fd(command, fd);
        }
    }
}

/// The write end of a pipe whose bytes land in `log`: the VM's agent logs into it, and
/// so holds no descriptor of a host file that anything in the VM could take over. The
/// relay (`cat`, as the VM's host user, in a session of its own so that it outlives a
/// restart of this service) ends when the VM's last writer does.
pub(super) fn start_log_relay(
    log: std::fs::File, owner: Option<(u32, u32)>,
) -> std::io::Result<OwnedFd> {
    let (read, write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
    let mut relay = tokio::process::Command::new("cat");
    relay.env_clear().stdin(std::fs::File::from(read)).stdout(log).stderr(Stdio::null());
    if let Some((uid, gid)) = owner {
        relay.uid(uid).gid(gid);
    }
    // SAFETY: setsid is async-signal-safe and changes only the child.
    unsafe {
        relay.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut relay = relay.spawn()?;
    tokio::spawn(async move {
        let _ = relay.wait().await;
    });
    Ok(write)
}

/// The host pid of a sandbox's PID 1, which bubblewrap reports once it exists (`None` if
/// the sandbox failed first).
pub(super) async fn sandbox_pid(info: OwnedFd) -> Option<i64> {
    let mut text = String::new();
    let mut info = tokio::fs::File::from(std::fs::File::from(info));
    let read = tokio::io::AsyncReadExt::read_to_string(&mut info, &mut text);
    tokio::time::timeout(ADDRESS_TIMEOUT, read).await.ok()?.ok()?;
    sandbox::child_pid(&text)
}

/// `dir` and everything under it.
pub(super) fn walk(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found = vec![dir.to_path_buf()];
    let mut index = 0;
    while index < found.len() {
        if found[index].is_dir() && !found[index].is_symlink() {
            for entry in std::fs::read_dir(&found[index])? {
                found.push(entry?.path());
            }
        }
        index += 1;
    }
    Ok(found)
}

/// The last lines of an agent's log, for launch errors.
pub(super) fn log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join(LOG_FILE)).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// Stops an agent process: one that accepted the Shutdown call gets time to stop by
/// itself, any other is sent SIGTERM at once; whatever is left at the deadline is
/// SIGKILLed with its process group. The agent's own children die with it
/// (parent-death signal).
pub(super) async fn stop_agent_process(pid: i64, root: &Path, shutdown_accepted: bool) {
    // The agent's group: the sandbox's PID 1 is in the group of the bubblewrap that
    // started it, with the agent.
    let group = Pid::from_raw(process_group(pid).unwrap_or(pid) as i32);
    let started = tokio::time::Instant::now();
    let mut terminated = false;
    while is_running(pid) && is_agent_for(pid, root) {
        let waited = started.elapsed();
        if waited > STOP_TIMEOUT {
            // A sandbox's PID 1 takes every process of the VM with it.
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
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
        for member in group_members_mentioning(i64::from(group.as_raw()), browser_dir) {
            let _ = nix::sys::signal::kill(Pid::from_raw(member as i32), Signal::SIGKILL);
        }
    }
}

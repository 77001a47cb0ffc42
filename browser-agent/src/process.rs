//! Child processes of the agent (Xvfb, Chromium) each lead their own process group and die
//! with the agent, so that killing a group reaps Chromium's zygote and renderers too, and
//! a `kill -9` of the agent cannot orphan them.

use std::os::unix::process::CommandExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Child;

/// Makes the command lead a new process group that the kernel SIGKILLs when the agent
/// dies. The parent-death signal fires when the spawning *thread* exits, so spawn from
/// the main thread or a runtime worker, never from a short-lived blocking thread.
pub fn in_own_group_dying_with_agent(command: &mut std::process::Command) {
    command.process_group(0);
    // SAFETY: prctl is async-signal-safe and touches only the child's own state.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// SIGTERM to the group, up to `grace` for the leader to exit, then SIGKILL to the whole
/// group (whatever is left of it).
async fn terminate_group(group: Pid, grace: Duration, mut exited: impl FnMut() -> bool) {
    if !exited() {
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = tokio::time::Instant::now() + grace;
        while !exited() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let _ = killpg(group, Signal::SIGKILL);
}

/// An async child that leads its own process group. Remembers the group id, so the group
/// can still be killed after the leader itself has exited and been reaped (Chromium's
/// helpers may outlive a crashed browser process).
pub struct GroupLeader {
    pub child: Child,
    group: Pid,
}

impl GroupLeader {
    pub fn spawn(mut command: std::process::Command) -> std::io::Result<Self> {
        in_own_group_dying_with_agent(&mut command);
        Self::start(command)
    }

    /// Starts a command already set up to lead its group.
    fn start(command: std::process::Command) -> std::io::Result<Self> {
        let mut command = tokio::process::Command::from(command);
        command.kill_on_drop(true);
        let child = command.spawn()?;
        let pid = child.id().ok_or_else(|| std::io::Error::other("child exited at once"))?;
        Ok(Self { child, group: Pid::from_raw(pid as i32) })
    }

    /// Like `spawn`, for a child whose stdin is a terminal's slave side: it leads a new
    /// session (and so its own group) with that terminal as its controlling terminal,
    /// as a shell in a terminal expects.
    pub fn spawn_with_terminal(command: std::process::Command) -> std::io::Result<Self> {
        let mut command = command;
        // SAFETY: setsid, ioctl and prctl are async-signal-safe and change only the
        // child's own state.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0
                    || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0
                    || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Self::start(command)
    }

    pub fn pid(&self) -> u32 {
        self.group.as_raw() as u32
    }

    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    pub async fn terminate(&mut self, grace: Duration) {
        let child = &mut self.child;
        terminate_group(self.group, grace, || child.try_wait().ok().flatten().is_some()).await;
        let _ = self.child.wait().await;
    }

    /// Gives the leader `grace` to exit by itself, asking it with SIGTERM if it has not
    /// started to (only the leader: a signal to the whole group would kill its helpers,
    /// such as the network service holding the cookies, before it could shut them down
    /// in order), then reaps the group.
    pub async fn exit_cleanly(&mut self, grace: Duration) {
        if tokio::time::timeout(grace / 2, self.child.wait()).await.is_err() {
            let _ = nix::sys::signal::kill(self.group, Signal::SIGTERM);
            let _ = tokio::time::timeout(grace / 2, self.child.wait()).await;
        }
        self.terminate(Duration::from_millis(500)).await;
    }
}

/// A blocking (`std`) child leading its own group, for processes started before the
/// async runtime exists.
pub struct StdGroupLeader {
    child: std::process::Child,
    group: Pid,
}

impl StdGroupLeader {
    pub fn spawn(command: &mut std::process::Command) -> std::io::Result<Self> {
        in_own_group_dying_with_agent(command);
        let child = command.spawn()?;
        let group = Pid::from_raw(child.id() as i32);
        Ok(Self { child, group })
    }

    pub fn kill_now(&mut self) {
        let _ = killpg(self.group, Signal::SIGKILL);
        let _ = self.child.wait();
    }

    pub async fn terminate(&mut self, grace: Duration) {
        let child = &mut self.child;
        terminate_group(self.group, grace, || child.try_wait().ok().flatten().is_some()).await;
        let _ = self.child.wait();
    }
}

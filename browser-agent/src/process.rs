//! Child processes of the agent (Xvfb, Chromium) each lead their own process group and die
//! with the agent, so that killing a group reaps Chromium's zygote and renderers too, and
//! a `kill -9` of the agent cannot orphan them.

use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// A child that leads its own process group. Remembers the group id, so the group can
/// still be killed after the leader itself has exited and been reaped (Chromium's helpers
/// may outlive a crashed browser process).
pub struct GroupLeader {
    pub child: Child,
    group: Pid,
}

impl GroupLeader {
    /// Spawns `command` as the leader of a new process group that the kernel SIGKILLs
    /// when the agent dies. Must be called from a long-lived runtime worker thread: the
    /// parent-death signal fires when the spawning *thread* exits.
    pub fn spawn(command: &mut Command) -> std::io::Result<Self> {
        command.process_group(0).kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe and touches only the child's own state.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| std::io::Error::other("child exited at once"))?;
        Ok(Self {
            child,
            group: Pid::from_raw(pid as i32),
        })
    }

    pub fn pid(&self) -> u32 {
        self.group.as_raw() as u32
    }

    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// SIGTERM to the group, up to `grace` for the leader to exit, then SIGKILL to the
    /// whole group (whatever is left of it) and reap the leader.
    pub async fn terminate(&mut self, grace: Duration) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = killpg(self.group, Signal::SIGTERM);
            let _ = tokio::time::timeout(grace, self.child.wait()).await;
        }
        let _ = killpg(self.group, Signal::SIGKILL);
        let _ = self.child.wait().await;
    }
}

//! Child processes of the agent (Xvfb, Chromium) each run in their own process group and
//! die with the agent, so that killing a group reaps Chromium's zygote and renderers too,
//! and a `kill -9` of the agent cannot orphan them.

use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// Puts the command in a new process group and asks the kernel to SIGKILL it when the
/// agent dies. Must be spawned from a long-lived runtime worker thread: the parent-death
/// signal fires when the spawning *thread* exits.
pub fn own_group_dying_with_agent(command: &mut Command) {
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
}

/// Sends SIGTERM to the child's process group, waits up to `grace`, then SIGKILLs the
/// group and reaps the child.
pub async fn terminate_group(child: &mut Child, grace: Duration) {
    let Some(pid) = child.id() else {
        return; // already reaped
    };
    let group = Pid::from_raw(pid as i32);
    let _ = killpg(group, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = killpg(group, Signal::SIGKILL);
        let _ = child.wait().await;
    }
    // Renderers may outlive the main process by a moment; the group is ours alone.
    let _ = killpg(group, Signal::SIGKILL);
}

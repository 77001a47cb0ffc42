//! Who runs what inside the VM. In a sandbox whose tenant code runs apart (the control
//! plane mapped two users into the VM, `--tenant-uid`), the agent is the VM's uid 0 with
//! a few capabilities, and every process it starts for a tenant (Chromium, `process`
//! commands, Playwright, chromedriver) runs as the tenant's uid with none. A tenant
//! process can then neither signal, trace nor read the agent (nor Xvfb, PulseAudio and
//! the encoders, which run as the agent), and cannot enter the agent's run directory.
//!
//! The agent acts on the tenant's files as the tenant would: its effective (and so
//! file-system) uid and gid are the tenant's, so what it creates in the home belongs to
//! the tenant, while its real and saved ids stay 0, which is what the kernel compares
//! when a tenant process tries to signal or trace it. Its capabilities (raised again
//! after that switch) let it reach its own directories and any tenant file.

use std::sync::OnceLock;
use std::time::Duration;

use anyhow::Context;
use caps::CapSet;
use nix::unistd::{Gid, Uid};

/// Tasks the tenant may not take from the VM's limit: the agent keeps room to serve
/// (and to end a fork bomb) whatever a tenant starts.
const AGENT_RESERVED_TASKS: u64 = 256;

#[derive(Clone, Copy, Debug)]
struct Tenant {
    uid: u32,
    gid: u32,
    /// RLIMIT_NPROC of tenant processes (0: none).
    max_tasks: u64,
}

static TENANT: OnceLock<Tenant> = OnceLock::new();

/// Sets the agent's identity. First thing in `main`, while it is the only thread (the
/// credentials of threads started later follow).
pub fn become_agent(tenant_uid: Option<u32>, max_tasks: u64) -> anyhow::Result<()> {
    // Nothing without our uid may read our memory or take our descriptors, even if a
    // later change of ids would make us look like a tenant process.
    nix::sys::prctl::set_dumpable(false).context("PR_SET_DUMPABLE")?;
    let Some(uid) = tenant_uid else {
        return Ok(());
    };
    let root = (Uid::from_raw(0), Gid::from_raw(0));
    nix::unistd::setresgid(root.1, Gid::from_raw(uid), root.1).context("setresgid")?;
    nix::unistd::setresuid(root.0, Uid::from_raw(uid), root.0).context("setresuid")?;
    // A change of effective uid clears the effective capabilities; permitted remain.
    let permitted = caps::read(None, CapSet::Permitted).context("reading capabilities")?;
    caps::set(None, CapSet::Effective, &permitted).context("raising capabilities")?;
    // What the agent starts gets capabilities only by running as the VM's root.
    caps::clear(None, CapSet::Ambient).context("clearing ambient capabilities")?;
    let max_tasks = max_tasks.saturating_sub(AGENT_RESERVED_TASKS);
    TENANT
        .set(Tenant { uid, gid: uid, max_tasks })
        .map_err(|_| anyhow::anyhow!("the agent's identity was set twice"))
}

/// The tenant's uid, when tenant code runs apart from the agent.
pub fn tenant_uid() -> Option<u32> {
    TENANT.get().map(|tenant| tenant.uid)
}

/// Makes `command` a tenant process: the tenant's uid and gid (no capabilities, no
/// supplementary groups) and its share of the VM's tasks.
pub fn as_tenant(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let Some(tenant) = TENANT.get().copied() else {
        return;
    };
    command.uid(tenant.uid).gid(tenant.gid);
    if tenant.max_tasks > 0 {
        // SAFETY: setrlimit is async-signal-safe; lowering a limit needs no privilege.
        unsafe {
            command.pre_exec(move || {
                let limit = libc::rlimit { rlim_cur: tenant.max_tasks, rlim_max: tenant.max_tasks };
                if libc::setrlimit(libc::RLIMIT_NPROC, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

/// The agent's own secrets (its API secret, its egress proxy's credentials) are no
/// business of any program it starts: removed from `command`'s environment.
pub fn without_agent_secrets(command: &mut std::process::Command) -> &mut std::process::Command {
    command
        .env_remove("BROWSER_AGENT_SECRET")
        .env_remove("BROWSER_AGENT_PROXY_USERNAME")
        .env_remove("BROWSER_AGENT_PROXY_PASSWORD")
}

/// Makes `command` one of the agent's helpers (Xvfb, PulseAudio, an encoder): the VM's
/// root through and through, out of a tenant's reach.
pub fn as_agent(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    if TENANT.get().is_some() {
        command.uid(0).gid(0);
    }
}

/// Kills every process of the tenant, wherever it was started from (a `setsid nohup`
/// loop included): for the browser's next user. Answers how many were left after 2 s.
pub async fn end_tenant_processes() -> usize {
    let Some(uid) = tenant_uid() else {
        return 0;
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let left = tenant_processes(uid);
        if left.is_empty() || tokio::time::Instant::now() > deadline {
            return left.len();
        }
        for pid in left {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Live (not zombie) processes whose real uid is `uid`, in this PID namespace.
fn tenant_processes(uid: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                return false;
            };
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|line| line.strip_prefix(name))
                    .map(str::trim)
                    .unwrap_or("")
                    .to_owned()
            };
            let real_uid = field("Uid:").split_whitespace().next().map(str::to_owned);
            real_uid.as_deref() == Some(&uid.to_string()) && !field("State:").starts_with('Z')
        })
        .collect()
}

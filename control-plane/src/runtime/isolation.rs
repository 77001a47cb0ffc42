//! What keeps a browser VM from the host and from other VMs, as this host and runtime
//! really enforce it. A protection that is not in force is named with the reason, in the
//! log at start and in `GET /readyz`, never silently skipped.

use std::path::Path;

use serde::Serialize;
use utoipa::ToSchema;

use super::cgroups::VmCgroups;
use super::disk::VmDisks;

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct IsolationReport {
    /// Whether every browser runs in a sandbox of its own (own user, filesystem, process
    /// and network namespaces).
    pub sandboxed: bool,
    /// Protections in force.
    pub enforced: Vec<String>,
    /// Protections not in force, each with why.
    pub not_enforced: Vec<Unenforced>,
    /// What this host offers for isolation.
    pub host: HostCapabilities,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Unenforced {
    pub protection: String,
    pub reason: String,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct HostCapabilities {
    /// Unprivileged user namespaces can be created.
    pub user_namespaces: bool,
    /// `bwrap` (Debian `bubblewrap`) is installed.
    pub bubblewrap: bool,
    /// The cgroup v2 memory controller is available (unified hierarchy).
    pub cgroup_v2_memory: bool,
}

impl HostCapabilities {
    pub fn detect() -> Self {
        let user_namespaces = super::sandbox::user_namespaces_allowed();
        let bubblewrap = std::env::var_os("PATH").is_some_and(|path| {
            std::env::split_paths(&path).any(|dir| dir.join("bwrap").is_file())
        });
        let cgroup_v2_memory =
            std::fs::read_to_string(Path::new("/sys/fs/cgroup/cgroup.controllers"))
                .is_ok_and(|controllers| controllers.split_whitespace().any(|c| c == "memory"));
        Self { user_namespaces, bubblewrap, cgroup_v2_memory }
    }
}

impl IsolationReport {
    pub fn new(
        sandboxed: bool, enforced: Vec<String>, not_enforced: Vec<Unenforced>,
        host: HostCapabilities,
    ) -> Self {
        Self { sandboxed, enforced, not_enforced, host }
    }

    /// The local runtime: every browser in a sandbox of its own, or (`--isolation none`,
    /// development only) on this host as this service's user.
    pub fn local(
        host: HostCapabilities, sandbox: Option<&super::Sandbox>, limits: &KernelLimits,
    ) -> Self {
        let mut enforced: Vec<String> = Vec::new();
        let mut not_enforced = Vec::new();
        match sandbox {
            Some(sandbox) => {
                enforced.extend([
                    "each browser runs in a bubblewrap sandbox of its own: user, mount, PID, \
                     IPC, UTS, cgroup and network namespaces"
                        .to_owned(),
                    format!(
                        "browsers run as an unprivileged user ({}), never as the host's root, \
                         with Chromium's own sandbox on",
                        match sandbox.user() {
                            Some(user) => format!("host uid {}", user.uid),
                            None => "this service's user".to_owned(),
                        }
                    ),
                    "a browser sees read-only system directories and its own home, /tmp, \
                     /dev/shm and run directory: not the data directory, other browsers or \
                     the host's files and processes"
                        .to_owned(),
                    "a browser's only way out is its egress proxy outside the sandbox: \
                     loopback, link-local (cloud metadata) and private addresses are refused \
                     (--egress-allow), network.allowed_hosts is applied, and a session's proxy \
                     credentials never enter the VM"
                        .to_owned(),
                    "memory: a VM whose processes together use more than its `memory` ends \
                     alone, with a reason (measured by its agent every 250 ms)"
                        .to_owned(),
                    "the control plane reaches each agent through sockets it binds itself \
                     outside the VM and hands in as descriptors: nothing in a VM can redirect \
                     them"
                        .to_owned(),
                    "recordings a crashed agent left are remuxed and checked in a sandbox of \
                     their own (MP4 demuxer forced, stdin and stdout only), never by the host"
                        .to_owned(),
                ]);
                match sandbox.tenant() {
                    Some(tenant) => enforced.push(format!(
                        "tenant code (Chromium, processes, Playwright) runs as its own user \
                         (host uid {}), apart from the agent: it cannot read, signal or trace \
                         the agent, take its descriptors or enter its run directory",
                        tenant.uid
                    )),
                    None => not_enforced.push(Unenforced {
                        protection: "tenant code runs apart from the agent (another uid in \
                                     the VM)"
                            .into(),
                        reason: "this service does not run as root, so a VM has one user: a \
                                 tenant process can read the agent's memory and signal it \
                                 (still inside its own VM)"
                            .into(),
                    }),
                }
                match &limits.cgroups {
                    Ok(cgroups) => enforced.push(format!(
                        "kernel limits per VM in a control group of its own, {}: memory \
                         (`memory`, tmpfs, shared memory and memfds included; the VM ends \
                         with a reason), 4096 tasks, CPU weight {} (equal shares by default)",
                        cgroups.describe(),
                        limits.cpu_weight
                    )),
                    Err(reason) => not_enforced.push(Unenforced {
                        protection: "kernel-enforced memory, task and CPU limits per browser \
                                     (cgroups)"
                            .into(),
                        reason: format!(
                            "{reason}; memory is measured by the agent every 250 ms instead \
                             (a faster burst, or memory in a private tmpfs or memfd, can pass \
                             it), tasks are limited by RLIMIT_NPROC and CPU is not weighted"
                        ),
                    }),
                }
                match &limits.disks {
                    Ok(disks) => enforced.push(format!(
                        "disk: each VM's home is a file system of its own of {} GiB (a sparse, \
                         loop-mounted ext4 image): a full VM cannot fill the host's disk",
                        disks.size_bytes >> 30
                    )),
                    Err(reason) => not_enforced.push(Unenforced {
                        protection: "a disk quota per browser".into(),
                        reason: format!(
                            "{reason}; a VM's home is on the host's file system and can fill it"
                        ),
                    }),
                }
            }
            None => not_enforced.push(Unenforced {
                protection: "browser sandbox".into(),
                reason: "started with --isolation none (development only): browsers run as \
                         this service's user in the host's filesystem, process and network \
                         namespaces (Chromium with --no-sandbox when that user is root); a page \
                         can read files that user can read and reach loopback services; \
                         recordings of crashed agents are remuxed on the host (still on pipes \
                         with the demuxer forced)"
                    .into(),
            }),
        }
        enforced.extend(
            [
                "agents listen only on Unix sockets in a directory of their browser's that only \
                 the service's user can enter",
                "the data directory is private to the service's user (its files 0600)",
                "custom proxies cannot point inside this host or its networks (--egress-allow)",
                "a pool browser's next lessee gets no file, profile or DevTools URL of the \
                 previous one (the extensions stay, and the filesystem API cannot change them)",
                "the filesystem API stays inside each browser's root and leaves no link out of it",
            ]
            .map(str::to_owned),
        );
        Self { sandboxed: sandbox.is_some(), enforced, not_enforced, host }
    }

    /// One log line per protection not in force.
    pub fn log(&self) {
        for unenforced in &self.not_enforced {
            tracing::warn!(
                protection = %unenforced.protection,
                reason = %unenforced.reason,
                "browser isolation: NOT ENFORCED on this host"
            );
        }
        tracing::info!(
            sandboxed = self.sandboxed,
            user_namespaces = self.host.user_namespaces,
            bubblewrap = self.host.bubblewrap,
            cgroup_v2_memory = self.host.cgroup_v2_memory,
            "browser isolation"
        );
    }
}

/// The kernel's means of holding each VM to its limits, where this host has them; each
/// `Err` says why not (reported at start and in `/readyz`).
#[derive(Clone, Debug)]
pub struct KernelLimits {
    /// A control group per VM: memory, tasks, CPU weight.
    pub cgroups: Result<VmCgroups, String>,
    /// A quota'd file system per VM for its home.
    pub disks: Result<VmDisks, String>,
    /// Each VM's CPU weight (cgroup v2 scale, 100 by default: equal shares).
    pub cpu_weight: u64,
}

impl KernelLimits {
    /// None at all (VMs without a sandbox, tests).
    pub fn none(reason: &str) -> Self {
        Self { cgroups: Err(reason.to_owned()), disks: Err(reason.to_owned()), cpu_weight: 100 }
    }
}

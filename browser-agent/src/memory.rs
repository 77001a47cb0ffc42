//! The VM's memory limit where the host offers no cgroup to enforce it: every process of
//! the VM is measured by its proportional set size, so memory shared between Chromium's
//! processes counts once, and with a sandbox of its own so are the files in the VM's
//! memory-backed directories; past the limit the VM ends, saying why, and nothing outside
//! it is touched.
//!
//! Reading a process's PSS walks its page tables (tens of milliseconds for Chromium's
//! processes, four times a second: a tenth of a core per idle VM). So each look first sums
//! the resident set sizes, which the kernel keeps as counters: resident memory includes
//! all of the proportional share, so a VM well under its limit by that sum is under it
//! (the margin, a sixteenth of the limit, covers counters that lag a few pages per
//! thread), and only a VM that may be near or over it is measured exactly.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Which processes are the VM's.
#[derive(Clone, Copy, Debug)]
pub enum VmProcesses {
    /// Every process this agent sees (its sandbox's PID namespace), with what they keep
    /// in the sandbox's own `/tmp` and `/dev/shm`.
    PidNamespace,
    /// The agent and its descendants (no sandbox).
    Descendants,
}

/// Watches the VM's memory until `shutdown`; past `limit_bytes` writes the reason to
/// `reason_file` (when given) and shuts the VM down.
pub async fn enforce_limit(
    limit_bytes: u64, processes: VmProcesses, reason_file: Option<PathBuf>,
    shutdown: CancellationToken,
) {
    // The first look once the VM has started: measuring competes with its start.
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + POLL_INTERVAL, POLL_INTERVAL);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let used = tokio::task::spawn_blocking(move || {
            let resident = vm_memory_bytes(processes, Measure::Resident);
            if resident.saturating_add(limit_bytes / 16) <= limit_bytes {
                resident
            } else {
                vm_memory_bytes(processes, Measure::Proportional)
            }
        })
        .await
        .unwrap_or(0);
        if used > limit_bytes {
            let reason = format!(
                "the browser used more memory than its limit ({} MiB > {} MiB)",
                used >> 20,
                limit_bytes >> 20
            );
            tracing::warn!(%reason, "ending the VM");
            if let Some(file) = &reason_file
                && let Err(error) = std::fs::write(file, &reason)
            {
                tracing::warn!(%error, "could not record why the VM ended");
            }
            shutdown.cancel();
            return;
        }
    }
}

/// How a process's memory is counted.
#[derive(Clone, Copy, Debug)]
pub enum Measure {
    /// Resident set size: cheap, and at least the proportional size.
    Resident,
    /// Proportional set size: shared pages split between their users.
    Proportional,
}

/// The VM's memory in bytes.
pub fn vm_memory_bytes(processes: VmProcesses, measure: Measure) -> u64 {
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |bytes| bytes as u64);
    let bytes_of = |pid: u32| match measure {
        Measure::Resident => resident_bytes(pid, page),
        Measure::Proportional => pss_bytes(pid),
    };
    let processes_bytes: u64 = vm_pids(processes).into_iter().map(bytes_of).sum();
    match processes {
        VmProcesses::Descendants => processes_bytes,
        VmProcesses::PidNamespace => {
            processes_bytes + tmpfs_used_bytes("/tmp") + tmpfs_used_bytes("/dev/shm")
        }
    }
}

/// What the files of a memory-backed mount take (mapped ones count twice: on the safe
/// side).
fn tmpfs_used_bytes(mount: &str) -> u64 {
    nix::sys::statvfs::statvfs(mount).map_or(0, |stats| {
        stats.blocks().saturating_sub(stats.blocks_free()) * stats.fragment_size()
    })
}

fn process_ids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect()
}

/// The VM's processes, the agent among them.
pub fn vm_pids(processes: VmProcesses) -> Vec<u32> {
    let pids = process_ids();
    match processes {
        VmProcesses::Descendants => {
            let own = std::process::id();
            let parents = parent_table(&pids);
            pids.into_iter().filter(|&pid| descends_from(pid, own, &parents)).collect()
        }
        // Every process in sight is the VM's: no need to know whose child it is.
        VmProcesses::PidNamespace => pids,
    }
}

/// Each process's parent, from its `stat`.
fn parent_table(pids: &[u32]) -> HashMap<u32, u32> {
    pids.iter()
        .filter_map(|&pid| {
            let stat = read_proc_line(&format!("/proc/{pid}/stat"))?;
            let ppid = stat.rsplit_once(") ")?.1.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// A one-line `/proc` file (`stat`, `statm`) in one read: these looks run four times a
/// second in every VM, and on a busy host each system call spent here is one a browser
/// waits behind.
fn read_proc_line(path: &str) -> Option<String> {
    use std::io::Read;
    let mut buffer = [0u8; 1024];
    let read = std::fs::File::open(path).ok()?.read(&mut buffer).ok()?;
    // Lossy: a process name need not be UTF-8.
    Some(String::from_utf8_lossy(&buffer[..read]).into_owned())
}

fn descends_from(mut pid: u32, ancestor: u32, parents: &HashMap<u32, u32>) -> bool {
    // Bounded: a pid table read while processes come and go may hold a cycle.
    for _ in 0..64 {
        if pid == ancestor {
            return true;
        }
        match parents.get(&pid) {
            Some(&parent) if parent != 0 => pid = parent,
            _ => return false,
        }
    }
    false
}

/// From `statm`, whose second field is the resident pages (of `page` bytes).
fn resident_bytes(pid: u32, page: u64) -> u64 {
    read_proc_line(&format!("/proc/{pid}/statm"))
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page)
}

fn pss_bytes(pid: u32) -> u64 {
    let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
        return 0;
    };
    rollup
        .lines()
        .find_map(|line| line.strip_prefix("Pss:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_this_process() {
        for measure in [Measure::Resident, Measure::Proportional] {
            // At least the test binary itself is resident.
            assert!(vm_memory_bytes(VmProcesses::Descendants, measure) > 1 << 20);
            assert!(
                vm_memory_bytes(VmProcesses::PidNamespace, measure)
                    >= vm_memory_bytes(VmProcesses::Descendants, measure) / 2
            );
        }
        // The resident size bounds the proportional one, which is what makes the cheap
        // look safe (the test binary's own memory hardly moves between the two reads).
        let own = std::process::id();
        assert!(resident_bytes(own, 4096) * 11 / 10 >= pss_bytes(own));
    }

    #[test]
    fn follows_parent_links() {
        let parents = HashMap::from([(5, 4), (4, 3), (3, 1), (7, 1)]);
        assert!(descends_from(5, 3, &parents));
        assert!(descends_from(3, 3, &parents));
        assert!(!descends_from(7, 3, &parents));
    }
}

//! Kernel-enforced limits per browser VM: each VM's processes live in a control group of
//! their own, with its memory (tmpfs, shared memory and memfds included: the kernel
//! charges pages to the group that touches them), its number of tasks and its CPU weight.
//! The group is entered by the sandbox's first process before it starts anything, so
//! nothing of the VM runs outside it.
//!
//! cgroup v2 is used where this service's own group has the controllers delegated to it;
//! otherwise the v1 controllers (`memory`, `pids`, `cpu`), which a hybrid host such as
//! this one mounts read-write for root. VM groups live under this service's own group of
//! each hierarchy, in `browser-vms/<session id>`; the group directories of a VM are noted
//! in its browser directory so that a restarted service finds them again.
//!
//! A VM started ahead of demand (a pool's or the standby's) runs at idle priority until
//! it is promoted (`VmCgroup::promote`), so that it takes only CPU time nothing else
//! wants, the service and its clients included. In v1 it starts in the CPU group
//! `browser-vms-starting`, marked idle (`cpu.idle`) beside `browser-vms` and this host's
//! own processes, and its threads move to its own CPU group when it is promoted. In v2
//! a VM's group holds all its controllers and cannot move without leaving its memory
//! charged to the old one: its own group is marked idle instead, which yields to the
//! VMs in use but not to the host's processes.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;

/// Where a VM's group directories are noted, in its browser directory (ours alone).
const NOTE_FILE: &str = "cgroups";
const VM_GROUPS: &str = "browser-vms";
/// The v1 CPU group of the VMs started ahead of demand, until each is promoted.
const STARTING_VMS_GROUP: &str = "browser-vms-starting";
/// Most readings of a VM's threads when it is promoted (`VmCgroup::promote`).
const PROMOTION_READINGS: usize = 20;
const V1_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
/// The weight of all VMs together against this host's own processes, as so many busy
/// threads (cgroup v1 and v2 schedule a group like one thread of its weight): a VM's
/// many threads competed with the host's one by one before VMs had groups, and must not
/// starve now; the VMs then share it by their own weights.
const ALL_VMS_WEIGHT_IN_THREADS: u64 = 16;

/// What one VM may use.
#[derive(Clone, Copy, Debug)]
pub struct VmLimits {
    pub memory_bytes: u64,
    pub max_tasks: u64,
    /// Relative CPU weight, 1…10000 (cgroup v2's scale: 100 is the default).
    pub cpu_weight: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Hierarchy {
    /// The parent of VM groups in the unified hierarchy.
    V2(PathBuf),
    /// The parent of VM groups in each v1 controller's hierarchy (memory, pids, cpu).
    V1([PathBuf; 3]),
}

/// The control groups this host lets the service make for VMs.
#[derive(Clone, Debug)]
pub struct VmCgroups {
    hierarchy: Hierarchy,
    /// v1: the idle CPU group VMs started ahead of demand enter first, if it could be set
    /// up (without it they start as any VM).
    starting_cpu: Option<PathBuf>,
}

impl VmCgroups {
    /// The cgroups VMs can be put in, or why there are none.
    pub fn detect() -> Result<Self, String> {
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|error| format!("reading /proc/self/cgroup: {error}"))?;
        let hierarchy = match v2_parent(&own) {
            Ok(parent) => Hierarchy::V2(parent),
            Err(v2) => Hierarchy::V1(
                v1_parents(&own).map_err(|v1| format!("cgroup v2: {v2}; cgroup v1: {v1}"))?,
            ),
        };
        let mut found = Self { hierarchy, starting_cpu: None };
        for dir in found.parents() {
            std::fs::create_dir_all(dir)
                .map_err(|error| format!("creating {}: {error}", dir.display()))?;
        }
        let (file, weight) = match &found.hierarchy {
            Hierarchy::V2(parent) => (parent.join("cpu.weight"), 100 * ALL_VMS_WEIGHT_IN_THREADS),
            Hierarchy::V1(parents) => {
                (parents[2].join("cpu.shares"), 1024 * ALL_VMS_WEIGHT_IN_THREADS)
            }
        };
        std::fs::write(&file, weight.to_string())
            .map_err(|error| format!("setting {}: {error}", file.display()))?;
        if let Hierarchy::V1(parents) = &found.hierarchy {
            let starting = idle_group_beside(&parents[2]);
            match set_up_idle_group(&starting) {
                Ok(()) => found.starting_cpu = Some(starting),
                Err(error) => tracing::warn!(
                    %error,
                    "no idle CPU group for VMs started ahead of demand: they start as any VM"
                ),
            }
        }
        Ok(found)
    }

    fn parents(&self) -> Vec<&Path> {
        match &self.hierarchy {
            Hierarchy::V2(parent) => vec![parent.as_path()],
            Hierarchy::V1(parents) => parents.iter().map(PathBuf::as_path).collect(),
        }
    }

    /// A short description for the start-up report.
    pub fn describe(&self) -> String {
        match &self.hierarchy {
            Hierarchy::V2(parent) => format!("cgroup v2 ({})", parent.display()),
            Hierarchy::V1(parents) => {
                format!("cgroup v1 controllers memory, pids and cpu ({})", parents[0].display())
            }
        }
    }

    /// Makes group `name` with `limits`; with `note_in` (a directory of ours, a
    /// browser's), noted there so that `VmCgroup::noted` finds it again after a restart.
    /// A `background` VM runs at idle priority until it is promoted.
    pub fn create(
        &self, name: &str, limits: VmLimits, note_in: Option<&Path>, background: bool,
    ) -> std::io::Result<VmCgroup> {
        let dirs: Vec<PathBuf> = self.parents().iter().map(|parent| parent.join(name)).collect();
        let v2 = matches!(self.hierarchy, Hierarchy::V2(_));
        let group = VmCgroup {
            v2,
            dirs,
            starting_cpu: background.then(|| self.starting_cpu.clone()).flatten(),
        };
        // Noted first: whatever is made below is found and removed again.
        if let Some(dir) = note_in {
            let note: String = group.dirs.iter().map(|d| format!("{}\n", d.display())).collect();
            std::fs::write(dir.join(NOTE_FILE), note)?;
        }
        for dir in &group.dirs {
            match std::fs::create_dir(dir) {
                Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(error);
                }
                _ => {}
            }
        }
        group.apply(limits)?;
        if background && v2 {
            // Best effort: without `cpu.idle` (kernels before 5.15) it starts as any VM.
            let _ = std::fs::write(group.file("cpu", "cpu.idle"), "1");
        }
        Ok(group)
    }
}

/// One VM's control group (a directory per hierarchy).
#[derive(Debug)]
pub struct VmCgroup {
    v2: bool,
    dirs: Vec<PathBuf>,
    /// v1: the shared idle CPU group the VM enters at launch instead of its own, when it
    /// is started ahead of demand.
    starting_cpu: Option<PathBuf>,
}

impl VmCgroup {
    /// The group noted in `browser_dir`, if any.
    pub fn noted(browser_dir: &Path) -> Option<Self> {
        let note = std::fs::read_to_string(browser_dir.join(NOTE_FILE)).ok()?;
        let dirs: Vec<PathBuf> = note.lines().map(PathBuf::from).collect();
        // One directory in the unified hierarchy, or one per v1 controller.
        let v2 = dirs.len() == 1;
        (!dirs.is_empty()).then_some(Self { v2, dirs, starting_cpu: None })
    }

    /// The group's directory in `controller`'s hierarchy (its one directory in v2).
    fn dir(&self, controller: &str) -> &Path {
        if self.v2 {
            return &self.dirs[0];
        }
        let index = V1_CONTROLLERS.iter().position(|c| *c == controller).unwrap_or(0);
        &self.dirs[index]
    }

    fn file(&self, controller: &str, name: &str) -> PathBuf {
        self.dir(controller).join(name)
    }

    /// Changes the group's CPU weight (cgroup v2's scale).
    pub fn set_cpu_weight(&self, weight: u64) -> std::io::Result<()> {
        let weight = weight.clamp(1, 10_000);
        let (name, value) = match self.v2 {
            true => ("cpu.weight", weight),
            // v1's shares: 1024 is the default, as 100 is v2's weight.
            false => ("cpu.shares", (weight * 1024 / 100).max(2)),
        };
        std::fs::write(self.file("cpu", name), value.to_string())
    }

    fn apply(&self, limits: VmLimits) -> std::io::Result<()> {
        let write = |controller: &str, name: &str, value: String| {
            std::fs::write(self.file(controller, name), value).map_err(|error| {
                std::io::Error::new(error.kind(), format!("setting {name}: {error}"))
            })
        };
        if self.v2 {
            write("memory", "memory.max", limits.memory_bytes.to_string())?;
            // Swap would let a VM hold more than its limit in memory-backed files.
            let _ = write("memory", "memory.swap.max", "0".into());
            write("pids", "pids.max", limits.max_tasks.to_string())?;
        } else {
            write("memory", "memory.limit_in_bytes", limits.memory_bytes.to_string())?;
            // Absent when the kernel does not account swap.
            let _ = write("memory", "memory.memsw.limit_in_bytes", limits.memory_bytes.to_string());
            write("pids", "pids.max", limits.max_tasks.to_string())?;
        }
        self.set_cpu_weight(limits.cpu_weight).map_err(|error| {
            std::io::Error::new(error.kind(), format!("setting the CPU weight: {error}"))
        })
    }

    /// Descriptors that move the process writing `0` to them into this group: opened
    /// here, written by the sandbox's first process before it drops privileges or forks.
    /// That process is a child between fork and exec, so its one thread is all of it:
    /// in v1 it enters through `tasks`, which moves the calling thread alone. Through
    /// `cgroup.procs` the kernel takes its global lock on every thread group first, and
    /// that lock's first taking in a while waits out an RCU grace period: 10-15 ms of
    /// each launch on this host, against 0.05 ms through `tasks`.
    pub fn entry_points(&self) -> std::io::Result<Vec<OwnedFd>> {
        let file = if self.v2 { "cgroup.procs" } else { "tasks" };
        let cpu = V1_CONTROLLERS.iter().position(|c| *c == "cpu");
        self.dirs
            .iter()
            .enumerate()
            .map(|(index, dir)| match &self.starting_cpu {
                Some(starting) if !self.v2 && Some(index) == cpu => starting,
                _ => dir,
            })
            .map(|dir| {
                std::fs::OpenOptions::new().write(true).open(dir.join(file)).map(OwnedFd::from)
            })
            .collect()
    }

    /// Ends the idle priority of a VM started ahead of demand: from now on it gets
    /// `weight` like any VM. In v2 its group stops being idle (which resets the weight, so
    /// it is written again). In v1 its processes move from the shared idle group to its
    /// own CPU group: each one whose threads are still there (its memory group lists the
    /// VM's threads) is written to `cgroup.procs`, which moves all its threads at once,
    /// until none of the VM's threads is left there (a process forked meanwhile by one
    /// not yet moved shows up in the next reading; one forked by a moved process starts
    /// in the right group). Harmless for a VM that never had it, or was promoted already.
    pub fn promote(&self, weight: u64) -> std::io::Result<()> {
        if self.v2 {
            match std::fs::write(self.file("cpu", "cpu.idle"), "0") {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
                _ => return self.set_cpu_weight(weight),
            }
        }
        let own = self.file("cpu", "cgroup.procs");
        let vms = self.dir("cpu").parent().unwrap_or(self.dir("cpu"));
        let starting = idle_group_beside(vms).join("tasks");
        let mut failures = Vec::new();
        for _ in 0..PROMOTION_READINGS {
            let vm_threads: std::collections::HashSet<i32> =
                read_ids(&self.file("memory", "tasks"))?.into_iter().collect();
            let left: Vec<i32> = read_ids(&starting)?
                .into_iter()
                .filter(|tid| vm_threads.contains(tid))
                .filter(|tid| !failures.iter().any(|(failed, _)| failed == tid))
                .collect();
            if left.is_empty() {
                break;
            }
            for tid in left {
                // Writing any thread's id to `cgroup.procs` moves its whole process.
                if let Err(error) = std::fs::write(&own, tid.to_string())
                    && error.raw_os_error() != Some(libc::ESRCH)
                {
                    failures.push((tid, error));
                }
            }
        }
        match failures.pop() {
            None => Ok(()),
            Some((tid, error)) => Err(std::io::Error::new(
                error.kind(),
                format!("{} threads stay idle, thread {tid}: {error}", failures.len() + 1),
            )),
        }
    }

    /// Whether the kernel killed a process of the VM for going over its memory.
    pub fn out_of_memory(&self) -> bool {
        let (file, key) = if self.v2 {
            ("memory.events", "oom_kill")
        } else {
            ("memory.oom_control", "oom_kill")
        };
        let Ok(text) = std::fs::read_to_string(self.file("memory", file)) else {
            return false;
        };
        text.lines().any(|line| {
            line.split_once(' ').is_some_and(|(name, count)| name == key && count.trim() != "0")
        })
    }

    /// The memory limit in force, in bytes.
    pub fn memory_limit(&self) -> Option<u64> {
        let name = if self.v2 { "memory.max" } else { "memory.limit_in_bytes" };
        std::fs::read_to_string(self.file("memory", name)).ok()?.trim().parse().ok()
    }

    /// Removes the group, killing what is still in it: whatever of a VM outlived its
    /// sandbox's first process (one that escaped `--die-with-parent` by being forked just
    /// as its parent was killed, say) is a leak, never a survivor.
    pub async fn remove(&self) {
        for dir in &self.dirs {
            for _ in 0..100 {
                match std::fs::remove_dir(dir) {
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => break,
                    Ok(()) => break,
                    Err(_) => {
                        self.kill_remaining();
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    }
                }
            }
        }
    }

    /// Sends SIGKILL to every process in the group. A process forked meanwhile is caught
    /// by the next call (`remove` calls it until the group is empty).
    pub fn kill_remaining(&self) {
        if self.v2 && std::fs::write(self.dirs[0].join("cgroup.kill"), "1").is_ok() {
            return;
        }
        self.signal_all(Signal::SIGKILL);
    }

    /// Sends `signal` to every process in the group; answers to how many.
    pub fn signal_all(&self, signal: Signal) -> usize {
        self.signal_all_but(signal, &[])
    }

    /// Sends `signal` to every process in the group but `spared`; answers to how many.
    pub fn signal_all_but(&self, signal: Signal, spared: &[i32]) -> usize {
        let mut signalled: std::collections::HashSet<i32> = spared.iter().copied().collect();
        let before = signalled.len();
        self.signal_new(signal, &mut signalled);
        signalled.len() - before
    }

    /// Sends `signal` to the group's processes not in `signalled`, and adds them to it;
    /// answers whether there was any.
    fn signal_new(&self, signal: Signal, signalled: &mut std::collections::HashSet<i32>) -> bool {
        let mut any = false;
        for pid in self.dirs.iter().flat_map(|dir| processes_in(dir)) {
            if !signalled.contains(&pid)
                && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).is_ok()
            {
                signalled.insert(pid);
                any = true;
            }
        }
        any
    }

    /// Stops every process of the group (SIGSTOP) and waits, up to `bound`, until each
    /// one has stopped or is gone; answers how many were stopped. A stop takes effect
    /// only when its target next runs, and a process may fork between the read of the
    /// group and its stop: the group is read again until no new process turns up after
    /// every one signalled was seen stopped (a stopped process forks no more, and a
    /// child is in the group before its parent's fork returns).
    pub async fn stop_all(&self, bound: std::time::Duration) -> usize {
        let deadline = tokio::time::Instant::now() + bound;
        let mut signalled = std::collections::HashSet::new();
        loop {
            // Checked before the group is read again: a child forked before its parent
            // stopped is then in that read. One still running is stopped again (its pid
            // may be a new process's, reused since).
            let running: Vec<i32> =
                signalled.iter().copied().filter(|pid| !stopped_or_gone(*pid)).collect();
            for pid in &running {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), Signal::SIGSTOP);
            }
            let settled = running.is_empty();
            let fresh = self.signal_new(Signal::SIGSTOP, &mut signalled);
            let all_stopped = settled && !fresh;
            if all_stopped || tokio::time::Instant::now() >= deadline {
                if !all_stopped {
                    tracing::warn!(group = ?self.dirs, "a VM's processes did not all stop in time");
                }
                return signalled.len();
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}

/// The v1 idle CPU group beside `vms`, the VMs' CPU group.
fn idle_group_beside(vms: &Path) -> PathBuf {
    vms.with_file_name(STARTING_VMS_GROUP)
}

/// Makes the v1 group `dir` and marks it idle: it takes only CPU time nothing beside it
/// wants. Without `cpu.idle` (kernels before 5.15), the lowest weight there is.
fn set_up_idle_group(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if std::fs::write(dir.join("cpu.idle"), "1").is_err() {
        std::fs::write(dir.join("cpu.shares"), "2")?;
    }
    Ok(())
}

/// The ids (processes or threads) listed in a group file such as `tasks`.
fn read_ids(file: &Path) -> std::io::Result<Vec<i32>> {
    Ok(std::fs::read_to_string(file)?.lines().filter_map(|line| line.trim().parse().ok()).collect())
}

/// The processes (thread-group ids) in the group directory `dir` of one hierarchy.
fn processes_in(dir: &Path) -> Vec<i32> {
    read_ids(&dir.join("cgroup.procs")).unwrap_or_default()
}

/// Whether every thread of process `pid` is stopped (or a zombie), or the process is gone.
fn stopped_or_gone(pid: i32) -> bool {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    threads.flatten().all(|thread| {
        std::fs::read_to_string(thread.path().join("stat")).map_or(true, |stat| {
            // The state follows the command name, which is in parentheses and may
            // itself hold any character.
            let state =
                stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
            matches!(state, Some('T' | 't' | 'Z' | 'X') | None)
        })
    })
}

/// Moves the calling process into the groups of `entry_points`. Only what is
/// async-signal-safe: it runs between fork and exec, in a child whose one thread is the
/// caller (which is why a v1 `tasks` entry moves all of it).
pub fn enter(entry_points: &[std::os::fd::RawFd]) -> std::io::Result<()> {
    for fd in entry_points {
        // SAFETY: write(2) on a descriptor we hold, from a static buffer.
        if unsafe { libc::write(*fd, b"0".as_ptr().cast(), 1) } != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The raw descriptors of `fds`.
pub fn raw(fds: &[OwnedFd]) -> Vec<std::os::fd::RawFd> {
    fds.iter().map(AsRawFd::as_raw_fd).collect()
}

/// The parent of VM groups in the unified hierarchy, if this service's group there has
/// the memory, pids and cpu controllers (and can hand them to the groups below it).
fn v2_parent(own: &str) -> Result<PathBuf, String> {
    let relative = own
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .ok_or("this process is in no cgroup v2 group")?;
    let root = Path::new("/sys/fs/cgroup");
    let mine = root.join(relative.trim_start_matches('/'));
    let available = std::fs::read_to_string(mine.join("cgroup.controllers")).unwrap_or_default();
    if let Some(missing) =
        V2_CONTROLLERS.iter().find(|c| !available.split_whitespace().any(|a| a == **c))
    {
        return Err(format!("the {missing} controller is not delegated to {}", mine.display()));
    }
    let parent = mine.join(VM_GROUPS);
    std::fs::create_dir_all(&parent).map_err(|error| format!("{}: {error}", parent.display()))?;
    let enable: String = V2_CONTROLLERS.iter().map(|c| format!("+{c} ")).collect();
    // Our own group must hand the controllers down first (possible for the root group,
    // or a delegated one without processes of its own).
    for dir in [&mine, &parent] {
        std::fs::write(dir.join("cgroup.subtree_control"), enable.trim())
            .map_err(|error| format!("enabling controllers in {}: {error}", dir.display()))?;
    }
    Ok(parent)
}

/// The parents of VM groups in the v1 memory, pids and cpu hierarchies.
fn v1_parents(own: &str) -> Result<[PathBuf; 3], String> {
    let parent = |controller: &str| -> Result<PathBuf, String> {
        let relative =
            v1_group(own, controller).ok_or_else(|| format!("no v1 {controller} hierarchy"))?;
        let mount = Path::new("/sys/fs/cgroup").join(controller);
        if !mount.join("cgroup.procs").exists() {
            return Err(format!("{} is not mounted", mount.display()));
        }
        let dir = mount.join(relative.trim_start_matches('/')).join(VM_GROUPS);
        // Writable: not a read-only mount of someone else's hierarchy.
        if nix::unistd::access(&mount, nix::unistd::AccessFlags::W_OK).is_err() {
            return Err(format!("{} is not writable", mount.display()));
        }
        Ok(dir)
    };
    Ok([parent("memory")?, parent("pids")?, parent("cpu")?])
}

/// This process's group in the v1 hierarchy of `controller`, from `/proc/self/cgroup`.
fn v1_group<'a>(own: &'a str, controller: &str) -> Option<&'a str> {
    own.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        controllers.split(',').any(|c| c == controller).then_some(path)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_v1_groups_of_a_hybrid_host() {
        let own = "9:name=systemd:/\n4:memory:/svc/a\n1:cpu,cpuacct:/\n8:pids:/\n0::/\n";
        assert_eq!(v1_group(own, "memory"), Some("/svc/a"));
        assert_eq!(v1_group(own, "cpu"), Some("/"));
        assert_eq!(v1_group(own, "cpuacct"), Some("/"));
        assert_eq!(v1_group(own, "blkio"), None);
        assert_eq!(v1_group(own, "systemd"), None);
    }

    /// A group of this test process's own, or none where the host has no control groups.
    fn test_group(purpose: &str) -> Option<VmCgroup> {
        group_started(purpose, false)
    }

    /// As `test_group`, for a VM started ahead of demand (`background`).
    fn group_started(purpose: &str, background: bool) -> Option<VmCgroup> {
        let cgroups = match VmCgroups::detect() {
            Ok(cgroups) => cgroups,
            Err(why) => {
                eprintln!("no control groups on this host ({why}): nothing to test");
                return None;
            }
        };
        let name = format!("test-{purpose}-{}", std::process::id());
        let limits = VmLimits { memory_bytes: 256 << 20, max_tasks: 512, cpu_weight: 100 };
        Some(cgroups.create(&name, limits, None, background).unwrap())
    }

    /// `sh -c script`, started in `group`.
    fn shell_in(group: &VmCgroup, script: &str) -> std::process::Command {
        let entry_points = group.entry_points().unwrap();
        let raw = raw(&entry_points);
        let mut command = std::process::Command::new("sh");
        command.args(["-c", script]);
        command.stdout(std::process::Stdio::piped());
        // SAFETY: `enter` only writes to descriptors the closure keeps open.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                let _open = &entry_points;
                enter(&raw)
            });
        }
        command
    }

    #[tokio::test]
    async fn stopping_a_group_stops_what_it_forks_meanwhile() {
        let Some(group) = test_group("stop") else {
            return;
        };
        // Forks as fast as it can, up to the group's task limit: children forked between
        // a read of the group and their parent's stop would run on.
        let mut shell = shell_in(
            &group,
            "for i in 1 2 3 4; do (while :; do sleep 0.5 & done 2>/dev/null) & done; wait",
        )
        .spawn()
        .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let stopped = group.stop_all(std::time::Duration::from_secs(5)).await;
        let members = || -> Vec<i32> { group.dirs.iter().flat_map(|d| processes_in(d)).collect() };
        // Stopped when it answers, not some time after.
        let at_stop = members();
        let running: Vec<i32> =
            at_stop.iter().copied().filter(|pid| !stopped_or_gone(*pid)).collect();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let later = members();
        group.remove().await;
        shell.wait().unwrap();
        assert!(stopped > 1, "the shell and its children were stopped ({stopped})");
        assert!(running.is_empty(), "still running after the stop: {running:?}");
        assert!(
            later.iter().all(|pid| at_stop.contains(pid)),
            "forked after the stop: {later:?} vs {at_stop:?}"
        );
    }

    /// The CPU group (v1) of every thread of process `pid`.
    fn cpu_groups_of_threads(pid: u32) -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .map(|thread| {
                let cgroup = std::fs::read_to_string(thread.path().join("cgroup")).unwrap();
                v1_group(&cgroup, "cpu").unwrap_or_default().to_owned()
            })
            .collect()
    }

    #[tokio::test]
    async fn a_vm_started_ahead_of_demand_runs_idle_until_promoted() {
        let Some(group) = group_started("promote", true) else {
            return;
        };
        if group.v2 {
            group.promote(100).unwrap();
            let idle = std::fs::read_to_string(group.file("cpu", "cpu.idle")).unwrap_or_default();
            group.remove().await;
            assert_ne!(idle.trim(), "1", "promoted, the group is not idle any more");
            return;
        }
        let starting = group.starting_cpu.clone().expect("a starting CPU group");
        let idle = std::fs::read_to_string(starting.join("cpu.idle")).unwrap_or_default();
        let shares = std::fs::read_to_string(starting.join("cpu.shares")).unwrap_or_default();
        // A shell and two children, all started in the starting group.
        let mut shell = shell_in(&group, "sleep 30 & sleep 30 & wait").spawn().unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let own = group.dirs[2].to_string_lossy().into_owned();
        let before: Vec<String> = processes_in(&group.dirs[0])
            .into_iter()
            .flat_map(|pid| cpu_groups_of_threads(pid as u32))
            .collect();
        group.promote(100).unwrap();
        let members = processes_in(&group.dirs[0]);
        let after: Vec<String> =
            members.iter().flat_map(|pid| cpu_groups_of_threads(*pid as u32)).collect();
        let in_own_cpu_group = processes_in(&group.dirs[2]);
        shell.kill().unwrap();
        group.remove().await;
        shell.wait().unwrap();
        assert!(idle.trim() == "1" || shares.trim() == "2", "idle: {idle}, shares: {shares}");
        assert_eq!(members.len(), 3, "the shell and its two sleeps: {members:?}");
        let starting_name = starting.file_name().unwrap().to_string_lossy().into_owned();
        assert!(before.iter().all(|g| g.ends_with(&starting_name)), "{before:?}");
        assert!(after.iter().all(|g| own.ends_with(g.as_str())), "{after:?} vs {own}");
        assert_eq!(in_own_cpu_group.len(), members.len());
    }

    #[tokio::test]
    async fn removing_a_group_kills_what_outlived_its_first_process() {
        let Some(group) = test_group("remove") else {
            return;
        };
        // An orphan in the making: the shell exits, its background sleep stays.
        let output = shell_in(&group, "sleep 300 >/dev/null 2>&1 & echo $!").output().unwrap();
        let orphan: i32 = String::from_utf8_lossy(&output.stdout).trim().parse().unwrap();
        let proc_dir = PathBuf::from(format!("/proc/{orphan}"));
        assert!(proc_dir.exists(), "the orphan runs");
        group.remove().await;
        assert!(group.dirs.iter().all(|dir| !dir.exists()), "the group is gone");
        // Killed; reaped by init (whose zombie, if any, has no command line left).
        let cmdline = std::fs::read(proc_dir.join("cmdline")).unwrap_or_default();
        assert!(cmdline.is_empty(), "{}", String::from_utf8_lossy(&cmdline));
    }
}

//! Gives the memory a burst of load freed back to the system. glibc's allocator keeps
//! what is freed in its per-thread arenas for reuse and returns little of it on its own,
//! so a long-running server that served a burst would hold its peak for good (the soak
//! bench saw 7 MiB of anonymous memory kept after a 3-minute load whose live heap grew
//! by under 1 MiB). Every `EVERY`, the allocator is asked to release its free pages
//! (`malloc_trim`): a walk over a few MiB of heap, off the async workers.
//!
//! glibc also gives each thread that meets contention an arena of its own (up to eight
//! per core), and a trim only returns whole free pages: every arena keeps its partly
//! used ones. With one arena per core (on 2 cores), the soak's held-but-free memory grew
//! by 0.9 MiB over 20 minutes instead of 3.4. Fewer arenas mean more threads sharing
//! one, which matters little here: a control plane's threads mostly wait on sockets.

use std::time::Duration;

const EVERY: Duration = Duration::from_secs(30);

/// Caps the allocator's arenas at one per core (at least 2); called first in `main`,
/// before any thread exists, so no thread has been given an arena of its own yet.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(2, |cores| cores.get());
        let arenas = i32::try_from(cores.max(2)).unwrap_or(i32::MAX);
        // SAFETY: mallopt only sets one of the allocator's parameters, under its lock.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
}

/// Runs for the life of the process.
pub fn start_trimming() {
    tokio::spawn(async {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let _ = tokio::task::spawn_blocking(release_free_memory).await;
        }
    });
}

/// Hands the allocator's free pages back to the system; a no-op where the allocator is
/// not glibc's.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only reorganizes the allocator's own free lists, under its locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The heap as the allocator counts it, in bytes.
pub struct HeapUsage {
    /// Holding live allocations.
    pub in_use: u64,
    /// Taken from the system: in use, or free and kept for reuse.
    pub held: u64,
}

/// The allocator's own account of the heap: how much of what it holds is live. RSS that
/// grows while `in_use` does not is free memory kept in its arenas, not a leak. `None`
/// where the allocator is not glibc's.
pub fn heap_usage() -> Option<HeapUsage> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters, under its locks.
        let info = unsafe { libc::mallinfo2() };
        Some(HeapUsage {
            in_use: (info.uordblks + info.hblkhd) as u64,
            held: (info.arena + info.hblkhd) as u64,
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn anonymous_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("status");
        let line = status.lines().find(|line| line.starts_with("RssAnon:")).expect("RssAnon");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn freed_memory_goes_back_to_the_system() {
        // 64 MiB in small blocks, from a thread of its own (an arena of its own, as a
        // request's task would have), every sixteenth kept: the rest is freed in holes
        // between live blocks, which glibc keeps.
        let kept_blocks = std::thread::spawn(|| {
            let blocks: Vec<Vec<u8>> = (0..65_536).map(|i| vec![i as u8; 1024]).collect();
            blocks.into_iter().step_by(16).collect::<Vec<_>>()
        })
        .join()
        .unwrap();
        let kept = anonymous_kib();
        release_free_memory();
        let after = anonymous_kib();
        assert_eq!(kept_blocks.len(), 4096);
        assert!(
            kept.saturating_sub(after) > 32 * 1024,
            "RssAnon {kept} KiB before the trim, {after} KiB after"
        );
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn the_heap_in_use_counts_live_data_only() {
        const MIB: u64 = 1024 * 1024;
        let before = heap_usage().expect("glibc").in_use;
        let block = vec![7u8; 64 * MIB as usize];
        let during = heap_usage().expect("glibc");
        drop(block);
        let after = heap_usage().expect("glibc").in_use;
        // Other tests allocate meanwhile: a margin of 16 MiB either way.
        assert!(during.in_use >= before + 48 * MIB, "{before} then {}", during.in_use);
        assert!(during.held >= during.in_use);
        assert!(after + 48 * MIB <= during.in_use, "{} then {after}", during.in_use);
    }
}

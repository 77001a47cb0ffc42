//! Facts about local processes, read from /proc.

use std::path::Path;

/// Whether `pid` is a running (not zombie) process.
pub fn is_running(pid: i64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state letter follows the parenthesised command name, which may contain spaces.
    let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
    !matches!(state, None | Some('Z') | Some('X'))
}

/// Whether `pid` is a browser agent serving `vm_root`, or the sandbox holding it: guards
/// against signalling an unrelated process that reused a recorded pid.
pub fn is_agent_for(pid: i64, vm_root: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let arguments: Vec<&[u8]> = cmdline.split(|byte| *byte == 0).collect();
    let root = vm_root.as_os_str().as_encoded_bytes();
    let is_agent = arguments
        .first()
        .is_some_and(|program| program.ends_with(b"browser-agent") || program.ends_with(b"bwrap"));
    is_agent && arguments.contains(&root)
}

/// The process group of `pid`.
pub fn process_group(pid: i64) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name: state, ppid, pgrp.
    stat.rsplit_once(") ")?.1.split_whitespace().nth(2)?.parse().ok()
}

/// Live members of process group `group` whose command line mentions `path`: what is
/// left of an agent's group after the agent itself died (a recording's encoder). Checking
/// the command line keeps an unrelated group that reused the number out of reach.
pub fn group_members_mentioning(group: i64, path: &Path) -> Vec<i64> {
    let needle = path.as_os_str().as_encoded_bytes();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i64>().ok())
        .filter(|&pid| {
            let in_group = process_group(pid) == Some(group);
            in_group
                && is_running(pid)
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|cmdline| cmdline.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

//! Facts about local processes, read from /proc.

use std::path::Path;

/// Whether `pid` is a running (not zombie) process.
pub fn is_running(pid: i64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state letter follows the parenthesised command name, which may contain spaces.
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    !matches!(state, None | Some('Z') | Some('X'))
}

/// Whether `pid` is a browser agent serving `vm_root`: guards against signalling an
/// unrelated process that reused a recorded pid.
pub fn is_agent_for(pid: i64, vm_root: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let arguments: Vec<&[u8]> = cmdline.split(|byte| *byte == 0).collect();
    let root = vm_root.as_os_str().as_encoded_bytes();
    let is_agent = arguments
        .first()
        .is_some_and(|program| program.ends_with(b"browser-agent"));
    is_agent && arguments.contains(&root)
}

//! Generated gRPC code for the browser agent contract (`browser_agent.v1`).

pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, clippy::unwrap_used, clippy::expect_used)]
    tonic::include_proto!("browser_agent.v1");
}

/// Metadata key that carries the agent credential on every call.
pub const AUTHORIZATION_METADATA: &str = "authorization";

/// File names of a recording in an agent's recordings directory. Runtimes that can reach
/// that directory collect from it the recordings of agents that died.
pub mod recording_files {
    /// While recording: fragmented MP4, playable up to its last complete fragment.
    pub fn in_progress(recording_id: &str) -> String {
        format!("{recording_id}.recording.mp4")
    }

    /// Once finished: a regular MP4 with its index at the front.
    pub fn finished(recording_id: &str) -> String {
        format!("{recording_id}.mp4")
    }
}

/// Agents of local VMs listen on a Unix socket in their browser's directory. A socket's
/// path must fit in 108 bytes, and data directories can be deeper than that; both sides
/// therefore name the socket through an open handle on its directory.
pub mod unix_socket {
    use std::fs::File;
    use std::io;
    use std::os::fd::AsRawFd;
    use std::path::{Path, PathBuf};

    /// A short path to `socket` (`/proc/self/fd/<fd>/<name>`), valid while it lives.
    pub struct ShortPath {
        _directory: File,
        pub path: PathBuf,
    }

    /// Beside the agent's socket: where a local VM's agent hands the control plane
    /// DevTools WebSockets already open to Chromium (a file descriptor per request).
    pub const DEVTOOLS_HANDOFF_FILE: &str = "devtools.sock";

    pub fn short_path(socket: &Path) -> io::Result<ShortPath> {
        let (Some(directory), Some(name)) = (socket.parent(), socket.file_name()) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a socket path", socket.display()),
            ));
        };
        let directory =
            File::open(if directory.as_os_str().is_empty() { Path::new(".") } else { directory })?;
        let path = Path::new("/proc/self/fd").join(directory.as_raw_fd().to_string()).join(name);
        Ok(ShortPath { _directory: directory, path })
    }
}

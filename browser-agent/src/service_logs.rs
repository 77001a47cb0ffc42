//! The logs of the VM's own services (`logs/stream?source=supervisor`): the agent's log,
//! Chromium's, Xvfb's, the Playwright executors', chromedriver's and PulseAudio's output, each appended to a file of its own in the scratch
//! directory (outside the VM root), which a stream then follows like any file. A file
//! past `MAX_BYTES` starts again from empty (followers start again from its top).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The services whose logs can be streamed.
pub const SERVICES: [&str; 6] =
    ["agent", "chromium", "xvfb", "playwright", "webdriver", "pulseaudio"];
const MAX_BYTES: u64 = 8 * 1024 * 1024;

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// Where the logs go; once, at start.
pub fn init(dir: PathBuf) -> std::io::Result<()> {
    std::fs::create_dir_all(&dir)?;
    let _ = DIR.set(dir);
    Ok(())
}

/// The log file of a service, if it is one.
pub fn path(service: &str) -> Option<PathBuf> {
    SERVICES
        .contains(&service)
        .then(|| DIR.get().map(|dir| dir.join(format!("{service}.log"))))
        .flatten()
}

/// An open handle to append to (Xvfb's stderr, say).
pub fn file(service: &str) -> Option<std::fs::File> {
    let path = path(service)?;
    OpenOptions::new().create(true).append(true).open(path).ok()
}

/// Appends to the service's log (best effort: a log that cannot be written is skipped).
pub fn append(service: &str, bytes: &[u8]) {
    let Some(path) = path(service) else {
        return;
    };
    let full = std::fs::metadata(&path).is_ok_and(|m| m.len() > MAX_BYTES);
    let mut options = OpenOptions::new();
    options.create(true);
    if full {
        options.write(true).truncate(true);
    } else {
        options.append(true);
    }
    let file = options.open(path);
    if let Ok(mut file) = file {
        let _ = file.write_all(bytes);
    }
}

/// A `tracing` writer that appends to a service's log.
pub struct Writer(pub &'static str);

impl Write for Writer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        append(self.0, bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

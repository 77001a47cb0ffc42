//! The live view's sound: one ffmpeg per VM reading the sound server's monitor as 16-bit
//! PCM, shared by every viewer that unmuted, started by the first and ended (killed and
//! reaped) once the last has gone.

use std::io::Read;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

/// What viewers get: 24 kHz stereo, plenty for a browser's sound at a quarter of CD's
/// bandwidth (96 KB/s).
pub const RATE: u32 = 24_000;
pub const CHANNELS: u32 = 2;
/// 20 ms of sound per chunk.
const CHUNK_BYTES: usize = (RATE * CHANNELS * 2 / 50) as usize;
/// Chunks a listener may be behind before it skips some.
const BACKLOG: usize = 16;

pub type Chunk = Arc<Vec<u8>>;

pub struct LiveAudio {
    ffmpeg: String,
    running: Mutex<Option<Running>>,
}

struct Running {
    chunks: broadcast::Sender<Chunk>,
    /// The capturing ffmpeg, to end it (and so every listener's stream) at once.
    pid: u32,
}

impl LiveAudio {
    pub fn new(ffmpeg: String) -> Self {
        Self { ffmpeg, running: Mutex::new(None) }
    }

    /// Joins the running capture, or starts it. Blocking (it starts a process).
    pub fn subscribe(self: &Arc<Self>) -> Result<broadcast::Receiver<Chunk>, String> {
        let mut running =
            self.running.lock().map_err(|_| "the live audio's lock is poisoned".to_owned())?;
        if let Some(running) = running.as_ref() {
            return Ok(running.chunks.subscribe());
        }
        let mut child = crate::sound::capture_pcm(&self.ffmpeg, RATE, CHANNELS, Stdio::null())
            .map_err(|error| format!("starting the sound capture: {error}"))?;
        let stdout =
            child.stdout.take().ok_or_else(|| "the sound capture has no output".to_owned())?;
        let (chunks, receiver) = broadcast::channel(BACKLOG);
        let pid = child.id();
        let capture = Capture { hub: self.clone(), child, chunks: chunks.clone() };
        std::thread::Builder::new()
            .name("live-audio".into())
            .spawn(move || capture.run(stdout))
            .map_err(|error| format!("starting the sound capture: {error}"))?;
        *running = Some(Running { chunks, pid });
        Ok(receiver)
    }

    /// Ends the capture: its listeners' streams close once ffmpeg is gone.
    pub fn disconnect_all(&self) {
        if let Ok(mut running) = self.running.lock()
            && let Some(running) = running.take()
        {
            // Reaped by the capture thread, which reads EOF now.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(running.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

struct Capture {
    hub: Arc<LiveAudio>,
    child: std::process::Child,
    chunks: broadcast::Sender<Chunk>,
}

impl Capture {
    fn run(self, mut stdout: std::process::ChildStdout) {
        let mut buffer = vec![0; CHUNK_BYTES];
        loop {
            // ffmpeg writes continuously (silence too): a whole chunk arrives every 20 ms.
            if stdout.read_exact(&mut buffer).is_err() {
                return;
            }
            let chunk = buffer.clone();
            // Under the hub's lock, so no listener joins a capture about to end.
            if let Ok(mut running) = self.hub.running.lock()
                && self.chunks.receiver_count() == 0
            {
                if running.as_ref().is_some_and(|r| r.chunks.same_channel(&self.chunks)) {
                    *running = None;
                }
                return;
            }
            let _ = self.chunks.send(Arc::new(chunk));
        }
    }
}

impl Drop for Capture {
    /// However the capture ends, the hub forgets it, then ffmpeg is killed and reaped (in
    /// this order: `disconnect_all` signals the pid it finds in the hub, which must not
    /// have been reaped and reused yet).
    fn drop(&mut self) {
        if let Ok(mut running) = self.hub.running.lock()
            && running.as_ref().is_some_and(|running| running.chunks.same_channel(&self.chunks))
        {
            *running = None;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

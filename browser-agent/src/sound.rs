//! The VM's own sound: a PulseAudio daemon of the VM's user with one null sink, started
//! with the display. Chromium (and anything else in the VM) plays into the sink; its
//! monitor is what recordings with `record_audio` and the live view's sound capture.
//! Nothing reaches the host's audio: the daemon has no device and speaks only on a socket
//! in the VM: in its state directory (the VM's scratch directory), or, where tenant code
//! runs apart from the agent and cannot enter that, in `TENANT_SOCKET_DIR`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::process::StdGroupLeader;

/// The PulseAudio source that carries what the VM plays.
pub const MONITOR_SOURCE: &str = "vm.monitor";
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Where the socket is when tenant processes (Chromium) must reach it: a directory of the
/// agent's in the VM's own `/tmp`, which tenants may pass through but not change.
const TENANT_SOCKET_DIR: &str = "/tmp/.vm-sound";
/// The sink's format, which captures read.
const SINK_RATE: u32 = 48_000;
/// What PulseAudio hands a capture at once: 10 ms of the sink's stereo 16-bit sound,
/// not a second of it.
const CAPTURE_FRAGMENT_BYTES: u32 = SINK_RATE / 100 * 2 * 2;

/// Starts an ffmpeg of the agent reading what the VM plays (the sink's monitor) as raw
/// 16-bit PCM at `rate` Hz with `channels`, on its stdout; its messages go to `stderr`.
/// The caller kills and reaps it.
pub fn capture_pcm(
    ffmpeg: &str, rate: u32, channels: u32, stderr: std::process::Stdio,
) -> std::io::Result<std::process::Child> {
    let mut command = std::process::Command::new(ffmpeg);
    crate::identity::as_agent(&mut command);
    crate::identity::without_agent_secrets(&mut command)
        .args(["-hide_banner", "-loglevel", "error", "-nostdin"])
        .args(["-f", "pulse", "-fragment_size", &CAPTURE_FRAGMENT_BYTES.to_string()])
        .args(["-i", MONITOR_SOURCE])
        .args(["-ac", &channels.to_string(), "-ar", &rate.to_string()])
        .args(["-f", "s16le", "-flush_packets", "1", "pipe:1"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .spawn()
}

pub struct SoundServer {
    daemon: StdGroupLeader,
    socket: PathBuf,
}

impl SoundServer {
    /// Starts the daemon with its state in `dir`; [`ready`](Self::ready) waits until it
    /// accepts clients. Blocking, before any thread exists (like the display).
    pub fn spawn(pulseaudio: &str, dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let socket_dir = match crate::identity::tenant_uid() {
            Some(_) => {
                let shared = Path::new(TENANT_SOCKET_DIR);
                std::fs::create_dir_all(shared)
                    .with_context(|| format!("creating {}", shared.display()))?;
                // The agent's, not the tenant's it creates files as (`identity`).
                std::os::unix::fs::chown(shared, Some(0), Some(0))?;
                std::fs::set_permissions(
                    shared,
                    std::os::unix::fs::PermissionsExt::from_mode(0o755),
                )?;
                shared
            }
            None => dir,
        };
        let socket = socket_dir.join("native");
        let _ = std::fs::remove_file(&socket);
        let mut command = std::process::Command::new(pulseaudio);
        crate::identity::as_agent(&mut command);
        command
            .args(["-n", "--daemonize=no", "--use-pid-file=no", "--exit-idle-time=-1"])
            // No shared memory: the VM's clients are few and the sound is small.
            .args(["--disable-shm=yes", "--log-target=stderr", "--log-level=warning"])
            .arg(format!(
                "--load=module-native-protocol-unix socket={} auth-anonymous=1",
                socket.display()
            ))
            .arg(format!(
                "--load=module-null-sink sink_name=vm rate={SINK_RATE} sink_properties=device.description=vm"
            ))
            .env("HOME", dir)
            .env("XDG_RUNTIME_DIR", dir)
            .env("PULSE_RUNTIME_PATH", dir)
            .env("PULSE_STATE_PATH", dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        crate::identity::without_agent_secrets(&mut command);
        if let Some(log) = crate::service_logs::file("pulseaudio") {
            command.stderr(log);
        } else {
            command.stderr(std::process::Stdio::null());
        }
        let daemon = StdGroupLeader::spawn(&mut command)
            .with_context(|| format!("starting {pulseaudio}"))?;
        Ok(Self { daemon, socket })
    }

    /// Waits until the daemon's socket exists (it is created once the modules loaded).
    pub fn ready(mut self) -> anyhow::Result<Self> {
        let started = Instant::now();
        while !self.socket.exists() {
            if started.elapsed() > START_TIMEOUT {
                self.daemon.kill_now();
                bail!("the sound server did not start in {START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(self)
    }

    /// `PULSE_SERVER` for the daemon's clients.
    pub fn address(&self) -> String {
        format!("unix:{}", self.socket.display())
    }

    pub async fn stop(mut self) {
        self.daemon.terminate(Duration::from_millis(500)).await;
    }
}

//! The X display of a headful browser: an Xvfb server that the agent starts and owns.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::process::StdGroupLeader;

pub struct Display {
    /// Such as ":3".
    pub name: String,
    xvfb: StdGroupLeader,
}

/// An Xvfb started, which may not serve yet: see [`Display::start`].
pub struct Starting {
    pub name: String,
    xvfb: StdGroupLeader,
    /// The `-displayfd` pipe, while Xvfb has not written its number on it yet.
    pipe: Option<std::fs::File>,
}

const START_TIMEOUT: Duration = Duration::from_secs(10);

impl Display {
    /// Starts Xvfb. Blocking, and meant to run before the agent starts any thread (the
    /// caller then exports `$DISPLAY`). `-noreset` keeps Xvfb from resetting when its last
    /// client leaves (X connections made during a reset fail). Without GLX, Xvfb starts in
    /// ~22 ms instead of ~55 ms and Chromium reaches DevTools-ready ~30 ms sooner;
    /// Chromium renders in software on Xvfb either way.
    ///
    /// With `number`, a display the VM has to itself (its `/tmp` and network namespace
    /// are its own), this returns as soon as Xvfb listens, ~6 ms after its start: a client
    /// that connects then waits until Xvfb serves, ~25 ms later (most of it compiling its
    /// keymap), so Chromium starts meanwhile instead of after. Without, `-displayfd`
    /// makes Xvfb pick a free number (no race between agents on one host), known once it
    /// serves. Either way [`Starting::ready`] waits until it serves.
    pub fn start(
        xvfb_path: &str, width: u32, height: u32, number: Option<u32>,
    ) -> anyhow::Result<Starting> {
        let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .context("creating the -displayfd pipe")?;
        let write_fd = write_end.as_raw_fd();
        let mut command = std::process::Command::new(xvfb_path);
        crate::identity::as_agent(&mut command);
        command
            .args(number.map(|number| format!(":{number}")))
            .arg("-displayfd")
            .arg(write_fd.to_string())
            .args(["-screen", "0", &format!("{width}x{height}x24")])
            .args(["-nolisten", "tcp", "-noreset", "-extension", "GLX"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        // Its messages go to its own log (`logs/stream?source=supervisor`).
        if let Some(log) = crate::service_logs::file("xvfb") {
            command.stderr(log);
        }
        // SAFETY: fcntl is async-signal-safe; it clears close-on-exec on the write end in
        // the child only, so Xvfb inherits exactly that descriptor.
        unsafe {
            command.pre_exec(move || {
                if libc::fcntl(write_fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut xvfb =
            StdGroupLeader::spawn(&mut command).with_context(|| format!("starting {xvfb_path}"))?;
        drop(write_end);
        let mut pipe = std::fs::File::from(read_end);
        // With a number of our own, the pipe is read once Xvfb serves (`ready`).
        let known = match number {
            Some(number) => wait_until_listening(&pipe, number).map(|()| (number, Some(pipe))),
            None => read_number(&mut pipe).map(|number| (number, None)),
        };
        match known {
            Ok((number, pipe)) => Ok(Starting { name: format!(":{number}"), xvfb, pipe }),
            Err(error) => {
                xvfb.kill_now();
                Err(error)
            }
        }
    }

    pub async fn stop(mut self) {
        self.xvfb.terminate(Duration::from_secs(1)).await;
    }
}

impl Starting {
    /// Waits until Xvfb serves (it has written its display number).
    pub fn ready(mut self) -> anyhow::Result<Display> {
        if let Some(mut pipe) = self.pipe.take()
            && let Err(error) = read_number(&mut pipe)
        {
            self.xvfb.kill_now();
            return Err(error);
        }
        Ok(Display { name: self.name, xvfb: self.xvfb })
    }
}

/// The number Xvfb writes on the `-displayfd` pipe once it serves ("N\n", the
/// descriptor kept open).
fn read_number(pipe: &mut std::fs::File) -> anyhow::Result<u32> {
    let mut text = String::new();
    let mut buffer = [0u8; 16];
    let deadline = Instant::now() + START_TIMEOUT;
    while !text.contains('\n') {
        if !readable(pipe, deadline.saturating_duration_since(Instant::now()))? {
            bail!("Xvfb did not report a display within {START_TIMEOUT:?}");
        }
        let read = pipe.read(&mut buffer)?;
        if read == 0 {
            bail!("Xvfb exited before reporting a display");
        }
        text.push_str(&String::from_utf8_lossy(&buffer[..read]));
    }
    text.trim().parse().context("Xvfb reported a malformed display number")
}

/// Until display `number`'s socket (the abstract one of the VM's network namespace, which
/// Xlib and xcb try first) takes connections, or Xvfb serves or ends before that
/// (`pipe`, its `-displayfd`, turns readable), which `ready` then tells apart.
fn wait_until_listening(pipe: &std::fs::File, number: u32) -> anyhow::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let address =
        std::os::unix::net::SocketAddr::from_abstract_name(format!("/tmp/.X11-unix/X{number}"))?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if std::os::unix::net::UnixStream::connect_addr(&address).is_ok() {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("Xvfb did not listen on :{number} within {START_TIMEOUT:?}");
        }
        if readable(pipe, left.min(Duration::from_millis(1)))? {
            return Ok(());
        }
    }
}

/// Whether `pipe` turns readable (data or its end) within `wait`.
fn readable(pipe: &std::fs::File, wait: Duration) -> anyhow::Result<bool> {
    let mut fds = [PollFd::new(pipe.as_fd(), PollFlags::POLLIN)];
    let wait = PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX);
    Ok(poll(&mut fds, wait)? > 0)
}

//! The X display of a headful browser: an Xvfb server that the agent starts and owns.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::CommandExt;
use std::time::Duration;

use anyhow::{Context, bail};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::process::StdGroupLeader;

pub struct Display {
    /// Such as ":3".
    pub name: String,
    xvfb: StdGroupLeader,
}

const START_TIMEOUT_MS: u16 = 10_000;

impl Display {
    /// Starts Xvfb on a free display number. Blocking, and meant to run before the agent
    /// starts any thread (the caller then exports `$DISPLAY`). `-displayfd` makes Xvfb
    /// pick the number and write it to us once it accepts connections, so there is no
    /// polling and no race between agents. `-noreset` keeps Xvfb from resetting when its
    /// last client leaves (X connections made during a reset fail). Without GLX, Xvfb
    /// starts in ~22 ms instead of ~55 ms and Chromium reaches DevTools-ready ~30 ms
    /// sooner; Chromium renders in software on Xvfb either way.
    pub fn start(xvfb_path: &str, width: u32, height: u32) -> anyhow::Result<Self> {
        let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .context("creating the -displayfd pipe")?;
        let write_fd = write_end.as_raw_fd();
        let mut command = std::process::Command::new(xvfb_path);
        crate::identity::as_agent(&mut command);
        command
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
        match read_display(std::fs::File::from(read_end)) {
            Ok(number) => Ok(Self { name: format!(":{number}"), xvfb }),
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

fn read_display(mut pipe: std::fs::File) -> anyhow::Result<u32> {
    let mut text = String::new();
    let mut buffer = [0u8; 16];
    // Xvfb writes "N\n" and keeps the descriptor open, so read until the newline.
    while !text.contains('\n') {
        let mut fds = [PollFd::new(pipe.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::from(START_TIMEOUT_MS))? == 0 {
            bail!("Xvfb did not report a display within {START_TIMEOUT_MS} ms");
        }
        let read = pipe.read(&mut buffer)?;
        if read == 0 {
            bail!("Xvfb exited before reporting a display");
        }
        text.push_str(&String::from_utf8_lossy(&buffer[..read]));
    }
    text.trim().parse().context("Xvfb reported a malformed display number")
}

//! DevTools WebSockets of local browsers, handed over by their agents (the agent's
//! `devtools_handoff`): a TCP socket to Chromium in the VM's network namespace, its
//! WebSocket handshake done, received as a file descriptor over a Unix socket beside the
//! agent's. The CDP route then passes bytes through (`api::browsers::cdp_passthrough`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpStream, UnixStream};

use super::UNIX_ENDPOINT_PREFIX;
use crate::store::AgentLocation;

const HANDOFF_TIMEOUT: Duration = Duration::from_secs(10);

/// A DevTools WebSocket handed over by an agent.
pub struct HandedOver {
    /// Open to Chromium and ready for frames.
    pub devtools: TcpStream,
    /// The hand-off connection: while it is open, the agent keeps the VM awake (never
    /// frozen for idleness). Keep it as long as `devtools`.
    pub keep_awake: UnixStream,
}

/// Chromium's DevTools WebSocket at `path` (empty: the browser's); `Ok(None)` for an
/// agent that is not on this host (the gRPC tunnel serves it).
pub async fn open_devtools(location: &AgentLocation, path: &str) -> io::Result<Option<HandedOver>> {
    let Some(agent_socket) = location.endpoint.strip_prefix(UNIX_ENDPOINT_PREFIX) else {
        return Ok(None);
    };
    let socket = Path::new(agent_socket)
        .with_file_name(browser_agent_proto::unix_socket::DEVTOOLS_HANDOFF_FILE);
    tokio::time::timeout(HANDOFF_TIMEOUT, receive(&socket, &location.secret, path))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the agent did not hand over"))?
        .map(Some)
}

async fn receive(socket: &Path, secret: &str, path: &str) -> io::Result<HandedOver> {
    if secret.contains('\n') || path.contains('\n') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "malformed"));
    }
    let short = browser_agent_proto::unix_socket::short_path(socket)?;
    let mut connection = UnixStream::connect(&short.path).await?;
    connection.write_all(format!("{secret}\n{path}\n").as_bytes()).await?;
    let (answer, fd) = loop {
        connection.readable().await?;
        match connection.try_io(Interest::READABLE, || receive_fd(connection.as_raw_fd())) {
            Ok(received) => break received,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        }
    };
    match (answer, fd) {
        (Some(1), Some(fd)) => {
            let stream = std::net::TcpStream::from(fd);
            stream.set_nonblocking(true)?;
            Ok(HandedOver { devtools: TcpStream::from_std(stream)?, keep_awake: connection })
        }
        _ => {
            let mut why = String::new();
            let _ = (&mut connection).take(1024).read_to_string(&mut why).await;
            Err(io::Error::other(format!("the agent did not hand DevTools over: {why}")))
        }
    }
}

/// The answer byte and the descriptor attached to it, if any.
fn receive_fd(socket: RawFd) -> io::Result<(Option<u8>, Option<OwnedFd>)> {
    let mut byte = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let message = recvmsg::<()>(socket, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(io::Error::from)?;
    let mut fd = None;
    for control in message.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = control {
            for raw in fds {
                // SAFETY: the kernel just installed this descriptor in our table for us;
                // nothing else owns it.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                fd.get_or_insert(owned);
            }
        }
    }
    let received = message.bytes;
    Ok(((received == 1).then_some(byte[0]), fd))
}

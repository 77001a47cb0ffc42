//! Hands the control plane of a local VM a DevTools WebSocket already open to Chromium:
//! the connected socket itself, passed over a Unix socket beside the agent's (SCM_RIGHTS).
//! The control plane then moves the client's frames to Chromium and back as bytes, with
//! neither this process nor gRPC in between: each CDP message costs one process hop
//! instead of three. Chromium listens only in the VM's network namespace, so this is
//! the one way a process outside reaches it, and only with the agent's secret.
//!
//! Protocol, per connection: the control plane writes `<secret>\n<path>\n` (`path` as
//! for the gRPC tunnel: empty for the browser's endpoint, or `/devtools/…`); the agent
//! answers one byte, `1` with the socket attached, or `0` followed by why not. The
//! control plane keeps the connection open as long as it uses the socket: meanwhile the
//! VM stays awake (`freezer`), as for a call in flight.

use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::cdp;
use crate::chromium::BrowserState;
use crate::freezer::Freezer;
use browser_agent_proto::v1::DevtoolsState;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_REQUEST_BYTES: usize = 4096;
const MAX_RESPONSE_HEADER_BYTES: usize = 4096;

/// A hand-off socket at `path` (mode 0600), replacing one a previous agent left.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let short = browser_agent_proto::unix_socket::short_path(path)?;
    let listener = UnixListener::bind(&short.path)?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(listener)
}

/// Serves hand-offs on `listener` until `shutdown`.
pub fn serve(
    listener: UnixListener, auth: Authenticator, freezer: std::sync::Arc<Freezer>,
    browser: watch::Receiver<BrowserState>, shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            let connection = tokio::select! {
                accepted = listener.accept() => accepted,
                () = shutdown.cancelled() => return,
            };
            let Ok((connection, _)) = connection else {
                // Out of descriptors, say: not a reason to spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let (auth, browser, freezer) = (auth.clone(), browser.clone(), freezer.clone());
            tokio::spawn(async move {
                if let Err(error) = hand_off(connection, &auth, &freezer, &browser).await {
                    tracing::debug!(%error, "a DevTools hand-off failed");
                }
            });
        }
    });
}

async fn hand_off(
    mut connection: UnixStream, auth: &Authenticator, freezer: &std::sync::Arc<Freezer>,
    browser: &watch::Receiver<BrowserState>,
) -> io::Result<()> {
    let request = tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut connection))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no request in time"))??;
    let Some((_, path)) = request.filter(|(secret, _)| auth.admits(secret.as_bytes())) else {
        connection.write_all(&[0]).await?;
        return connection.write_all(b"missing or wrong agent credential").await;
    };
    // Awake (Chromium must answer the handshake) until the control plane is done.
    let _awake = freezer.begin_call();
    match open(browser, &path).await {
        Ok(devtools) => {
            send_socket(&connection, &devtools).await?;
            drop(devtools);
            // The control plane sends nothing more: the end of the connection is the end
            // of its use of the socket.
            let mut rest = [0u8; 64];
            while connection.read(&mut rest).await? > 0 {}
            Ok(())
        }
        Err(why) => {
            connection.write_all(&[0]).await?;
            connection.write_all(why.as_bytes()).await
        }
    }
}

/// The secret and the path, or `None` if the request is malformed.
async fn read_request(connection: &mut UnixStream) -> io::Result<Option<(String, String)>> {
    let mut request = Vec::new();
    let mut chunk = [0u8; 512];
    while request.iter().filter(|b| **b == b'\n').count() < 2 {
        let read = connection.read(&mut chunk).await?;
        if read == 0 || request.len() + read > MAX_REQUEST_BYTES {
            return Ok(None);
        }
        request.extend_from_slice(&chunk[..read]);
    }
    let text = String::from_utf8_lossy(&request);
    let mut lines = text.split('\n');
    Ok(match (lines.next(), lines.next()) {
        (Some(secret), Some(path)) => Some((secret.to_owned(), path.to_owned())),
        _ => None,
    })
}

/// A TCP connection to Chromium's DevTools on which the WebSocket handshake is done.
async fn open(browser: &watch::Receiver<BrowserState>, path: &str) -> Result<TcpStream, String> {
    let state = browser.borrow().clone();
    if state.devtools != DevtoolsState::Ready {
        return Err("Chromium's DevTools endpoint is not ready".into());
    }
    let url = cdp::target_url(path, state.devtools_port, &state.browser_ws_url)
        .map_err(|status| status.message().to_owned())?;
    let rest = url.strip_prefix("ws://").ok_or("not a ws:// endpoint")?;
    let (address, resource) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/"),
    };
    let handshake = async {
        let mut stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        let key = generate_key();
        let request = format!(
            "GET {resource} HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        // Byte by byte up to the blank line: nothing of the WebSocket may be read here.
        let mut header = Vec::new();
        while !header.ends_with(b"\r\n\r\n") {
            if header.len() >= MAX_RESPONSE_HEADER_BYTES {
                return Err(io::Error::other("DevTools answered an oversized header"));
            }
            header.push(stream.read_u8().await?);
        }
        let header = String::from_utf8_lossy(&header).to_ascii_lowercase();
        let accept = derive_accept_key(key.as_bytes()).to_ascii_lowercase();
        if !header.starts_with("http/1.1 101") || !header.contains(&accept) {
            return Err(io::Error::other("DevTools refused the WebSocket upgrade"));
        }
        Ok(stream)
    };
    tokio::time::timeout(REQUEST_TIMEOUT, handshake)
        .await
        .map_err(|_| "DevTools did not accept the connection in time".to_owned())?
        .map_err(|error| format!("connecting to DevTools failed: {error}"))
}

/// Sends `1` with `devtools`' descriptor attached; ours closes when it is dropped.
async fn send_socket(connection: &UnixStream, devtools: &TcpStream) -> io::Result<()> {
    let fds = [devtools.as_raw_fd()];
    let messages = [ControlMessage::ScmRights(&fds)];
    let data = [1u8];
    let iov = [io::IoSlice::new(&data)];
    loop {
        connection.writable().await?;
        let sent = connection.try_io(Interest::WRITABLE, || {
            sendmsg::<()>(connection.as_raw_fd(), &iov, &messages, MsgFlags::empty(), None)
                .map_err(io::Error::from)
        });
        match sent {
            Ok(_) => return Ok(()),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        }
    }
}

//! Chromium's only way out of the VM. Chromium talks HTTP-proxy to this listener on the
//! VM's loopback; every connection is passed, byte for byte, to the egress socket that
//! the control plane serves in the VM's run directory. The control plane's egress proxy
//! applies the network policy and the session's proxy (with its credentials, which never
//! enter the VM), so what a page may reach is decided outside the sandbox.

use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio_util::sync::CancellationToken;

/// Starts the forwarder on an ephemeral loopback port; runs until `shutdown`.
pub async fn start(
    egress_socket: PathBuf, shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    forward_loopback("127.0.0.1:0".parse().map_err(std::io::Error::other)?, egress_socket, shutdown)
        .await
}

/// Passes every connection to `listen` (port 0: any free one) on to the Unix socket
/// `socket`, until `shutdown`; answers the bound address.
pub async fn forward_loopback(
    listen: SocketAddr, egress_socket: PathBuf, shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(listen).await?;
    let address = listener.local_addr()?;
    // A socket address holds 108 bytes; deeper paths are reached through a descriptor
    // of their directory, kept open while the forwarder runs.
    let egress_socket =
        std::sync::Arc::new(browser_agent_proto::unix_socket::short_path(&egress_socket)?);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((client, _)) = accepted else { continue };
            let egress_socket = egress_socket.clone();
            tokio::spawn(async move {
                if let Err(error) = forward(client, &egress_socket.path).await {
                    tracing::debug!(%error, "proxied connection ended with an error");
                }
            });
        }
    });
    Ok(address)
}

async fn forward(mut client: TcpStream, egress_socket: &std::path::Path) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    let mut egress = match UnixStream::connect(egress_socket).await {
        Ok(egress) => egress,
        Err(error) => {
            tracing::warn!(%error, socket = %egress_socket.display(), "the socket is unreachable");
            let reason = "the VM's way out is unavailable";
            let answer = format!(
                "HTTP/1.1 502 Bad Gateway\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reason}",
                reason.len()
            );
            return tokio::io::AsyncWriteExt::write_all(&mut client, answer.as_bytes()).await;
        }
    };
    tokio::io::copy_bidirectional(&mut client, &mut egress).await?;
    Ok(())
}

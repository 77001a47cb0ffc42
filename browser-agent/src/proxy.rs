//! A local forwarding proxy between Chromium and the session's upstream proxy. Chromium
//! cannot take proxy credentials on its command line, so it talks to this listener on
//! loopback, which passes every request on to the upstream with `Proxy-Authorization`
//! added. CONNECT tunnels are authorized once and then piped; plain HTTP requests go
//! out with `Connection: close`, so every request on the upstream connection is one we
//! have authorized (the client reconnects for the next one).

use std::net::SocketAddr;

use base64::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Where requests go, and as whom.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// `host:port`.
    pub address: String,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// Largest request head accepted from Chromium.
const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;

/// Starts the forwarder on an ephemeral loopback port; runs until `shutdown`.
pub async fn start(upstream: Upstream, shutdown: CancellationToken) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let authorization = upstream.username.as_ref().map(|username| {
        let credentials = format!("{username}:{}", upstream.password.as_deref().unwrap_or(""));
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(credentials)
        )
    });
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((client, _)) = accepted else { continue };
            let (upstream, authorization) = (upstream.address.clone(), authorization.clone());
            tokio::spawn(async move {
                if let Err(error) = forward(client, &upstream, authorization.as_deref()).await {
                    tracing::debug!(%error, "proxied connection ended with an error");
                }
            });
        }
    });
    Ok(address)
}

async fn forward(
    mut client: TcpStream,
    upstream: &str,
    authorization: Option<&str>,
) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    let (head, rest) = read_head(&mut client).await?;
    let rewritten = match rewrite_head(&head, authorization) {
        Ok(rewritten) => rewritten,
        Err(reason) => {
            let answer = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reason}",
                reason.len()
            );
            return client.write_all(answer.as_bytes()).await;
        }
    };
    let mut server = match TcpStream::connect(upstream).await {
        Ok(server) => server,
        Err(error) => {
            // The upstream's address may be the operator's: log it, do not show it.
            tracing::warn!(%upstream, %error, "the upstream proxy is unreachable");
            let reason = "the upstream proxy is unreachable";
            let answer = format!(
                "HTTP/1.1 502 Bad Gateway\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reason}",
                reason.len()
            );
            return client.write_all(answer.as_bytes()).await;
        }
    };
    let _ = server.set_nodelay(true);
    server.write_all(&rewritten).await?;
    server.write_all(&rest).await?;
    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
    Ok(())
}

/// Reads up to the end of the request head; returns the head and any bytes after it.
async fn read_head(client: &mut TcpStream) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let read = client.read(&mut chunk).await?;
        if read == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the client closed before its request head ended",
            ));
        }
        buffer.extend_from_slice(&chunk[..read]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buffer.split_off(end + 4);
            return Ok((buffer, rest));
        }
        if buffer.len() > MAX_HEAD_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "request head too large",
            ));
        }
    }
}

/// The request head as sent upstream: the client's own proxy headers replaced by ours,
/// and plain requests made single-use.
fn rewrite_head(head: &[u8], authorization: Option<&str>) -> Result<Vec<u8>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err("incomplete request head".into()),
        Err(error) => return Err(format!("malformed request: {error}")),
    }
    let (Some(method), Some(target)) = (request.method, request.path) else {
        return Err("malformed request line".into());
    };
    let tunnel = method.eq_ignore_ascii_case("CONNECT");
    let mut out = format!("{method} {target} HTTP/1.1\r\n").into_bytes();
    for header in request.headers.iter() {
        let name = header.name.to_ascii_lowercase();
        let dropped = name == "proxy-authorization"
            || name == "proxy-connection"
            || (!tunnel && (name == "connection" || name == "keep-alive"));
        if !dropped {
            out.extend_from_slice(header.name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(header.value);
            out.extend_from_slice(b"\r\n");
        }
    }
    if let Some(authorization) = authorization {
        out.extend_from_slice(format!("Proxy-Authorization: {authorization}\r\n").as_bytes());
    }
    if !tunnel {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_requests_get_our_credentials_and_become_single_use() {
        let head = b"GET http://example.test/a HTTP/1.1\r\nHost: example.test\r\n\
Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic c3RhbGU=\r\nAccept: */*\r\n\r\n";
        let out = String::from_utf8(rewrite_head(head, Some("Basic dTpw")).unwrap_or_default())
            .unwrap_or_default();
        assert_eq!(
            out,
            "GET http://example.test/a HTTP/1.1\r\nHost: example.test\r\nAccept: */*\r\n\
Proxy-Authorization: Basic dTpw\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn tunnels_keep_their_headers_and_get_our_credentials() {
        let head = b"CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n";
        let out = String::from_utf8(rewrite_head(head, Some("Basic dTpw")).unwrap_or_default())
            .unwrap_or_default();
        assert_eq!(
            out,
            "CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\
Proxy-Authorization: Basic dTpw\r\n\r\n"
        );
        assert!(rewrite_head(b"NOT HTTP\r\n\r\n", None).is_err());
    }
}

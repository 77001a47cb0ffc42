//! The egress proxy of one browser VM. It listens on a Unix socket in the VM's run
//! directory, the only path out of the VM's network namespace, and speaks HTTP-proxy:
//! `CONNECT host:port` tunnels and plain `http://` requests. For each it checks the
//! session's `allowed_hosts`, then either passes the request to the session's upstream
//! proxy (adding its credentials, which never enter the VM) or connects directly to an
//! address the operator's egress policy allows: the address judged is the one connected
//! to, so DNS rebinding cannot slip past. Refusals answer 403 with
//! `X-Kernel-Proxy-Error: network_policy_denied`, failures 502 with the code of what
//! failed; both are noted for the session's telemetry (`failures`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::failures::{ProxyFailure, ProxyFailures};
use super::{EgressError, EgressPolicy, HostAllowlist};
use crate::proxies::ProxyRoute;

/// Where one VM's traffic may go and through which proxy.
#[derive(Clone, Debug, Default)]
pub struct VmEgress {
    /// The session's proxy; hosts it bypasses go direct.
    pub upstream: Option<ProxyRoute>,
    /// `network.allowed_hosts`: when set, the only destinations.
    pub allowed_hosts: Option<HostAllowlist>,
}

/// Largest request head accepted from the VM.
const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a request head may take to arrive.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Most connections one VM may have open through its egress (Chromium opens at most 256
/// socket pools' worth).
const MAX_CONNECTIONS: usize = 512;
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// The header naming why a request was refused, as the SDK documents it.
const ERROR_HEADER: &str = "X-Kernel-Proxy-Error";
const POLICY_DENIED: &str = "network_policy_denied";
const PROXY_UNAVAILABLE: &str = "proxy_unavailable";
const DNS_FAILURE: &str = "upstream_dns_failure";
const CONNECT_FAILED: &str = "upstream_connect_failed";

/// Where one VM's proxy notes the requests it refused or could not carry.
#[derive(Clone)]
pub struct FailureLog {
    pub failures: Arc<ProxyFailures>,
    pub session_id: String,
}

/// A running egress proxy; stops (with every connection through it) when dropped.
pub struct EgressServer {
    egress: watch::Sender<VmEgress>,
    shutdown: CancellationToken,
    failure_log: Option<FailureLog>,
}

impl Drop for EgressServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(log) = &self.failure_log {
            log.failures.forget(&log.session_id);
        }
    }
}

impl EgressServer {
    /// Listens on `socket` (replacing a stale one), readable and writable by `owner`
    /// only: the VM's user.
    pub fn start(
        socket: &Path, owner: Option<(u32, u32)>, policy: EgressPolicy, egress: VmEgress,
        failure_log: Option<FailureLog>,
    ) -> std::io::Result<Self> {
        match std::fs::remove_file(socket) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        let short = browser_agent_proto::unix_socket::short_path(socket)?;
        let listener = UnixListener::bind(&short.path)?;
        // Our umask makes it 0700; the VM's user gets it. `lchown`: the directory is the
        // VM's, and a link swapped in for the socket must not pass the change on.
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::lchown(socket, Some(uid), Some(gid))?;
        }
        let (egress, updates) = watch::channel(egress);
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let policy = Arc::new(policy);
        let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let log = failure_log.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = stop.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let client = match accepted {
                    Ok((client, _)) => client,
                    Err(error) => {
                        // Out of descriptors, say: wait rather than spin.
                        tracing::warn!(%error, "the egress proxy could not accept a connection");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                // Past its share, a VM's new connections are closed at once.
                let Ok(permit) = connections.clone().try_acquire_owned() else {
                    continue;
                };
                let (policy, stop, updates) = (policy.clone(), stop.clone(), updates.clone());
                let log = log.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    tokio::select! {
                        () = stop.cancelled() => {}
                        result = handle(client, &policy, updates, log.as_ref()) => if let Err(error) = result {
                            tracing::debug!(%error, "egress connection ended with an error");
                        },
                    }
                });
            }
        });
        Ok(Self { egress, shutdown, failure_log })
    }

    /// Applies to new requests at once; open connections to hosts it no longer allows
    /// are closed.
    pub fn set_allowed_hosts(&self, allowed_hosts: Option<HostAllowlist>) {
        self.egress.send_modify(|egress| egress.allowed_hosts = allowed_hosts);
    }

    /// Switches the session's proxy (`None`: direct) for new requests at once; open
    /// connections whose route it changes are closed, so the browser reconnects through
    /// the new one.
    pub fn set_upstream(&self, upstream: Option<ProxyRoute>) {
        self.egress.send_modify(|egress| egress.upstream = upstream);
    }
}

impl VmEgress {
    /// The proxy a request for `host` goes through; `None` when it goes direct.
    fn route_for(&self, host: &str) -> Option<&ProxyRoute> {
        self.upstream.as_ref().filter(|upstream| !bypassed(&upstream.bypass_hosts, host))
    }
}

/// A request as the VM's browser sent it to its proxy.
struct ProxyRequest {
    method: String,
    headers: Vec<(String, Vec<u8>)>,
    /// Without brackets.
    host: String,
    port: u16,
    /// `/path?query` for plain requests.
    origin_target: String,
}

impl ProxyRequest {
    fn parse(head: &[u8]) -> Result<Self, String> {
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
        let uri: http::Uri =
            target.parse().map_err(|_| format!("{target:?} is not a proxy request target"))?;
        if !tunnel && uri.scheme_str() != Some("http") {
            return Err("only CONNECT and absolute http:// requests are proxied".into());
        }
        let host = uri
            .host()
            .ok_or_else(|| format!("{target:?} names no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = match uri.port_u16() {
            Some(port) => port,
            None if !tunnel => 80,
            None => return Err("CONNECT needs host:port".into()),
        };
        Ok(Self {
            method: method.to_owned(),
            headers: request
                .headers
                .iter()
                .map(|h| (h.name.to_owned(), h.value.to_vec()))
                .collect(),
            host,
            port,
            origin_target: uri
                .path_and_query()
                .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
        })
    }

    fn is_tunnel(&self) -> bool {
        self.method.eq_ignore_ascii_case("CONNECT")
    }

    /// `host:port`, IPv6 in brackets.
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// `http://host[:port]/path`, the port said unless it is 80.
    fn absolute_url(&self) -> String {
        let authority = self.authority();
        let authority = match self.port {
            80 => authority.trim_end_matches(":80"),
            _ => &authority,
        };
        format!("http://{authority}{}", self.origin_target)
    }

    /// The head sent on: to `target` (absolute for a proxy, origin-form for a server),
    /// the VM's own proxy headers replaced by `authorization`, and plain requests made
    /// single-use so that every request on the connection is one judged here.
    fn outgoing_head(&self, target: &str, authorization: Option<&str>) -> Vec<u8> {
        let tunnel = self.is_tunnel();
        let mut out = format!("{} {target} HTTP/1.1\r\n", self.method).into_bytes();
        for (name, value) in &self.headers {
            let lower = name.to_ascii_lowercase();
            let dropped = lower == "proxy-authorization"
                || lower == "proxy-connection"
                || (!tunnel && (lower == "connection" || lower == "keep-alive"));
            if !dropped {
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value);
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
        out
    }
}

async fn handle(
    mut client: UnixStream, policy: &EgressPolicy, mut updates: watch::Receiver<VmEgress>,
    log: Option<&FailureLog>,
) -> std::io::Result<()> {
    let (head, rest) = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no request head"))??;
    let egress = updates.borrow_and_update().clone();
    let request = match ProxyRequest::parse(&head) {
        Ok(request) => request,
        Err(reason) => {
            // Noted, as refusals are: a browser shows these as a failed page load.
            tracing::info!(%reason, "the egress proxy could not read a request");
            return answer(&mut client, "400 Bad Request", None, &reason).await;
        }
    };
    let body_length = match body_length(&request) {
        Ok(length) => length,
        Err(reason) => {
            tracing::info!(%reason, host = %request.host, "the egress proxy could not relay a request");
            return answer(&mut client, "411 Length Required", None, reason).await;
        }
    };
    if let Some(allowed) = &egress.allowed_hosts
        && !allowed.allows(&request.host)
    {
        let reason = format!("{} is not in this browser's network.allowed_hosts", request.host);
        return refuse(&mut client, log, &request, POLICY_DENIED, &reason).await;
    }
    let upstream = egress.route_for(&request.host);
    let mut server = match upstream {
        Some(upstream) => {
            let Some(mut server) = connect(&upstream.address).await else {
                // The upstream's address may be the operator's: log it, do not show it.
                tracing::warn!(upstream = %upstream.address, "the upstream proxy is unreachable");
                let reason = "the session's proxy is unreachable";
                return refuse(&mut client, log, &request, PROXY_UNAVAILABLE, reason).await;
            };
            let authorization = upstream.username.as_ref().map(|username| {
                let credentials =
                    format!("{username}:{}", upstream.password.as_deref().unwrap_or(""));
                format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(credentials))
            });
            // The target as we understood it, not as sent: the upstream cannot read it
            // another way.
            let target =
                if request.is_tunnel() { request.authority() } else { request.absolute_url() };
            server.write_all(&request.outgoing_head(&target, authorization.as_deref())).await?;
            server
        }
        None => {
            let address = match policy.resolve(&request.authority()).await {
                Ok(address) => address,
                Err(EgressError::Refused(reason)) => {
                    return refuse(&mut client, log, &request, POLICY_DENIED, &reason).await;
                }
                Err(EgressError::Unresolved(reason)) => {
                    return refuse(&mut client, log, &request, DNS_FAILURE, &reason).await;
                }
            };
            let Some(mut server) = connect(&address.to_string()).await else {
                let reason = format!("{} did not accept the connection", request.host);
                return refuse(&mut client, log, &request, CONNECT_FAILED, &reason).await;
            };
            if request.is_tunnel() {
                client.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n").await?;
            } else {
                server.write_all(&request.outgoing_head(&request.origin_target, None)).await?;
            }
            server
        }
    };
    let relayed = async {
        match body_length {
            // A tunnel carries whatever the two ends say.
            None => {
                server.write_all(&rest).await?;
                tokio::io::copy_bidirectional(&mut client, &mut server).await?;
            }
            // A plain request carries its own body and nothing after it: a second request
            // pipelined behind it would reach the upstream proxy unjudged.
            Some(length) => {
                let already = rest.len().min(usize::try_from(length).unwrap_or(usize::MAX));
                server.write_all(&rest[..already]).await?;
                let (mut client_read, mut client_write) = client.split();
                let (mut server_read, mut server_write) = server.split();
                let body = async {
                    let mut remaining = (&mut client_read).take(length - already as u64);
                    tokio::io::copy(&mut remaining, &mut server_write).await
                };
                let response = relay_response(&mut server_read, &mut client_write, log, &request);
                tokio::try_join!(body, response)?;
            }
        }
        Ok(())
    };
    tokio::select! {
        relayed = relayed => relayed,
        () = rerouted(&mut updates, &request.host, upstream) => Ok(()),
    }
}

/// Passes a plain request's response on, saying `Connection: close`: the browser must not
/// send its next request (perhaps for another host) down a connection judged for this one.
/// An error answer is noted: a page that fails to load shows only a net error (what goes
/// through a tunnel, HTTPS, cannot be seen into).
async fn relay_response(
    server: &mut (impl AsyncRead + Unpin), client: &mut (impl AsyncWrite + Unpin),
    log: Option<&FailureLog>, request: &ProxyRequest,
) -> std::io::Result<()> {
    let (head, rest) = read_head(server).await?;
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    if !matches!(response.parse(&head), Ok(httparse::Status::Complete(_))) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "malformed response head",
        ));
    }
    let status = response.code.unwrap_or(502);
    let session_id = log.map(|log| log.session_id.as_str());
    let (host, port) = (&request.host, request.port);
    match status {
        // Pages ask for what is not there all the time (favicons).
        404 => tracing::debug!(session_id, %host, port, status, "relayed an error answer"),
        400.. => tracing::info!(session_id, %host, port, status, "relayed an error answer"),
        _ => {}
    }
    let mut out = format!("HTTP/1.1 {} {}\r\n", status, response.reason.unwrap_or("")).into_bytes();
    for header in response.headers.iter() {
        let name = header.name.to_ascii_lowercase();
        if !matches!(name.as_str(), "connection" | "keep-alive" | "proxy-connection") {
            out.extend_from_slice(header.name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(header.value);
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    client.write_all(&out).await?;
    client.write_all(&rest).await?;
    tokio::io::copy(server, client).await?;
    Ok(())
}

/// The body length of a plain request (`Content-Length`, 0 without), or why it cannot be
/// relayed; `None` for a tunnel.
fn body_length(request: &ProxyRequest) -> Result<Option<u64>, &'static str> {
    if request.is_tunnel() {
        return Ok(None);
    }
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|(header, _)| header.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_slice())
    };
    if header("transfer-encoding").is_some() {
        return Err("plain http:// requests with a chunked body are not relayed (use https)");
    }
    match header("content-length") {
        None => Ok(Some(0)),
        Some(value) => std::str::from_utf8(value)
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .map(Some)
            .ok_or("malformed Content-Length"),
    }
}

/// Resolves once the VM's `allowed_hosts` no longer allow `host`, or its requests no
/// longer go the way of a connection opened through `route`.
async fn rerouted(updates: &mut watch::Receiver<VmEgress>, host: &str, route: Option<&ProxyRoute>) {
    loop {
        if updates.changed().await.is_err() {
            return std::future::pending().await;
        }
        let egress = updates.borrow_and_update();
        let allowed = egress.allowed_hosts.as_ref().is_none_or(|allowed| allowed.allows(host));
        // The same upstream with the same credentials is the same way, whatever else its
        // bypass list says.
        if !allowed || egress.route_for(host).map(endpoint) != route.map(endpoint) {
            return;
        }
    }
}

async fn connect(address: &str) -> Option<TcpStream> {
    let server =
        tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await.ok()?.ok()?;
    let _ = server.set_nodelay(true);
    Some(server)
}

/// Where a route's connections go, and as whom.
fn endpoint(route: &ProxyRoute) -> (&str, Option<&str>, Option<&str>) {
    (&route.address, route.username.as_deref(), route.password.as_deref())
}

/// Whether the session's proxy lets `host` go direct (Chromium bypass-list patterns:
/// `example.com`, `*.example.com`, `.example.com`, `<local>`; a port is ignored).
fn bypassed(patterns: &[String], host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    patterns.iter().any(|pattern| {
        let pattern = pattern.trim().to_ascii_lowercase();
        let pattern = pattern
            .rsplit_once(':')
            .filter(|(_, port)| port.parse::<u16>().is_ok())
            .map_or(pattern.as_str(), |(name, _)| name);
        if pattern == "<local>" {
            return !host.contains('.') && !host.contains(':');
        }
        match pattern.strip_prefix('*') {
            Some(suffix) => host.ends_with(suffix),
            None if pattern.starts_with('.') => host.ends_with(pattern),
            None => host == pattern,
        }
    })
}

/// Answers a request the proxy will not carry (403 for a policy's refusal, else 502),
/// naming `code` to the browser and noting it for the session's telemetry.
async fn refuse(
    client: &mut (impl AsyncWrite + Unpin), log: Option<&FailureLog>, request: &ProxyRequest,
    code: &'static str, reason: &str,
) -> std::io::Result<()> {
    let (status, line) = match code {
        POLICY_DENIED => (403, "403 Forbidden"),
        _ => (502, "502 Bad Gateway"),
    };
    tracing::info!(
        session_id = log.map(|log| log.session_id.as_str()),
        code,
        host = %request.host,
        port = request.port,
        reason,
        "the egress proxy did not carry a request"
    );
    if let Some(log) = log {
        log.failures.note(
            &log.session_id,
            ProxyFailure {
                code,
                status,
                method: request.method.clone(),
                host: request.host.clone(),
                port: request.port,
            },
        );
    }
    answer(client, line, Some(code), reason).await
}

async fn answer(
    client: &mut (impl AsyncWrite + Unpin), status: &str, error: Option<&str>, reason: &str,
) -> std::io::Result<()> {
    let error = error.map_or_else(String::new, |e| format!("{ERROR_HEADER}: {e}\r\n"));
    let response = format!(
        "HTTP/1.1 {status}\r\n{error}Content-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{reason}",
        reason.len()
    );
    client.write_all(response.as_bytes()).await?;
    client.shutdown().await
}

/// Reads up to the end of the request head; returns the head and any bytes after it.
async fn read_head(client: &mut (impl AsyncRead + Unpin)) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
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

#[cfg(test)]
mod tests;

//! Proxies: where a proxy of an organization actually sends traffic, and checks.
//!
//! A `custom` proxy names its own server (host, port, optional credentials). The other
//! types (`datacenter`, `isp`, `residential`, `mobile`) are served by upstream proxies the
//! operator configures in a JSON file (`--proxy-upstreams`), per type and optionally per
//! country:
//!
//! ```json
//! { "datacenter": { "default": "http://user:pass@dc.example:8080", "DE": "http://…" } }
//! ```

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::egress::EgressPolicy;
use crate::store::ProxyRecord;

pub const TYPES: [&str; 5] = ["datacenter", "isp", "residential", "mobile", "custom"];

/// Where a browser's traffic goes: an HTTP proxy and the credentials it wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyRoute {
    /// `host:port`.
    pub address: String,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Hosts that go direct.
    pub bypass_hosts: Vec<String>,
}

/// The operator's upstreams: type → (country code or `default`) → proxy URL.
#[derive(Clone, Debug, Default)]
pub struct ProxyUpstreams(HashMap<String, HashMap<String, String>>);

impl ProxyUpstreams {
    /// Whether the operator configured no upstream at all.
    pub fn is_empty(&self) -> bool {
        self.0.values().all(HashMap::is_empty)
    }

    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        let upstreams: HashMap<String, HashMap<String, String>> = serde_json::from_str(&text)?;
        for (kind, by_country) in &upstreams {
            anyhow::ensure!(
                TYPES.contains(&kind.as_str()) && kind != "custom",
                "{}: unknown proxy type {kind:?}",
                path.display()
            );
            for url in by_country.values() {
                parse_proxy_url(url)
                    .map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
            }
        }
        Ok(Self(upstreams))
    }

    /// Whether proxies of this type can be served (`custom` always can).
    pub fn serves(&self, kind: &str) -> bool {
        kind == "custom" || self.0.get(kind).is_some_and(|by_country| !by_country.is_empty())
    }

    fn url_for(&self, kind: &str, country: Option<&str>) -> Option<&String> {
        let by_country = self.0.get(kind)?;
        country
            .and_then(|country| by_country.get(&country.to_ascii_uppercase()))
            .or_else(|| by_country.get("default"))
    }
}

/// `http://[user[:password]@]host:port` → route parts.
fn parse_proxy_url(text: &str) -> Result<(String, Option<String>, Option<String>), String> {
    // Messages never quote the URL: it may carry credentials.
    let url = url::Url::parse(text).map_err(|error| format!("bad proxy URL: {error}"))?;
    if url.scheme() != "http" {
        return Err("proxy URL: only http:// upstreams are supported".into());
    }
    let host = url.host_str().ok_or("proxy URL without a host")?;
    let port = url.port_or_known_default().unwrap_or(80);
    let decode = |part: &str| percent_decode(part);
    let username = (!url.username().is_empty()).then(|| decode(url.username()));
    let password = url.password().map(decode);
    Ok((format!("{host}:{port}"), username, password))
}

fn percent_decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("x={text}").as_bytes())
        .next()
        .map(|(_, value)| value.into_owned())
        .unwrap_or_else(|| text.to_owned())
}

/// Where a proxy record sends traffic, or why it cannot be served.
pub fn route_of(proxy: &ProxyRecord, upstreams: &ProxyUpstreams) -> Result<ProxyRoute, String> {
    let text = |key: &str| proxy.config.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    let (address, username, password) = if proxy.kind == "custom" {
        let host = text("host").ok_or("custom proxy without host")?;
        let port =
            proxy.config.get("port").and_then(|v| v.as_u64()).ok_or("custom proxy without port")?;
        // IPv6 literals need brackets in host:port.
        let host =
            if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host };
        (format!("{host}:{port}"), text("username"), text("password"))
    } else {
        let url = upstreams
            .url_for(&proxy.kind, text("country").as_deref())
            .ok_or_else(|| not_configured(&proxy.kind))?;
        parse_proxy_url(url)?
    };
    Ok(ProxyRoute { address, username, password, bypass_hosts: proxy.bypass_hosts.clone() })
}

/// `route_of`, with a custom proxy's host resolved to an address the egress policy lets
/// tenants reach; the agent connects to that address. Operators' upstreams are trusted.
pub async fn connectable_route(
    proxy: &ProxyRecord, upstreams: &ProxyUpstreams, egress: &EgressPolicy,
) -> Result<ProxyRoute, String> {
    let mut route = route_of(proxy, upstreams)?;
    if proxy.kind == "custom" {
        let address = egress
            .resolve(&route.address)
            .await
            .map_err(|error| format!("the proxy's host: {error}"))?;
        route.address = address.to_string();
    }
    Ok(route)
}

pub fn not_configured(kind: &str) -> String {
    format!(
        "proxies of type {kind} are not configured on this server (the operator maps types to \
         upstream proxies with --proxy-upstreams); use type custom with your own proxy"
    )
}

const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Fetches `url` (http://) through the route's proxy; Ok if it answers 2xx or 3xx.
pub async fn check(route: &ProxyRoute, url: &str) -> Result<(), String> {
    tokio::time::timeout(CHECK_TIMEOUT, check_inner(route, url))
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {} s", CHECK_TIMEOUT.as_secs())))
}

async fn check_inner(route: &ProxyRoute, url: &str) -> Result<(), String> {
    let target = url::Url::parse(url).map_err(|error| format!("bad check URL: {error}"))?;
    let host = target.host_str().unwrap_or_default();
    let mut stream = tokio::net::TcpStream::connect(&route.address)
        .await
        .map_err(|error| format!("connecting to the proxy {} failed: {error}", route.address))?;
    let mut request = format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    if let Some(username) = &route.username {
        let credentials = format!("{username}:{}", route.password.as_deref().unwrap_or(""));
        request.push_str(&format!(
            "Proxy-Authorization: Basic {}\r\n",
            base64::engine::general_purpose::STANDARD.encode(credentials)
        ));
    }
    request.push_str("\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|error| format!("sending through the proxy failed: {error}"))?;
    let mut head = Vec::new();
    let mut buffer = [0u8; 1024];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 8192 {
        let read = stream
            .read(&mut buffer)
            .await
            .map_err(|error| format!("reading the proxy's answer failed: {error}"))?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&buffer[..read]);
    }
    let status_line = String::from_utf8_lossy(&head).lines().next().unwrap_or_default().to_owned();
    let code: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("the proxy did not answer HTTP: {status_line:?}"))?;
    if (200..400).contains(&code) {
        Ok(())
    } else {
        let printable: String = status_line.chars().filter(|c| !c.is_control()).take(200).collect();
        Err(format!("the request through the proxy answered {printable}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls_parse_with_and_without_credentials() {
        assert_eq!(
            parse_proxy_url("http://us%40r:p%3Ass@proxy.test:3128"),
            Ok(("proxy.test:3128".into(), Some("us@r".into()), Some("p:ss".into())))
        );
        assert_eq!(parse_proxy_url("http://proxy.test"), Ok(("proxy.test:80".into(), None, None)));
        assert!(parse_proxy_url("socks5://proxy.test:1080").is_err());
        assert!(parse_proxy_url("not a url").is_err());
    }
}

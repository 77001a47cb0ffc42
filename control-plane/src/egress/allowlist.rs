//! A session's `network.allowed_hosts`: the only destinations its browser may reach.
//! Entries, as the SDK documents them: exact hostnames (`example.com`), one leading
//! `*.` wildcard matching subdomains at any depth but not the domain itself, public IP
//! addresses (IPv6 bracketed) and public CIDR ranges. IP and CIDR entries match only
//! destinations written as an IP address, never names that resolve into them.

use std::net::IpAddr;

use super::policy::is_internal;

/// Most entries an allowlist may have.
pub const MAX_ALLOWED_HOSTS: usize = 256;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostAllowlist {
    entries: Vec<Entry>,
    /// As given, for answers.
    source: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    Host(String),
    /// Subdomains of this suffix (without the leading dot).
    Subdomains(String),
    Network {
        address: IpAddr,
        prefix: u8,
    },
}

impl HostAllowlist {
    /// Validates the entries; `Err` names the first bad one.
    pub fn parse(hosts: &[String]) -> Result<Self, String> {
        if hosts.is_empty() {
            return Err("allowed_hosts may not be empty (omit it for unfiltered egress)".into());
        }
        if hosts.len() > MAX_ALLOWED_HOSTS {
            return Err(format!("allowed_hosts: at most {MAX_ALLOWED_HOSTS} entries"));
        }
        let entries = hosts
            .iter()
            .enumerate()
            .map(|(index, host)| {
                parse_entry(host)
                    .map_err(|reason| format!("allowed_hosts[{index}] {host:?}: {reason}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            entries,
            source: hosts.iter().map(|host| host.trim().to_ascii_lowercase()).collect(),
        })
    }

    pub fn hosts(&self) -> &[String] {
        &self.source
    }

    /// Whether `host` (a name, an IPv4 address or an IPv6 address with or without
    /// brackets, as the request wrote it) may be reached.
    pub fn allows(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let literal = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok();
        self.entries.iter().any(|entry| match (entry, literal) {
            (Entry::Network { address, prefix }, Some(ip)) => {
                super::policy::contains(*address, *prefix, super::policy::canonical(ip))
            }
            (Entry::Host(name), None) => *name == host,
            (Entry::Subdomains(suffix), None) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            _ => false,
        })
    }
}

fn parse_entry(text: &str) -> Result<Entry, String> {
    let text = text.trim().to_ascii_lowercase();
    if text.contains("://") || text.contains(['/', '?', '#', ' ']) && !looks_like_cidr(&text) {
        return Err("must be a hostname, IP address or CIDR range without scheme or path".into());
    }
    if let Some((address, prefix)) = text.split_once('/') {
        let address: IpAddr = address.parse().map_err(|_| "not a CIDR range".to_owned())?;
        let prefix: u8 = prefix.parse().map_err(|_| "not a CIDR range".to_owned())?;
        let bits = if address.is_ipv4() { 32 } else { 128 };
        if prefix > bits {
            return Err("not a CIDR range".into());
        }
        if super::policy::masked(address, prefix) != address {
            return Err("a CIDR range must be in canonical form (host bits zero)".into());
        }
        if super::policy::overlaps_internal(address, prefix) {
            return Err(
                "the range holds private or reserved addresses, which cannot be allowed".into()
            );
        }
        return public(address).map(|address| Entry::Network { address, prefix });
    }
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        let address: IpAddr = inner.parse().map_err(|_| "not an IPv6 address".to_owned())?;
        let address = public(address)?;
        let prefix = if address.is_ipv4() { 32 } else { 128 };
        return Ok(Entry::Network { address, prefix });
    }
    if let Ok(address) = text.parse::<IpAddr>() {
        if address.is_ipv6() {
            return Err("IPv6 addresses are written in brackets".into());
        }
        return public(address).map(|address| Entry::Network { address, prefix: 32 });
    }
    if text.contains(':') {
        return Err("entries cannot include ports".into());
    }
    let (wildcard, name) = match text.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, text.as_str()),
    };
    let valid_label = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(valid_label) {
        return Err("not a hostname".into());
    }
    // Resolvers read `127.1`, `2130706433` or `0x7f.0.0.1` as addresses: no top-level
    // domain is a number.
    let top = name.rsplit('.').next().unwrap_or_default();
    if top.chars().all(|c| c.is_ascii_digit()) || top.starts_with("0x") {
        return Err("not a hostname (it reads as a number)".into());
    }
    if wildcard {
        if psl::suffix(name.as_bytes()).is_some_and(|suffix| suffix.as_bytes() == name.as_bytes()) {
            return Err("a wildcard over a public suffix is not allowed".into());
        }
        return Ok(Entry::Subdomains(name.to_owned()));
    }
    Ok(Entry::Host(name.to_owned()))
}

fn looks_like_cidr(text: &str) -> bool {
    text.split_once('/').is_some_and(|(address, prefix)| {
        address.parse::<IpAddr>().is_ok() && prefix.parse::<u8>().is_ok()
    })
}

/// A public address, IPv4-mapped IPv6 as the IPv4 address destinations are judged as.
fn public(address: IpAddr) -> Result<IpAddr, String> {
    if is_internal(address) {
        return Err("private and reserved addresses cannot be allowed".into());
    }
    Ok(super::policy::canonical(address))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(hosts: &[&str]) -> HostAllowlist {
        HostAllowlist::parse(&hosts.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>())
            .unwrap_or_else(|error| panic!("{error}"))
    }

    #[test]
    fn names_and_wildcards() {
        let allowed = list(&[" Example.com", "*.test.org", "*.example.ts.net"]);
        assert_eq!(allowed.hosts()[0], "example.com");
        assert!(allowed.allows("a.example.ts.net"));
        assert!(allowed.allows("example.com"));
        assert!(allowed.allows("EXAMPLE.com."));
        assert!(!allowed.allows("www.example.com"));
        assert!(allowed.allows("a.test.org"));
        assert!(allowed.allows("a.b.test.org"));
        assert!(!allowed.allows("test.org"));
        assert!(!allowed.allows("xtest.org"));
    }

    #[test]
    fn addresses_match_only_literals() {
        let allowed =
            list(&["8.8.8.8", "203.0.113.0/24", "[2001:4860:4860::8888]", "[::ffff:1.1.1.1]"]);
        assert!(allowed.allows("1.1.1.1"));
        assert!(allowed.allows("8.8.8.8"));
        assert!(allowed.allows("203.0.113.10"));
        assert!(!allowed.allows("203.0.114.10"));
        assert!(allowed.allows("[2001:4860:4860::8888]"));
        assert!(!allowed.allows("dns.google"));
    }

    #[test]
    fn refuses_bad_entries() {
        for bad in [
            "http://example.com",
            "example.com:443",
            "example.com/path",
            "127.0.0.1",
            "10.0.0.0/8",
            "203.0.113.1/24",
            "*.com",
            "*.co.uk",
            "*.github.io",
            "128.0.0.0/1",
            "8000::/1",
            "127.1",
            "2130706433",
            "0x7f.0.0.1",
            "2001:db8::1",
            "bad host",
            "",
        ] {
            assert!(HostAllowlist::parse(&[bad.to_owned()]).is_err(), "{bad}");
        }
        assert!(HostAllowlist::parse(&[]).is_err());
    }
}

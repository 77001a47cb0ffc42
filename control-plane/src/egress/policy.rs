//! Which network destinations tenants may make this host connect to. Addresses inside the
//! host or its networks (loopback, link-local with the cloud metadata service, private
//! and other non-public ranges) are refused unless the operator allows them
//! (`--egress-allow`). A name is judged by the addresses it resolves to, and the caller
//! connects to the address that was judged, so a name cannot resolve one way when checked
//! and another when used.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

/// How long a name may take to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Destinations the operator lets tenants reach although they are not public.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allowance {
    /// Every address of a network, such as `10.1.0.0/16` or `127.0.0.1` (one address).
    Network { address: IpAddr, prefix: u8 },
    /// One host (as tenants name it) and port, such as `proxy.internal:3128`.
    Endpoint { host: String, port: u16 },
}

impl Allowance {
    /// A network, with an IPv4-mapped IPv6 one (`::ffff:10.0.0.0/104`) as the IPv4
    /// network it stands for, since addresses are judged in that form.
    fn network(address: IpAddr, prefix: u8) -> Option<Self> {
        let (address, prefix) = match address {
            IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => {
                (canonical(address), prefix.checked_sub(96)?)
            }
            _ => (address, prefix),
        };
        let bits = if address.is_ipv4() { 32 } else { 128 };
        (prefix <= bits).then_some(Self::Network { address, prefix })
    }
}

impl FromStr for Allowance {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let bad = || {
            format!("{text:?} is neither CIDR (10.0.0.0/8, ::1/128), an IP address nor host:port")
        };
        if let Some((address, prefix)) = text.split_once('/') {
            let address: IpAddr = address.parse().map_err(|_| bad())?;
            let prefix: u8 = prefix.parse().map_err(|_| bad())?;
            return Self::network(address, prefix).ok_or_else(bad);
        }
        if let Ok(address) = text.trim_matches(['[', ']']).parse::<IpAddr>() {
            let prefix = if address.is_ipv4() { 32 } else { 128 };
            return Self::network(address, prefix).ok_or_else(bad);
        }
        let (host, port) = split_host_port(text).ok_or_else(bad)?;
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Self::Endpoint { host: host.to_ascii_lowercase(), port })
    }
}

/// Why a destination cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// It resolves only to addresses tenants may not reach.
    #[error("{0}")]
    Refused(String),
    /// It does not resolve (now).
    #[error("{0}")]
    Unresolved(String),
}

#[derive(Clone, Debug, Default)]
pub struct EgressPolicy {
    allowed: Vec<Allowance>,
    /// This host's own addresses, public ones included: services bound to every address
    /// (`0.0.0.0`) answer on them.
    own: Vec<IpAddr>,
}

impl EgressPolicy {
    /// The operator's allowances, with this host's addresses as they are now.
    pub fn new(allowed: Vec<Allowance>) -> Self {
        let own = nix::ifaddrs::getifaddrs()
            .map(|interfaces| {
                interfaces
                    .filter_map(|interface| {
                        let address = interface.address?;
                        match (address.as_sockaddr_in(), address.as_sockaddr_in6()) {
                            (Some(v4), _) => Some(IpAddr::V4(v4.ip())),
                            (_, Some(v6)) => Some(IpAddr::V6(v6.ip())),
                            _ => None,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self { allowed, own }
    }

    /// Whether tenants may reach this address.
    pub fn allows(&self, address: IpAddr) -> bool {
        let internal = is_internal(address) || self.own.contains(&canonical(address));
        !internal
            || self.allowed.iter().any(|allowance| match allowance {
                Allowance::Network { address: network, prefix } => {
                    contains(*network, *prefix, canonical(address))
                }
                Allowance::Endpoint { .. } => false,
            })
    }

    /// Resolves `host:port` (`[v6]:port` for IPv6 literals) to the first address tenants
    /// may reach; connect to that address, not to the name again. `Err` says why not.
    pub async fn resolve(&self, host_port: &str) -> Result<SocketAddr, EgressError> {
        let unresolved = EgressError::Unresolved;
        let (host, port) = split_host_port(host_port)
            .ok_or_else(|| unresolved(format!("{host_port:?} is not host:port")))?;
        let addresses: Vec<SocketAddr> =
            tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port)))
                .await
                .map_err(|_| {
                    unresolved(format!(
                        "{host} did not resolve within {} s",
                        RESOLVE_TIMEOUT.as_secs()
                    ))
                })?
                .map_err(|error| unresolved(format!("{host} does not resolve: {error}")))?
                .collect();
        let endpoint_allowed = self.allowed.iter().any(|allowance| {
            matches!(allowance, Allowance::Endpoint { host: allowed, port: allowed_port }
                if allowed.eq_ignore_ascii_case(host) && *allowed_port == port)
        });
        if let Some(address) =
            addresses.iter().find(|address| endpoint_allowed || self.allows(address.ip()))
        {
            return Ok(*address);
        }
        match addresses.first() {
            // The address itself is not said: it would map the operator's internal names.
            Some(_) => Err(EgressError::Refused(format!(
                "{host} is an address inside this host or its networks that browsers may not \
                 reach (the operator can allow it with --egress-allow)"
            ))),
            None => Err(unresolved(format!("{host} does not resolve"))),
        }
    }
}

/// `host:port` or `[v6]:port` → (host without brackets, port).
pub(super) fn split_host_port(text: &str) -> Option<(&str, u16)> {
    let (host, port) = text.rsplit_once(':')?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    Some((host, port.parse().ok()?))
}

/// IPv4-mapped IPv6 addresses (`::ffff:127.0.0.1`) are judged as the IPv4 address.
pub(super) fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        v4 => v4,
    }
}

pub(super) fn contains(network: IpAddr, prefix: u8, address: IpAddr) -> bool {
    network.is_ipv4() == address.is_ipv4() && masked(network, prefix) == masked(address, prefix)
}

/// `address` with all but its first `prefix` bits cleared.
pub(super) fn masked(address: IpAddr, prefix: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & mask).into())
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & mask).into())
        }
    }
}

/// Networks with internal addresses (as `is_internal` judges them), for telling whether a
/// whole range is public.
const INTERNAL_NETWORKS: &[(&str, u8)] = &[
    ("0.0.0.0", 8),
    ("10.0.0.0", 8),
    ("100.64.0.0", 10),
    ("127.0.0.0", 8),
    ("169.254.0.0", 16),
    ("172.16.0.0", 12),
    ("192.0.0.0", 24),
    ("192.168.0.0", 16),
    ("198.18.0.0", 15),
    ("224.0.0.0", 3),
    ("::", 96),
    ("::ffff:0:0", 96),
    ("::ffff:0:0:0", 96),
    ("64:ff9b::", 96),
    ("64:ff9b:1::", 48),
    ("100::", 64),
    ("2002::", 16),
    ("fc00::", 7),
    ("fe80::", 9),
    ("ff00::", 8),
];

/// Whether the network `address/prefix` holds any internal address.
pub fn overlaps_internal(address: IpAddr, prefix: u8) -> bool {
    INTERNAL_NETWORKS.iter().any(|(network, length)| {
        let Ok(network) = network.parse::<IpAddr>() else {
            return false;
        };
        if network.is_ipv4() != address.is_ipv4() {
            return false;
        }
        // Two networks overlap when the wider one holds the other's start.
        let wider = prefix.min(*length);
        contains(network, wider, address) || contains(address, wider, network)
    })
}

/// Not a public internet address: this host, its links and private networks, and ranges
/// that are never routed publicly.
pub fn is_internal(address: IpAddr) -> bool {
    match canonical(address) {
        IpAddr::V4(v4) => is_internal_v4(v4),
        IpAddr::V6(v6) => is_internal_v6(v6),
    }
}

fn is_internal_v4(address: Ipv4Addr) -> bool {
    let [a, b, ..] = address.octets();
    address.is_unspecified()
        || address.is_loopback()
        || address.is_private()
        || address.is_link_local() // 169.254.0.0/16: the cloud metadata service lives here
        || address.is_broadcast()
        || address.is_multicast()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // carrier-grade NAT, 100.64.0.0/10
        || (a == 192 && b == 0 && address.octets()[2] == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking, 198.18.0.0/15
        || a >= 240 // reserved
}

fn is_internal_v6(address: Ipv6Addr) -> bool {
    let first = address.segments()[0];
    address.is_unspecified()
        || address.is_loopback()
        || address.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local, fc00::/7
        || (first & 0xffc0) == 0xfe80 // link-local, fe80::/10
        || (first & 0xffc0) == 0xfec0 // site-local (deprecated), fec0::/10
        // IPv4-compatible (::a.b.c.d) and NAT64 forms of internal IPv4 addresses.
        || address.to_ipv4().is_some_and(is_internal_v4)
        || (address.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
            && is_internal_v4(Ipv4Addr::from((u128::from(address) as u32).to_be_bytes())))
        || address.segments()[..3] == [0x64, 0xff9b, 1] // local-use NAT64, 64:ff9b:1::/48
        || first == 0x2002 // 6to4, 2002::/16: may carry any IPv4 address
        || address.segments()[..4] == [0x100, 0, 0, 0] // discard-only, 100::/64
        // SIIT's IPv4-translated form, ::ffff:0:a.b.c.d
        || (address.segments()[..6] == [0, 0, 0, 0, 0xffff, 0]
            && is_internal_v4(Ipv4Addr::from((u128::from(address) as u32).to_be_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("address")
    }

    #[test]
    fn this_hosts_own_addresses_are_refused() {
        let policy = EgressPolicy::new(Vec::new());
        assert!(!policy.own.is_empty(), "this host has addresses");
        for own in &policy.own {
            assert!(!policy.allows(*own), "{own}");
        }
    }

    #[test]
    fn internal_addresses_are_refused_and_public_ones_allowed() {
        let policy = EgressPolicy::default();
        for internal in [
            "127.0.0.1",
            "127.1.2.3",
            "0.0.0.0",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::808:808",
            "2002:7f00:1::1",
            "100::1",
            "::ffff:0:a9fe:a9fe",
        ] {
            assert!(!policy.allows(ip(internal)), "{internal}");
        }
        for public in ["203.0.113.10", "8.8.8.8", "1.1.1.1", "2606:4700::1111", "172.32.0.1"] {
            assert!(policy.allows(ip(public)), "{public}");
        }
    }

    #[test]
    fn operators_allow_networks_and_endpoints() {
        let policy = EgressPolicy::new(vec![
            "127.0.0.1".parse().expect("address"),
            "10.1.0.0/16".parse().expect("network"),
        ]);
        assert!(policy.allows(ip("127.0.0.1")));
        assert!(policy.allows(ip("::ffff:127.0.0.1")));
        assert!(!policy.allows(ip("127.0.0.2")));
        assert!(policy.allows(ip("10.1.200.3")));
        assert!(!policy.allows(ip("10.2.0.1")));
        assert_eq!(
            "Proxy.Internal:3128".parse::<Allowance>(),
            Ok(Allowance::Endpoint { host: "proxy.internal".into(), port: 3128 })
        );
        // An IPv4-mapped allowance is the IPv4 network it stands for, nothing more.
        let mapped = EgressPolicy::new(vec!["::ffff:10.0.0.5".parse().expect("mapped")]);
        assert!(mapped.allows(ip("10.0.0.5")) && mapped.allows(ip("::ffff:10.0.0.5")));
        assert!(!mapped.allows(ip("127.0.0.1")) && !mapped.allows(ip("10.0.0.6")));
        for bad in ["10.0.0.0/33", "nonsense", "host:", ":80", "1.2.3.4/x", "::ffff:10.0.0.0/95"] {
            assert!(bad.parse::<Allowance>().is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn names_are_judged_by_what_they_resolve_to() {
        let policy = EgressPolicy::default();
        let refused = policy.resolve("localhost:8080").await.expect_err("loopback");
        assert!(
            matches!(&refused, EgressError::Refused(why) if why.contains("--egress-allow")),
            "{refused}"
        );
        assert!(policy.resolve("[::1]:80").await.is_err());
        assert!(policy.resolve("169.254.169.254:80").await.is_err());
        assert_eq!(
            policy.resolve("203.0.113.10:3128").await,
            Ok("203.0.113.10:3128".parse().expect("address"))
        );

        let allowed = EgressPolicy::new(vec!["localhost:8080".parse().expect("endpoint")]);
        assert!(allowed.resolve("localhost:8080").await.is_ok());
        assert!(allowed.resolve("localhost:8081").await.is_err());
        let allowed = EgressPolicy::new(vec!["127.0.0.0/8".parse().expect("network")]);
        assert_eq!(
            allowed.resolve("127.0.0.1:9").await,
            Ok("127.0.0.1:9".parse().expect("address"))
        );
    }
}

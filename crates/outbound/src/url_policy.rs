//! Which URLs a merchant may register and asiento may call: no server-side request forgery.
//!
//! Only `https`, and `http` to hosts an operator allows (`serve --webhook-allow-hosts`, for tests
//! and private networks an operator trusts). Never a loopback, private, link-local (cloud
//! metadata: 169.254.169.254), shared, multicast, documentation or unspecified address unless an
//! allow-list entry names it. Checked at registration and again at every delivery after DNS
//! resolution, and the connection goes only to the addresses checked ([`PolicyResolver`]): a
//! name that resolves somewhere else later (DNS rebinding) is refused then.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::Url;

/// The longest URL an endpoint may have.
pub const URL_CHARS_MAX: usize = 2_048;

/// Why a URL is refused. Each is a 422 `webhook_url_refused` with this text as its detail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlRefused {
    #[error("not a URL: {0}")]
    Malformed(String),
    #[error("the URL is longer than {URL_CHARS_MAX} characters")]
    TooLong,
    #[error("only https URLs are allowed (http only to hosts the operator allows)")]
    Scheme,
    #[error("a URL with a user name or password is not allowed")]
    Credentials,
    #[error("the URL has no host")]
    NoHost,
    #[error("{host} is {kind}, which webhooks may not reach")]
    Address { host: String, kind: &'static str },
    #[error("{0} does not resolve")]
    Unresolvable(String),
}

/// One allow-list entry: a host name, or an address range.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Allowed {
    Host(String),
    Net { base: IpAddr, prefix: u8 },
}

/// The operator's allow-list: `127.0.0.1`, `10.0.0.0/8`, `hooks.internal`, comma-separated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(Vec<Allowed>);

impl AllowList {
    /// Parses `a,b,c`; an empty text allows nothing.
    pub fn parse(text: &str) -> Result<AllowList, String> {
        let mut entries = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (address, prefix) = match entry.split_once('/') {
                Some((address, prefix)) => (address, Some(prefix)),
                None => (entry, None),
            };
            match address.parse::<IpAddr>() {
                Ok(base) => {
                    let bits = if base.is_ipv4() { 32 } else { 128 };
                    let prefix = match prefix {
                        None => bits,
                        Some(p) => p
                            .parse::<u8>()
                            .ok()
                            .filter(|p| *p <= bits)
                            .ok_or_else(|| format!("{entry}: not a prefix length"))?,
                    };
                    entries.push(Allowed::Net { base, prefix });
                }
                Err(_) if prefix.is_none() && is_host_name(entry) => {
                    entries.push(Allowed::Host(entry.to_ascii_lowercase()));
                }
                Err(_) => return Err(format!("{entry}: neither a host name nor an address")),
            }
        }
        Ok(AllowList(entries))
    }

    fn allows_host(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        self.0.iter().any(|entry| match entry {
            Allowed::Host(name) => *name == host,
            Allowed::Net { .. } => host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_ok_and(|ip| self.allows_address(ip)),
        })
    }

    fn allows_address(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|entry| match entry {
            Allowed::Net { base, prefix } => in_net(ip, *base, *prefix),
            Allowed::Host(_) => false,
        })
    }
}

fn is_host_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && text.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

fn in_net(ip: IpAddr, base: IpAddr, prefix: u8) -> bool {
    let (ip, base, bits) = match (canonical(ip), canonical(base)) {
        (IpAddr::V4(ip), IpAddr::V4(base)) => {
            (u128::from(u32::from(ip)), u128::from(u32::from(base)), 32)
        }
        (IpAddr::V6(ip), IpAddr::V6(base)) => (u128::from(ip), u128::from(base), 128),
        _ => return false,
    };
    let shift = bits - u32::from(prefix);
    shift >= bits || (ip >> shift) == (base >> shift)
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// What kind of address this is when webhooks may not reach it; None for a public address.
#[must_use]
pub fn forbidden_kind(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        _ if ip.is_unspecified() || a == 0 => "an unspecified address",
        _ if ip.is_loopback() => "a loopback address",
        _ if ip.is_private() => "a private address",
        _ if ip.is_link_local() => "a link-local address (cloud metadata lives there)",
        (100, 64..=127, _) => "a shared (carrier-grade NAT) address",
        (192, 0, 0) | (198, 18..=19, _) | (240..=255, _, _) => "a reserved address",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "a documentation address",
        _ if ip.is_multicast() || ip.is_broadcast() => "a multicast or broadcast address",
        _ => return None,
    })
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    Some(match first {
        _ if ip.is_unspecified() => "an unspecified address",
        _ if ip.is_loopback() => "a loopback address",
        0xfc00..=0xfdff => "a private (unique local) address",
        0xfe80..=0xfebf => "a link-local address",
        0xff00..=0xffff => "a multicast address",
        0x2001 if ip.segments()[1] == 0x0db8 => "a documentation address",
        // NAT64 and the other embedded-IPv4 forms could name any IPv4 address behind them.
        0x0064 if ip.segments()[1] == 0xff9b => "a NAT64 address",
        0x0000 => "a reserved address",
        _ => return None,
    })
}

/// The URL policy of one deployment.
#[derive(Debug, Clone, Default)]
pub struct UrlPolicy {
    pub allow: AllowList,
}

impl UrlPolicy {
    /// Checks a URL's form: scheme, credentials, length, host; an IP literal's address.
    pub fn check_form(&self, text: &str) -> Result<Url, UrlRefused> {
        if text.len() > URL_CHARS_MAX {
            return Err(UrlRefused::TooLong);
        }
        let url = Url::parse(text).map_err(|error| UrlRefused::Malformed(error.to_string()))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(UrlRefused::Credentials);
        }
        let host = url.host_str().ok_or(UrlRefused::NoHost)?.to_owned();
        match url.scheme() {
            "https" => {}
            "http" if self.allow.allows_host(&host) => {}
            _ => return Err(UrlRefused::Scheme),
        }
        if let Some(ip) = literal(&url) {
            self.check_address(&host, ip)?;
        }
        Ok(url)
    }

    fn check_address(&self, host: &str, ip: IpAddr) -> Result<(), UrlRefused> {
        if self.allow.allows_host(host) || self.allow.allows_address(ip) {
            return Ok(());
        }
        match forbidden_kind(ip) {
            Some(kind) => Err(UrlRefused::Address {
                host: host.to_owned(),
                kind,
            }),
            None => Ok(()),
        }
    }

    /// The addresses `host` resolves to that a webhook may reach; refused if any it resolves to
    /// may not be reached (a name that resolves to a private address is refused whole).
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, UrlRefused> {
        let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|_| UrlRefused::Unresolvable(host.to_owned()))?
            .collect();
        if addresses.is_empty() {
            return Err(UrlRefused::Unresolvable(host.to_owned()));
        }
        for address in &addresses {
            self.check_address(host, address.ip())?;
        }
        Ok(addresses)
    }

    /// The whole check of a registration: the form, then where the name resolves.
    pub async fn check(&self, text: &str) -> Result<Url, UrlRefused> {
        let url = self.check_form(text)?;
        if literal(&url).is_none() {
            let host = url.host_str().ok_or(UrlRefused::NoHost)?;
            let port = url.port_or_known_default().unwrap_or(443);
            self.resolve(host, port).await?;
        }
        Ok(url)
    }
}

/// The address of a URL whose host is an IP literal.
fn literal(url: &Url) -> Option<IpAddr> {
    match url.host()? {
        url::Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
        url::Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
        url::Host::Domain(_) => None,
    }
}

/// The HTTP client's resolver: it connects only to addresses the policy allows, so a name that
/// resolves to a private address at delivery time is refused then, whatever it resolved to at
/// registration.
#[derive(Debug, Clone)]
pub struct PolicyResolver(pub Arc<UrlPolicy>);

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = Arc::clone(&self.0);
        Box::pin(async move {
            let addresses = policy.resolve(name.as_str(), 0).await.map_err(
                |refused| -> Box<dyn std::error::Error + Send + Sync> { Box::new(refused) },
            )?;
            let addrs: reqwest::dns::Addrs = Box::new(addresses.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &str) -> UrlPolicy {
        UrlPolicy {
            allow: AllowList::parse(allow).unwrap_or_else(|e| panic!("{e}")),
        }
    }

    #[test]
    fn only_public_https_passes_without_an_allow_list() {
        let open = policy("");
        assert!(open.check_form("https://93.184.215.14/hooks").is_ok());
        assert!(open.check_form("https://[2606:4700::1111]/hooks").is_ok());
        for (url, refused) in [
            ("http://93.184.215.14/", UrlRefused::Scheme),
            ("ftp://93.184.215.14/", UrlRefused::Scheme),
            ("https://user:pw@93.184.215.14/", UrlRefused::Credentials),
        ] {
            assert_eq!(open.check_form(url).err(), Some(refused), "{url}");
        }
        for url in [
            "https://127.0.0.1/",
            "https://10.1.2.3/",
            "https://172.16.0.1/",
            "https://192.168.1.1/",
            "https://169.254.169.254/latest/meta-data/",
            "https://100.64.0.1/",
            "https://0.0.0.0/",
            "https://224.0.0.1/",
            "https://[::1]/",
            "https://[fd00::1]/",
            "https://[fe80::1]/",
            "https://[::ffff:127.0.0.1]/",
            "https://[::ffff:169.254.169.254]/",
            "https://[64:ff9b::a9fe:a9fe]/",
        ] {
            assert!(
                matches!(open.check_form(url), Err(UrlRefused::Address { .. })),
                "{url}: {:?}",
                open.check_form(url)
            );
        }
        assert!(matches!(
            open.check_form(&format!("https://a.example/{}", "x".repeat(URL_CHARS_MAX))),
            Err(UrlRefused::TooLong)
        ));
        assert!(matches!(
            open.check_form("not a url"),
            Err(UrlRefused::Malformed(_))
        ));
    }

    #[test]
    fn the_allow_list_opens_http_and_private_addresses_it_names_only() {
        let local = policy("127.0.0.1, 10.0.0.0/8, hooks.internal");
        assert!(local.check_form("http://127.0.0.1:8080/hooks").is_ok());
        assert!(local.check_form("http://10.200.0.7/").is_ok());
        assert!(local.check_form("http://hooks.internal/").is_ok());
        assert_eq!(
            local.check_form("http://127.0.0.2/").err(),
            Some(UrlRefused::Scheme)
        );
        assert!(matches!(
            local.check_form("https://192.168.0.1/"),
            Err(UrlRefused::Address { .. })
        ));
        assert!(matches!(
            local.check_form("https://169.254.169.254/"),
            Err(UrlRefused::Address { .. })
        ));
        assert!(AllowList::parse("10.0.0.0/33").is_err());
        assert!(AllowList::parse("not an_entry!").is_err());
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_a_private_address_is_refused_unless_allowed() {
        let open = policy("");
        assert!(matches!(
            open.check("https://localhost/hooks").await,
            Err(UrlRefused::Address { .. })
        ));
        assert!(policy("localhost")
            .check("http://localhost:9/")
            .await
            .is_ok());
        assert!(matches!(
            open.check("https://no-such-host.invalid/").await,
            Err(UrlRefused::Unresolvable(_))
        ));
    }
}

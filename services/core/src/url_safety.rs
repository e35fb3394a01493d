//! Egress checks for target and webhook URLs (seed §5 "Egress"). This module judges a URL and
//! an IP address; resolving names is I/O and belongs to the caller, which passes each resolved
//! address back through [`private_reason`] (at write, and again at call time against DNS
//! rebinding).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

/// Parses an outbound base URL: `http`/`https`, a host, no credentials, no query, no fragment.
pub fn parse_outbound_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|e| format!("is not a valid URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("scheme {:?} is not allowed; use https (or http)", url.scheme()));
    }
    if url.host().is_none() {
        return Err("has no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry credentials; use auth with a vault secret".into());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("must not have a query or fragment".into());
    }
    Ok(url)
}

/// Why a URL's host is not a public destination, judged from the URL alone (IP literals and
/// `localhost` names); `None` for a public IP or any other name.
pub fn url_private_reason(url: &Url) -> Option<&'static str> {
    match url.host()? {
        Host::Ipv4(ip) => private_reason(IpAddr::V4(ip)),
        Host::Ipv6(ip) => private_reason(IpAddr::V6(ip)),
        Host::Domain(name) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            (name == "localhost" || name.ends_with(".localhost")).then_some("loopback")
        }
    }
}

/// Why an address is not a public destination (loopback, private, link-local, …), or `None`.
pub fn private_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            // An IPv6 spelling of an IPv4 address is judged as that address.
            Some(v4) => v4_reason(v4).or_else(|| v6_reason(v6)),
            None => v6_reason(v6),
        },
    }
}

fn v4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_private() {
        Some("private (RFC 1918)")
    } else if ip.is_link_local() {
        Some("link-local (cloud metadata lives here)")
    } else if ip.is_unspecified() || a == 0 {
        Some("unspecified")
    } else if a == 100 && (64..128).contains(&b) {
        Some("carrier-grade NAT")
    } else if ip.is_broadcast() || ip.is_multicast() || a >= 240 {
        Some("broadcast, multicast or reserved")
    } else {
        None
    }
}

/// The IPv4 address an IPv6 address carries where a network may route it to that IPv4 host:
/// IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`, deprecated), NAT64's
/// well-known prefix (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let tail = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if let Some(v4) = ip.to_ipv4_mapped() {
        Some(v4)
    } else if (s[..6] == [0; 6] && !ip.is_loopback() && !ip.is_unspecified()) || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        Some(tail(s[6], s[7]))
    } else if s[0] == 0x2002 {
        Some(tail(s[1], s[2]))
    } else {
        None
    }
}

fn v6_reason(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.is_unique_local() {
        Some("private (unique local)")
    } else if ip.is_unicast_link_local() {
        Some("link-local")
    } else if ip.is_multicast() {
        Some("multicast")
    } else {
        None
    }
}

/// A vault binding is a bare host name or IP: no scheme, port, path or wildcard.
pub fn check_binding(binding: &str) -> Result<(), String> {
    if binding.is_empty() || binding.len() > 253 {
        return Err("must be a host name or IP of 1-253 characters".into());
    }
    if binding.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if binding.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(format!("{binding:?} is not a bare host or IP (no scheme, port, path or wildcard)"))
    }
}

/// The host of a URL in the form bindings use (IPv6 without brackets, names lower-cased).
pub fn binding_host(url: &Url) -> Option<String> {
    Some(match url.host()? {
        Host::Ipv4(ip) => ip.to_string(),
        Host::Ipv6(ip) => ip.to_string(),
        Host::Domain(name) => name.trim_end_matches('.').to_ascii_lowercase(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_syntax() {
        assert!(parse_outbound_url("https://api.openai.com/v1").is_ok());
        for (bad, why) in [
            ("ftp://x.io", "scheme"),
            ("not a url", "not a valid URL"),
            ("https://user:pw@x.io/v1", "credentials"),
            ("https://x.io/v1?key=1", "query"),
            ("file:///etc/passwd", "scheme"),
            ("https://x.io/#frag", "fragment"),
        ] {
            let err = parse_outbound_url(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn private_hosts() {
        let cases = [
            ("http://127.0.0.1:9100/v1", Some("loopback")),
            ("http://localhost/v1", Some("loopback")),
            ("http://api.localhost/v1", Some("loopback")),
            ("http://10.1.2.3/v1", Some("private (RFC 1918)")),
            ("http://192.168.0.1/v1", Some("private (RFC 1918)")),
            ("http://172.16.5.5/v1", Some("private (RFC 1918)")),
            ("http://169.254.169.254/latest", Some("link-local (cloud metadata lives here)")),
            ("http://100.64.0.1/", Some("carrier-grade NAT")),
            ("http://0.0.0.0/", Some("unspecified")),
            ("http://[::1]/", Some("loopback")),
            ("http://[fd00::1]/", Some("private (unique local)")),
            ("http://[fe80::1]/", Some("link-local")),
            ("http://[::ffff:127.0.0.1]/", Some("loopback")),
            ("http://[::ffff:a9fe:a9fe]/", Some("link-local (cloud metadata lives here)")),
            ("http://[::10.0.0.1]/", Some("private (RFC 1918)")),
            ("http://[64:ff9b::7f00:1]/", Some("loopback")),
            ("http://[64:ff9b::a9fe:a9fe]/", Some("link-local (cloud metadata lives here)")),
            ("http://[2002:c0a8:101::1]/", Some("private (RFC 1918)")),
            ("http://[64:ff9b::808:808]/", None),
            ("http://[2606:4700::1111]/", None),
            ("http://[::ffff:10.0.0.1]/", Some("private (RFC 1918)")),
            ("https://8.8.8.8/", None),
            ("https://172.32.0.1/", None),
            ("https://api.openai.com/v1", None),
        ];
        for (url, want) in cases {
            let url = parse_outbound_url(url).unwrap();
            assert_eq!(url_private_reason(&url), want, "{url}");
        }
    }

    #[test]
    fn bindings() {
        for ok in ["api.openai.com", "127.0.0.1", "::1", "my-host"] {
            assert!(check_binding(ok).is_ok(), "{ok}");
        }
        for bad in ["https://api.openai.com", "api.openai.com:443", "*.openai.com", "a/b", "", "-x.io"] {
            assert!(check_binding(bad).is_err(), "{bad}");
        }
        let url = parse_outbound_url("https://API.OpenAI.com./v1").unwrap();
        assert_eq!(binding_host(&url).as_deref(), Some("api.openai.com"));
    }
}

//! Host normalisation shared by policy patterns and requests, so both sides compare like forms.

use std::net::{IpAddr, Ipv6Addr};

/// Why a host string was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostError {
    #[error("empty host")]
    Empty,
    #[error("host is longer than 253 characters")]
    TooLong,
    #[error("host {0:?} has an empty label")]
    EmptyLabel(String),
    #[error("host {0:?} has a label longer than 63 characters")]
    LongLabel(String),
    #[error("host {0:?} is not ASCII: write its punycode (xn--) form")]
    NotAscii(String),
    #[error("host {host:?} contains {ch:?}, which is not allowed in a host name")]
    BadChar { host: String, ch: char },
    #[error("host {0:?} is a bracketed address that is not IPv6")]
    BadBracket(String),
    #[error("{0}")]
    BadNumeric(String),
}

/// Normalises a host: lower-case, one trailing dot removed, IPv6 without brackets and in
/// canonical form, IPv4 dotted-quad kept as is. Anything that is not a plain DNS name or IP
/// literal is an error: a proxy must not guess what an odd host form means.
pub fn normalize_host(raw: &str) -> Result<String, HostError> {
    // Numeric forms libc and browsers accept (2852039166, 0xA9FEA9FE, 127.1, ::ffff:a.b.c.d)
    // are addresses: compare and audit them in canonical form; invalid ones are refused.
    match crate::upstream::hostform::parse_ip_host(raw) {
        Ok(Some(ip)) => return Ok(ip.to_string()),
        Ok(None) => {}
        Err(e) => return Err(HostError::BadNumeric(e.to_string())),
    }
    if let Some(inner) = raw.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| HostError::BadBracket(raw.to_string()))?;
        return inner
            .parse::<Ipv6Addr>()
            .map(|ip| ip.to_string())
            .map_err(|_| HostError::BadBracket(raw.to_string()));
    }
    if let Ok(ip) = raw.parse::<IpAddr>() {
        return Ok(ip.to_string());
    }
    let host = raw.strip_suffix('.').unwrap_or(raw);
    if host.is_empty() {
        return Err(HostError::Empty);
    }
    if !host.is_ascii() {
        return Err(HostError::NotAscii(raw.to_string()));
    }
    if host.len() > 253 {
        return Err(HostError::TooLong);
    }
    let host = host.to_ascii_lowercase();
    for label in host.split('.') {
        if label.is_empty() {
            return Err(HostError::EmptyLabel(raw.to_string()));
        }
        if label.len() > 63 {
            return Err(HostError::LongLabel(raw.to_string()));
        }
        if let Some(ch) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(HostError::BadChar {
                host: raw.to_string(),
                ch,
            });
        }
    }
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_case_trailing_dot_and_ipv6_brackets() {
        assert_eq!(
            normalize_host("API.Example.COM.").as_deref(),
            Ok("api.example.com")
        );
        assert_eq!(normalize_host("[::1]").as_deref(), Ok("::1"));
        assert_eq!(normalize_host("[0:0::1]").as_deref(), Ok("::1"));
        assert_eq!(normalize_host("127.0.0.1").as_deref(), Ok("127.0.0.1"));
        assert_eq!(
            normalize_host("2852039166").as_deref(),
            Ok("169.254.169.254")
        );
        assert_eq!(
            normalize_host("0xA9FEA9FE").as_deref(),
            Ok("169.254.169.254")
        );
        assert_eq!(
            normalize_host("[::ffff:169.254.169.254]").as_deref(),
            Ok("::ffff:169.254.169.254")
        );
    }

    #[test]
    fn rejects_odd_host_forms() {
        assert!(normalize_host("").is_err());
        assert!(normalize_host(".").is_err());
        assert!(normalize_host("a..b").is_err());
        assert!(normalize_host("a b").is_err());
        assert!(normalize_host("a/b").is_err());
        assert!(normalize_host("user@host").is_err());
        assert!(normalize_host("bücher.de").is_err());
        assert!(normalize_host("[127.0.0.1]").is_err());
        assert!(normalize_host("256.1.1.1").is_err());
        assert!(normalize_host("1.2.3.4.5").is_err());
        assert!(normalize_host(&"a".repeat(64)).is_err());
    }
}

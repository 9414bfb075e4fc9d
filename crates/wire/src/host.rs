//! Hosts: the one reading of a host string that policy matches, the audit records and the
//! upstream dials, and the one way latchkey writes a host back into an authority or URL.
//!
//! A sandbox can spell `169.254.169.254` as `2852039166`, `0xA9FEA9FE`, `0251.0376.0251.0376`,
//! `169.254.43518`, `169.254.169.254.` or `[::ffff:169.254.169.254]`; every one of them must reach
//! the address guard as that address, never the resolver as a name. The rules are the WHATWG URL
//! standard's IPv4 parser (which matches `inet_aton` for these forms): a host whose last label is
//! a number is an IPv4 address, and if it is not a valid one it is an error, not a name. The
//! address itself is `url::Host::parse`'s (the WHATWG parser browsers and most HTTP clients
//! follow); latchkey only adds the strictness and the error messages.
//!
//! Stricter than WHATWG where leniency only helps an attacker: empty labels, `%`
//! (percent-encoding, zone ids), whitespace, control and non-ASCII characters are errors rather
//! than names. Never resolves or dials; depends on nothing in the crate.
//!
//! ```text
//! parse_ip_host("0xA9FEA9FE")       → Ok(Some(169.254.169.254))
//! parse_ip_host("127.1")            → Ok(Some(127.0.0.1))
//! parse_ip_host("api.example.com")  → Ok(None)
//! parse_ip_host("256.1.1.1")        → Err(part "256" is larger than 255)
//! normalize_host("API.Example.COM.") → Ok("api.example.com")
//! display_authority("::1", 443)     → "[::1]:443"
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why a host is neither an IP literal nor a DNS name. Messages name the host.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostFormError {
    #[error("empty host")]
    Empty,
    #[error("host {host:?} contains {what}")]
    InvalidChar { host: String, what: &'static str },
    #[error("host {host:?} has an empty label")]
    EmptyLabel { host: String },
    #[error("host {host:?}: brackets must enclose exactly one IPv6 address")]
    Brackets { host: String },
    #[error("host {host:?} has an IPv6 zone id; zone ids are not accepted")]
    ZoneId { host: String },
    #[error("host {host:?} is not a valid IPv6 address")]
    InvalidIpv6 { host: String },
    #[error(
        "host {host:?} ends in a number, so it is an IPv4 address, but it has more than 4 parts"
    )]
    TooManyParts { host: String },
    #[error(
        "host {host:?} ends in a number, so it is an IPv4 address, but {part:?} is not a \
         decimal, octal (0…) or hex (0x…) number"
    )]
    NotANumber { host: String, part: String },
    #[error("host {host:?}: IPv4 part {part:?} is larger than 255")]
    PartTooLarge { host: String, part: String },
    #[error("host {host:?}: IPv4 part {part:?} is too large for the bytes that remain")]
    OutOfRange { host: String, part: String },
}

/// Parses a host the way `inet_aton` and WHATWG URL parsers treat numeric hosts.
///
/// `host` is the bare host, without a port. Returns `Ok(Some(ip))` for any IP form — IPv4 in
/// 1–4 decimal, octal (`0`-prefixed) or hex (`0x`) parts with an optional single trailing dot,
/// and IPv6 bracketed or not; `Ok(None)` for a DNS name (its last label is not a number); `Err`
/// for a host that looks numeric but is not a valid address (`256.1.1.1`, `0x100000000`,
/// `08.1.1.1`, `1.2.3.4.5`), which must be refused, never resolved as a name. IPv6 is returned as
/// written (`::ffff:169.254.169.254` stays IPv6; the guard judges the IPv4 inside it).
pub fn parse_ip_host(host: &str) -> Result<Option<IpAddr>, HostFormError> {
    if host.is_empty() {
        return Err(HostFormError::Empty);
    }
    let invalid = |what| HostFormError::InvalidChar {
        host: host.to_string(),
        what,
    };
    if !host.is_ascii() {
        return Err(invalid("a non-ASCII character"));
    }
    if host
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(invalid("whitespace or a control character"));
    }
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| HostFormError::Brackets {
                host: host.to_string(),
            })?;
        return parse_ipv6(host, inner).map(Some);
    }
    if host.contains(']') {
        return Err(HostFormError::Brackets {
            host: host.to_string(),
        });
    }
    if host.contains(':') {
        return parse_ipv6(host, host).map(Some);
    }
    if host.contains('%') {
        return Err(invalid("'%' (percent-encoding is not decoded in a host)"));
    }
    parse_ipv4_host(host)
}

/// IPv6 through std's parser, which agrees with WHATWG's on every bracketed form (the property
/// tests check it) and, unlike `url::Host::parse`, takes the text without brackets as well.
fn parse_ipv6(host: &str, text: &str) -> Result<IpAddr, HostFormError> {
    if text.contains('%') {
        return Err(HostFormError::ZoneId {
            host: host.to_string(),
        });
    }
    text.parse::<Ipv6Addr>()
        .map(IpAddr::V6)
        .map_err(|_| HostFormError::InvalidIpv6 {
            host: host.to_string(),
        })
}

/// A host with no brackets, `:` or `%`: an IPv4 address when its last label is a number.
fn parse_ipv4_host(host: &str) -> Result<Option<IpAddr>, HostFormError> {
    // The usual spelling, four decimal parts without leading zeros, is std's whole grammar and
    // means the same to WHATWG: read it without `url`'s IDNA pass and allocation (the hot path
    // for upstreams named by address).
    if let Ok(v4) = host.parse::<Ipv4Addr>() {
        return Ok(Some(IpAddr::V4(v4)));
    }
    // One trailing dot (an absolute name) is dropped, as WHATWG and resolvers do.
    let body = host.strip_suffix('.').unwrap_or(host);
    if body.split('.').any(str::is_empty) {
        return Err(HostFormError::EmptyLabel {
            host: host.to_string(),
        });
    }
    // WHATWG "ends in a number": all ASCII digits, or a valid IPv4 number (such as 0x1F). A
    // name never reaches `url` (its IDNA pass is work a name does not need here).
    let last = body.rsplit('.').next().unwrap_or(body);
    let ends_in_number = last.bytes().all(|b| b.is_ascii_digit()) || parse_number(last).is_some();
    if !ends_in_number {
        return Ok(None);
    }
    match url::Host::parse(host) {
        Ok(url::Host::Ipv4(address)) => Ok(Some(IpAddr::V4(address))),
        // `url` refused it (or, against the rule above, read something else): refused here
        // too, with the part that is wrong, which `url`'s error does not name.
        _ => Err(why_not_ipv4(host, body)),
    }
}

/// One IPv4 part's value. WHATWG numbers are unbounded; anything past `u64` is simply too large.
#[derive(Clone, Copy)]
enum Number {
    Value(u64),
    TooLarge,
}

/// The WHATWG "IPv4 number parser": `0x`/`0X` → hex (`"0x"` alone is 0), a leading `0` → octal,
/// else decimal. `None` when a character is not a digit of that radix (`"08"`, `"1a"`).
fn parse_number(part: &str) -> Option<Number> {
    let (digits, radix) = if part.len() >= 2 && (part.starts_with("0x") || part.starts_with("0X")) {
        (&part[2..], 16)
    } else if part.len() >= 2 && part.starts_with('0') {
        (&part[1..], 8)
    } else {
        (part, 10)
    };
    if part.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let mut value: u64 = 0;
    for c in digits.chars() {
        let digit = u64::from(c.to_digit(radix)?);
        match value
            .checked_mul(u64::from(radix))
            .and_then(|v| v.checked_add(digit))
        {
            Some(v) => value = v,
            None => return Some(Number::TooLarge),
        }
    }
    Some(Number::Value(value))
}

/// Why a host that ends in a number is not an IPv4 address. Only called once `url` has
/// refused the host.
fn why_not_ipv4(host: &str, body: &str) -> HostFormError {
    // Every part is in range, yet `url` refused the host: fail closed on the whole host.
    first_bad_part(host, body).unwrap_or_else(|| HostFormError::OutOfRange {
        host: host.to_string(),
        part: host.to_string(),
    })
}

/// The first part of `body` (the host without its trailing dot) that keeps it from being an
/// IPv4 address, in the WHATWG IPv4 parser's order; `None` when it is one.
fn first_bad_part(host: &str, body: &str) -> Option<HostFormError> {
    let count = body.split('.').count();
    if count > 4 {
        return Some(HostFormError::TooManyParts {
            host: host.to_string(),
        });
    }
    let last = count - 1;
    body.split('.').enumerate().find_map(|(i, part)| {
        let part_text = || part.to_string();
        let Some(number) = parse_number(part) else {
            return Some(HostFormError::NotANumber {
                host: host.to_string(),
                part: part_text(),
            });
        };
        if i == last {
            // The last part fills the bytes the others left: 4 bytes alone, 1 byte of 4 parts.
            let limit = 1u64 << (8 * (5 - count));
            (!matches!(number, Number::Value(v) if v < limit)).then(|| HostFormError::OutOfRange {
                host: host.to_string(),
                part: part_text(),
            })
        } else {
            (!matches!(number, Number::Value(v) if v <= 255)).then(|| HostFormError::PartTooLarge {
                host: host.to_string(),
                part: part_text(),
            })
        }
    })
}

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
    match parse_ip_host(raw) {
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

/// A host as it goes into an authority or URL: an IPv6 address in brackets, anything else (an
/// address already in brackets too) as is. The one host bracketer: every `host:port` and URL
/// latchkey writes goes through it, [`Authority`] or [`display_authority`].
#[derive(Clone, Copy, Debug)]
pub struct Bracketed<'a>(pub &'a str);

/// Whether `host` is written bracketed in an authority (an IPv6 literal not yet bracketed).
fn needs_brackets(host: &str) -> bool {
    host.contains(':') && !host.starts_with('[')
}

impl fmt::Display for Bracketed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if needs_brackets(self.0) {
            write!(f, "[{}]", self.0)
        } else {
            f.write_str(self.0)
        }
    }
}

/// `host:port` with an IPv6 host bracketed, or only the host when `port` is `default_port` (a
/// URL's authority leaves the scheme's default out). Formats straight into a message or a URI.
#[derive(Clone, Copy, Debug)]
pub struct Authority<'a> {
    pub host: &'a str,
    pub port: u16,
    /// The port that is left out; `None` always writes the port.
    pub default_port: Option<u16>,
}

impl fmt::Display for Authority<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Bracketed(self.host).fmt(f)?;
        if Some(self.port) != self.default_port {
            write!(f, ":{}", self.port)?;
        }
        Ok(())
    }
}

/// `host:port`, with IPv6 hosts bracketed.
pub fn display_authority(host: &str, port: u16) -> String {
    Authority {
        host,
        port,
        default_port: None,
    }
    .to_string()
}

/// The length of [`display_authority`]`(host, port)`, without writing it (a request's
/// `bytes_up` estimate needs only the count).
pub fn authority_len(host: &str, port: u16) -> usize {
    let brackets = if needs_brackets(host) { 2 } else { 0 };
    host.len() + brackets + 1 + itoa::Buffer::new().format(port).len()
}

/// `ip:port` of a socket address, as its `Display` writes it (IPv6 bracketed), without the
/// formatting machinery for IPv4: every request's record carries one or two of these.
pub fn socket_addr_text(addr: std::net::SocketAddr) -> String {
    let std::net::SocketAddr::V4(v4) = addr else {
        return addr.to_string();
    };
    let mut out = String::with_capacity(21);
    let mut n = itoa::Buffer::new();
    for (i, octet) in v4.ip().octets().iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(n.format(*octet));
    }
    out.push(':');
    out.push_str(n.format(v4.port()));
    out
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;

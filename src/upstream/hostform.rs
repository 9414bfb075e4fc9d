//! Host forms: owns the decision whether a request's host is an IP address literal, parsed the
//! way clients and libc parse it, or a DNS name to resolve.
//!
//! A sandbox can spell `169.254.169.254` as `2852039166`, `0xA9FEA9FE`, `0251.0376.0251.0376`,
//! `169.254.43518`, `169.254.169.254.` or `[::ffff:169.254.169.254]`; every one of them must reach
//! the address guard as that address, never the resolver as a name. The rules are the WHATWG URL
//! standard's IPv4 parser (which matches `inet_aton` for these forms): a host whose last label is
//! a number is an IPv4 address, and if it is not a valid one it is an error, not a name.
//!
//! This module never resolves or dials, and is stricter than WHATWG where leniency only helps
//! an attacker: empty labels, `%` (percent-encoding, zone ids), whitespace, control and
//! non-ASCII characters are errors rather than names.
//!
//! ```text
//! parse_ip_host("0xA9FEA9FE")       → Ok(Some(169.254.169.254))
//! parse_ip_host("127.1")            → Ok(Some(127.0.0.1))
//! parse_ip_host("api.example.com")  → Ok(None)
//! parse_ip_host("256.1.1.1")        → Err(part "256" is larger than 255)
//! ```

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

fn parse_ipv4_host(host: &str) -> Result<Option<IpAddr>, HostFormError> {
    let mut labels: Vec<&str> = host.split('.').collect();
    // One trailing dot (an absolute name) is dropped, as WHATWG and resolvers do.
    if labels.len() > 1 && labels.last().is_some_and(|l| l.is_empty()) {
        labels.pop();
    }
    if labels.iter().any(|l| l.is_empty()) {
        return Err(HostFormError::EmptyLabel {
            host: host.to_string(),
        });
    }
    // WHATWG "ends in a number": all ASCII digits, or a valid IPv4 number (such as 0x1F).
    let Some(last) = labels.last() else {
        return Err(HostFormError::Empty);
    };
    let ends_in_number = last.bytes().all(|b| b.is_ascii_digit()) || parse_number(last).is_some();
    if !ends_in_number {
        return Ok(None);
    }
    if labels.len() > 4 {
        return Err(HostFormError::TooManyParts {
            host: host.to_string(),
        });
    }
    let mut address: u64 = 0;
    let count = labels.len();
    for (i, part) in labels.iter().enumerate() {
        let number = parse_number(part).ok_or_else(|| HostFormError::NotANumber {
            host: host.to_string(),
            part: part.to_string(),
        })?;
        if i + 1 == count {
            // The last part fills the bytes the others left: 4 bytes alone, 1 byte of 4 parts.
            let limit = 1u64 << (8 * (5 - count));
            match number {
                Number::Value(v) if v < limit => address += v,
                _ => {
                    return Err(HostFormError::OutOfRange {
                        host: host.to_string(),
                        part: part.to_string(),
                    })
                }
            }
        } else {
            match number {
                Number::Value(v) if v <= 255 => address += v << (8 * (3 - i)),
                _ => {
                    return Err(HostFormError::PartTooLarge {
                        host: host.to_string(),
                        part: part.to_string(),
                    })
                }
            }
        }
    }
    let address = u32::try_from(address).map_err(|_| HostFormError::OutOfRange {
        host: host.to_string(),
        part: host.to_string(),
    })?;
    Ok(Some(IpAddr::V4(Ipv4Addr::from_bits(address))))
}

#[cfg(test)]
#[path = "hostform_tests.rs"]
mod tests;

//! IP address ranges (CIDRs) as policy and flags write them: `--allow-private`, a rule's
//! `allow_private`, an identity's `sources`.
//!
//! The arithmetic is `ipnet`'s; this module owns what latchkey adds on top: strict parsing with
//! errors that name the fix (host bits set, prefix out of range), and one reading of IPv4-mapped
//! IPv6 (`::ffff:a.b.c.d` is `a.b.c.d`) on both sides of a comparison. Depends on nothing in the
//! crate.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::{IpNet, Ipv4Net};

/// An IP network (CIDR), v4 or v6.
///
/// An IPv4-mapped address is its IPv4 address: an IPv4 range contains `::ffff:a.b.c.d` when it
/// contains `a.b.c.d`, and an IPv6 range never contains a mapped address. A range written inside
/// `::ffff:0:0/96` (`::ffff:10.1.2.0/120`) is stored as the IPv4 range it denotes (`10.1.2.0/24`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr(IpNet);

/// Why a CIDR string was not accepted. Messages name the input and, where there is one, the fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error(
        "{input:?} is not an IP network; expected an address with an optional prefix length, \
         like 10.1.2.0/24 or fd00::/8"
    )]
    Invalid { input: String },
    #[error("{input}: prefix length {prefix:?} is not a number")]
    BadPrefix { input: String, prefix: String },
    #[error("{input}: prefix length {prefix} is out of range for {family} (0-{max})")]
    PrefixOutOfRange {
        input: String,
        prefix: String,
        family: &'static str,
        max: u8,
    },
    #[error("{input} has host bits set; did you mean {network}?")]
    HostBitsSet { input: String, network: Cidr },
}

impl Cidr {
    /// Parses `"10.1.2.0/24"`, `"fd00::/8"`, or a bare address (`/32` or `/128`).
    ///
    /// Refuses a network with host bits set (`10.1.2.3/24`; the error suggests `10.1.2.0/24`),
    /// a prefix longer than the family allows, and anything that is not an address. The prefix
    /// is read here rather than by `IpNet::from_str`, which accepts neither a bare address nor
    /// says which part was wrong.
    pub fn parse(s: &str) -> Result<Cidr, CidrError> {
        let (addr_text, prefix_text) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let addr: IpAddr = addr_text.parse().map_err(|_| CidrError::Invalid {
            input: s.to_string(),
        })?;
        let max = max_prefix(addr);
        let out_of_range = |text: &str| CidrError::PrefixOutOfRange {
            input: s.to_string(),
            prefix: text.to_string(),
            family: if addr.is_ipv4() { "IPv4" } else { "IPv6" },
            max,
        };
        let prefix = match prefix_text {
            None => max,
            Some(text) => {
                if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(CidrError::BadPrefix {
                        input: s.to_string(),
                        prefix: text.to_string(),
                    });
                }
                match text.parse::<u8>() {
                    Ok(prefix) if prefix <= max => prefix,
                    _ => return Err(out_of_range(text)),
                }
            }
        };
        let net = IpNet::new(addr, prefix).map_err(|_| out_of_range(&prefix.to_string()))?;
        if net.network() != addr {
            return Err(CidrError::HostBitsSet {
                input: s.to_string(),
                network: Cidr(net.trunc()).normalized(),
            });
        }
        Ok(Cidr(net).normalized())
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.0.addr()
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.0.prefix_len()
    }

    /// True when the range is one address (`/32`, `/128`).
    pub fn is_single_address(&self) -> bool {
        self.0.prefix_len() == self.0.max_prefix_len()
    }

    /// True when `ip` is inside this range. An IPv4 range also contains the IPv4-mapped IPv6
    /// form `::ffff:a.b.c.d` of its addresses; an IPv6 range never contains a mapped address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.0, ip) {
            (IpNet::V4(net), IpAddr::V4(ip)) => net.contains(&ip),
            (IpNet::V4(net), IpAddr::V6(ip)) => {
                ip.to_ipv4_mapped().is_some_and(|ip| net.contains(&ip))
            }
            (IpNet::V6(net), IpAddr::V6(ip)) => ip.to_ipv4_mapped().is_none() && net.contains(&ip),
            (IpNet::V6(_), IpAddr::V4(_)) => false,
        }
    }

    /// A range inside `::ffff:0:0/96` becomes the IPv4 range it denotes.
    fn normalized(self) -> Cidr {
        match self.0 {
            IpNet::V6(v6) if v6.prefix_len() >= 96 => {
                match v6
                    .addr()
                    .to_ipv4_mapped()
                    .map(|v4| Ipv4Net::new(v4, v6.prefix_len() - 96))
                {
                    Some(Ok(v4)) => Cidr(IpNet::V4(v4)),
                    _ => self,
                }
            }
            _ => self,
        }
    }
}

impl From<IpAddr> for Cidr {
    /// The single-address range (`/32`, `/128`) of `ip`.
    fn from(ip: IpAddr) -> Cidr {
        Cidr(IpNet::from(ip)).normalized()
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        Cidr::parse(s)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr(), self.prefix())
    }
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cidr")
            .field("addr", &self.addr())
            .field("prefix", &self.prefix())
            .finish()
    }
}

fn max_prefix(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parsing, display and containment tables live with the guard
    /// (`crates/upstream/src/guard_tests.rs`), which uses these ranges; here, what `ipnet` must not
    /// change: a mapped range and the IPv4 range it denotes are one value.
    #[test]
    fn a_mapped_range_is_the_ipv4_range_it_denotes() {
        let mapped = Cidr::parse("::ffff:10.1.2.0/120").ok();
        let plain = Cidr::parse("10.1.2.0/24").ok();
        assert_eq!(mapped, plain);
        assert!(mapped.is_some());
        let one: Cidr = IpAddr::from([0, 0, 0, 0, 0, 0xffff, 0x0a01, 0x0203]).into();
        assert_eq!(one.to_string(), "10.1.2.3/32");
        assert_eq!(
            format!("{one:?}"),
            "Cidr { addr: 10.1.2.3, prefix: 32 }",
            "Debug keeps the shape it had before ipnet"
        );
    }
}

//! The address guard: owns the decision whether one resolved upstream address may be dialed.
//!
//! Every address the upstream dialer is about to connect to passes [`AddressGuard::check`]
//! first; the dialer then connects to exactly that address. This module only classifies
//! addresses: it never resolves a name, never opens a socket, and never lets a configuration
//! value widen what it refuses by default except through an explicit allowed range.
//!
//! Decision order for one address (the first step that applies decides):
//!
//! 1. one of latchkey's own listen addresses → refused, always: a request to latchkey itself is
//!    a loop, and no allowed range opens it;
//! 2. public unicast ([`classify`] returns `None`) → allowed;
//! 3. cloud metadata → refused unless an allowed range is exactly that one address (`/32` or
//!    `/128`): a broad `--allow-private 169.254.0.0/16` does not open `169.254.169.254`;
//! 4. any other non-public class → allowed only inside an allowed range (`--allow-private` plus
//!    the matching rule's `allow_private`), refused otherwise.
//!
//! IPv6 forms that carry an IPv4 address (IPv4-mapped, IPv4-compatible, NAT64, 6to4, Teredo) are
//! judged by the IPv4 address they carry, so `[::ffff:169.254.169.254]` is cloud metadata too.
//! The classes themselves are in `class.rs` (re-exported here); the ranges an operator opens are
//! [`crate::wire::cidr::Cidr`]s.
//!
//! ```text
//! guard = AddressGuard::new(vec!["10.1.2.0/24".parse()?], vec![listen_addr]);
//! guard.check("10.1.2.7:443".parse()?, &[])        → Ok(())
//! guard.check("10.1.3.1:443".parse()?, &[])        → Err("10.1.3.1:443 is RFC 1918 private; open it …")
//! guard.check("169.254.169.254:80".parse()?, &[])  → Err("… is cloud metadata (169.254.169.254); …")
//! ```

use std::fmt;
use std::net::{IpAddr, SocketAddr};

// The classes and ranges the guard decides by, re-exported under the guard's name, where
// callers have always found them.
pub use super::class::{classify, verdict, AddrClass, Embedded, Verdict, Wrapper};
pub use crate::wire::cidr::{Cidr, CidrError};

/// The guard used by the one upstream dialer.
///
/// `allow` is the operator's `--allow-private` ranges; `own` is latchkey's own listen and admin
/// addresses. See the module docs for the decision order.
#[derive(Clone, Debug, Default)]
pub struct AddressGuard {
    allow: Vec<Cidr>,
    own: Vec<SocketAddr>,
    local_ips: Vec<IpAddr>,
}

impl AddressGuard {
    /// A guard that opens `allow` (the global `--allow-private` ranges) and refuses `own`
    /// (latchkey's listen and admin addresses) whatever is allowed.
    pub fn new(allow: Vec<Cidr>, own: Vec<SocketAddr>) -> Self {
        Self {
            allow,
            own,
            local_ips: Vec::new(),
        }
    }

    /// The host's own interface addresses, when the caller knows them. An own address bound to
    /// `0.0.0.0` or `::` listens on every one of them, so each with that port is refused as own.
    /// Without this list, a wildcard own address covers the loopback and unspecified addresses.
    pub fn with_local_ips(mut self, ips: impl IntoIterator<Item = IpAddr>) -> Self {
        self.local_ips = ips.into_iter().map(|ip| ip.to_canonical()).collect();
        self
    }

    /// The global allowed ranges.
    pub fn allowed(&self) -> &[Cidr] {
        &self.allow
    }

    /// `Ok` when `addr` may be dialed: public unicast, or inside an allowed range (the global
    /// `allow` ranges plus the matching rule's `extra`).
    ///
    /// Refused whatever is allowed: latchkey's own listen addresses (a request to latchkey itself
    /// is a loop; an own address bound to `0.0.0.0`/`::` covers every loopback and local address
    /// with that port). Cloud metadata is opened only by a range that is exactly that address
    /// (`169.254.169.254/32`, `fd00:ec2::254/128`): a broad `--allow-private 169.254.0.0/16`
    /// opens link-local but never the metadata service inside it.
    pub fn check(&self, addr: SocketAddr, extra: &[Cidr]) -> Result<(), Refused> {
        if self.is_own(addr) {
            return Err(Refused {
                addr,
                class: AddrClass::ProxyOwn,
                via: None,
                hint: Hint::Own,
            });
        }
        let Some(Verdict { class, via }) = verdict(addr.ip()) else {
            return Ok(());
        };
        let ip = addr.ip();
        let mut ranges = self.allow.iter().chain(extra);
        let (opened, hint) = if class == AddrClass::CloudMetadata {
            let opened = ranges.any(|r| r.is_single_address() && r.contains(ip));
            (opened, Hint::MetadataExact(Cidr::from(ip)))
        } else {
            (ranges.any(|r| r.contains(ip)), Hint::Open(Cidr::from(ip)))
        };
        if opened {
            return Ok(());
        }
        Err(Refused {
            addr,
            class,
            via,
            hint,
        })
    }

    fn is_own(&self, addr: SocketAddr) -> bool {
        let ip = addr.ip().to_canonical();
        self.own.iter().any(|own| {
            let own_ip = own.ip().to_canonical();
            own.port() == addr.port()
                && (ip == own_ip
                    // Dialing 0.0.0.0 or :: connects to the local host.
                    || ip.is_unspecified()
                    || (ip.is_loopback() && (own_ip.is_loopback() || own_ip.is_unspecified()))
                    || (own_ip.is_unspecified()
                        && (self.local_ips.contains(&ip) || is_local_address(ip))))
        })
    }
}

/// How a refused address could be opened, if at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hint {
    /// Any allowed range containing the address opens it; this is the narrowest.
    Open(Cidr),
    /// Only this exact single-address range opens it.
    MetadataExact(Cidr),
    /// Nothing opens it.
    Own,
}

impl fmt::Display for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hint::Open(cidr) => write!(
                f,
                "; open it deliberately with --allow-private {cidr} or a rule's allow_private"
            ),
            Hint::MetadataExact(cidr) => write!(
                f,
                "; latchkey never dials it unless allowed with --allow-private {cidr} \
                 (a broader range does not open it)"
            ),
            Hint::Own => f.write_str(
                "; a request to it would loop back into latchkey, and no allowed range opens it",
            ),
        }
    }
}

/// An address the guard refused, with its class and how it could be opened.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{addr} is {}{}{hint}", .class.describe(), detail(.class, .via, .addr))]
pub struct Refused {
    pub addr: SocketAddr,
    pub class: AddrClass,
    /// The embedded IPv4 that decided a wrapped IPv6 address.
    pub via: Option<Embedded>,
    hint: Hint,
}

impl Refused {
    /// The narrowest range that would open this address (`--allow-private` or a rule's
    /// `allow_private`); `None` when nothing opens it (latchkey's own address).
    pub fn opened_by(&self) -> Option<Cidr> {
        match self.hint {
            Hint::Open(cidr) | Hint::MetadataExact(cidr) => Some(cidr),
            Hint::Own => None,
        }
    }
}

/// The parenthetical after the class: the embedded IPv4 that decided, or the metadata address.
fn detail(class: &AddrClass, via: &Option<Embedded>, addr: &SocketAddr) -> String {
    match via {
        Some(embedded) => format!(" ({embedded})"),
        None if *class == AddrClass::CloudMetadata => format!(" ({})", addr.ip()),
        None => String::new(),
    }
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;

/// Whether `ip` is assigned to this host: binding a socket to it succeeds only then. Used when
/// latchkey listens on a wildcard address, which makes every local address one of its own.
fn is_local_address(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

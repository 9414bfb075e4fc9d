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
//!
//! ```text
//! guard = AddressGuard::new(vec!["10.1.2.0/24".parse()?], vec![listen_addr]);
//! guard.check("10.1.2.7:443".parse()?, &[])        → Ok(())
//! guard.check("10.1.3.1:443".parse()?, &[])        → Err("10.1.3.1:443 is RFC 1918 private; open it …")
//! guard.check("169.254.169.254:80".parse()?, &[])  → Err("… is cloud metadata (169.254.169.254); …")
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// An IP network (CIDR), v4 or v6.
///
/// An IPv4-mapped address is its IPv4 address: an IPv4 range contains `::ffff:a.b.c.d` when it
/// contains `a.b.c.d`, and an IPv6 range never contains a mapped address. A range written inside
/// `::ffff:0:0/96` (`::ffff:10.1.2.0/120`) is stored as the IPv4 range it denotes (`10.1.2.0/24`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

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
    /// a prefix longer than the family allows, and anything that is not an address.
    pub fn parse(s: &str) -> Result<Cidr, CidrError> {
        let (addr_text, prefix_text) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let addr: IpAddr = addr_text.parse().map_err(|_| CidrError::Invalid {
            input: s.to_string(),
        })?;
        let max = max_prefix(addr);
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
                    _ => {
                        return Err(CidrError::PrefixOutOfRange {
                            input: s.to_string(),
                            prefix: text.to_string(),
                            family: if addr.is_ipv4() { "IPv4" } else { "IPv6" },
                            max,
                        })
                    }
                }
            }
        };
        let network = network_of(addr, prefix);
        if network != addr {
            return Err(CidrError::HostBitsSet {
                input: s.to_string(),
                network: Cidr {
                    addr: network,
                    prefix,
                }
                .normalized(),
            });
        }
        Ok(Cidr { addr, prefix }.normalized())
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// True when the range is one address (`/32`, `/128`).
    pub fn is_single_address(&self) -> bool {
        self.prefix == max_prefix(self.addr)
    }

    /// True when `ip` is inside this range. An IPv4 range also contains the IPv4-mapped IPv6
    /// form `::ffff:a.b.c.d` of its addresses; an IPv6 range never contains a mapped address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => in_v4(ip, net, self.prefix),
            (IpAddr::V4(net), IpAddr::V6(ip)) => ip
                .to_ipv4_mapped()
                .is_some_and(|ip| in_v4(ip, net, self.prefix)),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                ip.to_ipv4_mapped().is_none() && in_v6(ip, net, self.prefix)
            }
            (IpAddr::V6(_), IpAddr::V4(_)) => false,
        }
    }

    /// A range inside `::ffff:0:0/96` becomes the IPv4 range it denotes.
    fn normalized(self) -> Cidr {
        match self.addr {
            IpAddr::V6(v6) if self.prefix >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => Cidr {
                    addr: IpAddr::V4(v4),
                    prefix: self.prefix - 96,
                },
                None => self,
            },
            _ => self,
        }
    }
}

impl From<IpAddr> for Cidr {
    /// The single-address range (`/32`, `/128`) of `ip`.
    fn from(ip: IpAddr) -> Cidr {
        Cidr {
            addr: ip,
            prefix: max_prefix(ip),
        }
        .normalized()
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
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn max_prefix(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

fn mask_v4(prefix: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(prefix.min(32)))
        .unwrap_or(0)
}

fn mask_v6(prefix: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(prefix.min(128)))
        .unwrap_or(0)
}

fn network_of(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from_bits(a.to_bits() & mask_v4(prefix))),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from_bits(a.to_bits() & mask_v6(prefix))),
    }
}

fn in_v4(ip: Ipv4Addr, net: Ipv4Addr, prefix: u8) -> bool {
    ip.to_bits() & mask_v4(prefix) == net.to_bits()
}

fn in_v6(ip: Ipv6Addr, net: Ipv6Addr, prefix: u8) -> bool {
    ip.to_bits() & mask_v6(prefix) == net.to_bits()
}

/// Why an address is not public.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddrClass {
    /// `0.0.0.0`, `::`: connecting to it reaches the local host.
    Unspecified,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// RFC 1918: `10/8`, `172.16/12`, `192.168/16`.
    Private,
    /// RFC 6598 shared address space `100.64.0.0/10` (carrier-grade NAT).
    SharedCgnat,
    /// `169.254.0.0/16`, `fe80::/10`.
    LinkLocal,
    /// Cloud instance metadata and credential endpoints: `169.254.169.254` (AWS, GCP, Azure,
    /// OCI, …), `169.254.170.2` (ECS task credentials), `169.254.170.23` and `fd00:ec2::23` (EKS
    /// Pod Identity), `fd00:ec2::254` (AWS IMDS over IPv6), `100.100.100.200` (Alibaba),
    /// `169.254.0.23` (Tencent).
    CloudMetadata,
    /// `fc00::/7`.
    UniqueLocal,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// `192.0.2/24`, `198.51.100/24`, `203.0.113/24`, `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// `198.18.0.0/15`, `2001:2::/48`.
    Benchmarking,
    /// `0.0.0.0/8` other than `0.0.0.0`.
    ThisNetwork,
    /// `240.0.0.0/4` (except broadcast), IPv6 outside `2000::/3` that no other class covers, and
    /// IPv4-compatible IPv6 (`::a.b.c.d`) of a public address: no real host uses these.
    Reserved,
    /// `fec0::/10` (deprecated).
    SiteLocal,
    /// IETF protocol assignments `192.0.0.0/24` and `2001::/23` (except its globally reachable
    /// anycast and AMT/AS112/DET blocks, and the ranges with their own class).
    Ietf,
    /// Discard-only `100::/64`.
    Discard,
    /// ORCHID `2001:10::/28` and ORCHIDv2 `2001:20::/28`: identifiers, not locators.
    Orchid,
    /// `192.88.99.0/24`, the deprecated 6to4 relay anycast.
    SixToFourRelay,
    /// `64:ff9b:1::/48`, local-use NAT64: translates into a private network.
    LocalNat64,
    /// One of latchkey's own listen addresses.
    ProxyOwn,
}

impl AddrClass {
    /// Every class, for registry tests and metric label sets.
    pub const ALL: &'static [AddrClass] = &[
        AddrClass::Unspecified,
        AddrClass::Loopback,
        AddrClass::Private,
        AddrClass::SharedCgnat,
        AddrClass::LinkLocal,
        AddrClass::CloudMetadata,
        AddrClass::UniqueLocal,
        AddrClass::Multicast,
        AddrClass::Broadcast,
        AddrClass::Documentation,
        AddrClass::Benchmarking,
        AddrClass::ThisNetwork,
        AddrClass::Reserved,
        AddrClass::SiteLocal,
        AddrClass::Ietf,
        AddrClass::Discard,
        AddrClass::Orchid,
        AddrClass::SixToFourRelay,
        AddrClass::LocalNat64,
        AddrClass::ProxyOwn,
    ];

    /// What the class is, for messages: "loopback", "RFC 1918 private", "cloud metadata".
    pub fn describe(self) -> &'static str {
        match self {
            AddrClass::Unspecified => "the unspecified address (it reaches the local host)",
            AddrClass::Loopback => "loopback",
            AddrClass::Private => "RFC 1918 private",
            AddrClass::SharedCgnat => "shared address space (CGNAT, 100.64.0.0/10)",
            AddrClass::LinkLocal => "link-local",
            AddrClass::CloudMetadata => "cloud metadata",
            AddrClass::UniqueLocal => "unique local (fc00::/7)",
            AddrClass::Multicast => "multicast",
            AddrClass::Broadcast => "broadcast",
            AddrClass::Documentation => "reserved for documentation",
            AddrClass::Benchmarking => "reserved for benchmarking",
            AddrClass::ThisNetwork => "\"this network\" (0.0.0.0/8)",
            AddrClass::Reserved => "reserved (not used by any real host)",
            AddrClass::SiteLocal => "site-local (fec0::/10, deprecated)",
            AddrClass::Ietf => "reserved for IETF protocol assignments",
            AddrClass::Discard => "discard-only (100::/64)",
            AddrClass::Orchid => "an ORCHID identifier (not routable)",
            AddrClass::SixToFourRelay => "6to4 relay anycast (192.88.99.0/24, deprecated)",
            AddrClass::LocalNat64 => "local-use NAT64 (64:ff9b:1::/48)",
            AddrClass::ProxyOwn => "latchkey's own listen address",
        }
    }

    /// A stable snake_case code for audit records and metric labels.
    pub fn slug(self) -> &'static str {
        match self {
            AddrClass::Unspecified => "unspecified",
            AddrClass::Loopback => "loopback",
            AddrClass::Private => "private",
            AddrClass::SharedCgnat => "shared_cgnat",
            AddrClass::LinkLocal => "link_local",
            AddrClass::CloudMetadata => "cloud_metadata",
            AddrClass::UniqueLocal => "unique_local",
            AddrClass::Multicast => "multicast",
            AddrClass::Broadcast => "broadcast",
            AddrClass::Documentation => "documentation",
            AddrClass::Benchmarking => "benchmarking",
            AddrClass::ThisNetwork => "this_network",
            AddrClass::Reserved => "reserved",
            AddrClass::SiteLocal => "site_local",
            AddrClass::Ietf => "ietf",
            AddrClass::Discard => "discard",
            AddrClass::Orchid => "orchid",
            AddrClass::SixToFourRelay => "six_to_four_relay",
            AddrClass::LocalNat64 => "local_nat64",
            AddrClass::ProxyOwn => "proxy_own",
        }
    }
}

/// An IPv6 form that carries an IPv4 address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wrapper {
    /// `::ffff:a.b.c.d`.
    Mapped,
    /// `::a.b.c.d` (deprecated).
    Compatible,
    /// `64:ff9b::a.b.c.d`, the NAT64 well-known prefix.
    Nat64,
    /// `2002:AABB:CCDD::/48`, 6to4.
    SixToFour,
    /// The server address in bits 32..64 of a Teredo address.
    TeredoServer,
    /// The client address, bit-inverted in the last 32 bits of a Teredo address.
    TeredoClient,
}

/// The IPv4 address an IPv6 address carried, and the form that carried it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Embedded {
    pub wrapper: Wrapper,
    pub v4: Ipv4Addr,
}

impl fmt::Display for Embedded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v4 = self.v4;
        match self.wrapper {
            Wrapper::Mapped => write!(f, "{v4} inside an IPv4-mapped address"),
            Wrapper::Compatible => write!(f, "{v4} inside a deprecated IPv4-compatible address"),
            Wrapper::Nat64 => write!(f, "{v4} inside a NAT64 address"),
            Wrapper::SixToFour => write!(f, "{v4} inside a 6to4 address"),
            Wrapper::TeredoServer => write!(f, "{v4} as the server of a Teredo address"),
            Wrapper::TeredoClient => write!(f, "{v4} as the client of a Teredo address"),
        }
    }
}

/// The verdict for one non-public address: its class, and the embedded IPv4 that decided it
/// when the address was an IPv6 wrapper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub class: AddrClass,
    pub via: Option<Embedded>,
}

/// Why `ip` is not public, or `None` for public unicast.
pub fn classify(ip: IpAddr) -> Option<AddrClass> {
    verdict(ip).map(|v| v.class)
}

/// Like [`classify`], and also says which embedded IPv4 decided a wrapped IPv6 address.
pub fn verdict(ip: IpAddr) -> Option<Verdict> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4).map(|class| Verdict { class, via: None }),
        IpAddr::V6(v6) => verdict_v6(v6),
    }
}

/// Cloud metadata and credential endpoints (see [`AddrClass::CloudMetadata`]).
const METADATA_V4: [Ipv4Addr; 5] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(169, 254, 170, 23),
    Ipv4Addr::new(169, 254, 0, 23),
    Ipv4Addr::new(100, 100, 100, 200),
];

const METADATA_V6: [Ipv6Addr; 2] = [
    Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
    Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23),
];

/// Non-public IPv4 ranges; disjoint, so order does not matter. Exact addresses (metadata,
/// unspecified, broadcast) are decided before this table.
const V4_RANGES: [(Ipv4Addr, u8, AddrClass); 15] = [
    (Ipv4Addr::new(0, 0, 0, 0), 8, AddrClass::ThisNetwork),
    (Ipv4Addr::new(10, 0, 0, 0), 8, AddrClass::Private),
    (Ipv4Addr::new(100, 64, 0, 0), 10, AddrClass::SharedCgnat),
    (Ipv4Addr::new(127, 0, 0, 0), 8, AddrClass::Loopback),
    (Ipv4Addr::new(169, 254, 0, 0), 16, AddrClass::LinkLocal),
    (Ipv4Addr::new(172, 16, 0, 0), 12, AddrClass::Private),
    (Ipv4Addr::new(192, 0, 0, 0), 24, AddrClass::Ietf),
    (Ipv4Addr::new(192, 0, 2, 0), 24, AddrClass::Documentation),
    (Ipv4Addr::new(192, 88, 99, 0), 24, AddrClass::SixToFourRelay),
    (Ipv4Addr::new(192, 168, 0, 0), 16, AddrClass::Private),
    (Ipv4Addr::new(198, 18, 0, 0), 15, AddrClass::Benchmarking),
    (Ipv4Addr::new(198, 51, 100, 0), 24, AddrClass::Documentation),
    (Ipv4Addr::new(203, 0, 113, 0), 24, AddrClass::Documentation),
    (Ipv4Addr::new(224, 0, 0, 0), 4, AddrClass::Multicast),
    (Ipv4Addr::new(240, 0, 0, 0), 4, AddrClass::Reserved),
];

fn classify_v4(ip: Ipv4Addr) -> Option<AddrClass> {
    if METADATA_V4.contains(&ip) {
        return Some(AddrClass::CloudMetadata);
    }
    if ip.is_unspecified() {
        return Some(AddrClass::Unspecified);
    }
    if ip.is_broadcast() {
        return Some(AddrClass::Broadcast);
    }
    V4_RANGES
        .iter()
        .find(|(net, prefix, _)| in_v4(ip, *net, *prefix))
        .map(|(_, _, class)| *class)
}

/// An IPv6 network address given by its first three segments, the rest zero.
const fn head(a: u16, b: u16, c: u16) -> Ipv6Addr {
    Ipv6Addr::new(a, b, c, 0, 0, 0, 0, 0)
}

const MAPPED: (Ipv6Addr, u8) = (Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96);
const COMPATIBLE: (Ipv6Addr, u8) = (Ipv6Addr::UNSPECIFIED, 96);
const NAT64: (Ipv6Addr, u8) = (Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96);
const TEREDO: (Ipv6Addr, u8) = (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 32);
const SIX_TO_FOUR: (Ipv6Addr, u8) = (Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16);
const IETF: (Ipv6Addr, u8) = (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 23);
const GLOBAL_UNICAST: (Ipv6Addr, u8) = (Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3);

/// Non-public IPv6 ranges without an embedded IPv4; disjoint. Checked after the wrappers and
/// before the `2001::/23` and outside-`2000::/3` catch-alls.
const V6_RANGES: [(Ipv6Addr, u8, AddrClass); 11] = [
    (head(0x64, 0xff9b, 1), 48, AddrClass::LocalNat64),
    (head(0x100, 0, 0), 64, AddrClass::Discard),
    (head(0x2001, 2, 0), 48, AddrClass::Benchmarking),
    (head(0x2001, 0x10, 0), 28, AddrClass::Orchid),
    (head(0x2001, 0x20, 0), 28, AddrClass::Orchid),
    (head(0x2001, 0xdb8, 0), 32, AddrClass::Documentation),
    (head(0x3fff, 0, 0), 20, AddrClass::Documentation),
    (head(0xfc00, 0, 0), 7, AddrClass::UniqueLocal),
    (head(0xfe80, 0, 0), 10, AddrClass::LinkLocal),
    (head(0xfec0, 0, 0), 10, AddrClass::SiteLocal),
    (head(0xff00, 0, 0), 8, AddrClass::Multicast),
];

/// Globally reachable blocks inside the IETF protocol assignments `2001::/23` (IANA
/// special-purpose registry): PCP, TURN and DNS-SD SRP anycast, AMT, AS112-v6, DETs.
const IETF_GLOBAL: [(Ipv6Addr, u8); 6] = [
    (Ipv6Addr::new(0x2001, 1, 0, 0, 0, 0, 0, 1), 128),
    (Ipv6Addr::new(0x2001, 1, 0, 0, 0, 0, 0, 2), 128),
    (Ipv6Addr::new(0x2001, 1, 0, 0, 0, 0, 0, 3), 128),
    (Ipv6Addr::new(0x2001, 3, 0, 0, 0, 0, 0, 0), 32),
    (Ipv6Addr::new(0x2001, 4, 0x112, 0, 0, 0, 0, 0), 48),
    (Ipv6Addr::new(0x2001, 0x30, 0, 0, 0, 0, 0, 0), 28),
];

fn within(ip: Ipv6Addr, (net, prefix): (Ipv6Addr, u8)) -> bool {
    in_v6(ip, net, prefix)
}

/// The embedded IPv4 decides; `public` is the verdict when it is public.
fn wrapped(v4: Ipv4Addr, wrapper: Wrapper, public: Option<AddrClass>) -> Option<Verdict> {
    classify_v4(v4).or(public).map(|class| Verdict {
        class,
        via: Some(Embedded { wrapper, v4 }),
    })
}

fn verdict_v6(ip: Ipv6Addr) -> Option<Verdict> {
    let bits = ip.to_bits();
    let plain = |class| Some(Verdict { class, via: None });
    if ip.is_unspecified() {
        return plain(AddrClass::Unspecified);
    }
    if ip.is_loopback() {
        return plain(AddrClass::Loopback);
    }
    if METADATA_V6.contains(&ip) {
        return plain(AddrClass::CloudMetadata);
    }
    // The `as u32` casts below keep exactly the 32 bits that hold an embedded IPv4.
    let low_v4 = Ipv4Addr::from_bits(bits as u32);
    if within(ip, MAPPED) {
        // The mapped form of an address is that address: public stays public.
        return wrapped(low_v4, Wrapper::Mapped, None);
    }
    if within(ip, COMPATIBLE) {
        // Deprecated since RFC 4291; nothing real uses it, so even a public IPv4 is refused.
        return wrapped(low_v4, Wrapper::Compatible, Some(AddrClass::Reserved));
    }
    if within(ip, NAT64) {
        return wrapped(low_v4, Wrapper::Nat64, None);
    }
    if within(ip, TEREDO) {
        let server = Ipv4Addr::from_bits((bits >> 64) as u32);
        let client = Ipv4Addr::from_bits(!(bits as u32));
        return wrapped(client, Wrapper::TeredoClient, None)
            .or_else(|| wrapped(server, Wrapper::TeredoServer, None));
    }
    if within(ip, SIX_TO_FOUR) {
        let router = Ipv4Addr::from_bits((bits >> 80) as u32);
        return wrapped(router, Wrapper::SixToFour, None);
    }
    if let Some((_, _, class)) = V6_RANGES
        .iter()
        .find(|(net, prefix, _)| in_v6(ip, *net, *prefix))
    {
        return plain(*class);
    }
    if within(ip, IETF) && !IETF_GLOBAL.iter().any(|range| within(ip, *range)) {
        return plain(AddrClass::Ietf);
    }
    if !within(ip, GLOBAL_UNICAST) {
        return plain(AddrClass::Reserved);
    }
    None
}

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

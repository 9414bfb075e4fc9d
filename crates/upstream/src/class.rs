//! Address classes: which addresses are not public unicast, and why — the table the guard
//! decides by.
//!
//! Every range in the IANA special-purpose registries that latchkey must not dial by default
//! has a class here ([`AddrClass`]); IPv6 forms that carry an IPv4 address (IPv4-mapped,
//! IPv4-compatible, NAT64, 6to4, Teredo) are classed by the IPv4 address they carry
//! ([`verdict`]). Pure functions of an address: no configuration, no resolving, no sockets, and
//! nothing from the rest of the crate. The ranges are `ipnet` networks, checked at build time.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

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
const V4_RANGES: [(Ipv4Net, AddrClass); 15] = [
    (v4([0, 0, 0, 0], 8), AddrClass::ThisNetwork),
    (v4([10, 0, 0, 0], 8), AddrClass::Private),
    (v4([100, 64, 0, 0], 10), AddrClass::SharedCgnat),
    (v4([127, 0, 0, 0], 8), AddrClass::Loopback),
    (v4([169, 254, 0, 0], 16), AddrClass::LinkLocal),
    (v4([172, 16, 0, 0], 12), AddrClass::Private),
    (v4([192, 0, 0, 0], 24), AddrClass::Ietf),
    (v4([192, 0, 2, 0], 24), AddrClass::Documentation),
    (v4([192, 88, 99, 0], 24), AddrClass::SixToFourRelay),
    (v4([192, 168, 0, 0], 16), AddrClass::Private),
    (v4([198, 18, 0, 0], 15), AddrClass::Benchmarking),
    (v4([198, 51, 100, 0], 24), AddrClass::Documentation),
    (v4([203, 0, 113, 0], 24), AddrClass::Documentation),
    (v4([224, 0, 0, 0], 4), AddrClass::Multicast),
    (v4([240, 0, 0, 0], 4), AddrClass::Reserved),
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
        .find(|(net, _)| net.contains(&ip))
        .map(|(_, class)| *class)
}

/// An IPv4 network from its four octets and prefix length; a bad prefix fails the build.
const fn v4([a, b, c, d]: [u8; 4], prefix: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), prefix)
}

/// An IPv6 network given by its first three segments (the rest zero) and prefix length.
const fn head(a: u16, b: u16, c: u16, prefix: u8) -> Ipv6Net {
    v6(Ipv6Addr::new(a, b, c, 0, 0, 0, 0, 0), prefix)
}

const fn v6(addr: Ipv6Addr, prefix: u8) -> Ipv6Net {
    Ipv6Net::new_assert(addr, prefix)
}

const MAPPED: Ipv6Net = v6(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96);
const COMPATIBLE: Ipv6Net = v6(Ipv6Addr::UNSPECIFIED, 96);
const NAT64: Ipv6Net = v6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96);
const TEREDO: Ipv6Net = v6(Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 32);
const SIX_TO_FOUR: Ipv6Net = v6(Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16);
const IETF: Ipv6Net = v6(Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 23);
const GLOBAL_UNICAST: Ipv6Net = v6(Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3);

/// Non-public IPv6 ranges without an embedded IPv4; disjoint. Checked after the wrappers and
/// before the `2001::/23` and outside-`2000::/3` catch-alls.
const V6_RANGES: [(Ipv6Net, AddrClass); 11] = [
    (head(0x64, 0xff9b, 1, 48), AddrClass::LocalNat64),
    (head(0x100, 0, 0, 64), AddrClass::Discard),
    (head(0x2001, 2, 0, 48), AddrClass::Benchmarking),
    (head(0x2001, 0x10, 0, 28), AddrClass::Orchid),
    (head(0x2001, 0x20, 0, 28), AddrClass::Orchid),
    (head(0x2001, 0xdb8, 0, 32), AddrClass::Documentation),
    (head(0x3fff, 0, 0, 20), AddrClass::Documentation),
    (head(0xfc00, 0, 0, 7), AddrClass::UniqueLocal),
    (head(0xfe80, 0, 0, 10), AddrClass::LinkLocal),
    (head(0xfec0, 0, 0, 10), AddrClass::SiteLocal),
    (head(0xff00, 0, 0, 8), AddrClass::Multicast),
];

/// Globally reachable blocks inside the IETF protocol assignments `2001::/23` (IANA
/// special-purpose registry): PCP, TURN and DNS-SD SRP anycast, AMT, AS112-v6, DETs.
const IETF_GLOBAL: [Ipv6Net; 6] = [
    v6(Ipv6Addr::new(0x2001, 1, 0, 0, 0, 0, 0, 1), 128),
    v6(Ipv6Addr::new(0x2001, 1, 0, 0, 0, 0, 0, 2), 128),
    v6(Ipv6Addr::new(0x2001, 1, 0, 0, 0, 0, 0, 3), 128),
    v6(Ipv6Addr::new(0x2001, 3, 0, 0, 0, 0, 0, 0), 32),
    v6(Ipv6Addr::new(0x2001, 4, 0x112, 0, 0, 0, 0, 0), 48),
    v6(Ipv6Addr::new(0x2001, 0x30, 0, 0, 0, 0, 0, 0), 28),
];

fn within(ip: Ipv6Addr, net: Ipv6Net) -> bool {
    net.contains(&ip)
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
    if let Some((_, class)) = V6_RANGES.iter().find(|(net, _)| within(ip, *net)) {
        return plain(*class);
    }
    if within(ip, IETF) && !IETF_GLOBAL.iter().any(|net| within(ip, *net)) {
        return plain(AddrClass::Ietf);
    }
    if !within(ip, GLOBAL_UNICAST) {
        return plain(AddrClass::Reserved);
    }
    None
}

//! The address-class table (every range, just inside and just outside its edges), the wrapped
//! IPv6 forms, allowed ranges, latchkey's own addresses and the messages a refusal carries.

use super::*;
use AddrClass::*;

fn ip(s: &str) -> IpAddr {
    s.parse()
        .unwrap_or_else(|e| panic!("test address {s:?}: {e}"))
}

fn sock(s: &str) -> SocketAddr {
    s.parse()
        .unwrap_or_else(|e| panic!("test socket address {s:?}: {e}"))
}

fn cidr(s: &str) -> Cidr {
    Cidr::parse(s).unwrap_or_else(|e| panic!("test range {s:?}: {e}"))
}

/// Runs a classification table, reporting every wrong row at once.
fn assert_classes(table: &[(&str, Option<AddrClass>)]) {
    let wrong: Vec<String> = table
        .iter()
        .filter_map(|(addr, want)| {
            let got = classify(ip(addr));
            (got != *want).then(|| format!("{addr}: want {want:?}, got {got:?}"))
        })
        .collect();
    assert!(wrong.is_empty(), "misclassified:\n{}", wrong.join("\n"));
}

const PUBLIC: Option<AddrClass> = None;

#[test]
fn every_ipv4_range_is_classified_just_inside_and_just_outside_its_edges() {
    assert_classes(&[
        ("0.0.0.0", Some(Unspecified)),
        ("0.0.0.1", Some(ThisNetwork)),
        ("0.255.255.255", Some(ThisNetwork)),
        ("1.0.0.0", PUBLIC),
        ("9.255.255.255", PUBLIC),
        ("10.0.0.0", Some(Private)),
        ("10.255.255.255", Some(Private)),
        ("11.0.0.0", PUBLIC),
        ("100.63.255.255", PUBLIC),
        ("100.64.0.0", Some(SharedCgnat)),
        ("100.127.255.255", Some(SharedCgnat)),
        ("100.128.0.0", PUBLIC),
        ("126.255.255.255", PUBLIC),
        ("127.0.0.0", Some(Loopback)),
        ("127.0.0.1", Some(Loopback)),
        ("127.255.255.255", Some(Loopback)),
        ("128.0.0.0", PUBLIC),
        ("169.253.255.255", PUBLIC),
        ("169.254.0.0", Some(LinkLocal)),
        ("169.254.255.255", Some(LinkLocal)),
        ("169.255.0.0", PUBLIC),
        ("172.15.255.255", PUBLIC),
        ("172.16.0.0", Some(Private)),
        ("172.31.255.255", Some(Private)),
        ("172.32.0.0", PUBLIC),
        ("191.255.255.255", PUBLIC),
        ("192.0.0.0", Some(Ietf)),
        ("192.0.0.255", Some(Ietf)),
        ("192.0.1.0", PUBLIC),
        ("192.0.1.255", PUBLIC),
        ("192.0.2.0", Some(Documentation)),
        ("192.0.2.255", Some(Documentation)),
        ("192.0.3.0", PUBLIC),
        ("192.88.98.255", PUBLIC),
        ("192.88.99.0", Some(SixToFourRelay)),
        ("192.88.99.255", Some(SixToFourRelay)),
        ("192.88.100.0", PUBLIC),
        ("192.167.255.255", PUBLIC),
        ("192.168.0.0", Some(Private)),
        ("192.168.255.255", Some(Private)),
        ("192.169.0.0", PUBLIC),
        ("198.17.255.255", PUBLIC),
        ("198.18.0.0", Some(Benchmarking)),
        ("198.19.255.255", Some(Benchmarking)),
        ("198.20.0.0", PUBLIC),
        ("198.51.99.255", PUBLIC),
        ("198.51.100.0", Some(Documentation)),
        ("198.51.100.255", Some(Documentation)),
        ("198.51.101.0", PUBLIC),
        ("203.0.112.255", PUBLIC),
        ("203.0.113.0", Some(Documentation)),
        ("203.0.113.255", Some(Documentation)),
        ("203.0.114.0", PUBLIC),
        ("223.255.255.255", PUBLIC),
        ("224.0.0.0", Some(Multicast)),
        ("239.255.255.255", Some(Multicast)),
        ("240.0.0.0", Some(Reserved)),
        ("255.255.255.254", Some(Reserved)),
        ("255.255.255.255", Some(Broadcast)),
        ("8.8.8.8", PUBLIC),
        ("1.1.1.1", PUBLIC),
    ]);
}

#[test]
fn cloud_metadata_addresses_are_classified_as_metadata_not_as_their_enclosing_range() {
    assert_classes(&[
        ("169.254.169.254", Some(CloudMetadata)),
        ("169.254.169.253", Some(LinkLocal)),
        ("169.254.169.255", Some(LinkLocal)),
        ("169.254.170.2", Some(CloudMetadata)),
        ("169.254.170.3", Some(LinkLocal)),
        ("169.254.170.23", Some(CloudMetadata)),
        ("169.254.0.23", Some(CloudMetadata)),
        ("100.100.100.200", Some(CloudMetadata)),
        ("100.100.100.199", Some(SharedCgnat)),
        ("100.100.100.201", Some(SharedCgnat)),
        ("fd00:ec2::254", Some(CloudMetadata)),
        ("fd00:ec2::23", Some(CloudMetadata)),
        ("fd00:ec2::253", Some(UniqueLocal)),
    ]);
}

#[test]
fn every_ipv6_range_is_classified_just_inside_and_just_outside_its_edges() {
    assert_classes(&[
        ("::", Some(Unspecified)),
        ("::1", Some(Loopback)),
        ("100::", Some(Discard)),
        ("100::ffff:ffff:ffff:ffff", Some(Discard)),
        ("100:0:0:1::", Some(Reserved)),
        ("64:ff9b:1::", Some(LocalNat64)),
        ("64:ff9b:1:ffff:ffff:ffff:ffff:ffff", Some(LocalNat64)),
        ("64:ff9b:2::", Some(Reserved)),
        ("1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Some(Reserved)),
        ("2000::1", PUBLIC),
        // 2001::/23, IETF protocol assignments, with its globally reachable exceptions.
        ("2001:1::1", PUBLIC),
        ("2001:1::2", PUBLIC),
        ("2001:1::3", PUBLIC),
        ("2001:1::4", Some(Ietf)),
        ("2001:1::", Some(Ietf)),
        ("2001:1:ffff:ffff:ffff:ffff:ffff:ffff", Some(Ietf)),
        ("2001:2::", Some(Benchmarking)),
        ("2001:2:0:ffff:ffff:ffff:ffff:ffff", Some(Benchmarking)),
        ("2001:2:1::", Some(Ietf)),
        ("2001:3::1", PUBLIC),
        ("2001:4:112::1", PUBLIC),
        ("2001:4:113::1", Some(Ietf)),
        ("2001:f:ffff:ffff:ffff:ffff:ffff:ffff", Some(Ietf)),
        ("2001:10::", Some(Orchid)),
        ("2001:1f:ffff:ffff:ffff:ffff:ffff:ffff", Some(Orchid)),
        ("2001:20::", Some(Orchid)),
        ("2001:2f:ffff:ffff:ffff:ffff:ffff:ffff", Some(Orchid)),
        ("2001:30::1", PUBLIC),
        ("2001:40::1", Some(Ietf)),
        ("2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", Some(Ietf)),
        ("2001:200::1", PUBLIC),
        ("2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", PUBLIC),
        ("2001:db8::", Some(Documentation)),
        (
            "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
            Some(Documentation),
        ),
        ("2001:db9::", PUBLIC),
        ("2003::1", PUBLIC),
        ("3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", PUBLIC),
        ("3fff::", Some(Documentation)),
        (
            "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff",
            Some(Documentation),
        ),
        ("3fff:1000::", PUBLIC),
        ("4000::1", Some(Reserved)),
        ("5f00::1", Some(Reserved)),
        ("fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Some(Reserved)),
        ("fc00::", Some(UniqueLocal)),
        ("fd12:3456::1", Some(UniqueLocal)),
        ("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Some(UniqueLocal)),
        ("fe00::", Some(Reserved)),
        ("fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Some(Reserved)),
        ("fe80::", Some(LinkLocal)),
        ("fe80::1", Some(LinkLocal)),
        ("febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Some(LinkLocal)),
        ("fec0::", Some(SiteLocal)),
        ("feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Some(SiteLocal)),
        ("ff00::", Some(Multicast)),
        ("ff02::1", Some(Multicast)),
        ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Some(Multicast)),
        ("2606:4700:4700::1111", PUBLIC),
        ("2001:4860:4860::8888", PUBLIC),
    ]);
}

#[test]
fn ipv6_wrappers_are_judged_by_the_ipv4_address_they_carry() {
    assert_classes(&[
        // IPv4-mapped: the address itself, public stays public.
        ("::ffff:127.0.0.1", Some(Loopback)),
        ("::ffff:169.254.169.254", Some(CloudMetadata)),
        ("::ffff:10.0.0.1", Some(Private)),
        ("::ffff:100.64.0.1", Some(SharedCgnat)),
        ("::ffff:0.0.0.0", Some(Unspecified)),
        ("::ffff:8.8.8.8", PUBLIC),
        ("::fffe:ffff:ffff", Some(Reserved)),
        ("::1:ffff:0:0", Some(Reserved)),
        // IPv4-compatible (deprecated): refused even when the IPv4 is public.
        ("::127.0.0.1", Some(Loopback)),
        ("::169.254.169.254", Some(CloudMetadata)),
        ("::8.8.8.8", Some(Reserved)),
        ("::2", Some(ThisNetwork)),
        // NAT64 well-known prefix.
        ("64:ff9b::a9fe:a9fe", Some(CloudMetadata)),
        ("64:ff9b::7f00:1", Some(Loopback)),
        ("64:ff9b::c0a8:101", Some(Private)),
        ("64:ff9b::808:808", PUBLIC),
        ("64:ff9b::1:0:0", Some(Reserved)),
        // 6to4: the IPv4 in bits 16..48.
        ("2002:a9fe:a9fe::1", Some(CloudMetadata)),
        ("2002:7f00:1::1", Some(Loopback)),
        ("2002:c0a8:101::1", Some(Private)),
        ("2002:0808:0808::1", PUBLIC),
        // Teredo: server in bits 32..64, client inverted in the last 32 bits.
        ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", PUBLIC), // 65.54.227.120 / 8.8.8.8
        ("2001:0:4136:e378:8000:63bf:3f57:fefe", Some(Private)), // client 192.168.1.1
        ("2001:0:a00:1:8000:63bf:f7f7:f7f7", Some(Private)), // server 10.0.0.1
        ("2001:0:4136:e378::5601:5601", Some(CloudMetadata)), // client 169.254.169.254
        ("2001:0:7f00:1::f7f7:f7f7", Some(Loopback)),     // server 127.0.0.1
    ]);
}

#[test]
fn a_wrapped_verdict_names_the_embedded_ipv4_and_its_form() {
    let cases = [
        ("::ffff:127.0.0.1", Wrapper::Mapped, "127.0.0.1"),
        ("::8.8.8.8", Wrapper::Compatible, "8.8.8.8"),
        ("64:ff9b::a9fe:a9fe", Wrapper::Nat64, "169.254.169.254"),
        ("2002:a9fe:a9fe::1", Wrapper::SixToFour, "169.254.169.254"),
        (
            "2001:0:a00:1:8000:63bf:f7f7:f7f7",
            Wrapper::TeredoServer,
            "10.0.0.1",
        ),
        (
            "2001:0:4136:e378:8000:63bf:3f57:fefe",
            Wrapper::TeredoClient,
            "192.168.1.1",
        ),
    ];
    for (addr, wrapper, v4) in cases {
        let via = verdict(ip(addr)).and_then(|v| v.via);
        let want = Embedded {
            wrapper,
            v4: v4.parse().unwrap_or_else(|e| panic!("{v4}: {e}")),
        };
        assert_eq!(via, Some(want), "{addr}");
    }
    assert_eq!(verdict(ip("10.0.0.1")).and_then(|v| v.via), None);
}

#[test]
fn every_class_has_a_description_and_a_unique_slug() {
    let mut slugs = std::collections::HashSet::new();
    for class in AddrClass::ALL {
        assert!(!class.describe().is_empty(), "{class:?}");
        assert!(
            slugs.insert(class.slug()),
            "duplicate slug {}",
            class.slug()
        );
        assert!(
            class
                .slug()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit()),
            "{class:?}"
        );
    }
}

#[test]
fn public_addresses_are_dialed_without_any_allowed_range() {
    let guard = AddressGuard::default();
    for addr in [
        "8.8.8.8:443",
        "1.1.1.1:80",
        "[2606:4700:4700::1111]:443",
        "[::ffff:8.8.8.8]:443",
    ] {
        assert_eq!(guard.check(sock(addr), &[]), Ok(()), "{addr}");
    }
}

#[test]
fn non_public_addresses_are_refused_by_default() {
    let guard = AddressGuard::default();
    let cases = [
        ("127.0.0.1:80", Loopback),
        ("10.1.2.7:443", Private),
        ("100.64.0.1:443", SharedCgnat),
        ("169.254.169.254:80", CloudMetadata),
        ("[::1]:80", Loopback),
        ("[::ffff:169.254.169.254]:80", CloudMetadata),
        ("[fd00:ec2::254]:80", CloudMetadata),
        ("0.0.0.0:80", Unspecified),
    ];
    for (addr, class) in cases {
        let refused = guard.check(sock(addr), &[]).err();
        assert_eq!(refused.map(|r| r.class), Some(class), "{addr}");
    }
}

#[test]
fn allow_private_opens_its_range_and_nothing_next_to_it() {
    let guard = AddressGuard::new(vec![cidr("10.1.2.0/24")], vec![]);
    assert_eq!(guard.check(sock("10.1.2.7:443"), &[]), Ok(()));
    assert_eq!(guard.check(sock("10.1.2.255:443"), &[]), Ok(()));
    let refused = guard.check(sock("10.1.3.1:443"), &[]).err();
    assert_eq!(refused.map(|r| r.class), Some(Private));
    let refused = guard.check(sock("10.1.1.255:443"), &[]).err();
    assert_eq!(refused.map(|r| r.class), Some(Private));
}

#[test]
fn an_ipv4_range_also_opens_the_mapped_ipv6_form_of_its_addresses() {
    let guard = AddressGuard::new(vec![cidr("10.1.2.0/24")], vec![]);
    assert_eq!(guard.check(sock("[::ffff:10.1.2.7]:443"), &[]), Ok(()));
    assert!(guard.check(sock("[::ffff:10.1.3.7]:443"), &[]).is_err());
}

#[test]
fn an_ipv6_range_never_opens_a_mapped_ipv4_address() {
    let guard = AddressGuard::new(vec![cidr("::/0")], vec![]);
    assert_eq!(guard.check(sock("[fd00::1]:443"), &[]), Ok(()));
    let refused = guard.check(sock("[::ffff:10.1.2.7]:443"), &[]).err();
    assert_eq!(refused.map(|r| r.class), Some(Private));
    assert!(guard.check(sock("10.1.2.7:443"), &[]).is_err());
}

#[test]
fn an_ipv4_range_does_not_open_the_nat64_or_6to4_form_of_its_addresses() {
    let guard = AddressGuard::new(vec![cidr("10.0.0.0/8")], vec![]);
    assert!(guard.check(sock("[64:ff9b::a00:1]:443"), &[]).is_err());
    assert!(guard.check(sock("[2002:a00:1::1]:443"), &[]).is_err());
    let nat64 = AddressGuard::new(vec![cidr("64:ff9b::a00:0/104")], vec![]);
    assert_eq!(nat64.check(sock("[64:ff9b::a00:1]:443"), &[]), Ok(()));
}

#[test]
fn a_rules_extra_ranges_open_addresses_for_that_check_only() {
    let guard = AddressGuard::new(vec![cidr("10.1.2.0/24")], vec![]);
    let extra = [cidr("192.168.7.0/24")];
    assert_eq!(guard.check(sock("192.168.7.9:443"), &extra), Ok(()));
    assert_eq!(guard.check(sock("10.1.2.7:443"), &extra), Ok(()));
    assert!(guard.check(sock("192.168.7.9:443"), &[]).is_err());
    assert!(guard.check(sock("192.168.8.9:443"), &extra).is_err());
}

#[test]
fn a_broad_range_never_opens_cloud_metadata() {
    let broad = [
        "169.254.0.0/16",
        "169.254.169.0/24",
        "169.254.169.254/31",
        "0.0.0.0/0",
    ];
    for range in broad {
        let guard = AddressGuard::new(vec![cidr(range)], vec![]);
        let refused = guard.check(sock("169.254.169.254:80"), &[]).err();
        assert_eq!(refused.map(|r| r.class), Some(CloudMetadata), "{range}");
        let refused = guard
            .check(sock("[::ffff:169.254.169.254]:80"), &[cidr(range)])
            .err();
        assert_eq!(
            refused.map(|r| r.class),
            Some(CloudMetadata),
            "{range} mapped"
        );
    }
    let guard = AddressGuard::new(vec![cidr("169.254.0.0/16")], vec![]);
    assert_eq!(guard.check(sock("169.254.1.1:80"), &[]), Ok(()));
    let guard = AddressGuard::new(vec![cidr("fc00::/7")], vec![]);
    assert!(guard.check(sock("[fd00:ec2::254]:80"), &[]).is_err());
    assert_eq!(guard.check(sock("[fd00:ec2::1]:80"), &[]), Ok(()));
    let guard = AddressGuard::new(vec![cidr("100.64.0.0/10")], vec![]);
    assert!(guard.check(sock("100.100.100.200:80"), &[]).is_err());
}

#[test]
fn the_exact_metadata_address_opens_cloud_metadata() {
    let guard = AddressGuard::new(vec![cidr("169.254.169.254/32")], vec![]);
    assert_eq!(guard.check(sock("169.254.169.254:80"), &[]), Ok(()));
    assert_eq!(
        guard.check(sock("[::ffff:169.254.169.254]:80"), &[]),
        Ok(())
    );
    assert!(guard.check(sock("169.254.170.2:80"), &[]).is_err());
    let guard = AddressGuard::default();
    let exact = [cidr("169.254.169.254")];
    assert_eq!(guard.check(sock("169.254.169.254:80"), &exact), Ok(()));
    let exact = [cidr("fd00:ec2::254/128")];
    assert_eq!(guard.check(sock("[fd00:ec2::254]:80"), &exact), Ok(()));
}

#[test]
fn latchkeys_own_address_is_refused_even_when_allowed() {
    let own = vec![sock("127.0.0.1:3128"), sock("127.0.0.1:3129")];
    let guard = AddressGuard::new(vec![cidr("127.0.0.0/8")], own);
    for addr in [
        "127.0.0.1:3128",
        "127.0.0.1:3129",
        "127.0.0.2:3128",
        "[::ffff:127.0.0.1]:3128",
        "[::1]:3128",
        "0.0.0.0:3128",
        "[::]:3128",
    ] {
        let refused = guard.check(sock(addr), &[cidr("0.0.0.0/0")]).err();
        assert_eq!(refused.map(|r| r.class), Some(ProxyOwn), "{addr}");
    }
    assert_eq!(guard.check(sock("127.0.0.1:8080"), &[]), Ok(()));
}

#[test]
fn a_public_own_address_is_refused_although_public() {
    let guard = AddressGuard::new(vec![], vec![sock("8.8.4.4:3128")]);
    let refused = guard.check(sock("8.8.4.4:3128"), &[]).err();
    assert_eq!(refused.map(|r| r.class), Some(ProxyOwn));
    assert_eq!(guard.check(sock("8.8.4.4:443"), &[]), Ok(()));
}

#[test]
fn a_wildcard_own_address_covers_every_loopback_and_local_address_with_its_port() {
    for wildcard in ["0.0.0.0:3128", "[::]:3128"] {
        let guard = AddressGuard::new(vec![cidr("0.0.0.0/0"), cidr("::/0")], vec![sock(wildcard)])
            .with_local_ips([ip("10.0.0.5"), ip("198.51.100.7")]);
        for addr in [
            "127.0.0.1:3128",
            "127.1.2.3:3128",
            "[::1]:3128",
            "[::ffff:127.0.0.1]:3128",
            "0.0.0.0:3128",
            "10.0.0.5:3128",
            "[::ffff:10.0.0.5]:3128",
            "198.51.100.7:3128",
        ] {
            let refused = guard.check(sock(addr), &[]).err();
            assert_eq!(
                refused.map(|r| r.class),
                Some(ProxyOwn),
                "{wildcard} {addr}"
            );
        }
        assert_eq!(
            guard.check(sock("10.0.0.6:3128"), &[]),
            Ok(()),
            "{wildcard}"
        );
        assert_eq!(
            guard.check(sock("10.0.0.5:3129"), &[]),
            Ok(()),
            "{wildcard}"
        );
        assert_eq!(
            guard.check(sock("127.0.0.1:8080"), &[]),
            Ok(()),
            "{wildcard}"
        );
    }
}

#[test]
fn a_refusal_says_what_the_address_is_and_how_to_open_it() {
    let guard = AddressGuard::new(vec![], vec![sock("127.0.0.1:3128")]);
    let cases = [
        (
            "169.254.169.254:80",
            "169.254.169.254:80 is cloud metadata (169.254.169.254); latchkey never dials it \
             unless allowed with --allow-private 169.254.169.254/32 (a broader range does not \
             open it)",
        ),
        (
            "10.1.2.7:443",
            "10.1.2.7:443 is RFC 1918 private; open it deliberately with --allow-private \
             10.1.2.7/32 or a rule's allow_private",
        ),
        (
            "[::ffff:127.0.0.1]:8080",
            "[::ffff:127.0.0.1]:8080 is loopback (127.0.0.1 inside an IPv4-mapped address); \
             open it deliberately with --allow-private 127.0.0.1/32 or a rule's allow_private",
        ),
        (
            "[64:ff9b::a9fe:a9fe]:80",
            "[64:ff9b::a9fe:a9fe]:80 is cloud metadata (169.254.169.254 inside a NAT64 \
             address); latchkey never dials it unless allowed with --allow-private \
             64:ff9b::a9fe:a9fe/128 (a broader range does not open it)",
        ),
        (
            "[fd00:ec2::254]:80",
            "[fd00:ec2::254]:80 is cloud metadata (fd00:ec2::254); latchkey never dials it \
             unless allowed with --allow-private fd00:ec2::254/128 (a broader range does not \
             open it)",
        ),
        (
            "127.0.0.1:3128",
            "127.0.0.1:3128 is latchkey's own listen address; a request to it would loop back \
             into latchkey, and no allowed range opens it",
        ),
    ];
    for (addr, message) in cases {
        let refused = guard.check(sock(addr), &[]).err();
        assert_eq!(refused.map(|r| r.to_string()), Some(message.to_string()));
    }
}

#[test]
fn the_range_a_refusal_suggests_opens_that_address() {
    let guard = AddressGuard::default();
    for addr in [
        "10.1.2.7:443",
        "169.254.169.254:80",
        "[::ffff:192.168.1.1]:443",
        "[64:ff9b::a9fe:a9fe]:80",
        "[fd00:ec2::254]:80",
        "[fe80::1]:80",
    ] {
        let refused = guard.check(sock(addr), &[]).err();
        let Some(range) = refused.and_then(|r| r.opened_by()) else {
            panic!("{addr} was not refused with a suggestion");
        };
        assert_eq!(
            guard.check(sock(addr), &[range]),
            Ok(()),
            "{addr} with {range}"
        );
    }
    let own = AddressGuard::new(vec![], vec![sock("127.0.0.1:3128")]);
    let refused = own.check(sock("127.0.0.1:3128"), &[]).err();
    assert_eq!(refused.and_then(|r| r.opened_by()), None);
}

#[test]
fn cidrs_parse_and_display_in_canonical_form() {
    let cases = [
        ("10.1.2.0/24", "10.1.2.0/24"),
        ("10.1.2.3", "10.1.2.3/32"),
        ("0.0.0.0/0", "0.0.0.0/0"),
        ("169.254.169.254/32", "169.254.169.254/32"),
        ("fd00::/8", "fd00::/8"),
        ("FD00:0:0::/8", "fd00::/8"),
        ("::1", "::1/128"),
        ("::/0", "::/0"),
        ("::ffff:10.1.2.0/120", "10.1.2.0/24"),
        ("::ffff:169.254.169.254", "169.254.169.254/32"),
        ("::ffff:0:0/96", "0.0.0.0/0"),
    ];
    for (input, shown) in cases {
        let parsed: Result<Cidr, CidrError> = input.parse();
        assert_eq!(
            parsed.map(|c| c.to_string()),
            Ok(shown.to_string()),
            "{input}"
        );
    }
    assert!(cidr("10.1.2.3").is_single_address());
    assert!(cidr("::ffff:10.1.2.3").is_single_address());
    assert!(!cidr("10.1.2.0/31").is_single_address());
}

#[test]
fn cidr_parse_errors_name_the_input_and_the_fix() {
    let cases = [
        (
            "10.1.2.3/24",
            "10.1.2.3/24 has host bits set; did you mean 10.1.2.0/24?",
        ),
        (
            "fd00::1/8",
            "fd00::1/8 has host bits set; did you mean fd00::/8?",
        ),
        (
            "10.0.0.0/33",
            "10.0.0.0/33: prefix length 33 is out of range for IPv4 (0-32)",
        ),
        (
            "fd00::/129",
            "fd00::/129: prefix length 129 is out of range for IPv6 (0-128)",
        ),
        (
            "10.0.0.0/99999999999",
            "10.0.0.0/99999999999: prefix length 99999999999 is out of range for IPv4 (0-32)",
        ),
        ("10.0.0.0/", "10.0.0.0/: prefix length \"\" is not a number"),
        (
            "10.0.0.0/+8",
            "10.0.0.0/+8: prefix length \"+8\" is not a number",
        ),
        (
            "10.0.0.0/8/8",
            "10.0.0.0/8/8: prefix length \"8/8\" is not a number",
        ),
        (
            "garbage",
            "\"garbage\" is not an IP network; expected an address with an optional prefix \
             length, like 10.1.2.0/24 or fd00::/8",
        ),
        (
            "",
            "\"\" is not an IP network; expected an address with an optional prefix length, \
             like 10.1.2.0/24 or fd00::/8",
        ),
        (
            "10.1/16",
            "\"10.1/16\" is not an IP network; expected an address with an optional prefix \
             length, like 10.1.2.0/24 or fd00::/8",
        ),
        (
            "fe80::1%eth0/64",
            "\"fe80::1%eth0/64\" is not an IP network; expected an address with an optional \
             prefix length, like 10.1.2.0/24 or fd00::/8",
        ),
    ];
    for (input, message) in cases {
        let err = Cidr::parse(input).err().map(|e| e.to_string());
        assert_eq!(err, Some(message.to_string()), "{input}");
    }
}

#[test]
fn cidr_contains_respects_the_prefix_edges() {
    let cases = [
        ("10.1.2.0/24", "10.1.2.0", true),
        ("10.1.2.0/24", "10.1.2.255", true),
        ("10.1.2.0/24", "10.1.3.0", false),
        ("10.1.2.0/24", "10.1.1.255", false),
        ("0.0.0.0/0", "255.255.255.255", true),
        ("0.0.0.0/0", "::1", false),
        ("10.1.2.0/24", "::ffff:10.1.2.9", true),
        ("10.1.2.0/24", "::10.1.2.9", false),
        ("fd00::/8", "fd00::1", true),
        ("fd00::/8", "fdff:ffff::1", true),
        ("fd00::/8", "fc00::1", false),
        ("::/0", "2606:4700::1", true),
        ("::/0", "::ffff:10.0.0.1", false),
        ("::/0", "10.0.0.1", false),
    ];
    for (range, addr, want) in cases {
        assert_eq!(
            cidr(range).contains(ip(addr)),
            want,
            "{range} contains {addr}"
        );
    }
}

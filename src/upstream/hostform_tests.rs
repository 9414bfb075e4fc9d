//! Every odd host form a client or libc accepts maps to the address it means; names stay names;
//! numeric-looking hosts that are not valid addresses are errors.

use super::*;
use crate::upstream::guard::{classify, AddrClass};

fn ip(s: &str) -> IpAddr {
    s.parse()
        .unwrap_or_else(|e| panic!("test address {s:?}: {e}"))
}

/// The variant name of an error, for tables.
fn kind(e: &HostFormError) -> &'static str {
    match e {
        HostFormError::Empty => "Empty",
        HostFormError::InvalidChar { .. } => "InvalidChar",
        HostFormError::EmptyLabel { .. } => "EmptyLabel",
        HostFormError::Brackets { .. } => "Brackets",
        HostFormError::ZoneId { .. } => "ZoneId",
        HostFormError::InvalidIpv6 { .. } => "InvalidIpv6",
        HostFormError::TooManyParts { .. } => "TooManyParts",
        HostFormError::NotANumber { .. } => "NotANumber",
        HostFormError::PartTooLarge { .. } => "PartTooLarge",
        HostFormError::OutOfRange { .. } => "OutOfRange",
    }
}

#[test]
fn odd_ipv4_forms_map_to_the_address_they_mean() {
    let cases = [
        ("169.254.169.254", "169.254.169.254"),
        ("2852039166", "169.254.169.254"),
        ("0xA9FEA9FE", "169.254.169.254"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("0XA9FEA9FE", "169.254.169.254"),
        ("0251.0376.0251.0376", "169.254.169.254"),
        ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),
        ("0xa9.254.0251.0xfe", "169.254.169.254"),
        ("169.254.43518", "169.254.169.254"),
        ("169.16689662", "169.254.169.254"),
        ("0xa9.0xfea9fe", "169.254.169.254"),
        ("169.254.169.254.", "169.254.169.254"),
        ("2852039166.", "169.254.169.254"),
        ("127.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("0x", "0.0.0.0"),
        ("0x.0x.0x.0x", "0.0.0.0"),
        ("00", "0.0.0.0"),
        ("4294967295", "255.255.255.255"),
        ("0xffffffff", "255.255.255.255"),
        ("1.2.3.4", "1.2.3.4"),
        ("0x00000000000000000000001.2.3.4", "1.2.3.4"),
        ("255.255.65535", "255.255.255.255"),
        ("255.16777215", "255.255.255.255"),
    ];
    for (host, want) in cases {
        assert_eq!(parse_ip_host(host), Ok(Some(ip(want))), "{host}");
    }
}

#[test]
fn ipv6_literals_bracketed_or_not_map_to_the_address_they_mean() {
    let cases = [
        ("[::ffff:169.254.169.254]", "::ffff:a9fe:a9fe"),
        ("::ffff:169.254.169.254", "::ffff:a9fe:a9fe"),
        ("::ffff:a9fe:a9fe", "::ffff:169.254.169.254"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("[FD00:EC2::254]", "fd00:ec2::254"),
        ("[2606:4700:4700::1111]", "2606:4700:4700::1111"),
        ("64:ff9b::a9fe:a9fe", "64:ff9b::169.254.169.254"),
    ];
    for (host, want) in cases {
        assert_eq!(parse_ip_host(host), Ok(Some(ip(want))), "{host}");
    }
}

#[test]
fn every_spelling_of_the_metadata_address_is_classified_as_cloud_metadata() {
    for host in [
        "169.254.169.254",
        "2852039166",
        "0xA9FEA9FE",
        "0251.0376.0251.0376",
        "169.254.43518",
        "169.254.169.254.",
        "[::ffff:169.254.169.254]",
        "::ffff:a9fe:a9fe",
        "[64:ff9b::a9fe:a9fe]",
        "[2002:a9fe:a9fe::1]",
    ] {
        let parsed = parse_ip_host(host);
        let class = parsed.clone().ok().flatten().and_then(classify);
        assert_eq!(class, Some(AddrClass::CloudMetadata), "{host} → {parsed:?}");
    }
}

#[test]
fn dns_names_are_not_addresses() {
    for host in [
        "api.example.com",
        "api.example.com.",
        "1a.example.com",
        "example.123abc",
        "1.2.3.example",
        "127.0.0.1.nip.io",
        "0x1g",
        "example.0x1g",
        "deadbeef",
        "localhost",
        "a",
        "xn--nxasmq6b.example",
        "1e3",
    ] {
        assert_eq!(parse_ip_host(host), Ok(None), "{host}");
    }
}

#[test]
fn numeric_looking_hosts_that_are_not_valid_addresses_are_errors() {
    let cases = [
        ("256.1.1.1", "PartTooLarge"),
        ("1.256.1.1", "PartTooLarge"),
        ("1.2.3.256", "OutOfRange"),
        ("1.2.65536", "OutOfRange"),
        ("1.16777216", "OutOfRange"),
        ("4294967296", "OutOfRange"),
        ("0x100000000", "OutOfRange"),
        ("0xffffffffffffffffffffffffffffffff", "OutOfRange"),
        ("99999999999999999999999.1", "PartTooLarge"),
        ("1.2.3.4.5", "TooManyParts"),
        ("08.1.1.1", "NotANumber"),
        ("1.1.1.09", "NotANumber"),
        ("example.123", "NotANumber"),
        ("example.0x", "NotANumber"),
        ("1a.2.3.4", "NotANumber"),
        ("0x1g.2.3.4", "NotANumber"),
        ("1.2.3.4..", "EmptyLabel"),
    ];
    for (host, want) in cases {
        let result = parse_ip_host(host);
        assert_eq!(
            result.as_ref().err().map(kind),
            Some(want),
            "{host} → {result:?}"
        );
    }
}

#[test]
fn malformed_hosts_are_errors_never_names() {
    let cases = [
        ("", "Empty"),
        (".", "EmptyLabel"),
        ("..", "EmptyLabel"),
        (".1.2.3.4", "EmptyLabel"),
        ("1..2", "EmptyLabel"),
        ("a..example.com", "EmptyLabel"),
        ("fe80::1%eth0", "ZoneId"),
        ("[fe80::1%25eth0]", "ZoneId"),
        ("[::1", "Brackets"),
        ("::1]", "Brackets"),
        ("[]", "InvalidIpv6"),
        ("[1.2.3.4]", "InvalidIpv6"),
        ("example.com:443", "InvalidIpv6"),
        ("%31%32%37.0.0.1", "InvalidChar"),
        ("127.0.0.1 evil.com", "InvalidChar"),
        ("127.0.0.1\0", "InvalidChar"),
        ("１２７.０.０.１", "InvalidChar"),
    ];
    for (host, want) in cases {
        let result = parse_ip_host(host);
        assert_eq!(
            result.as_ref().err().map(kind),
            Some(want),
            "{host:?} → {result:?}"
        );
    }
}

#[test]
fn host_form_errors_name_the_host_and_the_bad_part() {
    let cases = [
        (
            "256.1.1.1",
            "host \"256.1.1.1\": IPv4 part \"256\" is larger than 255",
        ),
        (
            "0x100000000",
            "host \"0x100000000\": IPv4 part \"0x100000000\" is too large for the bytes that \
             remain",
        ),
        (
            "08.1.1.1",
            "host \"08.1.1.1\" ends in a number, so it is an IPv4 address, but \"08\" is not a \
             decimal, octal (0…) or hex (0x…) number",
        ),
        (
            "1.2.3.4.5",
            "host \"1.2.3.4.5\" ends in a number, so it is an IPv4 address, but it has more \
             than 4 parts",
        ),
        (
            "fe80::1%eth0",
            "host \"fe80::1%eth0\" has an IPv6 zone id; zone ids are not accepted",
        ),
    ];
    for (host, message) in cases {
        let err = parse_ip_host(host).err().map(|e| e.to_string());
        assert_eq!(err, Some(message.to_string()), "{host}");
    }
}

/// Property tests: host-form parsing never panics and agrees with the WHATWG URL parser
/// (`url::Host::parse`, the parser browsers and most HTTP clients follow) wherever both give an
/// answer. latchkey may be stricter (an error where `url` sees an address or a name), never
/// looser: it never calls a host a name that `url` reads as an address, and never reads another
/// address than `url` does.
mod properties {
    use std::net::IpAddr;

    use proptest::prelude::*;

    use super::parse_ip_host;

    /// What `url` makes of `host`, as latchkey's answer type; IPv6 compared in brackets (`url`
    /// only accepts it so).
    fn whatwg(host: &str) -> Result<Option<IpAddr>, ()> {
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        match url::Host::parse(&host) {
            Ok(url::Host::Ipv4(a)) => Ok(Some(IpAddr::V4(a))),
            Ok(url::Host::Ipv6(a)) => Ok(Some(IpAddr::V6(a))),
            Ok(url::Host::Domain(_)) => Ok(None),
            Err(_) => Err(()),
        }
    }

    fn agree(host: &str) -> Result<(), TestCaseError> {
        let ours = parse_ip_host(host);
        let theirs = whatwg(host);
        match (&ours, &theirs) {
            // latchkey reads an address: url reads the same one.
            (Ok(Some(a)), t) => prop_assert_eq!(t, &Ok(Some(*a)), "{:?}", host),
            // url reads an address: latchkey reads it too (above) or refuses, never a name.
            (Ok(None), Ok(Some(a))) => {
                prop_assert!(false, "{:?}: latchkey says a name, url says {}", host, a)
            }
            _ => {}
        }
        Ok(())
    }

    /// One IPv4 part in one of the radixes WHATWG and `inet_aton` accept, or a near miss.
    fn part() -> impl Strategy<Value = String> {
        let value = prop_oneof![
            6 => 0..=255u64,
            2 => 0..=0xffffu64,
            1 => 0..=0xff_ffffu64,
            2 => 0..=0xffff_ffffu64,
            1 => Just(0x1_0000_0000u64),
            1 => any::<u64>(),
        ];
        let radix = prop_oneof![
            4 => Just(0u8),
            2 => Just(1u8),
            2 => Just(2u8),
            1 => Just(3u8),
            1 => Just(4u8),
            1 => Just(5u8),
        ];
        (value, radix).prop_map(|(v, radix)| match radix {
            0 => v.to_string(),
            1 => format!("0{v:o}"),
            2 => format!("0x{v:x}"),
            3 => format!("0X{v:X}"),
            4 => format!("0x0000{v:x}"),
            _ => format!("{v}9a"),
        })
    }

    fn ipv4_like() -> impl Strategy<Value = String> {
        let count = prop_oneof![8 => 1..5usize, 1 => 5..7usize];
        let dots = prop_oneof![6 => Just(0usize), 2 => Just(1usize), 1 => Just(2usize)];
        (
            count.prop_flat_map(|n| proptest::collection::vec(part(), n)),
            dots,
            proptest::option::weighted(0.15, "[a-z]{1,4}"),
        )
            .prop_map(|(parts, dots, label)| {
                let mut host = parts.join(".");
                if let Some(label) = label {
                    host = format!("{label}.{host}");
                }
                host.push_str(&".".repeat(dots));
                host
            })
    }

    fn ipv6_like() -> impl Strategy<Value = String> {
        let group = prop_oneof![
            8 => "[0-9a-fA-F]{1,4}",
            1 => "[0-9a-fA-F]{0,5}",
            1 => Just("ffff".to_string()),
        ];
        let wrap = prop_oneof![6 => Just(0u8), 3 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)];
        (
            proptest::collection::vec(group, 1..9),
            proptest::option::weighted(0.6, 0..9usize),
            proptest::option::weighted(0.25, (0..=255u8, 0..=255u8, 0..=255u8, 0..=300u16)),
            wrap,
        )
            .prop_map(|(groups, compress, v4, wrap)| {
                let mut parts: Vec<String> = groups;
                if let Some(at) = compress {
                    let at = at.min(parts.len());
                    parts.insert(at, String::new());
                    if at == 0 || at == parts.len() - 1 {
                        // `::` at either end needs the empty group on both sides of a colon.
                        parts.insert(at, String::new());
                    }
                }
                let mut text = parts.join(":");
                if let Some((a, b, c, d)) = v4 {
                    text.push_str(&format!(":{a}.{b}.{c}.{d}"));
                }
                match wrap {
                    0 => format!("[{text}]"),
                    1 => text,
                    2 => format!("[{text}"),
                    _ => format!("[{text}]x"),
                }
            })
    }

    /// Short strings over the characters that matter to host parsing, plus a few that must not.
    fn alphabet() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                8 => proptest::char::range('0', '9'),
                3 => proptest::sample::select(vec!['.', 'x', 'X', 'a', 'f', 'F', 'g', 'z']),
                2 => proptest::sample::select(vec![':', '[', ']', '%', '-', '_']),
                1 => proptest::sample::select(vec![' ', '\t', '\0', '/', '@', 'é', '１', '。']),
            ],
            0..20,
        )
        .prop_map(|v| v.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// 1000 cases: any string, never a panic.
        #[test]
        fn proptest_hostform_never_panics_on_any_string(host in any::<String>()) {
            let _ = parse_ip_host(&host);
        }

        /// 1000 cases: dotted numbers in every radix, with too many parts, trailing dots and a
        /// leading name label.
        #[test]
        fn proptest_hostform_ipv4_forms_agree_with_url(host in ipv4_like()) {
            agree(&host)?;
        }

        /// 1000 cases: strings over digits, dots, hex letters, brackets, '%' and odd characters.
        #[test]
        fn proptest_hostform_host_alphabet_agrees_with_url(host in alphabet()) {
            agree(&host)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// 500 cases: IPv6 groups with compression, embedded IPv4, and broken brackets.
        #[test]
        fn proptest_hostform_ipv6_forms_agree_with_url(host in ipv6_like()) {
            agree(&host)?;
        }
    }
}

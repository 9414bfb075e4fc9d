//! Host normalisation and formatting, and the numeric-host parser checked against
//! `url::Host::parse`. The tables of odd host forms are in `crates/upstream/src/hostform_tests.rs`,
//! beside the address classes they decide.

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

#[test]
fn authorities_bracket_ipv6_and_leave_out_only_the_default_port() {
    assert_eq!(
        display_authority("api.example.com", 443),
        "api.example.com:443"
    );
    assert_eq!(display_authority("::1", 443), "[::1]:443");
    assert_eq!(display_authority("10.0.0.1", 80), "10.0.0.1:80");
    let url = |host, port| {
        Authority {
            host,
            port,
            default_port: Some(443),
        }
        .to_string()
    };
    assert_eq!(url("api.example.com", 443), "api.example.com");
    assert_eq!(url("api.example.com", 8443), "api.example.com:8443");
    assert_eq!(url("fd00::1", 443), "[fd00::1]");
    assert_eq!(url("fd00::1", 8443), "[fd00::1]:8443");
    assert_eq!(Bracketed("fd00::1").to_string(), "[fd00::1]");
    assert_eq!(Bracketed("example.com").to_string(), "example.com");
    // A host already in brackets (as a record or a URL may carry it) is not bracketed twice.
    assert_eq!(Bracketed("[fd00::1]").to_string(), "[fd00::1]");
    assert_eq!(display_authority("[::1]", 8443), "[::1]:8443");
}

/// Property tests for the numeric-host parser, against the WHATWG URL parser
/// (`url::Host::parse`, the parser browsers and most HTTP clients follow):
/// - it never panics, on any string;
/// - it may be stricter than `url` (an error where `url` sees an address or a name), never
///   looser: it never calls a host a name that `url` reads as an address, and never reads
///   another address than `url` does;
/// - where both accept a host they read it the same way;
/// - the part-by-part walk that names what is wrong refuses exactly the hosts `url` refuses and
///   computes the address `url` does for the rest, so its errors never contradict `url`.
mod properties {
    use std::net::{IpAddr, Ipv4Addr};

    use proptest::prelude::*;

    use super::super::{first_bad_part, parse_ip_host, parse_number, Number};

    /// `url`'s answer, as latchkey's answer type; IPv6 compared in brackets (`url` only
    /// accepts it so).
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

    /// The address the walk computes when it finds no bad part: the pre-`url` parser's value.
    fn walked(body: &str) -> Option<Ipv4Addr> {
        let parts: Vec<&str> = body.split('.').collect();
        let mut address: u64 = 0;
        for (i, part) in parts.iter().enumerate() {
            let Some(Number::Value(v)) = parse_number(part) else {
                return None;
            };
            address += if i + 1 == parts.len() {
                v
            } else {
                v << (8 * (3 - i))
            };
        }
        u32::try_from(address).ok().map(Ipv4Addr::from_bits)
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
            1 => Just(6u8),
            1 => Just(7u8),
        ];
        (value, radix).prop_map(|(v, radix)| match radix {
            0 => v.to_string(),
            1 => format!("0{v:o}"),
            2 => format!("0x{v:x}"),
            3 => format!("0X{v:X}"),
            4 => format!("0x0000{v:x}"),
            5 => "0x".to_string(),
            6 => format!("{v}g"),
            _ => format!("{v}9a"),
        })
    }

    /// Dotted numbers in every radix, with too many parts, trailing dots or a name label.
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
                4 => proptest::sample::select(vec!['.', 'x', 'X', 'a', 'e', 'f', 'F', 'g', 'z', '-']),
                2 => proptest::sample::select(vec![':', '[', ']', '%', '_']),
                1 => proptest::sample::select(vec![' ', '\t', '\0', '/', '@', 'é', '１', '。']),
            ],
            0..20,
        )
        .prop_map(|v| v.into_iter().collect())
    }

    /// Never looser than `url`: an address latchkey reads is `url`'s address, and where `url`
    /// reads an address latchkey never reads a name.
    fn never_looser(host: &str) -> Result<(), TestCaseError> {
        match (&parse_ip_host(host), &whatwg(host)) {
            (Ok(Some(a)), t) => prop_assert_eq!(t, &Ok(Some(*a)), "{:?}", host),
            (Ok(None), Ok(Some(a))) => {
                prop_assert!(false, "{:?}: latchkey says a name, url says {}", host, a)
            }
            _ => {}
        }
        Ok(())
    }

    fn both_accept_the_same(host: &str) -> Result<(), TestCaseError> {
        if let (Ok(ours), Ok(theirs)) = (parse_ip_host(host), whatwg(host)) {
            prop_assert_eq!(ours, theirs, "{:?}", host);
        }
        Ok(())
    }

    fn walk_agrees_with_url(host: &str) -> Result<(), TestCaseError> {
        let body = host.strip_suffix('.').unwrap_or(host);
        let last = body.rsplit('.').next().unwrap_or(body);
        let numeric = !body.split('.').any(str::is_empty)
            && (last.bytes().all(|b| b.is_ascii_digit()) || parse_number(last).is_some());
        if !numeric {
            return Ok(());
        }
        let theirs = match url::Host::parse(host) {
            Ok(url::Host::Ipv4(a)) => Some(a),
            _ => None,
        };
        let bad = first_bad_part(host, body);
        prop_assert_eq!(
            bad.is_none(),
            theirs.is_some(),
            "{:?}: walk {:?}",
            host,
            bad
        );
        if bad.is_none() {
            prop_assert_eq!(walked(body), theirs, "{:?}", host);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// 1000 cases: any string, never a panic.
        #[test]
        fn proptest_hostform_never_panics_on_any_string(host in any::<String>()) {
            let _ = parse_ip_host(&host);
        }

        /// 1000 cases: dotted numbers in every radix, with too many parts, trailing dots and a
        /// leading name label: never looser than `url`, and the same answer where both answer.
        #[test]
        fn proptest_host_ipv4_forms_read_as_url_reads_them(host in ipv4_like()) {
            never_looser(&host)?;
            both_accept_the_same(&host)?;
        }

        /// 1000 cases: names, numbers and near misses over digits, dots, hex letters, brackets,
        /// '%' and odd characters: never looser, and the same answer where both answer.
        #[test]
        fn proptest_host_names_and_numbers_read_as_url_reads_them(host in alphabet()) {
            never_looser(&host)?;
            both_accept_the_same(&host)?;
        }

        /// 1000 cases: the walk that names a bad part refuses exactly what `url` refuses, and
        /// where it finds none, computes `url`'s address.
        #[test]
        fn proptest_host_error_walk_agrees_with_url(host in ipv4_like()) {
            walk_agrees_with_url(&host)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// 500 cases: IPv6 groups with compression, embedded IPv4, and broken brackets: never
        /// looser than `url`, and the same answer where both answer.
        #[test]
        fn proptest_hostform_ipv6_forms_agree_with_url(host in ipv6_like()) {
            never_looser(&host)?;
            both_accept_the_same(&host)?;
        }
    }
}

proptest::proptest! {
    #[test]
    fn socket_addr_text_is_display(a: [u8; 4], port: u16, v6: [u16; 8]) {
        let v4 = std::net::SocketAddr::from((a, port));
        proptest::prop_assert_eq!(socket_addr_text(v4), v4.to_string());
        let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::from(v6), port));
        proptest::prop_assert_eq!(socket_addr_text(v6), v6.to_string());
    }
}

proptest::proptest! {
    #[test]
    fn authority_len_is_display_authority_s_length(host in "[a-z0-9:.\\[\\]]{0,40}", port: u16) {
        proptest::prop_assert_eq!(authority_len(&host, port), display_authority(&host, port).len());
    }
}

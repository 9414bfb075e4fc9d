//! Every odd host form a client or libc accepts maps to the address it means; names stay names;
//! numeric-looking hosts that are not valid addresses are errors.

use super::*;
use crate::guard::{classify, AddrClass};

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

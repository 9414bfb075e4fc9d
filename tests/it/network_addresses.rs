//! The address guard in the one upstream dialer: every non-public address class, reached through
//! a pinned name and through a literal URL, in every odd host form clients and libc accept, is
//! refused with `403 non_public_address` before any connection; ranges open only deliberately;
//! latchkey never dials itself; ports default to 443/80.
//!
//! These addresses are never dialed by the test: it asks latchkey for them, and latchkey must
//! refuse before connecting. The record's `upstream` (set only for a connection that was made)
//! stays null and the answer comes back at once.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::clients::RawResponse;
use crate::support::{
    assert_denial, assert_record, connect_tunnel, curl, latchkey, raw_request, Latchkey, Upstream,
};

/// One non-public address and the words the refusal must use for its class.
struct Case {
    ip: &'static str,
    says: &'static str,
}

const fn case(ip: &'static str, says: &'static str) -> Case {
    Case { ip, says }
}

/// Every refused class, IPv4 and IPv6, plain and wrapped in an IPv6 form that carries an IPv4
/// address (the embedded IPv4 decides).
const CLASSES: &[Case] = &[
    // IPv4
    case("127.0.0.1", "loopback"),
    case("127.255.255.254", "loopback"),
    case("0.0.0.0", "unspecified"),
    case("0.1.2.3", "this network"),
    case("10.0.0.1", "RFC 1918 private"),
    case("172.16.0.1", "RFC 1918 private"),
    case("172.31.255.255", "RFC 1918 private"),
    case("192.168.1.1", "RFC 1918 private"),
    case("100.64.0.1", "CGNAT"),
    case("100.127.255.254", "CGNAT"),
    case("169.254.1.1", "link-local"),
    case("169.254.169.254", "cloud metadata"),
    case("169.254.170.2", "cloud metadata"),
    case("100.100.100.200", "cloud metadata"),
    case("224.0.0.1", "multicast"),
    case("239.255.255.250", "multicast"),
    case("255.255.255.255", "broadcast"),
    case("192.0.2.1", "documentation"),
    case("198.51.100.1", "documentation"),
    case("203.0.113.7", "documentation"),
    case("198.18.0.1", "benchmarking"),
    case("198.19.255.255", "benchmarking"),
    case("240.0.0.1", "reserved"),
    case("192.0.0.8", "IETF protocol assignments"),
    case("192.88.99.1", "6to4 relay"),
    // IPv6
    case("::1", "loopback"),
    case("::", "unspecified"),
    case("fe80::1", "link-local"),
    case("fc00::1", "unique local"),
    case("fd12:3456::1", "unique local"),
    case("fd00:ec2::254", "cloud metadata"),
    case("ff02::1", "multicast"),
    case("2001:db8::1", "documentation"),
    case("2001:2::1", "benchmarking"),
    // IPv4-mapped
    case("::ffff:127.0.0.1", "IPv4-mapped"),
    case("::ffff:10.0.0.1", "IPv4-mapped"),
    case("::ffff:169.254.169.254", "IPv4-mapped"),
    // IPv4-compatible (deprecated)
    case("::127.0.0.1", "IPv4-compatible"),
    case("::10.0.0.1", "IPv4-compatible"),
    // NAT64 well-known prefix
    case("64:ff9b::a9fe:a9fe", "NAT64"),
    case("64:ff9b::10.0.0.1", "NAT64"),
    case("64:ff9b::127.0.0.1", "NAT64"),
    // 6to4: 2002:AABB:CCDD::/48 carries AA.BB.CC.DD
    case("2002:a9fe:a9fe::1", "6to4"),
    case("2002:a00:1::1", "6to4"),
    case("2002:7f00:1::", "6to4"),
    // Teredo: server in bits 32..64, client bit-inverted in the last 32 bits.
    // Client 169.254.169.254 (!0x5601_5601) behind a public server (65.54.227.120).
    case("2001:0:4136:e378:8000:63bf:5601:5601", "Teredo"),
    // Server 10.0.0.1 with a public client (8.8.8.8 = !0xf7f7_f7f7).
    case("2001:0:a00:1::f7f7:f7f7", "Teredo"),
];

fn parse_ip(ip: &str) -> IpAddr {
    ip.parse()
        .unwrap_or_else(|e| panic!("test address {ip:?}: {e}"))
}

/// `host` as it appears in a URL: IPv6 bracketed.
fn url_host(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// Sends `GET http://HOST[:PORT]/PATH` on a raw socket (so no client rewrites the host first) and
/// returns the answer and how long it took.
fn get(lk: &Latchkey, authority: &str, path: &str) -> (RawResponse, Duration) {
    let request = format!("GET http://{authority}{path} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
    let start = Instant::now();
    let resp = raw_request(lk.addr(), request.as_bytes());
    (resp, start.elapsed())
}

/// A `non_public_address` refusal naming `addr` and the class; never slow, so never dialed.
fn assert_refused(resp: &RawResponse, elapsed: Duration, rule: &str, addr: &str, says: &str) {
    assert_denial(resp, 403, Some(rule), "non_public_address");
    let text = resp.text();
    assert!(
        text.contains(addr),
        "the refusal should name the address {addr}: {text:?}"
    );
    assert!(
        text.contains(says),
        "the refusal should name the class ({says:?}): {text:?}"
    );
    assert!(
        elapsed < Duration::from_secs(2),
        "the refusal of {addr} took {elapsed:?}: was it dialed?"
    );
}

fn assert_refusal_record(record: &Value, host: &str, rule: &str) {
    assert_record(
        record,
        json!({
            "method": "GET",
            "scheme": "http",
            "host": host,
            "decision": "deny",
            "rule": rule,
            "reason": "non_public_address",
            "status": 403,
            "upstream": null,
            "bytes_up": 0,
        }),
    );
}

fn rule(name: &str, hosts: &[String], extra: &str) -> String {
    let hosts: Vec<String> = hosts.iter().map(|h| format!("{h:?}")).collect();
    format!(
        "[[rules]]\nname = \"{name}\"\nhosts = [{}]\n{extra}\n",
        hosts.join(", ")
    )
}

#[test]
fn every_non_public_address_class_is_refused_through_a_pinned_name() {
    let names: Vec<String> = (0..CLASSES.len()).map(|i| format!("c{i}.test")).collect();
    let mut builder = latchkey()
        .guarded()
        .policy("main.toml", &rule("pinned", &names, ""));
    for (name, case) in names.iter().zip(CLASSES) {
        builder = builder.resolve(name, case.ip);
    }
    let lk = builder.run();

    for (name, case) in names.iter().zip(CLASSES) {
        let (resp, elapsed) = get(&lk, name, "/latest/meta-data/");
        let addr = SocketAddr::new(parse_ip(case.ip), 80).to_string();
        assert_refused(&resp, elapsed, "pinned", &addr, case.says);
    }

    let records = lk.wait_audit(CLASSES.len());
    for (record, name) in records.iter().zip(&names) {
        assert_refusal_record(record, name, "pinned");
    }
}

#[test]
fn every_non_public_address_class_is_refused_as_a_literal_url() {
    // A rule may name an IP literal; the guard still refuses it unless its range is opened.
    let hosts: Vec<String> = CLASSES.iter().map(|c| c.ip.to_string()).collect();
    let lk = latchkey()
        .guarded()
        .policy("main.toml", &rule("literals", &hosts, ""))
        .run();

    for case in CLASSES {
        let (resp, elapsed) = get(&lk, &url_host(case.ip), "/");
        let addr = SocketAddr::new(parse_ip(case.ip), 80).to_string();
        assert_refused(&resp, elapsed, "literals", &addr, case.says);
    }

    let records = lk.wait_audit(CLASSES.len());
    for (record, case) in records.iter().zip(CLASSES) {
        // Hosts are recorded normalised: IPv6 in canonical form, without brackets.
        assert_refusal_record(record, &parse_ip(case.ip).to_string(), "literals");
    }
    // latchkey's own log says it once, with the flag that opens the range: a newcomer trying
    // latchkey against a local server looks there, not at the 403 body.
    let log = lk.stderr_text();
    let hints: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("refused to dial a non-public address"))
        .collect();
    assert_eq!(hints.len(), 1, "{log}");
    assert!(hints[0].contains("--allow-private"), "{}", hints[0]);
}

/// `(as sent, as a rule names it, the address it means, class)`: every spelling of an address
/// that `inet_aton` or a WHATWG URL parser accepts.
const ODD_FORMS: &[(&str, &str, &str, &str)] = &[
    (
        "2852039166",
        "2852039166",
        "169.254.169.254",
        "cloud metadata",
    ),
    (
        "0xA9FEA9FE",
        "0xa9fea9fe",
        "169.254.169.254",
        "cloud metadata",
    ),
    (
        "0xa9.0xfe.0xa9.0xfe",
        "0xa9.0xfe.0xa9.0xfe",
        "169.254.169.254",
        "cloud metadata",
    ),
    (
        "0251.0376.0251.0376",
        "0251.0376.0251.0376",
        "169.254.169.254",
        "cloud metadata",
    ),
    (
        "169.254.43518",
        "169.254.43518",
        "169.254.169.254",
        "cloud metadata",
    ),
    (
        "169.16689662",
        "169.16689662",
        "169.254.169.254",
        "cloud metadata",
    ),
    (
        "169.254.169.254.",
        "169.254.169.254",
        "169.254.169.254",
        "cloud metadata",
    ),
    (
        "[::ffff:169.254.169.254]",
        "::ffff:169.254.169.254",
        "[::ffff:169.254.169.254]",
        "cloud metadata",
    ),
    (
        "[::ffff:a9fe:a9fe]",
        "::ffff:a9fe:a9fe",
        "[::ffff:169.254.169.254]",
        "cloud metadata",
    ),
    ("127.1", "127.1", "127.0.0.1", "loopback"),
    ("0x7f.1", "0x7f.1", "127.0.0.1", "loopback"),
    ("017700000001", "017700000001", "127.0.0.1", "loopback"),
    ("0", "0", "0.0.0.0", "unspecified"),
    ("10.1", "10.1", "10.0.0.1", "RFC 1918 private"),
];

#[test]
fn odd_numeric_host_forms_are_read_as_the_address_they_mean_and_refused() {
    // Even a rule that names the odd spelling cannot reach what it means.
    let hosts: Vec<String> = ODD_FORMS.iter().map(|f| f.1.to_string()).collect();
    let lk = latchkey()
        .guarded()
        .policy("main.toml", &rule("odd", &hosts, ""))
        .run();

    for (sent, _, means, says) in ODD_FORMS {
        let (resp, elapsed) = get(&lk, sent, "/latest/meta-data/");
        assert_refused(&resp, elapsed, "odd", &format!("{means}:80"), says);
    }
    let records = lk.wait_audit(ODD_FORMS.len());
    for (record, (sent, ..)) in records.iter().zip(ODD_FORMS) {
        assert_record(
            record,
            json!({"decision": "deny", "reason": "non_public_address", "rule": "odd",
                   "status": 403, "upstream": null}),
        );
        assert!(
            record["host"].as_str().is_some_and(|h| !h.is_empty()),
            "{sent}: {record:#}"
        );
    }
}

#[test]
fn curl_spellings_of_the_metadata_address_are_refused_too() {
    // curl rewrites these to 169.254.169.254 itself; the refusal must not depend on who parsed.
    let lk = latchkey()
        .guarded()
        .policy(
            "main.toml",
            &rule("metadata", &["169.254.169.254".to_string()], ""),
        )
        .run();
    for url in [
        "http://2852039166/latest/meta-data/",
        "http://0xA9FEA9FE/latest/meta-data/",
        "http://0251.0376.0251.0376/latest/meta-data/",
        "http://169.254.169.254./latest/meta-data/",
    ] {
        let out = curl(&lk).args([url]).run();
        let resp = out.ok();
        assert_denial(resp, 403, Some("metadata"), "non_public_address");
        assert!(resp.text().contains("cloud metadata"), "{url}: {resp:#?}");
    }
    for record in lk.wait_audit(4) {
        assert_refusal_record(&record, "169.254.169.254", "metadata");
    }
}

#[test]
fn an_invalid_numeric_host_is_refused_as_a_bad_request_and_never_resolved_as_a_name() {
    // These end in a number, so they are IPv4 addresses to every URL parser, and invalid ones;
    // resolving them as names would let a resolver decide what they mean.
    let forms = [
        "256.1.1.1",
        "1.2.3.4.5",
        "0x100000000",
        "08.1.1.1",
        "1.256.0.0",
    ];
    // No rule can name them (policy validation refuses them too, see
    // `a_policy_naming_an_invalid_numeric_host_is_refused_at_load`), so a valid rule stands by.
    let hosts = vec!["api.test".to_string()];
    let lk = latchkey()
        .guarded()
        .policy("main.toml", &rule("invalid", &hosts, ""))
        .run();

    let mut problems = Vec::new();
    for form in forms {
        let (resp, _) = get(&lk, form, "/");
        let refused =
            matches!(resp.status, 400 | 403) && resp.header("x-latchkey-decision") == Some("deny");
        if !refused {
            problems.push(format!(
                "{form}: expected a 400/403 deny, got {} {:?} {:?}: {}",
                resp.status,
                resp.header("x-latchkey-decision"),
                resp.header("x-latchkey-reason"),
                resp.text().trim()
            ));
        }
    }
    let records = lk.wait_audit(forms.len());
    for (record, form) in records.iter().zip(forms) {
        assert_record(record, json!({"upstream": null}));
        if record["decision"] != "deny" {
            problems.push(format!(
                "{form}: audit decision {} reason {} (expected deny)",
                record["decision"], record["reason"]
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_connect_to_any_spelling_of_the_metadata_address_is_refused_before_the_tunnel_opens() {
    let forms = [
        ("169.254.169.254", "169.254.169.254"),
        ("2852039166", "2852039166"),
        ("0xa9fea9fe", "0xa9fea9fe"),
        ("0251.0376.0251.0376", "0251.0376.0251.0376"),
        ("169.254.169.254.", "169.254.169.254"),
        ("[::ffff:169.254.169.254]", "::ffff:169.254.169.254"),
    ];
    let hosts: Vec<String> = forms.iter().map(|f| f.1.to_string()).collect();
    let lk = latchkey()
        .guarded()
        .policy(
            "main.toml",
            &rule("metadata-tunnel", &hosts, "tunnel = true"),
        )
        .run();

    for (sent, _) in forms {
        let start = Instant::now();
        let (_tcp, resp) = connect_tunnel(lk.addr(), &format!("{sent}:443"));
        assert_refused(
            &resp,
            start.elapsed(),
            "metadata-tunnel",
            "169.254.169.254",
            "cloud metadata",
        );
    }
    let records = lk.wait_audit(forms.len());
    for record in &records {
        assert_record(
            record,
            json!({"method": "CONNECT", "port": 443, "decision": "deny",
                   "rule": "metadata-tunnel", "reason": "non_public_address",
                   "status": 403, "upstream": null}),
        );
    }
}

#[test]
fn an_intercepted_connect_to_the_metadata_address_is_refused_at_the_dial() {
    // Not a tunnel: latchkey intercepts (a leaf with an IP SAN) and refuses the inner request.
    let lk = latchkey()
        .guarded()
        .policy(
            "main.toml",
            &rule("metadata", &["169.254.169.254".to_string()], ""),
        )
        .run();
    let out = curl(&lk)
        .args(["https://169.254.169.254/latest/meta-data/iam/security-credentials/"])
        .run();
    let resp = out.ok();
    assert_denial(resp, 403, Some("metadata"), "non_public_address");
    assert!(resp.text().contains("169.254.169.254:443"), "{resp:#?}");

    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"method": "GET", "scheme": "https", "host": "169.254.169.254", "port": 443,
               "decision": "deny", "rule": "metadata", "reason": "non_public_address",
               "status": 403, "upstream": null}),
    );
}

#[test]
fn a_rule_naming_a_documentation_ip_literal_is_still_refused_and_told_how_to_open_it() {
    let lk = latchkey()
        .guarded()
        .policy(
            "main.toml",
            &rule("doc", &["203.0.113.7".to_string()], "ports = [8080]"),
        )
        .run();
    let (resp, elapsed) = get(&lk, "203.0.113.7:8080", "/");
    assert_refused(&resp, elapsed, "doc", "203.0.113.7:8080", "documentation");
    assert!(
        resp.text().contains("--allow-private 203.0.113.7/32"),
        "the refusal should say how to open the address: {resp:#?}"
    );
    assert_refusal_record(&lk.wait_audit(1)[0], "203.0.113.7", "doc");
}

#[test]
fn allow_private_on_the_command_line_opens_exactly_its_range() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .guarded()
        .arg("--allow-private")
        .arg("127.0.0.1/32")
        .pin("api.test")
        .resolve("next-door.test", "127.0.0.2")
        .policy(
            "main.toml",
            &rule(
                "api",
                &["api.test".to_string(), "next-door.test".to_string()],
                &format!("ports = [{port}]"),
            ),
        )
        .run();

    let (resp, _) = get(&lk, &format!("api.test:{port}"), "/v1/open");
    assert_eq!(resp.status, 200, "{resp:#?}");
    let (resp, elapsed) = get(&lk, &format!("next-door.test:{port}"), "/v1/closed");
    assert_refused(
        &resp,
        elapsed,
        "api",
        &format!("127.0.0.2:{port}"),
        "loopback",
    );
    assert_eq!(upstream.connections(), 1);

    let records = lk.wait_audit(2);
    assert_record(
        &records[0],
        json!({"decision": "allow", "reason": "allowed", "upstream": upstream.addr_string()}),
    );
    assert_refusal_record(&records[1], "next-door.test", "api");
}

#[test]
fn a_rules_allow_private_opens_its_range_for_that_rule_only() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .guarded()
        .pin("internal.test")
        .pin("other.test")
        .policy(
            "main.toml",
            &format!(
                "{}{}",
                rule(
                    "internal",
                    &["internal.test".to_string()],
                    &format!("ports = [{port}]\nallow_private = [\"127.0.0.0/8\"]"),
                ),
                rule(
                    "other",
                    &["other.test".to_string()],
                    &format!("ports = [{port}]")
                ),
            ),
        )
        .run();

    let (resp, _) = get(&lk, &format!("internal.test:{port}"), "/ok");
    assert_eq!(resp.status, 200, "{resp:#?}");
    let (resp, elapsed) = get(&lk, &format!("other.test:{port}"), "/no");
    assert_refused(
        &resp,
        elapsed,
        "other",
        &format!("127.0.0.1:{port}"),
        "loopback",
    );
    assert!(
        resp.text().contains("allow_private"),
        "the refusal should say how to open the range: {resp:#?}"
    );
    assert_eq!(upstream.connections(), 1, "the closed rule was dialed");

    let records = lk.wait_audit(2);
    assert_record(
        &records[0],
        json!({"rule": "internal", "reason": "allowed", "upstream": upstream.addr_string()}),
    );
    assert_refusal_record(&records[1], "other.test", "other");
}

#[test]
fn cloud_metadata_stays_closed_under_any_range_broader_than_its_own_address() {
    let lk = latchkey()
        .guarded()
        .arg("--allow-private")
        .arg("169.254.0.0/16")
        .arg("--allow-private")
        .arg("0.0.0.0/0")
        .arg("--allow-private")
        .arg("::/0")
        .resolve("metadata.test", "169.254.169.254")
        .resolve("ecs.test", "169.254.170.2")
        .resolve("v6.test", "fd00:ec2::254")
        .resolve("alibaba.test", "100.100.100.200")
        .policy(
            "main.toml",
            &rule(
                "metadata",
                &[
                    "metadata.test".to_string(),
                    "ecs.test".to_string(),
                    "v6.test".to_string(),
                    "alibaba.test".to_string(),
                    "[::ffff:169.254.169.254]".to_string(),
                ],
                "allow_private = [\"169.254.169.0/24\"]",
            ),
        )
        .run();

    for (host, addr) in [
        ("metadata.test", "169.254.169.254:80"),
        ("ecs.test", "169.254.170.2:80"),
        ("v6.test", "[fd00:ec2::254]:80"),
        ("alibaba.test", "100.100.100.200:80"),
        ("[::ffff:169.254.169.254]", "[::ffff:169.254.169.254]:80"),
    ] {
        let (resp, elapsed) = get(&lk, host, "/latest/meta-data/");
        assert_refused(&resp, elapsed, "metadata", addr, "cloud metadata");
        assert!(
            resp.text().contains("a broader range does not open it"),
            "{host}: {resp:#?}"
        );
    }
    lk.wait_audit(5);
}

/// A port on loopback that nothing listens on now.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[test]
fn latchkeys_own_listen_address_is_never_dialed_even_with_loopback_open() {
    // The default builder opens 127.0.0.0/8: only the own-address rule can refuse these.
    let port = free_port();
    let lk = latchkey()
        .listen(&format!("127.0.0.1:{port}"))
        .pin("self.test")
        .pin("self-tunnel.test")
        .resolve("self-alias.test", "127.0.0.2")
        .policy(
            "main.toml",
            &format!(
                "{}{}",
                rule(
                    "self",
                    &[
                        "self.test".to_string(),
                        "self-alias.test".to_string(),
                        "127.0.0.1".to_string(),
                        "0.0.0.0".to_string(),
                    ],
                    &format!("ports = [{port}]"),
                ),
                rule(
                    "self-tunnel",
                    &["self-tunnel.test".to_string()],
                    &format!("ports = [{port}]\ntunnel = true"),
                ),
            ),
        )
        .run();
    assert_eq!(lk.addr().port(), port);

    for (host, addr) in [
        ("self.test", format!("127.0.0.1:{port}")),
        ("self-alias.test", format!("127.0.0.2:{port}")),
        ("127.0.0.1", format!("127.0.0.1:{port}")),
        ("0.0.0.0", format!("0.0.0.0:{port}")),
    ] {
        let (resp, elapsed) = get(&lk, &format!("{host}:{port}"), "/");
        assert_refused(
            &resp,
            elapsed,
            "self",
            &addr,
            "latchkey's own listen address",
        );
    }
    let start = Instant::now();
    let (_tcp, resp) = connect_tunnel(lk.addr(), &format!("self-tunnel.test:{port}"));
    assert_refused(
        &resp,
        start.elapsed(),
        "self-tunnel",
        &format!("127.0.0.1:{port}"),
        "latchkey's own listen address",
    );

    let records = lk.wait_audit(5);
    for record in &records {
        assert_record(
            record,
            json!({"decision": "deny", "reason": "non_public_address", "upstream": null}),
        );
    }
}

#[test]
fn ports_default_to_443_for_connect_and_80_for_http_and_connect_to_22_is_refused() {
    let lk = latchkey()
        .guarded()
        .pin("api.test")
        .policy("main.toml", &rule("api", &["api.test".to_string()], ""))
        .run();

    for authority in ["api.test:22", "api.test:80", "api.test:8443"] {
        let (_tcp, resp) = connect_tunnel(lk.addr(), authority);
        assert_denial(&resp, 403, Some("api"), "port_not_allowed");
    }
    for authority in ["api.test:22", "api.test:443", "api.test:8080"] {
        let (resp, _) = get(&lk, authority, "/");
        assert_denial(&resp, 403, Some("api"), "port_not_allowed");
    }

    let records = lk.wait_audit(6);
    for (record, (method, port)) in records.iter().zip([
        ("CONNECT", 22),
        ("CONNECT", 80),
        ("CONNECT", 8443),
        ("GET", 22),
        ("GET", 443),
        ("GET", 8080),
    ]) {
        assert_record(
            record,
            json!({"method": method, "host": "api.test", "port": port, "decision": "deny",
                   "rule": "api", "reason": "port_not_allowed", "status": 403,
                   "upstream": null}),
        );
    }
}

#[test]
fn a_name_pinned_to_an_address_outside_the_open_range_is_refused_while_another_is_dialed() {
    // `--resolve` stands in for a resolver here: the same upstream, two names, one pinned inside
    // the opened range (the "public" answer) and one to loopback outside it (the "rebound"
    // answer). Each new upstream connection resolves and checks again, and dials exactly the
    // address it checked; `gateway::a_name_that_rebinds_to_loopback_is_refused_on_its_next_connection`
    // does the same with a real resolver whose answer changes between two requests.
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .guarded()
        .arg("--allow-private")
        .arg("127.0.0.1/32")
        .pin("good.test")
        .resolve("rebound.test", "127.0.0.53")
        .policy(
            "main.toml",
            &rule(
                "names",
                &["good.test".to_string(), "rebound.test".to_string()],
                &format!("ports = [{port}]"),
            ),
        )
        .run();

    let (resp, _) = get(&lk, &format!("good.test:{port}"), "/");
    assert_eq!(resp.status, 200, "{resp:#?}");
    let (resp, elapsed) = get(&lk, &format!("rebound.test:{port}"), "/");
    assert_refused(
        &resp,
        elapsed,
        "names",
        &format!("127.0.0.53:{port}"),
        "loopback",
    );
    assert_eq!(upstream.connections(), 1);
    lk.wait_audit(2);
}

#[test]
fn a_pooled_connection_opened_under_one_rules_range_is_not_reused_by_a_rule_without_it() {
    // Two rules for the same host: only /open/ opens loopback. A keep-alive connection pooled
    // for /open/ must not carry a request that /closed/ could never have dialed.
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .guarded()
        .pin("internal.test")
        .policy(
            "main.toml",
            &format!(
                "{}{}",
                rule(
                    "open",
                    &["internal.test".to_string()],
                    &format!(
                        "ports = [{port}]\npaths = [\"/open/**\"]\nallow_private = [\"127.0.0.0/8\"]"
                    ),
                ),
                rule(
                    "closed",
                    &["internal.test".to_string()],
                    &format!("ports = [{port}]\npaths = [\"/closed/**\"]"),
                ),
            ),
        )
        .run();

    let (resp, _) = get(&lk, &format!("internal.test:{port}"), "/open/1");
    assert_eq!(resp.status, 200, "{resp:#?}");
    let (resp, elapsed) = get(&lk, &format!("internal.test:{port}"), "/closed/1");
    assert_refused(
        &resp,
        elapsed,
        "closed",
        &format!("127.0.0.1:{port}"),
        "loopback",
    );
    let (resp, _) = get(&lk, &format!("internal.test:{port}"), "/open/2");
    assert_eq!(resp.status, 200, "{resp:#?}");
    let paths: Vec<String> = upstream.received().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/open/1", "/open/2"]);
    lk.wait_audit(3);
}

#[test]
fn a_policy_naming_an_invalid_numeric_host_is_refused_at_load() {
    let hosts = vec!["256.1.1.1".to_string()];
    let out = latchkey()
        .policy("main.toml", &rule("invalid", &hosts, ""))
        .run_expecting_failure();
    assert_eq!(out.code(), Some(1));
    assert!(
        out.stderr.contains("main.toml:") && out.stderr.contains("\"256\" is larger than 255"),
        "{}",
        out.stderr
    );
}

//! SOCKS5 (`serve --socks ADDR`): the CONNECT gate behind RFC 1928. curl with
//! `--socks5-hostname` reaches an allowed HTTPS host (intercepted with latchkey's CA) and a plain
//! HTTP host, each request decided by the pipeline and audited; a denied host is refused with
//! reply 0x02 and audited `no_rule`; an IP literal (`--socks5`, curl resolving) is the host
//! policy sees, so a rule naming the name does not allow it; RFC 1929 username/password maps to
//! identities like `Proxy-Authorization`; a `tunnel = true` rule relays; a raw client sending a
//! bad greeting, BIND, UDP ASSOCIATE, an unknown address type or a stalled field gets its reply
//! or a close, never a hang; an injected credential reaches the upstream and never the client.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::clients::{CurlOutput, RawResponse};
use crate::support::latchkey::{wait_with_timeout, SCRUBBED_ENV};
use crate::support::{assert_record, latchkey, toolchain, Echo, Latchkey, TestCa, Upstream};

const SOCKS_LINE: &str = "latchkey: socks5 listening on ";
const TOKEN_CI: &str = "tok-socks-ci-5d1e8a3f7b2c9046";
const SECRET: &str = "sk-socks-injected-8c41f0e27a9d3b65";

/// latchkey with `--socks 127.0.0.1:0` (and a 2 s header timeout, so stalls end quickly), an
/// HTTPS and a plain HTTP echo upstream, `policy(https_port, http_port)`.
struct World {
    lk: Latchkey,
    socks: SocketAddr,
    https: Upstream,
    http: Upstream,
    ca: TestCa,
}

fn world(policy: impl FnOnce(u16, u16) -> String) -> World {
    world_with(policy, &[])
}

/// [`world`] with extra `serve` arguments.
fn world_with(policy: impl FnOnce(u16, u16) -> String, args: &[&str]) -> World {
    let ca = TestCa::new();
    let https = Upstream::https(&ca);
    let http = Upstream::http();
    let mut builder = latchkey()
        .upstream_ca(&ca)
        .env("SOCKS_TEST_TOKEN_CI", TOKEN_CI)
        .env("SOCKS_TEST_KEY", SECRET)
        .arg("--socks")
        .arg("127.0.0.1:0")
        .arg("--header-timeout")
        .arg("2s")
        .policy("main.toml", &policy(https.port(), http.port()));
    for arg in args {
        builder = builder.arg(arg);
    }
    for host in ["api.test", "plain.test", "evil.test", "tunnel.test"] {
        builder = builder.pin(host);
    }
    let lk = builder.run();
    let socks = socks_addr(&lk);
    World {
        lk,
        socks,
        https,
        http,
        ca,
    }
}

/// The SOCKS5 listener's address, from its stderr line.
fn socks_addr(lk: &Latchkey) -> SocketAddr {
    assert!(
        lk.wait_stderr_contains(SOCKS_LINE, Duration::from_secs(5)),
        "no SOCKS5 line on stderr:\n{}",
        lk.stderr_text()
    );
    let text = lk.stderr_text();
    let addr = text
        .lines()
        .find_map(|l| l.trim_end().strip_prefix(SOCKS_LINE))
        .expect("the SOCKS5 line");
    addr.parse()
        .unwrap_or_else(|e| panic!("SOCKS5 address {addr:?}: {e}"))
}

/// `api` (HTTPS, GET under /v1/, a secret header injected), `plain` (plain HTTP), and a
/// `tunnel = true` rule; nothing else.
fn policy(https: u16, http: u16) -> String {
    format!(
        r#"
[secrets.key]
source = "env:SOCKS_TEST_KEY"

[[rules]]
name    = "api"
hosts   = ["api.test"]
ports   = [{https}]
methods = ["GET"]
paths   = ["/v1/**"]
[rules.inject.headers]
x-api-key = "{{{{secret.key}}}}"

[[rules]]
name  = "plain"
hosts = ["plain.test"]
ports = [{http}]

[[rules]]
name   = "tunnel"
hosts  = ["tunnel.test"]
ports  = [{https}, 1]
tunnel = true
"#
    )
}

/// curl with only the arguments given (no `-x`: each test names its SOCKS5 proxy), trusting
/// only `cacert`, never the system store.
fn curl(w: &World, cacert: &std::path::Path, args: &[&str]) -> CurlOutput {
    let scratch = tempfile::Builder::new()
        .prefix("curl")
        .tempdir_in(w.lk.scratch())
        .expect("curl scratch dir");
    let capath = scratch.path().join("capath");
    std::fs::create_dir(&capath).expect("empty capath");
    let (head, body) = (scratch.path().join("head"), scratch.path().join("body"));
    let mut cmd = Command::new(toolchain::tool("curl"));
    cmd.args(["-q", "-sS", "--max-time", "20", "--cacert"])
        .arg(cacert)
        .arg("--capath")
        .arg(&capath)
        .arg("-D")
        .arg(&head)
        .arg("-o")
        .arg(&body)
        .args(args);
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(30));
    let head =
        String::from_utf8_lossy(&std::fs::read(&head).unwrap_or_default()).replace("\r\n", "\n");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    CurlOutput {
        exit: out.code(),
        response: RawResponse {
            status,
            headers,
            body: std::fs::read(&body).unwrap_or_default(),
        },
        http_version: String::new(),
        stderr: out.stderr,
    }
}

/// Runs `tests/clients/socks_probe.py` against the SOCKS5 listener with `steps`.
fn probe(w: &World, steps: &[String]) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/socks_probe.py");
    let mut cmd = Command::new(toolchain::tool("python3"));
    cmd.arg(script)
        .arg(w.socks.ip().to_string())
        .arg(w.socks.port().to_string())
        .args(steps);
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(30));
    assert_eq!(out.code(), Some(0), "socks_probe.py failed: {out:#?}");
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("socks_probe.py printed no JSON ({e}): {out:#?}"))
}

fn send(hex: &str) -> String {
    format!("send:{hex}")
}

/// A CONNECT request for a domain name.
fn connect_name(host: &str, port: u16) -> String {
    let mut hex = format!("05010003{:02x}", host.len());
    for b in host.bytes() {
        hex.push_str(&format!("{b:02x}"));
    }
    hex.push_str(&format!("{port:04x}"));
    hex
}

fn records_with(lk: &Latchkey, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let records = lk.audit_records();
        if records.len() >= n || Instant::now() > deadline {
            return records;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn curl_socks5_hostname_reaches_an_allowed_https_and_plain_http_host_through_the_pipeline() {
    let w = world(policy);
    let proxy = w.socks.to_string();
    let url = format!("https://api.test:{}/v1/models", w.https.port());
    let out = curl(
        &w,
        &w.lk.ca_pem_path(),
        &["--socks5-hostname", &proxy, &url],
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    // Intercepted: the answer carries latchkey's record id, the request its injected secret.
    assert!(resp.header("x-latchkey-id").is_some(), "{resp:#?}");
    assert_eq!(Echo::parse(&resp.text()).path, "/v1/models");

    let url = format!("http://plain.test:{}/hello?q=1", w.http.port());
    let out = curl(
        &w,
        &w.lk.ca_pem_path(),
        &["--socks5-hostname", &proxy, &url],
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    assert_eq!(Echo::parse(&resp.text()).path, "/hello?q=1");
    assert_eq!((w.https.connections(), w.http.connections()), (1, 1));

    let records = w.lk.wait_audit(2);
    assert_record(
        &records[0],
        json!({"method": "GET", "scheme": "https", "host": "api.test", "port": w.https.port(),
               "path": "/v1/models", "decision": "allow", "rule": "api", "reason": "allowed",
               "status": 200, "upstream": w.https.addr_string()}),
    );
    assert_record(
        &records[1],
        json!({"method": "GET", "scheme": "http", "host": "plain.test", "port": w.http.port(),
               "path": "/hello?q=REDACTED", "decision": "allow", "rule": "plain",
               "reason": "allowed", "status": 200, "upstream": w.http.addr_string()}),
    );
}

#[test]
fn an_injected_credential_reaches_the_upstream_through_socks_and_never_the_client() {
    let w = world(policy);
    let url = format!("https://api.test:{}/v1/key", w.https.port());
    let proxy = format!("socks5h://{}", w.socks);
    let out = curl(
        &w,
        &w.lk.ca_pem_path(),
        &["-x", &proxy, "-H", "x-api-key: mine", &url],
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    let seen = w.https.received();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_eq!(seen[0].header_values("x-api-key"), [SECRET]);
    // The echo reflects the header: the sandbox sees it redacted, never the value.
    let text = resp.text();
    assert!(
        !text.contains(SECRET),
        "the secret reached the client: {text}"
    );
    assert!(text.contains("[REDACTED:key]"), "{text}");
    assert!(!out.stderr.contains(SECRET));
    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"host": "api.test", "rule": "api", "reason": "allowed", "secrets": ["key"]}),
    );
    assert!(!w.lk.audit_text().contains(SECRET));
    assert!(!w.lk.stderr_text().contains(SECRET));
}

#[test]
fn a_denied_host_gets_reply_0x02_and_an_ip_literal_is_the_host_policy_sees() {
    let w = world(policy);
    let proxy = w.socks.to_string();
    // curl names its failure by the reply code latchkey sent (2: not allowed by ruleset).
    let url = format!("https://evil.test:{}/", w.https.port());
    let out = curl(
        &w,
        &w.lk.ca_pem_path(),
        &["--socks5-hostname", &proxy, &url],
    );
    assert_ne!(out.exit, Some(0), "{out:#?}");
    assert!(out.stderr.contains("(2)"), "{out:#?}");

    // --socks5: curl resolves api.test itself and asks for 127.0.0.1, which no rule names.
    let url = format!("https://api.test:{}/v1/models", w.https.port());
    let resolve = format!("api.test:{}:127.0.0.1", w.https.port());
    let out = curl(
        &w,
        &w.lk.ca_pem_path(),
        &["--resolve", &resolve, "--socks5", &proxy, &url],
    );
    assert_ne!(out.exit, Some(0), "{out:#?}");
    assert!(out.stderr.contains("(2)"), "{out:#?}");

    // The reply itself, byte for byte, from a raw client.
    let got = probe(&w, &[send("050100"), send(&connect_name("evil.test", 443))]);
    assert_eq!(got["received"], "050005020001000000000000", "{got}");
    assert_eq!(got["closed"], true, "{got}");
    // An IPv6 literal (ATYP 0x04) is its own host too.
    let v6 = format!(
        "0501000400000000000000000000000000000001{:04x}",
        w.https.port()
    );
    let got = probe(&w, &[send("050100"), send(&v6)]);
    assert_eq!(got["received"], "050005020001000000000000", "{got}");
    assert_eq!(w.https.connections(), 0, "a denied CONNECT was dialed");

    let records = w.lk.wait_audit(4);
    for (record, (host, port)) in records.iter().zip([
        ("evil.test", w.https.port()),
        ("127.0.0.1", w.https.port()),
        ("evil.test", 443),
        ("::1", w.https.port()),
    ]) {
        assert_record(
            record,
            json!({"method": "CONNECT", "host": host, "port": port, "decision": "deny",
                   "rule": null, "reason": "no_rule", "status": null, "upstream": null,
                   "identity": "default"}),
        );
    }
}

#[test]
fn a_tunnel_rule_relays_and_an_unreachable_upstream_is_reply_0x04() {
    let w = world(policy);
    let proxy = w.socks.to_string();
    // The upstream's own certificate, not latchkey's: a tunnel is not intercepted.
    let url = format!("https://tunnel.test:{}/raw", w.https.port());
    let out = curl(&w, &w.ca.pem_path(), &["--socks5-hostname", &proxy, &url]);
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    assert!(resp.header("x-latchkey-id").is_none(), "{resp:#?}");
    // Port 1 on loopback: nothing listens, so the gate's dial fails.
    let got = probe(&w, &[send("050100"), send(&connect_name("tunnel.test", 1))]);
    assert_eq!(got["received"], "050005040001000000000000", "{got}");

    let records = w.lk.wait_audit(2);
    let tunnel = records
        .iter()
        .find(|r| r["port"] == w.https.port())
        .expect("the tunnel's record");
    assert_record(
        tunnel,
        json!({"method": "CONNECT", "host": "tunnel.test", "decision": "allow",
               "rule": "tunnel", "reason": "tunnel", "upstream": w.https.addr_string()}),
    );
    assert!(tunnel["bytes_up"].as_u64() > Some(0), "{tunnel}");
    let failed = records
        .iter()
        .find(|r| r["port"] == 1)
        .expect("the dial's record");
    assert_record(
        failed,
        json!({"method": "CONNECT", "host": "tunnel.test", "decision": "allow",
               "rule": "tunnel", "reason": "upstream_unreachable", "status": null}),
    );
}

fn identities_policy(https: u16, http: u16) -> String {
    format!(
        r#"{}
[identities.ci]
token = "env:SOCKS_TEST_TOKEN_CI"
rules = ["api", "plain"]
"#,
        policy(https, http)
    )
}

#[test]
fn username_and_password_map_to_identities_and_a_wrong_password_is_refused() {
    let w = world(identities_policy);
    let url = format!("http://plain.test:{}/who", w.http.port());
    let ca = w.lk.ca_pem_path();
    let with_url = format!("socks5h://ci:{TOKEN_CI}@{}", w.socks);
    let out = curl(&w, &ca, &["-x", &with_url, &url]);
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let plain_proxy = format!("socks5h://{}", w.socks);
    let user = format!("ci:{TOKEN_CI}");
    let out = curl(&w, &ca, &["-x", &plain_proxy, "--proxy-user", &user, &url]);
    assert_eq!(out.ok().status, 200, "{out:#?}");

    // A wrong password, and no credentials at all: refused before any request.
    let out = curl(
        &w,
        &ca,
        &["-x", &plain_proxy, "--proxy-user", "ci:wrong-token", &url],
    );
    assert_ne!(out.exit, Some(0), "{out:#?}");
    let out = curl(&w, &ca, &["-x", &plain_proxy, &url]);
    assert_ne!(out.exit, Some(0), "{out:#?}");
    // Byte for byte: method 0x02 chosen, then status 0x01 and a close.
    let auth = format!("01{:02x}{}{:02x}{}", 2, "6369", 5, "6e6f706521");
    let got = probe(&w, &[send("05020002"), send(&auth)]);
    assert_eq!(got["received"], "05020101", "{got}");
    assert_eq!(got["closed"], true, "{got}");
    // Only method 0x00 offered: no acceptable method.
    let got = probe(&w, &[send("050100")]);
    assert_eq!(got["received"], "05ff", "{got}");
    // Only the two identified requests reached the upstream (latchkey may pool one connection).
    let received = w.http.received();
    assert_eq!(received.len(), 2, "{received:#?}");
    for req in &received {
        assert!(req.header("proxy-authorization").is_none(), "{req:#?}");
    }

    let records = w.lk.wait_audit(6);
    for record in &records[..2] {
        assert_record(
            record,
            json!({"identity": "ci", "host": "plain.test", "rule": "plain",
                   "reason": "allowed", "status": 200}),
        );
    }
    for record in &records[2..] {
        assert_record(
            record,
            json!({"identity": "unidentified", "decision": "deny", "rule": null,
                   "reason": "proxy_auth_required", "host": null, "status": null}),
        );
    }
    let audit = w.lk.audit_text();
    assert!(
        !audit.contains(TOKEN_CI) && !audit.contains("wrong-token"),
        "{audit}"
    );
    assert!(!w.lk.stderr_text().contains(TOKEN_CI));
}

#[test]
fn a_raw_client_gets_its_reply_or_a_close_never_a_hang_and_each_is_audited() {
    let w = world(policy);
    // (case, steps, every byte latchkey sends back before it closes)
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        // SOCKS4: not ours; closed without an answer.
        ("socks4", vec![send("04010050")], ""),
        // BIND and UDP ASSOCIATE: method 0x00, then "command not supported".
        (
            "bind",
            vec![send("050100"), send("050200017f0000010035")],
            "050005070001000000000000",
        ),
        (
            "udp",
            vec![send("050100"), send("050300017f0000010035")],
            "050005070001000000000000",
        ),
        // An address type SOCKS5 does not have: "address type not supported".
        (
            "atyp",
            vec![send("050100"), send("05010009")],
            "050005080001000000000000",
        ),
        // 255 methods, none of them 0x00 or 0x02: no acceptable method.
        (
            "no method",
            vec![send(&format!("05ff{}", "03".repeat(255)))],
            "05ff",
        ),
        // A greeting naming 3 methods that sends 1, then stalls.
        ("stalled greeting", vec![send("050300")], ""),
        // A 255-byte name of which 4 bytes arrive, then nothing.
        (
            "stalled name",
            vec![send("050100"), send("05010003ff61616161")],
            "0500",
        ),
    ];
    let mut problems = Vec::new();
    for (name, steps, reply) in &cases {
        let got = probe(&w, steps);
        let elapsed = got["elapsed"].as_f64().unwrap_or(f64::MAX);
        // The header timeout is 2 s: every case ends well before the probe's own 10 s.
        if got["received"] != *reply || got["closed"] != true || elapsed > 5.0 {
            problems.push(format!("{name}: {got}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let records = records_with(&w.lk, cases.len());
    let expected = [
        json!({"reason": "bad_request", "method": null, "host": null}),
        json!({"reason": "bad_request", "method": "BIND", "host": "127.0.0.1", "port": 53}),
        json!({"reason": "bad_request", "method": "UDP_ASSOCIATE", "host": "127.0.0.1", "port": 53}),
        json!({"reason": "bad_request", "method": null, "host": null}),
        json!({"reason": "bad_request", "method": null, "host": null}),
        json!({"reason": "header_timeout", "method": null, "host": null}),
        json!({"reason": "header_timeout", "method": null, "host": null}),
    ];
    assert_eq!(records.len(), expected.len(), "{records:#?}");
    for (record, expected) in records.iter().zip(expected) {
        let mut expected = expected;
        expected["decision"] = json!("deny");
        expected["status"] = Value::Null;
        expected["upstream"] = Value::Null;
        assert_record(record, expected);
    }
}

#[test]
fn a_protocol_other_than_http_or_tls_after_an_allowed_connect_reaches_no_upstream() {
    // ssh-style: a banner, not HTTP and not TLS, to an authority a rule allows.
    let w = world(policy);
    let banner: String = b"SSH-2.0-OpenSSH_9.2\r\n"
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let got = probe(
        &w,
        &[
            send("050100"),
            send(&connect_name("plain.test", w.http.port())),
            send(&banner),
        ],
    );
    let received = got["received"].as_str().unwrap_or_default();
    // Allowed at the gate; then the pipeline's HTTP server waits for a request head that never
    // comes, answers 408 and closes (at the 2 s header timeout).
    assert!(
        received.starts_with(&format!("0500{}", "05000001000000000000")),
        "{got}"
    );
    let http = hex_text(&received[24..]);
    assert!(http.starts_with("HTTP/1.1 408"), "{http:?}");
    assert!(
        http.contains("x-latchkey-reason: header_timeout"),
        "{http:?}"
    );
    assert_eq!(got["closed"], true, "{got}");
    assert_eq!(w.http.connections(), 0, "the banner was relayed upstream");
    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"decision": "deny", "reason": "header_timeout", "upstream": null}),
    );
}

#[test]
fn a_socks_connection_over_the_per_client_cap_is_closed_and_audited() {
    let w = world_with(policy, &["--max-connections-per-client", "1"]);
    // One connection held open (mid-greeting) takes the client's only slot.
    #[allow(clippy::disallowed_methods)] // the test plays the sandbox, dialing latchkey
    let held = std::net::TcpStream::connect(w.socks).expect("connect");
    std::thread::sleep(Duration::from_millis(200));
    let got = probe(&w, &[send("050100")]);
    assert_eq!(got["received"], "", "{got}");
    assert_eq!(got["closed"], true, "{got}");
    assert!(got["elapsed"].as_f64() < Some(1.5), "{got}");
    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"decision": "deny", "reason": "too_many_connections", "host": null,
               "status": null}),
    );
    drop(held);
}

/// The text of a hex string, lossy.
fn hex_text(hex: &str) -> String {
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
fn an_sni_other_than_the_connect_host_is_refused_before_a_certificate() {
    // curl asks latchkey for api.test (allowed) and then speaks TLS for evil.test.
    let w = world(policy);
    let port = w.https.port();
    let url = format!("https://evil.test:{port}/v1/models");
    let to = format!("evil.test:{port}:api.test:{port}");
    let proxy = w.socks.to_string();
    let out = curl(
        &w,
        &w.lk.ca_pem_path(),
        &["--connect-to", &to, "--socks5-hostname", &proxy, &url],
    );
    assert_ne!(out.exit, Some(0), "{out:#?}");
    assert_eq!(out.response.status, 0, "{out:#?}");
    assert_eq!(
        w.https.connections(),
        0,
        "the spoofed SNI reached an upstream"
    );
    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"method": "CONNECT", "host": "api.test", "port": port, "decision": "deny",
               "reason": "sni_mismatch", "upstream": null}),
    );
}

#[test]
fn sigterm_stops_the_socks_listener_and_latchkey_exits_zero() {
    let mut w = world(policy);
    // An idle SOCKS5 client mid-greeting must not hold up the exit past its header timeout.
    #[allow(clippy::disallowed_methods)] // the test plays the sandbox, dialing latchkey
    let idle = std::net::TcpStream::connect(w.socks).expect("connect");
    std::thread::sleep(Duration::from_millis(200));
    let signalled = Instant::now();
    w.lk.signal("TERM");
    let status =
        w.lk.wait_exit(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("latchkey did not exit:\n{}", w.lk.stderr_text()));
    assert!(status.success(), "{status}\n{}", w.lk.stderr_text());
    assert!(signalled.elapsed() < Duration::from_secs(8));
    #[allow(clippy::disallowed_methods)]
    let after = std::net::TcpStream::connect(w.socks);
    assert!(
        after.is_err(),
        "the SOCKS5 listener still accepts after exit"
    );
    drop(idle);
}

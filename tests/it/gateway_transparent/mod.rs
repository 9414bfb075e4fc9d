//! Gateway mode without proxy settings, in network namespaces (`support::netns`): the sandbox's
//! only route leads to latchkey's namespace, where nftables redirects the sandbox's TCP 22, 80
//! and 443 to `serve --transparent` (transparent capture), or where latchkey listens on 80/443
//! itself (`--http-listen`, `--https-listen`: DNS-routed mode, the name resolving to latchkey).
//!
//! Real clients that know nothing of a proxy (curl `--noproxy '*'`, a raw Python socket, git,
//! Python's TLS without SNI, an SSH banner) reach allowed hosts through interception and are
//! refused elsewhere; an allowed SNI or Host sent to another address is refused before anything
//! is dialed. Every case asserts what the client saw, what reached the upstreams and the audit
//! record; [`tproxy`] does the same with nftables `tproxy` instead of `redirect`. Needs root
//! (`ip netns add`, `nft`).

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::latchkey::{wait_with_timeout, CliOutput};
use crate::support::netns::{
    curl_in, EchoOptions, Gateway, Netns, NsEcho, PROXY_IP, SANDBOX_IP, UPSTREAM_IP, UPSTREAM_NET,
};
use crate::support::{assert_denial, assert_record, latchkey, toolchain, Echo, Latchkey, TestCa};

mod ipv6;
mod routed;
mod sessions;
mod tproxy;

/// The transparent listener's port in latchkey's namespace.
const TRANSPARENT_PORT: u16 = 15001;
/// A second address in the upstream namespace that no allowed name resolves to.
const OTHER_IP: &str = "10.200.2.2";

/// The gateway's nftables: the sandbox's TCP 22, 80 and 443 to anywhere but latchkey itself go
/// to the transparent listener.
fn redirect_ruleset() -> String {
    format!(
        "table ip lk_transparent {{\n\
         \tchain prerouting {{\n\
         \t\ttype nat hook prerouting priority dstnat; policy accept;\n\
         \t\tip saddr {SANDBOX_IP} ip daddr != {PROXY_IP} tcp dport {{ 22, 80, 443 }} redirect to :{TRANSPARENT_PORT}\n\
         \t}}\n\
         }}\n"
    )
}

fn policy() -> &'static str {
    "[[rules]]\nname = \"upstream\"\nhosts = [\"up.test\", \"up6.test\"]\nports = [80, 443]\n\n\
     [[rules]]\nname = \"raw\"\nhosts = [\"tun.test\"]\nports = [443]\ntunnel = true\n"
}

/// latchkey in the gateway's proxy namespace: its proxy port, the upstream link opened,
/// `up.test`, `tun.test` and `evil.test` pinned to the upstream, and `extra` flags.
fn gateway_latchkey(gw: &Gateway, ca: &TestCa, extra: &[&str]) -> Latchkey {
    gateway_latchkey_with(gw, ca, extra, None)
}

/// [`gateway_latchkey`] with a second policy file.
fn gateway_latchkey_with(
    gw: &Gateway,
    ca: &TestCa,
    extra: &[&str],
    more_policy: Option<&str>,
) -> Latchkey {
    let mut builder = latchkey()
        .guarded()
        .netns(gw.proxy.name())
        .listen(&format!("{PROXY_IP}:3128"))
        .arg("--allow-private")
        .arg(UPSTREAM_NET)
        .resolve("up.test", UPSTREAM_IP)
        .resolve("tun.test", UPSTREAM_IP)
        .resolve("evil.test", UPSTREAM_IP)
        .upstream_ca(ca)
        .policy("main.toml", policy());
    if let Some(more) = more_policy {
        builder = builder.policy("more.toml", more);
    }
    for arg in extra {
        builder = builder.arg(arg);
    }
    builder.run()
}

/// A gateway whose proxy namespace redirects the sandbox to latchkey's transparent listener.
fn transparent(gw: &Gateway, ca: &TestCa, extra: &[&str]) -> Latchkey {
    gw.proxy.nft(&redirect_ruleset());
    let listen = format!("{PROXY_IP}:{TRANSPARENT_PORT}");
    let mut args = vec!["--transparent", listen.as_str()];
    args.extend_from_slice(extra);
    gateway_latchkey(gw, ca, &args)
}

/// The echo upstreams: plain HTTP on 80, HTTPS on 443 (a certificate for up.test and tun.test).
fn upstreams(gw: &Gateway, ca: &TestCa) -> (NsEcho, NsEcho) {
    let plain = NsEcho::start(&gw.upstream, "up", UPSTREAM_IP, 80, EchoOptions::default());
    let tls = NsEcho::start(
        &gw.upstream,
        "up-tls",
        UPSTREAM_IP,
        443,
        EchoOptions {
            tls: Some((ca, &["up.test", "tun.test"])),
            ..EchoOptions::default()
        },
    );
    (plain, tls)
}

/// curl that ignores every proxy setting, from the sandbox, `name:port` resolved to `ip`.
fn direct_curl(
    gw: &Gateway,
    lk: &Latchkey,
    resolve: (&str, u16, &str),
    url: &str,
) -> crate::support::clients::CurlOutput {
    let (name, port, ip) = resolve;
    curl_in(
        &gw.sandbox,
        lk,
        &[
            "--noproxy",
            "*",
            "--resolve",
            &format!("{name}:{port}:{ip}"),
            url,
        ],
        &[],
    )
}

/// Runs the tests' Python in `ns` with `code` and `args`.
fn python_in(ns: &Netns, code: &str, args: &[&str]) -> CliOutput {
    let mut cmd = ns.command(toolchain::python());
    cmd.arg("-c").arg(code).args(args);
    wait_with_timeout(&mut cmd, Duration::from_secs(30))
}

/// A raw socket client with no proxy support at all: sends `bytes` to `ip:port` and prints
/// whatever comes back until the connection closes.
const RAW_CLIENT: &str = r#"
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.sendall(sys.argv[3].encode())
out = b""
while True:
    try:
        chunk = s.recv(65536)
    except OSError as e:
        print("<" + type(e).__name__ + ">", file=sys.stderr)
        break
    if not chunk:
        break
    out += chunk
sys.stdout.write(out.decode("latin-1"))
"#;

/// TLS without SNI: Python's ssl sends no server_name when it is given no host name.
const NO_SNI_CLIENT: &str = r#"
import socket, ssl, sys
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
try:
    ctx.wrap_socket(s)
    print("handshake completed")
except (ssl.SSLError, OSError) as e:
    print("refused:", e)
"#;

/// Waits (5 s) for a record with every field of `fields`, and returns it.
pub(crate) fn record_with(lk: &Latchkey, fields: Value) -> Value {
    let want = fields.as_object().expect("fields as an object").clone();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let records = lk.audit_records();
        if let Some(r) = records
            .iter()
            .find(|r| want.iter().all(|(k, v)| r.get(k) == Some(v)))
        {
            return r.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no audit record with {fields}: {records:#?}\nstderr:\n{}",
            lk.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn from_sandbox(record: &Value) {
    assert!(
        record["client"]
            .as_str()
            .is_some_and(|c| c.starts_with(&format!("{SANDBOX_IP}:"))),
        "the client is the sandbox: {record:#}"
    );
}
#[test]
fn clients_that_ignore_proxy_settings_reach_allowed_hosts_through_the_transparent_listener() {
    let mut gw = Gateway::new();
    let ca = TestCa::new();
    let (plain, tls) = upstreams(&gw, &ca);
    let lk = transparent(&gw, &ca, &[]);

    // curl, HTTPS: intercepted with latchkey's CA, decided per request, dialed by name.
    let out = direct_curl(
        &gw,
        &lk,
        ("up.test", 443, UPSTREAM_IP),
        "https://up.test/tls",
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    assert!(resp.text().contains("\"server\": \"up-tls\""), "{resp:#?}");
    assert_eq!(Echo::parse(&resp.text()).path, "/tls");
    let record = record_with(&lk, json!({"path": "/tls"}));
    assert_record(
        &record,
        json!({"method": "GET", "scheme": "https", "host": "up.test", "port": 443,
               "decision": "allow", "rule": "upstream", "reason": "allowed", "status": 200,
               "upstream": format!("{UPSTREAM_IP}:443"),
               "original_dst": format!("{UPSTREAM_IP}:443")}),
    );
    from_sandbox(&record);

    // curl, plain HTTP: the Host header names the host.
    let out = direct_curl(
        &gw,
        &lk,
        ("up.test", 80, UPSTREAM_IP),
        "http://up.test/plain",
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    assert!(resp.text().contains("\"server\": \"up\""), "{resp:#?}");
    let record = record_with(&lk, json!({"path": "/plain"}));
    assert_record(
        &record,
        json!({"method": "GET", "scheme": "http", "host": "up.test", "port": 80,
               "reason": "allowed", "status": 200, "upstream": format!("{UPSTREAM_IP}:80"),
               "original_dst": format!("{UPSTREAM_IP}:80")}),
    );

    // A raw socket doing HTTP/1.1 by hand, two requests on one connection: the second names
    // another host, which the pipeline refuses on a connection pinned to up.test.
    let two = "GET /raw HTTP/1.1\r\nHost: up.test\r\n\r\n\
               GET /other HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n";
    let out = python_in(&gw.sandbox, RAW_CLIENT, &[UPSTREAM_IP, "80", two]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(out.stdout.starts_with("HTTP/1.1 200"), "{out:#?}");
    assert!(out.stdout.contains("\"path\": \"/raw\""), "{out:#?}");
    assert!(out.stdout.contains("HTTP/1.1 403"), "{out:#?}");
    assert!(
        out.stdout.contains("x-latchkey-reason: host_mismatch"),
        "{out:#?}"
    );
    assert_record(
        &record_with(&lk, json!({"path": "/raw"})),
        json!({"host": "up.test", "port": 80, "reason": "allowed"}),
    );
    assert_record(
        &record_with(&lk, json!({"path": "/other"})),
        json!({"host": "up.test", "decision": "deny", "reason": "host_mismatch",
               "status": 403, "upstream": null, "original_dst": format!("{UPSTREAM_IP}:80")}),
    );

    // git, by name from the sandbox's /etc/hosts: the echo is no git server (git reads its
    // answer as a dumb-protocol ref list holding no refs), but the smart protocol's first
    // request arrived through latchkey, which decided and recorded it.
    gw.sandbox.etc_file(
        "hosts",
        &format!("127.0.0.1 localhost\n{UPSTREAM_IP} up.test\n"),
    );
    gw.sandbox.etc_file("nsswitch.conf", "hosts: files\n");
    let home = tempfile::tempdir().expect("git home");
    let mut git: Command = gw.sandbox.command(toolchain::tool("git"));
    git.args(["ls-remote", "http://up.test/repo.git"])
        .env("HOME", home.path())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0");
    let out = wait_with_timeout(&mut git, Duration::from_secs(30));
    assert!(out.stdout.is_empty(), "no refs: {out:#?}");
    let record = record_with(&lk, json!({"path": "/repo.git/info/refs?service=REDACTED"}));
    assert_record(
        &record,
        json!({"method": "GET", "scheme": "http", "host": "up.test", "port": 80,
               "reason": "allowed", "status": 200, "upstream": format!("{UPSTREAM_IP}:80")}),
    );
    from_sandbox(&record);
    assert!(
        plain.connections() >= 1,
        "curl, python and git reached the upstream"
    );
    assert_eq!(tls.connections(), 1);
}

#[test]
fn hosts_no_rule_allows_are_refused_on_the_transparent_listener_and_never_dialed() {
    let gw = Gateway::new();
    let ca = TestCa::new();
    let (plain, tls) = upstreams(&gw, &ca);
    let lk = transparent(&gw, &ca, &[]);

    // TLS: the SNI is decided before any certificate; the handshake ends with an alert that
    // tells the client it was refused, not lost.
    let out = direct_curl(
        &gw,
        &lk,
        ("evil.test", 443, UPSTREAM_IP),
        "https://evil.test/",
    );
    assert_ne!(out.exit, Some(0), "{out:#?}");
    assert_eq!(out.response.status, 0, "{out:#?}");
    assert!(out.stderr.contains("alert access denied"), "{out:#?}");
    // Plain HTTP: the usual refusal.
    let out = direct_curl(
        &gw,
        &lk,
        ("evil.test", 80, UPSTREAM_IP),
        "http://evil.test/x",
    );
    assert_denial(out.ok(), 403, Some("none"), "no_rule");
    assert_eq!(
        plain.connections() + tls.connections(),
        0,
        "a denied host was dialed"
    );

    let records = lk.wait_audit(2);
    let tls_record = records
        .iter()
        .find(|r| r["port"] == 443)
        .expect("the TLS record");
    assert_record(
        tls_record,
        json!({"method": "CONNECT", "scheme": "https", "host": "evil.test", "port": 443,
               "decision": "deny", "rule": null, "reason": "no_rule", "status": null,
               "upstream": null, "original_dst": format!("{UPSTREAM_IP}:443")}),
    );
    let http_record = records
        .iter()
        .find(|r| r["port"] == 80)
        .expect("the HTTP record");
    assert_record(
        http_record,
        json!({"method": "GET", "scheme": "http", "host": "evil.test", "path": "/x",
               "decision": "deny", "reason": "no_rule", "status": 403,
               "upstream": null, "original_dst": format!("{UPSTREAM_IP}:80")}),
    );
    from_sandbox(http_record);

    // A client with no proxy support at all reads the reason in the status line.
    let request = "GET /y HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n";
    let out = python_in(&gw.sandbox, RAW_CLIENT, &[UPSTREAM_IP, "80", request]);
    assert!(
        out.stdout.starts_with(
            "HTTP/1.1 403 Forbidden (latchkey: no_rule - no rule allows GET http://evil.test/y"
        ),
        "{out:#?}"
    );
    assert_record(
        &record_with(&lk, json!({"path": "/y"})),
        json!({"reason": "no_rule", "upstream": null,
               "original_dst": format!("{UPSTREAM_IP}:80")}),
    );
    assert_eq!(plain.connections(), 0, "a denied host was dialed");
}

#[test]
fn an_allowed_name_sent_to_another_address_is_refused_and_a_tunnel_gets_the_hello_as_sent() {
    let gw = Gateway::new();
    let ca = TestCa::new();
    // OTHER_IP sits in the upstream namespace, opened for dialing, but is no address of any
    // allowed name: only the destination check stands between the sandbox and it.
    gw.upstream.ip(&[
        "addr",
        "add",
        &format!("{OTHER_IP}/32"),
        "dev",
        &gw.upstream_if,
    ]);
    gw.proxy.ip(&["route", "add", OTHER_IP, "via", UPSTREAM_IP]);
    let (_plain, tls) = upstreams(&gw, &ca);
    let other_tls = NsEcho::start(
        &gw.upstream,
        "other-443",
        OTHER_IP,
        443,
        EchoOptions::default(),
    );
    let other_plain = NsEcho::start(
        &gw.upstream,
        "other-80",
        OTHER_IP,
        80,
        EchoOptions::default(),
    );
    let lk = transparent(&gw, &ca, &["--allow-private", "10.200.2.0/24"]);

    // A tunnel = true rule: latchkey read the ClientHello to learn the SNI, then replays it, so
    // the client completes TLS with the upstream itself (its own certificate, not latchkey's).
    let ca_path = ca.pem_path();
    let ca_path = ca_path.to_str().expect("utf-8 path");
    let out = curl_in(
        &gw.sandbox,
        &lk,
        &[
            "--noproxy",
            "*",
            "--resolve",
            &format!("tun.test:443:{UPSTREAM_IP}"),
            "--cacert",
            ca_path,
            "https://tun.test/tunneled",
        ],
        &[],
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    assert!(resp.text().contains("\"server\": \"up-tls\""), "{resp:#?}");
    assert_record(
        &record_with(&lk, json!({"reason": "tunnel"})),
        json!({"method": "CONNECT", "host": "tun.test", "port": 443, "decision": "allow",
               "rule": "raw", "upstream": format!("{UPSTREAM_IP}:443"),
               "original_dst": format!("{UPSTREAM_IP}:443")}),
    );

    // The same names, sent to OTHER_IP: intercepted, tunnelled and plain-HTTP rules alike.
    for (name, port, url) in [
        ("up.test", 443, "https://up.test/spoof"),
        ("tun.test", 443, "https://tun.test/spoof"),
        ("up.test", 80, "http://up.test/spoof"),
    ] {
        let out = direct_curl(&gw, &lk, (name, port, OTHER_IP), url);
        if port == 80 {
            assert_denial(out.ok(), 403, Some("none"), "destination_mismatch");
            assert!(out.response.text().contains(OTHER_IP), "{out:#?}");
        } else {
            assert_ne!(out.exit, Some(0), "{url}: {out:#?}");
            assert_eq!(out.response.status, 0, "{out:#?}");
            assert!(out.stderr.contains("alert access denied"), "{out:#?}");
        }
        let record = record_with(
            &lk,
            json!({"host": name, "port": port, "reason": "destination_mismatch"}),
        );
        // Where the client sent it, and that latchkey contacted nothing.
        assert_record(
            &record,
            json!({"decision": "deny", "upstream": null,
                   "original_dst": format!("{OTHER_IP}:{port}")}),
        );
    }
    assert_eq!(
        other_tls.connections() + other_plain.connections(),
        0,
        "latchkey dialed the spoofed destination"
    );
    assert_eq!(tls.connections(), 1, "only the tunnel reached the upstream");
    lk.wait_audit(4);
}

#[test]
fn tls_without_sni_ssh_and_connections_not_redirected_are_refused_and_audited() {
    let gw = Gateway::new();
    let ca = TestCa::new();
    let (_plain, tls) = upstreams(&gw, &ca);
    let ssh = NsEcho::start(&gw.upstream, "ssh", UPSTREAM_IP, 22, EchoOptions::default());
    let lk = transparent(&gw, &ca, &[]);

    let out = python_in(&gw.sandbox, NO_SNI_CLIENT, &[UPSTREAM_IP, "443"]);
    assert!(out.stdout.starts_with("refused:"), "{out:#?}");
    assert!(out.stdout.contains("ALERT_HANDSHAKE_FAILURE"), "{out:#?}");
    assert_record(
        &record_with(&lk, json!({"reason": "no_sni"})),
        json!({"method": "CONNECT", "host": UPSTREAM_IP, "port": 443, "decision": "deny",
               "status": null, "upstream": null, "original_dst": format!("{UPSTREAM_IP}:443")}),
    );

    // An SSH client speaks first; it is neither TLS nor HTTP.
    let out = python_in(
        &gw.sandbox,
        RAW_CLIENT,
        &[UPSTREAM_IP, "22", "SSH-2.0-OpenSSH_9.0\r\n"],
    );
    assert_eq!(out.stdout, "", "{out:#?}");
    assert_record(
        &record_with(&lk, json!({"reason": "not_tls"})),
        json!({"host": UPSTREAM_IP, "port": 22, "decision": "deny", "status": null,
               "upstream": null, "original_dst": format!("{UPSTREAM_IP}:22")}),
    );

    // Straight to the transparent port: nothing redirected it, so it has no destination.
    let out = python_in(
        &gw.sandbox,
        RAW_CLIENT,
        &[
            PROXY_IP,
            &TRANSPARENT_PORT.to_string(),
            "GET / HTTP/1.1\r\nHost: up.test\r\n\r\n",
        ],
    );
    assert_eq!(out.stdout, "", "{out:#?}");
    assert_record(
        &record_with(&lk, json!({"reason": "not_redirected"})),
        json!({"host": PROXY_IP, "port": TRANSPARENT_PORT, "decision": "deny",
               "upstream": null,
               "original_dst": format!("{PROXY_IP}:{TRANSPARENT_PORT}")}),
    );
    assert_eq!(ssh.connections() + tls.connections(), 0);
    lk.wait_audit(3);
}
#[test]
fn a_captured_connection_has_the_identity_its_source_address_gives_it() {
    let gw = Gateway::new();
    let ca = TestCa::new();
    let (plain, _tls) = upstreams(&gw, &ca);
    gw.proxy.nft(&redirect_ruleset());
    let listen = format!("{PROXY_IP}:{TRANSPARENT_PORT}");
    // No token can ride on a captured connection: the sandbox is known by its address only.
    let identities = format!(
        "[[rules]]\nname = \"evil\"\nhosts = [\"evil.test\"]\nports = [80]\n\n\
         [identities.sandbox]\nsources = [\"{SANDBOX_IP}/32\"]\nrules = [\"upstream\"]\n"
    );
    let lk = gateway_latchkey_with(&gw, &ca, &["--transparent", &listen], Some(&identities));

    let out = direct_curl(
        &gw,
        &lk,
        ("up.test", 80, UPSTREAM_IP),
        "http://up.test/mine",
    );
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let out = direct_curl(
        &gw,
        &lk,
        ("evil.test", 80, UPSTREAM_IP),
        "http://evil.test/not-mine",
    );
    assert_denial(out.ok(), 403, Some("none"), "identity_not_allowed");
    let out = direct_curl(
        &gw,
        &lk,
        ("evil.test", 443, UPSTREAM_IP),
        "https://evil.test/",
    );
    assert_ne!(out.exit, Some(0), "{out:#?}");
    assert_eq!(plain.connections(), 1);

    let records = lk.wait_audit(3);
    for record in &records {
        assert_eq!(record["identity"], "sandbox", "{record:#}");
    }
    assert_record(
        &record_with(&lk, json!({"path": "/mine"})),
        json!({"reason": "allowed", "rule": "upstream"}),
    );
    assert_record(
        &record_with(&lk, json!({"path": "/not-mine"})),
        json!({"decision": "deny", "reason": "identity_not_allowed", "rule": "evil",
               "status": 403}),
    );
    assert_record(
        &record_with(&lk, json!({"method": "CONNECT"})),
        json!({"host": "evil.test", "reason": "identity_not_allowed", "rule": "evil",
               "status": null}),
    );
}

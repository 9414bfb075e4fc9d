//! latchkey as a sandbox's gateway, in network namespaces (`support::netns`): the sandbox's only
//! link leads to latchkey, upstreams live behind latchkey on links of their own. Proves that the
//! sandbox cannot reach an upstream directly, reaches it through latchkey (plain HTTP and HTTPS
//! interception, configured with `-x` or `HTTPS_PROXY`), and is refused for denied hosts, for the
//! cloud metadata address, for latchkey's own addresses and for a name that rebinds to loopback.
//!
//! Needs root (`ip netns add`); fails with a message saying so where that is not permitted.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::netns::{
    curl_in, EchoOptions, Gateway, NsEcho, NsProcess, PROXY_IP, PROXY_UPLINK_IP, SANDBOX_IP,
    UPSTREAM_IP, UPSTREAM_NET,
};
use crate::support::{assert_denial, assert_record, latchkey, Echo, Latchkey, TestCa};

const HTTP_PORT: u16 = 8080;
const HTTPS_PORT: u16 = 8443;

fn proxy_url() -> String {
    format!("http://{PROXY_IP}:3128")
}

/// latchkey in the gateway's proxy namespace on `PROXY_IP:3128`, with the upstream link opened
/// and `up.test` pinned to the upstream.
fn gateway_latchkey(gw: &Gateway, ca: &TestCa, policy: &str) -> Latchkey {
    latchkey()
        .guarded()
        .netns(gw.proxy.name())
        .listen(&format!("{PROXY_IP}:3128"))
        .arg("--allow-private")
        .arg(UPSTREAM_NET)
        .resolve("up.test", UPSTREAM_IP)
        .upstream_ca(ca)
        .policy("main.toml", policy)
        .run()
}

fn upstream_policy() -> String {
    format!(
        "[[rules]]\nname = \"upstream\"\nhosts = [\"up.test\"]\nports = [{HTTP_PORT}, {HTTPS_PORT}]\n"
    )
}

#[test]
fn the_sandbox_reaches_the_upstream_only_through_latchkey() {
    let gw = Gateway::new();
    let ca = TestCa::new();
    let plain = NsEcho::start(
        &gw.upstream,
        "up",
        UPSTREAM_IP,
        HTTP_PORT,
        EchoOptions::default(),
    );
    let tls = NsEcho::start(
        &gw.upstream,
        "up-tls",
        UPSTREAM_IP,
        HTTPS_PORT,
        EchoOptions {
            tls: Some((&ca, &["up.test"])),
            ..EchoOptions::default()
        },
    );
    let lk = gateway_latchkey(&gw, &ca, &upstream_policy());

    // Directly: the sandbox's route leads to latchkey, which does not forward.
    for url in [
        format!("http://{UPSTREAM_IP}:{HTTP_PORT}/direct"),
        format!("https://{UPSTREAM_IP}:{HTTPS_PORT}/direct"),
    ] {
        let out = curl_in(
            &gw.sandbox,
            &lk,
            &["--noproxy", "*", "--connect-timeout", "1", "-k", &url],
            &[],
        );
        assert_ne!(
            out.exit,
            Some(0),
            "the sandbox reached {url} directly: {out:#?}"
        );
        assert_eq!(out.response.status, 0, "{out:#?}");
    }
    assert_eq!(plain.connections() + tls.connections(), 0);

    // Through latchkey: plain HTTP with -x, HTTPS (intercepted) with HTTPS_PROXY.
    let out = curl_in(
        &gw.sandbox,
        &lk,
        &[
            "-x",
            &proxy_url(),
            &format!("http://up.test:{HTTP_PORT}/plain"),
        ],
        &[],
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    assert!(resp.text().contains("\"server\": \"up\""), "{resp:#?}");
    assert_eq!(Echo::parse(&resp.text()).path, "/plain");

    let out = curl_in(
        &gw.sandbox,
        &lk,
        &[&format!("https://up.test:{HTTPS_PORT}/through-mitm")],
        &[("HTTPS_PROXY", &proxy_url())],
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    assert!(resp.text().contains("\"server\": \"up-tls\""), "{resp:#?}");
    assert_eq!(Echo::parse(&resp.text()).path, "/through-mitm");
    assert_eq!((plain.connections(), tls.connections()), (1, 1));

    let records = lk.wait_audit(2);
    for (record, (port, scheme)) in records
        .iter()
        .zip([(HTTP_PORT, "http"), (HTTPS_PORT, "https")])
    {
        assert_record(
            record,
            json!({"scheme": scheme, "host": "up.test", "port": port, "decision": "allow",
                   "rule": "upstream", "reason": "allowed", "status": 200,
                   "upstream": format!("{UPSTREAM_IP}:{port}")}),
        );
        assert!(
            record["client"]
                .as_str()
                .is_some_and(|c| c.starts_with(&format!("{SANDBOX_IP}:"))),
            "the client is the sandbox: {record:#}"
        );
    }
}

#[test]
fn hosts_no_rule_allows_are_refused_from_the_sandbox_and_audited() {
    let gw = Gateway::new();
    let ca = TestCa::new();
    let plain = NsEcho::start(
        &gw.upstream,
        "up",
        UPSTREAM_IP,
        HTTP_PORT,
        EchoOptions::default(),
    );
    let lk = latchkey()
        .guarded()
        .netns(gw.proxy.name())
        .listen(&format!("{PROXY_IP}:3128"))
        .arg("--allow-private")
        .arg(UPSTREAM_NET)
        .resolve("up.test", UPSTREAM_IP)
        .resolve("evil.test", UPSTREAM_IP)
        .upstream_ca(&ca)
        .policy("main.toml", &upstream_policy())
        .run();

    // evil.test resolves to the very same upstream: only policy stands between them.
    for url in [
        format!("http://evil.test:{HTTP_PORT}/"),
        format!("http://{UPSTREAM_IP}:{HTTP_PORT}/"),
    ] {
        let out = curl_in(&gw.sandbox, &lk, &["-x", &proxy_url(), &url], &[]);
        assert_denial(out.ok(), 403, Some("none"), "no_rule");
    }
    let out = curl_in(
        &gw.sandbox,
        &lk,
        &[
            "-x",
            &proxy_url(),
            &format!("https://evil.test:{HTTPS_PORT}/"),
        ],
        &[],
    );
    // curl reports the refused CONNECT as an error; its head is still the latchkey denial.
    assert_ne!(out.exit, Some(0), "{out:#?}");
    assert_eq!(out.response.status, 403, "{out:#?}");
    assert_eq!(out.response.header("x-latchkey-reason"), Some("no_rule"));
    assert_eq!(plain.connections(), 0, "a denied request was dialed");

    let records = lk.wait_audit(3);
    for (record, (method, host)) in records.iter().zip([
        ("GET", "evil.test"),
        ("GET", UPSTREAM_IP),
        ("CONNECT", "evil.test"),
    ]) {
        assert_record(
            record,
            json!({"method": method, "host": host, "decision": "deny", "rule": null,
                   "reason": "no_rule", "status": 403, "upstream": null}),
        );
    }
}

#[test]
fn a_fake_metadata_service_opens_only_with_its_exact_address() {
    // The upstream namespace plays the cloud: it holds 169.254.169.254 and another link-local
    // address, each served by an echo. Only latchkey, inside these namespaces, dials them.
    let gw = Gateway::new();
    let ca = TestCa::new();
    gw.upstream
        .ip(&["addr", "add", "169.254.169.254/32", "dev", &gw.upstream_if]);
    gw.upstream
        .ip(&["addr", "add", "169.254.1.1/32", "dev", &gw.upstream_if]);
    for addr in ["169.254.169.254/32", "169.254.1.1/32"] {
        gw.proxy.ip(&["route", "add", addr, "via", UPSTREAM_IP]);
    }
    let metadata = NsEcho::start(
        &gw.upstream,
        "metadata",
        "169.254.169.254",
        80,
        EchoOptions::default(),
    );
    let link_local = NsEcho::start(
        &gw.upstream,
        "link-local",
        "169.254.1.1",
        80,
        EchoOptions::default(),
    );
    let policy = "[[rules]]\nname = \"cloud\"\nhosts = [\"169.254.169.254\", \"169.254.1.1\"]\n";
    let run = |port: u16, range: &str| {
        latchkey()
            .guarded()
            .netns(gw.proxy.name())
            .listen(&format!("{PROXY_IP}:{port}"))
            .arg("--allow-private")
            .arg(range)
            .upstream_ca(&ca)
            .policy("main.toml", policy)
            .run()
    };

    // The whole link-local range opens 169.254.1.1 but not the metadata address inside it.
    let broad = run(3128, "169.254.0.0/16");
    let proxy = format!("http://{PROXY_IP}:3128");
    let out = curl_in(
        &gw.sandbox,
        &broad,
        &["-x", &proxy, "http://169.254.1.1/"],
        &[],
    );
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let out = curl_in(
        &gw.sandbox,
        &broad,
        &["-x", &proxy, "http://169.254.169.254/latest/meta-data/"],
        &[],
    );
    let resp = out.ok();
    assert_denial(resp, 403, Some("cloud"), "non_public_address");
    assert!(
        resp.text().contains("--allow-private 169.254.169.254/32"),
        "{resp:#?}"
    );
    assert_eq!((link_local.connections(), metadata.connections()), (1, 0));
    let records = broad.wait_audit(2);
    assert_record(
        &records[1],
        json!({"host": "169.254.169.254", "decision": "deny", "rule": "cloud",
               "reason": "non_public_address", "upstream": null}),
    );

    // Its exact address opens it.
    let exact = run(3129, "169.254.169.254/32");
    let proxy = format!("http://{PROXY_IP}:3129");
    let out = curl_in(
        &gw.sandbox,
        &exact,
        &["-x", &proxy, "http://169.254.169.254/latest/meta-data/"],
        &[],
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    assert!(
        resp.text().contains("\"server\": \"metadata\""),
        "{resp:#?}"
    );
    assert_eq!(metadata.connections(), 1);
    let records = exact.wait_audit(1);
    assert_record(
        &records[0],
        json!({"decision": "allow", "reason": "allowed", "upstream": "169.254.169.254:80"}),
    );
}

#[test]
fn latchkeys_own_addresses_are_never_dialed_even_inside_an_opened_range() {
    // latchkey listens on every address of its namespace; the sandbox asks it to dial each of
    // them (and loopback) on its own port, with all of 10.200.0.0/16 and loopback opened. A dial
    // would loop back into latchkey, and a tunnel to itself would let the sandbox speak to
    // latchkey from latchkey's own address.
    let gw = Gateway::new();
    let ca = TestCa::new();
    let hosts = [PROXY_IP, PROXY_UPLINK_IP, "127.0.0.1"];
    let lk = latchkey()
        .guarded()
        .netns(gw.proxy.name())
        .listen("0.0.0.0:3128")
        .arg("--allow-private")
        .arg("10.200.0.0/16")
        .arg("--allow-private")
        .arg("127.0.0.0/8")
        .resolve("self.test", PROXY_UPLINK_IP)
        .upstream_ca(&ca)
        .policy(
            "main.toml",
            &format!(
                "[[rules]]\nname = \"self\"\nhosts = [{}]\nports = [3128]\n\n\
                 [[rules]]\nname = \"self-tunnel\"\nhosts = [\"self.test\"]\nports = [3128]\ntunnel = true\n",
                hosts.map(|h| format!("{h:?}")).join(", ")
            ),
        )
        .run();

    let mut problems = Vec::new();
    for host in hosts {
        let out = curl_in(
            &gw.sandbox,
            &lk,
            &["-x", &proxy_url(), &format!("http://{host}:3128/")],
            &[],
        );
        let resp = &out.response;
        if resp.status != 403
            || resp.header("x-latchkey-reason") != Some("non_public_address")
            || !resp.text().contains("latchkey's own listen address")
        {
            problems.push(format!(
                "http://{host}:3128/: {} {:?}: {}",
                resp.status,
                resp.header("x-latchkey-reason"),
                resp.text().trim()
            ));
        }
    }
    let out = curl_in(
        &gw.sandbox,
        &lk,
        &["-x", &proxy_url(), "-p", "http://self.test:3128/"],
        &[],
    );
    if out.response.status != 403
        || out.response.header("x-latchkey-reason") != Some("non_public_address")
    {
        problems.push(format!(
            "CONNECT self.test:3128 ({PROXY_UPLINK_IP}): curl exit {:?}, {} {:?}: {}",
            out.exit,
            out.response.status,
            out.response.header("x-latchkey-reason"),
            out.response.text().trim()
        ));
    }
    let records = lk.audit_records();
    for record in &records {
        if !record["upstream"].is_null() {
            problems.push(format!("latchkey dialed itself: {record}"));
        }
    }
    assert!(
        problems.is_empty(),
        "latchkey's own addresses:\n{}",
        problems.join("\n")
    );
}

#[test]
fn a_name_that_rebinds_to_loopback_is_refused_on_its_next_connection() {
    // latchkey's namespace resolves through a scripted DNS server on its own 127.0.0.1:53.
    // up.test first answers the upstream (inside the range opened on purpose, standing in for a
    // public address), then 127.0.0.1, where an internal service of latchkey's host listens on
    // the same port. The upstream closes every connection, so each request dials, resolves and
    // checks again; mixed.test answers both addresses at once.
    let mut gw = Gateway::new();
    gw.proxy.etc_file(
        "resolv.conf",
        "nameserver 127.0.0.1\noptions attempts:1 timeout:1\n",
    );
    gw.proxy.etc_file("nsswitch.conf", "hosts: files dns\n");
    gw.proxy
        .etc_file("hosts", "127.0.0.1 localhost\n::1 localhost\n");
    let ca = TestCa::new();
    let answers = tempfile::NamedTempFile::new().expect("answers file");
    std::fs::write(
        answers.path(),
        json!({
            "up.test": [[UPSTREAM_IP], ["127.0.0.1"]],
            "mixed.test": [[UPSTREAM_IP, "127.0.0.1"]],
        })
        .to_string(),
    )
    .expect("write answers");
    let mut dns = gw.proxy.command(crate::support::toolchain::python());
    dns.arg("-u")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/dns_server.py"
        ))
        .arg(answers.path());
    let dns = NsProcess::spawn(dns, "dns server");
    let upstream = NsEcho::start(
        &gw.upstream,
        "up",
        UPSTREAM_IP,
        HTTP_PORT,
        EchoOptions {
            close: true,
            ..EchoOptions::default()
        },
    );
    let internal = NsEcho::start(
        &gw.proxy,
        "internal",
        "127.0.0.1",
        HTTP_PORT,
        EchoOptions::default(),
    );
    let lk = latchkey()
        .guarded()
        .netns(gw.proxy.name())
        .listen(&format!("{PROXY_IP}:3128"))
        .arg("--allow-private")
        .arg(UPSTREAM_NET)
        .upstream_ca(&ca)
        .policy(
            "main.toml",
            &format!(
                "[[rules]]\nname = \"dns\"\nhosts = [\"up.test\", \"mixed.test\"]\nports = [{HTTP_PORT}]\n"
            ),
        )
        .run();
    let get = |host: &str, path: &str| {
        let start = Instant::now();
        let out = curl_in(
            &gw.sandbox,
            &lk,
            &[
                "-x",
                &proxy_url(),
                &format!("http://{host}:{HTTP_PORT}{path}"),
            ],
            &[],
        );
        (out, start.elapsed())
    };

    let (out, _) = get("up.test", "/first");
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}\ndns:\n{}", dns.output());
    assert!(resp.text().contains("\"server\": \"up\""), "{resp:#?}");

    let (out, elapsed) = get("up.test", "/second");
    let resp = out.ok();
    assert_denial(resp, 403, Some("dns"), "non_public_address");
    assert!(
        resp.text().contains(&format!("127.0.0.1:{HTTP_PORT}")) && resp.text().contains("loopback"),
        "{resp:#?}"
    );
    assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");

    let (out, _) = get("mixed.test", "/");
    let resp = out.ok();
    assert_denial(resp, 403, Some("dns"), "non_public_address");
    assert!(resp.text().contains("127.0.0.1"), "{resp:#?}");

    assert_eq!(internal.connections(), 0, "the rebound address was dialed");
    assert_eq!(
        upstream.connections(),
        1,
        "a name with a refused address was dialed at its other one"
    );
    assert!(
        dns.count("query up.test 1 ") >= 2,
        "latchkey did not resolve up.test again for the new connection:\n{}",
        dns.output()
    );

    let records = lk.wait_audit(3);
    assert_record(
        &records[0],
        json!({"host": "up.test", "reason": "allowed",
               "upstream": format!("{UPSTREAM_IP}:{HTTP_PORT}")}),
    );
    for (record, host) in records[1..].iter().zip(["up.test", "mixed.test"]) {
        assert_record(
            record,
            json!({"host": host, "decision": "deny", "rule": "dns",
                   "reason": "non_public_address", "status": 403, "upstream": null}),
        );
    }
}

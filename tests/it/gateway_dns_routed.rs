//! DNS-routed gateway mode, end to end in network namespaces: the sandbox's only resolver is
//! latchkey (`--dns`, answer style `self`), which answers allowed names with its own address
//! and serves them on `--https-listen` / `--http-listen`, taking the host from SNI / Host. A
//! client that knows nothing about proxies (`curl --noproxy '*'`) reaches allowed hosts by
//! name, and a name no rule allows does not even resolve. Every query and request is audited.
//!
//! Needs root (`ip netns add`); fails with a message saying so where that is not permitted.

use serde_json::{json, Value};

use crate::support::netns::{
    curl_in, EchoOptions, Gateway, NsEcho, PROXY_IP, UPSTREAM_IP, UPSTREAM_NET,
};
use crate::support::{assert_record, latchkey, Echo, Latchkey, TestCa};

fn dns_routed_latchkey(gw: &Gateway, ca: &TestCa) -> Latchkey {
    latchkey()
        .guarded()
        .netns(gw.proxy.name())
        .listen(&format!("{PROXY_IP}:3128"))
        .arg("--dns")
        .arg(&format!("{PROXY_IP}:53"))
        .arg("--dns-self")
        .arg(PROXY_IP)
        .arg("--https-listen")
        .arg(&format!("{PROXY_IP}:443"))
        .arg("--http-listen")
        .arg(&format!("{PROXY_IP}:80"))
        .arg("--allow-private")
        .arg(UPSTREAM_NET)
        .resolve("up.test", UPSTREAM_IP)
        .resolve("evil.test", UPSTREAM_IP)
        .upstream_ca(ca)
        .policy(
            "main.toml",
            "[[rules]]\nname = \"upstream\"\nhosts = [\"up.test\"]\nports = [80, 443]\n",
        )
        .run()
}

/// Waits (5 s) until the audit log satisfies `done`; records arrive in batches.
fn wait_for(lk: &Latchkey, done: impl Fn(&[Value]) -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let records = lk.audit_records();
        if done(&records) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the expected records did not arrive: {records:#?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn records_with(lk: &Latchkey, method: &str, host: &str) -> Vec<Value> {
    lk.audit_records()
        .into_iter()
        .filter(|r| r["method"] == method && r["host"] == host)
        .collect()
}

#[test]
fn a_sandbox_whose_only_resolver_is_latchkey_reaches_allowed_names_through_it() {
    let mut gw = Gateway::new();
    gw.sandbox
        .etc_file("resolv.conf", &format!("nameserver {PROXY_IP}\n"));
    gw.sandbox.etc_file("hosts", "127.0.0.1 localhost\n");
    let ca = TestCa::new();
    let plain = NsEcho::start(&gw.upstream, "up", UPSTREAM_IP, 80, EchoOptions::default());
    let tls = NsEcho::start(
        &gw.upstream,
        "up-tls",
        UPSTREAM_IP,
        443,
        EchoOptions {
            tls: Some((&ca, &["up.test"])),
            ..EchoOptions::default()
        },
    );
    let lk = dns_routed_latchkey(&gw, &ca);

    // The name resolves to latchkey itself, not to the upstream.
    let hosts = gw.sandbox.sh("getent ahostsv4 up.test | head -n 1");
    assert!(hosts.starts_with(PROXY_IP), "up.test resolved to {hosts:?}");

    // No proxy settings at all: HTTPS is intercepted on --https-listen, HTTP on --http-listen.
    let out = curl_in(
        &gw.sandbox,
        &lk,
        &["--noproxy", "*", "https://up.test/by-name"],
        &[],
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    assert!(resp.text().contains("\"server\": \"up-tls\""), "{resp:#?}");
    assert_eq!(Echo::parse(&resp.text()).path, "/by-name");
    let out = curl_in(
        &gw.sandbox,
        &lk,
        &["--noproxy", "*", "http://up.test/plain"],
        &[],
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    assert!(resp.text().contains("\"server\": \"up\""), "{resp:#?}");
    assert_eq!((plain.connections(), tls.connections()), (1, 1));

    // A name no rule allows does not resolve, so nothing is even attempted.
    let out = curl_in(
        &gw.sandbox,
        &lk,
        &["--noproxy", "*", "https://evil.test/"],
        &[],
    );
    assert_eq!(
        out.exit,
        Some(6),
        "curl should fail to resolve evil.test: {out:#?}"
    );
    assert_eq!((plain.connections(), tls.connections()), (1, 1));

    // The audit trail: the queries (allowed and refused) and both requests.
    wait_for(&lk, |records| {
        records.iter().filter(|r| r["method"] == "GET").count() == 2
            && records.iter().any(|r| r["host"] == "evil.test")
    });
    let allowed = records_with(&lk, "DNS", "up.test");
    assert!(
        allowed.iter().any(|r| r["reason"] == "allowed"),
        "no allowed DNS record for up.test: {allowed:#?}"
    );
    let refused = records_with(&lk, "DNS", "evil.test");
    assert!(
        !refused.is_empty() && refused.iter().all(|r| r["decision"] == "deny"),
        "evil.test's queries must be recorded as denied: {refused:#?}"
    );
    for (scheme, port, path) in [("https", 443, "/by-name"), ("http", 80, "/plain")] {
        let record = lk
            .audit_records()
            .into_iter()
            .find(|r| r["method"] == "GET" && r["path"] == path)
            .unwrap_or_else(|| panic!("no record for {path}: {:#?}", lk.audit_records()));
        assert_record(
            &record,
            json!({"scheme": scheme, "host": "up.test", "port": port, "decision": "allow",
                   "rule": "upstream", "reason": "allowed", "status": 200,
                   "upstream": format!("{UPSTREAM_IP}:{port}")}),
        );
    }
}

//! DNS-routed mode: no firewall rule, the sandbox reaches latchkey's `--https-listen` and
//! `--http-listen` because the name resolves to latchkey (as latchkey's resolver answers with
//! `--dns-answer self`); the host comes from the SNI and the `Host` header.

use serde_json::json;

use super::*;

#[test]
fn dns_routed_listeners_take_the_host_from_sni_and_host() {
    let gw = Gateway::new();
    let ca = TestCa::new();
    let (plain, tls) = upstreams(&gw, &ca);
    let https = format!("{PROXY_IP}:443");
    let http = format!("{PROXY_IP}:80");
    // No firewall rule: the sandbox reaches latchkey because the name resolves to it, as
    // latchkey's resolver answers in DNS-routed mode.
    let lk = gateway_latchkey(
        &gw,
        &ca,
        &["--https-listen", &https, "--http-listen", &http],
    );

    let out = direct_curl(
        &gw,
        &lk,
        ("up.test", 443, PROXY_IP),
        "https://up.test/routed",
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    assert_eq!(Echo::parse(&resp.text()).path, "/routed");
    let out = direct_curl(
        &gw,
        &lk,
        ("up.test", 80, PROXY_IP),
        "http://up.test/routed-plain",
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    assert!(resp.text().contains("\"server\": \"up\""), "{resp:#?}");
    let out = direct_curl(&gw, &lk, ("evil.test", 443, PROXY_IP), "https://evil.test/");
    assert_ne!(out.exit, Some(0), "{out:#?}");
    let out = direct_curl(&gw, &lk, ("evil.test", 80, PROXY_IP), "http://evil.test/");
    assert_denial(out.ok(), 403, Some("none"), "no_rule");
    assert_eq!((plain.connections(), tls.connections()), (1, 1));

    let records = lk.wait_audit(4);
    let find = |path: &str| {
        records
            .iter()
            .find(|r| r["path"] == path)
            .unwrap_or_else(|| panic!("no record for {path}: {records:#?}"))
    };
    assert_record(
        find("/routed"),
        json!({"scheme": "https", "host": "up.test", "port": 443, "reason": "allowed",
               "upstream": format!("{UPSTREAM_IP}:443")}),
    );
    assert_record(
        find("/routed-plain"),
        json!({"scheme": "http", "host": "up.test", "port": 80, "reason": "allowed",
               "upstream": format!("{UPSTREAM_IP}:80")}),
    );
    let denied = records
        .iter()
        .find(|r| r["method"] == "CONNECT")
        .expect("the refused TLS record");
    assert_record(
        denied,
        json!({"host": "evil.test", "port": 443, "reason": "no_rule", "status": null,
               "upstream": null}),
    );
    assert_record(
        find("/"),
        json!({"method": "GET", "host": "evil.test", "port": 80, "reason": "no_rule",
               "status": 403, "upstream": null}),
    );
    // The client connected to latchkey itself: there is no redirected destination to name.
    for record in &records {
        assert!(record.get("original_dst").is_none(), "{record:#}");
    }
}

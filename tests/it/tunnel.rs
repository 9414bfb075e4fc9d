//! `tunnel = true` rules relay the client's TLS untouched; every other host is intercepted.

use serde_json::json;

use crate::support::{api_policy, assert_record, curl, https_world, Echo};

fn tunnel_policy(port: u16) -> String {
    format!(
        r#"{api}
[[rules]]
name   = "tunnel"
hosts  = ["tunnel.test"]
ports  = [{port}]
tunnel = true
"#,
        api = api_policy(port)
    )
}

#[test]
fn a_tunnel_rule_relays_tls_untouched_to_the_real_upstream() {
    let w = https_world(tunnel_policy);
    let port = w.upstream.port();

    // Trusting only the upstream's own CA: success proves latchkey did not intercept.
    let out = curl(&w.lk)
        .cacert(&w.ca.pem_path())
        .args([format!("https://tunnel.test:{port}/through/the/tunnel")])
        .run();
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    let echo = Echo::parse(&resp.text());
    assert_eq!(echo.path, "/through/the/tunnel");
    assert!(
        !echo.has_header("x-test-injected"),
        "a tunnel cannot inject headers: {echo:#?}"
    );
    assert_eq!(w.upstream.connections(), 1);

    let records = w.lk.wait_audit(1);
    let record = &records[0];
    assert_record(
        record,
        json!({
            "method": "CONNECT",
            "host": "tunnel.test",
            "port": port,
            "decision": "allow",
            "rule": "tunnel",
            "reason": "tunnel",
            "upstream": w.upstream.addr_string(),
        }),
    );
    for field in ["bytes_up", "bytes_down"] {
        assert!(
            record[field].as_u64().is_some_and(|n| n > 0),
            "{field} of a tunnel that carried a TLS session: {record:#}"
        );
    }
}

#[test]
fn a_host_without_a_tunnel_rule_is_intercepted_not_relayed() {
    let w = https_world(tunnel_policy);
    let port = w.upstream.port();

    // The upstream's own CA does not vouch for latchkey's leaf: the client refuses the handshake.
    let out = curl(&w.lk)
        .cacert(&w.ca.pem_path())
        .args([format!("https://api.test:{port}/v1/items")])
        .run();
    assert_ne!(
        out.exit,
        Some(0),
        "a client trusting only the upstream's CA reached an intercepted host: {out:#?}"
    );
    assert_eq!(
        w.upstream.connections(),
        0,
        "latchkey dialed the upstream before any inner request"
    );

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "method": "CONNECT",
            "host": "api.test",
            "port": port,
            "decision": "deny",
            "reason": "tls_handshake_failed",
            "status": null,
            "upstream": null,
        }),
    );
}

/// `bytes_up` on a tunnel rule counts every byte relayed upstream, reserved before it is
/// written: past the budget the tunnel stops relaying and the record says so; once it is
/// spent, a CONNECT is refused.
#[test]
fn a_tunnel_under_a_bytes_budget_is_charged_what_it_relays_and_cut_at_the_budget() {
    const BUDGET: u64 = 20_000;
    let w = https_world(|port| {
        tunnel_policy(port).replace(
            "tunnel = true\n",
            "tunnel = true\nlimits = [\"exfil\"]\n\n[limits.exfil]\nbytes_up = \"20KB/day\"\n",
        )
    });
    let port = w.upstream.port();
    let body = w.lk.scratch().join("tunnel-body.bin");
    std::fs::write(&body, vec![b'b'; 8000]).expect("body");
    let data = format!("@{}", body.display());
    let outcomes: Vec<Option<i32>> = (0..6)
        .map(|i| {
            curl(&w.lk)
                .cacert(&w.ca.pem_path())
                .args([
                    "--data-binary".to_string(),
                    data.clone(),
                    format!("https://tunnel.test:{port}/upload/{i}"),
                ])
                .run()
                .exit
        })
        .collect();
    assert_eq!(outcomes[0], Some(0), "{outcomes:?}");
    assert!(
        outcomes.iter().filter(|e| **e == Some(0)).count() < 3,
        "three 8 KB uploads fit a 20 KB budget: {outcomes:?}"
    );

    let records = w.lk.wait_audit(6);
    let mut charged_total = 0;
    for r in &records {
        let c = crate::support::providers::charge(r, "exfil", "bytes_up");
        let charged = crate::support::providers::num(&c, "charged");
        if r["reason"] == "tunnel" {
            assert_eq!(charged, r["bytes_up"].as_u64().expect("bytes_up"), "{r:#}");
        }
        if r["status"] != 429 {
            charged_total += charged;
        }
    }
    assert!(
        charged_total <= BUDGET,
        "{charged_total} relayed: {records:#?}"
    );
    assert!(
        records
            .iter()
            .any(|r| r["reason"] == "budget_exhausted" && r["decision"] == "deny"),
        "{records:#?}"
    );
}

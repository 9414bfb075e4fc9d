//! The audit schema check itself: it must reject what breaks the contract, or every audit
//! assertion built on it proves nothing.

use serde_json::{json, Value};

use crate::support::check_record;

fn valid() -> Value {
    json!({
        "ts": "2025-01-02T03:04:05.678Z",
        "id": "01J0000000000000000000000",
        "identity": "default",
        "client": "127.0.0.1:50000",
        "method": "GET",
        "scheme": "https",
        "host": "api.test",
        "port": 443,
        "path": "/v1/x?token=REDACTED",
        "decision": "allow",
        "rule": "api",
        "reason": "allowed",
        "secrets": [],
        "redactions": 0,
        "status": 200,
        "upstream": "127.0.0.1:443",
        "bytes_up": 10,
        "bytes_down": 20,
        "duration_ms": 3,
        "policy": format!("sha256:{}", "ab".repeat(32)),
        "would_deny": false,
    })
}

#[test]
fn the_schema_check_accepts_a_complete_record() {
    check_record(&valid()).expect("a complete record");
    let mut offset = valid();
    offset["ts"] = json!("2025-01-02T03:04:05+02:00");
    check_record(&offset).expect("an RFC 3339 offset");
}

#[test]
fn the_schema_check_rejects_a_record_missing_any_field() {
    let fields: Vec<String> = valid()
        .as_object()
        .expect("object")
        .keys()
        .cloned()
        .collect();
    for field in fields {
        let mut record = valid();
        record.as_object_mut().expect("object").remove(&field);
        assert!(
            check_record(&record).is_err(),
            "a record without {field} passed"
        );
    }
}

#[test]
fn the_schema_check_rejects_wrong_values() {
    let cases = [
        ("ts", json!("yesterday")),
        ("client", json!("localhost")),
        ("scheme", json!("ftp")),
        ("port", json!("443")),
        ("path", json!("/v1/x?token=supersecret")),
        ("decision", json!("maybe")),
        ("reason", json!("because")),
        ("reason", json!("no_rule")), // with decision allow
        ("rule", json!(null)),        // with decision allow
        ("secrets", json!("openai")),
        ("secrets", json!([1])),
        ("redactions", json!(-1)),
        ("redactions", json!("3")),
        ("redactions", json!(1.5)),
        ("redactions", json!(null)),
        ("status", json!(42)),
        ("upstream", json!("somewhere")),
        ("original_dst", json!("somewhere")),
        ("original_dst", json!(null)),
        ("original_dst", json!(443)),
        ("bytes_down", json!(-1)),
        ("policy", json!("md5:abc")),
        ("would_deny", json!("false")),
        ("would_deny", json!(null)),
        ("would_deny", json!(true)), // with reason allowed
    ];
    for (field, value) in cases {
        let mut record = valid();
        record[field] = value.clone();
        assert!(
            check_record(&record).is_err(),
            "{field} = {value} passed the schema check"
        );
    }
}

#[test]
fn upstream_is_only_what_was_dialed_and_a_redirected_destination_has_its_own_field() {
    let mut redirected = valid();
    redirected["original_dst"] = json!("198.51.100.7:443");
    check_record(&redirected).expect("an allowed redirected request");
    // Refused before any dial: where the client was going is original_dst, never upstream.
    for reason in ["no_rule", "destination_mismatch", "no_sni", "not_tls"] {
        let mut refused = redirected.clone();
        refused["decision"] = json!("deny");
        refused["reason"] = json!(reason);
        refused["rule"] = Value::Null;
        refused["status"] = Value::Null;
        refused["upstream"] = Value::Null;
        check_record(&refused).expect("a refused redirected connection");
        refused["upstream"] = json!("198.51.100.7:443");
        assert!(
            check_record(&refused).is_err(),
            "a {reason} refusal naming an upstream passed"
        );
    }
}

#[test]
fn the_schema_check_allows_an_unknown_target_only_where_it_cannot_be_known() {
    let mut unparsed = valid();
    for field in [
        "method", "scheme", "host", "port", "path", "rule", "status", "upstream",
    ] {
        unparsed[field] = Value::Null;
    }
    unparsed["decision"] = json!("deny");
    unparsed["reason"] = json!("bad_request");
    check_record(&unparsed).expect("a malformed request has no known target");

    let mut connect = valid();
    connect["method"] = json!("CONNECT");
    connect["path"] = Value::Null;
    check_record(&connect).expect("a CONNECT has no path");

    for field in ["method", "scheme", "host", "port", "path"] {
        let mut record = valid();
        record[field] = Value::Null;
        assert!(
            check_record(&record).is_err(),
            "an allowed request with {field} = null passed"
        );
        record["decision"] = json!("deny");
        record["reason"] = json!("no_rule");
        assert!(
            check_record(&record).is_err(),
            "a no_rule denial with {field} = null passed"
        );
    }
}

#[test]
fn the_schema_check_knows_the_secret_reasons_and_their_decisions() {
    for (reason, decision) in [
        ("placeholder_not_bound", "deny"),
        ("secret_value_unbound", "deny"),
        ("secret_unavailable", "deny"),
        ("uninspectable_body", "allow"),
    ] {
        let mut record = valid();
        record["reason"] = json!(reason);
        record["decision"] = json!(decision);
        check_record(&record).unwrap_or_else(|e| panic!("{reason} with decision {decision}: {e}"));
        let other = if decision == "allow" { "deny" } else { "allow" };
        record["decision"] = json!(other);
        assert!(
            check_record(&record).is_err(),
            "{reason} with decision {other} passed"
        );
    }

    let mut redacted = valid();
    redacted["secrets"] = json!(["openai"]);
    redacted["redactions"] = json!(7);
    check_record(&redacted).expect("a record with injected secrets and redactions");
}

#[test]
fn the_schema_check_knows_identity_reasons_and_report_only_records() {
    for (reason, status) in [("proxy_auth_required", 407), ("identity_not_allowed", 403)] {
        let mut record = valid();
        record["reason"] = json!(reason);
        record["decision"] = json!("deny");
        record["status"] = json!(status);
        record["upstream"] = Value::Null;
        check_record(&record).unwrap_or_else(|e| panic!("{reason} denial: {e}"));
        record["decision"] = json!("allow");
        assert!(check_record(&record).is_err(), "{reason} with allow passed");
    }

    // Report-only: allowed, marked, and the reason is the denial it would have been.
    for reason in crate::support::audit::REPORTABLE {
        let mut record = valid();
        record["reason"] = json!(reason);
        record["would_deny"] = json!(true);
        check_record(&record).unwrap_or_else(|e| panic!("would_deny {reason}: {e}"));
        record["decision"] = json!("deny");
        assert!(
            check_record(&record).is_err(),
            "would_deny {reason} with decision deny passed"
        );
    }
    for reason in [
        "allowed",
        "non_public_address",
        "ambiguous_path",
        "placeholder_not_bound",
    ] {
        let mut record = valid();
        record["reason"] = json!(reason);
        record["would_deny"] = json!(true);
        assert!(
            check_record(&record).is_err(),
            "would_deny with reason {reason} passed"
        );
    }
}

/// A DNS query's record: what latchkey's resolver writes for an allowed A query.
fn valid_dns() -> Value {
    let mut r = valid();
    for field in ["scheme", "port", "path", "status", "upstream"] {
        r[field] = Value::Null;
    }
    r["method"] = json!("DNS");
    r["host"] = json!("api.test");
    r["dns"] = json!({"type": "A", "rcode": "NOERROR", "answer": ["10.0.0.1"],
                      "transport": "udp", "queries": 1});
    r
}

#[test]
fn the_schema_check_knows_dns_records_and_keeps_their_field_to_them() {
    check_record(&valid_dns()).expect("an allowed DNS query");
    let mut nx = valid_dns();
    nx["decision"] = json!("deny");
    nx["reason"] = json!("no_rule");
    nx["rule"] = Value::Null;
    nx["dns"] = json!({"type": "AAAA", "rcode": "NXDOMAIN", "answer": [],
                       "transport": "tcp", "queries": 1});
    check_record(&nx).expect("an NXDOMAIN");
    let mut flood = nx.clone();
    flood["reason"] = json!("dns_rate_limited");
    flood["host"] = Value::Null;
    flood["dns"] = json!({"type": null, "rcode": "REFUSED", "answer": [],
                          "transport": "udp", "queries": 250});
    check_record(&flood).expect("a rate-limit summary");
    let mut junk = flood.clone();
    junk["reason"] = json!("bad_request");
    junk["dns"] = json!({"type": null, "rcode": null, "answer": [], "transport": "udp",
                         "queries": 1});
    check_record(&junk).expect("a message that was not a query");

    let mut http = valid();
    http["dns"] = valid_dns()["dns"].clone();
    assert!(
        check_record(&http).is_err(),
        "an HTTP record with dns passed"
    );
    let mut no_dns = valid_dns();
    no_dns.as_object_mut().expect("object").remove("dns");
    assert!(
        check_record(&no_dns).is_err(),
        "a DNS record without dns passed"
    );

    let cases: [(Value, &str, Value); 12] = [
        (valid_dns(), "port", json!(53)),
        (valid_dns(), "scheme", json!("https")),
        (valid_dns(), "status", json!(200)),
        (valid_dns(), "host", Value::Null),
        (
            valid_dns(),
            "dns",
            json!({"type": "A", "rcode": "NXDOMAIN", "answer": [],
                                    "transport": "udp", "queries": 1}),
        ),
        (
            valid_dns(),
            "dns",
            json!({"type": "A", "rcode": "NOERROR", "answer": ["api.test"],
                                    "transport": "udp", "queries": 1}),
        ),
        (
            valid_dns(),
            "dns",
            json!({"type": "A", "rcode": "NOERROR", "answer": [],
                                    "transport": "quic", "queries": 1}),
        ),
        (
            valid_dns(),
            "dns",
            json!({"type": "A", "rcode": "NOERROR", "answer": [],
                                    "transport": "udp", "queries": 7}),
        ),
        (
            valid_dns(),
            "dns",
            json!({"type": null, "rcode": "NOERROR", "answer": [],
                                    "transport": "udp", "queries": 1}),
        ),
        (
            valid_dns(),
            "dns",
            json!({"type": "A", "rcode": "YES", "answer": [],
                                    "transport": "udp", "queries": 1}),
        ),
        (
            nx.clone(),
            "dns",
            json!({"type": "A", "rcode": "NXDOMAIN", "answer": ["10.0.0.1"],
                                   "transport": "udp", "queries": 1}),
        ),
        (
            flood.clone(),
            "dns",
            json!({"type": null, "rcode": "NOERROR", "answer": [],
                                      "transport": "udp", "queries": 3}),
        ),
    ];
    for (base, field, value) in cases {
        let mut record = base;
        record[field] = value.clone();
        assert!(
            check_record(&record).is_err(),
            "a DNS record with {field} = {value} passed: {record}"
        );
    }
}

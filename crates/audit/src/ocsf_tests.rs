//! The OCSF mapping, field by field: which class and activity each kind of record becomes, what
//! a decision record leaves unknown, and that every field of a record lands somewhere in its
//! event (validation against the published schema is in `tests/it/audit_export.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use serde_json::{json, Value};

use super::*;
use crate::{ApprovalInfo, DnsInfo, LimitCharge, UsageInfo};

/// An allowed, answered GET with every optional field filled.
fn full() -> Record {
    Record {
        phase: Phase::Outcome,
        ts: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
        id: "0123456789abcdef".into(),
        identity: "ci-agent".into(),
        client: "10.1.2.3:40000".into(),
        method: Some("GET".into()),
        scheme: Some("https".into()),
        host: Some("api.example.com".into()),
        port: Some(8443),
        path: Some("/v1/items?key=REDACTED&page=REDACTED".into()),
        decision: "allow",
        rule: Some("example-api".into()),
        reason: "allowed",
        secrets: vec!["example_token".into()],
        secret_sources: Default::default(),
        stale_secrets: Vec::new(),
        captured: Vec::new(),
        status: Some(200),
        upstream: Some("93.184.216.34:8443".into()),
        original_dst: Some("93.184.216.35:8443".into()),
        bytes_up: 120,
        bytes_down: 3400,
        duration_ms: 42,
        policy: "sha256:abc".into(),
        redactions: 1,
        would_deny: false,
        dns: None,
        approval: Some(ApprovalInfo {
            id: "ap-1".into(),
            state: "approved",
            scope: Some("1h".into()),
            ..ApprovalInfo::default()
        }),
        limits: vec![LimitCharge {
            limit: "per-agent".into(),
            measure: "requests",
            key: "identity:ci-agent".into(),
            charged: 1,
            used: 3,
            limit_value: 100,
            refused: false,
            unchecked: false,
        }],
        usage: Some(UsageInfo {
            provider: "openai",
            model: Some("gpt-4o".into()),
            input_tokens: 10,
            output_tokens: 5,
            cached_input_tokens: 0,
            cost: Some(0.001),
            source: "response",
        }),
        websocket: None,
        mcp: None,
        labels: BTreeMap::from([
            ("env".to_string(), "ci".to_string()),
            ("owner".to_string(), "team-a".to_string()),
        ]),
        reach: Some("sha256:reach".into()),
        session: Some("sess-1".into()),
        profile: None,
        step: Some("step-7".into()),
        attempt: Some(2),
        trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
        span_id: Some("00f067aa0ba902b7".into()),
        parent_span_id: Some("b7ad6b7169203331".into()),
    }
}

/// A refused CONNECT: no request, no rule matched.
fn refused_connect() -> Record {
    let mut r = full();
    r.method = Some("CONNECT".into());
    r.path = None;
    r.port = Some(443);
    r.decision = "deny";
    r.rule = None;
    r.reason = "no_rule";
    r.secrets = Vec::new();
    r.status = Some(403);
    r.upstream = None;
    r.original_dst = None;
    r.usage = None;
    r.approval = None;
    r.limits = Vec::new();
    r.trace_id = None;
    r.span_id = None;
    r.parent_span_id = None;
    r
}

fn event_of(r: &Record) -> Value {
    let mut out = Vec::new();
    write_event(r, &mut out).expect("serialise");
    let v: Value = serde_json::from_slice(&out).expect("one JSON object");
    assert!(v.is_object(), "{v:#}");
    v
}

#[test]
fn an_allowed_get_is_http_activity_get_with_its_request_response_and_traffic() {
    let e = event_of(&full());
    assert_eq!(e["class_uid"], 4002);
    assert_eq!(e["class_name"], "HTTP Activity");
    assert_eq!(e["category_uid"], 4);
    assert_eq!(
        (e["activity_id"].clone(), e["activity_name"].clone()),
        (json!(3), json!("Get"))
    );
    assert_eq!(e["type_uid"], 400203);
    assert_eq!(e["type_name"], "HTTP Activity: Get");
    assert_eq!(e["time"], 1_700_000_000_123u64);
    assert_eq!(e["start_time"], 1_700_000_000_123u64);
    assert_eq!(e["end_time"], 1_700_000_000_165u64);
    assert_eq!(e["duration"], 42);
    assert_eq!(
        e["http_request"],
        json!({
            "http_method": "GET",
            "url": {
                "scheme": "https",
                "hostname": "api.example.com",
                "port": 8443,
                "path": "/v1/items",
                "query_string": "key=REDACTED&page=REDACTED",
                "url_string": "https://api.example.com:8443/v1/items?key=REDACTED&page=REDACTED",
            }
        })
    );
    assert_eq!(e["http_response"], json!({"code": 200}));
    assert_eq!(e["src_endpoint"], json!({"ip": "10.1.2.3", "port": 40000}));
    assert_eq!(
        e["dst_endpoint"],
        json!({"hostname": "api.example.com", "ip": "93.184.216.34", "port": 8443})
    );
    assert_eq!(
        e["traffic"],
        json!({"bytes_in": 3400, "bytes_out": 120, "bytes": 3520})
    );
    assert_eq!(
        e["actor"],
        json!({"user": {"name": "ci-agent", "uid": "ci-agent"}, "session": {"uid": "sess-1"}})
    );
    assert_eq!(
        (
            &e["action_id"],
            &e["action"],
            &e["disposition_id"],
            &e["disposition"]
        ),
        (&json!(1), &json!("Allowed"), &json!(1), &json!("Allowed"))
    );
    assert_eq!(
        (&e["status_id"], &e["status"]),
        (&json!(1), &json!("Success"))
    );
    assert_eq!(e["status_code"], "allowed");
    assert_eq!(
        (&e["severity_id"], &e["severity"]),
        (&json!(1), &json!("Informational"))
    );
    assert_eq!(e["firewall_rule"], json!({"name": "example-api"}));
    assert_eq!(e["policy"]["uid"], "sha256:abc");
    assert_eq!(
        e["message"],
        "allow GET https://api.example.com:8443/v1/items?key=REDACTED&page=REDACTED (rule example-api)"
    );
    let m = &e["metadata"];
    assert_eq!(m["version"], OCSF_VERSION);
    assert_eq!(m["product"]["name"], "latchkey");
    assert_eq!(m["product"]["vendor_name"], "latchkey");
    assert_eq!(m["product"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(m["uid"], "0123456789abcdef");
    assert_eq!(m["correlation_uid"], "0123456789abcdef");
    assert_eq!(m["log_name"], "audit");
    assert_eq!(
        m["profiles"],
        json!(["host", "security_control", "trace", "network_proxy"])
    );
    assert_eq!(m["labels"], json!(["env=ci", "owner=team-a"]));
    assert_eq!(
        e["trace"],
        json!({
            "uid": "4bf92f3577b34da6a3ce929d0e0e4736",
            "span": {
                "uid": "00f067aa0ba902b7",
                "parent_uid": "b7ad6b7169203331",
                "operation": "GET api.example.com",
                "start_time": 1_700_000_000_123u64,
                "end_time": 1_700_000_000_165u64,
                "duration": 42,
            }
        })
    );
}

#[test]
fn the_decision_record_is_the_same_class_with_the_outcome_unknown_and_its_own_uid() {
    let mut r = full();
    r.phase = Phase::Decision;
    r.status = None;
    r.bytes_up = 0;
    r.bytes_down = 0;
    r.duration_ms = 0;
    let e = event_of(&r);
    assert_eq!(
        (e["class_uid"].clone(), e["activity_id"].clone()),
        (json!(4002), json!(3))
    );
    assert_eq!(
        (&e["status_id"], &e["status"]),
        (&json!(0), &json!("Unknown"))
    );
    for absent in [
        "http_response",
        "traffic",
        "start_time",
        "end_time",
        "duration",
    ] {
        assert!(e.get(absent).is_none(), "{absent} on a decision: {e:#}");
    }
    assert_eq!(e["action"], "Allowed");
    assert_eq!(e["unmapped"]["phase"], "decision");
    assert_eq!(e["metadata"]["uid"], "0123456789abcdef.decision");
    assert_eq!(e["metadata"]["correlation_uid"], "0123456789abcdef");
    // The trace is known; the span's end is not.
    assert_eq!(
        e["trace"],
        json!({"uid": "4bf92f3577b34da6a3ce929d0e0e4736"})
    );
    assert_eq!(event_of(&full())["unmapped"]["phase"], "outcome");
}

#[test]
fn a_refused_connect_is_network_activity_refuse_without_an_http_request() {
    let e = event_of(&refused_connect());
    assert_eq!(e["class_uid"], 4001);
    assert_eq!(e["class_name"], "Network Activity");
    assert_eq!(
        (&e["activity_id"], &e["activity_name"]),
        (&json!(5), &json!("Refuse"))
    );
    assert_eq!(e["type_uid"], 400105);
    assert_eq!(e["type_name"], "Network Activity: Refuse");
    for absent in ["http_request", "http_response", "trace", "firewall_rule"] {
        assert!(
            e.get(absent).is_none(),
            "{absent} on a refused CONNECT: {e:#}"
        );
    }
    assert_eq!(
        e["dst_endpoint"],
        json!({"hostname": "api.example.com", "port": 443})
    );
    assert_eq!(
        (&e["action"], &e["disposition_id"], &e["disposition"]),
        (&json!("Denied"), &json!(2), &json!("Blocked"))
    );
    assert_eq!(
        (&e["status_id"], &e["status"]),
        (&json!(2), &json!("Failure"))
    );
    assert_eq!(e["status_code"], "no_rule");
    assert_eq!(
        (&e["severity_id"], &e["severity"]),
        (&json!(2), &json!("Low"))
    );
    assert_eq!(e["message"], "deny CONNECT api.example.com: no_rule");
    assert_eq!(
        e["metadata"]["profiles"],
        json!(["host", "security_control"])
    );

    // A connection that never became a request (no method) is one too.
    let mut r = refused_connect();
    r.method = None;
    r.reason = "not_tls";
    let e = event_of(&r);
    assert_eq!(
        (e["class_uid"].clone(), e["activity_id"].clone()),
        (json!(4001), json!(5))
    );
    assert_eq!(e["message"], "deny connection api.example.com: not_tls");
}

#[test]
fn an_allowed_connect_is_http_activity_connect_with_its_authority() {
    let mut r = refused_connect();
    r.decision = "allow";
    r.reason = "tunnel";
    r.rule = Some("raw".into());
    r.status = None;
    r.upstream = Some("[2001:db8::1]:443".into());
    let e = event_of(&r);
    assert_eq!(
        (e["class_uid"].clone(), e["activity_id"].clone()),
        (json!(4002), json!(1))
    );
    assert_eq!(e["activity_name"], "Connect");
    assert_eq!(
        e["http_request"],
        json!({"http_method": "CONNECT", "url": {
            "scheme": "https", "hostname": "api.example.com", "port": 443,
            "url_string": "api.example.com:443"}})
    );
    assert!(e.get("http_response").is_none(), "{e:#}");
    assert_eq!(e["dst_endpoint"]["ip"], "2001:db8::1");
    assert_eq!(e["status"], "Success");
}

#[test]
fn an_unknown_method_is_activity_other_named_by_the_method() {
    for method in ["PROPFIND", "get", "APPROVAL"] {
        let mut r = full();
        r.method = Some(method.into());
        let e = event_of(&r);
        assert_eq!(
            (e["class_uid"].clone(), e["activity_id"].clone()),
            (json!(4002), json!(99))
        );
        assert_eq!(e["activity_name"], method);
        assert_eq!(e["type_uid"], 400299);
        assert_eq!(e["type_name"], "HTTP Activity: Other");
        // OCSF enumerates http_method: the method goes in unmapped instead.
        assert!(e["http_request"].get("http_method").is_none(), "{e:#}");
        assert_eq!(e["unmapped"]["method"], method);
    }
    assert!(event_of(&full())["unmapped"].get("method").is_none());
}

#[test]
fn each_method_has_its_activity() {
    let expected = [
        ("CONNECT", 1, "Connect"),
        ("DELETE", 2, "Delete"),
        ("GET", 3, "Get"),
        ("HEAD", 4, "Head"),
        ("OPTIONS", 5, "Options"),
        ("POST", 6, "Post"),
        ("PUT", 7, "Put"),
        ("TRACE", 8, "Trace"),
        ("PATCH", 9, "Patch"),
    ];
    for (method, id, name) in expected {
        let mut r = full();
        r.method = Some(method.into());
        let e = event_of(&r);
        assert_eq!(
            (e["activity_id"].clone(), e["activity_name"].clone()),
            (json!(id), json!(name))
        );
        assert_eq!(e["type_uid"], 400200 + id);
    }
}

#[test]
fn a_dns_query_is_dns_activity_with_its_query_answers_and_rcode() {
    let mut r = refused_connect();
    r.method = Some("DNS".into());
    r.decision = "allow";
    r.reason = "allowed";
    r.port = None;
    r.status = None;
    r.dns = Some(DnsInfo {
        qtype: Some("A".into()),
        rcode: Some("NOERROR"),
        answer: vec!["192.0.2.7".into(), "2001:db8::7".into()],
        transport: "udp",
        queries: 1,
    });
    let e = event_of(&r);
    assert_eq!(e["class_uid"], 4003);
    assert_eq!(e["class_name"], "DNS Activity");
    assert_eq!(
        (&e["activity_id"], &e["activity_name"]),
        (&json!(6), &json!("Traffic"))
    );
    assert_eq!(
        e["query"],
        json!({"hostname": "api.example.com", "type": "A"})
    );
    assert_eq!(
        e["answers"],
        json!([{"rdata": "192.0.2.7", "type": "A"}, {"rdata": "2001:db8::7", "type": "AAAA"}])
    );
    assert_eq!(
        (&e["rcode_id"], &e["rcode"]),
        (&json!(0), &json!("NoError"))
    );
    assert!(
        e.get("dst_endpoint").is_none() && e.get("http_request").is_none(),
        "{e:#}"
    );
    assert_eq!(e["unmapped"]["dns_transport"], "udp");

    r.dns = Some(DnsInfo {
        rcode: Some("REFUSED"),
        ..DnsInfo::new("tcp")
    });
    r.decision = "deny";
    r.reason = "dns_type_refused";
    let e = event_of(&r);
    assert_eq!(
        (&e["rcode_id"], &e["rcode"]),
        (&json!(5), &json!("Refused"))
    );
    assert_eq!(e["disposition"], "Blocked");
    r.dns = Some(DnsInfo::new("udp"));
    assert_eq!(event_of(&r)["activity_name"], "Query");
}

#[test]
fn report_only_traffic_is_allowed_but_detected_and_serious_denials_are_medium() {
    let mut r = full();
    r.would_deny = true;
    r.reason = "path_not_allowed";
    let e = event_of(&r);
    assert_eq!(
        (&e["action"], &e["disposition_id"], &e["disposition"]),
        (&json!("Allowed"), &json!(15), &json!("Detected"))
    );
    assert_eq!(e["severity"], "Low");
    assert_eq!(e["unmapped"]["would_deny"], true);

    let mut r = full();
    r.decision = "deny";
    r.reason = "secret_value_unbound";
    r.status = Some(403);
    let e = event_of(&r);
    assert_eq!(
        (&e["severity_id"], &e["severity"]),
        (&json!(3), &json!("Medium"))
    );
    assert_eq!(e["status"], "Failure");
    assert_eq!(e["http_response"]["code"], 403);
}

#[test]
fn an_upstream_failure_or_a_5xx_is_a_failure() {
    let mut r = full();
    r.reason = "upstream_unreachable";
    r.status = Some(502);
    assert_eq!(event_of(&r)["status"], "Failure");
    let mut r = full();
    r.status = Some(503);
    assert_eq!(event_of(&r)["status"], "Failure");
    r.status = Some(404);
    assert_eq!(event_of(&r)["status"], "Success");
}

#[test]
fn urls_use_default_ports_brackets_and_keep_a_path_without_a_host() {
    let mut r = full();
    r.port = Some(443);
    r.path = Some("/".into());
    assert_eq!(
        event_of(&r)["http_request"]["url"]["url_string"],
        "https://api.example.com/"
    );
    r.host = Some("2001:db8::5".into());
    r.port = Some(8080);
    r.scheme = Some("http".into());
    assert_eq!(
        event_of(&r)["http_request"]["url"]["url_string"],
        "http://[2001:db8::5]:8080/"
    );
    r.host = None;
    r.upstream = None;
    let e = event_of(&r);
    assert_eq!(
        e["http_request"]["url"],
        json!({"scheme": "http", "port": 8080, "path": "/"})
    );
    assert!(e.get("dst_endpoint").is_none(), "{e:#}");
    r.path = None;
    let e = event_of(&r);
    assert_eq!(e["http_request"], json!({"http_method": "GET"}));
    // A client that is not ip:port (a Unix socket, say) is named, not dropped.
    r.client = "unix:/run/x".into();
    assert_eq!(event_of(&r)["src_endpoint"], json!({"name": "unix:/run/x"}));
}

#[test]
fn a_refused_redirected_connection_names_where_it_went_apart_from_what_was_dialed() {
    // Refused: nothing dialed, so the destination has the name and port and no address; the
    // address the client sent it to is latchkey's own end of the connection, the proxy.
    let mut r = refused_connect();
    r.status = None;
    r.original_dst = Some("198.51.100.7:443".into());
    let e = event_of(&r);
    assert_eq!(
        e["dst_endpoint"],
        json!({"hostname": "api.example.com", "port": 443})
    );
    assert_eq!(
        e["proxy_endpoint"],
        json!({"name": "latchkey", "ip": "198.51.100.7", "port": 443})
    );
    assert_eq!(
        e["metadata"]["profiles"],
        json!(["host", "security_control", "network_proxy"])
    );
    // Allowed and dialed: the destination's address is the one dialed, the original stays apart.
    r.decision = "allow";
    r.reason = "tunnel";
    r.upstream = Some("192.0.2.10:443".into());
    let e = event_of(&r);
    assert_eq!(e["dst_endpoint"]["ip"], "192.0.2.10");
    assert_eq!(e["proxy_endpoint"]["ip"], "198.51.100.7");
    // No original destination (the proxy hop, SOCKS5, DNS-routed): no proxy endpoint.
    let e = event_of(&refused_connect());
    assert!(e.get("proxy_endpoint").is_none(), "{e:#}");
}

/// Where each field of the record is found in its event. A field added to [`Record`] without a
/// place here fails the test below: decide where it goes in OCSF first.
fn placed(key: &str, event: &Value) -> Option<Value> {
    let at = |p: &str| event.pointer(p).cloned();
    Some(match key {
        "id" => at("/metadata/correlation_uid")?,
        "identity" => at("/actor/user/name")?,
        "client" => {
            let s = at("/src_endpoint")?;
            json!(format!("{}:{}", s["ip"].as_str()?, s["port"]))
        }
        "method" => at("/http_request/http_method")?,
        "scheme" => at("/http_request/url/scheme")?,
        "host" => at("/http_request/url/hostname")?,
        "port" => at("/http_request/url/port")?,
        "path" => json!(format!(
            "{}?{}",
            at("/http_request/url/path")?.as_str()?,
            at("/http_request/url/query_string")?.as_str()?
        )),
        "status" => at("/http_response/code")?,
        "upstream" => {
            let d = at("/dst_endpoint")?;
            json!(format!("{}:{}", d["ip"].as_str()?, d["port"]))
        }
        "original_dst" => {
            let p = at("/proxy_endpoint")?;
            json!(format!("{}:{}", p["ip"].as_str()?, p["port"]))
        }
        "bytes_up" => at("/traffic/bytes_out")?,
        "bytes_down" => at("/traffic/bytes_in")?,
        "duration_ms" => at("/duration")?,
        "trace_id" => at("/trace/uid")?,
        "span_id" => at("/trace/span/uid")?,
        "parent_span_id" => at("/trace/span/parent_uid")?,
        // The rest has no OCSF attribute of its own (or not only one): under its own name.
        _ => at(&format!("/unmapped/{key}"))?,
    })
}

#[test]
fn every_field_of_the_record_is_in_its_event() {
    let r = full();
    let record = serde_json::to_value(&r).expect("record");
    let event = event_of(&r);
    let fields = record.as_object().expect("record object");
    assert!(
        fields.len() >= 30,
        "the full record fills every field: {record:#}"
    );
    for (key, value) in fields {
        match key.as_str() {
            // RFC 3339 in the record, epoch milliseconds in OCSF.
            "ts" => {
                assert_eq!(event["time"], json!(epoch_ms(r.ts)), "ts");
                continue;
            }
            "dns" => continue,
            _ => {}
        }
        let found = placed(key, &event)
            .unwrap_or_else(|| panic!("record field {key} is nowhere in the event: {event:#}"));
        assert_eq!(&found, value, "record field {key}");
    }
    // A DNS record's own fields: mapped or unmapped.
    let mut d = refused_connect();
    d.method = Some("DNS".into());
    d.dns = Some(DnsInfo {
        qtype: Some("TXT".into()),
        rcode: Some("NXDOMAIN"),
        answer: Vec::new(),
        transport: "tcp",
        queries: 3,
    });
    let e = event_of(&d);
    assert_eq!(e["query"]["type"], "TXT");
    assert_eq!(e["rcode"], "NXDomain");
    assert_eq!(e["unmapped"]["dns_transport"], "tcp");
    assert_eq!(e["unmapped"]["dns_queries"], 3);
}

#[test]
fn secret_names_are_in_the_event_and_nothing_else_about_them() {
    let e = event_of(&full());
    assert_eq!(e["unmapped"]["secrets"], json!(["example_token"]));
    let text = e.to_string();
    assert_eq!(text.matches("example_token").count(), 1, "{text}");
}

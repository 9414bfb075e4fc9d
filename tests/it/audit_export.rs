//! Export formats on real traffic: `--audit-format ocsf` lines validate against the published
//! OCSF schema (the schema export `ocsf-json-schema` ships, through `jsonschema`) and keep the
//! hash chain; `--otlp` sends one span per request to a collector on loopback, which decodes the
//! protobuf here: HTTP attributes, ids and parentage, GenAI attributes on a model call, and no
//! secret value anywhere.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::{span, status, Span};
use prost::Message;
use serde_json::{json, Value};

use crate::support::clients::connect_tunnel;
use crate::support::latchkey::{wait_with_timeout, SCRUBBED_ENV};
use crate::support::providers::{
    chat_body, limits_world, provider_rule, tracked_secrets, Call, OPENAI_HOST, SECRET_TOML,
};
use crate::support::secrets::assert_no_leak;
use crate::support::upstream::{full_body, handler, Received};
use crate::support::{curl, latchkey, run_cli, toolchain, Latchkey, TestCa, Upstream, PINNED};

/// The API key the policy injects: it must show up nowhere but at the upstream.
const API_KEY: &str = "sk-export-test-7d1f0c9a4be25863";

/// A sandbox's W3C `traceparent`: trace and parent span ids.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

fn policy(port: u16) -> String {
    format!(
        r#"
[secrets.api_key]
source = "env:TEST_EXPORT_KEY"

[[rules]]
name    = "api"
hosts   = ["api.test"]
ports   = [{port}]
methods = ["GET"]
paths   = ["/v1/**"]
[rules.inject.headers]
authorization = "Bearer {{{{secret.api_key}}}}"
"#
    )
}

fn secrets() -> Vec<(String, String)> {
    vec![("api key".to_string(), API_KEY.to_string())]
}

/// latchkey in front of an HTTPS echo upstream with [`policy`], plus `args`.
fn world(args: &[&str]) -> (Latchkey, Upstream, TestCa) {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let mut b = latchkey()
        .upstream_ca(&ca)
        .env("TEST_EXPORT_KEY", API_KEY)
        .policy("main.toml", &policy(upstream.port()));
    for host in PINNED {
        b = b.pin(host);
    }
    for a in args {
        b = b.arg(a);
    }
    (b.run(), upstream, ca)
}

/// The traffic both formats are checked on: an allowed GET (its query value redacted in the
/// record), a GET the rule's paths do not cover, and a CONNECT no rule allows.
fn drive(lk: &Latchkey, port: u16, extra: &[&str]) {
    let ok = curl(lk)
        .args(extra.iter().copied())
        .args([format!(
            "https://api.test:{port}/v1/items?token=q-value-5150"
        )])
        .run();
    assert_eq!(ok.ok().status, 200, "{ok:#?}");
    let denied = curl(lk)
        .args(extra.iter().copied())
        .args([format!("https://api.test:{port}/admin")])
        .run();
    assert_eq!(denied.ok().status, 403, "{denied:#?}");
    let (_tcp, refused) = connect_tunnel(lk.addr(), &format!("evil.test:{port}"));
    assert_eq!(refused.status, 403, "{refused:#?}");
}

// -------------------------------------------------------------------------------------------
// OCSF

/// Every whole line of an OCSF audit file, parsed, with the hash chain checked (`seq` one more
/// than the line before, `prev` the SHA-256 hex of the line before); checkpoints included.
fn ocsf_lines(text: &str) -> Vec<Value> {
    let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    let mut out = Vec::new();
    let mut prev: Option<(u64, String)> = None;
    for (i, line) in whole.lines().enumerate() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("line {} is not JSON ({e}): {line}", i + 1));
        let seq = v["seq"]
            .as_u64()
            .unwrap_or_else(|| panic!("line {} has no seq: {line}", i + 1));
        let link = v["prev"]
            .as_str()
            .unwrap_or_else(|| panic!("line {} has no prev: {line}", i + 1));
        match &prev {
            None => assert!(
                seq != 1 || link == "0".repeat(64),
                "seq 1 does not start at the genesis hash"
            ),
            Some((pseq, phash)) => {
                assert_eq!(seq, pseq + 1, "line {}: seq", i + 1);
                assert_eq!(
                    link,
                    phash,
                    "line {}: prev is not the hash of the line before",
                    i + 1
                );
            }
        }
        let hash = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, line.as_bytes());
        prev = Some((seq, hex(hash.as_ref())));
        out.push(v);
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Waits (10 s) until the OCSF log holds `n` events (checkpoints aside); returns them.
fn wait_events(lk: &Latchkey, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events: Vec<Value> = ocsf_lines(&lk.audit_text())
            .into_iter()
            .filter(|l| l.get("checkpoint").is_none())
            .collect();
        if events.len() >= n {
            return events;
        }
        assert!(
            Instant::now() < deadline,
            "expected {n} OCSF events, found {}: {events:#?}\nstderr:\n{}",
            events.len(),
            lk.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// `tests/clients/ocsf_validate.py FILE`: its exit code and report.
fn validate(file: &Path) -> (Option<i32>, Value) {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/ocsf_validate.py"
    );
    let mut cmd = Command::new(toolchain::python());
    cmd.arg(script).arg(file);
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(120));
    let report = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("ocsf_validate.py printed no JSON ({e}): {out:#?}"));
    (out.code(), report)
}

fn outcome(events: &[Value], pick: impl Fn(&Value) -> bool) -> &Value {
    let found: Vec<&Value> = events
        .iter()
        .filter(|e| e["unmapped"]["phase"] == "outcome" && pick(e))
        .collect();
    assert_eq!(found.len(), 1, "expected one such outcome: {events:#?}");
    found[0]
}

#[test]
fn ocsf_events_of_real_traffic_validate_against_the_published_schema_and_keep_the_chain() {
    let (mut lk, upstream, _ca) = world(&["--audit-format", "ocsf"]);
    let port = upstream.port();
    // With the sandbox's trace context, so that events carrying a trace (the `trace` profile)
    // are validated too once latchkey records it.
    let traceparent = format!("traceparent: 00-{TRACE_ID}-{PARENT_ID}-01");
    drive(&lk, port, &["-H", &traceparent]);
    let events = wait_events(&lk, 4);

    // The allowed GET: its decision, committed before the dial, then its outcome.
    let got = outcome(&events, |e| e["http_request"]["url"]["path"] == "/v1/items");
    assert_eq!(
        (&got["class_uid"], &got["activity_id"]),
        (&json!(4002), &json!(3))
    );
    assert_eq!(got["type_uid"], 400203);
    assert_eq!(
        got["http_request"]["url"],
        json!({
            "scheme": "https", "hostname": "api.test", "port": port, "path": "/v1/items",
            "query_string": "token=REDACTED",
            "url_string": format!("https://api.test:{port}/v1/items?token=REDACTED"),
        })
    );
    assert_eq!(got["http_response"], json!({"code": 200}));
    assert_eq!(got["dst_endpoint"]["ip"], "127.0.0.1");
    assert_eq!(got["dst_endpoint"]["port"], port);
    assert_eq!(got["src_endpoint"]["ip"], "127.0.0.1");
    assert_eq!(got["actor"]["user"]["name"], "default");
    assert_eq!(
        (&got["action"], &got["disposition"]),
        (&json!("Allowed"), &json!("Allowed"))
    );
    assert_eq!(got["status"], "Success");
    assert_eq!(got["firewall_rule"]["name"], "api");
    assert_eq!(got["unmapped"]["rule"], "api");
    assert_eq!(got["unmapped"]["secrets"], json!(["api_key"]));
    assert!(got["unmapped"]["policy"]
        .as_str()
        .is_some_and(|p| p.starts_with("sha256:")));
    assert!(
        got["traffic"]["bytes_in"].as_u64().is_some_and(|n| n > 0),
        "{got:#}"
    );
    assert!(
        got["time"].as_u64().is_some_and(|t| t > 1_600_000_000_000),
        "epoch ms: {got:#}"
    );
    assert_eq!(got["metadata"]["version"], "1.8.0");
    assert_eq!(got["metadata"]["product"]["name"], "latchkey");
    let id = got["metadata"]["correlation_uid"]
        .as_str()
        .expect("correlation uid");
    assert_eq!(got["metadata"]["uid"], id);
    let decisions: Vec<&Value> = events
        .iter()
        .filter(|e| e["unmapped"]["phase"] == "decision")
        .collect();
    assert_eq!(decisions.len(), 1, "{events:#?}");
    let d = decisions[0];
    assert_eq!(d["metadata"]["correlation_uid"], id);
    assert_eq!(d["metadata"]["uid"], format!("{id}.decision"));
    assert_eq!(
        (&d["class_uid"], &d["status"]),
        (&json!(4002), &json!("Unknown"))
    );
    assert!(d.get("http_response").is_none(), "{d:#}");
    let position = |e: &Value| events.iter().position(|x| x == e).expect("in the log");
    assert!(position(d) < position(got), "the decision comes first");

    // The GET no path covers: HTTP Activity, blocked.
    let denied = outcome(&events, |e| e["http_request"]["url"]["path"] == "/admin");
    assert_eq!(denied["class_uid"], 4002);
    assert_eq!(
        (
            &denied["action"],
            &denied["disposition"],
            &denied["status"],
            &denied["status_code"]
        ),
        (
            &json!("Denied"),
            &json!("Blocked"),
            &json!("Failure"),
            &json!("path_not_allowed")
        )
    );
    assert_eq!(denied["http_response"]["code"], 403);
    assert!(
        denied
            .get("dst_endpoint")
            .and_then(|d| d.get("ip"))
            .is_none(),
        "never dialed"
    );

    // The refused CONNECT: Network Activity, Refuse.
    let refused = outcome(&events, |e| e["dst_endpoint"]["hostname"] == "evil.test");
    assert_eq!(
        (
            &refused["class_uid"],
            &refused["activity_id"],
            &refused["type_uid"]
        ),
        (&json!(4001), &json!(5), &json!(400105))
    );
    assert_eq!(refused["activity_name"], "Refuse");
    assert!(refused.get("http_request").is_none(), "{refused:#}");
    assert_eq!(refused["unmapped"]["reason"], "no_rule");

    // A clean stop writes the last checkpoint; then the whole file is checked.
    lk.signal("TERM");
    assert!(
        lk.wait_exit(Duration::from_secs(15)).is_some(),
        "latchkey did not stop"
    );
    let audit = lk.scratch().join("audit.jsonl");
    let text = std::fs::read_to_string(&audit).expect("audit file");
    assert_no_leak("the OCSF audit log", text.as_bytes(), &secrets());
    assert!(
        !text.contains("q-value-5150"),
        "a query value in the OCSF log"
    );
    let lines = ocsf_lines(&text);
    assert!(
        lines.iter().any(|l| l.get("checkpoint").is_some()),
        "no checkpoint"
    );
    let (code, report) = validate(&audit);
    assert_eq!(code, Some(0), "OCSF validation failed: {report:#}");
    assert_eq!(report["version"], "1.8.0");
    assert_eq!(
        report["events"],
        lines.len()
            - lines
                .iter()
                .filter(|l| l.get("checkpoint").is_some())
                .count()
    );
    assert!(
        report["classes"]["4002"].as_u64().is_some_and(|n| n >= 3),
        "{report:#}"
    );
    assert!(
        report["classes"]["4001"].as_u64().is_some_and(|n| n >= 1),
        "{report:#}"
    );
    // `audit verify` reads an OCSF log like a JSON-lines one: the chain and the signatures.
    let ca_dir = lk.ca_dir();
    let verified = run_cli([
        OsStr::new("audit"),
        OsStr::new("verify"),
        audit.as_os_str(),
        OsStr::new("--ca-dir"),
        ca_dir.as_os_str(),
    ]);
    assert_eq!(verified.code(), Some(0), "audit verify: {verified:#?}");
}

/// `dig @ADDR -p PORT +tries=1 +time=3 ARGS...`: the status it printed.
fn dig(addr: std::net::SocketAddr, args: &[&str]) -> String {
    let mut cmd = Command::new(toolchain::tool("dig"));
    cmd.arg(format!("@{}", addr.ip()))
        .arg("-p")
        .arg(addr.port().to_string())
        .args(["+tries=1", "+time=3", "+noall", "+comments"])
        .args(args);
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(60));
    out.stdout
        .lines()
        .find_map(|l| l.split("status: ").nth(1))
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("dig {args:?} printed no status: {out:#?}"))
        .to_string()
}

#[test]
fn ocsf_dns_queries_to_latchkeys_resolver_are_valid_dns_activity() {
    let lk = latchkey()
        .policy(
            "main.toml",
            "[[rules]]\nname = \"up\"\nhosts = [\"up.test\"]\n",
        )
        .arg("--dns")
        .arg("127.0.0.1:0")
        .arg("--dns-self")
        .arg("192.0.2.53")
        .arg("--audit-format")
        .arg("ocsf")
        .run();
    const LINE: &str = "latchkey: dns listening on ";
    assert!(
        lk.wait_stderr_contains(LINE, Duration::from_secs(5)),
        "{}",
        lk.stderr_text()
    );
    let addr = lk
        .stderr_text()
        .lines()
        .find_map(|l| l.trim_end().strip_prefix(LINE).and_then(|a| a.parse().ok()))
        .expect("dns address");
    assert_eq!(dig(addr, &["A", "up.test"]), "NOERROR");
    assert_eq!(dig(addr, &["A", "nowhere.test"]), "NXDOMAIN");
    assert_eq!(dig(addr, &["TXT", "up.test"]), "REFUSED");
    let events = wait_events(&lk, 3);
    let query = |name: &str, qtype: &str| {
        events
            .iter()
            .find(|e| e["query"]["hostname"] == name && e["query"]["type"] == qtype)
            .unwrap_or_else(|| panic!("no event for {qtype} {name}: {events:#?}"))
    };
    let up = query("up.test", "A");
    assert_eq!(
        (&up["class_uid"], &up["activity_id"]),
        (&json!(4003), &json!(6))
    );
    assert_eq!(up["answers"], json!([{"rdata": "192.0.2.53", "type": "A"}]));
    assert_eq!(
        (&up["rcode_id"], &up["rcode"]),
        (&json!(0), &json!("NoError"))
    );
    assert_eq!(up["action"], "Allowed");
    let nx = query("nowhere.test", "A");
    assert_eq!(
        (&nx["rcode_id"], &nx["rcode"]),
        (&json!(3), &json!("NXDomain"))
    );
    let txt = query("up.test", "TXT");
    assert_eq!(
        (&txt["rcode"], &txt["disposition"]),
        (&json!("Refused"), &json!("Blocked"))
    );
    assert_eq!(txt["unmapped"]["reason"], "dns_type_refused");
    let (code, report) = validate(&lk.scratch().join("audit.jsonl"));
    assert_eq!(code, Some(0), "OCSF validation failed: {report:#}");
    assert!(
        report["classes"]["4003"].as_u64().is_some_and(|n| n >= 3),
        "{report:#}"
    );
}

/// A request record of every shape latchkey writes — decision and outcome, every field filled
/// (trace, labels, usage, limits, approval, session), report-only, an unknown method, an
/// approval's answer, an allowed tunnel to an IPv6 upstream, a refused CONNECT, redirected
/// connections refused and allowed, a connection that never became a request, a request too
/// broken to have a target, DNS answered and unanswered —
/// written by the audit log itself in OCSF, and every event valid.
#[test]
fn every_kind_of_record_the_log_writes_is_a_valid_ocsf_event() {
    use ::latchkey::audit::{
        ApprovalInfo, AuditLog, DnsInfo, Format, LimitCharge, Options, Phase, Record, UsageInfo,
    };
    let full = Record {
        phase: Phase::Outcome,
        ts: std::time::SystemTime::now(),
        id: "0123456789abcdef".into(),
        identity: "ci-agent".into(),
        client: "10.1.2.3:40000".into(),
        method: Some("POST".into()),
        scheme: Some("https".into()),
        host: Some("api.openai.com".into()),
        port: Some(443),
        path: Some("/v1/chat/completions?key=REDACTED".into()),
        decision: "allow",
        rule: Some("openai".into()),
        reason: "allowed",
        secrets: vec!["openai".into()],
        secret_sources: Default::default(),
        stale_secrets: Vec::new(),
        captured: Vec::new(),
        status: Some(200),
        upstream: Some("192.0.2.10:443".into()),
        original_dst: None,
        bytes_up: 100,
        bytes_down: 2000,
        duration_ms: 250,
        policy: format!("sha256:{}", "ab".repeat(32)),
        redactions: 2,
        would_deny: false,
        dns: None,
        approval: Some(ApprovalInfo {
            id: "ap-1".into(),
            state: "approved",
            scope: Some("1h".into()),
            waited_ms: Some(1200),
            ..ApprovalInfo::default()
        }),
        limits: vec![LimitCharge {
            limit: "tokens".into(),
            measure: "llm_tokens",
            key: "identity:ci-agent".into(),
            charged: 120,
            used: 900,
            limit_value: 10_000,
            refused: false,
            unchecked: false,
        }],
        usage: Some(UsageInfo {
            provider: "openai",
            model: Some("gpt-4o".into()),
            input_tokens: 100,
            output_tokens: 20,
            cached_input_tokens: 10,
            cost: Some(0.002),
            source: "response",
        }),
        websocket: None,
        mcp: None,
        labels: [("env", "ci"), ("sandbox", "run-42")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        reach: Some(format!("sha256:{}", "cd".repeat(32))),
        session: Some("sess-1".into()),
        profile: None,
        step: Some("step-3".into()),
        attempt: Some(2),
        trace_id: Some(TRACE_ID.into()),
        span_id: Some("b7ad6b7169203331".into()),
        parent_span_id: Some(PARENT_ID.into()),
    };
    let with = |f: &dyn Fn(&mut Record)| {
        let mut r = full.clone();
        f(&mut r);
        r
    };
    let records = vec![
        with(&|r| {
            r.phase = Phase::Decision;
            r.status = None;
            r.duration_ms = 0;
        }),
        full.clone(),
        with(&|r| {
            r.would_deny = true;
            r.reason = "path_not_allowed";
        }),
        with(&|r| r.method = Some("PROPFIND".into())),
        with(&|r| {
            r.method = Some("APPROVAL".into());
            r.decision = "deny";
            r.reason = "approval_denied";
            r.status = None;
            r.upstream = None;
        }),
        with(&|r| {
            r.method = Some("CONNECT".into());
            r.path = None;
            r.reason = "tunnel";
            r.status = None;
            r.upstream = Some("[2001:db8::1]:443".into());
            r.host = Some("2001:db8::1".into());
        }),
        with(&|r| {
            r.method = Some("CONNECT".into());
            r.path = None;
            r.decision = "deny";
            r.reason = "no_rule";
            r.rule = None;
            r.status = Some(403);
            r.upstream = None;
        }),
        // A redirected connection refused (nothing dialed) and one allowed (IPv6).
        with(&|r| {
            r.method = Some("CONNECT".into());
            r.path = None;
            r.decision = "deny";
            r.reason = "destination_mismatch";
            r.rule = None;
            r.status = None;
            r.upstream = None;
            r.original_dst = Some("198.51.100.7:443".into());
        }),
        with(&|r| {
            r.upstream = Some("[2001:db8::1]:443".into());
            r.original_dst = Some("[2001:db8::1]:443".into());
        }),
        with(&|r| {
            r.method = None;
            r.path = None;
            r.decision = "deny";
            r.reason = "not_tls";
            r.status = None;
            r.upstream = None;
        }),
        with(&|r| {
            r.method = None;
            r.scheme = None;
            r.host = None;
            r.port = None;
            r.path = None;
            r.decision = "deny";
            r.reason = "bad_request";
            r.rule = None;
            r.status = Some(400);
            r.upstream = None;
            r.client = "unix:/run/sandbox.sock".into();
        }),
        with(&|r| {
            r.method = Some("GET".into());
            r.decision = "deny";
            r.reason = "secret_value_unbound";
            r.status = Some(403);
            r.upstream = None;
        }),
        with(&|r| {
            r.method = Some("DNS".into());
            r.scheme = None;
            r.port = None;
            r.path = None;
            r.status = None;
            r.upstream = None;
            r.dns = Some(DnsInfo {
                qtype: Some("AAAA".into()),
                rcode: Some("NOERROR"),
                answer: vec!["2001:db8::53".into()],
                transport: "tcp",
                queries: 1,
            });
        }),
        with(&|r| {
            r.method = Some("DNS".into());
            r.decision = "deny";
            r.reason = "bad_request";
            r.path = None;
            r.dns = Some(DnsInfo::new("udp"));
        }),
    ];
    let n = records.len();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("audit.jsonl");
    let log = AuditLog::open_with(
        &file,
        Options {
            format: Format::Ocsf,
            ..Options::default()
        },
    )
    .expect("audit log");
    for r in records {
        log.write(r);
    }
    assert!(log.flush(Duration::from_secs(10)));
    assert_eq!(log.written(), n as u64, "every record serialised");
    drop(log);
    let text = std::fs::read_to_string(&file).expect("audit file");
    assert_eq!(ocsf_lines(&text).len(), n);
    let (code, report) = validate(&file);
    assert_eq!(code, Some(0), "OCSF validation failed: {report:#}");
    assert_eq!(report["events"], n);
    for class in ["4001", "4002", "4003"] {
        assert!(
            report["classes"][class].is_u64(),
            "no {class} event: {report:#}"
        );
    }
}

/// The validator is only worth something if it fails: one event broken at a time, each is
/// reported with its line.
#[test]
fn the_ocsf_validation_fails_on_a_wrong_class_a_missing_attribute_or_a_wrong_value() {
    let (lk, upstream, _ca) = world(&["--audit-format", "ocsf"]);
    drive(&lk, upstream.port(), &[]);
    let events = wait_events(&lk, 4);
    let good = outcome(&events, |e| e["http_request"]["url"]["path"] == "/v1/items").clone();
    let dir = tempfile::tempdir().expect("temp dir");
    let check = |name: &str, broken: Value| -> String {
        let file = dir.path().join(format!("{name}.jsonl"));
        let lines = format!("{good}\n{broken}\n");
        std::fs::write(&file, lines).expect("write");
        let (code, report) = validate(&file);
        assert_eq!(code, Some(1), "{name}: a broken event passed: {report:#}");
        let errors = report["errors"].as_array().expect("errors");
        assert_eq!(errors.len(), 1, "{name}: only the broken line: {report:#}");
        assert_eq!(errors[0]["line"], 2, "{report:#}");
        errors[0]["errors"].to_string()
    };
    let mut wrong_class = good.clone();
    wrong_class["class_uid"] = json!(4001);
    let why = check("wrong-class", wrong_class);
    assert!(
        why.contains("http_request"),
        "Network Activity has no http_request: {why}"
    );

    let mut no_time = good.clone();
    no_time.as_object_mut().expect("object").remove("time");
    let why = check("no-time", no_time);
    assert!(why.contains("'time' is a required property"), "{why}");

    let mut no_product = good.clone();
    no_product["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("product");
    let why = check("no-product", no_product);
    assert!(why.contains("'product' is a required property"), "{why}");

    let mut bad_activity = good.clone();
    bad_activity["activity_id"] = json!(42);
    let why = check("bad-activity", bad_activity);
    assert!(why.contains("42"), "{why}");

    let mut bad_type = good.clone();
    bad_type["type_uid"] = json!(400206);
    let why = check("bad-type-uid", bad_type);
    assert!(why.contains("type_uid"), "{why}");

    let mut bad_port = good.clone();
    bad_port["http_request"]["url"]["port"] = json!("443");
    let why = check("bad-port", bad_port);
    assert!(why.contains("is not of type 'integer'"), "{why}");

    let mut bad_caption = good.clone();
    bad_caption["disposition"] = json!("Blocked");
    let why = check("bad-caption", bad_caption);
    assert!(why.contains("disposition"), "{why}");
}

// -------------------------------------------------------------------------------------------
// OTLP

/// A collector on loopback (plain HTTP): every request it received, and the spans in them.
fn collector() -> Upstream {
    Upstream::http_with(handler(|_req: Received| async {
        http::Response::new(full_body(Vec::new()))
    }))
}

/// Waits (15 s) for `n` spans; returns them with the raw request bodies they came in.
fn wait_spans(collector: &Upstream, lk: &Latchkey, n: usize) -> (Vec<Span>, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let received = collector.received();
        let mut spans = Vec::new();
        let mut raw = Vec::new();
        for r in &received {
            assert_eq!(
                (r.method.as_str(), r.path.as_str()),
                ("POST", "/v1/traces"),
                "{r:#?}"
            );
            assert_eq!(r.header("content-type"), Some("application/x-protobuf"));
            let req = ExportTraceServiceRequest::decode(r.body.as_slice())
                .unwrap_or_else(|e| panic!("not an OTLP export request ({e}): {r:#?}"));
            for rs in &req.resource_spans {
                let service = rs
                    .resource
                    .as_ref()
                    .and_then(|res| res.attributes.iter().find(|kv| kv.key == "service.name"))
                    .and_then(|kv| kv.value.as_ref())
                    .and_then(|v| v.value.clone());
                assert_eq!(
                    service,
                    Some(any_value::Value::StringValue("latchkey".into()))
                );
                for ss in &rs.scope_spans {
                    spans.extend(ss.spans.iter().cloned());
                }
            }
            raw.extend_from_slice(&r.body);
        }
        if spans.len() >= n {
            return (spans, raw);
        }
        assert!(
            Instant::now() < deadline,
            "expected {n} spans, got {}: {spans:#?}\nstderr:\n{}",
            spans.len(),
            lk.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a any_value::Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn text<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key) {
        Some(any_value::Value::StringValue(s)) => Some(s),
        _ => None,
    }
}

fn number(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key) {
        Some(any_value::Value::IntValue(n)) => Some(*n),
        _ => None,
    }
}

/// Every attribute of every span as text, for leak checks that do not depend on the encoding.
fn attribute_text(spans: &[Span]) -> String {
    format!("{spans:?}")
}

#[test]
fn otlp_spans_of_real_requests_carry_http_attributes_ids_and_parentage() {
    let collector = collector();
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    // Guarded: nothing opens loopback but the rule (for the upstream) and --otlp itself (for
    // the collector, which must not need --allow-private).
    let mut b = latchkey()
        .guarded()
        .upstream_ca(&ca)
        .env("TEST_EXPORT_KEY", API_KEY)
        .policy(
            "main.toml",
            &policy(port).replace(
                "paths   = [\"/v1/**\"]",
                "paths   = [\"/v1/**\"]\nallow_private = [\"127.0.0.1/32\"]",
            ),
        )
        .arg("--otlp")
        .arg(&format!("http://127.0.0.1:{}", collector.port()));
    for host in PINNED {
        b = b.pin(host);
    }
    let lk = b.run();
    let traceparent = format!("traceparent: 00-{TRACE_ID}-{PARENT_ID}-01");
    drive(&lk, port, &["-H", &traceparent]);
    let (spans, raw) = wait_spans(&collector, &lk, 3);
    let records = lk.wait_audit(3);
    assert_eq!(spans.len(), 3, "one span per request: {spans:#?}");
    // The allowed GET also has its decision record; spans come from outcomes only.
    let decisions = lk.decision_records();
    assert_eq!(decisions.len(), 1, "{decisions:#?}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        wait_spans(&collector, &lk, 3).0.len(),
        3,
        "no span of a decision record"
    );

    for s in &spans {
        let id = text(s, "latchkey.audit.id").expect("latchkey.audit.id");
        let record = records
            .iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("span of no record {id}: {records:#?}"));
        assert_eq!(s.kind, span::SpanKind::Client as i32, "{s:#?}");
        assert_eq!(text(s, "latchkey.decision"), record["decision"].as_str());
        assert_eq!(text(s, "latchkey.reason"), record["reason"].as_str());
        assert_eq!(text(s, "latchkey.identity"), Some("default"));
        assert_eq!(text(s, "client.address"), Some("127.0.0.1"));
        assert_eq!(text(s, "server.address"), record["host"].as_str());
        assert_eq!(number(s, "server.port"), Some(i64::from(port)));
        let duration = s.end_time_unix_nano - s.start_time_unix_nano;
        assert_eq!(
            duration,
            record["duration_ms"].as_u64().expect("duration") * 1_000_000,
            "{s:#?}"
        );
        // Parentage: the record's trace, when it holds one (the sandbox's traceparent), else a
        // trace of latchkey's own with no parent.
        match record["trace_id"].as_str() {
            Some(trace) => {
                assert_eq!(hex(&s.trace_id), trace, "{s:#?}");
                assert_eq!(Some(hex(&s.span_id).as_str()), record["span_id"].as_str());
                // No parent when latchkey started the trace itself (no traceparent sent).
                assert_eq!(
                    hex(&s.parent_span_id).as_str(),
                    record["parent_span_id"].as_str().unwrap_or_default()
                );
                if record["method"] == "GET" {
                    assert_eq!(trace, TRACE_ID, "the sandbox's trace");
                    assert_eq!(record["parent_span_id"], PARENT_ID);
                }
            }
            None => {
                assert_eq!((s.trace_id.len(), s.span_id.len()), (16, 8));
                assert!(s.trace_id.iter().any(|b| *b != 0), "{s:#?}");
                assert!(s.parent_span_id.is_empty(), "{s:#?}");
            }
        }
    }
    let by_path = |path: &str| {
        spans
            .iter()
            .find(|s| text(s, "url.full").is_some_and(|u| u.contains(path)))
            .unwrap_or_else(|| panic!("no span for {path}: {spans:#?}"))
    };
    let ok = by_path("/v1/items");
    assert_eq!(ok.name, "GET api.test");
    assert_eq!(text(ok, "http.request.method"), Some("GET"));
    assert_eq!(
        text(ok, "url.full"),
        Some(format!("https://api.test:{port}/v1/items?token=REDACTED").as_str())
    );
    assert_eq!(text(ok, "url.scheme"), Some("https"));
    assert_eq!(number(ok, "http.response.status_code"), Some(200));
    assert_eq!(text(ok, "latchkey.rule"), Some("api"));
    assert_eq!(text(ok, "network.peer.address"), Some("127.0.0.1"));
    match attr(ok, "latchkey.secrets") {
        Some(any_value::Value::ArrayValue(a)) => {
            let names: Vec<_> = a.values.iter().map(|v| v.value.clone()).collect();
            assert_eq!(
                names,
                vec![Some(any_value::Value::StringValue("api_key".into()))]
            );
        }
        other => panic!("latchkey.secrets: {other:?}"),
    }
    let ok_status = ok.status.clone().unwrap_or_default();
    assert_eq!(ok_status.code, status::StatusCode::Unset as i32);

    let denied = by_path("/admin");
    let st = denied.status.clone().unwrap_or_default();
    assert_eq!(
        (st.code, st.message.as_str()),
        (status::StatusCode::Error as i32, "path_not_allowed")
    );
    assert_eq!(number(denied, "http.response.status_code"), Some(403));
    assert_eq!(text(denied, "error.type"), Some("path_not_allowed"));

    let refused = spans
        .iter()
        .find(|s| s.name == "CONNECT evil.test")
        .unwrap_or_else(|| panic!("no span for the refused CONNECT: {spans:#?}"));
    assert_eq!(text(refused, "latchkey.reason"), Some("no_rule"));
    assert_eq!(
        refused.status.clone().unwrap_or_default().code,
        status::StatusCode::Error as i32
    );

    // No secret value, no query value, in any span, however encoded.
    assert_no_leak("the OTLP export", &raw, &secrets());
    assert_no_leak(
        "the spans' attributes",
        attribute_text(&spans).as_bytes(),
        &secrets(),
    );
    assert!(
        !attribute_text(&spans).contains("q-value-5150"),
        "a query value in a span"
    );
    // The collector was reached although no --allow-private opens loopback.
    assert!(
        !lk.stderr_text().contains("cannot export spans"),
        "{}",
        lk.stderr_text()
    );
}

#[test]
fn a_model_provider_call_has_genai_attributes_and_no_secret_in_its_span() {
    let collector = collector();
    let otlp = format!("http://127.0.0.1:{}", collector.port());
    let w = limits_world(
        // A token meter on the rule is what makes latchkey read the response's usage.
        &format!(
            "{SECRET_TOML}[limits.meter]\nllm_tokens = \"10M/day\"\n{}",
            provider_rule("openai", OPENAI_HOST, "\"meter\"")
        ),
        |b| b.arg("--otlp").arg(&otlp),
    );
    let resp = w.run(
        &Call::post(
            &w.url(OPENAI_HOST, "/v1/chat/completions"),
            &chat_body("gpt-4o", false, Some(50)),
        )
        .header("x-fake-input-tokens", "30")
        .header("x-fake-output-tokens", "20"),
    );
    assert_eq!(resp.status, 200, "{resp:#?}");
    let (spans, raw) = wait_spans(&collector, &w.lk, 1);
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let s = &spans[0];
    assert_eq!(s.name, format!("POST {OPENAI_HOST}"));
    assert_eq!(text(s, "gen_ai.system"), Some("openai"));
    assert_eq!(text(s, "gen_ai.provider.name"), Some("openai"));
    assert_eq!(text(s, "gen_ai.request.model"), Some("gpt-4o"));
    assert_eq!(number(s, "gen_ai.usage.input_tokens"), Some(30));
    assert_eq!(number(s, "gen_ai.usage.output_tokens"), Some(20));
    assert_eq!(text(s, "latchkey.rule"), Some("openai"));
    let record = &w.lk.wait_audit(1)[0];
    assert_eq!(text(s, "latchkey.audit.id"), record["id"].as_str());
    assert_eq!(record["usage"]["model"], "gpt-4o");
    assert_no_leak("the OTLP export", &raw, &tracked_secrets());
    assert_no_leak(
        "the span's attributes",
        attribute_text(&spans).as_bytes(),
        &tracked_secrets(),
    );
    w.sweep();
}

#[test]
fn a_collector_that_is_down_costs_no_request_and_no_record() {
    // Nothing listens at the collector's address: requests and their records go on.
    let unused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let otlp = format!("http://{}", unused.local_addr().expect("addr"));
    drop(unused);
    let (lk, upstream, _ca) = world(&["--otlp", &otlp]);
    let started = Instant::now();
    for _ in 0..5 {
        let r = curl(&lk)
            .args([format!("https://api.test:{}/v1/x", upstream.port())])
            .run();
        assert_eq!(r.ok().status, 200);
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "requests waited for the collector"
    );
    assert_eq!(lk.wait_audit(5).len(), 5);
    let body = lk.wait_stderr_contains("cannot export spans over OTLP", Duration::from_secs(20));
    assert!(body, "the failure is said: {}", lk.stderr_text());
}

/// `--otlp` with a bad URL refuses to start, saying why.
#[test]
fn a_bad_otlp_url_refuses_to_start() {
    let out = latchkey()
        .policy("main.toml", &policy(1))
        .env("TEST_EXPORT_KEY", API_KEY)
        .arg("--otlp")
        .arg("ftp://user:pw@collector.test/")
        .run_expecting_failure();
    assert_ne!(out.code(), Some(0));
    assert!(out.stderr.contains("--otlp"), "{}", out.stderr);
    assert!(out.stderr.contains("http or https"), "{}", out.stderr);
    assert!(
        !out.stderr.contains("pw"),
        "credentials echoed: {}",
        out.stderr
    );
}

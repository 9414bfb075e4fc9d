//! The ceiling in every record (book "Audit"): the identity's labels from policy, the `reach`
//! digest of what it could reach (equal to what `latchkey explain --reach` prints, changed only
//! by a change to that identity's reach), and correlation the sandbox sends: session, step and
//! attempt (a retried step is attempt 2 of the same step), W3C trace context with latchkey's own
//! span, propagated upstream under `--otlp`. The correlation headers never reach the upstream
//! unless a rule keeps them, and a secret pasted into one never reaches the record.

use std::collections::HashSet;

use serde_json::{json, Value};

use crate::support::admin::{digest, wait_digest_change};
use crate::support::clients::CurlOutput;
use crate::support::secrets::{assert_no_leak, OPENAI};
use crate::support::upstream::Received;
use crate::support::{curl, latchkey, run_cli, Latchkey, TestCa, Upstream, PINNED};

const TOKEN_CI: &str = "tok-ci-5e1d9a7c3b2f8046aa";
const TOKEN_TWIN: &str = "tok-twin-8b3f1c6e9a2d7405bb";
const TOKEN_LAB: &str = "tok-lab-4c7a2e9f1b6d3085cc";

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TP_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const TP_PARENT: &str = "00f067aa0ba902b7";

const CORRELATION: [&str; 4] = [
    "x-latchkey-session",
    "x-latchkey-step",
    "traceparent",
    "tracestate",
];

/// `api` (GET, the openai secret injected) and `kept` (keeps the correlation headers) for `ci`
/// and `twin`, `kept` alone for `lab`; `ci_extra` adds rules to ci's list.
fn policy(port: u16, ci_extra: &str) -> String {
    format!(
        r#"
[secrets.openai]
source = "env:TEST_OPENAI_KEY"

[[rules]]
name    = "api"
hosts   = ["api.test"]
ports   = [{port}]
methods = ["GET"]
[rules.inject.headers]
authorization = "Bearer {{{{secret.openai}}}}"

[[rules]]
name  = "kept"
hosts = ["other.test"]
ports = [{port}]
keep_headers = ["x-latchkey-session", "x-latchkey-step", "traceparent", "tracestate"]

[[rules]]
name    = "wide"
hosts   = ["a.wild.test"]
ports   = [{port}]

[identities.ci]
token  = "env:LK_TOKEN_CI"
rules  = ["api", "kept"{ci_extra}]
labels = {{ sandbox = "run-42", owner = "ana", env = "ci" }}

[identities.twin]
token = "env:LK_TOKEN_TWIN"
rules = ["kept", "api"]

[identities.lab]
token = "env:LK_TOKEN_LAB"
rules = ["kept"]
"#
    )
}

struct World {
    lk: Latchkey,
    upstream: Upstream,
    _ca: TestCa,
}

fn world(args: &[&str]) -> World {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let mut builder = latchkey()
        .upstream_ca(&ca)
        .env("LK_TOKEN_CI", TOKEN_CI)
        .env("LK_TOKEN_TWIN", TOKEN_TWIN)
        .env("LK_TOKEN_LAB", TOKEN_LAB)
        .env("TEST_OPENAI_KEY", OPENAI)
        .policy("main.toml", &policy(upstream.port(), ""));
    for arg in args {
        builder = builder.arg(arg);
    }
    for host in PINNED {
        builder = builder.pin(host);
    }
    World {
        lk: builder.run(),
        upstream,
        _ca: ca,
    }
}

impl World {
    /// `curl -X METHOD` as `who` (`ci`, `twin`, `lab`) for `https://HOST:PORT/PATH` with extra
    /// headers.
    fn send(
        &self,
        who: &str,
        method: &str,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> CurlOutput {
        let token = match who {
            "ci" => TOKEN_CI,
            "twin" => TOKEN_TWIN,
            _ => TOKEN_LAB,
        };
        let mut args = vec![
            "--proxy-user".to_string(),
            format!("{who}:{token}"),
            "-X".to_string(),
            method.to_string(),
            format!("https://{host}:{}{path}", self.upstream.port()),
        ];
        for (name, value) in headers {
            args.push("-H".to_string());
            args.push(format!("{name}: {value}"));
        }
        curl(&self.lk).args(args).run()
    }

    /// [`Self::send`] a GET that curl completes; the status.
    fn get(&self, who: &str, host: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
        self.send(who, "GET", host, path, headers).ok().status
    }

    /// What the upstream received for `path`, the last time.
    fn received(&self, path: &str) -> Received {
        self.upstream
            .received()
            .into_iter()
            .rev()
            .find(|r| r.path_only() == path)
            .unwrap_or_else(|| panic!("the upstream never received {path}"))
    }

    fn policies(&self) -> String {
        self.lk
            .scratch()
            .join("policies")
            .to_str()
            .expect("UTF-8 path")
            .to_string()
    }
}

/// The outcome record of the request for `path` (records name the path as requested).
fn record_for<'a>(records: &'a [Value], path: &str) -> &'a Value {
    records
        .iter()
        .find(|r| r["path"] == path)
        .unwrap_or_else(|| panic!("no record for {path}: {records:#?}"))
}

/// `latchkey explain --reach WHO` against `policies`: (exit code, stdout, stderr).
fn explain_reach(policies: &str, who: &str, json: bool) -> (Option<i32>, String, String) {
    let mut args = vec!["explain", "--policies", policies, "--reach", who];
    if json {
        args.push("--json");
    }
    let out = run_cli(args);
    (out.code(), out.stdout, out.stderr)
}

fn is_hex(v: &Value, len: usize) -> bool {
    v.as_str()
        .is_some_and(|s| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[test]
fn every_record_carries_the_identity_s_labels_and_the_reach_explain_prints() {
    let w = world(&[]);
    assert_eq!(w.get("ci", "api.test", "/v1/ci", &[]), 200);
    assert_eq!(w.get("twin", "api.test", "/v1/twin", &[]), 200);
    assert_eq!(w.get("lab", "other.test", "/lab", &[]), 200);
    // Denials carry the ceiling too: a method api does not allow, inside the interception…
    let denied = w.send("ci", "POST", "api.test", "/v1/ci-denied", &[]);
    assert_eq!(denied.ok().status, 403);
    // … and a CONNECT refused at the gate (api is not lab's).
    let refused = w.send("lab", "GET", "api.test", "/v1/lab", &[]);
    assert_ne!(refused.exit, Some(0), "{refused:#?}");
    let records = w.lk.wait_audit(5);

    let ci = record_for(&records, "/v1/ci");
    assert_eq!(
        ci["labels"],
        json!({"sandbox": "run-42", "owner": "ana", "env": "ci"})
    );
    let twin = record_for(&records, "/v1/twin");
    assert!(twin.get("labels").is_none(), "twin has no labels: {twin:#}");
    let lab = record_for(&records, "/lab");
    let denied = record_for(&records, "/v1/ci-denied");
    assert_eq!(denied["reason"], "method_not_allowed");
    assert_eq!(denied["labels"], ci["labels"]);
    let connect = records
        .iter()
        .find(|r| r["method"] == "CONNECT")
        .expect("the refused CONNECT's record");
    assert_eq!(connect["identity"], "lab");
    assert_eq!(connect["reason"], "identity_not_allowed");

    let reach = |r: &Value| r["reach"].as_str().expect("reach").to_string();
    for r in [ci, twin, lab, denied, connect] {
        let d = reach(r);
        assert!(
            d.len() == 71 && d.starts_with("sha256:"),
            "reach is a sha256 digest: {r:#}"
        );
    }
    // Same rules, same reach; other rules, another.
    assert_eq!(reach(ci), reach(twin));
    assert_ne!(reach(ci), reach(lab));
    assert_eq!(reach(ci), reach(denied));
    assert_eq!(reach(lab), reach(connect));

    // The decision record (written before the dial) already carries them.
    let decision =
        w.lk.decision_records()
            .into_iter()
            .find(|d| d["id"] == ci["id"])
            .expect("ci's decision record");
    assert_eq!(decision["labels"], ci["labels"]);
    assert_eq!(decision["reach"], ci["reach"]);

    // `explain --reach` prints the listing behind the digest, the digest last.
    let policies = w.policies();
    let (code, text, stderr) = explain_reach(&policies, "ci", false);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.last().copied(),
        Some(format!("reach: {}", reach(ci)).as_str()),
        "{text}"
    );
    for item in [
        "rule api: host api.test",
        "rule api: method GET",
        "rule api: secret openai bound to api.test",
        "rule kept: host other.test",
        "rule kept: keeps header traceparent",
    ] {
        assert!(lines.contains(&item), "{item:?} missing from:\n{text}");
    }
    assert!(!text.contains("rule wide"), "ci cannot use wide:\n{text}");
    let mut sorted = lines[..lines.len() - 1].to_vec();
    sorted.sort();
    assert_eq!(sorted, lines[..lines.len() - 1], "items are sorted");
    assert!(!text.contains(OPENAI), "explain printed a secret value");

    let (code, out, _) = explain_reach(&policies, "lab", true);
    assert_eq!(code, Some(0));
    let v: Value = serde_json::from_str(out.trim()).expect("explain --reach --json");
    assert_eq!(v["identity"], "lab");
    assert_eq!(v["reach"], reach(lab).as_str());
    assert_eq!(
        v["items"],
        json!([
            "rule kept: host other.test",
            "rule kept: keeps header traceparent",
            "rule kept: keeps header tracestate",
            "rule kept: keeps header x-latchkey-session",
            "rule kept: keeps header x-latchkey-step",
            "rule kept: method any",
            "rule kept: path any",
            format!("rule kept: port http:{}", w.upstream.port()),
            format!("rule kept: port https:{}", w.upstream.port()),
        ])
    );

    // An identity the policy does not define: exit 2, the known ones named.
    let (code, out, stderr) = explain_reach(&policies, "nobody", false);
    assert_eq!(code, Some(2), "{out}{stderr}");
    assert!(
        stderr.contains("unknown identity \"nobody\"; the policy defines: ci, twin, lab"),
        "{stderr}"
    );
    // `explain METHOD URL` works as before.
    let url = format!("https://api.test:{}/v1/x", w.upstream.port());
    let out = run_cli([
        "explain",
        "--policies",
        &policies,
        "--identity",
        "ci",
        "GET",
        &url,
    ]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(out.stdout.starts_with("decision: allow"), "{out:#?}");
}

#[test]
fn widening_one_identity_changes_its_reach_and_no_one_else_s() {
    let w = world(&[]);
    assert_eq!(w.get("ci", "api.test", "/v1/before", &[]), 200);
    assert_eq!(w.get("twin", "api.test", "/v1/twin-before", &[]), 200);
    assert_eq!(w.get("lab", "other.test", "/lab-before", &[]), 200);
    let before = w.lk.wait_audit(3);
    let old = digest(&w.lk);

    // ci may now use `wide` too; SIGHUP reloads.
    let path = w.lk.scratch().join("policies").join("main.toml");
    std::fs::write(&path, policy(w.upstream.port(), r#", "wide""#)).expect("rewrite policy");
    w.lk.signal("HUP");
    let new = wait_digest_change(&w.lk, &old);

    assert_eq!(w.get("ci", "a.wild.test", "/wide", &[]), 200);
    assert_eq!(w.get("twin", "api.test", "/v1/twin-after", &[]), 200);
    assert_eq!(w.get("lab", "other.test", "/lab-after", &[]), 200);
    let after = w.lk.wait_audit(6);
    let at = |records: &[Value], p: &str| {
        let r = record_for(records, p);
        (r["reach"].clone(), r["policy"].clone())
    };
    let (ci_old, _) = at(&before, "/v1/before");
    let (ci_new, policy_new) = at(&after, "/wide");
    assert_eq!(policy_new, new.as_str());
    assert_ne!(ci_new, ci_old, "ci's reach widened");
    assert_eq!(
        at(&after, "/v1/twin-after").0,
        at(&before, "/v1/twin-before").0
    );
    assert_eq!(at(&after, "/lab-after").0, at(&before, "/lab-before").0);
    // The digest in force is what explain computes from the files now.
    let (_, out, _) = explain_reach(&w.policies(), "ci", true);
    let v: Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["reach"], ci_new);
    assert!(v["items"]
        .as_array()
        .expect("items")
        .contains(&json!("rule wide: host a.wild.test")));
}

#[test]
fn a_retried_step_is_two_attempts_of_one_step_and_the_headers_stay_with_latchkey() {
    let w = world(&[]);
    let session = [("x-latchkey-session", "sess-9f2")];
    let with_tp = [
        ("x-latchkey-session", "sess-9f2"),
        ("traceparent", TP),
        ("tracestate", "vendor=abc"),
    ];
    assert_eq!(w.get("ci", "api.test", "/v1/try-1", &with_tp), 200);
    assert_eq!(w.get("ci", "api.test", "/v1/try-2", &with_tp), 200);
    let other_tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    assert_eq!(
        w.get("ci", "api.test", "/v1/other", &[("traceparent", other_tp)]),
        200
    );
    assert_eq!(
        w.get(
            "ci",
            "api.test",
            "/v1/named",
            &[("x-latchkey-step", "plan-3")]
        ),
        200
    );
    assert_eq!(w.get("ci", "api.test", "/v1/none", &session), 200);
    // An invalid traceparent is ignored, not an error.
    assert_eq!(
        w.get("ci", "api.test", "/v1/bad", &[("traceparent", "00-XYZ-01")]),
        200
    );
    let records = w.lk.wait_audit(6);

    let step = format!("{TP_TRACE}-{TP_PARENT}");
    let (one, two) = (
        record_for(&records, "/v1/try-1"),
        record_for(&records, "/v1/try-2"),
    );
    for (r, attempt) in [(one, 1), (two, 2)] {
        assert_eq!(r["session"], "sess-9f2", "{r:#}");
        assert_eq!(r["step"], step.as_str(), "{r:#}");
        assert_eq!(r["attempt"], attempt, "{r:#}");
        assert_eq!(r["trace_id"], TP_TRACE, "{r:#}");
        assert_eq!(r["parent_span_id"], TP_PARENT, "{r:#}");
        assert!(is_hex(&r["span_id"], 16), "{r:#}");
    }
    assert_ne!(one["span_id"], two["span_id"], "a span per attempt");
    let other = record_for(&records, "/v1/other");
    assert_eq!(
        other["step"],
        "0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"
    );
    assert_eq!(other["attempt"], 1);
    assert!(other.get("session").is_none());
    let named = record_for(&records, "/v1/named");
    assert_eq!(named["step"], "plan-3");
    assert_eq!(named["attempt"], 1);
    assert!(
        named.get("trace_id").is_none(),
        "no trace without traceparent or --otlp"
    );
    let none = record_for(&records, "/v1/none");
    assert_eq!(none["session"], "sess-9f2");
    for field in ["step", "attempt", "trace_id", "span_id", "parent_span_id"] {
        assert!(none.get(field).is_none(), "{field}: {none:#}");
    }
    let bad = record_for(&records, "/v1/bad");
    assert!(
        bad.get("step").is_none() && bad.get("trace_id").is_none(),
        "{bad:#}"
    );
    // The decision record has them too.
    let decision =
        w.lk.decision_records()
            .into_iter()
            .find(|d| d["id"] == two["id"])
            .expect("decision record");
    assert_eq!(decision["attempt"], 2);
    assert_eq!(decision["span_id"], two["span_id"]);

    // None of it reached the upstream (no --otlp: no traceparent either).
    for p in [
        "/v1/try-1",
        "/v1/try-2",
        "/v1/other",
        "/v1/named",
        "/v1/none",
    ] {
        let got = w.received(p);
        for h in CORRELATION {
            assert!(
                got.header(h).is_none(),
                "{h} reached the upstream for {p}: {got:#?}"
            );
        }
    }

    // A rule that keeps them forwards them unchanged.
    let all = [
        ("x-latchkey-session", "sess-9f2"),
        ("x-latchkey-step", "plan-4"),
        ("traceparent", TP),
        ("tracestate", "vendor=abc"),
    ];
    assert_eq!(w.get("ci", "other.test", "/kept", &all), 200);
    let got = w.received("/kept");
    for (h, v) in all {
        assert_eq!(got.header(h), Some(v), "{h}: {got:#?}");
    }
    let records = w.lk.wait_audit(7);
    let kept = record_for(&records, "/kept");
    assert_eq!(kept["step"], "plan-4");
    assert_eq!(kept["attempt"], 1);
}

#[test]
fn with_otlp_the_upstream_gets_the_trace_under_latchkey_s_span() {
    // Nothing listens there: spans cannot be delivered, and requests do not care.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("reserve a port");
    let otlp = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let w = world(&["--otlp", &otlp]);
    assert_eq!(
        w.get(
            "ci",
            "api.test",
            "/v1/traced",
            &[("traceparent", TP), ("tracestate", "vendor=abc")]
        ),
        200
    );
    assert_eq!(
        w.get("ci", "api.test", "/v1/fresh", &[("tracestate", "x=1")]),
        200
    );
    assert_eq!(w.get("ci", "api.test", "/v1/fresh-2", &[]), 200);
    let records = w.lk.wait_audit(3);

    let traced = record_for(&records, "/v1/traced");
    let span = traced["span_id"].as_str().expect("span_id");
    assert!(is_hex(&traced["span_id"], 16));
    assert_eq!(traced["trace_id"], TP_TRACE);
    assert_eq!(traced["parent_span_id"], TP_PARENT);
    let got = w.received("/v1/traced");
    assert_eq!(
        got.header("traceparent"),
        Some(format!("00-{TP_TRACE}-{span}-01").as_str()),
        "{got:#?}"
    );
    assert_eq!(got.header("tracestate"), Some("vendor=abc"));

    // No traceparent sent: latchkey starts the trace (and drops a tracestate of no trace).
    let mut traces = HashSet::new();
    for p in ["/v1/fresh", "/v1/fresh-2"] {
        let r = record_for(&records, p);
        assert!(
            is_hex(&r["trace_id"], 32) && is_hex(&r["span_id"], 16),
            "{r:#}"
        );
        assert!(r.get("parent_span_id").is_none(), "{r:#}");
        assert!(
            r.get("step").is_none(),
            "a trace of latchkey's own is no step: {r:#}"
        );
        traces.insert(r["trace_id"].clone());
        let got = w.received(p);
        assert_eq!(
            got.header("traceparent"),
            Some(
                format!(
                    "00-{}-{}-01",
                    r["trace_id"].as_str().expect("trace"),
                    r["span_id"].as_str().expect("span")
                )
                .as_str()
            ),
            "{got:#?}"
        );
        assert!(got.header("tracestate").is_none(), "{got:#?}");
    }
    assert_eq!(traces.len(), 2, "a fresh trace per request");
}

#[test]
fn a_secret_pasted_into_a_correlation_header_never_reaches_the_record() {
    let w = world(&[]);
    let pasted = format!("run-{OPENAI}");
    assert_eq!(
        w.get(
            "ci",
            "api.test",
            "/v1/pasted",
            &[("x-latchkey-session", &pasted), ("x-latchkey-step", OPENAI),]
        ),
        200
    );
    let records = w.lk.wait_audit(1);
    let r = record_for(&records, "/v1/pasted");
    assert_eq!(r["session"], "run-[REDACTED:openai]", "{r:#}");
    assert_eq!(r["step"], "[REDACTED:openai]", "{r:#}");
    assert_eq!(r["attempt"], 1);
    let secrets = vec![("openai".to_string(), OPENAI.to_string())];
    assert_no_leak("the audit log", w.lk.audit_text().as_bytes(), &secrets);
    assert_no_leak("latchkey's log", w.lk.stderr_text().as_bytes(), &secrets);
    // The upstream got the secret only where the rule injects it, not the session header.
    let got = w.received("/v1/pasted");
    assert!(got.header("x-latchkey-session").is_none(), "{got:#?}");
    assert_eq!(
        got.header("authorization"),
        Some(format!("Bearer {OPENAI}").as_str())
    );
}

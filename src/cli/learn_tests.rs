//! `latchkey learn` over any log the audit writer produces: every record kind the proxy writes
//! (allowed, denied, asked and approved, report-only, tunnel, WebSocket, MCP, limits, DNS,
//! decision records, upstream failures, unknown identities), built with the real record types
//! and written by the real writer, learned against a policy that asks a person. learn must pass
//! its own self-check on all of them: a "bug in learn" error is a failure.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::{run, LearnArgs};
use crate::audit::{
    ApprovalInfo, AuditLog, DnsInfo, Entry, LimitCharge, McpCall, McpInfo, WebSocketInfo,
};
use crate::reason::Reason;

/// A rule that asks a person for writes, one that reads freely, one for WebSockets; with
/// `[ask] unknown` on or off.
fn policy(unknown: bool) -> String {
    format!(
        r#"[ask]
unknown = {unknown}
hold = "0s"

[[rules]]
name = "prod-writes"
hosts = ["api.prod.test"]
methods = ["POST", "DELETE"]
paths = ["/v1/**"]
ask = {{ hold = "0s", scope = ["once", "1h"] }}

[[rules]]
name = "prod-reads"
hosts = ["api.prod.test"]
methods = ["GET"]

[[rules]]
name = "ws"
hosts = ["ws.test"]
websocket = true
"#
    )
}

const HOSTS: [&str; 4] = ["api.prod.test", "new.test", "ws.test", "a.new.test"];
const PATHS: [&str; 5] = [
    "/v1/items/42",
    "/v1/items",
    "/",
    "/a/b?x=1",
    "/v1/3f2b9c1e-aaaa",
];
const METHODS: [&str; 4] = ["GET", "POST", "DELETE", "PUT"];

/// One record to write: its kind and the request it is about.
#[derive(Debug, Clone)]
struct Spec {
    kind: u8,
    host: usize,
    path: usize,
    method: usize,
    port: u16,
    plain: bool,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        0u8..17,
        0..HOSTS.len(),
        0..PATHS.len(),
        0..METHODS.len(),
        prop::sample::select(vec![443u16, 8443]),
        any::<bool>(),
    )
        .prop_map(|(kind, host, path, method, port, plain)| Spec {
            kind,
            host,
            path,
            method,
            port,
            plain,
        })
}

/// Writes one request's record(s) as the proxy would.
fn write(log: &Arc<AuditLog>, rt: &tokio::runtime::Runtime, s: &Spec) {
    let client: SocketAddr = "127.0.0.1:40000".parse().expect("addr");
    let identity = if s.kind == 16 { "ci" } else { "default" };
    let mut e = Entry::start(log.clone(), client, identity, "sha256:p");
    let (scheme, port) = if s.plain {
        ("http", 80)
    } else {
        ("https", s.port)
    };
    let method = METHODS[s.method];
    e.update(|r| {
        r.method = Some(method.to_string());
        r.scheme = Some(scheme.to_string());
        r.host = Some(HOSTS[s.host].to_string());
        r.port = Some(port);
        r.path = Some(PATHS[s.path].to_string());
    });
    let approval = |state: &'static str| ApprovalInfo {
        id: "ap-1".into(),
        state,
        scope: (state == "approved").then(|| "once".to_string()),
        ..ApprovalInfo::default()
    };
    match s.kind {
        0 => e.outcome(Reason::Allowed, Some("prod-reads"), Some(200)),
        1 => e.outcome(Reason::NoRule, None, Some(403)),
        2 => e.outcome(Reason::MethodNotAllowed, Some("prod-reads"), Some(403)),
        3 => {
            // What a person approved: a write the asking rule covers.
            e.update(|r| {
                r.approval = Some(approval("approved"));
                r.host = Some("api.prod.test".into());
                r.method = Some(
                    if s.method.is_multiple_of(2) {
                        "POST"
                    } else {
                        "DELETE"
                    }
                    .into(),
                );
                r.path = Some(PATHS[s.path % 2].into());
            });
            e.outcome(Reason::Allowed, Some("prod-writes"), Some(201));
        }
        4 => {
            e.update(|r| r.approval = Some(approval("pending")));
            e.outcome(Reason::ApprovalPending, Some("prod-writes"), Some(403));
        }
        5 => {
            e.update(|r| r.approval = Some(approval("denied")));
            e.outcome(Reason::ApprovalDenied, Some("unknown"), Some(403));
        }
        6 => {
            e.update(|r| {
                r.method = Some("APPROVAL".into());
                r.approval = Some(ApprovalInfo {
                    by: Some("alice".into()),
                    ..approval("approved")
                });
            });
            e.outcome(Reason::Allowed, Some("prod-writes"), None);
        }
        7 => e.outcome_report(Reason::NoRule, None, Some(200)),
        8 => {
            e.update(|r| {
                r.method = Some("CONNECT".into());
                r.path = None;
                r.scheme = None;
            });
            e.outcome(Reason::Tunnel, Some("ws"), Some(200));
        }
        9 | 10 => {
            e.update(|r| {
                r.method = Some("GET".into());
                r.websocket = Some(WebSocketInfo {
                    frames_up: 2,
                    frames_down: 3,
                    close_code: Some(1000),
                    closed_by: "sandbox",
                });
            });
            if s.kind == 9 {
                e.outcome(Reason::Allowed, Some("ws"), Some(101));
            } else {
                e.outcome(Reason::WebSocketNotAllowed, Some("prod-reads"), Some(403));
            }
        }
        11 => {
            e.update(|r| {
                r.method = Some("POST".into());
                r.mcp = Some(McpInfo {
                    messages: 1,
                    calls: vec![McpCall {
                        method: Some("tools/call".into()),
                        tool: Some("delete_repo".into()),
                        refused: true,
                    }],
                });
            });
            e.outcome(Reason::McpNotAllowed, Some("prod-writes"), Some(403));
        }
        12 => {
            e.update(|r| {
                r.limits = vec![LimitCharge {
                    limit: "per-agent".into(),
                    measure: "requests",
                    key: "identity:default".into(),
                    charged: 1,
                    used: 100,
                    limit_value: 100,
                    refused: true,
                    unchecked: false,
                }];
            });
            e.outcome(Reason::RateLimited, Some("prod-reads"), Some(429));
        }
        13 => {
            e.update(|r| {
                r.method = Some("DNS".into());
                r.dns = Some(DnsInfo::new("udp"));
            });
            e.outcome(Reason::NoRule, None, None);
        }
        14 => e.outcome(Reason::UpstreamTls, Some("prod-reads"), Some(502)),
        15 => {
            e.outcome(Reason::Allowed, Some("prod-reads"), None);
            assert!(rt.block_on(e.commit_decision()), "decision record written");
            e.update(|r| r.status = Some(200));
        }
        _ => e.outcome(Reason::NoRule, None, Some(403)),
    }
    e.finish();
}

fn learn_over(dir: &Path, specs: &[Spec], unknown: bool, all: bool) -> anyhow::Result<()> {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies)?;
    std::fs::write(policies.join("main.toml"), policy(unknown))?;
    let audit = dir.join("audit.jsonl");
    let log = Arc::new(AuditLog::open(&audit)?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for s in specs {
        write(&log, &rt, s);
    }
    assert!(log.flush(Duration::from_secs(10)), "the log is written");
    drop(log);
    let args = LearnArgs {
        files: vec![audit],
        policies: policies.clone(),
        out: Some(dir.join("learned.toml")),
        tests: Some(dir.join("learned-cases.toml")),
        since: None,
        identity: Vec::new(),
        min_count: 1,
        all,
        dry_run: false,
        force: false,
    };
    run(&args).map(|_| ())
}

#[test]
fn an_approved_ask_request_is_not_learned_and_learn_passes_its_self_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let approved = Spec {
        kind: 3,
        host: 0,
        path: 0,
        method: 1,
        port: 443,
        plain: false,
    };
    learn_over(dir.path(), &[approved], false, false).expect("learn");
    assert!(
        !dir.path().join("learned.toml").exists(),
        "a request a rule asks about is left to the person, not learned as an allow"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any log the writer produced: learn writes its files, or nothing to learn, and never
    /// fails its self-check.
    #[test]
    fn learn_over_any_log_the_writer_produced_passes_its_self_check(
        specs in prop::collection::vec(spec(), 1..14),
        unknown in any::<bool>(),
        all in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        if let Err(e) = learn_over(dir.path(), &specs, unknown, all) {
            prop_assert!(false, "learn failed: {}", crate::reason::chain_text(e.as_ref()));
        }
        if dir.path().join("learned.toml").exists() {
            let cases = std::fs::read_to_string(dir.path().join("learned-cases.toml")).expect("cases");
            prop_assert!(cases.contains("expect   = \"allow\""), "{}", cases);
        }
    }
}

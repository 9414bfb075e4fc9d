//! Denials and request predicates through `latchkey serve`, with real clients: a `[[deny]]`
//! wins over the rule that would allow (403 `denied_by_rule` naming it); `query`, `headers` and
//! `body` predicates refuse what they do not allow (403 `predicate_mismatch` naming the
//! predicate, never the value) before anything reaches the upstream; a body predicate reads a
//! body that still reaches the upstream intact; report-only lets a would-be refusal through,
//! marked; `graphql` predicates in front of a real GraphQL server (graphql-core): queries pass,
//! a mutation and a denied field never reach it, batches and persisted queries are judged.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{
    assert_denial, assert_record, curl, latchkey, toolchain, Latchkey, TestCa, Upstream, PINNED,
};

const LEAK: &str = "sk-live-predicate-value-3c1e9f";

fn policy(port: u16, extra: &str) -> String {
    format!(
        r#"
[[deny]]
name = "no-repo-delete"
description = "Agents never delete repositories."
hosts = ["api.test"]
methods = ["DELETE"]
paths = ["/repos/*/*"]

[[rules]]
name = "search"
hosts = ["api.test"]
ports = [{port}]
methods = ["GET"]
paths = ["/v1/search"]
query = {{ required = ["q"], forbidden = ["include_private"], only = ["q", "page"], values = {{ page = "re:^[0-9]{{1,3}}$" }} }}
headers = {{ "x-api-version" = "2024-*" }}
{extra}

[[rules]]
name = "actions"
hosts = ["api.test"]
ports = [{port}]
methods = ["POST"]
paths = ["/v1/actions"]
body = {{ "/action" = "read", "/target/owner" = "acme" }}

[[rules]]
name = "repos"
hosts = ["api.test"]
ports = [{port}]
paths = ["/repos/**"]
"#
    )
}

struct World {
    lk: Latchkey,
    upstream: Upstream,
    _ca: TestCa,
}

fn world(extra: &str, args: &[&str]) -> World {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let mut builder = latchkey()
        .upstream_ca(&ca)
        .policy("main.toml", &policy(upstream.port(), extra));
    for host in PINNED {
        builder = builder.pin(host);
    }
    for arg in args {
        builder = builder.arg(arg);
    }
    World {
        lk: builder.run(),
        upstream,
        _ca: ca,
    }
}

impl World {
    fn url(&self, path_and_query: &str) -> String {
        format!("https://api.test:{}{path_and_query}", self.upstream.port())
    }

    fn reached(&self, path: &str) -> usize {
        self.upstream
            .received()
            .iter()
            .filter(|r| r.path_only() == path)
            .count()
    }
}

#[test]
fn a_denial_wins_and_query_header_and_body_predicates_refuse_by_name() {
    let w = world("", &[]);
    let v = ["-H", "x-api-version: 2024-06-01"];
    let ok = curl(&w.lk)
        .args(v)
        .args([w.url("/v1/search?q=cats&page=2")])
        .run();
    assert_eq!(ok.ok().status, 200, "{ok:#?}");
    // The denial wins over `repos`, which would allow the DELETE.
    let out = curl(&w.lk)
        .args(["-X", "DELETE", &w.url("/repos/acme/app")])
        .run();
    assert_denial(out.ok(), 403, Some("no-repo-delete"), "denied_by_rule");
    assert!(
        out.ok()
            .text()
            .contains("Agents never delete repositories."),
        "{out:#?}"
    );
    // Query predicates, each named; the value is never echoed.
    for (path, says) in [
        ("/v1/search?page=2", "requires query parameter q"),
        (
            &format!("/v1/search?q=x&include_private={LEAK}") as &str,
            "include_private",
        ),
        ("/v1/search?q=x&debug=1", "debug"),
        ("/v1/search?q=x&page=12345", "page"),
    ] {
        let out = curl(&w.lk).args(v).args([w.url(path)]).run();
        assert_denial(out.ok(), 403, Some("search"), "predicate_mismatch");
        let text = out.ok().text();
        assert!(
            text.contains(says) && !text.contains(LEAK),
            "{path}: {text}"
        );
    }
    // A percent-encoded forbidden name is the same name.
    let out = curl(&w.lk)
        .args(v)
        .args([w.url("/v1/search?q=x&include%5Fprivate=1")])
        .run();
    assert_denial(out.ok(), 403, Some("search"), "predicate_mismatch");
    // Headers: absent or not matching.
    let out = curl(&w.lk).args([w.url("/v1/search?q=x")]).run();
    assert_denial(out.ok(), 403, Some("search"), "predicate_mismatch");
    let out = curl(&w.lk)
        .args(["-H", "x-api-version: 2023-01-01", &w.url("/v1/search?q=x")])
        .run();
    assert_denial(out.ok(), 403, Some("search"), "predicate_mismatch");
    // Body: JSON and a form, read whole, then sent on intact.
    let body = r#"{"action":"read","target":{"owner":"acme"},"note":"x"}"#;
    let out = curl(&w.lk)
        .args([
            "-H",
            "content-type: application/json",
            "--data-binary",
            body,
        ])
        .args([w.url("/v1/actions")])
        .run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let seen = w
        .upstream
        .received()
        .into_iter()
        .find(|r| r.path_only() == "/v1/actions")
        .expect("the allowed POST reached the upstream");
    assert_eq!(
        seen.body,
        body.as_bytes(),
        "the body reaches the upstream as sent"
    );
    let bad = format!(r#"{{"action":"delete","target":{{"owner":"acme"}},"k":"{LEAK}"}}"#);
    let out = curl(&w.lk)
        .args([
            "-H",
            "content-type: application/json",
            "--data-binary",
            &bad,
        ])
        .args([w.url("/v1/actions")])
        .run();
    assert_denial(out.ok(), 403, Some("actions"), "predicate_mismatch");
    assert!(out.ok().text().contains("/action") && !out.ok().text().contains(LEAK));
    let dup = r#"{"action":"read","action":"delete","target":{"owner":"acme"}}"#;
    let out = curl(&w.lk)
        .args(["-H", "content-type: application/json", "--data-binary", dup])
        .args([w.url("/v1/actions")])
        .run();
    assert_denial(out.ok(), 403, Some("actions"), "predicate_mismatch");
    assert_eq!(
        w.reached("/v1/actions"),
        1,
        "refused bodies never reached the upstream"
    );
    assert_eq!(w.reached("/repos/acme/app"), 0);
    // The records say why, and never hold the values.
    let records = w.lk.audit_records();
    let denial = records
        .iter()
        .find(|r| r["reason"] == "denied_by_rule")
        .expect("a denied_by_rule record");
    assert_record(
        denial,
        json!({"decision": "deny", "rule": "no-repo-delete", "method": "DELETE", "upstream": null}),
    );
    assert!(records
        .iter()
        .any(|r| r["reason"] == "predicate_mismatch" && r["rule"] == "actions"));
    assert!(!w.lk.audit_text().contains(LEAK) && !w.lk.stderr_text().contains(LEAK));
}

#[test]
fn report_only_lets_a_predicate_refusal_through_marked() {
    let w = world("mode = \"report\"", &[]);
    let out = curl(&w.lk).args([w.url("/v1/search?page=2")]).run();
    assert_eq!(out.ok().status, 200, "report-only forwards: {out:#?}");
    assert_eq!(w.reached("/v1/search"), 1);
    let records = w.lk.audit_records();
    let r = records
        .iter()
        .find(|r| {
            r["phase"] == "outcome"
                && r["path"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("/v1/search"))
        })
        .unwrap_or_else(|| panic!("no record: {records:#?}"));
    assert_record(
        r,
        json!({"decision": "allow", "would_deny": true, "reason": "predicate_mismatch", "rule": "search"}),
    );
}

/// A real GraphQL server (graphql-core) on loopback, plain HTTP; killed on drop.
struct GraphqlServer {
    child: Child,
    port: u16,
    executed: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl GraphqlServer {
    fn start() -> GraphqlServer {
        let dir = tempfile::tempdir().expect("tmp");
        let port_file = dir.path().join("port");
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/graphql_server.py"
        );
        let mut child = Command::new(toolchain::python())
            .arg(script)
            .arg(&port_file)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start graphql_server.py");
        let stdout = child.stdout.take().expect("stdout");
        let executed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = executed.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line == "listening" {
                    let _ = tx.send(());
                } else if let Some(op) = line.strip_prefix("executed ") {
                    sink.lock().expect("executed").push(op.to_string());
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("graphql_server.py listening");
        let port = std::fs::read_to_string(&port_file)
            .expect("port file")
            .trim()
            .parse()
            .expect("a port");
        GraphqlServer {
            child,
            port,
            executed,
        }
    }

    fn executed(&self) -> Vec<String> {
        self.executed.lock().expect("executed").clone()
    }
}

impl Drop for GraphqlServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// POSTs `body` (JSON) to the server's /graphql through latchkey: (status, answer).
fn graphql(lk: &Latchkey, port: u16, body: &str) -> (u16, String) {
    let out = curl(lk)
        .args([
            "-H",
            "content-type: application/json",
            "--data-binary",
            body,
        ])
        .args([format!("http://gql.test:{port}/graphql")])
        .run();
    let resp = out.ok();
    (resp.status, resp.text())
}

#[test]
fn graphql_predicates_in_front_of_a_real_graphql_server() {
    let server = GraphqlServer::start();
    let port = server.port;
    let hash = "a".repeat(64);
    let policy = format!(
        r#"
[[deny]]
name = "no-repo-delete"
description = "Agents never delete repositories."
hosts = ["gql.test"]
graphql = {{ deny_fields = ["deleteRepository"] }}

[[rules]]
name = "graphql"
hosts = ["gql.test"]
ports = [{port}]
methods = ["POST"]
paths = ["/graphql"]
graphql = {{ operations = ["query"], max_depth = 4, persisted = ["{hash}"] }}
"#
    );
    let lk = latchkey()
        .pin("gql.test")
        .policy("main.toml", &policy)
        .run();
    let (status, answer) = graphql(&lk, port, r#"{"query":"{ viewer { login } }"}"#);
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer.contains("\"login\": \"agent\"") || answer.contains("\"login\":\"agent\""),
        "{answer}"
    );
    let (status, answer) = graphql(
        &lk,
        port,
        r#"{"query":"mutation { createIssue(title: \"x\") }"}"#,
    );
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("query"), "{answer}");
    let (status, answer) = graphql(
        &lk,
        port,
        r#"{"query":"mutation M { gone: deleteRepository(name: \"app\") }","operationName":"M"}"#,
    );
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("no-repo-delete"), "{answer}");
    let (status, _) = graphql(
        &lk,
        port,
        r#"{"query":"{ viewer { repositories { owner { repositories { name } } } } }"}"#,
    );
    assert_eq!(status, 403, "too deep");
    let (status, _) = graphql(
        &lk,
        port,
        r#"[{"query":"{ viewer { login } }"},{"query":"mutation { createIssue(title: \"y\") }"}]"#,
    );
    assert_eq!(status, 403, "a batch is refused if any of it is");
    let unlisted = format!(
        r#"{{"extensions":{{"persistedQuery":{{"version":1,"sha256Hash":"{}"}}}}}}"#,
        "b".repeat(64)
    );
    assert_eq!(graphql(&lk, port, &unlisted).0, 403);
    // Only the allowed query ever reached the server.
    let deadline = Instant::now() + Duration::from_secs(2);
    while server.executed().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let executed = server.executed();
    assert_eq!(executed, vec!["query - viewer".to_string()], "{executed:?}");
    let records: Vec<Value> = lk.audit_records();
    assert!(records
        .iter()
        .any(|r| r["reason"] == "denied_by_rule" && r["rule"] == "no-repo-delete"));
    assert!(records
        .iter()
        .any(|r| r["reason"] == "predicate_mismatch" && r["rule"] == "graphql"));
}

//! MCP tool rules with the official MCP Python SDK at both ends (tests/clients/mcp_tools.py,
//! streamable HTTP over TLS through latchkey's interception): allowed tools run, a denied tool
//! or argument gets a JSON-RPC error the SDK reports (the server never runs it), `tools/list`
//! shows only what the rule allows, in SSE and in JSON responses; the audit record names the
//! tool.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::credentials::PyServer;
use crate::support::{latchkey, Latchkey, TestCa};

const TOKEN: &str = "ghp-Mcp-Token-0123456789abcdef";

fn policy(port: u16, mode: &str) -> String {
    format!(
        r#"
[secrets.gh]
source = "env:LK_MCP_TOKEN"

[[rules]]
name    = "github-mcp"
hosts   = ["api.test"]
ports   = [{port}]
paths   = ["/mcp"]
mode    = "{mode}"
mcp     = {{ tools = ["search_*", "get_issue"], deny_tools = ["delete_*"], args = {{ repo = "acme/*" }} }}
[rules.inject.headers]
authorization = "Bearer {{{{secret.gh}}}}"
"#
    )
}

fn world(json_response: bool, mode: &str) -> (PyServer, Latchkey) {
    let ca = TestCa::new();
    let (cert, key) = ca.issue_pem_files(crate::support::ca::UPSTREAM_NAMES, "mcp");
    let env: &[(&str, &str)] = if json_response {
        &[("MCP_JSON_RESPONSE", "1")]
    } else {
        &[]
    };
    let server = PyServer::start("mcp_tools.py", &cert, &key, env);
    let lk = latchkey()
        .upstream_ca(&ca)
        .policy("main.toml", &policy(server.port(), mode))
        .env("LK_MCP_TOKEN", TOKEN)
        .pin("api.test")
        .run();
    (server, lk)
}

fn client(lk: &Latchkey, port: u16, calls: Value) -> Value {
    let mut cmd = std::process::Command::new(crate::support::toolchain::python());
    cmd.arg(format!(
        "{}/tests/clients/mcp_tools.py",
        env!("CARGO_MANIFEST_DIR")
    ))
    .arg("client")
    .arg(format!("https://api.test:{port}/mcp"))
    .arg(lk.ca_pem_path())
    .arg(lk.proxy_url())
    .arg(calls.to_string());
    for var in crate::support::latchkey::SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    let out = crate::support::latchkey::wait_with_timeout(&mut cmd, Duration::from_secs(60));
    assert!(
        !out.stdout.contains(TOKEN) && !out.stderr.contains(TOKEN),
        "{out:?}"
    );
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("mcp client output ({e}): {out:?}"))
}

fn calls() -> Value {
    json!([
        ["search_issues", {"repo": "acme/widgets", "q": "crash"}],
        ["delete_repository", {"repo": "acme/widgets"}],
        ["get_issue", {"repo": "evil/widgets", "number": 7}],
        ["get_issue", {"repo": "acme/widgets", "number": 7}],
        // A tool name carrying the injected token: allowed by `search_*`, unknown upstream;
        // the record and the server's reflection of the name must not show the value.
        [format!("search_{TOKEN}"), {"repo": "acme/widgets", "q": "x"}]
    ])
}

/// The records of `tools/call` POSTs, in order.
fn tool_records(lk: &Latchkey, n: usize) -> Vec<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let calls: Vec<Value> = lk
            .audit_records()
            .into_iter()
            .filter(|r| {
                r["mcp"]["calls"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["method"] == "tools/call"))
            })
            .collect();
        if calls.len() >= n {
            return calls;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} tools/call records: {:#?}",
            calls.len(),
            lk.audit_records()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn check_enforced(server: &PyServer, lk: &Latchkey) {
    let out = client(lk, server.port(), calls());
    // tools/list shows only what the rule allows.
    assert_eq!(out["tools"], json!(["get_issue", "search_issues"]), "{out}");
    let results = out["results"].as_array().expect("results");
    assert_eq!(
        results[0]["ok"], "found 2 issues in acme/widgets for crash",
        "{out}"
    );
    let denied = results[1]["error"].as_str().unwrap_or_default();
    assert!(
        denied.contains("tool 'delete_repository' is denied"),
        "{out}"
    );
    let arg = results[2]["error"].as_str().unwrap_or_default();
    assert!(
        arg.contains("argument 'repo' must be a string matching acme/*"),
        "{out}"
    );
    assert_eq!(results[3]["ok"], "issue acme/widgets#7", "{out}");

    // The server ran only the allowed calls.
    let ran: Vec<Value> = server
        .wait_events("call", 2)
        .into_iter()
        .map(|e| json!([e["tool"], e["args"]["repo"]]))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        ran,
        [
            json!(["search_issues", "acme/widgets"]),
            json!(["get_issue", "acme/widgets"])
        ]
    );
    assert_eq!(server.events_of("call").len(), 2);

    let records = tool_records(lk, 5);
    let tool = |r: &Value| r["mcp"]["calls"][0]["tool"].clone();
    assert_eq!(tool(&records[4]), "search_[REDACTED:gh]", "{}", records[4]);
    assert_eq!(tool(&records[1]), "delete_repository");
    assert_eq!(records[1]["decision"], "deny", "{}", records[1]);
    assert_eq!(records[1]["reason"], "mcp_not_allowed", "{}", records[1]);
    assert_eq!(records[1]["status"], 200, "{}", records[1]);
    assert_eq!(records[1]["mcp"]["calls"][0]["refused"], true);
    assert_eq!(records[2]["reason"], "mcp_not_allowed");
    assert_eq!(tool(&records[0]), "search_issues");
    assert_eq!(records[0]["reason"], "allowed");
    assert_eq!(records[0]["secrets"], json!(["gh"]));
    assert!(!lk.audit_text().contains(TOKEN));
}

#[test]
fn mcp_tool_rules_hold_over_sse_responses() {
    let (server, lk) = world(false, "enforce");
    check_enforced(&server, &lk);
}

#[test]
fn mcp_tool_rules_hold_over_json_responses() {
    let (server, lk) = world(true, "enforce");
    check_enforced(&server, &lk);
}

/// `mode = "report"`: every call goes through, and the records say which would be refused.
#[test]
fn report_only_lets_a_refused_tool_through_marked_would_deny() {
    let (server, lk) = world(true, "report");
    let out = client(&lk, server.port(), calls());
    let results = out["results"].as_array().expect("results");
    assert_eq!(results[1]["ok"], "deleted acme/widgets", "{out}");
    server.wait_events("call", 4);
    let records = tool_records(&lk, 4);
    assert_eq!(records[1]["decision"], "allow", "{}", records[1]);
    assert_eq!(records[1]["would_deny"], true, "{}", records[1]);
    assert_eq!(records[1]["reason"], "mcp_not_allowed", "{}", records[1]);
    assert_eq!(records[3]["would_deny"], false, "{}", records[3]);
}

/// A body under an MCP rule is read whatever the method: a denied call sent in a PUT gets the
/// same JSON-RPC error, and the server never sees it.
#[test]
fn a_json_rpc_call_in_another_method_is_matched_too() {
    let (server, lk) = world(true, "enforce");
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delete_repository","arguments":{"repo":"acme/x"}}}"#;
    let out = crate::support::clients::curl(&lk)
        .args([
            "-X",
            "PUT",
            "-H",
            "content-type: application/json",
            "--data",
            body,
            &format!("https://api.test:{}/mcp", server.port()),
        ])
        .run();
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{resp:#?}");
    assert_eq!(resp.header("x-latchkey-reason"), Some("mcp_not_allowed"));
    let v: Value = serde_json::from_str(&resp.text()).expect("json-rpc error");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("tool 'delete_repository' is denied")),
        "{v}"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(server.events_of("call").is_empty());
}

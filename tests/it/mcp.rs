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

/// Keys a loose server reads as one (`name` and `Name`, a Unicode fold, a trailing NUL, an
/// argument glob's key in another case, `method` and `METHOD`) are ambiguous: each body is
/// refused `400 bad_request` and recorded, and the server never sees it. A lone `METHOD`
/// makes a request, matched like `method`, never forwarded as a response.
#[test]
fn ambiguous_keys_are_refused_and_folded_keys_are_matched() {
    let (server, lk) = world(true, "enforce");
    let url = format!("https://api.test:{}/mcp", server.port());
    let post = |body: &str| {
        crate::support::clients::curl(&lk)
            .args([
                "-X",
                "POST",
                "-H",
                "content-type: application/json",
                "-H",
                "accept: application/json, text/event-stream",
                "--data-binary",
                body,
                &url,
            ])
            .run()
    };
    let call = |params: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#)
    };
    let ambiguous = [
        call(r#"{"name":"get_issue","Name":"delete_repository"}"#),
        call(r#"{"name":"get_issue","arguments":{},"argument\u017f":{"repo":"evil/x"}}"#),
        call(r#"{"name":"get_issue","\u212aey":1,"key":2}"#),
        call(r#"{"name":"get_issue","name\u0000":"delete_repository"}"#),
        call(r#"{"name":"get_issue","arguments":{"repo":"acme/widgets","Repo":"evil/x"}}"#),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","METHOD":"tools/call","params":{"name":"delete_repository"}}"#.to_string(),
    ];
    for body in &ambiguous {
        let out = post(body);
        let resp = out.ok();
        assert_eq!(resp.status, 400, "{body}: {resp:#?}");
        assert_eq!(
            resp.header("x-latchkey-reason"),
            Some("bad_request"),
            "{body}"
        );
        assert!(resp.text().contains("ambiguous"), "{body}: {}", resp.text());
    }
    for body in [
        r#"{"jsonrpc":"2.0","id":1,"METHOD":"tools/call","params":{"name":"delete_repository"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"Method":"tools/call","PARAMS":{"NAME":"get_issue","ARGUMENTS":{"REPO":"evil/x"}}}"#,
    ] {
        let out = post(body);
        let resp = out.ok();
        assert_eq!(resp.status, 200, "{body}: {resp:#?}");
        assert_eq!(
            resp.header("x-latchkey-reason"),
            Some("mcp_not_allowed"),
            "{body}"
        );
        let v: Value = serde_json::from_str(&resp.text()).expect("json-rpc error");
        assert_eq!(v["error"]["data"]["reason"], "mcp_not_allowed", "{v}");
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(server.events_of("call").is_empty());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let records = lk.audit_records();
        let bad = records
            .iter()
            .filter(|r| r["reason"] == "bad_request" && r["path"] == "/mcp")
            .count();
        let denied = records
            .iter()
            .filter(|r| r["reason"] == "mcp_not_allowed")
            .count();
        if bad == ambiguous.len() && denied == 2 {
            assert!(records
                .iter()
                .filter(|r| r["reason"] == "bad_request")
                .all(|r| r["decision"] == "deny" && r["status"] == 400));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{bad} bad_request, {denied} mcp_not_allowed: {records:#?}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

const LISTING: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"search_code"},{"name":"delete_repository"}]}}"#;

/// How the test upstream answers `tools/list` at `/mcp/SHAPE`: content type, coding, pieces.
fn listing_shape(shape: &str) -> (&'static str, Option<&'static str>, Vec<Vec<u8>>) {
    let sse = |end: &str| {
        format!(": hi{end}{end}event: message{end}data: {LISTING}{end}{end}").into_bytes()
    };
    match shape {
        "cr" => ("text/event-stream", None, vec![sse("\r")]),
        // CR and LF of one line end in different chunks, and the blank line's too.
        "crlf-split" => {
            let s = sse("\r\n");
            let cuts: Vec<usize> = s
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\r')
                .map(|(i, _)| i + 1)
                .collect();
            let mut pieces = Vec::new();
            let mut from = 0;
            for c in cuts {
                pieces.push(s[from..c].to_vec());
                from = c;
            }
            pieces.push(s[from..].to_vec());
            ("text/event-stream; charset=utf-8", None, pieces)
        }
        "unterminated" => (
            "text/event-stream",
            None,
            vec![format!(
                "data: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\"}}\n\ndata: {LISTING}\n"
            )
            .into_bytes()],
        ),
        "unterminated-line" => (
            "text/event-stream",
            None,
            vec![format!("data: {LISTING}").into_bytes()],
        ),
        "json-rpc" => (
            "application/json-rpc",
            None,
            vec![LISTING.as_bytes().to_vec()],
        ),
        "vnd" => (
            "application/vnd.x+json",
            None,
            vec![LISTING.as_bytes().to_vec()],
        ),
        "plain" => ("text/plain", None, vec![LISTING.as_bytes().to_vec()]),
        "gzip" => (
            "application/json",
            Some("gzip"),
            vec![crate::support::secrets::compress(
                "gzip",
                LISTING.as_bytes(),
            )],
        ),
        other => panic!("no shape {other}"),
    }
}

/// `tools/list` answers latchkey must filter: SSE with CR-only line ends, line ends split
/// across chunks, a last event without its blank line (even without its line end), and JSON
/// under `application/json-rpc` or a `+json` type; each reaches curl without the denied tool.
/// A listing in a type or coding latchkey cannot filter is cut off, never passed whole.
#[test]
fn tools_list_answers_are_filtered_in_every_shape_or_cut_off() {
    use crate::support::upstream::{chunked_body, handler, Received, Upstream};
    let ca = TestCa::new();
    let up = Upstream::https_with(
        &ca,
        handler(|req: Received| async move {
            let shape = req.path.trim_start_matches("/mcp/").to_string();
            let (ct, coding, pieces) = listing_shape(&shape);
            let mut res = http::Response::builder().header("content-type", ct);
            if let Some(c) = coding {
                res = res.header("content-encoding", c);
            }
            res.body(chunked_body(
                pieces.into_iter().map(bytes::Bytes::from).collect(),
            ))
            .expect("response")
        }),
    );
    let policy = format!(
        r#"
[[rules]]
name  = "mcp-shapes"
hosts = ["api.test"]
ports = [{}]
paths = ["/mcp/*"]
mcp   = {{ deny_tools = ["delete_*"] }}
"#,
        up.port()
    );
    let lk = latchkey()
        .upstream_ca(&ca)
        .policy("main.toml", &policy)
        .pin("api.test")
        .run();
    let list = |shape: &str, http2: bool| {
        crate::support::clients::curl(&lk)
            .args([
                if http2 { "--http2" } else { "--http1.1" },
                "-H",
                "content-type: application/json",
                "--data-binary",
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
                &format!("https://api.test:{}/mcp/{shape}", up.port()),
            ])
            .run()
    };
    for http2 in [false, true] {
        for shape in [
            "cr",
            "crlf-split",
            "unterminated",
            "unterminated-line",
            "json-rpc",
            "vnd",
        ] {
            let out = list(shape, http2);
            let text = out.ok().text();
            assert!(text.contains("search_code"), "{shape} h2={http2}: {text:?}");
            assert!(
                !text.contains("delete_repository"),
                "{shape} h2={http2}: {text:?}"
            );
        }
        for shape in ["plain", "gzip"] {
            let out = list(shape, http2);
            assert_ne!(out.exit, Some(0), "{shape} h2={http2} passed: {out:#?}");
            assert!(
                !out.response.text().contains("delete_repository"),
                "{shape}: {out:#?}"
            );
        }
    }
    // Every request reached the upstream (the listing is filtered, not the request refused),
    // and latchkey is still serving: no worker panicked.
    assert_eq!(up.received().len(), 16);
    assert!(
        !lk.stderr_text().contains("panicked"),
        "{}",
        lk.stderr_text()
    );
}

//! WebSocket through the interception, with the Python `websockets` library at both ends
//! (tests/clients/ws_echo.py): the handshake decided and brokered like any GET, messages
//! relayed both ways with secrets checked toward the upstream and scrubbed toward the sandbox,
//! one audit record per socket written when it closes.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::credentials::PyServer;
use crate::support::{latchkey, Latchkey, TestCa};

const KEY: &str = "sk-Ws-Realtime-Key-0123456789abcdef";
/// Bound to another host only: the sandbox must not send it to api.test.
const OTHER: &str = "gh-Other-Token-fedcba9876543210";

fn policy(port: u16) -> String {
    format!(
        r#"
[secrets.key]
source = "env:LK_WS_KEY"

[secrets.other]
source = "env:LK_WS_OTHER"

[[rules]]
name         = "realtime"
hosts        = ["api.test"]
ports        = [{port}]
methods      = ["GET"]
paths        = ["/realtime/**"]
websocket    = true
placeholders = ["header", "websocket"]
[rules.inject.headers]
authorization = "Bearer {{{{secret.key}}}}"

# WebSockets, but placeholders only in headers.
[[rules]]
name      = "no-placeholders"
hosts     = ["api.test"]
ports     = [{port}]
paths     = ["/strict/**"]
websocket = true
[rules.inject.headers]
authorization = "Bearer {{{{secret.key}}}}"

# MCP over a WebSocket: every message is matched as JSON-RPC.
[[rules]]
name      = "mcp-ws"
hosts     = ["api.test"]
ports     = [{port}]
paths     = ["/mcp-ws/**"]
websocket = true
mcp       = {{ deny_tools = ["delete_*"], args = {{ repo = "acme/*" }} }}

# Plain requests only: an upgrade here is refused.
[[rules]]
name  = "plain"
hosts = ["api.test"]
ports = [{port}]
paths = ["/plain/**"]

[[rules]]
name    = "elsewhere"
hosts   = ["other.test"]
secrets = ["other"]
"#
    )
}

fn world() -> (PyServer, Latchkey) {
    let ca = TestCa::new();
    let (cert, key) = ca.issue_pem_files(crate::support::ca::UPSTREAM_NAMES, "ws");
    let server = PyServer::start("ws_echo.py", &cert, &key, &[]);
    let lk = latchkey()
        .upstream_ca(&ca)
        .policy("main.toml", &policy(server.port()))
        .env("LK_WS_KEY", KEY)
        .env("LK_WS_OTHER", OTHER)
        .arg("--max-websocket-message")
        .arg("64KiB")
        .pin("api.test")
        .pin("other.test")
        .run();
    (server, lk)
}

/// Runs the `websockets` client against `path` on the server through latchkey, trusting only
/// latchkey's CA, sending `messages`; its JSON line. Nothing it prints may hold the key.
fn client(lk: &Latchkey, port: u16, path: &str, messages: Value) -> Value {
    let mut cmd = std::process::Command::new(crate::support::toolchain::python());
    cmd.arg(format!(
        "{}/tests/clients/ws_echo.py",
        env!("CARGO_MANIFEST_DIR")
    ))
    .arg("client")
    .arg(format!("wss://api.test:{port}{path}"))
    .arg(lk.ca_pem_path())
    .arg(lk.proxy_url())
    .arg(messages.to_string());
    for var in crate::support::latchkey::SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    let out = crate::support::latchkey::wait_with_timeout(&mut cmd, Duration::from_secs(40));
    assert!(
        !out.stdout.contains(KEY) && !out.stderr.contains(KEY),
        "the sandbox saw the key: {out:?}"
    );
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("ws client output ({e}): {out:?}"))
}

/// The record of the one request to `path`.
fn record_for(lk: &Latchkey, path: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(r) = lk.audit_records().into_iter().find(|r| r["path"] == path) {
            return r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no record for {path}: {:#?}",
            lk.audit_records()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// The allowed path: the key is injected into the handshake, permessage-deflate is negotiated
/// off, a subprotocol goes through, messages echo both ways, a placeholder in a message is
/// replaced on the way up, the key the upstream reflects (whole or across fragments) arrives
/// redacted, and the record counts the frames and says who closed.
#[test]
fn a_websocket_is_brokered_relayed_scrubbed_and_audited_at_close() {
    let (server, lk) = world();
    let messages = json!([
        "hello",
        "reflect",
        "fragmented",
        "token __LATCHKEY_key__ here",
        {"binary": "raw bytes"},
        "close"
    ]);
    let out = client(&lk, server.port(), "/realtime/v1", messages);
    // The server's preference among those the client offered.
    assert_eq!(out["subprotocol"], "superchat", "{out}");
    assert_eq!(
        out["replies"],
        json!([
            "echo:hello",
            "your credential is Bearer [REDACTED:key]",
            "your credential is Bearer [REDACTED:key]",
            "echo:token [REDACTED:key] here",
            {"binary_len": 9}
        ]),
        "{out}"
    );
    // The server's close reason quotes the credential too: scrubbed like any message.
    assert_eq!(out["close_code"], 4000, "{out}");
    assert_eq!(out["close_reason"], "bye Bearer [REDACTED:key]", "{out}");

    let handshake = &server.wait_events("handshake", 1)[0];
    assert_eq!(handshake["auth"], format!("Bearer {KEY}"), "{handshake}");
    assert_eq!(handshake["extensions"], Value::Null, "{handshake}");
    let received: Vec<Value> = server
        .wait_events("message", 6)
        .into_iter()
        .map(|e| e["text"].clone())
        .collect();
    assert_eq!(received[3], format!("token {KEY} here"));

    let r = record_for(&lk, "/realtime/v1");
    assert_eq!(r["decision"], "allow", "{r}");
    assert_eq!(r["reason"], "allowed", "{r}");
    assert_eq!(r["rule"], "realtime", "{r}");
    assert_eq!(r["status"], 101, "{r}");
    assert_eq!(r["secrets"], json!(["key"]), "{r}");
    let ws = &r["websocket"];
    assert_eq!(ws["frames_up"], 6, "{r}");
    assert_eq!(ws["frames_down"], 5, "{r}");
    assert_eq!(ws["close_code"], 4000, "{r}");
    assert_eq!(ws["closed_by"], "upstream", "{r}");
    assert!(r["bytes_up"].as_u64().unwrap_or(0) > 30, "{r}");
    assert!(r["bytes_down"].as_u64().unwrap_or(0) > 100, "{r}");
    assert!(r["redactions"].as_u64().unwrap_or(0) >= 3, "{r}");
    assert!(!lk.audit_text().contains(KEY));
    assert!(!lk.stderr_text().contains(KEY));
}

/// A rule without `websocket = true` refuses the handshake with a status the client reports;
/// the upstream never sees it.
#[test]
fn an_upgrade_under_a_rule_without_websocket_is_refused_before_the_upstream() {
    let (server, lk) = world();
    let out = client(&lk, server.port(), "/plain/ws", json!(["hello"]));
    assert_eq!(out["status"], 403, "{out}");
    assert!(
        out["body"]
            .as_str()
            .is_some_and(|b| b.contains("rule 'plain' does not allow WebSocket upgrades")),
        "{out}"
    );
    let r = record_for(&lk, "/plain/ws");
    assert_eq!(r["decision"], "deny", "{r}");
    assert_eq!(r["reason"], "websocket_not_allowed", "{r}");
    assert_eq!(r["rule"], "plain", "{r}");
    assert!(r.get("websocket").is_none(), "{r}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(server.events_of("handshake").is_empty());
}

/// Toward the upstream: a secret bound to another host, and a placeholder under a rule that
/// does not enable them in messages, each close the socket (1008) before the message leaves;
/// a message over `--max-websocket-message` closes it with 1009. Each record says why.
#[test]
fn a_message_latchkey_will_not_forward_closes_the_socket_and_the_record_says_why() {
    let (server, lk) = world();

    let leak = client(
        &lk,
        server.port(),
        "/realtime/leak",
        json!(["hello", format!("my token is {OTHER}"), "after"]),
    );
    assert_eq!(leak["replies"], json!(["echo:hello"]), "{leak}");
    assert_eq!(leak["close_code"], 1008, "{leak}");
    assert_eq!(
        leak["close_reason"], "latchkey: secret_value_unbound",
        "{leak}"
    );
    let r = record_for(&lk, "/realtime/leak");
    assert_eq!(r["decision"], "deny", "{r}");
    assert_eq!(r["reason"], "secret_value_unbound", "{r}");
    assert_eq!(r["websocket"]["closed_by"], "latchkey", "{r}");
    assert_eq!(r["websocket"]["frames_up"], 1, "{r}");

    let strict = client(&lk, server.port(), "/strict/x", json!(["__LATCHKEY_key__"]));
    assert_eq!(strict["close_code"], 1008, "{strict}");
    assert_eq!(
        strict["close_reason"], "latchkey: placeholder_not_bound",
        "{strict}"
    );
    let r = record_for(&lk, "/strict/x");
    assert_eq!(r["reason"], "placeholder_not_bound", "{r}");

    let big = client(
        &lk,
        server.port(),
        "/realtime/big",
        json!(["x".repeat(100 * 1024)]),
    );
    assert_eq!(big["close_code"], 1009, "{big}");
    let r = record_for(&lk, "/realtime/big");
    assert_eq!(r["reason"], "body_too_large", "{r}");
    assert_eq!(r["websocket"]["frames_up"], 0, "{r}");

    // Neither the other token, a placeholder nor the big message ever reached the server.
    std::thread::sleep(Duration::from_millis(300));
    for e in server.events_of("message") {
        let text = e["text"].as_str().unwrap_or_default();
        assert!(!text.contains(OTHER), "{e}");
        assert!(!text.contains("__LATCHKEY_"), "{e}");
        assert!(text.len() < 1000, "{e}");
    }
    assert!(!lk.audit_text().contains(OTHER));
}

/// Under a rule with `mcp` and `websocket = true`, each message is matched like a POST body: a
/// denied `tools/call` (text or binary) is answered on the socket with a JSON-RPC error and
/// never reaches the upstream, an allowed one goes through, a `tools/list` answer comes back
/// filtered, and the socket's record lists every call with its refused flag. A message that is
/// not JSON-RPC, or holds ambiguous keys, closes the socket (1007, `bad_request`).
#[test]
fn mcp_rules_hold_over_websocket_messages() {
    let (server, lk) = world();
    let call = |id: u32, tool: &str, repo: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": tool, "arguments": {"repo": repo}}})
        .to_string()
    };
    let out = client(
        &lk,
        server.port(),
        "/mcp-ws/v1",
        json!([
            call(1, "search_code", "acme/w"),
            call(2, "delete_repository", "acme/w"),
            {"binary": call(3, "delete_repository", "acme/w")},
            call(4, "search_code", "evil/w"),
            r#"{"jsonrpc":"2.0","id":5,"METHOD":"tools/call","params":{"name":"delete_repository"}}"#,
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/list"}"#,
        ]),
    );
    let replies = out["replies"].as_array().expect("replies");
    assert_eq!(replies.len(), 6, "{out}");
    assert!(
        replies[0].as_str().is_some_and(|r| r.starts_with("echo:")),
        "{out}"
    );
    for (i, want) in [
        (1, "tool 'delete_repository' is denied"),
        (3, "argument 'repo'"),
        (4, "tool 'delete_repository' is denied"),
    ] {
        let v: Value = serde_json::from_str(replies[i].as_str().unwrap_or_default())
            .unwrap_or_else(|e| panic!("reply {i} is not JSON-RPC ({e}): {out}"));
        assert_eq!(v["error"]["data"]["reason"], "mcp_not_allowed", "{out}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(want)),
            "{out}"
        );
    }
    // The binary denied call was answered too (a text message, the JSON-RPC error).
    assert!(
        replies[2]
            .as_str()
            .is_some_and(|r| r.contains("mcp_not_allowed")),
        "{out}"
    );
    let listing: Value =
        serde_json::from_str(replies[5].as_str().unwrap_or_default()).expect("listing");
    assert_eq!(
        listing["result"]["tools"],
        json!([{"name": "search_code"}]),
        "{out}"
    );

    // The upstream saw the allowed call and the listing request only.
    let seen: Vec<String> = server
        .wait_events("message", 2)
        .into_iter()
        .map(|e| e["text"].as_str().unwrap_or_default().to_string())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let all = server.events_of("message");
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(
        seen[0].contains("search_code") && seen[1].contains("tools/list"),
        "{seen:?}"
    );
    assert!(
        all.iter()
            .all(|e| !e.to_string().contains("delete_repository")),
        "{all:?}"
    );

    let r = record_for(&lk, "/mcp-ws/v1");
    assert_eq!(r["reason"], "mcp_not_allowed", "{r}");
    assert_eq!(r["decision"], "deny", "{r}");
    assert_eq!(r["rule"], "mcp-ws", "{r}");
    assert_eq!(r["mcp"]["messages"], 6, "{r}");
    let refused: Vec<bool> = r["mcp"]["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| c["refused"] == true)
        .collect();
    assert_eq!(refused, [false, true, true, true, true, false], "{r}");
    assert_eq!(r["websocket"]["frames_up"], 2, "{r}");

    // Not JSON-RPC, or ambiguous keys: the socket closes before anything leaves.
    for (path, message) in [
        ("/mcp-ws/text", "hello"),
        (
            "/mcp-ws/ambiguous",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_code","Name":"delete_repository"}}"#,
        ),
    ] {
        let out = client(&lk, server.port(), path, json!([message]));
        assert_eq!(out["close_code"], 1007, "{path}: {out}");
        assert_eq!(
            out["close_reason"], "latchkey: bad_request",
            "{path}: {out}"
        );
        let r = record_for(&lk, path);
        assert_eq!(r["reason"], "bad_request", "{r}");
        assert_eq!(r["websocket"]["frames_up"], 0, "{r}");
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(server.events_of("message").len(), 2);
}

use std::net::SocketAddr;
use std::time::Duration;

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::audit::AuditLog;
use crate::policy::mcp::{NameGlobs, DEFAULT_METHODS};

fn rules(report: bool) -> Rules {
    let g = |v: &[&str], seg| {
        NameGlobs::new(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>(), seg).expect("globs")
    };
    Rules {
        rules: Arc::new(McpRules {
            tools: None,
            deny_tools: Some(g(&["delete_*"], false)),
            methods: g(DEFAULT_METHODS, false),
            args: vec![("repo".into(), g(&["acme/*"], true))],
            filter_list: true,
        }),
        rule: "gh".into(),
        report,
    }
}

/// Runs `f` with an entry, then returns the record it wrote.
fn with_entry(f: impl FnOnce(&mut Entry)) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a.jsonl");
    let log = Arc::new(AuditLog::open(&path).expect("open"));
    let client: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    let mut e = Entry::start(log.clone(), client, "default", "sha256:x");
    f(&mut e);
    e.finish();
    assert!(log.flush(Duration::from_secs(5)));
    let text = std::fs::read_to_string(&path).expect("read");
    serde_json::from_str(text.lines().next().expect("a record")).expect("json")
}

fn text(s: &str) -> Message {
    Message::Text(Utf8Bytes::from(s.to_string()))
}

#[test]
fn a_denied_call_is_answered_on_the_socket_and_recorded() {
    let record = with_entry(|e| {
        let mut s = Socket::new(rules(false));
        let allowed = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_issue","arguments":{"repo":"acme/x"}}}"#;
        assert!(matches!(s.up(text(allowed), e), Up::Forward(_)));
        let denied = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"delete_repository"}}"#;
        match s.up(Message::Binary(Bytes::from(denied)), e) {
            Up::Answered(Some(Message::Text(t))) => {
                let v: Value = serde_json::from_str(t.as_str()).expect("json");
                assert_eq!(v["id"], 2);
                assert_eq!(v["error"]["data"]["reason"], "mcp_not_allowed");
            }
            _ => panic!("a denied call is answered, not forwarded"),
        }
        // A refused notification: nothing to answer.
        let note = r#"{"jsonrpc":"2.0","method":"resources/updated"}"#;
        assert!(matches!(s.up(text(note), e), Up::Answered(None)));
        // Control frames are not JSON-RPC.
        assert!(matches!(
            s.up(Message::Ping(Bytes::new()), e),
            Up::Forward(_)
        ));
        s.record(e);
    });
    assert_eq!(record["reason"], "mcp_not_allowed", "{record}");
    assert_eq!(record["decision"], "deny", "{record}");
    assert_eq!(record["mcp"]["messages"], 3, "{record}");
    let refused: Vec<bool> = record["mcp"]["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| c["refused"].as_bool().unwrap_or(false))
        .collect();
    assert_eq!(refused, [false, true, true]);
    assert_eq!(record["mcp"]["calls"][1]["tool"], "delete_repository");
}

#[test]
fn what_is_not_json_rpc_or_is_ambiguous_closes_the_socket() {
    with_entry(|e| {
        for m in [
            "not json",
            "[]",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_issue","Name":"delete_repo"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","METHOD":"tools/call"}"#,
        ] {
            let mut s = Socket::new(rules(false));
            match s.up(text(m), e) {
                Up::Refuse(r) => assert_eq!(r.reason, Reason::BadRequest, "{m}"),
                _ => panic!("{m} was not refused"),
            }
        }
    });
}

#[test]
fn report_only_forwards_and_marks() {
    let record = with_entry(|e| {
        let mut s = Socket::new(rules(true));
        let denied =
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"delete_x"}}"#;
        assert!(matches!(s.up(text(denied), e), Up::Forward(_)));
        s.record(e);
    });
    assert_eq!(record["would_deny"], true, "{record}");
    assert_ne!(record["reason"], "mcp_not_allowed", "{record}");
}

#[test]
fn listings_coming_back_are_filtered_until_answered() {
    with_entry(|e| {
        let mut s = Socket::new(rules(false));
        let listing = r#"{"jsonrpc":"2.0","id":"l","result":{"tools":[{"name":"search"},{"name":"delete_repo"}]}}"#;
        // Nothing asked yet: passed on as it is.
        let m = s.down(text(listing)).expect("passes");
        assert!(m.to_text().expect("text").contains("delete_repo"));
        let ask = r#"{"jsonrpc":"2.0","id":"l","method":"tools/list"}"#;
        assert!(matches!(s.up(text(ask), e), Up::Forward(_)));
        // A notification first: not the answer, still waiting.
        assert!(s
            .down(text(r#"{"jsonrpc":"2.0","method":"notifications/x"}"#))
            .is_ok());
        // While waiting, what cannot be filtered closes the socket.
        let mut t = Socket::new(rules(false));
        assert!(matches!(t.up(text(ask), e), Up::Forward(_)));
        assert!(t.down(text("garbage")).is_err());
        let ambiguous =
            r#"{"jsonrpc":"2.0","id":"l","result":{"tools":[],"TOOLS":[{"name":"delete_repo"}]}}"#;
        assert!(t.down(text(ambiguous)).is_err());
        let m = s
            .down(Message::Binary(Bytes::from(listing)))
            .expect("filtered");
        let Message::Binary(b) = m else {
            panic!("binary stays binary")
        };
        let v: Value = serde_json::from_slice(&b).expect("json");
        assert_eq!(v["result"]["tools"], json!([{"name":"search"}]));
        // Answered: the next one is not filtered.
        let m = s.down(text(listing)).expect("passes");
        assert!(m.to_text().expect("text").contains("delete_repo"));
    });
}

#[test]
fn a_long_socket_keeps_its_refused_calls_in_the_record() {
    let record = with_entry(|e| {
        let mut s = Socket::new(rules(false));
        for id in 0..100 {
            let m = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
            assert!(matches!(s.up(text(&m), e), Up::Forward(_)));
        }
        let denied =
            r#"{"jsonrpc":"2.0","id":"d","method":"tools/call","params":{"name":"delete_x"}}"#;
        assert!(matches!(s.up(text(denied), e), Up::Answered(Some(_))));
        s.record(e);
    });
    assert_eq!(record["mcp"]["messages"], 101, "{record}");
    let calls = record["mcp"]["calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 64, "{record}");
    assert_eq!(calls[63]["tool"], "delete_x", "{record}");
    assert_eq!(calls[63]["refused"], true, "{record}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary upstream bytes while a listing is awaited: never a panic.
    #[test]
    fn arbitrary_upstream_messages_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut s = Socket::new(rules(false));
        s.pending.push(json!(1));
        let _ = s.down(Message::Binary(Bytes::from(body.clone())));
        if let Ok(t) = String::from_utf8(body) {
            let _ = s.down(text(&t));
        }
    }
}

//! MCP, whatever carries it: every JSON-RPC message a POST body (one, or a batch) or a
//! WebSocket message holds is read before anything is sent and matched against the rule's
//! `mcp` table (methods, tools, tool arguments: `policy::mcp`). A refused message is answered
//! in the protocol the agent speaks — a JSON-RPC error with the reason (HTTP 200, or a message
//! on the socket) — not with a 403 an MCP client cannot interpret. `tools/list` results are
//! filtered to the tools the rule allows (`mcp_list`); the WebSocket side is `mcp_socket`.
//!
//! The message is read as the loosest mainstream server would read it: keys are matched by
//! their canonical form (`wire::json_keys`: case folded, trailing NULs dropped), so `METHOD`
//! makes a request and `Name` names the tool, and an object with two keys of one canonical
//! form (`name` and `Name`, a key twice) is refused as ambiguous, at any depth: two parsers
//! may each take a different copy (latchkey the allowed tool, the server the other).

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::body;
use super::respond::{DECISION_HEADER, REASON_HEADER, RULE_HEADER};
use crate::audit::{Entry, McpCall, McpInfo};
use crate::policy::mcp::{ArgValue, McpRules};
use crate::reason::{Reason, Refusal};
use crate::upstream::Body;
use crate::wire::json_keys;

/// JSON-RPC error code of a message latchkey refused (the implementation-defined server range).
pub const REFUSED_CODE: i64 = -32001;

/// Most messages of one batch named in the audit record (the count is always complete).
const MAX_RECORDED: usize = 64;

/// Longest method or tool name kept in a record.
const MAX_NAME: usize = 200;

/// What the messages of one POST (or one WebSocket message) come to.
pub enum Inspected {
    /// Every message may go; `list_ids` are the ids of its `tools/list` requests.
    Forward { info: McpInfo, list_ids: Vec<Value> },
    /// At least one may not: nothing is sent. `answer` is the JSON-RPC error (one object, or a
    /// batch), `None` when only notifications were refused (nothing to answer).
    Refuse {
        info: McpInfo,
        message: String,
        answer: Option<Bytes>,
    },
}

/// Reads and matches the messages of one POST body or WebSocket message to an MCP rule.
///
/// Assumes: `body` is the whole body or message. Guarantees: `Forward` only when every
/// message is well formed, unambiguous and allowed; one that is not JSON-RPC, or holds an
/// object with ambiguous keys, is a `bad_request` refusal.
pub fn inspect(rules: &McpRules, rule: &str, body: &[u8]) -> Result<Inspected, Refusal> {
    let bad = |why: String| {
        Refusal::new(
            Reason::BadRequest,
            format!("not an MCP JSON-RPC message: {why}"),
        )
    };
    json_keys::check_unambiguous(body).map_err(bad)?;
    let value: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
    let (batch, messages) = match value {
        Value::Array(items) if items.is_empty() => return Err(bad("an empty batch".into())),
        Value::Array(items) => (true, items),
        other => (false, vec![other]),
    };
    let mut info = McpInfo {
        messages: messages.len() as u64,
        calls: Vec::new(),
    };
    let mut list_ids = Vec::new();
    let mut verdicts: Vec<(Option<Value>, Option<String>)> = Vec::with_capacity(messages.len());
    for m in &messages {
        let obj = m
            .as_object()
            .ok_or_else(|| bad(format!("a message is {}, not an object", kind(m))))?;
        // Keys by their canonical form: `METHOD` makes a request as surely as `method`.
        let id = json_keys::get(obj, "id").cloned();
        let (method, tool, verdict) = match json_keys::get(obj, "method") {
            // A response (to a request the server sent): nothing to match.
            None if ["result", "error"]
                .iter()
                .any(|k| json_keys::get(obj, k).is_some()) =>
            {
                (None, None, Ok(()))
            }
            None => return Err(bad("a message has no method, result or error".into())),
            Some(Value::String(method)) => {
                let (tool, verdict) = judge(rules, method, json_keys::get(obj, "params"));
                if method == "tools/list" && verdict.is_ok() {
                    list_ids.extend(id.clone());
                }
                (Some(method.clone()), tool, verdict)
            }
            Some(other) => return Err(bad(format!("method is {}, not a string", kind(other)))),
        };
        if info.calls.len() < MAX_RECORDED {
            info.calls.push(McpCall {
                method,
                tool,
                refused: verdict.is_err(),
            });
        }
        verdicts.push((id, verdict.err()));
    }
    let Some(first) = verdicts.iter().find_map(|(_, why)| why.clone()) else {
        return Ok(Inspected::Forward { info, list_ids });
    };
    let message = format!("latchkey: rule '{rule}': {first}");
    let mut errors: Vec<Value> = verdicts
        .into_iter()
        .filter_map(|(id, why)| {
            // Notifications get no answer (JSON-RPC 2.0 §4.1).
            let id = id.filter(|i| !i.is_null())?;
            let text = match why {
                Some(w) => format!("latchkey: rule '{rule}': {w}"),
                None => "latchkey: not sent: another message in this batch was refused".into(),
            };
            Some(json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": {
                    "code": REFUSED_CODE,
                    "message": text,
                    "data": {"reason": Reason::McpNotAllowed.code(), "rule": rule},
                },
            }))
        })
        .collect();
    let answer = match errors.len() {
        0 => None,
        1 if !batch => errors.pop().map(|e| Bytes::from(e.to_string())),
        _ => Some(Bytes::from(Value::Array(errors).to_string())),
    };
    Ok(Inspected::Refuse {
        info,
        message,
        answer,
    })
}

/// Matches one request or notification; returns the tool it calls, if any, and the verdict.
fn judge(
    rules: &McpRules,
    method: &str,
    params: Option<&Value>,
) -> (Option<String>, Result<(), String>) {
    if let Err(why) = rules.method(method) {
        return (None, Err(why));
    }
    if method != "tools/call" {
        return (None, Ok(()));
    }
    let Some(name) = params
        .and_then(|p| json_keys::field(p, "name"))
        .and_then(Value::as_str)
    else {
        return (None, Err("tools/call names no tool (params.name)".into()));
    };
    let arguments = params.and_then(|p| json_keys::field(p, "arguments"));
    if arguments.is_some_and(|a| !a.is_object() && !a.is_null()) {
        return (
            Some(name.to_string()),
            Err(format!("tool '{name}': arguments are not an object")),
        );
    }
    let verdict = rules.call(name, |arg| {
        match arguments.and_then(|a| json_keys::field(a, arg)) {
            None => ArgValue::Absent,
            Some(Value::String(s)) => ArgValue::Str(s),
            Some(_) => ArgValue::Other,
        }
    });
    (Some(name.to_string()), verdict)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The HTTP answer to a refused POST: the JSON-RPC errors [`inspect`] built, or `202` when
/// only notifications were refused (nothing to answer).
pub fn refused_response(rule: &str, answer: Option<Bytes>) -> Response<Body> {
    let (status, body) = match answer {
        None => (StatusCode::ACCEPTED, Bytes::new()),
        Some(errors) => (StatusCode::OK, errors),
    };
    let mut res = Response::new(body::full(body));
    *res.status_mut() = status;
    let h = res.headers_mut();
    if status == StatusCode::OK {
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    h.insert(DECISION_HEADER, HeaderValue::from_static("deny"));
    h.insert(REASON_HEADER, HeaderValue::from_static("mcp_not_allowed"));
    if let Ok(v) = HeaderValue::from_str(rule) {
        h.insert(RULE_HEADER, v);
    }
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    res
}

/// Method and tool names are the sandbox's text: in the record they are scrubbed of secret
/// values like the path, then cut to [`MAX_NAME`] characters.
pub fn for_the_record(mut info: McpInfo, entry: &Entry) -> McpInfo {
    let clean = |s: &mut String| {
        // Scrubbed whole first: a cut could leave a secret's prefix the scrubber misses.
        *s = entry.scrub_text(s);
        if let Some((i, _)) = s.char_indices().nth(MAX_NAME) {
            s.truncate(i);
            s.push('…');
        }
    };
    for call in &mut info.calls {
        if let Some(m) = call.method.as_mut() {
            clean(m);
        }
        if let Some(t) = call.tool.as_mut() {
            clean(t);
        }
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::mcp::{NameGlobs, DEFAULT_METHODS};

    fn rules() -> McpRules {
        let g = |v: &[&str], seg| {
            NameGlobs::new(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>(), seg)
                .expect("globs")
        };
        McpRules {
            tools: Some(g(&["search_*", "get_issue"], false)),
            deny_tools: Some(g(&["delete_*"], false)),
            methods: g(DEFAULT_METHODS, false),
            args: vec![("repo".into(), g(&["acme/*"], true))],
            filter_list: true,
        }
    }

    fn refused(body: &str) -> (String, Value) {
        match inspect(&rules(), "gh", body.as_bytes()).expect("parses") {
            Inspected::Refuse {
                message, answer, ..
            } => (
                message,
                answer
                    .and_then(|a| serde_json::from_slice(&a).ok())
                    .unwrap_or(Value::Null),
            ),
            Inspected::Forward { .. } => panic!("forwarded: {body}"),
        }
    }

    #[test]
    fn allowed_messages_go_and_tools_list_ids_are_kept() {
        let body = r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"},
                       {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_issue","arguments":{"repo":"acme/w"}}},
                       {"jsonrpc":"2.0","method":"notifications/initialized"},
                       {"jsonrpc":"2.0","id":9,"result":{}}]"#;
        match inspect(&rules(), "gh", body.as_bytes()).expect("parses") {
            Inspected::Forward { info, list_ids } => {
                assert_eq!(list_ids, vec![json!(1)]);
                assert_eq!(info.messages, 4);
                assert_eq!(info.calls[1].tool.as_deref(), Some("get_issue"));
            }
            Inspected::Refuse { message, .. } => panic!("refused: {message}"),
        }
    }

    #[test]
    fn a_refused_call_is_a_json_rpc_error_naming_the_tool_and_the_batch_goes_nowhere() {
        let (message, v) = refused(
            r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"delete_repo"}}"#,
        );
        assert!(
            message.contains("tool 'delete_repo' is denied"),
            "{message}"
        );
        assert_eq!(v["id"], "a");
        assert_eq!(v["error"]["code"], REFUSED_CODE);
        assert_eq!(v["error"]["data"]["reason"], "mcp_not_allowed");

        let (_, v) = refused(
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"},
                {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_issue","arguments":{"repo":"evil/x"}}}]"#,
        );
        let v = v.as_array().expect("batch");
        assert_eq!(v.len(), 2);
        assert!(v[0]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("another message")));
        assert!(v[1]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("argument 'repo'")));

        let (m, _) = refused(r#"{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{}}"#);
        assert!(m.contains("method 'resources/read' is not allowed"), "{m}");
        let (m, _) = refused(r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{}}"#);
        assert!(m.contains("names no tool"), "{m}");
    }

    #[test]
    fn duplicate_keys_and_malformed_messages_are_bad_requests() {
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_issue","name":"delete_repo"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_issue","n\u0061me":"delete_repo"}}"#,
            r#"[]"#,
            r#"[1]"#,
            r#"{"method": 7}"#,
            "not json",
            r#"{"jsonrpc":"2.0"} trailing"#,
        ] {
            let r = inspect(&rules(), "gh", body.as_bytes())
                .err()
                .unwrap_or_else(|| panic!("accepted {body}"));
            assert_eq!(r.reason, Reason::BadRequest, "{body}");
        }
    }

    #[test]
    fn ambiguous_keys_at_every_depth_the_rules_read_are_bad_requests() {
        for body in [
            // The message's own keys.
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","METHOD":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":1,"id\u0000":2,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","Jsonrpc":"1.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_issue"},"Params":{"name":"delete_repo"}}"#,
            // params.name, folded every way a loose parser folds.
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_issue","Name":"delete_repo"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_issue","name\u0000":"delete_repo"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_issue","arguments":{},"argument\u017f":{"repo":"evil/x"}}}"#,
            // Arguments the globs read, and objects nested in them.
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_issue","arguments":{"repo":"acme/w","Repo":"evil/x"}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_issue","arguments":{"q":{"k":1,"\u212a":2}}}}"#,
        ] {
            let r = inspect(&rules(), "gh", body.as_bytes())
                .err()
                .unwrap_or_else(|| panic!("accepted {body}"));
            assert_eq!(r.reason, Reason::BadRequest, "{body}");
            assert!(r.message.contains("ambiguous"), "{body}: {}", r.message);
        }
    }

    #[test]
    fn keys_are_read_by_their_canonical_form() {
        // `METHOD` makes a request: matched, not forwarded as a response.
        let (m, _) = refused(
            r#"{"jsonrpc":"2.0","id":1,"METHOD":"tools/call","params":{"name":"delete_repo"}}"#,
        );
        assert!(m.contains("tool 'delete_repo' is denied"), "{m}");
        let (m, _) = refused(
            r#"{"jsonrpc":"2.0","id":1,"Method":"tools/call","PARAMS":{"NAME":"delete_repo"}}"#,
        );
        assert!(m.contains("tool 'delete_repo' is denied"), "{m}");
        let (m, _) = refused(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name\u0000":"delete_repo"}}"#,
        );
        assert!(m.contains("tool 'delete_repo' is denied"), "{m}");
        // An argument the glob reads, under another case.
        let (m, _) = refused(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_issue","arguments":{"REPO":"evil/x"}}}"#,
        );
        assert!(m.contains("argument 'repo'"), "{m}");
        // A message with no method, result or error is neither request nor response.
        let r = inspect(&rules(), "gh", br#"{"jsonrpc":"2.0","id":1,"params":{}}"#)
            .err()
            .expect("refused");
        assert_eq!(r.reason, Reason::BadRequest);
        match inspect(
            &rules(),
            "gh",
            br#"{"jsonrpc":"2.0","ID":7,"METHOD":"tools/list"}"#,
        ) {
            Ok(Inspected::Forward { list_ids, .. }) => assert_eq!(list_ids, vec![json!(7)]),
            _ => panic!("a folded tools/list is forwarded"),
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Arbitrary bytes never panic the request side, and whatever is forwarded parsed.
        #[test]
        fn arbitrary_messages_never_panic(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            if let Ok(Inspected::Forward { .. }) = inspect(&rules(), "gh", &body) {
                proptest::prop_assert!(serde_json::from_slice::<Value>(&body).is_ok());
            }
        }
    }
}

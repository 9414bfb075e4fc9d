//! MCP over streamable HTTP: every JSON-RPC message a POST carries (one, or a batch) is read
//! before anything is sent and matched against the rule's `mcp` table (methods, tools, tool
//! arguments: `policy::mcp`). A refused message is answered in the protocol the agent speaks —
//! a JSON-RPC error with the reason, HTTP 200 — not with a 403 an MCP client cannot interpret.
//! `tools/list` results (JSON or SSE) can be filtered to the tools the rule allows.
//!
//! The body is parsed as strict JSON: a duplicated key anywhere is refused, since two parsers
//! may each take a different copy (latchkey the allowed tool, the server the other).

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Response, StatusCode};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{json, Value};

use super::body;
use super::respond::{DECISION_HEADER, REASON_HEADER, RULE_HEADER};
use crate::audit::{McpCall, McpInfo};
use crate::policy::mcp::{ArgValue, McpRules};
use crate::reason::{Reason, Refusal};
use crate::upstream::{Body, BoxError};

/// JSON-RPC error code of a message latchkey refused (the implementation-defined server range).
pub const REFUSED_CODE: i64 = -32001;

/// Most messages of one batch named in the audit record (the count is always complete).
const MAX_RECORDED: usize = 64;

/// Largest `tools/list` response (a JSON body, or one SSE event) held to be filtered.
const MAX_LIST: usize = 8 * 1024 * 1024;

/// What the messages of one POST come to.
pub enum Inspected {
    /// Every message may go; `list_ids` are the ids of its `tools/list` requests.
    Forward { info: McpInfo, list_ids: Vec<Value> },
    /// At least one may not: nothing is sent, the agent gets `response`.
    Refuse {
        info: McpInfo,
        message: String,
        response: Response<Body>,
    },
}

/// Reads and matches the messages of one POST to an MCP rule.
///
/// Assumes: `body` is the whole request body. Guarantees: `Forward` only when every message is
/// well formed and allowed; a body that is not strict JSON-RPC is a `bad_request` refusal.
pub fn inspect(rules: &McpRules, rule: &str, body: &[u8]) -> Result<Inspected, Refusal> {
    let bad = |why: String| {
        Refusal::new(
            Reason::BadRequest,
            format!("not an MCP JSON-RPC message: {why}"),
        )
    };
    no_duplicate_keys(body).map_err(bad)?;
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
        let id = obj.get("id").cloned();
        let (method, tool, verdict) = match obj.get("method") {
            // A response (to a request the server sent): nothing to match.
            None => (None, None, Ok(())),
            Some(Value::String(method)) => {
                let (tool, verdict) = judge(rules, method, obj.get("params"));
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
    let errors: Vec<Value> = verdicts
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
    let response = answer(rule, batch, errors);
    Ok(Inspected::Refuse {
        info,
        message,
        response,
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
    let Some(name) = params.and_then(|p| p.get("name")).and_then(Value::as_str) else {
        return (None, Err("tools/call names no tool (params.name)".into()));
    };
    let arguments = params.and_then(|p| p.get("arguments"));
    if arguments.is_some_and(|a| !a.is_object() && !a.is_null()) {
        return (
            Some(name.to_string()),
            Err(format!("tool '{name}': arguments are not an object")),
        );
    }
    let verdict = rules.call(name, |arg| match arguments.and_then(|a| a.get(arg)) {
        None => ArgValue::Absent,
        Some(Value::String(s)) => ArgValue::Str(s),
        Some(_) => ArgValue::Other,
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

/// The answer to a refused POST: the errors as one object or a batch, or `202` when only
/// notifications were refused (nothing to answer).
fn answer(rule: &str, batch: bool, mut errors: Vec<Value>) -> Response<Body> {
    let (status, body) = match errors.len() {
        0 => (StatusCode::ACCEPTED, Bytes::new()),
        1 if !batch => (
            StatusCode::OK,
            Bytes::from(errors.pop().map(|e| e.to_string()).unwrap_or_default()),
        ),
        _ => (
            StatusCode::OK,
            Bytes::from(Value::Array(errors).to_string()),
        ),
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

/// Refuses JSON with a key twice in one object, at any depth (escapes undone first).
fn no_duplicate_keys(bytes: &[u8]) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    Strict.deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())
}

/// A visitor that walks any JSON value and fails on a duplicated object key.
#[derive(Clone, Copy)]
struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Strict)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!(
                    "key {key:?} appears twice in one object"
                )));
            }
            map.next_value_seed(Strict)?;
        }
        Ok(())
    }
}

/// The response to a POST that held `tools/list` requests, with their results filtered to the
/// tools `rules` allows; JSON is held whole, SSE one event at a time (each at most 8 MiB).
pub fn filter_list(res: Response<Body>, rules: Arc<McpRules>, ids: Vec<Value>) -> Response<Body> {
    let content_type = res
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    let mode = match content_type.as_str() {
        "application/json" => Mode::Json,
        "text/event-stream" => Mode::Sse,
        _ => return res,
    };
    // A coding latchkey did not undo hides the tools: the listing is cut off, not passed on.
    let encoded = res
        .headers()
        .get(http::header::CONTENT_ENCODING)
        .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    let (mut parts, inner) = res.into_parts();
    parts.headers.remove(CONTENT_LENGTH);
    let filter = ListFilter {
        inner,
        mode,
        rules,
        ids,
        buf: BytesMut::new(),
        scanned: 0,
        done: false,
        encoded,
    };
    Response::from_parts(parts, filter.boxed())
}

#[derive(Clone, Copy)]
enum Mode {
    Json,
    Sse,
}

struct ListFilter {
    inner: Body,
    mode: Mode,
    rules: Arc<McpRules>,
    ids: Vec<Value>,
    buf: BytesMut,
    /// How far `buf` is known to hold no event end: each frame is searched once, not the
    /// whole buffer again (an 8 MiB event in small frames would be quadratic).
    scanned: usize,
    done: bool,
    /// The body is in a content coding: it cannot be filtered, so it is not sent.
    encoded: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("a tools/list response in a content coding cannot be filtered")]
struct Encoded;

#[derive(Debug, thiserror::Error)]
#[error("a tools/list response over {MAX_LIST} bytes cannot be filtered")]
struct TooLarge;

impl ListFilter {
    /// Removes disallowed tools from every `tools/list` result in `v` (one message or a
    /// batch) answering one of our ids; whether anything changed.
    fn filter_value(&self, v: &mut Value) -> bool {
        let mut changed = false;
        let mut one = |m: &mut Value| {
            let ours = m.get("id").is_some_and(|id| self.ids.contains(id));
            if !ours {
                return;
            }
            if let Some(tools) = m
                .get_mut("result")
                .and_then(|r| r.get_mut("tools"))
                .and_then(Value::as_array_mut)
            {
                let before = tools.len();
                tools.retain(|t| {
                    t.get("name")
                        .and_then(Value::as_str)
                        .is_some_and(|n| self.rules.tool(n).is_ok())
                });
                changed |= tools.len() != before;
            }
        };
        match v {
            Value::Array(items) => items.iter_mut().for_each(&mut one),
            other => one(other),
        }
        changed
    }

    fn filter_json(&self, bytes: &[u8]) -> Bytes {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(mut v) => {
                if self.filter_value(&mut v) {
                    Bytes::from(v.to_string())
                } else {
                    Bytes::copy_from_slice(bytes)
                }
            }
            _ => Bytes::copy_from_slice(bytes),
        }
    }

    /// One SSE event (its lines, without the blank line that ends it), filtered.
    fn filter_event(&self, event: &[u8]) -> Bytes {
        let text = String::from_utf8_lossy(event);
        let mut data = String::new();
        let mut others = Vec::new();
        for line in text.split('\n') {
            let line = line.strip_suffix('\r').unwrap_or(line);
            match line.strip_prefix("data:") {
                Some(d) => {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(d.strip_prefix(' ').unwrap_or(d));
                }
                None => others.push(line),
            }
        }
        let Ok(mut v) = serde_json::from_str::<Value>(&data) else {
            return Bytes::copy_from_slice(event);
        };
        if !self.filter_value(&mut v) {
            return Bytes::copy_from_slice(event);
        }
        let mut out = String::new();
        for line in others {
            out.push_str(line);
            out.push('\n');
        }
        out.push_str("data: ");
        out.push_str(&v.to_string());
        Bytes::from(out)
    }

    /// The next whole SSE event in the buffer, with its terminator, if one has arrived.
    fn next_event(&mut self) -> Option<Bytes> {
        // A terminator may straddle the last search's end: back up by its length less one.
        let from = self.scanned.saturating_sub(3);
        let Some((at, term)) = find_event_end(&self.buf[from..]) else {
            self.scanned = self.buf.len();
            return None;
        };
        let end = from + at;
        self.scanned = 0;
        let event = self.buf.split_to(end + term);
        let mut out = BytesMut::from(&self.filter_event(&event[..end])[..]);
        out.extend_from_slice(&event[end..]);
        Some(out.freeze())
    }
}

/// Where the first event ends: the blank line (`\n\n`, `\r\n\r\n`, `\r\r`) and its length.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' && buf[i + 1] == b'\n' {
            return Some((i, 2));
        }
        if buf[i..].starts_with(b"\r\n\r\n") {
            return Some((i, 4));
        }
        i += 1;
    }
    None
}

impl HttpBody for ListFilter {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.encoded {
            return Poll::Ready(Some(Err(Box::new(Encoded))));
        }
        loop {
            if let Mode::Sse = self.mode {
                if let Some(event) = self.next_event() {
                    return Poll::Ready(Some(Ok(Frame::data(event))));
                }
            }
            if self.done {
                if self.buf.is_empty() {
                    return Poll::Ready(None);
                }
                let rest = self.buf.split().freeze();
                let out = match self.mode {
                    Mode::Json => self.filter_json(&rest),
                    Mode::Sse => self.filter_event(&rest),
                };
                return Poll::Ready(Some(Ok(Frame::data(out))));
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => self.done = true,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        if self.buf.len() + data.len() > MAX_LIST {
                            return Poll::Ready(Some(Err(Box::new(TooLarge))));
                        }
                        self.buf.extend_from_slice(&data);
                    }
                    // Trailers end the body: what is held goes first.
                    Err(frame) => {
                        self.done = true;
                        if !self.buf.is_empty() {
                            let rest = self.buf.split().freeze();
                            let out = match self.mode {
                                Mode::Json => self.filter_json(&rest),
                                Mode::Sse => self.filter_event(&rest),
                            };
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                        return Poll::Ready(Some(Ok(frame)));
                    }
                },
            }
        }
    }
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
                message, response, ..
            } => {
                let bytes = futures_body(response);
                (
                    message,
                    serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                )
            }
            Inspected::Forward { .. } => panic!("forwarded: {body}"),
        }
    }

    fn futures_body(res: Response<Body>) -> Bytes {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async { res.into_body().collect().await.expect("body").to_bytes() })
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
    fn tools_list_results_are_filtered_in_json_and_in_sse() {
        let f = ListFilter {
            inner: body::empty(),
            mode: Mode::Sse,
            rules: Arc::new(rules()),
            ids: vec![json!(1)],
            buf: BytesMut::new(),
            scanned: 0,
            done: false,
            encoded: false,
        };
        let json = br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"search_code"},{"name":"delete_repo"},{"name":"create_issue"}]}}"#;
        let out: Value = serde_json::from_slice(&f.filter_json(json)).expect("json");
        assert_eq!(out["result"]["tools"], json!([{"name":"search_code"}]));
        // Another id is left alone.
        let other = br#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"delete_repo"}]}}"#;
        assert_eq!(&f.filter_json(other)[..], &other[..]);
        let event = format!("event: message\ndata: {}", String::from_utf8_lossy(json));
        let out = f.filter_event(event.as_bytes());
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("event: message\ndata: "), "{text}");
        assert!(!text.contains("delete_repo"), "{text}");
        assert_eq!(find_event_end(b"data: x\n\nrest"), Some((7, 2)));
        // An event whose blank line arrives split across frames is still found once whole.
        let mut f = f;
        f.buf.extend_from_slice(b"data: {\"id\":5}\r\n\r");
        assert!(f.next_event().is_none());
        f.buf.extend_from_slice(b"\nevent: next");
        let event = f.next_event().expect("event");
        assert_eq!(&event[..], b"data: {\"id\":5}\r\n\r\n");
        assert_eq!(&f.buf[..], b"event: next");
        assert!(f.next_event().is_none());
        assert_eq!(find_event_end(b"data: x\r\n\r\n"), Some((7, 4)));
    }
}

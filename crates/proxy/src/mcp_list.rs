//! `tools/list` results filtered to the tools a rule's `mcp` allows, on their way back to the
//! sandbox: the answer to a POST that held `tools/list` requests ([`filter_list`]), and the
//! messages of a WebSocket ([`filter_document`], from `mcp_socket`).
//!
//! Fail closed: an answer latchkey cannot read the way a client might is cut off, never passed
//! on whole. The body is read by its media-type family — JSON (`application/json`,
//! `application/json-rpc`, any `+json`) whole, an event stream (`text/event-stream`) one
//! event at a time with the proxy's one parser (`wire::sse`, every line ending, a last event
//! without its blank line flushed) — and any other type, a content coding latchkey did not
//! undo, more than one `Content-Type`, a document that is not JSON, or one with ambiguous keys
//! (`wire::json_keys`) ends the body with an error instead. A document or event is held to at
//! most [`MAX_LIST`] bytes.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Response};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use serde_json::Value;

use crate::policy::mcp::McpRules;
use crate::upstream::{Body, BoxError};
use crate::wire::{json_keys, sse};

/// Largest `tools/list` response (a JSON body, or one SSE event) held to be filtered.
pub const MAX_LIST: usize = 8 * 1024 * 1024;

/// Why a listing was cut off.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unfilterable {
    #[error("a tools/list response in a content coding cannot be filtered")]
    Encoded,
    #[error(
        "a tools/list response of type {0:?} cannot be filtered (JSON or an event stream only)"
    )]
    MediaType(String),
    #[error("a tools/list response over {MAX_LIST} bytes cannot be filtered")]
    TooLarge,
    #[error("a tools/list response is not JSON latchkey can read: {0}")]
    NotJson(String),
}

/// A document filtered: its bytes when something was removed, and which of the ids it answered.
#[derive(Debug, Default)]
pub struct Filtered {
    pub changed: Option<Vec<u8>>,
    pub answered: Vec<Value>,
}

/// Filters one JSON-RPC document (a message or a batch): removes the tools `rules` refuses
/// from every `tools/list` result answering one of `ids`, reading keys as a loose client would.
///
/// Errors: not JSON, or an object with ambiguous keys (a client could read another copy).
pub fn filter_document(
    bytes: &[u8],
    rules: &McpRules,
    ids: &[Value],
) -> Result<Filtered, Unfilterable> {
    json_keys::check_unambiguous(bytes).map_err(Unfilterable::NotJson)?;
    let mut v: Value =
        serde_json::from_slice(bytes).map_err(|e| Unfilterable::NotJson(e.to_string()))?;
    let mut out = Filtered::default();
    let mut changed = false;
    let mut one = |m: &mut Value| {
        let Some(obj) = m.as_object_mut() else { return };
        let Some(id) = json_keys::get(obj, "id").filter(|id| ids.contains(id)) else {
            return;
        };
        out.answered.push(id.clone());
        let Some(tools) = json_keys::get_mut(obj, "result")
            .and_then(Value::as_object_mut)
            .and_then(|r| json_keys::get_mut(r, "tools"))
            .and_then(Value::as_array_mut)
        else {
            return;
        };
        let before = tools.len();
        tools.retain(|t| {
            json_keys::field(t, "name")
                .and_then(Value::as_str)
                .is_some_and(|n| rules.tool(n).is_ok())
        });
        changed |= tools.len() != before;
    };
    match &mut v {
        Value::Array(items) => items.iter_mut().for_each(&mut one),
        other => one(other),
    }
    if changed {
        out.changed = Some(v.to_string().into_bytes());
    }
    Ok(out)
}

/// How a listing's body is read, by its media-type family.
#[derive(Debug)]
enum Mode {
    Json,
    Sse,
    /// Not a type a listing is filtered in: any byte of it ends the body.
    Refuse(Unfilterable),
}

/// The mode for a response's headers.
fn mode(headers: &HeaderMap) -> Mode {
    let encoded = headers
        .get_all(CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    if encoded {
        return Mode::Refuse(Unfilterable::Encoded);
    }
    let types: Vec<&[u8]> = headers
        .get_all(CONTENT_TYPE)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    let [one] = types[..] else {
        let shown = types
            .iter()
            .map(|t| String::from_utf8_lossy(t).into_owned())
            .collect::<Vec<_>>()
            .join(", ");
        return Mode::Refuse(Unfilterable::MediaType(shown));
    };
    let text = String::from_utf8_lossy(one);
    let essence = text
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json"
        || essence == "application/json-rpc"
        || (essence.ends_with("+json") && essence.contains('/'))
    {
        Mode::Json
    } else if sse::is_event_stream(&text) {
        Mode::Sse
    } else {
        Mode::Refuse(Unfilterable::MediaType(text.chars().take(100).collect()))
    }
}

/// The response to a POST that held `tools/list` requests, with their results filtered to the
/// tools `rules` allows; JSON is held whole, SSE one event at a time (each at most
/// [`MAX_LIST`]); what cannot be filtered is cut off.
pub fn filter_list(res: Response<Body>, rules: Arc<McpRules>, ids: Vec<Value>) -> Response<Body> {
    let mode = mode(res.headers());
    let (mut parts, inner) = res.into_parts();
    parts.headers.remove(CONTENT_LENGTH);
    let filter = ListFilter {
        inner,
        mode,
        rules,
        ids,
        buf: BytesMut::new(),
        parser: sse::Parser::new(sse::Limits {
            max_data: MAX_LIST,
            max_raw: Some(MAX_LIST),
        }),
        out: BytesMut::new(),
        trailers: None,
        done: false,
    };
    Response::from_parts(parts, filter.boxed())
}

struct ListFilter {
    inner: Body,
    mode: Mode,
    rules: Arc<McpRules>,
    ids: Vec<Value>,
    /// A JSON body, held whole.
    buf: BytesMut,
    parser: sse::Parser,
    /// Filtered bytes ready to go.
    out: BytesMut,
    trailers: Option<HeaderMap>,
    done: bool,
}

impl ListFilter {
    /// Takes a frame's bytes; filtered output lands in `out`.
    fn take(&mut self, data: &[u8]) -> Result<(), Unfilterable> {
        match &self.mode {
            Mode::Json => {
                if self.buf.len() + data.len() > MAX_LIST {
                    return Err(Unfilterable::TooLarge);
                }
                self.buf.extend_from_slice(data);
                Ok(())
            }
            Mode::Sse => {
                let Self {
                    parser,
                    rules,
                    ids,
                    out,
                    ..
                } = self;
                let mut failed = None;
                parser
                    .feed(data, &mut |e| {
                        if failed.is_none() {
                            failed = filter_event(e, rules, ids, out).err();
                        }
                    })
                    .map_err(|_| Unfilterable::TooLarge)?;
                failed.map_or(Ok(()), Err)
            }
            Mode::Refuse(_) if data.is_empty() => Ok(()),
            Mode::Refuse(why) => Err(why.clone()),
        }
    }

    /// The body has ended: what is held is filtered.
    fn finish(&mut self) -> Result<(), Unfilterable> {
        match self.mode {
            Mode::Json if self.buf.is_empty() => Ok(()),
            Mode::Json => {
                let whole = self.buf.split().freeze();
                let filtered = filter_document(&whole, &self.rules, &self.ids)?;
                match filtered.changed {
                    Some(bytes) => self.out.extend_from_slice(&bytes),
                    None => self.out.extend_from_slice(&whole),
                }
                Ok(())
            }
            Mode::Sse => {
                let Self {
                    parser,
                    rules,
                    ids,
                    out,
                    ..
                } = self;
                let mut failed = None;
                parser
                    .finish(&mut |e| {
                        if failed.is_none() {
                            failed = filter_event(e, rules, ids, out).err();
                        }
                    })
                    .map_err(|_| Unfilterable::TooLarge)?;
                failed.map_or(Ok(()), Err)
            }
            Mode::Refuse(_) => Ok(()),
        }
    }
}

/// One event, filtered into `out`: passed as it came unless its data is a listing to filter;
/// then its other lines are kept and its data replaced, ending as it ended.
fn filter_event(
    e: sse::Event<'_>,
    rules: &McpRules,
    ids: &[Value],
    out: &mut BytesMut,
) -> Result<(), Unfilterable> {
    if e.oversized {
        return Err(Unfilterable::TooLarge);
    }
    let Some(data) = e.data.filter(|d| !d.trim_ascii().is_empty()) else {
        out.extend_from_slice(e.raw);
        return Ok(());
    };
    let Some(json) = filter_document(data, rules, ids)?.changed else {
        out.extend_from_slice(e.raw);
        return Ok(());
    };
    out.extend_from_slice(&e.raw[..e.carried]);
    let (lines, end) = e.lines();
    for (line, data) in lines {
        if !data {
            out.extend_from_slice(line);
            out.extend_from_slice(b"\n");
        }
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(&json);
    out.extend_from_slice(b"\n");
    out.extend_from_slice(end);
    Ok(())
}

impl HttpBody for ListFilter {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if !self.out.is_empty() {
                let out = self.out.split().freeze();
                return Poll::Ready(Some(Ok(Frame::data(out))));
            }
            if self.done {
                return Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            let step = match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.done = true;
                    self.finish()
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => self.take(&data),
                    // Trailers end the body: what is held goes first.
                    Err(frame) => {
                        self.done = true;
                        self.trailers = frame.into_trailers().ok();
                        self.finish()
                    }
                },
            };
            if let Err(e) = step {
                self.done = true;
                self.out.clear();
                self.trailers = None;
                return Poll::Ready(Some(Err(Box::new(e))));
            }
        }
    }
}

#[cfg(test)]
#[path = "mcp_list_tests.rs"]
mod tests;

//! Correlation the sandbox sends with a request, and what of it goes upstream.
//!
//! - `session`: the value of the session header (`--session-header`, default
//!   `x-latchkey-session`);
//! - `step`: `x-latchkey-step` if sent, else `<trace-id>-<parent-id>` of a valid W3C
//!   `traceparent`: a retried step sends the same one again;
//! - `attempt`: 1 for the first request of a step this process sees, 2 for the next with the
//!   same (identity, session, step), …; counted in a bounded map (100k steps, each forgotten an
//!   hour after its last request);
//! - trace context: with a valid `traceparent`, or with `--otlp` (`propagate_trace`), latchkey
//!   makes its own span id for the request (and a fresh trace id when none arrived).
//!
//! Values are taken only when sent once, at most [`MAX_VALUE_LEN`] bytes of visible ASCII;
//! anything else is ignored, never an error. A secret value pasted into one is replaced by the
//! record's scrub before anything keeps it, and a `traceparent` holding one is ignored.
//!
//! Upstream ([`Correlator::forward`]): the session and step headers are stripped unless the
//! rule's `keep_headers` names them; with `propagate_trace`, `traceparent` becomes
//! `00-<trace-id>-<latchkey's span id>-<flags>` and `tracestate` passes through when the trace
//! was the sandbox's; without, both are stripped unless kept (then sent on unchanged).

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use http::header::{self, HeaderName, HeaderValue};
use http::HeaderMap;

use crate::audit::{new_id, Record};
use crate::secrets::inject::AUTH_HEADERS;
use crate::wire::hop;

/// The step header.
pub const STEP_HEADER: HeaderName = HeaderName::from_static("x-latchkey-step");
/// W3C trace context.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
/// `--session-header`'s default.
pub const DEFAULT_SESSION_HEADER: &str = "x-latchkey-session";
/// The longest session or step value recorded.
pub const MAX_VALUE_LEN: usize = 128;
/// Steps whose attempts are counted at once, and how long one is remembered.
const MAX_STEPS: u64 = 100_000;
const STEP_TTL: Duration = Duration::from_secs(3600);

/// How correlation is read and forwarded (`serve --session-header`, `--otlp`).
#[derive(Debug, Clone)]
pub struct Options {
    session_header: HeaderName,
    propagate_trace: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            session_header: HeaderName::from_static(DEFAULT_SESSION_HEADER),
            propagate_trace: false,
        }
    }
}

/// A session header name latchkey cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("session header {0:?} is not a valid header name")]
    Invalid(String),
    #[error("session header {0:?} is one latchkey reads for itself (credentials, hop-by-hop, Host, Content-Length, trace context or x-latchkey-step): name another")]
    Reserved(String),
}

impl Options {
    /// `session_header` (any case) names the session header; `propagate_trace` sends trace
    /// context upstream.
    pub fn new(session_header: &str, propagate_trace: bool) -> Result<Self, OptionsError> {
        let name = HeaderName::from_bytes(session_header.as_bytes())
            .map_err(|_| OptionsError::Invalid(session_header.to_string()))?;
        let reserved = AUTH_HEADERS.contains(&name.as_str())
            || hop::is_hop_by_hop(&name)
            || [
                header::HOST,
                header::CONTENT_LENGTH,
                TRACEPARENT,
                TRACESTATE,
                STEP_HEADER,
            ]
            .contains(&name);
        if reserved {
            return Err(OptionsError::Reserved(session_header.to_string()));
        }
        Ok(Self {
            session_header: name,
            propagate_trace,
        })
    }

    pub fn session_header(&self) -> &HeaderName {
        &self.session_header
    }

    pub fn propagate_trace(&self) -> bool {
        self.propagate_trace
    }
}

/// A valid W3C `traceparent` (version `00`): ids as lowercase hex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    /// 32 hex digits, not all zero.
    pub trace_id: String,
    /// 16 hex digits, not all zero: the sandbox's span.
    pub parent_id: String,
    pub flags: u8,
}

impl TraceParent {
    /// Parses `00-<32 hex>-<16 hex>-<2 hex>` (lowercase hex, ids not all zero); anything else,
    /// other versions included, is `None`.
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        if value.len() != 55 || &value[..3] != b"00-" || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let (trace, parent, flags) = (&value[3..35], &value[36..52], &value[53..55]);
        let hex = |s: &[u8]| s.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let zero = |s: &[u8]| s.iter().all(|b| *b == b'0');
        if !hex(trace) || !hex(parent) || !hex(flags) || zero(trace) || zero(parent) {
            return None;
        }
        let text = |s: &[u8]| String::from_utf8_lossy(s).into_owned();
        let flags = u8::from_str_radix(&text(flags), 16).ok()?;
        Some(TraceParent {
            trace_id: text(trace),
            parent_id: text(parent),
            flags,
        })
    }
}

/// The trace context of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub trace_id: String,
    /// latchkey's own span for this request.
    pub span_id: String,
    /// The sandbox's span (`traceparent`'s parent id); `None` for a trace latchkey started.
    pub parent_span_id: Option<String>,
    pub flags: u8,
}

impl Trace {
    /// `traceparent` for the upstream request: latchkey's span is the parent.
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-{:02x}", self.trace_id, self.span_id, self.flags)
    }
}

/// What one request carries for correlation, as recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Correlation {
    pub session: Option<String>,
    pub step: Option<String>,
    pub attempt: Option<u32>,
    pub trace: Option<Trace>,
}

impl Correlation {
    /// Writes these fields into the record.
    pub fn record(&self, r: &mut Record) {
        // Under an admitted runtime session (`profile` set) the record's session is that
        // session's id: what the sandbox sent never replaces it.
        if r.profile.is_none() {
            r.session.clone_from(&self.session);
        }
        r.step.clone_from(&self.step);
        r.attempt = self.attempt;
        r.trace_id = self.trace.as_ref().map(|t| t.trace_id.clone());
        r.span_id = self.trace.as_ref().map(|t| t.span_id.clone());
        r.parent_span_id = self.trace.as_ref().and_then(|t| t.parent_span_id.clone());
    }
}

/// Reads correlation from requests, counts attempts, and edits what goes upstream.
pub struct Correlator {
    options: Options,
    /// Attempts so far, by a keyed hash of (identity, session, step): the map holds no value
    /// the sandbox sent.
    attempts: moka::sync::Cache<u64, u32>,
    keys: RandomState,
}

impl Correlator {
    pub fn new(options: Options) -> Self {
        Self {
            options,
            attempts: moka::sync::Cache::builder()
                .max_capacity(MAX_STEPS)
                .time_to_live(STEP_TTL)
                .build(),
            keys: RandomState::new(),
        }
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The correlation a request's head carries, with `scrub` (the record's) applied to every
    /// value before it is kept; no attempt counted yet ([`Self::count`]).
    pub fn read(&self, headers: &HeaderMap, scrub: impl Fn(&str) -> String) -> Correlation {
        let value = |name: &HeaderName| single_value(headers, name).map(&scrub);
        let session = value(&self.options.session_header);
        // A traceparent holding a secret value is no trace context: ignored, never forwarded.
        let parent = single_value(headers, &TRACEPARENT)
            .filter(|v| scrub(v) == *v)
            .and_then(|v| TraceParent::parse(v.as_bytes()));
        let step = value(&STEP_HEADER).or_else(|| {
            parent
                .as_ref()
                .map(|p| format!("{}-{}", p.trace_id, p.parent_id))
        });
        let trace = match parent {
            Some(p) => Some(Trace {
                trace_id: p.trace_id,
                span_id: span_id(),
                parent_span_id: Some(p.parent_id),
                flags: p.flags,
            }),
            None if self.options.propagate_trace => Some(Trace {
                trace_id: trace_id(),
                span_id: span_id(),
                parent_span_id: None,
                // Sampled: latchkey exports a span for it.
                flags: 0x01,
            }),
            None => None,
        };
        Correlation {
            session,
            step,
            attempt: None,
            trace,
        }
    }

    /// Counts this request as the next attempt at its step, for `identity`: 1, 2, … . Without
    /// a step there is nothing to count.
    pub fn count(&self, identity: &str, c: &mut Correlation) {
        let Some(step) = c.step.as_deref() else {
            return;
        };
        let key = self
            .keys
            .hash_one((identity, c.session.as_deref().unwrap_or(""), step));
        let entry = self
            .attempts
            .entry(key)
            .and_upsert_with(|seen| seen.map_or(1, |e| e.into_value().saturating_add(1)));
        c.attempt = Some(entry.into_value());
    }

    /// [`Self::read`] then [`Self::count`]: a request's correlation.
    pub fn request(
        &self,
        identity: &str,
        headers: &HeaderMap,
        scrub: impl Fn(&str) -> String,
    ) -> Correlation {
        let mut c = self.read(headers, scrub);
        self.count(identity, &mut c);
        c
    }

    /// Edits the upstream request's headers (see the module docs); `keep` is the rule's
    /// `keep_headers`.
    pub fn forward(&self, headers: &mut HeaderMap, keep: &[HeaderName], c: &Correlation) {
        let kept = |name: &HeaderName| keep.contains(name);
        for name in [&self.options.session_header, &STEP_HEADER] {
            if !kept(name) {
                headers.remove(name);
            }
        }
        let ours = c
            .trace
            .as_ref()
            .filter(|_| self.options.propagate_trace)
            .and_then(|t| Some((t, HeaderValue::from_str(&t.traceparent()).ok()?)));
        match ours {
            Some((trace, value)) => {
                headers.insert(TRACEPARENT, value);
                // A trace latchkey started is not the one the sandbox's tracestate belongs to.
                if trace.parent_span_id.is_none() {
                    headers.remove(TRACESTATE);
                }
            }
            None => {
                for name in [TRACEPARENT, TRACESTATE] {
                    if !kept(&name) {
                        headers.remove(name);
                    }
                }
            }
        }
    }
}

/// The one value of `name`, when it was sent exactly once, is 1..=[`MAX_VALUE_LEN`] bytes and
/// only visible ASCII.
fn single_value<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h str> {
    let mut all = headers.get_all(name).iter();
    let (Some(v), None) = (all.next(), all.next()) else {
        return None;
    };
    let bytes = v.as_bytes();
    let visible = bytes.iter().all(|b| (0x21..=0x7e).contains(b));
    if bytes.is_empty() || bytes.len() > MAX_VALUE_LEN || !visible {
        return None;
    }
    v.to_str().ok()
}

/// A random 16-hex span id, never all zero.
fn span_id() -> String {
    nonzero(new_id())
}

/// A random 32-hex trace id, never all zero.
fn trace_id() -> String {
    let mut id = new_id();
    id.push_str(&span_id());
    id
}

fn nonzero(id: String) -> String {
    if id.bytes().all(|b| b == b'0') {
        "0000000000000001".to_string()
    } else {
        id
    }
}

#[cfg(test)]
#[path = "correlate_tests.rs"]
mod tests;

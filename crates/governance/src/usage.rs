//! LLM usage accounting: which model-provider API a request calls, what it may cost before it
//! is sent (the model and the most output tokens it asks for), and the usage its response
//! reports — read as the response streams past, without delaying it.
//!
//! Providers: OpenAI chat completions (`…/chat/completions`, and the legacy `…/completions`)
//! and responses (`…/responses`), Anthropic messages (`…/v1/messages`), Gemini
//! `…:generateContent` and `…:streamGenerateContent`; each streaming (SSE, or Gemini's JSON
//! array) or not. Recognised by method and path, so a provider behind another host (a gateway,
//! a test upstream) is metered the same way.
//!
//! Memory is bounded: an SSE event or a JSON document longer than [`MAX_DOCUMENT`] is not
//! parsed (its usage is then unknown and the reservation is charged instead); nothing else of
//! the body is kept.
//!
//! Pure parsing: this knows nothing of budgets or the state store.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::wire::sse;
mod shapes;
use shapes::*;

/// The largest single JSON document (a non-streaming body, one SSE event's data, or one element
/// of Gemini's streamed array) parsed.
pub const MAX_DOCUMENT: usize = 4 * 1024 * 1024;

/// A model name longer than this is not kept (no provider has one; it would bloat records).
const MAX_MODEL_NAME: usize = 256;

/// A buffer of a finished document above this size is freed rather than kept for the next.
const KEEP_CAPACITY: usize = 64 * 1024;

/// A model-provider API latchkey meters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// `…/chat/completions`, and the legacy `…/completions` (same request fields and usage).
    OpenAiChat,
    OpenAiResponses,
    Anthropic,
    Gemini,
}

impl Provider {
    /// The provider's name in records and metrics: `openai`, `anthropic`, `gemini`.
    pub fn name(self) -> &'static str {
        match self {
            Provider::OpenAiChat | Provider::OpenAiResponses => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Gemini => "gemini",
        }
    }

    /// The API a request calls, by method and path; `None` for anything else (a GET of
    /// `/v1/models`, say), which is not metered.
    ///
    /// POST only. The path is read without its query, percent-decoded, without trailing `/`
    /// and ignoring ASCII case, so a spelling the provider would still route cannot slip past
    /// the meter:
    /// - ends with `/completions` → [`Provider::OpenAiChat`] (chat completions, Azure's
    ///   `/openai/deployments/D/chat/completions`, the legacy `/v1/completions`);
    /// - ends with `/responses` → [`Provider::OpenAiResponses`];
    /// - ends with `/v1/messages` → [`Provider::Anthropic`] (a bare `/messages` is not taken:
    ///   OpenAI's assistants API posts to `/v1/threads/ID/messages`, which generates nothing);
    /// - last segment ends with `:generateContent` or `:streamGenerateContent` →
    ///   [`Provider::Gemini`] (also Vertex AI's `…/publishers/google/models/M:generateContent`).
    pub fn detect(method: &http::Method, path: &str) -> Option<Provider> {
        if method != http::Method::POST {
            return None;
        }
        let path = normalize_path(path).to_ascii_lowercase();
        if path.ends_with("/completions") {
            Some(Provider::OpenAiChat)
        } else if path.ends_with("/responses") {
            Some(Provider::OpenAiResponses)
        } else if path.ends_with("/v1/messages") {
            Some(Provider::Anthropic)
        } else {
            match gemini_method(&path) {
                Some((_, "generatecontent" | "streamgeneratecontent")) => Some(Provider::Gemini),
                _ => None,
            }
        }
    }
}

/// The path without query or fragment, percent-decoded, without trailing slashes.
fn normalize_path(path: &str) -> String {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let decoded = percent_encoding::percent_decode_str(path).decode_utf8_lossy();
    decoded.trim_end_matches('/').to_string()
}

/// The last segment of a normalized path split at its last `:`: (`models/NAME` part, method).
fn gemini_method(path: &str) -> Option<(&str, &str)> {
    let last = path.rsplit('/').next().unwrap_or_default();
    last.rsplit_once(':')
}

/// What a request body says about its cost before it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFacts {
    /// `model` from the body (Gemini: from the path, `models/NAME:generateContent`).
    pub model: Option<String>,
    /// The most output tokens the call may produce: `max_completion_tokens`, else `max_tokens`
    /// (OpenAI chat), `max_output_tokens` (responses), `max_tokens` (Anthropic),
    /// `generationConfig.maxOutputTokens` (Gemini) — times [`RequestFacts::choices`].
    pub max_output_tokens: Option<u64>,
    /// How many completions the call generates, each up to the per-choice maximum: OpenAI
    /// `n` (and the legacy `best_of`), Gemini `generationConfig.candidateCount`; 1 otherwise.
    pub choices: u64,
    /// The call asks for a streamed response (`"stream": true`; Gemini: the
    /// `:streamGenerateContent` method).
    pub stream: bool,
    /// An upper estimate of the input tokens: the body's length in bytes divided by
    /// [`BYTES_PER_TOKEN_FLOOR`], rounded up.
    pub input_estimate: u64,
    /// OpenAI chat streaming only: `stream_options.include_usage` is already true.
    pub includes_usage: bool,
}

impl Default for RequestFacts {
    fn default() -> Self {
        RequestFacts {
            model: None,
            max_output_tokens: None,
            choices: 1,
            stream: false,
            input_estimate: 0,
            includes_usage: false,
        }
    }
}

impl RequestFacts {
    /// The output tokens to reserve: [`RequestFacts::max_output_tokens`], else `default` for
    /// each of the call's choices.
    pub fn output_reserve(&self, default: u64) -> u64 {
        self.max_output_tokens
            .unwrap_or_else(|| default.saturating_mul(self.choices.max(1)))
    }
}

/// No tokenizer produces fewer bytes per token than this on text; the input estimate divides
/// by it, so it errs high (the settle returns the difference).
pub const BYTES_PER_TOKEN_FLOOR: u64 = 2;

/// Reads what a request body says about its cost. A body that is not a JSON object gives facts
/// with only `input_estimate` set — and, for Gemini, what the path says (model, stream).
///
/// The body is read whatever its size (it is already in memory, and nothing of it is copied
/// but the few members read), so a large upload cannot hide its `max_tokens`.
///
/// Counts are read leniently, never so as to reserve less than the provider would allow: a
/// non-negative integer, an integral float (`1e5`), or a decimal string (`"4096"`, which
/// Gemini's proto-JSON accepts); a number past `u64` saturates; anything else is ignored.
/// A key given twice counts at its largest.
pub fn inspect_request(provider: Provider, path: &str, body: &[u8]) -> RequestFacts {
    let mut facts = RequestFacts {
        input_estimate: (body.len() as u64).div_ceil(BYTES_PER_TOKEN_FLOOR),
        ..RequestFacts::default()
    };
    if provider == Provider::Gemini {
        let path = normalize_path(path);
        if let Some((resource, method)) = gemini_method(&path) {
            facts.stream = method.eq_ignore_ascii_case("streamGenerateContent");
            facts.model = model_name(resource);
        }
    }
    let Ok(Lenient(Some(req))) = serde_json::from_slice::<Lenient<RawRequest>>(body) else {
        return facts;
    };
    let per_choice = match provider {
        Provider::OpenAiChat => {
            facts.choices = req.n.max(req.best_of).unwrap_or(1).max(1);
            req.max_completion_tokens.or(req.max_tokens)
        }
        Provider::OpenAiResponses => req.max_output_tokens,
        Provider::Anthropic => req.max_tokens,
        Provider::Gemini => {
            let config = req.generation_config.unwrap_or_default();
            facts.choices = config.candidate_count.unwrap_or(1).max(1);
            config.max_output_tokens
        }
    };
    facts.max_output_tokens = per_choice.map(|m| m.saturating_mul(facts.choices));
    if provider != Provider::Gemini {
        facts.model = req.model.as_deref().and_then(model_name);
        facts.stream = req.stream;
    }
    facts.includes_usage = provider == Provider::OpenAiChat && facts.stream && req.include_usage;
    facts
}

/// A model name worth keeping: not empty, not absurdly long.
fn model_name(name: &str) -> Option<String> {
    let name = name.strip_prefix("models/").unwrap_or(name);
    (!name.is_empty() && name.len() <= MAX_MODEL_NAME).then(|| name.to_string())
}

/// For a streaming OpenAI chat request without `stream_options.include_usage`: the same body
/// with `"stream_options": {"include_usage": true}` added (other keys of `stream_options`
/// kept). `None` when the body is not such a request, already asks for usage, is over
/// [`MAX_DOCUMENT`], or has a `stream_options` that is not an object (the provider refuses it).
///
/// When the body has no `stream_options` the member is spliced in before the closing `}`, so
/// every other byte is kept; otherwise the body is re-serialised (members in key order).
///
/// What it changes for the client: every chunk carries `"usage": null`, and one extra chunk
/// with empty `choices` and the usage arrives before `[DONE]`.
pub fn add_include_usage(body: &[u8]) -> Option<Vec<u8>> {
    if body.len() > MAX_DOCUMENT {
        return None;
    }
    let Ok(Value::Object(mut doc)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    if doc.get("stream") != Some(&Value::Bool(true)) {
        return None;
    }
    match doc.get_mut("stream_options") {
        None => {
            let end = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
            if body[end] != b'}' {
                return None;
            }
            const MEMBER: &[u8] = br#","stream_options":{"include_usage":true}"#;
            let mut out = Vec::with_capacity(body.len() + MEMBER.len());
            out.extend_from_slice(&body[..end]);
            out.extend_from_slice(MEMBER);
            out.extend_from_slice(&body[end..]);
            Some(out)
        }
        Some(options @ Value::Null) => {
            *options = serde_json::json!({ "include_usage": true });
            serde_json::to_vec(&doc).ok()
        }
        Some(Value::Object(options)) => {
            if options.get("include_usage") == Some(&Value::Bool(true)) {
                return None;
            }
            options.insert("include_usage".to_string(), Value::Bool(true));
            serde_json::to_vec(&doc).ok()
        }
        Some(_) => None,
    }
}

/// The usage a response reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// The model the response names (it may differ from the request's alias).
    pub model: Option<String>,
    /// All input tokens, cached ones included (Gemini: `toolUsePromptTokenCount` too).
    pub input_tokens: u64,
    /// All output tokens, reasoning included (Gemini: `thoughtsTokenCount` too).
    pub output_tokens: u64,
    /// Input tokens served from the provider's prompt cache (OpenAI
    /// `prompt_tokens_details.cached_tokens` / `input_tokens_details.cached_tokens`; Anthropic
    /// `cache_read_input_tokens`; Gemini `cachedContentTokenCount`); never more than
    /// `input_tokens`. Anthropic's `cache_creation_input_tokens` count as input.
    pub cached_input_tokens: u64,
}

/// Reads a response's usage from its body as it streams: fed each chunk in order, it keeps
/// only what it needs (the SSE event being read, or the JSON document being read, each up to
/// [`MAX_DOCUMENT`]).
///
/// A `text/event-stream` body is read as SSE. Any other body is sniffed: one starting with `{`
/// or `[` is read as JSON — one document, several concatenated, or an array whose object
/// elements are each a document (Gemini's `streamGenerateContent` without `alt=sse`) — and
/// anything else as SSE (a mislabelled stream). Each document's usage overrides, member by
/// member, what earlier ones said (the providers' counts are cumulative).
pub struct Meter {
    tally: Tally,
    body: Body,
}

impl fmt::Debug for Meter {
    /// Sizes only: the body may carry anything.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (mode, buffered) = match &self.body {
            Body::Sniff => ("sniff", 0),
            Body::Sse(s) => ("sse", s.0.held()),
            Body::Json(j) => ("json", j.buf.len()),
        };
        f.debug_struct("Meter")
            .field("provider", &self.tally.provider)
            .field("mode", &mode)
            .field("buffered", &buffered)
            .field("seen", &self.tally.seen)
            .finish()
    }
}

enum Body {
    /// Not yet known whether JSON or SSE (only whitespace so far).
    Sniff,
    Sse(Box<Sse>),
    Json(Box<JsonScan>),
}

impl Meter {
    /// A meter for a response of `provider` whose `content-type` is `content_type`.
    pub fn new(provider: Provider, content_type: Option<&str>) -> Meter {
        let sse = content_type.is_some_and(sse::is_event_stream);
        Meter {
            tally: Tally::new(provider),
            body: if sse {
                Body::Sse(Box::default())
            } else {
                Body::Sniff
            },
        }
    }

    /// Takes the next chunk of the (decoded) response body.
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut chunk = chunk;
        if let Body::Sniff = self.body {
            let Some(start) = chunk.iter().position(|b| !b.is_ascii_whitespace()) else {
                return;
            };
            chunk = &chunk[start..];
            self.body = if matches!(chunk[0], b'{' | b'[') {
                Body::Json(Box::default())
            } else {
                Body::Sse(Box::default())
            };
        }
        match &mut self.body {
            Body::Sniff => {}
            Body::Sse(sse) => sse.feed(chunk, &mut self.tally),
            Body::Json(json) => json.feed(chunk, &mut self.tally),
        }
    }

    /// The response's final usage report has been read (OpenAI's usage chunk or body, a
    /// responses `response.completed`/`incomplete`/`failed`, Anthropic's `message_delta` or
    /// body, a Gemini chunk with a `finishReason` or a blocked prompt). When usage was read
    /// but this is false, the stream ended early and the counts are those reported so far —
    /// the provider may bill more.
    pub fn complete(&self) -> bool {
        self.tally.complete
    }

    /// The usage read, once the body has ended; `None` when the response reported none (an
    /// error response, a stream cut short, OpenAI streaming without `include_usage`).
    ///
    /// An SSE event the stream ended inside (no blank line after it) is still read if its data
    /// parses: the provider reported it, whether or not a client would have dispatched it.
    pub fn finish(mut self) -> Option<Usage> {
        if let Body::Sse(sse) = &mut self.body {
            sse.finish(&mut self.tally);
        }
        self.tally.usage()
    }
}

/// Appends `bytes` to `buf` unless that would pass [`MAX_DOCUMENT`].
fn push_bounded(buf: &mut Vec<u8>, bytes: &[u8]) -> bool {
    sse::push_bounded(buf, bytes, MAX_DOCUMENT)
}

/// Empties a document buffer, freeing it when a large document left it large.
fn reset_buffer(buf: &mut Vec<u8>) {
    if buf.capacity() > KEEP_CAPACITY {
        *buf = Vec::new();
    } else {
        buf.clear();
    }
}

// ---------------------------------------------------------------------------------------------
// SSE

/// A body read as an event stream: the proxy's one parser (`wire::sse`), keeping only the
/// current event's data (up to [`MAX_DOCUMENT`]; a larger event is dropped) and name.
struct Sse(sse::Parser);

impl Default for Sse {
    fn default() -> Self {
        Sse(sse::Parser::new(sse::Limits {
            max_data: MAX_DOCUMENT,
            max_raw: None,
        }))
    }
}

impl Sse {
    fn feed(&mut self, chunk: &[u8], tally: &mut Tally) {
        // Raw bytes are not kept, so feeding cannot fail.
        let _ = self.0.feed(chunk, &mut |e| Self::read(e, tally));
    }

    /// The stream has ended: an event it ended inside is read too.
    fn finish(&mut self, tally: &mut Tally) {
        let _ = self.0.finish(&mut |e| Self::read(e, tally));
    }

    fn read(e: sse::Event<'_>, tally: &mut Tally) {
        if let Some(data) = e.data {
            let name = e
                .name
                .and_then(|n| std::str::from_utf8(n).ok())
                .filter(|n| !n.is_empty());
            tally.document(data, name);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// JSON bodies

/// Finds the JSON documents of a non-SSE body as it streams: a top-level object, several
/// concatenated, or the object elements of a top-level array. It tracks only nesting and
/// strings; serde_json validates each document. A body that is not JSON stops the scan.
#[derive(Default)]
struct JsonScan {
    depth: usize,
    in_string: bool,
    escape: bool,
    /// The top-level value is an array (its object elements are the documents).
    array_top: bool,
    /// The depth outside the document being read, while one is.
    doc_depth: Option<usize>,
    buf: Vec<u8>,
    /// The current document passed [`MAX_DOCUMENT`]: it is scanned past, not kept.
    skipping: bool,
    dead: bool,
}

impl JsonScan {
    fn feed(&mut self, chunk: &[u8], tally: &mut Tally) {
        let mut start = (self.doc_depth.is_some() && !self.skipping).then_some(0);
        let mut i = 0;
        while i < chunk.len() && !self.dead {
            if self.in_string {
                if self.escape {
                    self.escape = false;
                    i += 1;
                    continue;
                }
                match memchr::memchr2(b'"', b'\\', &chunk[i..]) {
                    Some(k) => {
                        if chunk[i + k] == b'\\' {
                            self.escape = true;
                        } else {
                            self.in_string = false;
                        }
                        i += k + 1;
                    }
                    None => i = chunk.len(),
                }
                continue;
            }
            match chunk[i] {
                b' ' | b'\t' | b'\n' | b'\r' => {}
                b'"' if self.depth > 0 => self.in_string = true,
                b'{' => {
                    if self.doc_depth.is_none()
                        && (self.depth == 0 || (self.depth == 1 && self.array_top))
                    {
                        self.doc_depth = Some(self.depth);
                        self.skipping = false;
                        start = Some(i);
                    }
                    self.depth += 1;
                }
                b'[' => {
                    if self.depth == 0 {
                        self.array_top = true;
                    }
                    self.depth += 1;
                }
                b'}' | b']' if self.depth > 0 => {
                    self.depth -= 1;
                    if self.doc_depth == Some(self.depth) {
                        if let Some(s) = start.take() {
                            if push_bounded(&mut self.buf, &chunk[s..=i]) {
                                tally.document(&self.buf, None);
                            }
                        }
                        reset_buffer(&mut self.buf);
                        self.doc_depth = None;
                        self.skipping = false;
                    }
                    if self.depth == 0 {
                        self.array_top = false;
                    }
                }
                _ if self.depth > 0 => {}
                // Anything else at the top level: not a JSON body we read.
                _ => {
                    self.dead = true;
                    self.buf = Vec::new();
                    return;
                }
            }
            i += 1;
        }
        if let Some(s) = start {
            if !push_bounded(&mut self.buf, &chunk[s..]) {
                self.skipping = true;
                self.buf = Vec::new();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Usage extraction

/// The counts read so far, by where each provider reports them; `None` until reported.
struct Tally {
    provider: Provider,
    model: Option<String>,
    /// OpenAI `prompt_tokens`/`input_tokens`, Anthropic `input_tokens` (uncached part),
    /// Gemini `promptTokenCount`.
    prompt: Option<u64>,
    /// Gemini `toolUsePromptTokenCount` (billed as input).
    tool_prompt: Option<u64>,
    /// Anthropic `cache_read_input_tokens` (input, and cached).
    cache_read: Option<u64>,
    /// Anthropic `cache_creation_input_tokens` (input).
    cache_creation: Option<u64>,
    /// OpenAI `cached_tokens`, Gemini `cachedContentTokenCount` (part of `prompt`).
    cached: Option<u64>,
    /// OpenAI `completion_tokens`/`output_tokens`, Anthropic `output_tokens`, Gemini
    /// `candidatesTokenCount`.
    output: Option<u64>,
    /// Gemini `thoughtsTokenCount` (billed as output).
    thoughts: Option<u64>,
    seen: bool,
    complete: bool,
}

/// Sets `slot` when `value` is reported; whether it was.
fn report(slot: &mut Option<u64>, value: Option<u64>) -> bool {
    match value {
        Some(v) => {
            *slot = Some(v);
            true
        }
        None => false,
    }
}

impl Tally {
    fn new(provider: Provider) -> Tally {
        Tally {
            provider,
            model: None,
            prompt: None,
            tool_prompt: None,
            cache_read: None,
            cache_creation: None,
            cached: None,
            output: None,
            thoughts: None,
            seen: false,
            complete: false,
        }
    }

    /// Reads one JSON document (an SSE event's data, or a body's document); `event` is the SSE
    /// event name, when there was one.
    fn document(&mut self, data: &[u8], event: Option<&str>) {
        // Most streamed events (text deltas) carry neither usage nor anything else read here
        // once the model is known; they are not parsed.
        if self.model.is_some() && memchr::memmem::find(data, b"usage").is_none() {
            return;
        }
        let Ok(Lenient(Some(doc))) = serde_json::from_slice::<Lenient<Doc>>(data) else {
            return;
        };
        let kind = doc.kind.0.as_deref().or(event);
        match self.provider {
            Provider::OpenAiChat | Provider::OpenAiResponses => {
                // Responses streams wrap the response object in `response`.
                let (model, usage, terminal) = match doc.response.0 {
                    Some(r) => (
                        r.model,
                        r.usage,
                        matches!(
                            kind,
                            Some("response.completed" | "response.incomplete" | "response.failed")
                        ),
                    ),
                    None => (doc.model, doc.usage, true),
                };
                self.set_model(model);
                if let Some(u) = usage.0 {
                    let read = [
                        report(&mut self.prompt, u.prompt_tokens.0.or(u.input_tokens.0)),
                        report(
                            &mut self.output,
                            u.completion_tokens.0.or(u.output_tokens.0),
                        ),
                        report(
                            &mut self.cached,
                            u.prompt_tokens_details
                                .0
                                .or(u.input_tokens_details.0)
                                .and_then(|d| d.cached_tokens.0),
                        ),
                    ];
                    self.reported(read.contains(&true), terminal);
                }
            }
            Provider::Anthropic => {
                // `message_start` wraps the message; `message_delta` and a plain body do not.
                let (model, usage) = match doc.message.0 {
                    Some(m) => (m.model, m.usage),
                    None => (doc.model, doc.usage),
                };
                self.set_model(model);
                if let Some(u) = usage.0 {
                    let read = [
                        report(&mut self.prompt, u.input_tokens.0),
                        report(&mut self.cache_read, u.cache_read_input_tokens.0),
                        report(&mut self.cache_creation, u.cache_creation_input_tokens.0),
                        report(&mut self.output, u.output_tokens.0),
                    ];
                    let terminal = matches!(kind, Some("message_delta" | "message"));
                    self.reported(read.contains(&true), terminal);
                }
            }
            Provider::Gemini => {
                self.set_model(doc.model_version);
                if let Some(u) = doc.usage_metadata.0 {
                    let read = [
                        report(&mut self.prompt, u.prompt.0),
                        report(&mut self.tool_prompt, u.tool_prompt.0),
                        report(&mut self.cached, u.cached.0),
                        report(&mut self.output, u.candidates.0),
                        report(&mut self.thoughts, u.thoughts.0),
                    ];
                    let blocked = doc
                        .prompt_feedback
                        .0
                        .is_some_and(|p| p.block_reason.0.is_some());
                    self.reported(read.contains(&true), doc.candidates.0 || blocked);
                }
            }
        }
    }

    fn set_model(&mut self, model: Text) {
        if let Some(m) = model.0.as_deref().and_then(model_name) {
            self.model = Some(m);
        }
    }

    fn reported(&mut self, any: bool, terminal: bool) {
        if any {
            self.seen = true;
            if terminal {
                self.complete = true;
            }
        }
    }

    fn usage(&self) -> Option<Usage> {
        if !self.seen {
            return None;
        }
        let n = |v: Option<u64>| v.unwrap_or(0);
        let input = n(self.prompt)
            .saturating_add(n(self.tool_prompt))
            .saturating_add(n(self.cache_read))
            .saturating_add(n(self.cache_creation));
        Some(Usage {
            model: self.model.clone(),
            input_tokens: input,
            output_tokens: n(self.output).saturating_add(n(self.thoughts)),
            cached_input_tokens: n(self.cached).saturating_add(n(self.cache_read)).min(input),
        })
    }
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;

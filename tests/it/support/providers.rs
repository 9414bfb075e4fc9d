//! Fake model providers on loopback, for the limits and usage tests: one HTTPS upstream (signed
//! by the test CA) that speaks the four APIs latchkey meters, realistically enough for the
//! official SDKs to parse, streaming (SSE) and not:
//!
//! - OpenAI chat completions, `POST …/chat/completions`: a `chat.completion`, or
//!   `chat.completion.chunk` events ending in `data: [DONE]`; with
//!   `stream_options.include_usage` the last chunk before `[DONE]` has `choices: []` and the
//!   `usage` (and every other chunk `"usage": null`), as OpenAI sends it. Without it a stream
//!   reports no usage at all.
//! - OpenAI responses, `POST …/responses`: a `response` object, or the events
//!   `response.created`, `response.in_progress`, `response.output_item.added`,
//!   `response.content_part.added`, `response.output_text.delta`…, `response.output_text.done`,
//!   `response.content_part.done`, `response.output_item.done`, `response.completed` (the only
//!   one with `usage`).
//! - Anthropic messages, `POST …/v1/messages`: a `message`, or `message_start` (input usage),
//!   `content_block_start`, `ping`, `content_block_delta`…, `content_block_stop`,
//!   `message_delta` (output usage), `message_stop`. Anthropic's `input_tokens` excludes cache
//!   reads, which it reports as `cache_read_input_tokens`.
//! - Gemini, `POST …/models/M:generateContent` and `…:streamGenerateContent?alt=sse`: a
//!   `GenerateContentResponse`, or one per chunk, each with the running `usageMetadata` (so a
//!   meter that sums instead of taking the last one overcounts).
//!
//! Any other request (an upload, a GET) gets `200` and a JSON note of what arrived
//! (`method`, `path`, `bytes`).
//!
//! What each call reports is set by the request, so a test can compute the charges:
//!
//! | request header          | meaning                                                   | default |
//! |-------------------------|-----------------------------------------------------------|---------|
//! | `x-fake-input-tokens`   | input tokens, cached ones included                        | 12      |
//! | `x-fake-output-tokens`  | output tokens                                             | the body's max output tokens, else 5 |
//! | `x-fake-cached-tokens`  | of the input, tokens served from the prompt cache         | 0       |
//! | `x-fake-model`          | the model the response names                              | the request's |
//! | `x-fake-delay-ms`       | pause between two events of a stream                      | 10      |
//! | `x-fake-hold`           | `1`: wait for [`Providers::release`] before answering     | off     |
//! | `x-fake-fail`           | `1`: answer `500` with an error body and no usage         | off     |
//! | `x-fake-gate`           | `1`: stream all but the usage-bearing end, then wait for [`Providers::release`] | off |
//!
//! Every answer is logged ([`Providers::answers`]) with the usage it reported, and
//! [`Providers::finals_sent`] counts the streams whose last event has left the upstream, so a
//! test can tell that the client got the first event before the last one was sent.
//!
//! Also here: an in-process HTTPS client through latchkey ([`Call`]) for requests a test wants
//! to time or frame itself (chunked uploads, reading a stream event by event), and
//! [`LimitsWorld`]: the provider, latchkey with a policy, a secret injected on every provider
//! rule, identities, and a leak sweep.

use std::io::Write;
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;
use hyper::Response;
use rustls_pki_types::ServerName;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::clients::{read_response, tls_config, RawResponse};
use super::latchkey::{latchkey, wait_with_timeout, Latchkey, LatchkeyBuilder, SCRUBBED_ENV};
use super::secrets::{assert_no_leak, StreamedResponse, OPENAI};
use super::toolchain;
use super::upstream::{channel_body, full_body, handler, Received, UpBody, Upstream};
use super::{TestCa, PINNED};

/// The provider hosts a [`LimitsWorld`] pins to the fake (the test certificate covers
/// `*.wild.test`).
pub const OPENAI_HOST: &str = "openai.wild.test";
pub const ANTHROPIC_HOST: &str = "anthropic.wild.test";
pub const GEMINI_HOST: &str = "gemini.wild.test";

/// The words of every completion; a stream sends one per event.
pub const WORDS: &[&str] = &["Hello", " from", " the", " fake", " provider."];

/// The text every completion holds.
pub fn completion_text() -> String {
    WORDS.concat()
}

/// Which API a request called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    OpenAiChat,
    OpenAiResponses,
    Anthropic,
    Gemini,
}

impl Api {
    /// The provider name latchkey's audit record uses.
    pub fn provider(self) -> &'static str {
        match self {
            Api::OpenAiChat | Api::OpenAiResponses => "openai",
            Api::Anthropic => "anthropic",
            Api::Gemini => "gemini",
        }
    }
}

/// One answer the fake gave: what it reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub api: Api,
    pub path: String,
    pub stream: bool,
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
    /// The usage was in the answer (false: an OpenAI chat stream without `include_usage`).
    pub reported_usage: bool,
    /// The request body had `stream_options.include_usage = true`.
    pub include_usage: bool,
}

/// The shared state of a fake provider.
struct State {
    answers: Mutex<Vec<Answer>>,
    /// Permits for `x-fake-hold` and `x-fake-gate`.
    release: Arc<Semaphore>,
    finals: AtomicUsize,
}

/// A fake model provider: an HTTPS upstream speaking OpenAI, Anthropic and Gemini.
pub struct Providers {
    pub upstream: Upstream,
    state: Arc<State>,
}

impl Providers {
    /// Starts the fake on `127.0.0.1:0` with a certificate from `ca`.
    pub fn start(ca: &TestCa) -> Providers {
        let state = Arc::new(State {
            answers: Mutex::new(Vec::new()),
            release: Arc::new(Semaphore::new(0)),
            finals: AtomicUsize::new(0),
        });
        let shared = state.clone();
        let upstream = Upstream::https_with(
            ca,
            handler(move |req| {
                let state = shared.clone();
                async move { answer(state, req).await }
            }),
        );
        Providers { upstream, state }
    }

    pub fn port(&self) -> u16 {
        self.upstream.port()
    }

    /// Lets `n` held requests (`x-fake-hold`) or gated streams (`x-fake-gate`) go on.
    pub fn release(&self, n: usize) {
        self.state.release.add_permits(n);
    }

    /// Every answer so far, in order.
    pub fn answers(&self) -> Vec<Answer> {
        self.state.answers.lock().expect("answers").clone()
    }

    /// Streams whose last event the fake has sent.
    pub fn finals_sent(&self) -> usize {
        self.state.finals.load(Ordering::SeqCst)
    }

    /// Requests the fake received (whatever their path).
    pub fn received(&self) -> Vec<Received> {
        self.upstream.received()
    }
}

fn header_u64(req: &Received, name: &str) -> Option<u64> {
    req.header(name).and_then(|v| v.trim().parse().ok())
}

/// The API of a request, and for Gemini the model and whether it streams, by path.
fn route(req: &Received) -> Option<(Api, Option<String>, bool)> {
    let path = req.path_only();
    if req.method != "POST" {
        return None;
    }
    if path.ends_with("/chat/completions") {
        return Some((Api::OpenAiChat, None, false));
    }
    if path.ends_with("/responses") {
        return Some((Api::OpenAiResponses, None, false));
    }
    if path.ends_with("/v1/messages") {
        return Some((Api::Anthropic, None, false));
    }
    let (_, rest) = path.split_once("/models/")?;
    let (model, method) = rest.split_once(':')?;
    match method {
        "generateContent" => Some((Api::Gemini, Some(model.to_string()), false)),
        "streamGenerateContent" => Some((Api::Gemini, Some(model.to_string()), true)),
        _ => None,
    }
}

async fn answer(state: Arc<State>, req: Received) -> Response<UpBody> {
    let Some((api, path_model, gemini_stream)) = route(&req) else {
        // Not a model call (an upload, a GET): a plain answer saying what arrived.
        if req.header("x-fake-hold") == Some("1") {
            wait_release(&state).await;
        }
        return json_response(
            200,
            json!({"method": req.method, "path": req.path, "bytes": req.body.len(),
                   "complete": req.complete}),
        );
    };
    let body: Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(e) => {
            return json_response(
                400,
                json!({"error": {"message": format!("the fake provider wants JSON: {e}")}}),
            )
        }
    };
    let stream = match api {
        Api::Gemini => gemini_stream,
        _ => body["stream"].as_bool().unwrap_or(false),
    };
    let max_output = match api {
        Api::OpenAiChat => body["max_completion_tokens"]
            .as_u64()
            .or(body["max_tokens"].as_u64()),
        Api::OpenAiResponses => body["max_output_tokens"].as_u64(),
        Api::Anthropic => body["max_tokens"].as_u64(),
        Api::Gemini => body["generationConfig"]["maxOutputTokens"].as_u64(),
    };
    let request_model = path_model
        .or_else(|| body["model"].as_str().map(str::to_string))
        .unwrap_or_else(|| "unnamed".to_string());
    let include_usage = body["stream_options"]["include_usage"]
        .as_bool()
        .unwrap_or(false);
    let output_tokens = header_u64(&req, "x-fake-output-tokens")
        .or(max_output)
        .unwrap_or(5);
    let input_tokens = header_u64(&req, "x-fake-input-tokens").unwrap_or(12);
    let cached_tokens = header_u64(&req, "x-fake-cached-tokens")
        .unwrap_or(0)
        .min(input_tokens);
    let usage = Tokens {
        input: input_tokens,
        output: output_tokens,
        cached: cached_tokens,
    };
    let model = req
        .header("x-fake-model")
        .map(str::to_string)
        .unwrap_or(request_model);
    let delay = Duration::from_millis(header_u64(&req, "x-fake-delay-ms").unwrap_or(10));
    let gated = req.header("x-fake-gate") == Some("1");
    let reported_usage = !(api == Api::OpenAiChat && stream && !include_usage);
    state.answers.lock().expect("answers").push(Answer {
        api,
        path: req.path.clone(),
        stream,
        model: model.clone(),
        input_tokens,
        output_tokens,
        cached_tokens,
        reported_usage,
        include_usage,
    });
    if req.header("x-fake-hold") == Some("1") {
        wait_release(&state).await;
    }
    if req.header("x-fake-fail") == Some("1") {
        return json_response(
            500,
            json!({"error": {"message": "the fake provider failed", "type": "server_error"}}),
        );
    }
    if !stream {
        let doc = match api {
            Api::OpenAiChat => chat_completion(&model, usage),
            Api::OpenAiResponses => response_object(&model, usage, "completed"),
            Api::Anthropic => anthropic_message(&model, usage),
            Api::Gemini => gemini_chunk(&model, &completion_text(), usage, true),
        };
        return json_response(200, doc);
    }
    let events = match api {
        Api::OpenAiChat => chat_events(&model, usage, include_usage),
        Api::OpenAiResponses => responses_events(&model, usage),
        Api::Anthropic => anthropic_events(&model, usage),
        Api::Gemini => gemini_events(&model, usage),
    };
    let (tx, body) = channel_body(4);
    tokio::spawn(async move {
        let last = events.len().saturating_sub(1);
        for (i, event) in events.into_iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(delay).await;
            }
            // The usage-bearing end waits for the test when the call is gated.
            if gated && i == last {
                wait_release(&state).await;
            }
            if tx.send(Bytes::from(event)).await.is_err() {
                return;
            }
            if i == last {
                state.finals.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    Response::builder()
        .header("content-type", "text/event-stream; charset=utf-8")
        .header("cache-control", "no-cache")
        .header("x-request-id", "req-fake")
        .body(body)
        .expect("stream response")
}

/// Waits for one release permit (at most 20 s, so a broken test does not hang forever).
async fn wait_release(state: &State) {
    if let Ok(Ok(permit)) =
        tokio::time::timeout(Duration::from_secs(20), state.release.acquire()).await
    {
        permit.forget();
    }
}

fn json_response(status: u16, doc: Value) -> Response<UpBody> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("x-request-id", "req-fake")
        .body(full_body(doc.to_string()))
        .expect("JSON response")
}

#[derive(Debug, Clone, Copy)]
struct Tokens {
    input: u64,
    output: u64,
    cached: u64,
}

const CREATED: u64 = 1_780_000_000;

fn sse_data(doc: &Value) -> String {
    format!("data: {doc}\n\n")
}

fn sse_event(name: &str, doc: &Value) -> String {
    format!("event: {name}\ndata: {doc}\n\n")
}

// -------------------------------------------------------------------------------------------
// OpenAI chat completions

fn chat_usage(u: Tokens) -> Value {
    json!({
        "prompt_tokens": u.input,
        "completion_tokens": u.output,
        "total_tokens": u.input + u.output,
        "prompt_tokens_details": {"cached_tokens": u.cached, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0, "audio_tokens": 0,
            "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0
        }
    })
}

fn chat_completion(model: &str, u: Tokens) -> Value {
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": completion_text(), "refusal": null},
            "logprobs": null,
            "finish_reason": "stop"
        }],
        "usage": chat_usage(u),
        "service_tier": "default",
        "system_fingerprint": "fp_fake"
    })
}

fn chat_events(model: &str, u: Tokens, include_usage: bool) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        let mut doc = json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]
        });
        if include_usage {
            doc["usage"] = Value::Null;
        }
        sse_data(&doc)
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": "", "refusal": null}),
        Value::Null,
    )];
    for word in WORDS {
        events.push(chunk(json!({"content": word}), Value::Null));
    }
    events.push(chunk(json!({}), json!("stop")));
    if include_usage {
        events.push(sse_data(&json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [],
            "usage": chat_usage(u)
        })));
    }
    events.push("data: [DONE]\n\n".to_string());
    events
}

// -------------------------------------------------------------------------------------------
// OpenAI responses

fn response_object(model: &str, u: Tokens, status: &str) -> Value {
    let done = status == "completed";
    let output = if done {
        json!([{
            "type": "message",
            "id": "msg_fake",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": completion_text(), "annotations": []}]
        }])
    } else {
        json!([])
    };
    let usage = if done {
        json!({
            "input_tokens": u.input,
            "input_tokens_details": {"cached_tokens": u.cached},
            "output_tokens": u.output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.input + u.output
        })
    } else {
        Value::Null
    };
    json!({
        "id": "resp_fake",
        "object": "response",
        "created_at": CREATED,
        "status": status,
        "error": null,
        "incomplete_details": null,
        "instructions": null,
        "max_output_tokens": null,
        "model": model,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "store": true,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": null,
        "metadata": {}
    })
}

fn responses_events(model: &str, u: Tokens) -> Vec<String> {
    let mut seq = 0u64;
    let mut next = |name: &str, mut doc: Value| {
        doc["type"] = json!(name);
        doc["sequence_number"] = json!(seq);
        seq += 1;
        sse_event(name, &doc)
    };
    let item = |status: &str, text: &str| {
        json!({
            "type": "message", "id": "msg_fake", "status": status, "role": "assistant",
            "content": if text.is_empty() { json!([]) } else {
                json!([{"type": "output_text", "text": text, "annotations": []}])
            }
        })
    };
    let text = completion_text();
    let mut events = vec![
        next(
            "response.created",
            json!({"response": response_object(model, u, "in_progress")}),
        ),
        next(
            "response.in_progress",
            json!({"response": response_object(model, u, "in_progress")}),
        ),
        next(
            "response.output_item.added",
            json!({"output_index": 0, "item": item("in_progress", "")}),
        ),
        next(
            "response.content_part.added",
            json!({"item_id": "msg_fake", "output_index": 0, "content_index": 0,
                   "part": {"type": "output_text", "text": "", "annotations": []}}),
        ),
    ];
    for word in WORDS {
        events.push(next(
            "response.output_text.delta",
            json!({"item_id": "msg_fake", "output_index": 0, "content_index": 0, "delta": word}),
        ));
    }
    events.push(next(
        "response.output_text.done",
        json!({"item_id": "msg_fake", "output_index": 0, "content_index": 0, "text": text}),
    ));
    events.push(next(
        "response.content_part.done",
        json!({"item_id": "msg_fake", "output_index": 0, "content_index": 0,
               "part": {"type": "output_text", "text": text, "annotations": []}}),
    ));
    events.push(next(
        "response.output_item.done",
        json!({"output_index": 0, "item": item("completed", &text)}),
    ));
    events.push(next(
        "response.completed",
        json!({"response": response_object(model, u, "completed")}),
    ));
    events
}

// -------------------------------------------------------------------------------------------
// Anthropic messages

/// Anthropic's usage: `input_tokens` without the cache reads.
fn anthropic_usage(u: Tokens, output: u64) -> Value {
    json!({
        "input_tokens": u.input - u.cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached,
        "output_tokens": output,
        "service_tier": "standard"
    })
}

fn anthropic_message(model: &str, u: Tokens) -> Value {
    json!({
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": completion_text()}],
        "stop_reason": "end_turn",
        "stop_sequence": null,
        "usage": anthropic_usage(u, u.output)
    })
}

fn anthropic_events(model: &str, u: Tokens) -> Vec<String> {
    let mut start = anthropic_message(model, u);
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    start["usage"] = anthropic_usage(u, 1);
    let mut events = vec![
        sse_event(
            "message_start",
            &json!({"type": "message_start", "message": start}),
        ),
        sse_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
        ),
        sse_event("ping", &json!({"type": "ping"})),
    ];
    for word in WORDS {
        events.push(sse_event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": word}}),
        ));
    }
    events.push(sse_event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(sse_event(
        "message_delta",
        &json!({"type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": u.output}}),
    ));
    events.push(sse_event("message_stop", &json!({"type": "message_stop"})));
    events
}

// -------------------------------------------------------------------------------------------
// Gemini

/// One `GenerateContentResponse`; `done` carries the finish reason and the whole usage, an
/// earlier chunk the usage so far (prompt counted, output growing).
fn gemini_chunk(model: &str, text: &str, u: Tokens, done: bool) -> Value {
    let mut candidate = json!({
        "content": {"parts": [{"text": text}], "role": "model"},
        "index": 0
    });
    if done {
        candidate["finishReason"] = json!("STOP");
    }
    let mut usage = json!({
        "promptTokenCount": u.input,
        "candidatesTokenCount": u.output,
        "totalTokenCount": u.input + u.output,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": u.input}]
    });
    if u.cached > 0 {
        usage["cachedContentTokenCount"] = json!(u.cached);
    }
    json!({
        "candidates": [candidate],
        "usageMetadata": usage,
        "modelVersion": model,
        "responseId": "resp-fake"
    })
}

fn gemini_events(model: &str, u: Tokens) -> Vec<String> {
    let n = WORDS.len() as u64;
    WORDS
        .iter()
        .enumerate()
        .map(|(i, word)| {
            let i = i as u64;
            let done = i + 1 == n;
            let so_far = Tokens {
                output: if done {
                    u.output
                } else {
                    u.output * (i + 1) / n
                },
                ..u
            };
            // Gemini separates its SSE events with CRLF pairs.
            format!("data: {}\r\n\r\n", gemini_chunk(model, word, so_far, done))
        })
        .collect()
}

// -------------------------------------------------------------------------------------------
// Request bodies, as the SDKs send them

/// A chat completion request body.
pub fn chat_body(model: &str, stream: bool, max_tokens: Option<u64>) -> Value {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "stream": stream
    });
    if let Some(n) = max_tokens {
        body["max_tokens"] = json!(n);
    }
    body
}

/// A responses API request body.
pub fn responses_body(model: &str, stream: bool, max_tokens: Option<u64>) -> Value {
    let mut body = json!({"model": model, "input": "Say hello.", "stream": stream});
    if let Some(n) = max_tokens {
        body["max_output_tokens"] = json!(n);
    }
    body
}

/// An Anthropic messages request body (`max_tokens` is required by the API).
pub fn anthropic_body(model: &str, stream: bool, max_tokens: u64) -> Value {
    json!({
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Say hello."}],
        "stream": stream
    })
}

/// A Gemini generateContent request body.
pub fn gemini_body(max_tokens: Option<u64>) -> Value {
    let mut body = json!({"contents": [{"role": "user", "parts": [{"text": "Say hello."}]}]});
    if let Some(n) = max_tokens {
        body["generationConfig"] = json!({"maxOutputTokens": n});
    }
    body
}

/// The text of an SSE stream's events: OpenAI chat deltas, responses deltas, Anthropic text
/// deltas or Gemini parts, concatenated; for checking that the client got the whole
/// completion, unchanged.
pub fn streamed_text(api: Api, sse: &str) -> String {
    let mut text = String::new();
    for line in sse.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(doc) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        let piece = match api {
            Api::OpenAiChat => doc["choices"][0]["delta"]["content"].as_str(),
            Api::OpenAiResponses if doc["type"] == "response.output_text.delta" => {
                doc["delta"].as_str()
            }
            Api::Anthropic if doc["type"] == "content_block_delta" => doc["delta"]["text"].as_str(),
            Api::Gemini => doc["candidates"][0]["content"]["parts"][0]["text"].as_str(),
            _ => None,
        };
        text.push_str(piece.unwrap_or_default());
    }
    text
}

// -------------------------------------------------------------------------------------------
// An in-process HTTPS client through latchkey

/// One HTTPS request through latchkey: CONNECT (with `Proxy-Authorization` for `user`), a TLS
/// handshake trusting only latchkey's CA, then the request over HTTP/1.1.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    /// `https://HOST:PORT/PATH?QUERY`
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Send the body chunked (in pieces of this many bytes) instead of with a Content-Length.
    pub chunked: Option<usize>,
    /// `NAME:TOKEN` for the identity.
    pub user: Option<String>,
}

/// The TLS stream to latchkey's interception of one host.
pub type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

impl Call {
    pub fn post(url: &str, body: &Value) -> Call {
        Call {
            method: "POST".into(),
            url: url.to_string(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.to_string().into_bytes(),
            chunked: None,
            user: None,
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Call {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    pub fn user(mut self, user: &str) -> Call {
        self.user = Some(user.to_string());
        self
    }

    pub fn chunked(mut self, piece: usize) -> Call {
        self.chunked = Some(piece);
        self
    }

    pub fn raw_body(mut self, body: Vec<u8>) -> Call {
        self.body = body;
        self
    }

    fn authority(&self) -> (&str, &str) {
        let rest = self
            .url
            .strip_prefix("https://")
            .unwrap_or_else(|| panic!("Call wants an https URL: {}", self.url));
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        (authority, path)
    }

    /// Opens the tunnel and sends the request; returns the stream positioned at the response.
    /// `Err` when latchkey refused the CONNECT itself (its answer).
    pub fn send(&self, lk: &Latchkey) -> Result<Tls, RawResponse> {
        let (authority, path) = self.authority();
        let mut tcp = super::clients::dial(lk.addr());
        let mut connect = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
        if let Some(user) = &self.user {
            connect.push_str(&format!(
                "Proxy-Authorization: Basic {}\r\n",
                STANDARD.encode(user)
            ));
        }
        connect.push_str("\r\n");
        tcp.write_all(connect.as_bytes()).expect("send CONNECT");
        let resp = read_response(&mut tcp, true).expect("read CONNECT answer");
        if resp.status != 200 {
            return Err(resp);
        }
        let host = authority.split(':').next().expect("host");
        let config = tls_config(&lk.ca_pem_path(), &[b"http/1.1"]);
        let name = ServerName::try_from(host.to_string()).expect("server name");
        let mut conn = rustls::ClientConnection::new(config, name).expect("TLS client");
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp)
                .expect("TLS handshake with latchkey");
        }
        tcp.set_read_timeout(Some(Duration::from_millis(50)))
            .expect("read timeout");
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let mut head = format!(
            "{} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n",
            self.method
        );
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        match self.chunked {
            Some(_) => head.push_str("Transfer-Encoding: chunked\r\n"),
            None if self.method == "GET" && self.body.is_empty() => {}
            None => head.push_str(&format!("Content-Length: {}\r\n", self.body.len())),
        }
        head.push_str("\r\n");
        let mut wire = head.into_bytes();
        match self.chunked {
            Some(piece) => {
                for part in self.body.chunks(piece.max(1)) {
                    wire.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                    wire.extend_from_slice(part);
                    wire.extend_from_slice(b"\r\n");
                }
                wire.extend_from_slice(b"0\r\n\r\n");
            }
            None => wire.extend_from_slice(&self.body),
        }
        // latchkey may refuse before reading the body: a failed write is not the test's
        // failure, the answer says what happened.
        let _ = tls.write_all(&wire);
        let _ = tls.flush();
        Ok(tls)
    }

    /// Sends the request and reads the whole response (within 30 s).
    pub fn run(&self, lk: &Latchkey) -> RawResponse {
        let tls = match self.send(lk) {
            Ok(tls) => tls,
            Err(refused) => return refused,
        };
        let mut resp = StreamedResponse::start(tls, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{} {}: no response head: {e}", self.method, self.url));
        resp.read_to_end(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{} {}: body: {e}", self.method, self.url));
        RawResponse {
            status: resp.status,
            headers: resp.headers.clone(),
            body: resp.body.clone(),
        }
    }

    /// Sends the request and returns the response with its head read, for reading a stream
    /// as it arrives.
    pub fn stream(&self, lk: &Latchkey) -> StreamedResponse<Tls> {
        let tls = self
            .send(lk)
            .unwrap_or_else(|r| panic!("CONNECT refused: {r:#?}"));
        StreamedResponse::start(tls, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{} {}: no response head: {e}", self.method, self.url))
    }
}

// -------------------------------------------------------------------------------------------
// The world

/// The sandbox identities of a [`LimitsWorld`] and their tokens (distinctive, so a leak shows).
pub const IDENTITIES: &[(&str, &str)] = &[
    ("agent", "tok-limits-agent-5e1c9a3f7b"),
    ("other", "tok-limits-other-2d8b4f6a0c"),
];

/// The admin token of a [`LimitsWorld`] (`--admin-token env:LK_ADMIN_TOKEN`).
pub const ADMIN_TOKEN: &str = "adm-limits-9f3a7c1e5b0d2468";

/// `NAME:TOKEN` of identity `name`, for [`Call::user`] and proxy URLs.
pub fn user(name: &str) -> String {
    let (_, token) = IDENTITIES
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no test identity {name}"));
    format!("{name}:{token}")
}

/// `[identities.*]` for [`IDENTITIES`], each allowed every rule and charged `limits`
/// (`name → TOML array body`, e.g. `"\"per-agent\""`).
pub fn identities_toml(limits: &[(&str, &str)]) -> String {
    IDENTITIES
        .iter()
        .map(|(name, _)| {
            let attached = limits
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, l)| format!("limits = [{l}]\n"))
                .unwrap_or_default();
            format!(
                "[identities.{name}]\ntoken = \"env:LK_TOKEN_{}\"\nrules = [\"*\"]\n{attached}\n",
                name.to_uppercase()
            )
        })
        .collect()
}

/// The secret every provider rule injects (`authorization: Bearer …` from `env:`), so that
/// every test also sweeps for a leaked credential.
pub const SECRET_TOML: &str = "[secrets.provider]\nsource = \"env:TEST_OPENAI_KEY\"\n\n";

/// A rule `name` for `host` on the fake's port (`PORT`), injecting the provider key, charged
/// `limits` (a TOML array body; empty: the rule has no limits).
pub fn provider_rule(name: &str, host: &str, limits: &str) -> String {
    let limits = if limits.is_empty() {
        String::new()
    } else {
        format!("limits = [{limits}]\n")
    };
    format!(
        r#"
[[rules]]
name   = "{name}"
hosts  = ["{host}"]
ports  = [PORT]
{limits}[rules.inject.headers]
authorization = "Bearer {{{{secret.provider}}}}"
"#
    )
}

/// The fake provider, latchkey in front of it with a policy, and what the sandbox saw.
pub struct LimitsWorld {
    pub lk: Latchkey,
    pub providers: Providers,
    /// Signed the fake's certificate: lives as long as the world.
    _ca: TestCa,
    seen: Mutex<Vec<(String, Vec<u8>)>>,
}

/// latchkey trusting `ca` with `policy` (`PORT` already replaced by the fake's port), the
/// provider hosts and the usual test names pinned, the identities' tokens, the provider key
/// and the admin token in its environment; `configure` adds arguments (`--state`).
pub fn limits_latchkey(
    ca: &TestCa,
    policy: &str,
    configure: impl FnOnce(LatchkeyBuilder) -> LatchkeyBuilder,
) -> Latchkey {
    let mut builder = latchkey()
        .upstream_ca(ca)
        .env("TEST_OPENAI_KEY", OPENAI)
        .env("LK_ADMIN_TOKEN", ADMIN_TOKEN)
        .policy("main.toml", policy);
    for (name, token) in IDENTITIES {
        builder = builder.env(&format!("LK_TOKEN_{}", name.to_uppercase()), token);
    }
    for host in PINNED
        .iter()
        .chain(&[OPENAI_HOST, ANTHROPIC_HOST, GEMINI_HOST])
    {
        builder = builder.pin(host);
    }
    configure(builder).run()
}

/// Starts a [`LimitsWorld`]: the fake, then latchkey with `policy` (`PORT`: the fake's port).
pub fn limits_world(
    policy: &str,
    configure: impl FnOnce(LatchkeyBuilder) -> LatchkeyBuilder,
) -> LimitsWorld {
    let ca = TestCa::new();
    let providers = Providers::start(&ca);
    let policy = policy.replace("PORT", &providers.port().to_string());
    let lk = limits_latchkey(&ca, &policy, configure);
    LimitsWorld {
        lk,
        providers,
        _ca: ca,
        seen: Mutex::new(Vec::new()),
    }
}

/// The values no output may hold: the provider key, the identities' tokens, the admin token.
pub fn tracked_secrets() -> Vec<(String, String)> {
    let mut all = vec![
        ("provider key".to_string(), OPENAI.to_string()),
        ("admin token".to_string(), ADMIN_TOKEN.to_string()),
    ];
    for (name, token) in IDENTITIES {
        all.push((format!("identity {name}'s token"), token.to_string()));
    }
    all
}

/// Panics if any tracked secret is in latchkey's stderr, stdout or audit file.
pub fn sweep_latchkey(lk: &Latchkey) {
    let secrets = tracked_secrets();
    assert_no_leak("latchkey's stderr", lk.stderr_text().as_bytes(), &secrets);
    assert_no_leak("latchkey's stdout", lk.stdout_text().as_bytes(), &secrets);
    assert_no_leak("the audit file", lk.audit_text().as_bytes(), &secrets);
}

impl LimitsWorld {
    pub fn port(&self) -> u16 {
        self.providers.port()
    }

    /// `https://HOST:PORT{path}` on the fake.
    pub fn url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.port())
    }

    /// Records something the sandbox saw, for [`LimitsWorld::sweep`].
    pub fn saw(&self, what: &str, bytes: &[u8]) {
        self.seen
            .lock()
            .expect("seen")
            .push((what.to_string(), bytes.to_vec()));
    }

    /// Runs `call` and records the response for the sweep.
    pub fn run(&self, call: &Call) -> RawResponse {
        let resp = call.run(&self.lk);
        self.saw(
            &format!("the response to {} {}", call.method, call.url),
            &super::secrets::response_bytes(&resp),
        );
        resp
    }

    /// Runs `tests/clients/llm_sdk.py` with `spec` (see the script) as identity `identity`
    /// (`None`: no proxy credentials); returns its results, one per call.
    pub fn sdk(&self, identity: Option<&str>, spec: &Value) -> Vec<Value> {
        let out = run_sdk(&self.lk, identity, spec);
        self.saw("llm_sdk.py's output", out.to_string().as_bytes());
        out["results"]
            .as_array()
            .unwrap_or_else(|| panic!("llm_sdk.py printed no results: {out:#}"))
            .clone()
    }

    /// The leak sweep: no tracked secret in latchkey's outputs or anything the sandbox saw.
    pub fn sweep(&self) {
        sweep_latchkey(&self.lk);
        let secrets = tracked_secrets();
        for (what, bytes) in self.seen.lock().expect("seen").iter() {
            assert_no_leak(what, bytes, &secrets);
        }
    }
}

/// Runs `tests/clients/llm_sdk.py SPEC` against `lk` with `HTTPS_PROXY` (carrying the
/// identity's credentials when given) and latchkey's CA as the only trust (`LATCHKEY_CA`, and
/// `SSL_CERT_FILE` / `REQUESTS_CA_BUNDLE` pointed at it too, since this machine sets them to the
/// system bundle). Returns its JSON output; panics with its stderr when it fails.
pub fn run_sdk(lk: &Latchkey, identity: Option<&str>, spec: &Value) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/llm_sdk.py");
    let proxy = match identity {
        Some(name) => format!("http://{}@{}", user(name), lk.addr()),
        None => lk.proxy_url(),
    };
    let ca: PathBuf = lk.ca_pem_path();
    let mut cmd = std::process::Command::new(toolchain::python());
    cmd.arg(script).arg(spec.to_string());
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    for var in [
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_AUTH_TOKEN",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("HTTPS_PROXY", &proxy)
        .env("LATCHKEY_CA", &ca)
        .env("SSL_CERT_FILE", &ca)
        .env("REQUESTS_CA_BUNDLE", &ca)
        .env("NO_PROXY", "");
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(90));
    assert_eq!(
        out.code(),
        Some(0),
        "llm_sdk.py failed: {out:#?}\nlatchkey stderr:\n{}",
        lk.stderr_text()
    );
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("llm_sdk.py printed no JSON ({e}): {out:#?}"))
}

// -------------------------------------------------------------------------------------------
// Reading limits out of records and responses

/// The `limits` entries of an audit record (empty when it has none).
pub fn charges(record: &Value) -> Vec<Value> {
    record["limits"].as_array().cloned().unwrap_or_default()
}

/// The one `limits` entry of `record` for `limit` and `measure`; panics if there is not
/// exactly one.
pub fn charge(record: &Value, limit: &str, measure: &str) -> Value {
    let found: Vec<Value> = charges(record)
        .into_iter()
        .filter(|c| c["limit"] == limit && c["measure"] == measure)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {limit}/{measure} charge in the record: {record:#}"
    );
    found[0].clone()
}

/// A number field of a JSON value; panics naming it when it is missing.
pub fn num(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} is not a count in {v:#}"))
}

/// A header of a response as a number; panics when it is missing or not one.
pub fn header_num(resp: &RawResponse, name: &str) -> u64 {
    resp.header(name)
        .unwrap_or_else(|| panic!("no {name} header: {resp:#?}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{name} is not a number ({e}): {resp:#?}"))
}

/// The records of `records` whose path starts with `prefix`.
pub fn on_path<'a>(records: &'a [Value], prefix: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.starts_with(prefix)))
        .collect()
}

/// The records with `reason`.
pub fn with_reason<'a>(records: &'a [Value], reason: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["reason"] == reason).collect()
}

/// Whether `x` is a 429/503 refusal by latchkey with `reason` (its header and sentence).
pub fn is_refusal(resp: &RawResponse, status: u16, reason: &str) -> bool {
    resp.status == status
        && resp.header("x-latchkey-reason") == Some(reason)
        && resp.text().starts_with("latchkey: ")
}

/// The usage object of a record; panics when it has none.
pub fn usage_of(record: &Value) -> Value {
    let usage = &record["usage"];
    assert!(usage.is_object(), "the record has no usage: {record:#}");
    usage.clone()
}

/// Shared across the limits tests: the responses' rate-limit headers, asserted present and
/// numeric; returns `(limit, remaining, reset)`.
pub fn ratelimit_headers(resp: &RawResponse) -> (u64, u64, u64) {
    (
        header_num(resp, "x-ratelimit-limit"),
        header_num(resp, "x-ratelimit-remaining"),
        header_num(resp, "x-ratelimit-reset"),
    )
}

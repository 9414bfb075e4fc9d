//! LLM usage accounting: which model-provider API a request calls, what it may cost before it
//! is sent (the model and the most output tokens it asks for), and the usage its response
//! reports — read as the response streams past, without delaying it.
//!
//! Providers: OpenAI chat completions (`…/chat/completions`) and responses (`…/responses`),
//! Anthropic messages (`…/v1/messages`), Gemini `…:generateContent` and
//! `…:streamGenerateContent`; each streaming (SSE) or not. Recognised by method and path, so a
//! provider behind another host (a gateway, a test upstream) is metered the same way.
//!
//! Memory is bounded: an SSE event or a JSON body longer than [`MAX_DOCUMENT`] is not parsed
//! (its usage is then unknown and the reservation is charged instead).
//!
//! Pure parsing: this knows nothing of budgets or the state store.

/// The largest single JSON document (a non-streaming body, or one SSE event's data) parsed.
pub const MAX_DOCUMENT: usize = 4 * 1024 * 1024;

/// A model-provider API latchkey meters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
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

    /// The API a request calls, by method and path (without the query); `None` for anything
    /// else (a GET of `/v1/models`, say), which is not metered.
    pub fn detect(method: &http::Method, path: &str) -> Option<Provider> {
        let _ = (method, path);
        todo!("usage parser: provider detection")
    }
}

/// What a request body says about its cost before it is sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFacts {
    /// `model` from the body (Gemini: from the path, `models/NAME:generateContent`).
    pub model: Option<String>,
    /// `max_tokens` / `max_completion_tokens` (OpenAI chat), `max_output_tokens` (responses),
    /// `max_tokens` (Anthropic), `generationConfig.maxOutputTokens` (Gemini).
    pub max_output_tokens: Option<u64>,
    /// The call asks for a streamed (SSE) response.
    pub stream: bool,
    /// An upper estimate of the input tokens: the body's length in bytes divided by
    /// [`BYTES_PER_TOKEN_FLOOR`], rounded up.
    pub input_estimate: u64,
    /// OpenAI chat streaming only: `stream_options.include_usage` is already true.
    pub includes_usage: bool,
}

/// No tokenizer produces fewer bytes per token than this on text; the input estimate divides
/// by it, so it errs high (the settle returns the difference).
pub const BYTES_PER_TOKEN_FLOOR: u64 = 2;

/// Reads what a request body says about its cost. A body that is not JSON gives facts with
/// only `input_estimate` set.
pub fn inspect_request(provider: Provider, path: &str, body: &[u8]) -> RequestFacts {
    let _ = (provider, path, body);
    todo!("usage parser: request facts")
}

/// For a streaming OpenAI chat request without `stream_options.include_usage`: the same body
/// with `"stream_options": {"include_usage": true}` added (other keys of `stream_options`
/// kept). `None` when the body is not such a request or already asks for usage.
pub fn add_include_usage(body: &[u8]) -> Option<Vec<u8>> {
    let _ = body;
    todo!("usage parser: include_usage")
}

/// The usage a response reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// The model the response names (it may differ from the request's alias).
    pub model: Option<String>,
    /// All input tokens, cached ones included.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens served from the provider's prompt cache (OpenAI
    /// `prompt_tokens_details.cached_tokens` / `input_tokens_details.cached_tokens`; Anthropic
    /// `cache_read_input_tokens`; Gemini `cachedContentTokenCount`). Anthropic's
    /// `cache_creation_input_tokens` count as input.
    pub cached_input_tokens: u64,
}

/// Reads a response's usage from its body as it streams: fed each chunk in order, it keeps
/// only what it needs (the unfinished SSE line, or a JSON body up to [`MAX_DOCUMENT`]).
#[derive(Debug)]
pub struct Meter {
    provider: Provider,
}

impl Meter {
    /// A meter for a response of `provider` whose `content-type` is `content_type`
    /// (`text/event-stream` is read as SSE; anything else as one JSON document).
    pub fn new(provider: Provider, content_type: Option<&str>) -> Meter {
        let _ = content_type;
        Meter { provider }
    }

    /// Takes the next chunk of the (decoded) response body.
    pub fn feed(&mut self, chunk: &[u8]) {
        let _ = (chunk, self.provider);
        todo!("usage parser: meter feed")
    }

    /// The usage read, once the body has ended; `None` when the response reported none (an
    /// error response, a stream cut short, OpenAI streaming without `include_usage`).
    pub fn finish(self) -> Option<Usage> {
        todo!("usage parser: meter finish")
    }
}

use super::*;
use proptest::prelude::*;

const SSE: Option<&str> = Some("text/event-stream; charset=utf-8");
const JSON: Option<&str> = Some("application/json");

// --- Recorded-style fixtures, as the providers emit them ---------------------------------------

/// OpenAI chat completions, streaming with `stream_options.include_usage`.
const OPENAI_CHAT_STREAM: &str = concat!(
    "data: {\"id\":\"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4o-2024-08-06\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_eb9dce56a8\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n",
    "\n",
    "data: {\"id\":\"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4o-2024-08-06\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_eb9dce56a8\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n",
    "\n",
    "data: {\"id\":\"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4o-2024-08-06\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_eb9dce56a8\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"! How can I help with \\\"usage\\\" today?\\n\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n",
    "\n",
    "data: {\"id\":\"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4o-2024-08-06\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_eb9dce56a8\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n",
    "\n",
    "data: {\"id\":\"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4o-2024-08-06\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_eb9dce56a8\",\"choices\":[],\"usage\":{\"prompt_tokens\":1931,\"completion_tokens\":12,\"total_tokens\":1943,\"prompt_tokens_details\":{\"cached_tokens\":1792,\"audio_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":0,\"audio_tokens\":0,\"accepted_prediction_tokens\":0,\"rejected_prediction_tokens\":0}}}\n",
    "\n",
    "data: [DONE]\n",
    "\n",
);

/// The same stream without `include_usage`: no usage chunk.
const OPENAI_CHAT_STREAM_NO_USAGE: &str = concat!(
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
);

const OPENAI_CHAT_BODY: &str = r#"{
  "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
  "object": "chat.completion",
  "created": 1741570283,
  "model": "gpt-4o-2024-08-06",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": "The image shows a wooden boardwalk {\"usage\": {\"prompt_tokens\": 1}} in a field.",
        "refusal": null,
        "annotations": []
      },
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 1117,
    "completion_tokens": 46,
    "total_tokens": 1163,
    "prompt_tokens_details": {
      "cached_tokens": 0,
      "audio_tokens": 0
    },
    "completion_tokens_details": {
      "reasoning_tokens": 0,
      "audio_tokens": 0,
      "accepted_prediction_tokens": 0,
      "rejected_prediction_tokens": 0
    }
  },
  "service_tier": "default",
  "system_fingerprint": "fp_fc9f1d7035"
}
"#;

const OPENAI_ERROR_BODY: &str = r#"{
    "error": {
        "message": "Incorrect API key provided: sk-proj-********************. You can find your API key at https://platform.openai.com/account/api-keys.",
        "type": "invalid_request_error",
        "param": null,
        "code": "invalid_api_key"
    }
}
"#;

/// OpenAI responses API, streaming.
const OPENAI_RESPONSES_STREAM: &str = concat!(
    "event: response.created\n",
    "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654\",\"object\":\"response\",\"created_at\":1741290958,\"status\":\"in_progress\",\"error\":null,\"incomplete_details\":null,\"instructions\":\"You are a helpful assistant.\",\"max_output_tokens\":null,\"model\":\"gpt-4.1-2025-04-14\",\"output\":[],\"parallel_tool_calls\":true,\"previous_response_id\":null,\"reasoning\":{\"effort\":null,\"summary\":null},\"store\":true,\"temperature\":1.0,\"text\":{\"format\":{\"type\":\"text\"}},\"tool_choice\":\"auto\",\"tools\":[],\"top_p\":1.0,\"truncation\":\"disabled\",\"usage\":null,\"user\":null,\"metadata\":{}}}\n",
    "\n",
    "event: response.in_progress\n",
    "data: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654\",\"object\":\"response\",\"created_at\":1741290958,\"status\":\"in_progress\",\"model\":\"gpt-4.1-2025-04-14\",\"output\":[],\"usage\":null,\"metadata\":{}}}\n",
    "\n",
    "event: response.output_item.added\n",
    "data: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,\"item\":{\"id\":\"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654\",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n",
    "\n",
    "event: response.content_part.added\n",
    "data: {\"type\":\"response.content_part.added\",\"sequence_number\":3,\"item_id\":\"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654\",\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}\n",
    "\n",
    "event: response.output_text.delta\n",
    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"item_id\":\"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n",
    "\n",
    "event: response.output_text.delta\n",
    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":5,\"item_id\":\"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654\",\"output_index\":0,\"content_index\":0,\"delta\":\" there!\"}\n",
    "\n",
    "event: response.output_text.done\n",
    "data: {\"type\":\"response.output_text.done\",\"sequence_number\":6,\"item_id\":\"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654\",\"output_index\":0,\"content_index\":0,\"text\":\"Hi there!\"}\n",
    "\n",
    "event: response.completed\n",
    "data: {\"type\":\"response.completed\",\"sequence_number\":7,\"response\":{\"id\":\"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654\",\"object\":\"response\",\"created_at\":1741290958,\"status\":\"completed\",\"error\":null,\"incomplete_details\":null,\"instructions\":\"You are a helpful assistant.\",\"max_output_tokens\":null,\"model\":\"gpt-4.1-2025-04-14\",\"output\":[{\"id\":\"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654\",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi there!\",\"annotations\":[]}]}],\"parallel_tool_calls\":true,\"previous_response_id\":null,\"reasoning\":{\"effort\":null,\"summary\":null},\"store\":true,\"temperature\":1.0,\"text\":{\"format\":{\"type\":\"text\"}},\"tool_choice\":\"auto\",\"tools\":[],\"top_p\":1.0,\"truncation\":\"disabled\",\"usage\":{\"input_tokens\":37,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":11,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":48},\"user\":null,\"metadata\":{}}}\n",
    "\n",
);

const OPENAI_RESPONSES_BODY: &str = r#"{
  "id": "resp_67ccd3a9da748190baa7f1570fe91ac604becb25c45c1d41",
  "object": "response",
  "created_at": 1741476777,
  "status": "completed",
  "error": null,
  "incomplete_details": null,
  "instructions": null,
  "max_output_tokens": null,
  "model": "o4-mini-2025-04-16",
  "output": [
    {"id": "rs_1", "type": "reasoning", "summary": []},
    {
      "type": "message",
      "id": "msg_67ccd3acc8d48190a77525dc6de64b4104becb25c45c1d41",
      "status": "completed",
      "role": "assistant",
      "content": [{"type": "output_text", "text": "The image depicts a scenic landscape.", "annotations": []}]
    }
  ],
  "parallel_tool_calls": true,
  "reasoning": {"effort": "medium", "summary": null},
  "usage": {
    "input_tokens": 328,
    "input_tokens_details": {"cached_tokens": 128},
    "output_tokens": 352,
    "output_tokens_details": {"reasoning_tokens": 320},
    "total_tokens": 680
  },
  "user": null,
  "metadata": {}
}"#;

/// Anthropic messages, streaming (with a ping and a cache read).
const ANTHROPIC_STREAM: &str = concat!(
    "event: message_start\n",
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01XFDUDYJgAACzvnptvVoYEL\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5-20250929\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":472,\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":2048,\"cache_creation\":{\"ephemeral_5m_input_tokens\":100,\"ephemeral_1h_input_tokens\":0},\"output_tokens\":2,\"service_tier\":\"standard\"}}}\n",
    "\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n",
    "\n",
    "event: ping\n",
    "data: {\"type\": \"ping\"}\n",
    "\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n",
    "\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"! event: message_delta\\n\\ndata: {\\\"usage\\\":{\\\"output_tokens\\\":1}}\"}}\n",
    "\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n",
    "\n",
    "event: message_delta\n",
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n",
    "\n",
    "event: message_stop\n",
    "data: {\"type\":\"message_stop\"}\n",
    "\n",
);

const ANTHROPIC_BODY: &str = r#"{"id":"msg_013Zva2CMHLNnXjNJJKqJ2EF","type":"message","role":"assistant","model":"claude-opus-4-1-20250805","content":[{"type":"text","text":"Hi! My name is Claude."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2095,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":503}}"#;

const ANTHROPIC_ERROR_BODY: &str = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#;

/// Gemini `streamGenerateContent?alt=sse` (Google ends lines with CRLF).
const GEMINI_SSE: &str = concat!(
    "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"The\"}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 8,\"totalTokenCount\": 8,\"promptTokensDetails\": [{\"modality\": \"TEXT\",\"tokenCount\": 8}]},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"mAitaJi1H8-QmNAPrOCE4Q8\"}\r\n",
    "\r\n",
    "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \" sky is blue because of Rayleigh scattering.\"}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 8,\"candidatesTokenCount\": 9,\"totalTokenCount\": 42,\"thoughtsTokenCount\": 25},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"mAitaJi1H8-QmNAPrOCE4Q8\"}\r\n",
    "\r\n",
    "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"\"}],\"role\": \"model\"},\"finishReason\": \"STOP\",\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 8,\"candidatesTokenCount\": 12,\"totalTokenCount\": 45,\"cachedContentTokenCount\": 4,\"promptTokensDetails\": [{\"modality\": \"TEXT\",\"tokenCount\": 8}],\"thoughtsTokenCount\": 25},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"mAitaJi1H8-QmNAPrOCE4Q8\"}\r\n",
    "\r\n",
);

/// Gemini `streamGenerateContent` without `alt=sse`: one JSON array, streamed element by
/// element.
const GEMINI_ARRAY: &str = concat!(
    "[{\n  \"candidates\": [\n    {\n      \"content\": {\n        \"parts\": [\n          {\n            \"text\": \"The [sky] {is}\"\n          }\n        ],\n        \"role\": \"model\"\n      },\n      \"index\": 0\n    }\n  ],\n",
    "  \"usageMetadata\": {\n    \"promptTokenCount\": 8,\n    \"totalTokenCount\": 8\n  },\n  \"modelVersion\": \"gemini-2.0-flash\"\n}\n",
    ",\r\n",
    "{\n  \"candidates\": [\n    {\n      \"content\": {\n        \"parts\": [\n          {\n            \"text\": \" blue.\\\"}]\"\n          }\n        ],\n        \"role\": \"model\"\n      },\n      \"finishReason\": \"STOP\",\n      \"index\": 0\n    }\n  ],\n",
    "  \"usageMetadata\": {\n    \"promptTokenCount\": 8,\n    \"candidatesTokenCount\": 5,\n    \"totalTokenCount\": 13,\n    \"toolUsePromptTokenCount\": 3\n  },\n  \"modelVersion\": \"gemini-2.0-flash\"\n}\n",
    "]",
);

const GEMINI_BODY: &str = r#"{
  "candidates": [
    {
      "content": {"parts": [{"text": "Hello there."}], "role": "model"},
      "finishReason": "STOP",
      "avgLogprobs": -0.0312
    }
  ],
  "usageMetadata": {
    "promptTokenCount": 4,
    "candidatesTokenCount": 3,
    "totalTokenCount": 7,
    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 4}],
    "candidatesTokensDetails": [{"modality": "TEXT", "tokenCount": 3}]
  },
  "modelVersion": "gemini-2.0-flash",
  "responseId": "6Qf3Z8rWA5u5nvgP6t6K0Qw"
}"#;

const GEMINI_ERROR_BODY: &str = r#"{
  "error": {
    "code": 400,
    "message": "API key not valid. Please pass a valid API key.",
    "status": "INVALID_ARGUMENT"
  }
}"#;

// --- Helpers ----------------------------------------------------------------------------------

/// Meters `body` fed in chunks of the given sizes (cycled), then the rest.
fn meter_chunked(
    provider: Provider,
    ct: Option<&str>,
    body: &[u8],
    sizes: &[usize],
) -> (Option<Usage>, bool) {
    let mut m = Meter::new(provider, ct);
    let mut rest = body;
    let mut i = 0;
    while !rest.is_empty() {
        let n = if sizes.is_empty() {
            rest.len()
        } else {
            sizes[i % sizes.len()].clamp(1, rest.len())
        };
        m.feed(&rest[..n]);
        rest = &rest[n..];
        i += 1;
    }
    let complete = m.complete();
    (m.finish(), complete)
}

fn meter(provider: Provider, ct: Option<&str>, body: &str) -> (Option<Usage>, bool) {
    meter_chunked(provider, ct, body.as_bytes(), &[])
}

/// The body metered whole, one byte at a time, and split in two at every byte boundary all give
/// the same result; returns it.
fn same_at_every_split(provider: Provider, ct: Option<&str>, body: &str) -> (Option<Usage>, bool) {
    let whole = meter(provider, ct, body);
    assert_eq!(
        meter_chunked(provider, ct, body.as_bytes(), &[1]),
        whole,
        "one byte at a time"
    );
    for k in 0..=body.len() {
        let mut m = Meter::new(provider, ct);
        m.feed(&body.as_bytes()[..k]);
        m.feed(&body.as_bytes()[k..]);
        let complete = m.complete();
        assert_eq!((m.finish(), complete), whole, "split at byte {k}");
    }
    whole
}

fn usage(model: &str, input: u64, output: u64, cached: u64) -> Option<Usage> {
    Some(Usage {
        model: Some(model.to_string()),
        input_tokens: input,
        output_tokens: output,
        cached_input_tokens: cached,
    })
}

// --- Provider detection -----------------------------------------------------------------------

#[test]
fn detects_each_provider_by_method_and_path() {
    let post = http::Method::POST;
    let cases = [
        ("/v1/chat/completions", Some(Provider::OpenAiChat)),
        ("/v1/chat/completions?api-version=1", Some(Provider::OpenAiChat)),
        (
            "/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21",
            Some(Provider::OpenAiChat),
        ),
        ("/v1/completions", Some(Provider::OpenAiChat)),
        ("/api/v1/chat/completions/", Some(Provider::OpenAiChat)),
        ("/v1/chat/completion%73", Some(Provider::OpenAiChat)),
        ("/v1/responses", Some(Provider::OpenAiResponses)),
        ("/openai/v1/responses", Some(Provider::OpenAiResponses)),
        ("/v1/messages", Some(Provider::Anthropic)),
        ("/v1/messages?beta=true", Some(Provider::Anthropic)),
        ("/anthropic/v1/messages", Some(Provider::Anthropic)),
        (
            "/v1beta/models/gemini-2.5-flash:generateContent",
            Some(Provider::Gemini),
        ),
        (
            "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
            Some(Provider::Gemini),
        ),
        (
            "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.0-flash:generateContent",
            Some(Provider::Gemini),
        ),
        (
            "/v1beta/models/gemini-2.5-flash%3AgenerateContent",
            Some(Provider::Gemini),
        ),
        // Not generation calls.
        ("/v1/messages/count_tokens", None),
        ("/v1/messages/batches", None),
        ("/v1/threads/thread_abc/messages", None),
        ("/v1/responses/resp_123/cancel", None),
        ("/v1/responses/input_tokens", None),
        ("/v1beta/models/gemini-2.5-flash:countTokens", None),
        ("/v1beta/models/gemini-2.5-flash:generateContentX", None),
        ("/v1/embeddings", None),
        ("/v1/models", None),
        ("/", None),
        ("", None),
    ];
    for (path, want) in cases {
        assert_eq!(Provider::detect(&post, path), want, "{path}");
    }
    assert_eq!(
        Provider::detect(&http::Method::GET, "/v1/chat/completions"),
        None
    );
    assert_eq!(Provider::detect(&http::Method::PUT, "/v1/messages"), None);
    assert_eq!(Provider::OpenAiResponses.name(), "openai");
    assert_eq!(Provider::Gemini.name(), "gemini");
}

// --- Request facts ----------------------------------------------------------------------------

#[test]
fn openai_chat_request_facts() {
    let body = br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":100,"max_completion_tokens":300,"stream":true,"stream_options":{"include_usage":true}}"#;
    let f = inspect_request(Provider::OpenAiChat, "/v1/chat/completions", body);
    assert_eq!(f.model.as_deref(), Some("gpt-4o"));
    assert_eq!(f.max_output_tokens, Some(300));
    assert!(f.stream);
    assert!(f.includes_usage);
    assert_eq!(f.choices, 1);
    assert_eq!(f.input_estimate, (body.len() as u64).div_ceil(2));

    let f = inspect_request(
        Provider::OpenAiChat,
        "/v1/chat/completions",
        br#"{"model":"gpt-4o","max_tokens":100,"messages":[]}"#,
    );
    assert_eq!(f.max_output_tokens, Some(100));
    assert!(!f.stream && !f.includes_usage);
}

#[test]
fn choices_multiply_the_output_maximum_and_the_default_reserve() {
    let f = inspect_request(
        Provider::OpenAiChat,
        "/v1/chat/completions",
        br#"{"model":"gpt-4o","n":3,"max_tokens":100}"#,
    );
    assert_eq!((f.choices, f.max_output_tokens), (3, Some(300)));
    assert_eq!(f.output_reserve(4096), 300);
    let f = inspect_request(
        Provider::OpenAiChat,
        "/v1/completions",
        br#"{"n":2,"best_of":5}"#,
    );
    assert_eq!((f.choices, f.max_output_tokens), (5, None));
    assert_eq!(f.output_reserve(1000), 5000);
    let f = inspect_request(
        Provider::Gemini,
        "/v1beta/models/gemini-2.5-pro:generateContent",
        br#"{"contents":[],"generationConfig":{"candidateCount":2,"maxOutputTokens":"50"}}"#,
    );
    assert_eq!((f.choices, f.max_output_tokens), (2, Some(100)));
    // n = 0 or nonsense counts as one.
    let f = inspect_request(Provider::OpenAiChat, "/v1/chat/completions", br#"{"n":0}"#);
    assert_eq!(f.choices, 1);
    assert_eq!(RequestFacts::default().output_reserve(7), 7);
}

#[test]
fn responses_anthropic_and_gemini_request_facts() {
    let f = inspect_request(
        Provider::OpenAiResponses,
        "/v1/responses",
        br#"{"model":"o4-mini","input":"hi","max_output_tokens":2048,"max_tokens":5,"stream":true}"#,
    );
    assert_eq!(f.model.as_deref(), Some("o4-mini"));
    assert_eq!(f.max_output_tokens, Some(2048));
    assert!(f.stream);
    assert!(
        !f.includes_usage,
        "include_usage is a chat completions option"
    );

    let f = inspect_request(
        Provider::Anthropic,
        "/v1/messages",
        br#"{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"Hello"}],"stream":true}"#,
    );
    assert_eq!(f.model.as_deref(), Some("claude-sonnet-4-5"));
    assert_eq!(f.max_output_tokens, Some(1024));
    assert!(f.stream);

    let f = inspect_request(
        Provider::Gemini,
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        br#"{"contents":[{"parts":[{"text":"hi"}]}],"generationConfig":{"temperature":0.2,"maxOutputTokens":800},"model":"ignored"}"#,
    );
    assert_eq!(f.model.as_deref(), Some("gemini-2.5-flash"));
    assert_eq!(f.max_output_tokens, Some(800));
    assert!(f.stream);

    let f = inspect_request(
        Provider::Gemini,
        "/v1beta/models/gemini-2.0-flash:generateContent",
        br#"{"generation_config":{"max_output_tokens":64}}"#,
    );
    assert_eq!(f.max_output_tokens, Some(64));
    assert!(!f.stream);
}

#[test]
fn gemini_facts_from_the_path_survive_a_body_that_is_not_json() {
    let f = inspect_request(
        Provider::Gemini,
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
        b"not json at all",
    );
    assert_eq!(f.model.as_deref(), Some("gemini-2.5-pro"));
    assert!(f.stream);
    assert_eq!(f.max_output_tokens, None);
    assert_eq!(f.input_estimate, 8);
}

#[test]
fn a_body_that_is_not_a_json_object_gives_only_the_estimate() {
    for body in [
        &b""[..],
        b"garbage",
        b"[1,2,3]",
        b"\"max_tokens\"",
        b"{\"max_tokens\": 5",
        b"{\"max_tokens\": 5}}",
        b"\xff\xfe{}",
    ] {
        let f = inspect_request(Provider::OpenAiChat, "/v1/chat/completions", body);
        assert_eq!(
            f,
            RequestFacts {
                input_estimate: (body.len() as u64).div_ceil(2),
                ..RequestFacts::default()
            },
            "{body:?}"
        );
    }
}

#[test]
fn counts_are_read_leniently_and_never_below_what_was_asked() {
    let max = |json: &str| {
        inspect_request(Provider::Anthropic, "/v1/messages", json.as_bytes()).max_output_tokens
    };
    assert_eq!(max(r#"{"max_tokens":-5}"#), None);
    assert_eq!(max(r#"{"max_tokens":1.5}"#), None);
    assert_eq!(max(r#"{"max_tokens":null}"#), None);
    assert_eq!(max(r#"{"max_tokens":true}"#), None);
    assert_eq!(max(r#"{"max_tokens":[1]}"#), None);
    assert_eq!(max(r#"{"max_tokens":{"a":1}}"#), None);
    assert_eq!(max(r#"{"max_tokens":"12a"}"#), None);
    assert_eq!(max(r#"{"max_tokens":1e5}"#), Some(100_000));
    assert_eq!(max(r#"{"max_tokens":2048.0}"#), Some(2048));
    assert_eq!(max(r#"{"max_tokens":"4096"}"#), Some(4096));
    assert_eq!(
        max(r#"{"max_tokens":18446744073709551615}"#),
        Some(u64::MAX)
    );
    assert_eq!(
        max(r#"{"max_tokens":18446744073709551616}"#),
        Some(u64::MAX)
    );
    assert_eq!(max(r#"{"max_tokens":1e300}"#), Some(u64::MAX));
    assert_eq!(
        max(r#"{"max_tokens":"99999999999999999999999999"}"#),
        Some(u64::MAX)
    );
    // A key given twice counts at its largest, whichever the provider reads.
    assert_eq!(
        max(r#"{"max_tokens":100000,"max_tokens":10}"#),
        Some(100_000)
    );
    assert_eq!(
        max(r#"{"max_tokens":10,"max_tokens":100000}"#),
        Some(100_000)
    );
    // An escaped key is the same key.
    assert_eq!(max(r#"{"max\u005ftokens":777}"#), Some(777));
    // Odd members elsewhere do not hide the count.
    assert_eq!(
        max(r#"{"model":7,"stream":"yes","metadata":{"x":[1,{"y":null}]},"max_tokens":9}"#),
        Some(9)
    );
    let f = inspect_request(
        Provider::OpenAiChat,
        "/v1/chat/completions",
        br#"{"n":1e400}"#,
    );
    assert!(
        f.max_output_tokens.is_none(),
        "1e400 is not a JSON number serde reads"
    );
}

#[test]
fn a_large_body_still_names_its_maximum() {
    let big = "x".repeat(MAX_DOCUMENT + 10);
    let body = format!(
        r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"{big}"}}],"max_tokens":50000}}"#
    );
    let f = inspect_request(
        Provider::OpenAiChat,
        "/v1/chat/completions",
        body.as_bytes(),
    );
    assert_eq!(f.max_output_tokens, Some(50_000));
    assert_eq!(f.input_estimate, (body.len() as u64).div_ceil(2));
}

#[test]
fn an_absurd_model_name_is_not_kept() {
    let body = format!(r#"{{"model":"{}","max_tokens":1}}"#, "m".repeat(300));
    let f = inspect_request(Provider::Anthropic, "/v1/messages", body.as_bytes());
    assert_eq!(f.model, None);
    assert_eq!(f.max_output_tokens, Some(1));
    let f = inspect_request(Provider::Anthropic, "/v1/messages", br#"{"model":""}"#);
    assert_eq!(f.model, None);
}

// --- include_usage ----------------------------------------------------------------------------

#[test]
fn include_usage_is_spliced_in_keeping_every_other_byte() {
    let body = b"{\"model\":\"gpt-4o\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"}\"}]}\n";
    let out = add_include_usage(body).unwrap();
    assert_eq!(
        out,
        b"{\"model\":\"gpt-4o\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"}\"}],\"stream_options\":{\"include_usage\":true}}\n"
            .to_vec()
    );
    let f = inspect_request(Provider::OpenAiChat, "/v1/chat/completions", &out);
    assert!(f.includes_usage);
    assert_eq!(add_include_usage(&out), None, "already asks for usage");
}

#[test]
fn include_usage_keeps_other_stream_options() {
    let body = br#"{"stream":true,"stream_options":{"include_obfuscation":false,"include_usage":false},"model":"gpt-4o"}"#;
    let out = add_include_usage(body).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"stream": true, "model": "gpt-4o",
            "stream_options": {"include_obfuscation": false, "include_usage": true}})
    );
    let out = add_include_usage(br#"{"stream":true,"stream_options":null}"#).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v["stream_options"],
        serde_json::json!({"include_usage": true})
    );
}

#[test]
fn include_usage_is_left_alone_when_it_does_not_apply() {
    for body in [
        &br#"{"model":"gpt-4o","messages":[]}"#[..],
        br#"{"stream":false}"#,
        br#"{"stream":"true"}"#,
        br#"{"stream":true,"stream_options":{"include_usage":true}}"#,
        br#"{"stream":true,"stream_options":"x"}"#,
        br#"[{"stream":true}]"#,
        b"not json",
        b"",
    ] {
        assert_eq!(
            add_include_usage(body),
            None,
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    let big = format!(r#"{{"stream":true,"x":"{}"}}"#, "a".repeat(MAX_DOCUMENT));
    assert_eq!(add_include_usage(big.as_bytes()), None);
}

// --- Meter: each provider, streaming and not --------------------------------------------------

#[test]
fn openai_chat_stream_usage_at_every_split() {
    let got = same_at_every_split(Provider::OpenAiChat, SSE, OPENAI_CHAT_STREAM);
    assert_eq!(got, (usage("gpt-4o-2024-08-06", 1931, 12, 1792), true));
}

#[test]
fn openai_chat_stream_without_include_usage_reports_none() {
    let got = same_at_every_split(Provider::OpenAiChat, SSE, OPENAI_CHAT_STREAM_NO_USAGE);
    assert_eq!(got, (None, false));
}

#[test]
fn openai_chat_body_usage_at_every_split() {
    let got = same_at_every_split(Provider::OpenAiChat, JSON, OPENAI_CHAT_BODY);
    assert_eq!(got, (usage("gpt-4o-2024-08-06", 1117, 46, 0), true));
}

#[test]
fn openai_responses_stream_usage_at_every_split() {
    let got = same_at_every_split(Provider::OpenAiResponses, SSE, OPENAI_RESPONSES_STREAM);
    assert_eq!(got, (usage("gpt-4.1-2025-04-14", 37, 11, 0), true));
}

#[test]
fn openai_responses_body_usage() {
    let got = same_at_every_split(Provider::OpenAiResponses, JSON, OPENAI_RESPONSES_BODY);
    assert_eq!(got, (usage("o4-mini-2025-04-16", 328, 352, 128), true));
}

#[test]
fn openai_responses_incomplete_and_failed_are_final() {
    for kind in ["response.incomplete", "response.failed"] {
        let stream = format!(
            "event: {kind}\ndata: {{\"type\":\"{kind}\",\"response\":{{\"model\":\"gpt-5\",\"status\":\"incomplete\",\"usage\":{{\"input_tokens\":10,\"output_tokens\":20}}}}}}\n\n"
        );
        assert_eq!(
            meter(Provider::OpenAiResponses, SSE, &stream),
            (usage("gpt-5", 10, 20, 0), true),
            "{kind}"
        );
    }
}

#[test]
fn anthropic_stream_usage_at_every_split() {
    let got = same_at_every_split(Provider::Anthropic, SSE, ANTHROPIC_STREAM);
    // input = 472 fresh + 2048 cache reads + 100 cache writes; output from message_delta.
    assert_eq!(
        got,
        (usage("claude-sonnet-4-5-20250929", 2620, 15, 2048), true)
    );
}

#[test]
fn anthropic_message_delta_may_repeat_the_input_counts() {
    let stream = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-haiku-4-5\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"input_tokens\":12,\"cache_read_input_tokens\":5,\"output_tokens\":40}}\n\n",
    );
    assert_eq!(
        meter(Provider::Anthropic, SSE, stream),
        (usage("claude-haiku-4-5", 17, 40, 5), true)
    );
}

#[test]
fn anthropic_stream_cut_after_message_start_is_not_complete() {
    let cut = &ANTHROPIC_STREAM[..ANTHROPIC_STREAM.find("event: message_delta").unwrap()];
    assert_eq!(
        meter(Provider::Anthropic, SSE, cut),
        (usage("claude-sonnet-4-5-20250929", 2620, 2, 2048), false)
    );
}

#[test]
fn anthropic_body_usage() {
    let got = same_at_every_split(Provider::Anthropic, JSON, ANTHROPIC_BODY);
    assert_eq!(got, (usage("claude-opus-4-1-20250805", 2095, 503, 0), true));
}

#[test]
fn gemini_sse_usage_at_every_split() {
    let got = same_at_every_split(Provider::Gemini, SSE, GEMINI_SSE);
    // output = 12 candidates + 25 thoughts.
    assert_eq!(got, (usage("gemini-2.5-flash", 8, 37, 4), true));
}

#[test]
fn gemini_streamed_json_array_at_every_split() {
    let got = same_at_every_split(Provider::Gemini, JSON, GEMINI_ARRAY);
    // input = 8 prompt + 3 tool-use prompt.
    assert_eq!(got, (usage("gemini-2.0-flash", 11, 5, 0), true));
    // Cut after the first element: partial, not complete.
    let cut = &GEMINI_ARRAY[..GEMINI_ARRAY.find(",\r\n").unwrap()];
    assert_eq!(
        meter(Provider::Gemini, JSON, cut),
        (usage("gemini-2.0-flash", 8, 0, 0), false)
    );
}

#[test]
fn gemini_body_usage() {
    let got = same_at_every_split(Provider::Gemini, JSON, GEMINI_BODY);
    assert_eq!(got, (usage("gemini-2.0-flash", 4, 3, 0), true));
}

#[test]
fn gemini_blocked_prompt_is_final() {
    let body = r#"{"promptFeedback":{"blockReason":"SAFETY"},"usageMetadata":{"promptTokenCount":9,"totalTokenCount":9},"modelVersion":"gemini-2.5-flash"}"#;
    assert_eq!(
        meter(Provider::Gemini, JSON, body),
        (usage("gemini-2.5-flash", 9, 0, 0), true)
    );
}

#[test]
fn error_bodies_report_no_usage() {
    for (p, body) in [
        (Provider::OpenAiChat, OPENAI_ERROR_BODY),
        (Provider::OpenAiResponses, OPENAI_ERROR_BODY),
        (Provider::Anthropic, ANTHROPIC_ERROR_BODY),
        (Provider::Gemini, GEMINI_ERROR_BODY),
        (
            Provider::OpenAiChat,
            "<html><body>502 Bad Gateway</body></html>",
        ),
        (Provider::Anthropic, ""),
    ] {
        assert_eq!(meter(p, JSON, body), (None, false), "{p:?}: {body}");
        assert_eq!(meter(p, None, body), (None, false), "{p:?}: {body}");
    }
    let sse_error = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    assert_eq!(meter(Provider::Anthropic, SSE, sse_error), (None, false));
}

#[test]
fn the_wrong_providers_shape_reports_nothing_or_only_what_fits() {
    // A Gemini body read as Anthropic: no `usage`, so nothing.
    assert_eq!(meter(Provider::Anthropic, JSON, GEMINI_BODY), (None, false));
    assert_eq!(
        meter(Provider::Gemini, JSON, OPENAI_CHAT_BODY),
        (None, false)
    );
}

#[test]
fn usage_inside_output_text_is_not_usage() {
    // The chat body's message content holds a fake usage object inside a string; the Anthropic
    // stream holds a fake SSE event inside a text delta. Neither is read.
    assert_eq!(
        meter(Provider::OpenAiChat, JSON, OPENAI_CHAT_BODY)
            .0
            .unwrap()
            .input_tokens,
        1117
    );
    assert_eq!(
        meter(Provider::Anthropic, SSE, ANTHROPIC_STREAM)
            .0
            .unwrap()
            .output_tokens,
        15
    );
}

#[test]
fn a_mislabelled_stream_is_sniffed() {
    assert_eq!(
        meter(Provider::OpenAiChat, JSON, OPENAI_CHAT_STREAM),
        (usage("gpt-4o-2024-08-06", 1931, 12, 1792), true)
    );
    assert_eq!(
        meter(Provider::Anthropic, None, &format!("\n\n{ANTHROPIC_BODY}")),
        (usage("claude-opus-4-1-20250805", 2095, 503, 0), true)
    );
}

#[test]
fn concatenated_json_documents_are_each_read() {
    let body = format!(
        "{GEMINI_BODY}\n{}",
        GEMINI_BODY.replace(
            "\"candidatesTokenCount\": 3",
            "\"candidatesTokenCount\": 30"
        )
    );
    assert_eq!(
        meter(Provider::Gemini, JSON, &body),
        (usage("gemini-2.0-flash", 4, 30, 0), true)
    );
}

#[test]
fn cached_tokens_never_exceed_input() {
    let body = r#"{"model":"gpt-4o","usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":99}}}"#;
    assert_eq!(
        meter(Provider::OpenAiChat, JSON, body).0,
        usage("gpt-4o", 10, 1, 10)
    );
}

#[test]
fn odd_usage_values_are_ignored_and_huge_ones_saturate() {
    let body = r#"{"model":"gpt-4o","usage":{"prompt_tokens":-3,"completion_tokens":1e300,"prompt_tokens_details":"x"}}"#;
    assert_eq!(
        meter(Provider::OpenAiChat, JSON, body).0,
        usage("gpt-4o", 0, u64::MAX, 0)
    );
    let body = r#"{"model":"gpt-4o","usage":{"prompt_tokens":"lots"}}"#;
    assert_eq!(
        meter(Provider::OpenAiChat, JSON, body),
        (None, false),
        "no count read"
    );
    let body = r#"{"model":"gpt-4o","usage":{}}"#;
    assert_eq!(meter(Provider::OpenAiChat, JSON, body), (None, false));
    let sse = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":18446744073709551615,\"cache_read_input_tokens\":5}}}\n\n";
    let u = meter(Provider::Anthropic, SSE, sse).0.unwrap();
    assert_eq!((u.input_tokens, u.cached_input_tokens), (u64::MAX, 5));
}

// --- SSE details ------------------------------------------------------------------------------

#[test]
fn sse_line_endings_comments_and_multiline_data() {
    // CR-only line ends, a comment, an id and retry, data split over two lines (joined with
    // \n, which JSON takes as whitespace), a field without a colon, no space after the colon.
    let stream = concat!(
        ": keep-alive\r",
        "id: 7\r",
        "retry: 3000\r",
        "event:message_delta\r",
        "data: {\"type\":\"message_delta\",\r",
        "data:\"usage\":{\"output_tokens\":9}}\r",
        "\r",
        "data\r",
        "\r",
    );
    assert_eq!(
        same_at_every_split(Provider::Anthropic, SSE, stream),
        (
            Some(Usage {
                output_tokens: 9,
                ..Usage::default()
            }),
            true
        )
    );
}

#[test]
fn sse_event_name_is_a_fallback_for_the_type() {
    // Data without `type`: the event name says it is the final delta.
    let stream = "event: message_delta\ndata: {\"usage\":{\"output_tokens\":4}}\n\n";
    assert!(meter(Provider::Anthropic, SSE, stream).1);
    let stream = "event: content_block_delta\ndata: {\"usage\":{\"output_tokens\":4}}\n\n";
    assert!(!meter(Provider::Anthropic, SSE, stream).1);
    // The event name is reset after each event.
    let stream = "event: message_delta\ndata: {}\n\ndata: {\"usage\":{\"output_tokens\":4}}\n\n";
    assert!(!meter(Provider::Anthropic, SSE, stream).1);
}

#[test]
fn sse_byte_order_mark_is_skipped_on_the_first_line_only() {
    let stream = format!("\u{feff}{OPENAI_CHAT_STREAM}");
    assert_eq!(
        meter(Provider::OpenAiChat, SSE, &stream).0,
        usage("gpt-4o-2024-08-06", 1931, 12, 1792)
    );
}

#[test]
fn sse_event_the_stream_ends_inside_is_still_read() {
    let stream = OPENAI_CHAT_STREAM.replace("\n\ndata: [DONE]\n\n", "");
    assert_eq!(
        same_at_every_split(Provider::OpenAiChat, SSE, &stream).0,
        usage("gpt-4o-2024-08-06", 1931, 12, 1792)
    );
    // A usage chunk cut inside its JSON is not.
    let cut = &OPENAI_CHAT_STREAM[..OPENAI_CHAT_STREAM.find("\"total_tokens\"").unwrap()];
    assert_eq!(meter(Provider::OpenAiChat, SSE, cut), (None, false));
}

#[test]
fn an_oversized_sse_event_is_dropped_and_the_parser_resyncs() {
    let huge = "x".repeat(MAX_DOCUMENT);
    let stream = format!(
        "data: {{\"usage\":{{\"prompt_tokens\":1}},\"pad\":\"{huge}\"}}\n\n{OPENAI_CHAT_STREAM}"
    );
    let mut m = Meter::new(Provider::OpenAiChat, SSE);
    for c in stream.as_bytes().chunks(64 * 1024) {
        m.feed(c);
        if let Body::Sse(s) = &m.body {
            assert!(s.0.held() <= MAX_DOCUMENT, "bounded");
        }
    }
    assert_eq!(m.finish(), usage("gpt-4o-2024-08-06", 1931, 12, 1792));

    // A huge comment or unknown field line costs nothing and breaks nothing.
    let stream = format!(": {huge}{huge}\nfoo{huge}\n{OPENAI_CHAT_STREAM}");
    assert_eq!(
        meter(Provider::OpenAiChat, SSE, &stream).0,
        usage("gpt-4o-2024-08-06", 1931, 12, 1792)
    );
    // Data spread over many lines is bounded in total, not per line.
    let line = format!("data: {}\n", "y".repeat(1024 * 1024));
    let stream = format!("{}\n{OPENAI_CHAT_STREAM}", line.repeat(5));
    let mut m = Meter::new(Provider::OpenAiChat, SSE);
    for c in stream.as_bytes().chunks(100_000) {
        m.feed(c);
        if let Body::Sse(s) = &m.body {
            assert!(s.0.held() <= MAX_DOCUMENT);
        }
    }
    assert_eq!(m.finish().unwrap().input_tokens, 1931);
}

#[test]
fn an_event_of_exactly_max_document_is_read() {
    let prefix = "{\"model\":\"m\",\"usage\":{\"prompt_tokens\":5},\"pad\":\"";
    let pad = "p".repeat(MAX_DOCUMENT - prefix.len() - 2);
    let data = format!("{prefix}{pad}\"}}");
    assert_eq!(data.len(), MAX_DOCUMENT);
    let stream = format!("data: {data}\n\n");
    assert_eq!(
        meter(Provider::OpenAiChat, SSE, &stream).0,
        usage("m", 5, 0, 0)
    );
    // One byte more is not.
    let stream = format!("data: {data} \n\n");
    assert_eq!(meter(Provider::OpenAiChat, SSE, &stream).0, None);
}

#[test]
fn a_long_event_name_is_not_kept() {
    let stream = format!(
        "event: message_delta{}\ndata: {{\"usage\":{{\"output_tokens\":4}}}}\n\n",
        "z".repeat(crate::wire::sse::MAX_NAME)
    );
    assert_eq!(
        meter(Provider::Anthropic, SSE, &stream),
        (
            Some(Usage {
                output_tokens: 4,
                ..Usage::default()
            }),
            false
        )
    );
}

// --- JSON body bounds -------------------------------------------------------------------------

#[test]
fn an_oversized_json_body_is_given_up_and_its_buffer_freed() {
    let pad = "q".repeat(2 * MAX_DOCUMENT);
    let body = format!(
        r#"{{"model":"gpt-4o","usage":{{"prompt_tokens":5,"completion_tokens":1}},"pad":"{pad}"}}"#
    );
    let mut m = Meter::new(Provider::OpenAiChat, JSON);
    let mut freed = false;
    for c in body.as_bytes().chunks(256 * 1024) {
        m.feed(c);
        if let Body::Json(j) = &m.body {
            assert!(j.buf.capacity() <= MAX_DOCUMENT);
            freed |= j.skipping && j.buf.capacity() == 0;
        }
    }
    assert!(
        freed,
        "the buffer is dropped once the body passes the bound"
    );
    assert_eq!(m.finish(), None);
}

#[test]
fn an_oversized_array_element_skips_only_that_element() {
    let pad = "q".repeat(MAX_DOCUMENT);
    let body = format!(
        r#"[{{"usageMetadata":{{"promptTokenCount":1}},"pad":"{pad}"}},{{"usageMetadata":{{"promptTokenCount":2,"candidatesTokenCount":3}},"modelVersion":"gemini-2.5-pro","candidates":[{{"finishReason":"STOP"}}]}}]"#
    );
    let got = meter_chunked(Provider::Gemini, JSON, body.as_bytes(), &[1 << 20]);
    assert_eq!(got, (usage("gemini-2.5-pro", 2, 3, 0), true));
}

#[test]
fn a_truncated_json_body_reports_nothing() {
    let cut = &OPENAI_CHAT_BODY[..OPENAI_CHAT_BODY.len() - 5];
    assert_eq!(meter(Provider::OpenAiChat, JSON, cut), (None, false));
}

#[test]
fn deep_nesting_does_not_overflow_the_stack() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_eq!(meter(Provider::OpenAiChat, JSON, &deep), (None, false));
    let deep = format!(
        "{{\"usage\":{}{}}}",
        "{\"a\":".repeat(50_000),
        "}".repeat(50_000)
    );
    assert_eq!(meter(Provider::OpenAiChat, JSON, &deep), (None, false));
    let sse = format!("data: {}\n\n", deep);
    assert_eq!(meter(Provider::OpenAiChat, SSE, &sse), (None, false));
    let f = inspect_request(
        Provider::OpenAiChat,
        "/v1/chat/completions",
        deep.as_bytes(),
    );
    assert_eq!(f.max_output_tokens, None);
}

#[test]
fn debug_shows_sizes_not_content() {
    let mut m = Meter::new(Provider::OpenAiChat, JSON);
    m.feed(br#"{"secret":"sk-live-abc"#);
    let s = format!("{m:?}");
    assert!(!s.contains("sk-live"), "{s}");
    assert!(s.contains("buffered"), "{s}");
}

// --- Properties -------------------------------------------------------------------------------

/// Splits `body` at the given cut points (taken modulo its length).
fn feed_at_cuts(
    provider: Provider,
    ct: Option<&str>,
    body: &[u8],
    cuts: &[usize],
) -> (Option<Usage>, bool) {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    cuts.sort_unstable();
    let mut m = Meter::new(provider, ct);
    let mut at = 0;
    for c in cuts {
        m.feed(&body[at..c]);
        at = c;
    }
    m.feed(&body[at..]);
    let complete = m.complete();
    (m.finish(), complete)
}

const FIXTURES: &[(Provider, Option<&str>, &str)] = &[
    (Provider::OpenAiChat, SSE, OPENAI_CHAT_STREAM),
    (Provider::OpenAiChat, JSON, OPENAI_CHAT_BODY),
    (Provider::OpenAiResponses, SSE, OPENAI_RESPONSES_STREAM),
    (Provider::OpenAiResponses, JSON, OPENAI_RESPONSES_BODY),
    (Provider::Anthropic, SSE, ANTHROPIC_STREAM),
    (Provider::Anthropic, JSON, ANTHROPIC_BODY),
    (Provider::Gemini, SSE, GEMINI_SSE),
    (Provider::Gemini, JSON, GEMINI_ARRAY),
    (Provider::Gemini, JSON, GEMINI_BODY),
];

fn any_provider() -> impl Strategy<Value = Provider> {
    prop_oneof![
        Just(Provider::OpenAiChat),
        Just(Provider::OpenAiResponses),
        Just(Provider::Anthropic),
        Just(Provider::Gemini),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any chunking of any fixture gives the usage the whole body gives.
    #[test]
    fn any_chunking_of_a_valid_stream_gives_the_same_usage(
        which in 0..FIXTURES.len(),
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let (p, ct, body) = FIXTURES[which];
        let whole = meter(p, ct, body);
        prop_assert!(whole.0.is_some());
        prop_assert_eq!(feed_at_cuts(p, ct, body.as_bytes(), &cuts), whole);
    }

    /// Arbitrary bytes, arbitrarily chunked, as SSE or JSON for any provider: never a panic,
    /// and the buffers stay within the bound.
    #[test]
    fn arbitrary_bytes_never_panic(
        p in any_provider(),
        sse in any::<bool>(),
        body in proptest::collection::vec(any::<u8>(), 0..2048),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
    ) {
        let ct = if sse { SSE } else { None };
        let _ = feed_at_cuts(p, ct, &body, &cuts);
        let _ = inspect_request(p, "/v1beta/models/x:generateContent", &body);
        let _ = add_include_usage(&body);
    }

    /// SSE-shaped noise (field names, separators, line ends, JSON fragments) never panics, and
    /// a valid stream appended after it (following a blank line) is still read.
    #[test]
    fn sse_noise_then_a_valid_stream(
        parts in proptest::collection::vec(prop_oneof![
            Just("data:"), Just("data: "), Just("event: "), Just("message_delta"), Just(":"),
            Just("\r"), Just("\n"), Just("\r\n"), Just("{"), Just("}"), Just("\"usage\":"),
            Just("{\"output_tokens\":3}"), Just("[DONE]"), Just("\u{feff}"), Just("id: 1"),
            Just("\"\\"),
        ], 0..60),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
    ) {
        let noise: String = parts.concat();
        let _ = feed_at_cuts(Provider::Anthropic, SSE, noise.as_bytes(), &cuts);
        let body = format!("{noise}\n\n{ANTHROPIC_STREAM}");
        let (u, complete) = feed_at_cuts(Provider::Anthropic, SSE, body.as_bytes(), &cuts);
        prop_assert!(complete);
        prop_assert_eq!(u, usage("claude-sonnet-4-5-20250929", 2620, 15, 2048));
    }

    /// Arbitrary JSON objects as request bodies never panic and agree with a plain serde read
    /// of `max_tokens` when it is a small integer.
    #[test]
    fn request_facts_agree_with_serde(
        max in proptest::option::of(0u64..1_000_000),
        model in "[a-z0-9.-]{1,20}",
        stream in any::<bool>(),
    ) {
        let mut v = serde_json::json!({"model": model, "stream": stream, "messages": []});
        if let Some(m) = max { v["max_tokens"] = m.into(); }
        let body = serde_json::to_vec(&v).unwrap();
        let f = inspect_request(Provider::Anthropic, "/v1/messages", &body);
        prop_assert_eq!(f.max_output_tokens, max);
        prop_assert_eq!(f.model, Some(model));
        prop_assert_eq!(f.stream, stream);
    }
}

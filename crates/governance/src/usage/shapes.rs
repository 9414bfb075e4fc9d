//! Lenient JSON shapes: a member of an unexpected type reads as absent, never as an error, so
//! one odd member does not hide the rest of the document.

use super::*;

/// A response document (or an SSE event's data), only the members usage is read from.
#[derive(Default, serde::Deserialize)]
#[serde(default)]
pub(super) struct Doc {
    #[serde(rename = "type")]
    pub(super) kind: Text,
    pub(super) model: Text,
    #[serde(rename = "modelVersion", alias = "model_version")]
    pub(super) model_version: Text,
    pub(super) usage: Lenient<Counts>,
    #[serde(rename = "usageMetadata", alias = "usage_metadata")]
    pub(super) usage_metadata: Lenient<GeminiCounts>,
    /// Anthropic `message_start`.
    pub(super) message: Lenient<Inner>,
    /// OpenAI responses stream events.
    pub(super) response: Lenient<Inner>,
    /// Gemini: whether any candidate has a `finishReason`.
    pub(super) candidates: Finished,
    #[serde(rename = "promptFeedback", alias = "prompt_feedback")]
    pub(super) prompt_feedback: Lenient<PromptFeedback>,
}

#[derive(Default, serde::Deserialize)]
#[serde(default)]
pub(super) struct Inner {
    pub(super) model: Text,
    pub(super) usage: Lenient<Counts>,
}

/// OpenAI (chat and responses) and Anthropic usage members.
#[derive(Default, serde::Deserialize)]
#[serde(default)]
pub(super) struct Counts {
    pub(super) prompt_tokens: Count,
    pub(super) completion_tokens: Count,
    pub(super) prompt_tokens_details: Lenient<Details>,
    pub(super) input_tokens: Count,
    pub(super) output_tokens: Count,
    pub(super) input_tokens_details: Lenient<Details>,
    pub(super) cache_read_input_tokens: Count,
    pub(super) cache_creation_input_tokens: Count,
}

#[derive(Default, serde::Deserialize)]
#[serde(default)]
pub(super) struct Details {
    pub(super) cached_tokens: Count,
}

#[derive(Default, serde::Deserialize)]
#[serde(default)]
pub(super) struct GeminiCounts {
    #[serde(rename = "promptTokenCount", alias = "prompt_token_count")]
    pub(super) prompt: Count,
    #[serde(rename = "candidatesTokenCount", alias = "candidates_token_count")]
    pub(super) candidates: Count,
    #[serde(rename = "thoughtsTokenCount", alias = "thoughts_token_count")]
    pub(super) thoughts: Count,
    #[serde(
        rename = "cachedContentTokenCount",
        alias = "cached_content_token_count"
    )]
    pub(super) cached: Count,
    #[serde(
        rename = "toolUsePromptTokenCount",
        alias = "tool_use_prompt_token_count"
    )]
    pub(super) tool_prompt: Count,
}

#[derive(Default, serde::Deserialize)]
#[serde(default)]
pub(super) struct PromptFeedback {
    #[serde(rename = "blockReason", alias = "block_reason")]
    pub(super) block_reason: Text,
}

#[derive(Default, serde::Deserialize)]
#[serde(default)]
pub(super) struct Candidate {
    #[serde(rename = "finishReason", alias = "finish_reason")]
    pub(super) finish_reason: Text,
}

/// The request members cost is read from; a count given twice is taken at its largest.
#[derive(Default)]
pub(super) struct RawRequest {
    pub(super) model: Option<String>,
    pub(super) max_tokens: Option<u64>,
    pub(super) max_completion_tokens: Option<u64>,
    pub(super) max_output_tokens: Option<u64>,
    pub(super) n: Option<u64>,
    pub(super) best_of: Option<u64>,
    pub(super) stream: bool,
    pub(super) include_usage: bool,
    pub(super) generation_config: Option<GenerationConfig>,
}

#[derive(Default)]
pub(super) struct GenerationConfig {
    pub(super) max_output_tokens: Option<u64>,
    pub(super) candidate_count: Option<u64>,
}

/// The larger of two reported counts.
pub(super) fn larger(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    a.max(b)
}

impl<'de> Deserialize<'de> for RawRequest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawRequest;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a request object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawRequest, A::Error> {
                let mut r = RawRequest::default();
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::Model => {
                            if let Text(Some(m)) = map.next_value()? {
                                r.model = Some(m);
                            }
                        }
                        Key::MaxTokens => r.max_tokens = larger(r.max_tokens, count(&mut map)?),
                        Key::MaxCompletionTokens => {
                            r.max_completion_tokens =
                                larger(r.max_completion_tokens, count(&mut map)?)
                        }
                        Key::MaxOutputTokens => {
                            r.max_output_tokens = larger(r.max_output_tokens, count(&mut map)?)
                        }
                        Key::N => r.n = larger(r.n, count(&mut map)?),
                        Key::BestOf => r.best_of = larger(r.best_of, count(&mut map)?),
                        Key::Stream => r.stream |= map.next_value::<Flag>()?.0,
                        Key::StreamOptions => {
                            if let Lenient(Some(o)) = map.next_value::<Lenient<StreamOptions>>()? {
                                r.include_usage |= o.include_usage.0;
                            }
                        }
                        Key::GenerationConfig => {
                            if let Lenient(Some(g)) =
                                map.next_value::<Lenient<GenerationConfig>>()?
                            {
                                let c = r.generation_config.get_or_insert_with(Default::default);
                                c.max_output_tokens =
                                    larger(c.max_output_tokens, g.max_output_tokens);
                                c.candidate_count = larger(c.candidate_count, g.candidate_count);
                            }
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(r)
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for GenerationConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = GenerationConfig;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a generationConfig object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<GenerationConfig, A::Error> {
                let mut g = GenerationConfig::default();
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::MaxOutputTokens => {
                            g.max_output_tokens = larger(g.max_output_tokens, count(&mut map)?)
                        }
                        Key::CandidateCount => {
                            g.candidate_count = larger(g.candidate_count, count(&mut map)?)
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(g)
            }
        }
        d.deserialize_map(V)
    }
}

/// The next member's value as a count.
pub(super) fn count<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Option<u64>, A::Error> {
    Ok(map.next_value::<Count>()?.0)
}

#[derive(Default, serde::Deserialize)]
#[serde(default)]
pub(super) struct StreamOptions {
    pub(super) include_usage: Flag,
}

/// Visitor methods for the JSON values a lenient type does not want: each is consumed (a
/// container without building it) and reads as `$none`.
macro_rules! read_as {
    ($none:expr; $($kind:ident)*) => { $(read_as!(@ $none; $kind);)* };
    (@ $none:expr; bool) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> { Ok($none) }
    };
    (@ $none:expr; i64) => {
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> { Ok($none) }
    };
    (@ $none:expr; u64) => {
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> { Ok($none) }
    };
    (@ $none:expr; f64) => {
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> { Ok($none) }
    };
    (@ $none:expr; str) => {
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> { Ok($none) }
    };
    (@ $none:expr; unit) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> { Ok($none) }
    };
    (@ $none:expr; seq) => {
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            IgnoredAny.visit_seq(seq)?;
            Ok($none)
        }
    };
    (@ $none:expr; map) => {
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            IgnoredAny.visit_map(map)?;
            Ok($none)
        }
    };
}

/// A JSON object read as `T`; any other JSON value reads as `None`.
pub(super) struct Lenient<T>(pub(super) Option<T>);

impl<T> Default for Lenient<T> {
    fn default() -> Self {
        Lenient(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Lenient<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Lenient<T>, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(|t| Lenient(Some(t)))
            }
            read_as!(Lenient(None); bool i64 u64 f64 str unit seq);
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A token count: a non-negative integer, an integral float, or a decimal string; past `u64`
/// it saturates. Anything else reads as `None`.
#[derive(Default)]
pub(super) struct Count(pub(super) Option<u64>);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
                Ok(Count(Some(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Count, E> {
                Ok(Count(u64::try_from(v).ok()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Count, E> {
                Ok(Count(integral(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Count, E> {
                Ok(Count(decimal(v)))
            }
            read_as!(Count(None); bool unit seq map);
        }
        d.deserialize_any(V)
    }
}

/// A non-negative float without a fraction as a count (saturating).
pub(super) fn integral(v: f64) -> Option<u64> {
    // `as` saturates at u64::MAX; NaN and negatives are excluded first.
    (v.is_finite() && v >= 0.0 && v.fract() == 0.0).then_some(v as u64)
}

/// A string of ASCII digits as a count (saturating).
pub(super) fn decimal(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(v.parse::<u64>().unwrap_or(u64::MAX))
}

/// A JSON string of at most [`MAX_MODEL_NAME`] bytes; any other JSON value reads as `None`
/// (so a huge string is never copied).
#[derive(Default)]
pub(super) struct Text(pub(super) Option<String>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text((v.len() <= MAX_MODEL_NAME).then(|| v.to_string())))
            }
            read_as!(Text(None); bool i64 u64 f64 unit seq map);
        }
        d.deserialize_any(V)
    }
}

/// JSON `true`; any other JSON value reads as false.
#[derive(Default)]
pub(super) struct Flag(pub(super) bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Flag;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Flag, E> {
                Ok(Flag(v))
            }
            read_as!(Flag(false); i64 u64 f64 str unit seq map);
        }
        d.deserialize_any(V)
    }
}

/// Gemini `candidates`: true when any candidate has a `finishReason`.
#[derive(Default)]
pub(super) struct Finished(pub(super) bool);

impl<'de> Deserialize<'de> for Finished {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Finished;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Finished, A::Error> {
                let mut any = false;
                while let Some(Lenient(c)) = seq.next_element::<Lenient<Candidate>>()? {
                    any |= c.is_some_and(|c| c.finish_reason.0.is_some_and(|r| !r.is_empty()));
                }
                Ok(Finished(any))
            }
            read_as!(Finished(false); bool i64 u64 f64 str unit map);
        }
        d.deserialize_any(V)
    }
}

/// An object key, matched without copying it (a body may have any number of long keys).
pub(super) enum Key {
    Model,
    MaxTokens,
    MaxCompletionTokens,
    MaxOutputTokens,
    N,
    BestOf,
    Stream,
    StreamOptions,
    GenerationConfig,
    CandidateCount,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(match v {
                    "model" => Key::Model,
                    "max_tokens" => Key::MaxTokens,
                    "max_completion_tokens" => Key::MaxCompletionTokens,
                    // Responses' name, and Gemini's (proto-JSON takes either spelling).
                    "max_output_tokens" | "maxOutputTokens" => Key::MaxOutputTokens,
                    "n" => Key::N,
                    "best_of" => Key::BestOf,
                    "stream" => Key::Stream,
                    "stream_options" => Key::StreamOptions,
                    "generationConfig" | "generation_config" => Key::GenerationConfig,
                    "candidateCount" | "candidate_count" => Key::CandidateCount,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

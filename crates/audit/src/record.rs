//! The audit record: one JSON line per request or refused connection. Field names and their
//! meaning are a contract (book "Audit record"); `Debug` never prints what the sandbox sent.
//! Depends on nothing in the crate.

use std::time::SystemTime;

use serde::{Serialize, Serializer};

/// One audit record (book "Audit record"; docs/architecture.md). Field names are a contract.
///
/// Until [`super::Entry`] scrubs it on the way out, `method`, `host` and `path` are as the sandbox sent
/// them and may hold a secret value it pasted there: `Debug` shows their lengths only.
#[derive(Clone, Serialize, PartialEq)]
pub struct Record {
    /// `decision`: written before latchkey dials the upstream, holding what was decided; the
    /// request's `outcome` record (same `id`) follows when it ends. A request refused before
    /// any dial has only its `outcome` record. (The writer puts `seq` and `prev`, the hash
    /// chain, in front of every line: [`super::chain`].)
    pub phase: Phase,
    /// When the request arrived; RFC 3339 UTC with milliseconds.
    #[serde(serialize_with = "rfc3339_millis")]
    pub ts: SystemTime,
    pub id: String,
    pub identity: String,
    pub client: String,
    /// `None` when the request could not be parsed far enough to know it.
    pub method: Option<String>,
    pub scheme: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub path: Option<String>,
    pub decision: &'static str,
    pub rule: Option<String>,
    pub reason: &'static str,
    pub secrets: Vec<String>,
    /// On a token endpoint's response under a rule with `capture`: the names the tokens it
    /// carried are now kept under (never values). Absent otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub captured: Vec<String>,
    pub status: Option<u16>,
    /// The `ip:port` latchkey dialed for this request; `None` when it dialed nothing (every
    /// refusal before the dial). Never an address latchkey did not connect to.
    pub upstream: Option<String>,
    /// On a connection the firewall redirected to `serve --transparent`: the `ip:port` the
    /// client sent it to. Where the client was going, not what latchkey contacted (that is
    /// `upstream`, absent from a refused connection's record). Absent from every other record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original_dst: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
    pub policy: String,
    /// Secret values replaced in the response (headers and body).
    pub redactions: u64,
    /// Report-only mode let through a request that enforcement would deny (`reason` says why).
    pub would_deny: bool,
    /// On a DNS query's record (`method = "DNS"`) only: what was asked and answered. Absent
    /// from every other record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsInfo>,
    /// On a request that needed a person, and on a decision's record (`method = "APPROVAL"`):
    /// which approval, where it stood. Absent from every other record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalInfo>,
    /// On a request charged to `[limits]`: what each limit took (book "Limits and
    /// budgets"). Absent when no limit applies.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<LimitCharge>,
    /// On a model-provider call: the model and tokens its response reported, and their cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageInfo>,
    /// On a WebSocket (a handshake that upgraded): what was relayed, and how it closed. Absent
    /// from every other record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub websocket: Option<WebSocketInfo>,
    /// On a POST under a rule with `mcp`: the JSON-RPC messages it carried. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpInfo>,
    /// The identity's `labels` from policy (`[identities.X] labels`): what the environment is.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// `sha256:` digest of everything this identity could reach under the policy in force
    /// (its rules and the secrets they bind; `latchkey explain --reach IDENTITY` lists it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reach: Option<String>,
    /// Correlation the sandbox sent (book "Audit"): its session, the step a request belongs
    /// to, and which attempt at that step this is (a retry is attempt 2 of the same step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// W3C trace context: the trace the sandbox's `traceparent` named, and latchkey's own span
    /// for this request (the parent of what it sends upstream, and of its OTLP span).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
    /// The sandbox's span this request was made under (`traceparent`'s parent id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_span_id: Option<String>,
}

/// Which of a request's records a line is.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Committed before the upstream is dialed; an `outcome` with the same id follows.
    Decision,
    /// The request's full record, written when it ended (the only one of a refusal).
    #[default]
    Outcome,
}

/// One measure of one limit, as charged for a request.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct LimitCharge {
    /// The `[limits.NAME]`.
    pub limit: String,
    /// `requests`, `concurrency`, `bytes_up`, `llm_tokens` or `spend`.
    pub measure: &'static str,
    /// Whose counter: `identity:ci-agent`, `rule:openai`, `credential:gh`, `global`, plus
    /// `@host` for `bytes_up`.
    pub key: String,
    /// What this request took: 1 for requests and concurrency, bytes, tokens, micro-USD. On a
    /// refusal, what it asked for.
    pub charged: u64,
    /// The counter after the charge (for a refusal: before), and the limit.
    pub used: u64,
    pub limit_value: u64,
    /// This measure refused the request.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
    /// The store could not be reached and the limit says `on_store_error = "allow"`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unchecked: bool,
}

/// A WebSocket's life after its handshake (book "WebSocket").
#[derive(Clone, Debug, Serialize, PartialEq, Eq, Default)]
pub struct WebSocketInfo {
    /// Frames latchkey sent to the upstream and to the sandbox: one per text or binary
    /// message (a message that arrived in fragments is reassembled, inspected and sent as
    /// one); pings, pongs and close frames are not counted.
    pub frames_up: u64,
    pub frames_down: u64,
    /// The close code of the closing handshake; `None` when the socket ended without one.
    pub close_code: Option<u16>,
    /// `sandbox`, `upstream` or `latchkey` (a refused message, a limit, shutdown).
    pub closed_by: &'static str,
}

/// The JSON-RPC messages of one POST to an MCP server (book "MCP tool rules").
#[derive(Clone, Debug, Serialize, PartialEq, Eq, Default)]
pub struct McpInfo {
    /// How many messages the body held (a batch holds several).
    pub messages: u64,
    /// The first 64 of them.
    pub calls: Vec<McpCall>,
}

/// One JSON-RPC message: its method (`null` for a response the client sent), the tool a
/// `tools/call` names, and whether latchkey refused it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct McpCall {
    pub method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
}

/// A model-provider call's usage, read from its response.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct UsageInfo {
    /// `openai`, `anthropic` or `gemini`.
    pub provider: &'static str,
    pub model: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens served from the provider's cache (part of `input_tokens`).
    pub cached_input_tokens: u64,
    /// USD under the price table; `None` when the model has no price.
    pub cost: Option<f64>,
    /// `response` when the provider reported usage; `reserved` when it did not (the
    /// reservation was charged in its place).
    pub source: &'static str,
}

/// A request's (or a decision's) place in an approval (book "Audit record", "Approvals").
#[derive(Clone, Debug, Serialize, PartialEq, Eq, Default)]
pub struct ApprovalInfo {
    pub id: String,
    /// `pending`, `approved`, `denied` or `expired`.
    pub state: &'static str,
    /// The scope granted (`once`, `1h`, `session`), once approved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The request went on under a standing grant (no new question): the grant's scope.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// How long the request was held waiting for an answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
    /// On a decision's record: who answered, and their note.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What a DNS query asked latchkey's resolver and what it answered (book "Audit record").
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct DnsInfo {
    /// The query type (`A`, `AAAA`, `TXT`, `TYPE65280`); `null` when the query could not be
    /// read that far.
    #[serde(rename = "type")]
    pub qtype: Option<String>,
    /// The response code sent (`NOERROR`, `NXDOMAIN`, `REFUSED`, `FORMERR`, `NOTIMP`,
    /// `SERVFAIL`); `null` when nothing was sent back.
    pub rcode: Option<&'static str>,
    /// The addresses answered.
    pub answer: Vec<String>,
    /// `udp` or `tcp`.
    pub transport: &'static str,
    /// How many queries this record stands for: 1, or for `dns_rate_limited` the queries
    /// refused over the cap since the client's previous such record (one a second at most).
    pub queries: u64,
}

impl DnsInfo {
    /// The record of one query over `transport` (`udp`, `tcp`), not yet read.
    pub fn new(transport: &'static str) -> Self {
        Self {
            qtype: None,
            rcode: None,
            answer: Vec::new(),
            transport,
            queries: 1,
        }
    }
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = |v: &Option<String>| v.as_ref().map(String::len);
        f.debug_struct("Record")
            .field("id", &self.id)
            .field("identity", &self.identity)
            .field("client", &self.client)
            .field("method_len", &len(&self.method))
            .field("scheme", &self.scheme)
            .field("host_len", &len(&self.host))
            .field("port", &self.port)
            .field("path_len", &len(&self.path))
            .field("decision", &self.decision)
            .field("rule", &self.rule)
            .field("reason", &self.reason)
            .field("secrets", &self.secrets)
            .field("status", &self.status)
            .field("redactions", &self.redactions)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

fn rfc3339_millis<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(*t))
}

/// A random 16-hex-digit request id.
pub fn new_id() -> String {
    let mut b = [0u8; 8];
    if aws_lc_rs::rand::fill(&mut b).is_err() {
        // The id is a correlation handle, not a secret: fall back to the clock.
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        b = (nanos as u64).to_be_bytes();
    }
    hex::encode(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_16_hex_digits_and_differ() {
        let a = new_id();
        assert_eq!(a.len(), 16);
        assert!(a
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(a, new_id());
    }
}

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
    /// Where each secret in `secrets` came from, by name: `env`, `file`, `exec`, `vault`,
    /// `aws-sm` or `aws-ssm` (never a value or a path). Absent when no secret was used.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub secret_sources: std::collections::BTreeMap<String, &'static str>,
    /// Secrets held in a store that were served stale — past their refresh time, within
    /// their `stale_for`, because the store could not be reached. Absent otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stale_secrets: Vec<String>,
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
    /// The profile of the runtime session the request was admitted under (then `session` is
    /// that session's id, not what the sandbox sent, and `labels` and `reach` are the
    /// session's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
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

impl Record {
    /// The request's decision record: what was decided, about what, for whom (with the
    /// identity's labels and the digest of its reach), under which policy — everything known
    /// before the dial and nothing only known after it (the status, bytes, usage and limits
    /// charged are the outcome's). Clones only those fields; [`Self::write_decision_line`]
    /// serialises them.
    pub fn decision_record(&self) -> Record {
        Record {
            phase: Phase::Decision,
            ts: self.ts,
            id: self.id.clone(),
            identity: self.identity.clone(),
            client: self.client.clone(),
            method: self.method.clone(),
            scheme: self.scheme.clone(),
            host: self.host.clone(),
            port: self.port,
            path: self.path.clone(),
            decision: self.decision,
            rule: self.rule.clone(),
            reason: self.reason,
            secrets: self.secrets.clone(),
            secret_sources: Default::default(),
            stale_secrets: Vec::new(),
            captured: Vec::new(),
            status: None,
            upstream: None,
            original_dst: self.original_dst.clone(),
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            policy: self.policy.clone(),
            redactions: 0,
            would_deny: self.would_deny,
            dns: None,
            approval: self.approval.clone(),
            limits: Vec::new(),
            usage: None,
            websocket: None,
            mcp: None,
            labels: self.labels.clone(),
            reach: self.reach.clone(),
            session: self.session.clone(),
            profile: self.profile.clone(),
            step: self.step.clone(),
            attempt: self.attempt,
            trace_id: self.trace_id.clone(),
            span_id: self.span_id.clone(),
            parent_span_id: self.parent_span_id.clone(),
        }
    }

    /// Serialises the record as a decision line (book "Audit record"): the fields of
    /// [`Self::decision_record`], without the outcome's (no `status`, `upstream`, byte counts,
    /// `duration_ms`, `redactions`, `limits`, `usage`): about half an outcome line, to
    /// serialise and hash.
    ///
    /// Written field by field (keys as constants, values escaped by serde_json): the same
    /// bytes as serialising the test module's `DecisionLine` (a proptest holds it to that), at about half the
    /// cost, on every request's commit.
    pub fn write_decision_line(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        fn text(out: &mut Vec<u8>, key: &[u8], v: &str) -> serde_json::Result<()> {
            out.extend_from_slice(key);
            serde_json::to_writer(&mut *out, v)
        }
        fn opt(out: &mut Vec<u8>, key: &[u8], v: Option<&str>) -> serde_json::Result<()> {
            match v {
                Some(v) => text(out, key, v),
                None => {
                    out.extend_from_slice(key);
                    out.extend_from_slice(b"null");
                    Ok(())
                }
            }
        }
        fn skip_none(out: &mut Vec<u8>, key: &[u8], v: Option<&str>) -> serde_json::Result<()> {
            v.map_or(Ok(()), |v| text(out, key, v))
        }
        out.extend_from_slice(b"{\"phase\":\"decision\",\"ts\":");
        // The derived form's own serialiser: the same text, the same error out of range.
        rfc3339_millis(&self.ts, &mut serde_json::Serializer::new(&mut *out))?;
        text(out, b",\"id\":", &self.id)?;
        text(out, b",\"identity\":", &self.identity)?;
        text(out, b",\"client\":", &self.client)?;
        opt(out, b",\"method\":", self.method.as_deref())?;
        opt(out, b",\"scheme\":", self.scheme.as_deref())?;
        opt(out, b",\"host\":", self.host.as_deref())?;
        out.extend_from_slice(b",\"port\":");
        match self.port {
            Some(p) => out.extend_from_slice(itoa::Buffer::new().format(p).as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
        opt(out, b",\"path\":", self.path.as_deref())?;
        text(out, b",\"decision\":", self.decision)?;
        opt(out, b",\"rule\":", self.rule.as_deref())?;
        text(out, b",\"reason\":", self.reason)?;
        out.extend_from_slice(b",\"secrets\":");
        serde_json::to_writer(&mut *out, &self.secrets)?;
        skip_none(out, b",\"original_dst\":", self.original_dst.as_deref())?;
        text(out, b",\"policy\":", &self.policy)?;
        out.extend_from_slice(if self.would_deny {
            b",\"would_deny\":true"
        } else {
            b",\"would_deny\":false"
        });
        if let Some(a) = &self.approval {
            out.extend_from_slice(b",\"approval\":");
            serde_json::to_writer(&mut *out, a)?;
        }
        if !self.labels.is_empty() {
            out.extend_from_slice(b",\"labels\":");
            serde_json::to_writer(&mut *out, &self.labels)?;
        }
        skip_none(out, b",\"reach\":", self.reach.as_deref())?;
        skip_none(out, b",\"session\":", self.session.as_deref())?;
        skip_none(out, b",\"profile\":", self.profile.as_deref())?;
        skip_none(out, b",\"step\":", self.step.as_deref())?;
        if let Some(n) = self.attempt {
            out.extend_from_slice(b",\"attempt\":");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        }
        skip_none(out, b",\"trace_id\":", self.trace_id.as_deref())?;
        skip_none(out, b",\"span_id\":", self.span_id.as_deref())?;
        skip_none(out, b",\"parent_span_id\":", self.parent_span_id.as_deref())?;
        out.push(b'}');
        Ok(())
    }
}

/// The fields a decision line carries, borrowed from its record: the definition
/// [`Record::write_decision_line`] is held to by the tests.
#[cfg(test)]
#[derive(Serialize)]
struct DecisionLine<'a> {
    phase: Phase,
    #[serde(serialize_with = "rfc3339_millis")]
    ts: SystemTime,
    id: &'a str,
    identity: &'a str,
    client: &'a str,
    method: Option<&'a str>,
    scheme: Option<&'a str>,
    host: Option<&'a str>,
    port: Option<u16>,
    path: Option<&'a str>,
    decision: &'static str,
    rule: Option<&'a str>,
    reason: &'static str,
    secrets: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    original_dst: Option<&'a str>,
    policy: &'a str,
    would_deny: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    approval: Option<&'a ApprovalInfo>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    labels: &'a std::collections::BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reach: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    profile: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    span_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_span_id: Option<&'a str>,
}

#[cfg(test)]
impl<'a> DecisionLine<'a> {
    fn of(r: &'a Record) -> Self {
        Self {
            phase: Phase::Decision,
            ts: r.ts,
            id: &r.id,
            identity: &r.identity,
            client: &r.client,
            method: r.method.as_deref(),
            scheme: r.scheme.as_deref(),
            host: r.host.as_deref(),
            port: r.port,
            path: r.path.as_deref(),
            decision: r.decision,
            rule: r.rule.as_deref(),
            reason: r.reason,
            secrets: &r.secrets,
            original_dst: r.original_dst.as_deref(),
            policy: &r.policy,
            would_deny: r.would_deny,
            approval: r.approval.as_ref(),
            labels: &r.labels,
            reach: r.reach.as_deref(),
            session: r.session.as_deref(),
            profile: r.profile.as_deref(),
            step: r.step.as_deref(),
            attempt: r.attempt,
            trace_id: r.trace_id.as_deref(),
            span_id: r.span_id.as_deref(),
            parent_span_id: r.parent_span_id.as_deref(),
        }
    }
}

fn rfc3339_millis<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    // Outside 1970–9999 humantime panics (before 1970) or its `Display` fails, which
    // serde_json's `collect_str` turns into a panic: an error instead (the writer counts it).
    let text = rfc3339_millis_text(*t)
        .ok_or_else(|| serde::ser::Error::custom("time outside 1970-9999 for RFC 3339"))?;
    s.serialize_str(std::str::from_utf8(&text).map_err(serde::ser::Error::custom)?)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`, as `humantime::format_rfc3339_millis` writes it, without the
/// formatting machinery (two per request); `None` before 1970 or after 9999.
fn rfc3339_millis_text(t: SystemTime) -> Option<[u8; 24]> {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    let secs = since.as_secs();
    let (year, month, day) = civil_from_days(i64::try_from(secs / 86_400).ok()?);
    if year > 9999 {
        return None;
    }
    let of_day = secs % 86_400;
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut v: u64| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, year as u64);
    put(5, 2, u64::from(month));
    put(8, 2, u64::from(day));
    put(11, 2, of_day / 3600);
    put(14, 2, of_day / 60 % 60);
    put(17, 2, of_day % 60);
    put(20, 3, u64::from(since.subsec_millis()));
    Some(out)
}

/// The proleptic Gregorian (year, month, day) of a count of days since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
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
    fn blank(ts: SystemTime) -> Record {
        Record {
            phase: Phase::Outcome,
            ts,
            id: String::new(),
            identity: String::new(),
            client: "127.0.0.1:9".into(),
            method: None,
            scheme: Some("https".into()),
            host: None,
            port: None,
            path: None,
            decision: "allow",
            rule: None,
            reason: "allowed",
            secrets: Vec::new(),
            secret_sources: Default::default(),
            stale_secrets: Vec::new(),
            captured: Vec::new(),
            status: Some(200),
            upstream: None,
            original_dst: None,
            bytes_up: 1,
            bytes_down: 2,
            duration_ms: 3,
            policy: "sha256:x".into(),
            redactions: 0,
            would_deny: false,
            dns: None,
            approval: None,
            limits: Vec::new(),
            usage: None,
            websocket: None,
            mcp: None,
            labels: Default::default(),
            reach: Some("sha256:r".into()),
            session: None,
            profile: None,
            step: None,
            attempt: None,
            trace_id: None,
            span_id: None,
            parent_span_id: None,
        }
    }

    #[test]
    fn a_time_rfc_3339_cannot_write_is_an_error_not_a_panic() {
        let far = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(300_000_000_000);
        let before = SystemTime::UNIX_EPOCH - std::time::Duration::from_secs(5);
        for t in [far, before] {
            let r = blank(t);
            assert!(r.write_decision_line(&mut Vec::new()).is_err());
            assert!(serde_json::to_vec(&DecisionLine::of(&r)).is_err());
            assert!(serde_json::to_vec(&r).is_err());
        }
    }

    fn any_text() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::prop_oneof![
            "[a-z0-9/._-]{0,12}",
            "\\PC{0,12}",
            "[\"\\\\\u{0}-\u{1f}\u{7f}é😀]{0,6}"
        ]
    }

    fn any_opt() -> impl proptest::strategy::Strategy<Value = Option<String>> {
        proptest::option::of(any_text())
    }

    proptest::proptest! {
        #[test]
        fn the_decision_line_writer_writes_what_serde_writes(
            id in any_text(), identity in any_text(), method in any_opt(), host in any_opt(),
            path in any_opt(), rule in any_opt(), secrets in proptest::collection::vec(any_text(), 0..3),
            original in any_opt(), session in any_opt(), step in any_opt(), attempt: Option<u32>,
            trace in any_opt(), port: Option<u16>, would_deny: bool, approved: bool,
            secs in 0u64..253_402_300_800, millis in 0u64..1000,
        ) {
            let ts = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(secs * 1000 + millis);
            let mut r = blank(ts);
            r.id = id; r.identity = identity; r.method = method; r.host = host; r.path = path;
            r.rule = rule; r.secrets = secrets; r.original_dst = original; r.session = session.clone(); r.profile = session;
            r.step = step; r.attempt = attempt; r.trace_id = trace.clone(); r.span_id = trace;
            r.port = port; r.would_deny = would_deny;
            if approved {
                r.labels.insert("env".into(), "ci\"x".into());
                r.reach = None;
            }
            if approved {
                r.approval = Some(ApprovalInfo { id: "a1".into(), state: "approved", scope: Some("1h".into()), ..Default::default() });
            }
            let mut ours = Vec::new();
            r.write_decision_line(&mut ours).expect("write");
            let theirs = serde_json::to_vec(&DecisionLine::of(&r)).expect("serde");
            proptest::prop_assert_eq!(String::from_utf8_lossy(&ours), String::from_utf8_lossy(&theirs));
        }
    }

    proptest::proptest! {
        #[test]
        fn rfc3339_millis_text_is_humantime_s(secs in 0u64..253_402_300_800, nanos in 0u32..1_000_000_000) {
            let t = SystemTime::UNIX_EPOCH + std::time::Duration::new(secs, nanos);
            let ours = rfc3339_millis_text(t).map(|b| String::from_utf8_lossy(&b).into_owned());
            proptest::prop_assert_eq!(ours, Some(humantime::format_rfc3339_millis(t).to_string()));
        }
    }

    #[test]
    fn rfc3339_millis_text_leaves_what_it_cannot_write_to_humantime() {
        let before = SystemTime::UNIX_EPOCH - std::time::Duration::from_secs(1);
        assert_eq!(rfc3339_millis_text(before), None);
        let after = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(253_402_300_800);
        assert_eq!(rfc3339_millis_text(after), None);
        let leap = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(951_782_400_123);
        assert_eq!(
            &rfc3339_millis_text(leap).unwrap_or_default(),
            b"2000-02-29T00:00:00.123Z"
        );
    }

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

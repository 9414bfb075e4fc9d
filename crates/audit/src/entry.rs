//! A record in progress: [`Entry`] is opened when a request arrives, filled in as it moves, and
//! handed to the log exactly once (explicitly, or from `Drop`). Its free-text fields are
//! scrubbed on the way out through [`Scrub`], which is all audit knows of secrets. Depends on
//! `reason` and the rest of `audit`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use super::{
    new_id, ApprovalInfo, AuditLog, DnsInfo, LimitCharge, McpInfo, Phase, Record, UsageInfo,
    WebSocketInfo,
};
use crate::reason::Reason;

pub use latchkey_wire::redact::Scrub;

/// Byte counters shared between body wrappers and the entry.
#[derive(Debug, Default)]
pub struct Counters {
    pub up: AtomicU64,
    pub down: AtomicU64,
    /// Secret values replaced in the response.
    pub redactions: AtomicU64,
}

/// A record in progress; written exactly once.
pub struct Entry {
    log: Arc<AuditLog>,
    record: Option<Record>,
    started: Instant,
    counters: Arc<Counters>,
    /// Replaces the values of the secrets in force, which must never reach the record or the
    /// log, even when the sandbox put one in a URL.
    scrub: Option<Arc<dyn Scrub>>,
    /// Seconds the sandbox should wait before retrying a refusal (`retry-after`), if any.
    retry_after: Option<u64>,
    /// `x-ratelimit-limit`, `-remaining`, `-reset` for the answer, from a request bucket.
    rate_headers: Option<(u64, u64, u64)>,
    /// What must live exactly as long as the record is open (a tunnel's hold on its limits),
    /// dropped after the record is handed to the log.
    held: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// Set once policy let the request on ([`Self::allow`]): the denial report-only let through,
    /// if any. Its outcome then follows from the stage it reaches ([`Self::reached`]).
    allowed: Option<Option<Reason>>,
}

/// How far a request policy let on has got; its outcome follows from it ([`Entry::reached`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Its decision record is about to be committed: allowed, nothing sent yet.
    Committed,
    /// On its way upstream: until an answer comes, a request cut short (shutdown, the client
    /// leaving) is allowed by policy and not completed (`upstream_error`).
    Sent,
    /// The upstream answered with this status.
    Answered(u16),
}

impl Entry {
    /// Starts a record for a request from `client`; fields are filled in as the request moves.
    pub fn start(log: Arc<AuditLog>, client: SocketAddr, identity: &str, policy: &str) -> Self {
        Self {
            log,
            record: Some(Record {
                phase: Phase::Outcome,
                ts: SystemTime::now(),
                id: new_id(),
                identity: identity.to_string(),
                client: crate::wire::host::socket_addr_text(client),
                method: None,
                scheme: None,
                host: None,
                port: None,
                path: None,
                decision: "deny",
                rule: None,
                reason: Reason::BadRequest.code(),
                secrets: Vec::new(),
                secret_sources: Default::default(),
                stale_secrets: Vec::new(),
                captured: Vec::new(),
                status: None,
                upstream: None,
                original_dst: None,
                bytes_up: 0,
                bytes_down: 0,
                duration_ms: 0,
                policy: policy.to_string(),
                redactions: 0,
                would_deny: false,
                dns: None,
                approval: None,
                limits: Vec::new(),
                usage: None,
                websocket: None,
                mcp: None,
                labels: Default::default(),
                reach: None,
                session: None,
                profile: None,
                step: None,
                attempt: None,
                trace_id: None,
                span_id: None,
                parent_span_id: None,
            }),
            started: Instant::now(),
            counters: Arc::new(Counters::default()),
            scrub: None,
            retry_after: None,
            rate_headers: None,
            held: None,
            allowed: None,
        }
    }

    /// Scrubs secret values out of the record's free-text fields when it is written, with
    /// `scrub` (the generation's secret store, seen only through [`Scrub`]).
    pub fn scrub_with(&mut self, scrub: Arc<dyn Scrub>) {
        self.scrub = Some(scrub);
    }

    /// `text` with every secret value in force replaced by `[REDACTED:name]`: for messages
    /// that quote what the sandbox sent (a denial naming the URL).
    pub fn scrub_text(&self, text: &str) -> String {
        match &self.scrub {
            Some(s) => s.scrub(text).into_owned(),
            None => text.to_string(),
        }
    }

    /// Edits the pending record.
    pub fn update(&mut self, f: impl FnOnce(&mut Record)) {
        if let Some(r) = self.record.as_mut() {
            f(r);
        }
    }

    /// Sets the outcome: decision follows from the reason.
    pub fn outcome(&mut self, reason: Reason, rule: Option<&str>, status: Option<u16>) {
        self.update(|r| {
            r.decision = if reason.is_allow() { "allow" } else { "deny" };
            // A refusal after a report-only pass (the address guard, a leak) is a real deny.
            if !reason.is_allow() {
                r.would_deny = false;
            }
            r.reason = reason.code();
            r.rule = rule.map(str::to_string);
            r.status = status;
        });
    }

    /// Report-only: the request goes through although policy would deny it for `reason`.
    pub fn outcome_report(&mut self, reason: Reason, rule: Option<&str>, status: Option<u16>) {
        self.update(|r| {
            r.decision = "allow";
            r.reason = reason.code();
            r.rule = rule.map(str::to_string);
            r.status = status;
            r.would_deny = true;
        });
    }

    /// Policy let the request on under `rule` (the rule the record names); `would_deny`, under
    /// report-only, is the denial it would have had. The outcome is not set yet: it follows
    /// from the stage the request reaches ([`Self::reached`]).
    pub fn allow(&mut self, rule: &str, would_deny: Option<Reason>) {
        self.allowed = Some(would_deny);
        self.update(|r| {
            r.rule = Some(rule.to_string());
            r.would_deny = would_deny.is_some();
        });
    }

    /// Report-only found a denial after decide (an MCP message): the outcome will carry it,
    /// marked `would_deny`, once the request is committed.
    pub fn would_deny(&mut self, reason: Reason) {
        self.allowed = Some(Some(reason));
    }

    /// The one place an allowed request's outcome is set: from the stage it reached, `allowed`
    /// once committed, provisionally `upstream_error` once sent, `allowed` with the status once
    /// answered; under report-only, the would-be denial, marked `would_deny`, with the status.
    /// A refusal ([`Self::outcome`]) overrides it. Does nothing before [`Self::allow`].
    pub fn reached(&mut self, stage: Stage) {
        let Some(would_deny) = self.allowed else {
            return;
        };
        let (reason, status) = match stage {
            Stage::Committed => (Reason::Allowed, None),
            Stage::Sent => (Reason::UpstreamError, None),
            Stage::Answered(status) => (Reason::Allowed, Some(status)),
        };
        self.update(|r| {
            r.decision = "allow";
            r.status = status;
            match would_deny {
                Some(denial) => {
                    r.reason = denial.code();
                    r.would_deny = true;
                }
                None => r.reason = reason.code(),
            }
        });
    }

    /// The upstream answered with `status`, from `upstream` (the address dialed).
    pub fn answered(&mut self, status: u16, upstream: Option<SocketAddr>) {
        self.reached(Stage::Answered(status));
        self.set_upstream(upstream);
    }

    /// The reason alone, the decision standing: how an exchange already decided ended (the
    /// body's refusal, an allowed connection whose upstream failed).
    pub fn set_reason(&mut self, reason: Reason) {
        self.update(|r| r.reason = reason.code());
    }

    /// How a connection already decided ended, over its outcome (rule and status stay): a
    /// refusal (a message latchkey would not forward, a limit) makes it a real deny.
    pub fn ended(&mut self, reason: Reason) {
        self.update(|r| {
            r.reason = reason.code();
            if !reason.is_allow() {
                r.decision = "deny";
                r.would_deny = false;
            }
        });
    }

    /// The method as the client named it (`CONNECT` for a connection, `DNS`, `APPROVAL`).
    pub fn set_method(&mut self, method: &str) {
        self.update(|r| r.method = Some(method.to_string()));
    }

    /// The scheme the request or connection is for.
    pub fn set_scheme(&mut self, scheme: &str) {
        self.update(|r| r.scheme = Some(scheme.to_string()));
    }

    /// The host as the record names it (as sent until it is admitted, then in normal form).
    pub fn set_host(&mut self, host: impl Into<String>) {
        self.update(|r| r.host = Some(host.into()));
    }

    /// The port the request or connection is for.
    pub fn set_port(&mut self, port: u16) {
        self.update(|r| r.port = Some(port));
    }

    /// The authority as admitted: host (in normal form) and port.
    pub fn set_authority(&mut self, host: impl Into<String>, port: u16) {
        self.update(|r| {
            r.host = Some(host.into());
            r.port = Some(port);
        });
    }

    /// The path (and query, redacted by the caller) as the record names it.
    pub fn set_path(&mut self, path: String) {
        self.update(|r| r.path = Some(path));
    }

    /// The rule the request is under before its outcome is set.
    pub fn set_rule(&mut self, rule: &str) {
        self.update(|r| r.rule = Some(rule.to_string()));
    }

    /// The address latchkey dialed, if it dialed one.
    pub fn set_upstream(&mut self, upstream: Option<SocketAddr>) {
        self.update(|r| r.upstream = upstream.map(crate::wire::host::socket_addr_text));
    }

    /// Where a redirected connection was going (its original destination).
    pub fn set_original_dst(&mut self, original: Option<SocketAddr>) {
        self.update(|r| r.original_dst = original.map(crate::wire::host::socket_addr_text));
    }

    /// The runtime session the request was admitted under: its id (over any session the
    /// sandbox sent) and its profile. Its labels and reach go in with [`Self::set_ceiling`].
    pub fn set_session(&mut self, id: &str, profile: &str) {
        self.update(|r| {
            r.session = Some(id.to_string());
            r.profile = Some(profile.to_string());
        });
    }

    /// The identity's (or session's) ceiling: its labels and the digest of its reach.
    pub fn set_ceiling(&mut self, labels: &BTreeMap<String, String>, reach: &str) {
        self.update(|r| {
            r.labels.clone_from(labels);
            r.reach = Some(reach.to_string());
        });
    }

    /// Names of secrets a relay used after the request's own, added to those already named.
    pub fn used_secrets(&mut self, names: impl IntoIterator<Item = String>) {
        self.update(|r| {
            for name in names {
                if !r.secrets.contains(&name) {
                    r.secrets.push(name);
                }
            }
        });
    }

    /// What a WebSocket carried and how it closed.
    pub fn set_websocket(&mut self, info: WebSocketInfo) {
        self.update(|r| r.websocket = Some(info));
    }

    /// Report-only let through what a relay would have refused: the record says so.
    pub fn reported(&mut self) {
        self.update(|r| r.would_deny = true);
    }

    /// What a DNS query asked and got.
    pub fn set_dns(&mut self, info: DnsInfo) {
        self.update(|r| r.dns = Some(info));
    }

    /// Bytes a relay carried (up from the client, down from the upstream), added to the
    /// counters the record reads when it is written.
    pub fn carried(&self, up: u64, down: u64) {
        self.counters.up.fetch_add(up, Ordering::Relaxed);
        self.counters.down.fetch_add(down, Ordering::Relaxed);
    }

    /// The target as admitted, in normal form (over what was recorded as sent).
    pub fn set_target(&mut self, scheme: &str, host: &str, port: u16, path: String) {
        self.update(|r| {
            r.scheme = Some(scheme.to_string());
            r.host = Some(host.to_string());
            r.port = Some(port);
            r.path = Some(path);
        });
    }

    /// The secrets the broker used, by name.
    pub fn set_secrets(&mut self, names: Vec<String>) {
        self.update(|r| r.secrets = names);
    }

    /// Where the secrets used came from (`vault`, `env`, …, by name), and which of them were
    /// served stale.
    pub fn set_secret_sources(
        &mut self,
        sources: std::collections::BTreeMap<String, &'static str>,
        stale: Vec<String>,
    ) {
        self.update(|r| {
            r.secret_sources = sources;
            r.stale_secrets = stale;
        });
    }

    /// The tokens a capture kept, by name.
    pub fn set_captured(&mut self, names: Vec<String>) {
        self.update(|r| r.captured = names);
    }

    /// What the MCP check found.
    pub fn set_mcp(&mut self, info: McpInfo) {
        self.update(|r| r.mcp = Some(info));
    }

    /// The approval this request is part of.
    pub fn set_approval(&mut self, info: ApprovalInfo) {
        self.update(|r| r.approval = Some(info));
    }

    /// The charges against `[limits]` (reserved, refused, or settled without a response).
    pub fn set_limits(&mut self, charges: Vec<LimitCharge>) {
        self.update(|r| r.limits = charges);
    }

    /// The charges as settled when the response ended, and the usage read from it.
    pub fn settled(&mut self, charges: Vec<LimitCharge>, usage: Option<UsageInfo>) {
        self.update(|r| {
            r.limits = charges;
            r.usage = usage;
        });
    }

    pub fn id(&self) -> &str {
        self.record.as_ref().map_or("", |r| r.id.as_str())
    }

    /// Asks the refusal's answer to carry `retry-after: secs`.
    pub fn set_retry_after(&mut self, secs: u64) {
        self.retry_after = Some(secs);
    }

    /// What [`Self::set_retry_after`] set.
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }

    /// Keeps `thing` alive until this record is written (a tunnel's concurrency slot).
    pub fn hold(&mut self, thing: Box<dyn std::any::Any + Send + Sync>) {
        self.held = Some(thing);
    }

    /// Takes back what [`Self::hold`] kept (a tunnel settles its limits itself).
    pub fn take_held(&mut self) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        self.held.take()
    }

    /// Asks the answer to carry `x-ratelimit-limit/remaining/reset`.
    pub fn set_rate_headers(&mut self, limit: u64, remaining: u64, reset: u64) {
        self.rate_headers = Some((limit, remaining, reset));
    }

    /// What [`Self::set_rate_headers`] set: (limit, remaining, reset seconds).
    pub fn rate_headers(&self) -> Option<(u64, u64, u64)> {
        self.rate_headers
    }

    /// The approval this request is part of, if any (the refusal answer names it).
    pub fn approval(&self) -> Option<&ApprovalInfo> {
        self.record.as_ref().and_then(|r| r.approval.as_ref())
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// Drops the record unwritten: for a CONNECT whose interception succeeded, whose inner
    /// requests each leave their own record.
    pub fn dismiss(mut self) {
        self.record = None;
    }

    /// Writes the record now.
    pub fn finish(mut self) {
        self.write();
    }

    /// Commits the decision record (what is known now: the decision, rule, identity, target,
    /// secrets named) and waits until it is written, synced where `--audit-sync` asks. Returns
    /// `false` when it could not be written: the request must then not reach the upstream.
    /// The request's outcome record, with the same id, follows when it ends.
    pub async fn commit_decision(&mut self) -> bool {
        let Some(r) = self.record.as_ref() else {
            return true;
        };
        let mut r = r.decision_record();
        self.seal(&mut r);
        self.log.commit(r).await.unwrap_or(false)
    }

    /// Scrubs the free-text fields and fills in the counters, as the record goes out.
    fn seal(&self, r: &mut Record) {
        if let Some(scrub) = self.scrub.as_deref() {
            // Absent fields stand in as empty strings: no allocation, nothing to find.
            let mut blank = [String::new(), String::new(), String::new()];
            let [b0, b1, b2] = &mut blank;
            scrub.scrub_in_place(&mut [
                r.path.as_mut().unwrap_or(b0),
                r.host.as_mut().unwrap_or(b1),
                r.method.as_mut().unwrap_or(b2),
            ]);
        }
        r.duration_ms = self.started.elapsed().as_millis() as u64;
        r.bytes_up = self.counters.up.load(Ordering::Relaxed);
        r.bytes_down = self.counters.down.load(Ordering::Relaxed);
        r.redactions = self.counters.redactions.load(Ordering::Relaxed);
    }

    fn write(&mut self) {
        if let Some(mut r) = self.record.take() {
            self.seal(&mut r);
            r.phase = Phase::Outcome;
            tracing::info!(
                audit.id = %r.id,
                client.addr = %r.client,
                identity = %r.identity,
                method = r.method.as_deref().unwrap_or("-"),
                url.host = r.host.as_deref().unwrap_or("-"),
                url.port = r.port.unwrap_or_default(),
                url.path = r.path.as_deref().unwrap_or("-"),
                decision = r.decision,
                policy.rule = r.rule.as_deref().unwrap_or("-"),
                reason = r.reason,
                status = r.status.unwrap_or_default(),
                upstream.addr = r.upstream.as_deref().unwrap_or("-"),
                "decision"
            );
            self.log.write(r);
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.write();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;
    use std::time::Duration;

    #[test]
    fn an_entry_is_written_exactly_once_even_when_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.jsonl");
        let log = Arc::new(AuditLog::open(&path).expect("open"));
        let client: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let mut e = Entry::start(log.clone(), client, "default", "sha256:x");
        e.outcome(Reason::NoRule, None, Some(403));
        drop(e);
        Entry::start(log.clone(), client, "default", "sha256:x").finish();
        assert!(log.flush(Duration::from_secs(5)));
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["reason"], "no_rule");
        assert_eq!(lines[0]["status"], 403);
        assert_eq!(log.written(), 2);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn an_allowed_request_s_outcome_follows_the_stage_it_reached() {
        let log = Arc::new(AuditLog::with_sink(Box::new(std::io::sink())).expect("log"));
        let client: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let outcome = |e: &mut Entry| {
            let mut seen = None;
            e.update(|r| seen = Some((r.decision, r.reason, r.status, r.would_deny)));
            seen.expect("open")
        };
        let mut e = Entry::start(log.clone(), client, "default", "sha256:x");
        e.reached(Stage::Committed);
        assert_eq!(
            outcome(&mut e),
            ("deny", "bad_request", None, false),
            "not allowed yet"
        );
        e.allow("api", None);
        e.reached(Stage::Committed);
        assert_eq!(outcome(&mut e), ("allow", "allowed", None, false));
        e.reached(Stage::Sent);
        assert_eq!(outcome(&mut e), ("allow", "upstream_error", None, false));
        e.answered(201, "127.0.0.1:443".parse().ok());
        assert_eq!(outcome(&mut e), ("allow", "allowed", Some(201), false));
        e.update(|r| assert_eq!(r.upstream.as_deref(), Some("127.0.0.1:443")));
        e.update(|r| assert_eq!(r.rule.as_deref(), Some("api")));
        e.dismiss();

        let mut e = Entry::start(log.clone(), client, "default", "sha256:x");
        e.allow("closest", Some(Reason::PathNotAllowed));
        e.reached(Stage::Sent);
        assert_eq!(outcome(&mut e), ("allow", "path_not_allowed", None, true));
        e.reached(Stage::Answered(200));
        assert_eq!(
            outcome(&mut e),
            ("allow", "path_not_allowed", Some(200), true)
        );
        e.dismiss();

        let mut e = Entry::start(log, client, "default", "sha256:x");
        e.allow("mcp-rule", None);
        e.would_deny(Reason::McpNotAllowed);
        e.update(|r| assert!(!r.would_deny, "marked only when committed"));
        e.reached(Stage::Committed);
        assert_eq!(outcome(&mut e), ("allow", "mcp_not_allowed", None, true));
        e.outcome(Reason::BudgetExhausted, Some("mcp-rule"), Some(429));
        assert_eq!(
            outcome(&mut e),
            ("deny", "budget_exhausted", Some(429), false)
        );
        e.dismiss();
    }

    #[test]
    fn a_record_s_debug_never_shows_what_the_sandbox_sent_in_the_url() {
        let log = Arc::new(AuditLog::with_sink(Box::new(std::io::sink())).expect("log"));
        let client: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let mut e = Entry::start(log, client, "default", "sha256:x");
        e.update(|r| {
            r.method = Some("sk-pasted-secret-method".into());
            r.host = Some("sk-pasted-secret-host.example".into());
            r.path = Some("/v1?key=sk-pasted-secret-path".into());
            let printed = format!("{r:?} {r:#?}");
            assert!(!printed.contains("sk-pasted"), "{printed}");
            assert!(printed.contains("path_len"), "{printed}");
        });
        e.dismiss();
    }

    #[test]
    fn an_entry_scrubs_its_url_fields_and_messages_with_the_function_it_was_given() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.jsonl");
        let log = Arc::new(AuditLog::open(&path).expect("open"));
        let client: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let mut e = Entry::start(log.clone(), client, "default", "sha256:x");
        fn scrub(t: &str) -> Cow<'_, str> {
            if t.contains("sk-live") {
                Cow::Owned(t.replace("sk-live", "[REDACTED:key]"))
            } else {
                Cow::Borrowed(t)
            }
        }
        e.scrub_with(Arc::new(scrub));
        assert_eq!(e.scrub_text("/v1?k=sk-live"), "/v1?k=[REDACTED:key]");
        e.update(|r| {
            r.path = Some("/v1?k=sk-live".into());
            r.host = Some("sk-live.example".into());
            r.method = Some("GET".into());
        });
        e.finish();
        assert!(log.flush(Duration::from_secs(5)));
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(!text.contains("sk-live"), "{text}");
        let v: serde_json::Value = serde_json::from_str(text.trim()).expect("json");
        assert_eq!(v["path"], "/v1?k=[REDACTED:key]");
        assert_eq!(v["host"], "[REDACTED:key].example");
        assert_eq!(v["method"], "GET");
    }
}

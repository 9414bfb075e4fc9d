//! Prometheus metrics: counters and histograms with small, fixed label sets, encoded in the text
//! exposition format (0.0.4) by `prometheus-client` for the admin API.
//!
//! Requests are counted where their audit record is written, so a metric and the audit log can
//! never disagree. Labels are names and reason codes only — never values. Counters and the
//! latency histogram are plain atomics (one increment per observation); the request family is
//! one short critical section (see [`RequestCounts`]). Depends on nothing else in the crate.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Upper bounds (seconds) of the upstream latency histogram.
const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A histogram with fixed buckets. An observation increments one bucket (not every bucket at
/// or above it); the cumulative counts are summed when encoding.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket; the last slot counts those above every bound (and NaN).
    counts: [AtomicU64; BUCKETS.len() + 1],
    /// Sum in microseconds, to stay an integer.
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, seconds: f64) {
        let i = BUCKETS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }

    /// Per-bucket counts (not cumulative), the total count and the sum in seconds. The total
    /// is the sum of the slots, so the `+Inf` bucket always equals `_count`.
    fn snapshot(&self) -> (Vec<(f64, u64)>, u64, f64) {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let buckets = BUCKETS
            .iter()
            .copied()
            .zip(counts.iter().copied())
            .collect();
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        (buckets, counts.iter().sum(), sum)
    }
}

/// Request counts by (decision, reason), then rule, then identity: nested so that counting a
/// label set seen before looks it up by `&str` and allocates nothing.
type RequestTable = BTreeMap<(&'static str, &'static str), BTreeMap<String, BTreeMap<String, u64>>>;

/// `latchkey_requests_total`. One short critical section per request: measured against a
/// lock-free snapshot (`arc-swap`) and a shared `RwLock` table of atomics, this uncontended
/// mutex around a small ordered map was the cheapest on one thread and on two.
#[derive(Debug, Default)]
struct RequestCounts {
    table: Mutex<RequestTable>,
}

impl RequestCounts {
    fn count(&self, decision: &'static str, reason: &'static str, rule: &str, identity: &str) {
        let mut m = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let by_rule = m.entry((decision, reason)).or_default();
        let by_identity = match by_rule.get_mut(rule) {
            Some(b) => b,
            None => by_rule.entry(rule.to_string()).or_default(),
        };
        match by_identity.get_mut(identity) {
            Some(n) => *n += 1,
            None => {
                by_identity.insert(identity.to_string(), 1);
            }
        }
    }

    /// Every series, in label order (a stable exposition), with its count now.
    fn snapshot(&self) -> Vec<RequestSample> {
        let m = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::new();
        for ((decision, reason), by_rule) in m.iter() {
            for (rule, by_identity) in by_rule {
                for (identity, count) in by_identity {
                    out.push(RequestSample {
                        decision,
                        reason,
                        rule: rule.clone(),
                        identity: identity.clone(),
                        count: *count,
                    });
                }
            }
        }
        out
    }
}

/// Every metric latchkey exports.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: RequestCounts,
    would_deny: AtomicU64,
    pub upstream_latency: Histogram,
    pub tls_handshakes_ok: AtomicU64,
    pub tls_handshakes_failed: AtomicU64,
    pub cert_cache_hits: AtomicU64,
    pub cert_cache_misses: AtomicU64,
    pub redactions: AtomicU64,
    pub policy_reloads: AtomicU64,
    pub policy_reload_errors: AtomicU64,
    pub audit_write_errors: AtomicU64,
    /// Requests that waited because the audit queue was full.
    pub audit_queue_waits: AtomicU64,
    /// Lines the audit writer appended (records and checkpoints).
    pub audit_lines: AtomicU64,
    /// `write` calls the audit writer made: lines ÷ writes is the group-commit batch size.
    pub audit_writes: AtomicU64,
    /// Times a request woke the audit writer thread (once per batch, not per request).
    pub audit_wakeups: AtomicU64,
    pub secret_fetches: AtomicU64,
    /// `--audit-ship`: how far shipping lags (rendered only while shipping is on).
    pub audit_ship: ShipGauges,
}

/// The audit shipper's lag: pending segments and bytes, the oldest one's closing time, and
/// uploads by result. Set by the shipper each time it reads its spool.
#[derive(Debug, Default)]
pub struct ShipGauges {
    enabled: AtomicBool,
    pending_segments: AtomicU64,
    pending_bytes: AtomicU64,
    /// Milliseconds since the epoch at which the oldest pending segment closed; 0: none.
    oldest_closed_ms: AtomicU64,
    uploads_ok: AtomicU64,
    uploads_failed: AtomicU64,
}

impl ShipGauges {
    /// Shipping is on: the `latchkey_audit_ship_*` families appear in `/metrics`.
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Relaxed);
    }

    pub fn set_pending(&self, segments: u64, bytes: u64, oldest: Option<SystemTime>) {
        self.pending_segments.store(segments, Ordering::Relaxed);
        self.pending_bytes.store(bytes, Ordering::Relaxed);
        let ms = oldest
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| (d.as_millis() as u64).max(1));
        self.oldest_closed_ms.store(ms, Ordering::Relaxed);
    }

    /// Counts one upload attempt.
    pub fn uploaded(&self, ok: bool) {
        let c = if ok {
            &self.uploads_ok
        } else {
            &self.uploads_failed
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Option<ShipSample> {
        if !self.enabled.load(Ordering::Relaxed) {
            return None;
        }
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let oldest = n(&self.oldest_closed_ms);
        let age = if oldest == 0 {
            0.0
        } else {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            now.saturating_sub(oldest) as f64 / 1000.0
        };
        Some(ShipSample {
            pending_segments: n(&self.pending_segments),
            pending_bytes: n(&self.pending_bytes),
            oldest_age_seconds: age,
            ok: n(&self.uploads_ok),
            failed: n(&self.uploads_failed),
        })
    }
}

#[derive(Debug)]
struct ShipSample {
    pending_segments: u64,
    pending_bytes: u64,
    oldest_age_seconds: f64,
    ok: u64,
    failed: u64,
}

/// Point-in-time values owned elsewhere, passed in when rendering.
#[derive(Debug, Default, Clone)]
pub struct Gauges {
    pub connections_active: u64,
    pub uptime_seconds: f64,
    pub policy_rules: u64,
    pub policy_info: String,
    /// Whether the audit log's last write succeeded (traffic is refused while it is not).
    pub audit_healthy: bool,
    /// Each `[limits]` counter this process has charged, as last seen (never a per-session
    /// key: a session id is an unbounded label).
    pub limits: Vec<LimitGauge>,
    /// Runtime sessions on this replica, once serving set them up.
    pub sessions: Option<SessionGauges>,
}

/// Runtime sessions as this replica sees them: by profile, never by session id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionGauges {
    /// Sessions admitted here and not ended, by profile.
    pub live: Vec<(String, u64)>,
    pub created: u64,
    pub revoked: u64,
    pub expired: u64,
    pub admitted: u64,
    pub refused: u64,
    /// Admissions that had to read the store (a first presentation, or the cache not fresh).
    pub store_reads: u64,
}

/// One limit counter for `latchkey_limit_used` / `latchkey_limit_remaining`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitGauge {
    pub limit: String,
    pub measure: &'static str,
    pub key: String,
    pub used: u64,
    pub remaining: u64,
}

impl Metrics {
    /// Counts one audited request or refused connection.
    pub fn request(
        &self,
        decision: &'static str,
        reason: &'static str,
        rule: &str,
        identity: &str,
        would_deny: bool,
    ) {
        self.requests.count(decision, reason, rule, identity);
        if would_deny {
            self.would_deny.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The text exposition format (version 0.0.4).
    pub fn render(&self, g: &Gauges) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Snapshot::take(self, g)));
        let mut out = String::new();
        // Writing to a String cannot fail; an encoder error would be a bug, not input.
        if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        out
    }
}

/// One `latchkey_requests_total` sample.
#[derive(Debug)]
struct RequestSample {
    decision: &'static str,
    reason: &'static str,
    rule: String,
    identity: String,
    count: u64,
}

/// Every value at one instant, encoded in the order `/metrics` has always listed them.
#[derive(Debug)]
struct Snapshot {
    requests: Vec<RequestSample>,
    would_deny: u64,
    latency: (Vec<(f64, u64)>, u64, f64),
    tls_ok: u64,
    tls_failed: u64,
    cert_hits: u64,
    cert_misses: u64,
    counters: [(&'static str, &'static str, u64); 8],
    audit_healthy: u64,
    secret_fetches: u64,
    ship: Option<ShipSample>,
    gauges: Gauges,
}

impl Snapshot {
    fn take(m: &Metrics, g: &Gauges) -> Self {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Self {
            requests: m.requests.snapshot(),
            would_deny: n(&m.would_deny),
            latency: m.upstream_latency.snapshot(),
            tls_ok: n(&m.tls_handshakes_ok),
            tls_failed: n(&m.tls_handshakes_failed),
            cert_hits: n(&m.cert_cache_hits),
            cert_misses: n(&m.cert_cache_misses),
            counters: [
                (
                    "latchkey_redactions",
                    "Secret values replaced in responses.",
                    n(&m.redactions),
                ),
                (
                    "latchkey_policy_reloads",
                    "Policy reloads that replaced the policy in force.",
                    n(&m.policy_reloads),
                ),
                (
                    "latchkey_policy_reload_errors",
                    "Policy reloads refused because the new policy was invalid.",
                    n(&m.policy_reload_errors),
                ),
                (
                    "latchkey_audit_write_errors",
                    "Audit records that could not be written.",
                    n(&m.audit_write_errors),
                ),
                (
                    "latchkey_audit_queue_waits",
                    "Requests that waited for the audit writer because its queue was full.",
                    n(&m.audit_queue_waits),
                ),
                (
                    "latchkey_audit_lines",
                    "Lines appended to the audit log (records and checkpoints).",
                    n(&m.audit_lines),
                ),
                (
                    "latchkey_audit_writes",
                    "Writes of the audit log: lines per write is the group-commit batch.",
                    n(&m.audit_writes),
                ),
                (
                    "latchkey_audit_writer_wakeups",
                    "Times a request woke the audit writer thread.",
                    n(&m.audit_wakeups),
                ),
            ],
            audit_healthy: u64::from(g.audit_healthy),
            secret_fetches: n(&m.secret_fetches),
            ship: m.audit_ship.snapshot(),
            gauges: g.clone(),
        }
    }
}

/// A counter family with no labels.
fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    ConstCounter::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
}

/// A counter family labelled by `result`.
fn by_result(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: [(&str, u64); 2],
) -> std::fmt::Result {
    let mut family = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (result, v) in values {
        let labels = [("result", result)];
        ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A gauge family with no labels.
fn gauge<V>(e: &mut DescriptorEncoder, name: &str, help: &str, v: V) -> std::fmt::Result
where
    ConstGauge<V>: EncodeMetric,
{
    ConstGauge::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        self.encode_requests(&mut e)?;
        for (name, help, v) in self.counters {
            counter(&mut e, name, help, v)?;
        }
        gauge(
            &mut e,
            "latchkey_audit_healthy",
            "1 while the audit log can be written; 0 while traffic is refused because it cannot.",
            self.audit_healthy,
        )?;
        if let Some(s) = &self.ship {
            encode_ship(s, &mut e)?;
        }
        counter(
            &mut e,
            "latchkey_secret_fetches",
            "Calls latchkey made itself that were answered: token exchanges, secret store reads, logins and AWS credential refreshes.",
            self.secret_fetches,
        )?;
        self.encode_gauges(&mut e)
    }
}

impl Snapshot {
    /// Requests by decision, their latency, TLS handshakes and the certificate cache.
    fn encode_requests(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut requests = e.encode_descriptor(
            "latchkey_requests",
            "Requests and refused connections, by decision, reason, rule and identity.",
            None,
            MetricType::Counter,
        )?;
        for s in &self.requests {
            let labels = [
                ("decision", s.decision),
                ("reason", s.reason),
                ("rule", s.rule.as_str()),
                ("identity", s.identity.as_str()),
            ];
            ConstCounter::new(s.count).encode(requests.encode_family(&labels)?)?;
        }
        counter(
            e,
            "latchkey_report_only_would_deny",
            "Requests allowed by report-only mode that enforcement would deny.",
            self.would_deny,
        )?;
        let (buckets, count, sum) = &self.latency;
        e.encode_descriptor(
            "latchkey_upstream_response_seconds",
            "Time from sending a request upstream to its response headers.",
            None,
            MetricType::Histogram,
        )?
        .encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?;
        by_result(
            e,
            "latchkey_tls_handshakes",
            "TLS handshakes with sandboxes, by result.",
            [("ok", self.tls_ok), ("failed", self.tls_failed)],
        )?;
        by_result(
            e,
            "latchkey_cert_cache",
            "Leaf certificate cache lookups, by result.",
            [("hit", self.cert_hits), ("miss", self.cert_misses)],
        )
    }

    /// The gauges: connections, uptime, the policy in force, and each limit counter charged.
    fn encode_gauges(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        let g = &self.gauges;
        gauge(
            e,
            "latchkey_connections_active",
            "Sandbox connections open now.",
            g.connections_active,
        )?;
        gauge(
            e,
            "latchkey_uptime_seconds",
            "Seconds since latchkey started.",
            g.uptime_seconds,
        )?;
        gauge(
            e,
            "latchkey_policy_rules",
            "Rules in the policy in force.",
            g.policy_rules,
        )?;
        let mut info = e.encode_descriptor(
            "latchkey_policy_info",
            "The policy in force, by digest.",
            None,
            MetricType::Gauge,
        )?;
        let labels = [("digest", g.policy_info.as_str())];
        ConstGauge::new(1u64).encode(info.encode_family(&labels)?)?;
        if let Some(s) = &g.sessions {
            encode_sessions(s, e)?;
        }
        // Present once a limit has been charged (a policy without [limits] adds nothing).
        if g.limits.is_empty() {
            return Ok(());
        }
        for (name, help, pick) in [
            (
                "latchkey_limit_used",
                "A [limits] counter's use in its current window (requests taken from the bucket, requests in flight, bytes, tokens, micro-USD), by limit, measure and key.",
                (|l: &LimitGauge| l.used) as fn(&LimitGauge) -> u64,
            ),
            (
                "latchkey_limit_remaining",
                "What a [limits] counter has left in its current window, by limit, measure and key.",
                |l: &LimitGauge| l.remaining,
            ),
        ] {
            let mut family = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for l in &g.limits {
                let labels = [
                    ("limit", l.limit.as_str()),
                    ("measure", l.measure),
                    ("key", l.key.as_str()),
                ];
                ConstGauge::new(pick(l)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// Runtime sessions: live by profile, and what happened to them (never by session id).
fn encode_sessions(s: &SessionGauges, e: &mut DescriptorEncoder) -> std::fmt::Result {
    let mut live = e.encode_descriptor(
        "latchkey_sessions_live",
        "Runtime sessions admitted on this replica and not ended, by profile.",
        None,
        MetricType::Gauge,
    )?;
    for (profile, n) in &s.live {
        let labels = [("profile", profile.as_str())];
        ConstGauge::new(*n).encode(live.encode_family(&labels)?)?;
    }
    let mut events = e.encode_descriptor(
        "latchkey_session_events",
        "Runtime session events on this replica: created, revoked, expired (by the watcher), admitted and refused presentations, and admissions that read the state store.",
        None,
        MetricType::Counter,
    )?;
    for (event, v) in [
        ("created", s.created),
        ("revoked", s.revoked),
        ("expired", s.expired),
        ("admitted", s.admitted),
        ("refused", s.refused),
        ("store_read", s.store_reads),
    ] {
        let labels = [("event", event)];
        ConstCounter::new(v).encode(events.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The audit shipper's backlog and uploads (`--audit-ship`).
fn encode_ship(s: &ShipSample, e: &mut DescriptorEncoder) -> std::fmt::Result {
    gauge(
        e,
        "latchkey_audit_ship_pending_segments",
        "Closed audit segments not yet shipped (--audit-ship).",
        s.pending_segments,
    )?;
    gauge(
        e,
        "latchkey_audit_ship_pending_bytes",
        "Bytes of closed audit segments not yet shipped.",
        s.pending_bytes,
    )?;
    gauge(
        e,
        "latchkey_audit_ship_oldest_pending_age_seconds",
        "Seconds since the oldest unshipped segment closed (0 when none waits).",
        s.oldest_age_seconds,
    )?;
    by_result(
        e,
        "latchkey_audit_ship_uploads",
        "Audit segment uploads, by result.",
        [("ok", s.ok), ("failed", s.failed)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histograms_and_escaped_labels() {
        let m = Metrics::default();
        m.request("allow", "allowed", "a\"b", "default", false);
        m.request("allow", "allowed", "a\"b", "default", false);
        m.upstream_latency.observe(0.02);
        let text = m.render(&Gauges::default());
        assert!(text.contains(
            "latchkey_requests_total{decision=\"allow\",reason=\"allowed\",rule=\"a\\\"b\",identity=\"default\"} 2"
        ));
        assert!(text.contains("latchkey_upstream_response_seconds_bucket{le=\"0.025\"} 1"));
        assert!(text.contains("latchkey_upstream_response_seconds_bucket{le=\"0.01\"} 0"));
        assert!(text.contains("latchkey_upstream_response_seconds_count 1"));
    }

    /// The exposition as the hand-written renderer served it before `prometheus-client`: every
    /// name, label, HELP and TYPE line in the same order. Only the uptime's digits differ (it
    /// was printed with three decimals; now with as many as it needs).
    const EXPOSITION: &str = r#"# HELP latchkey_requests_total Requests and refused connections, by decision, reason, rule and identity.
# TYPE latchkey_requests_total counter
latchkey_requests_total{decision="allow",reason="allowed",rule="api",identity="agent-a"} 1
latchkey_requests_total{decision="allow",reason="allowed",rule="api",identity="default"} 2
latchkey_requests_total{decision="allow",reason="no_rule",rule="",identity="default"} 1
latchkey_requests_total{decision="deny",reason="no_rule",rule="",identity="default"} 1
# HELP latchkey_report_only_would_deny_total Requests allowed by report-only mode that enforcement would deny.
# TYPE latchkey_report_only_would_deny_total counter
latchkey_report_only_would_deny_total 1
# HELP latchkey_upstream_response_seconds Time from sending a request upstream to its response headers.
# TYPE latchkey_upstream_response_seconds histogram
latchkey_upstream_response_seconds_bucket{le="0.005"} 1
latchkey_upstream_response_seconds_bucket{le="0.01"} 1
latchkey_upstream_response_seconds_bucket{le="0.025"} 2
latchkey_upstream_response_seconds_bucket{le="0.05"} 2
latchkey_upstream_response_seconds_bucket{le="0.1"} 2
latchkey_upstream_response_seconds_bucket{le="0.25"} 2
latchkey_upstream_response_seconds_bucket{le="0.5"} 2
latchkey_upstream_response_seconds_bucket{le="1"} 3
latchkey_upstream_response_seconds_bucket{le="2.5"} 3
latchkey_upstream_response_seconds_bucket{le="5"} 3
latchkey_upstream_response_seconds_bucket{le="10"} 3
latchkey_upstream_response_seconds_bucket{le="30"} 3
latchkey_upstream_response_seconds_bucket{le="+Inf"} 4
latchkey_upstream_response_seconds_sum 61.022
latchkey_upstream_response_seconds_count 4
# HELP latchkey_tls_handshakes_total TLS handshakes with sandboxes, by result.
# TYPE latchkey_tls_handshakes_total counter
latchkey_tls_handshakes_total{result="ok"} 3
latchkey_tls_handshakes_total{result="failed"} 1
# HELP latchkey_cert_cache_total Leaf certificate cache lookups, by result.
# TYPE latchkey_cert_cache_total counter
latchkey_cert_cache_total{result="hit"} 2
latchkey_cert_cache_total{result="miss"} 1
# HELP latchkey_redactions_total Secret values replaced in responses.
# TYPE latchkey_redactions_total counter
latchkey_redactions_total 5
# HELP latchkey_policy_reloads_total Policy reloads that replaced the policy in force.
# TYPE latchkey_policy_reloads_total counter
latchkey_policy_reloads_total 0
# HELP latchkey_policy_reload_errors_total Policy reloads refused because the new policy was invalid.
# TYPE latchkey_policy_reload_errors_total counter
latchkey_policy_reload_errors_total 0
# HELP latchkey_audit_write_errors_total Audit records that could not be written.
# TYPE latchkey_audit_write_errors_total counter
latchkey_audit_write_errors_total 0
# HELP latchkey_audit_queue_waits_total Requests that waited for the audit writer because its queue was full.
# TYPE latchkey_audit_queue_waits_total counter
latchkey_audit_queue_waits_total 0
# HELP latchkey_audit_lines_total Lines appended to the audit log (records and checkpoints).
# TYPE latchkey_audit_lines_total counter
latchkey_audit_lines_total 0
# HELP latchkey_audit_writes_total Writes of the audit log: lines per write is the group-commit batch.
# TYPE latchkey_audit_writes_total counter
latchkey_audit_writes_total 0
# HELP latchkey_audit_writer_wakeups_total Times a request woke the audit writer thread.
# TYPE latchkey_audit_writer_wakeups_total counter
latchkey_audit_writer_wakeups_total 0
# HELP latchkey_audit_healthy 1 while the audit log can be written; 0 while traffic is refused because it cannot.
# TYPE latchkey_audit_healthy gauge
latchkey_audit_healthy 1
# HELP latchkey_secret_fetches_total Calls latchkey made itself that were answered: token exchanges, secret store reads, logins and AWS credential refreshes.
# TYPE latchkey_secret_fetches_total counter
latchkey_secret_fetches_total 0
# HELP latchkey_connections_active Sandbox connections open now.
# TYPE latchkey_connections_active gauge
latchkey_connections_active 7
# HELP latchkey_uptime_seconds Seconds since latchkey started.
# TYPE latchkey_uptime_seconds gauge
latchkey_uptime_seconds 12.5
# HELP latchkey_policy_rules Rules in the policy in force.
# TYPE latchkey_policy_rules gauge
latchkey_policy_rules 2
# HELP latchkey_policy_info The policy in force, by digest.
# TYPE latchkey_policy_info gauge
latchkey_policy_info{digest="sha256:ab"} 1
"#;

    #[test]
    fn the_exposition_keeps_every_name_label_help_and_order() {
        let m = Metrics::default();
        m.request("deny", "no_rule", "", "default", false);
        m.request("allow", "allowed", "api", "default", false);
        m.request("allow", "no_rule", "", "default", true);
        m.request("allow", "allowed", "api", "agent-a", false);
        m.request("allow", "allowed", "api", "default", false);
        for s in [0.001, 0.021, 1.0, 60.0] {
            m.upstream_latency.observe(s);
        }
        for (a, n) in [
            (&m.tls_handshakes_ok, 3),
            (&m.tls_handshakes_failed, 1),
            (&m.cert_cache_hits, 2),
            (&m.cert_cache_misses, 1),
            (&m.redactions, 5),
        ] {
            a.store(n, Ordering::Relaxed);
        }
        let text = m.render(&Gauges {
            connections_active: 7,
            uptime_seconds: 12.5,
            policy_rules: 2,
            policy_info: "sha256:ab".into(),
            audit_healthy: true,
            limits: Vec::new(),
            sessions: None,
        });
        assert_eq!(text, EXPOSITION);
    }

    #[test]
    fn sessions_are_by_profile_and_never_by_id() {
        let text = Metrics::default().render(&Gauges {
            connections_active: 0,
            uptime_seconds: 0.0,
            policy_rules: 0,
            policy_info: String::new(),
            audit_healthy: true,
            limits: Vec::new(),
            sessions: Some(SessionGauges {
                live: vec![("agent".to_string(), 3)],
                created: 4,
                revoked: 1,
                ..SessionGauges::default()
            }),
        });
        assert!(
            text.contains("latchkey_sessions_live{profile=\"agent\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("latchkey_session_events_total{event=\"created\"} 4"),
            "{text}"
        );
        assert!(
            text.contains("latchkey_session_events_total{event=\"revoked\"} 1"),
            "{text}"
        );
        assert!(!text.contains("ses_"));
    }

    #[test]
    fn counting_from_many_threads_loses_nothing_and_adds_each_label_set_once() {
        let m = std::sync::Arc::new(Metrics::default());
        std::thread::scope(|s| {
            for t in 0..4 {
                let m = &m;
                s.spawn(move || {
                    for i in 0..10_000u32 {
                        let rule = ["a", "b", "c"][(i % 3) as usize];
                        let id = if t % 2 == 0 { "x" } else { "y" };
                        m.request("allow", "allowed", rule, id, false);
                    }
                });
            }
        });
        let samples = m.requests.snapshot();
        assert_eq!(samples.len(), 6, "{samples:?}");
        assert_eq!(samples.iter().map(|s| s.count).sum::<u64>(), 40_000);
    }
}

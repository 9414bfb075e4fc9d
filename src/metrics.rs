//! Prometheus metrics: counters and histograms with small, fixed label sets, rendered in the
//! text exposition format by the admin API.
//!
//! Requests are counted where their audit record is written, so a metric and the audit log can
//! never disagree. Labels are names and reason codes only — never values.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds (seconds) of the upstream latency histogram.
const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    /// Sum in microseconds, to stay an integer.
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, seconds: f64) {
        for (i, b) in BUCKETS.iter().enumerate() {
            if seconds <= *b {
                self.counts[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }
}

/// Request counts by (decision, reason), then rule, then identity: nested so that counting a
/// label set seen before looks it up by `&str` and allocates nothing.
type RequestCounts =
    BTreeMap<(&'static str, &'static str), BTreeMap<String, BTreeMap<String, u64>>>;

/// Every metric latchkey exports.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<RequestCounts>,
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
    pub secret_fetches: AtomicU64,
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
        if let Ok(mut m) = self.requests.lock() {
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
        if would_deny {
            self.would_deny.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The text exposition format (version 0.0.4).
    pub fn render(&self, g: &Gauges) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        let _ = writeln!(
            out,
            "# HELP latchkey_requests_total Requests and refused connections, by decision, reason, rule and identity.\n# TYPE latchkey_requests_total counter"
        );
        if let Ok(m) = self.requests.lock() {
            for ((decision, reason), by_rule) in m.iter() {
                for (rule, by_identity) in by_rule {
                    for (identity, v) in by_identity {
                        let _ = writeln!(
                            out,
                            "latchkey_requests_total{{decision=\"{decision}\",reason=\"{reason}\",rule=\"{}\",identity=\"{}\"}} {v}",
                            escape(rule),
                            escape(identity)
                        );
                    }
                }
            }
        }
        counter(
            &mut out,
            "latchkey_report_only_would_deny_total",
            "Requests allowed by report-only mode that enforcement would deny.",
            self.would_deny.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP latchkey_upstream_response_seconds Time from sending a request upstream to its response headers.\n# TYPE latchkey_upstream_response_seconds histogram"
        );
        let h = &self.upstream_latency;
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "latchkey_upstream_response_seconds_bucket{{le=\"{b}\"}} {}",
                h.counts[i].load(Ordering::Relaxed)
            );
        }
        let count = h.count.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "latchkey_upstream_response_seconds_bucket{{le=\"+Inf\"}} {count}\nlatchkey_upstream_response_seconds_sum {}\nlatchkey_upstream_response_seconds_count {count}",
            h.sum_us.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(
            out,
            "# HELP latchkey_tls_handshakes_total TLS handshakes with sandboxes, by result.\n# TYPE latchkey_tls_handshakes_total counter\nlatchkey_tls_handshakes_total{{result=\"ok\"}} {}\nlatchkey_tls_handshakes_total{{result=\"failed\"}} {}",
            self.tls_handshakes_ok.load(Ordering::Relaxed),
            self.tls_handshakes_failed.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP latchkey_cert_cache_total Leaf certificate cache lookups, by result.\n# TYPE latchkey_cert_cache_total counter\nlatchkey_cert_cache_total{{result=\"hit\"}} {}\nlatchkey_cert_cache_total{{result=\"miss\"}} {}",
            self.cert_cache_hits.load(Ordering::Relaxed),
            self.cert_cache_misses.load(Ordering::Relaxed)
        );
        counter(
            &mut out,
            "latchkey_redactions_total",
            "Secret values replaced in responses.",
            self.redactions.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "latchkey_policy_reloads_total",
            "Policy reloads that replaced the policy in force.",
            self.policy_reloads.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "latchkey_policy_reload_errors_total",
            "Policy reloads refused because the new policy was invalid.",
            self.policy_reload_errors.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "latchkey_audit_write_errors_total",
            "Audit records that could not be written.",
            self.audit_write_errors.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "latchkey_audit_queue_waits_total",
            "Requests that waited for the audit writer because its queue was full.",
            self.audit_queue_waits.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP latchkey_audit_healthy 1 while the audit log can be written; 0 while traffic is refused because it cannot.\n# TYPE latchkey_audit_healthy gauge\nlatchkey_audit_healthy {}",
            u8::from(g.audit_healthy)
        );
        counter(
            &mut out,
            "latchkey_secret_fetches_total",
            "Secret values fetched or refreshed from exec helpers.",
            self.secret_fetches.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP latchkey_connections_active Sandbox connections open now.\n# TYPE latchkey_connections_active gauge\nlatchkey_connections_active {}",
            g.connections_active
        );
        let _ = writeln!(
            out,
            "# HELP latchkey_uptime_seconds Seconds since latchkey started.\n# TYPE latchkey_uptime_seconds gauge\nlatchkey_uptime_seconds {:.3}",
            g.uptime_seconds
        );
        let _ = writeln!(
            out,
            "# HELP latchkey_policy_rules Rules in the policy in force.\n# TYPE latchkey_policy_rules gauge\nlatchkey_policy_rules {}",
            g.policy_rules
        );
        let _ = writeln!(
            out,
            "# HELP latchkey_policy_info The policy in force, by digest.\n# TYPE latchkey_policy_info gauge\nlatchkey_policy_info{{digest=\"{}\"}} 1",
            escape(&g.policy_info)
        );
        out
    }
}

/// Escapes a label value (backslash, quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
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
}

//! Audit: one JSON line per request or refused connection, allowed or denied.
//!
//! An [`Entry`] is opened when a request arrives and handed over exactly once: explicitly with
//! [`Entry::finish`], or by its `Drop` when a body ends, a connection dies or a task is
//! cancelled (pingora's "final hook that always runs"). The request path only moves the record
//! into a bounded queue; one writer thread lets a batch gather for a couple of milliseconds,
//! serialises it and appends it with a single `write` on an `O_APPEND` file, so lines never
//! interleave, a crash leaves no torn line, and a busy proxy pays one wake-up per batch rather
//! than per request. A full queue makes requests wait (back-pressure) rather than drop a record,
//! and they wait asynchronously: a request awaits [`AuditLog::room`] before it starts its
//! record, so a slow disk parks requests without holding a tokio worker thread. Writing a record
//! (from a `Drop`, so synchronous) never waits while the queue is within twice its size — the
//! headroom covers the records of requests admitted before it filled — and only a caller that
//! skipped [`AuditLog::room`] can push it past that; such a caller then blocks as the last resort
//! (off the async workers where tokio allows it).
//!
//! Fail closed: when a write fails (disk full, sink gone) the log turns unhealthy and the proxy
//! refuses traffic with `audit_unavailable` until a later write succeeds. Records carry secret
//! *names* only, never values.
//!
//! Files, by concern: [`record`] (the schema: field names are a contract), [`entry`] (a record
//! in progress, written exactly once; scrubbed through [`Scrub`], so audit never sees a secret
//! store or a secret value), [`writer`] (the bounded queue, the writer thread, fail-closed
//! health) and [`sink`] (where lines go: a file opened `O_APPEND` and 0600, or stdout).
//!
//! Depends on `metrics` and `reason` only; never on `secrets` (values reach it only as the
//! scrubbed text a [`Scrub`] returns).

// The crates this one uses, under the module names the code knows them by.
use latchkey_metrics as metrics;
use latchkey_wire as wire;
use latchkey_wire::files;
use latchkey_wire::reason;

pub mod chain;
mod entry;
pub mod key;
pub mod live;
mod ocsf;
pub mod read;
mod record;
pub mod segments;
mod sink;
pub mod verify;
mod writer;

pub use entry::{Counters, Entry, Scrub, Stage};
pub use record::{
    new_id, ApprovalInfo, DnsInfo, LimitCharge, McpCall, McpInfo, Phase, Record, UsageInfo,
    WebSocketInfo,
};
pub use writer::{
    AuditError, AuditLog, Format, Options, Tap, CHECKPOINT_EVERY, CHECKPOINT_INTERVAL,
};

/// Replaces every query value with `REDACTED`, keeping parameter names for reviewers.
///
/// Names stay exactly as sent rather than decoded by `form_urlencoded` and written back: a
/// reviewer (and the record's own secret scrubbing) sees the bytes the sandbox sent. One pass,
/// one allocation: it runs on every request.
pub fn redact_query(path_and_query: &str) -> String {
    const MASK: &str = "=REDACTED";
    let Some((path, query)) = path_and_query.split_once('?') else {
        return path_and_query.to_string();
    };
    let mut out = String::with_capacity(path_and_query.len() + 8 * (query.len() / 4 + 1));
    out.push_str(path);
    out.push('?');
    for (i, pair) in query.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match pair.split_once('=') {
            Some((k, _)) => {
                out.push_str(k);
                out.push_str(MASK);
            }
            None => out.push_str(pair),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_redacted_and_names_kept() {
        assert_eq!(
            redact_query("/a?key=sk-123&x=1&flag"),
            "/a?key=REDACTED&x=REDACTED&flag"
        );
        assert_eq!(redact_query("/a"), "/a");
        assert_eq!(redact_query("/a?"), "/a?");
        assert_eq!(redact_query("/a?&k%41=v=w&&b"), "/a?&k%41=REDACTED&&b");
    }
}

//! Audit: one JSON line per request or refused connection, allowed or denied.
//!
//! An [`Entry`] is opened when a request arrives and written exactly once: explicitly with
//! [`Entry::finish`], or by its `Drop` when a body ends, a connection dies or a task is
//! cancelled (pingora's "final hook that always runs"). Each line goes to the sink in a single
//! `write` on an `O_APPEND` file, so concurrent writers never interleave and a crash leaves no
//! torn line. Records carry secret *names* only, never values.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use serde::Serialize;

use crate::metrics::Metrics;
use crate::reason::Reason;
use crate::secrets::SecretStore;

/// Failure to open the audit sink.
#[derive(Debug, thiserror::Error)]
#[error("cannot open audit log {path}: {source}")]
pub struct AuditError {
    path: PathBuf,
    source: std::io::Error,
}

/// One audit record (DESIGN.md §5). Field names are a contract.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Record {
    pub ts: String,
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
    pub status: Option<u16>,
    pub upstream: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
    pub policy: String,
    /// Secret values replaced in the response (headers and body).
    pub redactions: u64,
    /// Report-only mode let through a request that enforcement would deny (`reason` says why).
    pub would_deny: bool,
}

enum Sink {
    File(File),
    Stdout,
}

/// The audit sink shared by every connection.
pub struct AuditLog {
    sink: Mutex<Sink>,
    written: AtomicU64,
    failed: AtomicU64,
    metrics: Arc<Metrics>,
}

impl AuditLog {
    /// Opens `path` for appending (created with mode 0600), or stdout for `-`.
    pub fn open(path: &Path) -> Result<Self, AuditError> {
        let sink = if path == Path::new("-") {
            Sink::Stdout
        } else {
            let mut opts = OpenOptions::new();
            opts.create(true).append(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            Sink::File(opts.open(path).map_err(|source| AuditError {
                path: path.to_path_buf(),
                source,
            })?)
        };
        Ok(Self {
            sink: Mutex::new(sink),
            written: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            metrics: Arc::new(Metrics::default()),
        })
    }

    /// The metrics every record is counted in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Writes one record as one line.
    pub fn write(&self, record: &Record) {
        self.metrics.request(
            record.decision,
            record.reason,
            record.rule.as_deref().unwrap_or(""),
            &record.identity,
            record.would_deny,
        );
        self.metrics
            .redactions
            .fetch_add(record.redactions, Ordering::Relaxed);
        let mut line = match serde_json::to_vec(record) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "cannot serialise audit record");
                self.failed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        line.push(b'\n');
        let result = match self.sink.lock() {
            Ok(mut sink) => match &mut *sink {
                Sink::File(f) => f.write_all(&line),
                Sink::Stdout => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&line).and_then(|()| out.flush())
                }
            },
            Err(_) => Err(std::io::Error::other("audit sink lock poisoned")),
        };
        match result {
            Ok(()) => {
                self.written.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                self.metrics
                    .audit_write_errors
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, audit.id = %record.id, "cannot write audit record");
            }
        }
    }

    /// Records written so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Records that could not be written.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
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
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Replaces every query value with `REDACTED`, keeping parameter names for reviewers.
pub fn redact_query(path_and_query: &str) -> String {
    let Some((path, query)) = path_and_query.split_once('?') else {
        return path_and_query.to_string();
    };
    let redacted: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) => format!("{k}=REDACTED"),
            None if pair.is_empty() => String::new(),
            None => pair.to_string(),
        })
        .collect();
    format!("{path}?{}", redacted.join("&"))
}

fn scrub_str(store: Option<&SecretStore>, text: &str) -> String {
    match store.and_then(SecretStore::scrubber) {
        Some(s) => {
            let (out, names) = s.scrub(text.as_bytes());
            if names.is_empty() {
                text.to_string()
            } else {
                String::from_utf8_lossy(&out).into_owned()
            }
        }
        None => text.to_string(),
    }
}

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
    /// Secrets whose values must never reach the record or the log, even when the sandbox put
    /// one in a URL.
    secrets: Option<Arc<SecretStore>>,
}

impl Entry {
    /// Starts a record for a request from `client`; fields are filled in as the request moves.
    pub fn start(log: Arc<AuditLog>, client: SocketAddr, identity: &str, policy: &str) -> Self {
        Self {
            log,
            record: Some(Record {
                ts: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
                id: new_id(),
                identity: identity.to_string(),
                client: client.to_string(),
                method: None,
                scheme: None,
                host: None,
                port: None,
                path: None,
                decision: "deny",
                rule: None,
                reason: Reason::BadRequest.code(),
                secrets: Vec::new(),
                status: None,
                upstream: None,
                bytes_up: 0,
                bytes_down: 0,
                duration_ms: 0,
                policy: policy.to_string(),
                redactions: 0,
                would_deny: false,
            }),
            started: Instant::now(),
            counters: Arc::new(Counters::default()),
            secrets: None,
        }
    }

    /// Scrubs secret values out of the record's free-text fields when it is written.
    pub fn scrub_with(&mut self, secrets: Arc<SecretStore>) {
        self.secrets = Some(secrets);
    }

    /// `text` with every secret value in force replaced by `[REDACTED:name]`: for messages
    /// that quote what the sandbox sent (a denial naming the URL).
    pub fn scrub_text(&self, text: &str) -> String {
        scrub_str(self.secrets.as_deref(), text)
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

    pub fn id(&self) -> &str {
        self.record.as_ref().map_or("", |r| r.id.as_str())
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

    fn write(&mut self) {
        if let Some(mut r) = self.record.take() {
            if let Some(store) = self.secrets.as_deref() {
                for field in [&mut r.path, &mut r.host, &mut r.method] {
                    if let Some(v) = field.as_mut() {
                        *v = scrub_str(Some(store), v);
                    }
                }
            }
            r.duration_ms = self.started.elapsed().as_millis() as u64;
            r.bytes_up = self.counters.up.load(Ordering::Relaxed);
            r.bytes_down = self.counters.down.load(Ordering::Relaxed);
            r.redactions = self.counters.redactions.load(Ordering::Relaxed);
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
            self.log.write(&r);
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

    #[test]
    fn query_values_are_redacted_and_names_kept() {
        assert_eq!(
            redact_query("/a?key=sk-123&x=1&flag"),
            "/a?key=REDACTED&x=REDACTED&flag"
        );
        assert_eq!(redact_query("/a"), "/a");
    }

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
}

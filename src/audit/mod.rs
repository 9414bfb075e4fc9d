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

use std::fs::OpenOptions;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use serde::{Serialize, Serializer};

use crate::metrics::Metrics;
use crate::reason::Reason;
use crate::secrets::SecretStore;

/// Records the queue holds before a new request has to wait for the writer.
const QUEUE: usize = 16 * 1024;
/// How long the writer lets a batch gather after its first record: a bound on how late a
/// record reaches the file, and what keeps the writer from waking once per request.
const LINGER: Duration = Duration::from_millis(2);
/// The writer appends at most this many records in one `write`.
const BATCH_RECORDS: usize = 1024;

/// Failure to open the audit sink.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("cannot open audit log {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start the audit writer thread: {0}")]
    Thread(std::io::Error),
}

/// One audit record (README "Audit record"; docs/architecture.md). Field names are a contract.
///
/// Until [`Entry`] scrubs it on the way out, `method`, `host` and `path` are as the sandbox sent
/// them and may hold a secret value it pasted there: `Debug` shows their lengths only.
#[derive(Clone, Serialize, PartialEq)]
pub struct Record {
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
            .finish_non_exhaustive()
    }
}

fn rfc3339_millis<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(*t))
}

/// Records handed over by requests and not yet taken by the writer.
#[derive(Default)]
struct Queue {
    records: Vec<Record>,
    /// Flush requests, answered once everything queued before them is written.
    flushes: Vec<mpsc::Sender<()>>,
    /// Set when the log is dropped: the writer writes what is left and stops.
    closing: bool,
    /// Set by the writer thread as it ends (also by a panic): nothing can be written any more.
    writer_gone: bool,
}

/// State shared by the request side and the writer thread.
struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the writer: a record into an empty queue, a full queue, a flush, closing.
    work: Condvar,
    /// Wakes synchronous writers waiting for room past the headroom (the last resort).
    room: Condvar,
    /// Wakes requests awaiting [`AuditLog::room`].
    room_async: tokio::sync::Notify,
    /// Records the queue holds before [`AuditLog::room`] waits ([`QUEUE`]; smaller in tests).
    capacity: usize,
    written: AtomicU64,
    failed: AtomicU64,
    /// Whether the last write succeeded. Traffic is refused while it is false.
    healthy: AtomicBool,
    metrics: Arc<Metrics>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue holds plain data: a panic elsewhere while it was locked leaves it usable.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Standard output, locked and flushed per batch.
struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stdout().lock().write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        out.write_all(buf)?;
        out.flush()
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().lock().flush()
    }
}

/// The audit sink shared by every connection.
pub struct AuditLog {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl AuditLog {
    /// Opens `path` for appending (created with mode 0600), or stdout for `-`.
    pub fn open(path: &Path) -> Result<Self, AuditError> {
        let sink: Box<dyn Write + Send> = if path == Path::new("-") {
            Box::new(Stdout)
        } else {
            let mut opts = OpenOptions::new();
            opts.create(true).append(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            Box::new(opts.open(path).map_err(|source| AuditError::Open {
                path: path.to_path_buf(),
                source,
            })?)
        };
        Self::with_sink(sink)
    }

    /// A log over any writer (each batch goes to it in one `write_all`).
    pub fn with_sink(sink: Box<dyn Write + Send>) -> Result<Self, AuditError> {
        Self::with_sink_and_capacity(sink, QUEUE)
    }

    fn with_sink_and_capacity(
        sink: Box<dyn Write + Send>,
        capacity: usize,
    ) -> Result<Self, AuditError> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            room: Condvar::new(),
            room_async: tokio::sync::Notify::new(),
            capacity: capacity.max(1),
            written: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
            metrics: Arc::new(Metrics::default()),
        });
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("latchkey-audit".into())
                .spawn(move || run_writer(&shared, sink))
                .map_err(AuditError::Thread)?
        };
        Ok(Self {
            shared,
            writer: Mutex::new(Some(writer)),
        })
    }

    /// The metrics every record is counted in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// Queues one record; it is written as one line.
    pub fn write(&self, record: Record) {
        let shared = &self.shared;
        shared.metrics.request(
            record.decision,
            record.reason,
            record.rule.as_deref().unwrap_or(""),
            &record.identity,
            record.would_deny,
        );
        shared
            .metrics
            .redactions
            .fetch_add(record.redactions, Ordering::Relaxed);
        let mut q = shared.lock();
        let headroom = 2 * shared.capacity;
        if q.records.len() >= headroom && !q.writer_gone {
            // Only a caller that skipped `room()` gets here: wait rather than lose the record,
            // off the async workers where tokio allows it.
            shared
                .metrics
                .audit_queue_waits
                .fetch_add(1, Ordering::Relaxed);
            shared.work.notify_one();
            fn wait<'a>(
                shared: &'a Shared,
                mut q: MutexGuard<'a, Queue>,
                headroom: usize,
            ) -> MutexGuard<'a, Queue> {
                while q.records.len() >= headroom && !q.writer_gone {
                    q = shared.room.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
                q
            }
            let multi_thread = tokio::runtime::Handle::try_current()
                .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
            q = if multi_thread {
                tokio::task::block_in_place(|| wait(shared, q, headroom))
            } else {
                wait(shared, q, headroom)
            };
        }
        if q.writer_gone {
            drop(q);
            shared.failed.fetch_add(1, Ordering::Relaxed);
            shared.healthy.store(false, Ordering::Release);
            tracing::error!(audit.id = %record.id, "the audit writer has stopped; record lost");
            return;
        }
        q.records.push(record);
        // Only the first record of a batch wakes the writer; the rest ride along, so a busy
        // proxy does not pay a futex wake-up and a context switch per request.
        if q.records.len() == 1 {
            shared.work.notify_one();
        }
    }

    /// Waits, without holding a thread, until the queue has room for another request's record
    /// (or the writer has stopped, which the health check then refuses). Every request awaits
    /// this before it starts its record: this is the back-pressure of a slow sink.
    pub async fn room(&self) {
        let shared = &self.shared;
        let mut counted = false;
        loop {
            let notified = shared.room_async.notified();
            tokio::pin!(notified);
            // Registered before the check, so a wake-up between the two is not lost.
            notified.as_mut().enable();
            {
                let q = shared.lock();
                if q.records.len() < shared.capacity || q.writer_gone {
                    return;
                }
            }
            if !counted {
                counted = true;
                shared
                    .metrics
                    .audit_queue_waits
                    .fetch_add(1, Ordering::Relaxed);
                shared.work.notify_one();
            }
            notified.await;
        }
    }

    /// Records queued and not yet taken by the writer.
    pub fn queued(&self) -> usize {
        self.shared.lock().records.len()
    }

    /// Waits (up to `timeout`) until every record queued so far is written or has failed.
    /// Returns whether the writer answered in time.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (ack, done) = mpsc::channel();
        {
            let mut q = self.shared.lock();
            if q.writer_gone {
                return false;
            }
            q.flushes.push(ack);
        }
        self.shared.work.notify_one();
        done.recv_timeout(timeout).is_ok()
    }

    /// Whether the last write to the sink succeeded. While it is false, traffic is refused.
    pub fn is_healthy(&self) -> bool {
        self.shared.healthy.load(Ordering::Acquire)
    }

    /// Records written so far.
    pub fn written(&self) -> u64 {
        self.shared.written.load(Ordering::Relaxed)
    }

    /// Records that could not be written.
    pub fn failed(&self) -> u64 {
        self.shared.failed.load(Ordering::Relaxed)
    }
}

impl Drop for AuditLog {
    /// Closes the queue and waits for the writer to write what is left.
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.work.notify_one();
        let writer = match self.writer.get_mut() {
            Ok(w) => w.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(w) = writer {
            let _ = w.join();
        }
    }
}

/// Marks the writer gone when its thread ends, however it ends, and wakes anyone waiting.
struct WriterGone<'a>(&'a Shared);

impl Drop for WriterGone<'_> {
    fn drop(&mut self) {
        let mut q = self.0.lock();
        q.writer_gone = true;
        for ack in q.flushes.drain(..) {
            let _ = ack.send(());
        }
        drop(q);
        self.0.room.notify_all();
        self.0.room_async.notify_waiters();
    }
}

/// The writer thread: waits for a first record, lets a batch gather for [`LINGER`], then
/// serialises it and appends it in one write; repeats until the log is closed and drained.
fn run_writer(shared: &Shared, mut sink: Box<dyn Write + Send>) {
    let _gone = WriterGone(shared);
    let mut batch: Vec<Record> = Vec::new();
    let mut acks: Vec<mpsc::Sender<()>> = Vec::new();
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    loop {
        {
            let mut q = shared.lock();
            while q.records.is_empty() && q.flushes.is_empty() && !q.closing {
                q = shared.work.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
            if q.flushes.is_empty() && !q.closing && q.records.len() < shared.capacity / 2 {
                // Let the batch gather. A flush, closing or a filling queue cuts this short.
                q = shared
                    .work
                    .wait_timeout(q, LINGER)
                    .map(|(q, _)| q)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
            std::mem::swap(&mut batch, &mut q.records);
            acks.append(&mut q.flushes);
            if batch.is_empty() && q.closing {
                return;
            }
        }
        shared.room.notify_all();
        shared.room_async.notify_waiters();
        write_batch(shared, sink.as_mut(), &mut batch, &mut buf);
        for ack in acks.drain(..) {
            let _ = ack.send(());
        }
    }
}

/// Serialises `batch` (emptying it) and appends it to the sink in one write.
fn write_batch(shared: &Shared, sink: &mut dyn Write, batch: &mut Vec<Record>, buf: &mut Vec<u8>) {
    for chunk in batch.chunks(BATCH_RECORDS) {
        buf.clear();
        let mut lines = 0u64;
        for record in chunk {
            let mark = buf.len();
            match serde_json::to_writer(&mut *buf, record) {
                Ok(()) => {
                    buf.push(b'\n');
                    lines += 1;
                }
                Err(e) => {
                    buf.truncate(mark);
                    shared.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(error = %e, audit.id = %record.id, "cannot serialise audit record");
                }
            }
        }
        if lines == 0 {
            continue;
        }
        match sink.write_all(buf).and_then(|()| sink.flush()) {
            Ok(()) => {
                shared.written.fetch_add(lines, Ordering::Relaxed);
                if !shared.healthy.swap(true, Ordering::AcqRel) {
                    tracing::warn!("the audit log is writable again; traffic resumes");
                }
            }
            Err(e) => {
                shared.failed.fetch_add(lines, Ordering::Relaxed);
                shared
                    .metrics
                    .audit_write_errors
                    .fetch_add(lines, Ordering::Relaxed);
                if shared.healthy.swap(false, Ordering::AcqRel) {
                    tracing::error!(error = %e, records = lines, "cannot write the audit log; refusing traffic until it can be written");
                } else {
                    tracing::error!(error = %e, records = lines, "cannot write the audit log");
                }
            }
        }
    }
    batch.clear();
    if buf.capacity() > 1 << 20 {
        buf.shrink_to(64 * 1024);
    }
}

/// A random 16-hex-digit request id.
pub fn new_id() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut b = [0u8; 8];
    if aws_lc_rs::rand::fill(&mut b).is_err() {
        // The id is a correlation handle, not a secret: fall back to the clock.
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        b = (nanos as u64).to_be_bytes();
    }
    let mut id = String::with_capacity(16);
    for x in b {
        id.push(char::from(HEX[usize::from(x >> 4)]));
        id.push(char::from(HEX[usize::from(x & 0xf)]));
    }
    id
}

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

fn scrub_str(store: Option<&SecretStore>, text: &str) -> String {
    let Some(store) = store else {
        return text.to_string();
    };
    match store.scrubber() {
        Ok(Some(s)) => {
            let (out, names) = s.scrub(text.as_bytes());
            if names.is_empty() {
                text.to_string()
            } else {
                String::from_utf8_lossy(&out).into_owned()
            }
        }
        Ok(None) => text.to_string(),
        // Cannot tell whether it holds a secret: keep none of it.
        Err(_) => "[REDACTED:unscannable]".to_string(),
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
                ts: SystemTime::now(),
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

    /// A sink that fails while `broken` is set, and keeps what it was given otherwise.
    #[derive(Clone, Default)]
    struct Flaky {
        broken: Arc<AtomicBool>,
        got: Arc<Mutex<Vec<u8>>>,
        writes: Arc<AtomicU64>,
    }

    impl Write for Flaky {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.broken.load(Ordering::SeqCst) {
                return Err(std::io::Error::other("No space left on device"));
            }
            self.writes.fetch_add(1, Ordering::SeqCst);
            self.got.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn record(log: &Arc<AuditLog>, n: u16) {
        let client: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let mut e = Entry::start(log.clone(), client, "default", "sha256:x");
        e.outcome(Reason::Allowed, Some("r"), Some(n));
        e.finish();
    }

    #[test]
    fn a_failing_sink_turns_the_log_unhealthy_and_a_later_success_heals_it() {
        let sink = Flaky::default();
        let log = Arc::new(AuditLog::with_sink(Box::new(sink.clone())).expect("log"));
        assert!(log.is_healthy());
        record(&log, 200);
        assert!(log.flush(Duration::from_secs(5)));
        assert!(log.is_healthy());
        assert_eq!(log.written(), 1);

        sink.broken.store(true, Ordering::SeqCst);
        record(&log, 201);
        assert!(log.flush(Duration::from_secs(5)));
        assert!(
            !log.is_healthy(),
            "a failed write must turn the log unhealthy"
        );
        assert_eq!(log.failed(), 1);
        assert_eq!(log.metrics().audit_write_errors.load(Ordering::Relaxed), 1);

        sink.broken.store(false, Ordering::SeqCst);
        record(&log, 202);
        assert!(log.flush(Duration::from_secs(5)));
        assert!(log.is_healthy(), "a successful write heals the log");
        let text = String::from_utf8(sink.got.lock().expect("lock").clone()).expect("utf8");
        let statuses: Vec<u64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).expect("json")["status"]
                    .as_u64()
                    .expect("status")
            })
            .collect();
        assert_eq!(statuses, vec![200, 202]);
    }

    #[test]
    fn records_from_many_threads_are_whole_lines_batched_and_none_is_lost() {
        let sink = Flaky::default();
        let log = Arc::new(AuditLog::with_sink(Box::new(sink.clone())).expect("log"));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    for i in 0..2_000u16 {
                        record(&log, t * 2_000 + i);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("join");
        }
        // Dropping the last handle drains the queue.
        let log = Arc::try_unwrap(log).ok().expect("sole owner");
        drop(log);
        let text = String::from_utf8(sink.got.lock().expect("lock").clone()).expect("utf8");
        let mut seen = std::collections::HashSet::new();
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("whole JSON line");
            assert!(seen.insert(v["status"].as_u64().expect("status")));
            assert!(v["ts"].as_str().expect("ts").ends_with('Z'));
        }
        assert_eq!(seen.len(), 16_000);
        assert!(
            sink.writes.load(Ordering::SeqCst) < 16_000,
            "records are appended in batches"
        );
    }

    /// A sink that blocks every write until opened (a disk that has stalled).
    #[derive(Clone, Default)]
    struct Stalled {
        open: Arc<(Mutex<bool>, Condvar)>,
        entered: Arc<AtomicU64>,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Stalled {
        fn open(&self) {
            *self.open.0.lock().expect("lock") = true;
            self.open.1.notify_all();
        }

        fn wait_entered(&self) {
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.entered.load(Ordering::SeqCst) == 0 {
                assert!(
                    Instant::now() < deadline,
                    "the writer never reached the sink"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }

        fn statuses(&self) -> Vec<u64> {
            let text = String::from_utf8(self.got.lock().expect("lock").clone()).expect("utf8");
            let mut v: Vec<u64> = text
                .lines()
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l).expect("json")["status"]
                        .as_u64()
                        .expect("status")
                })
                .collect();
            v.sort_unstable();
            v
        }
    }

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.entered.fetch_add(1, Ordering::SeqCst);
            let (open, cv) = &*self.open;
            let mut g = open.lock().expect("lock");
            while !*g {
                g = cv.wait(g).expect("wait");
            }
            self.got.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_request_waiting_for_room_leaves_a_current_thread_runtime_free_and_loses_nothing() {
        const CAP: usize = 8;
        let sink = Stalled::default();
        let log =
            Arc::new(AuditLog::with_sink_and_capacity(Box::new(sink.clone()), CAP).expect("log"));
        // The writer takes the first record and stalls in the sink; the queue then fills.
        record(&log, 0);
        sink.wait_entered();
        for i in 1..=CAP as u16 {
            record(&log, i);
        }
        assert_eq!(log.queued(), CAP);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let waiter = tokio::spawn({
                let log = log.clone();
                async move {
                    log.room().await;
                    record(&log, 100);
                }
            });
            // Another task on the same (only) thread keeps running while the first waits.
            let ticks = Arc::new(AtomicU64::new(0));
            let ticker = tokio::spawn({
                let ticks = ticks.clone();
                async move {
                    for _ in 0..20 {
                        ticks.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
            });
            tokio::time::timeout(Duration::from_secs(5), ticker)
                .await
                .expect("the other task was starved")
                .expect("ticker");
            assert_eq!(ticks.load(Ordering::SeqCst), 20);
            assert!(
                !waiter.is_finished(),
                "room() returned while the queue was full"
            );
            assert_eq!(log.metrics().audit_queue_waits.load(Ordering::Relaxed), 1);
            // A record written from a Drop while the queue is full (a request admitted before
            // it filled) goes into the headroom without blocking this thread.
            record(&log, 9);
            assert_eq!(log.queued(), CAP + 1);
            sink.open();
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("the waiting request never got room")
                .expect("waiter");
        });
        assert!(log.flush(Duration::from_secs(5)));
        let mut want: Vec<u64> = (0..=9).collect();
        want.push(100);
        assert_eq!(sink.statuses(), want, "every record written, none lost");
    }

    #[test]
    fn a_writer_past_the_headroom_waits_for_the_sink_and_loses_nothing() {
        const CAP: usize = 4;
        let sink = Stalled::default();
        let log =
            Arc::new(AuditLog::with_sink_and_capacity(Box::new(sink.clone()), CAP).expect("log"));
        record(&log, 0);
        sink.wait_entered();
        let writer = std::thread::spawn({
            let log = log.clone();
            move || {
                for i in 1..=(3 * CAP) as u16 {
                    record(&log, i);
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        while log.queued() < 2 * CAP {
            assert!(
                Instant::now() < deadline,
                "queue never reached the headroom"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(log.queued(), 2 * CAP, "a record went past the headroom");
        assert!(!writer.is_finished());
        sink.open();
        writer.join().expect("join");
        assert!(log.flush(Duration::from_secs(5)));
        assert_eq!(sink.statuses(), (0..=(3 * CAP) as u64).collect::<Vec<_>>());
    }

    #[test]
    fn a_record_s_debug_never_shows_what_the_sandbox_sent_in_the_url() {
        let log = Arc::new(AuditLog::with_sink(Box::new(Flaky::default())).expect("log"));
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
    fn ids_are_16_hex_digits_and_differ() {
        let a = new_id();
        assert_eq!(a.len(), 16);
        assert!(a
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(a, new_id());
    }
}

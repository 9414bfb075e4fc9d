//! The audit log: a bounded queue the request path pushes records into, and one writer thread
//! that batches them to the sink (see the module docs of [`super`] for the back-pressure and
//! fail-closed rules). Counts every record in `metrics` as it is queued. Depends on `metrics`
//! and the record schema only.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Record;
use crate::metrics::Metrics;

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

/// The audit sink shared by every connection.
pub struct AuditLog {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl AuditLog {
    /// Opens `path` for appending (created with mode 0600), or stdout for `-`.
    pub fn open(path: &Path) -> Result<Self, AuditError> {
        Self::with_sink(super::sink::open(path)?)
    }

    /// A log over any writer (each batch goes to it in one `write_all`).
    pub fn with_sink(sink: Box<dyn Write + Send>) -> Result<Self, AuditError> {
        Self::with_sink_and_capacity(sink, QUEUE)
    }

    pub(super) fn with_sink_and_capacity(
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
        if record.redactions > 0 {
            shared
                .metrics
                .redactions
                .fetch_add(record.redactions, Ordering::Relaxed);
        }
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

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;

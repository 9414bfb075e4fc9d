//! The audit log: a bounded queue the request path pushes records into, and one writer thread
//! that batches them to the sink (see the module docs of [`super`] for the back-pressure and
//! fail-closed rules). Counts every request's outcome in `metrics` as it is queued.
//!
//! Group commit: a decision record ([`AuditLog::commit`]) is answered only once the batch that
//! holds it is written (and, with `sync`, `fdatasync`ed); the writer does not linger while one
//! waits, so requests that arrive together share one write and one sync. Each line is framed
//! by the hash chain ([`super::chain`]), checkpoints are signed every N lines or T seconds,
//! and the active file is rotated and old segments removed ([`super::segments`]). Depends on
//! `metrics` and the rest of `audit`.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use super::chain::Chain;
use super::key::SigningKey;
use super::segments::{self, Rotation};
use super::{Phase, Record};
use crate::metrics::Metrics;
mod task;
use task::*;

/// Records the queue holds before a new request has to wait for the writer.
const QUEUE: usize = 16 * 1024;
/// How long the writer lets a batch gather after its first record: a bound on how late a
/// record reaches the file, and what keeps the writer from waking once per request.
const LINGER: Duration = Duration::from_millis(2);
/// Turns of the runtime an inline flush waits before it writes: each lets the requests
/// ready then (and the I/O the driver has for them) add their records to the one write.
const INLINE_TURNS: usize = 2;
/// Groups one inline flush writes, at most, while other flushes keep asking it to look again
/// (then it hands the rest to a new flush: one runtime thread is not held writing forever).
const INLINE_ROUNDS: u32 = 4;
/// The writer appends at most this many records in one `write`.
const BATCH_RECORDS: usize = 1024;

/// Checkpoint every this many lines by default (`--audit-checkpoint-every`).
pub const CHECKPOINT_EVERY: u64 = 1000;
/// ... or this often, while lines wait for one (`--audit-checkpoint-interval`).
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(10);

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

/// What lines look like (`--audit-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Format {
    /// latchkey's own record (book "Audit record").
    #[default]
    Jsonl,
    /// OCSF 1.x events: HTTP Activity (4002), Network Activity (4001) for refused connections.
    Ocsf,
}

/// Sees every batch as it is written: an exporter (OTLP spans) or the shipper (closed
/// segments). Runs on the writer thread, so it must hand work off, not do it.
pub trait Tap: Send {
    /// `records` were just written (decision and outcome records alike; look at `phase`).
    fn written(&mut self, _records: &[Record]) {}
    /// Rotation closed the active file as `segment`.
    fn segment_closed(&mut self, _segment: &Path) {}
}

/// How the log is written: durability, the chain's checkpoints, rotation, retention, format.
pub struct Options {
    /// `fdatasync` after every group (`--audit-sync`).
    pub sync: bool,
    pub rotation: Rotation,
    /// Remove closed segments older than this (`--audit-keep`).
    pub keep: Option<Duration>,
    /// Shipping is on: retention keeps a segment until it is shipped.
    pub keep_unshipped: bool,
    pub format: Format,
    /// Signs checkpoints; without it the chain is still written but nothing is signed.
    pub key: Option<Arc<SigningKey>>,
    pub checkpoint_every: u64,
    pub checkpoint_interval: Duration,
    pub taps: Vec<Box<dyn Tap>>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            sync: false,
            rotation: Rotation::default(),
            keep: None,
            keep_unshipped: false,
            format: Format::Jsonl,
            key: None,
            checkpoint_every: CHECKPOINT_EVERY,
            checkpoint_interval: CHECKPOINT_INTERVAL,
            taps: Vec::new(),
        }
    }
}

/// Records handed over by requests and not yet taken by the writer.
#[derive(Default)]
struct Queue {
    records: Vec<Record>,
    /// Decision records waiting to be on disk: answered (`true` when written) once the batch
    /// that holds them is written, and synced where asked.
    commits: Vec<tokio::sync::oneshot::Sender<bool>>,
    /// Flush requests, answered once everything queued before them is written.
    flushes: Vec<mpsc::Sender<()>>,
    /// Set when the log is dropped: the writer writes what is left and stops.
    closing: bool,
    /// Set by the writer thread as it ends (also by a panic): nothing can be written any more.
    writer_gone: bool,
    /// The writer is waiting on `work` (idle or lingering): only then does a new record need
    /// to wake it; a busy writer looks at the queue again before it waits (no lost wake-up).
    writer_waiting: bool,
    /// An inline flush is scheduled on the runtime ([`Shared::flush_inline`]): records queued
    /// now are written by it, nothing needs waking.
    inline_pending: bool,
    /// An inline flush started the checkpoint clock or filled the file: the writer thread has
    /// a deadline or a rotation to see to.
    housekeep: bool,
    /// An inline flush found the sink held: its holder looks at the queue again before it
    /// lets go ([`Shared::flush_inline`]).
    flush_again: bool,
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
    /// The active file, when the log is a file (not stdout or a test's writer).
    file: Option<PathBuf>,
    /// The public half of the key that signs its checkpoints, when one does.
    public: Option<super::key::PublicKey>,
    /// The sink, the chain and the batch buffers. Locked by whoever writes a batch: the
    /// writer thread, or an inline flush. Lock order: the writer, then the queue.
    writer: Mutex<Writer>,
    /// Batches may be written inline, on the runtime, right after the requests that queued
    /// them have run ([`Shared::flush_inline`]): a file sink without `--audit-sync`. A write
    /// there is one `write(2)` into the page cache, which a kill -9 does not lose; a sync, a
    /// rotation, a stream (a pipe can block) and time-driven checkpoints stay on the thread.
    inline: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue holds plain data: a panic elsewhere while it was locked leaves it usable.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn writer(&self) -> MutexGuard<'_, Writer> {
        // A panic while writing leaves the chain as the failed write left it; `resync` reads
        // it back from the file before the next write.
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the writer thread if it waits (counted), with `q` locked.
    fn wake_writer(&self, q: &mut Queue) {
        if q.writer_waiting {
            q.writer_waiting = false;
            self.work.notify_one();
            self.metrics.audit_wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether what was just queued (with `q` locked) is written by an inline flush: one
    /// already scheduled, or one to spawn on `Inline::Spawn`'s runtime once the queue is
    /// unlocked ([`Shared::spawn_flush`]: a runtime shutting down drops the task inside
    /// `spawn`, and its guard takes the queue lock).
    fn schedule_inline(&self, q: &mut Queue) -> Inline {
        if !self.inline || q.closing {
            return Inline::No;
        }
        if q.inline_pending {
            return Inline::Already;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Inline::No;
        };
        q.inline_pending = true;
        Inline::Spawn(runtime)
    }

    /// Spawns the inline flush [`Shared::schedule_inline`] asked for. Call with the queue
    /// unlocked.
    fn spawn_flush(self: &Arc<Self>, runtime: &tokio::runtime::Handle) {
        let pending = PendingFlush(Some(self.clone()));
        runtime.spawn(async move {
            // Runs after the tasks that are ready now (and the I/O they wait on): every
            // request that commits in this turn of the runtime joins the one write.
            for _ in 0..INLINE_TURNS {
                tokio::task::yield_now().await;
            }
            pending.run();
        });
    }

    /// Writes everything queued, on the calling (runtime) thread, and answers the commits
    /// among it. When another flush (or the writer thread) holds the sink, the holder is told
    /// to look at the queue again before it lets go (`flush_again`), so nothing waits on a
    /// wake-up: the flag is set and read with the queue locked, and the holder lets go of the
    /// sink inside that section.
    fn flush_inline(self: &Arc<Self>) {
        let mut w = match self.writer.try_lock() {
            Ok(w) => w,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                {
                    let mut q = self.lock();
                    q.inline_pending = false;
                    q.flush_again = true;
                }
                // The holder may have let go before the flag was set: try once more.
                match self.writer.try_lock() {
                    Ok(w) => w,
                    Err(TryLockError::Poisoned(p)) => p.into_inner(),
                    Err(TryLockError::WouldBlock) => return,
                }
            }
        };
        let mut batch = std::mem::take(&mut w.spare_records);
        let mut commits = std::mem::take(&mut w.spare_commits);
        for round in 1.. {
            {
                let mut q = self.lock();
                q.inline_pending = false;
                q.flush_again = false;
                if q.writer_gone || q.closing {
                    // The thread drains a closing log; a log without one writes nothing more.
                    if q.writer_gone {
                        for commit in q.commits.drain(..) {
                            let _ = commit.send(false);
                        }
                    }
                    self.wake_writer(&mut q);
                    return;
                }
                std::mem::swap(&mut batch, &mut q.records);
                std::mem::swap(&mut commits, &mut q.commits);
            }
            if batch.len() >= self.capacity {
                self.room.notify_all();
            }
            self.room_async.notify_waiters();
            let had_deadline = w.next_deadline().is_some();
            let ok = w.write_batch(self, &mut batch);
            for commit in commits.drain(..) {
                let _ = commit.send(ok);
            }
            let housekeep = w.rotation_due() || (!had_deadline && w.next_deadline().is_some());
            let mut q = self.lock();
            if housekeep {
                q.housekeep = true;
                self.wake_writer(&mut q);
            }
            if q.flush_again && round < INLINE_ROUNDS {
                continue;
            }
            w.spare_records = std::mem::take(&mut batch);
            w.spare_commits = std::mem::take(&mut commits);
            // Let go of the sink with the queue locked: a flush that found it busy set
            // `flush_again` before this (and is seen here) or tries the lock after it.
            drop(w);
            if q.flush_again && !q.records.is_empty() {
                // Rounds used up: another turn of the runtime takes the rest.
                q.flush_again = false;
                if let Inline::Spawn(runtime) = self.schedule_inline(&mut q) {
                    drop(q);
                    self.spawn_flush(&runtime);
                } else {
                    self.wake_writer(&mut q);
                }
            }
            return;
        }
    }
}

/// How a record just queued gets written ([`Shared::schedule_inline`]).
enum Inline {
    /// By the writer thread (wake it if it waits).
    No,
    /// By the inline flush already scheduled.
    Already,
    /// By a flush to spawn on this runtime once the queue is unlocked.
    Spawn(tokio::runtime::Handle),
}

/// A scheduled inline flush. If its task is dropped before it runs (its runtime shut down),
/// the records it was to write go to the writer thread instead of waiting for a flush that
/// will never come.
struct PendingFlush(Option<Arc<Shared>>);

impl PendingFlush {
    fn run(mut self) {
        if let Some(shared) = self.0.take() {
            shared.flush_inline();
        }
    }
}

impl Drop for PendingFlush {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            let mut q = shared.lock();
            q.inline_pending = false;
            shared.wake_writer(&mut q);
        }
    }
}

/// The audit sink shared by every connection.
pub struct AuditLog {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl AuditLog {
    /// Opens `path` for appending (created with mode 0600), or stdout for `-`, with the
    /// default options (no signing key: the chain is written, checkpoints are not).
    pub fn open(path: &Path) -> Result<Self, AuditError> {
        Self::open_with(path, Options::default())
    }

    /// Opens `path` (or stdout for `-`) with `options`, continuing the chain where the file
    /// (or its newest closed segment) left it.
    pub fn open_with(path: &Path, options: Options) -> Result<Self, AuditError> {
        let out = if path == Path::new("-") {
            Out::Stream(Box::new(super::sink::Stdout))
        } else {
            Out::File(ActiveFile::open(path)?)
        };
        Self::start(out, options, QUEUE)
    }

    /// A log over any writer (each batch goes to it in one `write_all`).
    pub fn with_sink(sink: Box<dyn Write + Send>) -> Result<Self, AuditError> {
        Self::with_sink_and_capacity(sink, QUEUE)
    }

    pub(super) fn with_sink_and_capacity(
        sink: Box<dyn Write + Send>,
        capacity: usize,
    ) -> Result<Self, AuditError> {
        Self::start(Out::Stream(sink), Options::default(), capacity)
    }

    /// A log over any writer with `options` (tests of the chain and checkpoints).
    pub fn with_sink_options(
        sink: Box<dyn Write + Send>,
        options: Options,
    ) -> Result<Self, AuditError> {
        Self::start(Out::Stream(sink), options, QUEUE)
    }

    fn start(mut out: Out, options: Options, capacity: usize) -> Result<Self, AuditError> {
        // A torn end that cannot be ended yet (a full disk at start): resume on the first write.
        let resumed = out.resume();
        let unsealed = resumed.is_none();
        let chain = resumed.unwrap_or_default();
        if let (Out::File(active), Some(keep)) = (&out, options.keep) {
            for gone in segments::retain(&active.path, keep, !options.keep_unshipped) {
                tracing::info!(segment = %gone.display(), "old audit segment removed (--audit-keep)");
            }
        }
        let inline = matches!(out, Out::File(_)) && !options.sync;
        let file = match &out {
            Out::File(active) => Some(active.path.clone()),
            Out::Stream(_) => None,
        };
        let public = options.key.as_ref().map(|k| *k.public());
        let shared = Arc::new(Shared {
            file,
            public,
            writer: Mutex::new({
                let mut w = Writer::new(out, chain, options);
                w.resync = unsealed;
                w
            }),
            inline,
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
                .spawn(move || Writer::run(&shared))
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

    /// Commits a decision record: the receiver answers `true` once it is written (and synced
    /// with `sync`), `false` when it could not be. Nothing may reach the upstream before then.
    pub fn commit(&self, mut record: Record) -> tokio::sync::oneshot::Receiver<bool> {
        record.phase = Phase::Decision;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut q = self.shared.lock();
        if q.writer_gone {
            drop(q);
            let _ = tx.send(false);
            return rx;
        }
        // A committing request already waited for room; the headroom covers it.
        q.records.push(record);
        q.commits.push(tx);
        match self.shared.schedule_inline(&mut q) {
            // Wake a waiting writer, lingering included: this record is waited on.
            Inline::No => self.shared.wake_writer(&mut q),
            Inline::Already => {}
            Inline::Spawn(runtime) => {
                drop(q);
                self.shared.spawn_flush(&runtime);
            }
        }
        rx
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
        // Only the first record of a batch wakes a waiting writer; the rest ride along, so a
        // busy proxy does not pay a futex wake-up and a context switch per request.
        if q.records.len() == 1 {
            match shared.schedule_inline(&mut q) {
                Inline::No => shared.wake_writer(&mut q),
                Inline::Already => {}
                Inline::Spawn(runtime) => {
                    drop(q);
                    shared.spawn_flush(&runtime);
                }
            }
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

    /// The active file, when the log is written to one.
    pub fn file(&self) -> Option<&Path> {
        self.shared.file.as_deref()
    }

    /// The public key its checkpoints are signed with, when they are signed.
    pub fn public_key(&self) -> Option<super::key::PublicKey> {
        self.shared.public
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
        for commit in q.commits.drain(..) {
            let _ = commit.send(false);
        }
        drop(q);
        self.0.room.notify_all();
        self.0.room_async.notify_waiters();
    }
}

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;

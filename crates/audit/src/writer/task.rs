//! The writer task: batches records from the queue, chains and writes them (to a rotating file or
//! a stream), checkpoints, syncs and answers the waiters.

use super::*;

/// Where the writer's lines go.
pub(super) enum Out {
    /// The active file of a log on disk: synced, rotated, its old segments removed.
    File(ActiveFile),
    /// Standard output or a test's writer: appended to, nothing else.
    Stream(Box<dyn Write + Send>),
}

impl Out {
    /// The chain as the log left it (the active file's last line, else the newest closed
    /// segment's), ending a torn last line first so the next line starts whole. `None` when the
    /// torn line could not be ended (the disk is still full): nothing may be appended until it
    /// is, or the next line would be glued to the fragment.
    pub(super) fn resume(&mut self) -> Option<Chain> {
        let Out::File(active) = self else {
            return Some(Chain::default());
        };
        let from = |path: &Path| match Chain::resume(path) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot read the end of the audit log; its chain starts again");
                None
            }
        };
        let mut found = from(&active.path);
        if found.as_ref().is_some_and(|r| r.torn) {
            if let Err(e) = active.file.write_all(b"\n") {
                tracing::warn!(file = %active.path.display(), error = %e, "the audit log ends in a partial line that cannot be ended yet; nothing is appended until it can");
                return None;
            }
            tracing::warn!(file = %active.path.display(), "the audit log ended in a partial line (a write cut short); it is ended and the chain continues from the last whole line");
            active.size += 1;
        }
        if found.as_ref().is_none_or(|r| r.chain.is_none()) && active.size == 0 {
            if let Some(seg) = segments::segments(&active.path)
                .ok()
                .and_then(|s| s.last().cloned())
            {
                found = from(&seg);
            }
        }
        Some(found.and_then(|r| r.chain).unwrap_or_default())
    }

    pub(super) fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Out::File(a) => {
                a.file.write_all(buf)?;
                a.size += buf.len() as u64;
                Ok(())
            }
            Out::Stream(w) => w.write_all(buf).and_then(|()| w.flush()),
        }
    }

    pub(super) fn sync(&mut self) -> std::io::Result<()> {
        match self {
            Out::File(a) => a.file.sync_data(),
            Out::Stream(_) => Ok(()),
        }
    }
}

/// The active file: where batches are appended until rotation closes it.
pub(super) struct ActiveFile {
    pub(super) path: PathBuf,
    pub(super) file: File,
    pub(super) size: u64,
    pub(super) opened: SystemTime,
    /// `seq` of its first line, once it has one (names the segment it becomes).
    pub(super) first_seq: Option<u64>,
}

impl ActiveFile {
    pub(super) fn open(path: &Path) -> Result<Self, AuditError> {
        let file = segments::open_append(path).map_err(|source| AuditError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let meta = file.metadata().map_err(|source| AuditError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let size = meta.len();
        let opened = if size == 0 {
            SystemTime::now()
        } else {
            meta.created()
                .or_else(|_| meta.modified())
                .unwrap_or_else(|_| SystemTime::now())
        };
        Ok(Self {
            path: path.to_path_buf(),
            file,
            size,
            opened,
            first_seq: segments::first_seq(path),
        })
    }
}

/// The writer thread's state: the sink, the chain, and when the next checkpoint is due.
pub(super) struct Writer {
    pub(super) out: Out,
    pub(super) chain: Chain,
    pub(super) options: Options,
    /// Lines written since the last checkpoint.
    pub(super) unsigned: u64,
    /// When the first of them was written.
    pub(super) unsigned_since: Option<Instant>,
    /// A write failed part-way: the chain is read back from the file before the next one.
    pub(super) resync: bool,
    pub(super) buf: Vec<u8>,
    /// An inline flush's batch and commits, kept for the next one (no allocation per flush).
    pub(super) spare_records: Vec<Record>,
    pub(super) spare_commits: Vec<tokio::sync::oneshot::Sender<bool>>,
}

impl Writer {
    pub(super) fn new(out: Out, chain: Chain, options: Options) -> Self {
        Self {
            out,
            chain,
            options,
            unsigned: 0,
            unsigned_since: None,
            resync: false,
            buf: Vec::with_capacity(64 * 1024),
            spare_records: Vec::new(),
            spare_commits: Vec::new(),
        }
    }

    /// Waits for a first record, lets a batch gather for [`LINGER`] unless a decision record
    /// is waiting, then writes it in one write (and one sync); repeats until the log is
    /// closed and drained, then writes the last checkpoint. The writer's state is locked only
    /// while a batch is taken and written: an inline flush ([`Shared::flush_inline`]) may
    /// write between two batches.
    pub(super) fn run(shared: &Shared) {
        let _gone = WriterGone(shared);
        let mut batch: Vec<Record> = Vec::new();
        let mut acks: Vec<mpsc::Sender<()>> = Vec::new();
        let mut commits: Vec<tokio::sync::oneshot::Sender<bool>> = Vec::new();
        loop {
            // Read before the queue is locked (the writer's lock comes first).
            let deadline = shared.writer().next_deadline();
            {
                let mut q = shared.lock();
                while q.records.is_empty() && q.flushes.is_empty() && !q.closing && !q.housekeep {
                    match deadline {
                        Some(due) => {
                            let wait = due.saturating_duration_since(Instant::now());
                            if wait.is_zero() {
                                break;
                            }
                            q.writer_waiting = true;
                            q = shared
                                .work
                                .wait_timeout(q, wait)
                                .map(|(q, _)| q)
                                .unwrap_or_else(|p| p.into_inner().0);
                        }
                        None => {
                            q.writer_waiting = true;
                            q = shared.work.wait(q).unwrap_or_else(PoisonError::into_inner);
                        }
                    }
                    q.writer_waiting = false;
                }
                q.housekeep = false;
                if !q.commits.is_empty() && !q.closing {
                    // Group commit: let the requests running beside this thread add their
                    // decisions to the group (one yield, no timed wait), so a busy proxy pays one
                    // write for many of them.
                    drop(q);
                    std::thread::yield_now();
                    q = shared.lock();
                }
                if q.flushes.is_empty()
                    && q.commits.is_empty()
                    && !q.closing
                    && !q.records.is_empty()
                    && q.records.len() < shared.capacity / 2
                {
                    // Let the batch gather. A commit, a flush, closing or a filling queue cuts
                    // this short.
                    q.writer_waiting = true;
                    q = shared
                        .work
                        .wait_timeout(q, LINGER)
                        .map(|(q, _)| q)
                        .unwrap_or_else(|p| p.into_inner().0);
                    q.writer_waiting = false;
                }
            }
            let mut w = shared.writer();
            let closing = {
                let mut q = shared.lock();
                // What a busy-sink flush asked to have looked at is taken here.
                q.flush_again = false;
                std::mem::swap(&mut batch, &mut q.records);
                acks.append(&mut q.flushes);
                commits.append(&mut q.commits);
                q.closing
            };
            shared.room.notify_all();
            shared.room_async.notify_waiters();
            let ok = w.write_batch(shared, &mut batch);
            for commit in commits.drain(..) {
                let _ = commit.send(ok);
            }
            w.housekeeping(shared, false);
            drop(w);
            for ack in acks.drain(..) {
                let _ = ack.send(());
            }
            if closing && shared.lock().records.is_empty() {
                shared.writer().housekeeping(shared, true);
                return;
            }
        }
    }

    /// When the writer must wake with nothing queued: a checkpoint or an age rotation due.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let checkpoint = self
            .unsigned_since
            .filter(|_| self.options.key.is_some())
            .map(|t| t + self.options.checkpoint_interval);
        let rotate = match (&self.out, self.options.rotation.age) {
            (Out::File(a), Some(age)) if a.size > 0 => {
                let elapsed = a.opened.elapsed().unwrap_or_default();
                Some(Instant::now() + age.saturating_sub(elapsed))
            }
            _ => None,
        };
        match (checkpoint, rotate) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Serialises `batch` (emptying it) and appends it, chained, in one write per
    /// [`BATCH_RECORDS`]; syncs once at the end when asked. Returns whether all of it is on
    /// disk (as far as `sync` promises).
    pub(super) fn write_batch(&mut self, shared: &Shared, batch: &mut Vec<Record>) -> bool {
        if !self.resynced(shared, batch.len() as u64) {
            batch.clear();
            return false;
        }
        let mut all_ok = true;
        let mut wrote = false;
        for chunk in batch.chunks(BATCH_RECORDS) {
            self.buf.clear();
            let before = self.chain.clone();
            let mut lines = 0u64;
            for record in chunk {
                let format = self.options.format;
                let serialised = self.chain.append_with(&mut self.buf, |out| match format {
                    Format::Jsonl if record.phase == Phase::Decision => {
                        record.write_decision_line(out)
                    }
                    Format::Jsonl => serde_json::to_writer(out, record),
                    Format::Ocsf => super::super::ocsf::write_event(record, out),
                });
                match serialised {
                    Ok(()) => lines += 1,
                    Err(e) => {
                        all_ok = false;
                        shared.failed.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(error = %e, audit.id = %record.id, "cannot serialise audit record");
                    }
                }
            }
            if lines == 0 {
                continue;
            }
            let first = before.seq + 1;
            let due = self.unsigned + lines >= self.options.checkpoint_every;
            if due {
                if let Some(key) = &self.options.key {
                    let covered = self.unsigned + lines;
                    self.chain
                        .checkpoint(key, covered, false, SystemTime::now(), &mut self.buf);
                }
            }
            let written = self.out.write_all(&self.buf);
            shared.metrics.audit_writes.fetch_add(1, Ordering::Relaxed);
            match written {
                Ok(()) => {
                    wrote = true;
                    let all = lines + u64::from(due && self.options.key.is_some());
                    shared.metrics.audit_lines.fetch_add(all, Ordering::Relaxed);
                    shared.written.fetch_add(lines, Ordering::Relaxed);
                    if let Out::File(a) = &mut self.out {
                        a.first_seq.get_or_insert(first);
                    }
                    if due && self.options.key.is_some() {
                        self.unsigned = 0;
                        self.unsigned_since = None;
                    } else {
                        self.unsigned += lines;
                        self.unsigned_since.get_or_insert_with(Instant::now);
                    }
                    if !shared.healthy.swap(true, Ordering::AcqRel) {
                        tracing::warn!("the audit log is writable again; traffic resumes");
                    }
                    for tap in &mut self.options.taps {
                        tap.written(chunk);
                    }
                }
                Err(e) => {
                    all_ok = false;
                    self.chain = before;
                    // Part of the write may have landed: read the chain back before the next.
                    self.resync = matches!(self.out, Out::File(_));
                    self.fail(shared, lines, &e);
                }
            }
        }
        batch.clear();
        if self.buf.capacity() > 1 << 20 {
            self.buf.shrink_to(64 * 1024);
        }
        if wrote && self.options.sync {
            if let Err(e) = self.out.sync() {
                self.fail(shared, 0, &e);
                return false;
            }
        }
        all_ok
    }

    /// After a failed write, the chain read back from the log (its torn end ended first).
    /// `false` while the torn end cannot be ended: the `lines` about to be written fail
    /// instead of being glued to the fragment.
    fn resynced(&mut self, shared: &Shared, lines: u64) -> bool {
        if !self.resync {
            return true;
        }
        match self.out.resume() {
            Some(chain) => {
                self.resync = false;
                self.chain = chain;
                true
            }
            None => {
                let e = std::io::Error::other(
                    "the audit log ends in a partial line that cannot be ended yet",
                );
                self.fail(shared, lines, &e);
                false
            }
        }
    }

    pub(super) fn fail(&self, shared: &Shared, lines: u64, e: &std::io::Error) {
        shared.failed.fetch_add(lines, Ordering::Relaxed);
        shared
            .metrics
            .audit_write_errors
            .fetch_add(lines.max(1), Ordering::Relaxed);
        if shared.healthy.swap(false, Ordering::AcqRel) {
            tracing::error!(error = %e, records = lines, "cannot write the audit log; refusing traffic until it can be written");
        } else {
            tracing::error!(error = %e, records = lines, "cannot write the audit log");
        }
    }

    /// A checkpoint that is due by time (or the last one, at `closing`), and rotation.
    pub(super) fn housekeeping(&mut self, shared: &Shared, closing: bool) {
        let interval_due = self
            .unsigned_since
            .is_some_and(|t| t.elapsed() >= self.options.checkpoint_interval);
        if self.unsigned > 0 && (interval_due || closing) {
            self.write_checkpoint(shared, closing);
        } else if closing && self.options.key.is_some() && self.chain.seq > 0 {
            // A clean stop says so even when the last lines were already signed.
            self.write_checkpoint(shared, true);
        }
        if !closing {
            self.rotate_if_due(shared);
        }
    }

    pub(super) fn write_checkpoint(&mut self, shared: &Shared, last: bool) {
        let Some(key) = self.options.key.clone() else {
            return;
        };
        if !self.resynced(shared, 0) {
            return;
        }
        let before = self.chain.clone();
        self.buf.clear();
        self.chain
            .checkpoint(&key, self.unsigned, last, SystemTime::now(), &mut self.buf);
        let written = self.out.write_all(&self.buf).and_then(|()| {
            if self.options.sync {
                self.out.sync()
            } else {
                Ok(())
            }
        });
        shared.metrics.audit_writes.fetch_add(1, Ordering::Relaxed);
        match written {
            Ok(()) => {
                shared.metrics.audit_lines.fetch_add(1, Ordering::Relaxed);
                self.unsigned = 0;
                self.unsigned_since = None;
            }
            Err(e) => {
                self.chain = before;
                self.resync = matches!(self.out, Out::File(_));
                self.fail(shared, 0, &e);
            }
        }
    }

    /// Whether the active file is big or old enough to be closed as a segment.
    pub(super) fn rotation_due(&self) -> bool {
        let Out::File(active) = &self.out else {
            return false;
        };
        let rotation = self.options.rotation;
        let big = rotation.size.is_some_and(|max| active.size >= max);
        let old = rotation
            .age
            .is_some_and(|age| active.opened.elapsed().unwrap_or_default() >= age);
        active.size > 0 && (big || old)
    }

    /// Closes the active file as a segment when it is big or old enough: a checkpoint ends
    /// it, it is synced and renamed, a new active file is opened, the taps hear of it, and
    /// old segments are removed.
    pub(super) fn rotate_if_due(&mut self, shared: &Shared) {
        if !self.rotation_due() {
            return;
        }
        if self.unsigned > 0 {
            self.write_checkpoint(shared, false);
        }
        let Out::File(active) = &mut self.out else {
            return;
        };
        let first = active.first_seq.unwrap_or(self.chain.seq);
        let segment = segments::segment_path(&active.path, first, SystemTime::now());
        let renamed = active
            .file
            .sync_all()
            .and_then(|()| std::fs::rename(&active.path, &segment));
        if let Err(e) = renamed {
            tracing::error!(file = %active.path.display(), segment = %segment.display(), error = %e, "cannot rotate the audit log; it goes on growing");
            // Try again after another period, not in a loop.
            active.opened = SystemTime::now();
            return;
        }
        match segments::open_append(&active.path) {
            Ok(file) => {
                active.file = file;
                active.size = 0;
                active.opened = SystemTime::now();
                active.first_seq = None;
            }
            Err(e) => {
                // Lines go on into the renamed file (the handle still points at it) until a
                // later rotation can open a new one.
                tracing::error!(file = %active.path.display(), error = %e, "cannot open a new audit file after rotation");
                return;
            }
        }
        tracing::info!(segment = %segment.display(), "audit log rotated");
        if let Some(dir) = active.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        for tap in &mut self.options.taps {
            tap.segment_closed(&segment);
        }
        if let Some(keep) = self.options.keep {
            for gone in segments::retain(&active.path, keep, !self.options.keep_unshipped) {
                tracing::info!(segment = %gone.display(), "old audit segment removed (--audit-keep)");
            }
        }
    }
}

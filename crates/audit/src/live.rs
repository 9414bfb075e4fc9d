//! The audit stream, live: every record as the writer commits it to the log, for whoever
//! watches (the console's traffic page). A [`Tap`] on the writer thread, so a request never
//! waits on a watcher: with nobody watching it costs one atomic load per batch; with watchers,
//! one `Arc` per record into a bounded broadcast ring, where a watcher too slow to keep up
//! loses the oldest records and is told how many ([`Watch::next`]), never slowing the writer.
//!
//! What it carries is exactly what the log holds (records are scrubbed before they are made:
//! no secret value is ever in one), after the line reached the log: a watcher never sees a
//! record the log could not keep.

use std::sync::Arc;

use tokio::sync::broadcast;

use crate::{Record, Tap};

/// How many records a watcher may fall behind before it loses the oldest.
pub const RING: usize = 4096;

/// The live stream's handle: cloned into the admin listener, its [`tap`](Live::tap) into the
/// audit writer's `Options.taps`.
#[derive(Clone)]
pub struct Live {
    tx: broadcast::Sender<Arc<Record>>,
}

impl Default for Live {
    fn default() -> Self {
        Self::new(RING)
    }
}

impl Live {
    /// A stream whose watchers may each fall `ring` records behind.
    pub fn new(ring: usize) -> Self {
        let (tx, _) = broadcast::channel(ring.max(1));
        Self { tx }
    }

    /// The tap to put in the audit log's `Options.taps`.
    pub fn tap(&self) -> Box<dyn Tap> {
        Box::new(LiveTap {
            tx: self.tx.clone(),
        })
    }

    /// Starts watching: records written from now on.
    pub fn watch(&self) -> Watch {
        Watch {
            rx: self.tx.subscribe(),
        }
    }

    /// How many watch now.
    pub fn watchers(&self) -> usize {
        self.tx.receiver_count()
    }
}

struct LiveTap {
    tx: broadcast::Sender<Arc<Record>>,
}

impl Tap for LiveTap {
    fn written(&mut self, records: &[Record]) {
        if self.tx.receiver_count() == 0 {
            return;
        }
        for r in records {
            // Err only when the last watcher left meanwhile: nobody to tell.
            let _ = self.tx.send(Arc::new(r.clone()));
        }
    }
}

/// One watcher's place in the stream.
pub struct Watch {
    rx: broadcast::Receiver<Arc<Record>>,
}

/// What a watcher gets next.
#[derive(Debug)]
pub enum Seen {
    /// The next record written.
    Record(Arc<Record>),
    /// This many records went by while the watcher was too slow; the stream goes on after them.
    Missed(u64),
    /// The log is closed (latchkey is stopping).
    Closed,
}

impl Watch {
    /// Waits for the next record (or the news that some were missed).
    pub async fn next(&mut self) -> Seen {
        match self.rx.recv().await {
            Ok(r) => Seen::Record(r),
            Err(broadcast::error::RecvError::Lagged(n)) => Seen::Missed(n),
            Err(broadcast::error::RecvError::Closed) => Seen::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use super::*;
    use crate::{AuditLog, Entry, Options};
    use latchkey_wire::reason::Reason;

    /// One outcome record with `status` (how the test tells records apart).
    fn record(log: &Arc<AuditLog>, status: u16) {
        let client: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let mut e = Entry::start(log.clone(), client, "default", "sha256:x");
        e.outcome(Reason::Allowed, Some("r"), Some(status));
        e.finish();
    }

    fn expect_record(seen: Seen, status: u16) {
        match seen {
            Seen::Record(r) => assert_eq!(r.status, Some(status)),
            other => panic!("expected the record with status {status}, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_watcher_sees_each_record_once_it_is_written_and_is_told_what_it_missed() {
        let live = Live::new(4);
        let mut options = Options::default();
        options.taps.push(live.tap());
        let log =
            Arc::new(AuditLog::with_sink_options(Box::new(Vec::new()), options).expect("log"));
        // Nobody watching: nothing is kept for later watchers.
        record(&log, 100);
        assert!(log.flush(Duration::from_secs(5)));
        let mut watch = live.watch();
        assert_eq!(live.watchers(), 1);
        for status in 200..203 {
            record(&log, status);
        }
        assert!(log.flush(Duration::from_secs(5)));
        for status in 200..203 {
            expect_record(watch.next().await, status);
        }
        // A slow watcher: 10 records into a ring of 4 lose the oldest 6, said once.
        for status in 300..310 {
            record(&log, status);
        }
        assert!(log.flush(Duration::from_secs(5)));
        match watch.next().await {
            Seen::Missed(n) => assert_eq!(n, 6),
            other => panic!("expected Missed(6), got {other:?}"),
        }
        expect_record(watch.next().await, 306);
        drop(watch);
        assert_eq!(live.watchers(), 0);
    }
}

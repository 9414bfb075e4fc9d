//! The audit stream, live: every record as the writer commits it to the log, for whoever
//! watches (the console's traffic page). A [`Tap`] on the writer thread, so a request never
//! waits on a watcher: with nobody watching it costs one atomic load per batch; with watchers,
//! one `Arc` per record into a bounded broadcast ring, where a watcher too slow to keep up
//! loses the oldest records and is told how many ([`Watch::next`]), never slowing the writer.
//!
//! It also keeps the spend by model since the process started ([`Live::spend`]): one map entry
//! per (provider, model), at most [`MAX_MODELS`], updated only for records that carry usage (a
//! model-provider call), so other records cost one branch.
//!
//! What it carries is exactly what the log holds (records are scrubbed before they are made:
//! no secret value is ever in one), after the line reached the log: a watcher never sees a
//! record the log could not keep.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::broadcast;

use crate::{Record, Tap};

/// How many records a watcher may fall behind before it loses the oldest.
pub const RING: usize = 4096;

/// Models told apart in [`Live::spend`]; past it, a new model is counted under `(other)`.
pub const MAX_MODELS: usize = 256;

/// One model's use since the process started.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ModelSpend {
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// USD under the price table, of the calls whose model had a price.
    pub cost: f64,
    /// Calls whose model had no price (not in `cost`).
    pub unpriced: u64,
}

type Spend = BTreeMap<(String, String), ModelSpend>;

/// The live stream's handle: cloned into the admin listener, its [`tap`](Live::tap) into the
/// audit writer's `Options.taps`.
#[derive(Clone)]
pub struct Live {
    tx: broadcast::Sender<Arc<Record>>,
    spend: Arc<Mutex<Spend>>,
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
        Self {
            tx,
            spend: Arc::default(),
        }
    }

    /// The tap to put in the audit log's `Options.taps`.
    pub fn tap(&self) -> Box<dyn Tap> {
        Box::new(LiveTap {
            tx: self.tx.clone(),
            spend: Arc::clone(&self.spend),
        })
    }

    /// Use per (provider, model) of every model-provider call written since the process
    /// started (this process's: each replica counts its own).
    pub fn spend(&self) -> Vec<((String, String), ModelSpend)> {
        let map = self.spend.lock().unwrap_or_else(PoisonError::into_inner);
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
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
    spend: Arc<Mutex<Spend>>,
}

impl LiveTap {
    fn count(&self, records: &[Record]) {
        let mut used = records.iter().filter_map(|r| r.usage.as_ref()).peekable();
        if used.peek().is_none() {
            return;
        }
        let mut map = self.spend.lock().unwrap_or_else(PoisonError::into_inner);
        for u in used {
            let mut key = (
                u.provider.to_string(),
                u.model.clone().unwrap_or_else(|| "(unnamed)".to_string()),
            );
            if map.len() >= MAX_MODELS && !map.contains_key(&key) {
                key.1 = "(other)".to_string();
            }
            let e = map.entry(key).or_default();
            e.calls += 1;
            e.input_tokens = e.input_tokens.saturating_add(u.input_tokens);
            e.output_tokens = e.output_tokens.saturating_add(u.output_tokens);
            match u.cost {
                Some(c) if c.is_finite() && c >= 0.0 => e.cost += c,
                _ => e.unpriced += 1,
            }
        }
    }
}

impl Tap for LiveTap {
    fn written(&mut self, records: &[Record]) {
        self.count(records);
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

    #[test]
    fn spend_is_counted_per_model_with_nobody_watching_and_bounded() {
        let live = Live::new(4);
        let mut options = Options::default();
        options.taps.push(live.tap());
        let log =
            Arc::new(AuditLog::with_sink_options(Box::new(Vec::new()), options).expect("log"));
        let client: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let call = |model: &str, cost: Option<f64>| {
            let mut e = Entry::start(log.clone(), client, "default", "sha256:x");
            e.outcome(Reason::Allowed, Some("r"), Some(200));
            e.settled(
                Vec::new(),
                Some(crate::UsageInfo {
                    provider: "openai",
                    model: Some(model.to_string()),
                    input_tokens: 10,
                    output_tokens: 2,
                    cached_input_tokens: 0,
                    cost,
                    source: "response",
                }),
            );
            e.finish();
        };
        call("gpt-4o-mini", Some(0.25));
        call("gpt-4o-mini", Some(0.5));
        call("mystery", None);
        record(&log, 200);
        for i in 0..MAX_MODELS + 5 {
            call(&format!("m{i}"), Some(1.0));
        }
        assert!(log.flush(Duration::from_secs(5)));
        let spend: BTreeMap<(String, String), ModelSpend> = live.spend().into_iter().collect();
        let mini = &spend[&("openai".to_string(), "gpt-4o-mini".to_string())];
        assert_eq!(
            (mini.calls, mini.input_tokens, mini.output_tokens),
            (2, 20, 4)
        );
        assert!((mini.cost - 0.75).abs() < 1e-9);
        let mystery = &spend[&("openai".to_string(), "mystery".to_string())];
        assert_eq!((mystery.calls, mystery.unpriced), (1, 1));
        assert!(spend.len() <= MAX_MODELS + 1, "{}", spend.len());
        let other = &spend[&("openai".to_string(), "(other)".to_string())];
        assert!(other.calls >= 5, "{other:?}");
    }
}

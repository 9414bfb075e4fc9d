//! The writer's tests: fail-closed health, batching without loss across threads, back-pressure
//! that never holds a runtime thread, and the headroom bound.

use super::*;
use crate::reason::Reason;
use crate::Entry;
use std::net::SocketAddr;
use std::time::Instant;

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
    let log = Arc::new(AuditLog::with_sink_and_capacity(Box::new(sink.clone()), CAP).expect("log"));
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
    let log = Arc::new(AuditLog::with_sink_and_capacity(Box::new(sink.clone()), CAP).expect("log"));
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

#[tokio::test]
async fn a_commit_is_answered_only_once_its_line_is_written_and_false_when_it_cannot_be() {
    let sink = Stalled::default();
    let log = Arc::new(AuditLog::with_sink(Box::new(sink.clone())).expect("log"));
    let client: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    let mut e = Entry::start(log.clone(), client, "default", "sha256:x");
    e.outcome(Reason::Allowed, Some("r"), None);
    let mut commit = Box::pin(e.commit_decision());
    // The sink is stalled: the commit must not be answered yet.
    let early = tokio::time::timeout(Duration::from_millis(200), commit.as_mut()).await;
    assert!(
        early.is_err(),
        "a commit answered before its line was written"
    );
    sink.wait_entered();
    sink.open();
    assert!(commit.await, "the commit is answered true once written");
    drop(e);
    assert!(log.flush(Duration::from_secs(5)));
    let text = String::from_utf8(sink.got.lock().expect("lock").clone()).expect("utf8");
    let phases: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("json")["phase"]
                .as_str()
                .expect("phase")
                .to_string()
        })
        .collect();
    assert_eq!(phases, ["decision", "outcome"]);
    // The decision line holds what was decided and about what; what only the outcome can
    // know (status, upstream, bytes, duration, redactions) is left to the outcome.
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let keys = |v: &serde_json::Value| -> Vec<String> {
        v.as_object().expect("object").keys().cloned().collect()
    };
    let decision = keys(&lines[0]);
    for k in [
        "seq",
        "prev",
        "phase",
        "ts",
        "id",
        "identity",
        "client",
        "method",
        "scheme",
        "host",
        "port",
        "path",
        "decision",
        "rule",
        "reason",
        "secrets",
        "policy",
        "would_deny",
    ] {
        assert!(
            decision.contains(&k.to_string()),
            "decision line lacks {k}: {decision:?}"
        );
    }
    for k in [
        "status",
        "upstream",
        "bytes_up",
        "bytes_down",
        "duration_ms",
        "redactions",
        "reach",
    ] {
        assert!(
            !decision.contains(&k.to_string()),
            "decision line carries {k}"
        );
        assert!(
            keys(&lines[1]).contains(&k.to_string()) || k == "reach",
            "outcome lacks {k}"
        );
    }
    assert_eq!(lines[0]["id"], lines[1]["id"]);
    assert_eq!(lines[0]["rule"], "r");
    assert_eq!(lines[0]["client"], "127.0.0.1:9");

    let broken = Flaky::default();
    broken.broken.store(true, Ordering::SeqCst);
    let log = Arc::new(AuditLog::with_sink(Box::new(broken.clone())).expect("log"));
    let mut e = Entry::start(log.clone(), client, "default", "sha256:x");
    assert!(
        !e.commit_decision().await,
        "a commit that failed is answered false"
    );
    e.dismiss();
}

#[test]
fn commits_that_arrive_together_share_one_write() {
    let sink = Flaky::default();
    let log = Arc::new(AuditLog::with_sink(Box::new(sink.clone())).expect("log"));
    let client: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let tasks: Vec<_> = (0..200)
            .map(|_| {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut e = Entry::start(log, client, "default", "sha256:x");
                    let ok = e.commit_decision().await;
                    e.dismiss();
                    ok
                })
            })
            .collect();
        for t in tasks {
            assert!(t.await.expect("task"));
        }
    });
    assert_eq!(log.written(), 200);
    assert!(
        sink.writes.load(Ordering::SeqCst) < 200,
        "{} writes for 200 commits: no grouping",
        sink.writes.load(Ordering::SeqCst)
    );
}

#[test]
fn commits_to_a_file_are_written_inline_grouped_and_on_disk_when_answered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("audit.jsonl");
    let log = Arc::new(AuditLog::open(&path).expect("log"));
    let client: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let tasks: Vec<_> = (0..200)
            .map(|_| {
                let (log, path) = (log.clone(), path.clone());
                tokio::spawn(async move {
                    let mut e = Entry::start(log, client, "default", "sha256:x");
                    let ok = e.commit_decision().await;
                    // Answered means written: the line is in the file now (a kill -9 from
                    // here on cannot lose it).
                    let text = std::fs::read_to_string(&path).expect("read");
                    let on_disk = text.contains(&format!("\"id\":\"{}\"", e.id()));
                    e.dismiss();
                    ok && on_disk
                })
            })
            .collect();
        for t in tasks {
            assert!(
                t.await.expect("task"),
                "a commit answered before its line was in the file"
            );
        }
    });
    let m = log.metrics();
    let writes = m.audit_writes.load(Ordering::Relaxed);
    assert!(writes < 200, "{writes} writes for 200 commits: no grouping");
    assert_eq!(
        m.audit_wakeups.load(Ordering::Relaxed),
        0,
        "inline commits woke the writer thread"
    );
    assert_eq!(log.written(), 200);
    drop(log);
    let text = std::fs::read_to_string(&path).expect("read");
    let mut seq = 0;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        seq += 1;
        assert_eq!(v["seq"], seq, "the chain is one sequence");
    }
    assert_eq!(seq, 200);
}

#[test]
fn an_outcome_queued_outside_a_runtime_still_reaches_a_file_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("audit.jsonl");
    let log = Arc::new(AuditLog::open(&path).expect("log"));
    record(&log, 200);
    assert!(log.flush(Duration::from_secs(5)));
    assert_eq!(log.written(), 1);
    assert_eq!(
        std::fs::read_to_string(&path)
            .expect("read")
            .lines()
            .count(),
        1
    );
}

#[test]
fn records_queued_for_a_flush_whose_runtime_ended_still_reach_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("audit.jsonl");
    let log = Arc::new(AuditLog::open(&path).expect("log"));
    let client: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    {
        // A runtime that ends before its flush task ever runs (never driven after this).
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let _enter = rt.enter();
        let mut e = Entry::start(log.clone(), client, "default", "sha256:x");
        e.outcome(Reason::Allowed, Some("r"), Some(200));
        e.finish();
        drop(_enter);
        drop(rt);
    }
    // Later records, outside any runtime, are not stuck behind the lost flush either.
    record(&log, 200);
    // No flush asked for: the writer thread must have been told of both by itself.
    let deadline = Instant::now() + Duration::from_secs(5);
    while log.written() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        log.written(),
        2,
        "records stuck behind a flush that never ran"
    );
    assert_eq!(
        std::fs::read_to_string(&path)
            .expect("read")
            .lines()
            .count(),
        2
    );
}

/// A log ending in a torn line that cannot be ended (the disk still full: here, a handle that
/// cannot write) is not resumed: nothing may be glued to the fragment. Once the newline goes
/// in, the chain goes on from the last whole line.
#[test]
fn a_torn_end_that_cannot_be_ended_is_not_resumed() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("audit.jsonl");
    let mut chain = Chain::default();
    let mut whole = Vec::new();
    chain
        .append_with(&mut whole, |out| {
            out.extend_from_slice(b"{\"id\":\"a\"}");
            Ok::<(), std::io::Error>(())
        })
        .expect("line");
    let mut text = whole.clone();
    text.extend_from_slice(b"{\"seq\":2,\"prev\":\"00");
    std::fs::write(&path, &text).expect("write");
    let active = |file: File| task::ActiveFile {
        path: path.clone(),
        file,
        size: text.len() as u64,
        opened: SystemTime::now(),
        first_seq: Some(1),
    };
    let read_only = File::open(&path).expect("read-only handle");
    let mut out = task::Out::File(active(read_only));
    assert!(
        out.resume().is_none(),
        "a fragment that cannot be ended is not resumed"
    );
    assert_eq!(
        std::fs::read(&path).expect("read"),
        text,
        "nothing appended"
    );
    let append = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("append handle");
    let mut out = task::Out::File(active(append));
    let resumed = out.resume().expect("ended, then resumed");
    assert_eq!(resumed.seq, 1, "from the last whole line");
    assert!(std::fs::read(&path).expect("read").ends_with(b"\n"));
}

//! Verification against logs the real writer wrote, then damaged in each way a reviewer must
//! be told about.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::audit::chain::{line_hash, Chain};
use crate::audit::key::SigningKey;
use crate::audit::segments::Rotation;
use crate::audit::{AuditLog, Entry, Options};
use crate::reason::Reason;

struct Log {
    dir: tempfile::TempDir,
    key: Arc<SigningKey>,
}

impl Log {
    fn path(&self) -> PathBuf {
        self.dir.path().join("audit.jsonl")
    }
    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.path())
            .expect("read")
            .lines()
            .map(str::to_string)
            .collect()
    }
    fn put(&self, lines: &[String]) {
        let mut text = lines.join("\n");
        text.push('\n');
        std::fs::write(self.path(), text).expect("write");
    }
    fn verify(&self) -> Report {
        let files = files_in_order(&[self.dir.path().to_path_buf()]).expect("files");
        verify(&files, self.key.public()).expect("verify")
    }
}

/// A log of `n` records, checkpointed every 4 lines, closed cleanly.
fn written(n: u16, rotation: Rotation) -> Log {
    let dir = tempfile::tempdir().expect("tempdir");
    let (key, _) = SigningKey::load_or_create(&dir.path().join("k.key")).expect("key");
    std::fs::remove_file(dir.path().join("k.key")).expect("rm key");
    let key = Arc::new(key);
    let log = Arc::new(
        AuditLog::open_with(
            &dir.path().join("audit.jsonl"),
            Options {
                key: Some(key.clone()),
                checkpoint_every: 4,
                rotation,
                ..Options::default()
            },
        )
        .expect("open"),
    );
    let client: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    for i in 0..n {
        let mut e = Entry::start(log.clone(), client, "default", "sha256:x");
        e.outcome(Reason::Allowed, Some("r"), Some(200 + i));
        e.finish();
        // One batch per record, so rotation by size has lines to cut at.
        assert!(log.flush(Duration::from_secs(5)));
    }
    drop(Arc::try_unwrap(log).ok().expect("the only handle"));
    Log { dir, key }
}

fn first(report: &Report) -> &Problem {
    report.problems.first().expect("a problem")
}

#[test]
fn an_untouched_log_verifies_signed_through_its_clean_stop() {
    let log = written(10, Rotation::default());
    let r = log.verify();
    assert!(r.intact(), "{r:#?}");
    assert!(r.ended_cleanly);
    assert_eq!(r.unsigned_tail, 0);
    assert_eq!(r.first_seq, Some(1));
    assert_eq!(r.signed_through, r.last_seq);
    assert!(r.checkpoints >= 3, "{r:#?}");
}

#[test]
fn an_edited_record_is_named() {
    let log = written(10, Rotation::default());
    let mut lines = log.lines();
    lines[2] = lines[2].replace("\"status\":202", "\"status\":404");
    log.put(&lines);
    let r = log.verify();
    assert_eq!(first(&r).kind, Kind::Edited, "{r:#?}");
    assert_eq!((first(&r).seq, first(&r).line), (Some(3), 3));
}

#[test]
fn an_edit_with_the_chain_recomputed_is_caught_by_the_next_checkpoint() {
    let log = written(10, Rotation::default());
    let mut lines = log.lines();
    lines[1] = lines[1].replace("\"status\":201", "\"status\":404");
    // The attacker rewrites every later prev, but cannot sign.
    for i in 2..lines.len() {
        let hash = line_hash(lines[i - 1].as_bytes());
        let mut v: serde_json::Value = serde_json::from_str(&lines[i]).expect("json");
        let old = v["prev"].as_str().expect("prev").to_string();
        v["prev"] = hash.clone().into();
        lines[i] = lines[i].replace(&old, &hash);
    }
    log.put(&lines);
    let r = log.verify();
    assert_eq!(first(&r).kind, Kind::BadSignature, "{r:#?}");
}

#[test]
fn a_deleted_record_is_named() {
    let log = written(10, Rotation::default());
    let mut lines = log.lines();
    lines.remove(5);
    log.put(&lines);
    let r = log.verify();
    assert_eq!(first(&r).kind, Kind::Deleted, "{r:#?}");
    assert!(first(&r).message.contains("seq 6 is missing"), "{r:#?}");
}

#[test]
fn reordered_records_are_named() {
    let log = written(10, Rotation::default());
    let mut lines = log.lines();
    lines.swap(6, 7);
    log.put(&lines);
    let r = log.verify();
    assert!(
        r.problems.iter().any(|p| p.kind == Kind::Reordered),
        "{r:#?}"
    );
    assert_ne!(first(&r).kind, Kind::Edited, "a swap is a jump first");
}

#[test]
fn truncation_mid_line_and_after_the_last_checkpoint_are_told_apart() {
    let log = written(10, Rotation::default());
    let text = std::fs::read_to_string(log.path()).expect("read");
    std::fs::write(log.path(), &text[..text.len() - 20]).expect("cut");
    let r = log.verify();
    assert_eq!(first(&r).kind, Kind::Truncated, "{r:#?}");

    // Whole lines cut off after a checkpoint: nothing is broken, but the tail is unsigned
    // and the log does not end with a clean stop.
    let mut lines = log.lines();
    lines.truncate(lines.len() - 1);
    let cut = lines.len();
    // Drop back to just after a record (not a checkpoint).
    let last_record = (0..cut)
        .rev()
        .find(|&i| !lines[i].contains("\"checkpoint\""))
        .expect("a record");
    lines.truncate(last_record + 1);
    log.put(&lines);
    let r = log.verify();
    assert!(r.intact(), "{r:#?}");
    assert!(r.unsigned_tail > 0 && !r.ended_cleanly, "{r:#?}");
}

#[test]
fn another_key_s_checkpoints_do_not_count() {
    let log = written(6, Rotation::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let (other, _) = SigningKey::load_or_create(&dir.path().join("o")).expect("key");
    let files = files_in_order(&[log.path()]).expect("files");
    let r = verify(&files, other.public()).expect("verify");
    assert_eq!(first(&r).kind, Kind::BadSignature, "{r:#?}");
    assert!(r.signed_through.is_none());
}

#[test]
fn a_rotated_set_verifies_in_any_order_and_a_missing_segment_is_named() {
    let log = written(
        30,
        Rotation {
            size: Some(1500),
            age: None,
        },
    );
    let segs = crate::audit::segments::segments(&log.path()).expect("segments");
    assert!(segs.len() >= 3, "{segs:?}");
    let mut given: Vec<PathBuf> = segs.iter().rev().cloned().collect();
    given.push(log.path());
    let files = files_in_order(&given).expect("files");
    let r = verify(&files, log.key.public()).expect("verify");
    assert!(r.intact(), "{r:#?}");
    assert_eq!(r.files.len(), segs.len() + 1);
    assert!(r.ended_cleanly);

    std::fs::remove_file(&segs[1]).expect("rm");
    let r = log.verify();
    assert_eq!(first(&r).kind, Kind::Deleted, "{r:#?}");

    // Retention removing the oldest is not damage: the chain just starts later.
    std::fs::remove_file(&segs[0]).expect("rm");
    let files: Vec<PathBuf> = segs[2..].iter().cloned().chain([log.path()]).collect();
    let r = verify(&files, log.key.public()).expect("verify");
    assert!(r.intact() && r.starts_mid_chain, "{r:#?}");
}

#[test]
fn a_restart_continues_the_chain() {
    let log = written(3, Rotation::default());
    let before = Chain::resume(&log.path()).expect("resume").expect("some");
    let again = Arc::new(
        AuditLog::open_with(
            &log.path(),
            Options {
                key: Some(log.key.clone()),
                ..Options::default()
            },
        )
        .expect("open"),
    );
    let client: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    Entry::start(again.clone(), client, "default", "sha256:x").finish();
    drop(Arc::try_unwrap(again).ok().expect("one handle"));
    let r = log.verify();
    assert!(r.intact(), "{r:#?}");
    assert!(r.last_seq > before.chain.map(|c| c.seq), "{r:#?}");
}

//! Verification against logs the real writer wrote, then damaged in each way a reviewer must
//! be told about.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::chain::{line_hash, Chain};
use crate::key::SigningKey;
use crate::reason::Reason;
use crate::segments::Rotation;
use crate::{AuditLog, Entry, Options};

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
    assert_eq!(first(&r).kind, Kind::ForeignKey, "{r:#?}");
    assert!(
        r.problems.iter().all(|p| p.kind == Kind::ForeignKey),
        "{r:#?}"
    );
    assert_eq!(r.verdict, Verdict::WrongKey);
    assert_eq!(r.verdict.exit_code(), 3);
    assert!(r.signed_through.is_none());
    assert!(first(&r).message.contains(&log.key.public().to_string()));

    // Damage wins over the wrong key: an edit checked with another key is still tampering.
    let mut lines = log.lines();
    lines[1] = lines[1].replace("\"status\":201", "\"status\":404");
    log.put(&lines);
    let r = verify(&files, other.public()).expect("verify");
    assert_eq!(r.verdict, Verdict::Tampered, "{r:#?}");
}

#[test]
fn a_checkpoint_naming_another_key_whose_signature_is_false_is_tampering() {
    let log = written(6, Rotation::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let (other, _) = SigningKey::load_or_create(&dir.path().join("o")).expect("key");
    let mut lines = log.lines();
    let at = lines
        .iter()
        .position(|l| l.contains("\"checkpoint\""))
        .expect("a checkpoint");
    // Its key swapped for another (the signature is the original key's, so under the named
    // key it is false), with the chain after it recomputed so only the signature tells.
    lines[at] = lines[at].replace(&log.key.public().to_string(), &other.public().to_string());
    relink(&mut lines, at);
    log.put(&lines);
    let r = log.verify();
    assert_eq!(first(&r).kind, Kind::BadSignature, "{r:#?}");
    assert_eq!(r.verdict, Verdict::Tampered);
}

/// Recomputes `prev` of every line after `from` (what a forger does after an edit).
fn relink(lines: &mut [String], from: usize) {
    for i in from + 1..lines.len() {
        let prev = line_hash(lines[i - 1].as_bytes());
        let v: serde_json::Value = serde_json::from_str(&lines[i]).expect("json");
        let old = v["prev"].as_str().expect("prev").to_string();
        lines[i] = lines[i].replacen(&old, &prev, 1);
    }
}

/// The first `cut` bytes of the line the writer would append next (a write cut short).
fn torn_next(lines: &[String], cut: usize) -> String {
    let last = lines.last().expect("a line");
    let seq = serde_json::from_str::<serde_json::Value>(last).expect("json")["seq"]
        .as_u64()
        .expect("seq");
    let mut chain = Chain {
        seq,
        last: line_hash(last.as_bytes()),
    };
    let mut buf = Vec::new();
    chain.append(
        br#"{"phase":"decision","id":"0123456789abcdef","status":200}"#,
        &mut buf,
    );
    String::from_utf8_lossy(&buf[..cut.min(buf.len() - 2)]).into_owned()
}

#[test]
fn a_write_cut_short_that_the_writer_sealed_is_a_torn_write_not_tampering() {
    for cut in [3, 20, 90, 120] {
        let log = written(5, Rotation::default());
        let lines = log.lines();
        let mut text = std::fs::read_to_string(log.path()).expect("read");
        text.push_str(&torn_next(&lines, cut));
        std::fs::write(log.path(), text).expect("write");
        // Unsealed (the writer has not been back): a partial line, as before.
        assert_eq!(first(&log.verify()).kind, Kind::Truncated);
        // The writer comes back: it seals the line and goes on from the line before it.
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
        assert_eq!(r.verdict, Verdict::TornWrite, "cut {cut}: {r:#?}");
        assert_eq!(r.verdict.exit_code(), 4);
        assert_eq!(r.problems.len(), 1, "{r:#?}");
        assert_eq!(first(&r).kind, Kind::TornWrite);
        assert_eq!(first(&r).line, lines.len() + 1);
        assert!(r.ended_cleanly, "{r:#?}");
        assert_eq!(r.signed_through, r.last_seq);

        // A real edit in the same log is still tampering.
        let mut after = log.lines();
        after[1] = after[1].replace("\"status\":201", "\"status\":404");
        log.put(&after);
        assert_eq!(log.verify().verdict, Verdict::Tampered);
    }
}

#[test]
fn a_line_that_only_looks_torn_is_still_tampering() {
    let log = written(6, Rotation::default());
    let lines = log.lines();
    // Garbage, or a fragment that does not continue the chain, sealed like a torn write.
    let wrong_seq = torn_next(&lines, 60).replacen("\"seq\":", "\"seq\":9", 1);
    let wrong_prev = {
        let t = torn_next(&lines, 80);
        let at = t.find("\"prev\":\"").expect("prev") + 8;
        let flip = if &t[at..=at] == "0" { "1" } else { "0" };
        format!("{}{flip}{}", &t[..at], &t[at + 1..])
    };
    for fake in ["not json at all".to_string(), wrong_seq, wrong_prev] {
        let mut l = lines.clone();
        l.insert(3, fake.clone());
        log.put(&l);
        assert_eq!(log.verify().verdict, Verdict::Tampered, "{fake}");
    }
    // A real line cut short in the middle: its successor links to the whole line.
    let mut l = lines.clone();
    let half = l[2].len() / 2;
    l[2].truncate(half);
    log.put(&l);
    let r = log.verify();
    assert_eq!(r.verdict, Verdict::Tampered, "{r:#?}");
    // A torn fragment followed by lines that do not go on from the line before it.
    let mut l = lines.clone();
    let fragment = torn_next(&l[..2], 40);
    l.insert(2, fragment);
    l.remove(3);
    log.put(&l);
    assert_eq!(log.verify().verdict, Verdict::Tampered);
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
    let segs = crate::segments::segments(&log.path()).expect("segments");
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

#[test]
fn a_write_that_lost_only_its_newline_is_ended_and_the_chain_goes_on_from_it() {
    let log = written(5, Rotation::default());
    let mut lines = log.lines();
    let whole = torn_next(&lines, usize::MAX);
    // torn_next keeps all but the line's last byte and its newline: put the byte back.
    let whole = format!("{whole}}}");
    assert!(
        serde_json::from_str::<serde_json::Value>(&whole).is_ok(),
        "{whole}"
    );
    let mut text = std::fs::read_to_string(log.path()).expect("read");
    text.push_str(&whole);
    std::fs::write(log.path(), text).expect("write");
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
    assert_eq!(r.verdict, Verdict::Intact, "{r:#?}");
    lines.push(whole);
    assert_eq!(log.lines()[..lines.len()], lines[..]);
}

proptest::proptest! {
    /// Any cut of the line that would continue the chain is a torn write; the same cut with
    /// any byte of its `seq`/`prev` head changed is not (it does not continue the chain).
    #[test]
    fn only_a_cut_of_the_next_chained_line_is_a_torn_write(
        seq in 0u64..1_000_000,
        body in "[a-z0-9\",:]{0,80}",
        cut in 1usize..200,
        flip in 0usize..90,
    ) {
        let prev_line = format!("{{\"seq\":{seq},\"prev\":\"{GENESIS}\"}}");
        let prev_hash = line_hash(prev_line.as_bytes());
        let mut chain = Chain { seq, last: prev_hash.clone() };
        let mut buf = Vec::new();
        chain.append(format!("{{\"x\":\"{body}\"}}").as_bytes(), &mut buf);
        let line = &buf[..buf.len() - 1];
        let cut = cut.min(line.len() - 1);
        let fragment = &line[..cut];
        let prev = (seq, prev_hash, PathBuf::from("a"), 1usize);
        proptest::prop_assert!(sealed_torn_write(fragment, Some(&prev), false));
        let head_len = format!("{{\"seq\":{},\"prev\":\"{}\"", seq + 1, prev.1).len();
        if flip < head_len.min(cut) {
            let mut changed = fragment.to_vec();
            changed[flip] = if changed[flip] == b'0' { b'1' } else { b'0' };
            proptest::prop_assert!(!sealed_torn_write(&changed, Some(&prev), false));
        }
        // Nothing to continue from mid-chain: never a torn write.
        proptest::prop_assert!(!sealed_torn_write(fragment, None, false));
    }
}

#[test]
fn a_growing_log_is_followed_once_through_a_rotation_and_a_line_in_progress() {
    use std::io::Write;
    let log = written(10, Rotation::default());
    let lines = log.lines();
    let active = log.path();
    let joined = |ls: &[String]| ls.iter().map(|l| format!("{l}\n")).collect::<String>();
    // A: five lines and half of the sixth (the writer is in the middle of it).
    let half = lines[5].len() / 2;
    std::fs::write(&active, joined(&lines[..5]) + &lines[5][..half]).expect("write");
    let mut follow = Follow::new(*log.key.public());
    let r = follow
        .advance(std::slice::from_ref(&active))
        .expect("advance");
    assert!(r.intact(), "{r:#?}");
    assert_eq!((r.lines, r.last_seq), (5, Some(5)));
    // B: the line finished, two more, then rotated (renamed: the same file) and a new active
    // file with the rest. Nothing is read twice.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&active)
        .expect("open");
    f.write_all(format!("{}\n", &lines[5][half..]).as_bytes())
        .expect("finish the line");
    f.write_all(joined(&lines[6..8]).as_bytes())
        .expect("append");
    drop(f);
    let segment = log
        .dir
        .path()
        .join("audit-000000000001-20261202T133600Z.jsonl");
    std::fs::rename(&active, &segment).expect("rotate");
    std::fs::write(&active, joined(&lines[8..])).expect("new active");
    let r = follow
        .advance(&[segment.clone(), active.clone()])
        .expect("advance");
    assert!(r.intact(), "{r:#?}");
    assert_eq!(r.lines, lines.len() as u64);
    assert_eq!(r.signed_through, r.last_seq, "{r:#?}");
    assert!(r.ended_cleanly);
    // Again with nothing new: the same, nothing re-read.
    let again = follow.advance(&[segment, active.clone()]).expect("advance");
    assert_eq!(again.lines, r.lines);
    // C: the active file cut short under it.
    std::fs::write(&active, "").expect("truncate");
    let r = follow
        .advance(std::slice::from_ref(&active))
        .expect("advance");
    assert_eq!(first(&r).kind, Kind::Truncated, "{r:#?}");
    assert!(!r.intact());
}

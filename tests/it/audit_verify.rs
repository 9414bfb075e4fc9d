//! Tamper evidence end to end: a real latchkey writes a rotated, checkpointed log;
//! `latchkey audit verify` passes it untouched and names the first edited, deleted, reordered
//! or truncated record; `latchkey audit key` prints the key the checkpoints are signed with;
//! rotation by age and retention by `--audit-keep` (book "Audit").

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::support::clients::{dial, read_response};
use crate::support::{latchkey, run_cli, CliOutput, Latchkey, Upstream};

struct Run {
    lk: Latchkey,
    up: Upstream,
    dir: tempfile::TempDir,
}

impl Run {
    fn start(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let audit = dir.path().join("audit.jsonl");
        Self::start_at(dir, &audit, args)
    }

    /// With the audit log at `audit` (under `dir` or not).
    fn start_at(dir: tempfile::TempDir, audit: &Path, args: &[&str]) -> Self {
        let up = Upstream::http();
        let mut b = latchkey().pin("api.test").audit_to(audit).policy(
            "main.toml",
            &format!(
                "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{}]\n",
                up.port()
            ),
        );
        for a in args {
            b = b.arg(a);
        }
        Self {
            lk: b.run(),
            up,
            dir,
        }
    }

    fn get(&self, path: &str) -> u16 {
        let port = self.up.port();
        let mut tcp = dial(self.lk.addr());
        let req = format!(
            "GET http://api.test:{port}{path} HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n"
        );
        tcp.write_all(req.as_bytes()).expect("send");
        read_response(&mut tcp, false).expect("response").status
    }

    fn stop(&mut self) {
        self.lk.signal("TERM");
        let exit = self.lk.wait_exit(Duration::from_secs(15)).expect("exits");
        assert!(exit.success(), "{}", self.lk.stderr_text());
    }

    fn audit_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The closed segments, oldest first.
    fn segments(&self) -> Vec<PathBuf> {
        let mut s: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .expect("dir")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("audit-") && n.ends_with(".jsonl"))
            })
            .collect();
        s.sort();
        s
    }

    fn verify(&self, extra: &[&str]) -> CliOutput {
        let ca = self.lk.ca_dir();
        let mut args: Vec<String> = vec![
            "audit".into(),
            "verify".into(),
            "--ca-dir".into(),
            ca.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        if !extra.iter().any(|a| a.starts_with('/')) {
            args.push(self.audit_dir().display().to_string());
        }
        run_cli(args)
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .expect("read")
        .lines()
        .map(str::to_string)
        .collect()
}

fn put(path: &Path, lines: &[String]) {
    std::fs::write(path, format!("{}\n", lines.join("\n"))).expect("write");
}

/// A rotated log of 60 requests, stopped cleanly.
fn rotated() -> Run {
    let mut run = Run::start(&["--audit-rotate", "4KiB", "--audit-checkpoint-every", "5"]);
    for i in 0..60 {
        assert_eq!(run.get(&format!("/r/{i}")), 200);
    }
    // Rotation runs on the writer thread, a moment after the write that filled the file: end
    // with records in a file that is not about to rotate, so the active file holds lines the
    // last checkpoint signs (the truncation test below needs them).
    let active = run.audit_dir().join("audit.jsonl");
    for i in 60..80 {
        std::thread::sleep(Duration::from_millis(50));
        let text = std::fs::read_to_string(&active).unwrap_or_default();
        if text.contains("\"phase\":\"outcome\"") && text.len() < 3 * 1024 {
            break;
        }
        assert_eq!(run.get(&format!("/r/{i}")), 200);
    }
    run.stop();
    run
}

#[test]
fn an_untouched_rotated_log_verifies_and_its_checkpoints_carry_the_printed_key() {
    let run = rotated();
    let segs = run.segments();
    assert!(segs.len() >= 3, "{segs:?}");
    let out = run.verify(&[]);
    assert_eq!(out.code(), Some(0), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.starts_with("intact: "), "{}", out.stdout);
    assert!(
        out.stdout
            .contains("ends with the checkpoint of a clean stop"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(&format!("in {} files", segs.len() + 1)),
        "{}",
        out.stdout
    );

    let key = run_cli([
        "audit".to_string(),
        "key".to_string(),
        "--ca-dir".to_string(),
        run.lk.ca_dir().display().to_string(),
    ]);
    assert_eq!(key.code(), Some(0), "{}", key.stderr);
    let printed = key.stdout.trim().to_string();
    assert!(printed.starts_with("ed25519:"), "{printed}");
    let mut checkpoints = 0;
    for seg in segs.iter().chain([&run.audit_dir().join("audit.jsonl")]) {
        for l in lines(seg) {
            let v: Value = serde_json::from_str(&l).expect("json");
            if let Some(cp) = v.get("checkpoint") {
                assert_eq!(cp["key"], printed.as_str());
                checkpoints += 1;
            }
        }
        // Every closed segment ends with a checkpoint: rotation signs what it closes.
        if seg != &run.audit_dir().join("audit.jsonl") {
            let last = lines(seg).pop().expect("a line");
            assert!(last.contains("\"checkpoint\""), "{seg:?}: {last}");
        }
    }
    assert!(checkpoints >= 12, "{checkpoints}");
    // The public key given explicitly, as a reviewer on another machine would.
    let out = run.verify(&["--key", &printed]);
    assert_eq!(out.code(), Some(0), "{}", out.stdout);
}

#[test]
fn verify_names_an_edited_record_in_a_rotated_segment() {
    let run = rotated();
    let seg = run.segments()[1].clone();
    let mut l = lines(&seg);
    let i = l
        .iter()
        .position(|x| x.contains("\"phase\":\"outcome\""))
        .expect("a record");
    l[i] = l[i].replace("\"status\":200", "\"status\":201");
    put(&seg, &l);
    let out = run.verify(&[]);
    assert_eq!(out.code(), Some(1), "{}", out.stdout);
    assert!(out.stdout.starts_with("TAMPERED"), "{}", out.stdout);
    let name = seg.file_name().and_then(|n| n.to_str()).expect("name");
    assert!(
        out.stdout
            .contains(&format!("{name}:{}) was edited", i + 1)),
        "{}",
        out.stdout
    );
}

#[test]
fn verify_names_a_deleted_segment_reordered_lines_and_a_truncated_end() {
    let run = rotated();
    let segs = run.segments();

    // Reordered: two lines of a segment swapped.
    let mut l = lines(&segs[0]);
    l.swap(2, 3);
    put(&segs[0], &l);
    let out = run.verify(&[]);
    assert_eq!(out.code(), Some(1), "{}", out.stdout);
    assert!(out.stdout.contains("reordered"), "{}", out.stdout);
    l.swap(2, 3);
    put(&segs[0], &l);
    assert_eq!(run.verify(&[]).code(), Some(0));

    // Deleted: a whole segment gone from the middle.
    let gone = segs[1].clone();
    let saved = std::fs::read(&gone).expect("read");
    std::fs::remove_file(&gone).expect("rm");
    let out = run.verify(&[]);
    assert_eq!(out.code(), Some(1), "{}", out.stdout);
    assert!(
        out.stdout.contains("missing") && out.stdout.contains("deleted"),
        "{}",
        out.stdout
    );
    std::fs::write(&gone, saved).expect("restore");

    // Truncated mid-line, then at a line after the last checkpoint.
    let active = run.audit_dir().join("audit.jsonl");
    let text = std::fs::read_to_string(&active).expect("read");
    std::fs::write(&active, &text[..text.len() - 10]).expect("cut");
    let out = run.verify(&[]);
    assert_eq!(out.code(), Some(1), "{}", out.stdout);
    assert!(out.stdout.contains("partial line"), "{}", out.stdout);
    let mut l: Vec<String> = text.lines().map(str::to_string).collect();
    while l.last().is_some_and(|x| x.contains("\"checkpoint\"")) {
        l.pop();
    }
    put(&active, &l);
    let out = run.verify(&[]);
    assert_eq!(out.code(), Some(0), "{}", out.stdout);
    assert!(
        out.stdout.contains("held by the chain only"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("clean stop"), "{}", out.stdout);
}

#[test]
fn verify_trusts_only_the_key_it_is_given_and_says_which_key_is_missing() {
    let run = rotated();
    let other = tempfile::tempdir().expect("tempdir");
    let made = run_cli([
        "audit".to_string(),
        "key".to_string(),
        "--ca-dir".to_string(),
        other.path().display().to_string(),
    ]);
    let wrong = made.stdout.trim().to_string();
    // Not tampering: the chain holds and every checkpoint is validly signed, by another key.
    let out = run.verify(&["--key", &wrong]);
    assert_eq!(out.code(), Some(3), "{}", out.stdout);
    assert!(out.stdout.starts_with("WRONG KEY: "), "{}", out.stdout);
    assert!(out.stdout.contains("not the trusted"), "{}", out.stdout);
    let json = run.verify(&["--key", &wrong, "--json"]);
    assert_eq!(json.code(), Some(3));
    let report: Value = serde_json::from_str(&json.stdout).expect("json report");
    assert_eq!(report["verdict"], "wrong_key", "{report:#}");
    assert!(
        report["problems"]
            .as_array()
            .is_some_and(|p| p.iter().all(|p| p["kind"] == "foreign_key")),
        "{report:#}"
    );
    // An edit stays tampering whichever key checks it.
    let segs = run.segments();
    let mut l = lines(&segs[0]);
    let at = l.iter().position(|x| x.contains("/r/0")).expect("a record");
    l[at] = l[at].replace("/r/0", "/r/X");
    put(&segs[0], &l);
    let out = run.verify(&["--key", &wrong]);
    assert_eq!(out.code(), Some(1), "{}", out.stdout);
    assert!(out.stdout.starts_with("TAMPERED: "), "{}", out.stdout);

    let out = run_cli([
        "audit".to_string(),
        "verify".to_string(),
        "--ca-dir".to_string(),
        "/nonexistent-latchkey-ca".to_string(),
        run.audit_dir().display().to_string(),
    ]);
    assert_eq!(out.code(), Some(1), "{}", out.stdout);
    assert!(
        out.stderr.contains("--key ed25519:") && out.stderr.contains("latchkey-audit.key"),
        "{}",
        out.stderr
    );
    let out = run.verify(&["--key", "ed25519:short"]);
    assert_eq!(out.code(), Some(1));
    assert!(
        out.stderr.contains("is not an audit public key"),
        "{}",
        out.stderr
    );
}

#[test]
fn the_log_rotates_by_age_and_old_segments_are_removed_after_their_keep() {
    let mut run = Run::start(&["--audit-rotate", "1s", "--audit-keep", "2s"]);
    for i in 0..8 {
        assert_eq!(run.get(&format!("/a/{i}")), 200);
        std::thread::sleep(Duration::from_millis(700));
    }
    let segs = run.segments();
    assert!(segs.len() >= 2, "{segs:?}");
    // Segments older than 2 s have gone; the chain still verifies from where it starts.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(run.get("/after"), 200);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(run.get("/after2"), 200);
    run.stop();
    let left = run.segments();
    assert!(
        !left.contains(&segs[0]),
        "{:?} outlived --audit-keep: {left:?}",
        segs[0]
    );
    let out = run.verify(&[]);
    assert_eq!(out.code(), Some(0), "{}", out.stdout);
    assert!(
        out.stdout.contains("note: the chain starts at seq"),
        "{}",
        out.stdout
    );
}

/// A small tmpfs mounted for one test (needs root, as the namespace tests do), unmounted on
/// drop: a disk that really fills up.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: &Path, size: &str) -> Self {
        std::fs::create_dir_all(at).expect("mount point");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test needs root (CAP_SYS_ADMIN) to mount a small tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(at.to_path_buf())
    }

    /// Fills the disk with `filler` until a write fails.
    fn fill(&self, filler: &Path) {
        let mut f = std::fs::File::create(filler).expect("filler");
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_write_a_full_disk_cut_short_then_sealed_by_latchkey_is_a_torn_write_not_tampering() {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SmallDisk::mount(&dir.path().join("disk"), "256k");
    let audit = disk.0.join("audit.jsonl");
    let state = format!("sqlite:{}", dir.path().join("state.db").display());
    let mut run = Run::start_at(
        tempfile::tempdir().expect("tempdir"),
        &audit,
        &["--state", &state, "--audit-checkpoint-every", "5"],
    );
    for i in 0..3 {
        assert_eq!(run.get(&format!("/before/{i}")), 200);
    }
    // The disk fills up: a write is cut short mid-line, and traffic is refused.
    let filler = disk.0.join("filler");
    disk.fill(&filler);
    let refused = (0..100).find(|i| run.get(&format!("/full/{i}")) == 503);
    assert!(refused.is_some(), "nothing was refused on a full disk");
    let text = std::fs::read(&audit).expect("audit");
    assert_ne!(text.last(), Some(&b'\n'), "no write was cut short mid-line");

    // Room again: latchkey seals the partial line and goes on.
    std::fs::remove_file(&filler).expect("rm filler");
    let served = (0..50).any(|i| {
        std::thread::sleep(Duration::from_millis(50));
        run.get(&format!("/after/{i}")) == 200
    });
    assert!(served, "{}", run.lk.stderr_text());
    run.stop();

    let log = audit.display().to_string();
    let out = run.verify(&[&log]);
    assert_eq!(out.code(), Some(4), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.starts_with("TORN WRITE"), "{}", out.stdout);
    assert!(out.stdout.contains("write cut short"), "{}", out.stdout);
    assert!(out.stdout.contains("clean stop"), "{}", out.stdout);
    let json = run.verify(&["--json", &log]);
    assert_eq!(json.code(), Some(4));
    let report: Value = serde_json::from_str(&json.stdout).expect("json report");
    assert_eq!(report["verdict"], "torn_write", "{report:#}");
    assert!(
        report["problems"]
            .as_array()
            .is_some_and(|p| !p.is_empty() && p.iter().all(|p| p["kind"] == "torn_write")),
        "{report:#}"
    );

    // Real tampering in the same log is still TAMPERED.
    let mut l = lines(&audit);
    let at = l
        .iter()
        .position(|x| x.contains("/before/1"))
        .expect("a record");
    l[at] = l[at].replace("/before/1", "/before/X");
    put(&audit, &l);
    let out = run.verify(&[&log]);
    assert_eq!(out.code(), Some(1), "{}", out.stdout);
    assert!(out.stdout.starts_with("TAMPERED"), "{}", out.stdout);
    drop(run);
}

//! What latchkey keeps on disk stays private and has one owner (book "Security model": Files and
//! modes, and "Approvals": the state store): the keys and the state file are created 0600 in 0700 directories; one
//! that group or others may read is refused at start, naming the file, its mode and the fix; a
//! SQLite state file belongs to one `serve` at a time, and a second one is refused naming the
//! first, until the first is gone (`kill -9` included).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::latchkey::LatchkeyBuilder;
use crate::support::{latchkey, run_cli};

const POLICY: &str = "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\n";

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// The files one latchkey keeps, outside its own temporary directory so every run shares them.
struct Kept {
    dir: tempfile::TempDir,
}

impl Kept {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }
    fn audit_key(&self) -> PathBuf {
        self.dir.path().join("keys/latchkey-audit.key")
    }
    fn capture_key(&self) -> PathBuf {
        self.dir.path().join("keys/capture.key")
    }
    fn state(&self) -> PathBuf {
        self.dir.path().join("state/state.db")
    }
    fn serve(&self) -> LatchkeyBuilder {
        latchkey()
            .policy("main.toml", POLICY)
            .arg("--audit-key")
            .arg(self.audit_key().to_str().expect("utf-8"))
            .arg("--capture-key")
            .arg(self.capture_key().to_str().expect("utf-8"))
            .arg("--state")
            .arg(&format!("sqlite:{}", self.state().display()))
    }
}

fn assert_refused_naming(out: &crate::support::CliOutput, path: &Path, mode: u32) {
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let shown = path.display().to_string();
    assert!(
        out.stderr.contains(&shown)
            && out.stderr.contains(&format!("mode {mode:04o}"))
            && out.stderr.contains(&format!("chmod 600 {shown}")),
        "{out:#?}"
    );
}

#[test]
fn keys_and_the_state_file_are_created_private_and_loose_ones_are_refused_naming_the_fix() {
    let kept = Kept::new();
    let lk = kept.serve().run();
    // Created 0600, in directories latchkey made 0700.
    for file in [
        kept.audit_key(),
        kept.capture_key(),
        kept.state(),
        PathBuf::from(format!("{}.lock", kept.state().display())),
        lk.ca_dir().join("latchkey-ca.key"),
    ] {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    for dir in [
        kept.dir.path().join("keys"),
        kept.dir.path().join("state"),
        lk.ca_dir(),
    ] {
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
    }
    drop(lk);

    // Each one loosened in turn: serve refuses to start, naming it, its mode and the fix.
    let state = kept.state();
    let wal = PathBuf::from(format!("{}-wal", state.display()));
    if !wal.exists() {
        std::fs::write(&wal, b"").expect("a -wal");
    }
    chmod(&wal, 0o600);
    for (file, loose) in [
        (state.clone(), 0o644),
        (state.clone(), 0o640),
        (wal.clone(), 0o604),
        (kept.capture_key(), 0o644),
        (kept.capture_key(), 0o660),
        (kept.audit_key(), 0o640),
    ] {
        chmod(&file, loose);
        let out = kept.serve().run_expecting_failure();
        assert_refused_naming(&out, &file, loose);
        chmod(&file, 0o600);
    }

    // The admin token file, read by serve and by `latchkey approvals` alike.
    let token = kept.dir.path().join("admin-token");
    std::fs::write(&token, "an-admin-token-of-some-length").expect("token");
    chmod(&token, 0o644);
    let spec = format!("file:{}", token.display());
    let out = kept
        .serve()
        .arg("--admin-token")
        .arg(&spec)
        .run_expecting_failure();
    assert_refused_naming(&out, &token, 0o644);
    let out = run_cli(["approvals", "list", "--admin-token", &spec]);
    assert_refused_naming(&out, &token, 0o644);
    chmod(&token, 0o600);
    // All private again: it starts.
    drop(kept.serve().arg("--admin-token").arg(&spec).run());

    // The CA key: refused where it used to be only warned about.
    let ca = kept.dir.path().join("ca");
    let out = run_cli(["ca", "init", "--ca-dir", ca.to_str().expect("utf-8")]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert_eq!(mode(&ca), 0o700);
    let key = ca.join("latchkey-ca.key");
    assert_eq!(mode(&key), 0o600);
    chmod(&key, 0o640);
    let out = run_cli(["ca", "show", "--ca-dir", ca.to_str().expect("utf-8")]);
    assert_refused_naming(&out, &key, 0o640);
    assert!(out.stderr.contains("consider replacing it"), "{out:#?}");
}

#[test]
fn a_second_serve_on_one_sqlite_state_file_is_refused_naming_the_first_until_it_is_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The default state file, beside a shared audit log: the refused one must write nothing.
    let audit = dir.path().join("audit.jsonl");
    let serve = || latchkey().policy("main.toml", POLICY).audit_to(&audit);
    let mut first = serve().run();
    let lock = dir.path().join("state.db.lock");
    let holder = std::fs::read_to_string(&lock).expect("the lock names its holder");
    assert!(
        holder.contains(&format!("pid {}", first.pid())) && holder.contains("started "),
        "{holder}"
    );
    let before = std::fs::read(&audit).unwrap_or_default();

    let second = serve().run_expecting_failure();
    assert_ne!(second.code(), Some(0), "{second:#?}");
    let state = dir.path().join("state.db");
    for needle in [
        state.display().to_string(),
        "in use by another latchkey serve".to_string(),
        format!("pid {}", first.pid()),
        "on host ".to_string(),
        "redis://".to_string(),
    ] {
        assert!(second.stderr.contains(&needle), "{needle}: {second:#?}");
    }
    assert_eq!(
        std::fs::read(&audit).unwrap_or_default(),
        before,
        "the refused serve wrote to the audit log"
    );

    // kill -9 leaves no stale lock: the kernel drops it with the process.
    first.signal("KILL");
    assert!(first.wait_exit(Duration::from_secs(5)).is_some(), "kill -9");
    let third = serve().run();
    let holder = std::fs::read_to_string(&lock).expect("holder");
    assert!(holder.contains(&format!("pid {}", third.pid())), "{holder}");
}

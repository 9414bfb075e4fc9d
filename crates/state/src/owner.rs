//! One `serve` per SQLite state file: the serving process holds an exclusive `flock(2)` on
//! `PATH.lock` beside the file for as long as it runs, and writes who it is into it (pid, host,
//! start time). A second `serve` on the same file finds the lock taken and refuses to start,
//! naming the holder: two processes each enforcing a budget on one file would each allow it in
//! full. The kernel drops the lock when the holder's process ends, however it ends (`kill -9`
//! included), so a crash never leaves a stale lock; the holder line it leaves is rewritten by
//! the next owner. Several replicas share a Redis store instead (README "The state store").
//!
//! Only `serve` takes the lock, before it writes anything (its audit log included): other
//! handles on the file (tests, tools) open it with [`super::Sqlite::open`] and share it
//! through SQLite's own locking.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The lock, held until dropped (or the process ends).
#[derive(Debug)]
pub struct Owner {
    _file: File,
    path: PathBuf,
}

impl Owner {
    /// Takes the lock of the state file `db` (creating `db.lock`, mode 0600, beside it) and
    /// writes this process into it. The `String` error says why not: the holder, or the cause.
    pub fn acquire(db: &Path) -> Result<Self, String> {
        let path = lock_path(&canonical(db));
        let mut file =
            crate::files::open(&path, "the state file's lock").map_err(|e| e.to_string())?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() {
                    "a process that has not written its name yet".to_string()
                } else {
                    holder.chars().take(300).collect()
                };
                return Err(format!(
                    "{} is in use by another latchkey serve ({holder}; lock {}): a SQLite state \
                     file belongs to one process at a time, or each would enforce every limit \
                     in full. Stop that process, give this one its own --state sqlite:PATH, or \
                     run replicas on one Redis store (--state redis://HOST:PORT/DB)",
                    db.display(),
                    path.display()
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(format!(
                    "cannot lock {} ({e}): the state file must be on a local file system",
                    path.display()
                ))
            }
        }
        let me = format!(
            "pid {} on host {}, started {}",
            std::process::id(),
            hostname(),
            humantime::format_rfc3339_seconds(SystemTime::now())
        );
        let written = file
            .set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(format!("{me}\n").as_bytes()))
            .and_then(|()| file.sync_data());
        if let Err(e) = written {
            // The lock holds without the note; a refused second process just cannot name us.
            tracing::warn!(lock = %path.display(), error = %e, "cannot write the state lock's holder");
        }
        Ok(Self { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `PATH.lock` beside the state file.
pub fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// `db` with its links resolved (its directory's, when it does not exist yet), so two names
/// for one file share one lock.
fn canonical(db: &Path) -> PathBuf {
    db.canonicalize()
        .ok()
        .or_else(|| {
            let dir = db.parent().filter(|d| !d.as_os_str().is_empty())?;
            Some(dir.canonicalize().ok()?.join(db.file_name()?))
        })
        .unwrap_or_else(|| db.to_path_buf())
}

/// This machine's name, for the holder line (`?` when unknown).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().chars().take(64).collect::<String>())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "?".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_owner_is_refused_naming_the_first_until_it_lets_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("state.db");
        let first = Owner::acquire(&db).expect("first");
        assert_eq!(first.path(), dir.path().join("state.db.lock"));
        let err = Owner::acquire(&db).expect_err("second refused");
        assert!(
            err.contains(&format!("pid {}", std::process::id()))
                && err.contains("on host ")
                && err.contains("started ")
                && err.contains("redis://")
                && err.contains(&db.display().to_string()),
            "{err}"
        );
        drop(first);
        let again = Owner::acquire(&db).expect("free again");
        let text = std::fs::read_to_string(again.path()).expect("holder");
        assert_eq!(text.lines().count(), 1, "{text}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(again.path())
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}

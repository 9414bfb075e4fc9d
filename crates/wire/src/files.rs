//! Private files: the keys and the state file latchkey keeps (the CA key, the audit signing
//! key, the token-capture key, the admin token file, the SQLite state file and its lock), all
//! read, created and checked here, one way (README "Files and modes").
//!
//! - **Created** files are made exclusively with mode `0600` from the first byte (the mode is
//!   given to `open(2)`, so there is no moment they are readable by anyone else), and the
//!   directories created for them `0700`. An existing directory is never changed.
//! - **Read** files are checked on the open handle (`fstat`, no window between the check and
//!   the read): a file that grants group or others any access is **refused** with an error
//!   naming it, its mode and the fix (`chmod 600 PATH`). latchkey never repairs a mode itself:
//!   a key that was readable may have been copied, and whether to replace it is the operator's
//!   call, which a silent `chmod` would hide.
//! - The one exception is the read-only secret mount: a file owned by another user (root) that
//!   latchkey can read only through its own group, e.g. a Kubernetes Secret mounted with
//!   `defaultMode: 0440` and the pod's `fsGroup`. Group *read* is accepted there (group write
//!   and any access for others never are).
//!
//! This module depends on nothing else in the crate.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The mode of a private file latchkey creates.
pub const FILE_MODE: u32 = 0o600;
/// The mode of a directory latchkey creates to hold private files.
pub const DIR_MODE: u32 = 0o700;

/// A private file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PrivateFileError {
    /// Its mode lets someone else at it.
    #[error("{what} {path} has mode {mode:04o} ({who}): latchkey refuses to use it; run `chmod 600 {path}`{after}")]
    Loose {
        what: &'static str,
        path: PathBuf,
        mode: u32,
        /// Who has which access, in words.
        who: String,
        /// What else to consider (replacing a key that may have been read).
        after: &'static str,
    },
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create {what} {path}: {source}")]
    Create {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl PrivateFileError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Loose { path, .. } | Self::Read { path, .. } | Self::Create { path, .. } => path,
        }
    }
}

/// Checks that the open file `file` (at `path`, holding `what`) grants nobody but its owner any
/// access (module docs for the read-only secret mount exception).
pub fn check(file: &File, path: &Path, what: &'static str) -> Result<(), PrivateFileError> {
    let meta = file.metadata().map_err(|source| PrivateFileError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    let euid = rustix::process::geteuid().as_raw();
    let egid = rustix::process::getegid().as_raw();
    check_mode(meta.mode(), meta.uid() != euid && meta.gid() == egid).map_err(|who| {
        PrivateFileError::Loose {
            what,
            path: path.to_path_buf(),
            mode: meta.mode() & 0o7777,
            who,
            after: if what.contains("key") {
                " (it may have been read: consider replacing it)"
            } else {
                ""
            },
        }
    })
}

/// The rule itself: `Err` says who may do what. `via_own_group`: the file belongs to another
/// user and to latchkey's own group, so group read is how latchkey reads it.
fn check_mode(mode: u32, via_own_group: bool) -> Result<(), String> {
    let mut loose = Vec::new();
    let words = |bits: u32| {
        let mut w = Vec::new();
        if bits & 4 != 0 {
            w.push("read");
        }
        if bits & 2 != 0 {
            w.push("write");
        }
        if bits & 1 != 0 {
            w.push("execute");
        }
        w.join("/")
    };
    let group = (mode >> 3) & 7;
    let group = if via_own_group { group & !4 } else { group };
    if group != 0 {
        loose.push(format!("its group may {}", words(group)));
    }
    if mode & 7 != 0 {
        loose.push(format!("others may {}", words(mode & 7)));
    }
    if loose.is_empty() {
        Ok(())
    } else {
        Err(loose.join(", "))
    }
}

/// Reads the private file at `path` whole, refusing it if its mode is loose ([`check`]).
/// `Ok(None)` when it does not exist.
pub fn read(path: &Path, what: &'static str) -> Result<Option<Vec<u8>>, PrivateFileError> {
    let read_err = |source| PrivateFileError::Read {
        what,
        path: path.to_path_buf(),
        source,
    };
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    check(&file, path, what)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(read_err)?;
    Ok(Some(bytes))
}

/// Creates the private file `path` holding `bytes`: exclusively (an existing file is an
/// error, never overwritten), mode [`FILE_MODE`] from the start, synced; its missing parent
/// directories are created [`DIR_MODE`].
pub fn create(path: &Path, bytes: &[u8], what: &'static str) -> Result<(), PrivateFileError> {
    let err = |source| PrivateFileError::Create {
        what,
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_dir(dir).map_err(err)?;
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
        .map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)
}

/// Opens the private file `path` for reading and writing, creating it (empty, mode
/// [`FILE_MODE`], missing parents [`DIR_MODE`]) when absent; an existing one is checked
/// ([`check`]).
pub fn open(path: &Path, what: &'static str) -> Result<File, PrivateFileError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_dir(dir).map_err(|source| PrivateFileError::Create {
            what,
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(path)
        .map_err(|source| PrivateFileError::Create {
            what,
            path: path.to_path_buf(),
            source,
        })?;
    check(&file, path, what)?;
    Ok(file)
}

/// Checks the private file `path` if it exists (a file latchkey does not open itself, such as
/// SQLite's `-wal` beside the state file).
pub fn check_if_present(path: &Path, what: &'static str) -> Result<(), PrivateFileError> {
    match File::open(path) {
        Ok(f) => check(&f, path, what),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(PrivateFileError::Read {
            what,
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Creates `dir` and its missing parents with mode [`DIR_MODE`]; an existing directory is left
/// as it is.
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn only_owner_access_passes_the_mode_rule() {
        for mode in [0o600, 0o400, 0o700, 0o200] {
            assert!(check_mode(mode, false).is_ok(), "{mode:o}");
        }
        for (mode, who) in [
            (0o640, "its group may read"),
            (0o660, "its group may read/write"),
            (0o604, "others may read"),
            (0o644, "its group may read, others may read"),
            (0o620, "its group may write"),
            (0o602, "others may write"),
            (0o601, "others may execute"),
        ] {
            assert_eq!(check_mode(mode, false), Err(who.to_string()), "{mode:o}");
        }
    }

    #[test]
    fn group_read_is_accepted_only_for_a_file_read_through_latchkeys_own_group() {
        assert!(check_mode(0o440, true).is_ok());
        assert!(check_mode(0o640, true).is_ok());
        assert_eq!(
            check_mode(0o460, true),
            Err("its group may write".to_string())
        );
        assert_eq!(check_mode(0o444, true), Err("others may read".to_string()));
        assert!(check_mode(0o440, false).is_err());
    }

    #[test]
    fn a_loose_file_is_refused_naming_it_its_mode_and_the_fix() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("capture.key");
        std::fs::write(&path, [7u8; 32]).expect("write");
        for mode in [0o644, 0o640, 0o604, 0o660] {
            chmod(&path, mode);
            let err = read(&path, "the token-capture key").expect_err("refused");
            let text = err.to_string();
            assert!(
                text.contains(&path.display().to_string())
                    && text.contains(&format!("{mode:04o}"))
                    && text.contains(&format!("chmod 600 {}", path.display()))
                    && text.contains("consider replacing it"),
                "{text}"
            );
            assert!(matches!(err, PrivateFileError::Loose { .. }));
            assert!(open(&path, "the token-capture key").is_err());
            assert!(check_if_present(&path, "the token-capture key").is_err());
        }
        chmod(&path, 0o600);
        assert_eq!(read(&path, "x key").expect("read"), Some(vec![7u8; 32]));
        chmod(&path, 0o400);
        assert!(read(&path, "x key").expect("read").is_some());
        assert!(read(&dir.path().join("absent"), "x key")
            .expect("absent")
            .is_none());
        assert!(check_if_present(&dir.path().join("absent"), "x").is_ok());
    }

    #[test]
    fn created_files_are_0600_and_their_new_directories_0700_whatever_the_umask_allows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a/b/key");
        create(&path, b"secret", "a key").expect("create");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dir.path().join("a")), 0o700);
        assert_eq!(mode(&dir.path().join("a/b")), 0o700);
        // Never overwritten.
        assert!(matches!(
            create(&path, b"other", "a key"),
            Err(PrivateFileError::Create { .. })
        ));
        assert_eq!(std::fs::read(&path).expect("read"), b"secret");
        let state = dir.path().join("c/state.db");
        drop(open(&state, "the state file").expect("open"));
        assert_eq!(mode(&state), 0o600);
        assert_eq!(mode(&dir.path().join("c")), 0o700);
        // An existing directory keeps its mode.
        chmod(&dir.path().join("c"), 0o750);
        drop(open(&state, "the state file").expect("open again"));
        assert_eq!(mode(&dir.path().join("c")), 0o750);
    }
}

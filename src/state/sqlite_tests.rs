//! The SQLite file itself: where it is created, with which mode, and which files are refused.

use std::os::unix::fs::PermissionsExt;

use super::*;

#[tokio::test]
async fn creates_the_file_0600_and_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deep/er/state.db");
    let store = Sqlite::open(&path).await.unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(
        store.describe(),
        format!("sqlite:{}", path.canonicalize().unwrap().display())
    );
    store.put("ns", "a", b"{}", None).await.unwrap();
    let wal = dir.path().join("deep/er/state.db-wal");
    assert!(
        wal.exists(),
        "WAL mode keeps a -wal file beside the database"
    );
}

#[tokio::test]
async fn a_newer_schema_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    drop(Sqlite::open(&path).await.unwrap());
    let conn = Connection::open(&path).unwrap();
    conn.execute(
        "UPDATE meta SET value = 99 WHERE key = 'schema_version'",
        [],
    )
    .unwrap();
    drop(conn);
    let err = Sqlite::open(&path).await.unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("schema version 99"), "{err}");
    assert!(err.contains("newer latchkey"), "{err}");
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    std::fs::write(&path, vec![b'x'; 4096]).unwrap();
    let err = Sqlite::open(&path).await.unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("not a database"), "{err}");
}

#[tokio::test]
async fn versions_are_never_reused_after_a_delete() {
    let dir = tempfile::tempdir().unwrap();
    let store = Sqlite::open(dir.path().join("state.db")).await.unwrap();
    assert!(store.put_new("ns", "a", b"1", None).await.unwrap());
    let first = store.get("ns", "a").await.unwrap().unwrap().version;
    assert!(store.delete("ns", "a").await.unwrap());
    assert!(store.put_new("ns", "a", b"2", None).await.unwrap());
    let again = store.get("ns", "a").await.unwrap().unwrap();
    assert!(again.version > first);
    assert!(!store.replace("ns", "a", first, b"3", None).await.unwrap());
}

//! The SQLite file itself: where it is created, with which mode, which files are refused, and
//! how an older schema is brought forward.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

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
    private(&path);
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

/// A state file as the approvals release (schema version 1) left it: its schema, a record, a
/// counter and a queue item.
fn write_v1_file(path: &Path) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode=WAL;
         CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
         INSERT INTO meta (key, value) VALUES ('schema_version', 1);",
    )
    .unwrap();
    conn.execute_batch(SCHEMA_V1).unwrap();
    let far = now_ms() + 3_600_000;
    conn.execute("UPDATE meta SET value = 7 WHERE key = 'seq'", [])
        .unwrap();
    conn.execute(
        "INSERT INTO records (ns, id, version, doc, expires_ms, updated_ms)
         VALUES ('approvals', 'apr_1', 7, x'7b7d', NULL, 0)",
        [],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO counters (key, value, expires_ms) VALUES ('c', 5, ?1)",
        [far],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO queue (queue, id, doc, due_ms, attempts) VALUES ('q', 'n', x'31', 0, 0)",
        [],
    )
    .unwrap();
    drop(conn);
    private(path);
}

/// Mode 0600 for a state file made outside latchkey (and its `-wal` and `-shm`, if any).
fn private(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let p = format!("{}{suffix}", path.display());
        if Path::new(&p).exists() {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
    }
}

#[tokio::test]
async fn a_state_file_group_or_others_may_read_is_refused_naming_it_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    drop(Sqlite::open(&path).await.unwrap());
    for mode in [0o644, 0o640, 0o604, 0o620] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let err = Sqlite::open(&path).await.unwrap_err().to_string();
        assert!(
            err.contains(&format!("{mode:04o}"))
                && err.contains(&format!("chmod 600 {}", path.display())),
            "{err}"
        );
    }
    private(&path);
    // Its WAL holds the same data: a loose one is refused too.
    let wal = dir.path().join("state.db-wal");
    std::fs::write(&wal, b"").unwrap();
    std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = Sqlite::open(&path).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!("chmod 600 {}", wal.display())),
        "{err}"
    );
    private(&path);
    let store = Sqlite::open(&path).await.unwrap();
    store.put("ns", "a", b"{}", None).await.unwrap();
}

fn schema_version(path: &Path) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |row| row.get(0),
        )
        .unwrap()
}

#[tokio::test]
async fn a_version_1_file_is_migrated_forward_keeping_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    write_v1_file(&path);
    let store = Sqlite::open(&path).await.unwrap();
    assert_eq!(schema_version(&path), SCHEMA_VERSION);
    let rec = store.get("approvals", "apr_1").await.unwrap().unwrap();
    assert_eq!((rec.version, rec.doc.as_slice()), (7, &b"{}"[..]));
    assert_eq!(store.counter("c").await.unwrap(), 5);
    assert_eq!(store.queue_len("q").await.unwrap(), 1);
    // The sequence carries on from the old file's.
    store.put("approvals", "apr_2", b"{}", None).await.unwrap();
    assert_eq!(
        store
            .get("approvals", "apr_2")
            .await
            .unwrap()
            .unwrap()
            .version,
        8
    );
    // The new primitives work on the migrated file, and survive a reopen.
    let minute = Duration::from_secs(60);
    assert!(store.take("rl", 1, minute).await.unwrap().allowed);
    assert_eq!(
        store.acquire("sem", "h1", 1, minute).await.unwrap(),
        Some(1)
    );
    drop(store);
    let store = Sqlite::open(&path).await.unwrap();
    assert_eq!(schema_version(&path), SCHEMA_VERSION);
    assert!(!store.take("rl", 1, minute).await.unwrap().allowed);
    assert_eq!(store.acquire("sem", "h2", 1, minute).await.unwrap(), None);
    assert_eq!(store.holders("sem").await.unwrap(), 1);
}

#[tokio::test]
async fn a_failed_migration_leaves_the_file_at_its_old_version_and_says_which_step() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    write_v1_file(&path);
    // Something in the way of the 1 → 2 step.
    Connection::open(&path)
        .unwrap()
        .execute("CREATE TABLE buckets (x)", [])
        .unwrap();
    let err = Sqlite::open(&path).await.unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("from version 1 to 2"), "{err}");
    assert_eq!(schema_version(&path), 1);
    let conn = Connection::open(&path).unwrap();
    let semaphores: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE name = 'semaphores'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(semaphores, 0, "the step was rolled back as a whole");
}

#[tokio::test]
async fn a_new_file_is_written_at_the_current_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    drop(Sqlite::open(&path).await.unwrap());
    assert_eq!(schema_version(&path), SCHEMA_VERSION);
    drop(Sqlite::open(&path).await.unwrap());
    assert_eq!(
        schema_version(&path),
        SCHEMA_VERSION,
        "reopening changes nothing"
    );
}

#[tokio::test]
async fn full_buckets_and_expired_slots_are_purged() {
    let dir = tempfile::tempdir().unwrap();
    let store = Sqlite::open(dir.path().join("state.db")).await.unwrap();
    store.take("rl", 5, Duration::from_millis(1)).await.unwrap();
    store
        .acquire("sem", "h", 1, Duration::from_millis(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let conn = store.conn.lock().unwrap();
    purge_expired(&conn).unwrap();
    let rows: i64 = conn
        .query_row(
            "SELECT (SELECT COUNT(*) FROM buckets) + (SELECT COUNT(*) FROM semaphores)",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(rows, 0);
}

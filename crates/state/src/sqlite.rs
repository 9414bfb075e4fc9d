//! The embedded state store: one SQLite file in WAL mode (`rusqlite`, bundled), the default for a
//! single latchkey process.
//!
//! Every call runs on tokio's blocking pool with the connection behind a `std::sync::Mutex`, so no
//! runtime worker ever waits on the disk or on another process's lock. Read-modify-write steps
//! run in `BEGIN IMMEDIATE` transactions and the busy timeout makes a second handle on the same
//! file (in this process or another) wait its turn, so compare-and-set, `delete`'s exactly-once
//! and counter limits hold across handles. Versions come from one sequence kept in the file, so
//! a version is never reused, not even by a record deleted and written again. Expired rows are
//! filtered out of every read and purged every [`PURGE_EVERY`] writes.
//!
//! Events are in-process only: handles on the same file in this process share one broadcast.
//!
//! The file (and its `-wal` and `-shm`) is private ([`crate::files`]: created 0600, refused when
//! group or others may read it: it holds the key that signs approval links). `serve` holds the
//! file's one-process lock ([`super::owner`]) before it opens it.
//! Depends on nothing else in the crate but [`crate::files`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use tokio::sync::broadcast;

use super::gcra::Bucket;
use super::{slot_ttl_ms, Added, Claimed, Event, Fut, StateError, StateStore, Taken, Versioned};

/// The schema this build writes; a file with a newer one is refused (never silently misread).
/// Version 1: records, counters, leases, queues (the approvals release). Version 2: token
/// buckets and semaphores.
const SCHEMA_VERSION: i64 = 2;

/// How long a call waits for another handle's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Expired rows are deleted once every this many writes.
const PURGE_EVERY: u64 = 256;

/// Buffered events per subscriber before the oldest are dropped (waiters poll as well).
const EVENT_CAPACITY: usize = 1024;

/// The version 1 schema, as the approvals release created it (a file of any version starts
/// from it; [`MIGRATIONS`] bring it forward).
const SCHEMA_V1: &str = "
CREATE TABLE IF NOT EXISTS records (
    ns TEXT NOT NULL, id TEXT NOT NULL, version INTEGER NOT NULL, doc BLOB NOT NULL,
    expires_ms INTEGER, updated_ms INTEGER NOT NULL, PRIMARY KEY (ns, id));
CREATE INDEX IF NOT EXISTS records_by_write ON records (ns, version);
CREATE TABLE IF NOT EXISTS counters (
    key TEXT PRIMARY KEY, value INTEGER NOT NULL, expires_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    key TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS queue (
    queue TEXT NOT NULL, id TEXT NOT NULL, doc BLOB NOT NULL, due_ms INTEGER NOT NULL,
    attempts INTEGER NOT NULL, PRIMARY KEY (queue, id));
CREATE INDEX IF NOT EXISTS queue_by_due ON queue (queue, due_ms, id);
INSERT OR IGNORE INTO meta (key, value) VALUES ('seq', 0);
";

/// `MIGRATIONS[i]` takes a file from version `i + 1` to `i + 2`; each runs once, in the same
/// transaction that records the new version, so a crash leaves the file at the old version.
const MIGRATIONS: [&str; 1] = [
    // 1 → 2: token buckets (one theoretical arrival time per key, in µs; a row whose `tat_us`
    // has passed is a full bucket and is purged) and semaphore slots.
    "
CREATE TABLE buckets (key TEXT PRIMARY KEY, tat_us INTEGER NOT NULL);
CREATE TABLE semaphores (
    key TEXT NOT NULL, holder TEXT NOT NULL, expires_ms INTEGER NOT NULL,
    PRIMARY KEY (key, holder));
",
];

const _: () = assert!(MIGRATIONS.len() as i64 + 1 == SCHEMA_VERSION);

/// The SQLite state store. Open it with [`Sqlite::open`].
pub struct Sqlite {
    describe: String,
    conn: Arc<Mutex<Connection>>,
    events: broadcast::Sender<Event>,
    writes: AtomicU64,
}

impl std::fmt::Debug for Sqlite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqlite")
            .field("store", &self.describe)
            .finish_non_exhaustive()
    }
}

impl Sqlite {
    /// Opens (creating it 0600, and its parent directory 0700, if missing) the state file at
    /// `path`, switches it to WAL mode and creates or checks its schema. A file group or
    /// others may read is refused.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StateError> {
        let path = absolute(path.as_ref());
        let describe = format!("sqlite:{}", path.display());
        let store = describe.clone();
        let opened = tokio::task::spawn_blocking(move || open_file(&path))
            .await
            .map_err(|e| backend(&store, format!("opening task failed: {e}")))?;
        let (conn, path) = opened.map_err(|message| backend(&describe, message))?;
        Ok(Sqlite {
            events: events_for(&path),
            describe,
            conn: Arc::new(Mutex::new(conn)),
            writes: AtomicU64::new(0),
        })
    }

    /// Runs `work` on the blocking pool with the connection; SQLite errors become
    /// [`StateError::Backend`] naming this store.
    fn run<'a, T, F>(&'a self, write: bool, work: F) -> Fut<'a, T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let conn = self.conn.clone();
        let purge = write
            && self
                .writes
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(PURGE_EVERY);
        Box::pin(async move {
            let done = tokio::task::spawn_blocking(move || {
                let mut conn = conn
                    .lock()
                    .map_err(|_| "the connection lock is poisoned".to_string())?;
                let out = work(&mut conn).map_err(|e| e.to_string())?;
                if purge {
                    purge_expired(&conn).map_err(|e| e.to_string())?;
                }
                Ok::<T, String>(out)
            })
            .await
            .map_err(|e| backend(&self.describe, format!("store task failed: {e}")))?;
            done.map_err(|message| backend(&self.describe, message))
        })
    }
}

fn backend(store: &str, message: String) -> StateError {
    StateError::Backend {
        store: store.to_string(),
        message,
    }
}

/// `path` made absolute against the working directory (without resolving links), so messages
/// and `describe()` name the file unambiguously.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Creates the directory and file, opens the connection and sets it up. The `String` error is
/// the step and its cause; the caller adds the store's name.
fn open_file(path: &Path) -> Result<(Connection, PathBuf), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if dir.exists() && !dir.is_dir() {
            return Err(format!(
                "cannot create directory {}: it is not a directory",
                dir.display()
            ));
        }
    }
    // Created 0600 (its directory 0700) or checked: it holds the approval links' signing key.
    drop(crate::files::open(path, "the state file").map_err(|e| e.to_string())?);
    for sidecar in ["-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(sidecar);
        crate::files::check_if_present(Path::new(&name), "part of the state file")
            .map_err(|e| e.to_string())?;
    }
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mut conn = Connection::open(&path).map_err(|e| format!("cannot open: {e}"))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| format!("cannot set the busy timeout: {e}"))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0))
        .map_err(|e| format!("cannot switch to WAL mode: {e}"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!(
            "cannot switch to WAL mode (journal mode is {mode})"
        ));
    }
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(|e| format!("cannot set synchronous=NORMAL: {e}"))?;
    migrate(&mut conn)?;
    Ok((conn, path))
}

/// Creates the schema on a new file, or checks that the file's schema is one this build knows
/// and brings an older one forward to [`SCHEMA_VERSION`], all in one transaction.
fn migrate(conn: &mut Connection) -> Result<(), String> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| format!("cannot read the schema: {e}"))?;
    tx.execute(
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
        [],
    )
    .map_err(|e| format!("cannot create the schema: {e}"))?;
    let found: Option<i64> = tx
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(|e| format!("cannot read the schema version: {e}"))?;
    // A new file counts as version 1 once the version 1 schema is created.
    let from = match found {
        Some(v) if v > SCHEMA_VERSION => {
            return Err(format!(
            "schema version {v} was written by a newer latchkey (this one knows {SCHEMA_VERSION})"
        ))
        }
        Some(v) if v < 1 => return Err(format!("unknown schema version {v}")),
        Some(v) => v,
        None => 1,
    };
    tx.execute_batch(SCHEMA_V1)
        .map_err(|e| format!("cannot create the schema: {e}"))?;
    for (to, step) in (2..).zip(MIGRATIONS) {
        if from < to {
            tx.execute_batch(step).map_err(|e| {
                format!(
                    "cannot migrate the schema from version {} to {to}: {e}",
                    to - 1
                )
            })?;
        }
    }
    if found != Some(SCHEMA_VERSION) {
        tx.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?1)",
            [SCHEMA_VERSION],
        )
        .map_err(|e| format!("cannot write the schema version: {e}"))?;
    }
    tx.commit()
        .map_err(|e| format!("cannot create the schema: {e}"))
}

/// The broadcast shared by every handle on the file at `path` in this process.
fn events_for(path: &Path) -> broadcast::Sender<Event> {
    static BY_FILE: OnceLock<Mutex<HashMap<PathBuf, broadcast::Sender<Event>>>> = OnceLock::new();
    let map = BY_FILE.get_or_init(|| Mutex::new(HashMap::new()));
    match map.lock() {
        Ok(mut map) => map
            .entry(path.to_path_buf())
            .or_insert_with(|| broadcast::channel(EVENT_CAPACITY).0)
            .clone(),
        // A poisoned map only loses sharing between handles; each handle still works.
        Err(_) => broadcast::channel(EVENT_CAPACITY).0,
    }
}

fn purge_expired(conn: &Connection) -> rusqlite::Result<()> {
    let now = now_ms();
    conn.execute(
        "DELETE FROM records WHERE expires_ms IS NOT NULL AND expires_ms <= ?1",
        [now],
    )?;
    conn.execute("DELETE FROM counters WHERE expires_ms <= ?1", [now])?;
    conn.execute("DELETE FROM leases WHERE expires_ms <= ?1", [now])?;
    conn.execute("DELETE FROM semaphores WHERE expires_ms <= ?1", [now])?;
    conn.execute(
        "DELETE FROM buckets WHERE tat_us <= ?1",
        [now.saturating_mul(1000)],
    )?;
    Ok(())
}

/// Milliseconds since the Unix epoch of `t` (0 before it, saturating far after).
fn millis(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn now_ms() -> i64 {
    millis(SystemTime::now())
}

/// Microseconds since the Unix epoch now: token buckets need finer steps than milliseconds
/// (a rate of 10 000/s refills every 100 µs).
fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn expiry(ttl: Option<Duration>) -> Option<i64> {
    ttl.map(|ttl| now_ms().saturating_add(ms(ttl)))
}

/// The next version: one sequence for the whole file, so versions are never reused.
fn next_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row(
        "UPDATE meta SET value = value + 1 WHERE key = 'seq' RETURNING value",
        [],
        |row| row.get(0),
    )
}

/// The SQL condition of a live (unexpired) record; the current time is the parameter `:now`.
const LIVE: &str = "(expires_ms IS NULL OR expires_ms > :now)";

fn version(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl StateStore for Sqlite {
    fn describe(&self) -> &str {
        &self.describe
    }

    fn put_new<'a>(
        &'a self,
        ns: &'a str,
        id: &'a str,
        doc: &'a [u8],
        ttl: Option<Duration>,
    ) -> Fut<'a, bool> {
        let (ns, id, doc) = (ns.to_string(), id.to_string(), doc.to_vec());
        self.run(true, move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            let live: Option<i64> = tx
                .query_row(
                    &format!("SELECT 1 FROM records WHERE ns = :ns AND id = :id AND {LIVE}"),
                    rusqlite::named_params! {":ns": ns, ":id": id, ":now": now},
                    |row| row.get(0),
                )
                .optional()?;
            if live.is_some() {
                return Ok(false);
            }
            let v = next_version(&tx)?;
            tx.execute(
                "INSERT OR REPLACE INTO records (ns, id, version, doc, expires_ms, updated_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![ns, id, v, doc, expiry(ttl), now],
            )?;
            tx.commit()?;
            Ok(true)
        })
    }

    fn put<'a>(
        &'a self,
        ns: &'a str,
        id: &'a str,
        doc: &'a [u8],
        ttl: Option<Duration>,
    ) -> Fut<'a, ()> {
        let (ns, id, doc) = (ns.to_string(), id.to_string(), doc.to_vec());
        self.run(true, move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let v = next_version(&tx)?;
            tx.execute(
                "INSERT OR REPLACE INTO records (ns, id, version, doc, expires_ms, updated_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![ns, id, v, doc, expiry(ttl), now_ms()],
            )?;
            tx.commit()
        })
    }

    fn get<'a>(&'a self, ns: &'a str, id: &'a str) -> Fut<'a, Option<Versioned>> {
        let (ns, id) = (ns.to_string(), id.to_string());
        self.run(false, move |conn| {
            conn.query_row(
                &format!("SELECT version, doc FROM records WHERE ns = :ns AND id = :id AND {LIVE}"),
                rusqlite::named_params! {":ns": ns, ":id": id, ":now": now_ms()},
                |row| {
                    Ok(Versioned {
                        version: version(row.get(0)?),
                        doc: row.get(1)?,
                    })
                },
            )
            .optional()
        })
    }

    fn replace<'a>(
        &'a self,
        ns: &'a str,
        id: &'a str,
        version: u64,
        doc: &'a [u8],
        ttl: Option<Duration>,
    ) -> Fut<'a, bool> {
        let (ns, id, doc) = (ns.to_string(), id.to_string(), doc.to_vec());
        self.run(true, move |conn| {
            let Ok(expected) = i64::try_from(version) else {
                return Ok(false);
            };
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            let current: Option<i64> = tx
                .query_row(
                    &format!("SELECT version FROM records WHERE ns = :ns AND id = :id AND {LIVE}"),
                    rusqlite::named_params! {":ns": ns, ":id": id, ":now": now},
                    |row| row.get(0),
                )
                .optional()?;
            if current != Some(expected) {
                return Ok(false);
            }
            let v = next_version(&tx)?;
            tx.execute(
                "UPDATE records SET version = ?3, doc = ?4, expires_ms = ?5, updated_ms = ?6
                 WHERE ns = ?1 AND id = ?2",
                params![ns, id, v, doc, expiry(ttl), now],
            )?;
            tx.commit()?;
            Ok(true)
        })
    }

    fn delete<'a>(&'a self, ns: &'a str, id: &'a str) -> Fut<'a, bool> {
        let (ns, id) = (ns.to_string(), id.to_string());
        self.run(true, move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let removed = tx.execute(
                &format!("DELETE FROM records WHERE ns = :ns AND id = :id AND {LIVE}"),
                rusqlite::named_params! {":ns": ns, ":id": id, ":now": now_ms()},
            )?;
            tx.execute(
                "DELETE FROM records WHERE ns = ?1 AND id = ?2",
                params![ns, id],
            )?;
            tx.commit()?;
            Ok(removed == 1)
        })
    }

    fn list<'a>(&'a self, ns: &'a str, limit: usize) -> Fut<'a, Vec<(String, Versioned)>> {
        let ns = ns.to_string();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(false, move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT id, version, doc FROM records WHERE ns = :ns AND {LIVE}
                 ORDER BY version DESC LIMIT :limit"
            ))?;
            let rows = stmt.query_map(
                rusqlite::named_params! {":ns": ns, ":now": now_ms(), ":limit": limit},
                |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        Versioned {
                            version: version(row.get(1)?),
                            doc: row.get(2)?,
                        },
                    ))
                },
            )?;
            rows.collect()
        })
    }

    fn add<'a>(
        &'a self,
        key: &'a str,
        delta: i64,
        limit: Option<i64>,
        ttl: Duration,
    ) -> Fut<'a, Added> {
        let key = key.to_string();
        self.run(true, move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            let found: Option<(i64, i64)> = tx
                .query_row(
                    "SELECT value, expires_ms FROM counters WHERE key = ?1 AND expires_ms > ?2",
                    params![key, now],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            let (current, expires) = found.unwrap_or((0, now.saturating_add(ms(ttl))));
            let next = current.saturating_add(delta);
            if delta > 0 && limit.is_some_and(|limit| next > limit) {
                return Ok(Added::Over(current));
            }
            let next = next.max(0);
            tx.execute(
                "INSERT OR REPLACE INTO counters (key, value, expires_ms) VALUES (?1, ?2, ?3)",
                params![key, next, expires],
            )?;
            tx.commit()?;
            Ok(Added::Ok(next))
        })
    }

    fn counter<'a>(&'a self, key: &'a str) -> Fut<'a, i64> {
        let key = key.to_string();
        self.run(false, move |conn| {
            let value: Option<i64> = conn
                .query_row(
                    "SELECT value FROM counters WHERE key = ?1 AND expires_ms > ?2",
                    params![key, now_ms()],
                    |row| row.get(0),
                )
                .optional()?;
            Ok(value.unwrap_or(0))
        })
    }

    fn lease<'a>(&'a self, key: &'a str, holder: &'a str, ttl: Duration) -> Fut<'a, bool> {
        let (key, holder) = (key.to_string(), holder.to_string());
        self.run(true, move |conn| {
            let now = now_ms();
            // One statement: taken if free, expired or already ours.
            let changed = conn.execute(
                "INSERT INTO leases (key, holder, expires_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (key) DO UPDATE SET holder = excluded.holder,
                     expires_ms = excluded.expires_ms
                 WHERE leases.holder = excluded.holder OR leases.expires_ms <= ?4",
                params![key, holder, now.saturating_add(ms(ttl)), now],
            )?;
            Ok(changed == 1)
        })
    }

    fn release<'a>(&'a self, key: &'a str, holder: &'a str) -> Fut<'a, ()> {
        let (key, holder) = (key.to_string(), holder.to_string());
        self.run(true, move |conn| {
            conn.execute(
                "DELETE FROM leases WHERE key = ?1 AND holder = ?2",
                params![key, holder],
            )
            .map(drop)
        })
    }

    fn take<'a>(&'a self, key: &'a str, burst: u64, interval: Duration) -> Fut<'a, Taken> {
        let bucket = match Bucket::new(&self.describe, key, burst, interval) {
            Ok(bucket) => bucket,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let key = key.to_string();
        self.run(true, move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_us();
            let stored: Option<i64> = tx
                .prepare_cached("SELECT tat_us FROM buckets WHERE key = ?1")?
                .query_row([&key], |row| row.get(0))
                .optional()?;
            let (allowed, ahead, tat) = bucket.take(stored, now);
            if allowed {
                tx.prepare_cached(
                    "INSERT INTO buckets (key, tat_us) VALUES (?1, ?2)
                     ON CONFLICT (key) DO UPDATE SET tat_us = excluded.tat_us",
                )?
                .execute(params![key, tat])?;
                tx.commit()?;
            }
            Ok(bucket.taken(allowed, ahead))
        })
    }

    fn acquire<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
        max: u64,
        ttl: Duration,
    ) -> Fut<'a, Option<u64>> {
        let ttl = match slot_ttl_ms(&self.describe, key, max, ttl) {
            Ok(ttl) => ttl,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let (key, holder) = (key.to_string(), holder.to_string());
        self.run(true, move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            tx.prepare_cached("DELETE FROM semaphores WHERE key = ?1 AND expires_ms <= ?2")?
                .execute(params![key, now])?;
            let (held, mine): (i64, i64) = tx
                .prepare_cached(
                    "SELECT COUNT(*), COALESCE(SUM(holder = ?2), 0) FROM semaphores
                     WHERE key = ?1",
                )?
                .query_row(params![key, holder], |row| Ok((row.get(0)?, row.get(1)?)))?;
            let held = u64::try_from(held).unwrap_or(0);
            let now_held = if mine > 0 {
                held
            } else if held >= max {
                // Keep the purge of expired slots; nothing else changed.
                tx.commit()?;
                return Ok(None);
            } else {
                held + 1
            };
            tx.prepare_cached(
                "INSERT INTO semaphores (key, holder, expires_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (key, holder) DO UPDATE SET expires_ms = excluded.expires_ms",
            )?
            .execute(params![key, holder, now.saturating_add(ttl)])?;
            tx.commit()?;
            Ok(Some(now_held))
        })
    }

    fn relinquish<'a>(&'a self, key: &'a str, holder: &'a str) -> Fut<'a, ()> {
        let (key, holder) = (key.to_string(), holder.to_string());
        self.run(true, move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.prepare_cached("DELETE FROM semaphores WHERE key = ?1 AND holder = ?2")?
                .execute(params![key, holder])?;
            tx.commit()
        })
    }

    fn holders<'a>(&'a self, key: &'a str) -> Fut<'a, u64> {
        let key = key.to_string();
        self.run(false, move |conn| {
            let n: i64 = conn
                .prepare_cached(
                    "SELECT COUNT(*) FROM semaphores WHERE key = ?1 AND expires_ms > ?2",
                )?
                .query_row(params![key, now_ms()], |row| row.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn enqueue<'a>(
        &'a self,
        queue: &'a str,
        id: &'a str,
        doc: &'a [u8],
        due: SystemTime,
    ) -> Fut<'a, ()> {
        let (queue, id, doc) = (queue.to_string(), id.to_string(), doc.to_vec());
        self.run(true, move |conn| {
            conn.execute(
                "INSERT OR REPLACE INTO queue (queue, id, doc, due_ms, attempts)
                 VALUES (?1, ?2, ?3, ?4, 0)",
                params![queue, id, doc, millis(due)],
            )
            .map(drop)
        })
    }

    fn claim<'a>(
        &'a self,
        queue: &'a str,
        now: SystemTime,
        lease: Duration,
        max: usize,
    ) -> Fut<'a, Vec<Claimed>> {
        let queue = queue.to_string();
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        self.run(true, move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = millis(now);
            let claimed = {
                let mut stmt = tx.prepare_cached(
                    "SELECT id, doc, attempts FROM queue WHERE queue = ?1 AND due_ms <= ?2
                     ORDER BY due_ms, id LIMIT ?3",
                )?;
                let rows = stmt.query_map(params![queue, now, max], |row| {
                    Ok(Claimed {
                        id: row.get(0)?,
                        doc: row.get(1)?,
                        attempts: u32::try_from(row.get::<_, i64>(2)?).unwrap_or(u32::MAX),
                    })
                })?;
                rows.collect::<rusqlite::Result<Vec<_>>>()?
            };
            {
                let mut stmt = tx.prepare_cached(
                    "UPDATE queue SET due_ms = ?3, attempts = attempts + 1
                     WHERE queue = ?1 AND id = ?2",
                )?;
                for item in &claimed {
                    stmt.execute(params![queue, item.id, now.saturating_add(ms(lease))])?;
                }
            }
            tx.commit()?;
            Ok(claimed)
        })
    }

    fn reschedule<'a>(&'a self, queue: &'a str, id: &'a str, due: SystemTime) -> Fut<'a, ()> {
        let (queue, id) = (queue.to_string(), id.to_string());
        self.run(true, move |conn| {
            conn.execute(
                "UPDATE queue SET due_ms = ?3 WHERE queue = ?1 AND id = ?2",
                params![queue, id, millis(due)],
            )
            .map(drop)
        })
    }

    fn ack<'a>(&'a self, queue: &'a str, id: &'a str) -> Fut<'a, ()> {
        let (queue, id) = (queue.to_string(), id.to_string());
        self.run(true, move |conn| {
            conn.execute(
                "DELETE FROM queue WHERE queue = ?1 AND id = ?2",
                params![queue, id],
            )
            .map(drop)
        })
    }

    fn queue_len<'a>(&'a self, queue: &'a str) -> Fut<'a, u64> {
        let queue = queue.to_string();
        self.run(false, move |conn| {
            let n: i64 = conn.query_row(
                "SELECT COUNT(*) FROM queue WHERE queue = ?1",
                [queue],
                |row| row.get(0),
            )?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn publish<'a>(&'a self, channel: &'a str, message: &'a str) -> Fut<'a, ()> {
        // No receiver is not an error: nobody is waiting.
        let _ = self.events.send(Event {
            channel: channel.to_string(),
            message: message.to_string(),
        });
        Box::pin(async { Ok(()) })
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }
}

#[cfg(test)]
#[path = "sqlite_tests.rs"]
mod tests;

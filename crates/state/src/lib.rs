//! The state store: the one place latchkey keeps what must outlive a process or be seen by every
//! replica — approvals and grants, the notification outbox, and (for limits and budgets)
//! counters and leases.
//!
//! One trait, [`StateStore`], two backends: SQLite ([`sqlite`], the embedded default, a file in
//! WAL mode) and Redis ([`redis`], shared by several replicas). Both keep the same small set of
//! primitives, so everything above them (`governance`) is written once and tested against both:
//!
//! - **records**: JSON documents by namespace and id, each with a version for compare-and-set,
//!   and an optional time to live;
//! - **counters**: atomic add-within-a-limit with an expiry (windows are the caller's keys);
//! - **leases**: a key held by one holder until it expires or is released;
//! - **token buckets**: GCRA rate limits, one timestamp per key, on the store's clock;
//! - **semaphores**: up to N slots of a key, each held by one holder until it expires or is
//!   given back (in-flight request caps that a crashed replica cannot leak);
//! - **queues**: items due at a time, claimed under a lease (a crash before `ack` redelivers:
//!   at-least-once), rescheduled on failure;
//! - **events**: publish a short message on a channel; every replica's subscribers see it.
//!   Events are a wake-up, never the truth: a waiter re-reads the record after each one and
//!   also polls, so a lost event only delays it.
//!
//! The serving process owns a SQLite file alone ([`owner`]: a lock naming it); replicas share
//! Redis. This module depends on nothing else in the crate but [`crate::files`] (private file
//! modes).

// The crates this one uses, under the module names the code knows them by.
use latchkey_wire::files;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

mod gcra;
pub mod owner;
pub mod redis;
pub mod sqlite;

pub use self::redis::Redis;
pub use sqlite::Sqlite;

/// Opens the store `--state` names: `sqlite:PATH` (the file is created if missing; the serving
/// process takes its lock first, [`owner::Owner`]) or `redis://HOST:PORT[/DB]`. Anything else
/// is a [`StateError::Url`] saying which forms work.
pub async fn open(url: &str) -> Result<Arc<dyn StateStore>, StateError> {
    if let Some(path) = url.strip_prefix("sqlite:") {
        if path.is_empty() {
            return Err(StateError::Url {
                url: url.to_string(),
                why: "no path after `sqlite:` (expected sqlite:PATH)".to_string(),
            });
        }
        return Ok(Arc::new(Sqlite::open(path).await?));
    }
    if url.starts_with("redis://") {
        return Ok(Arc::new(Redis::open(url).await?));
    }
    Err(StateError::Url {
        url: url.to_string(),
        why: "expected sqlite:PATH or redis://HOST:PORT[/DB]".to_string(),
    })
}

/// What every store call returns: a boxed future, so the trait stays object-safe
/// (`Arc<dyn StateStore>`).
pub type Fut<'a, T> = Pin<Box<dyn Future<Output = Result<T, StateError>> + Send + 'a>>;

/// A store failure. Callers on a security path fail closed on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The state URL given to `--state` cannot be used.
    #[error("state store URL {url:?}: {why}")]
    Url { url: String, why: String },
    /// The backend failed (I/O, connection, a script error). `store` is [`StateStore::describe`]
    /// (no password).
    #[error("state store {store}: {message}")]
    Backend { store: String, message: String },
}

/// A stored document and its version: every write increments it, so a writer that read version
/// N can replace the document only if nobody wrote since ([`StateStore::replace`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    pub version: u64,
    pub doc: Vec<u8>,
}

/// An item claimed from a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub id: String,
    pub doc: Vec<u8>,
    /// How many times it was claimed before this one (0 on the first delivery).
    pub attempts: u32,
}

/// The result of [`StateStore::add`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// Added; the counter's new value.
    Ok(i64),
    /// Not added: the counter would pass the limit. Its current value.
    Over(i64),
}

/// The result of [`StateStore::take`]. The durations are what `retry-after` and
/// `x-ratelimit-reset` report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// The token was taken: the request may go.
    pub allowed: bool,
    /// Whole tokens left in the bucket after this call.
    pub remaining: u64,
    /// When refused: how long until the same take would be allowed. Zero when allowed.
    pub retry_after: Duration,
    /// How long until the bucket is full again.
    pub reset_after: Duration,
}

/// A message on a channel, as every subscriber (on every replica) sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub channel: String,
    pub message: String,
}

/// The operations latchkey needs from durable, shared state. Every method is atomic on its own.
///
/// Names (`ns`, `id`, `key`, `queue`, `channel`) are short ASCII strings chosen by latchkey,
/// never by the sandbox; documents are JSON bytes. Expired records, counters and leases are
/// invisible to every read, whether or not the backend has purged them yet.
pub trait StateStore: Send + Sync + std::fmt::Debug + 'static {
    /// `sqlite:/path/state.db` or `redis://host:port/db` (never a password): for messages,
    /// `/status` and logs.
    fn describe(&self) -> &str;

    /// Stores `doc` under `ns`/`id` if nothing (unexpired) is there; `false` if something is.
    fn put_new<'a>(
        &'a self,
        ns: &'a str,
        id: &'a str,
        doc: &'a [u8],
        ttl: Option<Duration>,
    ) -> Fut<'a, bool>;

    /// Stores `doc` under `ns`/`id` whatever is there (version incremented).
    fn put<'a>(
        &'a self,
        ns: &'a str,
        id: &'a str,
        doc: &'a [u8],
        ttl: Option<Duration>,
    ) -> Fut<'a, ()>;

    /// The document under `ns`/`id`, if any and not expired.
    fn get<'a>(&'a self, ns: &'a str, id: &'a str) -> Fut<'a, Option<Versioned>>;

    /// Compare-and-set: replaces the document only if its version is still `version`; `false`
    /// if it changed, expired or is gone. `ttl` `None` keeps no expiry.
    fn replace<'a>(
        &'a self,
        ns: &'a str,
        id: &'a str,
        version: u64,
        doc: &'a [u8],
        ttl: Option<Duration>,
    ) -> Fut<'a, bool>;

    /// Removes `ns`/`id`; `true` if this call removed an unexpired document (so exactly one
    /// of several concurrent callers gets `true`: a one-time grant is consumed by deleting it).
    fn delete<'a>(&'a self, ns: &'a str, id: &'a str) -> Fut<'a, bool>;

    /// Up to `limit` unexpired documents in `ns`, newest first by write time.
    fn list<'a>(&'a self, ns: &'a str, limit: usize) -> Fut<'a, Vec<(String, Versioned)>>;

    /// Adds `delta` to counter `key` atomically, unless `limit` is `Some` and a positive `delta`
    /// would take it past the limit (then [`Added::Over`], unchanged). A negative `delta` (a
    /// release) is always applied and never goes below zero. A counter created by this call
    /// expires after `ttl`; later adds keep that expiry.
    fn add<'a>(
        &'a self,
        key: &'a str,
        delta: i64,
        limit: Option<i64>,
        ttl: Duration,
    ) -> Fut<'a, Added>;

    /// The current value of counter `key` (0 when absent or expired).
    fn counter<'a>(&'a self, key: &'a str) -> Fut<'a, i64>;

    /// Takes one token from token bucket `key`, which holds at most `burst` tokens and gets
    /// one back every `interval` (GCRA: the store keeps one "theoretical arrival time" per
    /// key, on the store's own clock, so replicas with skewed clocks share one bucket; the
    /// arithmetic is in `gcra.rs`). A new key starts full; an idle key vanishes once full.
    /// A refused take changes nothing. `burst` 0, an `interval` under 1 µs, or a bucket
    /// holding more than about 35 years (`burst × interval`) is a [`StateError::Backend`]
    /// naming the key.
    fn take<'a>(&'a self, key: &'a str, burst: u64, interval: Duration) -> Fut<'a, Taken>;

    /// Takes one of `max` slots of semaphore `key` for `holder` until `ttl` from now, or
    /// renews the slot `holder` already has (a renewal never takes a second slot, and is
    /// granted even if `max` was lowered below the slots held). `Some(n)`: `n` slots are now
    /// held, this one included; `None`: all `max` are held by others (nothing changed). A
    /// holder that dies loses its slot when `ttl` passes, on the store's clock. `max` 0 or a
    /// `ttl` under 1 ms is a [`StateError::Backend`] naming the key.
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
        max: u64,
        ttl: Duration,
    ) -> Fut<'a, Option<u64>>;

    /// Gives `holder`'s slot of semaphore `key` back (nothing if it has none). A semaphore
    /// with no slot held leaves nothing behind in the store.
    fn relinquish<'a>(&'a self, key: &'a str, holder: &'a str) -> Fut<'a, ()>;

    /// How many unexpired slots semaphore `key` holds now (0 for an unknown key).
    fn holders<'a>(&'a self, key: &'a str) -> Fut<'a, u64>;

    /// Takes lease `key` for `holder` for `ttl`, or renews it if `holder` already has it;
    /// `false` if another holder has it.
    fn lease<'a>(&'a self, key: &'a str, holder: &'a str, ttl: Duration) -> Fut<'a, bool>;

    /// Gives lease `key` up, if `holder` has it.
    fn release<'a>(&'a self, key: &'a str, holder: &'a str) -> Fut<'a, ()>;

    /// Adds (or replaces) item `id` in `queue`, due at `due`.
    fn enqueue<'a>(
        &'a self,
        queue: &'a str,
        id: &'a str,
        doc: &'a [u8],
        due: SystemTime,
    ) -> Fut<'a, ()>;

    /// Up to `max` items of `queue` due at or before `now`, oldest due first; each is moved to
    /// `now + lease` (and its attempt count incremented) in the same step, so two claimers
    /// never get the same item and an item whose claimer dies is claimed again later.
    fn claim<'a>(
        &'a self,
        queue: &'a str,
        now: SystemTime,
        lease: Duration,
        max: usize,
    ) -> Fut<'a, Vec<Claimed>>;

    /// Moves item `id` of `queue` to `due` (a retry after a failed delivery).
    fn reschedule<'a>(&'a self, queue: &'a str, id: &'a str, due: SystemTime) -> Fut<'a, ()>;

    /// Removes item `id` from `queue`: delivered (or given up).
    fn ack<'a>(&'a self, queue: &'a str, id: &'a str) -> Fut<'a, ()>;

    /// How many items `queue` holds (due or not): for `/status` and metrics.
    fn queue_len<'a>(&'a self, queue: &'a str) -> Fut<'a, u64>;

    /// Publishes `message` on `channel` to every subscriber of every process sharing the store
    /// (Redis); in-process subscribers only for SQLite, whose waiters poll as well.
    fn publish<'a>(&'a self, channel: &'a str, message: &'a str) -> Fut<'a, ()>;

    /// Every event published from now on, on every channel. A lagging receiver loses the oldest
    /// events (waiters poll too).
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event>;
}

/// The longest semaphore slot accepted, in milliseconds (about 35 years): beyond it a slot
/// would never expire in practice, and Redis keeps scores as doubles.
const MAX_SLOT_TTL_MS: u128 = 1 << 40;

/// Checks a semaphore's `max` and `ttl` (the same rules in both backends): the slot's time to
/// live in milliseconds, or a [`StateError::Backend`] naming `store` and `key`.
fn slot_ttl_ms(store: &str, key: &str, max: u64, ttl: Duration) -> Result<i64, StateError> {
    let bad = |why: String| StateError::Backend {
        store: store.to_string(),
        message: format!("semaphore {key:?}: {why}"),
    };
    if max == 0 {
        return Err(bad("max must be at least 1".to_string()));
    }
    match ttl.as_millis() {
        0 => Err(bad(format!("ttl must be at least 1 ms (got {ttl:?})"))),
        ms if ms > MAX_SLOT_TTL_MS => Err(bad(format!("ttl {ttl:?} is more than 35 years"))),
        ms => Ok(ms as i64),
    }
}

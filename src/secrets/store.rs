//! Secret sources and the store that holds their current (and recently retired) values.
//!
//! - `env:VAR`: read once at load; a missing or empty variable is a load error.
//! - `file:PATH`: read at load and re-read whenever the file's modification time or size
//!   changes (checked on use), so rotation needs no restart.
//! - `exec:COMMAND`: run with `sh -c` on first use; its stdout (one trailing newline trimmed) is
//!   the value, cached for `ttl` and refreshed in the background once 80 % of it has passed;
//!   bounded by `timeout` (on timeout, or if the request waiting for it goes away, the helper's
//!   whole process group is killed, not only `sh`). Its stderr goes to latchkey's log (with the
//!   value scrubbed), never to the sandbox.
//!
//! # The redaction set
//!
//! Every value latchkey has handed out is looked for in responses: each secret's current value,
//! values latchkey minted itself ([`SecretStore::set_minted`]: tokens, keys unpacked from a key
//! file), and values no longer in use, which stay for [`RETIRED_KEEP`] after they were last
//! handed out, so an upstream that reflects an old key is still scrubbed. Minted values are
//! kept by (name, key) — the key is the host and/or identity a JWT's claims use — so handing
//! out a value already in the set changes nothing. The set is bounded:
//! - at most [`MAX_LIVE_PER_NAME`] minted values per name are *live* (one per key); a new key
//!   past that retires the least recently used one;
//! - retired values leave after [`RETIRED_KEEP`], and earlier when there are more than
//!   [`MAX_RETIRED_PER_NAME`] under one name or [`MAX_RETIRED`] in all (oldest first);
//! - a live minted value not handed out for [`RETIRED_KEEP`] leaves too.
//!
//! A value handed out again after it left is added again before it leaves latchkey, so the
//! response to the request carrying it is always scanned for it.
//!
//! The set has a generation, bumped whenever its content changes; [`SecretStore::scrubber`]
//! rebuilds the matcher once per change (single flight: concurrent callers wait for that one
//! build, never build their own), and never returns a matcher built before the last *addition*
//! it could have seen — so a caller always gets one that holds every value handed out before it
//! asked. A change that only removed values leaves the previous matcher usable (it looks for a
//! superset); the caller that removed them rebuilds, and nobody waits for it.
//!
//! A reload builds a new store; [`SecretStore::carry_over_from`] moves the old store's values
//! into it (current ones as retired), and values the old store hands out afterwards (requests
//! still running on the old policy) are added to the new one as well.
//!
//! Error messages name secrets, never values.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwapOption;
use tokio::io::AsyncReadExt;

use super::scrub::{ScrubError, ScrubSecret, Scrubber};
use super::SecretValue;

/// How long a value is still redacted after it was last handed out (or rotated out).
pub const RETIRED_KEEP: Duration = Duration::from_secs(3600);
/// Shortest accepted secret: shorter values would match noise when redacting.
pub const MIN_SECRET_LEN: usize = 8;
/// Live minted values per name (one per host/identity key); past it the least recently used
/// one is retired.
pub const MAX_LIVE_PER_NAME: usize = 64;
/// Retired values kept per name; past it the oldest leaves the redaction set early.
pub const MAX_RETIRED_PER_NAME: usize = 32;
/// Retired values kept in all; past it the oldest leaves the redaction set early.
pub const MAX_RETIRED: usize = 256;
/// The most bytes an exec helper may print on stdout (and the most of its stderr logged).
const HELPER_OUTPUT_LIMIT: usize = 64 * 1024;

/// Where a secret's value comes from. `Debug` leaves the command out: an operator may have
/// written a value into it.
#[derive(Clone, PartialEq, Eq)]
pub enum Source {
    Env(String),
    File(PathBuf),
    Exec {
        command: String,
        ttl: Duration,
        timeout: Duration,
    },
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Env(var) => f.debug_tuple("Env").field(var).finish(),
            Source::File(path) => f.debug_tuple("File").field(path).finish(),
            Source::Exec {
                command,
                ttl,
                timeout,
            } => f
                .debug_struct("Exec")
                .field("command", &format_args!("<{} bytes>", command.len()))
                .field("ttl", ttl)
                .field("timeout", timeout)
                .finish(),
        }
    }
}

impl Source {
    /// Parses `env:VAR`, `file:PATH` or `exec:COMMAND`.
    pub fn parse(spec: &str, ttl: Duration, timeout: Duration) -> Result<Self, String> {
        // Never echo the spec: a value written inline by mistake may be the secret itself.
        let (kind, rest) = spec
            .split_once(':')
            .ok_or_else(|| "the value is not env:VAR, file:PATH or exec:COMMAND".to_string())?;
        if rest.trim().is_empty() {
            return Err(format!("{kind}: needs a value after the colon"));
        }
        match kind {
            "env" => Ok(Source::Env(rest.to_string())),
            "file" => Ok(Source::File(PathBuf::from(rest))),
            "exec" => Ok(Source::Exec {
                command: rest.to_string(),
                ttl,
                timeout,
            }),
            // Name the kind only when it looks like one (a short lowercase word), so an inline
            // value such as `user:password` is never echoed even in part.
            k if k.len() <= 12 && k.bytes().all(|b| b.is_ascii_lowercase()) => Err(format!(
                "unknown source kind {k:?}: use env:VAR, file:PATH or exec:COMMAND"
            )),
            _ => Err(
                "unknown source kind before ':': use env:VAR, file:PATH or exec:COMMAND"
                    .to_string(),
            ),
        }
    }
}

/// A secret could not be produced. Never carries a value.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("unknown secret {0:?}")]
    Unknown(String),
    #[error("secret {name:?} is unavailable: {why}")]
    Unavailable { name: String, why: String },
}

/// Trims one trailing `\n` or `\r\n`, as files and helpers usually end with one.
fn trim_newline(mut v: Vec<u8>) -> Vec<u8> {
    if v.last() == Some(&b'\n') {
        v.pop();
        if v.last() == Some(&b'\r') {
            v.pop();
        }
    }
    v
}

fn check_value(v: Vec<u8>) -> Result<SecretValue, String> {
    let v = SecretValue::new(trim_newline(v));
    if v.is_empty() {
        return Err("the value is empty".to_string());
    }
    if v.len() < MIN_SECRET_LEN {
        return Err(format!(
            "the value is shorter than {MIN_SECRET_LEN} bytes, too short to redact reliably"
        ));
    }
    Ok(v)
}

fn file_stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data: a panic elsewhere while it was locked leaves it usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A minted value in use under one key, and when it was last handed out.
struct Live {
    value: SecretValue,
    used: Instant,
}

/// A value no longer current, and when it stopped being handed out.
struct Retired {
    name: Arc<str>,
    value: SecretValue,
    at: Instant,
}

/// How the redaction set changed. An addition makes every older matcher unsafe (it would miss
/// the value); a removal does not (an older matcher only looks for more).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Change {
    added: bool,
    removed: bool,
}

impl std::ops::BitOrAssign for Change {
    fn bitor_assign(&mut self, other: Change) {
        self.added |= other.added;
        self.removed |= other.removed;
    }
}

/// The redaction set, apart from the sources' current values (which live in their slots).
#[derive(Default)]
struct Values {
    /// Minted values in use, by name, then by key (host/identity; `""` for one per name).
    live: HashMap<Arc<str>, HashMap<String, Live>>,
    /// Values no longer current, ordered by `at`, oldest first.
    retired: VecDeque<Retired>,
}

impl Values {
    fn retired_index(&self, name: &str, value: &SecretValue) -> Option<usize> {
        self.retired
            .iter()
            .position(|r| &*r.name == name && &r.value == value)
    }

    fn is_live(&self, name: &str, value: &SecretValue) -> bool {
        self.live
            .get(name)
            .is_some_and(|m| m.values().any(|l| &l.value == value))
    }

    /// Adds a retired value (a known one keeps the later of its two times). A value moved here
    /// from the live set (or a slot) was in the set already: then only an eviction the caps
    /// force is a change.
    fn retire(&mut self, name: &Arc<str>, value: SecretValue, at: Instant) -> Change {
        if self.is_live(name, &value) {
            return Change::default();
        }
        if let Some(i) = self.retired_index(name, &value) {
            if self.retired[i].at < at {
                if let Some(mut r) = self.retired.remove(i) {
                    r.at = at;
                    self.insert_retired(r);
                }
            }
            return Change::default();
        }
        self.insert_retired(Retired {
            name: name.clone(),
            value,
            at,
        });
        Change {
            added: true,
            removed: self.enforce_retired_caps(name),
        }
    }

    /// [`Values::retire`] of a value that was in the set already (a live or current value
    /// being replaced): only the evictions count.
    fn demote(&mut self, name: &Arc<str>, value: SecretValue, at: Instant) -> Change {
        Change {
            added: false,
            removed: self.retire(name, value, at).removed,
        }
    }

    fn insert_retired(&mut self, r: Retired) {
        let i = self.retired.partition_point(|x| x.at <= r.at);
        self.retired.insert(i, r);
    }

    /// Drops the oldest retired values past [`MAX_RETIRED_PER_NAME`] and [`MAX_RETIRED`].
    fn enforce_retired_caps(&mut self, name: &str) -> bool {
        let mut evicted = false;
        let mut of_name = self.retired.iter().filter(|r| &*r.name == name).count();
        while of_name > MAX_RETIRED_PER_NAME {
            match self.retired.iter().position(|r| &*r.name == name) {
                Some(i) => {
                    self.retired.remove(i);
                    of_name -= 1;
                    evicted = true;
                }
                None => break,
            }
        }
        while self.retired.len() > MAX_RETIRED {
            self.retired.pop_front();
            evicted = true;
        }
        evicted
    }

    /// Records that `value` is handed out under (`name`, `key`). No change when the key
    /// already holds it (the common case, a cached token).
    fn mint(&mut self, name: &str, key: &str, value: &SecretValue, now: Instant) -> Change {
        if let Some(l) = self.live.get_mut(name).and_then(|m| m.get_mut(key)) {
            if &l.value == value {
                l.used = now;
                return Change::default();
            }
        }
        // Known already (live under another key, or retired and now back in use)?
        let mut change = Change {
            added: !self.is_live(name, value),
            removed: false,
        };
        if let Some(i) = self.retired_index(name, value) {
            self.retired.remove(i);
            change.added = false;
        }
        let name: Arc<str> = match self.live.get_key_value(name) {
            Some((n, _)) => n.clone(),
            None => Arc::from(name),
        };
        let per = self.live.entry(name.clone()).or_default();
        let old = per.insert(
            key.to_string(),
            Live {
                value: value.clone(),
                used: now,
            },
        );
        // Past the per-name cap, the least recently used key's value is retired.
        let mut demoted = Vec::new();
        while per.len() > MAX_LIVE_PER_NAME {
            let Some(lru) = per
                .iter()
                .filter(|(k, _)| k.as_str() != key)
                .min_by_key(|(_, l)| l.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(l) = per.remove(&lru) {
                demoted.push(l);
            }
        }
        if let Some(old) = old {
            change |= self.demote(&name, old.value, now);
        }
        for l in demoted {
            change |= self.demote(&name, l.value, l.used);
        }
        change
    }

    /// Removes what has been out of use for [`RETIRED_KEEP`]. Returns whether anything left,
    /// and when the next value is due to.
    fn sweep(&mut self, now: Instant) -> (bool, Option<Instant>) {
        let before = self.retired.len();
        self.retired
            .retain(|r| now.duration_since(r.at) < RETIRED_KEEP);
        let mut changed = self.retired.len() != before;
        for per in self.live.values_mut() {
            let n = per.len();
            per.retain(|_, l| now.duration_since(l.used) < RETIRED_KEEP);
            changed |= per.len() != n;
        }
        self.live.retain(|_, per| !per.is_empty());
        let next = self
            .retired
            .front()
            .map(|r| r.at)
            .into_iter()
            .chain(self.live.values().flat_map(|m| m.values().map(|l| l.used)))
            .min()
            .map(|t| t + RETIRED_KEEP);
        (changed, next)
    }

    fn count(&self) -> usize {
        self.retired.len() + self.live.values().map(HashMap::len).sum::<usize>()
    }
}

/// What the store and its background refreshes share.
struct Shared {
    values: Mutex<Values>,
    /// Bumped (with `values` locked) whenever the redaction set changes.
    generation: AtomicU64,
    /// Bumped (with `values` locked, after the value is in) whenever a value is added: a
    /// matcher built before the last addition may miss a value handed out.
    added: AtomicU64,
    /// When the next value is due to leave the set, in milliseconds since `epoch` (`u64::MAX`:
    /// none is).
    next_sweep_ms: AtomicU64,
    epoch: Instant,
    /// The store a reload replaced this one with: values handed out here afterwards are
    /// added there too, so the new policy still redacts them.
    successor: Mutex<Weak<Shared>>,
}

impl Shared {
    fn new(generation: u64) -> Self {
        Self {
            values: Mutex::new(Values::default()),
            generation: AtomicU64::new(generation),
            added: AtomicU64::new(0),
            next_sweep_ms: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            successor: Mutex::new(Weak::new()),
        }
    }

    /// Records a change of the set; call it with `values` locked.
    fn bump(&self, change: Change) {
        if change.added {
            self.added.fetch_add(1, Ordering::AcqRel);
        }
        if change.added || change.removed {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Lowers the next sweep time to `at` if it is earlier.
    fn sweep_by(&self, at: Instant) {
        let ms = u64::try_from(at.saturating_duration_since(self.epoch).as_millis())
            .unwrap_or(u64::MAX - 1);
        self.next_sweep_ms.fetch_min(ms, Ordering::AcqRel);
    }

    fn successor(&self) -> Option<Arc<Shared>> {
        lock(&self.successor).upgrade()
    }

    fn mint(&self, name: &str, key: &str, value: &SecretValue) {
        let now = Instant::now();
        let mut v = lock(&self.values);
        let change = v.mint(name, key, value, now);
        self.bump(change);
        drop(v);
        self.sweep_by(now + RETIRED_KEEP);
        if let Some(next) = self.successor() {
            next.mint(name, key, value);
        }
    }

    /// Adds a value to the set as retired now (a value a replaced store handed out).
    fn remember(&self, name: &str, value: &SecretValue) {
        let now = Instant::now();
        let mut v = lock(&self.values);
        let change = v.retire(&Arc::from(name), value.clone(), now);
        self.bump(change);
        drop(v);
        self.sweep_by(now + RETIRED_KEEP);
        if let Some(next) = self.successor() {
            next.remember(name, value);
        }
    }

    /// Drops values out of use for [`RETIRED_KEEP`], when one is due. Returns whether any
    /// left the set.
    fn sweep_if_due(&self) -> bool {
        let due = self.next_sweep_ms.load(Ordering::Acquire);
        if due == u64::MAX || self.epoch.elapsed().as_millis() < u128::from(due) {
            return false;
        }
        self.sweep_at(Instant::now())
    }

    fn sweep_at(&self, now: Instant) -> bool {
        let mut v = lock(&self.values);
        let (removed, next) = v.sweep(now);
        self.bump(Change {
            added: false,
            removed,
        });
        self.next_sweep_ms.store(u64::MAX, Ordering::Release);
        if let Some(next) = next {
            self.sweep_by(next);
        }
        drop(v);
        removed
    }
}

#[derive(Default)]
struct State {
    current: Option<SecretValue>,
    fetched: Option<Instant>,
    stamp: Option<(SystemTime, u64)>,
    refreshing: bool,
}

struct Slot {
    name: String,
    source: Source,
    state: Mutex<State>,
    /// Single flight for exec helpers: N concurrent first uses run the helper once.
    fetch: tokio::sync::Mutex<()>,
}

/// A built matcher and the generation of the redaction set it covers.
struct Built {
    generation: u64,
    /// The additions counter when it was built: it holds every value added up to it.
    added: u64,
    scrubber: Option<Arc<Scrubber>>,
}

/// Counts describing the redaction set (for tests, benchmarks and metrics). No values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedactionStats {
    /// Bumped whenever the set of values changes.
    pub generation: u64,
    /// Minted and retired values in the set (sources' current values not counted).
    pub values: usize,
    /// Matchers built so far.
    pub builds: u64,
}

/// All secrets of a policy, by name.
pub struct SecretStore {
    slots: HashMap<String, Arc<Slot>>,
    shared: Arc<Shared>,
    /// The matcher of the newest generation built.
    built: ArcSwapOption<Built>,
    /// Single flight for matcher builds.
    building: Mutex<()>,
    builds: AtomicU64,
}

impl std::fmt::Debug for SecretStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.slots.keys().collect();
        names.sort();
        f.debug_struct("SecretStore")
            .field("names", &names)
            .finish_non_exhaustive()
    }
}

impl SecretStore {
    /// An empty store.
    pub fn empty() -> Self {
        Self::with_slots(HashMap::new())
    }

    fn with_slots(slots: HashMap<String, Arc<Slot>>) -> Self {
        Self {
            slots,
            shared: Arc::new(Shared::new(0)),
            built: ArcSwapOption::empty(),
            building: Mutex::new(()),
            builds: AtomicU64::new(0),
        }
    }

    /// Builds the store, reading `env:` and `file:` sources now. Returns every failure by name.
    pub fn load(sources: Vec<(String, Source)>) -> Result<Self, Vec<(String, String)>> {
        let mut errors = Vec::new();
        let mut slots = HashMap::new();
        for (name, source) in sources {
            let mut state = State::default();
            // exec helpers run on first use, not at load.
            let loaded = match &source {
                Source::Env(var) => Some(match std::env::var_os(var) {
                    None => Err(format!("env var {var} is not set")),
                    Some(v) => check_value(v.into_encoded_bytes())
                        .map_err(|e| format!("env var {var}: {e}")),
                }),
                Source::File(path) => Some(match std::fs::read(path) {
                    Ok(v) => {
                        state.stamp = file_stamp(path);
                        check_value(v).map_err(|e| format!("file {}: {e}", path.display()))
                    }
                    Err(e) => Err(format!("cannot read {}: {e}", path.display())),
                }),
                Source::Exec { .. } => None,
            };
            match loaded {
                Some(Ok(v)) => {
                    state.current = Some(v);
                    state.fetched = Some(Instant::now());
                }
                Some(Err(e)) => errors.push((name.clone(), e)),
                None => {}
            }
            slots.insert(
                name.clone(),
                Arc::new(Slot {
                    name,
                    source,
                    state: Mutex::new(state),
                    fetch: tokio::sync::Mutex::new(()),
                }),
            );
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Self::with_slots(slots))
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.slots.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.slots.keys().map(String::as_str)
    }

    /// The current value of a secret, fetching or refreshing it as its source requires.
    pub async fn get(&self, name: &str) -> Result<SecretValue, SecretError> {
        let slot = self
            .slots
            .get(name)
            .ok_or_else(|| SecretError::Unknown(name.to_string()))?;
        match &slot.source {
            Source::Env(_) => slot.current().ok_or_else(|| slot.unavailable("not loaded")),
            Source::File(path) => self.get_file(slot, path),
            Source::Exec { ttl, timeout, .. } => self.get_exec(slot, *ttl, *timeout).await,
        }
    }

    fn get_file(&self, slot: &Slot, path: &Path) -> Result<SecretValue, SecretError> {
        let stamp = file_stamp(path);
        {
            let st = slot.lock();
            if stamp.is_some() && st.stamp == stamp {
                if let Some(v) = &st.current {
                    return Ok(v.clone());
                }
            }
        }
        // Changed (or unreadable): re-read. Failing closed: an unreadable file is no value.
        let bytes = std::fs::read(path)
            .map_err(|e| slot.unavailable(&format!("cannot read {}: {e}", path.display())))?;
        let value = check_value(bytes).map_err(|e| slot.unavailable(&e))?;
        if slot.replace(value.clone(), stamp, &self.shared) {
            tracing::info!(secret = %slot.name, "secret file changed; new value in use");
        }
        Ok(value)
    }

    async fn get_exec(
        &self,
        slot: &Arc<Slot>,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<SecretValue, SecretError> {
        if let Some(v) = self.fresh_exec(slot, ttl) {
            return Ok(v);
        }
        let _flight = slot.fetch.lock().await;
        // Another caller may have fetched while we waited.
        if let Some(v) = self.fresh_exec(slot, ttl) {
            return Ok(v);
        }
        let value = run_helper(slot, timeout).await?;
        slot.replace(value.clone(), None, &self.shared);
        Ok(value)
    }

    /// A cached exec value that is still within its TTL; starts a background refresh once 80 %
    /// of the TTL has passed.
    fn fresh_exec(&self, slot: &Arc<Slot>, ttl: Duration) -> Option<SecretValue> {
        let mut st = slot.lock();
        let (value, fetched) = (st.current.clone()?, st.fetched?);
        let age = fetched.elapsed();
        if age >= ttl {
            return None;
        }
        if age >= ttl.mul_f32(0.8) && !st.refreshing {
            st.refreshing = true;
            let slot = slot.clone();
            let shared = self.shared.clone();
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let timeout = match &slot.source {
                        Source::Exec { timeout, .. } => *timeout,
                        _ => Duration::from_secs(10),
                    };
                    let _flight = slot.fetch.lock().await;
                    match run_helper(&slot, timeout).await {
                        Ok(v) => {
                            slot.replace(v, None, &shared);
                        }
                        Err(e) => tracing::warn!(secret = %slot.name, error = %e, "background refresh failed; the cached value stays until it expires"),
                    }
                    slot.lock().refreshing = false;
                });
            }
        }
        Some(value)
    }

    /// Records that latchkey hands out `value`, a value it made (a minted token, a key
    /// unpacked from a key file), under `name` for `key` (the host and/or identity it was
    /// made for; `""` when there is one per name). Call it before the value leaves latchkey:
    /// a [`SecretStore::scrubber`] obtained afterwards looks for it. Handing out the value the
    /// key already holds changes nothing; a new one retires the key's previous value. Values
    /// shorter than [`MIN_SECRET_LEN`] are not tracked (they would match noise).
    pub fn set_minted(&self, name: &str, key: &str, value: &SecretValue) {
        if value.len() < MIN_SECRET_LEN {
            return;
        }
        self.shared.mint(name, key, value);
    }

    /// Moves the redaction set of the store a reload replaces into this one: its secrets'
    /// values (as retired now, unless still current here), its retired values (keeping their
    /// times) and its minted values (still live under their keys unless this store already
    /// has a value there). Values `old` hands out from now on are added here too.
    pub fn carry_over_from(&self, old: &SecretStore) {
        if Arc::ptr_eq(&self.shared, &old.shared) {
            return;
        }
        // First the forwarding, then the snapshot: a value `old` hands out meanwhile is in one
        // or the other (or both: adding a value twice changes nothing).
        *lock(&old.shared.successor) = Arc::downgrade(&self.shared);
        let now = Instant::now();
        let old_current: Vec<(Arc<str>, SecretValue)> = old
            .slots
            .values()
            .filter_map(|s| s.current().map(|v| (Arc::from(s.name.as_str()), v)))
            .collect();
        let (live, retired) = {
            let v = lock(&old.shared.values);
            let live: Vec<(Arc<str>, String, SecretValue, Instant)> = v
                .live
                .iter()
                .flat_map(|(name, per)| {
                    per.iter()
                        .map(|(key, l)| (name.clone(), key.clone(), l.value.clone(), l.used))
                })
                .collect();
            let retired: Vec<(Arc<str>, SecretValue, Instant)> = v
                .retired
                .iter()
                .map(|r| (r.name.clone(), r.value.clone(), r.at))
                .collect();
            (live, retired)
        };
        let still_current: Vec<(Arc<str>, SecretValue)> = old_current
            .into_iter()
            .filter(|(name, value)| {
                self.slots.get(&**name).and_then(|s| s.current()).as_ref() != Some(value)
            })
            .collect();
        let mut v = lock(&self.shared.values);
        for (name, key, value, used) in live {
            if v.live.get(&*name).is_some_and(|m| m.contains_key(&key)) {
                v.retire(&name, value, used);
            } else {
                v.mint(&name, &key, &value, used);
            }
        }
        for (name, value, at) in retired {
            v.retire(&name, value, at);
        }
        for (name, value) in still_current {
            v.retire(&name, value, now);
        }
        let (_, next) = v.sweep(now);
        self.shared.bump(Change {
            added: true,
            removed: true,
        });
        if let Some(next) = next {
            self.shared.sweep_by(next);
        }
        drop(v);
    }

    /// Counts describing the redaction set.
    pub fn redaction_stats(&self) -> RedactionStats {
        RedactionStats {
            generation: self.shared.generation.load(Ordering::Acquire),
            values: lock(&self.shared.values).count(),
            builds: self.builds.load(Ordering::Relaxed),
        }
    }

    /// The matcher built last, if it is safe for a caller that saw `added` additions (it
    /// misses no value added before) and, when `generation` is given, also current.
    fn usable(&self, added: u64, generation: Option<u64>) -> Option<Option<Arc<Scrubber>>> {
        let built = self.built.load();
        built
            .as_ref()
            .filter(|b| b.added >= added && generation.is_none_or(|g| b.generation >= g))
            .map(|b| b.scrubber.clone())
    }

    /// The scrubber over every value in the redaction set (see the module docs), holding at
    /// least every value handed out before this call. `Ok(None)` when no value is loaded. An
    /// error means values are loaded but cannot be searched for: callers must refuse rather
    /// than pass data unscanned.
    ///
    /// Built once per change of the set: while one caller builds, the others wait for it (a
    /// few milliseconds on a thread, once per new value) rather than build their own. A change
    /// that only removed values (they were out of use for [`RETIRED_KEEP`]) keeps the previous
    /// matcher usable — it only looks for more — so then only the caller that removed them
    /// rebuilds, and nobody waits for it.
    pub fn scrubber(&self) -> Result<Option<Arc<Scrubber>>, ScrubError> {
        let swept = self.shared.sweep_if_due();
        let added = self.shared.added.load(Ordering::Acquire);
        let current = swept.then(|| self.shared.generation.load(Ordering::Acquire));
        if let Some(s) = self.usable(added, current) {
            return Ok(s);
        }
        let _one_build = lock(&self.building);
        if let Some(s) = self.usable(added, current) {
            return Ok(s);
        }
        // Read the counters before the values: the matcher then holds at least what they
        // stand for (a value is in before they are bumped).
        let generation = self.shared.generation.load(Ordering::Acquire);
        let added = self.shared.added.load(Ordering::Acquire);
        let mut values: Vec<(Arc<str>, SecretValue)> = Vec::new();
        for slot in self.slots.values() {
            if let Some(v) = slot.current() {
                values.push((Arc::from(slot.name.as_str()), v));
            }
        }
        {
            let v = lock(&self.shared.values);
            for (name, per) in &v.live {
                values.extend(per.values().map(|l| (name.clone(), l.value.clone())));
            }
            values.extend(v.retired.iter().map(|r| (r.name.clone(), r.value.clone())));
        }
        let scrubber = if values.is_empty() {
            None
        } else {
            let secrets: Vec<ScrubSecret<'_>> = values
                .iter()
                .map(|(name, v)| ScrubSecret {
                    name,
                    value: v.expose(),
                })
                .collect();
            // Values are length-checked on load, so a failure here is a bug: report it, and
            // let the caller refuse (never fall back to a scanner that misses the newest).
            Some(Arc::new(Scrubber::new(&secrets).inspect_err(|e| {
                tracing::error!(error = %e, "cannot build the redaction scanner");
            })?))
        };
        self.builds.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(generation, values = values.len(), "redaction matcher built");
        self.built.store(Some(Arc::new(Built {
            generation,
            added,
            scrubber: scrubber.clone(),
        })));
        Ok(scrubber)
    }
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn current(&self) -> Option<SecretValue> {
        self.lock().current.clone()
    }

    fn unavailable(&self, why: &str) -> SecretError {
        SecretError::Unavailable {
            name: self.name.clone(),
            why: why.to_string(),
        }
    }

    /// Installs a new value; the old one is retired (still redacted for a while). Returns
    /// whether the value changed.
    fn replace(
        &self,
        value: SecretValue,
        stamp: Option<(SystemTime, u64)>,
        shared: &Shared,
    ) -> bool {
        let now = Instant::now();
        let mut st = self.lock();
        st.fetched = Some(now);
        st.stamp = stamp;
        if st.current.as_ref() == Some(&value) {
            return false;
        }
        let name: Arc<str> = Arc::from(self.name.as_str());
        // Lock order: a slot's state, then the values (the matcher build never holds both).
        let mut v = lock(&shared.values);
        let mut change = Change {
            added: true,
            removed: false,
        };
        if let Some(i) = v.retired_index(&name, &value) {
            v.retired.remove(i);
            change.added = false;
        }
        if let Some(old) = st.current.replace(value.clone()) {
            // In the set already (as the current value).
            change |= v.demote(&name, old, now);
        }
        shared.bump(change);
        drop(v);
        drop(st);
        shared.sweep_by(now + RETIRED_KEEP);
        if let Some(next) = shared.successor() {
            next.remember(&self.name, &value);
        }
        true
    }
}

/// Kills a helper's process group when dropped, unless disarmed: on timeout, on an output
/// overrun, and when the request waiting for the helper goes away. Declared after the child,
/// so it runs before the child is dropped and reaped: until then the group id is the id of a
/// process that still exists and cannot have been reused.
struct HelperGroup(Option<u32>);

impl HelperGroup {
    /// The helper exited and was reaped: its id may be reused from now on.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for HelperGroup {
    fn drop(&mut self) {
        let Some(pid) = self.0.take() else {
            return;
        };
        // Never 0 or 1 (`kill(-1)` signals every process).
        let pgid = i32::try_from(pid)
            .ok()
            .filter(|&p| p > 1)
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pgid) = pgid {
            // ESRCH: the group is already gone, which is what we want.
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
    }
}

/// Reads `from` to its end, keeping the first `limit` bytes in `into` (which has room for
/// them, so it never reallocates and leaves no unwiped copy). Returns whether more came.
async fn read_capped(
    mut from: impl tokio::io::AsyncRead + Unpin,
    into: &mut Vec<u8>,
    limit: usize,
    stop_when_over: bool,
) -> std::io::Result<bool> {
    let mut buf = zeroize::Zeroizing::new([0u8; 4096]);
    let mut over = false;
    loop {
        let n = from.read(&mut buf[..]).await?;
        if n == 0 {
            return Ok(over);
        }
        let room = limit.saturating_sub(into.len());
        into.extend_from_slice(&buf[..n.min(room)]);
        if n > room {
            over = true;
            if stop_when_over {
                return Ok(true);
            }
        }
    }
}

/// Runs an exec helper with a timeout; its stderr goes to the log with the value scrubbed.
async fn run_helper(slot: &Slot, timeout: Duration) -> Result<SecretValue, SecretError> {
    let Source::Exec { command, .. } = &slot.source else {
        return Err(slot.unavailable("not an exec source"));
    };
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        // Its own process group, so everything it starts can be killed with it.
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| slot.unavailable(&format!("cannot start helper: {e}")))?;
    let mut group = HelperGroup(child.id());
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(slot.unavailable("helper has no output pipes"));
    };
    // Sized up front (the limit plus one byte to tell an overrun): never reallocated.
    let mut stdout = zeroize::Zeroizing::new(Vec::with_capacity(HELPER_OUTPUT_LIMIT + 1));
    let mut stderr = zeroize::Zeroizing::new(Vec::with_capacity(HELPER_OUTPUT_LIMIT));
    let run = async {
        let read_out = async {
            match read_capped(out, &mut stdout, HELPER_OUTPUT_LIMIT, true).await {
                Ok(false) => Ok(()),
                // Stop waiting: `group` kills the helper as it drops.
                Ok(true) => Err(format!(
                    "helper printed more than {HELPER_OUTPUT_LIMIT} bytes"
                )),
                Err(e) => Err(format!("cannot read helper output: {e}")),
            }
        };
        let read_err = async {
            read_capped(err, &mut stderr, HELPER_OUTPUT_LIMIT, false)
                .await
                .map_err(|e| format!("cannot read helper stderr: {e}"))
        };
        tokio::try_join!(read_out, read_err)?;
        child
            .wait()
            .await
            .map_err(|e| format!("helper failed: {e}"))
    };
    let status = match tokio::time::timeout(timeout, run).await {
        Ok(Ok(status)) => {
            group.disarm();
            status
        }
        // `group` kills the helper and everything it started as it drops.
        Ok(Err(why)) => return Err(slot.unavailable(&why)),
        Err(_) => {
            return Err(slot.unavailable(&format!(
                "helper did not finish within {}s",
                timeout.as_secs_f32()
            )))
        }
    };
    // An exact-size copy; the buffer it came from is wiped as it drops.
    let value = zeroize::Zeroizing::new(trim_newline(stdout.to_vec()));
    drop(stdout);
    if !stderr.is_empty() {
        let raw = zeroize::Zeroizing::new(String::from_utf8_lossy(&stderr).into_owned());
        let text = match std::str::from_utf8(&value) {
            Ok(v) if !v.is_empty() => raw.replace(v, &format!("[REDACTED:{}]", slot.name)),
            _ => raw.to_string(),
        };
        tracing::warn!(secret = %slot.name, stderr = %text.trim_end(), "secret helper wrote to stderr");
    }
    if !status.success() {
        return Err(slot.unavailable(&format!("helper exited with {status}")));
    }
    let mut value = value;
    check_value(std::mem::take(&mut *value))
        .map_err(|e| slot.unavailable(&format!("helper output: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "sk-test-0123456789abcdef";

    #[test]
    fn sources_parse_and_reject_unknown_kinds() {
        let d = Duration::from_secs(1);
        assert_eq!(Source::parse("env:X", d, d), Ok(Source::Env("X".into())));
        assert!(Source::parse("vault:x", d, d).is_err());
        assert!(Source::parse("env:", d, d).is_err());
        assert!(Source::parse("nothing", d, d).is_err());
    }

    #[test]
    fn a_missing_env_var_or_short_value_is_a_load_error_naming_it() {
        let e = SecretStore::load(vec![(
            "a".into(),
            Source::Env("LATCHKEY_TEST_SURELY_UNSET_VAR".into()),
        )])
        .expect_err("error");
        assert_eq!(e[0].0, "a");
        assert!(
            e[0].1.contains("LATCHKEY_TEST_SURELY_UNSET_VAR is not set"),
            "{e:?}"
        );
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("s");
        std::fs::write(&p, "short\n").expect("write");
        let e = SecretStore::load(vec![("b".into(), Source::File(p))]).expect_err("error");
        assert!(e[0].1.contains("shorter than 8"), "{e:?}");
    }

    #[tokio::test]
    async fn a_changed_file_is_picked_up_and_the_old_value_stays_redacted() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("s");
        std::fs::write(&p, format!("{SECRET}\n")).expect("write");
        let store = SecretStore::load(vec![("f".into(), Source::File(p.clone()))]).expect("load");
        assert!(store
            .get("f")
            .await
            .expect("value")
            .ct_eq(SECRET.as_bytes()));
        std::fs::write(&p, "sk-test-rotated-value-99").expect("write");
        assert!(store
            .get("f")
            .await
            .expect("value")
            .ct_eq(b"sk-test-rotated-value-99"));
        let s = store.scrubber().expect("scrubber").expect("values");
        let (out, names) = s.scrub(format!("old {SECRET} new sk-test-rotated-value-99").as_bytes());
        assert_eq!(names.len(), 2);
        assert!(!String::from_utf8_lossy(&out).contains("sk-test"));
    }

    #[tokio::test]
    async fn exec_helpers_are_cached_and_failures_name_the_secret_not_the_output() {
        let dir = tempfile::tempdir().expect("tmp");
        let counter = dir.path().join("n");
        let cmd = format!("echo x >> {}; echo {SECRET}", counter.display());
        let store = SecretStore::load(vec![
            (
                "e".into(),
                Source::Exec {
                    command: cmd,
                    ttl: Duration::from_secs(60),
                    timeout: Duration::from_secs(5),
                },
            ),
            (
                "bad".into(),
                Source::Exec {
                    command: "echo leaked-stderr >&2; exit 3".into(),
                    ttl: Duration::from_secs(60),
                    timeout: Duration::from_secs(5),
                },
            ),
            (
                "slow".into(),
                Source::Exec {
                    command: "sleep 5".into(),
                    ttl: Duration::from_secs(60),
                    timeout: Duration::from_millis(200),
                },
            ),
        ])
        .expect("load");
        let (a, b) = tokio::join!(store.get("e"), store.get("e"));
        assert!(a.expect("a").ct_eq(SECRET.as_bytes()));
        assert!(b.expect("b").ct_eq(SECRET.as_bytes()));
        assert!(store.get("e").await.is_ok());
        let runs = std::fs::read_to_string(&counter).expect("counter");
        assert_eq!(runs.lines().count(), 1, "helper ran more than once");
        let e = store.get("bad").await.expect_err("fails").to_string();
        assert!(e.contains("\"bad\"") && e.contains("exit"), "{e}");
        assert!(!e.contains("leaked-stderr"), "{e}");
        let e = store.get("slow").await.expect_err("times out").to_string();
        assert!(e.contains("within"), "{e}");
    }

    fn token(i: usize) -> SecretValue {
        SecretValue::new(format!("eyJ-minted-token-{i:06}-0123456789abcdef").into_bytes())
    }

    fn redacts(store: &SecretStore, value: &SecretValue) -> bool {
        let s = store.scrubber().expect("scrubber").expect("values");
        let mut text = b"reflected: ".to_vec();
        text.extend_from_slice(value.expose());
        let (out, names) = s.scrub(&text);
        !names.is_empty() && !out.windows(value.len()).any(|w| w == value.expose())
    }

    #[test]
    fn alternating_keys_neither_grow_the_set_nor_bump_the_generation() {
        let store = SecretStore::empty();
        let (a, b) = (token(1), token(2));
        store.set_minted("credential:jwt", "host-a", &a);
        store.set_minted("credential:jwt", "host-b", &b);
        assert!(redacts(&store, &a) && redacts(&store, &b));
        let before = store.redaction_stats();
        for i in 0..2_000 {
            let (key, v) = if i % 2 == 0 {
                ("host-a", &a)
            } else {
                ("host-b", &b)
            };
            store.set_minted("credential:jwt", key, v);
            store.scrubber().expect("scrubber");
        }
        let after = store.redaction_stats();
        assert_eq!(after.values, 2, "{after:?}");
        assert_eq!(after.generation, before.generation, "{after:?}");
        assert_eq!(
            after.builds, before.builds,
            "no rebuild without a new value"
        );
    }

    #[test]
    fn a_new_value_retires_the_old_one_and_retired_values_are_capped_oldest_first() {
        let store = SecretStore::empty();
        let n = MAX_RETIRED_PER_NAME + 20;
        for i in 0..n {
            store.set_minted("credential:gh", "", &token(i));
        }
        assert_eq!(
            store.redaction_stats().values,
            1 + MAX_RETIRED_PER_NAME,
            "one live value and the newest retired ones"
        );
        assert!(redacts(&store, &token(n - 1)), "the live value");
        assert!(redacts(&store, &token(n - 2)), "the newest retired value");
        assert!(redacts(&store, &token(n - MAX_RETIRED_PER_NAME - 1)));
        assert!(!redacts(&store, &token(0)), "the oldest left the set");
        // A retired value handed out again is live again, without a new generation.
        let g = store.redaction_stats().generation;
        store.set_minted("credential:gh", "", &token(n - 2));
        assert_eq!(store.redaction_stats().generation, g);
        assert_eq!(store.redaction_stats().values, 1 + MAX_RETIRED_PER_NAME);
    }

    #[test]
    fn live_values_per_name_and_retired_values_in_all_are_bounded() {
        let store = SecretStore::empty();
        // Many hosts under a wildcard, each with its own token.
        let hosts = MAX_LIVE_PER_NAME + MAX_RETIRED_PER_NAME;
        for i in 0..hosts {
            store.set_minted("credential:jwt", &format!("host-{i}"), &token(i));
        }
        let live = store.shared.values.lock().expect("lock").live["credential:jwt"].len();
        assert_eq!(live, MAX_LIVE_PER_NAME);
        // The least recently used were retired, not dropped.
        assert!(redacts(&store, &token(0)));
        assert!(redacts(&store, &token(hosts - 1)));
        // Cycling through them again adds nothing: each comes back from the retired values
        // and another goes there.
        let g = store.redaction_stats().generation;
        for i in 0..hosts {
            store.set_minted("credential:jwt", &format!("host-{i}"), &token(i));
        }
        assert_eq!(store.redaction_stats().generation, g);
        // One host more and the oldest retired value leaves the set.
        store.set_minted("credential:jwt", "host-new", &token(hosts));
        assert!(!redacts(&store, &token(0)));
        assert!(redacts(&store, &token(1)));
        for n in 0..(MAX_RETIRED / MAX_RETIRED_PER_NAME + 2) {
            for i in 0..MAX_RETIRED_PER_NAME + 1 {
                store.set_minted(
                    &format!("credential:c{n}"),
                    "",
                    &token(10_000 * (n + 1) + i),
                );
            }
        }
        let v = store.shared.values.lock().expect("lock");
        assert!(v.retired.len() <= MAX_RETIRED, "{}", v.retired.len());
        let live: usize = v.live.values().map(HashMap::len).sum();
        assert!(v.count() <= MAX_RETIRED + live);
    }

    #[test]
    fn values_out_of_use_for_the_retention_window_leave_the_set() {
        let mut v = Values::default();
        let t0 = Instant::now();
        let name: Arc<str> = Arc::from("credential:x");
        assert!(v.mint(&name, "k", &token(1), t0).added);
        assert!(
            v.mint(&name, "k", &token(2), t0 + Duration::from_secs(10))
                .added
        );
        assert_eq!(
            v.mint(&name, "k", &token(2), t0 + Duration::from_secs(20)),
            Change::default()
        );
        assert_eq!(v.count(), 2);
        let (changed, next) = v.sweep(t0 + Duration::from_secs(15));
        assert!(!changed);
        assert_eq!(next, Some(t0 + Duration::from_secs(10) + RETIRED_KEEP));
        // token 1 was retired at +10 s; token 2 last handed out at +20 s.
        let (changed, _) = v.sweep(t0 + Duration::from_secs(11) + RETIRED_KEEP);
        assert!(changed);
        assert_eq!(v.count(), 1);
        let (changed, next) = v.sweep(t0 + Duration::from_secs(21) + RETIRED_KEEP);
        assert!(changed && next.is_none());
        assert_eq!(v.count(), 0);
    }

    #[test]
    fn a_change_that_only_removes_values_keeps_the_old_matcher_and_makes_nobody_wait() {
        let store = SecretStore::empty();
        store.set_minted("credential:a", "", &token(1));
        store.set_minted("credential:a", "", &token(2));
        let first = store.scrubber().expect("scrubber").expect("values");
        let builds = store.redaction_stats().builds;
        // An hour on, both are out of use and leave the set.
        assert!(store
            .shared
            .sweep_at(Instant::now() + RETIRED_KEEP + Duration::from_secs(1)));
        assert_eq!(store.redaction_stats().values, 0);
        let again = store
            .scrubber()
            .expect("scrubber")
            .expect("the previous matcher");
        assert!(
            Arc::ptr_eq(&first, &again),
            "a superset is safe to keep using"
        );
        assert_eq!(store.redaction_stats().builds, builds);
        // A new value makes it unsafe: rebuilt, without the values that left.
        store.set_minted("credential:a", "", &token(3));
        assert!(redacts(&store, &token(3)));
        assert!(!redacts(&store, &token(1)));
        assert_eq!(store.redaction_stats().builds, builds + 1);
    }

    #[tokio::test]
    async fn a_reload_carries_retired_and_minted_values_over_and_later_ones_follow() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("s");
        std::fs::write(&p, SECRET).expect("write");
        let old = SecretStore::load(vec![("f".into(), Source::File(p.clone()))]).expect("load");
        std::fs::write(&p, "sk-test-rotated-value-99").expect("write");
        old.get("f").await.expect("rotated");
        old.set_minted("credential:jwt", "host-a", &token(1));
        old.set_minted("credential:jwt", "host-a", &token(2));
        let rotated = SecretValue::new(b"sk-test-rotated-value-99".to_vec());
        let first = SecretValue::new(SECRET.as_bytes().to_vec());

        let new = SecretStore::load(vec![("f".into(), Source::File(p.clone()))]).expect("load");
        new.carry_over_from(&old);
        for v in [&first, &rotated, &token(1), &token(2)] {
            assert!(redacts(&new, v));
        }
        // The minted value is still live under its key: handing it out changes nothing.
        let g = new.redaction_stats().generation;
        new.set_minted("credential:jwt", "host-a", &token(2));
        assert_eq!(new.redaction_stats().generation, g);
        // A request still running on the old policy hands out a new value: the new store
        // redacts it too.
        old.set_minted("credential:jwt", "host-b", &token(3));
        assert!(redacts(&new, &token(3)));
        // And a reload of the reload keeps all of it.
        let newer = SecretStore::empty();
        newer.carry_over_from(&new);
        for v in [&first, &rotated, &token(1), &token(2), &token(3)] {
            assert!(redacts(&newer, v));
        }
        old.set_minted("credential:jwt", "host-c", &token(4));
        assert!(redacts(&newer, &token(4)), "forwarded down the chain");
    }

    #[test]
    fn concurrent_callers_share_one_build_per_generation_and_always_see_earlier_values() {
        let store = Arc::new(SecretStore::empty());
        store.set_minted("credential:a", "", &token(0));
        store.scrubber().expect("scrubber");
        for round in 1..20usize {
            let builds = store.redaction_stats().builds;
            store.set_minted("credential:a", "", &token(round));
            let barrier = Arc::new(std::sync::Barrier::new(8));
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let (store, barrier) = (store.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        redacts(&store, &token(round))
                    })
                })
                .collect();
            for t in threads {
                assert!(
                    t.join().expect("join"),
                    "a caller got a matcher without the value"
                );
            }
            assert_eq!(store.redaction_stats().builds, builds + 1, "round {round}");
        }
    }

    #[test]
    fn debug_prints_no_value_and_no_command() {
        let store = SecretStore::empty();
        store.set_minted("credential:a", "k", &token(7));
        store.scrubber().expect("scrubber");
        let src = Source::Exec {
            command: "echo sk-inline-value-oops".into(),
            ttl: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
        };
        let printed = format!("{store:?} {store:#?} {src:?} {:?}", store.redaction_stats());
        assert!(!printed.contains("minted-token"), "{printed}");
        assert!(!printed.contains("sk-inline"), "{printed}");
    }

    /// Whether process `pid` is gone (or a zombie nobody has reaped yet: it runs no more).
    fn gone(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z')),
        }
    }

    fn wait_gone(pid: u32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if gone(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn pids(path: &Path) -> Vec<u32> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let pids: Vec<u32> = text
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            if pids.len() >= 2 || Instant::now() > deadline {
                return pids;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn exec(command: String, timeout: Duration) -> Source {
        Source::Exec {
            command,
            ttl: Duration::from_secs(60),
            timeout,
        }
    }

    #[tokio::test]
    async fn a_timed_out_helper_is_killed_with_everything_it_started() {
        let dir = tempfile::tempdir().expect("tmp");
        let pidfile = dir.path().join("pids");
        // A grandchild in the background (holding stdout open), and one in the foreground.
        let cmd = format!(
            "sleep 30 & echo $! > {p}; sh -c 'echo $$ >> {p}; exec sleep 30'",
            p = pidfile.display()
        );
        let store = SecretStore::load(vec![("e".into(), exec(cmd, Duration::from_millis(500)))])
            .expect("load");
        let e = store.get("e").await.expect_err("times out").to_string();
        assert!(e.contains("within"), "{e}");
        let pids = pids(&pidfile);
        assert_eq!(pids.len(), 2, "{pids:?}");
        for pid in pids {
            assert!(wait_gone(pid), "helper descendant {pid} still runs");
        }
    }

    #[tokio::test]
    async fn a_helper_whose_caller_goes_away_is_killed_with_its_children() {
        let dir = tempfile::tempdir().expect("tmp");
        let pidfile = dir.path().join("pids");
        let cmd = format!(
            "sleep 30 & echo $! > {p}; echo $$ >> {p}; wait",
            p = pidfile.display()
        );
        let store = SecretStore::load(vec![("e".into(), exec(cmd, Duration::from_secs(60)))])
            .expect("load");
        let cancelled = tokio::time::timeout(Duration::from_millis(500), store.get("e")).await;
        assert!(cancelled.is_err(), "the helper should still be running");
        let pids = pids(&pidfile);
        assert_eq!(pids.len(), 2, "{pids:?}");
        for pid in pids {
            assert!(wait_gone(pid), "helper process {pid} outlived its caller");
        }
    }

    #[tokio::test]
    async fn a_helper_printing_too_much_is_refused_and_killed() {
        let dir = tempfile::tempdir().expect("tmp");
        let pidfile = dir.path().join("pids");
        let cmd = format!(
            "echo $$ > {p}; echo $$ >> {p}; yes sk-endless-output-0123456789",
            p = pidfile.display()
        );
        let store = SecretStore::load(vec![("e".into(), exec(cmd, Duration::from_secs(30)))])
            .expect("load");
        let started = Instant::now();
        let e = store.get("e").await.expect_err("refused").to_string();
        assert!(e.contains("more than"), "{e}");
        assert!(!e.contains("sk-endless"), "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "did not wait for the timeout"
        );
        for pid in pids(&pidfile) {
            assert!(wait_gone(pid), "helper {pid} still runs");
        }
    }
}

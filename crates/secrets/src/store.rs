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
//! - at most [`MAX_LIVE_PER_NAME`](super::MAX_LIVE_PER_NAME) minted values per name are
//!   *live* (one per key); a new key past that retires the least recently used one;
//! - retired values leave after [`RETIRED_KEEP`], and earlier when there are more than
//!   [`MAX_RETIRED_PER_NAME`](super::MAX_RETIRED_PER_NAME) under one name or
//!   [`MAX_RETIRED`](super::MAX_RETIRED) in all (oldest first);
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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwapOption;

use super::exec::run_helper;
use super::redaction_set::{Change, Shared, RETIRED_KEEP};
use super::scrub::{ScrubError, ScrubSecret, Scrubber};
use super::SecretValue;

/// Shortest accepted secret: shorter values would match noise when redacting.
pub const MIN_SECRET_LEN: usize = 8;

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
pub(super) fn trim_newline(mut v: Vec<u8>) -> Vec<u8> {
    if v.last() == Some(&b'\n') {
        v.pop();
        if v.last() == Some(&b'\r') {
            v.pop();
        }
    }
    v
}

pub(super) fn check_value(v: Vec<u8>) -> Result<SecretValue, String> {
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

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data: a panic elsewhere while it was locked leaves it usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Default)]
struct State {
    current: Option<SecretValue>,
    fetched: Option<Instant>,
    stamp: Option<(SystemTime, u64)>,
    refreshing: bool,
}

pub(super) struct Slot {
    pub(super) name: String,
    pub(super) source: Source,
    /// An `env:` value: read once at load and never changed, so handed out without a lock.
    fixed: Option<SecretValue>,
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
            let fixed = match source {
                Source::Env(_) => state.current.clone(),
                _ => None,
            };
            slots.insert(
                name.clone(),
                Arc::new(Slot {
                    name,
                    source,
                    fixed,
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
            Source::Env(_) => slot
                .fixed
                .clone()
                .ok_or_else(|| slot.unavailable("not loaded")),
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
        old.shared
            .successor
            .store(Arc::new(Arc::downgrade(&self.shared)));
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

    pub(super) fn unavailable(&self, why: &str) -> SecretError {
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

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;

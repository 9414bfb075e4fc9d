//! Secret sources and the store that holds their current (and recently retired) values.
//!
//! - `env:VAR`: read once at load; a missing or empty variable is a load error.
//! - `file:PATH`: read at load and re-read whenever the file's modification time or size
//!   changes (checked on use), so rotation needs no restart.
//! - `vault:PATH#FIELD`, `aws-sm:NAME#KEY`, `aws-ssm:/NAME` ([`super::remote`]): fetched on
//!   first use (or when serving starts) through the store's [`super::remote::Fetch`], refreshed
//!   in the background before `refresh` (or two thirds of a lease) passes, served stale for at
//!   most `stale_for` while the store cannot be reached (`store_remote`).
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
//! # Generations
//!
//! A [`SecretStore`] is one policy generation's view: the declarations it was built from, each
//! in a slot holding its value. The redaction set (and the matcher built over it) is shared by
//! every generation, so nothing is copied or forwarded on a reload: the next generation's store
//! is [`SecretStore::reconcile`]d from the one in force — an unchanged declaration keeps its slot
//! (its value, file stamp, cached `exec:` output), a changed or new one is read afresh, a removed
//! one is left out — and [`SecretStore::take_over`] puts it in force: the values of the slots it
//! left out stay redacted as retired, and a slot left out is marked detached, so a value a
//! request still running on the old generation reads through it later is added as retired too.
//!
//! Error messages name secrets, never values.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::{ArcSwap, ArcSwapOption};

use super::exec::run_helper;
use super::redaction_set::{Change, Shared, RETIRED_KEEP};
use super::remote::{Fetch, Remote};
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
    /// Held in an external store (Vault/OpenBao, AWS Secrets Manager or SSM).
    Remote(Box<Remote>),
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
            Source::Remote(remote) => f.debug_tuple("Remote").field(remote).finish(),
        }
    }
}

/// The source kinds a spec may name, for messages.
const KINDS: &str =
    "env:VAR, file:PATH, exec:COMMAND, vault:PATH#FIELD, aws-sm:NAME or aws-ssm:NAME";

impl Source {
    /// Parses `env:VAR`, `file:PATH`, `exec:COMMAND`, or a remote store's spec
    /// (`vault:PATH#FIELD`, `vault.NAME:PATH#FIELD`, `aws-sm:NAME#KEY`, `aws-ssm:NAME`; see
    /// [`super::remote`]), which gets the default refresh and no stale grace.
    pub fn parse(spec: &str, ttl: Duration, timeout: Duration) -> Result<Self, String> {
        // Never echo the spec: a value written inline by mistake may be the secret itself.
        let (kind, rest) = spec
            .split_once(':')
            .ok_or_else(|| format!("the value is not {KINDS}"))?;
        if rest.trim().is_empty() {
            if kind.len() <= 20
                && kind
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'-' || b == b'.')
            {
                return Err(format!("{kind}: needs a value after the colon"));
            }
            return Err(format!("the value is not {KINDS}"));
        }
        if let Some(remote) = super::remote::parse(kind, rest) {
            return remote.map(|r| Source::Remote(Box::new(r)));
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
            k if k.len() <= 12 && k.bytes().all(|b| b.is_ascii_lowercase()) => {
                Err(format!("unknown source kind {k:?}: use {KINDS}"))
            }
            _ => Err(format!("unknown source kind before ':': use {KINDS}")),
        }
    }

    /// The kind, as `explain` and the audit record name it: `env`, `file`, `exec`, `vault`,
    /// `aws-sm` or `aws-ssm`.
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Env(_) => "env",
            Source::File(_) => "file",
            Source::Exec { .. } => "exec",
            Source::Remote(r) => r.at.kind(),
        }
    }

    /// Whether the value is fetched over the network.
    pub fn is_remote(&self) -> bool {
        matches!(self, Source::Remote(_))
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
pub(super) struct State {
    pub(super) current: Option<SecretValue>,
    pub(super) fetched: Option<Instant>,
    stamp: Option<(SystemTime, u64)>,
    pub(super) refreshing: bool,
    /// A remote value's refresh time: served fresh before it, stale (within `stale_for`) after.
    pub(super) due: Option<Instant>,
    /// A remote value's lease end: never served from then on, and redacted until then.
    pub(super) end: Option<Instant>,
    /// The last failed fetch of a remote value: when, and why (no value in it).
    pub(super) failed: Option<(Instant, String)>,
}

pub(super) struct Slot {
    pub(super) name: String,
    pub(super) source: Source,
    /// An `env:` value: read once at load and never changed, so handed out without a lock.
    fixed: Option<SecretValue>,
    state: Mutex<State>,
    /// Single flight for exec helpers: N concurrent first uses run the helper once.
    pub(super) fetch: tokio::sync::Mutex<()>,
    /// Set when a reload left this slot out of the generation in force: a value it takes on
    /// afterwards (for a request still running on its generation) joins the set as retired.
    detached: AtomicBool,
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

/// What every generation's store shares: the redaction set, the slots in force (whose current
/// values the matcher holds besides the set's), and the matcher built last.
pub(super) struct Redaction {
    pub(super) shared: Arc<Shared>,
    /// The slots of the generation in force.
    in_force: ArcSwap<Vec<Arc<Slot>>>,
    /// The matcher of the newest generation built.
    built: ArcSwapOption<Built>,
    /// Single flight for matcher builds.
    building: Mutex<()>,
    builds: AtomicU64,
    /// How remote sources are fetched, set once when serving starts (every generation's).
    pub(super) fetcher: std::sync::OnceLock<Arc<dyn Fetch>>,
}

/// One policy generation's secrets, by name, over the redaction set all generations share.
pub struct SecretStore {
    pub(super) slots: HashMap<String, Arc<Slot>>,
    pub(super) redaction: Arc<Redaction>,
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
        let in_force = slots.values().cloned().collect();
        Self {
            slots,
            redaction: Arc::new(Redaction {
                shared: Arc::new(Shared::new(0)),
                in_force: ArcSwap::from_pointee(in_force),
                built: ArcSwapOption::empty(),
                building: Mutex::new(()),
                builds: AtomicU64::new(0),
                fetcher: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Builds the store, reading `env:` and `file:` sources now. Returns every failure by name.
    pub fn load(sources: Vec<(String, Source)>) -> Result<Self, Vec<(String, String)>> {
        let mut errors = Vec::new();
        let mut slots = HashMap::new();
        for (name, source) in sources {
            match Slot::load(name.clone(), source) {
                Ok(slot) => {
                    slots.insert(name, Arc::new(slot));
                }
                Err(e) => errors.push((name, e)),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Self::with_slots(slots))
    }

    /// The store of the next generation, declaring `sources`, over this one's redaction set:
    /// a declaration unchanged from this store's keeps its slot (the same value, file stamp and
    /// cached `exec:` output), a changed or new one is read now, a removed one is left out.
    /// Nothing changes in force until [`SecretStore::take_over`]; a failure changes nothing at
    /// all. Returns every failure by name.
    pub fn reconcile(
        &self,
        sources: &[(String, Source)],
    ) -> Result<SecretStore, Vec<(String, String)>> {
        let mut errors = Vec::new();
        let mut slots = HashMap::with_capacity(sources.len());
        for (name, source) in sources {
            let slot = match self.slots.get(name) {
                Some(kept) if kept.source == *source => Ok(kept.clone()),
                _ => Slot::load(name.clone(), source.clone()).map(Arc::new),
            };
            match slot {
                Ok(slot) => {
                    slots.insert(name.clone(), slot);
                }
                Err(e) => errors.push((name.clone(), e)),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(SecretStore {
            slots,
            redaction: self.redaction.clone(),
        })
    }

    /// Whether the secrets whose names start with `prefix` are the very same slots here and in
    /// `other` (none added, removed or re-read by a reconcile): a credential's key material.
    pub fn same_slots(&self, other: &SecretStore, prefix: &str) -> bool {
        fn of<'s>(store: &'s SecretStore, prefix: &str) -> Vec<(&'s String, &'s Arc<Slot>)> {
            let mut slots: Vec<(&String, &Arc<Slot>)> = store
                .slots
                .iter()
                .filter(|(name, _)| name.starts_with(prefix))
                .collect();
            slots.sort_by(|a, b| a.0.cmp(b.0));
            slots
        }
        let (mine, theirs) = (of(self, prefix), of(other, prefix));
        mine.len() == theirs.len()
            && mine
                .iter()
                .zip(&theirs)
                .all(|(a, b)| a.0 == b.0 && Arc::ptr_eq(a.1, b.1))
    }

    /// Puts this store (from [`SecretStore::reconcile`] on `previous`) in force in its place:
    /// the slots `previous` has and this one does not keep are detached, and their values stay
    /// redacted as retired (unless still current here). A store over another redaction set
    /// shares nothing with `previous`, so nothing is done.
    pub fn take_over(&self, previous: &SecretStore) {
        if !Arc::ptr_eq(&self.redaction, &previous.redaction) {
            return;
        }
        let left: Vec<&Arc<Slot>> = previous
            .slots
            .iter()
            .filter(|(name, slot)| !self.slots.get(*name).is_some_and(|s| Arc::ptr_eq(s, slot)))
            .map(|(_, slot)| slot)
            .collect();
        // First detached, then read: a value a detached slot takes on meanwhile is read here or
        // remembered by the slot itself (or both: adding a value twice changes nothing).
        for slot in &left {
            slot.detached.store(true, Ordering::SeqCst);
        }
        let now = Instant::now();
        let retired: Vec<(Arc<str>, SecretValue)> = left
            .iter()
            .filter_map(|slot| {
                let value = slot.current()?;
                let current = self.slots.get(&slot.name).and_then(|s| s.current());
                (current.as_ref() != Some(&value)).then(|| (Arc::from(slot.name.as_str()), value))
            })
            .collect();
        let redaction = &self.redaction;
        redaction
            .in_force
            .store(Arc::new(self.slots.values().cloned().collect()));
        let shared = &redaction.shared;
        let mut v = lock(&shared.values);
        for (name, value) in retired {
            v.retire(&name, value, now);
        }
        // The slots now in force may hold values no matcher built so far has.
        shared.bump(Change {
            added: true,
            removed: false,
        });
        drop(v);
        shared.sweep_by(now + RETIRED_KEEP);
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
            Source::Remote(remote) => self.get_remote(slot, remote).await,
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
        if slot.replace(value.clone(), stamp, &self.redaction.shared) {
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
        slot.replace(value.clone(), None, &self.redaction.shared);
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
            let shared = self.redaction.shared.clone();
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
        self.redaction.shared.mint(name, key, value);
    }

    /// Counts describing the redaction set.
    pub fn redaction_stats(&self) -> RedactionStats {
        RedactionStats {
            generation: self.redaction.shared.generation.load(Ordering::Acquire),
            values: lock(&self.redaction.shared.values).count(),
            builds: self.redaction.builds.load(Ordering::Relaxed),
        }
    }

    /// The matcher built last, if it is safe for a caller that saw `added` additions (it
    /// misses no value added before) and, when `generation` is given, also current.
    fn usable(&self, added: u64, generation: Option<u64>) -> Option<Option<Arc<Scrubber>>> {
        let built = self.redaction.built.load();
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
        let swept = self.redaction.shared.sweep_if_due();
        let added = self.redaction.shared.added.load(Ordering::Acquire);
        let current = swept.then(|| self.redaction.shared.generation.load(Ordering::Acquire));
        if let Some(s) = self.usable(added, current) {
            return Ok(s);
        }
        let _one_build = lock(&self.redaction.building);
        if let Some(s) = self.usable(added, current) {
            return Ok(s);
        }
        // Read the counters before the values: the matcher then holds at least what they
        // stand for (a value is in before they are bumped).
        let generation = self.redaction.shared.generation.load(Ordering::Acquire);
        let added = self.redaction.shared.added.load(Ordering::Acquire);
        let mut values: Vec<(Arc<str>, SecretValue)> = Vec::new();
        for slot in self.redaction.in_force.load().iter() {
            if let Some(v) = slot.current() {
                values.push((Arc::from(slot.name.as_str()), v));
            }
        }
        {
            let v = lock(&self.redaction.shared.values);
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
        self.redaction.builds.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(generation, values = values.len(), "redaction matcher built");
        self.redaction.built.store(Some(Arc::new(Built {
            generation,
            added,
            scrubber: scrubber.clone(),
        })));
        Ok(scrubber)
    }
}

impl Slot {
    /// A slot for `source`, reading `env:` and `file:` sources now (`exec:` runs on first use).
    fn load(name: String, source: Source) -> Result<Slot, String> {
        let mut state = State::default();
        let loaded = match &source {
            Source::Env(var) => Some(match std::env::var_os(var) {
                None => Err(format!("env var {var} is not set")),
                Some(v) => {
                    check_value(v.into_encoded_bytes()).map_err(|e| format!("env var {var}: {e}"))
                }
            }),
            Source::File(path) => Some(match std::fs::read(path) {
                Ok(v) => {
                    state.stamp = file_stamp(path);
                    check_value(v).map_err(|e| format!("file {}: {e}", path.display()))
                }
                Err(e) => Err(format!("cannot read {}: {e}", path.display())),
            }),
            Source::Exec { .. } | Source::Remote(_) => None,
        };
        if let Some(v) = loaded.transpose()? {
            state.current = Some(v);
            state.fetched = Some(Instant::now());
        }
        let fixed = match source {
            Source::Env(_) => state.current.clone(),
            _ => None,
        };
        Ok(Slot {
            name,
            source,
            fixed,
            state: Mutex::new(state),
            fetch: tokio::sync::Mutex::new(()),
            detached: AtomicBool::new(false),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub(super) fn current(&self) -> Option<SecretValue> {
        self.lock().current.clone()
    }

    pub(super) fn unavailable(&self, why: &str) -> SecretError {
        SecretError::Unavailable {
            name: self.name.clone(),
            why: why.to_string(),
        }
    }

    /// Installs a new value; the old one is retired (still redacted for a while: an hour after
    /// it was last handed out, and at least until its lease ends). Returns whether the value
    /// changed.
    pub(super) fn replace(
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
            // In the set already (as the current value). A leased value stays until its
            // lease ends, if that is later than an hour from now.
            let from = st
                .end
                .and_then(|end| end.checked_sub(RETIRED_KEEP))
                .map_or(now, |t| t.max(now));
            change |= v.demote(&name, old, from);
        }
        shared.bump(change);
        drop(v);
        drop(st);
        shared.sweep_by(now + RETIRED_KEEP);
        if self.detached.load(Ordering::SeqCst) {
            // Out of force: the matcher no longer reads this slot, so the set holds the value.
            shared.remember(&self.name, &value);
        }
        true
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;

//! Secret sources and the store that holds their current (and recently retired) values.
//!
//! - `env:VAR`: read once at load; a missing or empty variable is a load error.
//! - `file:PATH`: read at load and re-read whenever the file's modification time or size
//!   changes (checked on use), so rotation needs no restart.
//! - `exec:COMMAND`: run with `sh -c` on first use; its stdout (one trailing newline trimmed) is
//!   the value, cached for `ttl` and refreshed in the background once 80 % of it has passed;
//!   bounded by `timeout`. Its stderr goes to latchkey's log (with the value scrubbed), never to
//!   the sandbox.
//!
//! Rotated-out values stay in the redaction set for [`RETIRED_KEEP`], so an upstream that
//! reflects an old key is still scrubbed. Error messages name secrets, never values.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::scrub::{ScrubError, ScrubSecret, Scrubber};
use super::SecretValue;

/// How long a rotated-out value is still redacted.
pub const RETIRED_KEEP: Duration = Duration::from_secs(3600);
/// Shortest accepted secret: shorter values would match noise when redacting.
pub const MIN_SECRET_LEN: usize = 8;

/// Where a secret's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Env(String),
    File(PathBuf),
    Exec {
        command: String,
        ttl: Duration,
        timeout: Duration,
    },
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

#[derive(Default)]
struct MintedValues {
    current: Option<SecretValue>,
    retired: Vec<(SecretValue, Instant)>,
}

#[derive(Default)]
struct State {
    current: Option<SecretValue>,
    fetched: Option<Instant>,
    stamp: Option<(SystemTime, u64)>,
    retired: Vec<(SecretValue, Instant)>,
    refreshing: bool,
}

struct Slot {
    name: String,
    source: Source,
    state: Mutex<State>,
    /// Single flight for exec helpers: N concurrent first uses run the helper once.
    fetch: tokio::sync::Mutex<()>,
}

/// All secrets of a policy, by name.
pub struct SecretStore {
    slots: HashMap<String, Arc<Slot>>,
    /// Values latchkey made itself (minted tokens, keys unpacked from a key file): redacted
    /// like any secret, with the same retirement window.
    minted: Mutex<HashMap<String, MintedValues>>,
    /// Bumped whenever a value changes, so the scrubber is rebuilt.
    generation: Arc<AtomicU64>,
    scrubber: Mutex<Option<(u64, Arc<Scrubber>)>>,
}

impl std::fmt::Debug for SecretStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.slots.keys().collect();
        names.sort();
        f.debug_struct("SecretStore")
            .field("names", &names)
            .finish()
    }
}

impl SecretStore {
    /// An empty store.
    pub fn empty() -> Self {
        Self {
            slots: HashMap::new(),
            minted: Mutex::new(HashMap::new()),
            generation: Arc::new(AtomicU64::new(0)),
            scrubber: Mutex::new(None),
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
        Ok(Self {
            slots,
            minted: Mutex::new(HashMap::new()),
            generation: Arc::new(AtomicU64::new(1)),
            scrubber: Mutex::new(None),
        })
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
        slot.replace(value.clone(), stamp, &self.generation);
        tracing::info!(secret = %slot.name, "secret file changed; new value in use");
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
        slot.replace(value.clone(), None, &self.generation);
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
            let generation = self.generation.clone();
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let timeout = match &slot.source {
                        Source::Exec { timeout, .. } => *timeout,
                        _ => Duration::from_secs(10),
                    };
                    let _flight = slot.fetch.lock().await;
                    match run_helper(&slot, timeout).await {
                        Ok(v) => slot.replace(v, None, &generation),
                        Err(e) => tracing::warn!(secret = %slot.name, error = %e, "background refresh failed; the cached value stays until it expires"),
                    }
                    slot.lock().refreshing = false;
                });
            }
        }
        Some(value)
    }

    /// Records a value latchkey made (a minted token) so it is redacted like a secret. Values
    /// shorter than [`MIN_SECRET_LEN`] are not tracked (they would match noise).
    pub fn set_minted(&self, name: &str, value: &SecretValue) {
        if value.len() < MIN_SECRET_LEN {
            return;
        }
        let mut minted = self
            .minted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = minted.entry(name.to_string()).or_default();
        if entry.current.as_ref() == Some(value) {
            return;
        }
        if let Some(old) = entry.current.take() {
            entry.retired.push((old, Instant::now()));
        }
        entry.current = Some(value.clone());
        drop(minted);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The scrubber over every value in force: current values and those retired within
    /// [`RETIRED_KEEP`]. `Ok(None)` when no value is loaded. An error means values are loaded
    /// but cannot be searched for: callers must refuse rather than pass data unscanned.
    pub fn scrubber(&self) -> Result<Option<Arc<Scrubber>>, ScrubError> {
        let generation = self.generation.load(Ordering::Acquire);
        if let Ok(cache) = self.scrubber.lock() {
            if let Some((g, s)) = cache.as_ref() {
                if *g == generation {
                    return Ok(Some(s.clone()));
                }
            }
        }
        let mut values: Vec<(String, SecretValue)> = Vec::new();
        for slot in self.slots.values() {
            let mut st = slot.lock();
            st.retired.retain(|(_, at)| at.elapsed() < RETIRED_KEEP);
            if let Some(v) = &st.current {
                values.push((slot.name.clone(), v.clone()));
            }
            for (v, _) in &st.retired {
                values.push((slot.name.clone(), v.clone()));
            }
        }
        if let Ok(mut minted) = self.minted.lock() {
            for (name, m) in minted.iter_mut() {
                m.retired.retain(|(_, at)| at.elapsed() < RETIRED_KEEP);
                for v in m.current.iter().chain(m.retired.iter().map(|(v, _)| v)) {
                    values.push((name.clone(), v.clone()));
                }
            }
        }
        if values.is_empty() {
            return Ok(None);
        }
        let secrets: Vec<ScrubSecret<'_>> = values
            .iter()
            .map(|(name, v)| ScrubSecret {
                name,
                value: v.expose(),
            })
            .collect();
        // Values are length-checked on load, so a failure here is a bug: report it, and let the
        // caller refuse (never fall back to a scanner that misses the newest values).
        let scrubber = Arc::new(Scrubber::new(&secrets).inspect_err(|e| {
            tracing::error!(error = %e, "cannot build the redaction scanner");
        })?);
        if let Ok(mut cache) = self.scrubber.lock() {
            *cache = Some((generation, scrubber.clone()));
        }
        Ok(Some(scrubber))
    }
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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

    /// Installs a new value; the old one is retired (still redacted for a while).
    fn replace(
        &self,
        value: SecretValue,
        stamp: Option<(SystemTime, u64)>,
        generation: &AtomicU64,
    ) {
        let mut st = self.lock();
        let changed = st.current.as_ref() != Some(&value);
        if changed {
            if let Some(old) = st.current.take() {
                st.retired.push((old, Instant::now()));
            }
        }
        st.current = Some(value);
        st.fetched = Some(Instant::now());
        st.stamp = stamp;
        drop(st);
        if changed {
            generation.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Runs an exec helper with a timeout; its stderr goes to the log with the value scrubbed.
async fn run_helper(slot: &Slot, timeout: Duration) -> Result<SecretValue, SecretError> {
    let Source::Exec { command, .. } = &slot.source else {
        return Err(slot.unavailable("not an exec source"));
    };
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| slot.unavailable(&format!("cannot start helper: {e}")))?;
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return Err(slot.unavailable(&format!("helper failed: {e}"))),
        Err(_) => {
            return Err(slot.unavailable(&format!(
                "helper did not finish within {}s",
                timeout.as_secs_f32()
            )))
        }
    };
    let stdout = trim_newline(output.stdout);
    if !output.stderr.is_empty() {
        let mut stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if let Ok(value) = std::str::from_utf8(&stdout) {
            if !value.is_empty() {
                stderr = stderr.replace(value, &format!("[REDACTED:{}]", slot.name));
            }
        }
        tracing::warn!(secret = %slot.name, stderr = %stderr.trim_end(), "secret helper wrote to stderr");
    }
    if !output.status.success() {
        return Err(slot.unavailable(&format!("helper exited with {}", output.status)));
    }
    check_value(stdout).map_err(|e| slot.unavailable(&format!("helper output: {e}")))
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
}

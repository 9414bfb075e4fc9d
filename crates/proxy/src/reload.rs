//! Policy reloads: on SIGHUP, on `POST /reload`, and when a policy file changes.
//!
//! What is in force is a [`Generation`]: the compiled policy (immutable, what the files say)
//! and the live credential state it runs with ([`Live`]: secret values, minted and captured
//! tokens, over the redaction set every generation shares). A reload loads, validates and
//! compiles the whole directory off the async workers, reconciles the live state against the
//! new declarations ([`Live::reconcile`]: unchanged ones keep their values and tokens, changed
//! ones are read anew, removed ones are dropped), then swaps the new generation in atomically;
//! a secret held in a store (Vault, AWS) is fetched before the swap, and values already held
//! in stores are refreshed in the background after any reload;
//! an invalid set, or a secret that cannot be read, leaves the generation in force untouched,
//! and the error is kept for `/status`. Requests already running keep the generation they
//! started with, policy and values alike. This module reads files and swaps an `Arc`; it knows
//! nothing of connections or requests.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use super::Proxy;
use crate::policy::Policy;
use crate::secrets::captured::Captured;
use crate::secrets::SecretStore;
use crate::signing::{Live, TokenCache};

/// A compiled policy and the live credential state it runs with: what one request works
/// against for its whole life. Derefs to its [`Policy`] (a generation *is* the policy in
/// force, with values); the state is reached through [`Generation::secrets`],
/// [`Generation::tokens`] and [`Generation::captured`].
#[derive(Debug)]
pub struct Generation {
    policy: Arc<Policy>,
    live: Live,
}

impl std::ops::Deref for Generation {
    type Target = Policy;

    fn deref(&self) -> &Policy {
        &self.policy
    }
}

impl Generation {
    /// The first generation: `policy` with every secret it declares read now.
    pub fn first(policy: Policy, captured: Arc<Captured>) -> Result<Generation, ReloadError> {
        let live = Live::resolve(policy.secret_sources(), captured).map_err(unreadable)?;
        Ok(Generation {
            policy: Arc::new(policy),
            live,
        })
    }

    /// The generation after this one, for `policy`: the live state reconciled against its
    /// declarations (a credential keeps its tokens while its definition is the same). Nothing
    /// changes in force until [`Generation::take_over`].
    fn next(&self, policy: Policy) -> Result<Generation, ReloadError> {
        let unchanged = |name: &str| self.policy.credential(name) == policy.credential(name);
        let live = self
            .live
            .reconcile(policy.secret_sources(), unchanged)
            .map_err(unreadable)?;
        Ok(Generation {
            policy: Arc::new(policy),
            live,
        })
    }

    /// Puts this generation's live state in force in place of `previous`'s.
    fn take_over(&self, previous: &Generation) {
        self.live.take_over(&previous.live);
    }

    /// The compiled policy.
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    /// This generation's secrets (over the redaction set every generation shares).
    pub fn secrets(&self) -> &Arc<SecretStore> {
        self.live.secrets()
    }

    /// The tokens minted for this generation's credentials.
    pub fn tokens(&self) -> &TokenCache {
        self.live.tokens()
    }

    /// The captured tokens (the same for every generation).
    pub fn captured(&self) -> &Arc<Captured> {
        self.live.captured()
    }
}

/// Secrets that could not be read, one per line, by name (never a value).
fn unreadable(failures: Vec<(String, String)>) -> ReloadError {
    let lines: Vec<String> = failures
        .into_iter()
        .map(|(name, why)| format!("secret {name:?}: {why}"))
        .collect();
    ReloadError::Invalid(lines.join("\n"))
}

/// The outcome of the last reload, for `/status`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReloadState {
    /// RFC 3339 time of the last successful load.
    pub last_ok: Option<String>,
    /// The error of the last failed reload, cleared by a successful one.
    pub last_error: Option<String>,
    pub reloads: u64,
    pub errors: u64,
}

/// Why a reload left the policy in force as it was.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReloadError {
    /// The policy directory did not load, validate or compile: every problem, one per line.
    #[error("{0}")]
    Invalid(String),
    /// The blocking task that loads the directory did not finish.
    #[error("reload task failed: {0}")]
    Task(String),
}

/// `/reload` answers with the error as a JSON string.
impl serde::Serialize for ReloadError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Where the policy comes from, and the record of reloading it.
pub(super) struct Reloader {
    dir: PathBuf,
    state: Mutex<ReloadState>,
    /// One reload at a time: two would race to swap.
    one_at_a_time: tokio::sync::Mutex<()>,
}

impl Reloader {
    /// A reloader for the policy just loaded from `dir`.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            state: Mutex::new(ReloadState {
                last_ok: Some(now()),
                ..ReloadState::default()
            }),
            one_at_a_time: tokio::sync::Mutex::new(()),
        }
    }
}

impl Proxy {
    /// The last reload's outcome.
    pub fn reload_state(&self) -> ReloadState {
        self.reloader
            .state
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// Loads, validates and compiles the policy directory, then swaps it in. An invalid set
    /// leaves the policy in force untouched; the error is kept for `/status` and counted.
    /// Returns whether the policy changed.
    pub async fn reload(&self, why: &str) -> Result<bool, ReloadError> {
        let _one_at_a_time = self.reloader.one_at_a_time.lock().await;
        let dir = self.reloader.dir.clone();
        let old = self.policy();
        // Off the async workers: reading the files, and the secrets that changed.
        let in_force = old.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            let policy =
                crate::policy::load_dir(&dir).map_err(|e| ReloadError::Invalid(e.to_string()))?;
            if policy.digest() == in_force.digest() {
                return Ok(None);
            }
            in_force.next(policy).map(Some)
        })
        .await;
        let mut result = match loaded {
            Ok(next) => next,
            Err(e) => Err(ReloadError::Task(e.to_string())),
        };
        // A secret in a store the new generation declares (or declares anew) is fetched before
        // it goes in force: one that cannot be leaves the generation in force alone, like an
        // unreadable file.
        if let Ok(Some(next)) = &result {
            let failures = next.secrets().fetch_remote().await;
            if !failures.is_empty() {
                result = Err(unreadable(failures));
            }
        }
        let metrics = self.metrics().clone();
        let mut state = self
            .reloader
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match result {
            Ok(next) => {
                state.last_ok = Some(now());
                state.last_error = None;
                let changed = next.is_some();
                if let Some(next) = next {
                    tracing::info!(why, policy.digest = %next.digest(), policy.rules = next.rules().len(), "policy reloaded");
                    // Values handed out under the old generation stay redacted under the new.
                    next.take_over(&old);
                    self.policy.store(Arc::new(next));
                    state.reloads += 1;
                    metrics
                        .policy_reloads
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                // A reload also refreshes the values held in stores (in the background: the
                // values in use stay until the new ones come).
                self.policy().secrets().refresh_remote();
                Ok(changed)
            }
            Err(e) => {
                tracing::error!(why, error = %e, "policy reload refused; the policy in force stays");
                state.last_error = Some(e.to_string());
                state.errors += 1;
                metrics
                    .policy_reload_errors
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Reloads on SIGHUP and whenever a policy file changes (polled each second, so editors'
    /// rename-over saves and symlink swaps of mounted config are seen as well), until shutdown.
    pub async fn watch_policies(self: Arc<Self>) {
        let mut shutdown = self.shutdown.subscribe();
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let dir = self.reloader.dir.clone();
        let mut last = dir_fingerprint(&dir);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            #[cfg(unix)]
            let hup_fut = async {
                match hup.as_mut() {
                    Some(h) => {
                        h.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            #[cfg(not(unix))]
            let hup_fut = std::future::pending::<()>();
            tokio::select! {
                () = hup_fut => {
                    let _ = self.reload("SIGHUP").await;
                }
                _ = tick.tick() => {
                    let now = dir_fingerprint(&dir);
                    if now != last {
                        // Debounce: wait until the directory stops changing.
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        let settled = dir_fingerprint(&dir);
                        if settled == now {
                            last = settled;
                            let _ = self.reload("policy files changed").await;
                        }
                    }
                }
                () = super::stopped(&mut shutdown) => return,
            }
        }
    }
}

/// The current time in RFC 3339, to the second.
fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// A cheap fingerprint of the policy files: names, sizes and modification times.
fn dir_fingerprint(dir: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "toml") {
                // metadata() follows symlinks, so a swapped target shows up too.
                if let Ok(m) = std::fs::metadata(&path) {
                    out.push((path, m.len(), m.modified().ok()));
                }
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_sees_policy_files_only_and_changes_with_them() {
        let dir = std::env::temp_dir().join(format!("latchkey-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("a.toml"), "x").expect("write");
        std::fs::write(dir.join("notes.txt"), "ignored").expect("write");
        let before = dir_fingerprint(&dir);
        assert_eq!(before.len(), 1);
        std::fs::write(dir.join("a.toml"), "longer").expect("write");
        assert_ne!(dir_fingerprint(&dir), before);
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert!(dir_fingerprint(&dir).is_empty());
    }

    fn compiled(text: &str, loading: crate::policy::SecretLoading) -> Policy {
        crate::policy::compile_sources_with(&[(Path::new("p.toml"), text)], loading)
            .expect("policy")
    }

    fn declaring(dir: &Path, names: &[&str]) -> String {
        names
            .iter()
            .map(|n| {
                format!(
                    "[secrets.{n}]\nsource = \"file:{}\"\n",
                    dir.join(n).display()
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn the_next_generation_shares_what_is_unchanged_and_the_old_one_stays_whole() {
        let dir = tempfile::tempdir().expect("tmp");
        for n in ["kept", "gone", "added"] {
            std::fs::write(dir.path().join(n), format!("sk-{n}-0123456789")).expect("write");
        }
        let read = crate::policy::SecretLoading::Read;
        let first = Generation::first(
            compiled(&declaring(dir.path(), &["kept", "gone"]), read),
            Arc::new(Captured::in_memory()),
        )
        .expect("first");
        let next = first
            .next(compiled(&declaring(dir.path(), &["kept", "added"]), read))
            .expect("next");
        next.take_over(&first);
        assert!(next.secrets().contains("added") && !next.secrets().contains("gone"));
        assert!(Arc::ptr_eq(next.captured(), first.captured()));
        // A request still on the first generation resolves what it declared.
        let gone = first.secrets().get("gone").await.expect("still declared");
        assert_eq!(gone.expose(), b"sk-gone-0123456789");
        // Unchanged: the same value either way; the removed one is still redacted.
        let kept = next.secrets().get("kept").await.expect("kept");
        assert_eq!(kept, first.secrets().get("kept").await.expect("kept"));
        let scrubber = next.secrets().scrubber().expect("matcher").expect("values");
        assert!(!scrubber.scrub(gone.expose()).1.is_empty());
    }

    #[test]
    fn a_secret_that_cannot_be_read_leaves_the_generation_in_force_alone() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("a"), "sk-a-0123456789").expect("write");
        let first = Generation::first(
            compiled(
                &declaring(dir.path(), &["a"]),
                crate::policy::SecretLoading::Read,
            ),
            Arc::new(Captured::in_memory()),
        )
        .expect("first");
        let skip = crate::policy::SecretLoading::Skip;
        let e = first
            .next(compiled(&declaring(dir.path(), &["a", "missing"]), skip))
            .expect_err("unreadable");
        assert!(e.to_string().contains("secret \"missing\""), "{e}");
        assert!(!e.to_string().contains("sk-a"), "{e}");
        assert!(first.secrets().contains("a") && !first.secrets().contains("missing"));
    }

    #[test]
    fn a_reload_error_is_its_message_in_json() {
        let e = ReloadError::Invalid("a.toml:1:1: bad".to_string());
        assert_eq!(
            serde_json::to_value(&e).expect("json"),
            serde_json::json!("a.toml:1:1: bad")
        );
        let e = ReloadError::Task("panicked".to_string());
        assert_eq!(e.to_string(), "reload task failed: panicked");
    }
}

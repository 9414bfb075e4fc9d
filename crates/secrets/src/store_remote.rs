//! Remote sources in the store: a value fetched from Vault/OpenBao or AWS through the store's
//! [`Fetch`], and how long it is used.
//!
//! - **Fresh** until its refresh time (`refresh`, shortened to two thirds of a lease or TTL
//!   the store gave): handed out as it is. Once 80 % of that time has passed, one background
//!   refresh starts (single flight with every other fetch of the slot).
//! - **Stale** from its refresh time for `stale_for`, when the refresh failed: still handed
//!   out (and [`SecretStore::stale`] says so, for the audit record) while background
//!   refreshes keep trying, at most every [`RETRY_EVERY`]. Never past a lease's end.
//! - **Gone** after that, or before the first fetch: the request fetches it now (single
//!   flight). A failure refuses the request (`secret_unavailable`, naming the secret and the
//!   store's path) and is remembered for [`FAILURE_KEPT`], so a store that is down is not
//!   asked again by every request queued behind it.
//!
//! A new value retires the old one into the redaction set, which keeps it at least until its
//! lease ends. Nothing here ever logs or returns a value.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::remote::{Fetch, Fetched, Remote};
use super::store::{check_value, Redaction, Slot, Source};
use super::{SecretError, SecretStore, SecretValue};

/// How often a background refresh of a stale value is retried.
pub const RETRY_EVERY: Duration = Duration::from_secs(5);

/// How long a failed fetch answers for the store before it is tried again.
pub const FAILURE_KEPT: Duration = Duration::from_secs(1);

/// The longest one fetch may take (the transport's own timeouts are shorter).
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

impl SecretStore {
    /// Gives this store (and every generation reconciled from it or before it) the way remote
    /// sources are fetched. Set once; a second call changes nothing and returns `false`.
    pub fn set_fetcher(&self, fetcher: Arc<dyn Fetch>) -> bool {
        self.redaction.fetcher.set(fetcher).is_ok()
    }

    /// Whether `name` is a remote secret whose last value is past its refresh time (served
    /// stale because the store could not be reached).
    pub fn stale(&self, name: &str) -> bool {
        let Some(slot) = self.slots.get(name) else {
            return false;
        };
        if !slot.source.is_remote() {
            return false;
        }
        let st = slot.lock();
        st.current.is_some() && st.due.is_some_and(|due| Instant::now() >= due)
    }

    /// The source kind of `name` (`env`, `file`, `exec`, `vault`, `aws-sm`, `aws-ssm`).
    pub fn kind(&self, name: &str) -> Option<&'static str> {
        self.slots.get(name).map(|s| s.source.kind())
    }

    /// Fetches every remote secret of this store that has no usable value yet, all at once.
    /// Returns every failure by name (never a value): what `serve` reports at start-up and a
    /// reload reports before it swaps.
    pub async fn fetch_remote(&self) -> Vec<(String, String)> {
        let now = Instant::now();
        let pending: Vec<(&Arc<Slot>, &Remote)> = self
            .slots
            .values()
            .filter_map(|slot| match &slot.source {
                Source::Remote(r) if !usable(slot, r, now) => Some((slot, r.as_ref())),
                _ => None,
            })
            .collect();
        let fetches = pending.into_iter().map(|(slot, remote)| async move {
            let _flight = slot.fetch.lock().await;
            if usable(slot, remote, Instant::now()) {
                return None;
            }
            fetch_now(&self.redaction, slot, remote)
                .await
                .err()
                .map(|e| (slot.name.clone(), unavailable_why(e)))
        });
        let mut failures: Vec<(String, String)> = futures_util::future::join_all(fetches)
            .await
            .into_iter()
            .flatten()
            .collect();
        failures.sort();
        failures
    }

    /// Has every remote secret fetched again in the background (a reload asks for it):
    /// values in use stay until the new ones come.
    pub fn refresh_remote(&self) {
        for slot in self.slots.values() {
            if let Source::Remote(_) = &slot.source {
                let mut st = slot.lock();
                st.failed = None;
                self.refresh_in_background(slot, &mut st);
            }
        }
    }

    pub(super) async fn get_remote(
        &self,
        slot: &Arc<Slot>,
        remote: &Remote,
    ) -> Result<SecretValue, SecretError> {
        if let Some(v) = self.cached(slot, remote, Instant::now()) {
            return Ok(v);
        }
        let _flight = slot.fetch.lock().await;
        let now = Instant::now();
        // Another caller may have fetched, or failed, while we waited.
        if let Some(v) = self.cached(slot, remote, now) {
            return Ok(v);
        }
        if let Some((at, why)) = &slot.lock().failed {
            if now.duration_since(*at) < FAILURE_KEPT {
                return Err(slot.unavailable(why));
            }
        }
        fetch_now(&self.redaction, slot, remote).await
    }

    /// The value in hand if it may be handed out now (fresh, or stale within its grace),
    /// starting a background refresh when one is due.
    fn cached(&self, slot: &Arc<Slot>, remote: &Remote, now: Instant) -> Option<SecretValue> {
        let mut st = slot.lock();
        let value = st.current.clone()?;
        let (fetched, due) = (st.fetched?, st.due?);
        if st.end.is_some_and(|end| now >= end) {
            return None;
        }
        if now < due {
            let soon = fetched + due.saturating_duration_since(fetched).mul_f32(0.8);
            if now >= soon {
                self.refresh_in_background(slot, &mut st);
            }
            return Some(value);
        }
        if now < due + remote.stale_for {
            self.refresh_in_background(slot, &mut st);
            return Some(value);
        }
        None
    }

    /// Starts one background refresh of `slot` unless one is running or the last failed less
    /// than [`RETRY_EVERY`] ago. Outside a runtime nothing starts (the next use fetches).
    fn refresh_in_background(&self, slot: &Arc<Slot>, st: &mut super::store::State) {
        let recent = st
            .failed
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < RETRY_EVERY);
        if st.refreshing || recent {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Source::Remote(remote) = &slot.source else {
            return;
        };
        st.refreshing = true;
        let redaction = self.redaction.clone();
        let (slot, remote) = (slot.clone(), remote.clone());
        handle.spawn(async move {
            let _flight = slot.fetch.lock().await;
            if let Err(e) = fetch_now(&redaction, &slot, &remote).await {
                let stale = if remote.stale_for.is_zero() {
                    "the value in use stays until its refresh time"
                } else {
                    "the value in use is served stale for at most stale_for past its refresh time"
                };
                tracing::warn!(secret = %slot.name, error = %e, "refreshing a secret from its store failed; {stale}");
            }
            slot.lock().refreshing = false;
        });
    }
}

/// Fetches `slot`'s value now and installs it; the caller holds the slot's fetch lock.
async fn fetch_now(
    redaction: &Redaction,
    slot: &Slot,
    remote: &Remote,
) -> Result<SecretValue, SecretError> {
    let Some(fetcher) = redaction.fetcher.get().cloned() else {
        return Err(slot.unavailable(&format!(
            "{} is in a secret store, which is only reached while serving (`latchkey check` without --no-secrets also fetches it)",
            remote.at.describe()
        )));
    };
    let fetched =
        match tokio::time::timeout(FETCH_TIMEOUT, fetcher.fetch(&slot.name, &remote.at)).await {
            Ok(Ok(f)) => Ok(f),
            Ok(Err(why)) => Err(why),
            Err(_) => Err(format!("no answer within {}s", FETCH_TIMEOUT.as_secs())),
        };
    let Fetched { value, valid_for } = match fetched {
        Ok(f) => f,
        Err(why) => {
            let why = format!("{}: {why}", remote.at.describe());
            slot.lock().failed = Some((Instant::now(), why.clone()));
            return Err(slot.unavailable(&why));
        }
    };
    let value = check_value(value.expose().to_vec()).map_err(|e| {
        let why = format!("{}: {e}", remote.at.describe());
        slot.lock().failed = Some((Instant::now(), why.clone()));
        slot.unavailable(&why)
    })?;
    let now = Instant::now();
    let refresh = match valid_for {
        Some(lease) => remote.refresh.min(lease.mul_f32(2.0 / 3.0)),
        None => remote.refresh,
    };
    if slot.replace_remote(value.clone(), &redaction.shared) {
        tracing::info!(secret = %slot.name, store = %remote.at.describe(), "secret fetched from its store; new value in use");
    }
    let mut st = slot.lock();
    st.due = Some(now + refresh.max(super::remote::MIN_REFRESH));
    st.end = valid_for.map(|lease| now + lease);
    st.failed = None;
    Ok(value)
}

/// Whether `slot` holds a value that may be handed out now.
fn usable(slot: &Slot, remote: &Remote, now: Instant) -> bool {
    let st = slot.lock();
    st.current.is_some()
        && st.end.is_none_or(|end| now < end)
        && st.due.is_some_and(|due| now < due + remote.stale_for)
}

fn unavailable_why(e: SecretError) -> String {
    match e {
        SecretError::Unavailable { why, .. } => why,
        other => other.to_string(),
    }
}

impl Slot {
    /// [`Slot::replace`] for a fetched value.
    fn replace_remote(&self, value: SecretValue, shared: &super::redaction_set::Shared) -> bool {
        self.replace(value, None, shared)
    }
}

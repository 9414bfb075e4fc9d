//! The console's sign-ins, kept in memory: a bounded map of random session ids to who signed
//! in (name, scopes, how), never a token; and the failed sign-ins per client address.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::policy::access::AdminScope;
use crate::Via;

/// Most console sessions held at once; a new one past it evicts the oldest.
pub const MAX_SESSIONS: usize = 1024;
/// A session unused this long ends.
pub const IDLE: Duration = Duration::from_secs(30 * 60);
/// A session ends this long after sign-in, however busy.
pub const ABSOLUTE: Duration = Duration::from_secs(8 * 60 * 60);
/// Failed sign-ins one client address may make per [`FAILURE_WINDOW`]; more get 429.
pub const MAX_FAILURES: u32 = 10;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Client addresses whose failures are remembered at once.
const MAX_FAILING_PEERS: usize = 4096;

/// Who a console session is.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub scopes: BTreeSet<AdminScope>,
    pub via: Via,
    /// Keyed hash of the policy token signed in with (`Via::Policy`): a rotated token ends the
    /// session. Never the token.
    pub fingerprint: Option<Vec<u8>>,
    /// The session's CSRF token, hex.
    pub csrf: String,
    created: Instant,
    last: Instant,
}

impl Entry {
    pub fn new(
        name: String,
        scopes: BTreeSet<AdminScope>,
        via: Via,
        fingerprint: Option<Vec<u8>>,
        csrf: String,
        now: Instant,
    ) -> Self {
        Self {
            name,
            scopes,
            via,
            fingerprint,
            csrf,
            created: now,
            last: now,
        }
    }

    fn live(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last) < IDLE
            && now.saturating_duration_since(self.created) < ABSOLUTE
    }
}

#[derive(Debug, Default)]
pub struct Store {
    sessions: Mutex<HashMap<String, Entry>>,
    failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl Store {
    /// Keeps `entry` under `id`, evicting expired sessions, then the oldest when full.
    pub fn insert(&self, id: String, entry: Entry, now: Instant) {
        let mut map = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= MAX_SESSIONS {
            map.retain(|_, e| e.live(now));
        }
        while map.len() >= MAX_SESSIONS {
            let oldest = map
                .iter()
                .min_by_key(|(_, e)| e.created)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => map.remove(&k),
                None => break,
            };
        }
        map.insert(id, entry);
    }

    /// The live session `id`, its idle clock restarted; an expired one is dropped.
    pub fn get(&self, id: &str, now: Instant) -> Option<Entry> {
        let mut map = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        let live = map.get(id).is_some_and(|e| e.live(now));
        if !live {
            map.remove(id);
            return None;
        }
        let e = map.get_mut(id)?;
        e.last = now;
        Some(e.clone())
    }

    pub fn remove(&self, id: &str) {
        let mut map = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        map.remove(id);
    }

    /// Whether `peer` has failed too many sign-ins in the current window.
    pub fn blocked(&self, peer: IpAddr, now: Instant) -> bool {
        let map = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(&peer).is_some_and(|(start, n)| {
            now.saturating_duration_since(*start) < FAILURE_WINDOW && *n >= MAX_FAILURES
        })
    }

    /// Counts a failed sign-in from `peer`.
    pub fn failed(&self, peer: IpAddr, now: Instant) {
        let mut map = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= MAX_FAILING_PEERS && !map.contains_key(&peer) {
            map.retain(|_, (start, _)| now.saturating_duration_since(*start) < FAILURE_WINDOW);
            if map.len() >= MAX_FAILING_PEERS {
                // Every remembered address failed this minute: forget the oldest window.
                if let Some(k) = map.iter().min_by_key(|(_, (s, _))| *s).map(|(k, _)| *k) {
                    map.remove(&k);
                }
            }
        }
        let slot = map.entry(peer).or_insert((now, 0));
        if now.saturating_duration_since(slot.0) >= FAILURE_WINDOW {
            *slot = (now, 0);
        }
        slot.1 = slot.1.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, now: Instant) -> Entry {
        Entry::new(
            name.to_string(),
            BTreeSet::from([AdminScope::Read]),
            Via::Policy,
            None,
            "c".repeat(64),
            now,
        )
    }

    #[test]
    fn a_full_store_evicts_the_oldest_session() {
        let store = Store::default();
        let t0 = Instant::now();
        for i in 0..MAX_SESSIONS {
            store.insert(
                format!("s{i}"),
                entry("x", t0 + Duration::from_millis(i as u64)),
                t0,
            );
        }
        let later = t0 + Duration::from_secs(1);
        store.insert("new".to_string(), entry("new", later), later);
        assert!(store.get("s0", later).is_none(), "the oldest was kept");
        assert!(store.get("s1", later).is_some());
        assert!(store.get("new", later).is_some());
        let count = store.sessions.lock().map(|m| m.len()).unwrap_or(0);
        assert_eq!(count, MAX_SESSIONS);
    }

    #[test]
    fn sessions_end_when_idle_and_after_the_absolute_limit() {
        let store = Store::default();
        let t0 = Instant::now();
        store.insert("a".to_string(), entry("a", t0), t0);
        let idle = t0 + IDLE + Duration::from_secs(1);
        assert!(store.get("a", idle).is_none(), "an idle session lived on");
        assert!(store.get("a", t0).is_none(), "an expired session was kept");

        store.insert("b".to_string(), entry("b", t0), t0);
        // Used every 20 minutes, it still ends at 8 h.
        let mut t = t0;
        while t < t0 + ABSOLUTE - Duration::from_secs(20 * 60) {
            t += Duration::from_secs(20 * 60);
            assert!(store.get("b", t).is_some(), "ended early at {:?}", t - t0);
        }
        assert!(store.get("b", t0 + ABSOLUTE).is_none());
        store.insert("c".to_string(), entry("c", t0), t0);
        store.remove("c");
        assert!(store.get("c", t0).is_none());
    }

    #[test]
    fn failed_sign_ins_are_limited_per_address_per_minute() {
        let store = Store::default();
        let t0 = Instant::now();
        let peer: IpAddr = [127, 0, 0, 1].into();
        let other: IpAddr = [127, 0, 0, 2].into();
        for _ in 0..MAX_FAILURES {
            assert!(!store.blocked(peer, t0));
            store.failed(peer, t0);
        }
        assert!(store.blocked(peer, t0));
        assert!(!store.blocked(other, t0));
        assert!(!store.blocked(peer, t0 + FAILURE_WINDOW));
    }
}

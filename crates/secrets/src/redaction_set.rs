//! The redaction set's bookkeeping: values handed out (minted, live per key) and values no
//! longer in use (retired), with the caps and ages that bound them, and the generation
//! counters a matcher build is checked against. See the [`super::store`] docs for the rules.
//!
//! Plain data behind one mutex; knows no sources and builds no matcher.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::store::lock;
use super::SecretValue;

/// How long a value is still redacted after it was last handed out (or rotated out).
pub const RETIRED_KEEP: Duration = Duration::from_secs(3600);
/// Live minted values per name (one per host/identity key); past it the least recently used
/// one is retired.
pub const MAX_LIVE_PER_NAME: usize = 64;
/// Retired values kept per name; past it the oldest leaves the redaction set early.
pub const MAX_RETIRED_PER_NAME: usize = 32;
/// Retired values kept in all; past it the oldest leaves the redaction set early.
pub const MAX_RETIRED: usize = 256;

/// A minted value in use under one key, and when it was last handed out.
pub(super) struct Live {
    pub(super) value: SecretValue,
    pub(super) used: Instant,
}

/// A value no longer current, and when it stopped being handed out.
pub(super) struct Retired {
    pub(super) name: Arc<str>,
    pub(super) value: SecretValue,
    pub(super) at: Instant,
}

/// How the redaction set changed. An addition makes every older matcher unsafe (it would miss
/// the value); a removal does not (an older matcher only looks for more).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Change {
    pub(super) added: bool,
    pub(super) removed: bool,
}

impl std::ops::BitOrAssign for Change {
    fn bitor_assign(&mut self, other: Change) {
        self.added |= other.added;
        self.removed |= other.removed;
    }
}

/// The redaction set, apart from the sources' current values (which live in their slots).
#[derive(Default)]
pub(super) struct Values {
    /// Minted values in use, by name, then by key (host/identity; `""` for one per name).
    pub(super) live: HashMap<Arc<str>, HashMap<String, Live>>,
    /// Values no longer current, ordered by `at`, oldest first.
    pub(super) retired: VecDeque<Retired>,
}

impl Values {
    pub(super) fn retired_index(&self, name: &str, value: &SecretValue) -> Option<usize> {
        self.retired
            .iter()
            .position(|r| &*r.name == name && &r.value == value)
    }

    pub(super) fn is_live(&self, name: &str, value: &SecretValue) -> bool {
        self.live
            .get(name)
            .is_some_and(|m| m.values().any(|l| &l.value == value))
    }

    /// Adds a retired value (a known one keeps the later of its two times). A value moved here
    /// from the live set (or a slot) was in the set already: then only an eviction the caps
    /// force is a change.
    pub(super) fn retire(&mut self, name: &Arc<str>, value: SecretValue, at: Instant) -> Change {
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
    pub(super) fn demote(&mut self, name: &Arc<str>, value: SecretValue, at: Instant) -> Change {
        Change {
            added: false,
            removed: self.retire(name, value, at).removed,
        }
    }

    pub(super) fn insert_retired(&mut self, r: Retired) {
        let i = self.retired.partition_point(|x| x.at <= r.at);
        self.retired.insert(i, r);
    }

    /// Drops the oldest retired values past [`MAX_RETIRED_PER_NAME`] and [`MAX_RETIRED`].
    pub(super) fn enforce_retired_caps(&mut self, name: &str) -> bool {
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
    pub(super) fn mint(
        &mut self,
        name: &str,
        key: &str,
        value: &SecretValue,
        now: Instant,
    ) -> Change {
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
    pub(super) fn sweep(&mut self, now: Instant) -> (bool, Option<Instant>) {
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

    pub(super) fn count(&self) -> usize {
        self.retired.len() + self.live.values().map(HashMap::len).sum::<usize>()
    }
}

/// The redaction set every generation's store (and their background refreshes) share.
pub(super) struct Shared {
    pub(super) values: Mutex<Values>,
    /// Bumped (with `values` locked) whenever the redaction set changes.
    pub(super) generation: AtomicU64,
    /// Bumped (with `values` locked, after the value is in) whenever a value is added: a
    /// matcher built before the last addition may miss a value handed out.
    pub(super) added: AtomicU64,
    /// When the next value is due to leave the set, in milliseconds since `epoch` (`u64::MAX`:
    /// none is).
    pub(super) next_sweep_ms: AtomicU64,
    pub(super) epoch: Instant,
}

impl Shared {
    pub(super) fn new(generation: u64) -> Self {
        Self {
            values: Mutex::new(Values::default()),
            generation: AtomicU64::new(generation),
            added: AtomicU64::new(0),
            next_sweep_ms: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
        }
    }

    /// Records a change of the set; call it with `values` locked.
    pub(super) fn bump(&self, change: Change) {
        if change.added {
            self.added.fetch_add(1, Ordering::AcqRel);
        }
        if change.added || change.removed {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Lowers the next sweep time to `at` if it is earlier.
    pub(super) fn sweep_by(&self, at: Instant) {
        let ms = u64::try_from(at.saturating_duration_since(self.epoch).as_millis())
            .unwrap_or(u64::MAX - 1);
        self.next_sweep_ms.fetch_min(ms, Ordering::AcqRel);
    }

    pub(super) fn mint(&self, name: &str, key: &str, value: &SecretValue) {
        let now = Instant::now();
        let mut v = lock(&self.values);
        let change = v.mint(name, key, value, now);
        self.bump(change);
        drop(v);
        self.sweep_by(now + RETIRED_KEEP);
    }

    /// Adds a value to the set as retired now (a value a detached slot took on).
    pub(super) fn remember(&self, name: &str, value: &SecretValue) {
        let now = Instant::now();
        let mut v = lock(&self.values);
        let change = v.retire(&Arc::from(name), value.clone(), now);
        self.bump(change);
        drop(v);
        self.sweep_by(now + RETIRED_KEEP);
    }

    /// Drops values out of use for [`RETIRED_KEEP`], when one is due. Returns whether any
    /// left the set.
    pub(super) fn sweep_if_due(&self) -> bool {
        let due = self.next_sweep_ms.load(Ordering::Acquire);
        if due == u64::MAX || self.epoch.elapsed().as_millis() < u128::from(due) {
            return false;
        }
        self.sweep_at(Instant::now())
    }

    pub(super) fn sweep_at(&self, now: Instant) -> bool {
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

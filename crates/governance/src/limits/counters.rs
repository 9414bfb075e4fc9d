//! The limiter's counters: token buckets, concurrency slots and budget reservations, kept in
//! memory (embedded, flushed to the store) or on the shared store.

use super::*;

impl Limiter {
    /// One token from a bucket.
    pub(super) async fn take(
        &self,
        key: &str,
        burst: u64,
        interval: Duration,
    ) -> Result<Taken, StateError> {
        match &self.mode {
            Mode::Shared => self.store.take(key, burst, interval).await,
            Mode::Local(local) => {
                let now = Instant::now();
                let mut buckets = lock(&local.buckets);
                if buckets.len() >= MAX_KEYS && !buckets.contains_key(key) {
                    buckets.retain(|_, tat| *tat > now);
                    if buckets.len() >= MAX_KEYS {
                        return Err(too_many_keys(self.store.describe()));
                    }
                }
                let window = interval.saturating_mul(u32::try_from(burst).unwrap_or(u32::MAX));
                let tat = buckets.get(key).copied().unwrap_or(now).max(now);
                let next = tat + interval;
                let ahead = next - now;
                if ahead > window {
                    let retry_after = ahead - window;
                    let remaining = 0;
                    return Ok(Taken {
                        allowed: false,
                        remaining,
                        retry_after,
                        reset_after: tat - now,
                    });
                }
                match buckets.get_mut(key) {
                    Some(t) => *t = next,
                    None => {
                        buckets.insert(key.to_string(), next);
                    }
                }
                let left = window - ahead;
                let remaining = (left.as_nanos() / interval.as_nanos().max(1)) as u64;
                Ok(Taken {
                    allowed: true,
                    remaining,
                    retry_after: Duration::ZERO,
                    reset_after: ahead,
                })
            }
        }
    }

    /// A concurrency slot, waiting up to `queue`: the slot and how many are held, or `None`
    /// when none came free.
    pub(super) async fn slot(
        &self,
        key: &str,
        holder: &str,
        max: u32,
        queue: Duration,
    ) -> Result<Option<(Slot, u64)>, StateError> {
        match &self.mode {
            Mode::Local(local) => {
                let sem = {
                    let mut sems = lock(&local.semaphores);
                    if sems.len() >= MAX_KEYS && !sems.contains_key(key) {
                        return Err(too_many_keys(self.store.describe()));
                    }
                    let entry = sems
                        .entry(key.to_string())
                        .or_insert_with(|| (max, Arc::new(Semaphore::new(max as usize))));
                    // A reload changed the cap: a new semaphore (permits of the old one go
                    // back to it and are forgotten).
                    if entry.0 != max {
                        *entry = (max, Arc::new(Semaphore::new(max as usize)));
                    }
                    entry.1.clone()
                };
                let permit = match sem.clone().try_acquire_owned() {
                    Ok(p) => Some(p),
                    Err(_) if queue.is_zero() => None,
                    Err(_) => tokio::time::timeout(queue, sem.clone().acquire_owned())
                        .await
                        .ok()
                        .and_then(Result::ok),
                };
                let in_use = u64::from(max) - sem.available_permits() as u64;
                Ok(permit.map(|p| (Slot::Local(p), in_use)))
            }
            Mode::Shared => {
                let deadline = Instant::now() + queue;
                let mut wait = Duration::from_millis(10);
                loop {
                    if let Some(in_use) = self
                        .store
                        .acquire(key, holder, u64::from(max), SLOT_TTL)
                        .await?
                    {
                        let stop = Arc::new(Notify::new());
                        self.renew(
                            key.to_string(),
                            holder.to_string(),
                            u64::from(max),
                            stop.clone(),
                        );
                        let slot = Slot::Shared { stop };
                        return Ok(Some((slot, in_use)));
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(None);
                    }
                    tokio::time::sleep(wait.min(deadline - now)).await;
                    wait = (wait * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    /// Keeps a shared slot alive while its request is in flight.
    pub(super) fn renew(&self, key: String, holder: String, max: u64, stop: Arc<Notify>) {
        let store = self.store.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(SLOT_TTL / 3) => {
                        if let Err(e) = store.acquire(&key, &holder, max, SLOT_TTL).await {
                            tracing::warn!(error = %e, "cannot renew a concurrency slot");
                        }
                    }
                    () = stop.notified() => {
                        if let Err(e) = store.relinquish(&key, &holder).await {
                            tracing::warn!(error = %e, "cannot give a concurrency slot back; it expires by itself");
                        }
                        return;
                    }
                }
            }
        });
    }

    /// Adds `delta` to a budget counter unless that passes `cap`.
    pub(super) async fn reserve(
        &self,
        key: &str,
        delta: i64,
        cap: i64,
        ttl_until: SystemTime,
    ) -> Result<Added, StateError> {
        let added = self.reserve_counter(key, delta, cap, ttl_until).await;
        if let (Ok(Added::Ok(_)), true) = (&added, delta > 0) {
            let mut inflight = lock(&self.inflight);
            if inflight.len() < MAX_KEYS || inflight.contains_key(key) {
                *inflight.entry(key.to_string()).or_insert(0) += delta as u64;
            }
        }
        added
    }

    /// Whether a reservation of `amount` that did not fit (the counter at `current`) would fit
    /// but for what requests in flight here have reserved and not settled.
    pub(super) fn held_in_flight(&self, key: &str, current: i64, amount: u64, cap: i64) -> bool {
        let inflight = self.inflight_of(key);
        let spent = (current.max(0) as u64).saturating_sub(inflight);
        inflight > 0 && spent.saturating_add(amount) <= cap.max(0) as u64
    }

    pub(super) fn inflight_of(&self, key: &str) -> u64 {
        lock(&self.inflight).get(key).copied().unwrap_or(0)
    }

    /// A reservation of `amount` is settled or given back: it is no longer in flight.
    pub(super) fn release(&self, key: &str, amount: u64) {
        if amount > 0 {
            let mut inflight = lock(&self.inflight);
            if let Some(v) = inflight.get_mut(key) {
                *v = v.saturating_sub(amount);
                if *v == 0 {
                    inflight.remove(key);
                }
            }
        }
        self.settled.notify_waiters();
    }

    /// Waits until a reservation is settled somewhere (or, for another replica's, a short
    /// poll), at most until `deadline`.
    pub(super) async fn wait_settle(&self, deadline: Instant) {
        let poll = Duration::from_millis(100);
        let wait = deadline.saturating_duration_since(Instant::now()).min(poll);
        let _ = tokio::time::timeout(wait, self.settled.notified()).await;
    }

    /// [`Limiter::reserve`] on the counter itself.
    pub(super) async fn reserve_counter(
        &self,
        key: &str,
        delta: i64,
        cap: i64,
        ttl_until: SystemTime,
    ) -> Result<Added, StateError> {
        match &self.mode {
            Mode::Shared => {
                let ttl = remaining(ttl_until);
                self.store.add(key, delta, Some(cap), ttl).await
            }
            Mode::Local(local) => {
                self.load(local, key, ttl_until).await?;
                let mut budgets = lock(&local.budgets);
                let Some(cell) = budgets.get_mut(key) else {
                    return Err(too_many_keys(self.store.describe()));
                };
                if delta > 0 && cell.value.saturating_add(delta) > cap {
                    return Ok(Added::Over(cell.value));
                }
                cell.value = cell.value.saturating_add(delta).max(0);
                cell.pending = cell.pending.saturating_add(delta);
                Ok(Added::Ok(cell.value))
            }
        }
    }

    /// Adds `delta` (a settle's difference; negative returns) to a counter, whatever the cap.
    pub(super) async fn adjust(
        &self,
        key: &str,
        delta: i64,
        ttl_until: SystemTime,
    ) -> Result<i64, StateError> {
        if delta == 0 {
            return match &self.mode {
                Mode::Shared => self.store.counter(key).await,
                Mode::Local(local) => Ok(lock(&local.budgets).get(key).map_or(0, |c| c.value)),
            };
        }
        match &self.mode {
            Mode::Shared => match self
                .store
                .add(key, delta, None, remaining(ttl_until))
                .await?
            {
                Added::Ok(v) | Added::Over(v) => Ok(v),
            },
            Mode::Local(local) => {
                self.load(local, key, ttl_until).await?;
                let mut budgets = lock(&local.budgets);
                let Some(cell) = budgets.get_mut(key) else {
                    return Err(too_many_keys(self.store.describe()));
                };
                let before = cell.value;
                cell.value = cell.value.saturating_add(delta).max(0);
                cell.pending = cell.pending.saturating_add(cell.value - before);
                Ok(cell.value)
            }
        }
    }

    /// Applies `delta` to an embedded counter already in memory; `false` when this limiter is
    /// shared or the counter is not in memory (the caller goes through [`Limiter::adjust`]).
    pub(super) fn adjust_now(&self, key: &str, delta: i64) -> bool {
        let Mode::Local(local) = &self.mode else {
            return false;
        };
        let mut budgets = lock(&local.budgets);
        let Some(cell) = budgets.get_mut(key) else {
            return false;
        };
        let before = cell.value;
        cell.value = cell.value.saturating_add(delta).max(0);
        cell.pending = cell.pending.saturating_add(cell.value - before);
        true
    }

    /// Reads an embedded budget counter from the store the first time this process uses it.
    pub(super) async fn load(
        &self,
        local: &Local,
        key: &str,
        ttl_until: SystemTime,
    ) -> Result<(), StateError> {
        if lock(&local.budgets).contains_key(key) {
            return Ok(());
        }
        let stored = self.store.counter(key).await?;
        let mut budgets = lock(&local.budgets);
        if budgets.len() >= MAX_KEYS && !budgets.contains_key(key) {
            let now = SystemTime::now();
            budgets.retain(|_, c| c.expires > now || c.pending != 0);
            if budgets.len() >= MAX_KEYS {
                return Err(too_many_keys(self.store.describe()));
            }
        }
        budgets.entry(key.to_string()).or_insert(Cell {
            value: stored.max(0),
            pending: 0,
            expires: ttl_until,
        });
        Ok(())
    }

    /// Remembers a counter's value for `/limits` and `/metrics`; `None`s keep what was known.
    /// Runs for every charge: a counter seen before is updated in place (no allocation, no
    /// formatting; `/limits` formats the time when it is read).
    pub(super) fn note(
        &self,
        c: &LimitCharge,
        resets: Option<SystemTime>,
        store_key: Option<&str>,
    ) {
        let mut seen = lock(&self.seen);
        if let Some(n) = seen.get_mut(&c.limit, c.measure, &c.key) {
            n.used = c.used;
            n.limit_value = c.limit_value;
            if resets.is_some() {
                n.resets = resets;
            }
            if let Some(k) = store_key.filter(|k| n.store_key.as_deref() != Some(*k)) {
                n.store_key = Some(k.to_string());
            }
            return;
        }
        seen.insert(
            c,
            Noted {
                used: c.used,
                limit_value: c.limit_value,
                resets,
                store_key: store_key.map(str::to_string),
            },
        );
    }
}

/// The last known value of each counter charged, by limit, key and measure: looked up by
/// `&str` (no allocation for a counter seen before), bounded by [`MAX_KEYS`].
#[derive(Default)]
pub(super) struct Seen {
    by_limit: HashMap<String, ByKey>,
    len: usize,
}

/// One limit's counters: by key, then measure (a handful per key).
type ByKey = HashMap<String, Vec<(&'static str, Noted)>>;

/// What [`Seen`] keeps of one counter.
pub(super) struct Noted {
    pub(super) used: u64,
    pub(super) limit_value: u64,
    /// When the window ends (budgets) or the bucket is full (requests).
    pub(super) resets: Option<SystemTime>,
    pub(super) store_key: Option<String>,
}

impl Seen {
    fn get_mut(&mut self, limit: &str, measure: &str, key: &str) -> Option<&mut Noted> {
        self.by_limit
            .get_mut(limit)?
            .get_mut(key)?
            .iter_mut()
            .find(|(m, _)| *m == measure)
            .map(|(_, n)| n)
    }

    /// Adds a counter not seen before; past [`MAX_KEYS`] counters it is not kept.
    fn insert(&mut self, c: &LimitCharge, noted: Noted) {
        if self.len >= MAX_KEYS {
            return;
        }
        self.len += 1;
        self.by_limit
            .entry(c.limit.clone())
            .or_default()
            .entry(c.key.clone())
            .or_default()
            .push((c.measure, noted));
    }

    /// Every counter whose window is still open at `now` (a request bucket always is), as
    /// `/limits` shows it. Windows are compared at the second, as they are shown.
    pub(super) fn open_views(&self, now: SystemTime) -> Vec<CounterView> {
        let secs = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        };
        let now = secs(now);
        let mut out = Vec::new();
        for (limit, by_key) in &self.by_limit {
            for (key, measures) in by_key {
                for (measure, n) in measures {
                    if *measure != "requests" && n.resets.is_some_and(|r| secs(r) <= now) {
                        continue;
                    }
                    out.push(CounterView {
                        limit: limit.clone(),
                        measure,
                        key: key.clone(),
                        used: n.used,
                        limit_value: n.limit_value,
                        remaining: n.limit_value.saturating_sub(n.used),
                        reserved: 0,
                        resets_at: n
                            .resets
                            .map(|t| humantime::format_rfc3339_seconds(t).to_string()),
                        store_key: n.store_key.clone(),
                    });
                }
            }
        }
        out
    }
}

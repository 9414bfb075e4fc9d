//! Limits and budgets: charging a request to the `[limits]` its rule, identity and credential
//! name — reserved before the request is sent, settled when its response ends.
//!
//! For each limit a request charges, in order: its `requests` token bucket, a `concurrency`
//! slot (waiting up to `queue`), then a reservation against each budget (`bytes_up`,
//! `llm_tokens`, `spend`) in its aligned window. Any refusal gives back what was already
//! taken. When the response ends, [`Admission::settle`] charges what the call actually used
//! (the difference to the reservation is added or returned); a request that fails before any
//! response returns its reservations. So concurrent requests overshoot a budget by at most
//! what their reservations under-estimated, never by an unbounded amount.
//!
//! Two ways to keep counters, chosen by the state store:
//! - **embedded** (SQLite): counters live in this process's memory — a reservation is a mutex
//!   and an addition — and their changes are written to the store every [`FLUSH_EVERY`] (and
//!   when latchkey stops), so a restart does not reset a daily budget. A budget key is read
//!   from the store the first time it is used. One process per state file: replicas use Redis.
//!   A kill -9 forgets at most the last [`FLUSH_EVERY`] of charges.
//! - **shared** (Redis): every bucket, slot and reservation is one atomic step on the store
//!   (Lua), so every replica enforces one budget together.
//!
//! When the store cannot answer, a limit refuses (`503 limits_unavailable`) unless it says
//! `on_store_error = "allow"`, in which case the record marks the measure `unchecked`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::usage::{Provider, Usage};
use crate::audit::{LimitCharge, UsageInfo};
use crate::policy::limits::{Limit, Measure, OnStoreError, Per, PriceTable, Quota};
use crate::reason::{Reason, Refusal};
use crate::state::{Added, StateError, StateStore, Taken};

/// How often the embedded limiter writes counter changes to the store.
pub const FLUSH_EVERY: Duration = Duration::from_millis(250);
/// Most counters the embedded limiter keeps in memory (and keys `/limits` lists); past it,
/// a request under a new key fails closed like a store error.
pub const MAX_KEYS: usize = 100_000;
/// A shared concurrency slot expires this long after its last renewal (a replica that dies
/// frees its slots by then); a held slot is renewed every third of it.
const SLOT_TTL: Duration = Duration::from_secs(30);
/// A streamed upload of unknown length (or a WebSocket's messages) reserves `bytes_up` this
/// much at a time, at most ([`upload_block`]).
const UPLOAD_BLOCK: u64 = 256 * 1024;

/// The block a stream reserves at a time under a budget of `cap` bytes: a sixteenth of it, at
/// most [`UPLOAD_BLOCK`], so one stream does not hold a small budget's room from the others.
fn upload_block(cap: u64) -> u64 {
    (cap / 16).clamp(1, UPLOAD_BLOCK)
}
/// A budget counter outlives its window by this much (a late settle still finds it).
const WINDOW_SLACK: Duration = Duration::from_secs(3600);

/// Whose request this is: what a limit's `per` picks its key from.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub identity: &'a str,
    pub rule: &'a str,
    pub credential: Option<&'a str>,
    /// The host as the matching rule names it (`*.example.com` for a wildcard), for
    /// `bytes_up`: subdomains of one wildcard share one exfiltration budget.
    pub host: &'a str,
    /// A unique id for this request (its audit id): the holder of a shared slot.
    pub request_id: &'a str,
}

/// What a request will cost, as far as known before it is sent.
#[derive(Debug, Clone, Default)]
pub struct Estimate {
    /// The bytes of the request's head (request line and headers, [`head_len`]): reserved
    /// against `bytes_up` before anything else, so even a body-less request needs room.
    pub head_up: u64,
    /// The request body's length (and its trailers), when known (`Content-Length`, or held
    /// whole); `None`: it streams (an upload of unknown length, or a WebSocket's messages),
    /// and `bytes_up` is reserved block by block as it goes.
    pub bytes_up: Option<u64>,
    /// A model-provider call: what to reserve against `llm_tokens` and `spend`.
    pub llm: Option<LlmEstimate>,
}

/// The reservation for a model-provider call.
#[derive(Debug, Clone)]
pub struct LlmEstimate {
    pub provider: Provider,
    pub model: Option<String>,
    /// Input estimate plus the most output tokens the call may produce.
    pub tokens: u64,
    /// What those tokens cost at most, in micro-USD; `None` when the model has no price.
    pub cost_micros: Option<u64>,
}

/// What the admission learned about a request's rate, for `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateHeaders {
    pub limit: u64,
    pub remaining: u64,
    /// Seconds until the bucket is full again.
    pub reset: u64,
}

/// A refused admission: the refusal to answer with, what to put in the record, and the
/// headers that tell the client when to retry.
#[derive(Debug)]
pub struct Refused {
    pub refusal: Refusal,
    pub retry_after: Option<u64>,
    pub rate: Option<RateHeaders>,
    pub charges: Vec<LimitCharge>,
}

/// A store's counters, as this process sees them: in memory (embedded) or on the store.
enum Mode {
    Local(Local),
    Shared,
}

/// The embedded limiter's memory.
#[derive(Default)]
struct Local {
    /// GCRA: the theoretical arrival time of each bucket.
    buckets: Mutex<HashMap<String, Instant>>,
    budgets: Mutex<HashMap<String, Cell>>,
    semaphores: Mutex<HashMap<String, (u32, Arc<Semaphore>)>>,
}

/// One budget counter in memory.
#[derive(Debug, Clone, Copy)]
struct Cell {
    value: i64,
    /// Added since the last flush (negative: returned).
    pending: i64,
    /// The window's end plus slack: when the counter (and its stored copy) goes.
    expires: SystemTime,
}

/// The last value seen of each counter, for `GET /limits` and `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CounterView {
    pub limit: String,
    pub measure: &'static str,
    pub key: String,
    pub used: u64,
    pub limit_value: u64,
    pub remaining: u64,
    /// RFC 3339: when the window ends (budgets) or the bucket is full (requests).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resets_at: Option<String>,
    /// Where the counter is kept (not shown).
    #[serde(skip)]
    pub store_key: Option<String>,
}

/// Charges requests to limits. One per running latchkey, over its state store.
pub struct Limiter {
    store: Arc<dyn StateStore>,
    mode: Mode,
    /// What this process's requests in flight have reserved of each budget counter and not
    /// settled yet: tells a budget spent from one held by reservations (`budget_reserved`).
    inflight: Mutex<HashMap<String, u64>>,
    /// Woken when a reservation is settled or given back (a request waiting in `queue`).
    settled: Notify,
    /// The last known value of each counter (bounded by [`MAX_KEYS`]).
    seen: Mutex<HashMap<(String, &'static str, String), CounterView>>,
    /// Stops the embedded flusher.
    stop: Notify,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.store.describe())
            .field("embedded", &matches!(self.mode, Mode::Local(_)))
            .finish_non_exhaustive()
    }
}

/// A budget reservation an admission holds.
#[derive(Debug, Clone)]
struct Held {
    limit: String,
    measure: Measure,
    store_key: String,
    /// Index of this measure's entry in the admission's charges.
    charge: usize,
    reserved: u64,
    ttl_until: SystemTime,
    /// For a streamed upload: its budget in [`Upload::budgets`] (what it reserved is there).
    upload: Option<usize>,
}

/// A concurrency slot an admission holds.
enum Slot {
    Local(#[allow(dead_code)] OwnedSemaphorePermit),
    /// Its renewal task gives the slot back when told to stop.
    Shared {
        stop: Arc<Notify>,
    },
}

/// An admitted request's hold on its limits. Settle it when the response ends
/// ([`Admission::settle`]); dropped unsettled (the request failed before a response), it
/// returns every reservation and slot.
pub struct Admission {
    limiter: Arc<Limiter>,
    /// The request head's bytes, charged to `bytes_up` with the body.
    head_up: u64,
    held: Vec<Held>,
    slots: Vec<Slot>,
    charges: Vec<LimitCharge>,
    rate: Option<RateHeaders>,
    /// For a streamed upload: what is reserved of `bytes_up` beyond what was sent.
    upload: Option<Arc<Upload>>,
    llm: Option<LlmEstimate>,
    settled: bool,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("charges", &self.charges)
            .finish_non_exhaustive()
    }
}

/// `bytes_up` reservations for an upload that streams: each [`UPLOAD_BLOCK`] is reserved
/// before its bytes go.
pub struct Upload {
    limiter: Arc<Limiter>,
    budgets: Vec<UploadBudget>,
    /// Bytes sent so far.
    sent: AtomicU64,
    /// Which budget cut the upload off, if one did (its charge is marked refused).
    cut: Mutex<Option<String>>,
}

/// One `bytes_up` budget a streamed upload is charged to.
struct UploadBudget {
    store_key: String,
    limit: String,
    display: String,
    cap: u64,
    ttl_until: SystemTime,
    /// Bytes reserved so far.
    reserved: AtomicU64,
}

impl Upload {
    /// Whether `len` more bytes fit in what every budget has reserved (no store call).
    pub fn fits(&self, len: u64) -> bool {
        let after = self.sent.load(Ordering::Relaxed) + len;
        self.budgets
            .iter()
            .all(|b| b.reserved.load(Ordering::Relaxed) >= after)
    }

    /// Accounts `len` bytes about to be sent, reserving more of each budget first if they do
    /// not fit; a refusal (`budget_exhausted`, or `limits_unavailable` when the store cannot
    /// answer) when a budget has no room left. The bytes count as sent on success only.
    pub async fn send(&self, len: u64) -> Result<(), Refusal> {
        let after = self.sent.load(Ordering::Relaxed) + len;
        for b in &self.budgets {
            while b.reserved.load(Ordering::Relaxed) < after {
                let need = (after - b.reserved.load(Ordering::Relaxed)).max(upload_block(b.cap));
                let cap = i64::try_from(b.cap).unwrap_or(i64::MAX);
                let want = i64::try_from(need).unwrap_or(i64::MAX);
                let added = self
                    .limiter
                    .reserve(&b.store_key, want, cap, b.ttl_until)
                    .await;
                let got = match added {
                    Ok(Added::Ok(_)) => need,
                    Ok(Added::Over(current)) => {
                        let left = cap.saturating_sub(current).max(0) as u64;
                        let short = after - b.reserved.load(Ordering::Relaxed);
                        if left < short {
                            *lock(&self.cut) = Some(b.store_key.clone());
                            return Err(Refusal::new(
                                Reason::BudgetExhausted,
                                format!(
                                    "limit {:?}: bytes_up budget for {} ({} bytes) used up during this upload; it was cut off",
                                    b.limit, b.display, b.cap
                                ),
                            ));
                        }
                        match self
                            .limiter
                            .reserve(&b.store_key, left as i64, cap, b.ttl_until)
                            .await
                        {
                            Ok(Added::Ok(_)) => left,
                            Ok(Added::Over(_)) => continue,
                            Err(e) => return Err(upload_store_error(&b.limit, &e)),
                        }
                    }
                    Err(e) => return Err(upload_store_error(&b.limit, &e)),
                };
                b.reserved.fetch_add(got, Ordering::Relaxed);
            }
        }
        self.sent.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    /// Accounts `len` bytes that fit (after [`Upload::fits`]).
    pub fn sent(&self, len: u64) {
        self.sent.fetch_add(len, Ordering::Relaxed);
    }
}

fn upload_store_error(limit: &str, e: &StateError) -> Refusal {
    Refusal::new(
        Reason::LimitsUnavailable,
        format!("limit {limit:?}: {e}; the upload was cut off (the limit fails closed)"),
    )
}

impl Limiter {
    /// A limiter over `store`: embedded (counters in memory, flushed to the store) when the
    /// store is SQLite, shared (every step on the store) otherwise.
    pub fn new(store: Arc<dyn StateStore>) -> Arc<Limiter> {
        let embedded = store.describe().starts_with("sqlite:");
        let limiter = Arc::new(Limiter {
            store,
            mode: if embedded {
                Mode::Local(Local::default())
            } else {
                Mode::Shared
            },
            inflight: Mutex::new(HashMap::new()),
            settled: Notify::new(),
            seen: Mutex::new(HashMap::new()),
            stop: Notify::new(),
        });
        if embedded {
            let weak = Arc::downgrade(&limiter);
            tokio::spawn(async move {
                loop {
                    let Some(l) = weak.upgrade() else { return };
                    tokio::select! {
                        () = tokio::time::sleep(FLUSH_EVERY) => {}
                        () = l.stop.notified() => { l.flush().await; return; }
                    }
                    l.flush().await;
                }
            });
        }
        limiter
    }

    /// The store's description, for `/limits` and messages.
    pub fn store(&self) -> &str {
        self.store.describe()
    }

    /// Whether counters live in this process (embedded) rather than on a shared store.
    pub fn embedded(&self) -> bool {
        matches!(self.mode, Mode::Local(_))
    }

    /// Writes every embedded counter change to the store now (at shutdown; also every
    /// [`FLUSH_EVERY`]). A change the store refuses stays pending for the next flush.
    pub async fn flush(&self) {
        let Mode::Local(local) = &self.mode else {
            return;
        };
        let now = SystemTime::now();
        let pending: Vec<(String, i64, SystemTime)> = {
            let mut budgets = lock(&local.budgets);
            budgets.retain(|_, c| c.expires > now || c.pending != 0);
            budgets
                .iter_mut()
                .filter(|(_, c)| c.pending != 0)
                .map(|(k, c)| (k.clone(), std::mem::take(&mut c.pending), c.expires))
                .collect()
        };
        for (key, delta, expires) in pending {
            let ttl = expires
                .duration_since(now)
                .unwrap_or(Duration::from_secs(1));
            if let Err(e) = self.store.add(&key, delta, None, ttl).await {
                tracing::warn!(error = %e, "cannot write a limit counter to the state store; will retry");
                if let Some(c) = lock(&local.budgets).get_mut(&key) {
                    c.pending += delta;
                }
            }
        }
        // Full buckets and idle semaphores hold no information: forget them.
        let instant = Instant::now();
        lock(&local.buckets).retain(|_, tat| *tat > instant);
        lock(&local.semaphores).retain(|_, (max, s)| s.available_permits() < *max as usize);
    }

    /// Stops the embedded flusher after one last flush.
    pub async fn shutdown(&self) {
        self.flush().await;
        self.stop.notify_one();
    }

    /// Admits a request under `limits`, or refuses it. Nothing is charged on a refusal.
    pub async fn admit(
        self: &Arc<Self>,
        limits: &[&Limit],
        who: Subject<'_>,
        estimate: &Estimate,
    ) -> Result<Admission, Box<Refused>> {
        let started = Instant::now();
        let mut admission = Admission {
            limiter: self.clone(),
            head_up: estimate.head_up,
            held: Vec::new(),
            slots: Vec::new(),
            charges: Vec::new(),
            rate: None,
            upload: None,
            llm: estimate.llm.clone(),
            settled: false,
        };
        let now = SystemTime::now();
        // Buckets and slots first: a request refused for its rate reserves nothing.
        for limit in limits {
            let key = subject_key(limit.per, &who);
            if let Some(rate) = &limit.requests {
                let store_key = format!("lim:{}:requests:{key}", limit.name);
                let burst = u64::from(rate.count);
                let taken = self.take(&store_key, burst, rate.interval()).await;
                let mut charge = charge(limit, Measure::Requests, &key, 1, 0, burst);
                match taken {
                    Ok(t) => {
                        charge.used = burst - t.remaining.min(burst);
                        let headers = RateHeaders {
                            limit: burst,
                            remaining: t.remaining,
                            reset: ceil_secs(t.reset_after),
                        };
                        if admission
                            .rate
                            .is_none_or(|r| headers.remaining < r.remaining)
                        {
                            admission.rate = Some(headers);
                        }
                        self.note(&charge, Some(now + t.reset_after), Some(&store_key));
                        if !t.allowed {
                            charge.refused = true;
                            admission.charges.push(charge);
                            let retry = ceil_secs(t.retry_after).max(1);
                            return Err(admission.refuse(
                                Reason::RateLimited,
                                format!(
                                    "limit {:?}: {} requests/{} for {key} used up; retry in {retry}s",
                                    limit.name,
                                    rate.count,
                                    rate.period.as_str()
                                ),
                                Some(retry),
                            ));
                        }
                    }
                    Err(e) => {
                        let c = admission.store_failed(limit, charge, &e)?;
                        admission.charges.push(c);
                        continue;
                    }
                }
                admission.charges.push(charge);
            }
            if let Some(conc) = &limit.concurrency {
                let store_key = format!("lim:{}:concurrency:{key}", limit.name);
                let max = u64::from(conc.max);
                let mut charge = charge(limit, Measure::Concurrency, &key, 1, 0, max);
                match self
                    .slot(&store_key, who.request_id, conc.max, conc.queue)
                    .await
                {
                    Ok(Some((slot, in_use))) => {
                        charge.used = in_use;
                        admission.slots.push(slot);
                        self.note(&charge, None, Some(&store_key));
                    }
                    Ok(None) => {
                        charge.refused = true;
                        charge.used = max;
                        admission.charges.push(charge);
                        return Err(admission.refuse(
                            Reason::RateLimited,
                            format!(
                                "limit {:?}: {} requests in flight for {key}, its concurrency cap; no slot came free within {}",
                                limit.name,
                                conc.max,
                                humantime::format_duration(conc.queue)
                            ),
                            Some(1),
                        ));
                    }
                    Err(e) => {
                        let c = admission.store_failed(limit, charge, &e)?;
                        admission.charges.push(c);
                        continue;
                    }
                }
                admission.charges.push(charge);
            }
        }
        // Budgets: reserve the estimate in the current window.
        let mut uploads = Vec::new();
        for limit in limits {
            let key = subject_key(limit.per, &who);
            let budgets: [(Measure, Option<&Quota>, Option<u64>); 3] = [
                (
                    Measure::BytesUp,
                    limit.bytes_up.as_ref(),
                    Some(
                        estimate
                            .head_up
                            .saturating_add(estimate.bytes_up.unwrap_or(0)),
                    ),
                ),
                (
                    Measure::LlmTokens,
                    limit.llm_tokens.as_ref(),
                    estimate.llm.as_ref().map(|l| l.tokens),
                ),
                (
                    Measure::Spend,
                    limit.spend.as_ref(),
                    estimate.llm.as_ref().map(|l| l.cost_micros.unwrap_or(0)),
                ),
            ];
            for (measure, quota, amount) in budgets {
                let (Some(quota), Some(mut amount)) = (quota, amount) else {
                    continue;
                };
                if measure == Measure::Spend {
                    if let Some(llm) = estimate.llm.as_ref().filter(|l| l.cost_micros.is_none()) {
                        let model = llm.model.as_deref().unwrap_or("(none named)");
                        let c = charge(limit, measure, &key, 0, 0, quota.amount);
                        admission.charges.push(LimitCharge { refused: true, ..c });
                        return Err(admission.refuse(
                            Reason::BudgetExhausted,
                            format!(
                                "limit {:?}: model {model:?} has no price in the price table, so its spend cannot be counted against {} USD/{}; price it with [prices.\"MODEL\"]",
                                limit.name,
                                crate::policy::limits::format_usd(quota.amount),
                                quota.period.as_str()
                            ),
                            None,
                        ));
                    }
                }
                let display = match measure {
                    Measure::BytesUp => format!("{key}@{}", who.host),
                    _ => key.clone(),
                };
                let streamed = measure == Measure::BytesUp && estimate.bytes_up.is_none();
                if streamed {
                    amount = estimate.head_up.saturating_add(upload_block(quota.amount));
                }
                let (start, end) = quota.period.window(now);
                let store_key =
                    format!("lim:{}:{}:{display}:{start}", limit.name, measure.as_str());
                let window_end = SystemTime::UNIX_EPOCH + Duration::from_secs(end);
                let ttl_until = window_end + WINDOW_SLACK;
                let mut charge = charge(limit, measure, &display, amount, 0, quota.amount);
                let cap = i64::try_from(quota.amount).unwrap_or(i64::MAX);
                let delta = i64::try_from(amount).unwrap_or(i64::MAX);
                let mut added = self.reserve(&store_key, delta, cap, ttl_until).await;
                // With a `queue`, a reservation that does not fit only because of others in
                // flight waits for them to settle (until the queue's time is up).
                let deadline = limit
                    .concurrency
                    .as_ref()
                    .filter(|c| !c.queue.is_zero())
                    .map(|c| started + c.queue);
                loop {
                    // A streamed upload takes what is left of its block rather than nothing
                    // (but at least its head).
                    if let (true, Ok(Added::Over(current))) = (streamed, &added) {
                        let left = cap.saturating_sub(*current);
                        if left > 0 && left as u64 >= estimate.head_up {
                            amount = left as u64;
                            charge.charged = amount;
                            added = self.reserve(&store_key, left, cap, ttl_until).await;
                        }
                    }
                    let waiting = match (&added, deadline) {
                        (Ok(Added::Over(v)), Some(d)) => {
                            Instant::now() < d && self.held_in_flight(&store_key, *v, amount, cap)
                        }
                        _ => false,
                    };
                    if !waiting {
                        break;
                    }
                    self.wait_settle(deadline.unwrap_or_else(Instant::now))
                        .await;
                    added = self.reserve(&store_key, delta, cap, ttl_until).await;
                }
                match added {
                    Ok(Added::Ok(v)) => {
                        charge.used = v.max(0) as u64;
                        self.note(&charge, Some(window_end), Some(&store_key));
                        admission.held.push(Held {
                            limit: limit.name.clone(),
                            measure,
                            store_key: store_key.clone(),
                            charge: admission.charges.len(),
                            reserved: amount,
                            ttl_until,
                            upload: streamed.then_some(uploads.len()),
                        });
                        if streamed {
                            uploads.push(UploadBudget {
                                store_key,
                                limit: limit.name.clone(),
                                display: display.clone(),
                                cap: quota.amount,
                                ttl_until,
                                reserved: AtomicU64::new(amount),
                            });
                        }
                    }
                    Ok(Added::Over(v)) => {
                        charge.used = v.max(0) as u64;
                        charge.refused = true;
                        self.note(&charge, Some(window_end), Some(&store_key));
                        admission.charges.push(charge);
                        if self.held_in_flight(&store_key, v, amount, cap) {
                            let inflight = self.inflight_of(&store_key);
                            return Err(admission.refuse(
                                Reason::BudgetReserved,
                                format!(
                                    "limit {:?}: {} budget for {display} has {} of {} {} taken this {}, {} of it reserved by requests still in flight; this request needs {}, which fits once they settle; retry in a moment{}",
                                    limit.name,
                                    measure.as_str(),
                                    shown(measure, v.max(0) as u64),
                                    shown(measure, quota.amount),
                                    unit(measure),
                                    quota.period.as_str(),
                                    shown(measure, inflight),
                                    shown(measure, amount),
                                    if deadline.is_some() { " (its queue time ran out)" } else { " (or give the limit a queue to wait for them)" }
                                ),
                                Some(1),
                            ));
                        }
                        let retry = window_end
                            .duration_since(SystemTime::now())
                            .map_or(1, |d| ceil_secs(d).max(1));
                        return Err(admission.refuse(
                            Reason::BudgetExhausted,
                            format!(
                                "limit {:?}: {} budget for {display} has {} of {} {} used this {}; this request needs {}; it resets at {}",
                                limit.name,
                                measure.as_str(),
                                shown(measure, v.max(0) as u64),
                                shown(measure, quota.amount),
                                unit(measure),
                                quota.period.as_str(),
                                shown(measure, amount),
                                humantime::format_rfc3339_seconds(window_end)
                            ),
                            Some(retry),
                        ));
                    }
                    Err(e) => {
                        let c = admission.store_failed(limit, charge, &e)?;
                        admission.charges.push(c);
                        continue;
                    }
                }
                admission.charges.push(charge);
            }
        }
        if !uploads.is_empty() {
            admission.upload = Some(Arc::new(Upload {
                limiter: self.clone(),
                budgets: uploads,
                // The head goes first: it is sent (and charged) with the reservation.
                sent: AtomicU64::new(estimate.head_up),
                cut: Mutex::new(None),
            }));
        }
        Ok(admission)
    }

    /// One token from a bucket.
    async fn take(&self, key: &str, burst: u64, interval: Duration) -> Result<Taken, StateError> {
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
                buckets.insert(key.to_string(), next);
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
    async fn slot(
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
    fn renew(&self, key: String, holder: String, max: u64, stop: Arc<Notify>) {
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
    async fn reserve(
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
    fn held_in_flight(&self, key: &str, current: i64, amount: u64, cap: i64) -> bool {
        let inflight = self.inflight_of(key);
        let spent = (current.max(0) as u64).saturating_sub(inflight);
        inflight > 0 && spent.saturating_add(amount) <= cap.max(0) as u64
    }

    fn inflight_of(&self, key: &str) -> u64 {
        lock(&self.inflight).get(key).copied().unwrap_or(0)
    }

    /// A reservation of `amount` is settled or given back: it is no longer in flight.
    fn release(&self, key: &str, amount: u64) {
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
    async fn wait_settle(&self, deadline: Instant) {
        let poll = Duration::from_millis(100);
        let wait = deadline.saturating_duration_since(Instant::now()).min(poll);
        let _ = tokio::time::timeout(wait, self.settled.notified()).await;
    }

    /// [`Limiter::reserve`] on the counter itself.
    async fn reserve_counter(
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
    async fn adjust(
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
    fn adjust_now(&self, key: &str, delta: i64) -> bool {
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
    async fn load(
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
    fn note(&self, c: &LimitCharge, resets: Option<SystemTime>, store_key: Option<&str>) {
        let mut seen = lock(&self.seen);
        let id = (c.limit.clone(), c.measure, c.key.clone());
        if seen.len() >= MAX_KEYS && !seen.contains_key(&id) {
            return;
        }
        let old = seen.get(&id);
        let resets_at = resets
            .map(|t| humantime::format_rfc3339_seconds(t).to_string())
            .or_else(|| old.and_then(|o| o.resets_at.clone()));
        let store_key = store_key
            .map(str::to_string)
            .or_else(|| old.and_then(|o| o.store_key.clone()));
        let view = CounterView {
            limit: c.limit.clone(),
            measure: c.measure,
            key: c.key.clone(),
            used: c.used,
            limit_value: c.limit_value,
            remaining: c.limit_value.saturating_sub(c.used),
            resets_at,
            store_key,
        };
        seen.insert(id, view);
    }

    /// Every counter this process has charged, with its last known value, sorted. Windows
    /// that have ended are left out.
    pub fn counters(&self) -> Vec<CounterView> {
        let now = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        let mut list: Vec<CounterView> = lock(&self.seen)
            .values()
            .filter(|u| u.measure == "requests" || u.resets_at.as_ref().is_none_or(|r| *r > now))
            .cloned()
            .collect();
        list.sort_by(|a, b| (&a.limit, a.measure, &a.key).cmp(&(&b.limit, b.measure, &b.key)));
        list
    }

    /// [`Limiter::counters`] with budgets and concurrency read again from the store when it is
    /// shared (another replica may have charged them since): for `GET /limits`. A counter the
    /// store cannot read keeps its last known value.
    pub async fn current(&self) -> Vec<CounterView> {
        let mut list = self.counters();
        if let (Mode::Local(local), false) = (&self.mode, list.is_empty()) {
            let budgets = lock(&local.budgets);
            let sems = lock(&local.semaphores);
            for v in &mut list {
                let Some(key) = v.store_key.as_ref() else {
                    continue;
                };
                if let Some(c) = budgets.get(key) {
                    v.used = c.value.max(0) as u64;
                } else if let Some((max, sem)) = sems.get(key) {
                    v.used = u64::from(*max).saturating_sub(sem.available_permits() as u64);
                }
                v.remaining = v.limit_value.saturating_sub(v.used);
            }
            return list;
        }
        for v in &mut list {
            let Some(key) = v.store_key.clone() else {
                continue;
            };
            let read = match v.measure {
                "requests" => continue,
                "concurrency" => self.store.holders(&key).await.map(|n| n as i64),
                _ => self.store.counter(&key).await,
            };
            if let Ok(n) = read {
                v.used = n.max(0) as u64;
                v.remaining = v.limit_value.saturating_sub(v.used);
            }
        }
        list
    }
}

impl Admission {
    /// The charges so far, for the record.
    pub fn charges(&self) -> &[LimitCharge] {
        &self.charges
    }

    /// `x-ratelimit-*` values from the tightest request bucket charged, if any.
    pub fn rate(&self) -> Option<RateHeaders> {
        self.rate
    }

    /// The `bytes_up` reservations of a streamed upload, to wrap its body with.
    pub fn upload(&self) -> Option<Arc<Upload>> {
        self.upload.clone()
    }

    /// The model-provider call this admission reserved for, if any.
    pub fn llm(&self) -> Option<&LlmEstimate> {
        self.llm.as_ref()
    }

    /// A refusal: everything taken so far is given back (by dropping `self`).
    fn refuse(self, reason: Reason, message: String, retry_after: Option<u64>) -> Box<Refused> {
        let refused = Refused {
            refusal: Refusal::new(reason, message),
            retry_after,
            rate: self.rate,
            charges: self.charges.clone(),
        };
        drop(self);
        Box::new(refused)
    }

    /// A store error under `limit`: fail closed, or (`on_store_error = "allow"`) go on and
    /// mark the measure unchecked.
    fn store_failed(
        &mut self,
        limit: &Limit,
        charge: LimitCharge,
        e: &StateError,
    ) -> Result<LimitCharge, Box<Refused>> {
        if limit.on_store_error == OnStoreError::Allow {
            tracing::warn!(limit = %limit.name, error = %e, "limit not checked: the state store cannot answer and the limit allows that");
            return Ok(LimitCharge {
                unchecked: true,
                ..charge
            });
        }
        let mut this = std::mem::replace(self, Admission::empty(self.limiter.clone()));
        this.charges.push(LimitCharge {
            refused: true,
            ..charge
        });
        Err(this.refuse(
            Reason::LimitsUnavailable,
            format!(
                "limit {:?}: {e}; the limit fails closed (on_store_error = \"allow\" would let requests through unchecked)",
                limit.name
            ),
            Some(1),
        ))
    }

    fn empty(limiter: Arc<Limiter>) -> Admission {
        Admission {
            limiter,
            head_up: 0,
            held: Vec::new(),
            slots: Vec::new(),
            charges: Vec::new(),
            rate: None,
            upload: None,
            llm: None,
            settled: true,
        }
    }

    /// Charges what the request used: its request bytes and, for a model-provider call, the
    /// tokens and money its response reported. `status` is the upstream's (`None`: no
    /// response came). Without usage, a call that got a successful response is charged its
    /// reservation (it may have been billed); one that failed gets it back. Returns the charges
    /// and the usage for the record; the store is updated in the background.
    pub fn settle(
        mut self,
        bytes_up: u64,
        status: Option<u16>,
        usage: Option<&Usage>,
        prices: &PriceTable,
    ) -> (Vec<LimitCharge>, Option<UsageInfo>) {
        self.settled = true;
        let success = status.is_some_and(|s| (200..300).contains(&s));
        let llm = self.llm.take();
        let info = llm
            .as_ref()
            .and_then(|l| usage_info(l, usage, success, prices));
        let mut adjustments = Vec::new();
        for held in std::mem::take(&mut self.held) {
            let actual = match held.measure {
                // A streamed upload counts what it let through (its head included), not what
                // was read.
                Measure::BytesUp => Some(match (held.upload, &self.upload) {
                    (Some(_), Some(u)) => u.sent.load(Ordering::Relaxed),
                    _ => self.head_up.saturating_add(bytes_up),
                }),
                Measure::LlmTokens => match (&info, success) {
                    (Some(i), _) => Some(i.input_tokens + i.output_tokens),
                    (None, _) => Some(0),
                },
                Measure::Spend => match &info {
                    // The cost was whole micro-dollars before it became USD.
                    Some(i) => Some(i.cost.map_or(held.reserved, |c| (c * 1e6).round() as u64)),
                    None => Some(0),
                },
                _ => None,
            };
            let Some(actual) = actual else { continue };
            let reserved = upload_reserved(&held, self.upload.as_deref());
            let cut = self
                .upload
                .as_ref()
                .is_some_and(|u| lock(&u.cut).as_deref() == Some(held.store_key.as_str()));
            if let Some(c) = self.charges.get_mut(held.charge) {
                c.charged = actual;
                // The counter after admission held the first reservation; a stream's later
                // blocks and this settle moved it to `used + actual - first`.
                c.used = (c.used + actual).saturating_sub(held.reserved);
                c.refused |= cut;
            }
            let delta = i64::try_from(actual).unwrap_or(i64::MAX)
                - i64::try_from(reserved).unwrap_or(i64::MAX);
            adjustments.push((held, delta, reserved));
        }
        for c in &self.charges {
            self.limiter.note(c, None, None);
        }
        let limiter = self.limiter.clone();
        // Embedded: the counters are in memory (loaded when reserved), so settle now. A
        // reservation stops being in flight once its counter is settled.
        adjustments.retain(|(held, delta, reserved)| {
            let now = limiter.adjust_now(&held.store_key, *delta);
            if now {
                limiter.release(&held.store_key, *reserved);
            }
            !now
        });
        if !adjustments.is_empty() {
            tokio::spawn(async move {
                for (held, delta, reserved) in adjustments {
                    if let Err(e) = limiter.adjust(&held.store_key, delta, held.ttl_until).await {
                        tracing::warn!(limit = %held.limit, error = %e, "cannot settle a limit's reservation");
                    }
                    limiter.release(&held.store_key, reserved);
                }
            });
        }
        (std::mem::take(&mut self.charges), info)
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        for slot in self.slots.drain(..) {
            if let Slot::Shared { stop, .. } = slot {
                stop.notify_one();
            }
        }
        if self.settled || self.held.is_empty() {
            return;
        }
        // Failed before any response: every reservation goes back (what a streamed upload
        // already sent stays charged: those bytes left).
        let upload = self.upload.clone();
        let limiter = self.limiter.clone();
        let mut rest = Vec::new();
        for h in std::mem::take(&mut self.held) {
            let reserved = upload_reserved(&h, upload.as_deref());
            let sent = match (h.upload, &upload) {
                (Some(_), Some(u)) => u.sent.load(Ordering::Relaxed),
                _ => 0,
            };
            let delta = -(i64::try_from(reserved.saturating_sub(sent)).unwrap_or(i64::MAX));
            if limiter.adjust_now(&h.store_key, delta) {
                limiter.release(&h.store_key, reserved);
            } else {
                rest.push((h, delta, reserved));
            }
        }
        if rest.is_empty() {
            return;
        }
        let give_back = async move {
            for (h, delta, reserved) in rest {
                if let Err(e) = limiter.adjust(&h.store_key, delta, h.ttl_until).await {
                    tracing::warn!(limit = %h.limit, error = %e, "cannot return a limit's reservation");
                }
                limiter.release(&h.store_key, reserved);
            }
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(give_back);
        }
    }
}

/// What a held reservation amounts to now (a streamed upload reserves as it goes).
fn upload_reserved(held: &Held, upload: Option<&Upload>) -> u64 {
    match (held.upload, upload) {
        (Some(i), Some(u)) => u
            .budgets
            .get(i)
            .map_or(held.reserved, |b| b.reserved.load(Ordering::Relaxed)),
        _ => held.reserved,
    }
}

/// The key a limit's counters are kept under for this request.
fn subject_key(per: Per, who: &Subject<'_>) -> String {
    match per {
        Per::Identity => format!("identity:{}", who.identity),
        Per::Rule => format!("rule:{}", who.rule),
        Per::Credential => format!("credential:{}", who.credential.unwrap_or("-")),
        Per::Global => "global".to_string(),
    }
}

/// A charge entry for the record.
fn charge(
    limit: &Limit,
    measure: Measure,
    key: &str,
    charged: u64,
    used: u64,
    cap: u64,
) -> LimitCharge {
    LimitCharge {
        limit: limit.name.clone(),
        measure: measure.as_str(),
        key: key.to_string(),
        charged,
        used,
        limit_value: cap,
        refused: false,
        unchecked: false,
    }
}

/// A budget amount as people read it (spend in USD).
fn shown(measure: Measure, v: u64) -> String {
    match measure {
        Measure::Spend => crate::policy::limits::format_usd(v),
        _ => v.to_string(),
    }
}

fn unit(measure: Measure) -> &'static str {
    match measure {
        Measure::Spend => "USD",
        m => m.unit(),
    }
}

/// The usage for the record: what the response reported, or (a successful call that reported
/// none) the reservation in its place.
fn usage_info(
    llm: &LlmEstimate,
    usage: Option<&Usage>,
    success: bool,
    prices: &PriceTable,
) -> Option<UsageInfo> {
    match usage {
        Some(u) => {
            let model = u.model.clone().or_else(|| llm.model.clone());
            let cost = model
                .as_deref()
                .and_then(|m| prices.lookup(m))
                .map(|(_, p)| {
                    let fresh = u.input_tokens.saturating_sub(u.cached_input_tokens);
                    p.cost_micros(fresh, u.cached_input_tokens, u.output_tokens) as f64 / 1e6
                });
            Some(UsageInfo {
                provider: llm.provider.name(),
                model,
                input_tokens: u.input_tokens,
                output_tokens: u.output_tokens,
                cached_input_tokens: u.cached_input_tokens,
                cost,
                source: "response",
            })
        }
        None if success => Some(UsageInfo {
            provider: llm.provider.name(),
            model: llm.model.clone(),
            input_tokens: 0,
            output_tokens: llm.tokens,
            cached_input_tokens: 0,
            cost: llm.cost_micros.map(|c| c as f64 / 1e6),
            source: "reserved",
        }),
        None => None,
    }
}

fn too_many_keys(store: &str) -> StateError {
    StateError::Backend {
        store: store.to_string(),
        message: format!("latchkey already keeps {MAX_KEYS} limit counters in memory"),
    }
}

fn remaining(until: SystemTime) -> Duration {
    until
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::from_secs(1))
        .max(Duration::from_secs(1))
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

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

mod admission;
mod admit;
mod counters;

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
    /// The runtime session asking, if any (`per = "session"`; without one such a limit
    /// counts per identity).
    pub session: Option<&'a str>,
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
    /// Held by this process's requests in flight and not settled yet (part of `used`): a
    /// model call's reservation until its response reports what it cost.
    pub reserved: u64,
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
    seen: Mutex<counters::Seen>,
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
            seen: Mutex::new(counters::Seen::default()),
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

    // `admit` is in `admit.rs`, the counters it charges in `counters.rs`.

    /// Every counter this process has charged, with its last known value, sorted. Windows
    /// that have ended are left out.
    pub fn counters(&self) -> Vec<CounterView> {
        let mut list: Vec<CounterView> = lock(&self.seen).open_views(SystemTime::now());
        {
            let inflight = lock(&self.inflight);
            for v in &mut list {
                if let Some(n) = v.store_key.as_ref().and_then(|k| inflight.get(k)) {
                    v.reserved = *n;
                }
            }
        }
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

/// The key a limit's counters are kept under for this request.
fn subject_key(per: Per, who: &Subject<'_>) -> String {
    let (kind, name) = match per {
        Per::Identity => ("identity:", who.identity),
        Per::Session => match who.session {
            Some(id) => ("session:", id),
            None => ("identity:", who.identity),
        },
        Per::Rule => ("rule:", who.rule),
        Per::Credential => ("credential:", who.credential.unwrap_or("-")),
        Per::Global => return "global".to_string(),
    };
    // Concatenated, not `format!`ed: one per limit per request.
    let mut key = String::with_capacity(kind.len() + name.len());
    key.push_str(kind);
    key.push_str(name);
    key
}

/// `lim:LIMIT:MEASURE:KEY`, where a counter is kept in the store.
fn store_key(limit: &str, measure: &str, key: &str) -> String {
    let mut out = String::with_capacity(6 + limit.len() + measure.len() + key.len());
    for part in ["lim:", limit, ":", measure, ":", key] {
        out.push_str(part);
    }
    out
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

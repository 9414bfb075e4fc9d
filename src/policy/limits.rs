//! Limits and budgets as policy states them: `[limits.NAME]` tables, attached to rules,
//! identities or credentials with `limits = ["NAME"]`, and the price table that turns LLM
//! usage into money.
//!
//! Policy only: these are compiled, validated terms. How a request is charged, where counters
//! live and what happens when the store is down is `governance::limits`.
//!
//! Windows, stated once: `requests` is a token bucket (it refills continuously, so it is a
//! sliding window); `bytes_up`, `llm_tokens` and `spend` are counted in **aligned** UTC
//! windows (a minute, hour or day starts on its boundary; a month on the 1st at 00:00 UTC),
//! and reset when the next window starts.

use std::time::{Duration, SystemTime};

use super::Origin;

pub use super::prices::{Price, PriceTable};

/// The shipped price table. It is compiled in and a unit test parses it, so this cannot fail
/// in a released build; if it ever did, the table is empty and every `spend` budget refuses
/// (no model has a price), which fails closed.
pub fn shipped_prices() -> PriceTable {
    PriceTable::shipped().unwrap_or_else(|e| {
        tracing::error!(error = %e, "the shipped price table does not parse; spend budgets will refuse every call");
        PriceTable::empty()
    })
}

/// One `[limits.NAME]` table, compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    pub name: String,
    /// Whose requests share one counter.
    pub per: Per,
    /// `requests = "100/min"`: a token bucket holding `count` requests, refilled over `period`.
    pub requests: Option<Rate>,
    /// `concurrency = 4` (with `queue = "5s"`): requests in flight at once.
    pub concurrency: Option<Concurrency>,
    /// `bytes_up = "50MB/day"`: request bytes sent upstream, per key **and host** (the host as
    /// the matching rule names it, so a wildcard rule's subdomains share one budget).
    pub bytes_up: Option<Quota>,
    /// `llm_tokens = "2M/day"`: input plus output tokens of model-provider calls.
    pub llm_tokens: Option<Quota>,
    /// `spend = "20 USD/day"`, in micro-USD: the cost of those tokens under the price table.
    pub spend: Option<Quota>,
    /// `on_store_error = "deny" | "allow"`: what a request under this limit gets when the
    /// state store cannot answer. Deny (503 `limits_unavailable`) unless it says allow.
    pub on_store_error: OnStoreError,
    /// `reserve_tokens = 4096`: the output tokens reserved for a call whose body names no
    /// `max_tokens` (or `max_output_tokens`, `maxOutputTokens`).
    pub reserve_tokens: u64,
    /// `include_usage = true`: add `stream_options.include_usage` to a streaming OpenAI chat
    /// request that lacks it, so its usage can be read (the sandbox then sees one more event).
    pub include_usage: bool,
    pub origin: Origin,
}

/// Output tokens reserved when a request states no maximum.
pub const DEFAULT_RESERVE_TOKENS: u64 = 4096;

/// Whose requests share a limit's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Per {
    /// Each identity has its own counters (the default).
    Identity,
    /// Each rule the limit is charged under has its own.
    Rule,
    /// Each credential (requests under no credential share the key `-`).
    Credential,
    /// One counter for every request the limit covers.
    Global,
}

impl Per {
    pub fn as_str(self) -> &'static str {
        match self {
            Per::Identity => "identity",
            Per::Rule => "rule",
            Per::Credential => "credential",
            Per::Global => "global",
        }
    }
}

/// What to do when the state store cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStoreError {
    Deny,
    Allow,
}

/// A period: a token bucket's refill time, or a budget's aligned window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Period {
    Second,
    Minute,
    Hour,
    Day,
    Month,
}

impl Period {
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Second => "s",
            Period::Minute => "min",
            Period::Hour => "hour",
            Period::Day => "day",
            Period::Month => "month",
        }
    }

    /// The nominal length (a month is 31 days here: only for a token bucket's refill, which
    /// takes no month, and for expiry slack).
    pub fn nominal(self) -> Duration {
        Duration::from_secs(match self {
            Period::Second => 1,
            Period::Minute => 60,
            Period::Hour => 3600,
            Period::Day => 86_400,
            Period::Month => 31 * 86_400,
        })
    }

    /// The aligned UTC window holding `now`: its start and end, in seconds since the epoch.
    pub fn window(self, now: SystemTime) -> (u64, u64) {
        let secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let fixed = |len: u64| {
            let start = secs - secs % len;
            (start, start + len)
        };
        match self {
            Period::Second => fixed(1),
            Period::Minute => fixed(60),
            Period::Hour => fixed(3600),
            Period::Day => fixed(86_400),
            Period::Month => month_window(secs),
        }
    }
}

/// The calendar month (UTC) holding `secs`.
fn month_window(secs: u64) -> (u64, u64) {
    let Ok(t) = time::OffsetDateTime::from_unix_timestamp(secs as i64) else {
        return (secs - secs % 86_400, secs - secs % 86_400 + 31 * 86_400);
    };
    let start_of = |year: i32, month: time::Month| {
        time::Date::from_calendar_date(year, month, 1)
            .map(|d| d.midnight().assume_utc().unix_timestamp().max(0) as u64)
    };
    let (year, month) = (t.year(), t.month());
    let (next_year, next_month) = match month {
        time::Month::December => (year + 1, time::Month::January),
        m => (year, m.next()),
    };
    match (start_of(year, month), start_of(next_year, next_month)) {
        (Ok(a), Ok(b)) => (a, b),
        _ => (secs - secs % 86_400, secs - secs % 86_400 + 31 * 86_400),
    }
}

/// `requests = "COUNT/PERIOD"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub period: Period,
}

impl Rate {
    /// The time one request's token takes to refill.
    pub fn interval(&self) -> Duration {
        self.period.nominal() / self.count.max(1)
    }
}

/// `concurrency = N`, `queue = "5s"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    pub max: u32,
    /// How long a request over the cap waits for a slot before `429 rate_limited`.
    pub queue: Duration,
}

/// A budget: `amount` units per aligned `period` window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub amount: u64,
    pub period: Period,
}

/// What one limit measures, for keys, messages, metrics and records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Measure {
    Requests,
    Concurrency,
    BytesUp,
    LlmTokens,
    Spend,
}

impl Measure {
    pub fn as_str(self) -> &'static str {
        match self {
            Measure::Requests => "requests",
            Measure::Concurrency => "concurrency",
            Measure::BytesUp => "bytes_up",
            Measure::LlmTokens => "llm_tokens",
            Measure::Spend => "spend",
        }
    }

    /// The unit of its counter, for messages and `/limits`.
    pub fn unit(self) -> &'static str {
        match self {
            Measure::Requests => "requests",
            Measure::Concurrency => "in flight",
            Measure::BytesUp => "bytes",
            Measure::LlmTokens => "tokens",
            Measure::Spend => "micro-USD",
        }
    }
}

impl Limit {
    /// The measures this limit sets, in a fixed order.
    pub fn measures(&self) -> Vec<Measure> {
        let mut m = Vec::new();
        if self.requests.is_some() {
            m.push(Measure::Requests);
        }
        if self.concurrency.is_some() {
            m.push(Measure::Concurrency);
        }
        if self.bytes_up.is_some() {
            m.push(Measure::BytesUp);
        }
        if self.llm_tokens.is_some() {
            m.push(Measure::LlmTokens);
        }
        if self.spend.is_some() {
            m.push(Measure::Spend);
        }
        m
    }

    /// Whether this limit needs a model-provider call's usage (tokens or spend).
    pub fn meters_llm(&self) -> bool {
        self.llm_tokens.is_some() || self.spend.is_some()
    }

    /// One line for `explain` and `check`: `openai-budget (per identity): llm_tokens 2000000/day, spend 20 USD/day`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(r) = &self.requests {
            parts.push(format!("requests {}/{}", r.count, r.period.as_str()));
        }
        if let Some(c) = &self.concurrency {
            parts.push(format!(
                "concurrency {} (queue {})",
                c.max,
                humantime::format_duration(c.queue)
            ));
        }
        if let Some(q) = &self.bytes_up {
            parts.push(format!(
                "bytes_up {} bytes/{} per host",
                q.amount,
                q.period.as_str()
            ));
        }
        if let Some(q) = &self.llm_tokens {
            parts.push(format!("llm_tokens {}/{}", q.amount, q.period.as_str()));
        }
        if let Some(q) = &self.spend {
            parts.push(format!(
                "spend {} USD/{}",
                format_usd(q.amount),
                q.period.as_str()
            ));
        }
        format!(
            "{} (per {}): {}",
            self.name,
            self.per.as_str(),
            parts.join(", ")
        )
    }
}

/// Micro-USD as a decimal dollar amount without trailing zeros: 20000000 → `20`, 1500 →
/// `0.0015`.
pub fn format_usd(micros: u64) -> String {
    let whole = micros / 1_000_000;
    let frac = micros % 1_000_000;
    if frac == 0 {
        return whole.to_string();
    }
    let digits = format!("{frac:06}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_windows() {
        // 2026-12-02T01:02:03Z
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_173_323);
        let (s, e) = Period::Day.window(t);
        assert_eq!(s % 86_400, 0);
        assert_eq!(e - s, 86_400);
        assert!(s <= 1_796_173_323 && 1_796_173_323 < e);
        let (ms, me) = Period::Month.window(t);
        // December 2026 has 31 days and starts at 2026-12-01T00:00:00Z.
        assert_eq!(ms, 1_796_083_200);
        assert_eq!(me - ms, 31 * 86_400);
        let (hs, he) = Period::Hour.window(t);
        assert_eq!((hs % 3600, he - hs), (0, 3600));
    }

    #[test]
    fn february_is_short() {
        // 2027-02-10T00:00:00Z
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_802_217_600);
        let (s, e) = Period::Month.window(t);
        assert_eq!(e - s, 28 * 86_400);
    }

    #[test]
    fn usd_formatting() {
        assert_eq!(format_usd(20_000_000), "20");
        assert_eq!(format_usd(1_500), "0.0015");
        assert_eq!(format_usd(2_500_000), "2.5");
        assert_eq!(format_usd(0), "0");
    }
}

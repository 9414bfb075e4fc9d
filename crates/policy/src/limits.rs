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
//!
//! The value parsers (`parse_rate`, `parse_bytes`, `parse_tokens`, `parse_spend`, …) are pure
//! and return the message without the field; `limits_compile` adds `file:line:col: field`.

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
///
/// On a `tunnel = true` rule only `requests` and `concurrency` apply (they count CONNECTs, and
/// a tunnel holds its slot while open): latchkey cannot read a tunnel's bytes, so compile
/// refuses a limit with `bytes_up`, `llm_tokens` or `spend` there. An identity's limits still
/// reach its tunnels, where those measures count nothing (lint `unmetered_tunnel`).
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
    /// Each runtime session has its own (requests outside a session: per identity).
    Session,
}

impl Per {
    pub fn as_str(self) -> &'static str {
        match self {
            Per::Identity => "identity",
            Per::Rule => "rule",
            Per::Credential => "credential",
            Per::Global => "global",
            Per::Session => "session",
        }
    }
}

/// What to do when the state store cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStoreError {
    Deny,
    Allow,
}

impl OnStoreError {
    pub fn as_str(self) -> &'static str {
        match self {
            OnStoreError::Deny => "deny",
            OnStoreError::Allow => "allow",
        }
    }
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

    /// Whether it needs to read what a request or response says (model-provider usage), which
    /// a `tunnel = true` rule hides. `bytes_up` does not: a tunnel's bytes are counted as they
    /// are relayed.
    pub fn meters_body(self) -> bool {
        matches!(self, Measure::LlmTokens | Measure::Spend)
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

    /// Each measure this limit sets with its terms as a reviewer reads them: `(requests,
    /// "100/min")`, `(spend, "20 USD/day")`.
    pub fn terms(&self) -> Vec<(Measure, String)> {
        let mut out = Vec::new();
        if let Some(r) = &self.requests {
            out.push((
                Measure::Requests,
                format!("{}/{}", r.count, r.period.as_str()),
            ));
        }
        if let Some(c) = &self.concurrency {
            out.push((
                Measure::Concurrency,
                format!("{} (queue {})", c.max, humantime::format_duration(c.queue)),
            ));
        }
        if let Some(q) = &self.bytes_up {
            out.push((
                Measure::BytesUp,
                format!("{} bytes/{} per host", q.amount, q.period.as_str()),
            ));
        }
        if let Some(q) = &self.llm_tokens {
            out.push((
                Measure::LlmTokens,
                format!("{}/{}", q.amount, q.period.as_str()),
            ));
        }
        if let Some(q) = &self.spend {
            out.push((
                Measure::Spend,
                format!("{} USD/{}", format_usd(q.amount), q.period.as_str()),
            ));
        }
        out
    }

    /// One line for `explain` and `check`: `openai-budget (per identity): llm_tokens 2000000/day, spend 20 USD/day`.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self
            .terms()
            .into_iter()
            .map(|(m, t)| format!("{} {t}", m.as_str()))
            .collect();
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

/// Parses `requests = "COUNT/PERIOD"`: COUNT 1..=1_000_000 per s|sec|second, min|minute,
/// h|hour or d|day (a token bucket refills continuously, so it takes no month).
pub fn parse_rate(text: &str) -> Result<Rate, String> {
    let form = "a rate like \"100/min\" (COUNT/s, /min, /hour or /day)";
    let (n, unit) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?} is not {form}"))?;
    let n = n.trim();
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{text:?} is not {form}: the count is a whole number"
        ));
    }
    let period = match unit.trim() {
        "s" | "sec" | "second" => Period::Second,
        "min" | "minute" => Period::Minute,
        "h" | "hour" => Period::Hour,
        "d" | "day" => Period::Day,
        "month" => {
            return Err(format!(
                "{text:?}: a request rate refills continuously and takes no month; write a rate per day, or meter a budget (bytes_up, llm_tokens, spend) per month"
            ))
        }
        other => return Err(format!("{text:?}: unknown period {other:?}: use s, min, hour or day")),
    };
    let count: u64 = n
        .parse()
        .map_err(|_| format!("{text:?}: the count is more than {MAX_RATE_COUNT}"))?;
    if count == 0 {
        return Err(format!("{text:?}: {ZERO_BUDGET}"));
    }
    if count > u64::from(MAX_RATE_COUNT) {
        return Err(format!("{text:?}: the count is more than {MAX_RATE_COUNT}"));
    }
    Ok(Rate {
        count: count as u32,
        period,
    })
}

/// The largest `requests` count.
pub const MAX_RATE_COUNT: u32 = 1_000_000;
/// The most in flight for `concurrency`.
pub const MAX_CONCURRENCY: u32 = 10_000;
/// The longest `queue`: a queued request keeps its client's connection open.
pub const MAX_QUEUE: Duration = Duration::from_secs(60);
/// The largest `reserve_tokens`.
pub const MAX_RESERVE_TOKENS: u64 = 10_000_000;
/// What a zero amount is told.
const ZERO_BUDGET: &str =
    "a budget of 0 refuses everything: remove the rule instead, or set a positive amount";

/// Parses `bytes_up = "50MB/day"`: a whole number of bytes per aligned window. Units as written:
/// B; KB, MB, GB, TB (powers of 1000); KiB, MiB, GiB, TiB (powers of 1024). A decimal is allowed
/// when it comes to whole bytes (`1.5GB`), never a fraction of a byte.
pub fn parse_bytes(text: &str) -> Result<Quota, String> {
    let form = "an amount like \"50MB/day\" (B, KB, MB, GB, TB, KiB, MiB, GiB or TiB per min, hour, day or month)";
    let (amount, period) = split_budget(text, form)?;
    let (number, unit) = split_unit(amount);
    if number.is_empty() {
        return Err(format!("{text:?} is not {form}"));
    }
    let scale: u64 = match unit {
        "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "" => {
            return Err(format!(
                "{text:?} has no unit: write {number}B (or KB, MB, GB, KiB, …)"
            ))
        }
        other => {
            let hint = match other.to_ascii_lowercase().as_str() {
                "b" => "B".to_string(),
                "kb" | "k" => "KB or KiB".to_string(),
                "mb" | "m" => "MB or MiB".to_string(),
                "gb" | "g" => "GB or GiB".to_string(),
                "tb" | "t" => "TB or TiB".to_string(),
                "kib" => "KiB".to_string(),
                "mib" => "MiB".to_string(),
                "gib" => "GiB".to_string(),
                "tib" => "TiB".to_string(),
                _ => "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB".to_string(),
            };
            return Err(format!(
                "{text:?}: unknown unit {other:?}; did you mean {hint}?"
            ));
        }
    };
    let amount = scaled(number, scale).map_err(|why| why.say(text, "bytes"))?;
    Ok(Quota { amount, period })
}

/// Parses `llm_tokens = "2M/day"`: a whole number of tokens, plain or with K, M or G (powers of
/// 1000; `1.5M` allowed), per aligned window.
pub fn parse_tokens(text: &str) -> Result<Quota, String> {
    let form = "an amount like \"2M/day\" (a count, or K, M or G, per min, hour, day or month)";
    let (amount, period) = split_budget(text, form)?;
    let (number, unit) = split_unit(amount);
    if number.is_empty() {
        return Err(format!("{text:?} is not {form}"));
    }
    let scale: u64 = match unit {
        "" => 1,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?}: tokens take no unit, or K, M or G (thousand, million, billion)"
            ))
        }
    };
    let amount = scaled(number, scale).map_err(|why| why.say(text, "tokens"))?;
    Ok(Quota { amount, period })
}

/// Parses `spend = "20 USD/day"`: decimal US dollars with at most 6 decimals, per aligned
/// window, to micro-USD. Only USD: the price table is in USD.
pub fn parse_spend(text: &str) -> Result<Quota, String> {
    let form = "an amount like \"20 USD/day\" (USD per min, hour, day or month)";
    let (amount, period) = split_budget(text, form)?;
    let (number, unit) = split_unit(amount);
    if number.is_empty() {
        return Err(format!("{text:?} is not {form}"));
    }
    match unit {
        "USD" => {}
        "" => {
            return Err(format!(
                "{text:?} has no currency: write \"{number} USD/{}\"",
                period.as_str()
            ))
        }
        other => {
            return Err(format!(
                "{text:?}: currency {other:?}: spend is in USD only (the price table's currency)"
            ))
        }
    }
    let amount = scaled(number, 1_000_000).map_err(|why| match why {
        Scaled::Fraction => format!("{text:?}: at most 6 decimals (a micro-dollar)"),
        other => other.say(text, "USD"),
    })?;
    Ok(Quota { amount, period })
}

/// `per = "identity" | "session" | "rule" | "credential" | "global"`.
pub fn parse_per(text: &str) -> Result<Per, String> {
    match text {
        "identity" => Ok(Per::Identity),
        "session" => Ok(Per::Session),
        "rule" => Ok(Per::Rule),
        "credential" => Ok(Per::Credential),
        "global" => Ok(Per::Global),
        other => Err(format!(
            "unknown per {other:?}: use \"identity\", \"session\", \"rule\", \"credential\" or \"global\""
        )),
    }
}

/// `on_store_error = "deny" | "allow"`.
pub fn parse_on_store_error(text: &str) -> Result<OnStoreError, String> {
    match text {
        "deny" => Ok(OnStoreError::Deny),
        "allow" => Ok(OnStoreError::Allow),
        other => Err(format!(
            "unknown value {other:?}: use \"deny\" (refuse with 503 limits_unavailable) or \"allow\""
        )),
    }
}

/// Splits `AMOUNT/PERIOD` of a budget; the period is min|minute, h|hour, d|day or month.
fn split_budget<'t>(text: &'t str, form: &str) -> Result<(&'t str, Period), String> {
    let (amount, unit) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?} is not {form}"))?;
    let period = match unit.trim() {
        "min" | "minute" => Period::Minute,
        "h" | "hour" => Period::Hour,
        "d" | "day" => Period::Day,
        "month" => Period::Month,
        "s" | "sec" | "second" => {
            return Err(format!(
                "{text:?}: a budget's shortest window is a minute; use /min"
            ))
        }
        other => {
            return Err(format!(
                "{text:?}: unknown period {other:?}: use min, hour, day or month"
            ))
        }
    };
    Ok((amount.trim(), period))
}

/// Splits `1.5GB` into the number and the unit (either may be empty).
fn split_unit(amount: &str) -> (&str, &str) {
    let end = amount
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(amount.len());
    (amount[..end].trim(), amount[end..].trim())
}

/// Why a decimal did not scale to a whole positive amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scaled {
    NotANumber,
    Zero,
    Fraction,
    TooLarge,
}

impl Scaled {
    /// The message for `text`, whose amounts are in `unit`.
    fn say(self, text: &str, unit: &str) -> String {
        match self {
            Scaled::NotANumber => format!("{text:?}: the amount is not a decimal number of {unit}"),
            Scaled::Zero => format!("{text:?}: {ZERO_BUDGET}"),
            Scaled::Fraction => format!("{text:?}: the amount is not a whole number of {unit}"),
            Scaled::TooLarge => format!(
                "{text:?}: the amount is too large (at most {} {unit})",
                u64::MAX
            ),
        }
    }
}

/// `number` (digits, at most one `.`) times `scale`, exactly, as a positive whole number.
fn scaled(number: &str, scale: u64) -> Result<u64, Scaled> {
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty()
        || !digits(whole)
        || !digits(frac)
        || (number.contains('.') && frac.is_empty())
    {
        return Err(Scaled::NotANumber);
    }
    // Leading and trailing zeros carry nothing; what is left must fit in u128 to be exact.
    let whole = whole.trim_start_matches('0');
    let frac = frac.trim_end_matches('0');
    if whole.len() + frac.len() > 30 {
        return Err(Scaled::TooLarge);
    }
    let mantissa: u128 = format!("{whole}{frac}0")
        .parse::<u128>()
        .map_err(|_| Scaled::TooLarge)?
        / 10;
    let divisor = 10u128.pow(frac.len() as u32);
    let product = mantissa * u128::from(scale);
    if product == 0 {
        return Err(Scaled::Zero);
    }
    if !product.is_multiple_of(divisor) {
        return Err(Scaled::Fraction);
    }
    u64::try_from(product / divisor).map_err(|_| Scaled::TooLarge)
}

#[cfg(test)]
#[path = "limits_terms_tests.rs"]
mod tests;

//! Profiles: the reviewed ceiling of runtime sessions (`[profiles.NAME]`), and the narrowing a
//! session may ask for within it.
//!
//! A profile compiles to an [`Identity`] whose [`Identity::profile`] is set: decisions, reach,
//! `check`, `explain` and `diff` treat it like any identity, but no client is ever recognised
//! as one by token or address: only an admitted session carries it. A session is the profile
//! **narrowed** ([`Profile::narrow`]): a subset of its hosts, of its secrets, lower limits, a
//! shorter TTL. Anything wider is refused, naming what was too wide. A [`Narrowing`] is pure
//! data the decision reads ([`super::Target::narrowing`]); the session itself (its token, its
//! expiry, its connections) is runtime state and lives in `governance::sessions`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use super::identity::Identity;
use super::limits::{Limit, Per, Period, Quota, Rate};
use super::{HostPattern, Policy, Rule};
use crate::wire::cidr::Cidr;

/// What a session of a profile may narrow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Narrowable {
    pub hosts: bool,
    pub secrets: bool,
    pub limits: bool,
}

impl Narrowable {
    pub const ALL: Narrowable = Narrowable {
        hosts: true,
        secrets: true,
        limits: true,
    };
}

/// A compiled `[profiles.NAME]` beyond what it shares with an identity (rules, labels, limits,
/// sources: on its [`Identity`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// The longest a session may live (and be extended to, from its creation).
    pub max_ttl: Duration,
    /// Label keys every session must be given by its creator.
    pub require_labels: Vec<String>,
    pub narrowable: Narrowable,
    /// The identity it inherits its rules from, if any.
    pub inherits: Option<String>,
}

/// What a session's creator asked for: every field optional, each only ever narrower.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NarrowRequest {
    /// Hosts (exact or `*.suffix`) the session may reach: each within the profile's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    /// Secrets the session may have injected: each one the profile's rules bind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<Vec<String>>,
    /// Per limit the profile is charged to, lower values of its measures
    /// (`{"llm": {"llm_tokens": "100k/day"}}`), counted per session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<BTreeMap<String, BTreeMap<String, String>>>,
}

/// A session's narrowing of its profile, checked: what [`Policy::decide`] applies on top of
/// the profile's rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Narrowing {
    /// `Some`: only these hosts (each within the profile's).
    pub hosts: Option<Vec<HostPattern>>,
    /// `Some`: only rules whose every bound secret and credential is here.
    pub secrets: Option<BTreeSet<String>>,
    /// Lower limits, each `per = "session"` (charged on top of the profile's own).
    pub limits: Vec<Limit>,
}

impl Narrowing {
    /// Whether a request to `host` under `rule` stays within this narrowing.
    pub fn admits(&self, rule: &Rule, host: &str) -> bool {
        self.admits_rule(rule) && self.admits_host(host)
    }

    /// Whether `host` is one of the narrowed hosts (every host when hosts are not narrowed).
    pub fn admits_host(&self, host: &str) -> bool {
        self.hosts
            .as_ref()
            .is_none_or(|hosts| hosts.iter().any(|h| h.matches(host)))
    }

    /// Whether every secret `rule` binds (and its credential) is among the narrowed secrets.
    pub fn admits_rule(&self, rule: &Rule) -> bool {
        let Some(secrets) = &self.secrets else {
            return true;
        };
        rule.bound.iter().all(|s| secrets.contains(s))
            && rule.credential.as_ref().is_none_or(|c| secrets.contains(c))
    }

    /// Whether it narrows anything.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_none() && self.secrets.is_none() && self.limits.is_empty()
    }

    /// The lines a session's reach adds to its profile's (see [`super::reach`]).
    pub fn reach_items(&self) -> Vec<String> {
        let mut items = Vec::new();
        if let Some(hosts) = &self.hosts {
            items.extend(hosts.iter().map(|h| format!("session: only host {h}")));
        }
        if let Some(secrets) = &self.secrets {
            items.extend(secrets.iter().map(|s| format!("session: only secret {s}")));
        }
        for l in &self.limits {
            items.push(format!("session: limit {} {}", l.name, l.summary()));
        }
        items
    }
}

/// What a session may not have, in the words the API answers with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("; "))]
pub struct TooWide(pub Vec<String>);

/// The most labels a session carries, and the longest key and value.
pub const MAX_SESSION_LABELS: usize = 32;
const MAX_LABEL_KEY: usize = 63;
const MAX_LABEL_VALUE: usize = 256;
/// The most hosts, secrets or limits one narrowing names.
pub const MAX_NARROWED: usize = 64;

/// What a session's creator asks for, all at once (checked by [`Profile::narrow`]).
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    pub ttl: Option<Duration>,
    pub labels: &'a BTreeMap<String, String>,
    pub source: Option<IpAddr>,
    pub narrow: &'a NarrowRequest,
}

/// A session request checked against its profile: what the session will carry.
#[derive(Debug, Clone)]
pub struct Granted {
    pub ttl: Duration,
    /// The profile's labels and the caller's.
    pub labels: BTreeMap<String, String>,
    pub narrowing: Narrowing,
}

impl Profile {
    /// Checks `asked` against the profile `identity` (compiled from `[profiles.NAME]`) under
    /// `policy`: the TTL within `max_ttl`, the required labels given and none of the profile's
    /// overridden, a bound source inside its `sources`, and every narrowing within what it
    /// allows. Every problem is named at once ([`TooWide`]).
    pub fn narrow(
        &self,
        identity: &Identity,
        policy: &Policy,
        asked: Asked<'_>,
    ) -> Result<Granted, TooWide> {
        let mut wide = Vec::new();
        let ttl = match asked.ttl {
            Some(t) if t > self.max_ttl => {
                wide.push(format!(
                    "ttl {} is longer than profile {:?} allows ({})",
                    humantime::format_duration(t),
                    identity.name,
                    humantime::format_duration(self.max_ttl)
                ));
                self.max_ttl
            }
            Some(t) if t < Duration::from_secs(1) => {
                wide.push("ttl must be at least 1s".to_string());
                self.max_ttl
            }
            Some(t) => t,
            None => self.max_ttl,
        };
        let labels = self.labels(identity, asked.labels, &mut wide);
        if let Some(ip) = asked.source {
            let ip = ip.to_canonical();
            if !identity.sources.is_empty() && !identity.sources.iter().any(|c| c.contains(ip)) {
                wide.push(format!(
                    "source {ip} is outside profile {:?}'s sources ({})",
                    identity.name,
                    join(&identity.sources)
                ));
            }
        }
        let narrowing = self.narrowed(identity, policy, asked.narrow, &mut wide);
        if !wide.is_empty() {
            return Err(TooWide(wide));
        }
        Ok(Granted {
            ttl,
            labels,
            narrowing,
        })
    }

    /// The narrowing `asked` makes of this profile under `policy`, checked (every problem named
    /// at once). A session's narrowing is checked again under each policy it runs under.
    pub fn narrowing(
        &self,
        identity: &Identity,
        policy: &Policy,
        asked: &NarrowRequest,
    ) -> Result<Narrowing, TooWide> {
        let mut wide = Vec::new();
        let narrowing = self.narrowed(identity, policy, asked, &mut wide);
        if wide.is_empty() {
            Ok(narrowing)
        } else {
            Err(TooWide(wide))
        }
    }

    fn narrowed(
        &self,
        identity: &Identity,
        policy: &Policy,
        asked: &NarrowRequest,
        wide: &mut Vec<String>,
    ) -> Narrowing {
        if asked.hosts.as_ref().is_some_and(|h| h.len() > MAX_NARROWED)
            || asked
                .secrets
                .as_ref()
                .is_some_and(|s| s.len() > MAX_NARROWED)
            || asked
                .limits
                .as_ref()
                .is_some_and(|l| l.len() > MAX_NARROWED)
        {
            wide.push(format!(
                "at most {MAX_NARROWED} hosts, secrets and limits each"
            ));
            return Narrowing::default();
        }
        let usable: Vec<&Rule> = policy
            .rules()
            .iter()
            .filter(|r| identity.rules.allows(&r.name))
            .collect();
        Narrowing {
            hosts: self.hosts(identity, &usable, asked, wide),
            secrets: self.secrets(identity, &usable, asked, wide),
            limits: self.limits(identity, policy, asked, wide),
        }
    }

    fn labels(
        &self,
        identity: &Identity,
        asked: &BTreeMap<String, String>,
        wide: &mut Vec<String>,
    ) -> BTreeMap<String, String> {
        let mut labels = identity.labels.clone();
        for (k, v) in asked {
            let key_ok = !k.is_empty()
                && k.len() <= MAX_LABEL_KEY
                && k.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
                });
            if !key_ok {
                wide.push(format!("label {k:?}: keys use lower-case letters, digits, '_', '.' and '-' (at most {MAX_LABEL_KEY})"));
            } else if v.len() > MAX_LABEL_VALUE || v.chars().any(char::is_control) {
                wide.push(format!(
                    "label {k:?}: values are at most {MAX_LABEL_VALUE} bytes, no control characters"
                ));
            } else if identity.labels.get(k).is_some_and(|p| p != v) {
                wide.push(format!(
                    "label {k:?} is set by profile {:?}; a session may not change it",
                    identity.name
                ));
            } else {
                labels.insert(k.clone(), v.clone());
            }
        }
        for k in &self.require_labels {
            if !labels.contains_key(k) {
                wide.push(format!(
                    "label {k:?} is required by profile {:?}",
                    identity.name
                ));
            }
        }
        if labels.len() > MAX_SESSION_LABELS {
            wide.push(format!(
                "{} labels; at most {MAX_SESSION_LABELS}",
                labels.len()
            ));
        }
        labels
    }

    fn hosts(
        &self,
        identity: &Identity,
        usable: &[&Rule],
        asked: &NarrowRequest,
        wide: &mut Vec<String>,
    ) -> Option<Vec<HostPattern>> {
        let list = asked.hosts.as_ref()?;
        if !self.narrowable.hosts {
            wide.push(format!(
                "profile {:?} does not let a session narrow hosts (narrow = [...])",
                identity.name
            ));
            return None;
        }
        let mut out = Vec::new();
        for text in list {
            let pattern = match parse_host_pattern(text) {
                Ok(p) => p,
                Err(e) => {
                    wide.push(format!("host {text:?}: {e}"));
                    continue;
                }
            };
            let covered = usable
                .iter()
                .flat_map(|r| r.hosts.iter())
                .any(|h| within(&pattern, h));
            if covered {
                out.push(pattern);
            } else {
                wide.push(format!(
                    "host {text:?} is not among the hosts profile {:?} may reach",
                    identity.name
                ));
            }
        }
        Some(out)
    }

    fn secrets(
        &self,
        identity: &Identity,
        usable: &[&Rule],
        asked: &NarrowRequest,
        wide: &mut Vec<String>,
    ) -> Option<BTreeSet<String>> {
        let list = asked.secrets.as_ref()?;
        if !self.narrowable.secrets {
            wide.push(format!(
                "profile {:?} does not let a session narrow secrets (narrow = [...])",
                identity.name
            ));
            return None;
        }
        let known: BTreeSet<&str> = usable
            .iter()
            .flat_map(|r| {
                r.bound
                    .iter()
                    .map(String::as_str)
                    .chain(r.credential.as_deref())
            })
            .collect();
        let mut out = BTreeSet::new();
        for s in list {
            if known.contains(s.as_str()) {
                out.insert(s.clone());
            } else {
                wide.push(format!(
                    "secret {s:?} is not one profile {:?}'s rules use",
                    identity.name
                ));
            }
        }
        Some(out)
    }

    fn limits(
        &self,
        identity: &Identity,
        policy: &Policy,
        asked: &NarrowRequest,
        wide: &mut Vec<String>,
    ) -> Vec<Limit> {
        let Some(map) = &asked.limits else {
            return Vec::new();
        };
        if !self.narrowable.limits {
            wide.push(format!(
                "profile {:?} does not let a session narrow limits (narrow = [...])",
                identity.name
            ));
            return Vec::new();
        }
        let mut out = Vec::new();
        for (name, measures) in map {
            let Some(limit) = identity
                .limits
                .iter()
                .any(|l| l == name)
                .then(|| policy.limit(name))
                .flatten()
            else {
                wide.push(format!(
                    "limit {name:?} is not one profile {:?} is charged to ({})",
                    identity.name,
                    identity.limits.join(", ")
                ));
                continue;
            };
            if let Some(lower) = lower_limit(limit, measures, wide) {
                out.push(lower);
            }
        }
        out
    }
}

/// `limit` with `measures` lowered, counted per session; `None` (and `wide` told) when a
/// measure is unknown to the limit, unparsable or not lower.
fn lower_limit(
    limit: &Limit,
    measures: &BTreeMap<String, String>,
    wide: &mut Vec<String>,
) -> Option<Limit> {
    let before = wide.len();
    // Its own name (so its own counters): the profile's limit still counts beside it.
    let mut lower = Limit {
        name: format!("{}@session", limit.name),
        per: Per::Session,
        ..limit.clone()
    };
    let name = &limit.name;
    for (measure, text) in measures {
        let at = format!("limits.{name}.{measure}");
        match measure.as_str() {
            "requests" => match (super::limits::parse_rate(text), limit.requests) {
                (Ok(r), Some(p)) if rate_per_sec(r) <= rate_per_sec(p) => lower.requests = Some(r),
                (Ok(_), Some(_)) => wide.push(format!("{at}: {text:?} is more than the profile's limit allows")),
                (Ok(_), None) => wide.push(format!("{at}: limit {name:?} does not count requests")),
                (Err(e), _) => wide.push(format!("{at}: {e}")),
            },
            "concurrency" => match (text.trim().parse::<u32>(), limit.concurrency) {
                (Ok(n), Some(c)) if n >= 1 && n <= c.max => {
                    lower.concurrency = Some(super::limits::Concurrency { max: n, ..c })
                }
                (Ok(_), Some(c)) => wide.push(format!("{at}: {text:?} is not between 1 and {}", c.max)),
                (Ok(_), None) => wide.push(format!("{at}: limit {name:?} does not cap concurrency")),
                (Err(_), _) => wide.push(format!("{at}: {text:?} is not a whole number")),
            },
            "bytes_up" => quota(&at, text, limit.bytes_up, super::limits::parse_bytes, &mut lower.bytes_up, wide),
            "llm_tokens" => quota(&at, text, limit.llm_tokens, super::limits::parse_tokens, &mut lower.llm_tokens, wide),
            "spend" => quota(&at, text, limit.spend, super::limits::parse_spend, &mut lower.spend, wide),
            _ => wide.push(format!(
                "{at}: unknown measure; a session may lower requests, concurrency, bytes_up, llm_tokens or spend"
            )),
        }
    }
    (wide.len() == before).then_some(lower)
}

fn quota(
    at: &str,
    text: &str,
    profile: Option<Quota>,
    parse: fn(&str) -> Result<Quota, String>,
    slot: &mut Option<Quota>,
    wide: &mut Vec<String>,
) {
    match (parse(text), profile) {
        (Ok(q), Some(p)) if per_day(q) <= per_day(p) && q.amount <= p.amount => *slot = Some(q),
        (Ok(_), Some(_)) => wide.push(format!(
            "{at}: {text:?} is more than the profile's limit allows"
        )),
        (Ok(_), None) => wide.push(format!("{at}: the profile's limit does not count this")),
        (Err(e), _) => wide.push(format!("{at}: {e}")),
    }
}

/// Requests per second a rate allows.
fn rate_per_sec(r: Rate) -> f64 {
    f64::from(r.count) / r.period.nominal().as_secs_f64()
}

/// A quota's amount per day (a month as 30 days): how budgets of different windows compare.
fn per_day(q: Quota) -> f64 {
    let day = Period::Day.nominal().as_secs_f64();
    q.amount as f64 * day / q.period.nominal().as_secs_f64()
}

/// Parses a host a session may be narrowed to: a host or `*.suffix`, normalised.
pub fn parse_host_pattern(text: &str) -> Result<HostPattern, String> {
    let text = text.trim();
    if let Some(suffix) = text.strip_prefix("*.") {
        let s = super::normalize_host(suffix).map_err(|e| e.to_string())?;
        if !s.contains('.') {
            return Err("a wildcard needs at least two labels after '*.'".to_string());
        }
        return Ok(HostPattern::Wildcard(s));
    }
    if text.contains('*') {
        return Err("'*' only as a whole first label ('*.example.com')".to_string());
    }
    super::normalize_host(text)
        .map(HostPattern::Exact)
        .map_err(|e| e.to_string())
}

/// Whether every host `inner` matches, `outer` matches too.
fn within(inner: &HostPattern, outer: &HostPattern) -> bool {
    match (inner, outer) {
        (HostPattern::Exact(h), o) => o.matches(h),
        (HostPattern::Wildcard(_), HostPattern::Exact(_)) => false,
        (HostPattern::Wildcard(i), HostPattern::Wildcard(o)) => {
            i == o || i.strip_suffix(o.as_str()).is_some_and(|r| r.ends_with('.'))
        }
    }
}

fn join(cidrs: &[Cidr]) -> String {
    cidrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
#[path = "profile_tests.rs"]
mod tests;

//! Summaries of records: counts per decision, reason and host, per identity and in all.

use super::*;

/// Names and their counts, capped at a number of distinct names; the rest counted only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub counts: BTreeMap<String, u64>,
    /// Counted under a name not kept (past the cap).
    pub untracked: u64,
    pub(super) cap: usize,
}

impl Counts {
    pub(super) fn with_cap(cap: usize) -> Self {
        Self {
            counts: BTreeMap::new(),
            untracked: 0,
            cap,
        }
    }

    pub(super) fn add(&mut self, name: &str) {
        if let Some(n) = self.counts.get_mut(name) {
            *n += 1;
        } else if self.counts.len() < self.cap {
            self.counts.insert(name.to_string(), 1);
        } else {
            self.untracked += 1;
        }
    }

    /// Highest count first, then by name.
    pub fn ranked(&self) -> Vec<(&str, u64)> {
        let mut v: Vec<(&str, u64)> = self.counts.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        v
    }
}

impl Serialize for Counts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.counts.serialize(s)
    }
}

/// Tokens and cost summed over an identity's model-provider calls.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct UsageTotals {
    /// Requests whose record has `usage`.
    pub calls: u64,
    pub input_tokens: u64,
    pub cached_input_tokens: u64,
    pub output_tokens: u64,
    /// USD, over the calls whose model has a price; `None` when none has.
    pub cost: Option<f64>,
}

/// One identity's requests (or one session's: [`GroupBy::Session`]), summed.
#[derive(Debug, Clone, Serialize)]
pub struct IdentitySummary {
    pub identity: String,
    /// Grouped by session: the session's id (`None`: requests under no runtime session).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// One per request (its outcome, or its decision when no outcome followed).
    pub requests: u64,
    pub allowed: u64,
    pub denied: u64,
    /// Allowed requests with a decision record and no outcome: in flight when latchkey stopped.
    pub unfinished: u64,
    /// Denied requests by reason.
    pub denials: Counts,
    /// Report-only mode: allowed requests enforcement would have denied, by reason.
    pub would_deny: Counts,
    /// Allowed requests by host (DNS queries and approval answers reach no host: not here).
    pub hosts: Counts,
    /// Allowed requests to hosts past [`MAX_HOSTS`].
    pub hosts_untracked: u64,
    /// Allowed requests by secret named.
    pub secrets: Counts,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub usage: Option<UsageTotals>,
    /// The labels on the identity's latest record (by `ts`) that had any.
    pub labels: BTreeMap<String, String>,
    pub first_seen: String,
    pub last_seen: String,
    #[serde(skip)]
    pub(super) first_at: Option<SystemTime>,
    #[serde(skip)]
    pub(super) last_at: Option<SystemTime>,
    #[serde(skip)]
    pub(super) labels_at: Option<SystemTime>,
}

impl IdentitySummary {
    pub(super) fn new(identity: &str) -> Self {
        Self {
            identity: identity.to_string(),
            session: None,
            requests: 0,
            allowed: 0,
            denied: 0,
            unfinished: 0,
            denials: Counts::with_cap(MAX_NAMES),
            would_deny: Counts::with_cap(MAX_NAMES),
            hosts: Counts::with_cap(MAX_HOSTS),
            hosts_untracked: 0,
            secrets: Counts::with_cap(MAX_NAMES),
            bytes_up: 0,
            bytes_down: 0,
            usage: None,
            labels: BTreeMap::new(),
            first_seen: String::new(),
            last_seen: String::new(),
            first_at: None,
            last_at: None,
            labels_at: None,
        }
    }

    pub(super) fn add(&mut self, row: &Line) {
        let f = &row.fields;
        self.requests += 1;
        let allowed = f.decision == "allow";
        if allowed {
            self.allowed += 1;
            if row.decision_phase {
                self.unfinished += 1;
            }
            if f.would_deny {
                self.would_deny.add(&f.reason);
            }
            let pseudo = matches!(f.method.as_deref(), Some("DNS" | "APPROVAL"));
            if let (Some(host), false) = (f.host.as_deref(), pseudo) {
                let before = self.hosts.untracked;
                self.hosts.add(host);
                self.hosts_untracked += self.hosts.untracked - before;
            }
            for s in &f.secrets {
                self.secrets.add(s);
            }
        } else {
            self.denied += 1;
            self.denials.add(&f.reason);
        }
        self.bytes_up = self.bytes_up.saturating_add(f.bytes_up);
        self.bytes_down = self.bytes_down.saturating_add(f.bytes_down);
        if let Some(u) = &f.usage {
            let t = self.usage.get_or_insert_with(UsageTotals::default);
            t.calls += 1;
            t.input_tokens = t.input_tokens.saturating_add(u.input_tokens);
            t.cached_input_tokens = t.cached_input_tokens.saturating_add(u.cached_input_tokens);
            t.output_tokens = t.output_tokens.saturating_add(u.output_tokens);
            if let Some(c) = u.cost.filter(|c| c.is_finite()) {
                let sum = t.cost.unwrap_or(0.0) + c;
                // Sums of prices in USD: nine decimals hold every price table's precision
                // without the binary-fraction noise of repeated addition.
                t.cost = Some((sum * 1e9).round() / 1e9);
            }
        }
        if !f.labels.is_empty() && self.labels_at.is_none_or(|t| row.at >= t) {
            self.labels.clone_from(&f.labels);
            self.labels_at = Some(row.at);
        }
        if self.first_at.is_none_or(|t| row.at < t) {
            self.first_at = Some(row.at);
            self.first_seen = row.ts().to_string();
        }
        if self.last_at.is_none_or(|t| row.at >= t) {
            self.last_at = Some(row.at);
            self.last_seen = row.ts().to_string();
        }
    }
}

/// What a summary groups requests by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    #[default]
    Identity,
    /// Each runtime session apart (requests under none grouped by identity).
    Session,
}

/// Per identity (or session), what its requests did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub by: GroupBy,
    /// Sorted by identity.
    pub identities: Vec<IdentitySummary>,
    /// Requests of identities past [`MAX_IDENTITIES`], counted only.
    pub untracked_requests: u64,
    #[serde(skip)]
    pub(super) by_name: BTreeMap<String, IdentitySummary>,
}

impl Summary {
    /// Adds one row (from [`Requests`] in [`Rows::PerRequest`]).
    pub fn add(&mut self, row: &Line) {
        let f = &row.fields;
        // By session: only an admitted session (`profile` set) is a group of its own.
        let session = match self.by {
            GroupBy::Session => f.session.as_deref().filter(|_| f.profile.is_some()),
            GroupBy::Identity => None,
        };
        let key = session.unwrap_or(f.identity.as_str());
        if let Some(s) = self.by_name.get_mut(key) {
            s.add(row);
        } else if self.by_name.len() < MAX_IDENTITIES {
            let mut s = IdentitySummary::new(&f.identity);
            s.session = session.map(str::to_string);
            s.add(row);
            self.by_name.insert(key.to_string(), s);
        } else {
            self.untracked_requests += 1;
        }
    }

    /// Done adding: the identities, in order.
    pub fn finish(&mut self) {
        self.identities = std::mem::take(&mut self.by_name).into_values().collect();
    }

    pub fn requests(&self) -> u64 {
        self.identities.iter().map(|s| s.requests).sum::<u64>() + self.untracked_requests
    }
}

//! Reach diff: what a new policy lets each identity reach that the old one did not, and what it
//! no longer lets it reach — the meaning of a policy change, for the review of it.
//!
//! Computed from the compiled matchers, not from the text:
//!
//! - **Hosts.** Every host falls in a class fixed by which host patterns match it; an exact name
//!   either policy writes is its own class, and each `*.suffix` is represented by a fresh label
//!   under it (a host no exact pattern names), so one sample per pattern covers every class.
//! - **Ports, methods.** Per sample host: the ports its rules name and each scheme's default;
//!   the methods its rules name, the usual ones, and one method no rule names (`other`).
//! - **Paths.** For one host, port and method, the paths each policy reaches are the union of
//!   the path globs of the rules that match (every path for a rule without `paths`). The globs
//!   are globset's own regexes, built as DFAs and walked side by side over the bytes a request
//!   path can hold, so a path one side reaches and the other does not is found whenever one
//!   exists (bounded: [`MAX_STATES`] product states).
//! - **Facts** that change what a request carries or how it is handled — what a rule grants
//!   beyond matching, as [`crate::policy::facts::GRANTS`] describes it (a secret or a
//!   credential bound to a host pattern, `mode = "report"`, `allow_private`, `websocket`,
//!   `dangerously_allow_cleartext`, where placeholders are replaced, headers kept, `ask`,
//!   `mcp`, `capture`), and `[ask] unknown` — are compared as sets per identity; whether gaining
//!   one widens or narrows, and how its change reads, are that table's too.
//!
//! Every example request shown is then decided by [`crate::explain::explain`] on both policies,
//! exactly as `latchkey explain` and the proxy decide it; a difference no real request shows
//! (a path the proxy refuses as ambiguous, say) is not reported. Pure: no IO, no secret value.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use http::Method;
use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{nfa::thompson, util::syntax, Anchored, MatchKind};
use serde::Serialize;

use crate::explain::{explain, Explanation, Verdict};
use crate::policy::identity::{RuleSet, DEFAULT_IDENTITY};
use crate::policy::rule::path_glob;
use crate::policy::{display_url, ConnectDecision, HostPattern, Policy, Rule, Scheme};
use crate::reason::Reason;
mod paths;
use paths::*;
mod requests;
use requests::*;
mod facts;
use facts::*;
mod guards;
use guards::*;

/// Product states walked per path comparison before giving up on finding an example (the
/// change is then still reported, without one).
pub const MAX_STATES: usize = 100_000;

/// Methods every host is asked about, beside those its rules name.
const USUAL_METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];
/// Stand-ins for "a method no rule names": the first not named is used.
const OTHER_METHODS: &[&str] = &["PROPFIND", "MKCOL", "REPORT", "SEARCH"];

/// One side of a diff, as it is printed.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// The directory, or `REV:dir`.
    pub source: String,
    /// The policy digest.
    pub policy: String,
}

/// What a policy change means, per identity.
#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    pub old: Side,
    pub new: Side,
    /// Some change widens reach.
    pub widened: bool,
    /// Some change narrows it.
    pub narrowed: bool,
    /// Identities with at least one change, by name.
    pub identities: Vec<IdentityDiff>,
}

impl Diff {
    /// The one-line verdict the reports end with: whether it widens, and how many changes.
    pub fn verdict(&self) -> String {
        match (self.widening(), self.narrowing()) {
            (0, 0) => "no change in reach".to_string(),
            (0, n) => format!("does not widen reach: {n} change(s) narrow"),
            (w, n) => format!("widens reach: {w} change(s) widen, {n} narrow"),
        }
    }

    /// Changes that widen reach, in all identities.
    pub fn widening(&self) -> usize {
        self.count(Direction::Widened)
    }

    /// Changes that narrow it.
    pub fn narrowing(&self) -> usize {
        self.count(Direction::Narrowed)
    }

    fn count(&self, d: Direction) -> usize {
        self.identities
            .iter()
            .flat_map(|i| &i.changes)
            .filter(|c| c.direction == d)
            .count()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct IdentityDiff {
    pub identity: String,
    pub status: Status,
    pub changes: Vec<Change>,
}

/// Whether an identity is new, gone, or in both policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Added,
    Removed,
    Changed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Added => "added",
            Status::Removed => "removed",
            Status::Changed => "changed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Widened,
    Narrowed,
}

/// What changed; the order is the order a reviewer reads them in (secrets first). The kinds of
/// fact a rule grants, and how each reads, are the policy's own table
/// ([`crate::policy::facts::GRANTS`]).
pub use crate::policy::facts::Kind;

/// One change in one identity's reach. Fields that do not apply to its kind are absent.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    pub direction: Direction,
    pub kind: Kind,
    /// The host pattern as the rule writes it (`*.example.com`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub summary: String,
    /// The rule responsible: in the new policy for a widening, the old for a narrowing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential_kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Every `scheme:port` the change applies to (the first is `scheme` and `port`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub place: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub example: Option<Example>,
}

impl Change {
    fn new(direction: Direction, kind: Kind, host: Option<String>, summary: String) -> Change {
        Change {
            direction,
            kind,
            host,
            summary,
            rule: None,
            origin: None,
            secret: None,
            credential: None,
            credential_kind: None,
            scheme: None,
            port: None,
            ports: None,
            methods: None,
            method: None,
            cidr: None,
            place: None,
            header: None,
            example: None,
        }
    }
}

/// A concrete request one policy lets through and the other does not, as each decides it.
#[derive(Debug, Clone, Serialize)]
pub struct Example {
    pub method: String,
    pub url: String,
    pub old: Decided,
    pub new: Decided,
}

/// What one policy decides for an [`Example`].
#[derive(Debug, Clone, Serialize)]
pub struct Decided {
    pub decision: Verdict,
    /// The stable reason code.
    pub reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// A report-only denial: it would be denied, and goes through.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub report_only: bool,
}

impl Decided {
    /// 0 denied, 1 waits for a person, 2 goes through (a report-only denial goes through). A
    /// request refused only because it lacks what a rule's predicates require reaches as far
    /// as that rule: some request carrying it goes through (predicate changes are compared
    /// apart, in `guards`).
    fn level(&self) -> u8 {
        if self.reason == Reason::PredicateMismatch.code() {
            return 2;
        }
        match self.decision {
            Verdict::Allow => 2,
            Verdict::Deny if self.report_only => 2,
            Verdict::Ask => 1,
            Verdict::Deny => 0,
        }
    }

    fn of(e: &Explanation) -> Decided {
        Decided {
            decision: e.decision,
            reason: e.reason,
            rule: e.rule.clone(),
            report_only: e.report_only,
        }
    }

    /// An identity one policy does not define: the proxy refuses its token (407).
    fn undefined() -> Decided {
        Decided {
            decision: Verdict::Deny,
            reason: Reason::ProxyAuthRequired.code(),
            rule: None,
            report_only: false,
        }
    }
}

/// The diff of `old` → `new`, every identity of either.
pub fn diff(old: (&Policy, &str), new: (&Policy, &str)) -> Diff {
    let names: BTreeSet<String> = identity_names(old.0)
        .into_iter()
        .chain(identity_names(new.0))
        .collect();
    let mut identities = Vec::new();
    for name in names {
        let o = View::of(old.0, &name);
        let n = View::of(new.0, &name);
        let status = match (&o, &n) {
            (None, Some(_)) => Status::Added,
            (Some(_), None) => Status::Removed,
            _ => Status::Changed,
        };
        let empty_o;
        let empty_n;
        let o = match o {
            Some(v) => v,
            None => {
                empty_o = View::undefined(old.0, &name);
                empty_o
            }
        };
        let n = match n {
            Some(v) => v,
            None => {
                empty_n = View::undefined(new.0, &name);
                empty_n
            }
        };
        let mut changes = facts_changes(&o, &n);
        changes.extend(request_changes(&o, &n));
        changes.extend(guard_changes(&o, &n));
        changes.sort_by(|a, b| {
            (a.kind, a.direction, &a.host, &a.summary).cmp(&(
                b.kind,
                b.direction,
                &b.host,
                &b.summary,
            ))
        });
        if !changes.is_empty() {
            identities.push(IdentityDiff {
                identity: name,
                status,
                changes,
            });
        }
    }
    let any = |d: Direction| {
        identities
            .iter()
            .flat_map(|i: &IdentityDiff| &i.changes)
            .any(|c| c.direction == d)
    };
    Diff {
        widened: any(Direction::Widened),
        narrowed: any(Direction::Narrowed),
        old: Side {
            source: old.1.to_string(),
            policy: old.0.digest().to_string(),
        },
        new: Side {
            source: new.1.to_string(),
            policy: new.0.digest().to_string(),
        },
        identities,
    }
}

/// The identity names a policy defines (`default` when it defines none).
fn identity_names(p: &Policy) -> Vec<String> {
    if p.identities().is_empty() {
        vec![DEFAULT_IDENTITY.to_string()]
    } else {
        p.identities().iter().map(|i| i.name.clone()).collect()
    }
}

/// One identity under one policy: the rules it may use.
struct View<'p> {
    policy: &'p Policy,
    /// `None`: the identity is not defined here, so it reaches nothing.
    identity: Option<&'p str>,
    rules: Vec<&'p Rule>,
}

impl<'p> View<'p> {
    fn of(policy: &'p Policy, name: &'p str) -> Option<View<'p>> {
        let set = if policy.identities().is_empty() {
            if name != DEFAULT_IDENTITY {
                return None;
            }
            &RuleSet::All
        } else {
            &policy.identity(name)?.rules
        };
        Some(View {
            policy,
            identity: Some(name),
            rules: policy
                .rules()
                .iter()
                .filter(|r| set.allows(&r.name))
                .collect(),
        })
    }

    fn undefined(policy: &'p Policy, _name: &str) -> View<'p> {
        View {
            policy,
            identity: None,
            rules: Vec::new(),
        }
    }

    /// What this policy decides for one request by this identity.
    fn decide(&self, method: &str, url: &str) -> Option<Decided> {
        let Some(name) = self.identity else {
            return Some(Decided::undefined());
        };
        let asked = (name != DEFAULT_IDENTITY).then_some(name);
        explain(self.policy, asked, method, url)
            .ok()
            .map(|e| Decided::of(&e))
    }

    fn asks_unknown(&self) -> bool {
        self.identity.is_some() && self.policy.ask().unknown
    }
}

#[cfg(test)]
#[path = "diff_tests.rs"]
mod tests;

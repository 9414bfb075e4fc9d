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
//! - **Facts** that change what a request carries or how it is handled — a secret or a
//!   credential bound to a host pattern, `tunnel`, `mode = "report"`, `allow_private`,
//!   `dangerously_allow_cleartext` (credentials in cleartext: a widening), where
//!   placeholders are replaced, headers kept, `ask` — are compared as sets per identity.
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

/// What changed; the order is the order a reviewer reads them in (secrets first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Secret,
    Credential,
    Host,
    Tunnel,
    Port,
    Method,
    Path,
    ReportOnly,
    AllowPrivate,
    /// `websocket = true`: requests to the host may upgrade to a WebSocket.
    Websocket,
    Placeholders,
    KeepHeader,
    Ask,
    AskUnknown,
    /// A captured token newly bound to a host (`capture`).
    Capture,
    /// A rule's `mcp` table: adding one narrows (calls are matched), removing one widens; a
    /// changed table is both its old form removed and its new one added.
    Mcp,
    /// `dangerously_allow_cleartext = true` on a rule covering `http`: its credentials may go
    /// upstream in cleartext.
    Cleartext,
}

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
    /// 0 denied, 1 waits for a person, 2 goes through (a report-only denial goes through).
    fn level(&self) -> u8 {
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

// ---- facts ------------------------------------------------------------------------------

/// A fact about one host pattern: what it is, and the rule that makes it so.
struct Fact {
    kind: Kind,
    host: Option<String>,
    /// The secret, credential, CIDR, place or header.
    detail: String,
    rule: Option<String>,
    origin: Option<String>,
    credential_kind: Option<String>,
}

fn facts(v: &View<'_>) -> BTreeMap<(Kind, Option<String>, String), Fact> {
    let mut out = BTreeMap::new();
    let mut add =
        |rule: &Rule, kind: Kind, host: &HostPattern, detail: String, ck: Option<String>| {
            let key = (kind, Some(host.to_string()), detail.clone());
            out.entry(key).or_insert_with(|| Fact {
                kind,
                host: Some(host.to_string()),
                detail,
                rule: Some(rule.name.clone()),
                origin: Some(rule.origin.to_string()),
                credential_kind: ck,
            });
        };
    for rule in &v.rules {
        let secrets: Vec<&String> = rule
            .bound
            .iter()
            .filter(|s| !s.starts_with("credential:"))
            .collect();
        for host in &rule.hosts {
            for s in &secrets {
                add(rule, Kind::Secret, host, s.to_string(), None);
            }
            if let Some(c) = &rule.credential {
                let kind = v.policy.credential(c).map(|c| c.kind.label().to_string());
                add(rule, Kind::Credential, host, c.clone(), kind);
            }
            if rule.report {
                add(rule, Kind::ReportOnly, host, String::new(), None);
            }
            for cidr in &rule.allow_private {
                add(rule, Kind::AllowPrivate, host, cidr.to_string(), None);
            }
            if rule.websocket {
                add(rule, Kind::Websocket, host, String::new(), None);
            }
            if rule.cleartext && rule.schemes.allows(Scheme::Http) {
                add(rule, Kind::Cleartext, host, String::new(), None);
            }
            if !secrets.is_empty() || rule.credential.is_some() {
                for place in &rule.placeholders {
                    add(
                        rule,
                        Kind::Placeholders,
                        host,
                        place.as_str().to_string(),
                        None,
                    );
                }
            }
            for h in &rule.keep_headers {
                add(rule, Kind::KeepHeader, host, h.to_string(), None);
            }
            if rule.ask.is_some() {
                add(rule, Kind::Ask, host, String::new(), None);
            }
            if let Some(c) = &rule.capture {
                for f in &c.fields {
                    add(rule, Kind::Capture, host, c.secret_name(f), None);
                }
            }
            if let Some(m) = &rule.mcp {
                add(
                    rule,
                    Kind::Mcp,
                    host,
                    crate::policy::reach::mcp_summary(m),
                    None,
                );
            }
        }
    }
    if v.asks_unknown() {
        out.insert(
            (Kind::AskUnknown, None, String::new()),
            Fact {
                kind: Kind::AskUnknown,
                host: None,
                detail: String::new(),
                rule: None,
                origin: None,
                credential_kind: None,
            },
        );
    }
    out
}

fn facts_changes(o: &View<'_>, n: &View<'_>) -> Vec<Change> {
    let old = facts(o);
    let new = facts(n);
    let mut out = Vec::new();
    for (key, fact) in &new {
        if !old.contains_key(key) {
            out.push(fact_change(fact, true));
        }
    }
    for (key, fact) in &old {
        if !new.contains_key(key) {
            out.push(fact_change(fact, false));
        }
    }
    // A fact on an exact host that a wildcard on the other side gives it too (the secret moved
    // from `api.x.com` to `*.x.com`) did not change for that host: only the wildcard is news.
    let covered = |c: &Change, other: &BTreeMap<(Kind, Option<String>, String), Fact>| {
        let detail = fact_detail(c);
        c.host.as_deref().is_some_and(|h| {
            !h.starts_with("*.")
                && other.iter().any(|((k, host, d), _)| {
                    *k == c.kind
                        && *d == detail
                        && host
                            .as_deref()
                            .and_then(|p| p.strip_prefix("*."))
                            .is_some_and(|suffix| {
                                HostPattern::Wildcard(suffix.to_string()).matches(h)
                            })
                })
        })
    };
    out.retain(|c| {
        // `ask` narrows when added; every other fact widens when added.
        let added = (c.direction == Direction::Widened) != matches!(c.kind, Kind::Ask | Kind::Mcp);
        !covered(c, if added { &old } else { &new })
    });
    // Where placeholders are replaced belongs to the secrets bound: a secret newly bound to a
    // host brings its placeholders along, which is one change, not two.
    let binding: BTreeSet<(Direction, Option<String>)> = out
        .iter()
        .filter(|c| matches!(c.kind, Kind::Secret | Kind::Credential))
        .map(|c| (c.direction, c.host.clone()))
        .collect();
    out.retain(|c| {
        c.kind != Kind::Placeholders || !binding.contains(&(c.direction, c.host.clone()))
    });
    out
}

/// The detail of a fact change (its secret, credential, CIDR, place or header).
fn fact_detail(c: &Change) -> String {
    c.secret
        .clone()
        .or_else(|| c.credential.clone())
        .or_else(|| c.cidr.clone())
        .or_else(|| c.place.clone())
        .or_else(|| c.header.clone())
        .unwrap_or_default()
}

fn fact_change(f: &Fact, added: bool) -> Change {
    // An added `ask` makes a person approve what went through alone: that narrows. Every other
    // fact (`[ask] unknown` included: anything may now be asked for) widens when added.
    let widens = if matches!(f.kind, Kind::Ask | Kind::Mcp) {
        !added
    } else {
        added
    };
    let direction = if widens {
        Direction::Widened
    } else {
        Direction::Narrowed
    };
    let host = f.host.clone().unwrap_or_default();
    let (now, gone) = ("newly", "no longer");
    let when = if added { now } else { gone };
    let summary = match f.kind {
        Kind::Secret => format!("secret {} {when} bound to {host}", f.detail),
        Kind::Credential => format!(
            "credential {} ({}) {when} used on {host}",
            f.detail,
            f.credential_kind.as_deref().unwrap_or("unknown")
        ),
        Kind::ReportOnly => format!(
            "{host}: a rule in mode = \"report\" {} (what it would deny goes through)",
            if added { "added" } else { "removed" }
        ),
        Kind::AllowPrivate => format!("{host}: private range {} {when} allowed", f.detail),
        Kind::Websocket => format!("{host}: WebSocket upgrades {when} allowed"),
        Kind::Cleartext => format!(
            "{host}: credentials {when} sent over plain http (dangerously_allow_cleartext = true)"
        ),
        Kind::Placeholders => format!("{host}: placeholders {when} replaced in the {}", f.detail),
        Kind::KeepHeader => format!(
            "{host}: header {} {when} passed through unstripped",
            f.detail
        ),
        Kind::Capture => format!("captured token {} {when} bound to {host}", f.detail),
        Kind::Mcp if added => format!("{host}: MCP calls now limited to {}", f.detail),
        Kind::Mcp => format!("{host}: MCP calls no longer limited to {}", f.detail),
        Kind::Ask if added => format!("{host}: a person must now approve requests (ask)"),
        Kind::Ask => format!("{host}: requests no longer wait for a person (ask removed)"),
        Kind::AskUnknown if added => {
            "[ask] unknown: any request no rule allows may now be asked for".to_string()
        }
        Kind::AskUnknown => {
            "[ask] unknown: requests no rule allows are no longer asked for".to_string()
        }
        _ => f.detail.clone(),
    };
    let mut c = Change::new(direction, f.kind, f.host.clone(), summary);
    c.rule = f.rule.clone();
    c.origin = f.origin.clone();
    match f.kind {
        Kind::Secret => c.secret = Some(f.detail.clone()),
        Kind::Credential => {
            c.credential = Some(f.detail.clone());
            c.credential_kind = f.credential_kind.clone();
        }
        Kind::AllowPrivate => c.cidr = Some(f.detail.clone()),
        Kind::Placeholders => c.place = Some(f.detail.clone()),
        Kind::KeepHeader => c.header = Some(f.detail.clone()),
        _ => {}
    }
    c
}

// ---- requests ---------------------------------------------------------------------------

/// One host to ask about, and the pattern it stands for.
struct Sample {
    host: String,
    shown: String,
}

/// One sample host per host pattern of either side (see the module docs).
fn samples(o: &View<'_>, n: &View<'_>) -> Vec<Sample> {
    let patterns: BTreeSet<String> = o
        .rules
        .iter()
        .chain(&n.rules)
        .flat_map(|r| r.hosts.iter().map(ToString::to_string))
        .collect();
    let exact: BTreeSet<&str> = patterns
        .iter()
        .filter(|p| !p.starts_with("*."))
        .map(String::as_str)
        .collect();
    let mut out = Vec::new();
    for p in &patterns {
        match p.strip_prefix("*.") {
            None => out.push(Sample {
                host: p.clone(),
                shown: p.clone(),
            }),
            Some(suffix) => {
                let fresh = (0..)
                    .map(|i| match i {
                        0 => format!("x.{suffix}"),
                        i => format!("x{i}.{suffix}"),
                    })
                    .find(|h| !exact.contains(h.as_str()))
                    .unwrap_or_else(|| format!("x.{suffix}"));
                out.push(Sample {
                    host: fresh,
                    shown: p.clone(),
                });
            }
        }
    }
    out
}

/// The paths one side reaches for one host, port and method.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Paths {
    None,
    All,
    Globs(BTreeSet<String>),
}

impl Paths {
    fn add(&mut self, rule: &Rule) {
        match (&mut *self, &rule.paths) {
            (Paths::All, _) => {}
            (_, None) => *self = Paths::All,
            (Paths::None, Some(p)) => *self = Paths::Globs(p.globs.iter().cloned().collect()),
            (Paths::Globs(g), Some(p)) => g.extend(p.globs.iter().cloned()),
        }
    }

    fn reaches(&self) -> bool {
        *self != Paths::None
    }

    /// Concrete paths in this set, from its globs (for examples that read well).
    fn instances(&self) -> Vec<String> {
        match self {
            Paths::None => Vec::new(),
            Paths::All => vec!["/".to_string(), "/x".to_string()],
            Paths::Globs(g) => g.iter().flat_map(|g| instantiate(g)).collect(),
        }
    }
}

/// Rules of `v` matching a host, port and method (tunnel rules never match a request).
fn paths_for(rules: &[&Rule], scheme: Scheme, port: u16, method: &Method) -> Paths {
    let mut p = Paths::None;
    for r in rules {
        if !r.tunnel
            && r.schemes.allows(scheme)
            && r.port_matches(scheme, port)
            && r.method_matches(method)
        {
            p.add(r);
        }
    }
    p
}

/// The first rule of `v` that reaches `host` (for `rule`/`origin` of host-level changes).
fn rule_for<'p>(
    v: &View<'p>,
    host: &str,
    scheme: Scheme,
    port: u16,
    method: &Method,
) -> Option<&'p Rule> {
    v.rules.iter().copied().find(|r| {
        !r.tunnel
            && r.hosts.iter().any(|h| h.matches(host))
            && r.schemes.allows(scheme)
            && r.port_matches(scheme, port)
            && r.method_matches(method)
    })
}

/// The reach of one sample host: per (scheme, port), per method, the paths of each side.
struct HostReach {
    /// (scheme, port, method text, method) → (old, new).
    cells: Vec<(Scheme, u16, String, Method, Paths, Paths)>,
}

/// Each side's rules for one host: the cells of [`host_reach`] only look at these.
fn on_host<'p>(v: &View<'p>, host: &str) -> Vec<&'p Rule> {
    v.rules
        .iter()
        .copied()
        .filter(|r| r.hosts.iter().any(|h| h.matches(host)))
        .collect()
}

fn host_reach(o: &View<'_>, n: &View<'_>, host: &str) -> HostReach {
    let (old_rules, new_rules) = (on_host(o, host), on_host(n, host));
    let both = || old_rules.iter().chain(&new_rules);
    let named: BTreeSet<String> = both()
        .flat_map(|r| r.methods.iter().flatten().map(|m| m.as_str().to_string()))
        .collect();
    let mut methods: Vec<String> = USUAL_METHODS.iter().map(|m| m.to_string()).collect();
    for m in &named {
        if !methods.contains(m) {
            methods.push(m.clone());
        }
    }
    if let Some(other) = OTHER_METHODS.iter().find(|m| !named.contains(**m)) {
        methods.push((*other).to_string());
    }
    let named_ports: BTreeSet<u16> = both()
        .flat_map(|r| r.ports.iter().flatten().copied())
        .collect();
    let mut cells = Vec::new();
    for scheme in [Scheme::Https, Scheme::Http] {
        let mut ports = named_ports.clone();
        ports.insert(scheme.default_port());
        for &port in &ports {
            for m in &methods {
                let Ok(method) = Method::from_bytes(m.as_bytes()) else {
                    continue;
                };
                let po = paths_for(&old_rules, scheme, port, &method);
                let pn = paths_for(&new_rules, scheme, port, &method);
                cells.push((scheme, port, m.clone(), method, po, pn));
            }
        }
    }
    HostReach { cells }
}

/// Where a port, method or path change applies, filled in once the same change on other
/// schemes and ports is merged into it.
const WHERE: &str = "\u{0}where\u{0}";

fn request_changes(o: &View<'_>, n: &View<'_>) -> Vec<Change> {
    let mut out = Vec::new();
    for s in samples(o, n) {
        let mut here = Vec::new();
        host_changes(o, n, &s, &mut here);
        // The rule a change is put down to is the one that decides its example, when it has
        // one: the first rule matching the method may not be the one reaching the path.
        for c in &mut here {
            let (view, decided) = match (&c.example, c.direction) {
                (Some(e), Direction::Widened) => (n, &e.new),
                (Some(e), Direction::Narrowed) => (o, &e.old),
                (None, _) => continue,
            };
            let rule = decided
                .rule
                .as_deref()
                .and_then(|name| view.rules.iter().find(|r| r.name == name));
            if rule.is_some() {
                set_rule(c, rule.copied());
            }
        }
        out.extend(merge_ports(here, &s.shown));
        tunnel_changes(o, n, &s, &mut out);
    }
    out
}

/// One change for what differs the same way on several schemes and ports (a rule without
/// `ports` reaches http:80 and https:443 alike): the first keeps its example and lists them
/// all in `ports`.
fn merge_ports(changes: Vec<Change>, host: &str) -> Vec<Change> {
    let mut out: Vec<Change> = Vec::new();
    for c in changes {
        let same = out.iter_mut().find(|o| {
            o.scheme.is_some()
                && (o.direction, o.kind, &o.host, &o.methods, &o.method, &o.rule)
                    == (c.direction, c.kind, &c.host, &c.methods, &c.method, &c.rule)
        });
        match (same, c.scheme, c.port) {
            (Some(o), Some(scheme), Some(port)) => o
                .ports
                .get_or_insert_with(Vec::new)
                .push(format!("{scheme}:{port}")),
            _ => {
                let mut c = c;
                if let (Some(scheme), Some(port)) = (c.scheme, c.port) {
                    c.ports = Some(vec![format!("{scheme}:{port}")]);
                }
                out.push(c);
            }
        }
    }
    for c in &mut out {
        let place = match (c.scheme, c.port, c.ports.as_deref()) {
            (Some(scheme), Some(port), Some([_])) | (Some(scheme), Some(port), None) => {
                format!("{scheme} {}", crate::policy::display_authority(host, port))
            }
            (_, _, Some(all)) => format!("{host} ({})", all.join(", ")),
            _ => host.to_string(),
        };
        c.summary = c.summary.replace(WHERE, &place);
    }
    out
}

/// Host, port, method and path changes for one sample host.
fn host_changes(o: &View<'_>, n: &View<'_>, s: &Sample, out: &mut Vec<Change>) {
    let reach = host_reach(o, n, &s.host);
    let cells = &reach.cells;
    // A host a tunnel rule relays is reachable too (its CONNECT is `tunnel_changes`'): losing
    // interception is not losing the host.
    let tunnels = |v: &View<'_>| {
        v.rules
            .iter()
            .any(|r| r.tunnel && r.hosts.iter().any(|h| h.matches(&s.host)))
    };
    let old_any = cells.iter().any(|c| c.4.reaches()) || tunnels(o);
    let new_any = cells.iter().any(|c| c.5.reaches()) || tunnels(n);
    for (dir, (from, to)) in [(Direction::Widened, (o, n)), (Direction::Narrowed, (n, o))] {
        let (had, has) = match dir {
            Direction::Widened => (old_any, new_any),
            Direction::Narrowed => (new_any, old_any),
        };
        let side = |c: &(Scheme, u16, String, Method, Paths, Paths)| -> (Paths, Paths) {
            match dir {
                Direction::Widened => (c.4.clone(), c.5.clone()),
                Direction::Narrowed => (c.5.clone(), c.4.clone()),
            }
        };
        if has && !had {
            // Reachable at all now: one change for the host, its example the first cell.
            if let Some(mut c) = cells.iter().find_map(|cell| {
                let (_, now) = side(cell);
                now.reaches()
                    .then(|| {
                        let example = find_example(
                            from,
                            to,
                            dir,
                            s,
                            cell.0,
                            cell.1,
                            &cell.2,
                            &Paths::None,
                            &now,
                        );
                        let rule = rule_for(to, &s.host, cell.0, cell.1, &cell.3);
                        let when = if dir == Direction::Widened {
                            "newly"
                        } else {
                            "no longer"
                        };
                        let mut c = Change::new(
                            dir,
                            Kind::Host,
                            Some(s.shown.clone()),
                            format!("host {} {when} reachable", s.shown),
                        );
                        // Only a difference a request shows is reported.
                        c.example = Some(example?);
                        set_rule(&mut c, rule);
                        Some(c)
                    })
                    .flatten()
            }) {
                c.scheme = None;
                out.push(c);
            }
            continue;
        }
        if !has {
            continue;
        }
        // Both reach the host: compare per (scheme, port).
        let mut ports: Vec<(Scheme, u16)> = cells.iter().map(|c| (c.0, c.1)).collect();
        ports.dedup();
        for (scheme, port) in ports {
            let here: Vec<&(Scheme, u16, String, Method, Paths, Paths)> = cells
                .iter()
                .filter(|c| c.0 == scheme && c.1 == port)
                .collect();
            let had_port = here.iter().any(|c| side(c).0.reaches());
            let has_port = here.iter().any(|c| side(c).1.reaches());
            let when = if dir == Direction::Widened {
                "newly"
            } else {
                "no longer"
            };
            if has_port && !had_port {
                // The first method whose example a request shows (none: nothing to report,
                // as for a port a tunnel now relays instead).
                let found = here
                    .iter()
                    .filter(|c| side(c).1.reaches())
                    .find_map(|cell| {
                        let (before, now) = side(cell);
                        find_example(from, to, dir, s, scheme, port, &cell.2, &before, &now)
                            .map(|e| (cell, e))
                    });
                if let Some((cell, example)) = found {
                    let mut c = Change::new(
                        dir,
                        Kind::Port,
                        Some(s.shown.clone()),
                        format!("{WHERE} {when} reachable"),
                    );
                    c.scheme = Some(scheme.as_str());
                    c.port = Some(port);
                    c.example = Some(example);
                    set_rule(&mut c, rule_for(to, &s.host, scheme, port, &cell.3));
                    out.push(c);
                }
                continue;
            }
            if !has_port {
                continue;
            }
            // Methods reachable now on no path before.
            let new_methods: Vec<&&(Scheme, u16, String, Method, Paths, Paths)> = here
                .iter()
                .filter(|c| {
                    let (b, a) = side(c);
                    a.reaches() && !b.reaches()
                })
                .collect();
            let shown = new_methods.iter().find_map(|cell| {
                let (before, now) = side(cell);
                find_example(from, to, dir, s, scheme, port, &cell.2, &before, &now)
                    .map(|e| (cell, e))
            });
            if let Some((first, example)) = shown {
                let mut names: Vec<String> = new_methods
                    .iter()
                    .map(|c| {
                        if OTHER_METHODS.contains(&c.2.as_str()) && !named_anywhere(o, n, &c.2) {
                            "other".to_string()
                        } else {
                            c.2.clone()
                        }
                    })
                    .collect();
                names.sort();
                names.dedup();
                let mut c = Change::new(
                    dir,
                    Kind::Method,
                    Some(s.shown.clone()),
                    format!("methods {} {when} allowed on {WHERE}", names.join(", "),),
                );
                c.scheme = Some(scheme.as_str());
                c.port = Some(port);
                c.methods = Some(names);
                c.example = Some(example);
                set_rule(&mut c, rule_for(to, &s.host, scheme, port, &first.3));
                out.push(c);
            }
            // Methods reachable on both: their paths.
            for cell in here.iter().filter(|c| {
                let (b, a) = side(c);
                a.reaches() && b.reaches() && a != b
            }) {
                let (before, now) = side(cell);
                let Some(example) =
                    find_example(from, to, dir, s, scheme, port, &cell.2, &before, &now)
                else {
                    continue;
                };
                let shown_method =
                    if OTHER_METHODS.contains(&cell.2.as_str()) && !named_anywhere(o, n, &cell.2) {
                        "other".to_string()
                    } else {
                        cell.2.clone()
                    };
                let mut c = Change::new(
                    dir,
                    Kind::Path,
                    Some(s.shown.clone()),
                    format!(
                        "{shown_method} paths {} on {WHERE}: e.g. {}",
                        if dir == Direction::Widened {
                            "widened"
                        } else {
                            "narrowed"
                        },
                        path_of(&example.url)
                    ),
                );
                c.scheme = Some(scheme.as_str());
                c.port = Some(port);
                c.method = Some(shown_method);
                c.example = Some(example);
                set_rule(&mut c, rule_for(to, &s.host, scheme, port, &cell.3));
                out.push(c);
            }
        }
    }
}

/// Whether `method` is named by some rule of either side (else it stands for "other").
fn named_anywhere(o: &View<'_>, n: &View<'_>, method: &str) -> bool {
    o.rules
        .iter()
        .chain(&n.rules)
        .any(|r| r.methods.iter().flatten().any(|m| m.as_str() == method))
}

fn path_of(url: &str) -> &str {
    url.find("://")
        .and_then(|i| url[i + 3..].find('/').map(|j| &url[i + 3 + j..]))
        .unwrap_or("/")
}

fn set_rule(c: &mut Change, rule: Option<&Rule>) {
    if let Some(r) = rule {
        c.rule = Some(r.name.clone());
        c.origin = Some(r.origin.to_string());
    }
}

/// A request `to` lets through and `from` does not, with paths from `now` minus `before`:
/// readable instances of `now`'s globs first, then the shortest path the DFAs find. `None` when
/// no real request shows the difference (each candidate is decided by both policies).
#[allow(clippy::too_many_arguments)]
fn find_example(
    from: &View<'_>,
    to: &View<'_>,
    dir: Direction,
    s: &Sample,
    scheme: Scheme,
    port: u16,
    method: &str,
    before: &Paths,
    now: &Paths,
) -> Option<Example> {
    let mut candidates = now.instances();
    if let Some(w) = witness(now, before) {
        candidates.push(w);
    }
    let set_now = PathSet::build(now);
    let set_before = PathSet::build(before);
    for path in candidates {
        let inside = set_now
            .as_ref()
            .is_some_and(|d| d.contains(path.as_bytes()));
        let outside = !set_before
            .as_ref()
            .is_some_and(|d| d.contains(path.as_bytes()));
        if !(inside && outside) {
            continue;
        }
        let url = display_url(scheme, &s.host, port, &path);
        let (Some(a), Some(b)) = (to.decide(method, &url), from.decide(method, &url)) else {
            continue;
        };
        if a.level() > b.level() {
            let (old, new) = match dir {
                Direction::Widened => (b, a),
                Direction::Narrowed => (a, b),
            };
            return Some(Example {
                method: method.to_string(),
                url,
                old,
                new,
            });
        }
    }
    None
}

/// CONNECT relayed raw in one policy and not the other, per https port a rule names.
fn tunnel_changes(o: &View<'_>, n: &View<'_>, s: &Sample, out: &mut Vec<Change>) {
    let mut ports: BTreeSet<u16> = o
        .rules
        .iter()
        .chain(&n.rules)
        .filter(|r| r.tunnel && r.hosts.iter().any(|h| h.matches(&s.host)))
        .flat_map(|r| r.ports_for(Scheme::Https))
        .collect();
    if ports.is_empty() {
        return;
    }
    ports.insert(443);
    for port in ports {
        let tunnel = |v: &View<'_>| -> Option<String> {
            let id = v.identity?;
            let ident = v.policy.identity(id);
            if !v.policy.identities().is_empty() && ident.is_none() {
                return None;
            }
            match v.policy.decide_connect(&s.host, port, ident) {
                ConnectDecision::Tunnel(r) => Some(r.name.clone()),
                _ => None,
            }
        };
        let (to, tn) = (tunnel(o), tunnel(n));
        let dir = match (&to, &tn) {
            (None, Some(_)) => Direction::Widened,
            (Some(_), None) => Direction::Narrowed,
            _ => continue,
        };
        let authority = crate::policy::display_authority(&s.shown, port);
        let mut c = Change::new(
            dir,
            Kind::Tunnel,
            Some(s.shown.clone()),
            if dir == Direction::Widened {
                format!("CONNECT {authority} now relayed raw (not inspected)")
            } else {
                format!("CONNECT {authority} no longer relayed raw")
            },
        );
        c.port = Some(port);
        let (name, view) = match dir {
            Direction::Widened => (tn, n),
            Direction::Narrowed => (to, o),
        };
        if let Some(rule) = name.and_then(|nm| view.rules.iter().find(|r| r.name == nm)) {
            set_rule(&mut c, Some(rule));
        }
        let url = display_url(Scheme::Https, &s.host, port, "/");
        if let (Some(a), Some(b)) = (o.decide("GET", &url), n.decide("GET", &url)) {
            c.example = Some(Example {
                method: "CONNECT".to_string(),
                url,
                old: a,
                new: b,
            });
        }
        out.push(c);
    }
}

// ---- path sets as DFAs ------------------------------------------------------------------

/// Bytes a request path can hold (RFC 3986 `pchar` and `/`), most readable first: a witness
/// path is made of these.
const PATH_BYTES: &[u8] =
    b"abcdefghijklmnopqrstuvwxyz0123456789/-_.ABCDEFGHIJKLMNOPQRSTUVWXYZ~!$&'()*+,;=:@%";

/// A set of paths as one DFA over the union of its globs.
struct PathSet {
    dfa: dense::DFA<Vec<u32>>,
    start: StateID,
}

impl PathSet {
    /// `None` for the empty set (or a set whose DFA cannot be built: treated as empty only
    /// for examples, never for the decision that something changed).
    fn build(paths: &Paths) -> Option<PathSet> {
        let patterns: Vec<String> = match paths {
            Paths::None => return None,
            Paths::All => vec!["(?s-u)^/.*$".to_string()],
            Paths::Globs(g) => g
                .iter()
                .filter_map(|g| path_glob(g).ok().map(|g| g.regex().to_string()))
                .collect(),
        };
        let dfa = dense::Builder::new()
            .syntax(syntax::Config::new().utf8(false).unicode(false))
            .thompson(thompson::Config::new().utf8(false))
            .configure(
                dense::Config::new()
                    .start_kind(StartKind::Anchored)
                    .match_kind(MatchKind::All)
                    .dfa_size_limit(Some(16 << 20))
                    .determinize_size_limit(Some(16 << 20)),
            )
            .build_many(&patterns)
            .ok()?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .ok()?;
        Some(PathSet { dfa, start })
    }

    fn contains(&self, path: &[u8]) -> bool {
        let mut s = self.start;
        for &b in path {
            s = self.dfa.next_state(s, b);
            if self.dfa.is_dead_state(s) {
                return false;
            }
        }
        self.dfa.is_match_state(self.dfa.next_eoi_state(s))
    }
}

/// The shortest path (over [`PATH_BYTES`]) in `now` and not in `before`.
fn witness(now: &Paths, before: &Paths) -> Option<String> {
    let a = PathSet::build(now)?;
    let b = PathSet::build(before);
    // States: (a, b) where b = None is "outside every glob of `before` for good".
    type Key = (StateID, Option<StateID>);
    let mut seen: HashMap<Key, (Option<Key>, u8)> = HashMap::new();
    let first: Key = (a.start, b.as_ref().map(|b| b.start));
    seen.insert(first, (None, 0));
    let mut queue = VecDeque::from([first]);
    let accepted = |k: &Key| {
        a.dfa.is_match_state(a.dfa.next_eoi_state(k.0))
            && match (&b, k.1) {
                (Some(b), Some(s)) => !b.dfa.is_match_state(b.dfa.next_eoi_state(s)),
                _ => true,
            }
    };
    while let Some(k) = queue.pop_front() {
        if accepted(&k) && k != first {
            let mut bytes = Vec::new();
            let mut at = k;
            while let Some((Some(prev), byte)) = seen.get(&at).copied() {
                bytes.push(byte);
                at = prev;
            }
            bytes.reverse();
            return String::from_utf8(bytes).ok();
        }
        if seen.len() >= MAX_STATES {
            return None;
        }
        for &byte in PATH_BYTES {
            let na = a.dfa.next_state(k.0, byte);
            if a.dfa.is_dead_state(na) {
                continue;
            }
            let nb = match (&b, k.1) {
                (Some(b), Some(s)) => {
                    let t = b.dfa.next_state(s, byte);
                    (!b.dfa.is_dead_state(t)).then_some(t)
                }
                _ => None,
            };
            let next = (na, nb);
            if let std::collections::hash_map::Entry::Vacant(e) = seen.entry(next) {
                e.insert((Some(k), byte));
                queue.push_back(next);
            }
        }
    }
    None
}

/// Readable paths a glob matches: `*` → `x`, `**` → `x/y` and `x`, a class → a byte it holds,
/// `{a,b}` → each alternative. Candidates only: each is checked against the DFAs.
fn instantiate(glob: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let chars: Vec<char> = glob.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let push = |out: &mut Vec<String>, s: &str| {
            for o in out.iter_mut() {
                o.push_str(s);
            }
        };
        match c {
            '\\' if i + 1 < chars.len() => {
                push(&mut out, &chars[i + 1].to_string());
                i += 2;
            }
            '*' if chars.get(i + 1) == Some(&'*') => {
                let mut more = out.clone();
                push(&mut out, "x/y");
                push(&mut more, "x");
                out.extend(more);
                i += 2;
            }
            '*' => {
                push(&mut out, "x");
                i += 1;
            }
            '[' => {
                let end = chars[i + 1..]
                    .iter()
                    .position(|&c| c == ']')
                    .map(|p| i + 1 + p);
                let Some(end) = end else {
                    push(&mut out, "[");
                    i += 1;
                    continue;
                };
                let class: String = chars[i + 1..end].iter().collect();
                let pick = if class.starts_with('!') || class.starts_with('^') {
                    ['x', 'q', 'z', '0', '_']
                        .into_iter()
                        .find(|c| !class.contains(*c))
                        .unwrap_or('x')
                } else {
                    class.chars().next().unwrap_or('x')
                };
                push(&mut out, &pick.to_string());
                i = end + 1;
            }
            '{' => {
                let end = chars[i + 1..]
                    .iter()
                    .position(|&c| c == '}')
                    .map(|p| i + 1 + p);
                let Some(end) = end else {
                    push(&mut out, "{");
                    i += 1;
                    continue;
                };
                let inner: String = chars[i + 1..end].iter().collect();
                let mut next = Vec::new();
                for alt in inner.split(',') {
                    for o in &out {
                        next.push(format!("{o}{}", alt.replace('*', "x")));
                    }
                }
                out = next;
                i = end + 1;
            }
            c => {
                push(&mut out, &c.to_string());
                i += 1;
            }
        }
        if out.len() > 16 {
            out.truncate(16);
        }
    }
    out
}

#[cfg(test)]
#[path = "diff_tests.rs"]
mod tests;

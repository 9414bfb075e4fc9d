//! Warnings about valid but risky policy: what `latchkey check` prints besides errors.
//!
//! A warning never stops a policy from loading; it points a reviewer at a construct that is
//! allowed but deserves a second look:
//!
//! - `wildcard_secret`: a secret or credential bound to a wildcard host
//!   (`dangerously_inject_into_wildcard`);
//! - `secret_all_methods`: a rule that binds a secret or uses a credential and allows every
//!   method;
//! - `unused_secret`, `unused_credential`: a declared secret no rule binds, a declared
//!   credential no rule uses;
//! - `shadowed_rule`: a rule that never decides for a host, because a rule before it in the
//!   decision order (see [`super`]) allows the same ports, methods and paths;
//! - `wide_identity`: an identity with every rule (`rules = ["*"]`), no token, and a source range
//!   wider than an IPv4 /16 (IPv6 /48);
//! - `unheard_ask`: rules with `ask` or `[ask] unknown = true`, and no `[notify.*]`: nobody hears
//!   of an approval unless they poll `latchkey approvals list`;
//! - `unused_notifier`: a `[notify.NAME]` no ask ever tells;
//! - `unused_limit`: a `[limits.NAME]` no rule, identity or credential names;
//! - `unmetered_tunnel`: an identity charged to a limit that meters model-provider usage
//!   (`llm_tokens`, `spend`) may use a `tunnel = true` rule, whose requests latchkey cannot
//!   read, so that limit does not count them (`bytes_up` does count a tunnel's bytes);
//! - `free_model`: a `[prices."MODEL"]` that prices input and output at 0, so `spend` budgets
//!   count its calls as free;
//! - `cleartext_credential`: a rule that brokers a credential over plain http
//!   (`dangerously_allow_cleartext = true`); `useless_cleartext`: the key on a rule it does not
//!   change (one that brokers nothing, or whose `schemes` leave out http).
//! - `unreachable_denial`: a `[[deny]]` whose hosts no rule names (and no `[ask] unknown`):
//!   harmless, since nothing reaches them, but likely a typo in a host;
//! - `graphql_without_post_or_get`: a `graphql` predicate on a rule or denial whose methods
//!   leave out both POST and GET, the methods GraphQL is sent with: such a rule allows nothing,
//!   such a denial refuses every request it matches (what it cannot read selects).
//! - `price_matches_nothing`: a `[prices."MODEL"]` written as a pattern or prefix (`o3-*`,
//!   `gpt-5-`, a space): model names are matched exactly (less a snapshot suffix), so it prices
//!   no model and the variants it meant stay unpriced.
//!
//! Lint runs on a compiled [`Policy`] plus the source text it came from (for line:col spans), and
//! reads no secret value.
//!
//! ```text
//! policies/api.toml:12:1: warning: rule "openai" binds secret(s) "openai" and allows every method; list the methods it needs
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::policy::compile::line_col;
use crate::policy::identity::RuleSet;
use crate::policy::schema;
use crate::policy::{HostPattern, Policy, Rule, Scheme};

#[path = "lint_guards.rs"]
mod guards;

/// One warning, located like a [`crate::policy::PolicyError`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Warning {
    #[serde(serialize_with = "display_path")]
    pub file: PathBuf,
    pub line: usize,
    pub col: usize,
    /// Stable snake_case code (see the module docs), for CI annotations and suppression.
    pub code: &'static str,
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: warning: {}",
            self.file.display(),
            self.line,
            self.col,
            self.message
        )
    }
}

fn display_path<S: serde::Serializer>(path: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&path.display())
}

/// Where things were written, from a second (cheap) parse of the sources.
#[derive(Default)]
struct Spans {
    /// Rule name → (file, line, col) of its `name` value.
    rules: HashMap<String, Loc>,
    /// Rule name → location of its `dangerously_inject_into_wildcard` value.
    wildcard_flags: HashMap<String, Loc>,
    /// Rule name → location of its `dangerously_allow_cleartext` value.
    cleartext_flags: HashMap<String, Loc>,
    /// Secret name → location of its `[secrets.NAME]` key, in declaration order.
    secrets: BTreeMap<String, Loc>,
    /// Credential name → location of its `[credentials.NAME]` key.
    credentials: BTreeMap<String, Loc>,
    /// Identity name → the location of each `sources` entry (by index).
    identity_sources: HashMap<String, Vec<Loc>>,
    /// Identity name → the location of its name.
    identities: HashMap<String, Loc>,
    /// Notifier name → the location of its `[notify.NAME]` key.
    notifiers: BTreeMap<String, Loc>,
    /// Where `[ask]` is.
    ask: Option<Loc>,
    /// Limit name → the location of its `[limits.NAME]` key.
    limits: BTreeMap<String, Loc>,
    /// Lowercased model → the location of its `[prices."MODEL"]` key.
    prices: BTreeMap<String, Loc>,
}

#[derive(Clone)]
struct Loc {
    file: PathBuf,
    line: usize,
    col: usize,
}

impl Loc {
    fn at(file: &Path, text: &str, span: Range<usize>) -> Loc {
        let (line, col) = line_col(text, span.start);
        Loc {
            file: file.to_path_buf(),
            line,
            col,
        }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

fn spans(sources: &[(&Path, &str)]) -> Spans {
    let mut out = Spans::default();
    for (file, text) in sources {
        // The policy compiled, so every file parses; a file that does not is simply skipped.
        let Some(raw) = schema::read_lenient(text) else {
            continue;
        };
        // Denials share the rules' names (unique across both).
        for rule in raw.rules.iter().chain(&raw.deny) {
            let rule = &rule.raw;
            let Some(name) = &rule.name else {
                continue;
            };
            let name_span = name.span();
            let name = name.get_ref().trim().to_string();
            if let Some(flag) = &rule.dangerously_inject_into_wildcard {
                out.wildcard_flags
                    .insert(name.clone(), Loc::at(file, text, flag.span()));
            }
            if let Some(flag) = &rule.dangerously_allow_cleartext {
                out.cleartext_flags
                    .insert(name.clone(), Loc::at(file, text, flag.span()));
            }
            out.rules.insert(name, Loc::at(file, text, name_span));
        }
        for (name, _) in &raw.secrets {
            out.secrets
                .insert(name.get_ref().clone(), Loc::at(file, text, name.span()));
        }
        for (name, _) in &raw.credentials {
            out.credentials
                .insert(name.get_ref().clone(), Loc::at(file, text, name.span()));
        }
        for (name, _) in &raw.notify {
            out.notifiers
                .insert(name.get_ref().clone(), Loc::at(file, text, name.span()));
        }
        for (name, _) in &raw.limits {
            out.limits
                .entry(name.get_ref().clone())
                .or_insert_with(|| Loc::at(file, text, name.span()));
        }
        for (name, _) in &raw.prices {
            out.prices
                .entry(name.get_ref().trim().to_ascii_lowercase())
                .or_insert_with(|| Loc::at(file, text, name.span()));
        }
        if let (None, Some(ask)) = (&out.ask, &raw.ask) {
            out.ask = Some(Loc::at(file, text, ask.span.clone()));
        }
        for (name, id) in &raw.identities {
            out.identities
                .insert(name.get_ref().clone(), Loc::at(file, text, name.span()));
            let locs = id
                .raw
                .sources
                .iter()
                .flat_map(|list| list.get_ref().iter())
                .map(|s| Loc::at(file, text, s.span()))
                .collect();
            out.identity_sources.insert(name.get_ref().clone(), locs);
        }
    }
    out
}

/// Every warning for a compiled policy, ordered by file, line and column.
///
/// `sources` are the `(path, text)` pairs the policy was compiled from; they give each warning
/// its line and column.
pub fn lint(policy: &Policy, sources: &[(&Path, &str)]) -> Vec<Warning> {
    let spans = spans(sources);
    let fallback = |rule: &Rule| Loc {
        file: rule.origin.file.clone(),
        line: rule.origin.line,
        col: 1,
    };
    let rule_loc = |rule: &Rule| {
        spans
            .rules
            .get(&rule.name)
            .cloned()
            .unwrap_or_else(|| fallback(rule))
    };
    let mut out = Vec::new();
    let mut warn = |loc: Loc, code: &'static str, message: String| {
        out.push(Warning {
            file: loc.file,
            line: loc.line,
            col: loc.col,
            code,
            message,
        })
    };

    brokered(policy, &spans, &rule_loc, &mut warn);
    unused(policy, &spans, &mut warn);
    shadowing(policy, &rule_loc, &mut warn);
    wide_identities(policy, &spans, &mut warn);
    cleartext(policy, &spans, &rule_loc, &mut warn);
    asks(policy, &spans, &rule_loc, &mut warn);
    limits(policy, &spans, &mut warn);
    guards::denials(policy, &rule_loc, &mut warn);
    guards::graphql_methods(policy, &rule_loc, &mut warn);

    out.sort_by(|a, b| (&a.file, a.line, a.col).cmp(&(&b.file, b.line, b.col)));
    out
}

/// Rules that broker a secret or credential: to a wildcard host, or for every method.
fn brokered(
    policy: &Policy,
    spans: &Spans,
    rule_loc: &dyn Fn(&Rule) -> Loc,
    warn: &mut dyn FnMut(Loc, &'static str, String),
) {
    for rule in policy.rules() {
        let Some(secrets) = rule.brokered() else {
            continue;
        };
        let wildcards: Vec<String> = rule
            .hosts
            .iter()
            .filter(|h| matches!(h, HostPattern::Wildcard(_)))
            .map(|h| h.to_string())
            .collect();
        if !wildcards.is_empty() {
            let loc = spans
                .wildcard_flags
                .get(&rule.name)
                .cloned()
                .unwrap_or_else(|| rule_loc(rule));
            warn(
                loc,
                "wildcard_secret",
                format!(
                    "rule {:?} sends {secrets} to every host matching {} (dangerously_inject_into_wildcard = true); name the hosts if you can",
                    rule.name,
                    wildcards.join(", ")
                ),
            );
        }
        if rule.methods.is_none() && !rule.tunnel {
            warn(
                rule_loc(rule),
                "secret_all_methods",
                format!(
                    "rule {:?} binds {secrets} and allows every method; list the methods it needs (methods = [\"GET\", \"POST\"])",
                    rule.name
                ),
            );
        }
    }
}

/// Secrets and credentials declared that no rule uses.
fn unused(policy: &Policy, spans: &Spans, warn: &mut dyn FnMut(Loc, &'static str, String)) {
    for (name, loc) in &spans.secrets {
        if !policy.rules().iter().any(|r| r.bound.contains(name)) {
            warn(
                loc.clone(),
                "unused_secret",
                format!(
                    "secret {name:?} is declared but no rule binds it; remove it, or inject it ({{{{secret.{name}}}}}) or list it in a rule's secrets"
                ),
            );
        }
    }
    for (name, loc) in &spans.credentials {
        if !policy
            .rules()
            .iter()
            .any(|r| r.credential.as_deref() == Some(name.as_str()))
        {
            warn(
                loc.clone(),
                "unused_credential",
                format!(
                    "credential {name:?} is declared but no rule uses it; remove it, or set credential = {name:?} on a rule"
                ),
            );
        }
    }
}

/// Rules (or some of their hosts) an earlier rule always matches first.
fn shadowing(
    policy: &Policy,
    rule_loc: &dyn Fn(&Rule) -> Loc,
    warn: &mut dyn FnMut(Loc, &'static str, String),
) {
    for s in shadowed(policy) {
        let by = rule_loc(s.by);
        let hosts = s
            .hosts
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let message = if s.hosts.len() == s.rule.hosts.len() {
            format!(
                "rule {:?} can never match: rule {:?} ({by}) comes first for {hosts} and allows the same ports, methods and paths; remove it, or narrow or reorder the rules",
                s.rule.name, s.by.name
            )
        } else {
            format!(
                "rule {:?} never matches host(s) {hosts}: rule {:?} ({by}) comes first there and allows the same ports, methods and paths",
                s.rule.name, s.by.name
            )
        };
        warn(rule_loc(s.rule), "shadowed_rule", message);
    }
}

/// Identities that may use every rule without a token, for every client in a wide range.
fn wide_identities(
    policy: &Policy,
    spans: &Spans,
    warn: &mut dyn FnMut(Loc, &'static str, String),
) {
    for id in policy.identities() {
        if id.has_token || id.rules != RuleSet::All {
            continue;
        }
        let locs = spans.identity_sources.get(&id.name);
        for (i, cidr) in id.sources.iter().enumerate() {
            let wide = match cidr.addr() {
                std::net::IpAddr::V4(_) => cidr.prefix() < 16,
                std::net::IpAddr::V6(_) => cidr.prefix() < 48,
            };
            if !wide {
                continue;
            }
            let loc = locs
                .and_then(|l| l.get(i))
                .or_else(|| spans.identities.get(&id.name))
                .cloned()
                .unwrap_or(Loc {
                    file: PathBuf::new(),
                    line: 0,
                    col: 0,
                });
            warn(
                loc,
                "wide_identity",
                format!(
                    "identity {:?} may use every rule, needs no token, and takes every client in {}/{}; add a token or narrow the range",
                    id.name,
                    cidr.addr(),
                    cidr.prefix()
                ),
            );
        }
    }
}

/// `cleartext_credential` and `useless_cleartext`: a rule's `dangerously_allow_cleartext`,
/// at the flag.
fn cleartext(
    policy: &Policy,
    spans: &Spans,
    rule_loc: &dyn Fn(&Rule) -> Loc,
    warn: &mut dyn FnMut(Loc, &'static str, String),
) {
    for rule in policy.rules().iter().filter(|r| r.cleartext) {
        let loc = spans
            .cleartext_flags
            .get(&rule.name)
            .cloned()
            .unwrap_or_else(|| rule_loc(rule));
        match rule.brokered() {
            Some(what) if rule.schemes.allows(Scheme::Http) => warn(
                loc,
                "cleartext_credential",
                format!(
                    "rule {:?} sends {what} upstream over plain http (dangerously_allow_cleartext = true): anyone on the path between latchkey and the upstream reads them; remove the key and use https",
                    rule.name
                ),
            ),
            Some(_) => warn(
                loc,
                "useless_cleartext",
                format!(
                    "rule {:?} sets dangerously_allow_cleartext = true but its schemes leave out http, so it has no effect; remove it",
                    rule.name
                ),
            ),
            None => warn(
                loc,
                "useless_cleartext",
                format!(
                    "rule {:?} sets dangerously_allow_cleartext = true but brokers no credential, so it has no effect; remove it",
                    rule.name
                ),
            ),
        }
    }
}

/// `unheard_ask` and `unused_notifier`: who hears of approvals.
fn asks(
    policy: &Policy,
    spans: &Spans,
    rule_loc: &dyn Fn(&Rule) -> Loc,
    warn: &mut dyn FnMut(Loc, &'static str, String),
) {
    let ask_rules: Vec<&Rule> = policy.rules().iter().filter(|r| r.ask.is_some()).collect();
    let unknown = policy.ask().unknown;
    let notifiers = policy.notifiers();
    if notifiers.is_empty() && (unknown || !ask_rules.is_empty()) {
        let loc = match (unknown, &spans.ask, ask_rules.first()) {
            (true, Some(loc), _) => loc.clone(),
            (_, _, Some(rule)) => rule_loc(rule),
            (_, loc, None) => loc.clone().unwrap_or(Loc {
                file: PathBuf::new(),
                line: 0,
                col: 0,
            }),
        };
        let what = if unknown {
            "[ask] unknown = true turns every request no rule allows into an approval request"
                .to_string()
        } else {
            format!(
                "rule(s) {} ask a person",
                ask_rules
                    .iter()
                    .map(|r| format!("{:?}", r.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        warn(
            loc,
            "unheard_ask",
            format!("{what}, but no [notify.NAME] webhook exists: nobody hears of an approval unless they poll `latchkey approvals list`; add a [notify.NAME] with a url"),
        );
    }
    // Who each ask tells: its own list, or every notifier when it names none.
    let mut told: Vec<&[String]> = ask_rules
        .iter()
        .filter_map(|r| r.ask.as_ref())
        .map(|a| a.notify.as_slice())
        .collect();
    if unknown {
        told.push(&policy.ask().terms.notify);
    }
    for n in notifiers {
        if told.iter().any(|t| t.is_empty() || t.contains(&n.name)) {
            continue;
        }
        let why = if told.is_empty() {
            "no rule has ask and [ask] unknown is off"
        } else {
            "every ask names its own notify list without it"
        };
        let loc = spans.notifiers.get(&n.name).cloned().unwrap_or(Loc {
            file: n.origin.file.clone(),
            line: n.origin.line,
            col: 1,
        });
        warn(
            loc,
            "unused_notifier",
            format!(
                "notifier {:?} is never told of anything: {why}; remove it or name it in a notify list",
                n.name
            ),
        );
    }
}

/// `unused_limit`, `unmetered_tunnel` and `free_model`.
fn limits(policy: &Policy, spans: &Spans, warn: &mut dyn FnMut(Loc, &'static str, String)) {
    let nowhere = || Loc {
        file: PathBuf::new(),
        line: 0,
        col: 0,
    };
    for limit in policy.limits() {
        let name = &limit.name;
        let used = policy.rules().iter().any(|r| r.limits.contains(name))
            || policy.identities().iter().any(|i| i.limits.contains(name))
            || policy
                .credentials()
                .any(|c| policy.credential_limits(&c.name).contains(name));
        if !used {
            let loc = spans.limits.get(name).cloned().unwrap_or_else(|| Loc {
                file: limit.origin.file.clone(),
                line: limit.origin.line,
                col: 1,
            });
            warn(
                loc,
                "unused_limit",
                format!(
                    "limit {name:?} is declared but nothing is charged to it; remove it, or add limits = [{name:?}] to a rule, identity or credential"
                ),
            );
        }
    }
    let tunnels: Vec<&Rule> = policy.rules().iter().filter(|r| r.tunnel).collect();
    for id in policy.identities() {
        let reachable: Vec<String> = tunnels
            .iter()
            .filter(|r| id.rules.allows(&r.name))
            .map(|r| format!("{:?}", r.name))
            .collect();
        if reachable.is_empty() {
            continue;
        }
        for name in &id.limits {
            let Some(limit) = policy.limit(name) else {
                continue;
            };
            let body: Vec<&str> = limit
                .measures()
                .into_iter()
                .filter(|m| m.meters_body())
                .map(|m| m.as_str())
                .collect();
            if body.is_empty() {
                continue;
            }
            let loc = spans
                .identities
                .get(&id.name)
                .cloned()
                .unwrap_or_else(nowhere);
            warn(
                loc,
                "unmetered_tunnel",
                format!(
                    "identity {:?} is charged to limit {name:?} ({}) but may use tunnel rule(s) {}: latchkey cannot see a tunnel's requests, so that limit does not count them; take the tunnel rules from this identity if the limit must hold",
                    id.name,
                    body.join(", "),
                    reachable.join(", ")
                ),
            );
        }
    }
    let prices = policy.prices();
    for model in prices.overridden() {
        let Some((_, price)) = prices.lookup(model) else {
            continue;
        };
        if let Some(why) = never_matches(model) {
            let loc = spans.prices.get(model).cloned().unwrap_or_else(nowhere);
            warn(
                loc,
                "price_matches_nothing",
                format!(
                    "[prices.{model:?}] {why}: a model is priced by its exact name (less a snapshot suffix such as -2024-08-06), never by a pattern or prefix, so this entry prices no model; write each model's full name"
                ),
            );
            continue;
        }
        if price.input == 0.0 && price.output == 0.0 && price.cached_input.unwrap_or(0.0) == 0.0 {
            let loc = spans.prices.get(model).cloned().unwrap_or_else(nowhere);
            warn(
                loc,
                "free_model",
                format!(
                    "model {model:?} is priced at 0: spend budgets count its calls as free; give its real prices if a spend limit covers it"
                ),
            );
        }
    }
}

/// Why a `[prices."MODEL"]` name can match no model's name, if it cannot.
fn never_matches(model: &str) -> Option<&'static str> {
    if model.contains(['*', '?', '[', ']']) {
        Some("is written as a pattern")
    } else if model.ends_with(['-', '@', '/', '.']) {
        Some("is written as a prefix")
    } else if model.trim() != model || model.is_empty() {
        Some("has leading or trailing spaces (model names are trimmed before lookup)")
    } else {
        None
    }
}

/// A rule that never decides for some of its hosts.
struct Shadow<'p> {
    rule: &'p Rule,
    /// The first rule found to come before it (for the first shadowed host).
    by: &'p Rule,
    hosts: Vec<&'p HostPattern>,
}

/// Rules that a rule earlier in the decision order makes unreachable, host pattern by host
/// pattern. Only exact coverage counts (same host entry; ports, methods and paths each a
/// superset; every identity that may use the later rule may use the earlier one), so every
/// report is certain, never a guess.
fn shadowed(policy: &Policy) -> Vec<Shadow<'_>> {
    let rules = policy.rules();
    // The decision order within one host entry (see `compile::index`): rules with paths first,
    // then rules with methods, then file order.
    let mut entries: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, rule) in rules.iter().enumerate() {
        for host in &rule.hosts {
            let list = entries.entry(host.to_string()).or_default();
            if !list.contains(&i) {
                list.push(i);
            }
        }
    }
    let mut found: BTreeMap<usize, (usize, Vec<&HostPattern>)> = BTreeMap::new();
    for (key, list) in entries.iter_mut() {
        list.sort_by_key(|&i| (rules[i].paths.is_none(), rules[i].methods.is_none()));
        for (j, &later) in list.iter().enumerate() {
            let Some(&earlier) = list[..j]
                .iter()
                .find(|&&e| covers(policy, &rules[e], &rules[later]))
            else {
                continue;
            };
            let slot = found.entry(later).or_insert((earlier, Vec::new()));
            if let Some(p) = rules[later].hosts.iter().find(|h| h.to_string() == *key) {
                slot.1.push(p);
            }
        }
    }
    found
        .into_iter()
        .map(|(i, (by, hosts))| Shadow {
            rule: &rules[i],
            by: &rules[by],
            hosts,
        })
        .collect()
}

/// Whether every request `later` could match on a shared host is matched by `earlier` first.
fn covers(policy: &Policy, earlier: &Rule, later: &Rule) -> bool {
    if earlier.tunnel != later.tunnel {
        return false;
    }
    // An identity that may use `later` but not `earlier` still reaches `later`.
    if policy
        .identities()
        .iter()
        .any(|id| id.rules.allows(&later.name) && !id.rules.allows(&earlier.name))
    {
        return false;
    }
    // Every scheme `later` covers, `earlier` covers too, on every port.
    let ports = later.schemes.iter().all(|s| {
        let wide = earlier.ports_for(s);
        earlier.schemes.allows(s) && later.ports_for(s).iter().all(|p| wide.contains(p))
    });
    let methods = match (&earlier.methods, &later.methods) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(wide), Some(narrow)) => narrow.iter().all(|m| wide.contains(m)),
    };
    let paths = match (&earlier.paths, &later.paths) {
        (None, _) => true,
        (Some(wide), _) if wide.globs.iter().any(|g| g == "/**") => true,
        (Some(_), None) => false,
        (Some(wide), Some(narrow)) => narrow.globs.iter().all(|g| wide.globs.contains(g)),
    };
    ports && methods && paths
}

#[cfg(test)]
#[path = "lint_tests.rs"]
mod tests;

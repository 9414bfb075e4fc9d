//! Reach: everything one identity could reach under a policy, as a canonical listing and its
//! digest (`reach` in every audit record; `latchkey explain --reach IDENTITY` prints both).
//!
//! The listing has one line per fact, sorted: for each rule the identity may use, its hosts,
//! the scheme and port pairs it allows (by its `schemes`), its methods and path globs (or
//! `any`) or `tunnel`, then what it grants beyond matching as [`super::facts::GRANTS`] lists
//! it (`report-only`, each `allow_private` range, `websocket`, `dangerously_allow_cleartext`,
//! each secret it binds with each host it is bound to, where placeholders are replaced, the
//! auth headers it keeps, its credential, `mcp`, captured tokens, and whether it asks a person
//! with the scopes an approver may grant); plus one line when `[ask] unknown` lets the identity
//! ask for anything no rule
//! allows. The identity's name is not in it: two
//! identities with the same rules have the same reach, and another identity's rules never
//! change it. The digest is `sha256:` and the hex SHA-256 of the lines, each ended by `\n`.
//!
//! Computed once per policy compile, per identity ([`Ceiling`]); a request only copies it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;

use super::ask::AskPolicy;
use super::identity::{Identity, RuleSet, DEFAULT_IDENTITY};
use super::{Policy, Rule};
use crate::signing::Credential;

/// What every audit record of one identity carries about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ceiling {
    /// `[identities.X] labels` (for `default`: `[identities.default] labels`).
    pub labels: BTreeMap<String, String>,
    /// `sha256:…` of [`listing`].
    pub reach: String,
}

/// What `latchkey explain --reach` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reach {
    pub identity: String,
    /// `sha256:…` of `items`: the `reach` of this identity's audit records.
    pub reach: String,
    /// The listing, sorted, one fact per item.
    pub items: Vec<String>,
}

/// A request or identity the review tools (`reach`, `explain`, `test`) cannot evaluate.
/// Messages name the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExplainError {
    #[error("unknown identity {name:?}: the policy defines no identities, so every request is \"default\"")]
    NoIdentities { name: String },
    #[error(
        "unknown identity {name:?}{}; the policy defines: {}",
        super::did_you_mean(name, known.iter().map(String::as_str)),
        .known.join(", ")
    )]
    UnknownIdentity { name: String, known: Vec<String> },
    #[error("invalid method {0:?}")]
    InvalidMethod(String),
    #[error("invalid URL {url:?}: {why}")]
    InvalidUrl { url: String, why: String },
}

/// The reach of `identity` under `policy`: `default` when the policy defines no identities,
/// else one of its identities. An unknown name is an error naming the ones there are.
pub fn reach(policy: &Policy, identity: &str) -> Result<Reach, ExplainError> {
    let rules = if policy.identities().is_empty() {
        if identity != DEFAULT_IDENTITY {
            return Err(ExplainError::NoIdentities {
                name: identity.to_string(),
            });
        }
        &RuleSet::All
    } else {
        let found = policy
            .identity(identity)
            .ok_or_else(|| ExplainError::UnknownIdentity {
                name: identity.to_string(),
                known: policy.identities().iter().map(|i| i.name.clone()).collect(),
            })?;
        &found.rules
    };
    let items = listing(policy.rules(), rules, policy.ask(), &policy.credentials);
    Ok(Reach {
        identity: identity.to_string(),
        reach: digest(&items),
        items,
    })
}

/// The reach of a runtime session: its profile's rules that stay within its narrowing, plus a
/// line per narrowed host, secret and limit. A session that narrows nothing reaches exactly
/// what its profile does (the same digest).
pub fn session_reach(
    policy: &Policy,
    profile: &Identity,
    narrowing: &super::profile::Narrowing,
) -> Reach {
    let mut items = if narrowing.is_empty() {
        listing(
            policy.rules(),
            &profile.rules,
            policy.ask(),
            &policy.credentials,
        )
    } else {
        let rules: Vec<&Rule> = policy
            .rules()
            .iter()
            .filter(|r| profile.rules.allows(&r.name) && narrowing.admits_rule(r))
            .collect();
        let mut items = Vec::new();
        for rule in rules {
            rule_items(rule, &policy.credentials, &mut items);
        }
        if policy.ask().unknown {
            items.push(format!(
                "[ask] unknown: any request no rule allows, once a person approves ({})",
                super::facts::ask_terms(&policy.ask().terms)
            ));
        }
        items.extend(narrowing.reach_items());
        items.sort();
        items.dedup();
        items
    };
    items.dedup();
    Reach {
        identity: profile.name.clone(),
        reach: digest(&items),
        items,
    }
}

/// Every identity's [`Ceiling`] by name (`default` alone when there are no identities).
pub(super) fn ceilings(
    rules: &[Rule],
    identities: &[Identity],
    default_labels: BTreeMap<String, String>,
    ask: &AskPolicy,
    credentials: &HashMap<String, Arc<Credential>>,
) -> HashMap<String, Ceiling> {
    let ceiling = |set: &RuleSet, labels: BTreeMap<String, String>| Ceiling {
        labels,
        reach: digest(&listing(rules, set, ask, credentials)),
    };
    if identities.is_empty() {
        return HashMap::from([(
            DEFAULT_IDENTITY.to_string(),
            ceiling(&RuleSet::All, default_labels),
        )]);
    }
    identities
        .iter()
        .map(|i| (i.name.clone(), ceiling(&i.rules, i.labels.clone())))
        .collect()
}

/// The sorted listing of what rules in `set` reach (see the module docs).
pub(super) fn listing(
    rules: &[Rule],
    set: &RuleSet,
    ask: &AskPolicy,
    credentials: &HashMap<String, Arc<Credential>>,
) -> Vec<String> {
    let mut items = Vec::new();
    for rule in rules.iter().filter(|r| set.allows(&r.name)) {
        rule_items(rule, credentials, &mut items);
    }
    if ask.unknown {
        items.push(format!(
            "[ask] unknown: any request no rule allows, once a person approves ({})",
            super::facts::ask_terms(&ask.terms)
        ));
    }
    items.sort();
    items.dedup();
    items
}

/// `sha256:` and the hex SHA-256 of `items`, each ended by a newline.
pub(super) fn digest(items: &[String]) -> String {
    let mut hasher = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    for item in items {
        hasher.update(item.as_bytes());
        hasher.update(b"\n");
    }
    format!("sha256:{}", hex::encode(hasher.finish()))
}

fn rule_items(rule: &Rule, credentials: &HashMap<String, Arc<Credential>>, out: &mut Vec<String>) {
    let name = &rule.name;
    let mut item = |what: String| out.push(format!("rule {name}: {what}"));
    for host in &rule.hosts {
        item(format!("host {host}"));
    }
    // A tunnel relays CONNECT bytes only (https ports); methods and paths never apply to it.
    // Any other rule covers its `schemes` (https only for one that brokers a credential).
    let schemes = if rule.tunnel {
        super::Schemes::HTTPS
    } else {
        rule.schemes
    };
    for scheme in schemes.iter() {
        for port in rule.ports_for(scheme) {
            item(format!("port {}:{port}", scheme.as_str()));
        }
    }
    if rule.tunnel {
        item("tunnel: raw CONNECT relay, not inspected".to_string());
    } else {
        match &rule.methods {
            None => item("method any".to_string()),
            Some(methods) => {
                for m in methods {
                    item(format!("method {m}"));
                }
            }
        }
        match &rule.paths {
            None => item("path any".to_string()),
            Some(paths) => {
                for glob in &paths.globs {
                    item(format!("path {glob}"));
                }
            }
        }
    }
    // What it grants beyond matching: one table describes it, for reach and diff alike.
    for fact in super::facts::of(rule, credentials) {
        for line in fact.reach {
            item(line);
        }
    }
}

#[cfg(test)]
#[path = "reach_tests.rs"]
mod tests;

/// A rule's `mcp` table in one line, for reach and diff.
pub fn mcp_summary(m: &super::mcp::McpRules) -> String {
    let list =
        |g: Option<&super::mcp::NameGlobs>| g.map_or("*".to_string(), |g| g.globs.join(", "));
    let mut out = format!(
        "methods {}; tools {}",
        m.methods.globs.join(", "),
        list(m.tools.as_ref())
    );
    if let Some(d) = &m.deny_tools {
        out.push_str(&format!("; deny_tools {}", d.globs.join(", ")));
    }
    for (name, g) in &m.args {
        out.push_str(&format!("; args.{name} {}", g.globs.join(", ")));
    }
    out
}

//! Facts: what a rule attaches to a host pattern (a secret, a credential, `mode`, …: the
//! policy's [`crate::policy::facts::GRANTS`]), compared as sets per identity.

use super::*;

/// A fact about one host pattern: what it is, and the rule that makes it so.
pub(super) struct Fact {
    pub(super) kind: Kind,
    pub(super) host: Option<String>,
    /// The secret, credential, CIDR, place or header.
    pub(super) detail: String,
    pub(super) rule: Option<String>,
    pub(super) origin: Option<String>,
    pub(super) credential_kind: Option<String>,
}

pub(super) fn facts(v: &View<'_>) -> BTreeMap<(Kind, Option<String>, String), Fact> {
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
    // What each rule grants beyond matching (the policy's table), on each of its hosts.
    for rule in &v.rules {
        let granted = v.policy.facts(rule);
        for host in &rule.hosts {
            for f in &granted {
                add(
                    rule,
                    f.kind,
                    host,
                    f.detail.clone(),
                    f.credential_kind.clone(),
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

pub(super) fn facts_changes(o: &View<'_>, n: &View<'_>) -> Vec<Change> {
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
        // Gaining `ask` or `mcp` narrows; every other fact widens when gained.
        let added = (c.direction == Direction::Widened) == c.kind.widens_when_gained();
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
pub(super) fn fact_detail(c: &Change) -> String {
    c.secret
        .clone()
        .or_else(|| c.credential.clone())
        .or_else(|| c.cidr.clone())
        .or_else(|| c.place.clone())
        .or_else(|| c.header.clone())
        .unwrap_or_default()
}

pub(super) fn fact_change(f: &Fact, added: bool) -> Change {
    // How gaining a fact reads is the policy's table's (`[ask] unknown`, no rule's fact,
    // widens when gained: anything may now be asked for).
    let direction = if f.kind.widens_when_gained() == added {
        Direction::Widened
    } else {
        Direction::Narrowed
    };
    let summary = match crate::policy::facts::grant(f.kind) {
        Some(g) => (g.change)(&crate::policy::facts::Changed {
            host: f.host.as_deref().unwrap_or_default(),
            detail: &f.detail,
            credential_kind: f.credential_kind.as_deref(),
            added,
        }),
        None if f.kind == Kind::AskUnknown && added => {
            "[ask] unknown: any request no rule allows may now be asked for".to_string()
        }
        None if f.kind == Kind::AskUnknown => {
            "[ask] unknown: requests no rule allows are no longer asked for".to_string()
        }
        None => f.detail.clone(),
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

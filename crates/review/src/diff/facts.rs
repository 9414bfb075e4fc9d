//! Facts: what a rule attaches to a host pattern (a secret, a credential, `tunnel`, `mode`, …),
//! compared as sets per identity.

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

//! Guards: `[[deny]]` tables and rule predicates (`query`, `headers`, `body`, `graphql`),
//! compared structurally per identity.
//!
//! A denial added narrows reach and a denial removed widens it; a rule gaining a requirement
//! narrows and losing one widens. A change in between is read as sets of *limits* (each one
//! more makes fewer requests match: `query requires q`, a header test, a body field) and
//! *lists* (`None` is everything, each name one more makes more match: `only`, `operations`,
//! `persisted`, and a denial's `hosts`, `ports`, `methods`, `paths`). Whatever this cannot judge
//! (a changed pattern, a denial's `graphql`) reads both ways, so a possible widening is always
//! reported: `diff` exits 3 on one and a reviewer looks. Globs are compared as text: a glob
//! replaced by a wider one is a change both ways, never silently a narrowing.

use super::*;
use crate::policy::predicates::{HeaderTest, Predicates};

/// What a rule or denial constrains, in comparable parts.
#[derive(Default)]
struct Atoms {
    /// Each one more: fewer requests match.
    limits: BTreeSet<String>,
    /// (label, names): `None` is everything; each name one more: more requests match.
    lists: Vec<(&'static str, Option<BTreeSet<String>>)>,
    /// `graphql.max_depth` on a rule: lower matches fewer.
    depth: Option<usize>,
    /// Parts compared for equality only (a change reads both ways).
    opaque: BTreeSet<String>,
}

/// One comparison: phrases for what now matches fewer requests, and what matches more.
#[derive(Default)]
struct Judged {
    fewer: Vec<String>,
    more: Vec<String>,
}

fn names<T: ToString>(items: &[T]) -> BTreeSet<String> {
    items.iter().map(ToString::to_string).collect()
}

fn atoms(p: Option<&Predicates>, denial: bool) -> Atoms {
    let mut a = Atoms::default();
    let Some(p) = p else {
        a.lists = vec![("query parameters", None), ("GraphQL operations", None)];
        a.lists.push(("persisted queries", None));
        return a;
    };
    let q = p.query.as_ref();
    for r in q.iter().flat_map(|q| &q.required) {
        a.limits.insert(format!("query requires {r}"));
    }
    for f in q.iter().flat_map(|q| &q.forbidden) {
        a.limits.insert(format!("query forbids {f}"));
    }
    for (name, pattern) in q.iter().flat_map(|q| &q.values) {
        a.limits
            .insert(format!("query {name} matches {}", pattern.text()));
    }
    for h in &p.headers {
        a.limits.insert(match &h.test {
            HeaderTest::Present => format!("header {} present", h.name),
            HeaderTest::Absent => format!("header {} absent", h.name),
            HeaderTest::Matches(m) => format!("header {} matches {}", h.name, m.text()),
        });
    }
    for b in &p.body {
        a.limits.insert(format!(
            "body field {} matches {}",
            b.pointer,
            b.pattern.text()
        ));
    }
    let only = q.and_then(|q| q.only.as_deref()).map(names);
    a.lists.push(("query parameters", only));
    let g = p.graphql.as_ref();
    if denial {
        // A denial's `deny_fields` and `max_depth` select requests that break them: neither
        // more nor fewer names reads one way. Compared as a whole.
        a.opaque.extend(g.map(|g| g.describe().join("; ")));
        a.lists.push(("GraphQL operations", None));
        a.lists.push(("persisted queries", None));
        return a;
    }
    let ops = g.and_then(|g| g.operations.as_ref()).map(|o| {
        o.iter()
            .map(|k| k.as_str().to_string())
            .collect::<BTreeSet<_>>()
    });
    a.lists.push(("GraphQL operations", ops));
    let persisted = g.and_then(|g| g.persisted.as_deref()).map(names);
    a.lists.push(("persisted queries", persisted));
    for f in g.iter().flat_map(|g| &g.deny_fields) {
        a.limits.insert(format!("GraphQL field {f} refused"));
    }
    a.depth = g.and_then(|g| g.max_depth);
    a
}

/// A denial's matchers and selectors.
fn denial_atoms(d: &Rule) -> Atoms {
    let mut a = atoms(d.predicates.as_deref(), true);
    a.lists.push(("hosts", Some(names(&d.hosts))));
    a.lists.push(("ports", d.ports.as_deref().map(names)));
    a.lists.push(("methods", d.methods.as_deref().map(names)));
    a.lists
        .push(("paths", d.paths.as_ref().map(|p| names(&p.globs))));
    a
}

fn judge(old: &Atoms, new: &Atoms) -> Judged {
    let mut j = Judged::default();
    j.fewer.extend(
        new.limits
            .difference(&old.limits)
            .map(|l| format!("now {l}")),
    );
    j.more.extend(
        old.limits
            .difference(&new.limits)
            .map(|l| format!("no longer {l}")),
    );
    for ((label, o), (_, n)) in old.lists.iter().zip(&new.lists) {
        let join = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(", ");
        match (o, n) {
            (None, Some(n)) => j.fewer.push(format!("{label} limited to {}", join(n))),
            (Some(o), None) => j
                .more
                .push(format!("{label} no longer limited (was {})", join(o))),
            (Some(o), Some(n)) => {
                let gone: BTreeSet<String> = o.difference(n).cloned().collect();
                let added: BTreeSet<String> = n.difference(o).cloned().collect();
                if !gone.is_empty() {
                    j.fewer
                        .push(format!("{label} no longer include {}", join(&gone)));
                }
                if !added.is_empty() {
                    j.more.push(format!("{label} now include {}", join(&added)));
                }
            }
            (None, None) => {}
        }
    }
    match (old.depth, new.depth) {
        (None, Some(n)) => j.fewer.push(format!("GraphQL depth limited to {n}")),
        (Some(o), None) => j
            .more
            .push(format!("GraphQL depth no longer limited (was {o})")),
        (Some(o), Some(n)) if n < o => j.fewer.push(format!("GraphQL max_depth {o} → {n}")),
        (Some(o), Some(n)) if n > o => j.more.push(format!("GraphQL max_depth {o} → {n}")),
        _ => {}
    }
    if old.opaque != new.opaque {
        let why = "GraphQL selector changed (cannot tell which way)".to_string();
        j.fewer.push(why.clone());
        j.more.push(why);
    }
    j
}

fn hosts_of(r: &Rule) -> String {
    r.hosts
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a denial refuses, in words: `DELETE /repos/*/* on api.github.com when …`.
fn refuses(d: &Rule) -> String {
    let methods = d
        .methods
        .as_ref()
        .map_or("every method".to_string(), |m| join_names(m));
    let paths = d
        .paths
        .as_ref()
        .map_or("every path".to_string(), |p| p.globs.join(", "));
    let ports = d
        .ports
        .as_ref()
        .map_or(String::new(), |p| format!(" (ports {})", join_names(p)));
    let when = d.predicates.as_ref().map_or(String::new(), |p| {
        format!(" when {}", p.describe().join("; "))
    });
    format!("{methods} {paths} on {}{ports}{when}", hosts_of(d))
}

fn join_names<T: ToString>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Denial and predicate changes for one identity (none when it is undefined on a side: its
/// reach appears or vanishes whole, which the request diff reports).
pub(super) fn guard_changes(o: &View<'_>, n: &View<'_>) -> Vec<Change> {
    if o.identity.is_none() || n.identity.is_none() {
        return Vec::new();
    }
    let mut out = Vec::new();
    denial_changes(o, n, &mut out);
    predicate_changes(o, n, &mut out);
    out
}

/// Whether denial `d` can change anything this identity reaches: some rule of either side
/// names a host it names, or `[ask] unknown` puts what no rule allows to a person.
fn relevant(o: &View<'_>, n: &View<'_>, d: &Rule) -> bool {
    o.asks_unknown()
        || n.asks_unknown()
        || o.rules.iter().chain(&n.rules).any(|r| {
            r.hosts
                .iter()
                .any(|h| d.hosts.iter().any(|x| x.overlaps(h)))
        })
}

fn denial_changes(o: &View<'_>, n: &View<'_>, out: &mut Vec<Change>) {
    let old: BTreeMap<&str, &Rule> = o
        .policy
        .denials()
        .iter()
        .map(|d| (d.name.as_str(), d))
        .collect();
    let new: BTreeMap<&str, &Rule> = n
        .policy
        .denials()
        .iter()
        .map(|d| (d.name.as_str(), d))
        .collect();
    for (name, d) in &new {
        if !relevant(o, n, d) {
            continue;
        }
        let Some(was) = old.get(name) else {
            let summary = format!("denial '{name}' added: refuses {}", refuses(d));
            let mut c = guard(Direction::Narrowed, Kind::Deny, d, summary);
            c.example = denial_example(o, n, d, Direction::Narrowed);
            out.push(c);
            continue;
        };
        let j = judge(&denial_atoms(was), &denial_atoms(d));
        // Selecting more requests narrows reach; selecting fewer widens it.
        let (w, nr) = (&j.fewer, &j.more);
        let unsure = !w.is_empty() && !nr.is_empty();
        if !w.is_empty() {
            let how = if unsure {
                "may refuse less"
            } else {
                "refuses less"
            };
            let all: Vec<String> = w.iter().chain(nr.iter()).cloned().collect();
            let list = if unsure { &all } else { w };
            let summary = format!("denial '{name}' {how}: {}", list.join("; "));
            out.push(guard(Direction::Widened, Kind::Deny, d, summary));
        }
        if !nr.is_empty() {
            let how = if unsure {
                "may refuse more"
            } else {
                "refuses more"
            };
            let all: Vec<String> = nr.iter().chain(w.iter()).cloned().collect();
            let list = if unsure { &all } else { nr };
            let summary = format!("denial '{name}' {how}: {}", list.join("; "));
            out.push(guard(Direction::Narrowed, Kind::Deny, d, summary));
        }
    }
    for (name, d) in &old {
        if new.contains_key(name) || !relevant(o, n, d) {
            continue;
        }
        let summary = format!("denial '{name}' removed: no longer refuses {}", refuses(d));
        let mut c = guard(Direction::Widened, Kind::Deny, d, summary);
        c.example = denial_example(o, n, d, Direction::Widened);
        out.push(c);
    }
}

fn predicate_changes(o: &View<'_>, n: &View<'_>, out: &mut Vec<Change>) {
    for r in &n.rules {
        let Some(was) = o.rules.iter().find(|x| x.name == r.name) else {
            continue;
        };
        let j = judge(
            &atoms(was.predicates.as_deref(), false),
            &atoms(r.predicates.as_deref(), false),
        );
        // A rule matching fewer requests narrows reach.
        let (nr, w) = (&j.fewer, &j.more);
        let unsure = !w.is_empty() && !nr.is_empty();
        let name = &r.name;
        let hosts = hosts_of(r);
        if !w.is_empty() {
            let how = if unsure {
                "changed (may widen)"
            } else {
                "loosened"
            };
            let all: Vec<String> = w.iter().chain(nr.iter()).cloned().collect();
            let list = if unsure { &all } else { w };
            let summary = format!(
                "rule '{name}' on {hosts}: predicates {how}: {}",
                list.join("; ")
            );
            out.push(guard(Direction::Widened, Kind::Predicate, r, summary));
        }
        if !nr.is_empty() {
            let how = if unsure {
                "changed (may narrow)"
            } else {
                "tightened"
            };
            let all: Vec<String> = nr.iter().chain(w.iter()).cloned().collect();
            let list = if unsure { &all } else { nr };
            let summary = format!(
                "rule '{name}' on {hosts}: predicates {how}: {}",
                list.join("; ")
            );
            out.push(guard(Direction::Narrowed, Kind::Predicate, r, summary));
        }
    }
    // A rule with predicates gone while the identity still reaches its hosts by another rule
    // (a rename, a merge): what it required may no longer be required.
    for r in &o.rules {
        let Some(p) = r.predicates.as_deref().filter(|p| !p.is_empty()) else {
            continue;
        };
        if n.rules.iter().any(|x| x.name == r.name) {
            continue;
        }
        let still = n.rules.iter().any(|x| {
            !x.tunnel
                && x.hosts
                    .iter()
                    .any(|h| r.hosts.iter().any(|y| y.overlaps(h)))
        });
        if still {
            let summary = format!(
                "rule '{}' on {} removed with its predicates ({}), and another rule reaches its hosts",
                r.name,
                hosts_of(r),
                p.describe().join("; ")
            );
            out.push(guard(Direction::Widened, Kind::Predicate, r, summary));
        }
    }
}

fn guard(direction: Direction, kind: Kind, r: &Rule, summary: String) -> Change {
    let host = r.hosts.first().map(ToString::to_string);
    let mut c = Change::new(direction, kind, host, summary);
    set_rule(&mut c, Some(r));
    c
}

/// A request denial `d` selects, decided on both sides, when the two differ the way
/// `direction` says (no example otherwise: one needing headers or a body, say).
fn denial_example(o: &View<'_>, n: &View<'_>, d: &Rule, direction: Direction) -> Option<Example> {
    let host = d.hosts.iter().find_map(|h| match h {
        HostPattern::Exact(h) => Some(h.clone()),
        HostPattern::Wildcard(_) => None,
    });
    let host = host.or_else(|| match d.hosts.first()? {
        HostPattern::Wildcard(s) => Some(format!("x.{s}")),
        HostPattern::Exact(h) => Some(h.clone()),
    })?;
    let method = d
        .methods
        .as_ref()
        .and_then(|m| m.first())
        .map_or("GET".to_string(), ToString::to_string);
    let path = d
        .paths
        .as_ref()
        .and_then(|p| p.globs.first())
        .and_then(|g| instantiate(g).into_iter().next())
        .unwrap_or_else(|| "/".to_string());
    let port = d
        .ports
        .as_ref()
        .and_then(|p| p.first())
        .copied()
        .unwrap_or(443);
    let url = display_url(Scheme::Https, &host, port, &path);
    let (old, new) = (o.decide(&method, &url)?, n.decide(&method, &url)?);
    let shows = match direction {
        Direction::Widened => new.level() > old.level(),
        Direction::Narrowed => old.level() > new.level(),
    };
    shows.then_some(Example {
        method,
        url,
        old,
        new,
    })
}

#[cfg(test)]
#[path = "guards_tests.rs"]
mod tests;

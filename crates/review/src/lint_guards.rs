//! Lint of `[[deny]]` tables and predicates: a denial no rule could ever reach, and a `graphql`
//! predicate under methods GraphQL is never sent with. (A predicate on a tunnel rule, and a
//! tunnel under a denial that reads requests, are load errors, not warnings.)

use super::Loc;
use crate::policy::{Policy, Rule};

/// A denial whose hosts no rule names: nothing reaches them, so it refuses nothing (unless
/// `[ask] unknown` puts requests there to a person) — likely a typo in a host.
pub(super) fn denials(
    policy: &Policy,
    rule_loc: &dyn Fn(&Rule) -> Loc,
    warn: &mut dyn FnMut(Loc, &'static str, String),
) {
    if policy.ask().unknown {
        return;
    }
    for d in policy.denials() {
        let reached = policy.rules().iter().any(|r| {
            r.hosts
                .iter()
                .any(|h| d.hosts.iter().any(|x| x.overlaps(h)))
        });
        if !reached {
            let hosts: Vec<String> = d.hosts.iter().map(ToString::to_string).collect();
            warn(
                rule_loc(d),
                "unreachable_denial",
                format!(
                    "denial {:?} names hosts no rule reaches ({}), so it never refuses anything; check the hosts for a typo",
                    d.name,
                    hosts.join(", ")
                ),
            );
        }
    }
}

/// A `graphql` predicate under methods that leave out POST and GET.
pub(super) fn graphql_methods(
    policy: &Policy,
    rule_loc: &dyn Fn(&Rule) -> Loc,
    warn: &mut dyn FnMut(Loc, &'static str, String),
) {
    let rules = policy.rules().iter().map(|r| (r, false));
    for (r, denial) in rules.chain(policy.denials().iter().map(|d| (d, true))) {
        let graphql = r.predicates.as_ref().is_some_and(|p| p.graphql.is_some());
        let Some(methods) = r.methods.as_ref().filter(|_| graphql) else {
            continue;
        };
        if methods
            .iter()
            .any(|m| *m == http::Method::POST || *m == http::Method::GET)
        {
            continue;
        }
        let what = if denial {
            format!("denial {:?} refuses every request it matches (a request it cannot read as GraphQL selects)", r.name)
        } else {
            format!(
                "rule {:?} allows nothing (a request it cannot read as GraphQL fails)",
                r.name
            )
        };
        warn(
            rule_loc(r),
            "graphql_without_post_or_get",
            format!("{what}: its graphql predicate is under methods without POST or GET, the methods GraphQL is sent with; add POST"),
        );
    }
}

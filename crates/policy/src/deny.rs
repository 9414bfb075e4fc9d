//! `[[deny]]`: requests no rule may allow. A denial takes a rule's matchers (`hosts`, `ports`,
//! `methods`, `paths`) and predicates (`query`, `headers`, `body`, `graphql`) and nothing that
//! brokers, tunnels or asks; it compiles into a [`Rule`] kept apart from the rules
//! ([`Policy::denials`]) and indexed by host the same way.
//!
//! Semantics (decide.rs applies them): every denial is checked before any rule allows, for
//! every identity and session (a denial is not scoped by identity); the first denial whose
//! matchers and predicates all hold refuses the request (`denied_by_rule`). A denial without
//! `ports` applies on every port, one without `methods` or `paths` to every method or path. A
//! denial with only `hosts`/`ports` refuses the CONNECT itself; a tunnel rule over a host a
//! denial with request-level matchers names cannot enforce it, and is a load error.

use std::collections::HashMap;

use super::compile::{line_col, FileCx, Parsed, PolicyError};
use super::rule::At;
use super::schema::{Entry, RawRule};
use super::{HostPattern, Origin, Policy, Rule};

impl FileCx<'_> {
    /// Validates one `[[deny]]` entry; `None` if it (or its reading) had any problem.
    pub(super) fn denial(
        &mut self,
        index: usize,
        entry: Entry<RawRule>,
        origin: Origin,
    ) -> Option<Rule> {
        let before = self.errors.len();
        let at = At("deny", index);
        let (span, raw) = (entry.span, entry.raw);
        let name = self.rule_name(at, raw.name.as_ref());
        let hosts = self.rule_hosts(at, raw.hosts, span);
        let ports = raw.ports.map(|p| self.rule_ports(at, p));
        let methods = raw.methods.map(|m| self.rule_methods(at, m));
        let paths = raw.paths.and_then(|p| self.rule_paths(at, p));
        let predicates = self.predicates(&at.to_string(), raw.predicates);
        if self.errors.len() > before || !entry.complete {
            return None;
        }
        Some(Rule {
            name: name?,
            description: raw.description,
            hosts: hosts.list,
            ports,
            methods,
            paths,
            predicates,
            report: false,
            origin,
            ..Rule::report_only()
        })
    }
}

/// Phase 3 (after the rules): `[[deny]]` entries. Names are unique across rules and denials
/// (`names` holds every rule name read, and gets the denials').
pub(super) fn compile_denials(
    parsed: &mut Parsed<'_>,
    errors: &mut Vec<PolicyError>,
    names: &mut HashMap<String, Origin>,
) -> Vec<Rule> {
    let mut out = Vec::new();
    for (file, text, raw) in parsed.iter_mut() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        for (index, entry) in std::mem::take(&mut raw.deny).into_iter().enumerate() {
            let origin = Origin {
                file: file.to_path_buf(),
                line: line_col(text, entry.span.start).0,
            };
            let field = format!("deny[{index}].name");
            let note = " (rules and denials share names)";
            let unique = entry
                .raw
                .name
                .as_ref()
                .is_none_or(|name| cx.claim_name(names, name, &origin, (&field, "name", note)));
            if let Some(d) = cx.denial(index, entry, origin) {
                if unique {
                    out.push(d);
                }
            }
        }
    }
    out
}

/// A tunnel rule relays bytes latchkey never sees, so it cannot enforce a denial that looks at
/// requests (methods, paths, predicates) on a host and port it shares: an error at the tunnel
/// rule naming the denial. (A denial of only hosts/ports refuses the CONNECT itself.)
pub(super) fn check_tunnels(rules: &[Rule], denials: &[Rule], errors: &mut Vec<PolicyError>) {
    for rule in rules.iter().filter(|r| r.tunnel) {
        let tunnel_ports = rule.ports_for(super::Scheme::Https);
        for d in denials.iter().filter(|d| !connect_level(d)) {
            let hosts = rule
                .hosts
                .iter()
                .any(|t| d.hosts.iter().any(|h| overlap(t, h)));
            let ports = tunnel_ports.iter().any(|p| deny_port(d, *p));
            if hosts && ports {
                errors.push(PolicyError {
                    file: rule.origin.file.clone(),
                    line: rule.origin.line,
                    col: 1,
                    message: format!(
                        "rule '{}': a tunnel rule relays bytes latchkey cannot see, so it cannot enforce denial '{}' (defined at {}), which looks at requests on the same host; remove tunnel = true so latchkey intercepts, or narrow the hosts",
                        rule.name, d.name, d.origin
                    ),
                });
            }
        }
    }
}

fn overlap(a: &HostPattern, b: &HostPattern) -> bool {
    a.overlaps(b)
}

/// A denial of hosts and ports alone: it refuses a CONNECT before any TLS.
pub(super) fn connect_level(d: &Rule) -> bool {
    d.methods.is_none() && d.paths.is_none() && d.predicates.is_none()
}

/// A denial without `ports` applies on every port.
pub(super) fn deny_port(d: &Rule, port: u16) -> bool {
    d.ports.as_ref().is_none_or(|p| p.contains(&port))
}

/// The denials' host index (exact hosts, wildcard suffixes), in file order.
pub(super) type DenyIndex = (HashMap<String, Vec<usize>>, HashMap<String, Vec<usize>>);

pub(super) fn index(denials: &[Rule]) -> DenyIndex {
    let (mut exact, mut wildcard): DenyIndex = Default::default();
    for (i, d) in denials.iter().enumerate() {
        for host in &d.hosts {
            let list = match host {
                HostPattern::Exact(h) => exact.entry(h.clone()).or_default(),
                HostPattern::Wildcard(s) => wildcard.entry(s.clone()).or_default(),
            };
            if !list.contains(&i) {
                list.push(i);
            }
        }
    }
    (exact, wildcard)
}

impl Policy {
    /// Every `[[deny]]` table, in file order.
    pub fn denials(&self) -> &[Rule] {
        &self.denials
    }

    /// The denials naming `host`: exact entries first, then wildcards from the longest suffix;
    /// each once, in file order within a host entry.
    pub fn denials_for<'s, 'h>(
        &'s self,
        host: &'h str,
    ) -> impl Iterator<Item = &'s Rule> + use<'s, 'h> {
        // No denial: no lookup at all (every decision comes here first; a policy without
        // denials pays nothing for them).
        let any = !self.denials.is_empty();
        let exact = any
            .then(|| self.deny_exact.get(host))
            .flatten()
            .into_iter()
            .flatten();
        let suffixes = host
            .match_indices('.')
            .take_while(move |_| any)
            .map(move |(i, _)| &host[i + 1..])
            .filter_map(|suffix| self.deny_wildcard.get(suffix))
            .flatten();
        let mut seen = Vec::new();
        exact
            .chain(suffixes)
            .filter(move |&&i| {
                let first = !seen.contains(&i);
                seen.push(i);
                first
            })
            .map(|&i| &self.denials[i])
    }
}

/// `denied by rule 'NAME': DESCRIPTION`.
pub(super) fn message(d: &Rule) -> String {
    match &d.description {
        Some(why) => format!("denied by rule '{}': {why}", d.name),
        None => format!("denied by rule '{}'", d.name),
    }
}

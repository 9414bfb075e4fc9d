//! Learning: least-privilege rules that cover exactly the requests seen.
//!
//! Pure: requests go in ([`Learner::add`]), rules come out ([`Learner::propose`]) and are
//! written as TOML ([`render_policy`], [`render_cases`]); reading audit logs and checking the
//! result against the compiled policy is `latchkey learn`'s (`src/cli/learn.rs`).
//!
//! How paths generalise, per identity, host, port and method:
//! - a segment that is a numeric id, a UUID, a hex hash (7+ hex digits with a digit), a date
//!   (`2026-05-01`, an RFC 3339 timestamp) or a long random token becomes `*` (`*.json` when it
//!   has a short extension); anything else stays literal, glob characters escaped;
//! - a segment that takes [`VARY`] or more literal values with everything else equal becomes `*`;
//! - [`VARY`] or more paths of different depths below a prefix that has a literal segment become
//!   `PREFIX/**`: `**` only where the depth varies, never from the root.
//!
//! Globs are grouped by the methods seen on them, so a rule's methods × paths pairs no method
//! with a path it was never seen on (as far as globs allow), and ports are written out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use crate::policy::Scheme;
mod paths;
pub use paths::*;

/// Distinct values at one segment, or paths of varying depth below a prefix, that make a
/// pattern general (`*`, `PREFIX/**`); fewer stay listed one by one.
pub const VARY: usize = 8;
/// Example paths shown in a rule's comment.
const EXAMPLES: usize = 3;
/// Longest example path written (longer ones are cut, marked `…`).
const EXAMPLE_LEN: usize = 120;

/// One request seen: what a rule must allow.
#[derive(Clone, Debug)]
pub struct Seen {
    pub identity: String,
    pub scheme: Scheme,
    /// Lower case, as policy matches it.
    pub host: String,
    pub port: u16,
    pub method: String,
    /// The path without its query.
    pub path: String,
    pub at: SystemTime,
}

/// How much a [`Learner`] holds at most: what it met beyond these is counted, not kept.
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// Distinct (identity, host) pairs.
    pub groups: usize,
    /// Distinct (port, method, path) triples per pair.
    pub paths: usize,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            groups: 10_000,
            paths: 10_000,
        }
    }
}

#[derive(Clone, Debug)]
struct Stat {
    count: u64,
    first: SystemTime,
    last: SystemTime,
}

impl Stat {
    fn new(at: SystemTime) -> Self {
        Stat {
            count: 1,
            first: at,
            last: at,
        }
    }

    fn add(&mut self, other: &Stat) {
        self.count += other.count;
        self.first = self.first.min(other.first);
        self.last = self.last.max(other.last);
    }
}

/// Requests of one identity to one host: per (port, method, path), how often and when.
#[derive(Default, Debug)]
struct Group {
    seen: BTreeMap<(u16, String, String), Stat>,
    schemes: BTreeMap<u16, Scheme>,
}

/// Collects requests, bounded by [`Caps`].
#[derive(Debug, Default)]
pub struct Learner {
    caps: Caps,
    groups: BTreeMap<(String, String), Group>,
    /// Requests dropped because a cap was reached.
    pub dropped: u64,
}

/// A glob seen fewer than `--min-count` times, not proposed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rare {
    pub identity: String,
    pub host: String,
    pub port: u16,
    pub method: String,
    pub glob: String,
    pub count: u64,
}

/// A proposed rule, with what was seen under it.
#[derive(Clone, Debug)]
pub struct LearnedRule {
    pub name: String,
    pub identity: String,
    pub host: String,
    pub ports: Vec<u16>,
    pub methods: Vec<String>,
    pub paths: Vec<String>,
    pub requests: u64,
    pub first: SystemTime,
    pub last: SystemTime,
    /// One request per glob (and port) as seen: `(scheme, port, method, path)`.
    pub examples: Vec<Example>,
}

/// One request as seen, to show and to pin as a case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    pub scheme: Scheme,
    pub port: u16,
    pub method: String,
    pub path: String,
}

impl LearnedRule {
    /// The methods beyond GET, HEAD and OPTIONS: what a person must confirm.
    pub fn writes(&self) -> Vec<&str> {
        self.methods
            .iter()
            .map(String::as_str)
            .filter(|m| !matches!(*m, "GET" | "HEAD" | "OPTIONS"))
            .collect()
    }
}

/// What [`Learner::propose`] found.
#[derive(Debug, Default)]
pub struct Proposal {
    pub rules: Vec<LearnedRule>,
    pub rare: Vec<Rare>,
}

impl Learner {
    pub fn new(caps: Caps) -> Self {
        Learner {
            caps,
            groups: BTreeMap::new(),
            dropped: 0,
        }
    }

    /// Whether nothing was kept.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Requests kept (each distinct request once per time it was seen).
    pub fn requests(&self) -> u64 {
        self.groups
            .values()
            .flat_map(|g| g.seen.values())
            .map(|s| s.count)
            .sum()
    }

    pub fn add(&mut self, s: Seen) {
        let key = (s.identity, s.host);
        if !self.groups.contains_key(&key) && self.groups.len() >= self.caps.groups {
            self.dropped += 1;
            return;
        }
        let group = self.groups.entry(key).or_default();
        let seen_key = (s.port, s.method, s.path);
        let full = group.seen.len() >= self.caps.paths;
        match group.seen.get_mut(&seen_key) {
            Some(stat) => stat.add(&Stat::new(s.at)),
            None if full => self.dropped += 1,
            None => {
                group.seen.insert(seen_key, Stat::new(s.at));
                group.schemes.entry(s.port).or_insert(s.scheme);
            }
        }
    }

    /// Rules covering every request kept whose glob was seen `min_count` times or more, named
    /// apart from `taken` and from each other.
    pub fn propose(&self, min_count: u64, taken: &BTreeSet<String>) -> Proposal {
        let mut proposal = Proposal::default();
        let mut names = taken.clone();
        for ((identity, host), group) in &self.groups {
            // Per port: glob → methods seen on it, with their stats and an example path.
            let mut candidates: Vec<Candidate> = Vec::new();
            let ports: BTreeSet<u16> = group.seen.keys().map(|k| k.0).collect();
            for port in ports {
                let scheme = group.schemes.get(&port).copied().unwrap_or(Scheme::Https);
                let mut by_method: BTreeMap<&str, Vec<(&str, &Stat)>> = BTreeMap::new();
                for ((p, method, path), stat) in &group.seen {
                    if *p == port {
                        by_method
                            .entry(method.as_str())
                            .or_default()
                            .push((path.as_str(), stat));
                    }
                }
                let mut globs: BTreeMap<String, GlobSeen> = BTreeMap::new();
                for (method, paths) in by_method {
                    for (glob, stat, examples) in generalise(&paths) {
                        if stat.count < min_count {
                            proposal.rare.push(Rare {
                                identity: identity.clone(),
                                host: host.clone(),
                                port,
                                method: method.to_string(),
                                glob,
                                count: stat.count,
                            });
                            continue;
                        }
                        let g = globs.entry(glob).or_insert_with(|| GlobSeen {
                            methods: BTreeSet::new(),
                            stat: stat.clone(),
                            examples: Vec::new(),
                        });
                        if g.methods.insert(method.to_string()) && !g.examples.is_empty() {
                            g.stat.add(&stat);
                        }
                        g.examples.extend(examples.into_iter().map(|path| Example {
                            scheme,
                            port,
                            method: method.to_string(),
                            path,
                        }));
                    }
                }
                // One candidate per method set.
                let mut by_methods: BTreeMap<BTreeSet<String>, Candidate> = BTreeMap::new();
                for (glob, g) in globs {
                    let c = by_methods
                        .entry(g.methods.clone())
                        .or_insert_with(|| Candidate {
                            ports: vec![port],
                            methods: g.methods.clone(),
                            paths: Vec::new(),
                            stat: g.stat.clone(),
                            leads: Vec::new(),
                            examples: Vec::new(),
                        });
                    if !c.paths.is_empty() {
                        c.stat.add(&g.stat);
                    }
                    c.paths.push(glob);
                    let mut examples = g.examples.into_iter();
                    c.leads.extend(examples.next());
                    c.examples.extend(examples);
                }
                candidates.extend(by_methods.into_values());
            }
            // Ports with the same methods and paths share a rule.
            let mut merged: Vec<Candidate> = Vec::new();
            for c in candidates {
                match merged
                    .iter_mut()
                    .find(|m| m.methods == c.methods && m.paths == c.paths)
                {
                    Some(m) => {
                        m.ports.extend(c.ports);
                        m.stat.add(&c.stat);
                        m.leads.extend(c.leads);
                        m.examples.extend(c.examples);
                    }
                    None => merged.push(c),
                }
            }
            for mut c in merged {
                // One example of each glob first, so the comment and the cases show them all.
                let mut examples = std::mem::take(&mut c.leads);
                examples.append(&mut c.examples);
                let name = unique_name(&rule_name(host, identity), &mut names);
                proposal.rules.push(LearnedRule {
                    name,
                    identity: identity.clone(),
                    host: host.clone(),
                    ports: c.ports,
                    methods: c.methods.into_iter().collect(),
                    paths: c.paths,
                    requests: c.stat.count,
                    first: c.stat.first,
                    last: c.stat.last,
                    examples,
                });
            }
        }
        proposal
    }
}

#[derive(Debug)]
struct GlobSeen {
    methods: BTreeSet<String>,
    stat: Stat,
    examples: Vec<Example>,
}

#[derive(Debug)]
struct Candidate {
    ports: Vec<u16>,
    methods: BTreeSet<String>,
    paths: Vec<String>,
    stat: Stat,
    /// The first example of each glob; then the others.
    leads: Vec<Example>,
    examples: Vec<Example>,
}

/// `learned-<host, dots as dashes>[-<identity>]`.
fn rule_name(host: &str, identity: &str) -> String {
    let host: String = host
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    if identity == crate::policy::identity::DEFAULT_IDENTITY {
        format!("learned-{host}")
    } else {
        format!("learned-{host}-{identity}")
    }
}

/// `base`, or `base-2`, `base-3`…: the first not in `taken` (then taken).
fn unique_name(base: &str, taken: &mut BTreeSet<String>) -> String {
    let mut name = base.to_string();
    let mut n = 1;
    while taken.contains(&name) {
        n += 1;
        name = format!("{base}-{n}");
    }
    taken.insert(name.clone());
    name
}

// ---------------------------------------------------------------------------------------------
// Output

/// A TOML string: quoted, with `"`, `\` and control characters escaped.
pub fn toml_str(s: &str) -> String {
    toml_edit::Value::from(s).to_string().trim().to_string()
}

/// `s` for a comment: one line, at most [`EXAMPLE_LEN`] characters.
fn comment_text(s: &str) -> String {
    let one_line: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.chars().count() <= EXAMPLE_LEN {
        return one_line;
    }
    let mut cut: String = one_line.chars().take(EXAMPLE_LEN).collect();
    cut.push('…');
    cut
}

/// `t` in RFC 3339 (UTC, seconds), through `humantime` as everywhere else; a time before 1970
/// (`--since 30000d`) reads as 1970 rather than panicking inside `humantime`.
pub fn rfc3339_seconds(t: SystemTime) -> humantime::Rfc3339Timestamp {
    humantime::format_rfc3339_seconds(t.max(SystemTime::UNIX_EPOCH))
}

/// The learned policy file: `header` (comment lines, without `#`) then each rule with its
/// comment: what was seen, and a `# REVIEW:` line on a rule that allows writes.
pub fn render_policy(header: &[String], rules: &[LearnedRule]) -> String {
    let mut out = String::new();
    for line in header {
        out.push_str(&format!("# {}\n", comment_text(line)).replace("# \n", "#\n"));
    }
    for r in rules {
        out.push('\n');
        out.push_str(&format!(
            "# {} request{} seen, first {}, last {}",
            r.requests,
            if r.requests == 1 { "" } else { "s" },
            rfc3339_seconds(r.first),
            rfc3339_seconds(r.last)
        ));
        if r.identity != crate::policy::identity::DEFAULT_IDENTITY {
            out.push_str(&format!(", identity {}", comment_text(&r.identity)));
        }
        out.push('\n');
        let mut shown = BTreeSet::new();
        for e in &r.examples {
            if shown.len() == EXAMPLES {
                break;
            }
            let line = format!("{} {}", e.method, e.path);
            if shown.insert(line.clone()) {
                out.push_str(&format!("#   e.g. {}\n", comment_text(&line)));
            }
        }
        let writes = r.writes();
        if !writes.is_empty() {
            out.push_str(&format!(
                "# REVIEW: allows writes ({}): confirm the agent must do this\n",
                writes.join(", ")
            ));
        }
        out.push_str("[[rules]]\n");
        out.push_str(&format!("name    = {}\n", toml_str(&r.name)));
        out.push_str(&format!("hosts   = [{}]\n", toml_str(&r.host)));
        let ports: Vec<String> = r.ports.iter().map(u16::to_string).collect();
        out.push_str(&format!("ports   = [{}]\n", ports.join(", ")));
        let methods: Vec<String> = r.methods.iter().map(|m| toml_str(m)).collect();
        out.push_str(&format!("methods = [{}]\n", methods.join(", ")));
        if r.paths.len() == 1 {
            out.push_str(&format!("paths   = [{}]\n", toml_str(&r.paths[0])));
        } else {
            out.push_str("paths   = [\n");
            for p in &r.paths {
                out.push_str(&format!("  {},\n", toml_str(p)));
            }
            out.push_str("]\n");
        }
    }
    out
}

/// A case for the learned case file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LearnedCase {
    pub name: String,
    pub identity: Option<String>,
    pub method: String,
    pub url: String,
    pub allow: bool,
    /// The rule that allows it (allow), or the learned rule it sits just outside (deny).
    pub rule: String,
}

/// What pins `rule`: up to [`EXAMPLES`] requests seen (allow), and requests just outside it
/// (deny): a method not seen, a sibling path, another port. The caller keeps those the
/// resulting policy decides as said.
pub fn cases_for(rule: &LearnedRule) -> Vec<LearnedCase> {
    let identity =
        (rule.identity != crate::policy::identity::DEFAULT_IDENTITY).then(|| rule.identity.clone());
    let mut cases = Vec::new();
    let mut seen = BTreeSet::new();
    for e in &rule.examples {
        if seen.len() == EXAMPLES {
            break;
        }
        let u = crate::policy::display_url(e.scheme, &rule.host, e.port, &e.path);
        if seen.insert((e.method.clone(), u.clone())) {
            cases.push(LearnedCase {
                name: format!("{}: {} {}", rule.name, e.method, comment_text(&e.path)),
                identity: identity.clone(),
                method: e.method.clone(),
                url: u,
                allow: true,
                rule: rule.name.clone(),
            });
        }
    }
    let Some(e) = rule.examples.first() else {
        return cases;
    };
    let deny = |what: &str, method: &str, url: String| LearnedCase {
        name: format!("{}: not {what}", rule.name),
        identity: identity.clone(),
        method: method.to_string(),
        url,
        allow: false,
        rule: rule.name.clone(),
    };
    if let Some(m) = ["DELETE", "PUT", "POST", "PATCH", "GET"]
        .into_iter()
        .find(|m| !rule.methods.iter().any(|r| r == m))
    {
        cases.push(deny(
            m,
            m,
            crate::policy::display_url(e.scheme, &rule.host, e.port, &e.path),
        ));
    }
    let sibling = sibling_path(&e.path);
    cases.push(deny(
        "a sibling path",
        &e.method,
        crate::policy::display_url(e.scheme, &rule.host, e.port, &sibling),
    ));
    if let Some(other) = (1..=100u16)
        .filter_map(|d| e.port.checked_add(d))
        .find(|p| !rule.ports.contains(p) && *p != 80 && *p != 443)
    {
        cases.push(deny(
            &format!("port {other}"),
            &e.method,
            crate::policy::display_url(e.scheme, &rule.host, other, &e.path),
        ));
    }
    cases
}

/// `path` with its last literal (non-id) segment replaced, or a path nobody used under `/`.
fn sibling_path(path: &str) -> String {
    let rest = path.strip_prefix('/').unwrap_or(path);
    let mut segs: Vec<String> = rest.split('/').map(str::to_string).collect();
    if let Some(i) = segs.iter().rposition(|s| !s.is_empty() && !is_variable(s)) {
        segs[i] = format!("{}-not-seen", segs[i]);
        return format!("/{}", segs.join("/"));
    }
    "/latchkey-learn-not-seen".to_string()
}

/// The case file: `header` comment lines, then the cases.
pub fn render_cases(header: &[String], cases: &[LearnedCase]) -> String {
    let mut out = String::new();
    for line in header {
        out.push_str(&format!("# {}\n", comment_text(line)).replace("# \n", "#\n"));
    }
    for c in cases {
        out.push_str("\n[[cases]]\n");
        out.push_str(&format!("name     = {}\n", toml_str(&c.name)));
        if let Some(id) = &c.identity {
            out.push_str(&format!("identity = {}\n", toml_str(id)));
        }
        out.push_str(&format!("method   = {}\n", toml_str(&c.method)));
        out.push_str(&format!("url      = {}\n", toml_str(&c.url)));
        if c.allow {
            out.push_str("expect   = \"allow\"\n");
            out.push_str(&format!("rule     = {}\n", toml_str(&c.rule)));
        } else {
            out.push_str("expect   = \"deny\"\n");
        }
    }
    out
}

#[cfg(test)]
#[path = "learn_tests.rs"]
mod tests;

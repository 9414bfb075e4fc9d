//! Requests: the sample hosts (one per host class), and per host the ports, methods and paths each
//! policy reaches, compared with an example request for each difference.

use super::*;

/// One host to ask about, and the pattern it stands for.
pub(super) struct Sample {
    pub(super) host: String,
    pub(super) shown: String,
}

/// One sample host per host pattern of either side (see the module docs).
pub(super) fn samples(o: &View<'_>, n: &View<'_>) -> Vec<Sample> {
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
pub(super) enum Paths {
    None,
    All,
    Globs(BTreeSet<String>),
}

impl Paths {
    pub(super) fn add(&mut self, rule: &Rule) {
        match (&mut *self, &rule.paths) {
            (Paths::All, _) => {}
            (_, None) => *self = Paths::All,
            (Paths::None, Some(p)) => *self = Paths::Globs(p.globs.iter().cloned().collect()),
            (Paths::Globs(g), Some(p)) => g.extend(p.globs.iter().cloned()),
        }
    }

    pub(super) fn reaches(&self) -> bool {
        *self != Paths::None
    }

    /// Concrete paths in this set, from its globs (for examples that read well).
    pub(super) fn instances(&self) -> Vec<String> {
        match self {
            Paths::None => Vec::new(),
            Paths::All => vec!["/".to_string(), "/x".to_string()],
            Paths::Globs(g) => g.iter().flat_map(|g| instantiate(g)).collect(),
        }
    }
}

/// Rules of `v` matching a host, port and method (tunnel rules never match a request).
pub(super) fn paths_for(rules: &[&Rule], scheme: Scheme, port: u16, method: &Method) -> Paths {
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
pub(super) fn rule_for<'p>(
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
pub(super) struct HostReach {
    /// (scheme, port, method text, method) → (old, new).
    pub(super) cells: Vec<(Scheme, u16, String, Method, Paths, Paths)>,
}

/// Each side's rules for one host: the cells of [`host_reach`] only look at these.
pub(super) fn on_host<'p>(v: &View<'p>, host: &str) -> Vec<&'p Rule> {
    v.rules
        .iter()
        .copied()
        .filter(|r| r.hosts.iter().any(|h| h.matches(host)))
        .collect()
}

pub(super) fn host_reach(o: &View<'_>, n: &View<'_>, host: &str) -> HostReach {
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
pub(super) const WHERE: &str = "\u{0}where\u{0}";

pub(super) fn request_changes(o: &View<'_>, n: &View<'_>) -> Vec<Change> {
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
pub(super) fn merge_ports(changes: Vec<Change>, host: &str) -> Vec<Change> {
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
pub(super) fn host_changes(o: &View<'_>, n: &View<'_>, s: &Sample, out: &mut Vec<Change>) {
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
        let way = Way {
            dir,
            from,
            to,
            both: (o, n),
            s,
        };
        if has && !had {
            out.extend(way.host_reached(cells));
            continue;
        }
        if !has {
            continue;
        }
        // Both reach the host: compare per (scheme, port).
        let mut ports: Vec<(Scheme, u16)> = cells.iter().map(|c| (c.0, c.1)).collect();
        ports.dedup();
        for (scheme, port) in ports {
            let here: Vec<&Cell> = cells
                .iter()
                .filter(|c| c.0 == scheme && c.1 == port)
                .collect();
            way.port_changes(scheme, port, &here, out);
        }
    }
}

/// One cell of [`HostReach`]: (scheme, port, method text, method) → (old, new).
type Cell = (Scheme, u16, String, Method, Paths, Paths);

/// One direction of the comparison for one sample host: widened (old → new) or narrowed
/// (new → old, `from` and `to` swapped).
struct Way<'a, 'p> {
    dir: Direction,
    from: &'a View<'p>,
    to: &'a View<'p>,
    /// (old, new), whichever the direction.
    both: (&'a View<'p>, &'a View<'p>),
    s: &'a Sample,
}

impl Way<'_, '_> {
    /// A cell's paths as (before, now) in this direction.
    fn side(&self, c: &Cell) -> (Paths, Paths) {
        match self.dir {
            Direction::Widened => (c.4.clone(), c.5.clone()),
            Direction::Narrowed => (c.5.clone(), c.4.clone()),
        }
    }

    fn when(&self) -> &'static str {
        if self.dir == Direction::Widened {
            "newly"
        } else {
            "no longer"
        }
    }

    fn example(&self, scheme: Scheme, port: u16, cell: &Cell) -> Option<Example> {
        let (before, now) = self.side(cell);
        self.find_example(scheme, port, &cell.2, &before, &now)
    }

    /// A request `self.to` lets through and `self.from` does not, with paths from `now` minus `before`:
    /// readable instances of `now`'s globs first, then the shortest path the DFAs find. `None` when
    /// no real request shows the difference (each candidate is decided by both policies).
    fn find_example(
        &self,
        scheme: Scheme,
        port: u16,
        method: &str,
        before: &Paths,
        now: &Paths,
    ) -> Option<Example> {
        let (from, to, dir, s) = (self.from, self.to, self.dir, self.s);
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

    /// A method as shown: one of the methods no rule names is `other`.
    fn method_shown(&self, method: &str) -> String {
        let (o, n) = self.both;
        if OTHER_METHODS.contains(&method) && !named_anywhere(o, n, method) {
            "other".to_string()
        } else {
            method.to_string()
        }
    }

    /// Reachable at all now: one change for the host, its example the first cell's.
    fn host_reached(&self, cells: &[Cell]) -> Option<Change> {
        let s = self.s;
        let mut c = cells.iter().find_map(|cell| {
            let (_, now) = self.side(cell);
            if !now.reaches() {
                return None;
            }
            let example = self.find_example(cell.0, cell.1, &cell.2, &Paths::None, &now);
            let rule = rule_for(self.to, &s.host, cell.0, cell.1, &cell.3);
            let mut c = Change::new(
                self.dir,
                Kind::Host,
                Some(s.shown.clone()),
                format!("host {} {} reachable", s.shown, self.when()),
            );
            // Only a difference a request shows is reported.
            c.example = Some(example?);
            set_rule(&mut c, rule);
            Some(c)
        })?;
        c.scheme = None;
        Some(c)
    }

    /// The changes on one (scheme, port) both sides reach the host on.
    fn port_changes(&self, scheme: Scheme, port: u16, here: &[&Cell], out: &mut Vec<Change>) {
        let had_port = here.iter().any(|c| self.side(c).0.reaches());
        let has_port = here.iter().any(|c| self.side(c).1.reaches());
        if has_port && !had_port {
            // The first method whose example a request shows (none: nothing to report, as
            // for a port a tunnel now relays instead).
            let found = here
                .iter()
                .filter(|c| self.side(c).1.reaches())
                .find_map(|cell| self.example(scheme, port, cell).map(|e| (cell, e)));
            if let Some((cell, example)) = found {
                let mut c = self.change(Kind::Port, format!("{WHERE} {} reachable", self.when()));
                self.place(&mut c, scheme, port, example, cell);
                out.push(c);
            }
            return;
        }
        if !has_port {
            return;
        }
        out.extend(self.methods_reached(scheme, port, here));
        self.path_changes(scheme, port, here, out);
    }

    /// Methods reachable now on no path before: one change naming them all.
    fn methods_reached(&self, scheme: Scheme, port: u16, here: &[&Cell]) -> Option<Change> {
        let new_methods: Vec<&&Cell> = here
            .iter()
            .filter(|c| {
                let (b, a) = self.side(c);
                a.reaches() && !b.reaches()
            })
            .collect();
        let (first, example) = new_methods
            .iter()
            .find_map(|cell| self.example(scheme, port, cell).map(|e| (cell, e)))?;
        let mut names: Vec<String> = new_methods
            .iter()
            .map(|c| self.method_shown(&c.2))
            .collect();
        names.sort();
        names.dedup();
        let mut c = self.change(
            Kind::Method,
            format!(
                "methods {} {} allowed on {WHERE}",
                names.join(", "),
                self.when()
            ),
        );
        c.methods = Some(names);
        self.place(&mut c, scheme, port, example, first);
        Some(c)
    }

    /// Methods reachable on both sides: their paths, where they differ.
    fn path_changes(&self, scheme: Scheme, port: u16, here: &[&Cell], out: &mut Vec<Change>) {
        for cell in here.iter().filter(|c| {
            let (b, a) = self.side(c);
            a.reaches() && b.reaches() && a != b
        }) {
            let Some(example) = self.example(scheme, port, cell) else {
                continue;
            };
            let shown_method = self.method_shown(&cell.2);
            let mut c = self.change(
                Kind::Path,
                format!(
                    "{shown_method} paths {} on {WHERE}: e.g. {}",
                    if self.dir == Direction::Widened {
                        "widened"
                    } else {
                        "narrowed"
                    },
                    path_of(&example.url)
                ),
            );
            c.method = Some(shown_method);
            self.place(&mut c, scheme, port, example, cell);
            out.push(c);
        }
    }

    fn change(&self, kind: Kind, summary: String) -> Change {
        Change::new(self.dir, kind, Some(self.s.shown.clone()), summary)
    }

    /// Where a change is: its scheme, port, example, and the rule that decides it now.
    fn place(&self, c: &mut Change, scheme: Scheme, port: u16, example: Example, cell: &Cell) {
        c.scheme = Some(scheme.as_str());
        c.port = Some(port);
        c.example = Some(example);
        set_rule(c, rule_for(self.to, &self.s.host, scheme, port, &cell.3));
    }
}

/// Whether `method` is named by some rule of either side (else it stands for "other").
pub(super) fn named_anywhere(o: &View<'_>, n: &View<'_>, method: &str) -> bool {
    o.rules
        .iter()
        .chain(&n.rules)
        .any(|r| r.methods.iter().flatten().any(|m| m.as_str() == method))
}

pub(super) fn path_of(url: &str) -> &str {
    url.find("://")
        .and_then(|i| url[i + 3..].find('/').map(|j| &url[i + 3 + j..]))
        .unwrap_or("/")
}

pub(super) fn set_rule(c: &mut Change, rule: Option<&Rule>) {
    if let Some(r) = rule {
        c.rule = Some(r.name.clone());
        c.origin = Some(r.origin.to_string());
    }
}

/// CONNECT relayed raw in one policy and not the other, per https port a rule names.
pub(super) fn tunnel_changes(o: &View<'_>, n: &View<'_>, s: &Sample, out: &mut Vec<Change>) {
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

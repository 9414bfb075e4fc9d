//! Validation of one `[[rules]]` entry: every problem in it is reported, and only an entry with
//! none becomes a [`Rule`]. [`FileCx::rule`] reads as the keys, one call each: what a rule
//! matches is checked here (name, hosts, ports, methods, paths, tunnel, websocket, mode,
//! allow_private), what it binds and sends in `rule_binding.rs`, its `mcp` and `capture` tables
//! in `rule_features.rs`.

use std::collections::{BTreeSet, HashSet};
use std::ops::Range;

use globset::{GlobBuilder, GlobSetBuilder};
use http::Method;

use super::ask_compile::AskDefaults;
use super::compile::FileCx;
use super::limits_compile::LimitNames;
use super::schema::{Entry, RawRule};
use super::schemes::{RawSchemes, Schemes};
use super::{HostPattern, Origin, PathMatcher, Rule};
use crate::wire::host::normalize_host;

#[path = "rule_binding.rs"]
mod binding;
#[path = "rule_features.rs"]
mod features;

/// A list key as read: `key = ["…", …]`, each item with its span.
type List = toml::Spanned<Vec<toml::Spanned<String>>>;

/// What a rule may refer to, declared anywhere in the policy.
pub(super) struct Known<'a> {
    pub secrets: &'a HashSet<String>,
    pub credentials: &'a HashSet<String>,
    /// `[ask]`'s terms and the notifiers, for the rule's `ask`.
    pub asks: &'a AskDefaults,
    /// Every `[limits.NAME]`, for the rule's `limits`.
    pub limits: &'a LimitNames,
}

/// Which entry a message names: `rules[3]` (a rule) or `deny[0]` (a denial).
#[derive(Clone, Copy, Debug)]
pub(super) struct At(pub &'static str, pub usize);

impl From<usize> for At {
    fn from(index: usize) -> At {
        At("rules", index)
    }
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.0, self.1)
    }
}

/// `rules[INDEX].FIELD` (or `deny[INDEX].FIELD`): how an entry's messages name a key.
fn at(index: impl Into<At>, field: &str) -> String {
    format!("{}.{field}", index.into())
}

/// A rule's hosts, and where errors about them point (the `hosts` key, or the rule).
pub(super) struct Hosts {
    pub(super) list: Vec<HostPattern>,
    span: Range<usize>,
}

impl FileCx<'_> {
    /// Validates one rule; records every problem and returns `None` if there was any (here or
    /// while reading the entry).
    pub(super) fn rule(
        &mut self,
        index: usize,
        entry: Entry<RawRule>,
        origin: Origin,
        known: &Known<'_>,
    ) -> Option<Rule> {
        let before = self.errors.len();
        let (span, raw) = (entry.span, entry.raw);
        let name = self.rule_name(index, raw.name.as_ref());
        let hosts = self.rule_hosts(index, raw.hosts, span);
        let ports = raw.ports.map(|p| self.rule_ports(index, p));
        let methods = raw.methods.map(|m| self.rule_methods(index, m));
        let paths = raw.paths.and_then(|p| self.rule_paths(index, p));
        let tunnel = raw.tunnel.map(|t| (*t.get_ref(), t.span()));
        let predicates = self.predicates(&At::from(index).to_string(), raw.predicates);
        let restricted = methods.is_some() || paths.is_some() || raw.inject.is_some();
        self.rule_tunnel(index, tunnel.as_ref(), restricted);
        if let (Some((true, tspan)), Some(_)) = (&tunnel, &predicates) {
            self.error(
                tspan.clone(),
                format!(
                    "{}: a tunnel rule relays encrypted bytes that latchkey cannot see, so it cannot check query, headers, body or graphql; remove those keys or set tunnel = false",
                    at(index, "tunnel")
                ),
            );
        }
        let is_tunnel = matches!(tunnel, Some((true, _)));
        let websocket = self.rule_websocket(index, raw.websocket, is_tunnel, methods.as_ref());
        let mut bound: BTreeSet<String> = BTreeSet::new();
        let injected = raw
            .inject
            .map(|i| self.rule_inject(index, i, known.secrets, &mut bound))
            .unwrap_or_default();
        self.rule_secrets(index, raw.secrets, known.secrets, &mut bound);
        let placeholders = self.rule_placeholders(index, raw.placeholders, websocket);
        let keep_headers = self.rule_keep_headers(index, raw.keep_headers);
        let credential = self.rule_credential(
            index,
            raw.credential.as_ref(),
            known.credentials,
            &mut bound,
        );
        let report = self.rule_mode(index, raw.mode.as_ref());
        let allow_private = self.rule_allow_private(index, raw.allow_private);
        let wildcard_ok = raw
            .dangerously_inject_into_wildcard
            .as_ref()
            .is_some_and(|b| *b.get_ref());
        let has_credential = credential.is_some();
        self.rule_binding(
            index,
            &hosts,
            &bound,
            wildcard_ok,
            is_tunnel,
            has_credential,
        );
        let ask = raw
            .ask
            .as_ref()
            .and_then(|a| self.rule_ask(index, a, is_tunnel, report, known.asks));
        let limits = self.limit_list(&at(index, "limits"), raw.limits, known.limits, is_tunnel);
        let mcp = raw
            .mcp
            .and_then(|m| self.mcp(&at(index, "mcp"), m, is_tunnel, websocket, methods.as_ref()))
            .map(std::sync::Arc::new);
        let capture = raw.capture.and_then(|c| {
            self.capture(
                &at(index, "capture"),
                c,
                is_tunnel,
                &hosts.list,
                known.secrets,
            )
        });
        let raw_schemes = RawSchemes {
            schemes: raw.schemes,
            cleartext: raw.dangerously_allow_cleartext,
        };
        let mut rule = Rule {
            name: name.clone().unwrap_or_default(),
            description: raw.description,
            hosts: hosts.list,
            ports,
            methods,
            paths,
            tunnel: is_tunnel,
            websocket,
            inject_headers: injected.headers,
            inject_query: injected.query,
            inject_basic: injected.basic,
            injected_names: injected.names,
            inject_path_prefix: injected.path_prefix,
            bound,
            placeholders,
            keep_headers,
            allow_private,
            report,
            credential,
            ask,
            limits,
            mcp,
            capture,
            schemes: Schemes::BOTH,
            cleartext: false,
            predicates,
            origin,
        };
        self.rule_schemes(&mut rule, raw_schemes, index);
        if self.errors.len() > before || !entry.complete || name.is_none() {
            return None;
        }
        Some(rule)
    }

    /// A rule's `name`, trimmed: letters, digits, `-`, `_`, `.`, `:`, and not the reserved
    /// "unknown". A missing name was reported while reading.
    pub(super) fn rule_name(
        &mut self,
        index: impl Into<At> + Copy,
        raw_name: Option<&toml::Spanned<String>>,
    ) -> Option<String> {
        let raw_name = raw_name?;
        let name = raw_name.get_ref().trim().to_string();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
        {
            self.error(
                raw_name.span(),
                format!(
                    "{}: rule name {:?} must be non-empty and use only letters, digits, '-', '_', '.', ':'",
                    at(index, "name"),
                    raw_name.get_ref()
                ),
            );
        } else if name == super::ask::UNKNOWN {
            self.error(
                raw_name.span(),
                format!(
                    "{}: rule name \"unknown\" is reserved: approvals and grants for requests no rule allows go by it; rename the rule",
                    at(index, "name")
                ),
            );
        }
        Some(name)
    }

    /// A rule's `hosts`: at least one, each a name, an address or `*.domain`. A missing or
    /// mistyped `hosts` was reported while reading; errors about the hosts then point at the
    /// rule (`span`).
    pub(super) fn rule_hosts(
        &mut self,
        index: impl Into<At> + Copy,
        raw: Option<List>,
        span: Range<usize>,
    ) -> Hosts {
        let hosts_span = raw.as_ref().map_or(span, |h| h.span());
        let raw_hosts = raw.map(|h| h.into_inner());
        if raw_hosts.as_ref().is_some_and(|h| h.is_empty()) {
            self.error(
                hosts_span.clone(),
                format!("{}: a rule needs at least one host", at(index, "hosts")),
            );
        }
        let mut list = Vec::new();
        for (i, h) in raw_hosts.iter().flatten().enumerate() {
            match parse_host_pattern(h.get_ref()) {
                Ok(p) => list.push(p),
                Err(msg) => self.error(
                    h.span(),
                    format!("{}: {msg}", at(index, &format!("hosts[{i}]"))),
                ),
            }
        }
        Hosts {
            list,
            span: hosts_span,
        }
    }

    /// A rule's `ports`: not empty, each 1 to 65535.
    pub(super) fn rule_ports(
        &mut self,
        index: impl Into<At> + Copy,
        ports: toml::Spanned<Vec<toml::Spanned<i64>>>,
    ) -> Vec<u16> {
        let span = ports.span();
        let ports = ports.into_inner();
        if ports.is_empty() {
            self.error(
                span,
                format!(
                    "{}: an empty list allows nothing; remove the key for the default port",
                    at(index, "ports")
                ),
            );
        }
        let mut out = Vec::new();
        for (i, p) in ports.iter().enumerate() {
            match u16::try_from(*p.get_ref()) {
                Ok(port) if port != 0 => out.push(port),
                _ => self.error(
                    p.span(),
                    format!(
                        "{}: invalid port {}: must be 1 to 65535",
                        at(index, &format!("ports[{i}]")),
                        p.get_ref()
                    ),
                ),
            }
        }
        out
    }

    /// A rule's `methods`: not empty, each an upper-case token (with a did-you-mean for a
    /// lower-case one).
    pub(super) fn rule_methods(
        &mut self,
        index: impl Into<At> + Copy,
        methods: List,
    ) -> Vec<Method> {
        let span = methods.span();
        let methods = methods.into_inner();
        if methods.is_empty() {
            self.error(
                span,
                format!(
                    "{}: an empty list allows nothing; remove the key to allow every method",
                    at(index, "methods")
                ),
            );
        }
        let mut out = Vec::new();
        for (i, m) in methods.iter().enumerate() {
            let text = m.get_ref();
            let valid = !text.is_empty()
                && text
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '-' || c == '_');
            match Method::from_bytes(text.as_bytes()) {
                Ok(method) if valid => out.push(method),
                _ => {
                    let hint = if text.chars().any(|c| c.is_ascii_lowercase()) {
                        format!("; did you mean {:?}?", text.to_ascii_uppercase())
                    } else if text == "*" {
                        "; remove the key to allow every method".to_string()
                    } else {
                        String::new()
                    };
                    self.error(
                        m.span(),
                        format!(
                            "{}: invalid method {text:?}: methods are upper-case tokens{hint}",
                            at(index, &format!("methods[{i}]"))
                        ),
                    )
                }
            }
        }
        out
    }

    /// A rule's `paths`: not empty, each a glob from `/` without a query.
    pub(super) fn rule_paths(
        &mut self,
        index: impl Into<At> + Copy,
        paths: List,
    ) -> Option<PathMatcher> {
        let span = paths.span();
        let paths = paths.into_inner();
        if paths.is_empty() {
            self.error(
                span.clone(),
                format!(
                    "{}: an empty list allows nothing; remove the key to allow every path",
                    at(index, "paths")
                ),
            );
        }
        let mut builder = GlobSetBuilder::new();
        let mut globs = Vec::new();
        for (i, p) in paths.iter().enumerate() {
            let text = p.get_ref();
            let field = at(index, &format!("paths[{i}]"));
            if !text.starts_with('/') {
                self.error(
                    p.span(),
                    format!("{field}: path glob {text:?} must start with '/'"),
                );
                continue;
            }
            if text.contains('?') {
                self.error(
                    p.span(),
                    format!(
                        "{field}: path glob {text:?} contains '?': globs match the path only, never the query"
                    ),
                );
                continue;
            }
            match path_glob(text) {
                Ok(glob) => {
                    builder.add(glob);
                    globs.push(text.clone());
                }
                Err(e) => self.error(
                    p.span(),
                    format!("{field}: invalid path glob {text:?}: {}", e.kind()),
                ),
            }
        }
        match builder.build() {
            Ok(set) => Some(PathMatcher { globs, set }),
            Err(e) => {
                self.error(span, format!("{}: {e}", at(index, "paths")));
                None
            }
        }
    }

    /// `tunnel = true` relays bytes unseen: no methods, paths or injection beside it.
    fn rule_tunnel(
        &mut self,
        index: usize,
        tunnel: Option<&(bool, Range<usize>)>,
        restricted: bool,
    ) {
        if let Some((true, tspan)) = tunnel {
            if restricted {
                self.error(
                    tspan.clone(),
                    format!(
                        "{}: a tunnel rule relays encrypted bytes that latchkey cannot see, so it cannot restrict methods or paths or inject headers; remove those keys or set tunnel = false",
                        at(index, "tunnel")
                    ),
                );
            }
        }
    }

    /// `websocket = true`: a WebSocket handshake is a GET (RFC 6455 §4.1), and a tunnel is
    /// never looked inside.
    fn rule_websocket(
        &mut self,
        index: usize,
        raw: Option<toml::Spanned<bool>>,
        tunnel: bool,
        methods: Option<&Vec<Method>>,
    ) -> bool {
        let Some((true, wspan)) = raw.map(|w| (*w.get_ref(), w.span())) else {
            return false;
        };
        if tunnel {
            self.error(
                wspan.clone(),
                format!(
                    "{}: a tunnel rule relays bytes latchkey cannot see; a WebSocket is relayed frame by frame under an ordinary rule, so set tunnel = false",
                    at(index, "websocket")
                ),
            );
        }
        if methods.is_some_and(|ms| !ms.contains(&Method::GET)) {
            self.error(
                wspan,
                format!(
                    "{}: a WebSocket handshake is a GET, and this rule's methods leave GET out; add \"GET\" to methods",
                    at(index, "websocket")
                ),
            );
        }
        true
    }

    /// A rule's `mode`: "enforce" (the default) or "report" (true).
    fn rule_mode(&mut self, index: usize, mode: Option<&toml::Spanned<String>>) -> bool {
        let Some(m) = mode else { return false };
        match m.get_ref().as_str() {
            "enforce" => false,
            "report" => true,
            other => {
                self.error(
                    m.span(),
                    format!(
                        "{}: unknown mode {other:?}: use \"enforce\" or \"report\"",
                        at(index, "mode")
                    ),
                );
                false
            }
        }
    }

    /// A rule's `allow_private`: address ranges.
    fn rule_allow_private(
        &mut self,
        index: usize,
        list: Option<List>,
    ) -> Vec<crate::wire::cidr::Cidr> {
        let mut allow_private = Vec::new();
        for (i, c) in list.map(|l| l.into_inner()).iter().flatten().enumerate() {
            match crate::wire::cidr::Cidr::parse(c.get_ref()) {
                Ok(cidr) => allow_private.push(cidr),
                Err(e) => self.error(
                    c.span(),
                    format!("{}: {e}", at(index, &format!("allow_private[{i}]"))),
                ),
            }
        }
        allow_private
    }
}

/// Parses one `hosts` entry into a pattern, with a suggestion when it looks like a mistake.
fn parse_host_pattern(raw: &str) -> Result<HostPattern, String> {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Err("empty host".to_string());
    }
    if let Some((_, rest)) = trimmed.split_once("://") {
        let host = rest.split(['/', ':']).next().unwrap_or_default();
        return Err(format!(
            "{raw:?} is a URL: hosts take a bare host name; did you mean {host:?} (with ports/paths in their own keys)?"
        ));
    }
    if trimmed.contains('/') {
        return Err(format!(
            "{raw:?} contains '/': put paths in the rule's `paths` key"
        ));
    }
    if trimmed == "*" || trimmed == "*." {
        return Err(format!(
            "{raw:?} would match every host; did you mean \"*.example.com\"?"
        ));
    }
    if let Some(suffix) = trimmed.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err(format!(
                "{raw:?}: '*' is only allowed as the whole first label (\"*.example.com\")"
            ));
        }
        let suffix = normalize_host(suffix).map_err(|e| e.to_string())?;
        if suffix.parse::<std::net::IpAddr>().is_ok() {
            return Err(format!("{raw:?}: a wildcard cannot precede an IP address"));
        }
        if !suffix.contains('.') {
            return Err(format!(
                "{raw:?} would match a whole top-level domain; name the domain (\"*.example.{suffix}\")"
            ));
        }
        return Ok(HostPattern::Wildcard(suffix));
    }
    if trimmed.contains('*') {
        return Err(format!(
            "{raw:?}: '*' is only allowed as the whole first label (\"*.example.com\")"
        ));
    }
    if let Some((h, p)) = trimmed.rsplit_once(':') {
        if !h.contains(':') && p.chars().all(|c| c.is_ascii_digit()) {
            return Err(format!(
                "{raw:?} contains a port: write hosts = [{h:?}] and ports = [{p}]"
            ));
        }
    }
    normalize_host(trimmed)
        .map(HostPattern::Exact)
        .map_err(|e| e.to_string())
}

/// A rule's path glob as the matcher builds it: `*` stays within a segment, `**` crosses `/`,
/// `\` escapes. `diff` rebuilds globs with this, so both read a glob the same way.
pub fn path_glob(text: &str) -> Result<globset::Glob, globset::Error> {
    GlobBuilder::new(text)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
}

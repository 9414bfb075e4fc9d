//! Validation of one `[[rules]]` entry: every problem in it is reported, and only an entry with
//! none becomes a [`Rule`].

use std::collections::{BTreeSet, HashSet};

use globset::{GlobBuilder, GlobSetBuilder};
use http::{HeaderName, Method};

use super::ask_compile::AskDefaults;
use super::compile::FileCx;
use super::limits_compile::LimitNames;
use super::mcp::{McpRules, NameGlobs, DEFAULT_METHODS};
use super::schema::{Entry, RawCapture, RawMcp, RawRule};
use super::schemes::{RawSchemes, Schemes};
use super::{Capture, HostPattern, Origin, PathMatcher, Rule};
use crate::secrets::placeholder::Place;
use crate::secrets::template::valid_name;
use crate::secrets::Template;
use crate::wire::host::normalize_host;

/// What a rule may refer to, declared anywhere in the policy.
pub(super) struct Known<'a> {
    pub secrets: &'a HashSet<String>,
    pub credentials: &'a HashSet<String>,
    /// `[ask]`'s terms and the notifiers, for the rule's `ask`.
    pub asks: &'a AskDefaults,
    /// Every `[limits.NAME]`, for the rule's `limits`.
    pub limits: &'a LimitNames,
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
        let (secrets, credentials) = (known.secrets, known.credentials);
        let before = self.errors.len();
        let at = |field: &str| format!("rules[{index}].{field}");
        let (span, raw) = (entry.span, entry.raw);

        let name = raw.name.as_ref().map(|n| n.get_ref().trim().to_string());
        if let (Some(raw_name), Some(name)) = (&raw.name, &name) {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
            {
                self.error(
                    raw_name.span(),
                    format!(
                        "{}: rule name {:?} must be non-empty and use only letters, digits, '-', '_', '.', ':'",
                        at("name"),
                        raw_name.get_ref()
                    ),
                );
            } else if name == super::ask::UNKNOWN {
                self.error(
                    raw_name.span(),
                    format!(
                        "{}: rule name \"unknown\" is reserved: approvals and grants for requests no rule allows go by it; rename the rule",
                        at("name")
                    ),
                );
            }
        }

        // A missing or mistyped `hosts` was reported while reading; errors about the hosts then
        // point at the rule.
        let hosts_span = raw.hosts.as_ref().map_or(span.clone(), |h| h.span());
        let raw_hosts = raw.hosts.map(|h| h.into_inner());
        if raw_hosts.as_ref().is_some_and(|h| h.is_empty()) {
            self.error(
                hosts_span.clone(),
                format!("{}: a rule needs at least one host", at("hosts")),
            );
        }
        let mut hosts = Vec::new();
        for (i, h) in raw_hosts.iter().flatten().enumerate() {
            match parse_host_pattern(h.get_ref()) {
                Ok(p) => hosts.push(p),
                Err(msg) => self.error(h.span(), format!("{}: {msg}", at(&format!("hosts[{i}]")))),
            }
        }

        let ports = raw.ports.map(|ports| {
            let span = ports.span();
            let ports = ports.into_inner();
            if ports.is_empty() {
                self.error(
                    span,
                    format!(
                        "{}: an empty list allows nothing; remove the key for the default port",
                        at("ports")
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
                            at(&format!("ports[{i}]")),
                            p.get_ref()
                        ),
                    ),
                }
            }
            out
        });

        let methods = raw.methods.map(|methods| {
            let span = methods.span();
            let methods = methods.into_inner();
            if methods.is_empty() {
                self.error(
                    span,
                    format!(
                        "{}: an empty list allows nothing; remove the key to allow every method",
                        at("methods")
                    ),
                );
            }
            let mut out = Vec::new();
            for (i, m) in methods.iter().enumerate() {
                let text = m.get_ref();
                let valid = !text.is_empty()
                    && text.chars().all(|c| {
                        c.is_ascii_uppercase() || c.is_ascii_digit() || c == '-' || c == '_'
                    });
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
                                at(&format!("methods[{i}]"))
                            ),
                        )
                    }
                }
            }
            out
        });

        let paths = raw.paths.and_then(|paths| {
            let span = paths.span();
            let paths = paths.into_inner();
            if paths.is_empty() {
                self.error(
                    span.clone(),
                    format!(
                        "{}: an empty list allows nothing; remove the key to allow every path",
                        at("paths")
                    ),
                );
            }
            let mut builder = GlobSetBuilder::new();
            let mut globs = Vec::new();
            for (i, p) in paths.iter().enumerate() {
                let text = p.get_ref();
                let field = at(&format!("paths[{i}]"));
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
                    self.error(span, format!("{}: {e}", at("paths")));
                    None
                }
            }
        });

        let tunnel = raw.tunnel.map(|t| (*t.get_ref(), t.span()));
        if let Some((true, tspan)) = &tunnel {
            if methods.is_some() || paths.is_some() || raw.inject.is_some() {
                self.error(
                    tspan.clone(),
                    format!(
                        "{}: a tunnel rule relays encrypted bytes that latchkey cannot see, so it cannot restrict methods or paths or inject headers; remove those keys or set tunnel = false",
                        at("tunnel")
                    ),
                );
            }
        }

        // A WebSocket handshake is a GET (RFC 6455 §4.1), and a tunnel is never looked inside.
        let websocket = match raw.websocket.map(|w| (*w.get_ref(), w.span())) {
            Some((true, wspan)) => {
                if matches!(tunnel, Some((true, _))) {
                    self.error(
                        wspan.clone(),
                        format!(
                            "{}: a tunnel rule relays bytes latchkey cannot see; a WebSocket is relayed frame by frame under an ordinary rule, so set tunnel = false",
                            at("websocket")
                        ),
                    );
                }
                if methods
                    .as_ref()
                    .is_some_and(|ms: &Vec<Method>| !ms.contains(&Method::GET))
                {
                    self.error(
                        wspan,
                        format!(
                            "{}: a WebSocket handshake is a GET, and this rule's methods leave GET out; add \"GET\" to methods",
                            at("websocket")
                        ),
                    );
                }
                true
            }
            _ => false,
        };

        let mut inject_headers = Vec::new();
        let mut inject_query = Vec::new();
        let mut inject_basic = None;
        let mut bound: BTreeSet<String> = BTreeSet::new();
        // A template's secrets must be declared; every referenced secret is bound.
        let mut template = |cx: &mut Self, field: &str, v: &toml::Spanned<String>| {
            match Template::parse(v.get_ref()) {
                Ok(t) => {
                    let mut ok = true;
                    for name in t.secrets() {
                        if !secrets.contains(name) {
                            cx.error(
                                v.span(),
                                format!(
                                    "{field}: unknown secret {name:?}: declare [secrets.{name}] with a source{}",
                                    super::did_you_mean(name, secrets.iter().map(String::as_str))
                                ),
                            );
                            ok = false;
                        }
                        bound.insert(name.to_string());
                    }
                    ok.then_some(t)
                }
                Err(e) => {
                    cx.error(v.span(), format!("{field}: {e}"));
                    None
                }
            }
        };
        let mut injected_names: Vec<HeaderName> = Vec::new();
        if let Some(inject) = raw.inject {
            for (k, v) in inject.headers {
                let field = at(&format!("inject.headers.{}", k.get_ref()));
                let name = match HeaderName::from_bytes(k.get_ref().as_bytes()) {
                    Ok(n) => n,
                    Err(_) => {
                        self.error(
                            k.span(),
                            format!("{field}: invalid header name {:?}", k.get_ref()),
                        );
                        continue;
                    }
                };
                if crate::wire::hop::is_hop_by_hop(&name) || name == http::header::HOST {
                    self.error(
                        k.span(),
                        format!(
                            "{field}: header {name} is managed by latchkey and cannot be injected"
                        ),
                    );
                    continue;
                }
                let literal_ok = v
                    .get_ref()
                    .bytes()
                    .all(|b| b == b'\t' || (b' '..=b'~').contains(&b));
                if !literal_ok {
                    self.error(
                        v.span(),
                        format!(
                            "{field}: header value is not valid (control characters or non-ASCII)"
                        ),
                    );
                    continue;
                }
                if let Some(t) = template(self, &field, &v) {
                    injected_names.push(name.clone());
                    inject_headers.push((name, t));
                }
            }
            for (k, v) in inject.query {
                let field = at(&format!("inject.query.{}", k.get_ref()));
                if k.get_ref().is_empty() {
                    self.error(k.span(), format!("{field}: empty query parameter name"));
                    continue;
                }
                if let Some(t) = template(self, &field, &v) {
                    inject_query.push((k.get_ref().clone(), t));
                }
            }
            if let Some(basic) = inject.basic_auth {
                // A missing user or password was reported while reading.
                let basic = basic.into_inner();
                if let Some(user) = basic.user.as_ref().filter(|u| u.get_ref().contains(':')) {
                    self.error(
                        user.span(),
                        format!(
                            "{}: a basic-auth user cannot contain ':'",
                            at("inject.basic_auth.user")
                        ),
                    );
                }
                let user = basic
                    .user
                    .as_ref()
                    .and_then(|u| template(self, &at("inject.basic_auth.user"), u));
                let password = basic
                    .password
                    .as_ref()
                    .and_then(|p| template(self, &at("inject.basic_auth.password"), p));
                if let (Some(u), Some(p)) = (user, password) {
                    injected_names.push(http::header::AUTHORIZATION);
                    inject_basic = Some((u, p));
                }
            }
        }
        if let Some(list) = raw.secrets {
            for (i, s) in list.into_inner().iter().enumerate() {
                if secrets.contains(s.get_ref()) {
                    bound.insert(s.get_ref().clone());
                } else {
                    self.error(
                        s.span(),
                        format!(
                            "{}: unknown secret {:?}: declare [secrets.{}] with a source{}",
                            at(&format!("secrets[{i}]")),
                            s.get_ref(),
                            s.get_ref(),
                            super::did_you_mean(s.get_ref(), secrets.iter().map(String::as_str))
                        ),
                    );
                }
            }
        }
        let placeholders_span = raw
            .placeholders
            .as_ref()
            .map(|p| p.span())
            .unwrap_or_default();
        let placeholders = match raw.placeholders {
            None => vec![Place::Header],
            Some(list) => {
                let mut out = Vec::new();
                for (i, p) in list.into_inner().iter().enumerate() {
                    match Place::parse(p.get_ref()) {
                        Some(place) => out.push(place),
                        None => self.error(
                            p.span(),
                            format!(
                                "{}: unknown place {:?}: use header, basic_auth, query, body or websocket",
                                at(&format!("placeholders[{i}]")),
                                p.get_ref()
                            ),
                        ),
                    }
                }
                out
            }
        };
        if placeholders.contains(&Place::WebSocket) && !websocket {
            self.error(
                placeholders_span,
                format!(
                    "{}: placeholders in websocket messages need the rule to allow WebSockets; add websocket = true",
                    at("placeholders")
                ),
            );
        }
        let mut keep_headers = Vec::new();
        if let Some(list) = raw.keep_headers {
            for (i, h) in list.into_inner().iter().enumerate() {
                match HeaderName::from_bytes(h.get_ref().as_bytes()) {
                    Ok(n) => keep_headers.push(n),
                    Err(_) => self.error(
                        h.span(),
                        format!(
                            "{}: invalid header name {:?}",
                            at(&format!("keep_headers[{i}]")),
                            h.get_ref()
                        ),
                    ),
                }
            }
        }
        let credential = match &raw.credential {
            None => None,
            Some(c) if credentials.contains(c.get_ref()) => {
                let name = c.get_ref().clone();
                bound.insert(crate::signing::token_name(&name));
                for field in [
                    "access_key_id",
                    "secret_access_key",
                    "session_token",
                    "private_key",
                    "key",
                    "client_secret",
                ] {
                    bound.insert(crate::signing::field_key(&name, field));
                }
                Some(name)
            }
            Some(c) => {
                self.error(
                    c.span(),
                    format!(
                        "{}: unknown credential {:?}: declare [credentials.{}]{}",
                        at("credential"),
                        c.get_ref(),
                        c.get_ref(),
                        super::did_you_mean(c.get_ref(), credentials.iter().map(String::as_str))
                    ),
                );
                None
            }
        };
        let report = match &raw.mode {
            None => false,
            Some(m) => match m.get_ref().as_str() {
                "enforce" => false,
                "report" => true,
                other => {
                    self.error(
                        m.span(),
                        format!(
                            "{}: unknown mode {other:?}: use \"enforce\" or \"report\"",
                            at("mode")
                        ),
                    );
                    false
                }
            },
        };
        let mut allow_private = Vec::new();
        if let Some(list) = raw.allow_private {
            for (i, c) in list.into_inner().iter().enumerate() {
                match crate::wire::cidr::Cidr::parse(c.get_ref()) {
                    Ok(cidr) => allow_private.push(cidr),
                    Err(e) => self.error(
                        c.span(),
                        format!("{}: {e}", at(&format!("allow_private[{i}]"))),
                    ),
                }
            }
        }
        let wildcard_ok = raw
            .dangerously_inject_into_wildcard
            .as_ref()
            .is_some_and(|b| *b.get_ref());
        if !bound.is_empty()
            && !wildcard_ok
            && hosts.iter().any(|h| matches!(h, HostPattern::Wildcard(_)))
        {
            self.error(
                hosts_span.clone(),
                format!(
                    "{}: rule binds secret(s) {} to a wildcard host, so every matching host would receive them; name the hosts, or set dangerously_inject_into_wildcard = true",
                    at("hosts"),
                    bound.iter().map(|b| format!("{b:?}")).collect::<Vec<_>>().join(", ")
                ),
            );
        }
        if matches!(tunnel, Some((true, _))) && credential.is_some() {
            self.error(
                hosts_span.clone(),
                format!("{}: a tunnel rule cannot use a credential: latchkey cannot see inside the tunnel", at("credential")),
            );
        }
        if matches!(tunnel, Some((true, _))) && !bound.is_empty() && credential.is_none() {
            self.error(
                hosts_span.clone(),
                format!(
                    "{}: a tunnel rule cannot bind secrets: latchkey cannot see inside the tunnel",
                    at("secrets")
                ),
            );
        }
        let ask = raw.ask.as_ref().and_then(|a| {
            let field = at("ask");
            if matches!(tunnel, Some((true, _))) {
                self.error(
                    a.span(),
                    format!("{field}: a tunnel rule cannot ask a person: latchkey cannot see inside the tunnel; remove ask or set tunnel = false"),
                );
            }
            if report {
                self.error(
                    a.span(),
                    format!("{field}: a rule in mode = \"report\" lets requests through and cannot also hold them for a person; remove ask or mode"),
                );
            }
            let d = known.asks;
            self.ask_terms(&field, a.get_ref(), &d.terms, &d.notifiers, d.expire)
        });

        let limits = self.limit_list(
            &at("limits"),
            raw.limits,
            known.limits,
            matches!(tunnel, Some((true, _))),
        );

        let is_tunnel = matches!(tunnel, Some((true, _)));
        let mcp = raw
            .mcp
            .and_then(|m| self.mcp(&at("mcp"), m, is_tunnel, websocket, methods.as_ref()))
            .map(std::sync::Arc::new);
        let capture = raw
            .capture
            .and_then(|c| self.capture(&at("capture"), c, is_tunnel, &hosts, secrets));

        let raw_schemes = RawSchemes {
            schemes: raw.schemes,
            cleartext: raw.dangerously_allow_cleartext,
        };
        let mut rule = Rule {
            name: name.clone().unwrap_or_default(),
            description: raw.description,
            hosts,
            ports,
            methods,
            paths,
            tunnel: matches!(tunnel, Some((true, _))),
            websocket,
            inject_headers,
            inject_query,
            inject_basic,
            injected_names,
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
            origin,
        };
        self.rule_schemes(&mut rule, raw_schemes, index);
        if self.errors.len() > before || !entry.complete || name.is_none() {
            return None;
        }
        Some(rule)
    }

    /// Compiles a rule's `mcp` table; reports every problem and returns `None` if any.
    fn mcp(
        &mut self,
        field: &str,
        raw: toml::Spanned<RawMcp>,
        tunnel: bool,
        websocket: bool,
        methods: Option<&Vec<Method>>,
    ) -> Option<McpRules> {
        let before = self.errors.len();
        let span = raw.span();
        let raw = raw.into_inner();
        if tunnel {
            self.error(
                span.clone(),
                format!("{field}: a tunnel rule relays bytes latchkey cannot see, so it cannot read MCP messages; set tunnel = false"),
            );
        }
        // Under `websocket = true` the messages may all ride the socket its GET opens.
        if !websocket && methods.is_some_and(|ms| !ms.contains(&Method::POST)) {
            self.error(
                span.clone(),
                format!("{field}: MCP messages are POSTs (or WebSocket messages, under websocket = true), and this rule's methods leave POST out; add \"POST\" to methods"),
            );
        }
        let list = |cx: &mut Self,
                    key: &str,
                    v: Option<toml::Spanned<Vec<toml::Spanned<String>>>>,
                    segments: bool| {
            let v = v?;
            let vspan = v.span();
            let globs: Vec<String> = v.into_inner().into_iter().map(|g| g.into_inner()).collect();
            if globs.is_empty() {
                cx.error(
                    vspan,
                    format!("{field}.{key}: an empty list allows nothing; remove the key"),
                );
                return None;
            }
            match NameGlobs::new(&globs, segments) {
                Ok(g) => Some(g),
                Err(e) => {
                    cx.error(vspan, format!("{field}.{key}: {e}"));
                    None
                }
            }
        };
        let tools = list(self, "tools", raw.tools, false);
        let deny_tools = list(self, "deny_tools", raw.deny_tools, false);
        let methods = match raw.methods {
            Some(m) => list(self, "methods", Some(m), false),
            None => {
                let defaults: Vec<String> = DEFAULT_METHODS.iter().map(|m| m.to_string()).collect();
                NameGlobs::new(&defaults, false).ok()
            }
        };
        let mut args = Vec::new();
        for (name, glob) in raw.args {
            match NameGlobs::new(std::slice::from_ref(glob.get_ref()), true) {
                Ok(g) => args.push((name.into_inner(), g)),
                Err(e) => self.error(glob.span(), format!("{field}.args.{}: {e}", name.get_ref())),
            }
        }
        if self.errors.len() > before {
            return None;
        }
        Some(McpRules {
            tools,
            deny_tools,
            methods: methods?,
            args,
            filter_list: raw.filter_list.is_none_or(|f| *f.get_ref()),
        })
    }

    /// Compiles a rule's `capture` table; reports every problem and returns `None` if any.
    fn capture(
        &mut self,
        field: &str,
        raw: toml::Spanned<RawCapture>,
        tunnel: bool,
        rule_hosts: &[HostPattern],
        secrets: &HashSet<String>,
    ) -> Option<Capture> {
        let before = self.errors.len();
        let span = raw.span();
        let raw = raw.into_inner();
        if tunnel {
            self.error(
                span.clone(),
                format!("{field}: a tunnel rule relays bytes latchkey cannot see, so it cannot capture tokens; set tunnel = false"),
            );
        }
        let name = raw.name.map(|n| (n.span(), n.into_inner()));
        let fields: Vec<(std::ops::Range<usize>, String)> = raw
            .fields
            .map(|f| {
                f.into_inner()
                    .into_iter()
                    .map(|f| (f.span(), f.into_inner()))
                    .collect()
            })
            .unwrap_or_default();
        if let Some((nspan, n)) = &name {
            if fields.is_empty() {
                self.error(
                    span.clone(),
                    format!("{field}.fields: name at least one field to capture, e.g. [\"access_token\", \"refresh_token\"]"),
                );
            }
            for (fspan, f) in &fields {
                let derived = format!("{n}_{f}");
                if !valid_name(f) || !valid_name(&derived) {
                    self.error(
                        fspan.clone(),
                        format!("{field}.fields: {f:?} and `as` {n:?} must make a secret name {derived:?} of letters, digits, '-' and '_' (at most 64, no \"__\")"),
                    );
                } else if secrets.contains(&derived) {
                    self.error(
                        nspan.clone(),
                        format!("{field}.as: captured token {derived:?} would have the name of a declared secret; choose another `as`"),
                    );
                }
            }
        }
        let mut hosts = Vec::new();
        match raw.hosts {
            Some(list) => {
                for (i, h) in list.into_inner().iter().enumerate() {
                    match parse_host_pattern(h.get_ref()) {
                        Ok(HostPattern::Wildcard(_)) => self.error(
                            h.span(),
                            format!("{field}.hosts[{i}]: a captured token is bound to named hosts only, not a wildcard"),
                        ),
                        Ok(p) => hosts.push(p),
                        Err(msg) => self.error(h.span(), format!("{field}.hosts[{i}]: {msg}")),
                    }
                }
            }
            None => {
                if rule_hosts
                    .iter()
                    .any(|h| matches!(h, HostPattern::Wildcard(_)))
                {
                    self.error(
                        span.clone(),
                        format!("{field}: the rule's hosts include a wildcard; name the hosts the captured tokens may go to in {field}.hosts"),
                    );
                }
                hosts = rule_hosts.to_vec();
            }
        }
        let ttl = match raw.ttl {
            None => None,
            Some(t) => match humantime::parse_duration(t.get_ref()) {
                Ok(d) if !d.is_zero() => Some(d),
                _ => {
                    self.error(
                        t.span(),
                        format!(
                            "{field}.ttl: {:?} is not a duration such as \"1h\"",
                            t.get_ref()
                        ),
                    );
                    None
                }
            },
        };
        if self.errors.len() > before {
            return None;
        }
        let (_, name) = name?;
        Some(Capture {
            name,
            fields: fields.into_iter().map(|(_, f)| f).collect(),
            hosts,
            ttl,
            cleartext: false,
        })
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

//! A rule's feature tables, each validated whole: `mcp` (JSON-RPC rules for an MCP server) and
//! `capture` (tokens kept from responses).

use std::collections::HashSet;

use http::Method;

use super::super::compile::FileCx;
use super::super::mcp::{McpRules, NameGlobs, DEFAULT_METHODS};
use super::super::schema::{RawCapture, RawMcp};
use super::super::{Capture, HostPattern};
use super::parse_host_pattern;
use crate::secrets::template::valid_name;

impl FileCx<'_> {
    /// Compiles a rule's `mcp` table; reports every problem and returns `None` if any.
    pub(super) fn mcp(
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
    pub(super) fn capture(
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

//! What a rule binds and sends: `inject` (headers, query parameters, basic auth, a path
//! prefix), `secrets`,
//! `placeholders`, `keep_headers`, `credential` and `ask`, and the checks across them (a secret
//! bound to a wildcard host, a tunnel that would have to see inside).

use std::collections::{BTreeSet, HashSet};

use http::HeaderName;
use toml::Spanned;

use super::super::ask::Ask;
use super::super::ask_compile::AskDefaults;
use super::super::compile::FileCx;
use super::super::schema::{RawAsk, RawInject};
use super::super::HostPattern;
use super::{at, Hosts, List};
use crate::secrets::placeholder::Place;
use crate::secrets::Template;

/// A rule's `inject`, compiled.
#[derive(Default)]
pub(super) struct Injected {
    pub(super) headers: Vec<(HeaderName, Template)>,
    pub(super) query: Vec<(String, Template)>,
    pub(super) basic: Option<(Template, Template)>,
    /// Every header the injection sets (`Authorization` for basic auth).
    pub(super) names: Vec<HeaderName>,
    pub(super) path_prefix: Option<Template>,
}

impl FileCx<'_> {
    /// One injected value: a template whose secrets must be declared; every secret it names is
    /// bound to the rule.
    fn template(
        &mut self,
        field: &str,
        v: &Spanned<String>,
        secrets: &HashSet<String>,
        bound: &mut BTreeSet<String>,
    ) -> Option<Template> {
        match Template::parse(v.get_ref()) {
            Ok(t) => {
                let mut ok = true;
                for name in t.secrets() {
                    if !secrets.contains(name) {
                        self.error(
                            v.span(),
                            format!(
                                "{field}: unknown secret {name:?}: declare [secrets.{name}] with a source{}",
                                super::super::did_you_mean(name, secrets.iter().map(String::as_str))
                            ),
                        );
                        ok = false;
                    }
                    bound.insert(name.to_string());
                }
                ok.then_some(t)
            }
            Err(e) => {
                self.error(v.span(), format!("{field}: {e}"));
                None
            }
        }
    }

    /// A rule's `inject` table: headers, query parameters and basic auth.
    pub(super) fn rule_inject(
        &mut self,
        index: usize,
        inject: RawInject,
        secrets: &HashSet<String>,
        bound: &mut BTreeSet<String>,
    ) -> Injected {
        let at = |field: &str| at(index, field);
        let mut out = Injected::default();
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
                    format!("{field}: header {name} is managed by latchkey and cannot be injected"),
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
                    format!("{field}: header value is not valid (control characters or non-ASCII)"),
                );
                continue;
            }
            if let Some(t) = self.template(&field, &v, secrets, bound) {
                out.names.push(name.clone());
                out.headers.push((name, t));
            }
        }
        for (k, v) in inject.query {
            let field = at(&format!("inject.query.{}", k.get_ref()));
            if k.get_ref().is_empty() {
                self.error(k.span(), format!("{field}: empty query parameter name"));
                continue;
            }
            if let Some(t) = self.template(&field, &v, secrets, bound) {
                out.query.push((k.get_ref().clone(), t));
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
                .and_then(|u| self.template(&at("inject.basic_auth.user"), u, secrets, bound));
            let password = basic
                .password
                .as_ref()
                .and_then(|p| self.template(&at("inject.basic_auth.password"), p, secrets, bound));
            if let (Some(u), Some(p)) = (user, password) {
                out.names.push(http::header::AUTHORIZATION);
                out.basic = Some((u, p));
            }
        }
        if let Some(prefix) = inject.path_prefix {
            let field = at("inject.path_prefix");
            out.path_prefix =
                self.template(&field, &prefix, secrets, bound).filter(
                    |t| match path_prefix_problem(&t.shape("x")) {
                        None => true,
                        Some(why) => {
                            self.error(prefix.span(), format!("{field}: {why}"));
                            false
                        }
                    },
                );
        }
        out
    }

    /// A rule's `secrets`: each must be declared, and is bound to the rule.
    pub(super) fn rule_secrets(
        &mut self,
        index: usize,
        list: Option<List>,
        secrets: &HashSet<String>,
        bound: &mut BTreeSet<String>,
    ) {
        let Some(list) = list else { return };
        for (i, s) in list.into_inner().iter().enumerate() {
            if secrets.contains(s.get_ref()) {
                bound.insert(s.get_ref().clone());
            } else {
                self.error(
                    s.span(),
                    format!(
                        "{}: unknown secret {:?}: declare [secrets.{}] with a source{}",
                        at(index, &format!("secrets[{i}]")),
                        s.get_ref(),
                        s.get_ref(),
                        super::super::did_you_mean(s.get_ref(), secrets.iter().map(String::as_str))
                    ),
                );
            }
        }
    }

    /// A rule's `placeholders` (header only when absent); websocket needs `websocket = true`.
    pub(super) fn rule_placeholders(
        &mut self,
        index: usize,
        list: Option<List>,
        websocket: bool,
    ) -> Vec<Place> {
        let placeholders_span = list.as_ref().map(|p| p.span()).unwrap_or_default();
        let placeholders = match list {
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
                                at(index, &format!("placeholders[{i}]")),
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
                    at(index, "placeholders")
                ),
            );
        }
        placeholders
    }

    /// A rule's `keep_headers`: header names.
    pub(super) fn rule_keep_headers(
        &mut self,
        index: usize,
        list: Option<List>,
    ) -> Vec<HeaderName> {
        let mut keep_headers = Vec::new();
        let Some(list) = list else {
            return keep_headers;
        };
        for (i, h) in list.into_inner().iter().enumerate() {
            match HeaderName::from_bytes(h.get_ref().as_bytes()) {
                Ok(n) => keep_headers.push(n),
                Err(_) => self.error(
                    h.span(),
                    format!(
                        "{}: invalid header name {:?}",
                        at(index, &format!("keep_headers[{i}]")),
                        h.get_ref()
                    ),
                ),
            }
        }
        keep_headers
    }

    /// A rule's `credential`: declared, and its key material bound to the rule.
    pub(super) fn rule_credential(
        &mut self,
        index: usize,
        credential: Option<&Spanned<String>>,
        credentials: &HashSet<String>,
        bound: &mut BTreeSet<String>,
    ) -> Option<String> {
        match credential {
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
                        at(index, "credential"),
                        c.get_ref(),
                        c.get_ref(),
                        super::super::did_you_mean(
                            c.get_ref(),
                            credentials.iter().map(String::as_str)
                        )
                    ),
                );
                None
            }
        }
    }

    /// What a rule binds, against where it sends it: no secret to a wildcard host unless the
    /// rule says so, and neither a credential nor a secret through a tunnel.
    pub(super) fn rule_binding(
        &mut self,
        index: usize,
        hosts: &Hosts,
        bound: &BTreeSet<String>,
        wildcard_ok: bool,
        tunnel: bool,
        credential: bool,
    ) {
        let at = |field: &str| at(index, field);
        if !bound.is_empty()
            && !wildcard_ok
            && hosts
                .list
                .iter()
                .any(|h| matches!(h, HostPattern::Wildcard(_)))
        {
            self.error(
                hosts.span.clone(),
                format!(
                    "{}: rule binds secret(s) {} to a wildcard host, so every matching host would receive them; name the hosts, or set dangerously_inject_into_wildcard = true",
                    at("hosts"),
                    bound.iter().map(|b| format!("{b:?}")).collect::<Vec<_>>().join(", ")
                ),
            );
        }
        if tunnel && credential {
            self.error(
                hosts.span.clone(),
                format!("{}: a tunnel rule cannot use a credential: latchkey cannot see inside the tunnel", at("credential")),
            );
        }
        if tunnel && !bound.is_empty() && !credential {
            self.error(
                hosts.span.clone(),
                format!(
                    "{}: a tunnel rule cannot bind secrets: latchkey cannot see inside the tunnel",
                    at("secrets")
                ),
            );
        }
    }

    /// A rule's `ask`: not on a tunnel, not in report mode; its terms resolved against `[ask]`.
    pub(super) fn rule_ask(
        &mut self,
        index: usize,
        a: &Spanned<RawAsk>,
        tunnel: bool,
        report: bool,
        d: &AskDefaults,
    ) -> Option<Ask> {
        let field = at(index, "ask");
        if tunnel {
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
        self.ask_terms(&field, a.get_ref(), &d.terms, &d.notifiers, d.expire)
    }
}

/// What is wrong with a path prefix's literal shape (each reference stood in for by one safe
/// character), if anything: it must be an absolute path of whole segments that each stay as
/// written — no query, fragment, percent-escape, empty or dot segment, trailing `/`.
fn path_prefix_problem(shape: &str) -> Option<String> {
    if !shape.starts_with('/') {
        return Some(format!(
            "{shape:?} must start with '/' (it is prepended to the path: \"/bot{{{{secret.NAME}}}}\")"
        ));
    }
    if shape.ends_with('/') {
        return Some(
            "must not end with '/': the sandbox's path, which starts with one, follows it"
                .to_string(),
        );
    }
    if let Some(c) = shape.chars().find(|c| {
        *c != '/' && !u8::try_from(*c).is_ok_and(crate::secrets::inject::path_segment_byte)
    }) {
        return Some(format!(
            "{c:?} is not allowed in a path prefix (allowed: '/', letters, digits and -._~!$&'()*+,;=:@; no query, fragment or percent-escape)"
        ));
    }
    if shape[1..]
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Some("must not have an empty, '.' or '..' segment".to_string());
    }
    None
}

//! The decision, over the compiled policy: one request ([`Policy::decide`]) or one CONNECT
//! ([`Policy::decide_connect`]), deny by default, first match wins (the order is in the crate
//! docs). An identity's `rules`, and a runtime session's narrowing of its profile, decide which
//! candidates it may use.

use super::deny::{connect_level, deny_port};
use super::identity::{Identity, DEFAULT_IDENTITY};
use super::predicates::{Polarity, MAX_BODY};
use super::profile::Narrowing;
use super::{
    display_authority, join, BodyCheck, ConnectDecision, Decision, Policy, Rule, Scheme, Target,
    UrlDisplay,
};
use crate::reason::Reason;

/// The refusal of a request or CONNECT by denial `d`.
fn denied(d: &Rule) -> Decision<'_> {
    Decision {
        reason: Reason::DeniedByRule,
        rule: Some(d),
        message: super::deny::message(d),
        body: None,
    }
}

impl Policy {
    /// Decides one HTTP request. An allow carries an empty message: the proxy's allow path is
    /// the hot one and never reads it ([`Self::decide_explained`] words it too).
    ///
    /// Denials first, for every identity: the first whose matchers and head predicates hold
    /// refuses; one that also reads the body is left pending in the allow's
    /// [`Decision::body`], with the allowing rule's own body predicates.
    pub fn decide(&self, t: &Target<'_>) -> Decision<'_> {
        let mut pending = Vec::new();
        for d in self.denials_for(t.host) {
            let head = deny_port(d, t.port)
                && d.method_matches(t.method)
                && d.path_matches(t.path)
                && d.predicates
                    .as_ref()
                    .is_none_or(|p| p.head(Polarity::Select, t.query, t.headers).is_ok());
            if !head {
                continue;
            }
            match &d.predicates {
                Some(p) if p.needs_body() => pending.push(d),
                _ => return denied(d),
            }
        }
        let mut decision = self.decide_rules(t);
        if let (true, Some(rule)) = (decision.allowed(), decision.rule) {
            let own = rule.predicates.as_ref().is_some_and(|p| p.needs_body());
            if own || !pending.is_empty() {
                decision.body = Some(BodyCheck {
                    denials: pending,
                    rule: own.then_some(rule),
                    max_bytes: MAX_BODY,
                });
            }
        }
        decision
    }

    /// The final decision once the body is read, for a decision whose [`Decision::body`] is
    /// `Some` (any other is returned as is): a pending denial whose body predicates hold (or
    /// that cannot read the body: fail closed) refuses with `denied_by_rule`; the allowing
    /// rule's body predicates failing refuse with `predicate_mismatch` (later rules are not
    /// tried); otherwise the allow stands.
    pub fn decide_body<'p>(
        &'p self,
        d: &Decision<'p>,
        method: &http::Method,
        query: Option<&str>,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Decision<'p> {
        let Some(check) = &d.body else {
            return d.clone();
        };
        for &deny in &check.denials {
            let applies = deny.predicates.as_ref().is_none_or(|p| {
                p.body(Polarity::Select, method, query, content_type, body)
                    .is_ok()
            });
            if applies {
                return denied(deny);
            }
        }
        if let Some(rule) = check.rule {
            let held = rule.predicates.as_ref().map_or(Ok(()), |p| {
                p.body(Polarity::Require, method, query, content_type, body)
            });
            if let Err(why) = held {
                return Decision {
                    reason: Reason::PredicateMismatch,
                    rule: Some(rule),
                    message: format!(
                        "no rule allows this {method} request: rule '{}' {why}",
                        rule.name
                    ),
                    body: None,
                };
            }
        }
        Decision {
            body: None,
            ..d.clone()
        }
    }

    /// [`Self::decide`] by the rules alone, after the denials.
    fn decide_rules(&self, t: &Target<'_>) -> Decision<'_> {
        // Built only where a message needs it: the allow path is the hot one.
        let url = UrlDisplay(t.scheme, t.host, t.port, t.path);
        // The closest miss, ranked port < method < path.
        let mut closest: Option<(Reason, &Rule)> = None;
        let mut note = |reason: Reason, rule| {
            let rank = |r: Reason| match r {
                Reason::PortNotAllowed => 1,
                Reason::MethodNotAllowed => 2,
                Reason::PathNotAllowed => 3,
                Reason::WebSocketNotAllowed => 4,
                Reason::CredentialNeedsTls | Reason::SchemeNotAllowed => 5,
                Reason::PredicateMismatch => 6,
                _ => 0,
            };
            if closest.is_none_or(|(r, _)| rank(reason) > rank(r)) {
                closest = Some((reason, rule));
            }
        };
        for rule in self.candidates(t.host) {
            if !may_use(t.identity, t.narrowing, rule, t.host) {
                note(Reason::IdentityNotAllowed, rule);
            } else if !rule.port_matches(t.scheme, t.port) {
                note(Reason::PortNotAllowed, rule);
            } else if rule.tunnel {
                // A tunnel rule allows raw CONNECT relays only; it says nothing about requests
                // latchkey can see, so it never allows one.
                note(Reason::MethodNotAllowed, rule);
            } else if !rule.method_matches(t.method) {
                note(Reason::MethodNotAllowed, rule);
            } else if !rule.path_matches(t.path) {
                note(Reason::PathNotAllowed, rule);
            } else if t.websocket && !rule.websocket {
                note(Reason::WebSocketNotAllowed, rule);
            } else if !rule.schemes.allows(t.scheme) {
                // Last: this rule would allow the request, sent another way. A credential it
                // brokers never goes in cleartext (nothing is sent, nothing rendered).
                note(rule.scheme_refusal(t.scheme), rule);
            } else if head_fails(rule, t).is_some() {
                note(Reason::PredicateMismatch, rule);
            } else {
                return Decision {
                    reason: Reason::Allowed,
                    rule: Some(rule),
                    message: String::new(),
                    body: None,
                };
            }
        }
        let Some((reason, rule)) = closest else {
            return Decision {
                reason: Reason::NoRule,
                rule: None,
                message: format!(
                    "no rule allows {} {url}: no rule names host {}",
                    t.method, t.host
                ),
                body: None,
            };
        };
        let why = match reason {
            Reason::IdentityNotAllowed => not_allowed(t.identity, t.narrowing, rule, t.host),
            Reason::PortNotAllowed => format!(
                "rule '{}' allows host {} on port(s) {}",
                rule.name,
                t.host,
                join(rule.ports_for(t.scheme))
            ),
            Reason::MethodNotAllowed if rule.tunnel => format!(
                "rule '{}' only allows CONNECT tunnels to this host",
                rule.name
            ),
            Reason::MethodNotAllowed => format!(
                "rule '{}' allows only {}",
                rule.name,
                join(rule.methods.iter().flatten())
            ),
            Reason::WebSocketNotAllowed => format!(
                "rule '{}' does not allow WebSocket upgrades (websocket = true allows them)",
                rule.name
            ),
            Reason::CredentialNeedsTls => format!(
                "rule '{}' brokers {} and applies only to requests latchkey sends over TLS: a credential never travels in cleartext; send it as https://",
                rule.name,
                rule.brokered().unwrap_or_default()
            ),
            Reason::SchemeNotAllowed => format!(
                "rule '{}' covers only schemes {}",
                rule.name,
                rule.schemes.listed()
            ),
            Reason::PredicateMismatch => format!(
                "rule '{}' {}",
                rule.name,
                head_fails(rule, t).unwrap_or_default()
            ),
            _ => format!(
                "rule '{}' allows only paths {}",
                rule.name,
                join(rule.paths.iter().flat_map(|p| p.globs.iter()))
            ),
        };
        Decision {
            reason,
            rule: Some(rule),
            message: format!("no rule allows {} {url}: {why}", t.method),
            body: None,
        }
    }

    /// [`Self::decide`], with the sentence for an allow as well (`explain`, `test`).
    pub fn decide_explained(&self, t: &Target<'_>) -> Decision<'_> {
        let mut d = self.decide(t);
        if let (Reason::Allowed, Some(rule)) = (d.reason, d.rule) {
            let url = UrlDisplay(t.scheme, t.host, t.port, t.path);
            d.message = format!("rule '{}' allows {} {url}", rule.name, t.method);
        }
        d
    }

    /// Decides a `CONNECT host:port` before any TLS: refuse unless some rule could allow a
    /// request to this host and port. With `[ask] unknown = true` a policy refusal
    /// (`no_rule`, `port_not_allowed`, `identity_not_allowed`) is an intercept instead, so each
    /// inner request can be asked about. (The DNS resolver still answers only hosts a rule
    /// names: `names::could_allow_host` does not change with `[ask]`.)
    pub fn decide_connect(
        &self,
        host: &str,
        port: u16,
        identity: Option<&Identity>,
    ) -> ConnectDecision<'_> {
        self.decide_connect_narrowed(host, port, identity, None)
    }

    /// [`Self::decide_connect`] for a runtime session: `identity` is its profile, and
    /// `narrowing` what the session narrowed of it.
    pub fn decide_connect_narrowed(
        &self,
        host: &str,
        port: u16,
        identity: Option<&Identity>,
        narrowing: Option<&Narrowing>,
    ) -> ConnectDecision<'_> {
        // A denial of this host and port alone refuses before any TLS, for every identity, and
        // is never turned into a question.
        if let Some(d) = self
            .denials_for(host)
            .find(|d| connect_level(d) && deny_port(d, port))
        {
            return ConnectDecision::Deny(denied(d));
        }
        match self.decide_connect_by_rules(host, port, identity, narrowing) {
            ConnectDecision::Deny(d) if self.ask.unknown && d.reason.is_policy_denial() => {
                ConnectDecision::Intercept
            }
            other => other,
        }
    }

    /// [`Self::decide_connect`] by the rules alone, before `[ask] unknown`.
    fn decide_connect_by_rules(
        &self,
        host: &str,
        port: u16,
        identity: Option<&Identity>,
        narrowing: Option<&Narrowing>,
    ) -> ConnectDecision<'_> {
        let mut port_miss = None;
        let mut identity_miss = None;
        let mut scheme_miss = None;
        for rule in self.candidates(host) {
            if !may_use(identity, narrowing, rule, host) {
                identity_miss.get_or_insert(rule);
                continue;
            }
            if !rule.port_matches(Scheme::Https, port) {
                port_miss.get_or_insert(rule);
                continue;
            }
            // Every request inside an interception is sent over TLS: a rule for plain http
            // only can allow none of them.
            if !rule.tunnel && !rule.schemes.allows(Scheme::Https) {
                scheme_miss.get_or_insert(rule);
                continue;
            }
            // The first candidate that matches host and port decides how the bytes are handled.
            return if rule.tunnel {
                ConnectDecision::Tunnel(rule)
            } else {
                ConnectDecision::Intercept
            };
        }
        let target = display_authority(host, port);
        ConnectDecision::Deny(match (scheme_miss, port_miss, identity_miss) {
            (Some(rule), _, _) => Decision {
                reason: Reason::SchemeNotAllowed,
                rule: Some(rule),
                message: format!(
                    "no rule allows CONNECT {target}: rule '{}' covers only schemes {}",
                    rule.name,
                    rule.schemes.listed()
                ),
                body: None,
            },
            (None, None, Some(rule)) => Decision {
                reason: Reason::IdentityNotAllowed,
                rule: Some(rule),
                message: format!(
                    "no rule allows CONNECT {target}: {}",
                    not_allowed(identity, narrowing, rule, host)
                ),
                body: None,
            },
            (None, Some(rule), _) => Decision {
                reason: Reason::PortNotAllowed,
                rule: Some(rule),
                message: format!(
                    "no rule allows CONNECT {target}: rule '{}' allows host {host} on port(s) {}",
                    rule.name,
                    join(rule.ports_for(Scheme::Https))
                ),
                body: None,
            },
            (None, None, None) => Decision {
                reason: Reason::NoRule,
                rule: None,
                message: format!("no rule allows CONNECT {target}: no rule names host {host}"),
                body: None,
            },
        })
    }
}

/// Why `rule`'s head predicates (`query`, `headers`) refuse the request, if they do.
fn head_fails(rule: &Rule, t: &Target<'_>) -> Option<String> {
    let p = rule.predicates.as_ref()?;
    p.head(Polarity::Require, t.query, t.headers).err()
}

/// Whether `identity` (narrowed by its session's `narrowing`) may use `rule` for `host`.
fn may_use(
    identity: Option<&Identity>,
    narrowing: Option<&Narrowing>,
    rule: &Rule,
    host: &str,
) -> bool {
    identity.is_none_or(|i| i.rules.allows(&rule.name))
        && narrowing.is_none_or(|n| n.admits(rule, host))
}

/// Why [`may_use`] said no, in a sentence.
fn not_allowed(
    identity: Option<&Identity>,
    narrowing: Option<&Narrowing>,
    rule: &Rule,
    host: &str,
) -> String {
    let name = identity.map_or(DEFAULT_IDENTITY, |i| i.name.as_str());
    match narrowing {
        Some(n) if identity.is_none_or(|i| i.rules.allows(&rule.name)) => {
            if n.admits_host(host) {
                format!("this session of profile '{name}' was narrowed to secrets that rule '{}' does not stay within", rule.name)
            } else {
                format!("this session of profile '{name}' was narrowed to hosts that do not include {host}")
            }
        }
        _ => format!("identity '{name}' may not use rule '{}'", rule.name),
    }
}

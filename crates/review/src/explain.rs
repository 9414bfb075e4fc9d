//! `explain`: what policy decides for one request, why, and why every other candidate rule did
//! not decide it. Used by `latchkey explain`, `latchkey test` and (later) the admin API.
//!
//! The decision is the proxy's own, step for step: an unidentified client when identities are
//! configured is refused, a URL with userinfo is refused, an `https` URL first passes the CONNECT
//! gate ([`Policy::decide_connect`]), a path with dot segments or encoded slashes is refused, then
//! [`Policy::decide`]. A decision [`Policy::asks`] about is the verdict `ask`, with its terms.
//! Secrets and injected headers are listed by name only; values are never read (an explanation
//! works on a policy loaded without them).
//!
//! ```text
//! let e = explain(&policy, None, "POST", "https://api.github.com/zen")?;
//! assert_eq!(e.decision, Verdict::Deny);
//! assert_eq!(e.reason, "method_not_allowed");
//! ```

use http::{Method, Uri};
use serde::Serialize;

use crate::policy::identity::{Identity, DEFAULT_IDENTITY};
use crate::policy::predicates::Polarity;
use crate::policy::{display_url, normalize_host, ConnectDecision, Policy, Rule, Scheme, Target};
use crate::reason::Reason;

/// Allow, deny or ask a person, as printed and serialised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Deny,
    /// The request waits for a person ([`Policy::asks`]): an allow under a rule with `ask`, or
    /// a policy denial under `[ask] unknown = true`.
    Ask,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::Ask => "ask",
        }
    }
}

/// Why and on what terms a request asks a person (the `ask` of an [`Explanation`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AskExplained {
    /// The rule with `ask`, or `unknown` (`[ask] unknown = true`).
    pub rule: String,
    /// How long the request is held (`0s`: not held).
    pub hold: String,
    /// What an approver may grant; the first is the default.
    pub scopes: Vec<String>,
    pub message: Option<String>,
    /// The notifiers told, resolved (a rule naming none tells every `[notify.*]`).
    pub notify: Vec<String>,
}

impl AskExplained {
    /// `rule 'prod-writes'; hold 30s; scopes once, 1h` (or `[ask] unknown = true; …`), for the
    /// text output and test failures.
    pub fn summary(&self) -> String {
        let why = if self.rule == crate::policy::ask::UNKNOWN {
            "[ask] unknown = true".to_string()
        } else {
            format!("rule '{}'", self.rule)
        };
        let notify = if self.notify.is_empty() {
            "no notifier".to_string()
        } else {
            format!("notifies {}", self.notify.join(", "))
        };
        format!(
            "{why}; hold {}; scopes {}; {notify}",
            self.hold,
            self.scopes.join(", ")
        )
    }
}

/// One limit an allowed request is charged to (the `limits` of an [`Explanation`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LimitExplained {
    pub name: String,
    /// Whose requests share its counters: identity, rule, credential or global.
    pub per: &'static str,
    /// Each measure it sets and its terms: `"requests": "100/min"`, `"spend": "20 USD/day"`.
    pub measures: std::collections::BTreeMap<&'static str, String>,
    /// What a request gets when the state store cannot answer: deny or allow.
    pub on_store_error: &'static str,
    /// [`crate::policy::Limit::summary`], for the text output.
    pub summary: String,
}

/// The first check a candidate rule failed, or `Matched`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The identity asking may not use this rule.
    Identity,
    /// The rule does not allow this port.
    Port,
    /// A `tunnel = true` rule: it relays CONNECT bytes and never allows a request it can see.
    Tunnel,
    /// The rule does not allow this method.
    Method,
    /// No path glob of the rule matches.
    Path,
    /// A WebSocket handshake under a rule without `websocket = true`.
    WebSocket,
    /// The rule does not cover the scheme latchkey would send the request with: a rule that
    /// brokers a credential covers `https` only (`credential_needs_tls`), or its `schemes`
    /// leave it out.
    Scheme,
    /// A predicate (`query`, `headers`, `body`, `graphql`) of the rule does not hold; for a
    /// denial, one does not select the request.
    Predicate,
    /// Every check passed.
    Matched,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Identity => "identity",
            Outcome::Port => "port",
            Outcome::Tunnel => "tunnel",
            Outcome::Method => "method",
            Outcome::Path => "path",
            Outcome::WebSocket => "websocket",
            Outcome::Scheme => "scheme",
            Outcome::Predicate => "predicate",
            Outcome::Matched => "matched",
        }
    }
}

/// One rule whose host patterns match the request's host, in decision order.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    pub rule: String,
    /// `file:line` of the rule.
    pub origin: String,
    pub outcome: Outcome,
    /// Whether this rule is the one that decided the request (the allowing rule, or the one a
    /// denial names).
    pub decides: bool,
    /// What the rule allows for the failed check, e.g. `allows only GET, HEAD`.
    pub detail: String,
    /// A `[[deny]]` table (checked before every rule, for every identity), not a rule.
    pub denial: bool,
    /// Its predicates, one per line (`query requires q`, `header x-api-version matches 2024-*`).
    pub predicates: Vec<String>,
}

/// What a request carries beyond its method and URL, for predicates: headers and a body.
/// Without a body, the request is explained as one with an empty body, as the proxy decides a
/// request that sends none.
#[derive(Clone, Copy, Debug, Default)]
pub struct Carried<'a> {
    pub headers: Option<&'a http::HeaderMap>,
    pub content_type: Option<&'a str>,
    pub body: &'a [u8],
}

/// Everything `explain` says about one request. Serialisable as is for `--json` and the admin
/// API; names only, never a secret value.
#[derive(Clone, Debug, Serialize)]
pub struct Explanation {
    pub decision: Verdict,
    /// Set when the decision is `ask`: on what terms a person is asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ask: Option<AskExplained>,
    /// The stable reason code ([`Reason::code`]).
    pub reason: &'static str,
    /// The allowing rule, or on deny the rule that came closest.
    pub rule: Option<String>,
    pub rule_origin: Option<String>,
    /// The rule's `description`.
    pub description: Option<String>,
    /// The sentence the deny body and logs carry.
    pub message: String,
    /// The identity asked about (`default` when the policy defines none).
    pub identity: String,
    pub method: String,
    /// The normalised URL policy saw (default port omitted, no query).
    pub url: String,
    /// Every rule whose host patterns match the host, in decision order.
    pub candidates: Vec<Candidate>,
    /// Secrets the allowing rule binds (injects or lists), by name.
    pub secrets: Vec<String>,
    /// Where each of `secrets` comes from: `env`, `file`, `exec`, `vault`, `aws-sm` or
    /// `aws-ssm` (the kind only; never a value).
    pub secret_sources: std::collections::BTreeMap<String, &'static str>,
    /// The credential that signs or authenticates the allowed request (`credential = "NAME"`).
    pub credential: Option<String>,
    /// That credential's kind (`aws_sigv4`, `github_app`, …).
    pub credential_kind: Option<String>,
    /// What the allowing rule sets: header names, `?param` for query parameters.
    pub injected: Vec<String>,
    /// The same list as `injected`, under the name the first release printed.
    pub injected_headers: Vec<String>,
    /// The limits the allowed request is charged to, in the order they are checked: the
    /// rule's, the identity's, then its credential's, each once.
    pub limits: Vec<LimitExplained>,
    /// The denial would be let through and audited `would_deny = true`, because the rule it
    /// names is in `mode = "report"` (`serve --mode report` does this for every denial).
    pub report_only: bool,
    /// Digest of the policy set that decided.
    pub policy: String,
}

impl Explanation {
    /// Allowed outright: not denied, and nobody needs to be asked.
    pub fn allowed(&self) -> bool {
        self.decision == Verdict::Allow
    }
}

pub use crate::policy::reach::ExplainError;

/// Explains what `policy` decides for `method url` asked by `identity` (`None` or `"default"`:
/// no identity; refused when the policy defines identities, as the proxy refuses it).
pub fn explain(
    policy: &Policy,
    identity: Option<&str>,
    method: &str,
    url: &str,
) -> Result<Explanation, ExplainError> {
    explain_with(policy, identity, method, url, Carried::default())
}

/// [`explain`], with the headers and body the request carries (for predicates; the URL's
/// query string is always used).
pub fn explain_with(
    policy: &Policy,
    identity: Option<&str>,
    method: &str,
    url: &str,
    carried: Carried<'_>,
) -> Result<Explanation, ExplainError> {
    let ident = identity_of(policy, identity)?;
    let unidentified = ident.is_none() && !policy.identities().is_empty();
    let method_text = method;
    let asked = Asked::parse(method, url)?;
    let shown = display_url(asked.scheme, &asked.host, asked.port, &asked.path);
    let target = Target {
        identity: ident,
        narrowing: None,
        scheme: asked.scheme,
        host: &asked.host,
        port: asked.port,
        method: &asked.method,
        path: &asked.path,
        websocket: asked.websocket,
        query: asked.query.as_deref(),
        headers: carried.headers,
    };
    let (reason, rule, message) = if unidentified {
        unidentified_refusal(policy)
    } else if asked.userinfo {
        (
            Reason::UserinfoInUrl,
            None,
            format!("URL {url:?} carries userinfo ('@'): latchkey refuses such requests"),
        )
    } else {
        decide(policy, &target, carried)
    };
    let allowed = reason.is_allow();
    let ask = ask_of(policy, reason, rule);
    let candidates = candidates_of(policy, &target, (reason, rule, &message));
    let deciding = rule.filter(|_| allowed);
    let injected = deciding.map(injected_of).unwrap_or_default();
    // `bound` also holds a credential's internal key names; they are reported as the credential.
    let secrets: Vec<String> = deciding
        .map(|r| {
            r.bound
                .iter()
                .filter(|n| !n.starts_with("credential:"))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let credential = deciding.and_then(|r| r.credential.clone());
    let limits = deciding
        .map(|r| limits_of(policy, r, ident))
        .unwrap_or_default();
    let credential_kind = credential
        .as_deref()
        .and_then(|c| policy.credential(c))
        .map(|c| c.kind.label().to_string());

    Ok(Explanation {
        decision: match (&ask, allowed) {
            (Some(_), _) => Verdict::Ask,
            (None, true) => Verdict::Allow,
            (None, false) => Verdict::Deny,
        },
        ask,
        reason: reason.code(),
        rule: rule.map(|r| r.name.clone()),
        rule_origin: rule.map(|r| r.origin.to_string()),
        description: rule.and_then(|r| r.description.clone()),
        message,
        identity: ident
            .map_or(DEFAULT_IDENTITY, |i| i.name.as_str())
            .to_string(),
        method: method_text.to_string(),
        url: shown,
        candidates,
        secret_sources: secrets
            .iter()
            .filter_map(|name: &String| {
                let (_, source) = policy.secret_sources().iter().find(|(n, _)| n == name)?;
                Some((name.clone(), source.kind()))
            })
            .collect(),
        secrets,
        credential,
        credential_kind,
        injected_headers: injected.clone(),
        injected,
        limits,
        report_only: !allowed && reason.is_policy_denial() && rule.is_some_and(|r| r.report),
        policy: policy.digest().to_string(),
    })
}

/// Every denial and rule naming the request's host, in decision order, with the first check
/// each failed; `decided` is the decision's reason, rule and sentence.
fn candidates_of(
    policy: &Policy,
    target: &Target<'_>,
    decided: (Reason, Option<&Rule>, &str),
) -> Vec<Candidate> {
    let (reason, rule, message) = decided;
    let candidate = |r: &Rule, (outcome, detail): (Outcome, String), denial: bool| {
        let decides = rule.is_some_and(|d| std::ptr::eq(d, r));
        // A rule whose head matched but whose body predicate failed decided the refusal.
        let (outcome, detail) = match outcome {
            Outcome::Matched if decides && reason == Reason::PredicateMismatch => {
                (Outcome::Predicate, message.to_string())
            }
            Outcome::Matched
                if denial && !decides && r.predicates.as_ref().is_some_and(|p| p.needs_body()) =>
            {
                (
                    Outcome::Predicate,
                    "does not select this request's body".to_string(),
                )
            }
            other => (other, detail),
        };
        Candidate {
            rule: r.name.clone(),
            origin: r.origin.to_string(),
            outcome,
            decides,
            detail,
            denial,
            predicates: r
                .predicates
                .as_ref()
                .map(|p| p.describe())
                .unwrap_or_default(),
        }
    };
    policy
        .denials_for(target.host)
        .map(|d| candidate(d, check_denial(d, target), true))
        .chain(
            policy
                .candidates(target.host)
                .map(|r| candidate(r, check(r, target), false)),
        )
        .collect()
}

/// The identity asked about: `None` for the default one; an error for one the policy does
/// not define.
fn identity_of<'p>(
    policy: &'p Policy,
    identity: Option<&str>,
) -> Result<Option<&'p Identity>, ExplainError> {
    match identity.filter(|n| *n != DEFAULT_IDENTITY) {
        None => Ok(None),
        Some(name) if policy.identities().is_empty() => Err(ExplainError::NoIdentities {
            name: name.to_string(),
        }),
        Some(name) => {
            policy
                .identity(name)
                .map(Some)
                .ok_or_else(|| ExplainError::UnknownIdentity {
                    name: name.to_string(),
                    known: policy.identities().iter().map(|i| i.name.clone()).collect(),
                })
        }
    }
}

/// The request asked about, parsed as the proxy would see it.
struct Asked {
    method: Method,
    scheme: Scheme,
    /// `ws://` and `wss://` explain the WebSocket handshake: a GET over http or https asking
    /// to upgrade, which only a rule with `websocket = true` allows.
    websocket: bool,
    host: String,
    port: u16,
    path: String,
    /// The URL carries userinfo (`user@host`).
    userinfo: bool,
    /// The raw query string, without `?`.
    query: Option<String>,
}

impl Asked {
    fn parse(method: &str, url: &str) -> Result<Asked, ExplainError> {
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|_| ExplainError::InvalidMethod(method.to_string()))?;
        let bad_url = |why: &str| ExplainError::InvalidUrl {
            url: url.to_string(),
            why: why.to_string(),
        };
        let uri: Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad_url(&e.to_string()))?;
        let (scheme, websocket) = match uri.scheme_str() {
            Some("http") => (Scheme::Http, false),
            Some("https") => (Scheme::Https, false),
            Some("ws") => (Scheme::Http, true),
            Some("wss") => (Scheme::Https, true),
            _ => {
                return Err(bad_url(
                    "use an absolute http://, https://, ws:// or wss:// URL",
                ))
            }
        };
        let authority = uri.authority().ok_or_else(|| bad_url("no host"))?;
        let host = normalize_host(authority.host()).map_err(|e| bad_url(&e.to_string()))?;
        let port = authority.port_u16().unwrap_or(scheme.default_port());
        let path = if uri.path().is_empty() {
            "/"
        } else {
            uri.path()
        };
        Ok(Asked {
            method,
            scheme,
            websocket,
            host,
            port,
            path: path.to_string(),
            userinfo: authority.as_str().contains('@'),
            query: uri.query().map(str::to_string),
        })
    }
}

/// A client without an identity, under a policy that defines some: refused (407).
fn unidentified_refusal(policy: &Policy) -> (Reason, Option<&Rule>, String) {
    let known: Vec<&str> = policy
        .identities()
        .iter()
        .map(|i| i.name.as_str())
        .collect();
    (
        Reason::ProxyAuthRequired,
        None,
        format!(
            "the policy defines identities ({}) and this client has none: latchkey refuses it (407); explain with --identity NAME",
            known.join(", ")
        ),
    )
}

/// The decision as the proxy makes it: CONNECT first (https), the path's ambiguity, then the
/// request under the rule that allows it (which may refuse `;` parameters and `//`).
fn decide<'p>(
    policy: &'p Policy,
    target: &Target<'_>,
    carried: Carried<'_>,
) -> (Reason, Option<&'p Rule>, String) {
    let (host, port, path) = (target.host, target.port, target.path);
    let connect = (target.scheme == Scheme::Https)
        .then(|| policy.decide_connect(host, port, target.identity));
    match connect {
        Some(ConnectDecision::Tunnel(rule)) => (
            Reason::Tunnel,
            Some(rule),
            format!(
                "rule '{}' relays CONNECT {} as a raw tunnel (no interception)",
                rule.name,
                crate::policy::display_authority(host, port)
            ),
        ),
        Some(ConnectDecision::Deny(d)) => (d.reason, d.rule, d.message),
        _ if crate::wire::path::is_ambiguous_path(path) => (
            Reason::AmbiguousPath,
            None,
            match crate::wire::path::ambiguity(path) {
                Some(why) => format!("path {path:?} {why}"),
                None => format!("path {path:?} is ambiguous"),
            },
        ),
        _ => {
            let d = policy.decide_explained(target);
            // Predicates that read the body: decided on the body given (none: empty).
            let d = policy.decide_body(
                &d,
                target.method,
                target.query,
                carried.content_type,
                carried.body,
            );
            // The proxy refuses `;` parameters and `//` under the rule that allowed a request
            // when that rule restricts paths; say so here too.
            let rule_check = d.rule.filter(|_| d.reason.is_allow()).map(|r| {
                (
                    r,
                    crate::wire::path::check_rule_path(path, r.paths.is_some()),
                )
            });
            match rule_check {
                Some((r, Err(why))) => (
                    Reason::AmbiguousPath,
                    Some(r),
                    format!("path {path:?} {why}"),
                ),
                _ => (d.reason, d.rule, d.message),
            }
        }
    }
}

/// The `ask` a decision goes to, if any.
fn ask_of(policy: &Policy, reason: Reason, rule: Option<&Rule>) -> Option<AskExplained> {
    let decided = crate::policy::Decision {
        reason,
        rule,
        message: String::new(),
        body: None,
    };
    policy.asks(&decided).map(|a| AskExplained {
        rule: a.rule_name().to_string(),
        hold: humantime::format_duration(a.terms.hold).to_string(),
        scopes: a.terms.scopes.iter().map(|s| s.to_string()).collect(),
        message: a.terms.message.clone(),
        notify: policy
            .notifiers_for(a.terms)
            .map(|n| n.name.clone())
            .collect(),
    })
}

/// What the deciding rule injects: header names, `?query` keys, basic authorization, the path
/// prefix as written (secrets by name).
fn injected_of(r: &Rule) -> Vec<String> {
    let mut v: Vec<String> = r
        .inject_headers
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    v.extend(r.inject_query.iter().map(|(k, _)| format!("?{k}")));
    if r.inject_basic.is_some() {
        v.push("authorization (basic)".to_string());
    }
    if let Some(prefix) = &r.inject_path_prefix {
        v.push(format!("path prefix {prefix}"));
    }
    v
}

/// The limits a request under `r` is charged to.
fn limits_of(policy: &Policy, r: &Rule, ident: Option<&Identity>) -> Vec<LimitExplained> {
    policy
        .limits_for(r, ident)
        .into_iter()
        .map(|l| LimitExplained {
            name: l.name.clone(),
            per: l.per.as_str(),
            measures: l
                .terms()
                .into_iter()
                .map(|(m, t)| (m.as_str(), t))
                .collect(),
            on_store_error: l.on_store_error.as_str(),
            summary: l.summary(),
        })
        .collect()
}

/// The first check `rule` fails for `t`, in the order [`Policy::decide`] checks them.
fn check(rule: &Rule, t: &Target<'_>) -> (Outcome, String) {
    if t.identity.is_some_and(|i| !i.rules.allows(&rule.name)) {
        let who = t.identity.map_or(DEFAULT_IDENTITY, |i| i.name.as_str());
        return (
            Outcome::Identity,
            format!("identity '{who}' may not use this rule"),
        );
    }
    if !rule.port_matches(t.scheme, t.port) {
        return (
            Outcome::Port,
            format!(
                "allows port(s) {}",
                crate::policy::join(rule.ports_for(t.scheme))
            ),
        );
    }
    if rule.tunnel {
        let detail = if t.scheme == Scheme::Https {
            "relays CONNECT as a raw tunnel; it allows no request latchkey can see"
        } else {
            "relays CONNECT tunnels only; it never allows a plain http request"
        };
        return (Outcome::Tunnel, detail.to_string());
    }
    if !rule.method_matches(t.method) {
        return (
            Outcome::Method,
            format!(
                "allows only {}",
                crate::policy::join(rule.methods.iter().flatten())
            ),
        );
    }
    if !rule.path_matches(t.path) {
        return (
            Outcome::Path,
            format!(
                "allows only paths {}",
                crate::policy::join(rule.paths.iter().flat_map(|p| p.globs.iter()))
            ),
        );
    }
    if t.websocket && !rule.websocket {
        return (
            Outcome::WebSocket,
            "does not allow WebSocket upgrades (websocket = true allows them)".to_string(),
        );
    }
    if !rule.schemes.allows(t.scheme) {
        let detail = match rule.scheme_refusal(t.scheme) {
            Reason::CredentialNeedsTls => format!(
                "brokers {}, so it applies only to requests sent over TLS (https); a credential never travels in cleartext unless the rule sets dangerously_allow_cleartext = true",
                rule.brokered().unwrap_or_default()
            ),
            _ => format!("covers only schemes {}", rule.schemes.listed()),
        };
        return (Outcome::Scheme, detail);
    }
    let head = rule
        .predicates
        .as_ref()
        .map_or(Ok(()), |p| p.head(Polarity::Require, t.query, t.headers));
    if let Err(why) = head {
        return (Outcome::Predicate, why);
    }
    (Outcome::Matched, String::new())
}

/// The first check denial `d` fails for `t` (it applies on every port unless it lists ports,
/// and to every identity); `Matched` when its head selects the request.
fn check_denial(d: &Rule, t: &Target<'_>) -> (Outcome, String) {
    if d.ports.as_ref().is_some_and(|p| !p.contains(&t.port)) {
        let ports = crate::policy::join(d.ports.iter().flatten());
        return (Outcome::Port, format!("denies port(s) {ports}"));
    }
    if !d.method_matches(t.method) {
        let methods = crate::policy::join(d.methods.iter().flatten());
        return (Outcome::Method, format!("denies only {methods}"));
    }
    if !d.path_matches(t.path) {
        let paths = crate::policy::join(d.paths.iter().flat_map(|p| p.globs.iter()));
        return (Outcome::Path, format!("denies only paths {paths}"));
    }
    let head = d
        .predicates
        .as_ref()
        .map_or(Ok(()), |p| p.head(Polarity::Select, t.query, t.headers));
    if let Err(why) = head {
        return (
            Outcome::Predicate,
            format!("selects only a request that {why}"),
        );
    }
    (Outcome::Matched, String::new())
}

#[cfg(test)]
#[path = "explain_tests.rs"]
mod tests;

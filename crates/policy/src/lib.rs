//! Policy: load the TOML files a security team reviews, validate them strictly, and decide.
//!
//! Raw input (`schema`) is kept apart from the compiled form ([`Policy`]). Loading reports every
//! problem as `file:line:col: message`, never just the first; an invalid policy is never used.
//! The compiled matcher indexes rules by exact host and by wildcard suffix, so a decision costs a
//! hash lookup per host label, not a scan of every rule.
//!
//! Decision order (first match wins, deny by default):
//! 1. candidate rules for the host: exact host entries first, then `*.suffix` entries from the
//!    longest suffix to the shortest; within one host entry, rules that restrict paths come
//!    before rules that do not, then rules that restrict methods, then file order;
//! 2. a candidate matches when the port, method and path all match;
//! 3. no match → deny, with the reason of the candidate that came closest.
//!
//! This module knows no sockets, and depends on nothing in `proxy` or `upstream`: what it
//! shares with them (host forms, CIDRs, path ambiguity, hop-by-hop names, size caps) is in
//! [`crate::wire`].

// The crates this one uses, under the module names the code knows them by.
use latchkey_secrets as secrets;
use latchkey_signing as signing;
use latchkey_wire as wire;
use latchkey_wire::reason;

pub mod access;
pub mod ask;
mod ask_compile;
pub mod compile;
mod credential;
mod credential_kinds;
mod decide;
mod deny;
pub mod facts;
pub mod graphql;
pub mod identity;
mod identity_compile;
pub mod limits;
mod limits_compile;
pub mod mcp;
mod names;
pub mod predicates;
mod predicates_compile;
mod prices;
pub mod profile;
mod profile_compile;
pub mod reach;
pub mod read;
pub mod rule;
pub mod schema;
mod schema_credential;
mod schema_predicates;
mod schema_sessions;
mod schema_vault;
pub mod schemes;
mod secret_compile;
mod vault_compile;

use std::collections::HashMap;
use std::path::PathBuf;

use globset::GlobSet;
use std::collections::BTreeSet;
use std::sync::Arc;

use http::{HeaderName, Method};

pub use compile::{
    compile_sources, compile_sources_with, load_dir, load_dir_for_evaluation, toml_files,
    LoadError, PolicyError, PolicySources, SecretLoading,
};
// Re-exported: callers that match requests against policy normalise hosts the same way.
pub use crate::wire::host::{display_authority, normalize_host, HostError};
pub use ask::{Ask, AskPolicy, Asking, Notifier, NotifyFormat, Scope};
pub use compile::line_col;
pub use identity::{Identity, DEFAULT_IDENTITY};
pub use limits::{Limit, Measure, Per, Period, Price, PriceTable};
pub use reach::{Ceiling, Reach};
pub use read::did_you_mean;
pub use schemes::Schemes;

use crate::reason::Reason;
use crate::secrets::placeholder::Place;
use crate::secrets::{Source, Template};
use crate::wire::cidr::Cidr;

/// URL scheme of a request as policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// A host pattern from a rule, normalised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostPattern {
    /// Matches this host only.
    Exact(String),
    /// `*.suffix`: matches any host with one or more labels before `.suffix`, never the apex.
    Wildcard(String),
}

impl HostPattern {
    /// Whether this pattern matches `host` (normalised).
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(h) => h == host,
            HostPattern::Wildcard(s) => host
                .strip_suffix(s.as_str())
                .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
        }
    }

    /// Whether this pattern and `other` can both match one host.
    pub fn overlaps(&self, other: &HostPattern) -> bool {
        match (self, other) {
            (HostPattern::Exact(x), p) | (p, HostPattern::Exact(x)) => p.matches(x),
            (HostPattern::Wildcard(x), HostPattern::Wildcard(y)) => {
                x == y || x.ends_with(&format!(".{y}")) || y.ends_with(&format!(".{x}"))
            }
        }
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostPattern::Exact(h) => f.write_str(h),
            HostPattern::Wildcard(s) => write!(f, "*.{s}"),
        }
    }
}

/// Where something was defined, for messages that point a reviewer at the line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub file: PathBuf,
    pub line: usize,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// A compiled rule.
#[derive(Debug)]
pub struct Rule {
    pub name: String,
    pub description: Option<String>,
    pub hosts: Vec<HostPattern>,
    /// `None`: the scheme's default port (443 for https and CONNECT, 80 for http).
    pub ports: Option<Vec<u16>>,
    /// `None`: every method.
    pub methods: Option<Vec<Method>>,
    /// `None`: every path.
    pub paths: Option<PathMatcher>,
    pub tunnel: bool,
    /// `websocket = true`: a request it allows may upgrade to a WebSocket.
    pub websocket: bool,
    /// Headers set on the upstream request, replacing any the sandbox sent with that name.
    pub inject_headers: Vec<(HeaderName, Template)>,
    /// Query parameters set on the upstream request, replacing any of the same name.
    pub inject_query: Vec<(String, Template)>,
    /// `Authorization: Basic` built from (user, password).
    pub inject_basic: Option<(Template, Template)>,
    /// Every header name this rule sets (stripped from the sandbox's request first).
    pub injected_names: Vec<HeaderName>,
    /// Prepended to the path sent upstream (`/bot{{secret.telegram}}`); policy decides on the
    /// path as the sandbox sent it.
    pub inject_path_prefix: Option<Template>,
    /// Secrets bound to this rule's hosts: injected or listed in `secrets`.
    pub bound: BTreeSet<String>,
    /// Where placeholders for bound secrets may be replaced.
    pub placeholders: Vec<Place>,
    /// Auth headers the sandbox may send that this rule does not strip.
    pub keep_headers: Vec<HeaderName>,
    /// Non-public ranges this rule opens in the address guard, on top of `--allow-private`.
    pub allow_private: Vec<Cidr>,
    /// `mode = "report"`: what this rule would deny is let through and marked `would_deny`.
    pub report: bool,
    /// The credential that signs or authenticates this rule's requests.
    pub credential: Option<String>,
    /// `ask = { … }`: a request this rule allows waits for a person first.
    pub ask: Option<Ask>,
    /// `limits = ["NAME", …]`: the `[limits.NAME]` its requests are charged to.
    pub limits: Vec<String>,
    /// `mcp = { … }`: the JSON-RPC methods, tools and arguments allowed (book "MCP tool rules").
    pub mcp: Option<Arc<mcp::McpRules>>,
    /// `capture = { … }`: tokens in this endpoint's responses are kept by latchkey, the sandbox
    /// gets placeholders (book "OAuth token capture").
    pub capture: Option<Capture>,
    /// How latchkey may send what this rule allows upstream (`schemes`; default: `https` only
    /// for a rule that [brokers](Rule::brokers) a credential, both otherwise).
    pub schemes: Schemes,
    /// `dangerously_allow_cleartext = true`: this rule's credentials may go upstream over
    /// plain `http`.
    pub cleartext: bool,
    /// `query`, `headers`, `body`, `graphql`: what a request must carry for this rule to allow
    /// it (for a denial: what selects the request). `None`: no predicate.
    pub predicates: Option<Arc<predicates::Predicates>>,
    pub origin: Origin,
}

/// A rule's `capture`: which response fields are tokens, the name they are kept under, and the
/// hosts a request carrying their placeholder may send them to.
#[derive(Debug, Clone)]
pub struct Capture {
    /// `as`: each field is kept as the secret `NAME_FIELD` (per identity).
    pub name: String,
    pub fields: Vec<String>,
    /// Where the captured tokens may go (default: the rule's hosts).
    pub hosts: Vec<HostPattern>,
    /// Lifetime when the response gives no `expires_in` (default: kept until replaced).
    pub ttl: Option<std::time::Duration>,
    /// The capturing rule's `dangerously_allow_cleartext`: its tokens may replace placeholders
    /// in a plain `http` request.
    pub cleartext: bool,
}

impl Capture {
    /// The secret name a captured field is kept under.
    pub fn secret_name(&self, field: &str) -> String {
        format!("{}_{field}", self.name)
    }
}

/// Compiled path globs plus their source text for messages.
#[derive(Debug)]
pub struct PathMatcher {
    pub globs: Vec<String>,
    set: GlobSet,
}

impl PathMatcher {
    pub fn is_match(&self, path: &str) -> bool {
        self.set.is_match(path)
    }
}

impl Rule {
    pub fn port_matches(&self, scheme: Scheme, port: u16) -> bool {
        match &self.ports {
            Some(ports) => ports.contains(&port),
            None => port == scheme.default_port(),
        }
    }

    pub fn method_matches(&self, method: &Method) -> bool {
        self.methods
            .as_ref()
            .is_none_or(|ms| ms.iter().any(|m| m == method))
    }

    pub fn path_matches(&self, path: &str) -> bool {
        self.paths.as_ref().is_none_or(|p| p.is_match(path))
    }

    /// The empty rule report-only traffic runs under when no rule came close: it injects
    /// nothing and binds no secret.
    pub fn report_only() -> Rule {
        Rule {
            name: "report-only".to_string(),
            description: None,
            hosts: Vec::new(),
            ports: None,
            methods: None,
            paths: None,
            tunnel: false,
            websocket: false,
            inject_headers: Vec::new(),
            inject_query: Vec::new(),
            inject_basic: None,
            injected_names: Vec::new(),
            inject_path_prefix: None,
            bound: BTreeSet::new(),
            placeholders: Vec::new(),
            keep_headers: Vec::new(),
            allow_private: Vec::new(),
            report: true,
            credential: None,
            ask: None,
            limits: Vec::new(),
            mcp: None,
            capture: None,
            schemes: Schemes::BOTH,
            cleartext: false,
            predicates: None,
            origin: Origin {
                file: PathBuf::from("--mode report"),
                line: 0,
            },
        }
    }

    /// The empty rule a request no rule allows goes on under once a person approved it
    /// (`[ask] unknown`): named `unknown`, it injects nothing and binds no secret.
    pub fn unknown() -> Rule {
        Rule {
            name: ask::UNKNOWN.to_string(),
            report: false,
            origin: Origin {
                file: PathBuf::from("[ask] unknown"),
                line: 0,
            },
            ..Rule::report_only()
        }
    }

    /// The host as this rule names it for `host`: the exact entry if it lists one, else the
    /// wildcard that matches (`*.example.com`), else `host` itself.
    pub fn host_for(&self, host: &str) -> String {
        let exact = self
            .hosts
            .iter()
            .find(|p| matches!(p, HostPattern::Exact(h) if h == host));
        exact
            .or_else(|| self.hosts.iter().find(|p| p.matches(host)))
            .map_or_else(|| host.to_string(), ToString::to_string)
    }

    /// Whether this rule adds anything to requests (and so strips the sandbox's own auth).
    pub fn injects(&self) -> bool {
        !self.inject_headers.is_empty()
            || !self.inject_query.is_empty()
            || self.inject_basic.is_some()
            || self.inject_path_prefix.is_some()
    }

    /// The ports this rule allows for a scheme, for messages.
    pub fn ports_for(&self, scheme: Scheme) -> Vec<u16> {
        self.ports
            .clone()
            .unwrap_or_else(|| vec![scheme.default_port()])
    }
}

/// The validated, compiled policy set: what the files say, and nothing else. Immutable, and
/// holds no value: secret values and tokens live in the runtime state a generation pairs it
/// with (`signing::Live`); a reload builds a new policy and reconciles that state against it.
#[derive(Debug)]
pub struct Policy {
    /// `[admin.tokens.NAME]`: scoped admin API tokens (values in the secret store).
    admin_tokens: Vec<access::AdminToken>,
    /// `[attest.NAME]`: workload-token issuers that admit sessions.
    attest: Vec<access::Attest>,
    /// `[admin.oidc]`: the console's OpenID Connect sign-in.
    admin_oidc: Option<access::Oidc>,
    rules: Vec<Rule>,
    /// `[[deny]]` tables, compiled as rules and indexed by host like them; checked before any
    /// rule, for every identity.
    denials: Vec<Rule>,
    deny_exact: HashMap<String, Vec<usize>>,
    deny_wildcard: HashMap<String, Vec<usize>>,
    /// Indices of the rules with `capture`: looked at on every request, so kept apart.
    capturing: Vec<usize>,
    identities: Vec<Identity>,
    /// `[credentials.NAME]` definitions (their key material is declared in `secrets`).
    credentials: std::collections::HashMap<String, Arc<crate::signing::Credential>>,
    exact: HashMap<String, Vec<usize>>,
    wildcard: HashMap<String, Vec<usize>>,
    /// Every secret declared, by name: `[secrets.NAME]`, credentials' key material, identity
    /// tokens and notifiers' signing secrets (under their reserved names). Sources, no values.
    secrets: Vec<(String, Source)>,
    /// Where each of `secrets` was declared (file and line), for a problem reading it later.
    secret_origins: HashMap<String, Origin>,
    /// `[ask]`: asking a person for unknown destinations, and the defaults for rules' `ask`.
    ask: AskPolicy,
    /// `[notify.NAME]` webhooks, by name order.
    notifiers: Vec<Notifier>,
    /// `[limits.NAME]`, by name order.
    limits: Vec<Limit>,
    /// `limits = [...]` of each `[credentials.NAME]`.
    credential_limits: HashMap<String, Vec<String>>,
    /// The shipped price table with `[prices."MODEL"]` over it.
    prices: Arc<PriceTable>,
    /// Each identity's labels and reach digest (`default` alone without identities), for
    /// every audit record of it.
    ceilings: HashMap<String, Ceiling>,
    digest: String,
    files: Vec<PathBuf>,
}

/// What a request looks like to policy, after normalisation.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub scheme: Scheme,
    /// Normalised (see [`normalize_host`]).
    pub host: &'a str,
    pub port: u16,
    pub method: &'a Method,
    /// Path without the query.
    pub path: &'a str,
    /// The identity asking; `None` when the policy defines none (every rule applies).
    pub identity: Option<&'a Identity>,
    /// The runtime session's narrowing of its profile (`identity`), if a session asks.
    pub narrowing: Option<&'a profile::Narrowing>,
    /// The request asks to upgrade to a WebSocket: only a rule with `websocket = true` allows it.
    pub websocket: bool,
    /// The raw query string, without `?`; `None` when there is none (or it is not known).
    pub query: Option<&'a str>,
    /// The request's headers; `None` when not known (read as no headers).
    pub headers: Option<&'a http::HeaderMap>,
}

/// A policy decision: which rule, and a human reason.
#[derive(Debug, Clone)]
pub struct Decision<'p> {
    pub reason: Reason,
    /// The matching rule on allow; on deny, the rule that came closest (if any).
    pub rule: Option<&'p Rule>,
    /// A sentence for the deny body, logs and `explain`; empty on an allow from
    /// [`Policy::decide`] (see [`Policy::decide_explained`]).
    pub message: String,
    /// `Some` when the head decided but predicates that read the body remain: the request must
    /// not be sent before [`Policy::decide_body`] says so.
    pub body: Option<BodyCheck<'p>>,
}

/// What a decision still needs the body for: the denials whose head matched and that have
/// `body`/`graphql` predicates, and the allowing rule if its own remain.
#[derive(Debug, Clone)]
pub struct BodyCheck<'p> {
    pub denials: Vec<&'p Rule>,
    pub rule: Option<&'p Rule>,
    /// Bodies larger than this are not evaluated (the rule's requirement fails, a denial
    /// applies).
    pub max_bytes: usize,
}

impl Decision<'_> {
    pub fn allowed(&self) -> bool {
        self.reason.is_allow()
    }

    pub fn rule_name(&self) -> Option<&str> {
        self.rule.map(|r| r.name.as_str())
    }
}

/// What to do with a `CONNECT host:port`.
#[derive(Debug)]
pub enum ConnectDecision<'p> {
    /// Relay raw bytes (a `tunnel = true` rule).
    Tunnel(&'p Rule),
    /// Terminate TLS and decide every inner request.
    Intercept,
    /// Refuse before any TLS.
    Deny(Decision<'p>),
}

/// `scheme://host[:port]path` as a `Display`, formatted straight into a message.
struct UrlDisplay<'a>(Scheme, &'a str, u16, &'a str);

impl std::fmt::Display for UrlDisplay<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let UrlDisplay(scheme, host, port, path) = *self;
        let authority = crate::wire::host::Authority {
            host,
            port,
            default_port: Some(scheme.default_port()),
        };
        write!(f, "{}://{authority}{path}", scheme.as_str())
    }
}

/// Formats `scheme://host[:port]path` with the default port omitted, for messages.
pub fn display_url(scheme: Scheme, host: &str, port: u16, path: &str) -> String {
    UrlDisplay(scheme, host, port, path).to_string()
}

impl Policy {
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// A credential by name.
    pub fn credential(&self, name: &str) -> Option<&Arc<crate::signing::Credential>> {
        self.credentials.get(name)
    }

    /// Every credential.
    pub fn credentials(&self) -> impl Iterator<Item = &Arc<crate::signing::Credential>> {
        self.credentials.values()
    }

    /// `[admin.tokens.NAME]`, in file order.
    pub fn admin_tokens(&self) -> &[access::AdminToken] {
        &self.admin_tokens
    }

    /// `[admin.oidc]`, if any file has it.
    pub fn admin_oidc(&self) -> Option<&access::Oidc> {
        self.admin_oidc.as_ref()
    }

    /// `[attest.NAME]`, in file order.
    pub fn attest(&self) -> &[access::Attest] {
        &self.attest
    }

    /// The identities defined; empty means every client is `default` with every rule.
    pub fn identities(&self) -> &[Identity] {
        &self.identities
    }

    /// An identity by name (`None` for `default` or an unknown name).
    pub fn identity(&self, name: &str) -> Option<&Identity> {
        self.identities.iter().find(|i| i.name == name)
    }

    /// What the audit records of `identity` carry about it: its labels and reach. `None` for
    /// a name the policy does not define (and for `default` in a policy with identities).
    pub fn ceiling(&self, identity: &str) -> Option<&Ceiling> {
        self.ceilings.get(identity)
    }

    /// Every secret this policy declares and its source, by name.
    pub fn secret_sources(&self) -> &[(String, Source)] {
        &self.secrets
    }

    /// Where the secret `name` (a key of [`Policy::secret_sources`]) was declared, and the
    /// policy field that declares it (`secrets.NAME.source`, `credentials.NAME.FIELD`, …).
    pub fn secret_origin(&self, name: &str) -> Option<(&Origin, String)> {
        let origin = self.secret_origins.get(name)?;
        Some((origin, compile::field_of(name)))
    }

    /// The names of the secrets this policy declares, in order.
    pub fn secret_names(&self) -> impl Iterator<Item = &str> {
        self.secrets.iter().map(|(name, _)| name.as_str())
    }

    /// `sha256:` and the full 64-hex SHA-256 over every file's name and content.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The `[ask]` table (defaults when the policy has none: `unknown = false`).
    pub fn ask(&self) -> &AskPolicy {
        &self.ask
    }

    /// The `[notify.NAME]` webhooks.
    pub fn notifiers(&self) -> &[Notifier] {
        &self.notifiers
    }

    /// Every `[limits.NAME]`, by name.
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// A `[limits.NAME]` by name.
    pub fn limit(&self, name: &str) -> Option<&Limit> {
        self.limits
            .binary_search_by(|l| l.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.limits[i])
    }

    /// The limits a request under `rule` by `identity` is charged to: the rule's, then the
    /// identity's, then the rule's credential's, each named once.
    pub fn limits_for(&self, rule: &Rule, identity: Option<&Identity>) -> Vec<&Limit> {
        let credential = rule
            .credential
            .as_ref()
            .and_then(|c| self.credential_limits.get(c));
        let names = rule
            .limits
            .iter()
            .chain(identity.into_iter().flat_map(|i| i.limits.iter()))
            .chain(credential.into_iter().flatten());
        let mut out: Vec<&Limit> = Vec::new();
        for name in names {
            if let Some(l) = self.limit(name) {
                if !out.iter().any(|o| o.name == l.name) {
                    out.push(l);
                }
            }
        }
        out
    }

    /// The `limits = [...]` of credential `name`.
    pub fn credential_limits(&self, name: &str) -> &[String] {
        self.credential_limits.get(name).map_or(&[], Vec::as_slice)
    }

    /// The price table in force.
    pub fn prices(&self) -> &Arc<PriceTable> {
        &self.prices
    }

    /// Candidate rules for a host, in decision order.
    pub fn candidates<'s, 'h>(
        &'s self,
        host: &'h str,
    ) -> impl Iterator<Item = &'s Rule> + use<'s, 'h> {
        let exact = self.exact.get(host).into_iter().flatten();
        // Longest wildcard suffix first: for a.b.example.com try b.example.com, then
        // example.com, then com. A wildcard never matches its own apex.
        let suffixes = host
            .match_indices('.')
            .map(move |(i, _)| &host[i + 1..])
            .filter_map(|suffix| self.wildcard.get(suffix))
            .flatten();
        exact.chain(suffixes).map(|&i| &self.rules[i])
    }

    /// Whether any rule that names `host` binds a secret or a credential to it: such a host may
    /// have received a secret through that rule, so every response from it is scanned.
    pub fn binds_secrets_to(&self, host: &str) -> bool {
        self.candidates(host)
            .any(|r| !r.bound.is_empty() || r.credential.is_some())
            || self.captures_binding(host).next().is_some()
    }

    /// The captures whose tokens may go to `host`: its `hosts`, and the token endpoint's own
    /// hosts (a refresh sends the refresh token back there).
    pub fn captures_binding<'a>(&'a self, host: &'a str) -> impl Iterator<Item = &'a Capture> + 'a {
        self.capturing.iter().filter_map(move |&i| {
            let r = self.rules.get(i)?;
            let c = r.capture.as_ref()?;
            c.hosts
                .iter()
                .chain(&r.hosts)
                .any(|h| h.matches(host))
                .then_some(c)
        })
    }
}

pub fn join<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    items
        .into_iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod validate_tests;

#[cfg(test)]
mod ask_tests;

#[cfg(test)]
mod vault_tests;

#[cfg(test)]
mod limits_tests;

#[cfg(test)]
mod credential_kinds_tests;

#[cfg(test)]
mod predicates_tests;

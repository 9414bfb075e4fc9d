//! Raw policy types: exactly what a policy file says, with source spans, before validation.
//!
//! Nothing here is trusted. A file is parsed into a spanned TOML document, then read key by key:
//! each top-level table, each `[[rules]]` entry and each named secret, credential and identity is
//! read on its own, so an unknown key or a value of the wrong type is reported where it is and
//! never hides a problem elsewhere. An entry with any such problem is marked incomplete and is
//! never compiled into the policy; `compile` still checks what could be read of it.

use std::ops::Range;

use toml::Spanned;

use super::read::Fields;
pub(super) use super::schema_credential::{read_credential, CREDENTIAL_KEYS};
pub use super::schema_credential::{RawAssumeRole, RawCredential};
pub(super) use super::schema_sessions::{
    read_admin_token, read_attest, read_oidc, read_profile, ADMIN_KEYS, ADMIN_TOKEN_KEYS,
    ATTEST_KEYS, OIDC_KEYS, OIDC_ROLE_KEYS, PROFILE_KEYS,
};
pub use super::schema_sessions::{RawAdminToken, RawAttest, RawOidc, RawOidcRole, RawProfile};

/// Where the readers send each problem they find.
pub trait Report {
    fn error(&mut self, span: Range<usize>, message: String);
    /// Problems reported so far, to tell whether an entry added any.
    fn count(&self) -> usize;
}

/// One entry (a rule, a secret, ...) as read, and whether it was read without a problem.
#[derive(Debug)]
pub struct Entry<T> {
    /// The entry's table (its `[header]`, or the inline table).
    pub span: Range<usize>,
    pub raw: T,
    /// False when a key was unknown, missing or of the wrong type: the entry must not be used.
    pub complete: bool,
}

/// One policy file. Named entries keep their file order.
#[derive(Debug, Default)]
pub struct RawPolicyFile {
    pub secrets: Vec<(Spanned<String>, Entry<RawSecret>)>,
    pub rules: Vec<Entry<RawRule>>,
    /// `[[deny]]`: read as rules (a rule-only key is an error), compiled as denials.
    pub deny: Vec<Entry<RawRule>>,
    pub identities: Vec<(Spanned<String>, Entry<RawIdentity>)>,
    /// `[profiles.NAME]`: what a runtime session made from it may do.
    pub profiles: Vec<(Spanned<String>, Entry<RawProfile>)>,
    /// `[attest.NAME]`: workload tokens a sandbox may prove itself with.
    pub attest: Vec<(Spanned<String>, Entry<RawAttest>)>,
    /// `[admin.tokens.NAME]`: scoped tokens for the admin API.
    pub admin_tokens: Vec<(Spanned<String>, Entry<RawAdminToken>)>,
    /// `[admin.oidc]`, if this file has one: the console's OpenID Connect sign-in.
    pub admin_oidc: Option<Entry<RawOidc>>,
    pub credentials: Vec<(Spanned<String>, Entry<RawCredential>)>,
    /// `[ask]`, if this file has one.
    pub ask: Option<Entry<RawAsk>>,
    /// `[notify.NAME]` webhooks.
    pub notify: Vec<(Spanned<String>, Entry<RawNotify>)>,
    /// `[limits.NAME]` tables.
    pub limits: Vec<(Spanned<String>, Entry<RawLimit>)>,
    /// `[prices."MODEL"]` tables.
    pub prices: Vec<(Spanned<String>, Entry<RawPrice>)>,
    /// `[vault]` and `[vault.NAME]` connections.
    pub vault: super::schema_vault::RawVaults,
}

/// `[limits.NAME]`: rates, concurrency and budgets; `limits_compile` checks the values.
#[derive(Debug, Default)]
pub struct RawLimit {
    /// Every known key written, whatever its value.
    pub keys: Vec<&'static str>,
    pub per: Option<Spanned<String>>,
    pub requests: Option<Spanned<String>>,
    pub concurrency: Option<Spanned<i64>>,
    pub queue: Option<Spanned<String>>,
    pub bytes_up: Option<Spanned<String>>,
    pub llm_tokens: Option<Spanned<String>>,
    pub spend: Option<Spanned<String>>,
    pub reserve_tokens: Option<Spanned<i64>>,
    pub include_usage: Option<Spanned<bool>>,
    pub on_store_error: Option<Spanned<String>>,
}

/// `[prices."MODEL"]`: USD per million tokens.
#[derive(Debug, Default)]
pub struct RawPrice {
    pub input: Option<Spanned<f64>>,
    pub output: Option<Spanned<f64>>,
    pub cached_input: Option<Spanned<f64>>,
}

/// A `limits = ["NAME", …]` list, on a rule, an identity or a credential.
pub type LimitList = Option<Spanned<Vec<Spanned<String>>>>;

/// `[ask]`, or a rule's `ask = { … }` (which takes only `hold`, `scope`, `message`, `notify`;
/// the reader checks the keys).
#[derive(Debug, Default)]
pub struct RawAsk {
    pub unknown: Option<Spanned<bool>>,
    pub hold: Option<Spanned<String>>,
    pub scope: Option<Spanned<Vec<Spanned<String>>>>,
    pub message: Option<Spanned<String>>,
    pub notify: Option<Spanned<Vec<Spanned<String>>>>,
    pub rate: Option<Spanned<String>>,
    pub expire: Option<Spanned<String>>,
}

/// `[notify.NAME]`: a webhook told of approval requests and decisions.
#[derive(Debug, Default)]
pub struct RawNotify {
    /// Required.
    pub url: Option<Spanned<String>>,
    /// A secret source (`env:`, `file:`, `exec:`) for the HMAC signing key.
    pub secret: Option<Spanned<String>>,
    /// `json` (default) or `slack`.
    pub format: Option<Spanned<String>>,
    /// `format = "slack"` only: a secret source for Slack's request signing secret, which
    /// makes the message's buttons answer in place (`POST /slack/actions/NAME`).
    pub signing_secret: Option<Spanned<String>>,
    /// With `signing_secret`: the Slack user IDs who may answer from the message.
    pub approvers: Option<Spanned<Vec<Spanned<String>>>>,
}

/// JWT claims: name, where its value is, and the value as JSON.
pub type Claims = Vec<(String, Range<usize>, serde_json::Value)>;

/// A table of strings, each key and value with its span.
pub type StringMap = Vec<(Spanned<String>, Spanned<String>)>;

/// `[identities.NAME]`: how a sandbox is recognised and which rules it may use.
#[derive(Debug, Default)]
pub struct RawIdentity {
    /// A secret source; the sandbox sends it as `Proxy-Authorization`.
    pub token: Option<Spanned<String>>,
    /// Client address ranges.
    pub sources: Option<Spanned<Vec<Spanned<String>>>>,
    /// Rule names this identity may use; `["*"]` for all. Required.
    pub rules: Option<Spanned<Vec<Spanned<String>>>>,
    /// `labels = { k = "v" }`: facts about the sandbox, copied into approvals.
    pub labels: Option<Spanned<StringMap>>,
    /// `limits = ["NAME"]`: charged to every request of this identity.
    pub limits: LimitList,
}

/// `[secrets.NAME]`: where a secret's value comes from.
#[derive(Debug, Default)]
pub struct RawSecret {
    /// Required.
    pub source: Option<Spanned<String>>,
    /// exec only: how long a fetched value is used.
    pub ttl: Option<Spanned<String>>,
    /// exec only: how long the helper may run.
    pub timeout: Option<Spanned<String>>,
    /// Remote stores only: how long a fetched value is used.
    pub refresh: Option<Spanned<String>>,
    /// Remote stores only: how long past `refresh` a value may be served while its store is
    /// down.
    pub stale_for: Option<Spanned<String>>,
}

/// One `[[rules]]` entry.
#[derive(Debug, Default)]
pub struct RawRule {
    /// Required.
    pub name: Option<Spanned<String>>,
    /// Free text for reviewers; shown by `explain`.
    pub description: Option<String>,
    /// Required.
    pub hosts: Option<Spanned<Vec<Spanned<String>>>>,
    pub ports: Option<Spanned<Vec<Spanned<i64>>>>,
    pub methods: Option<Spanned<Vec<Spanned<String>>>>,
    pub paths: Option<Spanned<Vec<Spanned<String>>>>,
    pub tunnel: Option<Spanned<bool>>,
    /// `websocket = true`: a GET this rule allows may upgrade to a WebSocket (off by default).
    pub websocket: Option<Spanned<bool>>,
    pub inject: Option<RawInject>,
    /// Secrets bound to this rule's hosts for placeholders, besides those it injects.
    pub secrets: Option<Spanned<Vec<Spanned<String>>>>,
    /// Where placeholders may be replaced: header, basic_auth, query, body, websocket.
    pub placeholders: Option<Spanned<Vec<Spanned<String>>>>,
    /// Auth headers this rule does not strip (e.g. cookie).
    pub keep_headers: Option<Spanned<Vec<Spanned<String>>>>,
    /// A `[credentials.NAME]` that signs or authenticates this rule's requests.
    pub credential: Option<Spanned<String>>,
    /// `enforce` (default) or `report`: a request this rule comes closest to but does not
    /// allow goes through and is audited with `would_deny = true`.
    pub mode: Option<Spanned<String>>,
    /// Non-public address ranges this rule may reach (e.g. an internal service).
    pub allow_private: Option<Spanned<Vec<Spanned<String>>>>,
    /// Required to bind a secret to a wildcard host: every matching host receives it.
    pub dangerously_inject_into_wildcard: Option<Spanned<bool>>,
    /// `schemes = ["https"]`: how latchkey may send what this rule allows upstream (`https`:
    /// inside TLS; `http`: in cleartext). Default: `https` for a rule that brokers a credential,
    /// both for one that does not.
    pub schemes: Option<Spanned<Vec<Spanned<String>>>>,
    /// Required for a rule that brokers a credential to cover `http`: its credentials then
    /// travel in cleartext.
    pub dangerously_allow_cleartext: Option<Spanned<bool>>,
    /// `ask = { hold, scope, message, notify }`: an allowed request waits for a person.
    pub ask: Option<Spanned<RawAsk>>,
    /// `limits = ["NAME"]`: charged to every request this rule allows.
    pub limits: LimitList,
    /// `mcp = { tools, deny_tools, methods, args, filter_list }`: JSON-RPC rules for an MCP
    /// server over streamable HTTP.
    pub mcp: Option<Spanned<RawMcp>>,
    /// `capture = { fields, as, hosts }`: tokens in this endpoint's responses are kept by
    /// latchkey and the sandbox gets placeholders.
    pub capture: Option<Spanned<RawCapture>>,
    /// `query`, `headers`, `body`, `graphql`: what the request must carry (a rule) or what
    /// selects it (a denial).
    pub predicates: super::schema_predicates::RawPredicates,
}

/// A rule's `mcp` table.
#[derive(Debug, Default)]
pub struct RawMcp {
    pub tools: Option<Spanned<Vec<Spanned<String>>>>,
    pub deny_tools: Option<Spanned<Vec<Spanned<String>>>>,
    pub methods: Option<Spanned<Vec<Spanned<String>>>>,
    pub args: StringMap,
    pub filter_list: Option<Spanned<bool>>,
}

/// A rule's `capture` table.
#[derive(Debug, Default)]
pub struct RawCapture {
    pub fields: Option<Spanned<Vec<Spanned<String>>>>,
    pub name: Option<Spanned<String>>,
    pub hosts: Option<Spanned<Vec<Spanned<String>>>>,
    pub ttl: Option<Spanned<String>>,
}

/// `[rules.inject]`: what latchkey adds to an allowed request.
#[derive(Debug, Default)]
pub struct RawInject {
    pub headers: StringMap,
    pub query: StringMap,
    pub basic_auth: Option<Spanned<RawBasicAuth>>,
    /// `path_prefix = "/bot{{secret.x}}"`: prepended to the path latchkey sends upstream.
    pub path_prefix: Option<Spanned<String>>,
}

/// `inject.basic_auth = { user = "...", password = "{{secret.x}}" }`.
#[derive(Debug, Default)]
pub struct RawBasicAuth {
    pub user: Option<Spanned<String>>,
    pub password: Option<Spanned<String>>,
}

const TOP_KEYS: &[&str] = &[
    "secrets",
    "rules",
    "deny",
    "identities",
    "profiles",
    "attest",
    "admin",
    "credentials",
    "ask",
    "notify",
    "limits",
    "prices",
    "vault",
];
pub(super) const SECRET_KEYS: &[&str] = &["source", "ttl", "timeout", "refresh", "stale_for"];
pub(super) const IDENTITY_KEYS: &[&str] = &["token", "sources", "rules", "labels", "limits"];
pub(super) const NOTIFY_KEYS: &[&str] = &["url", "secret", "format", "signing_secret", "approvers"];
pub(super) const LIMIT_KEYS: &[&str] = &[
    "per",
    "requests",
    "concurrency",
    "queue",
    "bytes_up",
    "llm_tokens",
    "spend",
    "reserve_tokens",
    "include_usage",
    "on_store_error",
];
pub(super) const PRICE_KEYS: &[&str] = &["input", "output", "cached_input"];
/// The policy-wide `[ask]` table's keys.
const ASK_KEYS: &[&str] = &[
    "unknown", "hold", "scope", "message", "notify", "rate", "expire",
];
/// A rule's `ask`: the per-request terms only (`unknown`, `rate`, `expire` are policy-wide).
const RULE_ASK_KEYS: &[&str] = &["hold", "scope", "message", "notify"];
pub(super) const RULE_KEYS: &[&str] = &[
    "name",
    "description",
    "hosts",
    "ports",
    "methods",
    "paths",
    "tunnel",
    "websocket",
    "inject",
    "secrets",
    "placeholders",
    "keep_headers",
    "credential",
    "mode",
    "allow_private",
    "dangerously_inject_into_wildcard",
    "schemes",
    "dangerously_allow_cleartext",
    "ask",
    "limits",
    "mcp",
    "capture",
    "query",
    "headers",
    "body",
    "graphql",
];
const MCP_KEYS: &[&str] = &["tools", "deny_tools", "methods", "args", "filter_list"];
const CAPTURE_KEYS: &[&str] = &["fields", "as", "hosts", "ttl"];
const INJECT_KEYS: &[&str] = &["headers", "query", "basic_auth", "path_prefix"];
const BASIC_KEYS: &[&str] = &["user", "password"];

/// Parses one file's text into a spanned document; a syntax error stops this file only.
pub fn parse(text: &str) -> Result<toml_edit::ImDocument<&str>, (Range<usize>, String)> {
    toml_edit::ImDocument::parse(text).map_err(|e| {
        // toml leaves the message empty for some errors (a control character in a comment);
        // never report an empty problem.
        let message = match e.message().trim() {
            "" => "invalid TOML: a control character or malformed token here".to_string(),
            // One problem, one line: toml puts what it expected on a second line.
            m => format!(
                "invalid TOML: {}",
                m.split_whitespace().collect::<Vec<_>>().join(" ")
            ),
        };
        (e.span().unwrap_or(0..0), message)
    })
}

/// Reads a parsed file, reporting every unknown key, missing key and wrongly typed value.
pub(super) fn read_file(doc: &toml_edit::Table, r: &mut dyn Report) -> RawPolicyFile {
    let root = Fields::new(doc, 0..0, String::new(), TOP_KEYS, r);
    let admin = root.table(r, "admin", ADMIN_KEYS);
    RawPolicyFile {
        secrets: root
            .named_tables("secrets", r)
            .into_iter()
            .map(|(name, t)| (name, entry(t, r, read_secret)))
            .collect(),
        rules: root
            .table_list("rules", r)
            .into_iter()
            .map(|t| entry(t, r, read_rule))
            .collect(),
        deny: root
            .table_list_of("deny", RULE_KEYS, r)
            .into_iter()
            .map(|t| entry(t, r, read_deny))
            .collect(),
        identities: root
            .named_tables("identities", r)
            .into_iter()
            .map(|(name, t)| {
                // `[identities.default]` may carry labels alone: it needs no `rules`.
                let read = if name.get_ref() == super::DEFAULT_IDENTITY {
                    read_default_identity
                } else {
                    read_identity
                };
                (name, entry(t, r, read))
            })
            .collect(),
        profiles: root
            .named_tables("profiles", r)
            .into_iter()
            .map(|(name, t)| (name, entry(t, r, read_profile)))
            .collect(),
        attest: root
            .named_tables("attest", r)
            .into_iter()
            .map(|(name, t)| (name, entry(t, r, read_attest)))
            .collect(),
        admin_tokens: admin
            .as_ref()
            .map(|admin| {
                admin
                    .named_tables("tokens", r)
                    .into_iter()
                    .map(|(name, t)| (name, entry(t, r, read_admin_token)))
                    .collect()
            })
            .unwrap_or_default(),
        admin_oidc: admin
            .as_ref()
            .and_then(|admin| admin.table(r, "oidc", OIDC_KEYS))
            .map(|t| entry(Ok(t), r, read_oidc)),
        credentials: root
            .named_tables("credentials", r)
            .into_iter()
            .map(|(name, t)| (name, entry(t, r, read_credential)))
            .collect(),
        ask: root
            .table(r, "ask", ASK_KEYS)
            .map(|t| entry(Ok(t), r, read_ask)),
        notify: root
            .named_tables("notify", r)
            .into_iter()
            .map(|(name, t)| (name, entry(t, r, read_notify)))
            .collect(),
        limits: root
            .named_tables("limits", r)
            .into_iter()
            .map(|(name, t)| (name, entry(t, r, read_limit)))
            .collect(),
        prices: root
            .named_tables("prices", r)
            .into_iter()
            .map(|(name, t)| (name, entry(t, r, read_price)))
            .collect(),
        vault: super::schema_vault::read(&root, r),
    }
}

fn read_limit(t: &Fields<'_>, r: &mut dyn Report) -> RawLimit {
    RawLimit {
        keys: LIMIT_KEYS
            .iter()
            .filter(|k| t.get(k).is_some())
            .copied()
            .collect(),
        per: t.string(r, "per"),
        requests: t.string(r, "requests"),
        concurrency: t.int(r, "concurrency"),
        queue: t.string(r, "queue"),
        bytes_up: t.string(r, "bytes_up"),
        llm_tokens: t.string(r, "llm_tokens"),
        spend: t.string(r, "spend"),
        reserve_tokens: t.int(r, "reserve_tokens"),
        include_usage: t.boolean(r, "include_usage"),
        on_store_error: t.string(r, "on_store_error"),
    }
}

fn read_price(t: &Fields<'_>, r: &mut dyn Report) -> RawPrice {
    RawPrice {
        input: t.required(r, "input", Fields::number),
        output: t.required(r, "output", Fields::number),
        cached_input: t.number(r, "cached_input"),
    }
}

fn read_ask(t: &Fields<'_>, r: &mut dyn Report) -> RawAsk {
    RawAsk {
        unknown: t.boolean(r, "unknown"),
        hold: t.string(r, "hold"),
        scope: t.strings(r, "scope"),
        message: t.string(r, "message"),
        notify: t.strings(r, "notify"),
        rate: t.string(r, "rate"),
        expire: t.string(r, "expire"),
    }
}

/// A rule's `ask`: the keys `[ask]` takes for every request, not the policy-wide ones.
fn read_rule_ask(t: &Fields<'_>, r: &mut dyn Report) -> RawAsk {
    RawAsk {
        hold: t.string(r, "hold"),
        scope: t.strings(r, "scope"),
        message: t.string(r, "message"),
        notify: t.strings(r, "notify"),
        ..RawAsk::default()
    }
}

fn read_notify(t: &Fields<'_>, r: &mut dyn Report) -> RawNotify {
    RawNotify {
        url: t.required(r, "url", Fields::string),
        secret: t.string(r, "secret"),
        format: t.string(r, "format"),
        signing_secret: t.string(r, "signing_secret"),
        approvers: t.strings(r, "approvers"),
    }
}

/// Reads a file whose problems do not matter here (it compiled, or the caller reports them
/// elsewhere); `None` if it does not parse.
pub fn read_lenient(text: &str) -> Option<RawPolicyFile> {
    struct Discard(usize);
    impl Report for Discard {
        fn error(&mut self, _: Range<usize>, _: String) {
            self.0 += 1;
        }
        fn count(&self) -> usize {
            self.0
        }
    }
    let doc = parse(text).ok()?;
    Some(read_file(doc.as_table(), &mut Discard(0)))
}

/// Reads one entry, noting whether it added a problem. `None`: not a table (already reported).
pub(super) fn entry<T: Default>(
    table: Result<Fields<'_>, Range<usize>>,
    r: &mut dyn Report,
    read: impl FnOnce(&Fields<'_>, &mut dyn Report) -> T,
) -> Entry<T> {
    match table {
        Ok(t) => {
            let before = r.count();
            let raw = read(&t, r);
            Entry {
                span: t.span.clone(),
                raw,
                complete: t.complete && r.count() == before,
            }
        }
        Err(span) => Entry {
            span,
            raw: T::default(),
            complete: false,
        },
    }
}

fn read_secret(t: &Fields<'_>, r: &mut dyn Report) -> RawSecret {
    RawSecret {
        source: t.required(r, "source", Fields::string),
        ttl: t.string(r, "ttl"),
        timeout: t.string(r, "timeout"),
        refresh: t.string(r, "refresh"),
        stale_for: t.string(r, "stale_for"),
    }
}

fn read_identity(t: &Fields<'_>, r: &mut dyn Report) -> RawIdentity {
    RawIdentity {
        token: t.string(r, "token"),
        sources: t.strings(r, "sources"),
        rules: t.required(r, "rules", Fields::strings),
        labels: t.string_map(r, "labels"),
        limits: t.strings(r, "limits"),
    }
}

/// `[identities.default]`: the same keys, none required (only `labels` is allowed there; the
/// compiler says so for the others).
fn read_default_identity(t: &Fields<'_>, r: &mut dyn Report) -> RawIdentity {
    RawIdentity {
        token: t.string(r, "token"),
        sources: t.strings(r, "sources"),
        rules: t.strings(r, "rules"),
        labels: t.string_map(r, "labels"),
        limits: t.strings(r, "limits"),
    }
}

/// A `[[deny]]` entry: a rule's reader, after refusing the keys only a rule takes.
fn read_deny(t: &Fields<'_>, r: &mut dyn Report) -> RawRule {
    super::schema_predicates::refuse_rule_only_keys(t, t.path(), r);
    read_rule(t, r)
}

fn read_rule(t: &Fields<'_>, r: &mut dyn Report) -> RawRule {
    RawRule {
        predicates: super::schema_predicates::read_predicates(t, r),
        name: t.required(r, "name", Fields::string),
        description: t.string(r, "description").map(Spanned::into_inner),
        hosts: t.required(r, "hosts", Fields::strings),
        ports: t.ints(r, "ports"),
        methods: t.strings(r, "methods"),
        paths: t.strings(r, "paths"),
        tunnel: t.boolean(r, "tunnel"),
        websocket: t.boolean(r, "websocket"),
        inject: t.table(r, "inject", INJECT_KEYS).map(|i| RawInject {
            headers: i
                .string_map(r, "headers")
                .map(Spanned::into_inner)
                .unwrap_or_default(),
            query: i
                .string_map(r, "query")
                .map(Spanned::into_inner)
                .unwrap_or_default(),
            basic_auth: i.table(r, "basic_auth", BASIC_KEYS).map(|b| {
                Spanned::new(
                    b.span.clone(),
                    RawBasicAuth {
                        user: b.required(r, "user", Fields::string),
                        password: b.required(r, "password", Fields::string),
                    },
                )
            }),
            path_prefix: i.string(r, "path_prefix"),
        }),
        secrets: t.strings(r, "secrets"),
        placeholders: t.strings(r, "placeholders"),
        keep_headers: t.strings(r, "keep_headers"),
        credential: t.string(r, "credential"),
        mode: t.string(r, "mode"),
        allow_private: t.strings(r, "allow_private"),
        dangerously_inject_into_wildcard: t.boolean(r, "dangerously_inject_into_wildcard"),
        schemes: t.strings(r, "schemes"),
        dangerously_allow_cleartext: t.boolean(r, "dangerously_allow_cleartext"),
        ask: t
            .table(r, "ask", RULE_ASK_KEYS)
            .map(|a| Spanned::new(a.span.clone(), read_rule_ask(&a, r))),
        limits: t.strings(r, "limits"),
        mcp: t.table(r, "mcp", MCP_KEYS).map(|m| {
            Spanned::new(
                m.span.clone(),
                RawMcp {
                    tools: m.strings(r, "tools"),
                    deny_tools: m.strings(r, "deny_tools"),
                    methods: m.strings(r, "methods"),
                    args: m
                        .string_map(r, "args")
                        .map(Spanned::into_inner)
                        .unwrap_or_default(),
                    filter_list: m.boolean(r, "filter_list"),
                },
            )
        }),
        capture: t.table(r, "capture", CAPTURE_KEYS).map(|c| {
            Spanned::new(
                c.span.clone(),
                RawCapture {
                    fields: c.required(r, "fields", Fields::strings),
                    name: c.required(r, "as", Fields::string),
                    hosts: c.strings(r, "hosts"),
                    ttl: c.string(r, "ttl"),
                },
            )
        }),
    }
}

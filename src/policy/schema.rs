//! Raw policy types: exactly what a policy file says, with source spans, before validation.
//!
//! Nothing here is trusted; `compile` turns these into a [`super::Policy`] or reports every
//! problem it finds. Unknown keys are errors (`deny_unknown_fields`), never silently ignored.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// One policy file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicyFile {
    #[serde(default)]
    pub secrets: BTreeMap<Spanned<String>, Spanned<RawSecret>>,
    #[serde(default)]
    pub rules: Vec<Spanned<RawRule>>,
    #[serde(default)]
    pub identities: BTreeMap<Spanned<String>, Spanned<RawIdentity>>,
    #[serde(default)]
    pub credentials: BTreeMap<Spanned<String>, Spanned<RawCredential>>,
}

/// `[credentials.NAME.assume_role]`: trade the base keys for a role's temporary keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAssumeRole {
    pub role_arn: String,
    #[serde(default)]
    pub session_name: Option<String>,
    #[serde(default)]
    pub duration: Option<String>,
    #[serde(default)]
    pub external_id: Option<String>,
    /// Default `https://sts.amazonaws.com` (region us-east-1).
    #[serde(default)]
    pub sts_endpoint: Option<String>,
    #[serde(default)]
    pub sts_region: Option<String>,
}

/// `[credentials.NAME]`: a signing or token-minting credential. Which keys apply depends on
/// `kind`; compile rejects keys that do not belong to it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCredential {
    pub kind: Spanned<String>,
    // aws_sigv4
    pub access_key_id: Option<Spanned<String>>,
    pub secret_access_key: Option<Spanned<String>>,
    pub session_token: Option<Spanned<String>>,
    pub region: Option<Spanned<String>>,
    pub service: Option<Spanned<String>>,
    pub max_signed_body: Option<Spanned<i64>>,
    pub assume_role: Option<Spanned<RawAssumeRole>>,
    // github_app
    pub app_id: Option<Spanned<String>>,
    pub installation_id: Option<Spanned<String>>,
    pub private_key: Option<Spanned<String>>,
    pub api: Option<Spanned<String>>,
    pub permissions: Option<Spanned<BTreeMap<String, String>>>,
    pub repositories: Option<Spanned<Vec<String>>>,
    // google_service_account
    pub key: Option<Spanned<String>>,
    pub scopes: Option<Spanned<Vec<String>>>,
    pub token_uri: Option<Spanned<String>>,
    // oauth2_client_credentials
    pub token_url: Option<Spanned<String>>,
    pub client_id: Option<Spanned<String>>,
    pub client_secret: Option<Spanned<String>>,
    pub scope: Option<Spanned<String>>,
    pub audience: Option<Spanned<String>>,
    // jwt
    pub alg: Option<Spanned<String>>,
    pub ttl: Option<Spanned<String>>,
    pub header: Option<Spanned<String>>,
    pub claims: Option<Spanned<BTreeMap<String, toml::Value>>>,
}

/// `[identities.NAME]`: how a sandbox is recognised and which rules it may use.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdentity {
    /// A secret source; the sandbox sends it as `Proxy-Authorization`.
    #[serde(default)]
    pub token: Option<Spanned<String>>,
    /// Client address ranges.
    #[serde(default)]
    pub sources: Option<Spanned<Vec<Spanned<String>>>>,
    /// Rule names this identity may use; `["*"]` for all.
    pub rules: Spanned<Vec<Spanned<String>>>,
}

/// `[secrets.NAME]`: where a secret's value comes from.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSecret {
    pub source: Spanned<String>,
    /// exec only: how long a fetched value is used.
    #[serde(default)]
    pub ttl: Option<Spanned<String>>,
    /// exec only: how long the helper may run.
    #[serde(default)]
    pub timeout: Option<Spanned<String>>,
}

/// One `[[rules]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    pub name: Spanned<String>,
    /// Free text for reviewers; shown by `explain`.
    #[serde(default)]
    pub description: Option<String>,
    pub hosts: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    pub ports: Option<Spanned<Vec<Spanned<i64>>>>,
    #[serde(default)]
    pub methods: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub paths: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub tunnel: Option<Spanned<bool>>,
    #[serde(default)]
    pub inject: Option<RawInject>,
    /// Secrets bound to this rule's hosts for placeholders, besides those it injects.
    #[serde(default)]
    pub secrets: Option<Spanned<Vec<Spanned<String>>>>,
    /// Where placeholders may be replaced: header, basic_auth, query, body.
    #[serde(default)]
    pub placeholders: Option<Spanned<Vec<Spanned<String>>>>,
    /// Auth headers this rule does not strip (e.g. cookie).
    #[serde(default)]
    pub keep_headers: Option<Spanned<Vec<Spanned<String>>>>,
    /// A `[credentials.NAME]` that signs or authenticates this rule's requests.
    #[serde(default)]
    pub credential: Option<Spanned<String>>,
    /// `enforce` (default) or `report`: a request this rule comes closest to but does not
    /// allow goes through and is audited with `would_deny = true`.
    #[serde(default)]
    pub mode: Option<Spanned<String>>,
    /// Non-public address ranges this rule may reach (e.g. an internal service).
    #[serde(default)]
    pub allow_private: Option<Spanned<Vec<Spanned<String>>>>,
    /// Required to bind a secret to a wildcard host: every matching host receives it.
    #[serde(default)]
    pub dangerously_inject_into_wildcard: Option<Spanned<bool>>,
}

/// `[rules.inject]`: what latchkey adds to an allowed request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInject {
    #[serde(default)]
    pub headers: BTreeMap<Spanned<String>, Spanned<String>>,
    #[serde(default)]
    pub query: BTreeMap<Spanned<String>, Spanned<String>>,
    #[serde(default)]
    pub basic_auth: Option<Spanned<RawBasicAuth>>,
}

/// `inject.basic_auth = { user = "...", password = "{{secret.x}}" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBasicAuth {
    pub user: Spanned<String>,
    pub password: Spanned<String>,
}

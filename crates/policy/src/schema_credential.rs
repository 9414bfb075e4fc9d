//! The raw form of a `[credentials.NAME]` entry, as read: every key any kind takes (compile,
//! in `credential`, checks which apply to the kind written).

use std::collections::BTreeMap;
use std::ops::Range;

use toml::Spanned;

use super::read::Fields;
use super::schema::{Claims, LimitList, Report, StringMap};

/// `[credentials.NAME.assume_role]`: trade the base keys for a role's temporary keys.
#[derive(Debug, Default)]
pub struct RawAssumeRole {
    pub role_arn: Option<String>,
    pub session_name: Option<String>,
    pub duration: Option<String>,
    pub external_id: Option<String>,
    /// Default `https://sts.amazonaws.com` (region us-east-1).
    pub sts_endpoint: Option<String>,
    pub sts_region: Option<String>,
}

/// `[credentials.NAME]`: a signing or token-minting credential. Which keys apply depends on
/// `kind`; compile rejects keys that do not belong to it.
#[derive(Debug, Default)]
pub struct RawCredential {
    pub kind: Option<Spanned<String>>,
    /// Every known key present, valid or not (for "does not apply" and "needs" checks).
    pub keys: Vec<(&'static str, Range<usize>)>,
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
    /// Claim name, its span, and its value as JSON.
    pub claims: Option<Spanned<Claims>>,
    // oauth2
    /// `client_credentials`, `refresh_token`, `password` or `jwt_bearer`.
    pub grant: Option<Spanned<String>>,
    /// `client_secret_post` (default) or `client_secret_basic`.
    pub client_auth: Option<Spanned<String>>,
    /// Header name → value template (`{{secret.X}}`), on the token request.
    pub token_endpoint_headers: Option<Spanned<StringMap>>,
    pub refresh_token: Option<Spanned<String>>,
    pub username: Option<Spanned<String>>,
    pub password: Option<Spanned<String>>,
    // hmac
    pub algorithm: Option<Spanned<String>>,
    pub encoding: Option<Spanned<String>>,
    pub message: Option<Spanned<String>>,
    pub timestamp: Option<Spanned<String>>,
    /// Header name → value template (`{{signature}}`, `{{timestamp}}`).
    pub headers: Option<Spanned<StringMap>>,
    // client_cert (and `key`)
    /// The PEM certificate chain presented to upstreams (a secret source).
    pub cert: Option<Spanned<String>>,
    /// `limits = ["NAME"]`: charged to every request this credential authenticates (any kind).
    pub limits: LimitList,
}

pub(super) const ASSUME_ROLE_KEYS: &[&str] = &[
    "role_arn",
    "session_name",
    "duration",
    "external_id",
    "sts_endpoint",
    "sts_region",
];

/// Every key any credential kind takes, besides `kind`.
pub(super) const CREDENTIAL_KEYS: &[&str] = &[
    "access_key_id",
    "secret_access_key",
    "session_token",
    "region",
    "service",
    "max_signed_body",
    "assume_role",
    "app_id",
    "installation_id",
    "private_key",
    "api",
    "permissions",
    "repositories",
    "key",
    "scopes",
    "token_uri",
    "token_url",
    "client_id",
    "client_secret",
    "scope",
    "audience",
    "alg",
    "ttl",
    "header",
    "claims",
    "grant",
    "client_auth",
    "token_endpoint_headers",
    "refresh_token",
    "username",
    "password",
    "algorithm",
    "encoding",
    "message",
    "timestamp",
    "headers",
    "cert",
];

pub(super) fn read_credential(t: &Fields<'_>, r: &mut dyn Report) -> RawCredential {
    let plain = |v: Option<Spanned<Vec<Spanned<String>>>>| {
        v.map(|l| {
            let span = l.span();
            Spanned::new(
                span,
                l.into_inner().into_iter().map(|s| s.into_inner()).collect(),
            )
        })
    };
    RawCredential {
        kind: t.required(r, "kind", Fields::string),
        keys: CREDENTIAL_KEYS
            .iter()
            .filter_map(|k| t.get(k).map(|(span, _)| (*k, span)))
            .collect(),
        access_key_id: t.string(r, "access_key_id"),
        secret_access_key: t.string(r, "secret_access_key"),
        session_token: t.string(r, "session_token"),
        region: t.string(r, "region"),
        service: t.string(r, "service"),
        max_signed_body: t.int(r, "max_signed_body"),
        assume_role: t.table(r, "assume_role", ASSUME_ROLE_KEYS).map(|a| {
            let s = |r: &mut dyn Report, k| a.string(r, k).map(Spanned::into_inner);
            let raw = RawAssumeRole {
                role_arn: a
                    .required(r, "role_arn", Fields::string)
                    .map(Spanned::into_inner),
                session_name: s(r, "session_name"),
                duration: s(r, "duration"),
                external_id: s(r, "external_id"),
                sts_endpoint: s(r, "sts_endpoint"),
                sts_region: s(r, "sts_region"),
            };
            Spanned::new(a.span.clone(), raw)
        }),
        app_id: t.string(r, "app_id"),
        installation_id: t.string(r, "installation_id"),
        private_key: t.string(r, "private_key"),
        api: t.string(r, "api"),
        permissions: t.string_map(r, "permissions").map(|m| {
            let span = m.span();
            let map = m.into_inner().into_iter();
            Spanned::new(
                span,
                map.map(|(k, v)| (k.into_inner(), v.into_inner())).collect(),
            )
        }),
        repositories: plain(t.strings(r, "repositories")),
        key: t.string(r, "key"),
        scopes: plain(t.strings(r, "scopes")),
        token_uri: t.string(r, "token_uri"),
        token_url: t.string(r, "token_url"),
        client_id: t.string(r, "client_id"),
        client_secret: t.string(r, "client_secret"),
        scope: t.string(r, "scope"),
        audience: t.string(r, "audience"),
        alg: t.string(r, "alg"),
        ttl: t.string(r, "ttl"),
        header: t.string(r, "header"),
        claims: t.claims(r, "claims"),
        grant: t.string(r, "grant"),
        client_auth: t.string(r, "client_auth"),
        token_endpoint_headers: t.string_map(r, "token_endpoint_headers"),
        refresh_token: t.string(r, "refresh_token"),
        username: t.string(r, "username"),
        password: t.string(r, "password"),
        algorithm: t.string(r, "algorithm"),
        encoding: t.string(r, "encoding"),
        message: t.string(r, "message"),
        timestamp: t.string(r, "timestamp"),
        headers: t.string_map(r, "headers"),
        cert: t.string(r, "cert"),
        limits: t.strings(r, "limits"),
    }
}

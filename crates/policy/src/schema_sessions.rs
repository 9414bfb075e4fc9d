//! The raw forms of what runtime sessions are admitted by: `[profiles.NAME]`, `[attest.NAME]`
//! and `[admin.tokens.NAME]`, as read (the compiled forms are in `profile` and `access`).

use toml::Spanned;

use super::read::Fields;
use super::schema::Report;
use super::schema::{Entry, LimitList, StringMap};

/// `[profiles.NAME]`: the reviewed ceiling of every runtime session made from it.
#[derive(Debug, Default)]
pub struct RawProfile {
    /// Rule names its sessions may use (`["*"]` for all); or `inherits`.
    pub rules: Option<Spanned<Vec<Spanned<String>>>>,
    /// An identity whose rules (and labels, limits) the profile takes.
    pub inherits: Option<Spanned<String>>,
    /// Labels every session of it carries.
    pub labels: Option<Spanned<StringMap>>,
    /// Label keys the caller must give each session.
    pub require_labels: Option<Spanned<Vec<Spanned<String>>>>,
    /// The longest a session may live. Required.
    pub ttl: Option<Spanned<String>>,
    /// `limits = ["NAME"]`: charged to every request of its sessions.
    pub limits: LimitList,
    /// What a session may narrow: `hosts`, `secrets`, `limits` (default: all three).
    pub narrow: Option<Spanned<Vec<Spanned<String>>>>,
    /// Client address ranges its sessions may come from (and be bound to).
    pub sources: Option<Spanned<Vec<Spanned<String>>>>,
}

/// `[attest.NAME]`: a workload-token issuer whose tokens admit sessions of a profile.
#[derive(Debug, Default)]
pub struct RawAttest {
    pub issuer: Option<Spanned<String>>,
    /// `file:PATH` or an `https://` URL of the issuer's JWKS.
    pub jwks: Option<Spanned<String>>,
    pub audience: Option<Spanned<String>>,
    pub profile: Option<Spanned<String>>,
    /// Session label → `claim.PATH` of the token.
    pub labels: Option<Spanned<StringMap>>,
}

/// `[admin.tokens.NAME]`: a token for the admin API and what it may do.
#[derive(Debug, Default)]
pub struct RawAdminToken {
    /// A secret source (`env:VAR`, `file:PATH`, `exec:…`).
    pub token: Option<Spanned<String>>,
    pub scopes: Option<Spanned<Vec<Spanned<String>>>>,
}

/// `[admin.oidc]`: the console's sign-in through an OpenID Connect issuer.
#[derive(Debug, Default)]
pub struct RawOidc {
    pub issuer: Option<Spanned<String>>,
    pub client_id: Option<Spanned<String>>,
    /// A secret source; absent for a public client (PKCE alone).
    pub client_secret: Option<Spanned<String>>,
    pub redirect_uri: Option<Spanned<String>>,
    pub name_claim: Option<Spanned<String>>,
    /// `[admin.oidc.roles.NAME]`: which claim value grants which scopes.
    pub roles: Vec<(Spanned<String>, Entry<RawOidcRole>)>,
}

/// `[admin.oidc.roles.NAME]`.
#[derive(Debug, Default)]
pub struct RawOidcRole {
    /// A claim path (`groups`, `email`, `realm_access.roles`).
    pub claim: Option<Spanned<String>>,
    /// The value the claim must be, or (an array claim) contain.
    pub equals: Option<Spanned<String>>,
    pub scopes: Option<Spanned<Vec<Spanned<String>>>>,
}

pub(super) const PROFILE_KEYS: &[&str] = &[
    "rules",
    "inherits",
    "labels",
    "require_labels",
    "ttl",
    "limits",
    "narrow",
    "sources",
];
pub(super) const ATTEST_KEYS: &[&str] = &["issuer", "jwks", "audience", "profile", "labels"];
pub(super) const ADMIN_TOKEN_KEYS: &[&str] = &["token", "scopes"];
pub(super) const ADMIN_KEYS: &[&str] = &["tokens", "oidc"];
pub(super) const OIDC_KEYS: &[&str] = &[
    "issuer",
    "client_id",
    "client_secret",
    "redirect_uri",
    "name_claim",
    "roles",
];
pub(super) const OIDC_ROLE_KEYS: &[&str] = &["claim", "equals", "scopes"];

pub(super) fn read_attest(t: &Fields<'_>, r: &mut dyn Report) -> RawAttest {
    RawAttest {
        issuer: t.required(r, "issuer", Fields::string),
        jwks: t.required(r, "jwks", Fields::string),
        audience: t.required(r, "audience", Fields::string),
        profile: t.required(r, "profile", Fields::string),
        labels: t.string_map(r, "labels"),
    }
}

pub(super) fn read_admin_token(t: &Fields<'_>, r: &mut dyn Report) -> RawAdminToken {
    RawAdminToken {
        token: t.required(r, "token", Fields::string),
        scopes: t.required(r, "scopes", Fields::strings),
    }
}

pub(super) fn read_oidc(t: &Fields<'_>, r: &mut dyn Report) -> RawOidc {
    RawOidc {
        issuer: t.required(r, "issuer", Fields::string),
        client_id: t.required(r, "client_id", Fields::string),
        client_secret: t.string(r, "client_secret"),
        redirect_uri: t.required(r, "redirect_uri", Fields::string),
        name_claim: t.string(r, "name_claim"),
        roles: t
            .named_tables("roles", r)
            .into_iter()
            .map(|(name, role)| (name, super::schema::entry(role, r, read_oidc_role)))
            .collect(),
    }
}

fn read_oidc_role(t: &Fields<'_>, r: &mut dyn Report) -> RawOidcRole {
    RawOidcRole {
        claim: t.required(r, "claim", Fields::string),
        equals: t.required(r, "equals", Fields::string),
        scopes: t.required(r, "scopes", Fields::strings),
    }
}

pub(super) fn read_profile(t: &Fields<'_>, r: &mut dyn Report) -> RawProfile {
    RawProfile {
        rules: t.strings(r, "rules"),
        inherits: t.string(r, "inherits"),
        labels: t.string_map(r, "labels"),
        require_labels: t.strings(r, "require_labels"),
        ttl: t.required(r, "ttl", Fields::string),
        limits: t.strings(r, "limits"),
        narrow: t.strings(r, "narrow"),
        sources: t.strings(r, "sources"),
    }
}

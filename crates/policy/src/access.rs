//! Who may reach latchkey itself, as reviewed policy: scoped admin API tokens
//! (`[admin.tokens.NAME]`) and the workload-token issuers whose tokens admit a sandbox as a
//! session of a profile (`[attest.NAME]`). Compiled here (phase 3d); the admin API checks the
//! scopes, `governance::sessions` verifies attestations.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use toml::Spanned;

use super::compile::{line_col, FileCx, Keyed, Parsed, PolicyError};
use super::identity::Identity;
use super::schema::{Entry, RawAdminToken, RawAttest, RawOidc, RawOidcRole};
use super::Origin;
use crate::secrets::Source;

/// What an admin token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AdminScope {
    /// Every `GET` (status, metrics, limits, explain, approvals, grants, sessions, the
    /// OpenAPI document).
    Read,
    /// Make, extend and revoke sessions.
    SessionsWrite,
    /// Answer approvals.
    ApprovalsAnswer,
    /// `POST /reload`.
    Reload,
}

impl AdminScope {
    pub const ALL: [AdminScope; 4] = [
        AdminScope::Read,
        AdminScope::SessionsWrite,
        AdminScope::ApprovalsAnswer,
        AdminScope::Reload,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AdminScope::Read => "read",
            AdminScope::SessionsWrite => "sessions:write",
            AdminScope::ApprovalsAnswer => "approvals:answer",
            AdminScope::Reload => "reload",
        }
    }

    pub fn parse(text: &str) -> Option<AdminScope> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// A compiled `[admin.tokens.NAME]`: its value is in the secret store under [`admin_token_key`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminToken {
    pub name: String,
    pub scopes: BTreeSet<AdminScope>,
}

/// The store key of an admin token (not a valid secret name, so never clashes).
pub fn admin_token_key(name: &str) -> String {
    format!("admin-token:{name}")
}

/// The store key of `[admin.oidc] client_secret` (not a valid secret name, so never clashes).
pub const OIDC_SECRET_KEY: &str = "admin-oidc:client-secret";

/// The one path `[admin.oidc] redirect_uri` may name: the console's callback.
pub const OIDC_CALLBACK_PATH: &str = "/ui/oidc/callback";

/// A compiled `[admin.oidc]`: the console's sign-in through an OpenID Connect issuer (the
/// authorization code flow with PKCE). A person's scopes are the union of the roles their ID
/// token's claims match; matching none, they are not let in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oidc {
    /// Exactly as the issuer's discovery document and ID tokens must say it.
    pub issuer: String,
    pub client_id: String,
    /// Whether `client_secret` was given: its value is in the secret store under
    /// [`OIDC_SECRET_KEY`] and authenticates the code exchange (`client_secret_basic`).
    pub confidential: bool,
    /// Where the issuer sends the browser back: this listener's [`OIDC_CALLBACK_PATH`].
    pub redirect_uri: url::Url,
    /// The claim a signed-in person is named by (default `email`, else `sub`).
    pub name_claim: String,
    pub roles: Vec<OidcRole>,
    pub origin: Origin,
}

/// `[admin.oidc.roles.NAME]`: a claim value that grants scopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcRole {
    pub name: String,
    /// A claim path, dots between levels (`groups`, `realm_access.roles`).
    pub claim: String,
    /// The value the claim must be, or (an array claim) contain.
    pub equals: String,
    pub scopes: BTreeSet<AdminScope>,
}

/// Where an issuer's keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    File(PathBuf),
    /// Fetched through the guarded dialer and cached.
    Url(url::Url),
}

/// A compiled `[attest.NAME]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attest {
    pub name: String,
    pub issuer: String,
    pub audience: String,
    pub jwks: JwksSource,
    /// The profile its tokens admit sessions of.
    pub profile: String,
    /// Session label → claim path (without the `claim.` prefix).
    pub labels: BTreeMap<String, String>,
    pub origin: Origin,
}

/// Phase 3d: admin tokens (their values join the secret sources) and attestation issuers
/// (each naming a profile compiled by then).
pub(super) fn compile_access(
    parsed: &mut Parsed<'_>,
    errors: &mut Vec<PolicyError>,
    identities: &[Identity],
    keyed: &mut Keyed,
) -> (Vec<AdminToken>, Vec<Attest>, Option<Oidc>) {
    let mut tokens: Vec<AdminToken> = Vec::new();
    let mut attests: Vec<Attest> = Vec::new();
    let mut oidc: Option<Oidc> = None;
    for (fi, (file, text, raw)) in parsed.iter_mut().enumerate() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        for (name, entry) in std::mem::take(&mut raw.admin_tokens) {
            if let Some((t, source, span)) = admin_token(&mut cx, &name, entry, &tokens) {
                let origin = Origin {
                    file: cx.file.to_path_buf(),
                    line: line_col(cx.text, name.span().start).0,
                };
                keyed.add(admin_token_key(&t.name), (fi, span, origin), source);
                tokens.push(t);
            }
        }
        for (name, entry) in std::mem::take(&mut raw.attest) {
            if let Some(a) = attest(&mut cx, name, entry, identities, &attests) {
                attests.push(a);
            }
        }
        if let Some(entry) = raw.admin_oidc.take() {
            if let Some(first) = &oidc {
                cx.error(
                    entry.span.clone(),
                    format!(
                        "admin.oidc: defined twice (first in {} line {}); one issuer signs people in",
                        first.origin.file.display(),
                        first.origin.line
                    ),
                );
            } else if let Some((o, secret)) = compile_oidc(&mut cx, entry) {
                if let Some((source, span)) = secret {
                    let origin = o.origin.clone();
                    keyed.add(OIDC_SECRET_KEY.to_string(), (fi, span, origin), source);
                }
                oidc = Some(o);
            }
        }
    }
    (tokens, attests, oidc)
}

/// A secret's source and the span it is declared at.
type Declared = (Source, std::ops::Range<usize>);

/// `[admin.oidc]`, and its client secret's source (with the span it is declared at).
fn compile_oidc(cx: &mut FileCx<'_>, entry: Entry<RawOidc>) -> Option<(Oidc, Option<Declared>)> {
    let before = cx.errors.len();
    let raw = entry.raw;
    let issuer = raw.issuer.as_ref().and_then(|i| {
        let text = i.get_ref();
        match url::Url::parse(text) {
            Ok(u) if u.scheme() == "https" && u.host_str().is_some() && u.query().is_none()
                && u.fragment().is_none() => Some(text.clone()),
            Ok(_) => {
                cx.error(i.span(), format!("admin.oidc.issuer: {text:?} must be an https URL with no query or fragment (the issuer's identifier, as its discovery document says it)"));
                None
            }
            Err(e) => {
                cx.error(i.span(), format!("admin.oidc.issuer: {text:?} is not a URL: {e}"));
                None
            }
        }
    });
    if let Some(c) = raw
        .client_id
        .as_ref()
        .filter(|c| c.get_ref().trim().is_empty())
    {
        cx.error(
            c.span(),
            "admin.oidc.client_id: must not be empty".to_string(),
        );
    }
    let redirect = raw.redirect_uri.as_ref().and_then(|r| {
        let text = r.get_ref();
        match url::Url::parse(text) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some()
                && u.path() == OIDC_CALLBACK_PATH && u.query().is_none() && u.fragment().is_none() => Some(u),
            Ok(_) => {
                cx.error(r.span(), format!("admin.oidc.redirect_uri: {text:?} must be this admin listener's http(s) URL with the path {OIDC_CALLBACK_PATH} and no query"));
                None
            }
            Err(e) => {
                cx.error(r.span(), format!("admin.oidc.redirect_uri: {text:?} is not a URL: {e}"));
                None
            }
        }
    });
    let name_claim = match &raw.name_claim {
        Some(n) if n.get_ref().trim().is_empty() => {
            cx.error(
                n.span(),
                "admin.oidc.name_claim: must not be empty".to_string(),
            );
            String::new()
        }
        Some(n) => n.get_ref().clone(),
        None => "email".to_string(),
    };
    let secret = match &raw.client_secret {
        None => None,
        Some(s) => match Source::parse(
            s.get_ref(),
            std::time::Duration::from_secs(300),
            std::time::Duration::from_secs(10),
        ) {
            Ok(source) => Some((source, s.span())),
            Err(e) => {
                cx.error(s.span(), format!("admin.oidc.client_secret: {e}"));
                None
            }
        },
    };
    if raw.roles.is_empty() {
        cx.error(
            entry.span.clone(),
            "admin.oidc: no [admin.oidc.roles.NAME]: nobody could sign in; a role grants scopes to whoever's claim matches".to_string(),
        );
    }
    let mut roles: Vec<OidcRole> = Vec::new();
    for (name, role) in raw.roles {
        if let Some(r) = oidc_role(cx, &name, role, &roles) {
            roles.push(r);
        }
    }
    if !(entry.complete && cx.errors.len() == before) {
        return None;
    }
    let oidc = Oidc {
        issuer: issuer?,
        client_id: raw.client_id?.into_inner(),
        confidential: secret.is_some(),
        redirect_uri: redirect?,
        name_claim,
        roles,
        origin: Origin {
            file: cx.file.to_path_buf(),
            line: line_col(cx.text, entry.span.start).0,
        },
    };
    Some((oidc, secret))
}

fn oidc_role(
    cx: &mut FileCx<'_>,
    name: &Spanned<String>,
    entry: Entry<RawOidcRole>,
    seen: &[OidcRole],
) -> Option<OidcRole> {
    let field = format!("admin.oidc.roles.{}", name.get_ref());
    let before = cx.errors.len();
    if seen.iter().any(|r| &r.name == name.get_ref()) {
        cx.error(name.span(), format!("{field}: defined twice"));
    }
    let raw = entry.raw;
    for (key, value) in [("claim", &raw.claim), ("equals", &raw.equals)] {
        if let Some(v) = value.as_ref().filter(|v| v.get_ref().trim().is_empty()) {
            cx.error(v.span(), format!("{field}.{key}: must not be empty"));
        }
    }
    if let Some(c) = raw
        .claim
        .as_ref()
        .filter(|c| c.get_ref().starts_with("claim."))
    {
        cx.error(
            c.span(),
            format!(
                "{field}.claim: name the claim itself ({:?}), without \"claim.\"",
                &c.get_ref()["claim.".len()..]
            ),
        );
    }
    let scopes = raw
        .scopes
        .map(|list| scope_list(cx, &field, list))
        .unwrap_or_default();
    if !(entry.complete && cx.errors.len() == before) {
        return None;
    }
    Some(OidcRole {
        name: name.get_ref().clone(),
        claim: raw.claim?.into_inner(),
        equals: raw.equals?.into_inner(),
        scopes,
    })
}

/// `scopes = [...]` of `field`: at least one, each a known scope.
fn scope_list(
    cx: &mut FileCx<'_>,
    field: &str,
    list: Spanned<Vec<Spanned<String>>>,
) -> BTreeSet<AdminScope> {
    let mut scopes = BTreeSet::new();
    if list.get_ref().is_empty() {
        cx.error(
            list.span(),
            format!("{field}.scopes: no scope grants nothing; list at least one"),
        );
    }
    for (i, s) in list.into_inner().into_iter().enumerate() {
        match AdminScope::parse(s.get_ref()) {
            Some(scope) => {
                scopes.insert(scope);
            }
            None => cx.error(
                s.span(),
                format!(
                    "{field}.scopes[{i}]: unknown scope {:?}; use {}",
                    s.get_ref(),
                    AdminScope::ALL.map(AdminScope::as_str).join(", ")
                ),
            ),
        }
    }
    scopes
}

fn admin_token(
    cx: &mut FileCx<'_>,
    name: &Spanned<String>,
    entry: Entry<RawAdminToken>,
    seen: &[AdminToken],
) -> Option<(AdminToken, Source, std::ops::Range<usize>)> {
    let field = format!("admin.tokens.{}", name.get_ref());
    let before = cx.errors.len();
    if !crate::secrets::template::valid_name(name.get_ref()) {
        cx.error(
            name.span(),
            format!("{field}: token names use letters, digits, '-' and single '_'"),
        );
    } else if seen.iter().any(|t| &t.name == name.get_ref()) {
        cx.error(name.span(), format!("{field}: defined twice"));
    }
    let scopes = entry
        .raw
        .scopes
        .map(|list| scope_list(cx, &field, list))
        .unwrap_or_default();
    let token = entry.raw.token?;
    let source = match Source::parse(
        token.get_ref(),
        std::time::Duration::from_secs(300),
        std::time::Duration::from_secs(10),
    ) {
        Ok(s) => s,
        Err(e) => {
            cx.error(token.span(), format!("{field}.token: {e}"));
            return None;
        }
    };
    (entry.complete && cx.errors.len() == before).then(|| {
        (
            AdminToken {
                name: name.get_ref().clone(),
                scopes,
            },
            source,
            token.span(),
        )
    })
}

fn attest(
    cx: &mut FileCx<'_>,
    name: Spanned<String>,
    entry: Entry<RawAttest>,
    identities: &[Identity],
    seen: &[Attest],
) -> Option<Attest> {
    let field = format!("attest.{}", name.get_ref());
    let before = cx.errors.len();
    if !crate::secrets::template::valid_name(name.get_ref()) {
        cx.error(
            name.span(),
            format!("{field}: names use letters, digits, '-' and single '_'"),
        );
    } else if seen.iter().any(|a| &a.name == name.get_ref()) {
        cx.error(name.span(), format!("{field}: defined twice"));
    }
    let raw = entry.raw;
    let nonempty = |cx: &mut FileCx<'_>, v: &Option<Spanned<String>>, key: &str| {
        if let Some(v) = v.as_ref().filter(|v| v.get_ref().trim().is_empty()) {
            cx.error(v.span(), format!("{field}.{key}: must not be empty"));
        }
    };
    nonempty(cx, &raw.issuer, "issuer");
    nonempty(cx, &raw.audience, "audience");
    let jwks = raw
        .jwks
        .as_ref()
        .and_then(|j| match jwks_source(j.get_ref()) {
            Ok(s) => Some(s),
            Err(e) => {
                cx.error(j.span(), format!("{field}.jwks: {e}"));
                None
            }
        });
    if let Some(p) = &raw.profile {
        let is_profile = identities
            .iter()
            .any(|i| &i.name == p.get_ref() && i.profile.is_some());
        if !is_profile {
            let known = identities
                .iter()
                .filter(|i| i.profile.is_some())
                .map(|i| i.name.as_str());
            cx.error(
                p.span(),
                format!(
                    "{field}.profile: unknown profile {:?}{}",
                    p.get_ref(),
                    super::did_you_mean(p.get_ref(), known)
                ),
            );
        }
    }
    let mut labels = BTreeMap::new();
    if let Some(map) = raw.labels {
        for (k, v) in map.into_inner() {
            match v.get_ref().strip_prefix("claim.") {
                Some(path) if !path.is_empty() => {
                    labels.insert(k.get_ref().clone(), path.to_string());
                }
                _ => cx.error(
                    v.span(),
                    format!(
                        "{field}.labels.{}: {:?} must name a claim: \"claim.PATH\" (claim.sub, claim.kubernetes.io.namespace)",
                        k.get_ref(),
                        v.get_ref()
                    ),
                ),
            }
        }
    }
    if !(entry.complete && cx.errors.len() == before) {
        return None;
    }
    Some(Attest {
        name: name.get_ref().clone(),
        issuer: raw.issuer?.into_inner(),
        audience: raw.audience?.into_inner(),
        jwks: jwks?,
        profile: raw.profile?.into_inner(),
        labels,
        origin: Origin {
            file: cx.file.to_path_buf(),
            line: line_col(cx.text, name.span().start).0,
        },
    })
}

/// `file:PATH` or an `https://` URL.
fn jwks_source(text: &str) -> Result<JwksSource, String> {
    if let Some(path) = text.strip_prefix("file:") {
        if path.is_empty() {
            return Err("no path after file:".to_string());
        }
        return Ok(JwksSource::File(PathBuf::from(path)));
    }
    match url::Url::parse(text) {
        Ok(u) if u.scheme() == "https" && u.host_str().is_some() => Ok(JwksSource::Url(u)),
        Ok(_) => Err(format!(
            "{text:?}: a JWKS is fetched over https only (or file:PATH)"
        )),
        Err(e) => Err(format!(
            "{text:?} is neither file:PATH nor an https URL: {e}"
        )),
    }
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;

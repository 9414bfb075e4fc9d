//! Who may reach latchkey itself, as reviewed policy: scoped admin API tokens
//! (`[admin.tokens.NAME]`) and the workload-token issuers whose tokens admit a sandbox as a
//! session of a profile (`[attest.NAME]`). Compiled here (phase 3d); the admin API checks the
//! scopes, `governance::sessions` verifies attestations.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use toml::Spanned;

use super::compile::{line_col, FileCx, Keyed, Parsed, PolicyError};
use super::identity::Identity;
use super::schema::{Entry, RawAdminToken, RawAttest};
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
) -> (Vec<AdminToken>, Vec<Attest>) {
    let mut tokens: Vec<AdminToken> = Vec::new();
    let mut attests: Vec<Attest> = Vec::new();
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
    }
    (tokens, attests)
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
    let mut scopes = BTreeSet::new();
    if let Some(list) = entry.raw.scopes {
        if list.get_ref().is_empty() {
            cx.error(
                list.span(),
                format!("{field}.scopes: a token with no scope can do nothing; list at least one"),
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
    }
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

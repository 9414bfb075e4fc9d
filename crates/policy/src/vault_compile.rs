//! `[vault]` / `[vault.NAME]`: each connection checked (address, CA file, auth method and the
//! secret sources it logs in with, ranges) and compiled to a `secrets::VaultConnection`; then
//! every `vault:` source the policy declares gets its connection's settings, or an error at
//! its declaration naming the connection it could not find.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::compile::{FileCx, Keyed, Parsed};
use super::schema_vault::{RawVault, RawVaultAuth};
use super::PolicyError;
use crate::secrets::{Location, Source, VaultAuth, VaultConnection};
use crate::wire::cidr::Cidr;

/// The connections by name (`""`: `[vault]`), and where each was declared; `None` for one
/// declared with problems (reported), so a secret naming it is not reported again.
pub(super) type Connections = BTreeMap<String, (Option<Arc<VaultConnection>>, String)>;

/// Phase 2b: every file's `[vault]` tables.
pub(super) fn compile(parsed: &mut Parsed<'_>, errors: &mut Vec<PolicyError>) -> Connections {
    let mut out = Connections::new();
    for (file, text, raw) in parsed.iter_mut() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        for (name, conn) in std::mem::take(&mut raw.vault) {
            let span = name.span();
            let name = name.into_inner();
            let field = if name.is_empty() {
                "vault".to_string()
            } else {
                format!("vault.{name}")
            };
            if !name.is_empty() && !crate::secrets::remote::valid_connection_name(&name) {
                cx.error(
                    span.clone(),
                    format!("{field}: a connection name is letters, digits, '-' and '_'"),
                );
                continue;
            }
            let at = format!(
                "{}:{}",
                file.display(),
                super::compile::line_col(text, span.start).0
            );
            if let Some((_, first)) = out.get(&name) {
                cx.error(
                    span,
                    format!("{field}: declared again (first at {first}); one table per connection"),
                );
                continue;
            }
            let compiled = connection(&mut cx, &field, name.clone(), conn, span).map(Arc::new);
            out.insert(name, (compiled, at));
        }
    }
    out
}

fn connection(
    cx: &mut FileCx<'_>,
    field: &str,
    name: String,
    raw: RawVault,
    span: std::ops::Range<usize>,
) -> Option<VaultConnection> {
    let before = cx.errors.len();
    let address = match &raw.address {
        None => {
            cx.error(
                span.clone(),
                format!("{field}: address is required (https://HOST:PORT)"),
            );
            None
        }
        Some(a) => match address(a.get_ref()) {
            Ok(a) => Some(a),
            Err(why) => {
                cx.error(a.span(), format!("{field}.address: {why}"));
                None
            }
        },
    };
    // Read when latchkey first connects (`check` and `serve` report a file it cannot read):
    // `check --no-secrets` and `test` need no file of the serving machine.
    let ca = raw.ca.as_ref().map(|c| PathBuf::from(c.get_ref()));
    let namespace = raw.namespace.as_ref().and_then(|n| {
        let v = n.get_ref().trim_matches('/');
        if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c.is_control()) {
            cx.error(
                n.span(),
                format!("{field}.namespace: must be a non-empty path like \"team-a\""),
            );
            None
        } else {
            Some(v.to_string())
        }
    });
    let mut allow_private = Vec::new();
    for c in raw
        .allow_private
        .as_ref()
        .map(|l| l.get_ref().as_slice())
        .unwrap_or_default()
    {
        match Cidr::parse(c.get_ref()) {
            Ok(c) => allow_private.push(c),
            Err(e) => cx.error(c.span(), format!("{field}.allow_private: {e}")),
        }
    }
    let auth = match raw.auth {
        None => {
            cx.error(
                span,
                format!("{field}: auth is required (method = \"token\", \"approle\" or \"jwt\")"),
            );
            None
        }
        Some(a) => auth(cx, field, a),
    };
    if cx.errors.len() != before {
        return None;
    }
    Some(VaultConnection {
        name,
        address: address?,
        ca,
        namespace,
        auth: auth?,
        allow_private,
    })
}

/// `https://HOST[:PORT]` (or `http://` to a loopback address), no path, query or userinfo.
fn address(raw: &str) -> Result<String, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("{raw:?} is not a URL: {e}"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry credentials (use auth)".into());
    }
    if url.query().is_some() || url.fragment().is_some() || !matches!(url.path(), "" | "/") {
        return Err(format!(
            "{raw:?}: give only https://HOST[:PORT], no path or query"
        ));
    }
    let host = url.host().ok_or_else(|| format!("{raw:?} has no host"))?;
    let loopback = match host {
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
        url::Host::Domain(_) => false,
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => {
            return Err(format!(
                "{raw:?}: http:// would send the Vault token in cleartext; use https:// (http:// only to a loopback address)"
            ))
        }
        s => return Err(format!("{raw:?}: scheme {s:?} is not https")),
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// A secret source a login reads (env/file/exec; never another store).
fn login_source(
    cx: &mut FileCx<'_>,
    at: &str,
    v: &Option<toml::Spanned<String>>,
    span: &std::ops::Range<usize>,
) -> Option<Box<Source>> {
    let Some(v) = v else {
        cx.error(span.clone(), format!("{at} is required"));
        return None;
    };
    let ten = std::time::Duration::from_secs(10);
    match Source::parse(v.get_ref(), std::time::Duration::from_secs(300), ten) {
        Ok(Source::Remote(_)) => {
            cx.error(
                v.span(),
                format!("{at}: a login secret comes from env:, file: or exec:, not from a store"),
            );
            None
        }
        Ok(s) => Some(Box::new(s)),
        Err(e) => {
            cx.error(v.span(), format!("{at}: {e}"));
            None
        }
    }
}

fn auth(cx: &mut FileCx<'_>, field: &str, a: RawVaultAuth) -> Option<VaultAuth> {
    let at = |k: &str| format!("{field}.auth.{k}");
    let mount = |default: &str| {
        a.mount
            .as_ref()
            .map(|m| m.get_ref().trim_matches('/').to_string())
            .unwrap_or_else(|| default.to_string())
    };
    let Some(method) = &a.method else {
        cx.error(
            a.span.clone(),
            format!(
                "{}: required: \"token\", \"approle\" or \"jwt\"",
                at("method")
            ),
        );
        return None;
    };
    let unused = |cx: &mut FileCx<'_>, keys: &[(&str, bool)]| {
        for (k, set) in keys {
            if *set {
                cx.error(
                    a.span.clone(),
                    format!("{}: not used by method {:?}", at(k), method.get_ref()),
                );
            }
        }
    };
    match method.get_ref().as_str() {
        "token" => {
            unused(
                cx,
                &[
                    ("role_id", a.role_id.is_some()),
                    ("secret_id", a.secret_id.is_some()),
                    ("role", a.role.is_some()),
                    ("token_file", a.token_file.is_some()),
                    ("mount", a.mount.is_some()),
                ],
            );
            let token = login_source(cx, &at("token"), &a.token, &a.span)?;
            Some(VaultAuth::Token { token })
        }
        "approle" => {
            unused(
                cx,
                &[
                    ("token", a.token.is_some()),
                    ("role", a.role.is_some()),
                    ("token_file", a.token_file.is_some()),
                ],
            );
            let role_id = login_source(cx, &at("role_id"), &a.role_id, &a.span);
            let secret_id = login_source(cx, &at("secret_id"), &a.secret_id, &a.span);
            Some(VaultAuth::AppRole {
                mount: mount("approle"),
                role_id: role_id?,
                secret_id: secret_id?,
            })
        }
        "jwt" | "kubernetes" => {
            unused(
                cx,
                &[
                    ("token", a.token.is_some()),
                    ("role_id", a.role_id.is_some()),
                    ("secret_id", a.secret_id.is_some()),
                ],
            );
            let role = a.role.as_ref().map(|r| r.get_ref().clone());
            if role.is_none() {
                cx.error(a.span.clone(), format!("{} is required", at("role")));
            }
            let token_file = match (&a.token_file, method.get_ref().as_str()) {
                (Some(f), _) => Some(PathBuf::from(f.get_ref())),
                (None, "kubernetes") => Some(PathBuf::from(
                    "/var/run/secrets/kubernetes.io/serviceaccount/token",
                )),
                (None, _) => {
                    cx.error(
                        a.span.clone(),
                        format!(
                            "{} is required (a projected service-account token file)",
                            at("token_file")
                        ),
                    );
                    None
                }
            };
            let default_mount = if method.get_ref() == "kubernetes" {
                "kubernetes"
            } else {
                "jwt"
            };
            Some(VaultAuth::Jwt {
                mount: mount(default_mount),
                role: role?,
                token_file: token_file?,
            })
        }
        other => {
            cx.error(method.span(), format!("{}: unknown method {other:?}: use \"token\", \"approle\", \"jwt\" or \"kubernetes\"", at("method")));
            None
        }
    }
}

/// Phase 3e: every `vault:` source gets its connection; one naming a connection the policy
/// does not declare is an error at its declaration.
pub(super) fn resolve(
    parsed: &Parsed<'_>,
    errors: &mut Vec<PolicyError>,
    keyed: &mut Keyed,
    connections: &Connections,
) {
    let mut missing: Vec<(String, String)> = Vec::new();
    for (key, source) in keyed.sources_mut() {
        let Source::Remote(remote) = source else {
            continue;
        };
        let Location::Vault {
            connection,
            settings,
            ..
        } = &mut remote.at
        else {
            continue;
        };
        match connections.get(connection.as_str()) {
            Some((Some(c), _)) => *settings = Some(c.clone()),
            // Declared with problems, already reported: the policy does not compile anyway.
            Some((None, _)) => {}
            None => missing.push((key.clone(), connection.clone())),
        }
    }
    let table = |name: &str| {
        if name.is_empty() {
            "[vault]".to_string()
        } else {
            format!("[vault.{name}]")
        }
    };
    let declared: Vec<String> = connections.keys().map(|k| table(k)).collect();
    let declared = if declared.is_empty() {
        "none".to_string()
    } else {
        declared.join(", ")
    };
    for (key, connection) in missing {
        let Some((fi, span, _)) = keyed.at_of(&key) else {
            continue;
        };
        let (file, text, _) = &parsed[fi];
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        cx.error(
            span,
            format!(
                "{}: names the Vault connection {}, which no policy file declares (declared: {declared})",
                super::compile::field_of(&key),
                table(&connection)
            ),
        );
    }
}

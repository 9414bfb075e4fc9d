//! One Vault/OpenBao API call: the URL under `ADDRESS/v1/`, the headers every call carries
//! (`X-Vault-Token`, `X-Vault-Namespace`, `X-Vault-Request`), the route (the connection's CA and
//! ranges; cleartext only to a loopback IP), and the answer's JSON read into typed structs.
//!
//! Errors name the connection's address, the method and API path, the HTTP status and Vault's
//! own `errors` text (capped): never a token, never a value. The transport bounds an answer to
//! [`crate::signing::exchange::MAX_ANSWER`] bytes.

use std::net::IpAddr;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::Method;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::secrets::{SecretValue, VaultConnection};
use crate::signing::exchange::{Exchange, Route};
use crate::signing::TokenTransport;

/// The most of Vault's `errors` text an error message quotes.
const MAX_ERROR_TEXT: usize = 200;

/// The audit rule of latchkey's own logins and renewals.
pub(crate) const LOGIN_RULE: &str = "latchkey:vault";

/// Why a call failed.
#[derive(Debug)]
pub(crate) enum CallError {
    /// No answer (unreachable, TLS, timeout) or a request that could not be made.
    Transport(String),
    /// Vault answered with a status other than 2xx; `text` is its `errors`, capped.
    Status { status: u16, text: String },
    /// A 2xx answer that is not the JSON expected.
    Invalid(String),
}

impl CallError {
    /// Whether the token was refused (expired, revoked, or never valid): a 403 whose text says
    /// "permission denied" or "invalid token". A fresh login may help.
    pub(crate) fn token_refused(&self) -> bool {
        match self {
            CallError::Status { status: 403, text } => {
                let t = text.to_ascii_lowercase();
                t.contains("permission denied") || t.contains("invalid token")
            }
            _ => false,
        }
    }

    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            CallError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The message: `vault ADDRESS: METHOD PATH: WHY`.
    pub(crate) fn describe(&self, conn: &VaultConnection, method: &Method, path: &str) -> String {
        let why = match self {
            CallError::Transport(why) => why.clone(),
            CallError::Status { status, text } if text.is_empty() => {
                format!("answered {status}")
            }
            CallError::Status { status, text } => format!("answered {status}: {text}"),
            CallError::Invalid(why) => format!("answered an unreadable body: {why}"),
        };
        format!("vault {}: {method} {path}: {why}", address(conn))
    }
}

/// The connection's address without a trailing `/`.
pub(crate) fn address(conn: &VaultConnection) -> &str {
    conn.address.trim_end_matches('/')
}

/// One call's request.
pub(crate) struct Call<'a> {
    pub(crate) rule: &'a str,
    pub(crate) method: Method,
    /// The API path under `/v1/`, with its query.
    pub(crate) path: &'a str,
    pub(crate) token: Option<&'a SecretValue>,
    pub(crate) body: Option<Bytes>,
}

impl<'a> Call<'a> {
    /// A `GET` with a token.
    pub(crate) fn get(rule: &'a str, path: &'a str, token: &'a SecretValue) -> Self {
        Self {
            rule,
            method: Method::GET,
            path,
            token: Some(token),
            body: None,
        }
    }
}

/// Sends `call` to `conn` and reads the answer as `T`.
pub(crate) async fn send<T: DeserializeOwned>(
    transport: &dyn TokenTransport,
    conn: &VaultConnection,
    call: Call<'_>,
) -> Result<T, CallError> {
    let cleartext = cleartext(conn)?;
    let headers = headers(conn, call.token, call.body.is_some())?;
    let ex = Exchange {
        rule: call.rule.to_string(),
        method: call.method,
        url: format!("{}/v1/{}", address(conn), call.path),
        headers,
        body: call.body.unwrap_or_default(),
        route: Route {
            ca: conn.ca.clone(),
            allow_private: conn.allow_private.clone(),
            cleartext,
        },
    };
    let answer = transport.call(ex).await.map_err(|e| {
        // An unknown issuer: the CA belongs in the connection's table.
        let hint = if e.0.contains("--upstream-ca") && conn.ca.is_none() {
            "; or give this Vault connection its CA: `ca = \"PEM\"` in its [vault] table"
        } else {
            ""
        };
        CallError::Transport(format!("{}{hint}", e.0))
    })?;
    if !(200..300).contains(&answer.status) {
        return Err(CallError::Status {
            status: answer.status,
            text: errors_text(&answer.body),
        });
    }
    // 204 (renew-self on some servers, a write with no answer): read as an empty object.
    let body: &[u8] = if answer.body.is_empty() {
        b"{}"
    } else {
        &answer.body
    };
    serde_json::from_slice(body).map_err(|e| CallError::Invalid(without_values(&e)))
}

/// Whether plain `http://` may be used: only to a loopback IP. Any other `http://` address is
/// refused unsent, as is an address that is neither.
fn cleartext(conn: &VaultConnection) -> Result<bool, CallError> {
    let addr = address(conn);
    if addr.starts_with("https://") {
        return Ok(false);
    }
    let Some(rest) = addr.strip_prefix("http://") else {
        return Err(CallError::Transport(
            "the address must start with https:// (or http:// to a loopback IP)".into(),
        ));
    };
    let host = rest.split('/').next().unwrap_or_default();
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    match host.parse::<IpAddr>() {
        Ok(ip) if ip.is_loopback() => Ok(true),
        _ => Err(CallError::Transport(
            "plain http:// is only for a loopback IP (127.0.0.1, [::1]); use https://".into(),
        )),
    }
}

fn headers(
    conn: &VaultConnection,
    token: Option<&SecretValue>,
    json_body: bool,
) -> Result<Vec<(HeaderName, HeaderValue)>, CallError> {
    let mut headers = vec![
        (
            HeaderName::from_static("x-vault-request"),
            HeaderValue::from_static("true"),
        ),
        (
            http::header::ACCEPT,
            HeaderValue::from_static("application/json"),
        ),
        (
            http::header::USER_AGENT,
            HeaderValue::from_static("latchkey"),
        ),
    ];
    if json_body {
        headers.push((
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ));
    }
    if let Some(ns) = &conn.namespace {
        let v = HeaderValue::from_str(ns).map_err(|_| {
            CallError::Transport("the namespace is not a valid header value".into())
        })?;
        headers.push((HeaderName::from_static("x-vault-namespace"), v));
    }
    if let Some(token) = token {
        let mut v = HeaderValue::from_bytes(token.expose()).map_err(|_| {
            CallError::Transport("the Vault token is not a valid header value".into())
        })?;
        v.set_sensitive(true);
        headers.push((HeaderName::from_static("x-vault-token"), v));
    }
    Ok(headers)
}

#[derive(Deserialize)]
struct Errors {
    #[serde(default)]
    errors: Vec<String>,
}

/// Vault's `errors` array, joined and capped at [`MAX_ERROR_TEXT`] characters (`""` when the
/// body has none). Vault's error texts name paths and reasons, not secret values.
fn errors_text(body: &[u8]) -> String {
    let Ok(Errors { errors }) = serde_json::from_slice::<Errors>(body) else {
        return String::new();
    };
    let joined = errors.join("; ");
    let clean: String = joined
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match clean.char_indices().nth(MAX_ERROR_TEXT) {
        Some((at, _)) => format!("{}…", &clean[..at]),
        None => clean,
    }
}

/// A JSON error's category and position, never the text it quotes (which may be a value).
fn without_values(e: &serde_json::Error) -> String {
    format!(
        "{:?} JSON error at line {} column {}",
        e.classify(),
        e.line(),
        e.column()
    )
    .to_lowercase()
}

// ---------------------------------------------------------------------------------------------
// What Vault answers (only the parts latchkey reads).

/// A login or renewal: `auth`.
#[derive(Deserialize)]
pub(crate) struct AuthAnswer {
    pub(crate) auth: Option<Auth>,
}

#[derive(Deserialize)]
pub(crate) struct Auth {
    pub(crate) client_token: String,
    #[serde(default)]
    pub(crate) lease_duration: u64,
    #[serde(default)]
    pub(crate) renewable: bool,
}

/// `auth/token/lookup-self`: `data.ttl` (0: never expires) and `data.renewable`.
#[derive(Deserialize)]
pub(crate) struct LookupAnswer {
    pub(crate) data: Option<Lookup>,
}

#[derive(Deserialize)]
pub(crate) struct Lookup {
    #[serde(default)]
    pub(crate) ttl: u64,
    #[serde(default)]
    pub(crate) renewable: bool,
}

/// `sys/internal/ui/mounts/PATH`: the mount a path is under.
#[derive(Deserialize)]
pub(crate) struct MountAnswer {
    pub(crate) data: Option<MountData>,
}

#[derive(Deserialize)]
pub(crate) struct MountData {
    pub(crate) path: String,
    #[serde(rename = "type")]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) options: Option<MountOptions>,
}

#[derive(Deserialize)]
pub(crate) struct MountOptions {
    #[serde(default)]
    pub(crate) version: Option<String>,
}

/// A read: `data` (the secret's fields; for KV v2, `data.data` and `data.metadata`), with the
/// lease a dynamic secret comes with.
#[derive(Deserialize)]
pub(crate) struct ReadAnswer<D> {
    pub(crate) data: Option<D>,
    #[serde(default)]
    pub(crate) lease_id: String,
    #[serde(default)]
    pub(crate) lease_duration: u64,
}

/// KV v2's `data`: the fields (`null` when the version is deleted or destroyed).
#[derive(Deserialize)]
pub(crate) struct Kv2Data {
    pub(crate) data: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The JSON body of a login.
pub(crate) fn json_body(value: &serde_json::Value) -> Bytes {
    Bytes::from(value.to_string())
}

//! latchkey's own calls: the one narrow way the signing code (and the secret stores) reach an
//! endpoint — a token endpoint, STS, a secret store, a credentials endpoint — send a method, a
//! URL, headers and a body, get the status and a bounded body back — and the helpers that build
//! token requests and read their answers.
//!
//! [`TokenTransport`] is defined here and implemented outside (the guarded, audited upstream
//! client): `signing` knows no sockets and imports nothing from `upstream` or `proxy`. Each
//! call says where it may go beyond the defaults ([`Route`]): an extra CA, non-public ranges,
//! and whether plain `http://` is acceptable; by default a call goes over verified TLS to a
//! public address only.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use std::path::PathBuf;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::Method;

use super::{failed, CredentialError};
use crate::secrets::SecretValue;

/// The most of a token endpoint's answer a transport reads: token answers are small, so
/// anything larger is refused rather than buffered.
pub const MAX_ANSWER: usize = 1024 * 1024;

/// Where one of latchkey's own calls may go beyond the defaults (verified TLS with the
/// configured roots, public addresses only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Route {
    /// A PEM bundle trusted for this call's TLS on top of the usual roots (a Vault server's own
    /// CA).
    pub ca: Option<PathBuf>,
    /// Non-public ranges this call may reach on top of `--allow-private` (a Vault server on the
    /// internal network, the instance metadata address when configured).
    pub allow_private: Vec<crate::wire::cidr::Cidr>,
    /// Plain `http://` is acceptable: only for endpoints that have no TLS by design (the
    /// instance metadata and container credential endpoints) or that the operator pointed at
    /// a loopback address. Otherwise a call that is not `https://` is refused unsent.
    pub cleartext: bool,
}

/// One HTTP exchange latchkey makes itself.
pub struct Exchange {
    /// What the call is for, as its audit record's `rule` names it: `credential:NAME` for a
    /// credential's token exchange, `secret:NAME` for a secret store read, `latchkey:aws` for
    /// latchkey's own AWS identity.
    pub rule: String,
    pub method: Method,
    pub url: String,
    /// May hold an app JWT, a signed `Authorization` or a session token.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// May hold a client secret or a JWT assertion.
    pub body: Bytes,
    pub route: Route,
}

impl Exchange {
    /// A POST for `rule` with the default route.
    pub fn post(
        rule: String,
        url: String,
        headers: Vec<(HeaderName, HeaderValue)>,
        body: Bytes,
    ) -> Self {
        Self {
            rule,
            method: Method::POST,
            url,
            headers,
            body,
            route: Route::default(),
        }
    }
}

/// Names the endpoint and the header names only: the values and the body are secret material.
impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Exchange")
            .field("rule", &self.rule)
            .field("method", &self.method)
            .field("url", &self.url)
            .field("headers", &names)
            .field("body_len", &self.body.len())
            .field("route", &self.route)
            .finish()
    }
}

/// What a token endpoint answered.
#[derive(Clone)]
pub struct Answer {
    pub status: u16,
    /// At most [`MAX_ANSWER`] bytes. May hold a token.
    pub body: Bytes,
}

/// Shows the status and the body's length only: the body holds a token.
impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("status", &self.status)
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// Why an exchange got no answer (unreachable, refused by the address guard, timed out, an
/// answer over [`MAX_ANSWER`]). Never holds a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TransportError(pub String);

/// A boxed future, as a dyn-compatible trait method returns it.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How latchkey's own calls are made: send `ex` (its method, headers and body as given) to
/// `ex.url` along `ex.route` and return the status and at most [`MAX_ANSWER`] bytes of body.
/// Implemented by the proxy's guarded client, which also audits each exchange; only an
/// exchange that really happens costs anything (a request under a rule without a credential
/// never calls it).
pub trait TokenTransport: Send + Sync {
    fn call(&self, ex: Exchange) -> BoxFuture<'_, Result<Answer, TransportError>>;
}

pub(super) fn form_headers() -> Vec<(HeaderName, HeaderValue)> {
    vec![
        (
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        ),
        (
            http::header::ACCEPT,
            HeaderValue::from_static("application/json"),
        ),
        (
            http::header::USER_AGENT,
            HeaderValue::from_static("latchkey"),
        ),
    ]
}

pub(super) fn json_str(v: &serde_json::Value, key: &str) -> Option<String> {
    v.get(key).and_then(|x| x.as_str()).map(str::to_string)
}

pub(super) fn access_token(
    name: &str,
    json: &serde_json::Value,
) -> Result<(SecretValue, Duration), CredentialError> {
    let token = json_str(json, "access_token")
        .ok_or_else(|| failed(name, "token endpoint answered without an access_token"))?;
    let expires_in = json
        .get("expires_in")
        .and_then(|v| {
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        })
        .unwrap_or(3600);
    Ok((
        SecretValue::new(token.into_bytes()),
        Duration::from_secs(expires_in),
    ))
}

/// POSTs to a token endpoint and reads its JSON answer; a status other than 2xx is a failure.
pub(super) async fn json(
    transport: &dyn TokenTransport,
    name: &str,
    url: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
) -> Result<serde_json::Value, CredentialError> {
    let Answer { status, body } = transport
        .call(Exchange::post(
            super::token_name(name),
            url.clone(),
            headers,
            body,
        ))
        .await
        .map_err(|why| failed(name, format!("token endpoint {url}: {why}")))?;
    if !(200..300).contains(&status) {
        return Err(failed(
            name,
            format!("token endpoint {url} answered {status}"),
        ));
    }
    serde_json::from_slice(&body).map_err(|e| {
        failed(
            name,
            format!("token endpoint {url} answered invalid JSON: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::AUTHORIZATION;

    #[test]
    fn exchange_debug_shows_no_secret_material() {
        let mut auth = HeaderValue::from_static("Bearer eyJhbGciOi.secret-jwt.sig");
        auth.set_sensitive(true);
        let ex = Exchange::post(
            "credential:oauth".into(),
            "https://oauth.test/token".into(),
            vec![(AUTHORIZATION, auth)],
            Bytes::from_static(b"client_secret=hunter2&client_assertion=eyJ"),
        );
        let text = format!("{ex:?}");
        assert!(
            text.contains("oauth.test") && text.contains("authorization"),
            "{text}"
        );
        for secret in ["hunter2", "secret-jwt", "eyJ"] {
            assert!(!text.contains(secret), "{text}");
        }
        let applied = format!("{:?}", crate::Applied::default());
        assert!(applied.contains("Applied"), "{applied}");
        let answer = format!(
            "{:?}",
            Answer {
                status: 200,
                body: Bytes::from_static(b"{\"access_token\":\"tok-secret\"}"),
            }
        );
        assert!(
            answer.contains("200") && !answer.contains("tok-secret"),
            "{answer}"
        );
    }
}

//! OAuth2 access tokens (`kind = "oauth2"`, and `oauth2_client_credentials` as its alias): the
//! client-credentials, refresh-token, password and RFC 7523 JWT-bearer grants, with the client
//! authenticated in the form (`client_secret_post`) or in Basic auth (`client_secret_basic`),
//! and extra headers on the token request (`token_endpoint_headers`, templates over the
//! policy's secrets). Tokens are cached until `expires_in` minus the refresh margin; a refresh
//! token the endpoint rotates is kept in memory for the next refresh (and redacted like a
//! minted token).
//!
//! Never prints a value: the form is built in a wiped buffer, and errors name the credential
//! and the endpoint only.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, AUTHORIZATION};

use super::exchange::{self, json_str};
use super::{
    failed, field_key, jwt, now_unix, secret, CredentialError, JwtAlg, JwtClaim, Material,
    REFRESH_MARGIN,
};
use crate::secrets::{SecretValue, Template};

/// An OAuth2 credential as compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct OAuth2 {
    pub token_url: String,
    pub grant: Grant,
    pub client_id: Option<String>,
    /// `client_secret` is named (a secret source, stored under the credential's field key).
    pub has_client_secret: bool,
    pub client_auth: ClientAuth,
    pub scope: Option<String>,
    pub audience: Option<String>,
    /// `token_endpoint_headers`: name and value template (`{{secret.X}}` of `[secrets.X]`).
    pub headers: Vec<(HeaderName, Template)>,
    /// Written as `kind = "oauth2_client_credentials"` (the label `explain` shows).
    pub alias: bool,
}

/// Which grant the token request makes.
#[derive(Debug, Clone, PartialEq)]
pub enum Grant {
    ClientCredentials,
    /// The `refresh_token` field's value (or the one the endpoint rotated it to).
    RefreshToken,
    /// The `username` and `password` fields' values.
    Password,
    /// RFC 7523: an assertion latchkey signs with the `key` field, its claims templated like
    /// the `jwt` kind's; `iat`, `exp` (now + `ttl`) and a random `jti` are added unless given.
    JwtBearer {
        alg: JwtAlg,
        ttl: Duration,
        claims: Vec<(String, JwtClaim)>,
    },
}

impl Grant {
    pub fn label(&self) -> &'static str {
        match self {
            Grant::ClientCredentials => "client_credentials",
            Grant::RefreshToken => "refresh_token",
            Grant::Password => "password",
            Grant::JwtBearer { .. } => "jwt_bearer",
        }
    }
}

/// How the client authenticates at the token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// `client_id` and `client_secret` in the form.
    Post,
    /// `Authorization: Basic` of the form-urlencoded id and secret (RFC 6749 §2.3.1).
    Basic,
}

const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// A wiped, form-urlencoded body.
struct Form(zeroize::Zeroizing<String>);

impl Form {
    fn new() -> Self {
        // Generous, so appends seldom reallocate; what a reallocation leaves behind is only
        // what was written before it.
        Self(zeroize::Zeroizing::new(String::with_capacity(4096)))
    }

    fn pair(&mut self, k: &str, v: &str) {
        let mut s = form_urlencoded::Serializer::for_suffix(&mut *self.0, 0);
        s.append_pair(k, v);
        s.finish();
    }
}

fn utf8<'v>(name: &str, field: &str, v: &'v SecretValue) -> Result<&'v str, CredentialError> {
    std::str::from_utf8(v.expose()).map_err(|_| failed(name, format!("{field} is not UTF-8")))
}

/// An OAuth2 access token for credential `name` (cached per credential, single flight).
pub(super) async fn token(
    name: &str,
    o: &OAuth2,
    material: Material<'_>,
    identity: &str,
    host: &str,
) -> Result<SecretValue, CredentialError> {
    let Material {
        store,
        cache,
        transport,
        ..
    } = material;
    cache
        .get(name, REFRESH_MARGIN, || async {
            let mut form = Form::new();
            let mut headers = exchange::form_headers();
            // Held until the call is made: the grant's own secrets.
            let mut held = Vec::new();
            match &o.grant {
                Grant::ClientCredentials => form.pair("grant_type", "client_credentials"),
                Grant::RefreshToken => {
                    let refresh = match cache.rotated(name) {
                        Some(r) => r,
                        None => secret(store, name, "refresh_token").await?,
                    };
                    form.pair("grant_type", "refresh_token");
                    form.pair("refresh_token", utf8(name, "refresh_token", &refresh)?);
                    held.push(refresh);
                }
                Grant::Password => {
                    let user = secret(store, name, "username").await?;
                    let pass = secret(store, name, "password").await?;
                    form.pair("grant_type", "password");
                    form.pair("username", utf8(name, "username", &user)?);
                    form.pair("password", utf8(name, "password", &pass)?);
                    held.extend([user, pass]);
                }
                Grant::JwtBearer { alg, ttl, claims } => {
                    let assertion =
                        assertion(name, *alg, *ttl, claims, material, identity, host).await?;
                    form.pair("grant_type", JWT_BEARER);
                    form.pair("assertion", utf8(name, "assertion", &assertion)?);
                    held.push(assertion);
                }
            }
            let client_secret = match o.has_client_secret {
                true => Some(secret(store, name, "client_secret").await?),
                false => None,
            };
            let id = o.client_id.as_deref();
            match (o.client_auth, id, &client_secret) {
                (ClientAuth::Basic, Some(id), Some(s)) => {
                    headers.push((
                        AUTHORIZATION,
                        basic(name, id, utf8(name, "client_secret", s)?)?,
                    ));
                }
                (_, id, s) => {
                    if let Some(id) = id {
                        form.pair("client_id", id);
                    }
                    if let Some(s) = s {
                        form.pair("client_secret", utf8(name, "client_secret", s)?);
                    }
                }
            }
            if let Some(s) = &o.scope {
                form.pair("scope", s);
            }
            if let Some(a) = &o.audience {
                form.pair("audience", a);
            }
            for (h, template) in &o.headers {
                let value = template.render(store, identity).await.map_err(|source| {
                    CredentialError::Secret {
                        name: name.to_string(),
                        source,
                    }
                })?;
                let mut hv = HeaderValue::from_bytes(&value).map_err(|_| {
                    failed(
                        name,
                        format!("token_endpoint_headers.{h} is not valid in a header"),
                    )
                })?;
                hv.set_sensitive(true);
                headers.push((h.clone(), hv));
            }
            let body = Bytes::copy_from_slice(form.0.as_bytes());
            let json = exchange::json(transport, name, o.token_url.clone(), headers, body).await?;
            drop(held);
            if let (Grant::RefreshToken, Some(rotated)) =
                (&o.grant, json_str(&json, "refresh_token"))
            {
                let rotated = SecretValue::new(rotated.into_bytes());
                // Redacted like the configured one, and used for the next refresh.
                store.set_minted(&field_key(name, "refresh_token"), "rotated", &rotated);
                cache.set_rotated(name, rotated);
            }
            exchange::access_token(name, &json)
        })
        .await
}

/// `Basic base64(urlencode(id):urlencode(secret))`, marked sensitive.
fn basic(name: &str, id: &str, secret: &str) -> Result<HeaderValue, CredentialError> {
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let pair = zeroize::Zeroizing::new(format!("{}:{}", enc(id), enc(secret)));
    let b64 = zeroize::Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(&*pair));
    let mut hv = HeaderValue::from_str(&format!("Basic {}", &*b64))
        .map_err(|_| failed(name, "client credentials are not valid in a header"))?;
    hv.set_sensitive(true);
    Ok(hv)
}

/// The RFC 7523 assertion: the claims rendered, `iat`/`exp`/`jti` added unless given.
async fn assertion(
    name: &str,
    alg: JwtAlg,
    ttl: Duration,
    claims: &[(String, JwtClaim)],
    material: Material<'_>,
    identity: &str,
    host: &str,
) -> Result<SecretValue, CredentialError> {
    let key = secret(material.store, name, "key").await?;
    let now = now_unix();
    let mut map = serde_json::Map::new();
    for (k, c) in claims {
        map.insert(k.clone(), c.render(now, identity, host));
    }
    map.entry("iat").or_insert(serde_json::json!(now));
    map.entry("exp")
        .or_insert(serde_json::json!(now + ttl.as_secs()));
    map.entry("jti").or_insert(serde_json::json!(random_id()));
    let token = jwt::sign(alg, key.expose(), None, &serde_json::Value::Object(map))
        .map_err(|e| failed(name, format!("cannot sign the assertion: {e}")))?;
    Ok(SecretValue::new(token.into_bytes()))
}

/// 16 random bytes in hex (a JWT's `jti`); the time when the system has no randomness.
pub(super) fn random_id() -> String {
    let mut b = [0u8; 16];
    if aws_lc_rs::rand::fill(&mut b).is_err() {
        return format!("{:x}", now_unix());
    }
    hex::encode(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_client_auth_urlencodes_before_base64_and_is_sensitive() {
        let hv = basic("c", "id:x", "s p&").expect("header");
        assert!(hv.is_sensitive());
        let text = hv.to_str().expect("ascii");
        let raw = base64::engine::general_purpose::STANDARD
            .decode(text.strip_prefix("Basic ").expect("basic"))
            .expect("b64");
        assert_eq!(raw, b"id%3Ax:s+p%26");
        assert!(!format!("{hv:?}").contains("czE"), "{hv:?}");
    }

    #[test]
    fn a_form_appends_pairs_escaped() {
        let mut f = Form::new();
        f.pair("grant_type", "password");
        f.pair("password", "a&b=c");
        assert_eq!(&*f.0, "grant_type=password&password=a%26b%3Dc");
    }
}

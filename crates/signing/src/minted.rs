//! Tokens latchkey mints or exchanges itself: GitHub App installation tokens, Google
//! service-account access tokens, OAuth2 client credentials, and generic JWTs it signs. Each
//! is cached in the [`TokenCache`] and registered with the secret store before it leaves, so
//! a response reflecting it is redacted.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use base64::Engine;
use http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use http::HeaderMap;

use super::exchange::{self, json_str};
use super::oauth2;
use super::{
    failed, field_key, jwt, now_unix, secret, sensitive, set_bearer, token_name, CredentialError,
    JwtAlg, JwtClaim, Kind, Material, Target, REFRESH_MARGIN,
};
use crate::secrets::SecretValue;

/// Attaches the token of a minting credential (every kind but `aws_sigv4`, which signs); the
/// token joins the secret store's redaction set before it leaves.
pub(super) async fn attach(
    name: &str,
    kind: &Kind,
    material: Material<'_>,
    t: &Target<'_>,
    headers: &mut HeaderMap,
) -> Result<(), CredentialError> {
    let minter = Minter { name, material };
    match kind {
        Kind::GithubApp {
            app_id,
            installation_id,
            api,
            permissions,
            repositories,
        } => {
            let token = minter
                .github_app(app_id, installation_id, api, permissions, repositories)
                .await?;
            minter.register("", &token);
            github_auth(headers, api, t.host, &token)
        }
        Kind::GoogleServiceAccount { scopes, token_uri } => {
            let token = minter.google_service_account(scopes, token_uri).await?;
            minter.register("", &token);
            set_bearer(headers, &AUTHORIZATION, &token, true)
        }
        Kind::OAuth2(o) => {
            let token = oauth2::token(name, o, material, t.identity, t.host).await?;
            minter.register("", &token);
            set_bearer(headers, &AUTHORIZATION, &token, true)
        }
        Kind::GoogleIdToken {
            audience,
            token_uri,
        } => {
            let token = minter.google_id_token(audience, token_uri).await?;
            minter.register("", &token);
            set_bearer(headers, &AUTHORIZATION, &token, true)
        }
        Kind::Jwt {
            alg,
            ttl,
            header,
            claims,
        } => {
            let (key_id, token) = minter.jwt(*alg, ttl, claims, t).await?;
            minter.register(&key_id, &token);
            let bearer = *header == AUTHORIZATION;
            set_bearer(headers, header, &token, bearer)
        }
        Kind::AwsSigV4 { .. } | Kind::Hmac(_) | Kind::ClientCert => Err(failed(
            name,
            "a signing or client-certificate credential mints no token",
        )),
    }
}

/// One credential minting its token: its name and where its material comes from.
struct Minter<'a> {
    name: &'a str,
    material: Material<'a>,
}

impl Minter<'_> {
    /// The token joins the redaction set (under `key_id`) before it leaves.
    fn register(&self, key_id: &str, token: &SecretValue) {
        self.material
            .store
            .set_minted(&token_name(self.name), key_id, token);
    }

    /// A GitHub App installation token (cached), exchanged for the app's JWT.
    async fn github_app(
        &self,
        app_id: &str,
        installation_id: &str,
        api: &str,
        permissions: &Option<BTreeMap<String, String>>,
        repositories: &Option<Vec<String>>,
    ) -> Result<SecretValue, CredentialError> {
        let (name, store, transport) = (self.name, self.material.store, self.material.transport);
        self.material
            .cache
            .get(name, REFRESH_MARGIN, || async {
                let key = secret(store, name, "private_key").await?;
                let now = now_unix();
                let claims = serde_json::json!({"iat": now.saturating_sub(60), "exp": now + 540, "iss": app_id});
                let app_jwt = jwt::sign(JwtAlg::Rs256, key.expose(), None, &claims)
                    .map_err(|e| failed(name, format!("cannot sign the app JWT: {e}")))?;
                let mut body = serde_json::Map::new();
                if let Some(p) = permissions {
                    body.insert("permissions".into(), serde_json::json!(p));
                }
                if let Some(r) = repositories {
                    body.insert("repositories".into(), serde_json::json!(r));
                }
                let url = format!(
                    "{}/app/installations/{installation_id}/access_tokens",
                    api.trim_end_matches('/')
                );
                let headers = vec![
                    (AUTHORIZATION, sensitive(format!("Bearer {app_jwt}"))?),
                    (http::header::ACCEPT, HeaderValue::from_static("application/vnd.github+json")),
                    (http::header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
                    (http::header::USER_AGENT, HeaderValue::from_static("latchkey")),
                    (HeaderName::from_static("x-github-api-version"), HeaderValue::from_static("2022-11-28")),
                ];
                let json = exchange::json(transport, name, url, headers, serde_json::Value::Object(body).to_string().into()).await?;
                let token = json_str(&json, "token").ok_or_else(|| failed(name, "token endpoint answered without a token"))?;
                let expires = json_str(&json, "expires_at")
                    .and_then(|s| humantime::parse_rfc3339_weak(&s).ok())
                    .and_then(|t| t.duration_since(SystemTime::now()).ok())
                    .unwrap_or(Duration::from_secs(3600));
                Ok((SecretValue::new(token.into_bytes()), expires))
            })
            .await
    }

    /// A Google service account's access token (cached), exchanged for a signed assertion.
    async fn google_service_account(
        &self,
        scopes: &[String],
        token_uri: &Option<String>,
    ) -> Result<SecretValue, CredentialError> {
        let name = self.name;
        self.material
            .cache
            .get(name, REFRESH_MARGIN, || async {
                let extra = serde_json::json!({"scope": scopes.join(" ")});
                let json = self.google_exchange(token_uri, extra).await?;
                exchange::access_token(name, &json)
            })
            .await
    }

    /// A Google-signed ID token for `audience` (cached until its `exp`), exchanged for an
    /// assertion carrying `target_audience`.
    async fn google_id_token(
        &self,
        audience: &str,
        token_uri: &Option<String>,
    ) -> Result<SecretValue, CredentialError> {
        let name = self.name;
        self.material
            .cache
            .get(name, REFRESH_MARGIN, || async {
                let extra = serde_json::json!({"target_audience": audience});
                let json = self.google_exchange(token_uri, extra).await?;
                let token = json_str(&json, "id_token")
                    .ok_or_else(|| failed(name, "token endpoint answered without an id_token"))?;
                let lifetime = jwt_exp(&token)
                    .map(|exp| Duration::from_secs(exp.saturating_sub(now_unix())))
                    .unwrap_or(Duration::from_secs(3600));
                Ok((SecretValue::new(token.into_bytes()), lifetime))
            })
            .await
    }

    /// Signs the service account's JWT-bearer assertion (iss, aud = the token URI, an hour's
    /// lifetime, and `extra`) and exchanges it; the endpoint's JSON answer.
    async fn google_exchange(
        &self,
        token_uri: &Option<String>,
        extra: serde_json::Value,
    ) -> Result<serde_json::Value, CredentialError> {
        let (name, store, transport) = (self.name, self.material.store, self.material.transport);
        let key = secret(store, name, "key").await?;
        let sa: serde_json::Value = serde_json::from_slice(key.expose())
            .map_err(|e| failed(name, format!("key is not a service-account JSON file: {e}")))?;
        let field = |f: &str| {
            json_str(&sa, f).ok_or_else(|| failed(name, format!("service-account key has no {f}")))
        };
        let email = field("client_email")?;
        let pem = SecretValue::new(field("private_key")?.into_bytes());
        store.set_minted(&field_key(name, "private_key"), "", &pem);
        let kid = json_str(&sa, "private_key_id");
        let uri = match token_uri {
            Some(u) => u.clone(),
            None => field("token_uri")?,
        };
        let now = now_unix();
        let mut claims = serde_json::json!({
            "iss": email, "aud": uri, "iat": now, "exp": now + 3600,
        });
        if let (Some(c), serde_json::Value::Object(extra)) = (claims.as_object_mut(), extra) {
            c.extend(extra);
        }
        let assertion = jwt::sign(JwtAlg::Rs256, pem.expose(), kid.as_deref(), &claims)
            .map_err(|e| failed(name, format!("cannot sign the assertion: {e}")))?;
        let form = form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer")
            .append_pair("assertion", &assertion)
            .finish();
        exchange::json(transport, name, uri, exchange::form_headers(), form.into()).await
    }

    /// A JWT latchkey signs itself, with the key the token is cached and redacted under
    /// (per identity and per host when a claim uses them).
    async fn jwt(
        &self,
        alg: JwtAlg,
        ttl: &Option<Duration>,
        claims: &[(String, JwtClaim)],
        t: &Target<'_>,
    ) -> Result<(String, SecretValue), CredentialError> {
        let (name, store, cache) = (self.name, self.material.store, self.material.cache);
        let per_identity = claims.iter().any(|(_, c)| c.uses_identity());
        let per_host = claims.iter().any(|(_, c)| c.uses_host());
        let key_id = format!(
            "{name}\u{0}{}\u{0}{}",
            if per_identity { t.identity } else { "" },
            if per_host { t.host } else { "" }
        );
        let mint = || async {
            let key = secret(store, name, "key").await?;
            let now = now_unix();
            let mut map = serde_json::Map::new();
            for (k, c) in claims {
                map.insert(k.clone(), c.render(now, t.identity, t.host));
            }
            if let Some(ttl) = ttl {
                map.entry("iat").or_insert(serde_json::json!(now));
                map.entry("exp")
                    .or_insert(serde_json::json!(now + ttl.as_secs()));
            }
            let token = jwt::sign(alg, key.expose(), None, &serde_json::Value::Object(map))
                .map_err(|e| failed(name, format!("cannot sign the JWT: {e}")))?;
            Ok((
                SecretValue::new(token.into_bytes()),
                ttl.unwrap_or_default(),
            ))
        };
        let token = match ttl {
            // Self-signed: cached for 80 % of its TTL, then signed anew.
            Some(ttl) => cache.get(&key_id, *ttl / 5, mint).await?,
            None => mint().await?.0,
        };
        Ok((key_id, token))
    }
}

/// The `exp` of a JWT, read without verifying it (a token endpoint's own answer).
fn jwt_exp(token: &str) -> Option<u64> {
    let payload = token.split('.').nth(1)?;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice::<serde_json::Value>(&raw)
        .ok()?
        .get("exp")?
        .as_u64()
}

/// GitHub API requests carry the installation token as a bearer token; git over HTTPS
/// (github.com) takes it in Basic auth.
fn github_auth(
    headers: &mut HeaderMap,
    api: &str,
    host: &str,
    token: &SecretValue,
) -> Result<(), CredentialError> {
    let api_host = http::Uri::try_from(api)
        .ok()
        .and_then(|u| u.host().map(str::to_ascii_lowercase));
    if api_host.as_deref() == Some(host) {
        set_bearer(headers, &AUTHORIZATION, token, true)
    } else {
        // git over HTTPS (github.com): installation tokens go in Basic auth.
        let mut raw = b"x-access-token:".to_vec();
        raw.extend_from_slice(token.expose());
        let enc = zeroize::Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(&raw));
        let mut hv = sensitive(format!("Basic {}", &*enc))?;
        hv.set_sensitive(true);
        headers.insert(AUTHORIZATION, hv);
        Ok(())
    }
}

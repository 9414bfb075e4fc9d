//! Credentials that are not a static key: AWS SigV4 request signing, and tokens latchkey mints
//! or exchanges itself (GitHub App installation tokens, Google service-account access tokens,
//! OAuth2 client credentials, generic JWTs).
//!
//! Key material comes only from secret sources; minted tokens are cached per credential (and
//! per identity/host where a JWT's claims use them) with single flight, refreshed five minutes
//! before they expire, and registered with the secret store so responses that reflect them are
//! redacted. This module knows no sockets: token endpoints are reached through an
//! [`Exchanger`] the proxy provides (its guarded, audited client).

pub mod aws_chunked;
mod jwt;
mod sigv4;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use http::HeaderMap;

use crate::secrets::{SecretError, SecretStore, SecretValue};

pub use jwt::{JwtAlg, JwtClaim};
pub use sigv4::{derive_region_service, Payload, UNSIGNED_HEADERS};

/// Refresh a cached token this long before it expires.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// The store key of a credential's key-material field (not a valid secret name: no clash).
pub fn field_key(credential: &str, field: &str) -> String {
    format!("credential:{credential}:{field}")
}

/// The name minted tokens of a credential are redacted under.
pub fn token_name(credential: &str) -> String {
    format!("credential:{credential}")
}

/// A compiled credential.
#[derive(Debug, Clone)]
pub struct Credential {
    pub name: String,
    pub kind: Kind,
}

/// STS AssumeRole settings.
#[derive(Debug, Clone)]
pub struct AssumeRole {
    pub role_arn: String,
    pub session_name: String,
    pub duration: Duration,
    pub external_id: Option<String>,
    pub sts_endpoint: String,
    pub sts_region: String,
}

/// What a credential does.
#[derive(Debug, Clone)]
pub enum Kind {
    AwsSigV4 {
        /// Sign with a role's temporary keys, fetched with the base keys.
        assume_role: Option<AssumeRole>,
        region: Option<String>,
        service: Option<String>,
        has_session_token: bool,
        max_signed_body: usize,
    },
    GithubApp {
        app_id: String,
        installation_id: String,
        api: String,
        permissions: Option<BTreeMap<String, String>>,
        repositories: Option<Vec<String>>,
    },
    GoogleServiceAccount {
        scopes: Vec<String>,
        token_uri: Option<String>,
    },
    OAuth2ClientCredentials {
        token_url: String,
        client_id: String,
        scope: Option<String>,
        audience: Option<String>,
    },
    Jwt {
        alg: JwtAlg,
        ttl: Option<Duration>,
        header: HeaderName,
        claims: Vec<(String, JwtClaim)>,
    },
}

impl Kind {
    pub fn label(&self) -> &'static str {
        match self {
            Kind::AwsSigV4 { .. } => "aws_sigv4",
            Kind::GithubApp { .. } => "github_app",
            Kind::GoogleServiceAccount { .. } => "google_service_account",
            Kind::OAuth2ClientCredentials { .. } => "oauth2_client_credentials",
            Kind::Jwt { .. } => "jwt",
        }
    }
}

/// A credential could not be applied. Messages name the credential, never a token or key.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CredentialError {
    #[error("credential '{name}': {why}")]
    Failed { name: String, why: String },
    #[error("credential '{name}': presigned query authentication (X-Amz-Signature) is refused on credentialed rules; send the request unsigned and latchkey signs it")]
    PresignedQuery { name: String },
    #[error("credential '{name}': {source}")]
    Secret { name: String, source: SecretError },
    /// The request cannot be signed as sent (a payload form latchkey does not sign, framing
    /// headers that contradict each other): the sandbox's to fix.
    #[error("credential '{name}': {why}")]
    BadRequest { name: String, why: String },
}

/// One HTTP exchange with a token endpoint.
pub struct Exchange {
    pub credential: String,
    pub url: String,
    /// May hold an app JWT, a signed `Authorization` or a session token.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// May hold a client secret or a JWT assertion.
    pub body: Bytes,
}

/// Names the endpoint and the header names only: the values and the body are secret material.
impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Exchange")
            .field("credential", &self.credential)
            .field("url", &self.url)
            .field("headers", &names)
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// What applying a credential leaves to do on the body: nothing, or (an S3 aws-chunked
/// upload) check its framing or re-sign its chunks as it streams.
#[derive(Debug, Default)]
pub struct Applied {
    chunked: Option<aws_chunked::Framing>,
}

impl Applied {
    /// The most bytes [`Applied::body`] holds at once, for the caller's buffered-bytes budget:
    /// one chunk (≤ 1 MiB) when re-signing an aws-chunked body, a few KiB when checking one,
    /// 0 otherwise.
    pub fn held_at_most(&self) -> usize {
        self.chunked
            .as_ref()
            .map_or(0, aws_chunked::Framing::held_at_most)
    }

    /// The body to send: `body` itself, or `body` through the aws-chunked framing. When the
    /// framing is bad the body fails (aborting the upload) and `on_error` hears why, once.
    pub fn body(
        self,
        body: crate::upstream::Body,
        on_error: impl FnOnce(String) + Send + Sync + 'static,
    ) -> crate::upstream::Body {
        use http_body_util::BodyExt;
        match self.chunked {
            None => body,
            Some(framing) => {
                aws_chunked::AwsChunked::new(body, framing, Box::new(on_error)).boxed()
            }
        }
    }
}

/// How token endpoints are reached: the proxy's guarded, audited client. Returns the status
/// and body, or a reason the exchange failed (never containing a token).
pub type Exchanger = dyn Fn(Exchange) -> Pin<Box<dyn Future<Output = Result<(u16, Bytes), String>> + Send>>
    + Send
    + Sync;

/// A cached token, or the failure of the last attempt (shared for a few seconds, so N
/// concurrent requests cause one failing exchange, not N).
#[derive(Clone)]
enum Token {
    Ok {
        value: SecretValue,
        refresh_at: Instant,
    },
    Failed {
        error: CredentialError,
        /// The attempt that failed: callers that were already waiting share its error.
        attempt: u64,
        /// Callers arriving just after share it too, so a burst makes one failing exchange.
        until: Instant,
    },
}

/// How long a failed exchange answers for newcomers before the next attempt.
const FAILURE_HOLD: Duration = Duration::from_secs(2);

/// One credential's token and the attempts made for it.
#[derive(Default)]
struct Slot {
    token: tokio::sync::Mutex<Option<Token>>,
    attempts: std::sync::atomic::AtomicU64,
}

/// The most token slots kept: a JWT whose claims use `{{host}}` under a wildcard rule has one
/// per host the sandbox names, so the cache must not grow with them.
const MAX_SLOTS: usize = 1024;

/// Tokens by credential (and identity/host for JWTs whose claims use them), single flight.
/// Bounded: past [`MAX_SLOTS`] the least recently used slots not in use are dropped (their
/// next caller mints again).
#[derive(Default)]
pub struct TokenCache {
    slots: Mutex<HashMap<String, (Arc<Slot>, Instant)>>,
    exchanges: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCache").finish_non_exhaustive()
    }
}

impl TokenCache {
    fn slot(&self, key: &str) -> Arc<Slot> {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        let slot = {
            let entry = slots
                .entry(key.to_string())
                .or_insert_with(|| (Arc::default(), now));
            entry.1 = now;
            entry.0.clone()
        };
        if slots.len() > MAX_SLOTS {
            let mut idle: Vec<(Instant, String)> = slots
                .iter()
                .filter(|(_, (s, _))| Arc::strong_count(s) == 1)
                .map(|(k, (_, used))| (*used, k.clone()))
                .collect();
            idle.sort();
            let excess = slots.len() - MAX_SLOTS;
            for (_, k) in idle.into_iter().take(excess) {
                slots.remove(&k);
            }
        }
        slot
    }

    /// Token slots held now.
    pub fn len(&self) -> usize {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token exchanges (and JWT signings) made so far.
    pub fn exchanges(&self) -> u64 {
        self.exchanges.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The cached token for `key`, or a fresh one from `mint` (run once for concurrent callers).
    async fn get<F, Fut>(
        &self,
        key: &str,
        margin: Duration,
        mint: F,
    ) -> Result<SecretValue, CredentialError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(SecretValue, Duration), CredentialError>>,
    {
        use std::sync::atomic::Ordering;
        let slot = self.slot(key);
        let seen = slot.attempts.load(Ordering::Acquire);
        let mut guard = slot.token.lock().await;
        match guard.as_ref() {
            Some(Token::Ok { value, refresh_at }) if Instant::now() < *refresh_at => {
                return Ok(value.clone());
            }
            // An attempt that started while this caller waited failed: share its answer
            // rather than hammer a failing endpoint; later callers try again.
            Some(Token::Failed {
                error,
                attempt,
                until,
            }) if *attempt > seen || Instant::now() < *until => {
                return Err(error.clone());
            }
            _ => {}
        }
        let attempt = slot.attempts.fetch_add(1, Ordering::AcqRel) + 1;
        self.exchanges.fetch_add(1, Ordering::Relaxed);
        match mint().await {
            Ok((value, lifetime)) => {
                // Used until `margin` before expiry; a shorter-lived token, for one request.
                let refresh_at = Instant::now() + lifetime.saturating_sub(margin);
                *guard = Some(Token::Ok {
                    value: value.clone(),
                    refresh_at,
                });
                Ok(value)
            }
            Err(error) => {
                *guard = Some(Token::Failed {
                    error: error.clone(),
                    attempt,
                    until: Instant::now() + FAILURE_HOLD,
                });
                Err(error)
            }
        }
    }
}

/// What the request looks like when the credential is applied (after every other edit).
pub struct Target<'a> {
    pub method: &'a str,
    pub scheme: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub identity: &'a str,
}

/// The body as the signer sees it.
pub enum SignBody<'a> {
    /// The whole body, buffered.
    Whole(&'a [u8]),
    /// Too large or streamed: signed as `UNSIGNED-PAYLOAD`.
    Streamed,
}

/// Whether applying `kind` needs the whole request body in hand: `Some(max)` when the body is
/// hashed into the signature (a classic signed SigV4 payload, up to `max_signed_body` bytes;
/// over that, or when the caller will not buffer, it is signed `UNSIGNED-PAYLOAD`), `None`
/// when the body can stream (`UNSIGNED-PAYLOAD`, the aws-chunked streaming forms, whose chunks
/// are re-signed as they pass, and every kind that does not sign the body).
///
/// `headers` are the request's as the sandbox sent them (`x-amz-content-sha256` declares the
/// form). A form latchkey refuses answers `None`: [`apply`] refuses it without a body.
pub fn whole_body_needed(kind: &Kind, headers: &HeaderMap) -> Option<usize> {
    match kind {
        Kind::AwsSigV4 {
            max_signed_body, ..
        } if *max_signed_body > 0 => match sigv4::Payload::declared(headers) {
            Ok(sigv4::Payload::Classic) => Some(*max_signed_body),
            _ => None,
        },
        _ => None,
    }
}

/// Headers the sandbox may have set that a credentialed request must not carry.
pub fn stripped_headers(kind: &Kind) -> &'static [&'static str] {
    match kind {
        // `x-amz-content-sha256` stays until signing: it declares the payload form, and
        // [`apply`] replaces it.
        Kind::AwsSigV4 { .. } => &["authorization", "x-amz-date", "x-amz-security-token"],
        _ => &["authorization"],
    }
}

fn failed(name: &str, why: impl Into<String>) -> CredentialError {
    CredentialError::Failed {
        name: name.to_string(),
        why: why.into(),
    }
}

async fn secret(
    store: &SecretStore,
    cred: &str,
    field: &str,
) -> Result<SecretValue, CredentialError> {
    store
        .get(&field_key(cred, field))
        .await
        .map_err(|source| CredentialError::Secret {
            name: cred.to_string(),
            source,
        })
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// Applies a credential to a request: signs it (SigV4) or attaches a token, last. The result
/// says what remains to do on the body ([`Applied::body`]).
#[allow(clippy::too_many_arguments)]
pub async fn apply(
    cred: &Credential,
    store: &SecretStore,
    cache: &TokenCache,
    exchanger: &Exchanger,
    t: &Target<'_>,
    headers: &mut HeaderMap,
    path_and_query: &str,
    body: SignBody<'_>,
) -> Result<Applied, CredentialError> {
    let mut applied = Applied::default();
    apply_to(
        cred,
        store,
        cache,
        exchanger,
        t,
        headers,
        path_and_query,
        body,
        &mut applied,
    )
    .await?;
    Ok(applied)
}

#[allow(clippy::too_many_arguments)]
async fn apply_to(
    cred: &Credential,
    store: &SecretStore,
    cache: &TokenCache,
    exchanger: &Exchanger,
    t: &Target<'_>,
    headers: &mut HeaderMap,
    path_and_query: &str,
    body: SignBody<'_>,
    applied: &mut Applied,
) -> Result<(), CredentialError> {
    let name = cred.name.as_str();
    match &cred.kind {
        Kind::AwsSigV4 {
            assume_role,
            region,
            service,
            has_session_token,
            max_signed_body,
        } => {
            if path_and_query
                .split_once('?')
                .is_some_and(|(_, q)| q.to_ascii_lowercase().contains("x-amz-signature="))
            {
                return Err(CredentialError::PresignedQuery {
                    name: name.to_string(),
                });
            }
            // Before any key is fetched or STS called: a form latchkey cannot sign is the
            // sandbox's to fix.
            let form = PayloadForm::of(name, headers)?;
            let (region, service) = match (region, service) {
                (Some(r), Some(s)) => (r.clone(), s.clone()),
                _ => {
                    let (dr, ds) = derive_region_service(t.host).ok_or_else(|| {
                        failed(name, format!("cannot derive region and service from host {}: set region and service", t.host))
                    })?;
                    (region.clone().unwrap_or(dr), service.clone().unwrap_or(ds))
                }
            };
            let base_akid = secret(store, name, "access_key_id").await?;
            let base_secret = secret(store, name, "secret_access_key").await?;
            let base_token = if *has_session_token {
                Some(secret(store, name, "session_token").await?)
            } else {
                None
            };
            let (akid, secret_key, token) = match assume_role {
                None => (base_akid, base_secret, base_token),
                Some(role) => {
                    let keys = sigv4::Keys {
                        akid: &base_akid,
                        secret: &base_secret,
                        token: base_token.as_ref(),
                    };
                    let packed = cache
                        .get(name, REFRESH_MARGIN, || {
                            assume(name, role, &keys, exchanger)
                        })
                        .await?;
                    let (a, s, t) = unpack_keys(name, &packed)?;
                    store.set_minted(&field_key(name, "assumed_secret_access_key"), "", &s);
                    store.set_minted(&field_key(name, "assumed_session_token"), "", &t);
                    (a, s, Some(t))
                }
            };
            let payload = match form.payload {
                Payload::Classic => match body {
                    SignBody::Whole(b) if b.len() <= *max_signed_body => {
                        sigv4::SignPayload::Bytes(b)
                    }
                    _ => sigv4::SignPayload::Unsigned,
                },
                Payload::Unsigned => sigv4::SignPayload::Unsigned,
                Payload::StreamingUnsignedTrailer => {
                    sigv4::SignPayload::Literal(sigv4::STREAMING_UNSIGNED_TRAILER)
                }
                Payload::StreamingSigned { trailer: false } => {
                    sigv4::SignPayload::Literal(sigv4::STREAMING_SIGNED)
                }
                Payload::StreamingSigned { trailer: true } => {
                    sigv4::SignPayload::Literal(sigv4::STREAMING_SIGNED_TRAILER)
                }
            };
            let seed = sigv4::sign(
                &sigv4::Keys {
                    akid: &akid,
                    secret: &secret_key,
                    token: token.as_ref(),
                },
                &region,
                &service,
                t,
                headers,
                path_and_query,
                payload,
                form.declared,
            )
            .map_err(|why| failed(name, why))?;
            let mode = match form.payload {
                Payload::StreamingUnsignedTrailer => aws_chunked::Mode::Check,
                Payload::StreamingSigned { trailer } => {
                    // The chunk signatures use the seed's own timestamp and scope.
                    let stamp = headers
                        .get("x-amz-date")
                        .and_then(|v| v.to_str().ok())
                        .ok_or_else(|| failed(name, "the signer set no x-amz-date"))?;
                    let key = aws_chunked::signing_key(
                        secret_key.expose(),
                        stamp.get(..8).unwrap_or(stamp),
                        &region,
                        &service,
                    );
                    let signer =
                        aws_chunked::ChunkSigner::new(key, stamp, &region, &service, &seed);
                    aws_chunked::Mode::Resign {
                        signer: Box::new(signer),
                        trailer,
                    }
                }
                Payload::Classic | Payload::Unsigned => return Ok(()),
            };
            applied.chunked = Some(aws_chunked::Framing::new(mode, form.decoded_length));
            Ok(())
        }
        Kind::GithubApp {
            app_id,
            installation_id,
            api,
            permissions,
            repositories,
        } => {
            let token = cache
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
                    let json = exchange_json(exchanger, name, url, headers, serde_json::Value::Object(body).to_string().into()).await?;
                    let token = json_str(&json, "token").ok_or_else(|| failed(name, "token endpoint answered without a token"))?;
                    let expires = json_str(&json, "expires_at")
                        .and_then(|s| humantime::parse_rfc3339_weak(&s).ok())
                        .and_then(|t| t.duration_since(SystemTime::now()).ok())
                        .unwrap_or(Duration::from_secs(3600));
                    Ok((SecretValue::new(token.into_bytes()), expires))
                })
                .await?;
            store.set_minted(&token_name(name), "", &token);
            let api_host = http::Uri::try_from(api.as_str())
                .ok()
                .and_then(|u| u.host().map(str::to_ascii_lowercase));
            if api_host.as_deref() == Some(t.host) {
                set_bearer(headers, &AUTHORIZATION, &token, true)
            } else {
                // git over HTTPS (github.com): installation tokens go in Basic auth.
                let mut raw = b"x-access-token:".to_vec();
                raw.extend_from_slice(token.expose());
                let enc =
                    zeroize::Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(&raw));
                let mut hv = sensitive(format!("Basic {}", &*enc))?;
                hv.set_sensitive(true);
                headers.insert(AUTHORIZATION, hv);
                Ok(())
            }
        }
        Kind::GoogleServiceAccount { scopes, token_uri } => {
            let token = cache
                .get(name, REFRESH_MARGIN, || async {
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
                    let claims = serde_json::json!({
                        "iss": email, "scope": scopes.join(" "), "aud": uri, "iat": now, "exp": now + 3600,
                    });
                    let assertion = jwt::sign(JwtAlg::Rs256, pem.expose(), kid.as_deref(), &claims)
                        .map_err(|e| failed(name, format!("cannot sign the assertion: {e}")))?;
                    let form = format!(
                        "grant_type={}&assertion={}",
                        form_encode("urn:ietf:params:oauth:grant-type:jwt-bearer"),
                        form_encode(&assertion)
                    );
                    let json = exchange_json(exchanger, name, uri, form_headers(), form.into()).await?;
                    access_token(name, &json)
                })
                .await?;
            store.set_minted(&token_name(name), "", &token);
            set_bearer(headers, &AUTHORIZATION, &token, true)
        }
        Kind::OAuth2ClientCredentials {
            token_url,
            client_id,
            scope,
            audience,
        } => {
            let token = cache
                .get(name, REFRESH_MARGIN, || async {
                    let client_secret = secret(store, name, "client_secret").await?;
                    let secret_text = std::str::from_utf8(client_secret.expose())
                        .map_err(|_| failed(name, "client_secret is not UTF-8"))?;
                    let mut form = format!(
                        "grant_type=client_credentials&client_id={}&client_secret={}",
                        form_encode(client_id),
                        form_encode(secret_text)
                    );
                    if let Some(s) = scope {
                        form.push_str(&format!("&scope={}", form_encode(s)));
                    }
                    if let Some(a) = audience {
                        form.push_str(&format!("&audience={}", form_encode(a)));
                    }
                    let body = Bytes::from(zeroize::Zeroizing::new(form).as_bytes().to_vec());
                    let json =
                        exchange_json(exchanger, name, token_url.clone(), form_headers(), body)
                            .await?;
                    access_token(name, &json)
                })
                .await?;
            store.set_minted(&token_name(name), "", &token);
            set_bearer(headers, &AUTHORIZATION, &token, true)
        }
        Kind::Jwt {
            alg,
            ttl,
            header,
            claims,
        } => {
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
                let token = jwt::sign(*alg, key.expose(), None, &serde_json::Value::Object(map))
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
            store.set_minted(&token_name(name), &key_id, &token);
            let bearer = *header == AUTHORIZATION;
            set_bearer(headers, header, &token, bearer)
        }
    }
}

/// The payload form of an AWS request as the sandbox declared it, checked for consistency
/// with its framing headers.
struct PayloadForm {
    payload: Payload,
    /// The sandbox sent `x-amz-content-sha256` (so the upstream expects one).
    declared: bool,
    /// `x-amz-decoded-content-length`, which the aws-chunked data must add up to.
    decoded_length: Option<u64>,
}

impl PayloadForm {
    fn of(name: &str, headers: &HeaderMap) -> Result<PayloadForm, CredentialError> {
        let refuse = |why: String| CredentialError::BadRequest {
            name: name.to_string(),
            why,
        };
        let payload = Payload::declared(headers).map_err(refuse)?;
        let streaming = matches!(
            payload,
            Payload::StreamingUnsignedTrailer | Payload::StreamingSigned { .. }
        );
        let aws_chunked = headers
            .get_all(http::header::CONTENT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|c| c.trim().eq_ignore_ascii_case("aws-chunked"));
        // aws-chunked framing under a classic payload hash would be stored as the object.
        if aws_chunked && !streaming {
            return Err(refuse(
                "Content-Encoding aws-chunked needs a STREAMING-* x-amz-content-sha256".to_string(),
            ));
        }
        let mut lengths = headers.get_all("x-amz-decoded-content-length").iter();
        let decoded_length = match (lengths.next(), lengths.next()) {
            (None, _) => None,
            (Some(v), None) => Some(
                v.to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| {
                        refuse("x-amz-decoded-content-length is not a number".to_string())
                    })?,
            ),
            (Some(_), Some(_)) => {
                return Err(refuse(
                    "x-amz-decoded-content-length is sent more than once".to_string(),
                ))
            }
        };
        if decoded_length.is_some() && !streaming {
            return Err(refuse(
                "x-amz-decoded-content-length without a STREAMING-* x-amz-content-sha256"
                    .to_string(),
            ));
        }
        Ok(PayloadForm {
            payload,
            declared: headers.contains_key("x-amz-content-sha256"),
            decoded_length,
        })
    }
}

/// Calls STS AssumeRole with the base keys; the three temporary values come back packed in
/// one secret (`akid\nsecret\ntoken`) for the token cache.
async fn assume(
    name: &str,
    role: &AssumeRole,
    keys: &sigv4::Keys<'_>,
    exchanger: &Exchanger,
) -> Result<(SecretValue, Duration), CredentialError> {
    let uri: http::Uri = role
        .sts_endpoint
        .parse()
        .map_err(|e| failed(name, format!("sts_endpoint: {e}")))?;
    let host = uri.host().unwrap_or_default().to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or(443);
    let path = match uri.path() {
        "" => "/",
        p => p,
    };
    let mut form = format!(
        "Action=AssumeRole&Version=2011-06-15&RoleArn={}&RoleSessionName={}&DurationSeconds={}",
        form_encode(&role.role_arn),
        form_encode(&role.session_name),
        role.duration.as_secs()
    );
    if let Some(x) = &role.external_id {
        form.push_str(&format!("&ExternalId={}", form_encode(x)));
    }
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-www-form-urlencoded; charset=utf-8"),
    );
    let target = Target {
        method: "POST",
        scheme: "https",
        host: &host,
        port,
        identity: "",
    };
    sigv4::sign(
        keys,
        &role.sts_region,
        "sts",
        &target,
        &mut headers,
        path,
        sigv4::SignPayload::Bytes(form.as_bytes()),
        false,
    )
    .map_err(|why| failed(name, format!("cannot sign AssumeRole: {why}")))?;
    let (status, body) = exchanger(Exchange {
        credential: name.to_string(),
        url: role.sts_endpoint.clone(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        body: Bytes::from(form),
    })
    .await
    .map_err(|why| failed(name, format!("STS {}: {why}", role.sts_endpoint)))?;
    if !(200..300).contains(&status) {
        return Err(failed(name, format!("STS AssumeRole answered {status}")));
    }
    let text = String::from_utf8_lossy(&body);
    let tag = |t: &str| -> Option<String> {
        let open = format!("<{t}>");
        let close = format!("</{t}>");
        let start = text.find(&open)? + open.len();
        let end = text[start..].find(&close)? + start;
        Some(text[start..end].trim().to_string())
    };
    let (Some(a), Some(s), Some(t)) = (
        tag("AccessKeyId"),
        tag("SecretAccessKey"),
        tag("SessionToken"),
    ) else {
        return Err(failed(name, "STS AssumeRole answered without credentials"));
    };
    let lifetime = tag("Expiration")
        .and_then(|e| humantime::parse_rfc3339_weak(&e).ok())
        .and_then(|e| e.duration_since(SystemTime::now()).ok())
        .unwrap_or(role.duration);
    Ok((
        SecretValue::new(format!("{a}\n{s}\n{t}").into_bytes()),
        lifetime,
    ))
}

fn unpack_keys(
    name: &str,
    packed: &SecretValue,
) -> Result<(SecretValue, SecretValue, SecretValue), CredentialError> {
    let mut parts = packed.expose().split(|&b| b == b'\n');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(a), Some(s), Some(t)) => Ok((
            SecretValue::new(a.to_vec()),
            SecretValue::new(s.to_vec()),
            SecretValue::new(t.to_vec()),
        )),
        _ => Err(failed(name, "cached role keys are malformed")),
    }
}

fn sensitive(v: String) -> Result<HeaderValue, CredentialError> {
    let mut hv = HeaderValue::from_str(&v).map_err(|_| CredentialError::Failed {
        name: String::new(),
        why: "a token is not valid in a header".to_string(),
    })?;
    hv.set_sensitive(true);
    Ok(hv)
}

fn set_bearer(
    headers: &mut HeaderMap,
    name: &HeaderName,
    token: &SecretValue,
    bearer: bool,
) -> Result<(), CredentialError> {
    let mut raw = if bearer {
        b"Bearer ".to_vec()
    } else {
        Vec::new()
    };
    raw.extend_from_slice(token.expose());
    let raw = zeroize::Zeroizing::new(raw);
    let mut hv = HeaderValue::from_bytes(&raw).map_err(|_| CredentialError::Failed {
        name: String::new(),
        why: "a minted token is not valid in a header".to_string(),
    })?;
    hv.set_sensitive(true);
    headers.insert(name.clone(), hv);
    Ok(())
}

fn form_headers() -> Vec<(HeaderName, HeaderValue)> {
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

fn form_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn json_str(v: &serde_json::Value, key: &str) -> Option<String> {
    v.get(key).and_then(|x| x.as_str()).map(str::to_string)
}

fn access_token(
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

async fn exchange_json(
    exchanger: &Exchanger,
    name: &str,
    url: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
) -> Result<serde_json::Value, CredentialError> {
    let (status, bytes) = exchanger(Exchange {
        credential: name.to_string(),
        url: url.clone(),
        headers,
        body,
    })
    .await
    .map_err(|why| failed(name, format!("token endpoint {url}: {why}")))?;
    if !(200..300).contains(&status) {
        return Err(failed(
            name,
            format!("token endpoint {url} answered {status}"),
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        failed(
            name,
            format!("token endpoint {url} answered invalid JSON: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_token_cache_is_bounded_however_many_hosts_a_sandbox_names() {
        let cache = TokenCache::default();
        for i in 0..(MAX_SLOTS + 300) {
            let token = cache
                .get(&format!("jwt:h{i}.example"), Duration::ZERO, || async {
                    Ok((
                        SecretValue::new(b"minted-token-value".to_vec()),
                        Duration::from_secs(60),
                    ))
                })
                .await
                .expect("minted");
            assert_eq!(token.expose(), b"minted-token-value");
        }
        assert_eq!(cache.len(), MAX_SLOTS);
        assert_eq!(cache.exchanges(), (MAX_SLOTS + 300) as u64);
    }

    fn aws(max: usize) -> Kind {
        Kind::AwsSigV4 {
            assume_role: None,
            region: None,
            service: None,
            has_session_token: false,
            max_signed_body: max,
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    #[test]
    fn only_a_classic_signed_payload_needs_the_whole_body() {
        let hex = "ab".repeat(32);
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<usize>);
        let cases: &[Case] = &[
            (&[], Some(1024)),
            (&[("x-amz-content-sha256", &hex)], Some(1024)),
            (&[("x-amz-content-sha256", "UNSIGNED-PAYLOAD")], None),
            (
                &[("x-amz-content-sha256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER")],
                None,
            ),
            (
                &[("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")],
                None,
            ),
            (
                &[(
                    "x-amz-content-sha256",
                    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
                )],
                None,
            ),
            // Refused by apply, so never worth buffering.
            (&[("x-amz-content-sha256", "garbage")], None),
        ];
        for (h, want) in cases {
            assert_eq!(whole_body_needed(&aws(1024), &headers(h)), *want, "{h:?}");
        }
        assert_eq!(whole_body_needed(&aws(0), &headers(&[])), None);
        let jwt = Kind::Jwt {
            alg: JwtAlg::Hs256,
            ttl: None,
            header: AUTHORIZATION,
            claims: Vec::new(),
        };
        assert_eq!(whole_body_needed(&jwt, &headers(&[])), None);
    }

    #[test]
    fn payload_forms_are_read_and_contradictions_refused() {
        let form = |h: &[(&str, &str)]| PayloadForm::of("c", &headers(h));
        let ok = form(&[
            ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"),
            ("content-encoding", "gzip, aws-chunked"),
            ("x-amz-decoded-content-length", "42"),
        ])
        .expect("valid");
        assert_eq!(ok.payload, Payload::StreamingSigned { trailer: false });
        assert!(ok.declared);
        assert_eq!(ok.decoded_length, Some(42));
        assert!(!form(&[]).expect("classic").declared);
        let refused: &[&[(&str, &str)]] = &[
            &[(
                "x-amz-content-sha256",
                "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD",
            )],
            &[("x-amz-content-sha256", "abc")],
            &[
                ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
                ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
            ],
            &[("content-encoding", "aws-chunked")],
            &[
                ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
                ("content-encoding", "AWS-Chunked"),
            ],
            &[("x-amz-decoded-content-length", "5")],
            &[
                ("x-amz-content-sha256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"),
                ("x-amz-decoded-content-length", "-1"),
            ],
            &[
                ("x-amz-content-sha256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"),
                ("x-amz-decoded-content-length", "5"),
                ("x-amz-decoded-content-length", "5"),
            ],
        ];
        for h in refused {
            assert!(
                matches!(form(h), Err(CredentialError::BadRequest { .. })),
                "{h:?}"
            );
        }
    }

    #[test]
    fn exchange_debug_shows_no_secret_material() {
        let mut auth = HeaderValue::from_static("Bearer eyJhbGciOi.secret-jwt.sig");
        auth.set_sensitive(true);
        let ex = Exchange {
            credential: "oauth".into(),
            url: "https://oauth.test/token".into(),
            headers: vec![(AUTHORIZATION, auth)],
            body: Bytes::from_static(b"client_secret=hunter2&client_assertion=eyJ"),
        };
        let text = format!("{ex:?}");
        assert!(
            text.contains("oauth.test") && text.contains("authorization"),
            "{text}"
        );
        for secret in ["hunter2", "secret-jwt", "eyJ"] {
            assert!(!text.contains(secret), "{text}");
        }
        let applied = format!("{:?}", Applied::default());
        assert!(applied.contains("Applied"), "{applied}");
    }
}

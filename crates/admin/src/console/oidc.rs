//! The console's OpenID Connect sign-in (`[admin.oidc]`): the authorization code flow with PKCE
//! (S256) against one configured issuer.
//!
//! - `GET /ui/oidc/start` fetches the issuer's discovery document (its `issuer` must be the
//!   configured one exactly; every endpoint https), makes a random `state`, `nonce` and PKCE
//!   verifier, keeps them here (at most [`MAX_PENDING`], for [`PENDING_TTL`]) and sends the
//!   browser to the issuer, with `state` also in a short-lived cookie: a callback is taken only
//!   from the browser that started it.
//! - `GET /ui/oidc/callback` takes the pending sign-in once (a replayed `state` finds none),
//!   exchanges the code at the token endpoint (the client secret, when configured, in
//!   `client_secret_basic`; the verifier always), verifies the ID token with the issuer's JWKS
//!   (`governance::attest::verify`: asymmetric algorithms only, `iss`, `aud` = the client id,
//!   time) and its `nonce`, and maps its claims to scopes through the roles. No role matched:
//!   no session. The session is named `oidc:` and the `name_claim`'s value.
//!
//! Everything fails closed; every failure counts against the address like a bad token, and no
//! message carries a code, token or secret. Documents read are bounded ([`MAX_DOC`]) and every
//! exchange times out ([`TIMEOUT`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use serde::Deserialize;
use serde_json::Value;

use super::{ct_eq, html, store, Console};
use crate::governance::attest::{self, Claims, JwksCache};
use crate::policy::access::{AdminScope, Oidc};
use crate::proxy::Proxy;
use crate::{Body, Served, Via};

/// The cookie that carries `state` between the start and the callback. `SameSite=Lax`: the
/// callback is a top-level navigation from the issuer's site, which a `Strict` cookie misses.
pub const STATE_COOKIE: &str = "latchkey_oidc";
/// How long a started sign-in waits for its callback.
pub const PENDING_TTL: Duration = Duration::from_secs(10 * 60);
/// Most sign-ins started and not yet finished; past it the oldest is dropped.
pub const MAX_PENDING: usize = 1024;
/// Largest discovery document, token response or JWKS read.
pub const MAX_DOC: usize = 256 * 1024;
/// Longest any exchange with the issuer may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// How long a discovery document is reused.
const DISCOVERY_TTL: Duration = Duration::from_secs(60 * 60);
/// Clock skew allowed for the ID token's times.
const LEEWAY: Duration = Duration::from_secs(60);
/// The longest name (`oidc:` and the claim's value) a session is given.
const MAX_NAME: usize = 128;

/// Serves `GET /ui/oidc/start` and `GET /ui/oidc/callback`.
pub(super) async fn route(
    proxy: &Proxy,
    console: &Console,
    served: &Served<'_>,
    req: &Request<hyper::body::Incoming>,
) -> http::Response<Body> {
    let now = Instant::now();
    let policy = proxy.policy();
    let Some(config) = policy.admin_oidc() else {
        return html::message(
            StatusCode::NOT_FOUND,
            "Not found",
            "the policy has no [admin.oidc]: sign in with a token",
            None,
            Some("/ui/login"),
        );
    };
    if console.store.blocked(served.peer.ip(), now) {
        return refused(
            StatusCode::TOO_MANY_REQUESTS,
            "too many failed sign-ins from this address: wait a minute",
        );
    }
    let fingerprint = console.oidc_fingerprint(config);
    if req.uri().path() == "/ui/oidc/start" {
        return match console.oidc.start(proxy, config, fingerprint).await {
            Ok((to, state)) => {
                let mut res =
                    crate::respond(StatusCode::SEE_OTHER, "text/plain", "see the issuer\n");
                if let Ok(v) = HeaderValue::from_str(&to) {
                    res.headers_mut().insert(header::LOCATION, v);
                }
                let cookie = format!(
                    "{STATE_COOKIE}={state}; HttpOnly; SameSite=Lax; Path=/ui/oidc; Max-Age={}",
                    PENDING_TTL.as_secs()
                );
                if let Ok(v) = HeaderValue::from_str(&cookie) {
                    res.headers_mut().insert(header::SET_COOKIE, v);
                }
                res
            }
            // The issuer (or latchkey's way to it) is at fault, not the person: not counted.
            Err(Failed(why)) => {
                tracing::warn!(client.addr = %served.peer, "console OIDC sign-in could not start: {why}");
                refused(StatusCode::BAD_GATEWAY, &why)
            }
        };
    }
    match callback(proxy, console, config, &fingerprint, req).await {
        Ok(who) => {
            let (Some(id), Some(csrf)) = (super::random_hex(), super::random_hex()) else {
                return super::no_random();
            };
            tracing::info!(client.addr = %served.peer, console.user = %who.name, "console sign-in (OIDC)");
            let entry = store::Entry::new(
                who.name,
                who.scopes,
                Via::Oidc,
                Some(fingerprint),
                csrf,
                now,
            );
            console.store.insert(id.clone(), entry, now);
            // A page that moves on by itself, not a redirect: the browser arrived from the
            // issuer's site, and a redirect onwards would still count as that cross-site
            // navigation, so the SameSite=Strict session cookie would not be sent with it.
            let mut res = html::page_with_head(
                StatusCode::OK,
                "Signed in",
                None,
                "<p><a href=\"/ui\">Continue to the console</a></p>",
                "<meta http-equiv=\"refresh\" content=\"0;url=/ui\">",
            );
            super::set_cookie(&mut res, &id);
            clear_state_cookie(&mut res);
            res
        }
        Err(Failed(why)) => {
            console.store.failed(served.peer.ip(), now);
            tracing::warn!(client.addr = %served.peer, "console OIDC sign-in refused: {why}");
            let mut res = refused(StatusCode::FORBIDDEN, &why);
            clear_state_cookie(&mut res);
            res
        }
    }
}

/// The callback's checks: `state` is this browser's (its cookie) and pending, the issuer did
/// not answer with an error, and the code gives a good ID token.
async fn callback(
    proxy: &Proxy,
    console: &Console,
    config: &Oidc,
    fingerprint: &[u8],
    req: &Request<hyper::body::Incoming>,
) -> Result<SignedIn, Failed> {
    let mut params: HashMap<String, String> = HashMap::new();
    for (k, v) in form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes()) {
        if params.insert(k.into_owned(), v.into_owned()).is_some() {
            return Err(failed("a callback parameter is repeated"));
        }
    }
    let state = params.get("state").map(String::as_str).unwrap_or_default();
    let cookie = super::cookie_named(req, STATE_COOKIE).unwrap_or_default();
    if state.is_empty() || !ct_eq(cookie.as_bytes(), state.as_bytes()) {
        return Err(failed(
            "this sign-in was not started by this browser (its state does not match): start again",
        ));
    }
    if let Some(error) = params.get("error") {
        console.oidc.forget(state);
        return Err(failed(format!(
            "the issuer refused the sign-in: {}",
            safe_text(error)
        )));
    }
    let code = params.get("code").map(String::as_str).unwrap_or_default();
    if code.is_empty() {
        console.oidc.forget(state);
        return Err(failed("the issuer sent no code"));
    }
    console
        .oidc
        .finish(proxy, config, fingerprint, state, code)
        .await
}

fn clear_state_cookie(res: &mut http::Response<Body>) {
    res.headers_mut().append(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "latchkey_oidc=; HttpOnly; SameSite=Lax; Path=/ui/oidc; Max-Age=0",
        ),
    );
}

fn refused(status: StatusCode, why: &str) -> http::Response<Body> {
    html::message(status, "Sign-in failed", why, None, Some("/ui/login"))
}

/// The issuer's endpoints, from its discovery document.
#[derive(Debug, Clone)]
struct Endpoints {
    authorization: url::Url,
    token: url::Url,
    jwks: url::Url,
}

struct Pending {
    nonce: String,
    verifier: String,
    /// The `[admin.oidc]` the sign-in started under (its fingerprint): a reload in between
    /// that changes it ends the sign-in.
    config: Vec<u8>,
    created: Instant,
}

/// Sign-ins in flight, the discovery document and the issuer's keys.
#[derive(Default)]
pub struct OidcState {
    pending: Mutex<HashMap<String, Pending>>,
    discovery: tokio::sync::Mutex<Option<(String, Instant, Endpoints)>>,
    /// The keys, per JWKS URL (a new URL after a reload gets a new cache).
    jwks: Mutex<Option<(url::Url, Arc<JwksCache>)>>,
}

/// Who the issuer says signed in, and what the roles grant them.
pub struct SignedIn {
    pub name: String,
    pub scopes: BTreeSet<AdminScope>,
}

/// Why a sign-in failed: shown to the person (short, never a code or token) and logged.
#[derive(Debug)]
pub struct Failed(pub String);

fn failed(why: impl Into<String>) -> Failed {
    Failed(why.into())
}

impl OidcState {
    /// Starts a sign-in: where to send the browser, and the `state` for its cookie.
    pub async fn start(
        &self,
        proxy: &Proxy,
        config: &Oidc,
        fingerprint: Vec<u8>,
    ) -> Result<(String, String), Failed> {
        let endpoints = self.endpoints(proxy, config).await?;
        // 64 hex digits each: a PKCE verifier may be 43 to 128 of [A-Za-z0-9-._~].
        let (Some(state), Some(nonce), Some(verifier)) = (
            super::random_hex(),
            super::random_hex(),
            super::random_hex(),
        ) else {
            return Err(failed("the system random generator failed"));
        };
        let challenge = URL_SAFE_NO_PAD.encode(
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, verifier.as_bytes()).as_ref(),
        );
        let mut to = endpoints.authorization.clone();
        to.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &config.client_id)
            .append_pair("redirect_uri", config.redirect_uri.as_str())
            .append_pair("scope", "openid email profile")
            .append_pair("state", &state)
            .append_pair("nonce", &nonce)
            .append_pair("code_challenge", &challenge)
            .append_pair("code_challenge_method", "S256");
        let now = Instant::now();
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.retain(|_, p| now.saturating_duration_since(p.created) < PENDING_TTL);
        while pending.len() >= MAX_PENDING {
            let oldest = pending
                .iter()
                .min_by_key(|(_, p)| p.created)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => pending.remove(&k),
                None => break,
            };
        }
        pending.insert(
            state.clone(),
            Pending {
                nonce,
                verifier,
                config: fingerprint,
                created: now,
            },
        );
        Ok((to.to_string(), state))
    }

    /// Drops the pending sign-in `state` (the issuer answered it with an error).
    pub fn forget(&self, state: &str) {
        let mut map = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        map.remove(state);
    }

    /// Finishes a sign-in: `state` from the query (the cookie's, checked by the caller), the
    /// code; the person's name and scopes.
    pub async fn finish(
        &self,
        proxy: &Proxy,
        config: &Oidc,
        fingerprint: &[u8],
        state: &str,
        code: &str,
    ) -> Result<SignedIn, Failed> {
        let pending = {
            let mut map = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            map.remove(state)
        };
        let Some(pending) = pending.filter(|p| p.created.elapsed() < PENDING_TTL) else {
            return Err(failed(
                "this sign-in is unknown or expired (started more than 10 minutes ago, or already used): start again",
            ));
        };
        if pending.config != fingerprint {
            return Err(failed(
                "the policy's [admin.oidc] changed during this sign-in: start again",
            ));
        }
        let endpoints = self.endpoints(proxy, config).await?;
        let id_token = exchange(proxy, config, &endpoints, code, &pending.verifier).await?;
        let claims = self.verify(proxy, config, &endpoints, &id_token).await?;
        if claims.get("nonce").as_deref() != Some(pending.nonce.as_str()) {
            return Err(failed(
                "the ID token's nonce is not this sign-in's: refused",
            ));
        }
        if let Some(azp) = claims.get("azp") {
            if azp != config.client_id {
                return Err(failed(
                    "the ID token was issued to another client (azp): refused",
                ));
            }
        }
        let scopes = granted(config, &claims);
        let who = claims
            .get(&config.name_claim)
            .or_else(|| claims.subject().map(str::to_string))
            .unwrap_or_default();
        let name = shown_name(&who);
        if scopes.is_empty() {
            return Err(failed(format!(
                "{name} signed in at the issuer, and no [admin.oidc.roles] grants them anything"
            )));
        }
        Ok(SignedIn { name, scopes })
    }

    /// The issuer's endpoints: its discovery document, fetched and checked, reused for an hour.
    async fn endpoints(&self, proxy: &Proxy, config: &Oidc) -> Result<Endpoints, Failed> {
        let mut cached = self.discovery.lock().await;
        if let Some((issuer, at, e)) = cached.as_ref() {
            if *issuer == config.issuer && at.elapsed() < DISCOVERY_TTL {
                return Ok(e.clone());
            }
        }
        let url = format!(
            "{}/.well-known/openid-configuration",
            config.issuer.trim_end_matches('/')
        );
        let req = request(Method::GET, &url, None, None)?;
        let body = fetch(proxy, req, "the discovery document").await?;
        let e = discovery(&body, &config.issuer)?;
        *cached = Some((config.issuer.clone(), Instant::now(), e.clone()));
        Ok(e)
    }

    /// `token` verified with the issuer's keys (refetched when it names a key they lack).
    async fn verify(
        &self,
        proxy: &Proxy,
        config: &Oidc,
        endpoints: &Endpoints,
        token: &str,
    ) -> Result<Claims, Failed> {
        let cache = {
            let mut slot = self.jwks.lock().unwrap_or_else(PoisonError::into_inner);
            match slot.as_ref() {
                Some((url, cache)) if *url == endpoints.jwks => Arc::clone(cache),
                _ => {
                    let cache = Arc::new(JwksCache::new(
                        Duration::from_secs(300),
                        Duration::from_secs(10),
                        Duration::from_secs(3600),
                    ));
                    *slot = Some((endpoints.jwks.clone(), Arc::clone(&cache)));
                    cache
                }
            }
        };
        let kid = crate::governance::sessions::attested::token_kid(token);
        let url = endpoints.jwks.to_string();
        let jwks = cache
            .get(kid.as_deref(), Instant::now(), || async {
                let req = request(Method::GET, &url, None, None).map_err(|f| f.0)?;
                fetch(proxy, req, "the JWKS")
                    .await
                    .map(|b| b.to_vec())
                    .map_err(|f| f.0)
            })
            .await
            .map_err(|e| failed(format!("the issuer's keys: {e}")))?;
        let expect = attest::Expect {
            issuer: &config.issuer,
            audience: &config.client_id,
            leeway: LEEWAY,
        };
        attest::verify(token, &jwks, &expect, SystemTime::now())
            .map_err(|e| failed(format!("the ID token was refused: {e}")))
    }
}

/// The ID token the token endpoint gives for `code`.
async fn exchange(
    proxy: &Proxy,
    config: &Oidc,
    endpoints: &Endpoints,
    code: &str,
    verifier: &str,
) -> Result<String, Failed> {
    let form = form_urlencoded::Serializer::new(String::new())
        .append_pair("grant_type", "authorization_code")
        .append_pair("code", code)
        .append_pair("redirect_uri", config.redirect_uri.as_str())
        .append_pair("client_id", &config.client_id)
        .append_pair("code_verifier", verifier)
        .finish();
    let basic = if config.confidential {
        let secret = proxy
            .policy()
            .secrets()
            .get(crate::policy::access::OIDC_SECRET_KEY)
            .await
            .map_err(|e| failed(format!("[admin.oidc] client_secret: {e}")))?;
        // RFC 6749 2.3.1: each part form-encoded, then joined and base64'd.
        let enc = |s: &[u8]| form_urlencoded::byte_serialize(s).collect::<String>();
        let pair = format!(
            "{}:{}",
            enc(config.client_id.as_bytes()),
            enc(secret.expose())
        );
        Some(format!("Basic {}", STANDARD.encode(pair)))
    } else {
        None
    };
    let req = request(
        Method::POST,
        endpoints.token.as_str(),
        Some(form),
        basic.as_deref(),
    )?;
    let body = fetch_any(proxy, req, "the token endpoint").await?;
    let (status, body) = body;
    let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if !status.is_success() {
        let code = value
            .get("error")
            .and_then(Value::as_str)
            .map(safe_text)
            .unwrap_or_else(|| "no error code".to_string());
        return Err(failed(format!(
            "the token endpoint refused the code: {status} ({code})"
        )));
    }
    value
        .get("id_token")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| failed("the token endpoint's answer has no id_token"))
}

/// The union of the scopes of every role whose claim matches.
pub fn granted(config: &Oidc, claims: &Claims) -> BTreeSet<AdminScope> {
    let mut scopes = BTreeSet::new();
    for role in &config.roles {
        let matched = match claims.value(&role.claim) {
            Some(Value::String(s)) => *s == role.equals,
            Some(Value::Array(items)) => items
                .iter()
                .any(|v| v.as_str() == Some(role.equals.as_str())),
            Some(Value::Bool(b)) => b.to_string() == role.equals,
            Some(Value::Number(n)) => n.to_string() == role.equals,
            _ => false,
        };
        if matched {
            scopes.extend(role.scopes.iter().copied());
        }
    }
    scopes
}

/// `oidc:` and `who`, printable characters only, at most [`MAX_NAME`].
fn shown_name(who: &str) -> String {
    let clean: String = who
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_NAME - 5)
        .collect();
    if clean.is_empty() {
        "oidc:(unnamed)".to_string()
    } else {
        format!("oidc:{clean}")
    }
}

/// An issuer's short error code, shown only when it is one (letters, digits, `_`, `-`, `.`).
fn safe_text(s: &str) -> String {
    if !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        s.to_string()
    } else {
        "an error code not shown".to_string()
    }
}

/// The endpoints of a discovery document `body`, which must name `issuer` exactly.
fn discovery(body: &[u8], issuer: &str) -> Result<Endpoints, Failed> {
    #[derive(Deserialize)]
    struct Doc {
        issuer: String,
        authorization_endpoint: String,
        token_endpoint: String,
        jwks_uri: String,
    }
    let doc: Doc = serde_json::from_slice(body).map_err(|e| {
        failed(format!(
            "the issuer's discovery document is not one: {}",
            e.to_string().chars().take(200).collect::<String>()
        ))
    })?;
    if doc.issuer != issuer {
        return Err(failed(format!(
            "the discovery document names issuer {:?}, not the configured {issuer:?}",
            doc.issuer.chars().take(200).collect::<String>()
        )));
    }
    let https = |field: &str, text: &str| -> Result<url::Url, Failed> {
        match url::Url::parse(text) {
            Ok(u) if u.scheme() == "https" && u.host_str().is_some() => Ok(u),
            _ => Err(failed(format!(
                "the discovery document's {field} is not an https URL"
            ))),
        }
    };
    Ok(Endpoints {
        authorization: https("authorization_endpoint", &doc.authorization_endpoint)?,
        token: https("token_endpoint", &doc.token_endpoint)?,
        jwks: https("jwks_uri", &doc.jwks_uri)?,
    })
}

type UpBody = http_body_util::combinators::BoxBody<Bytes, latchkey_upstream::BoxError>;

fn request(
    method: Method,
    url: &str,
    form: Option<String>,
    authorization: Option<&str>,
) -> Result<Request<UpBody>, Failed> {
    let mut req = Request::builder()
        .method(method)
        .uri(url)
        .header(header::ACCEPT, "application/json");
    if let Some(a) = authorization {
        let mut v = HeaderValue::from_str(a)
            .map_err(|_| failed("the client secret is not a header value"))?;
        v.set_sensitive(true);
        req = req.header(header::AUTHORIZATION, v);
    }
    let body = match form {
        Some(f) => {
            req = req.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
            Bytes::from(f)
        }
        None => Bytes::new(),
    };
    req.body(Full::new(body).map_err(|never| match never {}).boxed())
        .map_err(|_| failed(format!("{} is not a usable URL", where_of(url))))
}

/// A successful answer's body.
async fn fetch(proxy: &Proxy, req: Request<UpBody>, what: &str) -> Result<Bytes, Failed> {
    let (status, body) = fetch_any(proxy, req, what).await?;
    if !status.is_success() {
        return Err(failed(format!("{what}: the issuer answered {status}")));
    }
    Ok(body)
}

/// Any answer's status and body (at most [`MAX_DOC`]), through the guarded client, within
/// [`TIMEOUT`].
async fn fetch_any(
    proxy: &Proxy,
    req: Request<UpBody>,
    what: &str,
) -> Result<(StatusCode, Bytes), Failed> {
    let place = where_of(&req.uri().to_string());
    let client = proxy.upstream_client();
    let exchange = async {
        let res = client.request(req).await.map_err(|e| {
            failed(format!(
                "{what} ({place}): {}",
                crate::reason::chain_text(&e)
            ))
        })?;
        let status = res.status();
        let body = Limited::new(res.into_body(), MAX_DOC)
            .collect()
            .await
            .map_err(|_| {
                failed(format!(
                    "{what} ({place}): unreadable or larger than {MAX_DOC} bytes"
                ))
            })?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(TIMEOUT, exchange).await.map_err(|_| {
        failed(format!(
            "{what} ({place}): no answer within {}s",
            TIMEOUT.as_secs()
        ))
    })?
}

/// A URL as messages show it: scheme, host and path, never its query.
fn where_of(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => format!(
            "{}://{}{}",
            u.scheme(),
            u.host_str().unwrap_or_default(),
            u.path()
        ),
        Err(_) => "an unparsable URL".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_discovery_document_must_name_the_issuer_and_https_endpoints() {
        let doc = |iss: &str, token: &str| {
            serde_json::json!({
                "issuer": iss,
                "authorization_endpoint": "https://idp.test/auth",
                "token_endpoint": token,
                "jwks_uri": "https://idp.test/keys",
            })
            .to_string()
        };
        let ok = discovery(
            doc("https://idp.test", "https://idp.test/token").as_bytes(),
            "https://idp.test",
        );
        assert!(ok.is_ok());
        let other = discovery(
            doc("https://evil.test", "https://idp.test/token").as_bytes(),
            "https://idp.test",
        );
        assert!(other.is_err_and(|e| e.0.contains("not the configured")));
        let plain = discovery(
            doc("https://idp.test", "http://idp.test/token").as_bytes(),
            "https://idp.test",
        );
        assert!(plain.is_err_and(|e| e.0.contains("token_endpoint is not an https URL")));
        assert!(discovery(b"{}", "https://idp.test").is_err());
        assert!(discovery(b"\xff", "https://idp.test").is_err());
    }

    #[test]
    fn names_and_error_codes_are_shown_only_when_harmless() {
        assert_eq!(shown_name("alice@example.com"), "oidc:alice@example.com");
        assert_eq!(shown_name("a\u{7}b\nc"), "oidc:abc");
        assert_eq!(shown_name(""), "oidc:(unnamed)");
        assert_eq!(shown_name(&"x".repeat(500)).len(), MAX_NAME);
        assert_eq!(safe_text("invalid_grant"), "invalid_grant");
        assert_eq!(safe_text("<script>"), "an error code not shown");
        assert_eq!(
            where_of("https://idp.test/token?code=SECRET"),
            "https://idp.test/token"
        );
    }

    proptest::proptest! {
        #[test]
        fn no_discovery_document_or_token_header_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512), text in ".{0,200}") {
            let _ = discovery(&bytes, "https://idp.test");
            let _ = shown_name(&text);
            let _ = safe_text(&text);
        }
    }
}

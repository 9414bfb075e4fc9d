//! The sessions endpoints of the admin API: how a platform admits, lists, extends and revokes
//! each sandbox at runtime (`governance::sessions`).
//!
//! - `POST /sessions` `{"profile", "ttl", "labels", "source", "narrow"}` → `201` with the id,
//!   the token (shown this once), `expires_at`, the `proxy_url` carrying the credentials and the
//!   `env` a sandbox needs (what `latchkey env` prints, for this session);
//! - `GET /sessions?profile=&label=k=v&state=live|revoked|expired&limit=`;
//! - `GET /sessions/ID` (never the token);
//! - `DELETE /sessions/ID` → `204`: refused from its next request, its connections cut;
//! - `POST /sessions/ID/extend` `{"ttl": "1h"}`: never past its profile's TTL from creation.

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;

use super::{json, Body};
use crate::governance::sessions::{CreateRequest, Filter, Sessions};
use crate::proxy::Proxy;

/// Largest request body accepted.
const MAX_BODY: usize = 64 * 1024;

/// Makes the trust variables of a session's `env` (writes the bundle beside the CA).
pub type TrustVars = Arc<dyn Fn() -> Result<Vec<(String, String)>, String> + Send + Sync>;

/// What a session's `env` is made of: the proxy's address as sandboxes reach it, and the trust
/// variables every session shares (CA bundle paths, the JVM's truststore), made on first use.
#[derive(Clone)]
pub struct SessionEnv {
    /// `http://HOST:PORT` of the proxy hop, as a sandbox dials it.
    pub proxy: String,
    make: TrustVars,
    trust: Arc<std::sync::OnceLock<Vec<(String, String)>>>,
}

impl std::fmt::Debug for SessionEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionEnv")
            .field("proxy", &self.proxy)
            .finish_non_exhaustive()
    }
}

impl SessionEnv {
    pub fn new(proxy: String, make: TrustVars) -> Self {
        Self {
            proxy,
            make,
            trust: Arc::new(std::sync::OnceLock::new()),
        }
    }

    /// `http://ID:TOKEN@HOST:PORT`.
    pub(crate) fn proxy_url(&self, id: &str, token: &str) -> String {
        match self.proxy.split_once("://") {
            Some((scheme, rest)) => format!("{scheme}://{id}:{token}@{rest}"),
            None => format!("http://{id}:{token}@{}", self.proxy),
        }
    }

    /// The proxy variables always; the trust variables when they could be made (else logged:
    /// the sandbox then needs the CA some other way).
    fn env(&self, url: &str) -> serde_json::Map<String, serde_json::Value> {
        let mut out = serde_json::Map::new();
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            out.insert(k.to_string(), url.into());
        }
        let trust = match self.trust.get() {
            Some(t) => Some(t),
            None => match (self.make)() {
                Ok(made) => Some(self.trust.get_or_init(|| made)),
                Err(why) => {
                    tracing::warn!(error = %why, "session env: cannot write the trust bundle; env carries the proxy variables only");
                    None
                }
            },
        };
        for (k, v) in trust.into_iter().flatten() {
            out.insert(k.clone(), v.clone().into());
        }
        out
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExtendBody {
    ttl: String,
}

/// Routes `/sessions…`; `by` names the caller (the admin token's name) for the records.
pub async fn route(
    proxy: &Arc<Proxy>,
    env: &SessionEnv,
    by: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let Some(sessions) = proxy.sessions().cloned() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "latchkey has no state store: sessions are unavailable",
        );
    };
    let path = req.uri().path().to_string();
    let rest = path.strip_prefix("/sessions").unwrap_or_default();
    match (req.method().clone(), rest) {
        (Method::POST, "") => create(proxy, &sessions, env, by, req).await,
        (Method::GET, "") => list(&sessions, req.uri().query().unwrap_or_default()).await,
        (_, "") => error(StatusCode::METHOD_NOT_ALLOWED, "use GET or POST /sessions"),
        (method, rest) => {
            // A client may have percent-encoded the id (`ses%5F…`): ids are ASCII, decode it.
            let decoded = percent_encoding::percent_decode_str(rest.trim_start_matches('/'))
                .decode_utf8_lossy()
                .into_owned();
            let rest = decoded.as_str();
            match (method, rest.split_once('/')) {
                (Method::GET, None) => match sessions.view(rest).await {
                    Ok(Some(v)) => json(StatusCode::OK, &to_value(&v)),
                    Ok(None) => error(StatusCode::NOT_FOUND, &format!("no session {rest:?}")),
                    Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
                },
                (Method::DELETE, None) => match sessions.revoke(rest, Some(by)).await {
                    Ok(_) => {
                        let mut res = crate::respond(StatusCode::NO_CONTENT, "text/plain", "");
                        res.headers_mut().remove(http::header::CONTENT_TYPE);
                        res
                    }
                    Err(e) => create_error(&e),
                },
                (Method::POST, Some((id, "extend"))) => extend(&sessions, id, req).await,
                _ => error(
                    StatusCode::NOT_FOUND,
                    "not found: try /sessions, /sessions/ID, /sessions/ID/extend",
                ),
            }
        }
    }
}

async fn create(
    proxy: &Proxy,
    sessions: &Sessions,
    env: &SessionEnv,
    by: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let body: CreateRequest = match read_json(req).await {
        Ok(b) => b,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    let policy = proxy.policy();
    match sessions.create(&policy, &body, Some(by)).await {
        Ok(made) => {
            let url = env.proxy_url(&made.session.id, &made.token);
            let vars = env.env(&url);
            let mut out = to_value(&made.session);
            if let Some(map) = out.as_object_mut() {
                map.insert("token".to_string(), made.token.as_str().into());
                map.insert("proxy_url".to_string(), url.into());
                map.insert("env".to_string(), vars.into());
            }
            json(StatusCode::CREATED, &out)
        }
        Err(e) => create_error(&e),
    }
}

async fn list(sessions: &Sessions, query: &str) -> Response<Body> {
    let filter = match filter_of(query) {
        Ok(f) => f,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    match sessions.list(&filter).await {
        Ok(list) => json(StatusCode::OK, &serde_json::json!({ "sessions": list })),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

/// The filter a list's query asks for (`profile`, `label=k=v`, `state`, `limit`; an empty
/// value is no filter); `Err` names the bad parameter.
pub(crate) fn filter_of(query: &str) -> Result<Filter, String> {
    let mut filter = Filter {
        limit: 1000,
        ..Filter::default()
    };
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if v.is_empty() && k != "limit" {
            continue;
        }
        match &*k {
            "profile" => filter.profile = Some(v.to_string()),
            "label" => match v.split_once('=') {
                Some((k, v)) => filter.label = Some((k.to_string(), v.to_string())),
                None => return Err(format!("label {v:?}: use key=value")),
            },
            "state" => match &*v {
                "live" | "revoked" | "expired" => filter.state = Some(v.to_string()),
                other => return Err(format!("state {other:?} is not live, revoked or expired")),
            },
            "limit" => match v.parse::<usize>() {
                Ok(n) if n >= 1 => filter.limit = n,
                _ => return Err(format!("limit {v:?}: a whole number of at least 1")),
            },
            other => {
                return Err(format!(
                    "unknown parameter {other:?}: use profile, label, state or limit"
                ))
            }
        }
    }
    Ok(filter)
}

async fn extend(sessions: &Sessions, id: &str, req: Request<Incoming>) -> Response<Body> {
    let body: ExtendBody = match read_json(req).await {
        Ok(b) => b,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    let ttl = match humantime::parse_duration(&body.ttl) {
        Ok(t) => t,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("ttl {:?} is not a duration like \"1h\": {e}", body.ttl),
            )
        }
    };
    match sessions.extend(id, ttl).await {
        Ok(v) => json(StatusCode::OK, &to_value(&v)),
        Err(e) => create_error(&e),
    }
}

fn create_error(e: &crate::governance::sessions::CreateError) -> Response<Body> {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    error(status, &e.to_string())
}

fn to_value<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    json(status, &serde_json::json!({ "error": message }))
}

async fn read_json<T: serde::de::DeserializeOwned>(req: Request<Incoming>) -> Result<T, String> {
    let body = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| format!("cannot read the body (at most {MAX_BODY} bytes): {e}"))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| format!("invalid JSON body: {e}"))
}

//! The admin API, on its own listener (`--admin`, loopback by default). The address guard
//! refuses it as one of latchkey's own addresses, so a sandbox can never reach it through the
//! proxy.
//!
//! - `GET /healthz`: the process is up. `GET /readyz`: serving (503 while shutting down or
//!   while the audit log cannot be written).
//! - `GET /status`: policy digest, files, rules, identities, last reload, uptime, connections,
//!   and with `--audit-ship` how far shipping lags (`audit_ship`).
//! - `GET /metrics`: Prometheus text format.
//! - `POST /reload`: reload the policy now (422 with the errors if invalid; the old one stays).
//! - `GET /explain?method=GET&url=...&identity=...`: the decision for one request, as JSON
//!   (`header=NAME:VALUE`, repeatable, `content_type` and `body`: what it carries, for
//!   predicates and denials).
//! - `GET /approvals`, `GET|POST /approvals/ID`, `GET /grants`: requests waiting for a person,
//!   and the answers (`approvals`).
//! - `GET /limits`: the `[limits]` in force and every counter charged, with its use now.
//! - `POST /slack/actions/NAME`: a click on an interactive button of `[notify.NAME]`'s Slack
//!   message (`slack`), answered without the admin token: Slack's request signature is the
//!   credential, as a signed link's HMAC is.
//!
//! - With `--console`, `/ui…`: the operator console's HTML pages (`console`), behind a sign-in
//!   that exchanges an admin token for a session cookie; without it, `/ui` is `404`.
//!
//! With `--admin-token`, every endpoint but `/healthz`, `/readyz`, the signed links and
//! `/slack/actions/NAME` needs `Authorization: Bearer TOKEN` (compared in constant time).

// The crates this one uses, under the module names the code knows them by.
use latchkey_audit as audit;
use latchkey_governance as governance;
use latchkey_policy as policy;
use latchkey_proxy as proxy;
use latchkey_review as review;
use latchkey_secrets as secrets;
use latchkey_ship as ship;
use latchkey_wire::reason;

mod approvals;
mod console;
pub mod sessions;
mod slack;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::policy::access::AdminScope;
use crate::proxy::Proxy;
use crate::secrets::SecretValue;

/// The admin API's OpenAPI document (checked in; a test validates every response against it).
pub const OPENAPI: &str = include_str!("../openapi.json");
use crate::ship::Shipper;

/// Every answer's body: whole (`respond`, `json`) or, for the console's live traffic, a stream.
type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

fn respond(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut res = Response::new(Full::new(body.into()).boxed_unsync());
    *res.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        res.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    res.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    res
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut text = value.to_string();
    text.push('\n');
    respond(status, "application/json", text)
}

/// Serves the admin API for the life of the process; `ship` is the audit shipper when
/// `--audit-ship` is on.
pub async fn serve(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    token: Option<SecretValue>,
    ship: Option<Arc<Shipper>>,
    env: sessions::SessionEnv,
    console: Option<audit::live::Live>,
) {
    let token = Arc::new(token);
    let env = Arc::new(env);
    // `--console`: the pages under /ui and their sign-ins, for the life of the process.
    let console = console.map(|live| Arc::new(console::Console::new(live, proxy.audit())));
    // Keeps serving while the proxy drains, so /readyz can say 503; the process exit ends it.
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let proxy = proxy.clone();
        let token = token.clone();
        let ship = ship.clone();
        let env = env.clone();
        let console = console.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let proxy = proxy.clone();
                let token = token.clone();
                let ship = ship.clone();
                let env = env.clone();
                let console = console.clone();
                async move {
                    let served = Served {
                        ship: ship.as_deref(),
                        token: token.as_ref().as_ref(),
                        env: &env,
                        peer,
                        console: console.as_deref(),
                    };
                    Ok::<_, Infallible>(route(&proxy, served, req).await)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!(client.addr = %peer, error = %e, "admin connection error");
            }
        });
    }
}

/// Who is calling, by the token presented, and what it may do.
struct Caller {
    /// The policy token's name; `admin` for `--admin-token` (or no token configured).
    name: String,
    scopes: std::collections::BTreeSet<AdminScope>,
    /// Which kind of token admitted it.
    via: Via,
}

/// What admitted a caller: no token configured at all, `--admin-token`, or the policy's
/// `[admin.tokens.NAME]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Open,
    AdminToken,
    Policy,
    /// The console's `[admin.oidc]` sign-in (never the API's: it takes bearer tokens only).
    Oidc,
}

/// The caller `req`'s `Authorization: Bearer` names: `--admin-token` may do everything, a
/// policy's `[admin.tokens.NAME]` its scopes. With no token configured at all, every caller
/// may do everything (the listener is loopback by default). `None`: unauthorized. Every
/// configured token is compared, each in constant time.
async fn caller(
    proxy: &Proxy,
    token: Option<&SecretValue>,
    req: &Request<Incoming>,
) -> Option<Caller> {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    caller_by(proxy, token, presented).await
}

/// The caller a presented token names (see [`caller`]); the console's sign-in uses it too, so
/// a token admits the same person with the same scopes either way.
async fn caller_by(
    proxy: &Proxy,
    token: Option<&SecretValue>,
    presented: Option<&str>,
) -> Option<Caller> {
    let policy = proxy.policy();
    let everything = |via| Caller {
        name: "admin".to_string(),
        scopes: AdminScope::ALL.into_iter().collect(),
        via,
    };
    if token.is_none() && policy.admin_tokens().is_empty() {
        return Some(everything(Via::Open));
    }
    let presented = presented?;
    let mut found = token
        .is_some_and(|t| t.ct_eq(presented.as_bytes()))
        .then(|| everything(Via::AdminToken));
    for t in policy.admin_tokens() {
        let Some(value) = policy_token(proxy, &t.name).await else {
            continue;
        };
        if value.ct_eq(presented.as_bytes()) && found.is_none() {
            found = Some(Caller {
                name: t.name.clone(),
                scopes: t.scopes.clone(),
                via: Via::Policy,
            });
        }
    }
    found
}

/// The value of the policy's `[admin.tokens.NAME]` in force, when it may admit anyone (as
/// `--admin-token`: a token short enough to guess admits nobody).
async fn policy_token(proxy: &Proxy, name: &str) -> Option<SecretValue> {
    let key = crate::policy::access::admin_token_key(name);
    let value = proxy.policy().secrets().get(&key).await.ok()?;
    if value.expose().len() < MIN_TOKEN_LEN {
        short_token_warning(name);
        return None;
    }
    Some(value)
}

/// The shortest admin token accepted (as `serve --admin-token` requires).
const MIN_TOKEN_LEN: usize = 16;

/// Says once per token name that a policy's admin token is too short to be used.
fn short_token_warning(name: &str) {
    static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut warned = WARNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !warned.iter().any(|n| n == name) {
        warned.push(name.to_string());
        tracing::warn!(
            token = name,
            min = MIN_TOKEN_LEN,
            "[admin.tokens.{name}] is shorter than {MIN_TOKEN_LEN} characters: it admits nobody"
        );
    }
}

/// The scope a request needs.
fn scope_for(method: &Method, path: &str) -> AdminScope {
    match (method, path) {
        (&Method::POST, "/reload") => AdminScope::Reload,
        (&Method::POST, p) if p.starts_with("/approvals/") => AdminScope::ApprovalsAnswer,
        (&Method::POST | &Method::DELETE, p) if p == "/sessions" || p.starts_with("/sessions/") => {
            AdminScope::SessionsWrite
        }
        _ => AdminScope::Read,
    }
}

/// What every admin request is served with.
struct Served<'a> {
    ship: Option<&'a Shipper>,
    token: Option<&'a SecretValue>,
    env: &'a sessions::SessionEnv,
    peer: std::net::SocketAddr,
    /// The console, with `--console`.
    console: Option<&'a console::Console>,
}

async fn route(proxy: &Arc<Proxy>, served: Served<'_>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    if path == "/ui" || path.starts_with("/ui/") {
        return match served.console {
            Some(c) => console::route(proxy, c, &served, req).await,
            None => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
        };
    }
    let Served {
        ship,
        token,
        env,
        peer,
        console: _,
    } = served;
    match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => respond(StatusCode::OK, "text/plain", "ok\n"),
        (&Method::GET, "/readyz") => {
            if proxy.is_shutting_down() {
                respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "shutting down\n",
                )
            } else if !proxy.audit().is_healthy() {
                respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "audit log cannot be written\n",
                )
            } else {
                respond(StatusCode::OK, "text/plain", "ready\n")
            }
        }
        // A signed link carries its own credential (its HMAC): no admin token.
        (_, p) if approvals::is_link(p) => approvals::link(proxy, peer, req).await,
        // So does a click in Slack (Slack's signature): Slack cannot send the admin token.
        (_, p) if slack::is_action(p) => slack::route(proxy, peer, req).await,
        _ => match caller(proxy, token, &req).await {
            None => {
                let mut res = respond(
                    StatusCode::UNAUTHORIZED,
                    "text/plain",
                    "admin token required\n",
                );
                res.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer realm=\"latchkey-admin\""),
                );
                res
            }
            Some(c) if !c.scopes.contains(&scope_for(req.method(), &path)) => json(
                StatusCode::FORBIDDEN,
                &serde_json::json!({
                    "error": format!(
                        "token {:?} lacks scope {:?} for {} {path}",
                        c.name,
                        scope_for(req.method(), &path).as_str(),
                        req.method()
                    )
                }),
            ),
            Some(c) => authorized_route(proxy, ship, env, peer, &c.name, req).await,
        },
    }
}

/// The endpoints behind the admin token, once the caller's scope allows the request.
async fn authorized_route(
    proxy: &Arc<Proxy>,
    ship: Option<&Shipper>,
    env: &sessions::SessionEnv,
    peer: std::net::SocketAddr,
    by: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    match (req.method(), path.as_str()) {
        (&Method::GET, "/openapi.json") => respond(StatusCode::OK, "application/json", OPENAPI),
        (_, p) if p == "/sessions" || p.starts_with("/sessions/") => {
            sessions::route(proxy, env, by, req).await
        }
        (&Method::GET, "/metrics") => {
            if let Some(ship) = ship {
                // The spool read now, so the lag gauges are as of this scrape.
                let _ = ship.pending();
            }
            respond(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                proxy.metrics().render(&proxy.gauges()),
            )
        }
        (&Method::GET, "/status") => json(StatusCode::OK, &status(proxy, ship).await),
        (&Method::POST, "/reload") => {
            // Drain any body; the reload takes no input.
            let _ = req.into_body().collect().await;
            match proxy.reload("POST /reload").await {
                Ok(changed) => json(
                    StatusCode::OK,
                    &serde_json::json!({"changed": changed, "policy": proxy.policy().digest()}),
                ),
                Err(e) => json(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    &serde_json::json!({
                        "error": e,
                        "policy": proxy.policy().digest(),
                        "note": "the policy in force was kept",
                    }),
                ),
            }
        }
        (&Method::GET, "/explain") => explain(proxy, req.uri().query().unwrap_or_default()),
        (&Method::GET, "/limits") => json(StatusCode::OK, &limits(proxy).await),
        (_, p) if p == "/approvals" || p == "/grants" || p.starts_with("/approvals/") => {
            match approvals::route(proxy, peer, req).await {
                Some(res) => res,
                None => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
            }
        }
        (_, "/healthz" | "/readyz" | "/metrics" | "/status" | "/reload" | "/explain" | "/limits" | "/openapi.json") => respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed\n",
        ),
        _ => respond(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /status, /metrics, /reload, /explain, /limits, /approvals, /grants, /sessions, /openapi.json, /healthz, /readyz\n",
        ),
    }
}

/// `GET /limits`: every `[limits.NAME]` in force and each counter charged, with its use now
/// (read again from a shared store).
async fn limits(proxy: &Proxy) -> serde_json::Value {
    let policy = proxy.policy();
    let declared: Vec<serde_json::Value> = policy
        .limits()
        .iter()
        .map(|l| {
            serde_json::json!({
                "name": l.name,
                "per": l.per.as_str(),
                "summary": l.summary(),
                "on_store_error": match l.on_store_error {
                    crate::policy::limits::OnStoreError::Deny => "deny",
                    crate::policy::limits::OnStoreError::Allow => "allow",
                },
            })
        })
        .collect();
    let (store, embedded, counters) = match proxy.limiter() {
        Some(l) => (
            Some(l.store().to_string()),
            Some(l.embedded()),
            l.current().await,
        ),
        None => (None, None, Vec::new()),
    };
    serde_json::json!({
        "store": store,
        "embedded": embedded,
        "prices": {
            "source": policy.prices().source,
            "date": policy.prices().date,
            "models": policy.prices().len(),
            "overridden": policy.prices().overridden(),
        },
        "limits": declared,
        "counters": counters,
    })
}

async fn status(proxy: &Proxy, ship: Option<&Shipper>) -> serde_json::Value {
    let state = match proxy.governance() {
        Some(g) => {
            let outbox = g
                .store()
                .queue_len(crate::governance::record::QUEUE_NOTIFY)
                .await;
            serde_json::json!({
                "store": g.store().describe(),
                "notifications_queued": outbox.as_ref().ok(),
                "error": outbox.err().map(|e| e.to_string()),
            })
        }
        None => serde_json::Value::Null,
    };
    let mut v = status_of(proxy, ship);
    v["state"] = state;
    v
}

fn status_of(proxy: &Proxy, ship: Option<&Shipper>) -> serde_json::Value {
    let policy = proxy.policy();
    let gauges = proxy.gauges();
    let reload = proxy.reload_state();
    serde_json::json!({
        "policy": {
            "digest": policy.digest(),
            "files": policy.files().iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
            "rules": policy.rules().len(),
            "identities": policy.identities().iter().map(|i| i.name.clone()).collect::<Vec<_>>(),
            "secrets": policy.secret_names().map(str::to_string).filter(|n| !n.starts_with("identity:")).collect::<Vec<_>>(),
        },
        "reload": reload,
        "uptime_seconds": gauges.uptime_seconds,
        "connections_active": gauges.connections_active,
        "shutting_down": proxy.is_shutting_down(),
        "audit": {
            "healthy": proxy.audit().is_healthy(),
            "written": proxy.audit().written(),
            "failed": proxy.audit().failed(),
        },
        // Off the box: pending segments and bytes, the oldest one's age, the last error.
        "audit_ship": ship.map(|s| s.status()),
    })
}

fn explain(proxy: &Proxy, query: &str) -> Response<Body> {
    let (status, value) = explain_value(proxy, query);
    json(status, &value)
}

/// `/explain`'s answer for `query`, as a status and JSON (the console shows the same).
pub(crate) fn explain_value(proxy: &Proxy, query: &str) -> (StatusCode, serde_json::Value) {
    let mut method = None;
    let mut url = None;
    let mut identity = None;
    let mut headers = http::HeaderMap::new();
    let mut content_type = None;
    let mut body = None;
    // A form-encoded query (`+` is a space), as browsers and `curl --data-urlencode -G` send it.
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "method" => method = Some(v.into_owned()),
            "url" => url = Some(v.into_owned()),
            "identity" => identity = Some(v.into_owned()),
            "header" => match carried_header(&v) {
                Some((name, value)) => {
                    headers.append(name, value);
                }
                None => {
                    return (
                        StatusCode::BAD_REQUEST,
                        serde_json::json!({"error": "header: give it as NAME:VALUE (a valid header name and value)"}),
                    )
                }
            },
            "content_type" => content_type = Some(v.into_owned()),
            "body" => body = Some(v.into_owned()),
            _ => {}
        }
    }
    if let Some(ct) = content_type.as_deref() {
        match http::HeaderValue::from_str(ct) {
            Ok(v) if !headers.contains_key(http::header::CONTENT_TYPE) => {
                headers.insert(http::header::CONTENT_TYPE, v);
            }
            Ok(_) => {}
            Err(_) => {
                return (
                    StatusCode::BAD_REQUEST,
                    serde_json::json!({"error": "content_type: not a valid header value"}),
                )
            }
        }
    }
    let content_type = content_type.or_else(|| {
        headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    });
    let (Some(method), Some(url)) = (method, url) else {
        return (
            StatusCode::BAD_REQUEST,
            serde_json::json!({"error": "give method and url, e.g. /explain?method=GET&url=https://api.github.com/zen"}),
        );
    };
    let policy = proxy.policy();
    let carried = crate::review::explain::Carried {
        headers: Some(&headers),
        content_type: content_type.as_deref(),
        body: body.as_deref().unwrap_or_default().as_bytes(),
    };
    match crate::review::explain::explain_with(&policy, identity.as_deref(), &method, &url, carried)
    {
        Ok(e) => match serde_json::to_value(&e) {
            Ok(v) => (StatusCode::OK, v),
            Err(err) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                serde_json::json!({"error": err.to_string()}),
            ),
        },
        Err(err) => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({"error": err.to_string()}),
        ),
    }
}

/// One `header=NAME:VALUE` of `/explain`.
fn carried_header(text: &str) -> Option<(http::HeaderName, http::HeaderValue)> {
    let (name, value) = text.split_once(':')?;
    let name = http::HeaderName::from_bytes(name.trim().as_bytes()).ok()?;
    let value = http::HeaderValue::from_str(value.trim()).ok()?;
    Some((name, value))
}

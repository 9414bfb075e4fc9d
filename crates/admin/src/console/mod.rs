//! The operator console (`serve --console`): server-rendered pages under `/ui` on the admin
//! listener, for people: overview and audit health, approvals, sessions, limits, policy.
//!
//! - Sign-in exchanges an admin token (`--admin-token`, or the policy's `[admin.tokens.NAME]`,
//!   checked exactly as the API checks a bearer token) for a random session cookie; the session
//!   holds the name and scopes, never the token, and each request checks the policy still
//!   grants them. With no admin token configured the console is open, as the API is.
//! - Every `POST` carries the session's CSRF token and, when the browser sends `Origin`, comes
//!   from the listener's own origin.
//! - Every response carries a strict CSP; the only script and style are the two assets here.

mod approvals;
mod chain;
pub mod html;
mod oidc;
mod pages;
mod sessions;
mod store;
pub mod traffic;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::policy::access::AdminScope;
use crate::proxy::Proxy;
use crate::{respond, Body, Served, Via};

/// The session cookie's name.
const COOKIE: &str = "latchkey_console";
/// Largest form accepted, but for a pasted policy.
const MAX_FORM: usize = 8 * 1024;
/// Largest pasted candidate policy.
const MAX_POLICY_FORM: usize = 1024 * 1024;

/// The console's state: its sign-ins and the key their token fingerprints are made with.
pub struct Console {
    store: store::Store,
    key: aws_lc_rs::hmac::Key,
    /// The audit log's live stream, for the traffic page.
    live: crate::audit::live::Live,
    watchers: Arc<traffic::Watchers>,
    /// `[admin.oidc]` sign-ins in flight, the issuer's endpoints and keys.
    oidc: oidc::OidcState,
    /// The audit chain verified as the overview is looked at.
    chain: chain::ChainCheck,
}

impl Console {
    /// The console over `live`, the audit writer's live stream (its tap is in the writer), and
    /// `audit`, whose chain the overview verifies. Starts the chain checker's task.
    pub fn new(live: crate::audit::live::Live, audit: &crate::audit::AuditLog) -> Self {
        let mut key = [0u8; 32];
        // Fingerprints only tell a rotated token (they live in memory, of high-entropy tokens):
        // on a generator failure a fixed key still does that, so warn rather than refuse.
        if aws_lc_rs::rand::fill(&mut key).is_err() {
            tracing::warn!("console: the system random generator failed for the fingerprint key");
        }
        Self {
            store: store::Store::default(),
            key: aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &key),
            live,
            watchers: Arc::default(),
            oidc: oidc::OidcState::default(),
            chain: chain::ChainCheck::start(audit),
        }
    }

    fn fingerprint(&self, token: &[u8]) -> Vec<u8> {
        aws_lc_rs::hmac::sign(&self.key, token).as_ref().to_vec()
    }

    /// The fingerprint of an `[admin.oidc]`: a reload that changes its issuer, client or
    /// roles ends the sessions it signed in.
    fn oidc_fingerprint(&self, config: &crate::policy::access::Oidc) -> Vec<u8> {
        let text = format!(
            "{}\n{}\n{}\n{:?}",
            config.issuer, config.client_id, config.name_claim, config.roles
        );
        self.fingerprint(text.as_bytes())
    }
}

/// Who is signed in to this request's console session.
pub struct Signed {
    pub id: String,
    pub name: String,
    pub scopes: BTreeSet<AdminScope>,
    pub csrf: String,
}

impl Signed {
    pub fn may(&self, scope: AdminScope) -> bool {
        self.scopes.contains(&scope)
    }
}

/// Serves `/ui…`, every response with the console's security headers.
pub async fn route(
    proxy: &Arc<Proxy>,
    console: &Console,
    served: &Served<'_>,
    req: Request<Incoming>,
) -> Response<Body> {
    let mut res = route_inner(proxy, console, served, req).await;
    html::secure(&mut res);
    res
}

async fn route_inner(
    proxy: &Arc<Proxy>,
    console: &Console,
    served: &Served<'_>,
    req: Request<Incoming>,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    if path.starts_with("/ui/assets/") {
        return match (method, html::asset(&path)) {
            (Method::GET, Some(res)) => res,
            _ => html::message(
                StatusCode::NOT_FOUND,
                "Not found",
                "no such asset",
                None,
                None,
            ),
        };
    }
    if path == "/ui/oidc/start" || path == "/ui/oidc/callback" {
        return match method {
            Method::GET => oidc::route(proxy, console, served, &req).await,
            _ => not_allowed(None),
        };
    }
    if path == "/ui/login" {
        return match method {
            Method::GET => login_form(proxy, console, served, &req).await,
            Method::POST => login(proxy, console, served, req).await,
            _ => not_allowed(None),
        };
    }
    let now = Instant::now();
    let mut fresh = None;
    let signed = match signed_in(proxy, console, served, &req, now).await {
        Some(s) => s,
        // Open (no admin token anywhere): a session on first visit, for its CSRF token.
        None if method == Method::GET && is_open(proxy, served) => {
            match open_session(console, now) {
                Some(s) => {
                    fresh = Some(s.id.clone());
                    s
                }
                None => return no_random(),
            }
        }
        None if method == Method::GET => return redirect("/ui/login", None),
        None => {
            return html::message(
                StatusCode::FORBIDDEN,
                "Not signed in",
                "sign in first: this form needs a console session",
                None,
                Some("/ui/login"),
            )
        }
    };
    let mut res = match method {
        Method::GET => get(proxy, console, served, &signed, &req).await,
        Method::POST => post(proxy, console, served, &signed, req).await,
        _ => not_allowed(Some(&signed)),
    };
    if let Some(id) = fresh {
        set_cookie(&mut res, &id);
    }
    res
}

async fn get(
    proxy: &Arc<Proxy>,
    console: &Console,
    served: &Served<'_>,
    signed: &Signed,
    req: &Request<Incoming>,
) -> Response<Body> {
    // Every page reads, as every GET of the admin API needs `read`: a token that may only
    // answer approvals or write sessions sees no more here than the API would show it.
    if !signed.may(AdminScope::Read) {
        return no_read(signed);
    }
    let query = req.uri().query().unwrap_or_default();
    match req.uri().path() {
        "/ui" | "/ui/" => pages::overview(proxy, served.ship, &console.chain, signed).await,
        "/ui/approvals" => approvals::page(proxy, signed).await,
        "/ui/sessions" => sessions::page(proxy, signed, query).await,
        "/ui/limits" => pages::limits(proxy, &console.live, signed).await,
        "/ui/policy" => pages::policy(proxy, signed, query),
        "/ui/traffic" => traffic::page(signed, query),
        "/ui/traffic/stream" => {
            traffic::stream_response(&console.live, &console.watchers, signed, query)
        }
        "/ui/explain" => traffic::explain_page(proxy, signed, query),
        _ => html::message(
            StatusCode::NOT_FOUND,
            "Not found",
            "no such page: try the links above",
            Some(signed),
            Some("/ui"),
        ),
    }
}

async fn post(
    proxy: &Arc<Proxy>,
    console: &Console,
    served: &Served<'_>,
    signed: &Signed,
    req: Request<Incoming>,
) -> Response<Body> {
    if let Err(why) = same_origin(&req) {
        return html::message(StatusCode::FORBIDDEN, "Refused", why, Some(signed), None);
    }
    let path = req.uri().path().to_string();
    let limit = if path == "/ui/policy/diff" {
        MAX_POLICY_FORM
    } else {
        MAX_FORM
    };
    let form = match read_form(req, limit).await {
        Ok(f) => f,
        Err(res) => return *res,
    };
    let csrf = form.get("csrf").map(String::as_str).unwrap_or_default();
    if !csrf_matches(&signed.csrf, csrf) {
        return html::message(
            StatusCode::FORBIDDEN,
            "Refused",
            "the form's CSRF token is missing or wrong: reload the page and try again",
            Some(signed),
            None,
        );
    }
    if path == "/ui/logout" {
        console.store.remove(&signed.id);
        let mut res = redirect("/ui/login", None);
        res.headers_mut().insert(
            header::SET_COOKIE,
            HeaderValue::from_static(
                "latchkey_console=; HttpOnly; SameSite=Strict; Path=/ui; Max-Age=0",
            ),
        );
        return res;
    }
    if path == "/ui/policy/diff" {
        if !signed.may(AdminScope::Read) {
            return no_read(signed);
        }
        return pages::policy_diff(proxy, signed, &form);
    }
    if let Some(id) = path.strip_prefix("/ui/approvals/") {
        return approvals::answer(proxy, served.peer, signed, id, &form).await;
    }
    if path == "/ui/sessions" || path.starts_with("/ui/sessions/") {
        return sessions::post(proxy, served.env, signed, &path, &form).await;
    }
    html::message(
        StatusCode::NOT_FOUND,
        "Not found",
        "nothing to post to here",
        Some(signed),
        Some("/ui"),
    )
}

/// Whether the admin API (and so the console) is open: no admin token configured at all, and
/// no `[admin.oidc]` (configuring a sign-in means people must sign in).
fn is_open(proxy: &Proxy, served: &Served<'_>) -> bool {
    let policy = proxy.policy();
    served.token.is_none() && policy.admin_tokens().is_empty() && policy.admin_oidc().is_none()
}

fn open_session(console: &Console, now: Instant) -> Option<Signed> {
    let scopes: BTreeSet<AdminScope> = AdminScope::ALL.into_iter().collect();
    let (id, csrf) = (random_hex()?, random_hex()?);
    console.store.insert(
        id.clone(),
        store::Entry::new(
            "admin".to_string(),
            scopes.clone(),
            Via::Open,
            None,
            csrf.clone(),
            now,
        ),
        now,
    );
    Some(Signed {
        id,
        name: "admin".to_string(),
        scopes,
        csrf,
    })
}

/// The request's console session, if it has a live one the policy still grants.
async fn signed_in(
    proxy: &Proxy,
    console: &Console,
    served: &Served<'_>,
    req: &Request<Incoming>,
    now: Instant,
) -> Option<Signed> {
    let id = cookie(req)?;
    let entry = console.store.get(&id, now)?;
    let still = match entry.via {
        Via::Open => is_open(proxy, served),
        Via::AdminToken => served.token.is_some(),
        Via::Policy => still_granted(proxy, console, &entry).await,
        Via::Oidc => proxy.policy().admin_oidc().is_some_and(|o| {
            let now = console.oidc_fingerprint(o);
            entry.fingerprint.as_deref().is_some_and(|f| ct_eq(f, &now))
        }),
    };
    if !still {
        console.store.remove(&id);
        return None;
    }
    Some(Signed {
        id,
        name: entry.name,
        scopes: entry.scopes,
        csrf: entry.csrf,
    })
}

/// Whether the policy in force still has `[admin.tokens.NAME]` with the same value (by its
/// fingerprint) and at least the scopes signed in with.
async fn still_granted(proxy: &Proxy, console: &Console, entry: &store::Entry) -> bool {
    let policy = proxy.policy();
    let Some(t) = policy.admin_tokens().iter().find(|t| t.name == entry.name) else {
        return false;
    };
    if !entry.scopes.is_subset(&t.scopes) {
        return false;
    }
    let Some(value) = crate::policy_token(proxy, &entry.name).await else {
        return false;
    };
    let now = console.fingerprint(value.expose());
    entry.fingerprint.as_deref().is_some_and(|f| ct_eq(f, &now))
}

async fn login_form(
    proxy: &Proxy,
    console: &Console,
    served: &Served<'_>,
    req: &Request<Incoming>,
) -> Response<Body> {
    if signed_in(proxy, console, served, req, Instant::now())
        .await
        .is_some()
        || is_open(proxy, served)
    {
        return redirect("/ui", None);
    }
    login_page(proxy, StatusCode::OK, None)
}

fn login_page(proxy: &Proxy, status: StatusCode, problem: Option<&str>) -> Response<Body> {
    let mut body = String::new();
    if let Some(p) = problem {
        body.push_str(&format!("<p class=\"bad\">{}</p>", html::esc(p)));
    }
    if let Some(o) = proxy.policy().admin_oidc() {
        let host = url::Url::parse(&o.issuer)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string))
            .unwrap_or_default();
        body.push_str(&format!(
            "<p><a class=\"button\" href=\"/ui/oidc/start\">Sign in with {}</a></p><p>or with a token:</p>",
            html::esc(&host)
        ));
    }
    body.push_str(
        "<form method=\"post\" action=\"/ui/login\"><label>Admin token \
<input type=\"password\" name=\"token\" autocomplete=\"off\" required></label> \
<button type=\"submit\">Sign in</button></form>\
<p>Use the <code>--admin-token</code> or a policy <code>[admin.tokens.NAME]</code> token; \
its scopes decide what you may see and do.</p>",
    );
    html::page(status, "Sign in", None, &body)
}

async fn login(
    proxy: &Proxy,
    console: &Console,
    served: &Served<'_>,
    req: Request<Incoming>,
) -> Response<Body> {
    let now = Instant::now();
    let peer = served.peer.ip();
    if console.store.blocked(peer, now) {
        return login_page(
            proxy,
            StatusCode::TOO_MANY_REQUESTS,
            Some("too many failed sign-ins from this address: wait a minute"),
        );
    }
    if let Err(why) = same_origin(&req) {
        return html::message(StatusCode::FORBIDDEN, "Refused", why, None, None);
    }
    let form = match read_form(req, MAX_FORM).await {
        Ok(f) => f,
        Err(res) => return *res,
    };
    let presented = form.get("token").map(|t| t.trim()).unwrap_or_default();
    let caller = match crate::caller_by(proxy, served.token, Some(presented)).await {
        // The API is open (no token configured), but the console is not: `[admin.oidc]` asks
        // for a sign-in, and no token can give one.
        Some(c) if c.via == Via::Open && !is_open(proxy, served) => {
            console.store.failed(peer, now);
            return login_page(
                proxy,
                StatusCode::UNAUTHORIZED,
                Some("no admin token is configured: sign in with the identity provider"),
            );
        }
        Some(c) if !presented.is_empty() || c.via == Via::Open => c,
        _ => {
            console.store.failed(peer, now);
            tracing::warn!(client.addr = %served.peer, "console sign-in refused");
            return login_page(proxy, StatusCode::UNAUTHORIZED, Some("sign-in failed"));
        }
    };
    let fingerprint =
        (caller.via == Via::Policy).then(|| console.fingerprint(presented.as_bytes()));
    let (Some(id), Some(csrf)) = (random_hex(), random_hex()) else {
        return no_random();
    };
    let entry = store::Entry::new(
        caller.name.clone(),
        caller.scopes,
        caller.via,
        fingerprint,
        csrf,
        now,
    );
    console.store.insert(id.clone(), entry, now);
    tracing::info!(client.addr = %served.peer, admin.token = %caller.name, "console sign-in");
    redirect("/ui", Some(&id))
}

/// `Err` when the request carries an `Origin` other than this listener's own (`http://HOST`).
fn same_origin(req: &Request<Incoming>) -> Result<(), &'static str> {
    let Some(origin) = req.headers().get(header::ORIGIN) else {
        return Ok(());
    };
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .ok_or("the request has an Origin but no Host")?;
    // The admin listener speaks plain HTTP, so its origin is http://HOST.
    if origin.as_bytes() == format!("http://{host}").as_bytes() {
        Ok(())
    } else {
        Err("the form was sent from another origin")
    }
}

/// Whether a presented CSRF token is the session's, compared in constant time.
fn csrf_matches(expected: &str, presented: &str) -> bool {
    ct_eq(expected.as_bytes(), presented.as_bytes())
}

/// Whether two byte strings are equal and not empty, compared in constant time.
fn ct_eq(expected: &[u8], presented: &[u8]) -> bool {
    !expected.is_empty()
        && aws_lc_rs::constant_time::verify_slices_are_equal(expected, presented).is_ok()
}

/// A form body (`application/x-www-form-urlencoded`) of at most `limit` bytes: its first value
/// of each field. `Err`: the page to answer with.
async fn read_form(
    req: Request<Incoming>,
    limit: usize,
) -> Result<HashMap<String, String>, Box<Response<Body>>> {
    let bytes = Limited::new(req.into_body(), limit)
        .collect()
        .await
        .map_err(|_| {
            Box::new(html::message(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Too large",
                &format!("the form could not be read: at most {limit} bytes"),
                None,
                None,
            ))
        })?
        .to_bytes();
    let mut out = HashMap::new();
    for (k, v) in form_urlencoded::parse(&bytes) {
        out.entry(k.into_owned()).or_insert_with(|| v.into_owned());
    }
    Ok(out)
}

/// The console session id the request's cookie carries.
fn cookie(req: &Request<Incoming>) -> Option<String> {
    cookie_named(req, COOKIE).filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The value of the request's cookie `name`, the first one sent.
fn cookie_named(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// The session cookie. No `Secure`: the admin listener speaks plain HTTP (loopback by
/// default); it would have to be added once the listener serves TLS.
fn set_cookie(res: &mut Response<Body>, id: &str) {
    let value = format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/ui");
    if let Ok(v) = HeaderValue::from_str(&value) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
}

/// `303 See Other` to `to`, setting the session cookie `id` when given.
fn redirect(to: &'static str, id: Option<&str>) -> Response<Body> {
    let mut res = respond(StatusCode::SEE_OTHER, "text/plain", format!("see {to}\n"));
    res.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(to));
    if let Some(id) = id {
        set_cookie(&mut res, id);
    }
    res
}

/// A signed-in token without the `read` scope: it may post what its scopes allow, never look.
fn no_read(signed: &Signed) -> Response<Body> {
    html::message(
        StatusCode::FORBIDDEN,
        "Not allowed",
        "this token has no read scope: the console's pages need it, as the admin API's GETs do",
        Some(signed),
        None,
    )
}

fn not_allowed(signed: Option<&Signed>) -> Response<Body> {
    html::message(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method not allowed",
        "pages take GET, forms POST",
        signed,
        Some("/ui"),
    )
}

/// 32 random bytes from the system generator, hex: a session id or CSRF token. `None` when
/// the generator fails (no session is made then).
fn random_hex() -> Option<String> {
    let mut b = [0u8; 32];
    aws_lc_rs::rand::fill(&mut b).ok()?;
    Some(hex::encode(b))
}

fn no_random() -> Response<Body> {
    tracing::error!("console: the system random generator failed");
    html::message(
        StatusCode::SERVICE_UNAVAILABLE,
        "Unavailable",
        "the system random generator failed: no session can be made",
        None,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csrf_tokens_compare_whole_and_never_empty() {
        let t = random_hex().unwrap_or_default();
        assert_eq!(t.len(), 64);
        assert!(csrf_matches(&t, &t));
        assert!(!csrf_matches(&t, &t[..63]));
        assert!(!csrf_matches(&t, ""));
        assert!(!csrf_matches("", ""));
        let mut other = t.clone().into_bytes();
        other[0] = if other[0] == b'a' { b'b' } else { b'a' };
        assert!(!csrf_matches(
            &t,
            &String::from_utf8(other).unwrap_or_default()
        ));
        assert_ne!(random_hex(), random_hex());
    }
}

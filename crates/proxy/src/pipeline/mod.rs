//! The request pipeline: one function that takes a request from the sandbox to the upstream and
//! back, one named phase per line. Every listener feeds it the same way: it builds a [`Ctx`]
//! (who is asking, and the authority a connection-level gate pinned, if any) and calls
//! [`handle`] per request: the plain proxy hop, each request inside an intercepted CONNECT, and
//! the gateway listeners (transparent, DNS-routed, SOCKS5).
//!
//! ```text
//! admit ─▶ identify ─▶ decide ─▶ (predicates) ─▶ (ask) ─▶ limits ─▶ broker ─▶ commit ─▶ send ─▶ respond ─▶ record
//!   │          │          │            │           │         │         │         │        │        │
//!   └──────────┴──────────┴────────────┴───────────┴─────────┴─────────┴─────────┴────────┴────────┴──▶ refuse (drain, answer, record)
//! ```
//!
//! Each phase is a function whose doc comment says what it may assume and what it guarantees;
//! each returns `Result<_, Refusal>`, and `?` carries a refusal to [`refuse`], the one place
//! that drains the request body, answers and records. The phases live in [`admit`], [`decide`],
//! [`predicates`] (only for a decision a `body`/`graphql` predicate still reads), [`ask`] (only for a request that needs a person), [`limits`] (reserve against `[limits]`
//! before anything is sent; settled when the response ends) and [`outgoing`] (broker, send);
//! commit (the decision record on disk before any dial) is [`admit::commit_decision`]; respond
//! (over [`super::response`]) and record are here. This module composes them and decides
//! nothing itself.

mod admit;
mod ask;
mod decide;
mod jsonrpc;
mod limits;
mod outgoing;
mod predicates;
mod record;
mod request;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::header::HeaderValue;
use http::{Request, Response};
use hyper::body::Incoming;

use super::limits::HeadSniff;
use super::respond::{self, ID_HEADER};
use super::websocket::{self, Handshake};
use super::{body, response, Proxy, IDENTITY_DEFAULT};
use crate::audit::{Entry, Stage};
use crate::policy::Scheme;
use crate::reason::{Reason, Refusal};
use crate::upstream::{Body, UpstreamAddr};
use request::{Arrived, Req};

pub(crate) use admit::{
    audit_healthy, commit_decision, header_block_fits, host_clean, parsed_framing, raw_framing,
};
pub(crate) use decide::identity;
pub(crate) use limits::{record_admitted, record_refused};
pub use record::{open as open_record, open_connection as open_connection_record};

/// Who is asking and through what: what a listener hands the pipeline with each request.
///
/// The proxy hop makes one per request ([`Ctx::proxy_hop`], then [`Ctx::identified`]); an
/// intercepted CONNECT makes one per connection, pinned to the authority its gate checked
/// ([`Ctx::pinned`]). Nothing in the pipeline knows which listener a request came from beyond
/// what this says.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub client: SocketAddr,
    pub identity: Arc<str>,
    /// The host and port a connection-level gate already checked (the CONNECT authority).
    /// Every request on such a connection must be for exactly this authority.
    pub pinned: Option<(String, u16)>,
    /// The scheme of the requests on a pinned connection: `https` inside an interception,
    /// `http` on a plain connection whose authority a gate checked (SOCKS5, transparent HTTP).
    /// It is how latchkey sends them upstream (TLS or cleartext), never read from the port:
    /// policy refuses a credential on `http` (`credential_needs_tls`).
    pub pinned_scheme: Scheme,
    /// Raw request heads on this HTTP/1 connection, to catch framing hyper normalises away.
    pub heads: Option<Arc<HeadSniff>>,
    /// On a connection the firewall redirected to `--transparent`: the address the client sent
    /// it to, for each request's record (`original_dst`).
    pub original_dst: Option<SocketAddr>,
    /// The runtime session the client presented (then `identity` is its profile).
    pub session: Option<Arc<crate::governance::sessions::Live>>,
    /// The connection's switch: attached to the session, so revoking it ends the connection.
    pub cut: Option<Arc<crate::wire::cut::Cut>>,
}

impl Ctx {
    /// A request on the proxy hop: the target is in the request itself (absolute-form), and
    /// the identity is `default` until the hop's identify step names one.
    pub fn proxy_hop(client: SocketAddr, heads: Option<Arc<HeadSniff>>) -> Self {
        Self {
            client,
            identity: Arc::from(IDENTITY_DEFAULT),
            pinned: None,
            pinned_scheme: Scheme::Https,
            heads,
            original_dst: None,
            session: None,
            cut: None,
        }
    }

    /// Requests on a connection whose destination a gate checked before any byte of them was
    /// read: inside an intercepted CONNECT, under the CONNECT's identity.
    pub fn pinned(client: SocketAddr, identity: Arc<str>, host: String, port: u16) -> Self {
        Self {
            client,
            identity,
            pinned: Some((host, port)),
            pinned_scheme: Scheme::Https,
            heads: None,
            original_dst: None,
            session: None,
            cut: None,
        }
    }

    /// Plain-HTTP requests on a connection whose destination a gate checked (a SOCKS5 CONNECT
    /// or a transparent connection that carries HTTP, not TLS).
    pub fn pinned_plain(client: SocketAddr, identity: Arc<str>, host: String, port: u16) -> Self {
        Self {
            pinned_scheme: Scheme::Http,
            ..Self::pinned(client, identity, host, port)
        }
    }

    /// This context with the identity the listener found for the sandbox.
    #[must_use]
    pub fn identified(&self, identity: &str) -> Self {
        Self {
            identity: Arc::from(identity),
            ..self.clone()
        }
    }

    /// This context under runtime session `live` (its identity is the session's profile).
    #[must_use]
    pub fn in_session(&self, live: Arc<crate::governance::sessions::Live>) -> Self {
        Self {
            identity: Arc::from(live.profile.as_str()),
            session: Some(live),
            ..self.clone()
        }
    }

    /// This context on a connection ended by `cut` when its session ends.
    #[must_use]
    pub fn with_cut(self, cut: Option<Arc<crate::wire::cut::Cut>>) -> Self {
        Self { cut, ..self }
    }

    /// This context with a raw-head view of the (HTTP/1) connection the requests arrive on.
    #[must_use]
    pub fn with_heads(self, heads: Option<Arc<HeadSniff>>) -> Self {
        Self { heads, ..self }
    }

    /// This context on a redirected connection whose original destination was `original_dst`.
    #[must_use]
    pub fn with_original_dst(self, original_dst: Option<SocketAddr>) -> Self {
        Self {
            original_dst,
            ..self
        }
    }
}

/// Handles one request end to end. Never fails: every outcome is a response and a record.
pub async fn handle(
    proxy: Arc<Proxy>,
    ctx: Arc<Ctx>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    // The policy in force when the request arrived holds for all of it, whatever a reload does.
    let policy = proxy.policy();
    let mut entry = record::open(&proxy, ctx.client, &ctx.identity, &policy).await;
    let (head, body) = req.into_parts();
    entry.update(|r| admit::prefill(r, &ctx, &head));
    let correlation = admit::correlate(&proxy, &ctx, &head, &mut entry);
    // The request body, until a phase takes it: a refusal before then drains it.
    let mut body = Some(body);
    // The session, if one carries the request: still live, still within its profile.
    let scoped = match &ctx.session {
        Some(live) => {
            let client = ctx.client.ip();
            match super::session::check(&proxy, &policy, live, client, ctx.cut.as_ref(), &mut entry)
                .await
            {
                Ok(scoped) => Some(scoped),
                Err(refusal) => return Ok(refuse(entry, body, refusal).await),
            }
        }
        None => None,
    };
    let arrived = Arrived {
        proxy: &proxy,
        ctx: &ctx,
        policy: &policy,
        entry: &mut entry,
        body: &mut body,
        head,
        correlation,
        scoped,
    };
    match phases(arrived).await {
        Ok(answer) => Ok(record(&proxy, answer, entry)),
        Err(refusal) => Ok(refuse(entry, body, refusal).await),
    }
}

/// What the respond phase hands the record phase.
struct Answer {
    response: Response<Body>,
    body_refused: Arc<std::sync::OnceLock<super::request_body::BodyRefused>>,
    /// Fills in what is known only when the body has ended (limits settled, usage).
    on_finish: Option<body::FinishHook>,
    /// An accepted WebSocket: relayed once the `101` is sent, its record written at close.
    upgrade: Option<(websocket::Halves, websocket::Guard)>,
}

/// The phases in order, one per line; `?` is a refusal. Each feature is one line: a phase
/// (mcp, ask, limits, the upload limiter, websocket) or a filter on the answer (the
/// `tools/list` filter, capture, limit settling).
async fn phases(mut at: Arrived<'_>) -> Result<Answer, Refusal> {
    let target = admit::admit(&mut at)?;
    let mut req = decide::decide(at, target)?;
    handshake(&mut req)?;
    predicates::check(&mut req).await?;
    if let Some(answer) = jsonrpc::check(&mut req).await? {
        return Ok(answer);
    }
    ask::ask(&mut req).await?;
    limits::charge(&mut req).await?;
    let out = outgoing::broker(&mut req).await?;
    let out = limits::meter_upload(&req, out);
    commit(&mut req).await?;
    let sent = outgoing::send(&mut req, out).await;
    let (res, plan) = sent.map_err(|r| limits::unsent(&mut req, r))?;
    let answer = respond(&mut req, res, plan).await?;
    let answer = jsonrpc::filter_list(&mut req, answer);
    let answer = capture(&mut req, answer).await?;
    Ok(limits::settle(&mut req, answer))
}

/// The websocket phase: a request asking to upgrade (which policy allowed only under a rule
/// with `websocket = true`) must be a valid handshake on a connection that upgrades; its half
/// of the upgrade is taken for the relay.
fn handshake(req: &mut Req<'_>) -> Result<(), Refusal> {
    if websocket::requested(&req.head.headers) {
        req.handshake = Some(Handshake::take(&mut req.head)?);
    }
    Ok(())
}

/// The commit phase: the decision, allowed, is on disk before the upstream is dialed.
async fn commit(req: &mut Req<'_>) -> Result<(), Refusal> {
    req.entry.reached(Stage::Committed);
    admit::commit_decision(req.entry).await
}

/// The respond phase: records what came back, then turns it into what the sandbox may see
/// (`response::filter`).
///
/// Assumes: `res` is the upstream's answer to the request the broker built under the verdict.
/// Guarantees: on `Ok`, the record holds the outcome, the status and the upstream address, and
/// the response is safe to send ([`response::filter`]'s guarantees).
async fn respond(
    req: &mut Req<'_>,
    mut res: Response<Incoming>,
    plan: outgoing::Plan,
) -> Result<Answer, Refusal> {
    let upstream = res.extensions().get::<UpstreamAddr>().map(|a| a.0);
    req.entry.answered(res.status().as_u16(), upstream);
    let rule = req.rule();
    // A WebSocket the upstream accepted: the sandbox gets a `101` built from the checked one.
    // Any other answer to a handshake is an ordinary response.
    if res.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        if let Some(handshake) = req.handshake.take() {
            let guard = websocket_guard(req, &plan);
            let accepted = handshake
                .accept(&mut res, &req.target.host)
                .map_err(|r| r.under(&rule.name))?;
            return Ok(Answer {
                response: accepted.response,
                body_refused: plan.body_refused,
                on_finish: None,
                upgrade: Some((accepted.halves, guard)),
            });
        }
    }
    let response_cx = response::ResponseCx {
        host: &req.target.host,
        is_head: plan.is_head,
        scan: plan.scan,
        max_decoded: req.proxy.max_decoded_body,
        counters: req.entry.counters(),
    };
    let response = response::filter(res, response_cx)
        .await
        .map_err(|r| r.under(&rule.name))?;
    Ok(Answer {
        response,
        body_refused: plan.body_refused,
        on_finish: None,
        upgrade: None,
    })
}

/// What a WebSocket's relay checks its messages against: the rule's binding and the
/// response's scan, owned by the relay task.
fn websocket_guard(req: &Req<'_>, plan: &outgoing::Plan) -> websocket::Guard {
    let (proxy, rule) = (req.proxy, req.rule());
    websocket::Guard {
        policy: req.policy.clone(),
        rule: rule.name.clone(),
        bound: rule.bound.clone(),
        placeholders: rule.placeholders.clone(),
        host: req.target.host.clone(),
        scan: plan.scan.clone(),
        max_message: proxy.limits.max_websocket_message,
        budget: proxy.budget.clone(),
        client: req.ctx.client.ip(),
        upload: req.admission.as_ref().and_then(|a| a.upload()),
        mcp: rule.mcp.as_ref().map(|rules| super::mcp_socket::Rules {
            rules: rules.clone(),
            rule: rule.name.clone(),
            report: proxy.report_all || rule.report,
        }),
        cut: req.ctx.cut.clone(),
    }
}

/// The capture filter: under a rule with `capture`, a token endpoint's tokens stay here and the
/// sandbox gets their placeholders (`proxy::capture::capture`); the record names what was kept.
async fn capture(req: &mut Req<'_>, mut answer: Answer) -> Result<Answer, Refusal> {
    let rule = req.rule();
    let Some(capture) = &rule.capture else {
        return Ok(answer);
    };
    let cx = super::capture::CaptureCx {
        capture: capture.clone(),
        identity: req.ctx.identity.to_string(),
        host: req.target.host.clone(),
        tokens: req.policy.captured().clone(),
        policy: req.policy.clone(),
        timeout: req.proxy.response_timeout,
    };
    let (response, kept) = super::capture::capture(answer.response, cx)
        .await
        .map_err(|r| r.under(&rule.name))?;
    answer.response = response;
    req.entry.set_captured(kept);
    Ok(answer)
}

/// The record phase: the response carries the record's id, and its body writes the record
/// when it ends, fails or is dropped (`body::audited`), exactly once; a WebSocket's relay
/// writes it when the socket closes.
fn record(proxy: &Proxy, answer: Answer, entry: Entry) -> Response<Body> {
    let mut res = answer.response;
    if let Ok(v) = HeaderValue::from_str(entry.id()) {
        res.headers_mut().insert(ID_HEADER, v);
    }
    respond::rate_headers(res.headers_mut(), &entry);
    let finish = answer.on_finish;
    if let Some((halves, guard)) = answer.upgrade {
        websocket::spawn(halves, guard, entry, finish, proxy.shutdown_signal());
        return res;
    }
    res.map(|b| body::audited(b, entry, Some(answer.body_refused), finish))
}

/// The one end of every refused request: reads what is left of the request body, then answers
/// and records ([`respond::refused`]).
///
/// A body whose framing is in doubt (`ambiguous_framing`) is not read: where it ends is
/// exactly what two parsers disagree on.
async fn refuse(entry: Entry, body: Option<Incoming>, refusal: Refusal) -> Response<Body> {
    if let Some(body) = body.filter(|_| refusal.reason != Reason::AmbiguousFraming) {
        drain(body).await;
    }
    respond::refused(entry, &refusal)
}

/// Reads and discards a refused request's body (bounded in size and time) before answering:
/// answering first makes h2 reset the stream, and some clients then report a framing error
/// instead of the refusal.
async fn drain(mut body: Incoming) {
    use http_body::Body as _;
    use http_body_util::BodyExt;
    const LIMIT: usize = 1024 * 1024;
    if body.is_end_stream() {
        return;
    }
    let read = async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > LIMIT {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), read).await;
}

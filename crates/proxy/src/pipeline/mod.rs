//! The request pipeline: one function that takes a request from the sandbox to the upstream and
//! back, one named phase per line. Every listener feeds it the same way: it builds a [`Ctx`]
//! (who is asking, and the authority a connection-level gate pinned, if any) and calls
//! [`handle`] per request: the plain proxy hop, each request inside an intercepted CONNECT, and
//! the gateway listeners (transparent, DNS-routed, SOCKS5).
//!
//! ```text
//! admit ─▶ identify ─▶ decide ─▶ (ask) ─▶ limits ─▶ broker ─▶ commit ─▶ send ─▶ respond ─▶ record
//!   │          │          │        │         │         │         │        │        │
//!   └──────────┴──────────┴────────┴─────────┴─────────┴─────────┴────────┴────────┴──▶ refuse (drain, answer, record)
//! ```
//!
//! Each phase is a function whose doc comment says what it may assume and what it guarantees;
//! each returns `Result<_, Refusal>`, and `?` carries a refusal to [`refuse`], the one place
//! that drains the request body, answers and records. The phases live in [`admit`], [`decide`],
//! [`ask`] (only for a request that needs a person), [`limits`] (reserve against `[limits]`
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

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::header::HeaderValue;
use http::request::Parts;
use http::{Request, Response};
use hyper::body::Incoming;

use super::correlate::Correlation;
use super::limits::HeadSniff;
use super::request_body::Inbound;
use super::respond::{self, ID_HEADER};
use super::websocket::{self, Handshake};
use super::{body, response, Generation, Proxy, IDENTITY_DEFAULT};
use crate::audit::Entry;
use crate::policy::{Scheme, Target};
use crate::reason::{Reason, Refusal};
use crate::upstream::{Body, UpstreamAddr};

pub(crate) use admit::{
    audit_healthy, commit_decision, header_block_fits, host_clean, parsed_framing, raw_framing,
};
pub(crate) use decide::identity;
pub(crate) use limits::{record_admitted, record_refused};

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
    // Back-pressure from a slow audit sink: wait for queue room without holding a thread.
    proxy.audit.room().await;
    let mut entry = proxy.open_record(ctx.client, &ctx.identity, &policy);
    let (head, body) = req.into_parts();
    entry.update(|r| admit::prefill(r, &ctx, &head));
    let correlation = admit::correlate(&proxy, &ctx, &head, &mut entry);
    // The request body, until the broker phase takes it: a refusal before then drains it.
    let mut body = Some(body);
    let run = phases(
        &proxy,
        &ctx,
        &policy,
        &mut entry,
        (head, &correlation),
        &mut body,
    );
    match run.await {
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

/// The phases in order, one per line; `?` is a refusal.
async fn phases(
    proxy: &Arc<Proxy>,
    ctx: &Ctx,
    policy: &Arc<Generation>,
    entry: &mut Entry,
    (head, correlation): (Parts, &Correlation),
    body: &mut Option<Incoming>,
) -> Result<Answer, Refusal> {
    // admit: nothing goes through unrecorded; one framing, within the limits; no secret in the
    // host as sent; then the target in normal form (its host checked again, as normalised).
    admit::audit_healthy(proxy)?;
    admit::framing(&head, ctx)?;
    admit::within_limits(&head, proxy.limits.max_uri_len)?;
    admit::hosts_as_sent(policy, &head, entry)?;
    let target = admit::target(ctx, &head)?;
    entry.update(|r| admit::record_target(r, &target));
    admit::host_clean(policy, &target.host, entry)?;

    // identify: the identity the listener found must still exist in the policy in force.
    let identity = decide::identity(policy, &ctx.identity)?;
    let upgrading = websocket::requested(&head.headers);

    // decide: deny by default; report-only lets a policy denial through, marked; a rule's
    // `ask` (or `[ask] unknown` for a policy denial) needs a person first.
    let decision = policy.decide(&Target {
        identity,
        scheme: target.scheme,
        host: &target.host,
        port: target.port,
        method: &head.method,
        path: target.path(),
        websocket: upgrading,
    });
    let asking = policy.asks(&decision);
    let denial = (!decision.allowed()).then_some(decision.reason);
    let mut verdict = decide::verdict(decision, proxy.report_all, &proxy.report_rule)
        .or_else(|refusal| decide::ask_unknown(refusal, asking, &proxy.unknown_rule))?;
    // ask: only what a rule with `ask` allows, or what no rule allows under `[ask] unknown`
    // (report-only lets that through unasked).
    let asking = asking.filter(|a| a.rule.is_some() || verdict.would_deny.is_none());
    if let Some(w) = &verdict.would_deny {
        tracing::warn!(audit.id = %entry.id(), reason = w.reason.code(), message = %entry.scrub_text(&w.message), "report-only: would deny");
    }
    let rule = verdict.rule;
    decide::rule_path(&target, rule)?;
    entry.update(|r| {
        r.rule = Some(verdict.record_rule().to_string());
        r.would_deny = verdict.would_deny.is_some();
    });
    let mut head = head;
    // A WebSocket the policy allows: the handshake must be one, on a connection that upgrades.
    let handshake = upgrading.then(|| Handshake::take(&mut head)).transpose()?;
    // mcp: under a rule with `mcp`, a POST's JSON-RPC messages are read whole and matched
    // before anything is sent (and before anyone is asked); a refused one is answered in
    // JSON-RPC. Report-only lets it through, marked.
    let (held, tools_list) = match jsonrpc::check(
        proxy,
        ctx,
        rule,
        &head,
        body,
        &target.host,
        entry,
        &mut verdict,
    )
    .await?
    {
        jsonrpc::Step::Go(held, list) => (held, list),
        jsonrpc::Step::Answered(answer) => return Ok(answer),
    };
    if tools_list.is_some() {
        // The results are filtered as they pass: they must arrive readable.
        head.headers.insert(
            http::header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    let incoming = match asking {
        Some(asking) => {
            ask::ask(
                proxy,
                ctx,
                policy,
                asking,
                denial,
                &target,
                &head,
                (body, held),
                entry,
            )
            .await?
        }
        None => match held {
            Some(held) => held,
            None => Inbound::Streaming(body.take().ok_or_else(|| {
                Refusal::new(Reason::BadRequest, "the request body was already read")
            })?),
        },
    };

    // limits: reserve against every limit the rule, identity and credential name; a
    // refusal here has sent nothing. Dropped before the response, the admission gives back.
    let (incoming, admission) = limits::charge(
        proxy, ctx, policy, rule, identity, &target, &mut head, incoming, entry,
    )
    .await?;

    // broker: strip (correlation headers too), check, placeholders, inject, sign.
    let mut out = outgoing::broker(
        proxy,
        ctx,
        policy,
        (rule, correlation, handshake.as_ref()),
        &target,
        head,
        incoming,
        entry,
    )
    .await?;
    // A WebSocket handshake has no body: its messages are charged by the relay.
    if let Some(upload) = admission
        .as_ref()
        .and_then(|a| a.upload())
        .filter(|_| handshake.is_none())
    {
        let refused = out.plan.body_refused.clone();
        out.request = out
            .request
            .map(|b| limits::limit_upload(b, upload, refused));
    }

    // commit: the decision is on disk before the upstream is dialed; its outcome follows.
    verdict.record_outcome(entry, Reason::Allowed, None);
    admit::commit_decision(entry).await?;

    // send: provisionally an upstream error, so a request cut short (shutdown, the client
    // leaving) is recorded as allowed by policy and not completed.
    verdict.record_outcome(entry, Reason::UpstreamError, None);
    let plan = out.plan;
    let sent = outgoing::send(
        proxy,
        rule,
        &target,
        (out.request, handshake.is_some()),
        &plan.body_refused,
        entry,
    )
    .await;
    let res = match sent {
        Ok(res) => res,
        Err(refusal) => {
            // No response: the reservations go back, but bytes that left stay charged (and an
            // upload its budget cut off says so).
            if let Some(admission) = admission {
                limits::settle_failed(admission, entry);
            }
            return Err(refusal);
        }
    };

    // respond: decode decision, strip, scrub; a model-provider call's usage is read as its
    // body passes, and the limits are settled when it ends.
    let upgrade = handshake.map(|h| {
        (
            h,
            websocket_guard(proxy, ctx, (policy, rule), &target.host, &plan, &admission),
        )
    });
    let mut answer = respond(proxy, &verdict, &target.host, res, plan, upgrade, entry).await?;
    if let Some((rules, ids)) = tools_list {
        answer.response = super::mcp_list::filter_list(answer.response, rules, ids);
    }
    // capture: a token endpoint's tokens stay here; the sandbox gets their placeholders.
    if let Some(capture) = &rule.capture {
        let cx = super::capture::CaptureCx {
            capture: capture.clone(),
            identity: ctx.identity.to_string(),
            host: target.host.clone(),
            tokens: policy.captured().clone(),
            policy: policy.clone(),
            timeout: proxy.response_timeout,
        };
        let (response, kept) = super::capture::capture(answer.response, cx)
            .await
            .map_err(|r| r.under(&rule.name))?;
        answer.response = response;
        entry.update(|r| r.captured = kept);
    }
    if let Some(admission) = admission {
        answer = limits::settle_when_done(answer, admission, policy.prices().clone());
    }
    Ok(answer)
}

/// The respond phase: records what came back, then turns it into what the sandbox may see
/// (`response::filter`).
///
/// Assumes: `res` is the upstream's answer to the request the broker built under `verdict`.
/// Guarantees: on `Ok`, the record holds the outcome, the status and the upstream address, and
/// the response is safe to send ([`response::filter`]'s guarantees).
#[allow(clippy::too_many_arguments)]
async fn respond(
    proxy: &Proxy,
    verdict: &decide::Verdict<'_>,
    host: &str,
    mut res: Response<Incoming>,
    plan: outgoing::Plan,
    upgrade: Option<(Handshake, websocket::Guard)>,
    entry: &mut Entry,
) -> Result<Answer, Refusal> {
    let upstream = res.extensions().get::<UpstreamAddr>().map(|a| a.0);
    verdict.record_outcome(entry, Reason::Allowed, Some(res.status().as_u16()));
    entry.update(|r| r.upstream = upstream.map(|a| a.to_string()));
    // A WebSocket the upstream accepted: the sandbox gets a `101` built from the checked one.
    // Any other answer to a handshake is an ordinary response.
    if let Some((handshake, guard)) = upgrade {
        if res.status() == http::StatusCode::SWITCHING_PROTOCOLS {
            let accepted = handshake
                .accept(&mut res, host)
                .map_err(|r| r.under(&verdict.rule.name))?;
            return Ok(Answer {
                response: accepted.response,
                body_refused: plan.body_refused,
                on_finish: None,
                upgrade: Some((accepted.halves, guard)),
            });
        }
    }
    let response_cx = response::ResponseCx {
        host,
        is_head: plan.is_head,
        scan: plan.scan,
        max_decoded: proxy.max_decoded_body,
        counters: entry.counters(),
    };
    let response = response::filter(res, response_cx)
        .await
        .map_err(|r| r.under(&verdict.rule.name))?;
    Ok(Answer {
        response,
        body_refused: plan.body_refused,
        on_finish: None,
        upgrade: None,
    })
}

/// What a WebSocket's relay checks its messages against: the rule's binding and the
/// response's scan, owned by the relay task.
fn websocket_guard(
    proxy: &Proxy,
    ctx: &Ctx,
    (policy, rule): (&Arc<Generation>, &crate::policy::Rule),
    host: &str,
    plan: &outgoing::Plan,
    admission: &Option<crate::governance::limits::Admission>,
) -> websocket::Guard {
    websocket::Guard {
        policy: policy.clone(),
        rule: rule.name.clone(),
        bound: rule.bound.clone(),
        placeholders: rule.placeholders.clone(),
        host: host.to_string(),
        scan: plan.scan.clone(),
        max_message: proxy.limits.max_websocket_message,
        budget: proxy.budget.clone(),
        client: ctx.client.ip(),
        upload: admission.as_ref().and_then(|a| a.upload()),
        mcp: rule.mcp.as_ref().map(|rules| super::mcp_socket::Rules {
            rules: rules.clone(),
            rule: rule.name.clone(),
            report: proxy.report_all || rule.report,
        }),
    }
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

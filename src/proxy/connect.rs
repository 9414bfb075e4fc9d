//! CONNECT: the gate before any TLS, then interception (or a policy-allowed raw tunnel).
//!
//! Fail-closed rules kept here:
//! - the host and port are decided before answering `200`; a refusal makes no upstream connection;
//! - interception reads the *whole* ClientHello (`LazyConfigAcceptor`), so a hello split across
//!   TCP segments is still intercepted, and anything that is not TLS is dropped and audited;
//! - an SNI that differs from the CONNECT host is refused before a certificate is presented;
//! - raw bytes are relayed only for a `tunnel = true` rule, over the same guarded dialer.
//!
//! The gate admits with the pipeline's own checks (`pipeline::host_clean` and friends), and an
//! intercepted connection hands each inner request to `pipeline::handle` under a pinned
//! [`Ctx`]: one admission, one pipeline, whichever listener. It dials only through `upstream`.

use std::io;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio_rustls::{LazyConfigAcceptor, StartHandshake};

use super::intercepted::ClientIo;
use super::pipeline::{self, Ctx};
use super::{body, respond, Generation, Proxy};
use crate::audit::Entry;
use crate::policy::{normalize_host, ConnectDecision, Policy};
use crate::reason::{Reason, Refusal};
use crate::upstream::{Body, Dialed};

/// What a connection-level gate lets a connection become.
pub(crate) enum Opened {
    /// A `tunnel = true` rule: the upstream is already dialed.
    Tunnel(Dialed),
    /// Interception: each inner request goes through the pipeline under this context.
    Intercept(Ctx),
}

/// Handles `CONNECT host:port` on the proxy hop: the gate, then `200` and the tunnel or the
/// interception; a refusal is answered and recorded in one place ([`respond::refused`]).
pub async fn handle(proxy: Arc<Proxy>, ctx: Arc<Ctx>, req: Request<Incoming>) -> Response<Body> {
    let policy = proxy.policy();
    // Back-pressure from a slow audit sink: wait for queue room without holding a thread.
    proxy.audit.room().await;
    let mut entry = proxy.open_record(ctx.client, &ctx.identity, &policy);
    entry.update(|r| {
        r.method = Some("CONNECT".to_string());
        r.scheme = Some("https".to_string());
    });
    // The CONNECT's own correlation headers (`curl --proxy-header`); only a tunnel, whose
    // record is the connection's, counts as an attempt at its step.
    let mut correlation = proxy
        .correlator
        .read(req.headers(), |t| entry.scrub_text(t));
    entry.update(|r| correlation.record(r));
    match gate(&proxy, &ctx, &policy, &mut entry, &req).await {
        Ok(opened) => {
            if matches!(opened, Opened::Tunnel(_)) {
                proxy.correlator.count(&ctx.identity, &mut correlation);
                entry.update(|r| correlation.record(r));
            }
            tokio::spawn(async move {
                match hyper::upgrade::on(req).await {
                    Ok(upgraded) => {
                        serve_opened(proxy, opened, TokioIo::new(upgraded), entry).await
                    }
                    Err(e) => {
                        if matches!(opened, Opened::Intercept(_)) {
                            entry.outcome(Reason::TlsHandshakeFailed, None, None);
                        }
                        tracing::debug!(error = %e, "CONNECT upgrade failed");
                    }
                }
            });
            Response::new(body::empty())
        }
        Err(refusal) => respond::refused(entry, &refusal),
    }
}

/// The gate: admits the authority, then decides, before any TLS and before any upstream
/// connection (a tunnel's dial aside, which the decision allowed).
///
/// Assumes: `ctx` is the proxy hop's, identified. Guarantees: on `Ok`, the authority is
/// `host:port` with a port, no userinfo, no secret value or placeholder in the host as sent,
/// the host normalised, the framing unambiguous, the audit log healthy, the identity defined,
/// and policy lets some request to it through (or report-only mode would let it be decided per
/// request). The record names the host and port as admitted.
async fn gate(
    proxy: &Proxy,
    ctx: &Ctx,
    policy: &Generation,
    entry: &mut Entry,
    req: &Request<Incoming>,
) -> Result<Opened, Refusal> {
    // admit: authority-form `host:port`, port required, host normalised.
    pipeline::header_block_fits(req.headers())?;
    pipeline::parsed_framing(req.headers())?;
    let Some(authority) = req.uri().authority() else {
        return Err(Refusal::new(Reason::BadRequest, "CONNECT needs host:port"));
    };
    entry.update(|r| r.host = Some(authority.host().to_string()));
    if authority.as_str().contains('@') {
        return Err(Refusal::new(
            Reason::UserinfoInUrl,
            "CONNECT authority carries userinfo ('@')",
        ));
    }
    let Some(port) = authority.port_u16().filter(|p| *p != 0) else {
        return Err(Refusal::new(
            Reason::MissingPort,
            format!("CONNECT {authority} has no port: write host:port"),
        ));
    };
    let host = admit_authority(policy, entry, authority.host(), port)?;
    // The raw head as sent: hyper drops a Content-Length next to Transfer-Encoding.
    pipeline::raw_framing(ctx, req.method(), req.uri(), req.version())?;
    decide_authority(proxy, ctx, policy, entry, host, port).await
}

/// Admits `host_as_sent:port` for a connection-level gate (CONNECT, and listeners that learn
/// the authority another way: SNI, a Host header, SOCKS5): no secret value or placeholder in
/// the host as sent, the host normalised. Returns the normalised host; the record names it.
pub(crate) fn admit_authority(
    policy: &Generation,
    entry: &mut Entry,
    host_as_sent: &str,
    port: u16,
) -> Result<String, Refusal> {
    entry.update(|r| r.host = Some(host_as_sent.to_string()));
    if host_as_sent.contains('@') {
        entry.update(|r| r.port = Some(port));
        return Err(Refusal::new(
            Reason::UserinfoInUrl,
            "authority carries userinfo ('@')",
        ));
    }
    // The host as sent, before it is normalised, resolved or put in a certificate: a secret
    // value or a placeholder in it (a subdomain under a `*.` rule) would leak to DNS.
    if let Err(refusal) = pipeline::host_clean(policy, host_as_sent, entry) {
        entry.update(|r| r.port = Some(port));
        return Err(refusal);
    }
    let host = normalize_host(host_as_sent)
        .map_err(|e| Refusal::new(Reason::BadRequest, e.to_string()))?;
    entry.update(|r| {
        r.host = Some(host.clone());
        r.port = Some(port);
    });
    Ok(host)
}

/// Decides an admitted authority before any TLS and before any upstream connection (a
/// tunnel's dial aside, which the decision allowed).
///
/// Assumes: `host` came from [`admit_authority`], `ctx` is identified. Guarantees: on `Ok`, the
/// audit log is healthy, the identity defined, and policy lets some request to `host:port`
/// through (or report-only mode would let each be decided per request); a tunnel is dialed.
pub(crate) async fn decide_authority(
    proxy: &Proxy,
    ctx: &Ctx,
    policy: &Policy,
    entry: &mut Entry,
    host: String,
    port: u16,
) -> Result<Opened, Refusal> {
    pipeline::audit_healthy(proxy)?;
    let identity = pipeline::identity(policy, &ctx.identity)?;
    match policy.decide_connect(&host, port, identity) {
        ConnectDecision::Deny(d)
            if !(d.reason.is_policy_denial()
                && (proxy.report_all || d.rule.is_some_and(|r| r.report))) =>
        {
            Err(Refusal {
                reason: d.reason,
                rule: d.rule_name().map(str::to_string),
                message: d.message,
            })
        }
        ConnectDecision::Tunnel(rule) => {
            entry.update(|r| r.rule = Some(rule.name.clone()));
            // A tunnel's limits count CONNECTs (rate, concurrency): held while it is open.
            tunnel_limits(proxy, ctx, policy, identity, rule, &host, entry)
                .await
                .map_err(|r| r.under(&rule.name))?;
            // The decision is on disk before the dial; the tunnel's outcome record follows.
            entry.outcome(Reason::Tunnel, Some(&rule.name), None);
            pipeline::commit_decision(entry)
                .await
                .map_err(|r| r.under(&rule.name))?;
            // Dial first, so an unreachable upstream is a 502 the client can see.
            let dialed = proxy
                .dialer
                .dial(&host, port, &rule.allow_private)
                .await
                .map_err(|e| Refusal::new(e.reason(), e.to_string()).under(&rule.name))?;
            entry.outcome(Reason::Tunnel, Some(&rule.name), Some(200));
            entry.update(|r| r.upstream = Some(dialed.addr.to_string()));
            Ok(Opened::Tunnel(dialed))
        }
        // Report-only: intercept anyway, so each inner request is decided and marked.
        ConnectDecision::Deny(_) | ConnectDecision::Intercept => Ok(Opened::Intercept(
            Ctx::pinned(ctx.client, ctx.identity.clone(), host, port),
        )),
    }
}

/// Charges a tunnel to its rule's and identity's limits: request rates and concurrency, and
/// `bytes_up`, reserved as the tunnel relays bytes upstream ([`tunnel`]); policy refuses token
/// and spend budgets on a tunnel rule, whose requests latchkey cannot read. The admission lives
/// as long as the tunnel's record.
async fn tunnel_limits(
    proxy: &Proxy,
    ctx: &Ctx,
    policy: &Policy,
    identity: Option<&crate::policy::Identity>,
    rule: &crate::policy::Rule,
    host: &str,
    entry: &mut Entry,
) -> Result<(), Refusal> {
    let limits = policy.limits_for(rule, identity);
    if limits.is_empty() {
        return Ok(());
    }
    let Some(limiter) = proxy.limiter() else {
        return Err(Refusal::new(
            Reason::LimitsUnavailable,
            "this tunnel is under [limits], and latchkey has no state store to count them in",
        ));
    };
    let pattern = rule.host_for(host);
    let id = entry.id().to_string();
    let who = crate::governance::limits::Subject {
        identity: &ctx.identity,
        rule: &rule.name,
        credential: rule.credential.as_deref(),
        host: &pattern,
        request_id: &id,
    };
    // The relayed bytes stream: reserved block by block as they go.
    let estimate = crate::governance::limits::Estimate {
        head_up: 0,
        bytes_up: None,
        llm: None,
    };
    match limiter.admit(&limits, who, &estimate).await {
        Ok(admission) => {
            pipeline::record_admitted(entry, &admission);
            entry.hold(Box::new(admission));
            Ok(())
        }
        Err(refused) => Err(pipeline::record_refused(entry, *refused)),
    }
}

/// Serves a connection a gate opened, once the client's stream is in hand: relays a tunnel, or
/// intercepts. `entry` is the gate's record (finished by the tunnel, or dismissed once the
/// interception's handshake succeeds).
pub(crate) async fn serve_opened<T: ClientIo>(
    proxy: Arc<Proxy>,
    opened: Opened,
    io: T,
    entry: Entry,
) {
    match opened {
        Opened::Tunnel(dialed) => tunnel(io, dialed.stream, entry).await,
        Opened::Intercept(ctx) => intercept(proxy, Arc::new(ctx), io, entry).await,
    }
}

/// Relays raw bytes both ways for a `tunnel = true` rule; the record is written when it ends.
/// Under a `bytes_up` limit each read from the client is reserved before it is written
/// upstream; past the budget the tunnel stops relaying (both ways) and the record says
/// `budget_exhausted`.
pub(crate) async fn tunnel<T: ClientIo>(
    mut client: T,
    mut upstream: tokio::net::TcpStream,
    mut entry: Entry,
) {
    let counters = entry.counters();
    let admission = entry
        .take_held()
        .and_then(|h| h.downcast::<crate::governance::limits::Admission>().ok());
    let upload = admission.as_ref().and_then(|a| a.upload());
    let (up, down, cut) = match upload {
        Some(upload) => metered_tunnel(client, upstream, &upload).await,
        None => match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((up, down)) => (up, down, None),
            Err(e) => {
                tracing::debug!(error = %e, "tunnel closed with error");
                (0, 0, None)
            }
        },
    };
    counters
        .up
        .fetch_add(up, std::sync::atomic::Ordering::Relaxed);
    counters
        .down
        .fetch_add(down, std::sync::atomic::Ordering::Relaxed);
    if let Some(admission) = admission {
        let prices = crate::policy::PriceTable::empty();
        let (charges, _) = admission.settle(up, None, None, &prices);
        entry.update(|r| r.limits = charges);
    }
    if let Some(refusal) = cut {
        tracing::warn!(audit.id = %entry.id(), reason = refusal.reason.code(), message = %entry.scrub_text(&refusal.message), "tunnel cut off");
        entry.update(|r| {
            r.reason = refusal.reason.code();
            r.decision = "deny";
        });
    }
    entry.finish();
}

/// Relays a tunnel whose upstream bytes are reserved before they go: `(up, down, the refusal
/// that cut it off)`.
async fn metered_tunnel<T: ClientIo>(
    client: T,
    upstream: tokio::net::TcpStream,
    upload: &crate::governance::limits::Upload,
) -> (u64, u64, Option<Refusal>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut from_client, mut to_client) = tokio::io::split(client);
    let (mut from_upstream, mut to_upstream) = upstream.into_split();
    let up = async {
        let mut buf = vec![0u8; 16 * 1024];
        let mut sent = 0u64;
        loop {
            let n = match from_client.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = to_upstream.shutdown().await;
                    return (sent, None);
                }
                Ok(n) => n,
            };
            let len = n as u64;
            if upload.fits(len) {
                upload.sent(len);
            } else if let Err(refusal) = upload.send(len).await {
                return (sent, Some(refusal));
            }
            if to_upstream.write_all(&buf[..n]).await.is_err() {
                return (sent, None);
            }
            sent += len;
        }
    };
    let down = async {
        let n = tokio::io::copy(&mut from_upstream, &mut to_client)
            .await
            .unwrap_or(0);
        let _ = to_client.shutdown().await;
        n
    };
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (None, None);
    loop {
        tokio::select! {
            r = &mut up, if up_done.is_none() => {
                let cut = r.1.is_some();
                up_done = Some(r);
                // Cut off: nothing more is relayed either way.
                if cut {
                    break;
                }
            }
            n = &mut down, if down_done.is_none() => down_done = Some(n),
        }
        if up_done.is_some() && down_done.is_some() {
            break;
        }
    }
    let (up, cut) = up_done.unwrap_or((0, None));
    (up, down_done.unwrap_or(0), cut)
}

/// Why a client's TLS could not be intercepted: the reason code and a detail for the log.
pub(crate) type NotIntercepted = (Reason, String);

/// Reads the client's whole ClientHello, however it was segmented; anything else is not TLS.
pub(crate) async fn accept_hello<T: ClientIo>(
    proxy: &Proxy,
    io: T,
) -> Result<StartHandshake<T>, NotIntercepted> {
    let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io);
    match tokio::time::timeout(proxy.handshake_timeout, acceptor).await {
        Ok(Ok(start)) => Ok(start),
        Ok(Err(e)) => {
            let reason = if e.kind() == io::ErrorKind::UnexpectedEof {
                Reason::TlsHandshakeFailed
            } else {
                Reason::NotTls
            };
            Err((reason, e.to_string()))
        }
        Err(_) => Err((Reason::TlsHandshakeFailed, "no ClientHello in time".into())),
    }
}

/// Records a connection whose TLS was not intercepted (and counts the failed handshake).
pub(crate) fn not_intercepted(proxy: &Proxy, mut entry: Entry, host: &str, why: NotIntercepted) {
    let (reason, detail) = why;
    proxy
        .metrics()
        .tls_handshakes_failed
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    entry.outcome(reason, None, None);
    tracing::info!(audit.id = %entry.id(), url.host = %host, reason = reason.code(), detail, "intercepted connection refused");
    entry.finish();
}

/// Terminates the sandbox's TLS with a leaf for the CONNECT host and serves h1/h2 inside.
async fn intercept<T: ClientIo>(proxy: Arc<Proxy>, ctx: Arc<Ctx>, io: T, entry: Entry) {
    let Some((host, _)) = ctx.pinned.clone() else {
        return;
    };
    let start = match accept_hello(&proxy, io).await {
        Ok(start) => start,
        Err(why) => return not_intercepted(&proxy, entry, &host, why),
    };
    // SNI, when sent, must name the host the gate checked.
    if let Some(sni) = start.client_hello().server_name() {
        let same = normalize_host(sni).is_ok_and(|s| s == host);
        if !same {
            let why = (Reason::SniMismatch, format!("SNI {sni:?}"));
            return not_intercepted(&proxy, entry, &host, why);
        }
    }
    complete(proxy, ctx, start, entry).await;
}

/// Finishes the handshake with a leaf for the pinned host (whose SNI, if any, the caller
/// checked), then serves the inner requests on their own task.
pub(crate) async fn complete<T: ClientIo>(
    proxy: Arc<Proxy>,
    ctx: Arc<Ctx>,
    start: StartHandshake<T>,
    entry: Entry,
) {
    let Some((host, _)) = ctx.pinned.clone() else {
        return;
    };
    let metrics = proxy.metrics().clone();
    let config = match proxy.ca.server_config_counted(&host) {
        Ok((c, hit)) => {
            let counter = if hit {
                &metrics.cert_cache_hits
            } else {
                &metrics.cert_cache_misses
            };
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            c
        }
        Err(e) => {
            return not_intercepted(
                &proxy,
                entry,
                &host,
                (Reason::TlsHandshakeFailed, e.to_string()),
            )
        }
    };
    let tls = match tokio::time::timeout(proxy.handshake_timeout, start.into_stream(config)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            return not_intercepted(
                &proxy,
                entry,
                &host,
                (Reason::TlsHandshakeFailed, e.to_string()),
            )
        }
        Err(_) => {
            let why = (
                Reason::TlsHandshakeFailed,
                "handshake timed out".to_string(),
            );
            return not_intercepted(&proxy, entry, &host, why);
        }
    };
    // Interception succeeded: from here each inner request leaves its own record.
    metrics
        .tls_handshakes_ok
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    entry.dismiss();

    // Served by its own task, so nothing of the handshake stays with a connection that idles.
    tokio::spawn(super::intercepted::serve(proxy, ctx, tls));
}

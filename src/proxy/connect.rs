//! CONNECT: the gate before any TLS, then interception (or a policy-allowed raw tunnel).
//!
//! Fail-closed rules kept here:
//! - the host and port are decided before answering `200`; a refusal makes no upstream connection;
//! - interception reads the *whole* ClientHello (`LazyConfigAcceptor`), so a hello split across
//!   TCP segments is still intercepted, and anything that is not TLS is dropped and audited;
//! - an SNI that differs from the CONNECT host is refused before a certificate is presented;
//! - raw bytes are relayed only for a `tunnel = true` rule, over the same guarded dialer.

use std::io;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio_rustls::LazyConfigAcceptor;

use super::pipeline::Ctx;
use super::respond::refuse;
use super::{body, Proxy, MAX_HEADER_BYTES};
use crate::audit::Entry;
use crate::policy::{normalize_host, ConnectDecision};
use crate::reason::Reason;
use crate::upstream::Body;

/// Handles `CONNECT host:port` on the proxy hop.
pub async fn handle(proxy: Arc<Proxy>, ctx: Arc<Ctx>, req: Request<Incoming>) -> Response<Body> {
    let policy = proxy.policy();
    // Back-pressure from a slow audit sink: wait for queue room without holding a thread.
    proxy.audit.room().await;
    let mut entry = Entry::start(
        proxy.audit.clone(),
        ctx.client,
        &ctx.identity,
        policy.digest(),
    );
    entry.scrub_with(policy.secrets().clone());
    entry.update(|r| {
        r.method = Some("CONNECT".to_string());
        r.scheme = Some("https".to_string());
    });

    // admit: authority-form `host:port`, port required, host normalised.
    if super::headers_too_large(req.headers()) {
        let msg = format!("request headers exceed {MAX_HEADER_BYTES} bytes");
        return refused(entry, Reason::HeaderTooLarge, None, &msg);
    }
    if let Err(r) = super::limits::check_framing(req.headers()) {
        return refused(entry, r.reason, None, &r.message);
    }
    let Some(authority) = req.uri().authority().cloned() else {
        return refused(entry, Reason::BadRequest, None, "CONNECT needs host:port");
    };
    entry.update(|r| r.host = Some(authority.host().to_string()));
    if authority.as_str().contains('@') {
        return refused(
            entry,
            Reason::UserinfoInUrl,
            None,
            "CONNECT authority carries userinfo ('@')",
        );
    }
    let Some(port) = authority.port_u16().filter(|p| *p != 0) else {
        return refused(
            entry,
            Reason::MissingPort,
            None,
            &format!("CONNECT {authority} has no port: write host:port"),
        );
    };
    // The host as sent, before it is normalised, resolved or put in a certificate: a secret
    // value or a placeholder in it (a subdomain under a `*.` rule) would leak to DNS.
    if let Err((reason, msg)) = super::outbound::check_host(&policy, authority.host()) {
        entry.update(|r| {
            r.host = Some(super::outbound::REDACTED_HOST.to_string());
            r.port = Some(port);
        });
        return refused(entry, reason, None, &msg);
    }
    let host = match normalize_host(authority.host()) {
        Ok(h) => h,
        Err(e) => return refused(entry, Reason::BadRequest, None, &e.to_string()),
    };
    entry.update(|r| {
        r.host = Some(host.clone());
        r.port = Some(port);
    });
    // The raw head as sent: hyper drops a Content-Length next to Transfer-Encoding.
    if let Some(Err(r)) = ctx
        .heads
        .as_ref()
        .map(|h| h.framing_of(req.method(), req.uri()))
    {
        return refused(entry, r.reason, None, &r.message);
    }
    // fail closed: nothing goes through while its record cannot be written.
    if !proxy.audit.is_healthy() {
        return refused(entry, Reason::AuditUnavailable, None, super::AUDIT_DOWN);
    }

    // gate: decided before any TLS and before any upstream connection.
    let identity = if policy.identities().is_empty() {
        None
    } else {
        match policy.identity(&ctx.identity) {
            Some(i) => Some(i),
            None => {
                let msg = format!(
                    "identity '{}' is not defined by the policy in force",
                    ctx.identity
                );
                return refused(entry, Reason::ProxyAuthRequired, None, &msg);
            }
        }
    };
    match policy.decide_connect(&host, port, identity) {
        ConnectDecision::Deny(d)
            if !(d.reason.is_policy_denial()
                && (proxy.report_all || d.rule.is_some_and(|r| r.report))) =>
        {
            refused(entry, d.reason, d.rule_name(), &d.message)
        }
        ConnectDecision::Tunnel(rule) => {
            let rule_name = rule.name.clone();
            entry.update(|r| r.rule = Some(rule_name.clone()));
            // Dial first, so an unreachable upstream is a 502 the client can see.
            let dialed = match proxy.dialer.dial(&host, port, &rule.allow_private).await {
                Ok(d) => d,
                Err(e) => return refused(entry, e.reason(), Some(&rule_name), &e.to_string()),
            };
            entry.outcome(Reason::Tunnel, Some(&rule_name), Some(200));
            entry.update(|r| r.upstream = Some(dialed.addr.to_string()));
            tokio::spawn(async move {
                match hyper::upgrade::on(req).await {
                    Ok(upgraded) => tunnel(upgraded, dialed.stream, entry).await,
                    Err(e) => {
                        tracing::debug!(error = %e, "CONNECT upgrade failed");
                    }
                }
            });
            Response::new(body::empty())
        }
        // Report-only: intercept anyway, so each inner request is decided and marked.
        ConnectDecision::Deny(_) | ConnectDecision::Intercept => {
            let ctx = Arc::new(Ctx {
                client: ctx.client,
                identity: ctx.identity.clone(),
                connect: Some((host, port)),
                heads: None,
            });
            tokio::spawn(async move {
                match hyper::upgrade::on(req).await {
                    Ok(upgraded) => intercept(proxy, ctx, upgraded, entry).await,
                    Err(e) => {
                        entry.outcome(Reason::TlsHandshakeFailed, None, None);
                        tracing::debug!(error = %e, "CONNECT upgrade failed");
                    }
                }
            });
            Response::new(body::empty())
        }
    }
}

fn refused(mut entry: Entry, reason: Reason, rule: Option<&str>, message: &str) -> Response<Body> {
    let message = entry.scrub_text(message);
    let res = refuse(reason, rule, &message, entry.id());
    entry.outcome(reason, rule, Some(res.status().as_u16()));
    entry.finish();
    res
}

/// Relays raw bytes both ways for a `tunnel = true` rule; the record is written when it ends.
async fn tunnel(upgraded: Upgraded, mut upstream: tokio::net::TcpStream, entry: Entry) {
    let mut client = TokioIo::new(upgraded);
    let counters = entry.counters();
    let (up, down) = match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        Ok(n) => n,
        Err(e) => {
            tracing::debug!(error = %e, "tunnel closed with error");
            (0, 0)
        }
    };
    counters
        .up
        .fetch_add(up, std::sync::atomic::Ordering::Relaxed);
    counters
        .down
        .fetch_add(down, std::sync::atomic::Ordering::Relaxed);
    entry.finish();
}

/// Terminates the sandbox's TLS with a leaf for the CONNECT host and serves h1/h2 inside.
async fn intercept(proxy: Arc<Proxy>, ctx: Arc<Ctx>, upgraded: Upgraded, entry: Entry) {
    let Some((host, _)) = ctx.connect.clone() else {
        return;
    };
    let metrics = proxy.metrics().clone();
    let fail = |mut entry: Entry, reason: Reason, detail: &str| {
        metrics
            .tls_handshakes_failed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        entry.outcome(reason, None, None);
        tracing::info!(audit.id = %entry.id(), url.host = %host, reason = reason.code(), detail, "intercepted connection refused");
        entry.finish();
    };

    // The whole ClientHello, however it was segmented; anything else is not TLS.
    let acceptor =
        LazyConfigAcceptor::new(rustls::server::Acceptor::default(), TokioIo::new(upgraded));
    let start = match tokio::time::timeout(proxy.handshake_timeout, acceptor).await {
        Ok(Ok(start)) => start,
        Ok(Err(e)) => {
            let reason = if e.kind() == io::ErrorKind::UnexpectedEof {
                Reason::TlsHandshakeFailed
            } else {
                Reason::NotTls
            };
            return fail(entry, reason, &e.to_string());
        }
        Err(_) => return fail(entry, Reason::TlsHandshakeFailed, "no ClientHello in time"),
    };

    // SNI, when sent, must name the host the gate checked.
    if let Some(sni) = start.client_hello().server_name() {
        let same = normalize_host(sni).is_ok_and(|s| s == host);
        if !same {
            return fail(entry, Reason::SniMismatch, &format!("SNI {sni:?}"));
        }
    }

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
        Err(e) => return fail(entry, Reason::TlsHandshakeFailed, &e.to_string()),
    };
    let tls = match tokio::time::timeout(proxy.handshake_timeout, start.into_stream(config)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => return fail(entry, Reason::TlsHandshakeFailed, &e.to_string()),
        Err(_) => return fail(entry, Reason::TlsHandshakeFailed, "handshake timed out"),
    };
    // Interception succeeded: from here each inner request leaves its own record.
    metrics
        .tls_handshakes_ok
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    entry.dismiss();

    // Served by its own task, so nothing of the handshake stays with a connection that idles.
    tokio::spawn(super::intercepted::serve(proxy, ctx, tls));
}

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
use hyper::service::service_fn;
use hyper::upgrade::Upgraded;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio_rustls::LazyConfigAcceptor;

use super::pipeline::{self, Ctx};
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

    // The inner connection gets its own idle timeout, and a raw-head view when it may be
    // HTTP/1. A client that chose h2 (ALPN) is served h2 only, so no HTTP/1 head can reach the
    // service unsniffed and h2 frames are never fed to the head parser.
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
    let io = if h2 {
        super::limits::Idle::without_sniffer(tls, proxy.limits.idle_timeout)
    } else {
        super::limits::Idle::new(tls, proxy.limits.idle_timeout)
    };
    let ctx = Arc::new(Ctx {
        heads: io.heads(),
        ..(*ctx).clone()
    });
    let (audit_proxy, client) = (proxy.clone(), ctx.client);
    let header_timeout = proxy.limits.header_timeout;
    let mut shutdown = proxy.shutdown.subscribe();
    let service = service_fn(move |req: Request<Incoming>| {
        // HTTP/1 inside TLS: the Nth request is judged by the Nth raw head (h2 needs no sniffing).
        if let Some(heads) = ctx
            .heads
            .as_ref()
            .filter(|_| req.version() < http::Version::HTTP_2)
        {
            heads.begin_request();
        }
        pipeline::handle(proxy.clone(), ctx.clone(), req)
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    if h2 {
        builder = builder.http2_only();
    }
    builder
        .http1()
        .max_buf_size(MAX_HEADER_BYTES)
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    builder
        .http2()
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .timer(TokioTimer::new());
    // hyper closes a stalled header block without answering; the stream comes back to
    // latchkey when hyper lets go of it, so it can still send the `408`.
    let partial = io.partial();
    let (io, mut reclaimed) = Reclaim::new(io);
    let result = {
        let conn = builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(conn);
        tokio::select! {
            r = conn.as_mut() => r,
            _ = shutdown.changed() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        }
    };
    let timed_out = result
        .as_ref()
        .err()
        .and_then(|e| e.downcast_ref::<hyper::Error>())
        .is_some_and(|e| e.is_timeout());
    if timed_out {
        if partial.load(std::sync::atomic::Ordering::Relaxed) {
            // hyper's connection (and so the stream) was dropped with the block above; never
            // wait for it if something still holds it.
            if let Ok(io) = reclaimed.try_recv() {
                audit_proxy.header_timeout_tls(io, client).await;
            }
        }
        return;
    }
    if let Err(e) = result {
        match e.downcast_ref::<hyper::Error>() {
            Some(he) => audit_proxy.connection_error(he, client),
            None => tracing::debug!(error = %e, "intercepted connection closed with error"),
        }
    }
}

/// The stream hyper serves, handed back to latchkey when hyper drops it (after a stalled header
/// block, latchkey still owes the client a `408`). hyper owns it alone while it serves: reads and
/// writes go straight through, with no lock.
struct Reclaim<T> {
    /// `Some` for the wrapper's whole life; taken only by `Drop`.
    io: Option<T>,
    back: Option<tokio::sync::oneshot::Sender<T>>,
}

impl<T> Reclaim<T> {
    /// The wrapper for hyper, and where the stream arrives once hyper has dropped it.
    fn new(io: T) -> (Self, tokio::sync::oneshot::Receiver<T>) {
        let (back, reclaimed) = tokio::sync::oneshot::channel();
        (
            Self {
                io: Some(io),
                back: Some(back),
            },
            reclaimed,
        )
    }

    fn io(&mut self) -> io::Result<std::pin::Pin<&mut T>>
    where
        T: Unpin,
    {
        self.io
            .as_mut()
            .map(std::pin::Pin::new)
            .ok_or_else(|| io::Error::other("stream already handed back"))
    }
}

impl<T> Drop for Reclaim<T> {
    fn drop(&mut self) {
        if let (Some(io), Some(back)) = (self.io.take(), self.back.take()) {
            // Nobody waiting (the connection ended some other way): the stream just closes.
            let _ = back.send(io);
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Reclaim<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut().io() {
            Ok(io) => io.poll_read(cx, buf),
            Err(e) => std::task::Poll::Ready(Err(e)),
        }
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Reclaim<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        match self.get_mut().io() {
            Ok(io) => io.poll_write(cx, buf),
            Err(e) => std::task::Poll::Ready(Err(e)),
        }
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        match self.get_mut().io() {
            Ok(io) => io.poll_write_vectored(cx, bufs),
            Err(e) => std::task::Poll::Ready(Err(e)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.as_ref().is_some_and(T::is_write_vectored)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut().io() {
            Ok(io) => io.poll_flush(cx),
            Err(e) => std::task::Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut().io() {
            Ok(io) => io.poll_shutdown(cx),
            Err(e) => std::task::Poll::Ready(Err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_reclaimed_stream_comes_back_whole_when_its_user_drops_it() {
        let (a, mut b) = tokio::io::duplex(64);
        let (mut wrapped, reclaimed) = Reclaim::new(a);
        wrapped.write_all(b"first").await.expect("write");
        let mut buf = [0u8; 5];
        b.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"first");
        drop(wrapped);
        let mut reclaimed = reclaimed;
        let mut a = reclaimed.try_recv().expect("handed back at once");
        a.write_all(b"408").await.expect("write after reclaim");
        let mut buf = [0u8; 3];
        b.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"408");
    }
}

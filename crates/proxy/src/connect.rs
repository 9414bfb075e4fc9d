//! CONNECT on the proxy hop, and what a connection gate opens: tunnels and TLS interception.
//!
//! Fail-closed rules kept here:
//! - the host and port are decided before answering `200` (the connection gate,
//!   [`super::gate`]); a refusal makes no upstream connection;
//! - interception reads the *whole* ClientHello (`LazyConfigAcceptor`), so a hello split across
//!   TCP segments is still intercepted, and anything that is not TLS is dropped and audited;
//! - an SNI that differs from the CONNECT host is refused before a certificate is presented;
//! - raw bytes are relayed only for a `tunnel = true` rule, over the same guarded dialer.
//!
//! [`handle`] only finds the CONNECT's authority; the gate admits and decides it, as it does for
//! every listener. An intercepted connection hands each inner request to `pipeline::handle`
//! under the pinned [`Ctx`] the gate built: one admission, one pipeline, whichever listener.
//! It dials only through `upstream`.

use std::io;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio_rustls::{LazyConfigAcceptor, StartHandshake};

use super::gate::{self, Connection, Knock, Opened, Refuse};
use super::intercepted::ClientIo;
use super::pipeline::{self, Ctx};
use super::{body, respond, Proxy};
use crate::audit::Entry;
use crate::policy::normalize_host;
use crate::reason::{Reason, Refusal};
use crate::upstream::Body;

/// Handles `CONNECT host:port` on the proxy hop: the authority found in the request, then the
/// connection gate ([`gate::open`]), then `200` and the tunnel or the interception; a refusal is
/// answered and recorded in one place ([`respond::refused`]).
pub async fn handle(proxy: Arc<Proxy>, ctx: Arc<Ctx>, req: Request<Incoming>) -> Response<Body> {
    let policy = proxy.policy();
    let mut entry = pipeline::open_record(&proxy, ctx.client, &ctx.identity, &policy).await;
    entry.set_method("CONNECT");
    entry.set_scheme("https");
    // The CONNECT's own correlation headers (`curl --proxy-header`); only a tunnel, whose
    // record is the connection's, counts as an attempt at its step.
    let mut correlation = proxy
        .correlator
        .read(req.headers(), |t| entry.scrub_text(t));
    entry.update(|r| correlation.record(r));
    let knock = match knock(&ctx, &mut entry, &req) {
        Ok(knock) => knock,
        Err(refusal) => return Respond.refuse(entry, &refusal).await,
    };
    let (opened, mut entry) = match gate::open(&proxy, &policy, knock, entry, Respond).await {
        Ok(gated) => gated,
        Err(answered) => return answered,
    };
    if matches!(opened, Opened::Tunnel(_)) {
        proxy.correlator.count(&ctx.identity, &mut correlation);
        entry.update(|r| correlation.record(r));
    }
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                serve_opened(
                    proxy,
                    opened,
                    TokioIo::new(upgraded),
                    entry,
                    ctx.cut.clone(),
                )
                .await
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

/// Finds a CONNECT's authority: authority-form `host:port`, a port, no userinfo, a header
/// block within bounds and unambiguously framed (on the raw head as sent too, given by the gate
/// once it admitted the authority). The record names the host as sent.
fn knock<'r>(
    ctx: &Ctx,
    entry: &mut Entry,
    req: &'r Request<Incoming>,
) -> Result<Knock<'r, Connection>, Refusal> {
    pipeline::header_block_fits(req.headers())?;
    pipeline::parsed_framing(req.headers())?;
    let Some(authority) = req.uri().authority() else {
        return Err(Refusal::new(Reason::BadRequest, "CONNECT needs host:port"));
    };
    entry.set_host(authority.host());
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
    Ok(Knock {
        client: ctx.client,
        identity: ctx.identity.clone(),
        session: ctx.session.clone(),
        cut: ctx.cut.clone(),
        host: authority.host(),
        port,
        carries: Connection,
        original_dst: None,
        // The raw head as sent: hyper drops a Content-Length next to Transfer-Encoding.
        head: pipeline::raw_framing(ctx, req.method(), req.uri(), req.version()),
    })
}

/// The proxy hop's answer to a refused CONNECT: the refusal's HTTP response.
struct Respond;

impl Refuse for Respond {
    type Answered = Response<Body>;

    async fn refuse(self, entry: Entry, refusal: &Refusal) -> Response<Body> {
        respond::refused(entry, refusal)
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
    cut: Option<Arc<crate::wire::cut::Cut>>,
) {
    match opened {
        Opened::Tunnel(dialed) => tunnel(io, dialed.stream, entry, cut).await,
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
    session_cut: Option<Arc<crate::wire::cut::Cut>>,
) {
    let admission = entry
        .take_held()
        .and_then(|h| h.downcast::<crate::governance::limits::Admission>().ok());
    let upload = admission.as_ref().and_then(|a| a.upload());
    let metered = upload.is_some();
    let counters = entry.counters();
    let relay = async {
        match upload {
            Some(upload) => metered_tunnel(client, upstream, &upload).await,
            None => {
                // Counted as they go: a relay that ends in an error (a cut) still has its
                // bytes recorded.
                let mut client = Counting {
                    inner: &mut client,
                    counters: &counters,
                };
                if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
                    tracing::debug!(error = %e, "tunnel closed with error");
                }
                // Already in the counters.
                (0, 0, None)
            }
        }
    };
    // The session carrying the tunnel ends: the relay is dropped, both sockets close.
    let ended = async {
        match &session_cut {
            Some(c) => {
                c.thrown().await;
                session_end_refusal(c)
            }
            None => std::future::pending().await,
        }
    };
    // What the relay returns is what it did not count as it went (a metered tunnel's).
    let (up, down, cut) = tokio::select! {
        r = relay => r,
        refusal = ended => (0, 0, Some(refusal)),
    };
    // The relay may have ended on the cut IO before the cut was seen: the record says why.
    let cut = cut.or_else(|| {
        session_cut
            .as_deref()
            .filter(|c| c.is_thrown())
            .map(session_end_refusal)
    });
    entry.carried(up, down);
    if let Some(admission) = admission {
        let prices = crate::policy::PriceTable::empty();
        // A metered tunnel settles what it sent; any other what its client side read.
        let sent = if metered { up } else { counted(&counters).0 };
        let (charges, _) = admission.settle(sent, None, None, &prices);
        entry.set_limits(charges);
    }
    if let Some(refusal) = cut {
        tracing::warn!(audit.id = %entry.id(), reason = refusal.reason.code(), message = %entry.scrub_text(&refusal.message), "tunnel cut off");
        entry.ended(refusal.reason);
    }
    entry.finish();
}

/// A tunnel's client side, counting what it reads (up) and writes (down) into the record's
/// counters as the bytes move.
struct Counting<'a, T> {
    inner: &'a mut T,
    counters: &'a crate::audit::Counters,
}

/// `(up, down)` counted so far.
fn counted(c: &crate::audit::Counters) -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (c.up.load(Relaxed), c.down.load(Relaxed))
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Counting<'_, T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut *this.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        this.counters
            .up
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        r
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Counting<'_, T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut *this.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &r {
            this.counters
                .down
                .fetch_add(*n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut *self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut *self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The refusal a connection cut by its session's end is recorded with.
pub(crate) fn session_end_refusal(cut: &crate::wire::cut::Cut) -> Refusal {
    if cut.why() == Some(Reason::SessionExpired.code()) {
        Refusal::new(
            Reason::SessionExpired,
            "the session carrying this connection expired",
        )
    } else {
        Refusal::new(
            Reason::SessionRevoked,
            "the session carrying this connection was revoked",
        )
    }
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

//! The listener and the proxy hop: accepting connections, serving HTTP/1.1 on each, and the
//! answers hyper cannot give.
//!
//! A connection's path, top to bottom:
//!
//! ```text
//! accept ─▶ caps (503) ─▶ HTTP/1.1 proxy hop ─▶ identify (407) ─┬─ CONNECT ─▶ connect::handle
//!                                                                └─ http://  ─▶ pipeline::handle
//! ```
//!
//! Every request leaves here with a [`Ctx`] built by [`Ctx::proxy_hop`] and named by identify:
//! the same context the CONNECT interception hands the pipeline. Parse errors on the proxy hop
//! (malformed request line, header block over the limit) are answered by hyper and audited
//! here; a header block that stalls gets `408` through [`respond::refused_raw`]. This module
//! never decides policy and never dials.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use super::pipeline::{self, Ctx};
use super::{connect, limits, respond, Proxy, MAX_HEADER_BYTES};
use crate::audit::Entry;
use crate::reason::{Reason, Refusal};
use crate::upstream;

impl Proxy {
    /// Accepts connections until shutdown begins.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        self.clone()
            .accept_until_shutdown(listener, "proxy", |stream, peer, slot| match slot {
                Ok(slot) => {
                    tokio::spawn(self.clone().connection(stream, peer, slot));
                }
                Err(why) => {
                    tokio::spawn(self.clone().over_limit(stream, peer, why));
                }
            })
            .await;
    }

    /// The one accept loop every listener runs: each connection takes a slot from the
    /// connection caps (or is handed `Err(why)` to refuse) and goes to `on`, until shutdown
    /// begins. `what` names the listener in the log.
    pub(super) async fn accept_until_shutdown(
        self: Arc<Self>,
        listener: TcpListener,
        what: &'static str,
        mut on: impl FnMut(TcpStream, SocketAddr, Result<limits::ConnectionSlot, String>),
    ) {
        let mut shutdown = self.shutdown.subscribe();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let slot = self.connections.acquire(peer.ip(), &self.limits);
                        on(stream, peer, slot);
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, listener = what, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                () = super::stopped(&mut shutdown) => break,
            }
        }
    }

    /// Answers a connection over the caps with `503` and closes it.
    async fn over_limit(self: Arc<Self>, mut stream: TcpStream, peer: SocketAddr, why: String) {
        use tokio::io::AsyncWriteExt;
        let entry = crate::open_connection_record(&self, peer, &self.policy()).await;
        tracing::warn!(client.addr = %peer, why, "connection refused: over limit");
        let refusal = Refusal::new(Reason::TooManyConnections, why);
        let answer = respond::refused_raw(entry, &refusal);
        let _ = tokio::time::timeout(Duration::from_secs(2), stream.write_all(&answer)).await;
        let _ = stream.shutdown().await;
    }

    /// Serves one sandbox connection on the proxy hop (HTTP/1.1).
    async fn connection(
        self: Arc<Self>,
        stream: TcpStream,
        peer: SocketAddr,
        slot: limits::ConnectionSlot,
    ) {
        let _ = stream.set_nodelay(true);
        // A second handle on the socket, so latchkey can still answer `408` after hyper gives up
        // on a header block that never completed (hyper closes without a response).
        let (stream, raw) = match stream
            .into_std()
            .and_then(|s| s.try_clone().map(|c| (s, c)))
            .and_then(|(s, c)| TcpStream::from_std(s).map(|s| (s, c)))
        {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(client.addr = %peer, error = %e, "cannot set up connection");
                return;
            }
        };
        // The slot goes with the socket: a CONNECT (tunnel, interception, WebSocket) keeps
        // counting under the caps after hyper hands the socket on.
        // The connection's switch: thrown when the session its requests carry ends.
        let cut = Arc::new(crate::wire::cut::Cut::default());
        let io = limits::Idle::new(stream, self.limits.idle_timeout)
            .holding(slot)
            .cut_by(cut.clone());
        let partial = io.partial();
        let ctx = Arc::new(Ctx::proxy_hop(peer, io.heads()).with_cut(Some(cut.clone())));
        let proxy = self.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let proxy = proxy.clone();
            let ctx = ctx.clone();
            // The Nth request hyper hands over is judged by the Nth raw head on the connection.
            if let Some(heads) = &ctx.heads {
                heads.begin_request();
            }
            async move {
                // identify: per request on the proxy hop (a CONNECT's identity then holds for
                // every request inside it).
                let ctx = match proxy.identify(&req, &ctx).await {
                    Ok(ctx) => ctx,
                    Err(res) => return Ok::<_, Infallible>(res),
                };
                if req.method() == Method::CONNECT {
                    Ok(connect::handle(proxy, ctx, req).await)
                } else {
                    pipeline::handle(proxy, ctx, req).await
                }
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .max_buf_size(MAX_HEADER_BYTES)
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout)
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        tokio::pin!(conn);
        let mut shutdown = self.shutdown.subscribe();
        let result = tokio::select! {
            r = conn.as_mut() => r,
            () = super::stopped(&mut shutdown) => {
                // Finish the request in flight, then close instead of keeping alive.
                conn.as_mut().graceful_shutdown();
                conn.await
            }
            // The session this connection carries ended: drop it, requests in flight too
            // (their records are written as their bodies are dropped).
            () = cut.thrown() => return,
        };
        if let Err(e) = result {
            if e.is_timeout() {
                // An idle keep-alive connection simply closes; a half-sent request is slowloris.
                if partial.load(std::sync::atomic::Ordering::Relaxed) {
                    self.header_timeout(raw, peer);
                }
                return;
            }
            self.connection_error(&e, peer);
        }
    }

    /// The refusal of a header block that did not arrive in time.
    fn header_timeout_refusal(&self) -> Refusal {
        Refusal::new(
            Reason::HeaderTimeout,
            format!(
                "the request header block did not arrive within {}s",
                self.limits.header_timeout.as_secs()
            ),
        )
    }

    /// A stalled header block inside an intercepted connection: `408` over TLS, a record.
    pub(super) async fn header_timeout_tls<T: tokio::io::AsyncWrite + Unpin>(
        &self,
        mut io: T,
        peer: SocketAddr,
    ) {
        use tokio::io::AsyncWriteExt;
        let answer =
            respond::refused_raw(self.connection_record(peer), &self.header_timeout_refusal());
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            let _ = io.write_all(&answer).await;
            let _ = io.shutdown().await;
        })
        .await;
    }

    /// A client sent part of a request and stalled: `408`, an audit record, close.
    fn header_timeout(&self, mut raw: std::net::TcpStream, peer: SocketAddr) {
        use std::io::Write;
        let answer =
            respond::refused_raw(self.connection_record(peer), &self.header_timeout_refusal());
        // Non-blocking and best effort: the socket may already be gone.
        let _ = raw.write(&answer);
        let _ = raw.shutdown(std::net::Shutdown::Both);
    }

    /// Works out which sandbox sent `req`; without identities in the policy, `default`.
    /// An unknown token or an unidentified client gets `407` and an audit record.
    ///
    /// Guarantees: on `Ok`, the context names an identity the policy in force defines (or
    /// `default` when it defines none), for this request or the CONNECT it opens.
    async fn identify(
        &self,
        req: &Request<Incoming>,
        ctx: &Arc<Ctx>,
    ) -> Result<Arc<Ctx>, http::Response<upstream::Body>> {
        let policy = self.policy();
        if policy.identities().is_empty() {
            return Ok(ctx.clone());
        }
        let auth = req
            .headers()
            .get(http::header::PROXY_AUTHORIZATION)
            .map(|v| v.as_bytes());
        // A runtime session (`SESSION_ID:TOKEN`), or one bound to the client's address.
        let session = match self.session_by_header(auth, ctx.client).await {
            Some(admitted) => Some(admitted),
            None if auth.is_none() => self.session_by_source(ctx.client).await.transpose(),
            // A workload token the policy's `[attest]` tables trust.
            None => self.session_by_attestation(auth, ctx.client).await,
        };
        match session {
            Some(Ok(live)) => return self.in_session(req, ctx, live, &policy).await,
            Some(Err(refusal)) => return Err(self.unidentified(req, ctx, &policy, refusal).await),
            None => {}
        }
        match crate::policy::identity::identify(
            policy.identities(),
            policy.secrets(),
            auth,
            ctx.client.ip(),
        )
        .await
        {
            Ok(identity) => Ok(Arc::new(ctx.identified(&identity.name))),
            Err(e) => {
                let refusal = Refusal::new(Reason::ProxyAuthRequired, e.to_string());
                Err(self.unidentified(req, ctx, &policy, refusal).await)
            }
        }
    }

    /// The context of a request under session `live`. One connection carries one session: a
    /// request on it presenting another is refused (its switch is the first one's).
    async fn in_session(
        &self,
        req: &Request<Incoming>,
        ctx: &Arc<Ctx>,
        live: Arc<crate::governance::sessions::Live>,
        policy: &super::Generation,
    ) -> Result<Arc<Ctx>, http::Response<upstream::Body>> {
        if ctx.cut.as_ref().is_some_and(|cut| !cut.owned_by(&live.id)) {
            let refusal = Refusal::new(
                Reason::ProxyAuthRequired,
                "this connection already carries another session; open a new connection",
            );
            return Err(self.unidentified(req, ctx, policy, refusal).await);
        }
        Ok(Arc::new(ctx.in_session(live)))
    }

    /// A `407` (or a session's `503`): the record names what was sent, under `unidentified`.
    async fn unidentified(
        &self,
        req: &Request<Incoming>,
        ctx: &Ctx,
        policy: &super::Generation,
        refusal: Refusal,
    ) -> http::Response<upstream::Body> {
        let mut entry = crate::open_record(self, ctx.client, "unidentified", policy).await;
        unidentified(&mut entry, req);
        respond::refused(entry, &refusal)
    }

    /// Audits what hyper refused before our service saw a request.
    pub(super) fn connection_error(&self, e: &hyper::Error, peer: SocketAddr) {
        let reason = if e.is_parse_too_large() {
            Reason::HeaderTooLarge
        } else if e.is_parse() {
            Reason::BadRequest
        } else {
            tracing::debug!(client.addr = %peer, error = %e, "connection closed with error");
            return;
        };
        tracing::info!(client.addr = %peer, error = %e, "malformed request refused");
        respond::recorded(self.connection_record(peer), reason);
    }
}

/// What a request refused `407` named, as sent: its method, host, scheme (`https` for a
/// CONNECT), port (or the scheme's) and, but for a CONNECT, its path with the query redacted.
fn unidentified(entry: &mut Entry, req: &Request<Incoming>) {
    let uri = req.uri();
    let connect = req.method() == Method::CONNECT;
    entry.set_method(req.method().as_str());
    if let Some(host) = uri.host() {
        entry.set_host(host.to_ascii_lowercase());
    }
    let scheme = if connect {
        Some("https".to_string())
    } else {
        uri.scheme_str().map(str::to_ascii_lowercase)
    };
    let port = uri.port_u16().or(match scheme.as_deref() {
        Some("http") => Some(80),
        Some("https") => Some(443),
        _ => None,
    });
    if let Some(scheme) = &scheme {
        entry.set_scheme(scheme);
    }
    if let Some(port) = port {
        entry.set_port(port);
    }
    if let Some(pq) = uri.path_and_query().filter(|_| !connect) {
        entry.set_path(crate::audit::redact_query(pq.as_str()));
    }
}

//! Serving an intercepted connection once its TLS handshake is done: the idle timeout and (for
//! HTTP/1) the raw-head sniffer around the stream, hyper's h1/h2 server, and the `408` owed to
//! a client whose header block stalled.
//!
//! Memory is what an idle connection costs, so hyper's per-connection state — most of a
//! connection's footprint — is made only when the client sends its first byte: until then the
//! connection holds its TLS stream and a few pointers. Depends on `proxy` (the shared state and
//! the pipeline) and `limits`.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::AsyncReadExt;

use super::limits::Idle;
use super::pipeline::{self, Ctx};
use super::{Proxy, MAX_HEADER_BYTES};

/// A byte stream from the sandbox that can carry an intercepted connection: a CONNECT's
/// upgraded stream, or (for listeners without a proxy hop) the accepted socket itself.
pub(crate) trait ClientIo:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static
{
}

impl<T> ClientIo for T where T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static
{}

/// The sandbox's side of an intercepted connection, after the handshake.
pub(super) type Tls<T> = tokio_rustls::server::TlsStream<T>;

/// Serves requests on an intercepted connection until it closes, idles out or shutdown begins.
/// Each request goes through [`pipeline::handle`] with `ctx` (the CONNECT's client, identity and
/// authority). Spawn the returned future as its own task: then the handshake's state is gone
/// and an idle connection holds only this small future (the TLS stream, a few pointers).
pub(super) fn serve<T: ClientIo>(
    proxy: Arc<Proxy>,
    ctx: Arc<Ctx>,
    tls: Tls<T>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
    serve_stream(proxy, ctx, tls, h2)
}

/// Serves HTTP requests on any client stream whose authority a gate pinned in `ctx`: the
/// decrypted side of an interception, or a plain connection (`Ctx::pinned_plain`: SOCKS5,
/// transparent HTTP). `h2` serves HTTP/2 only (a client that chose h2 by ALPN); otherwise
/// HTTP/1 (or h2 by prior knowledge inside TLS), with the raw-head sniffer.
pub(crate) fn serve_stream<S: ClientIo>(
    proxy: Arc<Proxy>,
    ctx: Arc<Ctx>,
    stream: S,
    h2: bool,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    // The inner connection gets its own idle timeout, and a raw-head view when it may be
    // HTTP/1. A client that chose h2 (ALPN) is served h2 only, so no HTTP/1 head can reach the
    // service unsniffed and h2 frames are never fed to the head parser.
    let io = if h2 {
        Idle::without_sniffer(stream, proxy.limits.idle_timeout)
    } else {
        Idle::new(stream, proxy.limits.idle_timeout)
    };
    let ctx = Arc::new((*ctx).clone().with_heads(io.heads()));
    let mut shutdown = proxy.shutdown.subscribe();
    let mut io = io;
    // An `async` block, not an `async fn`: what it captures is stored once (an `async fn` keeps
    // its arguments and its moved copies apart, doubling the TLS stream's share of the task).
    async move {
        // Wait for the client's first byte before making hyper's connection (see the module
        // docs). It is read through `Idle`, so the sniffer and the idle timeout see it, and it
        // is handed to hyper first.
        let mut first = [0u8; 1];
        let read = tokio::select! {
            r = io.read(&mut first) => r,
            () = super::stopped(&mut shutdown) => return,
        };
        match read {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "intercepted connection closed with error");
                return;
            }
        }
        // Boxed: this future holds hyper's connection, so it is allocated only now.
        Box::pin(serve_http(proxy, ctx, io, first[0], h2, shutdown)).await;
    }
}

/// hyper's h1/h2 server over `io`, whose `first` byte was already read from it.
async fn serve_http<S: ClientIo>(
    proxy: Arc<Proxy>,
    ctx: Arc<Ctx>,
    io: Idle<S>,
    first: u8,
    h2: bool,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let partial = io.partial();
    let io = Prefixed {
        first: Some(first),
        io,
    };
    let (audit_proxy, client) = (proxy.clone(), ctx.client);
    let session_cut = ctx.cut.clone().filter(|_| ctx.session.is_some());
    let header_timeout = proxy.limits.header_timeout;
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
    let (io, mut reclaimed) = Reclaim::new(io);
    let result = {
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
        tokio::pin!(conn);
        let cut = session_cut.as_deref();
        tokio::select! {
            r = conn.as_mut() => r,
            () = super::stopped(&mut shutdown) => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
            // The session the connection carries ended: drop it, requests in flight too.
            () = async move {
                match cut {
                    Some(cut) => cut.thrown().await,
                    None => std::future::pending().await,
                }
            } => return,
        }
    };
    let timed_out = result
        .as_ref()
        .err()
        .and_then(|e| e.downcast_ref::<hyper::Error>())
        .is_some_and(|e| e.is_timeout());
    if timed_out {
        if partial.load(Ordering::Relaxed) {
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

/// A stream with one byte already read from it, handed out again before the rest.
struct Prefixed<T> {
    first: Option<u8>,
    io: T,
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Prefixed<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() > 0 {
            if let Some(b) = this.first.take() {
                buf.put_slice(&[b]);
                return std::task::Poll::Ready(Ok(()));
            }
        }
        std::pin::Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Prefixed<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
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

    #[tokio::test]
    async fn a_prefixed_stream_hands_out_its_first_byte_then_the_rest() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut p = Prefixed {
            first: Some(b'G'),
            io: a,
        };
        b.write_all(b"ET / HTTP/1.1").await.expect("write");
        let mut got = [0u8; 14];
        p.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"GET / HTTP/1.1");
        p.write_all(b"ok").await.expect("write");
        let mut back = [0u8; 2];
        b.read_exact(&mut back).await.expect("read");
        assert_eq!(&back, b"ok");
    }
}

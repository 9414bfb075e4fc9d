//! Resource limits against abuse: connection caps (total and per client), an idle timeout on
//! every sandbox connection, and request framing checks against smuggling.
//!
//! Each limit answers with a clear status and leaves an audit record; none of them is a policy
//! decision, so report-only modes never relax them.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::HeaderMap;
use std::future::Future;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use tokio::time::{Instant, Sleep};

use crate::reason::Reason;

/// Limits configured at startup.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_client: usize,
    /// Time allowed to send a request's header block (slowloris), also the keep-alive idle time
    /// between requests on the proxy hop.
    pub header_timeout: Duration,
    /// A connection with no bytes either way for this long is closed (tunnels included).
    pub idle_timeout: Duration,
    /// Longest request target (request line) accepted.
    pub max_uri_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_connections_per_client: 256,
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
            max_uri_len: 8 * 1024,
        }
    }
}

/// Counts open connections, in total and per client address.
#[derive(Debug, Default)]
pub struct ConnectionCounter {
    inner: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// Held for the life of a connection; releases its slot on drop.
#[derive(Debug)]
pub struct ConnectionSlot {
    counter: Arc<ConnectionCounter>,
    ip: IpAddr,
}

impl ConnectionCounter {
    /// Takes a slot, or says which cap was hit.
    pub fn acquire(
        self: &Arc<Self>,
        ip: IpAddr,
        limits: &Limits,
    ) -> Result<ConnectionSlot, String> {
        let mut g = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if g.0 >= limits.max_connections {
            return Err(format!(
                "latchkey has {} connections open, its limit",
                limits.max_connections
            ));
        }
        let per = g.1.get(&ip).copied().unwrap_or(0);
        if per >= limits.max_connections_per_client {
            return Err(format!(
                "client {ip} has {per} connections open, the per-client limit"
            ));
        }
        g.0 += 1;
        *g.1.entry(ip).or_insert(0) += 1;
        Ok(ConnectionSlot {
            counter: self.clone(),
            ip,
        })
    }

    /// Open connections now.
    pub fn open(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut g = self
            .counter
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.0 = g.0.saturating_sub(1);
        if let Some(n) = g.1.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                g.1.remove(&self.ip);
            }
        }
    }
}

/// Refuses request framing that two parsers could read differently (RFC 9112 §6): both
/// `Content-Length` and `Transfer-Encoding`, several or non-numeric `Content-Length`s, and any
/// transfer coding but a single `chunked`.
pub fn check_framing(headers: &HeaderMap) -> Result<(), (Reason, String)> {
    let refuse = |m: &str| Err((Reason::AmbiguousFraming, m.to_string()));
    let cl: Vec<_> = headers.get_all(CONTENT_LENGTH).iter().collect();
    let te: Vec<_> = headers.get_all(TRANSFER_ENCODING).iter().collect();
    if !cl.is_empty() && !te.is_empty() {
        return refuse("request has both Content-Length and Transfer-Encoding");
    }
    if cl.len() > 1 {
        return refuse("request has more than one Content-Length");
    }
    if let Some(v) = cl.first() {
        let ok = v
            .to_str()
            .is_ok_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
        if !ok {
            return refuse("request has an invalid Content-Length");
        }
    }
    if te.len() > 1 {
        return refuse("request has more than one Transfer-Encoding");
    }
    if let Some(v) = te.first() {
        if !v
            .to_str()
            .is_ok_and(|s| s.trim().eq_ignore_ascii_case("chunked"))
        {
            return refuse("request has a Transfer-Encoding other than chunked");
        }
    }
    Ok(())
}

/// An IO that fails with `TimedOut` after `timeout` without a byte read or written, and
/// tracks whether the client sent bytes since latchkey last wrote (a request in progress, as
/// opposed to an idle keep-alive connection).
pub struct Idle<T> {
    inner: T,
    sleep: Pin<Box<Sleep>>,
    timeout: Duration,
    partial: Arc<AtomicBool>,
    heads: Arc<HeadSniff>,
}

/// The raw bytes of the request head latchkey is answering, as the client sent them.
///
/// hyper resolves ambiguous framing the RFC way before a service sees the request (drops
/// `Content-Length` next to `Transfer-Encoding`, merges equal `Content-Length`s), which hides
/// a smuggling attempt. The connection's reader keeps the bytes read since latchkey last
/// wrote, which for a client that waits for each answer begin with the current request's
/// head; [`HeadSniff::framing_of`] finds that head and checks it raw.
#[derive(Debug, Default)]
pub struct HeadSniff {
    inner: Mutex<(Vec<u8>, bool)>,
}

/// Bytes kept per request: the largest head latchkey accepts, plus a request line.
const SNIFF_LIMIT: usize = 64 * 1024 + 8 * 1024;

impl HeadSniff {
    fn on_read(&self, bytes: &[u8]) {
        let mut g = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (buf, reset) = &mut *g;
        if *reset {
            buf.clear();
            *reset = false;
        }
        let room = SNIFF_LIMIT.saturating_sub(buf.len());
        buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn on_write(&self) {
        let mut g = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.1 = true;
    }

    /// Checks the raw framing headers of the request whose line is `METHOD TARGET`. `None` when
    /// that head is not in view (a pipelining client): hyper's checks then stand alone.
    pub fn framing_of(&self, method: &str, target: &str) -> Option<Result<(), (Reason, String)>> {
        let g = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let buf = &g.0;
        let line = format!("{method} {target} HTTP/1.");
        let start = if buf.starts_with(line.as_bytes()) {
            0
        } else {
            let needle = format!("\r\n{line}");
            find(buf, needle.as_bytes())? + 2
        };
        let head_end = find(&buf[start..], b"\r\n\r\n")? + start;
        let head = &buf[start..head_end];
        let mut cl = 0usize;
        let mut te = 0usize;
        for line in head.split(|&b| b == b'\n').skip(1) {
            let name = line.split(|&b| b == b':').next().unwrap_or_default();
            if name.eq_ignore_ascii_case(b"content-length") {
                cl += 1;
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                te += 1;
            }
        }
        let refuse = |m: &str| Some(Err((Reason::AmbiguousFraming, m.to_string())));
        if cl > 0 && te > 0 {
            return refuse("request has both Content-Length and Transfer-Encoding");
        }
        if cl > 1 {
            return refuse("request has more than one Content-Length");
        }
        Some(Ok(()))
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl<T> Idle<T> {
    pub fn new(inner: T, timeout: Duration) -> Self {
        Self {
            inner,
            sleep: Box::pin(tokio::time::sleep(timeout)),
            timeout,
            partial: Arc::new(AtomicBool::new(false)),
            heads: Arc::new(HeadSniff::default()),
        }
    }

    /// The raw request heads seen on this connection.
    pub fn heads(&self) -> Arc<HeadSniff> {
        self.heads.clone()
    }

    /// True while the client has sent bytes that latchkey has not answered yet.
    pub fn partial(&self) -> Arc<AtomicBool> {
        self.partial.clone()
    }

    fn touch(&mut self) {
        let deadline = Instant::now() + self.timeout;
        self.sleep.as_mut().reset(deadline);
    }

    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.sleep.as_mut().poll(cx).is_ready()
    }

    /// Bookkeeping after a write attempt, shared by plain and vectored writes: progress resets
    /// the idle deadline and the partial-request flag; a stall past the deadline is an error.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.touch();
                    self.partial.store(false, Ordering::Relaxed);
                    self.heads.on_write();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connection idle timeout")
}

impl<T: AsyncRead + Unpin> AsyncRead for Idle<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.touch();
                    this.partial.store(true, Ordering::Relaxed);
                    this.heads.on_read(&buf.filled()[before..]);
                }
                Poll::Ready(r)
            }
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Idle<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.wrote(cx, r)
    }

    /// Passed through, so hyper writes a response's head and body chunks in one `writev` (or
    /// one TLS record batch) instead of first copying them into one buffer.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wrote(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        for h in [
            headers(&[("content-length", "5"), ("transfer-encoding", "chunked")]),
            headers(&[("content-length", "5"), ("content-length", "5")]),
            headers(&[("content-length", "5, 5")]),
            headers(&[("content-length", "-1")]),
            headers(&[("transfer-encoding", "gzip, chunked")]),
            headers(&[("transfer-encoding", "identity")]),
        ] {
            assert!(check_framing(&h).is_err(), "{h:?}");
        }
        for h in [
            headers(&[]),
            headers(&[("content-length", "5")]),
            headers(&[("transfer-encoding", "chunked")]),
        ] {
            assert!(check_framing(&h).is_ok(), "{h:?}");
        }
    }

    #[test]
    fn raw_heads_reveal_what_hyper_normalises_away() {
        let sniff = HeadSniff::default();
        sniff.on_read(b"POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
        assert!(matches!(
            sniff.framing_of("POST", "http://a.test/x"),
            Some(Err(_))
        ));
        sniff.on_write();
        sniff.on_read(
            b"GET http://a.test/y HTTP/1.1\r\nContent-Length: 0\r\ncontent-length: 0\r\n\r\n",
        );
        assert!(matches!(
            sniff.framing_of("GET", "http://a.test/y"),
            Some(Err(_))
        ));
        sniff.on_write();
        sniff.on_read(b"GET http://a.test/z HTTP/1.1\r\nHost: a.test\r\n\r\n");
        assert!(matches!(
            sniff.framing_of("GET", "http://a.test/z"),
            Some(Ok(()))
        ));
        assert!(sniff.framing_of("GET", "http://a.test/other").is_none());
    }

    #[test]
    fn connection_caps_hold_per_client_and_in_total() {
        let limits = Limits {
            max_connections: 3,
            max_connections_per_client: 2,
            ..Limits::default()
        };
        let c = Arc::new(ConnectionCounter::default());
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let s1 = c.acquire(a, &limits).expect("1");
        let _s2 = c.acquire(a, &limits).expect("2");
        assert!(c.acquire(a, &limits).is_err(), "per-client cap");
        let _s3 = c.acquire(b, &limits).expect("3");
        assert!(c.acquire(b, &limits).is_err(), "total cap");
        drop(s1);
        assert!(c.acquire(b, &limits).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_times_out() {
        use tokio::io::AsyncReadExt;
        let (a, _b) = tokio::io::duplex(64);
        let mut idle = Box::pin(Idle::new(a, Duration::from_secs(5)));
        let mut buf = [0u8; 8];
        let e = idle.read(&mut buf).await.expect_err("times out");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }
}

//! [`Idle`]: the idle timeout on a sandbox connection, the "request in progress" flag the `408`
//! answer needs, and the tap that feeds the raw-head sniffer. Wraps any `AsyncRead +
//! AsyncWrite`; depends on nothing in the crate but [`super::HeadSniff`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::HeadSniff;

/// An IO that fails with `TimedOut` after `timeout` without a byte read or written, and
/// tracks whether the client sent bytes since latchkey last wrote (a request in progress, as
/// opposed to an idle keep-alive connection).
///
/// Progress only records the time (`last`); the one timer is re-armed when it fires early,
/// not on every read and write, so the hot path never touches the timer wheel.
pub struct Idle<T> {
    inner: T,
    /// Fires at or after the idle deadline: `last + timeout` as it was when the timer was armed.
    sleep: Pin<Box<Sleep>>,
    timeout: Duration,
    /// When a byte last moved either way.
    last: Instant,
    partial: Arc<AtomicBool>,
    heads: Option<Arc<HeadSniff>>,
    /// The connection's place under the caps: it lives as long as the socket does, also
    /// after an upgrade hands it on (a CONNECT's tunnel or interception, a WebSocket).
    _slot: Option<super::ConnectionSlot>,
    /// Thrown when the session the connection carries ends: every read and write fails from
    /// then on, whichever task polls them (the relay of a tunnel or a WebSocket too).
    cut: Option<Arc<crate::wire::cut::Cut>>,
}

impl<T> Idle<T> {
    /// An HTTP/1 connection: idle timeout, and every byte read goes to a [`HeadSniff`].
    pub fn new(inner: T, timeout: Duration) -> Self {
        Self::with_heads(inner, timeout, Some(Arc::new(HeadSniff::default())))
    }

    /// A connection with no HTTP/1 heads to judge (h2): idle timeout only.
    pub fn without_sniffer(inner: T, timeout: Duration) -> Self {
        Self::with_heads(inner, timeout, None)
    }

    fn with_heads(inner: T, timeout: Duration, heads: Option<Arc<HeadSniff>>) -> Self {
        let last = Instant::now();
        Self {
            inner,
            sleep: Box::pin(tokio::time::sleep_until(last + timeout)),
            timeout,
            last,
            partial: Arc::new(AtomicBool::new(false)),
            heads,
            _slot: None,
            cut: None,
        }
    }

    /// This connection, ended by `cut` when it is thrown.
    #[must_use]
    pub fn cut_by(mut self, cut: Arc<crate::wire::cut::Cut>) -> Self {
        self.cut = Some(cut);
        self
    }

    /// Whether the connection was cut; when not, the polling task is woken by a later cut.
    fn poll_cut(&self, cx: &mut Context<'_>, write: bool) -> Option<io::Error> {
        let cut = self.cut.as_ref()?;
        let polled = if write {
            cut.poll_write_cut(cx)
        } else {
            cut.poll_read_cut(cx)
        };
        match polled {
            Poll::Ready(e) => Some(e),
            Poll::Pending => None,
        }
    }

    /// This connection holding `slot` for as long as it lives.
    #[must_use]
    pub fn holding(mut self, slot: super::ConnectionSlot) -> Self {
        self._slot = Some(slot);
        self
    }

    /// The raw request heads seen on this connection (`None` without a sniffer).
    pub fn heads(&self) -> Option<Arc<HeadSniff>> {
        self.heads.clone()
    }

    /// True while the client has sent bytes that latchkey has not answered yet.
    pub fn partial(&self) -> Arc<AtomicBool> {
        self.partial.clone()
    }

    /// Records progress: one clock read, no timer work.
    fn touch(&mut self) {
        self.last = Instant::now();
    }

    /// Whether the connection has been idle for `timeout`. The timer fires at the deadline it
    /// was armed with; if bytes moved since, it is re-armed at the new deadline instead.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
            let deadline = self.last + self.timeout;
            if deadline <= Instant::now() {
                return true;
            }
            self.sleep.as_mut().reset(deadline);
        }
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
        if let Some(e) = this.poll_cut(cx, false) {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.touch();
                    this.partial.store(true, Ordering::Relaxed);
                    if let Some(heads) = &this.heads {
                        heads.on_read(&buf.filled()[before..]);
                    }
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
        if let Some(e) = this.poll_cut(cx, true) {
            return Poll::Ready(Err(e));
        }
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
        if let Some(e) = this.poll_cut(cx, true) {
            return Poll::Ready(Err(e));
        }
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wrote(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.poll_cut(cx, true) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_times_out() {
        let (a, _b) = tokio::io::duplex(64);
        let mut idle = Box::pin(Idle::new(a, Duration::from_secs(5)));
        let mut buf = [0u8; 8];
        let e = idle.read(&mut buf).await.expect_err("times out");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    /// Bytes that keep moving keep the connection open past its first deadline, and the
    /// timeout counts from the last byte, exactly as a timer reset per read would.
    #[tokio::test(start_paused = true)]
    async fn the_deadline_counts_from_the_last_byte_either_way() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut idle = Box::pin(Idle::new(a, Duration::from_secs(5)));
        let start = Instant::now();
        let mut buf = [0u8; 8];
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            b.write_all(b"x").await.expect("write");
            assert_eq!(idle.read(&mut buf).await.expect("read"), 1);
        }
        // A write counts as progress too.
        tokio::time::sleep(Duration::from_secs(3)).await;
        idle.write_all(b"y").await.expect("write");
        let last = Instant::now();
        let e = idle.read(&mut buf).await.expect_err("times out");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let idle_for = Instant::now() - last;
        assert!(
            idle_for >= Duration::from_secs(5) && idle_for < Duration::from_millis(5_010),
            "{idle_for:?}"
        );
        assert!(last - start >= Duration::from_secs(12));
    }

    #[tokio::test(start_paused = true)]
    async fn reads_mark_a_request_in_progress_and_writes_clear_it() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut idle = Box::pin(Idle::without_sniffer(a, Duration::from_secs(5)));
        assert!(idle.heads().is_none());
        let partial = idle.partial();
        b.write_all(b"GET").await.expect("write");
        let mut buf = [0u8; 3];
        idle.read_exact(&mut buf).await.expect("read");
        assert!(partial.load(Ordering::Relaxed));
        idle.write_all(b"HTTP/1.1 200").await.expect("write");
        assert!(!partial.load(Ordering::Relaxed));
    }

    /// A cut fails a read that is already waiting (the relay of a tunnel waits on both sides)
    /// and every write once its grace has passed.
    #[tokio::test]
    async fn a_cut_ends_a_waiting_read_and_every_write() {
        let (a, _b) = tokio::io::duplex(64);
        let cut = Arc::new(crate::wire::cut::Cut::default());
        cut.arm();
        let mut idle = Box::pin(Idle::new(a, Duration::from_secs(60)).cut_by(cut.clone()));
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            let e = idle.read(&mut buf).await.expect_err("cut");
            // A last word may still be written for a moment; after it, nothing.
            tokio::time::sleep(crate::wire::cut::WRITE_GRACE + Duration::from_millis(20)).await;
            let w = idle.write_all(b"x").await.expect_err("cut");
            (e.kind(), w.kind())
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        cut.throw("session_revoked");
        let (read, write) = tokio::time::timeout(Duration::from_secs(1), reader)
            .await
            .expect("woken at once")
            .expect("joined");
        assert_eq!(read, io::ErrorKind::ConnectionAborted);
        assert_eq!(write, io::ErrorKind::ConnectionAborted);
    }
}

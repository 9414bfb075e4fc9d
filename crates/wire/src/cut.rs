//! [`Cut`]: a switch that ends a connection from outside its task. A session's revocation (or
//! expiry) throws the switch of every connection the session holds; the connection's IO
//! wrapper then fails every read and write, and its serving loop stops waiting, so a tunnel, an
//! interception, a streaming response and a WebSocket all end within a wake-up, whichever task
//! is polling them.
//!
//! Thrown once, never reset. A switch is **armed** when something that can throw it is attached
//! (a session); until then every check is one atomic load and registers nothing, so a
//! connection that never carries a session pays next to nothing for it.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// How long after a throw writes still go through: long enough for a last word (a WebSocket's
/// close frame, written by a task that stops right after), never long enough to matter. Reads
/// fail at once.
pub const WRITE_GRACE: Duration = Duration::from_millis(500);

use futures_util::task::AtomicWaker;

/// The switch of one connection. Shared (`Arc`) between the connection's IO, its serving loop
/// and whatever may end it.
#[derive(Debug, Default)]
pub struct Cut {
    /// Something that can throw it is attached: only then are wakers kept.
    armed: AtomicBool,
    thrown: AtomicBool,
    /// Why it was thrown (the reason code the IO error and the record carry).
    why: OnceLock<&'static str>,
    /// When it was thrown.
    at: OnceLock<Instant>,
    /// The task waiting to read, and the one waiting to write (they may differ: a relay).
    read: AtomicWaker,
    write: AtomicWaker,
    /// Serving loops waiting on [`Cut::thrown`].
    notify: tokio::sync::Notify,
    /// What the switch belongs to (a session's id): one connection carries one session.
    owner: OnceLock<String>,
}

impl Cut {
    /// Throws the switch: every read and write on the connection fails from now on, and every
    /// waiter wakes. `why` is a stable reason code (`session_revoked`). A second throw keeps
    /// the first reason.
    pub fn throw(&self, why: &'static str) {
        self.armed.store(true, Ordering::Release);
        let _ = self.why.set(why);
        let _ = self.at.set(Instant::now());
        self.thrown.store(true, Ordering::Release);
        self.read.wake();
        self.write.wake();
        self.notify.notify_waiters();
    }

    /// Arms the switch: from now on waiters are kept, so a throw wakes them. Called when
    /// something that may throw it is attached; a waiter polled before then is polled again by
    /// its task's next wake-up, and the IO it guards is cut at once either way.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::Release);
    }

    /// Whether the switch belongs to `owner`: claimed by the first owner asked about, so a
    /// connection that carried one session refuses to carry another.
    pub fn owned_by(&self, owner: &str) -> bool {
        self.owner.get_or_init(|| owner.to_string()) == owner
    }

    /// Whether the switch was thrown.
    pub fn is_thrown(&self) -> bool {
        self.thrown.load(Ordering::Acquire)
    }

    /// The reason it was thrown with, if it was.
    pub fn why(&self) -> Option<&'static str> {
        self.why.get().copied()
    }

    /// Resolves once the switch is thrown (at once if it already was). Unarmed, it registers
    /// nothing: see [`Cut::arm`].
    pub fn thrown(&self) -> Thrown<'_> {
        Thrown {
            cut: self,
            notified: None,
        }
    }

    /// For an IO's `poll_read`: `Ready(Err)` once thrown; otherwise registers the reading task
    /// so a later throw wakes it, and says go on.
    pub fn poll_read_cut(&self, cx: &mut Context<'_>) -> Poll<io::Error> {
        Self::poll_side(self, &self.read, cx)
    }

    /// For an IO's `poll_write` (and flush): as [`Cut::poll_read_cut`], but writes still go
    /// through for [`WRITE_GRACE`] after the throw.
    pub fn poll_write_cut(&self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if self.is_thrown() && self.at.get().is_some_and(|t| t.elapsed() < WRITE_GRACE) {
            return Poll::Pending;
        }
        Self::poll_side(self, &self.write, cx)
    }

    fn poll_side(&self, waker: &AtomicWaker, cx: &mut Context<'_>) -> Poll<io::Error> {
        if !self.armed.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        if self.is_thrown() {
            return Poll::Ready(self.error());
        }
        waker.register(cx.waker());
        // A throw between the check and the registration woke nobody: look again.
        if self.is_thrown() {
            return Poll::Ready(self.error());
        }
        Poll::Pending
    }

    /// The error a cut connection's IO returns.
    pub fn error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!("connection cut: {}", self.why().unwrap_or("cut")),
        )
    }
}

/// The future of [`Cut::thrown`].
pub struct Thrown<'a> {
    cut: &'a Cut,
    /// Made once the switch is armed, so an unarmed switch costs no allocation.
    notified: Option<std::pin::Pin<Box<tokio::sync::futures::Notified<'a>>>>,
}

impl std::future::Future for Thrown<'_> {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let cut = self.cut;
        if !cut.armed.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        loop {
            if cut.is_thrown() {
                return Poll::Ready(());
            }
            let notified = self.notified.get_or_insert_with(|| {
                let mut n = Box::pin(cut.notify.notified());
                n.as_mut().enable();
                n
            });
            // Enabled before the check above was repeated: a throw in between is not missed.
            if cut.is_thrown() {
                return Poll::Ready(());
            }
            match notified.as_mut().poll(cx) {
                Poll::Ready(()) => self.notified = None,
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_waiter_wakes_when_thrown_and_the_first_reason_stays() {
        let cut = Arc::new(Cut::default());
        cut.arm();
        let waiter = tokio::spawn({
            let cut = cut.clone();
            async move { cut.thrown().await }
        });
        tokio::task::yield_now().await;
        assert!(!cut.is_thrown());
        cut.throw("session_revoked");
        cut.throw("session_expired");
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter)
            .await
            .expect("woken")
            .expect("joined");
        assert_eq!(cut.why(), Some("session_revoked"));
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        match cut.poll_read_cut(&mut cx) {
            Poll::Ready(e) => {
                assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
                assert!(e.to_string().contains("session_revoked"));
            }
            Poll::Pending => panic!("a thrown cut must fail reads"),
        }
    }

    #[test]
    fn writes_go_through_for_a_moment_after_a_throw_reads_never() {
        let cut = Cut::default();
        cut.arm();
        cut.throw("session_revoked");
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(cut.poll_write_cut(&mut cx).is_pending());
        assert!(cut.poll_read_cut(&mut cx).is_ready());
        std::thread::sleep(WRITE_GRACE + Duration::from_millis(20));
        assert!(cut.poll_write_cut(&mut cx).is_ready());
    }

    #[test]
    fn an_unarmed_cut_keeps_no_waker_and_an_armed_one_does() {
        let cut = Cut::default();
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(cut.poll_read_cut(&mut cx).is_pending());
        assert!(cut.read.take().is_none(), "unarmed: nothing registered");
        cut.arm();
        assert!(cut.poll_read_cut(&mut cx).is_pending());
        assert!(
            cut.read.take().is_some(),
            "armed: the reader is kept for a throw"
        );
    }

    #[test]
    fn an_unthrown_cut_lets_io_wait() {
        let cut = Cut::default();
        cut.arm();
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(cut.poll_write_cut(&mut cx).is_pending());
        assert_eq!(cut.why(), None);
    }
}

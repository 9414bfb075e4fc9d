//! A request body on its way from the sandbox to the upstream: read before dialing when a
//! feature needs it (or it is small and already there), held whole with its budget charge,
//! streamed through the leak [`Detector`] otherwise, cut when it stops arriving, drained after a
//! refusal. The checks themselves live in `secrets`; this is the body plumbing around them.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::broker::RequestCx;
use super::budget::{Charge, OverBudget};
use crate::reason::{Reason, Refusal};
use crate::secrets::detector::Detector;
use crate::upstream::BoxError;

/// A body no larger than this that has already arrived with the head is held whole and checked
/// before dialing, so a small leak never even opens an upstream connection.
pub const PEEK_LIMIT: usize = 64 * 1024;

/// How long to wait for the first body bytes before streaming anyway (a client may wait for
/// the response before it sends).
const PEEK_WAIT: Duration = Duration::from_millis(200);

/// A refusal raised while a body streams upstream; found in the client's error chain and turned
/// into the refusal it carries.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct BodyRefused {
    pub reason: Reason,
    pub message: String,
}

impl From<Refusal> for BodyRefused {
    fn from(r: Refusal) -> Self {
        Self {
            reason: r.reason,
            message: r.message,
        }
    }
}

pin_project_lite::pin_project! {
    /// A buffered prefix, then the rest of the body, all through the detector; the prefix's
    /// budget charge is released when the body is dropped.
    pub struct Prefixed {
        pub prefix: Option<Bytes>,
        // Taken on a refusal, to drain what the client still sends (see `drain`).
        pub inner: Option<Progress<Incoming>>,
        pub detector: Detector,
        pub charge: Option<Charge>,
        // Where a refusal is left for the pipeline (an h2 upstream sees only a reset).
        slot: Arc<OnceLock<BodyRefused>>,
        // Trailers waiting behind the held-back bytes; then the end.
        queued: Option<HeaderMap>,
        done: bool,
    }

    impl PinnedDrop for Prefixed {
        fn drop(this: Pin<&mut Self>) {
            // Dropped unread (a refusal, an upstream that failed or answered early): the
            // client still gets its answer, not a reset.
            if let Some(rest) = this.project().inner.take() {
                drain_later(rest);
            }
        }
    }
}

impl Prefixed {
    pub fn new(
        prefix: Bytes,
        inner: Progress<Incoming>,
        detector: Detector,
        charge: Charge,
        slot: Arc<OnceLock<BodyRefused>>,
    ) -> Self {
        Self {
            prefix: Some(prefix),
            inner: Some(inner),
            detector,
            charge: Some(charge),
            slot,
            queued: None,
            done: false,
        }
    }
}

impl HttpBody for Prefixed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let slot: &OnceLock<BodyRefused> = this.slot;
        let fail = |inner: &mut Option<Progress<Incoming>>, r: Refusal| {
            let r = BodyRefused::from(r);
            let _ = slot.set(r.clone());
            if let (Some(rest), Ok(rt)) = (inner.take(), tokio::runtime::Handle::try_current()) {
                rt.spawn(drain(rest));
            }
            Poll::Ready(Some(Err(Box::new(r) as BoxError)))
        };
        loop {
            if let Some(t) = this.queued.take() {
                return Poll::Ready(Some(Ok(Frame::trailers(t))));
            }
            if *this.done {
                return Poll::Ready(None);
            }
            if let Some(p) = this.prefix.take() {
                let out = match this.detector.push(p) {
                    Ok(out) => out,
                    Err(r) => return fail(this.inner, r),
                };
                // The prefix's memory goes with it.
                this.charge.take();
                if !out.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
                continue;
            }
            let Some(inner) = this.inner.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(Pin::new(inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => match this.detector.push(data) {
                        Ok(out) if out.is_empty() => continue,
                        Ok(out) => return Poll::Ready(Some(Ok(Frame::data(out)))),
                        Err(r) => return fail(this.inner, r),
                    },
                    Err(frame) => {
                        let Ok(trailers) = frame.into_trailers() else {
                            continue;
                        };
                        let held = match this
                            .detector
                            .finish()
                            .and_then(|held| this.detector.trailers(&trailers).map(|()| held))
                        {
                            Ok(held) => held,
                            Err(r) => return fail(this.inner, r),
                        };
                        *this.done = true;
                        if held.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                        }
                        *this.queued = Some(trailers);
                        return Poll::Ready(Some(Ok(Frame::data(held))));
                    }
                },
                Some(Err(e)) => {
                    if let Some(r) = e.downcast_ref::<BodyRefused>() {
                        let _ = slot.set(r.clone());
                    }
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    *this.done = true;
                    match this.detector.finish() {
                        Ok(held) if held.is_empty() => return Poll::Ready(None),
                        Ok(held) => return Poll::Ready(Some(Ok(Frame::data(held)))),
                        Err(r) => return fail(this.inner, r),
                    }
                }
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// The rest of a request body not sent on: dropped unread, it is drained in the background
/// ([`drain_later`]), so every refusal that comes after the body was taken from the pipeline
/// still reaches the client as an answer (an h2 stream whose body is dropped unread is reset).
pub struct Rest(Option<Progress<Incoming>>);

impl Rest {
    pub fn new(rest: Option<Progress<Incoming>>) -> Self {
        Self(rest)
    }

    /// Whether a rest remains.
    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }

    /// The rest, to be sent on.
    pub fn take(&mut self) -> Option<Progress<Incoming>> {
        self.0.take()
    }
}

impl Drop for Rest {
    fn drop(&mut self) {
        if let Some(rest) = self.0.take() {
            drain_later(rest);
        }
    }
}

/// [`drain`] on its own task, for a body dropped where nothing can wait: the answer goes out
/// while the client finishes sending (an h2 stream stays open until then, so it is not reset).
pub fn drain_later(rest: Progress<Incoming>) {
    if rest.is_end_stream() {
        return;
    }
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(drain(rest));
    }
}

/// Reads and discards the rest of a refused upload (bounded in size and time), so the client
/// reads the refusal instead of a reset: answering an h2 stream whose body is still open makes
/// some clients (curl) report a framing error, and an HTTP/1.1 close with unread bytes becomes a
/// TCP reset that can swallow the answer.
pub async fn drain(mut body: Progress<Incoming>) {
    const LIMIT: usize = 1024 * 1024;
    let read = async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > LIMIT {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), read).await;
}

pin_project_lite::pin_project! {
    /// A body held whole (and its trailers), with the budget charge for its bytes: released
    /// when the body has been sent or is dropped.
    pub struct Whole {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
        charge: Option<Charge>,
    }
}

impl Whole {
    pub fn new(data: Bytes, trailers: Option<HeaderMap>, charge: Charge) -> Self {
        Self {
            data: Some(data).filter(|d| !d.is_empty()),
            trailers,
            charge: Some(charge),
        }
    }
}

impl HttpBody for Whole {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Some(d) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        if let Some(t) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        this.charge.take();
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.data, &self.trailers) {
            // With trailers the length stays open, so HTTP/1.1 sends them chunked.
            (_, Some(_)) => SizeHint::default(),
            (Some(d), None) => SizeHint::with_exact(d.len() as u64),
            (None, None) => SizeHint::with_exact(0),
        }
    }
}

/// The least a request body must bring per `--body-timeout` of waiting: a client trickling a
/// byte just inside the timeout would otherwise hold its connection (and any buffer charged to
/// it) forever.
pub const MIN_BODY_PROGRESS: usize = 1024;

pin_project_lite::pin_project! {
    /// The sandbox's request body, cut when fewer than [`MIN_BODY_PROGRESS`] bytes arrive in
    /// `timeout` of latchkey waiting for them (time the upstream takes to read does not count):
    /// a body that stops, and one that trickles.
    pub struct Progress<B> {
        #[pin]
        inner: B,
        timeout: Duration,
        // Boxed so the body stays `Unpin` (it is read with `.frame()` before dialing).
        sleep: Pin<Box<tokio::time::Sleep>>,
        waiting: bool,
        // Waiting time and bytes since the body last made `MIN_BODY_PROGRESS`.
        waited: Duration,
        since: usize,
        wait_started: tokio::time::Instant,
    }
}

impl<B> Progress<B> {
    pub fn new(inner: B, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            sleep: Box::pin(tokio::time::sleep(timeout)),
            waiting: false,
            waited: Duration::ZERO,
            since: 0,
            wait_started: tokio::time::Instant::now(),
        }
    }
}

impl<B> HttpBody for Progress<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if !*this.waiting {
            let now = tokio::time::Instant::now();
            *this.wait_started = now;
            let left = this.timeout.saturating_sub(*this.waited);
            this.sleep.as_mut().reset(now + left);
            *this.waiting = true;
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(frame) => {
                *this.waiting = false;
                *this.waited += this.wait_started.elapsed();
                let n = match &frame {
                    Some(Ok(f)) => f.data_ref().map_or(MIN_BODY_PROGRESS, |d| d.len()),
                    _ => MIN_BODY_PROGRESS,
                };
                *this.since = this.since.saturating_add(n);
                if *this.since >= MIN_BODY_PROGRESS {
                    *this.waited = Duration::ZERO;
                    *this.since = 0;
                }
                Poll::Ready(frame.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                ready!(std::future::Future::poll(this.sleep.as_mut(), cx));
                Poll::Ready(Some(Err(Box::new(BodyRefused {
                    reason: Reason::BodyTimeout,
                    message: format!(
                        "the client sent fewer than {MIN_BODY_PROGRESS} request body bytes in {}s (--body-timeout)",
                        this.timeout.as_secs_f64()
                    ),
                }))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body as read before dialing.
pub(super) enum Read {
    /// All of it, and its trailers.
    Whole(Bytes, Option<HeaderMap>, Charge),
    /// What was read, and the rest, still to come.
    Partial(Bytes, Progress<Incoming>, Charge),
    /// A feature needs the whole body but holding it would pass the budget: what was read, the
    /// rest, and why.
    OverBudget(Bytes, Progress<Incoming>, Charge, OverBudget),
}

fn read_error(e: BoxError) -> Refusal {
    match e.downcast_ref::<BodyRefused>() {
        Some(r) => Refusal::new(r.reason, r.message.clone()),
        None => Refusal::new(
            Reason::BadRequest,
            format!("cannot read the request body: {e}"),
        ),
    }
}

/// What reading a body needs to know: who is charged for what it holds, and how long it may
/// stall.
#[derive(Clone, Copy)]
pub(super) struct BodyCx<'a> {
    pub budget: &'a std::sync::Arc<super::budget::Budget>,
    pub client: std::net::IpAddr,
    pub body_timeout: Duration,
}

impl<'a> From<&'a RequestCx<'a>> for BodyCx<'a> {
    fn from(req: &'a RequestCx<'a>) -> Self {
        Self {
            budget: req.budget,
            client: req.client,
            body_timeout: req.body_timeout,
        }
    }
}

/// A request body as the broker receives it: still arriving, or already held whole (a request
/// that waited for approval was read before it was asked about).
pub enum Inbound {
    Streaming(Incoming),
    Held(Bytes, Option<HeaderMap>, Charge),
}

impl Inbound {
    /// Whether there is nothing (more) to read.
    pub fn is_end_stream(&self) -> bool {
        match self {
            Inbound::Streaming(i) => i.is_end_stream(),
            Inbound::Held(b, t, _) => b.is_empty() && t.is_none(),
        }
    }

    /// Reads (and drops) what the client is still sending, so it reads the refusal.
    pub async fn drain(self, body_timeout: Duration) {
        if let Inbound::Streaming(i) = self {
            drain(Progress::new(i, body_timeout)).await;
        }
    }
}

/// Why a body a feature needs whole was not held: over the feature's cap, or over the buffer
/// budget (and why).
pub(super) enum NotHeld<'a> {
    TooLarge,
    TooBusy(&'a OverBudget),
}

/// The one way a body is held whole before dialing (an approval's question, an MCP message's
/// check, a metered call's price): at most `cap` bytes, every byte charged to the buffer budget.
///
/// Guarantees: on `Ok`, the body and its trailers, held ([`Inbound::Held`]) with their charge.
/// Over `cap` the refusal is `body_too_large`, over the budget `too_busy`, each worded by
/// `words`; the rest of the body is read and dropped first, so the client reads the refusal.
pub(super) async fn hold_whole(
    incoming: Incoming,
    headers: &HeaderMap,
    cap: usize,
    cx: BodyCx<'_>,
    words: impl FnOnce(NotHeld<'_>) -> String,
) -> Result<Inbound, Refusal> {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match read_body(incoming, Some(cap), declared, cx).await? {
        Read::Whole(b, t, c) => Ok(Inbound::Held(b, t, c)),
        Read::Partial(_, rest, _) => {
            drain(rest).await;
            Err(Refusal::new(Reason::BodyTooLarge, words(NotHeld::TooLarge)))
        }
        Read::OverBudget(_, rest, _, why) => {
            drain(rest).await;
            Err(Refusal::new(Reason::TooBusy, words(NotHeld::TooBusy(&why))))
        }
    }
}

/// Reads what must be read before dialing: the whole body up to `need` bytes when a feature
/// needs it (the rest streams if it is longer), else only a small body already there (up to
/// [`PEEK_LIMIT`], waiting at most [`PEEK_WAIT`] for its first bytes). Every byte held is
/// charged to the budget; the buffer grows by doubling, charged by capacity.
pub(super) async fn read_body(
    incoming: Incoming,
    need: Option<usize>,
    declared: Option<u64>,
    cx: BodyCx<'_>,
) -> Result<Read, Refusal> {
    let mut body = Progress::new(incoming, cx.body_timeout);
    let mut charge = cx.budget.start(cx.client);
    if body.is_end_stream() {
        return Ok(Read::Whole(Bytes::new(), None, charge));
    }
    let (limit, peek) = match need {
        Some(n) => (n, false),
        None => (PEEK_LIMIT, true),
    };
    // Known to be too large: stream from the first byte.
    if declared.is_some_and(|d| d > limit as u64) {
        return Ok(Read::Partial(Bytes::new(), body, charge));
    }
    let mut buf: Vec<u8> = Vec::new();
    // A declared length is charged (and allocated) at once: no doubling, no surprise later.
    if let Some(d) = declared.and_then(|d| usize::try_from(d).ok()) {
        match charge.resize(d) {
            Ok(()) => buf.reserve_exact(d),
            Err(_) if peek => return Ok(Read::Partial(Bytes::new(), body, charge)),
            Err(e) => return Ok(Read::OverBudget(Bytes::new(), body, charge, e)),
        }
    }
    let mut first = true;
    loop {
        let next = if peek {
            // The first bytes may trail the head a little; after them, only what is there.
            let wait = if first { PEEK_WAIT } else { Duration::ZERO };
            match tokio::time::timeout(wait, body.frame()).await {
                Ok(next) => next,
                Err(_) => return Ok(Read::Partial(Bytes::from(buf), body, charge)),
            }
        } else {
            body.frame().await
        };
        first = false;
        let data = match next {
            None => {
                let _ = charge.resize(buf.capacity());
                return Ok(Read::Whole(Bytes::from(buf), None, charge));
            }
            Some(Err(e)) => return Err(read_error(e)),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    let trailers = frame.into_trailers().ok();
                    let _ = charge.resize(buf.capacity());
                    return Ok(Read::Whole(Bytes::from(buf), trailers, charge));
                }
            },
        };
        let needed = buf.len() + data.len();
        if needed > buf.capacity() {
            let grown = needed.max(buf.capacity() * 2).min(limit.max(needed));
            if let Err(e) = charge.resize(grown) {
                // The frame is read already: it goes first in the stream (one frame over the
                // budget at most, for as long as it takes to send it).
                buf.extend_from_slice(&data);
                let prefix = Bytes::from(buf);
                return Ok(if peek {
                    Read::Partial(prefix, body, charge)
                } else {
                    Read::OverBudget(prefix, body, charge, e)
                });
            }
            buf.reserve_exact(grown - buf.len());
        }
        buf.extend_from_slice(&data);
        if buf.len() > limit {
            // Longer than what is held whole: the rest streams behind it.
            return Ok(Read::Partial(Bytes::from(buf), body, charge));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte every 0.7 s of a 1 s timeout is cut; 1 KiB every 0.7 s is not.
    #[tokio::test(start_paused = true)]
    async fn a_trickling_body_is_cut_by_the_minimum_progress() {
        for (size, cut) in [(1usize, true), (MIN_BODY_PROGRESS, false)] {
            let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
            tokio::spawn(async move {
                for _ in 0..10 {
                    tokio::time::sleep(Duration::from_millis(700)).await;
                    if tx.send(Bytes::from(vec![b'x'; size])).await.is_err() {
                        return;
                    }
                }
            });
            let mut body = Progress::new(Chan(rx), Duration::from_secs(1));
            let mut frames = 0;
            let mut failed = false;
            while let Some(f) = body.frame().await {
                match f {
                    Ok(_) => frames += 1,
                    Err(e) => {
                        failed = true;
                        assert!(e.to_string().contains("--body-timeout"), "{e}");
                        break;
                    }
                }
            }
            assert_eq!(failed, cut, "{size}-byte frames: {frames} read");
            if cut {
                assert!(frames <= 2, "{frames}");
            }
        }
    }

    /// A body fed frame by frame from a channel.
    struct Chan(tokio::sync::mpsc::Receiver<Bytes>);

    impl HttpBody for Chan {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            self.0.poll_recv(cx).map(|f| f.map(|b| Ok(Frame::data(b))))
        }
    }
}

//! Body wrappers: count bytes each way and finish the audit record when the response ends.
//!
//! They carry an [`Entry`] to its end and never decide anything; nothing here depends on policy.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;

use crate::audit::{Counters, Entry};
use crate::upstream::{Body, BoxError};

pin_project_lite::pin_project! {
    /// Counts data bytes into a counter as they stream through.
    pub struct Counted<B> {
        #[pin]
        inner: B,
        counters: Arc<Counters>,
        up: bool,
    }
}

impl<B> HttpBody for Counted<B>
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
        let up = self.up;
        let counters = self.counters.clone();
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if let Some(Ok(f)) = &frame {
            if let Some(data) = f.data_ref() {
                let c = if up { &counters.up } else { &counters.down };
                c.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
        }
        Poll::Ready(frame.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Wraps the sandbox's request body so its bytes count as `bytes_up`.
pub fn count_up<B>(body: B, counters: Arc<Counters>) -> Body
where
    B: HttpBody<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    Counted {
        inner: body,
        counters,
        up: true,
    }
    .boxed()
}

pin_project_lite::pin_project! {
    /// The response body sent to the sandbox: counts `bytes_down` and writes the audit record
    /// when the body ends, fails or is dropped — whichever comes first, exactly once.
    pub struct Audited<B> {
        #[pin]
        inner: B,
        counters: Arc<Counters>,
        entry: Finisher,
    }
}

/// Writes the record once: when the body ends, fails or is dropped. A request body refused
/// after the response had started (a leak found mid-upload, a stalled client) is why the
/// exchange ended, whatever the response stream says.
struct Finisher {
    entry: Option<Entry>,
    request_refused: Option<Arc<std::sync::OnceLock<super::request_body::BodyRefused>>>,
    /// Runs on the entry just before it is written (the limits' settle).
    on_finish: Option<FinishHook>,
}

/// What runs on a response's record when its body ends: it may fill in fields only known
/// then (usage, limits settled).
pub type FinishHook = Box<dyn FnOnce(&mut Entry) + Send + Sync>;

impl Finisher {
    fn finish(&mut self, reason: Option<crate::reason::Reason>) {
        let Some(mut entry) = self.entry.take() else {
            return;
        };
        let refused = self
            .request_refused
            .as_ref()
            .and_then(|slot| slot.get())
            .map(|r| r.reason);
        if let Some(reason) = refused.or(reason) {
            entry.set_reason(reason);
        }
        if let Some(hook) = self.on_finish.take() {
            hook(&mut entry);
        }
    }
}

impl Drop for Finisher {
    fn drop(&mut self) {
        self.finish(None);
    }
}

impl<B> HttpBody for Audited<B>
where
    B: HttpBody<Data = Bytes, Error = BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(data) = f.data_ref() {
                    this.counters
                        .down
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                }
            }
            Some(Err(err)) => {
                // A body the response phase cut off says why; anything else is the upstream's.
                let reason = refusal_in(err.as_ref())
                    .map_or(crate::reason::Reason::UpstreamError, |r| r.reason);
                this.entry.finish(Some(reason));
            }
            None => this.entry.finish(None),
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The refusal that cut a body off, if that is what this error is (or wraps).
pub(super) fn refusal_in<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a super::request_body::BodyRefused> {
    crate::reason::find_cause(err)
}

/// Wraps a response body so the audit record is written when it finishes. `request_refused`
/// is where the request body's detector leaves its refusal, if it aborted the upload.
pub fn audited(
    body: Body,
    entry: Entry,
    request_refused: Option<Arc<std::sync::OnceLock<super::request_body::BodyRefused>>>,
    on_finish: Option<FinishHook>,
) -> Body {
    let counters = entry.counters();
    Audited {
        inner: body,
        counters,
        entry: Finisher {
            entry: Some(entry),
            request_refused,
            on_finish,
        },
    }
    .boxed()
}

/// A complete in-memory body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub fn empty() -> Body {
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed()
}

//! The limits phase: a request is charged to the `[limits]` its rule, identity and credential
//! name before it is sent (`governance::limits`), and the charge is settled when its response
//! ends.
//!
//! For a model-provider call under a token or spend budget the body is read whole first
//! (bounded by [`MAX_METERED_BODY`], charged to `--max-buffered-bytes`), so the reservation
//! can use the model and the most output tokens it asks for; its response is asked for without
//! compression, so its usage can be read as it streams ([`Metered`]).

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT_ENCODING, CONTENT_LENGTH};
use http::request::Parts;
use http_body::{Body as HttpBody, Frame, SizeHint};

use super::super::request_body::{hold_whole, BodyCx, BodyRefused, Inbound, NotHeld};
use super::admit::Admitted;
use super::outgoing::Outgoing;
use super::request::Req;
use crate::audit::Entry;
use crate::governance::limits::{Admission, Estimate, LlmEstimate, Subject, Upload};
use crate::governance::usage::{self, Meter, Provider, Usage};
use crate::policy::PriceTable;
use crate::reason::{Reason, Refusal};
use crate::upstream::{Body, BoxError};
use crate::wire::host::authority_len;

/// The largest model-provider request body read whole to price it.
pub const MAX_METERED_BODY: usize = 8 * 1024 * 1024;

/// Charges the request to its limits, or refuses it.
///
/// Assumes: policy allowed the request under its rule (and a person, if it asked).
/// Guarantees: the body is taken for the broker (`req.inbound`); when limits apply, every limit
/// has room for the request's reservation, the record lists the charges and `req.admission`
/// holds them (it must live until the response ends: dropping it early returns the
/// reservations). On `Err`, nothing is charged and nothing was sent.
pub(super) async fn charge(req: &mut Req<'_>) -> Result<(), Refusal> {
    let incoming = req.take_inbound()?;
    let (proxy, policy, rule) = (req.proxy, req.policy, req.rule());
    let mut limits = policy.limits_for(rule, req.identity);
    // A session's lowered limits count per session, on top of its profile's.
    let scoped = req.scoped.clone();
    limits.extend(scoped.iter().flat_map(|s| s.narrowing.limits.iter()));
    if limits.is_empty() {
        req.inbound = Some(incoming);
        return Ok(());
    }
    let under = |r: Refusal| r.under(&rule.name);
    let Some(limiter) = proxy.limiter() else {
        incoming.drain(proxy.body_timeout).await;
        return Err(under(Refusal::new(
            Reason::LimitsUnavailable,
            "this request is under [limits], and latchkey has no state store to count them in",
        )));
    };
    let provider = limits
        .iter()
        .any(|l| l.meters_llm())
        .then(|| Provider::detect(&req.head.method, req.target.path()))
        .flatten();
    let mut incoming = incoming;
    let llm = match provider {
        Some(provider) => {
            let (held, estimate) = price(req, &limits, incoming, provider)
                .await
                .map_err(under)?;
            incoming = held;
            Some(estimate)
        }
        None => None,
    };
    // A WebSocket's messages stream after the handshake: they are reserved as they go.
    let bytes_up = match &incoming {
        _ if req.upgrading() => None,
        Inbound::Held(b, t, _) => Some(b.len() as u64 + t.as_ref().map_or(0, fields_len)),
        Inbound::Streaming(i) if i.is_end_stream() => Some(0),
        Inbound::Streaming(_) => req
            .head
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok()),
    };
    let host = rule.host_for(&req.target.host);
    let request_id = req.entry.id().to_string();
    let who = Subject {
        session: req.ctx.session.as_ref().map(|l| l.id.as_str()),
        identity: &req.ctx.identity,
        rule: &rule.name,
        credential: rule.credential.as_deref(),
        host: &host,
        request_id: &request_id,
    };
    let estimate = Estimate {
        head_up: head_len(&req.head, &req.target),
        bytes_up,
        llm,
    };
    match limiter.admit(&limits, who, &estimate).await {
        Ok(admission) => {
            record_admitted(req.entry, &admission);
            req.inbound = Some(incoming);
            req.admission = Some(admission);
            Ok(())
        }
        // The body was taken from the pipeline: read what the client still sends, so it reads
        // the refusal (an h2 stream whose body is dropped unread is reset, not answered).
        Err(refused) => {
            incoming.drain(proxy.body_timeout).await;
            Err(record_refused(req.entry, *refused).under(&rule.name))
        }
    }
}

/// Reads a model-provider call's body whole and prices it: the model and the most output
/// tokens it asks for (a streamed OpenAI chat call is asked to include its usage where a limit
/// says so); its response is asked for uncompressed, so its usage can be read as it streams.
async fn price(
    req: &mut Req<'_>,
    limits: &[&crate::policy::limits::Limit],
    incoming: Inbound,
    provider: Provider,
) -> Result<(Inbound, LlmEstimate), Refusal> {
    let (held, facts_body) = hold(req, incoming).await?;
    let path = req.target.path();
    let facts = usage::inspect_request(provider, path, &facts_body);
    let mut body = facts_body;
    if provider == Provider::OpenAiChat
        && limits.iter().any(|l| l.include_usage)
        && facts.stream
        && !facts.includes_usage
    {
        if let Some(changed) = usage::add_include_usage(&body) {
            body = Bytes::from(changed);
            req.head
                .headers
                .insert(CONTENT_LENGTH, HeaderValue::from(body.len() as u64));
        }
    }
    let incoming = match held {
        Inbound::Held(_, trailers, charge) => Inbound::Held(body, trailers, charge),
        streaming => streaming,
    };
    // Usage is read from the response as it streams: it must come uncompressed.
    req.head
        .headers
        .insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    let reserve = limits
        .iter()
        .filter(|l| l.meters_llm())
        .map(|l| l.reserve_tokens)
        .max()
        .unwrap_or(crate::policy::limits::DEFAULT_RESERVE_TOKENS);
    let output = facts.output_reserve(reserve);
    let input = facts.input_estimate;
    let cost = facts
        .model
        .as_deref()
        .and_then(|m| req.policy.prices().lookup(m))
        .map(|(_, p)| p.cost_micros(input, 0, output));
    let estimate = LlmEstimate {
        provider,
        model: facts.model.clone(),
        tokens: input.saturating_add(output),
        cost_micros: cost,
    };
    Ok((incoming, estimate))
}

/// The bytes of a request's head as `bytes_up` counts them: the request line, the `Host` line
/// and every header the sandbox sent, each `name: value` with its CRLF, and the blank line,
/// written as HTTP/1.1 whatever the version it came in. Headers latchkey adds (credentials it
/// injects) are not the sandbox's bytes and are not counted; hop-by-hop headers it strips are.
pub(super) fn head_len(head: &Parts, target: &Admitted) -> u64 {
    let line = head.method.as_str().len() + 1 + target.path_and_query.len() + " HTTP/1.1\r\n".len();
    let host = "host: ".len() + authority_len(&target.host, target.port) + 2;
    let headers = head
        .headers
        .iter()
        .filter(|(n, _)| *n != http::header::HOST)
        .map(|(n, v)| n.as_str().len() + 2 + v.len() + 2)
        .sum::<usize>();
    (line + host + headers + 2) as u64
}

/// The bytes of a trailer or header block as `bytes_up` counts them (`name: value\r\n` each).
pub(crate) fn fields_len(fields: &http::HeaderMap) -> u64 {
    fields
        .iter()
        .map(|(n, v)| (n.as_str().len() + 2 + v.len() + 2) as u64)
        .sum()
}

/// Puts an admission's charges and rate headers on the record (requests and tunnels alike).
pub(crate) fn record_admitted(entry: &mut Entry, admission: &Admission) {
    entry.set_limits(admission.charges().to_vec());
    if let Some(rate) = admission.rate() {
        entry.set_rate_headers(rate.limit, rate.remaining, rate.reset);
    }
}

/// Puts a refused admission's charges and retry headers on the record; the refusal to answer.
pub(crate) fn record_refused(
    entry: &mut Entry,
    refused: crate::governance::limits::Refused,
) -> Refusal {
    entry.set_limits(refused.charges);
    if let Some(secs) = refused.retry_after {
        entry.set_retry_after(secs);
    }
    if let Some(rate) = refused.rate {
        entry.set_rate_headers(rate.limit, rate.remaining, rate.reset);
    }
    refused.refusal
}

/// Reads a model-provider call's body whole (it is small: a prompt), so it can be priced.
async fn hold(req: &Req<'_>, incoming: Inbound) -> Result<(Inbound, Bytes), Refusal> {
    let streaming = match incoming {
        Inbound::Held(b, t, c) => {
            let copy = b.clone();
            return Ok((Inbound::Held(b, t, c), copy));
        }
        Inbound::Streaming(s) => s,
    };
    let (proxy, host) = (req.proxy, &req.target.host);
    let cx = BodyCx {
        budget: &proxy.budget,
        client: req.ctx.client.ip(),
        body_timeout: proxy.body_timeout,
    };
    let held = hold_whole(streaming, &req.head.headers, MAX_METERED_BODY, cx, |why| match why {
        NotHeld::TooLarge => format!(
            "a model-provider call under a token or spend budget is read whole to price it, and this body to {host} is over {} MiB",
            MAX_METERED_BODY / (1024 * 1024)
        ),
        NotHeld::TooBusy(why) => format!(
            "cannot hold this model-provider call's body for host {host} to price it: {why}; retry later"
        ),
    })
    .await?;
    let copy = match &held {
        Inbound::Held(b, _, _) => b.clone(),
        Inbound::Streaming(_) => Bytes::new(),
    };
    Ok((held, copy))
}

/// The upload limiter: under a `bytes_up` budget the request body is charged frame by frame as
/// it goes ([`limit_upload`]). A WebSocket handshake has no body: its messages are charged by
/// the relay.
pub(super) fn meter_upload(req: &Req<'_>, mut out: Outgoing) -> Outgoing {
    let upload = req.admission.as_ref().and_then(Admission::upload);
    if let Some(upload) = upload.filter(|_| !req.upgrading()) {
        let refused = out.plan.body_refused.clone();
        out.request = out.request.map(|b| limit_upload(b, upload, refused));
    }
    out
}

/// The request body of a streamed upload under a `bytes_up` budget: each frame is charged
/// before it goes; when the budget has no room the upload is cut off and the record says
/// `budget_exhausted`.
fn limit_upload(
    body: Body,
    upload: Arc<Upload>,
    refused: Arc<std::sync::OnceLock<BodyRefused>>,
) -> Body {
    use http_body_util::BodyExt;
    LimitedUpload {
        inner: body,
        upload,
        refused,
        pending: None,
    }
    .boxed()
}

/// A reservation in progress. In a `Mutex` only so the body is `Sync` (the store's futures
/// are `Send` only); it is polled through `get_mut`, never locked.
type Grow = Mutex<Pin<Box<dyn std::future::Future<Output = Result<(), Refusal>> + Send>>>;

struct LimitedUpload {
    inner: Body,
    upload: Arc<Upload>,
    refused: Arc<std::sync::OnceLock<BodyRefused>>,
    /// A frame waiting for its reservation.
    pending: Option<(Frame<Bytes>, Grow)>,
}

impl HttpBody for LimitedUpload {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some((_, grow)) = this.pending.as_mut() {
            let grow = grow.get_mut().unwrap_or_else(PoisonError::into_inner);
            return match grow.as_mut().poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(())) => {
                    let frame = this.pending.take().map(|(f, _)| f);
                    Poll::Ready(frame.map(Ok))
                }
                Poll::Ready(Err(refusal)) => {
                    this.pending = None;
                    let refused = BodyRefused::from(refusal);
                    let _ = this.refused.set(refused.clone());
                    Poll::Ready(Some(Err(Box::new(refused))))
                }
            };
        }
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        let len = match (frame.data_ref(), frame.trailers_ref()) {
            (Some(d), _) => d.len() as u64,
            (None, Some(t)) => fields_len(t),
            (None, None) => 0,
        };
        if len == 0 || this.upload.fits(len) {
            this.upload.sent(len);
            return Poll::Ready(Some(Ok(frame)));
        }
        let upload = this.upload.clone();
        let grow: Grow = Mutex::new(Box::pin(async move { upload.send(len).await }));
        this.pending = Some((frame, grow));
        self.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What the response meter read, handed from the body to the record.
pub(super) type MeterSlot = Arc<Mutex<Option<Usage>>>;

/// A response body whose usage is read as it passes (never held back: each frame goes on as
/// soon as the meter has seen it).
pub(super) fn meter_response(
    body: Body,
    provider: Provider,
    content_type: Option<&str>,
) -> (Body, MeterSlot) {
    use http_body_util::BodyExt;
    let slot: MeterSlot = Arc::new(Mutex::new(None));
    let metered = Metered {
        inner: body,
        meter: Some(Meter::new(provider, content_type)),
        slot: slot.clone(),
    };
    (metered.boxed(), slot)
}

struct Metered {
    inner: Body,
    meter: Option<Meter>,
    slot: MeterSlot,
}

impl Metered {
    /// Hands what the meter read to the record, once. A stream that ended before its final
    /// usage report (cut short, or dropped by the client) may be billed more than it reported
    /// so far: it hands nothing, and the reservation is charged instead.
    fn conclude(&mut self) {
        if let Some(meter) = self.meter.take() {
            let complete = meter.complete();
            let usage = meter.finish().filter(|_| complete);
            *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = usage;
        }
    }
}

/// Dropped before the record's finisher (it is the inner body), so the settle sees it.
impl Drop for Metered {
    fn drop(&mut self) {
        self.conclude();
    }
}

impl HttpBody for Metered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(meter), Some(data)) = (this.meter.as_mut(), frame.data_ref()) {
                    meter.feed(data);
                }
                // A body of known length ends with its last frame: hyper does not poll again.
                if this.inner.is_end_stream() {
                    this.conclude();
                }
            }
            Poll::Ready(None) => this.conclude(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Limit settling, on the answer: the admission's charges are settled when the response body
/// ends ([`settle_when_done`]).
pub(super) fn settle(req: &mut Req<'_>, answer: super::Answer) -> super::Answer {
    match req.admission.take() {
        Some(admission) => settle_when_done(answer, admission, req.policy.prices().clone()),
        None => answer,
    }
}

/// Limit settling, when the request got no response: the reservations go back, but bytes that
/// left stay charged (and an upload its budget cut off says so). Hands the refusal on.
pub(super) fn unsent(req: &mut Req<'_>, refusal: Refusal) -> Refusal {
    if let Some(admission) = req.admission.take() {
        settle_failed(admission, req.entry);
    }
    refusal
}

/// Hooks the admission's settle onto the answer's record: the response body (metered when
/// the call is a model-provider call) ends, then the charges and usage are written with the
/// record.
fn settle_when_done(
    mut answer: super::Answer,
    admission: Admission,
    prices: Arc<PriceTable>,
) -> super::Answer {
    let status = answer.response.status().as_u16();
    let mut slot = None;
    if let Some(llm) = admission.llm() {
        let provider = llm.provider;
        let content_type = answer
            .response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let (parts, body) = answer.response.into_parts();
        let (metered, s) = meter_response(body, provider, content_type.as_deref());
        answer.response = http::Response::from_parts(parts, metered);
        slot = Some(s);
    }
    answer.on_finish = Some(Box::new(move |entry: &mut Entry| {
        let usage = slot.and_then(|s| s.lock().unwrap_or_else(PoisonError::into_inner).take());
        let up = entry
            .counters()
            .up
            .load(std::sync::atomic::Ordering::Relaxed);
        let (charges, info) = admission.settle(up, Some(status), usage.as_ref(), &prices);
        entry.settled(charges, info);
    }));
    answer
}

/// Settles an admission whose request got no response (the upstream failed, or the upload was
/// cut off): the record says what was charged.
fn settle_failed(admission: Admission, entry: &mut Entry) {
    let up = entry
        .counters()
        .up
        .load(std::sync::atomic::Ordering::Relaxed);
    let (charges, _) = admission.settle(up, None, None, &PriceTable::empty());
    entry.set_limits(charges);
}

//! The response phase: what the upstream sent, turned into what the sandbox may see.
//!
//! It sees the upstream's head *as received* and works in a fixed order, because each step
//! needs what the one before it would destroy:
//!
//! 1. transfer codings: only `chunked` (which hyper has undone) is accepted; any other would
//!    hand the sandbox bytes nobody decoded, so it is refused (`uninspectable_body`); a
//!    `Content-Length` next to it is dropped, since the body is reframed;
//! 2. content codings, on a scanned response: decided now, before `Connection` can name
//!    `Content-Encoding` and have it stripped; a coding latchkey cannot decode is refused;
//! 3. hop-by-hop headers stripped, and every `x-latchkey-*` header (an upstream must not forge
//!    latchkey's decision, rule or reason);
//! 4. the reason phrase dropped: the sandbox gets the canonical one for the status;
//! 5. on a scanned response, header names and values, the decoded body and the trailers are
//!    scrubbed; a header or trailer whose *name* holds a secret is dropped.
//!
//! Informational (1xx) responses never reach the sandbox: hyper's client consumes them, and a
//! `101` (which it hands on) is refused here; the one exception, a `101` accepting a WebSocket
//! handshake a rule allowed, is checked by `websocket::Handshake::accept` and never reaches
//! this function. A bodiless response (HEAD, 204, 304) reaches it with
//! its scrubbed head only: data or trailers an upstream sends with one are dropped.
//!
//! Whether to scan is the pipeline's decision (it knows the policy); this module takes the
//! matcher and must not depend on `policy`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;

use super::decode::{self, Coding, DecodeError};
use super::scrub_body;
use crate::audit::Counters;
use crate::reason::{Reason, Refusal};
use crate::secrets::scrub::Scrubber;
use crate::upstream::{Body, BoxError};
use crate::wire::hop;

/// How long the phase waits for a compressed body's first frame before sending the head, so a
/// bomb that arrives with its head is refused with a status rather than cut off mid-body.
const FIRST_FRAME_WAIT: Duration = Duration::from_millis(100);

/// What the response phase needs to know about the request.
pub struct ResponseCx<'a> {
    pub host: &'a str,
    /// A HEAD request: the response has no body whatever its headers say.
    pub is_head: bool,
    /// The scanner for secret values, when this response must be scanned.
    pub scan: Option<Arc<Scrubber>>,
    /// Cap on the decoded size of a scanned body.
    pub max_decoded: u64,
    pub counters: Arc<Counters>,
}

/// Turns the upstream's response into the one the sandbox gets.
///
/// Assumes: `res` is the upstream's response exactly as hyper's client returned it (no header
/// touched yet). Guarantees: on `Ok`, nothing an upstream may not send reaches the sandbox
/// (foreign transfer codings, hop-by-hop or `x-latchkey-*` headers, a forged reason phrase, on
/// a scanned response any secret value); on `Err`, no byte of the response was sent.
pub async fn filter<B>(mut res: Response<B>, cx: ResponseCx<'_>) -> Result<Response<Body>, Refusal>
where
    B: http_body::Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    // 0. a protocol switch that is not an allowed WebSocket's (those never come here): a
    // switch to bytes nobody inspects. Refused.
    if res.status().is_informational() {
        return Err(Refusal::new(
            Reason::UpstreamError,
            format!(
                "{} answered {} to a request that asked for no protocol switch",
                cx.host,
                res.status().as_u16()
            ),
        ));
    }
    // 1. transfer codings, as received.
    if let Some(coding) = foreign_transfer_coding(res.headers()) {
        return Err(Refusal::new(
            Reason::UninspectableBody,
            format!(
                "the response from {} uses transfer coding {coding:?}; latchkey accepts only chunked",
                cx.host
            ),
        ));
    }
    // A `Content-Length` next to `chunked` is overridden by it (RFC 9112 §6.3) and must not
    // be forwarded: hyper has de-chunked the body, and the stale length would frame it anew
    // toward the sandbox (truncating it, or worse on a kept-alive connection).
    if res.headers().contains_key(TRANSFER_ENCODING) {
        res.headers_mut().remove(CONTENT_LENGTH);
    }
    let bodiless = cx.is_head
        || res.status() == StatusCode::NO_CONTENT
        || res.status() == StatusCode::NOT_MODIFIED;

    // 2. content codings, as received (scanned responses only: others pass through as sent).
    let codings = match &cx.scan {
        Some(_) if !bodiless => decode::codings(res.headers()).map_err(|coding| {
            Refusal::new(
                Reason::UninspectableBody,
                format!(
                    "the response from {} is encoded as {:?}, which latchkey cannot inspect for secrets",
                    cx.host,
                    coding.to_string()
                ),
            )
        })?,
        _ => Vec::new(),
    };

    // 3. hop-by-hop and latchkey's own headers; 4. the reason phrase (an extension hyper keeps
    // for a non-canonical phrase), with every other extension of the upstream's.
    hop::strip_response(res.headers_mut());
    strip_own_headers(res.headers_mut());
    *res.extensions_mut() = http::Extensions::new();

    // A bodiless response (HEAD, 204, 304) has no content, whatever frames an upstream sends
    // with it (an h2 upstream can send DATA and trailers anyway): the sandbox gets none of
    // them, scanned or not.
    if bodiless {
        if let Some(scrubber) = &cx.scan {
            let n = scrub_body::filter_headers(res.headers_mut(), scrubber);
            cx.counters
                .redactions
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        return Ok(res.map(|_| {
            http_body_util::Empty::<Bytes>::new()
                .map_err(|never| match never {})
                .boxed()
        }));
    }

    // 5. scrub.
    let Some(scrubber) = cx.scan else {
        return Ok(res.map(|b| b.map_frame(strip_own_trailers).map_err(Into::into).boxed()));
    };
    let n = scrub_body::filter_headers(res.headers_mut(), &scrubber);
    cx.counters
        .redactions
        .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    let (parts, mut body) = res.into_parts();
    let mut first = None;
    if !codings.is_empty() {
        if let Ok(frame) = tokio::time::timeout(FIRST_FRAME_WAIT, body.frame()).await {
            match frame {
                Some(Ok(f)) => {
                    if let Some(data) = f.data_ref() {
                        check_first(&codings, data, cx.max_decoded, cx.host).await?;
                    }
                    first = Some(f);
                }
                Some(Err(e)) => {
                    let e: BoxError = e.into();
                    return Err(Refusal::new(
                        Reason::UpstreamError,
                        format!("reading the response from {}: {e}", cx.host),
                    ));
                }
                None => {}
            }
        }
    }
    let mut res = Response::from_parts(parts, body);
    // The body changes: its length and coding no longer describe it.
    res.headers_mut().remove(CONTENT_LENGTH);
    res.headers_mut().remove(CONTENT_ENCODING);
    let decoder = (!codings.is_empty()).then(|| decode::Decoder::new(&codings, cx.max_decoded));
    Ok(res.map(|b| scrub_body::scrubbed(b, first, decoder, &scrubber, cx.counters)))
}

/// Refuses a body whose first frame alone decodes past the limit, or does not decode.
/// The dry run can inflate up to `limit` bytes, so it runs off the async workers.
async fn check_first(
    codings: &[Coding],
    data: &Bytes,
    limit: u64,
    host: &str,
) -> Result<(), Refusal> {
    let (owned, frame) = (codings.to_vec(), data.clone());
    let checked =
        tokio::task::spawn_blocking(move || decode::check_first_frame(&owned, &frame, limit))
            .await
            .unwrap_or_else(|e| {
                Err(DecodeError::Invalid {
                    coding: "compressed",
                    detail: format!("the decoding check did not finish: {e}"),
                })
            });
    match checked {
        Ok(()) => Ok(()),
        Err(DecodeError::Limit { limit }) => Err(Refusal::new(
            Reason::DecompressionLimit,
            format!("the response from {host} decodes to more than {limit} bytes, latchkey's limit for an inspected body"),
        )),
        Err(e) => Err(Refusal::new(
            Reason::UninspectableBody,
            format!("the response from {host} cannot be decoded for inspection: {e}"),
        )),
    }
}

/// The first transfer coding other than one `chunked`, if any. `chunked` applied twice (in
/// one header or across two) counts as foreign: hyper undoes one layer, and the chunk lines of
/// the other would reach the sandbox undecoded, able to split a secret past the scanner.
fn foreign_transfer_coding(headers: &HeaderMap) -> Option<String> {
    let mut chunked = 0;
    for value in headers.get_all(TRANSFER_ENCODING) {
        let Ok(text) = value.to_str() else {
            return Some("(not ASCII)".to_string());
        };
        for token in text.split(',') {
            let token = token.trim();
            if !token.eq_ignore_ascii_case("chunked") {
                return Some(token.to_string());
            }
            chunked += 1;
            if chunked > 1 {
                return Some("chunked (applied twice)".to_string());
            }
        }
    }
    None
}

/// Removes every `x-latchkey-*` header: only latchkey speaks for latchkey. `_` counts as `-`
/// (`x_latchkey_decision`): CGI-style readers (nginx, WSGI) map both to one name.
pub fn strip_own_headers(headers: &mut HeaderMap) {
    let own: Vec<_> = headers
        .keys()
        .filter(|n| {
            n.as_str().as_bytes().get(..11).is_some_and(|p| {
                p.iter()
                    .zip(b"x-latchkey-")
                    .all(|(a, b)| *a == *b || (*b == b'-' && *a == b'_'))
            })
        })
        .cloned()
        .collect();
    for name in own {
        headers.remove(name);
    }
}

/// A frame of trailers with latchkey's own fields removed (for responses that are not scanned).
pub fn strip_own_trailers(frame: Frame<Bytes>) -> Frame<Bytes> {
    match frame.into_trailers() {
        Ok(mut t) => {
            strip_own_headers(&mut t);
            Frame::trailers(t)
        }
        Err(frame) => frame,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_chunked_is_an_accepted_transfer_coding() {
        let mut h = HeaderMap::new();
        assert_eq!(foreign_transfer_coding(&h), None);
        h.insert(TRANSFER_ENCODING, "Chunked".parse().expect("v"));
        assert_eq!(foreign_transfer_coding(&h), None);
        h.insert(TRANSFER_ENCODING, "gzip, chunked".parse().expect("v"));
        assert_eq!(foreign_transfer_coding(&h), Some("gzip".to_string()));
        h.insert(TRANSFER_ENCODING, "chunked".parse().expect("v"));
        h.append(TRANSFER_ENCODING, "identity".parse().expect("v"));
        assert_eq!(foreign_transfer_coding(&h), Some("identity".to_string()));
        h.insert(TRANSFER_ENCODING, "chunked, Chunked".parse().expect("v"));
        assert!(foreign_transfer_coding(&h).is_some());
        h.insert(TRANSFER_ENCODING, "chunked".parse().expect("v"));
        h.append(TRANSFER_ENCODING, "chunked".parse().expect("v"));
        assert!(foreign_transfer_coding(&h).is_some());
    }

    #[test]
    fn own_headers_are_stripped_whatever_their_case() {
        let mut h = HeaderMap::new();
        h.insert("X-Latchkey-Decision", "allow".parse().expect("v"));
        h.insert("x-latchkey-rule", "forged".parse().expect("v"));
        h.insert("x-latchkeyish", "kept".parse().expect("v"));
        h.insert("x_latchkey_reason", "forged".parse().expect("v"));
        h.insert("x-latchkey_id", "forged".parse().expect("v"));
        strip_own_headers(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-latchkeyish"));
    }
}

//! Response redaction: header names and values, streamed bodies (decoded first when
//! compressed) and trailers.
//!
//! A body is scanned as it streams (the scrubber holds back at most one encoded secret's
//! length), so server-sent events still arrive one by one. Compressed bodies are decoded in
//! bounded slices by [`super::decode`], and the redacted body goes out uncompressed. Trailers
//! are scrubbed like headers, not dropped: gRPC carries its status in them.
//! It takes the matcher it is given and must not depend on `policy` (the pipeline decides
//! whether a response is scanned).

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;

use super::decode::{DecodeError, Decoder, Pull};
use super::request_body::BodyRefused;
use crate::audit::Counters;
use crate::reason::Reason;
use crate::secrets::scrub::{Scrubber, StreamScrubber};
use crate::upstream::{Body, BoxError};

/// Scrubs a header block (response headers or trailers): values are rewritten with
/// `[REDACTED:name]`; a field whose *name* holds a secret (in any case) is dropped, since a
/// name cannot carry the marker. Also drops `x-latchkey-*` fields. Returns the redactions made.
pub fn filter_headers(headers: &mut HeaderMap, scrubber: &Scrubber) -> usize {
    let mut count = 0;
    super::response::strip_own_headers(headers);
    let named: Vec<_> = headers
        .keys()
        .filter(|n| scrubber.find_in_name(n.as_str().as_bytes()).is_some())
        .cloned()
        .collect();
    for name in named {
        count += headers.get_all(&name).iter().count();
        headers.remove(name);
    }
    for value in headers.values_mut() {
        // The cheap search first: most headers hold no secret and need no copy.
        if scrubber.find(value.as_bytes()).is_none() {
            continue;
        }
        let (out, names) = scrubber.scrub(value.as_bytes());
        if !names.is_empty() {
            count += names.len();
            // `[REDACTED:name]` is plain ASCII, so the header stays valid.
            if let Ok(v) = HeaderValue::from_bytes(&out) {
                *value = v;
            } else {
                *value = HeaderValue::from_static("[REDACTED]");
            }
        }
    }
    // A secret cut in two across fields of one name: a client joins them (with `, ` by the
    // RFC, with nothing by naive code), so each joined form is scanned; such a field is
    // dropped, since no one value holds the whole secret to redact.
    let split: Vec<_> = headers
        .keys()
        .filter(|n| {
            let values = headers.get_all(*n);
            if values.iter().nth(1).is_none() {
                return false;
            }
            let parts: Vec<&[u8]> = values.iter().map(HeaderValue::as_bytes).collect();
            ["", ",", ", "]
                .iter()
                .any(|sep| scrubber.find(&parts.join(sep.as_bytes())).is_some())
        })
        .cloned()
        .collect();
    for name in split {
        count += 1;
        headers.remove(name);
    }
    // Fields whose values list field names (`Trailer: x-a, x-b`): names are compared ignoring
    // case, so a secret there may come lower-cased, which the value scan above would miss.
    for name in NAME_LISTS {
        if headers
            .get_all(name)
            .iter()
            .any(|v| scrubber.find_in_name(v.as_bytes()).is_some())
        {
            count += 1;
            headers.remove(name);
        }
    }
    count
}

/// Response fields whose values are lists of field names.
const NAME_LISTS: [&str; 4] = [
    "trailer",
    "vary",
    "access-control-expose-headers",
    "access-control-allow-headers",
];

/// Where a [`Scrubbed`] body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading the upstream body.
    Streaming,
    /// The upstream body ended (or its trailers came): emit what the decoder and scrubber hold.
    Draining,
    /// Emit the held trailers, if any.
    Trailers,
    Done,
}

pin_project_lite::pin_project! {
    /// A response body decoded and scrubbed as it streams.
    pub struct Scrubbed<B> {
        #[pin]
        inner: B,
        // A frame read ahead by the response phase, delivered first.
        first: Option<Frame<Bytes>>,
        // `None`: the body is not compressed.
        decoder: Option<Decoder>,
        scrubber: StreamScrubber,
        headers: Arc<Scrubber>,
        trailers: Option<HeaderMap>,
        counters: Arc<Counters>,
        counted: usize,
        phase: Phase,
        started: bool,
    }
}

impl<B> Scrubbed<B> {
    fn account(counters: &Counters, counted: &mut usize, scrubber: &StreamScrubber) {
        let now = scrubber.redactions();
        if now > *counted {
            counters
                .redactions
                .fetch_add((now - *counted) as u64, Ordering::Relaxed);
            *counted = now;
        }
    }
}

/// A decoding failure mid-body, as the refusal the audit record carries.
fn refusal(e: DecodeError) -> BoxError {
    let reason = match e {
        DecodeError::Limit { .. } => Reason::DecompressionLimit,
        DecodeError::Invalid { .. } => Reason::UninspectableBody,
    };
    Box::new(BodyRefused {
        reason,
        message: format!("response body cut off: {e}"),
    })
}

impl<B> HttpBody for Scrubbed<B>
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
        let mut this = self.project();
        *this.started = true;
        loop {
            match *this.phase {
                Phase::Done => return Poll::Ready(None),
                Phase::Trailers => {
                    *this.phase = Phase::Done;
                    if let Some(t) = this.trailers.take() {
                        return Poll::Ready(Some(Ok(Frame::trailers(t))));
                    }
                    continue;
                }
                Phase::Streaming | Phase::Draining => {}
            }
            // Decoded output first: one bounded slice per pull.
            if let Some(d) = this.decoder.as_mut() {
                match d.pull() {
                    Err(e) => {
                        *this.phase = Phase::Done;
                        return Poll::Ready(Some(Err(refusal(e))));
                    }
                    Ok(Pull::Data(slice)) => {
                        let out = this.scrubber.push_bytes(slice);
                        Self::account(this.counters, this.counted, this.scrubber);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                        continue;
                    }
                    Ok(Pull::Done) => {
                        let tail = this.scrubber.finish();
                        Self::account(this.counters, this.counted, this.scrubber);
                        *this.phase = Phase::Trailers;
                        if !tail.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(tail))));
                        }
                        continue;
                    }
                    Ok(Pull::NeedInput) if *this.phase == Phase::Draining => {
                        // The decoder was told the input ended; it cannot want more.
                        *this.phase = Phase::Done;
                        return Poll::Ready(Some(Err(refusal(DecodeError::Invalid {
                            coding: "compressed",
                            detail: "truncated stream".to_string(),
                        }))));
                    }
                    Ok(Pull::NeedInput) => {}
                }
            } else if *this.phase == Phase::Draining {
                let tail = this.scrubber.finish();
                Self::account(this.counters, this.counted, this.scrubber);
                *this.phase = Phase::Trailers;
                if !tail.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(tail))));
                }
                continue;
            }
            let frame = match this.first.take() {
                Some(f) => Some(Ok(f)),
                None => ready!(this.inner.as_mut().poll_frame(cx)).map(|r| r.map_err(Into::into)),
            };
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => match this.decoder.as_mut() {
                        Some(d) => d.feed(data),
                        None => {
                            let out = this.scrubber.push_bytes(data);
                            Self::account(this.counters, this.counted, this.scrubber);
                            if !out.is_empty() {
                                return Poll::Ready(Some(Ok(Frame::data(out))));
                            }
                        }
                    },
                    Err(frame) => {
                        // Trailers end the body: scrub them now, send them after the last data.
                        if let Ok(mut t) = frame.into_trailers() {
                            let n = filter_headers(&mut t, this.headers);
                            this.counters
                                .redactions
                                .fetch_add(n as u64, Ordering::Relaxed);
                            *this.trailers = Some(t);
                        }
                        *this.phase = Phase::Draining;
                        if let Some(d) = this.decoder.as_mut() {
                            d.end();
                        }
                    }
                },
                Some(Err(e)) => {
                    *this.phase = Phase::Done;
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    *this.phase = Phase::Draining;
                    if let Some(d) = this.decoder.as_mut() {
                        d.end();
                    }
                }
            }
        }
    }

    /// Also true before the first poll when the upstream's body is already over, so a
    /// headers-only response (a gRPC trailers-only status) stays one HEADERS frame to an h2
    /// sandbox rather than gaining an empty DATA frame.
    fn is_end_stream(&self) -> bool {
        self.phase == Phase::Done
            || (!self.started && self.first.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Wraps a response body for redaction. `first` is a frame already read from `body`; callers
/// remove `content-length` and `content-encoding` from the response, since the body changes.
pub fn scrubbed<B>(
    body: B,
    first: Option<Frame<Bytes>>,
    decoder: Option<Decoder>,
    scrubber: &Arc<Scrubber>,
    counters: Arc<Counters>,
) -> Body
where
    B: HttpBody<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    Scrubbed {
        inner: body,
        first,
        decoder,
        scrubber: scrubber.stream(),
        headers: scrubber.clone(),
        trailers: None,
        counters,
        counted: 0,
        phase: Phase::Streaming,
        started: false,
    }
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Coding;
    use crate::secrets::scrub::ScrubSecret;
    use base64::Engine as _;
    use proptest::prelude::*;
    use std::io::Write;

    const KEY: &[u8] = b"sk-Test-Scrub-body-0123456789";

    fn scrubber() -> Arc<Scrubber> {
        Arc::new(
            Scrubber::new(&[ScrubSecret {
                name: "k",
                value: KEY,
            }])
            .expect("scrubber"),
        )
    }

    /// A body yielding fixed frames, one per poll.
    struct Frames(std::collections::VecDeque<Frame<Bytes>>);

    impl HttpBody for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }

    fn encode(coding: Coding, data: &[u8]) -> Vec<u8> {
        match coding {
            Coding::Gzip => {
                let mut e =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(data).expect("w");
                e.finish().expect("gz")
            }
            Coding::Deflate => {
                let mut e =
                    flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(data).expect("w");
                e.finish().expect("zlib")
            }
            Coding::Brotli => {
                let mut out = Vec::new();
                {
                    let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                    w.write_all(data).expect("w");
                }
                out
            }
        }
    }

    /// Runs frames through the scrubber; returns the data, the trailers and the redactions.
    async fn run(
        frames: Vec<Frame<Bytes>>,
        codings: &[Coding],
    ) -> (Vec<u8>, Option<HeaderMap>, u64) {
        let counters = Arc::new(Counters::default());
        let decoder = (!codings.is_empty()).then(|| Decoder::new(codings, u64::MAX));
        let mut body = scrubbed(
            Frames(frames.into()),
            None,
            decoder,
            &scrubber(),
            counters.clone(),
        );
        let mut out = Vec::new();
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.expect("frame");
            match frame.into_data() {
                Ok(d) => out.extend_from_slice(&d),
                Err(f) => trailers = f.into_trailers().ok(),
            }
        }
        (out, trailers, counters.redactions.load(Ordering::Relaxed))
    }

    fn data_frames(bytes: &[u8], size: usize) -> Vec<Frame<Bytes>> {
        bytes
            .chunks(size.max(1))
            .map(|c| Frame::data(Bytes::copy_from_slice(c)))
            .collect()
    }

    #[tokio::test]
    async fn gzip_bodies_are_decoded_and_scrubbed_across_chunks() {
        let gz = encode(Coding::Gzip, &[b"before ", KEY, b" after"].concat());
        let (out, _, n) = run(data_frames(&gz, 3), &[Coding::Gzip]).await;
        assert_eq!(out, b"before [REDACTED:k] after");
        assert_eq!(n, 1);
    }

    #[tokio::test]
    async fn trailers_are_scrubbed_in_values_and_names_and_kept() {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("7"));
        t.insert(
            "grpc-message",
            HeaderValue::from_bytes(&[b"bad key ", KEY].concat()).expect("v"),
        );
        let lower = String::from_utf8_lossy(KEY).to_ascii_lowercase();
        t.insert(
            http::HeaderName::from_bytes(format!("x-{lower}").as_bytes()).expect("name"),
            HeaderValue::from_static("1"),
        );
        t.insert("x-latchkey-decision", HeaderValue::from_static("allow"));
        let mut frames = data_frames(b"body", 2);
        frames.push(Frame::trailers(t));
        let (out, trailers, n) = run(frames, &[]).await;
        assert_eq!(out, b"body");
        let t = trailers.expect("trailers kept");
        assert_eq!(t["grpc-status"], "7");
        assert_eq!(t["grpc-message"], "bad key [REDACTED:k]");
        assert_eq!(t.len(), 2, "{t:?}");
        assert_eq!(n, 2);
    }

    #[test]
    fn header_names_holding_a_secret_in_any_case_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-echo",
            HeaderValue::from_bytes(&[b"Bearer ", KEY].concat()).expect("v"),
        );
        let lower = String::from_utf8_lossy(KEY).to_ascii_lowercase();
        h.insert(
            http::HeaderName::from_bytes(lower.as_bytes()).expect("name"),
            HeaderValue::from_static("v"),
        );
        h.insert("x-latchkey-rule", HeaderValue::from_static("forged"));
        h.insert("x-plain", HeaderValue::from_static("ok"));
        assert_eq!(filter_headers(&mut h, &scrubber()), 2);
        assert_eq!(h["x-echo"], "Bearer [REDACTED:k]");
        assert_eq!(h.len(), 2, "{h:?}");
    }

    #[test]
    fn a_secret_split_across_fields_of_one_name_drops_that_field() {
        let (a, b) = KEY.split_at(9);
        let mut h = HeaderMap::new();
        h.append("x-split", HeaderValue::from_bytes(a).expect("v"));
        h.append("x-split", HeaderValue::from_bytes(b).expect("v"));
        h.append("x-two", HeaderValue::from_static("one"));
        h.append("x-two", HeaderValue::from_static("two"));
        assert_eq!(filter_headers(&mut h, &scrubber()), 1);
        assert!(!h.contains_key("x-split"), "{h:?}");
        assert_eq!(h.get_all("x-two").iter().count(), 2);
    }

    #[test]
    fn a_lowercased_secret_in_a_list_of_field_names_drops_that_list() {
        let lower = String::from_utf8_lossy(KEY).to_ascii_lowercase();
        let mut h = HeaderMap::new();
        h.insert(
            "trailer",
            HeaderValue::from_str(&format!("grpc-status, x-{lower}")).expect("v"),
        );
        h.insert(
            "vary",
            HeaderValue::from_str(&format!("accept, {lower}")).expect("v"),
        );
        h.insert(
            "access-control-expose-headers",
            HeaderValue::from_static("x-a"),
        );
        assert_eq!(filter_headers(&mut h, &scrubber()), 2);
        assert_eq!(h.len(), 1, "{h:?}");
    }

    fn coding() -> impl Strategy<Value = Coding> {
        prop_oneof![
            Just(Coding::Gzip),
            Just(Coding::Deflate),
            Just(Coding::Brotli)
        ]
    }

    /// How a secret is written into a body an upstream reflects.
    fn form(i: u8) -> Vec<u8> {
        match i % 4 {
            0 => KEY.to_vec(),
            1 => base64::engine::general_purpose::STANDARD
                .encode(KEY)
                .into_bytes(),
            2 => percent_encoding::percent_encode(KEY, percent_encoding::NON_ALPHANUMERIC)
                .to_string()
                .into_bytes(),
            _ => serde_json::to_vec(&String::from_utf8_lossy(KEY)).expect("json"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Random bodies with secrets in random forms, under random coding stacks, cut into
        /// random frames, with trailers or not: the sandbox never sees the secret, and sees
        /// exactly the whole-buffer scrub of the decoded body.
        #[test]
        fn random_response_shapes_never_deliver_a_secret(
            parts in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..200), any::<u8>()), 1..6),
            codings in proptest::collection::vec(coding(), 0..3),
            frame in 1usize..700,
            trailer_secret in any::<bool>(),
        ) {
            let mut plain = Vec::new();
            for (noise, f) in &parts {
                plain.extend_from_slice(noise);
                plain.extend_from_slice(&form(*f));
            }
            let mut encoded = plain.clone();
            for c in &codings {
                encoded = encode(*c, &encoded);
            }
            let mut frames = data_frames(&encoded, frame);
            if trailer_secret {
                let mut t = HeaderMap::new();
                t.insert("x-reflected", HeaderValue::from_bytes(KEY).expect("v"));
                frames.push(Frame::trailers(t));
            }
            let rt = tokio::runtime::Builder::new_current_thread().build().expect("rt");
            let (out, trailers, _) = rt.block_on(run(frames, &codings));
            let (expected, _) = scrubber().scrub(&plain);
            prop_assert_eq!(&out, &expected);
            let found = scrubber().find(&out);
            prop_assert!(found.is_none(), "secret delivered");
            if let Some(t) = trailers {
                for v in t.values() {
                    prop_assert!(scrubber().find(v.as_bytes()).is_none());
                }
            }
        }

        /// Random header blocks (names with the secret in any case at any position, values with
        /// it in any form): after filtering, no name and no value holds it.
        #[test]
        fn random_header_blocks_never_deliver_a_secret(
            fields in proptest::collection::vec(("[a-z0-9-]{0,8}", any::<bool>(), any::<u8>(), "[ -~]{0,12}", any::<u8>(), any::<bool>()), 1..8),
        ) {
            let lower = String::from_utf8_lossy(KEY).to_ascii_lowercase();
            let mut h = HeaderMap::new();
            for (prefix, secret_name, case, noise, f, secret_value) in &fields {
                let mut name = format!("x-{prefix}");
                if *secret_name {
                    let cased: String = lower
                        .chars()
                        .enumerate()
                        .map(|(i, c)| if (*case as usize >> (i % 8)) & 1 == 1 { c.to_ascii_uppercase() } else { c })
                        .collect();
                    name.push_str(&cased);
                }
                let Ok(name) = http::HeaderName::from_bytes(name.as_bytes()) else { continue };
                let mut value = noise.as_bytes().to_vec();
                if *secret_value {
                    value.extend_from_slice(&form(*f));
                }
                let Ok(value) = HeaderValue::from_bytes(&value) else { continue };
                h.append(name, value);
            }
            filter_headers(&mut h, &scrubber());
            for (name, value) in &h {
                prop_assert!(!name.as_str().contains(&lower), "name {name}");
                prop_assert!(scrubber().find(value.as_bytes()).is_none(), "value of {name}");
            }
        }

        /// The stream scrubber over any cut of any body equals the whole-buffer scrub.
        #[test]
        fn streamed_scrubbing_equals_whole_buffer_scrubbing(
            parts in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..64), any::<u8>(), any::<bool>()), 1..8),
            cuts in proptest::collection::vec(1usize..90, 1..20),
        ) {
            let mut body = Vec::new();
            for (noise, f, with) in &parts {
                body.extend_from_slice(noise);
                if *with {
                    body.extend_from_slice(&form(*f));
                }
            }
            let s = scrubber();
            let (whole, _) = s.scrub(&body);
            let mut stream = s.stream();
            let mut out = Vec::new();
            let mut rest = &body[..];
            for c in cuts.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (a, b) = rest.split_at((*c).min(rest.len()));
                out.extend_from_slice(&stream.push_bytes(Bytes::copy_from_slice(a)));
                rest = b;
            }
            out.extend_from_slice(&stream.finish());
            prop_assert_eq!(&out, &whole);
            prop_assert!(s.find(&out).is_none());
        }
    }
}

//! Response redaction: headers and streamed bodies, decoded first when compressed.
//!
//! A body is scanned as it streams (the scrubber holds back at most one encoded secret's
//! length), so server-sent events still arrive one by one. gzip, deflate (zlib or raw) and br
//! are decoded and the redacted body goes out uncompressed; any other `content-encoding` cannot
//! be inspected and is refused by the caller (see [`Decoding::for_encoding`]).

use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;

use crate::audit::Counters;
use crate::secrets::scrub::{Scrubber, StreamScrubber};
use crate::upstream::{Body, BoxError};

/// How a response body must be decoded before scanning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoding {
    Identity,
    Gzip,
    Deflate,
    Brotli,
}

impl Decoding {
    /// The decoding for a `content-encoding` header, or `Err(encoding)` when latchkey cannot
    /// inspect it. Multiple encodings (`gzip, br`) are refused too.
    pub fn for_encoding(headers: &HeaderMap) -> Result<Decoding, String> {
        let mut values = headers.get_all(http::header::CONTENT_ENCODING).iter();
        let Some(first) = values.next() else {
            return Ok(Decoding::Identity);
        };
        let text = first
            .to_str()
            .unwrap_or("(not ASCII)")
            .trim()
            .to_ascii_lowercase();
        if values.next().is_some() || text.contains(',') {
            return Err(text);
        }
        match text.as_str() {
            "" | "identity" => Ok(Decoding::Identity),
            "gzip" | "x-gzip" => Ok(Decoding::Gzip),
            "deflate" => Ok(Decoding::Deflate),
            "br" => Ok(Decoding::Brotli),
            _ => Err(text),
        }
    }
}

/// Replaces secret values in header values; returns the number of replacements.
pub fn scrub_headers(headers: &mut HeaderMap, scrubber: &Scrubber) -> usize {
    let mut count = 0;
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
    count
}

enum Decoder {
    Identity,
    Gzip(Box<flate2::write::GzDecoder<Vec<u8>>>),
    /// Waiting for two bytes to tell zlib from raw deflate.
    DeflatePending(Vec<u8>),
    Zlib(Box<flate2::write::ZlibDecoder<Vec<u8>>>),
    RawDeflate(Box<flate2::write::DeflateDecoder<Vec<u8>>>),
    Brotli(Box<brotli_decompressor::DecompressorWriter<Vec<u8>>>),
}

impl Decoder {
    fn new(d: Decoding) -> Self {
        match d {
            Decoding::Identity => Decoder::Identity,
            Decoding::Gzip => Decoder::Gzip(Box::new(flate2::write::GzDecoder::new(Vec::new()))),
            Decoding::Deflate => Decoder::DeflatePending(Vec::new()),
            Decoding::Brotli => Decoder::Brotli(Box::new(
                brotli_decompressor::DecompressorWriter::new(Vec::new(), 16 * 1024),
            )),
        }
    }

    /// Feeds compressed bytes, returns whatever decoded so far (identity: the chunk itself).
    fn push(&mut self, chunk: Bytes) -> std::io::Result<Bytes> {
        match self {
            Decoder::Identity => Ok(chunk),
            _ => self.push_slice(&chunk).map(Bytes::from),
        }
    }

    fn push_slice(&mut self, chunk: &[u8]) -> std::io::Result<Vec<u8>> {
        fn drain<W: Write>(w: &mut W, buf: impl FnOnce(&mut W) -> &mut Vec<u8>) -> Vec<u8> {
            std::mem::take(buf(w))
        }
        match self {
            Decoder::Identity => Ok(chunk.to_vec()),
            Decoder::Gzip(d) => {
                d.write_all(chunk)?;
                Ok(drain(d.as_mut(), |d| d.get_mut()))
            }
            Decoder::Zlib(d) => {
                d.write_all(chunk)?;
                Ok(drain(d.as_mut(), |d| d.get_mut()))
            }
            Decoder::RawDeflate(d) => {
                d.write_all(chunk)?;
                Ok(drain(d.as_mut(), |d| d.get_mut()))
            }
            Decoder::Brotli(d) => {
                d.write_all(chunk)?;
                Ok(std::mem::take(d.get_mut()))
            }
            Decoder::DeflatePending(head) => {
                head.extend_from_slice(chunk);
                if head.len() < 2 {
                    return Ok(Vec::new());
                }
                let (b0, b1) = (head[0], head[1]);
                let zlib = b0 & 0x0f == 8 && (u16::from(b0) << 8 | u16::from(b1)) % 31 == 0;
                let pending = std::mem::take(head);
                *self = if zlib {
                    Decoder::Zlib(Box::new(flate2::write::ZlibDecoder::new(Vec::new())))
                } else {
                    Decoder::RawDeflate(Box::new(flate2::write::DeflateDecoder::new(Vec::new())))
                };
                self.push_slice(&pending)
            }
        }
    }

    /// Ends the stream; a truncated compressed stream is an error.
    fn finish(&mut self) -> std::io::Result<Vec<u8>> {
        match self {
            Decoder::Identity => Ok(Vec::new()),
            Decoder::Gzip(d) => {
                d.try_finish()?;
                Ok(std::mem::take(d.get_mut()))
            }
            Decoder::Zlib(d) => {
                d.try_finish()?;
                Ok(std::mem::take(d.get_mut()))
            }
            Decoder::RawDeflate(d) => {
                d.try_finish()?;
                Ok(std::mem::take(d.get_mut()))
            }
            Decoder::Brotli(d) => {
                d.close().map_err(|e| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{e:?}"))
                })?;
                Ok(std::mem::take(d.get_mut()))
            }
            Decoder::DeflatePending(head) if head.is_empty() => Ok(Vec::new()),
            Decoder::DeflatePending(_) => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "truncated deflate stream",
            )),
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body decoded and scrubbed as it streams.
    pub struct Scrubbed<B> {
        #[pin]
        inner: B,
        decoder: Decoder,
        scrubber: StreamScrubber,
        counters: Arc<Counters>,
        counted: usize,
        done: bool,
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

fn invalid(e: std::io::Error) -> BoxError {
    format!("cannot decode the response body for inspection: {e}").into()
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
        loop {
            if *this.done {
                return Poll::Ready(None);
            }
            match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let decoded = this.decoder.push(data).map_err(invalid)?;
                        let out = this.scrubber.push_bytes(decoded);
                        Self::account(this.counters, this.counted, this.scrubber);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    // Trailers pass through; they are rare and carry no body text.
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    *this.done = true;
                    let tail = this.decoder.finish().map_err(invalid)?;
                    let mut out = this.scrubber.push(&tail).to_vec();
                    out.extend_from_slice(&this.scrubber.finish());
                    Self::account(this.counters, this.counted, this.scrubber);
                    if out.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Wraps a response body for redaction. Callers remove `content-length` and
/// `content-encoding` from the response, since the body changes.
pub fn scrubbed<B>(
    body: B,
    decoding: Decoding,
    scrubber: &Arc<Scrubber>,
    counters: Arc<Counters>,
) -> Body
where
    B: HttpBody<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    Scrubbed {
        inner: body,
        decoder: Decoder::new(decoding),
        scrubber: scrubber.stream(),
        counters,
        counted: 0,
        done: false,
    }
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::scrub::ScrubSecret;
    use http_body_util::BodyExt;

    const KEY: &[u8] = b"sk-test-scrub-body-0123456789";

    fn scrubber() -> Arc<Scrubber> {
        Arc::new(
            Scrubber::new(&[ScrubSecret {
                name: "k",
                value: KEY,
            }])
            .expect("scrubber"),
        )
    }

    /// A body yielding fixed chunks, one per poll.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl HttpBody for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    async fn run(chunks: Vec<Vec<u8>>, d: Decoding) -> (Vec<u8>, u64) {
        let body = Chunks(chunks.into_iter().map(Bytes::from).collect());
        let counters = Arc::new(Counters::default());
        let body = scrubbed(body, d, &scrubber(), counters.clone());
        let out = body.collect().await.expect("collect").to_bytes().to_vec();
        (out, counters.redactions.load(Ordering::Relaxed))
    }

    #[tokio::test]
    async fn gzip_bodies_are_decoded_and_scrubbed_across_chunks() {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(b"before ").expect("w");
        enc.write_all(KEY).expect("w");
        enc.write_all(b" after").expect("w");
        let gz = enc.finish().expect("gz");
        let chunks: Vec<Vec<u8>> = gz.chunks(3).map(<[u8]>::to_vec).collect();
        let (out, n) = run(chunks, Decoding::Gzip).await;
        assert_eq!(out, b"before [REDACTED:k] after");
        assert_eq!(n, 1);
    }

    #[test]
    fn unknown_encodings_cannot_be_inspected() {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_ENCODING,
            HeaderValue::from_static("zstd"),
        );
        assert_eq!(Decoding::for_encoding(&h), Err("zstd".to_string()));
        h.insert(
            http::header::CONTENT_ENCODING,
            HeaderValue::from_static("gzip, br"),
        );
        assert!(Decoding::for_encoding(&h).is_err());
        h.insert(
            http::header::CONTENT_ENCODING,
            HeaderValue::from_static("BR"),
        );
        assert_eq!(Decoding::for_encoding(&h), Ok(Decoding::Brotli));
    }

    #[test]
    fn header_values_are_scrubbed() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-echo",
            HeaderValue::from_bytes(&[b"Bearer ", KEY].concat()).expect("v"),
        );
        assert_eq!(scrub_headers(&mut h, &scrubber()), 1);
        assert_eq!(h["x-echo"], "Bearer [REDACTED:k]");
    }
}

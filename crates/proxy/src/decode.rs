//! Bounded decoding of response content codings, so a response can be scanned for secrets.
//!
//! Decoding is *pulled*: the body wrapper asks for the next slice of at most [`SLICE`] decoded
//! bytes, and only feeds the next compressed frame once the decoder has used up the last one.
//! So however far a body inflates (a 317-byte brotli stream can become 200 MiB), latchkey holds
//! one compressed frame and one output slice per response, never the inflated whole. The total
//! decoded size is capped per response as well ([`DecodeError::Limit`]).
//!
//! The decoders are `flate2`'s and `brotli-decompressor`'s `Read` adaptors over a source that
//! says `WouldBlock` while it waits for the next frame; both resume where they stopped.
//! This module knows bytes and codings only: nothing of secrets, policy or sockets.

use std::collections::VecDeque;
use std::io::{self, BufReader, Read};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::HeaderMap;

/// The most decoded bytes produced (and held) per pull.
pub const SLICE: usize = 16 * 1024;

/// The most bytes accepted (and dropped) after a compressed stream has ended.
const MAX_AFTER_END: usize = 64 * 1024;

/// The most codings stacked on one body (`Content-Encoding: gzip, br` is two); more is refused.
const MAX_CODINGS: usize = 3;

/// A content coding latchkey can undo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Gzip,
    /// zlib-wrapped or raw deflate: servers send both under this name, so the first two bytes
    /// decide.
    Deflate,
    Brotli,
}

impl Coding {
    fn as_str(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
            Coding::Brotli => "br",
        }
    }
}

/// A `Content-Encoding` latchkey cannot undo; its text is what the refusal quotes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodingError {
    #[error("(not ASCII)")]
    NotAscii,
    /// The whole header value that named an unknown coding.
    #[error("{0}")]
    Unknown(String),
    #[error("{0} stacked codings")]
    Stacked(usize),
}

/// The codings of a response body in the order they were applied (`identity` dropped), or why
/// latchkey cannot undo them (unknown coding, not ASCII, too many).
pub fn codings(headers: &HeaderMap) -> Result<Vec<Coding>, CodingError> {
    let mut out = Vec::new();
    for value in headers.get_all(http::header::CONTENT_ENCODING) {
        let text = value.to_str().map_err(|_| CodingError::NotAscii)?;
        for token in text.split(',') {
            let token = token.trim().to_ascii_lowercase();
            match token.as_str() {
                "" | "identity" => {}
                "gzip" | "x-gzip" => out.push(Coding::Gzip),
                "deflate" => out.push(Coding::Deflate),
                "br" => out.push(Coding::Brotli),
                _ => return Err(CodingError::Unknown(text.trim().to_string())),
            }
        }
    }
    if out.len() > MAX_CODINGS {
        return Err(CodingError::Stacked(out.len()));
    }
    Ok(out)
}

/// Why a body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("the decoded body exceeds latchkey's limit of {limit} bytes")]
    Limit { limit: u64 },
    #[error("the {coding} body is not valid: {detail}")]
    Invalid {
        coding: &'static str,
        detail: String,
    },
}

/// What one pull produced.
#[derive(Debug)]
pub enum Pull {
    /// The next decoded slice (never empty).
    Data(Bytes),
    /// Everything fed so far is decoded: feed the next frame, or [`Decoder::end`].
    NeedInput,
    /// The body is complete.
    Done,
}

/// Compressed frames waiting to be decoded, shared with the innermost reader.
#[derive(Default)]
struct Input {
    chunks: VecDeque<Bytes>,
    ended: bool,
}

#[derive(Clone, Default)]
struct Source(Arc<Mutex<Input>>);

impl Source {
    fn lock(&self) -> std::sync::MutexGuard<'_, Input> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut input = self.lock();
        while let Some(front) = input.chunks.front_mut() {
            if front.is_empty() {
                input.chunks.pop_front();
                continue;
            }
            let n = front.len().min(buf.len());
            buf[..n].copy_from_slice(&front[..n]);
            bytes::Buf::advance(front, n);
            return Ok(n);
        }
        if input.ended {
            Ok(0)
        } else {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }
}

/// The sniffed bytes, then the rest of the stream.
type Resumed<R> = BufReader<io::Chain<io::Cursor<Vec<u8>>, R>>;

/// Deflate that picks zlib or raw from the first two bytes.
enum Deflate<R: Read> {
    Sniffing { inner: Option<R>, head: Vec<u8> },
    Zlib(Box<flate2::bufread::ZlibDecoder<Resumed<R>>>),
    Raw(Box<flate2::bufread::DeflateDecoder<Resumed<R>>>),
}

impl<R: Read> Read for Deflate<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self {
                Deflate::Zlib(d) => return d.read(buf),
                Deflate::Raw(d) => return d.read(buf),
                Deflate::Sniffing { inner, head } => {
                    let Some(r) = inner.as_mut() else {
                        return Err(io::Error::other("deflate reader lost"));
                    };
                    let mut byte = [0u8; 2];
                    let want = 2 - head.len();
                    let n = r.read(&mut byte[..want])?;
                    head.extend_from_slice(&byte[..n]);
                    if n == 0 && head.is_empty() {
                        return Ok(0);
                    }
                    if n == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "truncated deflate stream",
                        ));
                    }
                    if head.len() < 2 {
                        continue;
                    }
                    let (b0, b1) = (head[0], head[1]);
                    let zlib = b0 & 0x0f == 8 && (u16::from(b0) << 8 | u16::from(b1)) % 31 == 0;
                    let Some(r) = inner.take() else {
                        return Err(io::Error::other("deflate reader lost"));
                    };
                    let chained =
                        BufReader::with_capacity(8 * 1024, io::Cursor::new(head.clone()).chain(r));
                    *self = if zlib {
                        Deflate::Zlib(Box::new(flate2::bufread::ZlibDecoder::new(chained)))
                    } else {
                        Deflate::Raw(Box::new(flate2::bufread::DeflateDecoder::new(chained)))
                    };
                }
            }
        }
    }
}

type Reader = Box<dyn Read + Send + Sync>;

fn layer(coding: Coding, inner: Reader) -> Reader {
    match coding {
        Coding::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(
            BufReader::with_capacity(8 * 1024, inner),
        )),
        Coding::Deflate => Box::new(Deflate::Sniffing {
            inner: Some(inner),
            head: Vec::new(),
        }),
        Coding::Brotli => Box::new(brotli_decompressor::Decompressor::new(inner, 4 * 1024)),
    }
}

/// Decodes one body's stack of codings, one bounded slice per pull.
pub struct Decoder {
    input: Source,
    reader: Reader,
    /// The outermost coding, for messages.
    outer: &'static str,
    produced: u64,
    limit: u64,
    fed: bool,
    /// The compressed stream reached its end.
    stream_done: bool,
    done: bool,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("outer", &self.outer)
            .field("produced", &self.produced)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder for codings listed in the order they were applied (the last is undone first).
    pub fn new(codings: &[Coding], limit: u64) -> Self {
        let input = Source::default();
        let mut reader: Reader = Box::new(input.clone());
        for coding in codings.iter().rev() {
            reader = layer(*coding, reader);
        }
        Self {
            input,
            reader,
            outer: codings.last().map_or("identity", |c| c.as_str()),
            produced: 0,
            limit,
            fed: false,
            stream_done: false,
            done: false,
        }
    }

    /// Queues one compressed frame. Call [`Decoder::pull`] until it asks for more first, so
    /// that only one frame is held.
    pub fn feed(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.fed = true;
            self.input.lock().chunks.push_back(chunk);
        }
    }

    /// Marks the end of the compressed stream: a truncated stream is then an error.
    pub fn end(&mut self) {
        self.input.lock().ended = true;
    }

    /// The next decoded slice, or what the decoder is waiting for.
    pub fn pull(&mut self) -> Result<Pull, DecodeError> {
        if self.done {
            return Ok(Pull::Done);
        }
        let ended = self.input.lock().ended;
        // An empty body is a valid empty stream whatever its coding says (HEAD, 204, 304, or
        // a 200 with no content): nothing to decode.
        if ended && !self.fed {
            self.done = true;
            return Ok(Pull::Done);
        }
        if self.stream_done {
            // The (outermost) compressed stream is complete. What still arrives may be an inner
            // coding's trailer (a gzip CRC under a deflate stream) or junk; it is never decoded
            // or delivered, only bounded, so an upstream cannot pile it up.
            let mut input = self.input.lock();
            let pending: usize = input.chunks.iter().map(Bytes::len).sum();
            if pending > MAX_AFTER_END {
                drop(input);
                return Err(self.invalid("data after the end of the compressed stream"));
            }
            if ended {
                input.chunks.clear();
                self.done = true;
                return Ok(Pull::Done);
            }
            return Ok(Pull::NeedInput);
        }
        let mut buf = vec![0u8; SLICE];
        loop {
            match self.reader.read(&mut buf) {
                Ok(0) => {
                    self.stream_done = true;
                    // One more read lets a decoder that holds unread input report it.
                    if let Err(e) = self.reader.read(&mut buf) {
                        if e.kind() != io::ErrorKind::WouldBlock {
                            return Err(self.invalid(&e.to_string()));
                        }
                    }
                    return self.pull();
                }
                Ok(n) => {
                    self.produced += n as u64;
                    if self.produced > self.limit {
                        return Err(DecodeError::Limit { limit: self.limit });
                    }
                    buf.truncate(n);
                    return Ok(Pull::Data(Bytes::from(buf)));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Pull::NeedInput),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.invalid(&e.to_string())),
            }
        }
    }

    fn invalid(&self, detail: &str) -> DecodeError {
        DecodeError::Invalid {
            coding: self.outer,
            detail: detail.to_string(),
        }
    }
}

/// Decodes `first` (the first frame of a body) only to count its decoded size, discarding
/// the output, so a body that already breaks the limit in its first frame is refused before
/// the response head is sent. Costs one extra decode of one frame, bounded by `limit`.
pub fn check_first_frame(codings: &[Coding], first: &Bytes, limit: u64) -> Result<(), DecodeError> {
    let mut d = Decoder::new(codings, limit);
    d.feed(first.clone());
    loop {
        match d.pull()? {
            Pull::Data(_) => {}
            Pull::NeedInput | Pull::Done => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).expect("write");
        e.finish().expect("finish")
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).expect("write");
        e.finish().expect("finish")
    }

    fn raw_deflate(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).expect("write");
        e.finish().expect("finish")
    }

    fn brotli(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut w = brotli::CompressorWriter::new(&mut out, 4096, 9, 22);
            w.write_all(data).expect("write");
        }
        out
    }

    /// Feeds `chunks`, pulls everything; returns the output and the largest slice seen.
    fn run(
        codings: &[Coding],
        chunks: &[&[u8]],
        limit: u64,
    ) -> Result<(Vec<u8>, usize), DecodeError> {
        let mut d = Decoder::new(codings, limit);
        let mut out = Vec::new();
        let mut largest = 0;
        let mut chunks = chunks.iter();
        loop {
            match d.pull()? {
                Pull::Data(b) => {
                    largest = largest.max(b.len());
                    out.extend_from_slice(&b);
                }
                Pull::NeedInput => match chunks.next() {
                    Some(c) => d.feed(Bytes::copy_from_slice(c)),
                    None => d.end(),
                },
                Pull::Done => return Ok((out, largest)),
            }
        }
    }

    #[test]
    fn every_coding_decodes_across_one_byte_frames() {
        let text = b"hello, this is the body that was compressed; ".repeat(50);
        for (coding, enc) in [
            (Coding::Gzip, gzip(&text)),
            (Coding::Deflate, zlib(&text)),
            (Coding::Deflate, raw_deflate(&text)),
            (Coding::Brotli, brotli(&text)),
        ] {
            let frames: Vec<&[u8]> = enc.chunks(1).collect();
            let (out, _) = run(&[coding], &frames, u64::MAX).expect("decodes");
            assert_eq!(out, text, "{coding:?}");
            let (out, _) = run(&[coding], &[&enc], u64::MAX).expect("decodes");
            assert_eq!(out, text, "{coding:?}");
        }
    }

    #[test]
    fn stacked_codings_are_undone_last_first() {
        let text = b"stacked body ".repeat(100);
        let enc = brotli(&gzip(&text));
        let (out, _) = run(
            &[Coding::Gzip, Coding::Brotli],
            &[&enc[..5], &enc[5..]],
            u64::MAX,
        )
        .expect("decodes");
        assert_eq!(out, text);
    }

    #[test]
    fn a_bomb_is_pulled_in_bounded_slices_and_stopped_at_the_limit() {
        let zeros = vec![0u8; 64 * 1024 * 1024];
        for (coding, enc) in [
            (Coding::Brotli, brotli(&zeros)),
            (Coding::Gzip, gzip(&zeros)),
        ] {
            let err = run(&[coding], &[&enc], 8 * 1024 * 1024).expect_err("over the limit");
            assert!(matches!(err, DecodeError::Limit { .. }), "{err}");
            let (out, largest) = run(&[coding], &[&enc], u64::MAX).expect("decodes");
            assert_eq!(out.len(), zeros.len());
            assert!(largest <= SLICE, "{largest}");
            assert!(check_first_frame(&[coding], &Bytes::from(enc), 1024).is_err());
        }
    }

    #[test]
    fn empty_bodies_are_valid_under_any_coding() {
        for coding in [Coding::Gzip, Coding::Deflate, Coding::Brotli] {
            let (out, _) = run(&[coding], &[], u64::MAX).expect("empty is fine");
            assert!(out.is_empty());
        }
    }

    #[test]
    fn truncated_and_trailing_garbage_are_errors() {
        let enc = gzip(b"some text that is long enough to matter");
        assert!(run(&[Coding::Gzip], &[&enc[..enc.len() - 4]], u64::MAX).is_err());
        let br = brotli(b"some text that is long enough to matter");
        assert!(run(&[Coding::Brotli], &[&br[..br.len() / 2]], u64::MAX).is_err());
        let mut garbage = br.clone();
        garbage.extend_from_slice(b"trailing");
        assert!(run(&[Coding::Brotli], &[&garbage], u64::MAX).is_err());
    }

    #[test]
    fn content_encoding_lists_are_parsed_and_unknowns_named() {
        let mut h = HeaderMap::new();
        h.append("content-encoding", "gzip, br".parse().expect("v"));
        assert_eq!(codings(&h), Ok(vec![Coding::Gzip, Coding::Brotli]));
        h.append("content-encoding", "identity".parse().expect("v"));
        assert_eq!(codings(&h), Ok(vec![Coding::Gzip, Coding::Brotli]));
        h.append("content-encoding", "zstd".parse().expect("v"));
        assert_eq!(codings(&h), Err(CodingError::Unknown("zstd".to_string())));
        let mut h = HeaderMap::new();
        h.insert(
            "content-encoding",
            "gzip,gzip,gzip,gzip".parse().expect("v"),
        );
        assert!(codings(&h).is_err());
        h.insert("content-encoding", "X-GZIP".parse().expect("v"));
        assert_eq!(codings(&h), Ok(vec![Coding::Gzip]));
    }
}

//! S3's aws-chunked request bodies (`Content-Encoding: aws-chunked`), checked as they stream and,
//! for the signed forms, re-signed with the real key.
//!
//! The framing is `HEX[;chunk-signature=SIG]\r\n DATA \r\n` per chunk, a final `0...\r\n`,
//! trailer lines (`x-amz-checksum-crc32:...\r\n`, and `x-amz-trailer-signature:SIG\r\n` in
//! the signed trailer form), then `\r\n`.
//!
//! - `STREAMING-UNSIGNED-PAYLOAD-TRAILER`: the bytes pass through unchanged; the framing is
//!   parsed alongside (never more than one line held) so a body that is not valid aws-chunked,
//!   or whose data length is not `x-amz-decoded-content-length`, is aborted instead of being
//!   stored as something else.
//! - `STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]`: the sandbox's SDK signed every chunk with
//!   its dummy key. Each chunk signature is replaced by one made with the real key, chained from
//!   latchkey's seed signature, and so is the trailer signature. A chunk's signature covers the
//!   hash of its data and precedes the data, so one chunk is held until it is complete (at most
//!   [`MAX_CHUNK`]; SDKs send 64–128 KiB); nothing else is buffered. The output has exactly the
//!   input's length (a 64-hex signature for a 64-hex signature), so `Content-Length` holds.
//!
//! Anything malformed aborts the upload with a [`FramingError`]; error messages describe the
//! framing, never the bytes (which may hold anything).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use aws_lc_rs::{digest, hmac};
use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};

use super::BoxError;

/// The largest chunk latchkey holds to re-sign (16× what the AWS SDKs send); a larger one aborts
/// the upload, since holding it is memory a client could make latchkey spend per stream.
pub const MAX_CHUNK: usize = 1024 * 1024;

/// A chunk header line: up to 16 hex digits and `;chunk-signature=` + 64 hex digits.
const MAX_HEADER_LINE: usize = 128;
/// One trailer line, and all trailer lines together.
const MAX_TRAILER_LINE: usize = 1024;
const MAX_TRAILERS: usize = 8 * 1024;

const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
const SIGNATURE_EXT: &[u8] = b"chunk-signature=";
const TRAILER_SIGNATURE: &str = "x-amz-trailer-signature";

/// The body is not the aws-chunked framing it declared, or cannot be re-signed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("aws-chunked request body: {0}")]
pub struct FramingError(String);

fn bad<T>(why: impl Into<String>) -> Result<T, FramingError> {
    Err(FramingError(why.into()))
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(digest::digest(&digest::SHA256, data))
}

fn is_signature(v: &[u8]) -> bool {
    v.len() == 64 && v.iter().all(u8::is_ascii_hexdigit)
}

/// The SigV4 signing key for one day, region and service (`kSigning`).
pub fn signing_key(secret: &[u8], date: &str, region: &str, service: &str) -> hmac::Key {
    let mut k_secret = zeroize::Zeroizing::new(Vec::with_capacity(secret.len() + 4));
    k_secret.extend_from_slice(b"AWS4");
    k_secret.extend_from_slice(secret);
    let mut tag = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, &k_secret),
        date.as_bytes(),
    );
    for part in [region, service, "aws4_request"] {
        tag = hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA256, tag.as_ref()),
            part.as_bytes(),
        );
    }
    hmac::Key::new(hmac::HMAC_SHA256, tag.as_ref())
}

/// Signs chunks and the trailer with the real key, each chained to the signature before it
/// (the first to the request's seed signature).
pub struct ChunkSigner {
    key: hmac::Key,
    stamp: String,
    scope: String,
    previous: String,
}

impl std::fmt::Debug for ChunkSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkSigner")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl ChunkSigner {
    /// `stamp` is the request's `x-amz-date`; `seed` its `Authorization` signature.
    pub fn new(key: hmac::Key, stamp: &str, region: &str, service: &str, seed: &str) -> Self {
        let date = stamp.get(..8).unwrap_or(stamp);
        ChunkSigner {
            key,
            stamp: stamp.to_string(),
            scope: format!("{date}/{region}/{service}/aws4_request"),
            previous: seed.to_string(),
        }
    }

    fn sign(&mut self, algorithm: &str, payload_hash: &str) -> String {
        let to_sign = format!(
            "{algorithm}\n{}\n{}\n{}\n{payload_hash}",
            self.stamp, self.scope, self.previous
        );
        self.previous = hex::encode(hmac::sign(&self.key, to_sign.as_bytes()));
        self.previous.clone()
    }

    /// The signature of a chunk whose data is `data` (empty for the final chunk).
    pub fn chunk(&mut self, data: &[u8]) -> String {
        let hash = format!("{EMPTY_SHA256}\n{}", sha256_hex(data));
        self.sign("AWS4-HMAC-SHA256-PAYLOAD", &hash)
    }

    /// The signature of the trailer (`(name, value)` pairs, the signature line excluded):
    /// the hash of `name:value\n` per trailer, names lower-cased and sorted, values trimmed.
    pub fn trailer(&mut self, trailers: &[(String, String)]) -> String {
        let mut sorted: Vec<(String, &str)> = trailers
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v.trim()))
            .collect();
        sorted.sort();
        let mut canonical = String::new();
        for (n, v) in sorted {
            canonical.push_str(&n);
            canonical.push(':');
            canonical.push_str(v);
            canonical.push('\n');
        }
        let hash = sha256_hex(canonical.as_bytes());
        self.sign("AWS4-HMAC-SHA256-TRAILER", &hash)
    }
}

/// What the framing does with a body.
#[derive(Debug)]
pub enum Mode {
    /// `STREAMING-UNSIGNED-PAYLOAD-TRAILER`: chunks without extensions, trailers allowed, bytes
    /// unchanged.
    Check,
    /// A signed form: every chunk signature replaced; `trailer` for the `-TRAILER` form
    /// (a signed trailer is required), else no trailer lines are allowed.
    Resign {
        signer: Box<ChunkSigner>,
        trailer: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a chunk header line.
    Header,
    /// Inside a chunk's data; this many bytes to go.
    Data(usize),
    /// After a chunk's data: `\r` then `\n`.
    DataCr,
    DataLf,
    /// After the final chunk: trailer lines until an empty one.
    Trailer,
    Done,
}

/// A check of the data an aws-chunked body carries, as S3 stores it (the framing taken out):
/// a value split across two chunks is whole here. Its error aborts the upload.
pub trait PayloadScan: Send + Sync {
    /// The next data bytes, in order.
    fn data(&mut self, bytes: &[u8]) -> Result<(), String>;
    /// The last data byte has been seen.
    fn end(&mut self) -> Result<(), String>;
}

/// The aws-chunked parser: fed the body as it arrives, it yields the bytes to send on.
pub struct Framing {
    /// Sees every data byte before the input holding it is passed on.
    scan: Option<Box<dyn PayloadScan>>,
    mode: Mode,
    state: State,
    /// The header or trailer line being read (bounded).
    line: Vec<u8>,
    /// Resign: the chunk being held, and its size as the sandbox wrote it.
    held: BytesMut,
    size_text: String,
    /// Data bytes seen, and what `x-amz-decoded-content-length` promised.
    decoded: u64,
    expected: Option<u64>,
    chunks: u64,
    /// Trailer lines as sent (for re-emission), parsed, their total size, and the signature's.
    trailer_lines: Vec<Vec<u8>>,
    trailers: Vec<(String, String)>,
    trailer_bytes: usize,
    signature_line: Option<(Vec<u8>, Vec<u8>)>,
    out: VecDeque<Bytes>,
    /// Input not parsed yet: re-signing stops at each complete chunk, so at most one chunk's
    /// output is queued however large a piece of input arrives.
    pending: Bytes,
}

/// The state only: the held data and trailer values are the sandbox's, not for logs.
impl std::fmt::Debug for Framing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Framing")
            .field("mode", &self.mode)
            .field("state", &self.state)
            .field("chunks", &self.chunks)
            .field("decoded", &self.decoded)
            .finish_non_exhaustive()
    }
}

impl Framing {
    pub fn new(mode: Mode, expected: Option<u64>) -> Self {
        Framing {
            scan: None,
            mode,
            state: State::Header,
            line: Vec::new(),
            held: BytesMut::new(),
            size_text: String::new(),
            decoded: 0,
            expected,
            chunks: 0,
            trailer_lines: Vec::new(),
            trailers: Vec::new(),
            trailer_bytes: 0,
            signature_line: None,
            out: VecDeque::new(),
            pending: Bytes::new(),
        }
    }

    /// Has `scan` see the data bytes (never the framing) as they are parsed.
    pub fn scan_payload(&mut self, scan: Box<dyn PayloadScan>) {
        self.scan = Some(scan);
    }

    fn resigning(&self) -> bool {
        matches!(self.mode, Mode::Resign { .. })
    }

    /// The next bytes to send, parsing more of the input given to [`Framing::feed`] as
    /// needed; `None` when all of it is consumed.
    pub fn next_out(&mut self) -> Result<Option<Bytes>, FramingError> {
        if self.out.is_empty() && !self.pending.is_empty() {
            let input = std::mem::take(&mut self.pending);
            let mut i = 0;
            while i < input.len() {
                i += self.step(&input[i..])?;
                if self.resigning() && !self.out.is_empty() {
                    break;
                }
            }
            if self.resigning() {
                self.pending = input.slice(i..);
            } else {
                // Checked: passes on unchanged.
                self.out.push_back(input);
            }
        }
        Ok(self.out.pop_front())
    }

    /// Hands over the next piece of the body; call [`Framing::next_out`] until it answers
    /// `None` before feeding more.
    pub fn feed(&mut self, input: Bytes) {
        debug_assert!(self.pending.is_empty());
        self.pending = input;
    }

    /// The most bytes held at once (for a memory budget): one chunk and its lines when
    /// re-signing, one line and the trailer when checking.
    pub fn held_at_most(&self) -> usize {
        let lines = MAX_HEADER_LINE + MAX_TRAILER_LINE + MAX_TRAILERS;
        if self.resigning() {
            MAX_CHUNK + lines
        } else {
            lines
        }
    }

    /// The body ended: it must have ended exactly at the end of the framing.
    pub fn finish(&self) -> Result<(), FramingError> {
        match self.state {
            State::Done => Ok(()),
            State::Data(n) => bad(format!(
                "the body ended {n} bytes short of chunk {}",
                self.chunks + 1
            )),
            _ => bad("the body ended before the final chunk and the closing empty line"),
        }
    }

    /// Consumes a prefix of `input` (at least one byte); returns how much.
    fn step(&mut self, input: &[u8]) -> Result<usize, FramingError> {
        match self.state {
            State::Header | State::Trailer => {
                let cap = if self.state == State::Header {
                    MAX_HEADER_LINE
                } else {
                    MAX_TRAILER_LINE
                };
                let (taken, complete) = match input.iter().position(|&b| b == b'\n') {
                    Some(p) => (p + 1, true),
                    None => (input.len(), false),
                };
                if self.line.len() + taken > cap + 2 {
                    return bad(if self.state == State::Header {
                        format!("chunk {} header line is over {cap} bytes", self.chunks + 1)
                    } else {
                        format!("a trailer line is over {cap} bytes")
                    });
                }
                self.line.extend_from_slice(&input[..taken]);
                if complete {
                    let mut line = std::mem::take(&mut self.line);
                    if line.len() < 2 || line[line.len() - 2] != b'\r' {
                        return bad("a line ends in a bare LF (aws-chunked lines end in CRLF)");
                    }
                    line.truncate(line.len() - 2);
                    if self.state == State::Header {
                        self.header(&line)?;
                    } else {
                        self.trailer_line(line)?;
                    }
                }
                Ok(taken)
            }
            State::Data(remaining) => {
                let n = remaining.min(input.len());
                self.decoded += n as u64;
                if let Some(e) = self.expected {
                    if self.decoded > e {
                        return bad(format!(
                            "the chunks hold more data than x-amz-decoded-content-length ({e})"
                        ));
                    }
                }
                if let Some(scan) = self.scan.as_mut() {
                    scan.data(&input[..n]).map_err(FramingError)?;
                }
                if self.resigning() {
                    self.held.extend_from_slice(&input[..n]);
                }
                self.state = if n == remaining {
                    State::DataCr
                } else {
                    State::Data(remaining - n)
                };
                Ok(n)
            }
            State::DataCr | State::DataLf => {
                let want = if self.state == State::DataCr {
                    b'\r'
                } else {
                    b'\n'
                };
                if input[0] != want {
                    return bad(format!(
                        "chunk {} is longer than its size line says (no CRLF after its data)",
                        self.chunks
                    ));
                }
                if self.state == State::DataCr {
                    self.state = State::DataLf;
                } else {
                    self.emit_chunk();
                    self.state = State::Header;
                }
                Ok(1)
            }
            State::Done => bad("bytes follow the end of the aws-chunked body"),
        }
    }

    fn header(&mut self, line: &[u8]) -> Result<(), FramingError> {
        let n = self.chunks + 1;
        let (size, ext) = match line.iter().position(|&b| b == b';') {
            Some(p) => (&line[..p], Some(&line[p + 1..])),
            None => (line, None),
        };
        if size.is_empty() || size.len() > 16 || !size.iter().all(u8::is_ascii_hexdigit) {
            return bad(format!("chunk {n} does not start with a hex size"));
        }
        let size_text = String::from_utf8_lossy(size).into_owned();
        let len = u64::from_str_radix(&size_text, 16)
            .map_err(|_| FramingError(format!("chunk {n} size is not a number")))?;
        match (&self.mode, ext) {
            (Mode::Check, None) => {}
            (Mode::Check, Some(_)) => {
                return bad(format!(
                    "chunk {n} carries an extension; STREAMING-UNSIGNED-PAYLOAD-TRAILER chunks carry none"
                ))
            }
            (Mode::Resign { .. }, Some(e))
                if e.starts_with(SIGNATURE_EXT) && is_signature(&e[SIGNATURE_EXT.len()..]) => {}
            (Mode::Resign { .. }, _) => {
                return bad(format!(
                    "chunk {n} has no ';chunk-signature=' with a 64-hex signature"
                ))
            }
        }
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if self.resigning() && len > MAX_CHUNK {
            return bad(format!(
                "chunk {n} is {len} bytes; latchkey re-signs chunks of at most {MAX_CHUNK} bytes (configure the SDK's chunk size lower)"
            ));
        }
        self.chunks += 1;
        self.size_text = size_text;
        if len == 0 {
            if let Some(scan) = self.scan.as_mut() {
                scan.end().map_err(FramingError)?;
            }
            if let Some(e) = self.expected {
                if self.decoded != e {
                    return bad(format!(
                        "the chunks hold {} bytes, x-amz-decoded-content-length says {e}",
                        self.decoded
                    ));
                }
            }
            self.emit_chunk();
            self.state = State::Trailer;
        } else {
            self.state = State::Data(len);
        }
        Ok(())
    }

    /// Resign: queues the held chunk under a signature made with the real key.
    fn emit_chunk(&mut self) {
        let Mode::Resign { signer, .. } = &mut self.mode else {
            return;
        };
        let data = std::mem::take(&mut self.held).freeze();
        let signature = signer.chunk(&data);
        let head = format!("{};chunk-signature={signature}\r\n", self.size_text);
        self.out.push_back(Bytes::from(head));
        if !data.is_empty() {
            self.out.push_back(data);
            self.out.push_back(Bytes::from_static(b"\r\n"));
        }
    }

    fn trailer_line(&mut self, line: Vec<u8>) -> Result<(), FramingError> {
        if line.is_empty() {
            return self.end();
        }
        self.trailer_bytes += line.len() + 2;
        if self.trailer_bytes > MAX_TRAILERS {
            return bad(format!("the trailer is over {MAX_TRAILERS} bytes"));
        }
        if self.signature_line.is_some() {
            return bad("a trailer line follows x-amz-trailer-signature");
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return bad("a trailer line is not 'name:value'");
        };
        let name = std::str::from_utf8(&line[..colon])
            .ok()
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| FramingError("a trailer name is not a token".to_string()))?;
        if name.eq_ignore_ascii_case(TRAILER_SIGNATURE) {
            let value = &line[colon + 1..];
            let start = value
                .iter()
                .position(|b| !b.is_ascii_whitespace())
                .unwrap_or(value.len());
            let end = value
                .iter()
                .rposition(|b| !b.is_ascii_whitespace())
                .map_or(start, |p| p + 1);
            match &self.mode {
                Mode::Resign { trailer: true, .. } if is_signature(&value[start..end]) => {}
                Mode::Resign { trailer: true, .. } => {
                    return bad("x-amz-trailer-signature is not a 64-hex signature")
                }
                _ => return bad("x-amz-trailer-signature on a form whose trailer is unsigned"),
            }
            // Kept around the signature so the line keeps its length.
            let prefix = line[..colon + 1 + start].to_vec();
            let suffix = value[end..].to_vec();
            self.signature_line = Some((prefix, suffix));
            return Ok(());
        }
        if let Mode::Resign { trailer: false, .. } = self.mode {
            return bad("a trailer on STREAMING-AWS4-HMAC-SHA256-PAYLOAD, which has none (use the -TRAILER form)");
        }
        let value = std::str::from_utf8(&line[colon + 1..])
            .map_err(|_| FramingError(format!("trailer {name} is not UTF-8")))?;
        self.trailers.push((name.to_string(), value.to_string()));
        self.trailer_lines.push(line);
        Ok(())
    }

    /// The closing empty line: in resign mode, the trailer goes out under the new signature.
    fn end(&mut self) -> Result<(), FramingError> {
        self.state = State::Done;
        let Mode::Resign { signer, trailer } = &mut self.mode else {
            return Ok(());
        };
        let mut tail = Vec::new();
        if *trailer {
            let Some((prefix, suffix)) = self.signature_line.take() else {
                return bad("the trailer has no x-amz-trailer-signature");
            };
            if self.trailers.is_empty() {
                return bad("the -TRAILER form sent no trailer");
            }
            for line in &self.trailer_lines {
                tail.extend_from_slice(line);
                tail.extend_from_slice(b"\r\n");
            }
            let signature = signer.trailer(&self.trailers);
            tail.extend_from_slice(&prefix);
            tail.extend_from_slice(signature.as_bytes());
            tail.extend_from_slice(&suffix);
            tail.extend_from_slice(b"\r\n");
        }
        tail.extend_from_slice(b"\r\n");
        self.out.push_back(Bytes::from(tail));
        Ok(())
    }
}

pin_project_lite::pin_project! {
    /// A request body through [`Framing`]. On a framing error, `on_error` hears why (once) and
    /// the body fails, which aborts the upload.
    pub struct AwsChunked<B> {
        #[pin]
        inner: B,
        framing: Framing,
        on_error: Option<Box<dyn FnOnce(String) + Send + Sync>>,
        finished: bool,
    }
}

impl<B> AwsChunked<B> {
    pub fn new(
        inner: B,
        framing: Framing,
        on_error: Box<dyn FnOnce(String) + Send + Sync>,
    ) -> Self {
        AwsChunked {
            inner,
            framing,
            on_error: Some(on_error),
            finished: false,
        }
    }
}

impl<B> HttpBody for AwsChunked<B>
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
            let result = match this.framing.next_out() {
                Ok(Some(b)) => return Poll::Ready(Some(Ok(Frame::data(b)))),
                Ok(None) if *this.finished => return Poll::Ready(None),
                Ok(None) => match ready!(this.inner.as_mut().poll_frame(cx)) {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => {
                            this.framing.feed(data);
                            Ok(())
                        }
                        // HTTP trailers come after the body: its framing must be complete.
                        Err(frame) => match this.framing.finish() {
                            Ok(()) => return Poll::Ready(Some(Ok(frame))),
                            Err(e) => Err(e),
                        },
                    },
                    Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                    None => {
                        *this.finished = true;
                        this.framing.finish()
                    }
                },
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                *this.finished = true;
                this.framing.out.clear();
                this.framing.pending = Bytes::new();
                if let Some(tell) = this.on_error.take() {
                    tell(e.to_string());
                }
                return Poll::Ready(Some(Err(Box::new(e))));
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        // The output is as long as the input, byte for byte.
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[path = "aws_chunked_tests.rs"]
mod tests;

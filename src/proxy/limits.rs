//! Resource limits against abuse: connection caps (total and per client), an idle timeout on
//! every sandbox connection, and request framing checks against smuggling.
//!
//! Each limit answers with a clear status and leaves an audit record; none of them is a policy
//! decision, so report-only modes never relax them.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::HeaderMap;
use std::future::Future;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use tokio::time::{Instant, Sleep};

use crate::reason::Reason;

/// Limits configured at startup.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_client: usize,
    /// Time allowed to send a request's header block (slowloris), also the keep-alive idle time
    /// between requests on the proxy hop.
    pub header_timeout: Duration,
    /// A connection with no bytes either way for this long is closed (tunnels included).
    pub idle_timeout: Duration,
    /// Longest request target (request line) accepted.
    pub max_uri_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_connections_per_client: 256,
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
            max_uri_len: 8 * 1024,
        }
    }
}

/// Counts open connections, in total and per client address.
#[derive(Debug, Default)]
pub struct ConnectionCounter {
    inner: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// Held for the life of a connection; releases its slot on drop.
#[derive(Debug)]
pub struct ConnectionSlot {
    counter: Arc<ConnectionCounter>,
    ip: IpAddr,
}

impl ConnectionCounter {
    /// Takes a slot, or says which cap was hit.
    pub fn acquire(
        self: &Arc<Self>,
        ip: IpAddr,
        limits: &Limits,
    ) -> Result<ConnectionSlot, String> {
        let mut g = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if g.0 >= limits.max_connections {
            return Err(format!(
                "latchkey has {} connections open, its limit",
                limits.max_connections
            ));
        }
        let per = g.1.get(&ip).copied().unwrap_or(0);
        if per >= limits.max_connections_per_client {
            return Err(format!(
                "client {ip} has {per} connections open, the per-client limit"
            ));
        }
        g.0 += 1;
        *g.1.entry(ip).or_insert(0) += 1;
        Ok(ConnectionSlot {
            counter: self.clone(),
            ip,
        })
    }

    /// Open connections now.
    pub fn open(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut g = self
            .counter
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.0 = g.0.saturating_sub(1);
        if let Some(n) = g.1.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                g.1.remove(&self.ip);
            }
        }
    }
}

/// Refuses request framing that two parsers could read differently (RFC 9112 §6), on the
/// headers hyper parsed: the rules of [`framing_rules`]. hyper already drops some of what these
/// rules look for, so the raw heads are judged too ([`HeadSniff`]); this is the check for h2 and
/// the second line for HTTP/1.
pub fn check_framing(headers: &HeaderMap) -> Result<(), (Reason, String)> {
    let cl: Vec<&[u8]> = headers
        .get_all(CONTENT_LENGTH)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    let te: Vec<&[u8]> = headers
        .get_all(TRANSFER_ENCODING)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    framing_rules(&cl, &te, false)
        .map(|_| ())
        .map_err(|m| (Reason::AmbiguousFraming, m.to_string()))
}

/// An IO that fails with `TimedOut` after `timeout` without a byte read or written, and
/// tracks whether the client sent bytes since latchkey last wrote (a request in progress, as
/// opposed to an idle keep-alive connection).
pub struct Idle<T> {
    inner: T,
    sleep: Pin<Box<Sleep>>,
    timeout: Duration,
    partial: Arc<AtomicBool>,
    heads: Arc<HeadSniff>,
}

/// Every request head on an HTTP/1 connection, parsed from the raw bytes in the order the client
/// sent them, so framing that hyper normalises away is still judged.
///
/// hyper resolves ambiguous framing before a service sees the request (it drops a
/// `Content-Length` next to `Transfer-Encoding` and merges equal `Content-Length`s), so
/// [`check_framing`] on hyper's headers cannot see a smuggling attempt. The connection's reader
/// feeds every byte it reads here. A strict incremental parser — `httparse` for each head (the
/// parser hyper uses, so both find the same heads), and hyper's own rules for skipping a
/// `Content-Length` or chunked body — finds each head wherever it starts: after a body, split
/// across reads, pipelined behind another, with CRLF or bare-LF line endings. Each head gets a
/// verdict from [`framing_rules`]. The service marks each request hyper hands it
/// ([`HeadSniff::begin_request`]), so the Nth request is judged by the Nth head, and
/// [`HeadSniff::framing_of`] checks that head's method and target match the request's.
///
/// It fails closed: once it cannot tell where the next head starts (after an ambiguous or
/// malformed head, malformed chunked framing, a head over the size limit, or too many heads
/// queued ahead of the answers), every later request on the connection is refused. Memory is
/// bounded: one head's bytes and a fixed-size queue; body bytes are counted, never kept.
#[derive(Debug, Default)]
pub struct HeadSniff {
    inner: Mutex<Sniffer>,
}

/// Largest head buffered: hyper refuses a head over `MAX_HEADER_BYTES` before this is reached.
const SNIFF_HEAD_LIMIT: usize = super::MAX_HEADER_BYTES + 16 * 1024;
/// Largest chunked trailer section followed (hyper's own limit is 16 KiB).
const SNIFF_TRAILER_LIMIT: usize = 64 * 1024;
/// Heads parsed ahead of the requests hyper has handed to the service.
const SNIFF_QUEUE: usize = 1024;
/// Header lines parsed per head (hyper accepts 100).
const SNIFF_MAX_HEADERS: usize = 128;

const LOST_AMBIGUOUS: &str = "an earlier request on it had ambiguous framing";
const LOST_MALFORMED: &str = "an earlier request head on it was malformed";
const LOST_TOO_LARGE: &str = "an earlier request head on it was over the size limit";
const LOST_CHUNKED: &str = "an earlier chunked body on it was malformed";
const LOST_QUEUE: &str = "too many requests were pipelined ahead of the answers";

/// The parser's state; `Debug` shows sizes only, never the head bytes (they may hold
/// credentials the sandbox sent).
#[derive(Default)]
struct Sniffer {
    state: Framing,
    /// The bytes of the head being read (it starts where the previous message ended).
    head: Vec<u8>,
    /// Verdicts of heads parsed and not yet passed by the service, oldest first.
    seen: VecDeque<Seen>,
    /// Heads parsed so far; the next head's index.
    parsed: u64,
    /// Requests hyper has handed to the service so far.
    served: u64,
    /// Why framing was lost, once it was.
    lost: Option<&'static str>,
    /// Keys the (method, target) fingerprints, so a client cannot aim for a collision.
    keys: std::hash::RandomState,
}

impl std::fmt::Debug for Sniffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sniffer")
            .field("state", &self.state)
            .field("head_len", &self.head.len())
            .field("queued", &self.seen.len())
            .field("parsed", &self.parsed)
            .field("served", &self.served)
            .field("lost", &self.lost)
            .finish()
    }
}

#[derive(Debug)]
struct Seen {
    index: u64,
    key: u64,
    verdict: Result<(), &'static str>,
}

/// Where the parser is in the byte stream.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Framing {
    #[default]
    Head,
    Length(u64),
    Chunked {
        state: Chunk,
        size: u64,
        trailer: usize,
    },
    Lost,
}

/// hyper's chunked decoder states (`proto/h1/decode.rs`), mirrored so both skip the same bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Start,
    Size,
    SizeLws,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    EndCr,
    EndLf,
    Trailer,
    TrailerLf,
}

/// How a request's body is framed, once its head passed [`framing_rules`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
}

/// The framing rules, on raw header values: exactly one way to read the body (RFC 9112 §6).
/// Refused: both `Content-Length` and `Transfer-Encoding`; more than one of either (equal values
/// too); a `Content-Length` that is not plain digits (`+5`, `5, 5`, `0x5`); any transfer coding
/// but a single `chunked` (`chunked, identity`, `gzip, chunked`, `identity`); a
/// `Transfer-Encoding` on HTTP/1.0. Optional whitespace around a value is trimmed.
pub fn framing_rules(
    cl: &[&[u8]],
    te: &[&[u8]],
    http10: bool,
) -> Result<BodyFraming, &'static str> {
    if !cl.is_empty() && !te.is_empty() {
        return Err("request has both Content-Length and Transfer-Encoding");
    }
    if cl.len() > 1 {
        return Err("request has more than one Content-Length");
    }
    if te.len() > 1 {
        return Err("request has more than one Transfer-Encoding");
    }
    if let Some(v) = te.first() {
        if http10 {
            return Err("HTTP/1.0 request has a Transfer-Encoding");
        }
        if !trim_ows(v).eq_ignore_ascii_case(b"chunked") {
            return Err("request has a Transfer-Encoding other than chunked");
        }
        return Ok(BodyFraming::Chunked);
    }
    if let Some(v) = cl.first() {
        let v = trim_ows(v);
        let n = std::str::from_utf8(v)
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or("request has an invalid Content-Length")?;
        return Ok(if n == 0 {
            BodyFraming::None
        } else {
            BodyFraming::Length(n)
        });
    }
    Ok(BodyFraming::None)
}

fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = v.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    match (start, end) {
        (Some(s), Some(e)) => &v[s..=e],
        _ => &[],
    }
}

/// The outcome of parsing the bytes buffered for one head.
enum HeadParse {
    Partial,
    Malformed,
    Complete {
        len: usize,
        key: u64,
        framing: Result<BodyFraming, &'static str>,
    },
}

fn parse_head(buf: &[u8], keys: &std::hash::RandomState) -> HeadParse {
    use std::hash::BuildHasher;
    let mut headers = [httparse::EMPTY_HEADER; SNIFF_MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return HeadParse::Partial,
        Err(_) => return HeadParse::Malformed,
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return HeadParse::Malformed;
    };
    // The target as hyper's `Uri` prints it, to compare with the request the service sees.
    let Ok(uri) = http::Uri::try_from(target) else {
        return HeadParse::Malformed;
    };
    let key = keys.hash_one((method, uri.to_string().as_str()));
    let mut cl = Vec::new();
    let mut te = Vec::new();
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            cl.push(h.value);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            te.push(h.value);
        }
    }
    HeadParse::Complete {
        len,
        key,
        framing: framing_rules(&cl, &te, version == 0),
    }
}

impl Sniffer {
    fn lose(&mut self, why: &'static str) {
        self.state = Framing::Lost;
        self.lost.get_or_insert(why);
        self.head = Vec::new();
    }

    fn feed(&mut self, mut input: &[u8]) {
        while !input.is_empty() {
            match self.state {
                Framing::Lost => return,
                Framing::Head => match self.feed_head(input) {
                    Some(rest) => input = rest,
                    None => return,
                },
                Framing::Length(left) => {
                    let n = input.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    let left = left - n as u64;
                    self.state = if left == 0 {
                        Framing::Head
                    } else {
                        Framing::Length(left)
                    };
                    input = &input[n..];
                }
                Framing::Chunked {
                    state: Chunk::Data,
                    size,
                    trailer,
                } => {
                    let n = input.len().min(usize::try_from(size).unwrap_or(usize::MAX));
                    let size = size - n as u64;
                    let state = if size == 0 {
                        Chunk::DataCr
                    } else {
                        Chunk::Data
                    };
                    self.state = Framing::Chunked {
                        state,
                        size,
                        trailer,
                    };
                    input = &input[n..];
                }
                Framing::Chunked {
                    state,
                    size,
                    trailer,
                } => {
                    self.state = match chunk_step(state, size, trailer, input[0]) {
                        Some(next) => next,
                        None => {
                            self.lose(LOST_CHUNKED);
                            return;
                        }
                    };
                    input = &input[1..];
                }
            }
        }
    }

    /// Buffers head bytes; at a complete head, records its verdict and returns the bytes after
    /// it. `None` when all input was consumed (or framing was lost).
    fn feed_head<'a>(&mut self, input: &'a [u8]) -> Option<&'a [u8]> {
        let room = SNIFF_HEAD_LIMIT.saturating_sub(self.head.len());
        let take = input.len().min(room);
        let first = self.head.is_empty();
        self.head.extend_from_slice(&input[..take]);
        // A head can only complete at a newline; the first bytes are parsed at once so that
        // what is not HTTP (TLS after a CONNECT) is recognised without being buffered.
        let parse = if first || input[..take].contains(&b'\n') {
            parse_head(&self.head, &self.keys)
        } else {
            HeadParse::Partial
        };
        match parse {
            HeadParse::Partial if self.head.len() >= SNIFF_HEAD_LIMIT => {
                self.lose(LOST_TOO_LARGE);
                None
            }
            HeadParse::Partial => None,
            HeadParse::Malformed => {
                self.lose(LOST_MALFORMED);
                None
            }
            HeadParse::Complete { len, key, framing } => {
                // The head ended inside this input: the earlier bytes were an incomplete head.
                let Some(back) = take.checked_sub(self.head.len().saturating_sub(len)) else {
                    self.lose(LOST_MALFORMED);
                    return None;
                };
                // Keep a small buffer for the next head, not the largest one seen.
                if self.head.capacity() > 16 * 1024 {
                    self.head = Vec::new();
                } else {
                    self.head.clear();
                }
                if self.seen.len() >= SNIFF_QUEUE {
                    self.lose(LOST_QUEUE);
                    return None;
                }
                self.seen.push_back(Seen {
                    index: self.parsed,
                    key,
                    verdict: framing.map(|_| ()),
                });
                self.parsed += 1;
                self.state = match framing {
                    Ok(BodyFraming::None) => Framing::Head,
                    Ok(BodyFraming::Length(n)) => Framing::Length(n),
                    Ok(BodyFraming::Chunked) => Framing::Chunked {
                        state: Chunk::Start,
                        size: 0,
                        trailer: 0,
                    },
                    Err(_) => {
                        self.lose(LOST_AMBIGUOUS);
                        return None;
                    }
                };
                Some(&input[back..])
            }
        }
    }
}

/// One byte of chunked framing outside chunk data, exactly as hyper reads it; `None` where hyper
/// would fail the body.
fn chunk_step(state: Chunk, size: u64, trailer: usize, b: u8) -> Option<Framing> {
    let hex = |b: u8| (b as char).to_digit(16).map(u64::from);
    let at = |state, size| {
        Some(Framing::Chunked {
            state,
            size,
            trailer,
        })
    };
    match state {
        Chunk::Start => at(Chunk::Size, hex(b)?),
        Chunk::Size => match b {
            b'\t' | b' ' => at(Chunk::SizeLws, size),
            b';' => at(Chunk::Extension, size),
            b'\r' => at(Chunk::SizeLf, size),
            _ => at(Chunk::Size, size.checked_mul(16)?.checked_add(hex(b)?)?),
        },
        Chunk::SizeLws => match b {
            b'\t' | b' ' => at(Chunk::SizeLws, size),
            b';' => at(Chunk::Extension, size),
            b'\r' => at(Chunk::SizeLf, size),
            _ => None,
        },
        Chunk::Extension => match b {
            b'\r' => at(Chunk::SizeLf, size),
            b'\n' => None,
            _ => at(Chunk::Extension, size),
        },
        Chunk::SizeLf if b == b'\n' && size == 0 => at(Chunk::EndCr, 0),
        Chunk::SizeLf if b == b'\n' => at(Chunk::Data, size),
        Chunk::DataCr if b == b'\r' => at(Chunk::DataLf, 0),
        Chunk::DataLf if b == b'\n' => at(Chunk::Start, 0),
        Chunk::EndCr if b == b'\r' => at(Chunk::EndLf, 0),
        Chunk::EndCr | Chunk::Trailer => {
            let trailer = trailer + 1;
            if trailer > SNIFF_TRAILER_LIMIT {
                return None;
            }
            let state = if b == b'\r' && state == Chunk::Trailer {
                Chunk::TrailerLf
            } else {
                Chunk::Trailer
            };
            Some(Framing::Chunked {
                state,
                size: 0,
                trailer,
            })
        }
        Chunk::TrailerLf if b == b'\n' => at(Chunk::EndCr, 0),
        Chunk::EndLf if b == b'\n' => Some(Framing::Head),
        Chunk::SizeLf | Chunk::DataCr | Chunk::DataLf | Chunk::TrailerLf | Chunk::EndLf => None,
        Chunk::Data => at(Chunk::Data, size),
    }
}

impl HeadSniff {
    fn on_read(&self, bytes: &[u8]) {
        self.lock().feed(bytes);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sniffer> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks that hyper handed the service its next request on this connection. Call it once
    /// per request, first thing, on every HTTP/1 connection that feeds this sniffer.
    pub fn begin_request(&self) {
        let mut g = self.lock();
        g.served += 1;
        let current = g.served - 1;
        while g.seen.front().is_some_and(|s| s.index < current) {
            g.seen.pop_front();
        }
    }

    /// The framing verdict of the current request (the one [`Self::begin_request`] last marked)
    /// from its raw head; `method` and `target` as the service sees them (`Uri`'s display).
    /// Always `Some`: a head that was not seen, or that names another request, is refused.
    pub fn framing_of(&self, method: &str, target: &str) -> Option<Result<(), (Reason, String)>> {
        use std::hash::BuildHasher;
        let g = self.lock();
        let refuse = |m: String| Some(Err((Reason::AmbiguousFraming, m)));
        let current = g.served.checked_sub(1);
        match g.seen.front() {
            Some(s) if Some(s.index) == current => {
                if s.key != g.keys.hash_one((method, target)) {
                    return refuse(
                        "the request does not match the request head at its place on the connection"
                            .to_string(),
                    );
                }
                match s.verdict {
                    Ok(()) => Some(Ok(())),
                    Err(m) => refuse(m.to_string()),
                }
            }
            _ => refuse(format!(
                "latchkey cannot tell where this request begins on the connection: {}; send it on a new connection",
                g.lost.unwrap_or("its head was not seen")
            )),
        }
    }
}

impl<T> Idle<T> {
    pub fn new(inner: T, timeout: Duration) -> Self {
        Self {
            inner,
            sleep: Box::pin(tokio::time::sleep(timeout)),
            timeout,
            partial: Arc::new(AtomicBool::new(false)),
            heads: Arc::new(HeadSniff::default()),
        }
    }

    /// The raw request heads seen on this connection.
    pub fn heads(&self) -> Arc<HeadSniff> {
        self.heads.clone()
    }

    /// True while the client has sent bytes that latchkey has not answered yet.
    pub fn partial(&self) -> Arc<AtomicBool> {
        self.partial.clone()
    }

    fn touch(&mut self) {
        let deadline = Instant::now() + self.timeout;
        self.sleep.as_mut().reset(deadline);
    }

    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.sleep.as_mut().poll(cx).is_ready()
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
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.touch();
                    this.partial.store(true, Ordering::Relaxed);
                    this.heads.on_read(&buf.filled()[before..]);
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
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wrote(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        for h in [
            headers(&[("content-length", "5"), ("transfer-encoding", "chunked")]),
            headers(&[("content-length", "5"), ("content-length", "5")]),
            headers(&[("content-length", "5, 5")]),
            headers(&[("content-length", "-1")]),
            headers(&[("transfer-encoding", "gzip, chunked")]),
            headers(&[("transfer-encoding", "identity")]),
        ] {
            assert!(check_framing(&h).is_err(), "{h:?}");
        }
        for h in [
            headers(&[]),
            headers(&[("content-length", "5")]),
            headers(&[("transfer-encoding", "chunked")]),
        ] {
            assert!(check_framing(&h).is_ok(), "{h:?}");
        }
    }

    /// Feeds `reads` one by one, then judges `requests` (method, target) in order.
    fn verdicts(reads: &[&[u8]], requests: &[(&str, &str)]) -> Vec<Result<(), String>> {
        let sniff = HeadSniff::default();
        for r in reads {
            sniff.on_read(r);
        }
        requests
            .iter()
            .map(|(m, t)| {
                sniff.begin_request();
                match sniff.framing_of(m, t) {
                    Some(Ok(())) => Ok(()),
                    Some(Err((_, msg))) => Err(msg),
                    None => Err("no verdict".to_string()),
                }
            })
            .collect()
    }

    const AMBIGUOUS: &[&str] = &[
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
        "Content-Length: 5\r\nContent-Length: 5\r\n",
        "content-length: 5\r\nCONTENT-LENGTH: 6\r\n",
        "Content-Length: 5, 5\r\n",
        "Content-Length: +5\r\n",
        "Content-Length: 0x5\r\n",
        "Content-Length: \r\n",
        "Content-Length: 99999999999999999999999\r\n",
        "Transfer-Encoding: chunked, identity\r\n",
        "Transfer-Encoding: gzip, chunked\r\n",
        "Transfer-Encoding: identity\r\n",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked, chunked\r\n",
    ];

    #[test]
    fn raw_heads_reveal_what_hyper_normalises_away_in_every_line_ending() {
        for headers in AMBIGUOUS {
            for lf in [false, true] {
                let mut head = format!(
                    "POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\n{headers}\r\n0\r\n\r\n"
                );
                if lf {
                    head = head.replace("\r\n", "\n");
                }
                let v = verdicts(&[head.as_bytes()], &[("POST", "http://a.test/x")]);
                assert!(v[0].is_err(), "{head:?}: {v:?}");
            }
        }
        let v = verdicts(
            &[b"POST http://a.test/x HTTP/1.0\nTransfer-Encoding: chunked\n\n"],
            &[("POST", "http://a.test/x")],
        );
        assert!(v[0].is_err(), "TE on HTTP/1.0: {v:?}");
        for ok in [
            "GET http://a.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n",
            "GET http://a.test/x HTTP/1.1\nHost: a.test\n\n",
            "GET http://a.test/x HTTP/1.1\r\nContent-Length:  007 \r\n\r\n1234567",
            "GET http://a.test/x HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n0\r\n\r\n",
            "\r\n\nGET http://a.test/x HTTP/1.1\r\n\r\n",
        ] {
            let v = verdicts(&[ok.as_bytes()], &[("GET", "http://a.test/x")]);
            assert_eq!(v, vec![Ok(())], "{ok:?}");
        }
    }

    /// A connection carrying clean requests with every body framing, then a smuggling head.
    const STREAM: &[u8] = b"GET http://a.test/1 HTTP/1.1\r\nHost: a.test\r\n\r\n\
POST http://a.test/2 HTTP/1.1\nContent-Length: 29\n\n\
GET http://a.test/x HTTP/1.1\n\
POST http://a.test/3 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
5;ext=\"a\"\r\nGET /\r\n00000a  \r\nHTTP/1.1\r\n\r\n0\r\nX-Trailer: 1\r\nContent-Length: 5\r\n\r\n\
GET http://a.test/4 HTTP/1.1\nContent-Length: 5\nTransfer-Encoding: chunked\n\n0\n\n\
GET http://a.test/5 HTTP/1.1\r\n\r\n";

    const STREAM_REQUESTS: &[(&str, &str)] = &[
        ("GET", "http://a.test/1"),
        ("POST", "http://a.test/2"),
        ("POST", "http://a.test/3"),
        ("GET", "http://a.test/4"),
        ("GET", "http://a.test/5"),
    ];

    fn stream_ok(v: &[Result<(), String>]) -> bool {
        v.len() == 5
            && v[..3].iter().all(Result::is_ok)
            && v[3]
                .as_ref()
                .is_err_and(|e| e.contains("both Content-Length and Transfer-Encoding"))
            && v[4]
                .as_ref()
                .is_err_and(|e| e.contains("cannot tell where this request begins"))
    }

    #[test]
    fn every_head_is_found_after_bodies_and_across_reads() {
        let v = verdicts(&[STREAM], STREAM_REQUESTS);
        assert!(stream_ok(&v), "whole: {v:?}");
        for cut in 1..STREAM.len() {
            let v = verdicts(&[&STREAM[..cut], &STREAM[cut..]], STREAM_REQUESTS);
            assert!(stream_ok(&v), "cut at {cut}: {v:?}");
        }
        let bytes: Vec<&[u8]> = STREAM.chunks(1).collect();
        let v = verdicts(&bytes, STREAM_REQUESTS);
        assert!(stream_ok(&v), "byte by byte: {v:?}");
    }

    #[test]
    fn a_request_that_is_not_the_next_head_is_refused() {
        let head: &[u8] =
            b"GET http://a.test/1 HTTP/1.1\r\n\r\nGET http://a.test/2 HTTP/1.1\r\n\r\n";
        let v = verdicts(&[head], &[("GET", "http://a.test/2")]);
        assert!(
            v[0].as_ref().is_err_and(|e| e.contains("does not match")),
            "{v:?}"
        );
        let v = verdicts(
            &[head],
            &[
                ("GET", "http://a.test/1"),
                ("GET", "http://a.test/2"),
                ("GET", "http://a.test/3"),
            ],
        );
        assert_eq!(v[..2], [Ok(()), Ok(())]);
        assert!(
            v[2].as_ref().is_err_and(|e| e.contains("was not seen")),
            "{v:?}"
        );
        // Not begun: fail closed.
        let sniff = HeadSniff::default();
        sniff.on_read(head);
        assert!(matches!(
            sniff.framing_of("GET", "http://a.test/1"),
            Some(Err(_))
        ));
    }

    #[test]
    fn malformed_chunked_framing_and_oversized_heads_lose_the_connection() {
        for body in [
            "5\nhello\r\n0\r\n\r\n",
            "5\r\nhello\n0\r\n\r\n",
            "5\r\nhelloX\r\n0\r\n\r\n",
            "g\r\n",
            "5;a\nb\r\nhello\r\n0\r\n\r\n",
            "5 5\r\nhello\r\n0\r\n\r\n",
            "ffffffffffffffffff\r\n",
            "0\r\n\r\r\n",
        ] {
            let stream = format!(
                "POST http://a.test/1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{body}GET http://a.test/2 HTTP/1.1\r\n\r\n"
            );
            let v = verdicts(
                &[stream.as_bytes()],
                &[("POST", "http://a.test/1"), ("GET", "http://a.test/2")],
            );
            assert!(v[0].is_ok(), "{body:?}: {v:?}");
            assert!(
                v[1].as_ref().is_err_and(|e| e.contains("chunked body")),
                "{body:?}: {v:?}"
            );
        }
        let big = format!(
            "GET http://a.test/1 HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(SNIFF_HEAD_LIMIT)
        );
        let v = verdicts(&[big.as_bytes()], &[("GET", "http://a.test/1")]);
        assert!(
            v[0].as_ref().is_err_and(|e| e.contains("size limit")),
            "{v:?}"
        );
        let sniff = HeadSniff::default();
        sniff.on_read(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03");
        assert_eq!(
            sniff.lock().state,
            Framing::Lost,
            "TLS bytes are not a head"
        );
        assert!(sniff.lock().head.is_empty());
    }

    #[test]
    fn a_sniffer_never_prints_the_head_bytes() {
        let sniff = HeadSniff::default();
        sniff.on_read(b"GET http://a.test/ HTTP/1.1\r\nAuthorization: Bearer sk-live-123456\r\n");
        let shown = format!("{sniff:?}");
        assert!(
            !shown.contains("sk-live") && shown.contains("head_len"),
            "{shown}"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Read boundaries never change a verdict: the stream cut at up to 8 random points
        /// (including mid-line, mid-CRLF, mid-chunk-size) is judged as the whole stream is.
        #[test]
        fn proptest_sniffer_verdicts_do_not_depend_on_read_boundaries(
            cuts in proptest::collection::vec(0..STREAM.len(), 0..8)
        ) {
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut reads = Vec::new();
            let mut at = 0;
            for c in cuts {
                reads.push(&STREAM[at..c]);
                at = c;
            }
            reads.push(&STREAM[at..]);
            let v = verdicts(&reads, STREAM_REQUESTS);
            proptest::prop_assert!(stream_ok(&v), "{:?}", v);
        }

        /// Arbitrary bytes never panic the sniffer and never grow it past its bounds.
        #[test]
        fn proptest_sniffer_survives_arbitrary_bytes(
            reads in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256), 0..16)
        ) {
            let sniff = HeadSniff::default();
            for r in &reads {
                sniff.on_read(r);
                sniff.begin_request();
                let _ = sniff.framing_of("GET", "/");
            }
            let g = sniff.lock();
            proptest::prop_assert!(g.head.len() <= SNIFF_HEAD_LIMIT && g.seen.len() <= SNIFF_QUEUE);
        }
    }

    #[test]
    fn connection_caps_hold_per_client_and_in_total() {
        let limits = Limits {
            max_connections: 3,
            max_connections_per_client: 2,
            ..Limits::default()
        };
        let c = Arc::new(ConnectionCounter::default());
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let s1 = c.acquire(a, &limits).expect("1");
        let _s2 = c.acquire(a, &limits).expect("2");
        assert!(c.acquire(a, &limits).is_err(), "per-client cap");
        let _s3 = c.acquire(b, &limits).expect("3");
        assert!(c.acquire(b, &limits).is_err(), "total cap");
        drop(s1);
        assert!(c.acquire(b, &limits).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_times_out() {
        use tokio::io::AsyncReadExt;
        let (a, _b) = tokio::io::duplex(64);
        let mut idle = Box::pin(Idle::new(a, Duration::from_secs(5)));
        let mut buf = [0u8; 8];
        let e = idle.read(&mut buf).await.expect_err("times out");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }
}

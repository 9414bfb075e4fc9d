//! [`HeadSniff`]: every request head of an HTTP/1 connection, parsed with `httparse` from the
//! raw bytes, so framing that hyper normalises away is still judged. Depends on nothing in the
//! crate but `reason` and the framing rules next to it; it never sees a socket (the connection's
//! [`super::Idle`] reader feeds it) and never keeps body bytes.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use http::{Method, Uri};

use super::framing::{framing_rules, BodyFraming};
use crate::reason::{Reason, Refusal};

/// Every request head on an HTTP/1 connection, parsed from the raw bytes in the order the client
/// sent them, so framing that hyper normalises away is still judged.
///
/// hyper resolves ambiguous framing before a service sees the request (it drops a
/// `Content-Length` next to `Transfer-Encoding` and merges equal `Content-Length`s; no builder
/// option makes it refuse them), so [`super::check_framing`] on hyper's headers cannot see a
/// smuggling attempt. The connection's reader feeds every byte it reads here. A strict
/// incremental parser — `httparse` for each head (the parser hyper uses, so both find the same
/// heads), and hyper's own rules for skipping a `Content-Length` or chunked body — finds each
/// head wherever it starts: after a body, split across reads, pipelined behind another, with
/// CRLF or bare-LF line endings. Each head gets a verdict from [`framing_rules`]. The service
/// marks each request hyper hands it ([`HeadSniff::begin_request`]), so the Nth request is
/// judged by the Nth head, and [`HeadSniff::framing_of`] checks that head's method and target
/// match the request's.
///
/// It fails closed: once it cannot tell where the next head starts (after an ambiguous or
/// malformed head, malformed chunked framing, a head over the size limit, or too many heads
/// queued ahead of the answers), every later request on the connection is refused. Memory is
/// bounded: one head's bytes and a fixed-size queue; body bytes are counted, never kept.
///
/// Cost on the read path: a head that arrives in one read is parsed where it lies (no copy);
/// a head split across reads is buffered and parsed again only when a blank line arrives; once
/// framing is lost (TLS after a CONNECT, an h2 preface) a read costs one atomic load.
#[derive(Debug, Default)]
pub struct HeadSniff {
    inner: Mutex<Sniffer>,
    /// Set once framing is lost: nothing more to parse, so reads skip the lock.
    done: AtomicBool,
}

/// Largest head buffered: hyper refuses a head over `MAX_HEADER_BYTES` before this is reached.
pub(super) const SNIFF_HEAD_LIMIT: usize = crate::MAX_HEADER_BYTES + 16 * 1024;
/// Largest chunked trailer section followed (hyper's own limit is 16 KiB).
const SNIFF_TRAILER_LIMIT: usize = 64 * 1024;
/// Heads parsed ahead of the requests hyper has handed to the service.
pub(super) const SNIFF_QUEUE: usize = 1024;
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
pub(super) struct Sniffer {
    pub(super) state: Framing,
    /// The bytes of a head split across reads (it starts where the previous message ended);
    /// empty while heads arrive whole.
    pub(super) head: Vec<u8>,
    /// Verdicts of heads parsed and not yet passed by the service, oldest first.
    pub(super) seen: VecDeque<Seen>,
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
pub(super) struct Seen {
    index: u64,
    key: u64,
    verdict: Result<(), &'static str>,
}

/// Where the parser is in the byte stream.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
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
pub(super) enum Chunk {
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

/// The fingerprint of a request: its method and its target as `Uri` parses it, by component.
/// The same bytes parse to the same components on both sides (hyper builds the request's `Uri`
/// with the same parser), so no side has to print its `Uri` to compare.
fn request_key(keys: &std::hash::RandomState, method: &str, uri: &Uri) -> u64 {
    keys.hash_one((
        method,
        uri.scheme_str(),
        uri.authority().map(http::uri::Authority::as_str),
        uri.path(),
        uri.query(),
    ))
}

fn parse_head(buf: &[u8], keys: &std::hash::RandomState) -> HeadParse {
    // Uninitialised slots: parsing a head does not first zero 128 header slots (4 KiB).
    let mut headers = [MaybeUninit::<httparse::Header<'_>>::uninit(); SNIFF_MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut headers) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return HeadParse::Partial,
        Err(_) => return HeadParse::Malformed,
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return HeadParse::Malformed;
    };
    let Ok(uri) = Uri::try_from(target) else {
        return HeadParse::Malformed;
    };
    let key = request_key(keys, method, &uri);
    // Two of each are enough for the rules to judge (one is fine, two is refused).
    let mut cl: [&[u8]; 2] = [&[]; 2];
    let mut te: [&[u8]; 2] = [&[]; 2];
    let (mut ncl, mut nte) = (0, 0);
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            if ncl < 2 {
                cl[ncl] = h.value;
                ncl += 1;
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") && nte < 2 {
            te[nte] = h.value;
            nte += 1;
        }
    }
    HeadParse::Complete {
        len,
        key,
        framing: framing_rules(&cl[..ncl], &te[..nte], version == 0),
    }
}

/// Whether `bytes` hold a blank line (`\n\n` or `\n\r\n`): a head can only end at one.
fn has_blank_line(bytes: &[u8]) -> bool {
    bytes.iter().enumerate().any(|(i, b)| {
        *b == b'\n'
            && match bytes.get(i + 1) {
                Some(b'\n') => true,
                Some(b'\r') => bytes.get(i + 2) == Some(&b'\n'),
                _ => false,
            }
    })
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

    /// Judges the head that starts at `input` (or continues the buffered one); at a complete
    /// head, records its verdict and returns the bytes after it. `None` when all input was
    /// consumed (or framing was lost).
    fn feed_head<'a>(&mut self, input: &'a [u8]) -> Option<&'a [u8]> {
        if self.head.is_empty() {
            // The usual case: the whole head is in this read; judge it where it lies. The first
            // bytes are always parsed, so what is not HTTP (TLS after a CONNECT, an h2 preface)
            // is recognised at once and never buffered.
            let take = input.len().min(SNIFF_HEAD_LIMIT);
            return match parse_head(&input[..take], &self.keys) {
                HeadParse::Complete { len, key, framing } => {
                    self.record(key, framing).then(|| &input[len..])
                }
                HeadParse::Malformed => {
                    self.lose(LOST_MALFORMED);
                    None
                }
                HeadParse::Partial if take >= SNIFF_HEAD_LIMIT => {
                    self.lose(LOST_TOO_LARGE);
                    None
                }
                HeadParse::Partial => {
                    self.head.extend_from_slice(&input[..take]);
                    None
                }
            };
        }
        // A head split across reads: buffer it, and parse again only once a blank line (where
        // a head can end) is among the new bytes or straddles into them.
        let before = self.head.len();
        let take = input.len().min(SNIFF_HEAD_LIMIT.saturating_sub(before));
        self.head.extend_from_slice(&input[..take]);
        let parse = if has_blank_line(&self.head[before.saturating_sub(2)..]) {
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
                // Split heads are rare: give the buffer back rather than keep it per connection.
                self.head = Vec::new();
                self.record(key, framing).then(|| &input[back..])
            }
        }
    }

    /// Queues a complete head's verdict and moves on to its body; false when framing is lost.
    fn record(&mut self, key: u64, framing: Result<BodyFraming, &'static str>) -> bool {
        if self.seen.len() >= SNIFF_QUEUE {
            self.lose(LOST_QUEUE);
            return false;
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
                return false;
            }
        };
        true
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
    /// Feeds bytes the client sent, in order. Once framing is lost this is one atomic load.
    pub(super) fn on_read(&self, bytes: &[u8]) {
        if self.done.load(Ordering::Relaxed) {
            return;
        }
        let mut g = self.lock();
        g.feed(bytes);
        if g.state == Framing::Lost {
            self.done.store(true, Ordering::Relaxed);
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Sniffer> {
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
    /// from its raw head; `method` and `uri` as hyper parsed them. A head that was not seen, or
    /// that names another request, is refused.
    pub fn framing_of(&self, method: &Method, uri: &Uri) -> Result<(), Refusal> {
        let g = self.lock();
        let refuse = |m: String| Err(Refusal::new(Reason::AmbiguousFraming, m));
        let current = g.served.checked_sub(1);
        match g.seen.front() {
            Some(s) if Some(s.index) == current => {
                if s.key != request_key(&g.keys, method.as_str(), uri) {
                    return refuse(
                        "the request does not match the request head at its place on the connection"
                            .to_string(),
                    );
                }
                match s.verdict {
                    Ok(()) => Ok(()),
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

#[cfg(test)]
#[path = "sniff_tests.rs"]
mod tests;

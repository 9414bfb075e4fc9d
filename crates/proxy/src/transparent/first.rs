//! The first bytes of a captured connection: what it is — a TLS ClientHello, an HTTP/1 request,
//! or anything else — read under the caller's deadline and a size cap, and kept, so they can be
//! handed on: to the TLS acceptor, to hyper (replayed), or to a `tunnel = true` upstream (the
//! ClientHello exactly as the client sent it).
//!
//! Memory: at most [`MAX_FIRST_BYTES`] per connection, read [`CHUNK`] at a time, every read
//! bounded by the deadline. An HTTP head is parsed again only when a new line arrived, and
//! httparse stops at [`MAX_HEADERS`] lines, so a head sent a byte at a time costs no more than
//! one sent whole. Depends on `reason` and the TLS and HTTP parsers; decides nothing.

use httparse::Status;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use crate::reason::{Reason, Refusal};

/// The most latchkey reads before it knows what a connection is: a ClientHello or a request
/// head, whichever it turns out to be, gets the header-block limit.
pub(super) const MAX_FIRST_BYTES: usize = super::super::MAX_HEADER_BYTES;
/// One read's worth.
const CHUNK: usize = 4096;
/// Header lines a request head may have (hyper's own limit is 100).
const MAX_HEADERS: usize = 128;
/// The longest method token the request-line check waits for before calling it not HTTP.
const MAX_METHOD: usize = 24;

/// What a connection's first bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A TLS handshake record: a ClientHello is expected.
    Tls,
    /// A method token and a space: an HTTP/1 request line is expected.
    Http,
    /// Anything else (an SSH banner, a binary protocol).
    Other,
}

/// Why no more bytes could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Stalled {
    /// The deadline passed.
    Timeout,
    /// The client closed its side.
    Closed,
    /// [`MAX_FIRST_BYTES`] are held and the question is still open.
    Full,
    /// The socket failed.
    Failed(String),
}

/// Reads until the first bytes say what the connection is; `seen` holds every byte read.
pub(super) async fn sniff<R: AsyncRead + Unpin>(
    io: &mut R,
    seen: &mut Vec<u8>,
    deadline: Instant,
) -> Result<Kind, Stalled> {
    loop {
        if let Some(kind) = classify(seen) {
            return Ok(kind);
        }
        read_more(io, seen, deadline).await?;
    }
}

/// What `seen` is, or `None` while more bytes could still change the answer.
pub(super) fn classify(seen: &[u8]) -> Option<Kind> {
    let first = *seen.first()?;
    // 0x16: the content type of a TLS handshake record, which a ClientHello starts with.
    if first == 0x16 {
        return Some(Kind::Tls);
    }
    for (i, &b) in seen.iter().enumerate() {
        if b == b' ' {
            return Some(if i == 0 { Kind::Other } else { Kind::Http });
        }
        if i >= MAX_METHOD || !is_tchar(b) {
            return Some(Kind::Other);
        }
    }
    None
}

/// A character of an HTTP token (RFC 9110 `tchar`), which a method is made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Appends one read (at most [`CHUNK`], never past [`MAX_FIRST_BYTES`]) to `seen`.
async fn read_more<R: AsyncRead + Unpin>(
    io: &mut R,
    seen: &mut Vec<u8>,
    deadline: Instant,
) -> Result<(), Stalled> {
    let room = MAX_FIRST_BYTES.saturating_sub(seen.len()).min(CHUNK);
    if room == 0 {
        return Err(Stalled::Full);
    }
    let start = seen.len();
    seen.resize(start + room, 0);
    let read = tokio::time::timeout_at(deadline, io.read(&mut seen[start..])).await;
    let got = match read {
        Err(_) => Err(Stalled::Timeout),
        Ok(Err(e)) => Err(Stalled::Failed(e.to_string())),
        Ok(Ok(0)) => Err(Stalled::Closed),
        Ok(Ok(n)) => Ok(n),
    };
    seen.truncate(start + got.as_ref().map_or(0, |n| *n));
    got.map(|_| ())
}

/// Reads until `seen` holds a whole ClientHello, however the client segmented it, feeding each
/// byte to a rustls acceptor once. `seen` keeps every byte read (a tunnel replays them).
pub(super) async fn read_hello<R: AsyncRead + Unpin>(
    io: &mut R,
    seen: &mut Vec<u8>,
    deadline: Instant,
) -> Result<rustls::server::Accepted, (Reason, String)> {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut fed = 0;
    loop {
        while fed < seen.len() {
            let mut rest = &seen[fed..];
            match acceptor.read_tls(&mut rest) {
                Ok(0) => break,
                Ok(n) => fed += n,
                Err(e) => return Err((Reason::NotTls, format!("not a TLS ClientHello: {e}"))),
            }
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => return Ok(accepted),
            Ok(None) => {}
            Err((e, _alert)) => {
                return Err((Reason::NotTls, format!("not a TLS ClientHello: {e}")));
            }
        }
        read_more(io, seen, deadline).await.map_err(|s| match s {
            Stalled::Full => (
                Reason::NotTls,
                format!(
                    "no whole ClientHello in the first {} KiB",
                    MAX_FIRST_BYTES / 1024
                ),
            ),
            Stalled::Timeout => (Reason::TlsHandshakeFailed, "no ClientHello in time".into()),
            Stalled::Closed => (
                Reason::TlsHandshakeFailed,
                "closed before its ClientHello was complete".into(),
            ),
            Stalled::Failed(e) => (Reason::TlsHandshakeFailed, e),
        })?;
    }
}

/// An HTTP/1 request head as the client sent it: what the gate needs to decide the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Head {
    pub method: String,
    /// The request target as sent (origin-form, or absolute-form).
    pub target: String,
    /// Every `Host` header value, in order.
    pub hosts: Vec<String>,
}

/// Reads until `seen` holds a whole request head (the bytes after it stay in `seen` too: the
/// caller replays all of them to hyper).
pub(super) async fn read_head<R: AsyncRead + Unpin>(
    io: &mut R,
    seen: &mut Vec<u8>,
    deadline: Instant,
) -> Result<Head, Refusal> {
    let mut scanned = 0;
    loop {
        // A head can only have become complete (or invalid) with a new line.
        if memchr::memchr(b'\n', &seen[scanned..]).is_some() {
            if let Some(head) = parse_head(seen)? {
                return Ok(head);
            }
        }
        scanned = seen.len();
        read_more(io, seen, deadline).await.map_err(|s| match s {
            Stalled::Timeout => Refusal::new(
                Reason::HeaderTimeout,
                "the request header block did not arrive in time",
            ),
            Stalled::Full => Refusal::new(
                Reason::HeaderTooLarge,
                format!(
                    "the request header block is over {} KiB",
                    MAX_FIRST_BYTES / 1024
                ),
            ),
            Stalled::Closed => Refusal::new(
                Reason::BadRequest,
                "the connection closed before the request header block was complete",
            ),
            Stalled::Failed(e) => Refusal::new(Reason::BadRequest, e),
        })?;
    }
}

/// The head in `seen`, `None` while it is incomplete.
fn parse_head(seen: &[u8]) -> Result<Option<Head>, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(seen) {
        Ok(Status::Complete(_)) => {}
        Ok(Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Refusal::new(
                Reason::HeaderTooLarge,
                format!("the request has more than {MAX_HEADERS} header fields"),
            ))
        }
        Err(e) => {
            return Err(Refusal::new(
                Reason::BadRequest,
                format!("not a valid HTTP/1 request head: {e}"),
            ))
        }
    }
    let mut hosts = Vec::new();
    for h in req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
    {
        let value = std::str::from_utf8(h.value)
            .ok()
            .filter(|v| v.is_ascii())
            .ok_or_else(|| Refusal::new(Reason::BadRequest, "Host header is not ASCII"))?;
        hosts.push(value.trim().to_string());
    }
    Ok(Some(Head {
        method: req.method.unwrap_or_default().to_string(),
        target: req.path.unwrap_or_default().to_string(),
        hosts,
    }))
}

#[cfg(test)]
#[path = "first_props.rs"]
mod props;

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;

    use super::*;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    /// Writes `bytes` one byte per write, then holds the stream open.
    fn trickle(bytes: Vec<u8>) -> tokio::io::DuplexStream {
        let (mut client, server) = tokio::io::duplex(64);
        tokio::spawn(async move {
            for b in bytes {
                if client.write_all(&[b]).await.is_err() {
                    return;
                }
                tokio::task::yield_now().await;
            }
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        server
    }

    fn client_hello(sni: &str) -> Vec<u8> {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from(sni.to_string()).expect("name");
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).expect("client");
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).expect("write hello");
        }
        out
    }

    #[test]
    fn first_bytes_are_tls_http_or_something_else() {
        assert_eq!(classify(b""), None);
        assert_eq!(classify(&[0x16, 0x03]), Some(Kind::Tls));
        assert_eq!(classify(b"GE"), None);
        assert_eq!(classify(b"GET / HTTP/1.1\r\n"), Some(Kind::Http));
        assert_eq!(classify(b"M-SEARCH * HTTP/1.1"), Some(Kind::Http));
        assert_eq!(classify(b"SSH-2.0-OpenSSH_9.0\r\n"), Some(Kind::Other));
        assert_eq!(classify(b" GET"), Some(Kind::Other));
        assert_eq!(classify(&[0u8, 1, 2]), Some(Kind::Other));
        assert_eq!(classify(&[b'A'; 40]), Some(Kind::Other));
    }

    #[tokio::test]
    async fn a_hello_sent_a_byte_at_a_time_is_read_whole_and_kept_as_sent() {
        let hello = client_hello("up.test");
        let mut io = trickle(hello.clone());
        let mut seen = Vec::new();
        assert_eq!(sniff(&mut io, &mut seen, soon()).await, Ok(Kind::Tls));
        let accepted = read_hello(&mut io, &mut seen, soon())
            .await
            .expect("a whole ClientHello");
        assert_eq!(accepted.client_hello().server_name(), Some("up.test"));
        assert_eq!(seen, hello);
    }

    #[tokio::test]
    async fn bytes_that_start_like_tls_but_are_not_are_not_tls() {
        // A handshake record holding a one-byte "ClientHello".
        let mut io = trickle(vec![
            0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0xff,
        ]);
        let mut seen = Vec::new();
        let err = read_hello(&mut io, &mut seen, soon()).await.err();
        assert_eq!(err.map(|e| e.0), Some(Reason::NotTls));
    }

    #[tokio::test]
    async fn a_head_sent_a_byte_at_a_time_is_read_with_what_follows_it() {
        let bytes = b"GET /a?b=c HTTP/1.1\r\nHost: up.test\r\nX: y\r\n\r\nBODY".to_vec();
        let mut io = trickle(bytes.clone());
        let mut seen = Vec::new();
        assert_eq!(sniff(&mut io, &mut seen, soon()).await, Ok(Kind::Http));
        let head = read_head(&mut io, &mut seen, soon()).await.expect("a head");
        assert_eq!(
            head,
            Head {
                method: "GET".into(),
                target: "/a?b=c".into(),
                hosts: vec!["up.test".into()],
            }
        );
        assert!(bytes.starts_with(&seen), "nothing lost or reordered");
    }

    #[tokio::test]
    async fn heads_that_are_too_large_invalid_or_late_are_refused_with_their_reason() {
        let many: String = (0..200).map(|i| format!("X-{i}: v\r\n")).collect();
        let cases: [(Vec<u8>, Reason); 3] = [
            (
                format!("GET / HTTP/1.1\r\n{many}\r\n").into_bytes(),
                Reason::HeaderTooLarge,
            ),
            (
                format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(MAX_FIRST_BYTES)).into_bytes(),
                Reason::HeaderTooLarge,
            ),
            (
                b"GET / HTTP/1.1\r\nbad header\r\n\r\n".to_vec(),
                Reason::BadRequest,
            ),
        ];
        for (bytes, reason) in cases {
            let (mut client, mut server) = tokio::io::duplex(MAX_FIRST_BYTES * 2);
            client.write_all(&bytes).await.expect("write");
            let mut seen = Vec::new();
            let err = read_head(&mut server, &mut seen, soon()).await.err();
            assert_eq!(err.map(|e| e.reason), Some(reason));
            assert!(seen.len() <= MAX_FIRST_BYTES);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stalls_mid_head_is_refused_at_the_deadline() {
        let (mut client, mut server) = tokio::io::duplex(64);
        client
            .write_all(b"GET / HTTP/1.1\r\nHo")
            .await
            .expect("write");
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(3);
        let err = read_head(&mut server, &mut seen, deadline).await.err();
        assert_eq!(err.map(|e| e.reason), Some(Reason::HeaderTimeout));
        let mut seen = Vec::new();
        let stalled = sniff(
            &mut server,
            &mut seen,
            Instant::now() + Duration::from_secs(1),
        )
        .await;
        assert_eq!(stalled, Err(Stalled::Timeout));
        drop(client);
    }
}

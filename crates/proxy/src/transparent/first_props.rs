//! Property tests of a captured connection's first-bytes readers (sandbox input): arbitrary
//! bytes never panic and give a value or a refusal; a valid ClientHello or request head reads
//! back as what was sent; the answer does not depend on how the bytes were split into reads;
//! nothing past [`MAX_FIRST_BYTES`] is held and no more than [`MAX_HEADERS`] lines are read.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use proptest::prelude::*;
use tokio::io::ReadBuf;

use super::*;

/// Hands its bytes out in the given read sizes (the last size repeating; without sizes, as much
/// as each read asks for), then EOF.
struct Chunked {
    rest: VecDeque<u8>,
    sizes: VecDeque<usize>,
}

impl Chunked {
    fn new(bytes: &[u8], sizes: &[usize]) -> Self {
        Self {
            rest: bytes.iter().copied().collect(),
            sizes: sizes.iter().map(|s| (*s).max(1)).collect(),
        }
    }
}

impl AsyncRead for Chunked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let size = match self.sizes.len() {
            0 => usize::MAX,
            1 => self.sizes[0],
            _ => self.sizes.pop_front().unwrap_or(1),
        };
        let n = size.min(buf.remaining()).min(self.rest.len());
        let taken: Vec<u8> = self.rest.drain(..n).collect();
        buf.put_slice(&taken);
        Poll::Ready(Ok(()))
    }
}

fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime")
        .block_on(f)
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

/// What each reader makes of `bytes` split by `sizes`: the sniffed kind, the head (or its
/// refusal's reason and message), the ClientHello's SNI (or why not), with the bytes each kept
/// (which depend on how they arrived, as long as they are a prefix of the input).
#[derive(Debug, PartialEq)]
struct Read {
    kind: Result<Kind, Stalled>,
    head: (Result<Head, (Reason, String)>, Vec<u8>),
    hello: (Result<Option<String>, Reason>, Vec<u8>),
}

fn read_all(bytes: &[u8], sizes: &[usize]) -> Read {
    run(async {
        let mut seen = Vec::new();
        let kind = sniff(&mut Chunked::new(bytes, sizes), &mut seen, far()).await;
        let mut seen = Vec::new();
        let head = read_head(&mut Chunked::new(bytes, sizes), &mut seen, far())
            .await
            .map_err(|r| (r.reason, r.message));
        let head = (head, seen);
        let mut seen = Vec::new();
        let hello = read_hello(&mut Chunked::new(bytes, sizes), &mut seen, far())
            .await
            .map(|a| a.client_hello().server_name().map(str::to_string))
            .map_err(|(reason, _)| reason);
        Read {
            kind,
            head,
            hello: (hello, seen),
        }
    })
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

/// Bytes that look like the start of TLS or HTTP often enough to reach the deeper parsers.
fn any_first_bytes() -> impl Strategy<Value = Vec<u8>> {
    let noise = proptest::collection::vec(any::<u8>(), 0..700);
    prop_oneof![
        noise.clone(),
        noise.clone().prop_map(|mut b| {
            b.splice(0..0, [0x16, 0x03, 0x01]);
            b
        }),
        (
            "[A-Z]{1,8} [ -~]{0,40} HTTP/1\\.[01]\r\n",
            proptest::collection::vec("[!-9;-~]{1,12}: ?[ -~]{0,30}\r\n", 0..12),
            prop::bool::ANY,
            noise,
        )
            .prop_map(|(line, headers, end, tail)| {
                let mut b = line.into_bytes();
                b.extend(headers.concat().into_bytes());
                if end {
                    b.extend_from_slice(b"\r\n");
                }
                b.extend(tail);
                b
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary bytes, arbitrarily split: every reader returns (no panic, no hang at EOF), keeps
    /// only a prefix of what was sent, and answers the same however the bytes arrived.
    #[test]
    fn arbitrary_bytes_read_the_same_however_they_are_split(
        bytes in any_first_bytes(),
        sizes in proptest::collection::vec(1usize..64, 0..40),
    ) {
        let whole = read_all(&bytes, &[]);
        let split = read_all(&bytes, &sizes);
        prop_assert!(bytes.starts_with(&split.head.1) && bytes.starts_with(&split.hello.1));
        prop_assert_eq!(&split.kind, &whole.kind);
        prop_assert_eq!(&split.head.0, &whole.head.0);
        prop_assert_eq!(&split.hello.0, &whole.hello.0);
        // What the first bytes are depends on them alone.
        let kind = classify(&bytes).ok_or(Stalled::Closed);
        prop_assert_eq!(split.kind, kind);
    }

    /// A request head reads back as its method, target and `Host` values, however split, with
    /// every byte after it kept (for hyper) and nothing reordered; more than [`MAX_HEADERS`]
    /// lines is `header_too_large`.
    #[test]
    fn a_request_head_reads_back_as_what_was_sent(
        method in "[A-Z]{1,10}",
        target in "/[A-Za-z0-9._~!$&'()*+,;=:@/?%-]{0,40}",
        hosts in proptest::collection::vec("[a-z0-9.-]{1,20}(:[0-9]{1,5})?", 0..3),
        others in 0usize..140,
        body in proptest::collection::vec(any::<u8>(), 0..64),
        sizes in proptest::collection::vec(1usize..64, 0..40),
    ) {
        let mut text = format!("{method} {target} HTTP/1.1\r\n");
        for host in &hosts {
            text.push_str(&format!("Host:  {host} \r\n"));
        }
        for i in 0..others {
            text.push_str(&format!("X-{i}: v\r\n"));
        }
        text.push_str("\r\n");
        let mut bytes = text.into_bytes();
        bytes.extend_from_slice(&body);
        let (got, seen) = read_all(&bytes, &sizes).head;
        if hosts.len() + others > MAX_HEADERS {
            prop_assert_eq!(got.map_err(|e| e.0), Err(Reason::HeaderTooLarge));
        } else {
            prop_assert_eq!(got, Ok(Head { method, target, hosts }));
            prop_assert!(bytes.starts_with(&seen));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// A head that never ends is refused once [`MAX_FIRST_BYTES`] are held, never holding more.
    #[test]
    fn a_head_that_never_ends_is_refused_at_the_cap(
        over in 1usize..4096,
        sizes in proptest::collection::vec(1usize..8192, 0..8),
    ) {
        let mut bytes = b"GET / HTTP/1.1\r\nX: ".to_vec();
        bytes.resize(MAX_FIRST_BYTES + over, b'a');
        let (got, seen) = run(async {
            let mut seen = Vec::new();
            let got = read_head(&mut Chunked::new(&bytes, &sizes), &mut seen, far()).await;
            (got.map_err(|r| r.reason), seen)
        });
        prop_assert_eq!(got, Err(Reason::HeaderTooLarge));
        prop_assert_eq!(seen.len(), MAX_FIRST_BYTES);
    }

    /// A ClientHello, however split, reads back with the SNI it names and is kept exactly as
    /// sent (a tunnel replays it); cut short, it is a failed handshake, never a panic.
    #[test]
    fn a_client_hello_reads_back_with_its_sni(
        sni in "[a-z][a-z0-9]{0,10}(\\.[a-z][a-z0-9]{0,10}){1,3}",
        sizes in proptest::collection::vec(1usize..64, 0..40),
        cut in any::<prop::sample::Index>(),
    ) {
        let hello = client_hello(&sni);
        let (got, seen) = read_all(&hello, &sizes).hello;
        prop_assert_eq!(got, Ok(Some(sni)));
        prop_assert_eq!(seen, hello.clone());
        let short = &hello[..cut.index(hello.len())];
        let (got, _) = read_all(short, &sizes).hello;
        prop_assert_eq!(got, Err(Reason::TlsHandshakeFailed));
    }
}

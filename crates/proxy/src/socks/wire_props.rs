//! Property tests of SOCKS5's readers (sandbox input): arbitrary bytes never panic and give a
//! value or a refusal; valid encodings read back as what was encoded; the answer does not
//! depend on how the bytes were split into reads; every length byte bounds what is read.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use proptest::prelude::*;
use tokio::io::ReadBuf;

use super::*;

/// Hands its bytes out in the given read sizes (1 to 8; the last size repeating; without
/// sizes, as much as each read asks for), then EOF; what was never read stays in `rest`.
struct Chunked {
    rest: VecDeque<u8>,
    sizes: VecDeque<usize>,
}

impl Chunked {
    fn new(bytes: &[u8], sizes: &[usize]) -> Self {
        Self {
            rest: bytes.iter().copied().collect(),
            sizes: sizes.iter().map(|s| s % 8 + 1).collect(),
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

/// Each reader on `bytes` split by `sizes`: its result and the bytes it left unread.
#[derive(Debug, PartialEq)]
struct Read {
    greeting: (Result<Offered, Failed>, usize),
    credentials: (Result<Vec<u8>, Failed>, usize),
    request: (Result<Request, Failed>, usize),
}

fn read_all(bytes: &[u8], sizes: &[usize]) -> Read {
    run(async {
        let mut io = Chunked::new(bytes, sizes);
        let greeting = read_greeting(&mut io, far()).await;
        let greeting = (greeting, io.rest.len());
        let mut io = Chunked::new(bytes, sizes);
        let credentials = read_credentials(&mut io, far())
            .await
            .map(|t| t.token().to_vec());
        let credentials = (credentials, io.rest.len());
        let mut io = Chunked::new(bytes, sizes);
        let request = read_request(&mut io, far()).await;
        let request = (request, io.rest.len());
        Read {
            greeting,
            credentials,
            request,
        }
    })
}

/// A host a request may name, and its address type and encoding.
fn any_target() -> impl Strategy<Value = (u8, Vec<u8>, String)> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|a| (ATYP_V4, a.to_vec(), Ipv4Addr::from(a).to_string())),
        any::<[u8; 16]>().prop_map(|a| (ATYP_V6, a.to_vec(), Ipv6Addr::from(a).to_string())),
        "\\PC{1,60}"
            .prop_filter("at most 255 bytes", |n: &String| n.len() <= 255)
            .prop_map(|n| {
                let mut enc = vec![n.len() as u8];
                enc.extend_from_slice(n.as_bytes());
                (ATYP_NAME, enc, n)
            }),
    ]
}

fn encode_request(command: u8, atyp: u8, addr: &[u8], port: u16) -> Vec<u8> {
    let mut bytes = vec![VERSION, command, 0, atyp];
    bytes.extend_from_slice(addr);
    bytes.extend_from_slice(&port.to_be_bytes());
    bytes
}

fn encode_credentials(user: &[u8], pass: &[u8]) -> Vec<u8> {
    let mut bytes = vec![AUTH_VERSION, user.len() as u8];
    bytes.extend_from_slice(user);
    bytes.push(pass.len() as u8);
    bytes.extend_from_slice(pass);
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary bytes, arbitrarily split: each reader returns (no panic, no hang at EOF), never
    /// reads past its input, and answers the same however the bytes arrived.
    #[test]
    fn arbitrary_bytes_read_the_same_however_they_are_split(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        sizes in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let whole = read_all(&bytes, &[]);
        prop_assert_eq!(read_all(&bytes, &sizes), whole);
    }

    /// A greeting reads back as the methods it offers, consuming exactly `2 + NMETHODS` bytes.
    #[test]
    fn a_greeting_reads_back_as_what_it_offers(
        methods in proptest::collection::vec(any::<u8>(), 0..=255),
        trailing in proptest::collection::vec(any::<u8>(), 0..16),
        sizes in proptest::collection::vec(any::<usize>(), 0..20),
    ) {
        let mut bytes = vec![VERSION, methods.len() as u8];
        bytes.extend_from_slice(&methods);
        bytes.extend_from_slice(&trailing);
        let (got, left) = read_all(&bytes, &sizes).greeting;
        prop_assert_eq!(got, Ok(Offered {
            none: methods.contains(&METHOD_NONE),
            userpass: methods.contains(&METHOD_USERPASS),
        }));
        prop_assert_eq!(left, trailing.len());
    }

    /// Credentials read back as the token they present (the password, else the user), each
    /// length byte bounding its field; cut short, they are a bad request that just closes.
    #[test]
    fn credentials_read_back_as_their_token(
        user in proptest::collection::vec(any::<u8>(), 0..=255),
        pass in proptest::collection::vec(any::<u8>(), 0..=255),
        trailing in proptest::collection::vec(any::<u8>(), 0..16),
        cut in any::<prop::sample::Index>(),
        sizes in proptest::collection::vec(any::<usize>(), 0..20),
    ) {
        let encoded = encode_credentials(&user, &pass);
        let mut bytes = encoded.clone();
        bytes.extend_from_slice(&trailing);
        let (got, left) = read_all(&bytes, &sizes).credentials;
        let token = if pass.is_empty() { &user } else { &pass };
        prop_assert_eq!(got, Ok(token.clone()));
        prop_assert_eq!(left, trailing.len());
        let short = &encoded[..cut.index(encoded.len())];
        let (got, _) = read_all(short, &sizes).credentials;
        let failed = got.expect_err("cut short");
        prop_assert_eq!((failed.reason, failed.answer), (Reason::BadRequest, Answer::Close));
    }

    /// A CONNECT to any address type reads back as the host policy sees and the port, consuming
    /// exactly its encoding; another command is refused naming the same target; cut short, it is
    /// a bad request that just closes.
    #[test]
    fn a_request_reads_back_as_its_target(
        (atyp, addr, host) in any_target(),
        port in any::<u16>(),
        command in prop_oneof![Just(CMD_CONNECT), Just(CMD_BIND), Just(CMD_UDP_ASSOCIATE), 4u8..],
        trailing in proptest::collection::vec(any::<u8>(), 0..16),
        cut in any::<prop::sample::Index>(),
        sizes in proptest::collection::vec(any::<usize>(), 0..20),
    ) {
        let encoded = encode_request(command, atyp, &addr, port);
        let mut bytes = encoded.clone();
        bytes.extend_from_slice(&trailing);
        let (got, left) = read_all(&bytes, &sizes).request;
        prop_assert_eq!(left, trailing.len());
        if command == CMD_CONNECT {
            prop_assert_eq!(got, Ok(Request { host: host.clone(), port }));
        } else {
            let failed = got.expect_err("not CONNECT");
            prop_assert_eq!(failed.answer, Answer::Reply(Reply::CommandNotSupported));
            prop_assert_eq!(failed.target, Some((host, port)));
        }
        let short = &encoded[..cut.index(encoded.len())];
        let (got, _) = read_all(short, &sizes).request;
        let failed = got.expect_err("cut short");
        prop_assert_eq!((failed.reason, failed.answer), (Reason::BadRequest, Answer::Close));
    }
}

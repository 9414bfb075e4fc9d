//! Tests of the aws-chunked framing checks and chunk re-signing.

use super::*;
use aws_credential_types::Credentials;
use aws_sigv4::sign::v4;
use http_body_util::BodyExt;

const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
const STAMP: &str = "20130524T000000Z";
const SEED: &str = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9";

fn signer() -> ChunkSigner {
    let key = signing_key(SECRET.as_bytes(), "20130524", "us-east-1", "s3");
    ChunkSigner::new(key, STAMP, "us-east-1", "s3", SEED)
}

/// aws-sigv4's own chunk and trailer signing, for the same key, time and chain.
fn reference(chunks: &[&[u8]], trailers: &[(&str, &str)]) -> Vec<String> {
    let identity = Credentials::new("AKID", SECRET, None, None, "test").into();
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_369_353_600);
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("s3")
        .time(time)
        .settings(())
        .build()
        .expect("params");
    let mut previous = SEED.to_string();
    let mut out = Vec::new();
    for c in chunks {
        let s = v4::sign_chunk(&Bytes::copy_from_slice(c), &previous, &params)
            .expect("sign chunk")
            .signature()
            .to_string();
        previous = s.clone();
        out.push(s);
    }
    if !trailers.is_empty() {
        let mut headers = aws_smithy_runtime_api::http::Headers::new();
        for (n, v) in trailers {
            headers.insert(n.to_string(), v.to_string());
        }
        out.push(
            v4::sign_trailer(&headers, &previous, &params)
                .expect("sign trailer")
                .signature()
                .to_string(),
        );
    }
    out
}

/// The aws-chunked framing of `chunks` (each signed with `sig`), then `tail`.
fn framed(chunks: &[&[u8]], sig: Option<&str>, tail: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for c in chunks {
        match sig {
            Some(s) => out.extend(format!("{:x};chunk-signature={s}\r\n", c.len()).bytes()),
            None => out.extend(format!("{:x}\r\n", c.len()).bytes()),
        }
        out.extend_from_slice(c);
        if !c.is_empty() {
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend(tail.bytes());
    out
}

/// Runs `input` through the framing, fed in pieces of `split` bytes.
fn run(mode: Mode, expected: Option<u64>, input: &[u8], split: usize) -> Result<Vec<u8>, String> {
    let mut f = Framing::new(mode, expected);
    let mut out = Vec::new();
    for piece in input.chunks(split.max(1)) {
        f.feed(Bytes::copy_from_slice(piece));
        while let Some(b) = f.next_out().map_err(|e| e.to_string())? {
            out.extend_from_slice(&b);
        }
    }
    f.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

fn resign(trailer: bool) -> Mode {
    Mode::Resign {
        signer: Box::new(signer()),
        trailer,
    }
}

const DUMMY: &str = "0000000000000000000000000000000000000000000000000000000000000000";

#[test]
fn re_signed_chunks_match_aws_sigv4_and_keep_the_length() {
    let a = vec![b'a'; 65536];
    let b = vec![b'b'; 1024];
    let chunks: [&[u8]; 3] = [&a, &b, b""];
    let want = reference(&chunks, &[]);
    let input = framed(&chunks, Some(DUMMY), "\r\n");
    for split in [1, 7, 100, 65536, input.len()] {
        let out = run(resign(false), Some(66560), &input, split).expect("re-signed");
        assert_eq!(out.len(), input.len(), "split {split}");
        let mut expected = Vec::new();
        for (c, s) in chunks.iter().zip(&want) {
            expected.extend(format!("{:x};chunk-signature={s}\r\n", c.len()).bytes());
            expected.extend_from_slice(c);
            if !c.is_empty() {
                expected.extend_from_slice(b"\r\n");
            }
        }
        expected.extend_from_slice(b"\r\n");
        assert!(
            out == expected,
            "split {split}: output differs from aws-sigv4's signing"
        );
    }
}

#[test]
fn a_large_piece_of_input_is_re_signed_one_chunk_at_a_time() {
    let data = vec![3u8; 64 * 1024];
    let chunks: Vec<&[u8]> = vec![&data, &data, &data, &data, b""];
    let input = framed(&chunks, Some(DUMMY), "\r\n");
    let mut f = Framing::new(resign(false), None);
    f.feed(Bytes::from(input.clone()));
    let mut total = 0;
    while let Some(b) = f.next_out().expect("valid") {
        total += b.len();
        let queued: usize = f.out.iter().map(Bytes::len).sum();
        assert!(queued <= data.len() + 2, "{queued} bytes queued at once");
    }
    f.finish().expect("complete");
    assert_eq!(total, input.len());
    assert!(f.held_at_most() > MAX_CHUNK);
}

#[test]
fn the_trailer_is_re_signed_like_aws_sigv4_signs_it() {
    let data = vec![7u8; 9000];
    let chunks: [&[u8]; 2] = [&data, b""];
    let trailers = [("x-amz-checksum-crc32", "sOO8/Q==")];
    let want = reference(&chunks, &trailers);
    let tail = format!("x-amz-checksum-crc32:sOO8/Q==\r\nx-amz-trailer-signature:{DUMMY}\r\n\r\n");
    let input = framed(&chunks, Some(DUMMY), &tail);
    let out = run(resign(true), Some(9000), &input, 333).expect("re-signed");
    assert_eq!(out.len(), input.len());
    let text = String::from_utf8_lossy(&out);
    assert!(text.contains(&format!("2328;chunk-signature={}\r\n", want[0])));
    assert!(text.contains(&format!("0;chunk-signature={}\r\n", want[1])));
    assert!(text.ends_with(&format!(
        "x-amz-checksum-crc32:sOO8/Q==\r\nx-amz-trailer-signature:{}\r\n\r\n",
        want[2]
    )));
}

#[test]
fn the_unsigned_trailer_form_passes_through_byte_for_byte() {
    let data = vec![b'x'; 960];
    let input = framed(&[&data, b""], None, "x-amz-checksum-crc32:/OvNCw==\r\n\r\n");
    assert_eq!(input.len(), 1003, "the shape boto3 sends for 960 bytes");
    for split in [1, 2, 5, 999, 1003] {
        let out = run(Mode::Check, Some(960), &input, split).expect("valid");
        assert_eq!(out, input, "split {split}");
    }
    // Without a trailer, too.
    let input = framed(&[&data, b""], None, "\r\n");
    assert_eq!(run(Mode::Check, None, &input, 10).expect("valid"), input);
}

#[test]
fn malformed_framing_is_refused_in_every_position() {
    let data = vec![b'x'; 100];
    let ok_tail = "x-amz-checksum-crc32:AAAAAA==\r\n\r\n";
    let cases: Vec<(&str, Vec<u8>, Option<u64>)> = vec![
        ("not hex", b"zz\r\n".to_vec(), None),
        ("empty size", b"\r\nabc".to_vec(), None),
        ("bare LF", b"64\n".to_vec(), None),
        (
            "longer chunk",
            framed(&[&data], None, "")
                .into_iter()
                .take(104)
                .chain(*b"xx\r\n")
                .collect(),
            None,
        ),
        ("truncated", framed(&[&data], None, "")[..50].to_vec(), None),
        ("no final chunk", framed(&[&data], None, ""), None),
        (
            "no closing line",
            framed(&[&data, b""], None, "x-amz-checksum-crc32:AAAAAA==\r\n"),
            None,
        ),
        (
            "after the end",
            framed(&[&data, b""], None, "\r\n\r\nmore"),
            None,
        ),
        (
            "extension",
            framed(&[&data, b""], Some(DUMMY), "\r\n"),
            None,
        ),
        (
            "length mismatch",
            framed(&[&data, b""], None, ok_tail),
            Some(99),
        ),
        (
            "length short",
            framed(&[&data, b""], None, ok_tail),
            Some(101),
        ),
        (
            "bad trailer",
            framed(&[&data, b""], None, "no colon\r\n\r\n"),
            None,
        ),
        (
            "signature unsigned",
            framed(
                &[&data, b""],
                None,
                &format!("x-amz-trailer-signature:{DUMMY}\r\n\r\n"),
            ),
            None,
        ),
        ("huge line", vec![b'1'; 4096], None),
    ];
    for (what, input, expected) in cases {
        for split in [1, 3, input.len().max(1)] {
            let r = run(Mode::Check, expected, &input, split);
            assert!(r.is_err(), "{what} (split {split}) was accepted");
        }
    }
    let signed: Vec<(&str, Vec<u8>, bool)> = vec![
        ("no signature", framed(&[&data, b""], None, "\r\n"), false),
        (
            "short signature",
            framed(&[&data, b""], Some("abc"), "\r\n"),
            false,
        ),
        ("other extension", b"64;foo=bar\r\n".to_vec(), false),
        (
            "trailer on plain form",
            framed(&[&data, b""], Some(DUMMY), ok_tail),
            false,
        ),
        (
            "unsigned trailer",
            framed(&[&data, b""], Some(DUMMY), ok_tail),
            true,
        ),
        (
            "empty trailer",
            framed(
                &[&data, b""],
                Some(DUMMY),
                &format!("x-amz-trailer-signature:{DUMMY}\r\n\r\n"),
            ),
            true,
        ),
        (
            "line after signature",
            framed(
                &[&data, b""],
                Some(DUMMY),
                &format!("x-amz-trailer-signature:{DUMMY}\r\na:b\r\n\r\n"),
            ),
            true,
        ),
        (
            "bad trailer signature",
            framed(
                &[&data, b""],
                Some(DUMMY),
                "a:b\r\nx-amz-trailer-signature:xyz\r\n\r\n",
            ),
            true,
        ),
    ];
    for (what, input, trailer) in signed {
        assert!(
            run(resign(trailer), None, &input, 5).is_err(),
            "{what} was accepted"
        );
    }
}

#[test]
fn a_chunk_over_the_cap_is_refused_before_it_is_held() {
    let head = format!("{:x};chunk-signature={DUMMY}\r\n", MAX_CHUNK + 1);
    let mut f = Framing::new(resign(false), None);
    f.feed(Bytes::from(head));
    let e = f.next_out().expect_err("refused");
    assert!(e.to_string().contains("at most 1048576 bytes"), "{e}");
    // At the cap is fine.
    let data = vec![1u8; MAX_CHUNK];
    let input = framed(&[&data, b""], Some(DUMMY), "\r\n");
    assert!(run(resign(false), None, &input, 65536).is_ok());
}

#[tokio::test]
async fn the_body_fails_and_reports_once_on_bad_framing() {
    let told = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = told.clone();
    let inner = http_body_util::Full::new(Bytes::from_static(b"5\r\nhello\r\n"));
    let body = AwsChunked::new(
        inner,
        Framing::new(Mode::Check, Some(5)),
        Box::new(move |m| sink.lock().expect("sink").push(m)),
    );
    let e = body.collect().await.expect_err("truncated");
    assert!(
        e.to_string().contains("ended before the final chunk"),
        "{e}"
    );
    assert_eq!(told.lock().expect("told").len(), 1);
}

#[test]
fn debug_shows_no_key_material() {
    let s = format!("{:?}", signer());
    assert!(!s.contains(SEED) && !s.contains("key"), "{s}");
}

/// Records what a payload scan is shown; refuses once it has seen `refuse_at` data bytes.
struct Recorder {
    seen: std::sync::Arc<std::sync::Mutex<(Vec<u8>, usize)>>,
    refuse_at: usize,
}

impl PayloadScan for Recorder {
    fn data(&mut self, bytes: &[u8]) -> Result<(), String> {
        let mut seen = self.seen.lock().map_err(|e| e.to_string())?;
        seen.0.extend_from_slice(bytes);
        if seen.0.len() >= self.refuse_at {
            return Err("refused by the scan".to_string());
        }
        Ok(())
    }
    fn end(&mut self) -> Result<(), String> {
        let mut seen = self.seen.lock().map_err(|e| e.to_string())?;
        seen.1 += 1;
        Ok(())
    }
}

/// The payload scan sees the data bytes alone, in order, however the chunks and the input are
/// cut (both forms); the end once; and its refusal aborts the upload before the input holding
/// the byte it refused goes on.
#[test]
fn the_payload_scan_sees_the_data_without_the_framing_and_can_abort() {
    let chunks: [&[u8]; 4] = [b"sk-test-OP", b"ENAI-4f9a", b"1c7e2b8d", b""];
    let want: Vec<u8> = chunks.concat();
    for (mode, sig, tail) in [
        (Mode::Check, None, "x-amz-checksum-crc32:AAAAAA==\r\n\r\n"),
        (resign(false), Some(DUMMY), "\r\n"),
    ] {
        let input = framed(&chunks, sig, tail);
        for split in [1, 3, 7, 64, input.len()] {
            let seen = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), 0)));
            let mut f = Framing::new(
                match &mode {
                    Mode::Check => Mode::Check,
                    Mode::Resign { .. } => resign(false),
                },
                None,
            );
            f.scan_payload(Box::new(Recorder {
                seen: seen.clone(),
                refuse_at: usize::MAX,
            }));
            for piece in input.chunks(split) {
                f.feed(Bytes::copy_from_slice(piece));
                while f.next_out().expect("valid").is_some() {}
            }
            f.finish().expect("complete");
            let seen = seen.lock().expect("seen");
            assert_eq!((&seen.0, seen.1), (&want, 1), "split {split}");
        }
    }
    // Refused at the second chunk's first byte: what went on before holds no second-chunk byte.
    let input = framed(&chunks, None, "\r\n");
    for split in [1, 5, input.len()] {
        let mut f = Framing::new(Mode::Check, None);
        f.scan_payload(Box::new(Recorder {
            seen: std::sync::Arc::default(),
            refuse_at: chunks[0].len() + 1,
        }));
        let mut out = Vec::new();
        let mut refused = None;
        'feed: for piece in input.chunks(split) {
            f.feed(Bytes::copy_from_slice(piece));
            loop {
                match f.next_out() {
                    Ok(Some(b)) => out.extend_from_slice(&b),
                    Ok(None) => break,
                    Err(e) => {
                        refused = Some(e.to_string());
                        break 'feed;
                    }
                }
            }
        }
        assert!(
            refused
                .as_deref()
                .is_some_and(|r| r.contains("refused by the scan")),
            "split {split}: {refused:?}"
        );
        assert!(!contains(&out, b"ENAI"), "split {split}");
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

// Properties, over arbitrary bodies and arbitrary cuts of the input.

use proptest::prelude::*;

/// The three forms: 0 checks (`STREAMING-UNSIGNED-PAYLOAD-TRAILER`), 1 re-signs without a
/// trailer, 2 re-signs with a signed trailer.
fn form(kind: u8) -> Mode {
    match kind {
        0 => Mode::Check,
        1 => resign(false),
        _ => resign(true),
    }
}

/// What feeding a body came to: the bytes sent on and the data a payload scan saw (on
/// success), or the error.
type Outcome = Result<(Vec<u8>, Vec<u8>), String>;

/// Feeds `input` cut at `cuts` (positions, any order, out of range ones wrapped) through the
/// `kind` form with a payload scan, then finishes.
fn run_cut(kind: u8, expected: Option<u64>, input: &[u8], cuts: &[usize]) -> Outcome {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|c| c % (input.len() + 1))
        .chain([0, input.len()])
        .collect();
    points.sort_unstable();
    points.dedup();
    let seen = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), 0)));
    let mut f = Framing::new(form(kind), expected);
    f.scan_payload(Box::new(Recorder {
        seen: seen.clone(),
        refuse_at: usize::MAX,
    }));
    let mut out = Vec::new();
    for w in points.windows(2) {
        f.feed(Bytes::copy_from_slice(&input[w[0]..w[1]]));
        while let Some(b) = f.next_out().map_err(|e| e.to_string())? {
            out.extend_from_slice(&b);
        }
    }
    f.finish().map_err(|e| e.to_string())?;
    let seen = seen.lock().expect("seen");
    assert_eq!(seen.1, 1, "the scan hears the end once");
    Ok((out, seen.0.clone()))
}

/// The payload of a well-formed aws-chunked body, read plainly (no checks): each chunk's
/// data, by its hex size.
fn payload_of(body: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    let mut rest = body;
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n").expect("a line");
        let line = std::str::from_utf8(&rest[..eol]).expect("ascii");
        let size = usize::from_str_radix(line.split(';').next().expect("size"), 16).expect("hex");
        if size == 0 {
            return payload;
        }
        payload.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
        rest = &rest[eol + 2 + size + 2..];
    }
}

/// A well-formed body of the `kind` form carrying `chunks` (the final empty chunk added),
/// with `trailers` trailer lines where the form allows them.
fn well_formed(kind: u8, chunks: &[Vec<u8>], trailers: usize) -> Vec<u8> {
    let mut all: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
    all.push(b"");
    let mut tail = String::new();
    let trailers = if kind == 1 {
        0
    } else {
        trailers.max(usize::from(kind == 2))
    };
    for i in 0..trailers {
        tail.push_str(&format!("x-amz-meta-{i}: value {i}\r\n"));
    }
    if kind == 2 {
        tail.push_str(&format!("x-amz-trailer-signature:{DUMMY}\r\n"));
    }
    tail.push_str("\r\n");
    framed(&all, (kind != 0).then_some(DUMMY), &tail)
}

fn chunks() -> impl Strategy<Value = Vec<Vec<u8>>> {
    proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..200), 0..6)
}

fn cuts() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(any::<usize>(), 0..12)
}

/// Pieces aws-chunked is made of, to build bodies that reach every state.
fn framing_piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"0".to_vec()),
        Just(b"5".to_vec()),
        Just(b"ffffffffffffffff".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\n".to_vec()),
        Just(b";".to_vec()),
        Just(format!(";chunk-signature={DUMMY}").into_bytes()),
        Just(b"hello".to_vec()),
        Just(b"x-amz-checksum-crc32:AAAAAA==".to_vec()),
        Just(format!("x-amz-trailer-signature: {DUMMY}").into_bytes()),
        Just(b":".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..8),
    ]
}

/// A body that is not aws-chunked, one way or another: a well-formed body broken once.
#[derive(Debug, Clone)]
enum Break {
    /// Ends early (at this position, wrapped into the body).
    Truncate(usize),
    /// Bytes after the closing empty line.
    Trailing(Vec<u8>),
    /// This chunk's size line ends in a bare LF.
    BareLf(usize),
    /// This chunk's size starts with a byte that is not a hex digit.
    NotHex(usize, u8),
    /// This chunk's data is not followed by CRLF.
    NoCrlf(usize),
}

fn broken() -> impl Strategy<Value = Break> {
    prop_oneof![
        any::<usize>().prop_map(Break::Truncate),
        proptest::collection::vec(any::<u8>(), 1..8).prop_map(Break::Trailing),
        any::<usize>().prop_map(Break::BareLf),
        (
            any::<usize>(),
            any::<u8>().prop_filter("not hex", |b| !b.is_ascii_hexdigit())
        )
            .prop_map(|(i, b)| Break::NotHex(i, b)),
        any::<usize>().prop_map(Break::NoCrlf),
    ]
}

/// `body` (well-formed, of `chunks` and the final empty chunk) broken as `how` says.
fn break_body(body: &[u8], chunks: &[Vec<u8>], how: &Break) -> Vec<u8> {
    // Where each chunk's size line starts and its data ends.
    let mut starts = Vec::new();
    let mut data_ends = Vec::new();
    let mut at = 0;
    for c in chunks.iter().map(Vec::as_slice).chain([b"".as_slice()]) {
        starts.push(at);
        let eol = at
            + body[at..]
                .windows(2)
                .position(|w| w == b"\r\n")
                .expect("line");
        at = eol + 2 + c.len();
        if !c.is_empty() {
            data_ends.push(at);
            at += 2;
        }
    }
    let mut out = body.to_vec();
    match how {
        Break::Truncate(p) => out.truncate(p % body.len()),
        Break::Trailing(bytes) => out.extend_from_slice(bytes),
        Break::BareLf(i) => {
            let start = starts[i % starts.len()];
            let eol = start
                + out[start..]
                    .windows(2)
                    .position(|w| w == b"\r\n")
                    .expect("line");
            out.remove(eol);
        }
        Break::NotHex(i, b) => out.insert(starts[i % starts.len()], *b),
        Break::NoCrlf(i) => {
            if data_ends.is_empty() {
                out.truncate(out.len() - 1);
            } else {
                let end = data_ends[i % data_ends.len()];
                out.drain(end..end + 2);
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary bytes (and bytes built from framing pieces), arbitrarily cut, in every form:
    /// never a panic, and the outcome does not depend on the cuts.
    #[test]
    fn arbitrary_bodies_never_panic_and_the_cuts_do_not_matter(
        raw in proptest::collection::vec(any::<u8>(), 0..512),
        pieces in proptest::collection::vec(framing_piece(), 0..24),
        kind in 0u8..3,
        expected in proptest::option::of(0u64..64),
        cuts in cuts(),
    ) {
        for body in [raw, pieces.concat()] {
            let whole = run_cut(kind, expected, &body, &[]);
            prop_assert_eq!(&run_cut(kind, expected, &body, &cuts), &whole);
            let bytewise: Vec<usize> = (0..body.len()).collect();
            prop_assert_eq!(&run_cut(kind, expected, &body, &bytewise), &whole);
        }
    }

    /// A well-formed body, however cut: its payload reaches the scan exactly; the checked form
    /// passes it on byte for byte; the signed forms keep its length and its payload.
    #[test]
    fn a_well_formed_body_round_trips_its_payload(
        chunks in chunks(),
        trailers in 0usize..3,
        kind in 0u8..3,
        cuts in cuts(),
    ) {
        let body = well_formed(kind, &chunks, trailers);
        let payload = chunks.concat();
        let declared = Some(payload.len() as u64);
        let whole = run_cut(kind, declared, &body, &[]);
        let (out, seen) = whole.clone().map_err(TestCaseError::fail)?;
        prop_assert_eq!(&seen, &payload);
        if kind == 0 {
            prop_assert_eq!(&out, &body);
        } else {
            prop_assert_eq!(out.len(), body.len());
            prop_assert_eq!(&payload_of(&out), &payload);
            prop_assert!(!contains(&out, DUMMY.as_bytes()), "every signature replaced");
        }
        prop_assert_eq!(&run_cut(kind, declared, &body, &cuts), &whole);
        prop_assert_eq!(&run_cut(kind, None, &body, &cuts), &whole);
        // A declared length the chunks do not hold is refused.
        let off = Some(payload.len() as u64 + 1);
        prop_assert!(run_cut(kind, off, &body, &cuts).is_err());
    }

    /// A well-formed body broken once (cut short, bytes after its end, a bare LF, a size that
    /// is not hex, data without its CRLF) is an error in every form, however cut.
    #[test]
    fn a_malformed_body_is_an_error(
        chunks in chunks(),
        kind in 0u8..3,
        how in broken(),
        cuts in cuts(),
    ) {
        let body = break_body(&well_formed(kind, &chunks, 1), &chunks, &how);
        prop_assert!(run_cut(kind, None, &body, &[]).is_err(), "{:?}", how);
        prop_assert!(run_cut(kind, None, &body, &cuts).is_err(), "{:?}", how);
    }
}

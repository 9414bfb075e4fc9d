//! The sniffer's tests: every head found wherever it starts, verdicts independent of read
//! boundaries, fail-closed loss of framing, bounded memory.

use super::*;

fn method(m: &str) -> Method {
    Method::from_bytes(m.as_bytes()).expect("method")
}

fn uri(t: &str) -> Uri {
    t.parse().expect("uri")
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
            sniff.framing_of(&method(m), &uri(t)).map_err(|r| r.message)
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
            let mut head =
                format!("POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\n{headers}\r\n0\r\n\r\n");
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
    let head: &[u8] = b"GET http://a.test/1 HTTP/1.1\r\n\r\nGET http://a.test/2 HTTP/1.1\r\n\r\n";
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
    assert!(sniff
        .framing_of(&method("GET"), &uri("http://a.test/1"))
        .is_err());
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
            let _ = sniff.framing_of(&Method::GET, &Uri::from_static("/"));
        }
        let g = sniff.lock();
        proptest::prop_assert!(g.head.len() <= SNIFF_HEAD_LIMIT && g.seen.len() <= SNIFF_QUEUE);
    }
}

#[test]
fn a_head_that_arrives_whole_is_judged_where_it_lies_and_never_buffered() {
    let sniff = HeadSniff::default();
    sniff.on_read(b"POST http://a.test/1 HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
    sniff.on_read(b"GET http://a.test/2 HTTP/1.1\r\n\r\n");
    {
        let g = sniff.lock();
        assert_eq!(g.head.capacity(), 0, "no copy of a whole head");
        assert_eq!(g.seen.len(), 2);
    }
    for t in ["http://a.test/1", "http://a.test/2"] {
        sniff.begin_request();
        let m = if t.ends_with('1') { "POST" } else { "GET" };
        assert_eq!(sniff.framing_of(&method(m), &uri(t)), Ok(()), "{t}");
    }
}

#[test]
fn a_split_head_gives_its_buffer_back_once_judged() {
    let sniff = HeadSniff::default();
    sniff.on_read(b"GET http://a.test/1 HTTP/1.1\r\nHost: a");
    assert!(!sniff.lock().head.is_empty());
    sniff.on_read(b".test\r\n\r\n");
    assert_eq!(sniff.lock().head.capacity(), 0);
    sniff.begin_request();
    assert_eq!(
        sniff.framing_of(&Method::GET, &uri("http://a.test/1")),
        Ok(())
    );
}

#[test]
fn once_framing_is_lost_reads_skip_the_parser() {
    let sniff = HeadSniff::default();
    sniff.on_read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    assert!(
        sniff.done.load(Ordering::Relaxed),
        "an h2 preface is no head"
    );
    sniff.on_read(b"GET http://a.test/1 HTTP/1.1\r\n\r\n");
    assert_eq!(sniff.lock().parsed, 0);
    sniff.begin_request();
    let e = sniff
        .framing_of(&Method::GET, &uri("http://a.test/1"))
        .expect_err("lost");
    assert_eq!(e.reason, Reason::AmbiguousFraming);
    assert!(e.message.contains("malformed"), "{e}");
}

#[test]
fn the_fingerprint_compares_the_target_by_component() {
    // The same bytes parse the same way on both sides, whatever their form.
    for (m, t) in [
        ("GET", "http://A.test:8080/x?y=1"),
        ("GET", "http://a.test"),
        ("CONNECT", "a.test:443"),
        ("OPTIONS", "*"),
        ("get", "/origin?q"),
    ] {
        let sniff = HeadSniff::default();
        sniff.on_read(format!("{m} {t} HTTP/1.1\r\n\r\n").as_bytes());
        sniff.begin_request();
        assert_eq!(sniff.framing_of(&method(m), &uri(t)), Ok(()), "{m} {t}");
    }
    // A different target, method, query or authority is another request.
    for (m, t) in [
        ("GET", "http://a.test/x?y=2"),
        ("GET", "http://b.test/x?y=1"),
        ("POST", "http://A.test:8080/x?y=1"),
        ("GET", "/x?y=1"),
    ] {
        let sniff = HeadSniff::default();
        sniff.on_read(b"GET http://A.test:8080/x?y=1 HTTP/1.1\r\n\r\n");
        sniff.begin_request();
        assert!(sniff.framing_of(&method(m), &uri(t)).is_err(), "{m} {t}");
    }
}

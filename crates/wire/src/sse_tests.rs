use proptest::prelude::*;

use super::*;

/// What an event comes to, owned, for comparing.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    data: Option<Vec<u8>>,
    oversized: bool,
    name: Option<Vec<u8>>,
    ended: bool,
}

const RAW: Limits = Limits {
    max_data: 1 << 20,
    max_raw: Some(1 << 20),
};

/// Feeds `stream` cut at `cuts` (positions, any order, out of range ones wrapped); the events
/// and the raw bytes of each.
fn parse_at(stream: &[u8], cuts: &[usize], limits: Limits) -> (Vec<Seen>, Vec<Vec<u8>>) {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|c| c % (stream.len() + 1))
        .chain([0, stream.len()])
        .collect();
    points.sort_unstable();
    points.dedup();
    let mut p = Parser::new(limits);
    let mut seen = Vec::new();
    let mut raws = Vec::new();
    let mut on = |e: Event<'_>| {
        raws.push(e.raw.to_vec());
        // The `\n` of a `\r\n` the stream ended with after an event: no event of its own.
        if !e.raw.is_empty() && e.raw.len() == e.carried {
            return;
        }
        seen.push(Seen {
            data: e.data.map(<[u8]>::to_vec),
            oversized: e.oversized,
            name: e.name.map(<[u8]>::to_vec),
            ended: e.ended,
        });
    };
    for w in points.windows(2) {
        p.feed(&stream[w[0]..w[1]], &mut on)
            .expect("within the limit");
    }
    p.finish(&mut on).expect("within the limit");
    (seen, raws)
}

/// The spec's algorithm, whole-stream and written plainly: split into lines, then fields;
/// what the stream ends inside is flushed (`ended` false), as the parser does.
fn reference(stream: &[u8]) -> Vec<Seen> {
    let raw_bom_only = stream == b"\xEF\xBB\xBF";
    let stream = stream.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(stream);
    let mut lines: Vec<&[u8]> = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < stream.len() {
        match stream[i] {
            b'\r' | b'\n' => {
                lines.push(&stream[start..i]);
                let crlf = stream[i] == b'\r' && stream.get(i + 1) == Some(&b'\n');
                i += if crlf { 2 } else { 1 };
                start = i;
            }
            _ => i += 1,
        }
    }
    if start < stream.len() {
        lines.push(&stream[start..]);
    }
    let mut out = Vec::new();
    let mut data: Option<Vec<&[u8]>> = None;
    let mut name: Option<Vec<u8>> = None;
    let mut pending = false;
    let flush = |data: &mut Option<Vec<&[u8]>>, name: &mut Option<Vec<u8>>, ended| Seen {
        data: data.take().map(|d| d.join(&b'\n')),
        oversized: false,
        name: name.take(),
        ended,
    };
    for line in lines {
        if line.is_empty() {
            out.push(flush(&mut data, &mut name, true));
            pending = false;
            continue;
        }
        pending = true;
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(c) => {
                let v = &line[c + 1..];
                (&line[..c], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => data.get_or_insert_with(Vec::new).push(value),
            b"event" => name = (value.len() <= MAX_NAME).then(|| value.to_vec()),
            _ => {}
        }
    }
    // A stream of just a byte-order mark is one line the stream ended inside, like any other.
    if pending || raw_bom_only {
        out.push(flush(&mut data, &mut name, false));
    }
    out
}

/// Pieces SSE is made of, to build streams that exercise every rule.
fn piece() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("data:"),
        Just("data: "),
        Just("data"),
        Just("event: "),
        Just("event:x"),
        Just("id: 1"),
        Just("retry: 5"),
        Just(":"),
        Just(": keep-alive"),
        Just("\r"),
        Just("\n"),
        Just("\r\n"),
        Just(" "),
        Just("{\"id\":1}"),
        Just("message"),
        Just("\u{feff}"),
        Just("daTa: x"),
    ]
}

fn stream() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(piece(), 0..40).prop_map(|p| p.concat().into_bytes())
}

#[test]
fn line_endings_of_every_kind_end_events() {
    for s in [
        "data: a\n\ndata: b\n\n",
        "data: a\r\n\r\ndata: b\r\n\r\n",
        "data: a\r\rdata: b\r\r",
        "data: a\r\n\ndata: b\n\r",
    ] {
        let (seen, _) = parse_at(s.as_bytes(), &[], RAW);
        let data: Vec<_> = seen.iter().filter_map(|e| e.data.clone()).collect();
        assert_eq!(data, vec![b"a".to_vec(), b"b".to_vec()], "{s:?}");
        assert!(seen.iter().all(|e| e.ended), "{s:?}");
    }
}

#[test]
fn a_final_event_without_its_blank_line_is_flushed_not_lost() {
    for s in [
        "data: a\n\ndata: b\n",
        "data: a\n\ndata: b",
        "data: a\r\n\r\ndata: b\r",
    ] {
        let (seen, raws) = parse_at(s.as_bytes(), &[], RAW);
        assert_eq!(seen.len(), 2, "{s:?}");
        assert_eq!(seen[1].data.as_deref(), Some(&b"b"[..]), "{s:?}");
        assert!(!seen[1].ended, "{s:?}");
        assert_eq!(raws.concat(), s.as_bytes(), "{s:?}");
    }
    // Nothing after the last blank line: nothing to flush.
    let (seen, _) = parse_at(b"data: a\n\n", &[], RAW);
    assert_eq!(seen.len(), 1);
}

#[test]
fn multiline_data_names_comments_and_the_bom() {
    let s = "\u{feff}: hello\nevent: message\ndata: {\ndata\ndata:  x\nid: 3\n\n";
    let (seen, _) = parse_at(s.as_bytes(), &[], RAW);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].data.as_deref(), Some(&b"{\n\n x"[..]));
    assert_eq!(seen[0].name.as_deref(), Some(&b"message"[..]));
    // A comment and a blank line: an event with no data, reported at once.
    let (seen, _) = parse_at(b":\n\n", &[], RAW);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].data, None);
}

#[test]
fn a_crlf_split_after_an_event_is_carried_not_a_blank_line() {
    let mut p = Parser::new(RAW);
    let mut got: Vec<(Vec<u8>, usize, Option<Vec<u8>>)> = Vec::new();
    let mut on = |e: Event<'_>| got.push((e.raw.to_vec(), e.carried, e.data.map(<[u8]>::to_vec)));
    p.feed(b"data: a\r\n\r", &mut on).expect("feeds");
    p.feed(b"\ndata: b\r\n\r\n", &mut on).expect("feeds");
    p.finish(&mut on).expect("finishes");
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[2], (b"\n".to_vec(), 1, None));
    assert_eq!(got[0].0, b"data: a\r\n\r");
    assert_eq!(
        got[1],
        (b"\ndata: b\r\n\r".to_vec(), 1, Some(b"b".to_vec()))
    );
}

#[test]
fn limits_hold() {
    let small = Limits {
        max_data: 4,
        max_raw: None,
    };
    let (seen, raws) = parse_at(b"data: 12345\n\ndata: 1234\n\n", &[3, 9], small);
    assert!(seen[0].oversized && seen[0].data.is_none());
    assert_eq!(seen[1].data.as_deref(), Some(&b"1234"[..]));
    assert!(raws.iter().all(Vec::is_empty));
    let tight = Limits {
        max_data: 100,
        max_raw: Some(10),
    };
    let mut p = Parser::new(tight);
    let mut n = 0;
    assert!(p.feed(b"data: 1\n\n", &mut |_| n += 1).is_ok());
    assert!(p.feed(b"data: 12345", &mut |_| n += 1).is_err());
    assert!(p.feed(b"\n\n", &mut |_| n += 1).is_err());
    assert_eq!(n, 1);
    assert!(is_event_stream("Text/Event-Stream; charset=utf-8"));
    assert!(!is_event_stream("text/event-streams"));
}

/// What [`Event::lines`] calls data, read back: its data lines' values joined with `\n`.
fn data_of_lines(e: &Event<'_>) -> Option<Vec<u8>> {
    let (lines, _) = e.lines();
    let mut out: Option<Vec<u8>> = None;
    for (i, (line, data)) in lines.into_iter().enumerate() {
        if !data {
            continue;
        }
        let line = match e.first && i == 0 {
            true => line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line),
            false => line,
        };
        let value = match line.iter().position(|&b| b == b':') {
            Some(c) => line[c + 1..].strip_prefix(b" ").unwrap_or(&line[c + 1..]),
            None => &[][..],
        };
        match &mut out {
            Some(d) => {
                d.push(b'\n');
                d.extend_from_slice(value);
            }
            None => out = Some(value.to_vec()),
        }
    }
    out
}

#[test]
fn a_byte_order_mark_starts_a_data_line_only_on_the_first_line() {
    let mut seen = Vec::new();
    let mut p = Parser::new(RAW);
    let stream = b"\xEF\xBB\xBFdata: a\n\n\xEF\xBB\xBFdata: b\n\n";
    let mut on = |e: Event<'_>| seen.push((e.data.map(<[u8]>::to_vec), data_of_lines(&e)));
    p.feed(stream, &mut on).expect("within the limit");
    p.finish(&mut on).expect("within the limit");
    assert_eq!(
        seen,
        vec![(Some(b"a".to_vec()), Some(b"a".to_vec())), (None, None)]
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// `Event::lines` marks as data exactly the lines the parser read the event's data from.
    #[test]
    fn lines_find_the_data_the_parser_reads(
        s in stream(),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let mut p = Parser::new(RAW);
        let mut seen = Vec::new();
        let mut on = |e: Event<'_>| seen.push((e.data.map(<[u8]>::to_vec), data_of_lines(&e)));
        let mut at = 0;
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (s.len() + 1)).collect();
        points.sort_unstable();
        for c in points.into_iter().chain([s.len()]) {
            p.feed(&s[at..c], &mut on).expect("within the limit");
            at = c;
        }
        p.finish(&mut on).expect("within the limit");
        for (data, from_lines) in seen {
            prop_assert_eq!(data, from_lines);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The parser agrees with the plain reference, and the raw bytes it reports are the stream.
    #[test]
    fn agrees_with_the_reference(s in stream(), cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        let (seen, raws) = parse_at(&s, &cuts, RAW);
        prop_assert_eq!(&seen, &reference(&s));
        prop_assert_eq!(raws.concat(), s);
    }

}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Chunking never changes the events: every single split point, and every pair.
    #[test]
    fn every_split_gives_the_same_events(s in stream()) {
        let whole = parse_at(&s, &[], RAW);
        for a in 0..=s.len() {
            prop_assert_eq!(&parse_at(&s, &[a], RAW), &whole, "split at {}", a);
        }
        let step = (s.len() / 8).max(1);
        for a in (0..=s.len()).step_by(step) {
            for b in a..=s.len() {
                prop_assert_eq!(&parse_at(&s, &[a, b], RAW), &whole, "split at {} and {}", a, b);
            }
        }
    }

}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary bytes, arbitrarily cut, under tight limits: never a panic, the raw bytes are
    /// the stream, and nothing held passes the limits.
    #[test]
    fn arbitrary_bytes_never_panic(
        s in proptest::collection::vec(any::<u8>(), 0..1024),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
        max_data in 0usize..64,
    ) {
        let limits = Limits { max_data, max_raw: Some(4096) };
        let (seen, raws) = parse_at(&s, &cuts, limits);
        prop_assert_eq!(&raws.concat(), &s);
        prop_assert!(seen.iter().all(|e| e.data.as_ref().is_none_or(|d| d.len() <= max_data)));
        let mut p = Parser::new(Limits { max_data, max_raw: Some(32) });
        for chunk in s.chunks(7) {
            if p.feed(chunk, &mut |e| assert!(e.raw.len() <= 32)).is_err() {
                break;
            }
            prop_assert!(p.held() <= 2 * 32 + max_data + 2 * MAX_NAME);
        }
        let _ = p.finish(&mut |_| {});
    }
}

/// Pieces of a line: [`piece`] without its line endings.
fn line_piece() -> impl Strategy<Value = &'static str> {
    piece().prop_filter("no line ending", |p| !p.contains(['\r', '\n']))
}

/// The lines of a stream (no line endings in them), and one ending choice per line.
fn lines() -> impl Strategy<Value = Vec<(String, u8)>> {
    let line = proptest::collection::vec(line_piece(), 0..5).prop_map(|p| p.concat());
    proptest::collection::vec((line, 0u8..3), 0..20)
}

/// `lines` joined, each ended by `\n` (0), `\r` (1) or `\r\n` (2) — `ending` overriding the
/// choice when given. A `\r` followed by an empty line ended by `\n` would be one `\r\n` line
/// end, not two, so that `\n` becomes `\r\n`.
fn joined(lines: &[(String, u8)], ending: Option<u8>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut after_cr = false;
    for (line, choice) in lines {
        let mut choice = ending.unwrap_or(*choice);
        if after_cr && line.is_empty() && choice == 0 {
            choice = 2;
        }
        out.extend_from_slice(line.as_bytes());
        out.extend_from_slice(match choice {
            0 => b"\n".as_slice(),
            1 => b"\r",
            _ => b"\r\n",
        });
        after_cr = choice == 1;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The spec's three line endings are equivalent: the same lines ended by `\n`, `\r`,
    /// `\r\n` or a mix give the same events, however each stream is cut.
    #[test]
    fn lf_cr_and_crlf_line_endings_give_the_same_events(
        lines in lines(),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let lf = joined(&lines, Some(0));
        let want = parse_at(&lf, &[], RAW).0;
        prop_assert_eq!(&want, &reference(&lf));
        for (name, stream) in [
            ("CR", joined(&lines, Some(1))),
            ("CRLF", joined(&lines, Some(2))),
            ("mixed", joined(&lines, None)),
        ] {
            let (seen, raws) = parse_at(&stream, &cuts, RAW);
            prop_assert_eq!(&seen, &want, "{} endings", name);
            prop_assert_eq!(raws.concat(), stream);
        }
    }
}

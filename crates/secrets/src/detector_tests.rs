//! The streamed leak check: every split of a body (1-byte frames, cuts at each window edge, a
//! held prefix and the frames behind it) finds what the whole body holds, and nothing else.

use super::*;
use proptest::prelude::*;

use crate::scrub::ScrubSecret;

const SECRET: &[u8] = b"sk-test-OPENAI-4f9a1c7e2b8d";

fn detector(bound: &[&str]) -> Detector {
    detector_with(&scrubber(), bound)
}

fn scrubber() -> Arc<Scrubber> {
    Arc::new(
        Scrubber::new(&[ScrubSecret {
            name: "openai",
            value: SECRET,
        }])
        .expect("scrubber"),
    )
}

/// A detector on a scrubber built once (building one per run would be most of a test's time).
fn detector_with(scrubber: &Arc<Scrubber>, bound: &[&str]) -> Detector {
    let scrubber = Arc::clone(scrubber);
    let bound: BTreeSet<String> = bound.iter().map(|s| s.to_string()).collect();
    let none = BTreeSet::new();
    let rule = Binding {
        rule: "report-only",
        bound: &bound,
        placeholders: &[],
        captured: &none,
        withheld: &none,
    };
    Detector::new(Some(scrubber), &rule, "api.test", 8 * 1024 * 1024)
}

/// Feeds `chunks`; returns what went out, or the refusal and what went out before it.
fn run(d: &mut Detector, chunks: &[&[u8]]) -> (Vec<u8>, Option<Reason>) {
    let mut out = Vec::new();
    for c in chunks {
        match d.push(Bytes::copy_from_slice(c)) {
            Ok(b) => out.extend_from_slice(&b),
            Err(r) => return (out, Some(r.reason)),
        }
    }
    match d.finish() {
        Ok(b) => out.extend_from_slice(&b),
        Err(r) => return (out, Some(r.reason)),
    }
    (out, None)
}

#[test]
fn a_secret_split_across_chunks_is_refused_before_any_of_it_goes_out() {
    let mut body = b"x".repeat(100);
    body.extend_from_slice(SECRET);
    body.extend_from_slice(b"tail");
    for cut in 1..body.len() {
        let mut d = detector(&[]);
        let (out, refused) = run(&mut d, &[&body[..cut], &body[cut..]]);
        assert_eq!(refused, Some(Reason::SecretValueUnbound), "cut at {cut}");
        assert!(
            !out.windows(4).any(|w| w == b"sk-t"),
            "cut at {cut}: part of the secret went out: {:?}",
            String::from_utf8_lossy(&out)
        );
    }
}

#[test]
fn clean_bodies_pass_byte_exact_and_bound_secrets_pass_too() {
    let body: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let chunks: Vec<&[u8]> = body.chunks(333).collect();
    let (out, refused) = run(&mut detector(&[]), &chunks);
    assert_eq!((out, refused), (body.clone(), None));

    let mut with = body.clone();
    with.splice(2000..2000, SECRET.iter().copied());
    let chunks: Vec<&[u8]> = with.chunks(97).collect();
    let (out, refused) = run(&mut detector(&["openai"]), &chunks);
    assert_eq!(refused, None);
    assert_eq!(out, with, "a bound secret's bytes pass unchanged");
}

/// A value escaped byte by byte (`%XX`, `\u00XX`, half and half), split at every point:
/// refused, and none of its escaped form goes out first.
#[test]
fn an_escaped_secret_split_across_chunks_is_refused_before_any_of_it_goes_out() {
    let pct: String = SECRET.iter().map(|b| format!("%{b:02x}")).collect();
    let uni: String = SECRET.iter().map(|b| format!("\\u{:04X}", b)).collect();
    let half: String = SECRET[..10]
        .iter()
        .map(|&b| (b as char).to_string())
        .chain(SECRET[10..].iter().map(|b| format!("\\u{b:04x}")))
        .collect();
    let qp: String = SECRET.iter().map(|b| format!("={b:02X}")).collect();
    for escaped in [pct, uni, half, qp] {
        let mut body = b"{\"a\":\"".to_vec();
        let start = body.len();
        body.extend_from_slice(escaped.as_bytes());
        body.extend_from_slice(b"\"}");
        for cut in 1..body.len() {
            let mut d = detector(&[]);
            let (out, refused) = run(&mut d, &[&body[..cut], &body[cut..]]);
            assert_eq!(
                refused,
                Some(Reason::SecretValueUnbound),
                "{escaped} cut at {cut}"
            );
            assert!(
                out.len() <= start,
                "{escaped} cut at {cut}: {:?}",
                String::from_utf8_lossy(&out)
            );
        }
        let mut d = detector(&["openai"]);
        let (out, refused) = run(&mut d, &[&body[..20], &body[20..]]);
        assert_eq!(
            (out, refused),
            (body.clone(), None),
            "bound: passes unchanged"
        );
    }
    // Escapes of ordinary text pass byte-exact, split anywhere.
    let body = br#"{"k":"caf\u00e9 100%25 \/"}"#.repeat(50);
    for cut in [1, 7, 100, 500] {
        let (out, refused) = run(&mut detector(&[]), &[&body[..cut], &body[cut..]]);
        assert_eq!((out, refused), (body.clone(), None));
    }
}

#[test]
fn placeholders_are_refused_across_a_chunk_boundary() {
    let (_, refused) = run(&mut detector(&[]), &[b"aaa__LATCH", b"KEY_openai__"]);
    assert_eq!(refused, Some(Reason::PlaceholderNotBound));
}

/// A placeholder split after more than the prefix's length of a chunk (the seam must carry the
/// chunk's end, not its start), at every cut.
#[test]
fn a_placeholder_split_anywhere_in_long_chunks_is_refused() {
    let mut body = b"{\"prompt\":\"".to_vec();
    body.extend_from_slice(&b"x".repeat(40));
    let start = body.len();
    body.extend_from_slice(b"__LATCHKEY_openai__");
    body.extend_from_slice(b"\"}");
    for cut in 1..body.len() {
        for d in [detector(&[]), detector(&["openai"]), plain()] {
            let mut d = d;
            let (out, refused) = run(&mut d, &[&body[..cut], &body[cut..]]);
            assert_eq!(refused, Some(Reason::PlaceholderNotBound), "cut at {cut}");
            assert!(
                out.len() <= start,
                "cut at {cut}: {} bytes went out",
                out.len()
            );
        }
    }
}

/// A body longer than what is held whole goes as one held prefix, then frames: a placeholder or
/// a secret straddling the 8 MiB edge between them is found.
#[test]
fn a_value_straddling_the_scan_limit_edge_is_found() {
    // The most the broker holds whole (its SCAN_LIMIT): the prefix that goes first.
    let limit = 8 * 1024 * 1024;
    for (needle, want) in [
        (PLACEHOLDER, Reason::PlaceholderNotBound),
        (SECRET, Reason::SecretValueUnbound),
    ] {
        for back in [1, 5, needle.len() - 1] {
            let mut body = vec![b'a'; limit - back];
            body.extend_from_slice(needle);
            body.extend_from_slice(&vec![b'b'; 40_000]);
            let prefix = &body[..limit];
            let mut chunks: Vec<&[u8]> = vec![prefix];
            chunks.extend(body[limit..].chunks(16 * 1024));
            let (out, refused) = run(&mut detector(&[]), &chunks);
            assert_eq!(refused, Some(want), "{back} bytes before the edge");
            assert!(
                out.len() <= limit - back,
                "{back}: {} bytes went out",
                out.len()
            );
        }
    }
}

const PLACEHOLDER: &[u8] = b"__LATCHKEY_openai__";

/// Bytes that begin (or are the start of) an escape, next to which a needle must still be
/// found: backslash runs of either parity, `%`, `&`, `+`, `=`, partial and lone-surrogate `\u`
/// escapes, an escaped backslash.
const ESCAPE_EDGES: &[&[u8]] = &[
    b"\\",
    b"\\\\",
    b"\\\\\\",
    b"x\\\\\\\\",
    b"%",
    b"%2",
    b"%5C",
    b"&",
    b"+",
    b"=",
    b"u",
    b"\\u",
    b"\\u00",
    b"\\ud83d",
    b"\\\\u",
];

/// [`needles`] and more forms escaped byte by byte: lower-case `%xx`, upper-case `\u00XX`,
/// quoted-printable, half literal and half `\u`.
fn escaped_needles() -> Vec<(Vec<u8>, Reason)> {
    let pct: String = SECRET.iter().map(|b| format!("%{b:02x}")).collect();
    let uni: String = SECRET.iter().map(|b| format!("\\u{b:04X}")).collect();
    let qp: String = SECRET.iter().map(|b| format!("={b:02X}")).collect();
    let half: String = SECRET[..10]
        .iter()
        .map(|&b| (b as char).to_string())
        .chain(SECRET[10..].iter().map(|b| format!("\\u{b:04x}")))
        .collect();
    let mut all = needles();
    for form in [pct, uni, qp, half] {
        all.push((form.into_bytes(), Reason::SecretValueUnbound));
    }
    all
}

/// A needle in every form right after, right before or between bytes that begin an escape
/// (the regression: `\` then `\u0073…`, where the view read from the run's start paired the
/// two backslashes and never decoded the value), cut at every point and sent a byte at a time:
/// refused for what it is, and the needle never goes out whole.
#[test]
fn a_needle_next_to_an_escape_introducer_is_found_at_every_split() {
    let scrubber = scrubber();
    for (needle, want) in escaped_needles() {
        for edge in ESCAPE_EDGES {
            for (before, after) in [(*edge, &b""[..]), (&b""[..], *edge), (*edge, *edge)] {
                let mut body = b"{\"k\":\"".to_vec();
                body.extend_from_slice(before);
                body.extend_from_slice(&needle);
                body.extend_from_slice(after);
                body.extend_from_slice(b"\"}");
                let bytes: Vec<&[u8]> = body.chunks(1).collect();
                let mut splits = vec![bytes];
                for cut in 1..body.len() {
                    splits.push(vec![&body[..cut], &body[cut..]]);
                }
                let what = String::from_utf8_lossy(&body);
                for (i, frames) in splits.iter().enumerate() {
                    let (out, refused) = run(&mut detector_with(&scrubber, &[]), frames);
                    assert_eq!(refused, Some(want), "{what} split {i}");
                    assert!(
                        !out.windows(needle.len()).any(|w| w == needle.as_slice()),
                        "{what} split {i}: the needle went out"
                    );
                }
            }
        }
    }
}

/// A detector with no secret declared at all (placeholders are refused all the same).
fn plain() -> Detector {
    let none = BTreeSet::new();
    let rule = Binding {
        rule: "r",
        bound: &none,
        placeholders: &[],
        captured: &none,
        withheld: &none,
    };
    Detector::new(None, &rule, "api.test", 8 * 1024 * 1024)
}

/// The forms a needle is sent in, each with the reason it is refused for.
fn needles() -> Vec<(Vec<u8>, Reason)> {
    let pct: String = SECRET.iter().map(|b| format!("%{b:02X}")).collect();
    let uni: String = SECRET.iter().map(|b| format!("\\u{b:04x}")).collect();
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, SECRET);
    let esc_placeholder: String = PLACEHOLDER.iter().map(|b| format!("\\u{b:04x}")).collect();
    let pct_placeholder = "%5F%5FLATCHKEY_openai__".to_string();
    vec![
        (SECRET.to_vec(), Reason::SecretValueUnbound),
        (pct.into_bytes(), Reason::SecretValueUnbound),
        (uni.into_bytes(), Reason::SecretValueUnbound),
        (b64.into_bytes(), Reason::SecretValueUnbound),
        (PLACEHOLDER.to_vec(), Reason::PlaceholderNotBound),
        (esc_placeholder.into_bytes(), Reason::PlaceholderNotBound),
        (pct_placeholder.into_bytes(), Reason::PlaceholderNotBound),
    ]
}

/// Filler that looks like what bodies hold around a needle: JSON punctuation, escapes, line
/// breaks, pieces of the prefix and of the secret.
fn filler() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..24),
        Just(b"{\"k\":\"v\"}".to_vec()),
        Just(b"__LATCH".to_vec()),
        Just(b"_LATCHKEY".to_vec()),
        Just(b"sk-test-OPEN".to_vec()),
        Just(b"%41\\u0042=43\r\n".to_vec()),
        Just(b"\\n\\\"".to_vec()),
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|p| p.concat())
}

/// Cuts `len` bytes into frames: at `cuts` (any order, any repeats), or into 1-byte frames.
fn split(body: &[u8], cuts: &[usize], single: bool) -> Vec<Vec<u8>> {
    if single {
        return body.chunks(1).map(<[u8]>::to_vec).collect();
    }
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    at.push(0);
    at.push(body.len());
    at.sort_unstable();
    at.dedup();
    at.windows(2).map(|w| body[w[0]..w[1]].to_vec()).collect()
}

/// Whether the whole body holds what the detector looks for (so a refusal is right).
fn holds_a_needle(body: &[u8]) -> bool {
    let d = detector(&[]);
    let scrubber = d.scrubber.clone();
    let found_raw = |b: &[u8]| {
        placeholder::contains(b) || scrubber.as_deref().is_some_and(|s| s.find(b).is_some())
    };
    found_raw(body) || decoded_views(body).iter().any(|v| found_raw(v))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A needle in any form, anywhere, cut anywhere (each cut also placed exactly at the
    /// needle's edges and inside it), or sent a byte at a time: refused, and the needle never
    /// goes out whole before the refusal.
    #[test]
    fn a_needle_is_found_across_every_split(
        before in filler(),
        after in filler(),
        which in any::<prop::sample::Index>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
        inside in proptest::collection::vec(0usize..64, 0..3),
        single in proptest::bool::weighted(0.15),
    ) {
        let needles = needles();
        let (needle, want) = which.get(&needles);
        let mut body = before.clone();
        body.extend_from_slice(needle);
        body.extend_from_slice(&after);
        let mut cuts = cuts;
        cuts.extend(inside.iter().map(|i| before.len() + i % (needle.len() + 1)));
        cuts.push(before.len());
        cuts.push(before.len() + needle.len());
        let frames = split(&body, &cuts, single);
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let (out, refused) = run(&mut detector(&[]), &refs);
        // Filler can itself hold a needle (a secret piece next to its rest): any refusal then.
        prop_assert!(refused.is_some(), "not refused");
        if !holds_a_needle(&before) && !holds_a_needle(&after) {
            prop_assert_eq!(refused, Some(*want));
        }
        prop_assert!(
            !out.windows(needle.len()).any(|w| w == needle.as_slice()),
            "the needle went out"
        );
    }

    /// A body without a needle passes byte-exact however it is cut; a bound secret passes too.
    #[test]
    fn a_body_without_a_needle_passes_unchanged_across_every_split(
        body in filler(),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
        single in proptest::bool::weighted(0.15),
    ) {
        prop_assume!(!holds_a_needle(&body));
        let frames = split(&body, &cuts, single);
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        prop_assert_eq!(run(&mut detector(&[]), &refs), (body.clone(), None));
        prop_assert_eq!(run(&mut plain(), &refs), (body.clone(), None));
        let mut with = body.clone();
        with.extend_from_slice(SECRET);
        with.extend_from_slice(&body);
        let frames = split(&with, &cuts, single);
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        prop_assert_eq!(run(&mut detector(&["openai"]), &refs), (with.clone(), None));
    }
}

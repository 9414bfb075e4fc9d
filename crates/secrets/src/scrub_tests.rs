use std::sync::Arc;

use base64::Engine as _;

use super::*;

const OPENAI: &[u8] = b"sk-test-9f8e7d6c5b4a39281706";

fn scrubber(secrets: &[(&str, &[u8])]) -> Arc<Scrubber> {
    let secrets: Vec<ScrubSecret<'_>> = secrets
        .iter()
        .map(|&(name, value)| ScrubSecret { name, value })
        .collect();
    match Scrubber::new(&secrets) {
        Ok(scrubber) => Arc::new(scrubber),
        Err(e) => panic!("scrubber should build: {e}"),
    }
}

fn names(list: &[Arc<str>]) -> Vec<&str> {
    list.iter().map(|n| &**n).collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Scrubs `input` through a stream cut at the given chunk lengths (the last chunk takes the
/// rest), alternating `push` and `push_bytes`, checking the hold-back bound after every push.
fn stream_scrub(scrubber: &Arc<Scrubber>, input: &[u8], cuts: &[usize]) -> (Vec<u8>, usize) {
    let mut stream = scrubber.stream();
    let mut out = Vec::new();
    let mut rest = input;
    for (i, &len) in cuts.iter().enumerate() {
        let (chunk, tail) = rest.split_at(len.min(rest.len()));
        // Both entry points, interleaved: they share the held tail.
        let piece = if i % 2 == 0 {
            stream.push(chunk)
        } else {
            stream.push_bytes(Bytes::copy_from_slice(chunk))
        };
        out.extend_from_slice(&piece);
        let max = scrubber.max_pattern_len();
        assert!(
            stream.held.len() < max.max(1),
            "held {} bytes with max pattern len {max}",
            stream.held.len(),
        );
        // The buffer itself stays small too, however large the chunks.
        assert!(
            stream.held.capacity() <= 4 * max + 8,
            "{}",
            stream.held.capacity()
        );
        rest = tail;
    }
    out.extend_from_slice(&stream.push(rest));
    out.extend_from_slice(&stream.finish());
    assert!(stream.held.is_empty());
    (out, stream.redactions())
}

/// Deterministic pseudo-random numbers (SplitMix64), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Every variant the scrubber would look for, built the obvious way, for the naive reference.
fn patterns_of(secrets: &[(&str, &[u8])]) -> Vec<(Vec<u8>, String)> {
    let mut patterns: Vec<(Vec<u8>, String)> = Vec::new();
    for &(name, value) in secrets {
        for variant in variants_of(value) {
            if variant.len() >= MIN_VARIANT_LEN && !patterns.iter().any(|(p, _)| **p == **variant) {
                patterns.push((variant.to_vec(), name.to_owned()));
            }
        }
    }
    patterns
}

/// Leftmost-longest replacement by brute force: the oracle `scrub` must agree with.
fn naive_scrub(patterns: &[(Vec<u8>, String)], input: &[u8]) -> (Vec<u8>, Vec<String>) {
    let mut out = Vec::new();
    let mut redacted = Vec::new();
    let mut at = 0;
    while at < input.len() {
        let longest = patterns
            .iter()
            .filter(|(p, _)| input[at..].starts_with(p))
            .max_by_key(|(p, _)| p.len());
        match longest {
            Some((p, name)) => {
                out.extend_from_slice(format!("[REDACTED:{name}]").as_bytes());
                redacted.push(name.clone());
                at += p.len();
            }
            None => {
                out.push(input[at]);
                at += 1;
            }
        }
    }
    (out, redacted)
}

#[test]
fn raw_secret_in_surrounding_text_is_redacted() {
    let s = scrubber(&[("openai", OPENAI)]);
    let input = [b"Authorization: Bearer ".as_slice(), OPENAI, b"\r\n"].concat();
    let (out, redacted) = s.scrub(&input);
    assert_eq!(out, b"Authorization: Bearer [REDACTED:openai]\r\n");
    assert_eq!(names(&redacted), ["openai"]);
}

#[test]
fn every_occurrence_is_redacted_and_named_each_time() {
    let s = scrubber(&[("openai", OPENAI)]);
    let input = [OPENAI, b" and ", OPENAI, OPENAI].concat();
    let (out, redacted) = s.scrub(&input);
    assert_eq!(
        out,
        b"[REDACTED:openai] and [REDACTED:openai][REDACTED:openai]"
    );
    assert_eq!(names(&redacted), ["openai"; 3]);
}

#[test]
fn base64_standard_and_url_safe_are_redacted_at_every_alignment_inside_a_larger_blob() {
    // 0xfb 0xff encode to `+/` or `-_`, so the two alphabets give different variants.
    let secret: &[u8] = b"\xfb\xff\xfekey-material-\xfb\xef\xbe0123";
    let s = scrubber(&[("blob", secret)]);
    let engines = [
        ("standard", &base64::engine::general_purpose::STANDARD),
        ("url-safe", &base64::engine::general_purpose::URL_SAFE),
    ];
    for (alphabet, engine) in engines {
        for prefix_len in 0..6 {
            for suffix_len in 0..4 {
                let prefix = &b"\x00\xffAB\x7fz"[..prefix_len];
                let suffix = &b"\x01\xfe\x80Q"[..suffix_len];
                let blob = engine.encode([prefix, secret, suffix].concat());
                let input = format!("{{\"data\":\"{blob}\"}}");
                let (out, redacted) = s.scrub(input.as_bytes());

                // Exactly the characters determined by the secret's bits are replaced.
                let first = (8 * prefix_len).div_ceil(6);
                let end = 8 * (prefix_len + secret.len()) / 6;
                let expected = format!(
                    "{{\"data\":\"{}[REDACTED:blob]{}\"}}",
                    &blob[..first],
                    &blob[end..]
                );
                assert_eq!(
                    String::from_utf8_lossy(&out),
                    expected,
                    "{alphabet} base64, prefix {prefix_len}, suffix {suffix_len}"
                );
                assert_eq!(names(&redacted), ["blob"]);
            }
        }
    }
}

#[test]
fn percent_encoded_forms_in_upper_and_lower_case_hex_are_redacted() {
    let secret: &[u8] = b"sk/te st+key=1&x";
    let s = scrubber(&[("form", secret)]);
    // What Python's quote(v, safe=''), quote(v) and quote_plus(v) print, then lower-cased hex,
    // and JavaScript's encodeURIComponent.
    let encodings = [
        "sk%2Fte%20st%2Bkey%3D1%26x",
        "sk/te%20st%2Bkey%3D1%26x",
        "sk%2Fte+st%2Bkey%3D1%26x",
        "sk%2fte%20st%2bkey%3d1%26x",
        "sk/te%20st%2bkey%3d1%26x",
        "sk%2fte+st%2bkey%3d1%26x",
    ];
    for encoded in encodings {
        let input = format!("Location: /cb?token={encoded}&next=1");
        let (out, redacted) = s.scrub(input.as_bytes());
        assert_eq!(
            String::from_utf8_lossy(&out),
            "Location: /cb?token=[REDACTED:form]&next=1",
            "{encoded}"
        );
        assert_eq!(names(&redacted), ["form"]);
    }
}

#[test]
fn only_reserved_characters_percent_encoded_is_redacted() {
    let secret: &[u8] = b"tok\"en<with>{odd}:chars";
    let s = scrubber(&[("odd", secret)]);
    for encoded in ["tok\"en<with>{odd}%3Achars", "tok\"en<with>{odd}%3achars"] {
        let (out, _) = s.scrub(format!("q={encoded};").as_bytes());
        assert_eq!(out, b"q=[REDACTED:odd];", "{encoded}");
    }
}

#[test]
fn json_escaped_forms_are_redacted_including_quote_backslash_slash_control_and_non_ascii() {
    let secret = "ab\"c\\d/e\u{1}f\tg\u{e9}\u{20ac}\u{1f600}h";
    let s = scrubber(&[("json", secret.as_bytes())]);
    let encodings = [
        // serde_json and JSON.stringify.
        r#"ab\"c\\d/e\u0001f\tgé€😀h"#,
        // Python json.dumps (ensure_ascii).
        r#"ab\"c\\d/e\u0001f\tg\u00e9\u20ac\ud83d\ude00h"#,
        // PHP json_encode.
        r#"ab\"c\\d\/e\u0001f\tg\u00e9\u20ac\ud83d\ude00h"#,
        // Everything as \u, upper-case hex.
        r#"ab\"c\\d\/e\u0001f\u0009g\u00E9\u20AC\uD83D\uDE00h"#,
    ];
    for encoded in encodings {
        let input = format!("{{\"echo\":\"{encoded}\",\"n\":1}}");
        let (out, redacted) = s.scrub(input.as_bytes());
        assert_eq!(
            String::from_utf8_lossy(&out),
            "{\"echo\":\"[REDACTED:json]\",\"n\":1}",
            "{encoded}"
        );
        assert_eq!(names(&redacted), ["json"]);
    }
}

#[test]
fn json_with_go_html_escaping_is_redacted() {
    let s = scrubber(&[("go", b"key<with>&amp\xe2\x80\xa8")]);
    let input = br#"{"k":"key\u003cwith\u003e\u0026amp\u2028"}"#;
    let (out, _) = s.scrub(input);
    assert_eq!(out, br#"{"k":"[REDACTED:go]"}"#);
}

#[test]
fn a_secret_that_extends_another_is_redacted_whole_under_its_own_name() {
    let short = b"sk-live-abcdefgh".as_slice();
    let long = b"sk-live-abcdefgh-extended-9".as_slice();
    for order in [
        [("short", short), ("long", long)],
        [("long", long), ("short", short)],
    ] {
        let s = scrubber(&order);
        let input = [
            b"a=".as_slice(),
            long,
            b" b=",
            short,
            b" c=",
            short,
            b"-ext",
        ]
        .concat();
        let (out, redacted) = s.scrub(&input);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "a=[REDACTED:long] b=[REDACTED:short] c=[REDACTED:short]-ext"
        );
        assert_eq!(names(&redacted), ["long", "short", "short"]);
    }
}

#[test]
fn the_same_value_under_two_names_is_redacted_under_the_first() {
    let s = scrubber(&[("first", OPENAI), ("second", OPENAI)]);
    let (out, redacted) = s.scrub(OPENAI);
    assert_eq!(out, b"[REDACTED:first]");
    assert_eq!(names(&redacted), ["first"]);
}

#[test]
fn two_values_under_one_name_share_it() {
    let s = scrubber(&[("key", b"first-value-123"), ("key", b"second-value-456")]);
    assert_eq!(s.names.len(), 1);
    let mut stream = s.stream();
    stream.push(b"first-value-123 second-value-456");
    stream.finish();
    assert_eq!(stream.redactions(), 2);
    assert_eq!(names(&stream.redacted_names()), ["key"]);
}

#[test]
fn variants_identical_to_another_are_kept_once() {
    // Unreserved ASCII only: every percent and JSON form equals the raw value.
    let s = scrubber(&[("plain", b"abcdefghijklmnop")]);
    // Raw, then at most three alignments in each of the two base64 alphabets.
    assert!(s.name_of_pattern.len() <= 7, "{s:?}");
    let patterns = patterns_of(&[("plain", b"abcdefghijklmnop")]);
    assert_eq!(patterns.len(), s.name_of_pattern.len());
}

#[test]
fn no_variant_is_shorter_than_the_minimum() {
    for value in [b"12345678".as_slice(), b"\x00\x01\x02\x03\x04\x05\x06\x07"] {
        for variant in variants_of(value) {
            assert!(
                variant.len() >= MIN_VARIANT_LEN,
                "{value:?}: {}",
                variant.len()
            );
        }
    }
}

#[test]
fn a_secret_shorter_than_eight_bytes_is_refused_by_name() {
    let secrets = [
        ScrubSecret {
            name: "ok",
            value: b"long-enough-value",
        },
        ScrubSecret {
            name: "tiny",
            value: b"abc1234",
        },
    ];
    match Scrubber::new(&secrets) {
        Err(e @ ScrubError::TooShort { .. }) => {
            let message = e.to_string();
            assert!(message.contains("\"tiny\""), "{message}");
            assert!(!message.contains("abc1234"), "{message}");
        }
        other => panic!("expected TooShort, got {other:?}"),
    }
}

#[test]
fn debug_output_shows_names_and_counts_but_no_secret_bytes() {
    let secret = b"sk-debug-0123456789abcdef";
    let s = scrubber(&[("debugged", secret)]);
    let mut stream = s.stream();
    stream.push(b"partial: sk-debug-0123456789ab");
    let printed = format!("{s:?} {s:#?} {stream:?} {stream:#?}");
    assert!(printed.contains("debugged"), "{printed}");
    for variant in variants_of(secret) {
        let variant = String::from_utf8_lossy(&variant[..MIN_VARIANT_LEN]).into_owned();
        assert!(!printed.contains(&variant), "{printed}");
    }
}

#[test]
fn find_returns_the_name_of_the_first_secret_whose_variant_occurs() {
    let s = scrubber(&[("a", b"aaaa-secret-1111"), ("b", b"bbbb-secret-2222")]);
    let encoded = base64::engine::general_purpose::STANDARD.encode(b"xbbbb-secret-2222y");
    let input = format!("q={encoded}&r=aaaa-secret-1111");
    assert_eq!(s.find(input.as_bytes()).as_deref(), Some("b"));
    assert_eq!(s.find(b"nothing to see here"), None);
}

#[test]
fn an_empty_scrubber_passes_everything_through() {
    let s = scrubber(&[]);
    assert!(s.is_empty());
    assert_eq!(s.max_pattern_len(), 0);
    assert_eq!(s.scrub(b"anything"), (b"anything".to_vec(), Vec::new()));
    assert_eq!(s.find(b"anything"), None);
    let mut stream = s.stream();
    assert_eq!(&stream.push(b"any")[..], b"any");
    assert_eq!(&stream.push(b"thing")[..], b"thing");
    assert!(stream.finish().is_empty());
}

#[test]
fn scrub_agrees_with_a_naive_leftmost_longest_search() {
    let secrets = test_secrets();
    let s = scrubber(&secrets);
    let patterns = patterns_of(&secrets);
    let mut rng = Rng(7);
    for _ in 0..200 {
        let input = planted_input(&mut rng, &patterns, 400);
        let (out, redacted) = s.scrub(&input);
        let (expected, expected_names) = naive_scrub(&patterns, &input);
        assert_eq!(out, expected);
        assert_eq!(names(&redacted), expected_names);
    }
}

#[test]
fn stream_output_equals_scrub_under_random_chunkings() {
    let secrets = test_secrets();
    let s = scrubber(&secrets);
    let patterns = patterns_of(&secrets);
    let mut rng = Rng(42);
    for round in 0..300 {
        let input = planted_input(&mut rng, &patterns, 600);
        let (expected, expected_names) = s.scrub(&input);
        let max_chunk = [1, 2, 3, 7, 16, 64, 700][round % 7];
        let mut cuts = Vec::new();
        let mut covered = 0;
        while covered < input.len() {
            // Empty chunks too: a stream must cope with them.
            let len = rng.below(max_chunk + 1);
            cuts.push(len);
            covered += len;
        }
        let (out, redactions) = stream_scrub(&s, &input, &cuts);
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&expected),
            "round {round}, cuts {cuts:?}"
        );
        assert_eq!(redactions, expected_names.len());
        assert_eq!(s.find(&out), None, "round {round}: a variant survived");
    }
}

#[test]
fn stream_names_each_secret_once_in_the_order_first_redacted() {
    let s = scrubber(&test_secrets());
    let mut stream = s.stream();
    let mut out = stream
        .push(b"x sk-live-abcdefgh y sk-live-abcdefgh-extended-9 ")
        .to_vec();
    out.extend_from_slice(&stream.push(b"sk-live-abcdefgh"));
    out.extend_from_slice(&stream.finish());
    assert_eq!(stream.redactions(), 3);
    assert_eq!(names(&stream.redacted_names()), ["short", "long"]);
}

#[test]
fn a_variant_split_at_every_possible_boundary_is_caught() {
    let secrets = test_secrets();
    let s = scrubber(&secrets);
    for (variant, _) in patterns_of(&secrets) {
        let input = [b"<<".as_slice(), &variant, b">>"].concat();
        let (expected, _) = s.scrub(&input);
        for cut in 0..=input.len() {
            let (out, _) = stream_scrub(&s, &input, &[cut]);
            assert_eq!(out, expected, "cut at {cut}");
        }
    }
    // Two cuts anywhere, over two variants back to back.
    let input = [b"[".as_slice(), OPENAI, b"sk-live-abcdefgh-extended-9]"].concat();
    let (expected, _) = s.scrub(&input);
    for first in 0..=input.len() {
        for second in 0..=input.len() - first {
            let (out, _) = stream_scrub(&s, &input, &[first, second]);
            assert_eq!(out, expected, "cuts at {first} and {}", first + second);
        }
    }
}

#[test]
fn emitted_bytes_never_end_in_a_prefix_that_completes_a_secret_later() {
    // A prefix of the secret repeated: every cut leaves a possible start of the secret held.
    let s = scrubber(&[("openai", OPENAI)]);
    let input = [&OPENAI[..10], &OPENAI[..10], OPENAI, &OPENAI[..5]].concat();
    let mut stream = s.stream();
    let mut out = Vec::new();
    for byte in &input {
        let emitted = stream.push(std::slice::from_ref(byte));
        out.extend_from_slice(&emitted);
        assert!(!contains(&out, &OPENAI[..OPENAI.len() - 1]), "{out:?}");
    }
    out.extend_from_slice(&stream.finish());
    let expected = [
        &OPENAI[..10],
        &OPENAI[..10],
        b"[REDACTED:openai]",
        &OPENAI[..5],
    ]
    .concat();
    assert_eq!(out, expected);
}

/// Secrets with every kind of byte, one extending another, so variants overlap and nest.
fn test_secrets() -> Vec<(&'static str, &'static [u8])> {
    vec![
        ("openai", OPENAI),
        ("short", b"sk-live-abcdefgh"),
        ("long", b"sk-live-abcdefgh-extended-9"),
        ("binary", b"\xfb\xff\xfe\x00\x01key/+="),
        ("json", "q\"u\\o/t\u{1}e\u{e9}\u{1f600}!".as_bytes()),
        ("spaced", b"has space & more"),
    ]
}

/// Noise made of the variants' own bytes (so partial matches abound), with whole variants,
/// partial variants and back-to-back variants planted at random.
fn planted_input(rng: &mut Rng, patterns: &[(Vec<u8>, String)], len: usize) -> Vec<u8> {
    let alphabet: Vec<u8> = patterns
        .iter()
        .flat_map(|(p, _)| p.iter().copied())
        .collect();
    let mut input = Vec::with_capacity(len + 200);
    while input.len() < len {
        let (pattern, _) = &patterns[rng.below(patterns.len())];
        match rng.below(6) {
            0 | 1 => input.extend_from_slice(pattern),
            2 => input.extend_from_slice(&pattern[..rng.below(pattern.len())]),
            3 => input.extend_from_slice(&pattern[rng.below(pattern.len())..]),
            _ => {
                for _ in 0..rng.below(30) {
                    input.push(alphabet[rng.below(alphabet.len())]);
                }
            }
        }
    }
    input
}

#[test]
fn matches_through_the_sieve_are_exactly_those_of_a_full_search() {
    let secrets = test_secrets();
    let s = scrubber(&secrets);
    assert!(
        s.sieve.is_some(),
        "the sieve should be in use for a handful of secrets"
    );
    let patterns = patterns_of(&secrets);
    let mut rng = Rng(99);
    for _ in 0..300 {
        let input = planted_input(&mut rng, &patterns, 500);
        let mut sieved = Vec::new();
        s.for_each_match(&input, |found| {
            sieved.push(found);
            ControlFlow::Continue(())
        });
        let full: Vec<Match> = s.matcher.find_iter(&input).collect();
        assert_eq!(sieved, full);
    }
}

#[test]
fn without_the_sieve_the_output_is_the_same() {
    let secrets = test_secrets();
    let sieved = scrubber(&secrets);
    let secrets_list: Vec<ScrubSecret<'_>> = secrets
        .iter()
        .map(|&(name, value)| ScrubSecret { name, value })
        .collect();
    let mut unsieved = match Scrubber::new(&secrets_list) {
        Ok(scrubber) => scrubber,
        Err(e) => panic!("scrubber should build: {e}"),
    };
    unsieved.sieve = None;
    let unsieved = Arc::new(unsieved);
    let patterns = patterns_of(&secrets);
    let mut rng = Rng(5);
    for _ in 0..100 {
        let input = planted_input(&mut rng, &patterns, 500);
        assert_eq!(sieved.scrub(&input), unsieved.scrub(&input));
        assert_eq!(
            stream_scrub(&sieved, &input, &[3, 50, 1, 200]),
            stream_scrub(&unsieved, &input, &[3, 50, 1, 200])
        );
    }
}

#[test]
fn many_secrets_still_build_and_scrub() {
    // Enough variant bytes that the automaton is no longer a full DFA.
    let values: Vec<(String, Vec<u8>)> = (0..400)
        .map(|i| {
            (
                format!("key{i}"),
                format!("sk+/{i:04}-0123456789abcdefghij").into_bytes(),
            )
        })
        .collect();
    let secrets: Vec<(&str, &[u8])> = values
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_slice()))
        .collect();
    let s = scrubber(&secrets);
    let input = b"a sk+/0399-0123456789abcdefghij b sk%2B%2F0007-0123456789abcdefghij c";
    let (out, redacted) = s.scrub(input);
    assert_eq!(out, b"a [REDACTED:key399] b [REDACTED:key7] c");
    assert_eq!(names(&redacted), ["key399", "key7"]);
}

#[test]
fn a_chunk_without_secrets_passes_without_a_copy() {
    let s = scrubber(&[("k", b"sk-test-zero-copy-0123456789")]);
    let mut stream = s.stream();
    let chunk = Bytes::from(b"plain text that holds nothing secret at all".repeat(100));
    let out = stream.push_bytes(chunk.clone());
    assert_eq!(
        out.as_ptr(),
        chunk.as_ptr(),
        "the settled part is a slice of the input"
    );
    let mut whole = out.to_vec();
    whole.extend_from_slice(&stream.finish());
    assert_eq!(whole, chunk.to_vec());
    // With a secret inside, the same call redacts it.
    let mut stream = s.stream();
    let out = stream.push_bytes(Bytes::from_static(b"a sk-test-zero-copy-0123456789 b"));
    let mut whole = out.to_vec();
    whole.extend_from_slice(&stream.finish());
    assert_eq!(whole, b"a [REDACTED:k] b".to_vec());
}

/// Every form and style, none skipped: what `variants_of` looked for before it skipped the
/// forms that write a value unchanged.
fn every_variant(value: &[u8]) -> HashSet<Vec<u8>> {
    let mut all: HashSet<Vec<u8>> = HashSet::new();
    all.insert(value.to_vec());
    for engine in [
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for alignment in 0..3 {
            all.insert(base64_aligned(engine, value, alignment).to_vec());
        }
    }
    for upper in [true, false] {
        for form in PercentForm::ALL {
            all.insert(percent_encoded(value, form, upper).to_vec());
        }
    }
    for bits in 0..(1u8 << 5) {
        let style = JsonStyle {
            escape_slash: bits & 1 != 0,
            short_controls: bits & 2 != 0,
            upper_hex: bits & 4 != 0,
            escape_non_ascii: bits & 8 != 0,
            escape_html: bits & 16 != 0,
        };
        all.insert(json_escaped(value, style).to_vec());
    }
    all
}

#[test]
fn skipping_forms_that_change_nothing_looks_for_exactly_the_same_variants() {
    let values: [&[u8]; 9] = [
        b"eyJhbGciOiJIUzI1NiJ9.eyJhdWQiOiJhcGkifQ.sig-_x",
        b"sk-test-0123456789abcdef~",
        b"with/slash/0123456789",
        b"with space and+plus",
        b"quote\"and\\backslash",
        b"html<tag>&amp;0123",
        "caf\u{e9}-\u{2028}-non-ascii".as_bytes(),
        b"ctrl\n\t\x01\x7f-chars",
        b"\xff\xfe-not-utf8-\x80",
    ];
    for value in values {
        let got: HashSet<Vec<u8>> = variants_of(value).iter().map(|v| v.to_vec()).collect();
        assert_eq!(
            got,
            every_variant(value),
            "{:?}",
            String::from_utf8_lossy(value)
        );
    }
    // The common case builds 9 variants, not 53: the value, six base64 alignments, and its
    // every-non-alphanumeric percent form in both cases (`.`, `-`, `_` encoded).
    assert_eq!(variants_of(values[0]).len(), 9);
    let over_encoded = percent_encoding::percent_encode(
        b"sk-test-0123456789abcdef~",
        percent_encoding::NON_ALPHANUMERIC,
    )
    .to_string();
    assert!(got_variant(
        b"sk-test-0123456789abcdef~",
        over_encoded.as_bytes()
    ));
    assert!(got_variant(
        b"sk-test-0123456789abcdef~",
        b"sk-test-0123456789abcdef%7e"
    ));
}

fn got_variant(value: &[u8], variant: &[u8]) -> bool {
    variants_of(value).iter().any(|v| v.as_slice() == variant)
}

/// Every variant right after, right before or between bytes that begin an escape (backslash
/// runs of either parity, `%`, `&`, `+`, `=`, partial `\u`), whole or streamed in two pieces cut
/// anywhere: redacted. The automaton matches variants as written, whatever precedes them.
#[test]
fn every_variant_next_to_an_escape_introducer_is_redacted_at_every_cut() {
    let secrets: [(&str, &[u8]); 2] = [("openai", OPENAI), ("json", b"ab\"c\\d/e\tf-9x8y7z")];
    let s = scrubber(&secrets);
    let edges: [&[u8]; 9] = [
        b"\\", b"\\\\", b"\\\\\\", b"%", b"%2", b"&", b"+", b"=", b"\\u00",
    ];
    for (variant, name) in patterns_of(&secrets) {
        for edge in edges {
            for (before, after) in [(edge, &b""[..]), (&b""[..], edge), (edge, edge)] {
                let input = [b"{\"r\":\"", before, &variant, after, b"\"}"].concat();
                let (out, redacted) = s.scrub(&input);
                let what = String::from_utf8_lossy(&input);
                assert!(!contains(&out, &variant), "{what}");
                assert!(names(&redacted).contains(&name.as_str()), "{what}");
                for cut in 1..input.len() {
                    let (out, n) = stream_scrub(&s, &input, &[cut]);
                    assert!(!contains(&out, &variant) && n > 0, "{what} cut at {cut}");
                }
            }
        }
    }
}

//! Correlation headers: the traceparent parser (unit cases and a proptest against an
//! independent reading of the W3C form), value validation and scrubbing, attempts, forwarding.

use std::borrow::Cow;

use proptest::prelude::*;

use super::*;

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).expect("name"),
            HeaderValue::from_str(v).expect("value"),
        );
    }
    h
}

fn plain(text: &str) -> String {
    text.to_string()
}

fn correlator(propagate: bool) -> Correlator {
    Correlator::new(Options::new(DEFAULT_SESSION_HEADER, propagate).expect("options"))
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[test]
fn a_valid_traceparent_parses_into_its_fields() {
    assert_eq!(
        TraceParent::parse(TP.as_bytes()),
        Some(TraceParent {
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            parent_id: "00f067aa0ba902b7".into(),
            flags: 1,
        })
    );
    let flags = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff";
    assert_eq!(
        TraceParent::parse(flags.as_bytes()).map(|t| t.flags),
        Some(255)
    );
}

#[test]
fn every_malformed_traceparent_is_refused() {
    let bad = [
        "",
        // another version, and the forbidden one
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        // all-zero ids
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        // upper-case hex
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",
        // wrong lengths, separators, trailing data, non-hex
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",
        "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ];
    for b in bad {
        assert_eq!(TraceParent::parse(b.as_bytes()), None, "{b:?}");
    }
}

/// The W3C form read another way: four `-`-separated fields, each checked on its own.
fn valid_by_the_spec(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    let [version, trace, parent, flags] = parts[..] else {
        return false;
    };
    version == "00"
        && is_hex(trace, 32)
        && is_hex(parent, 16)
        && is_hex(flags, 2)
        && trace != "0".repeat(32)
        && parent != "0".repeat(16)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Any bytes: never a panic.
    #[test]
    fn no_bytes_make_the_parser_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
        let _ = TraceParent::parse(&bytes);
    }

    /// Near-valid strings (a valid form or one with all-zero ids, another version, then maybe
    /// one byte replaced and maybe cut short or made longer): accepted exactly when the spec's
    /// form holds, and then the fields are the text's.
    #[test]
    fn the_parser_accepts_exactly_the_valid_form(
        version in "00|01|ff",
        trace in "[0-9a-f]{32}|0{32}",
        parent in "[0-9a-f]{16}|0{16}",
        flags in "[0-9a-f]{2}",
        edit in proptest::option::of((any::<proptest::sample::Index>(), proptest::sample::select(b"0aAfFgz- .".to_vec()))),
        cut in proptest::option::of(any::<proptest::sample::Index>()),
        longer in any::<bool>(),
    ) {
        let mut bytes = format!("{version}-{trace}-{parent}-{flags}").into_bytes();
        if let Some((at, b)) = edit {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        if let Some(at) = cut {
            bytes.truncate(at.index(bytes.len()));
        }
        if longer {
            bytes.push(b'0');
        }
        let s = String::from_utf8(bytes).expect("ASCII");
        let parsed = TraceParent::parse(s.as_bytes());
        prop_assert_eq!(parsed.is_some(), valid_by_the_spec(&s), "{}", s);
        if let Some(p) = parsed {
            prop_assert_eq!(format!("00-{}-{}-{:02x}", p.trace_id, p.parent_id, p.flags), s);
        }
    }

    /// Every valid traceparent is accepted (zero ids aside), whatever its digits.
    #[test]
    fn every_valid_traceparent_is_accepted(
        trace in "[0-9a-f]{32}", parent in "[0-9a-f]{16}", flags in any::<u8>(),
    ) {
        let s = format!("00-{trace}-{parent}-{flags:02x}");
        let zero = trace.bytes().all(|b| b == b'0') || parent.bytes().all(|b| b == b'0');
        prop_assert_eq!(TraceParent::parse(s.as_bytes()).is_some(), !zero);
    }

    /// Any header value as the session: recorded only when it is 1..=128 bytes of visible
    /// ASCII, and then exactly as sent; never a panic.
    #[test]
    fn session_values_are_taken_only_when_valid(value in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut h = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_bytes(&value) {
            h.insert(HeaderName::from_static(DEFAULT_SESSION_HEADER), v);
        }
        let c = correlator(false).read(&h, plain);
        let valid = !value.is_empty()
            && value.len() <= MAX_VALUE_LEN
            && value.iter().all(|b| (0x21..=0x7e).contains(b));
        prop_assert_eq!(c.session.is_some(), valid);
        if let Some(s) = c.session {
            prop_assert_eq!(s.as_bytes(), &value[..]);
        }
    }
}

#[test]
fn step_comes_from_the_step_header_else_from_the_traceparent() {
    let c = correlator(false);
    let read = |pairs: &[(&str, &str)]| c.read(&headers(pairs), plain);
    let both = read(&[("x-latchkey-step", "plan-3"), ("traceparent", TP)]);
    assert_eq!(both.step.as_deref(), Some("plan-3"));
    let tp = read(&[("traceparent", TP)]);
    assert_eq!(
        tp.step.as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7")
    );
    let trace = tp
        .trace
        .expect("a traceparent arrived: latchkey makes a span");
    assert_eq!(trace.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(trace.parent_span_id.as_deref(), Some("00f067aa0ba902b7"));
    assert!(is_hex(&trace.span_id, 16) && trace.span_id != "0".repeat(16));
    assert_eq!(trace.flags, 1);
    // Nothing sent, nothing made (without propagation).
    assert_eq!(read(&[]), Correlation::default());
    // Sent twice, too long, or with a space: ignored.
    assert_eq!(
        read(&[("x-latchkey-session", "a"), ("x-latchkey-session", "b")]).session,
        None
    );
    assert_eq!(
        read(&[("x-latchkey-session", &"s".repeat(129))]).session,
        None
    );
    assert_eq!(
        read(&[("x-latchkey-session", &"s".repeat(128))])
            .session
            .map(|s| s.len()),
        Some(128)
    );
    assert_eq!(read(&[("x-latchkey-session", "run 7")]).session, None);
    assert_eq!(
        read(&[("traceparent", TP), ("traceparent", TP)]).trace,
        None
    );
}

#[test]
fn propagation_makes_a_fresh_trace_when_none_arrived_and_a_new_span_each_time() {
    let c = correlator(true);
    let a = c
        .read(&HeaderMap::new(), plain)
        .trace
        .expect("a fresh trace");
    let b = c
        .read(&HeaderMap::new(), plain)
        .trace
        .expect("a fresh trace");
    assert!(is_hex(&a.trace_id, 32) && is_hex(&a.span_id, 16));
    assert_eq!(a.parent_span_id, None);
    assert_ne!(a.trace_id, b.trace_id);
    assert_ne!(a.span_id, b.span_id);
    let continued = c.read(&headers(&[("traceparent", TP)]), plain);
    let again = c.read(&headers(&[("traceparent", TP)]), plain);
    let (x, y) = (continued.trace.expect("trace"), again.trace.expect("trace"));
    assert_eq!(x.trace_id, y.trace_id);
    assert_ne!(x.span_id, y.span_id, "a span per request");
    // No step without a step header or a traceparent, even with a trace of latchkey's own.
    assert_eq!(c.read(&HeaderMap::new(), plain).step, None);
}

#[test]
fn values_are_scrubbed_and_a_traceparent_holding_a_secret_is_ignored() {
    let scrub = |t: &str| {
        let s: Cow<'_, str> = if t.contains("sk-live-1234") {
            Cow::Owned(t.replace("sk-live-1234", "[REDACTED:openai]"))
        } else {
            Cow::Borrowed(t)
        };
        s.into_owned()
    };
    let secret_tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let c = correlator(false);
    let got = c.read(
        &headers(&[
            ("x-latchkey-session", "run-sk-live-1234"),
            ("x-latchkey-step", "sk-live-1234"),
        ]),
        scrub,
    );
    assert_eq!(got.session.as_deref(), Some("run-[REDACTED:openai]"));
    assert_eq!(got.step.as_deref(), Some("[REDACTED:openai]"));
    // A secret that happens to be hex, inside the trace id: no trace context at all.
    let hex_scrub = |t: &str| t.replace("a3ce929d", "[REDACTED:hex]");
    let got = c.read(&headers(&[("traceparent", secret_tp)]), hex_scrub);
    assert_eq!(got.trace, None);
    assert_eq!(got.step, None);
}

#[test]
fn attempts_count_per_identity_session_and_step() {
    let c = correlator(false);
    let attempt = |identity: &str, pairs: &[(&str, &str)]| {
        c.request(identity, &headers(pairs), plain).attempt
    };
    let step = [("traceparent", TP)];
    assert_eq!(attempt("ci", &step), Some(1));
    assert_eq!(attempt("ci", &step), Some(2));
    assert_eq!(attempt("ci", &step), Some(3));
    // Another identity, session or step starts again.
    assert_eq!(attempt("lab", &step), Some(1));
    assert_eq!(
        attempt("ci", &[("traceparent", TP), ("x-latchkey-session", "s2")]),
        Some(1)
    );
    assert_eq!(attempt("ci", &[("x-latchkey-step", "other")]), Some(1));
    // No step, no attempt.
    assert_eq!(attempt("ci", &[("x-latchkey-session", "s2")]), None);
}

#[test]
fn forwarding_strips_correlation_unless_kept_and_propagates_our_span() {
    let sent = [
        ("x-latchkey-session", "run-7"),
        ("x-latchkey-step", "plan"),
        ("traceparent", TP),
        ("tracestate", "vendor=abc"),
        ("accept", "*/*"),
    ];
    let names = |h: &HeaderMap| {
        let mut n: Vec<String> = h.keys().map(|k| k.to_string()).collect();
        n.sort();
        n
    };
    // Off: stripped, but what the rule keeps goes on unchanged.
    let off = correlator(false);
    let corr = off.read(&headers(&sent), plain);
    let mut h = headers(&sent);
    off.forward(&mut h, &[], &corr);
    assert_eq!(names(&h), ["accept"]);
    let keep = [
        HeaderName::from_static("x-latchkey-session"),
        TRACEPARENT,
        TRACESTATE,
    ];
    let mut h = headers(&sent);
    off.forward(&mut h, &keep, &corr);
    assert_eq!(
        names(&h),
        ["accept", "traceparent", "tracestate", "x-latchkey-session"]
    );
    assert_eq!(h[TRACEPARENT], TP);

    // On: traceparent is the sandbox's trace under latchkey's span; tracestate goes along.
    let on = correlator(true);
    let corr = on.read(&headers(&sent), plain);
    let span = corr.trace.as_ref().expect("trace").span_id.clone();
    let mut h = headers(&sent);
    on.forward(&mut h, &[], &corr);
    assert_eq!(names(&h), ["accept", "traceparent", "tracestate"]);
    assert_eq!(
        h[TRACEPARENT],
        format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{span}-01").as_str()
    );
    assert_eq!(h[TRACESTATE], "vendor=abc");
    // A trace latchkey started: its own traceparent, no stray tracestate.
    let lone = [("tracestate", "vendor=abc")];
    let corr = on.read(&headers(&lone), plain);
    let mut h = headers(&lone);
    on.forward(&mut h, &[], &corr);
    assert_eq!(names(&h), ["traceparent"]);
    let t = corr.trace.expect("trace");
    assert_eq!(
        h[TRACEPARENT],
        format!("00-{}-{}-01", t.trace_id, t.span_id).as_str()
    );
}

#[test]
fn a_custom_session_header_is_used_and_reserved_names_are_refused() {
    let o = Options::new("X-Run-Id", false).expect("custom header");
    assert_eq!(o.session_header().as_str(), "x-run-id");
    let c = Correlator::new(o);
    let got = c.read(
        &headers(&[("x-run-id", "r1"), ("x-latchkey-session", "no")]),
        plain,
    );
    assert_eq!(got.session.as_deref(), Some("r1"));
    for name in [
        "authorization",
        "Cookie",
        "proxy-authorization",
        "connection",
        "host",
        "content-length",
        "traceparent",
        "x-latchkey-step",
    ] {
        assert!(
            matches!(Options::new(name, false), Err(OptionsError::Reserved(_))),
            "{name}"
        );
    }
    assert!(matches!(
        Options::new("bad header", false),
        Err(OptionsError::Invalid(_))
    ));
}

//! Tests of the limit terms: aligned windows, rates, budgets and prices.

use super::*;

#[test]
fn aligned_windows() {
    // 2026-12-02T01:02:03Z
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_173_323);
    let (s, e) = Period::Day.window(t);
    assert_eq!(s % 86_400, 0);
    assert_eq!(e - s, 86_400);
    assert!(s <= 1_796_173_323 && 1_796_173_323 < e);
    let (ms, me) = Period::Month.window(t);
    // December 2026 has 31 days and starts at 2026-12-01T00:00:00Z.
    assert_eq!(ms, 1_796_083_200);
    assert_eq!(me - ms, 31 * 86_400);
    let (hs, he) = Period::Hour.window(t);
    assert_eq!((hs % 3600, he - hs), (0, 3600));
}

#[test]
fn february_is_short() {
    // 2027-02-10T00:00:00Z
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_802_217_600);
    let (s, e) = Period::Month.window(t);
    assert_eq!(e - s, 28 * 86_400);
}

#[test]
fn usd_formatting() {
    assert_eq!(format_usd(20_000_000), "20");
    assert_eq!(format_usd(1_500), "0.0015");
    assert_eq!(format_usd(2_500_000), "2.5");
    assert_eq!(format_usd(0), "0");
}

#[test]
fn every_accepted_form_parses() {
    let r = parse_rate("100/min").unwrap();
    assert_eq!((r.count, r.period), (100, Period::Minute));
    for (text, period) in [
        ("5/s", Period::Second),
        ("5/sec", Period::Second),
        ("5/second", Period::Second),
        ("5 / minute", Period::Minute),
        ("5/h", Period::Hour),
        ("5/hour", Period::Hour),
        ("5/d", Period::Day),
        ("5/day", Period::Day),
    ] {
        assert_eq!(
            parse_rate(text).unwrap(),
            Rate { count: 5, period },
            "{text}"
        );
    }
    assert_eq!(parse_rate("1000000/day").unwrap().count, 1_000_000);
    let q = |amount, period| Quota { amount, period };
    assert_eq!(parse_bytes("50MB/day"), Ok(q(50_000_000, Period::Day)));
    assert_eq!(parse_bytes("50 MB / day"), Ok(q(50_000_000, Period::Day)));
    assert_eq!(
        parse_bytes("1.5GB/month"),
        Ok(q(1_500_000_000, Period::Month))
    );
    assert_eq!(parse_bytes("2KiB/min"), Ok(q(2048, Period::Minute)));
    assert_eq!(parse_bytes("1TiB/month"), Ok(q(1 << 40, Period::Month)));
    assert_eq!(parse_bytes("10B/hour"), Ok(q(10, Period::Hour)));
    assert_eq!(parse_bytes("3TB/d"), Ok(q(3_000_000_000_000, Period::Day)));
    assert_eq!(parse_tokens("2M/day"), Ok(q(2_000_000, Period::Day)));
    assert_eq!(parse_tokens("500K/hour"), Ok(q(500_000, Period::Hour)));
    assert_eq!(parse_tokens("500k/h"), Ok(q(500_000, Period::Hour)));
    assert_eq!(parse_tokens("1000000/day"), Ok(q(1_000_000, Period::Day)));
    assert_eq!(parse_tokens("1.5M/month"), Ok(q(1_500_000, Period::Month)));
    assert_eq!(
        parse_tokens("1G/month"),
        Ok(q(1_000_000_000, Period::Month))
    );
    assert_eq!(parse_spend("20 USD/day"), Ok(q(20_000_000, Period::Day)));
    assert_eq!(parse_spend("0.50 USD/hour"), Ok(q(500_000, Period::Hour)));
    assert_eq!(parse_spend("0.000001USD/min"), Ok(q(1, Period::Minute)));
    assert_eq!(
        parse_spend("1000 USD/month"),
        Ok(q(1_000_000_000, Period::Month))
    );
    assert_eq!(parse_per("global"), Ok(Per::Global));
    assert_eq!(parse_on_store_error("allow"), Ok(OnStoreError::Allow));
}

#[test]
fn every_rejected_form_says_why() {
    type Parser = fn(&str) -> Result<(), String>;
    let cases: &[(Parser, &str, &str)] = &[
        (
            |t| parse_rate(t).map(drop),
            "100",
            "\"100\" is not a rate like \"100/min\"",
        ),
        (
            |t| parse_rate(t).map(drop),
            "0/min",
            "a budget of 0 refuses everything",
        ),
        (
            |t| parse_rate(t).map(drop),
            "1000001/min",
            "more than 1000000",
        ),
        (
            |t| parse_rate(t).map(drop),
            "99999999999999999999999/min",
            "more than 1000000",
        ),
        (
            |t| parse_rate(t).map(drop),
            "-1/min",
            "the count is a whole number",
        ),
        (
            |t| parse_rate(t).map(drop),
            "1.5/min",
            "the count is a whole number",
        ),
        (|t| parse_rate(t).map(drop), "10/month", "takes no month"),
        (
            |t| parse_rate(t).map(drop),
            "10/week",
            "unknown period \"week\"",
        ),
        (
            |t| parse_bytes(t).map(drop),
            "50/day",
            "has no unit: write 50B",
        ),
        (
            |t| parse_bytes(t).map(drop),
            "50mb/day",
            "did you mean MB or MiB?",
        ),
        (
            |t| parse_bytes(t).map(drop),
            "50MB",
            "is not an amount like \"50MB/day\"",
        ),
        (
            |t| parse_bytes(t).map(drop),
            "50MB/s",
            "shortest window is a minute",
        ),
        (
            |t| parse_bytes(t).map(drop),
            "50MB/week",
            "unknown period \"week\"",
        ),
        (
            |t| parse_bytes(t).map(drop),
            "0MB/day",
            "a budget of 0 refuses everything",
        ),
        (
            |t| parse_bytes(t).map(drop),
            "0.5B/day",
            "not a whole number of bytes",
        ),
        (
            |t| parse_bytes(t).map(drop),
            "1.2.3MB/day",
            "not a decimal number of bytes",
        ),
        (
            |t| parse_bytes(t).map(drop),
            "1.MB/day",
            "not a decimal number of bytes",
        ),
        (|t| parse_bytes(t).map(drop), "MB/day", "is not an amount"),
        (|t| parse_bytes(t).map(drop), "-5MB/day", "is not an amount"),
        (|t| parse_bytes(t).map(drop), "99999999TB/day", "too large"),
        (
            |t| parse_tokens(t).map(drop),
            "2T/day",
            "unknown unit \"T\"",
        ),
        (|t| parse_tokens(t).map(drop), "0/day", "a budget of 0"),
        (
            |t| parse_tokens(t).map(drop),
            "1.0005K/day",
            "not a whole number of tokens",
        ),
        (
            |t| parse_spend(t).map(drop),
            "20/day",
            "has no currency: write \"20 USD/day\"",
        ),
        (|t| parse_spend(t).map(drop), "20 EUR/day", "USD only"),
        (
            |t| parse_spend(t).map(drop),
            "0.0000001 USD/day",
            "at most 6 decimals",
        ),
        (|t| parse_spend(t).map(drop), "0 USD/day", "a budget of 0"),
        (
            |t| parse_spend(t).map(drop),
            "0.000 USD/day",
            "a budget of 0",
        ),
        (
            |t| parse_per(t).map(drop),
            "user",
            "use \"identity\", \"session\", \"rule\"",
        ),
        (
            |t| parse_on_store_error(t).map(drop),
            "open",
            "use \"deny\"",
        ),
    ];
    for (parse, text, want) in cases {
        match parse(text) {
            Ok(()) => panic!("{text:?} parsed"),
            Err(e) => assert!(e.contains(want), "{text:?}: {e:?} does not say {want:?}"),
        }
    }
}

fn period() -> impl Strategy<Value = Period> {
    prop_oneof![
        Just(Period::Minute),
        Just(Period::Hour),
        Just(Period::Day),
        Just(Period::Month)
    ]
}

use proptest::prelude::*;

proptest! {
    #[test]
    fn no_text_makes_a_parser_panic(text in "\\PC{0,40}") {
        let _ = parse_rate(&text);
        let _ = parse_bytes(&text);
        let _ = parse_tokens(&text);
        let _ = parse_spend(&text);
    }

    #[test]
    fn near_miss_text_never_panics(text in "[0-9.]{0,25}[ KMGTiBUSD]{0,4}/?(min|hour|day|month|s|x)?") {
        let parsed = [parse_bytes(&text), parse_tokens(&text), parse_spend(&text)];
        for q in parsed.into_iter().flatten() {
            prop_assert!(q.amount > 0);
        }
    }

    #[test]
    fn a_rate_round_trips(count in 1u32..=MAX_RATE_COUNT, p in prop_oneof![Just(Period::Second), Just(Period::Minute), Just(Period::Hour), Just(Period::Day)]) {
        let text = format!("{count}/{}", p.as_str());
        prop_assert_eq!(parse_rate(&text), Ok(Rate { count, period: p }));
    }

    #[test]
    fn bytes_round_trip_in_every_unit(n in 1u64..1_000_000, unit in 0usize..9, p in period()) {
        let (name, scale) = [
            ("B", 1u64), ("KB", 1_000), ("MB", 1_000_000), ("GB", 1_000_000_000),
            ("TB", 1_000_000_000_000), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30),
            ("TiB", 1 << 40),
        ][unit];
        let text = format!("{n}{name}/{}", p.as_str());
        prop_assert_eq!(parse_bytes(&text), Ok(Quota { amount: n * scale, period: p }));
    }

    #[test]
    fn tokens_round_trip(n in 1u64..u64::MAX / 1_000_000_000, unit in 0usize..4, p in period()) {
        let (name, scale) = [("", 1u64), ("K", 1_000), ("M", 1_000_000), ("G", 1_000_000_000)][unit];
        let text = format!("{n}{name}/{}", p.as_str());
        prop_assert_eq!(parse_tokens(&text), Ok(Quota { amount: n * scale, period: p }));
    }

    #[test]
    fn spend_round_trips_through_format_usd(micros in 1u64..u64::MAX, p in period()) {
        let text = format!("{} USD/{}", format_usd(micros), p.as_str());
        prop_assert_eq!(parse_spend(&text), Ok(Quota { amount: micros, period: p }));
    }
}

//! `[limits.NAME]`, `limits = [...]` and `[prices."MODEL"]`: every accepted form compiles to
//! the terms it says, every problem is reported at its `file:line:col` with its field.

use std::path::Path;
use std::time::Duration;

use super::compile::{compile_one, compile_sources, compile_sources_with};
use super::limits::{Concurrency, OnStoreError, Per, Period, Quota, Rate};
use super::{Policy, SecretLoading};

fn errors(text: &str) -> Vec<String> {
    match compile_one(text) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

fn policy(text: &str) -> Policy {
    compile_sources_with(&[(Path::new("test.toml"), text)], SecretLoading::Skip)
        .unwrap_or_else(|e| panic!("{e:?}"))
}

const RULE: &str = "[[rules]]\nname = \"r\"\nhosts = [\"api.test\"]\n";

#[test]
fn a_limit_with_every_key_compiles_to_its_terms() {
    let p = policy(&format!(
        "[limits.openai-budget]\nper = \"rule\"\nrequests = \"100/min\"\nconcurrency = 4\nqueue = \"5s\"\nbytes_up = \"50MB/day\"\nllm_tokens = \"2M/day\"\nspend = \"20 USD/day\"\nreserve_tokens = 1024\ninclude_usage = true\non_store_error = \"allow\"\n{RULE}limits = [\"openai-budget\"]\n"
    ));
    let l = p.limit("openai-budget").expect("compiled");
    assert_eq!(l.per, Per::Rule);
    assert_eq!(
        l.requests,
        Some(Rate {
            count: 100,
            period: Period::Minute
        })
    );
    assert_eq!(
        l.concurrency,
        Some(Concurrency {
            max: 4,
            queue: Duration::from_secs(5)
        })
    );
    let day = |amount| {
        Some(Quota {
            amount,
            period: Period::Day,
        })
    };
    assert_eq!(l.bytes_up, day(50_000_000));
    assert_eq!(l.llm_tokens, day(2_000_000));
    assert_eq!(l.spend, day(20_000_000));
    assert_eq!(l.reserve_tokens, 1024);
    assert!(l.include_usage);
    assert_eq!(l.on_store_error, OnStoreError::Allow);
    assert_eq!(l.origin.line, 1);
    assert_eq!(
        l.summary(),
        "openai-budget (per rule): requests 100/min, concurrency 4 (queue 5s), bytes_up 50000000 bytes/day per host, llm_tokens 2000000/day, spend 20 USD/day"
    );
    assert_eq!(p.rules()[0].limits, ["openai-budget"]);
}

#[test]
fn a_limit_takes_safe_defaults_and_limits_are_sorted_by_name() {
    let p = policy(&format!(
        "[limits.zeta]\nconcurrency = 2\n[limits.alpha]\nllm_tokens = \"1000/hour\"\n{RULE}limits = [\"zeta\", \"alpha\"]\n"
    ));
    let names: Vec<&str> = p.limits().iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["alpha", "zeta"]);
    let a = p.limit("alpha").unwrap();
    assert_eq!(a.per, Per::Identity);
    assert_eq!(a.on_store_error, OnStoreError::Deny);
    assert_eq!(a.reserve_tokens, super::limits::DEFAULT_RESERVE_TOKENS);
    assert!(!a.include_usage);
    let z = p.limit("zeta").unwrap();
    assert_eq!(
        z.concurrency.unwrap().queue,
        Duration::ZERO,
        "refuse at once"
    );
    assert!(p.limit("beta").is_none());
}

#[test]
fn every_bad_value_is_reported_at_its_value_with_its_field() {
    let e = errors(
        "[limits.a]\nper = \"user\"\nrequests = \"0/min\"\nconcurrency = 0\nbytes_up = \"50mb/day\"\nllm_tokens = \"2T/day\"\nspend = \"20 EUR/day\"\non_store_error = \"open\"\n[limits.b]\nconcurrency = 10001\nqueue = \"61s\"\nspend = \"0.0000001 USD/day\"\nreserve_tokens = 0\n[limits.c]\nconcurrency = 1\nqueue = \"soon\"\nllm_tokens = \"1M/day\"\nreserve_tokens = 10000001\n",
    );
    assert_eq!(
        e,
        [
            "test.toml:2:7: limits.a.per: unknown per \"user\": use \"identity\", \"session\", \"rule\", \"credential\" or \"global\"",
            "test.toml:3:12: limits.a.requests: \"0/min\": a budget of 0 refuses everything: remove the rule instead, or set a positive amount",
            "test.toml:4:15: limits.a.concurrency: 0 admits nothing: remove the rule instead, or allow at least 1",
            "test.toml:5:12: limits.a.bytes_up: \"50mb/day\": unknown unit \"mb\"; did you mean MB or MiB?",
            "test.toml:6:14: limits.a.llm_tokens: \"2T/day\": unknown unit \"T\": tokens take no unit, or K, M or G (thousand, million, billion)",
            "test.toml:7:9: limits.a.spend: \"20 EUR/day\": currency \"EUR\": spend is in USD only (the price table's currency)",
            "test.toml:8:18: limits.a.on_store_error: unknown value \"open\": use \"deny\" (refuse with 503 limits_unavailable) or \"allow\"",
            "test.toml:10:15: limits.b.concurrency: 10001 is not 1 to 10000",
            "test.toml:11:9: limits.b.queue: \"61s\" is longer than 1m: a queued request holds its client's connection open",
            "test.toml:12:9: limits.b.spend: \"0.0000001 USD/day\": at most 6 decimals (a micro-dollar)",
            "test.toml:13:18: limits.b.reserve_tokens: 0 is not 1 to 10000000 tokens",
            "test.toml:16:9: limits.c.queue: \"soon\" is not a duration like \"5s\" or \"500ms\" (\"0s\" refuses at once)",
            "test.toml:18:18: limits.c.reserve_tokens: 10000001 is not 1 to 10000000 tokens",
        ]
    );
}

#[test]
fn keys_that_need_another_key_say_which() {
    let e = errors(
        "[limits.a]\nrequests = \"1/s\"\nqueue = \"1s\"\nreserve_tokens = 10\ninclude_usage = true\n",
    );
    assert_eq!(
        e,
        [
            "test.toml:3:9: limits.a.queue: queue is how long a request waits for a concurrency slot; set concurrency, or remove queue",
            "test.toml:4:18: limits.a.reserve_tokens: reserve_tokens applies to model-provider usage; set llm_tokens or spend, or remove reserve_tokens",
            "test.toml:5:17: limits.a.include_usage: include_usage applies to model-provider usage; set llm_tokens or spend, or remove include_usage",
        ]
    );
}

#[test]
fn a_limit_without_a_measure_an_unknown_key_and_a_wrong_type_are_errors() {
    let e = errors("[limits.a]\nper = \"global\"\n[limits.b]\nrequets = \"1/s\"\n[limits.c]\nconcurrency = \"4\"\nrequests = 5\n");
    assert_eq!(
        e,
        [
            "test.toml:1:1: limits.a: a limit needs at least one of requests, concurrency, bytes_up, llm_tokens or spend",
            "test.toml:3:1: limits.b: a limit needs at least one of requests, concurrency, bytes_up, llm_tokens or spend",
            "test.toml:4:1: limits.b: unknown key `requets`; did you mean `requests`?",
            "test.toml:6:15: limits.c.concurrency: expected an integer, found a string",
            "test.toml:7:12: limits.c.requests: expected a string, found an integer",
        ]
    );
}

#[test]
fn limit_names_follow_the_name_rules_and_a_duplicate_names_the_first_file() {
    let e = errors("[limits.\"bad name\"]\nrequests = \"1/s\"\n");
    assert_eq!(
        e,
        ["test.toml:1:9: limits.bad name: limit names use letters, digits, '-' and single '_' (at most 64)"]
    );
    let a = "[limits.shared]\nrequests = \"1/s\"\n";
    let b = "\n[limits.shared]\nrequests = \"2/s\"\n";
    let e = compile_sources(&[(Path::new("a.toml"), a), (Path::new("b.toml"), b)])
        .expect_err("duplicate");
    let e: Vec<String> = e.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        e,
        ["b.toml:2:9: limits.shared: duplicate limit \"shared\", first declared at a.toml:1"]
    );
}

#[test]
fn a_limits_list_names_declared_limits_each_once() {
    let e = errors(&format!(
        "[limits.a]\nrequests = \"1/s\"\n[limits.b]\nrequests = \"1/s\"\n{RULE}limits = [\"a\", \"x\", \"a\"]\n[[rules]]\nname = \"s\"\nhosts = [\"s.test\"]\nlimits = []\n[identities.ci]\nsources = [\"10.0.0.0/8\"]\nrules = [\"*\"]\nlimits = [\"y\"]\n"
    ));
    assert_eq!(
        e,
        [
            "test.toml:8:16: rules[0].limits[1]: unknown limit \"x\"; declared: a, b",
            "test.toml:8:21: rules[0].limits[2]: limit \"a\" is listed twice",
            "test.toml:12:10: rules[1].limits: an empty list charges nothing; remove the key",
            "test.toml:16:11: identities.ci.limits[0]: unknown limit \"y\"; declared: a, b",
        ]
    );
    let e = errors(&format!("{RULE}limits = [\"x\"]\n"));
    assert_eq!(
        e,
        ["test.toml:4:11: rules[0].limits[0]: unknown limit \"x\"; the policy declares none"]
    );
}

#[test]
fn a_broken_limit_is_reported_once_not_again_where_it_is_named() {
    let e = errors(&format!(
        "[limits.a]\nrequests = \"fast\"\n{RULE}limits = [\"a\"]\n"
    ));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("test.toml:2:12: limits.a.requests:"),
        "{e:?}"
    );
}

#[test]
fn a_tunnel_rule_takes_request_concurrency_and_bytes_limits_but_not_usage_budgets() {
    let limits = "[limits.count]\nrequests = \"10/min\"\nconcurrency = 2\n[limits.exfil]\nrequests = \"10/min\"\nbytes_up = \"1MB/day\"\n[limits.llm]\nspend = \"1 USD/day\"\n[limits.tok]\nllm_tokens = \"1M/day\"\n";
    let tunnel = "[[rules]]\nname = \"t\"\nhosts = [\"t.test\"]\ntunnel = true\n";
    let p = policy(&format!(
        "{limits}{tunnel}limits = [\"count\", \"exfil\"]\n"
    ));
    assert_eq!(p.rules()[0].limits, ["count", "exfil"]);
    let e = errors(&format!("{limits}{tunnel}limits = [\"llm\", \"tok\"]\n"));
    assert_eq!(
        e,
        [
            "test.toml:15:11: rules[0].limits[0]: limit \"llm\" meters spend, which latchkey cannot see in a tunnel (it relays encrypted bytes); a tunnel rule takes limits with only requests, concurrency (they count CONNECTs) or bytes_up (the bytes relayed upstream)",
            "test.toml:15:18: rules[0].limits[1]: limit \"tok\" meters llm_tokens, which latchkey cannot see in a tunnel (it relays encrypted bytes); a tunnel rule takes limits with only requests, concurrency (they count CONNECTs) or bytes_up (the bytes relayed upstream)",
        ]
    );
}

#[test]
fn a_report_mode_rule_may_carry_limits() {
    let p = policy(&format!(
        "[limits.a]\nbytes_up = \"1GB/month\"\n{RULE}mode = \"report\"\nlimits = [\"a\"]\n"
    ));
    assert!(p.rules()[0].report);
    assert_eq!(p.rules()[0].limits, ["a"]);
}

const CREDENTIAL: &str = "[credentials.gh]\nkind = \"github_app\"\napp_id = \"1\"\ninstallation_id = \"2\"\nprivate_key = \"file:/nonexistent/gh.pem\"\n";

#[test]
fn limits_for_charges_the_rule_then_the_identity_then_the_credential_each_once() {
    let p = policy(&format!(
        "[limits.a]\nrequests = \"1/s\"\n[limits.b]\nrequests = \"1/s\"\n[limits.c]\nrequests = \"1/s\"\n[limits.d]\nrequests = \"1/s\"\n{CREDENTIAL}limits = [\"d\", \"c\"]\n[[rules]]\nname = \"gh\"\nhosts = [\"api.gh.test\"]\ncredential = \"gh\"\nlimits = [\"b\", \"a\"]\n[[rules]]\nname = \"plain\"\nhosts = [\"plain.test\"]\n[identities.ci]\nsources = [\"10.0.0.0/8\"]\nrules = [\"*\"]\nlimits = [\"c\", \"b\"]\n"
    ));
    assert_eq!(p.credential_limits("gh"), ["d", "c"]);
    assert!(p.credential_limits("nope").is_empty());
    let ci = p.identity("ci");
    let names = |rule: usize, id| -> Vec<String> {
        p.limits_for(&p.rules()[rule], id)
            .iter()
            .map(|l| l.name.clone())
            .collect()
    };
    assert_eq!(names(0, ci), ["b", "a", "c", "d"]);
    assert_eq!(names(0, None), ["b", "a", "d", "c"]);
    assert_eq!(names(1, ci), ["c", "b"]);
    assert!(names(1, None).is_empty());
}

#[test]
fn a_credential_of_any_kind_takes_limits_and_they_are_checked() {
    let text = format!("{CREDENTIAL}limits = [\"x\"]\n[[rules]]\nname = \"gh\"\nhosts = [\"api.gh.test\"]\ncredential = \"gh\"\n");
    let e = compile_sources_with(&[(Path::new("test.toml"), &text)], SecretLoading::Skip)
        .expect_err("unknown limit");
    let e: Vec<String> = e.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        e,
        ["test.toml:6:11: credentials.gh.limits[0]: unknown limit \"x\"; the policy declares none"]
    );
}

#[test]
fn prices_override_and_extend_the_shipped_table_by_lowercased_model() {
    let p = policy(&format!(
        "[prices.\"GPT-4o\"]\ninput = 2\noutput = 8.5\ncached_input = 0.5\n[prices.\"my-model\"]\ninput = 0.1\noutput = 0.2\n{RULE}"
    ));
    let prices = p.prices();
    let (entry, price) = prices.lookup("gpt-4o-2024-08-06").expect("priced");
    assert_eq!(entry, "gpt-4o");
    assert_eq!(
        (price.input, price.output, price.cached_input),
        (2.0, 8.5, Some(0.5))
    );
    let (_, mine) = prices.lookup("My-Model").expect("priced");
    assert_eq!(
        (mine.input, mine.output, mine.cached_input),
        (0.1, 0.2, None)
    );
    assert_eq!(prices.overridden(), ["gpt-4o", "my-model"]);
    let shipped = super::limits::shipped_prices();
    assert_eq!(
        prices.len(),
        shipped.len() + usize::from(shipped.lookup("my-model").is_none())
    );
    assert!(policy(RULE).prices().overridden().is_empty());
}

#[test]
fn every_bad_price_is_reported_at_its_value() {
    let e = errors(
        "[prices.\"a\"]\ninput = -1\noutput = \"2\"\n[prices.\"b\"]\ninput = 1\n[prices.\"B\"]\ninput = 1\noutput = 1\n[prices.\"models/gemini-x\"]\ninput = 1\noutput = 1\n[prices.\"c\"]\ninput = inf\noutput = 1\ncost = 3\n",
    );
    assert_eq!(
        e,
        [
            "test.toml:2:9: prices.a.input: -1 is not a price: USD per million tokens, 0 or more",
            "test.toml:3:10: prices.a.output: expected a number, found a string",
            "test.toml:4:1: prices.b: missing key `output`",
            "test.toml:6:9: prices.B: model \"b\" is priced twice (names ignore case), first at test.toml:4",
            "test.toml:9:9: prices.models/gemini-x: write the model without Gemini's \"models/\" prefix: [prices.\"gemini-x\"]",
            "test.toml:13:9: prices.c.input: inf is not a price: USD per million tokens, 0 or more",
            "test.toml:15:1: prices.c: unknown key `cost`; known keys: input, output, cached_input",
        ]
    );
}

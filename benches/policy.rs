//! Policy at scale: one decision against 1,000 rules (a quarter of them wildcards), and compiling
//! 1,000 rules from text (what a reload costs before the swap).
//!
//! Targets (issue "policy operations"): decision ≤ 1 µs median; reload of 1,000 rules < 100 ms.
//!
//! `policy/decide_1000_rules_predicates` (issue 36): the same 1,000 rules with a `query`
//! predicate on every third, a `headers` one on every fifth, and 100 `[[deny]]` tables (a
//! quarter of them with a `query` predicate) over the same hosts; the same requests, carrying a
//! query and headers: what denials and head predicates add to a decision.

// A benchmark may unwrap what it just built (the crate denies unwrap/expect outside tests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use http::Method;
use latchkey::policy::{compile_sources, load_dir, Scheme, Target};

const RULES: usize = 1_000;

/// 1,000 rules: every fourth names a wildcard (`*.svcN.example.com`), the rest exact hosts;
/// methods, paths and ports vary, some inject headers, a few bind `exec:` secrets (not run at
/// load, like production helpers).
fn policy_text() -> String {
    let mut out = String::new();
    for s in 0..10 {
        out.push_str(&format!(
            "[secrets.key{s}]\nsource = \"exec:printf bench-secret-value-{s:04}\"\n\n"
        ));
    }
    for i in 0..RULES {
        let host = if i % 4 == 0 {
            format!("*.svc{i}.example.com")
        } else {
            format!("api{i}.example.com")
        };
        out.push_str(&format!(
            "[[rules]]\nname = \"rule-{i}\"\nhosts = [\"{host}\", \"mirror{i}.example.net\"]\n"
        ));
        match i % 3 {
            0 => out.push_str("methods = [\"GET\", \"HEAD\"]\npaths = [\"/v1/**\", \"/health\"]\n"),
            1 => out.push_str("methods = [\"GET\", \"POST\"]\nports = [443, 8443]\n"),
            _ => {
                out.push_str("methods = [\"GET\"]\npaths = [\"/repos/*/issues\", \"/static/**\"]\n")
            }
        }
        if i % 100 == 0 {
            // Secrets on wildcard hosts need the explicit flag; these rules are exact hosts.
            let host = format!("keyed{i}.example.com");
            out.push_str(&format!(
                "\n[[rules]]\nname = \"keyed-{i}\"\nhosts = [\"{host}\"]\nmethods = [\"POST\"]\n[rules.inject.headers]\nauthorization = \"Bearer {{{{secret.key{}}}}}\"\n",
                i / 100
            ));
        } else if i % 5 == 0 {
            out.push_str("[rules.inject.headers]\nx-api-version = \"2024-01-01\"\n");
        }
        out.push('\n');
    }
    out
}

/// [`policy_text`] with predicates on a third and a fifth of the rules, and 100 denials.
fn predicates_text() -> String {
    let mut out = String::new();
    for (i, block) in policy_text().split("[[rules]]\n").enumerate() {
        if i > 0 {
            out.push_str("[[rules]]\n");
        }
        // Predicates go in the rule's own table, before any `[rules.inject…]` sub-table.
        let (head, rest) = match block.split_once("[rules.") {
            Some((head, rest)) => (head, Some(rest)),
            None => (block, None),
        };
        out.push_str(head);
        if i > 0 && i % 3 == 0 {
            out.push_str("query = { forbidden = [\"include_private\"], values = { page = \"re:^[0-9]{1,3}$\" } }\n");
        }
        if i > 0 && i % 5 == 0 {
            out.push_str("headers = { \"x-api-version\" = \"2024-*\" }\n");
        }
        if let Some(rest) = rest {
            out.push_str("[rules.");
            out.push_str(rest);
        }
    }
    for d in 0..100 {
        let n = d * 10;
        out.push_str(&format!(
            "\n[[deny]]\nname = \"deny-{d}\"\nhosts = [\"api{}.example.com\", \"*.svc{n}.example.com\"]\nmethods = [\"DELETE\"]\npaths = [\"/admin/**\"]\n",
            n + 1
        ));
        if d % 4 == 0 {
            out.push_str("query = { required = [\"force\"] }\n");
        }
    }
    out
}

fn decide(c: &mut Criterion) {
    let text = policy_text();
    let policy = match compile_sources(&[(Path::new("bench.toml"), &text)]) {
        Ok(p) => p,
        Err(e) => panic!("bench policy does not compile: {e:?}"),
    };
    let get = Method::GET;
    let post = Method::POST;
    let cases = [
        // A wildcard rule, three labels below its suffix: several suffix lookups.
        (
            "wildcard_allow",
            "a.b.c.svc500.example.com",
            "/v1/items/42",
            &get,
        ),
        ("exact_allow", "api501.example.com", "/anything", &post),
        ("path_deny", "api502.example.com", "/admin", &get),
        ("no_rule_deny", "x.y.unknown.example.org", "/", &get),
    ];
    let mut group = c.benchmark_group("policy/decide_1000_rules");
    for (name, host, path, method) in cases {
        let target = Target {
            scheme: Scheme::Https,
            host,
            port: 443,
            method,
            path,
            identity: None,
            narrowing: None,
            websocket: false,
            query: None,
            headers: None,
        };
        group.bench_function(name, |b| {
            b.iter(|| black_box(policy.decide(black_box(&target))))
        });
        // What the allow path cost before issue 13: the allow sentence formatted on every
        // decision (`decide` now leaves it to `explain`).
        if name.ends_with("_allow") {
            group.bench_function(format!("{name}_explained"), |b| {
                b.iter(|| black_box(policy.decide_explained(black_box(&target))))
            });
        }
    }
    group.finish();
    decide_predicates(c);
}

/// The same requests against [`predicates_text`], each with a query and headers.
fn decide_predicates(c: &mut Criterion) {
    let text = predicates_text();
    let policy = match compile_sources(&[(Path::new("bench.toml"), &text)]) {
        Ok(p) => p,
        Err(e) => panic!("bench policy does not compile: {e:?}"),
    };
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "x-api-version",
        http::HeaderValue::from_static("2024-06-01"),
    );
    headers.insert("accept", http::HeaderValue::from_static("application/json"));
    let (get, post, delete) = (Method::GET, Method::POST, Method::DELETE);
    let cases = [
        (
            "wildcard_allow",
            "a.b.c.svc500.example.com",
            "/v1/items/42",
            &get,
            "page=7&q=x",
        ),
        (
            "exact_allow",
            "api501.example.com",
            "/anything",
            &post,
            "q=x",
        ),
        (
            "predicate_deny",
            "api501.example.com",
            "/anything",
            &post,
            "include_private=1",
        ),
        (
            "denial_deny",
            "api501.example.com",
            "/admin/users",
            &delete,
            "force=1",
        ),
        ("path_deny", "api502.example.com", "/admin", &get, "q=x"),
        ("no_rule_deny", "x.y.unknown.example.org", "/", &get, ""),
    ];
    let mut group = c.benchmark_group("policy/decide_1000_rules_predicates");
    for (name, host, path, method, query) in cases {
        let target = Target {
            scheme: Scheme::Https,
            host,
            port: 443,
            method,
            path,
            identity: None,
            narrowing: None,
            websocket: false,
            query: (!query.is_empty()).then_some(query),
            headers: Some(&headers),
        };
        group.bench_function(name, |b| {
            b.iter(|| black_box(policy.decide(black_box(&target))))
        });
    }
    group.finish();
}

fn reload(c: &mut Criterion) {
    let text = policy_text();
    let mut group = c.benchmark_group("policy/reload_1000_rules");
    group.sample_size(20);
    group.bench_function("compile_sources", |b| {
        b.iter(|| {
            let p = compile_sources(&[(Path::new("bench.toml"), black_box(&text))]);
            black_box(p.is_ok())
        })
    });
    // The whole reload path from disk: read the directory, parse, validate, index.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("bench.toml"), &text).expect("write policy");
    group.bench_function("load_dir", |b| {
        b.iter(|| black_box(load_dir(dir.path()).is_ok()))
    });
    group.finish();
}

criterion_group!(benches, decide, reload);
criterion_main!(benches);

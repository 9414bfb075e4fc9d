//! The request-side leak check's hot paths, each beside the way it was done before (issue 13),
//! so one run shows both:
//! - `placeholder/*`: the `__LATCHKEY_` search over a 64 KiB body with no placeholder and with
//!   sixteen (`memmem` vs the old `windows()` scans);
//! - `held_body/*`: is a secret the rule does not bind in a 1 MiB body held whole, where the
//!   body holds one it does bind (`Scrubber::find_where` vs the old `find` + `scrub` copy);
//! - `store/*`: the redaction matcher taken from the store once vs eight times (what one
//!   request used to do across the pipeline, the broker and the audit record);
//! - `store/set_minted_unchanged`: a cached token registered again (what each credentialed
//!   request costs the redaction set);
//! - `value/clone`: a secret value handed out (a shared reference vs the old copy).

// A benchmark may unwrap what it just built (the crate denies unwrap/expect outside tests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use latchkey::secrets::leak::{Binding, Checker};
use latchkey::secrets::placeholder;
use latchkey::secrets::scrub::{ScrubSecret, Scrubber};
use latchkey::secrets::{SecretStore, SecretValue, Source};

const PREFIX: &[u8] = b"__LATCHKEY_";

/// The search as it was: a `windows()` scan for the prefix, then for the suffix over the rest.
fn old_find(hay: &[u8]) -> Vec<placeholder::Found> {
    let valid = |n: &str| {
        !n.is_empty()
            && n.len() <= 64
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            && !n.contains("__")
    };
    let find_from = |from: usize| -> Option<usize> {
        hay.get(from..)?
            .windows(PREFIX.len())
            .position(|w| w == PREFIX)
            .map(|i| i + from)
    };
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(start) = find_from(pos) {
        let name_start = start + PREFIX.len();
        let tail = &hay[name_start..];
        match tail
            .windows(2)
            .position(|w| w == b"__")
            .filter(|&i| i <= 64)
        {
            Some(i) => {
                let name = std::str::from_utf8(&tail[..i])
                    .ok()
                    .filter(|n| valid(n))
                    .map(str::to_string);
                let end = name_start + i + 2;
                out.push(placeholder::Found { start, end, name });
                pos = end;
            }
            None => {
                out.push(placeholder::Found {
                    start,
                    end: name_start,
                    name: None,
                });
                pos = name_start;
            }
        }
    }
    out
}

fn json_body(len: usize) -> Vec<u8> {
    let unit = br#"{"id":12345,"name":"widget","tags":["a","b"],"note":"nothing to see here"},"#;
    unit.iter().copied().cycle().take(len).collect()
}

fn placeholders(c: &mut Criterion) {
    let clean = json_body(64 * 1024);
    let mut g = c.benchmark_group("placeholder");
    g.throughput(Throughput::Bytes(clean.len() as u64));
    g.bench_function("contains_64k_clean/memmem", |b| {
        b.iter(|| placeholder::contains(black_box(&clean)))
    });
    g.bench_function("contains_64k_clean/old_windows", |b| {
        b.iter(|| !old_find(black_box(&clean)).is_empty())
    });
    // A JSON body with a placeholder every 4 KiB (a body-placeholder rule's usual input).
    let mut with: Vec<u8> = Vec::new();
    while with.len() < 64 * 1024 {
        with.extend_from_slice(&json_body(4096));
        with.extend_from_slice(br#"{"key":"__LATCHKEY_openai__"},"#);
    }
    assert_eq!(placeholder::find(&with), old_find(&with));
    g.bench_function("find_64k_16_placeholders/memmem", |b| {
        b.iter(|| placeholder::find(black_box(&with)).len())
    });
    g.bench_function("find_64k_16_placeholders/old_windows", |b| {
        b.iter(|| old_find(black_box(&with)).len())
    });
    g.finish();
}

fn held_body(c: &mut Criterion) {
    let bound_value = b"sk-bound-0123456789abcdefghij".to_vec();
    let other_value = b"sk-other-9876543210zyxwvutsrq".to_vec();
    let scrubber = Scrubber::new(&[
        ScrubSecret {
            name: "bound",
            value: &bound_value,
        },
        ScrubSecret {
            name: "other",
            value: &other_value,
        },
    ])
    .expect("scrubber");
    let mut body = json_body(1024 * 1024);
    body[500_000..500_000 + bound_value.len()].copy_from_slice(&bound_value);
    let bound: BTreeSet<String> = ["bound".to_string()].into();
    let store = SecretStore::empty();
    let checker = Checker {
        scrubber: Some(&scrubber),
        store: &store,
        binding: Binding {
            rule: "api",
            bound: &bound,
            placeholders: &[],
            captured: &BTreeSet::new(),
            withheld: &BTreeSet::new(),
        },
        host: "api.test",
    };
    assert!(checker.body(&body, None).is_ok());
    let mut g = c.benchmark_group("held_body");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.sample_size(30);
    g.bench_function("1m_with_a_bound_secret/find_where", |b| {
        b.iter(|| scrubber.find_where(black_box(&body), |n| !bound.contains(n)))
    });
    g.bench_function("1m_with_a_bound_secret/old_find_then_scrub", |b| {
        b.iter(|| {
            scrubber.find(black_box(&body))?;
            let (_, names) = scrubber.scrub(&body);
            names.into_iter().find(|n| !bound.contains(&**n))
        })
    });
    g.bench_function("1m_with_a_bound_secret/whole_check", |b| {
        b.iter(|| checker.body(black_box(&body), None).is_ok())
    });
    g.finish();
}

fn store(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("key");
    std::fs::write(&path, "sk-bench-0123456789abcdefghijklmnopqrstuvwxyz\n").expect("write");
    let store = SecretStore::load(vec![("k".to_string(), Source::File(path))])
        .unwrap_or_else(|_| panic!("cannot load the bench secret"));
    store.set_minted(
        "credential:t",
        "",
        &SecretValue::new(b"minted-token-0123".to_vec()),
    );
    assert!(store.scrubber().expect("scrubber").is_some());
    let mut g = c.benchmark_group("store");
    g.bench_function("scrubber_once", |b| {
        b.iter(|| black_box(store.scrubber().is_ok()))
    });
    g.bench_function("scrubber_eight_times", |b| {
        b.iter(|| (0..8).all(|_| black_box(store.scrubber().is_ok())))
    });
    // A cached token handed out again (every credentialed request): the redaction set's lock.
    let token = SecretValue::new(b"minted-token-0123".to_vec());
    g.bench_function("set_minted_unchanged", |b| {
        b.iter(|| store.set_minted("credential:t", "", black_box(&token)))
    });
    g.finish();

    let value = SecretValue::new(b"sk-bench-0123456789abcdefghijklmnopqrstuvwxyz".to_vec());
    let old = zeroize::Zeroizing::new(value.expose().to_vec());
    let mut g = c.benchmark_group("value");
    g.bench_function("clone/shared", |b| b.iter(|| black_box(value.clone())));
    g.bench_function("clone/old_copy", |b| b.iter(|| black_box(old.clone())));
    g.finish();
}

criterion_group!(benches, placeholders, held_body, store);
criterion_main!(benches);

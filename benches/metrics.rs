//! Per-request cost of counting: `Metrics::request` (the `latchkey_requests_total` series of one
//! audited request) and `Histogram::observe` (upstream latency), on one thread and on two
//! threads counting at once (the proxy's workers on the 2-core bench machine). Reported per
//! call on each thread.

// A benchmark may unwrap what it just built (the crate denies unwrap/expect outside tests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use latchkey::metrics::Metrics;

/// A realistic spread of label sets: a few rules, two identities, allows and a deny.
const LABELS: [(&str, &str, &str, &str); 8] = [
    ("allow", "allowed", "github", "default"),
    ("allow", "allowed", "openai", "default"),
    ("allow", "allowed", "s3", "agent-a"),
    ("allow", "allowed", "github", "agent-a"),
    ("deny", "no_rule", "", "default"),
    ("deny", "method_not_allowed", "github", "default"),
    ("allow", "allowed", "credential:gh-app", "default"),
    ("allow", "allowed", "openai", "agent-a"),
];

/// Runs `op` `iters` times on each of `threads` threads at once; the wall time per call.
fn per_call(threads: usize, iters: u64, op: impl Fn(u64) + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let op = &op;
            s.spawn(move || {
                for i in 0..iters {
                    op(i.wrapping_add(t as u64 * 3));
                }
            });
        }
    });
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let m = Arc::new(Metrics::default());
    // Every label set seen once, as a proxy that has run for a while has.
    for (d, r, rule, id) in LABELS {
        m.request(d, r, rule, id, false);
    }
    let request = |i: u64| {
        let (d, r, rule, id) = LABELS[(i % LABELS.len() as u64) as usize];
        m.request(
            black_box(d),
            black_box(r),
            black_box(rule),
            black_box(id),
            false,
        );
    };
    let observe = |i: u64| {
        m.upstream_latency
            .observe(black_box(0.0004 * (i % 64) as f64))
    };
    for threads in [1, 2] {
        c.bench_function(&format!("metrics_request_{threads}_thread"), |b| {
            b.iter_custom(|iters| per_call(threads, iters, request))
        });
        c.bench_function(&format!("histogram_observe_{threads}_thread"), |b| {
            b.iter_custom(|iters| per_call(threads, iters, observe))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

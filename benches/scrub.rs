//! Throughput of response scrubbing: a 10 MiB body of random-ish ASCII with 10 secrets of 40
//! bytes in force and a few reflections planted, scrubbed whole and as a stream of 16 KiB chunks.
//! The target is at least 1 GB/s per core.

// A benchmark may unwrap what it just built (the crate denies unwrap/expect outside tests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;

use base64::Engine as _;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use latchkey::secrets::scrub::{ScrubSecret, Scrubber};

const BODY_LEN: usize = 10 * 1024 * 1024;
const CHUNK_LEN: usize = 16 * 1024;
const SECRETS: usize = 10;
const SECRET_LEN: usize = 40;

/// Deterministic pseudo-random numbers (SplitMix64), so every run scrubs the same body.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[(self.next() % from.len() as u64) as usize]
    }
}

/// Ten API-key-like secrets: a prefix, then random alphanumerics.
fn secrets(rng: &mut Rng) -> Vec<(String, Vec<u8>)> {
    let alnum: Vec<u8> = (b'a'..=b'z')
        .chain(b'A'..=b'Z')
        .chain(b'0'..=b'9')
        .collect();
    (0..SECRETS)
        .map(|i| {
            let mut value = b"sk-".to_vec();
            while value.len() < SECRET_LEN {
                value.push(rng.pick(&alnum));
            }
            (format!("key{i}"), value)
        })
        .collect()
}

/// Random-ish printable ASCII shaped like JSON text, with each secret reflected twice: once raw
/// and once inside a base64 blob.
fn body(rng: &mut Rng, secrets: &[(String, Vec<u8>)]) -> Vec<u8> {
    let text: Vec<u8> = (b' '..=b'~').chain([b'\n'; 4]).collect();
    let mut body: Vec<u8> = (0..BODY_LEN).map(|_| rng.pick(&text)).collect();
    for (i, (_, value)) in secrets.iter().enumerate() {
        let raw_at = (2 * i + 1) * BODY_LEN / (2 * SECRETS + 1);
        body[raw_at..raw_at + value.len()].copy_from_slice(value);
        let blob = base64::engine::general_purpose::STANDARD.encode([b"x:", &value[..]].concat());
        let blob_at = raw_at + BODY_LEN / (2 * SECRETS + 1);
        body[blob_at..blob_at + blob.len()].copy_from_slice(blob.as_bytes());
    }
    body
}

fn scrub(c: &mut Criterion) {
    let mut rng = Rng(2024);
    let secrets = secrets(&mut rng);
    let body = body(&mut rng, &secrets);
    let scrub_secrets: Vec<ScrubSecret<'_>> = secrets
        .iter()
        .map(|(name, value)| ScrubSecret { name, value })
        .collect();
    let scrubber = match Scrubber::new(&scrub_secrets) {
        Ok(scrubber) => Arc::new(scrubber),
        Err(e) => panic!("cannot build the scrubber: {e}"),
    };
    let (_, redacted) = scrubber.scrub(&body);
    assert_eq!(redacted.len(), 2 * SECRETS, "every planted secret is found");

    let mut group = c.benchmark_group("scrub");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.sample_size(20);
    group.bench_function("whole_10MiB", |b| {
        b.iter(|| scrubber.scrub(black_box(&body)))
    });
    group.bench_function("stream_16KiB_chunks", |b| {
        b.iter(|| {
            let mut stream = scrubber.stream();
            let mut emitted = 0;
            for chunk in black_box(&body).chunks(CHUNK_LEN) {
                emitted += stream.push(chunk).len();
            }
            emitted + stream.finish().len()
        })
    });
    group.finish();
}

criterion_group!(benches, scrub);
criterion_main!(benches);

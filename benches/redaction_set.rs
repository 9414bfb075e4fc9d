//! Per-request cost of the redaction set over a long run: 100,000 requests spread over 50
//! hosts, each host with its own minted JWT (claims using `{{host}}`), as a `jwt` credential
//! under a wildcard rule produces. Every request does what the request path does with the set:
//! hand out the host's token ([`SecretStore::set_minted`]), take the matcher for the outbound
//! check and again for the response ([`SecretStore::scrubber`]), and scrub a 2 KiB response
//! that reflects the token. Two runs: tokens cached for the whole run (the alternating-hosts
//! case of issue 11), and one token re-signed every 1,000 requests (a TTL running out), so
//! values are retired and the retirement caps come into play.
//!
//! Prints the mean cost per request in windows ending at request 1k, 10k, 50k and 100k, with
//! the set's size, generation and matcher builds; then the cost of one matcher build with the
//! set at its caps (the most one new value can cost). Run with
//! `cargo bench --bench redaction_set`.

// A benchmark may unwrap what it just built (the crate denies unwrap/expect outside tests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use latchkey::secrets::{
    SecretStore, SecretValue, MAX_LIVE_PER_NAME, MAX_RETIRED, MAX_RETIRED_PER_NAME,
};

const HOSTS: usize = 50;
const REQUESTS: usize = 100_000;
const CHECKPOINTS: [usize; 4] = [1_000, 10_000, 50_000, 100_000];
const CREDENTIAL: &str = "credential:agent_jwt";

/// Deterministic pseudo-random numbers (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A JWT-shaped value: three base64url parts, about 330 bytes like an ES256 token with a few
/// claims.
fn jwt(rng: &mut Rng) -> SecretValue {
    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut part = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| B64[(rng.next() % B64.len() as u64) as usize])
            .collect()
    };
    let mut v = b"eyJhbGciOiJFUzI1NiJ9.".to_vec();
    v.extend(part(220));
    v.push(b'.');
    v.extend(part(86));
    SecretValue::new(v)
}

fn response(token: &SecretValue) -> Vec<u8> {
    let mut body = br#"{"ok":true,"echo":{"authorization":"Bearer "#.to_vec();
    body.extend_from_slice(token.expose());
    body.extend_from_slice(br#""},"items":["#);
    while body.len() < 2048 {
        body.extend_from_slice(br#"{"id":12345,"name":"an item of the listing"},"#);
    }
    body.extend_from_slice(b"{}]}");
    body
}

/// Runs [`REQUESTS`] requests over [`HOSTS`] hosts; every `resign_every` requests (if any) one
/// host's token, round robin, is replaced by a fresh one (its TTL ran out).
fn run(title: &str, resign_every: Option<usize>, rng: &mut Rng) {
    let store = SecretStore::empty();
    let keys: Vec<String> = (0..HOSTS)
        .map(|i| format!("{CREDENTIAL}\0ci-agent\0svc{i}.example.test"))
        .collect();
    let mut tokens: Vec<SecretValue> = (0..HOSTS).map(|_| jwt(rng)).collect();
    let bodies: Vec<Vec<u8>> = tokens.iter().map(response).collect();
    let mut bodies = bodies;

    println!("\n{title}");
    println!(
        "{:>9} {:>16} {:>12} {:>11} {:>8}",
        "requests", "µs/req (window)", "set values", "generation", "builds"
    );
    let mut window_start = Instant::now();
    let mut window_from = 0;
    let mut resigned = 0;
    let mut redactions = 0usize;
    for n in 1..=REQUESTS {
        if resign_every.is_some_and(|every| n % every == 0) {
            let h = resigned % HOSTS;
            resigned += 1;
            tokens[h] = jwt(rng);
            bodies[h] = response(&tokens[h]);
        }
        // Hosts in a scrambled but fair order.
        let h = (rng.next() % HOSTS as u64) as usize;
        store.set_minted(CREDENTIAL, &keys[h], &tokens[h]);
        let outbound = store.scrubber().expect("scrubber").expect("values");
        black_box(outbound.find(b"GET /v1/items HTTP/1.1"));
        let scan = store.scrubber().expect("scrubber").expect("values");
        let (out, names) = scan.scrub(&bodies[h]);
        redactions += names.len();
        black_box(out);
        if CHECKPOINTS.contains(&n) {
            let per = window_start.elapsed() / (n - window_from) as u32;
            let stats = store.redaction_stats();
            println!(
                "{n:>9} {:>16.1} {:>12} {:>11} {:>8}",
                per.as_secs_f64() * 1e6,
                stats.values,
                stats.generation,
                stats.builds
            );
            window_start = Instant::now();
            window_from = n;
        }
    }
    assert_eq!(redactions, REQUESTS, "every reflected token was redacted");
}

fn main() {
    let mut rng = Rng(11);
    run(
        "50 hosts, tokens cached for their TTL (alternating hosts, as in issue 11)",
        None,
        &mut rng,
    );
    run(
        "50 hosts, one host's token re-signed every 1,000 requests (100 re-signs in all)",
        Some(1_000),
        &mut rng,
    );
    // The worst case: one build with the set at its caps: one credential's live values for
    // as many hosts as it may have, and every retired slot taken.
    let full = SecretStore::empty();
    for i in 0..MAX_LIVE_PER_NAME {
        full.set_minted(CREDENTIAL, &format!("host-{i}"), &jwt(&mut rng));
    }
    for c in 0..MAX_RETIRED / MAX_RETIRED_PER_NAME {
        for _ in 0..=MAX_RETIRED_PER_NAME {
            full.set_minted(&format!("credential:c{c}"), "", &jwt(&mut rng));
        }
    }
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let started = Instant::now();
        full.set_minted(CREDENTIAL, "host-0", &jwt(&mut rng));
        black_box(full.scrubber().expect("scrubber"));
        best = best.min(started.elapsed());
    }
    println!(
        "one matcher build with the set at its caps ({} values): {:.1} ms",
        full.redaction_stats().values,
        best.as_secs_f64() * 1e3
    );
}

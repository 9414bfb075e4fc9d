//! Per-I/O cost of `proxy::limits::Idle` (the idle-timeout wrapper on every sandbox connection):
//! 64-byte reads and writes through it over an in-memory duplex, against the same loop on the
//! bare duplex. The difference is what the wrapper costs per read plus write.

// A benchmark may unwrap what it just built (the crate denies unwrap/expect outside tests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use latchkey::proxy::limits::Idle;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};

async fn ping_pong<T: AsyncRead + AsyncWrite + Unpin>(
    near: &mut T,
    far: &mut DuplexStream,
    iters: u64,
) -> Duration {
    let out = [7u8; 64];
    let mut buf = [0u8; 64];
    let start = Instant::now();
    for _ in 0..iters {
        far.write_all(&out).await.expect("write far");
        near.read_exact(&mut buf).await.expect("read near");
        near.write_all(black_box(&buf)).await.expect("write near");
        far.read_exact(&mut buf).await.expect("read far");
    }
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    c.bench_function("duplex_read_write_64b_bare", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let (mut near, mut far) = tokio::io::duplex(64 * 1024);
                ping_pong(&mut near, &mut far, iters).await
            })
        })
    });
    c.bench_function("duplex_read_write_64b_idle", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let (near, mut far) = tokio::io::duplex(64 * 1024);
                let mut near = Box::pin(Idle::new(near, Duration::from_secs(300)));
                ping_pong(&mut near, &mut far, iters).await
            })
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);

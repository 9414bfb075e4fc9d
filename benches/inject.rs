//! Cost of injecting a secret header: render the template from the store, build the header
//! value, insert it. Measured through a current-thread runtime's `block_on`, so the figure is an
//! upper bound on the injection itself.

// A benchmark may unwrap what it just built (the crate denies unwrap/expect outside tests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderName, HeaderValue};
use latchkey::secrets::{SecretStore, Source, Template};

fn inject(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("key");
    std::fs::write(&path, "sk-bench-0123456789abcdefghijklmnopqrstuvwxyz\n").expect("write");
    let store = SecretStore::load(vec![("openai".to_string(), Source::File(path))])
        .unwrap_or_else(|_| panic!("cannot load the bench secret"));
    let template = Template::parse("Bearer {{secret.openai}}").expect("template");
    let name = HeaderName::from_static("authorization");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut headers = HeaderMap::new();
    headers.insert("user-agent", HeaderValue::from_static("bench"));
    c.bench_function("inject/bearer_header", |b| {
        b.iter(|| {
            rt.block_on(async {
                let v = template.render(&store, "default").await.expect("render");
                let mut hv = HeaderValue::from_bytes(&v).expect("header");
                hv.set_sensitive(true);
                headers.insert(name.clone(), hv);
            })
        })
    });
}

criterion_group!(benches, inject);
criterion_main!(benches);

//! The span mapping, the endpoint URL, the tap's bounded queue, and the exporter against a real
//! collector on loopback (retries, refusals, a collector that is down, partial success).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Mutex;
use std::time::Instant;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTracePartialSuccess;

use super::*;
use crate::audit::UsageInfo;

fn record() -> Record {
    Record {
        phase: Phase::Outcome,
        ts: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
        id: "0123456789abcdef".into(),
        identity: "ci-agent".into(),
        client: "127.0.0.1:40000".into(),
        method: Some("POST".into()),
        scheme: Some("https".into()),
        host: Some("api.openai.com".into()),
        port: Some(443),
        path: Some("/v1/chat/completions?key=REDACTED".into()),
        decision: "allow",
        rule: Some("openai".into()),
        reason: "allowed",
        secrets: vec!["openai".into()],
        secret_sources: Default::default(),
        stale_secrets: Vec::new(),
        captured: Vec::new(),
        status: Some(200),
        upstream: Some("192.0.2.10:443".into()),
        original_dst: None,
        bytes_up: 100,
        bytes_down: 2000,
        duration_ms: 250,
        policy: "sha256:abc".into(),
        redactions: 0,
        would_deny: false,
        dns: None,
        approval: None,
        limits: Vec::new(),
        usage: None,
        websocket: None,
        mcp: None,
        labels: BTreeMap::from([("env".to_string(), "ci".to_string())]),
        reach: None,
        session: Some("sess-1".into()),
        profile: None,
        step: None,
        attempt: Some(1),
        trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
        span_id: Some("00f067aa0ba902b7".into()),
        parent_span_id: Some("b7ad6b7169203331".into()),
    }
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a any_value::Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn str_attr<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key) {
        Some(any_value::Value::StringValue(s)) => Some(s),
        _ => None,
    }
}

fn int_attr(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key) {
        Some(any_value::Value::IntValue(n)) => Some(*n),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_span_carries_the_records_ids_times_and_http_attributes() {
    let s = span_of(&record());
    assert_eq!(hex(&s.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(hex(&s.span_id), "00f067aa0ba902b7");
    assert_eq!(hex(&s.parent_span_id), "b7ad6b7169203331");
    assert_eq!(s.name, "POST api.openai.com");
    assert_eq!(s.kind, span::SpanKind::Client as i32);
    assert_eq!(s.start_time_unix_nano, 1_700_000_000_123_000_000);
    assert_eq!(s.end_time_unix_nano, 1_700_000_000_373_000_000);
    assert_eq!(
        s.status.as_ref().map(|st| st.code),
        Some(status::StatusCode::Unset as i32)
    );
    assert_eq!(str_attr(&s, "http.request.method"), Some("POST"));
    assert_eq!(
        str_attr(&s, "url.full"),
        Some("https://api.openai.com/v1/chat/completions?key=REDACTED")
    );
    assert_eq!(str_attr(&s, "url.scheme"), Some("https"));
    assert_eq!(str_attr(&s, "server.address"), Some("api.openai.com"));
    assert_eq!(int_attr(&s, "server.port"), Some(443));
    assert_eq!(int_attr(&s, "http.response.status_code"), Some(200));
    assert_eq!(str_attr(&s, "client.address"), Some("127.0.0.1"));
    assert_eq!(int_attr(&s, "client.port"), Some(40000));
    assert_eq!(str_attr(&s, "network.peer.address"), Some("192.0.2.10"));
    assert_eq!(str_attr(&s, "latchkey.decision"), Some("allow"));
    assert_eq!(str_attr(&s, "latchkey.reason"), Some("allowed"));
    assert_eq!(str_attr(&s, "latchkey.rule"), Some("openai"));
    assert_eq!(str_attr(&s, "latchkey.identity"), Some("ci-agent"));
    assert_eq!(str_attr(&s, "latchkey.audit.id"), Some("0123456789abcdef"));
    assert_eq!(str_attr(&s, "latchkey.session"), Some("sess-1"));
    assert_eq!(int_attr(&s, "latchkey.attempt"), Some(1));
    assert_eq!(str_attr(&s, "latchkey.labels.env"), Some("ci"));
    match attr(&s, "latchkey.secrets") {
        Some(any_value::Value::ArrayValue(a)) => assert_eq!(
            a.values,
            vec![AnyValue {
                value: Some(string("openai"))
            }]
        ),
        other => panic!("latchkey.secrets: {other:?}"),
    }
    assert!(attr(&s, "error.type").is_none());
    assert!(attr(&s, "gen_ai.system").is_none(), "no usage, no GenAI");
}

#[test]
fn a_model_call_carries_the_genai_attributes() {
    let mut r = record();
    r.usage = Some(UsageInfo {
        provider: "openai",
        model: Some("gpt-4o-mini".into()),
        input_tokens: 20,
        output_tokens: 100,
        cached_input_tokens: 4,
        cost: Some(0.25),
        source: "response",
    });
    let s = span_of(&r);
    assert_eq!(str_attr(&s, "gen_ai.system"), Some("openai"));
    assert_eq!(str_attr(&s, "gen_ai.provider.name"), Some("openai"));
    assert_eq!(str_attr(&s, "gen_ai.request.model"), Some("gpt-4o-mini"));
    assert_eq!(int_attr(&s, "gen_ai.usage.input_tokens"), Some(20));
    assert_eq!(int_attr(&s, "gen_ai.usage.output_tokens"), Some(100));
    assert_eq!(
        int_attr(&s, "gen_ai.usage.cache_read.input_tokens"),
        Some(4)
    );
    assert_eq!(
        attr(&s, "latchkey.usage.cost"),
        Some(&any_value::Value::DoubleValue(0.25))
    );
}

#[test]
fn denials_and_server_errors_are_errors_and_other_statuses_are_not() {
    let mut r = record();
    r.decision = "deny";
    r.reason = "path_not_allowed";
    r.status = Some(403);
    let s = span_of(&r);
    let st = s.status.clone().expect("status");
    assert_eq!(st.code, status::StatusCode::Error as i32);
    assert_eq!(st.message, "path_not_allowed");
    assert_eq!(str_attr(&s, "error.type"), Some("path_not_allowed"));

    let mut r = record();
    r.status = Some(503);
    let s = span_of(&r);
    assert_eq!(
        s.status.as_ref().map(|s| s.code),
        Some(status::StatusCode::Error as i32)
    );
    assert_eq!(str_attr(&s, "error.type"), Some("503"));

    let mut r = record();
    r.status = Some(404);
    let s = span_of(&r);
    assert_eq!(
        s.status.as_ref().map(|s| s.code),
        Some(status::StatusCode::Unset as i32)
    );
}

#[test]
fn a_refused_redirected_connection_names_where_it_went_and_no_peer() {
    let mut r = record();
    r.decision = "deny";
    r.reason = "no_rule";
    r.method = Some("CONNECT".into());
    r.upstream = None;
    r.original_dst = Some("198.51.100.7:443".into());
    let s = span_of(&r);
    assert_eq!(
        str_attr(&s, "latchkey.original_dst"),
        Some("198.51.100.7:443")
    );
    assert_eq!(
        str_attr(&s, "network.peer.address"),
        None,
        "nothing was dialed"
    );
    // Allowed: the address dialed is the peer, the original destination stays apart.
    r.decision = "allow";
    r.reason = "allowed";
    r.upstream = Some("192.0.2.10:443".into());
    let s = span_of(&r);
    assert_eq!(str_attr(&s, "network.peer.address"), Some("192.0.2.10"));
    assert_eq!(
        str_attr(&s, "latchkey.original_dst"),
        Some("198.51.100.7:443")
    );
    let plain = span_of(&record());
    assert_eq!(str_attr(&plain, "latchkey.original_dst"), None);
}

#[test]
fn without_a_trace_from_the_sandbox_ids_are_random_and_there_is_no_parent() {
    let mut r = record();
    r.trace_id = None;
    r.span_id = None;
    let a = span_of(&r);
    let b = span_of(&r);
    assert_eq!((a.trace_id.len(), a.span_id.len()), (16, 8));
    assert!(a.trace_id.iter().any(|x| *x != 0) && a.span_id.iter().any(|x| *x != 0));
    assert_ne!(a.trace_id, b.trace_id);
    assert_ne!(a.span_id, b.span_id);
    assert!(a.parent_span_id.is_empty(), "a parent outside any trace");
    // Ids that are not hex of the right length (or all zero) are not used either.
    for bad in [
        "xyz",
        "4bf92f3577b34da6a3ce929d0e0e473",
        "00000000000000000000000000000000",
    ] {
        r.trace_id = Some(bad.into());
        let s = span_of(&r);
        assert_ne!(hex(&s.trace_id), bad);
        assert_eq!(s.trace_id.len(), 16);
        assert!(s.parent_span_id.is_empty());
    }
}

#[test]
fn names_and_methods_follow_the_conventions_for_odd_requests() {
    let mut r = record();
    r.method = Some("PROPFIND".into());
    let s = span_of(&r);
    assert_eq!(s.name, "PROPFIND api.openai.com");
    assert_eq!(str_attr(&s, "http.request.method"), Some("_OTHER"));
    assert_eq!(
        str_attr(&s, "http.request.method_original"),
        Some("PROPFIND")
    );

    let mut r = record();
    r.method = Some("CONNECT".into());
    r.path = None;
    let s = span_of(&r);
    assert_eq!(s.name, "CONNECT api.openai.com");
    assert!(attr(&s, "url.full").is_none(), "a CONNECT has no URL");

    r.method = None;
    r.host = None;
    assert_eq!(span_of(&r).name, "connection");

    let mut r = record();
    r.port = Some(8443);
    r.host = Some("::1".into());
    assert_eq!(
        str_attr(&span_of(&r), "url.full"),
        Some("https://[::1]:8443/v1/chat/completions?key=REDACTED")
    );
}

#[test]
fn the_traces_url_is_the_base_plus_v1_traces() {
    let ok = |raw: &str| traces_url(raw).expect(raw).to_string();
    assert_eq!(
        ok("http://127.0.0.1:4318"),
        "http://127.0.0.1:4318/v1/traces"
    );
    assert_eq!(
        ok("http://127.0.0.1:4318/"),
        "http://127.0.0.1:4318/v1/traces"
    );
    assert_eq!(
        ok("https://otel.example.com/otlp/"),
        "https://otel.example.com/otlp/v1/traces"
    );
    assert_eq!(
        ok("http://[::1]:4318/v1/traces"),
        "http://[::1]:4318/v1/traces"
    );
    let host = |raw: &str| collector_host(&traces_url(raw).expect(raw));
    assert_eq!(host("http://[::1]:4318"), "::1");
    assert_eq!(host("http://Collector.Example:4318"), "collector.example");
    assert_eq!(host("http://127.0.0.1"), "127.0.0.1");
    for (bad, why) in [
        ("ftp://x/", "scheme"),
        ("http://user:pw@x/", "credentials"),
        ("http://x/?a=b", "query"),
        ("not a url", "relative URL"),
        ("http://user:pw@ x/", "(the URL given)"),
    ] {
        let e = traces_url(bad).expect_err(bad).to_string();
        assert!(e.contains(why) && e.contains("--otlp"), "{bad}: {e}");
        assert!(!e.contains("pw"), "{e}");
    }
}

#[test]
fn the_tap_offers_outcomes_only_and_drops_with_a_count_when_the_queue_is_full() {
    let (tx, mut rx) = mpsc::channel(2);
    let stats = Arc::new(OtlpStats::default());
    let mut tap = OtlpTap {
        tx,
        stats: stats.clone(),
    };
    let mut decision = record();
    decision.phase = Phase::Decision;
    let mut dns = record();
    dns.method = Some("DNS".into());
    let mut approval = record();
    approval.method = Some("APPROVAL".into());
    tap.written(&[decision, dns, approval, record()]);
    assert_eq!(rx.try_recv().map(|r| r.phase).ok(), Some(Phase::Outcome));
    assert!(rx.try_recv().is_err(), "only the outcome is a span");
    // Nobody drains: two fit, the rest are dropped at once, never waited for.
    let started = Instant::now();
    tap.written(&vec![record(); 10]);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(stats.dropped(), 8);
    drop(rx);
    tap.written(&[record()]);
    assert_eq!(stats.dropped(), 9, "a gone exporter drops too");
}

/// What a test collector received, and how it answers.
#[derive(Default)]
struct Collector {
    requests: Mutex<Vec<(http::Method, String, String, ExportTraceServiceRequest)>>,
    /// Statuses to answer with, in order; 200 once they run out.
    answers: Mutex<Vec<u16>>,
    /// Rejected spans to claim in a 200's partial success.
    reject: AtomicU64,
}

/// A real OTLP/HTTP collector on loopback: decodes each request's protobuf.
async fn collector(state: Arc<Collector>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let state = state.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: http::Request<Incoming>| {
                    let state = state.clone();
                    async move {
                        let method = req.method().clone();
                        let path = req.uri().path().to_string();
                        let ctype = req
                            .headers()
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string();
                        let body = req.into_body().collect().await.expect("body").to_bytes();
                        let decoded =
                            ExportTraceServiceRequest::decode(body.as_ref()).expect("protobuf");
                        state
                            .requests
                            .lock()
                            .expect("lock")
                            .push((method, path, ctype, decoded));
                        let code = {
                            let mut a = state.answers.lock().expect("lock");
                            if a.is_empty() {
                                200
                            } else {
                                a.remove(0)
                            }
                        };
                        let reject = state.reject.load(Ordering::SeqCst);
                        let body = if code == 200 && reject > 0 {
                            ExportTraceServiceResponse {
                                partial_success: Some(ExportTracePartialSuccess {
                                    rejected_spans: reject as i64,
                                    error_message: "too old".into(),
                                }),
                            }
                            .encode_to_vec()
                        } else {
                            Vec::new()
                        };
                        let mut res = http::Response::new(Full::new(Bytes::from(body)));
                        *res.status_mut() = http::StatusCode::from_u16(code).expect("status");
                        if code == 429 {
                            res.headers_mut()
                                .insert("retry-after", http::HeaderValue::from_static("0"));
                        }
                        Ok::<_, Infallible>(res)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

fn quick() -> OtlpOptions {
    OtlpOptions {
        linger: Duration::from_millis(20),
        attempts: 3,
        backoff_first: Duration::from_millis(10),
        backoff_cap: Duration::from_millis(40),
        timeout: Duration::from_secs(5),
        ..OtlpOptions::default()
    }
}

async fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn spans_reach_a_collector_on_loopback_as_protobuf_after_retries() {
    let state = Arc::new(Collector::default());
    *state.answers.lock().expect("lock") = vec![503, 429];
    let addr = collector(state.clone()).await;
    // Loopback without --allow-private: the collector's own address is opened for it alone.
    let (mut tap, stats) = start(
        &format!("http://{addr}"),
        &UpstreamConfig::default(),
        quick(),
    )
    .expect("start");
    let mut second = record();
    second.id = "fedcba9876543210".into();
    tap.written(&[record(), second]);
    wait_for("the export", || stats.exported() == 2).await;
    assert_eq!(stats.retries(), 2);
    assert_eq!((stats.failed(), stats.dropped()), (0, 0));
    let requests = state.requests.lock().expect("lock");
    assert_eq!(requests.len(), 3, "two refused tries and the accepted one");
    let (method, path, ctype, req) = &requests[2];
    assert_eq!(
        (method, path.as_str(), ctype.as_str()),
        (&http::Method::POST, "/v1/traces", "application/x-protobuf")
    );
    let rs = &req.resource_spans[0];
    let service = rs
        .resource
        .as_ref()
        .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
        .and_then(|kv| kv.value.clone())
        .and_then(|v| v.value);
    assert_eq!(service, Some(string("latchkey")));
    let spans = &rs.scope_spans[0].spans;
    let ids: Vec<&str> = spans
        .iter()
        .filter_map(|s| str_attr(s, "latchkey.audit.id"))
        .collect();
    assert_eq!(
        ids,
        ["0123456789abcdef", "fedcba9876543210"],
        "one batch, in order"
    );
}

#[tokio::test]
async fn a_refusing_or_absent_collector_gives_batches_up_counted() {
    let state = Arc::new(Collector::default());
    *state.answers.lock().expect("lock") = vec![400];
    let addr = collector(state.clone()).await;
    let (mut tap, stats) = start(
        &format!("http://{addr}/"),
        &UpstreamConfig::default(),
        quick(),
    )
    .expect("start");
    tap.written(&[record()]);
    wait_for("the refusal", || stats.failed() == 1).await;
    assert_eq!(
        (stats.retries(), stats.exported()),
        (0, 0),
        "400 is not retried"
    );

    // Nothing listens: every attempt fails, then the batch is given up.
    let unused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = unused.local_addr().expect("addr").port();
    drop(unused);
    let (mut tap, stats) = start(
        &format!("http://127.0.0.1:{port}"),
        &UpstreamConfig::default(),
        quick(),
    )
    .expect("start");
    tap.written(&[record(), record()]);
    wait_for("giving up", || stats.failed() == 2).await;
    assert_eq!(stats.retries(), 2, "three attempts");
}

#[tokio::test]
async fn a_partial_success_counts_the_rejected_spans() {
    let state = Arc::new(Collector::default());
    state.reject.store(1, Ordering::SeqCst);
    let addr = collector(state.clone()).await;
    let (mut tap, stats) = start(
        &format!("http://{addr}"),
        &UpstreamConfig::default(),
        quick(),
    )
    .expect("start");
    tap.written(&[record(), record(), record()]);
    wait_for("the export", || stats.exported() + stats.rejected() == 3).await;
    assert_eq!((stats.exported(), stats.rejected()), (2, 1));
}

#[tokio::test]
async fn the_collector_is_never_latchkeys_own_listener() {
    let state = Arc::new(Collector::default());
    let addr = collector(state.clone()).await;
    let config = UpstreamConfig {
        own: vec![addr],
        ..UpstreamConfig::default()
    };
    let (mut tap, stats) = start(&format!("http://{addr}"), &config, quick()).expect("start");
    tap.written(&[record()]);
    wait_for("giving up", || stats.failed() == 1).await;
    assert!(state.requests.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn closing_the_tap_sends_what_is_queued() {
    let state = Arc::new(Collector::default());
    let addr = collector(state.clone()).await;
    let options = OtlpOptions {
        linger: Duration::from_secs(30),
        ..quick()
    };
    let (mut tap, stats) = start(
        &format!("http://{addr}"),
        &UpstreamConfig::default(),
        options,
    )
    .expect("start");
    tap.written(&[record()]);
    // The batch would linger 30 s; the log closing (the tap dropped) cuts that short.
    drop(tap);
    wait_for("the last batch", || stats.exported() == 1).await;
}

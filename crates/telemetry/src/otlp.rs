//! OTLP/HTTP export of one span per request (`--otlp URL` → `POST URL/v1/traces`, protobuf).
//!
//! ```text
//! audit writer thread ──Tap::written──▶ bounded queue ──▶ exporter thread: batch ─▶ POST ─▶ collector
//!   (outcome records only;              (full: the span      (≤ 512 spans or 200 ms;   (retried with
//!    never waits)                        is dropped, counted)  own tokio runtime)         backoff, bounded)
//! ```
//!
//! The audit writer must never wait for a collector, so [`OtlpTap`] only clones each outcome
//! record into a bounded channel with `try_send`; when the channel is full the span is dropped
//! and counted ([`OtlpStats::dropped`]) — the audit log still has the record. One exporter thread
//! with its own current-thread runtime turns records into spans, batches them and POSTs
//! `ExportTraceServiceRequest`s; a failed POST (connection error, timeout, 429, 502, 503, 504) is
//! retried with doubling backoff (honouring `Retry-After`) up to [`OtlpOptions::attempts`] times,
//! then the batch is given up and counted ([`OtlpStats::failed`]). A collector's partial-success
//! answer counts its rejected spans ([`OtlpStats::rejected`]). When the audit log closes, the
//! queue is drained and the last batch sent.
//!
//! The collector is reached through the guarded upstream dialer like every other byte latchkey
//! sends. The operator named it, so the addresses its name resolves to are opened for this client
//! alone (a collector on loopback or a private network works without `--allow-private`, which
//! would open them to sandboxes too); latchkey's own listeners stay refused. `--resolve` pins and
//! `--upstream-ca` apply.
//!
//! The span ([`span_of`]): ids from the record (`trace_id`, `span_id`, `parent_span_id`, filled
//! from the sandbox's `traceparent`), random ones when it has none; name `"{METHOD} {host}"`; kind
//! CLIENT; start `ts`, end `ts + duration_ms`; status ERROR for a denial or a 5xx (message: the
//! reason). Attributes: HTTP semantic conventions (`http.request.method`, `url.full`,
//! `url.scheme`, `server.address`, `server.port`, `http.response.status_code`,
//! `client.address`, `client.port`, `network.peer.address`, `network.peer.port` — the address
//! dialed, only when one was —, `error.type`), latchkey's own (`latchkey.decision`, `.reason`,
//! `.rule`, `.identity`, `.audit.id`, `.secrets` — names —, `.policy`, `.session`, `.step`,
//! `.attempt`, `.labels.KEY`, `.original_dst` — where a redirected client was going —, ...), and on
//! a model-provider call the GenAI conventions (`gen_ai.system` and `gen_ai.provider.name`: the
//! provider, `gen_ai.request.model`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`).
//! Resource: `service.name = latchkey`, `service.version`. DNS queries and approval answers are
//! not requests and get no span.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{
    any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};
use opentelemetry_semantic_conventions::attribute as semconv;
use prost::Message;
use tokio::sync::mpsc;

use crate::audit::{Phase, Record, Tap};
use crate::upstream::{self, Client, Connector, Dialer, UpstreamConfig};
use crate::wire::cidr::Cidr;
use crate::wire::host::{display_authority, Bracketed};

/// Why the exporter could not start. Messages name the URL (never with credentials: a URL
/// carrying any is refused).
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("--otlp {url:?}: {why}")]
    BadUrl { url: String, why: String },
    #[error("--otlp: {0}")]
    Tls(#[from] upstream::UpstreamError),
    #[error("cannot start the OTLP exporter thread: {0}")]
    Thread(std::io::Error),
}

/// How the exporter queues, batches and retries.
#[derive(Debug, Clone)]
pub struct OtlpOptions {
    /// Spans waiting to be sent; past this, new ones are dropped (and counted).
    pub queue: usize,
    /// At most this many spans in one request.
    pub batch: usize,
    /// How long a batch gathers after its first span.
    pub linger: Duration,
    /// Tries per batch, the first included.
    pub attempts: u32,
    /// The first retry waits this long, each next one twice as long, up to `backoff_cap`.
    pub backoff_first: Duration,
    pub backoff_cap: Duration,
    /// One whole exchange (connect, send, response).
    pub timeout: Duration,
}

impl Default for OtlpOptions {
    fn default() -> Self {
        Self {
            queue: 4096,
            batch: 512,
            linger: Duration::from_millis(200),
            attempts: 5,
            backoff_first: Duration::from_millis(250),
            backoff_cap: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
        }
    }
}

/// At most this much of a collector's answer is read.
const MAX_RESPONSE: usize = 64 * 1024;

/// What the exporter did, counted in spans (batches and retries in requests).
#[derive(Debug, Default)]
pub struct OtlpStats {
    exported: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    rejected: AtomicU64,
    batches: AtomicU64,
    retries: AtomicU64,
}

impl OtlpStats {
    /// Spans the collector accepted.
    pub fn exported(&self) -> u64 {
        self.exported.load(Ordering::Relaxed)
    }
    /// Spans dropped because the queue was full (or the exporter gone).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
    /// Spans given up after every attempt failed, or refused outright by the collector.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
    /// Spans a collector's partial-success answer said it rejected.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }
    /// Requests that reached a 2xx answer.
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }
    /// Requests sent again after a retryable failure.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }
}

/// `URL` as the traces endpoint: `/v1/traces` appended to its path (as OTLP/HTTP exporters do
/// with a base endpoint), unless the path already ends with it. `http` or `https`, a host, no
/// credentials, no query or fragment.
pub fn traces_url(raw: &str) -> Result<http::Uri, OtlpError> {
    let bad = |why: &str| OtlpError::BadUrl {
        url: shown(raw),
        why: why.to_string(),
    };
    let mut url = url::Url::parse(raw).map_err(|e| bad(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("the scheme must be http or https (OTLP/HTTP)"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(
            "credentials in the URL are refused (they would show in logs)",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("a query or fragment has no meaning here"));
    }
    let path = url.path().trim_end_matches('/').to_string();
    if !path.ends_with("/v1/traces") {
        url.set_path(&format!("{path}/v1/traces"));
    }
    http::Uri::try_from(url.as_str()).map_err(|e| bad(&e.to_string()))
}

/// `raw` as an error message may quote it: without its credentials, if it has any.
fn shown(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut u) if !u.username().is_empty() || u.password().is_some() => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        Ok(_) => raw.to_string(),
        // Unparsed, it cannot be told apart safely: quote it only when nothing in it can be
        // userinfo.
        Err(_) if raw.contains('@') => "(the URL given)".to_string(),
        Err(_) => raw.to_string(),
    }
}

/// Hands outcome records to the exporter thread without ever waiting: the audit writer's tap.
pub struct OtlpTap {
    tx: mpsc::Sender<Record>,
    stats: Arc<OtlpStats>,
}

impl OtlpTap {
    fn offer(&mut self, record: &Record) {
        if !spanned(record) {
            return;
        }
        if self.tx.try_send(record.clone()).is_err() {
            let before = self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            // Said on the first drop and every 1000th after, not once per span.
            if before.is_multiple_of(1000) {
                tracing::warn!(
                    dropped = before + 1,
                    "the OTLP export queue is full; spans are dropped (the audit log keeps every record)"
                );
            }
        }
    }
}

impl Tap for OtlpTap {
    fn written(&mut self, records: &[Record]) {
        for r in records {
            self.offer(r);
        }
    }
}

/// Whether a record becomes a span: a request's (or connection's) outcome, not a DNS query nor
/// an approval's answer.
fn spanned(r: &Record) -> bool {
    r.phase == Phase::Outcome && !matches!(r.method.as_deref(), Some("DNS" | "APPROVAL"))
}

/// Starts the exporter for `--otlp url`: checks the URL and TLS settings now, starts the
/// exporter thread, and returns the tap for the audit writer and the counters. The thread ends
/// (after sending what is queued) when the tap is dropped.
pub fn start(
    url: &str,
    upstream: &UpstreamConfig,
    options: OtlpOptions,
) -> Result<(OtlpTap, Arc<OtlpStats>), OtlpError> {
    let endpoint = traces_url(url)?;
    let tls = Arc::new(upstream::tls_config(upstream.extra_ca.as_deref())?);
    let stats = Arc::new(OtlpStats::default());
    let (tx, rx) = mpsc::channel(options.queue.max(1));
    let exporter = Exporter {
        host: collector_host(&endpoint),
        port: endpoint
            .port_u16()
            .unwrap_or(if endpoint.scheme_str() == Some("https") {
                443
            } else {
                80
            }),
        endpoint,
        pins: upstream.resolve.clone(),
        dialer: Arc::new(Dialer::new(upstream)),
        tls,
        client: None,
        stats: stats.clone(),
        options,
        warned: false,
    };
    std::thread::Builder::new()
        .name("latchkey-otlp".into())
        .spawn(move || exporter.run(rx))
        .map_err(OtlpError::Thread)?;
    Ok((
        OtlpTap {
            tx,
            stats: stats.clone(),
        },
        stats,
    ))
}

/// The collector's host as a name or a bare address (`Uri` keeps an IPv6 address's brackets).
fn collector_host(endpoint: &http::Uri) -> String {
    let host = endpoint.host().unwrap_or_default();
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .to_ascii_lowercase()
}

/// The exporter thread's state.
struct Exporter {
    endpoint: http::Uri,
    /// The collector's host (a name, or an address without brackets) and port, for opening its
    /// addresses.
    host: String,
    port: u16,
    pins: HashMap<String, IpAddr>,
    dialer: Arc<Dialer>,
    tls: Arc<rustls::ClientConfig>,
    /// The client whose connector opens the collector's addresses; rebuilt (re-resolving the
    /// name) after a failed exchange.
    client: Option<Client>,
    stats: Arc<OtlpStats>,
    options: OtlpOptions,
    /// A failure was said on the log; the next success says it recovered.
    warned: bool,
}

/// How one attempt ended.
enum Sent {
    Accepted {
        rejected: u64,
    },
    Retry {
        why: String,
        after: Option<Duration>,
    },
    Refused {
        why: String,
    },
}

impl Exporter {
    fn run(mut self, mut rx: mpsc::Receiver<Record>) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the OTLP exporter's runtime; no spans are exported");
                // Dropping the receiver makes every later span count as dropped.
                return;
            }
        };
        runtime.block_on(async move {
            let mut batch: Vec<Record> = Vec::with_capacity(self.options.batch.min(1024));
            loop {
                let Some(first) = rx.recv().await else { break };
                batch.push(first);
                let deadline = tokio::time::Instant::now() + self.options.linger;
                let mut closed = false;
                while batch.len() < self.options.batch {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(r)) => batch.push(r),
                        Ok(None) => {
                            closed = true;
                            break;
                        }
                        Err(_) => break,
                    }
                }
                self.export(&batch).await;
                batch.clear();
                if closed {
                    break;
                }
            }
        });
    }

    /// Sends one batch, retrying what may succeed later; counts the outcome.
    async fn export(&mut self, batch: &[Record]) {
        let spans = batch.len() as u64;
        let body = Bytes::from(request_of(batch).encode_to_vec());
        let mut backoff = self.options.backoff_first;
        for attempt in 1..=self.options.attempts.max(1) {
            match self.send(body.clone()).await {
                Sent::Accepted { rejected } => {
                    let rejected = rejected.min(spans);
                    self.stats.batches.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .exported
                        .fetch_add(spans - rejected, Ordering::Relaxed);
                    if rejected > 0 {
                        self.stats.rejected.fetch_add(rejected, Ordering::Relaxed);
                        tracing::warn!(
                            rejected,
                            spans,
                            "the OTLP collector rejected part of a batch"
                        );
                    }
                    if std::mem::take(&mut self.warned) {
                        tracing::info!("the OTLP collector accepts spans again");
                    }
                    return;
                }
                Sent::Refused { why } => {
                    self.give_up(spans, &why);
                    return;
                }
                Sent::Retry { why, after } => {
                    if attempt == self.options.attempts.max(1) {
                        self.give_up(spans, &why);
                        return;
                    }
                    self.stats.retries.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(attempt, error = %why, "OTLP export failed; retrying");
                    let wait = after.unwrap_or(backoff).min(self.options.backoff_cap);
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(self.options.backoff_cap);
                }
            }
        }
    }

    fn give_up(&mut self, spans: u64, why: &str) {
        self.stats.failed.fetch_add(spans, Ordering::Relaxed);
        self.warned = true;
        tracing::warn!(
            spans,
            otlp.endpoint = %self.endpoint,
            error = %why,
            "cannot export spans over OTLP; they are given up (the audit log keeps every record)"
        );
    }

    /// The client for the collector, built (its name resolved) when there is none.
    async fn client(&mut self) -> Result<Client, String> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let addrs: Vec<IpAddr> = if let Ok(ip) = self.host.parse::<IpAddr>() {
            vec![ip]
        } else if let Some(ip) = self.pins.get(&self.host) {
            vec![*ip]
        } else {
            tokio::net::lookup_host((self.host.as_str(), self.port))
                .await
                .map_err(|e| format!("cannot resolve {}: {e}", self.host))?
                .map(|a: SocketAddr| a.ip())
                .collect()
        };
        let extra: Vec<Cidr> = addrs.into_iter().map(Cidr::from).collect();
        let client = upstream::client(Connector::new(self.dialer.clone(), self.tls.clone(), extra));
        self.client = Some(client.clone());
        Ok(client)
    }

    /// One POST of `body`.
    async fn send(&mut self, body: Bytes) -> Sent {
        let client = match self.client().await {
            Ok(c) => c,
            Err(why) => return Sent::Retry { why, after: None },
        };
        let req = http::Request::post(self.endpoint.clone())
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .header(
                http::header::USER_AGENT,
                concat!("latchkey/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(body).map_err(|never| match never {}).boxed());
        let req = match req {
            Ok(r) => r,
            Err(e) => return Sent::Refused { why: e.to_string() },
        };
        let exchange = async {
            let res =
                client
                    .request(req)
                    .await
                    .map_err(|e| match upstream::find_upstream_error(&e) {
                        Some(u) => u.to_string(),
                        None => e.to_string(),
                    })?;
            let status = res.status();
            let after = res
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let body = Limited::new(res.into_body(), MAX_RESPONSE)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            Ok::<_, String>((status, after, body))
        };
        let (status, after, body) = match tokio::time::timeout(self.options.timeout, exchange).await
        {
            Ok(Ok(answer)) => answer,
            Ok(Err(why)) => {
                self.client = None;
                return Sent::Retry { why, after: None };
            }
            Err(_) => {
                self.client = None;
                return Sent::Retry {
                    why: format!("no answer within {:?}", self.options.timeout),
                    after: None,
                };
            }
        };
        if status.is_success() {
            let rejected = ExportTraceServiceResponse::decode(body.as_ref())
                .ok()
                .and_then(|r| r.partial_success)
                .map_or(0, |p| u64::try_from(p.rejected_spans).unwrap_or(0));
            return Sent::Accepted { rejected };
        }
        let why = format!("the collector answered {status}");
        match status.as_u16() {
            429 | 502 | 503 | 504 => Sent::Retry { why, after },
            _ => Sent::Refused { why },
        }
    }
}

/// The export request of `batch`: one resource (latchkey), one scope, a span per record.
pub fn request_of(batch: &[Record]) -> ExportTraceServiceRequest {
    let version = env!("CARGO_PKG_VERSION");
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv(semconv::SERVICE_NAME, string("latchkey")),
                    kv(semconv::SERVICE_VERSION, string(version)),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "latchkey".into(),
                    version: version.into(),
                    ..Default::default()
                }),
                spans: batch.iter().map(span_of).collect(),
                schema_url: opentelemetry_semantic_conventions::SCHEMA_URL.into(),
            }],
            schema_url: opentelemetry_semantic_conventions::SCHEMA_URL.into(),
        }],
    }
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn string(s: &str) -> any_value::Value {
    any_value::Value::StringValue(s.to_string())
}

fn int(n: u64) -> any_value::Value {
    any_value::Value::IntValue(i64::try_from(n).unwrap_or(i64::MAX))
}

/// `text` (hex) as exactly `N` bytes, not all zero (an all-zero id is invalid in W3C trace
/// context).
fn id_from_hex<const N: usize>(text: Option<&str>) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    hex::decode_to_slice(text?, &mut out).ok()?;
    out.iter().any(|b| *b != 0).then_some(out)
}

/// A random non-zero id.
fn random_id<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    if aws_lc_rs::rand::fill(&mut out).is_err() || out.iter().all(|b| *b == 0) {
        // An id correlates, it protects nothing: the clock will do if the RNG fails.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(1)
            .max(1);
        for (i, b) in out.iter_mut().enumerate() {
            *b = (nanos >> (8 * (i % 16))) as u8;
        }
        out[0] |= 1;
    }
    out
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Methods HTTP semantic conventions know; any other is sent as `_OTHER` with the method in
/// `http.request.method_original`.
const KNOWN_METHODS: &[&str] = &[
    "CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE", "QUERY",
];

/// The span of one outcome record (see the module docs for the mapping).
pub fn span_of(r: &Record) -> Span {
    let trace = id_from_hex::<16>(r.trace_id.as_deref());
    // A parent only means something inside the trace the sandbox named.
    let parent = trace.and(id_from_hex::<8>(r.parent_span_id.as_deref()));
    let method = r.method.as_deref();
    let host = r.host.as_deref().filter(|h| !h.is_empty());
    let name = match (method, host) {
        (Some(m), Some(h)) => format!("{m} {h}"),
        (Some(m), None) => m.to_string(),
        (None, Some(h)) => format!("connection {h}"),
        (None, None) => "connection".to_string(),
    };
    let start = unix_nanos(r.ts);
    let end = start.saturating_add(r.duration_ms.saturating_mul(1_000_000));
    let denied = r.decision != "allow";
    let server_error = r.status.is_some_and(|s| s >= 500);

    let mut a = Vec::with_capacity(24);
    http_attributes(r, method, host, &mut a);
    peer_attributes(r, &mut a);
    if denied {
        a.push(kv(semconv::ERROR_TYPE, string(r.reason)));
    } else if let Some(s) = r.status.filter(|_| server_error) {
        a.push(kv(semconv::ERROR_TYPE, string(&s.to_string())));
    }
    latchkey_attributes(r, &mut a);
    if let Some(u) = &r.usage {
        usage_attributes(u, &mut a);
    }

    let status = if denied || server_error {
        Status {
            code: status::StatusCode::Error as i32,
            message: r.reason.to_string(),
        }
    } else {
        Status::default()
    };
    Span {
        trace_id: trace.unwrap_or_else(random_id::<16>).to_vec(),
        span_id: id_from_hex::<8>(r.span_id.as_deref())
            .filter(|_| trace.is_some())
            .unwrap_or_else(random_id::<8>)
            .to_vec(),
        parent_span_id: parent.map(|p| p.to_vec()).unwrap_or_default(),
        name,
        kind: span::SpanKind::Client as i32,
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        attributes: a,
        status: Some(status),
        ..Default::default()
    }
}

/// The HTTP semantic-convention attributes: method, URL, server, status.
fn http_attributes(r: &Record, method: Option<&str>, host: Option<&str>, a: &mut Vec<KeyValue>) {
    if let Some(m) = method {
        if KNOWN_METHODS.contains(&m) {
            a.push(kv(semconv::HTTP_REQUEST_METHOD, string(m)));
        } else {
            a.push(kv(semconv::HTTP_REQUEST_METHOD, string("_OTHER")));
            a.push(kv(semconv::HTTP_REQUEST_METHOD_ORIGINAL, string(m)));
        }
    }
    if let (Some(scheme), Some(h), Some(path)) = (r.scheme.as_deref(), host, r.path.as_deref()) {
        let default = matches!((scheme, r.port), ("https", Some(443)) | ("http", Some(80)));
        let full = match r.port {
            Some(p) if !default => format!("{scheme}://{}{path}", display_authority(h, p)),
            _ => format!("{scheme}://{}{path}", Bracketed(h)),
        };
        a.push(kv(semconv::URL_FULL, string(&full)));
    }
    if let Some(scheme) = r.scheme.as_deref() {
        a.push(kv(semconv::URL_SCHEME, string(scheme)));
    }
    if let Some(h) = host {
        a.push(kv(semconv::SERVER_ADDRESS, string(h)));
    }
    if let Some(p) = r.port {
        a.push(kv(semconv::SERVER_PORT, int(u64::from(p))));
    }
    if let Some(s) = r.status {
        a.push(kv(semconv::HTTP_RESPONSE_STATUS_CODE, int(u64::from(s))));
    }
}

/// The client and the upstream peer dialed.
fn peer_attributes(r: &Record, a: &mut Vec<KeyValue>) {
    match r.client.parse::<SocketAddr>() {
        Ok(c) => {
            a.push(kv(semconv::CLIENT_ADDRESS, string(&c.ip().to_string())));
            a.push(kv(semconv::CLIENT_PORT, int(u64::from(c.port()))));
        }
        Err(_) if !r.client.is_empty() => a.push(kv(semconv::CLIENT_ADDRESS, string(&r.client))),
        Err(_) => {}
    }
    if let Some(u) = r
        .upstream
        .as_deref()
        .and_then(|u| u.parse::<SocketAddr>().ok())
    {
        a.push(kv(
            semconv::NETWORK_PEER_ADDRESS,
            string(&u.ip().to_string()),
        ));
        a.push(kv(semconv::NETWORK_PEER_PORT, int(u64::from(u.port()))));
    }
}

/// latchkey's own attributes: the decision, who, the record and what was measured.
fn latchkey_attributes(r: &Record, a: &mut Vec<KeyValue>) {
    a.push(kv("latchkey.decision", string(r.decision)));
    a.push(kv("latchkey.reason", string(r.reason)));
    if let Some(rule) = &r.rule {
        a.push(kv("latchkey.rule", string(rule)));
    }
    a.push(kv("latchkey.identity", string(&r.identity)));
    a.push(kv("latchkey.audit.id", string(&r.id)));
    a.push(kv(
        "latchkey.secrets",
        any_value::Value::ArrayValue(ArrayValue {
            values: r
                .secrets
                .iter()
                .map(|s| AnyValue {
                    value: Some(string(s)),
                })
                .collect(),
        }),
    ));
    if let Some(d) = &r.original_dst {
        // Where a redirected client was going; `network.peer.*` is only what was dialed.
        a.push(kv("latchkey.original_dst", string(d)));
    }
    a.push(kv("latchkey.policy", string(&r.policy)));
    a.push(kv("latchkey.bytes_up", int(r.bytes_up)));
    a.push(kv("latchkey.bytes_down", int(r.bytes_down)));
    if r.would_deny {
        a.push(kv("latchkey.would_deny", any_value::Value::BoolValue(true)));
    }
    if r.redactions > 0 {
        a.push(kv("latchkey.redactions", int(r.redactions)));
    }
    if let Some(reach) = &r.reach {
        a.push(kv("latchkey.reach", string(reach)));
    }
    if let Some(s) = &r.session {
        a.push(kv("latchkey.session", string(s)));
    }
    if let Some(s) = &r.step {
        a.push(kv("latchkey.step", string(s)));
    }
    if let Some(n) = r.attempt {
        a.push(kv("latchkey.attempt", int(u64::from(n))));
    }
    for (k, v) in &r.labels {
        a.push(kv(&format!("latchkey.labels.{k}"), string(v)));
    }
}

/// A model-provider call's usage, as the GenAI conventions name it.
fn usage_attributes(u: &crate::audit::UsageInfo, a: &mut Vec<KeyValue>) {
    // `gen_ai.system` is what the conventions named the provider until they renamed it
    // `gen_ai.provider.name`; backends read one or the other, so both are sent.
    #[allow(deprecated)]
    {
        a.push(kv(semconv::GEN_AI_SYSTEM, string(u.provider)));
        a.push(kv(semconv::GEN_AI_PROVIDER_NAME, string(u.provider)));
        if let Some(m) = &u.model {
            a.push(kv(semconv::GEN_AI_REQUEST_MODEL, string(m)));
        }
        a.push(kv(semconv::GEN_AI_USAGE_INPUT_TOKENS, int(u.input_tokens)));
        a.push(kv(
            semconv::GEN_AI_USAGE_OUTPUT_TOKENS,
            int(u.output_tokens),
        ));
        if u.cached_input_tokens > 0 {
            a.push(kv(
                semconv::GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
                int(u.cached_input_tokens),
            ));
        }
    }
    if let Some(cost) = u.cost {
        a.push(kv(
            "latchkey.usage.cost",
            any_value::Value::DoubleValue(cost),
        ));
    }
    a.push(kv("latchkey.usage.source", string(u.source)));
}

#[cfg(test)]
#[path = "otlp_tests.rs"]
mod tests;

//! The proxy: listener, CONNECT handling with TLS interception, and the request pipeline.
//!
//! A connection's path, top to bottom:
//!
//! ```text
//! accept ─▶ HTTP/1.1 proxy hop ─┬─ absolute-form http:// ─▶ pipeline::handle
//!                               └─ CONNECT ─▶ connect::handle (gate before TLS)
//!                                     ├─ tunnel = true ─▶ guarded dial, raw relay
//!                                     └─ intercept ─▶ whole ClientHello, SNI check, leaf cert
//!                                                     ─▶ h1/h2 ─▶ pipeline::handle per request
//! ```
//!
//! Parse errors on the proxy hop (malformed request line, header block over the limit) are
//! answered by hyper and audited here.

mod body;
pub mod budget;
pub mod ca;
mod connect;
mod credentials;
mod decode;
pub mod limits;
mod outbound;
mod pipeline;
mod respond;
mod response;
mod scrub_body;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::{Method, Request};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

pub use ca::{CertAuthority, InitOutcome};
// Moved to the `wire` leaf module (policy uses them too); re-exported so `super::hop` and
// `super::path` keep working inside the proxy.
pub use crate::wire::{hop, path};
pub use credentials::SCAN_LIMIT;
pub use pipeline::Ctx;

use crate::audit::{AuditLog, Entry};
use crate::policy::Policy;
use crate::reason::Reason;
use crate::upstream::{self, Client, Connector, Dialer, UpstreamConfig, UpstreamError};

/// Largest request header block accepted on the proxy hop and inside intercepted connections.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
const IDENTITY_DEFAULT: &str = "default";

/// Whether a header block exceeds [`MAX_HEADER_BYTES`] as counted on the wire
/// (`name: value\r\n`). hyper's read buffer limit is approximate, so this is the exact check.
fn headers_too_large(headers: &http::HeaderMap) -> bool {
    let len: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    len > MAX_HEADER_BYTES
}

/// The denial message while the audit log cannot be written.
const AUDIT_DOWN: &str =
    "the audit log cannot be written; latchkey refuses traffic until it can (see its log)";

/// Everything a running proxy shares across connections.
pub struct Proxy {
    /// The policy in force; a reload swaps it atomically, and requests already running keep
    /// the one they started with (their audit record's `policy` digest says which).
    policy: ArcSwap<Policy>,
    policies_dir: PathBuf,
    reload_state: std::sync::Mutex<ReloadState>,
    reload_lock: tokio::sync::Mutex<()>,
    /// `--mode report`: every policy denial is let through and marked `would_deny`.
    report_all: bool,
    /// An empty rule under which report-only traffic that matched no rule is forwarded.
    report_rule: crate::policy::Rule,
    started: std::time::Instant,
    shutdown: tokio::sync::watch::Sender<bool>,
    ca: CertAuthority,
    audit: Arc<AuditLog>,
    /// The pooled client for rules without their own `allow_private` ranges.
    client: Client,
    /// One pooled client per distinct `allow_private` set, made on first use.
    rule_clients: std::sync::Mutex<std::collections::HashMap<Vec<upstream::Cidr>, Client>>,
    tls: Arc<rustls::ClientConfig>,
    dialer: Arc<Dialer>,
    response_timeout: Duration,
    /// Cap on the decoded size of one scanned response body.
    max_decoded_body: u64,
    handshake_timeout: Duration,
    limits: limits::Limits,
    connections: Arc<limits::ConnectionCounter>,
    /// Every request-body byte latchkey holds is charged here (`--max-buffered-bytes`).
    budget: Arc<budget::Budget>,
    /// A request body that sends nothing for this long is cut (`--body-timeout`).
    body_timeout: Duration,
}

/// How to build a [`Proxy`].
pub struct ProxyConfig {
    pub policy: Policy,
    pub ca: CertAuthority,
    pub audit: AuditLog,
    pub upstream: UpstreamConfig,
    /// How long to wait for an upstream's response headers.
    pub response_timeout: Duration,
    pub limits: limits::Limits,
    /// Where the policy was loaded from, for reloads.
    pub policies_dir: PathBuf,
    /// `--mode report`.
    pub report_all: bool,
    /// Cap on the decoded size of one scanned response body (`--max-decoded-body`).
    pub max_decoded_body: u64,
    /// `--max-buffered-bytes`: request-body bytes held at once, across every client.
    pub max_buffered_bytes: usize,
    /// `--max-buffered-bytes-per-client`: one client address's share of it.
    pub max_buffered_bytes_per_client: usize,
    /// `--body-timeout`.
    pub body_timeout: Duration,
}

/// The outcome of the last reload, for `/status`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReloadState {
    /// RFC 3339 time of the last successful load.
    pub last_ok: Option<String>,
    /// The error of the last failed reload, cleared by a successful one.
    pub last_error: Option<String>,
    pub reloads: u64,
    pub errors: u64,
}

impl Proxy {
    pub fn new(config: ProxyConfig) -> Result<Arc<Self>, UpstreamError> {
        let tls = Arc::new(upstream::tls_config(config.upstream.extra_ca.as_deref())?);
        let dialer = Arc::new(Dialer::new(&config.upstream));
        let client = upstream::client(Connector::new(dialer.clone(), tls.clone(), Vec::new()));
        let (shutdown, _) = tokio::sync::watch::channel(false);
        Ok(Arc::new(Self {
            policy: ArcSwap::from_pointee(config.policy),
            policies_dir: config.policies_dir,
            reload_state: std::sync::Mutex::new(ReloadState {
                last_ok: Some(
                    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
                ),
                ..ReloadState::default()
            }),
            reload_lock: tokio::sync::Mutex::new(()),
            report_all: config.report_all,
            report_rule: crate::policy::Rule::report_only(),
            started: std::time::Instant::now(),
            shutdown,
            ca: config.ca,
            audit: Arc::new(config.audit),
            client,
            rule_clients: std::sync::Mutex::new(std::collections::HashMap::new()),
            tls,
            dialer,
            response_timeout: config.response_timeout,
            max_decoded_body: config.max_decoded_body,
            handshake_timeout: Duration::from_secs(10),
            limits: config.limits,
            connections: Arc::new(limits::ConnectionCounter::default()),
            budget: budget::Budget::new(
                config.max_buffered_bytes,
                config.max_buffered_bytes_per_client,
            ),
            body_timeout: config.body_timeout,
        }))
    }

    /// The way the signing module reaches token endpoints: this proxy's guarded client, each
    /// exchange audited with `rule = "credential:NAME"` for the sandbox that caused it.
    pub fn exchanger(
        self: &Arc<Self>,
        client: SocketAddr,
        identity: Arc<str>,
    ) -> Box<crate::signing::Exchanger> {
        let proxy = self.clone();
        Box::new(move |ex: crate::signing::Exchange| {
            let proxy = proxy.clone();
            let identity = identity.clone();
            Box::pin(async move { proxy.exchange(ex, client, &identity).await })
        })
    }

    async fn exchange(
        &self,
        ex: crate::signing::Exchange,
        client: SocketAddr,
        identity: &str,
    ) -> Result<(u16, bytes::Bytes), String> {
        use http_body_util::BodyExt;
        let policy = self.policy();
        self.audit.room().await;
        let mut entry = Entry::start(self.audit.clone(), client, identity, policy.digest());
        entry.scrub_with(policy.secrets().clone());
        let uri: http::Uri = ex.url.parse().map_err(|e| format!("invalid URL: {e}"))?;
        let rule = crate::signing::token_name(&ex.credential);
        entry.update(|r| {
            r.method = Some("POST".to_string());
            r.scheme = uri.scheme_str().map(str::to_string);
            r.host = uri.host().map(str::to_ascii_lowercase);
            r.port = uri.port_u16().or(Some(443));
            r.path = Some(uri.path().to_string());
            r.rule = Some(rule.clone());
        });
        let mut req = http::Request::post(uri.clone());
        for (k, v) in ex.headers {
            req = req.header(k, v);
        }
        let req = req
            .body(body::full(ex.body))
            .map_err(|e| format!("cannot build the request: {e}"))?;
        let sent = tokio::time::timeout(self.response_timeout, self.client.request(req)).await;
        let res = match sent {
            Ok(Ok(res)) => res,
            Ok(Err(e)) => {
                let why = match upstream::find_upstream_error(&e) {
                    Some(u) => u.to_string(),
                    None => e.to_string(),
                };
                entry.outcome(Reason::CredentialFailed, Some(&rule), None);
                entry.finish();
                return Err(why);
            }
            Err(_) => {
                entry.outcome(Reason::UpstreamTimeout, Some(&rule), None);
                entry.finish();
                return Err("timed out".to_string());
            }
        };
        let status = res.status().as_u16();
        let upstream_addr = res
            .extensions()
            .get::<upstream::UpstreamAddr>()
            .map(|a| a.0);
        let counters = entry.counters();
        // Token responses are small; refuse anything absurd rather than buffer it.
        let limited = http_body_util::Limited::new(res.into_body(), 1024 * 1024);
        let bytes = match limited.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                entry.outcome(Reason::CredentialFailed, Some(&rule), Some(status));
                entry.finish();
                return Err(format!("cannot read the response: {e}"));
            }
        };
        counters
            .down
            .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.metrics()
            .secret_fetches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let reason = if (200..300).contains(&status) {
            Reason::Allowed
        } else {
            Reason::CredentialFailed
        };
        entry.outcome(reason, Some(&rule), Some(status));
        entry.update(|r| r.upstream = upstream_addr.map(|a| a.to_string()));
        entry.finish();
        Ok((status, bytes))
    }

    /// The client whose connector opens exactly `extra` on top of `--allow-private`.
    fn client_for(&self, extra: &[upstream::Cidr]) -> Client {
        if extra.is_empty() {
            return self.client.clone();
        }
        let mut map = self
            .rule_clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(extra.to_vec())
            .or_insert_with(|| {
                upstream::client(Connector::new(
                    self.dialer.clone(),
                    self.tls.clone(),
                    extra.to_vec(),
                ))
            })
            .clone()
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// The metrics shared with the audit log.
    pub fn metrics(&self) -> &Arc<crate::metrics::Metrics> {
        self.audit.metrics()
    }

    /// Point-in-time gauges for `/metrics` and `/status`.
    pub fn gauges(&self) -> crate::metrics::Gauges {
        let policy = self.policy();
        crate::metrics::Gauges {
            connections_active: self.connections.open() as u64,
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            policy_rules: policy.rules().len() as u64,
            policy_info: policy.digest().to_string(),
            audit_healthy: self.audit.is_healthy(),
        }
    }

    /// The audit log every record goes to.
    pub fn audit(&self) -> &Arc<AuditLog> {
        &self.audit
    }

    /// The last reload's outcome.
    pub fn reload_state(&self) -> ReloadState {
        self.reload_state
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// Loads, validates and compiles the policy directory, then swaps it in. An invalid set
    /// leaves the policy in force untouched; the error is kept for `/status` and counted.
    /// Returns whether the policy changed.
    pub async fn reload(&self, why: &str) -> Result<bool, String> {
        let _one_at_a_time = self.reload_lock.lock().await;
        let dir = self.policies_dir.clone();
        let loaded = tokio::task::spawn_blocking(move || crate::policy::load_dir(&dir))
            .await
            .map_err(|e| format!("reload task failed: {e}"));
        let result = match loaded {
            Ok(Ok(policy)) => Ok(policy),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(e),
        };
        let metrics = self.metrics().clone();
        let mut state = self
            .reload_state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match result {
            Ok(policy) => {
                let old = self.policy.load();
                let changed = old.digest() != policy.digest();
                state.last_ok = Some(
                    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
                );
                state.last_error = None;
                if changed {
                    tracing::info!(why, policy.digest = %policy.digest(), policy.rules = policy.rules().len(), "policy reloaded");
                    // Values handed out under the old policy stay redacted under the new one.
                    policy.secrets().carry_over_from(old.secrets());
                    self.policy.store(Arc::new(policy));
                    state.reloads += 1;
                    metrics
                        .policy_reloads
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(changed)
            }
            Err(e) => {
                tracing::error!(why, error = %e, "policy reload refused; the policy in force stays");
                state.last_error = Some(e.clone());
                state.errors += 1;
                metrics
                    .policy_reload_errors
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Reloads on SIGHUP and whenever a policy file changes (polled each second, so editors'
    /// rename-over saves and symlink swaps of mounted config are seen as well), until shutdown.
    pub async fn watch_policies(self: Arc<Self>) {
        let mut shutdown = self.shutdown.subscribe();
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut last = dir_fingerprint(&self.policies_dir);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            #[cfg(unix)]
            let hup_fut = async {
                match hup.as_mut() {
                    Some(h) => {
                        h.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            #[cfg(not(unix))]
            let hup_fut = std::future::pending::<()>();
            tokio::select! {
                () = hup_fut => {
                    let _ = self.reload("SIGHUP").await;
                }
                _ = tick.tick() => {
                    let now = dir_fingerprint(&self.policies_dir);
                    if now != last {
                        // Debounce: wait until the directory stops changing.
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        let settled = dir_fingerprint(&self.policies_dir);
                        if settled == now {
                            last = settled;
                            let _ = self.reload("policy files changed").await;
                        }
                    }
                }
                _ = shutdown.changed() => return,
            }
        }
    }

    /// A receiver that changes when shutdown begins.
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Whether a graceful shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Starts a graceful shutdown: stop accepting, let connections finish.
    pub fn begin_shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Waits until every connection has closed, or `deadline` passes; returns how many remain.
    pub async fn drain(&self, deadline: Duration) -> usize {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let open = self.connections.open();
            if open == 0 || tokio::time::Instant::now() >= until {
                return open;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Accepts connections until shutdown begins.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let mut shutdown = self.shutdown.subscribe();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => match self.connections.acquire(peer.ip(), &self.limits) {
                        Ok(slot) => {
                            tokio::spawn(self.clone().connection(stream, peer, slot));
                        }
                        Err(why) => {
                            tokio::spawn(self.clone().over_limit(stream, peer, why));
                        }
                    },
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                _ = shutdown.changed() => break,
            }
        }
    }

    /// Answers a connection over the caps with `503` and closes it.
    async fn over_limit(self: Arc<Self>, mut stream: TcpStream, peer: SocketAddr, why: String) {
        use tokio::io::AsyncWriteExt;
        let reason = Reason::TooManyConnections;
        let body = format!("latchkey: refused: {why}\n");
        let head = format!(
            "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-type: text/plain; charset=utf-8\r\nx-latchkey-decision: deny\r\nx-latchkey-rule: none\r\nx-latchkey-reason: {}\r\nretry-after: 1\r\ncontent-length: {}\r\n\r\n{body}",
            reason.code(),
            body.len()
        );
        self.audit.room().await;
        let mut entry = Entry::start(
            self.audit.clone(),
            peer,
            IDENTITY_DEFAULT,
            self.policy.load().digest(),
        );
        entry.outcome(reason, None, Some(503));
        tracing::warn!(client.addr = %peer, why, "connection refused: over limit");
        let _ =
            tokio::time::timeout(Duration::from_secs(2), stream.write_all(head.as_bytes())).await;
        let _ = stream.shutdown().await;
        entry.finish();
    }

    /// Serves one sandbox connection on the proxy hop (HTTP/1.1).
    async fn connection(
        self: Arc<Self>,
        stream: TcpStream,
        peer: SocketAddr,
        _slot: limits::ConnectionSlot,
    ) {
        let _ = stream.set_nodelay(true);
        // A second handle on the socket, so latchkey can still answer `408` after hyper gives up
        // on a header block that never completed (hyper closes without a response).
        let (stream, raw) = match stream
            .into_std()
            .and_then(|s| s.try_clone().map(|c| (s, c)))
            .and_then(|(s, c)| TcpStream::from_std(s).map(|s| (s, c)))
        {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(client.addr = %peer, error = %e, "cannot set up connection");
                return;
            }
        };
        let io = limits::Idle::new(stream, self.limits.idle_timeout);
        let partial = io.partial();
        let ctx = Arc::new(Ctx {
            client: peer,
            identity: Arc::from(IDENTITY_DEFAULT),
            connect: None,
            heads: Some(io.heads()),
        });
        let proxy = self.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let proxy = proxy.clone();
            let ctx = ctx.clone();
            // The Nth request hyper hands over is judged by the Nth raw head on the connection.
            if let Some(heads) = &ctx.heads {
                heads.begin_request();
            }
            async move {
                // identify: per request on the proxy hop (a CONNECT's identity then holds for
                // every request inside it).
                let ctx = match proxy.identify(&req, &ctx).await {
                    Ok(ctx) => ctx,
                    Err(res) => return Ok::<_, Infallible>(res),
                };
                if req.method() == Method::CONNECT {
                    Ok(connect::handle(proxy, ctx, req).await)
                } else {
                    pipeline::handle(proxy, ctx, req).await
                }
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .max_buf_size(MAX_HEADER_BYTES)
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout)
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        tokio::pin!(conn);
        let mut shutdown = self.shutdown.subscribe();
        let result = tokio::select! {
            r = conn.as_mut() => r,
            _ = shutdown.changed() => {
                // Finish the request in flight, then close instead of keeping alive.
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = result {
            if e.is_timeout() {
                // An idle keep-alive connection simply closes; a half-sent request is slowloris.
                if partial.load(std::sync::atomic::Ordering::Relaxed) {
                    self.header_timeout(raw, peer);
                }
                return;
            }
            self.connection_error(&e, peer);
        }
    }

    /// The `408` answer to a stalled header block.
    fn header_timeout_response(&self) -> String {
        let body = format!(
            "latchkey: refused: the request header block did not arrive within {}s\n",
            self.limits.header_timeout.as_secs()
        );
        format!(
            "HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-type: text/plain; charset=utf-8\r\nx-latchkey-decision: deny\r\nx-latchkey-rule: none\r\nx-latchkey-reason: {}\r\ncontent-length: {}\r\n\r\n{body}",
            Reason::HeaderTimeout.code(),
            body.len()
        )
    }

    /// A stalled header block inside an intercepted connection: `408` over TLS, a record.
    async fn header_timeout_tls<T: tokio::io::AsyncWrite + Unpin>(
        &self,
        mut io: T,
        peer: SocketAddr,
    ) {
        use tokio::io::AsyncWriteExt;
        let head = self.header_timeout_response();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            let _ = io.write_all(head.as_bytes()).await;
            let _ = io.shutdown().await;
        })
        .await;
        let mut entry = Entry::start(
            self.audit.clone(),
            peer,
            IDENTITY_DEFAULT,
            self.policy.load().digest(),
        );
        entry.outcome(Reason::HeaderTimeout, None, Some(408));
        entry.finish();
    }

    /// A client sent part of a request and stalled: `408`, an audit record, close.
    fn header_timeout(&self, raw: std::net::TcpStream, peer: SocketAddr) {
        use std::io::Write;
        let reason = Reason::HeaderTimeout;
        let head = self.header_timeout_response();
        // Non-blocking and best effort: the socket may already be gone.
        let mut raw = raw;
        let _ = raw.write(head.as_bytes());
        let _ = raw.shutdown(std::net::Shutdown::Both);
        let mut entry = Entry::start(
            self.audit.clone(),
            peer,
            IDENTITY_DEFAULT,
            self.policy.load().digest(),
        );
        entry.outcome(reason, None, Some(408));
        entry.finish();
    }

    /// Works out which sandbox sent `req`; without identities in the policy, `default`.
    /// An unknown token or an unidentified client gets `407` and an audit record.
    async fn identify(
        &self,
        req: &Request<Incoming>,
        ctx: &Arc<Ctx>,
    ) -> Result<Arc<Ctx>, http::Response<upstream::Body>> {
        let policy = self.policy();
        if policy.identities().is_empty() {
            return Ok(ctx.clone());
        }
        let auth = req
            .headers()
            .get(http::header::PROXY_AUTHORIZATION)
            .map(|v| v.as_bytes());
        match crate::policy::identity::identify(
            policy.identities(),
            policy.secrets(),
            auth,
            ctx.client.ip(),
        )
        .await
        {
            Ok(identity) => Ok(Arc::new(Ctx {
                client: ctx.client,
                identity: Arc::from(identity.name.as_str()),
                connect: None,
                heads: ctx.heads.clone(),
            })),
            Err(e) => {
                let mut entry = Entry::start(
                    self.audit.clone(),
                    ctx.client,
                    "unidentified",
                    policy.digest(),
                );
                let uri = req.uri();
                let connect = req.method() == Method::CONNECT;
                entry.update(|r| {
                    r.method = Some(req.method().to_string());
                    r.host = uri.host().map(str::to_ascii_lowercase);
                    r.scheme = if connect {
                        Some("https".to_string())
                    } else {
                        uri.scheme_str().map(str::to_ascii_lowercase)
                    };
                    r.port = uri.port_u16().or(match r.scheme.as_deref() {
                        Some("http") => Some(80),
                        Some("https") => Some(443),
                        _ => None,
                    });
                    if !connect {
                        r.path = uri
                            .path_and_query()
                            .map(|pq| crate::audit::redact_query(pq.as_str()));
                    }
                });
                let reason = Reason::ProxyAuthRequired;
                let res = respond::refuse(reason, None, &e.to_string(), entry.id());
                entry.outcome(reason, None, Some(res.status().as_u16()));
                entry.finish();
                Err(res)
            }
        }
    }

    /// Audits what hyper refused before our service saw a request.
    fn connection_error(&self, e: &hyper::Error, peer: SocketAddr) {
        let reason = if e.is_parse_too_large() {
            Reason::HeaderTooLarge
        } else if e.is_parse() {
            Reason::BadRequest
        } else {
            tracing::debug!(client.addr = %peer, error = %e, "connection closed with error");
            return;
        };
        let mut entry = Entry::start(
            self.audit.clone(),
            peer,
            IDENTITY_DEFAULT,
            self.policy.load().digest(),
        );
        entry.outcome(reason, None, Some(reason.status().as_u16()));
        tracing::info!(client.addr = %peer, error = %e, "malformed request refused");
        entry.finish();
    }
}

/// A cheap fingerprint of the policy files: names, sizes and modification times.
fn dir_fingerprint(dir: &Path) -> Vec<(PathBuf, u64, Option<std::time::SystemTime>)> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "toml") {
                // metadata() follows symlinks, so a swapped target shows up too.
                if let Ok(m) = std::fs::metadata(&path) {
                    out.push((path, m.len(), m.modified().ok()));
                }
            }
        }
    }
    out.sort();
    out
}

//! The proxy: the state every connection shares, and the modules that serve them.
//!
//! ```text
//! listener ─▶ proxy hop (HTTP/1.1) ─┬─ absolute-form http:// ─▶ pipeline::handle
//!                                   └─ CONNECT ─▶ connect::handle (gate before TLS)
//!                                         ├─ tunnel = true ─▶ guarded dial, raw relay
//!                                         └─ intercept ─▶ whole ClientHello, SNI check, leaf
//!                                                         ─▶ h1/h2 ─▶ pipeline::handle per request
//! transparent / https-listen / http-listen ─▶ transparent (SNI or Host, destination check)
//! socks ─▶ socks (SOCKS5 CONNECT)           ─┴─▶ the CONNECT gate's halves ─▶ the same end
//! ```
//!
//! [`Proxy`] here is shared state only: the generation in force (the policy and its live
//! credential state, [`Generation`]), clients, limits, the audit log.
//! The accept loop and the proxy hop are in `listener`, CONNECT in `connect`, one request's
//! phases in `pipeline`, policy reloads in `reload`. Every record starts at
//! [`Proxy::open_record`] (or [`Proxy::connection_record`]) and every refusal ends at
//! `respond`. Only `upstream` dials.

// The crates this one uses, under the module names the code knows them by.
use latchkey_audit as audit;
use latchkey_governance as governance;
use latchkey_metrics as metrics;
use latchkey_policy as policy;
use latchkey_secrets as secrets;
use latchkey_signing as signing;
use latchkey_state as state;
use latchkey_upstream as upstream;
use latchkey_wire as wire;
use latchkey_wire::files;
use latchkey_wire::reason;

mod body;
mod broker;
pub mod budget;
pub mod ca;
mod capture;
mod connect;
pub mod correlate;
mod decode;
mod exchange;
mod gate;
mod intercepted;
pub mod limits;
mod listener;
mod mcp;
mod mcp_list;
mod mcp_socket;
mod pins;
mod pipeline;
mod reload;
mod request_body;
mod respond;
mod response;
mod scrub_body;
mod session;
pub use session::Attribution;
mod socks;
pub mod transparent;
mod websocket;
mod websocket_held;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

pub use broker::SCAN_LIMIT;
pub use ca::{CertAuthority, InitOutcome};
pub use exchange::{Exchanger, OwnCalls, OWN_IDENTITY};
pub use pins::Pins;
pub use pipeline::Ctx;
pub use pipeline::{open_connection_record, open_record};
pub use reload::{Generation, ReloadError, ReloadState};

use crate::audit::{AuditLog, Entry};
use crate::upstream::{Client, Dialer, UpstreamConfig, UpstreamError};

/// Largest request header block accepted on the proxy hop and inside intercepted connections.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
const IDENTITY_DEFAULT: &str = "default";

/// The denial message while the audit log cannot be written.
const AUDIT_DOWN: &str =
    "the audit log cannot be written; latchkey refuses traffic until it can (see its log)";

/// Everything a running proxy shares across connections.
pub struct Proxy {
    /// The generation in force: the policy and the credential state it runs with. A reload
    /// swaps it atomically, and requests already running keep the one they started with
    /// (their audit record's `policy` digest says which).
    policy: ArcSwap<Generation>,
    /// Where the policy came from, and how its reloads went.
    reloader: reload::Reloader,
    /// `--mode report`: every policy denial is let through and marked `would_deny`.
    report_all: bool,
    /// An empty rule under which report-only traffic that matched no rule is forwarded.
    report_rule: crate::policy::Rule,
    started: std::time::Instant,
    shutdown: tokio::sync::watch::Sender<bool>,
    ca: CertAuthority,
    audit: Arc<AuditLog>,
    /// The pooled clients, one per way out (a rule's `allow_private` set, HTTP/1.1 only for an
    /// upgrade, a secret store's own CA): see `upstream::Clients`.
    clients: Arc<upstream::Clients>,
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
    /// What latchkey's own resolver answered (`serve --dns`), shared with the listeners that
    /// check a connection's address against it.
    pins: Arc<Pins>,
    /// Approvals and the state store, set once when serving starts (`--state`); absent, every
    /// request that needs a person fails closed (`state_unavailable`).
    governance: std::sync::OnceLock<Arc<crate::governance::Governance>>,
    /// `[limits]` counters on the state store, set once when serving starts; absent, a
    /// request under a limit fails closed (`limits_unavailable`).
    limiter: std::sync::OnceLock<Arc<crate::governance::limits::Limiter>>,
    /// Runtime sessions on the state store, set once when serving starts (`session`).
    sessions: std::sync::OnceLock<Arc<crate::governance::sessions::Sessions>>,
    /// Each `[attest]` table's keys, cached (`session`).
    jwks: std::sync::Mutex<
        std::collections::HashMap<String, Arc<crate::governance::attest::JwksCache>>,
    >,
    /// The empty rule a request no rule allows runs under once a person approved it
    /// (`[ask] unknown`): it injects nothing and binds no secret.
    unknown_rule: crate::policy::Rule,
    /// Session, step, attempt and trace context of each request (`--session-header`, `--otlp`).
    correlator: correlate::Correlator,
    /// latchkey's own AWS identity (its environment's provider chain): signs for `aws_sigv4`
    /// credentials that name no keys. `None`: such a credential fails closed.
    aws: Option<Arc<crate::signing::AwsIdentity>>,
}

/// How to build a [`Proxy`].
pub struct ProxyConfig {
    /// The first generation: the policy loaded, its secrets read ([`Generation::first`]).
    pub policy: Generation,
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
    /// `--session-header`, and whether trace context is propagated upstream (`--otlp`).
    pub correlation: correlate::Options,
    /// latchkey's own AWS identity (`AwsIdentity::from_process_env`, `--aws-imds`).
    pub aws: Option<Arc<crate::signing::AwsIdentity>>,
}

impl Proxy {
    pub fn new(config: ProxyConfig) -> Result<Arc<Self>, UpstreamError> {
        let tls = Arc::new(upstream::tls_config(config.upstream.extra_ca.as_deref())?);
        let dialer = Arc::new(Dialer::new(&config.upstream));
        let clients = Arc::new(upstream::Clients::new(
            dialer.clone(),
            tls.clone(),
            config.upstream.extra_ca.as_deref(),
        ));
        let (shutdown, _) = tokio::sync::watch::channel(false);
        Ok(Arc::new(Self {
            policy: ArcSwap::from_pointee(config.policy),
            reloader: reload::Reloader::new(config.policies_dir),
            report_all: config.report_all,
            report_rule: crate::policy::Rule::report_only(),
            started: std::time::Instant::now(),
            shutdown,
            ca: config.ca,
            audit: Arc::new(config.audit),
            clients,
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
            pins: Arc::new(Pins::default()),
            governance: std::sync::OnceLock::new(),
            limiter: std::sync::OnceLock::new(),
            sessions: std::sync::OnceLock::new(),
            jwks: std::sync::Mutex::new(std::collections::HashMap::new()),
            unknown_rule: crate::policy::Rule::unknown(),
            correlator: correlate::Correlator::new(config.correlation),
            aws: config.aws,
        }))
    }

    /// The client whose connector opens exactly `extra` on top of `--allow-private`, offering
    /// only HTTP/1.1 when `http1` (for an upgrade), its connections presenting `identity` (a
    /// `client_cert` credential) when there is one: a pool of its own per identity.
    fn client_for(
        &self,
        extra: &[upstream::Cidr],
        http1: bool,
        identity: Option<upstream::ClientIdentity>,
    ) -> Client {
        let way = upstream::Way {
            extra: extra.to_vec(),
            http1,
            ca: None,
            identity,
        };
        // Without an extra CA nothing can fail: the roots were read when the proxy was built.
        self.clients
            .get(&way)
            .unwrap_or_else(|_| self.clients.default_client().clone())
    }

    /// The client identity of `client_cert` credential `name` from its PEM bytes as read now
    /// (parsed again only when they change).
    fn client_identity(
        &self,
        name: &str,
        cert: &[u8],
        key: &[u8],
    ) -> Result<upstream::ClientIdentity, upstream::IdentityError> {
        self.clients.identity(name, cert, key)
    }

    /// The captured tokens (a rule's `capture`): one store for every generation.
    pub fn captured_tokens(&self) -> Arc<crate::secrets::captured::Captured> {
        self.policy.load().captured().clone()
    }

    /// The generation in force: the policy, and the credential state it runs with.
    pub fn policy(&self) -> Arc<Generation> {
        self.policy.load_full()
    }

    /// Opens the record of one request (or CONNECT) from `client` as `identity`, under
    /// `policy`: secret values in force are scrubbed from it and from the messages it quotes.
    /// Opened through [`pipeline::open_record`], which waits for queue room first, wherever the
    /// caller can wait (DNS's shed work does not: `dns::resolver`).
    /// The record carries the identity's ceiling: its labels and reach under `policy`.
    pub fn open_record(&self, client: SocketAddr, identity: &str, policy: &Generation) -> Entry {
        let mut entry = Entry::start(self.audit.clone(), client, identity, policy.digest());
        entry.scrub_with(policy.secrets().clone());
        ceiling(&mut entry, identity, policy);
        entry
    }

    /// Opens the record of a connection refused before any request reached the pipeline
    /// (over the caps, a header block that stalled or did not parse): no identity yet, so
    /// `default` (whose ceiling it carries when the policy defines no identities).
    fn connection_record(&self, client: SocketAddr) -> Entry {
        let policy = self.policy.load();
        let mut entry = Entry::start(
            self.audit.clone(),
            client,
            IDENTITY_DEFAULT,
            policy.digest(),
        );
        ceiling(&mut entry, IDENTITY_DEFAULT, &policy);
        entry
    }

    /// The guarded dialer: for latchkey's resolver, which looks names up through the same
    /// address guard (and `--resolve` pins) as every dial.
    pub fn dialer(&self) -> &Arc<Dialer> {
        &self.dialer
    }

    /// The pooled, guarded client (resolve, address guard, verified TLS) for what latchkey
    /// itself sends: webhook notifications.
    pub fn upstream_client(&self) -> Client {
        self.clients.default_client().clone()
    }

    /// latchkey's own AWS identity (its process's, never a sandbox's), when serving set one.
    pub fn aws_identity(&self) -> Option<&Arc<crate::signing::AwsIdentity>> {
        self.aws.as_ref()
    }

    /// Every pooled client, by way out (latchkey's own calls pick theirs by route).
    pub fn clients(&self) -> &Arc<upstream::Clients> {
        &self.clients
    }

    /// Approvals and the state store, once serving set them up.
    pub fn governance(&self) -> Option<&Arc<crate::governance::Governance>> {
        self.governance.get()
    }

    /// The `[limits]` counters, once serving set them up.
    pub fn limiter(&self) -> Option<&Arc<crate::governance::limits::Limiter>> {
        self.limiter.get()
    }

    /// Sets the limiter (once; a second call is ignored and returns `false`).
    pub fn set_limiter(&self, l: Arc<crate::governance::limits::Limiter>) -> bool {
        self.limiter.set(l).is_ok()
    }

    /// Sets the approvals (once; a second call is ignored and returns `false`).
    pub fn set_governance(&self, g: Arc<crate::governance::Governance>) -> bool {
        self.governance.set(g).is_ok()
    }

    /// What latchkey's own resolver handed out, for listeners that check addresses against it.
    pub fn pins(&self) -> &Arc<Pins> {
        &self.pins
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
            limits: self
                .limiter()
                .map(|l| {
                    l.counters()
                        .into_iter()
                        // Per-session counters are keyed by session id: unbounded, never a label.
                        .filter(|c| !c.key.starts_with("session:"))
                        .map(|c| crate::metrics::LimitGauge {
                            limit: c.limit,
                            measure: c.measure,
                            key: c.key,
                            used: c.used,
                            remaining: c.remaining,
                        })
                        .collect()
                })
                .unwrap_or_default(),
            sessions: self.sessions().map(|s| {
                use std::sync::atomic::Ordering::Relaxed;
                let c = &s.counters;
                crate::metrics::SessionGauges {
                    live: s.cached_by_profile().into_iter().collect(),
                    created: c.created.load(Relaxed),
                    revoked: c.revoked.load(Relaxed),
                    expired: c.expired.load(Relaxed),
                    admitted: c.admitted.load(Relaxed),
                    refused: c.refused.load(Relaxed),
                    store_reads: c.store_reads.load(Relaxed),
                }
            }),
        }
    }

    /// The audit log every record goes to.
    pub fn audit(&self) -> &Arc<AuditLog> {
        &self.audit
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
        // `send_replace`, not `send`: `send` does not store the value while nobody has
        // subscribed yet, and a listener that subscribes later must still see it.
        self.shutdown.send_replace(true);
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
}

/// Copies `identity`'s labels and reach digest (computed once per policy) into the record.
fn ceiling(entry: &mut Entry, identity: &str, policy: &crate::policy::Policy) {
    if let Some(c) = policy.ceiling(identity) {
        entry.set_ceiling(&c.labels, &c.reach);
    }
}

/// Resolves once shutdown has begun — also when it began before `rx` subscribed, where
/// `changed()` would wait forever — or once the sender is gone.
pub async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stopping| *stopping).await;
}

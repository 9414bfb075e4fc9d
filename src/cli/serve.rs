//! `latchkey serve`: from flags to a running proxy, and a clean stop.
//!
//! [`build`] does everything that can fail before traffic flows — policy first (an invalid
//! policy never serves), then `--resolve` and `--allow-private`, the listeners (bound before the
//! proxy exists, so the address guard knows latchkey's own addresses, port 0 included), the
//! admin token, the CA and the audit log — and returns a [`Server`] ready to run in any tokio
//! runtime. [`run`] is the command: the runtime with `--workers` threads, the signals, the
//! shutdown deadline and the final audit flush. Errors are `anyhow` here, at the edge.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::args::{DnsAnswer, Mode, ServeArgs};
use super::given::flag;
use super::serve_start;
use crate::policy::{self, Policy};
use crate::proxy::limits::Limits;
use crate::proxy::transparent::{tproxy, Capture};
use crate::proxy::{CertAuthority, InitOutcome, Proxy, ProxyConfig};
use crate::secrets::SecretValue;
use crate::upstream::{parse_resolve, UpstreamConfig};
use crate::wire::cidr::Cidr;

/// The example policy and its tests, built in so `latchkey serve` works from any directory on
/// a first run (after `cargo install`), not only inside a clone.
const EXAMPLE_POLICY: &str = include_str!("../../policies/example.toml");
const EXAMPLE_POLICY_TESTS: &str = include_str!("../../policies/tests/example.toml");

/// A proxy built from `serve`'s flags, its listeners bound, not yet accepting.
pub struct Server {
    proxy: Arc<Proxy>,
    listener: std::net::TcpListener,
    admin: Option<(std::net::TcpListener, Option<SecretValue>)>,
    /// Gateway listeners without a proxy hop (`--transparent`, `--https-listen`, `--http-listen`).
    captured: Vec<(std::net::TcpListener, Capture)>,
    /// `--socks`: the SOCKS5 listener.
    socks: Option<std::net::TcpListener>,
    mode: Mode,
    audit_path: PathBuf,
    shutdown_timeout: Duration,
    /// The policy's digest and rule count, for the "proxy ready" line.
    digest: String,
    rules: usize,
    /// `--dns`: latchkey's resolver, bound.
    dns: Option<crate::dns::DnsListener>,
    /// `--state`, or `sqlite:` `state.db` beside the audit log.
    state: String,
    /// A SQLite state file's one-process lock, taken before anything is written (the audit
    /// log included), held until the server is dropped.
    state_lock: Option<crate::state::owner::Owner>,
    /// Where approvers reach the admin API (`--approval-url`, else the admin address).
    approval_url: Option<String>,
    /// `--audit-ship`: the shipper, started once the proxy (and its guarded client) serves.
    ship: Option<Arc<crate::ship::Shipper>>,
    /// `--secrets-startup`.
    secrets_startup: super::args::SecretsStartup,
    /// What `POST /sessions` returns as a session's environment: the trust variables (the
    /// proxy URL is added once the listener's address is known, or `--session-proxy-url`).
    session_env: crate::admin::sessions::SessionEnv,
    /// `--console`: the operator console under `/ui` on the admin listener, over the audit
    /// log's live stream (whose tap is in the writer only then: no console, no tap).
    console: Option<crate::audit::live::Live>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the admin token: only whether there is one.
        f.debug_struct("Server")
            .field("listener", &self.listener.local_addr().ok())
            .field(
                "admin",
                &self.admin.as_ref().map(|(l, _)| l.local_addr().ok()),
            )
            .field(
                "admin_token",
                &self.admin.as_ref().is_some_and(|(_, t)| t.is_some()),
            )
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// `latchkey serve`: build, run until SIGTERM/SIGINT, drain, flush the audit log. Exit 1
/// (after printing every problem) when the policy is invalid.
pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let policies = policies_dir(args.policies.as_deref())?;
    // Validate everything before binding: an invalid policy never serves.
    let policy = match load_policy(&policies) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let server = build(&args, policies, policy)?;

    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = args.workers {
        anyhow::ensure!(n > 0, "{} must be at least 1", flag("workers"));
        builder.worker_threads(n);
    }
    let runtime = builder.build().context("cannot start the async runtime")?;
    let audit = server.proxy.audit().clone();
    let served = runtime.block_on(server.serve(shutdown_signal()));
    // Tasks still holding records write them as they are dropped; then the queue is drained.
    runtime.shutdown_timeout(Duration::from_secs(1));
    if !audit.flush(Duration::from_secs(10)) {
        tracing::error!("the audit writer did not finish in time; records may be missing");
    }
    served?;
    Ok(ExitCode::SUCCESS)
}

/// Builds the proxy `serve` runs from its flags and an already loaded `policy` (from
/// `policies`, the directory it reloads from): upstream settings, both listeners, the admin
/// token, the CA and the audit log, in that order, the first failure returned.
pub fn build(args: &ServeArgs, policies: PathBuf, policy: Policy) -> anyhow::Result<Server> {
    // Shipping's flags and keys before anything is bound: a bad URL or missing key never serves.
    let ship = ship_config(args)?.map(crate::ship::Shipper::new);
    let mut upstream = upstream_config(args)?;
    let bound = Bound::bind(args, &mut upstream)?;
    let token = args.admin_token.as_deref().map(admin_token).transpose()?;
    anyhow::ensure!(
        !args.body_timeout.is_zero(),
        "--body-timeout must be more than 0s"
    );
    let (state, state_lock) = state_store(args)?;
    let (ca, outcome) = CertAuthority::load_or_create(&args.ca_dir)?;
    if outcome == InitOutcome::Created {
        tracing::info!(path = %ca.cert_path().display(), "created a new CA; sandboxes must trust it (latchkey env)");
    }
    let session_env = session_env(args)?;
    let mut options = audit_options(args, &upstream)?;
    if let Some(ship) = &ship {
        options.taps.push(ship.tap());
    }
    let console = args.console.then(crate::audit::live::Live::default);
    if let Some(live) = &console {
        options.taps.push(live.tap());
    }
    let audit = crate::audit::AuditLog::open_with(&args.audit, options)?;
    let rules = policy.rules().len();
    let digest = policy.digest().to_string();
    let policy = first_generation(args, policy)?;
    let proxy = Proxy::new(proxy_config(args, policies, policy, ca, audit, upstream)?)?;
    Ok(Server {
        proxy,
        listener: bound.listener,
        admin: bound.admin.map(|l| (l, token)),
        captured: bound.captured,
        socks: bound.socks,
        mode: args.mode,
        audit_path: args.audit.clone(),
        shutdown_timeout: args.shutdown_timeout,
        digest,
        rules,
        dns: bound.dns,
        state,
        state_lock,
        approval_url: args.approval_url.clone(),
        ship,
        session_env,
        secrets_startup: args.secrets_startup,
        console,
    })
}

/// A session's environment but for its proxy URL: what `latchkey env` prints about trust (the
/// bundle beside the CA, the JVM's truststore), written when the first session is made.
fn session_env(args: &ServeArgs) -> anyhow::Result<crate::admin::sessions::SessionEnv> {
    let ca_dir = args.ca_dir.clone();
    let make: crate::admin::sessions::TrustVars = Arc::new(move || {
        let pem = super::ca::existing_cert(&ca_dir).map_err(|e| format!("{e:#}"))?;
        let vars = super::env::variables("http://-", &ca_dir, &pem, super::env::DEFAULT_NO_PROXY)
            .map_err(|e| e.to_string())?;
        Ok(vars
            .into_iter()
            .filter(|(k, _)| {
                !k.eq_ignore_ascii_case("http_proxy") && !k.eq_ignore_ascii_case("https_proxy")
            })
            .collect())
    });
    Ok(crate::admin::sessions::SessionEnv::new(
        args.session_proxy_url.clone().unwrap_or_default(),
        make,
    ))
}

/// The upstream settings from the flags: `--upstream-ca`, `--connect-timeout`, the
/// `--resolve` pins, the `--allow-private` ranges and the `--upstream-proxy` chain.
pub(super) fn upstream_config(args: &ServeArgs) -> anyhow::Result<UpstreamConfig> {
    let mut upstream = UpstreamConfig {
        extra_ca: args.upstream_ca.clone(),
        connect_timeout: args.connect_timeout,
        ..UpstreamConfig::default()
    };
    for spec in &args.resolve {
        let (host, ip) = parse_resolve(spec)
            .map_err(|e| anyhow::Error::msg(e.replacen("--resolve", &flag("resolve"), 1)))?;
        upstream.resolve.insert(host, ip);
    }
    for cidr in &args.allow_private {
        let c = Cidr::parse(cidr)
            .map_err(|e| anyhow::anyhow!("{} {cidr:?}: {e}", flag("allow_private")))?;
        upstream.allow_private.push(c);
    }
    upstream.proxy = super::upstream_proxy::from_args(args)?;
    Ok(upstream)
}

/// Every listener `serve` asked for, bound.
struct Bound {
    listener: std::net::TcpListener,
    admin: Option<std::net::TcpListener>,
    captured: Vec<(std::net::TcpListener, Capture)>,
    socks: Option<std::net::TcpListener>,
    dns: Option<crate::dns::DnsListener>,
}

impl Bound {
    /// Binds every listener before the proxy is built, each address added to `upstream`'s own,
    /// so the guard knows latchkey's real addresses (port 0 too) and never dials them.
    fn bind(args: &ServeArgs, upstream: &mut UpstreamConfig) -> anyhow::Result<Self> {
        let listener = std::net::TcpListener::bind(args.listen)
            .with_context(|| format!("cannot listen on {} ({})", args.listen, flag("listen")))?;
        listener.set_nonblocking(true)?;
        upstream.own.push(listener.local_addr()?);
        let admin = match args.admin.as_str() {
            "off" => None,
            addr => {
                let addr: SocketAddr = addr.parse().map_err(|_| {
                    anyhow::anyhow!("{} {addr:?}: expected ADDR:PORT or off", flag("admin"))
                })?;
                let l = std::net::TcpListener::bind(addr)
                    .with_context(|| format!("cannot listen on {} {addr}", flag("admin")))?;
                l.set_nonblocking(true)?;
                // The admin API is never reachable through the proxy itself.
                upstream.own.push(l.local_addr()?);
                Some(l)
            }
        };
        let captured = gateway_listeners(args, upstream)?;
        // SOCKS5 (`--socks`): bound here too, so the guard never dials it either.
        let socks = match args.socks {
            Some(addr) => {
                let l = std::net::TcpListener::bind(addr)
                    .with_context(|| format!("cannot listen on --socks {addr}"))?;
                l.set_nonblocking(true)?;
                upstream.own.push(l.local_addr()?);
                Some(l)
            }
            None => None,
        };
        // latchkey's resolver (`--dns`): bound here like the other listeners.
        let dns = dns_listener(args)?;
        if let Some(dns) = &dns {
            upstream.own.push(dns.local_addr()?);
        }
        Ok(Self {
            listener,
            admin,
            captured,
            socks,
            dns,
        })
    }
}

/// The gateway listeners (`--transparent`, `--https-listen`, `--http-listen`), bound, each
/// address added to `upstream`'s own.
fn gateway_listeners(
    args: &ServeArgs,
    upstream: &mut UpstreamConfig,
) -> anyhow::Result<Vec<(std::net::TcpListener, Capture)>> {
    let mut captured = Vec::new();
    for (addr, capture) in [
        (args.transparent, Capture::Transparent),
        (args.https_listen, Capture::Https),
        (args.http_listen, Capture::Http),
    ] {
        let Some(addr) = addr else { continue };
        let l = if capture == Capture::Transparent && args.transparent_tproxy {
            // Fails closed: a listener tproxy cannot reach would leave the sandbox cut off
            // with nothing in the log saying why.
            tproxy::bind(addr)
                .with_context(|| format!("--transparent {addr} --transparent-tproxy"))?
        } else {
            let l = std::net::TcpListener::bind(addr)
                .with_context(|| format!("cannot listen on {} {addr}", capture.flag()))?;
            l.set_nonblocking(true)?;
            l
        };
        upstream.own.push(l.local_addr()?);
        captured.push((l, capture));
    }
    Ok(captured)
}

/// `--state` (else `sqlite:` `state.db` beside the audit log) and, for a SQLite file, its
/// one-process lock: one serve per state file, checked before anything is written, so a second
/// one refused here leaves the first one's audit log untouched.
fn state_store(args: &ServeArgs) -> anyhow::Result<(String, Option<crate::state::owner::Owner>)> {
    let state = args.state.clone().unwrap_or_else(|| {
        format!(
            "sqlite:{}",
            state_dir(&args.audit).join("state.db").display()
        )
    });
    let state_lock = match state.strip_prefix("sqlite:").filter(|p| !p.is_empty()) {
        Some(path) => Some(
            crate::state::owner::Owner::acquire(Path::new(path))
                .map_err(|e| anyhow::anyhow!("--state {state}: {e}"))?,
        ),
        None => None,
    };
    Ok((state, state_lock))
}

/// The first generation: the policy and every secret it declares, read now, with the captured
/// tokens, sealed with a key kept beside the CA's.
fn first_generation(args: &ServeArgs, policy: Policy) -> anyhow::Result<crate::proxy::Generation> {
    let tokens = Arc::new(
        crate::secrets::captured::Captured::with_key_at(
            &args
                .capture_key
                .clone()
                .unwrap_or_else(|| args.ca_dir.join(crate::secrets::captured::KEY_FILE)),
        )
        .context("--capture-key")?,
    );
    crate::proxy::Generation::first(policy, tokens).context("secrets")
}

/// The proxy's configuration: what `build` made, and the flags' limits and timeouts.
fn proxy_config(
    args: &ServeArgs,
    policies: PathBuf,
    policy: crate::proxy::Generation,
    ca: CertAuthority,
    audit: crate::audit::AuditLog,
    upstream: UpstreamConfig,
) -> anyhow::Result<ProxyConfig> {
    Ok(ProxyConfig {
        policy,
        ca,
        audit,
        upstream,
        response_timeout: args.response_timeout,
        limits: Limits {
            max_connections: args.max_connections,
            max_connections_per_client: args.max_connections_per_client,
            header_timeout: args.header_timeout,
            idle_timeout: args.idle_timeout,
            max_websocket_message: args.max_websocket_message,
            ..Limits::default()
        },
        policies_dir: policies,
        report_all: args.mode == Mode::Report,
        max_decoded_body: args.max_decoded_body as u64,
        max_buffered_bytes: args.max_buffered_bytes,
        max_buffered_bytes_per_client: args.max_buffered_bytes_per_client.unwrap_or(
            args.max_buffered_bytes / crate::proxy::budget::DEFAULT_CLIENT_SHARE_DIVISOR,
        ),
        body_timeout: args.body_timeout,
        correlation: crate::proxy::correlate::Options::new(
            &args.session_header,
            args.otlp.is_some(),
        )
        .context("--session-header")?,
        // latchkey's own environment, never a sandbox's (whose variables reach only the tools
        // inside it). Read lazily: no call is made until a key is needed.
        aws: Some(Arc::new(crate::signing::AwsIdentity::from_process_env(
            args.aws_imds.then(crate::signing::ImdsConfig::default),
        ))),
    })
}

/// `--audit-ship` and its endpoint, region and keys (read once, from latchkey's environment),
/// checked; `None` when shipping is off. Its other flags alone are an error, not ignored.
fn ship_config(args: &ServeArgs) -> anyhow::Result<Option<crate::ship::Config>> {
    let Some(url) = args.audit_ship.as_deref() else {
        anyhow::ensure!(
            args.audit_ship_endpoint.is_none(),
            "--audit-ship-endpoint is set but --audit-ship is not: give the bucket with \
             --audit-ship s3://BUCKET/PREFIX"
        );
        return Ok(None);
    };
    let env = |name: &str| std::env::var(name).ok();
    let config = crate::ship::Config::from_flags(&crate::ship::Flags {
        url,
        endpoint: args.audit_ship_endpoint.as_deref(),
        region: &args.audit_ship_region,
        audit: &args.audit,
        rotates: args.audit_rotate.is_some_and(|r| !r.is_off()),
        env: &env,
    })?;
    if config.endpoint.scheme == "http" {
        tracing::warn!(endpoint = %config.endpoint.origin(), "--audit-ship-endpoint is plain http: segments travel unencrypted (uploads are still signed)");
    }
    Ok(Some(config))
}

/// The audit log's options from the flags: the signing key (created beside the CA when
/// absent), group-commit durability, checkpoints, rotation, retention and format, and the taps
/// that follow what is written (`--otlp`: its exporter, dialing through `upstream`'s guard).
fn audit_options(
    args: &ServeArgs,
    upstream: &UpstreamConfig,
) -> anyhow::Result<crate::audit::Options> {
    use crate::audit::key::{KeyOutcome, SigningKey, KEY_FILE};
    let key_path = args
        .audit_key
        .clone()
        .unwrap_or_else(|| args.ca_dir.join(KEY_FILE));
    let (key, outcome) = SigningKey::load_or_create(&key_path)?;
    if outcome == KeyOutcome::Created {
        tracing::info!(path = %key_path.display(), public = %key.public(), "created the audit signing key; `latchkey audit key` prints its public half for `audit verify --key`");
    }
    let mut taps: Vec<Box<dyn crate::audit::Tap>> = Vec::new();
    if let Some(url) = &args.otlp {
        let (tap, _stats) = crate::telemetry::start(url, upstream, Default::default())?;
        tracing::info!(otlp.endpoint = %crate::telemetry::traces_url(url)?, "exporting one span per request over OTLP/HTTP");
        taps.push(Box::new(tap));
    }
    Ok(crate::audit::Options {
        sync: args.audit_sync,
        rotation: args.audit_rotate.unwrap_or_default(),
        keep: args.audit_keep,
        keep_unshipped: args.audit_ship.is_some(),
        format: args.audit_format.into(),
        key: Some(std::sync::Arc::new(key)),
        checkpoint_every: args.audit_checkpoint_every,
        checkpoint_interval: args.audit_checkpoint_interval,
        taps,
    })
}

/// Where the default state store goes: beside the audit log (the working directory when the
/// audit log is not a file in a directory).
fn state_dir(audit: &Path) -> PathBuf {
    match audit.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Binds `--dns` with its answer style and rate, or says which flag is wrong.
fn dns_listener(args: &ServeArgs) -> anyhow::Result<Option<crate::dns::DnsListener>> {
    let Some(addr) = args.dns else {
        anyhow::ensure!(
            args.dns_self.is_empty(),
            "--dns-self is set but --dns is not: the resolver does not run without --dns ADDR"
        );
        return Ok(None);
    };
    let style = match args.dns_answer {
        DnsAnswer::Real => crate::dns::Style::Real,
        DnsAnswer::SelfAddress if !args.dns_self.is_empty() => {
            crate::dns::Style::SelfAddress(args.dns_self.clone())
        }
        DnsAnswer::SelfAddress if addr.ip().is_unspecified() => anyhow::bail!(
            "--dns {addr}: `self` answers need the address sandboxes reach latchkey at, and \
             {} is unspecified: name it with --dns-self IP",
            addr.ip()
        ),
        DnsAnswer::SelfAddress => crate::dns::Style::SelfAddress(vec![addr.ip()]),
    };
    let config = crate::dns::DnsConfig {
        style,
        rate: args.dns_rate,
    };
    crate::dns::DnsListener::bind(addr, config)
        .map(Some)
        .with_context(|| format!("cannot listen on --dns {addr} (UDP and TCP)"))
}

impl Server {
    /// The proxy, for callers that run it in-process (its audit log, metrics, reload).
    pub fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }

    /// Where the proxy listens (the real port when `--listen` asked for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts on both listeners and watches the policy directory until `shutdown` completes,
    /// then stops accepting and gives requests in flight `--shutdown-timeout` to finish. Must
    /// run inside a tokio runtime; the caller flushes the audit log after the runtime stops.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        // The state store first: a request that needs a person must find it from the first one.
        // Held (by this binding) until serving ends; the kernel drops it if the process dies.
        let _state_lock = self.state_lock;
        let admin_listening = self.admin.as_ref().map(|(l, _)| l);
        serve_start::start_state(&self.proxy, &self.state, self.approval_url, admin_listening)
            .await?;
        // Secrets held in stores, before the first connection is accepted.
        super::serve_stores::start_stores(&self.proxy, self.secrets_startup).await?;
        let proxy = self.proxy;
        let listener = tokio::net::TcpListener::from_std(self.listener)?;
        let addr = listener.local_addr()?;
        tracing::info!(listen.addr = %addr, policy.digest = %self.digest, policy.rules = self.rules, audit = %self.audit_path.display(), "proxy ready");
        // A fixed line for scripts and tests to wait on.
        eprintln!("latchkey: proxy listening on {addr}");
        if let Some((l, token)) = self.admin {
            let l = tokio::net::TcpListener::from_std(l)?;
            let admin = l.local_addr()?;
            tracing::info!(admin.addr = %admin, "admin API ready");
            eprintln!("latchkey: admin listening on {admin}");
            let mut env = self.session_env;
            if env.proxy.is_empty() {
                env.proxy = format!("http://{addr}");
            }
            tokio::spawn(crate::admin::serve(
                proxy.clone(),
                l,
                token,
                self.ship.clone(),
                env,
                self.console,
            ));
        }
        let socks = match self.socks {
            Some(l) => {
                let l = tokio::net::TcpListener::from_std(l)?;
                let at = l.local_addr()?;
                tracing::info!(socks.addr = %at, "SOCKS5 listener ready");
                eprintln!("latchkey: socks5 listening on {at}");
                Some(tokio::spawn(proxy.clone().serve_socks(l)))
            }
            None => None,
        };
        if self.mode == Mode::Report {
            tracing::warn!(
                "report-only mode: policy denials are let through and audited with would_deny"
            );
        }
        let gateway = serve_start::start_gateways(&proxy, self.captured)?;
        if let Some(dns) = self.dns {
            serve_start::start_dns(&proxy, dns)?;
        }
        // Closed segments go off the box through the same guarded client as every dial.
        if let Some(ship) = &self.ship {
            let aws = proxy
                .aws_identity()
                .cloned()
                .unwrap_or_else(|| Arc::new(crate::signing::AwsIdentity::from_process_env(None)));
            tokio::spawn(ship.clone().run(
                proxy.upstream_client(),
                aws,
                Arc::new(crate::proxy::OwnCalls::new(&proxy)),
                proxy.metrics().clone(),
                proxy.shutdown_signal(),
            ));
        }
        tokio::spawn(proxy.clone().watch_policies());
        let serving = tokio::spawn(proxy.clone().serve(listener));
        shutdown.await;
        let mut accepting = vec![serving];
        accepting.extend(gateway);
        accepting.extend(socks);
        serve_start::stop(&proxy, accepting, self.shutdown_timeout).await;
        Ok(())
    }
}

/// Loads a policy directory, printing each problem on its own line.
fn load_policy(dir: &Path) -> Result<Policy, ExitCode> {
    policy::load_dir(dir).map_err(|e| {
        super::policy::print_load_error(dir, &e);
        ExitCode::from(1)
    })
}

/// The policy directory `serve` uses: the one named, or `./policies`, which a first run creates
/// with the example policy. A directory that was named and is missing stays an error.
fn policies_dir(named: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = named {
        return Ok(dir.to_path_buf());
    }
    let dir = PathBuf::from("policies");
    if !dir.exists() {
        let tests = dir.join("tests");
        std::fs::create_dir_all(&tests)
            .with_context(|| format!("cannot create {}", tests.display()))?;
        for (path, text) in [
            (dir.join("example.toml"), EXAMPLE_POLICY),
            (tests.join("example.toml"), EXAMPLE_POLICY_TESTS),
        ] {
            std::fs::write(&path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        tracing::info!(
            path = %dir.join("example.toml").display(),
            "no policies directory here: wrote the example policy (edit it; latchkey reloads on change)"
        );
    }
    Ok(dir)
}

/// Reads the admin token from `env:VAR` or `file:PATH` (never from the command line itself,
/// where `ps` would show it).
/// The admin token `spec` names, as text (for `latchkey approvals`, which sends it).
pub fn read_token(spec: &str) -> anyhow::Result<String> {
    let token = admin_token(spec)?;
    Ok(String::from_utf8_lossy(token.expose()).into_owned())
}

fn admin_token(spec: &str) -> anyhow::Result<SecretValue> {
    let name = flag("admin_token");
    let bytes = match spec.split_once(':') {
        Some(("env", var)) => std::env::var(var)
            .map_err(|_| anyhow::anyhow!("{name}: env var {var} is not set"))?
            .into_bytes(),
        // A private file: refused when group or others may read it (`crate::files`).
        Some(("file", path)) => crate::files::read(Path::new(path), "the admin token file")
            .with_context(|| name.clone())?
            .ok_or_else(|| anyhow::anyhow!("{name}: {path} does not exist"))?,
        _ => anyhow::bail!("{name} takes env:VAR or file:PATH, not the token itself"),
    };
    let text = String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{name}: not UTF-8"))?;
    let token = text.trim();
    if token.len() < 16 {
        anyhow::bail!("{name}: the token must be at least 16 characters");
    }
    Ok(SecretValue::new(token.as_bytes().to_vec()))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = ctrl_c => {},
            () = term => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    const POLICY: &str = r#"
[[rules]]
name  = "example"
hosts = ["api.example.com"]
"#;

    fn serve_args(extra: &[&str]) -> ServeArgs {
        let cli = Cli::try_parse_from(["latchkey", "serve"].iter().chain(extra))
            .unwrap_or_else(|e| panic!("serve {extra:?}: {e}"));
        match cli.command {
            Command::Serve(args) => *args,
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn mode_is_enforce_unless_report_is_asked_for_and_nothing_else_is_accepted() {
        assert_eq!(serve_args(&[]).mode, Mode::Enforce);
        assert_eq!(serve_args(&["--mode", "report"]).mode, Mode::Report);
        assert_eq!(serve_args(&["--mode", "enforce"]).mode, Mode::Enforce);
        let err = Cli::try_parse_from(["latchkey", "serve", "--mode", "audit"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("[possible values: enforce, report]"), "{err}");
    }

    /// `build` then `serve` in this process, as a caller other than `main` would: the proxy
    /// binds port 0 to a real port, creates its CA and audit log, and stops when told to.
    #[test]
    fn a_server_built_in_process_listens_and_stops_when_told() {
        let dir = tempfile::tempdir().expect("temp dir");
        let policies = dir.path().join("policies");
        std::fs::create_dir_all(&policies).expect("policies dir");
        std::fs::write(policies.join("example.toml"), POLICY).expect("policy");
        let path = |rel: &str| dir.path().join(rel).display().to_string();
        let (ca, audit) = (path("certs"), path("audit.jsonl"));
        let args = serve_args(&[
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "off",
            "--ca-dir",
            &ca,
            "--audit",
            &audit,
            "--shutdown-timeout",
            "1s",
        ]);
        let policy = policy::load_dir(&policies).expect("valid policy");
        let server = build(&args, policies, policy).expect("built");
        let addr = server.local_addr().expect("bound");
        assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
        assert!(format!("{server:?}").contains("admin_token: false"));
        assert!(std::path::Path::new(&ca)
            .join(crate::proxy::ca::CA_CERT_FILE)
            .exists());
        assert!(std::path::Path::new(&audit).exists());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        // Shutdown at once, before the accept loop has run: it must still see it (the loop
        // waits for the signal's value, not for a change after it subscribed).
        let served = runtime.block_on(async {
            let shutdown = std::future::ready(());
            tokio::time::timeout(Duration::from_secs(20), server.serve(shutdown)).await
        });
        let served = served.expect("serve returned within 20s");
        assert!(served.is_ok(), "{served:?}");
    }

    #[test]
    fn a_bad_allow_private_range_is_refused_before_anything_is_bound() {
        let args = serve_args(&["--allow-private", "10.1.2.3/24", "--listen", "127.0.0.1:0"]);
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("example.toml"), POLICY).expect("policy");
        let policy = policy::load_dir(dir.path()).expect("valid policy");
        let err = build(&args, dir.path().to_path_buf(), policy)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert_eq!(
            err,
            "--allow-private \"10.1.2.3/24\": 10.1.2.3/24 has host bits set; did you mean \
             10.1.2.0/24?"
        );
    }
}

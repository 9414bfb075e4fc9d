//! The `latchkey` command line: parse flags, call into the library, print errors once.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use latchkey::audit::AuditLog;
use latchkey::policy;
use latchkey::policy_cli;
use latchkey::proxy::limits::Limits;
use latchkey::proxy::{CertAuthority, InitOutcome, Proxy, ProxyConfig};
use latchkey::sandbox_env;
use latchkey::upstream::{parse_resolve, UpstreamConfig};

/// latchkey: a credential-brokering egress proxy for AI-agent sandboxes.
///
/// Point a sandbox's HTTP_PROXY/HTTPS_PROXY at `latchkey serve`; every request is checked
/// against the policy files (deny by default), intercepted with latchkey's own CA, and written
/// to the audit log. Start with `latchkey serve` (example policy, CA created in ./certs), then
/// `eval "$(latchkey env)"` in the sandbox.
#[derive(Parser, Debug)]
#[command(name = "latchkey", version = env!("LATCHKEY_VERSION"), propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the proxy.
    // Boxed: ServeArgs is far larger than the other variants (clippy::large_enum_variant).
    Serve(Box<ServeArgs>),
    /// Validate policy files; print every problem as file:line:col: message, and warnings
    /// about risky constructs as file:line:col: warning: message.
    Check {
        #[arg(long, env = "LATCHKEY_POLICIES", default_value = "policies")]
        policies: PathBuf,
        /// `json`: one object {ok, errors, warnings, rules, files, policy} for CI annotations.
        /// (Its variable is not LATCHKEY_FORMAT, which `env --format` reads.)
        #[arg(
            long,
            env = "LATCHKEY_CHECK_FORMAT",
            value_enum,
            default_value = "text"
        )]
        format: latchkey::policy_cli::CheckFormat,
        /// Validate secret sources without reading their values (CI machines without the keys).
        #[arg(long, env = "LATCHKEY_NO_SECRETS")]
        no_secrets: bool,
    },
    /// Run the policy test cases (DIR/tests/*.toml by default) against the policy; exit 1 on
    /// any failure. Secret values are never read.
    Test {
        #[arg(long, env = "LATCHKEY_POLICIES", default_value = "policies")]
        policies: PathBuf,
        /// Directory of *.toml test files (default: POLICIES/tests).
        #[arg(long, env = "LATCHKEY_TESTS")]
        tests: Option<PathBuf>,
    },
    /// Show what policy decides for one request, and why.
    Explain {
        #[arg(long, env = "LATCHKEY_POLICIES", default_value = "policies")]
        policies: PathBuf,
        /// The sandbox identity asking (identities come with policy [identities]).
        #[arg(long, env = "LATCHKEY_IDENTITY", default_value = "default")]
        identity: String,
        /// Print JSON instead of text. (Its variable names the command, as check's does.)
        #[arg(long, env = "LATCHKEY_EXPLAIN_JSON")]
        json: bool,
        /// HTTP method, e.g. GET.
        method: String,
        /// Absolute URL, e.g. https://api.github.com/repos.
        url: String,
    },
    /// Manage latchkey's certificate authority.
    Ca {
        #[command(subcommand)]
        action: CaAction,
    },
    /// Show allow, inject, redact and deny working, offline: a local HTTPS echo upstream, a
    /// demo policy and secret, and `latchkey serve` on them; prints each curl command and what
    /// it showed, checks every outcome, then stays up for the commands to be pasted.
    Demo {
        /// Keep the demo's files (policy, CA, audit log, log) here; default: a temp directory,
        /// removed on exit.
        #[arg(long, env = "LATCHKEY_DEMO_DIR")]
        dir: Option<PathBuf>,
        /// Address the demo's latchkey listens on (loopback; port 0 picks a free port).
        #[arg(long, env = "LATCHKEY_DEMO_LISTEN", default_value = latchkey::demo::DEFAULT_LISTEN)]
        listen: SocketAddr,
        /// Exit after the self-check (0 when every check passed) instead of staying up.
        #[arg(long, env = "LATCHKEY_DEMO_ONCE")]
        once: bool,
    },
    /// Print the environment a sandbox needs (proxy variables and a trust bundle).
    Env {
        /// The proxy URL the sandbox reaches latchkey at.
        #[arg(long, env = "LATCHKEY_PROXY", default_value = "http://127.0.0.1:3128")]
        proxy: String,
        #[arg(long, env = "LATCHKEY_CA_DIR", default_value = "certs")]
        ca_dir: PathBuf,
        #[arg(long, env = "LATCHKEY_FORMAT", value_enum, default_value = "shell")]
        format: sandbox_env::Format,
        /// Hosts kept off the proxy (NO_PROXY/no_proxy); `''` leaves both out, so loopback
        /// requests go through latchkey too.
        #[arg(long = "no-proxy", env = "LATCHKEY_NO_PROXY", value_name = "LIST", default_value = sandbox_env::DEFAULT_NO_PROXY)]
        no_proxy: String,
    },
}

#[derive(Subcommand, Debug)]
enum CaAction {
    /// Create the CA (latchkey-ca.pem, latchkey-ca.key with mode 0600) unless it exists.
    Init {
        #[arg(long, env = "LATCHKEY_CA_DIR", default_value = "certs")]
        ca_dir: PathBuf,
    },
    /// Print the CA certificate's path, fingerprint and PEM.
    Show {
        #[arg(long, env = "LATCHKEY_CA_DIR", default_value = "certs")]
        ca_dir: PathBuf,
    },
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// Directory of *.toml policy files [default: policies]. When not given and ./policies does
    /// not exist, it is created holding the commented example policy (and its policy tests).
    #[arg(long, env = "LATCHKEY_POLICIES")]
    policies: Option<PathBuf>,
    /// Address the proxy listens on (port 0 picks a free port).
    #[arg(long, env = "LATCHKEY_LISTEN", default_value = "127.0.0.1:3128")]
    listen: SocketAddr,
    /// Directory holding latchkey's CA; created with a new CA if absent.
    #[arg(long, env = "LATCHKEY_CA_DIR", default_value = "certs")]
    ca_dir: PathBuf,
    /// Audit log (JSON lines, appended); `-` for stdout.
    #[arg(long, env = "LATCHKEY_AUDIT", default_value = "audit.jsonl")]
    audit: PathBuf,
    /// Extra PEM bundle trusted for upstream TLS, besides the webpki roots.
    #[arg(long, env = "LATCHKEY_UPSTREAM_CA")]
    upstream_ca: Option<PathBuf>,
    /// Open a non-public address range for every rule, e.g. 10.1.2.0/24 (repeatable). Cloud
    /// metadata opens only with its exact address (169.254.169.254/32).
    #[arg(
        long = "allow-private",
        env = "LATCHKEY_ALLOW_PRIVATE",
        value_name = "CIDR",
        value_delimiter = ','
    )]
    allow_private: Vec<String>,
    /// Pin a host name to an address, like curl's --resolve (repeatable).
    #[arg(
        long = "resolve",
        env = "LATCHKEY_RESOLVE",
        value_name = "HOST=IP",
        value_delimiter = ','
    )]
    resolve: Vec<String>,
    /// How long to wait for an upstream's response headers.
    #[arg(long, env = "LATCHKEY_RESPONSE_TIMEOUT", default_value = "300s", value_parser = humantime::parse_duration)]
    response_timeout: Duration,
    /// How long to wait for an upstream TCP connection.
    #[arg(long, env = "LATCHKEY_CONNECT_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    connect_timeout: Duration,
    /// Time a client has to send a request's headers (also the keep-alive idle time).
    #[arg(long, env = "LATCHKEY_HEADER_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    header_timeout: Duration,
    /// A connection (tunnels included) with no traffic for this long is closed.
    #[arg(long, env = "LATCHKEY_IDLE_TIMEOUT", default_value = "300s", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,
    /// Most connections open at once; more get 503.
    #[arg(long, env = "LATCHKEY_MAX_CONNECTIONS", default_value_t = 4096)]
    max_connections: usize,
    /// Most connections one client address may hold open; more get 503.
    #[arg(
        long,
        env = "LATCHKEY_MAX_CONNECTIONS_PER_CLIENT",
        default_value_t = 256
    )]
    max_connections_per_client: usize,
    /// Admin API address (health, status, metrics, reload, explain); `off` to disable.
    #[arg(long, env = "LATCHKEY_ADMIN", default_value = "127.0.0.1:3129")]
    admin: String,
    /// Require `Authorization: Bearer TOKEN` on the admin API; TOKEN from `env:VAR` or `file:PATH`.
    #[arg(long, env = "LATCHKEY_ADMIN_TOKEN", value_name = "SOURCE")]
    admin_token: Option<String>,
    /// `enforce` (default), or `report`: let policy denials through, audited with would_deny.
    #[arg(long, env = "LATCHKEY_MODE", default_value = "enforce", value_parser = ["enforce", "report"])]
    mode: String,
    /// Runtime worker threads (default: one per core).
    #[arg(long, env = "LATCHKEY_WORKERS")]
    workers: Option<usize>,
    /// Most bytes a scanned (secret-bearing) response body may decode to; past it the response
    /// is refused (502 decompression_limit) or cut off. Takes B, KiB, MiB, GiB (or K/M/G).
    #[arg(long, env = "LATCHKEY_MAX_DECODED_BODY", default_value = "64MiB", value_parser = parse_bytes)]
    max_decoded_body: usize,
    /// Request-body bytes latchkey may hold at once, across every client (bodies it must see
    /// whole: SigV4-signed payloads, body placeholders, small bodies checked before dialing).
    /// Past it: `503 too_busy`. Accepts a plain number or a suffix: 256MiB, 64KiB, 1GiB.
    #[arg(long, env = "LATCHKEY_MAX_BUFFERED_BYTES", default_value = "256MiB", value_parser = parse_bytes)]
    max_buffered_bytes: usize,
    /// One client address's share of --max-buffered-bytes (default: an eighth of it).
    #[arg(long, env = "LATCHKEY_MAX_BUFFERED_BYTES_PER_CLIENT", value_parser = parse_bytes)]
    max_buffered_bytes_per_client: Option<usize>,
    /// A request body that sends less than 1 KiB in this long (of latchkey waiting) is cut: `408 body_timeout`, the
    /// upstream request aborted.
    #[arg(long, env = "LATCHKEY_BODY_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    body_timeout: Duration,
    /// On SIGTERM/SIGINT, how long in-flight requests may take to finish.
    #[arg(long, env = "LATCHKEY_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    shutdown_timeout: Duration,
}

/// A byte count: `1048576`, `64KiB`, `256MiB`, `1GiB` (binary units; `KB`/`MB`/`GB` are
/// decimal).
fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count (e.g. 256MiB)"))?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?} (use KiB, MiB or GiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Reads the admin token from `env:VAR` or `file:PATH` (never from the command line itself,
/// where `ps` would show it).
fn admin_token(spec: &str) -> anyhow::Result<latchkey::secrets::SecretValue> {
    let bytes = match spec.split_once(':') {
        Some(("env", var)) => std::env::var(var)
            .map_err(|_| anyhow::anyhow!("--admin-token: env var {var} is not set"))?
            .into_bytes(),
        Some(("file", path)) => {
            std::fs::read(path).with_context(|| format!("--admin-token: cannot read {path}"))?
        }
        _ => anyhow::bail!("--admin-token takes env:VAR or file:PATH, not the token itself"),
    };
    let text = String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("--admin-token: not UTF-8"))?;
    let token = text.trim();
    if token.len() < 16 {
        anyhow::bail!("--admin-token: the token must be at least 16 characters");
    }
    Ok(latchkey::secrets::SecretValue::new(
        token.as_bytes().to_vec(),
    ))
}

/// mimalloc: the proxy allocates and frees many small, short-lived buffers per request across
/// threads, which glibc's allocator serves markedly slower (bench/results.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("latchkey: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve(args) => serve(*args),
        Command::Check {
            policies,
            format,
            no_secrets,
        } => {
            let secrets = if no_secrets {
                policy::SecretLoading::Skip
            } else {
                policy::SecretLoading::Read
            };
            Ok(policy_cli::check(&policies, format, secrets))
        }
        Command::Test { policies, tests } => Ok(policy_cli::test(&policies, tests.as_deref())),
        Command::Explain {
            policies,
            identity,
            json,
            method,
            url,
        } => policy_cli::explain(&policies, Some(&identity), json, &method, &url),
        Command::Ca { action } => ca(action),
        Command::Demo { dir, listen, once } => {
            let passed = latchkey::demo::run(latchkey::demo::Options { dir, listen, once })?;
            Ok(if passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Env {
            proxy,
            ca_dir,
            format,
            no_proxy,
        } => {
            let (ca, _) = CertAuthority::load_or_create(&ca_dir)?;
            let vars = sandbox_env::variables(&proxy, &ca_dir, ca.cert_pem(), &no_proxy)?;
            print!("{}", sandbox_env::render(&vars, format));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Loads a policy directory, printing each problem on its own line.
fn load_policy(dir: &Path) -> Result<policy::Policy, ExitCode> {
    policy::load_dir(dir).map_err(|e| {
        latchkey::policy_cli::print_load_error(dir, &e);
        ExitCode::from(1)
    })
}

/// The example policy and its tests, built in so `latchkey serve` works from any directory on
/// a first run (after `cargo install`), not only inside a clone.
const EXAMPLE_POLICY: &str = include_str!("../policies/example.toml");
const EXAMPLE_POLICY_TESTS: &str = include_str!("../policies/tests/example.toml");

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

fn serve(mut args: ServeArgs) -> anyhow::Result<ExitCode> {
    let policies = policies_dir(args.policies.as_deref())?;
    args.policies = Some(policies.clone());
    // Validate everything before binding: an invalid policy never serves.
    let policy = match load_policy(&policies) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let mut upstream = UpstreamConfig {
        extra_ca: args.upstream_ca.clone(),
        connect_timeout: args.connect_timeout,
        ..UpstreamConfig::default()
    };
    for spec in &args.resolve {
        let (host, ip) = parse_resolve(spec).map_err(anyhow::Error::msg)?;
        upstream.resolve.insert(host, ip);
    }
    for cidr in &args.allow_private {
        let c = latchkey::upstream::Cidr::parse(cidr)
            .map_err(|e| anyhow::anyhow!("--allow-private {cidr:?}: {e}"))?;
        upstream.allow_private.push(c);
    }
    // Bind before building the proxy, so the guard knows latchkey's real address (port 0 too).
    let std_listener = std::net::TcpListener::bind(args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    std_listener.set_nonblocking(true)?;
    let local = std_listener.local_addr()?;
    upstream.own.push(local);
    let admin_listener = match args.admin.as_str() {
        "off" => None,
        addr => {
            let addr: std::net::SocketAddr = addr
                .parse()
                .map_err(|_| anyhow::anyhow!("--admin {addr:?}: expected ADDR:PORT or off"))?;
            let l = std::net::TcpListener::bind(addr)
                .with_context(|| format!("cannot listen on --admin {addr}"))?;
            l.set_nonblocking(true)?;
            // The admin API is never reachable through the proxy itself.
            upstream.own.push(l.local_addr()?);
            Some(l)
        }
    };
    let token = args.admin_token.as_deref().map(admin_token).transpose()?;
    anyhow::ensure!(
        !args.body_timeout.is_zero(),
        "--body-timeout must be more than 0s"
    );
    let (ca, outcome) = CertAuthority::load_or_create(&args.ca_dir)?;
    if outcome == InitOutcome::Created {
        tracing::info!(path = %ca.cert_path().display(), "created a new CA; sandboxes must trust it (latchkey env)");
    }
    let audit = AuditLog::open(&args.audit)?;
    let rules = policy.rules().len();
    let digest = policy.digest().to_string();
    let proxy = Proxy::new(ProxyConfig {
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
            ..Limits::default()
        },
        policies_dir: policies,
        report_all: args.mode == "report",
        max_decoded_body: args.max_decoded_body as u64,
        max_buffered_bytes: args.max_buffered_bytes,
        max_buffered_bytes_per_client: args.max_buffered_bytes_per_client.unwrap_or(
            args.max_buffered_bytes / latchkey::proxy::budget::DEFAULT_CLIENT_SHARE_DIVISOR,
        ),
        body_timeout: args.body_timeout,
    })?;

    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = args.workers {
        anyhow::ensure!(n > 0, "--workers must be at least 1");
        builder.worker_threads(n);
    }
    let runtime = builder.build().context("cannot start the async runtime")?;
    let audit = proxy.audit().clone();
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(std_listener)?;
        let addr = listener.local_addr()?;
        tracing::info!(listen.addr = %addr, policy.digest = %digest, policy.rules = rules, audit = %args.audit.display(), "proxy ready");
        // A fixed line for scripts and tests to wait on.
        eprintln!("latchkey: proxy listening on {addr}");
        if let Some(l) = admin_listener {
            let l = tokio::net::TcpListener::from_std(l)?;
            let admin = l.local_addr()?;
            tracing::info!(admin.addr = %admin, "admin API ready");
            eprintln!("latchkey: admin listening on {admin}");
            tokio::spawn(latchkey::admin::serve(proxy.clone(), l, token));
        }
        if args.mode == "report" {
            tracing::warn!("report-only mode: policy denials are let through and audited with would_deny");
        }
        tokio::spawn(proxy.clone().watch_policies());
        let serving = tokio::spawn(proxy.clone().serve(listener));
        shutdown_signal().await;
        tracing::info!(deadline = ?args.shutdown_timeout, "shutting down: no new connections, finishing requests in flight");
        proxy.begin_shutdown();
        let _ = serving.await;
        let left = proxy.drain(args.shutdown_timeout).await;
        if left > 0 {
            tracing::warn!(connections = left, "shutdown deadline passed; closing remaining connections");
        } else {
            tracing::info!("all connections finished");
        }
        anyhow::Ok(())
    });
    // Tasks still holding records write them as they are dropped; then the queue is drained.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    if !audit.flush(std::time::Duration::from_secs(10)) {
        tracing::error!("the audit writer did not finish in time; records may be missing");
    }
    served?;
    Ok(ExitCode::SUCCESS)
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

fn ca(action: CaAction) -> anyhow::Result<ExitCode> {
    match action {
        CaAction::Init { ca_dir } => {
            let outcome = latchkey::proxy::ca::init(&ca_dir)?;
            let ca = CertAuthority::load(&ca_dir)?;
            match outcome {
                InitOutcome::Created => println!("created CA in {}", ca_dir.display()),
                InitOutcome::Existing => {
                    println!("CA already exists in {} (left unchanged)", ca_dir.display())
                }
            }
            println!("certificate: {}", ca.cert_path().display());
            println!("sha256:      {}", ca.fingerprint());
            println!(
                "trust it in a sandbox with: eval \"$(latchkey env --ca-dir {})\"",
                ca_dir.display()
            );
        }
        CaAction::Show { ca_dir } => {
            let ca = CertAuthority::load(&ca_dir)?;
            println!("certificate: {}", ca.cert_path().display());
            println!("sha256:      {}", ca.fingerprint());
            print!("{}", ca.cert_pem());
        }
    }
    Ok(ExitCode::SUCCESS)
}

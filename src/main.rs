//! The `latchkey` command line: parse flags, call into the library, print errors once.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use latchkey::audit::AuditLog;
use latchkey::policy::{self, ConnectDecision, LoadError, Scheme, Target};
use latchkey::proxy::limits::Limits;
use latchkey::proxy::{CertAuthority, InitOutcome, Proxy, ProxyConfig};
use latchkey::reason::Reason;
use latchkey::sandbox_env;
use latchkey::upstream::{parse_resolve, UpstreamConfig};

/// latchkey: a credential-brokering egress proxy for AI-agent sandboxes.
///
/// Point a sandbox's HTTP_PROXY/HTTPS_PROXY at `latchkey serve`; every request is checked
/// against the policy files (deny by default), intercepted with latchkey's own CA, and written
/// to the audit log. Start with `latchkey serve` (example policy, CA created in ./certs), then
/// `eval "$(latchkey env)"` in the sandbox.
#[derive(Parser, Debug)]
#[command(name = "latchkey", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the proxy.
    Serve(ServeArgs),
    /// Validate policy files; print every problem as file:line:col: message.
    Check {
        #[arg(long, env = "LATCHKEY_POLICIES", default_value = "policies")]
        policies: PathBuf,
    },
    /// Show what policy decides for one request, and why.
    Explain {
        #[arg(long, env = "LATCHKEY_POLICIES", default_value = "policies")]
        policies: PathBuf,
        /// The sandbox identity asking (identities come with policy [identities]).
        #[arg(long, env = "LATCHKEY_IDENTITY", default_value = "default")]
        identity: String,
        /// Print JSON instead of text.
        #[arg(long)]
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
    /// Print the environment a sandbox needs (proxy variables and a trust bundle).
    Env {
        /// The proxy URL the sandbox reaches latchkey at.
        #[arg(long, env = "LATCHKEY_PROXY", default_value = "http://127.0.0.1:3128")]
        proxy: String,
        #[arg(long, env = "LATCHKEY_CA_DIR", default_value = "certs")]
        ca_dir: PathBuf,
        #[arg(long, env = "LATCHKEY_FORMAT", value_enum, default_value = "shell")]
        format: sandbox_env::Format,
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
    /// Directory of *.toml policy files.
    #[arg(long, env = "LATCHKEY_POLICIES", default_value = "policies")]
    policies: PathBuf,
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
}

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
        Command::Serve(args) => serve(args),
        Command::Check { policies } => Ok(check(&policies)),
        Command::Explain {
            policies,
            identity,
            json,
            method,
            url,
        } => explain(&policies, &identity, json, &method, &url),
        Command::Ca { action } => ca(action),
        Command::Env {
            proxy,
            ca_dir,
            format,
        } => {
            let (ca, _) = CertAuthority::load_or_create(&ca_dir)?;
            let vars = sandbox_env::variables(&proxy, &ca_dir, ca.cert_pem())?;
            print!("{}", sandbox_env::render(&vars, format));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Loads a policy directory, printing each problem on its own line.
fn load_policy(dir: &Path) -> Result<policy::Policy, ExitCode> {
    policy::load_dir(dir).map_err(|e| {
        match &e {
            LoadError::Invalid(problems) => {
                for p in problems {
                    eprintln!("{p}");
                }
                eprintln!(
                    "latchkey: error: {} problem(s) in policy {}",
                    problems.len(),
                    dir.display()
                );
            }
            other => eprintln!("latchkey: error: {other}"),
        }
        ExitCode::from(1)
    })
}

fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    // Validate everything before binding: an invalid policy never serves.
    let policy = match load_policy(&args.policies) {
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
    })?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(std_listener)?;
        let addr = listener.local_addr()?;
        tracing::info!(listen.addr = %addr, policy.digest = %digest, policy.rules = rules, audit = %args.audit.display(), "proxy ready");
        // A fixed line for scripts and tests to wait on.
        eprintln!("latchkey: proxy listening on {addr}");
        proxy.serve(listener, shutdown_signal()).await;
        tracing::info!("shutting down");
        anyhow::Ok(())
    })?;
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

fn check(dir: &Path) -> ExitCode {
    match load_policy(dir) {
        Ok(p) => {
            println!(
                "ok: {} rule(s) in {} file(s), policy {}",
                p.rules().len(),
                p.files().len(),
                p.digest()
            );
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

fn explain(
    dir: &Path,
    identity: &str,
    json: bool,
    method: &str,
    url: &str,
) -> anyhow::Result<ExitCode> {
    let policy = match load_policy(dir) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let ident = if policy.identities().is_empty() {
        if identity != "default" {
            anyhow::bail!("unknown identity {identity:?}: the policy defines no identities, so every request is \"default\"");
        }
        None
    } else {
        match policy.identity(identity) {
            Some(i) => Some(i),
            None => {
                let known: Vec<&str> = policy
                    .identities()
                    .iter()
                    .map(|i| i.name.as_str())
                    .collect();
                anyhow::bail!(
                    "unknown identity {identity:?}; the policy defines: {}",
                    known.join(", ")
                );
            }
        }
    };
    let method = http::Method::from_bytes(method.as_bytes())
        .map_err(|_| anyhow::anyhow!("invalid method {method:?}"))?;
    let uri: http::Uri = url
        .parse()
        .with_context(|| format!("invalid URL {url:?}"))?;
    let scheme = match uri.scheme_str() {
        Some("http") => Scheme::Http,
        Some("https") => Scheme::Https,
        _ => anyhow::bail!("URL {url:?} must be absolute http:// or https://"),
    };
    let authority = uri
        .authority()
        .ok_or_else(|| anyhow::anyhow!("URL {url:?} has no host"))?;
    if authority.as_str().contains('@') {
        anyhow::bail!(
            "URL {url:?} carries userinfo: latchkey refuses such requests (userinfo_in_url)"
        );
    }
    let host = policy::normalize_host(authority.host())?;
    let port = authority.port_u16().unwrap_or(scheme.default_port());
    let path = if uri.path().is_empty() {
        "/"
    } else {
        uri.path()
    };

    let connect = (scheme == Scheme::Https).then(|| policy.decide_connect(&host, port, ident));
    let (reason, rule, message) = match connect {
        Some(ConnectDecision::Tunnel(rule)) => (
            Reason::Tunnel,
            Some(rule),
            format!(
                "rule '{}' relays CONNECT {host}:{port} as a raw tunnel (no interception)",
                rule.name
            ),
        ),
        Some(ConnectDecision::Deny(d)) => (d.reason, d.rule, d.message),
        _ if latchkey::proxy::is_ambiguous_path(path) => (
            Reason::AmbiguousPath,
            None,
            format!("path {path:?} has dot segments or encoded slashes"),
        ),
        _ => {
            let d = policy.decide(&Target {
                identity: ident,
                scheme,
                host: &host,
                port,
                method: &method,
                path,
            });
            (d.reason, d.rule, d.message)
        }
    };
    let allowed = reason.is_allow();
    let injects: Vec<String> = rule
        .filter(|_| allowed)
        .map(|r| {
            let mut v: Vec<String> = r
                .inject_headers
                .iter()
                .map(|(n, _)| n.to_string())
                .collect();
            v.extend(r.inject_query.iter().map(|(k, _)| format!("?{k}")));
            if r.inject_basic.is_some() {
                v.push("authorization (basic)".to_string());
            }
            v
        })
        .unwrap_or_default();
    let secrets: Vec<String> = rule
        .filter(|_| allowed)
        .map(|r| r.bound.iter().cloned().collect())
        .unwrap_or_default();
    if json {
        let v = serde_json::json!({
            "decision": if allowed { "allow" } else { "deny" },
            "reason": reason.code(),
            "rule": rule.map(|r| r.name.clone()),
            "rule_origin": rule.map(|r| r.origin.to_string()),
            "message": message,
            "identity": identity,
            "injected_headers": injects,
            "secrets": secrets,
            "policy": policy.digest(),
        });
        println!("{v}");
    } else {
        println!("decision: {}", if allowed { "allow" } else { "deny" });
        println!("reason:   {}", reason.code());
        match rule {
            Some(r) => println!("rule:     {} ({})", r.name, r.origin),
            None => println!("rule:     none"),
        }
        if let Some(d) = rule.and_then(|r| r.description.as_deref()) {
            println!("about:    {d}");
        }
        println!("why:      {message}");
        if !injects.is_empty() {
            println!("injects:  {} (names only)", injects.join(", "));
        }
        if !secrets.is_empty() {
            println!(
                "secrets:  {} (bound to this rule's hosts)",
                secrets.join(", ")
            );
        }
        println!("policy:   {}", policy.digest());
    }
    Ok(if allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
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

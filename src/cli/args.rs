//! The command line as clap reads it: every command, flag, environment variable and help text.
//!
//! Only types live here; each command's behaviour is in its own module under [`super`]. The
//! book's CLI reference (docs/src/reference/cli.md) and `tests/it/docs.rs` check these against
//! the built binary's `--help`, so a flag added here without its documentation fails the build.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// latchkey: a credential-brokering egress proxy for AI-agent sandboxes.
///
/// Point a sandbox's HTTP_PROXY/HTTPS_PROXY at `latchkey serve`; every request is checked
/// against the policy files (deny by default), intercepted with latchkey's own CA, and written
/// to the audit log. Start with `latchkey serve` (example policy, CA created in ./certs), then
/// `eval "$(latchkey env)"` in the sandbox.
#[derive(Parser, Debug)]
#[command(name = "latchkey", version = env!("LATCHKEY_VERSION"), propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The command line as the binary, `completions` and `man` show it: clap's definitions with
/// `serve`'s flags arranged under headings ([`super::serve_help`]).
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command().mut_subcommand("serve", super::serve_help::arrange)
}

/// `--format` of the commands that print either a report for people or JSON for programs.
// Plain comments on the variants: doc comments would change `--help`'s "possible values" line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    // Lines for people.
    Text,
    // One JSON document.
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the proxy.
    // Boxed: ServeArgs is far larger than the other variants (clippy::large_enum_variant).
    Serve(Box<ServeArgs>),
    /// Validate policy files: every problem at file:line:col.
    ///
    /// Prints every problem as file:line:col: message, and warnings about risky constructs as
    /// file:line:col: warning: message.
    Check {
        #[arg(long, env = "LATCHKEY_POLICIES", default_value = "policies")]
        policies: PathBuf,
        /// `json`: one object {ok, errors, warnings, rules, files, policy} for CI annotations.
        #[arg(
            long,
            env = "LATCHKEY_CHECK_FORMAT",
            value_enum,
            default_value = "text"
        )]
        format: super::policy::CheckFormat,
        /// Validate secret sources without reading their values (CI machines without the keys).
        #[arg(long, env = "LATCHKEY_NO_SECRETS")]
        no_secrets: bool,
    },
    /// Run the policy test cases against the policy.
    ///
    /// Runs DIR/tests/*.toml (by default); exit 1 on any failure. Secret values are never read.
    Test {
        #[arg(long, env = "LATCHKEY_POLICIES", default_value = "policies")]
        policies: PathBuf,
        /// Directory of *.toml test files (default: POLICIES/tests).
        #[arg(long, env = "LATCHKEY_TESTS")]
        tests: Option<PathBuf>,
    },
    /// Show what policy decides for a request ([METHOD] URL), and why.
    ///
    /// METHOD defaults to GET.
    #[command(
        override_usage = "latchkey explain [OPTIONS] [METHOD] <URL>\n       latchkey explain [OPTIONS] --reach <IDENTITY>"
    )]
    Explain {
        #[arg(long, env = "LATCHKEY_POLICIES", default_value = "policies")]
        policies: PathBuf,
        /// The sandbox identity asking (identities come with policy [identities]).
        #[arg(long, env = "LATCHKEY_IDENTITY", default_value = "default")]
        identity: String,
        /// `text`, or `json` for programs.
        #[arg(
            long,
            env = "LATCHKEY_EXPLAIN_FORMAT",
            value_enum,
            default_value = "text"
        )]
        format: OutputFormat,
        /// The same as --format json (an older spelling).
        #[arg(long, env = "LATCHKEY_EXPLAIN_JSON", hide = true)]
        json: bool,
        /// Instead of deciding a request: list everything IDENTITY could reach under the
        /// policy, one item per line, and the `reach` digest its audit records carry.
        #[arg(
            long,
            env = "LATCHKEY_EXPLAIN_REACH",
            value_name = "IDENTITY",
            conflicts_with = "request"
        )]
        reach: Option<String>,
        /// A request header `NAME:VALUE`, for `headers` predicates and denials (repeatable).
        #[arg(long = "header", value_name = "NAME:VALUE", conflicts_with = "reach")]
        headers: Vec<String>,
        /// The request body, for `body` and `graphql` predicates: `@FILE` reads a file, anything
        /// else is the body itself (none: an empty body, as the proxy decides a request without
        /// one).
        #[arg(long, value_name = "@FILE|STRING", conflicts_with = "reach")]
        body: Option<String>,
        /// The body's content type (sent as `content-type` too unless a --header gives one).
        #[arg(long, value_name = "TYPE", conflicts_with = "reach")]
        content_type: Option<String>,
        /// `[METHOD] URL`: the HTTP method (default GET) and the absolute URL, e.g. `POST
        /// https://api.github.com/repos`.
        #[arg(
            value_name = "REQUEST",
            num_args = 1..=2,
            required_unless_present = "reach"
        )]
        request: Vec<String>,
    },
    /// Manage latchkey's certificate authority.
    Ca {
        #[command(subcommand)]
        action: CaAction,
    },
    /// Show allow, inject, redact and deny working, offline.
    ///
    /// A local HTTPS echo upstream, a demo policy and secret, and `latchkey serve` on them;
    /// prints each curl command and what it showed, checks every outcome, then stays up for the
    /// commands to be pasted.
    Demo {
        /// Keep the demo's files (policy, CA, audit log, log) here; default: a temp directory,
        /// removed on exit.
        #[arg(long, env = "LATCHKEY_DEMO_DIR")]
        dir: Option<PathBuf>,
        /// Address the demo's latchkey listens on (loopback; port 0 picks a free port).
        #[arg(long, env = "LATCHKEY_DEMO_LISTEN", default_value = super::demo::DEFAULT_LISTEN)]
        listen: SocketAddr,
        /// Exit after the self-check (0 when every check passed) instead of staying up.
        #[arg(long, env = "LATCHKEY_DEMO_ONCE")]
        once: bool,
    },
    /// Print the environment a sandbox needs (proxies, trust bundle).
    ///
    /// The proxy variables and a trust bundle (system roots plus latchkey's CA) for every common
    /// client. Reads the CA `serve` or `ca init` made in --ca-dir; never creates one.
    Env {
        /// The proxy URL the sandbox reaches latchkey at.
        #[arg(long, env = "LATCHKEY_PROXY", default_value = "http://127.0.0.1:3128")]
        proxy: String,
        #[arg(long, env = "LATCHKEY_CA_DIR", default_value = "certs")]
        ca_dir: PathBuf,
        #[arg(long, env = "LATCHKEY_FORMAT", value_enum, default_value = "shell")]
        format: super::env::Format,
        /// Hosts kept off the proxy (NO_PROXY/no_proxy); `''` leaves both out, so loopback
        /// requests go through latchkey too.
        #[arg(long = "no-proxy", env = "LATCHKEY_NO_PROXY", value_name = "LIST", default_value = super::env::DEFAULT_NO_PROXY)]
        no_proxy: String,
        /// Also add the CA to this system's trust store (Debian, Ubuntu, Alpine), as `latchkey
        /// ca install` does; what it did goes to stderr, so `eval "$(latchkey env --install)"`
        /// still works.
        #[arg(long)]
        install: bool,
        /// With --install: the system root to act on (an image being built).
        #[arg(long, env = "LATCHKEY_ROOT", default_value = "/", requires = "install")]
        root: PathBuf,
    },
    /// Print or apply nftables rules routing a sandbox via latchkey.
    ///
    /// TCP 80/443 to `serve --transparent`, DNS to `serve --dns`, everything else dropped, IPv4
    /// and IPv6, in the table `inet latchkey`; `--apply` loads them, `--remove` deletes the
    /// table.
    GatewaySetup(GatewaySetupArgs),
    /// Answer requests waiting for a person, via the admin API.
    ///
    /// Through a running latchkey's admin API: list, show, approve, deny, and export standing
    /// grants as policy rules.
    Approvals(super::approvals::ApprovalsArgs),
    /// Admit, list and revoke runtime sessions, via the admin API.
    ///
    /// A session is made from a `[profiles.NAME]` of the policy, only ever narrower; its token
    /// is shown once. Revoking it refuses its next request and cuts its connections.
    Sessions(super::sessions::SessionsArgs),
    /// Check a running latchkey is ready (exit 0), via its admin API.
    ///
    /// `GET /readyz` (or `/healthz` with --live) on `serve --admin`: for container health
    /// checks and init systems, so an image needs no shell or curl.
    Health(super::health::HealthArgs),
    /// Read and check the audit log (key, verify, query, summary).
    ///
    /// Print the signing key, verify the chain and checkpoints, query records, summarise them
    /// per identity.
    Audit {
        #[command(subcommand)]
        action: AuditAction,
    },
    /// Show what a policy change allows or no longer allows.
    ///
    /// Hosts, ports, methods and paths newly reachable or no longer reachable (each with an
    /// example request), secrets and credentials newly bound to a host, tunnel, report-only and
    /// allow_private changes. Exit 0 when nothing widened, 3 when the change widens reach.
    Diff(super::diff::DiffArgs),
    /// Propose least-privilege rules from the traffic in audit logs.
    ///
    /// Covers the traffic recorded (under `serve --mode report`), with a policy test file
    /// pinning each rule; never a secret binding.
    Learn(super::learn::LearnArgs),
    /// Print a shell completion script.
    ///
    /// Generated from the same definitions as `--help`: `source <(latchkey completions bash)`,
    /// or write it where the shell loads completions from.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page of latchkey or of one command.
    ///
    /// roff on stdout: `latchkey man serve | man -l -`, `latchkey man > latchkey.1`.
    Man {
        /// The command (and subcommand) whose page to print, e.g. `serve` or `audit query`.
        command: Vec<String>,
    },
}

/// `--audit-format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuditFormat {
    Jsonl,
    Ocsf,
}

impl From<AuditFormat> for crate::audit::Format {
    fn from(f: AuditFormat) -> Self {
        match f {
            AuditFormat::Jsonl => Self::Jsonl,
            AuditFormat::Ocsf => Self::Ocsf,
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum AuditAction {
    /// Print the public key that signs the audit log's checkpoints (creating the key, 0600,
    /// if absent), as `ed25519:BASE64` for `audit verify --key`.
    Key {
        #[arg(long, env = "LATCHKEY_CA_DIR", default_value = "certs")]
        ca_dir: PathBuf,
        /// The key file (default: CA_DIR/latchkey-audit.key).
        #[arg(long, env = "LATCHKEY_AUDIT_KEY", value_name = "PATH")]
        audit_key: Option<PathBuf>,
    },
    /// Check the hash chain and the signed checkpoints across FILEs (an audit file, its
    /// rotated segments, or a directory holding them); report the first edited, deleted,
    /// reordered or truncated record. Exit 0 when intact, 1 when not.
    Verify {
        /// Audit files or directories, in any order (they are put in chain order).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The public key to trust, `ed25519:BASE64` (default: the local key's public half).
        #[arg(long, env = "LATCHKEY_VERIFY_KEY", value_name = "KEY")]
        key: Option<String>,
        #[arg(long, env = "LATCHKEY_CA_DIR", default_value = "certs")]
        ca_dir: PathBuf,
        /// The local key file whose public half is trusted without --key.
        #[arg(long, env = "LATCHKEY_AUDIT_KEY", value_name = "PATH")]
        audit_key: Option<PathBuf>,
        /// `text`, or `json` for programs.
        #[arg(
            long,
            env = "LATCHKEY_VERIFY_FORMAT",
            value_enum,
            default_value = "text"
        )]
        format: OutputFormat,
        /// The same as --format json (an older spelling).
        #[arg(long, env = "LATCHKEY_VERIFY_JSON", hide = true)]
        json: bool,
    },
    /// Print the records that match every filter given, as JSON lines or a table.
    Query(super::audit_query::QueryArgs),
    /// Per identity: hosts reached, denials by reason, secrets used, bytes up and down.
    Summary(super::audit_query::SummaryArgs),
}

#[derive(clap::Args, Debug)]
pub struct GatewaySetupArgs {
    /// The sandbox's interface (its veth or bridge on this host); a trailing `*` matches every
    /// interface with that prefix. Exactly one of --interface and --cgroup.
    #[arg(long, env = "LATCHKEY_INTERFACE", value_name = "IFACE", value_parser = super::gateway_setup::parse_interface)]
    pub interface: Option<String>,
    /// The sandbox's cgroup (v2) on this host, e.g. `sandbox.slice/agent`: its sockets and those
    /// of every cgroup below it. Run latchkey outside it.
    #[arg(long, env = "LATCHKEY_CGROUP", value_name = "PATH", value_parser = super::gateway_setup::parse_cgroup)]
    pub cgroup: Option<String>,
    /// TCP ports redirected to the transparent listener: a comma-separated list, or `all`.
    #[arg(long, env = "LATCHKEY_PORTS", value_name = "LIST|all", default_value = "80,443", value_parser = super::gateway_setup::parse_ports)]
    pub ports: super::gateway_setup::Ports,
    /// The port of `serve --transparent` on this host.
    #[arg(long, env = "LATCHKEY_TRANSPARENT_PORT", value_name = "PORT", default_value_t = 15001, value_parser = clap::value_parser!(u16).range(1..))]
    pub transparent_port: u16,
    /// The port of `serve --dns` on this host; DNS (UDP and TCP 53, to any address) goes there.
    #[arg(long, env = "LATCHKEY_DNS_PORT", value_name = "PORT", default_value_t = 15053, value_parser = clap::value_parser!(u16).range(1..))]
    pub dns_port: u16,
    /// TCP ports of this host the sandbox may still connect to directly, e.g. 3128 (`serve
    /// --listen`) or 1080 (`--socks`); default: none.
    #[arg(long, env = "LATCHKEY_LOCAL_PORTS", value_name = "LIST", value_parser = super::gateway_setup::parse_local_ports)]
    pub local_ports: Option<super::gateway_setup::PortList>,
    /// Capture TCP with nftables `tproxy` instead of NAT `redirect` (for `serve --transparent
    /// --transparent-tproxy`), with the policy routing it needs (`ip rule`/`ip route`, printed;
    /// added by --apply, deleted by --remove --tproxy). --interface only.
    #[arg(long, env = "LATCHKEY_TPROXY")]
    pub tproxy: bool,
    /// Close this host to the sandboxes on --interface instead (latchkey runs in a container or
    /// VM beside them): drop everything they open on this host's own addresses, but
    /// --local-ports, in the table `inet latchkey_host`.
    #[arg(long, env = "LATCHKEY_HOST_GUARD", conflicts_with_all = ["cgroup", "ports", "transparent_port", "dns_port", "tproxy"])]
    pub host_guard: bool,
    /// Load the rules with `nft -f -` (replacing latchkey's earlier ones) instead of printing
    /// them.
    #[arg(long, conflicts_with = "remove")]
    pub apply: bool,
    /// Delete the table `inet latchkey` (with --host-guard: `inet latchkey_host`); nothing
    /// else is touched.
    #[arg(long)]
    pub remove: bool,
}

#[derive(Subcommand, Debug)]
pub enum CaAction {
    /// Create the CA (latchkey-ca.pem, latchkey-ca.key with mode 0600) unless it exists.
    Init {
        #[arg(long, env = "LATCHKEY_CA_DIR", default_value = "certs")]
        ca_dir: PathBuf,
        /// Then write what sandboxes need to trust it into this directory, never the key: the
        /// certificate, the bundle `env` names (system roots plus the CA) and the JVM
        /// truststore (a compose one-shot's job, with no shell in the image).
        #[arg(long, value_name = "DIR")]
        export: Option<PathBuf>,
    },
    /// Print the CA certificate's path, fingerprint and PEM.
    Show {
        #[arg(long, env = "LATCHKEY_CA_DIR", default_value = "certs")]
        ca_dir: PathBuf,
    },
    /// Add the CA to a Debian, Ubuntu or Alpine system trust store
    /// (/usr/local/share/ca-certificates/latchkey.crt, then update-ca-certificates).
    Install {
        #[arg(long, env = "LATCHKEY_CA_DIR", default_value = "certs")]
        ca_dir: PathBuf,
        /// Act on the system under this root (an image being built): the certificate is
        /// written there, and update-ca-certificates runs only for the root `/`.
        #[arg(long, env = "LATCHKEY_ROOT", default_value = "/")]
        root: PathBuf,
    },
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// A TOML file of serve's flags, one key per flag as typed without the dashes (`listen =
    /// "127.0.0.1:3128"`, `resolve = ["api.test=10.0.0.1"]`, `audit-sync = true`). A flag on
    /// the command line, then its variable, wins over the file; an unknown key is an error.
    #[arg(long, env = "LATCHKEY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory of *.toml policy files [default: policies]. When not given and ./policies does
    /// not exist, it is created holding the commented example policy (and its policy tests).
    #[arg(long, env = "LATCHKEY_POLICIES")]
    pub policies: Option<PathBuf>,
    /// Address the proxy listens on (port 0 picks a free port).
    #[arg(long, env = "LATCHKEY_LISTEN", default_value = "127.0.0.1:3128")]
    pub listen: SocketAddr,
    /// Directory holding latchkey's CA; created with a new CA if absent (only `serve` and `ca
    /// init` create one).
    #[arg(long, env = "LATCHKEY_CA_DIR", default_value = "certs")]
    pub ca_dir: PathBuf,
    /// Audit log (JSON lines, appended, hash-chained); `-` for stdout.
    #[arg(long, env = "LATCHKEY_AUDIT", default_value = "audit.jsonl")]
    pub audit: PathBuf,
    /// `fdatasync` the audit log once per group of records, so a decision record survives a
    /// power loss, not only a crash, before its upstream is dialed.
    #[arg(long, env = "LATCHKEY_AUDIT_SYNC")]
    pub audit_sync: bool,
    /// Close the audit file and start a new one at a size, an age or both: `100MiB`, `1h`,
    /// `100MiB,1h`. Closed segments are named audit-<first seq>-<UTC time>.jsonl.
    #[arg(long, env = "LATCHKEY_AUDIT_ROTATE", value_name = "SIZE|AGE", value_parser = crate::audit::segments::Rotation::parse)]
    pub audit_rotate: Option<crate::audit::segments::Rotation>,
    /// Remove closed audit segments older than this (`30d`); while shipping is on, only those
    /// already shipped.
    #[arg(long, env = "LATCHKEY_AUDIT_KEEP", value_name = "AGE", value_parser = humantime::parse_duration)]
    pub audit_keep: Option<Duration>,
    /// `jsonl` (latchkey's record) or `ocsf` (OCSF 1.x HTTP Activity 4002, Network Activity
    /// 4001 for refused connections).
    #[arg(
        long,
        env = "LATCHKEY_AUDIT_FORMAT",
        value_enum,
        default_value = "jsonl"
    )]
    pub audit_format: AuditFormat,
    /// The Ed25519 key that signs the audit log's checkpoints (created 0600 if absent, refused
    /// if group or others may read it; default: CA_DIR/latchkey-audit.key). `latchkey audit
    /// key` prints its public half.
    #[arg(long, env = "LATCHKEY_AUDIT_KEY", value_name = "PATH")]
    pub audit_key: Option<PathBuf>,
    /// The AES-256 key that seals captured OAuth tokens in the state store (created 0600 if
    /// absent, refused if group or others may read it; default: CA_DIR/capture.key). Replicas
    /// sharing a store share this key.
    #[arg(long, env = "LATCHKEY_CAPTURE_KEY", value_name = "PATH")]
    pub capture_key: Option<PathBuf>,
    /// When a secret held in a store (vault:, aws-sm:, aws-ssm:) cannot be fetched at start:
    /// `refuse` (exit, naming every one), `wait` (keep trying, serving nothing until all are
    /// fetched), or `serve` (start; requests that need them get 503 secret_unavailable until
    /// they are fetched).
    #[arg(
        long,
        env = "LATCHKEY_SECRETS_STARTUP",
        value_enum,
        default_value = "refuse"
    )]
    pub secrets_startup: SecretsStartup,
    /// Write a signed checkpoint after this many audit lines...
    #[arg(long, env = "LATCHKEY_AUDIT_CHECKPOINT_EVERY", value_name = "N", default_value_t = crate::audit::CHECKPOINT_EVERY, value_parser = clap::value_parser!(u64).range(1..))]
    pub audit_checkpoint_every: u64,
    /// ...or this long after the first line no checkpoint covers yet.
    #[arg(long, env = "LATCHKEY_AUDIT_CHECKPOINT_INTERVAL", value_name = "AGE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub audit_checkpoint_interval: Duration,
    /// Ship closed audit segments to S3-compatible storage, `s3://BUCKET/PREFIX`, signed with
    /// SigV4 by latchkey's own AWS identity (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
    /// AWS_SESSION_TOKEN, shared files, web identity, container credentials, IMDSv2 with
    /// --aws-imds), through the guarded dialer; unshipped segments wait on disk.
    #[arg(long, env = "LATCHKEY_AUDIT_SHIP", value_name = "URL")]
    pub audit_ship: Option<String>,
    /// The S3 endpoint for --audit-ship (default: https://s3.REGION.amazonaws.com), e.g. a
    /// MinIO or other S3-compatible store.
    #[arg(long, env = "LATCHKEY_AUDIT_SHIP_ENDPOINT", value_name = "URL")]
    pub audit_ship_endpoint: Option<String>,
    /// The region --audit-ship signs for.
    #[arg(long, env = "LATCHKEY_AUDIT_SHIP_REGION", default_value = "us-east-1")]
    pub audit_ship_region: String,
    /// Export one OpenTelemetry span per request over OTLP/HTTP to this collector URL
    /// (e.g. http://127.0.0.1:4318), and propagate W3C trace context upstream.
    #[arg(long, env = "LATCHKEY_OTLP", value_name = "URL")]
    pub otlp: Option<String>,
    /// The request header that names the sandbox's session (recorded as `session`, stripped
    /// before forwarding unless a rule keeps it).
    #[arg(
        long,
        env = "LATCHKEY_SESSION_HEADER",
        value_name = "NAME",
        default_value = "x-latchkey-session"
    )]
    pub session_header: String,
    /// Extra PEM bundle trusted for upstream TLS, besides the webpki roots: the CA of an
    /// upstream on this machine or an internal network (`502 upstream_tls` ... `UnknownIssuer`
    /// without it).
    #[arg(long, env = "LATCHKEY_UPSTREAM_CA", value_name = "PEM")]
    pub upstream_ca: Option<PathBuf>,
    /// Open a non-public address range for every rule, e.g. 10.1.2.0/24 (repeatable). Cloud
    /// metadata opens only with its exact address (169.254.169.254/32).
    #[arg(
        long = "allow-private",
        env = "LATCHKEY_ALLOW_PRIVATE",
        value_name = "CIDR",
        value_delimiter = ','
    )]
    pub allow_private: Vec<String>,
    /// Let latchkey's own AWS identity use the EC2 instance metadata service (IMDSv2 only, at
    /// 169.254.169.254 or AWS_EC2_METADATA_SERVICE_ENDPOINT) when the environment, the shared
    /// files, web identity and the container endpoint give no keys. Off: a proxy host's
    /// instance role is not used unless asked for.
    #[arg(long = "aws-imds", env = "LATCHKEY_AWS_IMDS")]
    pub aws_imds: bool,
    /// Pin a host name to an address, like curl's --resolve (repeatable): a name only this
    /// machine knows, or a test name for a local upstream.
    #[arg(
        long = "resolve",
        env = "LATCHKEY_RESOLVE",
        value_name = "HOST=IP",
        value_delimiter = ','
    )]
    pub resolve: Vec<String>,
    /// Chain every upstream connection through this egress proxy: `http://HOST:PORT` (HTTP
    /// CONNECT) or `socks5://HOST:PORT`. latchkey still resolves and checks every address and
    /// asks the proxy for `CONNECT IP:PORT` (the checked address, never the name); its own TLS
    /// runs end to end inside the tunnel, plain-http upstreams included.
    #[arg(long, env = "LATCHKEY_UPSTREAM_PROXY", value_name = "URL")]
    pub upstream_proxy: Option<String>,
    /// The upstream proxy's user and where its password comes from, `USER:SOURCE` with SOURCE
    /// `env:VAR`, `file:PATH` or `exec:COMMAND` (never the password itself): sent as
    /// `Proxy-Authorization: Basic` or SOCKS5 username/password.
    #[arg(
        long,
        env = "LATCHKEY_UPSTREAM_PROXY_CREDENTIALS",
        value_name = "USER:SOURCE",
        requires = "upstream_proxy"
    )]
    pub upstream_proxy_credentials: Option<String>,
    /// Destinations dialed directly, not through --upstream-proxy (comma-separated): exact
    /// hosts, `.suffix` or `*.suffix` (names under it), IP addresses and CIDRs, e.g.
    /// `10.0.0.0/8,.internal,localhost`.
    #[arg(
        long,
        env = "LATCHKEY_UPSTREAM_PROXY_BYPASS",
        value_name = "LIST",
        value_delimiter = ',',
        requires = "upstream_proxy"
    )]
    pub upstream_proxy_bypass: Vec<String>,
    /// How long to wait for an upstream's response headers.
    #[arg(long, env = "LATCHKEY_RESPONSE_TIMEOUT", default_value = "300s", value_parser = humantime::parse_duration)]
    pub response_timeout: Duration,
    /// How long to wait for an upstream TCP connection.
    #[arg(long, env = "LATCHKEY_CONNECT_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
    /// Time a client has to send a request's headers (also the keep-alive idle time).
    #[arg(long, env = "LATCHKEY_HEADER_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub header_timeout: Duration,
    /// A connection (tunnels included) with no traffic for this long is closed.
    #[arg(long, env = "LATCHKEY_IDLE_TIMEOUT", default_value = "300s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
    /// Most connections open at once; more get 503.
    #[arg(long, env = "LATCHKEY_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// Most connections one client address may hold open; more get 503.
    #[arg(
        long,
        env = "LATCHKEY_MAX_CONNECTIONS_PER_CLIENT",
        default_value_t = 256
    )]
    pub max_connections_per_client: usize,
    /// Admin API address (health, status, metrics, reload, explain); `off` to disable.
    #[arg(long, env = "LATCHKEY_ADMIN", default_value = "127.0.0.1:3129")]
    pub admin: String,
    /// Require `Authorization: Bearer TOKEN` on the admin API; TOKEN from `env:VAR` or `file:PATH`.
    #[arg(long, env = "LATCHKEY_ADMIN_TOKEN", value_name = "SOURCE")]
    pub admin_token: Option<String>,
    /// Where approvals, grants and the notification outbox are kept: `sqlite:PATH` (one serve
    /// per file: a lock beside it names the holder), or `redis://HOST:PORT[/DB]` for several
    /// replicas sharing them (default: `state.db` beside the audit log).
    #[arg(long, env = "LATCHKEY_STATE", value_name = "URL")]
    pub state: Option<String>,
    /// Serve the operator console (HTML pages under /ui) on the admin listener: sign in with an
    /// admin token; see the book's "Console".
    #[arg(long, env = "LATCHKEY_CONSOLE")]
    pub console: bool,
    /// The admin API's URL as approvers reach it, for the signed one-click links in
    /// notifications (default: http://ADMIN, the --admin address).
    #[arg(long, env = "LATCHKEY_APPROVAL_URL", value_name = "URL")]
    pub approval_url: Option<String>,
    /// The proxy's URL as sandboxes reach it, for the `proxy_url` and `env` that
    /// `POST /sessions` returns (default: http://LISTEN, the --listen address).
    #[arg(long, env = "LATCHKEY_SESSION_PROXY_URL", value_name = "URL")]
    pub session_proxy_url: Option<String>,
    /// `enforce` (default), or `report`: let policy denials through, audited with would_deny.
    #[arg(long, env = "LATCHKEY_MODE", value_enum, default_value = "enforce")]
    pub mode: Mode,
    /// Runtime worker threads (default: one per core).
    #[arg(long, env = "LATCHKEY_WORKERS")]
    pub workers: Option<usize>,
    /// Most bytes a scanned (secret-bearing) response body may decode to; past it the response
    /// is refused (502 decompression_limit) or cut off. Takes B, KiB, MiB, GiB (or K/M/G).
    #[arg(long, env = "LATCHKEY_MAX_DECODED_BODY", default_value = "64MiB", value_parser = parse_bytes)]
    pub max_decoded_body: usize,
    /// Largest WebSocket message latchkey relays (each is held whole to be inspected); a larger
    /// one closes the socket (1009, body_too_large). Takes B, KiB, MiB, GiB (or K/M/G).
    #[arg(long, env = "LATCHKEY_MAX_WEBSOCKET_MESSAGE", default_value = "16MiB", value_parser = parse_bytes)]
    pub max_websocket_message: usize,
    /// Request-body bytes latchkey may hold at once, across every client (bodies it must see
    /// whole: SigV4-signed payloads, body placeholders, small bodies checked before dialing).
    /// Past it: `503 too_busy`. Accepts a plain number or a suffix: 256MiB, 64KiB, 1GiB.
    #[arg(long, env = "LATCHKEY_MAX_BUFFERED_BYTES", default_value = "256MiB", value_parser = parse_bytes)]
    pub max_buffered_bytes: usize,
    /// One client address's share of --max-buffered-bytes (default: an eighth of it).
    #[arg(long, env = "LATCHKEY_MAX_BUFFERED_BYTES_PER_CLIENT", value_parser = parse_bytes)]
    pub max_buffered_bytes_per_client: Option<usize>,
    /// A request body that sends less than 1 KiB in this long (of latchkey waiting) is cut: `408 body_timeout`, the
    /// upstream request aborted.
    #[arg(long, env = "LATCHKEY_BODY_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub body_timeout: Duration,
    /// Gateway mode: accept connections the host firewall redirected here (nftables
    /// `redirect`, iptables `REDIRECT`). The host is the SNI or Host, and the original
    /// destination must be one of its addresses; anything but TLS and HTTP is refused.
    #[arg(long, env = "LATCHKEY_TRANSPARENT", value_name = "ADDR")]
    pub transparent: Option<SocketAddr>,
    /// Also accept nftables `tproxy` on the --transparent listener: set `IP_TRANSPARENT`
    /// (`IPV6_TRANSPARENT` on an IPv6 address) on it, which needs CAP_NET_ADMIN (or CAP_NET_RAW); latchkey
    /// refuses to start when it cannot. Redirected connections keep working.
    #[arg(
        long = "transparent-tproxy",
        env = "LATCHKEY_TRANSPARENT_TPROXY",
        requires = "transparent"
    )]
    pub transparent_tproxy: bool,
    /// DNS-routed mode: accept TLS sent to latchkey itself (its resolver answered with its own
    /// address); the host is the SNI, the upstream port 443.
    #[arg(
        long = "https-listen",
        env = "LATCHKEY_HTTPS_LISTEN",
        value_name = "ADDR"
    )]
    pub https_listen: Option<SocketAddr>,
    /// DNS-routed mode: accept plain HTTP sent to latchkey itself; the host is the Host header,
    /// the upstream port 80.
    #[arg(
        long = "http-listen",
        env = "LATCHKEY_HTTP_LISTEN",
        value_name = "ADDR"
    )]
    pub http_listen: Option<SocketAddr>,
    /// On SIGTERM/SIGINT, how long in-flight requests may take to finish.
    #[arg(long, env = "LATCHKEY_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,
    /// Also accept SOCKS5 here (RFC 1928 CONNECT, names resolved by latchkey; RFC 1929
    /// username/password for identities), e.g. 127.0.0.1:1080; off unless given.
    #[arg(long, env = "LATCHKEY_SOCKS", value_name = "ADDR")]
    pub socks: Option<SocketAddr>,
    // --- latchkey's DNS resolver (issue 14) ---
    /// Run latchkey's allowlisting DNS resolver on this address, UDP and TCP (port 0 picks a
    /// free port): A/AAAA for names some rule could allow, NXDOMAIN for every other name, TXT,
    /// NULL, ANY, SRV and other types refused.
    #[arg(long, env = "LATCHKEY_DNS", value_name = "ADDR")]
    pub dns: Option<SocketAddr>,
    /// How the resolver answers an allowable name: `self`, with latchkey's own address
    /// (--dns-self; DNS-routed sandboxes), or `real`, with its real addresses through the
    /// address guard (transparent capture).
    #[arg(
        long = "dns-answer",
        env = "LATCHKEY_DNS_ANSWER",
        value_enum,
        default_value = "self"
    )]
    pub dns_answer: DnsAnswer,
    /// latchkey's address in `self` answers (repeatable: IPv4 for A, IPv6 for AAAA); default:
    /// the --dns address, unless it is unspecified (0.0.0.0, ::).
    #[arg(
        long = "dns-self",
        env = "LATCHKEY_DNS_SELF",
        value_name = "IP",
        value_delimiter = ','
    )]
    pub dns_self: Vec<IpAddr>,
    /// DNS queries one client may send per second (and in one burst); more are REFUSED.
    /// Takes N or N/s.
    #[arg(long = "dns-rate", env = "LATCHKEY_DNS_RATE", value_name = "N", default_value = "100", value_parser = parse_rate)]
    pub dns_rate: u32,
}

/// A rate: `100` or `100/s`, at least 1.
fn parse_rate(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let n = t.strip_suffix("/s").unwrap_or(t);
    match n.parse::<u32>() {
        Ok(n) if (1..=1_000_000).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a rate: a number of queries per second from 1 to 1000000, e.g. 100 or 100/s"
        )),
    }
}

/// How latchkey's resolver answers a name policy could allow.
// Plain comments on the variants: doc comments would change `--help`'s "possible values" line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DnsAnswer {
    // latchkey's own address (--dns-self).
    #[value(name = "self")]
    SelfAddress,
    // The name's real addresses, through the address guard.
    Real,
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

/// What `serve` does at start when a secret held in a store cannot be fetched.
// Plain comments on the variants: doc comments would change `--help`'s "possible values" line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SecretsStartup {
    // Exit non-zero, naming every secret that could not be fetched.
    Refuse,
    // Keep trying (backing off to 30s), accepting no connection until every one is fetched.
    Wait,
    // Start anyway; requests that need a missing secret get 503 secret_unavailable.
    Serve,
}

/// What `serve` does with a request policy denies.
// Plain comments on the variants: doc comments would change `--help`'s "possible values" line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    // Refuse it (403 and a record).
    Enforce,
    // Let it through, audited with would_deny.
    Report,
}

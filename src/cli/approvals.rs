//! `latchkey approvals list|show|approve|deny|export`: the admin API's approvals endpoints from
//! a terminal. Every command talks to a running latchkey's admin listener (`--admin URL`, with
//! `--admin-token`), so answers go through the same checks, records and wake-ups as the API's;
//! nothing here opens the state store itself.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;

use crate::governance::approvals::Grant;
use crate::governance::record::Approval;

/// How long one admin API exchange may take.
const DEADLINE: Duration = Duration::from_secs(15);
/// Largest admin API answer read.
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// What `latchkey approvals` was asked to do.
#[derive(clap::Args, Debug)]
pub struct ApprovalsArgs {
    /// The admin API of the running latchkey (`serve --admin`).
    #[arg(
        long = "admin-url",
        env = "LATCHKEY_ADMIN_URL",
        default_value = "http://127.0.0.1:3129",
        global = true
    )]
    pub admin: String,
    /// The admin token, from `env:VAR` or `file:PATH` (as `serve --admin-token`).
    #[arg(
        long,
        env = "LATCHKEY_ADMIN_TOKEN",
        value_name = "SOURCE",
        global = true
    )]
    pub admin_token: Option<String>,
    #[command(subcommand)]
    pub action: ApprovalsAction,
}

#[derive(clap::Subcommand, Debug)]
pub enum ApprovalsAction {
    /// List approvals (newest first).
    List {
        /// pending (default), approved, denied, expired or all.
        #[arg(
            long,
            env = "LATCHKEY_LIST_STATUS",
            default_value = "pending",
            alias = "state"
        )]
        status: String,
        /// `text`, or `json`: the JSON the admin API returned.
        #[arg(long, env = "LATCHKEY_LIST_FORMAT", value_enum, default_value = "text")]
        format: super::args::OutputFormat,
        /// The same as --format json (an older spelling).
        #[arg(long, env = "LATCHKEY_LIST_JSON", hide = true)]
        json: bool,
    },
    /// Show one approval, as JSON.
    Show { id: String },
    /// Approve a pending request.
    Approve {
        id: String,
        /// One of the scopes the approval offers (once, a duration such as 1h, session);
        /// default: its first.
        #[arg(long)]
        scope: Option<String>,
        #[arg(long)]
        note: Option<String>,
        /// Who is answering, for the record (default: $USER).
        #[arg(long, env = "LATCHKEY_BY")]
        by: Option<String>,
    },
    /// Deny a pending request.
    Deny {
        id: String,
        #[arg(long)]
        note: Option<String>,
        /// Who is answering, for the record (default: $USER).
        #[arg(long, env = "LATCHKEY_BY")]
        by: Option<String>,
    },
    /// Write the standing grants as policy rules and test cases, ready for a change request.
    Export {
        /// The rules file (default: stdout).
        #[arg(long, env = "LATCHKEY_EXPORT_OUT")]
        out: Option<PathBuf>,
        /// The policy test cases file (`latchkey test` format).
        #[arg(long, env = "LATCHKEY_EXPORT_TESTS")]
        tests: Option<PathBuf>,
    },
}

/// Runs one `latchkey approvals` command.
pub fn run(args: ApprovalsArgs) -> anyhow::Result<std::process::ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: ApprovalsArgs) -> anyhow::Result<std::process::ExitCode> {
    let admin = Admin::new(&args.admin, args.admin_token.as_deref())?;
    let mut out = std::io::stdout().lock();
    match args.action {
        ApprovalsAction::List {
            status,
            format,
            json,
        } => {
            let json = json || format == super::args::OutputFormat::Json;
            let v = admin
                .get(&format!("/approvals?state={}", enc(&status)))
                .await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                let list: Vec<Approval> = serde_json::from_value(v["approvals"].clone())
                    .context("the admin API's approval list is not in the expected form")?;
                if list.is_empty() {
                    writeln!(out, "no {status} approvals")?;
                }
                for a in list {
                    writeln!(
                        out,
                        "{}  {:<8}  {}  {} {}  rule {}  ({} bytes)",
                        a.id,
                        a.state.as_str(),
                        a.identity,
                        a.method,
                        a.url,
                        a.rule,
                        a.body_bytes
                    )?;
                }
            }
        }
        ApprovalsAction::Show { id } => {
            let v = admin.get(&format!("/approvals/{}", enc(&id))).await?;
            writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
        }
        ApprovalsAction::Approve {
            id,
            scope,
            note,
            by,
        } => {
            let body = serde_json::json!({"decision": "approve", "scope": scope, "note": note, "by": by.or_else(|| std::env::var("USER").ok()).unwrap_or_else(|| "cli".into())});
            let a = admin
                .post(&format!("/approvals/{}", enc(&id)), &body)
                .await?;
            writeln!(
                out,
                "approved {id} ({})",
                a["answer"]["scope"].as_str().unwrap_or("once")
            )?;
        }
        ApprovalsAction::Deny { id, note, by } => {
            let body = serde_json::json!({"decision": "deny", "note": note, "by": by.or_else(|| std::env::var("USER").ok()).unwrap_or_else(|| "cli".into())});
            admin
                .post(&format!("/approvals/{}", enc(&id)), &body)
                .await?;
            writeln!(out, "denied {id}")?;
        }
        ApprovalsAction::Export { out: path, tests } => {
            let v = admin.get("/grants").await?;
            let grants: Vec<Grant> = serde_json::from_value(v["grants"].clone())
                .context("the admin API's grant list is not in the expected form")?;
            let (rules, cases) = crate::governance::export::export(&grants);
            match path {
                Some(p) => std::fs::write(&p, &rules)
                    .with_context(|| format!("cannot write {}", p.display()))?,
                None => out.write_all(rules.as_bytes())?,
            }
            if let Some(t) = tests {
                std::fs::write(&t, &cases)
                    .with_context(|| format!("cannot write {}", t.display()))?;
            }
            eprintln!("latchkey: exported {} grant(s)", grants.len());
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// The admin API of a running latchkey.
struct Admin {
    addr: SocketAddr,
    authority: String,
    token: Option<String>,
}

impl Admin {
    /// `url` is `http://HOST:PORT`, or `HOST:PORT` as `serve --admin` takes it.
    fn new(url: &str, token: Option<&str>) -> anyhow::Result<Self> {
        let flag = super::given::flag("admin");
        let full = if url.contains("://") {
            url.to_string()
        } else {
            format!("http://{url}")
        };
        let parsed = url::Url::parse(&full).with_context(|| {
            format!("{flag} {url:?} is not a URL (give http://HOST:PORT or HOST:PORT, as serve --admin)")
        })?;
        anyhow::ensure!(
            parsed.scheme() == "http",
            "{flag} {url}: only http:// is supported (the admin listener speaks plain HTTP; run this where it is reachable)"
        );
        let addrs = parsed
            .socket_addrs(|| Some(80))
            .with_context(|| format!("{flag} {url}: cannot resolve its host"))?;
        let addr = *addrs
            .first()
            .ok_or_else(|| anyhow::anyhow!("{flag} {url}: its host has no address"))?;
        let token = token.map(super::serve::read_token).transpose()?;
        Ok(Self {
            addr,
            authority: parsed[url::Position::BeforeHost..url::Position::AfterPort].to_string(),
            token,
        })
    }

    async fn get(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        self.exchange(http::Method::GET, path, None).await
    }

    async fn post(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        self.exchange(http::Method::POST, path, Some(body.to_string()))
            .await
    }

    // This dials latchkey's own admin listener, never an upstream: the guarded dialer (which
    // refuses latchkey's own addresses) is not the way here.
    #[allow(clippy::disallowed_methods)]
    async fn exchange(
        &self,
        method: http::Method,
        path: &str,
        body: Option<String>,
    ) -> anyhow::Result<serde_json::Value> {
        let run = async {
            let tcp = tokio::net::TcpStream::connect(self.addr)
                .await
                .with_context(|| {
                    format!(
                        "cannot reach the admin API at {} ({}: is `latchkey serve` running with --admin there?)",
                        self.addr,
                        super::given::flag("admin")
                    )
                })?;
            let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
            tokio::spawn(conn);
            let mut req = http::Request::builder()
                .method(method)
                .uri(path)
                .header(http::header::HOST, &self.authority);
            if let Some(t) = &self.token {
                req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
            }
            if body.is_some() {
                req = req.header(http::header::CONTENT_TYPE, "application/json");
            }
            let req = req.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
            let res = send.send_request(req).await?;
            let status = res.status();
            let bytes = Limited::new(res.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("cannot read the admin API's answer: {e}"))?
                .to_bytes();
            let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_else(
                |_| serde_json::json!({"error": String::from_utf8_lossy(&bytes).trim().to_string()}),
            );
            if !status.is_success() {
                let why = value["error"].as_str().unwrap_or("no reason given");
                anyhow::bail!("the admin API answered {status}: {why}");
            }
            Ok(value)
        };
        tokio::time::timeout(DEADLINE, run).await.map_err(|_| {
            anyhow::anyhow!(
                "the admin API at {} did not answer within {}s",
                self.addr,
                DEADLINE.as_secs()
            )
        })?
    }
}

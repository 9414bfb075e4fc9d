//! `latchkey approvals list|show|approve|deny|export`: the admin API's approvals endpoints from
//! a terminal. Every command talks to a running latchkey's admin listener (`--admin URL`, with
//! `--admin-token`), so answers go through the same checks, records and wake-ups as the API's;
//! nothing here opens the state store itself.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;

use super::admin_client::{enc, Admin};
use crate::governance::approvals::Grant;
use crate::governance::record::Approval;

/// What `latchkey approvals` was asked to do.
#[derive(clap::Args, Debug)]
pub struct ApprovalsArgs {
    #[command(flatten)]
    pub admin: super::admin_client::AdminArgs,
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
    let admin = Admin::new(&args.admin.url, args.admin.token.as_deref())?;
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

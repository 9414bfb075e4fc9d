//! `latchkey sessions create|list|show|extend|revoke`: the admin API's sessions endpoints from
//! a terminal, like `latchkey approvals`. Nothing here opens the state store itself.

use std::io::Write as _;

use anyhow::Context as _;

use super::admin_client::{enc, Admin};

/// What `latchkey sessions` was asked to do.
#[derive(clap::Args, Debug)]
pub struct SessionsArgs {
    #[command(flatten)]
    pub admin: super::admin_client::AdminArgs,
    #[command(subcommand)]
    pub action: SessionsAction,
}

#[derive(clap::Subcommand, Debug)]
pub enum SessionsAction {
    /// Make a session of a profile; prints its id, token (shown once) and proxy URL.
    Create {
        /// The `[profiles.NAME]` it is made from.
        #[arg(long)]
        profile: String,
        /// How long it lives (default: the profile's longest), e.g. 2h.
        #[arg(long)]
        ttl: Option<String>,
        /// A label, KEY=VALUE (repeatable).
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// The source address it is bound to.
        #[arg(long)]
        source: Option<String>,
        /// Narrow to this host (repeatable): within the profile's.
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Narrow to this secret (repeatable): one the profile's rules use.
        #[arg(long = "secret")]
        secrets: Vec<String>,
        /// `text` (the id, token and proxy URL), `env` (export lines for `eval`), or `json`.
        #[arg(
            long,
            env = "LATCHKEY_CREATE_FORMAT",
            value_enum,
            default_value = "text"
        )]
        format: CreateFormat,
    },
    /// List sessions (newest first).
    List {
        #[arg(long)]
        profile: Option<String>,
        /// KEY=VALUE.
        #[arg(long)]
        label: Option<String>,
        /// live, revoked or expired.
        #[arg(long, env = "LATCHKEY_LIST_STATE")]
        state: Option<String>,
        /// `text`, or `json`: the JSON the admin API returned.
        #[arg(long, env = "LATCHKEY_LIST_FORMAT", value_enum, default_value = "text")]
        format: super::args::OutputFormat,
    },
    /// Show one session, as JSON (never its token).
    Show { id: String },
    /// Extend a session to TTL from now (never past its profile's TTL from creation).
    Extend {
        id: String,
        #[arg(long)]
        ttl: String,
    },
    /// Revoke a session: its next request is refused and its connections are cut.
    Revoke { id: String },
}

/// How `sessions create` prints what it made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CreateFormat {
    Text,
    Env,
    Json,
}

/// Runs one `latchkey sessions` command.
pub fn run(args: SessionsArgs) -> anyhow::Result<std::process::ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: SessionsArgs) -> anyhow::Result<std::process::ExitCode> {
    let admin = Admin::new(&args.admin.url, args.admin.token.as_deref())?;
    let mut out = std::io::stdout().lock();
    match args.action {
        SessionsAction::Create {
            profile,
            ttl,
            labels,
            source,
            hosts,
            secrets,
            format,
        } => {
            let body = create_body(profile, ttl, &labels, source, hosts, secrets)?;
            let made = admin.post("/sessions", &body).await?;
            print_created(&mut out, &made, format)?;
        }
        SessionsAction::List {
            profile,
            label,
            state,
            format,
        } => {
            let mut query = Vec::new();
            for (k, v) in [("profile", profile), ("label", label), ("state", state)] {
                if let Some(v) = v {
                    query.push(format!("{k}={}", enc(&v)));
                }
            }
            let v = admin.get(&format!("/sessions?{}", query.join("&"))).await?;
            if format == super::args::OutputFormat::Json {
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                let list = v["sessions"].as_array().cloned().unwrap_or_default();
                if list.is_empty() {
                    writeln!(out, "no sessions")?;
                }
                for s in list {
                    let labels = s["labels"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .unwrap_or_default();
                    writeln!(
                        out,
                        "{}  {:<7}  {}  expires {}  {}",
                        s["id"].as_str().unwrap_or_default(),
                        s["state"].as_str().unwrap_or_default(),
                        s["profile"].as_str().unwrap_or_default(),
                        s["expires_at"].as_str().unwrap_or_default(),
                        labels
                    )?;
                }
            }
        }
        SessionsAction::Show { id } => {
            let v = admin.get(&format!("/sessions/{}", enc(&id))).await?;
            writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
        }
        SessionsAction::Extend { id, ttl } => {
            let v = admin
                .post(
                    &format!("/sessions/{}/extend", enc(&id)),
                    &serde_json::json!({ "ttl": ttl }),
                )
                .await?;
            writeln!(
                out,
                "{} expires {}",
                id,
                v["expires_at"].as_str().unwrap_or_default()
            )?;
        }
        SessionsAction::Revoke { id } => {
            admin.delete(&format!("/sessions/{}", enc(&id))).await?;
            writeln!(out, "{id} revoked")?;
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// `POST /sessions`'s body from `create`'s flags.
fn create_body(
    profile: String,
    ttl: Option<String>,
    labels: &[String],
    source: Option<String>,
    hosts: Vec<String>,
    secrets: Vec<String>,
) -> anyhow::Result<serde_json::Value> {
    let mut label_map = serde_json::Map::new();
    for l in labels {
        let (k, v) = l
            .split_once('=')
            .with_context(|| format!("--label {l:?}: use KEY=VALUE"))?;
        label_map.insert(k.to_string(), v.into());
    }
    let mut narrow = serde_json::Map::new();
    if !hosts.is_empty() {
        narrow.insert("hosts".into(), hosts.into());
    }
    if !secrets.is_empty() {
        narrow.insert("secrets".into(), secrets.into());
    }
    let mut body = serde_json::json!({ "profile": profile, "labels": label_map, "narrow": narrow });
    if let Some(ttl) = ttl {
        body["ttl"] = ttl.into();
    }
    if let Some(source) = source {
        body["source"] = source.into();
    }
    Ok(body)
}

/// Prints a session just made: its id, token and proxy URL, its environment, or the JSON.
fn print_created(
    out: &mut impl std::io::Write,
    made: &serde_json::Value,
    format: CreateFormat,
) -> anyhow::Result<()> {
    match format {
        CreateFormat::Json => writeln!(out, "{}", serde_json::to_string_pretty(made)?)?,
        CreateFormat::Env => {
            if let Some(env) = made["env"].as_object() {
                for (k, v) in env {
                    let v = v.as_str().unwrap_or_default().replace('\'', "'\\''");
                    writeln!(out, "export {k}='{v}'")?;
                }
            }
        }
        CreateFormat::Text => {
            for key in ["id", "token", "expires_at", "proxy_url"] {
                writeln!(out, "{key}: {}", made[key].as_str().unwrap_or_default())?;
            }
            eprintln!("latchkey: the token is shown this once; `--format env` prints a sandbox's environment");
        }
    }
    Ok(())
}

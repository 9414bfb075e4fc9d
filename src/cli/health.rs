//! `latchkey health`: is a running latchkey ready? `GET /readyz` on its admin API, for
//! container health checks and init systems: the image needs no shell or curl for it.

use std::process::ExitCode;
use std::time::Duration;

use super::admin_client::Admin;

/// What `latchkey health` was asked to check.
#[derive(clap::Args, Debug)]
pub struct HealthArgs {
    #[command(flatten)]
    pub admin: super::admin_client::AdminArgs,
    /// How long to wait for the answer before calling latchkey unready.
    #[arg(long, env = "LATCHKEY_HEALTH_TIMEOUT", default_value = "3s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Ask `/healthz` (the process answers) instead of `/readyz` (serving: not shutting down,
    /// the audit log writable).
    #[arg(long)]
    pub live: bool,
}

/// Exit 0 when the admin API answers 200, 1 (with the reason on stderr) otherwise.
pub fn run(args: HealthArgs) -> anyhow::Result<ExitCode> {
    let admin = Admin::new(&args.admin.url, args.admin.token.as_deref())?.deadline(args.timeout);
    let path = if args.live { "/healthz" } else { "/readyz" };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match runtime.block_on(admin.get_text(path)) {
        Ok(answer) => {
            println!("{path}: {}", answer.trim());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("latchkey health: {e:#}");
            Ok(ExitCode::from(1))
        }
    }
}

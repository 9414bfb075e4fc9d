//! `latchkey audit query` and `latchkey audit summary`: being written.

use std::process::ExitCode;

/// `latchkey audit query` flags.
#[derive(clap::Args, Debug)]
pub struct QueryArgs {
    /// Audit files or directories.
    #[arg(required = true)]
    pub files: Vec<std::path::PathBuf>,
}

/// `latchkey audit summary` flags.
#[derive(clap::Args, Debug)]
pub struct SummaryArgs {
    /// Audit files or directories.
    #[arg(required = true)]
    pub files: Vec<std::path::PathBuf>,
}

pub fn query(args: &QueryArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("audit query is not built yet ({} files)", args.files.len())
}

pub fn summary(args: &SummaryArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!(
        "audit summary is not built yet ({} files)",
        args.files.len()
    )
}

//! `latchkey diff OLD NEW` and `latchkey diff --git REV1..REV2`: what a policy change means, as
//! [`crate::policy::diff`] computes it, printed as text, markdown (a change request comment) or
//! JSON. Exit 0 when nothing widened, 3 when the change widens reach, 1 when a side does not load.

use std::path::PathBuf;
use std::process::ExitCode;

/// `latchkey diff` flags.
#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The policy directory before the change (not with --git).
    #[arg(required_unless_present = "git", conflicts_with = "git")]
    pub old: Option<PathBuf>,
    /// The policy directory after the change (not with --git).
    #[arg(required_unless_present = "git", conflicts_with = "git")]
    pub new: Option<PathBuf>,
    /// Compare two revisions of the policy repository this runs in: `REV1..REV2`, or `REV`
    /// alone for REV against the working tree (`--git main`: what this branch changes).
    #[arg(long, env = "LATCHKEY_DIFF_GIT", value_name = "REV1..REV2")]
    pub git: Option<String>,
    /// With --git: the policy directory inside the repository, relative to the current
    /// directory.
    #[arg(long, env = "LATCHKEY_POLICIES", default_value = "policies")]
    pub policies: PathBuf,
    /// `text`, `markdown` (for a change request comment) or `json`.
    #[arg(long, env = "LATCHKEY_DIFF_FORMAT", value_enum, default_value = "text")]
    pub format: DiffFormat,
}

/// How `diff` prints the reach delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DiffFormat {
    Text,
    Markdown,
    Json,
}

/// Runs `latchkey diff`.
pub fn run(_args: &DiffArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("diff: under construction")
}

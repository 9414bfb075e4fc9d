//! `latchkey learn`: least-privilege rules proposed from audit logs, as
//! [`crate::policy::learn`] generalises them, written as a policy file with a comment per rule
//! and a `tests/` case file that pins each rule.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

/// `latchkey learn` flags.
#[derive(clap::Args, Debug)]
pub struct LearnArgs {
    /// Audit files or directories (an audit file, its rotated segments, or a directory holding
    /// them), in any order: they are read in chain order.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The policy the learned rules add to: requests it already allows are not learned again
    /// (unless --all), and learned rules for an identity it defines are added to that
    /// identity's `rules`.
    #[arg(long, env = "LATCHKEY_POLICIES", default_value = "policies")]
    pub policies: PathBuf,
    /// Where the learned rules go [default: POLICIES/learned.toml].
    #[arg(long, env = "LATCHKEY_LEARN_OUT", value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Where the case file pinning them goes [default: POLICIES/tests/learned.toml].
    #[arg(long, env = "LATCHKEY_LEARN_TESTS", value_name = "FILE")]
    pub tests: Option<PathBuf>,
    /// Only requests that arrived at or after T: RFC 3339 or a duration ago (`7d`).
    #[arg(long, env = "LATCHKEY_LEARN_SINCE", value_name = "T", value_parser = super::audit_query::instant)]
    pub since: Option<SystemTime>,
    /// Only this identity's requests (repeatable).
    #[arg(long, env = "LATCHKEY_LEARN_IDENTITY", value_name = "NAME")]
    pub identity: Vec<String>,
    /// Propose a rule only for traffic seen at least N times.
    #[arg(
        long,
        env = "LATCHKEY_LEARN_MIN_COUNT",
        value_name = "N",
        default_value_t = 1
    )]
    pub min_count: u64,
    /// Also learn requests the policy already allows.
    #[arg(long)]
    pub all: bool,
    /// Print the proposed files on stdout; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Overwrite the output files if they exist.
    #[arg(long)]
    pub force: bool,
}

/// Runs `latchkey learn`.
pub fn run(_args: &LearnArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("learn: under construction")
}

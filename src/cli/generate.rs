//! `latchkey completions SHELL` and `latchkey man [COMMAND]...`: shell completions
//! (`clap_complete`) and man pages (`clap_mangen`) generated from the same definitions as
//! `--help` ([`super::args::command`]), so none of them can drift from the binary.

use std::io::Write as _;
use std::process::ExitCode;

/// Prints the completion script for `shell`.
pub fn completions(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    let mut cmd = super::args::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "latchkey", &mut out);
    std::io::stdout().lock().write_all(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// Prints the man page of latchkey, or of the command `path` names (`["audit", "query"]`).
pub fn man(path: &[String]) -> anyhow::Result<ExitCode> {
    let mut cmd = super::args::command();
    cmd.build();
    let mut name = "latchkey".to_string();
    for word in path {
        let known: Vec<String> = cmd
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        let Some(sub) = cmd.find_subcommand(word).cloned() else {
            anyhow::bail!(
                "man: {name} has no command {word:?}{} (it has: {})",
                crate::policy::did_you_mean(word, known.iter().map(String::as_str)),
                known.join(", ")
            );
        };
        name = format!("{name}-{}", sub.get_name());
        cmd = sub;
    }
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd).title(name).render(&mut out)?;
    std::io::stdout().lock().write_all(&out)?;
    Ok(ExitCode::SUCCESS)
}

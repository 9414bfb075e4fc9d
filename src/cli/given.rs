//! What the user typed, kept for error messages: an error about a flag's value names the flag
//! as it was given — the spelling typed on the command line (an alias too), the environment
//! variable the value came from, or the config file line — never only the canonical name.
//!
//! [`parse`] is the one way the binary reads its command line (flags, environment, `serve
//! --config`); [`flag`] is how an error names a flag. Library callers that never went through
//! [`parse`] (tests, `serve::build` in-process) get the canonical `--name`.

use std::ffi::OsString;
use std::sync::OnceLock;

use clap::parser::ValueSource;
use clap::{ArgMatches, Command, FromArgMatches};

use super::args::Cli;

/// The invocation: the command definitions, what clap matched, the raw arguments, and which
/// flags the config file set (arg id → `FILE:LINE:COL: key`).
struct Given {
    command: Command,
    matches: ArgMatches,
    argv: Vec<String>,
    from_file: Vec<(String, String)>,
}

static GIVEN: OnceLock<Given> = OnceLock::new();

/// Why the command line could not be read.
#[derive(Debug)]
pub enum ParseError {
    /// Usage, `--help` and `--version`: clap prints and exits with its own code.
    Clap(clap::Error),
    /// The `serve --config` file: every problem, each `FILE:LINE:COL: …`.
    Config(Vec<String>),
}

impl From<clap::Error> for ParseError {
    fn from(e: clap::Error) -> Self {
        ParseError::Clap(e)
    }
}

/// Reads the command line: flags over environment variables over `serve --config` keys over
/// defaults. Remembers the invocation for [`flag`].
pub fn parse<I, T>(args: I) -> Result<Cli, ParseError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut argv: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let command = super::args::command();
    let mut matches = command.clone().try_get_matches_from(&argv)?;
    let mut from_file = Vec::new();
    if let Some(("serve", serve)) = matches.subcommand() {
        if let Some(path) = serve.get_one::<std::path::PathBuf>("config") {
            let serve_cmd = command
                .find_subcommand("serve")
                .cloned()
                .unwrap_or_else(|| Command::new("serve"));
            let set = super::config::read(path, serve_cmd, serve).map_err(ParseError::Config)?;
            for s in set {
                argv.extend(s.args);
                from_file.push((s.id, s.label));
            }
            matches = command.clone().try_get_matches_from(&argv)?;
        }
    }
    let cli = Cli::from_arg_matches(&matches)?;
    let _ = GIVEN.set(Given {
        command,
        matches,
        argv: argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        from_file,
    });
    Ok(cli)
}

/// How an error names the flag whose clap id is `id` (the field name: `admin`, `ca_dir`): as
/// typed (`--admin-url`), the variable it came from (`LATCHKEY_ADMIN_URL`), or the config file
/// line (`latchkey.toml:3:1: admin`); `--name` when it took its default.
pub fn flag(id: &str) -> String {
    let canonical = format!("--{}", id.replace('_', "-"));
    let Some(given) = GIVEN.get() else {
        return canonical;
    };
    // The invoked command path, innermost first: a global flag is matched at every level.
    let mut levels = vec![(&given.command, &given.matches)];
    while let Some((cmd, m)) = levels.last().copied() {
        let Some((name, sub)) = m.subcommand() else {
            break;
        };
        let Some(sub_cmd) = cmd.find_subcommand(name) else {
            break;
        };
        levels.push((sub_cmd, sub));
    }
    for (cmd, m) in levels.into_iter().rev() {
        let Some(arg) = cmd.get_arguments().find(|a| a.get_id() == id) else {
            continue;
        };
        let long = arg
            .get_long()
            .map_or(canonical.clone(), |l| format!("--{l}"));
        if let Some((_, label)) = given.from_file.iter().find(|(i, _)| i == id) {
            return label.clone();
        }
        let source = if m.ids().any(|i| i == id) {
            m.value_source(id)
        } else {
            None
        };
        return match source {
            Some(ValueSource::EnvVariable) => arg
                .get_env()
                .map_or(long.clone(), |e| e.to_string_lossy().into_owned()),
            Some(ValueSource::CommandLine) => {
                let mut names: Vec<String> = arg
                    .get_long_and_visible_aliases()
                    .unwrap_or_default()
                    .into_iter()
                    .chain(arg.get_all_aliases().unwrap_or_default())
                    .map(|n| format!("--{n}"))
                    .collect();
                names.dedup();
                typed(&given.argv, &names).unwrap_or(long)
            }
            _ => long,
        };
    }
    canonical
}

/// The last of `names` the command line holds (`--name VALUE` or `--name=VALUE`): the one
/// clap kept.
fn typed(argv: &[String], names: &[String]) -> Option<String> {
    argv.iter()
        .take_while(|a| *a != "--")
        .filter_map(|a| {
            names.iter().find(|n| {
                a == *n
                    || a.strip_prefix(n.as_str())
                        .is_some_and(|r| r.starts_with('='))
            })
        })
        .last()
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::typed;

    #[test]
    fn the_spelling_typed_last_is_the_one_named() {
        let argv: Vec<String> = [
            "latchkey",
            "approvals",
            "--admin=x",
            "list",
            "--admin-url",
            "y",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let names = vec!["--admin-url".to_string(), "--admin".to_string()];
        assert_eq!(typed(&argv, &names).as_deref(), Some("--admin-url"));
        assert_eq!(typed(&argv[..3], &names).as_deref(), Some("--admin"));
        assert_eq!(typed(&argv[..2], &names), None);
    }
}

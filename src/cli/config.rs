//! `latchkey serve --config FILE` (`LATCHKEY_CONFIG`): a deployment as a file a reviewer reads.
//!
//! Every key is a `serve` flag's long name, kebab-case as typed on the command line
//! (`max-connections = 4096`, `resolve = ["a.test=10.0.0.1"]`, `audit-sync = true`). A flag on
//! the command line wins, then its environment variable, then the file, then the default: a
//! key is used only when clap says the flag took its default. Every problem is reported at
//! once as `FILE:LINE:COL: …`: an unknown key (with did-you-mean), a table, a value the flag's
//! own parser refuses. Only the values that pass become flags, so what runs is exactly what a
//! command line with them would run.

use std::ffi::OsString;
use std::path::Path;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command};
use toml_edit::{Item, Value};

/// One flag the file sets: its clap id, where (`FILE:LINE:COL: key`), and the arguments that
/// give it.
pub struct Set {
    pub id: String,
    pub label: String,
    pub args: Vec<OsString>,
}

/// Reads `path` against `serve`'s definitions; `matches` says which flags the command line or
/// the environment already set (those keys are left to them).
pub fn read(
    path: &Path,
    mut serve: Command,
    matches: &ArgMatches,
) -> Result<Vec<Set>, Vec<String>> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| vec![format!("{shown}: cannot read the --config file: {e}")])?;
    let doc = toml_edit::ImDocument::parse(text.as_str()).map_err(|e| {
        let (line, col) = e
            .span()
            .map_or((1, 1), |s| crate::policy::line_col(&text, s.start));
        vec![format!(
            "{shown}:{line}:{col}: not TOML: {}",
            e.message().trim_end()
        )]
    })?;
    serve.build();
    let known: Vec<String> = serve
        .get_arguments()
        .filter(|a| a.get_id() != "config" && a.get_id() != "help")
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect();
    let mut problems = Vec::new();
    let mut out = Vec::new();
    for (key, item) in doc.as_table().iter() {
        let at = |span: Option<std::ops::Range<usize>>| {
            let (line, col) = span.map_or((1, 1), |s| crate::policy::line_col(&text, s.start));
            format!("{shown}:{line}:{col}")
        };
        let key_span = doc
            .as_table()
            .get_key_value(key)
            .and_then(|(k, _)| k.span());
        let Some(arg) = serve
            .get_arguments()
            .find(|a| a.get_long() == Some(key) && a.get_id() != "config")
        else {
            let hint = crate::policy::did_you_mean(key, known.iter().map(String::as_str));
            let hint = if hint.is_empty() {
                "; keys are `serve` flags without the dashes (`latchkey serve --help` lists them)"
                    .to_string()
            } else {
                hint
            };
            problems.push(format!("{}: unknown key `{key}`{hint}", at(key_span)));
            continue;
        };
        let value_at = at(item.span().or(key_span.clone()));
        let id = arg.get_id().to_string();
        // The command line and the environment win over the file.
        if matches!(
            matches.value_source(&id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let values = match values(item, arg.get_action()) {
            Ok(v) => v,
            Err(why) => {
                problems.push(format!("{value_at}: {key}: {why}"));
                continue;
            }
        };
        let flag = format!("--{key}");
        let mut args = Vec::new();
        let mut ok = true;
        for v in values {
            match v {
                Given::Switch(true) => args.push(OsString::from(&flag)),
                Given::Switch(false) => {}
                Given::Text(v) => {
                    // The flag's own parser, as the command line would run it.
                    let alone = [
                        OsString::from("serve"),
                        OsString::from(format!("{flag}={v}")),
                    ];
                    if let Err(e) = serve.clone().try_get_matches_from(alone) {
                        problems.push(format!("{value_at}: {key} = {v:?}: {}", clap_message(&e)));
                        ok = false;
                    }
                    args.push(OsString::from(format!("{flag}={v}")));
                }
            }
        }
        if ok {
            out.push(Set {
                id,
                label: format!("{}: {key}", at(key_span)),
                args,
            });
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// A key's value as flags take it.
enum Given {
    /// A switch (`audit-sync = true`).
    Switch(bool),
    /// One value, as it would be typed.
    Text(String),
}

/// The values a key gives its flag: a switch takes `true` or `false`, a repeatable flag a
/// value or an array of them, any other flag one value.
fn values(item: &Item, action: &ArgAction) -> Result<Vec<Given>, String> {
    let Some(value) = item.as_value() else {
        return Err("a table is not a flag: keys are `serve` flags, at the top level".into());
    };
    if matches!(action, ArgAction::SetTrue) {
        return match value.as_bool() {
            Some(b) => Ok(vec![Given::Switch(b)]),
            None => Err("a switch takes true or false".into()),
        };
    }
    let one = |v: &Value| -> Result<Given, String> {
        match v {
            Value::String(s) => Ok(Given::Text(s.value().clone())),
            Value::Integer(i) => Ok(Given::Text(i.value().to_string())),
            Value::Boolean(b) => Ok(Given::Text(b.value().to_string())),
            _ => Err(
                "takes a string or a number (durations and sizes as strings: \"30s\", \"64MiB\")"
                    .into(),
            ),
        }
    };
    match value {
        Value::Array(list) if matches!(action, ArgAction::Append) => list.iter().map(one).collect(),
        Value::Array(_) => Err("takes one value, not a list".into()),
        v => Ok(vec![one(v)?]),
    }
}

/// clap's sentence about a bad value, without its `error:` prefix and usage tail.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::super::args::Cli;

    fn problems(text: &str) -> Vec<String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("latchkey.toml");
        std::fs::write(&path, text).expect("write");
        let cmd = Cli::command();
        let serve = cmd.find_subcommand("serve").cloned().expect("serve");
        let m = serve
            .clone()
            .try_get_matches_from(["serve"])
            .expect("matches");
        match super::read(&path, serve, &m) {
            Ok(_) => Vec::new(),
            Err(p) => p
                .into_iter()
                .map(|l| l.replace(&path.display().to_string(), "F"))
                .collect(),
        }
    }

    #[test]
    fn every_bad_key_and_value_is_named_at_its_line_and_column() {
        let p = problems(
            "listen = \"127.0.0.1:0\"\nmax_connections = 10\nlisen = \"x\"\nworkers = \"two\"\n",
        );
        assert_eq!(p.len(), 3, "{p:#?}");
        assert!(
            p[0].starts_with(
                "F:2:1: unknown key `max_connections`; did you mean \"max-connections\"?"
            ),
            "{p:#?}"
        );
        assert!(
            p[1].starts_with("F:3:1: unknown key `lisen`; did you mean \"listen\"?"),
            "{p:#?}"
        );
        assert!(p[2].starts_with("F:4:11: workers = \"two\": "), "{p:#?}");
        let t = problems("[audit]\nx = 1\n");
        assert_eq!(t.len(), 1, "{t:#?}");
        assert!(
            t[0].starts_with("F:1:") && t[0].contains("audit: a table is not a flag"),
            "{t:#?}"
        );
        let s = problems("audit-sync = \"yes\"\n");
        assert_eq!(s, vec!["F:1:14: audit-sync: a switch takes true or false"]);
        let l = problems("listen = [\"a\", \"b\"]\n");
        assert_eq!(l, vec!["F:1:10: listen: takes one value, not a list"]);
        assert!(
            problems("admin = \"off\"\nresolve = [\"a.test=10.0.0.1\"]\naudit-sync = true\n")
                .is_empty()
        );
    }
}

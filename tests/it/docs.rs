//! The docs stay in step with the code, or the build fails:
//!
//! - `docs/architecture.md` names every module file under `src/` in its module map, and every
//!   path it names (`src/x.rs`, `src/x.rs::item`, `tests/…`) exists, each `::item` defined there;
//! - the book's CLI reference (`docs/src/reference/cli.md`) lists every command and every flag of
//!   the real binary's `--help`, each flag under its own command;
//! - every reason code in `crates/wire/src/reason.rs` is in the book's reason-code reference;
//! - every flag reads a `LATCHKEY_…` variable shown by `--help`, named by the CLI reference's rule
//!   (or spelled out there), unless the CLI reference lists it as having none;
//! - the book's Layout chapter names every top-level directory and source module.
//!
//! Links and anchors in the README and the book, the book's table of contents and its metrics
//! reference are checked in `docs_book.rs`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use latchkey::reason::Reason;

use crate::support::latchkey::{wait_with_timeout, BIN};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The book's chapters these tests hold to the code.
const CLI: &str = "docs/src/reference/cli.md";
const REASON_CODES: &str = "docs/src/reference/reason-codes.md";
const LAYOUT: &str = "docs/src/contributing/layout.md";

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// The text under `heading` (a whole line such as `## CLI`) up to the next heading of the same
/// or a higher level.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let mut start = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_end();
        if let Some(s) = start {
            let hashes = trimmed.chars().take_while(|c| *c == '#').count();
            if hashes > 0 && hashes <= level && trimmed[hashes..].starts_with(' ') {
                return &text[s..offset];
            }
        } else if trimmed == heading {
            start = Some(offset + line.len());
        }
        offset += line.len();
    }
    match start {
        Some(s) => &text[s..],
        None => panic!("no section {heading:?}"),
    }
}

/// The lines of `text` outside fenced code blocks, and the lines inside them.
fn split_fences(text: &str) -> (String, String) {
    let (mut prose, mut code) = (String::new(), String::new());
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let out = if fenced { &mut code } else { &mut prose };
        out.push_str(line);
        out.push('\n');
    }
    (prose, code)
}

/// Inline code spans (`…`) in prose.
fn code_spans(prose: &str) -> Vec<String> {
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Whether `text` mentions `flag` as a whole flag (`--format` but not `--format-x`).
fn mentions_flag(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(i, _)| {
        let after = text[i + flag.len()..].chars().next();
        let before = text[..i].chars().next_back();
        !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            && !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

fn rust_files(dir: &Path, out: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let rel = path.strip_prefix(repo()).expect("under the repo");
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The source directories: the `latchkey` package's `src/` and each workspace crate's
/// `crates/NAME/src/`.
fn source_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![repo().join("src")];
    let mut crates: Vec<PathBuf> = std::fs::read_dir(repo().join("crates"))
        .expect("read crates/")
        .map(|e| e.expect("dir entry").path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    crates.sort();
    dirs.extend(crates);
    dirs
}

/// Where a repository path may start, for spans in the architecture document.
const PATH_ROOTS: &[&str] = &[
    "src/",
    "crates/",
    "tests/",
    "docs/",
    "policies/",
    "certs/",
    "bench/",
    "benches/",
    ".ci/",
    "proptest-regressions/",
];

/// Whether `source` defines `item` (a function, type, constant or module).
fn defines(source: &str, item: &str) -> bool {
    [
        "fn ", "struct ", "enum ", "trait ", "type ", "const ", "static ", "mod ",
    ]
    .iter()
    .any(|kw| {
        let needle = format!("{kw}{item}");
        source.match_indices(&needle).any(|(i, _)| {
            let after = source[i + needle.len()..].chars().next();
            !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    })
}

#[test]
fn the_architecture_document_maps_every_module_and_names_only_paths_that_exist() {
    let doc = read("docs/architecture.md");
    let map = section(&doc, "## Module map");
    let (map_prose, _) = split_fences(map);
    let mapped: BTreeSet<String> = code_spans(&map_prose)
        .iter()
        .map(|s| s.split("::").next().unwrap_or_default().to_string())
        .collect();
    let mut files = Vec::new();
    for dir in source_dirs() {
        rust_files(&dir, &mut files);
    }
    assert!(
        files.len() > 20,
        "found only {files:?} under src/ and crates/*/src/"
    );
    let unmapped: Vec<&String> = files.iter().filter(|f| !mapped.contains(*f)).collect();
    assert!(
        unmapped.is_empty(),
        "docs/architecture.md's module map does not name {unmapped:?}: add a line for each"
    );

    let (prose, _) = split_fences(&doc);
    let mut problems = Vec::new();
    let mut checked = 0;
    for span in code_spans(&prose) {
        if !PATH_ROOTS.iter().any(|r| span.starts_with(r)) {
            continue;
        }
        checked += 1;
        let (path, item) = match span.split_once("::") {
            Some((p, i)) => (p, Some(i)),
            None => (span.as_str(), None),
        };
        let full = repo().join(path);
        if !full.exists() {
            problems.push(format!("`{span}`: {path} does not exist"));
            continue;
        }
        if let Some(item) = item {
            let source = std::fs::read_to_string(&full).unwrap_or_default();
            if !defines(&source, item) {
                problems.push(format!("`{span}`: {path} defines no `{item}`"));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} paths found in docs/architecture.md"
    );
    assert!(
        problems.is_empty(),
        "docs/architecture.md names what the code does not have:\n{}",
        problems.join("\n")
    );
}

/// `latchkey ARGS --help`, with no `LATCHKEY_*` variable set (clap would show its value).
fn help(args: &[&str]) -> String {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .arg("--help")
        .env_clear()
        .env("COLUMNS", "200");
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(20));
    assert_eq!(
        out.code(),
        Some(0),
        "latchkey {args:?} --help: {}",
        out.stderr
    );
    out.stdout
}

/// One flag as `--help` shows it.
#[derive(Debug)]
struct Flag {
    long: String,
    /// The `[env: NAME=]` annotation's NAME.
    env: Option<String>,
}

/// Lines of the `title:` block of a help text (`Options:`, `Commands:`).
fn help_block<'a>(text: &'a str, title: &str) -> Vec<&'a str> {
    let mut lines = text.lines().skip_while(|l| l.trim_end() != title);
    if lines.next().is_none() {
        return Vec::new();
    }
    lines
        .take_while(|l| l.is_empty() || l.starts_with(' '))
        .collect()
}

/// The titles of a help text's flag blocks: `Options:` and each `help_heading` (`serve`'s
/// `Listeners:`, `Audit:`, ...), not `Usage:`, `Commands:` or `Arguments:`.
fn flag_headings(help_text: &str) -> Vec<&str> {
    help_text
        .lines()
        .filter(|l| !l.starts_with(' ') && l.ends_with(':'))
        .filter(|l| !["Usage:", "Commands:", "Arguments:"].contains(l))
        .collect()
}

/// Every long flag of one command, under every heading, with its variable.
fn flags(help_text: &str) -> Vec<Flag> {
    let mut blocks: Vec<String> = Vec::new();
    let lines: Vec<&str> = flag_headings(help_text)
        .into_iter()
        .flat_map(|title| help_block(help_text, title))
        .collect();
    for line in lines {
        let indent = line.len() - line.trim_start().len();
        if line.trim_start().starts_with('-') && indent <= 6 {
            blocks.push(String::new());
        }
        if let Some(b) = blocks.last_mut() {
            b.push(' ');
            b.push_str(line.trim());
        }
    }
    blocks
        .iter()
        .filter_map(|b| {
            let long = b
                .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
                .find(|w| w.starts_with("--"))?
                .to_string();
            let env = b.split_once("[env: ").map(|(_, rest)| {
                rest.split(['=', ']'])
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_string()
            });
            Some(Flag { long, env })
        })
        .collect()
}

/// Subcommand names listed in a help text (without clap's `help`).
fn subcommands(help_text: &str) -> Vec<String> {
    help_block(help_text, "Commands:")
        .iter()
        // A command's line is indented two spaces; a wrapped description, further.
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Every command path (`["serve"]`, `["ca", "init"]`, …) that has no subcommands of its own,
/// with its flags; the top level (`[]`) too.
fn commands() -> Vec<(Vec<String>, Vec<Flag>)> {
    let mut out = Vec::new();
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = todo.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&args);
        let subs = subcommands(&text);
        for s in &subs {
            let mut p = path.clone();
            p.push(s.clone());
            todo.push(p);
        }
        if subs.is_empty() || path.is_empty() {
            out.push((path, flags(&text)));
        }
    }
    assert!(out.len() >= 7, "found only {out:?}");
    out
}

/// The `latchkey …` synopsis lines of the CLI reference, by command path: each entry is
/// a `latchkey WORDS [flags…]` line and the indented lines after it, comments removed.
fn synopses(cli: &str) -> Vec<(Vec<String>, String)> {
    let (_, code) = split_fences(cli);
    let mut out: Vec<(Vec<String>, String)> = Vec::new();
    for line in code.lines() {
        let text = line.split(" #").next().unwrap_or_default();
        if let Some(rest) = text.strip_prefix("latchkey ") {
            let path: Vec<String> = rest
                .split_whitespace()
                .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
                .filter(|w| !w.starts_with('-'))
                .map(str::to_string)
                .collect();
            out.push((path, rest.to_string()));
        } else if line.starts_with(' ') {
            if let Some((_, s)) = out.last_mut() {
                s.push(' ');
                s.push_str(text);
            }
        }
    }
    out
}

/// Flags clap gives every command: documented once for all.
const BUILTIN: &[&str] = &["--help", "--version"];

#[test]
fn the_cli_reference_lists_every_command_and_every_flag_of_the_binary() {
    let text = read(CLI);
    let cli = text.as_str();
    let synopses = synopses(cli);
    let mut missing = Vec::new();
    for (path, flags) in commands() {
        for flag in &flags {
            if BUILTIN.contains(&flag.long.as_str()) {
                if !mentions_flag(cli, &flag.long) {
                    missing.push(format!("{} (every command)", flag.long));
                }
                continue;
            }
            let listed = synopses
                .iter()
                .filter(|(p, _)| *p == path)
                .any(|(_, s)| mentions_flag(s, &flag.long));
            if !listed {
                missing.push(format!("latchkey {} {}", path.join(" "), flag.long));
            }
        }
        if !path.is_empty() && !synopses.iter().any(|(p, _)| *p == path) {
            missing.push(format!("latchkey {} (no synopsis line)", path.join(" ")));
        }
    }
    assert!(
        missing.is_empty(),
        "{CLI}'s synopsis does not list:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_reason_code_is_in_the_reason_code_reference() {
    let refusals = read(REASON_CODES);
    let missing: Vec<&str> = Reason::ALL
        .iter()
        .map(|r| r.code())
        .filter(|code| !refusals.contains(&format!("`{code}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "{REASON_CODES} does not list reason codes {missing:?}"
    );
}

/// The variable the CLI reference's rule gives a flag: `LATCHKEY_` and the flag, upper-cased, `-` → `_`.
fn rule_variable(long: &str) -> String {
    format!(
        "LATCHKEY_{}",
        long.trim_start_matches('-')
            .to_ascii_uppercase()
            .replace('-', "_")
    )
}

#[test]
fn every_flag_reads_the_variable_the_cli_reference_says_or_is_listed_as_having_none() {
    let text = read(CLI);
    let cli = text.as_str();
    let marker = "Flags without a variable:";
    let none_line = cli
        .lines()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("{CLI} has no line with {marker:?}"));
    let without: BTreeSet<String> = code_spans(none_line.split(marker).nth(1).unwrap_or_default())
        .into_iter()
        .collect();
    let mut problems = Vec::new();
    for (path, flags) in commands() {
        let cmd = ["latchkey".to_string()]
            .into_iter()
            .chain(path.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        for flag in flags {
            match (&flag.env, without.contains(&flag.long)) {
                (None, false) => problems.push(format!(
                    "{cmd} {}: no variable, and not listed after {marker:?}",
                    flag.long
                )),
                (Some(var), true) => problems.push(format!(
                    "{cmd} {}: reads {var}, but {CLI} lists it as having none",
                    flag.long
                )),
                (Some(var), false) => {
                    // LATCHKEY_<FLAG>, or LATCHKEY_<COMMAND>_<FLAG> spelled out in the section.
                    let plain = rule_variable(&flag.long);
                    let prefixed = path.last().map(|c| {
                        plain.replacen(
                            "LATCHKEY_",
                            &format!("LATCHKEY_{}_", c.to_ascii_uppercase()),
                            1,
                        )
                    });
                    let documented = *var == plain
                        || (prefixed.as_ref() == Some(var) && cli.contains(&format!("`{var}`")));
                    if !documented {
                        problems.push(format!(
                            "{cmd} {}: reads {var}, which is neither {plain} nor {} spelled out in {CLI}",
                            flag.long,
                            prefixed.unwrap_or_default()
                        ));
                    }
                }
                (None, true) => {}
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{CLI}'s environment-variable rule does not hold:\n{}",
        problems.join("\n")
    );
}

#[test]
fn explain_json_can_be_set_by_its_variable() {
    let run = |value: Option<&str>| {
        let mut cmd = Command::new(BIN);
        cmd.args(["explain", "--policies"])
            .arg(repo().join("policies"))
            .args(["GET", "https://api.github.com/zen"])
            .env_remove("LATCHKEY_EXPLAIN_JSON");
        if let Some(v) = value {
            cmd.env("LATCHKEY_EXPLAIN_JSON", v);
        }
        wait_with_timeout(&mut cmd, Duration::from_secs(20))
    };
    let json = run(Some("true"));
    assert_eq!(json.code(), Some(0), "{}", json.stderr);
    let parsed: serde_json::Value = serde_json::from_str(&json.stdout).unwrap_or_else(|e| {
        panic!(
            "LATCHKEY_EXPLAIN_JSON=true printed no JSON ({e}): {}",
            json.stdout
        )
    });
    assert_eq!(parsed["decision"], "allow", "{parsed}");
    let text = run(None);
    assert_eq!(text.code(), Some(0), "{}", text.stderr);
    assert!(
        serde_json::from_str::<serde_json::Value>(&text.stdout).is_err()
            && text.stdout.contains("decision:"),
        "without the variable explain prints text: {}",
        text.stdout
    );
}

/// The first word of each column of a layout line (columns are set apart by two spaces or more)
/// that looks like a path.
fn layout_paths(block: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in block.lines() {
        for column in line.split("  ").map(str::trim).filter(|c| !c.is_empty()) {
            let word = column.split_whitespace().next().unwrap_or_default();
            if word.contains('/') || word.starts_with('.') {
                out.push(word.to_string());
            }
        }
    }
    out
}

#[test]
fn the_layout_chapter_names_every_top_level_directory_and_source_module_and_nothing_else() {
    let layout = read(LAYOUT);
    assert!(
        layout.contains("(../architecture.md)"),
        "{LAYOUT} does not link the book's architecture chapter (../architecture.md)"
    );
    let (_, block) = split_fences(&layout);
    let named = layout_paths(&block);
    let missing: Vec<&String> = named
        .iter()
        .filter(|p| !repo().join(p.as_str()).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "{LAYOUT} names paths that do not exist: {missing:?}"
    );
    let mut expected = Vec::new();
    // The top level, the binary's modules and every crate of the workspace.
    let dirs = [
        (repo(), ""),
        (repo().join("src"), "src/"),
        (repo().join("crates"), "crates/"),
    ];
    for (dir, prefix) in dirs {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("dir entry").path();
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            let hidden = name.starts_with('.') && name != ".ci";
            if (!path.is_dir() && prefix.is_empty()) || hidden || name == "target" {
                continue;
            }
            let slash = if path.is_dir() { "/" } else { "" };
            expected.push(format!("{prefix}{name}{slash}"));
        }
    }
    expected.sort();
    let unnamed: Vec<&String> = expected
        .iter()
        .filter(|e| !named.iter().any(|n| n.starts_with(e.as_str())))
        .collect();
    assert!(unnamed.is_empty(), "{LAYOUT} does not name {unnamed:?}");
}

/// Every text file of the repository outside `target/` and `.git/` (its path, its text).
fn repo_texts(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name == ".git" {
            continue;
        }
        if path.is_dir() {
            repo_texts(&path, out);
        } else if let Ok(text) = std::fs::read_to_string(&path) {
            out.push((path, text));
        }
    }
}

#[test]
fn every_cargo_install_the_docs_and_scripts_run_is_locked() {
    let mut files = Vec::new();
    repo_texts(&repo(), &mut files);
    let mut unlocked = Vec::new();
    for (path, text) in &files {
        if path.extension().is_some_and(|e| e == "rs") {
            continue;
        }
        for (i, line) in text.lines().enumerate() {
            if line.contains("cargo install") && !line.contains("--locked") {
                unlocked.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        unlocked.is_empty(),
        "`cargo install` without --locked builds dependencies at versions CI never tested:\n{}",
        unlocked.join("\n")
    );
}

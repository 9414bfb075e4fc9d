//! The examples in the README and the book (`docs/src/`) are the real thing: every policy
//! snippet passes `latchkey check` (alone, or beside the presets it names), every policy-test
//! snippet passes `latchkey test` against the example policy, and the audit-record example holds
//! real records whose every field the field table explains. An edit that drifts from the code
//! fails here.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::check_record;
use crate::support::latchkey::BIN;

/// The chapter with the audit record's example and field table.
const AUDIT_RECORD: &str = "docs/src/reference/audit-record.md";

/// The README and every chapter of the book, each with its path from the repository root.
fn documents() -> Vec<(String, String)> {
    let mut paths = vec![repo("README.md")];
    markdown_files(&repo("docs/src"), &mut paths);
    paths
        .into_iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
            let rel = p
                .strip_prefix(repo(""))
                .unwrap_or(&p)
                .to_string_lossy()
                .to_string();
            (rel, text)
        })
        .collect()
}

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "md") {
            out.push(path);
        }
    }
}

/// The bodies of a document's fenced blocks with this info string, with their line numbers.
fn blocks(text: &str, lang: &str) -> Vec<(usize, String)> {
    let fence = format!("```{lang}");
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match current.as_mut() {
            None if line.trim_end() == fence => current = Some((i + 1, String::new())),
            None => {}
            Some(_) if line.trim_end() == "```" => out.extend(current.take()),
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    assert!(current.is_none(), "an unterminated ```{lang} block");
    out
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn copy_toml_files(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "toml") {
            std::fs::copy(&path, to.join(path.file_name().expect("name"))).expect("copy");
        }
    }
}

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("LATCHKEY_POLICIES")
        .output()
        .expect("run latchkey");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn every_toml_snippet_in_the_readme_and_the_book_is_a_valid_policy_or_passing_policy_test() {
    let snippets: Vec<(String, usize, String)> = documents()
        .iter()
        .flat_map(|(file, text)| {
            blocks(text, "toml")
                .into_iter()
                .map(move |(line, body)| (file.clone(), line, body))
        })
        .collect();
    assert!(
        snippets.len() >= 4,
        "the README and the book have {} toml blocks",
        snippets.len()
    );
    for (file, line, body) in snippets {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        if body.contains("[[cases]]") {
            // A policy-test file: it runs against the example policy and passes.
            std::fs::create_dir(d.join("tests")).expect("mkdir");
            std::fs::copy(repo("policies/example.toml"), d.join("example.toml")).expect("copy");
            std::fs::write(d.join("tests/readme.toml"), &body).expect("write");
            let (ok, out) = run(&["test", "--policies", d.to_str().expect("utf-8")]);
            assert!(
                ok,
                "{file}:{line}: the policy-test snippet fails:\n{out}\n{body}"
            );
            continue;
        }
        std::fs::write(d.join("readme.toml"), &body).expect("write");
        let policies = d.to_str().expect("utf-8");
        let (alone, out_alone) = run(&["check", "--no-secrets", "--policies", policies]);
        if alone {
            continue;
        }
        // A snippet that names rules from the shipped presets (identities) is checked beside them.
        copy_toml_files(&repo("policies/presets"), d);
        let (with_presets, out) = run(&["check", "--no-secrets", "--policies", policies]);
        assert!(
            with_presets,
            "{file}:{line}: the policy snippet is invalid alone:\n{out_alone}\nand beside \
             policies/presets:\n{out}\n{body}"
        );
    }
}

#[test]
fn the_audit_record_example_holds_real_records_and_the_table_explains_every_field() {
    let text = std::fs::read_to_string(repo(AUDIT_RECORD))
        .unwrap_or_else(|e| panic!("read {AUDIT_RECORD}: {e}"));
    let section = text.as_str();
    let json = blocks(section, "json");
    assert_eq!(json.len(), 1, "one ```json example in {AUDIT_RECORD}");
    let records: Vec<Value> = serde_json::Deserializer::from_str(&json[0].1)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .expect("the example is a sequence of JSON objects");
    assert!(!records.is_empty());
    let mut fields: Vec<String> = Vec::new();
    for r in &records {
        check_record(r).unwrap_or_else(|e| panic!("{AUDIT_RECORD}'s example: {e}\n{r}"));
        for key in r.as_object().expect("object").keys() {
            if !fields.contains(key) {
                fields.push(key.clone());
            }
        }
    }
    // The field table: rows like "| `a`, `b` | meaning |".
    let documented: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .flat_map(|l| l.split('|').nth(1).unwrap_or("").split(','))
        .map(|f| f.trim().trim_matches('`'))
        .collect();
    for field in &fields {
        assert!(
            documented.contains(&field.as_str()),
            "{AUDIT_RECORD}: the field table does not explain `{field}`"
        );
    }
    for field in &documented {
        assert!(
            fields.iter().any(|f| f == field),
            "{AUDIT_RECORD}: the table explains `{field}`, which the example lacks"
        );
    }
}

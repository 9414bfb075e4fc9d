//! The policy files `latchkey learn` reads, edits (identities granted the learned rules) and
//! writes, and what it says when they do not load.

use super::*;

/// The index in `sources` of `path`, if it is one of the policy's files.
pub(super) fn same_file_index(sources: &PolicySources, path: &Path) -> Option<usize> {
    let want = std::fs::canonicalize(path).ok()?;
    sources
        .files
        .iter()
        .position(|(p, _)| std::fs::canonicalize(p).is_ok_and(|c| c == want))
}

/// The `name`s of the `[[rules]]` in a policy file.
pub(super) fn rule_names(path: &Path, text: &str) -> anyhow::Result<BTreeSet<String>> {
    let doc: toml_edit::DocumentMut = text
        .parse()
        .with_context(|| format!("{}: not TOML", path.display()))?;
    Ok(doc
        .get("rules")
        .and_then(|r| r.as_array_of_tables())
        .map(|rules| {
            rules
                .iter()
                .filter_map(|t| t.get("name").and_then(|n| n.as_str()).map(String::from))
                .collect()
        })
        .unwrap_or_default())
}

/// `text` with each `[identities.NAME] rules` array granted `grants[NAME]` and stripped of
/// `drop`, comments and layout kept; `None` when nothing changed. An identity with
/// `rules = ["*"]` already has every rule.
pub(super) fn edit_identity_rules(
    path: &Path,
    text: &str,
    grants: &BTreeMap<String, Vec<String>>,
    drop: &BTreeSet<String>,
) -> anyhow::Result<Option<String>> {
    if !text.contains("identities") {
        return Ok(None);
    }
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .with_context(|| format!("{}: not TOML", path.display()))?;
    let mut changed = false;
    let Some(idents) = doc
        .get_mut("identities")
        .and_then(|t| t.as_table_like_mut())
    else {
        return Ok(None);
    };
    for (name, item) in idents.iter_mut() {
        let Some(rules) = item
            .as_table_like_mut()
            .and_then(|t| t.get_mut("rules"))
            .and_then(|r| r.as_array_mut())
        else {
            continue;
        };
        let before = rules.len();
        rules.retain(|v| v.as_str().is_none_or(|s| !drop.contains(s)));
        changed |= rules.len() != before;
        let all = rules.iter().any(|v| v.as_str() == Some("*"));
        if let Some(new) = grants.get(name.get()) {
            if !all {
                // A list written one name per line gets the new names first, each on its own
                // line, so a comment after the last name stays where it was.
                let line_prefix = rules
                    .iter()
                    .next()
                    .and_then(|v| v.decor().prefix())
                    .and_then(|p| p.as_str())
                    .filter(|p| p.contains('\n'))
                    .map(str::to_string);
                let mut at = 0;
                for n in new {
                    if rules.iter().any(|v| v.as_str() == Some(n.as_str())) {
                        continue;
                    }
                    changed = true;
                    match &line_prefix {
                        Some(prefix) => {
                            let mut v = toml_edit::Value::from(n.as_str());
                            v.decor_mut().set_prefix(prefix.as_str());
                            v.decor_mut().set_suffix("");
                            rules.insert_formatted(at, v);
                            at += 1;
                        }
                        None => rules.push(n.as_str()),
                    }
                }
            }
        }
    }
    Ok(changed.then(|| doc.to_string()))
}

/// Existing cases the learned rules change: said, so the reviewer sees it before `latchkey
/// test` does.
pub(super) fn warn_existing_cases(policies: &Path, learned_cases: &Path, policy: &Policy) {
    let dir = policies.join("tests");
    let Ok((cases, _)) = load_cases_dir(&dir, policy) else {
        return;
    };
    let replaced = std::fs::canonicalize(learned_cases).ok();
    for case in cases {
        if replaced.is_some() && std::fs::canonicalize(&case.file).ok() == replaced {
            continue;
        }
        let run = run_case(policy, &case);
        if !run.passed() {
            eprintln!(
                "latchkey: warning: {}: case {:?} fails with the learned rules: {}",
                case.location(),
                case.name,
                run.failures.join("; ")
            );
        }
    }
}

/// Writes `text` to `path` whole (a temporary file renamed over it), creating its directory.
pub(super) fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create directory {}", dir.display()))?;
    }
    let tmp = path.with_extension("toml.learn-tmp");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

pub(super) fn load_error_text(e: &LoadError) -> String {
    match e {
        LoadError::Invalid(problems) => problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

/// The policy did not load: its problems on stderr, exit 1.
pub(super) fn load_failed(dir: &Path, e: LoadError) -> ExitCode {
    eprintln!("{}", load_error_text(&e));
    eprintln!(
        "latchkey: error: the policy in {} does not load; learn adds to a policy that does",
        dir.display()
    );
    ExitCode::from(1)
}

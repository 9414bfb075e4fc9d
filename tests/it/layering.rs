//! Dependencies point inward, and stay that way: this reads every file under `src/`, finds which
//! of the crate's top-level modules each module uses, and fails when
//!
//! - a layering rule is broken (`policy` using `proxy` or `upstream`, `upstream` using `policy`,
//!   `wire` using anything but `reason`, …), or
//! - the "Dependencies" table in `docs/architecture.md` says something else than the code.
//!
//! A use is a `crate::NAME` path (also inside `use crate::{…}` groups) or a `super::` chain that
//! climbs out of the module, outside comments; `main.rs` counts its `latchkey::NAME` paths.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One rule: `module` may not use any of `forbidden` (or, with `only`, anything but those).
struct Rule {
    name: &'static str,
    module: &'static str,
    forbidden: &'static [&'static str],
    only: Option<&'static [&'static str]>,
}

const RULES: &[Rule] = &[
    Rule {
        name: "policy-knows-no-transport",
        module: "policy",
        forbidden: &["proxy", "upstream", "admin", "cli"],
        only: None,
    },
    Rule {
        name: "upstream-knows-no-policy",
        module: "upstream",
        forbidden: &["policy", "proxy", "admin", "cli"],
        only: None,
    },
    Rule {
        name: "wire-is-a-leaf",
        module: "wire",
        forbidden: &[],
        only: Some(&["reason"]),
    },
    Rule {
        name: "reason-is-a-leaf",
        module: "reason",
        forbidden: &[],
        only: Some(&[]),
    },
    Rule {
        name: "secrets-knows-no-policy-or-transport",
        module: "secrets",
        forbidden: &["policy", "proxy", "upstream", "admin", "cli", "audit"],
        only: None,
    },
    Rule {
        name: "nothing-but-main-uses-cli",
        module: "*",
        forbidden: &["cli"],
        only: None,
    },
    Rule {
        name: "signing-knows-no-transport",
        module: "signing",
        forbidden: &["policy", "proxy", "upstream", "admin", "cli", "audit"],
        only: None,
    },
    Rule {
        // Private file modes (`files`, itself a leaf) are the one thing it shares.
        name: "state-is-a-leaf",
        module: "state",
        forbidden: &[],
        only: Some(&["files"]),
    },
    Rule {
        name: "files-is-a-leaf",
        module: "files",
        forbidden: &[],
        only: Some(&[]),
    },
    Rule {
        name: "governance-knows-no-proxy",
        module: "governance",
        forbidden: &["proxy", "admin", "cli", "dns"],
        only: None,
    },
    Rule {
        name: "audit-never-sees-a-secret-store",
        module: "audit",
        forbidden: &["secrets"],
        only: None,
    },
];

/// The rules asserted. Every rule in [`RULES`] belongs here once the code keeps it; one left out
/// is only reported (and reported as holding once it does).
const ENFORCED: &[&str] = &[
    "policy-knows-no-transport",
    "upstream-knows-no-policy",
    "wire-is-a-leaf",
    "reason-is-a-leaf",
    "secrets-knows-no-policy-or-transport",
    "nothing-but-main-uses-cli",
    "audit-never-sees-a-secret-store",
    "signing-knows-no-transport",
    "state-is-a-leaf",
    "files-is-a-leaf",
    "governance-knows-no-proxy",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file under `src/` belongs to (`src/policy/rule.rs` → `policy`,
/// `src/reason.rs` → `reason`), and how deep its module sits (`policy::rule` is 2).
fn module_of(rel: &Path) -> (String, usize) {
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let top = parts[0].trim_end_matches(".rs").to_string();
    let last = parts.last().map(String::as_str).unwrap_or_default();
    let depth = if last == "mod.rs" || parts.len() == 1 {
        parts.len().max(2) - 1
    } else {
        parts.len()
    };
    (top, depth)
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules `source` names through `root::` (`crate` or `latchkey`).
fn named_through(source: &str, root: &str, out: &mut BTreeSet<String>) {
    let needle = format!("{root}::");
    for (i, _) in source.match_indices(&needle) {
        let before = source[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &source[i + needle.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::X, b, c::{…}}`: the names at the group's top level.
            let mut level = 0;
            let mut at_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => level += 1,
                    '}' if level == 0 => break,
                    '}' => level -= 1,
                    ',' if level == 0 => at_start = true,
                    c if at_start && level == 0 && !c.is_whitespace() => {
                        at_start = false;
                        out.insert(ident(&group[j..]).to_string());
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest).to_string());
        }
    }
}

/// The top-level modules reached by `super::` chains that climb out of a module `depth` deep.
fn named_through_super(source: &str, depth: usize, out: &mut BTreeSet<String>) {
    let mut rest = source;
    while let Some(i) = rest.find("super::") {
        let before = rest[..i].chars().next_back();
        let mut tail = &rest[i..];
        let mut count = 0;
        while let Some(t) = tail.strip_prefix("super::") {
            tail = t;
            count += 1;
        }
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && count >= depth
        {
            out.insert(ident(tail).to_string());
        }
        rest = tail;
    }
}

/// Source text without comments (line comments, doc comments, block comments), so a doc that
/// mentions `crate::proxy` is not a use of it. String literals are kept; none names a path.
fn code_only(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut block = 0usize;
    for line in source.lines() {
        let mut rest = line;
        loop {
            if block > 0 {
                match rest.find("*/") {
                    Some(end) => {
                        block -= 1;
                        rest = &rest[end + 2..];
                    }
                    None => break,
                }
            } else {
                let line_comment = rest.find("//").unwrap_or(rest.len());
                match rest.find("/*") {
                    Some(b) if b < line_comment => {
                        out.push_str(&rest[..b]);
                        block += 1;
                        rest = &rest[b + 2..];
                    }
                    _ => {
                        out.push_str(&rest[..line_comment]);
                        break;
                    }
                }
            }
        }
        out.push('\n');
    }
    out
}

/// Module → the other top-level modules it uses, for every module under `src/` (and `main`).
fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let src = repo().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "found only {files:?} under src/");
    let top: BTreeSet<String> = files
        .iter()
        .map(|f| module_of(f.strip_prefix(&src).expect("under src")).0)
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let (module, depth) = module_of(rel);
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let code = code_only(&text);
        let mut named = BTreeSet::new();
        if module == "main" {
            named_through(&code, "latchkey", &mut named);
        } else {
            named_through(&code, "crate", &mut named);
            named_through_super(&code, depth, &mut named);
        }
        let entry = deps.entry(module.clone()).or_default();
        entry.extend(
            named
                .into_iter()
                .filter(|n| top.contains(n) && *n != module),
        );
    }
    deps
}

#[test]
fn dependencies_point_inward() {
    let deps = dependencies();
    let mut broken = Vec::new();
    let mut reported = Vec::new();
    for rule in RULES {
        let mut violations = Vec::new();
        for (module, uses) in &deps {
            let applies = rule.module == module || (rule.module == "*" && module != "main");
            if !applies {
                continue;
            }
            for used in uses {
                let bad = rule.forbidden.contains(&used.as_str())
                    || rule.only.is_some_and(|only| !only.contains(&used.as_str()));
                if bad {
                    violations.push(format!("{module} uses {used}"));
                }
            }
        }
        if violations.is_empty() {
            if !ENFORCED.contains(&rule.name) {
                reported.push(format!(
                    "{}: holds now; add it to ENFORCED in tests/it/layering.rs",
                    rule.name
                ));
            }
        } else if ENFORCED.contains(&rule.name) {
            broken.push(format!("{}: {}", rule.name, violations.join(", ")));
        } else {
            reported.push(format!(
                "{} (not enforced yet): {}",
                rule.name,
                violations.join(", ")
            ));
        }
    }
    for line in &reported {
        eprintln!("layering: {line}");
    }
    for name in ENFORCED {
        assert!(
            RULES.iter().any(|r| r.name == *name),
            "ENFORCED names {name}, which is not a rule"
        );
    }
    assert!(
        broken.is_empty(),
        "layering rules broken:\n{}",
        broken.join("\n")
    );
}

/// The "Dependencies" section of docs/architecture.md: a table of `module` → the modules it
/// uses, which must be exactly what the code does.
#[test]
fn the_architecture_documents_the_dependencies_the_code_has() {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md"))
        .unwrap_or_else(|e| panic!("read docs/architecture.md: {e}"));
    let start = doc
        .find("\n### Dependencies\n")
        .expect("docs/architecture.md has a \"### Dependencies\" section");
    let section = &doc[start + 1..];
    let end = section[4..].find("\n#").map_or(section.len(), |e| e + 4);
    let mut documented: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in section[..end].lines() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        if cells.len() != 2 || !line.trim_start().starts_with('|') {
            continue;
        }
        let module = cells[0].trim().trim_matches('`');
        if module.is_empty() || module == "module" || module.starts_with('-') {
            continue;
        }
        let uses: BTreeSet<String> = cells[1]
            .split(',')
            .map(|u| u.trim().trim_matches('`').to_string())
            .filter(|u| !u.is_empty() && u != "—")
            .collect();
        documented.insert(module.to_string(), uses);
    }
    let actual = dependencies();
    let table: String = actual
        .iter()
        .map(|(m, uses)| {
            let uses: Vec<String> = uses.iter().map(|u| format!("`{u}`")).collect();
            let uses = if uses.is_empty() {
                "—".to_string()
            } else {
                uses.join(", ")
            };
            format!("| `{m}` | {uses} |\n")
        })
        .collect();
    assert_eq!(
        documented, actual,
        "docs/architecture.md's Dependencies table does not match the code; the code's:\n\
         | module | uses |\n|---|---|\n{table}"
    );
}

#[test]
fn the_dependency_reader_sees_paths_groups_and_escaping_supers_but_not_comments() {
    let mut named = BTreeSet::new();
    let code = code_only(
        "use crate::{policy::Rule, reason,\n  wire::{host, cidr}};\n\
         // crate::proxy in a comment\n/* crate::admin */ let x = crate::upstream::dial;\n\
         use super::super::audit::Entry;\nuse super::sibling;\n",
    );
    named_through(&code, "crate", &mut named);
    named_through_super(&code, 2, &mut named);
    let want: BTreeSet<String> = ["policy", "reason", "wire", "upstream", "audit"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(named, want);
    assert_eq!(module_of(Path::new("policy/rule.rs")), ("policy".into(), 2));
    assert_eq!(module_of(Path::new("policy/mod.rs")), ("policy".into(), 1));
    assert_eq!(module_of(Path::new("reason.rs")), ("reason".into(), 1));
    assert_eq!(module_of(Path::new("cli/demo/mod.rs")), ("cli".into(), 2));
}

/// The top-level modules form no cycle: following "uses" from any module never leads back to
/// it (a cycle is two modules that can only be understood together).
#[test]
fn the_top_level_modules_form_no_cycle() {
    let deps = dependencies();
    fn visit(
        module: &str,
        deps: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        cycles: &mut Vec<String>,
    ) {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut cycle = path[at..].to_vec();
            cycle.push(module.to_string());
            cycles.push(cycle.join(" → "));
            return;
        }
        if !done.insert(module.to_string()) {
            return;
        }
        path.push(module.to_string());
        for used in deps.get(module).into_iter().flatten() {
            visit(used, deps, path, done, cycles);
        }
        path.pop();
    }
    let mut cycles = Vec::new();
    let mut done = BTreeSet::new();
    for module in deps.keys() {
        visit(module, &deps, &mut Vec::new(), &mut done, &mut cycles);
    }
    assert!(cycles.is_empty(), "module cycles: {cycles:#?}");
}

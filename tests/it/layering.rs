//! Dependencies point inward, and stay that way. Each layer is its own crate of the workspace
//! (`crates/NAME`, package `latchkey-NAME`), so the compiler already refuses a use a crate's
//! `Cargo.toml` does not declare. This test reads those manifests and fails when
//!
//! - a crate declares a dependency a layering rule forbids (`policy` on `proxy` or `upstream`,
//!   `upstream` on `policy`, `wire` on anything, …), or
//! - the "Dependencies" table in `docs/architecture.md` says something else than the manifests.
//!
//! Only `[dependencies]` count: a `[dev-dependencies]` entry serves the crate's own tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One rule: `krate` may not depend on any of `forbidden` (or, with `only`, on anything but
/// those). `*` is every crate.
struct Rule {
    name: &'static str,
    krate: &'static str,
    forbidden: &'static [&'static str],
    only: Option<&'static [&'static str]>,
}

const RULES: &[Rule] = &[
    Rule {
        name: "policy-knows-no-transport",
        krate: "policy",
        forbidden: &["proxy", "upstream", "admin", "dns", "latchkey"],
        only: None,
    },
    Rule {
        name: "upstream-knows-no-policy",
        krate: "upstream",
        forbidden: &["policy", "review", "proxy", "admin", "dns", "latchkey"],
        only: None,
    },
    Rule {
        // wire carries `reason` and `files` too: the leaf everything else may use.
        name: "wire-is-a-leaf",
        krate: "wire",
        forbidden: &[],
        only: Some(&[]),
    },
    Rule {
        name: "metrics-is-a-leaf",
        krate: "metrics",
        forbidden: &[],
        only: Some(&[]),
    },
    Rule {
        name: "secrets-knows-no-policy-or-transport",
        krate: "secrets",
        forbidden: &["policy", "proxy", "upstream", "admin", "audit", "latchkey"],
        only: None,
    },
    Rule {
        name: "signing-knows-no-transport",
        krate: "signing",
        forbidden: &["policy", "proxy", "upstream", "admin", "audit", "latchkey"],
        only: None,
    },
    Rule {
        // Private file modes (`files`, in wire) are the one thing it shares.
        name: "state-is-a-leaf",
        krate: "state",
        forbidden: &[],
        only: Some(&["wire"]),
    },
    Rule {
        name: "governance-knows-no-proxy",
        krate: "governance",
        forbidden: &["proxy", "admin", "dns", "latchkey"],
        only: None,
    },
    Rule {
        name: "audit-never-sees-a-secret-store",
        krate: "audit",
        forbidden: &["secrets"],
        only: None,
    },
    Rule {
        // The review tools read a compiled policy and nothing live.
        name: "review-reads-only-policy",
        krate: "review",
        forbidden: &[],
        only: Some(&["policy", "wire"]),
    },
    Rule {
        name: "the-runtime-knows-no-review-tool",
        krate: "proxy",
        forbidden: &["review"],
        only: None,
    },
    Rule {
        name: "nothing-depends-on-the-command-line",
        krate: "*",
        forbidden: &["latchkey"],
        only: None,
    },
];

/// Each workspace crate (`wire`, `policy`, …, and `latchkey`, the package at the root) and the
/// workspace crates its `[dependencies]` name.
fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let mut manifests = vec![("latchkey".to_string(), repo().join("Cargo.toml"))];
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(repo().join("crates"))
        .expect("read crates/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.join("Cargo.toml").exists())
        .collect();
    dirs.sort();
    for dir in dirs {
        let name = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        manifests.push((name, dir.join("Cargo.toml")));
    }
    let mut out = BTreeMap::new();
    for (name, path) in manifests {
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let manifest: toml::Table =
            toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let package = manifest
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(|n| n.as_str())
            .unwrap_or_default();
        let expected = if name == "latchkey" {
            "latchkey".to_string()
        } else {
            format!("latchkey-{name}")
        };
        assert_eq!(
            package,
            expected,
            "{}: the crate in crates/{name} is named latchkey-{name}",
            path.display()
        );
        let uses: BTreeSet<String> = manifest
            .get("dependencies")
            .and_then(|d| d.as_table())
            .map(|deps| {
                deps.keys()
                    .filter_map(|k| k.strip_prefix("latchkey-"))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        out.insert(name, uses);
    }
    out
}

/// The rules a crate graph breaks, one line each.
fn violations(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut out = Vec::new();
    for rule in RULES {
        for (krate, uses) in graph {
            if rule.krate != "*" && rule.krate != krate {
                continue;
            }
            for used in uses {
                let allowed = match rule.only {
                    Some(only) => only.contains(&used.as_str()),
                    None => !rule.forbidden.contains(&used.as_str()),
                };
                if !allowed {
                    out.push(format!("{}: {krate} depends on {used}", rule.name));
                }
            }
        }
    }
    out
}

#[test]
fn dependencies_point_inward() {
    let graph = dependencies();
    assert!(
        graph.len() > 10 && graph.contains_key("proxy") && graph.contains_key("wire"),
        "found only {:?} in the workspace",
        graph.keys()
    );
    for rule in RULES {
        assert!(
            rule.krate == "*" || graph.contains_key(rule.krate),
            "rule {} names crate {}, which does not exist",
            rule.name,
            rule.krate
        );
    }
    let broken = violations(&graph);
    assert!(
        broken.is_empty(),
        "the crate graph breaks the layering:\n{}",
        broken.join("\n")
    );
}

#[test]
fn a_forbidden_edge_is_caught() {
    let mut graph = dependencies();
    graph
        .get_mut("policy")
        .expect("a policy crate")
        .insert("proxy".into());
    graph
        .get_mut("wire")
        .expect("a wire crate")
        .insert("reason".into());
    graph
        .get_mut("admin")
        .expect("an admin crate")
        .insert("latchkey".into());
    let broken = violations(&graph);
    for expected in [
        "policy-knows-no-transport: policy depends on proxy",
        "wire-is-a-leaf: wire depends on reason",
        "nothing-depends-on-the-command-line: admin depends on latchkey",
    ] {
        assert!(broken.iter().any(|b| b == expected), "{broken:#?}");
    }
}

/// The "Dependencies" section of docs/architecture.md: a table of `crate` → the crates it
/// uses, which must be exactly what the manifests declare.
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
        let krate = cells[0].trim().trim_matches('`');
        if krate.is_empty() || krate == "crate" || krate.starts_with('-') {
            continue;
        }
        let uses: BTreeSet<String> = cells[1]
            .split(',')
            .map(|u| u.trim().trim_matches('`').to_string())
            .filter(|u| !u.is_empty() && u != "—")
            .collect();
        documented.insert(krate.to_string(), uses);
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
        "docs/architecture.md's Dependencies table does not match the manifests; theirs:\n\
         | crate | uses |\n|---|---|\n{table}"
    );
}

//! Files and functions stay small enough to read, or the build fails: this parses every non-test
//! `.rs` file of the crate(s) with `syn` and names
//!
//! - each file over [`MAX_FILE_LINES`] lines, and
//! - each function or method over [`MAX_FN_LINES`] lines (signature to closing brace; doc
//!   comments and attributes do not count),
//!
//! unless [`ALLOWED`] lists it with a reason. An entry that no longer matches anything too large
//! fails as well, so the list only shrinks.
//!
//! Tests do not count: files named `*_tests.rs` or `tests.rs`, `#[cfg(test)]` items and `#[test]`
//! functions are skipped. Both layouts are read: a single crate's `src/` and a workspace's
//! `crates/*/src`; a path is named as its module sits in the crate (`src/policy/rule.rs` and
//! `crates/policy/src/rule.rs` are both `policy/rule.rs`; a crate's `lib.rs` is its `mod.rs`).

use std::path::{Path, PathBuf};

use proc_macro2::Span;
use syn::visit::Visit;

/// The most lines a non-test source file may have.
const MAX_FILE_LINES: usize = 800;
/// The most lines a non-test function may have.
const MAX_FN_LINES: usize = 120;

/// What may be larger, and why: `path` (a file) or `path::fn` / `path::Type::method` (a
/// function), matched as a suffix of the normalised path (`cli/serve.rs::build` also names
/// `latchkey/cli/serve.rs::build`).
const ALLOWED: &[(&str, &str)] = &[
    // None: every non-test file and function is within the limits.
];

/// The top of the repository: the nearest directory at or above this package whose
/// `Cargo.toml` declares a `[workspace]`, else the package itself (a single crate).
fn repo() -> PathBuf {
    let package = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    package
        .ancestors()
        .find(|dir| {
            std::fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|toml| toml.lines().any(|l| l.trim() == "[workspace]"))
        })
        .map_or_else(|| package.clone(), Path::to_path_buf)
}

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

/// Every source directory with the name its files are listed under: `src/` as `""`, each
/// `crates/NAME/src` as `NAME/` (a `latchkey-` prefix dropped).
fn source_roots(repo: &Path) -> Vec<(PathBuf, String)> {
    let mut roots = Vec::new();
    if repo.join("src").is_dir() {
        roots.push((repo.join("src"), String::new()));
    }
    if let Ok(entries) = std::fs::read_dir(repo.join("crates")) {
        let mut crates: Vec<PathBuf> = entries.map(|e| e.expect("dir entry").path()).collect();
        crates.sort();
        for krate in crates {
            let src = krate.join("src");
            if src.is_dir() {
                let name = krate.file_name().expect("crate dir").to_string_lossy();
                let name = name.strip_prefix("latchkey-").unwrap_or(&name);
                roots.push((src, format!("{name}/")));
            }
        }
    }
    roots
}

/// A test-only file: its lines and functions are not counted.
fn is_test_file(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    name.is_some_and(|n| n == "tests.rs" || n.ends_with("_tests.rs"))
}

/// `#[cfg(test)]` (also inside `all(…)`/`any(…)`, but not `not(test)`), `#[test]`,
/// `#[tokio::test]` and the like.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        if a.path().segments.last().is_some_and(|s| s.ident == "test") {
            return true;
        }
        match &a.meta {
            syn::Meta::List(list) if list.path.is_ident("cfg") => {
                let tokens = list.tokens.to_string();
                let words: Vec<&str> = tokens
                    .split(|c: char| !c.is_alphanumeric() && c != '_')
                    .collect();
                words.contains(&"test") && !words.contains(&"not")
            }
            _ => false,
        }
    })
}

/// One function too long: its name (`fn` or `Type::method`), its first line and its length.
#[derive(Debug, PartialEq)]
struct LongFn {
    name: String,
    line: usize,
    lines: usize,
}

/// Walks one file's items, skipping test code, and records each function's length.
struct Measure {
    self_ty: Vec<String>,
    fns: Vec<LongFn>,
}

impl Measure {
    fn record(&mut self, ident: &syn::Ident, fn_token: Span, close: Span) {
        let first = fn_token.start().line;
        let lines = close.end().line + 1 - first;
        let name = match self.self_ty.last() {
            Some(ty) => format!("{ty}::{ident}"),
            None => ident.to_string(),
        };
        self.fns.push(LongFn {
            name,
            line: first,
            lines,
        });
    }
}

impl<'ast> Visit<'ast> for Measure {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test(&i.attrs) {
            return;
        }
        let ty = match &*i.self_ty {
            syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        self.self_ty.push(ty.unwrap_or_else(|| "_".to_string()));
        syn::visit::visit_item_impl(self, i);
        self.self_ty.pop();
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        if is_test(&t.attrs) {
            return;
        }
        self.self_ty.push(t.ident.to_string());
        syn::visit::visit_item_trait(self, t);
        self.self_ty.pop();
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        // A free function inside a method's body is not the method's type's.
        let outer = std::mem::take(&mut self.self_ty);
        self.record(
            &f.sig.ident,
            f.sig.fn_token.span,
            f.block.brace_token.span.close(),
        );
        syn::visit::visit_item_fn(self, f);
        self.self_ty = outer;
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        self.record(
            &f.sig.ident,
            f.sig.fn_token.span,
            f.block.brace_token.span.close(),
        );
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        if let Some(block) = &f.default {
            self.record(
                &f.sig.ident,
                f.sig.fn_token.span,
                block.brace_token.span.close(),
            );
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

/// Every function of `source` outside test code, with its length.
fn functions(source: &str) -> Result<Vec<LongFn>, syn::Error> {
    let file = syn::parse_file(source)?;
    let mut measure = Measure {
        self_ty: Vec::new(),
        fns: Vec::new(),
    };
    measure.visit_file(&file);
    Ok(measure.fns)
}

/// `rel` (a path under a source root, `/`-separated) as the module sits in its crate: the root's
/// name before it, a crate root's `lib.rs` as its `mod.rs`.
fn normalised(prefix: &str, rel: &str) -> String {
    if !prefix.is_empty() && rel == "lib.rs" {
        return format!("{prefix}mod.rs");
    }
    format!("{prefix}{rel}")
}

/// Whether allowlist entry `entry` names `what` (equal, or a suffix starting at a `/`).
fn names(entry: &str, what: &str) -> bool {
    what == entry || what.ends_with(&format!("/{entry}"))
}

/// One non-test source file, measured: its allowlist name, its path from the repository root,
/// its lines, and every function in it with its length.
struct Measured {
    name: String,
    shown: String,
    lines: usize,
    fns: Vec<LongFn>,
}

/// Every non-test source file of the tree, measured.
fn measured() -> Vec<Measured> {
    let repo = repo();
    let mut out = Vec::new();
    for (root, prefix) in source_roots(&repo) {
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        for path in files.into_iter().filter(|p| !is_test_file(p)) {
            let rel = path.strip_prefix(&root).expect("under its root");
            let rel = rel.to_string_lossy().replace('\\', "/");
            let shown = path
                .strip_prefix(&repo)
                .unwrap_or(&path)
                .display()
                .to_string();
            let source = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            let fns = functions(&source).unwrap_or_else(|e| panic!("parse {shown}: {e}"));
            out.push(Measured {
                name: normalised(&prefix, &rel),
                shown,
                lines: source.lines().count(),
                fns,
            });
        }
    }
    assert!(
        out.len() > 20,
        "read only {} source files under {}: is the layout known?",
        out.len(),
        repo.display()
    );
    out
}

/// Everything too large in the source tree: `(name, description)`, name as [`ALLOWED`] spells it.
fn too_large() -> Vec<(String, String)> {
    let mut found = Vec::new();
    for m in measured() {
        if m.lines > MAX_FILE_LINES {
            found.push((
                m.name.clone(),
                format!("{}: {} lines (at most {MAX_FILE_LINES})", m.shown, m.lines),
            ));
        }
        for f in m.fns.iter().filter(|f| f.lines > MAX_FN_LINES) {
            found.push((
                format!("{}::{}", m.name, f.name),
                format!(
                    "{}:{}: fn {} is {} lines (at most {MAX_FN_LINES})",
                    m.shown, f.line, f.name, f.lines
                ),
            ));
        }
    }
    found
}

/// The largest files and functions, for a maintainer (not a check):
/// `cargo test --test it size::report -- --ignored --nocapture`.
#[test]
#[ignore = "a report, not a check"]
fn report_the_largest_files_and_functions() {
    let all = measured();
    let mut files: Vec<(usize, &str)> = all.iter().map(|m| (m.lines, m.shown.as_str())).collect();
    files.sort_by(|a, b| b.cmp(a));
    let mut fns: Vec<(usize, String)> = all
        .iter()
        .flat_map(|m| {
            m.fns
                .iter()
                .map(move |f| (f.lines, format!("{}::{}", m.shown, f.name)))
        })
        .collect();
    fns.sort_by(|a, b| b.cmp(a));
    println!(
        "{} non-test source files, {} functions",
        all.len(),
        fns.len()
    );
    println!("largest files:");
    for (lines, name) in files.iter().take(15) {
        println!("  {lines:5}  {name}");
    }
    println!("longest functions:");
    for (lines, name) in fns.iter().take(15) {
        println!("  {lines:5}  {name}");
    }
    let over = |limit: usize| fns.iter().filter(|(l, _)| *l > limit).count();
    println!(
        "functions over 120 lines: {}, over 80: {}; files over 800 lines: {}",
        over(120),
        over(80),
        files.iter().filter(|(l, _)| *l > 800).count()
    );
}

#[test]
fn no_source_file_or_function_is_too_large_unless_allowed_with_a_reason() {
    let found = too_large();
    let mut problems = Vec::new();
    for (name, description) in &found {
        if !ALLOWED.iter().any(|(entry, _)| names(entry, name)) {
            problems.push(format!(
                "{description}: split it by concern (or list `{name}` in ALLOWED with a reason)"
            ));
        }
    }
    for (entry, reason) in ALLOWED {
        assert!(
            !reason.trim().is_empty(),
            "ALLOWED `{entry}` needs a reason"
        );
        if !found.iter().any(|(name, _)| names(entry, name)) {
            problems.push(format!(
                "ALLOWED `{entry}` is no longer too large (or no longer exists): remove it"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "tests/it/size.rs:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_measure_counts_functions_and_methods_but_not_test_code() {
    let body = "    let _ = 1;\n".repeat(MAX_FN_LINES);
    let source = format!(
        "/// Docs do not count.\n#[inline]\nfn long() {{\n{body}}}\n\
         fn short() {{}}\n\
         struct S;\nimpl S {{\n    fn method(&self) {{\n{body}    }}\n}}\n\
         trait T {{\n    fn provided(&self) {{\n{body}    }}\n    fn required(&self);\n}}\n\
         #[cfg(test)]\nmod tests {{\n    fn helper() {{\n{body}    }}\n}}\n\
         #[test]\nfn a_test() {{\n{body}}}\n\
         #[tokio::test]\nasync fn an_async_test() {{\n{body}}}\n\
         #[cfg(all(test, unix))]\nfn only_in_tests() {{\n{body}}}\n\
         #[cfg(not(test))]\nfn not_in_tests() {{\n{body}}}\n"
    );
    let fns = functions(&source).expect("parses");
    let named: Vec<(&str, usize)> = fns.iter().map(|f| (f.name.as_str(), f.lines)).collect();
    let long = MAX_FN_LINES + 2;
    assert_eq!(
        named,
        [
            ("long", long),
            ("short", 1),
            ("S::method", long),
            ("T::provided", long),
            ("not_in_tests", long),
        ]
    );
    assert_eq!(
        fns[0].line, 3,
        "the signature's line, not the doc comment's"
    );
}

#[test]
fn paths_are_named_as_the_module_sits_in_either_layout() {
    assert_eq!(normalised("", "policy/rule.rs"), "policy/rule.rs");
    assert_eq!(normalised("policy/", "rule.rs"), "policy/rule.rs");
    assert_eq!(normalised("policy/", "lib.rs"), "policy/mod.rs");
    assert_eq!(normalised("", "lib.rs"), "lib.rs");
    assert!(names("cli/serve.rs::build", "cli/serve.rs::build"));
    assert!(names("cli/serve.rs::build", "latchkey/cli/serve.rs::build"));
    assert!(!names("serve.rs::build", "cli/demo_serve.rs::build"));
    assert!(!names("cli/serve.rs", "cli/serve.rs::build"));
    assert!(is_test_file(Path::new("src/policy/diff_tests.rs")));
    assert!(is_test_file(Path::new("src/policy/tests.rs")));
    assert!(!is_test_file(Path::new("src/policy/contests.rs")));
}

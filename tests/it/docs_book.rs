//! The README and the book (`docs/`, an mdBook) hold together:
//!
//! - every relative link in the README, `docs/architecture.md` and every chapter resolves to a
//!   file or directory, and every `#anchor` to a heading of its target, with the ids mdBook gives
//!   headings (GitHub's are the same for these headings);
//! - `docs/src/SUMMARY.md` lists every chapter under `docs/src/`, so none is left out of the book;
//! - the README stays a short front page;
//! - the metrics reference lists exactly the metrics `crates/metrics/src/lib.rs` registers.
//!
//! `mdbook build docs` in `.ci/run` builds the book; mdBook itself does not check links.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The path of `path` from the repository root, `/`-separated, for messages and as a key.
fn rel(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
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

/// The documents whose links are checked: the README, the architecture document and every
/// chapter of the book.
fn documents() -> Vec<PathBuf> {
    let mut out = vec![
        repo().join("README.md"),
        repo().join("docs/architecture.md"),
    ];
    markdown_files(&repo().join("docs/src"), &mut out);
    out
}

/// A document's text as mdBook renders it: `{{#include FILE}}` (a whole file, relative to the
/// including chapter) replaced by that file's text. Other forms of include are not used here,
/// and a test that meets one fails rather than check the wrong text.
fn expanded(path: &Path) -> String {
    let text = read(path);
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        match line.trim().strip_prefix("{{#") {
            Some(directive) => {
                let target = directive
                    .strip_prefix("include ")
                    .and_then(|d| d.strip_suffix("}}"))
                    .map(str::trim)
                    .unwrap_or_else(|| {
                        panic!("{}: unsupported mdBook directive {line:?}", rel(path))
                    });
                assert!(
                    !target.contains(':'),
                    "{}: only whole-file includes are checked, not {target:?}",
                    rel(path)
                );
                let dir = path.parent().expect("a file has a directory");
                out.push_str(&read(&dir.join(target)));
            }
            None => out.push_str(line),
        }
    }
    out
}

fn parser(text: &str) -> Parser<'_> {
    // The options mdBook 0.5 parses chapters with (mdbook-markdown's defaults).
    let mut opts = Options::empty();
    for o in [
        Options::ENABLE_TABLES,
        Options::ENABLE_FOOTNOTES,
        Options::ENABLE_STRIKETHROUGH,
        Options::ENABLE_TASKLISTS,
        Options::ENABLE_HEADING_ATTRIBUTES,
        Options::ENABLE_SMART_PUNCTUATION,
        Options::ENABLE_DEFINITION_LIST,
        Options::ENABLE_GFM,
    ] {
        opts.insert(o);
    }
    Parser::new_ext(text, opts)
}

/// The id mdBook gives a heading with this text (mdbook-html's `id_from_content`): lower-cased,
/// letters, digits, `_` and `-` kept, whitespace made `-`, everything else dropped.
fn heading_id(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c)
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// What one document offers and asks for: its headings' ids (a repeated id gets `-1`, `-2`…, as
/// mdBook numbers them) and its links' destinations.
#[derive(Debug, Default)]
struct Parsed {
    anchors: BTreeSet<String>,
    links: Vec<String>,
    /// Top-level (`#`) headings, for the one-title-per-chapter check.
    titles: Vec<String>,
}

fn parse(text: &str) -> Parsed {
    let mut parsed = Parsed::default();
    let mut used = HashSet::new();
    // The heading being read: its level, its explicit `{#id}` if any, its text so far.
    let mut heading: Option<(HeadingLevel, Option<String>, String)> = None;
    for event in parser(text) {
        match event {
            Event::Start(Tag::Heading { level, id, .. }) => {
                heading = Some((level, id.map(|i| i.to_string()), String::new()));
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some((_, _, s)) = heading.as_mut() {
                    s.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some((level, explicit, s)) = heading.take() {
                    let base = explicit.unwrap_or_else(|| heading_id(&s));
                    let mut id = base.clone();
                    let mut n = 0;
                    while !used.insert(id.clone()) {
                        n += 1;
                        id = format!("{base}-{n}");
                    }
                    parsed.anchors.insert(id);
                    if level == HeadingLevel::H1 {
                        parsed.titles.push(s);
                    }
                }
            }
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => {
                parsed.links.push(dest_url.to_string());
            }
            _ => {}
        }
    }
    parsed
}

/// `path` with `.` and `..` taken out, without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Whether a link leaves the repository (a URL with a scheme, or a mail address).
fn external(dest: &str) -> bool {
    let scheme = dest.split_once(':').map(|(s, _)| s);
    scheme.is_some_and(|s| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    })
}

/// Every problem with the links of the documents: a target that does not exist, an anchor its
/// target does not have, an absolute path.
fn link_problems(docs: &[PathBuf]) -> Vec<String> {
    let mut parsed: BTreeMap<PathBuf, Parsed> = BTreeMap::new();
    for doc in docs {
        parsed.insert(normalise(doc), parse(&expanded(doc)));
    }
    let mut problems = Vec::new();
    for doc in docs {
        let here = &parsed[&normalise(doc)];
        for dest in &here.links {
            if external(dest) {
                continue;
            }
            let (path_part, anchor) = match dest.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (dest.as_str(), None),
            };
            if path_part.starts_with('/') {
                problems.push(format!(
                    "{}: link {dest:?} is absolute; write it relative to the file",
                    rel(doc)
                ));
                continue;
            }
            let target = if path_part.is_empty() {
                normalise(doc)
            } else {
                let dir = doc.parent().expect("a file has a directory");
                normalise(&dir.join(path_part))
            };
            if !target.exists() {
                problems.push(format!(
                    "{}: link {dest:?}: {} does not exist",
                    rel(doc),
                    rel(&target)
                ));
                continue;
            }
            let Some(anchor) = anchor.filter(|a| !a.is_empty()) else {
                continue;
            };
            let anchors = match parsed.get(&target) {
                Some(p) => p.anchors.clone(),
                None if target.extension().is_some_and(|x| x == "md") => {
                    parse(&expanded(&target)).anchors
                }
                None => {
                    problems.push(format!(
                        "{}: link {dest:?}: an anchor into {}, which has no headings",
                        rel(doc),
                        rel(&target)
                    ));
                    continue;
                }
            };
            if !anchors.contains(anchor) {
                let close: Vec<&String> = anchors
                    .iter()
                    .filter(|a| {
                        let stem = anchor.split('-').next().unwrap_or_default();
                        a.starts_with(stem)
                    })
                    .take(5)
                    .collect();
                problems.push(format!(
                    "{}: link {dest:?}: {} has no heading with id {anchor:?} (ids starting alike: {close:?})",
                    rel(doc),
                    rel(&target)
                ));
            }
        }
    }
    problems
}

#[test]
fn every_internal_link_and_anchor_in_the_readme_and_the_book_resolves() {
    let docs = documents();
    assert!(docs.len() > 20, "found only {docs:?}");
    let links: usize = docs.iter().map(|d| parse(&expanded(d)).links.len()).sum();
    assert!(
        links > 50,
        "found only {links} links in {} documents",
        docs.len()
    );
    let problems = link_problems(&docs);
    assert!(
        problems.is_empty(),
        "broken links in the README or the book:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_link_check_finds_a_missing_file_a_missing_anchor_and_an_absolute_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::create_dir(d.join("sub")).expect("mkdir");
    std::fs::write(
        d.join("sub/b.md"),
        "# Title\n\n## The state store (`--state`) and several replicas\n\n## Twice\n\n## Twice\n\n```\n## not a heading\n```\n",
    )
    .expect("write");
    let a = d.join("a.md");
    std::fs::write(
        &a,
        "# A\n\n[ok](sub/b.md) [ok](sub/b.md#the-state-store---state-and-several-replicas) \
         [ok](sub/b.md#twice-1) [ok](#a) [ok](https://example.com/x#y) [ok](sub/)\n\
         [gone](sub/c.md) [no anchor](sub/b.md#twice-2) [fenced](sub/b.md#not-a-heading) \
         [abs](/etc/hosts) [self](#b)\n\n`[code](nowhere.md)`\n",
    )
    .expect("write");
    let problems = link_problems(&[a]);
    let expect = [
        "\"sub/c.md\"",
        "\"sub/b.md#twice-2\"",
        "\"sub/b.md#not-a-heading\"",
        "\"/etc/hosts\"",
        "\"#b\"",
    ];
    assert_eq!(problems.len(), expect.len(), "{problems:#?}");
    for (problem, link) in problems.iter().zip(expect) {
        assert!(problem.contains(link), "{problem} (expected {link})");
    }
}

#[test]
fn heading_ids_are_the_ones_mdbook_gives() {
    // mdbook-html's own examples, and the shapes this book uses.
    for (heading, id) in [
        (
            "`--passes`: add more rustdoc passes",
            "--passes-add-more-rustdoc-passes",
        ),
        ("Über", "über"),
        (
            "The diff is the review: `latchkey diff`",
            "the-diff-is-the-review-latchkey-diff",
        ),
        ("Approvals: ask a person", "approvals-ask-a-person"),
        (
            "tproxy (`serve --transparent ADDR --transparent-tproxy`)",
            "tproxy-serve---transparent-addr---transparent-tproxy",
        ),
    ] {
        let parsed = parse(&format!("## {heading}\n"));
        assert!(
            parsed.anchors.contains(id),
            "{heading:?}: {:?}, expected {id:?}",
            parsed.anchors
        );
    }
}

#[test]
fn the_summary_lists_every_chapter_and_each_chapter_has_one_title() {
    let src = repo().join("docs/src");
    let summary = parse(&read(&src.join("SUMMARY.md")));
    let listed: BTreeSet<PathBuf> = summary
        .links
        .iter()
        .map(|l| normalise(&src.join(l.split('#').next().unwrap_or_default())))
        .collect();
    let mut chapters = Vec::new();
    markdown_files(&src, &mut chapters);
    let mut problems = Vec::new();
    for chapter in chapters {
        if chapter.ends_with("SUMMARY.md") {
            continue;
        }
        if !listed.contains(&normalise(&chapter)) {
            problems.push(format!(
                "{} is not in docs/src/SUMMARY.md: mdBook would leave it out",
                rel(&chapter)
            ));
        }
        let titles = parse(&expanded(&chapter)).titles;
        if titles.len() != 1 {
            problems.push(format!(
                "{} has {} top-level headings {titles:?}: a chapter has one title, its sections `##`",
                rel(&chapter),
                titles.len()
            ));
        }
    }
    assert!(listed.len() > 15, "SUMMARY.md lists only {listed:?}");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The README is the front page; the manual is the book.
const README_MAX_LINES: usize = 300;

#[test]
fn the_readme_is_a_short_front_page_that_links_the_book() {
    let readme = read(&repo().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; keep it under {README_MAX_LINES} and move the detail into a \
         chapter of the book (docs/src/)"
    );
    let links = parse(&readme).links;
    assert!(
        links.iter().any(|l| l == "docs/src/SUMMARY.md"),
        "README.md does not link the book's table of contents"
    );
    let first = readme
        .lines()
        .skip_while(|l| !l.starts_with("```sh"))
        .nth(1)
        .unwrap_or_default();
    assert!(
        first.starts_with("cargo run --locked -- demo"),
        "README.md's first command is {first:?}: a newcomer's first command runs the demo"
    );
}

/// The metric names `crates/metrics/src/lib.rs` registers (string literals `"latchkey_…"` in its code,
/// not its tests). A counter is exposed with `_total` after its name.
fn registered_metrics() -> BTreeSet<String> {
    let source = read(&repo().join("crates/metrics/src/lib.rs"));
    let code = source.split("#[cfg(test)]").next().unwrap_or_default();
    code.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.starts_with("latchkey_")
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn the_metrics_reference_lists_exactly_the_metrics_the_code_registers() {
    let path = repo().join("docs/src/reference/metrics.md");
    let doc = read(&path);
    let registered = registered_metrics();
    assert!(registered.len() > 15, "found only {registered:?}");
    // Table rows: | `name` | type | labels | meaning |
    let mut documented = BTreeSet::new();
    let mut problems = Vec::new();
    for row in doc.lines().filter(|l| l.starts_with("| `latchkey_")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`');
        let kind = cells.get(2).copied().unwrap_or_default();
        let base = match kind {
            "counter" => match name.strip_suffix("_total") {
                Some(b) => b,
                None => {
                    problems.push(format!("{name}: a counter is exposed as {name}_total"));
                    continue;
                }
            },
            "gauge" | "histogram" => name,
            other => {
                problems.push(format!("{name}: unknown type {other:?}"));
                continue;
            }
        };
        if !registered.contains(base) {
            problems.push(format!(
                "{name}: crates/metrics/src/lib.rs registers no {base}"
            ));
        }
        documented.insert(base.to_string());
    }
    for name in registered.difference(&documented) {
        problems.push(format!(
            "{name}: registered in crates/metrics/src/lib.rs, not in the table"
        ));
    }
    assert!(
        problems.is_empty(),
        "{} does not match crates/metrics/src/lib.rs:\n{}",
        rel(&path),
        problems.join("\n")
    );
}

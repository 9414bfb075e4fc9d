//! `latchkey diff OLD NEW` and `latchkey diff --git REV1..REV2`: what a policy change means, as
//! [`crate::review::diff`] computes it, printed as text, markdown (a change request comment) or
//! JSON. Exit 0 when nothing widened, 3 when the change widens reach, 1 when a side does not load.

use std::path::{Component, Path, PathBuf};
use std::process::{Command, ExitCode};

use crate::policy::{LoadError, Policy, PolicySources, SecretLoading};
use crate::review::diff::{diff, Decided, Diff, Direction};

/// `latchkey diff` flags.
#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The policy directory before the change (not with --git).
    #[arg(required_unless_present = "git", conflicts_with = "git")]
    pub old: Option<PathBuf>,
    /// The policy directory after the change (not with --git).
    #[arg(required_unless_present = "git", conflicts_with = "git")]
    pub new: Option<PathBuf>,
    /// Compare two revisions of the policy repository this runs in: `REV1..REV2`, or `REV`
    /// alone for REV against the working tree (`--git main`: what this branch changes).
    #[arg(long, env = "LATCHKEY_DIFF_GIT", value_name = "REV1..REV2")]
    pub git: Option<String>,
    /// With --git: the policy directory inside the repository, relative to the current
    /// directory.
    #[arg(long, env = "LATCHKEY_POLICIES", default_value = "policies")]
    pub policies: PathBuf,
    /// `text`, `markdown` (for a change request comment) or `json`.
    #[arg(long, env = "LATCHKEY_DIFF_FORMAT", value_enum, default_value = "text")]
    pub format: DiffFormat,
}

/// How `diff` prints the reach delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DiffFormat {
    Text,
    Markdown,
    Json,
}

/// Runs `latchkey diff`.
pub fn run(args: &DiffArgs) -> anyhow::Result<ExitCode> {
    let sides = match (&args.git, &args.old, &args.new) {
        (Some(revs), _, _) => git_sides(revs, &args.policies),
        (None, Some(old), Some(new)) => Ok((
            load_dir(old, &old.display().to_string()),
            load_dir(new, &new.display().to_string()),
        )),
        // clap requires OLD and NEW without --git.
        _ => anyhow::bail!("diff needs OLD and NEW directories, or --git REV1..REV2"),
    };
    let (old, new) = sides?;
    let (old, new) = match (old, new) {
        (Ok(o), Ok(n)) => (o, n),
        (o, n) => {
            for side in [o.err(), n.err()].into_iter().flatten() {
                eprintln!("{side}");
            }
            return Ok(ExitCode::from(1));
        }
    };
    let d = diff((&old.1, &old.0), (&new.1, &new.0));
    let text = match args.format {
        DiffFormat::Json => serde_json::to_string_pretty(&d)?,
        DiffFormat::Text => text(&d),
        DiffFormat::Markdown => markdown(&d),
    };
    println!("{text}");
    Ok(if d.widened {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

/// A loaded side: its source as printed, and the policy.
type Loaded = (String, Policy);

/// Loads a directory for evaluation (no secret value read); the error is the whole report.
fn load_dir(dir: &Path, source: &str) -> Result<Loaded, String> {
    loaded(source, PolicySources::read_dir(dir))
}

fn loaded(source: &str, sources: Result<PolicySources, LoadError>) -> Result<Loaded, String> {
    sources
        .and_then(|s| s.compile(SecretLoading::Skip))
        .map(|p| (source.to_string(), p))
        .map_err(|e| match e {
            LoadError::Invalid(problems) => {
                let mut out: Vec<String> = problems.iter().map(ToString::to_string).collect();
                out.push(format!(
                    "latchkey: error: {} problem(s) in policy {source}",
                    problems.len()
                ));
                out.join("\n")
            }
            other => format!("latchkey: error: policy {source}: {other}"),
        })
}

/// Both sides of `--git REV1..REV2` (or `REV`: REV against the working tree).
fn git_sides(
    revs: &str,
    policies: &Path,
) -> anyhow::Result<(Result<Loaded, String>, Result<Loaded, String>)> {
    let (old, new) = match revs.split_once("..") {
        Some((a, b)) => (a, Some(b)),
        None => (revs, None),
    };
    for rev in [Some(old), new].into_iter().flatten() {
        if rev.is_empty() || rev.starts_with('-') || rev.contains("..") || rev.contains(':') {
            anyhow::bail!(
                "--git {revs:?}: give REV1..REV2 or REV: revisions that do not start with '-' and hold no ':' (the directory is --policies)"
            );
        }
    }
    let top = git(&["rev-parse", "--show-toplevel"])?;
    let top = PathBuf::from(String::from_utf8_lossy(&top).trim_end_matches('\n'));
    let cwd = std::env::current_dir()?;
    let dir = in_repo(&top, &cwd, policies).ok_or_else(|| {
        anyhow::anyhow!(
            "--policies {}: not inside the git repository at {}",
            policies.display(),
            top.display()
        )
    })?;
    let old = read_rev(old, &dir)?;
    let new = match new {
        Some(rev) => read_rev(rev, &dir)?,
        None => load_dir(policies, &policies.display().to_string()),
    };
    Ok((old, new))
}

/// `policies` (relative to `cwd`) as a path inside the repository at `top`, `/`-separated.
fn in_repo(top: &Path, cwd: &Path, policies: &Path) -> Option<String> {
    let top = top.canonicalize().ok()?;
    let cwd = cwd.canonicalize().ok()?;
    let mut parts: Vec<String> = Vec::new();
    for c in cwd.join(policies).components() {
        match c {
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    let full = PathBuf::from("/").join(parts.join("/"));
    let rel = full.strip_prefix(&top).ok()?;
    Some(
        rel.components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/"),
    )
}

/// The policy files of directory `dir` at revision `rev`, named `REV:dir/file.toml`.
fn read_rev(rev: &str, dir: &str) -> anyhow::Result<Result<Loaded, String>> {
    let source = format!("{rev}:{dir}");
    // `REV:dir` names the tree; a missing directory is a clear error from git.
    let listing = git(&["ls-tree", "-z", "--full-tree", &source])?;
    let mut files = Vec::new();
    for entry in listing.split(|&b| b == 0).filter(|e| !e.is_empty()) {
        let entry = String::from_utf8_lossy(entry);
        let Some((meta, name)) = entry.split_once('\t') else {
            continue;
        };
        let mut meta = meta.split(' ');
        let (mode, kind, object) = (meta.next(), meta.next(), meta.next());
        if kind != Some("blob") || !name.ends_with(".toml") {
            continue;
        }
        // A link's blob is its target's name, not a policy: the working tree would follow it,
        // so reading it here as text would compare something else. Say so instead.
        if mode == Some("120000") {
            anyhow::bail!(
                "{source}/{name} is a symbolic link: diff --git reads policy files, not links"
            );
        }
        let Some(object) = object else { continue };
        let bytes = git(&["cat-file", "blob", object])?;
        let text =
            String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{source}/{name}: not UTF-8"))?;
        let path = if dir.is_empty() {
            format!("{rev}:{name}")
        } else {
            format!("{rev}:{dir}/{name}")
        };
        files.push((PathBuf::from(path), text));
    }
    Ok(loaded(
        &source,
        PolicySources::from_files(Path::new(&source), files),
    ))
}

/// Runs git in the current directory; its stderr is the error.
fn git(args: &[&str]) -> anyhow::Result<Vec<u8>> {
    let out = Command::new("git")
        .args(args)
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run git: {e}"))?;
    if !out.status.success() {
        anyhow::bail!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// The first 8 hex digits of a `sha256:` digest.
fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    hex.get(..8).unwrap_or(hex)
}

fn mark(d: Direction) -> &'static str {
    match d {
        Direction::Widened => "+",
        Direction::Narrowed => "-",
    }
}

/// `deny (method_not_allowed, rule github-read)`.
fn decided(d: &Decided) -> String {
    let mut s = format!("{} ({}", d.decision.as_str(), d.reason);
    if let Some(r) = &d.rule {
        s.push_str(&format!(", rule {r}"));
    }
    if d.report_only {
        s.push_str(", report-only: goes through");
    }
    s.push(')');
    s
}

/// The text report (see the book's "latchkey diff", docs/src/security-teams.md).
pub fn text(d: &Diff) -> String {
    let mut out = format!(
        "latchkey diff: {} (sha256:{}) -> {} (sha256:{})\n",
        d.old.source,
        short(&d.old.policy),
        d.new.source,
        short(&d.new.policy)
    );
    for id in &d.identities {
        out.push_str(&format!(
            "\nidentity {} ({})\n",
            id.identity,
            id.status.as_str()
        ));
        for c in &id.changes {
            out.push_str(&format!("  {} {}", mark(c.direction), c.summary));
            if let (Some(rule), Some(origin)) = (&c.rule, &c.origin) {
                out.push_str(&format!(" (rule {rule}, {origin})"));
            }
            out.push('\n');
            if let Some(e) = &c.example {
                out.push_str(&format!(
                    "      e.g. {} {} — old: {}; new: {}\n",
                    e.method,
                    e.url,
                    decided(&e.old),
                    decided(&e.new)
                ));
            }
        }
    }
    out.push_str(&d.verdict());
    out
}

/// Text from a policy, safe in a markdown table cell: markdown punctuation backslash-escaped
/// (`\|` keeps a table cell whole), `<`, `>` and `&` as entities so no HTML gets through, line
/// breaks as spaces.
fn md(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            // Links need `[`; a cell never starts a line, so `#`, `>`-quotes and lists cannot.
            '\\' | '`' | '*' | '_' | '[' | ']' | '|' | '~' => {
                out.push('\\');
                out.push(c);
            }
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\n' | '\r' => out.push(' '),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// The markdown report, for a change request comment.
pub fn markdown(d: &Diff) -> String {
    let mut out = format!("### latchkey policy diff: {}\n\n", d.verdict());
    out.push_str(&format!(
        "{} (`sha256:{}`) → {} (`sha256:{}`)\n",
        md(&d.old.source),
        short(&d.old.policy),
        md(&d.new.source),
        short(&d.new.policy)
    ));
    for id in &d.identities {
        out.push_str(&format!(
            "\n#### identity {} ({})\n\n| | change | example | rule |\n|---|---|---|---|\n",
            md(&id.identity),
            id.status.as_str()
        ));
        for c in &id.changes {
            let sign = match c.direction {
                Direction::Widened => "⚠️ widened",
                Direction::Narrowed => "narrowed",
            };
            let example = c.example.as_ref().map_or(String::new(), |e| {
                format!(
                    "{} {}<br>old: {}; new: {}",
                    md(&e.method),
                    md(&e.url),
                    md(&decided(&e.old)),
                    md(&decided(&e.new))
                )
            });
            let rule = match (&c.rule, &c.origin) {
                (Some(r), Some(o)) => format!("{} ({})", md(r), md(o)),
                (Some(r), None) => md(r),
                _ => String::new(),
            };
            out.push_str(&format!(
                "| {sign} | {} | {example} | {rule} |\n",
                md(&c.summary)
            ));
        }
    }
    out
}

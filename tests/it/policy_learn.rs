//! `latchkey learn`: traffic recorded by real clients (curl, Python requests) through a real
//! `latchkey serve --mode report` becomes rules that cover exactly what was seen — ids
//! generalised, writes flagged, ports written, no secret — plus a case file pinning each rule,
//! and the identities that made the traffic are granted the new rules in their own file with
//! its comments kept. The result passes `check` and `test`; every request seen is allowed and
//! its neighbours (another method, a sibling path, another port) are denied. Flags: --min-count,
//! --identity, --since, --dry-run, --force, --out/--tests.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::support::{
    curl, latchkey, python_request, run_cli, CliOutput, TestCa, Upstream, PINNED,
};

const SECRET: &str = "sk-learn-5e8d2a7c1b9f4036";
const TOKEN_CI: &str = "tok-learn-ci-3c9e1a7f5d2b8064";
const TOKEN_LAB: &str = "tok-learn-lab-8a2f6c0e4d1b9753";

/// `status` (GET /v1/status, with a secret) for `ci`, and the identities: `ci` may use
/// `status` only, `lab` every rule.
fn rules(port: u16) -> String {
    format!(
        r#"
[secrets.k]
source = "env:LK_SECRET_K"

[[rules]]
name    = "status"
hosts   = ["api.test"]
ports   = [{port}]
methods = ["GET"]
paths   = ["/v1/status"]
[rules.inject.headers]
x-key = "{{{{secret.k}}}}"
"#
    )
}

const IDENTITIES: &str = r#"# Who the sandboxes are. Keep this comment.
[identities.ci]
token = "env:LK_TOKEN_CI"
rules = [
  "status", # the health check
]

[identities.lab]
token = "env:LK_TOKEN_LAB"
rules = ["*"]
"#;

/// A log recorded once for every test here: the upstream's port, the log, and the policy.
struct Recorded {
    port: u16,
    audit: PathBuf,
    _dir: tempfile::TempDir,
}

fn recorded() -> &'static Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED.get_or_init(record)
}

fn record() -> Recorded {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let dir = tempfile::tempdir().expect("dir");
    let audit = dir.path().join("audit.jsonl");
    let mut builder = latchkey()
        .upstream_ca(&ca)
        .env("LK_SECRET_K", SECRET)
        .env("LK_TOKEN_CI", TOKEN_CI)
        .env("LK_TOKEN_LAB", TOKEN_LAB)
        .audit_to(&audit)
        .arg("--mode")
        .arg("report")
        .policy("main.toml", &rules(port))
        .policy("identities.toml", IDENTITIES);
    for host in PINNED {
        builder = builder.pin(host);
    }
    let lk = builder.run();
    let url = |host: &str, path: &str| format!("https://{host}:{port}{path}");
    let ci = format!("ci:{TOKEN_CI}");
    let lab = format!("lab:{TOKEN_LAB}");
    let get = |user: &str, u: String| {
        let out = curl(&lk).args(["--proxy-user", user, &u]).run();
        assert_eq!(out.ok().status, 200, "{out:#?}");
    };
    // ci: the status check (already allowed), items by id, one write, files at varying depth.
    get(&ci, url("api.test", "/v1/status"));
    for id in ["17", "4242", "901"] {
        get(&ci, url("api.test", &format!("/v1/items/{id}")));
    }
    let out = curl(&lk)
        .args([
            "--proxy-user",
            &ci,
            "-X",
            "DELETE",
            &url("api.test", "/v1/items/17"),
        ])
        .run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    for f in [
        "/raw/a.txt",
        "/raw/docs/b.md",
        "/raw/docs/deep/c.md",
        "/raw/d.rs",
        "/raw/src/e.rs",
        "/raw/src/x/f.rs",
        "/raw/g.toml",
        "/raw/h/i/j/k.txt",
    ] {
        get(&ci, url("tunnel.test", f));
    }
    // A request refused for a reason no rule changes (a secret value sent where it is not
    // bound): never learned.
    let out = curl(&lk)
        .args([
            "--proxy-user",
            &lab,
            "-H",
            &format!("x-leak: {SECRET}"),
            &url("other.test", "/leak"),
        ])
        .run();
    assert_eq!(out.ok().status, 403, "{out:#?}");
    // lab (every rule): a read seen once.
    get(&lab, url("other.test", "/reports/2026-05-01"));
    drop(lk);
    Recorded {
        port,
        audit,
        _dir: dir,
    }
}

/// A fresh copy of the policy the log was recorded under.
fn policies(port: u16) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("policies");
    std::fs::write(dir.path().join("main.toml"), rules(port)).expect("write");
    std::fs::write(dir.path().join("identities.toml"), IDENTITIES).expect("write");
    std::fs::create_dir_all(dir.path().join("tests")).expect("mkdir");
    std::fs::write(
        dir.path().join("tests/status.toml"),
        format!(
            r#"[[cases]]
identity = "ci"
method   = "GET"
url      = "https://api.test:{port}/v1/status"
expect   = "allow"
rule     = "status"
"#
        ),
    )
    .expect("write");
    dir
}

fn learn(audit: &Path, dir: &Path, extra: &[&str]) -> CliOutput {
    let mut args: Vec<std::ffi::OsString> = vec![
        "learn".into(),
        audit.into(),
        "--policies".into(),
        dir.into(),
    ];
    args.extend(extra.iter().map(Into::into));
    run_cli(args)
}

fn explain(dir: &Path, identity: &str, method: &str, url: &str) -> CliOutput {
    run_cli([
        "explain",
        "--policies",
        &dir.display().to_string(),
        "--identity",
        identity,
        method,
        url,
    ])
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn learned_rules_cover_what_was_seen_and_nothing_next_to_it() {
    let rec = recorded();
    let port = rec.port;
    let dir = policies(port);
    let out = learn(&rec.audit, dir.path(), &[]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let learned = read(dir.path().join("learned.toml"));
    let cases = read(dir.path().join("tests/learned.toml"));
    let idents = read(dir.path().join("identities.toml"));
    for text in [&learned, &cases, &idents, &out.stdout, &out.stderr] {
        assert!(!text.contains(SECRET), "the secret value leaked: {text}");
        assert!(
            !text.contains(TOKEN_CI) && !text.contains(TOKEN_LAB),
            "{text}"
        );
    }
    assert!(
        !learned.contains("secret") && !learned.contains("inject"),
        "{learned}"
    );

    // What was proposed: ids → `*`, the file tree → `/raw/**`, the write apart and flagged,
    // ports written, the status check not learned again, the leak never.
    for line in [
        "paths   = [\"/v1/items/*\"]",
        "methods = [\"DELETE\", \"GET\"]",
        "paths   = [\"/raw/**\"]",
        "paths   = [\"/reports/*\"]",
        "# REVIEW: allows writes (DELETE): confirm the agent must do this",
        &format!("ports   = [{port}]"),
        "name    = \"learned-api-test-ci\"",
        "name    = \"learned-other-test-lab\"",
        "#   e.g. GET /v1/items/17\n",
        "#   e.g. GET /v1/items/4242\n",
        "# 4 requests seen, first 20",
    ] {
        assert!(learned.contains(line), "{line:?} missing:\n{learned}");
    }
    assert!(
        !learned.contains("/v1/status") && !learned.contains("/leak"),
        "{learned}"
    );
    assert!(
        out.stderr
            .contains("REVIEW: rule learned-api-test-ci allows writes (DELETE) on api.test"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("1 already allowed"), "{}", out.stderr);

    // ci is granted its new rules in its own file, comments kept; lab has every rule already.
    assert!(
        idents.starts_with("# Who the sandboxes are. Keep this comment.\n"),
        "{idents}"
    );
    assert!(
        idents.contains("\"status\", # the health check"),
        "{idents}"
    );
    for name in ["learned-api-test-ci", "learned-tunnel-test-ci"] {
        assert!(idents.contains(&format!("\"{name}\"")), "{name}: {idents}");
    }
    assert!(idents.contains("rules = [\"*\"]"), "{idents}");

    // The result passes check and test (the cases pin allow and deny).
    let d = dir.path().display().to_string();
    let check = run_cli(["check", "--no-secrets", "--policies", &d]);
    assert_eq!(check.code(), Some(0), "{check:#?}");
    let test = run_cli(["test", "--policies", &d]);
    assert_eq!(test.code(), Some(0), "{test:#?}");
    assert!(cases.contains("expect   = \"deny\""), "{cases}");
    assert!(cases.contains("identity = \"ci\""), "{cases}");

    // Every request seen is allowed; what is next to it is not.
    let u = |host: &str, path: &str| format!("https://{host}:{port}{path}");
    for (who, method, url) in [
        ("ci", "GET", u("api.test", "/v1/items/555")),
        ("ci", "DELETE", u("api.test", "/v1/items/17")),
        ("ci", "GET", u("tunnel.test", "/raw/h/i/j/k.txt")),
        ("ci", "GET", u("tunnel.test", "/raw/a.txt")),
        ("lab", "GET", u("other.test", "/reports/2026-05-02")),
    ] {
        let e = explain(dir.path(), who, method, &url);
        assert_eq!(
            e.code(),
            Some(0),
            "{who} {method} {url} should be allowed: {e:#?}"
        );
    }
    for (who, method, url) in [
        ("ci", "POST", u("api.test", "/v1/items/555")),
        ("ci", "GET", u("api.test", "/v1/orders/555")),
        ("ci", "GET", u("api.test", "/v1/items/555/secrets")),
        (
            "ci",
            "GET",
            format!("https://api.test:{}/v1/items/555", port + 1),
        ),
        ("ci", "DELETE", u("api.test", "/v1/status")),
        ("ci", "GET", u("tunnel.test", "/raw")),
        ("ci", "GET", u("tunnel.test", "/other/a.txt")),
        ("ci", "GET", u("other.test", "/reports/2026-05-02")),
        ("lab", "GET", u("other.test", "/reports/2026-05-02/x")),
    ] {
        let e = explain(dir.path(), who, method, &url);
        assert_eq!(
            e.code(),
            Some(1),
            "{who} {method} {url} should be denied: {e:#?}"
        );
    }

    // Run again: the files exist, so nothing is written without --force; with it they are
    // replaced under the same names, and the identity's list is not doubled.
    let again = learn(&rec.audit, dir.path(), &[]);
    assert_eq!(again.code(), Some(1), "{again:#?}");
    assert!(
        again
            .stderr
            .contains("learned.toml exists: pass --force to replace it"),
        "{}",
        again.stderr
    );
    let forced = learn(&rec.audit, dir.path(), &["--force"]);
    assert_eq!(forced.code(), Some(0), "{forced:#?}");
    assert_eq!(read(dir.path().join("identities.toml")), idents);
    let relearned = read(dir.path().join("learned.toml"));
    assert_eq!(strip_dates(&relearned), strip_dates(&learned));
    let test = run_cli(["test", "--policies", &d]);
    assert_eq!(test.code(), Some(0), "{test:#?}");
}

/// The text without its times (the header says when it was written).
fn strip_dates(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with("# From ") && !l.contains(" seen, first "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn filters_dry_run_and_errors() {
    let rec = recorded();
    let dir = policies(rec.port);
    let files = |d: &Path| {
        let mut names: Vec<String> = walk(d);
        names.sort();
        names
    };
    let before = files(dir.path());

    // --dry-run prints both files (and the identity edit) and writes nothing.
    let dry = learn(&rec.audit, dir.path(), &["--dry-run"]);
    assert_eq!(dry.code(), Some(0), "{dry:#?}");
    for sep in [
        "learned.toml\n",
        "tests/learned.toml\n",
        "identities.toml\n",
    ] {
        assert!(
            dry.stdout
                .lines()
                .any(|l| l.starts_with("# ---- ") && format!("{l}\n").ends_with(sep)),
            "{sep}: {}",
            dry.stdout
        );
    }
    assert!(dry.stdout.contains("[[rules]]") && dry.stdout.contains("[[cases]]"));
    assert_eq!(files(dir.path()), before, "--dry-run wrote a file");
    assert_eq!(read(dir.path().join("identities.toml")), IDENTITIES);

    // --identity: only lab's traffic; --min-count 2: lab's one read is not proposed, and said.
    let only_lab = learn(&rec.audit, dir.path(), &["--dry-run", "--identity", "lab"]);
    assert_eq!(only_lab.code(), Some(0), "{only_lab:#?}");
    assert!(
        only_lab.stdout.contains("learned-other-test-lab"),
        "{}",
        only_lab.stdout
    );
    assert!(!only_lab.stdout.contains("api.test"), "{}", only_lab.stdout);
    let rare = learn(&rec.audit, dir.path(), &["--dry-run", "--min-count", "2"]);
    assert_eq!(rare.code(), Some(0), "{rare:#?}");
    assert!(!rare.stdout.contains("other.test"), "{}", rare.stdout);
    assert!(rare.stdout.contains("/v1/items/*"), "{}", rare.stdout);
    assert!(
        rare.stderr
            .contains("not proposed (seen 1 < --min-count 2): GET other.test:")
            && rare.stderr.contains("/reports/* (identity lab)"),
        "{}",
        rare.stderr
    );
    // The DELETE was seen once too: the items rule keeps GET only.
    assert!(
        !rare.stdout.contains("\"DELETE\", \"GET\""),
        "{}",
        rare.stdout
    );
    assert!(rare.stderr.contains("DELETE api.test:"), "{}", rare.stderr);

    // --since after the traffic: nothing to learn, nothing written, exit 0.
    let later = learn(&rec.audit, dir.path(), &["--since", "2099-01-01T00:00:00Z"]);
    assert_eq!(later.code(), Some(0), "{later:#?}");
    assert!(
        later.stdout.contains("nothing to learn"),
        "{}",
        later.stdout
    );
    assert_eq!(files(dir.path()), before);

    // --out/--tests elsewhere; an identity the policy does not define; a policy that does not
    // load; an audit file that does not exist.
    let elsewhere = tempfile::tempdir().expect("dir");
    let out = elsewhere.path().join("proposed.toml");
    let tests = elsewhere.path().join("proposed-cases.toml");
    let o = learn(
        &rec.audit,
        dir.path(),
        &[
            "--out",
            &out.display().to_string(),
            "--tests",
            &tests.display().to_string(),
            "--identity",
            "lab",
        ],
    );
    assert_eq!(o.code(), Some(0), "{o:#?}");
    assert!(read(out).contains("learned-other-test-lab"));
    assert!(read(tests).contains("[[cases]]"));
    // A file a person wrote is never replaced, --force or not.
    let main = dir.path().join("main.toml").display().to_string();
    let mine = learn(&rec.audit, dir.path(), &["--out", &main, "--force"]);
    assert_eq!(mine.code(), Some(1), "{mine:#?}");
    assert!(
        mine.stderr
            .contains("is not a file latchkey learn wrote: refusing to replace it"),
        "{}",
        mine.stderr
    );
    assert_eq!(read(dir.path().join("main.toml")), rules(rec.port));
    let unknown = learn(&rec.audit, dir.path(), &["--identity", "nobody"]);
    assert_eq!(unknown.code(), Some(1), "{unknown:#?}");
    assert!(
        unknown.stderr.contains("--identity \"nobody\"") && unknown.stderr.contains("ci, lab"),
        "{}",
        unknown.stderr
    );
    let broken = tempfile::tempdir().expect("dir");
    std::fs::write(
        broken.path().join("bad.toml"),
        "[[rules]]\nname = \"x\"\nhostz = []\n",
    )
    .expect("write");
    let b = learn(&rec.audit, broken.path(), &[]);
    assert_eq!(b.code(), Some(1), "{b:#?}");
    assert!(b.stderr.contains("bad.toml:3"), "{}", b.stderr);
    assert!(!broken.path().join("learned.toml").exists());
    let missing = learn(Path::new("/nonexistent/audit.jsonl"), dir.path(), &[]);
    assert_eq!(missing.code(), Some(1), "{missing:#?}");
    assert!(
        missing.stderr.contains("/nonexistent/audit.jsonl"),
        "{}",
        missing.stderr
    );
}

#[test]
fn a_first_policy_is_learned_into_an_empty_directory_from_python_traffic() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let scratch = tempfile::tempdir().expect("dir");
    let audit = scratch.path().join("audit.jsonl");
    let mut builder = latchkey()
        .upstream_ca(&ca)
        .audit_to(&audit)
        .arg("--mode")
        .arg("report")
        .policy(
            "main.toml",
            "[[rules]]\nname = \"unused\"\nhosts = [\"unused.test\"]\n",
        );
    for host in PINNED {
        builder = builder.pin(host);
    }
    let lk = builder.run();
    for id in ["9fceb02d", "3f2a9c1e-8b7d-4e6f-a5c4-1d2e3f4a5b6c"] {
        let url = format!("https://api.test:{port}/objects/{id}?sig=x");
        assert_eq!(python_request(&lk, "GET", &url, &[]).status, 200);
    }
    let url = format!("https://api.test:{port}/upload");
    assert_eq!(python_request(&lk, "PUT", &url, &[]).status, 200);
    drop(lk);

    let dir = scratch.path().join("new-policies");
    let out = learn(&audit, &dir, &[]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let learned = read(dir.join("learned.toml"));
    assert!(learned.contains("paths   = [\"/objects/*\"]"), "{learned}");
    assert!(learned.contains("methods = [\"PUT\"]"), "{learned}");
    assert!(
        !learned.contains("sig="),
        "the query is not a path: {learned}"
    );
    let d = dir.display().to_string();
    let test = run_cli(["test", "--policies", &d]);
    assert_eq!(test.code(), Some(0), "{test:#?}");
}

fn walk(d: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).expect("read dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

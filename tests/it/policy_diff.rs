//! `latchkey diff`: hand-built policy pairs, one per kind of widening and narrowing, each
//! asserting the exact set of (identity, direction, kind, host) changes, the exit status, and that
//! every example request is real (`latchkey explain` on both sides decides it as the diff says);
//! a no-change pair; `--git` on a real repository (two revisions, a revision against the working
//! tree, a file error named `REV:path:LINE`); a side that does not load; markdown escaping; the
//! text layout; and secret values, which never appear.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

use crate::support::latchkey::{wait_with_timeout, BIN, SCRUBBED_ENV};
use crate::support::{policy_dir, CliOutput};

/// Runs latchkey in `cwd` with no LATCHKEY_* variable of this machine, plus `env`.
fn lk<S: AsRef<OsStr>>(args: &[S], cwd: Option<&Path>, env: &[(&str, &str)]) -> CliOutput {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    for (k, _) in std::env::vars() {
        if k.starts_with("LATCHKEY_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    wait_with_timeout(&mut cmd, Duration::from_secs(30))
}

fn json_of(out: &CliOutput) -> Value {
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("diff --format json printed no JSON ({e}): {out:#?}"))
}

/// (identity, direction, kind, host).
type Key = (String, String, String, Option<String>);

fn key(identity: &str, direction: &str, kind: &str, host: Option<&str>) -> Key {
    (
        identity.to_string(),
        direction.to_string(),
        kind.to_string(),
        host.map(str::to_string),
    )
}

fn w(kind: &str, host: &str) -> Key {
    key("default", "widened", kind, Some(host))
}

fn n(kind: &str, host: &str) -> Key {
    key("default", "narrowed", kind, Some(host))
}

fn keys(v: &Value) -> BTreeSet<Key> {
    let mut out = BTreeSet::new();
    for id in v["identities"].as_array().expect("identities") {
        let name = id["identity"].as_str().expect("identity name");
        for c in id["changes"].as_array().expect("changes") {
            out.insert(key(
                name,
                c["direction"].as_str().expect("direction"),
                c["kind"].as_str().expect("kind"),
                c["host"].as_str(),
            ));
        }
    }
    out
}

/// Every change of `kind` (and `host`, when given) in the diff.
fn changes<'a>(v: &'a Value, kind: &str, host: Option<&str>) -> Vec<&'a Value> {
    v["identities"]
        .as_array()
        .expect("identities")
        .iter()
        .flat_map(|i| i["changes"].as_array().expect("changes"))
        .filter(|c| c["kind"] == kind && host.is_none_or(|h| c["host"] == h))
        .collect()
}

fn one<'a>(v: &'a Value, kind: &str, host: Option<&str>) -> &'a Value {
    let found = changes(v, kind, host);
    assert_eq!(found.len(), 1, "one {kind} change on {host:?} in {v:#}");
    found[0]
}

fn no_nulls(v: &Value, at: &str) {
    match v {
        Value::Null => panic!("null at {at}: fields that do not apply are absent"),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, x)| no_nulls(x, &format!("{at}[{i}]"))),
        Value::Object(o) => o
            .iter()
            .for_each(|(k, x)| no_nulls(x, &format!("{at}.{k}"))),
        _ => {}
    }
}

/// A policy pair, each side one `main.toml` (or several files).
struct Pair {
    old: TempDir,
    new: TempDir,
}

impl Pair {
    fn new(old: &str, new: &str) -> Pair {
        Pair::files(&[("main.toml", old)], &[("main.toml", new)])
    }

    fn files(old: &[(&str, &str)], new: &[(&str, &str)]) -> Pair {
        Pair {
            old: policy_dir(old),
            new: policy_dir(new),
        }
    }

    fn run(&self, format: &str, env: &[(&str, &str)]) -> CliOutput {
        lk(
            &[
                OsStr::new("diff"),
                self.old.path().as_os_str(),
                self.new.path().as_os_str(),
                OsStr::new("--format"),
                OsStr::new(format),
            ],
            None,
            env,
        )
    }

    /// The JSON diff, checked against the spec's invariants and every example against explain.
    fn json(&self) -> (Option<i32>, Value) {
        let out = self.run("json", &[]);
        let v = json_of(&out);
        check_shape(&v, &out);
        check_examples(&v, self.old.path(), self.new.path());
        (out.code(), v)
    }

    /// Asserts the exact change set and the exit status (0, or 3 when something widened).
    fn expect(&self, expected: &[Key]) -> Value {
        let (code, v) = self.json();
        let expected: BTreeSet<Key> = expected.iter().cloned().collect();
        assert_eq!(keys(&v), expected, "{v:#}");
        let widens = expected.iter().any(|k| k.1 == "widened");
        let narrows = expected.iter().any(|k| k.1 == "narrowed");
        assert_eq!(v["widened"], widens, "{v:#}");
        assert_eq!(v["narrowed"], narrows, "{v:#}");
        assert_eq!(code, Some(if widens { 3 } else { 0 }), "{v:#}");
        v
    }
}

/// The invariants every JSON diff keeps: sides with digests, identities sorted and non-empty,
/// no nulls, `widened`/`narrowed` agreeing with the changes, the responsible rule's origin on
/// the right side.
fn check_shape(v: &Value, out: &CliOutput) {
    no_nulls(v, "$");
    for side in ["old", "new"] {
        let digest = v[side]["policy"].as_str().unwrap_or_default();
        assert!(
            digest.len() == 71
                && digest.starts_with("sha256:")
                && digest[7..].bytes().all(|b| b.is_ascii_hexdigit()),
            "{side}.policy {digest:?}: {out:#?}"
        );
        assert!(v[side]["source"].is_string(), "{v:#}");
    }
    let ids = v["identities"].as_array().expect("identities");
    let names: Vec<&str> = ids.iter().filter_map(|i| i["identity"].as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "identities sorted by name: {v:#}");
    let mut directions = BTreeSet::new();
    for id in ids {
        let changes = id["changes"].as_array().expect("changes");
        assert!(
            !changes.is_empty(),
            "an identity without changes is not listed: {v:#}"
        );
        let status = id["status"].as_str().unwrap_or_default();
        assert!(["added", "removed", "changed"].contains(&status), "{id:#}");
        for c in changes {
            let dir = c["direction"].as_str().unwrap_or_default();
            directions.insert(dir.to_string());
            match status {
                "added" => assert_eq!(dir, "widened", "an added identity only widens: {id:#}"),
                "removed" => assert_eq!(dir, "narrowed", "a removed identity only narrows: {id:#}"),
                _ => {}
            }
            assert!(
                c["summary"].as_str().is_some_and(|s| !s.is_empty()),
                "{c:#}"
            );
            // A change's origin is the rule that holds what changed: for most kinds the side
            // that reaches more, for `ask` the side that asks (an added ask narrows).
            let more = if dir == "widened" { "new" } else { "old" };
            let side = match (c["kind"].as_str(), more) {
                (Some("ask"), "new") => "old",
                (Some("ask"), _) => "new",
                _ => more,
            };
            if let Some(origin) = c["origin"].as_str() {
                let source = v[side]["source"].as_str().unwrap_or_default();
                assert!(
                    origin.starts_with(source),
                    "the origin of a {dir} change is in {side} ({source}): {c:#}"
                );
                assert!(
                    c["rule"].is_string(),
                    "an origin comes with its rule: {c:#}"
                );
            }
        }
    }
    assert_eq!(v["widened"], directions.contains("widened"), "{v:#}");
    assert_eq!(v["narrowed"], directions.contains("narrowed"), "{v:#}");
}

/// `latchkey explain --json` on `dir` (as `identity`).
fn explain(dir: &Path, identity: &str, method: &str, url: &str) -> Value {
    let mut args: Vec<&OsStr> = vec![
        "explain".as_ref(),
        "--json".as_ref(),
        "--policies".as_ref(),
        dir.as_os_str(),
    ];
    if identity != "default" {
        args.extend([OsStr::new("--identity"), OsStr::new(identity)]);
    }
    args.extend([OsStr::new(method), OsStr::new(url)]);
    let out = lk(&args, None, &[]);
    // An identity a side does not define: the proxy refuses its token (407), as the diff says.
    if out.code() == Some(1)
        && out
            .stderr
            .contains(&format!("unknown identity \"{identity}\""))
    {
        return serde_json::json!({
            "decision": "deny", "reason": "proxy_auth_required", "rule": null,
            "report_only": false,
        });
    }
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("explain printed no JSON ({e}): {out:#?}"))
}

/// The kinds that carry an example request.
const EXAMPLE_KINDS: &[&str] = &["host", "tunnel", "port", "method", "path"];

/// Every example is decided by explain on each side exactly as the diff says, and shows the
/// change's direction (widened: new allows or asks what old denies, or allows what old asks).
fn check_examples(v: &Value, old: &Path, new: &Path) {
    for id in v["identities"].as_array().expect("identities") {
        let identity = id["identity"].as_str().expect("identity");
        for c in id["changes"].as_array().expect("changes") {
            let kind = c["kind"].as_str().unwrap_or_default();
            let Some(e) = c.get("example") else {
                assert!(
                    !EXAMPLE_KINDS.contains(&kind),
                    "a {kind} change shows an example request: {c:#}"
                );
                continue;
            };
            let method = e["method"].as_str().expect("example.method");
            let url = e["url"].as_str().expect("example.url");
            // A tunnel relays what comes; explain decides it as a GET.
            let asked = if kind == "tunnel" {
                assert_eq!(method, "CONNECT", "{c:#}");
                "GET"
            } else {
                method
            };
            for (side, dir) in [("old", old), ("new", new)] {
                let got = explain(dir, identity, asked, url);
                let want = &e[side];
                assert_eq!(
                    want["decision"], got["decision"],
                    "{side}: {c:#}\nexplain: {got:#}"
                );
                assert_eq!(
                    want["reason"], got["reason"],
                    "{side}: {c:#}\nexplain: {got:#}"
                );
                let rule = want.get("rule").cloned().unwrap_or(Value::Null);
                assert_eq!(rule, got["rule"], "{side} rule: {c:#}\nexplain: {got:#}");
                let report_only = want
                    .get("report_only")
                    .cloned()
                    .unwrap_or(Value::Bool(false));
                assert_eq!(
                    report_only, got["report_only"],
                    "{side}: {c:#}\nexplain: {got:#}"
                );
            }
            let (o, nw) = (
                e["old"]["decision"].as_str().unwrap_or_default(),
                e["new"]["decision"].as_str().unwrap_or_default(),
            );
            let (before, after) = if c["direction"] == "widened" {
                (o, nw)
            } else {
                (nw, o)
            };
            if kind == "tunnel" {
                // Allowed both ways; what changes is that the bytes are no longer inspected.
                let side = if c["direction"] == "widened" {
                    "new"
                } else {
                    "old"
                };
                assert_eq!(e[side]["reason"], "tunnel", "{c:#}");
                continue;
            }
            assert!(
                (before == "deny" && (after == "allow" || after == "ask"))
                    || (before == "ask" && after == "allow"),
                "the example shows the {}: {c:#}",
                c["direction"]
            );
        }
    }
}

/// The host of an example URL.
fn url_host(c: &Value) -> String {
    let url = c["example"]["url"].as_str().expect("example.url");
    let rest = url.split_once("://").expect("scheme").1;
    let authority = rest.split('/').next().unwrap_or_default();
    authority.split(':').next().unwrap_or_default().to_string()
}

const API: &str = r#"
[[rules]]
name    = "api"
hosts   = ["api.x.test"]
methods = ["GET"]
"#;

// --- hosts -----------------------------------------------------------------------------------

const OTHER: &str = r#"
[[rules]]
name    = "other"
hosts   = ["other.test"]
methods = ["GET"]
"#;

#[test]
fn diff_an_exact_host_added_widens() {
    let v = Pair::new(API, &format!("{API}{OTHER}")).expect(&[w("host", "other.test")]);
    let c = one(&v, "host", Some("other.test"));
    assert_eq!(c["rule"], "other", "{c:#}");
    assert_eq!(url_host(c), "other.test", "{c:#}");
    assert_eq!(c["example"]["old"]["reason"], "no_rule", "{c:#}");
    assert_eq!(v["identities"][0]["identity"], "default");
    assert_eq!(v["identities"][0]["status"], "changed");
}

#[test]
fn diff_an_exact_host_removed_narrows_and_exits_0() {
    let v = Pair::new(&format!("{API}{OTHER}"), API).expect(&[n("host", "other.test")]);
    let c = one(&v, "host", Some("other.test"));
    assert_eq!(c["rule"], "other", "the rule in OLD: {c:#}");
    assert_eq!(c["example"]["new"]["decision"], "deny", "{c:#}");
}

#[test]
fn diff_an_exact_host_made_a_wildcard_widens_to_a_fresh_label() {
    let wild = API.replace(r#"["api.x.test"]"#, r#"["*.x.test"]"#);
    let v = Pair::new(API, &wild).expect(&[w("host", "*.x.test")]);
    let c = one(&v, "host", Some("*.x.test"));
    let host = url_host(c);
    assert!(host.ends_with(".x.test"), "{c:#}");
    assert_ne!(
        host, "api.x.test",
        "never an exact host a policy names: {c:#}"
    );
}

// --- ports, methods, paths ---------------------------------------------------------------------

#[test]
fn diff_a_port_added_widens() {
    let old = API.replace("methods", "ports   = [443]\nmethods");
    let new = API.replace("methods", "ports   = [443, 8443]\nmethods");
    let v = Pair::new(&old, &new).expect(&[w("port", "api.x.test")]);
    let c = one(&v, "port", Some("api.x.test"));
    assert_eq!(c["port"], 8443, "{c:#}");
    assert_eq!(c["scheme"], "https", "https first: {c:#}");
    assert!(
        c["example"]["url"]
            .as_str()
            .unwrap_or_default()
            .contains(":8443/"),
        "{c:#}"
    );
    assert_eq!(c["example"]["old"]["reason"], "port_not_allowed", "{c:#}");
}

#[test]
fn diff_a_method_added_widens_by_that_method() {
    let new = API.replace(r#"["GET"]"#, r#"["GET", "POST"]"#);
    let v = Pair::new(API, &new).expect(&[w("method", "api.x.test")]);
    let c = one(&v, "method", Some("api.x.test"));
    assert_eq!(c["methods"], serde_json::json!(["POST"]), "{c:#}");
    assert_eq!(c["example"]["method"], "POST", "{c:#}");
    assert_eq!(c["example"]["old"]["reason"], "method_not_allowed", "{c:#}");
    // A rule without `ports` reaches http:80 and https:443: one change lists both.
    assert_eq!(
        c["ports"],
        serde_json::json!(["https:443", "http:80"]),
        "{c:#}"
    );
}

#[test]
fn diff_methods_removed_means_every_method_and_widens() {
    let new = API.replace("methods = [\"GET\"]\n", "");
    let v = Pair::new(API, &new).expect(&[w("method", "api.x.test")]);
    let c = one(&v, "method", Some("api.x.test"));
    let methods: Vec<&str> = c["methods"]
        .as_array()
        .expect("methods")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for m in ["DELETE", "PATCH", "POST", "PUT", "other"] {
        assert!(methods.contains(&m), "{m} newly reachable: {c:#}");
    }
    assert!(!methods.contains(&"GET"), "GET was reachable before: {c:#}");
    let mut sorted = methods.clone();
    sorted.sort_unstable();
    assert_eq!(methods, sorted, "methods sorted: {c:#}");
}

const ISSUES: &str = r#"
[[rules]]
name    = "issues"
hosts   = ["api.x.test"]
methods = ["GET"]
paths   = ["/repos/*/issues"]
"#;

#[test]
fn diff_a_path_glob_widened_shows_a_path_only_the_new_glob_allows() {
    let new = ISSUES.replace("/repos/*/issues", "/repos/**");
    let v = Pair::new(ISSUES, &new).expect(&[w("path", "api.x.test")]);
    let c = one(&v, "path", Some("api.x.test"));
    assert_eq!(c["method"], "GET", "{c:#}");
    assert_eq!(c["example"]["method"], "GET", "{c:#}");
    let url = c["example"]["url"].as_str().unwrap_or_default();
    assert!(url.contains("/repos/"), "{c:#}");
    assert_eq!(c["example"]["old"]["reason"], "path_not_allowed", "{c:#}");
    assert_eq!(c["example"]["new"]["rule"], "issues", "{c:#}");
}

#[test]
fn diff_a_path_glob_narrowed_shows_a_path_only_the_old_glob_allowed() {
    let old = ISSUES.replace("/repos/*/issues", "/repos/**");
    let v = Pair::new(&old, ISSUES).expect(&[n("path", "api.x.test")]);
    let c = one(&v, "path", Some("api.x.test"));
    assert_eq!(c["example"]["old"]["decision"], "allow", "{c:#}");
    assert_eq!(c["example"]["new"]["reason"], "path_not_allowed", "{c:#}");
}

// --- secrets and credentials ---------------------------------------------------------------------

const SECRET_VALUE: &str = "lk-diff-test-value-8a7f3c2e91d04b65";

const TOKEN_RULE: &str = r#"
[secrets.tok]
source = "env:LK_DIFF_TOK"

[[rules]]
name    = "api"
hosts   = ["api.x.test"]
methods = ["GET"]
[rules.inject.headers]
authorization = "Bearer {{secret.tok}}"
"#;

#[test]
fn diff_a_secret_bound_to_a_wider_host_widens_with_a_secret_line_first() {
    let new = TOKEN_RULE.replace(r#"["api.x.test"]"#, r#"["api.x.test", "other.test"]"#);
    let v =
        Pair::new(TOKEN_RULE, &new).expect(&[w("secret", "other.test"), w("host", "other.test")]);
    let c = one(&v, "secret", Some("other.test"));
    assert_eq!(c["secret"], "tok", "{c:#}");
    assert_eq!(c["rule"], "api", "{c:#}");
    let first = &v["identities"][0]["changes"][0];
    assert_eq!(first["kind"], "secret", "secrets come first: {v:#}");
}

#[test]
fn diff_a_new_wildcard_host_receiving_the_key_is_a_secret_change() {
    let old = r#"
[secrets.openai]
source = "env:LK_DIFF_OPENAI"

[[rules]]
name    = "openai"
hosts   = ["api.openai.com"]
methods = ["POST"]
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"
"#;
    let new = format!(
        r#"{old}
[[rules]]
name    = "openai-any"
hosts   = ["*.openai.com"]
methods = ["POST"]
dangerously_inject_into_wildcard = true
[rules.inject.headers]
authorization = "Bearer {{{{secret.openai}}}}"
"#
    );
    let v = Pair::new(old, &new).expect(&[w("secret", "*.openai.com"), w("host", "*.openai.com")]);
    let c = one(&v, "secret", Some("*.openai.com"));
    assert_eq!(c["secret"], "openai", "{c:#}");
    assert_eq!(c["rule"], "openai-any", "{c:#}");
    let host = url_host(one(&v, "host", Some("*.openai.com")));
    assert!(
        host.ends_with(".openai.com") && host != "api.openai.com",
        "{host}"
    );
}

#[test]
fn diff_a_new_secret_on_a_reachable_host_widens_by_the_secret_alone() {
    let new = TOKEN_RULE;
    // Brokering a secret, the rule covers https only: plain http to the host is no longer
    // reached (a credential never travels in cleartext).
    let v = Pair::new(API, new).expect(&[w("secret", "api.x.test"), n("port", "api.x.test")]);
    assert_eq!(one(&v, "secret", Some("api.x.test"))["secret"], "tok");
}

#[test]
fn diff_a_secret_no_longer_bound_narrows() {
    let v =
        Pair::new(TOKEN_RULE, API).expect(&[n("secret", "api.x.test"), w("port", "api.x.test")]);
    assert_eq!(one(&v, "secret", Some("api.x.test"))["rule"], "api");
}

#[test]
fn diff_a_credential_bound_widens_naming_its_kind() {
    let new = format!(
        r#"
[credentials.aws]
kind = "aws_sigv4"
access_key_id = "env:LK_DIFF_AKID"
secret_access_key = "env:LK_DIFF_AWS_SECRET"
region = "us-west-2"
service = "s3"
{}"#,
        API.replace("methods", "credential = \"aws\"\nmethods")
    );
    let v = Pair::new(API, &new).expect(&[w("credential", "api.x.test"), n("port", "api.x.test")]);
    let c = one(&v, "credential", Some("api.x.test"));
    assert_eq!(c["credential"], "aws", "{c:#}");
    assert_eq!(c["credential_kind"], "aws_sigv4", "{c:#}");
}

// --- identities ------------------------------------------------------------------------------------

fn identities(ci_rules: &str, lab: bool) -> String {
    let mut p = format!(
        "{API}{OTHER}\n[identities.ci]\ntoken = \"env:LK_DIFF_TOKEN_CI\"\nrules = {ci_rules}\n"
    );
    if lab {
        p.push_str("\n[identities.lab]\ntoken = \"env:LK_DIFF_TOKEN_LAB\"\nrules = [\"api\"]\n");
    }
    p
}

#[test]
fn diff_an_identity_added_widens_by_all_it_reaches() {
    let v = Pair::new(
        &identities(r#"["api"]"#, false),
        &identities(r#"["api"]"#, true),
    )
    .expect(&[key("lab", "widened", "host", Some("api.x.test"))]);
    assert_eq!(v["identities"][0]["identity"], "lab");
    assert_eq!(v["identities"][0]["status"], "added");
}

#[test]
fn diff_an_identity_removed_narrows() {
    let v = Pair::new(
        &identities(r#"["api"]"#, true),
        &identities(r#"["api"]"#, false),
    )
    .expect(&[key("lab", "narrowed", "host", Some("api.x.test"))]);
    assert_eq!(v["identities"][0]["status"], "removed");
}

#[test]
fn diff_an_identity_granted_a_rule_widens_that_identity_only() {
    let v = Pair::new(
        &identities(r#"["api"]"#, true),
        &identities(r#"["api", "other"]"#, true),
    )
    .expect(&[key("ci", "widened", "host", Some("other.test"))]);
    assert_eq!(v["identities"][0]["status"], "changed");
    let c = one(&v, "host", Some("other.test"));
    assert_eq!(
        c["example"]["old"]["reason"], "identity_not_allowed",
        "{c:#}"
    );
}

#[test]
fn diff_an_identitys_rule_removed_narrows_that_identity_only() {
    let v = Pair::new(
        &identities(r#"["api", "other"]"#, true),
        &identities(r#"["api"]"#, true),
    )
    .expect(&[key("ci", "narrowed", "host", Some("other.test"))]);
    assert_eq!(v["identities"][0]["status"], "changed");
}

#[test]
fn diff_a_policy_without_identities_is_the_default_identity() {
    let (_, v) = Pair::new(API, &format!("{API}{OTHER}")).json();
    assert_eq!(v["identities"][0]["identity"], "default", "{v:#}");
}

// --- tunnel, report-only, allow_private, ask -----------------------------------------------------

const PYPI: &str = r#"
[[rules]]
name  = "pypi"
hosts = ["pypi.org"]
"#;

#[test]
fn diff_tunnel_true_added_widens_as_a_tunnel() {
    let new = PYPI.replace("hosts", "tunnel = true\nhosts");
    // Plain http on port 80 (which a rule without `ports` also reached) is lost: a tunnel
    // relays CONNECT only. The host itself is not "no longer reachable".
    let v = Pair::new(PYPI, &new).expect(&[w("tunnel", "pypi.org"), n("port", "pypi.org")]);
    assert_eq!(
        one(&v, "port", Some("pypi.org"))["example"]["url"],
        "http://pypi.org/"
    );
    let c = one(&v, "tunnel", Some("pypi.org"));
    assert_eq!(c["example"]["method"], "CONNECT", "{c:#}");
    assert_eq!(c["example"]["url"], "https://pypi.org/", "{c:#}");
    assert_eq!(c["example"]["new"]["reason"], "tunnel", "{c:#}");
}

#[test]
fn diff_tunnel_true_removed_narrows() {
    let old = PYPI.replace("hosts", "tunnel = true\nhosts");
    let v = Pair::new(&old, PYPI).expect(&[n("tunnel", "pypi.org"), w("port", "pypi.org")]);
    assert_eq!(
        one(&v, "tunnel", Some("pypi.org"))["example"]["old"]["reason"],
        "tunnel"
    );
}

#[test]
fn diff_mode_report_added_widens() {
    let new = API.replace("methods", "mode    = \"report\"\nmethods");
    let v = Pair::new(API, &new).expect(&[w("report_only", "api.x.test")]);
    assert_eq!(one(&v, "report_only", Some("api.x.test"))["rule"], "api");
}

#[test]
fn diff_allow_private_added_widens_naming_the_range() {
    let new = API.replace("methods", "allow_private = [\"10.1.2.0/24\"]\nmethods");
    let v = Pair::new(API, &new).expect(&[w("allow_private", "api.x.test")]);
    assert_eq!(
        one(&v, "allow_private", Some("api.x.test"))["cidr"],
        "10.1.2.0/24"
    );
}

#[test]
fn diff_ask_added_narrows() {
    let new = API.replace("methods", "ask     = {}\nmethods");
    let v = Pair::new(API, &new).expect(&[n("ask", "api.x.test")]);
    assert_eq!(one(&v, "ask", Some("api.x.test"))["rule"], "api");
}

#[test]
fn diff_ask_removed_widens() {
    let old = API.replace("methods", "ask     = {}\nmethods");
    let v = Pair::new(&old, API).expect(&[w("ask", "api.x.test")]);
    assert_eq!(one(&v, "ask", Some("api.x.test"))["rule"], "api");
}

#[test]
fn diff_ask_unknown_added_widens_without_a_host() {
    let new = format!("{API}\n[ask]\nunknown = true\n");
    let v = Pair::new(API, &new).expect(&[key("default", "widened", "ask_unknown", None)]);
    assert!(one(&v, "ask_unknown", None).get("host").is_none());
}

// --- no change -------------------------------------------------------------------------------------

#[test]
fn diff_reordered_rules_comments_and_a_renamed_file_are_no_change() {
    let old = format!("{API}{OTHER}");
    let new = format!("# the same rules, the other way round\n{OTHER}\n# api\n{API}");
    let pair = Pair::files(&[("main.toml", &old)], &[("renamed.toml", &new)]);
    let v = pair.expect(&[]);
    assert_eq!(v["identities"], serde_json::json!([]), "{v:#}");
    let text = pair.run("text", &[]);
    assert_eq!(text.code(), Some(0), "{text:#?}");
    assert_eq!(
        text.stdout.trim_end().lines().last(),
        Some("no change in reach"),
        "{text:#?}"
    );
    let md = pair.run("markdown", &[]);
    assert!(
        md.stdout
            .starts_with("### latchkey policy diff: no change in reach"),
        "{md:#?}"
    );
}

// --- sides that do not load ------------------------------------------------------------------------

#[test]
fn diff_exits_1_naming_the_side_that_does_not_load() {
    let bad = "[[rules]]\nname = \"api\"\nhosts = [\"api.x.test\"]\nmethds = [\"GET\"]\n";
    for (old, new, broken) in [(bad, API, "old"), (API, bad, "new")] {
        let pair = Pair::new(old, new);
        let out = pair.run("json", &[]);
        assert_eq!(out.code(), Some(1), "{broken}: {out:#?}");
        let dir = if broken == "old" {
            &pair.old
        } else {
            &pair.new
        };
        let file = dir.path().join("main.toml");
        assert!(
            out.stderr.contains(&format!("{}:4:", file.display())),
            "{broken}: the problem names {file:?}:4: {out:#?}"
        );
        assert!(out.stderr.contains("methds"), "{out:#?}");
        let other = if broken == "old" {
            &pair.new
        } else {
            &pair.old
        };
        assert!(
            !out.stderr.contains(&other.path().display().to_string()),
            "{out:#?}"
        );
        assert!(out.stdout.trim().is_empty(), "no report: {out:#?}");
    }
}

// --- --git ---------------------------------------------------------------------------------------

fn git(dir: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir)
        .args([
            "-c",
            "user.name=latchkey test",
            "-c",
            "user.email=test@latchkey.invalid",
        ])
        .args([
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null");
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(20));
    assert_eq!(out.code(), Some(0), "git {args:?}: {out:#?}");
    out.stdout.trim().to_string()
}

/// A git repository whose `policies/main.toml` is API at tag v1, API + OTHER at v2, and a
/// policy with an unknown key on line 4 at v3 (HEAD).
struct Repo {
    dir: TempDir,
}

impl Repo {
    fn new() -> Repo {
        let dir = tempfile::Builder::new()
            .prefix("latchkey-diff-git")
            .tempdir()
            .unwrap();
        let repo = Repo { dir };
        git(repo.path(), &["init", "-q"]);
        std::fs::create_dir(repo.path().join("policies")).unwrap();
        repo.commit("main.toml", API, "v1");
        repo.commit("main.toml", &format!("{API}{OTHER}"), "v2");
        let bad = "[[rules]]\nname = \"api\"\nhosts = [\"api.x.test\"]\nmethds = [\"GET\"]\n";
        repo.commit("x.toml", bad, "v3");
        repo
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn commit(&self, file: &str, text: &str, tag: &str) {
        std::fs::write(self.path().join("policies").join(file), text).unwrap();
        git(self.path(), &["add", "-A"]);
        git(self.path(), &["commit", "-q", "-m", tag]);
        git(self.path(), &["tag", tag]);
    }

    fn diff(&self, cwd: &Path, args: &[&str]) -> CliOutput {
        let mut all = vec!["diff"];
        all.extend(args);
        lk(&all, Some(cwd), &[])
    }
}

#[test]
fn diff_git_between_two_revisions() {
    let repo = Repo::new();
    let out = repo.diff(repo.path(), &["--git", "v1..v2", "--format", "json"]);
    assert_eq!(out.code(), Some(3), "{out:#?}");
    let v = json_of(&out);
    check_shape(&v, &out);
    assert_eq!(keys(&v), BTreeSet::from([w("host", "other.test")]), "{v:#}");
    assert_eq!(v["old"]["source"], "v1:policies", "{v:#}");
    assert_eq!(v["new"]["source"], "v2:policies", "{v:#}");
    assert_eq!(
        one(&v, "host", Some("other.test"))["origin"],
        "v2:policies/main.toml:7"
    );

    // Full hashes too, and the reverse narrows.
    let v1 = git(repo.path(), &["rev-parse", "v1"]);
    let v2 = git(repo.path(), &["rev-parse", "v2"]);
    let out = repo.diff(
        repo.path(),
        &["--git", &format!("{v2}..{v1}"), "--format", "json"],
    );
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let v = json_of(&out);
    assert_eq!(keys(&v), BTreeSet::from([n("host", "other.test")]), "{v:#}");
    assert_eq!(v["old"]["source"], format!("{v2}:policies"), "{v:#}");
}

#[test]
fn diff_git_a_revision_against_the_working_tree() {
    let repo = Repo::new();
    // The working tree drops x.toml (uncommitted) and narrows: other.test goes.
    std::fs::remove_file(repo.path().join("policies/x.toml")).unwrap();
    std::fs::write(repo.path().join("policies/main.toml"), API).unwrap();
    let out = repo.diff(repo.path(), &["--git", "v2", "--format", "json"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let v = json_of(&out);
    check_shape(&v, &out);
    assert_eq!(keys(&v), BTreeSet::from([n("host", "other.test")]), "{v:#}");
    assert_eq!(v["old"]["source"], "v2:policies", "{v:#}");
    assert_eq!(v["new"]["source"], "policies", "{v:#}");

    // From a subdirectory, --policies is relative to it.
    let sub = repo.path().join("policies");
    let out = repo.diff(
        &sub,
        &["--git", "v2", "--policies", ".", "--format", "json"],
    );
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert_eq!(
        keys(&json_of(&out)),
        BTreeSet::from([n("host", "other.test")])
    );
}

#[test]
fn diff_git_names_a_bad_file_as_rev_path_line() {
    let repo = Repo::new();
    let out = repo.diff(repo.path(), &["--git", "v2..v3"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(out.stderr.contains("v3:policies/x.toml:4:"), "{out:#?}");
    assert!(out.stderr.contains("methds"), "{out:#?}");
    assert!(!out.stderr.contains("v2:"), "v2 loads: {out:#?}");

    let out = repo.diff(repo.path(), &["--git", "v1..no-such-rev"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(out.stderr.contains("no-such-rev"), "{out:#?}");
}

#[test]
fn diff_git_outside_a_repository_exits_1() {
    let dir = policy_dir(&[]);
    let out = lk(&["diff", "--git", "v1..v2"], Some(dir.path()), &[]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(!out.stderr.is_empty(), "{out:#?}");
}

// --- formats -------------------------------------------------------------------------------------

#[test]
fn diff_text_marks_widened_and_narrowed_lines_and_ends_with_the_verdict() {
    let old = format!("{API}{OTHER}");
    let new = format!(
        "{}\n{}",
        API.replace(r#"["GET"]"#, r#"["GET", "POST"]"#),
        ""
    );
    let pair = Pair::new(&old, &new);
    let out = pair.run("text", &[]);
    assert_eq!(out.code(), Some(3), "{out:#?}");
    let lines: Vec<&str> = out.stdout.trim_end().lines().collect();
    assert!(
        lines[0].starts_with(&format!(
            "latchkey diff: {} (sha256:",
            pair.old.path().display()
        )),
        "{out:#?}"
    );
    assert!(lines.contains(&"identity default (changed)"), "{out:#?}");
    let plus: Vec<&&str> = lines.iter().filter(|l| l.starts_with("  + ")).collect();
    let minus: Vec<&&str> = lines.iter().filter(|l| l.starts_with("  - ")).collect();
    assert_eq!(plus.len(), 1, "{out:#?}");
    assert!(
        plus[0].contains("POST") && plus[0].contains("api.x.test"),
        "{out:#?}"
    );
    assert_eq!(minus.len(), 1, "{out:#?}");
    assert!(minus[0].contains("other.test"), "{out:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.trim_start().starts_with("e.g. POST https://api.x.test")),
        "{out:#?}"
    );
    assert_eq!(
        lines.last(),
        Some(&"widens reach: 1 change(s) widen, 1 narrow"),
        "{out:#?}"
    );

    let out = Pair::new(&old, API).run("text", &[]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert_eq!(
        out.stdout.trim_end().lines().last(),
        Some("does not widen reach: 1 change(s) narrow"),
        "{out:#?}"
    );
}

#[test]
fn diff_markdown_is_a_table_per_identity_with_the_verdict_heading() {
    let pair = Pair::new(API, &format!("{API}{OTHER}"));
    let out = pair.run("markdown", &[]);
    assert_eq!(out.code(), Some(3), "{out:#?}");
    assert!(
        out.stdout
            .starts_with("### latchkey policy diff: widens reach"),
        "{out:#?}"
    );
    assert!(
        out.stdout.contains("| | change | example | rule |"),
        "{out:#?}"
    );
    assert!(out.stdout.contains("other.test"), "{out:#?}");
    let narrowing = Pair::new(&format!("{API}{OTHER}"), API).run("markdown", &[]);
    assert_eq!(narrowing.code(), Some(0), "{narrowing:#?}");
    assert!(
        narrowing
            .stdout
            .starts_with("### latchkey policy diff: does not widen reach"),
        "{narrowing:#?}"
    );
}

/// Text a policy controls that holds markdown and HTML: the directory names (each side's
/// source), a rule description, and a kept header's name are all that can carry it.
const HOSTILE: &str = "x|y`z`<script>alert(1)";

#[test]
fn diff_markdown_escapes_what_a_policy_controls() {
    let root = tempfile::Builder::new()
        .prefix("latchkey-diff-md")
        .tempdir()
        .unwrap();
    let old: PathBuf = root.path().join(format!("old{HOSTILE}"));
    let new: PathBuf = root.path().join(format!("new{HOSTILE}"));
    std::fs::create_dir(&old).unwrap();
    std::fs::create_dir(&new).unwrap();
    std::fs::write(old.join("main.toml"), API).unwrap();
    let described = OTHER.replace(
        "methods",
        &format!(
            "description = {:?}\nmethods",
            format!("desc {HOSTILE}\n| injected | row |")
        ),
    );
    std::fs::write(
        new.join(format!("a{HOSTILE}.toml")),
        format!("{API}{described}"),
    )
    .unwrap();
    let out = lk(
        &[
            OsStr::new("diff"),
            old.as_os_str(),
            new.as_os_str(),
            OsStr::new("--format"),
            OsStr::new("markdown"),
        ],
        None,
        &[],
    );
    assert_eq!(out.code(), Some(3), "{out:#?}");
    let md = &out.stdout;
    assert!(!md.contains("<script>"), "raw HTML in the comment:\n{md}");
    assert!(md.contains("&lt;script&gt;"), "escaped, not dropped:\n{md}");
    assert!(
        !md.contains("| injected | row |"),
        "a new table row from the policy:\n{md}"
    );
    assert!(
        !md.contains("y`z"),
        "an unescaped backtick of the policy's:\n{md}"
    );
    // Every `|` from the policy is escaped: a table row has its own 5 separators, no more.
    for line in md.lines().filter(|l| l.starts_with('|')) {
        let bare = line
            .char_indices()
            .filter(|&(i, c)| c == '|' && (i == 0 || line.as_bytes()[i - 1] != b'\\'))
            .count();
        assert_eq!(bare, 5, "a table row has exactly 4 cells:\n{line}");
    }
    assert!(
        md.contains("x\\|y\\`z\\`"),
        "the source is shown, escaped:\n{md}"
    );
}

// --- secret values -------------------------------------------------------------------------------

#[test]
fn diff_never_prints_a_secret_value_in_any_format() {
    let env = [
        ("LK_DIFF_TOK", SECRET_VALUE),
        ("LK_DIFF_AKID", "AKIDLKDIFFTEST0000001"),
        ("LK_DIFF_AWS_SECRET", SECRET_VALUE),
        ("LK_DIFF_TOKEN_CI", SECRET_VALUE),
    ];
    let new = format!(
        "{}\n[identities.ci]\ntoken = \"env:LK_DIFF_TOKEN_CI\"\nrules = [\"api\", \"other\"]\n\n{}",
        TOKEN_RULE.replace(r#"["api.x.test"]"#, r#"["api.x.test", "other.test"]"#),
        OTHER
    );
    let old =
        format!("{API}\n[identities.ci]\ntoken = \"env:LK_DIFF_TOKEN_CI\"\nrules = [\"api\"]\n");
    let pair = Pair::new(&old, &new);
    for format in ["text", "markdown", "json"] {
        let out = pair.run(format, &env);
        assert_eq!(out.code(), Some(3), "{format}: {out:#?}");
        assert!(
            out.stdout.contains("tok"),
            "{format}: the secret is named: {out:#?}"
        );
        assert!(!out.stdout.contains(SECRET_VALUE), "{format}: {out:#?}");
        assert!(!out.stderr.contains(SECRET_VALUE), "{format}: {out:#?}");
        assert!(!out.stdout.contains("AKIDLKDIFFTEST"), "{format}: {out:#?}");
    }
    // A side that does not load does not print it either.
    let broken = format!("{new}\n[[rules]]\nname = \"api\"\nhosts = [\"dup.test\"]\n");
    let out = Pair::new(&old, &broken).run("text", &env);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        !out.stderr.contains(SECRET_VALUE) && !out.stdout.contains(SECRET_VALUE),
        "{out:#?}"
    );
}

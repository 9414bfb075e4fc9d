//! `examples/policy-repo/`: the policy repository a security team copies. Its policy passes
//! `check` and `test`; its GitHub Actions workflow is read as YAML (trigger, history, steps and
//! their flags, least permissions, no `${{ }}` expanded inside a script) and its own `check`,
//! `test` and `diff` scripts are run for real, with the built binary on PATH, in a git
//! repository cloned from a copy of the example, on a widening, a narrowing-only and a broken
//! change.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

use crate::support::latchkey::{wait_with_timeout, BIN, SCRUBBED_ENV};
use crate::support::{run_cli, CliOutput};

const WORKFLOW: &str = ".github/workflows/latchkey-policy.yml";

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/policy-repo")
}

fn workflow() -> Value {
    let path = example().join(WORKFLOW);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// The step of job `job` with `id: ID`.
fn step<'a>(wf: &'a Value, job: &str, id: &str) -> &'a Value {
    wf["jobs"][job]["steps"]
        .as_array()
        .unwrap_or_else(|| panic!("job {job} has no steps"))
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("job {job} has no step with id {id}"))
}

fn run_script<'a>(wf: &'a Value, job: &str, id: &str) -> &'a str {
    step(wf, job, id)["run"]
        .as_str()
        .unwrap_or_else(|| panic!("step {id} has no run: script"))
}

/// Every script in the workflow: `run:` and actions/github-script's `with.script`.
fn scripts(wf: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (job, body) in wf["jobs"].as_object().expect("jobs") {
        for (i, s) in body["steps"].as_array().expect("steps").iter().enumerate() {
            let name = format!("{job}.steps[{i}] ({})", s["id"]);
            for script in [&s["run"], &s["with"]["script"]] {
                if let Some(text) = script.as_str() {
                    out.push((name.clone(), text.to_string()));
                }
            }
        }
    }
    out
}

#[test]
fn the_example_policy_passes_check_without_secrets_and_its_tests() {
    let policies = example().join("policies");
    let check = run_cli([
        "check".as_ref(),
        "--no-secrets".as_ref(),
        "--policies".as_ref(),
        policies.as_os_str(),
    ]);
    assert_eq!(check.code(), Some(0), "{check:#?}");
    assert!(
        check.stdout.starts_with("ok: 5 rule(s) in 1 file(s)"),
        "{check:#?}"
    );

    let test = run_cli(["test".as_ref(), "--policies".as_ref(), policies.as_os_str()]);
    assert_eq!(test.code(), Some(0), "{test:#?}");
    assert!(test.stdout.contains(" passed, 0 failed"), "{test:#?}");
    assert!(!test.stdout.contains("FAIL"), "{test:#?}");
}

#[test]
fn the_workflow_runs_on_pull_requests_touching_the_policies_with_full_history() {
    let wf = workflow();
    assert_eq!(
        wf["on"]["pull_request"]["paths"],
        serde_json::json!(["policies/**"]),
        "{wf:#}"
    );
    // pull_request_target would run with a write token on the fork's code.
    assert!(wf["on"].get("pull_request_target").is_none(), "{wf:#}");
    let checkout = step(&wf, "reach", "checkout");
    assert!(
        checkout["uses"]
            .as_str()
            .is_some_and(|u| u.starts_with("actions/checkout@")),
        "{checkout:#}"
    );
    assert_eq!(checkout["with"]["fetch-depth"], 0, "{checkout:#}");
    assert_eq!(wf["env"]["LATCHKEY_POLICIES"], "policies", "{wf:#}");
}

#[test]
fn the_workflow_installs_a_pinned_latchkey_and_caches_it() {
    let wf = workflow();
    assert!(
        wf["env"]["LATCHKEY_REPO"]
            .as_str()
            .is_some_and(|r| r.starts_with("https://")),
        "{wf:#}"
    );
    let rev = wf["env"]["LATCHKEY_REV"].as_str().unwrap_or_default();
    assert!(
        rev.len() == 40 && rev.bytes().all(|b| b.is_ascii_hexdigit()),
        "LATCHKEY_REV {rev:?} is not a full commit hash"
    );
    let install = step(&wf, "reach", "install");
    assert!(
        install["run"].as_str().unwrap_or_default().contains(
            r#"cargo install --locked --git "$LATCHKEY_REPO" --rev "$LATCHKEY_REV" latchkey"#
        ),
        "{install:#}"
    );
    assert_eq!(
        install["if"], "steps.cache.outputs.cache-hit != 'true'",
        "{install:#}"
    );
    let cache = step(&wf, "reach", "cache");
    assert!(
        cache["uses"]
            .as_str()
            .is_some_and(|u| u.starts_with("actions/cache@")),
        "{cache:#}"
    );
    assert!(
        cache["with"]["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("~/.cargo/bin")),
        "{cache:#}"
    );
    assert!(
        cache["with"]["key"]
            .as_str()
            .is_some_and(|k| k.contains("env.LATCHKEY_REV")),
        "{cache:#}"
    );
}

#[test]
fn the_workflow_checks_tests_and_diffs_against_the_base_branch() {
    let wf = workflow();
    assert!(run_script(&wf, "reach", "check").contains("latchkey check --no-secrets"));
    assert!(run_script(&wf, "reach", "test").contains("latchkey test"));
    assert!(run_script(&wf, "reach", "diff")
        .contains(r#"latchkey diff --git "origin/$BASE_REF..HEAD" --format markdown"#));
    assert_eq!(
        step(&wf, "reach", "diff")["env"]["BASE_REF"],
        "${{ github.base_ref }}"
    );
    let steps: Vec<&str> = wf["jobs"]["reach"]["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    let at = |id: &str| {
        steps
            .iter()
            .position(|s| *s == id)
            .unwrap_or_else(|| panic!("no {id} in {steps:?}"))
    };
    assert!(
        at("install") < at("check")
            && at("check") < at("test")
            && at("test") < at("diff")
            && at("diff") < at("comment"),
        "{steps:?}"
    );
    assert_eq!(wf["defaults"]["run"]["shell"], "bash");
    for job in wf["jobs"].as_object().expect("jobs").values() {
        for s in job["steps"].as_array().expect("steps") {
            if let Some(script) = s["run"].as_str() {
                assert!(script.starts_with("set -euo pipefail\n"), "{s:#}");
            }
        }
    }
}

#[test]
fn the_comment_step_posts_or_updates_one_comment_with_the_report() {
    let wf = workflow();
    let comment = step(&wf, "reach", "comment");
    assert!(
        comment["uses"]
            .as_str()
            .is_some_and(|u| u.starts_with("actions/github-script@")),
        "{comment:#}"
    );
    assert_eq!(
        comment["env"]["REPORT"], "${{ steps.diff.outputs.report }}",
        "{comment:#}"
    );
    let script = comment["with"]["script"].as_str().expect("script");
    for needle in [
        "process.env.REPORT",
        "updateComment",
        "createComment",
        "<!-- latchkey-policy-diff -->",
    ] {
        assert!(script.contains(needle), "{needle} not in {script}");
    }
}

#[test]
fn the_workflow_asks_for_the_least_permissions() {
    let wf = workflow();
    assert_eq!(wf["permissions"], serde_json::json!({}), "workflow default");
    assert_eq!(
        wf["jobs"]["reach"]["permissions"],
        serde_json::json!({"contents": "read", "pull-requests": "write"})
    );
    assert_eq!(
        wf["jobs"]["security-review"]["permissions"],
        serde_json::json!({})
    );
    assert_eq!(wf["jobs"].as_object().map(|j| j.len()), Some(2), "{wf:#}");
    assert_eq!(
        step(&wf, "reach", "checkout")["with"]["persist-credentials"],
        false
    );
}

#[test]
fn only_a_widening_diff_waits_for_the_security_review_environment() {
    let wf = workflow();
    let reach = &wf["jobs"]["reach"];
    assert_eq!(
        reach["outputs"]["widens"],
        "${{ steps.diff.outputs.widens }}"
    );
    let review = &wf["jobs"]["security-review"];
    assert_eq!(review["needs"], "reach");
    assert_eq!(review["if"], "needs.reach.outputs.widens == 'true'");
    assert_eq!(review["environment"], "security-review");
    // The diff script sets widens=true on exit 3 alone, and fails on anything but 0 and 3.
    let diff = run_script(&wf, "reach", "diff");
    assert!(diff.contains("3) widens=true"), "{diff}");
    assert!(diff.contains("0) widens=false"), "{diff}");
}

#[test]
fn no_workflow_expression_is_expanded_inside_a_script() {
    let wf = workflow();
    let all = scripts(&wf);
    assert!(all.len() >= 6, "{all:?}");
    for (name, script) in all {
        assert!(
            !script.contains("${{"),
            "{name}: an expression in a script is script injection:\n{script}"
        );
    }
}

/// `git` with a fixed identity and no user or system configuration.
fn git(dir: &Path, args: &[&str]) -> CliOutput {
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
    assert_eq!(out.code(), Some(0), "git {args:?} in {dir:?}: {out:#?}");
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A clone of a repository holding the example on `main`, on a new branch `change`: what the
/// runner holds after actions/checkout with fetch-depth 0 (`origin/main` is there).
struct Checkout {
    _tmp: TempDir,
    dir: PathBuf,
    bin: PathBuf,
    runner_temp: PathBuf,
}

impl Checkout {
    fn new() -> Checkout {
        let tmp = tempfile::Builder::new()
            .prefix("latchkey-policy-repo")
            .tempdir()
            .unwrap();
        let upstream = tmp.path().join("upstream");
        copy_dir(&example(), &upstream);
        git(&upstream, &["init", "-q"]);
        git(&upstream, &["add", "-A"]);
        git(&upstream, &["commit", "-q", "-m", "the agents' policy"]);
        git(tmp.path(), &["clone", "-q", "upstream", "work"]);
        let dir = tmp.path().join("work");
        git(&dir, &["checkout", "-q", "-b", "change"]);
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(BIN, bin.join("latchkey")).unwrap();
        let runner_temp = tmp.path().join("runner-temp");
        std::fs::create_dir(&runner_temp).unwrap();
        Checkout {
            _tmp: tmp,
            dir,
            bin,
            runner_temp,
        }
    }

    /// Replaces `from` with `to` in policies/agents.toml and commits.
    fn change(&self, from: &str, to: &str, message: &str) {
        let path = self.dir.join("policies/agents.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{from:?} not in the example policy");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        git(&self.dir, &["commit", "-q", "-a", "-m", message]);
    }

    /// Runs step `id`'s script as the runner would: `bash -e`, the workflow's, job's and step's
    /// `env:` (expressions given the pull request's values), GITHUB_OUTPUT and friends.
    fn run_step(&self, wf: &Value, id: &str) -> StepRun {
        let step = step(wf, "reach", id);
        let script = self.runner_temp.join(format!("{id}.sh"));
        std::fs::write(&script, run_script(wf, "reach", id)).unwrap();
        let output = self.runner_temp.join(format!("{id}.output"));
        let summary = self.runner_temp.join(format!("{id}.summary"));
        std::fs::write(&output, "").unwrap();
        std::fs::write(&summary, "").unwrap();
        let mut cmd = Command::new("bash");
        cmd.arg("-e").arg(&script).current_dir(&self.dir);
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        for (k, _) in std::env::vars() {
            if k.starts_with("LATCHKEY_") {
                cmd.env_remove(k);
            }
        }
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cmd.env("PATH", path)
            .env("GITHUB_OUTPUT", &output)
            .env("GITHUB_STEP_SUMMARY", &summary)
            .env("RUNNER_TEMP", &self.runner_temp);
        for env in [&wf["env"], &wf["jobs"]["reach"]["env"], &step["env"]] {
            for (k, v) in env.as_object().into_iter().flatten() {
                let v = v.as_str().unwrap_or_else(|| panic!("env {k}: {v}"));
                let v = match v {
                    "${{ github.base_ref }}" => "main",
                    v => {
                        assert!(!v.contains("${{"), "env {k}: unexpected expression {v}");
                        v
                    }
                };
                cmd.env(k, v);
            }
        }
        let out = wait_with_timeout(&mut cmd, Duration::from_secs(30));
        let outputs = std::fs::read_to_string(&output)
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        StepRun {
            out,
            outputs,
            summary: std::fs::read_to_string(&summary).unwrap(),
        }
    }
}

struct StepRun {
    out: CliOutput,
    outputs: BTreeMap<String, String>,
    summary: String,
}

/// The approval job's condition, `needs.reach.outputs.widens == 'true'`, on the diff step's
/// outputs (the reach job's `widens` output is the step's).
fn approval_runs(wf: &Value, diff: &StepRun) -> bool {
    assert_eq!(
        wf["jobs"]["security-review"]["if"],
        "needs.reach.outputs.widens == 'true'"
    );
    diff.outputs.get("widens").map(String::as_str) == Some("true")
}

#[test]
fn the_workflow_scripts_send_a_new_host_to_the_security_team() {
    let wf = workflow();
    let repo = Checkout::new();
    repo.change(
        r#"hosts = ["raw.githubusercontent.com", "codeload.github.com"]"#,
        r#"hosts = ["raw.githubusercontent.com", "codeload.github.com", "objects.githubusercontent.com"]"#,
        "github-raw: release downloads",
    );
    for id in ["check", "test"] {
        let run = repo.run_step(&wf, id);
        assert_eq!(run.out.code(), Some(0), "{id}: {:#?}", run.out);
    }
    let diff = repo.run_step(&wf, "diff");
    assert_eq!(
        diff.out.code(),
        Some(0),
        "exit 3 is captured, not a failed step: {:#?}",
        diff.out
    );
    assert_eq!(
        diff.outputs.get("widens").map(String::as_str),
        Some("true"),
        "{:#?}",
        diff.outputs
    );
    assert!(approval_runs(&wf, &diff));
    assert!(diff.out.stdout.contains("::warning::"), "{:#?}", diff.out);
    let report = std::fs::read_to_string(&diff.outputs["report"]).unwrap();
    assert!(
        report.starts_with("### latchkey policy diff: widens reach"),
        "{report}"
    );
    assert!(report.contains("objects.githubusercontent.com"), "{report}");
    assert!(report.contains("origin/main:policies"), "{report}");
    assert_eq!(diff.summary, report, "the job summary holds the report");
    // The report is not in the log, where a line could be taken for a workflow command.
    assert!(
        !diff.out.stdout.contains("objects.githubusercontent.com"),
        "{:#?}",
        diff.out
    );
}

#[test]
fn the_workflow_scripts_let_a_narrowing_change_through_without_approval() {
    let wf = workflow();
    let repo = Checkout::new();
    repo.change(
        r#"paths = ["/simple/**", "/pypi/**", "/packages/**"]"#,
        r#"paths = ["/simple/**", "/packages/**"]"#,
        "pypi: no JSON API",
    );
    for id in ["check", "test"] {
        let run = repo.run_step(&wf, id);
        assert_eq!(run.out.code(), Some(0), "{id}: {:#?}", run.out);
    }
    let diff = repo.run_step(&wf, "diff");
    assert_eq!(diff.out.code(), Some(0), "{:#?}", diff.out);
    assert_eq!(
        diff.outputs.get("widens").map(String::as_str),
        Some("false"),
        "{:#?}",
        diff.outputs
    );
    assert!(!approval_runs(&wf, &diff));
    let report = std::fs::read_to_string(&diff.outputs["report"]).unwrap();
    assert!(
        report.starts_with("### latchkey policy diff: does not widen reach"),
        "{report}"
    );
    assert!(report.contains("pypi.org"), "{report}");
}

#[test]
fn the_workflow_scripts_fail_on_a_policy_that_does_not_load() {
    let wf = workflow();
    let repo = Checkout::new();
    repo.change(r#"methods = ["POST"]"#, r#"methods = ["post"]"#, "a typo");
    for id in ["check", "test", "diff"] {
        let run = repo.run_step(&wf, id);
        assert_ne!(run.out.code(), Some(0), "{id} must fail: {:#?}", run.out);
        assert!(
            !run.outputs.contains_key("widens"),
            "{id}: {:#?}",
            run.outputs
        );
        if id == "diff" {
            assert!(
                run.out.stdout.contains("::error::latchkey diff failed"),
                "{:#?}",
                run.out
            );
            assert!(
                run.out.stderr.contains("HEAD:policies/agents.toml:"),
                "{:#?}",
                run.out
            );
        }
    }
}

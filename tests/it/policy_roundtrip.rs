//! The round trip of issue 18: traffic recorded under `--mode report` by real clients,
//! `latchkey learn` on its audit log, and `latchkey diff` of (current policy) → (current +
//! learned) lists exactly the learned reach: only widenings, each under a learned rule, every
//! learned rule and host in it, no secret; `check` and `test` pass on the result, and the
//! diff of the result against itself is empty.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use crate::support::{curl, latchkey, python_request, run_cli, TestCa, Upstream, PINNED};

const SECRET: &str = "sk-roundtrip-7c1e4a9b0d3f5e62";

/// The current policy: `api` may GET /v1/status only (with a secret injected); nothing else.
fn current(port: u16) -> String {
    format!(
        r#"
[secrets.k]
source = "env:LK_SECRET_K"

[[rules]]
name    = "api"
hosts   = ["api.test"]
ports   = [{port}]
methods = ["GET"]
paths   = ["/v1/status"]
[rules.inject.headers]
x-key = "{{{{secret.k}}}}"
"#
    )
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

#[test]
fn learned_rules_pass_check_and_test_and_diff_lists_exactly_their_reach() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let scratch = tempfile::tempdir().expect("scratch");
    let audit = scratch.path().join("audit.jsonl");
    let mut builder = latchkey()
        .upstream_ca(&ca)
        .env("LK_SECRET_K", SECRET)
        .audit_to(&audit)
        .arg("--mode")
        .arg("report")
        .policy("main.toml", &current(port));
    for host in PINNED {
        builder = builder.pin(host);
    }
    let lk = builder.run();
    let url = |host: &str, path: &str| format!("https://{host}:{port}{path}");

    // Allowed already (not learned), then what the agent also does: reads with varying ids,
    // a write, another host.
    assert_eq!(
        curl(&lk)
            .args([url("api.test", "/v1/status")])
            .run()
            .ok()
            .status,
        200
    );
    for id in ["17", "4242", "901"] {
        let out = curl(&lk)
            .args([url("api.test", &format!("/v1/items/{id}"))])
            .run();
        assert_eq!(out.ok().status, 200, "{out:#?}");
    }
    let out = curl(&lk)
        .args(["-X", "POST", "-d", "a=1", &url("api.test", "/v1/items")])
        .run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    for id in [
        "3f2a9c1e-8b7d-4e6f-a5c4-1d2e3f4a5b6c",
        "0b1c2d3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e",
    ] {
        let resp = python_request(&lk, "GET", &url("other.test", &format!("/docs/{id}")), &[]);
        assert_eq!(resp.status, 200, "{resp:#?}");
    }
    // The records are on disk once latchkey has stopped.
    drop(lk);

    let before = scratch.path().join("before");
    let after = scratch.path().join("after");
    std::fs::create_dir_all(&before).expect("mkdir");
    std::fs::write(before.join("main.toml"), current(port)).expect("write");
    copy_dir(&before, &after);

    let learn = run_cli([
        "learn".as_ref(),
        audit.as_os_str(),
        "--policies".as_ref(),
        after.as_os_str(),
    ]);
    assert_eq!(learn.code(), Some(0), "{learn:#?}");
    let learned = std::fs::read_to_string(after.join("learned.toml")).expect("learned.toml");
    let cases = std::fs::read_to_string(after.join("tests/learned.toml")).expect("cases");
    for text in [&learned, &cases, &learn.stdout, &learn.stderr] {
        assert!(!text.contains(SECRET), "the secret value leaked: {text}");
    }
    assert!(
        !learned.contains("secret") && !learned.contains("inject"),
        "{learned}"
    );

    // The result is a valid policy whose cases pass.
    let check = run_cli([
        "check".as_ref(),
        "--no-secrets".as_ref(),
        "--policies".as_ref(),
        after.as_os_str(),
    ]);
    assert_eq!(check.code(), Some(0), "{check:#?}");
    let test = run_cli(["test".as_ref(), "--policies".as_ref(), after.as_os_str()]);
    assert_eq!(test.code(), Some(0), "{test:#?}");

    // The diff is the learned reach and nothing else.
    let diff = run_cli([
        "diff".as_ref(),
        before.as_os_str(),
        after.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(diff.code(), Some(3), "learning widens reach: {diff:#?}");
    let d: Value = serde_json::from_str(&diff.stdout).expect("diff json");
    assert_eq!(d["narrowed"], false, "{d:#}");
    let ids = d["identities"].as_array().expect("identities");
    assert_eq!(ids.len(), 1, "{d:#}");
    assert_eq!(ids[0]["identity"], "default");
    let changes = ids[0]["changes"].as_array().expect("changes");

    let learned_rules: BTreeSet<String> = learned
        .lines()
        .filter_map(|l| l.trim().strip_prefix("name"))
        .filter_map(|l| l.split('"').nth(1))
        .map(String::from)
        .collect();
    assert!(!learned_rules.is_empty(), "{learned}");
    let mut rules_seen = BTreeSet::new();
    let mut hosts_seen = BTreeSet::new();
    for c in changes {
        assert_eq!(c["direction"], "widened", "{c:#}");
        let kind = c["kind"].as_str().expect("kind");
        assert!(
            ["host", "port", "method", "path"].contains(&kind),
            "a learned rule changed more than reach: {c:#}"
        );
        let rule = c["rule"].as_str().expect("rule").to_string();
        assert!(
            learned_rules.contains(&rule),
            "{rule} is not a learned rule: {c:#}"
        );
        rules_seen.insert(rule);
        hosts_seen.insert(c["host"].as_str().expect("host").to_string());
        // The example is traffic-shaped: a host the agent used, on the upstream's port.
        let url = c["example"]["url"].as_str().expect("example url");
        assert!(url.contains(&format!(":{port}/")), "{url}");
    }
    assert_eq!(
        rules_seen, learned_rules,
        "every learned rule shows in the diff"
    );
    assert_eq!(
        hosts_seen,
        BTreeSet::from(["api.test".to_string(), "other.test".to_string()])
    );
    // The ids were generalised, and the write is there for a reviewer to see.
    assert!(changes.iter().any(|c| c["kind"] == "path"
        && c["example"]["url"]
            .as_str()
            .is_some_and(|u| u.contains("/v1/items/"))));
    assert!(
        changes.iter().any(|c| c["methods"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m == "POST"))),
        "{changes:#?}"
    );

    // And the learned policy compared with itself changes nothing.
    let same = run_cli(["diff".as_ref(), after.as_os_str(), after.as_os_str()]);
    assert_eq!(same.code(), Some(0), "{same:#?}");
    assert!(
        same.stdout.ends_with("no change in reach\n"),
        "{}",
        same.stdout
    );
}

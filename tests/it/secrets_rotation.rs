//! Secret sources that change while latchkey runs: a `file:` secret rewritten on disk and an
//! `exec:` secret whose helper prints something new after its TTL are used on the next request,
//! without a restart; the old value is no longer injected but is still redacted. A failing
//! helper refuses the request without telling the sandbox what the helper said.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::assert_record;
use crate::support::secrets::{assert_no_leak, count, redacted, secrets_world, SecretsWorld};
use crate::support::{assert_denial, latchkey};

const FILE_V1: &str = "file-secret-v1-9c4e7a0b";
const FILE_V2: &str = "file-secret-v2-3b8d1f6e";
const FILE_V3: &str = "file-secret-v3-71aa04c2";

const EXEC_V1: &str = "exec-secret-v1-5e2d9c88";
const EXEC_V2: &str = "exec-secret-v2-0f6b3a17";

const RULE: &str = r#"
[[rules]]
name  = "openai"
hosts = ["api.test"]
ports = [PORT]
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"
"#;

/// GETs `path` on api.test and returns the credential the upstream received for it.
fn injected(w: &SecretsWorld, path: &str) -> String {
    let resp = w.curl_ok(&[&w.url("api.test", path)]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let seen = w.received_one(path);
    seen.header("authorization")
        .unwrap_or_else(|| panic!("no authorization reached the upstream: {seen:#?}"))
        .to_string()
}

/// Asks the upstream to reflect every credential it ever received, and checks that each one
/// (`history` of them) reaches the sandbox redacted.
fn assert_history_redacted(w: &SecretsWorld, history: usize) {
    let resp = w.curl_ok(&[&w.url("api.test", "/history")]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let text = resp.text();
    assert_eq!(
        count(text.as_bytes(), redacted("openai").as_bytes()),
        history,
        "every credential the upstream ever received, old ones included, must be redacted: {text}"
    );
    assert_no_leak(
        "the /history response",
        &crate::support::secrets::response_bytes(&resp),
        &w.tracked(),
    );
}

#[test]
fn a_file_secret_changed_on_disk_is_used_on_the_next_request_and_the_old_value_stays_redacted() {
    let w = secrets_world(
        &[],
        |s| std::fs::write(s.dir.join("openai.key"), FILE_V1).expect("write secret file"),
        |s| {
            format!(
                "[secrets.openai]\nsource = \"file:{}\"\n{}",
                s.path("openai.key"),
                s.ports(RULE)
            )
        },
    );
    for value in [FILE_V1, FILE_V2, FILE_V3] {
        w.track("openai", value);
    }
    let file = w.dir.path().join("openai.key");

    assert_eq!(injected(&w, "/v1/one"), format!("Bearer {FILE_V1}"));

    // Rewritten in place.
    std::fs::write(&file, FILE_V2).expect("rewrite secret file");
    thread::sleep(Duration::from_millis(500));
    assert_eq!(
        injected(&w, "/v1/two"),
        format!("Bearer {FILE_V2}"),
        "a file secret rewritten in place was not picked up"
    );

    // Replaced atomically (a new file renamed over it, as secret managers do).
    let fresh = w.dir.path().join("openai.key.new");
    std::fs::write(&fresh, FILE_V3).expect("write new secret file");
    std::fs::rename(&fresh, &file).expect("rename over the secret file");
    thread::sleep(Duration::from_millis(500));
    assert_eq!(
        injected(&w, "/v1/three"),
        format!("Bearer {FILE_V3}"),
        "a file secret replaced by rename was not picked up"
    );

    // The upstream reflects v1, v2, v3, and v3 again (this request).
    assert_history_redacted(&w, 4);
    let records = w.lk.wait_audit(4);
    for record in &records {
        assert_record(
            record,
            json!({"rule": "openai", "status": 200, "secrets": ["openai"]}),
        );
    }
    w.sweep();
}

fn exec_world(ttl: &str, prepare_value: &'static str) -> SecretsWorld {
    let ttl = ttl.to_string();
    secrets_world(
        &[],
        |s| {
            std::fs::write(s.dir.join("value"), format!("{prepare_value}\n"))
                .expect("write helper input")
        },
        move |s| {
            // The helper logs each run, then prints the value file (with its trailing newline,
            // which latchkey trims).
            format!(
                "[secrets.openai]\nsource = \"exec:echo run >> {runs}; cat {value}\"\nttl = \"{ttl}\"\ntimeout = \"5s\"\n{}",
                s.ports(RULE),
                runs = s.path("runs"),
                value = s.path("value"),
            )
        },
    )
}

fn helper_runs(w: &SecretsWorld) -> usize {
    std::fs::read_to_string(w.dir.path().join("runs"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[test]
fn an_exec_secret_is_rerun_after_its_ttl_and_the_old_value_stays_redacted() {
    let w = exec_world("1s", EXEC_V1);
    w.track("openai", EXEC_V1);
    w.track("openai", EXEC_V2);

    assert_eq!(
        injected(&w, "/v1/one"),
        format!("Bearer {EXEC_V1}"),
        "the helper's stdout, one trailing newline trimmed"
    );

    std::fs::write(w.dir.path().join("value"), format!("{EXEC_V2}\n")).expect("change value");
    // Any value fetched before the change expires 1 s after it was fetched.
    thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        injected(&w, "/v1/two"),
        format!("Bearer {EXEC_V2}"),
        "the exec secret was not refreshed after its 1 s ttl"
    );

    assert_history_redacted(&w, 3);
    w.sweep();
}

#[test]
fn an_exec_helper_runs_on_first_use_and_its_value_is_cached_for_the_ttl() {
    let w = exec_world("5m", EXEC_V1);
    w.track("openai", EXEC_V1);
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        helper_runs(&w),
        0,
        "the helper ran before any request used it"
    );

    for path in ["/v1/a", "/v1/b", "/v1/c"] {
        assert_eq!(injected(&w, path), format!("Bearer {EXEC_V1}"));
    }
    assert_eq!(
        helper_runs(&w),
        1,
        "three requests within the ttl must run the helper once"
    );
    w.sweep();
}

#[test]
fn a_failing_or_hanging_exec_helper_refuses_the_request_without_showing_its_stderr() {
    let w = secrets_world(
        &[],
        |_| {},
        |s| {
            format!(
                r#"
[secrets.flaky]
source = "exec:echo helper-broke-ZQ7 >&2; exit 3"

[secrets.slow]
source  = "exec:sleep 30"
timeout = "1s"

[[rules]]
name  = "flaky"
hosts = ["api.test"]
ports = [{port}]
[rules.inject.headers]
authorization = "Bearer {{{{secret.flaky}}}}"

[[rules]]
name  = "slow"
hosts = ["other.test"]
ports = [{port}]
[rules.inject.headers]
authorization = "Bearer {{{{secret.slow}}}}"
"#,
                port = s.port
            )
        },
    );

    let out = w.curl(&[&w.url("api.test", "/v1/x")]);
    assert_eq!(out.exit, Some(0), "{out:#?}");
    assert_denial(&out.response, 503, None, "secret_unavailable");
    let text = out.response.text();
    assert!(
        text.contains("flaky"),
        "the refusal should name the secret: {text:?}"
    );
    assert!(
        !text.contains("helper-broke-ZQ7"),
        "the helper's stderr reached the sandbox: {text:?}"
    );
    assert!(
        w.lk.wait_stderr_contains("helper-broke-ZQ7", Duration::from_secs(3)),
        "the helper's stderr should be in latchkey's log:\n{}",
        w.lk.stderr_text()
    );

    let started = Instant::now();
    let out = w.curl(&[&w.url("other.test", "/v1/y")]);
    let took = started.elapsed();
    assert_eq!(out.exit, Some(0), "{out:#?}");
    assert_denial(&out.response, 503, None, "secret_unavailable");
    assert!(
        out.response.text().contains("slow"),
        "the refusal should name the secret: {:?}",
        out.response.text()
    );
    assert!(
        took < Duration::from_secs(10),
        "a helper with a 1 s timeout held the request for {took:?}"
    );

    assert_eq!(
        w.upstream.connections(),
        0,
        "a request without its secret was forwarded"
    );
    let records = w.lk.wait_audit(2);
    for (record, rule) in records.iter().zip(["flaky", "slow"]) {
        assert_record(
            record,
            json!({
                "rule": rule,
                "decision": "deny",
                "reason": "secret_unavailable",
                "status": 503,
                "upstream": null,
            }),
        );
    }
    w.sweep();
}

#[test]
fn latchkey_starts_with_a_failing_exec_helper_since_it_only_runs_on_use() {
    // The counterpart of the test above at startup: no run, so no failure, at load.
    let _lk = latchkey()
        .policy(
            "main.toml",
            "[secrets.flaky]\nsource = \"exec:exit 3\"\n\n[[rules]]\nname = \"flaky\"\nhosts = [\"api.test\"]\n[rules.inject.headers]\nauthorization = \"Bearer {{secret.flaky}}\"\n",
        )
        .run();
}

#[test]
fn an_exec_helper_that_echoes_its_value_to_stderr_does_not_leak_it_into_the_log() {
    let w = secrets_world(
        &[],
        |s| std::fs::write(s.dir.join("value"), EXEC_V1).expect("write helper input"),
        |s| {
            format!(
                "[secrets.openai]\nsource = \"exec:echo debug: fetched token $(cat {value}) >&2; cat {value}\"\n{}",
                s.ports(RULE),
                value = s.path("value"),
            )
        },
    );
    w.track("openai", EXEC_V1);
    assert_eq!(injected(&w, "/v1/one"), format!("Bearer {EXEC_V1}"));
    // Give a log line about the helper's stderr the time to be written.
    w.lk.wait_stderr_contains("debug: fetched token", Duration::from_secs(1));
    w.sweep();
}

#[test]
fn an_exec_helper_that_prints_an_empty_or_short_value_refuses_the_request() {
    let w = secrets_world(
        &[],
        |_| {},
        |s| {
            format!(
                r#"
[secrets.empty]
source = "exec:printf ''"

[secrets.short]
source = "exec:echo short"

[[rules]]
name  = "empty"
hosts = ["api.test"]
ports = [{port}]
[rules.inject.headers]
authorization = "Bearer {{{{secret.empty}}}}"

[[rules]]
name  = "short"
hosts = ["other.test"]
ports = [{port}]
[rules.inject.headers]
authorization = "Bearer {{{{secret.short}}}}"
"#,
                port = s.port
            )
        },
    );
    for (host, name) in [("api.test", "empty"), ("other.test", "short")] {
        let out = w.curl(&[&w.url(host, "/v1/x")]);
        assert_eq!(out.exit, Some(0), "{out:#?}");
        assert_denial(&out.response, 503, None, "secret_unavailable");
        assert!(
            out.response.text().contains(name),
            "the refusal should name the secret: {:#?}",
            out.response
        );
    }
    assert!(
        w.upstream.received().is_empty(),
        "a request was forwarded with an empty or short secret: {:#?}",
        w.upstream.received()
    );
    w.sweep();
}

#[test]
fn a_file_secret_emptied_on_disk_is_never_injected_empty() {
    let w = secrets_world(
        &[],
        |s| std::fs::write(s.dir.join("openai.key"), FILE_V1).expect("write secret file"),
        |s| {
            format!(
                "[secrets.openai]\nsource = \"file:{}\"\n{}",
                s.path("openai.key"),
                s.ports(RULE)
            )
        },
    );
    w.track("openai", FILE_V1);
    w.track("openai", FILE_V2);
    let file = w.dir.path().join("openai.key");
    assert_eq!(injected(&w, "/v1/one"), format!("Bearer {FILE_V1}"));

    // A writer that truncates before it writes: latchkey may read the empty file in between.
    std::fs::write(&file, "").expect("truncate secret file");
    thread::sleep(Duration::from_millis(500));
    let out = w.curl(&[&w.url("api.test", "/v1/two")]);
    assert_eq!(out.exit, Some(0), "{out:#?}");
    match out.response.status {
        // Refused: fine, the secret is unavailable.
        503 => assert_denial(&out.response, 503, None, "secret_unavailable"),
        // Or the last good value kept.
        200 => assert_eq!(
            w.received_one("/v1/two").header("authorization"),
            Some(format!("Bearer {FILE_V1}").as_str())
        ),
        _ => panic!("an emptied secret file: {:#?}", out.response),
    }
    for seen in w.received("/v1/two") {
        let auth = seen.header("authorization").unwrap_or_default();
        assert!(
            auth.len() > "Bearer ".len() + 7,
            "an empty or short secret was injected: {auth:?}"
        );
    }

    std::fs::write(&file, FILE_V2).expect("write the new value");
    thread::sleep(Duration::from_millis(500));
    assert_eq!(
        injected(&w, "/v1/three"),
        format!("Bearer {FILE_V2}"),
        "the secret must recover once the file holds a value again"
    );
    w.sweep();
}

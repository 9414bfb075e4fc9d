//! The redaction set across a policy reload and under per-host tokens: a JWT credential whose
//! claims use `{{host}}` mints one token per host; alternating hosts reuses the cached tokens
//! without rebuilding the matcher, and after a reload every value handed out before it — the
//! old tokens and a rotated-out file secret — is still redacted when an upstream reflects it.
//! An `exec:` helper that times out is killed with every process it started.

use std::thread;
use std::time::Duration;

use serde_json::json;

use crate::support::admin::wait_digest_change;
use crate::support::assert_record;
use crate::support::secrets::{assert_no_leak, count, redacted, secrets_world, SecretsWorld};

const JWT_KEY: &str = "jwt-hmac-HYGIENE-test-key-5b7d0e2a9c4f61";
const FILE_V1: &str = "hygiene-file-secret-v1-2f8a61c0";
const FILE_V2: &str = "hygiene-file-secret-v2-9d04be37";
const JWT_NAME: &str = "credential:agent_jwt";
/// Logged (at debug) each time the redaction matcher is built.
const BUILT: &str = "redaction matcher built";

fn policy(secret_file: &str, port: u16, extra: &str) -> String {
    format!(
        r#"
[secrets.openai]
source = "file:{secret_file}"

[credentials.agent_jwt]
kind = "jwt"
alg = "HS256"
key = "env:HYGIENE_JWT_KEY"
ttl = "10m"
[credentials.agent_jwt.claims]
iss = "latchkey"
aud = "{{{{host}}}}"
iat = "{{{{now}}}}"

[[rules]]
name = "jwt"
hosts = ["api.test", "other.test"]
ports = [{port}]
credential = "agent_jwt"

[[rules]]
name = "key"
hosts = ["tunnel.test"]
ports = [{port}]
[rules.inject.headers]
authorization = "Bearer {{{{secret.openai}}}}"
{extra}"#
    )
}

fn world() -> SecretsWorld {
    secrets_world(
        &[
            ("HYGIENE_JWT_KEY", JWT_KEY),
            ("RUST_LOG", "info,latchkey::secrets=debug"),
        ],
        |s| std::fs::write(s.dir.join("openai.key"), FILE_V1).expect("write secret file"),
        |s| policy(&s.path("openai.key"), s.port, ""),
    )
}

/// The bearer token the upstream received on the last request to `path`.
fn bearer(w: &SecretsWorld, path: &str) -> String {
    let seen = w.received(path);
    let last = seen
        .last()
        .unwrap_or_else(|| panic!("nothing reached {path}"));
    last.header("authorization")
        .and_then(|a| a.strip_prefix("Bearer "))
        .unwrap_or_else(|| panic!("no bearer token on {path}: {last:#?}"))
        .to_string()
}

fn builds(w: &SecretsWorld) -> usize {
    w.lk.stderr_text().matches(BUILT).count()
}

#[test]
fn values_handed_out_before_a_reload_stay_redacted_and_alternating_hosts_rebuilds_nothing() {
    let w = world();
    w.track("openai", FILE_V1);
    w.track("openai", FILE_V2);

    // Two hosts, one token each (cached for the ttl), alternating.
    let mut tokens = Vec::new();
    for (i, host) in ["api.test", "other.test"].iter().enumerate() {
        let path = format!("/first/{i}");
        assert_eq!(w.curl_ok(&[&w.url(host, &path)]).status, 200);
        tokens.push(bearer(&w, &path));
    }
    assert_ne!(
        tokens[0], tokens[1],
        "aud = {{{{host}}}}: one token per host"
    );
    for t in &tokens {
        w.track(JWT_NAME, t);
    }
    let before = builds(&w);
    for i in 0..20 {
        let host = ["api.test", "other.test"][i % 2];
        let path = format!("/alt/{i}");
        assert_eq!(w.curl_ok(&[&w.url(host, &path)]).status, 200);
        assert_eq!(bearer(&w, &path), tokens[i % 2], "the cached token");
    }
    assert_eq!(
        builds(&w),
        before,
        "alternating hosts whose tokens are cached must not rebuild the matcher:\n{}",
        w.lk.stderr_text()
    );

    // Rotate the file secret: v1 is retired, v2 in use.
    assert_eq!(w.curl_ok(&[&w.url("tunnel.test", "/key/1")]).status, 200);
    std::fs::write(w.dir.path().join("openai.key"), FILE_V2).expect("rotate secret file");
    thread::sleep(Duration::from_millis(500));
    assert_eq!(w.curl_ok(&[&w.url("tunnel.test", "/key/2")]).status, 200);
    assert_eq!(bearer(&w, "/key/2"), FILE_V2);

    // Reload: a policy change (one more rule) makes a new policy, a new secret store and a new
    // token cache.
    let old = crate::support::admin::digest(&w.lk);
    let dir = w.lk.scratch().join("policies");
    let extra = "\n[[rules]]\nname = \"evil\"\nhosts = [\"evil.test\"]\n";
    let aside = dir.join(".main.toml.new");
    std::fs::write(
        &aside,
        policy(
            w.dir.path().join("openai.key").to_str().expect("UTF-8"),
            w.port(),
            extra,
        ),
    )
    .expect("write policy");
    std::fs::rename(&aside, dir.join("main.toml")).expect("replace policy");
    wait_digest_change(&w.lk, &old);

    // The upstream reflects every credential it ever received: the two old tokens (20 times
    // and more), v1 and v2, and the new token minted after the reload for this request.
    for (host, path) in [("api.test", "/history"), ("tunnel.test", "/history")] {
        let resp = w.curl_ok(&[&w.url(host, path)]);
        assert_eq!(resp.status, 200, "{resp:#?}");
        let text = resp.text();
        let received = w.upstream.received().len();
        let jwt = count(text.as_bytes(), redacted(JWT_NAME).as_bytes());
        let key = count(text.as_bytes(), redacted("openai").as_bytes());
        assert_eq!(
            jwt + key,
            received,
            "every credential the upstream ever received, the ones from before the reload included, must be redacted:\n{text}"
        );
        assert!(key >= 2, "{text}");
        let new_token = bearer(&w, path);
        w.track(JWT_NAME, &new_token);
        assert_no_leak(
            "the /history response after a reload",
            &crate::support::secrets::response_bytes(&resp),
            &w.tracked(),
        );
    }
    let records = w.lk.wait_audit(w.upstream.received().len());
    let last = records.last().expect("a record");
    assert_record(
        last,
        json!({"rule": "key", "status": 200, "secrets": ["openai"]}),
    );
    assert!(
        last["redactions"].as_u64() >= Some(2),
        "the reflected values were counted: {last:#}"
    );
    w.sweep();
}

/// Whether process `pid` runs no more (gone, or a zombie nobody has reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

#[test]
fn a_timed_out_exec_helper_is_killed_with_every_process_it_started() {
    let w = secrets_world(
        &[],
        |_| {},
        |s| {
            format!(
                r#"
[secrets.slow]
source  = "exec:sleep 30 & echo $! >> {pids}; sh -c 'echo $$ >> {pids}; exec sleep 30'"
timeout = "1s"

[[rules]]
name  = "slow"
hosts = ["api.test"]
ports = [{port}]
[rules.inject.headers]
authorization = "Bearer {{{{secret.slow}}}}"
"#,
                pids = s.path("pids"),
                port = s.port
            )
        },
    );
    let out = w.curl(&[&w.url("api.test", "/v1/x")]);
    assert_eq!(out.exit, Some(0), "{out:#?}");
    crate::support::assert_denial(&out.response, 503, None, "secret_unavailable");
    let pids: Vec<u32> = std::fs::read_to_string(w.dir.path().join("pids"))
        .expect("the helper wrote its children's pids")
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    assert_eq!(pids.len(), 2, "{pids:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    for pid in pids {
        while !gone(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "process {pid}, started by the timed-out helper, still runs"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
    assert_eq!(w.upstream.connections(), 0, "forwarded without its secret");
    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"rule": "slow", "decision": "deny", "reason": "secret_unavailable", "status": 503}),
    );
    w.sweep();
}

//! OAuth token capture with a real OAuth client library (authlib) against a local
//! authorization server with a protected API (tests/clients/oauth_flow.py): the client logs
//! in, calls the API and refreshes, end to end, holding placeholders only; no real token
//! appears in what the sandbox sees, in latchkey's logs or in its audit; a placeholder goes
//! only to the hosts the capture binds; captured tokens survive a restart only with a state
//! store.

use std::time::Duration;

use serde_json::Value;

use crate::support::credentials::PyServer;
use crate::support::{latchkey, Latchkey, TestCa};

fn policy(port: u16) -> String {
    format!(
        r#"
[[rules]]
name    = "idp-token"
hosts   = ["api.test"]
ports   = [{port}]
methods = ["POST"]
paths   = ["/oauth/token"]
capture = {{ fields = ["access_token", "refresh_token"], as = "idp" }}

[[rules]]
name    = "api"
hosts   = ["api.test"]
ports   = [{port}]
methods = ["GET"]
paths   = ["/api/**"]

# The same server under another name: the capture does not bind it.
[[rules]]
name    = "elsewhere"
hosts   = ["other.test"]
ports   = [{port}]
methods = ["GET"]
paths   = ["/api/**"]
"#
    )
}

struct World {
    server: PyServer,
    ca: TestCa,
    policy: String,
}

fn world() -> World {
    let ca = TestCa::new();
    let (cert, key) = ca.issue_pem_files(crate::support::ca::UPSTREAM_NAMES, "oauth");
    let server = PyServer::start("oauth_flow.py", &cert, &key, &[]);
    let policy = policy(server.port());
    World { server, ca, policy }
}

fn serve(w: &World, extra: &[&str]) -> Latchkey {
    let mut b = latchkey()
        .upstream_ca(&w.ca)
        .policy("main.toml", &w.policy)
        .pin("api.test")
        .pin("other.test");
    for a in extra {
        b = b.arg(a);
    }
    b.run()
}

fn python(lk: &Latchkey, args: &[&str]) -> Value {
    let mut cmd = std::process::Command::new(crate::support::toolchain::python());
    cmd.arg(format!(
        "{}/tests/clients/oauth_flow.py",
        env!("CARGO_MANIFEST_DIR")
    ))
    .arg(args[0])
    .arg(args[1])
    .arg(lk.ca_pem_path())
    .arg(lk.proxy_url())
    .args(&args[2..]);
    for var in crate::support::latchkey::SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    let out = crate::support::latchkey::wait_with_timeout(&mut cmd, Duration::from_secs(40));
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("oauth client output ({e}): {out:?}"))
}

/// Every token the server issued so far.
fn issued(server: &PyServer) -> Vec<String> {
    server
        .events_of("issued")
        .iter()
        .flat_map(|e| [e["access_token"].clone(), e["refresh_token"].clone()])
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

fn assert_never_shown(tokens: &[String], lk: &Latchkey, seen: &str) {
    assert!(!tokens.is_empty());
    for t in tokens {
        assert!(!seen.contains(t.as_str()), "the sandbox saw {t}: {seen}");
        assert!(!lk.audit_text().contains(t.as_str()), "the audit holds {t}");
        assert!(!lk.stderr_text().contains(t.as_str()), "the log holds {t}");
    }
}

#[test]
fn authlib_logs_in_calls_and_refreshes_holding_placeholders_only() {
    let w = world();
    let lk = serve(&w, &[]);
    let base = format!("https://api.test:{}", w.server.port());
    let out = python(&lk, &["client", &base]);

    assert_eq!(
        out["first"]["access_token"], "__LATCHKEY_idp_access_token__",
        "{out}"
    );
    assert_eq!(
        out["first"]["refresh_token"], "__LATCHKEY_idp_refresh_token__",
        "{out}"
    );
    assert_eq!(out["first"]["expires_in"], 3600, "{out}");
    // A copy of the token the capture does not name is redacted, not passed on.
    assert_eq!(
        out["first"]["session"]["token"], "[REDACTED:idp_access_token]",
        "{out}"
    );
    // The API got the real token, and its reflection of it came back redacted.
    assert_eq!(out["me1"]["status"], 200, "{out}");
    assert_eq!(
        out["me1"]["body"]["seen"], "Bearer [REDACTED:idp_access_token]",
        "{out}"
    );
    // The refresh sent the real refresh token (the server accepts only the one it issued),
    // and the new tokens were captured again: the old access token no longer works upstream,
    // so a 200 means the placeholder now stands for the new one.
    assert_eq!(
        out["refreshed"]["access_token"], "__LATCHKEY_idp_access_token__",
        "{out}"
    );
    assert_eq!(out["me2"]["status"], 200, "{out}");
    let refreshes = w.server.events_of("refresh");
    let first_issued = &w.server.events_of("issued")[0];
    assert_eq!(refreshes.len(), 1);
    assert_eq!(refreshes[0]["received"], first_issued["refresh_token"]);
    assert_eq!(w.server.events_of("issued").len(), 2);

    assert_never_shown(&issued(&w.server), &lk, &out.to_string());

    let records = lk.audit_records();
    let token_records: Vec<&Value> = records
        .iter()
        .filter(|r| r["rule"] == "idp-token")
        .collect();
    assert_eq!(token_records.len(), 2, "{records:#?}");
    for r in &token_records {
        assert_eq!(
            r["captured"],
            serde_json::json!(["idp_access_token", "idp_refresh_token"]),
            "{r}"
        );
    }
    // The refresh request used the captured refresh token; the API calls the access token.
    assert_eq!(
        token_records[1]["secrets"],
        serde_json::json!(["idp_refresh_token"])
    );
    let api: Vec<&Value> = records.iter().filter(|r| r["rule"] == "api").collect();
    assert_eq!(api[0]["secrets"], serde_json::json!(["idp_access_token"]));
    assert!(api[0]["redactions"].as_u64().unwrap_or(0) >= 1);
}

/// A placeholder goes only where the capture binds, and a form-encoded token response is
/// captured too.
#[test]
fn a_captured_token_goes_only_to_the_hosts_the_capture_binds_and_forms_are_captured() {
    let w = world();
    let lk = serve(&w, &[]);
    let base = format!("https://api.test:{}", w.server.port());
    let form = python(&lk, &["form-token", &base]);
    assert_eq!(form["status"], 200, "{form}");
    let body = form["body"].as_str().unwrap_or_default();
    assert!(
        body.contains("access_token=__LATCHKEY_idp_access_token__")
            && body.contains("refresh_token=__LATCHKEY_idp_refresh_token__"),
        "{form}"
    );
    let used = python(&lk, &["use", &base, "__LATCHKEY_idp_access_token__"]);
    assert_eq!(used["status"], 200, "{used}");

    let other = format!("https://other.test:{}", w.server.port());
    let leaked = python(&lk, &["use", &other, "__LATCHKEY_idp_access_token__"]);
    assert_eq!(leaked["status"], 403, "{leaked}");
    assert!(
        leaked["body"]
            .as_str()
            .is_some_and(|b| b.contains("placeholder")),
        "{leaked}"
    );
    let last = w.server.events_of("api");
    assert!(
        last.iter()
            .all(|e| e["auth"] != "Bearer __LATCHKEY_idp_access_token__"),
        "a placeholder reached the server: {last:?}"
    );
    assert_never_shown(&issued(&w.server), &lk, &form.to_string());
}

/// With a state store the captured tokens survive a restart (sealed with the capture key);
/// without one, the placeholder is refused after it.
#[test]
fn captured_tokens_survive_a_restart_only_with_a_state_store() {
    let w = world();
    let dir = tempfile::tempdir().expect("tempdir");
    let state = format!("sqlite:{}", dir.path().join("state.db").display());
    let key = dir.path().join("capture.key");
    let key = key.to_str().expect("utf-8 path");
    let base = format!("https://api.test:{}", w.server.port());

    let lk = serve(&w, &["--state", &state, "--capture-key", key]);
    let form = python(&lk, &["form-token", &base]);
    assert_eq!(form["status"], 200, "{form}");
    drop(lk);
    // The store holds the tokens sealed: not one in the clear.
    let mut db = Vec::new();
    for f in std::fs::read_dir(dir.path()).expect("state dir").flatten() {
        db.extend(std::fs::read(f.path()).unwrap_or_default());
    }
    let db = String::from_utf8_lossy(&db);
    assert!(db.contains("idp_access_token"), "nothing was stored");
    for t in issued(&w.server) {
        assert!(!db.contains(&t), "{t} in the store");
    }

    let lk = serve(&w, &["--state", &state, "--capture-key", key]);
    let used = python(&lk, &["use", &base, "__LATCHKEY_idp_access_token__"]);
    assert_eq!(used["status"], 200, "{used}");
    drop(lk);

    let lk = serve(&w, &[]);
    let used = python(&lk, &["use", &base, "__LATCHKEY_idp_access_token__"]);
    assert_eq!(used["status"], 403, "{used}");
}

/// What `get PATH` (no Authorization header, so no placeholder) showed the sandbox.
fn leaked(lk: &Latchkey, base: &str) -> Value {
    let out = python(lk, &["get", base, "/api/debug"]);
    assert_eq!(out["status"], 200, "{out}");
    out
}

fn assert_redacted(out: &Value) {
    let body: Value = serde_json::from_str(out["body"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("debug body ({e}): {out}"));
    assert_eq!(body["access"], "[REDACTED:idp_access_token]", "{out}");
    assert_eq!(body["refresh"], "[REDACTED:idp_refresh_token]", "{out}");
    let header = out["headers"]["x-debug-token"].as_str().unwrap_or_default();
    assert!(
        header.contains("REDACTED") && !header.contains("at-"),
        "{out}"
    );
}

/// After a restart with a state store, every kept token is in the redaction set before the
/// first connection: an upstream that reflects one (body and header) before any request has
/// used its placeholder shows the sandbox only the redaction mark.
#[test]
fn kept_tokens_are_redacted_from_the_first_response_after_a_restart() {
    let w = world();
    let dir = tempfile::tempdir().expect("tempdir");
    let state = format!("sqlite:{}", dir.path().join("state.db").display());
    let key = dir.path().join("capture.key");
    let key = key.to_str().expect("utf-8 path");
    let base = format!("https://api.test:{}", w.server.port());

    let lk = serve(&w, &["--state", &state, "--capture-key", key]);
    let form = python(&lk, &["form-token", &base]);
    assert_eq!(form["status"], 200, "{form}");
    drop(lk);

    let lk = serve(&w, &["--state", &state, "--capture-key", key]);
    let out = leaked(&lk, &base);
    assert_redacted(&out);
    assert_never_shown(&issued(&w.server), &lk, &out.to_string());
    // Nothing loaded them lazily: the only request carried no placeholder.
    let records = lk.audit_records();
    let api: Vec<&Value> = records.iter().filter(|r| r["rule"] == "api").collect();
    assert_eq!(api.len(), 1, "{records:#?}");
    assert!(
        api[0]["secrets"].as_array().is_none_or(|s| s.is_empty()),
        "{}",
        api[0]
    );
    assert!(
        api[0]["redactions"].as_u64().unwrap_or(0) >= 2,
        "{}",
        api[0]
    );
}

/// Two replicas on one Redis store and one capture key: a token captured through A is
/// redacted by B, which was already running and never saw the token response.
#[test]
fn a_token_captured_by_one_replica_is_redacted_by_the_other() {
    let redis = crate::support::redis::RedisServer::start();
    let w = world();
    let dir = tempfile::tempdir().expect("tempdir");
    let key = dir.path().join("capture.key");
    let key = key.to_str().expect("utf-8 path");
    let state = redis.url();
    let base = format!("https://api.test:{}", w.server.port());
    let a = serve(&w, &["--state", &state, "--capture-key", key]);
    let b = serve(&w, &["--state", &state, "--capture-key", key]);

    let form = python(&a, &["form-token", &base]);
    assert_eq!(form["status"], 200, "{form}");
    let out = leaked(&b, &base);
    assert_redacted(&out);
    assert_never_shown(&issued(&w.server), &b, &out.to_string());
}

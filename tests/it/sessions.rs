//! Runtime sessions: a platform admits each sandbox through the admin API, only ever narrower
//! than a reviewed `[profiles.NAME]`; the sandbox presents its session with real clients (curl,
//! Python `requests` with the session's `env` as returned); every record names the session,
//! its profile, labels and reach; narrowing and per-session limits hold; the token never
//! leaves latchkey but once, in the `201`; a session bound to a source needs no credential; a
//! reload that removes the profile refuses the session's next request; `latchkey sessions`
//! drives the same API from a terminal.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::latchkey::SCRUBBED_ENV;
use crate::support::sessions::{admin_json, create, revoke};
use crate::support::{curl, latchkey, run_cli, Echo, Latchkey, TestCa, Upstream};

const KEY: &str = "sk-session-upstream-key-5c1e9a7d3b";

pub fn policy(port: u16) -> String {
    format!(
        r#"
[secrets.key]
source = "env:LK_SESSION_KEY"

[limits.shared]
requests = "1000/min"

[limits.per-session]
per      = "session"
requests = "2/min"

[limits.roomy]
per      = "session"
requests = "50/min"

[[rules]]
name  = "api"
hosts = ["api.test"]
ports = [{port}]
[rules.inject.headers]
authorization = "Bearer {{{{secret.key}}}}"

[[rules]]
name  = "other"
hosts = ["other.test"]
ports = [{port}]

[[rules]]
name   = "tunnel"
hosts  = ["tunnel.test"]
ports  = [{port}]
tunnel = true

[profiles.agent]
rules          = ["api", "other", "tunnel"]
labels         = {{ tier = "agents" }}
require_labels = ["task"]
ttl            = "1h"
limits         = ["shared"]

[profiles.metered]
rules  = ["other"]
ttl    = "10m"
limits = ["per-session", "roomy"]
"#
    )
}

pub struct World {
    pub lk: Latchkey,
    pub upstream: Upstream,
    pub _ca: TestCa,
}

pub fn world() -> World {
    world_with(Upstream::https, &[])
}

pub fn world_with(upstream: impl FnOnce(&TestCa) -> Upstream, args: &[&str]) -> World {
    let ca = TestCa::new();
    let upstream = upstream(&ca);
    let mut b = latchkey()
        .upstream_ca(&ca)
        .env("LK_SESSION_KEY", KEY)
        .policy("main.toml", &policy(upstream.port()));
    for host in ["api.test", "other.test", "tunnel.test", "evil.test"] {
        b = b.pin(host);
    }
    for a in args {
        b = b.arg(a);
    }
    World {
        lk: b.run(),
        upstream,
        _ca: ca,
    }
}

/// `id:token` for curl's `--proxy-user`.
pub fn user(session: &Value) -> String {
    format!(
        "{}:{}",
        session["id"].as_str().expect("id"),
        session["token"].as_str().expect("token")
    )
}

/// The records naming `path`, once `n` of them are there.
pub fn records_for(lk: &Latchkey, path: &str, n: usize) -> Vec<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found: Vec<Value> = lk
            .audit_records()
            .into_iter()
            .filter(|r| r["path"] == path)
            .collect();
        if found.len() >= n {
            return found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{n} records for {path}: {:#?}",
            lk.audit_records()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn a_session_admits_real_clients_and_every_record_names_it() {
    let w = world();
    let port = w.upstream.port();
    let made = create(
        &w.lk,
        &json!({"profile": "agent", "labels": {"task": "t-17"}, "ttl": "30m"}),
    );
    let id = made["id"].as_str().expect("id").to_string();
    let token = made["token"].as_str().expect("token").to_string();
    assert!(
        id.starts_with("ses_") && token.starts_with("lks_"),
        "{made:#}"
    );
    assert_eq!(made["state"], "live");
    assert_eq!(made["labels"], json!({"task": "t-17", "tier": "agents"}));
    let proxy_url = made["proxy_url"].as_str().expect("proxy_url");
    assert_eq!(
        proxy_url,
        format!("http://{id}:{token}@{}", w.lk.addr()),
        "{made:#}"
    );
    assert_eq!(made["env"]["HTTPS_PROXY"], proxy_url);

    // curl, presenting the session as proxy credentials.
    let url = format!("https://api.test:{port}/v1/curl");
    let out = curl(&w.lk).args(["--proxy-user", &user(&made), &url]).run();
    let echo = Echo::parse(&String::from_utf8_lossy(&out.ok().body));
    // Injected upstream; the echo reflected it, and the sandbox got it redacted.
    assert_eq!(
        echo.header_values("authorization"),
        vec!["Bearer [REDACTED:key]"]
    );
    assert!(echo.header_values("proxy-authorization").is_empty());

    // Python requests, with nothing but the environment the API returned.
    let py = python_with_env(
        &made["env"],
        &format!("https://api.test:{port}/v1/requests"),
    );
    assert!(py.starts_with("200 "), "requests through the session: {py}");
    assert!(!py.contains(KEY), "the sandbox saw the key: {py}");

    for path in ["/v1/curl", "/v1/requests"] {
        let r = &records_for(&w.lk, path, 1)[0];
        assert_eq!(r["session"], id.as_str(), "{r:#}");
        assert_eq!(r["profile"], "agent", "{r:#}");
        assert_eq!(r["identity"], "agent", "{r:#}");
        assert_eq!(
            r["labels"],
            json!({"task": "t-17", "tier": "agents"}),
            "{r:#}"
        );
        assert_eq!(r["reach"], made["reach"], "{r:#}");
        assert_eq!(r["decision"], "allow", "{r:#}");
    }
    // The token left latchkey once, in the 201: never in the log, the audit or a listing.
    assert!(!w.lk.audit_text().contains(&token));
    assert!(!w.lk.stderr_text().contains(&token));
    let (_, listed) = admin_json(&w.lk, "GET", "/sessions?profile=agent", None, None);
    assert!(!listed.to_string().contains(&token), "{listed:#}");
    assert_eq!(listed["sessions"][0]["id"], id.as_str());
    let (_, shown) = admin_json(&w.lk, "GET", &format!("/sessions/{id}"), None, None);
    assert!(!shown.to_string().contains(&token) && shown.get("token").is_none());

    // Without credentials, with a wrong token, with a session id that was never made: 407.
    let bare = curl(&w.lk).args([&url]).run();
    assert_eq!(bare.response.status, 407, "{bare:#?}");
    let wrong = curl(&w.lk)
        .args(["--proxy-user", &format!("{id}:lks_not-the-token"), &url])
        .run();
    assert_eq!(wrong.response.status, 407, "{wrong:#?}");
    let never = curl(&w.lk)
        .args([
            "--proxy-user",
            "ses_0123456789abcdef0123456789abcdef:lks_x",
            &url,
        ])
        .run();
    assert_eq!(never.response.status, 407, "{never:#?}");
    assert!(!w.lk.stderr_text().contains("lks_not-the-token"));
}

/// Runs Python `requests.get(url)` with exactly `env` (the session's) on top of a scrubbed
/// environment: `STATUS BODY`.
pub fn python_with_env(env: &Value, url: &str) -> String {
    let mut cmd = std::process::Command::new(crate::support::toolchain::python());
    cmd.arg("-c").arg(
        "import sys, requests\nr = requests.get(sys.argv[1], timeout=20)\nprint(r.status_code, r.text)",
    );
    cmd.arg(url);
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    for (k, v) in env.as_object().expect("env object") {
        cmd.env(k, v.as_str().expect("string value"));
    }
    let out = crate::support::latchkey::wait_with_timeout(&mut cmd, Duration::from_secs(40));
    assert_eq!(out.code(), Some(0), "python failed: {out:#?}");
    out.stdout.trim().to_string()
}

#[test]
fn narrowing_holds_and_anything_wider_than_the_profile_is_refused_naming_it() {
    let w = world();
    let port = w.upstream.port();
    let narrow = create(
        &w.lk,
        &json!({"profile": "agent", "labels": {"task": "n"}, "narrow": {"hosts": ["api.test"]}}),
    );
    let ok = curl(&w.lk)
        .args([
            "--proxy-user",
            &user(&narrow),
            &format!("https://api.test:{port}/x"),
        ])
        .run();
    assert_eq!(ok.ok().status, 200);
    let other = curl(&w.lk)
        .args([
            "--proxy-user",
            &user(&narrow),
            &format!("https://other.test:{port}/x"),
        ])
        .run();
    // Refused at the CONNECT, before any TLS: curl shows the CONNECT's answer.
    assert_eq!(other.response.status, 403, "{other:#?}");
    assert_eq!(
        other.response.header("x-latchkey-reason"),
        Some("identity_not_allowed")
    );
    assert_eq!(other.response.header("x-latchkey-rule"), Some("other"));
    // The narrowed session's reach is not the profile's.
    let whole = create(&w.lk, &json!({"profile": "agent", "labels": {"task": "w"}}));
    assert_ne!(narrow["reach"], whole["reach"]);

    for (body, status, needles) in [
        (
            json!({"profile": "agent", "labels": {"task": "x"}, "narrow": {"hosts": ["evil.test", "*.test"]}}),
            422,
            vec!["\"evil.test\"", "\"*.test\""],
        ),
        (
            json!({"profile": "agent", "labels": {"task": "x"}, "ttl": "3h"}),
            422,
            vec!["ttl 3h is longer"],
        ),
        (
            json!({"profile": "agent"}),
            422,
            vec!["label \"task\" is required"],
        ),
        (
            json!({"profile": "agent", "labels": {"task": "x", "tier": "root"}}),
            422,
            vec!["label \"tier\" is set by profile"],
        ),
        (
            json!({"profile": "agent", "labels": {"task": "x"}, "narrow": {"secrets": ["nope"]}}),
            422,
            vec!["secret \"nope\""],
        ),
        (
            json!({"profile": "metered", "narrow": {"limits": {"per-session": {"requests": "5/min"}}}}),
            422,
            vec!["limits.per-session.requests"],
        ),
        (
            json!({"profile": "agnet"}),
            404,
            vec!["unknown profile \"agnet\""],
        ),
        (json!({"profile": "agent", "bogus": 1}), 400, vec!["bogus"]),
        (
            json!({"profile": "agent", "labels": {"task": "x"}, "source": "not-an-ip"}),
            400,
            vec!["not-an-ip"],
        ),
    ] {
        let (got, answer) = admin_json(&w.lk, "POST", "/sessions", Some(&body), None);
        assert_eq!(got, status, "{body}: {answer:#}");
        let text = answer["error"].as_str().unwrap_or_default();
        for n in needles {
            assert!(text.contains(n), "{body}: {n:?} not in {text:?}");
        }
    }
    // Nothing was made by the refused requests.
    let (_, listed) = admin_json(&w.lk, "GET", "/sessions", None, None);
    assert_eq!(
        listed["sessions"].as_array().map(Vec::len),
        Some(2),
        "{listed:#}"
    );
}

#[test]
fn limits_count_per_session_and_a_lowered_limit_counts_on_top() {
    let w = world();
    let port = w.upstream.port();
    let url = format!("https://other.test:{port}/m");
    let get = |s: &Value| {
        curl(&w.lk)
            .args(["--proxy-user", &user(s), &url])
            .run()
            .response
            .status
    };
    let a = create(&w.lk, &json!({"profile": "metered"}));
    let b = create(&w.lk, &json!({"profile": "metered"}));
    assert_eq!([get(&a), get(&a), get(&a)], [200, 200, 429]);
    // Another session of the same profile has its own counter.
    assert_eq!([get(&b), get(&b)], [200, 200]);
    // A session whose `roomy` limit was lowered to 1/min is refused at its second request.
    let low = create(
        &w.lk,
        &json!({"profile": "metered", "narrow": {"limits": {"roomy": {"requests": "1/min"}}}}),
    );
    assert_eq!([get(&low), get(&low)], [200, 429]);
    let refused: Vec<Value> = records_for(&w.lk, "/m", 7)
        .into_iter()
        .filter(|r| r["reason"] == "rate_limited")
        .collect();
    assert_eq!(refused.len(), 2, "{refused:#?}");
    let ids: Vec<&str> = refused
        .iter()
        .filter_map(|r| r["session"].as_str())
        .collect();
    assert!(ids.contains(&a["id"].as_str().unwrap_or_default()));
    assert!(ids.contains(&low["id"].as_str().unwrap_or_default()));
}

#[test]
fn a_session_bound_to_a_source_needs_no_credential_and_holds_its_address_alone() {
    let w = world();
    let port = w.upstream.port();
    let bound = create(
        &w.lk,
        &json!({"profile": "agent", "labels": {"task": "b"}, "source": "127.0.0.1"}),
    );
    assert_eq!(bound["source"], "127.0.0.1");
    let out = curl(&w.lk)
        .args([&format!("https://api.test:{port}/bound")])
        .run();
    assert_eq!(out.ok().status, 200);
    let r = &records_for(&w.lk, "/bound", 1)[0];
    assert_eq!(r["session"], bound["id"], "{r:#}");
    let (status, answer) = admin_json(
        &w.lk,
        "POST",
        "/sessions",
        Some(&json!({"profile": "agent", "labels": {"task": "c"}, "source": "127.0.0.1"})),
        None,
    );
    assert_eq!(status, 409, "{answer:#}");
    assert!(answer["error"]
        .as_str()
        .unwrap_or_default()
        .contains("already bound"));
    revoke(&w.lk, bound["id"].as_str().expect("id"));
    let after = curl(&w.lk)
        .args([&format!("https://api.test:{port}/bound")])
        .run();
    assert_eq!(after.response.status, 407, "{after:#?}");
}

#[test]
fn a_reload_that_removes_the_profile_refuses_its_sessions_next_request() {
    let w = world();
    let port = w.upstream.port();
    let s = create(&w.lk, &json!({"profile": "agent", "labels": {"task": "r"}}));
    let url = format!("https://other.test:{port}/r");
    assert_eq!(
        curl(&w.lk)
            .args(["--proxy-user", &user(&s), &url])
            .run()
            .ok()
            .status,
        200
    );
    let without = policy(port).replace(
        "[profiles.agent]\nrules          = [\"api\", \"other\", \"tunnel\"]\nlabels         = { tier = \"agents\" }\nrequire_labels = [\"task\"]\nttl            = \"1h\"\nlimits         = [\"shared\"]\n",
        "",
    );
    assert!(!without.contains("[profiles.agent]"));
    let dir = w.lk.scratch().join("policies");
    std::fs::write(dir.join(".main.toml.new"), without).expect("write policy aside");
    std::fs::rename(dir.join(".main.toml.new"), dir.join("main.toml")).expect("move policy");
    let (status, _) = crate::support::admin::reload(&w.lk);
    assert_eq!(status, 200);
    let out = curl(&w.lk).args(["--proxy-user", &user(&s), &url]).run();
    assert_eq!(out.response.status, 407, "{out:#?}");
    assert_eq!(
        out.response.header("x-latchkey-reason"),
        Some("proxy_auth_required")
    );
    let refused =
        w.lk.audit_records()
            .into_iter()
            .find(|r| r["status"] == 407 && r["session"] == s["id"])
            .unwrap_or_else(|| {
                panic!(
                    "a 407 record naming the session: {:#?}",
                    w.lk.audit_records()
                )
            });
    assert_eq!(refused["profile"], "agent", "{refused:#}");
}

#[test]
fn latchkey_sessions_drives_the_api_from_a_terminal() {
    let w = world();
    let admin = format!("http://{}", w.lk.admin_addr());
    let made = run_cli([
        "sessions",
        "--admin-url",
        &admin,
        "create",
        "--profile",
        "agent",
        "--label",
        "task=cli",
        "--ttl",
        "10m",
        "--host",
        "api.test",
        "--format",
        "json",
    ]);
    assert_eq!(made.code(), Some(0), "{made:#?}");
    let v: Value = serde_json::from_str(&made.stdout).expect("json");
    let id = v["id"].as_str().expect("id");
    assert_eq!(v["narrow"]["hosts"], json!(["api.test"]));
    let list = run_cli(["sessions", "--admin-url", &admin, "list"]);
    assert!(
        list.stdout.contains(id) && list.stdout.contains("live"),
        "{list:#?}"
    );
    assert!(!list.stdout.contains(v["token"].as_str().expect("token")));
    let env = run_cli([
        "sessions",
        "--admin-url",
        &admin,
        "create",
        "--profile",
        "agent",
        "--label",
        "task=e",
        "--format",
        "env",
    ]);
    assert!(
        env.stdout.contains("export HTTPS_PROXY='http://ses_"),
        "{env:#?}"
    );
    let ext = run_cli([
        "sessions",
        "--admin-url",
        &admin,
        "extend",
        id,
        "--ttl",
        "20m",
    ]);
    assert_eq!(ext.code(), Some(0), "{ext:#?}");
    let too_long = run_cli([
        "sessions",
        "--admin-url",
        &admin,
        "extend",
        id,
        "--ttl",
        "2h",
    ]);
    assert_ne!(too_long.code(), Some(0));
    assert!(
        too_long.stderr.contains("longest its profile allows"),
        "{too_long:#?}"
    );
    let rev = run_cli(["sessions", "--admin-url", &admin, "revoke", id]);
    assert_eq!(rev.code(), Some(0), "{rev:#?}");
    let show = run_cli(["sessions", "--admin-url", &admin, "show", id]);
    let shown: Value = serde_json::from_str(&show.stdout).expect("json");
    assert_eq!(shown["state"], "revoked");
    assert_eq!(shown["revoked_by"], "admin");
}

#[test]
fn audit_query_and_summary_find_each_sessions_requests() {
    let w = world();
    let port = w.upstream.port();
    let a = create(
        &w.lk,
        &json!({"profile": "agent", "labels": {"task": "qa"}}),
    );
    let b = create(
        &w.lk,
        &json!({"profile": "agent", "labels": {"task": "qb"}}),
    );
    for (s, n) in [(&a, 2), (&b, 1)] {
        for i in 0..n {
            let url = format!("https://other.test:{port}/q{i}");
            assert_eq!(
                curl(&w.lk)
                    .args(["--proxy-user", &user(s), &url])
                    .run()
                    .ok()
                    .status,
                200
            );
        }
    }
    records_for(&w.lk, "/q0", 2);
    let audit = w.lk.scratch().join("audit.jsonl");
    let audit = audit.display().to_string();
    let id_a = a["id"].as_str().expect("id");
    let q = run_cli([
        "audit",
        "query",
        &audit,
        "--session",
        id_a,
        "--format",
        "json",
    ]);
    assert_eq!(q.code(), Some(0), "{q:#?}");
    let rows: Vec<Value> = q
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(rows.len(), 2, "{rows:#?}");
    assert!(rows.iter().all(|r| r["session"] == id_a));
    let by = run_cli([
        "audit", "summary", &audit, "--by", "session", "--format", "json",
    ]);
    assert_eq!(by.code(), Some(0), "{by:#?}");
    let v: Value = serde_json::from_str(&by.stdout).expect("summary json");
    let groups = v["identities"].as_array().expect("groups");
    let of = |id: &str| {
        groups
            .iter()
            .find(|g| g["session"] == id)
            .unwrap_or_else(|| panic!("no group for {id}: {v:#}"))
    };
    assert_eq!(of(id_a)["requests"], 2);
    assert_eq!(of(b["id"].as_str().expect("id"))["requests"], 1);
    assert_eq!(of(id_a)["identity"], "agent");
    let text = run_cli([
        "audit",
        "summary",
        &audit,
        "--by",
        "session",
        "--profile",
        "agent",
    ]);
    assert!(
        text.stdout.contains(&format!("{id_a} (agent)")),
        "{text:#?}"
    );
}

#[test]
fn the_openai_sdk_and_git_work_through_a_session() {
    use crate::support::upstream::{full_body, handler};
    let w = world_with(
        |ca| {
            Upstream::https_with(
                ca,
                handler(|req| async move {
                    let body = if req.path_only().ends_with("/chat/completions") {
                        r#"{"id":"c1","object":"chat.completion","created":1,"model":"gpt-test","choices":[{"index":0,"message":{"role":"assistant","content":"hello from upstream"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":3,"total_tokens":4}}"#
                    } else {
                        "{}"
                    };
                    http::Response::builder()
                        .header("content-type", "application/json")
                        .body(full_body(body))
                        .expect("response")
                }),
            )
        },
        &[],
    );
    let port = w.upstream.port();
    let s = create(
        &w.lk,
        &json!({"profile": "agent", "labels": {"task": "sdk"}}),
    );
    let mut cmd = std::process::Command::new(crate::support::toolchain::python());
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/openai_chat.py"
    ))
    .arg(format!("https://api.test:{port}/v1"));
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    cmd.env(
        "LATCHKEY_PROXY",
        s["proxy_url"].as_str().expect("proxy_url"),
    )
    .env("LATCHKEY_CA", w.lk.ca_pem_path())
    .env("OPENAI_API_KEY", "not-a-key-latchkey-injects-its-own");
    let out = crate::support::latchkey::wait_with_timeout(&mut cmd, Duration::from_secs(60));
    assert_eq!(out.code(), Some(0), "openai_chat.py: {out:#?}");
    let v: Value = serde_json::from_str(out.stdout.trim()).expect("openai_chat.py JSON");
    assert_eq!(v["content"], "hello from upstream", "{v:#}");
    let r = &records_for(&w.lk, "/v1/chat/completions", 1)[0];
    assert_eq!(r["session"], s["id"], "{r:#}");
    assert_eq!(r["secrets"], json!(["key"]), "{r:#}");

    // git, with the session's proxy in its environment: an HTTPS fetch that reaches the
    // upstream through the session (the echo is no git server: git fails after the request).
    let mut git = std::process::Command::new("git");
    git.args(["ls-remote", &format!("https://api.test:{port}/repo.git")]);
    for var in SCRUBBED_ENV {
        git.env_remove(var);
    }
    git.env("HTTPS_PROXY", s["proxy_url"].as_str().expect("proxy_url"))
        .env("GIT_SSL_CAINFO", w.lk.ca_pem_path())
        .env("GIT_TERMINAL_PROMPT", "0");
    let _ = crate::support::latchkey::wait_with_timeout(&mut git, Duration::from_secs(60));
    let r =
        w.lk.audit_records()
            .into_iter()
            .find(|r| {
                r["path"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("/repo.git/info/refs"))
            })
            .unwrap_or_else(|| panic!("git's request: {:#?}", w.lk.audit_records()));
    assert_eq!(r["session"], s["id"], "{r:#}");
    assert_eq!(r["decision"], "allow", "{r:#}");
}

#[test]
fn profiles_are_reviewed_like_identities_and_a_profiles_widening_is_a_widening() {
    let old = r#"
[[rules]]
name  = "api"
hosts = ["api.test"]

[[rules]]
name  = "other"
hosts = ["other.test"]

[profiles.agent]
rules = ["api"]
ttl   = "1h"
"#;
    let new = old.replace(
        "rules = [\"api\"]\nttl",
        "rules = [\"api\", \"other\"]\nttl",
    );
    assert_ne!(old, new);
    let (a, b) = (
        crate::support::policy_dir(&[("main.toml", old)]),
        crate::support::policy_dir(&[("main.toml", &new)]),
    );
    let path = |d: &tempfile::TempDir| d.path().display().to_string();
    let check = run_cli(["check", "--policies", &path(&a)]);
    assert_eq!(check.code(), Some(0), "{check:#?}");
    // explain treats the profile as an identity: its reach, and a decision under it.
    let reach = run_cli(["explain", "--policies", &path(&a), "--reach", "agent"]);
    assert_eq!(reach.code(), Some(0), "{reach:#?}");
    assert!(
        reach.stdout.contains("rule api: host api.test"),
        "{reach:#?}"
    );
    assert!(!reach.stdout.contains("other.test"), "{reach:#?}");
    let denied = run_cli([
        "explain",
        "--policies",
        &path(&a),
        "--identity",
        "agent",
        "GET",
        "https://other.test/",
    ]);
    assert!(
        denied.stdout.contains("identity_not_allowed"),
        "{denied:#?}"
    );
    // diff: the profile's widening is a widening (exit 3), named under the profile.
    let diff = run_cli(["diff", &path(&a), &path(&b), "--format", "json"]);
    assert_eq!(diff.code(), Some(3), "{diff:#?}");
    let v: Value = serde_json::from_str(&diff.stdout).expect("diff JSON");
    let agent = v["identities"]
        .as_array()
        .and_then(|ids| ids.iter().find(|i| i["identity"] == "agent"))
        .unwrap_or_else(|| panic!("the profile in the diff: {v:#}"));
    assert_eq!(agent["status"], "changed", "{v:#}");
    assert!(diff.stdout.contains("other.test"), "{v:#}");
}

#[test]
fn a_policy_admin_token_must_be_long_and_readable_and_is_named_when_it_is_not() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let tokens = "[admin.tokens.short]\ntoken  = \"env:LK_SHORT_TOKEN\"\nscopes = [\"read\"]\n\n\
                  [admin.tokens.good]\ntoken  = \"env:LK_GOOD_TOKEN\"\nscopes = [\"read\"]\n";
    let lk = latchkey()
        .upstream_ca(&ca)
        .env("LK_SESSION_KEY", KEY)
        .env("LK_SHORT_TOKEN", "tooshort")
        .env("LK_GOOD_TOKEN", "good-token-0a9b8c7d6e5f")
        .policy("main.toml", &policy(upstream.port()))
        .policy("tokens.toml", tokens)
        .run();
    let (short, _) = admin_json(&lk, "GET", "/sessions", None, Some("tooshort"));
    assert_eq!(
        short, 401,
        "a token shorter than 16 characters admits nobody"
    );
    let (good, _) = admin_json(
        &lk,
        "GET",
        "/sessions",
        None,
        Some("good-token-0a9b8c7d6e5f"),
    );
    assert_eq!(good, 200);
    assert!(lk.wait_stderr_contains(
        "[admin.tokens.short] is shorter than 16",
        Duration::from_secs(5)
    ));
    assert!(
        !lk.stderr_text().contains("tooshort"),
        "the value is never logged"
    );
    // An unreadable token source is an error naming the table's field.
    let dir = crate::support::policy_dir(&[(
        "t.toml",
        "[admin.tokens.gone]\ntoken = \"env:LK_NO_SUCH_TOKEN_VAR\"\nscopes = [\"read\"]\n",
    )]);
    let check = run_cli(["check", "--policies", &dir.path().display().to_string()]);
    assert_ne!(check.code(), Some(0));
    let text = format!("{}{}", check.stdout, check.stderr);
    assert!(text.contains("admin.tokens.gone.token"), "{check:#?}");
}

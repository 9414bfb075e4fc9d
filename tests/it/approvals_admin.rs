//! Answering approvals: the admin API behind its token (each mistake its own status, an answer
//! taken once), out of the sandbox's reach through the proxy, the `latchkey approvals` CLI
//! against a running latchkey (its export a policy `check` and `test` accept), and signed
//! one-click links (a GET only shows a page, a POST decides, a tampered link is refused).

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::approvals::{
    agent, approval_header, approvals_cli, ask_policy, ask_world, http_call, send, with_method,
    Admin, AskWorld, Receiver, ADMIN_TOKEN,
};
use crate::support::{assert_denial, assert_record, curl, run_cli};

const SCOPES: &str = r#""once", "1h""#;

fn with_token(
    b: crate::support::latchkey::LatchkeyBuilder,
) -> crate::support::latchkey::LatchkeyBuilder {
    b.arg("--admin-token").arg("env:LK_ADMIN_TOKEN")
}

/// A request held 0 s: its approval id.
fn ask(w: &AskWorld, path: &str, body: &str) -> String {
    let out = send(
        &w.lk,
        Some(&agent()),
        "POST",
        &w.url("api.test", path),
        Some(body),
    );
    assert_denial(out.ok(), 403, Some("prod-writes"), "approval_pending");
    approval_header(out.ok())
}

#[test]
fn the_admin_api_needs_its_token_and_answers_each_mistake_with_its_own_status() {
    let w = ask_world(&ask_policy("0s", SCOPES), with_token);
    let id = ask(&w, "/v1/x", r#"{"x":1}"#);
    let anonymous = Admin::new(w.admin.addr, None);
    let wrong = Admin::new(w.admin.addr, Some("adm-wrong-token-0000000000"));
    for admin in [&anonymous, &wrong] {
        for (method, path) in [
            ("GET", "/approvals".to_string()),
            ("GET", format!("/approvals/{id}")),
            ("GET", "/grants".to_string()),
        ] {
            let resp = admin.call(method, &path, None);
            assert_eq!(
                resp.status, 401,
                "{method} {path} as {:?}: {resp:#?}",
                admin.token
            );
        }
        let resp = admin.answer(&id, &json!({"decision": "approve"}));
        assert_eq!(resp.status, 401, "{resp:#?}");
        assert!(!resp.text().contains(ADMIN_TOKEN));
    }
    assert_eq!(
        w.admin.show(&id)["state"],
        "pending",
        "an unauthenticated answer was taken"
    );

    let missing = w.admin.call("GET", "/approvals/no-such-approval", None);
    assert_eq!(missing.status, 404, "{missing:#?}");
    let missing = w
        .admin
        .answer("no-such-approval", &json!({"decision": "approve"}));
    assert_eq!(missing.status, 404, "{missing:#?}");
    for bad in [
        json!({"decision": "approve", "scope": "2h"}),
        json!({"decision": "approve", "scope": "session"}),
        json!({"decision": "approve", "scope": "forever"}),
        json!({"decision": "maybe"}),
    ] {
        let resp = w.admin.answer(&id, &bad);
        assert_eq!(resp.status, 400, "{bad}: {resp:#?}");
    }
    let resp = w.admin.call("GET", "/approvals?state=bogus", None);
    assert_eq!(resp.status, 400, "{resp:#?}");
    assert_eq!(w.admin.show(&id)["state"], "pending");

    let approved = w.admin.approve(&id, Some("1h"));
    assert_eq!(approved["answer"]["scope"], "1h");
    for again in [json!({"decision": "approve"}), json!({"decision": "deny"})] {
        let resp = w.admin.answer(&id, &again);
        assert_eq!(resp.status, 409, "answering twice ({again}): {resp:#?}");
    }
    assert_eq!(
        w.admin.show(&id)["answer"]["scope"],
        "1h",
        "the second answer changed it"
    );

    // The request and one decision; refused answers leave no record.
    let records = w.lk.wait_audit(2);
    assert_eq!(with_method(&records, "APPROVAL").len(), 1, "{records:#?}");
}

#[test]
fn the_sandbox_cannot_reach_the_admin_api_through_the_proxy_even_to_approve_itself() {
    let admin_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("pick a port");
        l.local_addr().expect("port").port()
    };
    // Unknown destinations are asked about: the admin API must not become one.
    let policy = format!(
        "{}\n[ask]\nunknown = true\nhold = \"0s\"\n",
        ask_policy("0s", SCOPES)
    );
    let w = ask_world(&policy, |b| {
        with_token(b)
            .arg("--admin")
            .arg(&format!("127.0.0.1:{admin_port}"))
    });
    let id = ask(&w, "/v1/self", r#"{"self":true}"#);
    let bearer = format!("Authorization: Bearer {ADMIN_TOKEN}");
    let attempts = [
        (
            "POST",
            format!("http://127.0.0.1:{admin_port}/approvals/{id}"),
            r#"{"decision":"approve"}"#,
        ),
        (
            "GET",
            format!("http://127.0.0.1:{admin_port}/approvals"),
            "",
        ),
        (
            "GET",
            format!("http://localhost:{admin_port}/approvals/{id}"),
            "",
        ),
    ];
    let through_proxy = |method: &str, url: &str, body: &str| {
        let out = curl(&w.lk)
            .args([
                "--proxy-user",
                &agent(),
                "-X",
                method,
                "-H",
                &bearer,
                "-H",
                "content-type: application/json",
                "--data-binary",
                body,
                url,
            ])
            .run();
        let resp = out.ok().clone();
        assert_eq!(
            resp.status, 403,
            "{method} {url} through the proxy: {resp:#?}"
        );
        assert_eq!(resp.header("x-latchkey-decision"), Some("deny"));
        resp
    };
    let mut reasons = Vec::new();
    for (method, url, body) in &attempts {
        let resp = through_proxy(method, url, body);
        reasons.push((
            url.clone(),
            resp.header("x-latchkey-reason").map(str::to_string),
        ));
    }
    // Even if a person approved such a question, the retry must not reach the admin API.
    for a in w.admin.list("pending") {
        if a["port"] == admin_port {
            w.admin.approve(a["id"].as_str().expect("id"), None);
        }
    }
    for (method, url, body) in &attempts {
        through_proxy(method, url, body);
    }
    assert_eq!(
        w.admin.show(&id)["state"],
        "pending",
        "the sandbox approved itself"
    );
    // And it is refused outright, never made something to ask a person about.
    for (url, reason) in &reasons {
        assert_ne!(
            reason.as_deref(),
            Some("approval_pending"),
            "{url}: the admin API became something to ask about"
        );
    }
    assert_eq!(w.admin.list("all").len(), 1, "{:#?}", w.admin.list("all"));
    let records = w.lk.wait_audit(7);
    for r in records.iter().filter(|r| r["port"] == admin_port) {
        assert_record(r, json!({"decision": "deny", "upstream": null}));
        assert!(r.get("approval").is_none(), "{r:#}");
    }
}

/// The approvals in `latchkey approvals list --json` output (an object with `approvals`, or an
/// array).
fn listed(stdout: &str) -> Vec<Value> {
    let v: Value = serde_json::from_str(stdout)
        .unwrap_or_else(|e| panic!("`approvals list --json` printed no JSON ({e}): {stdout}"));
    match v {
        Value::Array(a) => a,
        Value::Object(ref o) if o.contains_key("approvals") => {
            v["approvals"].as_array().expect("approvals array").clone()
        }
        other => panic!("`approvals list --json`: {other:#}"),
    }
}

#[test]
fn the_approvals_cli_lists_shows_approves_denies_and_exports_tested_rules() {
    let w = ask_world(&ask_policy("0s", SCOPES), with_token);
    let first = ask(&w, "/v1/cli-a", r#"{"a":1}"#);
    let second = ask(&w, "/v1/cli-b", r#"{"b":2}"#);

    let out = approvals_cli(&w.admin, &["list", "--json"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let ids: Vec<_> = listed(&out.stdout)
        .iter()
        .map(|a| a["id"].clone())
        .collect();
    assert_eq!(ids, [json!(second), json!(first)], "newest first: {out:#?}");
    let out = approvals_cli(&w.admin, &["list"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(
        out.stdout.contains(&first) && out.stdout.contains(&second),
        "{out:#?}"
    );
    let out = approvals_cli(&w.admin, &["show", &first]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(
        out.stdout.contains(&first) && out.stdout.contains("prod-writes"),
        "{out:#?}"
    );
    assert!(out.stdout.contains("/v1/cli-a"), "{out:#?}");

    let out = approvals_cli(
        &w.admin,
        &[
            "approve",
            &first,
            "--scope",
            "1h",
            "--note",
            "release day",
            "--by",
            "ana",
        ],
    );
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let a = w.admin.show(&first);
    assert_eq!(a["state"], "approved");
    assert_eq!(
        a["answer"],
        json!({"decision": "approve", "scope": "1h", "note": "release day",
        "by": "ana", "at": a["answer"]["at"].clone()})
    );
    let out = approvals_cli(&w.admin, &["deny", &second, "--note", "no"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert_eq!(w.admin.show(&second)["state"], "denied");

    // Mistakes fail with a message, not a success.
    let out = approvals_cli(&w.admin, &["approve", &first]);
    assert_ne!(out.code(), Some(0), "approving twice succeeded: {out:#?}");
    let out = approvals_cli(&Admin::new(w.admin.addr, None), &["list"]);
    assert_ne!(out.code(), Some(0), "no token, yet listed: {out:#?}");
    assert!(!out.stderr.contains(ADMIN_TOKEN));
    let out = approvals_cli(&w.admin, &["show", "no-such-approval"]);
    assert_ne!(out.code(), Some(0), "{out:#?}");

    // The 1h grant works and exports as a rule with its test case.
    let retry = send(
        &w.lk,
        Some(&agent()),
        "POST",
        &w.url("api.test", "/v1/cli-c"),
        Some("{}"),
    );
    assert_eq!(retry.ok().status, 200, "{retry:#?}");
    let dir = tempfile::tempdir().expect("export dir");
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(policies.join("tests")).expect("policies/tests");
    let rules = policies.join("granted.toml");
    let cases = policies.join("tests").join("granted.toml");
    let out = approvals_cli(
        &w.admin,
        &[
            "export",
            "--out",
            rules.to_str().expect("utf-8"),
            "--tests",
            cases.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let exported = std::fs::read_to_string(&rules).expect("exported rules");
    assert!(
        exported.contains("[[rules]]") && exported.contains("api.test"),
        "{exported}"
    );
    let tests = std::fs::read_to_string(&cases).expect("exported tests");
    assert!(tests.contains("[[cases]]"), "{tests}");
    // As a change request would: the identity gets the exported rule.
    let granted = exported
        .lines()
        .find_map(|l| {
            l.strip_prefix("name = \"")
                .and_then(|n| n.strip_suffix('"'))
        })
        .unwrap_or_else(|| panic!("no rule name in the export: {exported}"));
    std::fs::write(
        policies.join("identities.toml"),
        format!("[identities.agent]\ntoken = \"env:AGENT_TOKEN\"\nrules = [\"{granted}\"]\n"),
    )
    .expect("write identities");
    let check = run_cli([
        "check",
        "--no-secrets",
        "--policies",
        policies.to_str().expect("utf-8"),
    ]);
    assert_eq!(
        check.code(),
        Some(0),
        "check on the export:\n{exported}\n{check:#?}"
    );
    let test = run_cli(["test", "--policies", policies.to_str().expect("utf-8")]);
    assert_eq!(
        test.code(),
        Some(0),
        "test on the export:\n{exported}\n{tests}\n{test:#?}"
    );

    let records = w.lk.wait_audit(5);
    let decisions = with_method(&records, "APPROVAL");
    assert_eq!(decisions.len(), 2, "{records:#?}");
    assert!(decisions
        .iter()
        .any(|r| r["approval"]["by"] == "ana" && r["reason"] == "allowed"));
    assert!(decisions.iter().any(|r| r["reason"] == "approval_denied"));
}

/// `path?query` of a link on the admin listener, after checking it points there.
fn on_admin(link: &str, admin: &Admin) -> String {
    let rest = link
        .strip_prefix(&admin.url())
        .unwrap_or_else(|| panic!("link {link} is not on the admin listener {}", admin.url()));
    assert!(rest.starts_with("/approvals/"), "{link}");
    rest.to_string()
}

#[test]
fn a_signed_link_shows_a_page_on_get_decides_on_post_and_is_refused_when_tampered_with() {
    let receiver = Receiver::start();
    let policy = format!(
        "{}\n[notify.ops]\nurl = \"{}\"\n",
        ask_policy("0s", SCOPES),
        receiver.url()
    );
    let w = ask_world(&policy, with_token);
    let id = ask(&w, "/v1/link", r#"{"l":1}"#);
    let delivery = receiver.wait_for(Duration::from_secs(10), |v| {
        v["event"] == "approval.requested" && v["approval"]["id"] == id.as_str()
    });
    assert_eq!(
        delivery.header("x-latchkey-event"),
        Some("approval.requested")
    );
    let body = delivery.json();
    let approve = body["links"]["approve"]["1h"]
        .as_str()
        .unwrap_or_else(|| panic!("no 1h approve link: {body:#}"))
        .to_string();
    let deny = body["links"]["deny"]
        .as_str()
        .expect("deny link")
        .to_string();
    let approve = on_admin(&approve, &w.admin);
    let deny = on_admin(&deny, &w.admin);
    let tamper = |link: &str| {
        let mut s = link.to_string();
        let last = s.pop().expect("non-empty link");
        s.push(if last == '0' { '1' } else { '0' });
        s
    };

    // A GET (a chat app's prefetch) only shows the confirmation page: no token needed.
    for link in [&approve, &deny] {
        let page = http_call(w.admin.addr, "GET", link, &[], b"");
        assert_eq!(page.status, 200, "GET {link}: {page:#?}");
        assert!(
            page.header("content-type")
                .unwrap_or_default()
                .starts_with("text/html"),
            "{page:#?}"
        );
        assert!(
            page.text().contains("<form"),
            "no confirmation button: {page:#?}"
        );
    }
    assert_eq!(w.admin.show(&id)["state"], "pending", "a GET decided");

    // A tampered or re-targeted link is refused, GET and POST.
    let other_id = approve.replacen(&id, "0000000000000000", 1);
    for bad in [
        tamper(&approve),
        tamper(&deny),
        other_id,
        approve.replace("1h", "once"),
    ] {
        for method in ["GET", "POST"] {
            let resp = http_call(w.admin.addr, method, &bad, &[], b"");
            assert_eq!(resp.status, 403, "{method} {bad}: {resp:#?}");
        }
    }
    assert_eq!(w.admin.show(&id)["state"], "pending", "a bad link decided");

    // The POST decides, as `link`.
    let resp = http_call(w.admin.addr, "POST", &approve, &[], b"");
    assert_eq!(resp.status, 200, "POST {approve}: {resp:#?}");
    let a = w.admin.show(&id);
    assert_eq!(a["state"], "approved", "{a:#}");
    assert_eq!(a["answer"]["scope"], "1h");
    assert_eq!(a["answer"]["by"], "link");
    let again = http_call(w.admin.addr, "POST", &deny, &[], b"");
    assert_eq!(again.status, 409, "a second answer by link: {again:#?}");

    let retry = send(
        &w.lk,
        Some(&agent()),
        "POST",
        &w.url("api.test", "/v1/link"),
        Some(r#"{"l":1}"#),
    );
    assert_eq!(retry.ok().status, 200, "{retry:#?}");
    let records = w.lk.wait_audit(3);
    let decision = with_method(&records, "APPROVAL");
    assert_eq!(decision.len(), 1, "{records:#?}");
    assert_eq!(decision[0]["approval"]["by"], "link");
    receiver.wait_for(Duration::from_secs(10), |v| {
        v["event"] == "approval.decided" && v["approval"]["id"] == id.as_str()
    });
}

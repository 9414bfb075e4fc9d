//! The admin API against its OpenAPI document (`crates/admin/openapi.json`, served at
//! `GET /openapi.json`): the document lists exactly the router's paths and methods; every
//! operation is called, each success and the main mistakes, and every answer's status, content
//! type and body are checked against the document (`support::openapi`); each operation's
//! `x-latchkey-scope` is the scope the API enforces (a token with only that scope may, one with
//! every other scope may not). Scoped `[admin.tokens.NAME]` tokens next to `--admin-token`, and
//! a session's token never shown again.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::approvals::{
    approval_header, ask_world, http_call, send, slack_buttons, slack_payload, slack_post,
    slack_signature, unix_now, AskWorld, Receiver, ADMIN_TOKEN, AGENT_TOKEN,
};
use crate::support::assert_denial;
use crate::support::clients::RawResponse;
use crate::support::openapi::{
    scoped_tokens_toml, with_scoped_tokens, Api, Body, Spec, Tok, SCOPES,
};

/// What the router in `crates/admin/src/lib.rs` (and `approvals.rs`, `sessions.rs`) serves:
/// each path and the methods it answers other than with 404 or 405.
const ROUTER: &[(&str, &[&str])] = &[
    ("/healthz", &["GET"]),
    ("/readyz", &["GET"]),
    ("/metrics", &["GET"]),
    ("/status", &["GET"]),
    ("/reload", &["POST"]),
    ("/explain", &["GET"]),
    ("/limits", &["GET"]),
    ("/approvals", &["GET"]),
    ("/approvals/{id}", &["GET", "POST"]),
    ("/approvals/{id}/answer", &["GET", "POST"]),
    ("/grants", &["GET"]),
    ("/sessions", &["GET", "POST"]),
    ("/sessions/{id}", &["GET", "DELETE"]),
    ("/sessions/{id}/extend", &["POST"]),
    ("/slack/actions/{name}", &["POST"]),
    ("/openapi.json", &["GET"]),
];

/// An ask rule (`prod-writes`, held 0 s), a rule charged to `[limits.api]`, identity `bot`,
/// profile `agent` (labels, a required label, a TTL, limits, sources), and a notifier at
/// `RECEIVER` so approvals carry signed links, and a Slack notifier answered from its buttons
/// (`[notify.chat]`, at the same receiver). `PORT` is the upstream's.
const POLICY: &str = r#"
[limits.api]
requests    = "100/min"
concurrency = 4

[[rules]]
name    = "prod-writes"
hosts   = ["api.test"]
ports   = [PORT]
methods = ["POST"]
ask     = { hold = "0s", scope = ["once", "1h"], message = "Production write" }

[[rules]]
name    = "reads"
hosts   = ["api.test"]
ports   = [PORT]
methods = ["GET"]
limits  = ["api"]

[identities.bot]
token  = "env:AGENT_TOKEN"
rules  = ["prod-writes", "reads"]
labels = { team = "infra" }

[profiles.agent]
rules          = ["reads"]
labels         = { tier = "agents" }
require_labels = ["task"]
ttl            = "2h"
limits         = ["api"]
sources        = ["10.0.0.0/8"]

[notify.ops]
url = "RECEIVER"

[notify.chat]
url            = "RECEIVER"
format         = "slack"
signing_secret = "env:SLACK_SIGNING_SECRET"
"#;

/// The signing secret of `[notify.chat]`.
const SLACK_SECRET: &str = "slack-openapi-it-2b7c9d1e3f5a";

/// A request `prod-writes` holds for a person (0 s): its approval id.
fn ask(w: &AskWorld, path: &str) -> String {
    let out = send(
        &w.lk,
        Some(&format!("bot:{AGENT_TOKEN}")),
        "POST",
        &w.url("api.test", path),
        Some(r#"{"write":1}"#),
    );
    assert_denial(out.ok(), 403, Some("prod-writes"), "approval_pending");
    approval_header(out.ok())
}

/// The one-click links of approval `id` (approve with 1h, deny), as paths on the admin
/// listener.
fn links(receiver: &Receiver, id: &str, addr: std::net::SocketAddr) -> (String, String) {
    let d = receiver.wait_for(Duration::from_secs(10), |v| {
        v["event"] == "approval.requested" && v["approval"]["id"] == id
    });
    let body = d.json();
    let base = format!("http://{addr}");
    let path = |v: &Value| {
        v.as_str()
            .and_then(|l| l.strip_prefix(&base))
            .unwrap_or_else(|| panic!("link {v} is not on the admin listener {base}"))
            .to_string()
    };
    (
        path(&body["links"]["approve"]["1h"]),
        path(&body["links"]["deny"]),
    )
}

#[test]
fn the_document_lists_exactly_the_routers_operations_each_with_its_scope_and_schemas() {
    let spec = Spec::load();
    let router: std::collections::BTreeSet<(String, String)> = ROUTER
        .iter()
        .flat_map(|(p, ms)| ms.iter().map(|m| (p.to_string(), m.to_string())))
        .collect();
    let served: std::collections::BTreeSet<String> =
        ROUTER.iter().map(|(p, _)| p.to_string()).collect();
    assert_eq!(
        spec.paths(),
        served,
        "the document's paths differ from the router's"
    );
    let documented = spec.operations();
    assert_eq!(
        documented,
        router,
        "the document's operations differ from the router's:\nonly documented: {:?}\nonly served: {:?}",
        documented.difference(&router).collect::<Vec<_>>(),
        router.difference(&documented).collect::<Vec<_>>()
    );
    assert_eq!(spec.doc["openapi"], "3.1.0");
    assert!(
        spec.doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer",
        "no bearer scheme"
    );
    let open = [
        ("/healthz", "GET"),
        ("/readyz", "GET"),
        ("/approvals/{id}/answer", "GET"),
        ("/approvals/{id}/answer", "POST"),
        ("/slack/actions/{name}", "POST"),
    ];
    for (path, method) in &documented {
        let op = &spec.doc["paths"][path][method.to_lowercase()];
        let scope = op.get("x-latchkey-scope").and_then(Value::as_str);
        if open.contains(&(path.as_str(), method.as_str())) {
            assert_eq!(op["security"], json!([]), "{method} {path} needs no token");
            assert_eq!(scope, None, "{method} {path} needs no scope");
        } else {
            assert!(
                scope.is_some_and(|s| SCOPES.contains(&s)) && op.get("security").is_none(),
                "{method} {path} must name its scope: {op:#}"
            );
            for status in ["401", "403"] {
                assert!(
                    op["responses"].get(status).is_some(),
                    "{method} {path}: {status}"
                );
            }
        }
    }
    // Every schema compiles (against the 2020-12 meta-schema), references and all.
    for name in spec.doc["components"]["schemas"]
        .as_object()
        .expect("schemas")
        .keys()
    {
        let schema = json!({"$ref": format!("#/components/schemas/{name}")});
        if let Err(e) = spec.compile(&schema) {
            panic!("{name}: {e}");
        }
    }
}

/// An answer as the checker sees it.
fn answer(status: u16, content_type: Option<&str>, body: &str) -> RawResponse {
    RawResponse {
        status,
        headers: content_type
            .map(|ct| vec![("content-type".to_string(), ct.to_string())])
            .unwrap_or_default(),
        body: body.as_bytes().to_vec(),
    }
}

#[test]
fn the_checker_refuses_an_undocumented_field_status_content_type_or_missing_field() {
    let spec = Spec::load();
    let session = json!({
        "id": format!("ses_{}", "0".repeat(32)), "profile": "agent", "state": "live",
        "labels": {"task": "t"}, "created_at": "2026-01-01T00:00:00Z",
        "expires_at": "2026-01-01T01:00:00Z", "max_expires_at": "2026-01-01T02:00:00Z",
        "narrow": {}, "reach": "r", "created_by": "admin",
    });
    let path = format!("/sessions/{}", session["id"].as_str().expect("id"));
    let ok = answer(200, Some("application/json"), &session.to_string());
    spec.check("GET", &path, &ok).expect("a valid session view");
    let mut leaky = session.clone();
    leaky["token"] = json!("lks_x");
    let mut gone = session.clone();
    gone["state"] = json!("gone");
    let mut stale = session.clone();
    stale["created_at"] = json!("yesterday");
    let json_ct = Some("application/json");
    let bad = [
        (
            "an undocumented field",
            "GET",
            path.as_str(),
            answer(200, json_ct, &leaky.to_string()),
        ),
        (
            "an undocumented status",
            "GET",
            path.as_str(),
            answer(418, json_ct, r#"{"error":"x"}"#),
        ),
        (
            "a text body where JSON is documented",
            "GET",
            path.as_str(),
            answer(200, Some("text/plain"), "ok\n"),
        ),
        (
            "a missing field",
            "GET",
            path.as_str(),
            answer(200, json_ct, r#"{"id":"ses_x"}"#),
        ),
        (
            "an extra error field",
            "GET",
            "/sessions/x",
            answer(404, json_ct, r#"{"error":"x","why":1}"#),
        ),
        (
            "a state not in the enum",
            "GET",
            "/sessions",
            answer(200, json_ct, &json!({"sessions": [gone]}).to_string()),
        ),
        (
            "a timestamp that is not RFC 3339",
            "GET",
            "/sessions",
            answer(200, json_ct, &json!({"sessions": [stale]}).to_string()),
        ),
        (
            "a body on 204",
            "DELETE",
            path.as_str(),
            answer(204, json_ct, "{}"),
        ),
        (
            "another text",
            "GET",
            "/healthz",
            answer(200, Some("text/plain"), "fine\n"),
        ),
        (
            "a 401 without WWW-Authenticate",
            "GET",
            "/status",
            answer(401, Some("text/plain"), "admin token required\n"),
        ),
        (
            "an undocumented path",
            "GET",
            "/nope",
            answer(200, Some("text/plain"), "ok\n"),
        ),
    ];
    for (what, method, path, resp) in bad {
        assert!(
            spec.check(method, path, &resp).is_err(),
            "the checker took {what}: {method} {path} {resp:#?}"
        );
    }
}

#[test]
fn every_admin_answer_matches_the_openapi_document() {
    let receiver = Receiver::start();
    let policy = format!(
        "{}\n{}",
        POLICY.replace("RECEIVER", &receiver.url()),
        scoped_tokens_toml()
    );
    let w = ask_world(&policy, |b| {
        with_scoped_tokens(b).env("SLACK_SIGNING_SECRET", SLACK_SECRET)
    });
    let api = Api {
        addr: w.lk.admin_addr(),
        spec: Spec::load(),
    };
    refusals(&api);
    fixed_paths(&api, &w);
    // Before `approvals`, whose 1h grant would let the request through unasked.
    slack(&api, &w, &receiver);
    approvals(&api, &w, &receiver);
    sessions(&api);
    reload(&api, &w);

    // The router's own list of paths (its 404) is the document's.
    let resp = api.unchecked(Tok::Full, "GET", "/nope", Body::Empty);
    assert_eq!(resp.status, 404, "{resp:#?}");
    let listed: Vec<String> = resp
        .text()
        .trim()
        .trim_start_matches("not found: try ")
        .split(", ")
        .map(str::to_string)
        .collect();
    let paths = api.spec.paths();
    for p in &listed {
        assert!(
            paths.contains(p),
            "the router lists {p}, the document does not"
        );
    }

    // Every documented operation was called, and answered with a success at least once.
    let seen = api.spec.seen();
    for (path, method) in api.spec.operations() {
        assert!(
            seen.iter()
                .any(|(p, m, s)| *p == path && *m == method && (200..300).contains(s)),
            "{method} {path} was never answered with a success; seen: {seen:#?}"
        );
    }
}

/// Every operation that needs a token refuses none or a wrong one (401), and one with every
/// scope but the one it documents (403, naming that scope): before doing anything.
fn refusals(api: &Api) {
    for (path, method) in api.spec.operations() {
        let path = path.replace("{id}", "x");
        let Some(scope) = api.spec.scope(&method, &path) else {
            continue;
        };
        for tok in [Tok::None, Tok::Wrong] {
            let resp = api.call(tok, &method, &path, Body::Empty);
            assert_eq!(resp.status, 401, "{method} {path} as {tok:?}: {resp:#?}");
        }
        let resp = api.call(Tok::Lacking, &method, &path, Body::Empty);
        assert_eq!(
            resp.status, 403,
            "{method} {path} without {scope}: {resp:#?}"
        );
        let error = serde_json::from_slice::<Value>(&resp.body).expect("JSON")["error"].clone();
        assert!(
            error
                .as_str()
                .is_some_and(|e| e.contains(&format!("{scope:?}"))),
            "the 403 of {method} {path} does not name {scope}: {error}"
        );
    }
    // A method a path does not list needs a token all the same.
    let resp = api.call(Tok::None, "POST", "/healthz", Body::Empty);
    assert_eq!(resp.status, 401, "{resp:#?}");
}

/// The endpoints of fixed paths, and the methods they do not take.
fn fixed_paths(api: &Api, w: &AskWorld) {
    for path in ["/healthz", "/readyz"] {
        for tok in [Tok::None, Tok::Wrong] {
            let resp = api.call(tok, "GET", path, Body::Empty);
            assert_eq!(resp.status, 200, "{path} as {tok:?}: {resp:#?}");
        }
    }
    // A request charged to [limits.api], so /limits has counters.
    let out = send(
        &w.lk,
        Some(&format!("bot:{AGENT_TOKEN}")),
        "GET",
        &w.url("api.test", "/v1/read"),
        None,
    );
    assert_eq!(out.ok().status, 200, "{out:#?}");
    api.expect(200, "GET", "/metrics", Body::Empty);
    let status = api.expect(200, "GET", "/status", Body::Empty);
    assert!(status["state"].is_object(), "{status:#}");
    let limits = api.expect(200, "GET", "/limits", Body::Empty);
    assert!(
        limits["counters"].as_array().is_some_and(|c| !c.is_empty()),
        "no counters: {limits:#}"
    );
    let url = |path: &str| format!("https://api.test:{}{path}", w.port());
    let allow = api.expect(
        200,
        "GET",
        &format!("/explain?method=GET&url={}&identity=bot", url("/v1/r")),
        Body::Empty,
    );
    assert_eq!(allow["decision"], "allow", "{allow:#}");
    assert!(
        allow["limits"].as_array().is_some_and(|l| !l.is_empty()),
        "{allow:#}"
    );
    let asks = api.expect(
        200,
        "GET",
        &format!("/explain?method=POST&url={}&identity=bot", url("/v1/w")),
        Body::Empty,
    );
    assert_eq!(asks["decision"], "ask", "{asks:#}");
    api.expect(400, "GET", "/explain?method=GET", Body::Empty);
    // What the request carries reaches the decision; a header without a colon is refused.
    let carried = api.expect(
        200,
        "GET",
        &format!(
            "/explain?method=GET&url={}&identity=bot&header=x-a%3A+1&content_type=application%2Fjson&body=%7B%7D",
            url("/v1/r")
        ),
        Body::Empty,
    );
    assert_eq!(carried["decision"], "allow", "{carried:#}");
    api.expect(
        400,
        "GET",
        &format!("/explain?method=GET&url={}&header=nocolon", url("/v1/r")),
        Body::Empty,
    );
    api.expect(
        400,
        "GET",
        &format!("/explain?method=GET&url={}&identity=nobody", url("/")),
        Body::Empty,
    );
    api.expect(
        400,
        "GET",
        "/explain?method=GET&url=not%20a%20url",
        Body::Empty,
    );
    let served = api.call(Tok::Scoped, "GET", "/openapi.json", Body::Empty);
    assert_eq!(served.status, 200, "{served:#?}");
    assert!(
        served.body == api.spec.text.as_bytes(),
        "GET /openapi.json is not the checked-in file"
    );
    for (method, path) in [
        ("POST", "/healthz"),
        ("PUT", "/readyz"),
        ("POST", "/metrics"),
        ("DELETE", "/status"),
        ("GET", "/reload"),
        ("POST", "/explain"),
        ("PUT", "/limits"),
        ("POST", "/openapi.json"),
    ] {
        api.expect(405, method, path, Body::Empty);
    }
}

/// Approvals: listed, shown, answered (JSON and form), refused; the signed links; grants.
fn approvals(api: &Api, w: &AskWorld, receiver: &Receiver) {
    // Asked before any answer: the 1h grant below covers every later request to the host.
    let [id, two, three] = ["/v1/one", "/v1/two", "/v1/three"].map(|p| ask(w, p));
    let (approve_link, deny_link) = links(receiver, &id, api.addr);
    let listed = api.expect(200, "GET", "/approvals", Body::Empty);
    assert!(
        listed["approvals"]
            .as_array()
            .is_some_and(|a| !a.is_empty()),
        "{listed:#}"
    );
    for state in ["pending", "approved", "denied", "expired", "all"] {
        api.expect(
            200,
            "GET",
            &format!("/approvals?state={state}"),
            Body::Empty,
        );
    }
    api.expect(400, "GET", "/approvals?state=bogus", Body::Empty);
    let shown = api.expect(200, "GET", &format!("/approvals/{id}"), Body::Empty);
    assert_eq!(shown["state"], "pending", "{shown:#}");
    api.expect(404, "GET", "/approvals/no-such-approval", Body::Empty);
    let answer_path = format!("/approvals/{id}");
    for bad in [
        "{",
        r#"{"decision":"maybe"}"#,
        r#"{"decision":"approve","x":1}"#,
        "scope=1h",
    ] {
        api.expect(400, "POST", &answer_path, Body::Raw(bad));
    }
    let approve = Body::Json(json!({"decision": "approve"}));
    api.expect(404, "POST", "/approvals/no-such-approval", approve);

    // The signed link: a page on GET, refused when tampered with, answers on POST, once.
    let page = api.call(Tok::None, "GET", &approve_link, Body::Empty);
    assert_eq!(page.status, 200, "{page:#?}");
    let tampered = approve_link.replace("1h", "once");
    for method in ["GET", "POST", "PUT"] {
        let resp = api.call(Tok::None, method, &tampered, Body::Empty);
        assert_eq!(resp.status, 403, "{method} a tampered link: {resp:#?}");
    }
    let resp = api.call(Tok::None, "PUT", &approve_link, Body::Empty);
    assert_eq!(resp.status, 405, "{resp:#?}");
    let resp = api.call(Tok::None, "POST", &approve_link, Body::Empty);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let resp = api.call(Tok::None, "POST", &deny_link, Body::Empty);
    assert_eq!(resp.status, 409, "{resp:#?}");
    let again = Body::Json(json!({"decision": "deny"}));
    api.expect(409, "POST", &answer_path, again);

    // Answered by the API: JSON, then a form.
    let body = json!({"decision": "approve", "scope": "once", "note": "ok", "by": "ana"});
    let answered = api.expect(200, "POST", &format!("/approvals/{two}"), Body::Json(body));
    assert_eq!(answered["answer"]["by"], "ana", "{answered:#}");
    let form = Body::Form("decision=deny&note=not+today");
    let denied = api.expect(200, "POST", &format!("/approvals/{three}"), form);
    assert_eq!(denied["state"], "denied", "{denied:#}");
    api.expect(200, "GET", "/approvals?state=all", Body::Empty);

    let grants = api.expect(200, "GET", "/grants", Body::Empty);
    assert!(
        grants["grants"].as_array().is_some_and(|g| !g.is_empty()),
        "{grants:#}"
    );
    api.expect(405, "PUT", "/approvals", Body::Empty);
    api.expect(405, "POST", "/grants", Body::Empty);
    api.expect(404, "DELETE", &answer_path, Body::Empty);
}

/// `POST /slack/actions/NAME`: a signed click answers; forged, misaddressed and malformed ones
/// are refused, each as documented.
fn slack(api: &Api, w: &AskWorld, receiver: &Receiver) {
    let id = ask(w, "/v1/slack");
    let d = receiver.wait_for(Duration::from_secs(10), |v| {
        v.get("blocks").is_some() && v.to_string().contains(&id)
    });
    let buttons = slack_buttons(&d.json());
    let value = &buttons[0].1;
    let respond_to = format!("http://{}/actions/T0/1/x", receiver.addr);
    let checked = |notifier: &str, ts: Option<u64>, sig: Option<&str>, body: &str, status| {
        let resp = slack_post(api.addr, notifier, ts, sig, body);
        api.spec
            .assert("POST", &format!("/slack/actions/{notifier}"), &resp);
        assert_eq!(resp.status, status, "{resp:#?}");
        assert_eq!(resp.header("cache-control"), Some("no-store"), "{resp:#?}");
        resp
    };
    let ts = unix_now();
    let body = slack_payload("U0APPROVER1", value, &respond_to);
    let sig = slack_signature(SLACK_SECRET, ts, &body);
    checked("chat", Some(ts), Some("v0=00"), &body, 401);
    checked("ops", Some(ts), Some(&sig), &body, 404);
    let odd = "payload=%7B%7D";
    checked(
        "chat",
        Some(ts),
        Some(&slack_signature(SLACK_SECRET, ts, odd)),
        odd,
        400,
    );
    let mut forged: Value = serde_json::from_str(value).expect("value");
    forged["id"] = json!("another");
    let forged = slack_payload("U0APPROVER1", &forged.to_string(), &respond_to);
    let forged_sig = slack_signature(SLACK_SECRET, ts, &forged);
    checked("chat", Some(ts), Some(&forged_sig), &forged, 403);
    let resp = checked("chat", Some(ts), Some(&sig), &body, 200);
    assert_eq!(json_of(&resp)["answered"], true, "{resp:#?}");
    let resp = checked("chat", Some(ts), Some(&sig), &body, 200);
    assert_eq!(json_of(&resp)["answered"], false, "{resp:#?}");
    let resp = api.call(Tok::None, "GET", "/slack/actions/chat", Body::Empty);
    assert_eq!(resp.status, 405, "{resp:#?}");
}

fn json_of(resp: &RawResponse) -> Value {
    serde_json::from_slice(&resp.body).unwrap_or_else(|e| panic!("not JSON ({e}): {resp:#?}"))
}

/// Sessions: made, refused, listed, shown, extended, revoked.
fn sessions(api: &Api) {
    let create = |status: u16, body: Body<'_>| api.expect(status, "POST", "/sessions", body);
    let one = create(
        201,
        Body::Json(json!({
            "profile": "agent", "ttl": "1h", "labels": {"task": "t-1"}, "source": "10.1.2.3",
            "narrow": {"hosts": ["api.test"], "limits": {"api": {"requests": "10/min"}}},
        })),
    );
    let id = one["id"].as_str().expect("id").to_string();
    let token = one["token"].as_str().expect("token").to_string();
    let two = create(
        201,
        Body::Json(json!({"profile": "agent", "labels": {"task": "t-2"}})),
    );
    let two = two["id"].as_str().expect("id").to_string();
    let taken = json!({"profile": "agent", "labels": {"task": "t-3"}, "source": "10.1.2.3"});
    create(409, Body::Json(taken));
    create(404, Body::Json(json!({"profile": "nope"})));
    create(422, Body::Json(json!({"profile": "agent"})));
    let long = json!({"profile": "agent", "ttl": "3h", "labels": {"task": "t"}});
    create(422, Body::Json(long));
    create(400, Body::Raw("{"));
    create(
        400,
        Body::Json(json!({"profile": "agent", "ttl": "soon", "labels": {"task": "t"}})),
    );
    create(
        400,
        Body::Json(json!({"profile": "agent", "colour": "red"})),
    );

    let list = |query: &str, status: u16| {
        let v = api.expect(status, "GET", &format!("/sessions{query}"), Body::Empty);
        assert!(
            !v.to_string().contains(&token),
            "GET /sessions{query} shows a token"
        );
        v
    };
    let all = list("", 200);
    assert_eq!(all["sessions"].as_array().map(Vec::len), Some(2), "{all:#}");
    let some = list("?profile=agent&label=task%3Dt-1&state=live&limit=5", 200);
    assert_eq!(
        some["sessions"].as_array().map(Vec::len),
        Some(1),
        "{some:#}"
    );
    for bad in ["?state=bogus", "?limit=0", "?label=task", "?colour=red"] {
        list(bad, 400);
    }
    let shown = api.expect(200, "GET", &format!("/sessions/{id}"), Body::Empty);
    assert!(
        !shown.to_string().contains(&token),
        "GET /sessions/ID shows the token"
    );
    let unknown = format!("/sessions/ses_{}", "0".repeat(32));
    api.expect(404, "GET", &unknown, Body::Empty);
    api.expect(404, "GET", "/sessions/garbage", Body::Empty);

    let extend = format!("/sessions/{id}/extend");
    let ttl = |t: &str| Body::Json(json!({ "ttl": t }));
    api.expect(200, "POST", &extend, ttl("90m"));
    api.expect(422, "POST", &extend, ttl("5h"));
    api.expect(400, "POST", &extend, ttl("soon"));
    api.expect(400, "POST", &extend, Body::Raw("{"));
    api.expect(404, "POST", &format!("{unknown}/extend"), ttl("1h"));

    api.expect(204, "DELETE", &format!("/sessions/{two}"), Body::Empty);
    api.expect(204, "DELETE", &format!("/sessions/{two}"), Body::Empty);
    api.expect(404, "DELETE", &unknown, Body::Empty);
    api.expect(409, "POST", &format!("/sessions/{two}/extend"), ttl("1h"));
    let revoked = list("?state=revoked", 200);
    assert!(
        revoked["sessions"][0]["revoked_at"].is_string(),
        "{revoked:#}"
    );

    api.expect(405, "PUT", "/sessions", Body::Empty);
    api.expect(404, "PUT", &format!("/sessions/{id}"), Body::Empty);
    api.expect(404, "GET", &extend, Body::Empty);
}

/// `POST /reload`: reloaded, and refused (422) while a policy file is broken.
fn reload(api: &Api, w: &AskWorld) {
    api.expect(200, "POST", "/reload", Body::Empty);
    let broken = w.lk.scratch().join("policies/broken.toml");
    std::fs::write(&broken, "[[rules]]\nname = \n").expect("write a broken policy");
    let refused = api.expect(422, "POST", "/reload", Body::Empty);
    assert!(refused["error"].is_string(), "{refused:#}");
    std::fs::remove_file(&broken).expect("remove the broken policy");
    api.expect(200, "POST", "/reload", Body::Empty);
}

const ORCH_TOKEN: &str = "orch-2f7c9a1e4b6d8053";

#[test]
fn a_scoped_token_does_what_its_scopes_allow_and_the_admin_token_everything() {
    let policy = format!(
        "{}\n[admin.tokens.orch]\ntoken  = \"env:ORCH_TOKEN\"\nscopes = [\"sessions:write\", \"read\"]\n",
        // No notifier: everything from `[notify.ops]` on.
        POLICY.split("[notify.ops]").next().unwrap_or_default()
    );
    let w = ask_world(&policy, |b| {
        b.env("ORCH_TOKEN", ORCH_TOKEN)
            .arg("--admin-token")
            .arg("env:LK_ADMIN_TOKEN")
    });
    let spec = Spec::load();
    let addr = w.lk.admin_addr();
    let call = |token: Option<&str>, method: &str, path: &str, body: &str| {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = bearer
            .iter()
            .map(|b| ("Authorization", b.as_str()))
            .collect();
        let resp = http_call(addr, method, path, &headers, body.as_bytes());
        spec.assert(method, path, &resp);
        resp
    };
    let json_of = |resp: &RawResponse| -> Value {
        serde_json::from_slice(&resp.body).unwrap_or_else(|e| panic!("not JSON ({e}): {resp:#?}"))
    };
    let orch = Some(ORCH_TOKEN);
    let admin = Some(ADMIN_TOKEN);
    let id = ask(&w, "/v1/orch");

    // orch makes and reads sessions; the token is shown once, never again.
    let made = call(
        orch,
        "POST",
        "/sessions",
        r#"{"profile":"agent","labels":{"task":"o-1"}}"#,
    );
    assert_eq!(made.status, 201, "{made:#?}");
    let made = json_of(&made);
    let session = made["id"].as_str().expect("id").to_string();
    let token = made["token"].as_str().expect("token").to_string();
    assert_eq!(made["created_by"], "orch", "{made:#}");
    for path in ["/sessions".to_string(), format!("/sessions/{session}")] {
        for who in [orch, admin] {
            let resp = call(who, "GET", &path, "");
            assert_eq!(resp.status, 200, "GET {path}: {resp:#?}");
            assert!(
                !resp.text().contains(&token) && !resp.text().contains("\"token\""),
                "GET {path} shows the session's token: {resp:#?}"
            );
        }
    }

    // ... and may not reload or answer approvals: 403, naming the scope it lacks.
    for (method, path, body, scope) in [
        ("POST", "/reload".to_string(), "", "reload"),
        (
            "POST",
            format!("/approvals/{id}"),
            r#"{"decision":"approve"}"#,
            "approvals:answer",
        ),
    ] {
        let resp = call(orch, method, &path, body);
        assert_eq!(resp.status, 403, "{method} {path} as orch: {resp:#?}");
        let error = json_of(&resp)["error"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            error.contains(&format!("{scope:?}")) && error.contains("\"orch\""),
            "the 403 does not name the token and the scope {scope}: {error}"
        );
    }
    let shown = json_of(&call(admin, "GET", &format!("/approvals/{id}"), ""));
    assert_eq!(
        shown["state"], "pending",
        "orch's answer was taken: {shown:#}"
    );

    // A wrong token, or none, is unauthorized.
    for who in [Some("orch-wrong-0000000000000"), None] {
        let resp = call(who, "GET", "/sessions", "");
        assert_eq!(resp.status, 401, "{who:?}: {resp:#?}");
        assert!(!resp.text().contains(ORCH_TOKEN) && !resp.text().contains(ADMIN_TOKEN));
    }

    // --admin-token may do everything.
    for (method, path, body, status) in [
        ("POST", "/reload".to_string(), "", 200),
        (
            "POST",
            format!("/approvals/{id}"),
            r#"{"decision":"deny"}"#,
            200,
        ),
        (
            "POST",
            "/sessions".to_string(),
            r#"{"profile":"agent","labels":{"task":"a-1"}}"#,
            201,
        ),
        (
            "POST",
            format!("/sessions/{session}/extend"),
            r#"{"ttl":"1h"}"#,
            200,
        ),
        ("DELETE", format!("/sessions/{session}"), "", 204),
        ("GET", "/status".to_string(), "", 200),
        ("GET", "/grants".to_string(), "", 200),
        ("GET", "/openapi.json".to_string(), "", 200),
    ] {
        let resp = call(admin, method, &path, body);
        assert_eq!(resp.status, status, "{method} {path} as admin: {resp:#?}");
    }
}

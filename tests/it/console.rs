//! The operator console (`serve --console`): off unless enabled; a token exchanged for an
//! HttpOnly, SameSite=Strict session cookie; every page behind it; the security headers on
//! every page and asset; CSRF and origin checks on every POST; scopes deciding what a person
//! may do (a read-only token sees no approve button and its forged answer is refused); a parked
//! request approved in the console completes; sessions created (token shown once) and revoked;
//! a pasted widening candidate shown as widening; no secret on any page.

use std::thread;
use std::time::Duration;

use crate::support::approvals::{
    agent, ask_policy, ask_world, http_call, send, AskWorld, ADMIN_TOKEN, AGENT_TOKEN, LAB_TOKEN,
};
use crate::support::clients::RawResponse;
use crate::support::latchkey::LatchkeyBuilder;

pub(crate) const READER_TOKEN: &str = "adm-reader-console-5f2a9c71e0d4b863";
pub(crate) const APPROVER_TOKEN: &str = "adm-approver-console-8b3e1d60c9a7f254";
/// May answer approvals and nothing else: not even read.
const ANSWERER_TOKEN: &str = "adm-answerer-console-3c81f0a9d27e64b5";
const KEY: &str = "sk-console-upstream-key-71d0e9c4b2a8";

/// The ask policy (`prod-writes` asks with a 30 s hold), a rule injecting a secret, a profile,
/// and two scoped admin tokens.
pub(crate) fn policy() -> String {
    format!(
        "{}\n\
[secrets.key]\nsource = \"env:LK_CONSOLE_KEY\"\n\n\
[[rules]]\nname = \"keyed\"\nhosts = [\"keyed.test\"]\nports = [PORT]\n\
[rules.inject.headers]\nauthorization = \"Bearer {{{{secret.key}}}}\"\n\n\
[[rules]]\nname = \"tunnel\"\nhosts = [\"tunnel.test\"]\nports = [PORT]\ntunnel = true\n\n\
[profiles.worker]\nrules = [\"reads\", \"tunnel\"]\nttl = \"1h\"\n\n\
[admin.tokens.reader]\ntoken = \"env:LK_READER_TOKEN\"\nscopes = [\"read\"]\n\n\
[admin.tokens.approver]\ntoken = \"env:LK_APPROVER_TOKEN\"\nscopes = [\"read\", \"approvals:answer\", \"sessions:write\"]\n\n\
[admin.tokens.answerer]\ntoken = \"env:LK_ANSWERER_TOKEN\"\nscopes = [\"approvals:answer\"]\n",
        ask_policy("30s", r#""once", "1h""#)
    )
}

pub(crate) fn world(console: bool) -> AskWorld {
    world_with(console, |b| b)
}

/// [`world`], with more of latchkey's flags from `more`.
pub(crate) fn world_with(
    console: bool,
    more: impl FnOnce(LatchkeyBuilder) -> LatchkeyBuilder,
) -> AskWorld {
    ask_world(&policy(), |b| {
        let b = more(b)
            .arg("--admin-token")
            .arg("env:LK_ADMIN_TOKEN")
            .env("LK_READER_TOKEN", READER_TOKEN)
            .env("LK_APPROVER_TOKEN", APPROVER_TOKEN)
            .env("LK_ANSWERER_TOKEN", ANSWERER_TOKEN)
            .env("LK_CONSOLE_KEY", KEY);
        if console {
            b.arg("--console")
        } else {
            b
        }
    })
}

/// The pages behind sign-in.
const PAGES: &[&str] = &[
    "/ui",
    "/ui/approvals",
    "/ui/sessions",
    "/ui/limits",
    "/ui/policy",
    "/ui/traffic",
];

/// Every secret value the tests set: none may appear in a console response.
pub(crate) const SECRETS: &[&str] = &[
    READER_TOKEN,
    APPROVER_TOKEN,
    ANSWERER_TOKEN,
    ADMIN_TOKEN,
    AGENT_TOKEN,
    LAB_TOKEN,
    KEY,
];

/// A signed-in browser: its cookie and the session's CSRF token, and every response it saw.
pub(crate) struct Browser<'w> {
    w: &'w AskWorld,
    cookie: String,
    pub(crate) seen: Vec<(String, RawResponse)>,
}

fn request(
    w: &AskWorld,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> RawResponse {
    let mut all = vec![("Content-Type", "application/x-www-form-urlencoded")];
    all.extend_from_slice(headers);
    http_call(w.lk.admin_addr(), method, path, &all, body.as_bytes())
}

fn form(pairs: &[(&str, &str)]) -> String {
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish()
}

pub(crate) fn sign_in<'w>(w: &'w AskWorld, token: &str) -> Browser<'w> {
    let resp = request(w, "POST", "/ui/login", &[], &form(&[("token", token)]));
    assert_eq!(resp.status, 303, "{resp:#?}");
    assert_eq!(resp.header("location"), Some("/ui"));
    let set = resp
        .header("set-cookie")
        .expect("a session cookie")
        .to_string();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(set.contains(attr), "cookie without {attr}: {set}");
    }
    let cookie = set.split(';').next().unwrap_or_default().to_string();
    assert!(cookie.starts_with("latchkey_console="), "{set}");
    Browser {
        w,
        cookie,
        seen: vec![("POST /ui/login".to_string(), resp)],
    }
}

impl Browser<'_> {
    pub(crate) fn get(&mut self, path: &str) -> RawResponse {
        let resp = request(self.w, "GET", path, &[("Cookie", &self.cookie)], "");
        self.seen.push((format!("GET {path}"), resp.clone()));
        resp
    }

    fn post(&mut self, path: &str, pairs: &[(&str, &str)], origin: Option<&str>) -> RawResponse {
        let mut headers = vec![("Cookie", self.cookie.as_str())];
        if let Some(o) = origin {
            headers.push(("Origin", o));
        }
        let resp = request(self.w, "POST", path, &headers, &form(pairs));
        self.seen.push((format!("POST {path}"), resp.clone()));
        resp
    }

    /// The CSRF token the page at `path` carries in its forms.
    fn csrf(&mut self, path: &str) -> String {
        let page = self.get(path).text();
        let at = page
            .find("name=\"csrf\" value=\"")
            .unwrap_or_else(|| panic!("no CSRF field on {path}: {page}"));
        page[at + 19..at + 19 + 64].to_string()
    }

    fn own_origin(&self) -> String {
        format!("http://{}", self.w.lk.admin_addr())
    }
}

/// The first session id (`ses_…`) a page names.
fn session_id(text: &str) -> String {
    let at = text.find("ses_").expect("a session id");
    text[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

fn assert_secure_headers(what: &str, resp: &RawResponse) {
    for (name, value) in [
        (
            "content-security-policy",
            "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'",
        ),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "same-origin"),
        ("x-frame-options", "DENY"),
        ("cache-control", "no-store"),
    ] {
        assert_eq!(resp.header(name), Some(value), "{what}: {name}: {resp:#?}");
    }
}

/// No inline script or style, and no secret value, in any response seen.
pub(crate) fn sweep(seen: &[(String, RawResponse)]) {
    for (what, resp) in seen {
        let text = resp.text();
        for s in SECRETS {
            assert!(!text.contains(s), "{what} shows a secret value: {text}");
            for (name, value) in &resp.headers {
                assert!(!value.contains(s), "{what}: header {name} shows a secret");
            }
        }
        if resp
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/html"))
        {
            for bad in [
                "<script>",
                "style=",
                "<style",
                "onclick",
                "onsubmit",
                "javascript:",
            ] {
                assert!(!text.contains(bad), "{what} has inline {bad}: {text}");
            }
        }
    }
}

#[test]
fn the_console_is_off_unless_enabled() {
    let w = world(false);
    for path in PAGES.iter().chain(&["/ui/login", "/ui/assets/console.css"]) {
        let resp = request(&w, "GET", path, &[], "");
        assert_eq!(resp.status, 404, "{path}: {resp:#?}");
    }
    let resp = request(
        &w,
        "POST",
        "/ui/login",
        &[],
        &form(&[("token", ADMIN_TOKEN)]),
    );
    assert_eq!(resp.status, 404, "{resp:#?}");
}

#[test]
fn a_token_signs_in_for_a_cookie_and_every_page_needs_it_with_strict_headers() {
    let w = world(true);
    // Not signed in: pages send to the sign-in page; a POST is refused.
    for path in PAGES {
        let resp = request(&w, "GET", path, &[], "");
        assert_eq!(resp.status, 303, "{path}: {resp:#?}");
        assert_eq!(resp.header("location"), Some("/ui/login"));
        assert_secure_headers(path, &resp);
    }
    let login = request(&w, "GET", "/ui/login", &[], "");
    assert_eq!(login.status, 200);
    assert_secure_headers("/ui/login", &login);
    let bogus = request(
        &w,
        "GET",
        "/ui",
        &[("Cookie", &format!("latchkey_console={}", "a".repeat(64)))],
        "",
    );
    assert_eq!(
        bogus.status, 303,
        "an unknown session was accepted: {bogus:#?}"
    );

    // A wrong token: 401, no cookie, no detail.
    let bad = request(
        &w,
        "POST",
        "/ui/login",
        &[],
        &form(&[("token", "adm-wrong-token-00000000000")]),
    );
    assert_eq!(bad.status, 401, "{bad:#?}");
    assert!(bad.header("set-cookie").is_none());
    assert_secure_headers("failed sign-in", &bad);
    let foreign = request(
        &w,
        "POST",
        "/ui/login",
        &[("Origin", "http://evil.test")],
        &form(&[("token", ADMIN_TOKEN)]),
    );
    assert_eq!(foreign.status, 403, "a cross-origin sign-in: {foreign:#?}");

    let mut b = sign_in(&w, ADMIN_TOKEN);
    for path in PAGES.iter().chain(&["/ui/policy?identity=agent"]) {
        let resp = b.get(path);
        assert_eq!(resp.status, 200, "{path}: {resp:#?}");
        assert_secure_headers(path, &resp);
        let text = resp.text();
        assert!(
            text.contains("signed in as <strong>admin</strong>"),
            "{path}: {text}"
        );
        assert!(
            text.contains("action=\"/ui/logout\""),
            "{path}: no sign-out"
        );
    }
    let overview = b.get("/ui").text();
    for fact in [
        "Audit health",
        "digest",
        "last reload error",
        "connections",
        "not shipping",
    ] {
        assert!(
            overview.contains(fact),
            "the overview lacks {fact}: {overview}"
        );
    }
    let reach = b.get("/ui/policy?identity=agent").text();
    assert!(reach.contains("api.test"), "no reach shown: {reach}");
    for (path, ty) in [
        ("/ui/assets/console.css", "text/css; charset=utf-8"),
        ("/ui/assets/console.js", "text/javascript; charset=utf-8"),
    ] {
        let resp = b.get(path);
        assert_eq!(resp.status, 200, "{path}");
        assert_eq!(resp.header("content-type"), Some(ty));
        assert_secure_headers(path, &resp);
    }

    sweep(&b.seen);
}

#[test]
fn every_post_needs_the_csrf_token_and_the_own_origin_and_failed_sign_ins_are_limited() {
    let w = world(true);
    let mut b = sign_in(&w, ADMIN_TOKEN);
    // CSRF: none, a wrong one, or the right one from another origin: 403, nothing done.
    let csrf = b.csrf("/ui/policy");
    let candidate = "[[rules]]\nname = \"x\"\nhosts = [\"x.test\"]\n";
    let none = b.post("/ui/policy/diff", &[("candidate", candidate)], None);
    assert_eq!(none.status, 403, "{none:#?}");
    let wrong = b.post(
        "/ui/policy/diff",
        &[("candidate", candidate), ("csrf", &"0".repeat(64))],
        None,
    );
    assert_eq!(wrong.status, 403, "{wrong:#?}");
    let foreign = b.post(
        "/ui/policy/diff",
        &[("candidate", candidate), ("csrf", &csrf)],
        Some("http://evil.test"),
    );
    assert_eq!(foreign.status, 403, "{foreign:#?}");
    assert_secure_headers("refused POST", &foreign);
    let origin = b.own_origin();
    let ok = b.post(
        "/ui/policy/diff",
        &[("candidate", candidate), ("csrf", &csrf)],
        Some(&origin),
    );
    assert_eq!(ok.status, 200, "{ok:#?}");

    // Signing out ends the session: its cookie no longer opens a page.
    let out = b.post("/ui/logout", &[("csrf", &csrf)], None);
    assert_eq!(out.status, 303, "{out:#?}");
    let after = b.get("/ui");
    assert_eq!(
        after.status, 303,
        "the session outlived sign-out: {after:#?}"
    );
    sweep(&b.seen);

    // Failed sign-ins from one address are limited: the 11th in a minute is 429.
    let mut statuses = Vec::new();
    for _ in 0..11 {
        let r = request(
            &w,
            "POST",
            "/ui/login",
            &[],
            &form(&[("token", "adm-wrong-token-00000000000")]),
        );
        statuses.push(r.status);
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    let blocked = request(
        &w,
        "POST",
        "/ui/login",
        &[],
        &form(&[("token", ADMIN_TOKEN)]),
    );
    assert_eq!(
        blocked.status, 429,
        "a blocked address signed in: {blocked:#?}"
    );
}

#[test]
fn a_read_only_token_cannot_approve_and_an_approver_releases_the_parked_request() {
    let w = world(true);
    let url = w.url("api.test", "/v1/items");
    let body = r#"{"name":"widget","count":3}"#;
    let (out, mut reader, mut approver) = thread::scope(|s| {
        let held = s.spawn(|| send(&w.lk, Some(&agent()), "POST", &url, Some(body)));
        let pending = w.admin.wait_pending(1, Duration::from_secs(15));
        let id = pending[0]["id"].as_str().expect("id").to_string();

        let mut reader = sign_in(&w, READER_TOKEN);
        let page = reader.get("/ui/approvals");
        assert_eq!(page.status, 200, "{page:#?}");
        let text = page.text();
        assert!(
            text.contains(&id),
            "the pending approval is not listed: {text}"
        );
        assert!(text.contains("Production write"), "no rule message: {text}");
        assert!(
            text.contains("prod-writes") && text.contains("sandbox=run-42"),
            "{text}"
        );
        assert!(text.contains("<pre>"), "no preview: {text}");
        assert!(
            !text.contains(">Approve</button>"),
            "a read-only token sees an approve button"
        );
        assert!(!text.contains(&format!("action=\"/ui/approvals/{id}\"")));
        // A forged answer with the reader's own CSRF token: refused.
        let csrf = reader.csrf("/ui/approvals");
        let forged = reader.post(
            &format!("/ui/approvals/{id}"),
            &[("csrf", &csrf), ("decision", "approve"), ("scope", "once")],
            None,
        );
        assert_eq!(forged.status, 403, "{forged:#?}");
        assert_eq!(
            w.admin.show(&id)["state"],
            "pending",
            "the reader's answer was taken"
        );

        let mut approver = sign_in(&w, APPROVER_TOKEN);
        let text = approver.get("/ui/approvals").text();
        assert!(
            text.contains(">Approve</button>") && text.contains(">Deny</button>"),
            "{text}"
        );
        let csrf = approver.csrf("/ui/approvals");
        let answered = approver.post(
            &format!("/ui/approvals/{id}"),
            &[
                ("csrf", &csrf),
                ("decision", "approve"),
                ("scope", "once"),
                ("note", "looks fine"),
            ],
            None,
        );
        assert_eq!(answered.status, 200, "{answered:#?}");
        assert!(answered.text().contains("approved"), "{answered:#?}");
        let shown = w.admin.show(&id);
        assert_eq!(shown["answer"]["by"], "approver", "{shown:#}");
        let history = approver.get("/ui/approvals").text();
        assert!(
            history.contains("looks fine") && history.contains("approver"),
            "{history}"
        );
        let out = held.join().expect("curl thread");
        (out, reader, approver)
    });
    let resp = out.ok();
    assert_eq!(
        resp.status, 200,
        "the approved request did not complete: {resp:#?}"
    );
    let mut seen = std::mem::take(&mut reader.seen);
    seen.append(&mut approver.seen);
    sweep(&seen);
}

#[test]
fn sessions_are_created_with_the_token_shown_once_extended_and_revoked() {
    let w = world(true);
    let mut b = sign_in(&w, APPROVER_TOKEN);
    let page = b.get("/ui/sessions").text();
    assert!(
        page.contains("<option value=\"worker\">worker</option>"),
        "{page}"
    );
    let csrf = b.csrf("/ui/sessions");
    let made = b.post(
        "/ui/sessions",
        &[
            ("csrf", &csrf),
            ("profile", "worker"),
            ("ttl", "30m"),
            ("labels", "task=t-1, owner=ana"),
        ],
        None,
    );
    assert_eq!(made.status, 201, "{made:#?}");
    let text = made.text();
    let at = text.find("lks_").expect("the session token");
    let token: String = text[at..].chars().take_while(|c| *c != '<').collect();
    assert!(token.len() >= 20, "{token:?} from {text}");
    let id = session_id(&text);

    // Listed (filters work), never with its token.
    let listed = b
        .get("/ui/sessions?profile=worker&state=live&label=task%3Dt-1")
        .text();
    assert!(listed.contains(&id), "{listed}");
    assert!(
        !listed.contains(&token),
        "the list shows the session's token"
    );
    let other = b.get("/ui/sessions?label=task%3Dnone").text();
    assert!(
        !other.contains(&id),
        "the label filter let it through: {other}"
    );
    let bad = b.get("/ui/sessions?state=bogus");
    assert_eq!(bad.status, 400, "{bad:#?}");

    // A read-only token may not revoke.
    let mut reader = sign_in(&w, READER_TOKEN);
    let rcsrf = reader.csrf("/ui/policy");
    assert!(!reader
        .get("/ui/sessions")
        .text()
        .contains(">Revoke</button>"));
    let forged = reader.post(
        &format!("/ui/sessions/{id}/revoke"),
        &[("csrf", &rcsrf)],
        None,
    );
    assert_eq!(forged.status, 403, "{forged:#?}");

    let extended = b.post(
        &format!("/ui/sessions/{id}/extend"),
        &[("csrf", &csrf), ("ttl", "10m")],
        None,
    );
    assert_eq!(extended.status, 200, "{extended:#?}");
    let revoked = b.post(
        &format!("/ui/sessions/{id}/revoke"),
        &[("csrf", &csrf)],
        None,
    );
    assert_eq!(revoked.status, 200, "{revoked:#?}");
    let after = b.get("/ui/sessions?state=revoked").text();
    assert!(after.contains(&id), "{after}");

    // No page but the create result shows the session token; none shows a policy secret.
    let created_page = b
        .seen
        .iter()
        .position(|(w, r)| w == "POST /ui/sessions" && r.status == 201);
    let seen: Vec<(String, RawResponse)> = b
        .seen
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != created_page)
        .map(|(_, s)| s.clone())
        .chain(reader.seen.iter().cloned())
        .collect();
    for (what, resp) in &seen {
        assert!(
            !resp.text().contains(&token),
            "{what} shows the session token again"
        );
    }
    sweep(&seen);
    sweep(&b.seen);
}

#[test]
fn a_session_created_in_the_console_is_narrowed_as_asked_and_never_wider_than_its_profile() {
    let w = world(true);
    let mut b = sign_in(&w, APPROVER_TOKEN);
    let csrf = b.csrf("/ui/sessions");
    let made = b.post(
        "/ui/sessions",
        &[
            ("csrf", &csrf),
            ("profile", "worker"),
            ("hosts", "api.test"),
            ("source", "127.0.0.1"),
        ],
        None,
    );
    assert_eq!(made.status, 201, "{made:#?}");
    let text = made.text();
    let id = session_id(&text);
    let shown = w.admin.call("GET", &format!("/sessions/{id}"), None);
    let shown: serde_json::Value = serde_json::from_slice(&shown.body).expect("JSON");
    assert_eq!(
        shown["narrow"]["hosts"],
        serde_json::json!(["api.test"]),
        "{shown:#}"
    );
    assert_eq!(shown["source"], "127.0.0.1", "{shown:#}");
    let listed = b.get("/ui/sessions").text();
    assert!(
        listed.contains("hosts: api.test; source: 127.0.0.1"),
        "{listed}"
    );

    // Wider than the profile, or malformed: refused, naming what, and nothing made.
    let before = w.admin.call("GET", "/sessions", None).text();
    for (field, value, named) in [
        ("hosts", "other.test", "other.test"),
        ("secrets", "key", "key"),
        ("limits", "llm.llm_tokens=10", "llm"),
        ("limits", "nodot=10", "LIMIT.MEASURE=VALUE"),
        ("source", "not-an-address", "not-an-address"),
    ] {
        let resp = b.post(
            "/ui/sessions",
            &[("csrf", &csrf), ("profile", "worker"), (field, value)],
            None,
        );
        assert!(
            (400..500).contains(&resp.status),
            "{field}={value} was taken: {resp:#?}"
        );
        assert!(
            resp.text().contains(named),
            "{field}={value}: the refusal does not name {named:?}: {}",
            resp.text()
        );
    }
    let after = w.admin.call("GET", "/sessions", None).text();
    let count = |t: &str| t.matches("\"ses_").count();
    assert_eq!(count(&before), count(&after), "a refused session was made");
    sweep(&b.seen);
}

#[test]
fn a_reload_that_removes_a_token_ends_its_console_sessions() {
    let w = world(true);
    let mut reader = sign_in(&w, READER_TOKEN);
    let mut approver = sign_in(&w, APPROVER_TOKEN);
    assert_eq!(reader.get("/ui").status, 200);
    let without = policy()
        .replace(
            "[admin.tokens.reader]\ntoken = \"env:LK_READER_TOKEN\"\nscopes = [\"read\"]\n",
            "",
        )
        .replace("PORT", &w.port().to_string());
    assert!(!without.contains("admin.tokens.reader"));
    let dir = w.lk.scratch().join("policies");
    let aside = dir.join(".main.toml.new");
    std::fs::write(&aside, &without).expect("write policy aside");
    std::fs::rename(&aside, dir.join("main.toml")).expect("rename policy into place");
    let reloaded = w.admin.call("POST", "/reload", None);
    assert_eq!(reloaded.status, 200, "{reloaded:#?}");
    let after = reader.get("/ui");
    assert_eq!(
        after.status, 303,
        "the removed token's session lived on: {after:#?}"
    );
    assert_eq!(after.header("location"), Some("/ui/login"));
    assert_eq!(
        approver.get("/ui").status,
        200,
        "another token's session ended"
    );
}

#[test]
fn with_no_admin_token_the_console_is_open_but_still_needs_its_csrf_token() {
    let w = ask_world(&ask_policy("30s", r#""once""#), |b| b.arg("--console"));
    let first = request(&w, "GET", "/ui", &[], "");
    assert_eq!(first.status, 200, "{first:#?}");
    let set = first
        .header("set-cookie")
        .expect("a session cookie on first visit");
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = set.split(';').next().unwrap_or_default().to_string();
    let mut b = Browser {
        w: &w,
        cookie,
        seen: Vec::new(),
    };
    assert_eq!(b.get("/ui/sessions").status, 200);
    let none = b.post("/ui/policy/diff", &[("candidate", "x = 1")], None);
    assert_eq!(none.status, 403, "{none:#?}");
    let csrf = b.csrf("/ui/policy");
    let ok = b.post("/ui/logout", &[("csrf", &csrf)], None);
    assert_eq!(ok.status, 303, "{ok:#?}");
}

#[test]
fn a_pasted_candidate_that_widens_reach_is_shown_as_widening() {
    let w = world(true);
    let mut b = sign_in(&w, READER_TOKEN);
    // A candidate that lets `agent` reach another host: the diff says it widens.
    let csrf = b.csrf("/ui/policy");
    let candidate = policy().replace("PORT", &w.port().to_string()).replace(
        "hosts   = [\"api.test\"]\nports   = [",
        "hosts   = [\"api.test\", \"wider.test\"]\nports   = [",
    );
    assert!(candidate.contains("wider.test"));
    let diff = b.post(
        "/ui/policy/diff",
        &[("csrf", &csrf), ("candidate", &candidate)],
        None,
    );
    assert_eq!(diff.status, 200, "{diff:#?}");
    let text = diff.text();
    assert!(text.contains("widens reach"), "{text}");
    assert!(text.contains("wider.test"), "{text}");
    let broken = b.post(
        "/ui/policy/diff",
        &[("csrf", &csrf), ("candidate", "[[rules]\n")],
        None,
    );
    assert_eq!(broken.status, 422, "{broken:#?}");

    sweep(&b.seen);
}

#[test]
fn a_token_without_read_sees_no_page_as_the_api_shows_it_nothing() {
    let w = world(true);
    let mut answerer = sign_in(&w, ANSWERER_TOKEN);
    for path in PAGES.iter().chain(&[
        "/ui/traffic",
        "/ui/traffic/stream",
        "/ui/explain?method=GET&url=https://api.test/",
    ]) {
        let resp = answerer.get(path);
        assert_eq!(resp.status, 403, "GET {path} without read: {resp:#?}");
        assert!(resp.text().contains("no read scope"), "{path}");
    }
    // The API agrees: its GETs need read too.
    let api = request(
        &w,
        "GET",
        "/approvals",
        &[("Authorization", &format!("Bearer {ANSWERER_TOKEN}"))],
        "",
    );
    assert_eq!(api.status, 403, "{api:#?}");
    sweep(&answerer.seen);
}

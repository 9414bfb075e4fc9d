//! Slack interactive approvals end to end: a real `latchkey serve` (admin token on) with an
//! `ask` rule and a `format = "slack"` notifier with `signing_secret`, whose webhook is a fake
//! Slack over HTTPS on loopback (its certificate from the test CA latchkey trusts). The
//! announcement's buttons carry signed values and no link; a click, signed as Slack signs it and
//! POSTed to `/slack/actions/NAME` without the admin token, answers the held request (approve:
//! `200` upstream; deny: `403`), leaves the `APPROVAL` audit record by `slack:USER (name)` and
//! replaces the message through `response_url`. Forged, stale, oversized, misaddressed and
//! unauthorised clicks answer nothing; a `response_url` on another host is answered but not
//! posted. No secret value, signature or `response_url` path shows anywhere.

use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::approvals::{
    agent, http_call, send, slack_buttons, slack_payload as payload, slack_post as post,
    slack_signature as sign, start, unix_now as now, with_method, Admin, ADMIN_TOKEN, AGENT_TOKEN,
};
use crate::support::clients::{dial, RawResponse};
use crate::support::upstream::{full_body, handler, Received};
use crate::support::{
    assert_denial, assert_record, read_response, Echo, Latchkey, TestCa, Upstream,
};

const SIGNING_SECRET: &str = "slack-signing-it-5c1d9e7a3b2f4068";
const OTHER_SECRET: &str = "slack-signing-other-it-0a9b8c7d6e5f";
const HOOK_SECRET: &str = "whsec-slack-it-7d3e9f1a2b4c";
const API_KEY: &str = "sk-it-SLACK-3f9e8d7c6b5a4e3d";
/// The path of every `response_url` the tests hand latchkey: a capability, never logged.
const CAPABILITY: &str = "RESPCAP-9b8a7f6e5d4c";
const APPROVER: &str = "U0APPROVER1";
const WEBHOOK_PATH: &str = "/services/T0/B0/XYZ";

/// latchkey, the echo upstream the held requests go to, and the fake Slack.
struct SlackWorld {
    lk: Latchkey,
    upstream: Upstream,
    slack: Upstream,
    admin: Admin,
    _ca: TestCa,
}

impl SlackWorld {
    fn start() -> SlackWorld {
        let ca = TestCa::new();
        let upstream = Upstream::https(&ca);
        let slack = Upstream::https_with(
            &ca,
            handler(|_| async { hyper::Response::new(full_body("ok")) }),
        );
        let policy = format!(
            r#"
[secrets.api]
source = "env:SLACK_IT_API_KEY"

[[rules]]
name    = "prod-writes"
hosts   = ["api.test"]
ports   = [{port}]
methods = ["POST"]
ask     = {{ hold = "30s", scope = ["once", "1h"], message = "Production write", notify = ["chat"] }}
[rules.inject.headers]
authorization = "Bearer {{{{secret.api}}}}"

[identities.agent]
token = "env:AGENT_TOKEN"
rules = ["prod-writes"]

[notify.chat]
url            = "https://other.test:{slack}{WEBHOOK_PATH}"
format         = "slack"
secret         = "env:SLACK_IT_HOOK_SECRET"
signing_secret = "env:SLACK_IT_SIGNING_SECRET"
approvers      = ["{APPROVER}"]

[notify.other]
url            = "https://other.test:{slack}/services/T0/B1/OTHER"
format         = "slack"
signing_secret = "env:SLACK_IT_OTHER_SECRET"

[notify.links]
url    = "https://other.test:{slack}/services/T0/B2/LINKS"
format = "slack"
"#,
            port = upstream.port(),
            slack = slack.port(),
        );
        let lk = start(&ca, &upstream, &policy, |b| {
            b.env("SLACK_IT_API_KEY", API_KEY)
                .env("SLACK_IT_HOOK_SECRET", HOOK_SECRET)
                .env("SLACK_IT_SIGNING_SECRET", SIGNING_SECRET)
                .env("SLACK_IT_OTHER_SECRET", OTHER_SECRET)
                .arg("--admin-token")
                .arg("env:LK_ADMIN_TOKEN")
        });
        let admin = Admin::new(lk.admin_addr(), Some(ADMIN_TOKEN));
        SlackWorld {
            lk,
            upstream,
            slack,
            admin,
            _ca: ca,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("https://api.test:{}{path}", self.upstream.port())
    }

    /// A `response_url` on `host` (the fake Slack's port), with the capability in its path.
    fn response_url(&self, host: &str, n: u32) -> String {
        format!(
            "https://{host}:{}/actions/T0/{n}/{CAPABILITY}",
            self.slack.port()
        )
    }

    /// What the fake Slack received whole at paths starting with `prefix` (a request is
    /// recorded from its head on: one still arriving is left out).
    fn posts(&self, prefix: &str) -> Vec<Received> {
        self.slack
            .received()
            .into_iter()
            .filter(|r| r.path.starts_with(prefix) && r.complete)
            .collect()
    }

    /// Waits (up to 20 s) for the `n`-th POST to paths starting with `prefix`; all so far.
    fn wait_posts(&self, prefix: &str, n: usize) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.posts(prefix);
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "expected {n} POSTs to {prefix}, got {got:#?}\nstderr:\n{}",
                self.lk.stderr_text()
            );
            thread::sleep(Duration::from_millis(25));
        }
    }

    /// The `n`-th announcement's approval id and its buttons' values by `action_id`.
    fn announcement(&self, n: usize) -> (String, Vec<(String, String)>) {
        let got = self.wait_posts(WEBHOOK_PATH, n);
        let msg: Value = serde_json::from_slice(&got[n - 1].body).expect("Slack JSON");
        let text = msg.to_string();
        assert!(
            !text.contains("/answer?"),
            "an interactive message has no link: {text}"
        );
        let buttons = slack_buttons(&msg);
        let first: Value = serde_json::from_str(&buttons[0].1).expect("value is JSON");
        let id = first["id"].as_str().expect("id").to_string();
        let ids: Vec<&str> = buttons.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(ids, ["approve-once", "approve-1h", "deny"], "{msg:#}");
        (id, buttons)
    }
}

fn value_of<'a>(buttons: &'a [(String, String)], action: &str) -> &'a str {
    &buttons.iter().find(|(a, _)| a == action).expect(action).1
}

/// A click signed as Slack signs it, now.
fn click(
    w: &SlackWorld,
    notifier: &str,
    secret: &str,
    user: &str,
    value: &str,
    response_url: &str,
) -> RawResponse {
    let body = payload(user, value, response_url);
    let ts = now();
    post(
        w.lk.admin_addr(),
        notifier,
        Some(ts),
        Some(&sign(secret, ts, &body)),
        &body,
    )
}

fn json_of(resp: &RawResponse) -> Value {
    serde_json::from_slice(&resp.body).unwrap_or_else(|e| panic!("not JSON ({e}): {resp:#?}"))
}

/// No secret value, response_url capability or signature in `text`.
fn assert_clean(what: &str, text: &str, signatures: &[String]) {
    for secret in [
        SIGNING_SECRET,
        OTHER_SECRET,
        HOOK_SECRET,
        API_KEY,
        AGENT_TOKEN,
        ADMIN_TOKEN,
    ] {
        assert!(
            !text.contains(secret),
            "{what} holds a secret value: {text}"
        );
    }
    for sig in signatures {
        assert!(
            !text.contains(&sig[3..]),
            "{what} holds a signature: {text}"
        );
    }
}

/// Everything a test saw: every answer, latchkey's log and audit, what the fake Slack got.
fn sweep(w: &SlackWorld, answers: &[RawResponse], signatures: &[String]) {
    // The log is read as it is written: give the last lines (and late POSTs) time to arrive.
    thread::sleep(Duration::from_millis(500));
    for a in answers {
        assert_clean("an answer", &format!("{a:?}"), signatures);
    }
    let log = w.lk.stderr_text();
    assert_clean("latchkey's log", &log, signatures);
    assert!(
        !log.contains(CAPABILITY),
        "a response_url path in the log:\n{log}"
    );
    assert_clean("the audit log", &w.lk.audit_text(), signatures);
    for r in w.slack.received() {
        assert_clean("a POST to Slack", &format!("{r:?}"), signatures);
    }
}

#[test]
fn a_click_in_slack_approves_the_held_request_and_replaces_the_message() {
    let w = SlackWorld::start();
    let body = format!(r#"{{"deploy":"web","key":"{API_KEY}"}}"#);
    let url = w.url("/v1/deploy");
    let respond_to = w.response_url("other.test", 1);
    let (out, answer, again) = thread::scope(|s| {
        let held = s.spawn(|| send(&w.lk, Some(&agent()), "POST", &url, Some(&body)));
        let (id, buttons) = w.announcement(1);
        assert_eq!(w.admin.show(&id)["state"], "pending");
        assert!(
            w.upstream.received().is_empty(),
            "forwarded before the click"
        );
        let answer = click(
            &w,
            "chat",
            SIGNING_SECRET,
            APPROVER,
            value_of(&buttons, "approve-once"),
            &respond_to,
        );
        let out = held.join().expect("curl thread");
        // The same button again: nothing more is answered, and the user is told why.
        let again = click(
            &w,
            "chat",
            SIGNING_SECRET,
            APPROVER,
            value_of(&buttons, "deny"),
            &respond_to,
        );
        (out, (id, answer), again)
    });
    let (id, answer) = answer;
    assert_eq!(answer.status, 200, "{answer:#?}");
    assert_eq!(json_of(&answer)["answered"], true, "{answer:#?}");
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{resp:#?}");
    let got = w.upstream.received();
    assert_eq!(got.len(), 1, "exactly one request upstream: {got:#?}");
    let injected = format!("Bearer {API_KEY}");
    assert_eq!(got[0].header("authorization"), Some(injected.as_str()));
    assert_eq!(Echo::parse(&resp.text()).method, "POST");
    let shown = w.admin.show(&id);
    assert_eq!(shown["state"], "approved", "{shown:#}");
    assert_eq!(shown["answer"]["by"], format!("slack:{APPROVER} (ana)"));
    assert_eq!(shown["answer"]["scope"], "once");

    // The message is replaced with the outcome, no button; the second click is told apart.
    let updates: Vec<(Value, Received)> = w
        .wait_posts("/actions/T0/1/", 2)
        .into_iter()
        .map(|r| (serde_json::from_slice(&r.body).expect("JSON"), r))
        .collect();
    let (replaced, update) = updates
        .iter()
        .find(|(v, _)| v["replace_original"] == true)
        .unwrap_or_else(|| panic!("no replacement: {updates:#?}"));
    assert_eq!(replaced["replace_original"], true, "{replaced:#}");
    let text = replaced["text"].as_str().expect("text");
    assert!(
        text.starts_with(&format!(
            "latchkey: slack:{APPROVER} (ana) approved (once) identity agent"
        )),
        "{text}"
    );
    assert!(
        !replaced.to_string().contains("\"actions\""),
        "{replaced:#}"
    );
    assert_eq!(update.header("content-type"), Some("application/json"));
    // The second click: not answered, told who decided and when.
    assert_eq!(again.status, 200, "{again:#?}");
    let told = json_of(&again);
    assert_eq!(told["answered"], false, "{told:#}");
    let said = told["text"].as_str().expect("text");
    assert!(
        said.contains(&format!("already approved by slack:{APPROVER} (ana) at ")),
        "{said}"
    );
    let (ephemeral, _) = updates
        .iter()
        .find(|(v, _)| v["response_type"] == "ephemeral")
        .unwrap_or_else(|| panic!("no ephemeral reply: {updates:#?}"));
    assert!(ephemeral["text"]
        .as_str()
        .is_some_and(|t| t.contains("already approved")));
    assert_eq!(ephemeral["replace_original"], false);
    assert_eq!(w.admin.show(&id)["state"], "approved");

    // One APPROVAL record, by the Slack user.
    let records = w.lk.audit_records();
    let decisions = with_method(&records, "APPROVAL");
    assert_eq!(decisions.len(), 1, "{records:#?}");
    assert_record(
        decisions[0],
        json!({"decision": "allow", "reason": "allowed", "rule": "prod-writes", "identity": "agent"}),
    );
    assert_eq!(decisions[0]["approval"]["id"], id.as_str());
    assert_eq!(
        decisions[0]["approval"]["by"],
        format!("slack:{APPROVER} (ana)")
    );
    // The decision is also announced as a message of its own, as before.
    let announced = w.wait_posts(WEBHOOK_PATH, 2);
    assert!(String::from_utf8_lossy(&announced[1].body).contains("approved (once)"));
    sweep(&w, &[answer, again], &[]);
}

#[test]
fn a_deny_click_refuses_the_held_request_and_forged_or_unauthorised_clicks_answer_nothing() {
    let w = SlackWorld::start();
    let url = w.url("/v1/drop");
    let respond_to = w.response_url("other.test", 2);
    let (out, answers, signatures) = thread::scope(|s| {
        let held = s.spawn(|| send(&w.lk, Some(&agent()), "POST", &url, Some(r#"{"drop":1}"#)));
        let (id, buttons) = w.announcement(1);
        let (answers, signatures) = refusals(&w, &id, &buttons, &respond_to);
        let deny = click(
            &w,
            "chat",
            SIGNING_SECRET,
            APPROVER,
            value_of(&buttons, "deny"),
            &respond_to,
        );
        assert_eq!(deny.status, 200, "{deny:#?}");
        let out = held.join().expect("curl thread");
        let shown = w.admin.show(&id);
        assert_eq!(shown["state"], "denied", "{shown:#}");
        assert_eq!(shown["answer"]["by"], format!("slack:{APPROVER} (ana)"));
        (out, answers, signatures)
    });
    assert_denial(out.ok(), 403, Some("prod-writes"), "approval_denied");
    assert!(w.upstream.received().is_empty(), "nothing went upstream");
    let posts = w.wait_posts("/actions/T0/2/", 2);
    let last: Value = serde_json::from_slice(&posts[posts.len() - 1].body).expect("JSON");
    assert_eq!(last["replace_original"], true, "{last:#}");
    assert!(
        last["text"]
            .as_str()
            .is_some_and(|t| t.contains(&format!("slack:{APPROVER} (ana) denied"))),
        "{last:#}"
    );
    let records = w.lk.audit_records();
    let decisions = with_method(&records, "APPROVAL");
    assert_eq!(decisions.len(), 1, "only the deny answered: {records:#?}");
    assert_eq!(decisions[0]["reason"], "approval_denied");
    sweep(&w, &answers, &signatures);
}

/// Every click that must answer nothing, each checked to leave `id` pending; the answers and
/// the signatures sent (for the sweep).
fn refusals(
    w: &SlackWorld,
    id: &str,
    buttons: &[(String, String)],
    respond_to: &str,
) -> (Vec<RawResponse>, Vec<String>) {
    let addr = w.lk.admin_addr();
    let approve = value_of(buttons, "approve-1h");
    let body = payload(APPROVER, approve, respond_to);
    let ts = now();
    let good = sign(SIGNING_SECRET, ts, &body);
    let mut answers = Vec::new();
    let mut expect = |status: u16, says: &str, resp: RawResponse| {
        assert_eq!(resp.status, status, "{says}: {resp:#?}");
        assert!(resp.text().contains(says), "{says}: {resp:#?}");
        assert_eq!(w.admin.show(id)["state"], "pending", "answered by: {says}");
        answers.push(resp);
    };
    let wrong = sign(OTHER_SECRET, ts, &body);
    expect(
        401,
        "does not match",
        post(addr, "chat", Some(ts), Some(&wrong), &body),
    );
    expect(
        401,
        "no X-Slack-Signature",
        post(addr, "chat", Some(ts), None, &body),
    );
    expect(
        401,
        "no X-Slack-Request-Timestamp",
        post(addr, "chat", None, Some(&good), &body),
    );
    let tampered = body.replace("ana", "bob");
    expect(
        401,
        "does not match",
        post(addr, "chat", Some(ts), Some(&good), &tampered),
    );
    let (old, future) = (ts - 360, ts + 360);
    let stale = sign(SIGNING_SECRET, old, &body);
    expect(
        401,
        "5 minutes",
        post(addr, "chat", Some(old), Some(&stale), &body),
    );
    let early = sign(SIGNING_SECRET, future, &body);
    expect(
        401,
        "5 minutes",
        post(addr, "chat", Some(future), Some(&early), &body),
    );
    // Another notifier: unknown, not interactive, or interactive with its own secret.
    for name in ["nobody", "links", "chat/x", ""] {
        expect(
            404,
            "no Slack notifier",
            post(addr, name, Some(ts), Some(&good), &body),
        );
    }
    expect(
        401,
        "does not match",
        post(addr, "other", Some(ts), Some(&good), &body),
    );
    let other = sign(OTHER_SECRET, ts, &body);
    expect(
        403,
        "not one latchkey signed for this notifier",
        post(addr, "other", Some(ts), Some(&other), &body),
    );
    // Larger than 64 KiB: refused on its declared length, unread (no byte of it is sent).
    let mut tcp = dial(addr);
    let head = format!(
        "POST /slack/actions/chat HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 70000\r\n\
         X-Slack-Request-Timestamp: {ts}\r\nX-Slack-Signature: {good}\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).expect("send the head");
    expect(
        413,
        "larger than 64 KiB",
        read_response(&mut tcp, false).expect("an answer"),
    );
    expect(
        405,
        "method not allowed",
        http_call(addr, "GET", "/slack/actions/chat", &[], b""),
    );
    // Signed, but not a click on one of latchkey's buttons.
    for (bad, says) in [
        ("payload=%7B%7D", "not a Slack interaction"),
        ("text=hello", "no payload"),
        (
            &payload(APPROVER, "{\"id\":\"x\"}", respond_to)[..],
            "not an answer",
        ),
    ] {
        let sig = sign(SIGNING_SECRET, ts, bad);
        expect(400, says, post(addr, "chat", Some(ts), Some(&sig), bad));
    }
    let mut forged: Value = serde_json::from_str(approve).expect("value");
    forged["scope"] = json!("once");
    let body = payload(APPROVER, &forged.to_string(), respond_to);
    let sig = sign(SIGNING_SECRET, ts, &body);
    expect(
        403,
        "not one latchkey signed",
        post(addr, "chat", Some(ts), Some(&sig), &body),
    );
    // Signed and genuine, by someone not among the approvers: told so, in Slack too.
    let outsider = click(w, "chat", SIGNING_SECRET, "U0INTRUDER", approve, respond_to);
    expect(200, "not one of the approvers", outsider);
    let told = w.wait_posts("/actions/T0/2/", 1);
    let told: Value = serde_json::from_slice(&told[0].body).expect("JSON");
    assert_eq!(told["response_type"], "ephemeral", "{told:#}");
    assert!(told["text"]
        .as_str()
        .is_some_and(|t| t.contains("not one of the approvers")));
    for reason in [
        "does not match",
        "more than 5 minutes",
        "larger than 64 KiB",
        "not one of the notifier's approvers",
    ] {
        assert!(
            w.lk.wait_stderr_contains(reason, Duration::from_secs(5)),
            "no warning saying {reason:?}:\n{}",
            w.lk.stderr_text()
        );
    }
    (answers, vec![good, wrong, stale, early, other])
}

#[test]
fn a_response_url_on_another_host_is_answered_but_not_posted() {
    let w = SlackWorld::start();
    let url = w.url("/v1/elsewhere");
    // api.test is pinned to the same loopback server: a POST there would show in its log.
    let elsewhere = w.response_url("api.test", 3);
    let (out, answer) = thread::scope(|s| {
        let held = s.spawn(|| send(&w.lk, Some(&agent()), "POST", &url, Some(r#"{"n":3}"#)));
        let (_, buttons) = w.announcement(1);
        let answer = click(
            &w,
            "chat",
            SIGNING_SECRET,
            APPROVER,
            value_of(&buttons, "approve-1h"),
            &elsewhere,
        );
        (held.join().expect("curl thread"), answer)
    });
    assert_eq!(answer.status, 200, "{answer:#?}");
    assert_eq!(json_of(&answer)["answered"], true);
    assert_eq!(out.ok().status, 200, "{:#?}", out.ok());
    assert!(
        w.lk.wait_stderr_contains("response_url host api.test", Duration::from_secs(5)),
        "no warning naming the host:\n{}",
        w.lk.stderr_text()
    );
    // The decision's own announcement still goes to the webhook; nothing to /actions/.
    w.wait_posts(WEBHOOK_PATH, 2);
    thread::sleep(Duration::from_millis(500));
    assert!(
        w.posts("/actions/").is_empty(),
        "{:#?}",
        w.posts("/actions/")
    );
    sweep(&w, &[answer], &[]);
}

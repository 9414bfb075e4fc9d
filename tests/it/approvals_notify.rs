//! Webhook notifications end to end: a real `latchkey serve` with an `ask` rule and a
//! `[notify.ops]` webhook, a receiver on loopback that checks the HMAC signature and records
//! every delivery. A parked request is announced once (and its decision too, answered through
//! the signed link the announcement carried); a receiver that fails is retried with the same
//! delivery id; a delivery pending at `kill -9` arrives after the restart (SQLite and Redis); a
//! secret the request carries never reaches the webhook.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use aws_lc_rs::hmac;
use serde_json::Value;

use crate::support::admin::{admin_get, admin_request, json_body};
use crate::support::clients::raw_request;
use crate::support::redis::RedisServer;
use crate::support::{latchkey, Latchkey, Upstream};

const HOOK_SECRET: &str = "whsec-it-4f1e2d3c5b6a7980";
const AGENT_TOKEN: &str = "agent-token-it-8a7b6c5d4e3f";
const OPENAI_KEY: &str = "sk-it-NOTIFY-9e8d7c6b5a4f3e2d";

/// One request the webhook receiver got.
#[derive(Debug, Clone)]
struct Delivery {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// `x-latchkey-signature` was HMAC-SHA256(secret, "{timestamp}.{body}").
    signed: bool,
}

impl Delivery {
    fn header(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map_or("", |(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("delivery is not JSON ({e}): {self:?}"))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A webhook receiver on loopback: answers the n-th request with `statuses[n]` (the last one
/// repeated), one request per connection.
struct Hook {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Delivery>>>,
    stop: Arc<AtomicBool>,
}

impl Hook {
    fn start(statuses: &[u16]) -> Hook {
        Hook::on(
            TcpListener::bind("127.0.0.1:0").expect("bind hook"),
            statuses,
        )
    }

    fn on(listener: TcpListener, statuses: &[u16]) -> Hook {
        listener.set_nonblocking(true).expect("non-blocking hook");
        let addr = listener.local_addr().expect("hook address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (record, halt, statuses) = (seen.clone(), stop.clone(), statuses.to_vec());
        thread::spawn(move || {
            while !halt.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((tcp, _)) => {
                        let n = record.lock().expect("deliveries").len();
                        let status = statuses[n.min(statuses.len() - 1)];
                        if let Some(d) = read_delivery(tcp, status) {
                            record.lock().expect("deliveries").push(d);
                        }
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Hook { addr, seen, stop }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    fn deliveries(&self) -> Vec<Delivery> {
        self.seen.lock().expect("deliveries").clone()
    }

    /// Waits up to `timeout` for `n` deliveries.
    fn wait_for(&self, n: usize, timeout: Duration, lk: &Latchkey) -> Vec<Delivery> {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.deliveries();
            if seen.len() >= n {
                return seen;
            }
            assert!(
                Instant::now() < deadline,
                "expected {n} deliveries within {timeout:?}, got {}: {seen:#?}\nstderr:\n{}",
                seen.len(),
                lk.stderr_text()
            );
            thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Reads one HTTP/1.1 request (head, then `content-length` bytes), checks its signature and
/// answers `status` with `connection: close`.
fn read_delivery(mut tcp: TcpStream, status: u16) -> Option<Delivery> {
    tcp.set_nonblocking(false).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        if tcp.read(&mut byte).ok()? == 0 {
            return None;
        }
        raw.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&raw).into_owned();
    let headers: Vec<(String, String)> = head
        .split("\r\n")
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    tcp.read_exact(&mut body).ok()?;
    let _ = write!(
        tcp,
        "HTTP/1.1 {status} X\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
    );
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, v)| v.as_str())
    };
    let key = hmac::Key::new(hmac::HMAC_SHA256, HOOK_SECRET.as_bytes());
    let mut signed_text = format!("{}.", get("x-latchkey-timestamp")).into_bytes();
    signed_text.extend_from_slice(&body);
    let signed = get("x-latchkey-signature")
        .strip_prefix("sha256=")
        .and_then(unhex)
        .is_some_and(|tag| hmac::verify(&key, &signed_text, &tag).is_ok());
    Some(Delivery {
        headers,
        body,
        signed,
    })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn policy(port: u16, hook_url: &str, format: &str) -> String {
    format!(
        r#"
[secrets.openai]
source = "env:NOTIFY_OPENAI_KEY"

[[rules]]
name = "prod-writes"
hosts = ["api.prod.test"]
ports = [{port}]
methods = ["POST"]
ask = {{ hold = "0s", scope = ["once", "1h"], message = "Production write", notify = ["ops"] }}
dangerously_allow_cleartext = true  # a plain HTTP upstream on loopback
[rules.inject.headers]
authorization = "Bearer {{{{secret.openai}}}}"

[notify.ops]
url = "{hook_url}"
secret = "env:LATCHKEY_WEBHOOK_SECRET"
format = "{format}"

[identities.agent]
token = "env:AGENT_TOKEN"
rules = ["prod-writes"]
labels = {{ sandbox = "run-42", owner = "ana" }}
"#
    )
}

fn start(port: u16, hook_url: &str, format: &str, extra: &[&str]) -> Latchkey {
    let mut b = latchkey()
        .pin("api.prod.test")
        .env("LATCHKEY_WEBHOOK_SECRET", HOOK_SECRET)
        .env("AGENT_TOKEN", AGENT_TOKEN)
        .env("NOTIFY_OPENAI_KEY", OPENAI_KEY)
        .policy("main.toml", &policy(port, hook_url, format));
    for a in extra {
        b = b.arg(a);
    }
    b.run()
}

/// `POST http://api.prod.test:PORT{path}` as the agent, with `body`; the 403 and its approval id.
fn ask(lk: &Latchkey, port: u16, path: &str, body: &str) -> String {
    let request = format!(
        "POST http://api.prod.test:{port}{path} HTTP/1.1\r\nHost: api.prod.test:{port}\r\n\
         Proxy-Authorization: Bearer {AGENT_TOKEN}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let resp = raw_request(lk.addr(), request.as_bytes());
    assert_eq!(resp.status, 403, "{resp:#?}\nstderr:\n{}", lk.stderr_text());
    assert_eq!(
        resp.header("x-latchkey-reason"),
        Some("approval_pending"),
        "{resp:#?}"
    );
    resp.header("x-latchkey-approval")
        .unwrap_or_else(|| panic!("no x-latchkey-approval: {resp:#?}"))
        .to_string()
}

#[test]
fn a_parked_request_is_announced_once_signed_with_links_and_its_decision_follows() {
    let upstream = Upstream::http();
    let hook = Hook::start(&[200]);
    let lk = start(upstream.port(), &hook.url(), "json", &[]);
    let id = ask(&lk, upstream.port(), "/v1/items?dry=1", r#"{"name":"x"}"#);

    let seen = hook.wait_for(1, Duration::from_secs(10), &lk);
    let d = &seen[0];
    assert!(d.signed, "signature does not verify: {d:#?}");
    assert_eq!(d.header("content-type"), "application/json");
    assert_eq!(d.header("x-latchkey-event"), "approval.requested");
    let delivery = d.header("x-latchkey-delivery").to_string();
    assert!(!delivery.is_empty(), "{d:#?}");
    let ts: u64 = d
        .header("x-latchkey-timestamp")
        .parse()
        .expect("unix timestamp");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(ts <= now && now - ts < 60, "timestamp {ts} vs now {now}");
    let v = d.json();
    assert_eq!(v["event"], "approval.requested");
    assert_eq!(v["delivery"], delivery.as_str());
    let a = &v["approval"];
    assert_eq!(a["id"], id.as_str());
    assert_eq!(a["state"], "pending");
    assert_eq!(a["identity"], "agent");
    assert_eq!(a["labels"]["owner"], "ana");
    assert_eq!(a["method"], "POST");
    assert_eq!(a["host"], "api.prod.test");
    assert_eq!(a["rule"], "prod-writes");
    assert_eq!(a["message"], "Production write");
    assert_eq!(a["scopes"], serde_json::json!(["once", "1h"]));
    // What the webhook says is what the admin API says of the approval.
    let listed = admin_get(&lk, &format!("/approvals/{id}"));
    assert_eq!(listed.status, 200, "{listed:#?}");
    assert_eq!(a, &json_body(&listed), "delivery vs GET /approvals/{id}");

    // The announcement's signed link answers without the admin token.
    let admin = lk.admin_addr();
    let approve = v["links"]["approve"]["once"]
        .as_str()
        .expect("approve link")
        .to_string();
    let prefix = format!("http://{admin}/approvals/{id}/answer?");
    assert!(approve.starts_with(&prefix), "{approve} vs {prefix}");
    assert!(
        v["links"]["deny"]
            .as_str()
            .is_some_and(|l| l.starts_with(&prefix)),
        "{v}"
    );
    let path = &approve[format!("http://{admin}").len()..];
    let page = admin_request(admin, "GET", path, &[]);
    assert_eq!(page.status, 200, "{page:#?}");
    assert_eq!(
        json_body(&admin_get(&lk, &format!("/approvals/{id}")))["state"],
        "pending"
    );
    let tampered = path.replace("decision=approve", "decision=deny");
    assert_eq!(admin_request(admin, "POST", &tampered, &[]).status, 403);
    let answered = admin_request(admin, "POST", path, &[]);
    assert_eq!(answered.status, 200, "{answered:#?}");

    let seen = hook.wait_for(2, Duration::from_secs(10), &lk);
    let decided = &seen[1];
    assert!(decided.signed, "{decided:#?}");
    assert_eq!(decided.header("x-latchkey-event"), "approval.decided");
    assert_ne!(decided.header("x-latchkey-delivery"), delivery);
    let v = decided.json();
    assert_eq!(v["approval"]["state"], "approved");
    assert_eq!(v["approval"]["answer"]["by"], "link");
    assert_eq!(v["approval"]["answer"]["scope"], "once");
    // Exactly once each.
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(hook.deliveries().len(), 2, "{:#?}", hook.deliveries());
}

#[test]
fn a_receiver_failing_twice_gets_three_attempts_with_one_delivery_id() {
    let upstream = Upstream::http();
    let hook = Hook::start(&[500, 500, 200]);
    let lk = start(upstream.port(), &hook.url(), "json", &[]);
    let id = ask(&lk, upstream.port(), "/v1/items", "{}");
    // Backoff 1 s, then 2 s: the third attempt about 3 s after the first.
    let seen = hook.wait_for(3, Duration::from_secs(15), &lk);
    let ids: Vec<&str> = seen
        .iter()
        .map(|d| d.header("x-latchkey-delivery"))
        .collect();
    assert!(ids.iter().all(|d| *d == ids[0] && !d.is_empty()), "{ids:?}");
    assert!(seen
        .iter()
        .all(|d| d.signed && d.json()["approval"]["id"] == id.as_str()));
    thread::sleep(Duration::from_millis(2500));
    assert_eq!(hook.deliveries().len(), 3, "acked after the 200");
    assert!(
        lk.stderr_text().contains("answered 500"),
        "the failures are logged:\n{}",
        lk.stderr_text()
    );
}

#[test]
fn a_delivery_pending_at_kill_9_arrives_after_the_restart() {
    let state_dir = tempfile::tempdir().expect("state dir");
    survives_kill_9(&format!(
        "sqlite:{}",
        state_dir.path().join("state.db").display()
    ));
}

#[test]
fn a_delivery_pending_at_kill_9_arrives_after_the_restart_on_redis() {
    let redis = RedisServer::start();
    survives_kill_9(&redis.url());
}

/// Receiver down, request parked, latchkey killed with `kill -9`, receiver up, latchkey
/// restarted on the same `--state`: the announcement arrives.
fn survives_kill_9(state: &str) {
    let upstream = Upstream::http();
    // The receiver's port, with nothing listening on it yet.
    let reserved = TcpListener::bind("127.0.0.1:0").expect("reserve a port");
    let hook_addr = reserved.local_addr().expect("reserved address");
    drop(reserved);
    let url = format!("http://{hook_addr}/hook");

    let mut first = start(upstream.port(), &url, "json", &["--state", state]);
    let id = ask(&first, upstream.port(), "/v1/items", r#"{"n":1}"#);
    assert!(
        first.wait_stderr_contains("notification not delivered", Duration::from_secs(10)),
        "no failed attempt while the receiver is down:\n{}",
        first.stderr_text()
    );
    first.signal("KILL");
    assert!(first.wait_exit(Duration::from_secs(5)).is_some(), "kill -9");

    let hook = Hook::on(TcpListener::bind(hook_addr).expect("receiver up"), &[200]);
    let second = start(upstream.port(), &url, "json", &["--state", state]);
    let seen = hook.wait_for(1, Duration::from_secs(20), &second);
    assert!(seen[0].signed, "{:#?}", seen[0]);
    assert_eq!(seen[0].header("x-latchkey-event"), "approval.requested");
    assert_eq!(seen[0].json()["approval"]["id"], id.as_str());
    // The approval itself survived too, still pending.
    let listed = json_body(&admin_get(&second, "/approvals?state=pending"));
    assert!(
        listed["approvals"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x["id"] == id.as_str())),
        "{listed}"
    );
}

#[test]
fn a_secret_in_the_request_never_reaches_the_webhook_in_either_format() {
    let upstream = Upstream::http();
    for format in ["json", "slack"] {
        let hook = Hook::start(&[200]);
        let lk = start(upstream.port(), &hook.url(), format, &[]);
        let body = format!(r#"{{"key":"{OPENAI_KEY}","note":"hello"}}"#);
        let id = ask(
            &lk,
            upstream.port(),
            &format!("/v1/{OPENAI_KEY}/items?key={OPENAI_KEY}"),
            &body,
        );
        let seen = hook.wait_for(1, Duration::from_secs(10), &lk);
        let text = seen[0].text();
        for secret in [OPENAI_KEY, HOOK_SECRET, AGENT_TOKEN] {
            assert!(
                !text.contains(secret),
                "{format}: a secret in the delivery: {text}"
            );
        }
        assert!(seen[0].signed, "{format}: {:#?}", seen[0]);
        let v = seen[0].json();
        if format == "slack" {
            let line = v["text"].as_str().expect("slack text");
            assert!(
                line.starts_with("latchkey: identity agent asks to POST http://api.prod.test:"),
                "{line}"
            );
            assert!(line.ends_with("(rule prod-writes)"), "{line}");
            let blocks = v["blocks"].as_array().expect("blocks");
            let actions = blocks
                .iter()
                .find(|b| b["type"] == "actions")
                .expect("buttons");
            let urls: Vec<&str> = actions["elements"]
                .as_array()
                .expect("elements")
                .iter()
                .filter_map(|b| b["url"].as_str())
                .collect();
            assert_eq!(urls.len(), 3, "approve once, approve 1h, deny: {actions}");
            assert!(urls
                .iter()
                .all(|u| u.contains(&format!("/approvals/{id}/answer?"))));
        } else {
            assert_eq!(v["approval"]["id"], id.as_str());
            assert!(v["approval"]["preview"]
                .as_str()
                .is_some_and(|p| p.contains("hello")));
        }
        assert!(
            !lk.stderr_text().contains(OPENAI_KEY),
            "{format}: secret in the log"
        );
    }
}

/// What an approver is shown of a body is the body as sent, in the admin API and the webhook
/// alike: never a parsed and re-serialised reading (which keeps one value of a key sent twice,
/// rounds numbers, reorders nothing visibly). A JSON body with more than one reading — a key
/// twice, or two keys a loose parser reads as one (case, trailing NUL), at any depth — is
/// refused before anyone is asked: no approval, no delivery, nothing upstream.
#[test]
fn an_approver_sees_the_body_as_sent_and_an_ambiguous_body_is_refused_before_anyone_is_asked() {
    let upstream = Upstream::http();
    let hook = Hook::start(&[200]);
    let lk = start(upstream.port(), &hook.url(), "json", &[]);
    let port = upstream.port();
    let ambiguous = [
        r#"{"env":"production","env":"staging"}"#,
        r#"{"deploy":{"target":{"env":"production","ENV":"staging"}}}"#,
        r#"[{"name":"ok"},{"name":"a","name\u0000":"b"}]"#,
    ];
    for body in ambiguous {
        let request = format!(
            "POST http://api.prod.test:{port}/v1/deploy HTTP/1.1\r\nHost: api.prod.test:{port}\r\n\
             Proxy-Authorization: Bearer {AGENT_TOKEN}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let resp = raw_request(lk.addr(), request.as_bytes());
        assert_eq!(resp.status, 400, "{body}: {resp:#?}");
        assert_eq!(
            resp.header("x-latchkey-reason"),
            Some("bad_request"),
            "{body}"
        );
        let text = resp.text();
        assert!(
            text.contains("nobody was asked") && text.contains("more than one reading"),
            "{body}: {text}"
        );
    }
    let listed = json_body(&admin_get(&lk, "/approvals?state=pending"));
    assert_eq!(
        listed["approvals"].as_array().map(Vec::len),
        Some(0),
        "an ambiguous body was asked about: {listed:#}"
    );

    // Spacing, key order and a number no float holds, exactly as sent.
    let body = "{ \"env\" : \"production\",\n  \"replicas\": 100000000000000000001, \"note\": \"caf\\u00e9\" }";
    let id = ask(&lk, port, "/v1/deploy", body);
    let seen = hook.wait_for(1, Duration::from_secs(10), &lk);
    // Give a stray delivery for a refused body time to show up.
    thread::sleep(Duration::from_millis(500));
    let seen_all = hook.deliveries();
    assert_eq!(
        seen_all.len(),
        1,
        "only the clean body was announced: {seen_all:#?}"
    );
    assert_eq!(seen[0].json()["approval"]["preview"], body, "the webhook");
    let shown = json_body(&admin_get(&lk, &format!("/approvals/{id}")));
    assert_eq!(shown["preview"], body, "the admin API: {shown:#}");
    assert!(upstream.received().is_empty(), "nothing went upstream");

    let records = lk.wait_audit(ambiguous.len() + 1);
    let refused: Vec<&Value> = records
        .iter()
        .filter(|r| r["reason"] == "bad_request")
        .collect();
    assert_eq!(refused.len(), ambiguous.len(), "{records:#?}");
    for r in refused {
        assert_eq!(r["status"], 400, "{r:#}");
        assert!(r["approval"].is_null(), "{r:#}");
    }
}

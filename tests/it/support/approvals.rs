//! Support for the approval tests: an HTTPS echo upstream and latchkey with an `ask` policy
//! ([`ask_world`]), the admin API as an approver uses it ([`Admin`]: list, show, approve and
//! deny through `POST /approvals/ID`), requests as the sandbox sends them ([`send`], curl with
//! `--proxy-user`), `latchkey approvals ...` run as a CLI ([`approvals_cli`]), and a webhook
//! receiver on loopback ([`Receiver`]) that records every delivery.
//!
//! Approvals are asserted on their public JSON (`GET /approvals/ID`), whose field names are the
//! contract in book "Approvals".

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::clients::{curl, dial, read_response, CurlOutput, RawResponse};
use super::latchkey::SCRUBBED_ENV;
use super::latchkey::{latchkey, wait_with_timeout, CliOutput, Latchkey, LatchkeyBuilder, BIN};
use super::{TestCa, Upstream, PINNED};

/// The sandbox identities' tokens (distinctive, so a leak would show).
pub const AGENT_TOKEN: &str = "tok-agent-3c9f1a7e5b2d8046";
pub const LAB_TOKEN: &str = "tok-lab-8e2b6d4f0a1c3975";
/// The admin token tests set with `--admin-token env:LK_ADMIN_TOKEN`.
pub const ADMIN_TOKEN: &str = "adm-approvals-6d1e9b3f7a20c458";

/// The usual ask policy: `prod-writes` (POST/DELETE on api.test) asks with `hold` and `scopes`
/// (a TOML array body, e.g. `"once", "1h", "session"`), injecting a header once approved;
/// `reads` (GET on api.test) is allowed outright. Identities `agent` (with labels) and `lab`
/// may use both. `PORT` is replaced by the upstream's port.
pub fn ask_policy(hold: &str, scopes: &str) -> String {
    format!(
        r#"
[[rules]]
name    = "prod-writes"
hosts   = ["api.test"]
ports   = [PORT]
methods = ["POST", "DELETE"]
ask     = {{ hold = "{hold}", scope = [{scopes}], message = "Production write" }}
[rules.inject.headers]
x-test-injected = "literal value"

[[rules]]
name    = "reads"
hosts   = ["api.test"]
ports   = [PORT]
methods = ["GET"]

[identities.agent]
token  = "env:AGENT_TOKEN"
rules  = ["prod-writes", "reads"]
labels = {{ sandbox = "run-42", owner = "ana", env = "ci" }}

[identities.lab]
token = "env:LAB_TOKEN"
rules = ["prod-writes", "reads"]
"#
    )
}

/// A test CA, an HTTPS echo upstream signed by it, and latchkey with `policy` (its `PORT`
/// replaced by the upstream's), the identities' tokens and the admin token in its environment.
pub struct AskWorld {
    pub lk: Latchkey,
    pub upstream: Upstream,
    pub admin: Admin,
    /// Signed the upstream's certificate: lives as long as the world.
    _ca: TestCa,
}

impl AskWorld {
    /// `https://api.test:PORT{path}`
    pub fn url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.upstream.port())
    }

    pub fn port(&self) -> u16 {
        self.upstream.port()
    }
}

/// Starts an [`AskWorld`]; `configure` adds arguments (the admin token is set in the
/// environment but only required when `configure` passes `--admin-token env:LK_ADMIN_TOKEN`).
pub fn ask_world(
    policy: &str,
    configure: impl FnOnce(LatchkeyBuilder) -> LatchkeyBuilder,
) -> AskWorld {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let lk = start(&ca, &upstream, policy, configure);
    let admin = Admin::new(lk.admin_addr(), Some(ADMIN_TOKEN));
    AskWorld {
        lk,
        upstream,
        admin,
        _ca: ca,
    }
}

/// latchkey trusting `ca`, with `policy` for `upstream`'s port, the test names pinned and the
/// tokens in its environment.
pub fn start(
    ca: &TestCa,
    upstream: &Upstream,
    policy: &str,
    configure: impl FnOnce(LatchkeyBuilder) -> LatchkeyBuilder,
) -> Latchkey {
    let mut builder = latchkey()
        .upstream_ca(ca)
        .env("AGENT_TOKEN", AGENT_TOKEN)
        .env("LAB_TOKEN", LAB_TOKEN)
        .env("LK_ADMIN_TOKEN", ADMIN_TOKEN)
        .policy(
            "main.toml",
            &policy.replace("PORT", &upstream.port().to_string()),
        );
    for host in PINNED {
        builder = builder.pin(host);
    }
    configure(builder).run()
}

/// Hex SHA-256, as approvals show a body's.
pub fn sha256_hex(bytes: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The sandbox's requests

/// One request through the proxy with curl as `user` (`agent:TOKEN`; `None`: no identity), a
/// JSON `body` when given.
pub fn send(
    lk: &Latchkey,
    user: Option<&str>,
    method: &str,
    url: &str,
    body: Option<&str>,
) -> CurlOutput {
    let mut args: Vec<String> = vec!["-X".into(), method.into()];
    if let Some(user) = user {
        args.push("--proxy-user".into());
        args.push(user.into());
    }
    if let Some(body) = body {
        args.extend([
            "-H".to_string(),
            "content-type: application/json".to_string(),
            "--data-binary".to_string(),
            body.to_string(),
        ]);
    }
    args.push(url.into());
    curl(lk).args(args).run()
}

/// `agent:TOKEN` for curl's `--proxy-user`.
pub fn agent() -> String {
    format!("agent:{AGENT_TOKEN}")
}

/// `lab:TOKEN` for curl's `--proxy-user`.
pub fn lab() -> String {
    format!("lab:{LAB_TOKEN}")
}

/// The `x-latchkey-approval` header of a refusal; panics when it is missing.
pub fn approval_header(resp: &RawResponse) -> String {
    resp.header("x-latchkey-approval")
        .unwrap_or_else(|| panic!("no x-latchkey-approval header: {resp:#?}"))
        .to_string()
}

/// The `retry-after` of a refusal in seconds; panics when it is missing or not a number.
pub fn retry_after(resp: &RawResponse) -> u64 {
    resp.header("retry-after")
        .unwrap_or_else(|| panic!("no retry-after header: {resp:#?}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("retry-after is not seconds ({e}): {resp:#?}"))
}

// ---------------------------------------------------------------------------------------------
// The admin API

/// An approver's client for the admin API at `addr`, with the admin token when given.
#[derive(Clone, Debug)]
pub struct Admin {
    pub addr: SocketAddr,
    pub token: Option<String>,
}

impl Admin {
    pub fn new(addr: SocketAddr, token: Option<&str>) -> Self {
        Admin {
            addr,
            token: token.map(str::to_string),
        }
    }

    /// `http://ADDR`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `METHOD path` with the token (if any), `body` as JSON when given.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> RawResponse {
        let bearer = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let mut headers: Vec<(&str, &str)> = Vec::new();
        if let Some(b) = &bearer {
            headers.push(("Authorization", b));
        }
        let text = body.map(Value::to_string);
        if text.is_some() {
            headers.push(("Content-Type", "application/json"));
        }
        http_call(
            self.addr,
            method,
            path,
            &headers,
            text.as_deref().unwrap_or("").as_bytes(),
        )
    }

    /// `GET /approvals?state=STATE`, asserted 200: the approvals.
    pub fn list(&self, state: &str) -> Vec<Value> {
        let resp = self.call("GET", &format!("/approvals?state={state}"), None);
        assert_eq!(resp.status, 200, "GET /approvals?state={state}: {resp:#?}");
        json(&resp)["approvals"]
            .as_array()
            .unwrap_or_else(|| panic!("GET /approvals has no approvals array: {resp:#?}"))
            .clone()
    }

    /// `GET /approvals/ID`, asserted 200.
    pub fn show(&self, id: &str) -> Value {
        let resp = self.call("GET", &format!("/approvals/{id}"), None);
        assert_eq!(resp.status, 200, "GET /approvals/{id}: {resp:#?}");
        json(&resp)
    }

    /// `POST /approvals/ID` with `body`; the raw answer.
    pub fn answer(&self, id: &str, body: &Value) -> RawResponse {
        self.call("POST", &format!("/approvals/{id}"), Some(body))
    }

    /// Approves `id` with `scope` (`None`: the default), asserted 200; the updated approval.
    pub fn approve(&self, id: &str, scope: Option<&str>) -> Value {
        let mut body =
            serde_json::json!({"decision": "approve", "by": "ana", "note": "looks fine"});
        if let Some(scope) = scope {
            body["scope"] = Value::from(scope);
        }
        let resp = self.answer(id, &body);
        assert_eq!(resp.status, 200, "approve {id} ({scope:?}): {resp:#?}");
        json(&resp)
    }

    /// Denies `id`, asserted 200; the updated approval.
    pub fn deny(&self, id: &str) -> Value {
        let resp = self.answer(
            id,
            &serde_json::json!({"decision": "deny", "by": "ana", "note": "not today"}),
        );
        assert_eq!(resp.status, 200, "deny {id}: {resp:#?}");
        json(&resp)
    }

    /// Waits (up to `timeout`) until `n` approvals are pending; returns them (newest first).
    pub fn wait_pending(&self, n: usize, timeout: Duration) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let pending = self.list("pending");
            if pending.len() >= n {
                return pending;
            }
            assert!(
                Instant::now() < deadline,
                "expected {n} pending approvals within {timeout:?}, found {pending:#?}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The JSON body of an answer; panics with the answer if it is not JSON.
pub fn json(resp: &RawResponse) -> Value {
    serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("answer is not JSON ({e}): {resp:#?}"))
}

/// One HTTP/1.1 request to `addr` on a fresh connection (`path` with its query), with `body`.
pub fn http_call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> RawResponse {
    let mut tcp = dial(addr);
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes()).expect("send request head");
    tcp.write_all(body).expect("send request body");
    read_response(&mut tcp, false).unwrap_or_else(|e| panic!("read answer to {method} {path}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// The CLI

/// Runs `latchkey approvals ARGS... --admin-url URL` with the admin token in
/// `LATCHKEY_ADMIN_TOKEN`'s source form (`env:LK_ADMIN_TOKEN`) when `token` is set.
pub fn approvals_cli(admin: &Admin, args: &[&str]) -> CliOutput {
    let mut cmd = Command::new(BIN);
    cmd.arg("approvals")
        .args(args)
        .arg("--admin-url")
        .arg(admin.url());
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    cmd.env_remove("LATCHKEY_ADMIN_URL");
    match &admin.token {
        Some(t) => {
            cmd.env("LK_ADMIN_TOKEN", t)
                .arg("--admin-token")
                .arg("env:LK_ADMIN_TOKEN");
        }
        None => {
            cmd.env_remove("LATCHKEY_ADMIN_TOKEN");
        }
    }
    wait_with_timeout(&mut cmd, Duration::from_secs(20))
}

// ---------------------------------------------------------------------------------------------
// A webhook receiver

/// One delivery as the receiver got it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Delivery {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "delivery is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// A plain HTTP webhook receiver on 127.0.0.1 answering 200 to every POST and recording it.
pub struct Receiver {
    pub addr: SocketAddr,
    got: Arc<Mutex<Vec<Delivery>>>,
}

impl Receiver {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind webhook receiver");
        let addr = listener.local_addr().expect("receiver address");
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = got.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let sink = sink.clone();
                thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                    let mut reader = BufReader::new(stream);
                    loop {
                        let Some(d) = read_delivery(&mut reader) else {
                            return;
                        };
                        sink.lock().expect("deliveries").push(d);
                        let out = reader.get_mut();
                        if out
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                            .is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        Receiver { addr, got }
    }

    /// `http://127.0.0.1:PORT/hook`
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.got.lock().expect("deliveries").clone()
    }

    /// Waits (up to `timeout`) for a delivery whose JSON satisfies `pick`.
    pub fn wait_for(&self, timeout: Duration, pick: impl Fn(&Value) -> bool) -> Delivery {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(d) = self
                .deliveries()
                .into_iter()
                .find(|d| serde_json::from_slice(&d.body).is_ok_and(|v: Value| pick(&v)))
            {
                return d;
            }
            assert!(
                Instant::now() < deadline,
                "no matching delivery within {timeout:?}; got: {:#?}",
                self.deliveries()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

fn read_delivery<R: Read>(reader: &mut BufReader<R>) -> Option<Delivery> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (n, v) = h.split_once(':')?;
        headers.push((n.trim().to_string(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).ok()?;
    Some(Delivery { headers, body })
}

/// The records of `records` with `method` (e.g. `"APPROVAL"`, `"POST"`).
pub fn with_method<'a>(records: &'a [Value], method: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["method"] == method).collect()
}

// ---------------------------------------------------------------------------------------------
// Slack interactivity

/// A `block_actions` payload as Slack sends it for a click by `user` on a button of `value`
/// (form-encoded, ready to sign and POST).
pub fn slack_payload(user: &str, value: &str, response_url: &str) -> String {
    let p = serde_json::json!({
        "type": "block_actions",
        "user": {"id": user, "username": "ana", "name": "ana", "team_id": "T0"},
        "api_app_id": "A0", "token": "legacy-verification-token",
        "container": {"type": "message", "message_ts": "1.2", "channel_id": "C0"},
        "actions": [{"action_id": "x", "block_id": "b", "type": "button", "value": value,
                     "action_ts": "1.3"}],
        "response_url": response_url,
    });
    url::form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &p.to_string())
        .finish()
}

/// Slack's `v0=` signature of `body` at `ts` under `secret`.
pub fn slack_signature(secret: &str, ts: u64, body: &str) -> String {
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = aws_lc_rs::hmac::sign(&key, format!("v0:{ts}:{body}").as_bytes());
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("v0={hex}")
}

/// UNIX seconds now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// POSTs `body` to `/slack/actions/{notifier}` on `addr` with Slack's headers (no admin token).
pub fn slack_post(
    addr: SocketAddr,
    notifier: &str,
    ts: Option<u64>,
    sig: Option<&str>,
    body: &str,
) -> RawResponse {
    let ts = ts.map(|t| t.to_string());
    let mut headers = vec![("Content-Type", "application/x-www-form-urlencoded")];
    if let Some(ts) = &ts {
        headers.push(("X-Slack-Request-Timestamp", ts));
    }
    if let Some(sig) = sig {
        headers.push(("X-Slack-Signature", sig));
    }
    let path = format!("/slack/actions/{notifier}");
    http_call(addr, "POST", &path, &headers, body.as_bytes())
}

/// The values of the buttons of a Slack message, by `action_id`; panics without buttons.
pub fn slack_buttons(message: &Value) -> Vec<(String, String)> {
    let actions = message["blocks"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["type"] == "actions"))
        .unwrap_or_else(|| panic!("no buttons: {message:#}"));
    actions["elements"]
        .as_array()
        .expect("elements")
        .iter()
        .map(|b| {
            assert!(
                b.get("url").is_none(),
                "an interactive button with a url: {b}"
            );
            let id = b["action_id"].as_str().expect("action_id").to_string();
            (id, b["value"].as_str().expect("a button value").to_string())
        })
        .collect()
}

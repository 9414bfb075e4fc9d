//! `latchkey demo`: the real binary, its self-check, and the curl commands it prints, run with
//! real curl while it stays up. The demo secret is read from the demo directory's 0600 file
//! (where the demo policy's `file:` source points) only to prove it never shows up anywhere.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::assert_record;
use crate::support::audit::chained_lines;
use crate::support::latchkey::{wait_with_timeout, BIN, SCRUBBED_ENV};

const MARKER: &str = "[REDACTED:demo_token]";

fn demo_command(dir: &Path, once: bool) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("demo")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--dir")
        .arg(dir);
    if once {
        cmd.arg("--once");
    }
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    cmd
}

/// The demo secret, from the file the demo policy sources it from; checks its mode.
fn demo_secret(dir: &Path) -> String {
    let path = dir.join("secrets/demo-token");
    let mode = std::fs::metadata(&path)
        .expect("the demo writes its secret file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "secret file mode {:o}", mode & 0o777);
    let secret = std::fs::read_to_string(&path).expect("read the demo secret");
    assert!(
        secret.len() >= 32,
        "the demo secret is too short to mean much"
    );
    secret
}

/// The request records (outcomes) written so far; every line's chain link and schema checked.
fn audit_records(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("audit.jsonl")).unwrap_or_default();
    chained_lines(&text)
        .unwrap_or_else(|problem| panic!("the demo's audit log: {problem}"))
        .into_iter()
        .filter(|l| l["phase"] == "outcome")
        .collect()
}

/// The secret appears in none of these texts, nor in the demo's audit file or latchkey's log.
fn assert_secret_nowhere(dir: &Path, secret: &str, texts: &[(&str, &str)]) {
    for (what, text) in texts {
        assert!(
            !text.contains(secret),
            "{what} holds the demo secret:\n{text}"
        );
    }
    for file in ["audit.jsonl", "latchkey.log"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        assert!(!text.is_empty(), "{file} is empty");
        assert!(!text.contains(secret), "{file} holds the demo secret");
    }
}

/// The four self-check records, in order: allow, inject, redact (each allowed under echo-read
/// with the secret named), then the denied POST.
fn assert_check_records(records: &[Value]) {
    for (record, path) in records[..3].iter().zip(["/hello", "/whoami", "/reflect"]) {
        assert_record(
            record,
            json!({"method": "GET", "path": path, "decision": "allow", "rule": "echo-read",
                   "reason": "allowed", "status": 200, "secrets": ["demo_token"],
                   "host": "echo.latchkey.demo"}),
        );
        assert!(
            record["redactions"].as_u64() >= Some(1),
            "the echo reflected the secret, so something was redacted: {record:#}"
        );
    }
    assert_record(
        &records[3],
        json!({"method": "POST", "path": "/hello", "decision": "deny", "rule": "echo-read",
               "reason": "method_not_allowed", "status": 403, "upstream": null, "secrets": []}),
    );
}

#[test]
fn demo_once_checks_allow_inject_redact_and_deny_then_exits_0() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = wait_with_timeout(&mut demo_command(dir.path(), true), Duration::from_secs(60));
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let stdout = &out.stdout;
    for title in [
        "1. allow:",
        "2. inject:",
        "3. redact:",
        "4. deny:",
        "All four checks passed",
    ] {
        assert!(stdout.contains(title), "no {title:?} in:\n{stdout}");
    }
    assert!(!stdout.contains("FAILED"), "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.trim() == "ok").count(),
        4,
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("\"authorization\": \"Bearer {MARKER}\"")),
        "the redact check shows the marker: {stdout}"
    );
    assert!(
        stdout.contains("x-latchkey-reason: method_not_allowed"),
        "{stdout}"
    );
    let secret = demo_secret(dir.path());
    assert!(
        stdout.contains(&format!("Bearer <{} bytes>", secret.len())),
        "the inject check shows the credential's length: {stdout}"
    );
    assert_secret_nowhere(
        dir.path(),
        &secret,
        &[("stdout", stdout), ("stderr", &out.stderr)],
    );
    let records = audit_records(dir.path());
    assert_eq!(records.len(), 4, "{records:#?}");
    assert_check_records(&records);
    // Every record the demo printed is one of the file's lines.
    for record in &records {
        let id = record["id"].as_str().expect("id");
        assert!(stdout.contains(&format!("\"id\":\"{id}\"")), "{stdout}");
    }
}

/// `latchkey demo` staying up: its stdout lines as they come, killed on drop.
struct RunningDemo {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: String,
}

impl RunningDemo {
    fn start(dir: &Path) -> RunningDemo {
        let mut cmd = demo_command(dir, false);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawn latchkey demo");
        let stdout = child.stdout.take().expect("demo stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        RunningDemo {
            child,
            lines,
            seen: String::new(),
        }
    }

    /// Reads stdout until a line contains `needle` (60 s at most).
    fn wait_for(&mut self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.seen.contains(needle) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                }
                Err(_) => panic!(
                    "the demo never printed {needle:?}; it printed:\n{}",
                    self.seen
                ),
            }
        }
    }

    /// Sends `signal` with `kill -SIGNAL PID`.
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }
}

impl Drop for RunningDemo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a printed command line with `sh -c`, in an environment that would send curl elsewhere
/// if the command relied on it: the printed flags alone must decide where it goes.
fn run_printed(command: &str) -> (Option<i32>, String) {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(command);
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    cmd.env("NO_PROXY", "*")
        .env("no_proxy", "*")
        .env("HTTPS_PROXY", "http://127.0.0.1:9")
        .env("https_proxy", "http://127.0.0.1:9");
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(30));
    (out.code(), format!("{}{}", out.stdout, out.stderr))
}

/// The status of a `curl -i` answer: the last status line's code (a CONNECT adds its own).
fn status_of(response: &str) -> u16 {
    response
        .lines()
        .rfind(|l| l.starts_with("HTTP/"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in:\n{response}"))
}

/// The body of a `curl -i` answer: after the last header block (a CONNECT adds its own).
fn body_of(response: &str) -> &str {
    response
        .rsplit_once("\r\n\r\n")
        .map(|(_, body)| body)
        .unwrap_or(response)
}

#[test]
fn the_curl_commands_the_demo_prints_show_allow_inject_redact_and_deny() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut demo = RunningDemo::start(dir.path());
    demo.wait_for("latchkey is still running");
    assert!(
        demo.seen.contains("All four checks passed"),
        "{}",
        demo.seen
    );
    let commands: Vec<String> = demo
        .seen
        .lines()
        .filter_map(|l| l.strip_prefix("  $ "))
        .map(str::to_string)
        .collect();
    assert_eq!(commands.len(), 4, "{}", demo.seen);
    for c in &commands {
        assert!(
            c.starts_with("curl ") && c.contains(" --proxy ") && c.contains(" --cacert "),
            "{c}"
        );
    }
    let secret = demo_secret(dir.path());

    let mut outputs = Vec::new();
    for c in &commands {
        let (code, text) = run_printed(c);
        assert_eq!(code, Some(0), "{c}:\n{text}");
        outputs.push(text);
    }
    // allow: the echo answered, through latchkey (its id header).
    let allow = &outputs[0];
    assert_eq!(status_of(allow), 200, "{allow}");
    assert!(allow.contains("x-latchkey-id: "), "{allow}");
    let echo: Value = serde_json::from_str(body_of(allow)).expect("echo JSON");
    assert_eq!(echo["path"], "/hello", "{allow}");
    // inject: curl sent no Authorization, the echo received Bearer and the secret's length.
    let inject: Value = serde_json::from_str(body_of(&outputs[1])).expect("echo JSON");
    assert_eq!(inject["path"], "/whoami");
    assert_eq!(
        inject["authorization_received"]["scheme"], "Bearer",
        "{inject:#}"
    );
    assert_eq!(
        inject["authorization_received"]["credential_bytes"],
        secret.len(),
        "{inject:#}"
    );
    // redact: the reflection reached curl as the marker, in the body and in the header.
    let redact = &outputs[2];
    let reflected: Value = serde_json::from_str(body_of(redact)).expect("echo JSON");
    assert_eq!(
        reflected["headers"]["authorization"],
        format!("Bearer {MARKER}"),
        "{redact}"
    );
    assert!(
        redact.contains(&format!("x-echo-authorization: Bearer {MARKER}")),
        "{redact}"
    );
    // deny: 403 with latchkey's reason, closest rule and sentence.
    let deny = &outputs[3];
    assert_eq!(status_of(deny), 403, "{deny}");
    assert!(
        deny.contains("x-latchkey-reason: method_not_allowed"),
        "{deny}"
    );
    assert!(deny.contains("x-latchkey-rule: echo-read"), "{deny}");
    assert!(
        body_of(deny).starts_with("latchkey: denied: no rule allows POST"),
        "{deny}"
    );

    // The demo's four and curl's four, each pair alike.
    let deadline = Instant::now() + Duration::from_secs(10);
    while audit_records(dir.path()).len() < 8 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    let records = audit_records(dir.path());
    assert_eq!(records.len(), 8, "{records:#?}");
    assert_check_records(&records[..4]);
    assert_check_records(&records[4..]);
    let texts: Vec<(&str, &str)> = outputs
        .iter()
        .map(|o| ("curl output", o.as_str()))
        .collect();
    assert_secret_nowhere(dir.path(), &secret, &texts);
    assert!(!demo.seen.contains(&secret), "the demo printed its secret");

    // SIGTERM stops the demo and its latchkey: exit 0, and the proxy port is closed.
    demo.signal("TERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = demo.child.try_wait().expect("poll demo") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not stop on SIGTERM"
        );
        thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let (code, text) = run_printed(&commands[0]);
    assert_eq!(
        code,
        Some(7),
        "curl should find nothing listening once the demo stopped:\n{text}"
    );
}

#[test]
fn demo_refuses_to_listen_beyond_loopback() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new(BIN);
    cmd.args(["demo", "--once", "--listen", "0.0.0.0:0", "--dir"])
        .arg(dir.path());
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(20));
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(out.stderr.contains("loopback only"), "{out:#?}");
    assert!(
        !dir.path().join("policies").exists(),
        "nothing is written before the listen address is accepted"
    );
}

#[test]
fn demo_on_a_taken_port_says_latchkey_did_not_start_and_how_to_pick_another() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("take a port");
    let addr = taken.local_addr().expect("address").to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new(BIN);
    cmd.args(["demo", "--once", "--listen", &addr, "--dir"])
        .arg(dir.path());
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(30));
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("latchkey serve did not start")
            && out.stderr.contains(&format!("cannot listen on {addr}"))
            && out.stderr.contains("--listen 127.0.0.1:0"),
        "{out:#?}"
    );
    assert!(!out.stdout.contains("All four checks passed"), "{out:#?}");
}

#[test]
fn demo_refuses_a_dir_whose_policies_hold_other_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("policies")).expect("policies dir");
    std::fs::write(
        dir.path().join("policies/wide.toml"),
        "[[rules]]\nname = \"wide\"\nhosts = [\"*.example.com\"]\n",
    )
    .expect("write a foreign policy");
    let mut cmd = demo_command(dir.path(), true);
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(30));
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("wide.toml") && out.stderr.contains("latchkey would load too"),
        "{out:#?}"
    );
}

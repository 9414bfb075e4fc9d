//! The console in a real browser: Debian's chromium, driven by Playwright for Python
//! (tests/clients/console_browser.py), against `latchkey serve --console` on loopback. A
//! read-only person sees no approve button; an approver signs in, watches a request made by
//! curl through latchkey appear live on the traffic page, opens its record and explains it,
//! approves one parked request (the client's request completes) and denies another (the client
//! is refused), filters the traffic to denials (an allowed request never shows, a denied one
//! does), revokes a session from its row and sees its open tunnel cut, compares a candidate
//! policy chosen as a file, and visits every page. Each page's screenshot is kept under
//! `target/tmp/console-screenshots` (the book's are copies of these); every page's text is
//! swept for the test's secrets.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::console::{world, APPROVER_TOKEN, READER_TOKEN, SECRETS};
use crate::support::approvals::{agent, send, ADMIN_TOKEN};
use crate::support::sessions::{admin_json, basic, connect_as};
use crate::support::toolchain;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/console_browser.py"
);

#[test]
fn console_in_chromium_shows_live_traffic_and_answers_parked_requests() {
    toolchain::tool("chromium");
    let w = world(true);
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).expect("mkdir screenshots");
    let candidate = crate::console::policy()
        .replace("PORT", &w.port().to_string())
        .replace(
            "hosts   = [\"api.test\"]\nports   = [",
            "hosts   = [\"api.test\", \"wider.test\"]\nports   = [",
        );
    assert!(candidate.contains("wider.test"));
    let candidate_file = shots.join("candidate.toml");
    std::fs::write(&candidate_file, &candidate).expect("write the candidate");
    let config = serde_json::json!({
        "candidate_file": candidate_file,
        "admin": format!("http://{}", w.lk.admin_addr()),
        "reader": READER_TOKEN,
        "approver": APPROVER_TOKEN,
        "shots": shots,
        "chromium": "/usr/bin/chromium",
    });
    let mut child = Command::new(toolchain::python())
        .arg(SCRIPT)
        .arg(config.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start console_browser.py");
    let mut to_script = child.stdin.take().expect("stdin");
    let from_script = BufReader::new(child.stdout.take().expect("stdout"));
    let mut answer = |line: &str| {
        writeln!(to_script, "{line}").expect("answer the script");
        to_script.flush().expect("flush");
    };
    let url = w.url("api.test", "/v1/items");
    let mut result = None;
    let mut outcomes = Vec::new();
    let mut cut = None;
    thread::scope(|s| {
        let mut held = None;
        let mut tunnel = None;
        for line in from_script.lines() {
            let line = line.expect("read the script's output");
            if let Some(json) = line.strip_prefix("RESULT ") {
                result = Some(serde_json::from_str::<serde_json::Value>(json).expect("RESULT"));
                break;
            }
            let Some(step) = line.strip_prefix("STEP ") else {
                continue;
            };
            match step {
                "reader-signed-in" => answer("ok"),
                "traffic-open" => {
                    let out = send(&w.lk, Some(&agent()), "GET", &url, None);
                    assert_eq!(out.ok().status, 200, "the live request failed");
                    answer("ok");
                }
                "traffic-filtered-open" => {
                    let out = send(&w.lk, Some(&agent()), "GET", &url, None);
                    assert_eq!(out.ok().status, 200, "the allowed request failed");
                    let other = w.url("other.test", "/no/rule");
                    let out = send(&w.lk, Some(&agent()), "GET", &other, None);
                    assert_eq!(out.response.status, 403, "no rule, and not refused");
                    answer("ok");
                }
                "session-open" => {
                    let (status, made) = admin_json(
                        &w.lk,
                        "POST",
                        "/sessions",
                        Some(&serde_json::json!({"profile": "worker"})),
                        Some(ADMIN_TOKEN),
                    );
                    assert_eq!(status, 201, "{made:#}");
                    let authority = format!("tunnel.test:{}", w.port());
                    let (mut tcp, resp) = connect_as(w.lk.addr(), &authority, &basic(&made));
                    assert_eq!(resp.status, 200, "the session's tunnel: {resp:#?}");
                    tcp.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3])
                        .expect("bytes through the tunnel");
                    tunnel = Some(tcp);
                    answer(&format!("ok {}", made["id"].as_str().expect("session id")));
                }
                "session-revoked" => {
                    let mut tcp = tunnel.take().expect("an open tunnel");
                    let asked = Instant::now();
                    tcp.set_read_timeout(Some(Duration::from_secs(10)))
                        .expect("read timeout");
                    let mut buf = [0u8; 1024];
                    let closed = loop {
                        match tcp.read(&mut buf) {
                            Ok(0) => break true,
                            Ok(_) => {}
                            Err(e)
                                if e.kind() == std::io::ErrorKind::WouldBlock
                                    || e.kind() == std::io::ErrorKind::TimedOut =>
                            {
                                break false
                            }
                            Err(_) => break true,
                        }
                    };
                    cut = Some((closed, asked.elapsed()));
                    answer("ok");
                }
                "parked-approve" | "parked-deny" => {
                    let before = w.admin.wait_pending(0, Duration::from_secs(1)).len();
                    let url = url.clone();
                    let w = &w;
                    held = Some(s.spawn(move || {
                        send(&w.lk, Some(&agent()), "POST", &url, Some(r#"{"n":1}"#))
                    }));
                    let pending = w.admin.wait_pending(before + 1, Duration::from_secs(15));
                    let id = pending
                        .iter()
                        .filter_map(|p| p["id"].as_str())
                        .next_back()
                        .expect("a pending approval's id")
                        .to_string();
                    answer(&format!("ok {id}"));
                }
                "answered-approve" | "answered-deny" => {
                    let out = held.take().expect("a parked request").join().expect("curl");
                    outcomes.push((step.to_string(), out));
                    answer("ok");
                }
                other => panic!("the script asked for an unknown step {other:?}"),
            }
        }
    });
    drop(to_script);
    let out = child.wait_with_output().expect("wait for the script");
    assert!(
        out.status.success() && result.is_some(),
        "console_browser.py failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let result = result.expect("a RESULT line");

    assert_eq!(
        result["reader_approve_buttons"], 0,
        "a read-only person can approve"
    );
    let row = result["traffic_row"].as_str().unwrap_or_default();
    assert!(
        row.contains("GET") && row.contains("api.test") && row.contains("allow"),
        "the live row: {row}"
    );
    let detail = result["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("\"rule\": \"reads\""),
        "the record: {detail}"
    );
    let explain = result["explain"].as_str().unwrap_or_default();
    assert!(
        explain.contains("reads"),
        "explain did not name the rule: {explain}"
    );
    let rows = result["filtered_rows"].to_string();
    assert!(
        rows.contains("other.test") && rows.contains("deny") && !rows.contains("/v1/items"),
        "the traffic filtered to denials: {rows}"
    );
    assert!(
        result["filtered_url"]
            .as_str()
            .is_some_and(|u| u.contains("decision=deny")),
        "{result:#}"
    );
    let diff = result["diff_page"].as_str().unwrap_or_default();
    assert!(
        diff.contains("widens reach") && diff.contains("wider.test"),
        "the candidate chosen as a file: {diff}"
    );
    let revoked = result["revoke_page"].as_str().unwrap_or_default();
    assert!(revoked.contains("connections are cut"), "{revoked}");
    let (closed, after) = cut.expect("the tunnel was watched");
    assert!(
        closed && after < Duration::from_secs(5),
        "revoking in the browser did not cut the open tunnel (closed {closed}, after {after:?})"
    );
    let approved = result["approve_page"].as_str().unwrap_or_default();
    assert!(approved.contains("approved"), "{approved}");
    for (step, out) in &outcomes {
        let status = out.ok().status;
        match step.as_str() {
            "answered-approve" => assert_eq!(status, 200, "the approved request did not complete"),
            _ => assert_eq!(status, 403, "the denied request was not refused"),
        }
    }
    assert_eq!(
        result["console_errors"],
        serde_json::json!([]),
        "the pages logged errors (a CSP violation shows here)"
    );
    let text = result.to_string();
    for secret in SECRETS {
        assert!(!text.contains(secret), "a page showed a secret");
    }
    for page in [
        "overview",
        "traffic",
        "explain",
        "approvals",
        "sessions",
        "limits",
        "policy",
    ] {
        let shot = shots.join(format!("console-{page}.png"));
        let len = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
        assert!(len > 10_000, "no screenshot of {page} ({len} bytes)");
    }
}

//! A WebSocket under byte budgets (tests/clients/ws_echo.py at both ends): each message toward
//! the upstream is reserved against `bytes_up` before it goes (past the budget the socket is
//! closed `1008` and recorded `budget_exhausted`; a new handshake is then refused `429`), and an
//! unfinished (fragmented) message is held against `--max-buffered-bytes` as it arrives (past
//! it the socket is closed `1013`, `too_busy`).

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::credentials::PyServer;
use crate::support::{latchkey, Latchkey, TestCa};

const BUDGET: u64 = 4000;

fn policy(port: u16) -> String {
    format!(
        r#"
[limits.exfil]
bytes_up = "4KB/day"

[[rules]]
name      = "realtime"
hosts     = ["api.test"]
ports     = [{port}]
paths     = ["/realtime/**"]
websocket = true
limits    = ["exfil"]
"#
    )
}

fn world(args: &[&str]) -> (PyServer, Latchkey) {
    world_with(args, policy)
}

fn world_with(args: &[&str], policy: fn(u16) -> String) -> (PyServer, Latchkey) {
    let ca = TestCa::new();
    let (cert, key) = ca.issue_pem_files(crate::support::ca::UPSTREAM_NAMES, "ws");
    let server = PyServer::start("ws_echo.py", &cert, &key, &[]);
    let mut builder = latchkey()
        .upstream_ca(&ca)
        .policy("main.toml", &policy(server.port()))
        .pin("api.test");
    for a in args {
        builder = builder.arg(a);
    }
    let lk = builder.run();
    (server, lk)
}

/// `ws_echo.py MODE wss://api.test:PORT/realtime/x CA PROXY ARGS...`: its JSON line.
fn ws_client(lk: &Latchkey, port: u16, mode: &str, args: &[String]) -> Value {
    let mut cmd = std::process::Command::new(crate::support::toolchain::python());
    cmd.arg(format!(
        "{}/tests/clients/ws_echo.py",
        env!("CARGO_MANIFEST_DIR")
    ))
    .arg(mode)
    .arg(format!("wss://api.test:{port}/realtime/x"))
    .arg(lk.ca_pem_path())
    .arg(lk.proxy_url())
    .args(args);
    for var in crate::support::latchkey::SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    let out = crate::support::latchkey::wait_with_timeout(&mut cmd, Duration::from_secs(60));
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("ws client output ({e}): {out:?}"))
}

/// The payload bytes the upstream received in messages.
fn received(server: &PyServer) -> u64 {
    server
        .events()
        .iter()
        .filter(|e| e["event"] == "message")
        .map(|e| e["text"].as_str().map_or(0, str::len) as u64)
        .sum()
}

#[test]
fn messages_are_charged_as_they_flow_and_the_budget_closes_the_socket_then_refuses_handshakes() {
    let (server, lk) = world(&[]);
    let port = server.port();
    // 1000-byte messages against 4 KB: the handshake's head and three messages fit, the fourth
    // does not leave.
    let messages: Vec<String> = (0..8).map(|i| format!("{i}{}", "m".repeat(999))).collect();
    let out = ws_client(&lk, port, "client", &[json!(messages).to_string()]);
    assert_eq!(out["close_code"], 1008, "{out:#}");
    assert_eq!(out["close_reason"], "latchkey: budget_exhausted", "{out:#}");
    let replies = out["replies"].as_array().expect("replies").len();
    assert!((1..=3).contains(&replies), "{out:#}");
    let up = received(&server);
    assert!(
        up <= BUDGET,
        "{up} bytes of messages reached the upstream against {BUDGET}"
    );
    assert_eq!(up, replies as u64 * 1000, "{:#?}", server.events());

    // The socket's record: refused by the budget, charged what left (handshake head and the
    // messages as framed), never past the budget.
    let record = wait_record(&lk, 1);
    let r = &record[0];
    assert_eq!(r["reason"], "budget_exhausted", "{r:#}");
    let c = crate::support::providers::charge(r, "exfil", "bytes_up");
    assert_eq!(c["refused"], true, "{c:#}");
    let charged = crate::support::providers::num(&c, "charged");
    assert!(charged > up && charged <= BUDGET, "{c:#}");

    // What is left is less than a 1000-byte message but room for a handshake: a second socket
    // opens, and small messages go until the budget is used up to the last few bytes.
    let small: Vec<String> = (0..400).map(|i| format!("s{i:04}")).collect();
    let out = ws_client(&lk, port, "client", &[json!(small).to_string()]);
    assert_eq!(out["close_code"], 1008, "{out:#}");
    assert!(received(&server) <= BUDGET);

    // Exhausted: a new handshake is refused before the upstream (a 0-byte reservation no
    // longer fits: the handshake reserves its head).
    let handshakes = || {
        server
            .events()
            .iter()
            .filter(|e| e["event"] == "handshake")
            .count()
    };
    let before = handshakes();
    let again = ws_client(&lk, port, "client", &[json!(["hello"]).to_string()]);
    assert_eq!(again["status"], 429, "{again:#}");
    assert_eq!(handshakes(), before, "a handshake reached the upstream");
    let records = wait_record(&lk, 3);
    let charged: u64 = records
        .iter()
        .map(|r| {
            let c = crate::support::providers::charge(r, "exfil", "bytes_up");
            if r["status"] == 429 {
                assert_eq!(r["reason"], "budget_exhausted", "{r:#}");
                0
            } else {
                crate::support::providers::num(&c, "charged")
            }
        })
        .sum();
    assert!(charged <= BUDGET, "{charged} charged: {records:#?}");
}

#[test]
fn unfinished_fragmented_messages_are_held_against_the_buffer_budget() {
    let unlimited = |port: u16| {
        format!("[[rules]]\nname = \"realtime\"\nhosts = [\"api.test\"]\nports = [{port}]\npaths = [\"/realtime/**\"]\nwebsocket = true\n")
    };
    let (server, lk) = world_with(&["--max-buffered-bytes", "16MiB"], unlimited);
    // 8 sockets each holding an unfinished 7 MiB message: far past 16 MiB (and the client's
    // share of it); every socket is closed 1013 (too_busy) before its message is whole.
    let out = ws_client(
        &lk,
        server.port(),
        "hold",
        &["8".to_string(), (7 * 1024 * 1024).to_string()],
    );
    let codes = out["close_codes"].as_array().expect("codes");
    assert_eq!(codes.len(), 8, "{out:#}");
    assert!(
        codes.iter().all(|c| c == 1013),
        "{out:#} {:#?}",
        lk.audit_records()
    );
    assert!(
        server.events().iter().all(|e| e["event"] != "message"),
        "a partial message reached the upstream: {:#?}",
        server.events()
    );
    let records = wait_record(&lk, 8);
    for r in &records {
        assert_eq!(r["reason"], "too_busy", "{r:#}");
        assert_eq!(r["websocket"]["close_code"], 1013, "{r:#}");
    }
}

/// At least `n` records, once written.
fn wait_record(lk: &Latchkey, n: usize) -> Vec<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let records = lk.audit_records();
        if records.len() >= n {
            return records;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fewer than {n} records: {records:#?}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

//! The audit record outlives a crash: a request's decision is on disk before its upstream is
//! dialed (book "Audit": what is guaranteed at a crash), so after `kill -9` under load every
//! request the upstream saw has at least its decision record, every line is whole and the hash
//! chain holds; a restart continues the chain. (A log that cannot be written lets nothing
//! out: `audit_sink.rs`.)

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::audit::chained_lines;
use crate::support::clients::{dial, read_response};
use crate::support::upstream::{echo, handler};
use crate::support::{latchkey, run_cli, Latchkey, Upstream};

/// A plain HTTP echo upstream that holds paths starting with `/slow` for 30 s.
fn upstream() -> Upstream {
    Upstream::http_with(handler(|req| async move {
        if req.path.starts_with("/slow") {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        echo(req).await
    }))
}

fn serve(up: &Upstream, args: &[&str]) -> Latchkey {
    let mut b = latchkey().pin("api.test").policy(
        "main.toml",
        &format!(
            "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{}]\n",
            up.port()
        ),
    );
    for a in args {
        b = b.arg(a);
    }
    b.run()
}

fn send(proxy: SocketAddr, port: u16, path: &str) -> Option<u16> {
    let mut tcp = dial(proxy);
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(40)));
    let req = format!(
        "GET http://api.test:{port}{path} HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).ok()?;
    read_response(&mut tcp, false).ok().map(|r| r.status)
}

/// Paths the upstream saw.
fn seen(up: &Upstream) -> BTreeSet<String> {
    up.received().into_iter().map(|r| r.path).collect()
}

/// Kills latchkey with 50 slow requests in flight and fast ones streaming, then checks the
/// file: whole lines, the chain intact, a decision record for everything the upstream saw.
fn killed_under_load(extra: &[&str]) {
    let up = upstream();
    let mut lk = serve(&up, extra);
    let (proxy, port) = (lk.addr(), up.port());
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for i in 0..50 {
        threads.push(thread::spawn(move || {
            let _ = send(proxy, port, &format!("/slow/{i}"));
        }));
    }
    for t in 0..4 {
        let stop = stop.clone();
        threads.push(thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let _ = send(proxy, port, &format!("/fast/{t}/{i}"));
                i += 1;
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen(&up).iter().filter(|p| p.starts_with("/slow")).count() < 50 {
        assert!(
            Instant::now() < deadline,
            "the upstream saw only {:?}",
            seen(&up)
        );
        thread::sleep(Duration::from_millis(10));
    }
    lk.signal("KILL");
    assert!(lk.wait_exit(Duration::from_secs(5)).is_some(), "kill -9");
    stop.store(true, Ordering::Relaxed);
    let upstream_saw = seen(&up);

    let text = lk.audit_text();
    assert!(text.ends_with('\n'), "a torn last line after kill -9");
    let lines = chained_lines(&text).unwrap_or_else(|p| panic!("after kill -9: {p}"));
    let decided: BTreeSet<String> = lk
        .decision_records()
        .iter()
        .filter_map(|l| l["path"].as_str().map(str::to_string))
        .collect();
    let missing: Vec<&String> = upstream_saw.difference(&decided).collect();
    assert!(
        missing.is_empty(),
        "requests the upstream saw without a decision record: {missing:?}"
    );
    // The 50 in flight have their decision and no outcome; every decision names its rule.
    let outcomes: BTreeSet<&str> = lines
        .iter()
        .filter(|l| l["phase"] == "outcome")
        .filter_map(|l| l["id"].as_str())
        .collect();
    let in_flight: Vec<&Value> = lines
        .iter()
        .filter(|l| {
            l["phase"] == "decision" && l["path"].as_str().is_some_and(|p| p.starts_with("/slow"))
        })
        .collect();
    assert_eq!(in_flight.len(), 50);
    for d in &in_flight {
        assert!(
            !outcomes.contains(d["id"].as_str().unwrap_or_default()),
            "{d}"
        );
        assert_eq!(
            (d["decision"].as_str(), d["rule"].as_str()),
            (Some("allow"), Some("api"))
        );
        assert_eq!(d["reason"], "allowed");
        assert!(d["status"].is_null(), "{d}");
    }

    // `audit verify` finds the chain intact; what no checkpoint covers yet is said, not hidden.
    let ca = lk.ca_dir();
    let audit = lk.scratch().join("audit.jsonl");
    let out = run_cli([
        "audit".as_ref(),
        "verify".as_ref(),
        "--ca-dir".as_ref(),
        ca.as_os_str(),
        audit.as_os_str(),
    ]);
    assert_eq!(out.code(), Some(0), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.starts_with("intact:"), "{}", out.stdout);
    assert!(!out.stdout.contains("clean stop"), "{}", out.stdout);

    // A restart continues the chain where the crash left it.
    drop(lk);
}

#[test]
fn after_kill_9_under_load_every_request_the_upstream_saw_has_its_decision_record() {
    killed_under_load(&[]);
}

#[test]
fn with_audit_sync_too() {
    killed_under_load(&["--audit-sync"]);
}

#[test]
fn a_restart_after_a_crash_continues_the_chain_and_verify_passes() {
    let up = upstream();
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    let key = dir.path().join("audit.key");
    let args = [
        "--audit-checkpoint-every",
        "3",
        "--audit-key",
        key.to_str().expect("utf8"),
    ];
    for round in 0..2 {
        let mut lk = latchkey().pin("api.test").audit_to(&audit).policy(
            "main.toml",
            &format!(
                "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{}]\n",
                up.port()
            ),
        );
        for a in args {
            lk = lk.arg(a);
        }
        let mut lk = lk.run();
        for i in 0..5 {
            assert_eq!(
                send(lk.addr(), up.port(), &format!("/r{round}/{i}")),
                Some(200)
            );
        }
        // Only the decisions are guaranteed at a kill; let the outcomes land too, so the
        // second run has a whole first run to continue from.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = std::fs::read_to_string(&audit).unwrap_or_default();
            let outcomes = chained_lines(&text)
                .unwrap_or_else(|p| panic!("{p}"))
                .iter()
                .filter(|l| l["phase"] == "outcome")
                .count();
            if outcomes == 5 * (round + 1) {
                break;
            }
            assert!(Instant::now() < deadline, "outcomes: {outcomes}");
            thread::sleep(Duration::from_millis(20));
        }
        lk.signal("KILL");
        assert!(lk.wait_exit(Duration::from_secs(5)).is_some());
    }
    let text = std::fs::read_to_string(&audit).expect("audit");
    let lines = chained_lines(&text).unwrap_or_else(|p| panic!("{p}"));
    let count = |phase: &str| lines.iter().filter(|l| l["phase"] == phase).count();
    assert_eq!(
        (count("decision"), count("outcome")),
        (10, 10),
        "both runs' requests, one chain"
    );
    let out = run_cli([
        "audit".as_ref(),
        "verify".as_ref(),
        "--audit-key".as_ref(),
        key.as_os_str(),
        "--json".as_ref(),
        audit.as_os_str(),
    ]);
    assert_eq!(out.code(), Some(0), "{}{}", out.stdout, out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).expect("json report");
    assert_eq!(report["problems"], serde_json::json!([]));
    assert!(report["checkpoints"].as_u64() >= Some(4), "{report}");
}

//! The console's overview verifies the audit log's hash chain on the box as the log grows: the
//! verdict, the line and seq verified through and the last signed checkpoint; a log edited
//! before anyone looked shows `TAMPERED` with the first problem's file and line.

use std::thread;
use std::time::Duration;

use crate::console::{sign_in, sweep, world, world_with, READER_TOKEN};
use crate::support::approvals::{agent, send};

/// The overview's hash chain row: `field`'s cell text.
fn chain_cell(page: &str, field: &str) -> String {
    let at = page
        .find(&format!("<td>{field}</td><td>"))
        .unwrap_or_else(|| panic!("no {field:?} row: {page}"));
    let rest = &page[at + field.len() + 13..];
    rest[..rest.find("</td>").unwrap_or(rest.len())].to_string()
}

#[test]
fn the_overview_verifies_the_audit_chain_on_the_box_and_shows_tampering() {
    let w = world_with(true, |b| b.arg("--audit-checkpoint-every").arg("3"));
    let url = w.url("api.test", "/v1/items");
    for _ in 0..4 {
        assert_eq!(
            send(&w.lk, Some(&agent()), "GET", &url, None).ok().status,
            200
        );
    }
    let mut b = sign_in(&w, READER_TOKEN);
    // The first look starts the pass; within a few looks it has read the whole log.
    let lines = w.lk.audit_text().lines().count();
    let mut page = String::new();
    for _ in 0..50 {
        page = b.get("/ui").text();
        let through = chain_cell(&page, "verified through line");
        let n: usize = through
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if n >= lines {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    assert!(chain_cell(&page, "verdict").contains("intact"), "{page}");
    let signed = chain_cell(&page, "last signed checkpoint");
    assert!(
        signed.starts_with("seq ") && signed != "seq none",
        "no signed checkpoint: {page}"
    );

    // Another latchkey whose log is edited before anyone looks: the overview says so.
    let t = world(true);
    let url = t.url("api.test", "/v1/items");
    for _ in 0..3 {
        assert_eq!(
            send(&t.lk, Some(&agent()), "GET", &url, None).ok().status,
            200
        );
    }
    let path = t.lk.scratch().join("audit.jsonl");
    let text = std::fs::read_to_string(&path).expect("audit log");
    assert!(text.contains("\"GET\""), "{text}");
    // Same length, one record's method changed: only the chain can tell.
    let edited = text.replacen("\"GET\"", "\"PUT\"", 1);
    std::fs::write(&path, edited).expect("edit the log");
    let mut t_b = sign_in(&t, READER_TOKEN);
    let mut verdict = String::new();
    for _ in 0..50 {
        verdict = chain_cell(&t_b.get("/ui").text(), "verdict");
        if verdict.contains("TAMPERED") {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    assert!(
        verdict.contains("TAMPERED") && verdict.contains("audit.jsonl:1) was edited"),
        "an edited log shown as {verdict:?}"
    );
    sweep(&b.seen);
    sweep(&t_b.seen);
}

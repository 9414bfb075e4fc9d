//! Restart safety: latchkey killed with `kill -9` while approvals are pending, a grant stands
//! and a request is parked; started again on the same state store, the pending approvals are
//! listed and answerable, the grant still lets its identity through, and the request parked at
//! the crash is answered by its retry once approved.

use std::thread;
use std::time::Duration;

use serde_json::json;

use crate::support::approvals::{
    agent, approval_header, ask_policy, lab, send, start, with_method, Admin, ADMIN_TOKEN,
};
use crate::support::latchkey::Latchkey;
use crate::support::{assert_denial, assert_record, TestCa, Upstream};

const SCOPES: &str = r#""once", "1h""#;

fn serve(ca: &TestCa, upstream: &Upstream, state: &str) -> (Latchkey, Admin) {
    let lk = start(ca, upstream, &ask_policy("30s", SCOPES), |b| {
        b.arg("--state").arg(state)
    });
    let admin = Admin::new(lk.admin_addr(), Some(ADMIN_TOKEN));
    (lk, admin)
}

fn url(upstream: &Upstream, path: &str) -> String {
    format!("https://api.test:{}{path}", upstream.port())
}

/// Runs the crash-and-restart story against the store at `state` (a `--state` value).
pub fn pending_approvals_grants_and_parked_requests_survive_kill_9(state: &str) {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let (mut lk, admin) = serve(&ca, &upstream, state);
    const BODY_A: &str = r#"{"a":"waits"}"#;
    const BODY_B: &str = r#"{"b":"parked at the crash"}"#;

    // `lab` gets a standing grant; `agent` asks twice: one question left waiting, one request
    // held when latchkey dies.
    let (resp, lab_id) = thread::scope(|s| {
        let held = s.spawn(|| {
            send(
                &lk,
                Some(&lab()),
                "POST",
                &url(&upstream, "/v1/lab"),
                Some("{}"),
            )
        });
        let pending = admin.wait_pending(1, Duration::from_secs(15));
        let id = pending[0]["id"].as_str().expect("id").to_string();
        admin.approve(&id, Some("1h"));
        (held.join().expect("curl thread"), id)
    });
    assert_eq!(resp.ok().status, 200, "{resp:#?}");

    let a_id = thread::scope(|s| {
        let held = s.spawn(|| {
            send(
                &lk,
                Some(&agent()),
                "POST",
                &url(&upstream, "/v1/a"),
                Some(BODY_A),
            )
        });
        let id = admin.wait_pending(1, Duration::from_secs(15))[0]["id"]
            .as_str()
            .expect("id")
            .to_string();
        // A is held 30 s; latchkey dies with B parked beside it.
        let parked = s.spawn(|| {
            send(
                &lk,
                Some(&agent()),
                "POST",
                &url(&upstream, "/v1/b"),
                Some(BODY_B),
            )
        });
        admin.wait_pending(2, Duration::from_secs(15));
        lk.signal("KILL");
        for held in [held, parked] {
            let out = held.join().expect("curl thread");
            // curl's last header block is the CONNECT's 200; the request itself got nothing.
            assert_ne!(
                out.exit,
                Some(0),
                "a held request was answered while latchkey was killed: {out:#?}"
            );
        }
        id
    });
    assert!(
        lk.wait_exit(Duration::from_secs(5)).is_some(),
        "kill -9 did not stop latchkey"
    );
    assert_eq!(
        upstream.received().len(),
        1,
        "only lab's approved request went upstream"
    );
    drop(lk);

    // Started again on the same store.
    let (lk, admin) = serve(&ca, &upstream, state);
    let pending = admin.list("pending");
    assert_eq!(
        pending.len(),
        2,
        "pending approvals lost in the crash: {pending:#?}"
    );
    assert!(pending.iter().any(|a| a["id"] == a_id.as_str()));
    let b = pending
        .iter()
        .find(|a| a["path"] == "/v1/b")
        .unwrap_or_else(|| panic!("the parked request's approval is gone: {pending:#?}"))
        .clone();
    assert_eq!(b["identity"], "agent");
    assert_eq!(b["body_bytes"], BODY_B.len());
    let grants = admin.call("GET", "/grants", None);
    assert!(
        grants.text().contains(&lab_id),
        "the 1h grant is gone: {grants:#?}"
    );

    // The grant stands: lab goes on without asking.
    let lab_again = send(
        &lk,
        Some(&lab()),
        "POST",
        &url(&upstream, "/v1/lab-after"),
        Some("{}"),
    );
    assert_eq!(lab_again.ok().status, 200, "{lab_again:#?}");

    // Both questions are answerable; the parked request's retry goes on.
    let b_id = b["id"].as_str().expect("id").to_string();
    admin.approve(&b_id, None);
    admin.deny(&a_id);
    let retry_b = send(
        &lk,
        Some(&agent()),
        "POST",
        &url(&upstream, "/v1/b"),
        Some(BODY_B),
    );
    assert_eq!(
        retry_b.ok().status,
        200,
        "the parked request's retry: {retry_b:#?}"
    );
    let retry_a = send(
        &lk,
        Some(&agent()),
        "POST",
        &url(&upstream, "/v1/a"),
        Some(BODY_A),
    );
    assert_denial(retry_a.ok(), 403, Some("prod-writes"), "approval_denied");
    assert_eq!(approval_header(retry_a.ok()), a_id);
    assert!(admin.list("pending").is_empty());
    let got: Vec<_> = upstream.received().iter().map(|r| r.path.clone()).collect();
    assert_eq!(got, ["/v1/lab", "/v1/lab-after", "/v1/b"]);

    let records = lk.wait_audit(5);
    let decisions = with_method(&records, "APPROVAL");
    assert_eq!(decisions.len(), 2, "{records:#?}");
    let posts = with_method(&records, "POST");
    let reasons: Vec<_> = posts
        .iter()
        .map(|r| r["reason"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        reasons,
        ["allowed", "allowed", "approval_denied"],
        "{records:#?}"
    );
    assert_record(
        posts[0],
        json!({"identity": "lab", "path": "/v1/lab-after"}),
    );
    assert_eq!(posts[0]["approval"]["id"], lab_id.as_str());
    assert_eq!(posts[1]["approval"]["id"], b_id.as_str());
}

#[test]
fn sqlite_pending_approvals_grants_and_parked_requests_survive_kill_9() {
    let dir = tempfile::tempdir().expect("state dir");
    let state = format!("sqlite:{}", dir.path().join("state.db").display());
    pending_approvals_grants_and_parked_requests_survive_kill_9(&state);
    assert!(dir.path().join("state.db").exists());
}

//! Two latchkey replicas on one real `redis-server` (`--state redis://...`): a request parked on
//! A and approved through B's admin API is released on A at once (B's decision reaches A's
//! waiter through the store's events, well before the hold ends); B lists A's pending approval;
//! each replica writes the records of what it did. Also the restart story on Redis.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::approvals::{agent, ask_policy, send, start, with_method, Admin, ADMIN_TOKEN};
use crate::support::redis::RedisServer;
use crate::support::{assert_record, Echo, TestCa, Upstream};

#[test]
fn a_request_parked_on_one_replica_is_released_by_an_approval_through_the_other() {
    let redis = RedisServer::start();
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let policy = ask_policy("15s", r#""once", "1h""#);
    let state = redis.url();
    let a = start(&ca, &upstream, &policy, |b| b.arg("--state").arg(&state));
    let b = start(&ca, &upstream, &policy, |b| b.arg("--state").arg(&state));
    let admin_b = Admin::new(b.admin_addr(), Some(ADMIN_TOKEN));
    let admin_a = Admin::new(a.admin_addr(), Some(ADMIN_TOKEN));
    let url = format!("https://api.test:{}/v1/replicated", upstream.port());
    let body = r#"{"replica":"a"}"#;

    let started = Instant::now();
    let (out, id, released_after) = thread::scope(|s| {
        let held = s.spawn(|| {
            let out = send(&a, Some(&agent()), "POST", &url, Some(body));
            (out, started.elapsed())
        });
        // B sees A's question.
        let pending = admin_b.wait_pending(1, Duration::from_secs(10));
        let id = pending[0]["id"].as_str().expect("id").to_string();
        assert_eq!(pending[0]["identity"], "agent");
        assert_eq!(pending[0]["path"], "/v1/replicated");
        assert_eq!(admin_a.list("pending")[0]["id"], id.as_str());
        let approved_at = started.elapsed();
        admin_b.approve(&id, Some("once"));
        let (out, done) = held.join().expect("curl thread");
        (out, id, done.saturating_sub(approved_at))
    });
    assert_eq!(out.ok().status, 200, "{out:#?}");
    assert_eq!(Echo::parse(&out.ok().text()).body, body);
    assert!(
        released_after < Duration::from_secs(3),
        "A released the request {released_after:?} after B's approval (hold 15 s)"
    );
    assert_eq!(upstream.received().len(), 1);
    assert_eq!(admin_a.show(&id)["state"], "approved");

    // The once grant was used on A: the same request asks again, on either replica.
    let again = send(&b, Some(&agent()), "POST", &url, Some(body));
    assert_ne!(
        again.ok().status,
        200,
        "a used once-grant let a second request through on B"
    );
    assert_eq!(upstream.received().len(), 1);

    let on_a = a.wait_audit(1);
    assert_record(
        &on_a[0],
        json!({"method": "POST", "reason": "allowed", "status": 200, "rule": "prod-writes"}),
    );
    assert_eq!(on_a[0]["approval"]["id"], id.as_str());
    assert_eq!(on_a[0]["approval"]["state"], "approved");
    let on_b = b.wait_audit(2);
    let decisions = with_method(&on_b, "APPROVAL");
    assert_eq!(decisions.len(), 1, "{on_b:#?}");
    assert_eq!(decisions[0]["approval"]["id"], id.as_str());
}

#[test]
fn redis_pending_approvals_grants_and_parked_requests_survive_kill_9() {
    let redis = RedisServer::start();
    crate::approvals_restart::pending_approvals_grants_and_parked_requests_survive_kill_9(
        &redis.url(),
    );
}

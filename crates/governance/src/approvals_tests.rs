//! Approvals on a real SQLite store: asking once per distinct request, the identity's rate,
//! answers (once, compare-and-set), each scope's grant, waiting woken by the answer.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::*;
use crate::record::{Answer, Approval, State};
use crate::state::StateStore;

async fn store(dir: &tempfile::TempDir) -> Arc<dyn StateStore> {
    crate::state::open(&format!("sqlite:{}", dir.path().join("state.db").display()))
        .await
        .expect("open the state store")
}

fn approval(a: &Approvals, id: &str, identity: &str, url: &str, session: &str) -> Approval {
    let now = SystemTime::now();
    Approval {
        id: id.to_string(),
        state: State::Pending,
        created: now,
        expires: now + Duration::from_secs(3600),
        identity: identity.to_string(),
        labels: Default::default(),
        client: "127.0.0.1:1".to_string(),
        method: "POST".to_string(),
        url: url.to_string(),
        scheme: "https".to_string(),
        host: "api.test".to_string(),
        port: 443,
        path: "/x".to_string(),
        rule: "writes".to_string(),
        denial: None,
        message: None,
        scopes: vec!["once".into(), "1h".into(), "session".into()],
        body_bytes: 0,
        body_sha256: "e3b0".to_string(),
        preview: None,
        request_id: "r".to_string(),
        policy: "sha256:x".to_string(),
        answer: None,
        fingerprint: a.fingerprint(identity, "POST", url, "e3b0"),
        session: a.session(identity, session.as_bytes()),
    }
}

fn key<'a>(a: &'a Approval) -> Key<'a> {
    Key {
        identity: &a.identity,
        rule: &a.rule,
        host: &a.host,
        fingerprint: &a.fingerprint,
        session: &a.session,
    }
}

fn answer(decision: &str, scope: Option<&str>) -> Answer {
    Answer {
        decision: decision.to_string(),
        scope: scope.map(str::to_string),
        note: Some("ok".to_string()),
        by: "ana".to_string(),
        at: SystemTime::now(),
    }
}

async fn ask(a: &Approvals, ap: Approval) -> Asked {
    a.ask(ap, 100, Duration::from_secs(60), SystemTime::now())
        .await
        .expect("ask")
}

#[tokio::test]
async fn one_approval_per_distinct_request_and_a_once_grant_is_used_exactly_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Arc::new(Approvals::open(store(&dir).await).await.expect("approvals"));
    let first = approval(&a, "a1", "agent", "https://api.test/x?q=1", "t1");
    assert!(matches!(ask(&a, first.clone()).await, Asked::New(_)));
    // The same request again (a retry, or a twin in flight) waits on the same approval.
    match ask(
        &a,
        approval(&a, "a2", "agent", "https://api.test/x?q=1", "t1"),
    )
    .await
    {
        Asked::Existing(e) => assert_eq!(e.id, "a1"),
        other => panic!("expected the existing approval, got {other:?}"),
    }
    assert!(matches!(
        a.find(&key(&first), SystemTime::now()).await.expect("find"),
        Found::Pending(_)
    ));
    let (done, grant) = a
        .answer("a1", answer("approve", None), SystemTime::now())
        .await
        .expect("answer");
    assert_eq!(done.state, State::Approved);
    assert_eq!(
        grant.expect("grant").scope,
        "once",
        "the first offered scope is the default"
    );
    // Eight concurrent retries: exactly one gets the grant.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (a, first) = (a.clone(), first.clone());
        tasks.push(tokio::spawn(async move {
            matches!(
                a.find(&key(&first), SystemTime::now()).await.expect("find"),
                Found::Granted(_)
            )
        }));
    }
    let mut granted = 0;
    for t in tasks {
        granted += usize::from(t.await.expect("task"));
    }
    assert_eq!(granted, 1);
    // Used up: the same request is a new question.
    assert!(matches!(
        a.find(&key(&first), SystemTime::now()).await.expect("find"),
        Found::Nothing
    ));
    assert!(matches!(
        ask(
            &a,
            approval(&a, "a3", "agent", "https://api.test/x?q=1", "t1")
        )
        .await,
        Asked::New(_)
    ));
}

#[tokio::test]
async fn a_duration_grant_covers_the_identity_rule_and_host_and_a_session_grant_ends_with_the_token(
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Approvals::open(store(&dir).await).await.expect("approvals");
    let asked = approval(&a, "h1", "agent", "https://api.test/x", "t1");
    ask(&a, asked.clone()).await;
    a.answer("h1", answer("approve", Some("1h")), SystemTime::now())
        .await
        .expect("answer");
    let other_path = approval(&a, "h2", "agent", "https://api.test/other", "t1");
    assert!(
        matches!(a.find(&key(&other_path), SystemTime::now()).await.expect("find"), Found::Granted(g) if g.scope == "1h")
    );
    let other_identity = approval(&a, "h3", "intruder", "https://api.test/x", "t1");
    assert!(matches!(
        a.find(&key(&other_identity), SystemTime::now())
            .await
            .expect("find"),
        Found::Nothing
    ));
    // An hour later it is gone.
    let later = SystemTime::now() + Duration::from_secs(3601);
    assert!(!matches!(
        a.find(&key(&other_path), later).await.expect("find"),
        Found::Granted(_)
    ));

    let s = approval(&a, "s1", "bot", "https://api.test/x", "token-1");
    ask(&a, s.clone()).await;
    a.answer("s1", answer("approve", Some("session")), SystemTime::now())
        .await
        .expect("answer");
    let same_token = approval(&a, "s2", "bot", "https://api.test/y", "token-1");
    assert!(
        matches!(a.find(&key(&same_token), SystemTime::now()).await.expect("find"), Found::Granted(g) if g.scope == "session")
    );
    let new_token = approval(&a, "s3", "bot", "https://api.test/y", "token-2");
    assert!(matches!(
        a.find(&key(&new_token), SystemTime::now())
            .await
            .expect("find"),
        Found::Nothing
    ));
    assert_eq!(a.grants(SystemTime::now()).await.expect("grants").len(), 2);
}

#[tokio::test]
async fn answers_are_taken_once_within_the_offered_scopes_and_a_denial_stands() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Approvals::open(store(&dir).await).await.expect("approvals");
    let mut narrow = approval(&a, "d1", "agent", "https://api.test/x", "t");
    narrow.scopes = vec!["once".into()];
    ask(&a, narrow.clone()).await;
    let now = SystemTime::now();
    assert!(
        matches!(a.answer("d1", answer("approve", Some("1h")), now).await, Err(AnswerError::Invalid(m)) if m.contains("not one approval d1 offers"))
    );
    assert!(matches!(
        a.answer("d1", answer("maybe", None), now).await,
        Err(AnswerError::Invalid(_))
    ));
    assert!(matches!(
        a.answer("nope", answer("deny", None), now).await,
        Err(AnswerError::NotFound(_))
    ));
    a.answer("d1", answer("deny", None), now)
        .await
        .expect("deny");
    assert!(matches!(
        a.answer("d1", answer("approve", None), now).await,
        Err(AnswerError::Conflict {
            state: "denied",
            ..
        })
    ));
    assert!(matches!(
        a.find(&key(&narrow), now).await.expect("find"),
        Found::Denied(_)
    ));
    assert!(
        matches!(ask(&a, approval(&a, "d2", "agent", "https://api.test/x", "t")).await, Asked::Denied(d) if d.id == "d1")
    );
    assert_eq!(
        a.list(Some(State::Denied), now).await.expect("list").len(),
        1
    );
    assert!(a
        .list(Some(State::Pending), now)
        .await
        .expect("list")
        .is_empty());
}

#[tokio::test]
async fn an_expired_question_cannot_be_answered_and_is_asked_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Approvals::open(store(&dir).await).await.expect("approvals");
    let mut old = approval(&a, "e1", "agent", "https://api.test/x", "t");
    old.expires = SystemTime::now() + Duration::from_secs(2);
    ask(&a, old.clone()).await;
    let later = SystemTime::now() + Duration::from_secs(3);
    assert!(matches!(
        a.answer("e1", answer("approve", None), later).await,
        Err(AnswerError::Conflict {
            state: "expired",
            ..
        })
    ));
    assert_eq!(
        a.list(Some(State::Expired), later)
            .await
            .expect("list")
            .len(),
        1
    );
    let again = approval(&a, "e2", "agent", "https://api.test/x", "t");
    assert!(
        matches!(a.ask(again, 10, Duration::from_secs(60), later).await.expect("ask"), Asked::New(n) if n.id == "e2")
    );
}

#[tokio::test]
async fn new_questions_are_capped_per_identity() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Approvals::open(store(&dir).await).await.expect("approvals");
    let now = SystemTime::now();
    for i in 0..3 {
        let ap = approval(
            &a,
            &format!("r{i}"),
            "spammer",
            &format!("https://api.test/{i}"),
            "t",
        );
        let out = a
            .ask(ap, 2, Duration::from_secs(60), now)
            .await
            .expect("ask");
        assert_eq!(matches!(out, Asked::RateLimited(_)), i == 2, "{i}: {out:?}");
    }
    let other = approval(&a, "o1", "someone-else", "https://api.test/0", "t");
    assert!(matches!(
        a.ask(other, 2, Duration::from_secs(60), now)
            .await
            .expect("ask"),
        Asked::New(_)
    ));
}

#[tokio::test]
async fn a_waiter_is_woken_by_the_answer_not_the_end_of_its_hold() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Arc::new(Approvals::open(store(&dir).await).await.expect("approvals"));
    ask(&a, approval(&a, "w1", "agent", "https://api.test/x", "t")).await;
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let got = a.wait("w1", Duration::from_secs(20)).await.expect("wait");
            (got, t.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.answer("w1", answer("approve", Some("once")), SystemTime::now())
        .await
        .expect("answer");
    let (got, took) = waiter.await.expect("task");
    assert_eq!(got.expect("approval").state, State::Approved);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // Not answered: the hold ends it, still pending.
    ask(&a, approval(&a, "w2", "agent", "https://api.test/y", "t")).await;
    let got = a
        .wait("w2", Duration::from_millis(300))
        .await
        .expect("wait");
    assert_eq!(got.expect("approval").state, State::Pending);
}

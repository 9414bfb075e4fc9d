use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::policy::{compile_sources_with, SecretLoading};

const POLICY: &str = r#"
[limits.llm]
requests = "100/min"

[[rules]]
name = "api"
hosts = ["api.test", "other.test"]

[profiles.agent]
rules = ["api"]
ttl = "1h"
require_labels = ["task"]
limits = ["llm"]
"#;

fn policy() -> Policy {
    compile_sources_with(&[(Path::new("p.toml"), POLICY)], SecretLoading::Skip).expect("policy")
}

async fn sessions(dir: &tempfile::TempDir) -> (Arc<dyn StateStore>, Arc<Sessions>) {
    let store: Arc<dyn StateStore> = Arc::new(
        crate::state::Sqlite::open(dir.path().join("state.db"))
            .await
            .expect("sqlite"),
    );
    let s = Sessions::open(store.clone()).await.expect("sessions");
    s.poll().await;
    (store, s)
}

fn request(labels: &[(&str, &str)]) -> CreateRequest {
    CreateRequest {
        profile: "agent".to_string(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        ..CreateRequest::default()
    }
}

fn client() -> IpAddr {
    "127.0.0.1".parse().expect("ip")
}

#[tokio::test]
async fn a_session_is_admitted_by_its_token_only_and_never_shows_it() {
    let dir = tempfile::tempdir().expect("dir");
    let (store, s) = sessions(&dir).await;
    let made = s
        .create(&policy(), &request(&[("task", "t1")]), Some("ci"))
        .await
        .expect("created");
    let id = made.session.id.clone();
    assert!(is_session_id(&id), "{id}");
    assert!(made.token.starts_with(TOKEN_PREFIX));
    assert_eq!(made.session.state, "live");
    // The store keeps no token, and the view neither.
    let raw = store
        .get(NS_SESSIONS, &id)
        .await
        .expect("get")
        .expect("doc");
    let text = String::from_utf8_lossy(&raw.doc).to_string();
    assert!(!text.contains(made.token.as_str()), "{text}");
    let view = serde_json::to_string(&s.view(&id).await.expect("view")).expect("json");
    assert!(
        !view.contains(made.token.as_str()) && !view.contains("token"),
        "{view}"
    );
    let live = s
        .admit_token(&id, made.token.as_bytes(), client())
        .await
        .expect("admitted");
    assert_eq!(live.profile, "agent");
    assert_eq!(live.labels.get("task").map(String::as_str), Some("t1"));
    let bad = s.admit_token(&id, b"lks_wrong", client()).await;
    assert!(matches!(bad, Err(Refused::BadToken { .. })), "{bad:?}");
    let text = bad.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(!text.contains("lks_wrong"));
    let unknown = s
        .admit_token("ses_00000000000000000000000000000000", b"x", client())
        .await;
    assert!(matches!(unknown, Err(Refused::Unknown { .. })));
}

#[tokio::test]
async fn revoking_cuts_connections_here_and_on_another_replica_and_refuses_later_attempts() {
    let dir = tempfile::tempdir().expect("dir");
    let (store, a) = sessions(&dir).await;
    // A second replica over the same store.
    let b = Sessions::open(store.clone()).await.expect("b");
    b.poll().await;
    let made = a
        .create(&policy(), &request(&[("task", "t")]), None)
        .await
        .expect("created");
    let id = made.session.id.clone();
    let on_a = a
        .admit_token(&id, made.token.as_bytes(), client())
        .await
        .expect("a");
    let on_b = b
        .admit_token(&id, made.token.as_bytes(), client())
        .await
        .expect("b");
    let (cut_a, cut_b) = (Arc::new(Cut::default()), Arc::new(Cut::default()));
    on_a.attach(&cut_a, now_ms());
    on_b.attach(&cut_b, now_ms());
    a.revoke(&id, Some("admin")).await.expect("revoked");
    assert_eq!(cut_a.why(), Some("session_revoked"));
    // B learns it from the end note at its next poll.
    assert!(!cut_b.is_thrown());
    b.poll().await;
    assert_eq!(cut_b.why(), Some("session_revoked"));
    for s in [&a, &b] {
        let again = s.admit_token(&id, made.token.as_bytes(), client()).await;
        assert!(matches!(again, Err(Refused::Revoked { .. })), "{again:?}");
        assert_eq!(
            again.err().map(|e| e.reason()),
            Some(Reason::SessionRevoked)
        );
    }
    let view = a.view(&id).await.expect("view").expect("kept");
    assert_eq!(view.state, "revoked");
    assert_eq!(view.revoked_by.as_deref(), Some("admin"));
}

#[tokio::test]
async fn a_request_wider_than_the_profile_is_refused_and_nothing_is_stored() {
    let dir = tempfile::tempdir().expect("dir");
    let (_store, s) = sessions(&dir).await;
    let mut req = request(&[]);
    req.ttl = Some("3h".to_string());
    req.narrow.hosts = Some(vec!["evil.test".to_string()]);
    let err = s.create(&policy(), &req, None).await.expect_err("too wide");
    assert_eq!(err.status(), 422);
    let text = err.to_string();
    assert!(
        text.contains("ttl 3h")
            && text.contains("evil.test")
            && text.contains("\"task\" is required"),
        "{text}"
    );
    let unknown = s
        .create(
            &policy(),
            &CreateRequest {
                profile: "agnet".to_string(),
                ..CreateRequest::default()
            },
            None,
        )
        .await
        .expect_err("unknown");
    assert_eq!(unknown.status(), 404);
    assert!(
        unknown.to_string().contains("the policy defines: agent"),
        "{unknown}"
    );
    assert!(s
        .list(&Filter {
            limit: 10,
            ..Filter::default()
        })
        .await
        .expect("list")
        .is_empty());
}

#[tokio::test]
async fn a_source_is_bound_to_one_live_session_and_admits_it_without_a_token() {
    let dir = tempfile::tempdir().expect("dir");
    let (_store, s) = sessions(&dir).await;
    let mut req = request(&[("task", "t")]);
    req.source = Some("10.0.3.7".to_string());
    let made = s.create(&policy(), &req, None).await.expect("created");
    let ip: IpAddr = "10.0.3.7".parse().expect("ip");
    let found = s.admit_source(ip).await.expect("ok").expect("bound");
    assert_eq!(found.id, made.session.id);
    assert!(s.admit_source(client()).await.expect("ok").is_none());
    // From elsewhere, even with the token: refused.
    let elsewhere = s
        .admit_token(&made.session.id, made.token.as_bytes(), client())
        .await;
    assert!(matches!(elsewhere, Err(Refused::WrongSource { .. })));
    let taken = s.create(&policy(), &req, None).await.expect_err("taken");
    assert_eq!(taken.status(), 409);
    s.revoke(&made.session.id, None).await.expect("revoked");
    assert!(s.admit_source(ip).await.expect("ok").is_none());
    s.create(&policy(), &req, None).await.expect("free again");
}

#[tokio::test]
async fn extension_stays_within_the_profile_and_expiry_ends_the_session() {
    let dir = tempfile::tempdir().expect("dir");
    let (_store, s) = sessions(&dir).await;
    let mut req = request(&[("task", "t")]);
    req.ttl = Some("1s".to_string());
    let made = s.create(&policy(), &req, None).await.expect("created");
    let id = made.session.id.clone();
    let too_long = s.extend(&id, Duration::from_secs(7200)).await;
    assert!(
        matches!(too_long, Err(CreateError::TooWide(_))),
        "{too_long:?}"
    );
    let live = s
        .admit_token(&id, made.token.as_bytes(), client())
        .await
        .expect("live");
    let cut = Arc::new(Cut::default());
    live.attach(&cut, now_ms());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    s.poll().await;
    assert_eq!(cut.why(), Some("session_expired"));
    let later = s.admit_token(&id, made.token.as_bytes(), client()).await;
    assert!(matches!(later, Err(Refused::Expired { .. })), "{later:?}");
    let ended = s.extend(&id, Duration::from_secs(60)).await;
    assert!(matches!(ended, Err(CreateError::Ended { .. })), "{ended:?}");
}

#[test]
fn only_a_basic_session_pair_is_taken_as_a_session() {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let id = "ses_0123456789abcdef0123456789abcdef";
    let (got, token) =
        presented(format!("Basic {}", b64(&format!("{id}:lks_x"))).as_bytes()).expect("a session");
    assert_eq!((got.as_str(), token.as_slice()), (id, b"lks_x".as_slice()));
    assert!(presented(format!("Basic {}", b64("ci:token")).as_bytes()).is_none());
    assert!(presented(format!("Bearer {id}").as_bytes()).is_none());
    assert!(presented(format!("Basic {}", b64(id)).as_bytes()).is_none());
    assert!(!is_session_id("ses_0123456789ABCDEF0123456789abcdef"));
}

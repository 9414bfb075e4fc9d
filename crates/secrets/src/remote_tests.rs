//! Tests of remote sources: the specs, and how the store caches, refreshes, serves stale and
//! retires a fetched value (over a scripted [`Fetch`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::{SecretError, SecretStore};

fn parse(spec: &str) -> Result<Source, String> {
    Source::parse(spec, Duration::from_secs(1), Duration::from_secs(1))
}

fn location(spec: &str) -> Location {
    match parse(spec) {
        Ok(Source::Remote(r)) => r.at,
        other => panic!("{spec}: {other:?}"),
    }
}

#[test]
fn vault_specs_name_a_connection_a_path_a_field_and_a_version() {
    assert_eq!(
        location("vault:secret/github#token"),
        Location::Vault {
            connection: String::new(),
            settings: None,
            path: "secret/github".into(),
            field: Some("token".into()),
            version: None,
        }
    );
    assert_eq!(
        location("vault.prod:database/creds/readonly?version=3#password"),
        Location::Vault {
            connection: "prod".into(),
            settings: None,
            path: "database/creds/readonly".into(),
            field: Some("password".into()),
            version: Some(3),
        }
    );
    assert!(matches!(
        location("vault:kv/team/app"),
        Location::Vault { field: None, .. }
    ));
    for (bad, why) in [
        ("vault:secret", "a mount alone"),
        ("vault:/secret/x", "leading"),
        ("vault:secret/x/", "trailing"),
        ("vault:secret//x", "empty"),
        ("vault:secret/../x", "'..'"),
        ("vault:secret/x#", "nothing after '#'"),
        ("vault:secret/x?version=0", "positive"),
        ("vault:secret/x?version=a", "positive"),
        ("vault:secret/x?stage=a", "unknown option \"stage\""),
        ("vault:secret/x?version=1&version=2", "twice"),
        ("vault.bad name:secret/x", "connection name"),
        ("vault.:secret/x", "connection name"),
        ("vault:secret/a b", "whitespace"),
    ] {
        let e = parse(bad).expect_err(bad);
        assert!(e.contains(why), "{bad}: {e}");
    }
}

#[test]
fn aws_specs_take_stage_version_region_and_a_json_key() {
    assert_eq!(
        location("aws-sm:prod/openai#api_key"),
        Location::AwsSm {
            id: "prod/openai".into(),
            json_key: Some("api_key".into()),
            stage: None,
            version_id: None,
            region: None,
        }
    );
    assert_eq!(
        location("aws-sm:arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/x-AbCdEf?stage=AWSPREVIOUS"),
        Location::AwsSm {
            id: "arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/x-AbCdEf".into(),
            json_key: None,
            stage: Some("AWSPREVIOUS".into()),
            version_id: None,
            region: Some("eu-west-1".into()),
        }
    );
    assert_eq!(
        location("aws-ssm:/prod/anthropic/key?version=2&region=us-west-2"),
        Location::AwsSsm {
            name: "/prod/anthropic/key".into(),
            version: Some(2),
            region: Some("us-west-2".into()),
        }
    );
    for (bad, why) in [
        ("aws-sm:x?stage=A&version_id=B", "not both"),
        ("aws-sm:x?region=US_EAST", "region"),
        ("aws-ssm:/x#field", "no fields"),
        ("aws-ssm:/x?stage=A", "unknown option"),
        ("aws-sm:?stage=A", "needs a name"),
    ] {
        let e = parse(bad).expect_err(bad);
        assert!(e.contains(why), "{bad}: {e}");
    }
}

#[test]
fn a_spec_error_never_echoes_the_spec() {
    // An operator who pasted a key where a source belongs must not see it in a log.
    for spec in [
        "vault:sk-live-abcdefghijklmnop?x=sk-live-abcdefghijklmnop",
        "aws-sm:sk-live-abcdefghijklmnop?region=sk-live-abcdefghijklmnop",
        "sk-live-abcdefghijklmnop:sk-live-abcdefghijklmnop",
    ] {
        let e = parse(spec).expect_err(spec);
        assert!(!e.contains("sk-live"), "{e}");
    }
}

#[test]
fn kinds_are_named_for_explain_and_the_audit_record() {
    assert_eq!(parse("vault:a/b").expect("v").kind(), "vault");
    assert_eq!(parse("aws-sm:a").expect("v").kind(), "aws-sm");
    assert_eq!(parse("aws-ssm:a").expect("v").kind(), "aws-ssm");
    assert_eq!(parse("env:A").expect("v").kind(), "env");
    assert_eq!(parse("file:/a").expect("v").kind(), "file");
    assert_eq!(parse("exec:true").expect("v").kind(), "exec");
}

/// One scripted answer: a value and its lease, or a failure.
type Answer = Option<(&'static str, Option<Duration>)>;

/// Answers each fetch from a script (value, lease), or fails when the script says `None`,
/// counting calls.
#[derive(Default)]
struct Scripted {
    answers: Mutex<VecDeque<Answer>>,
    calls: AtomicUsize,
    delay: Duration,
}

impl Scripted {
    fn new(answers: Vec<Answer>) -> Arc<Self> {
        Arc::new(Self {
            answers: Mutex::new(answers.into()),
            ..Default::default()
        })
    }
}

impl Fetch for Scripted {
    fn fetch<'a>(&'a self, _: &'a str, _: &'a Location) -> BoxFuture<'a, Result<Fetched, String>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            let next = self.answers.lock().expect("lock").pop_front().flatten();
            match next {
                Some((v, valid_for)) => Ok(Fetched {
                    value: SecretValue::new(v.as_bytes().to_vec()),
                    valid_for,
                }),
                None => Err("the store is down (connection refused)".into()),
            }
        })
    }
}

fn remote_store(refresh: Duration, stale_for: Duration, fetcher: Arc<Scripted>) -> SecretStore {
    let mut source = parse("vault:secret/app#key").expect("spec");
    if let Source::Remote(r) = &mut source {
        r.refresh = refresh;
        r.stale_for = stale_for;
    }
    let store = SecretStore::load(vec![("app".into(), source)]).expect("load");
    assert!(store.set_fetcher(fetcher));
    store
}

async fn value(store: &SecretStore) -> Result<String, SecretError> {
    store
        .get("app")
        .await
        .map(|v| String::from_utf8_lossy(v.expose()).into_owned())
}

#[tokio::test]
async fn without_a_fetcher_a_remote_secret_is_unavailable_and_named() {
    let store = SecretStore::load(vec![(
        "app".into(),
        parse("vault:secret/app#key").expect("spec"),
    )])
    .expect("load: nothing is fetched at load");
    let e = store.get("app").await.expect_err("no fetcher");
    let text = e.to_string();
    assert!(
        text.contains("\"app\"") && text.contains("vault:secret/app"),
        "{text}"
    );
}

#[tokio::test]
async fn a_value_is_fetched_once_and_cached_until_its_refresh() {
    let f = Scripted::new(vec![Some(("value-one-0123456789", None))]);
    let store = remote_store(Duration::from_secs(300), Duration::ZERO, f.clone());
    let (a, b) = tokio::join!(value(&store), value(&store));
    assert_eq!(a.expect("a"), "value-one-0123456789");
    assert_eq!(b.expect("b"), "value-one-0123456789");
    assert_eq!(value(&store).await.expect("c"), "value-one-0123456789");
    assert_eq!(
        f.calls.load(Ordering::SeqCst),
        1,
        "single flight, then cached"
    );
    assert_eq!(store.kind("app"), Some("vault"));
    assert!(!store.stale("app"));
}

#[tokio::test]
async fn a_failed_fetch_refuses_naming_the_secret_and_is_not_retried_by_every_request() {
    let f = Scripted::new(vec![None, None, Some(("value-two-0123456789", None))]);
    let store = remote_store(Duration::from_secs(300), Duration::ZERO, f.clone());
    let e = value(&store).await.expect_err("down");
    assert!(
        e.to_string().contains("\"app\"") && e.to_string().contains("store is down"),
        "{e}"
    );
    // Within FAILURE_KEPT the failure answers without asking the store again.
    let _ = value(&store).await.expect_err("still down");
    assert_eq!(f.calls.load(Ordering::SeqCst), 1);
    tokio::time::sleep(crate::FAILURE_KEPT + Duration::from_millis(50)).await;
    let _ = value(&store).await.expect_err("down again");
    tokio::time::sleep(crate::FAILURE_KEPT + Duration::from_millis(50)).await;
    assert_eq!(value(&store).await.expect("up"), "value-two-0123456789");
    assert_eq!(
        store.fetch_remote().await,
        Vec::new(),
        "nothing left to fetch"
    );
}

#[tokio::test]
async fn past_its_refresh_a_value_is_served_stale_only_within_stale_for() {
    let f = Scripted::new(vec![
        Some(("value-fresh-0123456789", None)),
        None,
        None,
        None,
    ]);
    let store = remote_store(Duration::from_secs(1), Duration::from_secs(2), f.clone());
    assert_eq!(
        value(&store).await.expect("fresh"),
        "value-fresh-0123456789"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // The refresh fails (in the background); the last value is served, marked stale.
    assert_eq!(
        value(&store).await.expect("stale"),
        "value-fresh-0123456789"
    );
    assert!(store.stale("app"));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let e = value(&store).await.expect_err("past stale_for");
    assert!(e.to_string().contains("store is down"), "{e}");
}

#[tokio::test]
async fn without_stale_for_a_value_past_its_refresh_is_fetched_before_use() {
    let f = Scripted::new(vec![Some(("value-fresh-0123456789", None)), None, None]);
    let store = remote_store(Duration::from_secs(1), Duration::ZERO, f.clone());
    assert_eq!(
        value(&store).await.expect("fresh"),
        "value-fresh-0123456789"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let e = value(&store).await.expect_err("no grace");
    assert!(e.to_string().contains("store is down"), "{e}");
}

#[tokio::test]
async fn a_lease_shortens_the_refresh_and_a_rotated_value_stays_redacted() {
    // A 1.5 s lease: refreshed after 1 s (two thirds), in the background from 0.8 s.
    let f = Scripted::new(vec![
        Some(("lease-one-0123456789", Some(Duration::from_millis(1500)))),
        Some(("lease-two-0123456789", Some(Duration::from_secs(60)))),
    ]);
    let store = remote_store(Duration::from_secs(300), Duration::ZERO, f.clone());
    assert_eq!(value(&store).await.expect("one"), "lease-one-0123456789");
    tokio::time::sleep(Duration::from_millis(900)).await;
    // Still the first (its background refresh has started).
    let _ = value(&store).await.expect("during");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(value(&store).await.expect("two"), "lease-two-0123456789");
    assert_eq!(f.calls.load(Ordering::SeqCst), 2);
    let s = store.scrubber().expect("scrubber").expect("values");
    let (out, names) = s.scrub(b"old lease-one-0123456789 new lease-two-0123456789");
    assert_eq!(names.len(), 2, "{}", String::from_utf8_lossy(&out));
}

#[tokio::test]
async fn a_value_whose_lease_ended_is_never_served_even_within_stale_for() {
    let f = Scripted::new(vec![
        Some(("short-lease-0123456789", Some(Duration::from_millis(600)))),
        None,
        None,
        None,
    ]);
    let store = remote_store(
        Duration::from_secs(300),
        Duration::from_secs(600),
        f.clone(),
    );
    assert_eq!(value(&store).await.expect("one"), "short-lease-0123456789");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let e = value(&store).await.expect_err("the lease ended");
    assert!(e.to_string().contains("store is down"), "{e}");
}

#[tokio::test]
async fn fetch_remote_reports_every_failure_at_once_by_name() {
    let f = Scripted::new(vec![None, None]);
    let store = SecretStore::load(vec![
        ("a".into(), parse("vault:secret/a#k").expect("a")),
        ("b".into(), parse("aws-sm:prod/b").expect("b")),
        (
            "c".into(),
            Source::Exec {
                command: "true".into(),
                ttl: Duration::from_secs(1),
                timeout: Duration::from_secs(1),
            },
        ),
    ])
    .expect("load");
    store.set_fetcher(f);
    let failures = store.fetch_remote().await;
    let names: Vec<&str> = failures.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert!(failures[1].1.contains("aws-sm:prod/b"), "{failures:?}");
}

#[tokio::test]
async fn a_short_fetched_value_is_refused_like_a_short_file() {
    let f = Scripted::new(vec![Some(("short", None))]);
    let store = remote_store(Duration::from_secs(300), Duration::ZERO, f);
    let e = value(&store).await.expect_err("too short");
    assert!(e.to_string().contains("shorter than"), "{e}");
    assert!(!e.to_string().contains("short\""), "{e}");
}

//! Unit tests of the outbox on a real SQLite store: enqueueing, one claimed item's ack,
//! reschedule or drop, and the worker loop (woken by an enqueue, stopped by shutdown).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::tests::{approval, loopback_client, notice, notifier, receiver};
use super::*;

async fn sqlite(dir: &tempfile::TempDir) -> Arc<dyn StateStore> {
    crate::state::open(&format!("sqlite:{}", dir.path().join("state.db").display()))
        .await
        .unwrap()
}

fn two_notifiers(url: &str) -> Vec<Notifier> {
    let mut chat = notifier(url, false, NotifyFormat::Slack);
    chat.name = "chat".into();
    vec![chat, notifier(url, false, NotifyFormat::Json)]
}

#[tokio::test]
async fn enqueue_puts_one_item_per_notifier_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(&dir).await;
    let configured = two_notifiers("http://127.0.0.1:9/hook");
    let a = approval();
    let now = SystemTime::now();
    let all = enqueue_to(
        &*store,
        &configured,
        &[],
        EVENT_REQUESTED,
        &a,
        Buttons::default(),
        now,
    )
    .await;
    assert_eq!(all.unwrap(), 2);
    assert_eq!(store.queue_len(QUEUE_NOTIFY).await.unwrap(), 2);
    // The same event again (a duplicate call) is not queued twice.
    let again = enqueue_to(
        &*store,
        &configured,
        &[],
        EVENT_REQUESTED,
        &a,
        Buttons::default(),
        now,
    )
    .await;
    assert_eq!(again.unwrap(), 0);
    // Named notifiers only; a name the policy lacks is skipped.
    let names = ["ops".to_string(), "gone".to_string()];
    let decided = enqueue_to(
        &*store,
        &configured,
        &names,
        EVENT_DECIDED,
        &a,
        Buttons::default(),
        now,
    )
    .await;
    assert_eq!(decided.unwrap(), 1);
    let mut ids: Vec<String> = store
        .claim(QUEUE_NOTIFY, now, CLAIM_LEASE, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|c| {
            let doc: Value = serde_json::from_slice(&c.doc).unwrap();
            assert!(doc["approval"].get("fingerprint").is_none(), "{doc}");
            assert!(doc["first_enqueued"].is_string(), "{doc}");
            c.id
        })
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "ap_1234-approval.decided-ops",
            "ap_1234-approval.requested-chat",
            "ap_1234-approval.requested-ops",
        ]
    );
}

#[tokio::test]
async fn a_failed_delivery_is_retried_with_the_same_delivery_id_then_acked() {
    let (addr, seen) = receiver(vec![500, 503, 200]).await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(&dir).await;
    let configured = vec![notifier(
        &format!("http://{addr}/hook"),
        false,
        NotifyFormat::Json,
    )];
    let client = loopback_client();
    let secrets = SecretStore::empty();
    let start = SystemTime::now();
    enqueue_to(
        &*store,
        &configured,
        &[],
        EVENT_REQUESTED,
        &approval(),
        Buttons::default(),
        start,
    )
    .await
    .unwrap();
    let mut now = start;
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let mut items = store
            .claim(QUEUE_NOTIFY, now, CLAIM_LEASE, 16)
            .await
            .unwrap();
        assert_eq!(items.len(), 1, "due at {now:?}");
        let item = items.remove(0);
        let outcome = handle(&*store, &configured, &secrets, &client, item, now)
            .await
            .unwrap();
        if let Outcome::Retry(due) = outcome {
            // Not due again before its backoff has passed.
            assert!(store
                .claim(
                    QUEUE_NOTIFY,
                    due - Duration::from_millis(500),
                    CLAIM_LEASE,
                    16
                )
                .await
                .unwrap()
                .is_empty());
            now = due;
        }
        outcomes.push(outcome);
    }
    assert_eq!(
        outcomes,
        [
            Outcome::Retry(start + Duration::from_secs(1)),
            Outcome::Retry(start + Duration::from_secs(3)),
            Outcome::Delivered,
        ]
    );
    assert_eq!(store.queue_len(QUEUE_NOTIFY).await.unwrap(), 0);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert!(seen
        .iter()
        .all(|s| s.headers["x-latchkey-delivery"] == "ap_1234-approval.requested-ops"));
}

#[tokio::test]
async fn items_past_a_day_or_for_a_removed_notifier_are_dropped_undelivered() {
    let (addr, seen) = receiver(vec![200]).await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(&dir).await;
    let configured = two_notifiers(&format!("http://{addr}/hook"));
    let client = loopback_client();
    let secrets = SecretStore::empty();
    let start = SystemTime::now();
    enqueue_to(
        &*store,
        &configured,
        &[],
        EVENT_REQUESTED,
        &approval(),
        Buttons::default(),
        start,
    )
    .await
    .unwrap();
    // A reload removed `chat`; a day later `ops` is still undelivered.
    let later = start + GIVE_UP_AFTER;
    let now_configured = &configured[1..];
    for item in store
        .claim(QUEUE_NOTIFY, later, CLAIM_LEASE, 16)
        .await
        .unwrap()
    {
        let outcome = handle(&*store, now_configured, &secrets, &client, item, later)
            .await
            .unwrap();
        assert_eq!(outcome, Outcome::Dropped);
    }
    assert_eq!(store.queue_len(QUEUE_NOTIFY).await.unwrap(), 0);
    // An item for a removed notifier, still young, is dropped too.
    let mut a = approval();
    a.id = "ap_2".into();
    enqueue_to(
        &*store,
        &configured,
        &["chat".into()],
        EVENT_REQUESTED,
        &a,
        Buttons::default(),
        start,
    )
    .await
    .unwrap();
    let item = store
        .claim(QUEUE_NOTIFY, start, CLAIM_LEASE, 16)
        .await
        .unwrap();
    let outcome = handle(
        &*store,
        now_configured,
        &secrets,
        &client,
        item[0].clone(),
        start,
    )
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Dropped);
    assert_eq!(store.queue_len(QUEUE_NOTIFY).await.unwrap(), 0);
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_bare_notice_counts_its_age_from_the_approval_and_garbage_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(&dir).await;
    let configured = vec![notifier(
        "http://127.0.0.1:9/hook",
        false,
        NotifyFormat::Json,
    )];
    let n = notice(EVENT_REQUESTED, None);
    let created = n.approval.created;
    store
        .enqueue(
            QUEUE_NOTIFY,
            "bare",
            &serde_json::to_vec(&n).unwrap(),
            created,
        )
        .await
        .unwrap();
    store
        .enqueue(QUEUE_NOTIFY, "garbage", b"not json", created)
        .await
        .unwrap();
    let now = created + GIVE_UP_AFTER;
    let client = loopback_client();
    for item in store
        .claim(QUEUE_NOTIFY, now, CLAIM_LEASE, 16)
        .await
        .unwrap()
    {
        let outcome = handle(
            &*store,
            &configured,
            &SecretStore::empty(),
            &client,
            item,
            now,
        )
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Dropped);
    }
    assert_eq!(store.queue_len(QUEUE_NOTIFY).await.unwrap(), 0);
}

#[tokio::test]
async fn the_worker_delivers_what_is_enqueued_promptly_and_stops_on_shutdown() {
    let (addr, seen) = receiver(vec![200]).await;
    let text = format!(
        "[notify.ops]\nurl = \"http://{addr}/hook\"\n\n[notify.chat]\nurl = \"http://{addr}/chat\"\nformat = \"slack\"\n"
    );
    let policy = Arc::new(
        crate::policy::compile_sources(&[(std::path::Path::new("notify.toml"), &text)]).unwrap(),
    );
    assert_eq!(policy.notifiers().len(), 2);
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(&dir).await;
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let source = Arc::clone(&policy);
    let worker = Worker::new(
        Arc::clone(&store),
        Arc::new(move || (Arc::clone(&source), Arc::new(SecretStore::empty()))),
        loopback_client(),
    );
    let stats = worker.stats();
    let task = tokio::spawn(worker.run(shutdown));
    // Let the worker find the queue empty and go to sleep first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = std::time::Instant::now();
    let queued = enqueue(
        &*store,
        &policy,
        &[],
        EVENT_REQUESTED,
        &approval(),
        Buttons::default(),
    )
    .await;
    assert_eq!(queued.unwrap(), 2);
    while seen.lock().unwrap().len() < 2 {
        assert!(asked.elapsed() < Duration::from_secs(5), "not delivered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Woken by the enqueue: the next poll would come ~700 ms after it.
    assert!(
        asked.elapsed() < Duration::from_millis(400),
        "{:?}",
        asked.elapsed()
    );
    let mut paths: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| {
            s.headers["x-latchkey-delivery"]
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "ap_1234-approval.requested-chat",
            "ap_1234-approval.requested-ops"
        ]
    );
    while stats.delivered.load(Ordering::Relaxed) < 2 {
        assert!(asked.elapsed() < Duration::from_secs(5), "not acked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.queue_len(QUEUE_NOTIFY).await.unwrap(), 0);
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("the worker stops on shutdown")
        .unwrap();
}

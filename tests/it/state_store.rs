//! The state store conformance suite: one function per behaviour, taking `Arc<dyn StateStore>`,
//! run against both backends — a real SQLite file in a temp dir and a real `redis-server` on
//! loopback ([`support::redis::RedisServer`]) — plus each backend's own concerns (restart,
//! two handles on one store, start-up errors that name the problem and never a password).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use latchkey::state::{Added, Event, Redis, Sqlite, StateStore, Taken};

use crate::support::redis::RedisServer;

/// Short enough to keep the suite fast, long enough that a loaded machine does not expire a
/// record between the write and the first read.
const TTL: Duration = Duration::from_millis(300);

async fn past_ttl() {
    tokio::time::sleep(TTL + Duration::from_millis(200)).await;
}

// ---------------------------------------------------------------------------------------------
// Records

async fn put_new_twice(store: Arc<dyn StateStore>) {
    assert!(store.put_new("t", "a", b"{\"n\":1}", None).await.unwrap());
    assert!(!store.put_new("t", "a", b"{\"n\":2}", None).await.unwrap());
    let got = store.get("t", "a").await.unwrap().unwrap();
    assert_eq!(got.doc, b"{\"n\":1}");
    assert!(store.get("t", "missing").await.unwrap().is_none());
    assert!(
        store.get("other", "a").await.unwrap().is_none(),
        "namespaces are separate"
    );
}

async fn replace_is_compare_and_set(store: Arc<dyn StateStore>) {
    store.put("t", "a", b"1", None).await.unwrap();
    let v1 = store.get("t", "a").await.unwrap().unwrap().version;
    store.put("t", "a", b"2", None).await.unwrap();
    let v2 = store.get("t", "a").await.unwrap().unwrap();
    assert!(v2.version > v1, "put increments the version");
    assert_eq!(v2.doc, b"2");
    assert!(!store.replace("t", "a", v1, b"stale", None).await.unwrap());
    assert!(store
        .replace("t", "a", v2.version, b"3", None)
        .await
        .unwrap());
    let v3 = store.get("t", "a").await.unwrap().unwrap();
    assert_eq!(v3.doc, b"3");
    assert!(v3.version > v2.version);
    assert!(!store
        .replace("t", "a", v2.version, b"again", None)
        .await
        .unwrap());
    assert!(!store.replace("t", "gone", 1, b"x", None).await.unwrap());
    assert!(store.get("t", "gone").await.unwrap().is_none());
}

async fn records_expire(store: Arc<dyn StateStore>) {
    assert!(store.put_new("t", "short", b"1", Some(TTL)).await.unwrap());
    store.put("t", "kept", b"1", None).await.unwrap();
    let v = store.get("t", "short").await.unwrap().unwrap().version;
    past_ttl().await;
    assert!(store.get("t", "short").await.unwrap().is_none());
    assert!(!store.replace("t", "short", v, b"2", None).await.unwrap());
    assert!(
        !store.delete("t", "short").await.unwrap(),
        "an expired record is not deleted"
    );
    let listed: Vec<String> = store
        .list("t", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(listed, ["kept"]);
    assert!(
        store.put_new("t", "short", b"new", None).await.unwrap(),
        "its id is free again"
    );
    // A replace with no TTL clears an expiry; with one, sets it.
    store.put("t", "ttl", b"1", Some(TTL)).await.unwrap();
    let v = store.get("t", "ttl").await.unwrap().unwrap().version;
    assert!(store.replace("t", "ttl", v, b"2", None).await.unwrap());
    past_ttl().await;
    assert_eq!(store.get("t", "ttl").await.unwrap().unwrap().doc, b"2");
}

async fn delete_is_exactly_once(store: Arc<dyn StateStore>) {
    store.put("t", "grant", b"once", None).await.unwrap();
    let deleters = (0..16).map(|_| {
        let store = store.clone();
        tokio::spawn(async move { store.delete("t", "grant").await.unwrap() })
    });
    let mut winners = 0;
    for deleter in deleters.collect::<Vec<_>>() {
        winners += usize::from(deleter.await.unwrap());
    }
    assert_eq!(winners, 1);
    assert!(store.get("t", "grant").await.unwrap().is_none());
    assert!(!store.delete("t", "grant").await.unwrap());
}

async fn list_is_newest_first_with_a_limit(store: Arc<dyn StateStore>) {
    for id in ["a", "b", "c", "d"] {
        store.put("l", id, id.as_bytes(), None).await.unwrap();
    }
    store.put("other", "x", b"x", None).await.unwrap();
    let v = store.get("l", "b").await.unwrap().unwrap().version;
    assert!(store.replace("l", "b", v, b"b2", None).await.unwrap());
    let all: Vec<(String, Vec<u8>)> = store
        .list("l", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|(id, v)| (id, v.doc))
        .collect();
    let ids: Vec<&str> = all.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["b", "d", "c", "a"], "newest write first");
    assert_eq!(all[0].1, b"b2");
    let two: Vec<String> = store
        .list("l", 2)
        .await
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(two, ["b", "d"]);
    assert!(store.delete("l", "d").await.unwrap());
    let after: Vec<String> = store
        .list("l", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(after, ["b", "c", "a"]);
    assert!(store.list("empty", 10).await.unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Counters

async fn counters_stay_within_their_limit(store: Arc<dyn StateStore>) {
    let adders = (0..32).map(|_| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .add("c", 1, Some(20), Duration::from_secs(60))
                .await
                .unwrap()
        })
    });
    let mut ok = 0;
    let mut over = 0;
    for adder in adders.collect::<Vec<_>>() {
        match adder.await.unwrap() {
            Added::Ok(n) => {
                assert!((1..=20).contains(&n), "{n}");
                ok += 1;
            }
            Added::Over(n) => {
                assert_eq!(n, 20);
                over += 1;
            }
        }
    }
    assert_eq!((ok, over), (20, 12));
    assert_eq!(store.counter("c").await.unwrap(), 20);
    assert_eq!(
        store
            .add("c", 5, Some(20), Duration::from_secs(60))
            .await
            .unwrap(),
        Added::Over(20)
    );
    assert_eq!(
        store
            .add("c", 5, None, Duration::from_secs(60))
            .await
            .unwrap(),
        Added::Ok(25)
    );
    // Unlimited concurrent adds sum exactly.
    let adders = (0..32).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .add("sum", i, None, Duration::from_secs(60))
                .await
                .unwrap()
        })
    });
    for adder in adders.collect::<Vec<_>>() {
        adder.await.unwrap();
    }
    assert_eq!(store.counter("sum").await.unwrap(), (0..32).sum::<i64>());
}

async fn a_negative_delta_floors_at_zero(store: Arc<dyn StateStore>) {
    let ttl = Duration::from_secs(60);
    assert_eq!(store.add("f", 3, Some(5), ttl).await.unwrap(), Added::Ok(3));
    assert_eq!(
        store.add("f", -2, Some(5), ttl).await.unwrap(),
        Added::Ok(1)
    );
    assert_eq!(
        store.add("f", -10, Some(5), ttl).await.unwrap(),
        Added::Ok(0)
    );
    assert_eq!(store.counter("f").await.unwrap(), 0);
    assert_eq!(store.add("f", 5, Some(5), ttl).await.unwrap(), Added::Ok(5));
    assert_eq!(store.counter("absent").await.unwrap(), 0);
}

async fn counters_expire_from_their_creation(store: Arc<dyn StateStore>) {
    assert_eq!(store.add("e", 2, Some(2), TTL).await.unwrap(), Added::Ok(2));
    tokio::time::sleep(TTL / 2).await;
    // A later add keeps the first expiry (it does not extend the window).
    assert_eq!(
        store
            .add("e", -1, Some(2), Duration::from_secs(60))
            .await
            .unwrap(),
        Added::Ok(1)
    );
    tokio::time::sleep(TTL / 2 + Duration::from_millis(200)).await;
    assert_eq!(store.counter("e").await.unwrap(), 0);
    assert_eq!(
        store.add("e", 2, Some(2), TTL).await.unwrap(),
        Added::Ok(2),
        "a new window"
    );
}

// ---------------------------------------------------------------------------------------------
// Leases

async fn leases_are_exclusive(store: Arc<dyn StateStore>) {
    let long = Duration::from_secs(60);
    assert!(store.lease("l", "a", long).await.unwrap());
    assert!(!store.lease("l", "b", long).await.unwrap());
    assert!(
        store.lease("l", "a", long).await.unwrap(),
        "the holder renews"
    );
    store.release("l", "b").await.unwrap();
    assert!(
        !store.lease("l", "b", long).await.unwrap(),
        "only the holder releases"
    );
    store.release("l", "a").await.unwrap();
    assert!(store.lease("l", "b", long).await.unwrap());
    // Expiry frees it; a renewal pushes the expiry out.
    assert!(store.lease("x", "a", TTL).await.unwrap());
    tokio::time::sleep(TTL / 2).await;
    assert!(store.lease("x", "a", TTL).await.unwrap());
    tokio::time::sleep(TTL / 2 + Duration::from_millis(50)).await;
    assert!(
        !store.lease("x", "b", TTL).await.unwrap(),
        "renewed, so still held"
    );
    past_ttl().await;
    assert!(
        store.lease("x", "b", TTL).await.unwrap(),
        "expired, so free"
    );
}

// ---------------------------------------------------------------------------------------------
// Token buckets

/// Room for a loaded machine between a call and the next one.
const SLACK: Duration = Duration::from_millis(500);

/// `n` concurrent takes of `key` on `stores` (round robin): the results, in no order.
async fn concurrent_takes(
    stores: &[Arc<dyn StateStore>],
    key: &'static str,
    n: usize,
    burst: u64,
    interval: Duration,
) -> Vec<Taken> {
    let takers = (0..n).map(|i| {
        let store = stores[i % stores.len()].clone();
        tokio::spawn(async move { store.take(key, burst, interval).await.unwrap() })
    });
    let mut out = Vec::new();
    for taker in takers.collect::<Vec<_>>() {
        out.push(taker.await.unwrap());
    }
    out
}

/// Exactly `burst` of the takes were allowed, each seeing a different count left, and the
/// refused ones say a token is back within one interval.
fn assert_exactly_the_burst(taken: &[Taken], burst: u64, interval: Duration) {
    let mut remaining: Vec<u64> = taken
        .iter()
        .filter(|t| t.allowed)
        .map(|t| t.remaining)
        .collect();
    remaining.sort_unstable();
    assert_eq!(remaining, (0..burst).collect::<Vec<_>>(), "{taken:?}");
    for refused in taken.iter().filter(|t| !t.allowed) {
        assert_eq!(refused.remaining, 0);
        assert!(
            refused.retry_after > Duration::ZERO && refused.retry_after <= interval,
            "{refused:?}"
        );
        assert!(
            refused.reset_after <= interval * burst as u32
                && refused.reset_after + SLACK >= interval * burst as u32,
            "{refused:?}"
        );
    }
}

async fn buckets_admit_exactly_their_burst(store: Arc<dyn StateStore>) {
    let minute = Duration::from_secs(60);
    let taken = concurrent_takes(std::slice::from_ref(&store), "burst", 50, 10, minute).await;
    assert_exactly_the_burst(&taken, 10, minute);
    assert!(
        !store.take("burst", 10, minute).await.unwrap().allowed,
        "still empty"
    );
}

async fn buckets_refill_one_token_per_interval(store: Arc<dyn StateStore>) {
    let interval = Duration::from_millis(400);
    let first = store.take("refill", 2, interval).await.unwrap();
    assert!(first.allowed);
    assert_eq!(first.remaining, 1);
    assert_eq!(first.retry_after, Duration::ZERO);
    assert!(
        first.reset_after <= interval && first.reset_after + SLACK >= interval,
        "{first:?}"
    );
    let second = store.take("refill", 2, interval).await.unwrap();
    assert!(second.allowed);
    assert_eq!(second.remaining, 0);
    let refused = store.take("refill", 2, interval).await.unwrap();
    assert!(!refused.allowed);
    assert!(
        refused.retry_after <= interval && refused.retry_after + SLACK >= interval,
        "{refused:?}"
    );
    assert!(refused.reset_after > refused.retry_after, "{refused:?}");
    tokio::time::sleep(refused.retry_after + Duration::from_millis(20)).await;
    let back = store.take("refill", 2, interval).await.unwrap();
    assert!(back.allowed, "one token back after retry_after: {back:?}");
    assert_eq!(back.remaining, 0, "only one");
    // Idle for longer than it takes to fill: full, and no fuller.
    tokio::time::sleep(interval * 3).await;
    let full = store.take("refill", 2, interval).await.unwrap();
    assert!(full.allowed);
    assert_eq!(full.remaining, 1);
}

async fn buckets_are_independent(store: Arc<dyn StateStore>) {
    let minute = Duration::from_secs(60);
    assert!(store.take("a", 1, minute).await.unwrap().allowed);
    assert!(!store.take("a", 1, minute).await.unwrap().allowed);
    let other = store.take("b", 1, minute).await.unwrap();
    assert!(other.allowed, "another key has its own bucket");
    assert!(!store.take("b", 1, minute).await.unwrap().allowed);
    // A bucket is not a counter, nor a semaphore, of the same name.
    assert_eq!(store.counter("a").await.unwrap(), 0);
    assert_eq!(store.holders("a").await.unwrap(), 0);
}

async fn zero_burst_or_interval_is_an_error_naming_the_key(store: Arc<dyn StateStore>) {
    for (burst, interval) in [(0, Duration::from_secs(1)), (5, Duration::ZERO)] {
        let err = store
            .take("rl:bad", burst, interval)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("rl:bad"), "{err}");
        assert!(err.contains(store.describe()), "{err}");
    }
    let err = store
        .acquire("sem:bad", "h", 0, Duration::from_secs(1))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("sem:bad") && err.contains("max"), "{err}");
    let err = store
        .acquire("sem:bad", "h", 1, Duration::ZERO)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("sem:bad") && err.contains("ttl"), "{err}");
    assert_eq!(store.holders("sem:bad").await.unwrap(), 0);
}

// ---------------------------------------------------------------------------------------------
// Semaphores

/// `n` concurrent acquires of `key` by holders `h0..hn` on `stores` (round robin): how many
/// got a slot, and every count they were given.
async fn concurrent_acquires(
    stores: &[Arc<dyn StateStore>],
    key: &'static str,
    n: usize,
    max: u64,
) -> (usize, Vec<u64>) {
    let acquirers = (0..n).map(|i| {
        let store = stores[i % stores.len()].clone();
        tokio::spawn(async move {
            store
                .acquire(key, &format!("h{i}"), max, Duration::from_secs(60))
                .await
                .unwrap()
        })
    });
    let mut counts = Vec::new();
    for acquirer in acquirers.collect::<Vec<_>>() {
        counts.extend(acquirer.await.unwrap());
    }
    counts.sort_unstable();
    (counts.len(), counts)
}

async fn semaphores_admit_exactly_max(store: Arc<dyn StateStore>) {
    let (got, counts) = concurrent_acquires(std::slice::from_ref(&store), "sem", 10, 3).await;
    assert_eq!(got, 3);
    assert_eq!(counts, [1, 2, 3]);
    assert_eq!(store.holders("sem").await.unwrap(), 3);
    assert_eq!(store.holders("absent").await.unwrap(), 0);
}

async fn a_holder_renews_without_a_second_slot(store: Arc<dyn StateStore>) {
    let long = Duration::from_secs(60);
    assert_eq!(store.acquire("r", "a", 2, long).await.unwrap(), Some(1));
    assert_eq!(
        store.acquire("r", "a", 2, long).await.unwrap(),
        Some(1),
        "a renewal"
    );
    assert_eq!(store.holders("r").await.unwrap(), 1);
    assert_eq!(store.acquire("r", "b", 2, long).await.unwrap(), Some(2));
    assert_eq!(store.acquire("r", "c", 2, long).await.unwrap(), None);
    assert_eq!(store.acquire("r", "a", 2, long).await.unwrap(), Some(2));
    // A holder renews even when the cap was lowered below what is held.
    assert_eq!(store.acquire("r", "b", 1, long).await.unwrap(), Some(2));
    assert_eq!(store.acquire("r", "c", 1, long).await.unwrap(), None);
    assert_eq!(store.holders("r").await.unwrap(), 2);
}

async fn relinquish_frees_a_slot(store: Arc<dyn StateStore>) {
    let long = Duration::from_secs(60);
    assert_eq!(store.acquire("f", "a", 1, long).await.unwrap(), Some(1));
    assert_eq!(store.acquire("f", "b", 1, long).await.unwrap(), None);
    store.relinquish("f", "b").await.unwrap();
    assert_eq!(
        store.acquire("f", "b", 1, long).await.unwrap(),
        None,
        "only a holder gives its slot back"
    );
    store.relinquish("f", "a").await.unwrap();
    assert_eq!(store.holders("f").await.unwrap(), 0);
    assert_eq!(store.acquire("f", "b", 1, long).await.unwrap(), Some(1));
    store.relinquish("f", "b").await.unwrap();
    store.relinquish("f", "b").await.unwrap();
    store.relinquish("never", "x").await.unwrap();
    assert_eq!(store.holders("f").await.unwrap(), 0);
}

async fn a_dead_holders_slot_expires(store: Arc<dyn StateStore>) {
    let long = Duration::from_secs(60);
    assert_eq!(store.acquire("d", "dead", 2, TTL).await.unwrap(), Some(1));
    assert_eq!(store.acquire("d", "alive", 2, long).await.unwrap(), Some(2));
    assert_eq!(store.acquire("d", "late", 2, long).await.unwrap(), None);
    // A renewal pushes the expiry out.
    assert_eq!(store.acquire("x", "a", 1, TTL).await.unwrap(), Some(1));
    tokio::time::sleep(TTL / 2).await;
    assert_eq!(store.acquire("x", "a", 1, TTL).await.unwrap(), Some(1));
    tokio::time::sleep(TTL / 2 + Duration::from_millis(50)).await;
    assert_eq!(
        store.acquire("x", "b", 1, TTL).await.unwrap(),
        None,
        "renewed, so still held"
    );
    past_ttl().await;
    assert_eq!(store.holders("d").await.unwrap(), 1, "the dead one is gone");
    assert_eq!(store.acquire("d", "late", 2, long).await.unwrap(), Some(2));
    assert_eq!(store.acquire("x", "b", 1, TTL).await.unwrap(), Some(1));
}

async fn semaphores_are_independent(store: Arc<dyn StateStore>) {
    let long = Duration::from_secs(60);
    assert_eq!(store.acquire("s1", "a", 1, long).await.unwrap(), Some(1));
    assert_eq!(store.acquire("s2", "b", 1, long).await.unwrap(), Some(1));
    assert_eq!(store.acquire("s1", "b", 1, long).await.unwrap(), None);
    store.relinquish("s2", "a").await.unwrap();
    assert_eq!(store.holders("s1").await.unwrap(), 1);
    assert_eq!(store.holders("s2").await.unwrap(), 1);
    // Nor is a semaphore a lease of the same name.
    assert!(store.lease("s1", "z", long).await.unwrap());
}

// ---------------------------------------------------------------------------------------------
// Queues

async fn claims_move_due_items_under_a_lease(store: Arc<dyn StateStore>) {
    let now = SystemTime::now();
    store.enqueue("q", "one", b"1", now).await.unwrap();
    store
        .enqueue("q", "two", b"2", now + Duration::from_millis(1))
        .await
        .unwrap();
    store
        .enqueue("q", "later", b"3", now + Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(store.queue_len("q").await.unwrap(), 3);
    let at = now + Duration::from_millis(10);
    let first = store.claim("q", at, TTL, 10).await.unwrap();
    let ids: Vec<&str> = first.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["one", "two"], "due items, oldest due first");
    assert_eq!(first[0].doc, b"1");
    assert!(first.iter().all(|c| c.attempts == 0));
    assert!(
        store.claim("q", at, TTL, 10).await.unwrap().is_empty(),
        "leased, so not due"
    );
    let again = store.claim("q", at + TTL, TTL, 1).await.unwrap();
    assert_eq!(again.len(), 1, "max is respected");
    assert_eq!((again[0].id.as_str(), again[0].attempts), ("one", 1));
    let rest = store.claim("q", at + TTL, TTL, 10).await.unwrap();
    assert_eq!((rest[0].id.as_str(), rest[0].attempts), ("two", 1));
    assert_eq!(
        store.queue_len("q").await.unwrap(),
        3,
        "claimed items stay until acked"
    );
    assert_eq!(store.queue_len("empty").await.unwrap(), 0);
}

async fn reschedule_and_ack(store: Arc<dyn StateStore>) {
    let now = SystemTime::now();
    store.enqueue("r", "a", b"a", now).await.unwrap();
    store.enqueue("r", "b", b"b", now).await.unwrap();
    assert_eq!(store.claim("r", now, TTL, 10).await.unwrap().len(), 2);
    store.reschedule("r", "a", now).await.unwrap();
    let retried = store.claim("r", now, TTL, 10).await.unwrap();
    assert_eq!(retried.len(), 1);
    assert_eq!((retried[0].id.as_str(), retried[0].attempts), ("a", 1));
    store.ack("r", "a").await.unwrap();
    assert_eq!(store.queue_len("r").await.unwrap(), 1);
    store.reschedule("r", "a", now).await.unwrap();
    assert_eq!(
        store.queue_len("r").await.unwrap(),
        1,
        "rescheduling an acked item adds nothing"
    );
    store.ack("r", "b").await.unwrap();
    store.ack("r", "b").await.unwrap();
    assert_eq!(store.queue_len("r").await.unwrap(), 0);
    assert!(store
        .claim("r", now + Duration::from_secs(3600), TTL, 10)
        .await
        .unwrap()
        .is_empty());
    // Enqueueing an id again replaces its document and due time.
    store
        .enqueue("r", "c", b"old", now + Duration::from_secs(3600))
        .await
        .unwrap();
    store.enqueue("r", "c", b"new", now).await.unwrap();
    let c = store.claim("r", now, TTL, 10).await.unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].doc, b"new");
}

// ---------------------------------------------------------------------------------------------
// Events

async fn next_event(rx: &mut tokio::sync::broadcast::Receiver<Event>) -> Event {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("an event within 5 s")
        .expect("the event channel open")
}

async fn publish_reaches_subscribers(store: Arc<dyn StateStore>) {
    let mut rx = store.subscribe();
    store.publish("decided", "apr_1").await.unwrap();
    store.publish("other", "x").await.unwrap();
    assert_eq!(
        next_event(&mut rx).await,
        Event {
            channel: "decided".into(),
            message: "apr_1".into()
        }
    );
    assert_eq!(next_event(&mut rx).await.channel, "other");
}

// ---------------------------------------------------------------------------------------------
// Two handles on one store

async fn two_handles_share_one_store(a: Arc<dyn StateStore>, b: Arc<dyn StateStore>) {
    assert!(a.put_new("h", "x", b"from a", None).await.unwrap());
    assert!(!b.put_new("h", "x", b"from b", None).await.unwrap());
    let seen = b.get("h", "x").await.unwrap().unwrap();
    assert_eq!(seen.doc, b"from a");
    assert!(b
        .replace("h", "x", seen.version, b"by b", None)
        .await
        .unwrap());
    assert!(!a
        .replace("h", "x", seen.version, b"stale a", None)
        .await
        .unwrap());
    assert_eq!(a.get("h", "x").await.unwrap().unwrap().doc, b"by b");
    // Exactly one deleter wins across both handles.
    let deleters = (0..16).map(|i| {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        tokio::spawn(async move { store.delete("h", "x").await.unwrap() })
    });
    let mut winners = 0;
    for deleter in deleters.collect::<Vec<_>>() {
        winners += usize::from(deleter.await.unwrap());
    }
    assert_eq!(winners, 1);
    // Counters and queue claims are shared too.
    let ttl = Duration::from_secs(60);
    assert_eq!(a.add("hc", 1, Some(1), ttl).await.unwrap(), Added::Ok(1));
    assert_eq!(b.add("hc", 1, Some(1), ttl).await.unwrap(), Added::Over(1));
    let now = SystemTime::now();
    a.enqueue("hq", "n", b"n", now).await.unwrap();
    assert_eq!(b.claim("hq", now, ttl, 10).await.unwrap().len(), 1);
    assert!(a.claim("hq", now, ttl, 10).await.unwrap().is_empty());
    // A publish on one is seen by the other's subscriber.
    let mut rx = b.subscribe();
    a.publish("decided", "apr_2").await.unwrap();
    assert_eq!(
        next_event(&mut rx).await,
        Event {
            channel: "decided".into(),
            message: "apr_2".into()
        }
    );
}

/// Two handles (two replicas) enforce one bucket, one semaphore and one counter limit between
/// them, under concurrency.
async fn two_handles_share_limits(a: Arc<dyn StateStore>, b: Arc<dyn StateStore>) {
    let both = [a.clone(), b.clone()];
    let minute = Duration::from_secs(60);
    let taken = concurrent_takes(&both, "shared-rl", 50, 10, minute).await;
    assert_exactly_the_burst(&taken, 10, minute);
    let (got, counts) = concurrent_acquires(&both, "shared-sem", 10, 3).await;
    assert_eq!((got, counts), (3, vec![1, 2, 3]));
    assert_eq!(a.holders("shared-sem").await.unwrap(), 3);
    assert_eq!(b.holders("shared-sem").await.unwrap(), 3);
    // A slot taken on one is renewed and given back on the other.
    assert_eq!(a.acquire("handoff", "h", 1, minute).await.unwrap(), Some(1));
    assert_eq!(b.acquire("handoff", "h", 1, minute).await.unwrap(), Some(1));
    assert_eq!(
        b.acquire("handoff", "other", 1, minute).await.unwrap(),
        None
    );
    b.relinquish("handoff", "h").await.unwrap();
    assert_eq!(
        a.acquire("handoff", "other", 1, minute).await.unwrap(),
        Some(1)
    );
    // Counter limits hold across handles too.
    let adders = (0..40).map(|i| {
        let store = both[i % 2].clone();
        tokio::spawn(async move { store.add("shared-c", 1, Some(25), minute).await.unwrap() })
    });
    let mut ok = 0;
    for adder in adders.collect::<Vec<_>>() {
        ok += usize::from(matches!(adder.await.unwrap(), Added::Ok(_)));
    }
    assert_eq!(ok, 25);
    assert_eq!(a.counter("shared-c").await.unwrap(), 25);
}

/// What a restart must keep: records, counters and queue items (written before `reopen`).
async fn write_before_restart(store: &dyn StateStore) {
    store.put("keep", "rec", b"kept", None).await.unwrap();
    store
        .add("keep-count", 7, None, Duration::from_secs(3600))
        .await
        .unwrap();
    store
        .enqueue("keep-q", "item", b"queued", SystemTime::now())
        .await
        .unwrap();
    let hour = Duration::from_secs(3600);
    assert!(store.take("keep-rl", 1, hour).await.unwrap().allowed);
    assert_eq!(
        store.acquire("keep-sem", "h", 1, hour).await.unwrap(),
        Some(1)
    );
}

async fn check_after_restart(store: &dyn StateStore) {
    assert_eq!(
        store.get("keep", "rec").await.unwrap().unwrap().doc,
        b"kept"
    );
    assert_eq!(store.counter("keep-count").await.unwrap(), 7);
    assert_eq!(store.queue_len("keep-q").await.unwrap(), 1);
    let claimed = store
        .claim("keep-q", SystemTime::now(), TTL, 10)
        .await
        .unwrap();
    assert_eq!(claimed[0].doc, b"queued");
    let hour = Duration::from_secs(3600);
    let refused = store.take("keep-rl", 1, hour).await.unwrap();
    assert!(!refused.allowed, "a restart does not refill a bucket");
    assert!(refused.retry_after + SLACK * 10 > hour, "{refused:?}");
    assert_eq!(
        store.acquire("keep-sem", "other", 1, hour).await.unwrap(),
        None
    );
    assert_eq!(store.holders("keep-sem").await.unwrap(), 1);
}

// ---------------------------------------------------------------------------------------------
// The backends

/// One test per behaviour per backend: `$open` is an async block giving `(guard, store)`, the
/// guard keeping the file's directory or the server alive for the test.
macro_rules! conformance {
    ($backend:ident, $open:expr, [$($behaviour:ident),* $(,)?]) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    let (_guard, store) = $open.await;
                    super::$behaviour(store).await;
                }
            )*
        }
    };
}

macro_rules! every_behaviour {
    ($backend:ident, $open:expr) => {
        conformance!(
            $backend,
            $open,
            [
                put_new_twice,
                replace_is_compare_and_set,
                records_expire,
                delete_is_exactly_once,
                list_is_newest_first_with_a_limit,
                counters_stay_within_their_limit,
                a_negative_delta_floors_at_zero,
                counters_expire_from_their_creation,
                leases_are_exclusive,
                buckets_admit_exactly_their_burst,
                buckets_refill_one_token_per_interval,
                buckets_are_independent,
                zero_burst_or_interval_is_an_error_naming_the_key,
                semaphores_admit_exactly_max,
                a_holder_renews_without_a_second_slot,
                relinquish_frees_a_slot,
                a_dead_holders_slot_expires,
                semaphores_are_independent,
                claims_move_due_items_under_a_lease,
                reschedule_and_ack,
                publish_reaches_subscribers,
            ]
        );
    };
}

async fn sqlite_store() -> (tempfile::TempDir, Arc<dyn StateStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Sqlite::open(dir.path().join("state.db")).await.unwrap();
    (dir, Arc::new(store))
}

every_behaviour!(sqlite, sqlite_store());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_handles_on_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let a = Sqlite::open(&path).await.unwrap();
    let b = Sqlite::open(&path).await.unwrap();
    two_handles_share_one_store(Arc::new(a), Arc::new(b)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_handles_share_limits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let a = Sqlite::open(&path).await.unwrap();
    let b = Sqlite::open(&path).await.unwrap();
    two_handles_share_limits(Arc::new(a), Arc::new(b)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_survives_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let store = latchkey::state::open(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    write_before_restart(store.as_ref()).await;
    drop(store);
    let store = latchkey::state::open(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    check_after_restart(store.as_ref()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_unwritable_path_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let path = file.join("state.db");
    let err = latchkey::state::open(&format!("sqlite:{}", path.display()))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("sqlite:{}", path.display())), "{err}");
    assert!(err.contains("cannot create directory"), "{err}");
    assert!(err.contains("is not a directory"), "{err}");
}

#[tokio::test]
async fn a_state_url_of_no_known_form_is_refused() {
    for url in ["", "sqlite:", "postgres://db/x", "state.db"] {
        let err = latchkey::state::open(url).await.unwrap_err().to_string();
        assert!(err.contains("sqlite:PATH"), "{url:?}: {err}");
    }
}

// ---------------------------------------------------------------------------------------------
// Redis

async fn redis_store() -> (RedisServer, Arc<dyn StateStore>) {
    let server = RedisServer::start();
    let store = Redis::open_with_prefix(&server.url(), "lktest:")
        .await
        .unwrap();
    (server, Arc::new(store))
}

every_behaviour!(redis, redis_store());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_two_handles_on_one_server() {
    let server = RedisServer::start();
    let a = latchkey::state::open(&server.url()).await.unwrap();
    let b = latchkey::state::open(&server.url()).await.unwrap();
    two_handles_share_one_store(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_two_replicas_share_limits() {
    let server = RedisServer::start();
    let a = latchkey::state::open(&server.url()).await.unwrap();
    let b = latchkey::state::open(&server.url()).await.unwrap();
    two_handles_share_limits(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_idle_buckets_and_empty_semaphores_leave_no_key() {
    let server = RedisServer::start();
    let store = Redis::open_with_prefix(&server.url(), "lk:").await.unwrap();
    let interval = Duration::from_millis(100);
    assert!(store.take("idle", 3, interval).await.unwrap().allowed);
    assert!(store.take("idle", 3, interval).await.unwrap().allowed);
    assert_eq!(server.command(&["EXISTS", "lk:tb:idle"]), ":1");
    let pttl: i64 = server.command(&["PTTL", "lk:tb:idle"])[1..]
        .parse()
        .unwrap();
    assert!((1..=200).contains(&pttl), "expires once full: {pttl} ms");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.command(&["EXISTS", "lk:tb:idle"]), ":0");
    let full = store.take("idle", 3, interval).await.unwrap();
    assert_eq!(full.remaining, 2, "a vanished bucket is a full one");

    let hour = Duration::from_secs(3600);
    assert_eq!(store.acquire("sem", "a", 2, hour).await.unwrap(), Some(1));
    assert_eq!(store.acquire("sem", "b", 2, TTL).await.unwrap(), Some(2));
    assert_eq!(server.command(&["ZCARD", "lk:sem:sem"]), ":2");
    let pttl: i64 = server.command(&["PTTL", "lk:sem:sem"])[1..]
        .parse()
        .unwrap();
    assert!(
        pttl > 3_500_000,
        "the key lives as long as its last slot: {pttl} ms"
    );
    store.relinquish("sem", "a").await.unwrap();
    let pttl: i64 = server.command(&["PTTL", "lk:sem:sem"])[1..]
        .parse()
        .unwrap();
    assert!(
        (1..=TTL.as_millis() as i64).contains(&pttl),
        "then as long as the one left: {pttl} ms"
    );
    store.relinquish("sem", "b").await.unwrap();
    assert_eq!(
        server.command(&["EXISTS", "lk:sem:sem"]),
        ":0",
        "no slot held, no key"
    );
    // A semaphore whose holders all died vanishes with them.
    assert_eq!(store.acquire("dead", "a", 2, TTL).await.unwrap(), Some(1));
    past_ttl().await;
    assert_eq!(server.command(&["EXISTS", "lk:sem:dead"]), ":0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_buckets_and_semaphores_fail_closed_when_the_server_is_down() {
    let server = RedisServer::start();
    let store = latchkey::state::open(&server.url()).await.unwrap();
    let minute = Duration::from_secs(60);
    assert!(store.take("rl", 5, minute).await.unwrap().allowed);
    drop(server);
    let err = store.take("rl", 5, minute).await.unwrap_err().to_string();
    assert!(err.contains("state store redis://127.0.0.1:"), "{err}");
    assert!(store.acquire("sem", "h", 1, minute).await.is_err());
    assert!(store.holders("sem").await.is_err());
    assert!(store.relinquish("sem", "h").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_prefixes_keep_stores_apart() {
    let server = RedisServer::start();
    let a = Redis::open_with_prefix(&server.url(), "one:")
        .await
        .unwrap();
    let b = Redis::open_with_prefix(&server.url(), "two:")
        .await
        .unwrap();
    a.put("p", "x", b"a", None).await.unwrap();
    assert!(b.get("p", "x").await.unwrap().is_none());
    let mut rx = b.subscribe();
    a.publish("decided", "not for b").await.unwrap();
    b.publish("decided", "for b").await.unwrap();
    assert_eq!(next_event(&mut rx).await.message, "for b");
    assert_eq!(
        server.command(&["EXISTS", "one:rec:p:x"]),
        ":1",
        "keys live under the prefix"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_reopen_keeps_data() {
    let server = RedisServer::start();
    let store = latchkey::state::open(&server.url()).await.unwrap();
    write_before_restart(store.as_ref()).await;
    drop(store);
    let store = latchkey::state::open(&server.url()).await.unwrap();
    check_after_restart(store.as_ref()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_resubscribes_after_a_dropped_connection() {
    let server = RedisServer::start();
    let store = Redis::open(&server.url()).await.unwrap();
    let mut rx = store.subscribe();
    let killed = server.command(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(killed, ":1", "one subscription connection to kill");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        store.publish("decided", "after").await.unwrap();
        match tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
            Ok(Ok(event)) => {
                assert_eq!(event.message, "after");
                break;
            }
            _ if tokio::time::Instant::now() < deadline => continue,
            other => panic!("no event within 20 s of the subscription being killed: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_password_is_used_and_never_shown() {
    let server = RedisServer::start();
    assert_eq!(
        server.command(&["CONFIG", "SET", "requirepass", "pw-s3cret-42"]),
        "+OK"
    );
    let port = server.port();
    let good = format!("redis://:pw-s3cret-42@127.0.0.1:{port}/0");
    let store = latchkey::state::open(&good).await.unwrap();
    assert_eq!(store.describe(), format!("redis://127.0.0.1:{port}/0"));
    assert!(!format!("{store:?}").contains("pw-s3cret-42"));
    store.put("pw", "x", b"ok", None).await.unwrap();
    let bad = format!("redis://:pw-wrong-99@127.0.0.1:{port}/0");
    let err = latchkey::state::open(&bad).await.unwrap_err().to_string();
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(!err.contains("pw-wrong-99"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unreachable_is_an_error_at_start_naming_host_and_port() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("redis://user:pw-hidden-7@127.0.0.1:{port}/2");
    let started = std::time::Instant::now();
    let err = latchkey::state::open(&url).await.unwrap_err().to_string();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "fails promptly"
    );
    assert!(
        err.contains(&format!("redis://127.0.0.1:{port}/2")),
        "{err}"
    );
    assert!(err.contains("cannot connect"), "{err}");
    assert!(!err.contains("pw-hidden-7"), "{err}");
}

#[tokio::test]
async fn redis_bad_urls_are_refused_without_the_password() {
    for url in [
        "redis://:pw-in-url-5@127.0.0.1:notaport/0",
        "redis://:pw-in-url-5@127.0.0.1:6379/notadb",
    ] {
        let err = latchkey::state::open(url).await.unwrap_err().to_string();
        assert!(err.contains("state store URL"), "{url}: {err}");
        assert!(!err.contains("pw-in-url-5"), "{url}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fails_calls_closed() {
    let server = RedisServer::start();
    let store = latchkey::state::open(&server.url()).await.unwrap();
    store.put("d", "x", b"1", None).await.unwrap();
    drop(server);
    let started = std::time::Instant::now();
    let err = store.get("d", "x").await.unwrap_err().to_string();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "fails, does not hang"
    );
    assert!(err.contains("state store redis://127.0.0.1:"), "{err}");
    assert!(store.delete("d", "x").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_index_of_expired_records_is_pruned_on_write() {
    let server = RedisServer::start();
    let store = Redis::open_with_prefix(&server.url(), "px:").await.unwrap();
    for id in ["a", "b", "c", "d", "e"] {
        store.put("g", id, b"grant", Some(TTL)).await.unwrap();
    }
    assert_eq!(server.command(&["ZCARD", "px:idx:g"]), ":5");
    past_ttl().await;
    store.put("g", "kept", b"grant", None).await.unwrap();
    assert_eq!(
        server.command(&["ZCARD", "px:idx:g"]),
        ":1",
        "nobody listed, still pruned"
    );
    assert_eq!(server.command(&["ZCARD", "px:exp:g"]), ":0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_recovers_after_the_server_restarts() {
    let mut server = RedisServer::start();
    let store = latchkey::state::open(&server.url()).await.unwrap();
    let mut rx = store.subscribe();
    store.put("r", "before", b"1", None).await.unwrap();
    server.restart();
    // Calls fail (closed) or succeed, never hang, until the connection is back.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let call =
            tokio::time::timeout(Duration::from_secs(10), store.put("r", "after", b"2", None));
        match call.await.expect("a call returns within 10 s") {
            Ok(()) => break,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("no reconnection within 30 s: {e}"),
        }
    }
    assert_eq!(store.get("r", "after").await.unwrap().unwrap().doc, b"2");
    // The subscription is back too.
    loop {
        store.publish("decided", "again").await.unwrap();
        match tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
            Ok(Ok(event)) if event.message == "again" => break,
            _ if tokio::time::Instant::now() < deadline => continue,
            other => panic!("no event within 30 s of the restart: {other:?}"),
        }
    }
}

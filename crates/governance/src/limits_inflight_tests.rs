//! Budgets held by reservations in flight (`budget_reserved`, waiting in `queue`) and the
//! request head charged to `bytes_up`, on the embedded limiter.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use super::limits::*;
use super::usage::{Provider, Usage};
use crate::policy::limits::{
    Concurrency, Limit, OnStoreError, Per, Period, PriceTable, Quota, DEFAULT_RESERVE_TOKENS,
};
use crate::policy::Origin;
use crate::reason::Reason;
use crate::state::StateStore;

fn tokens(amount: u64, queue: Option<Duration>) -> Limit {
    Limit {
        name: "tokens".to_string(),
        per: Per::Identity,
        requests: None,
        concurrency: queue.map(|queue| Concurrency { max: 100, queue }),
        bytes_up: None,
        llm_tokens: Some(Quota {
            amount,
            period: Period::Day,
        }),
        spend: None,
        on_store_error: OnStoreError::Deny,
        reserve_tokens: DEFAULT_RESERVE_TOKENS,
        include_usage: false,
        origin: Origin {
            file: PathBuf::from("test.toml"),
            line: 1,
        },
    }
}

fn who(id: &str) -> Subject<'_> {
    Subject {
        session: None,
        identity: "a",
        rule: "r",
        credential: None,
        host: "api.test",
        request_id: id,
    }
}

fn call(tokens: u64) -> Estimate {
    Estimate {
        head_up: 0,
        bytes_up: Some(0),
        llm: Some(LlmEstimate {
            provider: Provider::OpenAiChat,
            model: Some("gpt-4o".into()),
            tokens,
            cost_micros: None,
        }),
    }
}

fn used(tokens: u64) -> Usage {
    Usage {
        model: Some("gpt-4o".into()),
        input_tokens: tokens,
        output_tokens: 0,
        cached_input_tokens: 0,
    }
}

async fn limiter(dir: &tempfile::TempDir) -> Arc<Limiter> {
    let store: Arc<dyn StateStore> = Arc::new(
        crate::state::Sqlite::open(dir.path().join("state.db"))
            .await
            .unwrap(),
    );
    Limiter::new(store)
}

#[tokio::test]
async fn calls_refused_for_reservations_in_flight_say_so_not_exhausted() {
    let dir = tempfile::tempdir().unwrap();
    let limiter = limiter(&dir).await;
    let l = tokens(300, None);
    let ids: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    let estimate = call(155);
    let limits = [&l];
    let results = join_all(
        ids.iter()
            .map(|id| limiter.admit(&limits, who(id), &estimate)),
    )
    .await;
    let (admitted, refused): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
    assert_eq!(admitted.len(), 1);
    assert_eq!(refused.len(), 19);
    for r in &refused {
        let r = r.as_ref().unwrap_err();
        assert_eq!(
            r.refusal.reason,
            Reason::BudgetReserved,
            "{}",
            r.refusal.message
        );
        assert_eq!(r.retry_after, Some(1));
        assert_eq!(r.refusal.reason.status().as_u16(), 429);
    }
    // Settled at what it used, the room comes back; spend that leaves no room is exhausted.
    let first = admitted.into_iter().next().unwrap().unwrap();
    first.settle(0, Some(200), Some(&used(200)), &PriceTable::empty());
    let r = limiter
        .admit(&[&l], who("x"), &call(155))
        .await
        .unwrap_err();
    assert_eq!(
        r.refusal.reason,
        Reason::BudgetExhausted,
        "{}",
        r.refusal.message
    );
    assert!(limiter.admit(&[&l], who("y"), &call(100)).await.is_ok());
}

#[tokio::test]
async fn with_a_queue_calls_wait_for_settles_and_are_served_as_room_comes_free() {
    let dir = tempfile::tempdir().unwrap();
    let limiter = limiter(&dir).await;
    let l = tokens(300, Some(Duration::from_secs(10)));
    let ids: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    let outcomes = join_all(ids.iter().map(|id| {
        let limiter = limiter.clone();
        let l = &l;
        async move {
            match limiter.admit(&[l], who(id), &call(155)).await {
                Ok(a) => {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    a.settle(0, Some(200), Some(&used(20)), &PriceTable::empty());
                    Ok(())
                }
                Err(r) => Err(r.refusal.reason),
            }
        }
    }))
    .await;
    // One at a time (two reservations never fit), each spending 20: 20 * 7 + 155 <= 300 is
    // the last that fits, so 8 are served; the rest are refused for spend, not reservations.
    let served = outcomes.iter().filter(|o| o.is_ok()).count();
    assert_eq!(served, 8, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Ok(()) | Err(Reason::BudgetExhausted))),
        "{outcomes:?}"
    );
}

#[tokio::test]
async fn a_queue_wait_is_bounded_by_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let limiter = limiter(&dir).await;
    let l = tokens(300, Some(Duration::from_millis(300)));
    let _held = limiter.admit(&[&l], who("1"), &call(155)).await.unwrap();
    let start = std::time::Instant::now();
    let r = limiter
        .admit(&[&l], who("2"), &call(155))
        .await
        .unwrap_err();
    let waited = start.elapsed();
    assert_eq!(r.refusal.reason, Reason::BudgetReserved);
    assert!(
        r.refusal.message.contains("queue time ran out"),
        "{}",
        r.refusal.message
    );
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
}

#[tokio::test]
async fn the_request_head_is_charged_so_a_body_less_request_needs_room() {
    let dir = tempfile::tempdir().unwrap();
    let limiter = limiter(&dir).await;
    let mut l = tokens(1, None);
    l.llm_tokens = None;
    l.bytes_up = Some(Quota {
        amount: 100,
        period: Period::Day,
    });
    let get = Estimate {
        head_up: 60,
        bytes_up: Some(0),
        llm: None,
    };
    let a = limiter.admit(&[&l], who("1"), &get).await.unwrap();
    let (charges, _) = a.settle(0, Some(200), None, &PriceTable::empty());
    assert_eq!(charges[0].charged, 60);
    let r = limiter.admit(&[&l], who("2"), &get).await.unwrap_err();
    assert_eq!(r.refusal.reason, Reason::BudgetExhausted);
    // A WebSocket handshake (its messages stream) needs room for its head, then each message
    // is reserved before it goes: 30 head bytes fit in the 40 left, 20 more do not.
    let ws = Estimate {
        head_up: 30,
        bytes_up: None,
        llm: None,
    };
    let a = limiter.admit(&[&l], who("3"), &ws).await.unwrap();
    let upload = a.upload().unwrap();
    assert!(upload.send(10).await.is_ok());
    let cut = upload.send(20).await.unwrap_err();
    assert_eq!(cut.reason, Reason::BudgetExhausted);
    let (charges, _) = a.settle(0, Some(101), None, &PriceTable::empty());
    assert_eq!(charges[0].charged, 40);
    assert!(charges[0].refused);
    // Exhausted: even a handshake (head only) is refused now.
    let r = limiter.admit(&[&l], who("4"), &ws).await.unwrap_err();
    assert_eq!(r.refusal.reason, Reason::BudgetExhausted);
}

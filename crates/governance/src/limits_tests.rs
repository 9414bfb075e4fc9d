//! The limits engine on a real SQLite store (embedded mode) and on a store that cannot answer.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::limits::*;
use super::usage::{Provider, Usage};
use crate::policy::limits::{
    Concurrency, Limit, OnStoreError, Per, Period, PriceTable, Quota, Rate, DEFAULT_RESERVE_TOKENS,
};
use crate::policy::Origin;
use crate::reason::Reason;
use crate::state::{Added, Claimed, Event, Fut, StateError, StateStore, Versioned};

fn limit(name: &str) -> Limit {
    Limit {
        name: name.to_string(),
        per: Per::Identity,
        requests: None,
        concurrency: None,
        bytes_up: None,
        llm_tokens: None,
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

fn who<'a>(identity: &'a str, id: &'a str) -> Subject<'a> {
    Subject {
        session: None,
        identity,
        rule: "r",
        credential: None,
        host: "api.test",
        request_id: id,
    }
}

async fn sqlite(dir: &tempfile::TempDir) -> Arc<dyn StateStore> {
    Arc::new(
        crate::state::Sqlite::open(dir.path().join("state.db"))
            .await
            .unwrap(),
    )
}

fn llm(tokens: u64, cost: Option<u64>) -> Estimate {
    Estimate {
        head_up: 0,
        bytes_up: Some(10),
        llm: Some(LlmEstimate {
            provider: Provider::OpenAiChat,
            model: Some("gpt-4o".into()),
            tokens,
            cost_micros: cost,
        }),
    }
}

fn prices() -> PriceTable {
    PriceTable::parse(
        "source = \"t\"\ndate = \"2026-12-02\"\n[models.gpt-4o]\ninput = 2.5\noutput = 10\n",
    )
    .unwrap()
}

#[tokio::test]
async fn a_token_bucket_admits_exactly_its_burst() {
    let dir = tempfile::tempdir().unwrap();
    let limiter = Limiter::new(sqlite(&dir).await);
    let mut l = limit("rate");
    l.requests = Some(Rate {
        count: 5,
        period: Period::Minute,
    });
    let mut admitted = 0;
    let mut last = None;
    for i in 0..8 {
        let id = format!("r{i}");
        match limiter
            .admit(&[&l], who("a", &id), &Estimate::default())
            .await
        {
            Ok(a) => {
                admitted += 1;
                let rate = a.rate().unwrap();
                assert_eq!(rate.limit, 5);
                assert_eq!(rate.remaining, 5 - admitted);
            }
            Err(r) => {
                assert_eq!(r.refusal.reason, Reason::RateLimited);
                assert!(r.retry_after.unwrap() >= 1, "{r:?}");
                assert!(
                    r.refusal.message.contains("identity:a"),
                    "{}",
                    r.refusal.message
                );
                assert!(r.charges[0].refused);
                last = Some(r);
            }
        }
    }
    assert_eq!(admitted, 5);
    let last = last.unwrap();
    assert_eq!(last.rate.unwrap().remaining, 0);
    // Another identity has its own bucket.
    assert!(limiter
        .admit(&[&l], who("b", "x"), &Estimate::default())
        .await
        .is_ok());
}

#[tokio::test]
async fn a_budget_reserves_then_settles_to_the_usage() {
    let dir = tempfile::tempdir().unwrap();
    let limiter = Limiter::new(sqlite(&dir).await);
    let mut l = limit("tokens");
    l.llm_tokens = Some(Quota {
        amount: 1000,
        period: Period::Day,
    });
    let first = limiter
        .admit(&[&l], who("a", "1"), &llm(600, None))
        .await
        .unwrap();
    assert_eq!(first.charges()[0].used, 600);
    // A second reservation does not fit beside the first: refused before it is sent, and
    // told that the first's reservation (not spend) holds the room.
    let refused = limiter
        .admit(&[&l], who("a", "2"), &llm(600, None))
        .await
        .unwrap_err();
    assert_eq!(refused.refusal.reason, Reason::BudgetReserved);
    let msg = &refused.refusal.message;
    assert!(msg.contains("600 of 1000 tokens"), "{msg}");
    assert!(
        msg.contains("600 of it reserved by requests still in flight"),
        "{msg}"
    );
    assert_eq!(refused.retry_after, Some(1));
    // One that could not fit even with nothing in flight is exhausted, until the window ends.
    let refused = limiter
        .admit(&[&l], who("a", "2"), &llm(1001, None))
        .await
        .unwrap_err();
    assert_eq!(refused.refusal.reason, Reason::BudgetExhausted);
    assert!(
        refused.refusal.message.contains("resets at"),
        "{}",
        refused.refusal.message
    );
    assert!(refused.retry_after.unwrap() <= 86_400);
    // The first call used 100 tokens: the rest of its reservation comes back.
    let usage = Usage {
        model: Some("gpt-4o-2024-08-06".into()),
        input_tokens: 60,
        output_tokens: 40,
        cached_input_tokens: 0,
    };
    let (charges, info) = first.settle(10, Some(200), Some(&usage), &prices());
    assert_eq!(charges[0].charged, 100);
    assert_eq!(charges[0].used, 100);
    let info = info.unwrap();
    assert_eq!((info.input_tokens, info.output_tokens), (60, 40));
    assert_eq!(info.source, "response");
    // 60 * 2.5 + 40 * 10 micro-USD.
    assert_eq!(info.cost, Some(550.0 / 1e6));
    assert!(limiter
        .admit(&[&l], who("a", "3"), &llm(600, None))
        .await
        .is_ok());
}

#[tokio::test]
async fn a_failed_request_gives_its_reservation_back() {
    let dir = tempfile::tempdir().unwrap();
    let limiter = Limiter::new(sqlite(&dir).await);
    let mut l = limit("tokens");
    l.llm_tokens = Some(Quota {
        amount: 1000,
        period: Period::Day,
    });
    let a = limiter
        .admit(&[&l], who("a", "1"), &llm(900, None))
        .await
        .unwrap();
    drop(a);
    let b = limiter
        .admit(&[&l], who("a", "2"), &llm(900, None))
        .await
        .unwrap();
    // An error response reports no usage: nothing is charged.
    let (charges, info) = b.settle(0, Some(500), None, &prices());
    assert_eq!(charges[0].charged, 0);
    assert!(info.is_none());
    // A success without usage is charged its reservation.
    let c = limiter
        .admit(&[&l], who("a", "3"), &llm(900, None))
        .await
        .unwrap();
    let (charges, info) = c.settle(0, Some(200), None, &prices());
    assert_eq!(charges[0].charged, 900);
    assert_eq!(info.unwrap().source, "reserved");
    assert!(limiter
        .admit(&[&l], who("a", "4"), &llm(200, None))
        .await
        .is_err());
}

#[tokio::test]
async fn a_refusal_by_one_budget_takes_nothing_from_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let limiter = Limiter::new(sqlite(&dir).await);
    let mut big = limit("big");
    big.llm_tokens = Some(Quota {
        amount: 10_000,
        period: Period::Day,
    });
    let mut small = limit("small");
    small.llm_tokens = Some(Quota {
        amount: 100,
        period: Period::Day,
    });
    for i in 0..5 {
        let id = i.to_string();
        assert!(limiter
            .admit(&[&big, &small], who("a", &id), &llm(500, None))
            .await
            .is_err());
    }
    let only_big = limiter
        .admit(&[&big], who("a", "x"), &llm(10_000, None))
        .await;
    assert!(
        only_big.is_ok(),
        "the refused calls left reservations behind"
    );
}

#[tokio::test]
async fn spend_needs_a_price() {
    let dir = tempfile::tempdir().unwrap();
    let limiter = Limiter::new(sqlite(&dir).await);
    let mut l = limit("spend");
    l.spend = Some(Quota {
        amount: 1_000_000,
        period: Period::Month,
    });
    let r = limiter
        .admit(&[&l], who("a", "1"), &llm(10, None))
        .await
        .unwrap_err();
    assert_eq!(r.refusal.reason, Reason::BudgetExhausted);
    assert!(
        r.refusal.message.contains("no price"),
        "{}",
        r.refusal.message
    );
    let ok = limiter
        .admit(&[&l], who("a", "2"), &llm(10, Some(999_000)))
        .await
        .unwrap();
    assert_eq!(ok.charges()[0].used, 999_000);
    let r = limiter
        .admit(&[&l], who("a", "3"), &llm(10, Some(2_000)))
        .await
        .unwrap_err();
    assert!(
        r.refusal.message.contains("0.999 of 1 USD"),
        "{}",
        r.refusal.message
    );
}

#[tokio::test]
async fn concurrency_caps_requests_in_flight_and_queues() {
    let dir = tempfile::tempdir().unwrap();
    let limiter = Limiter::new(sqlite(&dir).await);
    let mut l = limit("conc");
    l.concurrency = Some(Concurrency {
        max: 2,
        queue: Duration::ZERO,
    });
    let a = limiter
        .admit(&[&l], who("a", "1"), &Estimate::default())
        .await
        .unwrap();
    let _b = limiter
        .admit(&[&l], who("a", "2"), &Estimate::default())
        .await
        .unwrap();
    let r = limiter
        .admit(&[&l], who("a", "3"), &Estimate::default())
        .await
        .unwrap_err();
    assert_eq!(r.refusal.reason, Reason::RateLimited);
    drop(a);
    let c = limiter
        .admit(&[&l], who("a", "4"), &Estimate::default())
        .await;
    assert!(c.is_ok());
    // With a queue, a request waits for a slot that comes free in time.
    l.concurrency = Some(Concurrency {
        max: 1,
        queue: Duration::from_secs(5),
    });
    let held = limiter
        .admit(&[&l], who("q", "1"), &Estimate::default())
        .await
        .unwrap();
    let l2 = l.clone();
    let lim = limiter.clone();
    let waiter = tokio::spawn(async move {
        lim.admit(&[&l2], who("q", "2"), &Estimate::default())
            .await
            .is_ok()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(held);
    assert!(waiter.await.unwrap());
}

#[tokio::test]
async fn embedded_counters_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = limit("tokens");
    l.llm_tokens = Some(Quota {
        amount: 1000,
        period: Period::Day,
    });
    {
        let limiter = Limiter::new(sqlite(&dir).await);
        let a = limiter
            .admit(&[&l], who("a", "1"), &llm(700, None))
            .await
            .unwrap();
        let _ = a.settle(0, Some(200), None, &prices());
        limiter.shutdown().await;
    }
    let limiter = Limiter::new(sqlite(&dir).await);
    let r = limiter.admit(&[&l], who("a", "2"), &llm(400, None)).await;
    assert!(
        r.is_err(),
        "the restart forgot 700 tokens of the day's budget"
    );
    assert!(limiter
        .admit(&[&l], who("a", "3"), &llm(300, None))
        .await
        .is_ok());
}

#[tokio::test]
async fn a_streamed_upload_is_cut_at_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let limiter = Limiter::new(sqlite(&dir).await);
    let mut l = limit("exfil");
    l.bytes_up = Some(Quota {
        amount: 600_000,
        period: Period::Day,
    });
    let streamed = Estimate {
        head_up: 0,
        bytes_up: None,
        llm: None,
    };
    let a = limiter
        .admit(&[&l], who("a", "1"), &streamed)
        .await
        .unwrap();
    let upload = a.upload().unwrap();
    let mut sent = 0u64;
    let mut cut = None;
    for _ in 0..20 {
        let chunk = 100_000;
        let fits = upload.fits(chunk);
        let r = if fits {
            upload.sent(chunk);
            Ok(())
        } else {
            upload.send(chunk).await
        };
        match r {
            Ok(()) => sent += chunk,
            Err(e) => {
                cut = Some(e);
                break;
            }
        }
    }
    assert_eq!(sent, 600_000);
    assert_eq!(cut.unwrap().reason, Reason::BudgetExhausted);
    let (charges, _) = a.settle(sent, Some(200), None, &prices());
    assert_eq!(charges[0].charged, 600_000);
    assert_eq!(charges[0].key, "identity:a@api.test");
    // The budget is spent: the next upload gets nothing.
    let r = limiter
        .admit(&[&l], who("a", "2"), &streamed)
        .await
        .unwrap_err();
    assert_eq!(r.refusal.reason, Reason::BudgetExhausted);
    // A declared length is reserved whole; another host has its own budget.
    let other = Subject {
        host: "other.test",
        ..who("a", "3")
    };
    let declared = Estimate {
        head_up: 0,
        bytes_up: Some(600_001),
        llm: None,
    };
    assert!(limiter.admit(&[&l], other, &declared).await.is_err());
}

#[tokio::test]
async fn per_global_and_per_rule_share_one_counter() {
    let dir = tempfile::tempdir().unwrap();
    let limiter = Limiter::new(sqlite(&dir).await);
    let mut l = limit("g");
    l.per = Per::Global;
    l.requests = Some(Rate {
        count: 1,
        period: Period::Hour,
    });
    assert!(limiter
        .admit(&[&l], who("a", "1"), &Estimate::default())
        .await
        .is_ok());
    let r = limiter
        .admit(&[&l], who("b", "2"), &Estimate::default())
        .await
        .unwrap_err();
    assert_eq!(r.charges[0].key, "global");
    let counters = limiter.counters();
    assert_eq!(counters.len(), 1);
    assert_eq!(counters[0].measure, "requests");
}

/// A store that cannot answer anything.
#[derive(Debug)]
struct Down;

fn down<T: Send + 'static>() -> Fut<'static, T> {
    Box::pin(async {
        Err(StateError::Backend {
            store: "down:".into(),
            message: "connection refused".into(),
        })
    })
}

impl StateStore for Down {
    fn describe(&self) -> &str {
        "down:"
    }
    fn put_new<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: &'a [u8],
        _: Option<Duration>,
    ) -> Fut<'a, bool> {
        down()
    }
    fn put<'a>(&'a self, _: &'a str, _: &'a str, _: &'a [u8], _: Option<Duration>) -> Fut<'a, ()> {
        down()
    }
    fn get<'a>(&'a self, _: &'a str, _: &'a str) -> Fut<'a, Option<Versioned>> {
        down()
    }
    fn replace<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: u64,
        _: &'a [u8],
        _: Option<Duration>,
    ) -> Fut<'a, bool> {
        down()
    }
    fn delete<'a>(&'a self, _: &'a str, _: &'a str) -> Fut<'a, bool> {
        down()
    }
    fn list<'a>(&'a self, _: &'a str, _: usize) -> Fut<'a, Vec<(String, Versioned)>> {
        down()
    }
    fn add<'a>(&'a self, _: &'a str, _: i64, _: Option<i64>, _: Duration) -> Fut<'a, Added> {
        down()
    }
    fn counter<'a>(&'a self, _: &'a str) -> Fut<'a, i64> {
        down()
    }
    fn take<'a>(&'a self, _: &'a str, _: u64, _: Duration) -> Fut<'a, crate::state::Taken> {
        down()
    }
    fn acquire<'a>(&'a self, _: &'a str, _: &'a str, _: u64, _: Duration) -> Fut<'a, Option<u64>> {
        down()
    }
    fn relinquish<'a>(&'a self, _: &'a str, _: &'a str) -> Fut<'a, ()> {
        down()
    }
    fn holders<'a>(&'a self, _: &'a str) -> Fut<'a, u64> {
        down()
    }
    fn lease<'a>(&'a self, _: &'a str, _: &'a str, _: Duration) -> Fut<'a, bool> {
        down()
    }
    fn release<'a>(&'a self, _: &'a str, _: &'a str) -> Fut<'a, ()> {
        down()
    }
    fn enqueue<'a>(&'a self, _: &'a str, _: &'a str, _: &'a [u8], _: SystemTime) -> Fut<'a, ()> {
        down()
    }
    fn claim<'a>(
        &'a self,
        _: &'a str,
        _: SystemTime,
        _: Duration,
        _: usize,
    ) -> Fut<'a, Vec<Claimed>> {
        down()
    }
    fn reschedule<'a>(&'a self, _: &'a str, _: &'a str, _: SystemTime) -> Fut<'a, ()> {
        down()
    }
    fn ack<'a>(&'a self, _: &'a str, _: &'a str) -> Fut<'a, ()> {
        down()
    }
    fn queue_len<'a>(&'a self, _: &'a str) -> Fut<'a, u64> {
        down()
    }
    fn publish<'a>(&'a self, _: &'a str, _: &'a str) -> Fut<'a, ()> {
        down()
    }
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        tokio::sync::broadcast::channel(1).1
    }
}

#[tokio::test]
async fn a_store_that_cannot_answer_fails_closed_unless_the_limit_allows() {
    let limiter = Limiter::new(Arc::new(Down));
    let mut l = limit("rate");
    l.requests = Some(Rate {
        count: 10,
        period: Period::Minute,
    });
    l.llm_tokens = Some(Quota {
        amount: 10,
        period: Period::Day,
    });
    let r = limiter
        .admit(&[&l], who("a", "1"), &llm(5, None))
        .await
        .unwrap_err();
    assert_eq!(r.refusal.reason, Reason::LimitsUnavailable);
    assert!(
        r.refusal.message.contains("connection refused"),
        "{}",
        r.refusal.message
    );
    l.on_store_error = OnStoreError::Allow;
    let a = limiter
        .admit(&[&l], who("a", "2"), &llm(5, None))
        .await
        .unwrap();
    assert!(a.charges().iter().all(|c| c.unchecked), "{:?}", a.charges());
    assert_eq!(a.charges().len(), 2);
}

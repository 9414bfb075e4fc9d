//! The notification outbox: telling `[notify.NAME]` webhooks that an approval waits or was
//! decided. [`enqueue`] puts one item per notifier in the state store's `notify` queue; the
//! [`Worker`] claims due items, POSTs them through the guarded upstream client and acks on 2xx,
//! rescheduling everything else with exponential backoff (1 s doubling, capped at 5 min) for up
//! to 24 h. Because the outbox is the store, a crash before the ack redelivers: at least once,
//! with a delivery id (`x-latchkey-delivery`) that stays the same across retries so receivers
//! can dedupe.
//!
//! Everything a delivery says comes from the approval record, which is stored scrubbed; the
//! body is scrubbed once more with the policy's secrets before it is signed and sent.
//!
//! Depends on `policy` (notifiers), `secrets` (signing secrets, the scrubber), `state`,
//! `upstream` (the client) and `governance::record`; never on `proxy` or `admin`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_lc_rs::hmac;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::links::{unix, Signer};
use super::record::{Approval, Links, Notice, QUEUE_NOTIFY};
use crate::policy::ask::notify_secret_key;
use crate::policy::{Notifier, NotifyFormat, Policy};
use crate::secrets::scrub::Scrubber;
use crate::secrets::{SecretStore, SecretValue};
use crate::state::{Claimed, StateError, StateStore};
use crate::upstream::{find_upstream_error, Client};

/// The event of a new approval request.
pub const EVENT_REQUESTED: &str = "approval.requested";
/// The event of an approval someone approved or denied.
pub const EVENT_DECIDED: &str = "approval.decided";
/// Channel [`enqueue`] publishes on, so workers on every replica wake for a new item.
pub const CHANNEL_NOTIFY: &str = "notify.enqueued";
/// Namespace of "already enqueued" markers, so a repeated enqueue does not deliver twice.
const NS_ENQUEUED: &str = "notify.enqueued";

/// One delivery's whole exchange (connect, send, response head and body).
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// At most this much of a receiver's response body is read (then dropped).
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// A claimed item is invisible to other workers this long (longer than a delivery takes).
pub const CLAIM_LEASE: Duration = Duration::from_secs(60);
/// At most this many deliveries run at once per worker.
pub const MAX_IN_FLIGHT: usize = 16;
/// A notification not delivered this long after it was first enqueued is given up.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(24 * 3600);
/// The first retry waits this long; each next one twice as long...
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// ...up to this.
pub const BACKOFF_CAP: Duration = Duration::from_secs(5 * 60);
/// The worker looks at the queue at least this often (items come due without an event).
const POLL: Duration = Duration::from_secs(1);

/// An outbox item as stored: the notice and when it was first enqueued (for the 24 h limit).
/// A bare [`Notice`] reads too; its age then counts from the approval's creation.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Outbound {
    #[serde(flatten)]
    notice: Notice,
    #[serde(default, with = "optional_time")]
    first_enqueued: Option<SystemTime>,
}

impl Outbound {
    fn first_enqueued(&self) -> SystemTime {
        self.first_enqueued.unwrap_or(self.notice.approval.created)
    }
}

/// `Option<SystemTime>` as an RFC 3339 string or absent.
mod optional_time {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.collect_str(&humantime::format_rfc3339_millis(*t)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SystemTime>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => humantime::parse_rfc3339(&text)
                .map(Some)
                .map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}

/// Why one delivery attempt failed (it is retried). Messages name the notifier and the
/// secret's name, never a value.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error("notifier {notifier}: signing secret unavailable: {why}")]
    Secret { notifier: String, why: String },
    #[error("notifier {notifier}: cannot scrub the notification: {why}")]
    Scrub { notifier: String, why: String },
    #[error("notifier {notifier}: cannot build the request: {why}")]
    Build { notifier: String, why: String },
    #[error("notifier {notifier}: {why}")]
    Unreachable { notifier: String, why: String },
    #[error("notifier {notifier}: no answer within {}s", DELIVERY_TIMEOUT.as_secs())]
    Timeout { notifier: String },
    #[error("notifier {notifier}: answered {status}")]
    Status { notifier: String, status: u16 },
}

/// The delivery id of `event` for `approval_id` to `notifier`: stable, so a retry (and a
/// repeated enqueue) carries the same `x-latchkey-delivery`.
pub fn delivery_id(approval_id: &str, event: &str, notifier: &str) -> String {
    format!("{approval_id}-{event}-{notifier}")
}

/// How long to wait before retrying an item that failed after `attempts` earlier claims:
/// 1 s, 2 s, 4 s, … capped at 5 min.
pub fn backoff(attempts: u32) -> Duration {
    let factor = 1u64.checked_shl(attempts.min(63)).unwrap_or(u64::MAX);
    BACKOFF_FIRST
        .checked_mul(u32::try_from(factor).unwrap_or(u32::MAX))
        .map_or(BACKOFF_CAP, |d| d.min(BACKOFF_CAP))
}

/// Enqueues `event` about `approval` for each notifier named in `notifiers` (empty: every
/// `[notify.*]` of `policy`), due now; the number enqueued. A name the policy does not have is
/// skipped (logged); an item enqueued before (same approval, event, notifier) is not again.
pub async fn enqueue(
    store: &dyn StateStore,
    policy: &Policy,
    notifiers: &[String],
    event: &str,
    approval: &Approval,
    buttons: Buttons<'_>,
) -> Result<usize, StateError> {
    enqueue_to(
        store,
        policy.notifiers(),
        notifiers,
        event,
        approval,
        buttons,
        SystemTime::now(),
    )
    .await
}

/// What an `approval.requested` notice's buttons answer with: signed links for a notifier
/// whose buttons are links, button values signed with `signer` for one whose buttons are
/// interactive (`signing_secret`). Empty (the default) for a decision: no buttons.
#[derive(Debug, Clone, Default)]
pub struct Buttons<'a> {
    pub links: Option<Links>,
    pub signer: Option<&'a Signer>,
}

/// [`enqueue`] over an explicit list of configured notifiers, at `now`.
pub async fn enqueue_to(
    store: &dyn StateStore,
    configured: &[Notifier],
    names: &[String],
    event: &str,
    approval: &Approval,
    buttons: Buttons<'_>,
    now: SystemTime,
) -> Result<usize, StateError> {
    let targets: Vec<&Notifier> = if names.is_empty() {
        configured.iter().collect()
    } else {
        names
            .iter()
            .filter_map(|name| {
                let found = configured.iter().find(|n| &n.name == name);
                if found.is_none() {
                    tracing::warn!(notifier = %name, approval = %approval.id,
                        "no [notify.{name}] in the policy in force: not notified");
                }
                found
            })
            .collect()
    };
    let mut enqueued = 0;
    for notifier in targets {
        let id = delivery_id(&approval.id, event, &notifier.name);
        // Marker after the item: a crash between the two can deliver twice (same delivery id,
        // receivers dedupe), never zero times.
        if store.get(NS_ENQUEUED, &id).await?.is_some() {
            continue;
        }
        // An interactive notifier's buttons answer in place, never as links (which anyone
        // holding the message could open, past its `approvers`).
        let (links, actions) = if notifier.interactive {
            let actions = buttons
                .signer
                .map(|s| super::slack::actions_for(&notifier.name, approval, s));
            (None, actions)
        } else {
            (buttons.links.clone(), None)
        };
        let item = Outbound {
            notice: Notice {
                notifier: notifier.name.clone(),
                event: event.to_string(),
                approval: approval.public(),
                links,
                actions,
            },
            first_enqueued: Some(now),
        };
        let doc = serde_json::to_vec(&item).map_err(|e| StateError::Backend {
            store: store.describe().to_string(),
            message: format!("cannot encode notification {id}: {e}"),
        })?;
        store.enqueue(QUEUE_NOTIFY, &id, &doc, now).await?;
        store
            .put(NS_ENQUEUED, &id, b"1", Some(GIVE_UP_AFTER + CLAIM_LEASE))
            .await?;
        enqueued += 1;
    }
    if enqueued > 0 {
        // A wake-up only: a lost event delays delivery by one poll.
        if let Err(e) = store.publish(CHANNEL_NOTIFY, &approval.id).await {
            tracing::debug!("cannot publish the notify wake-up: {e}");
        }
    }
    Ok(enqueued)
}

/// What the worker has done since it started: for logs, `/status` and metrics.
#[derive(Debug, Default)]
pub struct Stats {
    pub delivered: AtomicU64,
    pub retried: AtomicU64,
    pub given_up: AtomicU64,
    /// Items dropped because their notifier is no longer in the policy.
    pub dropped: AtomicU64,
}

/// The policy in force and its secrets (one generation's), read afresh for every item (a
/// reload may add or remove notifiers, or change their signing secrets).
pub type PolicySource = Arc<dyn Fn() -> (Arc<Policy>, Arc<SecretStore>) + Send + Sync>;

/// Delivers the outbox. One per process; several replicas on one store share the queue.
pub struct Worker {
    store: Arc<dyn StateStore>,
    policy: PolicySource,
    client: Client,
    stats: Arc<Stats>,
}

impl Worker {
    pub fn new(store: Arc<dyn StateStore>, policy: PolicySource, client: Client) -> Worker {
        Worker {
            store,
            policy,
            client,
            stats: Arc::default(),
        }
    }

    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// Claims and delivers due items until `shutdown` turns true. Deliveries still running
    /// then are abandoned: their items come due again after the claim lease.
    pub async fn run(self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut events = self.store.subscribe();
        let mut running = tokio::task::JoinSet::new();
        let mut store_failing = false;
        while !*shutdown.borrow() {
            let room = MAX_IN_FLIGHT.saturating_sub(running.len());
            if room > 0 {
                match self
                    .store
                    .claim(QUEUE_NOTIFY, SystemTime::now(), CLAIM_LEASE, room)
                    .await
                {
                    Ok(items) => {
                        if store_failing {
                            tracing::info!("notification outbox readable again");
                            store_failing = false;
                        }
                        let policy = (self.policy)();
                        for item in items {
                            running.spawn(process(
                                Arc::clone(&self.store),
                                policy.clone(),
                                self.client.clone(),
                                Arc::clone(&self.stats),
                                item,
                            ));
                        }
                    }
                    Err(e) if !store_failing => {
                        tracing::warn!("cannot claim notifications (retrying every second): {e}");
                        store_failing = true;
                    }
                    Err(_) => {}
                }
            }
            tokio::select! {
                _ = shutdown.changed() => {}
                Some(_) = running.join_next(), if !running.is_empty() => {}
                _ = wake(&mut events) => {}
                _ = tokio::time::sleep(POLL) => {}
            }
        }
    }
}

/// Resolves when an item is enqueued on any replica (or the event stream lags: look anyway).
async fn wake(events: &mut tokio::sync::broadcast::Receiver<crate::state::Event>) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match events.recv().await {
            Ok(e) if e.channel == CHANNEL_NOTIFY => return,
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => return,
            Err(RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// `Worker::new(..).run(shutdown)`.
pub async fn run(
    store: Arc<dyn StateStore>,
    policy: PolicySource,
    client: Client,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    Worker::new(store, policy, client).run(shutdown).await;
}

/// What became of one claimed item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    /// Failed; due again at this time.
    Retry(SystemTime),
    /// Acked undelivered: past [`GIVE_UP_AFTER`], undecodable, or its notifier is gone.
    Dropped,
}

async fn process(
    store: Arc<dyn StateStore>,
    (policy, secrets): (Arc<Policy>, Arc<SecretStore>),
    client: Client,
    stats: Arc<Stats>,
    item: Claimed,
) {
    let id = item.id.clone();
    let outcome = handle(
        &*store,
        policy.notifiers(),
        &secrets,
        &client,
        item,
        SystemTime::now(),
    )
    .await;
    let counter = match &outcome {
        Ok(Outcome::Delivered) => &stats.delivered,
        Ok(Outcome::Retry(_)) => &stats.retried,
        Ok(Outcome::Dropped) => &stats.dropped,
        Err(e) => {
            // The item stays claimed; the lease brings it back.
            tracing::warn!(delivery = %id, "notification outbox: {e}");
            return;
        }
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Delivers one claimed item and acks or reschedules it; the store errors are the caller's.
pub async fn handle(
    store: &dyn StateStore,
    configured: &[Notifier],
    secrets: &SecretStore,
    client: &Client,
    item: Claimed,
    now: SystemTime,
) -> Result<Outcome, StateError> {
    let outbound: Outbound = match serde_json::from_slice(&item.doc) {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(delivery = %item.id, "undecodable notification dropped: {e}");
            store.ack(QUEUE_NOTIFY, &item.id).await?;
            return Ok(Outcome::Dropped);
        }
    };
    let notice = &outbound.notice;
    if now >= outbound.first_enqueued() + GIVE_UP_AFTER {
        tracing::warn!(delivery = %item.id, notifier = %notice.notifier, attempts = item.attempts,
            "notification given up: not delivered within {}h",
            GIVE_UP_AFTER.as_secs() / 3600);
        store.ack(QUEUE_NOTIFY, &item.id).await?;
        return Ok(Outcome::Dropped);
    }
    let Some(notifier) = configured.iter().find(|n| n.name == notice.notifier) else {
        tracing::warn!(delivery = %item.id, notifier = %notice.notifier,
            "notification dropped: [notify.{}] is no longer in the policy", notice.notifier);
        store.ack(QUEUE_NOTIFY, &item.id).await?;
        return Ok(Outcome::Dropped);
    };
    match deliver(client, notifier, secrets, &item.id, notice, now).await {
        Ok(()) => {
            tracing::debug!(delivery = %item.id, notifier = %notifier.name, "notification delivered");
            store.ack(QUEUE_NOTIFY, &item.id).await?;
            Ok(Outcome::Delivered)
        }
        Err(e) => {
            let wait = backoff(item.attempts);
            store.reschedule(QUEUE_NOTIFY, &item.id, now + wait).await?;
            tracing::warn!(delivery = %item.id, attempts = item.attempts + 1,
                "notification not delivered (retrying in {}s): {e}", wait.as_secs());
            Ok(Outcome::Retry(now + wait))
        }
    }
}

/// One delivery attempt: the body in the notifier's format (scrubbed), signed when the
/// notifier has a secret, POSTed within [`DELIVERY_TIMEOUT`]; `Ok` on a 2xx answer.
pub async fn deliver(
    client: &Client,
    notifier: &Notifier,
    secrets: &SecretStore,
    delivery: &str,
    notice: &Notice,
    now: SystemTime,
) -> Result<(), DeliveryError> {
    let name = || notifier.name.clone();
    let secret = if notifier.signed {
        let value = secrets
            .get(&notify_secret_key(&notifier.name))
            .await
            .map_err(|e| DeliveryError::Secret {
                notifier: name(),
                why: e.to_string(),
            })?;
        Some(value)
    } else {
        None
    };
    let scrubber = secrets.scrubber().map_err(|e| DeliveryError::Scrub {
        notifier: name(),
        why: e.to_string(),
    })?;
    // The buttons are what the notifier is now (a reload may have changed it since this was
    // queued): never links for an interactive one, whose `approvers` a link would pass by.
    let mut notice = notice.clone();
    if notifier.interactive {
        notice.links = None;
    } else {
        notice.actions = None;
    }
    let body = render(notifier.format, delivery, &notice, scrubber.as_deref());
    let timestamp = unix(now).to_string();
    let mut req = http::Request::post(notifier.url.as_str())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header("x-latchkey-event", &notice.event)
        .header("x-latchkey-delivery", delivery)
        .header("x-latchkey-timestamp", &timestamp);
    if let Some(secret) = &secret {
        req = req.header("x-latchkey-signature", signature(secret, &timestamp, &body));
    }
    let req = req
        .body(
            http_body_util::Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed(),
        )
        .map_err(|e| DeliveryError::Build {
            notifier: name(),
            why: e.to_string(),
        })?;
    let exchange = async {
        let res = client.request(req).await.map_err(|e| {
            let why = match find_upstream_error(&e) {
                Some(u) => u.to_string(),
                None => e.to_string(),
            };
            DeliveryError::Unreachable {
                notifier: name(),
                why,
            }
        })?;
        let status = res.status();
        drain(res.into_body()).await;
        Ok::<_, DeliveryError>(status)
    };
    let status = tokio::time::timeout(DELIVERY_TIMEOUT, exchange)
        .await
        .map_err(|_| DeliveryError::Timeout { notifier: name() })??;
    if status.is_success() {
        Ok(())
    } else {
        Err(DeliveryError::Status {
            notifier: name(),
            status: status.as_u16(),
        })
    }
}

/// Reads and drops at most [`MAX_RESPONSE_BYTES`] of a receiver's answer (so the connection
/// can be reused when it was small), never more.
pub(crate) async fn drain(mut body: hyper::body::Incoming) {
    let mut read = 0usize;
    while read <= MAX_RESPONSE_BYTES {
        match body.frame().await {
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
            _ => return,
        }
    }
}

/// `sha256=` and the hex HMAC-SHA256 of `"{timestamp}.{body}"` under the notifier's secret.
pub fn signature(secret: &SecretValue, timestamp: &str, body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.expose());
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(timestamp.as_bytes());
    ctx.update(b".");
    ctx.update(body);
    format!("sha256={}", hex::encode(ctx.sign()))
}

/// The body a notifier receives, scrubbed: every string in it has the secrets' values
/// replaced (so the JSON stays valid), and the encoded whole is checked once more.
pub fn render(
    format: NotifyFormat,
    delivery: &str,
    notice: &Notice,
    scrubber: Option<&Scrubber>,
) -> Vec<u8> {
    let value = match format {
        NotifyFormat::Json => json_payload(delivery, notice),
        NotifyFormat::Slack => slack_payload(notice),
    };
    scrubbed(value, scrubber)
}

/// `value` encoded, scrubbed as [`render`] scrubs a delivery (every message latchkey sends a
/// chat goes through here).
pub fn scrubbed(mut value: Value, scrubber: Option<&Scrubber>) -> Vec<u8> {
    let Some(scrubber) = scrubber.filter(|s| !s.is_empty()) else {
        return value.to_string().into_bytes();
    };
    scrub_strings(&mut value, scrubber);
    let body = value.to_string().into_bytes();
    if scrubber.find(&body).is_some() {
        // Only an escaped form could still match; scrub the bytes as well.
        return scrubber.scrub(&body).0;
    }
    body
}

fn scrub_strings(value: &mut Value, scrubber: &Scrubber) {
    match value {
        Value::String(s) if scrubber.find(s.as_bytes()).is_some() => {
            let (clean, _) = scrubber.scrub(s.as_bytes());
            *s = String::from_utf8_lossy(&clean).into_owned();
        }
        Value::Array(items) => items.iter_mut().for_each(|v| scrub_strings(v, scrubber)),
        Value::Object(map) => map.values_mut().for_each(|v| scrub_strings(v, scrubber)),
        _ => {}
    }
}

/// `{"event", "delivery", "approval", "links"}`.
pub fn json_payload(delivery: &str, notice: &Notice) -> Value {
    json!({
        "event": notice.event,
        "delivery": delivery,
        "approval": notice.approval.public(),
        "links": notice.links,
    })
}

/// A Slack-compatible message: one line of `text`, then Block Kit blocks with the details and
/// one button per approve scope and a deny button (none once decided): links, or interactive
/// buttons for a notifier with `signing_secret`.
pub fn slack_payload(notice: &Notice) -> Value {
    let a = &notice.approval;
    let decided = notice.event == EVENT_DECIDED;
    let text = headline(notice);
    let mut details = vec![
        format!("*Identity:* {}", mrkdwn(&a.identity)),
        format!(
            "*Request:* {} {}",
            mrkdwn(&a.method),
            mrkdwn(&clip(&a.url, 1000))
        ),
        format!("*Rule:* {}", mrkdwn(&a.rule)),
    ];
    if !a.labels.is_empty() {
        let labels: Vec<String> = a.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        details.push(format!("*Labels:* {}", mrkdwn(&labels.join(", "))));
    }
    if let Some(message) = &a.message {
        details.push(format!("*Message:* {}", mrkdwn(message)));
    }
    if let Some(denial) = &a.denial {
        details.push(format!("*Policy alone:* {}", mrkdwn(denial)));
    }
    details.push(format!(
        "*Body:* {} bytes, sha256 `{}`",
        a.body_bytes,
        mrkdwn(&a.body_sha256)
    ));
    details.push(format!(
        "*Approval:* `{}`, expires {}",
        mrkdwn(&a.id),
        humantime::format_rfc3339_seconds(a.expires)
    ));
    let mut blocks = vec![
        json!({"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn(&text)}}),
        json!({"type": "section", "text": {"type": "mrkdwn", "text": details.join("\n")}}),
    ];
    if let Some(preview) = &a.preview {
        let preview = clip(preview, 2000).replace("```", "'''");
        blocks.push(json!({"type": "section", "text": {"type": "mrkdwn",
            "text": format!("*Preview:*\n```{}```", mrkdwn(&preview))}}));
    }
    if !decided {
        if let Some(buttons) = buttons(notice) {
            blocks.push(json!({"type": "actions", "elements": buttons}));
        }
    }
    json!({"text": text, "blocks": blocks})
}

/// The approve buttons (one per scope) and the deny button of a pending approval: interactive
/// (a signed `value`, no `url`) when the notice carries button values, else links; `None`
/// when it carries neither.
fn buttons(notice: &Notice) -> Option<Vec<Value>> {
    let a = &notice.approval;
    let approve = |scope: &str, target: (&str, &str)| {
        let mut button = json!({"type": "button", "style": "primary",
            "action_id": clip(&format!("approve-{scope}"), 255),
            "text": {"type": "plain_text", "text": clip(&format!("Approve ({scope})"), 75)}});
        button[target.0] = Value::from(target.1);
        if target.0 == "value" {
            // An in-place answer takes one click: Slack asks first.
            button["confirm"] = json!({
                "title": {"type": "plain_text", "text": "Approve this request?"},
                "text": {"type": "plain_text", "text": clip(&format!(
                    "{} {} for identity {} (scope {scope})", a.method, a.url, a.identity), 300)},
                "confirm": {"type": "plain_text", "text": "Approve"},
                "deny": {"type": "plain_text", "text": "Cancel"},
            });
        }
        button
    };
    let deny = |target: (&str, &str)| {
        let mut button = json!({"type": "button", "style": "danger", "action_id": "deny",
            "text": {"type": "plain_text", "text": "Deny"}});
        button[target.0] = Value::from(target.1);
        button
    };
    let mut buttons: Vec<Value> = Vec::new();
    let deny_button = if let Some(actions) = &notice.actions {
        for scope in &a.scopes {
            if let Some(value) = actions.approve.get(scope) {
                buttons.push(approve(scope, ("value", value)));
            }
        }
        deny(("value", &actions.deny))
    } else if let Some(links) = &notice.links {
        for scope in &a.scopes {
            if let Some(url) = links.approve.get(scope) {
                buttons.push(approve(scope, ("url", url)));
            }
        }
        deny(("url", &links.deny))
    } else {
        return None;
    };
    buttons.truncate(24);
    buttons.push(deny_button);
    Some(buttons)
}

/// The one-line summary: who asks for what, or who decided what.
fn headline(notice: &Notice) -> String {
    let a = &notice.approval;
    let request = format!("{} {}", a.method, clip(&a.url, 500));
    match (&a.answer, notice.event.as_str()) {
        (Some(answer), EVENT_DECIDED) => {
            let what = match (answer.decision.as_str(), &answer.scope) {
                ("approve", Some(scope)) => format!("approved ({scope})"),
                ("approve", None) => "approved".to_string(),
                _ => "denied".to_string(),
            };
            let note = answer
                .note
                .as_deref()
                .map(|n| format!(": {}", clip(n, 300)))
                .unwrap_or_default();
            format!(
                "latchkey: {} {what} identity {} to {request} (rule {}){note}",
                answer.by, a.identity, a.rule
            )
        }
        _ => format!(
            "latchkey: identity {} asks to {request} (rule {})",
            a.identity, a.rule
        ),
    }
}

/// Escapes the three characters Slack's mrkdwn treats as control characters.
pub fn mrkdwn(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// At most `max` characters, the last one `…` when cut.
pub(crate) fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
#[path = "notify_tests.rs"]
pub(crate) mod tests;

#[cfg(test)]
#[path = "notify_outbox_tests.rs"]
mod outbox_tests;

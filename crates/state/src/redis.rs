//! The shared state store: Redis, for several latchkey replicas that must see the same
//! approvals, grants, counters and outbox.
//!
//! Every multi-step operation is one Lua script (`redis::Script`), so it is atomic on the server
//! whatever the number of replicas. Commands go through a `ConnectionManager`, which reconnects;
//! a second manager speaking RESP3 holds the pattern subscription to this store's event channels,
//! resubscribes after a dropped connection, and is pinged every few seconds so that a dead
//! connection is noticed even when nothing is published. Every key is under one prefix
//! (`latchkey:` by default), so several deployments or tests can share a server.
//!
//! Versions come from one `INCR` sequence, so a version is never reused (not even after a record
//! expired or was deleted) and `list` orders by it. The password of a `redis://` URL is used to
//! connect and never appears in `describe()`, an error or a log.
//! Depends on nothing else in the crate.

use std::time::{Duration, SystemTime};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{
    AsyncCommands, Client, ConnectionAddr, IntoConnectionInfo, Msg, ProtocolVersion, PushInfo,
    Script, Value,
};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;

use super::gcra::Bucket;
use super::{slot_ttl_ms, Added, Claimed, Event, Fut, StateError, StateStore, Taken, Versioned};

#[path = "redis_scripts.rs"]
mod scripts;
use scripts::{
    ACK, ACQUIRE, ADD, CLAIM, DELETE, ENQUEUE, HOLDERS, LEASE, LIST, RELEASE, RELINQUISH,
    RESCHEDULE, TAKE, WRITE,
};

/// The key prefix latchkey uses unless told otherwise.
pub const DEFAULT_PREFIX: &str = "latchkey:";

/// Buffered events per subscriber before the oldest are dropped (waiters poll as well).
const EVENT_CAPACITY: usize = 1024;

/// How often the subscription connection is pinged (a dead one is then replaced).
const PING_EVERY: Duration = Duration::from_secs(5);

/// How long one command may take before it fails (and the caller fails closed).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long connecting may take, at start-up and on each reconnection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The Redis state store. Open it with [`Redis::open`].
pub struct Redis {
    describe: String,
    prefix: String,
    password: Option<String>,
    conn: ConnectionManager,
    events: broadcast::Sender<Event>,
    subscriber: JoinHandle<()>,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis")
            .field("store", &self.describe)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.subscriber.abort();
    }
}

/// `url` with any password removed, for messages.
fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("REDACTED"));
            }
            parsed.to_string()
        }
        // Unparsable: keep only what follows the last `@`, which holds no credentials.
        Err(_) => match url.rsplit_once('@') {
            Some((_, rest)) => format!("redis://REDACTED@{rest}"),
            None => url.to_string(),
        },
    }
}

fn password_of(url: &str) -> Option<String> {
    url::Url::parse(url)
        .ok()
        .and_then(|u| u.password().map(str::to_string))
}

fn url_error(url: &str, why: impl Into<String>) -> StateError {
    StateError::Url {
        url: redacted(url),
        why: why.into(),
    }
}

impl Redis {
    /// Connects to `url` (`redis://[[USER]:PASSWORD@]HOST:PORT[/DB]`) under the default prefix.
    pub async fn open(url: &str) -> Result<Self, StateError> {
        Self::open_with_prefix(url, DEFAULT_PREFIX).await
    }

    /// Connects to `url`, keeping every key under `prefix`. Fails at once (naming host:port,
    /// never the password) when the server does not answer `PING`.
    pub async fn open_with_prefix(url: &str, prefix: &str) -> Result<Self, StateError> {
        if !url.starts_with("redis://") {
            return Err(url_error(url, "expected redis://HOST:PORT[/DB]"));
        }
        let info = url.into_connection_info().map_err(|e| {
            url_error(
                url,
                format!(
                    "not a Redis URL: {}",
                    scrub(e.to_string(), password_of(url).as_deref())
                ),
            )
        })?;
        let (host, port) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
            _ => return Err(url_error(url, "only plain TCP redis:// URLs are supported")),
        };
        let settings = info.redis_settings().clone();
        let password = settings.password().map(str::to_string);
        let db = settings.db();
        let describe = format!("redis://{host}:{port}/{db}");
        let info = info.set_redis_settings(settings.set_protocol(ProtocolVersion::RESP3));
        let client = Client::open(info)
            .map_err(|e| url_error(url, scrub(e.to_string(), password.as_deref())))?;
        let fail = |message: String| StateError::Backend {
            store: describe.clone(),
            message: scrub(message, password.as_deref()),
        };
        let config = || {
            ConnectionManagerConfig::new()
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(100))
                .set_max_delay(Duration::from_secs(2))
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT))
        };
        let addr = format!("{host}:{port}");
        let mut conn = connect(&client, config(), &addr).await.map_err(&fail)?;
        let pong: String = ::redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(|e| fail(format!("{host}:{port} did not answer PING: {e}")))?;
        if pong != "PONG" {
            return Err(fail(format!("{host}:{port} answered PING with {pong:?}")));
        }
        let (push_tx, push_rx) = mpsc::unbounded_channel::<PushInfo>();
        let mut sub = connect(
            &client,
            config()
                .set_push_sender(push_tx)
                .set_automatic_resubscription(),
            &addr,
        )
        .await
        .map_err(&fail)?;
        let pattern = format!("{prefix}ev:*");
        sub.psubscribe(&pattern)
            .await
            .map_err(|e| fail(format!("cannot subscribe to {pattern}: {e}")))?;
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        let subscriber = tokio::spawn(forward_events(
            sub,
            push_rx,
            events.clone(),
            format!("{prefix}ev:"),
        ));
        Ok(Redis {
            describe,
            prefix: prefix.to_string(),
            password,
            conn,
            events,
            subscriber,
        })
    }

    fn fail(&self, e: ::redis::RedisError) -> StateError {
        StateError::Backend {
            store: self.describe.clone(),
            message: scrub(e.to_string(), self.password.as_deref()),
        }
    }

    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}{kind}:{name}", self.prefix)
    }

    fn record_key(&self, ns: &str, id: &str) -> String {
        format!("{}rec:{ns}:{id}", self.prefix)
    }

    /// Runs `script` with `keys` and `args` on a clone of the managed connection.
    fn eval<'a, T: ::redis::FromRedisValue + Send + 'a>(
        &'a self,
        script: &'static Script,
        keys: Vec<String>,
        args: Vec<Vec<u8>>,
    ) -> Fut<'a, T> {
        let mut conn = self.conn.clone();
        Box::pin(async move {
            let mut call = script.prepare_invoke();
            for key in &keys {
                call.key(key);
            }
            for arg in &args {
                call.arg(arg.as_slice());
            }
            call.invoke_async(&mut conn).await.map_err(|e| self.fail(e))
        })
    }
}

/// A managed connection to `addr`, the first connection made now (bounded in time).
async fn connect(
    client: &Client,
    config: ConnectionManagerConfig,
    addr: &str,
) -> Result<ConnectionManager, String> {
    match tokio::time::timeout(
        CONNECT_TIMEOUT * 3,
        ConnectionManager::new_with_config(client.clone(), config),
    )
    .await
    {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(format!("cannot connect to {addr}: {e}")),
        Err(_) => Err(format!("cannot connect to {addr}: timed out")),
    }
}

/// Removes the password from a message, should a driver error ever quote it.
fn scrub(message: String, password: Option<&str>) -> String {
    match password {
        Some(p) if !p.is_empty() => message.replace(p, "REDACTED"),
        _ => message,
    }
}

/// Feeds messages on this store's channels into `events`, and pings the subscription connection
/// so that a dropped one is reconnected (and resubscribed) even when nothing is published.
async fn forward_events(
    mut sub: ConnectionManager,
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    events: broadcast::Sender<Event>,
    channel_prefix: String,
) {
    let mut ping = tokio::time::interval(PING_EVERY);
    loop {
        tokio::select! {
            push = pushes.recv() => {
                let Some(push) = push else { return };
                let Some(msg) = Msg::from_push_info(push) else { continue };
                let Some(channel) = msg.get_channel_name().strip_prefix(&channel_prefix) else {
                    continue;
                };
                let Ok(message) = String::from_utf8(msg.get_payload_bytes().to_vec()) else {
                    continue;
                };
                let _ = events.send(Event { channel: channel.to_string(), message });
            }
            _ = ping.tick() => {
                if let Err(e) = ::redis::cmd("PING").query_async::<Value>(&mut sub).await {
                    tracing::debug!(error = %e, "state store subscription ping failed; reconnecting");
                }
            }
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn arg(v: impl ToString) -> Vec<u8> {
    v.to_string().into_bytes()
}

fn ttl_arg(ttl: Option<Duration>) -> Vec<u8> {
    ttl.map(|t| arg(ms(t))).unwrap_or_default()
}

impl Redis {
    fn queue_keys(&self, queue: &str) -> Vec<String> {
        vec![
            self.key("q", &format!("{queue}:due")),
            self.key("q", &format!("{queue}:doc")),
            self.key("q", &format!("{queue}:att")),
        ]
    }

    fn write<'a>(
        &'a self,
        ns: &'a str,
        id: &'a str,
        doc: &'a [u8],
        ttl: Option<Duration>,
        mode: Vec<u8>,
    ) -> Fut<'a, u64> {
        let keys = vec![
            self.record_key(ns, id),
            self.key("idx", ns),
            self.key("exp", ns),
            format!("{}seq", self.prefix),
        ];
        let prefix = arg(self.record_key(ns, ""));
        self.eval(
            &WRITE,
            keys,
            vec![prefix, doc.to_vec(), ttl_arg(ttl), arg(id), mode],
        )
    }
}

/// Splits a script's flat reply into groups of three values.
fn triples(values: Vec<Value>) -> impl Iterator<Item = (Value, Value, Value)> {
    let mut values = values.into_iter();
    std::iter::from_fn(move || Some((values.next()?, values.next()?, values.next()?)))
}

fn parse<T: ::redis::FromRedisValue>(v: Value, store: &Redis) -> Result<T, StateError> {
    ::redis::from_redis_value(v).map_err(|e| StateError::Backend {
        store: store.describe.clone(),
        message: format!("unexpected reply: {e}"),
    })
}

impl StateStore for Redis {
    fn describe(&self) -> &str {
        &self.describe
    }

    fn put_new<'a>(
        &'a self,
        ns: &'a str,
        id: &'a str,
        doc: &'a [u8],
        ttl: Option<Duration>,
    ) -> Fut<'a, bool> {
        Box::pin(async move { Ok(self.write(ns, id, doc, ttl, arg("new")).await? > 0) })
    }

    fn put<'a>(
        &'a self,
        ns: &'a str,
        id: &'a str,
        doc: &'a [u8],
        ttl: Option<Duration>,
    ) -> Fut<'a, ()> {
        Box::pin(async move { self.write(ns, id, doc, ttl, arg("put")).await.map(drop) })
    }

    fn get<'a>(&'a self, ns: &'a str, id: &'a str) -> Fut<'a, Option<Versioned>> {
        let mut conn = self.conn.clone();
        let key = self.record_key(ns, id);
        Box::pin(async move {
            let (version, doc): (Option<u64>, Option<Vec<u8>>) = ::redis::cmd("HMGET")
                .arg(&key)
                .arg("v")
                .arg("d")
                .query_async(&mut conn)
                .await
                .map_err(|e| self.fail(e))?;
            Ok(match (version, doc) {
                (Some(version), Some(doc)) => Some(Versioned { version, doc }),
                _ => None,
            })
        })
    }

    fn replace<'a>(
        &'a self,
        ns: &'a str,
        id: &'a str,
        version: u64,
        doc: &'a [u8],
        ttl: Option<Duration>,
    ) -> Fut<'a, bool> {
        Box::pin(async move { Ok(self.write(ns, id, doc, ttl, arg(version)).await? > 0) })
    }

    fn delete<'a>(&'a self, ns: &'a str, id: &'a str) -> Fut<'a, bool> {
        let keys = vec![
            self.record_key(ns, id),
            self.key("idx", ns),
            self.key("exp", ns),
        ];
        let prefix = arg(self.record_key(ns, ""));
        Box::pin(async move {
            let removed: i64 = self.eval(&DELETE, keys, vec![prefix, arg(id)]).await?;
            Ok(removed == 1)
        })
    }

    fn list<'a>(&'a self, ns: &'a str, limit: usize) -> Fut<'a, Vec<(String, Versioned)>> {
        let keys = vec![self.key("idx", ns)];
        let prefix = self.record_key(ns, "");
        Box::pin(async move {
            if limit == 0 {
                return Ok(Vec::new());
            }
            let flat: Vec<Value> = self
                .eval(&LIST, keys, vec![arg(limit), arg(prefix)])
                .await?;
            triples(flat)
                .map(|(id, version, doc)| {
                    Ok((
                        parse(id, self)?,
                        Versioned {
                            version: parse(version, self)?,
                            doc: parse(doc, self)?,
                        },
                    ))
                })
                .collect()
        })
    }

    fn add<'a>(
        &'a self,
        key: &'a str,
        delta: i64,
        limit: Option<i64>,
        ttl: Duration,
    ) -> Fut<'a, Added> {
        let keys = vec![self.key("cnt", key)];
        let limit = limit.map(arg).unwrap_or_default();
        Box::pin(async move {
            let (added, value): (i64, i64) = self
                .eval(&ADD, keys, vec![arg(delta), limit, arg(ms(ttl))])
                .await?;
            Ok(if added == 1 {
                Added::Ok(value)
            } else {
                Added::Over(value)
            })
        })
    }

    fn counter<'a>(&'a self, key: &'a str) -> Fut<'a, i64> {
        let mut conn = self.conn.clone();
        let key = self.key("cnt", key);
        Box::pin(async move {
            let value: Option<i64> = conn.get(&key).await.map_err(|e| self.fail(e))?;
            Ok(value.unwrap_or(0))
        })
    }

    fn lease<'a>(&'a self, key: &'a str, holder: &'a str, ttl: Duration) -> Fut<'a, bool> {
        let keys = vec![self.key("lease", key)];
        Box::pin(async move {
            let taken: i64 = self
                .eval(&LEASE, keys, vec![arg(holder), arg(ms(ttl))])
                .await?;
            Ok(taken == 1)
        })
    }

    fn release<'a>(&'a self, key: &'a str, holder: &'a str) -> Fut<'a, ()> {
        let keys = vec![self.key("lease", key)];
        Box::pin(async move {
            self.eval::<i64>(&RELEASE, keys, vec![arg(holder)])
                .await
                .map(drop)
        })
    }

    fn take<'a>(&'a self, key: &'a str, burst: u64, interval: Duration) -> Fut<'a, Taken> {
        let keys = vec![self.key("tb", key)];
        Box::pin(async move {
            let bucket = Bucket::new(&self.describe, key, burst, interval)?;
            let (allowed, ahead): (i64, i64) = self
                .eval(
                    &TAKE,
                    keys,
                    vec![arg(bucket.interval_us), arg(bucket.tau_us)],
                )
                .await?;
            Ok(bucket.taken(allowed == 1, ahead))
        })
    }

    fn acquire<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
        max: u64,
        ttl: Duration,
    ) -> Fut<'a, Option<u64>> {
        let keys = vec![self.key("sem", key)];
        Box::pin(async move {
            let ttl = slot_ttl_ms(&self.describe, key, max, ttl)?;
            let held: i64 = self
                .eval(&ACQUIRE, keys, vec![arg(holder), arg(max), arg(ttl)])
                .await?;
            Ok(u64::try_from(held).ok())
        })
    }

    fn relinquish<'a>(&'a self, key: &'a str, holder: &'a str) -> Fut<'a, ()> {
        let keys = vec![self.key("sem", key)];
        Box::pin(async move {
            self.eval::<i64>(&RELINQUISH, keys, vec![arg(holder)])
                .await
                .map(drop)
        })
    }

    fn holders<'a>(&'a self, key: &'a str) -> Fut<'a, u64> {
        let keys = vec![self.key("sem", key)];
        Box::pin(async move { self.eval(&HOLDERS, keys, Vec::new()).await })
    }

    fn enqueue<'a>(
        &'a self,
        queue: &'a str,
        id: &'a str,
        doc: &'a [u8],
        due: SystemTime,
    ) -> Fut<'a, ()> {
        let keys = self.queue_keys(queue);
        Box::pin(async move {
            self.eval::<i64>(
                &ENQUEUE,
                keys,
                vec![arg(id), doc.to_vec(), arg(millis(due))],
            )
            .await
            .map(drop)
        })
    }

    fn claim<'a>(
        &'a self,
        queue: &'a str,
        now: SystemTime,
        lease: Duration,
        max: usize,
    ) -> Fut<'a, Vec<Claimed>> {
        let keys = self.queue_keys(queue);
        let now = millis(now);
        Box::pin(async move {
            if max == 0 {
                return Ok(Vec::new());
            }
            let until = now.saturating_add(ms(lease));
            let flat: Vec<Value> = self
                .eval(&CLAIM, keys, vec![arg(now), arg(until), arg(max)])
                .await?;
            triples(flat)
                .map(|(id, doc, attempts)| {
                    Ok(Claimed {
                        id: parse(id, self)?,
                        doc: parse(doc, self)?,
                        attempts: parse(attempts, self)?,
                    })
                })
                .collect()
        })
    }

    fn reschedule<'a>(&'a self, queue: &'a str, id: &'a str, due: SystemTime) -> Fut<'a, ()> {
        let keys = vec![self.key("q", &format!("{queue}:due"))];
        Box::pin(async move {
            self.eval::<i64>(&RESCHEDULE, keys, vec![arg(id), arg(millis(due))])
                .await
                .map(drop)
        })
    }

    fn ack<'a>(&'a self, queue: &'a str, id: &'a str) -> Fut<'a, ()> {
        let keys = self.queue_keys(queue);
        Box::pin(async move { self.eval::<i64>(&ACK, keys, vec![arg(id)]).await.map(drop) })
    }

    fn queue_len<'a>(&'a self, queue: &'a str) -> Fut<'a, u64> {
        let mut conn = self.conn.clone();
        let key = self.key("q", &format!("{queue}:due"));
        Box::pin(async move { conn.zcard(&key).await.map_err(|e| self.fail(e)) })
    }

    fn publish<'a>(&'a self, channel: &'a str, message: &'a str) -> Fut<'a, ()> {
        let mut conn = self.conn.clone();
        let channel = self.key("ev", channel);
        Box::pin(async move {
            conn.publish::<_, _, i64>(&channel, message)
                .await
                .map(drop)
                .map_err(|e| self.fail(e))
        })
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }
}

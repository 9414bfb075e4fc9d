//! The watcher: how a replica learns that a session ended elsewhere, and ends its own expired
//! ones. Every [`POLL`] it lists the store's recent end notes ([`NS_ENDS`]) and ends each cached
//! session named there; a store event (`end ID`, `extend ID`) wakes it early. It also ends the
//! cached sessions whose time passed (reading the store first: another replica may have
//! extended one) and drops long-ended entries from the cache. A poll that succeeds marks the
//! cache fresh ([`super::FRESH`]); after a gap longer than the end notes live, the cache is
//! dropped, since ends in the gap may be gone.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::{lock, now_ms, End, Sessions, CHANNEL, END_NOTE_TTL, NS_ENDS, POLL};

/// How many end notes one poll reads at most (revocations within [`END_NOTE_TTL`]).
const MAX_ENDS: usize = 10_000;

impl Sessions {
    /// Runs the watcher until `stop` says so.
    pub async fn watch(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut events = self.store.subscribe();
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                event = events.recv() => match event {
                    Ok(e) if e.channel == CHANNEL => self.on_event(&e.message).await,
                    Ok(_) => continue,
                    // Lagged or closed: the poll catches up.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        events = self.store.subscribe();
                    }
                },
                r = stop.changed() => {
                    if r.is_err() || *stop.borrow() {
                        return;
                    }
                    continue;
                }
            }
            self.poll().await;
        }
    }

    /// One event: re-read the session it names.
    async fn on_event(&self, message: &str) {
        let Some((_, id)) = message.split_once(' ') else {
            return;
        };
        let cached = lock(&self.cache).get(id).cloned();
        let Some(live) = cached else {
            return;
        };
        match self.read(id).await {
            Ok(Some(doc)) if doc.revoked_at.is_some() => live.end(End::Revoked),
            Ok(Some(doc)) => live.expires_at.store(doc.expires_at, Ordering::Release),
            Ok(None) => live.end(End::Revoked),
            // The poll retries.
            Err(_) => {}
        }
    }

    /// One poll: end notes, expiries, cache upkeep; fresh if the store answered.
    pub async fn poll(&self) {
        // Nothing admitted here: nothing to end or expire, and no cached entry whose freshness
        // matters (every admission reads the store). A latchkey without sessions never polls.
        if lock(&self.cache).is_empty() {
            *lock(&self.synced) = None;
            return;
        }
        let started = Instant::now();
        let ends = match self.store.list(NS_ENDS, MAX_ENDS).await {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(error = %e, "sessions: cannot poll the state store; admissions read it directly until it answers");
                // Expiry needs no store: sessions whose time passed end (and are cut) anyway.
                self.expire().await;
                return;
            }
        };
        let gap = lock(&self.synced).map(|t| t.elapsed());
        if gap.is_some_and(|g| g > END_NOTE_TTL / 2) {
            // Ends during the gap may have aged out of the notes: trust nothing cached.
            tracing::warn!("sessions: the state store was out of reach for a while; checking every cached session again");
            self.recheck_all().await;
        }
        for (id, _) in &ends {
            let cached = lock(&self.cache).get(id).cloned();
            if let Some(live) = cached {
                if live.ended(now_ms()) != Some(End::Revoked) {
                    live.end(End::Revoked);
                }
            }
        }
        self.expire().await;
        *lock(&self.synced) = Some(started);
    }

    /// Ends cached sessions whose time passed (unless the store says they were extended), and
    /// forgets those ended a while ago with no connection left.
    async fn expire(&self) {
        let now = now_ms();
        let due: Vec<_> = lock(&self.cache)
            .values()
            .filter(|l| now >= l.expires_at())
            .cloned()
            .collect();
        for live in due {
            if live.ended.load(Ordering::Acquire) != 0 {
                if live.connections() == 0 {
                    self.forget(&live.id);
                }
                continue;
            }
            match self.read(&live.id).await {
                Ok(Some(doc)) if doc.revoked_at.is_none() && now < doc.expires_at => {
                    live.expires_at.store(doc.expires_at, Ordering::Release);
                }
                Ok(Some(doc)) if doc.revoked_at.is_some() => live.end(End::Revoked),
                Ok(_) => {
                    live.end(End::Expired);
                    self.counters.expired.fetch_add(1, Ordering::Relaxed);
                }
                // Its time passed whatever the store says: `ended` already reports it.
                Err(_) => live.end(End::Expired),
            }
        }
        // Revoked sessions leave the cache once their connections are gone.
        let gone: Vec<String> = lock(&self.cache)
            .values()
            .filter(|l| l.ended.load(Ordering::Acquire) == 1 && l.connections() == 0)
            .map(|l| l.id.clone())
            .collect();
        for id in gone {
            self.forget(&id);
        }
    }

    /// Reads every cached session again (after a gap in polling).
    async fn recheck_all(&self) {
        let cached: Vec<_> = lock(&self.cache).values().cloned().collect();
        for live in cached {
            match self.read(&live.id).await {
                Ok(Some(doc)) if doc.revoked_at.is_none() => {
                    live.expires_at.store(doc.expires_at, Ordering::Release);
                }
                Ok(_) => live.end(End::Revoked),
                Err(_) => return,
            }
        }
    }
}

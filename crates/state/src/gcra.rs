//! The token-bucket arithmetic both backends share (GCRA, the generic cell rate algorithm), in
//! integer microseconds, so a bucket answers the same on SQLite and on Redis.
//!
//! A bucket of `burst` tokens refilled one every `interval` (`T`) is one number per key: its
//! theoretical arrival time `tat`, the instant at which the bucket would be full again. With
//! `tau = burst * T` (a full bucket's worth of time) and `now` on the store's clock:
//!
//! - `tat = max(stored_tat, now)` (a missing or past `tat` is a full bucket);
//! - the take is allowed iff `tat + T - now <= tau`; then `tat + T` is stored;
//! - `ahead` is how far the bucket's `tat` is ahead of `now` after the call: `tat + T - now`
//!   when allowed, `tat - now` when refused (nothing is stored then);
//! - `remaining = floor((tau - ahead) / T)`: whole tokens left (0 when refused, because a
//!   refusal means `ahead > tau - T`);
//! - `retry_after` (refused only) is the wait until the same take would be allowed, the
//!   smallest `d` with `tat + T - (now + d) <= tau`: `d = ahead + T - tau` (positive, since
//!   refused);
//! - `reset_after = ahead`: when `tat` is reached the bucket is full, which is also when an idle
//!   bucket's key may vanish.
//!
//! The Redis script makes the decision on the server (it must be atomic there) and returns
//! `(allowed, ahead)`; [`taken`] turns that into a [`Taken`] for both backends.
//! Depends on nothing else in the crate.

use std::time::Duration;

use super::{StateError, Taken};

/// The largest `burst * interval` accepted, in microseconds (about 35 years): far beyond any
/// real rate, and small enough that `now + tau` stays exact in a Lua number (a double), so the
/// Redis script computes what SQLite does.
pub(super) const MAX_TAU_US: u64 = 1 << 50;

/// A validated bucket: its refill interval and capacity in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Bucket {
    /// `T`: one token comes back every this many microseconds (at least 1).
    pub interval_us: i64,
    /// `tau = burst * T`.
    pub tau_us: i64,
}

impl Bucket {
    /// Checks `burst` and `interval`: a zero burst would refuse everything and a zero interval
    /// would never limit, both configuration errors the caller should see rather than a bucket
    /// that silently does something else. `store` and `key` name the bucket in the error.
    pub fn new(
        store: &str,
        key: &str,
        burst: u64,
        interval: Duration,
    ) -> Result<Bucket, StateError> {
        let bad = |why: String| StateError::Backend {
            store: store.to_string(),
            message: format!("token bucket {key:?}: {why}"),
        };
        if burst == 0 {
            return Err(bad("burst must be at least 1".to_string()));
        }
        let interval_us = interval.as_micros();
        if interval_us == 0 {
            return Err(bad(format!(
                "interval must be at least 1 µs (got {interval:?})"
            )));
        }
        let tau = interval_us.saturating_mul(u128::from(burst));
        if tau > u128::from(MAX_TAU_US) {
            return Err(bad(format!(
                "burst {burst} × interval {interval:?} is more than {} days",
                MAX_TAU_US / 86_400_000_000
            )));
        }
        // Both fit: tau ≤ 2^50 and interval ≤ tau.
        Ok(Bucket {
            interval_us: interval_us as i64,
            tau_us: tau as i64,
        })
    }

    /// One take at `now_us` against the stored `tat_us` (`None`: no bucket yet, i.e. full).
    /// `(allowed, ahead_us, tat_us to store when allowed)`.
    pub fn take(&self, stored_tat_us: Option<i64>, now_us: i64) -> (bool, i64, i64) {
        let tat = stored_tat_us.map_or(now_us, |t| t.max(now_us));
        let next = tat.saturating_add(self.interval_us);
        if next - now_us <= self.tau_us {
            (true, next - now_us, next)
        } else {
            (false, tat - now_us, tat)
        }
    }

    /// The caller's view of a take that left the bucket `ahead_us` ahead of now.
    pub fn taken(&self, allowed: bool, ahead_us: i64) -> Taken {
        let ahead = ahead_us.clamp(0, self.tau_us);
        let remaining = (self.tau_us - ahead) / self.interval_us;
        let retry = if allowed {
            0
        } else {
            (ahead + self.interval_us - self.tau_us).max(0)
        };
        Taken {
            allowed,
            remaining: if allowed { remaining as u64 } else { 0 },
            retry_after: micros(retry),
            reset_after: micros(ahead),
        }
    }
}

fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    fn bucket(burst: u64, interval_s: u64) -> Bucket {
        Bucket::new("test", "k", burst, Duration::from_secs(interval_s)).unwrap()
    }

    /// Takes at `now` (seconds), carrying `tat` between calls as a store would.
    fn take(b: &Bucket, tat: &mut Option<i64>, now_s: i64) -> Taken {
        let (allowed, ahead, next) = b.take(*tat, now_s * S);
        if allowed {
            *tat = Some(next);
        }
        b.taken(allowed, ahead)
    }

    #[test]
    fn a_new_bucket_admits_exactly_its_burst_at_one_instant() {
        let b = bucket(3, 10);
        let mut tat = None;
        let got: Vec<(bool, u64)> = (0..5)
            .map(|_| take(&b, &mut tat, 100))
            .map(|t| (t.allowed, t.remaining))
            .collect();
        assert_eq!(
            got,
            [(true, 2), (true, 1), (true, 0), (false, 0), (false, 0)]
        );
    }

    #[test]
    fn retry_and_reset_say_when_a_token_and_a_full_bucket_are_back() {
        let b = bucket(3, 10);
        let mut tat = None;
        let first = take(&b, &mut tat, 100);
        assert_eq!(first.retry_after, Duration::ZERO);
        assert_eq!(first.reset_after, Duration::from_secs(10));
        take(&b, &mut tat, 100);
        take(&b, &mut tat, 100);
        let refused = take(&b, &mut tat, 104);
        assert!(!refused.allowed);
        // tat = 130: at 110 one token is back; full at 130.
        assert_eq!(refused.retry_after, Duration::from_secs(6));
        assert_eq!(refused.reset_after, Duration::from_secs(26));
        let at_retry = take(&b, &mut tat, 110);
        assert!(at_retry.allowed, "allowed exactly at retry_after");
        assert_eq!(at_retry.remaining, 0);
        assert!(!take(&b, &mut tat, 110).allowed);
    }

    #[test]
    fn an_idle_bucket_refills_to_its_burst_and_no_further() {
        let b = bucket(2, 10);
        let mut tat = None;
        take(&b, &mut tat, 0);
        take(&b, &mut tat, 0);
        let later = take(&b, &mut tat, 1000);
        assert!(later.allowed);
        assert_eq!(later.remaining, 1, "full again, not 100 tokens");
        assert_eq!(later.reset_after, Duration::from_secs(10));
    }

    #[test]
    fn a_stored_tat_in_the_past_counts_as_full() {
        let b = bucket(5, 1);
        let (allowed, ahead, next) = b.take(Some(10 * S), 50 * S);
        assert!(allowed);
        assert_eq!((ahead, next), (S, 51 * S));
        assert_eq!(b.taken(allowed, ahead).remaining, 4);
    }

    #[test]
    fn zero_burst_zero_interval_and_huge_buckets_are_refused_naming_the_key() {
        for (burst, interval) in [
            (0, Duration::from_secs(1)),
            (1, Duration::ZERO),
            (1, Duration::from_nanos(999)),
            (u64::MAX, Duration::from_secs(1)),
        ] {
            let err = Bucket::new("sqlite:/x", "rl:a", burst, interval)
                .unwrap_err()
                .to_string();
            assert!(err.contains("sqlite:/x"), "{err}");
            assert!(err.contains("token bucket \"rl:a\""), "{err}");
        }
        assert!(Bucket::new("s", "k", 1, Duration::from_micros(1)).is_ok());
    }
}

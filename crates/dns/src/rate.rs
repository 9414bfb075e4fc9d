//! The resolver's per-client query rate cap: a token bucket per source address (IPv6 by /64,
//! what one host can rotate through), in a bounded map. Refusals are counted, not recorded one
//! by one: the server writes one audit record per client per second with the count
//! ([`RateLimiter::take_refused`]), so a flood cannot turn into a flood of audit lines.
//! Depends on nothing else in the crate.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::message::Transport;

/// Clients remembered at once; the least recently seen go first.
pub const MAX_CLIENTS: u64 = 65_536;
/// A client silent this long is forgotten (its bucket would be full again anyway).
const IDLE: Duration = Duration::from_secs(120);

/// Per-client token buckets.
pub struct RateLimiter {
    per_second: f64,
    buckets: moka::sync::Cache<IpAddr, Arc<Mutex<Bucket>>>,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("per_second", &self.per_second)
            .field("clients", &self.buckets.entry_count())
            .finish()
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
    /// Queries refused since the last [`RateLimiter::take_refused`], and the last client
    /// address and transport they came from (for the record).
    refused: u64,
    client: SocketAddr,
    transport: Transport,
}

/// Queries refused for one client since the last count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub client: SocketAddr,
    pub transport: Transport,
    pub count: u64,
}

impl RateLimiter {
    /// `per_second` queries a second per client, in bursts of as many.
    pub fn new(per_second: u32) -> Self {
        Self {
            per_second: f64::from(per_second.max(1)),
            buckets: moka::sync::Cache::builder()
                .max_capacity(MAX_CLIENTS)
                .time_to_idle(IDLE)
                .build(),
        }
    }

    /// Takes one query's token for `client`; `false` (the refusal counted) when it has none.
    pub fn admit(&self, client: SocketAddr, transport: Transport) -> bool {
        self.admit_at(client, transport, Instant::now())
    }

    fn admit_at(&self, client: SocketAddr, transport: Transport, now: Instant) -> bool {
        let bucket = self.buckets.get_with(key(client.ip()), || {
            Arc::new(Mutex::new(Bucket {
                tokens: self.per_second,
                last: now,
                refused: 0,
                client,
                transport,
            }))
        });
        let mut b = bucket.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.per_second).min(self.per_second);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            b.refused += 1;
            b.client = client;
            b.transport = transport;
            false
        }
    }

    /// The refusals counted since the last call, one entry per client that had any (at most
    /// [`MAX_CLIENTS`]), each count reset.
    pub fn take_refused(&self) -> Vec<Refused> {
        let mut out = Vec::new();
        for (_, bucket) in self.buckets.iter() {
            let mut b = bucket.lock().unwrap_or_else(PoisonError::into_inner);
            if b.refused > 0 {
                out.push(Refused {
                    client: b.client,
                    transport: b.transport,
                    count: b.refused,
                });
                b.refused = 0;
            }
        }
        out
    }
}

/// The bucket a source address shares: itself for IPv4, its /64 for IPv6.
fn key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_client_gets_its_burst_then_refusals_counted_then_tokens_back_with_time() {
        let rate = RateLimiter::new(5);
        let t0 = Instant::now();
        let a = addr("192.0.2.1:5353");
        let admitted = (0..8)
            .filter(|_| rate.admit_at(a, Transport::Udp, t0))
            .count();
        assert_eq!(admitted, 5);
        // Another client is not affected.
        assert!(rate.admit_at(addr("192.0.2.2:1"), Transport::Udp, t0));
        assert_eq!(
            rate.take_refused(),
            vec![Refused {
                client: a,
                transport: Transport::Udp,
                count: 3
            }]
        );
        assert!(rate.take_refused().is_empty(), "counts are reset");
        // A fifth of a second later: one token back.
        let later = t0 + Duration::from_millis(200);
        assert!(rate.admit_at(a, Transport::Tcp, later));
        assert!(!rate.admit_at(a, Transport::Tcp, later));
    }

    #[test]
    fn an_ipv6_host_cannot_escape_its_bucket_by_rotating_addresses_in_its_64() {
        let rate = RateLimiter::new(2);
        let t0 = Instant::now();
        let admitted = (1..=6)
            .filter(|i| rate.admit_at(addr(&format!("[2001:db8::{i}]:53")), Transport::Udp, t0))
            .count();
        assert_eq!(admitted, 2);
        assert!(rate.admit_at(addr("[2001:db8:0:1::1]:53"), Transport::Udp, t0));
    }
}

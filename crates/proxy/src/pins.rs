//! What latchkey's resolver handed out: which names it answered with which addresses, so a
//! listener that receives a connection for one of those addresses (transparent capture after a
//! DNS answer) can require the connection's SNI or Host to be one of those names.
//!
//! Bounded in both directions: at most `capacity` addresses are remembered (least recently used
//! go first), each with at most [`NAMES_PER_ADDRESS`] names, and an entry lives `ttl` after its
//! last answer. Lives in `proxy` (which reads it) so the resolver in `dns` depends on `proxy`
//! and never the reverse. Depends on nothing else in the crate.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// Names remembered per address; a CDN address shared by more names keeps the most recent.
pub const NAMES_PER_ADDRESS: usize = 16;

/// Addresses handed out by latchkey's resolver, and for which names.
pub struct Pins {
    by_ip: moka::sync::Cache<IpAddr, Arc<[Arc<str>]>>,
}

impl std::fmt::Debug for Pins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pins")
            .field("addresses", &self.by_ip.entry_count())
            .finish()
    }
}

impl Pins {
    /// At most `capacity` addresses, each forgotten `ttl` after it was last answered.
    pub fn new(capacity: u64, ttl: Duration) -> Self {
        Self {
            by_ip: moka::sync::Cache::builder()
                .max_capacity(capacity)
                .time_to_live(ttl)
                .build(),
        }
    }

    /// Remembers that `name` (normalised: lower case, no trailing dot) was answered with `ips`.
    pub fn record(&self, name: &str, ips: &[IpAddr]) {
        for ip in ips {
            let merged: Arc<[Arc<str>]> = match self.by_ip.get(ip) {
                Some(names) if names.iter().any(|n| &**n == name) => continue,
                Some(names) => {
                    let keep = names.len().min(NAMES_PER_ADDRESS - 1);
                    let mut v: Vec<Arc<str>> = names[names.len() - keep..].to_vec();
                    v.push(Arc::from(name));
                    v.into()
                }
                None => Arc::from(vec![Arc::from(name)]),
            };
            self.by_ip.insert(*ip, merged);
        }
    }

    /// The names `ip` was handed out for, if latchkey's resolver handed it out (and still
    /// remembers it).
    pub fn names_for(&self, ip: IpAddr) -> Option<Arc<[Arc<str>]>> {
        self.by_ip.get(&ip)
    }

    /// Whether `ip` was handed out as an answer for `name`.
    pub fn answered(&self, name: &str, ip: IpAddr) -> bool {
        self.names_for(ip)
            .is_some_and(|names| names.iter().any(|n| &**n == name))
    }
}

impl Default for Pins {
    /// 65,536 addresses for ten minutes: far more than a sandbox resolves, a few MiB at most.
    fn default() -> Self {
        Self::new(65_536, Duration::from_secs(600))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_remembers_the_names_it_was_answered_for() {
        let pins = Pins::default();
        pins.record("api.example.com", &[ip("192.0.2.1"), ip("2001:db8::1")]);
        pins.record("cdn.example.com", &[ip("192.0.2.1")]);
        assert!(pins.answered("api.example.com", ip("192.0.2.1")));
        assert!(pins.answered("cdn.example.com", ip("192.0.2.1")));
        assert!(pins.answered("api.example.com", ip("2001:db8::1")));
        assert!(!pins.answered("cdn.example.com", ip("2001:db8::1")));
        assert!(!pins.answered("evil.example", ip("192.0.2.1")));
        assert!(pins.names_for(ip("192.0.2.9")).is_none());
    }

    #[test]
    fn names_per_address_are_bounded_and_keep_the_latest() {
        let pins = Pins::default();
        for i in 0..(NAMES_PER_ADDRESS + 5) {
            pins.record(&format!("n{i}.example"), &[ip("192.0.2.7")]);
        }
        let names = pins.names_for(ip("192.0.2.7")).unwrap();
        assert_eq!(names.len(), NAMES_PER_ADDRESS);
        assert!(pins.answered(
            &format!("n{}.example", NAMES_PER_ADDRESS + 4),
            ip("192.0.2.7")
        ));
        assert!(!pins.answered("n0.example", ip("192.0.2.7")));
    }
}

//! Resource limits against abuse: connection caps (total and per client), an idle timeout on
//! every sandbox connection, and request framing checks against smuggling.
//!
//! Each limit answers with a clear status and leaves an audit record; none of them is a policy
//! decision, so report-only modes never relax them. This module knows sockets only through
//! `AsyncRead`/`AsyncWrite` ([`Idle`]); it depends on nothing in the crate but `reason` (and
//! `proxy::MAX_HEADER_BYTES`, the head size the sniffer bounds itself by).
//!
//! - [`framing`]: the framing rules (RFC 9112 §6), on parsed or raw header values;
//! - [`sniff`]: [`HeadSniff`], the raw request heads of an HTTP/1 connection, judged by them;
//! - [`idle`]: [`Idle`], the idle timeout and the "request in progress" flag.

mod framing;
mod idle;
mod sniff;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use framing::{check_framing, framing_rules, BodyFraming};
pub use idle::Idle;
pub use sniff::HeadSniff;

/// Limits configured at startup.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_client: usize,
    /// Time allowed to send a request's header block (slowloris), also the keep-alive idle time
    /// between requests on the proxy hop.
    pub header_timeout: Duration,
    /// A connection with no bytes either way for this long is closed (tunnels included).
    pub idle_timeout: Duration,
    /// Longest request target (request line) accepted.
    pub max_uri_len: usize,
    /// Largest WebSocket message (or frame) relayed (`--max-websocket-message`): each is held
    /// whole to be inspected.
    pub max_websocket_message: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_connections_per_client: 256,
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
            max_uri_len: 8 * 1024,
            max_websocket_message: 16 * 1024 * 1024,
        }
    }
}

/// Counts open connections, in total and per client address.
#[derive(Debug, Default)]
pub struct ConnectionCounter {
    inner: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// Held for the life of a connection; releases its slot on drop.
#[derive(Debug)]
pub struct ConnectionSlot {
    counter: Arc<ConnectionCounter>,
    ip: IpAddr,
}

impl ConnectionCounter {
    /// Takes a slot, or says which cap was hit.
    pub fn acquire(
        self: &Arc<Self>,
        ip: IpAddr,
        limits: &Limits,
    ) -> Result<ConnectionSlot, String> {
        let mut g = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if g.0 >= limits.max_connections {
            return Err(format!(
                "latchkey has {} connections open, its limit",
                limits.max_connections
            ));
        }
        let per = g.1.get(&ip).copied().unwrap_or(0);
        if per >= limits.max_connections_per_client {
            return Err(format!(
                "client {ip} has {per} connections open, the per-client limit"
            ));
        }
        g.0 += 1;
        *g.1.entry(ip).or_insert(0) += 1;
        Ok(ConnectionSlot {
            counter: self.clone(),
            ip,
        })
    }

    /// Open connections now.
    pub fn open(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut g = self
            .counter
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.0 = g.0.saturating_sub(1);
        if let Some(n) = g.1.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                g.1.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_caps_hold_per_client_and_in_total() {
        let limits = Limits {
            max_connections: 3,
            max_connections_per_client: 2,
            ..Limits::default()
        };
        let c = Arc::new(ConnectionCounter::default());
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let s1 = c.acquire(a, &limits).expect("1");
        let _s2 = c.acquire(a, &limits).expect("2");
        assert!(c.acquire(a, &limits).is_err(), "per-client cap");
        let _s3 = c.acquire(b, &limits).expect("3");
        assert!(c.acquire(b, &limits).is_err(), "total cap");
        drop(s1);
        assert!(c.acquire(b, &limits).is_ok());
    }
}

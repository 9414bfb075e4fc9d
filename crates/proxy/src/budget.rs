//! The request-body buffer budget: every byte latchkey holds of a request body (to sign it, to
//! replace a body placeholder, or to inspect a small body whole before dialing) is charged here,
//! against a global cap and a per-client share, so a sandbox cannot make latchkey hold memory
//! by opening many slow uploads.
//!
//! A [`Charge`] is an RAII guard: the bytes it holds are released when it is dropped, which is
//! when the buffer it accounts for is dropped (the body carrying both is sent or abandoned).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The per-client share, when not configured: this fraction of the global budget.
pub const DEFAULT_CLIENT_SHARE_DIVISOR: usize = 8;

/// A charge the budget cannot take.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OverBudget {
    #[error("latchkey is holding {held} bytes of request bodies, its --max-buffered-bytes limit of {limit}")]
    Global { held: usize, limit: usize },
    #[error("client {client} has {held} bytes of request bodies buffered, its share of {limit} (--max-buffered-bytes-per-client)")]
    Client {
        client: IpAddr,
        held: usize,
        limit: usize,
    },
}

/// Bytes held now, in total and per client address.
#[derive(Debug)]
pub struct Budget {
    total: usize,
    per_client: usize,
    held: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

impl Budget {
    /// A budget of `total` bytes; one client may hold at most `per_client` of them.
    pub fn new(total: usize, per_client: usize) -> Arc<Self> {
        Arc::new(Self {
            total,
            per_client: per_client.min(total),
            held: Mutex::new((0, HashMap::new())),
        })
    }

    /// The global limit.
    pub fn limit(&self) -> usize {
        self.total
    }

    /// The per-client limit.
    pub fn client_limit(&self) -> usize {
        self.per_client
    }

    /// Bytes charged now, across every client.
    pub fn in_use(&self) -> usize {
        self.lock().0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (usize, HashMap<IpAddr, usize>)> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An empty charge for `client`, to grow as bytes arrive.
    pub fn start(self: &Arc<Self>, client: IpAddr) -> Charge {
        Charge {
            budget: self.clone(),
            client,
            bytes: 0,
        }
    }

    fn take(&self, client: IpAddr, n: usize) -> Result<(), OverBudget> {
        if n == 0 {
            return Ok(());
        }
        let mut g = self.lock();
        let mine = g.1.get(&client).copied().unwrap_or(0);
        if mine.saturating_add(n) > self.per_client {
            return Err(OverBudget::Client {
                client,
                held: mine,
                limit: self.per_client,
            });
        }
        if g.0.saturating_add(n) > self.total {
            return Err(OverBudget::Global {
                held: g.0,
                limit: self.total,
            });
        }
        g.0 += n;
        *g.1.entry(client).or_insert(0) += n;
        Ok(())
    }

    fn give(&self, client: IpAddr, n: usize) {
        if n == 0 {
            return;
        }
        let mut g = self.lock();
        g.0 = g.0.saturating_sub(n);
        if let Some(mine) = g.1.get_mut(&client) {
            *mine = mine.saturating_sub(n);
            if *mine == 0 {
                g.1.remove(&client);
            }
        }
    }
}

/// Bytes one buffer holds against the budget; released on drop.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<Budget>,
    client: IpAddr,
    bytes: usize,
}

impl Charge {
    /// Charges the buffer's new size (its capacity, not its length: what is really held).
    /// On refusal the charge stays as it was.
    pub fn resize(&mut self, bytes: usize) -> Result<(), OverBudget> {
        if bytes > self.bytes {
            self.budget.take(self.client, bytes - self.bytes)?;
        } else {
            self.budget.give(self.client, self.bytes - bytes);
        }
        self.bytes = bytes;
        Ok(())
    }

    /// Bytes charged.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.give(self.client, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn charges_are_capped_globally_and_per_client_and_released_on_drop() {
        let budget = Budget::new(100, 60);
        let mut a = budget.start(ip(1));
        a.resize(50).expect("within both limits");
        let mut a2 = budget.start(ip(1));
        assert!(matches!(a2.resize(20), Err(OverBudget::Client { .. })));
        assert_eq!(a2.bytes(), 0, "a refused charge holds nothing");
        let mut b = budget.start(ip(2));
        b.resize(50).expect("another client's share");
        let mut c = budget.start(ip(3));
        assert!(matches!(c.resize(1), Err(OverBudget::Global { .. })));
        assert_eq!(budget.in_use(), 100);
        drop(a);
        assert_eq!(budget.in_use(), 50);
        c.resize(40).expect("released bytes are free again");
        c.resize(10).expect("shrinking always works");
        assert_eq!(budget.in_use(), 60);
        drop((b, c, a2));
        assert_eq!(budget.in_use(), 0);
        assert!(budget.lock().1.is_empty(), "no client entry left behind");
    }
}

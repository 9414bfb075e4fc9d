//! The one record opener: a record is opened here ([`open`]), after waiting for room in the
//! audit queue, so a slow audit sink slows the sandbox down instead of growing the queue
//! without bound. Its callers: the pipeline's `handle`, an approval's answer
//! (`admin::approvals`) and a DNS query (`dns::resolver`).
//!
//! The CONNECT gate, SOCKS5, the transparent gate and the token exchanger wait for room the
//! same way (`audit.room()`, then `Proxy::open_record`) in the files of the gate and the
//! exchanger. Records that are not waited for, on purpose: those of work being shed (a
//! connection over the caps or whose head stalled, `Proxy::connection_record`; a DNS message
//! with no room to be read, a DNS client over its rate cap, a DNS connection refused): waiting
//! there would hold the very resource being shed, and they are synchronous; the writer keeps
//! each of them rather than lose it (`audit::writer`).

use std::net::SocketAddr;

use super::super::Generation;
use super::super::Proxy;
use crate::audit::Entry;

/// Waits (asynchronously, holding no thread) for room in the audit queue, then opens the record
/// of one request from `client` as `identity` under `policy` ([`Proxy::open_record`]: secret
/// values in force scrubbed from it, the identity's ceiling on it).
pub async fn open(proxy: &Proxy, client: SocketAddr, identity: &str, policy: &Generation) -> Entry {
    proxy.audit.room().await;
    proxy.open_record(client, identity, policy)
}

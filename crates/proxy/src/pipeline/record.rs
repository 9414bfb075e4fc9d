//! The record openers: a record is opened here, after waiting for room in the audit queue, so
//! a slow audit sink slows the sandbox down instead of growing the queue without bound. A
//! request's or a connection's under an identity through [`open`]: the pipeline's `handle`, a
//! CONNECT (`connect::handle`), SOCKS5, a captured connection (`transparent`), a `407`
//! (`listener`), a token exchange (`exchange`), an approval's answer (`admin::approvals`) and a
//! DNS query (`dns::resolver`). A connection's refused before its identity is known, over the
//! caps or failing SOCKS5 negotiation, through [`open_connection`].
//!
//! Records that are not waited for, on purpose: those of work being shed synchronously (a
//! connection whose head stalled or did not parse, `Proxy::connection_record`; a DNS message
//! with no room to be read, a DNS client over its rate cap, a DNS connection refused): waiting
//! there would hold the very resource being shed; the writer keeps each of them rather than
//! lose it (`audit::writer`).
//!
//! Once open, a record's fields are written through `audit::Entry`'s setters, each by the step
//! that owns it: the listener names what was sent, the gate the authority, rule and upstream,
//! the pipeline's phases the rest.

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

/// Waits for room as [`open`] does, then opens the record of a connection refused before its
/// identity is known (`default`, [`Proxy::connection_record`]), scrubbed with `policy`'s secret
/// values.
pub async fn open_connection(proxy: &Proxy, client: SocketAddr, policy: &Generation) -> Entry {
    proxy.audit.room().await;
    let mut entry = proxy.connection_record(client);
    entry.scrub_with(policy.secrets().clone());
    entry
}

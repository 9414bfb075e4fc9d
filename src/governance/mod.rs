//! Governance: what needs a person, and telling them. Approvals for `ask` rules and unknown
//! destinations ([`approvals`]: parked requests, durable scoped grants), the records they keep
//! ([`record`]), signed one-click links ([`links`]) and the notification outbox ([`notify`]).
//!
//! Everything durable goes through the state store (`crate::state`), so a restart loses
//! nothing and every replica sharing the store sees the same approvals. This module depends on
//! `policy`, `state`, `audit`, `secrets` and (to deliver webhooks through the guarded dialer)
//! `upstream`; never on `proxy`.

pub mod links;
pub mod notify;
pub mod record;

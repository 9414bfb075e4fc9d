//! latchkey's allowlisting DNS resolver (`serve --dns ADDR`) and what it handed out.
//!
//! A sandbox whose only resolver is latchkey learns addresses only for names some rule could
//! allow: A/AAAA answered with latchkey's own address (`--dns-answer self`, DNS-routed mode) or
//! the real addresses through the address guard (`real`, for transparent capture, pinned in
//! `proxy::Pins`, where the transparent listener reads them); NXDOMAIN for every other name; TXT, NULL, ANY, SRV and every other type refused,
//! so DNS carries no tunnel. Every query leaves an audit record (`method = "DNS"`).
//!
//! Files, by concern: [`message`] (hickory-proto messages in and out; no sockets, no policy),
//! [`resolver`] (the answer to a question under the policy in force, and its record),
//! [`rate`] (per-client token buckets) and [`server`] (UDP and TCP sockets, their bounds,
//! shutdown). `resolver` and `server` depend on `proxy` for the policy in force, the guarded
//! dialer, the pins, the audit log and shutdown; nothing in `proxy` depends on `dns`.

// The crates this one uses, under the module names the code knows them by.
use latchkey_audit as audit;
use latchkey_policy as policy;
use latchkey_proxy as proxy;
use latchkey_secrets as secrets;
#[cfg(test)]
use latchkey_upstream as upstream;
use latchkey_wire as wire;
use latchkey_wire::reason;

pub mod message;
pub mod rate;
pub mod resolver;
pub mod server;

pub use message::Transport;
pub use resolver::Style;
pub use server::{serve, DnsConfig, DnsListener};

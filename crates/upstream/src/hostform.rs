//! Host forms as the dialer reads them: a numeric host is an address for the guard, never a
//! name for the resolver.
//!
//! The parser is [`crate::wire::host::parse_ip_host`] (policy normalises hosts with it too);
//! it is re-exported here, where the dialer calls it, beside the tables that pin every odd
//! spelling to the address — and the address class — it means (`hostform_tests.rs`).

#[cfg(test)]
use std::net::IpAddr;

pub use crate::wire::host::{parse_ip_host, HostFormError};

#[cfg(test)]
#[path = "hostform_tests.rs"]
mod tests;

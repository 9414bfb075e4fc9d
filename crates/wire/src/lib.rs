//! Wire-level facts both sides of latchkey must agree on: what a host, a path, a hop-by-hop
//! header, an address range, a size cap, an event stream and a JSON key mean.
//!
//! `policy` (which decides) and `proxy`/`upstream` (which carry bytes) each depend on this
//! module, so neither has to depend on the other for a shared definition. It is a leaf: it
//! depends on nothing in the crate but `reason`, knows no sockets and holds no state.

pub mod files;
pub mod reason;
pub mod redact;

pub mod cidr;
pub mod cut;
pub mod hop;
pub mod host;
pub mod json_keys;
pub mod limits;
pub mod path;
pub mod sse;

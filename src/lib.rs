//! latchkey: a credential-brokering egress proxy for AI-agent sandboxes.
//!
//! This crate is the `latchkey` binary's command line (`cli`) over the workspace's crates,
//! re-exported here under the module names the code and the tests know them by. The crate
//! graph is the architecture: `latchkey-wire` (with `reason` and `files`) and
//! `latchkey-metrics` at the leaves; `state`, `secrets`, `signing`, `policy`, `upstream`,
//! `audit` above them; `governance`, `ship`, `telemetry`; then `proxy`, and `dns` and `admin`
//! over it. See `docs/architecture.md` for the request path, the dependency table and the
//! invariants each crate upholds.

pub use latchkey_admin as admin;
pub use latchkey_audit as audit;
pub mod cli;
pub use latchkey_dns as dns;
pub use latchkey_governance as governance;
pub use latchkey_metrics as metrics;
pub use latchkey_policy as policy;
pub use latchkey_proxy as proxy;
pub use latchkey_review as review;
pub use latchkey_secrets as secrets;
pub use latchkey_ship as ship;
pub use latchkey_signing as signing;
pub use latchkey_state as state;
pub use latchkey_stores as stores;
pub use latchkey_telemetry as telemetry;
pub use latchkey_upstream as upstream;
pub use latchkey_wire as wire;
pub use latchkey_wire::{files, reason};

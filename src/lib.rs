//! latchkey: a credential-brokering egress proxy for AI-agent sandboxes.
//!
//! The public surface is deliberately small: load a [`policy::Policy`], open an
//! [`audit::AuditLog`], build a [`proxy::Proxy`] and serve — or let [`cli::serve::build`] do it
//! from `serve`'s flags. [`wire`] holds what `policy` and `proxy`/`upstream` share, so
//! dependencies point inward. See `docs/architecture.md` for the request path, the dependency
//! matrix and the invariants each module upholds.

pub mod admin;
pub mod audit;
pub mod cli;
pub mod dns;
pub mod files;
pub mod governance;
pub mod metrics;
pub mod policy;
pub mod proxy;
pub mod reason;
pub mod secrets;
pub mod ship;
pub mod signing;
pub mod state;
pub mod telemetry;
pub mod upstream;
pub mod wire;

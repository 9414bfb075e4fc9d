//! latchkey: a credential-brokering egress proxy for AI-agent sandboxes.
//!
//! The public surface is deliberately small: load a [`policy::Policy`], open an
//! [`audit::AuditLog`], build a [`proxy::Proxy`] and serve. See `docs/architecture.md` for the request path
//! and the invariants each module upholds.

pub mod admin;
pub mod audit;
pub mod demo;
pub mod metrics;
pub mod policy;
pub mod policy_cli;
pub mod proxy;
pub mod reason;
pub mod sandbox_env;
pub mod secrets;
pub mod signing;
pub mod upstream;
pub mod wire;

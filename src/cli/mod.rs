//! The commands behind `latchkey`'s command line, as library code `main` dispatches to.
//!
//! [`args`] is what clap parses; each command has its module: [`serve`] (flags to a running
//! proxy; [`serve::build`] also serves in-process callers), [`policy`] (`check`, `test`,
//! `explain`), [`diff`] (what a policy change newly allows), [`learn`] (rules from audit
//! logs), [`env`] (with [`trust`]: the JVM truststore and `ca install`), [`ca`], [`demo`] and
//! [`gateway_setup`]. Errors are `anyhow` here, at the edge, printed once by `main`;
//! everything below `cli` returns its own `thiserror` types. Nothing else in the crate depends
//! on `cli`.

pub mod approvals;
pub mod args;
pub mod audit;
pub mod audit_query;
pub mod ca;
pub mod demo;
pub mod diff;
pub mod env;
pub mod gateway_setup;
pub mod learn;
pub mod policy;
pub mod serve;
pub mod trust;

pub use args::{AuditAction, CaAction, Cli, Command, GatewaySetupArgs, Mode, ServeArgs};

//! The offline review tools over a compiled policy: what `latchkey check`, `explain`, `test`,
//! `diff` and `learn` do. Nothing here runs in the proxy: these read a [`policy::Policy`] (the
//! same compiled data the proxy decides with, so they cannot disagree with it) and never a
//! secret value, a socket or live state. Depends on `policy` (and, through it, `wire` and
//! `reason`); only the command line and the admin API's explain endpoint use it.

// The crates this one uses, under the module names the code knows them by.
use latchkey_policy as policy;
use latchkey_wire as wire;
use latchkey_wire::reason;

pub mod cases;
pub mod diff;
pub mod explain;
pub mod learn;
pub mod lint;

#[cfg(test)]
mod tests;

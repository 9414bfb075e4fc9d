//! The commands behind `latchkey`'s command line, as library code `main` dispatches to.
//!
//! [`args`] is what clap parses; each command has its module: [`serve`] (flags to a running
//! proxy; [`serve::build`] also serves in-process callers), [`policy`] (`check`, `test`,
//! `explain`), [`diff`] (what a policy change newly allows), [`learn`] (rules from audit
//! logs), [`env`] (with [`trust`]: the JVM truststore and `ca install`), [`ca`], [`demo`] and
//! [`gateway_setup`]. Errors are `anyhow` here, at the edge, printed once by `main`;
//! everything below `cli` returns its own `thiserror` types. Nothing else in the crate depends
//! on `cli`.

mod admin_client;
pub mod approvals;
pub mod args;
pub mod audit;
pub mod audit_query;
pub mod ca;
mod check_stores;
mod config;
pub mod demo;
pub mod diff;
pub mod env;
pub mod gateway_setup;
pub mod generate;
pub mod given;
pub mod health;
pub mod learn;
pub mod policy;
pub mod serve;
mod serve_help;
mod serve_start;
mod serve_stores;
pub mod sessions;
pub mod trust;
mod upstream_proxy;

pub use args::{AuditAction, CaAction, Cli, Command, GatewaySetupArgs, Mode, ServeArgs};

#[cfg(test)]
mod tests {
    use crate::reason::chain_text;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read {path}: {source}")]
    struct Quoting {
        path: String,
        source: std::io::Error,
    }

    #[test]
    fn a_cause_the_message_already_quotes_is_not_repeated_and_others_are_kept() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let quoted = anyhow::Error::new(Quoting {
            path: "a.jsonl".into(),
            source: io(),
        });
        assert_eq!(
            chain_text(quoted.as_ref()),
            "cannot read a.jsonl: no such file"
        );
        let wrapped = anyhow::Error::new(io()).context("loading policies");
        assert_eq!(
            chain_text(wrapped.as_ref()),
            "loading policies: no such file"
        );
        let both = anyhow::Error::new(Quoting {
            path: "b".into(),
            source: io(),
        })
        .context("learn");
        assert_eq!(
            chain_text(both.as_ref()),
            "learn: cannot read b: no such file"
        );
    }
}

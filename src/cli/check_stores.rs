//! `latchkey check` and secrets held in stores: without `--no-secrets`, every `vault:`,
//! `aws-sm:` and `aws-ssm:` secret is fetched once — through the same guarded client `serve`
//! uses (address guard, verified TLS, each connection's CA and ranges) — and every one that
//! cannot be is reported at once, at its declaration, never with its value.
//!
//! The way out is `serve`'s, as its variables give it in this environment
//! (`LATCHKEY_UPSTREAM_CA`, `LATCHKEY_RESOLVE`, `LATCHKEY_ALLOW_PRIVATE`,
//! `LATCHKEY_UPSTREAM_PROXY*`, `LATCHKEY_CONNECT_TIMEOUT`): `check` run beside `serve` (the same
//! container, the same variables) reaches the stores as `serve` will.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::policy::{Policy, PolicyError};
use crate::secrets::SecretStore;
use crate::upstream::token_transport::TokenClient;
use crate::upstream::{tls_config, Clients, Dialer, UpstreamConfig};

/// `serve`'s flags as this environment's `LATCHKEY_*` variables give them (no command line).
#[derive(clap::Parser)]
struct FromEnv {
    #[command(flatten)]
    serve: super::args::ServeArgs,
}

/// The way out `serve` would take here: its upstream settings from the variables.
fn serve_upstream() -> Result<UpstreamConfig, String> {
    use clap::Parser;
    let args = FromEnv::try_parse_from(["latchkey serve"])
        .map_err(|e| format!("the LATCHKEY_* variables `serve` reads: {e}"))?;
    super::serve::upstream_config(&args.serve).map_err(|e| format!("{e:#}"))
}

/// How long `check` waits for one store's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

/// Fetches every secret of `policy` held in a store, once; a problem for each that could not
/// be fetched (none when the policy holds none in a store).
pub(super) fn fetch_once(policy: &Policy) -> Vec<PolicyError> {
    let remote: Vec<_> = policy
        .secret_sources()
        .iter()
        .filter(|(_, s)| s.is_remote())
        .cloned()
        .collect();
    if remote.is_empty() {
        return Vec::new();
    }
    let failures = match fetch(remote) {
        Ok(failures) => failures,
        Err(why) => vec![(String::new(), why)],
    };
    failures
        .into_iter()
        .map(|(name, why)| match policy.secret_origin(&name) {
            Some((origin, field)) => PolicyError {
                file: origin.file.clone(),
                line: origin.line,
                col: 1,
                message: format!("{field}: {why}"),
            },
            None => PolicyError {
                file: PathBuf::new(),
                line: 0,
                col: 0,
                message: why,
            },
        })
        .collect()
}

fn fetch(sources: Vec<(String, crate::secrets::Source)>) -> Result<Vec<(String, String)>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async move {
        let config = serve_upstream()?;
        let tls = tls_config(config.extra_ca.as_deref()).map_err(|e| e.to_string())?;
        let clients = Clients::new(
            Arc::new(Dialer::new(&config)),
            Arc::new(tls),
            config.extra_ca.as_deref(),
        );
        let transport = Arc::new(TokenClient::new(Arc::new(clients), ANSWER_TIMEOUT));
        let store = SecretStore::load(sources).map_err(|failures| {
            failures
                .into_iter()
                .map(|(n, why)| format!("secret {n:?}: {why}"))
                .collect::<Vec<_>>()
                .join("; ")
        })?;
        // latchkey's own AWS identity from this process's environment (no instance metadata:
        // `check` is a review tool; `serve --aws-imds` is where metadata is opted into).
        let aws = Arc::new(crate::signing::AwsIdentity::from_process_env(None));
        store.set_fetcher(Arc::new(crate::stores::Stores::new(transport, aws)));
        Ok(store.fetch_remote().await)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_way_out_is_read_from_the_variables_alone() {
        // No command line: every flag has a default or is optional.
        let config = serve_upstream().expect("serve's defaults");
        assert!(config.proxy.is_none() || std::env::var_os("LATCHKEY_UPSTREAM_PROXY").is_some());
    }
}

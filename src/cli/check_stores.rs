//! `latchkey check` and secrets held in stores: without `--no-secrets`, every `vault:`,
//! `aws-sm:` and `aws-ssm:` secret is fetched once — through the same guarded client `serve`
//! uses (address guard, verified TLS, each connection's CA and ranges) — and every one that
//! cannot be is reported at once, at its declaration, never with its value.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::policy::{Policy, PolicyError};
use crate::secrets::SecretStore;
use crate::upstream::token_transport::TokenClient;
use crate::upstream::{tls_config, Clients, Dialer, UpstreamConfig};

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
        let config = UpstreamConfig::default();
        let tls = tls_config(None).map_err(|e| e.to_string())?;
        let clients = Clients::new(Arc::new(Dialer::new(&config)), Arc::new(tls), None);
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

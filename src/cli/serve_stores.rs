//! `latchkey serve` and secrets held in stores (Vault/OpenBao, AWS Secrets Manager and SSM):
//! the fetcher the secret store is given — latchkey's own calls through the guarded, audited
//! client — and the first fetch of every such secret before the first connection is accepted,
//! which refuses, waits or serves on per `--secrets-startup`.

use std::sync::Arc;
use std::time::Duration;

use super::args::SecretsStartup;
use super::given::flag;
use crate::proxy::{OwnCalls, Proxy};

/// The longest `--secrets-startup wait` sleeps between two attempts.
const WAIT_AT_MOST: Duration = Duration::from_secs(30);

/// Gives every generation's secret store the way to its stores, then fetches every secret
/// held in one. Returns an error (every secret named, never a value) when one cannot be
/// fetched and `mode` is `refuse`.
pub(super) async fn start_stores(proxy: &Arc<Proxy>, mode: SecretsStartup) -> anyhow::Result<()> {
    let transport = Arc::new(OwnCalls::new(proxy));
    let aws = proxy
        .aws_identity()
        .cloned()
        .unwrap_or_else(|| Arc::new(crate::signing::AwsIdentity::from_process_env(None)));
    let stores = crate::stores::Stores::new(transport, aws);
    let generation = proxy.policy();
    let secrets = generation.secrets();
    secrets.set_fetcher(Arc::new(stores));
    let remote = generation
        .secret_sources()
        .iter()
        .filter(|(_, s)| s.is_remote())
        .count();
    if remote == 0 {
        return Ok(());
    }
    let mut pause = Duration::from_secs(1);
    loop {
        let failures = secrets.fetch_remote().await;
        if failures.is_empty() {
            tracing::info!(secrets = remote, "every secret held in a store was fetched");
            return Ok(());
        }
        let lines: Vec<String> = failures
            .iter()
            .map(|(name, why)| format!("  secret {name:?}: {why}"))
            .collect();
        let list = lines.join("\n");
        match mode {
            SecretsStartup::Refuse => anyhow::bail!(
                "{} of {remote} secrets held in stores could not be fetched:\n{list}\n({} wait keeps trying; {} serve starts without them)",
                failures.len(),
                flag("secrets_startup"),
                flag("secrets_startup"),
            ),
            SecretsStartup::Serve => {
                tracing::warn!(failed = failures.len(), "serving without secrets that could not be fetched; requests that need them get 503 secret_unavailable until they are");
                eprintln!("latchkey: serving without {} secret(s) held in stores:\n{list}", failures.len());
                return Ok(());
            }
            SecretsStartup::Wait => {
                tracing::warn!(failed = failures.len(), retry_in = ?pause, "waiting for secrets held in stores; no connection is accepted until every one is fetched");
                eprintln!(
                    "latchkey: waiting for {} secret(s) held in stores (next try in {}s):\n{list}",
                    failures.len(),
                    pause.as_secs()
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(WAIT_AT_MOST);
            }
        }
    }
}

//! Secret stores: how latchkey reads a secret held in Vault/OpenBao, AWS Secrets Manager or
//! AWS SSM Parameter Store — the implementation of `secrets::Fetch` the secret store is given
//! when serving starts (and `latchkey check` when it fetches once).
//!
//! This crate speaks each store's protocol over signing's narrow [`TokenTransport`] (the
//! guarded, audited client the proxy provides; a plain guarded one for `check`): it opens no
//! socket and imports nothing from `upstream`, `proxy` or `policy`. AWS calls are signed with
//! latchkey's own AWS identity (`signing::AwsIdentity`: the standard provider chain), never a
//! sandbox's.
//!
//! Files: `vault` (login, token renewal, KV v1/v2 and dynamic secrets with their leases),
//! `aws` (Secrets Manager `GetSecretValue`, SSM `GetParameter`).

// The crates this one uses, under the module names the code knows them by.
use latchkey_secrets as secrets;
use latchkey_signing as signing;

mod aws;
mod vault;
mod vault_auth;
mod vault_fields;
mod vault_http;

use std::sync::Arc;

use crate::secrets::remote::BoxFuture;
use crate::secrets::{Fetch, Fetched, Location};
use crate::signing::TokenTransport;

/// Every store latchkey reads, over one transport.
pub struct Stores {
    transport: Arc<dyn TokenTransport>,
    /// latchkey's own AWS identity, which signs the AWS stores' calls.
    aws: Arc<signing::AwsIdentity>,
    /// Vault/OpenBao clients, one per connection's settings.
    vault: vault::Vault,
}

impl Stores {
    pub fn new(transport: Arc<dyn TokenTransport>, aws: Arc<signing::AwsIdentity>) -> Self {
        Self {
            vault: vault::Vault::new(transport.clone()),
            transport,
            aws,
        }
    }
}

impl Fetch for Stores {
    fn fetch<'a>(
        &'a self,
        name: &'a str,
        at: &'a Location,
    ) -> BoxFuture<'a, Result<Fetched, String>> {
        Box::pin(async move {
            let transport = self.transport.as_ref();
            match at {
                Location::Vault { .. } => self.vault.fetch(name, at).await,
                Location::AwsSm {
                    id,
                    json_key,
                    stage,
                    version_id,
                    region,
                } => {
                    let s = aws::SmSecret {
                        id,
                        json_key: json_key.as_deref(),
                        stage: stage.as_deref(),
                        version_id: version_id.as_deref(),
                        region: region.as_deref(),
                    };
                    aws::secrets_manager(&self.aws, transport, name, s).await
                }
                Location::AwsSsm {
                    name: param,
                    version,
                    region,
                } => {
                    aws::ssm(
                        &self.aws,
                        transport,
                        name,
                        (param, *version, region.as_deref()),
                    )
                    .await
                }
            }
        })
    }
}

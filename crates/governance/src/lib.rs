//! Governance: what needs a person, and telling them. Approvals for `ask` rules and unknown
//! destinations ([`approvals`]: parked requests, durable scoped grants), the records they keep
//! ([`record`]), signed one-click links ([`links`]), the notification outbox ([`notify`]) and
//! answers from a Slack message's buttons ([`slack`]).
//! Workload-token attestation ([`attest`]) verifies who a sandbox is from a signed token.
//!
//! Everything durable goes through the state store (`crate::state`), so a restart loses
//! nothing and every replica sharing the store sees the same approvals. This module depends on
//! `policy`, `state`, `audit`, `secrets` and (to deliver webhooks through the guarded dialer)
//! `upstream`; never on `proxy`.

// The crates this one uses, under the module names the code knows them by.
use latchkey_audit as audit;
use latchkey_policy as policy;
use latchkey_secrets as secrets;
use latchkey_state as state;
use latchkey_upstream as upstream;
use latchkey_wire as wire;
use latchkey_wire::reason;

pub mod approvals;
pub mod attest;
pub mod export;
pub mod limits;
pub mod links;
pub mod notify;
pub mod record;
pub mod sessions;
pub mod slack;
pub mod usage;

use std::sync::Arc;

use crate::state::StateStore;

/// What a running latchkey uses to ask people: the approvals on its state store, and how
/// approvers reach it.
#[derive(Debug)]
pub struct Governance {
    pub approvals: approvals::Approvals,
    /// Signs and checks one-click links; the key is shared by every replica on the store.
    pub signer: links::Signer,
    /// The admin listener's URL as approvers reach it (`--approval-url`); `None`: no links in
    /// notifications.
    pub public_url: Option<url::Url>,
}

impl Governance {
    /// Governance over `store`: loads (or, first on this store, makes) the shared keys.
    pub async fn open(
        store: Arc<dyn StateStore>,
        public_url: Option<url::Url>,
    ) -> Result<Self, crate::state::StateError> {
        let signer = links::Signer::new(links::load_or_create_key(store.as_ref()).await?);
        Ok(Self {
            approvals: approvals::Approvals::open(store).await?,
            signer,
            public_url,
        })
    }

    pub fn store(&self) -> &Arc<dyn StateStore> {
        self.approvals.store()
    }

    /// Signed links for `approval`'s chat buttons, when approvers have a URL to reach.
    pub fn links(&self, approval: &record::Approval) -> Option<record::Links> {
        self.public_url
            .as_ref()
            .map(|base| links::links_for(base, approval, &self.signer))
    }

    /// Queues an `approval.requested` notice for each notifier in `names` (every `[notify.*]`
    /// when empty), with signed links (or, for an interactive Slack notifier, signed button
    /// values).
    pub async fn announce(
        &self,
        policy: &crate::policy::Policy,
        names: &[String],
        approval: &record::Approval,
    ) -> Result<usize, crate::state::StateError> {
        let links = self.links(approval);
        notify::enqueue(
            self.store().as_ref(),
            policy,
            names,
            "approval.requested",
            &approval.public(),
            notify::Buttons {
                links,
                signer: Some(&self.signer),
            },
        )
        .await
    }

    /// Queues an `approval.decided` notice for the notifiers that heard of the request.
    pub async fn decided(
        &self,
        policy: &crate::policy::Policy,
        approval: &record::Approval,
    ) -> Result<usize, crate::state::StateError> {
        let names = policy
            .rules()
            .iter()
            .find(|r| r.name == approval.rule)
            .and_then(|r| r.ask.as_ref())
            .unwrap_or(&policy.ask().terms)
            .notify
            .clone();
        notify::enqueue(
            self.store().as_ref(),
            policy,
            &names,
            "approval.decided",
            &approval.public(),
            notify::Buttons::default(),
        )
        .await
    }
}

#[cfg(test)]
mod limits_inflight_tests;
#[cfg(test)]
mod limits_tests;

//! Governance: what needs a person, and telling them. Approvals for `ask` rules and unknown
//! destinations ([`approvals`]: parked requests, durable scoped grants), the records they keep
//! ([`record`]), signed one-click links ([`links`]) and the notification outbox ([`notify`]).
//!
//! Everything durable goes through the state store (`crate::state`), so a restart loses
//! nothing and every replica sharing the store sees the same approvals. This module depends on
//! `policy`, `state`, `audit`, `secrets` and (to deliver webhooks through the guarded dialer)
//! `upstream`; never on `proxy`.

pub mod approvals;
pub mod record;

use std::sync::Arc;

use crate::state::StateStore;

/// What a running latchkey uses to ask people: the approvals on its state store, and how
/// approvers reach it.
#[derive(Debug)]
pub struct Governance {
    pub approvals: approvals::Approvals,
    /// The admin listener's URL as approvers reach it (`--approval-url`), for links.
    pub public_url: String,
}

impl Governance {
    /// Governance over `store`: loads (or, first on this store, makes) the shared keys.
    pub async fn open(
        store: Arc<dyn StateStore>,
        public_url: String,
    ) -> Result<Self, crate::state::StateError> {
        Ok(Self {
            approvals: approvals::Approvals::open(store).await?,
            public_url,
        })
    }

    pub fn store(&self) -> &Arc<dyn StateStore> {
        self.approvals.store()
    }
}

impl Governance {
    /// Queues an `approval.requested` notice for each notifier in `names` (every `[notify.*]`
    /// when empty).
    pub async fn announce(
        &self,
        policy: &crate::policy::Policy,
        names: &[String],
        approval: &record::Approval,
    ) -> Result<usize, crate::state::StateError> {
        self.queue(policy, names, "approval.requested", approval)
            .await
    }

    async fn queue(
        &self,
        policy: &crate::policy::Policy,
        names: &[String],
        event: &str,
        approval: &record::Approval,
    ) -> Result<usize, crate::state::StateError> {
        let mut queued = 0;
        for n in policy
            .notifiers()
            .iter()
            .filter(|n| names.is_empty() || names.contains(&n.name))
        {
            let notice = record::Notice {
                notifier: n.name.clone(),
                event: event.to_string(),
                approval: approval.public(),
                links: None,
            };
            let id = format!("{}-{event}-{}", approval.id, n.name);
            let doc = serde_json::to_vec(&notice).unwrap_or_default();
            self.store()
                .enqueue(
                    record::QUEUE_NOTIFY,
                    &id,
                    &doc,
                    std::time::SystemTime::now(),
                )
                .await?;
            queued += 1;
        }
        Ok(queued)
    }
}

impl Governance {
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
        self.queue(policy, &names, "approval.decided", approval)
            .await
    }
}

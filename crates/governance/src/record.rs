//! The records approvals keep in the state store, and what the admin API, the CLI and
//! notifications show of them. Field names are a contract (book "Approvals").
//!
//! An approval holds no secret: the URL's query values are redacted and the whole record is
//! scrubbed of secret values before it is stored; the body is described by its size, SHA-256
//! and a short scrubbed preview of a JSON body.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// State-store namespace of approvals, by id.
pub const NS_APPROVAL: &str = "approval";
/// Queue of notifications waiting to be delivered (the outbox).
pub const QUEUE_NOTIFY: &str = "notify";
/// Channel on which a decided approval's id is published (wakes held requests everywhere).
pub const CHANNEL_DECIDED: &str = "approval.decided";

/// Where an approval is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Pending,
    Approved,
    Denied,
    /// Nobody answered before `expires`.
    Expired,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Approved => "approved",
            State::Denied => "denied",
            State::Expired => "expired",
        }
    }
}

/// A person's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// `approve` or `deny`.
    pub decision: String,
    /// The scope granted (`once`, `1h`, `session`); `None` on a denial.
    pub scope: Option<String>,
    pub note: Option<String>,
    /// Who answered: `admin-api`, `cli`, `link`, or a name the approver gave.
    pub by: String,
    #[serde(with = "rfc3339")]
    pub at: SystemTime,
}

/// One approval request, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    pub id: String,
    pub state: State,
    #[serde(with = "rfc3339")]
    pub created: SystemTime,
    /// A pending approval nobody answered by then is `expired`.
    #[serde(with = "rfc3339")]
    pub expires: SystemTime,
    pub identity: String,
    /// The identity's labels from policy.
    pub labels: BTreeMap<String, String>,
    /// The sandbox's address as latchkey saw it.
    pub client: String,
    pub method: String,
    /// `scheme://host[:port]/path?query` with every query value redacted.
    pub url: String,
    pub scheme: String,
    pub host: String,
    pub port: u16,
    /// The path without the query.
    pub path: String,
    /// The rule that asks, or `unknown` (`[ask] unknown = true`: no rule allows it).
    pub rule: String,
    /// For `unknown`: why policy alone would deny it (`no_rule`, `method_not_allowed`, …).
    pub denial: Option<String>,
    /// The rule's `ask.message`.
    pub message: Option<String>,
    /// The scopes an approver may grant; the first is the default.
    pub scopes: Vec<String>,
    pub body_bytes: u64,
    /// Hex SHA-256 of the request body as the sandbox sent it.
    pub body_sha256: String,
    /// The start of a JSON body, secret values and placeholders redacted; `None` for other bodies.
    pub preview: Option<String>,
    /// The audit id of the request that asked.
    pub request_id: String,
    /// The policy digest in force when it asked.
    pub policy: String,
    pub answer: Option<Answer>,
    /// Keyed hash of (identity, method, full URL, body hash): how a retry finds this approval.
    /// Internal: not shown by the API.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fingerprint: String,
    /// Keyed hash of the identity's token (or sources) when it asked: a `session` grant holds
    /// until this changes. Internal.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub session: String,
}

impl Approval {
    /// The record as the API, the CLI and notifications show it: the internal hashes left out.
    pub fn public(&self) -> Approval {
        Approval {
            fingerprint: String::new(),
            session: String::new(),
            ..self.clone()
        }
    }

    /// The state as of `now`: a pending approval past its expiry is `expired`.
    pub fn state_at(&self, now: SystemTime) -> State {
        if self.state == State::Pending && now >= self.expires {
            State::Expired
        } else {
            self.state
        }
    }
}

/// One item of the notification outbox: what to tell which notifier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// The `[notify.NAME]` it goes to.
    pub notifier: String,
    /// `approval.requested` or `approval.decided`.
    pub event: String,
    /// The approval, public form ([`Approval::public`]).
    pub approval: Approval,
    /// Signed one-click links, when latchkey knows its public admin URL (never for a notifier
    /// whose buttons are interactive).
    pub links: Option<Links>,
    /// The values of an interactive Slack notifier's buttons (`signing_secret`), answered
    /// through `POST /slack/actions/NAME`; `None` for every other notifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actions: Option<Actions>,
}

/// The values of interactive chat buttons: each a compact JSON answer (approval id,
/// decision, scope, expiry) signed for one notifier ([`crate::slack::ActionValue`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actions {
    /// Scope → the value of the button that approves with that scope.
    pub approve: BTreeMap<String, String>,
    pub deny: String,
}

/// Signed one-click links for chat buttons: each opens a confirmation page on the admin
/// listener; the button there answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Links {
    /// Scope → link that approves with that scope.
    pub approve: BTreeMap<String, String>,
    pub deny: String,
}

/// RFC 3339 timestamps (UTC, milliseconds) in records.
pub mod rfc3339 {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_rfc3339_millis(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_rfc3339(&text).map_err(serde::de::Error::custom)
    }
}

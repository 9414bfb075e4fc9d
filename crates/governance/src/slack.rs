//! Answering approvals from a Slack message's buttons ("interactivity"): what a `format =
//! "slack"` notifier with `signing_secret` needs besides its messages. Its buttons carry an
//! [`ActionValue`] (approval id, decision, scope, expiry, signed for that notifier with the
//! link key under a context of their own, so a value is never a working link); Slack POSTs a
//! click to the admin listener's `/slack/actions/NAME`, which checks Slack's request signature
//! ([`verify_request`]), reads the `block_actions` payload ([`parse_interaction`]) and answers
//! the approval, then updates the message through the payload's `response_url` — only when it
//! is on the notifier's own host ([`response_target`]).
//!
//! Pure checks and payloads, plus the one POST ([`post`]); the HTTP endpoint is the admin
//! crate's. Depends on `policy` (the notifier), `upstream` (the guarded client) and
//! `governance::{links, notify, record}`.

use std::time::{Duration, SystemTime};

use aws_lc_rs::hmac;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::links::{unix, Signer};
use super::notify::{slack_payload, DELIVERY_TIMEOUT, EVENT_DECIDED};
use super::record::{Actions, Approval, Notice};
use crate::policy::ask::is_slack_user_id;
use crate::upstream::{find_upstream_error, Client};

/// The largest interaction body read; a larger one is refused unread.
pub const MAX_BODY: usize = 64 * 1024;
/// A request whose timestamp is further than this from now (either way) is refused.
pub const TOLERANCE: Duration = Duration::from_secs(5 * 60);
/// Slack's limit on a button's `value`.
pub const MAX_VALUE: usize = 2000;

/// What a button answers: approval `id`, `decision` (`approve` with a `scope`, or `deny`),
/// valid until `exp` (UNIX seconds), `sig` over all of them and the notifier's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionValue {
    pub id: String,
    pub decision: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    pub exp: String,
    pub sig: String,
}

impl ActionValue {
    /// Signed for `notifier` with `signer`, valid until the approval expires.
    fn signed(
        signer: &Signer,
        notifier: &str,
        approval: &Approval,
        decision: &str,
        scope: Option<&str>,
    ) -> String {
        let (exp, sig) =
            signer.sign_action(notifier, &approval.id, decision, scope, approval.expires);
        let value = ActionValue {
            id: approval.id.clone(),
            decision: decision.to_string(),
            scope: scope.map(str::to_string),
            exp,
            sig,
        };
        serde_json::to_string(&value).unwrap_or_default()
    }

    /// Checks the value's signature for `notifier` and its expiry.
    pub fn verify(
        &self,
        signer: &Signer,
        notifier: &str,
        now: SystemTime,
    ) -> Result<(), super::links::LinkError> {
        let answer = super::links::SignedAnswer {
            id: &self.id,
            decision: &self.decision,
            scope: self.scope.as_deref(),
            exp: &self.exp,
            sig: &self.sig,
        };
        signer.verify_action(notifier, answer, now)
    }
}

/// The values of `approval`'s buttons for `notifier`: one per approve scope, and deny.
pub fn actions_for(notifier: &str, approval: &Approval, signer: &Signer) -> Actions {
    Actions {
        approve: approval
            .scopes
            .iter()
            .map(|scope| {
                let value = ActionValue::signed(signer, notifier, approval, "approve", Some(scope));
                (scope.clone(), value)
            })
            .collect(),
        deny: ActionValue::signed(signer, notifier, approval, "deny", None),
    }
}

/// Why a request is not taken as Slack's. Names no value (neither secret nor signature).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("no X-Slack-Request-Timestamp")]
    NoTimestamp,
    #[error("X-Slack-Request-Timestamp is not UNIX seconds")]
    BadTimestamp,
    #[error("no X-Slack-Signature")]
    NoSignature,
    #[error("X-Slack-Signature is not v0= and 64 hex digits")]
    MalformedSignature,
    #[error("X-Slack-Signature does not match the body")]
    BadSignature,
    #[error("X-Slack-Request-Timestamp is more than 5 minutes from now")]
    Stale,
}

/// `v0=` and the hex HMAC-SHA256 of `v0:{timestamp}:{body}` under `secret`, as Slack signs.
pub fn signature(secret: &[u8], timestamp: &str, body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    format!(
        "v0={}",
        hex::encode(hmac::sign(&key, &signed_text(timestamp.as_bytes(), body)))
    )
}

fn signed_text(timestamp: &[u8], body: &[u8]) -> Vec<u8> {
    let mut text = Vec::with_capacity(body.len() + timestamp.len() + 4);
    text.extend_from_slice(b"v0:");
    text.extend_from_slice(timestamp);
    text.push(b':');
    text.extend_from_slice(body);
    text
}

/// Checks Slack's request signature over the raw `body` (the headers' bytes as received):
/// their form, then the HMAC (compared in constant time), then that the timestamp is within
/// [`TOLERANCE`] of `now`, so only a genuine request is ever told it is stale.
pub fn verify_request(
    secret: &[u8],
    timestamp: Option<&[u8]>,
    signature: Option<&[u8]>,
    body: &[u8],
    now: SystemTime,
) -> Result<(), VerifyError> {
    let timestamp = timestamp.ok_or(VerifyError::NoTimestamp)?;
    let seconds = std::str::from_utf8(timestamp)
        .ok()
        .filter(|t| (1..=12).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<u64>().ok())
        .ok_or(VerifyError::BadTimestamp)?;
    let signature = signature.ok_or(VerifyError::NoSignature)?;
    let tag = signature
        .strip_prefix(b"v0=")
        .filter(|hex| hex.len() == 64)
        .and_then(|hex| hex::decode(hex).ok())
        .ok_or(VerifyError::MalformedSignature)?;
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    hmac::verify(&key, &signed_text(timestamp, body), &tag)
        .map_err(|_| VerifyError::BadSignature)?;
    if unix(now).abs_diff(seconds) > TOLERANCE.as_secs() {
        return Err(VerifyError::Stale);
    }
    Ok(())
}

/// One click, as Slack reported it (signed) and latchkey reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interaction {
    /// The Slack user ID of who clicked (`U…`/`W…`).
    pub user_id: String,
    /// Their user name, reduced to letters, digits, `.`, `_` and `-`; `None` when Slack gave
    /// none (or nothing was left).
    pub user_name: Option<String>,
    pub value: ActionValue,
    /// Where to answer the message (a capability: never logged); `None` when absent.
    pub response_url: Option<url::Url>,
}

impl Interaction {
    /// Who answered, as approvals and the audit log record it: `slack:U012AB3CD (ana)`.
    pub fn by(&self) -> String {
        match &self.user_name {
            Some(name) => format!("slack:{} ({name})", self.user_id),
            None => format!("slack:{}", self.user_id),
        }
    }
}

#[derive(Deserialize)]
struct RawPayload {
    #[serde(rename = "type")]
    kind: String,
    user: RawUser,
    #[serde(default)]
    actions: Vec<RawAction>,
    #[serde(default)]
    response_url: Option<String>,
}

#[derive(Deserialize)]
struct RawUser {
    id: String,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct RawAction {
    #[serde(default)]
    value: Option<String>,
}

/// Reads an interaction body (`application/x-www-form-urlencoded` with one `payload`, a
/// `block_actions` JSON object with one action). `Err`: what is wrong, naming no value.
pub fn parse_interaction(body: &[u8]) -> Result<Interaction, String> {
    let mut payloads = form_urlencoded::parse(body).filter(|(k, _)| k == "payload");
    let payload = payloads.next().ok_or("the body has no payload field")?.1;
    if payloads.next().is_some() {
        return Err("the body has more than one payload field".to_string());
    }
    let raw: RawPayload = serde_json::from_str(&payload)
        .map_err(|e| format!("the payload is not a Slack interaction: {}", serde_line(&e)))?;
    if raw.kind != "block_actions" {
        return Err(format!(
            "payload type {:?} is not block_actions",
            super::notify::clip(&raw.kind, 40)
        ));
    }
    if !is_slack_user_id(&raw.user.id) {
        return Err("user.id is not a Slack user ID".to_string());
    }
    let [action] = raw.actions.as_slice() else {
        return Err(format!(
            "the payload has {} actions, not one",
            raw.actions.len()
        ));
    };
    let value = action
        .value
        .as_deref()
        .filter(|v| v.len() <= MAX_VALUE)
        .ok_or("the action has no value of latchkey's")?;
    let value: ActionValue = serde_json::from_str(value)
        .map_err(|_| "the action's value is not an answer of latchkey's".to_string())?;
    let response_url = match raw.response_url.as_deref() {
        None | Some("") => None,
        Some(u) => Some(
            url::Url::parse(u)
                .ok()
                .filter(|u| u.has_host())
                .ok_or("response_url is not an absolute URL")?,
        ),
    };
    let user_name = raw
        .user
        .username
        .or(raw.user.name)
        .map(|n| {
            n.chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, '.' | '_' | '-'))
                .take(64)
                .collect::<String>()
        })
        .filter(|n| !n.is_empty());
    Ok(Interaction {
        user_id: raw.user.id,
        user_name,
        value,
        response_url,
    })
}

/// Where a serde error is, without the text it quotes.
fn serde_line(e: &serde_json::Error) -> String {
    match e.classify() {
        serde_json::error::Category::Data => format!("unexpected shape at column {}", e.column()),
        _ => format!("not JSON (column {})", e.column()),
    }
}

/// Whether latchkey may POST to `response` for the notifier whose webhook is `notifier`:
/// `https` (or the webhook's own scheme), no user or password, and the webhook's host and
/// port — for a real Slack app both are `hooks.slack.com`. `Err` names the host, never the
/// path (which is a capability).
pub fn response_target(notifier: &url::Url, response: &url::Url) -> Result<(), String> {
    let host = response.host_str().unwrap_or_default();
    if response.scheme() != "https" && response.scheme() != notifier.scheme() {
        return Err(format!(
            "response_url on {host} is {}:, not https: or the webhook's",
            response.scheme()
        ));
    }
    if !response.username().is_empty() || response.password().is_some() {
        return Err(format!("response_url on {host} carries a user or password"));
    }
    if response.host() != notifier.host()
        || response.port_or_known_default() != notifier.port_or_known_default()
    {
        return Err(format!(
            "response_url host {host}:{} is not the webhook's ({}:{})",
            response.port_or_known_default().unwrap_or_default(),
            notifier.host_str().unwrap_or_default(),
            notifier.port_or_known_default().unwrap_or_default()
        ));
    }
    Ok(())
}

/// A reply only the clicking user sees, leaving the message as it is.
pub fn ephemeral(text: &str) -> Value {
    json!({"response_type": "ephemeral", "replace_original": false, "text": text})
}

/// The message as it should read once `approval` is decided (the decided rendering: the
/// outcome, no buttons), replacing the one clicked.
pub fn replacement(notifier: &str, approval: &Approval) -> Value {
    let notice = Notice {
        notifier: notifier.to_string(),
        event: EVENT_DECIDED.to_string(),
        approval: approval.public(),
        links: None,
        actions: None,
    };
    let mut value = slack_payload(&notice);
    value["replace_original"] = Value::Bool(true);
    value
}

/// POSTs `body` (JSON, already scrubbed) to `url` through the guarded client within the
/// delivery timeout; the answer's status. `Err` names the host at most, never the path.
pub async fn post(client: &Client, url: &url::Url, body: Vec<u8>) -> Result<u16, String> {
    let req = http::Request::post(url.as_str())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(
            http_body_util::Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed(),
        )
        .map_err(|_| "cannot build the request".to_string())?;
    let exchange = async {
        // Neither error names the URL's path: the upstream's names the host, the client's
        // its kind.
        let res = client
            .request(req)
            .await
            .map_err(|e| match find_upstream_error(&e) {
                Some(u) => u.to_string(),
                None => e.to_string(),
            })?;
        let status = res.status().as_u16();
        super::notify::drain(res.into_body()).await;
        Ok::<_, String>(status)
    };
    tokio::time::timeout(DELIVERY_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer within {}s", DELIVERY_TIMEOUT.as_secs()))?
}

#[cfg(test)]
#[path = "slack_tests.rs"]
mod tests;

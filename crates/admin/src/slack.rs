//! `POST /slack/actions/NAME`: a click on an interactive button of `[notify.NAME]`'s Slack
//! message (a `format = "slack"` notifier with `signing_secret`). Not behind the admin token —
//! Slack cannot send one — so the request's own signature is the credential, checked before
//! anything is read into an answer:
//!
//! 1. `NAME` is a notifier of the policy in force with `signing_secret` (else `404`);
//! 2. the body is at most 64 KiB (else `413`, a declared larger one refused unread);
//! 3. `X-Slack-Signature` is Slack's HMAC of the body under the signing secret and
//!    `X-Slack-Request-Timestamp` within 5 minutes of now (else `401`);
//! 4. the body is one `block_actions` click (else `400`) on a button latchkey signed for this
//!    notifier (else `403`; expired: told so);
//! 5. the user is one of the notifier's `approvers` when it names any (else told so).
//!
//! Then the approval is answered as the admin API answers it (`take_answer`: the audit record,
//! the held request released) with `by = "slack:USERID (username)"`, Slack gets its `200` at
//! once, and the message is replaced with the outcome — or the user alone is told why nothing
//! was answered — by a POST to the payload's `response_url`, in a task of its own, through the
//! guarded client, scrubbed like every delivery, and only when that URL is on the notifier's
//! own webhook host. Neither the signing secret, a signature nor a `response_url`'s path is
//! ever logged or echoed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::json;

use super::approvals::{take_answer, AnswerBody};
use super::{json, Body};
use crate::governance::links::LinkError;
use crate::governance::notify::{mrkdwn, scrubbed};
use crate::governance::record::State;
use crate::governance::slack::{self as chat, Interaction, MAX_BODY};
use crate::governance::Governance;
use crate::policy::ask::slack_signing_key;
use crate::policy::Notifier;
use crate::proxy::Proxy;

/// The path under which each interactive notifier takes its clicks.
const PREFIX: &str = "/slack/actions/";

/// Whether `path` is a Slack interaction endpoint's: answered without the admin token.
pub fn is_action(path: &str) -> bool {
    path.starts_with(PREFIX)
}

/// Serves `POST /slack/actions/NAME` (see the module's documentation).
pub async fn route(proxy: &Arc<Proxy>, peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
    let name = req.uri().path()[PREFIX.len()..].to_string();
    if req.method() != Method::POST {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: Slack POSTs interactions",
        );
    }
    let generation = proxy.policy();
    let notifier = generation
        .notifiers()
        .iter()
        .find(|n| n.name == name && n.interactive)
        .cloned();
    let Some(notifier) = notifier else {
        refused(
            peer,
            &name,
            "no [notify.NAME] of that name with signing_secret",
        );
        return error(
            StatusCode::NOT_FOUND,
            "no Slack notifier of that name with a signing_secret: nothing was answered",
        );
    };
    let Some(gov) = proxy.governance().cloned() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "latchkey has no state store: approvals are unavailable",
        );
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        refused(peer, &name, "body larger than 64 KiB (refused unread)");
        return too_large();
    }
    let header_bytes = |name: &str| req.headers().get(name).map(|v| v.as_bytes().to_vec());
    let timestamp = header_bytes("x-slack-request-timestamp");
    let signature = header_bytes("x-slack-signature");
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            refused(peer, &name, "body larger than 64 KiB");
            return too_large();
        }
        Err(_) => return error(StatusCode::BAD_REQUEST, "cannot read the body"),
    };
    let secret = match generation.secrets().get(&slack_signing_key(&name)).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(notifier = %name, error = %e, "Slack interaction refused: the notifier's signing_secret cannot be read");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the notifier's signing secret cannot be read: nothing was answered",
            );
        }
    };
    let verified = chat::verify_request(
        secret.expose(),
        timestamp.as_deref(),
        signature.as_deref(),
        &body,
        SystemTime::now(),
    );
    if let Err(e) = verified {
        refused(peer, &name, &e.to_string());
        return error(
            StatusCode::UNAUTHORIZED,
            &format!("not a request from Slack ({e}): nothing was answered"),
        );
    }
    let click = match chat::parse_interaction(&body) {
        Ok(c) => c,
        Err(why) => {
            refused(peer, &name, &why);
            return error(
                StatusCode::BAD_REQUEST,
                &format!("{why}: nothing was answered"),
            );
        }
    };
    let reply = Reply {
        proxy: proxy.clone(),
        notifier,
        target: click.response_url.clone(),
    };
    answer(proxy, &gov, peer, &reply, &click).await
}

/// Checks the click's button and user, then answers the approval it names.
async fn answer(
    proxy: &Arc<Proxy>,
    gov: &Governance,
    peer: SocketAddr,
    reply: &Reply,
    click: &Interaction,
) -> Response<Body> {
    let name = reply.notifier.name.as_str();
    let value = &click.value;
    match value.verify(&gov.signer, name, SystemTime::now()) {
        Ok(()) => {}
        Err(LinkError::Expired) => {
            return reply.tell(format!(
                "Approval `{}` has expired: its buttons no longer answer. Nothing was answered.",
                mrkdwn(&value.id)
            ))
        }
        Err(e) => {
            refused(peer, name, &format!("the button's value: {e}"));
            return error(
                StatusCode::FORBIDDEN,
                "the button's answer is not one latchkey signed for this notifier: nothing was answered",
            );
        }
    }
    let approvers = &reply.notifier.approvers;
    if !approvers.is_empty() && !approvers.contains(&click.user_id) {
        tracing::warn!(client.addr = %peer, notifier = %name, approval.id = %value.id, by = %click.by(),
            "Slack interaction refused: not one of the notifier's approvers");
        return reply.tell(format!(
            "You are not one of the approvers of `[notify.{name}]`: nothing was answered."
        ));
    }
    let body = AnswerBody {
        decision: value.decision.clone(),
        scope: value.scope.clone(),
        note: None,
        by: None,
    };
    match take_answer(proxy, gov, peer, &value.id, body, &click.by()).await {
        Ok(a) => {
            reply.send(chat::replacement(name, &a));
            let scope = a
                .answer
                .as_ref()
                .and_then(|x| x.scope.as_deref())
                .map(|s| format!(" ({s})"))
                .unwrap_or_default();
            json(
                StatusCode::OK,
                &json!({"answered": true,
                    "text": format!("approval {} {}{scope} by {}", a.id, a.state.as_str(), click.by())}),
            )
        }
        Err((StatusCode::CONFLICT, _)) => reply.tell(already(gov, &value.id).await),
        Err((StatusCode::SERVICE_UNAVAILABLE, why)) => {
            reply.send(chat::ephemeral(
                "latchkey's state store cannot answer now: nothing was answered. Try again.",
            ));
            error(StatusCode::SERVICE_UNAVAILABLE, &why)
        }
        Err((_, why)) => reply.tell(format!("Nothing was answered: {}", mrkdwn(&why))),
    }
}

/// What an approver is told of an approval answered (or expired) before their click.
async fn already(gov: &Governance, id: &str) -> String {
    let now = SystemTime::now();
    let approval = match gov.approvals.get(id).await {
        Ok(Some(a)) => a,
        _ => return format!("Approval `{}` cannot be answered any more.", mrkdwn(id)),
    };
    let when = |t| humantime::format_rfc3339_seconds(t).to_string();
    match (approval.state_at(now), &approval.answer) {
        (State::Approved | State::Denied, Some(answer)) => format!(
            "Approval `{}` was already {} by {} at {}: nothing was answered.",
            mrkdwn(id),
            approval.state.as_str(),
            mrkdwn(&answer.by),
            when(answer.at)
        ),
        (State::Expired, _) => format!(
            "Approval `{}` expired at {}: nothing was answered.",
            mrkdwn(id),
            when(approval.expires)
        ),
        (state, _) => format!(
            "Approval `{}` is {}: nothing was answered.",
            mrkdwn(id),
            state.as_str()
        ),
    }
}

/// Answers to one click, through its `response_url`.
struct Reply {
    proxy: Arc<Proxy>,
    notifier: Notifier,
    target: Option<url::Url>,
}

impl Reply {
    /// Tells the user alone `text` (nothing was answered): `200`, and an ephemeral message.
    fn tell(&self, text: String) -> Response<Body> {
        self.send(chat::ephemeral(&text));
        json(StatusCode::OK, &json!({"answered": false, "text": text}))
    }

    /// POSTs `value`, scrubbed, to the click's `response_url` in a task of its own, if that URL
    /// is on the notifier's webhook host; else only says why in the log (naming the host).
    fn send(&self, value: serde_json::Value) {
        let name = self.notifier.name.clone();
        let Some(url) = self.target.clone() else {
            tracing::warn!(notifier = %name, "the Slack interaction has no response_url: the message is not updated");
            return;
        };
        if let Err(why) = chat::response_target(&self.notifier.url, &url) {
            tracing::warn!(notifier = %name, "{why}: not posted (the answer stands)");
            return;
        }
        let body = match self.proxy.policy().secrets().scrubber() {
            Ok(scrubber) => scrubbed(value, scrubber.as_deref()),
            Err(e) => {
                tracing::warn!(notifier = %name, error = %e, "cannot scrub the Slack reply: not posted");
                return;
            }
        };
        let client = self.proxy.upstream_client();
        tokio::spawn(async move {
            let host = url.host_str().unwrap_or_default().to_string();
            match chat::post(&client, &url, body).await {
                Ok(status) if (200..300).contains(&status) => {
                    tracing::debug!(notifier = %name, host = %host, "Slack message updated");
                }
                Ok(status) => {
                    tracing::warn!(notifier = %name, host = %host, status, "Slack did not take the message update");
                }
                Err(e) => {
                    tracing::warn!(notifier = %name, host = %host, error = %e, "cannot update the Slack message");
                }
            }
        });
    }
}

/// Logs a refused interaction: who sent it, for which notifier, why (never a value).
fn refused(peer: SocketAddr, notifier: &str, why: &str) {
    let notifier: String = notifier.chars().take(64).collect();
    tracing::warn!(client.addr = %peer, notifier = ?notifier, reason = %why, "Slack interaction refused");
}

fn too_large() -> Response<Body> {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!(
            "the body is larger than {} KiB: nothing was answered",
            MAX_BODY / 1024
        ),
    )
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    json(status, &json!({ "error": message }))
}

//! The ask phase: a request that needs a person (a rule's `ask`, or `[ask] unknown`) waits for
//! one.
//!
//! Its body is read whole first (bounded: it is held for as long as the question is open), so
//! the question can show its size, SHA-256 and a preview, and a retry can be matched to it.
//! Then, in order: a grant that covers it lets it on; an answer already given to this exact
//! request stands; otherwise an approval is stored (one per distinct request; the identity's
//! rate of new questions capped), the notifiers are told, and the request is held up to the
//! rule's `hold`. Every exit is a verdict for the record: `allowed` under an approval,
//! `approval_pending` (retry later: `x-latchkey-approval`, `retry-after`), `approval_denied`,
//! `rate_limited`, or `state_unavailable` when the store cannot answer (fail closed).

use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::request::Parts;

use super::super::request_body::{hold_whole, BodyCx, Inbound, NotHeld};
use super::super::{Generation, Proxy};
use super::admit::Admitted;
use super::request::Req;
use crate::audit::{ApprovalInfo, Entry};
use crate::governance::approvals::{Asked, Found, Key};
use crate::governance::record::{Approval, State};
use crate::governance::Governance;
use crate::policy::identity::token_key;
use crate::policy::{display_url, Asking, Policy};
use crate::reason::{Reason, Refusal};
use crate::state::StateError;

/// Most of a request body held while it waits for a person.
pub const MAX_HELD_BODY: usize = 1024 * 1024;
/// The preview of a JSON body shown to approvers, in characters.
const PREVIEW_CHARS: usize = 512;
/// What is scrubbed before the preview is cut (so a secret straddling the cut is still found).
const PREVIEW_SCAN: usize = 64 * 1024;

/// Holds the request until a person answers, or refuses it; a request that needs nobody goes
/// on untouched.
///
/// Assumes: the request was admitted and `req.asking` is `policy.asks()` for its decision.
/// Guarantees: on `Ok` after asking, a person approved this request (now, or by a standing
/// grant), the body is held whole in `req.inbound`, and the record's `approval` says which
/// approval. On `Err`, nothing was sent upstream.
pub(super) async fn ask(req: &mut Req<'_>) -> Result<(), Refusal> {
    let Some((asking, denial)) = req.asking.take() else {
        return Ok(());
    };
    let rule = asking.rule_name().to_string();
    let under = |r: Refusal| r.under(&rule);
    let gov = req.proxy.governance().ok_or_else(|| {
        under(Refusal::new(
            Reason::StateUnavailable,
            "this request needs a person's approval, and latchkey has no state store to keep it",
        ))
    })?;
    // Nobody is asked about what could never be sent: latchkey's own addresses (its admin API),
    // metadata and private ranges the guard refuses, names that do not resolve.
    reachable(req.proxy, &asking, &req.target)
        .await
        .map_err(under)?;
    // A body an earlier phase held (an MCP message) is the one asked about.
    let held = match req.inbound.take() {
        Some(held) => held,
        None => hold_body(req, "a request that waits for approval")
            .await
            .map_err(under)?,
    };
    let Inbound::Held(bytes, _, _) = &held else {
        return Err(under(Refusal::new(
            Reason::BadRequest,
            "the request body was not held",
        )));
    };
    unambiguous(&req.head, bytes).map_err(under)?;
    let sha = hex::encode(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes));
    let (ctx, target) = (req.ctx, &req.target);
    let full_url = display_url(
        target.scheme,
        &target.host,
        target.port,
        &target.path_and_query,
    );
    let approvals = &gov.approvals;
    let method = req.head.method.as_str();
    let who = principal(ctx);
    let fingerprint = approvals.fingerprint(&who, method, &full_url, &sha);
    let credential = match &ctx.session {
        // A `session` grant lasts as long as the runtime session.
        Some(live) => live.id.as_bytes().to_vec(),
        None => session_credential(req.policy, &ctx.identity).await,
    };
    let session = approvals.session(&who, &credential);
    let q = Question {
        asking,
        denial,
        rule: &rule,
        body: bytes,
        sha: &sha,
        fingerprint: &fingerprint,
        session: &session,
    };
    let pending = match find_or_ask(req, gov, &q).await.map_err(under)? {
        Some(pending) => pending,
        None => {
            req.inbound = Some(held);
            return Ok(());
        }
    };
    wait(req, gov, &q, pending).await.map_err(under)?;
    req.inbound = Some(held);
    Ok(())
}

/// What a question is about: the request's body, its digest and its identity for approvals.
struct Question<'q> {
    asking: Asking<'q>,
    denial: Option<Reason>,
    /// The rule's name for approvals and grants ([`Asking::rule_name`]).
    rule: &'q str,
    body: &'q Bytes,
    sha: &'q str,
    fingerprint: &'q str,
    session: &'q str,
}

/// A standing grant (`None`: go on), a standing denial, or the approval this request waits on
/// (an open one, or a new one, announced).
async fn find_or_ask(
    req: &mut Req<'_>,
    gov: &Governance,
    q: &Question<'_>,
) -> Result<Option<Approval>, Refusal> {
    let approvals = &gov.approvals;
    let who = principal(req.ctx);
    let key = Key {
        identity: &who,
        rule: q.rule,
        host: &req.target.host,
        fingerprint: q.fingerprint,
        session: q.session,
    };
    let found = approvals
        .find(&key, SystemTime::now())
        .await
        .map_err(|e| state_down(&e))?;
    match found {
        Found::Granted(g) => {
            req.entry.set_approval(ApprovalInfo {
                id: g.approval.clone(),
                state: State::Approved.as_str(),
                scope: Some(g.scope.clone()),
                grant: Some(g.scope.clone()),
                ..ApprovalInfo::default()
            });
            Ok(None)
        }
        Found::Denied(a) => Err(denied(req.entry, &a)),
        Found::Pending(a) => Ok(Some(a)),
        Found::Nothing => {
            let approval = Approval {
                fingerprint: q.fingerprint.to_string(),
                session: q.session.to_string(),
                ..question(req, q)
            };
            let ask_policy = req.policy.ask();
            let now = SystemTime::now();
            let asked = approvals
                .ask(approval, ask_policy.rate, ask_policy.rate_window, now)
                .await
                .map_err(|e| state_down(&e))?;
            match asked {
                Asked::New(a) => {
                    tracing::info!(audit.id = %req.entry.id(), approval.id = %a.id, rule = %q.rule, url.host = %req.target.host, "asked a person");
                    announce(gov, req.policy, &q.asking, &a).await;
                    Ok(Some(a))
                }
                Asked::Existing(a) => Ok(Some(a)),
                Asked::Denied(a) => Err(denied(req.entry, &a)),
                Asked::RateLimited(wait) => {
                    req.entry.set_retry_after(wait.as_secs().max(1));
                    Err(Refusal::new(
                        Reason::RateLimited,
                        format!(
                            "identity '{}' asked for more than {} approvals in {}; nobody was asked about this one",
                            principal(req.ctx),
                            ask_policy.rate,
                            humantime::format_duration(ask_policy.rate_window)
                        ),
                    ))
                }
            }
        }
    }
}

/// Holds the request up to the rule's `hold` for `pending` to be answered.
///
/// Guarantees: `Ok` only when a person approved it and this request took the grant; a client
/// that leaves while held leaves the record `approval_pending`.
async fn wait(
    req: &mut Req<'_>,
    gov: &Governance,
    q: &Question<'_>,
    pending: Approval,
) -> Result<(), Refusal> {
    let approvals = &gov.approvals;
    let who = principal(req.ctx);
    let key = Key {
        identity: &who,
        rule: q.rule,
        host: &req.target.host,
        fingerprint: q.fingerprint,
        session: q.session,
    };
    let down = |e: StateError| state_down(&e);
    // Provisionally pending: a client that leaves while held leaves this record.
    req.entry.set_approval(ApprovalInfo {
        id: pending.id.clone(),
        state: State::Pending.as_str(),
        ..ApprovalInfo::default()
    });
    req.entry
        .outcome(Reason::ApprovalPending, Some(q.rule), None);
    let started = Instant::now();
    let hold = q.asking.terms.hold;
    let answered = approvals.wait(&pending.id, hold).await.map_err(down)?;
    let waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let info = |state: State, scope: Option<String>| ApprovalInfo {
        id: pending.id.clone(),
        state: state.as_str(),
        scope,
        waited_ms: Some(waited_ms),
        ..ApprovalInfo::default()
    };
    let now = SystemTime::now();
    match answered.as_ref().map(|a| (a.state_at(now), a)) {
        Some((State::Approved, a)) => {
            // Take the grant the answer left (a `once` grant is used up by this request).
            if let Found::Granted(g) = approvals.find(&key, now).await.map_err(down)? {
                let scope = a
                    .answer
                    .as_ref()
                    .and_then(|x| x.scope.clone())
                    .or(Some(g.scope));
                req.entry.set_approval(info(State::Approved, scope));
                return Ok(());
            }
            // A twin request used the one-time grant first: this one asks again on retry.
            req.entry.set_approval(info(State::Pending, None));
            req.entry.set_retry_after(1);
            Err(Refusal::new(
                Reason::ApprovalPending,
                format!(
                    "approval {} was used by another request; retry to ask again",
                    pending.id
                ),
            ))
        }
        Some((State::Denied, a)) => {
            req.entry.set_approval(info(State::Denied, None));
            Err(denied_message(a))
        }
        _ => {
            req.entry.set_approval(info(State::Pending, None));
            req.entry.set_retry_after(retry_after(hold));
            Err(Refusal::new(
                Reason::ApprovalPending,
                format!(
                    "this request waits for a person's approval ({}; asked {}): retry it after approval",
                    pending.id,
                    if hold.is_zero() {
                        "without holding".to_string()
                    } else {
                        format!("held {}", humantime::format_duration(Duration::from_secs(hold.as_secs())))
                    }
                ),
            ))
        }
    }
}

/// Resolves the target through the address guard, as the dial will: a request the guard would
/// refuse is refused now (`non_public_address`, or why it cannot be reached), before any
/// approval exists.
async fn reachable(proxy: &Proxy, asking: &Asking<'_>, target: &Admitted) -> Result<(), Refusal> {
    let extra = asking.rule.map_or(&[][..], |r| r.allow_private.as_slice());
    match proxy
        .dialer()
        .resolve(&target.host, target.port, extra)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) => Err(Refusal::new(
            e.reason(),
            format!("nobody was asked about this request: {e}"),
        )),
    }
}

/// Reads the request body whole, charged to the buffer budget, at most [`MAX_HELD_BODY`];
/// `what` names the request in a refusal ("a request that waits for approval").
pub(super) async fn hold_body(req: &mut Req<'_>, what: &str) -> Result<Inbound, Refusal> {
    // Held already by an earlier phase (the predicates phase): the same bytes.
    match req.inbound.take() {
        Some(held @ Inbound::Held(..)) => return Ok(held),
        other => req.inbound = other,
    }
    let incoming = req.take_body()?;
    let proxy = req.proxy;
    let cx = BodyCx {
        budget: &proxy.budget,
        client: req.ctx.client.ip(),
        body_timeout: proxy.body_timeout,
    };
    let host = &req.target.host;
    hold_whole(
        incoming,
        &req.head.headers,
        MAX_HELD_BODY,
        cx,
        |why| match why {
            NotHeld::TooLarge => format!(
                "{what} is held whole, and this body to {host} is over {} KiB",
                MAX_HELD_BODY / 1024
            ),
            NotHeld::TooBusy(why) => {
                format!(
                    "cannot hold this request body for host {host} ({what}): {why}; retry later"
                )
            }
        },
    )
    .await
}

/// The approval record for this request: everything an approver needs, nothing secret (the
/// URL's query values redacted, then the whole record's text scrubbed of secret values).
fn question(req: &Req<'_>, q: &Question<'_>) -> Approval {
    let (policy, ctx, target, head, entry) =
        (req.policy, req.ctx, &req.target, &req.head, &*req.entry);
    let (asking, denial, body, sha) = (&q.asking, q.denial, q.body, q.sha);
    let now = SystemTime::now();
    let shown = crate::audit::redact_query(&target.path_and_query);
    let url = entry.scrub_text(&display_url(
        target.scheme,
        &target.host,
        target.port,
        &shown,
    ));
    let labels = match &ctx.session {
        Some(live) => live.labels.clone(),
        None => policy
            .identity(&ctx.identity)
            .map(|i| i.labels.clone())
            .unwrap_or_default(),
    };
    Approval {
        id: crate::audit::new_id(),
        state: State::Pending,
        created: now,
        expires: now + policy.ask().expire,
        identity: principal(ctx).into_owned(),
        labels,
        client: ctx.client.to_string(),
        method: entry.scrub_text(head.method.as_str()),
        url,
        scheme: target.scheme.as_str().to_string(),
        host: entry.scrub_text(&target.host),
        port: target.port,
        path: entry.scrub_text(&crate::audit::redact_query(target.path())),
        rule: asking.rule_name().to_string(),
        denial: denial.map(|d| d.code().to_string()),
        message: asking.terms.message.clone(),
        scopes: asking
            .terms
            .scopes
            .iter()
            .map(ToString::to_string)
            .collect(),
        body_bytes: body.len() as u64,
        body_sha256: sha.to_string(),
        preview: preview(head, body, |t| entry.scrub_text(t)),
        request_id: entry.id().to_string(),
        policy: policy.digest().to_string(),
        answer: None,
        fingerprint: String::new(),
        session: String::new(),
    }
}

/// Whether an approver is shown a preview of `body`: JSON, by its media type or its first
/// byte.
fn json_body(head: &Parts, body: &[u8]) -> bool {
    let json_type = head
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.to_ascii_lowercase().contains("json"));
    let starts_json = body
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| matches!(b, b'{' | b'['));
    !body.is_empty() && (json_type || starts_json)
}

/// Refuses a JSON body with more than one reading (keys that collide, at any depth) before
/// anyone is asked about it: an approver shown one value could approve the other.
fn unambiguous(head: &Parts, body: &[u8]) -> Result<(), Refusal> {
    if !json_body(head, body) {
        return Ok(());
    }
    match crate::wire::json_keys::ambiguity(body) {
        None => Ok(()),
        Some(why) => Err(Refusal::new(
            Reason::BadRequest,
            format!("nobody was asked about this request: its JSON body has more than one reading ({why}); an approver could be shown one value and approve another. Send each key once"),
        )),
    }
}

/// The start of a JSON body as sent (never parsed and re-serialised: that would show one
/// reading of it), scrubbed, bounded, with what a screen would hide made visible; `None` for
/// anything else.
fn preview(head: &Parts, body: &[u8], scrub: impl Fn(&str) -> String) -> Option<String> {
    if !json_body(head, body) {
        return None;
    }
    let scan = &body[..body.len().min(PREVIEW_SCAN)];
    let scrubbed = scrub(&String::from_utf8_lossy(scan));
    let shown = as_sent(&scrubbed, PREVIEW_CHARS);
    let cut = scrubbed.chars().count() > PREVIEW_CHARS || scan.len() < body.len();
    Some(if cut { format!("{shown}…") } else { shown })
}

/// `text`'s first `max` characters, each control, bidirectional or invisible formatting
/// character written as a `\u{…}` escape (a line feed and a tab stay), so what an approver
/// reads is what the bytes say.
fn as_sent(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max * 2));
    for c in text.chars().take(max) {
        let hidden = (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}');
        if hidden {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// Who asks, for approvals, grants and the approvals rate: the identity, or under a runtime
/// session `PROFILE@SESSION_ID`, so one session's grant (or request rate) is never another's.
fn principal(ctx: &super::Ctx) -> std::borrow::Cow<'_, str> {
    match &ctx.session {
        Some(live) => std::borrow::Cow::Owned(format!("{}@{}", ctx.identity, live.id)),
        None => std::borrow::Cow::Borrowed(&ctx.identity),
    }
}

/// What a `session` grant is tied to: the identity's token as it is now (so a new token ends
/// the session), else its sources.
async fn session_credential(policy: &Generation, identity: &str) -> Vec<u8> {
    let Some(id) = policy.identity(identity) else {
        return identity.as_bytes().to_vec();
    };
    if id.has_token {
        if let Ok(token) = policy.secrets().get(&token_key(identity)).await {
            return token.expose().to_vec();
        }
    }
    id.sources
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
        .into_bytes()
}

/// Tells the notifiers a new approval waits.
async fn announce(gov: &Governance, policy: &Policy, asking: &Asking<'_>, approval: &Approval) {
    if let Err(e) = gov.announce(policy, &asking.terms.notify, approval).await {
        tracing::error!(approval.id = %approval.id, error = %e, "cannot queue the approval's notifications");
    }
}

fn denied(entry: &mut Entry, a: &Approval) -> Refusal {
    entry.set_approval(ApprovalInfo {
        id: a.id.clone(),
        state: State::Denied.as_str(),
        ..ApprovalInfo::default()
    });
    denied_message(a)
}

fn denied_message(a: &Approval) -> Refusal {
    let by = a.answer.as_ref().map_or("a person", |x| x.by.as_str());
    Refusal::new(
        Reason::ApprovalDenied,
        format!("{by} denied this request (approval {})", a.id),
    )
}

fn state_down(e: &StateError) -> Refusal {
    Refusal::new(
        Reason::StateUnavailable,
        format!("this request needs a person's approval and the state store cannot be used: {e}"),
    )
}

/// The `retry-after` for a request still waiting: about when a person may have answered.
fn retry_after(hold: Duration) -> u64 {
    hold.as_secs().clamp(5, 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(content_type: &str) -> Parts {
        let (parts, ()) = http::Request::post("https://api.test/deploy")
            .header(http::header::CONTENT_TYPE, content_type)
            .body(())
            .unwrap_or_default()
            .into_parts();
        parts
    }

    fn shown(content_type: &str, body: &str) -> Option<String> {
        preview(&head(content_type), body.as_bytes(), |t| {
            t.replace("sk-SECRET-1234", "[REDACTED]")
        })
    }

    /// The preview is the body as sent: key order, spacing, escapes and number spellings are
    /// the sandbox's, not a parser's.
    #[test]
    fn the_preview_is_the_body_as_sent_never_a_parsed_reading() {
        for body in [
            r#"{"env":"production","env":"staging"}"#,
            r#"{ "b": 1.0, "a": 100000000000000000001, "s": "A" }"#,
            "[1, 2]\n",
            r#"{"broken": "#,
        ] {
            assert_eq!(shown("application/json", body).as_deref(), Some(body));
        }
        // JSON by its first byte, whatever the media type says; other bodies have none.
        assert!(shown("text/plain", " {\"a\":1}").is_some());
        assert_eq!(shown("text/plain", "a=1&a=2"), None);
        assert_eq!(shown("application/json", ""), None);
    }

    #[test]
    fn the_preview_is_scrubbed_bounded_and_shows_hidden_characters() {
        let body = format!(r#"{{"key":"sk-SECRET-1234","pad":"{}"}}"#, "x".repeat(2000));
        let p = shown("application/json", &body).unwrap_or_default();
        assert!(p.starts_with(r#"{"key":"[REDACTED]","pad":"xxx"#), "{p}");
        assert_eq!(p.chars().count(), PREVIEW_CHARS + 1, "{p}");
        assert!(p.ends_with('…'));
        let p = shown("application/json", "{\"a\":\"x\u{202e}y\u{0}z\r\"}").unwrap_or_default();
        assert_eq!(p, r#"{"a":"x\u{202e}y\u{0}z\u{d}"}"#);
    }

    #[test]
    fn an_ambiguous_json_body_is_refused_before_anyone_is_asked() {
        for body in [
            r#"{"env":"production","env":"staging"}"#,
            r#"{"deploy":{"env":"production","Env":"staging"}}"#,
        ] {
            let r = unambiguous(&head("application/json"), body.as_bytes()).err();
            let r = r.unwrap_or_else(|| panic!("{body} passed"));
            assert_eq!(r.reason, Reason::BadRequest);
            assert!(r.message.contains("more than one reading"), "{}", r.message);
        }
        // By its first byte too; a form body is not JSON.
        assert!(unambiguous(&head("text/plain"), br#"{"a":1,"a":2}"#).is_err());
        assert!(unambiguous(&head("application/x-www-form-urlencoded"), b"a=1&a=2").is_ok());
        assert!(unambiguous(&head("application/json"), br#"{"a":1,"b":{"a":2}}"#).is_ok());
    }
}

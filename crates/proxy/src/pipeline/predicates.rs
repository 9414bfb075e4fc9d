//! The predicates phase: a decision whose denials or rule read the request **body** (`body`,
//! `graphql` predicates) is settled here, before anything is sent — the body held whole,
//! charged to the buffer budget, at most `BodyCheck::max_bytes` — by
//! `Policy::decide_body`. The head's part (host, method, path, `query`, `headers`) was decided
//! in the decide phase; a request no predicate reads the body of passes this phase without a
//! byte read.
//!
//! A refusal names the denial (`denied_by_rule`) or the rule and its predicate
//! (`predicate_mismatch`), never a value from the body. Under report-only the request goes on,
//! marked `would_deny`, under the empty report rule (no secret rides on a would-be denial).

use super::super::request_body::Inbound;
use super::ask;
use super::decide::WouldDeny;
use super::request::Req;
use crate::reason::{Reason, Refusal};

/// The predicates phase. Assumes: the verdict is in; `req.pending` is the decision the decide
/// phase left for the body. Guarantees: on `Ok`, no pending check remains (the body, if it was
/// read, is held in `req.inbound` for the phases after); a request a denial or a predicate
/// refuses is an `Err` naming it, unless report-only marked it.
pub(super) async fn check<'a>(req: &mut Req<'a>) -> Result<(), Refusal> {
    let Some(pending) = req.pending.take() else {
        return Ok(());
    };
    let (proxy, policy): (
        &'a std::sync::Arc<super::super::Proxy>,
        &'a super::super::Generation,
    ) = (req.proxy, req.policy);
    let held = match req.inbound.take() {
        Some(held @ Inbound::Held(..)) => held,
        other => {
            req.inbound = other;
            ask::hold_body(req, "a request a policy predicate reads").await?
        }
    };
    let Inbound::Held(bytes, _, _) = &held else {
        return Err(Refusal::new(
            Reason::BadRequest,
            "the request body was not held",
        ));
    };
    let content_type = req
        .head
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let query = req.target.path_and_query.split_once('?').map(|(_, q)| q);
    let settled = policy.decide_body(&pending, &req.head.method, query, content_type, bytes);
    req.inbound = Some(held);
    if settled.allowed() {
        return Ok(());
    }
    let rule = settled.rule.map(|r| r.name.clone());
    let message = req.entry.scrub_text(&settled.message);
    let report = settled.reason.is_policy_denial()
        && (proxy.report_all || settled.rule.is_some_and(|r| r.report));
    if report {
        tracing::warn!(audit.id = %req.entry.id(), reason = settled.reason.code(), message = %message, "report-only: would deny");
        req.entry.would_deny(settled.reason);
        req.verdict.would_deny = Some(WouldDeny {
            reason: settled.reason,
            closest: settled.rule.map(|r| r.name.as_str()),
            message,
        });
        // Under the empty report rule from here on: nothing the rule injects rides on it.
        req.verdict.rule = &proxy.report_rule;
        return Ok(());
    }
    let refusal = Refusal::new(settled.reason, message);
    Err(match rule {
        Some(name) => refusal.under(&name),
        None => refusal,
    })
}

//! The mcp phase: under a rule with `mcp`, a POST's JSON-RPC messages are held whole and
//! matched (`proxy::mcp::inspect`) before anything is sent. (A WebSocket's messages are
//! matched by its relay: `proxy::mcp_socket`.)
//!
//! A refused message is not a [`Refusal`]: the agent speaks JSON-RPC, so the answer is a
//! JSON-RPC error (HTTP 200) built by `proxy::mcp`, recorded through the record phase like any
//! answer, with reason `mcp_not_allowed`. A body that is not JSON-RPC at all is a `bad_request`
//! refusal. Under report-only the messages go on, marked `would_deny`.

use std::sync::Arc;

use http::request::Parts;
use hyper::body::Incoming;
use serde_json::Value;

use super::super::mcp::{self, Inspected};
use super::super::request_body::Inbound;
use super::super::Proxy;
use super::decide::{Verdict, WouldDeny};
use super::{ask, Answer, Ctx};
use crate::audit::Entry;
use crate::policy::mcp::McpRules;
use crate::policy::Rule;
use crate::reason::{Reason, Refusal};

/// What the mcp phase hands on.
pub(super) enum Step {
    /// Go on: the body, when this phase read it, and the `tools/list` requests whose results
    /// are to be filtered.
    Go(Option<Inbound>, Option<(Arc<McpRules>, Vec<Value>)>),
    /// Refused: the JSON-RPC answer, already recorded as the outcome.
    Answered(Answer),
}

/// Assumes: `rule` is the verdict's rule. Guarantees: `Go` only when the rule has no `mcp`,
/// the request carries no message (a bodiless GET or DELETE), every message is allowed, or
/// report-only marked the verdict;
/// `Answered` has sent nothing upstream.
#[allow(clippy::too_many_arguments)]
pub(super) async fn check<'a>(
    proxy: &Proxy,
    ctx: &Ctx,
    rule: &'a Rule,
    head: &Parts,
    body: &mut Option<Incoming>,
    host: &str,
    entry: &mut Entry,
    verdict: &mut Verdict<'a>,
) -> Result<Step, Refusal> {
    let Some(rules) = rule.mcp.as_ref() else {
        return Ok(Step::Go(None, None));
    };
    // GET opens the server's event stream, DELETE ends a session: no message to read. Any
    // request that carries a body is read, whatever its method: a server may take JSON-RPC in
    // a PUT as well.
    let bodiless = body.as_ref().is_none_or(http_body::Body::is_end_stream);
    if head.method != http::Method::POST && bodiless {
        return Ok(Step::Go(None, None));
    }
    let under = |r: Refusal| r.under(&rule.name);
    let held = ask::hold_body(proxy, ctx, head, body, host, "an MCP message")
        .await
        .map_err(under)?;
    let Inbound::Held(bytes, _, _) = &held else {
        return Err(under(Refusal::new(
            Reason::BadRequest,
            "the request body was not held",
        )));
    };
    // An empty body on another method (`Content-Length: 0`, an empty chunked body) is no message.
    if head.method != http::Method::POST && bytes.is_empty() {
        return Ok(Step::Go(Some(held), None));
    }
    match mcp::inspect(rules, &rule.name, bytes).map_err(under)? {
        Inspected::Forward { info, list_ids } => {
            let info = mcp::for_the_record(info, entry);
            entry.update(|r| r.mcp = Some(info));
            // Report-only changes nothing the sandbox sees: the listing is left whole.
            let report = proxy.report_all || rule.report;
            let list = (rules.filter_list && !report && !list_ids.is_empty())
                .then(|| (rules.clone(), list_ids));
            Ok(Step::Go(Some(held), list))
        }
        Inspected::Refuse {
            info,
            message,
            answer,
        } => {
            let response = mcp::refused_response(&rule.name, answer);
            let info = mcp::for_the_record(info, entry);
            entry.update(|r| r.mcp = Some(info));
            let message = entry.scrub_text(&message);
            if proxy.report_all || rule.report {
                tracing::warn!(audit.id = %entry.id(), reason = Reason::McpNotAllowed.code(), message = %message, "report-only: would deny");
                verdict.would_deny = Some(WouldDeny {
                    reason: Reason::McpNotAllowed,
                    closest: Some(&rule.name),
                    message,
                });
                return Ok(Step::Go(Some(held), None));
            }
            tracing::warn!(audit.id = %entry.id(), reason = Reason::McpNotAllowed.code(), message = %message, "MCP message refused");
            entry.outcome(
                Reason::McpNotAllowed,
                Some(&rule.name),
                Some(response.status().as_u16()),
            );
            Ok(Step::Answered(Answer {
                response,
                body_refused: Arc::default(),
                on_finish: None,
                upgrade: None,
            }))
        }
    }
}

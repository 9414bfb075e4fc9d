//! The mcp phase: under a rule with `mcp`, a POST's JSON-RPC messages are held whole and
//! matched (`proxy::mcp::inspect`) before anything is sent. (A WebSocket's messages are
//! matched by its relay: `proxy::mcp_socket`.)
//!
//! A refused message is not a [`Refusal`]: the agent speaks JSON-RPC, so the answer is a
//! JSON-RPC error (HTTP 200) built by `proxy::mcp`, recorded through the record phase like any
//! answer, with reason `mcp_not_allowed`. A body that is not JSON-RPC at all is a `bad_request`
//! refusal. Under report-only the messages go on, marked `would_deny`.

use std::sync::Arc;

use http::header::{HeaderValue, ACCEPT_ENCODING};

use super::super::mcp::{self, Inspected};
use super::super::request_body::Inbound;
use super::decide::WouldDeny;
use super::request::Req;
use super::{ask, Answer};
use crate::reason::{Reason, Refusal};

/// The mcp phase. Assumes: the verdict is in. Guarantees: `Ok(None)` (go on) only when the
/// rule has no `mcp`, the request carries no message (a bodiless GET or DELETE), every message
/// is allowed, or report-only marked the verdict; the body it read is in `req.inbound`, and the
/// `tools/list` requests whose results are filtered in `req.tools_list` (asked for without
/// compression). `Ok(Some)` is the JSON-RPC refusal, recorded; it has sent nothing upstream.
pub(super) async fn check(req: &mut Req<'_>) -> Result<Option<Answer>, Refusal> {
    let rule = req.rule();
    let Some(rules) = rule.mcp.as_ref() else {
        return Ok(None);
    };
    // GET opens the server's event stream, DELETE ends a session: no message to read. Any
    // request that carries a body is read, whatever its method: a server may take JSON-RPC in
    // a PUT as well.
    let bodiless = req.body.as_ref().is_none_or(http_body::Body::is_end_stream);
    let post = req.head.method == http::Method::POST;
    if !post && bodiless {
        return Ok(None);
    }
    let under = |r: Refusal| r.under(&rule.name);
    let held = ask::hold_body(req, "an MCP message").await.map_err(under)?;
    let Inbound::Held(bytes, _, _) = &held else {
        return Err(under(Refusal::new(
            Reason::BadRequest,
            "the request body was not held",
        )));
    };
    // An empty body on another method (`Content-Length: 0`, an empty chunked body) is no message.
    if !post && bytes.is_empty() {
        req.inbound = Some(held);
        return Ok(None);
    }
    let inspected = mcp::inspect(rules, &rule.name, bytes).map_err(under)?;
    req.inbound = Some(held);
    let report = req.proxy.report_all || rule.report;
    match inspected {
        Inspected::Forward { info, list_ids } => {
            let info = mcp::for_the_record(info, req.entry);
            req.entry.set_mcp(info);
            // Report-only changes nothing the sandbox sees: the listing is left whole.
            if rules.filter_list && !report && !list_ids.is_empty() {
                req.tools_list = Some((rules.clone(), list_ids));
                // The results are filtered as they pass: they must arrive readable.
                req.head
                    .headers
                    .insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
            }
            Ok(None)
        }
        Inspected::Refuse {
            info,
            message,
            answer,
        } => {
            let response = mcp::refused_response(&rule.name, answer);
            let info = mcp::for_the_record(info, req.entry);
            req.entry.set_mcp(info);
            let message = req.entry.scrub_text(&message);
            if report {
                tracing::warn!(audit.id = %req.entry.id(), reason = Reason::McpNotAllowed.code(), message = %message, "report-only: would deny");
                req.entry.would_deny(Reason::McpNotAllowed);
                req.verdict.would_deny = Some(WouldDeny {
                    reason: Reason::McpNotAllowed,
                    closest: Some(&rule.name),
                    message,
                });
                return Ok(None);
            }
            tracing::warn!(audit.id = %req.entry.id(), reason = Reason::McpNotAllowed.code(), message = %message, "MCP message refused");
            req.entry.outcome(
                Reason::McpNotAllowed,
                Some(&rule.name),
                Some(response.status().as_u16()),
            );
            Ok(Some(Answer {
                response,
                body_refused: Arc::default(),
                on_finish: None,
                upgrade: None,
            }))
        }
    }
}

/// The `tools/list` filter: a response to listings the mcp phase marked has the tools the rule
/// does not allow taken out as it passes (`proxy::mcp_list::filter_list`).
pub(super) fn filter_list(req: &mut Req<'_>, mut answer: Answer) -> Answer {
    if let Some((rules, ids)) = req.tools_list.take() {
        answer.response = super::super::mcp_list::filter_list(answer.response, rules, ids);
    }
    answer
}

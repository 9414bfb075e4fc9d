//! MCP over a WebSocket: under a rule with both `mcp` and `websocket = true`, every text or
//! binary message the sandbox sends is a JSON-RPC message (or batch) read and matched exactly
//! like a POST body (`mcp::inspect`), and `tools/list` results coming back are filtered
//! (`mcp_list::filter_document`).
//!
//! - An allowed message goes on unchanged.
//! - A refused one is not forwarded: the sandbox gets the JSON-RPC error on the socket (a text
//!   message, the same error a POST would get), and the session goes on — what an MCP client
//!   handles best (a close would end the whole session over one call).
//! - A message that is not JSON-RPC, or holds ambiguous keys, closes the socket (`bad_request`,
//!   `1007`): fail closed.
//! - A message from the upstream while a `tools/list` is unanswered that cannot be filtered
//!   (not JSON, ambiguous keys) closes the socket too.
//!
//! The socket's audit record holds every message in `mcp` (calls, with their refused flags);
//! a refused call makes the record `mcp_not_allowed` (a denial, or `would_deny` under
//! report-only, where the message goes on).

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use super::mcp::{self, Inspected};
use super::mcp_list;
use crate::audit::{Entry, McpInfo};
use crate::policy::mcp::McpRules;
use crate::reason::{Reason, Refusal};

/// Most `tools/list` requests one socket may have unanswered at once.
const MAX_PENDING_LISTS: usize = 1024;

/// Most messages of one socket named in its audit record, as for a POST (the count is always
/// complete; once full, a refused call takes the place of the earliest allowed one).
const MAX_RECORDED: usize = 64;

/// What a socket under a rule with `mcp` is matched against.
#[derive(Clone)]
pub struct Rules {
    pub rules: Arc<McpRules>,
    pub rule: String,
    /// Report-only: refused messages go on, marked.
    pub report: bool,
}

/// One socket's MCP state: what it has seen, and the listings it waits for.
pub struct Socket {
    rules: Rules,
    info: McpInfo,
    /// Ids of `tools/list` requests not yet answered.
    pending: Vec<Value>,
    refused: bool,
}

/// What becomes of a message from the sandbox.
pub enum Up {
    /// Goes on as it is.
    Forward(Message),
    /// Refused and answered: `Some` is sent back to the sandbox; nothing goes upstream.
    Answered(Option<Message>),
    /// Not JSON-RPC: the socket is closed with this refusal.
    Refuse(Refusal),
}

impl Socket {
    pub fn new(rules: Rules) -> Socket {
        Socket {
            rules,
            info: McpInfo::default(),
            pending: Vec::new(),
            refused: false,
        }
    }

    /// Matches a message from the sandbox (control frames go on: they carry no JSON-RPC).
    pub fn up(&mut self, m: Message, entry: &Entry) -> Up {
        let data: &[u8] = match &m {
            Message::Text(t) => t.as_bytes(),
            Message::Binary(b) => b,
            _ => return Up::Forward(m),
        };
        let inspected = match mcp::inspect(&self.rules.rules, &self.rules.rule, data) {
            Ok(i) => i,
            Err(refusal) => return Up::Refuse(refusal.under(&self.rules.rule)),
        };
        match inspected {
            Inspected::Forward { info, list_ids } => {
                self.absorb(info);
                let rules = &self.rules;
                if !rules.rules.filter_list || rules.report {
                    return Up::Forward(m);
                }
                if self.pending.len() + list_ids.len() > MAX_PENDING_LISTS {
                    return Up::Refuse(
                        Refusal::new(
                            Reason::TooBusy,
                            format!(
                                "over {MAX_PENDING_LISTS} tools/list requests unanswered on one \
                                 WebSocket"
                            ),
                        )
                        .under(&rules.rule),
                    );
                }
                self.pending.extend(list_ids);
                Up::Forward(m)
            }
            Inspected::Refuse {
                info,
                message,
                answer,
            } => {
                let report = self.rules.report;
                self.absorb(info);
                self.refused = true;
                let message = entry.scrub_text(&message);
                if report {
                    tracing::warn!(audit.id = %entry.id(), reason = Reason::McpNotAllowed.code(), message = %message, "report-only: would deny");
                    return Up::Forward(m);
                }
                tracing::warn!(audit.id = %entry.id(), reason = Reason::McpNotAllowed.code(), message = %message, "MCP message refused on a WebSocket");
                // The error is latchkey's own JSON: always UTF-8.
                let reply = answer
                    .and_then(|a| Utf8Bytes::try_from(a).ok())
                    .map(Message::Text);
                Up::Answered(reply)
            }
        }
    }

    /// Filters a message from the upstream while `tools/list` requests are unanswered.
    ///
    /// Errors: the message cannot be filtered (not JSON, ambiguous keys): the socket closes.
    pub fn down(&mut self, m: Message) -> Result<Message, Refusal> {
        if self.pending.is_empty() {
            return Ok(m);
        }
        let (data, text): (&[u8], bool) = match &m {
            Message::Text(t) => (t.as_bytes(), true),
            Message::Binary(b) => (b, false),
            _ => return Ok(m),
        };
        let filtered =
            mcp_list::filter_document(data, &self.rules.rules, &self.pending).map_err(|e| {
                Refusal::new(
                    Reason::UpstreamError,
                    format!("while a tools/list is unanswered: {e}"),
                )
                .under(&self.rules.rule)
            })?;
        self.pending.retain(|id| !filtered.answered.contains(id));
        let Some(bytes) = filtered.changed else {
            return Ok(m);
        };
        let bytes = Bytes::from(bytes);
        if !text {
            return Ok(Message::Binary(bytes));
        }
        // Re-serialised JSON is UTF-8.
        Utf8Bytes::try_from(bytes)
            .map(Message::Text)
            .map_err(|_| Refusal::new(Reason::UpstreamError, "a filtered tools/list is not UTF-8"))
    }

    fn absorb(&mut self, info: McpInfo) {
        self.info.messages += info.messages;
        let calls = &mut self.info.calls;
        for call in info.calls {
            if calls.len() < MAX_RECORDED {
                calls.push(call);
            } else if call.refused {
                // A refusal is what a reviewer looks for: it displaces an allowed call.
                if let Some(i) = calls.iter().position(|c| !c.refused) {
                    calls.remove(i);
                    calls.push(call);
                }
            }
        }
    }

    /// Writes what the socket carried into its record.
    pub fn record(self, entry: &mut Entry) {
        let info = mcp::for_the_record(self.info, entry);
        let (refused, report) = (self.refused, self.rules.report);
        // A socket closed before any message was read has none to list.
        if info.messages > 0 {
            entry.set_mcp(info);
        }
        if refused && report {
            entry.reported();
        } else if refused {
            entry.ended(Reason::McpNotAllowed);
        }
    }
}

#[cfg(test)]
#[path = "mcp_socket_tests.rs"]
mod tests;

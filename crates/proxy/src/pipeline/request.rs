//! One request as it moves through the phases: [`Arrived`] is what `handle` knows before
//! admission; [`Req`] is the request context every phase after decide takes (`&mut`) and fills
//! its part of. The policy, the record and the body are borrowed from `handle`, which keeps
//! them for the one refusal exit; everything a phase settles (the verdict, the held body, the
//! admission, the handshake) lives here until a later phase takes it.

use std::sync::Arc;

use http::request::Parts;
use hyper::body::Incoming;
use serde_json::Value;

use super::super::correlate::Correlation;
use super::super::request_body::Inbound;
use super::super::websocket::Handshake;
use super::super::Generation;
use super::super::Proxy;
use super::admit::Admitted;
use super::decide::Verdict;
use super::Ctx;
use crate::audit::Entry;
use crate::governance::limits::Admission;
use crate::policy::mcp::McpRules;
use crate::policy::{Asking, Identity, Rule};
use crate::reason::{Reason, Refusal};

/// A request as it arrives: who sent it and through what, its head, and what `handle` keeps
/// for the refusal exit (the record, the body).
pub(super) struct Arrived<'a> {
    pub proxy: &'a Arc<Proxy>,
    pub ctx: &'a Ctx,
    /// The policy in force when the request arrived: it holds for all of it.
    pub policy: &'a Arc<Generation>,
    pub entry: &'a mut Entry,
    /// The request body until a phase takes it: a refusal before then drains it.
    pub body: &'a mut Option<Incoming>,
    pub head: Parts,
    pub correlation: Correlation,
    /// The runtime session's narrowing and reach under this policy, if a session asks.
    pub scoped: Option<Arc<crate::governance::sessions::Scoped>>,
}

/// The request context: an admitted request policy let on, and what each phase has settled.
pub(super) struct Req<'a> {
    pub proxy: &'a Arc<Proxy>,
    pub ctx: &'a Ctx,
    pub policy: &'a Arc<Generation>,
    pub entry: &'a mut Entry,
    pub body: &'a mut Option<Incoming>,
    /// The request head; the broker phase takes it to build the upstream request.
    pub head: Parts,
    pub correlation: Correlation,
    /// The runtime session's narrowing and reach, if a session asks.
    pub scoped: Option<Arc<crate::governance::sessions::Scoped>>,
    /// The target in normal form (admit).
    pub target: Admitted,
    /// The identity, when the policy defines identities (identify).
    pub identity: Option<&'a Identity>,
    /// The rule the request goes on under, and a would-be denial under report-only (decide).
    pub verdict: Verdict<'a>,
    /// Why the request needs a person, if it does, and the policy denial `[ask] unknown`
    /// turned into the question (decide; the ask phase takes it).
    pub asking: Option<(Asking<'a>, Option<Reason>)>,
    /// An allowed WebSocket handshake, checked, with the sandbox's half of the upgrade.
    pub handshake: Option<Handshake>,
    /// The body as a phase holds it (read whole for MCP, a person or a price; or streaming),
    /// once taken from `body`.
    pub inbound: Option<Inbound>,
    /// The `tools/list` requests whose results are filtered on the way back (mcp).
    pub tools_list: Option<(Arc<McpRules>, Vec<Value>)>,
    /// The reservation against `[limits]`, settled when the response ends (limits).
    pub admission: Option<Admission>,
    /// A decision whose denials or rule still read the body (decide; the predicates phase
    /// settles it before anything is sent).
    pub pending: Option<crate::policy::Decision<'a>>,
}

impl<'a> Req<'a> {
    /// The context of an admitted request under `verdict`.
    pub fn new(
        at: Arrived<'a>,
        target: Admitted,
        identity: Option<&'a Identity>,
        verdict: Verdict<'a>,
    ) -> Self {
        Self {
            proxy: at.proxy,
            ctx: at.ctx,
            policy: at.policy,
            entry: at.entry,
            body: at.body,
            head: at.head,
            correlation: at.correlation,
            scoped: at.scoped,
            target,
            identity,
            verdict,
            asking: None,
            handshake: None,
            inbound: None,
            tools_list: None,
            admission: None,
            pending: None,
        }
    }

    /// The rule the request goes on under (the verdict's).
    pub fn rule(&self) -> &'a Rule {
        self.verdict.rule
    }

    /// The body for the phase that sends or holds it: what an earlier phase held, else the body
    /// as it streams (taken from `body`: a refusal after this no longer drains it).
    pub fn take_inbound(&mut self) -> Result<Inbound, Refusal> {
        match self.inbound.take() {
            Some(held) => Ok(held),
            None => self.take_body().map(Inbound::Streaming),
        }
    }

    /// The request body as it streams, for a phase that reads it.
    pub fn take_body(&mut self) -> Result<Incoming, Refusal> {
        self.body
            .take()
            .ok_or_else(|| Refusal::new(Reason::BadRequest, "the request body was already read"))
    }

    /// Whether the request is a WebSocket handshake.
    pub fn upgrading(&self) -> bool {
        self.handshake.is_some()
    }
}

//! The one connection gate. Every listener that learns an authority before it reads a request
//! (CONNECT on the proxy hop, SOCKS5, the captured listeners `--transparent`, `--https-listen`
//! and `--http-listen`) only finds the authority and the identity, then calls [`open`]; each
//! check below runs exactly once per connection, in this order, whichever listener:
//!
//! ```text
//! Knock: client, identity, authority as found, how the bytes go on, original destination
//!   ─▶ admit (no userinfo, no secret in the host as sent, host normalised)
//!   ─▶ the head as sent (a CONNECT's raw framing) ─▶ audit healthy ─▶ identity defined
//!   ─┬─ Connection (CONNECT, SOCKS5, a ClientHello): decide_connect
//!    │     ├─ deny ─────────────────────────────────────────────────────────▶ refused
//!    │     ├─ tunnel: destination (the rule's ranges), limits, commit, dial ─▶ Tunnel
//!    │     └─ intercept (a report-only denial too): destination ───────────▶ Intercept(Ctx)
//!    └─ FirstRequest (captured plain HTTP): its decision, destination ───────▶ Ctx (plain)
//! refused ─▶ the listener's [`Refuse`] (HTTP response, TLS alert, raw HTTP, SOCKS5 reply),
//!            which records the refusal and answers it: the one refusal end of every listener.
//! ```
//!
//! The destination check (a redirected connection only) is the SNI-spoofing check: the address
//! the client dialed must be one latchkey's resolver handed out for the name, or one the name
//! resolves to now. Nothing here dials except a tunnel, and that only after every check passed
//! and the decision is on disk; a name policy refuses is never resolved (its lookup would leak
//! it to DNS). Depends on `pipeline` (its admission checks, `Ctx`), `policy` and `upstream`.

use std::net::SocketAddr;
use std::sync::Arc;

use http::Method;

use super::pipeline::{self, Ctx};
use super::{Generation, Proxy};
use crate::audit::Entry;
use crate::governance::sessions::{Live, Scoped};
use crate::policy::{normalize_host, ConnectDecision, Decision, Identity, Rule};
use crate::policy::{Scheme, Target};
use crate::reason::{Reason, Refusal};
use crate::upstream::{Cidr, Dialed};
use crate::wire::cut::Cut;

/// A connection at the gate: what its listener found.
pub(crate) struct Knock<'a, C> {
    /// The sandbox's address.
    pub client: SocketAddr,
    /// The identity the listener found for the client (a token, a source address, `default`;
    /// a session's profile).
    pub identity: Arc<str>,
    /// The runtime session the client presented, if any, and the connection's switch.
    pub session: Option<Arc<Live>>,
    pub cut: Option<Arc<Cut>>,
    /// The host as sent: a CONNECT authority's, a SOCKS5 address, an SNI, a `Host` header's.
    pub host: &'a str,
    /// The port the upstream is dialed on.
    pub port: u16,
    /// How the bytes go on, which says how the connection is decided: [`Connection`] or
    /// [`FirstRequest`].
    pub carries: C,
    /// The address the client sent a redirected connection to (`--transparent`).
    pub original_dst: Option<SocketAddr>,
    /// What the listener found wrong in the head as sent (a CONNECT's raw framing), given once
    /// the authority is admitted, so the record names the host and port as admitted.
    pub head: Result<(), Refusal>,
}

/// What a [`Connection`] becomes.
pub(crate) enum Opened {
    /// A `tunnel = true` rule: the upstream is already dialed.
    Tunnel(Dialed),
    /// Interception: each inner request goes through the pipeline under this context (pinned
    /// to the admitted authority, `https`).
    Intercept(Ctx),
}

/// A connection decided as a CONNECT to its authority: a tunnel rule relays it raw, anything
/// else is intercepted (TLS; after a SOCKS5 reply, whatever its first byte says).
pub(crate) struct Connection;

/// Plain HTTP decided as its first request (a captured connection's `Host`): the pipeline then
/// decides every request on it, the first one again, under the plain context the gate opens.
pub(crate) struct FirstRequest<'a> {
    pub method: &'a str,
    /// The path policy matches (no query), `/` at least.
    pub path: &'a str,
}

/// How a listener answers a refusal (the record's status follows the answer): the only way a
/// gated connection is refused.
pub(crate) trait Refuse {
    /// What answering leaves the listener (the proxy hop's response).
    type Answered;
    /// Records `refusal` on `entry`, finishes it and answers the client.
    async fn refuse(self, entry: Entry, refusal: &Refusal) -> Self::Answered;
}

/// The gate: admits, checks and decides `knock` once; on `Ok`, the connection as decided and
/// its record (naming the host and port as admitted); on a refusal, what the listener's
/// `answer` left, the refusal answered and recorded.
///
/// Guarantees on `Ok`: the authority has no userinfo and no secret value or placeholder in the
/// host as sent, the host is normalised, the head is well framed, the audit log was healthy,
/// the identity is defined, policy lets some request to the authority through (or report-only
/// mode lets each be decided per request), a redirected connection's original destination is
/// an address of the host, and a tunnel is dialed (its decision on disk first).
pub(crate) async fn open<C: Carries, A: Refuse>(
    proxy: &Proxy,
    policy: &Generation,
    knock: Knock<'_, C>,
    mut entry: Entry,
    answer: A,
) -> Result<(C::Opened, Entry), A::Answered> {
    match decide(proxy, policy, knock, &mut entry).await {
        Ok(opened) => Ok((opened, entry)),
        Err(refusal) => Err(answer.refuse(entry, &refusal).await),
    }
}

/// The checks every connection passes, then its decision.
async fn decide<C: Carries>(
    proxy: &Proxy,
    policy: &Generation,
    knock: Knock<'_, C>,
    entry: &mut Entry,
) -> Result<C::Opened, Refusal> {
    let host = admit_authority(policy, entry, knock.host, knock.port)?;
    knock.head?;
    pipeline::audit_healthy(proxy)?;
    // A session first: its refusals (ended, its profile gone) name it on the record.
    let scoped = match &knock.session {
        Some(live) => {
            let client = knock.client.ip();
            Some(
                super::session::check(proxy, policy, live, client, knock.cut.as_ref(), entry)
                    .await?,
            )
        }
        None => None,
    };
    let identity = pipeline::identity(policy, &knock.identity)?;
    let to = Admitted {
        client: knock.client,
        identity: knock.identity,
        session: knock.session,
        cut: knock.cut,
        scoped,
        host,
        port: knock.port,
        original_dst: knock.original_dst,
    };
    knock
        .carries
        .decide(proxy, policy, identity, to, entry)
        .await
}

/// An authority the gate admitted, and who is going there.
pub(crate) struct Admitted {
    client: SocketAddr,
    identity: Arc<str>,
    session: Option<Arc<Live>>,
    cut: Option<Arc<Cut>>,
    /// The session's narrowing and reach under the policy in force.
    scoped: Option<Arc<Scoped>>,
    /// Normalised ([`normalize_host`]).
    host: String,
    port: u16,
    original_dst: Option<SocketAddr>,
}

impl Admitted {
    /// The destination check, on a redirected connection only.
    async fn destination(&self, proxy: &Proxy, extra: &[Cidr]) -> Result<(), Refusal> {
        match self.original_dst {
            Some(dest) => destination(proxy, &self.host, dest, extra).await,
            None => Ok(()),
        }
    }

    /// The context the requests inside an interception go through the pipeline under.
    fn intercepted(self) -> Ctx {
        let mut ctx = Ctx::pinned(self.client, self.identity, self.host, self.port)
            .with_original_dst(self.original_dst)
            .with_cut(self.cut);
        ctx.session = self.session;
        ctx
    }

    /// What the session narrowed, if a session is going there.
    fn narrowing(&self) -> Option<&crate::policy::profile::Narrowing> {
        self.scoped.as_ref().map(|s| &s.narrowing)
    }

    /// The context the plain-HTTP requests on the connection go through the pipeline under.
    fn plain(self) -> Ctx {
        let mut ctx = Ctx::pinned_plain(self.client, self.identity, self.host, self.port)
            .with_original_dst(self.original_dst)
            .with_cut(self.cut);
        ctx.session = self.session;
        ctx
    }
}

/// How a connection is decided once admitted: what its bytes are.
pub(crate) trait Carries {
    /// What the gate opens for it.
    type Opened;
    /// Decides `to` under `identity` (defined), the audit log healthy.
    async fn decide(
        self,
        proxy: &Proxy,
        policy: &Generation,
        identity: Option<&Identity>,
        to: Admitted,
        entry: &mut Entry,
    ) -> Result<Self::Opened, Refusal>;
}

impl Carries for Connection {
    type Opened = Opened;

    async fn decide(
        self,
        proxy: &Proxy,
        policy: &Generation,
        identity: Option<&Identity>,
        to: Admitted,
        entry: &mut Entry,
    ) -> Result<Opened, Refusal> {
        match policy.decide_connect_narrowed(&to.host, to.port, identity, to.narrowing()) {
            ConnectDecision::Deny(d) if !reported(proxy, &d) => Err(refusal_of(d)),
            ConnectDecision::Tunnel(rule) => {
                // Checked with the tunnel rule's own ranges, before anything is dialed.
                to.destination(proxy, &rule.allow_private).await?;
                let dialed = tunnel(proxy, policy, identity, rule, &to, entry)
                    .await
                    .map_err(|r| r.under(&rule.name))?;
                Ok(Opened::Tunnel(dialed))
            }
            // Report-only: intercept anyway, so each inner request is decided and marked.
            ConnectDecision::Deny(_) | ConnectDecision::Intercept => {
                to.destination(proxy, &[]).await?;
                Ok(Opened::Intercept(to.intercepted()))
            }
        }
    }
}

impl Carries for FirstRequest<'_> {
    type Opened = Ctx;

    async fn decide(
        self,
        proxy: &Proxy,
        policy: &Generation,
        identity: Option<&Identity>,
        to: Admitted,
        _entry: &mut Entry,
    ) -> Result<Ctx, Refusal> {
        let method = Method::from_bytes(self.method.as_bytes())
            .map_err(|_| Refusal::new(Reason::BadRequest, "invalid method"))?;
        let decision = policy.decide(&Target {
            scheme: Scheme::Http,
            host: &to.host,
            port: to.port,
            method: &method,
            path: self.path,
            identity,
            narrowing: to.narrowing(),
            // The connection's gate: each request (an upgrade too) is decided by the pipeline.
            websocket: false,
            query: None,
            headers: None,
        });
        let extra: &[Cidr] = match decision.rule {
            Some(rule) if decision.allowed() => &rule.allow_private,
            // Predicates are each request's (the pipeline decides every request with its query,
            // headers and body): the gate, which has none of them, checks the destination only.
            Some(rule) if decision.reason == Reason::PredicateMismatch => &rule.allow_private,
            // Report-only lets a policy denial through, under no rule's ranges (as the pipeline
            // does).
            _ if reported(proxy, &decision) => &[],
            _ => return Err(refusal_of(decision)),
        };
        to.destination(proxy, extra).await?;
        Ok(to.plain())
    }
}

/// Whether report-only mode lets a denial through: a policy denial, with `--report-all` or
/// under a `report = true` rule.
fn reported(proxy: &Proxy, d: &Decision<'_>) -> bool {
    d.reason.is_policy_denial() && (proxy.report_all || d.rule.is_some_and(|r| r.report))
}

/// The refusal a denial is.
fn refusal_of(d: Decision<'_>) -> Refusal {
    Refusal {
        reason: d.reason,
        rule: d.rule_name().map(str::to_string),
        message: d.message,
    }
}

/// Admits `host_as_sent:port`: no userinfo, no secret value or placeholder in the host as sent,
/// the host normalised. Returns the normalised host; the record names it and the port.
fn admit_authority(
    policy: &Generation,
    entry: &mut Entry,
    host_as_sent: &str,
    port: u16,
) -> Result<String, Refusal> {
    entry.set_host(host_as_sent);
    if host_as_sent.contains('@') {
        entry.set_port(port);
        return Err(Refusal::new(
            Reason::UserinfoInUrl,
            "authority carries userinfo ('@')",
        ));
    }
    // The host as sent, before it is normalised, resolved or put in a certificate: a secret
    // value or a placeholder in it (a subdomain under a `*.` rule) would leak to DNS.
    if let Err(refusal) = pipeline::host_clean(policy, host_as_sent, entry) {
        entry.set_port(port);
        return Err(refusal);
    }
    let host = normalize_host(host_as_sent)
        .map_err(|e| Refusal::new(Reason::BadRequest, e.to_string()))?;
    entry.set_authority(&host, port);
    Ok(host)
}

/// Opens a tunnel `rule` allowed: its limits admitted (held as long as its record), the
/// decision on disk, then the dial (an unreachable upstream is a refusal the client sees).
async fn tunnel(
    proxy: &Proxy,
    policy: &Generation,
    identity: Option<&Identity>,
    rule: &Rule,
    to: &Admitted,
    entry: &mut Entry,
) -> Result<Dialed, Refusal> {
    entry.set_rule(&rule.name);
    // A tunnel's limits count CONNECTs (rate, concurrency): held while it is open.
    tunnel_limits(proxy, policy, identity, rule, to, entry).await?;
    // The decision is on disk before the dial; the tunnel's outcome record follows.
    entry.outcome(Reason::Tunnel, Some(&rule.name), None);
    pipeline::commit_decision(entry).await?;
    let dialed = proxy
        .dialer
        .dial(&to.host, to.port, &rule.allow_private)
        .await
        .map_err(|e| Refusal::new(e.reason(), e.to_string()))?;
    entry.outcome(Reason::Tunnel, Some(&rule.name), Some(200));
    entry.set_upstream(Some(dialed.addr));
    Ok(dialed)
}

/// Charges a tunnel to its rule's and identity's limits: request rates and concurrency, and
/// `bytes_up`, reserved as the tunnel relays bytes upstream (`connect::tunnel`); policy refuses
/// token and spend budgets on a tunnel rule, whose requests latchkey cannot read. The admission
/// lives as long as the tunnel's record.
async fn tunnel_limits(
    proxy: &Proxy,
    policy: &Generation,
    identity: Option<&Identity>,
    rule: &Rule,
    to: &Admitted,
    entry: &mut Entry,
) -> Result<(), Refusal> {
    let mut limits = policy.limits_for(rule, identity);
    // A session's lowered limits count per session, on top of its profile's.
    limits.extend(to.scoped.iter().flat_map(|s| s.narrowing.limits.iter()));
    if limits.is_empty() {
        return Ok(());
    }
    let Some(limiter) = proxy.limiter() else {
        return Err(Refusal::new(
            Reason::LimitsUnavailable,
            "this tunnel is under [limits], and latchkey has no state store to count them in",
        ));
    };
    let pattern = rule.host_for(&to.host);
    let id = entry.id().to_string();
    let who = crate::governance::limits::Subject {
        session: to.session.as_ref().map(|l| l.id.as_str()),
        identity: &to.identity,
        rule: &rule.name,
        credential: rule.credential.as_deref(),
        host: &pattern,
        request_id: &id,
    };
    // The relayed bytes stream: reserved block by block as they go.
    let estimate = crate::governance::limits::Estimate {
        head_up: 0,
        bytes_up: None,
        llm: None,
    };
    match limiter.admit(&limits, who, &estimate).await {
        Ok(admission) => {
            pipeline::record_admitted(entry, &admission);
            entry.hold(Box::new(admission));
            Ok(())
        }
        Err(refused) => Err(pipeline::record_refused(entry, *refused)),
    }
}

/// The SNI-spoofing check: `dest`, where the client sent the connection, must be an address
/// latchkey's resolver handed out for `host`, or one `host` resolves to now (through the
/// dialer: `--resolve` pins and the address guard apply, with `extra` opened).
async fn destination(
    proxy: &Proxy,
    host: &str,
    dest: SocketAddr,
    extra: &[Cidr],
) -> Result<(), Refusal> {
    let ip = dest.ip().to_canonical();
    if proxy.pins().answered(host, ip) {
        return Ok(());
    }
    let addrs = proxy
        .dialer
        .resolve(host, dest.port(), extra)
        .await
        .map_err(|e| match e.reason() {
            // An address the guard refuses would be refused when dialed: say so.
            Reason::NonPublicAddress => Refusal::new(Reason::NonPublicAddress, e.to_string()),
            _ => Refusal::new(
                Reason::DestinationMismatch,
                format!("cannot check that {dest} is an address of {host}: {e}"),
            ),
        })?;
    if addrs.iter().any(|a| a.ip().to_canonical() == ip) {
        return Ok(());
    }
    Err(Refusal::new(
        Reason::DestinationMismatch,
        format!(
            "the connection was sent to {dest}, which is not an address of {host}: a redirected \
             connection goes on only to an address its name resolves to"
        ),
    ))
}

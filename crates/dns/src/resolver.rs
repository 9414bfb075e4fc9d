//! What latchkey's resolver answers, and the audit record of every query.
//!
//! A question for a name some rule could allow (`Policy::could_allow_host`, policy in force at
//! the query) is answered in the configured style: latchkey's own addresses (`self`,
//! DNS-routed sandboxes) or the name's real addresses through the upstream address guard
//! (`real`, for transparent capture; what was handed out is pinned in `Proxy::pins`). Every
//! other name is NXDOMAIN. A name holding a secret value or a placeholder is refused before it
//! is looked up, like any host. HTTPS/SVCB questions for an allowable name get an empty
//! NOERROR: clients fall back to A/AAAA, and no service parameters reach the sandbox.
//!
//! Depends on `proxy` (the policy in force, the dialer, the pins, the audit log), `policy`,
//! `secrets::leak` (the host check), `audit` and `reason`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use super::message::{self, Question, Read, Reply, Transport};
use super::rate::Refused;
use crate::audit::{DnsInfo, Entry};
use crate::policy::Policy;
use crate::proxy::{Generation, Proxy};
use crate::reason::Reason;

/// TTL of a `self` answer: short, so a policy reload that removes a name takes effect soon.
pub const SELF_TTL: u32 = 30;
/// TTL of a `real` answer: short too, and well within the pins' memory of it.
pub const REAL_TTL: u32 = 30;
/// How long a `real` lookup may take before the client gets SERVFAIL.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// The identity recorded for a client no source-address identity names.
const UNIDENTIFIED: &str = "unidentified";

/// Which addresses an allowable name is answered with.
#[derive(Debug, Clone)]
pub enum Style {
    /// latchkey's own addresses: IPv4 ones for A, IPv6 ones for AAAA.
    SelfAddress(Vec<IpAddr>),
    /// The name's real addresses, through the address guard, pinned.
    Real,
}

/// The resolver's decision-making half (the sockets are in `server`).
pub struct Resolver {
    proxy: Arc<Proxy>,
    style: Style,
}

/// What a question got.
struct Outcome {
    reply: Reply,
    reason: Reason,
    rule: Option<String>,
    /// The host recorded instead of the name (a name that held a secret is not recorded).
    host: Option<String>,
}

impl Resolver {
    pub fn new(proxy: Arc<Proxy>, style: Style) -> Self {
        Self { proxy, style }
    }

    /// Answers one message from `client`: the reply's bytes, or `None` when nothing is sent
    /// back. Every message leaves one audit record.
    pub async fn handle(
        &self,
        bytes: &[u8],
        client: SocketAddr,
        transport: Transport,
    ) -> Option<Vec<u8>> {
        let policy = self.proxy.policy();
        // A session bound to the client's address names the query's record (its profile).
        let session = self.proxy.source_attribution(client, &policy).await;
        let identity = match &session {
            Some(s) => s.profile.clone(),
            None => identity_by_source(&policy, client),
        };
        let mut entry = crate::proxy::open_record(&self.proxy, client, &identity, &policy).await;
        if let Some(s) = &session {
            entry.set_session(&s.id, &s.profile);
            entry.set_ceiling(&s.labels, &s.reach);
        }
        let mut info = DnsInfo::new(transport.as_str());
        match message::read(bytes) {
            Read::Ignore(why) => {
                tracing::debug!(client.addr = %client, why, "dns: ignored a message");
                finish(entry, info, None, Reason::BadRequest, None);
                None
            }
            Read::Reject(r) => {
                tracing::debug!(client.addr = %client, why = r.why, "dns: refused a query");
                info.qtype = r.qtype;
                info.rcode = Some(message::rcode_name(r.reply.response_code()));
                let host = r.name.map(|name| recorded_host(&policy, &name));
                finish(entry, info, host, r.reason, None);
                r.reply.encode(transport)
            }
            Read::Ask(q) => {
                info.qtype = Some(message::type_name(q.qtype));
                let name = q.name.clone();
                let out = self.decide(&policy, q).await;
                info.rcode = Some(message::rcode_name(out.reply.response_code()));
                info.answer = out
                    .reply
                    .addresses()
                    .iter()
                    .map(IpAddr::to_string)
                    .collect();
                let bytes = out.reply.encode(transport);
                finish(
                    entry,
                    info,
                    Some(out.host.unwrap_or(name)),
                    out.reason,
                    out.rule.as_deref(),
                );
                bytes
            }
        }
    }

    /// The record of a message that was not read because the server had no room for it (too
    /// many in flight): answered SERVFAIL when it has a header.
    pub fn busy(&self, bytes: &[u8], client: SocketAddr, transport: Transport) -> Option<Vec<u8>> {
        let policy = self.proxy.policy();
        let entry = self
            .proxy
            .open_record(client, &identity_by_source(&policy, client), &policy);
        let mut info = DnsInfo::new(transport.as_str());
        let reply = match message::read(bytes) {
            Read::Ignore(_) => None,
            Read::Reject(r) => Some(r.reply.rcode(ResponseCode::ServFail)),
            Read::Ask(q) => Some(q.answer(&[], 0).rcode(ResponseCode::ServFail)),
        };
        info.rcode = reply
            .as_ref()
            .map(|r| message::rcode_name(r.response_code()));
        finish(entry, info, None, Reason::TooBusy, None);
        reply.and_then(|r| r.encode(transport))
    }

    /// The record of a TCP connection latchkey closed before it asked anything (over the
    /// connection cap, a frame too large, no complete query in time).
    pub fn connection_refused(&self, client: SocketAddr, reason: Reason) {
        let policy = self.proxy.policy();
        let entry = self
            .proxy
            .open_record(client, &identity_by_source(&policy, client), &policy);
        finish(
            entry,
            DnsInfo::new(Transport::Tcp.as_str()),
            None,
            reason,
            None,
        );
    }

    /// One record for a client's queries refused over the rate cap in the last second.
    pub fn rate_limited(&self, refused: Refused) {
        let policy = self.proxy.policy();
        let entry = self.proxy.open_record(
            refused.client,
            &identity_by_source(&policy, refused.client),
            &policy,
        );
        let mut info = DnsInfo::new(refused.transport.as_str());
        info.rcode = Some(message::rcode_name(ResponseCode::Refused));
        info.queries = refused.count;
        finish(entry, info, None, Reason::DnsRateLimited, None);
    }

    /// The answer to one question, under `policy`.
    async fn decide(&self, policy: &Generation, q: Question) -> Outcome {
        let refused = |q: Question, rcode, reason, rule: Option<&str>| Outcome {
            reply: q.answer(&[], 0).rcode(rcode),
            reason,
            rule: rule.map(str::to_string),
            host: None,
        };
        if !self.proxy.audit().is_healthy() {
            return refused(q, ResponseCode::ServFail, Reason::AuditUnavailable, None);
        }
        // The name as sent, before anything looks it up: a secret value or placeholder in it
        // is refused, and the record does not show it.
        if let Err(r) = crate::secrets::leak::check_host(policy.secrets(), &q.as_sent) {
            let mut out = refused(q, ResponseCode::Refused, r.reason, None);
            out.host = Some(crate::secrets::leak::REDACTED_HOST.to_string());
            return out;
        }
        let Some(rule) = policy.rule_for_host(&q.name) else {
            return refused(q, ResponseCode::NXDomain, Reason::NoRule, None);
        };
        let rule = rule.name.clone();
        let ips: Vec<IpAddr> = match (q.qtype, &self.style) {
            (RecordType::HTTPS | RecordType::SVCB, _) => Vec::new(),
            (_, Style::SelfAddress(own)) => own.clone(),
            (_, Style::Real) => {
                let lookup = self.proxy.dialer().resolve(&q.name, 443, &[]);
                let looked_up = tokio::time::timeout(LOOKUP_TIMEOUT, lookup).await;
                match looked_up {
                    Ok(Ok(addrs)) => {
                        let ips: Vec<IpAddr> = addrs
                            .iter()
                            .map(|a| a.ip())
                            .filter(|ip| ip.is_ipv4() == (q.qtype == RecordType::A))
                            .take(message::MAX_ANSWERS)
                            .collect();
                        self.proxy.pins().record(&q.name, &ips);
                        ips
                    }
                    Ok(Err(e)) => {
                        let rcode = match e.reason() {
                            Reason::NonPublicAddress => ResponseCode::Refused,
                            _ => ResponseCode::ServFail,
                        };
                        tracing::info!(url.host = %q.name, error = %e, "dns: lookup refused or failed");
                        return refused(q, rcode, e.reason(), Some(&rule));
                    }
                    Err(_) => {
                        return refused(
                            q,
                            ResponseCode::ServFail,
                            Reason::UpstreamTimeout,
                            Some(&rule),
                        )
                    }
                }
            }
        };
        let ttl = match self.style {
            Style::SelfAddress(_) => SELF_TTL,
            Style::Real => REAL_TTL,
        };
        Outcome {
            reply: q.answer(&ips, ttl),
            reason: Reason::Allowed,
            rule: Some(rule),
            host: None,
        }
    }
}

/// The identity a DNS client is recorded as: DNS carries no token, so only an identity by
/// source address can name it (`default` when the policy defines none).
fn identity_by_source(policy: &Policy, client: SocketAddr) -> String {
    let identities = policy.identities();
    if identities.is_empty() {
        return crate::policy::DEFAULT_IDENTITY.to_string();
    }
    let ip = client.ip().to_canonical();
    identities
        .iter()
        .find(|id| {
            // A profile is never recognised by address: only a session carries one.
            !id.has_token
                && id.profile.is_none()
                && !id.sources.is_empty()
                && id.sources.iter().any(|c| c.contains(ip))
        })
        .map_or_else(|| UNIDENTIFIED.to_string(), |id| id.name.clone())
}

/// A refused query's name as the record shows it: lower case, or `[REDACTED]` when it holds a
/// secret value or a placeholder (the record's own scrubbing matches case-sensitively, and a
/// lowercased value would get past it).
fn recorded_host(policy: &Generation, as_sent: &str) -> String {
    match crate::secrets::leak::check_host(policy.secrets(), as_sent) {
        Ok(()) => as_sent.to_ascii_lowercase(),
        Err(_) => crate::secrets::leak::REDACTED_HOST.to_string(),
    }
}

/// Fills a DNS record and writes it.
fn finish(
    mut entry: Entry,
    info: DnsInfo,
    host: Option<String>,
    reason: Reason,
    rule: Option<&str>,
) {
    entry.set_method("DNS");
    if let Some(host) = host {
        entry.set_host(host);
    }
    entry.set_dns(info);
    entry.outcome(reason, rule, None);
    entry.finish();
}

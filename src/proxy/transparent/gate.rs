//! The gate of a captured connection: the name it carries (the SNI, or the first request's
//! `Host`) admitted and decided by the CONNECT gate's own functions
//! (`connect::admit_authority`, `connect::decide_authority`), then, for a redirected
//! connection, the destination check: the address the client dialed must be one latchkey's
//! resolver handed out for that name or one the name resolves to now, so an allowed SNI cannot
//! carry a connection to an arbitrary address behind it (SNI spoofing).
//!
//! Nothing here dials except the tunnel `decide_authority` opens, and that only after every
//! check passed; a name policy refuses is never resolved (its lookup would leak it to DNS).

use std::net::SocketAddr;

use http::Method;

use super::super::connect::{self, Opened};
use super::super::pipeline::{self, Ctx};
use super::super::{Generation, Proxy};
use super::first::Head;
use crate::audit::{redact_query, Entry};
use crate::policy::{ConnectDecision, Scheme, Target};
use crate::reason::{Reason, Refusal};
use crate::upstream::Cidr;

/// Decides a TLS connection by its SNI, on `port`; `dest` is the original destination of a
/// redirected connection (`None` when the client connected to latchkey itself).
///
/// Guarantees: on `Ok`, what the CONNECT gate guarantees for `sni:port`, and `dest` (if any) is
/// an address of the SNI; a tunnel is dialed only then.
pub(super) async fn tls(
    proxy: &Proxy,
    ctx: &Ctx,
    policy: &Generation,
    entry: &mut Entry,
    sni: &str,
    port: u16,
    dest: Option<SocketAddr>,
) -> Result<Opened, Refusal> {
    let host = connect::admit_authority(policy, entry, sni, port)?;
    pipeline::audit_healthy(proxy)?;
    let identity = pipeline::identity(policy, &ctx.identity)?;
    // The decision decide_authority takes, taken first (it is pure) so that the destination is
    // checked before a tunnel is dialed, with the tunnel rule's own ranges.
    let checked = match (dest, policy.decide_connect(&host, port, identity)) {
        (Some(dest), ConnectDecision::Tunnel(rule)) => {
            destination(proxy, &host, dest, &rule.allow_private).await?;
            true
        }
        (Some(dest), ConnectDecision::Intercept) => {
            destination(proxy, &host, dest, &[]).await?;
            true
        }
        _ => false,
    };
    let opened = connect::decide_authority(proxy, ctx, policy, entry, host.clone(), port).await?;
    if let (Some(dest), false) = (dest, checked) {
        // Report-only let a denial through as an interception: its destination is checked too.
        destination(proxy, &host, dest, &[]).await?;
    }
    Ok(opened)
}

/// Decides a plain-HTTP connection by its first request's `Host`, on `port`: admitted like a
/// CONNECT authority, then decided as that request (plain HTTP has no CONNECT decision of its
/// own), then the destination check. Returns the admitted host the connection is pinned to;
/// the pipeline then decides every request on it, the first one again.
pub(super) async fn http(
    proxy: &Proxy,
    ctx: &Ctx,
    policy: &Generation,
    entry: &mut Entry,
    head: &Head,
    port: u16,
    dest: Option<SocketAddr>,
) -> Result<String, Refusal> {
    let uri = head
        .target
        .parse::<http::Uri>()
        .map_err(|_| Refusal::new(Reason::BadRequest, "unsupported request target"))?;
    entry.update(|r| {
        r.method = Some(head.method.clone());
        r.path = Some(redact_query(
            uri.path_and_query().map_or("/", |pq| pq.as_str()),
        ));
    });
    let value = match head.hosts.as_slice() {
        [one] => one,
        [] => {
            return Err(Refusal::new(
                Reason::BadRequest,
                "a Host header is required: it names the host policy decides",
            ))
        }
        _ => {
            return Err(Refusal::new(
                Reason::BadRequest,
                "more than one Host header",
            ))
        }
    };
    entry.update(|r| r.host = Some(value.clone()));
    let authority = value.parse::<http::uri::Authority>().map_err(|_| {
        Refusal::new(
            Reason::BadRequest,
            format!("Host {value:?} is not host[:port]"),
        )
    })?;
    if authority.as_str().contains('@') {
        return Err(Refusal::new(
            Reason::UserinfoInUrl,
            "Host carries userinfo ('@')",
        ));
    }
    if let Some(named) = authority.port_u16().filter(|p| *p != port) {
        return Err(Refusal::new(
            Reason::HostMismatch,
            format!("Host names port {named}, but the connection is to port {port}"),
        ));
    }
    let host = connect::admit_authority(policy, entry, authority.host(), port)?;
    pipeline::audit_healthy(proxy)?;
    let identity = pipeline::identity(policy, &ctx.identity)?;
    let method = Method::from_bytes(head.method.as_bytes())
        .map_err(|_| Refusal::new(Reason::BadRequest, "invalid method"))?;
    let decision = policy.decide(&Target {
        scheme: Scheme::Http,
        host: &host,
        port,
        method: &method,
        path: match uri.path() {
            "" => "/",
            p => p,
        },
        identity,
        // The connection's gate: each request (an upgrade too) is decided by the pipeline.
        websocket: false,
    });
    let extra: &[Cidr] = match decision.rule {
        Some(rule) if decision.allowed() => &rule.allow_private,
        // Report-only lets a policy denial through, under no rule's ranges (as the pipeline does).
        closest
            if decision.reason.is_policy_denial()
                && (proxy.report_all || closest.is_some_and(|r| r.report)) =>
        {
            &[]
        }
        closest => {
            return Err(Refusal {
                reason: decision.reason,
                rule: closest.map(|r| r.name.clone()),
                message: decision.message,
            })
        }
    };
    if let Some(dest) = dest {
        destination(proxy, &host, dest, extra).await?;
    }
    Ok(host)
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

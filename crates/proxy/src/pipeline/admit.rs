//! The admit phase: what is being asked for, in one normal form, unambiguously framed.
//!
//! Each check here runs on the request head alone, before policy sees the request and long
//! before any lookup or dial. The CONNECT gate runs the same checks on its own head
//! ([`super::super::connect`]), so every listener admits alike. Admission knows no rule: checks
//! that depend on the rule that matched belong to the decide phase.

use http::header::HOST;
use http::request::Parts;
use http::{Uri, Version};

use super::super::correlate::Correlation;
use super::super::{limits, Generation, Proxy, AUDIT_DOWN, MAX_HEADER_BYTES};
use super::request::Arrived;
use super::Ctx;
use crate::audit::{redact_query, Entry, Record};
use crate::policy::{display_authority, normalize_host, Scheme};
use crate::reason::{Reason, Refusal};
use crate::secrets::leak;

/// A request target after admission: normalised, unambiguous, ready for policy.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Admitted {
    pub scheme: Scheme,
    /// Normalised ([`normalize_host`]): lowercase, IPv6 without brackets, no trailing dot.
    pub host: String,
    pub port: u16,
    /// Origin-form, `/` at least; the query as sent.
    pub path_and_query: String,
}

impl Admitted {
    /// The path without the query: what policy matches.
    pub fn path(&self) -> &str {
        self.path_and_query
            .split_once('?')
            .map_or(self.path_and_query.as_str(), |(p, _)| p)
    }
}

/// The admit phase, in order: nothing goes through unrecorded; one framing, within the limits;
/// no secret in the host as sent; then the target in normal form, recorded, its host checked
/// again as normalised.
///
/// Guarantees: on `Ok`, the target is admitted ([`target`]'s guarantees) and the record shows
/// it in normal form.
pub(super) fn admit(at: &mut Arrived<'_>) -> Result<Admitted, Refusal> {
    audit_healthy(at.proxy)?;
    framing(&at.head, at.ctx)?;
    within_limits(&at.head, at.proxy.limits.max_uri_len)?;
    hosts_as_sent(at.policy, &at.head, at.entry)?;
    let target = target(at.ctx, &at.head)?;
    at.entry.set_target(
        target.scheme.as_str(),
        &target.host,
        target.port,
        redact_query(&target.path_and_query),
    );
    host_clean(at.policy, &target.host, at.entry)?;
    Ok(target)
}

/// Refuses everything while the audit log cannot be written: nothing goes through unrecorded.
///
/// Guarantees: on `Ok`, the log was healthy when the request arrived.
pub(crate) fn audit_healthy(proxy: &Proxy) -> Result<(), Refusal> {
    if proxy.audit.is_healthy() {
        Ok(())
    } else {
        Err(Refusal::new(Reason::AuditUnavailable, AUDIT_DOWN))
    }
}

/// Commits the request's decision record to the audit log and waits until it is on disk: the
/// last step before any upstream is dialed (book "Audit": no upstream contact without a
/// record).
///
/// Guarantees: on `Ok`, a reader of the log finds this request's decision even if latchkey is
/// killed the next instant; on `Err` (`audit_unavailable`) nothing was sent.
pub(crate) async fn commit_decision(entry: &mut Entry) -> Result<(), Refusal> {
    if entry.commit_decision().await {
        Ok(())
    } else {
        Err(Refusal::new(Reason::AuditUnavailable, AUDIT_DOWN))
    }
}

/// Refuses framing two parsers could read differently (`ambiguous_framing`): on the headers
/// hyper parsed ([`parsed_framing`]), then on HTTP/1 on the raw head as sent ([`raw_framing`]).
///
/// Guarantees: on `Ok`, `Content-Length` / `Transfer-Encoding` have one reading.
pub(super) fn framing(head: &Parts, ctx: &Ctx) -> Result<(), Refusal> {
    parsed_framing(&head.headers)?;
    raw_framing(ctx, &head.method, &head.uri, head.version)
}

/// The framing rules on the headers as hyper parsed them: the only check for h2.
pub(crate) fn parsed_framing(headers: &http::HeaderMap) -> Result<(), Refusal> {
    limits::check_framing(headers)
}

/// The framing rules on the raw HTTP/1 head, which hyper normalises some of away.
///
/// Assumes: on an HTTP/1 connection with a raw-head view, `begin_request` was called for this
/// request, so the view knows which head is this request's.
pub(crate) fn raw_framing(
    ctx: &Ctx,
    method: &http::Method,
    uri: &Uri,
    version: Version,
) -> Result<(), Refusal> {
    let Some(heads) = ctx.heads.as_ref().filter(|_| version < Version::HTTP_2) else {
        return Ok(());
    };
    heads.framing_of(method, uri)
}

/// Refuses a request target over `--max-uri-len` (`uri_too_long`) and a header block over
/// [`MAX_HEADER_BYTES`] (`header_too_large`).
///
/// Guarantees: on `Ok`, what later phases copy or scan of the head is bounded.
pub(super) fn within_limits(head: &Parts, max_uri_len: usize) -> Result<(), Refusal> {
    if target_len(&head.uri) > max_uri_len {
        return Err(Refusal::new(
            Reason::UriTooLong,
            format!("request target longer than {max_uri_len} bytes"),
        ));
    }
    header_block_fits(&head.headers)
}

/// Refuses a header block over [`MAX_HEADER_BYTES`] as counted on the wire (`name: value\r\n`):
/// hyper's read buffer limit is approximate, so this is the exact check.
pub(crate) fn header_block_fits(headers: &http::HeaderMap) -> Result<(), Refusal> {
    let len: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if len > MAX_HEADER_BYTES {
        return Err(Refusal::new(
            Reason::HeaderTooLarge,
            format!("request headers exceed {MAX_HEADER_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// The length of `uri` as it displays (`scheme://authority/path?query`), without formatting it.
fn target_len(uri: &Uri) -> usize {
    uri.scheme_str().map_or(0, |s| s.len() + 3)
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.path().len()
        + uri.query().map_or(0, |q| q.len() + 1)
}

/// Refuses a host whose spelling holds a secret value or a placeholder, whatever the rule:
/// before any lookup, so the value never reaches DNS. The record then shows the host as
/// `[REDACTED]` (its own case-sensitive redaction would miss a lowercased value).
///
/// Guarantees: on `Ok`, `host` may be logged, recorded and looked up.
pub(crate) fn host_clean(
    policy: &Generation,
    host: &str,
    entry: &mut Entry,
) -> Result<(), Refusal> {
    leak::check_host(policy.secrets(), host).inspect_err(|_| {
        entry.set_host(leak::REDACTED_HOST);
    })
}

/// [`host_clean`] on every spelling of the host the sandbox sent (the URI's, each `Host`
/// header's), before [`target`] reads them: its refusals quote the host, lowercased.
///
/// Assumes: the head is within the limits. Guarantees: on `Ok`, no spelling of the host the
/// sandbox sent carries a secret value or a placeholder.
pub(super) fn hosts_as_sent(
    policy: &Generation,
    head: &Parts,
    entry: &mut Entry,
) -> Result<(), Refusal> {
    let as_sent = head.uri.host().into_iter().chain(
        head.headers
            .get_all(HOST)
            .iter()
            .filter_map(|h| h.to_str().ok()),
    );
    for host in as_sent {
        host_clean(policy, host, entry)?;
    }
    Ok(())
}

/// Works out the target of a request and refuses anything ambiguous.
///
/// Assumes: `ctx.pinned` is the authority a connection-level gate already checked, if any.
/// Guarantees: on `Ok`, the scheme is how latchkey will send the request upstream — `https`
/// (inside TLS) in an interception, `http` (cleartext) for an absolute-form `http://` request
/// or a plain connection a gateway checked, whatever the port — the host normalised, the port
/// non-zero, no userinfo, inside a pinned connection every authority the request names is the
/// pinned one, and the path is origin-form with a single reading (`path::ambiguity`).
pub(super) fn target(ctx: &Ctx, head: &Parts) -> Result<Admitted, Refusal> {
    let uri = &head.uri;
    let (scheme, host, port) = match &ctx.pinned {
        Some((chost, cport)) => {
            // Inside a CONNECT: the URI authority (h2 `:authority`, absolute-form) and the Host
            // header must each name the CONNECT authority; absent means the CONNECT's. Every
            // Host header must be ASCII before anything else is compared.
            let hosts = head.headers.get_all(HOST).iter().map(|h| {
                h.to_str()
                    .map_err(|_| Refusal::new(Reason::BadRequest, "Host header is not ASCII"))
            });
            let hosts = hosts.collect::<Result<Vec<&str>, Refusal>>()?;
            let pinned_scheme = ctx.pinned_scheme;
            if let Some(s) = uri.scheme_str() {
                if !s.eq_ignore_ascii_case(pinned_scheme.as_str()) {
                    return Err(Refusal::new(
                        Reason::HostMismatch,
                        format!(
                            "{s}:// request inside a CONNECT to {}",
                            display_authority(chost, *cport)
                        ),
                    ));
                }
            }
            let seen = uri.authority().map(|a| a.as_str()).into_iter().chain(hosts);
            for authority in seen {
                let (h, p) = split_authority(authority, pinned_scheme.default_port())?;
                if h != *chost || p != *cport {
                    return Err(Refusal::new(
                        Reason::HostMismatch,
                        format!(
                            "request for {} inside a CONNECT to {}",
                            display_authority(&h, p),
                            display_authority(chost, *cport)
                        ),
                    ));
                }
            }
            (pinned_scheme, chost.clone(), *cport)
        }
        None => {
            let scheme = match uri.scheme_str() {
                None => {
                    return Err(Refusal::new(
                        Reason::NotAProxyRequest,
                        "latchkey is a forward proxy: send absolute-form requests (http://host/path) or CONNECT",
                    ))
                }
                Some("http") => Scheme::Http,
                Some("https") => Scheme::Https,
                Some(other) => {
                    return Err(Refusal::new(
                        Reason::BadRequest,
                        format!("unsupported scheme {other:?}"),
                    ))
                }
            };
            let authority = uri
                .authority()
                .ok_or_else(|| Refusal::new(Reason::BadRequest, "URL has no host"))?;
            let (h, p) = split_authority(authority.as_str(), scheme.default_port())?;
            (scheme, h, p)
        }
    };
    let path = match uri.path() {
        "" => "/",
        p => p,
    };
    if !path.starts_with('/') {
        return Err(Refusal::new(
            Reason::BadRequest,
            format!("unsupported request target {path:?}"),
        ));
    }
    if let Some(why) = crate::wire::path::ambiguity(path) {
        return Err(Refusal::new(
            Reason::AmbiguousPath,
            format!("path {path:?} {why}: an upstream may resolve it differently than policy matched it"),
        ));
    }
    let path_and_query = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    Ok(Admitted {
        scheme,
        host,
        port,
        path_and_query,
    })
}

/// Splits and normalises `host[:port]`; userinfo is refused outright.
fn split_authority(authority: &str, default_port: u16) -> Result<(String, u16), Refusal> {
    if authority.contains('@') {
        return Err(Refusal::new(
            Reason::UserinfoInUrl,
            format!("URL authority {authority:?} carries userinfo ('@'); send credentials through latchkey's policy, not in the URL"),
        ));
    }
    let bad = || Refusal::new(Reason::BadRequest, format!("invalid host {authority:?}"));
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (h, tail) = rest.split_once(']').ok_or_else(bad)?;
        let port = match tail.strip_prefix(':') {
            Some(p) => Some(p),
            None if tail.is_empty() => None,
            None => return Err(bad()),
        };
        (format!("[{h}]"), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    let port = match port {
        None | Some("") => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p != 0 => p,
            _ => return Err(bad()),
        },
    };
    let host =
        normalize_host(&host).map_err(|e| Refusal::new(Reason::BadRequest, e.to_string()))?;
    Ok((host, port))
}

/// Records what is known of the target before admission, so a refused request still shows
/// what it asked for (admission replaces these with the normalised values).
pub(super) fn prefill(r: &mut Record, ctx: &Ctx, head: &Parts) {
    let uri = &head.uri;
    r.method = Some(head.method.to_string());
    match &ctx.pinned {
        Some((host, port)) => {
            r.scheme = Some(ctx.pinned_scheme.as_str().to_string());
            r.host = Some(host.clone());
            r.port = Some(*port);
        }
        None => {
            r.scheme = uri.scheme_str().map(str::to_ascii_lowercase);
            r.host = uri.host().map(str::to_ascii_lowercase);
            r.port = uri.port_u16().or(match uri.scheme_str() {
                Some("http") => Some(80),
                Some("https") => Some(443),
                _ => None,
            });
        }
    }
    r.path = uri
        .path_and_query()
        .map(|pq| redact_query(pq.as_str()))
        .or_else(|| Some(uri.path().to_string()));
    r.original_dst = ctx.original_dst.map(|d| d.to_string());
}

/// Reads the correlation the sandbox sent (session, step, trace context) with the record's
/// scrub, counts the attempt at its step, and records them (book "Audit").
///
/// Never refuses: a value that is malformed, too long or repeated is ignored. Guarantees: no
/// secret value in force reaches the record through these fields.
pub(super) fn correlate(proxy: &Proxy, ctx: &Ctx, head: &Parts, entry: &mut Entry) -> Correlation {
    let c = proxy
        .correlator
        .request(&ctx.identity, &head.headers, |t| entry.scrub_text(t));
    entry.update(|r| c.record(r));
    c
}

#[cfg(test)]
#[path = "admit_tests.rs"]
mod tests;

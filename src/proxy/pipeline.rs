//! The request pipeline: one function that takes a request from the sandbox to the upstream and
//! back, one named step per line. Both plain `http://` proxy requests and requests inside an
//! intercepted CONNECT come through here.
//!
//! ```text
//! admit (target, normalise, Host check) → policy.decide → credentials (strip, inject)
//!   → upstream (guarded dial, pooled) → respond (decode decision, strip, scrub; see
//!   [`super::response`]) → audit (when the body ends)
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{HeaderValue, HOST};
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;

use super::respond::{refuse, ID_HEADER};
use super::{body, credentials, hop, response, Proxy};
use crate::audit::{redact_query, Entry};
use crate::policy::{display_authority, normalize_host, Scheme, Target};
use crate::reason::Reason;
use crate::upstream::{find_upstream_error, Body, UpstreamAddr};

/// Who is asking and through what: fixed for a connection.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub client: SocketAddr,
    pub identity: Arc<str>,
    /// Inside an intercepted CONNECT: the host and port the CONNECT gate checked. Every inner
    /// request must be for exactly this authority.
    pub connect: Option<(String, u16)>,
    /// Raw request heads on this HTTP/1 connection, to catch framing hyper normalises away.
    pub heads: Option<Arc<super::limits::HeadSniff>>,
}

/// A request target after admission: normalised, unambiguous, ready for policy.
#[derive(Debug)]
struct Admitted {
    scheme: Scheme,
    host: String,
    port: u16,
    path_and_query: String,
}

impl Admitted {
    fn path(&self) -> &str {
        self.path_and_query
            .split_once('?')
            .map_or(self.path_and_query.as_str(), |(p, _)| p)
    }

    fn upstream_uri(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let authority = if self.port == self.scheme.default_port() {
            host
        } else {
            format!("{host}:{}", self.port)
        };
        Uri::builder()
            .scheme(self.scheme.as_str())
            .authority(authority)
            .path_and_query(path_and_query)
            .build()
    }
}

type Refusal = (Reason, String);

/// Handles one request end to end. Never fails: every outcome is a response and a record.
pub async fn handle(
    proxy: Arc<Proxy>,
    ctx: Arc<Ctx>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let policy = proxy.policy();
    // Back-pressure from a slow audit sink: wait for queue room without holding a thread.
    proxy.audit.room().await;
    let mut entry = Entry::start(
        proxy.audit.clone(),
        ctx.client,
        &ctx.identity,
        policy.digest(),
    );
    entry.scrub_with(policy.secrets().clone());
    entry.update(|r| prefill(r, &ctx, &req));
    // fail closed: nothing goes through while its record cannot be written.
    if !proxy.audit.is_healthy() {
        drain(req.into_body()).await;
        return Ok(refused(
            entry,
            Reason::AuditUnavailable,
            None,
            super::AUDIT_DOWN,
        ));
    }

    // admit: what is being asked for, in one normal form, unambiguously framed.
    if let Err(r) = super::limits::check_framing(req.headers()) {
        return Ok(refused(entry, r.reason, None, &r.message));
    }
    // The request target as sent, for the length check.
    let target_text = req.uri().to_string();
    if let Some(heads) = ctx
        .heads
        .as_ref()
        .filter(|_| req.version() < Version::HTTP_2)
    {
        if let Err(r) = heads.framing_of(req.method(), req.uri()) {
            return Ok(refused(entry, r.reason, None, &r.message));
        }
    }
    if target_text.len() > proxy.limits.max_uri_len {
        let msg = format!(
            "request target longer than {} bytes",
            proxy.limits.max_uri_len
        );
        drain(req.into_body()).await;
        return Ok(refused(entry, Reason::UriTooLong, None, &msg));
    }
    if super::headers_too_large(req.headers()) {
        let msg = format!("request headers exceed {} bytes", super::MAX_HEADER_BYTES);
        drain(req.into_body()).await;
        return Ok(refused(entry, Reason::HeaderTooLarge, None, &msg));
    }
    // The host as sent, before admission reads it (its refusals quote the host, lowercased,
    // where the record's case-sensitive redaction would miss a value) and before any lookup.
    let as_sent = req.uri().host().into_iter().chain(
        req.headers()
            .get_all(HOST)
            .iter()
            .filter_map(|h| h.to_str().ok()),
    );
    for host in as_sent {
        if let Err((reason, message)) = super::outbound::check_host(&policy, host) {
            entry.update(|r| r.host = Some(super::outbound::REDACTED_HOST.to_string()));
            drain(req.into_body()).await;
            return Ok(refused(entry, reason, None, &message));
        }
    }
    let target = match admit(&ctx, &req) {
        Ok(t) => t,
        Err((reason, message)) => {
            drain(req.into_body()).await;
            return Ok(refused(entry, reason, None, &message));
        }
    };
    entry.update(|r| {
        r.scheme = Some(target.scheme.as_str().to_string());
        r.host = Some(target.host.clone());
        r.port = Some(target.port);
        r.path = Some(redact_query(&target.path_and_query));
    });
    // The host as normalised, before policy and long before any lookup: a secret value or a
    // placeholder in it (a subdomain under a `*.` rule) is refused whatever the rule.
    for host in std::iter::once(target.host.as_str()) {
        if let Err((reason, message)) = super::outbound::check_host(&policy, host) {
            entry.update(|r| r.host = Some(super::outbound::REDACTED_HOST.to_string()));
            drain(req.into_body()).await;
            return Ok(refused(entry, reason, None, &message));
        }
    }

    // identify: inside a CONNECT the CONNECT's identity holds; it must still exist in the
    // policy in force (a reload may have removed it: fail closed).
    let identity = if policy.identities().is_empty() {
        None
    } else {
        match policy.identity(&ctx.identity) {
            Some(i) => Some(i),
            None => {
                let msg = format!(
                    "identity '{}' is not defined by the policy in force",
                    ctx.identity
                );
                drain(req.into_body()).await;
                return Ok(refused(entry, Reason::ProxyAuthRequired, None, &msg));
            }
        }
    };

    // decide: deny by default.
    let decision = policy.decide(&Target {
        identity,
        scheme: target.scheme,
        host: &target.host,
        port: target.port,
        method: req.method(),
        path: target.path(),
    });
    // report-only: a policy denial under `--mode report` or a rule in report mode goes through,
    // marked `would_deny`, under an empty rule (no secrets ride on a would-be denial).
    let mut report: Option<(Reason, Option<String>)> = None;
    let rule = match decision.rule {
        Some(rule) if decision.allowed() => rule,
        closest
            if decision.reason.is_policy_denial()
                && (proxy.report_all || closest.is_some_and(|r| r.report)) =>
        {
            tracing::warn!(audit.id = %entry.id(), reason = decision.reason.code(), message = %entry.scrub_text(&decision.message), "report-only: would deny");
            report = Some((decision.reason, decision.rule_name().map(str::to_string)));
            &proxy.report_rule
        }
        _ => {
            drain(req.into_body()).await;
            return Ok(refused(
                entry,
                decision.reason,
                decision.rule_name(),
                &decision.message,
            ));
        }
    };
    // admit, with the rule: under a rule with `paths`, `;` parameters and empty segments.
    if let Err(why) = super::path::check_rule_path(target.path(), rule.paths.is_some()) {
        let msg = format!(
            "path {:?} {why}: an upstream may resolve it differently than policy matched it",
            target.path()
        );
        drain(req.into_body()).await;
        return Ok(refused(
            entry,
            Reason::AmbiguousPath,
            Some(&rule.name),
            &msg,
        ));
    }
    let record_rule = match &report {
        Some((_, closest)) => closest.clone().unwrap_or_else(|| rule.name.clone()),
        None => rule.name.clone(),
    };
    entry.update(|r| {
        r.rule = Some(record_rule.clone());
        r.would_deny = report.is_some();
    });

    // credentials: check what the sandbox sent, strip its auth, replace placeholders, inject.
    let is_head = req.method() == http::Method::HEAD;
    let (mut parts, incoming) = req.into_parts();
    // The host as the sandbox spelled it, each place it did: checked before any DNS lookup.
    let mut sent_hosts: Vec<String> = parts.uri.host().map(str::to_string).into_iter().collect();
    sent_hosts.extend(
        parts
            .headers
            .get_all(HOST)
            .iter()
            .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned()),
    );
    sent_hosts.push(target.host.clone());
    let sent_hosts: Vec<&str> = sent_hosts.iter().map(String::as_str).collect();
    hop::strip(&mut parts.headers);
    parts.headers.remove(HOST);
    let mut path_and_query = target.path_and_query.clone();
    let exchanger = proxy.exchanger(ctx.client, ctx.identity.clone());
    let method = parts.method.to_string();
    let request_cx = credentials::RequestCx {
        method: &method,
        scheme: target.scheme.as_str(),
        host: &target.host,
        port: target.port,
        identity: &ctx.identity,
        exchanger: &*exchanger,
        sent_hosts: &sent_hosts,
        client: ctx.client.ip(),
        budget: &proxy.budget,
        body_timeout: proxy.body_timeout,
    };
    let brokered = match credentials::apply(
        &policy,
        rule,
        &request_cx,
        &mut parts.headers,
        &mut path_and_query,
        incoming,
        entry.counters(),
    )
    .await
    {
        Ok(b) => b,
        Err((reason, message)) => return Ok(refused(entry, reason, Some(&rule.name), &message)),
    };
    entry.update(|r| r.secrets = brokered.secrets.iter().cloned().collect());
    let body_refused = brokered.refused.clone();
    // Responses are scanned for every value in force when this rule or any other rule that
    // names the host binds a secret: that host may have received one and may reflect it.
    let scan = if rule.bound.is_empty()
        && rule.credential.is_none()
        && !policy.binds_secrets_to(&target.host)
    {
        None
    } else {
        match policy.secrets().scrubber() {
            Ok(s) => s,
            Err(e) => {
                let msg = format!("cannot inspect the response for secret values: {e}");
                return Ok(refused(
                    entry,
                    Reason::SecretUnavailable,
                    Some(&rule.name),
                    &msg,
                ));
            }
        }
    };
    if scan.is_some() {
        narrow_accept_encoding(&mut parts.headers);
    }
    parts.uri = match target.upstream_uri(&path_and_query) {
        Ok(u) => u,
        Err(e) => {
            let msg = format!("cannot build upstream URL: {e}");
            return Ok(refused(entry, Reason::BadRequest, Some(&rule.name), &msg));
        }
    };
    parts.version = Version::HTTP_11;
    parts.extensions = http::Extensions::new();
    let upstream_req = Request::from_parts(parts, brokered.body);

    // upstream: guarded dial (pooled), response headers within the timeout.
    // Provisional outcome: if this task ends before the response (shutdown deadline, the
    // client leaving), the record says policy allowed it and the exchange did not complete.
    match &report {
        Some((reason, _)) => entry.outcome_report(*reason, Some(&record_rule), None),
        None => entry.outcome(Reason::UpstreamError, Some(&rule.name), None),
    }
    let client = proxy.client_for(&rule.allow_private);
    let sent_at = std::time::Instant::now();
    let sent = tokio::time::timeout(proxy.response_timeout, client.request(upstream_req));
    let res = match sent.await {
        Ok(Ok(res)) => res,
        Ok(Err(e)) => {
            if let Some(r) = body_refused.get().or_else(|| body::refusal_in(&e)) {
                return Ok(refused(entry, r.reason, Some(&rule.name), &r.message));
            }
            let (reason, why) = match find_upstream_error(&e) {
                Some(u) => (u.reason(), u.to_string()),
                None => (Reason::UpstreamError, error_chain(&e)),
            };
            let url =
                crate::policy::display_url(target.scheme, &target.host, target.port, target.path());
            let why = entry.scrub_text(&why);
            let url = entry.scrub_text(&url);
            tracing::warn!(audit.id = %entry.id(), url.host = %target.host, error = %why, "upstream failed");
            return Ok(refused(
                entry,
                reason,
                Some(&rule.name),
                &format!("{url}: {why}"),
            ));
        }
        Err(_) => {
            return Ok(refused(
                entry,
                Reason::UpstreamTimeout,
                Some(&rule.name),
                &format!(
                    "{} did not answer within {}s",
                    target.host,
                    proxy.response_timeout.as_secs()
                ),
            ))
        }
    };

    proxy
        .metrics()
        .upstream_latency
        .observe(sent_at.elapsed().as_secs_f64());

    // respond: record what came back, then the response phase (codings decided on the head as
    // received, hop-by-hop and latchkey's own headers stripped, everything scanned); the
    // record is written when the body ends.
    let upstream = res.extensions().get::<UpstreamAddr>().map(|a| a.0);
    let status = res.status().as_u16();
    match &report {
        Some((reason, _)) => entry.outcome_report(*reason, Some(&record_rule), Some(status)),
        None => entry.outcome(Reason::Allowed, Some(&rule.name), Some(status)),
    }
    entry.update(|r| r.upstream = upstream.map(|a| a.to_string()));
    let response_cx = response::ResponseCx {
        host: &target.host,
        is_head,
        scan,
        max_decoded: proxy.max_decoded_body,
        counters: entry.counters(),
    };
    let mut res = match response::filter(res, response_cx).await {
        Ok(res) => res,
        Err((reason, message)) => return Ok(refused(entry, reason, Some(&rule.name), &message)),
    };
    if let Ok(v) = HeaderValue::from_str(entry.id()) {
        res.headers_mut().insert(ID_HEADER, v);
    }
    Ok(res.map(|b| body::audited(b, entry, Some(body_refused))))
}

/// Keeps only the content codings latchkey can decode for inspection.
fn narrow_accept_encoding(headers: &mut http::HeaderMap) {
    let Some(v) = headers.get(http::header::ACCEPT_ENCODING) else {
        return;
    };
    let kept: Vec<String> = v
        .to_str()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|t| {
            let coding = t
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase();
            matches!(
                coding.as_str(),
                "gzip" | "x-gzip" | "deflate" | "br" | "identity"
            )
        })
        .map(str::to_string)
        .collect();
    let value = if kept.is_empty() {
        "identity".to_string()
    } else {
        kept.join(", ")
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(http::header::ACCEPT_ENCODING, v);
    }
}

/// Records what is known of the target before admission, so a refused request still shows
/// what it asked for (admission replaces these with the normalised values).
fn prefill(r: &mut crate::audit::Record, ctx: &Ctx, req: &Request<Incoming>) {
    let uri = req.uri();
    r.method = Some(req.method().to_string());
    match &ctx.connect {
        Some((host, port)) => {
            r.scheme = Some("https".to_string());
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
}

/// Reads and discards a refused request's body (bounded in size and time) before answering:
/// answering first makes h2 reset the stream, and some clients then report a framing error
/// instead of the refusal.
async fn drain(mut body: Incoming) {
    use http_body::Body as _;
    use http_body_util::BodyExt;
    const LIMIT: usize = 1024 * 1024;
    if body.is_end_stream() {
        return;
    }
    let read = async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > LIMIT {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), read).await;
}

/// Writes the record for a refusal and builds its response.
fn refused(mut entry: Entry, reason: Reason, rule: Option<&str>, message: &str) -> Response<Body> {
    // A denial may quote the URL, and the URL may hold a secret the sandbox pasted into it.
    let message = entry.scrub_text(message);
    let res = refuse(reason, rule, &message, entry.id());
    entry.outcome(reason, rule, Some(res.status().as_u16()));
    entry.finish();
    res
}

/// Works out the target of a request and refuses anything ambiguous.
fn admit(ctx: &Ctx, req: &Request<Incoming>) -> Result<Admitted, Refusal> {
    let uri = req.uri();
    let (scheme, host, port) = match &ctx.connect {
        Some((chost, cport)) => {
            // Inside a CONNECT: the URI authority (h2 `:authority`, absolute-form) and the Host
            // header must each name the CONNECT authority; absent means the CONNECT's.
            let mut seen = Vec::new();
            if let Some(a) = uri.authority() {
                seen.push(a.as_str().to_string());
            }
            for h in req.headers().get_all(HOST) {
                seen.push(
                    h.to_str()
                        .map_err(|_| (Reason::BadRequest, "Host header is not ASCII".to_string()))?
                        .to_string(),
                );
            }
            if let Some(s) = uri.scheme_str() {
                if s != "https" {
                    return Err((
                        Reason::HostMismatch,
                        format!(
                            "{s}:// request inside a CONNECT to {}",
                            display_authority(chost, *cport)
                        ),
                    ));
                }
            }
            for authority in seen {
                let (h, p) = split_authority(&authority, 443)?;
                if h != *chost || p != *cport {
                    return Err((
                        Reason::HostMismatch,
                        format!(
                            "request for {} inside a CONNECT to {}",
                            display_authority(&h, p),
                            display_authority(chost, *cport)
                        ),
                    ));
                }
            }
            (Scheme::Https, chost.clone(), *cport)
        }
        None => {
            let scheme = match uri.scheme_str() {
                None => {
                    return Err((
                        Reason::NotAProxyRequest,
                        "latchkey is a forward proxy: send absolute-form requests (http://host/path) or CONNECT".to_string(),
                    ))
                }
                Some("http") => Scheme::Http,
                Some("https") => Scheme::Https,
                Some(other) => {
                    return Err((Reason::BadRequest, format!("unsupported scheme {other:?}")))
                }
            };
            let authority = uri
                .authority()
                .ok_or_else(|| (Reason::BadRequest, "URL has no host".to_string()))?;
            let (h, p) = split_authority(authority.as_str(), scheme.default_port())?;
            (scheme, h, p)
        }
    };
    let path = match uri.path() {
        "" => "/",
        p => p,
    };
    if !path.starts_with('/') {
        return Err((
            Reason::BadRequest,
            format!("unsupported request target {path:?}"),
        ));
    }
    if let Some(why) = super::path::ambiguity(path) {
        return Err((
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
        return Err((
            Reason::UserinfoInUrl,
            format!("URL authority {authority:?} carries userinfo ('@'); send credentials through latchkey's policy, not in the URL"),
        ));
    }
    let bad = || (Reason::BadRequest, format!("invalid host {authority:?}"));
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
    let host = normalize_host(&host).map_err(|e| (Reason::BadRequest, e.to_string()))?;
    Ok((host, port))
}

/// `a: b: c` from an error and its sources.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_are_split_and_normalised() {
        assert_eq!(
            split_authority("API.test:8443", 443).ok(),
            Some(("api.test".into(), 8443))
        );
        assert_eq!(
            split_authority("api.test", 443).ok(),
            Some(("api.test".into(), 443))
        );
        assert_eq!(
            split_authority("[::1]:80", 443).ok(),
            Some(("::1".into(), 80))
        );
        assert_eq!(
            split_authority("a@b.test", 80).err().map(|e| e.0),
            Some(Reason::UserinfoInUrl)
        );
        assert_eq!(
            split_authority("b.test:0", 80).err().map(|e| e.0),
            Some(Reason::BadRequest)
        );
        assert_eq!(
            split_authority("b.test:x", 80).err().map(|e| e.0),
            Some(Reason::BadRequest)
        );
    }
}

//! The broker and send phases: the request as it leaves latchkey, and the upstream's answer.
//!
//! Broker turns the sandbox's request into the one the upstream gets (hop-by-hop headers and
//! `Host` gone, then `broker::apply`: check, strip, placeholders, inject, sign) and decides
//! whether the response will be scanned. Send hands it to the pooled, guarded client and maps
//! every failure to a reason. Only `upstream` dials: this module calls its client.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use http::header::{HeaderValue, ACCEPT_ENCODING, HOST};
use http::{HeaderMap, Request, Response, Uri, Version};
use hyper::body::Incoming;

use super::super::broker;
use super::super::request_body::BodyRefused;
use super::super::{body, Generation, Proxy};
use super::admit::Admitted;
use super::request::Req;
use crate::audit::Stage;
use crate::policy::{display_url, Rule, Scheme};
use crate::reason::{chain_text, Reason, Refusal};
use crate::secrets::scrub::Scrubber;
use crate::upstream::{find_upstream_error, tls_failure_in, Body, ClientIdentity};
use crate::wire::hop;

/// The request as latchkey sends it, and what the response phase needs to know about it.
pub(super) struct Outgoing {
    pub request: Request<Body>,
    pub plan: Plan,
}

/// What the respond and record phases need to know about the request that was sent.
pub(super) struct Plan {
    /// Where the streaming body detector leaves its refusal if it cuts the upload off: the
    /// client's error does not always carry it (an h2 upstream sees only a stream reset).
    pub body_refused: Arc<OnceLock<BodyRefused>>,
    /// The matcher for secret values when the response must be scanned.
    pub scan: Option<Arc<Scrubber>>,
    /// A HEAD request: its response has no body whatever the headers say.
    pub is_head: bool,
    /// The client certificate the rule's `client_cert` credential presents upstream.
    pub identity: Option<ClientIdentity>,
}

/// The broker phase: strips what is the sandbox's own, checks and brokers credentials, and
/// builds the upstream request.
///
/// Assumes: `target` was admitted and `rule` allowed it (or is the empty report rule).
/// Guarantees: on `Ok`, the request holds no hop-by-hop header, no `Host` (hyper writes the
/// authority), no correlation header the rule does not keep (`correlate::Correlator::forward`), no secret the rule does not bind and no placeholder left unreplaced; its body is
/// watched as it streams; `accept-encoding` is narrowed to what latchkey decodes when the
/// response will be scanned. The record names the secrets used.
pub(super) async fn broker(req: &mut Req<'_>) -> Result<Outgoing, Refusal> {
    let (proxy, ctx, policy, rule) = (req.proxy, req.ctx, &**req.policy, req.rule());
    let incoming = req.take_inbound()?;
    // The head goes into the upstream request; what stays behind is empty.
    let mut head = std::mem::replace(&mut req.head, http::Request::new(()).into_parts().0);
    let target = &req.target;
    let is_head = head.method == http::Method::HEAD;
    // The host as the sandbox spelled it, each place it did, for the leak check (taken out of
    // the headers first: the request goes on without them).
    let host_headers = take_all(&mut head.headers, HOST);
    let lossy: Vec<String> = host_headers
        .iter()
        .filter(|v| std::str::from_utf8(v.as_bytes()).is_err())
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    let mut lossy = lossy.iter().map(String::as_str);
    let mut sent_hosts: Vec<&str> = Vec::with_capacity(host_headers.len() + 2);
    sent_hosts.extend(head.uri.host());
    for v in &host_headers {
        sent_hosts.extend(
            std::str::from_utf8(v.as_bytes())
                .ok()
                .or_else(|| lossy.next()),
        );
    }
    sent_hosts.push(&target.host);
    hop::strip(&mut head.headers);
    // A WebSocket handshake keeps its upgrade headers (and offers no extension).
    if let Some(h) = &req.handshake {
        h.restore(&mut head.headers);
    }
    // latchkey's own correlation headers go only where the rule keeps them; trace context is
    // latchkey's span under `--otlp`. Before the checks: what is forwarded is checked.
    proxy
        .correlator
        .forward(&mut head.headers, &rule.keep_headers, &req.correlation);

    let mut path_and_query = target.path_and_query.clone();
    // Looked up (in memory, else the state store) only for a request that can use one; over
    // cleartext only a capture with `dangerously_allow_cleartext` lends its tokens.
    let (captured, withheld) = if may_use_captured(rule, &head.headers, &path_and_query) {
        captured_for(proxy, policy, &ctx.identity, &target.host, target.scheme).await
    } else {
        Default::default()
    };
    let exchanger = proxy.exchanger(ctx.client, ctx.identity.clone());
    let request_cx = broker::RequestCx {
        method: head.method.as_str(),
        scheme: target.scheme.as_str(),
        host: &target.host,
        port: target.port,
        identity: &ctx.identity,
        exchanger: &exchanger,
        aws: proxy.aws.as_deref(),
        sent_hosts: &sent_hosts,
        client: ctx.client.ip(),
        budget: &proxy.budget,
        body_timeout: proxy.body_timeout,
        captured: &captured,
        withheld: &withheld,
    };
    let brokered = broker::apply(
        policy,
        rule,
        &request_cx,
        broker::Parts {
            headers: &mut head.headers,
            path_and_query: &mut path_and_query,
        },
        incoming,
        req.entry.counters(),
    )
    .await
    .map_err(|r| r.under(&rule.name))?;
    req.entry
        .set_secrets(brokered.secrets.iter().cloned().collect());
    if !brokered.secrets.is_empty() {
        let store = policy.secrets();
        let kinds = brokered
            .secrets
            .iter()
            .filter_map(|name| Some((name.clone(), store.kind(name)?)))
            .collect();
        let stale = brokered
            .secrets
            .iter()
            .filter(|name| store.stale(name))
            .cloned()
            .collect();
        req.entry.set_secret_sources(kinds, stale);
    }

    let identity = client_identity(proxy, policy, rule).await?;
    let scan = scan_for(policy, rule, &target.host)?;
    if scan.is_some() {
        narrow_accept_encoding(&mut head.headers);
    }
    head.uri = upstream_uri(target, &path_and_query).map_err(|e| {
        Refusal::new(
            Reason::BadRequest,
            format!("cannot build upstream URL: {e}"),
        )
        .under(&rule.name)
    })?;
    head.version = Version::HTTP_11;
    head.extensions = http::Extensions::new();
    Ok(Outgoing {
        request: Request::from_parts(head, brokered.body),
        plan: Plan {
            body_refused: brokered.refused,
            scan,
            is_head,
            identity,
        },
    })
}

/// The client certificate a rule's `client_cert` credential presents on its upstream
/// connections, from this generation's secret store (a rotated `file:` is read again, and its
/// new bytes make a new identity, so a new pool); `None` for a rule without one. A certificate
/// or key that cannot be read or used refuses the request (`credential_failed`, naming the
/// credential, never the bytes).
async fn client_identity(
    proxy: &Proxy,
    policy: &Generation,
    rule: &Rule,
) -> Result<Option<ClientIdentity>, Refusal> {
    let Some(c) = rule.credential.as_ref().and_then(|n| policy.credential(n)) else {
        return Ok(None);
    };
    if !matches!(c.kind, crate::signing::Kind::ClientCert) {
        return Ok(None);
    }
    let failed = |why: String| {
        Refusal::new(
            Reason::CredentialFailed,
            format!("credential '{}': {why}", c.name),
        )
        .under(&rule.name)
    };
    let store = policy.secrets();
    let read = |field: &'static str| async move {
        store
            .get(&crate::signing::field_key(&c.name, field))
            .await
            .map_err(|e| failed(e.to_string()))
    };
    let (cert, key) = (read("cert").await?, read("key").await?);
    proxy
        .client_identity(&c.name, cert.expose(), key.expose())
        .map(Some)
        .map_err(|e| failed(e.to_string()))
}

/// Whether a request could carry a captured token's placeholder where it is replaced: the token
/// endpoint itself (the refresh body), a rule replacing placeholders in bodies, or a head that
/// shows one — raw, percent-encoded in the query, or inside `Basic` credentials (base64).
fn may_use_captured(rule: &Rule, headers: &HeaderMap, path_and_query: &str) -> bool {
    const MARK: &[u8] = b"LATCHKEY_";
    let holds = |b: &[u8]| memchr::memmem::find(b, MARK).is_some();
    rule.capture.is_some()
        || rule
            .placeholders
            .contains(&crate::secrets::placeholder::Place::Body)
        || holds(path_and_query.as_bytes())
        || headers.values().any(|v| {
            holds(v.as_bytes())
                || v.as_bytes()
                    .get(..6)
                    .is_some_and(|p| p.eq_ignore_ascii_case(b"basic "))
        })
}

/// The captured tokens `identity` holds that may go to `host` in a request sent with `scheme`,
/// by name, and the names of those that may go to `host` but not in cleartext (withheld from
/// an `http` request: a credential never travels in cleartext unless the capturing rule says
/// `dangerously_allow_cleartext`). Each token is (again) in the redaction set before it can
/// leave: after a restart it comes from the state store.
async fn captured_for(
    proxy: &Proxy,
    policy: &Generation,
    identity: &str,
    host: &str,
    scheme: Scheme,
) -> (
    std::collections::HashMap<String, crate::secrets::SecretValue>,
    std::collections::BTreeSet<String>,
) {
    // Named first: the policy's iterator is not held across the store's awaits.
    let mut names: Vec<String> = Vec::new();
    let mut withheld = std::collections::BTreeSet::new();
    for c in policy.captures_binding(host) {
        let lent = scheme == Scheme::Https || c.cleartext;
        for f in &c.fields {
            if lent {
                names.push(c.secret_name(f));
            } else {
                withheld.insert(c.secret_name(f));
            }
        }
    }
    // A name another capture lends here is not withheld.
    withheld.retain(|n| !names.contains(n));
    let mut out = std::collections::HashMap::new();
    for name in names {
        if let Some(v) = proxy.captured_tokens().get(identity, &name).await {
            policy.secrets().set_minted(&name, identity, &v);
            out.insert(name, v);
        }
    }
    (out, withheld)
}

/// The send phase: the pooled client for the rule's `allow_private` set (which resolves, guards
/// and dials), response headers within `--response-timeout`.
///
/// Guarantees: on `Err`, the reason says whose failure it was — a body the detector refused
/// mid-stream wins over the transport error it caused; then the guard's or the dialer's
/// classification; else `upstream_error` with the error chain — and the message names the URL
/// (scrubbed: the sandbox may have pasted a secret into it).
pub(super) async fn send(
    req: &mut Req<'_>,
    out: Outgoing,
) -> Result<(Response<Incoming>, Plan), Refusal> {
    // Provisionally an upstream error: a request cut short (shutdown, the client leaving) is
    // recorded as allowed by policy and not completed.
    req.entry.reached(Stage::Sent);
    let (proxy, rule, target, entry) = (req.proxy, req.rule(), &req.target, &*req.entry);
    let Outgoing { request, plan } = out;
    let body_refused = &plan.body_refused;
    // An upgrade needs an HTTP/1.1 connection: its client never negotiates h2.
    let client = proxy.client_for(
        &rule.allow_private,
        req.handshake.is_some(),
        plan.identity.clone(),
    );
    let sent_at = Instant::now();
    let sent = tokio::time::timeout(proxy.response_timeout, client.request(request)).await;
    let res = match sent {
        Ok(Ok(res)) => res,
        Ok(Err(e)) => {
            if let Some(r) = body_refused.get().or_else(|| body::refusal_in(&e)) {
                return Err(Refusal::new(r.reason, r.message.clone()).under(&rule.name));
            }
            let (reason, why) = match find_upstream_error(&e) {
                Some(u) => (u.reason(), u.to_string()),
                // An alert after the handshake (a client certificate refused, under TLS 1.3).
                None if tls_failure_in(&e) => (Reason::UpstreamTls, chain_text(&e)),
                None => (Reason::UpstreamError, chain_text(&e)),
            };
            let url = display_url(target.scheme, &target.host, target.port, target.path());
            let why = entry.scrub_text(&why);
            let url = entry.scrub_text(&url);
            tracing::warn!(audit.id = %entry.id(), url.host = %target.host, error = %why, "upstream failed");
            return Err(Refusal::new(reason, format!("{url}: {why}")).under(&rule.name));
        }
        Err(_) => {
            return Err(Refusal::new(
                Reason::UpstreamTimeout,
                format!(
                    "{} did not answer within {}s (latchkey serve --response-timeout)",
                    target.host,
                    proxy.response_timeout.as_secs()
                ),
            )
            .under(&rule.name))
        }
    };
    proxy
        .metrics()
        .upstream_latency
        .observe(sent_at.elapsed().as_secs_f64());
    Ok((res, plan))
}

/// The matcher responses are scanned with, when they must be: this rule or any other rule that
/// names the host binds a secret, so that host may have received one and may reflect it.
fn scan_for(
    policy: &Generation,
    rule: &Rule,
    host: &str,
) -> Result<Option<Arc<Scrubber>>, Refusal> {
    if rule.bound.is_empty() && rule.credential.is_none() && !policy.binds_secrets_to(host) {
        return Ok(None);
    }
    policy.secrets().scrubber().map_err(|e| {
        Refusal::new(
            Reason::SecretUnavailable,
            format!("cannot inspect the response for secret values: {e}"),
        )
        .under(&rule.name)
    })
}

/// The absolute URL the upstream request goes to (the default port left out).
fn upstream_uri(target: &Admitted, path_and_query: &str) -> Result<Uri, http::uri::InvalidUri> {
    Uri::try_from(display_url(
        target.scheme,
        &target.host,
        target.port,
        path_and_query,
    ))
}

/// Removes every value of `name` from `headers` and returns them, in order.
fn take_all(headers: &mut HeaderMap, name: http::header::HeaderName) -> Vec<HeaderValue> {
    match headers.entry(name) {
        http::header::Entry::Occupied(e) => e.remove_entry_mult().1.collect(),
        http::header::Entry::Vacant(_) => Vec::new(),
    }
}

/// Keeps only the content codings latchkey can decode for inspection.
fn narrow_accept_encoding(headers: &mut HeaderMap) {
    let Some(v) = headers.get(ACCEPT_ENCODING) else {
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
        headers.insert(ACCEPT_ENCODING, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(scheme: Scheme, host: &str, port: u16) -> Admitted {
        Admitted {
            scheme,
            host: host.to_string(),
            port,
            path_and_query: "/a?b=c".to_string(),
        }
    }

    #[test]
    fn the_upstream_url_leaves_out_the_default_port_and_brackets_ipv6() {
        let uri = |t: &Admitted| upstream_uri(t, &t.path_and_query).expect("uri").to_string();
        assert_eq!(
            uri(&admitted(Scheme::Https, "api.test", 443)),
            "https://api.test/a?b=c"
        );
        assert_eq!(
            uri(&admitted(Scheme::Http, "api.test", 8080)),
            "http://api.test:8080/a?b=c"
        );
        assert_eq!(
            uri(&admitted(Scheme::Https, "::1", 8443)),
            "https://[::1]:8443/a?b=c"
        );
        assert_eq!(
            uri(&admitted(Scheme::Http, "::1", 80)),
            "http://[::1]/a?b=c"
        );
    }

    #[test]
    fn captured_tokens_are_looked_up_only_for_a_request_that_can_use_one() {
        let rule = Rule::report_only();
        let mut h = HeaderMap::new();
        h.insert("accept", HeaderValue::from_static("*/*"));
        assert!(!may_use_captured(&rule, &h, "/v1/me?x=1"));
        assert!(may_use_captured(
            &rule,
            &h,
            "/v1/me?t=%5F%5FLATCHKEY_idp_access_token%5F%5F"
        ));
        h.insert(
            "authorization",
            HeaderValue::from_static("Bearer __LATCHKEY_idp_access_token__"),
        );
        assert!(may_use_captured(&rule, &h, "/v1/me"));
        h.insert("authorization", HeaderValue::from_static("BASIC eDp5"));
        assert!(may_use_captured(&rule, &h, "/v1/me"));
    }

    #[test]
    fn every_host_header_is_taken_in_order() {
        let mut h = HeaderMap::new();
        h.append(HOST, HeaderValue::from_static("a.test"));
        h.append(HOST, HeaderValue::from_static("b.test"));
        h.append("x-other", HeaderValue::from_static("kept"));
        let taken = take_all(&mut h, HOST);
        assert_eq!(taken, ["a.test", "b.test"]);
        assert!(!h.contains_key(HOST));
        assert_eq!(h.len(), 1);
        assert!(take_all(&mut h, HOST).is_empty());
    }

    #[test]
    fn accept_encoding_is_narrowed_to_what_latchkey_decodes() {
        let mut h = HeaderMap::new();
        h.insert(
            ACCEPT_ENCODING,
            HeaderValue::from_static("zstd, GZIP;q=1, br"),
        );
        narrow_accept_encoding(&mut h);
        assert_eq!(h[ACCEPT_ENCODING], "GZIP;q=1, br");
        h.insert(ACCEPT_ENCODING, HeaderValue::from_static("zstd"));
        narrow_accept_encoding(&mut h);
        assert_eq!(h[ACCEPT_ENCODING], "identity");
    }
}

//! The credentials step of the pipeline: check what the sandbox sent, strip its auth, replace
//! placeholders, inject secrets.
//!
//! Order matters and is fixed:
//! 1. check every part of the head as sent ([`outbound::Checker::head`]): placeholders that are
//!    malformed, unknown, unbound to this rule's hosts, or in a place the rule does not enable,
//!    then any secret value (raw or encoded) where the rule does not bind it;
//! 2. the body: streamed to the upstream through the [`outbound::Detector`] unless a feature
//!    needs it whole (a signed SigV4 payload up to `max_signed_body`, body placeholders up to
//!    [`SCAN_LIMIT`]); a small body that is already there when the head is read is held whole
//!    (up to [`PEEK_LIMIT`]) and checked before dialing. Every held byte is charged to the
//!    buffer budget ([`super::budget`]);
//! 3. a body held whole is checked like the head (placeholders, secret values, trailers);
//! 4. strip the sandbox's auth headers on a rule that injects;
//! 5. replace allowed placeholders; 6. inject the rule's headers, query and basic auth last.
//!
//! Refusal messages name secrets and hosts, never values.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_LENGTH};
use http::HeaderMap;
use http_body::Body as HttpBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use percent_encoding::{percent_decode, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::body;
use super::budget::{Budget, Charge};
use super::outbound::{self, basic_decoded, Detector, Prefixed, Progress};
use crate::audit::Counters;
use crate::policy::{Policy, Rule};
use crate::reason::Reason;
use crate::secrets::placeholder::{self, Place};
use crate::secrets::{SecretError, SecretValue};
use crate::signing;
use crate::upstream::Body;

pub use super::outbound::BodyRefused;

pub use crate::wire::limits::SCAN_LIMIT;

/// A body no larger than this that has already arrived with the head is held whole and checked
/// before dialing, so a small leak never even opens an upstream connection.
pub const PEEK_LIMIT: usize = 64 * 1024;

/// How long to wait for the first body bytes before streaming anyway (a client may wait for
/// the response before it sends).
const PEEK_WAIT: Duration = Duration::from_millis(200);

/// Headers a sandbox might use to carry its own credentials; stripped on injecting rules.
const AUTH_HEADERS: [&str; 6] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "cookie",
];

/// Unreserved characters stay as they are in query values; everything else is encoded.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

pub type Refusal = (Reason, String);

/// The request the credentials step works on, as latchkey will send it.
pub struct RequestCx<'a> {
    pub method: &'a str,
    pub scheme: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub identity: &'a str,
    /// Reaches token endpoints through the guarded, audited client.
    pub exchanger: &'a signing::Exchanger,
    /// Every spelling of the host the sandbox sent, before normalisation.
    pub sent_hosts: &'a [&'a str],
    /// Who is charged for buffered body bytes.
    pub client: IpAddr,
    pub budget: &'a Arc<Budget>,
    /// `--body-timeout`.
    pub body_timeout: Duration,
}

/// What the credentials step produced.
pub struct Brokered {
    pub body: Body,
    /// Names of secrets injected or substituted.
    pub secrets: BTreeSet<String>,
    /// Set when a streamed body was aborted (a leak, a stalled client): the client's error
    /// does not always carry the cause (an h2 upstream sees only a stream reset).
    pub refused: Arc<std::sync::OnceLock<BodyRefused>>,
}

fn unavailable(e: SecretError) -> Refusal {
    (Reason::SecretUnavailable, e.to_string())
}

/// Whether S3 accepts this credential's requests signed as `UNSIGNED-PAYLOAD`, so a body that
/// does not fit the buffer budget can stream instead of being refused.
fn unsigned_payload_allowed(kind: &signing::Kind, host: &str) -> bool {
    match kind {
        signing::Kind::AwsSigV4 { service, .. } => {
            let service = service
                .clone()
                .or_else(|| signing::derive_region_service(host).map(|(_, s)| s));
            service.as_deref() == Some("s3")
        }
        _ => false,
    }
}

/// Runs steps 1–6 on the request parts and body.
#[allow(clippy::too_many_arguments)]
pub async fn apply(
    policy: &Policy,
    rule: &Rule,
    req: &RequestCx<'_>,
    headers: &mut HeaderMap,
    path_and_query: &mut String,
    incoming: Incoming,
    counters: Arc<Counters>,
) -> Result<Brokered, Refusal> {
    let (identity, host) = (req.identity, req.host);
    let store = policy.secrets().clone();
    let mut used = BTreeSet::new();

    // Even without any secret declared, a placeholder is refused below (it names a secret that
    // does not exist) rather than forwarded.
    let scrubber = store.scrubber().map_err(|e| {
        (
            Reason::SecretUnavailable,
            format!("cannot search the request for secret values: {e}"),
        )
    })?;

    // 1. the head, as sent: every part, one check.
    let checker = outbound::Checker {
        scrubber: scrubber.as_deref(),
        policy,
        rule,
        host,
    };
    let head = checker.head(&outbound::Head {
        method: req.method,
        hosts: req.sent_hosts,
        path_and_query,
        headers,
    });
    let mut names = match head {
        Ok(names) => names,
        Err(refusal) => {
            // Read (and drop) what the client is still sending, so it reads the refusal.
            outbound::drain(Progress::new(incoming, req.body_timeout)).await;
            return Err(refusal);
        }
    };

    // A body in a content coding (or gRPC messages compressed) hides its bytes from the leak
    // detector: refused, never forwarded unscanned. `aws-chunked` is framing around plain
    // bytes (S3 streaming uploads), which the detector reads as they are.
    if scrubber.is_some() && !incoming.is_end_stream() {
        if let Some(why) = request_coding(headers) {
            outbound::drain(Progress::new(incoming, req.body_timeout)).await;
            return Err((
                Reason::UninspectableRequestBody,
                format!("the request body to host {host} is sent {why}: latchkey cannot inspect it for secret values; send it uncompressed"),
            ));
        }
    }

    let credential = match &rule.credential {
        Some(name) => Some(policy.credential(name).ok_or_else(|| {
            (
                Reason::CredentialFailed,
                format!("credential '{name}' is not defined"),
            )
        })?),
        None => None,
    };

    // 2. the body: streamed, unless a feature needs it whole.
    let need = credential
        .and_then(|c| signing::whole_body_needed(&c.kind, headers))
        .into_iter()
        .chain(
            rule.placeholders
                .contains(&Place::Body)
                .then_some(SCAN_LIMIT),
        )
        .max();
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let read = read_body(incoming, need, declared, req).await?;
    let (body_bytes, trailers, rest, charge) = match read {
        Read::Whole(b, t, c) => (b, t, None, c),
        Read::Partial(b, rest, c) => (b, None, Some(rest), c),
        Read::OverBudget(b, rest, c, why) => {
            // Only a signature can do without the whole body, and only where S3 takes it.
            let fallback = !rule.placeholders.contains(&Place::Body)
                && credential.is_some_and(|c| unsigned_payload_allowed(&c.kind, host));
            if !fallback {
                outbound::drain(rest).await;
                return Err((
                    Reason::TooBusy,
                    format!(
                        "cannot hold this request body for host {host} now: {why}; retry later"
                    ),
                ));
            }
            tracing::info!(url.host = %host, why = %why, "buffer budget reached: signing as UNSIGNED-PAYLOAD and streaming");
            (b, None, Some(rest), c)
        }
    };
    let whole = rest.is_none();

    // 3. a body held whole is checked like the head.
    if whole {
        names.extend(checker.body(&body_bytes, trailers.as_ref())?);
    }

    // 4. strip the sandbox's own credentials on an injecting rule.
    if let Some(c) = credential {
        for h in signing::stripped_headers(&c.kind) {
            headers.remove(*h);
        }
    }
    if rule.injects() {
        for h in AUTH_HEADERS {
            if !rule.keep_headers.iter().any(|k| k == h) {
                headers.remove(h);
            }
        }
        for h in &rule.injected_names {
            headers.remove(h);
        }
    }

    // 5. replace placeholders in enabled places (all were checked above).
    let mut values: HashMap<String, SecretValue> = HashMap::new();
    for name in &names {
        values.insert(name.clone(), store.get(name).await.map_err(unavailable)?);
        used.insert(name.clone());
    }
    let mut body_bytes = body_bytes;
    let mut charge = charge;
    if !values.is_empty() {
        substitute_headers(headers, &values)?;
        let (path, query) = split_query(path_and_query);
        if let Some(q) = query {
            let new_q = substitute_query(q, &values);
            *path_and_query = format!("{path}?{new_q}");
        }
        if whole && placeholder::contains(&body_bytes) {
            // The copy is sized exactly and charged too while both exist.
            let size = replaced_len(&body_bytes, &values);
            charge.resize(charge.bytes() + size).map_err(|e| {
                (
                    Reason::TooBusy,
                    format!("cannot hold this request body for host {host} now: {e}; retry later"),
                )
            })?;
            body_bytes = replace_exact(&body_bytes, &values, size);
            let _ = charge.resize(body_bytes.len());
            headers.remove(CONTENT_LENGTH);
        }
    }

    // 6. inject, last.
    for (name, t) in &rule.inject_headers {
        let v = t.render(&store, identity).await.map_err(unavailable)?;
        let mut hv = header_value(&v, name)?;
        hv.set_sensitive(true);
        headers.insert(name.clone(), hv);
        used.extend(t.secrets().map(str::to_string));
    }
    if !rule.inject_query.is_empty() {
        let (path, query) = split_query(path_and_query);
        let mut pairs: Vec<String> = query
            .map(|q| {
                q.split('&')
                    .filter(|p| !p.is_empty())
                    .filter(|p| {
                        let key = p.split('=').next().unwrap_or_default();
                        let key = percent_decode(key.as_bytes()).decode_utf8_lossy();
                        !rule.inject_query.iter().any(|(k, _)| *k == key)
                    })
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        for (k, t) in &rule.inject_query {
            let v = t.render(&store, identity).await.map_err(unavailable)?;
            pairs.push(format!(
                "{}={}",
                utf8_percent_encode(k, QUERY_VALUE),
                percent_encoding::percent_encode(&v, QUERY_VALUE)
            ));
            used.extend(t.secrets().map(str::to_string));
        }
        *path_and_query = format!("{path}?{}", pairs.join("&"));
    }
    if let Some((user, password)) = &rule.inject_basic {
        let mut creds = zeroize::Zeroizing::new(
            user.render(&store, identity)
                .await
                .map_err(unavailable)?
                .to_vec(),
        );
        creds.push(b':');
        creds.extend_from_slice(
            &password
                .render(&store, identity)
                .await
                .map_err(unavailable)?,
        );
        let encoded =
            zeroize::Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(&*creds));
        let mut hv = header_value(format!("Basic {}", &*encoded).as_bytes(), &AUTHORIZATION)?;
        hv.set_sensitive(true);
        headers.insert(AUTHORIZATION, hv);
        used.extend(user.secrets().map(str::to_string));
        used.extend(password.secrets().map(str::to_string));
    }

    // 7. sign or attach a minted token: last, over the final URI, headers and body.
    let mut applied = signing::Applied::default();
    if let Some(c) = credential {
        let sign_body = match rest {
            None => signing::SignBody::Whole(&body_bytes),
            Some(_) => signing::SignBody::Streamed,
        };
        let target = signing::Target {
            method: req.method,
            scheme: req.scheme,
            host,
            port: req.port,
            identity,
        };
        applied = signing::apply(
            c,
            &store,
            policy.tokens(),
            req.exchanger,
            &target,
            headers,
            path_and_query,
            sign_body,
        )
        .await
        .map_err(|e| match e {
            signing::CredentialError::PresignedQuery { .. } => {
                (Reason::PresignedQuery, e.to_string())
            }
            signing::CredentialError::BadRequest { .. } => (Reason::BadRequest, e.to_string()),
            other => (Reason::CredentialFailed, other.to_string()),
        })?;
        used.insert(signing::token_name(&c.name));
    }

    let refused: Arc<std::sync::OnceLock<BodyRefused>> = Arc::default();
    let whole_len = body_bytes.len() as u64;
    let body = match rest {
        None => outbound::Whole::new(body_bytes, trailers, charge).boxed(),
        Some(rest) => {
            let detector = Detector::new(scrubber, rule, host, refused.clone());
            let stream = Prefixed::new(body_bytes, rest, detector, charge);
            body::count_up(stream, counters.clone())
        }
    };
    // An S3 aws-chunked upload: its framing checked (and chunks re-signed) as it streams; bad
    // framing aborts the upload with this refusal. The chunk it holds while re-signing is
    // charged to the budget for as long as the body lives.
    let mut chunk_hold = req.budget.start(req.client);
    chunk_hold
        .resize(applied.held_at_most())
        .map_err(|e| (Reason::TooBusy, e.to_string()))?;
    let slot = refused.clone();
    let body = applied.body(body, move |message| {
        let _held = &chunk_hold;
        let _ = slot.set(BodyRefused {
            reason: Reason::BadRequest,
            message,
        });
    });
    // A fully buffered body was counted here; a streamed one counts as it flows.
    if whole {
        counters
            .up
            .fetch_add(whole_len, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(Brokered {
        body,
        secrets: used,
        refused,
    })
}

/// Why the request body is in a form the detector cannot read, if it is: a `Content-Encoding`
/// other than `identity` and `aws-chunked` (any value, any case, in any list position), or a
/// `grpc-encoding` other than `identity`.
fn request_coding(headers: &HeaderMap) -> Option<String> {
    for (header, allowed) in [
        (
            http::header::CONTENT_ENCODING.as_str(),
            &["identity", "aws-chunked"][..],
        ),
        ("grpc-encoding", &["identity"][..]),
    ] {
        for v in headers.get_all(header) {
            let text = String::from_utf8_lossy(v.as_bytes()).to_ascii_lowercase();
            for coding in text.split(',').map(str::trim).filter(|c| !c.is_empty()) {
                if !allowed.contains(&coding) {
                    let shown: String = coding.chars().take(32).collect();
                    return Some(format!("with {header} {shown:?}"));
                }
            }
        }
    }
    None
}

fn header_value(bytes: &[u8], name: &HeaderName) -> Result<HeaderValue, Refusal> {
    HeaderValue::from_bytes(bytes).map_err(|_| {
        (
            Reason::SecretUnavailable,
            format!("the value for header {name} is not valid in a header (control characters)"),
        )
    })
}

fn split_query(pq: &str) -> (String, Option<&str>) {
    match pq.split_once('?') {
        Some((p, q)) => (p.to_string(), Some(q)),
        None => (pq.to_string(), None),
    }
}

fn substitute_headers(
    headers: &mut HeaderMap,
    values: &HashMap<String, SecretValue>,
) -> Result<(), Refusal> {
    let names: Vec<HeaderName> = headers.keys().cloned().collect();
    for name in names {
        let mut replaced = Vec::new();
        let mut changed = false;
        for v in headers.get_all(&name) {
            let mut out = if placeholder::contains(v.as_bytes()) {
                changed = true;
                placeholder::replace(v.as_bytes(), values).to_vec()
            } else {
                v.as_bytes().to_vec()
            };
            if name == AUTHORIZATION {
                if let Some(decoded) = basic_decoded(v.as_bytes()) {
                    if placeholder::contains(&decoded) {
                        changed = true;
                        let inner = placeholder::replace(&decoded, values);
                        out = format!(
                            "Basic {}",
                            base64::engine::general_purpose::STANDARD.encode(&*inner)
                        )
                        .into_bytes();
                    }
                }
            }
            replaced.push(out);
        }
        if changed {
            headers.remove(&name);
            for v in replaced {
                let mut hv = header_value(&v, &name)?;
                hv.set_sensitive(true);
                headers.append(name.clone(), hv);
            }
        }
    }
    Ok(())
}

/// Replaces placeholders in query values, raw or percent-encoded; other pairs stay byte-exact.
fn substitute_query(q: &str, values: &HashMap<String, SecretValue>) -> String {
    q.split('&')
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let decoded: Vec<u8> = percent_decode(v.as_bytes()).collect();
            if !placeholder::contains(&decoded) || !pair.contains('=') {
                return pair.to_string();
            }
            let replaced = placeholder::replace(&decoded, values);
            format!(
                "{k}={}",
                percent_encoding::percent_encode(&replaced, QUERY_VALUE)
            )
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// The length of `body` once its placeholders named in `values` are replaced.
fn replaced_len(body: &[u8], values: &HashMap<String, SecretValue>) -> usize {
    placeholder::find(body).iter().fold(body.len(), |len, f| {
        match f.name.as_ref().and_then(|n| values.get(n)) {
            Some(v) => len - (f.end - f.start) + v.len(),
            None => len,
        }
    })
}

/// `body` with its placeholders replaced, in one allocation of exactly `size` bytes.
fn replace_exact(body: &[u8], values: &HashMap<String, SecretValue>, size: usize) -> Bytes {
    let mut out = Vec::with_capacity(size);
    let mut last = 0;
    for f in placeholder::find(body) {
        if let Some(v) = f.name.as_ref().and_then(|n| values.get(n)) {
            out.extend_from_slice(&body[last..f.start]);
            out.extend_from_slice(v.expose());
            last = f.end;
        }
    }
    out.extend_from_slice(&body[last..]);
    Bytes::from(out)
}

/// A request body as read before dialing.
enum Read {
    /// All of it, and its trailers.
    Whole(Bytes, Option<HeaderMap>, Charge),
    /// What was read, and the rest, still to come.
    Partial(Bytes, Progress<Incoming>, Charge),
    /// A feature needs the whole body but holding it would pass the budget: what was read, the
    /// rest, and why.
    OverBudget(Bytes, Progress<Incoming>, Charge, super::budget::OverBudget),
}

fn read_error(e: crate::upstream::BoxError) -> Refusal {
    match e.downcast_ref::<BodyRefused>() {
        Some(r) => (r.reason, r.message.clone()),
        None => (
            Reason::BadRequest,
            format!("cannot read the request body: {e}"),
        ),
    }
}

/// Reads what must be read before dialing: the whole body up to `need` bytes when a feature
/// needs it (the rest streams if it is longer), else only a small body already there (up to
/// [`PEEK_LIMIT`], waiting at most [`PEEK_WAIT`] for its first bytes). Every byte held is
/// charged to the budget; the buffer grows by doubling, charged by capacity.
async fn read_body(
    incoming: Incoming,
    need: Option<usize>,
    declared: Option<u64>,
    req: &RequestCx<'_>,
) -> Result<Read, Refusal> {
    let mut body = Progress::new(incoming, req.body_timeout);
    let mut charge = req.budget.start(req.client);
    if body.is_end_stream() {
        return Ok(Read::Whole(Bytes::new(), None, charge));
    }
    let (limit, peek) = match need {
        Some(n) => (n, false),
        None => (PEEK_LIMIT, true),
    };
    // Known to be too large: stream from the first byte.
    if declared.is_some_and(|d| d > limit as u64) {
        return Ok(Read::Partial(Bytes::new(), body, charge));
    }
    let mut buf: Vec<u8> = Vec::new();
    // A declared length is charged (and allocated) at once: no doubling, no surprise later.
    if let Some(d) = declared.and_then(|d| usize::try_from(d).ok()) {
        match charge.resize(d) {
            Ok(()) => buf.reserve_exact(d),
            Err(_) if peek => return Ok(Read::Partial(Bytes::new(), body, charge)),
            Err(e) => return Ok(Read::OverBudget(Bytes::new(), body, charge, e)),
        }
    }
    let mut first = true;
    loop {
        let next = if peek {
            // The first bytes may trail the head a little; after them, only what is there.
            let wait = if first { PEEK_WAIT } else { Duration::ZERO };
            match tokio::time::timeout(wait, body.frame()).await {
                Ok(next) => next,
                Err(_) => return Ok(Read::Partial(Bytes::from(buf), body, charge)),
            }
        } else {
            body.frame().await
        };
        first = false;
        let data = match next {
            None => {
                let _ = charge.resize(buf.capacity());
                return Ok(Read::Whole(Bytes::from(buf), None, charge));
            }
            Some(Err(e)) => return Err(read_error(e)),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    let trailers = frame.into_trailers().ok();
                    let _ = charge.resize(buf.capacity());
                    return Ok(Read::Whole(Bytes::from(buf), trailers, charge));
                }
            },
        };
        let needed = buf.len() + data.len();
        if needed > buf.capacity() {
            let grown = needed.max(buf.capacity() * 2).min(limit.max(needed));
            if let Err(e) = charge.resize(grown) {
                // The frame is read already: it goes first in the stream (one frame over the
                // budget at most, for as long as it takes to send it).
                buf.extend_from_slice(&data);
                let prefix = Bytes::from(buf);
                return Ok(if peek {
                    Read::Partial(prefix, body, charge)
                } else {
                    Read::OverBudget(prefix, body, charge, e)
                });
            }
            buf.reserve_exact(grown - buf.len());
        }
        buf.extend_from_slice(&data);
        if buf.len() > limit {
            // Longer than what is held whole: the rest streams behind it.
            return Ok(Read::Partial(Bytes::from(buf), body, charge));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> HashMap<String, SecretValue> {
        let mut m = HashMap::new();
        m.insert(
            "k".to_string(),
            SecretValue::new(b"s3cr3t value/+".to_vec()),
        );
        m
    }

    #[test]
    fn query_placeholders_are_replaced_raw_and_percent_encoded() {
        let q = "a=1&key=__LATCHKEY_k__&b=%5F%5FLATCHKEY_k%5F%5F&c=x%20y";
        let out = substitute_query(q, &values());
        assert_eq!(
            out,
            "a=1&key=s3cr3t%20value%2F%2B&b=s3cr3t%20value%2F%2B&c=x%20y"
        );
    }

    #[test]
    fn basic_auth_placeholders_are_replaced_inside_the_encoding() {
        let mut h = HeaderMap::new();
        let enc = base64::engine::general_purpose::STANDARD.encode("user:__LATCHKEY_k__");
        h.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Basic {enc}")).expect("hv"),
        );
        substitute_headers(&mut h, &values()).expect("ok");
        let decoded = basic_decoded(h[AUTHORIZATION].as_bytes()).expect("basic");
        assert_eq!(&decoded[..], b"user:s3cr3t value/+");
        assert!(h[AUTHORIZATION].is_sensitive());
    }
}

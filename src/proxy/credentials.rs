//! The credentials step of the pipeline: check what the sandbox sent, strip its auth, replace
//! placeholders, inject secrets.
//!
//! Order matters and is fixed:
//! 1. read the body (up to [`SCAN_LIMIT`]; beyond that it streams through a detector);
//! 2. refuse placeholders that are malformed, unknown, unbound to this rule's hosts, or in a
//!    place the rule does not enable — checked on the request *as sent*;
//! 3. refuse any secret value (raw or encoded) sent to a rule that does not bind it;
//! 4. strip the sandbox's auth headers on a rule that injects;
//! 5. replace allowed placeholders; 6. inject the rule's headers, query and basic auth last.
//!
//! Refusal messages name secrets and hosts, never values.

use std::collections::{BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use base64::Engine;
use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_LENGTH};
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use percent_encoding::{percent_decode, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::body;
use crate::audit::Counters;
use crate::policy::{Policy, Rule};
use crate::reason::Reason;
use crate::secrets::placeholder::{self, Place, PREFIX};
use crate::secrets::scrub::Scrubber;
use crate::secrets::{SecretError, SecretValue};
use crate::signing;
use crate::upstream::{Body, BoxError};

/// Request bodies up to this size are buffered and inspected whole (and may carry body
/// placeholders); larger bodies stream through a detector that aborts the upload on a find.
pub const SCAN_LIMIT: usize = 8 * 1024 * 1024;

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
}

/// What the credentials step produced.
pub struct Brokered {
    pub body: Body,
    /// Names of secrets injected or substituted.
    pub secrets: BTreeSet<String>,
    /// Set when a streamed body was aborted for a leak: the client's error does not always
    /// carry the cause (an h2 upstream sees only a stream reset).
    pub refused: Arc<std::sync::OnceLock<BodyRefused>>,
}

/// A refusal raised while an over-limit body streams upstream; found in the client's error
/// chain and turned into the refusal it carries.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct BodyRefused {
    pub reason: Reason,
    pub message: String,
}

fn unavailable(e: SecretError) -> Refusal {
    (Reason::SecretUnavailable, e.to_string())
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

    // 1. body
    let (buffered, rest) = read_prefix(incoming, SCAN_LIMIT).await?;
    let whole = rest.is_none();

    // 2. placeholders, as sent.
    let (path, query) = split_query(path_and_query);
    let mut found: Vec<(Place, Option<String>)> = Vec::new();
    let mut note = |place: Place, bytes: &[u8]| {
        for f in placeholder::find(bytes) {
            found.push((place, f.name));
        }
    };
    for (name, value) in headers.iter() {
        note(Place::Header, value.as_bytes());
        if name == AUTHORIZATION {
            if let Some(decoded) = basic_decoded(value) {
                note(Place::BasicAuth, &decoded);
            }
        }
    }
    note(Place::Path, path.as_bytes());
    note(
        Place::Path,
        &percent_decode(path.as_bytes()).collect::<Vec<u8>>(),
    );
    if let Some(q) = query {
        note(Place::Query, q.as_bytes());
        for (_, v) in query_pairs(q) {
            note(Place::Query, &v);
        }
    }
    note(Place::Body, &buffered);
    // A placeholder in a raw header that is also Basic-encoded is reported once per place.
    found.dedup();
    for (place, name) in &found {
        check_placeholder(policy, rule, host, *place, name.as_deref())?;
    }

    // 3. secret values sent by the sandbox to a rule that does not bind them.
    if let Some(s) = &scrubber {
        let check = |bytes: &[u8]| -> Result<(), Refusal> {
            // The cheap search first; the full scan (every name) only when something is there.
            if bytes.is_empty() || s.find(bytes).is_none() {
                return Ok(());
            }
            let (_, names) = s.scrub(bytes);
            match names.iter().find(|n| !rule.bound.contains(&***n)) {
                Some(name) => Err((
                    Reason::SecretValueUnbound,
                    format!("the value of secret '{name}' was sent to host {host}, which rule '{}' does not bind it to", rule.name),
                )),
                None => Ok(()),
            }
        };
        for (name, value) in headers.iter() {
            check(value.as_bytes())?;
            if name == AUTHORIZATION {
                if let Some(decoded) = basic_decoded(value) {
                    check(&decoded)?;
                }
            }
        }
        check(path_and_query.as_bytes())?;
        check(&percent_decode(path_and_query.as_bytes()).collect::<Vec<u8>>())?;
        check(&buffered)?;
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
    let names: BTreeSet<&str> = found.iter().filter_map(|(_, n)| n.as_deref()).collect();
    let mut values: HashMap<String, SecretValue> = HashMap::new();
    for name in names {
        values.insert(
            name.to_string(),
            store.get(name).await.map_err(unavailable)?,
        );
        used.insert(name.to_string());
    }
    let mut body_bytes = buffered;
    if !values.is_empty() {
        substitute_headers(headers, &values)?;
        if let Some(q) = query {
            let new_q = substitute_query(q, &values);
            *path_and_query = format!("{path}?{new_q}");
        }
        if placeholder::contains(&body_bytes) {
            body_bytes = Bytes::from(placeholder::replace(&body_bytes, &values).to_vec());
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
    let body = match rest {
        None => body::full(body_bytes),
        Some(rest) => {
            let detector = Detector::new(scrubber, rule, host, refused.clone());
            let stream = Prefixed {
                prefix: Some(body_bytes),
                inner: rest,
                detector,
            };
            body::count_up(stream, counters.clone())
        }
    };
    // An S3 aws-chunked upload: its framing checked (and chunks re-signed) as it streams; bad
    // framing aborts the upload with this refusal.
    let slot = refused.clone();
    let body = applied.body(body, move |message| {
        let _ = slot.set(BodyRefused {
            reason: Reason::BadRequest,
            message,
        });
    });
    // A fully buffered body was counted here; a streamed one counts as it flows.
    if whole {
        let n = body.size_hint().exact().unwrap_or_default();
        counters
            .up
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(Brokered {
        body,
        secrets: used,
        refused,
    })
}

fn header_value(bytes: &[u8], name: &HeaderName) -> Result<HeaderValue, Refusal> {
    HeaderValue::from_bytes(bytes).map_err(|_| {
        (
            Reason::SecretUnavailable,
            format!("the value for header {name} is not valid in a header (control characters)"),
        )
    })
}

fn check_placeholder(
    policy: &Policy,
    rule: &Rule,
    host: &str,
    place: Place,
    name: Option<&str>,
) -> Result<(), Refusal> {
    let refuse = |m: String| Err((Reason::PlaceholderNotBound, m));
    let Some(name) = name else {
        return refuse(format!(
            "malformed placeholder in the {} for host {host}: write __LATCHKEY_<name>__",
            place.as_str()
        ));
    };
    if !policy.secrets().contains(name) || !rule.bound.contains(name) {
        return refuse(format!(
            "placeholder for secret '{name}' not bound to host {host}"
        ));
    }
    if !rule.placeholders.contains(&place) {
        let enabled: Vec<&str> = rule.placeholders.iter().map(|p| p.as_str()).collect();
        return refuse(format!(
            "placeholder for secret '{name}' not bound to host {host} in the {}: rule '{}' enables placeholders in: {}",
            place.as_str(),
            rule.name,
            if enabled.is_empty() { "nothing".to_string() } else { enabled.join(", ") }
        ));
    }
    Ok(())
}

fn split_query(pq: &str) -> (String, Option<&str>) {
    match pq.split_once('?') {
        Some((p, q)) => (p.to_string(), Some(q)),
        None => (pq.to_string(), None),
    }
}

/// Decoded (key, value) pairs of a query string.
fn query_pairs(q: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            // `+` is a space in form encoding; a placeholder never contains either.
            (
                percent_decode(k.as_bytes()).collect(),
                percent_decode(v.as_bytes()).collect(),
            )
        })
        .collect()
}

/// The decoded `user:pass` of an `Authorization: Basic` header.
fn basic_decoded(value: &HeaderValue) -> Option<zeroize::Zeroizing<Vec<u8>>> {
    let text = value.to_str().ok()?;
    let (scheme, rest) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()
        .map(zeroize::Zeroizing::new)
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
                if let Some(decoded) = basic_decoded(v) {
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

/// Reads up to `limit` bytes; returns them and, if the body is longer, the rest unread.
async fn read_prefix(
    mut incoming: Incoming,
    limit: usize,
) -> Result<(Bytes, Option<Incoming>), Refusal> {
    let mut buf = BytesMut::new();
    if incoming.is_end_stream() {
        return Ok((Bytes::new(), None));
    }
    while buf.len() <= limit {
        match incoming.frame().await {
            None => return Ok((buf.freeze(), None)),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
            Some(Err(e)) => {
                return Err((
                    Reason::BadRequest,
                    format!("cannot read the request body: {e}"),
                ))
            }
        }
    }
    Ok((buf.freeze(), Some(incoming)))
}

/// Finds secret values or placeholders in a streamed body, across chunk boundaries.
struct Detector {
    scrubber: Option<Arc<Scrubber>>,
    bound: BTreeSet<String>,
    host: String,
    rule: String,
    tail: Vec<u8>,
    keep: usize,
    slot: Arc<std::sync::OnceLock<BodyRefused>>,
}

impl Detector {
    fn new(
        scrubber: Option<Arc<Scrubber>>,
        rule: &Rule,
        host: &str,
        slot: Arc<std::sync::OnceLock<BodyRefused>>,
    ) -> Self {
        let keep = scrubber
            .as_ref()
            .map_or(0, |s| s.max_pattern_len())
            .max(PREFIX.len() + 70);
        Self {
            scrubber,
            bound: rule.bound.clone(),
            host: host.to_string(),
            rule: rule.name.clone(),
            tail: Vec::new(),
            keep,
            slot,
        }
    }

    fn check(&mut self, chunk: &[u8]) -> Result<(), BodyRefused> {
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(chunk);
        if placeholder::contains(&window) {
            return Err(BodyRefused {
                reason: Reason::PlaceholderNotBound,
                message: format!(
                    "placeholder in a request body over {} MiB to host {}: only smaller bodies are inspected for substitution",
                    SCAN_LIMIT / (1024 * 1024),
                    self.host
                ),
            });
        }
        if let Some(s) = &self.scrubber {
            let (_, names) = s.scrub(&window);
            if let Some(name) = names.iter().find(|n| !self.bound.contains(&***n)) {
                return Err(BodyRefused {
                    reason: Reason::SecretValueUnbound,
                    message: format!(
                        "the value of secret '{name}' was sent to host {}, which rule '{}' does not bind it to",
                        self.host, self.rule
                    ),
                });
            }
        }
        let start = window.len().saturating_sub(self.keep);
        self.tail = window.split_off(start);
        Ok(())
    }
}

pin_project_lite::pin_project! {
    /// The buffered prefix, then the rest of the body through the detector.
    struct Prefixed {
        prefix: Option<Bytes>,
        #[pin]
        inner: Incoming,
        detector: Detector,
    }
}

impl HttpBody for Prefixed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Some(p) = this.prefix.take() {
            // The prefix was inspected whole; seed the detector's window with its end.
            let start = p.len().saturating_sub(this.detector.keep);
            this.detector.tail = p[start..].to_vec();
            return Poll::Ready(Some(Ok(Frame::data(p))));
        }
        match ready!(this.inner.poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(refused) = this.detector.check(data) {
                        let _ = this.detector.slot.set(refused.clone());
                        return Poll::Ready(Some(Err(Box::new(refused))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => Poll::Ready(Some(Err(Box::new(e)))),
            None => Poll::Ready(None),
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
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
        let decoded = basic_decoded(&h[AUTHORIZATION]).expect("basic");
        assert_eq!(&decoded[..], b"user:s3cr3t value/+");
        assert!(h[AUTHORIZATION].is_sensitive());
    }
}

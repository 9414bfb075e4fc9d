//! The broker phase: the credential steps of `secrets` and `signing`, sequenced for one rule.
//!
//! Order matters and is fixed:
//! 1. check every part of the head as sent ([`leak::Checker::head`]): placeholders that are
//!    malformed, unknown, unbound to this rule's hosts, or in a place the rule does not enable,
//!    then any secret value (raw or encoded) where the rule does not bind it;
//! 2. the body: streamed to the upstream through the leak [`Detector`] unless a feature
//!    needs it whole (a signed SigV4 payload up to `max_signed_body`, body placeholders up to
//!    [`SCAN_LIMIT`]); a small body that is already there when the head is read is held whole
//!    (up to [`PEEK_LIMIT`](super::request_body::PEEK_LIMIT)) and checked before dialing.
//!    Every held byte is charged to the buffer budget ([`super::budget`]);
//! 3. a body held whole is checked like the head (placeholders, secret values, trailers);
//! 4. strip the sandbox's auth headers on a rule that injects;
//! 5. replace allowed placeholders; 6. inject the rule's headers, query and basic auth;
//! 7. sign, or attach a minted token, last.
//!
//! Each step is a function in `secrets` or `signing` that takes plain data; this module only
//! reads the rule and the policy and hands them over. Refusal messages name secrets and hosts,
//! never values.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::header::CONTENT_LENGTH;
use http::HeaderMap;
use http_body_util::BodyExt;

use super::body;
use super::budget::Budget;
use super::request_body::{self, drain, BodyRefused, Inbound, Prefixed, Read, Rest, Whole};
use super::Generation;
use crate::audit::Counters;
use crate::policy::Rule;
use crate::reason::{Reason, Refusal};
use crate::secrets::detector::Detector;
use crate::secrets::leak::{self, Binding};
use crate::secrets::placeholder::{self, Place};
use crate::secrets::{inject, substitute, SecretValue};
use crate::signing::{self, TokenTransport};
use crate::upstream::Body;

pub use crate::wire::limits::SCAN_LIMIT;

/// The request the broker works on, as latchkey will send it.
pub struct RequestCx<'a> {
    pub method: &'a str,
    pub scheme: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub identity: &'a str,
    /// Reaches token endpoints through the guarded, audited client; called only when a
    /// credential needs a token it has not cached.
    pub exchanger: &'a dyn TokenTransport,
    /// Every spelling of the host the sandbox sent, before normalisation.
    pub sent_hosts: &'a [&'a str],
    /// Who is charged for buffered body bytes.
    pub client: IpAddr,
    pub budget: &'a Arc<Budget>,
    /// `--body-timeout`.
    pub body_timeout: Duration,
    /// Captured tokens this identity holds for this host, by name (book "OAuth token
    /// capture"): their placeholders are replaced like a bound secret's.
    pub captured: &'a HashMap<String, SecretValue>,
    /// Captured tokens that may go to this host but not over this request's cleartext
    /// (`http`): their placeholders are refused with `credential_needs_tls`.
    pub withheld: &'a BTreeSet<String>,
}

/// What the broker produced.
pub struct Brokered {
    pub body: Body,
    /// Names of secrets injected or substituted.
    pub secrets: BTreeSet<String>,
    /// Set when a streamed body was aborted (a leak, a stalled client): the client's error
    /// does not always carry the cause (an h2 upstream sees only a stream reset).
    pub refused: Arc<OnceLock<BodyRefused>>,
}

/// What the leak checks need of a rule; `captured`: the captured tokens whose placeholders
/// may be replaced (none in a streamed body, which is never rewritten); `withheld`: those that
/// may not go over this request's cleartext.
fn binding<'a>(
    rule: &'a Rule,
    captured: &'a BTreeSet<String>,
    withheld: &'a BTreeSet<String>,
) -> Binding<'a> {
    Binding {
        rule: &rule.name,
        bound: &rule.bound,
        placeholders: &rule.placeholders,
        captured,
        withheld,
    }
}

/// Refuses a rule that brokers a credential on a request latchkey would send in cleartext,
/// unless the rule says `dangerously_allow_cleartext`. Policy's decision already refuses such a
/// request (`credential_needs_tls`); this holds whatever path reached the broker.
fn over_tls(rule: &Rule, scheme: &str, host: &str) -> Result<(), Refusal> {
    if scheme == "https" || rule.cleartext || !rule.brokers() {
        return Ok(());
    }
    Err(Refusal::new(
        Reason::CredentialNeedsTls,
        format!(
            "rule '{}' brokers {} and applies only to requests latchkey sends over TLS; a request to host {host} over {scheme} is refused",
            rule.name,
            rule.brokered().unwrap_or_default()
        ),
    ))
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

fn too_busy(host: &str, why: impl std::fmt::Display) -> Refusal {
    Refusal::new(
        Reason::TooBusy,
        format!("cannot hold this request body for host {host} now: {why}; retry later"),
    )
}

/// Runs steps 1–7 on the request parts and body.
#[allow(clippy::too_many_arguments)]
pub async fn apply(
    policy: &Generation,
    rule: &Rule,
    req: &RequestCx<'_>,
    headers: &mut HeaderMap,
    path_and_query: &mut String,
    incoming: Inbound,
    counters: Arc<Counters>,
) -> Result<Brokered, Refusal> {
    let (identity, host) = (req.identity, req.host);
    if let Err(refusal) = over_tls(rule, req.scheme, host) {
        incoming.drain(req.body_timeout).await;
        return Err(refusal);
    }
    let store = policy.secrets();
    let mut used = BTreeSet::new();

    // Even without any secret declared, a placeholder is refused below (it names a secret that
    // does not exist) rather than forwarded.
    let scrubber = store.scrubber().map_err(|e| {
        Refusal::new(
            Reason::SecretUnavailable,
            format!("cannot search the request for secret values: {e}"),
        )
    })?;

    // 1. the head, as sent: every part, one check.
    let captured: BTreeSet<String> = req.captured.keys().cloned().collect();
    let checker = leak::Checker {
        scrubber: scrubber.as_deref(),
        store,
        binding: binding(rule, &captured, req.withheld),
        host,
    };
    let head = checker.head(&leak::Head {
        method: req.method,
        hosts: req.sent_hosts,
        path_and_query,
        headers,
    });
    let mut names = match head {
        Ok(names) => names,
        Err(refusal) => {
            // Read (and drop) what the client is still sending, so it reads the refusal.
            incoming.drain(req.body_timeout).await;
            return Err(refusal);
        }
    };

    // A body in a content coding (or gRPC messages compressed) hides its bytes from the leak
    // detector: refused, never forwarded unscanned. `aws-chunked` is framing around plain
    // bytes (S3 streaming uploads), which the detector reads as they are.
    if scrubber.is_some() && !incoming.is_end_stream() {
        if let Some(why) = request_coding(headers) {
            incoming.drain(req.body_timeout).await;
            return Err(Refusal::new(
                Reason::UninspectableRequestBody,
                format!("the request body to host {host} is sent {why}: latchkey cannot inspect it for secret values; send it uncompressed"),
            ));
        }
    }

    let credential = match &rule.credential {
        Some(name) => match policy.credential(name) {
            Some(c) => Some(c),
            None => {
                incoming.drain(req.body_timeout).await;
                return Err(Refusal::new(
                    Reason::CredentialFailed,
                    format!("credential '{name}' is not defined"),
                ));
            }
        },
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
        // A token endpoint's refresh carries the refresh token's placeholder in its body.
        .chain(rule.capture.is_some().then_some(SCAN_LIMIT))
        .max();
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let read = match incoming {
        Inbound::Streaming(incoming) => {
            request_body::read_body(incoming, need, declared, req.into()).await?
        }
        Inbound::Held(body, trailers, charge) => Read::Whole(body, trailers, charge),
    };
    let (body_bytes, trailers, rest, charge) = match read {
        Read::Whole(b, t, c) => (b, t, None, c),
        Read::Partial(b, rest, c) => (b, None, Some(rest), c),
        Read::OverBudget(b, rest, c, why) => {
            // Only a signature can do without the whole body, and only where S3 takes it.
            let fallback = !rule.placeholders.contains(&Place::Body)
                && credential.is_some_and(|c| unsigned_payload_allowed(&c.kind, host));
            if !fallback {
                drain(rest).await;
                return Err(too_busy(host, why));
            }
            tracing::info!(url.host = %host, why = %why, "buffer budget reached: signing as UNSIGNED-PAYLOAD and streaming");
            (b, None, Some(rest), c)
        }
    };
    // From here a refusal drops the rest unread: it is drained, so the client reads the answer.
    let mut rest = Rest::new(rest);
    let whole = !rest.is_some();

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
        inject::strip_auth(headers, &rule.keep_headers, &rule.injected_names);
    }

    // 5. replace placeholders in enabled places (all were checked above).
    let mut body_bytes = body_bytes;
    let mut charge = charge;
    if !names.is_empty() {
        let mut values: HashMap<String, SecretValue> = HashMap::with_capacity(names.len());
        for name in &names {
            let value = match req.captured.get(name) {
                Some(v) => v.clone(),
                None => store.get(name).await.map_err(inject::unavailable)?,
            };
            values.insert(name.clone(), value);
            used.insert(name.clone());
        }
        substitute::headers(headers, &values)?;
        substitute::query_in(path_and_query, &values);
        if whole && placeholder::contains(&body_bytes) {
            // The copy is sized exactly and charged too while both exist.
            let size = substitute::replaced_len(&body_bytes, &values);
            charge
                .resize(charge.bytes() + size)
                .map_err(|e| too_busy(host, e))?;
            body_bytes = substitute::replace_exact(&body_bytes, &values, size);
            let _ = charge.resize(body_bytes.len());
            headers.remove(CONTENT_LENGTH);
        }
    }

    // 6. inject, last before signing.
    inject::headers(headers, &rule.inject_headers, store, identity, &mut used).await?;
    inject::query_params(
        path_and_query,
        &rule.inject_query,
        store,
        identity,
        &mut used,
    )
    .await?;
    if let Some(basic) = &rule.inject_basic {
        inject::basic(headers, basic, store, identity, &mut used).await?;
    }

    // 7. sign or attach a minted token: last, over the final URI, headers and body.
    let mut applied = signing::Applied::default();
    if let Some(c) = credential {
        let sign_body = if rest.is_some() {
            signing::SignBody::Streamed
        } else {
            signing::SignBody::Whole(&body_bytes)
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
            store,
            policy.tokens(),
            req.exchanger,
            &target,
            headers,
            path_and_query,
            sign_body,
        )
        .await
        .map_err(|e| {
            let reason = match e {
                signing::CredentialError::PresignedQuery { .. } => Reason::PresignedQuery,
                signing::CredentialError::BadRequest { .. } => Reason::BadRequest,
                _ => Reason::CredentialFailed,
            };
            Refusal::new(reason, e.to_string())
        })?;
        used.insert(signing::token_name(&c.name));
    }

    let refused: Arc<OnceLock<BodyRefused>> = Arc::default();
    let none = BTreeSet::new();
    // An S3 aws-chunked body's data is checked as S3 stores it, the framing taken out: a value
    // split across two chunks is whole there.
    applied.scan_payload(|| {
        Box::new(PayloadDetector {
            detector: Detector::new(
                scrubber.clone(),
                &binding(rule, &none, &none),
                host,
                SCAN_LIMIT,
            ),
            slot: refused.clone(),
        })
    });
    let whole_len = body_bytes.len() as u64;
    let body = match rest.take() {
        None => Whole::new(body_bytes, trailers, charge).boxed(),
        Some(rest) => {
            let detector = Detector::new(scrubber, &binding(rule, &none, &none), host, SCAN_LIMIT);
            let stream = Prefixed::new(body_bytes, rest, detector, charge, refused.clone());
            body::count_up(stream, counters.clone())
        }
    };
    // An S3 aws-chunked upload: its framing checked (and chunks re-signed) as it streams; bad
    // framing aborts the upload with this refusal. The chunk it holds while re-signing is
    // charged to the budget for as long as the body lives.
    let mut chunk_hold = req.budget.start(req.client);
    chunk_hold
        .resize(applied.held_at_most())
        .map_err(|e| Refusal::new(Reason::TooBusy, e.to_string()))?;
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
        counters.up.fetch_add(whole_len, Ordering::Relaxed);
    }
    Ok(Brokered {
        body,
        secrets: used,
        refused,
    })
}

/// The leak detector over the data of an aws-chunked body; a refusal is left in the body's
/// slot, with its own reason, before the framing aborts the upload.
struct PayloadDetector {
    detector: Detector,
    slot: Arc<OnceLock<BodyRefused>>,
}

impl PayloadDetector {
    fn refuse(&self, r: Refusal) -> String {
        let r = BodyRefused::from(r);
        let message = r.message.clone();
        let _ = self.slot.set(r);
        message
    }
}

impl signing::aws_chunked::PayloadScan for PayloadDetector {
    fn data(&mut self, bytes: &[u8]) -> Result<(), String> {
        match self.detector.push(bytes::Bytes::copy_from_slice(bytes)) {
            Ok(_) => Ok(()),
            Err(r) => Err(self.refuse(r)),
        }
    }

    fn end(&mut self) -> Result<(), String> {
        match self.detector.finish() {
            Ok(_) => Ok(()),
            Err(r) => Err(self.refuse(r)),
        }
    }
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

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
//! 5. replace allowed placeholders; 6. inject the rule's headers, query, basic auth and path
//!    prefix;
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

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::HeaderMap;
use http_body_util::BodyExt;

use super::body;
use super::budget::{Budget, Charge};
use super::request_body::{self, drain, BodyRefused, Inbound, Prefixed, Read, Rest, Whole};
use super::Generation;
use crate::audit::Counters;
use crate::policy::Rule;
use crate::reason::{Reason, Refusal};
use crate::secrets::detector::Detector;
use crate::secrets::leak::{self, Binding};
use crate::secrets::placeholder::{self, Place};
use crate::secrets::scrub::Scrubber;
use crate::secrets::{inject, substitute, SecretStore, SecretValue};
use crate::signing::{self, Credential, TokenTransport};
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
    /// latchkey's own AWS identity: signs for an `aws_sigv4` credential that names no keys.
    pub aws: Option<&'a crate::signing::AwsIdentity>,
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

/// The parts of the request the broker rewrites: its headers and its path and query.
pub struct Parts<'a> {
    pub headers: &'a mut HeaderMap,
    pub path_and_query: &'a mut String,
}

/// Runs steps 1–7 on the request parts and body.
pub async fn apply(
    policy: &Generation,
    rule: &Rule,
    req: &RequestCx<'_>,
    parts: Parts<'_>,
    incoming: Inbound,
    counters: Arc<Counters>,
) -> Result<Brokered, Refusal> {
    if let Err(refusal) = over_tls(rule, req.scheme, req.host) {
        return Err(drained(incoming, req, refusal).await);
    }
    let mut cx = Steps::new(policy, rule, req, parts)?;
    // 1. the head, as sent (and what must hold before the body is read).
    let mut names = match cx.check_head(incoming.is_end_stream()) {
        Ok(names) => names,
        Err(refusal) => return Err(drained(incoming, req, refusal).await),
    };
    // 2. the body: streamed, unless a feature needs it whole.
    let mut held = cx.read_body(incoming).await?;
    // 3. a body held whole is checked like the head.
    if held.whole() {
        names.extend(cx.check_body(&held)?);
    }
    // 4. strip the sandbox's own credentials on an injecting rule.
    cx.strip();
    // 5. replace placeholders in enabled places (all were checked above).
    cx.replace(&names, &mut held).await?;
    // 6. inject, last before signing.
    cx.inject().await?;
    // 7. sign or attach a minted token: last, over the final URI, headers and body.
    let applied = cx.sign(&held).await?;
    cx.finish(held, applied, counters)
}

/// Reads (and drops) what the client is still sending, so it reads the refusal.
async fn drained(incoming: Inbound, req: &RequestCx<'_>, refusal: Refusal) -> Refusal {
    incoming.drain(req.body_timeout).await;
    refusal
}

/// One rule brokering one request: what every step reads, the parts they rewrite and the names
/// of the secrets used so far.
struct Steps<'a, 'r> {
    policy: &'a Generation,
    rule: &'a Rule,
    req: &'a RequestCx<'r>,
    headers: &'a mut HeaderMap,
    path_and_query: &'a mut String,
    store: &'a Arc<SecretStore>,
    scrubber: Option<Arc<Scrubber>>,
    /// The names of the captured tokens this request may use.
    captured: BTreeSet<String>,
    credential: Option<&'a Arc<Credential>>,
    used: BTreeSet<String>,
}

/// The body as step 2 read it: the bytes held, their trailers (a body held whole), the rest
/// still to stream (none when held whole) and the budget charge for the held bytes.
struct Held {
    bytes: Bytes,
    trailers: Option<HeaderMap>,
    rest: Rest,
    charge: Charge,
}

impl Held {
    fn whole(&self) -> bool {
        !self.rest.is_some()
    }
}

impl<'a, 'r> Steps<'a, 'r> {
    fn new(
        policy: &'a Generation,
        rule: &'a Rule,
        req: &'a RequestCx<'r>,
        parts: Parts<'a>,
    ) -> Result<Self, Refusal> {
        let store = policy.secrets();
        // Even without any secret declared, a placeholder is refused below (it names a secret
        // that does not exist) rather than forwarded.
        let scrubber = store.scrubber().map_err(|e| {
            Refusal::new(
                Reason::SecretUnavailable,
                format!("cannot search the request for secret values: {e}"),
            )
        })?;
        Ok(Self {
            policy,
            rule,
            req,
            headers: parts.headers,
            path_and_query: parts.path_and_query,
            store,
            scrubber,
            captured: req.captured.keys().cloned().collect(),
            credential: None,
            used: BTreeSet::new(),
        })
    }

    fn checker(&self) -> leak::Checker<'_> {
        leak::Checker {
            scrubber: self.scrubber.as_deref(),
            store: self.store,
            binding: binding(self.rule, &self.captured, self.req.withheld),
            host: self.req.host,
        }
    }

    /// Step 1: every part of the head, one check; then a body the detector cannot read and a
    /// credential that is not defined are refused before the body is read. Returns the names
    /// of the placeholders found.
    fn check_head(&mut self, end_stream: bool) -> Result<BTreeSet<String>, Refusal> {
        let names = self.checker().head(&leak::Head {
            method: self.req.method,
            hosts: self.req.sent_hosts,
            path_and_query: self.path_and_query,
            headers: self.headers,
        })?;
        // A body in a content coding (or gRPC messages compressed) hides its bytes from the
        // leak detector: refused, never forwarded unscanned. `aws-chunked` is framing around
        // plain bytes (S3 streaming uploads), which the detector reads as they are.
        if self.scrubber.is_some() && !end_stream {
            if let Some(why) = request_coding(self.headers) {
                return Err(Refusal::new(
                    Reason::UninspectableRequestBody,
                    format!("the request body to host {} is sent {why}: latchkey cannot inspect it for secret values; send it uncompressed", self.req.host),
                ));
            }
        }
        if let Some(name) = &self.rule.credential {
            match self.policy.credential(name) {
                Some(c) => self.credential = Some(c),
                None => {
                    return Err(Refusal::new(
                        Reason::CredentialFailed,
                        format!("credential '{name}' is not defined"),
                    ))
                }
            }
        }
        Ok(names)
    }

    /// Step 2: the body, held whole up to what a feature needs, else streamed; over the buffer
    /// budget it streams only where a signature can do without it, else it is refused.
    async fn read_body(&self, incoming: Inbound) -> Result<Held, Refusal> {
        let (rule, host) = (self.rule, self.req.host);
        let need = self
            .credential
            .and_then(|c| signing::whole_body_needed(&c.kind, self.headers))
            .into_iter()
            .chain(
                rule.placeholders
                    .contains(&Place::Body)
                    .then_some(SCAN_LIMIT),
            )
            // A token endpoint's refresh carries the refresh token's placeholder in its body.
            .chain(rule.capture.is_some().then_some(SCAN_LIMIT))
            .max();
        let declared = self
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let read = match incoming {
            Inbound::Streaming(incoming) => {
                request_body::read_body(incoming, need, declared, self.req.into()).await?
            }
            Inbound::Held(body, trailers, charge) => Read::Whole(body, trailers, charge),
        };
        let (bytes, trailers, rest, charge) = match read {
            Read::Whole(b, t, c) => (b, t, None, c),
            Read::Partial(b, rest, c) => (b, None, Some(rest), c),
            Read::OverBudget(b, rest, c, why) => {
                // Only a signature can do without the whole body, and only where S3 takes it.
                let fallback = !rule.placeholders.contains(&Place::Body)
                    && self
                        .credential
                        .is_some_and(|c| unsigned_payload_allowed(&c.kind, host));
                if !fallback {
                    drain(rest).await;
                    return Err(too_busy(host, why));
                }
                tracing::info!(url.host = %host, why = %why, "buffer budget reached: signing as UNSIGNED-PAYLOAD and streaming");
                (b, None, Some(rest), c)
            }
        };
        // From here a refusal drops the rest unread: it is drained, so the client reads the
        // answer.
        Ok(Held {
            bytes,
            trailers,
            rest: Rest::new(rest),
            charge,
        })
    }

    /// Step 3: a body held whole, checked like the head.
    fn check_body(&self, held: &Held) -> Result<BTreeSet<String>, Refusal> {
        self.checker().body(&held.bytes, held.trailers.as_ref())
    }

    /// Step 4: the headers the credential's scheme sets, and the sandbox's auth headers on a
    /// rule that injects.
    fn strip(&mut self) {
        if let Some(c) = self.credential {
            for h in signing::stripped_headers(&c.kind) {
                self.headers.remove(*h);
            }
        }
        if self.rule.injects() {
            inject::strip_auth(
                self.headers,
                &self.rule.keep_headers,
                &self.rule.injected_names,
            );
        }
    }

    /// Step 5: each placeholder found replaced by its value (a captured token's, else the
    /// store's) in the headers, the query and a body held whole.
    async fn replace(&mut self, names: &BTreeSet<String>, held: &mut Held) -> Result<(), Refusal> {
        if names.is_empty() {
            return Ok(());
        }
        let mut values: HashMap<String, SecretValue> = HashMap::with_capacity(names.len());
        for name in names {
            let value = match self.req.captured.get(name) {
                Some(v) => v.clone(),
                None => self.store.get(name).await.map_err(inject::unavailable)?,
            };
            values.insert(name.clone(), value);
            self.used.insert(name.clone());
        }
        substitute::headers(self.headers, &values)?;
        substitute::query_in(self.path_and_query, &values);
        if held.whole() && placeholder::contains(&held.bytes) {
            // The copy is sized exactly and charged too while both exist.
            let size = substitute::replaced_len(&held.bytes, &values);
            held.charge
                .resize(held.charge.bytes() + size)
                .map_err(|e| too_busy(self.req.host, e))?;
            held.bytes = substitute::replace_exact(&held.bytes, &values, size);
            let _ = held.charge.resize(held.bytes.len());
            self.headers.remove(CONTENT_LENGTH);
        }
        Ok(())
    }

    /// Step 6: the rule's headers, query parameters, basic auth and path prefix.
    async fn inject(&mut self) -> Result<(), Refusal> {
        let (rule, store, identity) = (self.rule, self.store, self.req.identity);
        inject::headers(
            self.headers,
            &rule.inject_headers,
            store,
            identity,
            &mut self.used,
        )
        .await?;
        inject::query_params(
            self.path_and_query,
            &rule.inject_query,
            store,
            identity,
            &mut self.used,
        )
        .await?;
        if let Some(basic) = &rule.inject_basic {
            inject::basic(self.headers, basic, store, identity, &mut self.used).await?;
        }
        // The path the sandbox sent (which policy decided on, and the record keeps) follows it.
        if let Some(prefix) = &rule.inject_path_prefix {
            inject::path_prefix(self.path_and_query, prefix, store, identity, &mut self.used)
                .await?;
        }
        Ok(())
    }

    /// Step 7: the credential's signature or minted token; what remains to do on the body.
    async fn sign(&mut self, held: &Held) -> Result<signing::Applied, Refusal> {
        let Some(c) = self.credential else {
            return Ok(signing::Applied::default());
        };
        let sign_body = if held.whole() {
            signing::SignBody::Whole(&held.bytes)
        } else {
            signing::SignBody::Streamed
        };
        let req = self.req;
        let target = signing::Target {
            method: req.method,
            scheme: req.scheme,
            host: req.host,
            port: req.port,
            identity: req.identity,
        };
        let applied = signing::apply(
            c,
            signing::Material {
                store: self.store,
                cache: self.policy.tokens(),
                transport: req.exchanger,
                aws: req.aws,
            },
            &target,
            self.headers,
            self.path_and_query,
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
        self.used.insert(signing::token_name(&c.name));
        Ok(applied)
    }

    /// The body as it goes upstream: held whole, or the held prefix then the rest through the
    /// leak detector; an aws-chunked upload's framing checked (and chunks re-signed) on top.
    fn finish(
        self,
        mut held: Held,
        mut applied: signing::Applied,
        counters: Arc<Counters>,
    ) -> Result<Brokered, Refusal> {
        let (rule, host) = (self.rule, self.req.host);
        let refused: Arc<OnceLock<BodyRefused>> = Arc::default();
        let none = BTreeSet::new();
        // An S3 aws-chunked body's data is checked as S3 stores it, the framing taken out: a
        // value split across two chunks is whole there.
        applied.scan_payload(|| {
            Box::new(PayloadDetector {
                detector: Detector::new(
                    self.scrubber.clone(),
                    &binding(rule, &none, &none),
                    host,
                    SCAN_LIMIT,
                ),
                slot: refused.clone(),
            })
        });
        let whole = held.whole();
        let whole_len = held.bytes.len() as u64;
        let body = match held.rest.take() {
            None => Whole::new(held.bytes, held.trailers, held.charge).boxed(),
            Some(rest) => {
                let detector = Detector::new(
                    self.scrubber,
                    &binding(rule, &none, &none),
                    host,
                    SCAN_LIMIT,
                );
                let stream =
                    Prefixed::new(held.bytes, rest, detector, held.charge, refused.clone());
                body::count_up(stream, counters.clone())
            }
        };
        // An S3 aws-chunked upload: its framing checked (and chunks re-signed) as it streams;
        // bad framing aborts the upload with this refusal. The chunk it holds while re-signing
        // is charged to the budget for as long as the body lives.
        let mut chunk_hold = self.req.budget.start(self.req.client);
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
            secrets: self.used,
            refused,
        })
    }
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

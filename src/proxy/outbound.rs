//! What the sandbox sends: one check over every part of a request, and the streaming check of
//! its body and trailers.
//!
//! [`Checker::head`] walks every part of a request head the sandbox controls — method, host (as
//! sent, before any DNS lookup), path, query names and values, header names and values, the
//! decoded `Basic` credentials — through [`head_parts`], the one place that lists them (a new
//! part added to [`Head`] must be listed there: the struct is destructured field by field).
//! Each part is searched as sent and percent-decoded; the scrubber itself recognises the raw,
//! base64, percent-encoded and JSON-escaped forms of every secret value, the same set the
//! response side redacts. Parts that are case-folded on the way (host names, header names) are
//! searched ignoring ASCII case.
//!
//! Two refusals: `secret_value_unbound` — a secret's value where the rule does not bind it
//! (in the method, the host and header or trailer names never, whatever the rule: they reach
//! resolvers, certificates and logs, and no credential goes there); `placeholder_not_bound` — a
//! `__LATCHKEY_<name>__` placeholder where it is not replaced: only header values, `Basic`
//! credentials, query *values* and the body (each where the rule enables it) are; a placeholder
//! in a query name, the path, the method, the host, a header name or a trailer is refused.
//!
//! A streamed body goes through [`Detector`] in [`Prefixed`]: it holds back only a chunk's tail
//! that could still begin a secret's variant (so the upstream never receives part of a value
//! before the check fails), refuses placeholders, and checks trailers like headers. [`Progress`]
//! cuts a body that stops arriving.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::header::AUTHORIZATION;
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use percent_encoding::percent_decode;

use super::budget::Charge;
use crate::policy::{Policy, Rule};
use crate::reason::Reason;
use crate::secrets::placeholder::{self, Place, PREFIX};
use crate::secrets::scrub::{Scrubber, StreamScrubber};
use crate::upstream::BoxError;

pub type Refusal = (Reason, String);

/// A refusal raised while a body streams upstream; found in the client's error chain and turned
/// into the refusal it carries.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct BodyRefused {
    pub reason: Reason,
    pub message: String,
}

/// Where in a request a byte string was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Method,
    Host,
    Path,
    QueryName,
    QueryValue,
    HeaderName,
    HeaderValue,
    BasicAuth,
    Body,
    TrailerName,
    TrailerValue,
}

impl Part {
    pub fn as_str(self) -> &'static str {
        match self {
            Part::Method => "method",
            Part::Host => "host",
            Part::Path => "path",
            Part::QueryName => "query name",
            Part::QueryValue => "query",
            Part::HeaderName => "header name",
            Part::HeaderValue => "header",
            Part::BasicAuth => "basic_auth",
            Part::Body => "body",
            Part::TrailerName => "trailer name",
            Part::TrailerValue => "trailer",
        }
    }

    /// The policy `placeholders` entry that lets a placeholder here be replaced; `None`: a
    /// placeholder here is always refused.
    pub fn place(self) -> Option<Place> {
        match self {
            Part::HeaderValue => Some(Place::Header),
            Part::BasicAuth => Some(Place::BasicAuth),
            Part::QueryValue => Some(Place::Query),
            Part::Body => Some(Place::Body),
            _ => None,
        }
    }

    /// Case-folded on the way (clients upper-case methods; clients, hyper and DNS lowercase
    /// names): searched ignoring ASCII case.
    fn folded(self) -> bool {
        matches!(
            self,
            Part::Method | Part::Host | Part::HeaderName | Part::TrailerName
        )
    }

    /// No rule binds a secret here: a value is refused even for the host it is bound to (the
    /// host goes to resolvers, SNI and certificates; names and the method carry no credential).
    fn never_secret(self) -> bool {
        matches!(
            self,
            Part::Method | Part::Host | Part::HeaderName | Part::TrailerName
        )
    }
}

/// A request head as the sandbox sent it.
pub struct Head<'a> {
    pub method: &'a str,
    /// Every spelling of the host the sandbox sent (URI authority, Host header, the CONNECT
    /// authority), before normalisation lowercased it.
    pub hosts: &'a [&'a str],
    pub path_and_query: &'a str,
    pub headers: &'a HeaderMap,
}

/// Every part of `head`, each in the forms worth searching (as sent, percent-decoded, the
/// decoded `Basic` credentials).
fn head_parts<'a>(head: &'a Head<'a>) -> Vec<(Part, Cow<'a, [u8]>)> {
    // Destructured so that a field added to `Head` cannot be left out here.
    let Head {
        method,
        hosts,
        path_and_query,
        headers,
    } = head;
    let mut out: Vec<(Part, Cow<'a, [u8]>)> = Vec::new();
    let mut add = |part: Part, raw: &'a [u8]| {
        if raw.contains(&b'%') {
            out.push((part, Cow::Owned(percent_decode(raw).collect())));
        }
        // Form encoding: `+` is a space.
        if (part == Part::QueryName || part == Part::QueryValue) && raw.contains(&b'+') {
            let spaced: Vec<u8> = raw
                .iter()
                .map(|&b| if b == b'+' { b' ' } else { b })
                .collect();
            out.push((part, Cow::Owned(percent_decode(&spaced).collect())));
        }
        // Header and query values may be JSON (`Dropbox-API-Arg`, GraphQL `variables`) and
        // parsed as such upstream: their JSON escapes are undone too (after percent-decoding).
        if matches!(part, Part::HeaderValue | Part::QueryValue) {
            let base: Cow<'_, [u8]> = if raw.contains(&b'%') {
                Cow::Owned(percent_decode(raw).collect())
            } else {
                Cow::Borrowed(raw)
            };
            if base.contains(&b'\\') {
                if let Some(u) = unescaped(&base) {
                    out.push((part, Cow::Owned(u)));
                }
            }
        }
        out.push((part, Cow::Borrowed(raw)));
    };
    add(Part::Method, method.as_bytes());
    for host in hosts.iter() {
        add(Part::Host, host.as_bytes());
    }
    let (path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (*path_and_query, None),
    };
    add(Part::Path, path.as_bytes());
    if let Some(q) = query {
        // The whole query too: a raw value may itself hold `&` or `=`.
        add(Part::QueryValue, q.as_bytes());
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            add(Part::QueryName, k.as_bytes());
            add(Part::QueryValue, v.as_bytes());
        }
    }
    for (name, value) in headers.iter() {
        add(Part::HeaderName, name.as_str().as_bytes());
        add(Part::HeaderValue, value.as_bytes());
    }
    for value in headers.get_all(AUTHORIZATION) {
        if let Some(decoded) = basic_decoded(value.as_bytes()) {
            out.push((Part::BasicAuth, Cow::Owned(decoded.to_vec())));
        }
    }
    out
}

/// The decoded `user:pass` of an `Authorization: Basic` value.
pub fn basic_decoded(value: &[u8]) -> Option<zeroize::Zeroizing<Vec<u8>>> {
    let text = std::str::from_utf8(value).ok()?;
    let (scheme, rest) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()
        .map(zeroize::Zeroizing::new)
}

/// Whether `bytes` (in `part`) holds a placeholder; `Some(name)` per occurrence, the name
/// `None` when malformed or case-folded beyond recognition.
fn placeholders_in(part: Part, bytes: &[u8]) -> Vec<Option<String>> {
    let mut names: Vec<Option<String>> = placeholder::find(bytes)
        .into_iter()
        .map(|f| f.name)
        .collect();
    if names.is_empty() && part.folded() && placeholder::contains(&bytes.to_ascii_uppercase()) {
        names.push(None);
    }
    names
}

/// The refusal for a secret value in `bytes` (in `part`) that `bound` does not allow there.
fn secret_refusal(
    scrubber: &Scrubber,
    bound: &BTreeSet<String>,
    part: Part,
    bytes: &[u8],
    host: &str,
    rule: &str,
) -> Option<Refusal> {
    if bytes.is_empty() {
        return None;
    }
    let name = if part.folded() {
        scrubber.find_ignore_ascii_case(bytes)?
    } else {
        // The cheap search first; the full scan (every name) only when something is there.
        scrubber.find(bytes)?;
        let (_, names) = scrubber.scrub(bytes);
        names
            .into_iter()
            .find(|n| part.never_secret() || !bound.contains(&**n))?
    };
    let message = if part == Part::Host {
        // Not the host itself: it holds the value.
        format!("the value of secret '{name}' was sent in the request host: a secret never goes there (host names reach DNS resolvers and certificates)")
    } else if part.never_secret() {
        format!(
            "the value of secret '{name}' was sent in the request {} for host {host}: a secret never goes there",
            part.as_str()
        )
    } else {
        format!("the value of secret '{name}' was sent to host {host}, which rule '{rule}' does not bind it to")
    };
    Some((Reason::SecretValueUnbound, message))
}

/// What an audit record shows for a host refused for holding a secret value (the record's own
/// redaction matches case-sensitively; a lowercased value would get through it).
pub const REDACTED_HOST: &str = "[REDACTED]";

/// Refuses a host whose spelling (as sent) holds a secret value or a placeholder, whatever the
/// rule: checked before any DNS lookup, the CONNECT gate included.
pub fn check_host(policy: &Policy, host: &str) -> Result<(), Refusal> {
    let scrubber = policy.secrets().scrubber().map_err(|e| {
        (
            Reason::SecretUnavailable,
            format!("cannot search the host for secret values: {e}"),
        )
    })?;
    if !placeholders_in(Part::Host, host.as_bytes()).is_empty() {
        return Err((
            Reason::PlaceholderNotBound,
            "a placeholder in the request host: placeholders are never replaced there".to_string(),
        ));
    }
    if let Some(s) = scrubber {
        let none = BTreeSet::new();
        if let Some(r) = secret_refusal(&s, &none, Part::Host, host.as_bytes(), host, "") {
            return Err(r);
        }
    }
    Ok(())
}

/// The check of one request against one rule.
pub struct Checker<'a> {
    pub scrubber: Option<&'a Scrubber>,
    pub policy: &'a Policy,
    pub rule: &'a Rule,
    /// The normalised host, for messages.
    pub host: &'a str,
}

impl Checker<'_> {
    /// Checks every part of the head: placeholders first (as sent), then secret values. Returns
    /// the names of the placeholders found where they will be replaced.
    pub fn head(&self, head: &Head<'_>) -> Result<BTreeSet<String>, Refusal> {
        let parts = head_parts(head);
        let mut names = BTreeSet::new();
        for (part, bytes) in &parts {
            self.placeholders(*part, bytes, &mut names)?;
        }
        for (part, bytes) in &parts {
            self.secrets(*part, bytes)?;
        }
        Ok(names)
    }

    /// Checks a body held whole, and its trailers; returns the placeholders to replace in it.
    pub fn body(
        &self,
        body: &[u8],
        trailers: Option<&HeaderMap>,
    ) -> Result<BTreeSet<String>, Refusal> {
        let mut names = BTreeSet::new();
        self.placeholders(Part::Body, body, &mut names)?;
        self.secrets(Part::Body, body)?;
        for d in decoded_views(body) {
            self.secrets(Part::Body, &d)?;
        }
        if let Some(t) = trailers {
            check_trailers(
                self.scrubber,
                &self.rule.bound,
                t,
                self.host,
                &self.rule.name,
            )?;
        }
        Ok(names)
    }

    fn placeholders(
        &self,
        part: Part,
        bytes: &[u8],
        names: &mut BTreeSet<String>,
    ) -> Result<(), Refusal> {
        for name in placeholders_in(part, bytes) {
            check_placeholder(self.policy, self.rule, self.host, part, name.as_deref())?;
            if let Some(n) = name {
                names.insert(n);
            }
        }
        Ok(())
    }

    fn secrets(&self, part: Part, bytes: &[u8]) -> Result<(), Refusal> {
        match self.scrubber.and_then(|s| {
            secret_refusal(s, &self.rule.bound, part, bytes, self.host, &self.rule.name)
        }) {
            Some(r) => Err(r),
            None => Ok(()),
        }
    }
}

/// Refuses a placeholder that is malformed, unknown, unbound to this rule's hosts, or in a place
/// the rule does not enable (or that is never a place for one).
fn check_placeholder(
    policy: &Policy,
    rule: &Rule,
    host: &str,
    part: Part,
    name: Option<&str>,
) -> Result<(), Refusal> {
    let refuse = |m: String| Err((Reason::PlaceholderNotBound, m));
    let Some(place) = part.place() else {
        let which = name.map_or_else(String::new, |n| format!(" for secret '{n}'"));
        return refuse(format!(
            "placeholder{which} in the request {} for host {host}: placeholders are replaced only in header values, basic_auth, query values and the body",
            part.as_str()
        ));
    };
    let Some(name) = name else {
        return refuse(format!(
            "malformed placeholder in the {} for host {host}: write __LATCHKEY_<name>__",
            part.as_str()
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

/// How many raw bytes one decoded byte may take in [`unescaped`] (`\u0041` for `A`).
const ESCAPE_RATIO: usize = 6;

/// The views of `bytes` searched besides the bytes themselves: [`unescaped`] and
/// [`quoted_printable`], where they differ from it.
pub fn decoded_views(bytes: &[u8]) -> Vec<Vec<u8>> {
    unescaped(bytes)
        .into_iter()
        .chain(quoted_printable(bytes))
        .collect()
}

/// `bytes` with quoted-printable escapes undone (`=XX`, either case, and `=` soft line breaks):
/// a MIME part in `Content-Transfer-Encoding: quoted-printable` may escape every byte.
/// `None`: no `=` in it.
pub fn quoted_printable(bytes: &[u8]) -> Option<Vec<u8>> {
    if !bytes.contains(&b'=') {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' {
            let rest = &bytes[i + 1..];
            if rest.starts_with(b"\r\n") {
                i += 3;
                continue;
            }
            if rest.starts_with(b"\n") {
                i += 2;
                continue;
            }
            let hex = rest
                .get(..2)
                .and_then(|h| std::str::from_utf8(h).ok())
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(v) = hex {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    Some(out)
}

/// Bytes that make [`decoded_views`] differ from its input.
fn escape_byte(b: u8) -> bool {
    matches!(b, b'%' | b'\\' | b'\r' | b'\n' | b'=')
}

/// `bytes` with the escapes an upstream's parser undoes taken out — `%XX` (form bodies, any
/// byte escaped), JSON's `\u` with four hex digits (surrogate pairs joined) and `\/ \" \\ \b \f \t` — and
/// line breaks dropped (raw or `\n`/`\r` escaped: MIME and PEM wrap base64 at 64 or 76
/// columns), so a value escaped byte by byte, or encoded and wrapped, is found as it is once
/// parsed. `None`: nothing to undo.
pub fn unescaped(bytes: &[u8]) -> Option<Vec<u8>> {
    if !bytes.iter().copied().any(escape_byte) {
        return None;
    }
    let hex = |h: &[u8]| -> Option<u32> {
        std::str::from_utf8(h)
            .ok()
            .filter(|t| t.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|t| u32::from_str_radix(t, 16).ok())
    };
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            if let Some(v) = bytes.get(i + 1..i + 3).and_then(hex) {
                out.push(v as u8);
                i += 3;
                continue;
            }
        } else if b == b'\\' {
            match bytes.get(i + 1) {
                Some(b'u') => {
                    if let Some(hi) = bytes.get(i + 2..i + 6).and_then(hex) {
                        let mut code = hi;
                        let mut len = 6;
                        if (0xd800..0xdc00).contains(&hi) && bytes.get(i + 6..i + 8) == Some(b"\\u")
                        {
                            if let Some(lo) = bytes.get(i + 8..i + 12).and_then(hex) {
                                if (0xdc00..0xe000).contains(&lo) {
                                    code = 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
                                    len = 12;
                                }
                            }
                        }
                        if let Some(c) = char::from_u32(code) {
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                            i += len;
                            continue;
                        }
                    }
                }
                Some(&e) => {
                    let c = match e {
                        b'/' | b'"' | b'\\' => Some(e),
                        b'b' => Some(0x08),
                        b'f' => Some(0x0c),
                        b't' => Some(b'\t'),
                        // Line breaks are dropped, escaped or not.
                        b'n' | b'r' => {
                            i += 2;
                            continue;
                        }
                        _ => None,
                    };
                    if let Some(c) = c {
                        out.push(c);
                        i += 2;
                        continue;
                    }
                }
                None => {}
            }
        }
        if b != b'\r' && b != b'\n' {
            out.push(b);
        }
        i += 1;
    }
    Some(out)
}

/// Trailers are checked like headers, and never carry a placeholder.
fn check_trailers(
    scrubber: Option<&Scrubber>,
    bound: &BTreeSet<String>,
    trailers: &HeaderMap,
    host: &str,
    rule: &str,
) -> Result<(), Refusal> {
    for (name, value) in trailers {
        for (part, bytes) in [
            (Part::TrailerName, name.as_str().as_bytes()),
            (Part::TrailerValue, value.as_bytes()),
        ] {
            if !placeholders_in(part, bytes).is_empty() {
                return Err((
                    Reason::PlaceholderNotBound,
                    format!("placeholder in a request {} for host {host}: placeholders are never replaced in trailers", part.as_str()),
                ));
            }
            let mut views: Vec<Vec<u8>> = Vec::new();
            if bytes.contains(&b'%') {
                views.push(percent_decode(bytes).collect());
            }
            if part == Part::TrailerValue {
                views.extend(decoded_views(bytes));
            }
            for b in std::iter::once(bytes).chain(views.iter().map(Vec::as_slice)) {
                if let Some(r) =
                    scrubber.and_then(|s| secret_refusal(s, bound, part, b, host, rule))
                {
                    return Err(r);
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Streamed bodies

/// Finds secret values and placeholders in a streamed body, across chunk boundaries, holding
/// back only what could still become a secret's variant.
pub struct Detector {
    scrubber: Option<Arc<Scrubber>>,
    stream: Option<StreamScrubber>,
    bound: BTreeSet<String>,
    host: String,
    rule: String,
    /// Raw bytes scanned but not yet passed on.
    held: Vec<u8>,
    /// Set once a secret the rule binds was seen: the scrubber's output is then not the raw
    /// bytes, so a fixed window (the longest variant less one byte) is held back instead.
    conservative: bool,
    redactions: usize,
    /// The end of the previous chunk, for a placeholder prefix split across chunks.
    tail: Vec<u8>,
    /// Whether the rule enables body placeholders (only for the message).
    body_placeholders: bool,
    /// The last raw bytes received, searched again with the next chunk once unescaped
    /// ([`unescaped`]), and the output held back for as long: an escaped value is longer than
    /// its variants, so none of it goes out before its end has been seen.
    esc_tail: Vec<u8>,
    esc_held: Vec<u8>,
    pub(super) slot: Arc<OnceLock<BodyRefused>>,
}

impl Detector {
    pub fn new(
        scrubber: Option<Arc<Scrubber>>,
        rule: &Rule,
        host: &str,
        slot: Arc<OnceLock<BodyRefused>>,
    ) -> Self {
        let stream = scrubber
            .as_ref()
            .filter(|s| !s.is_empty())
            .map(|s| s.stream());
        Self {
            scrubber,
            stream,
            bound: rule.bound.clone(),
            host: host.to_string(),
            rule: rule.name.clone(),
            held: Vec::new(),
            conservative: false,
            redactions: 0,
            tail: Vec::new(),
            body_placeholders: rule.placeholders.contains(&Place::Body),
            esc_tail: Vec::new(),
            esc_held: Vec::new(),
            slot,
        }
    }

    fn refused(&self, (reason, message): Refusal) -> BodyRefused {
        BodyRefused { reason, message }
    }

    fn unbound_seen(&mut self) -> Result<(), BodyRefused> {
        let Some(stream) = &self.stream else {
            return Ok(());
        };
        if stream.redactions() == self.redactions {
            return Ok(());
        }
        self.redactions = stream.redactions();
        if let Some(name) = stream
            .redacted_names()
            .into_iter()
            .find(|n| !self.bound.contains(&**n))
        {
            return Err(self.refused((
                Reason::SecretValueUnbound,
                format!(
                    "the value of secret '{name}' was sent to host {}, which rule '{}' does not bind it to",
                    self.host, self.rule
                ),
            )));
        }
        self.conservative = true;
        Ok(())
    }

    /// Raw bytes an escaped value may span: the longest variant, escaped byte by byte.
    fn escape_window(&self) -> usize {
        match (&self.stream, &self.scrubber) {
            (Some(_), Some(s)) => s.max_pattern_len().saturating_mul(ESCAPE_RATIO),
            _ => 0,
        }
    }

    /// Scans a chunk; returns the bytes that may go upstream now.
    pub fn push(&mut self, chunk: Bytes) -> Result<Bytes, BodyRefused> {
        let window = self.escape_window();
        if window == 0 {
            return self.push_raw(chunk);
        }
        // The unescaped view of what came since the last check, with the window before it.
        let mut seen = std::mem::take(&mut self.esc_tail);
        seen.extend_from_slice(&chunk);
        if let Some(s) = self.scrubber.as_deref() {
            for d in decoded_views(&seen) {
                if let Some(r) =
                    secret_refusal(s, &self.bound, Part::Body, &d, &self.host, &self.rule)
                {
                    return Err(self.refused(r));
                }
            }
        }
        self.esc_tail = seen.split_off(seen.len().saturating_sub(window));
        let out = self.push_raw(chunk)?;
        if out.is_empty() && self.esc_held.is_empty() {
            return Ok(out);
        }
        self.esc_held.extend_from_slice(&out);
        // An escaped value not yet complete has an escape in the window, or is still only a
        // literal prefix of a variant, which `push_raw` holds back itself.
        let pending = self.esc_tail.iter().copied().any(escape_byte);
        let ready = if pending {
            self.esc_held.len().saturating_sub(window)
        } else {
            self.esc_held.len()
        };
        let rest = self.esc_held.split_off(ready);
        Ok(Bytes::from(std::mem::replace(&mut self.esc_held, rest)))
    }

    /// [`Self::push`] without the unescaped view.
    fn push_raw(&mut self, chunk: Bytes) -> Result<Bytes, BodyRefused> {
        // A placeholder begins with PREFIX: look for it in the chunk and across its start.
        let keep = PREFIX.len() - 1;
        let mut seam = std::mem::take(&mut self.tail);
        seam.extend_from_slice(&chunk[..chunk.len().min(keep)]);
        if placeholder::contains(&seam) || placeholder::contains(&chunk) {
            let why = if self.body_placeholders {
                format!("placeholder in a request body to host {} that is streamed (over {} MiB, or past latchkey's buffer budget): body placeholders are replaced only in bodies latchkey holds whole", self.host, super::credentials::SCAN_LIMIT / (1024 * 1024))
            } else {
                format!(
                    "placeholder in the request body to host {}: rule '{}' does not enable body placeholders",
                    self.host, self.rule
                )
            };
            return Err(self.refused((Reason::PlaceholderNotBound, why)));
        }
        self.tail = seam[seam.len().saturating_sub(keep)..].to_vec();

        let Some(stream) = self.stream.as_mut() else {
            return Ok(chunk);
        };
        let out = stream.push_bytes(chunk.clone());
        self.unbound_seen()?;
        if self.conservative {
            self.held.extend_from_slice(&chunk);
            let window = self
                .scrubber
                .as_ref()
                .map_or(0, |s| s.max_pattern_len().saturating_sub(1));
            let ready = self.held.len().saturating_sub(window);
            let rest = self.held.split_off(ready);
            return Ok(Bytes::from(std::mem::replace(&mut self.held, rest)));
        }
        // No redaction: the scrubber's output is exactly the raw bytes it settled.
        let pending = self.held.len() + chunk.len() - out.len();
        if pending <= chunk.len() {
            self.held = chunk[chunk.len() - pending..].to_vec();
        } else {
            let from_held = pending - chunk.len();
            let start = self.held.len() - from_held;
            self.held.drain(..start);
            self.held.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    /// The end of the body: scans what was held back and returns it.
    pub fn finish(&mut self) -> Result<Bytes, BodyRefused> {
        if let Some(stream) = self.stream.as_mut() {
            stream.finish();
            self.unbound_seen()?;
        }
        let mut out = std::mem::take(&mut self.esc_held);
        out.extend_from_slice(&self.held);
        self.held = Vec::new();
        Ok(Bytes::from(out))
    }

    /// Checks trailers like headers.
    pub fn trailers(&self, trailers: &HeaderMap) -> Result<(), BodyRefused> {
        check_trailers(
            self.scrubber.as_deref(),
            &self.bound,
            trailers,
            &self.host,
            &self.rule,
        )
        .map_err(|r| self.refused(r))
    }
}

pin_project_lite::pin_project! {
    /// A buffered prefix, then the rest of the body, all through the detector; the prefix's
    /// budget charge is released when the body is dropped.
    pub struct Prefixed {
        pub prefix: Option<Bytes>,
        // Taken on a refusal, to drain what the client still sends (see `drain`).
        pub inner: Option<Progress<Incoming>>,
        pub detector: Detector,
        pub charge: Option<Charge>,
        // Trailers waiting behind the held-back bytes; then the end.
        queued: Option<HeaderMap>,
        done: bool,
    }
}

impl Prefixed {
    pub fn new(
        prefix: Bytes,
        inner: Progress<Incoming>,
        detector: Detector,
        charge: Charge,
    ) -> Self {
        Self {
            prefix: Some(prefix),
            inner: Some(inner),
            detector,
            charge: Some(charge),
            queued: None,
            done: false,
        }
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
        let fail = |detector: &Detector, inner: &mut Option<Progress<Incoming>>, r: BodyRefused| {
            let _ = detector.slot.set(r.clone());
            if let (Some(rest), Ok(rt)) = (inner.take(), tokio::runtime::Handle::try_current()) {
                rt.spawn(drain(rest));
            }
            Poll::Ready(Some(Err(Box::new(r) as BoxError)))
        };
        loop {
            if let Some(t) = this.queued.take() {
                return Poll::Ready(Some(Ok(Frame::trailers(t))));
            }
            if *this.done {
                return Poll::Ready(None);
            }
            if let Some(p) = this.prefix.take() {
                let out = match this.detector.push(p) {
                    Ok(out) => out,
                    Err(r) => return fail(this.detector, this.inner, r),
                };
                // The prefix's memory goes with it.
                this.charge.take();
                if !out.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
                continue;
            }
            let Some(inner) = this.inner.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(Pin::new(inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => match this.detector.push(data) {
                        Ok(out) if out.is_empty() => continue,
                        Ok(out) => return Poll::Ready(Some(Ok(Frame::data(out)))),
                        Err(r) => return fail(this.detector, this.inner, r),
                    },
                    Err(frame) => {
                        let Ok(trailers) = frame.into_trailers() else {
                            continue;
                        };
                        let held = match this
                            .detector
                            .finish()
                            .and_then(|held| this.detector.trailers(&trailers).map(|()| held))
                        {
                            Ok(held) => held,
                            Err(r) => return fail(this.detector, this.inner, r),
                        };
                        *this.done = true;
                        if held.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                        }
                        *this.queued = Some(trailers);
                        return Poll::Ready(Some(Ok(Frame::data(held))));
                    }
                },
                Some(Err(e)) => {
                    if let Some(r) = e.downcast_ref::<BodyRefused>() {
                        let _ = this.detector.slot.set(r.clone());
                    }
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    *this.done = true;
                    match this.detector.finish() {
                        Ok(held) if held.is_empty() => return Poll::Ready(None),
                        Ok(held) => return Poll::Ready(Some(Ok(Frame::data(held)))),
                        Err(r) => return fail(this.detector, this.inner, r),
                    }
                }
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Reads and discards the rest of a refused upload (bounded in size and time), so the client
/// reads the refusal instead of a reset: answering an h2 stream whose body is still open makes
/// some clients (curl) report a framing error, and an HTTP/1.1 close with unread bytes becomes a
/// TCP reset that can swallow the answer.
pub async fn drain(mut body: Progress<Incoming>) {
    use http_body_util::BodyExt;
    const LIMIT: usize = 1024 * 1024;
    let read = async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > LIMIT {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), read).await;
}

pin_project_lite::pin_project! {
    /// A body held whole (and its trailers), with the budget charge for its bytes: released
    /// when the body has been sent or is dropped.
    pub struct Whole {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
        charge: Option<Charge>,
    }
}

impl Whole {
    pub fn new(data: Bytes, trailers: Option<HeaderMap>, charge: Charge) -> Self {
        Self {
            data: Some(data).filter(|d| !d.is_empty()),
            trailers,
            charge: Some(charge),
        }
    }
}

impl HttpBody for Whole {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Some(d) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        if let Some(t) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        this.charge.take();
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.data, &self.trailers) {
            // With trailers the length stays open, so HTTP/1.1 sends them chunked.
            (_, Some(_)) => SizeHint::default(),
            (Some(d), None) => SizeHint::with_exact(d.len() as u64),
            (None, None) => SizeHint::with_exact(0),
        }
    }
}

/// The least a request body must bring per `--body-timeout` of waiting: a client trickling a
/// byte just inside the timeout would otherwise hold its connection (and any buffer charged to
/// it) forever.
pub const MIN_BODY_PROGRESS: usize = 1024;

pin_project_lite::pin_project! {
    /// The sandbox's request body, cut when fewer than [`MIN_BODY_PROGRESS`] bytes arrive in
    /// `timeout` of latchkey waiting for them (time the upstream takes to read does not count):
    /// a body that stops, and one that trickles.
    pub struct Progress<B> {
        #[pin]
        inner: B,
        timeout: Duration,
        // Boxed so the body stays `Unpin` (it is read with `.frame()` before dialing).
        sleep: Pin<Box<tokio::time::Sleep>>,
        waiting: bool,
        // Waiting time and bytes since the body last made `MIN_BODY_PROGRESS`.
        waited: Duration,
        since: usize,
        wait_started: tokio::time::Instant,
    }
}

impl<B> Progress<B> {
    pub fn new(inner: B, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            sleep: Box::pin(tokio::time::sleep(timeout)),
            waiting: false,
            waited: Duration::ZERO,
            since: 0,
            wait_started: tokio::time::Instant::now(),
        }
    }
}

impl<B> HttpBody for Progress<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if !*this.waiting {
            let now = tokio::time::Instant::now();
            *this.wait_started = now;
            let left = this.timeout.saturating_sub(*this.waited);
            this.sleep.as_mut().reset(now + left);
            *this.waiting = true;
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(frame) => {
                *this.waiting = false;
                *this.waited += this.wait_started.elapsed();
                let n = match &frame {
                    Some(Ok(f)) => f.data_ref().map_or(MIN_BODY_PROGRESS, |d| d.len()),
                    _ => MIN_BODY_PROGRESS,
                };
                *this.since = this.since.saturating_add(n);
                if *this.since >= MIN_BODY_PROGRESS {
                    *this.waited = Duration::ZERO;
                    *this.since = 0;
                }
                Poll::Ready(frame.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                ready!(std::future::Future::poll(this.sleep.as_mut(), cx));
                Poll::Ready(Some(Err(Box::new(BodyRefused {
                    reason: Reason::BodyTimeout,
                    message: format!(
                        "the client sent fewer than {MIN_BODY_PROGRESS} request body bytes in {}s (--body-timeout)",
                        this.timeout.as_secs_f64()
                    ),
                }))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::scrub::ScrubSecret;

    const SECRET: &[u8] = b"sk-test-OPENAI-4f9a1c7e2b8d";

    fn detector(bound: &[&str]) -> Detector {
        let scrubber = Arc::new(
            Scrubber::new(&[ScrubSecret {
                name: "openai",
                value: SECRET,
            }])
            .expect("scrubber"),
        );
        let mut rule = Rule::report_only();
        rule.bound = bound.iter().map(|s| s.to_string()).collect();
        Detector::new(Some(scrubber), &rule, "api.test", Arc::default())
    }

    /// Feeds `chunks`; returns what went out, or the refusal and what went out before it.
    fn run(d: &mut Detector, chunks: &[&[u8]]) -> (Vec<u8>, Option<Reason>) {
        let mut out = Vec::new();
        for c in chunks {
            match d.push(Bytes::copy_from_slice(c)) {
                Ok(b) => out.extend_from_slice(&b),
                Err(r) => return (out, Some(r.reason)),
            }
        }
        match d.finish() {
            Ok(b) => out.extend_from_slice(&b),
            Err(r) => return (out, Some(r.reason)),
        }
        (out, None)
    }

    #[test]
    fn a_secret_split_across_chunks_is_refused_before_any_of_it_goes_out() {
        let mut body = b"x".repeat(100);
        body.extend_from_slice(SECRET);
        body.extend_from_slice(b"tail");
        for cut in 1..body.len() {
            let mut d = detector(&[]);
            let (out, refused) = run(&mut d, &[&body[..cut], &body[cut..]]);
            assert_eq!(refused, Some(Reason::SecretValueUnbound), "cut at {cut}");
            assert!(
                !out.windows(4).any(|w| w == b"sk-t"),
                "cut at {cut}: part of the secret went out: {:?}",
                String::from_utf8_lossy(&out)
            );
        }
    }

    #[test]
    fn clean_bodies_pass_byte_exact_and_bound_secrets_pass_too() {
        let body: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let chunks: Vec<&[u8]> = body.chunks(333).collect();
        let (out, refused) = run(&mut detector(&[]), &chunks);
        assert_eq!((out, refused), (body.clone(), None));

        let mut with = body.clone();
        with.splice(2000..2000, SECRET.iter().copied());
        let chunks: Vec<&[u8]> = with.chunks(97).collect();
        let (out, refused) = run(&mut detector(&["openai"]), &chunks);
        assert_eq!(refused, None);
        assert_eq!(out, with, "a bound secret's bytes pass unchanged");
    }

    #[test]
    fn unescaping_undoes_percent_and_json_escapes_only() {
        assert_eq!(unescaped(b"plain"), None);
        assert_eq!(
            unescaped(br#"%73k\u002d\u00E9\/\"\\\n%zz\q\ud83d\ude00"#).as_deref(),
            Some("sk-\u{e9}/\"\\%zz\\q\u{1f600}".as_bytes())
        );
        // Wrapped base64 (MIME, PEM) joins up; line breaks go, raw or escaped.
        assert_eq!(
            unescaped(b"c2stdGVz\r\ndC1PUEVO\nQUk=\\nx").as_deref(),
            Some(&b"c2stdGVzdC1PUEVOQUk=x"[..])
        );
        assert_eq!(
            quoted_printable(b"=73=6b-te=\r\nst=\nx=zz=4").as_deref(),
            Some(&b"sk-testx=zz=4"[..])
        );
        assert_eq!(quoted_printable(b"no equals"), None);
        // Truncated escapes stay as they are.
        assert_eq!(unescaped(b"a%7").as_deref(), Some(&b"a%7"[..]));
        assert_eq!(unescaped(b"\\u00").as_deref(), Some(&b"\\u00"[..]));
    }

    /// A value escaped byte by byte (`%XX`, `\u00XX`, half and half), split at every point:
    /// refused, and none of its escaped form goes out first.
    #[test]
    fn an_escaped_secret_split_across_chunks_is_refused_before_any_of_it_goes_out() {
        let pct: String = SECRET.iter().map(|b| format!("%{b:02x}")).collect();
        let uni: String = SECRET.iter().map(|b| format!("\\u{:04X}", b)).collect();
        let half: String = SECRET[..10]
            .iter()
            .map(|&b| (b as char).to_string())
            .chain(SECRET[10..].iter().map(|b| format!("\\u{b:04x}")))
            .collect();
        let qp: String = SECRET.iter().map(|b| format!("={b:02X}")).collect();
        for escaped in [pct, uni, half, qp] {
            let mut body = b"{\"a\":\"".to_vec();
            let start = body.len();
            body.extend_from_slice(escaped.as_bytes());
            body.extend_from_slice(b"\"}");
            for cut in 1..body.len() {
                let mut d = detector(&[]);
                let (out, refused) = run(&mut d, &[&body[..cut], &body[cut..]]);
                assert_eq!(
                    refused,
                    Some(Reason::SecretValueUnbound),
                    "{escaped} cut at {cut}"
                );
                assert!(
                    out.len() <= start,
                    "{escaped} cut at {cut}: {:?}",
                    String::from_utf8_lossy(&out)
                );
            }
            let mut d = detector(&["openai"]);
            let (out, refused) = run(&mut d, &[&body[..20], &body[20..]]);
            assert_eq!(
                (out, refused),
                (body.clone(), None),
                "bound: passes unchanged"
            );
        }
        // Escapes of ordinary text pass byte-exact, split anywhere.
        let body = br#"{"k":"caf\u00e9 100%25 \/"}"#.repeat(50);
        for cut in [1, 7, 100, 500] {
            let (out, refused) = run(&mut detector(&[]), &[&body[..cut], &body[cut..]]);
            assert_eq!((out, refused), (body.clone(), None));
        }
    }

    /// A byte every 0.7 s of a 1 s timeout is cut; 1 KiB every 0.7 s is not.
    #[tokio::test(start_paused = true)]
    async fn a_trickling_body_is_cut_by_the_minimum_progress() {
        use http_body_util::BodyExt;
        for (size, cut) in [(1usize, true), (MIN_BODY_PROGRESS, false)] {
            let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
            tokio::spawn(async move {
                for _ in 0..10 {
                    tokio::time::sleep(Duration::from_millis(700)).await;
                    if tx.send(Bytes::from(vec![b'x'; size])).await.is_err() {
                        return;
                    }
                }
            });
            let mut body = Progress::new(Chan(rx), Duration::from_secs(1));
            let mut frames = 0;
            let mut failed = false;
            while let Some(f) = body.frame().await {
                match f {
                    Ok(_) => frames += 1,
                    Err(e) => {
                        failed = true;
                        assert!(e.to_string().contains("--body-timeout"), "{e}");
                        break;
                    }
                }
            }
            assert_eq!(failed, cut, "{size}-byte frames: {frames} read");
            if cut {
                assert!(frames <= 2, "{frames}");
            }
        }
    }

    /// A body fed frame by frame from a channel.
    struct Chan(tokio::sync::mpsc::Receiver<Bytes>);

    impl HttpBody for Chan {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            self.0.poll_recv(cx).map(|f| f.map(|b| Ok(Frame::data(b))))
        }
    }

    #[test]
    fn placeholders_are_refused_across_a_chunk_boundary() {
        let (_, refused) = run(&mut detector(&[]), &[b"aaa__LATCH", b"KEY_openai__"]);
        assert_eq!(refused, Some(Reason::PlaceholderNotBound));
    }

    #[test]
    fn head_parts_cover_every_part_and_decode_percent_forms() {
        let mut headers = HeaderMap::new();
        headers.insert("x-a", http::HeaderValue::from_static("v%41"));
        let enc = base64::engine::general_purpose::STANDARD.encode("u:p");
        headers.insert(
            AUTHORIZATION,
            http::HeaderValue::from_str(&format!("Basic {enc}")).expect("hv"),
        );
        let head = Head {
            method: "GET",
            hosts: &["Api.Test"],
            path_and_query: "/p%41?k%41=v+1&x",
            headers: &headers,
        };
        let parts = head_parts(&head);
        let has = |part: Part, bytes: &[u8]| parts.iter().any(|(p, b)| *p == part && &**b == bytes);
        assert!(has(Part::Method, b"GET"));
        assert!(has(Part::Host, b"Api.Test"));
        assert!(has(Part::Path, b"/pA"));
        assert!(has(Part::QueryName, b"kA"));
        assert!(has(Part::QueryValue, b"v 1"));
        assert!(has(Part::QueryName, b"x"));
        assert!(has(Part::HeaderName, b"x-a"));
        assert!(has(Part::HeaderValue, b"vA"));
        assert!(has(Part::BasicAuth, b"u:p"));
    }
}

//! What the sandbox sends: one check over every part of a request for secret values and
//! placeholders where the rule does not allow them.
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
//! A streamed body is checked by [`super::detector::Detector`]. The checks take plain data (a
//! [`Binding`]: what the rule binds and enables), never the policy: `policy` depends on
//! `secrets`, not the other way round. Refusal messages name secrets and hosts, never values.

use std::borrow::Cow;
use std::collections::BTreeSet;

use base64::Engine;
use http::header::AUTHORIZATION;
use http::HeaderMap;
use percent_encoding::percent_decode;

use super::decoded::{decoded_views, unescaped_views};
use super::placeholder::{self, Place};
use super::query;
use super::scrub::Scrubber;
use super::SecretStore;
use crate::reason::{Reason, Refusal};

/// What one rule allows, as the leak checks need it.
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    /// The rule's name, for messages.
    pub rule: &'a str,
    /// The secrets bound to the rule's hosts.
    pub bound: &'a BTreeSet<String>,
    /// Where the rule enables placeholders.
    pub placeholders: &'a [Place],
    /// Tokens a capture holds for this identity and host (book "OAuth token capture"):
    /// their placeholders are replaced in any replaceable place, whatever `placeholders` says.
    pub captured: &'a BTreeSet<String>,
    /// Captured tokens that may go to this host, but not in this request: latchkey would send
    /// it in cleartext (`http`), and a credential never travels in cleartext. Their
    /// placeholders are refused with `credential_needs_tls`.
    pub withheld: &'a BTreeSet<String>,
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
    /// A WebSocket message toward the upstream.
    WebSocket,
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
            Part::WebSocket => "websocket message",
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
            Part::WebSocket => Some(Place::WebSocket),
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
pub(super) fn head_parts<'a>(head: &'a Head<'a>) -> Vec<(Part, Cow<'a, [u8]>)> {
    // Destructured so that a field added to `Head` cannot be left out here.
    let Head {
        method,
        hosts,
        path_and_query,
        headers,
    } = head;
    let mut out: Vec<(Part, Cow<'a, [u8]>)> = Vec::new();
    let mut add = |part: Part, raw: &'a [u8]| {
        // Decoded as bytes, not with `form_urlencoded` (lossy for bytes that are not UTF-8, so
        // it would hide a binary secret): see `super::query`.
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
                for u in unescaped_views(&base) {
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
    let (path, query) = query::split(path_and_query);
    add(Part::Path, path.as_bytes());
    if let Some(q) = query {
        // The whole query too: a raw value may itself hold `&` or `=`.
        add(Part::QueryValue, q.as_bytes());
        for pair in query::raw_pairs(q).filter(|p| !p.raw.is_empty()) {
            add(Part::QueryName, pair.name.as_bytes());
            add(Part::QueryValue, pair.value.unwrap_or_default().as_bytes());
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
pub(super) fn placeholders_in(part: Part, bytes: &[u8]) -> Vec<Option<String>> {
    let mut names: Vec<Option<String>> = placeholder::find(bytes)
        .into_iter()
        .map(|f| f.name)
        .collect();
    if names.is_empty() && part.folded() && placeholder::contains_ignore_ascii_case(bytes) {
        names.push(None);
    }
    names
}

/// The refusal for a secret value in `bytes` (in `part`) that `bound` does not allow there.
pub(super) fn secret_refusal(
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
        // The first secret found that may not be here: a search, no scrubbed copy.
        scrubber.find_where(bytes, |n| part.never_secret() || !bound.contains(n))?
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
    Some(Refusal::new(Reason::SecretValueUnbound, message))
}

/// What an audit record shows for a host refused for holding a secret value (the record's own
/// redaction matches case-sensitively; a lowercased value would get through it).
pub const REDACTED_HOST: &str = "[REDACTED]";

/// Refuses a host whose spelling (as sent) holds a secret value or a placeholder, whatever the
/// rule: checked before any DNS lookup, the CONNECT gate included.
pub fn check_host(store: &SecretStore, host: &str) -> Result<(), Refusal> {
    let scrubber = store.scrubber().map_err(|e| {
        Refusal::new(
            Reason::SecretUnavailable,
            format!("cannot search the host for secret values: {e}"),
        )
    })?;
    check_host_with(scrubber.as_deref(), host)
}

/// [`check_host`] with a scrubber already in hand (one per request is enough).
pub fn check_host_with(scrubber: Option<&Scrubber>, host: &str) -> Result<(), Refusal> {
    if !placeholders_in(Part::Host, host.as_bytes()).is_empty() {
        return Err(Refusal::new(
            Reason::PlaceholderNotBound,
            "a placeholder in the request host: placeholders are never replaced there",
        ));
    }
    if let Some(s) = scrubber {
        let none = BTreeSet::new();
        if let Some(r) = secret_refusal(s, &none, Part::Host, host.as_bytes(), host, "") {
            return Err(r);
        }
    }
    Ok(())
}

/// The check of one request against one rule.
pub struct Checker<'a> {
    pub scrubber: Option<&'a Scrubber>,
    /// Which secrets exist at all (a placeholder naming another is refused).
    pub store: &'a SecretStore,
    pub binding: Binding<'a>,
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
            self.escaped_placeholders(Part::Body, body, &d)?;
            self.secrets(Part::Body, &d)?;
        }
        if let Some(t) = trailers {
            check_trailers(
                self.scrubber,
                self.binding.bound,
                t,
                self.host,
                self.binding.rule,
            )?;
        }
        Ok(names)
    }

    /// Checks one WebSocket message toward the upstream (whole: fragments reassembled); returns
    /// the placeholders to replace in it.
    pub fn message(&self, message: &[u8]) -> Result<BTreeSet<String>, Refusal> {
        let mut names = BTreeSet::new();
        self.placeholders(Part::WebSocket, message, &mut names)?;
        self.secrets(Part::WebSocket, message)?;
        for d in decoded_views(message) {
            self.escaped_placeholders(Part::WebSocket, message, &d)?;
            self.secrets(Part::WebSocket, &d)?;
        }
        Ok(names)
    }

    /// Refuses a placeholder that appears only once `raw` is unescaped (`decoded`): latchkey
    /// replaces placeholders as written, so an escaped one would reach the upstream, which
    /// reads it as one.
    fn escaped_placeholders(&self, part: Part, raw: &[u8], decoded: &[u8]) -> Result<(), Refusal> {
        if !placeholder::contains(decoded)
            || placeholder::find(decoded).len() <= placeholder::find(raw).len()
        {
            return Ok(());
        }
        Err(Refusal::new(
            Reason::PlaceholderNotBound,
            format!(
                "escaped placeholder in the request {} for host {}: latchkey replaces placeholders only as written (not percent-, JSON- or quoted-printable-escaped, nor broken by a line break)",
                part.as_str(),
                self.host
            ),
        ))
    }

    fn placeholders(
        &self,
        part: Part,
        bytes: &[u8],
        names: &mut BTreeSet<String>,
    ) -> Result<(), Refusal> {
        for name in placeholders_in(part, bytes) {
            check_placeholder(self.store, &self.binding, self.host, part, name.as_deref())?;
            if let Some(n) = name {
                names.insert(n);
            }
        }
        Ok(())
    }

    fn secrets(&self, part: Part, bytes: &[u8]) -> Result<(), Refusal> {
        match self.scrubber.and_then(|s| {
            secret_refusal(
                s,
                self.binding.bound,
                part,
                bytes,
                self.host,
                self.binding.rule,
            )
        }) {
            Some(r) => Err(r),
            None => Ok(()),
        }
    }
}

/// Refuses a placeholder that is malformed, unknown, unbound to this rule's hosts, or in a place
/// the rule does not enable (or that is never a place for one).
fn check_placeholder(
    store: &SecretStore,
    rule: &Binding<'_>,
    host: &str,
    part: Part,
    name: Option<&str>,
) -> Result<(), Refusal> {
    let refuse = |m: String| Err(Refusal::new(Reason::PlaceholderNotBound, m));
    let Some(place) = part.place() else {
        let which = name.map_or_else(String::new, |n| format!(" for secret '{n}'"));
        return refuse(format!(
            "placeholder{which} in the request {} for host {host}: placeholders are replaced only in header values, basic_auth, query values, the body and WebSocket messages",
            part.as_str()
        ));
    };
    let Some(name) = name else {
        return refuse(format!(
            "malformed placeholder in the {} for host {host}: write __LATCHKEY_<name>__",
            part.as_str()
        ));
    };
    if rule.captured.contains(name) {
        return Ok(());
    }
    if rule.withheld.contains(name) {
        return Err(Refusal::new(
            Reason::CredentialNeedsTls,
            format!("placeholder for captured token '{name}' in a request to host {host} that latchkey would send in cleartext (http): a credential never travels in cleartext; send it as https://"),
        ));
    }
    if !store.contains(name) || !rule.bound.contains(name) {
        return refuse(format!(
            "placeholder for secret '{name}' not bound to host {host}"
        ));
    }
    if !rule.placeholders.contains(&place) {
        let enabled: Vec<&str> = rule.placeholders.iter().map(|p| p.as_str()).collect();
        return refuse(format!(
            "placeholder for secret '{name}' not bound to host {host} in the {}: rule '{}' enables placeholders in: {}",
            place.as_str(),
            rule.rule,
            if enabled.is_empty() { "nothing".to_string() } else { enabled.join(", ") }
        ));
    }
    Ok(())
}

/// Trailers are checked like headers, and never carry a placeholder.
pub(super) fn check_trailers(
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
                return Err(Refusal::new(
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
#[cfg(test)]
mod tests {
    use super::*;

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

    /// A value escaped byte by byte after backslashes that are not its own (either parity, or
    /// `%5C`), or before one, in a JSON header or query value or a trailer: decoded, refused.
    #[test]
    fn a_value_escaped_after_a_backslash_is_found_in_head_and_trailers() {
        let secret = b"sk-test-HEADER-5e6f7a8b9c";
        let scrubber = Scrubber::new(&[crate::scrub::ScrubSecret {
            name: "s",
            value: secret,
        }])
        .expect("scrubber");
        let uni: String = secret.iter().map(|b| format!("\\u{b:04x}")).collect();
        let none = BTreeSet::new();
        for (before, after) in [
            ("\\", ""),
            ("\\\\", ""),
            ("\\\\\\", "\\"),
            ("%5C", ""),
            ("\\u00", ""),
            ("", "\\"),
        ] {
            let value = format!("{{\"k\":\"{before}{uni}{after}\"}}");
            let mut headers = HeaderMap::new();
            headers.insert("x-arg", http::HeaderValue::from_str(&value).expect("hv"));
            let path = format!("/p?q={value}");
            let head = Head {
                method: "GET",
                hosts: &["api.test"],
                path_and_query: &path,
                headers: &headers,
            };
            let parts = head_parts(&head);
            for part in [Part::HeaderValue, Part::QueryValue] {
                assert!(
                    parts.iter().any(|(p, b)| *p == part
                        && secret_refusal(&scrubber, &none, part, b, "api.test", "r").is_some()),
                    "{part:?}: {value}"
                );
            }
            let refused = check_trailers(Some(&scrubber), &none, &headers, "api.test", "r");
            assert_eq!(
                refused.map_err(|r| r.reason),
                Err(Reason::SecretValueUnbound),
                "{value}"
            );
        }
    }
}

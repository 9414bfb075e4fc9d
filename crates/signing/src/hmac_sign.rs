//! The generic HMAC request signer (`kind = "hmac"`): a message built from a template over the
//! request (method, path with query, host, headers, a timestamp, the body or its SHA-256) is
//! signed with HMAC-SHA1/256/512 under a key from a secret source, and the signature set in
//! headers that are themselves templates (`x-signature = "{{signature}}"`, or Stripe's
//! `t={{timestamp}},v1={{signature}}`).
//!
//! A message that uses `{{body}}` or `{{body_sha256}}` needs the whole body:
//! [`crate::whole_body_needed`] asks the proxy to hold it (up to `max_signed_body`); a body the
//! proxy could not hold is refused, never signed over something else. Knows no sockets.

use std::time::SystemTime;

use aws_lc_rs::{digest, hmac};
use base64::Engine;
use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;

use super::{failed, secret, CredentialError, Material, SignBody, Target};

/// A compiled `hmac` credential.
#[derive(Debug, Clone, PartialEq)]
pub struct Hmac {
    pub algorithm: HmacAlg,
    pub encoding: Encoding,
    pub message: Vec<Part>,
    pub timestamp: Timestamp,
    /// The headers set, each a template over `{{signature}}` and `{{timestamp}}`.
    pub headers: Vec<(HeaderName, Vec<Part>)>,
    /// The most body bytes held to sign (when the message uses the body).
    pub max_signed_body: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HmacAlg {
    Sha1,
    Sha256,
    Sha512,
}

impl HmacAlg {
    pub fn parse(s: &str) -> Option<HmacAlg> {
        match s {
            "sha1" => Some(HmacAlg::Sha1),
            "sha256" => Some(HmacAlg::Sha256),
            "sha512" => Some(HmacAlg::Sha512),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Hex,
    Base64,
}

impl Encoding {
    pub fn parse(s: &str) -> Option<Encoding> {
        match s {
            "hex" => Some(Encoding::Hex),
            "base64" => Some(Encoding::Base64),
            _ => None,
        }
    }
}

/// How `{{timestamp}}` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timestamp {
    /// Seconds since the epoch (`unix`).
    Seconds,
    /// Milliseconds since the epoch (`unix_ms`).
    Millis,
    /// `2024-05-01T12:00:00Z` (`rfc3339`).
    Rfc3339,
}

impl Timestamp {
    pub fn parse(s: &str) -> Option<Timestamp> {
        match s {
            "unix" => Some(Timestamp::Seconds),
            "unix_ms" => Some(Timestamp::Millis),
            "rfc3339" => Some(Timestamp::Rfc3339),
            _ => None,
        }
    }

    fn render(self, now: SystemTime) -> String {
        let since = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        match self {
            Timestamp::Seconds => since.as_secs().to_string(),
            Timestamp::Millis => since.as_millis().to_string(),
            Timestamp::Rfc3339 => humantime::format_rfc3339_seconds(now).to_string(),
        }
    }
}

/// One piece of a message or header template.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Lit(String),
    Method,
    /// The path with its query, as sent upstream.
    Path,
    Host,
    Timestamp,
    Body,
    BodySha256,
    Header(HeaderName),
    Signature,
}

/// Where a template is used: the message (over the request) or a header (over the result).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    Message,
    Header,
}

/// Parses a template; the error names the bad placeholder and what is allowed.
pub fn parse_template(text: &str, used: Use) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("{{") {
        if i > 0 {
            parts.push(Part::Lit(rest[..i].to_string()));
        }
        let after = &rest[i + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("unclosed '{{{{' in {text:?}"))?;
        let name = after[..end].trim();
        let part = match (used, name) {
            (_, "timestamp") => Part::Timestamp,
            (Use::Header, "signature") => Part::Signature,
            (Use::Message, "method") => Part::Method,
            (Use::Message, "path") => Part::Path,
            (Use::Message, "host") => Part::Host,
            (Use::Message, "body") => Part::Body,
            (Use::Message, "body_sha256") => Part::BodySha256,
            (Use::Message, n) if n.starts_with("header.") => {
                let h = &n["header.".len()..];
                Part::Header(
                    HeaderName::from_bytes(h.as_bytes())
                        .map_err(|_| format!("invalid header name {h:?} in {{{{{n}}}}}"))?,
                )
            }
            (Use::Message, n) => return Err(format!(
                "unknown template {{{{{n}}}}}: use {{{{method}}}}, {{{{path}}}}, {{{{host}}}}, {{{{timestamp}}}}, {{{{body}}}}, {{{{body_sha256}}}} or {{{{header.NAME}}}}"
            )),
            (Use::Header, n) => {
                return Err(format!(
                    "unknown template {{{{{n}}}}}: use {{{{signature}}}} or {{{{timestamp}}}}"
                ))
            }
        };
        parts.push(part);
        rest = &after[end + 2..];
    }
    if !rest.is_empty() {
        parts.push(Part::Lit(rest.to_string()));
    }
    Ok(parts)
}

impl Hmac {
    /// Whether the message needs the whole body.
    pub fn uses_body(&self) -> bool {
        self.message
            .iter()
            .any(|p| matches!(p, Part::Body | Part::BodySha256))
    }
}

/// Signs the request: renders the message, MACs it, sets the headers.
pub(super) async fn sign(
    name: &str,
    h: &Hmac,
    material: Material<'_>,
    t: &Target<'_>,
    headers: &mut HeaderMap,
    path_and_query: &str,
    body: SignBody<'_>,
) -> Result<(), CredentialError> {
    let body = match (h.uses_body(), body) {
        (false, _) => &[][..],
        (true, SignBody::Whole(b)) => b,
        (true, SignBody::Streamed) => {
            return Err(CredentialError::BadRequest {
                name: name.to_string(),
                why: format!(
                    "the hmac signature covers the body, and latchkey holds at most {} bytes of it to sign",
                    h.max_signed_body
                ),
            })
        }
    };
    let timestamp = h.timestamp.render(SystemTime::now());
    let message = message(h, t, headers, path_and_query, body, &timestamp);
    let key = secret(material.store, name, "key").await?;
    let alg = match h.algorithm {
        HmacAlg::Sha1 => hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        HmacAlg::Sha256 => hmac::HMAC_SHA256,
        HmacAlg::Sha512 => hmac::HMAC_SHA512,
    };
    let tag = hmac::sign(&hmac::Key::new(alg, key.expose()), &message);
    let signature = match h.encoding {
        Encoding::Hex => hex::encode(tag.as_ref()),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(tag.as_ref()),
    };
    for (header, parts) in &h.headers {
        let mut value = String::new();
        for p in parts {
            match p {
                Part::Lit(l) => value.push_str(l),
                Part::Timestamp => value.push_str(&timestamp),
                Part::Signature => value.push_str(&signature),
                _ => {}
            }
        }
        let mut hv = HeaderValue::from_str(&value)
            .map_err(|_| failed(name, format!("headers.{header} is not valid in a header")))?;
        hv.set_sensitive(true);
        headers.insert(header.clone(), hv);
    }
    Ok(())
}

/// The bytes signed.
fn message(
    h: &Hmac,
    t: &Target<'_>,
    headers: &HeaderMap,
    path_and_query: &str,
    body: &[u8],
    timestamp: &str,
) -> Vec<u8> {
    let mut out = Vec::new();
    for p in &h.message {
        match p {
            Part::Lit(l) => out.extend_from_slice(l.as_bytes()),
            Part::Method => out.extend_from_slice(t.method.as_bytes()),
            Part::Path => out.extend_from_slice(path_and_query.as_bytes()),
            Part::Host => out.extend_from_slice(t.host.as_bytes()),
            Part::Timestamp => out.extend_from_slice(timestamp.as_bytes()),
            Part::Body => out.extend_from_slice(body),
            Part::BodySha256 => out.extend_from_slice(
                hex::encode(digest::digest(&digest::SHA256, body).as_ref()).as_bytes(),
            ),
            Part::Header(n) => {
                if let Some(v) = headers.get(n) {
                    out.extend_from_slice(v.as_bytes());
                }
            }
            Part::Signature => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target<'static> {
        Target {
            method: "POST",
            scheme: "https",
            host: "api.test",
            port: 443,
            identity: "",
        }
    }

    #[test]
    fn templates_name_what_they_may_use() {
        let parts =
            parse_template("{{method}}\n{{path}}\n{{header.x-foo}}", Use::Message).expect("parse");
        assert_eq!(parts.len(), 5);
        let e = parse_template("{{signature}}", Use::Message).expect_err("message");
        assert!(e.contains("{{method}}"), "{e}");
        let e = parse_template("{{path}}", Use::Header).expect_err("header");
        assert!(e.contains("{{signature}}"), "{e}");
        assert!(parse_template("{{method", Use::Message).is_err());
        assert!(parse_template("t={{timestamp}},v1={{signature}}", Use::Header).is_ok());
    }

    #[test]
    fn the_message_is_rendered_from_the_request() {
        let h = Hmac {
            algorithm: HmacAlg::Sha256,
            encoding: Encoding::Hex,
            message: parse_template(
                "{{method}} {{path}} {{host}} {{header.x-foo}} {{timestamp}}.{{body}}.{{body_sha256}}",
                Use::Message,
            )
            .expect("parse"),
            timestamp: Timestamp::Seconds,
            headers: Vec::new(),
            max_signed_body: 10,
        };
        let mut headers = HeaderMap::new();
        headers.insert("x-foo", HeaderValue::from_static("bar"));
        let m = message(&h, &target(), &headers, "/a?b=1", b"hi", "17");
        assert_eq!(
            String::from_utf8(m).expect("utf8"),
            format!(
                "POST /a?b=1 api.test bar 17.hi.{}",
                "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4"
            )
        );
        let rfc = Timestamp::Rfc3339.render(SystemTime::UNIX_EPOCH);
        assert_eq!(rfc, "1970-01-01T00:00:00Z");
    }
}

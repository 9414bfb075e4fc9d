//! The WebSocket handshake: the sandbox's checked and its half of the upgrade taken
//! ([`Handshake::take`]), the upgrade headers put back without extensions ([`Handshake::restore`]),
//! the upstream's `101` checked and the sandbox's built from it ([`Handshake::accept`]).

use base64::Engine as _;
use http::header::{HeaderName, HeaderValue, CONNECTION, UPGRADE};
use http::request::Parts;
use http::{HeaderMap, Method, Response, StatusCode, Version};
use hyper::upgrade::OnUpgrade;

use super::super::body;
use crate::reason::{Reason, Refusal};
use crate::upstream::Body;

const SEC_KEY: HeaderName = HeaderName::from_static("sec-websocket-key");
const SEC_VERSION: HeaderName = HeaderName::from_static("sec-websocket-version");
const SEC_ACCEPT: HeaderName = HeaderName::from_static("sec-websocket-accept");
const SEC_PROTOCOL: HeaderName = HeaderName::from_static("sec-websocket-protocol");
const SEC_EXTENSIONS: HeaderName = HeaderName::from_static("sec-websocket-extensions");

/// RFC 6455 §1.3: appended to the key before hashing into `Sec-WebSocket-Accept`.
const ACCEPT_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Whether the request asks to upgrade to a WebSocket: an `Upgrade` header naming `websocket`
/// (any case, anywhere in the list). Any other upgrade is hop-by-hop and simply stripped.
pub fn requested(headers: &HeaderMap) -> bool {
    headers
        .get_all(UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("websocket"))
}

/// The sandbox's side of a WebSocket handshake, from the request to the relay.
pub struct Handshake {
    key: HeaderValue,
    /// The subprotocols the sandbox offered (`Sec-WebSocket-Protocol`), as sent.
    protocols: Vec<HeaderValue>,
    sandbox: OnUpgrade,
}

impl Handshake {
    /// Checks the handshake the sandbox sent and takes its half of the upgrade.
    ///
    /// Guarantees: on `Ok`, the request is an HTTP/1.1 GET with a well-formed key and version
    /// 13 on a connection that can upgrade; on `Err`, a `bad_request` naming what is wrong.
    pub fn take(head: &mut Parts) -> Result<Self, Refusal> {
        let bad = |why: &str| {
            Refusal::new(
                Reason::BadRequest,
                format!("not a valid WebSocket handshake: {why}"),
            )
        };
        if head.method != Method::GET {
            return Err(bad("the handshake must be a GET"));
        }
        if head.version != Version::HTTP_11 {
            return Err(bad(
                "a WebSocket upgrades an HTTP/1.1 connection (offer http/1.1 in ALPN)",
            ));
        }
        let key = head
            .headers
            .get(SEC_KEY)
            .filter(|k| {
                base64::engine::general_purpose::STANDARD
                    .decode(k.as_bytes())
                    .is_ok_and(|d| d.len() == 16)
            })
            .cloned()
            .ok_or_else(|| bad("Sec-WebSocket-Key must be 16 bytes in base64"))?;
        if head.headers.get(SEC_VERSION).map(HeaderValue::as_bytes) != Some(b"13") {
            return Err(bad("Sec-WebSocket-Version must be 13"));
        }
        let protocols = head.headers.get_all(SEC_PROTOCOL).iter().cloned().collect();
        let sandbox = head
            .extensions
            .remove::<OnUpgrade>()
            .ok_or_else(|| bad("this connection cannot be upgraded"))?;
        Ok(Self {
            key,
            protocols,
            sandbox,
        })
    }

    /// Puts the handshake back on the upstream request after hop-by-hop stripping, without
    /// extensions: latchkey must read every message, so none is compressed.
    pub fn restore(&self, headers: &mut HeaderMap) {
        headers.remove(SEC_EXTENSIONS);
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(SEC_KEY, self.key.clone());
        headers.insert(SEC_VERSION, HeaderValue::from_static("13"));
        headers.remove(SEC_PROTOCOL);
        for p in &self.protocols {
            headers.append(SEC_PROTOCOL, p.clone());
        }
    }

    /// Checks the upstream's `101` and builds the one the sandbox gets: the upgrade headers,
    /// the accept key and the chosen subprotocol, nothing else.
    ///
    /// Guarantees: on `Ok`, the upstream accepted exactly this handshake (its accept key
    /// matches, it chose no extension, its subprotocol is one the sandbox offered) and both
    /// halves of the upgrade are in the returned [`Accepted`]; on `Err`, an `upstream_error`
    /// (or `uninspectable_body` for an extension) and nothing was sent to the sandbox.
    pub fn accept<B>(self, res: &mut Response<B>, host: &str) -> Result<Accepted, Refusal> {
        let fail = |reason: Reason, why: String| {
            Refusal::new(
                reason,
                format!("{host} answered the WebSocket handshake with {why}"),
            )
        };
        let headers = res.headers();
        if !requested(headers) {
            return Err(fail(
                Reason::UpstreamError,
                "101 without Upgrade: websocket".into(),
            ));
        }
        let expected = accept_key(self.key.as_bytes());
        if headers.get(SEC_ACCEPT).map(HeaderValue::as_bytes) != Some(expected.as_bytes()) {
            return Err(fail(
                Reason::UpstreamError,
                "a Sec-WebSocket-Accept that does not match the key".into(),
            ));
        }
        if let Some(ext) = headers.get(SEC_EXTENSIONS) {
            return Err(fail(
                Reason::UninspectableBody,
                format!(
                    "extension {:?}, which latchkey did not offer and cannot inspect",
                    String::from_utf8_lossy(ext.as_bytes())
                ),
            ));
        }
        let protocol = headers.get(SEC_PROTOCOL).cloned();
        if let Some(p) = &protocol {
            let offered = self
                .protocols
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .any(|o| o.trim().as_bytes() == p.as_bytes());
            if !offered {
                return Err(fail(
                    Reason::UpstreamError,
                    "a subprotocol the sandbox did not offer".into(),
                ));
            }
        }
        let upstream = res.extensions_mut().remove::<OnUpgrade>().ok_or_else(|| {
            fail(
                Reason::UpstreamError,
                "101 on a connection that cannot upgrade".into(),
            )
        })?;
        let mut answer = Response::new(body::empty());
        *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = answer.headers_mut();
        h.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        if let Ok(v) = HeaderValue::from_str(&expected) {
            h.insert(SEC_ACCEPT, v);
        }
        if let Some(p) = protocol {
            h.insert(SEC_PROTOCOL, p);
        }
        Ok(Accepted {
            response: answer,
            halves: Halves {
                sandbox: self.sandbox,
                upstream,
            },
        })
    }
}

/// An accepted handshake: the `101` for the sandbox and both halves of the upgrade.
pub struct Accepted {
    pub response: Response<Body>,
    pub halves: Halves,
}

/// Both halves of an upgrade, each ready once its `101` has gone out.
pub struct Halves {
    pub(super) sandbox: OnUpgrade,
    pub(super) upstream: OnUpgrade,
}

/// `Sec-WebSocket-Accept` for a key: base64(SHA-1(key ‖ GUID)).
fn accept_key(key: &[u8]) -> String {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(key);
    ctx.update(ACCEPT_GUID);
    base64::engine::general_purpose::STANDARD.encode(ctx.finish().as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_key_is_the_rfc_example() {
        // RFC 6455 §1.3.
        assert_eq!(
            accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn an_upgrade_is_a_websocket_only_when_it_names_one() {
        let mut h = HeaderMap::new();
        assert!(!requested(&h));
        h.insert(UPGRADE, HeaderValue::from_static("h2c"));
        assert!(!requested(&h));
        h.insert(UPGRADE, HeaderValue::from_static("foo, WebSocket"));
        assert!(requested(&h));
    }

    #[test]
    fn restore_puts_the_handshake_back_without_extensions() {
        let (mut head, ()) = http::Request::get("/ws")
            .header(SEC_KEY, "dGhlIHNhbXBsZSBub25jZQ==")
            .header(SEC_VERSION, "13")
            .header(SEC_PROTOCOL, "chat, superchat")
            .header(SEC_EXTENSIONS, "permessage-deflate")
            .body(())
            .expect("request")
            .into_parts();
        head.extensions.insert(hyper_on_upgrade_for_test());
        let hs = Handshake::take(&mut head).expect("valid handshake");
        let mut out = HeaderMap::new();
        out.insert(
            SEC_EXTENSIONS,
            HeaderValue::from_static("permessage-deflate"),
        );
        hs.restore(&mut out);
        assert!(!out.contains_key(SEC_EXTENSIONS));
        assert_eq!(out[UPGRADE], "websocket");
        assert_eq!(out[SEC_PROTOCOL], "chat, superchat");
        assert_eq!(out[SEC_KEY], "dGhlIHNhbXBsZSBub25jZQ==");
    }

    #[test]
    fn a_malformed_handshake_is_refused_naming_what_is_wrong() {
        let cases = [
            (Method::POST, "dGhlIHNhbXBsZSBub25jZQ==", "13", "GET"),
            (Method::GET, "c2hvcnQ=", "13", "16 bytes"),
            (Method::GET, "dGhlIHNhbXBsZSBub25jZQ==", "8", "13"),
        ];
        for (method, key, version, says) in cases {
            let (mut head, ()) = http::Request::builder()
                .method(method)
                .uri("/ws")
                .header(SEC_KEY, key)
                .header(SEC_VERSION, version)
                .body(())
                .expect("request")
                .into_parts();
            let refusal = Handshake::take(&mut head).err().expect("refused");
            assert_eq!(refusal.reason, Reason::BadRequest);
            assert!(refusal.message.contains(says), "{}", refusal.message);
        }
    }

    /// An `OnUpgrade` that never completes, for handshakes checked without a connection.
    fn hyper_on_upgrade_for_test() -> OnUpgrade {
        let mut req = http::Request::new(());
        hyper::upgrade::on(&mut req)
    }
}

//! Signed one-click links: the approve and deny buttons a chat notification carries. Each is a
//! URL on the admin listener (`/approvals/ID/answer?decision=…&scope=…&exp=…&sig=…`) whose
//! HMAC-SHA256 is the credential, so an approver needs no admin token to answer.
//!
//! The key lives in the state store (namespace `keys`, id `links`), created once by whichever
//! replica starts first ([`load_or_create_key`]), so every replica sharing the store signs and
//! verifies with the same key. The signed string is length-prefixed field by field, so no field
//! can be shifted into another; signatures are compared in constant time.
//!
//! Depends on `state` (the key, through `governance::approvals::shared_key`), `secrets` (a key
//! may be a [`SecretValue`]) and `governance::record`; never on `proxy` or `admin`, which call
//! it.

use std::time::{Duration, SystemTime};

use aws_lc_rs::hmac;
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

use super::record::{Approval, Links};
use crate::secrets::SecretValue;
use crate::state::{StateError, StateStore};

/// State-store id of the link key (namespace `keys`, beside the other shared keys).
pub const KEY_LINKS: &str = "links";

/// Domain separation: the first field of every signed string.
const CONTEXT: &str = "latchkey.approval-link.v1";
/// The first field of an interactive chat button's signed string (then the notifier's name).
const ACTION_CONTEXT: &str = "latchkey.chat-action.v1";

/// Characters escaped in the approval id's path segment (the id is latchkey's own, but a path
/// segment must never carry `/`, `?` or `#`).
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}');

/// Why a link does not answer an approval.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// Signed correctly, but its `exp` has passed.
    #[error("the link has expired")]
    Expired,
    /// The signature does not match the link's fields (tampered, or another key).
    #[error("the link's signature does not match")]
    BadSignature,
    /// A field is missing or not in its form.
    #[error("the link is malformed: {0}")]
    Malformed(String),
}

/// The parameters of a link's query string, as the admin listener receives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkParams {
    pub decision: String,
    pub scope: Option<String>,
    pub exp: String,
    pub sig: String,
}

impl LinkParams {
    /// Reads `decision`, `scope`, `exp` and `sig` from a query string; a repeated or missing
    /// parameter is [`LinkError::Malformed`].
    pub fn from_query(query: &str) -> Result<LinkParams, LinkError> {
        let (mut decision, mut scope, mut exp, mut sig) = (None, None, None, None);
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            let slot = match &*name {
                "decision" => &mut decision,
                "scope" => &mut scope,
                "exp" => &mut exp,
                "sig" => &mut sig,
                _ => continue,
            };
            if slot.replace(value.into_owned()).is_some() {
                return Err(LinkError::Malformed(format!("{name} given twice")));
            }
        }
        let need = |v: Option<String>, name: &str| {
            v.ok_or_else(|| LinkError::Malformed(format!("no {name}")))
        };
        Ok(LinkParams {
            decision: need(decision, "decision")?,
            scope,
            exp: need(exp, "exp")?,
            sig: need(sig, "sig")?,
        })
    }
}

/// Signs and verifies links with the store's link key. `Debug` prints no key.
#[derive(Clone)]
pub struct Signer {
    key: hmac::Key,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(<key redacted>)")
    }
}

impl Signer {
    /// A signer over a 32-byte key (from [`load_or_create_key`]).
    pub fn new(key: [u8; 32]) -> Signer {
        let key = zeroize::Zeroizing::new(key);
        Signer {
            key: hmac::Key::new(hmac::HMAC_SHA256, key.as_ref()),
        }
    }

    /// A signer over a key held as a secret value.
    pub fn from_secret(key: &SecretValue) -> Signer {
        Signer {
            key: hmac::Key::new(hmac::HMAC_SHA256, key.expose()),
        }
    }

    /// The link that answers approval `id` with `decision` (`approve` with a `scope`, or
    /// `deny`), valid until `expires` (whole seconds, rounded down).
    pub fn sign(
        &self,
        base: &url::Url,
        id: &str,
        decision: &str,
        scope: Option<&str>,
        expires: SystemTime,
    ) -> String {
        let exp = unix(expires).to_string();
        let sig = hex::encode(self.tag(id, decision, scope, &exp));
        let mut query = form_urlencoded::Serializer::new(String::new());
        query.append_pair("decision", decision);
        if let Some(scope) = scope {
            query.append_pair("scope", scope);
        }
        query.append_pair("exp", &exp).append_pair("sig", &sig);
        format!(
            "{}/approvals/{}/answer?{}",
            base_prefix(base),
            utf8_percent_encode(id, SEGMENT),
            query.finish()
        )
    }

    /// Checks a link's fields for approval `id` at `now`: the form first, then the signature
    /// (constant time), then the expiry, so only a genuine link is ever told it expired.
    pub fn verify(
        &self,
        id: &str,
        decision: &str,
        scope: Option<&str>,
        exp: &str,
        sig: &str,
        now: SystemTime,
    ) -> Result<(), LinkError> {
        self.check(&[CONTEXT], (id, decision, scope, exp), sig, now)
    }

    /// The expiry and signature of an interactive chat button's answer (`decision` and `scope`
    /// of approval `id`, through notifier `notifier` only, until `expires`). Signed under
    /// another context than links, so a button's value is never a working link (which would
    /// answer past a notifier's `approvers`).
    pub fn sign_action(
        &self,
        notifier: &str,
        id: &str,
        decision: &str,
        scope: Option<&str>,
        expires: SystemTime,
    ) -> (String, String) {
        let exp = unix(expires).to_string();
        let tag = hmac::sign(
            &self.key,
            &message(&[ACTION_CONTEXT, notifier], (id, decision, scope, &exp)),
        );
        (exp, hex::encode(tag))
    }

    /// Checks a button's answer as [`Signer::verify`] checks a link's, for `notifier`.
    pub fn verify_action(
        &self,
        notifier: &str,
        answer: SignedAnswer<'_>,
        now: SystemTime,
    ) -> Result<(), LinkError> {
        let SignedAnswer {
            id,
            decision,
            scope,
            exp,
            sig,
        } = answer;
        self.check(
            &[ACTION_CONTEXT, notifier],
            (id, decision, scope, exp),
            sig,
            now,
        )
    }

    fn check(
        &self,
        context: &[&str],
        fields: Fields<'_>,
        sig: &str,
        now: SystemTime,
    ) -> Result<(), LinkError> {
        let (id, decision, scope, exp) = fields;
        match (decision, scope) {
            ("approve", Some(s)) if !s.is_empty() => {}
            ("approve", _) => return Err(LinkError::Malformed("approve without a scope".into())),
            ("deny", None) => {}
            ("deny", Some(_)) => return Err(LinkError::Malformed("deny with a scope".into())),
            _ => {
                return Err(LinkError::Malformed(
                    "decision is not approve or deny".into(),
                ))
            }
        }
        if id.is_empty() {
            return Err(LinkError::Malformed("no approval id".into()));
        }
        let expires = exp
            .parse::<u64>()
            .ok()
            .filter(|_| exp.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| LinkError::Malformed("exp is not a UNIX time".into()))?;
        let tag = hex::decode(sig)
            .ok()
            .filter(|t| t.len() == 32)
            .ok_or_else(|| LinkError::Malformed("sig is not 64 hex digits".into()))?;
        hmac::verify(&self.key, &message(context, fields), &tag)
            .map_err(|_| LinkError::BadSignature)?;
        if unix(now) > expires {
            return Err(LinkError::Expired);
        }
        Ok(())
    }

    /// [`Signer::verify`] over the parameters of a query string.
    pub fn verify_params(
        &self,
        id: &str,
        params: &LinkParams,
        now: SystemTime,
    ) -> Result<(), LinkError> {
        self.verify(
            id,
            &params.decision,
            params.scope.as_deref(),
            &params.exp,
            &params.sig,
            now,
        )
    }

    fn tag(&self, id: &str, decision: &str, scope: Option<&str>, exp: &str) -> hmac::Tag {
        hmac::sign(&self.key, &message(&[CONTEXT], (id, decision, scope, exp)))
    }
}

/// The approve link for every scope the approval offers and the deny link, each valid until
/// the approval expires.
pub fn links_for(base: &url::Url, approval: &Approval, signer: &Signer) -> Links {
    let approve = approval
        .scopes
        .iter()
        .map(|scope| {
            let link = signer.sign(base, &approval.id, "approve", Some(scope), approval.expires);
            (scope.clone(), link)
        })
        .collect();
    Links {
        approve,
        deny: signer.sign(base, &approval.id, "deny", None, approval.expires),
    }
}

/// The link key shared by every replica on `store` (`keys`/`links`): created (32 random bytes)
/// by the first replica that needs it, then read back, so concurrent first starts agree on
/// the one that won.
pub async fn load_or_create_key(store: &dyn StateStore) -> Result<[u8; 32], StateError> {
    super::approvals::shared_key(store, KEY_LINKS).await
}

/// An answer as a button's value carries it: the fields [`Signer::sign_action`] signed, its
/// expiry and signature.
#[derive(Debug, Clone, Copy)]
pub struct SignedAnswer<'a> {
    pub id: &'a str,
    pub decision: &'a str,
    pub scope: Option<&'a str>,
    pub exp: &'a str,
    pub sig: &'a str,
}

/// The signed fields of an answer: approval id, decision, scope, expiry.
type Fields<'a> = (&'a str, &'a str, Option<&'a str>, &'a str);

/// The signed string: the context (for a button, its context and notifier) and each field
/// length-prefixed, so no two field lists give the same bytes.
fn message(context: &[&str], (id, decision, scope, exp): Fields<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    let scope = scope.map_or(String::from("-"), |s| format!("+{s}"));
    for field in context.iter().copied().chain([id, decision, &scope, exp]) {
        out.extend_from_slice(field.len().to_string().as_bytes());
        out.push(b':');
        out.extend_from_slice(field.as_bytes());
        out.push(b'\n');
    }
    out
}

/// The base URL without query, fragment or trailing slash: links go under its path.
fn base_prefix(base: &url::Url) -> String {
    let mut base = base.clone();
    base.set_query(None);
    base.set_fragment(None);
    base.as_str().trim_end_matches('/').to_string()
}

/// Whole seconds since the UNIX epoch (0 before it).
pub(crate) fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> Signer {
        Signer::new([7u8; 32])
    }

    fn base() -> url::Url {
        url::Url::parse("https://admin.example.test:3129/latchkey/").unwrap()
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// The query of a signed link, parsed back as the admin listener would.
    fn params(link: &str) -> LinkParams {
        let url = url::Url::parse(link).unwrap();
        LinkParams::from_query(url.query().unwrap()).unwrap()
    }

    #[test]
    fn a_link_has_the_documented_form_and_verifies() {
        let link = signer().sign(&base(), "ap_1", "approve", Some("1h"), at(1_800_000_000));
        let prefix = "https://admin.example.test:3129/latchkey/approvals/ap_1/answer?\
                      decision=approve&scope=1h&exp=1800000000&sig=";
        assert!(link.starts_with(prefix), "{link}");
        assert_eq!(link.len(), prefix.len() + 64);
        let p = params(&link);
        assert_eq!(p.scope.as_deref(), Some("1h"));
        signer()
            .verify_params("ap_1", &p, at(1_800_000_000))
            .unwrap();
        let deny = signer().sign(&base(), "ap_1", "deny", None, at(1_800_000_000));
        assert!(!deny.contains("scope="), "{deny}");
        signer()
            .verify_params("ap_1", &params(&deny), at(1_700_000_000))
            .unwrap();
    }

    #[test]
    fn every_tampered_field_is_a_bad_signature() {
        let s = signer();
        let link = s.sign(&base(), "ap_1", "approve", Some("once"), at(2_000));
        let p = params(&link);
        let now = at(1_000);
        let check = |id: &str, decision: &str, scope: Option<&str>, exp: &str| {
            s.verify(id, decision, scope, exp, &p.sig, now)
        };
        assert_eq!(check("ap_1", "approve", Some("once"), "2000"), Ok(()));
        assert_eq!(
            check("ap_2", "approve", Some("once"), "2000"),
            Err(LinkError::BadSignature)
        );
        assert_eq!(
            check("ap_1", "approve", Some("session"), "2000"),
            Err(LinkError::BadSignature)
        );
        assert_eq!(
            check("ap_1", "approve", Some("once"), "2001"),
            Err(LinkError::BadSignature)
        );
        // A link for deny does not approve, and the other way round.
        let deny = params(&s.sign(&base(), "ap_1", "deny", None, at(2_000)));
        assert_eq!(
            s.verify("ap_1", "approve", Some("once"), "2000", &deny.sig, now),
            Err(LinkError::BadSignature)
        );
        assert_eq!(
            s.verify("ap_1", "deny", None, "2000", &p.sig, now),
            Err(LinkError::BadSignature)
        );
        // Another key (another store) signs differently.
        assert_eq!(
            Signer::new([8u8; 32]).verify("ap_1", "approve", Some("once"), "2000", &p.sig, now),
            Err(LinkError::BadSignature)
        );
        // Upper-case hex of the right tag is the same tag.
        assert_eq!(
            s.verify(
                "ap_1",
                "approve",
                Some("once"),
                "2000",
                &p.sig.to_uppercase(),
                now
            ),
            Ok(())
        );
    }

    #[test]
    fn fields_cannot_be_shifted_into_one_another() {
        let m = |id, decision, scope, exp| message(&[CONTEXT], (id, decision, scope, exp));
        assert_ne!(
            m("a", "approve", Some("1h"), "10"),
            m("a\n", "approve", Some("1h"), "10")
        );
        assert_ne!(m("ab", "deny", None, "1"), m("a", "bdeny", None, "1"));
        assert_ne!(m("a", "deny", None, "1"), m("a", "deny", Some(""), "1"));
    }

    fn answer<'a>(
        id: &'a str,
        decision: &'a str,
        scope: Option<&'a str>,
        exp: &'a str,
        sig: &'a str,
    ) -> SignedAnswer<'a> {
        SignedAnswer {
            id,
            decision,
            scope,
            exp,
            sig,
        }
    }

    #[test]
    fn a_buttons_answer_is_bound_to_its_notifier_and_is_never_a_working_link() {
        let s = signer();
        let (exp, sig) = s.sign_action("chat", "ap_1", "approve", Some("1h"), at(2_000));
        assert_eq!(exp, "2000");
        let now = at(1_000);
        assert_eq!(
            s.verify_action(
                "chat",
                answer("ap_1", "approve", Some("1h"), &exp, &sig),
                now
            ),
            Ok(())
        );
        for (notifier, id, decision, scope) in [
            ("other", "ap_1", "approve", Some("1h")),
            ("chat", "ap_2", "approve", Some("1h")),
            ("chat", "ap_1", "approve", Some("once")),
        ] {
            assert_eq!(
                s.verify_action(notifier, answer(id, decision, scope, &exp, &sig), now),
                Err(LinkError::BadSignature)
            );
        }
        // The same fields as a link: refused, and a link's signature is no button's.
        assert_eq!(
            s.verify("ap_1", "approve", Some("1h"), &exp, &sig, now),
            Err(LinkError::BadSignature)
        );
        let link = params(&s.sign(&base(), "ap_1", "approve", Some("1h"), at(2_000)));
        assert_eq!(
            s.verify_action(
                "chat",
                answer("ap_1", "approve", Some("1h"), &exp, &link.sig),
                now
            ),
            Err(LinkError::BadSignature)
        );
        assert_eq!(
            s.verify_action(
                "chat",
                answer("ap_1", "approve", Some("1h"), &exp, &sig),
                at(2_001)
            ),
            Err(LinkError::Expired)
        );
        let other = Signer::new([8u8; 32]);
        assert_eq!(
            other.verify_action(
                "chat",
                answer("ap_1", "approve", Some("1h"), &exp, &sig),
                now
            ),
            Err(LinkError::BadSignature)
        );
    }

    #[test]
    fn an_expired_link_is_expired_only_when_genuine() {
        let s = signer();
        let p = params(&s.sign(&base(), "ap_1", "deny", None, at(5_000)));
        assert_eq!(s.verify_params("ap_1", &p, at(5_000)), Ok(()));
        assert_eq!(
            s.verify_params("ap_1", &p, at(5_001)),
            Err(LinkError::Expired)
        );
        let forged = LinkParams {
            sig: "00".repeat(32),
            ..p
        };
        assert_eq!(
            s.verify_params("ap_1", &forged, at(9_999)),
            Err(LinkError::BadSignature)
        );
    }

    #[test]
    fn malformed_links_are_refused_before_any_signature_check() {
        let s = signer();
        let good = params(&s.sign(&base(), "ap_1", "approve", Some("1h"), at(5_000)));
        let now = at(1_000);
        let malformed = |r: Result<(), LinkError>| matches!(r, Err(LinkError::Malformed(_)));
        assert!(malformed(
            s.verify("ap_1", "approve", None, "5000", &good.sig, now)
        ));
        assert!(malformed(s.verify(
            "ap_1",
            "deny",
            Some("1h"),
            "5000",
            &good.sig,
            now
        )));
        assert!(malformed(s.verify(
            "ap_1",
            "maybe",
            Some("1h"),
            "5000",
            &good.sig,
            now
        )));
        assert!(malformed(s.verify(
            "",
            "approve",
            Some("1h"),
            "5000",
            &good.sig,
            now
        )));
        assert!(malformed(s.verify(
            "ap_1",
            "approve",
            Some("1h"),
            "+5000",
            &good.sig,
            now
        )));
        assert!(malformed(s.verify(
            "ap_1",
            "approve",
            Some("1h"),
            "soon",
            &good.sig,
            now
        )));
        assert!(malformed(s.verify(
            "ap_1",
            "approve",
            Some("1h"),
            "5000",
            "abc",
            now
        )));
        assert!(malformed(s.verify(
            "ap_1",
            "approve",
            Some("1h"),
            "5000",
            &"zz".repeat(32),
            now
        )));
        assert!(malformed(s.verify(
            "ap_1",
            "approve",
            Some("1h"),
            "5000",
            &"ab".repeat(31),
            now
        )));
        for query in [
            "scope=1h&exp=1&sig=00",
            "decision=deny&sig=00",
            "decision=deny&exp=1",
            "decision=deny&decision=approve&exp=1&sig=00",
        ] {
            assert!(
                matches!(LinkParams::from_query(query), Err(LinkError::Malformed(_))),
                "{query}"
            );
        }
    }

    #[test]
    fn links_for_an_approval_cover_every_scope_and_expire_with_it() {
        let approval: Approval = serde_json::from_value(serde_json::json!({
            "id": "ap_9", "state": "pending", "created": "2027-01-15T08:00:00.000Z",
            "expires": "2027-01-15T09:00:00.000Z", "identity": "agent", "labels": {},
            "client": "10.0.0.1:1", "method": "POST", "url": "https://h.test/", "scheme": "https",
            "host": "h.test", "port": 443, "path": "/", "rule": "r", "denial": null,
            "message": null, "scopes": ["once", "1h", "session"], "body_bytes": 0,
            "body_sha256": "", "preview": null, "request_id": "x", "policy": "p", "answer": null
        }))
        .unwrap();
        let s = signer();
        let links = links_for(&base(), &approval, &s);
        assert_eq!(
            links.approve.keys().collect::<Vec<_>>(),
            ["1h", "once", "session"]
        );
        let exp = unix(approval.expires);
        for (scope, link) in &links.approve {
            let p = params(link);
            assert_eq!(p.scope.as_deref(), Some(scope.as_str()));
            assert_eq!(p.exp, exp.to_string());
            s.verify_params("ap_9", &p, approval.expires).unwrap();
            assert_eq!(
                s.verify_params("ap_9", &p, approval.expires + Duration::from_secs(1)),
                Err(LinkError::Expired)
            );
        }
        s.verify_params("ap_9", &params(&links.deny), approval.created)
            .unwrap();
    }

    #[test]
    fn debug_prints_no_key() {
        let printed = format!("{:?}", Signer::new([0x41; 32]));
        assert_eq!(printed, "Signer(<key redacted>)");
    }

    #[test]
    fn ids_are_escaped_in_the_path() {
        let link = signer().sign(&base(), "a/b?c", "deny", None, at(1));
        assert!(link.contains("/approvals/a%2Fb%3Fc/answer?"), "{link}");
    }
}

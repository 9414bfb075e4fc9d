//! Tests of workload-token verification: real keys (generated here with aws-lc-rs), real
//! signatures (jsonwebtoken `encode`, or by hand where the header must be one `encode` cannot
//! write), and every refusal the module promises.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::{KeyPair as RsaKeyPair, KeySize, PublicKeyComponents};
use aws_lc_rs::signature::{
    EcdsaKeyPair, Ed25519KeyPair, KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING, RSA_PKCS1_SHA256,
};
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;

const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
const AUDIENCE: &str = "latchkey";

/// The fixed "now" of every test: 2023-11-14T22:13:20Z.
fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW)
}
const NOW: u64 = 1_700_000_000;

fn expect() -> Expect<'static> {
    Expect {
        issuer: ISSUER,
        audience: AUDIENCE,
        leeway: Duration::from_secs(60),
    }
}

/// One key pair of each type, generated once per test binary.
struct Keys {
    rsa: RsaKeyPair,
    /// The RSA private key as PKCS#1 `RSAPrivateKey` (what `EncodingKey::from_rsa_der` reads).
    rsa_pkcs1: Vec<u8>,
    ec_pkcs8: Vec<u8>,
    ec_public: Vec<u8>,
    ed_pkcs8: Vec<u8>,
    ed_public: Vec<u8>,
    /// A second EC key the JWKS does not hold (the attacker's).
    other_ec_pkcs8: Vec<u8>,
    other_ec_public: Vec<u8>,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let rng = SystemRandom::new();
        let rsa = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
        let rsa_pkcs1 = pkcs1_from_pkcs8(
            AsDer::<aws_lc_rs::encoding::Pkcs8V1Der>::as_der(&rsa)
                .unwrap()
                .as_ref(),
        );
        let ec = |_: ()| {
            let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
            let pair =
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref()).unwrap();
            (doc.as_ref().to_vec(), pair.public_key().as_ref().to_vec())
        };
        let (ec_pkcs8, ec_public) = ec(());
        let (other_ec_pkcs8, other_ec_public) = ec(());
        let ed_doc = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let ed_public = Ed25519KeyPair::from_pkcs8(ed_doc.as_ref())
            .unwrap()
            .public_key()
            .as_ref()
            .to_vec();
        Keys {
            rsa,
            rsa_pkcs1,
            ec_pkcs8,
            ec_public,
            ed_pkcs8: ed_doc.as_ref().to_vec(),
            ed_public,
            other_ec_pkcs8,
            other_ec_public,
        }
    })
}

/// One DER TLV: (tag, contents, rest).
fn tlv(input: &[u8]) -> (u8, &[u8], &[u8]) {
    let (len, header) = if input[1] < 0x80 {
        (usize::from(input[1]), 2)
    } else {
        let n = usize::from(input[1] & 0x7f);
        let len = input[2..2 + n]
            .iter()
            .fold(0usize, |acc, b| acc << 8 | usize::from(*b));
        (len, 2 + n)
    };
    (
        input[0],
        &input[header..header + len],
        &input[header + len..],
    )
}

/// The `RSAPrivateKey` inside a PKCS#8 `PrivateKeyInfo` (version, algorithm, OCTET STRING).
fn pkcs1_from_pkcs8(pkcs8: &[u8]) -> Vec<u8> {
    let (_, info, _) = tlv(pkcs8);
    let (_, _, rest) = tlv(info); // version
    let (_, _, rest) = tlv(rest); // algorithm
    let (tag, key, _) = tlv(rest);
    assert_eq!(tag, 0x04, "PKCS#8 private key is an OCTET STRING");
    key.to_vec()
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn rsa_jwk(kid: &str) -> Value {
    let public = PublicKeyComponents::<Vec<u8>>::from(keys().rsa.public_key());
    json!({"kty": "RSA", "use": "sig", "kid": kid, "n": b64(&public.n), "e": b64(&public.e)})
}

fn ec_jwk(kid: &str, public: &[u8]) -> Value {
    json!({"kty": "EC", "crv": "P-256", "kid": kid, "x": b64(&public[1..33]), "y": b64(&public[33..65])})
}

fn ed_jwk(kid: &str) -> Value {
    json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": b64(&keys().ed_public)})
}

/// The JWKS of the three keys: `rsa-1`, `ec-1`, `ed-1`.
fn jwks() -> Jwks {
    let doc =
        json!({"keys": [rsa_jwk("rsa-1"), ec_jwk("ec-1", &keys().ec_public), ed_jwk("ed-1")]});
    Jwks::parse(doc.to_string().as_bytes()).unwrap()
}

/// A Kubernetes-style projected service-account token's claims.
fn claims() -> Value {
    json!({
        "iss": ISSUER,
        "aud": ["https://kubernetes.default.svc", AUDIENCE],
        "sub": "system:serviceaccount:builds:builder",
        "exp": NOW + 600,
        "iat": NOW - 10,
        "nbf": NOW - 10,
        "kubernetes.io": {
            "namespace": "builds",
            "pod": {"name": "builder-7f9c", "uid": "0b6c"},
            "serviceaccount": {"name": "builder", "uid": "5e1d"},
            "warnafter": NOW + 300
        },
        "admin": false
    })
}

fn claims_with(field: &str, value: Value) -> Value {
    let mut claims = claims();
    claims[field] = value;
    claims
}

fn claims_without(field: &str) -> Value {
    let mut claims = claims();
    claims.as_object_mut().unwrap().remove(field);
    claims
}

fn encoding_key(alg: Algorithm) -> EncodingKey {
    match alg {
        Algorithm::ES256 => EncodingKey::from_ec_der(&keys().ec_pkcs8),
        Algorithm::EdDSA => EncodingKey::from_ed_der(&keys().ed_pkcs8),
        _ => EncodingKey::from_rsa_der(&keys().rsa_pkcs1),
    }
}

/// A token signed by jsonwebtoken with the key of `alg`'s type.
fn sign(alg: Algorithm, kid: Option<&str>, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    encode(&header, claims, &encoding_key(alg)).unwrap()
}

/// A token with exactly this header JSON, RS256-signed by hand with the RSA key.
fn sign_raw(header: &str, claims: &Value) -> String {
    let message = format!(
        "{}.{}",
        b64(header.as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let rsa = &keys().rsa;
    let mut signature = vec![0; rsa.public_modulus_len()];
    rsa.sign(
        &RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        message.as_bytes(),
        &mut signature,
    )
    .unwrap();
    format!("{message}.{}", b64(&signature))
}

fn refused(token: &str) -> AttestError {
    refused_by(token, &jwks())
}

fn refused_by(token: &str, jwks: &Jwks) -> AttestError {
    let err = verify(token, jwks, &expect(), now()).unwrap_err();
    assert_no_token_text(&err, token);
    err
}

/// The error's Display and Debug carry neither the token nor any of its segments.
fn assert_no_token_text(err: &AttestError, token: &str) {
    for shown in [err.to_string(), format!("{err:?}")] {
        if !token.is_empty() {
            assert!(!shown.contains(token), "{shown}");
        }
        for segment in token.split('.').filter(|s| s.len() >= 8) {
            assert!(!shown.contains(segment), "{shown} shows a token segment");
        }
    }
}

#[test]
fn rs256_token_is_accepted_and_claims_read() {
    let token = sign(Algorithm::RS256, Some("rsa-1"), &claims());
    let claims = verify(&token, &jwks(), &expect(), now()).unwrap();
    assert_eq!(
        claims.subject(),
        Some("system:serviceaccount:builds:builder")
    );
    assert_eq!(claims.expires_at(), now() + Duration::from_secs(600));
    assert_eq!(
        claims.get("kubernetes.io.namespace").as_deref(),
        Some("builds")
    );
    assert_eq!(
        claims.get("kubernetes.io.serviceaccount.name").as_deref(),
        Some("builder")
    );
    assert_eq!(claims.get("kubernetes.io.pod.uid").as_deref(), Some("0b6c"));
    assert_eq!(
        claims.get("kubernetes.io.warnafter"),
        Some((NOW + 300).to_string())
    );
    assert_eq!(claims.get("admin").as_deref(), Some("false"));
    assert_eq!(claims.get("iss").as_deref(), Some(ISSUER));
    // Objects, arrays and missing paths are not values.
    assert_eq!(claims.get("kubernetes.io"), None);
    assert_eq!(claims.get("kubernetes.io.pod"), None);
    assert_eq!(claims.get("aud"), None);
    assert_eq!(claims.get("kubernetes.io.nope"), None);
    assert_eq!(claims.get("kubernetes"), None);
    assert_eq!(claims.get("sub.x"), None);
    assert_eq!(claims.get(""), None);
}

#[test]
fn es256_eddsa_and_other_rsa_algorithms_are_accepted() {
    let jwks = jwks();
    for (alg, kid) in [
        (Algorithm::ES256, "ec-1"),
        (Algorithm::EdDSA, "ed-1"),
        (Algorithm::RS384, "rsa-1"),
        (Algorithm::RS512, "rsa-1"),
        (Algorithm::PS256, "rsa-1"),
        (Algorithm::PS512, "rsa-1"),
    ] {
        let token = sign(alg, Some(kid), &claims());
        let claims =
            verify(&token, &jwks, &expect(), now()).unwrap_or_else(|e| panic!("{alg:?}: {e}"));
        assert_eq!(
            claims.get("kubernetes.io.namespace").as_deref(),
            Some("builds")
        );
    }
}

#[test]
fn claim_paths_take_the_longest_key_at_each_level() {
    let token = sign(
        Algorithm::ES256,
        Some("ec-1"),
        &json!({
            "iss": ISSUER, "aud": AUDIENCE, "exp": NOW + 60,
            "a.b": 1, "a": {"b": 2, "c": {"d.e": "deep"}},
            "x.y": {"q": 1}, "x": {"y": {"z": 2}},
            "n": 1.5, "neg": -3, "nul": null, "unicode.é": {"ü": "ok"}
        }),
    );
    let claims = verify(&token, &jwks(), &expect(), now()).unwrap();
    assert_eq!(claims.get("a.b").as_deref(), Some("1"));
    assert_eq!(claims.get("a.c.d.e").as_deref(), Some("deep"));
    // Greedy, no backtracking: "x.y" is taken, and it has no "z".
    assert_eq!(claims.get("x.y.z"), None);
    assert_eq!(claims.get("x.y.q").as_deref(), Some("1"));
    assert_eq!(claims.get("n").as_deref(), Some("1.5"));
    assert_eq!(claims.get("neg").as_deref(), Some("-3"));
    assert_eq!(claims.get("nul"), None);
    assert_eq!(claims.get("unicode.é.ü").as_deref(), Some("ok"));
    assert_eq!(claims.get("a..b"), None);
    assert_eq!(claims.get("."), None);
    // A string audience is accepted as well as an array.
    assert_eq!(claims.get("aud").as_deref(), Some(AUDIENCE));
}

#[test]
fn audience_must_be_included() {
    let wrong = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("aud", json!("someone-else")),
    );
    let err = refused(&wrong);
    assert_eq!(err.code(), "wrong_audience");
    assert!(err.to_string().contains(AUDIENCE), "{err}");
    let array = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("aud", json!(["a", "b"])),
    );
    assert_eq!(refused(&array).code(), "wrong_audience");
    let empty = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("aud", json!([])),
    );
    assert_eq!(refused(&empty).code(), "wrong_audience");
    // A prefix or a differently-cased audience is not the audience.
    let prefix = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("aud", json!("latchkey2")),
    );
    assert_eq!(refused(&prefix).code(), "wrong_audience");
    let case = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("aud", json!("Latchkey")),
    );
    assert_eq!(refused(&case).code(), "wrong_audience");
    let mixed = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("aud", json!([AUDIENCE, 7])),
    );
    assert_eq!(refused(&mixed).code(), "invalid_claim");
    let number = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("aud", json!(7)),
    );
    assert_eq!(refused(&number).code(), "invalid_claim");
    let missing = sign(Algorithm::RS256, Some("rsa-1"), &claims_without("aud"));
    assert_eq!(refused(&missing), AttestError::MissingClaim("aud"));
}

#[test]
fn issuer_must_match_exactly() {
    for iss in [
        json!("https://evil.example"),
        json!(format!("{ISSUER}/")),
        json!([ISSUER]),
        json!(null),
    ] {
        let token = sign(Algorithm::RS256, Some("rsa-1"), &claims_with("iss", iss));
        let err = refused(&token);
        assert_eq!(err.code(), "wrong_issuer");
        assert!(err.to_string().contains(ISSUER), "{err}");
        assert!(!err.to_string().contains("evil"), "{err}");
    }
    let missing = sign(Algorithm::RS256, Some("rsa-1"), &claims_without("iss"));
    assert_eq!(refused(&missing), AttestError::MissingClaim("iss"));
}

#[test]
fn expiry_is_checked_against_now_with_leeway() {
    let expired = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("exp", json!(NOW - 120)),
    );
    assert_eq!(refused(&expired), AttestError::Expired { exp: NOW - 120 });
    // Within the 60 s leeway: accepted.
    let skewed = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("exp", json!(NOW - 30)),
    );
    verify(&skewed, &jwks(), &expect(), now()).unwrap();
    // With no leeway, exp == now is expired, exp == now + 1 is not.
    let strict = Expect {
        leeway: Duration::ZERO,
        ..expect()
    };
    let at_now = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("exp", json!(NOW)),
    );
    assert_eq!(
        verify(&at_now, &jwks(), &strict, now()).unwrap_err().code(),
        "expired"
    );
    let next = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("exp", json!(NOW + 1)),
    );
    verify(&next, &jwks(), &strict, now()).unwrap();
    // The caller's clock decides, not the system's: the same token is fine an hour earlier.
    let hour_ago = now() - Duration::from_secs(3600);
    let claims = claims_with("exp", json!(NOW - 120));
    let mut claims = claims;
    claims["iat"] = json!(NOW - 4000);
    claims["nbf"] = json!(NOW - 4000);
    let token = sign(Algorithm::RS256, Some("rsa-1"), &claims);
    verify(&token, &jwks(), &expect(), hour_ago).unwrap();
    // A fractional exp is a valid NumericDate.
    let fractional = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("exp", json!(NOW as f64 + 600.5)),
    );
    verify(&fractional, &jwks(), &expect(), now()).unwrap();
}

#[test]
fn exp_is_required_and_must_be_a_number() {
    let missing = sign(Algorithm::RS256, Some("rsa-1"), &claims_without("exp"));
    assert_eq!(refused(&missing), AttestError::MissingClaim("exp"));
    assert_eq!(refused(&missing).code(), "missing_claim");
    for exp in [
        json!("1700000600"),
        json!(-5),
        json!(null),
        json!(1e300),
        json!(u64::MAX),
    ] {
        let token = sign(
            Algorithm::RS256,
            Some("rsa-1"),
            &claims_with("exp", exp.clone()),
        );
        assert_eq!(refused(&token), AttestError::InvalidClaim("exp"), "{exp}");
    }
    // An object exp already fails jsonwebtoken's own payload decoding: refused as malformed.
    let object = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("exp", json!({"a": 1})),
    );
    assert_eq!(refused(&object).code(), "malformed");
}

#[test]
fn nbf_and_iat_in_the_future_are_refused() {
    let early = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("nbf", json!(NOW + 300)),
    );
    assert_eq!(
        refused(&early),
        AttestError::NotYetValid {
            claim: "nbf",
            at: NOW + 300
        }
    );
    let skewed = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("nbf", json!(NOW + 30)),
    );
    verify(&skewed, &jwks(), &expect(), now()).unwrap();
    let issued = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("iat", json!(NOW + 300)),
    );
    assert_eq!(refused(&issued).code(), "not_yet_valid");
    let bad = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &claims_with("nbf", json!("soon")),
    );
    assert_eq!(refused(&bad), AttestError::InvalidClaim("nbf"));
    // Both are optional.
    let mut claims = claims_without("nbf");
    claims.as_object_mut().unwrap().remove("iat");
    verify(
        &sign(Algorithm::RS256, Some("rsa-1"), &claims),
        &jwks(),
        &expect(),
        now(),
    )
    .unwrap();
}

#[test]
fn kid_selects_the_key() {
    let unknown = sign(Algorithm::RS256, Some("rsa-2"), &claims());
    let err = refused(&unknown);
    assert_eq!(
        err,
        AttestError::UnknownKey {
            kid: "\"rsa-2\"".into()
        }
    );
    assert_eq!(err.code(), "unknown_key");
    // Three keys: a token must say which.
    let no_kid = sign(Algorithm::RS256, None, &claims());
    assert_eq!(refused(&no_kid), AttestError::KidRequired { keys: 3 });
    assert_eq!(refused(&no_kid).code(), "unknown_key");
    // One key: a missing kid uses it; a wrong kid is still unknown.
    let one = Jwks::parse(json!({"keys": [rsa_jwk("rsa-1")]}).to_string().as_bytes()).unwrap();
    verify(&no_kid, &one, &expect(), now()).unwrap();
    assert_eq!(refused_by(&unknown, &one).code(), "unknown_key");
    // A hostile kid is described, not echoed.
    let odd = sign(Algorithm::RS256, Some("a\nb<script>"), &claims());
    let err = refused(&odd);
    assert!(!err.to_string().contains("script"), "{err}");
    assert!(!err.to_string().contains('\n'), "{err}");
}

/// A JWKS built once for the property tests (RSA key generation is slow-ish).
fn shared_jwks() -> &'static Jwks {
    static SET: OnceLock<Jwks> = OnceLock::new();
    SET.get_or_init(jwks)
}

proptest! {
    #[test]
    fn random_strings_never_verify(token in any::<String>()) {
        prop_assert!(verify(&token, shared_jwks(), &expect(), now()).is_err());
    }

    #[test]
    fn random_jwt_shaped_strings_never_verify(token in "[A-Za-z0-9_.=+/-]{0,400}") {
        prop_assert!(verify(&token, shared_jwks(), &expect(), now()).is_err());
    }

    #[test]
    fn random_base64url_segments_never_verify(
        header in proptest::collection::vec(any::<u8>(), 0..200),
        payload in proptest::collection::vec(any::<u8>(), 0..400),
        signature in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let token = format!("{}.{}.{}", b64(&header), b64(&payload), b64(&signature));
        let result = verify(&token, shared_jwks(), &expect(), now());
        prop_assert!(result.is_err());
        if let Err(err) = result {
            prop_assert!(!err.to_string().contains(&token));
        }
    }

    #[test]
    fn a_real_header_with_garbage_never_verifies(
        kid in prop_oneof![Just("rsa-1"), Just("ec-1"), Just("ed-1")],
        alg in prop_oneof![Just("RS256"), Just("PS384"), Just("ES256"), Just("EdDSA"), Just("HS256"), Just("none")],
        payload in proptest::collection::vec(any::<u8>(), 0..400),
        signature in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let header = json!({"alg": alg, "kid": kid}).to_string();
        let token = format!("{}.{}.{}", b64(header.as_bytes()), b64(&payload), b64(&signature));
        prop_assert!(verify(&token, shared_jwks(), &expect(), now()).is_err());
        // And with a real payload: only the signature is garbage.
        let token = format!(
            "{}.{}.{}", b64(header.as_bytes()), b64(claims().to_string().as_bytes()), b64(&signature)
        );
        prop_assert!(verify(&token, shared_jwks(), &expect(), now()).is_err());
    }
}

#[path = "attest_refusal_tests.rs"]
mod refusals;

#[path = "attest_jwks_tests.rs"]
mod jwks_cache;

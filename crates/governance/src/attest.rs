//! Workload-token attestation: a sandbox proves who it is by presenting a signed token (a
//! Kubernetes projected service-account token, a SPIFFE JWT-SVID, any OIDC issuer's ID token)
//! instead of carrying a secret. [`verify`] checks the token against the issuer's JWKS
//! ([`Jwks`]), checks issuer, audience and time against [`Expect`] and a clock the caller passes
//! in, and hands back the [`Claims`], which the caller maps to labels with [`Claims::get`].
//! [`JwksCache`] keeps a fetched JWKS fresh without knowing how it is fetched.
//!
//! This is a security boundary, so everything fails closed: an algorithm is accepted only from
//! the asymmetric allow-list *and* only when the selected key's type matches it (no `none`, no
//! HMAC, so no "HS256 signed with the public key" confusion); a header's `jwk`, `jku`, `x5u` or
//! `x5c` is never used as a key; a `crit` header is refused. Nothing here panics on input, and
//! no error message carries the token or any part of it but a sanitised `kid` (see
//! [`AttestError`]).
//!
//! Signature and algorithm are checked by `jsonwebtoken` (on aws-lc-rs); the header is also
//! read here first (to refuse `alg`/`crit` before any key is chosen), and `iss`, `aud`, `exp`,
//! `nbf` and `iat` are checked here against the caller's `now`, never the system clock.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

/// The largest token [`verify`] reads, in bytes; a longer one is refused unread.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// The largest JWKS document [`Jwks::parse`] reads, in bytes.
pub const MAX_JWKS_BYTES: usize = 256 * 1024;
/// The most entries a JWKS document's `keys` array may have.
pub const MAX_JWKS_KEYS: usize = 64;

/// The longest `kid` an error message shows; a longer one (or one with characters outside
/// [`kid_shown`]'s set) is described, not shown.
const MAX_SHOWN_KID: usize = 128;
/// The longest fetch error [`JwksCache`] keeps (a caller's message, not ours).
const MAX_FETCH_ERROR: usize = 200;

/// RSA keys verify any RSA algorithm (unless the JWK's `alg` narrows it to one).
const RSA_ALGORITHMS: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];

/// Why a token (or a JWKS) was refused. Each variant displays as a short sentence naming the
/// problem: the claim, the algorithm, the expected issuer or audience, the key's id (sanitised:
/// at most 128 characters from a conservative set, else described instead of shown). No
/// message ever contains the token, its header, payload or signature segment, or any claim
/// value from it; `exp`/`nbf`/`iat` are shown as numbers only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttestError {
    /// The token is over [`MAX_TOKEN_BYTES`].
    #[error("token is larger than {limit} bytes")]
    TooLarge { limit: usize },
    /// The token is not a compact JWS with a JSON-object header and payload.
    #[error("token is malformed: {0}")]
    Malformed(&'static str),
    /// The header's `alg` is not on the allow-list (`none`, HS*, anything unknown).
    #[error("algorithm {alg} is not allowed")]
    AlgorithmNotAllowed { alg: &'static str },
    /// The header's `alg` is allowed, but not with the key the `kid` selects.
    #[error("key {kid} does not allow algorithm {alg}")]
    KeyAlgorithmMismatch { kid: String, alg: &'static str },
    /// The header has `crit`: no critical extension is understood, so none is accepted.
    #[error("token header has crit; no critical extension is supported")]
    CriticalHeader,
    /// The `kid` is not in the JWKS.
    #[error("no key {kid} in the JWKS")]
    UnknownKey { kid: String },
    /// The token names no `kid` and the JWKS has more than one key.
    #[error("token has no kid and the JWKS has {keys} keys")]
    KidRequired { keys: usize },
    /// The signature does not verify with the selected key.
    #[error("signature does not verify with key {kid}")]
    BadSignature { kid: String },
    /// `iss` is not the expected issuer.
    #[error("iss is not the expected issuer {expected:?}")]
    WrongIssuer { expected: String },
    /// `aud` (a string or an array of strings) does not contain the expected audience.
    #[error("aud does not include the expected audience {expected:?}")]
    WrongAudience { expected: String },
    /// `exp` is past, beyond the allowed clock skew.
    #[error("token expired at {exp} (unix seconds), beyond the allowed clock skew")]
    Expired { exp: u64 },
    /// `nbf` (or `iat`) is in the future, beyond the allowed clock skew.
    #[error("token {claim} is {at} (unix seconds), in the future beyond the allowed clock skew")]
    NotYetValid { claim: &'static str, at: u64 },
    /// A required claim (`exp`, `iss`, `aud`) is absent.
    #[error("token has no {0} claim")]
    MissingClaim(&'static str),
    /// A claim has the wrong type or an unrepresentable value (`exp` not a non-negative number).
    #[error("token claim {0} has the wrong type or an invalid value")]
    InvalidClaim(&'static str),
    /// The JWKS could not be parsed, fetched, or is too stale to use.
    #[error("JWKS: {0}")]
    Jwks(String),
}

impl AttestError {
    /// A stable, machine-readable name for the kind of failure (for metrics and audit
    /// records): one of `too_large`, `malformed`, `algorithm_not_allowed`, `critical_header`,
    /// `unknown_key`, `bad_signature`, `wrong_issuer`, `wrong_audience`, `expired`,
    /// `not_yet_valid`, `missing_claim`, `invalid_claim`, `jwks`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "too_large",
            Self::Malformed(_) => "malformed",
            Self::AlgorithmNotAllowed { .. } | Self::KeyAlgorithmMismatch { .. } => {
                "algorithm_not_allowed"
            }
            Self::CriticalHeader => "critical_header",
            Self::UnknownKey { .. } | Self::KidRequired { .. } => "unknown_key",
            Self::BadSignature { .. } => "bad_signature",
            Self::WrongIssuer { .. } => "wrong_issuer",
            Self::WrongAudience { .. } => "wrong_audience",
            Self::Expired { .. } => "expired",
            Self::NotYetValid { .. } => "not_yet_valid",
            Self::MissingClaim(_) => "missing_claim",
            Self::InvalidClaim(_) => "invalid_claim",
            Self::Jwks(_) => "jwks",
        }
    }
}

/// One usable verification key.
struct Key {
    kid: Option<String>,
    /// The algorithms this key verifies: its type's family, or the one its JWK `alg` names.
    algorithms: &'static [Algorithm],
    key: DecodingKey,
}

/// A parsed JWKS: only signing keys usable with an asymmetric algorithm (RSA of 2048 to 8192
/// bits, EC P-256 or P-384, OKP Ed25519), each with the algorithms it may verify. Never empty.
pub struct Jwks {
    keys: Vec<Key>,
}

impl fmt::Debug for Jwks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|k| (k.kid.as_deref(), k.algorithms)))
            .finish()
    }
}

impl Jwks {
    /// Parses a JWKS document (`{"keys": [...]}`). Keys with `use` other than `sig` (or
    /// `key_ops` without `verify`), symmetric keys (`kty: oct`), unsupported key types and
    /// curves, RSA moduli outside 2048..=8192 bits, EC/OKP coordinates of the wrong length, and
    /// keys whose `alg` is not an allowed algorithm for their type are skipped; a document with
    /// no usable key is an error, as are more than [`MAX_JWKS_KEYS`] entries or more than
    /// [`MAX_JWKS_BYTES`] of input.
    pub fn parse(bytes: &[u8]) -> Result<Jwks, AttestError> {
        if bytes.len() > MAX_JWKS_BYTES {
            return Err(jwks_error("document is larger than 256 KiB"));
        }
        let document: Value =
            serde_json::from_slice(bytes).map_err(|_| jwks_error("document is not JSON"))?;
        let entries = document
            .get("keys")
            .and_then(Value::as_array)
            .ok_or_else(|| jwks_error("document has no \"keys\" array"))?;
        if entries.len() > MAX_JWKS_KEYS {
            return Err(jwks_error("document has more than 64 keys"));
        }
        let keys: Vec<Key> = entries.iter().filter_map(usable_key).collect();
        if keys.is_empty() {
            return Err(jwks_error("document has no usable signing key"));
        }
        Ok(Jwks { keys })
    }

    /// How many usable keys the set holds (at least one).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Always `false`: [`Jwks::parse`] refuses a set with no usable key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether a usable key has this `kid`.
    pub fn has_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }

    /// The keys a token with `kid` and `alg` may be verified with: those with that `kid` (or
    /// the only key, when the token has none) that allow `alg`. Never empty.
    fn candidates(&self, kid: Option<&str>, alg: Algorithm) -> Result<Vec<&Key>, AttestError> {
        let named: Vec<&Key> = match kid {
            Some(kid) => self
                .keys
                .iter()
                .filter(|k| k.kid.as_deref() == Some(kid))
                .collect(),
            None if self.keys.len() == 1 => self.keys.iter().collect(),
            None => {
                return Err(AttestError::KidRequired {
                    keys: self.keys.len(),
                })
            }
        };
        if named.is_empty() {
            return Err(AttestError::UnknownKey {
                kid: kid_shown(kid),
            });
        }
        let usable: Vec<&Key> = named
            .into_iter()
            .filter(|k| k.algorithms.contains(&alg))
            .collect();
        if usable.is_empty() {
            return Err(AttestError::KeyAlgorithmMismatch {
                kid: kid_shown(kid),
                alg: algorithm_name(alg),
            });
        }
        Ok(usable)
    }
}

fn jwks_error(reason: &str) -> AttestError {
    AttestError::Jwks(reason.to_owned())
}

/// One JWKS entry as a usable key, or `None` (skipped) for anything but a well-formed
/// asymmetric signing key.
fn usable_key(entry: &Value) -> Option<Key> {
    let object = entry.as_object()?;
    match object.get("use") {
        None => {}
        Some(Value::String(u)) if u == "sig" => {}
        Some(_) => return None,
    }
    if let Some(ops) = object.get("key_ops") {
        if !ops
            .as_array()?
            .iter()
            .any(|op| op.as_str() == Some("verify"))
        {
            return None;
        }
    }
    let kid = match object.get("kid") {
        None => None,
        Some(Value::String(kid)) => Some(kid.clone()),
        Some(_) => return None,
    };
    let declared = match object.get("alg") {
        None => None,
        Some(Value::String(alg)) => Some(allowed_algorithm(alg)?),
        Some(_) => return None,
    };
    let jwk: Jwk = serde_json::from_value(entry.clone()).ok()?;
    let family = key_family(&jwk.algorithm)?;
    let algorithms = match declared {
        None => family,
        Some(alg) if family.contains(&alg) => single(alg),
        Some(_) => return None,
    };
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    Some(Key {
        kid,
        algorithms,
        key,
    })
}

/// The algorithms a key of this type and shape verifies, or `None` for a symmetric,
/// unsupported or malformed key.
fn key_family(params: &AlgorithmParameters) -> Option<&'static [Algorithm]> {
    match params {
        AlgorithmParameters::RSA(rsa) => {
            let n = URL_SAFE_NO_PAD.decode(&rsa.n).ok()?;
            let e = URL_SAFE_NO_PAD.decode(&rsa.e).ok()?;
            let bits = significant_bits(&n);
            ((2048..=8192).contains(&bits) && significant_bits(&e) > 1).then_some(RSA_ALGORITHMS)
        }
        AlgorithmParameters::EllipticCurve(ec) => {
            let (len, algorithms) = match ec.curve {
                EllipticCurve::P256 => (32, single(Algorithm::ES256)),
                EllipticCurve::P384 => (48, single(Algorithm::ES384)),
                EllipticCurve::P521 | EllipticCurve::Ed25519 => return None,
            };
            let x = URL_SAFE_NO_PAD.decode(&ec.x).ok()?;
            let y = URL_SAFE_NO_PAD.decode(&ec.y).ok()?;
            (x.len() == len && y.len() == len).then_some(algorithms)
        }
        AlgorithmParameters::OctetKeyPair(okp) => {
            let x = URL_SAFE_NO_PAD.decode(&okp.x).ok()?;
            (okp.curve == EllipticCurve::Ed25519 && x.len() == 32)
                .then_some(single(Algorithm::EdDSA))
        }
        AlgorithmParameters::OctetKey(_) => None,
    }
}

/// The number of significant bits in a big-endian unsigned integer.
fn significant_bits(bytes: &[u8]) -> usize {
    let Some(first) = bytes.iter().position(|&b| b != 0) else {
        return 0;
    };
    let top = bytes.get(first).copied().unwrap_or(0);
    (bytes.len() - first - 1) * 8 + (8 - top.leading_zeros() as usize)
}

/// The one-algorithm list for `alg`.
fn single(alg: Algorithm) -> &'static [Algorithm] {
    match alg {
        Algorithm::RS256 => &[Algorithm::RS256],
        Algorithm::RS384 => &[Algorithm::RS384],
        Algorithm::RS512 => &[Algorithm::RS512],
        Algorithm::PS256 => &[Algorithm::PS256],
        Algorithm::PS384 => &[Algorithm::PS384],
        Algorithm::PS512 => &[Algorithm::PS512],
        Algorithm::ES256 => &[Algorithm::ES256],
        Algorithm::ES384 => &[Algorithm::ES384],
        Algorithm::EdDSA => &[Algorithm::EdDSA],
        // Never reached: only allowed (asymmetric) algorithms get here.
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => &[],
    }
}

/// The allow-list: the asymmetric algorithms, by their JOSE names. `None` for anything else.
fn allowed_algorithm(name: &str) -> Option<Algorithm> {
    Some(match name {
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "EdDSA" => Algorithm::EdDSA,
        _ => return None,
    })
}

/// An algorithm's JOSE name, for messages.
fn algorithm_name(alg: Algorithm) -> &'static str {
    match alg {
        Algorithm::HS256 => "HS256",
        Algorithm::HS384 => "HS384",
        Algorithm::HS512 => "HS512",
        Algorithm::RS256 => "RS256",
        Algorithm::RS384 => "RS384",
        Algorithm::RS512 => "RS512",
        Algorithm::PS256 => "PS256",
        Algorithm::PS384 => "PS384",
        Algorithm::PS512 => "PS512",
        Algorithm::ES256 => "ES256",
        Algorithm::ES384 => "ES384",
        Algorithm::EdDSA => "EdDSA",
    }
}

/// A refused `alg` as shown in a message: a registered JOSE name as itself, anything else
/// (attacker-chosen text) as a fixed placeholder.
fn refused_algorithm_name(name: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "none", "HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
        "ES256", "ES384", "ES512", "ES256K", "EdDSA", "Ed25519", "Ed448",
    ];
    KNOWN
        .iter()
        .find(|known| **known == name)
        .copied()
        .unwrap_or("(unrecognised)")
}

/// A token's `kid` as shown in a message: itself when short and made of characters key ids
/// use, else a description (a `kid` is chosen by whoever made the token).
fn kid_shown(kid: Option<&str>) -> String {
    match kid {
        None => "(no kid)".to_owned(),
        Some(kid)
            if !kid.is_empty()
                && kid.len() <= MAX_SHOWN_KID
                && kid
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:/+=@#".contains(&b)) =>
        {
            format!("{kid:?}")
        }
        Some(kid) => format!("(kid of {} bytes, not shown)", kid.len()),
    }
}

/// What a token must say.
#[derive(Debug, Clone, Copy)]
pub struct Expect<'a> {
    /// The exact `iss` the token must carry.
    pub issuer: &'a str,
    /// A value the token's `aud` (a string, or an array of strings) must contain exactly.
    pub audience: &'a str,
    /// Clock skew allowed for `exp`, `nbf` and `iat`.
    pub leeway: Duration,
}

/// The verified claims of a token that passed [`verify`]: its payload, a JSON object.
#[derive(Debug, Clone)]
pub struct Claims {
    claims: Map<String, Value>,
    expires_at: SystemTime,
}

impl Claims {
    /// The `sub` claim, when it is a string.
    pub fn subject(&self) -> Option<&str> {
        self.claims.get("sub").and_then(Value::as_str)
    }

    /// When the token expires (its `exp`, which [`verify`] requires).
    pub fn expires_at(&self) -> SystemTime {
        self.expires_at
    }

    /// A claim by path: `"claim.A.B"` style WITHOUT the leading `claim.` (the caller strips
    /// it): segments joined by `.`, where claim names may themselves contain dots (Kubernetes:
    /// `kubernetes.io` → `{"namespace": ..}`). Resolved by trying, at each level, the longest
    /// run of remaining segments that is a key of the current object, then descending (no
    /// backtracking to a shorter run). Returns strings as-is, numbers and booleans as their
    /// JSON text, anything else (object, array, null, missing) `None`.
    pub fn get(&self, path: &str) -> Option<String> {
        match self.value(path)? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Null | Value::Array(_) | Value::Object(_) => None,
        }
    }

    /// The JSON value at a claim path, resolved as [`Claims::get`] resolves it (an array or
    /// object too: a `groups` claim).
    pub fn value(&self, path: &str) -> Option<&Value> {
        if path.is_empty() {
            return None;
        }
        // Byte ranges of the segments ('.' is one byte, so every boundary is a char boundary).
        let mut segments = Vec::new();
        let mut start = 0;
        for segment in path.split('.') {
            segments.push((start, start + segment.len()));
            start += segment.len() + 1;
        }
        let mut object = &self.claims;
        let mut first = 0;
        loop {
            let begin = segments.get(first)?.0;
            let (last, value) = (first..segments.len()).rev().find_map(|last| {
                let end = segments.get(last)?.1;
                object.get(path.get(begin..end)?).map(|value| (last, value))
            })?;
            if last + 1 == segments.len() {
                return Some(value);
            }
            object = value.as_object()?;
            first = last + 1;
        }
    }
}

/// Verifies `token` (compact JWS) against `jwks`. Accepted algorithms: RS256/384/512,
/// PS256/384/512, ES256, ES384, EdDSA — and only those the selected key's type (and its JWK
/// `alg`, if any) allows: an RSA key never verifies an ES/HS token, an EC key never an RS one.
/// Refused: `alg: none`, any HS* (including HS256 "signed" with the public key's bytes), a
/// token with `crit`, a `kid` not in the set (when the set has more than one key a `kid` is
/// required; with exactly one key a missing `kid` uses it), a bad signature, missing or
/// invalid `exp`, `exp` past (`now >= exp + leeway`), `nbf` or `iat` future (beyond `leeway`),
/// `iss` ≠ issuer, `aud` (string or array) not containing audience, tokens over
/// [`MAX_TOKEN_BYTES`]. Embedded `jwk`/`jku`/`x5u`/`x5c` headers are ignored (never used as
/// keys). Time is `now`, never the system clock. Never panics; errors never carry the token.
pub fn verify(
    token: &str,
    jwks: &Jwks,
    expect: &Expect<'_>,
    now: SystemTime,
) -> Result<Claims, AttestError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(AttestError::TooLarge {
            limit: MAX_TOKEN_BYTES,
        });
    }
    let (alg, kid) = read_header(token)?;
    let candidates = jwks.candidates(kid.as_deref(), alg)?;
    let claims = check_signature(token, alg, &candidates, kid.as_deref())?;
    check_claims(claims, expect, now)
}

/// The header's allowed algorithm and `kid`, read before any key is chosen.
fn read_header(token: &str) -> Result<(Algorithm, Option<String>), AttestError> {
    let mut parts = token.split('.');
    let (Some(header), Some(_payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(AttestError::Malformed("not three dot-separated segments"));
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| AttestError::Malformed("header is not base64url"))?;
    let Ok(Value::Object(header)) = serde_json::from_slice::<Value>(&bytes) else {
        return Err(AttestError::Malformed("header is not a JSON object"));
    };
    let alg = match header.get("alg") {
        Some(Value::String(name)) => {
            allowed_algorithm(name).ok_or_else(|| AttestError::AlgorithmNotAllowed {
                alg: refused_algorithm_name(name),
            })?
        }
        Some(_) => return Err(AttestError::Malformed("header alg is not a string")),
        None => return Err(AttestError::Malformed("header has no alg")),
    };
    if header.contains_key("crit") {
        return Err(AttestError::CriticalHeader);
    }
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(kid)) => Some(kid.clone()),
        Some(_) => return Err(AttestError::Malformed("header kid is not a string")),
    };
    Ok((alg, kid))
}

/// Checks the signature with each candidate key in turn (jsonwebtoken checks `alg` against the
/// one allowed algorithm and the key's family, then the signature); the payload of the first
/// that verifies.
fn check_signature(
    token: &str,
    alg: Algorithm,
    keys: &[&Key],
    kid: Option<&str>,
) -> Result<Map<String, Value>, AttestError> {
    let mut validation = Validation::new(alg);
    // Claims are checked by `check_claims`, against the caller's clock.
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    for key in keys {
        match jsonwebtoken::decode::<Value>(token, &key.key, &validation) {
            Ok(data) => {
                return match data.claims {
                    Value::Object(claims) => Ok(claims),
                    _ => Err(AttestError::Malformed("payload is not a JSON object")),
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::InvalidSignature) => {}
            // jsonwebtoken's own messages may quote the token (serde_json quotes values), so
            // only the kind is used.
            Err(e) => {
                return Err(match e.kind() {
                    ErrorKind::InvalidAlgorithm
                    | ErrorKind::MissingAlgorithm
                    | ErrorKind::InvalidAlgorithmName => AttestError::AlgorithmNotAllowed {
                        alg: algorithm_name(alg),
                    },
                    ErrorKind::InvalidKeyFormat
                    | ErrorKind::InvalidEcdsaKey
                    | ErrorKind::InvalidEddsaKey
                    | ErrorKind::InvalidRsaKey(_) => AttestError::BadSignature {
                        kid: kid_shown(kid),
                    },
                    _ => AttestError::Malformed("token could not be decoded"),
                })
            }
        }
    }
    Err(AttestError::BadSignature {
        kid: kid_shown(kid),
    })
}

/// Checks `iss`, `aud`, `exp`, `nbf` and `iat` of a verified payload.
fn check_claims(
    claims: Map<String, Value>,
    expect: &Expect<'_>,
    now: SystemTime,
) -> Result<Claims, AttestError> {
    match claims.get("iss") {
        None => return Err(AttestError::MissingClaim("iss")),
        Some(Value::String(iss)) if iss == expect.issuer => {}
        Some(_) => {
            return Err(AttestError::WrongIssuer {
                expected: expect.issuer.to_owned(),
            })
        }
    }
    check_audience(&claims, expect.audience)?;
    let exp = numeric_date(&claims, "exp")?.ok_or(AttestError::MissingClaim("exp"))?;
    let expires_at = UNIX_EPOCH
        .checked_add(exp)
        .ok_or(AttestError::InvalidClaim("exp"))?;
    let now = now.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    if now >= exp.saturating_add(expect.leeway) {
        return Err(AttestError::Expired { exp: exp.as_secs() });
    }
    let later = now.saturating_add(expect.leeway);
    for claim in ["nbf", "iat"] {
        if let Some(at) = numeric_date(&claims, claim)? {
            if later < at {
                return Err(AttestError::NotYetValid {
                    claim,
                    at: at.as_secs(),
                });
            }
        }
    }
    Ok(Claims { claims, expires_at })
}

/// `aud` must be `audience`, or an array of strings one of which is `audience`.
fn check_audience(claims: &Map<String, Value>, audience: &str) -> Result<(), AttestError> {
    let found = match claims.get("aud") {
        None => return Err(AttestError::MissingClaim("aud")),
        Some(Value::String(aud)) => aud == audience,
        Some(Value::Array(auds)) => {
            let mut found = false;
            for aud in auds {
                match aud {
                    Value::String(aud) => found |= aud == audience,
                    _ => return Err(AttestError::InvalidClaim("aud")),
                }
            }
            found
        }
        Some(_) => return Err(AttestError::InvalidClaim("aud")),
    };
    if found {
        Ok(())
    } else {
        Err(AttestError::WrongAudience {
            expected: audience.to_owned(),
        })
    }
}

/// A NumericDate claim (seconds since the epoch, integer or not) as a duration since the
/// epoch; `None` when absent, an error when not a non-negative representable number.
fn numeric_date(
    claims: &Map<String, Value>,
    claim: &'static str,
) -> Result<Option<Duration>, AttestError> {
    let Some(value) = claims.get(claim) else {
        return Ok(None);
    };
    let Value::Number(number) = value else {
        return Err(AttestError::InvalidClaim(claim));
    };
    if let Some(secs) = number.as_u64() {
        return Ok(Some(Duration::from_secs(secs)));
    }
    number
        .as_f64()
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .map(Some)
        .ok_or(AttestError::InvalidClaim(claim))
}

/// A JWKS kept fresh: fetched by `fetch` (the caller supplies it: latchkey fetches through its
/// guarded dialer), cached for `ttl`, refetched when older than `ttl` or when a token names a
/// `kid` the set lacks (key rotation) — but never more than one fetch attempt per
/// `min_refresh`, whatever its cause (so an unknown `kid` or an issuer that is down cannot make
/// latchkey hammer it). When a refetch fails (or returns an unusable document) the last good
/// set is kept and served until `max_stale` past its `ttl`; after that [`JwksCache::get`] fails
/// closed until a fetch succeeds. Callers share one fetch: the state is behind an async mutex
/// held across it, so concurrent callers wait for it rather than stampede.
pub struct JwksCache {
    ttl: Duration,
    min_refresh: Duration,
    max_stale: Duration,
    state: tokio::sync::Mutex<CacheState>,
}

#[derive(Default)]
struct CacheState {
    /// The last good set and when it was fetched.
    good: Option<(Arc<Jwks>, Instant)>,
    /// When a fetch was last attempted (successful or not).
    last_attempt: Option<Instant>,
    /// Why the last attempt failed, if it did.
    last_error: Option<String>,
}

impl fmt::Debug for JwksCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwksCache")
            .field("ttl", &self.ttl)
            .field("min_refresh", &self.min_refresh)
            .field("max_stale", &self.max_stale)
            .finish_non_exhaustive()
    }
}

impl JwksCache {
    /// An empty cache: the first [`JwksCache::get`] fetches.
    pub fn new(ttl: Duration, min_refresh: Duration, max_stale: Duration) -> Self {
        Self {
            ttl,
            min_refresh,
            max_stale,
            state: tokio::sync::Mutex::new(CacheState::default()),
        }
    }

    /// The current set for a token naming `kid` at `now`: fetched (with `fetch`, which returns
    /// the document's bytes or why it could not) when there is none, when it is older than
    /// `ttl`, or when it lacks `kid` — each only if no fetch was attempted in the last
    /// `min_refresh`. A failed fetch keeps the last good set, served while it is less than
    /// `ttl + max_stale` old; with no such set, an error ([`AttestError::Jwks`]) naming the
    /// last failure. A set lacking `kid` is still returned ([`verify`] then refuses the token).
    pub async fn get<F, Fut>(
        &self,
        kid: Option<&str>,
        now: Instant,
        fetch: F,
    ) -> Result<Arc<Jwks>, AttestError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<u8>, String>>,
    {
        let mut state = self.state.lock().await;
        let wanted = match &state.good {
            None => true,
            Some((set, fetched)) => {
                now.saturating_duration_since(*fetched) >= self.ttl
                    || kid.is_some_and(|kid| !set.has_kid(kid))
            }
        };
        let allowed = state
            .last_attempt
            .is_none_or(|at| now.saturating_duration_since(at) >= self.min_refresh);
        if wanted && allowed {
            state.last_attempt = Some(now);
            match fetch().await {
                Ok(bytes) => match Jwks::parse(&bytes) {
                    Ok(set) => {
                        state.good = Some((Arc::new(set), now));
                        state.last_error = None;
                    }
                    Err(AttestError::Jwks(reason)) => state.last_error = Some(reason),
                    Err(e) => state.last_error = Some(e.to_string()),
                },
                Err(reason) => {
                    let reason: String = reason.chars().take(MAX_FETCH_ERROR).collect();
                    state.last_error = Some(format!("fetch failed: {reason}"));
                }
            }
        }
        let usable_for = self.ttl.saturating_add(self.max_stale);
        match &state.good {
            Some((set, fetched)) if now.saturating_duration_since(*fetched) < usable_for => {
                Ok(Arc::clone(set))
            }
            good => {
                let last = state.last_error.as_deref().unwrap_or("no fetch attempted");
                Err(AttestError::Jwks(if good.is_some() {
                    format!("the last good set is past its ttl and max_stale ({last})")
                } else {
                    format!("no set fetched yet ({last})")
                }))
            }
        }
    }
}

#[cfg(test)]
#[path = "attest_tests.rs"]
mod tests;

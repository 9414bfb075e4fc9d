//! Credentials that are not a static key: AWS SigV4 request signing, and tokens latchkey mints
//! or exchanges itself (GitHub App installation tokens, Google service-account access tokens,
//! OAuth2 client credentials, generic JWTs).
//!
//! Key material comes only from secret sources; minted tokens are cached per credential (and
//! per identity/host where a JWT's claims use them) with single flight ([`TokenCache`]),
//! refreshed five minutes before they expire, and registered with the secret store so
//! responses that reflect them are redacted. This module knows no sockets and imports neither
//! `upstream` nor `proxy` nor `policy`: token endpoints are reached through a
//! [`TokenTransport`] the proxy provides (its guarded, audited client), and bodies are plain
//! `http_body` boxes.
//!
//! Files: `aws` (SigV4 and STS AssumeRole), `aws_identity` (latchkey's own AWS identity: the
//! provider chain), `aws_endpoints` (service, container and metadata endpoints), `aws_profile`
//! (the shared files), `sts` (STS calls and their answer), `sigv4` (the
//! signature), `aws_chunked` (streamed S3 uploads), `minted` (the token kinds), `jwt`,
//! `exchange` (the transport trait and request helpers), `token_cache`, `live` (a policy
//! generation's secret values, minted and captured tokens, reconciled on reload).

// The crates this one uses, under the module names the code knows them by.
use latchkey_secrets as secrets;
use latchkey_wire as wire;

mod aws;
pub mod aws_chunked;
mod aws_identity;
mod aws_profile;
pub mod exchange;
mod hmac_sign;
mod jwt;
mod live;
mod minted;
mod oauth2;
mod sigv4;
mod sts;
mod token_cache;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;

use crate::secrets::{SecretError, SecretStore, SecretValue};

pub use aws_identity::{AwsIdentity, AwsKeys, ImdsConfig, RULE as AWS_IDENTITY_RULE};
pub use exchange::{Answer, Exchange, Route, TokenTransport, TransportError};
pub use hmac_sign::{
    parse_template as parse_hmac_template, Encoding as HmacEncoding, Hmac, HmacAlg,
    Part as HmacPart, Timestamp as HmacTimestamp, Use as HmacUse,
};
pub use jwt::{JwtAlg, JwtClaim};
pub use live::Live;
pub use oauth2::{ClientAuth, Grant, OAuth2};
pub use sigv4::{derive_region_service, Payload, UNSIGNED_HEADERS};
/// SigV4 over a request latchkey sends itself (the audit shipper's uploads).
pub use sigv4::{sign as sigv4_sign, Keys as SigV4Keys, Scope as SigV4Scope, SignPayload};
pub use sts::StsError;
pub use token_cache::TokenCache;

/// A body error, as `http_body` boxes carry it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body as the proxy hands it over (the same type as `upstream::Body`, named here so
/// `signing` need not import `upstream`).
pub type BoxBody = http_body_util::combinators::BoxBody<Bytes, BoxError>;

/// Refresh a cached token this long before it expires.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// The store key of a credential's key-material field (not a valid secret name: no clash).
pub fn field_key(credential: &str, field: &str) -> String {
    format!("credential:{credential}:{field}")
}

/// The name minted tokens of a credential are redacted under.
pub fn token_name(credential: &str) -> String {
    format!("credential:{credential}")
}

/// A compiled credential.
#[derive(Debug, Clone, PartialEq)]
pub struct Credential {
    pub name: String,
    pub kind: Kind,
}

/// STS AssumeRole settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AssumeRole {
    pub role_arn: String,
    pub session_name: String,
    pub duration: Duration,
    pub external_id: Option<String>,
    pub sts_endpoint: String,
    pub sts_region: String,
}

/// What a credential does.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    AwsSigV4 {
        /// Sign with a role's temporary keys, fetched with the base keys.
        assume_role: Option<AssumeRole>,
        region: Option<String>,
        service: Option<String>,
        /// The credential names `access_key_id` and `secret_access_key`; without them it
        /// signs (or assumes its role) with latchkey's own AWS identity ([`AwsIdentity`]).
        static_keys: bool,
        has_session_token: bool,
        max_signed_body: usize,
    },
    GithubApp {
        app_id: String,
        installation_id: String,
        api: String,
        permissions: Option<BTreeMap<String, String>>,
        repositories: Option<Vec<String>>,
    },
    GoogleServiceAccount {
        scopes: Vec<String>,
        token_uri: Option<String>,
    },
    /// `oauth2` (and `oauth2_client_credentials`, its client-credentials alias).
    OAuth2(Box<OAuth2>),
    /// A Google-signed ID token for `audience` (Cloud Run, IAP), exchanged for a
    /// service-account assertion with `target_audience`.
    GoogleIdToken {
        audience: String,
        token_uri: Option<String>,
    },
    /// A request signature: HMAC over a message templated from the request.
    Hmac(Box<Hmac>),
    Jwt {
        alg: JwtAlg,
        ttl: Option<Duration>,
        header: HeaderName,
        claims: Vec<(String, JwtClaim)>,
    },
    /// A TLS client certificate (`cert`) and its key (`key`), both PEM from secret sources,
    /// presented on the rule's upstream connections (mTLS). Nothing is added to the request:
    /// the proxy picks a client whose connections present it.
    ClientCert,
}

impl Kind {
    pub fn label(&self) -> &'static str {
        match self {
            Kind::AwsSigV4 { .. } => "aws_sigv4",
            Kind::GithubApp { .. } => "github_app",
            Kind::GoogleServiceAccount { .. } => "google_service_account",
            Kind::OAuth2(o) if o.alias => "oauth2_client_credentials",
            Kind::OAuth2(_) => "oauth2",
            Kind::GoogleIdToken { .. } => "google_id_token",
            Kind::Hmac(_) => "hmac",
            Kind::Jwt { .. } => "jwt",
            Kind::ClientCert => "client_cert",
        }
    }
}

/// A credential could not be applied. Messages name the credential, never a token or key.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CredentialError {
    #[error("credential '{name}': {why}")]
    Failed { name: String, why: String },
    #[error("credential '{name}': presigned query authentication (X-Amz-Signature) is refused on credentialed rules; send the request unsigned and latchkey signs it")]
    PresignedQuery { name: String },
    #[error("credential '{name}': {source}")]
    Secret { name: String, source: SecretError },
    /// The request cannot be signed as sent (a payload form latchkey does not sign, framing
    /// headers that contradict each other): the sandbox's to fix.
    #[error("credential '{name}': {why}")]
    BadRequest { name: String, why: String },
}

/// What applying a credential leaves to do on the body: nothing, or (an S3 aws-chunked
/// upload) check its framing or re-sign its chunks as it streams.
#[derive(Debug, Default)]
pub struct Applied {
    chunked: Option<aws_chunked::Framing>,
}

impl Applied {
    /// The most bytes [`Applied::body`] holds at once, for the caller's buffered-bytes budget:
    /// one chunk (≤ 1 MiB) when re-signing an aws-chunked body, a few KiB when checking one,
    /// 0 otherwise.
    pub fn held_at_most(&self) -> usize {
        self.chunked
            .as_ref()
            .map_or(0, aws_chunked::Framing::held_at_most)
    }

    /// Has `scan` check the data of an aws-chunked body as it passes (nothing to do for any
    /// other body, whose bytes are its data).
    pub fn scan_payload(&mut self, scan: impl FnOnce() -> Box<dyn aws_chunked::PayloadScan>) {
        if let Some(framing) = self.chunked.as_mut() {
            framing.scan_payload(scan());
        }
    }

    /// The body to send: `body` itself, or `body` through the aws-chunked framing. When the
    /// framing is bad the body fails (aborting the upload) and `on_error` hears why, once.
    pub fn body(
        self,
        body: BoxBody,
        on_error: impl FnOnce(String) + Send + Sync + 'static,
    ) -> BoxBody {
        use http_body_util::BodyExt;
        match self.chunked {
            None => body,
            Some(framing) => {
                aws_chunked::AwsChunked::new(body, framing, Box::new(on_error)).boxed()
            }
        }
    }
}

/// What the request looks like when the credential is applied (after every other edit).
pub struct Target<'a> {
    pub method: &'a str,
    pub scheme: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub identity: &'a str,
}

/// The body as the signer sees it.
pub enum SignBody<'a> {
    /// The whole body, buffered.
    Whole(&'a [u8]),
    /// Too large or streamed: signed as `UNSIGNED-PAYLOAD`.
    Streamed,
}

/// Whether applying `kind` needs the whole request body in hand: `Some(max)` when the body is
/// hashed into the signature (a classic signed SigV4 payload, up to `max_signed_body` bytes;
/// over that, or when the caller will not buffer, it is signed `UNSIGNED-PAYLOAD`), `None`
/// when the body can stream (`UNSIGNED-PAYLOAD`, the aws-chunked streaming forms, whose chunks
/// are re-signed as they pass, and every kind that does not sign the body).
///
/// `headers` are the request's as the sandbox sent them (`x-amz-content-sha256` declares the
/// form). A form latchkey refuses answers `None`: [`apply`] refuses it without a body.
pub fn whole_body_needed(kind: &Kind, headers: &HeaderMap) -> Option<usize> {
    match kind {
        Kind::AwsSigV4 {
            max_signed_body, ..
        } if *max_signed_body > 0 => match sigv4::Payload::declared(headers) {
            Ok(sigv4::Payload::Classic) => Some(*max_signed_body),
            _ => None,
        },
        Kind::Hmac(h) if h.uses_body() => Some(h.max_signed_body),
        _ => None,
    }
}

/// Headers the sandbox may have set that a credentialed request must not carry.
pub fn stripped_headers(kind: &Kind) -> &'static [&'static str] {
    match kind {
        // `x-amz-content-sha256` stays until signing: it declares the payload form, and
        // [`apply`] replaces it.
        Kind::AwsSigV4 { .. } => &["authorization", "x-amz-date", "x-amz-security-token"],
        // It authenticates the connection, not the request: the request is left as it is.
        Kind::ClientCert => &[],
        _ => &["authorization"],
    }
}

fn failed(name: &str, why: impl Into<String>) -> CredentialError {
    CredentialError::Failed {
        name: name.to_string(),
        why: why.into(),
    }
}

async fn secret(
    store: &SecretStore,
    cred: &str,
    field: &str,
) -> Result<SecretValue, CredentialError> {
    store
        .get(&field_key(cred, field))
        .await
        .map_err(|source| CredentialError::Secret {
            name: cred.to_string(),
            source,
        })
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// Where a credential's material comes from: its keys in the secret store (which also learns
/// every token minted, to redact it), tokens already fetched in the cache, the transport
/// that reaches a token endpoint, called only when a token must be fetched (a cached one is
/// reused), and latchkey's own AWS identity, for an `aws_sigv4` credential that names no keys
/// (`None`: such a credential fails closed).
#[derive(Clone, Copy)]
pub struct Material<'a> {
    pub store: &'a SecretStore,
    pub cache: &'a TokenCache,
    pub transport: &'a dyn TokenTransport,
    pub aws: Option<&'a AwsIdentity>,
}

/// Applies a credential to a request: signs it (SigV4) or attaches a token, last. The result
/// says what remains to do on the body ([`Applied::body`]).
pub async fn apply(
    cred: &Credential,
    material: Material<'_>,
    t: &Target<'_>,
    headers: &mut HeaderMap,
    path_and_query: &str,
    body: SignBody<'_>,
) -> Result<Applied, CredentialError> {
    let name = cred.name.as_str();
    match &cred.kind {
        Kind::AwsSigV4 {
            assume_role,
            region,
            service,
            static_keys,
            has_session_token,
            max_signed_body,
        } => {
            let aws = aws::Aws {
                assume_role,
                region,
                service,
                static_keys: *static_keys,
                has_session_token: *has_session_token,
                max_signed_body: *max_signed_body,
            };
            aws::sign(name, aws, material, t, headers, path_and_query, body).await
        }
        Kind::Hmac(h) => {
            hmac_sign::sign(name, h, material, t, headers, path_and_query, body).await?;
            Ok(Applied::default())
        }
        // Presented by the connection (the proxy's client for the rule), not on the request.
        Kind::ClientCert => Ok(Applied::default()),
        kind => {
            minted::attach(name, kind, material, t, headers).await?;
            Ok(Applied::default())
        }
    }
}

fn sensitive(v: String) -> Result<HeaderValue, CredentialError> {
    let mut hv = HeaderValue::from_str(&v).map_err(|_| CredentialError::Failed {
        name: String::new(),
        why: "a token is not valid in a header".to_string(),
    })?;
    hv.set_sensitive(true);
    Ok(hv)
}

fn set_bearer(
    headers: &mut HeaderMap,
    name: &HeaderName,
    token: &SecretValue,
    bearer: bool,
) -> Result<(), CredentialError> {
    let mut raw = if bearer {
        b"Bearer ".to_vec()
    } else {
        Vec::new()
    };
    raw.extend_from_slice(token.expose());
    let raw = zeroize::Zeroizing::new(raw);
    let mut hv = HeaderValue::from_bytes(&raw).map_err(|_| CredentialError::Failed {
        name: String::new(),
        why: "a minted token is not valid in a header".to_string(),
    })?;
    hv.set_sensitive(true);
    headers.insert(name.clone(), hv);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::AUTHORIZATION;

    fn aws(max: usize) -> Kind {
        Kind::AwsSigV4 {
            assume_role: None,
            region: None,
            service: None,
            static_keys: true,
            has_session_token: false,
            max_signed_body: max,
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    #[test]
    fn only_a_classic_signed_payload_needs_the_whole_body() {
        let hex = "ab".repeat(32);
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<usize>);
        let cases: &[Case] = &[
            (&[], Some(1024)),
            (&[("x-amz-content-sha256", &hex)], Some(1024)),
            (&[("x-amz-content-sha256", "UNSIGNED-PAYLOAD")], None),
            (
                &[("x-amz-content-sha256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER")],
                None,
            ),
            (
                &[("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")],
                None,
            ),
            (
                &[(
                    "x-amz-content-sha256",
                    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
                )],
                None,
            ),
            // Refused by apply, so never worth buffering.
            (&[("x-amz-content-sha256", "garbage")], None),
        ];
        for (h, want) in cases {
            assert_eq!(whole_body_needed(&aws(1024), &headers(h)), *want, "{h:?}");
        }
        assert_eq!(whole_body_needed(&aws(0), &headers(&[])), None);
        let jwt = Kind::Jwt {
            alg: JwtAlg::Hs256,
            ttl: None,
            header: AUTHORIZATION,
            claims: Vec::new(),
        };
        assert_eq!(whole_body_needed(&jwt, &headers(&[])), None);
    }
}

//! AWS Signature Version 4, over the request exactly as latchkey will send it.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign as sigv4_sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
    SigningSettings, UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use http::HeaderMap;

use super::Target;
use crate::secrets::SecretValue;
use crate::wire::host::Authority;

/// The payload forms a sandbox's SDK may declare in `x-amz-content-sha256`, and what latchkey
/// does with each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// No header, or a hex SHA-256: latchkey hashes the body it sends when it holds it whole
    /// (within `max_signed_body`), else signs `UNSIGNED-PAYLOAD`.
    Classic,
    /// `UNSIGNED-PAYLOAD`: kept; the body streams.
    Unsigned,
    /// `STREAMING-UNSIGNED-PAYLOAD-TRAILER` (aws-chunked, unsigned chunks, a checksum trailer):
    /// the seed is signed with that literal and the framing passes through, checked.
    StreamingUnsignedTrailer,
    /// `STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]`: the seed is signed with the literal and
    /// every chunk (and the trailer) is re-signed with the real key, chained from the seed.
    StreamingSigned { trailer: bool },
}

pub const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";
pub const STREAMING_UNSIGNED_TRAILER: &str = "STREAMING-UNSIGNED-PAYLOAD-TRAILER";
pub const STREAMING_SIGNED: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
pub const STREAMING_SIGNED_TRAILER: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER";

impl Payload {
    /// The form the sandbox declared. An unknown value, a repeated header or a SigV4a
    /// (ECDSA) streaming form is refused: latchkey cannot sign it as the upstream will check it.
    pub fn declared(headers: &HeaderMap) -> Result<Payload, String> {
        let mut values = headers.get_all("x-amz-content-sha256").iter();
        let Some(v) = values.next() else {
            return Ok(Payload::Classic);
        };
        if values.next().is_some() {
            return Err("x-amz-content-sha256 is sent more than once".to_string());
        }
        let v = v
            .to_str()
            .map_err(|_| "x-amz-content-sha256 is not ASCII".to_string())?
            .trim();
        Ok(match v {
            UNSIGNED_PAYLOAD => Payload::Unsigned,
            STREAMING_UNSIGNED_TRAILER => Payload::StreamingUnsignedTrailer,
            STREAMING_SIGNED => Payload::StreamingSigned { trailer: false },
            STREAMING_SIGNED_TRAILER => Payload::StreamingSigned { trailer: true },
            hex if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Payload::Classic
            }
            other if other.starts_with("STREAMING-") => {
                return Err(format!(
                    "x-amz-content-sha256 {other} is not supported (latchkey signs SigV4, not SigV4a; use UNSIGNED-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-TRAILER or STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER])"
                ))
            }
            _ => return Err("x-amz-content-sha256 is neither a SHA-256 nor a payload form AWS defines".to_string()),
        })
    }
}

/// The credential scope signed for: the region and the service (`s3`, `sts`, ...).
#[derive(Clone, Copy)]
pub struct Scope<'a> {
    pub region: &'a str,
    pub service: &'a str,
}

pub struct Keys<'a> {
    pub akid: &'a SecretValue,
    pub secret: &'a SecretValue,
    pub token: Option<&'a SecretValue>,
}

/// Region and service from an AWS host name: `bucket.s3.us-west-2.amazonaws.com` → (us-west-2,
/// s3), `dynamodb.eu-west-1.amazonaws.com` → (eu-west-1, dynamodb), `sts.amazonaws.com` →
/// (us-east-1, sts). `None` for other hosts.
pub fn derive_region_service(host: &str) -> Option<(String, String)> {
    let stem = host
        .strip_suffix(".amazonaws.com")
        .or_else(|| host.strip_suffix(".amazonaws.com.cn"))?;
    let labels: Vec<&str> = stem.split('.').collect();
    let looks_like_region =
        |l: &str| l.contains('-') && l.chars().last().is_some_and(|c| c.is_ascii_digit());
    // S3 in its many spellings: s3, s3-REGION, s3.REGION, s3-accelerate, bucket.s3...
    if let Some(i) = labels
        .iter()
        .position(|l| *l == "s3" || l.starts_with("s3-"))
    {
        let label = labels[i];
        if let Some(r) = label.strip_prefix("s3-").filter(|r| looks_like_region(r)) {
            return Some((r.to_string(), "s3".to_string()));
        }
        let region = labels
            .get(i + 1)
            .filter(|l| looks_like_region(l))
            .map_or("us-east-1", |l| l);
        return Some((region.to_string(), "s3".to_string()));
    }
    let service = labels.first()?.to_string();
    let region = labels
        .iter()
        .skip(1)
        .find(|l| looks_like_region(l))
        .map_or("us-east-1".to_string(), |l| l.to_string());
    Some((region, service))
}

fn text(v: &SecretValue, what: &str) -> Result<String, String> {
    std::str::from_utf8(v.expose())
        .map(str::to_string)
        .map_err(|_| format!("{what} is not UTF-8"))
}

/// What the payload hash in the canonical request is.
pub enum SignPayload<'a> {
    /// The body latchkey sends, hashed.
    Bytes(&'a [u8]),
    /// `UNSIGNED-PAYLOAD`.
    Unsigned,
    /// A streaming form's literal (`STREAMING-...`), or the hex SHA-256 of a body hashed
    /// ahead of sending (the audit shipper streams a file it has hashed).
    Literal(&'a str),
}

/// Headers botocore never signs (`SIGNED_HEADERS_BLACKLIST` in botocore/auth.py: hop-by-hop
/// headers, `expect`, `user-agent`, `x-amzn-trace-id`), plus `authorization` (the signature's
/// own) and `proxy-connection`. A proxy or an SDK may change them in flight; signing one that
/// the upstream then sees differently (or not at all) makes S3 answer `SignatureDoesNotMatch`.
pub const UNSIGNED_HEADERS: &[&str] = &[
    "authorization",
    "connection",
    "expect",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "x-amzn-trace-id",
];

/// Signs in place: adds `authorization`, `x-amz-date`, and `x-amz-security-token` where it
/// applies, and `x-amz-content-sha256` (the payload form) for S3 or when `content_sha256` (the
/// sandbox sent one; it was removed here first). Every header but [`UNSIGNED_HEADERS`] is
/// signed. Returns the signature (the seed of a chunk-signed body).
pub fn sign(
    keys: &Keys<'_>,
    scope: Scope<'_>,
    t: &Target<'_>,
    headers: &mut HeaderMap,
    path_and_query: &str,
    payload: SignPayload<'_>,
    content_sha256: bool,
) -> Result<String, String> {
    let Scope { region, service } = scope;
    let authority = Authority {
        host: t.host,
        port: t.port,
        default_port: Some(if t.scheme == "https" { 443 } else { 80 }),
    };
    let uri = format!("{}://{authority}{path_and_query}", t.scheme);
    let credentials = Credentials::new(
        text(keys.akid, "access_key_id")?,
        text(keys.secret, "secret_access_key")?,
        keys.token.map(|t| text(t, "session_token")).transpose()?,
        None,
        "latchkey",
    );
    let identity = credentials.into();
    let mut settings = SigningSettings::default();
    settings.excluded_headers = Some(UNSIGNED_HEADERS.iter().map(|h| (*h).into()).collect());
    if service == "s3" {
        // S3 signs the path as sent.
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    }
    headers.remove("x-amz-content-sha256");
    if service == "s3" || content_sha256 {
        // S3 always carries the payload hash header (and checks it against the body).
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    }
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(SystemTime::now())
        .settings(settings)
        .build()
        .map_err(|e| format!("cannot build signing parameters: {e}"))?
        .into();
    let pairs: Vec<(String, String)> = headers
        .iter()
        .filter(|(k, _)| !UNSIGNED_HEADERS.contains(&k.as_str()))
        .filter_map(|(k, v)| {
            v.to_str()
                .ok()
                .map(|v| (k.as_str().to_string(), v.to_string()))
        })
        .collect();
    let signable_body = match payload {
        SignPayload::Bytes(b) => SignableBody::Bytes(b),
        SignPayload::Unsigned => SignableBody::UnsignedPayload,
        SignPayload::Literal(l) => SignableBody::Precomputed(l.to_string()),
    };
    let signable = SignableRequest::new(
        t.method,
        uri.clone(),
        pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        signable_body,
    )
    .map_err(|e| format!("cannot sign this request: {e}"))?;
    let (instructions, signature) = sigv4_sign(signable, &params)
        .map_err(|e| format!("cannot sign this request: {e}"))?
        .into_parts();
    let mut req = http::Request::builder()
        .method(t.method)
        .uri(uri)
        .body(())
        .map_err(|e| format!("cannot sign this request: {e}"))?;
    *req.headers_mut() = std::mem::take(headers);
    instructions.apply_to_request_http1x(&mut req);
    *headers = std::mem::take(req.headers_mut());
    for name in ["authorization", "x-amz-security-token"] {
        if let Some(v) = headers.get_mut(name) {
            v.set_sensitive(true);
        }
    }
    Ok(signature)
}

/// Signs a POST of `body` to `url` — latchkey's own AWS calls (STS, Secrets Manager, SSM) —
/// into `headers`, which already hold the call's content type (and target). The error names
/// what could not be signed, never a key.
pub(crate) fn sign_post(
    keys: &Keys<'_>,
    scope: Scope<'_>,
    url: &str,
    headers: &mut http::HeaderMap,
    body: &[u8],
) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("the endpoint {url:?} is not a URL: {e}"))?;
    let scheme = uri.scheme_str().unwrap_or("https").to_string();
    let host = uri.host().unwrap_or_default().to_ascii_lowercase();
    let port = uri
        .port_u16()
        .unwrap_or(if scheme == "http" { 80 } else { 443 });
    let path = match uri.path() {
        "" => "/",
        p => p,
    };
    let target = crate::Target {
        method: "POST",
        scheme: &scheme,
        host: &host,
        port,
        identity: "",
    };
    sign(
        keys,
        scope,
        &target,
        headers,
        path,
        SignPayload::Bytes(body),
        false,
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_and_services_come_from_aws_host_names() {
        let d = |h: &str| derive_region_service(h);
        let rs = |r: &str, s: &str| Some((r.to_string(), s.to_string()));
        assert_eq!(
            d("bucket.s3.us-west-2.amazonaws.com"),
            rs("us-west-2", "s3")
        );
        assert_eq!(d("s3.eu-central-1.amazonaws.com"), rs("eu-central-1", "s3"));
        assert_eq!(d("bucket.s3.amazonaws.com"), rs("us-east-1", "s3"));
        assert_eq!(d("s3-us-west-1.amazonaws.com"), rs("us-west-1", "s3"));
        assert_eq!(
            d("dynamodb.eu-west-1.amazonaws.com"),
            rs("eu-west-1", "dynamodb")
        );
        assert_eq!(d("sts.amazonaws.com"), rs("us-east-1", "sts"));
        assert_eq!(d("api.example.com"), None);
    }
}

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

/// Signs in place: adds `authorization`, `x-amz-date`, and `x-amz-security-token` /
/// `x-amz-content-sha256` where they apply. `body` `None` signs `UNSIGNED-PAYLOAD`.
#[allow(clippy::too_many_arguments)]
pub fn sign(
    keys: &Keys<'_>,
    region: &str,
    service: &str,
    t: &Target<'_>,
    headers: &mut HeaderMap,
    path_and_query: &str,
    body: Option<&[u8]>,
) -> Result<(), String> {
    let default_port = if t.scheme == "https" { 443 } else { 80 };
    let host = if t.host.contains(':') {
        format!("[{}]", t.host)
    } else {
        t.host.to_string()
    };
    let uri = if t.port == default_port {
        format!("{}://{host}{path_and_query}", t.scheme)
    } else {
        format!("{}://{host}:{}{path_and_query}", t.scheme, t.port)
    };
    let credentials = Credentials::new(
        text(keys.akid, "access_key_id")?,
        text(keys.secret, "secret_access_key")?,
        keys.token.map(|t| text(t, "session_token")).transpose()?,
        None,
        "latchkey",
    );
    let identity = credentials.into();
    let mut settings = SigningSettings::default();
    if service == "s3" {
        // S3 signs the path as sent and always carries the payload hash header.
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
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
        .filter_map(|(k, v)| {
            v.to_str()
                .ok()
                .map(|v| (k.as_str().to_string(), v.to_string()))
        })
        .collect();
    let signable_body = match body {
        Some(b) => SignableBody::Bytes(b),
        None => SignableBody::UnsignedPayload,
    };
    let signable = SignableRequest::new(
        t.method,
        uri.clone(),
        pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        signable_body,
    )
    .map_err(|e| format!("cannot sign this request: {e}"))?;
    let (instructions, _signature) = sigv4_sign(signable, &params)
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
    Ok(())
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

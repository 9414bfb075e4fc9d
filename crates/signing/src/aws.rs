//! AWS credentials: SigV4 over the request as latchkey sends it (the payload form the sandbox
//! declared, checked against its framing), with the base keys or a role's temporary keys from
//! STS `AssumeRole` (cached, answer parsed by [`super::sts`]).

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use super::exchange::{Route, TokenTransport};
use super::sigv4::{self, derive_region_service, Payload};
use super::sts;
use super::{
    aws_chunked, failed, field_key, secret, Applied, AssumeRole, CredentialError, Material,
    SignBody, Target, REFRESH_MARGIN,
};
use crate::secrets::SecretValue;

/// An `aws_sigv4` credential's settings.
pub(super) struct Aws<'a> {
    pub assume_role: &'a Option<AssumeRole>,
    pub region: &'a Option<String>,
    pub service: &'a Option<String>,
    pub static_keys: bool,
    pub has_session_token: bool,
    pub max_signed_body: usize,
}

/// Signs the request in place; what is left to do on an aws-chunked body is in the result.
pub(super) async fn sign(
    name: &str,
    cred: Aws<'_>,
    material: Material<'_>,
    t: &Target<'_>,
    headers: &mut HeaderMap,
    path_and_query: &str,
    body: SignBody<'_>,
) -> Result<Applied, CredentialError> {
    let Aws {
        assume_role,
        region,
        service,
        static_keys,
        has_session_token,
        max_signed_body,
    } = cred;
    let mut applied = Applied::default();
    if presigned(path_and_query) {
        return Err(CredentialError::PresignedQuery {
            name: name.to_string(),
        });
    }
    // Before any key is fetched or STS called: a form latchkey cannot sign is the
    // sandbox's to fix.
    let form = PayloadForm::of(name, headers)?;
    let (region, service) = region_service(name, region, service, t.host)?;
    let base = if static_keys {
        Base::Static { has_session_token }
    } else {
        Base::Identity
    };
    let (akid, secret_key, token) = keys(name, assume_role, base, material).await?;
    let payload = sign_payload(&form.payload, body, max_signed_body);
    let seed = sigv4::sign(
        &sigv4::Keys {
            akid: &akid,
            secret: &secret_key,
            token: token.as_ref(),
        },
        sigv4::Scope {
            region: &region,
            service: &service,
        },
        t,
        headers,
        path_and_query,
        payload,
        form.declared,
    )
    .map_err(|why| failed(name, why))?;
    let Some(mode) = chunked_mode(
        name,
        &form.payload,
        headers,
        &secret_key,
        &region,
        &service,
        &seed,
    )?
    else {
        return Ok(applied);
    };
    applied.chunked = Some(aws_chunked::Framing::new(mode, form.decoded_length));
    Ok(applied)
}

/// The region and service signed for: as configured, else derived from the host.
fn region_service(
    name: &str,
    region: &Option<String>,
    service: &Option<String>,
    host: &str,
) -> Result<(String, String), CredentialError> {
    match (region, service) {
        (Some(r), Some(s)) => Ok((r.clone(), s.clone())),
        _ => {
            let (dr, ds) = derive_region_service(host).ok_or_else(|| {
                failed(
                    name,
                    format!(
                        "cannot derive region and service from host {host}: set region and service"
                    ),
                )
            })?;
            Ok((region.clone().unwrap_or(dr), service.clone().unwrap_or(ds)))
        }
    }
}

/// Where a credential's base keys come from.
#[derive(Clone, Copy)]
enum Base {
    /// Its own keys in the secret store.
    Static { has_session_token: bool },
    /// latchkey's own AWS identity.
    Identity,
}

/// The base keys: the credential's own, or latchkey's identity's (whose secret parts join the
/// redaction set under the credential's name).
async fn base_keys(
    name: &str,
    base: Base,
    material: Material<'_>,
) -> Result<(SecretValue, SecretValue, Option<SecretValue>), CredentialError> {
    let store = material.store;
    match base {
        Base::Static { has_session_token } => {
            let akid = secret(store, name, "access_key_id").await?;
            let secret_key = secret(store, name, "secret_access_key").await?;
            let token = if has_session_token {
                Some(secret(store, name, "session_token").await?)
            } else {
                None
            };
            Ok((akid, secret_key, token))
        }
        Base::Identity => {
            let identity = material.aws.ok_or_else(|| {
                failed(
                    name,
                    "names no access_key_id/secret_access_key and latchkey has no AWS identity here",
                )
            })?;
            let keys = identity
                .keys(material.transport)
                .await
                .map_err(|why| failed(name, why))?;
            store.set_minted(
                &field_key(name, "identity_secret_access_key"),
                "",
                &keys.secret_access_key,
            );
            if let Some(t) = &keys.session_token {
                store.set_minted(&field_key(name, "identity_session_token"), "", t);
            }
            Ok((
                keys.access_key_id,
                keys.secret_access_key,
                keys.session_token,
            ))
        }
    }
}

/// The keys to sign with: the base keys, or (with `assume_role`) a role's temporary keys
/// from STS, cached, whose secret values join the redaction set.
async fn keys(
    name: &str,
    assume_role: &Option<AssumeRole>,
    base: Base,
    material: Material<'_>,
) -> Result<(SecretValue, SecretValue, Option<SecretValue>), CredentialError> {
    let Material {
        store,
        cache,
        transport,
        ..
    } = material;
    let (base_akid, base_secret, base_token) = base_keys(name, base, material).await?;
    let Some(role) = assume_role else {
        return Ok((base_akid, base_secret, base_token));
    };
    let keys = sigv4::Keys {
        akid: &base_akid,
        secret: &base_secret,
        token: base_token.as_ref(),
    };
    let packed = cache
        .get(name, REFRESH_MARGIN, || {
            assume(name, role, &keys, transport)
        })
        .await?;
    let (a, s, t) = unpack_keys(name, &packed)?;
    store.set_minted(&field_key(name, "assumed_secret_access_key"), "", &s);
    store.set_minted(&field_key(name, "assumed_session_token"), "", &t);
    Ok((a, s, Some(t)))
}

/// The payload hash the canonical request carries, for the payload form declared.
fn sign_payload<'b>(
    payload: &Payload,
    body: SignBody<'b>,
    max_signed_body: usize,
) -> sigv4::SignPayload<'b> {
    match payload {
        Payload::Classic => match body {
            SignBody::Whole(b) if b.len() <= max_signed_body => sigv4::SignPayload::Bytes(b),
            _ => sigv4::SignPayload::Unsigned,
        },
        Payload::Unsigned => sigv4::SignPayload::Unsigned,
        Payload::StreamingUnsignedTrailer => {
            sigv4::SignPayload::Literal(sigv4::STREAMING_UNSIGNED_TRAILER)
        }
        Payload::StreamingSigned { trailer: false } => {
            sigv4::SignPayload::Literal(sigv4::STREAMING_SIGNED)
        }
        Payload::StreamingSigned { trailer: true } => {
            sigv4::SignPayload::Literal(sigv4::STREAMING_SIGNED_TRAILER)
        }
    }
}

/// What the aws-chunked framing does with the body (`None`: not aws-chunked): checks it, or
/// re-signs each chunk chained from the `seed` signature, with the seed's own timestamp and
/// scope.
fn chunked_mode(
    name: &str,
    payload: &Payload,
    headers: &HeaderMap,
    secret_key: &SecretValue,
    region: &str,
    service: &str,
    seed: &str,
) -> Result<Option<aws_chunked::Mode>, CredentialError> {
    Ok(Some(match *payload {
        Payload::StreamingUnsignedTrailer => aws_chunked::Mode::Check,
        Payload::StreamingSigned { trailer } => {
            let stamp = headers
                .get("x-amz-date")
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| failed(name, "the signer set no x-amz-date"))?;
            let key = aws_chunked::signing_key(
                secret_key.expose(),
                stamp.get(..8).unwrap_or(stamp),
                region,
                service,
            );
            let signer = aws_chunked::ChunkSigner::new(key, stamp, region, service, seed);
            aws_chunked::Mode::Resign {
                signer: Box::new(signer),
                trailer,
            }
        }
        Payload::Classic | Payload::Unsigned => return Ok(None),
    }))
}

/// Whether the request carries presigned query authentication: `X-Amz-Signature` among the
/// query's parameter names as AWS decodes them (`form_urlencoded`, so `X%2DAmz%2DSignature`
/// counts), or anywhere in the raw query (a presigned URL nested in a value counts too:
/// refusing it is the safe side).
fn presigned(path_and_query: &str) -> bool {
    let Some((_, q)) = path_and_query.split_once('?') else {
        return false;
    };
    q.to_ascii_lowercase().contains("x-amz-signature=")
        || form_urlencoded::parse(q.as_bytes())
            .any(|(k, _)| k.eq_ignore_ascii_case("x-amz-signature"))
}

/// The payload form of an AWS request as the sandbox declared it, checked for consistency
/// with its framing headers.
struct PayloadForm {
    payload: Payload,
    /// The sandbox sent `x-amz-content-sha256` (so the upstream expects one).
    declared: bool,
    /// `x-amz-decoded-content-length`, which the aws-chunked data must add up to.
    decoded_length: Option<u64>,
}

impl PayloadForm {
    fn of(name: &str, headers: &HeaderMap) -> Result<PayloadForm, CredentialError> {
        let refuse = |why: String| CredentialError::BadRequest {
            name: name.to_string(),
            why,
        };
        let payload = Payload::declared(headers).map_err(refuse)?;
        let streaming = matches!(
            payload,
            Payload::StreamingUnsignedTrailer | Payload::StreamingSigned { .. }
        );
        let aws_chunked = headers
            .get_all(http::header::CONTENT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|c| c.trim().eq_ignore_ascii_case("aws-chunked"));
        // aws-chunked framing under a classic payload hash would be stored as the object.
        if aws_chunked && !streaming {
            return Err(refuse(
                "Content-Encoding aws-chunked needs a STREAMING-* x-amz-content-sha256".to_string(),
            ));
        }
        let mut lengths = headers.get_all("x-amz-decoded-content-length").iter();
        let decoded_length = match (lengths.next(), lengths.next()) {
            (None, _) => None,
            (Some(v), None) => Some(
                v.to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| {
                        refuse("x-amz-decoded-content-length is not a number".to_string())
                    })?,
            ),
            (Some(_), Some(_)) => {
                return Err(refuse(
                    "x-amz-decoded-content-length is sent more than once".to_string(),
                ))
            }
        };
        if decoded_length.is_some() && !streaming {
            return Err(refuse(
                "x-amz-decoded-content-length without a STREAMING-* x-amz-content-sha256"
                    .to_string(),
            ));
        }
        Ok(PayloadForm {
            payload,
            declared: headers.contains_key("x-amz-content-sha256"),
            decoded_length,
        })
    }
}

/// Calls STS AssumeRole with the base keys; the three temporary values come back packed in
/// one secret (`akid\nsecret\ntoken`) for the token cache.
async fn assume(
    name: &str,
    role: &AssumeRole,
    keys: &sigv4::Keys<'_>,
    transport: &dyn TokenTransport,
) -> Result<(SecretValue, Duration), CredentialError> {
    let call = sts::StsCall {
        rule: super::token_name(name),
        endpoint: &role.sts_endpoint,
        route: Route::default(),
        region: &role.sts_region,
    };
    let keys = sts::call(call, "AssumeRole", assume_form(role), Some(keys), transport)
        .await
        .map_err(|why| failed(name, why))?;
    let lifetime = keys
        .expiration
        .as_deref()
        .and_then(|e| humantime::parse_rfc3339_weak(e).ok())
        .and_then(|e| e.duration_since(SystemTime::now()).ok())
        .unwrap_or(role.duration);
    Ok((pack(&keys), lifetime))
}

/// The `AssumeRole` form for `role`.
pub(super) fn assume_form(role: &AssumeRole) -> String {
    let mut form = form_urlencoded::Serializer::new(String::new());
    form.append_pair("Action", "AssumeRole")
        .append_pair("Version", "2011-06-15")
        .append_pair("RoleArn", &role.role_arn)
        .append_pair("RoleSessionName", &role.session_name)
        .append_pair("DurationSeconds", &role.duration.as_secs().to_string());
    if let Some(x) = &role.external_id {
        form.append_pair("ExternalId", x);
    }
    form.finish()
}

/// The three temporary values of an STS answer, packed in one secret (`akid\nsecret\ntoken`).
fn pack(keys: &sts::AssumedKeys) -> SecretValue {
    let mut packed = Vec::with_capacity(
        keys.access_key_id.len() + keys.secret_access_key.len() + keys.session_token.len() + 2,
    );
    for (i, part) in [
        &keys.access_key_id,
        &keys.secret_access_key,
        &keys.session_token,
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            packed.push(b'\n');
        }
        packed.extend_from_slice(part.as_bytes());
    }
    SecretValue::new(packed)
}

fn unpack_keys(
    name: &str,
    packed: &SecretValue,
) -> Result<(SecretValue, SecretValue, SecretValue), CredentialError> {
    let mut parts = packed.expose().split(|&b| b == b'\n');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(a), Some(s), Some(t)) => Ok((
            SecretValue::new(a.to_vec()),
            SecretValue::new(s.to_vec()),
            SecretValue::new(t.to_vec()),
        )),
        _ => Err(failed(name, "cached role keys are malformed")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{HeaderName, HeaderValue};

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
    fn presigned_queries_are_found_in_any_spelling() {
        for pq in [
            "/b/k?X-Amz-Signature=abc",
            "/b/k?a=1&x-amz-signature=abc",
            "/b/k?X%2DAmz%2DSignature=abc",
            "/b/k?next=https://s3/o?X-Amz-Signature=abc",
        ] {
            assert!(presigned(pq), "{pq}");
        }
        for pq in ["/b/k", "/b/k?X-Amz-Signed=1", "/X-Amz-Signature=/k"] {
            assert!(!presigned(pq), "{pq}");
        }
    }

    #[test]
    fn payload_forms_are_read_and_contradictions_refused() {
        let form = |h: &[(&str, &str)]| PayloadForm::of("c", &headers(h));
        let ok = form(&[
            ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"),
            ("content-encoding", "gzip, aws-chunked"),
            ("x-amz-decoded-content-length", "42"),
        ])
        .expect("valid");
        assert_eq!(ok.payload, Payload::StreamingSigned { trailer: false });
        assert!(ok.declared);
        assert_eq!(ok.decoded_length, Some(42));
        assert!(!form(&[]).expect("classic").declared);
        let refused: &[&[(&str, &str)]] = &[
            &[(
                "x-amz-content-sha256",
                "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD",
            )],
            &[("x-amz-content-sha256", "abc")],
            &[
                ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
                ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
            ],
            &[("content-encoding", "aws-chunked")],
            &[
                ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
                ("content-encoding", "AWS-Chunked"),
            ],
            &[("x-amz-decoded-content-length", "5")],
            &[
                ("x-amz-content-sha256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"),
                ("x-amz-decoded-content-length", "-1"),
            ],
            &[
                ("x-amz-content-sha256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"),
                ("x-amz-decoded-content-length", "5"),
                ("x-amz-decoded-content-length", "5"),
            ],
        ];
        for h in refused {
            assert!(
                matches!(form(h), Err(CredentialError::BadRequest { .. })),
                "{h:?}"
            );
        }
    }
}

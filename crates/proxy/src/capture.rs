//! Token capture: a successful response from a token endpoint (a rule with `capture`) is read
//! whole, the named fields' values are kept by latchkey ([`Captured`]) and replaced by their
//! placeholders, so the sandbox never holds the real tokens. Requests that later carry a
//! placeholder get the real token on the hosts the capture binds (`pipeline::outgoing`).
//!
//! A 2xx response that cannot be read as JSON or a form (too large, another coding, another
//! format) is refused: it may hold tokens latchkey would pass on unreplaced.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE};
use http::Response;
use http_body_util::BodyExt;
use serde_json::Value;

use super::{body, Generation};
use std::sync::Arc;

use crate::policy::Capture;
use crate::reason::{Reason, Refusal};
use crate::secrets::captured::{Captured, MAX_LIFETIME};
use crate::secrets::placeholder::PREFIX;
use crate::secrets::SecretValue;
use crate::upstream::Body;

/// Largest token response read.
const MAX_TOKEN_RESPONSE: usize = 1024 * 1024;

/// What capture needs to know about the request (owned: it is held across awaits).
pub struct CaptureCx {
    pub capture: Capture,
    pub identity: String,
    pub host: String,
    pub tokens: Arc<Captured>,
    /// The policy in force: a captured value joins its secrets' redaction set.
    pub policy: Arc<Generation>,
    pub timeout: Duration,
}

/// Replaces the captured fields of a successful token response by placeholders; returns the
/// response and the names kept.
///
/// Guarantees: on `Ok`, no value of a captured field is in the body the sandbox gets, and each
/// is in the redaction set; non-2xx responses pass untouched. On `Err`, nothing was sent.
pub async fn capture(
    res: Response<Body>,
    cx: CaptureCx,
) -> Result<(Response<Body>, Vec<String>), Refusal> {
    if !res.status().is_success() {
        return Ok((res, Vec::new()));
    }
    let host = cx.host.clone();
    let fail = move |why: String| unreadable(&host, &why);
    if res
        .headers()
        .get(CONTENT_ENCODING)
        .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
    {
        return Err(fail("is in a content coding".into()));
    }
    let form = res
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/x-www-form-urlencoded")
        });
    let (mut parts, body) = res.into_parts();
    let bytes = match tokio::time::timeout(cx.timeout, read_whole(body)).await {
        Ok(Ok(b)) => b,
        Ok(Err(why)) => return Err(fail(why)),
        Err(_) => return Err(fail("did not arrive in time".into())),
    };
    let mut kept = Vec::new();
    let out = if form {
        capture_form(&bytes, &cx, &mut kept).await
    } else {
        capture_json(&bytes, &cx, &mut kept)
            .await
            .ok_or_else(|| fail("is neither a JSON object nor a form".into()))?
    };
    // The captured values may stand elsewhere too (a nested copy, a header): now that they are
    // in the redaction set, the whole answer is scrubbed once more.
    let out = if kept.is_empty() {
        out
    } else {
        let scrubber = cx
            .policy
            .secrets()
            .scrubber()
            .map_err(|e| fail(format!("cannot be scrubbed of its tokens ({e})")))?;
        match scrubber {
            Some(scrubber) => {
                super::scrub_body::filter_headers(&mut parts.headers, &scrubber);
                let (clean, found) = scrubber.scrub(&out);
                if found.is_empty() {
                    out
                } else {
                    Bytes::from(clean)
                }
            }
            None => out,
        }
    };
    parts.headers.remove(CONTENT_LENGTH);
    if let Ok(v) = HeaderValue::from_str(&out.len().to_string()) {
        parts.headers.insert(CONTENT_LENGTH, v);
    }
    Ok((Response::from_parts(parts, body::full(out)), kept))
}

/// The body, at most [`MAX_TOKEN_RESPONSE`] bytes (trailers dropped).
async fn read_whole(mut body: Body) -> Result<Bytes, String> {
    let mut buf = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("cannot be read: {e}"))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > MAX_TOKEN_RESPONSE {
                return Err("is over 1 MiB".into());
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

fn unreadable(host: &str, why: &str) -> Refusal {
    Refusal::new(
        Reason::UninspectableBody,
        format!("the token response from {host} {why}: latchkey cannot capture its tokens"),
    )
}

/// How long a captured field lives: its own `expires_in` (OAuth's for the access and ID
/// token, `FIELD_expires_in` or Keycloak's `refresh_expires_in` for a refresh token), else the
/// capture's `ttl`, else [`MAX_LIFETIME`].
fn lifetime(field: &str, get: impl Fn(&str) -> Option<u64>, ttl: Option<Duration>) -> Duration {
    let own = match field {
        "access_token" | "id_token" => get("expires_in"),
        "refresh_token" => get("refresh_token_expires_in").or_else(|| get("refresh_expires_in")),
        other => get(&format!("{other}_expires_in")),
    };
    own.map(Duration::from_secs).or(ttl).unwrap_or(MAX_LIFETIME)
}

/// Keeps `value` as the field's token and returns its placeholder.
async fn keep(cx: &CaptureCx, field: &str, value: &str, life: Duration) -> String {
    let name = cx.capture.secret_name(field);
    let secret = SecretValue::new(value.as_bytes().to_vec());
    // In the redaction set before anything can show it.
    cx.policy.secrets().set_minted(&name, &cx.identity, &secret);
    cx.tokens.put(&cx.identity, &name, secret, life).await;
    format!("__LATCHKEY_{name}__")
}

/// A value that is already a placeholder (an endpoint echoing what it was sent) is left.
fn capturable(v: &str) -> bool {
    !v.is_empty() && !v.as_bytes().starts_with(PREFIX)
}

async fn capture_json(bytes: &[u8], cx: &CaptureCx, kept: &mut Vec<String>) -> Option<Bytes> {
    let mut v: Value = serde_json::from_slice(bytes).ok()?;
    let found = {
        let obj = v.as_object()?;
        let number = |k: &str| {
            obj.get(k).and_then(|n| {
                n.as_u64()
                    .or_else(|| n.as_str().and_then(|s| s.trim().parse().ok()))
            })
        };
        let mut found = Vec::new();
        for field in &cx.capture.fields {
            if let Some(Value::String(s)) = obj.get(field) {
                if capturable(s) {
                    found.push((
                        field.clone(),
                        s.clone(),
                        lifetime(field, number, cx.capture.ttl),
                    ));
                }
            }
        }
        found
    };
    let obj = v.as_object_mut()?;
    for (field, value, life) in found {
        let placeholder = keep(cx, &field, &value, life).await;
        obj.insert(field.clone(), Value::String(placeholder));
        kept.push(cx.capture.secret_name(&field));
    }
    Some(Bytes::from(v.to_string()))
}

async fn capture_form(bytes: &[u8], cx: &CaptureCx, kept: &mut Vec<String>) -> Bytes {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(bytes).into_owned().collect();
    let lives: Vec<Option<Duration>> = {
        let number = |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| n == k)
                .and_then(|(_, v)| v.trim().parse().ok())
        };
        pairs
            .iter()
            .map(|(name, value)| {
                (cx.capture.fields.contains(name) && capturable(value))
                    .then(|| lifetime(name, number, cx.capture.ttl))
            })
            .collect()
    };
    let mut out_pairs = Vec::with_capacity(pairs.len());
    for ((name, value), life) in pairs.iter().zip(lives) {
        if let Some(life) = life {
            let placeholder = keep(cx, name, value, life).await;
            out_pairs.push((name.as_str(), placeholder));
            kept.push(cx.capture.secret_name(name));
        } else {
            out_pairs.push((name.as_str(), value.clone()));
        }
    }
    let mut out = form_urlencoded::Serializer::new(String::new());
    out.extend_pairs(out_pairs);
    Bytes::from(out.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_lives_as_long_as_the_response_says() {
        let get = |k: &str| match k {
            "expires_in" => Some(3600),
            "refresh_expires_in" => Some(86400),
            _ => None,
        };
        assert_eq!(
            lifetime("access_token", get, None),
            Duration::from_secs(3600)
        );
        assert_eq!(lifetime("id_token", get, None), Duration::from_secs(3600));
        assert_eq!(
            lifetime("refresh_token", get, None),
            Duration::from_secs(86400)
        );
        let ttl = Some(Duration::from_secs(60));
        assert_eq!(lifetime("session", get, ttl), Duration::from_secs(60));
        assert_eq!(lifetime("session", get, None), MAX_LIFETIME);
    }

    #[tokio::test]
    async fn json_and_form_token_responses_carry_placeholders_only() {
        let capture = Capture {
            name: "idp".into(),
            fields: vec!["access_token".into(), "refresh_token".into()],
            hosts: Vec::new(),
            ttl: None,
            cleartext: false,
        };
        let tokens = Arc::new(Captured::in_memory());
        let cx = CaptureCx {
            capture,
            identity: "ci".into(),
            host: "auth.test".into(),
            tokens: tokens.clone(),
            policy: Arc::new(
                Generation::first(
                    crate::policy::compile_sources_with(&[], crate::policy::SecretLoading::Skip)
                        .expect("empty policy"),
                    tokens.clone(),
                )
                .expect("no secrets"),
            ),
            timeout: Duration::from_secs(5),
        };
        let mut kept = Vec::new();
        let out = capture_json(
            br#"{"access_token":"at-0123456789","refresh_token":"rt-0123456789","expires_in":"60","token_type":"Bearer"}"#,
            &cx,
            &mut kept,
        )
        .await
        .expect("json");
        let v: Value = serde_json::from_slice(&out).expect("json out");
        assert_eq!(v["access_token"], "__LATCHKEY_idp_access_token__");
        assert_eq!(v["refresh_token"], "__LATCHKEY_idp_refresh_token__");
        assert_eq!(v["token_type"], "Bearer");
        assert_eq!(kept, ["idp_access_token", "idp_refresh_token"]);
        assert_eq!(
            tokens
                .get("ci", "idp_access_token")
                .await
                .map(|t| t.expose().to_vec()),
            Some(b"at-0123456789".to_vec())
        );
        assert!(capture_json(b"[1]", &cx, &mut kept).await.is_none());

        let mut kept = Vec::new();
        let out = capture_form(
            b"access_token=at-form-012345&expires_in=5&x=1",
            &cx,
            &mut kept,
        )
        .await;
        assert_eq!(
            &out[..],
            b"access_token=__LATCHKEY_idp_access_token__&expires_in=5&x=1"
        );
        assert_eq!(
            tokens
                .get("ci", "idp_access_token")
                .await
                .map(|t| t.expose().to_vec()),
            Some(b"at-form-012345".to_vec())
        );
    }
}

//! Placeholder substitution: `__LATCHKEY_<name>__` replaced by the secret's value in header
//! values (and inside `Basic` credentials), query values and a body held whole.
//!
//! Only placeholders the leak check found allowed reach here (their names and values come in
//! `values`); this module decides nothing. Rewritten headers are marked sensitive. Knows no
//! policy and no body type.

use std::collections::HashMap;

use base64::Engine;
use bytes::Bytes;
use http::header::{HeaderName, AUTHORIZATION};
use http::HeaderMap;

use super::inject::header_value;
use super::leak::basic_decoded;
use super::{placeholder, query, SecretValue};
use crate::reason::Refusal;

/// Replaces placeholders in header values and in the decoded `Basic` credentials (re-encoded).
/// Headers without one stay as they are.
pub fn headers(
    headers: &mut HeaderMap,
    values: &HashMap<String, SecretValue>,
) -> Result<(), Refusal> {
    // Only the headers that may hold one (a `Basic` value hides it in base64).
    let mut names: Vec<HeaderName> = headers
        .iter()
        .filter(|(name, v)| *name == AUTHORIZATION || placeholder::contains(v.as_bytes()))
        .map(|(name, _)| name.clone())
        .collect();
    names.dedup();
    for name in names {
        let mut replaced = Vec::new();
        let mut changed = false;
        for v in headers.get_all(&name) {
            let mut out = if placeholder::contains(v.as_bytes()) {
                changed = true;
                placeholder::replace(v.as_bytes(), values).to_vec()
            } else {
                v.as_bytes().to_vec()
            };
            if name == AUTHORIZATION {
                if let Some(decoded) = basic_decoded(v.as_bytes()) {
                    if placeholder::contains(&decoded) {
                        changed = true;
                        let inner = placeholder::replace(&decoded, values);
                        out = format!(
                            "Basic {}",
                            base64::engine::general_purpose::STANDARD.encode(&*inner)
                        )
                        .into_bytes();
                    }
                }
            }
            replaced.push(zeroize::Zeroizing::new(out));
        }
        if changed {
            headers.remove(&name);
            for v in replaced {
                headers.append(name.clone(), header_value(&v, &name)?);
            }
        }
    }
    Ok(())
}

/// Replaces placeholders in the query values of `path_and_query`, raw or percent-encoded; the
/// path and every other byte of the query stay as sent (see [`query::substitute`]).
pub fn query_in(path_and_query: &mut String, values: &HashMap<String, SecretValue>) {
    let (path, Some(q)) = query::split(path_and_query) else {
        return;
    };
    let new_q = query::substitute(q, values);
    *path_and_query = format!("{path}?{new_q}");
}

/// The length of `body` once its placeholders named in `values` are replaced.
pub fn replaced_len(body: &[u8], values: &HashMap<String, SecretValue>) -> usize {
    placeholder::find(body).iter().fold(body.len(), |len, f| {
        match f.name.as_ref().and_then(|n| values.get(n)) {
            Some(v) => len - (f.end - f.start) + v.len(),
            None => len,
        }
    })
}

/// `body` with its placeholders replaced, in one allocation of exactly `size` bytes (see
/// [`replaced_len`]), so the caller can charge the copy before making it.
pub fn replace_exact(body: &[u8], values: &HashMap<String, SecretValue>, size: usize) -> Bytes {
    let mut out = Vec::with_capacity(size);
    let mut last = 0;
    for f in placeholder::find(body) {
        if let Some(v) = f.name.as_ref().and_then(|n| values.get(n)) {
            out.extend_from_slice(&body[last..f.start]);
            out.extend_from_slice(v.expose());
            last = f.end;
        }
    }
    out.extend_from_slice(&body[last..]);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn values() -> HashMap<String, SecretValue> {
        let mut m = HashMap::new();
        m.insert(
            "k".to_string(),
            SecretValue::new(b"s3cr3t value/+".to_vec()),
        );
        m
    }

    #[test]
    fn basic_auth_placeholders_are_replaced_inside_the_encoding() {
        let mut h = HeaderMap::new();
        let enc = base64::engine::general_purpose::STANDARD.encode("user:__LATCHKEY_k__");
        h.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Basic {enc}")).expect("hv"),
        );
        headers(&mut h, &values()).expect("ok");
        let decoded = basic_decoded(h[AUTHORIZATION].as_bytes()).expect("basic");
        assert_eq!(&decoded[..], b"user:s3cr3t value/+");
        assert!(h[AUTHORIZATION].is_sensitive());
    }

    #[test]
    fn header_and_body_placeholders_are_replaced_exactly() {
        let mut h = HeaderMap::new();
        h.insert("x-key", HeaderValue::from_static("k=__LATCHKEY_k__"));
        h.insert("x-other", HeaderValue::from_static("plain"));
        headers(&mut h, &values()).expect("ok");
        assert_eq!(h["x-key"].as_bytes(), b"k=s3cr3t value/+");
        assert!(h["x-key"].is_sensitive() && !h["x-other"].is_sensitive());

        let body = b"{\"a\":\"__LATCHKEY_k__\",\"b\":\"__LATCHKEY_k__\"}";
        let size = replaced_len(body, &values());
        let out = replace_exact(body, &values(), size);
        assert_eq!(out.len(), size);
        assert_eq!(
            &out[..],
            b"{\"a\":\"s3cr3t value/+\",\"b\":\"s3cr3t value/+\"}"
        );

        let mut pq = "/p/__LATCHKEY_k__?q=__LATCHKEY_k__".to_string();
        query_in(&mut pq, &values());
        assert_eq!(pq, "/p/__LATCHKEY_k__?q=s3cr3t%20value%2F%2B");
    }
}

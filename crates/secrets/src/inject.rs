//! Injection: the sandbox's own credentials stripped, then the rule's headers, query parameters
//! and `Basic` credentials set from their templates, last before signing.
//!
//! Steps take plain data (header maps, templates, the store, names), never the policy. Every
//! value set is marked sensitive (kept out of HPACK tables and debug output); buffers that held
//! a secret are wiped. Refusal messages name headers and secrets, never values.

use std::collections::BTreeSet;

use base64::Engine;
use http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use http::HeaderMap;

use super::{query, SecretError, SecretStore, Template};
use crate::reason::{Reason, Refusal};

/// Headers a sandbox might use to carry its own credentials; stripped on injecting rules.
pub const AUTH_HEADERS: [&str; 6] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "cookie",
];

/// A secret could not be produced for injection.
pub fn unavailable(e: SecretError) -> Refusal {
    Refusal::new(Reason::SecretUnavailable, e.to_string())
}

/// `bytes` as a sensitive header value; refused when they cannot be one (control characters).
pub fn header_value(bytes: &[u8], name: &HeaderName) -> Result<HeaderValue, Refusal> {
    let mut hv = HeaderValue::from_bytes(bytes).map_err(|_| {
        Refusal::new(
            Reason::SecretUnavailable,
            format!("the value for header {name} is not valid in a header (control characters)"),
        )
    })?;
    hv.set_sensitive(true);
    Ok(hv)
}

/// Strips the sandbox's own credentials on a rule that injects: every [`AUTH_HEADERS`] name but
/// those the rule keeps, and every header the rule sets.
pub fn strip_auth(headers: &mut HeaderMap, keep: &[HeaderName], injected: &[HeaderName]) {
    for h in AUTH_HEADERS {
        if !keep.iter().any(|k| k == h) {
            headers.remove(h);
        }
    }
    for h in injected {
        headers.remove(h);
    }
}

/// Sets each header from its template (replacing what the sandbox sent). The secrets used are
/// added to `used`.
pub async fn headers(
    headers: &mut HeaderMap,
    templates: &[(HeaderName, Template)],
    store: &SecretStore,
    identity: &str,
    used: &mut BTreeSet<String>,
) -> Result<(), Refusal> {
    for (name, t) in templates {
        let v = t.render(store, identity).await.map_err(unavailable)?;
        headers.insert(name.clone(), header_value(&v, name)?);
        used.extend(t.secrets().map(str::to_string));
    }
    Ok(())
}

/// Sets each query parameter from its template: the sandbox's parameters of the same name go,
/// the others stay byte for byte (see [`query::with_injected`]).
pub async fn query_params(
    path_and_query: &mut String,
    templates: &[(String, Template)],
    store: &SecretStore,
    identity: &str,
    used: &mut BTreeSet<String>,
) -> Result<(), Refusal> {
    if templates.is_empty() {
        return Ok(());
    }
    let mut rendered = Vec::with_capacity(templates.len());
    for (k, t) in templates {
        rendered.push((
            k.as_str(),
            t.render(store, identity).await.map_err(unavailable)?,
        ));
        used.extend(t.secrets().map(str::to_string));
    }
    let pairs: Vec<(&str, &[u8])> = rendered.iter().map(|(k, v)| (*k, &v[..])).collect();
    let (path, q) = query::split(path_and_query);
    let q = query::with_injected(q, &pairs);
    *path_and_query = format!("{path}?{q}");
    Ok(())
}

/// Sets `Authorization: Basic` from the (user, password) templates.
pub async fn basic(
    headers: &mut HeaderMap,
    (user, password): &(Template, Template),
    store: &SecretStore,
    identity: &str,
    used: &mut BTreeSet<String>,
) -> Result<(), Refusal> {
    let mut creds = zeroize::Zeroizing::new(
        user.render(store, identity)
            .await
            .map_err(unavailable)?
            .to_vec(),
    );
    creds.push(b':');
    creds.extend_from_slice(
        &password
            .render(store, identity)
            .await
            .map_err(unavailable)?,
    );
    let encoded =
        zeroize::Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(&*creds));
    let value = zeroize::Zeroizing::new(format!("Basic {}", &*encoded));
    headers.insert(
        AUTHORIZATION,
        header_value(value.as_bytes(), &AUTHORIZATION)?,
    );
    used.extend(user.secrets().map(str::to_string));
    used.extend(password.secrets().map(str::to_string));
    Ok(())
}

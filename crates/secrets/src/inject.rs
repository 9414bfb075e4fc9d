//! Injection: the sandbox's own credentials stripped, then the rule's headers, query parameters,
//! `Basic` credentials and path prefix set from their templates, last before signing.
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

/// Whether `b` may stand in a URL path segment as it is (RFC 3986 `pchar` but `%`: unreserved,
/// sub-delims, `:` and `@`). A value needing percent-encoding is refused, not encoded: what the
/// upstream would decode it to is not what the secret holds.
pub fn path_segment_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b)
}

/// Why `value` cannot go into a URL path segment as it is, if it cannot.
pub fn path_segment_misfit(value: &[u8]) -> Result<(), String> {
    match value.iter().position(|b| !path_segment_byte(*b)) {
        None => Ok(()),
        Some(at) => Err(format!(
            "its value has a character not allowed in a URL path segment (at byte {at}; allowed: letters, digits and -._~!$&'()*+,;=:@), so it cannot be injected into the path"
        )),
    }
}

/// Prepends the rendered prefix to the path latchkey sends upstream: the sandbox's path (and
/// query) follows it unchanged. Each secret's value must fit a path segment as it is
/// ([`path_segment_misfit`]); so must `{{identity}}`. The policy checked the literal text.
pub async fn path_prefix(
    path_and_query: &mut String,
    template: &Template,
    store: &SecretStore,
    identity: &str,
    used: &mut BTreeSet<String>,
) -> Result<(), Refusal> {
    let prefix = template
        .render_where(store, identity, path_segment_misfit)
        .await
        .map_err(unavailable)?;
    // Literals were checked at load and secrets just now: what is left is the identity.
    if !prefix.iter().all(|b| *b == b'/' || path_segment_byte(*b)) {
        return Err(Refusal::new(
            Reason::SecretUnavailable,
            format!("the identity {identity:?} has a character not allowed in a URL path segment, so the path prefix cannot be built"),
        ));
    }
    // Only ASCII is left, so the bytes are the text.
    let prefix: String = prefix.iter().map(|b| char::from(*b)).collect();
    path_and_query.insert_str(0, &prefix);
    drop(zeroize::Zeroizing::new(prefix));
    used.extend(template.secrets().map(str::to_string));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &tempfile::TempDir, value: &str) -> SecretStore {
        let path = dir.path().join("tg");
        std::fs::write(&path, value).expect("write");
        SecretStore::load(vec![("tg".into(), crate::Source::File(path))]).expect("load")
    }

    #[tokio::test]
    async fn a_path_prefix_goes_in_front_of_the_path_and_query_as_sent() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = store(&dir, "123456:AAH-token_value~x\n");
        let t = Template::parse("/bot{{secret.tg}}").expect("parse");
        let mut pq = "/sendMessage?chat_id=1".to_string();
        let mut used = BTreeSet::new();
        path_prefix(&mut pq, &t, &store, "ci", &mut used)
            .await
            .expect("prefix");
        assert_eq!(pq, "/bot123456:AAH-token_value~x/sendMessage?chat_id=1");
        assert!(used.contains("tg"));
    }

    #[tokio::test]
    async fn a_value_that_does_not_fit_a_path_segment_is_refused_naming_the_secret_only() {
        let dir = tempfile::tempdir().expect("tmp");
        for value in [
            "tok/en-0123456789",
            "tok en-0123456789",
            "tok%2Fen-0123456",
            "tok?en=0123456789",
            "tök-0123456789",
        ] {
            let store = store(&dir, value);
            let t = Template::parse("/bot{{secret.tg}}").expect("parse");
            let mut pq = "/sendMessage".to_string();
            let r = path_prefix(&mut pq, &t, &store, "ci", &mut BTreeSet::new())
                .await
                .expect_err(value);
            assert_eq!(r.reason, Reason::SecretUnavailable);
            assert!(
                r.message.contains("\"tg\"") && r.message.contains("URL path segment"),
                "{}",
                r.message
            );
            assert!(!r.message.contains(value), "{}", r.message);
            assert_eq!(pq, "/sendMessage", "nothing was changed");
        }
    }

    #[tokio::test]
    async fn an_identity_that_does_not_fit_the_path_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = store(&dir, "0123456789abcdef");
        let t = Template::parse("/{{identity}}/{{secret.tg}}").expect("parse");
        let mut pq = "/x".to_string();
        let r = path_prefix(&mut pq, &t, &store, "a b", &mut BTreeSet::new())
            .await
            .expect_err("identity");
        assert_eq!(r.reason, Reason::SecretUnavailable);
        assert_eq!(pq, "/x");
    }
}

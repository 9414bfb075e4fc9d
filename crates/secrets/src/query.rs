//! Query strings as the brokering steps handle them: split into raw pairs that are kept byte for
//! byte, edited (placeholders replaced, parameters injected) without re-encoding what is not
//! edited, and compared by name the way the upstream will decode them.
//!
//! Why not `form_urlencoded` throughout: its parser decodes every pair (lossily: bytes that are
//! not UTF-8 become U+FFFD) and its serializer re-encodes them (`%20` as `+`, `~` as `%7E`), so
//! an untouched pair would reach the upstream in other bytes than the sandbox sent — which a
//! signed request (SigV4's canonical query) or a server comparing raw bytes sees as a different
//! request — and a secret value that is not UTF-8 would no longer be found. It is used where the
//! decoded *name* is all that matters ([`name_is`]). Values latchkey writes are percent-encoded
//! (RFC 3986 unreserved characters kept): every decoder reads that alike, which is not true of
//! form encoding's `+`.
//!
//! Depends on nothing in the crate but `secrets` itself.

use std::borrow::Cow;
use std::collections::HashMap;

use percent_encoding::{percent_decode, AsciiSet, NON_ALPHANUMERIC};

use super::placeholder;
use super::SecretValue;

/// Unreserved characters stay as they are in query values latchkey writes; everything else is
/// percent-encoded.
pub const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One `&`-separated piece of a query, as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawPair<'a> {
    /// The whole piece.
    pub raw: &'a str,
    /// Before the first `=` (the whole piece when there is none).
    pub name: &'a str,
    /// After the first `=`; `None` when there is none.
    pub value: Option<&'a str>,
}

/// Every `&`-separated piece of `query`, empty ones included (callers that edit a query keep
/// them, so the bytes around an edit stay as sent).
pub fn raw_pairs(query: &str) -> impl Iterator<Item = RawPair<'_>> {
    query.split('&').map(|raw| match raw.split_once('=') {
        Some((name, value)) => RawPair {
            raw,
            name,
            value: Some(value),
        },
        None => RawPair {
            raw,
            name: raw,
            value: None,
        },
    })
}

/// Splits a path-and-query at the first `?`.
pub fn split(path_and_query: &str) -> (&str, Option<&str>) {
    match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    }
}

/// Whether a raw parameter name means `key` to the upstream: percent-decoded, or decoded as a
/// form (`+` as a space). Either reading counts, so a parameter the upstream may take for
/// `key` is always recognised.
pub fn name_is(raw_name: &str, key: &str) -> bool {
    if raw_name == key {
        return true;
    }
    if percent_decode(raw_name.as_bytes()).decode_utf8_lossy() == key {
        return true;
    }
    raw_name.contains('+')
        && form_urlencoded::parse(raw_name.as_bytes())
            .next()
            .is_some_and(|(name, _)| name == key)
}

/// Every non-empty parameter of `query` as the upstream decodes it: name and value
/// percent-decoded (bytes that are not UTF-8 become U+FFFD), and with `form` also `+` read as a
/// space first (`application/x-www-form-urlencoded`). A parameter without `=` has the empty
/// value. Upstreams differ on `+`, so a caller that must agree with all of them checks both
/// readings.
pub fn decoded_pairs(
    query: &str,
    form: bool,
) -> impl Iterator<Item = (Cow<'_, str>, Cow<'_, str>)> {
    raw_pairs(query)
        .filter(|p| !p.raw.is_empty())
        .map(move |p| (decode(p.name, form), decode(p.value.unwrap_or(""), form)))
}

/// One raw query name or value as the upstream decodes it (see [`decoded_pairs`]).
fn decode(raw: &str, form: bool) -> Cow<'_, str> {
    if form && raw.contains('+') {
        let spaced = raw.replace('+', " ");
        Cow::Owned(
            percent_decode(spaced.as_bytes())
                .decode_utf8_lossy()
                .into_owned(),
        )
    } else {
        percent_decode(raw.as_bytes()).decode_utf8_lossy()
    }
}

/// `raw` percent-decoded, with the offset in `raw` where each decoded byte starts (and
/// `raw.len()` last): what lets an edit of the decoded bytes touch only their raw bytes.
fn decode_mapped(raw: &[u8]) -> (Vec<u8>, Vec<usize>) {
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut decoded = Vec::with_capacity(raw.len());
    let mut starts = Vec::with_capacity(raw.len() + 1);
    let mut i = 0;
    while i < raw.len() {
        starts.push(i);
        if raw[i] == b'%' {
            if let (Some(h), Some(l)) = (
                raw.get(i + 1).copied().and_then(hex),
                raw.get(i + 2).copied().and_then(hex),
            ) {
                // Two hex digits: always below 256.
                decoded.push(u8::try_from(h * 16 + l).unwrap_or(b'%'));
                i += 3;
                continue;
            }
        }
        decoded.push(raw[i]);
        i += 1;
    }
    starts.push(raw.len());
    (decoded, starts)
}

/// `value` (a raw query value) with each placeholder named in `values` — as sent or
/// percent-encoded — replaced by its secret, percent-encoded; `None` when there is none to
/// replace. Every byte outside a replaced placeholder stays as sent.
fn substitute_value(value: &str, values: &HashMap<String, SecretValue>) -> Option<String> {
    let raw = value.as_bytes();
    let (decoded, starts) = decode_mapped(raw);
    if !placeholder::contains(&decoded) {
        return None;
    }
    let mut out = String::with_capacity(raw.len());
    let mut last = 0;
    let mut replaced = false;
    for f in placeholder::find(&decoded) {
        let Some(v) = f.name.as_ref().and_then(|n| values.get(n)) else {
            continue;
        };
        let (start, end) = (starts[f.start], starts[f.end]);
        out.push_str(&value[last..start]);
        out.extend(percent_encoding::percent_encode(v.expose(), QUERY_VALUE));
        last = end;
        replaced = true;
    }
    if !replaced {
        return None;
    }
    out.push_str(&value[last..]);
    Some(out)
}

/// `query` with the placeholders in its values replaced (see [`substitute_value`]). Pairs
/// without one, and every `&` and empty piece, stay byte for byte. A placeholder in a name is
/// left alone: the leak check refuses those before anything is replaced.
pub fn substitute(query: &str, values: &HashMap<String, SecretValue>) -> String {
    let mut out = String::with_capacity(query.len());
    for (i, pair) in raw_pairs(query).enumerate() {
        if i > 0 {
            out.push('&');
        }
        match pair.value.and_then(|v| substitute_value(v, values)) {
            Some(v) => {
                out.push_str(pair.name);
                out.push('=');
                out.push_str(&v);
            }
            None => out.push_str(pair.raw),
        }
    }
    out
}

/// A query with `injected` parameters set: the sandbox's pairs named like one of them (as the
/// upstream may decode the name, see [`name_is`]) and empty pieces are dropped, the others kept
/// byte for byte, then each injected `name=value` appended, both percent-encoded.
pub fn with_injected(query: Option<&str>, injected: &[(&str, &[u8])]) -> String {
    let mut out = String::new();
    let kept = query
        .into_iter()
        .flat_map(raw_pairs)
        .filter(|p| !p.raw.is_empty())
        .filter(|p| !injected.iter().any(|(k, _)| name_is(p.name, k)));
    for pair in kept {
        if !out.is_empty() {
            out.push('&');
        }
        out.push_str(pair.raw);
    }
    for (name, value) in injected {
        if !out.is_empty() {
            out.push('&');
        }
        out.extend(percent_encoding::utf8_percent_encode(name, QUERY_VALUE));
        out.push('=');
        out.extend(percent_encoding::percent_encode(value, QUERY_VALUE));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn values() -> HashMap<String, SecretValue> {
        let mut m = HashMap::new();
        m.insert(
            "k".to_string(),
            SecretValue::new(b"s3cr3t value/+".to_vec()),
        );
        m
    }

    #[test]
    fn query_placeholders_are_replaced_raw_and_percent_encoded() {
        let q = "a=1&key=__LATCHKEY_k__&b=%5F%5FLATCHKEY_k%5F%5F&c=x%20y";
        assert_eq!(
            substitute(q, &values()),
            "a=1&key=s3cr3t%20value%2F%2B&b=s3cr3t%20value%2F%2B&c=x%20y"
        );
    }

    #[test]
    fn only_the_placeholder_bytes_of_a_value_change() {
        let q = "&x=Bearer+%41__LATCHKEY_k__%7e!&&y";
        assert_eq!(
            substitute(q, &values()),
            "&x=Bearer+%41s3cr3t%20value%2F%2B%7e!&&y"
        );
        // An unknown name is left as sent (the leak check refuses it first).
        assert_eq!(
            substitute("a=__LATCHKEY_other__", &values()),
            "a=__LATCHKEY_other__"
        );
    }

    #[test]
    fn injected_parameters_replace_the_sandboxs_under_either_decoding() {
        let q = Some("keep=%7e+&api%5Fkey=mine&&api+key=x&other=1");
        let out = with_injected(q, &[("api_key", b"v a/l"), ("api key", b"w")]);
        assert_eq!(out, "keep=%7e+&other=1&api_key=v%20a%2Fl&api%20key=w");
        assert_eq!(with_injected(None, &[("k", b"v")]), "k=v");
        assert!(name_is("a%2Bb", "a+b") && name_is("a+b", "a b") && !name_is("ab", "a"));
    }

    /// A query piece: plain, escaped, form-encoded, or holding a placeholder.
    fn piece() -> impl Strategy<Value = String> {
        let plain = "[a-zA-Z0-9%+=~._!*-]{0,12}";
        prop_oneof![
            plain.prop_map(|s| s),
            (plain, plain).prop_map(|(a, b)| format!("{a}={b}")),
            (plain, plain, prop::bool::ANY).prop_map(|(a, b, enc)| {
                let p = if enc {
                    "%5F%5FLATCHKEY_k%5F%5F"
                } else {
                    "__LATCHKEY_k__"
                };
                format!("{}={b}{p}{b}", a.replace('=', ""))
            }),
        ]
    }

    proptest! {
        /// Parse, substitute, join: every piece without a placeholder comes back byte for byte,
        /// and a piece with one keeps its name and the bytes around the placeholder.
        #[test]
        fn substitution_keeps_untouched_pairs_byte_for_byte(
            pieces in prop::collection::vec(piece(), 0..8)
        ) {
            let query = pieces.join("&");
            let out = substitute(&query, &values());
            let before: Vec<&str> = query.split('&').collect();
            let after: Vec<&str> = out.split('&').collect();
            prop_assert_eq!(before.len(), after.len());
            for (b, a) in before.iter().zip(&after) {
                let pair = raw_pairs(b).next().expect("one piece");
                let (decoded, _) = decode_mapped(pair.value.unwrap_or_default().as_bytes());
                if pair.value.is_none() || !placeholder::contains(&decoded) {
                    prop_assert_eq!(b, a);
                } else {
                    prop_assert!(a.starts_with(&format!("{}=", pair.name)), "{} -> {}", b, a);
                    prop_assert!(!placeholder::contains(a.as_bytes()), "{} -> {}", b, a);
                    prop_assert!(a.contains("s3cr3t%20value%2F%2B"), "{} -> {}", b, a);
                }
            }
        }
    }
}

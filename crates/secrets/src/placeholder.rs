//! Placeholders: `__LATCHKEY_<name>__` stands in for a secret where an SDK insists on a key.
//!
//! This module only finds and replaces them in bytes; the pipeline decides where they are
//! allowed (a rule that binds the secret, a place the rule enables).

use std::collections::HashMap;

use super::template::valid_name;
use super::SecretValue;

pub const PREFIX: &[u8] = b"__LATCHKEY_";
const SUFFIX: &[u8] = b"__";

/// Where a placeholder was found in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Place {
    Header,
    BasicAuth,
    Query,
    Body,
    /// A text or binary WebSocket message toward the upstream.
    WebSocket,
    /// The URL path: never a place a secret may go.
    Path,
}

impl Place {
    pub fn as_str(self) -> &'static str {
        match self {
            Place::Header => "header",
            Place::BasicAuth => "basic_auth",
            Place::Query => "query",
            Place::Body => "body",
            Place::WebSocket => "websocket",
            Place::Path => "path",
        }
    }

    /// Parses a policy `placeholders` entry (the path is never enabled).
    pub fn parse(s: &str) -> Option<Place> {
        match s {
            "header" => Some(Place::Header),
            "basic_auth" => Some(Place::BasicAuth),
            "query" => Some(Place::Query),
            "body" => Some(Place::Body),
            "websocket" => Some(Place::WebSocket),
            _ => None,
        }
    }
}

/// One placeholder occurrence: its byte range and the name it carries (`None` when the text
/// after the prefix is not a well-formed name: such a request is refused all the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub start: usize,
    pub end: usize,
    pub name: Option<String>,
}

/// The longest name a placeholder may carry (as secret names).
const MAX_NAME: usize = 64;

/// The prefix searcher, built once: `memmem` (SIMD where the CPU has it) rather than a
/// byte-by-byte `windows()` scan, since every header value, query and held body is searched.
static PREFIX_FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(PREFIX));
static SUFFIX_FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(SUFFIX));

fn find_from(hay: &[u8], from: usize) -> Option<usize> {
    PREFIX_FINDER.find(hay.get(from..)?).map(|i| i + from)
}

/// Every placeholder in `hay`, in order.
pub fn find(hay: &[u8]) -> Vec<Found> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(start) = find_from(hay, pos) {
        let name_start = start + PREFIX.len();
        let tail = &hay[name_start..];
        // The suffix is looked for only where a name can end: a prefix with no suffix after it
        // costs a bounded look, not a scan of the rest of the input.
        let end_rel = SUFFIX_FINDER.find(&tail[..tail.len().min(MAX_NAME + SUFFIX.len())]);
        match end_rel {
            Some(i) => {
                let name = std::str::from_utf8(&tail[..i])
                    .ok()
                    .filter(|n| valid_name(n))
                    .map(str::to_string);
                let end = name_start + i + SUFFIX.len();
                out.push(Found { start, end, name });
                pos = end;
            }
            None => {
                out.push(Found {
                    start,
                    end: name_start,
                    name: None,
                });
                pos = name_start;
            }
        }
    }
    out
}

/// Whether `hay` holds the placeholder prefix at all (cheap pre-check).
pub fn contains(hay: &[u8]) -> bool {
    find_from(hay, 0).is_some()
}

/// Whether `hay` holds the placeholder prefix in any letter case (`contains` of its
/// upper-cased copy, without making the copy).
pub fn contains_ignore_ascii_case(hay: &[u8]) -> bool {
    hay.windows(PREFIX.len())
        .any(|w| w.eq_ignore_ascii_case(PREFIX))
}

/// Replaces every placeholder whose name is in `values`; others are left (callers refuse
/// requests holding those before calling this).
pub fn replace(hay: &[u8], values: &HashMap<String, SecretValue>) -> zeroize::Zeroizing<Vec<u8>> {
    let mut out = zeroize::Zeroizing::new(Vec::with_capacity(hay.len()));
    let mut last = 0;
    for f in find(hay) {
        if let Some(v) = f.name.as_ref().and_then(|n| values.get(n)) {
            out.extend_from_slice(&hay[last..f.start]);
            out.extend_from_slice(v.expose());
            last = f.end;
        }
    }
    out.extend_from_slice(&hay[last..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contains_ignore_ascii_case_agrees_with_the_upper_cased_copy() {
        for hay in [
            &b""[..],
            b"__latchkey_x__",
            b"x-__LaTcHkEy_",
            b"__latchke",
            b"_-latchkey_",
            b"a__LATCHKEY_b",
            b"\xff__lAtchkey_\xfe",
        ] {
            assert_eq!(
                contains_ignore_ascii_case(hay),
                contains(&hay.to_ascii_uppercase()),
                "{hay:?}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn contains_ignore_ascii_case_matches_any_spelling(hay in "[_lLaAtTcChHkKeEyY\\-]{0,40}") {
            proptest::prop_assert_eq!(
                contains_ignore_ascii_case(hay.as_bytes()),
                contains(&hay.as_bytes().to_ascii_uppercase())
            );
        }
    }

    #[test]
    fn finds_names_and_malformed_placeholders() {
        let f = find(b"Bearer __LATCHKEY_openai__ and __LATCHKEY_my_key__ x __LATCHKEY_");
        let names: Vec<Option<&str>> = f.iter().map(|f| f.name.as_deref()).collect();
        assert_eq!(names, [Some("openai"), Some("my_key"), None]);
        assert!(find(b"__LATCHKEY_bad name__")[0].name.is_none());
    }

    #[test]
    fn replaces_known_names_only() {
        let mut m = HashMap::new();
        m.insert("a".to_string(), SecretValue::new(b"VALUE-AAAA".to_vec()));
        let out = replace(b"x=__LATCHKEY_a__&y=__LATCHKEY_b__", &m);
        assert_eq!(&out[..], b"x=VALUE-AAAA&y=__LATCHKEY_b__");
    }
}

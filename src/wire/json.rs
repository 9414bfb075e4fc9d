//! JSON texts that parsers read differently.
//!
//! An object with one key twice (`{"env":"production","env":"staging"}`) has no single
//! meaning: most parsers keep the last value, some the first, some refuse it. Keys that differ
//! only in case or a trailing NUL collide too in parsers that match keys loosely (Go's
//! `encoding/json` folds case, Unicode included: `ſ` is `s`, `K` is `k`; some SDKs drop a
//! trailing `\u0000`). A person shown one reading of such a body may approve another.
//!
//! [`ambiguity`] finds the first collision, at any depth, in every value of the text (a body
//! may hold several, as NDJSON does). It says nothing of text that is not JSON: callers that
//! show a body show it as sent.

use std::collections::HashMap;
use std::fmt;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// The longest key quoted in a message; a longer one is described by its length (a key may
/// hold anything the sandbox sent, and a cut one could hide part of a secret from scrubbing).
const QUOTED_KEY: usize = 64;

/// How two keys of one object collide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collision {
    /// Where the object is, as a JSONPath (`$`, `$.params`, `$[2].a`).
    pub at: String,
    pub first: String,
    pub second: String,
}

impl fmt::Display for Collision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b) = (quoted(&self.first), quoted(&self.second));
        if self.first == self.second {
            write!(f, "key {a} appears twice in the object at {}", self.at)
        } else {
            write!(
                f,
                "keys {a} and {b} in the object at {} are one key to parsers that ignore case or a trailing NUL",
                self.at
            )
        }
    }
}

fn quoted(key: &str) -> String {
    if key.chars().count() <= QUOTED_KEY {
        format!("{key:?}")
    } else {
        format!("(a key of {} bytes)", key.len())
    }
}

/// Why a JSON text has more than one reading: two keys of one object that collide, or nesting
/// too deep to check (a parser with a higher limit reads what this one cannot see). `None`:
/// every value parsed has one reading, or the text is not JSON from the first byte that is
/// not (what comes before it was checked).
pub fn ambiguity(bytes: &[u8]) -> Option<String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let mut index = 0usize;
    loop {
        let at = if index == 0 {
            "$".to_string()
        } else {
            format!("$ (value {} of the text)", index + 1)
        };
        match (Walk { at: &at }).deserialize(&mut de) {
            Ok(()) => {}
            Err(e) if e.is_data() => return Some(e.to_string()),
            Err(e) if e.to_string().starts_with("recursion limit exceeded") => {
                return Some(format!(
                    "it nests deeper than latchkey checks ({e}): a parser that reads deeper may see keys that collide"
                ));
            }
            Err(_) => return None,
        }
        if de.end().is_ok() {
            return None;
        }
        index += 1;
    }
}

/// A key as loose parsers compare it: trailing NULs dropped, then Unicode case folded (each
/// character upper-cased then lower-cased, so `ſ` and `S` both become `s`, `K` becomes `k`).
fn folded(key: &str) -> String {
    key.trim_end_matches('\0')
        .chars()
        .flat_map(char::to_uppercase)
        .flat_map(char::to_lowercase)
        .collect()
}

/// Walks one value, failing (with a [`Collision`] as the message) on colliding keys.
struct Walk<'a> {
    at: &'a str,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0usize;
        loop {
            let at = format!("{}[{i}]", self.at);
            if seq.next_element_seed(Walk { at: &at })?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen: HashMap<String, String> = HashMap::new();
        while let Some(key) = map.next_key::<String>()? {
            if let Some(first) = seen.insert(folded(&key), key.clone()) {
                return Err(serde::de::Error::custom(Collision {
                    at: self.at.to_string(),
                    first,
                    second: key,
                }));
            }
            let at = if key.chars().count() <= QUOTED_KEY {
                format!("{}.{key}", self.at)
            } else {
                format!("{}.(a key of {} bytes)", self.at, key.len())
            };
            map.next_value_seed(Walk { at: &at })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn duplicate_keys_at_any_depth_are_found_and_named() {
        for (text, want) in [
            (
                r#"{"env":"production","env":"staging"}"#,
                r#"key "env" appears twice in the object at $"#,
            ),
            (
                r#"{"a":[1,{"b":{"x":1,"y":2,"x":3}}]}"#,
                r#"key "x" appears twice in the object at $.a[1].b"#,
            ),
            (
                r#"{"env":"production","ENV":"staging"}"#,
                r#"keys "env" and "ENV" in the object at $ are one key"#,
            ),
            (
                r#"{"name":1,"name\u0000":2}"#,
                r#"keys "name" and "name\0""#,
            ),
            // The long s and the Kelvin sign fold to `s` and `k`.
            (r#"{"ask":1,"a\u017fk":2}"#, "are one key"),
            (r#"{"key":1,"\u212aey":2}"#, "are one key"),
            // Escapes are undone before keys are compared.
            (r#"{"env":1,"\u0065nv":2}"#, r#"key "env" appears twice"#),
            // Every value of a text that holds several (NDJSON).
            (
                "{\"a\":1}\n{\"b\":1,\"b\":2}\n",
                "appears twice in the object at $ (value 2 of the text)",
            ),
        ] {
            let found = ambiguity(text.as_bytes()).unwrap_or_default();
            assert!(found.contains(want), "{text}: {found}");
        }
    }

    #[test]
    fn unambiguous_json_and_text_that_is_not_json_pass() {
        for text in [
            r#"{"env":"production","Env2":"x","a":{"env":1}}"#,
            r#"[{"a":1},{"a":2}]"#,
            "{\"a\":1}\n{\"a\":1}\n",
            "not json",
            r#"{"a":1,"#,
            "",
            "   ",
        ] {
            assert_eq!(ambiguity(text.as_bytes()), None, "{text}");
        }
    }

    #[test]
    fn nesting_past_the_parser_limit_is_ambiguous() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let found = ambiguity(deep.as_bytes()).unwrap_or_default();
        assert!(found.contains("nests deeper"), "{found}");
    }

    #[test]
    fn a_long_key_is_described_not_quoted() {
        let key = "k".repeat(100);
        let text = format!(r#"{{"{key}":1,"{key}":2}}"#);
        let found = ambiguity(text.as_bytes()).unwrap_or_default();
        assert!(found.contains("(a key of 100 bytes)"), "{found}");
        assert!(!found.contains(&key), "{found}");
    }

    proptest! {
        /// Any object built from distinct folded keys passes; the same object with one key
        /// repeated (as sent, or re-cased) is ambiguous, wherever it is nested.
        #[test]
        fn a_repeated_key_is_always_found(
            keys in proptest::collection::btree_set("[a-z]{1,6}", 1..6),
            pick in any::<prop::sample::Index>(),
            upper in any::<bool>(),
            depth in 0usize..4,
        ) {
            let keys: Vec<&String> = keys.iter().collect();
            let fields: Vec<String> = keys.iter().map(|k| format!("{k:?}:1")).collect();
            let wrap = |inner: String| {
                (0..depth).fold(inner, |acc, d| if d % 2 == 0 { format!("[{acc}]") } else { format!("{{\"w\":{acc}}}") })
            };
            let clean = wrap(format!("{{{}}}", fields.join(",")));
            prop_assert_eq!(ambiguity(clean.as_bytes()), None);
            let again = pick.get(&keys);
            let again = if upper { again.to_uppercase() } else { again.to_string() };
            let dup = wrap(format!("{{{},{again:?}:2}}", fields.join(",")));
            prop_assert!(ambiguity(dup.as_bytes()).is_some(), "{}", dup);
        }

        /// Arbitrary bytes never panic the check.
        #[test]
        fn any_bytes_are_checked_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = ambiguity(&bytes);
        }
    }
}

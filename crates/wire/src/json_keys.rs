//! JSON object keys as the loosest mainstream parser reads them.
//!
//! Two keys of one object are *ambiguous* when some parser a server may use takes them for
//! the same key: exactly equal (serde_json keeps the last, others the first), equal ignoring
//! ASCII case, equal under Unicode case folding (Go's `encoding/json` matches struct fields
//! this way: `ſ` is `s`, the Kelvin sign `K` is `k`), or equal once trailing NULs are dropped
//! (some SDK versions stop at a NUL). [`canonical_key`] maps a key to one form for all of
//! these; a reader that must agree with every such server looks keys up by that form
//! ([`get`]) and refuses a document where two keys of one object share it
//! ([`check_unambiguous`]).
//!
//! Folding is Unicode full case folding (the `unicase` crate): it joins every pair simple
//! folding (Go's) joins, and a few more (`ß` and `ss`); refusing those too errs on the safe
//! side.
//!
//! [`ambiguity`] is the same check over a text that may hold several values (NDJSON) and that
//! may not be JSON at all (an approval preview shows such a body as sent): it finds the first
//! collision, at any depth, naming where it is as a JSONPath.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use unicase::UniCase;

/// The form under which loose parsers cannot tell keys apart: trailing NULs dropped, then
/// case-folded.
pub fn canonical_key(key: &str) -> Cow<'_, str> {
    let key = key.trim_end_matches('\0');
    if key.is_ascii() {
        if key.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(key.to_ascii_lowercase())
        } else {
            Cow::Borrowed(key)
        }
    } else {
        Cow::Owned(UniCase::new(key).to_folded_case())
    }
}

/// The value of `key` in `obj`, matched as a loose parser would (by [`canonical_key`]).
///
/// Assumes: the document passed [`check_unambiguous`], so at most one key matches.
pub fn get<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    let want = canonical_key(key);
    obj.iter()
        .find(|(k, _)| canonical_key(k) == want)
        .map(|(_, v)| v)
}

/// [`get`], mutably.
pub fn get_mut<'a>(obj: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Value> {
    let want = canonical_key(key);
    obj.iter_mut()
        .find(|(k, _)| canonical_key(k) == want)
        .map(|(_, v)| v)
}

/// [`get`] on a value that may not be an object.
pub fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.as_object().and_then(|o| get(o, key))
}

/// Checks that `bytes` are one JSON value in which no object, at any depth, has two keys with
/// the same [`canonical_key`] (escapes are undone first: `"n\u0061me"` is `name`).
///
/// Errors: not JSON (serde_json's message), or which two keys of one object are ambiguous and
/// where ([`Collision`]).
pub fn check_unambiguous(bytes: &[u8]) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    (Walk { at: "$" })
        .deserialize(&mut de)
        .map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())
}

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
            write!(
                f,
                "ambiguous: key {a} appears twice in the object at {}",
                self.at
            )
        } else {
            write!(
                f,
                "ambiguous: keys {a} and {b} in the object at {} are one key to parsers that ignore case or a trailing NUL",
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
            if let Some(first) = seen.insert(canonical_key(&key).into_owned(), key.clone()) {
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
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_folds_loose_parsers_apply_are_one_key() {
        for (a, b) in [
            ("name", "Name"),
            ("name", "NAME"),
            ("arguments", "argumentſ"),
            ("params", "paramſ"),
            ("ſ", "S"),
            ("kind", "\u{212A}ind"),
            ("name", "name\0"),
            ("name", "Name\0\0"),
            ("method", "METHOD"),
            ("straße", "STRASSE"),
            ("ΣΊΣΥΦΟΣ", "σίσυφος"),
        ] {
            assert_eq!(canonical_key(a), canonical_key(b), "{a:?} {b:?}");
        }
        for (a, b) in [("name", "names"), ("name", "\0name"), ("repo", "rep o")] {
            assert_ne!(canonical_key(a), canonical_key(b), "{a:?} {b:?}");
        }
        assert!(matches!(canonical_key("params"), Cow::Borrowed(_)));
    }

    #[test]
    fn ambiguous_objects_are_refused_at_any_depth_with_both_keys_named() {
        for (doc, keys) in [
            (r#"{"name":1,"Name":2}"#, ["\"name\"", "\"Name\""]),
            (
                r#"{"a":[{"x":{"repo":1,"Repo":2}}]}"#,
                ["\"repo\"", "\"Repo\""],
            ),
            (
                r#"{"params":1,"param\u017F":2}"#,
                ["\"params\"", "\"paramſ\""],
            ),
            (r#"{"name":1,"name\u0000":2}"#, ["\"name\"", "\"name\\0\""]),
        ] {
            let e = check_unambiguous(doc.as_bytes()).expect_err(doc);
            assert!(keys.iter().all(|k| e.contains(k)), "{doc}: {e}");
        }
        let e = check_unambiguous(br#"{"a":1,"a":2}"#).expect_err("duplicate");
        assert!(e.contains("appears twice"), "{e}");
        assert!(check_unambiguous(br#"{"a":{"b":1},"c":[{"b":2,"B2":3}]}"#).is_ok());
        assert!(check_unambiguous(b"{} x").is_err());
        let v: Value =
            serde_json::from_str(r#"{"METHOD":"x","Params":{"NAME":"t"}}"#).expect("json");
        let params = field(&v, "params").expect("params");
        assert_eq!(field(params, "name"), Some(&Value::from("t")));
        assert_eq!(field(&v, "id"), None);
    }

    /// A key with its letters' case flipped at random, and NULs appended.
    fn variant(key: &str, flips: &[bool], nuls: usize) -> String {
        let mut out: String = key
            .chars()
            .zip(flips.iter().chain(std::iter::repeat(&false)))
            .map(|(c, &up)| if up { c.to_ascii_uppercase() } else { c })
            .collect();
        out.extend(std::iter::repeat_n('\0', nuls));
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The canonical form is stable, and every case/NUL variant of a key maps to it.
        #[test]
        fn canonical_keys_are_stable_and_case_blind(
            key in "\\PC{0,12}",
            flips in proptest::collection::vec(any::<bool>(), 0..12),
            nuls in 0usize..3,
        ) {
            let c = canonical_key(&key).into_owned();
            prop_assert_eq!(canonical_key(&c).into_owned(), c.clone());
            prop_assert_eq!(canonical_key(&variant(&key, &flips, nuls)).into_owned(), c.clone());
            let (upper, lower) = (key.to_uppercase(), key.to_lowercase());
            prop_assert_eq!(canonical_key(&upper), canonical_key(&lower));
        }

        /// An object built from keys with distinct canonical forms passes; adding a variant of
        /// one of them is refused, wherever the object sits.
        #[test]
        fn distinct_keys_pass_and_a_variant_is_refused(
            keys in proptest::collection::btree_set("[a-zA-Z_ſK]{1,6}", 1..6),
            which in any::<prop::sample::Index>(),
            flips in proptest::collection::vec(any::<bool>(), 0..6),
            nuls in 0usize..2,
            depth in 0usize..3,
        ) {
            let mut unique: Vec<String> = Vec::new();
            for k in keys {
                if !unique.iter().any(|u| canonical_key(u) == canonical_key(&k)) {
                    unique.push(k);
                }
            }
            let nest = |obj: String| (0..depth).fold(obj, |o, _| format!("{{\"v\":[{o}]}}"));
            let body = |ks: &[String]| {
                let members: Vec<String> = ks
                    .iter()
                    .enumerate()
                    .map(|(i, k)| format!("{}:{i}", Value::from(k.as_str())))
                    .collect();
                nest(format!("{{{}}}", members.join(",")))
            };
            prop_assert!(check_unambiguous(body(&unique).as_bytes()).is_ok());
            let k = &unique[which.index(unique.len())];
            let mut more = unique.clone();
            more.push(variant(k, &flips, nuls));
            prop_assert!(check_unambiguous(body(&more).as_bytes()).is_err());
        }
    }
}

#[cfg(test)]
mod ambiguity_tests {
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

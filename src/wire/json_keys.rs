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

use std::borrow::Cow;
use std::collections::HashMap;

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
/// Errors: not JSON (serde_json's message), or which two keys of one object are ambiguous.
pub fn check_unambiguous(bytes: &[u8]) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    Strict.deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())
}

/// How much of a key an error message shows.
const SHOWN: usize = 40;

fn shown(key: &str) -> String {
    match key.char_indices().nth(SHOWN) {
        Some((i, _)) => format!("{:?}…", &key[..i]),
        None => format!("{key:?}"),
    }
}

/// A visitor that walks any JSON value and fails on two keys one loose parser reads as one.
#[derive(Clone, Copy)]
struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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
        while seq.next_element_seed(Strict)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen: HashMap<String, String> = HashMap::new();
        while let Some(key) = map.next_key::<String>()? {
            let canonical = canonical_key(&key).into_owned();
            if let Some(first) = seen.get(&canonical) {
                let why = if *first == key {
                    format!("key {} appears twice in one object", shown(&key))
                } else {
                    format!(
                        "keys {} and {} of one object are ambiguous (a parser that ignores \
                         case or trailing NULs reads them as one)",
                        shown(first),
                        shown(&key)
                    )
                };
                return Err(serde::de::Error::custom(why));
            }
            seen.insert(canonical, key);
            map.next_value_seed(Strict)?;
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

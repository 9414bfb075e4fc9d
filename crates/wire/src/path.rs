//! Request paths that an upstream could read differently than policy matched them.
//!
//! Owned here, not in `proxy`, because `latchkey explain` and `latchkey test` must refuse a path
//! exactly as the proxy does. Depends on nothing in the crate.
//!
//! Policy matches the path exactly as the sandbox sent it; the upstream (or a framework behind
//! it) may first decode, strip or merge parts of it. Tomcat and Spring drop `;parameters` from
//! each segment and then resolve dot segments, so `/ok/..;/admin` matched `/ok/**` yet served
//! `/admin`; IIS and Windows file servers trim trailing dots and spaces; some stacks decode twice
//! or accept overlong UTF-8. latchkey does not try to predict each server's normalisation: a
//! path with more than one plausible reading is refused (`400 ambiguous_path`).
//!
//! Two checks, in two places:
//! - [`ambiguity`] at admission, for every request whatever the rule: dot segments (raw or
//!   `%2e`-encoded, with or without `;` parameters, any number of dots), `/` or `\` encoded or
//!   raw backslashes, double encoding (an escape that decodes to another escape: `%252e`,
//!   `%25%32%65`), malformed escapes (`%u002e`,
//!   `%zz`), encoded control characters (`%00`…`%1f`, `%7f`) and percent-encoded bytes that are
//!   not UTF-8 (overlong `%c0%ae`).
//! - [`check_rule_path`] once policy has chosen a rule: under a rule that restricts `paths`,
//!   any `;` or `%3b` and any empty interior segment (`//`), since servers strip parameters and
//!   merge slashes after the glob matched the raw text (`/files/*.txt` matches
//!   `/files/key.pem;.txt`, which Tomcat serves as `/files/key.pem`).

/// Why a path has more than one reading. Messages complete "path "/x" …".
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Ambiguity {
    #[error("has a dot segment ('.' or '..', raw or %2e-encoded, with or without ';' parameters)")]
    DotSegment,
    #[error("has an encoded slash or backslash (%2f, %5c)")]
    EncodedSlash,
    #[error("has a backslash, which some servers read as '/'")]
    Backslash,
    #[error("has a double-encoded escape (one that decodes to another escape, such as %252e)")]
    DoubleEncoded,
    #[error("has a '%' that is not followed by two hex digits")]
    MalformedEscape,
    #[error("has an encoded control character (%00-%1f or %7f)")]
    ControlChar,
    #[error("has percent-encoded bytes that are not UTF-8 (such as the overlong '.' %c0%ae)")]
    NotUtf8,
    #[error(
        "has ';' path parameters (raw or %3b), which servers such as Tomcat strip before routing, \
         under a rule that restricts paths"
    )]
    Parameters,
    #[error(
        "has an empty segment ('//'), which some servers merge, under a rule that restricts paths"
    )]
    EmptySegment,
}

/// Dot segments, encoded slashes, backslashes and other forms an upstream may normalise after
/// policy matched the raw path.
pub fn is_ambiguous_path(path: &str) -> bool {
    ambiguity(path).is_some()
}

/// The first reason `path` (without the query) is ambiguous for any rule, if any.
pub fn ambiguity(path: &str) -> Option<Ambiguity> {
    if path.contains('\\') {
        return Some(Ambiguity::Backslash);
    }
    let decoded = match decode(path.as_bytes()) {
        Ok(d) => d,
        Err(a) => return Some(a),
    };
    // Decoded once, the path must hold no escape a second decoding would act on (`%252e`, and
    // `%25%32%65`, whose escaped hex digits only form `%2e` after the first pass).
    if decoded
        .windows(3)
        .any(|w| w[0] == b'%' && w[1].is_ascii_hexdigit() && w[2].is_ascii_hexdigit())
    {
        return Some(Ambiguity::DoubleEncoded);
    }
    if std::str::from_utf8(&decoded).is_err() {
        return Some(Ambiguity::NotUtf8);
    }
    if path.split('/').any(is_dot_segment) {
        return Some(Ambiguity::DotSegment);
    }
    None
}

/// The check that needs the policy's decision: under a rule with `paths`, a path must have no
/// `;` parameters and no empty interior segments. Call it for the rule that allowed the request,
/// after [`ambiguity`] passed at admission.
pub fn check_rule_path(path: &str, rule_restricts_paths: bool) -> Result<(), Ambiguity> {
    if !rule_restricts_paths {
        return Ok(());
    }
    if path.contains(';') || contains_ignore_case(path, "%3b") {
        return Err(Ambiguity::Parameters);
    }
    // `/a//b`: an empty segment between two others (a trailing `/` is not one).
    let interior = path.strip_prefix('/').unwrap_or(path);
    let interior = interior.strip_suffix('/').unwrap_or(interior);
    if path.len() > 1 && interior.split('/').any(str::is_empty) {
        return Err(Ambiguity::EmptySegment);
    }
    Ok(())
}

/// Percent-decodes once, refusing malformed escapes and escapes that decode to structure.
fn decode(raw: &[u8]) -> Result<Vec<u8>, Ambiguity> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'%' {
            out.push(raw[i]);
            i += 1;
            continue;
        }
        let byte = raw
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .ok_or(Ambiguity::MalformedEscape)?;
        match byte {
            b'/' | b'\\' => return Err(Ambiguity::EncodedSlash),
            0x00..=0x1f | 0x7f => return Err(Ambiguity::ControlChar),
            _ => out.push(byte),
        }
        i += 3;
    }
    Ok(out)
}

/// A segment that some server resolves as `.` or `..`: after dropping `;parameters` (raw or
/// `%3b`) and decoding `%2e`/`%20`, only dots, optionally followed by spaces (Windows trims
/// trailing dots and spaces, so `...` and `.. ` count too).
fn is_dot_segment(segment: &str) -> bool {
    let lower = segment.to_ascii_lowercase();
    let end = [lower.find(';'), lower.find("%3b")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(lower.len());
    let name = lower[..end].replace("%2e", ".").replace("%20", " ");
    let dots = name.trim_end_matches(' ');
    !dots.is_empty() && dots.bytes().all(|b| b == b'.')
}

fn contains_ignore_case(hay: &str, needle: &str) -> bool {
    hay.as_bytes()
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_and_encoded_slashes_are_ambiguous() {
        for p in [
            "/v1/../admin",
            "/v1/./x",
            "/v1/%2e%2e/admin",
            "/v1/%2E./admin",
            "/v1%2fadmin",
            "/v1\\admin",
            "/..",
        ] {
            assert!(is_ambiguous_path(p), "{p}");
        }
        for p in ["/", "/v1/x", "/v1/x..y", "/v1/.well-known/a", "/v1/%41"] {
            assert!(!is_ambiguous_path(p), "{p}");
        }
    }

    /// Every dot spelling, with and without `;` parameters, in the middle, at the end and in
    /// the first segment.
    #[test]
    fn dot_segments_with_parameters_are_ambiguous_in_every_spelling_and_position() {
        let dots = [
            "..", ".", ".%2e", "%2e.", "%2e%2e", "%2E%2e", "%2e%2E", "%2E", "...", ".. ", "..%20",
        ];
        let params = [
            "",
            ";",
            ";x",
            ";jsessionid=1",
            "%3b",
            "%3B",
            "%3bx=1",
            ";a;b",
        ];
        for dot in dots {
            for param in params {
                let seg = format!("{dot}{param}");
                for path in [
                    format!("/ok/{seg}/admin"),
                    format!("/ok/{seg}"),
                    format!("/{seg}/admin"),
                    format!("/{seg}"),
                ] {
                    assert_eq!(ambiguity(&path), Some(Ambiguity::DotSegment), "{path}");
                }
            }
        }
    }

    #[test]
    fn encodings_that_decode_to_structure_are_ambiguous() {
        let cases = [
            ("/ok/..\\admin", Ambiguity::Backslash),
            ("/ok\\admin", Ambiguity::Backslash),
            ("/ok/%5cadmin", Ambiguity::EncodedSlash),
            ("/ok/%5C", Ambiguity::EncodedSlash),
            ("/ok%2Fadmin", Ambiguity::EncodedSlash),
            ("/ok/%252e%252e/admin", Ambiguity::DoubleEncoded),
            ("/ok/%252E", Ambiguity::DoubleEncoded),
            ("/%252f", Ambiguity::DoubleEncoded),
            ("/ok/%25252e", Ambiguity::DoubleEncoded),
            ("/ok/%25%32%65", Ambiguity::DoubleEncoded),
            ("/ok/%25%41%41", Ambiguity::DoubleEncoded),
            ("/ok/%c0%ae%c0%ae/admin", Ambiguity::NotUtf8),
            ("/ok/%C0%AE", Ambiguity::NotUtf8),
            ("/%c0%af", Ambiguity::NotUtf8),
            ("/ok/%e0%80%ae", Ambiguity::NotUtf8),
            ("/ok/%ff", Ambiguity::NotUtf8),
            ("/ok/%00", Ambiguity::ControlChar),
            ("/ok/a%00.txt", Ambiguity::ControlChar),
            ("/%00/admin", Ambiguity::ControlChar),
            ("/ok/%0d%0a", Ambiguity::ControlChar),
            ("/ok/%7f", Ambiguity::ControlChar),
            ("/ok/%u002e%u002e/admin", Ambiguity::MalformedEscape),
            ("/ok/%", Ambiguity::MalformedEscape),
            ("/ok/%2", Ambiguity::MalformedEscape),
            ("/ok/%zz", Ambiguity::MalformedEscape),
        ];
        for (path, want) in cases {
            assert_eq!(ambiguity(path), Some(want), "{path}");
        }
    }

    #[test]
    fn ordinary_paths_are_not_ambiguous() {
        for p in [
            "/",
            "/ok/admin",
            "/ok/x..y",
            "/ok/..x",
            "/ok/x.",
            "/ok/.well-known/a",
            "/ok/%41%42",
            "/ok/caf%C3%A9",
            "/ok/100%25",
            "/ok/100%25%20off",
            "/ok/%252",
            "/ok/file;v=1",
            "/ok/;..",
            "/ok/a%3bb",
            "/ok//x",
            "/ok/",
        ] {
            assert_eq!(ambiguity(p), None, "{p}");
        }
    }

    #[test]
    fn parameters_and_empty_segments_are_refused_only_under_a_rule_with_paths() {
        for p in [
            "/ok/file;v=1",
            "/ok;/admin",
            "/ok/a%3bb",
            "/ok/a%3B",
            "/;",
            "/ok/x;",
            "/files/key.pem;.txt",
        ] {
            assert_eq!(check_rule_path(p, true), Err(Ambiguity::Parameters), "{p}");
            assert_eq!(check_rule_path(p, false), Ok(()), "{p}");
        }
        for p in ["//admin", "/ok//x", "/ok//"] {
            assert_eq!(
                check_rule_path(p, true),
                Err(Ambiguity::EmptySegment),
                "{p}"
            );
            assert_eq!(check_rule_path(p, false), Ok(()), "{p}");
        }
        for p in ["/", "/ok/", "/ok/x", "/ok/x/"] {
            assert_eq!(check_rule_path(p, true), Ok(()), "{p}");
        }
    }

    /// What common servers may do to a path before routing, as one model: percent-decode (once
    /// or twice), split on `/` and `\`, drop `;parameters` per segment, and read a segment made
    /// of dots (with trailing spaces) as a dot segment.
    fn server_readings(path: &str) -> Vec<Vec<String>> {
        fn decode_lossy(s: &str) -> String {
            let b = s.as_bytes();
            let mut out = Vec::new();
            let mut i = 0;
            while i < b.len() {
                let hex = b
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    // Two hex digits: `from_str_radix` alone takes a sign (`%+A` is no escape).
                    .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match (b[i], hex) {
                    (b'%', Some(v)) => {
                        out.push(v);
                        i += 3;
                    }
                    (c, _) => {
                        out.push(c);
                        i += 1;
                    }
                }
            }
            String::from_utf8_lossy(&out).into_owned()
        }
        let once = decode_lossy(path);
        let twice = decode_lossy(&once);
        [path.to_string(), once, twice]
            .iter()
            .map(|p| {
                p.split(['/', '\\'])
                    .map(|seg| seg.split(';').next().unwrap_or_default().to_string())
                    .collect()
            })
            .collect()
    }

    /// Paths built from the pieces that matter: separators, dots, parameters and escapes, and
    /// single characters that can complete an escape.
    fn path_chars() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let tokens = vec![
            "/", ".", "..", ";", "%", "%25", "%2e", "%2E", "%3b", "%5c", "%2f", "%00", "%20",
            "%c0", "%ae", "%41", "2", "e", "E", "5", "c", "f", "3", "b", "0", "a", "x", "\\", " ",
        ];
        proptest::collection::vec(proptest::sample::select(tokens), 0..12)
            .prop_map(|v| format!("/{}", v.concat()))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// 2000 cases: a path `ambiguity` lets through has one reading under every server model
        /// (raw, decoded once, decoded twice): the same segments, none of them a dot segment,
        /// no control character and no separator that decoding created.
        #[test]
        fn proptest_unambiguous_paths_read_the_same_on_every_server_model(path in path_chars()) {
            if ambiguity(&path).is_none() {
                let readings = server_readings(&path);
                for r in &readings {
                    proptest::prop_assert_eq!(r.len(), readings[0].len(), "{:?}: {:?}", path, readings);
                    for seg in r {
                        let dots = seg.trim_end_matches(' ');
                        proptest::prop_assert!(
                            dots.is_empty() || !dots.bytes().all(|b| b == b'.'),
                            "{:?} reads as a dot segment: {:?}", path, readings
                        );
                        proptest::prop_assert!(!seg.chars().any(char::is_control), "{:?}", path);
                    }
                }
                proptest::prop_assert_eq!(&readings[1], &readings[2], "{:?} decodes twice", path);
            }
        }

        /// 2000 cases: any string, never a panic.
        #[test]
        fn proptest_path_checks_never_panic(path in proptest::prelude::any::<String>()) {
            let _ = ambiguity(&path);
            let _ = check_rule_path(&path, true);
        }
    }
}

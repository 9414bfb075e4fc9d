//! The decoded views of request bytes the leak checks search besides the bytes as sent: the
//! escapes an upstream's parser undoes (percent, JSON, quoted-printable, wrapped lines), so a
//! secret value escaped byte by byte is found as it will be once parsed.
//!
//! Plain byte functions: no HTTP, no policy, no scrubber.

/// How many raw bytes one decoded byte may take in [`unescaped`] (`\u0041` for `A`).
pub const ESCAPE_RATIO: usize = 6;

/// The views of `bytes` searched besides the bytes themselves: [`unescaped_views`] and
/// [`quoted_printable`], where they differ from it.
pub fn decoded_views(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut views = unescaped_views(bytes);
    views.extend(quoted_printable(bytes));
    views
}

/// [`unescaped`], and where it could hide a value, the same bytes read otherwise:
///
/// - When it read a run of two or more backslashes: every such run's parity flipped (its
///   first backslash kept as a byte, the rest read in pairs). Which backslash of a run begins
///   an escape depends on where the run begins, and a value escaped byte by byte may follow a
///   backslash that is not its own (one the sandbox put there, or the end of a run cut off by
///   the scan window): read from the run's start, that backslash pairs with the value's first
///   one and the value is no longer decoded. Every position in a run starts a pair in one of
///   the two views, and past the run both read alike.
/// - When it undid both percent and JSON escapes: each kind alone. An upstream's parser undoes
///   one kind, and an escape of the other kind is text to it: `%4f` then `9a\u002d…` is
///   `%4f9a-…` to a JSON parser, `\n` then `k%2D…` is `\nk-…` to a form parser, while read
///   together the first escape eats the value's first bytes.
///
/// Fails closed: a second view may find a value the upstream's parser would not see. Bodies
/// with neither a backslash run nor both kinds of escape get one view, as before.
pub fn unescaped_views(bytes: &[u8]) -> Vec<Vec<u8>> {
    if !bytes.iter().copied().any(escape_byte) {
        return Vec::new();
    }
    let both = Pass {
        percent: true,
        json: true,
        shift_runs: false,
    };
    let (view, read) = unescape(bytes, both);
    let mut views = vec![view];
    if read.runs {
        let shifted = Pass {
            shift_runs: true,
            ..both
        };
        views.push(unescape(bytes, shifted).0);
    }
    if read.percent && read.json {
        for one in [
            Pass {
                percent: false,
                ..both
            },
            Pass {
                json: false,
                ..both
            },
        ] {
            views.push(unescape(bytes, one).0);
        }
    }
    views
}

/// Which escapes one pass of [`unescape`] undoes (line breaks are dropped in every pass).
#[derive(Clone, Copy)]
struct Pass {
    percent: bool,
    json: bool,
    /// The first backslash of each run of two or more is kept as a byte.
    shift_runs: bool,
}

/// What one pass of [`unescape`] read.
#[derive(Default)]
struct Read {
    /// A `%XX` escape.
    percent: bool,
    /// A JSON escape.
    json: bool,
    /// A run of two or more backslashes.
    runs: bool,
}

/// `bytes` with quoted-printable escapes undone (`=XX`, either case, and `=` soft line breaks):
/// a MIME part in `Content-Transfer-Encoding: quoted-printable` may escape every byte.
/// `None`: no `=` in it.
pub fn quoted_printable(bytes: &[u8]) -> Option<Vec<u8>> {
    if !bytes.contains(&b'=') {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' {
            let rest = &bytes[i + 1..];
            if rest.starts_with(b"\r\n") {
                i += 3;
                continue;
            }
            if rest.starts_with(b"\n") {
                i += 2;
                continue;
            }
            let hex = rest
                .get(..2)
                .and_then(|h| std::str::from_utf8(h).ok())
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(v) = hex {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    Some(out)
}

/// Bytes that make [`decoded_views`] differ from its input.
pub fn escape_byte(b: u8) -> bool {
    matches!(b, b'%' | b'\\' | b'\r' | b'\n' | b'=')
}

/// `bytes` with the escapes an upstream's parser undoes taken out — `%XX` (form bodies, any
/// byte escaped), JSON's `\u` with four hex digits (surrogate pairs joined) and `\/ \" \\ \b \f \t` — and
/// line breaks dropped (raw or `\n`/`\r` escaped: MIME and PEM wrap base64 at 64 or 76
/// columns), so a value escaped byte by byte, or encoded and wrapped, is found as it is once
/// parsed. `None`: nothing to undo.
pub fn unescaped(bytes: &[u8]) -> Option<Vec<u8>> {
    if !bytes.iter().copied().any(escape_byte) {
        return None;
    }
    let both = Pass {
        percent: true,
        json: true,
        shift_runs: false,
    };
    Some(unescape(bytes, both).0)
}

/// [`unescaped`]'s decoding, of the escapes `pass` names; also what it read.
fn unescape(bytes: &[u8], pass: Pass) -> (Vec<u8>, Read) {
    let hex = |h: &[u8]| -> Option<u32> {
        std::str::from_utf8(h)
            .ok()
            .filter(|t| t.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|t| u32::from_str_radix(t, 16).ok())
    };
    let mut out = Vec::with_capacity(bytes.len());
    let mut read = Read::default();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' && pass.percent {
            if let Some(v) = bytes.get(i + 1..i + 3).and_then(hex) {
                out.push(v as u8);
                read.percent = true;
                i += 3;
                continue;
            }
        } else if b == b'\\' && pass.json {
            let pair = bytes.get(i + 1) == Some(&b'\\');
            read.runs |= pair;
            // The start of a run (the byte before is no backslash): kept as a byte.
            if pass.shift_runs && pair && (i == 0 || bytes[i - 1] != b'\\') {
                out.push(b);
                i += 1;
                continue;
            }
            match bytes.get(i + 1) {
                Some(b'u') => {
                    if let Some(hi) = bytes.get(i + 2..i + 6).and_then(hex) {
                        let mut code = hi;
                        let mut len = 6;
                        if (0xd800..0xdc00).contains(&hi) && bytes.get(i + 6..i + 8) == Some(b"\\u")
                        {
                            if let Some(lo) = bytes.get(i + 8..i + 12).and_then(hex) {
                                if (0xdc00..0xe000).contains(&lo) {
                                    code = 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
                                    len = 12;
                                }
                            }
                        }
                        if let Some(c) = char::from_u32(code) {
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                            read.json = true;
                            i += len;
                            continue;
                        }
                    }
                }
                Some(&e) => {
                    let c = match e {
                        b'/' | b'"' | b'\\' => Some(e),
                        b'b' => Some(0x08),
                        b'f' => Some(0x0c),
                        b't' => Some(b'\t'),
                        // Line breaks are dropped, escaped or not.
                        b'n' | b'r' => {
                            read.json = true;
                            i += 2;
                            continue;
                        }
                        _ => None,
                    };
                    if let Some(c) = c {
                        out.push(c);
                        read.json = true;
                        i += 2;
                        continue;
                    }
                }
                None => {}
            }
        }
        if b != b'\r' && b != b'\n' {
            out.push(b);
        }
        i += 1;
    }
    (out, read)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescaping_undoes_percent_and_json_escapes_only() {
        assert_eq!(unescaped(b"plain"), None);
        assert_eq!(
            unescaped(br#"%73k\u002d\u00E9\/\"\\\n%zz\q\ud83d\ude00"#).as_deref(),
            Some("sk-\u{e9}/\"\\%zz\\q\u{1f600}".as_bytes())
        );
        // Wrapped base64 (MIME, PEM) joins up; line breaks go, raw or escaped.
        assert_eq!(
            unescaped(b"c2stdGVz\r\ndC1PUEVO\nQUk=\\nx").as_deref(),
            Some(&b"c2stdGVzdC1PUEVOQUk=x"[..])
        );
        assert_eq!(
            quoted_printable(b"=73=6b-te=\r\nst=\nx=zz=4").as_deref(),
            Some(&b"sk-testx=zz=4"[..])
        );
        assert_eq!(quoted_printable(b"no equals"), None);
        // Truncated escapes stay as they are.
        assert_eq!(unescaped(b"a%7").as_deref(), Some(&b"a%7"[..]));
        assert_eq!(unescaped(b"\\u00").as_deref(), Some(&b"\\u00"[..]));
    }

    /// A value escaped byte by byte after any number of backslashes (none of them its own):
    /// one of the views decodes it, whichever backslash the run's pairs end on; a second view
    /// exists only where a run of two or more was read.
    #[test]
    fn a_value_escaped_after_any_backslash_run_is_decoded_in_one_view() {
        let value = br"\u0073\u006B\u002d\u0074\u0065";
        for n in 0..8 {
            for after in [&b""[..], b"\\", b"\\\\", b"\\u00"] {
                let mut bytes = vec![b'\\'; n];
                bytes.extend_from_slice(value);
                bytes.extend_from_slice(after);
                let views = unescaped_views(&bytes);
                assert!(
                    views.iter().any(|v| v.windows(5).any(|w| w == b"sk-te")),
                    "{n} backslashes before, {after:?} after: {views:?}"
                );
                let run = n > 0 || after == b"\\\\";
                assert_eq!(views.len(), if run { 2 } else { 1 }, "{n} {after:?}");
            }
        }
        // Escaped backslash pairs stay pairs in the first view; the second reads them shifted.
        assert_eq!(
            unescaped_views(br"a\\\\nb"),
            [b"a\\\\nb".to_vec(), b"a\\\\b".to_vec()]
        );
        assert_eq!(unescaped_views(b"plain"), Vec::<Vec<u8>>::new());
        // A value partly escaped for one parser after an escape of the other kind's.
        for (bytes, value) in [
            (&br"%4f9a\u002dx"[..], &b"4f9a-x"[..]),
            (br"\nk%2Dx", br"\nk-x"),
            (br"\u004f%2Dx", b"4f-x"),
        ] {
            let views = unescaped_views(bytes);
            assert!(!views[0].windows(value.len()).any(|w| w == value));
            assert!(
                views
                    .iter()
                    .any(|v| v.windows(value.len()).any(|w| w == value)),
                "{views:?}"
            );
        }
        assert_eq!(unescaped_views(br"a\nb"), [b"ab".to_vec()]);
    }
}

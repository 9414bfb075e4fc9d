//! The decoded views of request bytes the leak checks search besides the bytes as sent: the
//! escapes an upstream's parser undoes (percent, JSON, quoted-printable, wrapped lines), so a
//! secret value escaped byte by byte is found as it will be once parsed.
//!
//! Plain byte functions: no HTTP, no policy, no scrubber.

/// How many raw bytes one decoded byte may take in [`unescaped`] (`\u0041` for `A`).
pub const ESCAPE_RATIO: usize = 6;

/// The views of `bytes` searched besides the bytes themselves: [`unescaped`] and
/// [`quoted_printable`], where they differ from it.
pub fn decoded_views(bytes: &[u8]) -> Vec<Vec<u8>> {
    unescaped(bytes)
        .into_iter()
        .chain(quoted_printable(bytes))
        .collect()
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
    let hex = |h: &[u8]| -> Option<u32> {
        std::str::from_utf8(h)
            .ok()
            .filter(|t| t.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|t| u32::from_str_radix(t, 16).ok())
    };
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            if let Some(v) = bytes.get(i + 1..i + 3).and_then(hex) {
                out.push(v as u8);
                i += 3;
                continue;
            }
        } else if b == b'\\' {
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
                            i += 2;
                            continue;
                        }
                        _ => None,
                    };
                    if let Some(c) = c {
                        out.push(c);
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
    Some(out)
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
}

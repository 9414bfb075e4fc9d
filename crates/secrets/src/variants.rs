//! The variants of a secret value the scrubber looks for: raw, base64 at every alignment,
//! percent-encoded in the forms common encoders write, JSON-escaped in every style (see the
//! [`super::scrub`] docs, "Variants"). Every buffer is `Zeroizing` and sized up front.

use base64::Engine as _;
use zeroize::Zeroizing;

/// The most bytes one byte of a secret becomes in any variant (a control character as `\u00XX`).
const MAX_EXPANSION: usize = 6;

/// Every encoding of `value` the scrubber looks for, raw first, possibly with repeats and
/// variants too short to use (the caller drops those).
pub(super) fn variants_of(value: &[u8]) -> Vec<Zeroizing<Vec<u8>>> {
    let mut variants = vec![Zeroizing::new(value.to_vec())];
    for engine in [
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for alignment in 0..3 {
            variants.push(base64_aligned(engine, value, alignment));
        }
    }
    // A form or style that would write the value unchanged adds nothing (the duplicate would
    // be dropped in `Scrubber::new`): skip building it. Tokens and API keys are mostly such
    // values, and the 42 copies would be most of the cost of building the matcher.
    for upper in [true, false] {
        for form in PercentForm::ALL {
            if !value.iter().all(|&b| form.keeps(b)) {
                variants.push(percent_encoded(value, form, upper));
            }
        }
    }
    // Printable ASCII without `"`, `\`, `/`, `<`, `>`, `&` is written as is by every style.
    let json_plain = value
        .iter()
        .all(|&b| (b' '..=b'~').contains(&b) && !b"\"\\/<>&".contains(&b));
    if json_plain {
        return variants;
    }
    for bits in 0..(1u8 << 5) {
        let style = JsonStyle {
            escape_slash: bits & 1 != 0,
            short_controls: bits & 2 != 0,
            upper_hex: bits & 4 != 0,
            escape_non_ascii: bits & 8 != 0,
            escape_html: bits & 16 != 0,
        };
        variants.push(json_escaped(value, style));
    }
    variants
}

/// The base64 characters fully determined by `value` when it starts at byte offset
/// `alignment` (0, 1 or 2) modulo 3 inside a larger encoded blob.
pub(super) fn base64_aligned(
    engine: &base64::engine::GeneralPurpose,
    value: &[u8],
    alignment: usize,
) -> Zeroizing<Vec<u8>> {
    let mut shifted = Zeroizing::new(Vec::with_capacity(alignment + value.len()));
    shifted.resize(alignment, 0);
    shifted.extend_from_slice(value);
    let Some(encoded_len) = base64::encoded_len(shifted.len(), false) else {
        return Zeroizing::new(Vec::new());
    };
    let mut encoded = Zeroizing::new(vec![0u8; encoded_len]);
    if engine
        .encode_slice(shifted.as_slice(), encoded.as_mut_slice())
        .is_err()
    {
        return Zeroizing::new(Vec::new());
    }
    // Character i carries bits 6i..6i+6; the secret has bits 8a..8(a+n).
    let first = (8 * alignment).div_ceil(6);
    let end = (8 * (alignment + value.len())) / 6;
    encoded.copy_within(first..end, 0);
    encoded.truncate(end - first);
    encoded
}

/// Which bytes a percent-encoder leaves as they are.
#[derive(Clone, Copy)]
pub(super) enum PercentForm {
    /// Python `quote(v, safe='')`: only the unreserved `A-Za-z0-9-._~`.
    Unreserved,
    /// Python `quote(v)`: unreserved and `/`.
    UnreservedAndSlash,
    /// JavaScript `encodeURIComponent`: unreserved and `!'()*`.
    UriComponent,
    /// Only RFC 3986 reserved characters, `%` and bytes never literal in a URL are encoded.
    ReservedOnly,
    /// `application/x-www-form-urlencoded`: unreserved kept, space as `+`.
    Form,
    /// Every byte but `A-Za-z0-9` (Rust `percent_encoding::NON_ALPHANUMERIC`, PHP-style
    /// over-encoders): `-` and `.` become `%2D`, `%2E`.
    Alphanumeric,
    /// Java `URLEncoder`: alphanumerics and `-._*` kept, space as `+`, `~` encoded.
    Java,
}

impl PercentForm {
    pub(super) const ALL: [PercentForm; 7] = [
        PercentForm::Unreserved,
        PercentForm::UnreservedAndSlash,
        PercentForm::UriComponent,
        PercentForm::ReservedOnly,
        PercentForm::Form,
        PercentForm::Alphanumeric,
        PercentForm::Java,
    ];

    fn keeps(self, byte: u8) -> bool {
        let unreserved = byte.is_ascii_alphanumeric() || b"-._~".contains(&byte);
        match self {
            PercentForm::Unreserved | PercentForm::Form => unreserved,
            PercentForm::UnreservedAndSlash => unreserved || byte == b'/',
            PercentForm::UriComponent => unreserved || b"!'()*".contains(&byte),
            PercentForm::ReservedOnly => {
                byte.is_ascii_graphic() && !b":/?#[]@!$&'()*+,;=%".contains(&byte)
            }
            PercentForm::Alphanumeric => byte.is_ascii_alphanumeric(),
            PercentForm::Java => byte.is_ascii_alphanumeric() || b"-._*".contains(&byte),
        }
    }
}

pub(super) fn percent_encoded(value: &[u8], form: PercentForm, upper: bool) -> Zeroizing<Vec<u8>> {
    let digits = hex_digits(upper);
    let mut out = Zeroizing::new(Vec::with_capacity(value.len() * MAX_EXPANSION));
    for &byte in value {
        if form.keeps(byte) {
            out.push(byte);
        } else if matches!(form, PercentForm::Form | PercentForm::Java) && byte == b' ' {
            out.push(b'+');
        } else {
            out.extend_from_slice(&[
                b'%',
                digits[usize::from(byte >> 4)],
                digits[usize::from(byte & 0xf)],
            ]);
        }
    }
    out
}

/// One way of writing a value inside a JSON string.
#[derive(Clone, Copy)]
pub(super) struct JsonStyle {
    /// `/` as `\/`.
    pub(super) escape_slash: bool,
    /// `\b`, `\f`, `\n`, `\r`, `\t` rather than `\u00XX`.
    pub(super) short_controls: bool,
    /// Hex digits of `\u` escapes in upper case.
    pub(super) upper_hex: bool,
    /// Every non-ASCII character as `\u` and four hex digits (Python's `ensure_ascii`).
    pub(super) escape_non_ascii: bool,
    /// Go's HTML-safe escaping: `<`, `>`, `&`, U+2028 and U+2029 as `\u` and four hex digits.
    pub(super) escape_html: bool,
}

/// `value` as it appears between the quotes of a JSON string written in `style`. Bytes that are
/// not UTF-8 are kept as they are (no JSON encoder writes them; a lenient one may pass them on).
pub(super) fn json_escaped(value: &[u8], style: JsonStyle) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(value.len() * MAX_EXPANSION));
    for chunk in value.utf8_chunks() {
        for c in chunk.valid().chars() {
            let short = match c {
                '"' => Some(b'"'),
                '\\' => Some(b'\\'),
                '/' if style.escape_slash => Some(b'/'),
                '\u{8}' if style.short_controls => Some(b'b'),
                '\u{c}' if style.short_controls => Some(b'f'),
                '\n' if style.short_controls => Some(b'n'),
                '\r' if style.short_controls => Some(b'r'),
                '\t' if style.short_controls => Some(b't'),
                _ => None,
            };
            let as_unicode_escape = c < ' '
                || (style.escape_html && matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}'))
                || (style.escape_non_ascii && !c.is_ascii());
            if let Some(letter) = short {
                out.extend_from_slice(&[b'\\', letter]);
            } else if as_unicode_escape {
                let mut units = [0u16; 2];
                for &unit in c.encode_utf16(&mut units).iter() {
                    push_unicode_escape(&mut out, unit, style.upper_hex);
                }
            } else {
                let mut utf8 = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
            }
        }
        out.extend_from_slice(chunk.invalid());
    }
    out
}

fn push_unicode_escape(out: &mut Vec<u8>, unit: u16, upper: bool) {
    let digits = hex_digits(upper);
    let nibble = |shift: u16| digits[usize::from((unit >> shift) & 0xf)];
    out.extend_from_slice(&[b'\\', b'u', nibble(12), nibble(8), nibble(4), nibble(0)]);
}

fn hex_digits(upper: bool) -> &'static [u8; 16] {
    if upper {
        b"0123456789ABCDEF"
    } else {
        b"0123456789abcdef"
    }
}

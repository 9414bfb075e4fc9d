//! The framing rules: exactly one way to read a request's body (RFC 9112 §6), judged on header
//! values — hyper's parsed ones ([`check_framing`]) or the raw ones of a head
//! ([`super::HeadSniff`]). Pure functions; no I/O, nothing from the crate but `reason`.

use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::HeaderMap;

use crate::reason::{Reason, Refusal};

/// Refuses request framing that two parsers could read differently (RFC 9112 §6), on the
/// headers hyper parsed: the rules of [`framing_rules`]. hyper already drops some of what these
/// rules look for, so the raw heads are judged too ([`super::HeadSniff`]); this is the check for
/// h2 and the second line for HTTP/1.
pub fn check_framing(headers: &HeaderMap) -> Result<(), Refusal> {
    // At most two values of each are needed to judge; no allocation for the usual one or none.
    let mut cl: [&[u8]; 2] = [&[]; 2];
    let mut te: [&[u8]; 2] = [&[]; 2];
    let (mut ncl, mut nte) = (0, 0);
    for v in headers.get_all(CONTENT_LENGTH).iter().take(2) {
        cl[ncl] = v.as_bytes();
        ncl += 1;
    }
    for v in headers.get_all(TRANSFER_ENCODING).iter().take(2) {
        te[nte] = v.as_bytes();
        nte += 1;
    }
    framing_rules(&cl[..ncl], &te[..nte], false)
        .map(|_| ())
        .map_err(|m| Refusal::new(Reason::AmbiguousFraming, m))
}

/// How a request's body is framed, once its head passed [`framing_rules`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
}

/// The framing rules, on raw header values: exactly one way to read the body (RFC 9112 §6).
/// Refused: both `Content-Length` and `Transfer-Encoding`; more than one of either (equal values
/// too); a `Content-Length` that is not plain digits (`+5`, `5, 5`, `0x5`); any transfer coding
/// but a single `chunked` (`chunked, identity`, `gzip, chunked`, `identity`); a
/// `Transfer-Encoding` on HTTP/1.0. Optional whitespace around a value is trimmed.
///
/// Only whether `cl` and `te` hold none, one or more values matters, so callers may pass at
/// most two of each.
pub fn framing_rules(
    cl: &[&[u8]],
    te: &[&[u8]],
    http10: bool,
) -> Result<BodyFraming, &'static str> {
    if !cl.is_empty() && !te.is_empty() {
        return Err("request has both Content-Length and Transfer-Encoding");
    }
    if cl.len() > 1 {
        return Err("request has more than one Content-Length");
    }
    if te.len() > 1 {
        return Err("request has more than one Transfer-Encoding");
    }
    if let Some(v) = te.first() {
        if http10 {
            return Err("HTTP/1.0 request has a Transfer-Encoding");
        }
        if !trim_ows(v).eq_ignore_ascii_case(b"chunked") {
            return Err("request has a Transfer-Encoding other than chunked");
        }
        return Ok(BodyFraming::Chunked);
    }
    if let Some(v) = cl.first() {
        let v = trim_ows(v);
        let n = std::str::from_utf8(v)
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or("request has an invalid Content-Length")?;
        return Ok(if n == 0 {
            BodyFraming::None
        } else {
            BodyFraming::Length(n)
        });
    }
    Ok(BodyFraming::None)
}

fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = v.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    match (start, end) {
        (Some(s), Some(e)) => &v[s..=e],
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        for h in [
            headers(&[("content-length", "5"), ("transfer-encoding", "chunked")]),
            headers(&[("content-length", "5"), ("content-length", "5")]),
            headers(&[("content-length", "5, 5")]),
            headers(&[("content-length", "-1")]),
            headers(&[("transfer-encoding", "gzip, chunked")]),
            headers(&[("transfer-encoding", "identity")]),
        ] {
            assert!(check_framing(&h).is_err(), "{h:?}");
        }
        for h in [
            headers(&[]),
            headers(&[("content-length", "5")]),
            headers(&[("transfer-encoding", "chunked")]),
        ] {
            assert!(check_framing(&h).is_ok(), "{h:?}");
        }
    }

    #[test]
    fn three_values_are_refused_like_two() {
        let h = headers(&[
            ("transfer-encoding", "chunked"),
            ("transfer-encoding", "chunked"),
            ("transfer-encoding", "chunked"),
        ]);
        let e = check_framing(&h).expect_err("three TEs");
        assert_eq!(e.reason, Reason::AmbiguousFraming);
        assert!(e.message.contains("more than one Transfer-Encoding"), "{e}");
    }
}

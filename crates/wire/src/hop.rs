//! Hop-by-hop headers (RFC 9110 §7.6.1): they describe one connection and are never forwarded.
//!
//! Owned here, not in `proxy`, because policy validation refuses a rule that would inject one
//! ([`is_hop_by_hop`]) and the proxy strips them: both must agree on the same list. Depends on
//! nothing in the crate.

use http::header::{self, HeaderMap, HeaderName};

/// Headers that belong to one hop, plus the proxy credentials the sandbox sends to latchkey.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
];

const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Whether a header is hop-by-hop by definition (not counting those a `Connection` header names).
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name) || name == PROXY_CONNECTION
}

/// Removes hop-by-hop headers and every header named in `Connection` from a request, except
/// `TE: trailers`: it says the client accepts trailers, and gRPC servers refuse a request
/// without it (it is the one `TE` value HTTP/2 allows, so it is sent on as exactly that).
pub fn strip(headers: &mut HeaderMap) {
    let trailers = headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .is_some_and(|c| c.trim().eq_ignore_ascii_case("trailers"))
        });
    strip_all(headers);
    if trailers {
        headers.insert(header::TE, http::HeaderValue::from_static("trailers"));
    }
}

/// Removes hop-by-hop headers and every header named in `Connection` from a response, except
/// `Trailer` (RFC 9110 no longer counts it hop-by-hop): it declares the trailer fields, and an
/// HTTP/1.1 server (hyper's) sends a chunked body's trailers only when they are declared, so
/// without it an HTTP/1.1 sandbox would lose a gRPC status.
pub fn strip_response(headers: &mut HeaderMap) {
    let named = connection_names(headers).contains(&header::TRAILER);
    let declared: Vec<_> = headers.get_all(header::TRAILER).iter().cloned().collect();
    strip_all(headers);
    if !named {
        for value in declared {
            headers.append(header::TRAILER, value);
        }
    }
}

fn connection_names(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect()
}

fn strip_all(headers: &mut HeaderMap) {
    for name in connection_names(headers) {
        headers.remove(name);
    }
    for name in HOP_BY_HOP.iter() {
        headers.remove(name);
    }
    headers.remove(PROXY_CONNECTION);
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn strips_hop_by_hop_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Foo"),
        );
        h.insert("x-foo", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.insert(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_static("Basic eA=="),
        );
        h.insert(header::TE, HeaderValue::from_static("gzip, trailers;q=1"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        let mut response = h.clone();
        strip(&mut h);
        assert_eq!(h.len(), 2, "{h:?}");
        assert!(h.contains_key("x-keep"));
        assert_eq!(h[header::TE], "trailers");
        strip_response(&mut response);
        assert_eq!(response.len(), 1, "{response:?}");

        let mut declared = HeaderMap::new();
        declared.insert(header::TRAILER, HeaderValue::from_static("grpc-status"));
        strip_response(&mut declared);
        assert_eq!(declared[header::TRAILER], "grpc-status");
        declared.insert(header::CONNECTION, HeaderValue::from_static("trailer"));
        strip_response(&mut declared);
        assert!(declared.is_empty(), "{declared:?}");
    }
}

//! The admit phase without sockets: target parsing inside and outside a CONNECT, the limits,
//! and what the record shows before admission.

use std::net::SocketAddr;
use std::sync::Arc;

use http::request::Parts;
use http::Request;

use super::*;

fn client() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 40000))
}

fn head(uri: &str, hosts: &[&[u8]]) -> Parts {
    let mut b = Request::builder().uri(uri);
    for h in hosts {
        b = b.header(HOST, http::HeaderValue::from_bytes(h).expect("header"));
    }
    b.body(()).expect("request").into_parts().0
}

fn plain() -> Ctx {
    Ctx::proxy_hop(client(), None)
}

fn inside(host: &str, port: u16) -> Ctx {
    Ctx::pinned(client(), Arc::from("default"), host.to_string(), port)
}

fn reason(r: Result<Admitted, Refusal>) -> Reason {
    r.expect_err("refused").reason
}

#[test]
fn authorities_are_split_and_normalised() {
    assert_eq!(
        split_authority("API.test:8443", 443).ok(),
        Some(("api.test".into(), 8443))
    );
    assert_eq!(
        split_authority("api.test", 443).ok(),
        Some(("api.test".into(), 443))
    );
    assert_eq!(
        split_authority("[::1]:80", 443).ok(),
        Some(("::1".into(), 80))
    );
    assert_eq!(
        split_authority("a@b.test", 80).err().map(|e| e.reason),
        Some(Reason::UserinfoInUrl)
    );
    assert_eq!(
        split_authority("b.test:0", 80).err().map(|e| e.reason),
        Some(Reason::BadRequest)
    );
    assert_eq!(
        split_authority("b.test:x", 80).err().map(|e| e.reason),
        Some(Reason::BadRequest)
    );
}

#[test]
fn an_absolute_form_request_is_admitted_in_normal_form() {
    let t = target(&plain(), &head("http://API.Test.:8080/v1/x?q=1", &[])).expect("admitted");
    assert_eq!(
        t,
        Admitted {
            scheme: Scheme::Http,
            host: "api.test".into(),
            port: 8080,
            path_and_query: "/v1/x?q=1".into(),
        }
    );
    assert_eq!(t.path(), "/v1/x");
    let t = target(&plain(), &head("https://[::1]", &[])).expect("admitted");
    assert_eq!((t.host.as_str(), t.port, t.path()), ("::1", 443, "/"));
}

#[test]
fn the_scheme_is_how_latchkey_sends_never_the_port() {
    // Cleartext on the TLS port is still cleartext, and TLS on port 80 still TLS.
    let scheme_of = |ctx: &Ctx, uri: &str, hosts: &[&[u8]]| {
        let t = target(ctx, &head(uri, hosts)).expect("admitted");
        (t.scheme, t.port)
    };
    assert_eq!(
        scheme_of(&plain(), "http://api.test:443/v1", &[]),
        (Scheme::Http, 443)
    );
    assert_eq!(
        scheme_of(&plain(), "https://api.test:80/v1", &[]),
        (Scheme::Https, 80)
    );
    // A plain connection a gateway checked (transparent HTTP, SOCKS5) on 443: cleartext.
    let gateway = Ctx::pinned_plain(client(), Arc::from("default"), "api.test".into(), 443);
    assert_eq!(
        scheme_of(&gateway, "/v1", &[b"api.test:443"]),
        (Scheme::Http, 443)
    );
    // Inside an interception on any port: TLS.
    assert_eq!(
        scheme_of(&inside("api.test", 8080), "/v1", &[b"api.test:8080"]),
        (Scheme::Https, 8080)
    );
    // Plain HTTP naming https:// on a plain connection is not promoted to TLS.
    assert_eq!(
        reason(target(&gateway, &head("https://api.test:443/v1", &[]))),
        Reason::HostMismatch
    );
}

#[test]
fn the_proxy_hop_refuses_what_is_not_a_proxy_request() {
    assert_eq!(
        reason(target(&plain(), &head("/v1/x", &[]))),
        Reason::NotAProxyRequest
    );
    assert_eq!(
        reason(target(&plain(), &head("ftp://a.test/", &[]))),
        Reason::BadRequest
    );
    assert_eq!(
        reason(target(&plain(), &head("http://u:p@a.test/", &[]))),
        Reason::UserinfoInUrl
    );
    assert_eq!(
        reason(target(&plain(), &head("http://a.test/a/../b", &[]))),
        Reason::AmbiguousPath
    );
}

#[test]
fn inside_a_connect_every_authority_must_be_the_pinned_one() {
    let ctx = inside("api.test", 443);
    let t = target(&ctx, &head("/x", &[b"API.test"])).expect("admitted");
    assert_eq!(
        (t.scheme, t.host.as_str(), t.port),
        (Scheme::Https, "api.test", 443)
    );
    let t = target(&ctx, &head("/x", &[])).expect("no Host means the CONNECT's");
    assert_eq!(t.host, "api.test");
    assert_eq!(
        reason(target(&ctx, &head("/x", &[b"other.test"]))),
        Reason::HostMismatch
    );
    assert_eq!(
        reason(target(&ctx, &head("/x", &[b"api.test", b"other.test"]))),
        Reason::HostMismatch
    );
    assert_eq!(
        reason(target(&ctx, &head("/x", &[b"api.test:8443"]))),
        Reason::HostMismatch
    );
    assert_eq!(
        reason(target(&ctx, &head("https://other.test/x", &[]))),
        Reason::HostMismatch
    );
    assert_eq!(
        reason(target(&ctx, &head("http://api.test/x", &[]))),
        Reason::HostMismatch
    );
    let m = target(&ctx, &head("http://api.test/x", &[]))
        .expect_err("refused")
        .message;
    assert_eq!(m, "http:// request inside a CONNECT to api.test:443");
}

#[test]
fn a_host_header_that_is_not_ascii_is_refused_before_the_scheme_is_compared() {
    let ctx = inside("api.test", 443);
    let r = target(&ctx, &head("http://api.test/x", &[b"api.test\xff"])).expect_err("refused");
    assert_eq!(
        (r.reason, r.message.as_str()),
        (Reason::BadRequest, "Host header is not ASCII")
    );
}

#[test]
fn the_target_length_is_what_the_uri_displays_as() {
    for uri in [
        "http://a.test/",
        "http://a.test:8080/p/q?x=1&y",
        "https://[::1]:8443/?",
        "/only/a/path?q",
        "*",
        "a.test:443",
        "http://a.test",
    ] {
        let u: Uri = uri.parse().expect("uri");
        assert_eq!(target_len(&u), u.to_string().len(), "{uri}");
    }
}

#[test]
fn the_limits_refuse_a_long_target_and_a_large_header_block() {
    let long = format!("http://a.test/{}", "x".repeat(100));
    let r = within_limits(&head(&long, &[]), 64).expect_err("refused");
    assert_eq!(r.reason, Reason::UriTooLong);
    assert_eq!(r.message, "request target longer than 64 bytes");
    assert!(within_limits(&head(&long, &[]), long.len()).is_ok());
    let mut big = head("http://a.test/", &[]);
    let value = http::HeaderValue::from_str(&"v".repeat(MAX_HEADER_BYTES)).expect("value");
    big.headers.insert("x-big", value);
    let r = within_limits(&big, 8192).expect_err("refused");
    assert_eq!(r.reason, Reason::HeaderTooLarge);
}

#[test]
fn the_record_shows_what_was_asked_for_before_admission() {
    let mut r = record();
    prefill(&mut r, &plain(), &head("http://API.test/p?token=x", &[]));
    assert_eq!(r.scheme.as_deref(), Some("http"));
    assert_eq!(r.host.as_deref(), Some("api.test"));
    assert_eq!(r.port, Some(80));
    assert_eq!(r.method.as_deref(), Some("GET"));
    let mut r = record();
    prefill(&mut r, &inside("api.test", 8443), &head("/p", &[]));
    assert_eq!(
        (
            r.scheme.as_deref(),
            r.host.as_deref(),
            r.port,
            r.path.as_deref()
        ),
        (Some("https"), Some("api.test"), Some(8443), Some("/p"))
    );
}

fn record() -> Record {
    let log = Arc::new(crate::audit::AuditLog::with_sink(Box::new(std::io::sink())).expect("log"));
    let mut entry = Entry::start(log, client(), "default", "digest");
    let mut out = None;
    entry.update(|r| out = Some(r.clone()));
    entry.dismiss();
    out.expect("a record")
}

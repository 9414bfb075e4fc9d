//! Resource limits against abuse, on raw sockets: oversized request targets and header blocks,
//! slowloris, idle connections and tunnels, connection caps, and upstreams that never answer or
//! never accept. Each limit answers with a clear status (or closes silently where nothing was
//! asked) and leaves an audit record; nothing refused reaches an upstream.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rustls_pki_types::ServerName;
use serde_json::json;

use crate::support::clients::dial;
use crate::support::netns::{curl_in, link, Netns};
use crate::support::upstream::{full_body, handler};
use crate::support::{
    assert_denial, assert_record, connect_tunnel, latchkey, raw_request, read_response, tls_config,
    TestCa, Upstream,
};

fn plain_rule(port: u16) -> String {
    format!("[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{port}]\n")
}

/// Reads until the peer closes (EOF or reset) and returns what arrived and when it closed;
/// `None` if it was still open after `limit`.
fn wait_closed(tcp: &mut TcpStream, limit: Duration) -> Option<(Vec<u8>, Duration)> {
    let start = Instant::now();
    tcp.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tcp.read(&mut buf) {
            Ok(0) => return Some((received, start.elapsed())),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Some((received, start.elapsed())),
        }
        if start.elapsed() > limit {
            return None;
        }
    }
}

#[test]
fn a_request_target_over_8_kib_gets_414_and_is_not_forwarded() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .policy("main.toml", &plain_rule(port))
        .run();

    // Just under the limit is forwarded; just over is refused.
    let fits = format!("/v1/{}", "a".repeat(8 * 1024 - 100));
    let request =
        format!("GET http://api.test:{port}{fits} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n");
    let resp = raw_request(lk.addr(), request.as_bytes());
    assert_eq!(resp.status, 200, "{:?}", resp.header("x-latchkey-reason"));

    let long = format!("/v1/{}", "a".repeat(8 * 1024 + 10));
    let request =
        format!("GET http://api.test:{port}{long} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n");
    let resp = raw_request(lk.addr(), request.as_bytes());
    assert_denial(&resp, 414, Some("none"), "uri_too_long");
    assert_eq!(
        upstream.received().len(),
        1,
        "the long request was forwarded"
    );

    let records = lk.wait_audit(2);
    assert_record(
        &records[1],
        json!({"method": "GET", "host": "api.test", "decision": "deny", "rule": null,
               "reason": "uri_too_long", "status": 414, "upstream": null}),
    );
}

#[test]
fn a_header_block_of_many_small_headers_over_64_kib_gets_431() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .policy("main.toml", &plain_rule(port))
        .run();

    let mut request = format!("GET http://api.test:{port}/v1/x HTTP/1.1\r\nHost: api.test\r\n");
    for i in 0..1200 {
        request.push_str(&format!("X-Filler-{i:04}: {}\r\n", "b".repeat(48)));
    }
    request.push_str("\r\n");
    assert!(request.len() > 64 * 1024);
    let resp = raw_request(lk.addr(), request.as_bytes());
    assert_eq!(resp.status, 431, "{resp:#?}");
    assert_eq!(upstream.connections(), 0);

    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"decision": "deny", "reason": "header_too_large", "status": 431,
               "upstream": null}),
    );
}

#[test]
fn a_header_block_that_stalls_halfway_gets_408_after_the_header_timeout() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .arg("--header-timeout")
        .arg("1s")
        .policy("main.toml", &plain_rule(port))
        .run();

    let mut tcp = dial(lk.addr());
    let start = Instant::now();
    write!(
        tcp,
        "GET http://api.test:{port}/v1/x HTTP/1.1\r\nHost: api.test\r\nX-Slow: "
    )
    .expect("send half a header block");
    let resp = read_response(&mut tcp, false).expect("a 408 answer");
    let elapsed = start.elapsed();
    assert_denial(&resp, 408, Some("none"), "header_timeout");
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(5),
        "408 after {elapsed:?}, expected about 1 s"
    );
    assert!(
        wait_closed(&mut tcp, Duration::from_secs(3)).is_some(),
        "the connection stayed open after 408"
    );
    assert_eq!(upstream.connections(), 0);

    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"decision": "deny", "rule": null, "reason": "header_timeout", "status": 408,
               "upstream": null}),
    );
}

#[test]
fn an_idle_keep_alive_connection_is_closed_silently_after_the_header_timeout() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .arg("--header-timeout")
        .arg("1s")
        .policy("main.toml", &plain_rule(port))
        .run();

    // A connection that never sends anything, and one that sent a request and went quiet.
    let mut silent = dial(lk.addr());
    let mut used = dial(lk.addr());
    write!(
        used,
        "GET http://api.test:{port}/v1/once HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n"
    )
    .expect("send a request");
    let resp = read_response(&mut used, false).expect("response");
    assert_eq!(resp.status, 200, "{resp:#?}");

    for (what, tcp) in [("silent", &mut silent), ("kept alive", &mut used)] {
        let (bytes, after) = wait_closed(tcp, Duration::from_secs(5))
            .unwrap_or_else(|| panic!("the {what} connection was not closed within 5 s"));
        assert!(
            bytes.is_empty(),
            "the {what} idle connection got an answer: {:?}",
            String::from_utf8_lossy(&bytes)
        );
        assert!(
            after < Duration::from_secs(4),
            "{what}: closed after {after:?}"
        );
    }
    // Only the request leaves a record; idle connections are not refusals.
    let records = lk.wait_audit(1);
    assert_record(&records[0], json!({"reason": "allowed", "status": 200}));
}

#[test]
fn an_idle_tunnel_is_closed_after_the_idle_timeout() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let lk = latchkey()
        .pin("tunnel.test")
        .arg("--idle-timeout")
        .arg("1s")
        .policy(
            "main.toml",
            &format!(
                "[[rules]]\nname = \"tunnel\"\nhosts = [\"tunnel.test\"]\nports = [{port}]\ntunnel = true\n"
            ),
        )
        .run();

    let (mut tcp, resp) = connect_tunnel(lk.addr(), &format!("tunnel.test:{port}"));
    assert_eq!(resp.status, 200, "{resp:#?}");
    let (_, after) = wait_closed(&mut tcp, Duration::from_secs(6))
        .expect("an idle tunnel stayed open past the idle timeout");
    assert!(
        after >= Duration::from_millis(800),
        "the tunnel closed after {after:?}, before the idle timeout"
    );

    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"method": "CONNECT", "decision": "allow", "reason": "tunnel", "rule": "tunnel",
               "upstream": upstream.addr_string()}),
    );
}

/// Opens a connection and makes sure latchkey has taken it (a full request answered).
fn held_connection(lk: &crate::support::Latchkey, port: u16) -> TcpStream {
    let mut tcp = dial(lk.addr());
    write!(
        tcp,
        "GET http://api.test:{port}/v1/hold HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n"
    )
    .expect("send a request");
    let resp = read_response(&mut tcp, false).expect("response on a held connection");
    assert_eq!(resp.status, 200, "{resp:#?}");
    tcp
}

/// Sends a request on a fresh connection, retrying for `limit` while it is refused with 503.
/// Returns the last status and how many attempts were refused (each leaves a record).
fn request_until_admitted(
    lk: &crate::support::Latchkey,
    port: u16,
    limit: Duration,
) -> (u16, usize) {
    let start = Instant::now();
    let mut refused = 0;
    loop {
        let request = format!(
            "GET http://api.test:{port}/v1/later HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n"
        );
        let resp = raw_request(lk.addr(), request.as_bytes());
        if resp.status != 503 || start.elapsed() > limit {
            return (resp.status, refused);
        }
        refused += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_connection_over_the_per_client_cap_gets_503_and_a_freed_slot_is_reused() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .arg("--max-connections-per-client")
        .arg("2")
        .policy("main.toml", &plain_rule(port))
        .run();

    let first = held_connection(&lk, port);
    let _second = held_connection(&lk, port);
    let resp = raw_request(
        lk.addr(),
        format!("GET http://api.test:{port}/v1/third HTTP/1.1\r\nHost: api.test\r\n\r\n")
            .as_bytes(),
    );
    assert_denial(&resp, 503, Some("none"), "too_many_connections");
    assert!(
        resp.text().contains("per-client limit"),
        "the refusal should say which cap: {resp:#?}"
    );
    assert!(resp.header("retry-after").is_some(), "{resp:#?}");

    drop(first);
    let (status, refused) = request_until_admitted(&lk, port, Duration::from_secs(3));
    assert_eq!(status, 200, "a closed connection's slot was not released");

    let records = lk.wait_audit(4 + refused);
    let over: Vec<_> = records
        .iter()
        .filter(|r| r["reason"] == "too_many_connections")
        .collect();
    assert_eq!(over.len(), 1 + refused, "{records:#?}");
    assert_record(
        over[0],
        json!({"decision": "deny", "rule": null, "reason": "too_many_connections",
               "status": 503, "upstream": null}),
    );
    assert_eq!(
        upstream.received().len(),
        3,
        "the refused request was forwarded"
    );
}

#[test]
fn the_connection_over_the_total_cap_gets_503() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .arg("--max-connections")
        .arg("3")
        .policy("main.toml", &plain_rule(port))
        .run();

    let _held: Vec<TcpStream> = (0..3).map(|_| held_connection(&lk, port)).collect();
    let resp = raw_request(
        lk.addr(),
        format!("GET http://api.test:{port}/v1/fourth HTTP/1.1\r\nHost: api.test\r\n\r\n")
            .as_bytes(),
    );
    assert_denial(&resp, 503, Some("none"), "too_many_connections");
    assert!(
        resp.text().contains("3 connections open, its limit"),
        "the refusal should say which cap: {resp:#?}"
    );

    let records = lk.wait_audit(4);
    let over: Vec<_> = records
        .iter()
        .filter(|r| r["reason"] == "too_many_connections")
        .collect();
    assert_eq!(over.len(), 1, "{records:#?}");
    assert_record(
        over[0],
        json!({"decision": "deny", "reason": "too_many_connections", "status": 503,
               "upstream": null}),
    );
    assert_eq!(upstream.received().len(), 3);
}

#[test]
fn an_upstream_that_never_answers_gets_504_after_the_response_timeout() {
    let upstream = Upstream::http_with(handler(|_| async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        hyper::Response::new(full_body("too late"))
    }));
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .arg("--response-timeout")
        .arg("1s")
        .policy("main.toml", &plain_rule(port))
        .run();

    let start = Instant::now();
    let resp = raw_request(
        lk.addr(),
        format!("GET http://api.test:{port}/v1/slow HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n")
            .as_bytes(),
    );
    let elapsed = start.elapsed();
    assert_eq!(resp.status, 504, "{resp:#?}");
    assert_eq!(resp.header("x-latchkey-reason"), Some("upstream_timeout"));
    assert_eq!(resp.header("x-latchkey-rule"), Some("api"));
    assert!(resp.text().contains("api.test"), "{resp:#?}");
    assert!(
        resp.text().contains("--response-timeout"),
        "the flag that lifts it: {resp:#?}"
    );
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(5),
        "504 after {elapsed:?}, expected about 1 s"
    );
    assert_eq!(upstream.received().len(), 1);

    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"decision": "allow", "rule": "api", "reason": "upstream_timeout", "status": 504}),
    );
}

#[test]
fn an_upstream_that_never_accepts_gets_504_after_the_connect_timeout() {
    // A namespace whose link leads to a neighbour that does not exist: a permanent neighbour
    // entry with a MAC nobody has, so SYNs leave and nothing ever answers (a blackhole).
    let proxy = Netns::new("proxy");
    let void = Netns::new("void");
    let (proxy_if, _) = link(&proxy, "10.200.2.1/24", &void, "10.200.2.2/24");
    proxy.ip(&[
        "neigh",
        "add",
        "10.200.2.9",
        "lladdr",
        "02:00:00:00:00:99",
        "dev",
        &proxy_if,
        "nud",
        "permanent",
    ]);
    let lk = latchkey()
        .guarded()
        .netns(proxy.name())
        .arg("--allow-private")
        .arg("10.200.2.0/24")
        .arg("--connect-timeout")
        .arg("1s")
        .resolve("void.test", "10.200.2.9")
        .policy(
            "main.toml",
            "[[rules]]\nname = \"void\"\nhosts = [\"void.test\"]\nports = [8080]\n",
        )
        .run();

    let start = Instant::now();
    let out = curl_in(
        &proxy,
        &lk,
        &["-x", &lk.proxy_url(), "http://void.test:8080/"],
        &[],
    );
    let elapsed = start.elapsed();
    let resp = out.ok();
    assert_eq!(resp.status, 504, "{resp:#?}");
    assert_eq!(resp.header("x-latchkey-reason"), Some("upstream_timeout"));
    assert!(resp.text().contains("10.200.2.9:8080"), "{resp:#?}");
    assert!(
        resp.text().contains("--connect-timeout"),
        "the flag that lifts it: {resp:#?}"
    );
    assert!(
        elapsed < Duration::from_secs(5),
        "504 after {elapsed:?}, expected about 1 s"
    );

    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"decision": "allow", "rule": "void", "reason": "upstream_timeout", "status": 504,
               "upstream": null}),
    );
}

/// An HTTPS echo upstream, latchkey intercepting `api.test` on its port with `args`, and a
/// function opening a TLS session to latchkey inside `CONNECT api.test:PORT`.
fn intercepted(
    args: &[&str],
) -> (
    crate::support::Latchkey,
    Upstream,
    TestCa,
    impl Fn(&crate::support::Latchkey) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
) {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let mut builder = latchkey()
        .upstream_ca(&ca)
        .pin("api.test")
        .policy("main.toml", &plain_rule(port));
    for arg in args {
        builder = builder.arg(arg);
    }
    let lk = builder.run();
    let open = move |lk: &crate::support::Latchkey| {
        let (tcp, resp) = connect_tunnel(lk.addr(), &format!("api.test:{port}"));
        assert_eq!(resp.status, 200, "{resp:#?}");
        let config = tls_config(&lk.ca_pem_path(), &[b"http/1.1"]);
        let name = ServerName::try_from("api.test").expect("server name");
        let conn = rustls::ClientConnection::new(config, name).expect("TLS client");
        rustls::StreamOwned::new(conn, tcp)
    };
    (lk, upstream, ca, open)
}

#[test]
fn the_size_limits_hold_inside_an_intercepted_connect() {
    let (lk, upstream, _ca, open) = intercepted(&[]);
    let port = upstream.port();

    let mut tls = open(&lk);
    let long = "a".repeat(8 * 1024 + 10);
    write!(
        tls,
        "GET /v1/{long} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n"
    )
    .expect("send a long request target");
    let resp = read_response(&mut tls, false).expect("response to a long target");
    assert_denial(&resp, 414, Some("none"), "uri_too_long");

    let mut tls = open(&lk);
    let mut request = format!("GET /v1/x HTTP/1.1\r\nHost: api.test:{port}\r\n");
    for i in 0..1200 {
        request.push_str(&format!("X-Filler-{i:04}: {}\r\n", "b".repeat(48)));
    }
    request.push_str("\r\n");
    // latchkey may answer and close before reading it all.
    let _ = tls.write_all(request.as_bytes());
    let resp = read_response(&mut tls, false).expect("response to a huge header block");
    assert_eq!(resp.status, 431, "{resp:#?}");
    assert_eq!(upstream.connections(), 0);

    let records = lk.wait_audit(2);
    assert_record(
        &records[0],
        json!({"method": "GET", "scheme": "https", "reason": "uri_too_long", "status": 414,
               "upstream": null}),
    );
    assert_record(
        &records[1],
        json!({"decision": "deny", "reason": "header_too_large", "status": 431,
               "upstream": null}),
    );
}

#[test]
fn a_header_block_that_stalls_inside_an_intercepted_connect_gets_408_after_the_header_timeout() {
    let (lk, upstream, _ca, open) = intercepted(&["--header-timeout", "1s"]);
    let port = upstream.port();

    let mut tls = open(&lk);
    write!(
        tls,
        "GET /v1/x HTTP/1.1\r\nHost: api.test:{port}\r\nX-Slow: "
    )
    .expect("send half a header block");
    tls.flush().expect("flush");
    let start = Instant::now();
    tls.get_ref()
        .set_read_timeout(Some(Duration::from_millis(3500)))
        .expect("read timeout");
    let answer = read_response(&mut tls, false);
    let elapsed = start.elapsed();
    assert!(
        elapsed < Duration::from_secs(3),
        "a stalled header block inside CONNECT was held for {elapsed:?} with --header-timeout 1s \
         ({answer:?})"
    );
    let resp = answer.expect("a 408 answer");
    assert_denial(&resp, 408, Some("none"), "header_timeout");
    assert_eq!(upstream.connections(), 0);
    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"decision": "deny", "reason": "header_timeout", "status": 408}),
    );
}

/// A CONNECT keeps its place under the caps for as long as its tunnel (or interception, or
/// WebSocket) lives: hyper hands the socket on, the slot goes with it.
#[test]
fn an_open_tunnel_keeps_its_slot_under_the_per_client_cap() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let lk = latchkey()
        .pin("tunnel.test")
        .arg("--max-connections-per-client")
        .arg("1")
        .policy(
            "main.toml",
            &format!(
                "[[rules]]\nname = \"tunnel\"\nhosts = [\"tunnel.test\"]\nports = [{port}]\ntunnel = true\n"
            ),
        )
        .run();

    let (tcp, resp) = connect_tunnel(lk.addr(), &format!("tunnel.test:{port}"));
    assert_eq!(resp.status, 200, "{resp:#?}");
    std::thread::sleep(Duration::from_millis(200));
    let over = raw_request(
        lk.addr(),
        format!("CONNECT tunnel.test:{port} HTTP/1.1\r\nHost: tunnel.test:{port}\r\n\r\n")
            .as_bytes(),
    );
    assert_denial(&over, 503, Some("none"), "too_many_connections");

    drop(tcp);
    let start = Instant::now();
    loop {
        let (_tcp, resp) = connect_tunnel(lk.addr(), &format!("tunnel.test:{port}"));
        if resp.status == 200 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "a closed tunnel's slot was not released: {resp:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

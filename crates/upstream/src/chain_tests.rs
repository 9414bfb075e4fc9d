use super::*;
use crate::reason::Reason;
use crate::{Cidr, Dialer, UpstreamConfig, UpstreamError};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

const PASSWORD: &str = "s3cret-proxy-pass";

struct Fixed(&'static str);

impl ProxyPassword for Fixed {
    fn password(&self) -> PasswordFuture<'_> {
        let v = self.0.as_bytes().to_vec();
        Box::pin(async move { Ok(Zeroizing::new(v)) })
    }
}

struct Failing;

impl ProxyPassword for Failing {
    fn password(&self) -> PasswordFuture<'_> {
        Box::pin(async { Err("secret \"upstream-proxy\" is unavailable: not loaded".to_string()) })
    }
}

fn url(raw: &str) -> ProxyUrl {
    ProxyUrl::parse(raw).expect("proxy url")
}

fn auth(password: Arc<dyn ProxyPassword>) -> Option<ProxyAuth> {
    Some(ProxyAuth::new("alice", password).expect("auth"))
}

/// A dialer through `proxy` at `addr`, with `internal.test` pinned to 10.1.2.7 and that range
/// opened, so the guard lets it through and the CONNECT target is known.
fn dialer(addr: SocketAddr, scheme: &str, auth: Option<ProxyAuth>, bypass: &[&str]) -> Dialer {
    let mut config = UpstreamConfig {
        connect_timeout: Duration::from_millis(500),
        allow_private: vec![Cidr::parse("10.1.2.0/24").expect("cidr")],
        ..UpstreamConfig::default()
    };
    config
        .resolve
        .insert("internal.test".into(), "10.1.2.7".parse().expect("ip"));
    config.proxy = Some(UpstreamProxy {
        url: url(&format!("{scheme}://{addr}")),
        auth,
        bypass: Bypass::parse(bypass).expect("bypass"),
    });
    Dialer::new(&config)
}

/// A one-connection HTTP proxy: reads the request head, writes `answer`, then returns the head
/// and whatever the client wrote afterwards (until it closed).
async fn fake_http_proxy(answer: Vec<u8>) -> (SocketAddr, JoinHandle<(String, Vec<u8>)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if s.read_exact(&mut byte).await.is_err() {
                break;
            }
            head.push(byte[0]);
        }
        let _ = s.write_all(&answer).await;
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest).await;
        (String::from_utf8_lossy(&head).into_owned(), rest)
    });
    (addr, task)
}

#[test]
fn proxy_urls_take_a_scheme_a_host_and_a_port_and_nothing_else() {
    let u = url("http://10.0.0.5:3128");
    assert_eq!(
        (u.scheme, u.host.as_str(), u.port),
        (ProxyScheme::Http, "10.0.0.5", 3128)
    );
    let u = url("SOCKS5://Proxy.Corp.:1080/");
    assert_eq!(
        (u.scheme, u.host.as_str()),
        (ProxyScheme::Socks5, "proxy.corp")
    );
    assert_eq!(url("http://[::1]:3128").to_string(), "http://[::1]:3128");
    for (raw, want) in [
        ("https://p:443", "https:// proxy"),
        ("socks5h://p:1080", "socks5h://"),
        ("socks4://p:1080", "unsupported scheme"),
        ("http://p:3128/path", "no path"),
        ("http://p:3128?x=1", "no path"),
        ("http://p", "explicit port"),
        ("http://p:0", "bad port"),
        ("http://p:99999", "bad port"),
        ("p:3128", "expected http://"),
        ("http://[::1:3128", "unclosed"),
    ] {
        let e = ProxyUrl::parse(raw).expect_err(raw).to_string();
        assert!(e.contains(want), "{raw}: {e}");
    }
}

#[test]
fn a_proxy_url_with_userinfo_is_refused_without_echoing_it() {
    let e = ProxyUrl::parse("http://alice:hunter2@p:3128").expect_err("userinfo");
    assert_eq!(e, ProxyUrlError::Userinfo);
    assert!(!e.to_string().contains("hunter2"), "{e}");
    assert!(
        e.to_string().contains("--upstream-proxy-credentials"),
        "{e}"
    );
}

#[test]
fn bypass_entries_are_hosts_suffixes_addresses_and_cidrs() {
    let b = Bypass::parse(&[
        "10.0.0.0/8",
        ".internal",
        "*.corp.example",
        "localhost",
        "192.0.2.9",
        "[fd00::1]",
        "",
    ])
    .expect("bypass");
    let public: IpAddr = "203.0.113.7".parse().expect("ip");
    let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
    assert!(b.matches("localhost", public));
    assert!(b.matches("LOCALHOST.", public));
    assert!(b.matches("git.internal", public));
    assert!(b.matches("a.b.corp.example", public));
    assert!(
        !b.matches("internal", public),
        "a suffix matches names under it only"
    );
    assert!(!b.matches("corp.example", public));
    assert!(!b.matches("notinternal", public));
    assert!(!b.matches("api.example.com", public));
    assert!(
        b.matches("api.example.com", ip("10.9.8.7")),
        "by the checked address"
    );
    assert!(
        b.matches("x", ip("::ffff:10.9.8.7")),
        "an IPv4-mapped address too"
    );
    assert!(b.matches("x", ip("192.0.2.9")));
    assert!(!b.matches("x", ip("192.0.2.10")));
    assert!(b.matches("x", ip("fd00::1")));
    assert!(Bypass::parse::<&str>(&[]).expect("empty").is_empty());
}

#[test]
fn every_bad_bypass_entry_is_named() {
    let errors = Bypass::parse(&[
        "10.0.0.0/33",
        "*",
        "a*b.test",
        "host:8080",
        "ok.test",
        "bad host",
    ])
    .expect_err("bad");
    assert_eq!(errors.len(), 5, "{errors:?}");
    for entry in ["10.0.0.0/33", "\"*\"", "a*b.test", "host:8080", "bad host"] {
        assert!(
            errors.iter().any(|e| e.contains(entry)),
            "{entry}: {errors:?}"
        );
    }
}

#[tokio::test]
async fn connect_asks_for_the_checked_address_with_basic_auth_and_leaves_a_raw_pipe() {
    let (addr, proxy) =
        fake_http_proxy(b"HTTP/1.1 200 Connection established\r\n\r\n".to_vec()).await;
    let d = dialer(addr, "http", auth(Arc::new(Fixed(PASSWORD))), &[]);
    let mut dialed = d.dial("internal.test", 443, &[]).await.expect("dialed");
    assert_eq!(
        dialed.addr,
        "10.1.2.7:443".parse::<SocketAddr>().expect("addr")
    );
    dialed
        .stream
        .write_all(b"\x16\x03\x01 tls bytes")
        .await
        .expect("write");
    drop(dialed);
    let (head, rest) = proxy.await.expect("proxy");
    assert!(
        head.starts_with("CONNECT 10.1.2.7:443 HTTP/1.1\r\n"),
        "{head}"
    );
    assert!(
        !head.contains("internal.test"),
        "the name never reaches the proxy: {head}"
    );
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("alice:{PASSWORD}"));
    assert!(
        head.contains(&format!("Proxy-Authorization: Basic {basic}\r\n")),
        "{head}"
    );
    assert_eq!(rest, b"\x16\x03\x01 tls bytes");
}

#[tokio::test]
async fn a_407_is_an_unreachable_upstream_naming_the_proxy_and_never_the_password() {
    let answer = b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"corp\"\r\nContent-Length: 0\r\n\r\n";
    let (addr, _proxy) = fake_http_proxy(answer.to_vec()).await;
    let d = dialer(addr, "http", auth(Arc::new(Fixed(PASSWORD))), &[]);
    let e = d.dial("internal.test", 443, &[]).await.expect_err("407");
    let text = e.to_string();
    assert!(matches!(e, UpstreamError::Proxy { .. }), "{text}");
    assert_eq!(e.reason(), Reason::UpstreamUnreachable);
    assert!(
        text.contains(&format!("upstream proxy http://{addr}")),
        "{text}"
    );
    assert!(
        text.contains("HTTP/1.1 407 Proxy Authentication Required"),
        "{text}"
    );
    assert!(text.contains("CONNECT 10.1.2.7:443"), "{text}");
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("alice:{PASSWORD}"));
    for shown in [text, format!("{e:?}"), format!("{d:?}")] {
        assert!(
            !shown.contains(PASSWORD) && !shown.contains(&basic),
            "{shown}"
        );
    }
}

#[tokio::test]
async fn the_password_is_in_no_debug_output_or_error() {
    let a = auth(Arc::new(Fixed(PASSWORD))).expect("auth");
    let shown = format!("{a:?}");
    assert!(
        shown.contains("alice") && !shown.contains(PASSWORD),
        "{shown}"
    );
    let config = UpstreamConfig {
        proxy: Some(UpstreamProxy {
            url: url("http://127.0.0.1:9"),
            auth: Some(a),
            bypass: Bypass::default(),
        }),
        ..UpstreamConfig::default()
    };
    assert!(!format!("{config:?}").contains(PASSWORD));
    // A password source that fails says why, never a value.
    let (addr, _proxy) = fake_http_proxy(Vec::new()).await;
    let d = dialer(addr, "http", auth(Arc::new(Failing)), &[]);
    let e = d
        .dial("internal.test", 443, &[])
        .await
        .expect_err("no password");
    assert!(
        e.to_string().contains("--upstream-proxy-credentials"),
        "{e}"
    );
}

#[tokio::test]
async fn an_over_long_answer_head_is_refused() {
    let mut answer = b"HTTP/1.1 200 OK\r\n".to_vec();
    answer.extend_from_slice(b"X-Filler: ");
    answer.extend(std::iter::repeat_n(b'a', HEAD_CAP));
    let (addr, _proxy) = fake_http_proxy(answer).await;
    let d = dialer(addr, "http", None, &[]);
    let e = d
        .dial("internal.test", 443, &[])
        .await
        .expect_err("too long");
    assert!(e.to_string().contains("longer than 8 KiB"), "{e}");
    assert_eq!(e.reason(), Reason::UpstreamUnreachable);
}

#[tokio::test]
async fn bytes_the_proxy_sends_after_its_head_are_kept_for_the_caller() {
    let (addr, _proxy) =
        fake_http_proxy(b"HTTP/1.0 200 OK\r\nVia: corp\r\n\r\nSSH-2.0-early\r\n".to_vec()).await;
    let d = dialer(addr, "http", None, &[]);
    let mut dialed = d.dial("internal.test", 22, &[]).await.expect("dialed");
    let mut early = [0u8; 15];
    dialed
        .stream
        .read_exact(&mut early)
        .await
        .expect("early data");
    assert_eq!(&early, b"SSH-2.0-early\r\n");
}

#[tokio::test]
async fn a_proxy_that_never_answers_is_an_upstream_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let _held = tokio::spawn(async move {
        let (s, _) = listener.accept().await.expect("accept");
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(s);
    });
    let d = dialer(addr, "http", None, &[]);
    let e = d
        .dial("internal.test", 443, &[])
        .await
        .expect_err("timeout");
    assert_eq!(e.reason(), Reason::UpstreamTimeout, "{e}");
    assert!(e.to_string().contains("--connect-timeout"), "{e}");
}

#[tokio::test]
async fn a_bypassed_host_or_address_is_dialed_directly() {
    let upstream = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = upstream.local_addr().expect("addr").port();
    // The proxy address is a closed port: any attempt through it would fail.
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let proxy = closed.local_addr().expect("addr");
    drop(closed);
    let opened = [Cidr::parse("127.0.0.0/8").expect("cidr")];
    for bypass in [["localhost"], ["127.0.0.0/8"]] {
        let d = dialer(proxy, "http", None, &bypass);
        let dialed = d.dial("localhost", port, &opened).await;
        assert!(dialed.is_ok(), "{bypass:?}: {:?}", dialed.err());
    }
    let d = dialer(proxy, "http", None, &[".other"]);
    let e = d
        .dial("localhost", port, &opened)
        .await
        .expect_err("through the proxy");
    assert!(
        e.to_string().contains("cannot connect to upstream proxy"),
        "{e}"
    );
}

#[tokio::test]
async fn the_guard_still_refuses_a_private_address_though_the_proxy_could_reach_it() {
    let (addr, proxy) = fake_http_proxy(b"HTTP/1.1 200 OK\r\n\r\n".to_vec()).await;
    let d = dialer(addr, "http", None, &[]);
    let e = d.dial("127.0.0.1", 80, &[]).await.expect_err("refused");
    assert_eq!(e.reason(), Reason::NonPublicAddress, "{e}");
    assert!(!proxy.is_finished());
    proxy.abort();
}

/// A one-connection SOCKS5 proxy: checks the greeting, takes `user:pass` when `creds` is set,
/// returns the CONNECT request it received after answering `reply`.
async fn fake_socks5(creds: Option<&'static str>, reply: u8) -> (SocketAddr, JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut head = [0u8; 2];
        s.read_exact(&mut head).await.expect("greeting");
        let mut methods = vec![0u8; usize::from(head[1])];
        s.read_exact(&mut methods).await.expect("methods");
        if let Some(creds) = creds {
            assert!(methods.contains(&2), "{methods:?}");
            s.write_all(&[5, 2]).await.expect("choice");
            let mut b = [0u8; 2];
            s.read_exact(&mut b).await.expect("auth");
            let mut user = vec![0u8; usize::from(b[1])];
            s.read_exact(&mut user).await.expect("user");
            let mut plen = [0u8; 1];
            s.read_exact(&mut plen).await.expect("plen");
            let mut pass = vec![0u8; usize::from(plen[0])];
            s.read_exact(&mut pass).await.expect("pass");
            let got = format!(
                "{}:{}",
                String::from_utf8_lossy(&user),
                String::from_utf8_lossy(&pass)
            );
            let ok = if got == creds { 0 } else { 1 };
            s.write_all(&[1, ok]).await.expect("auth status");
            if ok != 0 {
                return Vec::new();
            }
        } else {
            s.write_all(&[5, 0]).await.expect("choice");
        }
        let mut request = vec![0u8; 10];
        s.read_exact(&mut request).await.expect("request");
        s.write_all(&[5, reply, 0, 1, 0, 0, 0, 0, 0, 0])
            .await
            .expect("reply");
        s.write_all(b"hi").await.expect("early");
        request
    });
    (addr, task)
}

#[tokio::test]
async fn socks5_connects_by_the_checked_address_with_and_without_credentials() {
    let (addr, proxy) = fake_socks5(None, 0).await;
    let d = dialer(addr, "socks5", None, &[]);
    let mut dialed = d.dial("internal.test", 443, &[]).await.expect("dialed");
    let mut hi = [0u8; 2];
    dialed
        .stream
        .read_exact(&mut hi)
        .await
        .expect("data after the reply");
    assert_eq!(&hi, b"hi");
    assert_eq!(
        proxy.await.expect("proxy"),
        vec![5, 1, 0, 1, 10, 1, 2, 7, 1, 187]
    );

    let (addr, proxy) = fake_socks5(Some("alice:s3cret-proxy-pass"), 0).await;
    let d = dialer(addr, "socks5", auth(Arc::new(Fixed(PASSWORD))), &[]);
    d.dial("internal.test", 443, &[])
        .await
        .expect("dialed with credentials");
    assert_eq!(proxy.await.expect("proxy")[..4], [5, 1, 0, 1]);

    let (addr, _proxy) = fake_socks5(Some("alice:other"), 0).await;
    let d = dialer(addr, "socks5", auth(Arc::new(Fixed(PASSWORD))), &[]);
    let e = d
        .dial("internal.test", 443, &[])
        .await
        .expect_err("bad credentials");
    assert!(
        e.to_string()
            .contains("authentication failed for user \"alice\""),
        "{e}"
    );
    assert!(!e.to_string().contains(PASSWORD), "{e}");
}

#[tokio::test]
async fn a_socks5_refusal_names_the_reply() {
    let (addr, _proxy) = fake_socks5(None, 2).await;
    let d = dialer(addr, "socks5", None, &[]);
    let e = d
        .dial("internal.test", 443, &[])
        .await
        .expect_err("refused");
    assert!(
        e.to_string()
            .contains("SOCKS5 reply 2: connection not allowed by ruleset"),
        "{e}"
    );
    assert!(e.to_string().contains(&format!("socks5://{addr}")), "{e}");
    assert_eq!(e.reason(), Reason::UpstreamUnreachable);
}

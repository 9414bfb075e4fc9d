//! Chaining through the operator's own egress proxy (`latchkey serve --upstream-proxy URL`).
//!
//! Owns the upstream-proxy settings (the URL, the credentials, the bypass list) and the two
//! handshakes that turn a connection to that proxy into a raw byte pipe to one upstream: HTTP
//! `CONNECT` and SOCKS5 `CONNECT`. It never resolves an upstream's name and never decides
//! whether an address may be dialed: [`crate::Dialer::dial`] resolves and guards exactly as
//! without a proxy, then hands this module **the address it checked**, and the proxy is asked
//! for `CONNECT ip:port`, never `CONNECT name:port`, so the proxy cannot resolve the name to
//! something the guard never saw. (A corporate proxy whose ACL is by domain name must therefore
//! allow the addresses.) Plain-`http://` upstreams go the same way, so the proxy must allow
//! CONNECT to their ports too; after a `2xx` the caller does its own TLS over the stream, so
//! latchkey's certificate checks stay end to end and the proxy sees ciphertext.
//!
//! The proxy's own address is dialed directly and not guarded: it is the operator's
//! configuration and usually a private address. Everything is bounded: the proxy's answer head
//! is read with `httparse`, at most [`HEAD_CAP`] bytes, under `--connect-timeout`, and bytes the
//! proxy sends after its head are left unread in the socket for the caller (the head is peeked
//! and only its own bytes consumed). The password is fetched per connection through
//! [`ProxyPassword`] (a rotating `exec:` source keeps working), held in zeroizing buffers, and
//! never formatted: not in errors, logs or `Debug`.
//!
//! ```text
//! proxy = UpstreamProxy::new(ProxyUrl::parse("http://10.0.0.5:3128")?, None,
//!                            Bypass::parse(&["10.0.0.0/8", ".internal"])?);
//! dial("api.example.com", 443) → resolve 203.0.113.7 → guard OK → CONNECT 203.0.113.7:443
//! dial("git.internal", 443)    → resolve 10.1.2.3 (opened by --allow-private) → guard OK → direct
//! ```

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use ipnet::IpNet;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use zeroize::Zeroizing;

use crate::wire::host::normalize_host;

/// The most bytes of a proxy's answer head latchkey reads before giving up on it.
pub const HEAD_CAP: usize = 8 * 1024;

/// How many header lines a proxy's answer may carry.
const MAX_HEADERS: usize = 64;

/// The proxy protocol of `--upstream-proxy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyScheme {
    /// `http://`: HTTP/1.1 `CONNECT` (RFC 9110 §9.3.6), `Proxy-Authorization: Basic`.
    Http,
    /// `socks5://`: RFC 1928 `CONNECT` by address, RFC 1929 username/password.
    Socks5,
}

/// A validated `--upstream-proxy` URL: a scheme, a host and a port, nothing else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyUrl {
    pub scheme: ProxyScheme,
    /// Normalised host: a DNS name or a canonical IP literal (no brackets).
    pub host: String,
    pub port: u16,
}

/// Why an `--upstream-proxy` URL was refused. Never echoes a URL that held userinfo.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProxyUrlError {
    #[error("expected http://HOST:PORT or socks5://HOST:PORT")]
    NotUrl,
    #[error("credentials do not belong in the URL (argv and logs would show them); give them with --upstream-proxy-credentials USER:SOURCE")]
    Userinfo,
    #[error("{0:?}: an https:// proxy (TLS to the proxy itself) is not supported; use http://HOST:PORT (latchkey's own TLS to the upstream is end to end inside the CONNECT tunnel either way)")]
    Https(String),
    #[error("{0:?}: socks5h:// asks the proxy to resolve names, but latchkey resolves and checks every address itself; use socks5://HOST:PORT")]
    Socks5h(String),
    #[error("{0:?}: unsupported scheme; use http:// or socks5://")]
    Scheme(String),
    #[error("{0:?}: a proxy URL has no path, query or fragment; expected SCHEME://HOST:PORT")]
    Path(String),
    #[error("{0:?}: needs an explicit port, e.g. http://proxy.corp:3128")]
    NoPort(String),
    #[error("{0:?}: bad port")]
    BadPort(String),
    #[error("{url:?}: bad host: {why}")]
    BadHost { url: String, why: String },
}

impl ProxyUrl {
    /// Parses `http://HOST:PORT` or `socks5://HOST:PORT` (an IPv6 host in brackets; one trailing
    /// `/` tolerated). Refuses `https://`, `socks5h://`, userinfo, paths, queries, fragments and
    /// a missing port.
    pub fn parse(raw: &str) -> Result<Self, ProxyUrlError> {
        // First, before anything echoes `raw`: userinfo may be a password.
        if raw.contains('@') {
            return Err(ProxyUrlError::Userinfo);
        }
        let (scheme, rest) = raw.split_once("://").ok_or(ProxyUrlError::NotUrl)?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => ProxyScheme::Http,
            "socks5" => ProxyScheme::Socks5,
            "https" => return Err(ProxyUrlError::Https(raw.to_string())),
            "socks5h" => return Err(ProxyUrlError::Socks5h(raw.to_string())),
            _ => return Err(ProxyUrlError::Scheme(raw.to_string())),
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#']) {
            return Err(ProxyUrlError::Path(raw.to_string()));
        }
        let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
            let (host, after) =
                bracketed
                    .split_once(']')
                    .ok_or_else(|| ProxyUrlError::BadHost {
                        url: raw.to_string(),
                        why: "unclosed '['".to_string(),
                    })?;
            let port = after
                .strip_prefix(':')
                .ok_or_else(|| ProxyUrlError::NoPort(raw.to_string()))?;
            (host, port)
        } else {
            authority
                .rsplit_once(':')
                .ok_or_else(|| ProxyUrlError::NoPort(raw.to_string()))?
        };
        let port = match port.parse::<u16>() {
            Ok(0) | Err(_) => return Err(ProxyUrlError::BadPort(raw.to_string())),
            Ok(p) => p,
        };
        let host = normalize_host(host).map_err(|e| ProxyUrlError::BadHost {
            url: raw.to_string(),
            why: e.to_string(),
        })?;
        Ok(Self { scheme, host, port })
    }
}

impl fmt::Display for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            ProxyScheme::Http => "http",
            ProxyScheme::Socks5 => "socks5",
        };
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => write!(f, "{scheme}://[{ip}]:{}", self.port),
            _ => write!(f, "{scheme}://{}:{}", self.host, self.port),
        }
    }
}

/// A future that yields the proxy password.
pub type PasswordFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Zeroizing<Vec<u8>>, String>> + Send + 'a>>;

/// Where the proxy password comes from, asked once per proxied connection (so a rotating
/// source is followed). The error text must never hold the value.
pub trait ProxyPassword: Send + Sync {
    fn password(&self) -> PasswordFuture<'_>;
}

/// `--upstream-proxy-credentials`: a user name and where its password comes from. `Debug`
/// shows the user only.
#[derive(Clone)]
pub struct ProxyAuth {
    user: String,
    password: Arc<dyn ProxyPassword>,
}

impl fmt::Debug for ProxyAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyAuth")
            .field("user", &self.user)
            .field("password", &format_args!("<hidden>"))
            .finish()
    }
}

impl ProxyAuth {
    /// A user name (non-empty, at most 255 bytes — SOCKS5's limit, no `:` — Basic's separator,
    /// no control characters) and its password source.
    pub fn new(user: &str, password: Arc<dyn ProxyPassword>) -> Result<Self, String> {
        if user.is_empty() {
            return Err("the user name is empty; expected USER:SOURCE".to_string());
        }
        if user.len() > 255 || user.contains(':') || user.chars().any(char::is_control) {
            return Err(format!(
                "user {user:?}: at most 255 bytes, no ':' and no control characters"
            ));
        }
        Ok(Self {
            user: user.to_string(),
            password,
        })
    }

    pub fn user(&self) -> &str {
        &self.user
    }
}

/// `--upstream-proxy-bypass`: destinations dialed directly. An exact host, a domain suffix
/// (`.corp.example` or `*.corp.example`: names *under* it, not the bare domain), an IP address
/// or a CIDR (matched against the checked address, whatever name led to it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bypass {
    hosts: Vec<String>,
    suffixes: Vec<String>,
    nets: Vec<IpNet>,
}

impl Bypass {
    /// Parses every entry; returns every bad one, each message naming its entry. Blank entries
    /// (a trailing comma) are skipped.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, Vec<String>> {
        let mut bypass = Bypass::default();
        let mut errors = Vec::new();
        for raw in entries {
            let entry = raw.as_ref().trim();
            if entry.is_empty() {
                continue;
            }
            if let Err(why) = bypass.add(entry) {
                errors.push(format!("{entry:?}: {why}"));
            }
        }
        if errors.is_empty() {
            Ok(bypass)
        } else {
            Err(errors)
        }
    }

    fn add(&mut self, entry: &str) -> Result<(), String> {
        if entry.contains('/') {
            let net = entry
                .parse::<IpNet>()
                .map_err(|_| "not a CIDR (e.g. 10.0.0.0/8 or fd00::/8)".to_string())?;
            self.nets.push(net.trunc());
            return Ok(());
        }
        let unbracketed = entry
            .strip_prefix('[')
            .and_then(|e| e.strip_suffix(']'))
            .unwrap_or(entry);
        if let Ok(ip) = unbracketed.parse::<IpAddr>() {
            self.nets.push(IpNet::from(ip));
            return Ok(());
        }
        if let Some(suffix) = entry.strip_prefix("*.").or_else(|| entry.strip_prefix('.')) {
            let suffix = normalize_host(suffix).map_err(|e| e.to_string())?;
            if suffix.parse::<IpAddr>().is_ok() {
                return Err("a domain suffix cannot be an address; use a CIDR".to_string());
            }
            self.suffixes.push(format!(".{suffix}"));
            return Ok(());
        }
        if entry == "*" {
            return Err("would bypass every host; leave --upstream-proxy unset instead".into());
        }
        if entry.contains('*') {
            return Err("'*' is only allowed as a leading '*.'".to_string());
        }
        if entry.contains(':') {
            return Err("an entry names a host, not a port (drop ':PORT')".to_string());
        }
        let host = normalize_host(entry).map_err(|e| e.to_string())?;
        self.hosts.push(host);
        Ok(())
    }

    /// Whether a connection to `host` (as dialed; normalised) at the checked `addr` goes direct.
    pub fn matches(&self, host: &str, addr: IpAddr) -> bool {
        let host = host.trim_end_matches('.');
        let by_name = || {
            self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
                || self.suffixes.iter().any(|s| {
                    host.len() > s.len()
                        && host
                            .get(host.len() - s.len()..)
                            .is_some_and(|tail| tail.eq_ignore_ascii_case(s))
                })
        };
        let addr = canonical(addr);
        self.nets.iter().any(|n| n.contains(&addr)) || by_name()
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty() && self.suffixes.is_empty() && self.nets.is_empty()
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it carries, so `10.0.0.0/8` bypasses it.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

/// The whole `--upstream-proxy` configuration.
#[derive(Clone, Debug)]
pub struct UpstreamProxy {
    pub url: ProxyUrl,
    pub auth: Option<ProxyAuth>,
    pub bypass: Bypass,
}

impl UpstreamProxy {
    /// Whether `host` at the checked `addr` is dialed directly.
    pub fn bypasses(&self, host: &str, addr: IpAddr) -> bool {
        self.bypass.matches(host, addr)
    }
}

/// Why a connection through the upstream proxy failed. Messages name the proxy (never its
/// credentials) and the checked address asked for.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("cannot resolve upstream proxy {proxy}: {source}")]
    Resolve {
        proxy: String,
        source: std::io::Error,
    },
    #[error("cannot connect to upstream proxy {proxy} at {addr}: {source}")]
    Connect {
        proxy: String,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("upstream proxy {proxy} did not complete CONNECT {target} in time (latchkey serve --connect-timeout)")]
    Timeout { proxy: String, target: SocketAddr },
    #[error("upstream proxy {proxy} refused CONNECT {target}: {answer}")]
    Refused {
        proxy: String,
        target: SocketAddr,
        answer: String,
    },
    #[error("upstream proxy {proxy} gave a bad answer to CONNECT {target}: {why}")]
    Protocol {
        proxy: String,
        target: SocketAddr,
        why: String,
    },
    #[error("upstream proxy {proxy}: CONNECT {target}: {source}")]
    Io {
        proxy: String,
        target: SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "upstream proxy {proxy}: cannot read the password of --upstream-proxy-credentials: {why}"
    )]
    Password { proxy: String, why: String },
}

impl ChainError {
    /// Whether the failure was the proxy (or the path to it) running out of time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, ChainError::Timeout { .. })
    }
}

/// Connects to the proxy and asks it for a pipe to `target` (the checked address). Returns the
/// stream positioned at the first byte from the upstream.
pub(crate) async fn connect_via(
    proxy: &UpstreamProxy,
    pins: &HashMap<String, IpAddr>,
    target: SocketAddr,
    timeout: Duration,
) -> Result<TcpStream, ChainError> {
    let name = proxy.url.to_string();
    let mut stream = dial_proxy(&proxy.url, pins, timeout, target).await?;
    let handshake = async {
        match proxy.url.scheme {
            ProxyScheme::Http => http_connect(&mut stream, proxy, target).await,
            ProxyScheme::Socks5 => crate::socks5::connect(&mut stream, proxy, target).await,
        }
    };
    match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(())) => Ok(stream),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ChainError::Timeout {
            proxy: name,
            target,
        }),
    }
}

/// Resolves the proxy (pins first) and connects to its first reachable address, unguarded: the
/// proxy is the operator's own configuration.
async fn dial_proxy(
    url: &ProxyUrl,
    pins: &HashMap<String, IpAddr>,
    timeout: Duration,
    target: SocketAddr,
) -> Result<TcpStream, ChainError> {
    let name = url.to_string();
    let addrs: Vec<SocketAddr> = if let Ok(ip) = url.host.parse::<IpAddr>() {
        vec![SocketAddr::new(ip, url.port)]
    } else if let Some(ip) = pins.get(&url.host) {
        vec![SocketAddr::new(*ip, url.port)]
    } else {
        tokio::net::lookup_host((url.host.as_str(), url.port))
            .await
            .map_err(|source| ChainError::Resolve {
                proxy: name.clone(),
                source,
            })?
            .collect()
    };
    let mut last = None;
    for addr in addrs {
        // The proxy's own address: dialed as configured (see the module docs).
        #[allow(clippy::disallowed_methods)]
        let connect = TcpStream::connect(addr);
        match tokio::time::timeout(timeout, connect).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(source)) => {
                last = Some(ChainError::Connect {
                    proxy: name.clone(),
                    addr,
                    source,
                })
            }
            Err(_) => {
                last = Some(ChainError::Timeout {
                    proxy: name.clone(),
                    target,
                })
            }
        }
    }
    Err(last.unwrap_or_else(|| ChainError::Resolve {
        proxy: name,
        source: std::io::Error::other("no address"),
    }))
}

/// The password, fetched now, for a handshake about to use it.
pub(crate) async fn fetch_password(
    proxy: &UpstreamProxy,
    auth: &ProxyAuth,
) -> Result<Zeroizing<Vec<u8>>, ChainError> {
    auth.password
        .password()
        .await
        .map_err(|why| ChainError::Password {
            proxy: proxy.url.to_string(),
            why,
        })
}

/// HTTP `CONNECT ip:port`, then the answer head; a `2xx` leaves the stream a raw pipe.
async fn http_connect(
    stream: &mut TcpStream,
    proxy: &UpstreamProxy,
    target: SocketAddr,
) -> Result<(), ChainError> {
    let name = proxy.url.to_string();
    let io = |source| ChainError::Io {
        proxy: name.clone(),
        target,
        source,
    };
    let mut request = Zeroizing::new(Vec::with_capacity(256));
    request
        .extend_from_slice(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n").as_bytes());
    if let Some(auth) = &proxy.auth {
        let password = fetch_password(proxy, auth).await?;
        let mut pair = Zeroizing::new(Vec::with_capacity(auth.user.len() + 1 + password.len()));
        pair.extend_from_slice(auth.user.as_bytes());
        pair.push(b':');
        pair.extend_from_slice(&password);
        let encoded = Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(&*pair));
        request.extend_from_slice(b"Proxy-Authorization: Basic ");
        request.extend_from_slice(encoded.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"\r\n");
    stream.write_all(&request).await.map_err(io)?;
    let answer = read_head(stream).await.map_err(|e| match e {
        HeadError::Io(source) => io(source),
        HeadError::Bad(why) => ChainError::Protocol {
            proxy: name.clone(),
            target,
            why,
        },
    })?;
    if (200..300).contains(&answer.code) {
        Ok(())
    } else {
        Err(ChainError::Refused {
            proxy: name.clone(),
            target,
            answer: answer.status_line,
        })
    }
}

/// A proxy's answer head, as much as latchkey uses of it.
#[derive(Debug)]
pub(crate) struct Answer {
    pub code: u16,
    /// `HTTP/1.1 407 Proxy Authentication Required`, the reason phrase made printable.
    pub status_line: String,
}

#[derive(Debug)]
pub(crate) enum HeadError {
    Io(std::io::Error),
    Bad(String),
}

/// Reads one answer head and nothing after it: the socket is peeked, the head parsed with
/// `httparse`, and only the head's own bytes consumed, so data the proxy sent after it stays
/// in the socket for the caller. While the head is incomplete every peeked byte belongs to it
/// and is consumed, so each peek waits for new bytes (no spinning).
pub(crate) async fn read_head(stream: &mut TcpStream) -> Result<Answer, HeadError> {
    let mut head: Vec<u8> = Vec::with_capacity(512);
    let mut window = vec![0u8; HEAD_CAP + 1];
    loop {
        let room = HEAD_CAP + 1 - head.len();
        let n = stream
            .peek(&mut window[..room])
            .await
            .map_err(HeadError::Io)?;
        if n == 0 {
            return Err(HeadError::Bad(
                "the proxy closed the connection before a complete answer".to_string(),
            ));
        }
        let mut seen = head.clone();
        seen.extend_from_slice(&window[..n]);
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&seen) {
            Ok(httparse::Status::Complete(len)) if len <= HEAD_CAP => {
                let mut own = vec![0u8; len - head.len()];
                stream.read_exact(&mut own).await.map_err(HeadError::Io)?;
                let code = response.code.unwrap_or_default();
                let status_line = format!(
                    "HTTP/1.{} {code} {}",
                    response.version.unwrap_or(1),
                    printable(response.reason.unwrap_or_default())
                );
                return Ok(Answer {
                    code,
                    status_line: status_line.trim_end().to_string(),
                });
            }
            Ok(httparse::Status::Partial) if seen.len() <= HEAD_CAP => {
                let mut own = vec![0u8; n];
                stream.read_exact(&mut own).await.map_err(HeadError::Io)?;
                head = seen;
            }
            Ok(_) => {
                return Err(HeadError::Bad(format!(
                    "the answer head is longer than {} KiB",
                    HEAD_CAP / 1024
                )))
            }
            Err(e) => return Err(HeadError::Bad(format!("unparsable answer head: {e}"))),
        }
    }
}

/// A proxy's reason phrase, safe to put in a log line: printable ASCII, at most 80 characters.
fn printable(reason: &str) -> String {
    reason
        .chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(80)
        .collect()
}

#[cfg(test)]
#[path = "chain_tests.rs"]
mod tests;

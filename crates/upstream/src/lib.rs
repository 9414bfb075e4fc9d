//! Upstream: the only way out. Every byte latchkey sends to an upstream — forwarded requests,
//! raw tunnels and (later) token exchanges — goes through [`Dialer::dial`].
//!
//! The dialer resolves a name (operator pins from `--resolve` first), checks each resolved
//! address with the [`AddressGuard`], and connects to exactly the address that was checked: the
//! name is never resolved a second time by anyone else. [`Connector`] adds verified TLS (webpki
//! roots plus `--upstream-ca`) with ALPN h2/http1.1 on top and plugs into hyper-util's pooled
//! client, so pooled connections are reused only for the same scheme and authority.
//!
//! With `--upstream-proxy` (`chain.rs`, `socks5.rs`) the dialer still resolves and guards
//! every address itself, then asks the operator's proxy for a pipe to exactly the checked
//! address (unless `--upstream-proxy-bypass` names the host or address); TLS stays latchkey's.
//!
//! Depends on `reason` and `wire` (host forms, CIDRs) only: never on `policy`, whose decision
//! reaches the dialer as plain data (a host, a port, the rule's extra ranges).

// The crates this one uses, under the module names the code knows them by.
use latchkey_signing as signing;
use latchkey_wire as wire;
use latchkey_wire::reason;

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body_util::combinators::BoxBody;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

pub mod chain;
mod class;
mod clients;
pub mod guard;
pub mod hostform;
mod identity;
mod socks5;
pub mod token_transport;

pub use chain::{Bypass, ProxyAuth, ProxyPassword, ProxyScheme, ProxyUrl, UpstreamProxy};
pub use clients::{Clients, Way};
pub use guard::{AddressGuard, Cidr};
pub use identity::{ClientIdentity, IdentityError};

use crate::reason::Reason;
use crate::wire::host::normalize_host;

/// Boxed error type carried by bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Body type latchkey sends upstream and back to the sandbox.
pub type Body = BoxBody<Bytes, BoxError>;
/// The pooled upstream client.
pub type Client = hyper_util::client::legacy::Client<Connector, Body>;

/// Why an upstream connection could not be made. Messages name the host, never a secret.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("cannot resolve {host}: {source}; {}", resolve_hint(host))]
    Resolve {
        host: String,
        source: std::io::Error,
    },
    #[error("{host} resolved to no address; {}", resolve_hint(host))]
    NoAddress { host: String },
    #[error("{host}: {refused}")]
    Refused {
        host: String,
        refused: guard::Refused,
    },
    #[error("invalid numeric host {host:?}: {why}")]
    BadNumericHost { host: String, why: String },
    #[error("cannot connect to {host} at {addr}: {source}")]
    Connect {
        host: String,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("connecting to {host} at {addr} timed out (latchkey serve --connect-timeout)")]
    ConnectTimeout { host: String, addr: SocketAddr },
    #[error("TLS with upstream {host} failed: {source}{}", tls_hint(source))]
    Tls {
        host: String,
        source: std::io::Error,
    },
    #[error("cannot reach {host} through the upstream proxy: {source}")]
    Proxy {
        host: String,
        source: chain::ChainError,
    },
    #[error("invalid upstream host {host:?}: {why}")]
    BadHost { host: String, why: String },
    #[error("cannot load upstream CA bundle {path}: {why}")]
    CaBundle { path: PathBuf, why: String },
}

impl UpstreamError {
    /// The reason code this failure is reported with.
    pub fn reason(&self) -> Reason {
        match self {
            UpstreamError::Tls { .. } => Reason::UpstreamTls,
            UpstreamError::ConnectTimeout { .. } => Reason::UpstreamTimeout,
            UpstreamError::Proxy { source, .. } if source.is_timeout() => Reason::UpstreamTimeout,
            UpstreamError::Refused { .. } => Reason::NonPublicAddress,
            _ => Reason::UpstreamUnreachable,
        }
    }
}

/// The flag that fixes a name latchkey cannot resolve (a server on this machine or an internal
/// name): said in the refusal, so the sandbox's 502 and latchkey's log both name it.
fn resolve_hint(host: &str) -> String {
    format!("if the name is one only this machine knows (a local or internal server), pin it with `latchkey serve --resolve {host}=ADDR`")
}

/// The flag that fixes an upstream certificate no public root signs: `--upstream-ca`. Other
/// TLS failures get no hint (the flag would not fix them).
fn tls_hint(source: &std::io::Error) -> &'static str {
    let text = source.to_string();
    if text.contains("UnknownIssuer") || text.contains("unknown issuer") {
        "; if the upstream's certificate is signed by your own CA (a local or internal server), \
         trust that CA with `latchkey serve --upstream-ca PEM`"
    } else {
        ""
    }
}

/// The first refusal of a non-public address is also said on latchkey's own log, not only in
/// the 403 the sandbox gets: a newcomer trying latchkey against a local server looks there.
fn hint_once(host: &str, refused: &impl std::fmt::Display) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            url.host = host,
            "refused to dial a non-public address: {refused} (said once; every such request is \
             refused with 403 non_public_address)"
        );
    }
}

/// Settings for the dialer and TLS client.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// Operator pins (`--resolve HOST=IP`), keys normalised.
    pub resolve: HashMap<String, IpAddr>,
    /// Extra PEM bundle trusted for upstream TLS (`--upstream-ca`).
    pub extra_ca: Option<PathBuf>,
    pub connect_timeout: Duration,
    /// Non-public ranges opened for every rule (`--allow-private`).
    pub allow_private: Vec<Cidr>,
    /// latchkey's own listen addresses: never dialed.
    pub own: Vec<SocketAddr>,
    /// The operator's egress proxy (`--upstream-proxy`), if any.
    pub proxy: Option<UpstreamProxy>,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            resolve: HashMap::new(),
            extra_ca: None,
            connect_timeout: Duration::from_secs(10),
            allow_private: Vec::new(),
            own: Vec::new(),
            proxy: None,
        }
    }
}

/// Parses a `--resolve HOST=IP` value.
pub fn parse_resolve(spec: &str) -> Result<(String, IpAddr), String> {
    let (host, ip) = spec
        .split_once('=')
        .ok_or_else(|| format!("--resolve {spec:?}: expected HOST=IP"))?;
    let host = normalize_host(host).map_err(|e| format!("--resolve {spec:?}: {e}"))?;
    let ip = ip
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .map_err(|_| format!("--resolve {spec:?}: {ip:?} is not an IP address"))?;
    Ok((host, ip))
}

/// A connection to an upstream and the address it was made to (the address that was checked).
#[derive(Debug)]
pub struct Dialed {
    pub stream: TcpStream,
    pub addr: SocketAddr,
}

/// Resolves, guards and connects. The only place latchkey opens outbound TCP connections.
#[derive(Debug)]
pub struct Dialer {
    resolve: HashMap<String, IpAddr>,
    guard: AddressGuard,
    connect_timeout: Duration,
    proxy: Option<UpstreamProxy>,
}

impl Dialer {
    pub fn new(config: &UpstreamConfig) -> Self {
        Self {
            resolve: config.resolve.clone(),
            guard: AddressGuard::new(config.allow_private.clone(), config.own.clone()),
            connect_timeout: config.connect_timeout,
            proxy: config.proxy.clone(),
        }
    }

    /// Resolves `host` and returns every address, each passed through the guard. A name with any
    /// refused address is refused whole: a name that mixes public and private answers is a
    /// rebinding attempt or a misconfiguration either way.
    pub async fn resolve(
        &self,
        host: &str,
        port: u16,
        extra: &[Cidr],
    ) -> Result<Vec<SocketAddr>, UpstreamError> {
        // Numeric hosts in any form libc accepts (2852039166, 0xA9FEA9FE, 127.1) are addresses,
        // never names to look up: parse them here so the guard sees what would be dialed.
        let numeric = hostform::parse_ip_host(host).map_err(|e| UpstreamError::BadNumericHost {
            host: host.to_string(),
            why: e.to_string(),
        })?;
        let addrs: Vec<SocketAddr> = if let Some(ip) = numeric {
            vec![SocketAddr::new(ip, port)]
        } else if let Some(ip) = self.resolve.get(host) {
            vec![SocketAddr::new(*ip, port)]
        } else {
            tokio::net::lookup_host((host, port))
                .await
                .map_err(|source| UpstreamError::Resolve {
                    host: host.to_string(),
                    source,
                })?
                .collect()
        };
        if addrs.is_empty() {
            return Err(UpstreamError::NoAddress {
                host: host.to_string(),
            });
        }
        for addr in &addrs {
            self.guard.check(*addr, extra).map_err(|refused| {
                hint_once(host, &refused);
                UpstreamError::Refused {
                    host: host.to_string(),
                    refused,
                }
            })?;
        }
        Ok(addrs)
    }

    /// Connects to `host:port` through the guard, trying each checked address in turn: directly,
    /// or through the upstream proxy to that same checked address unless it is bypassed.
    pub async fn dial(
        &self,
        host: &str,
        port: u16,
        extra: &[Cidr],
    ) -> Result<Dialed, UpstreamError> {
        let addrs = self.resolve(host, port, extra).await?;
        let mut last = None;
        for addr in addrs {
            let attempt = match &self.proxy {
                Some(proxy) if !proxy.bypasses(host, addr.ip()) => {
                    tracing::debug!(upstream.addr = %addr, upstream.proxy = %proxy.url, "dialing through the upstream proxy");
                    chain::connect_via(proxy, &self.resolve, addr, self.connect_timeout)
                        .await
                        .map_err(|source| UpstreamError::Proxy {
                            host: host.to_string(),
                            source,
                        })
                }
                _ => self.connect_direct(host, addr).await,
            };
            match attempt {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(Dialed { stream, addr });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| UpstreamError::NoAddress {
            host: host.to_string(),
        }))
    }

    /// One direct connection to a checked address.
    async fn connect_direct(
        &self,
        host: &str,
        addr: SocketAddr,
    ) -> Result<TcpStream, UpstreamError> {
        // The one outbound connect to an upstream in latchkey (see .clippy.toml); the other is
        // to the operator's own proxy, in chain.rs.
        #[allow(clippy::disallowed_methods)]
        let connect = TcpStream::connect(addr);
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(source)) => Err(UpstreamError::Connect {
                host: host.to_string(),
                addr,
                source,
            }),
            Err(_) => Err(UpstreamError::ConnectTimeout {
                host: host.to_string(),
                addr,
            }),
        }
    }
}

/// Builds the upstream TLS client configuration: webpki roots plus an optional extra bundle.
pub fn tls_config(extra_ca: Option<&Path>) -> Result<rustls::ClientConfig, UpstreamError> {
    match extra_ca {
        Some(path) => tls_config_bundles(&[path]),
        None => tls_config_bundles(&[]),
    }
}

/// [`tls_config`] trusting every bundle in `extra` besides the webpki roots.
pub fn tls_config_bundles(extra: &[&Path]) -> Result<rustls::ClientConfig, UpstreamError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for path in extra {
        let bad = |why: String| UpstreamError::CaBundle {
            path: path.to_path_buf(),
            why,
        };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| bad(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(e.to_string()))?;
        if certs.is_empty() {
            return Err(bad("no certificates in file".to_string()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| bad(e.to_string()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| UpstreamError::CaBundle {
            path: PathBuf::new(),
            why: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The address a pooled connection was dialed to, attached to every response it carries.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamAddr(pub SocketAddr);

/// hyper-util connector: dial through the [`Dialer`], then TLS for `https`.
#[derive(Clone)]
pub struct Connector {
    dialer: Arc<Dialer>,
    tls: tokio_rustls::TlsConnector,
    /// A rule's own `allow_private` ranges; each distinct set gets its own connector and pool.
    extra: Arc<[Cidr]>,
}

impl Connector {
    pub fn new(dialer: Arc<Dialer>, tls: Arc<rustls::ClientConfig>, extra: Vec<Cidr>) -> Self {
        Self {
            dialer,
            tls: tokio_rustls::TlsConnector::from(tls),
            extra: extra.into(),
        }
    }

    async fn connect(self, uri: Uri) -> Result<UpstreamConn, UpstreamError> {
        let raw_host = uri.host().unwrap_or_default();
        let host = normalize_host(raw_host).map_err(|e| UpstreamError::BadHost {
            host: raw_host.to_string(),
            why: e.to_string(),
        })?;
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let dialed = self.dialer.dial(&host, port, &self.extra).await?;
        if !https {
            return Ok(UpstreamConn::Plain {
                io: TokioIo::new(dialed.stream),
                addr: dialed.addr,
            });
        }
        let name = match host.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(host.clone()).map_err(|e| UpstreamError::BadHost {
                host: host.clone(),
                why: e.to_string(),
            })?,
        };
        let tls = self
            .tls
            .connect(name, dialed.stream)
            .await
            .map_err(|source| UpstreamError::Tls { host, source })?;
        Ok(UpstreamConn::Tls {
            io: TokioIo::new(Box::new(tls)),
            addr: dialed.addr,
        })
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = UpstreamConn;
    type Error = UpstreamError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamConn, UpstreamError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(self.clone().connect(uri))
    }
}

/// An upstream connection, plain or TLS.
pub enum UpstreamConn {
    Plain {
        io: TokioIo<TcpStream>,
        addr: SocketAddr,
    },
    Tls {
        io: TokioIo<Box<TlsStream<TcpStream>>>,
        addr: SocketAddr,
    },
}

impl Connection for UpstreamConn {
    fn connected(&self) -> Connected {
        match self {
            UpstreamConn::Plain { addr, .. } => Connected::new().extra(UpstreamAddr(*addr)),
            UpstreamConn::Tls { io, addr } => {
                let c = Connected::new().extra(UpstreamAddr(*addr));
                if io.inner().get_ref().1.alpn_protocol() == Some(b"h2") {
                    c.negotiated_h2()
                } else {
                    c
                }
            }
        }
    }
}

impl hyper::rt::Read for UpstreamConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            UpstreamConn::Plain { io, .. } => Pin::new(io).poll_read(cx, buf),
            UpstreamConn::Tls { io, .. } => Pin::new(io).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for UpstreamConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            UpstreamConn::Plain { io, .. } => Pin::new(io).poll_write(cx, buf),
            UpstreamConn::Tls { io, .. } => Pin::new(io).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            UpstreamConn::Plain { io, .. } => Pin::new(io).poll_flush(cx),
            UpstreamConn::Tls { io, .. } => Pin::new(io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            UpstreamConn::Plain { io, .. } => Pin::new(io).poll_shutdown(cx),
            UpstreamConn::Tls { io, .. } => Pin::new(io).poll_shutdown(cx),
        }
    }

    // Vectored writes pass through, so hyper queues request-body chunks as they are instead of
    // copying each into its own write buffer (up to ~400 KiB per connection).
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            UpstreamConn::Plain { io, .. } => Pin::new(io).poll_write_vectored(cx, bufs),
            UpstreamConn::Tls { io, .. } => Pin::new(io).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamConn::Plain { io, .. } => io.is_write_vectored(),
            UpstreamConn::Tls { io, .. } => io.is_write_vectored(),
        }
    }
}

/// Builds the pooled client over the connector.
pub fn client(connector: Connector) -> Client {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(64)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector)
}

/// Finds the [`UpstreamError`] inside a client error chain, if the failure was ours to classify.
pub fn find_upstream_error<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a UpstreamError> {
    crate::reason::find_cause(err)
}

/// Whether a client error chain holds a TLS failure after the handshake seemed done: under
/// TLS 1.3 a server that refuses the client's certificate (none, or one it does not trust)
/// says so with an alert on the first read, after hyper sent the request. rustls's error sits
/// inside an `io::Error`, whose `source` skips it, so each one is looked into.
pub fn tls_failure_in(err: &(dyn std::error::Error + 'static)) -> bool {
    crate::reason::causes(err).any(|e| {
        let mut e = e;
        // An `io::Error` may wrap another before rustls's (at most a few deep).
        for _ in 0..8 {
            if e.downcast_ref::<rustls::Error>().is_some() {
                return true;
            }
            match e
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
            {
                Some(inner) => e = inner,
                None => return false,
            }
        }
        false
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tls_alert_inside_an_io_error_is_a_tls_failure() {
        let alert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
        );
        assert!(tls_failure_in(&alert));
        let other = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(!tls_failure_in(&other));
    }

    #[test]
    fn parses_resolve_pins() {
        assert_eq!(
            parse_resolve("API.test.=127.0.0.1"),
            Ok(("api.test".to_string(), "127.0.0.1".parse().expect("ip")))
        );
        assert_eq!(
            parse_resolve("v6.test=[::1]").map(|(_, ip)| ip),
            Ok("::1".parse().expect("ip"))
        );
        assert!(parse_resolve("nohost").is_err());
        assert!(parse_resolve("a.test=not-an-ip").is_err());
    }

    #[tokio::test]
    async fn the_dialer_refuses_non_public_addresses_in_every_host_form() {
        let d = Dialer::new(&UpstreamConfig::default());
        for host in [
            "0.0.0.0",
            "127.0.0.1",
            "2852039166",
            "0xA9FEA9FE",
            "::ffff:169.254.169.254",
            "127.1",
        ] {
            let e = d.dial(host, 80, &[]).await.expect_err("refused");
            assert!(matches!(e, UpstreamError::Refused { .. }), "{host}: {e}");
            assert_eq!(e.reason(), Reason::NonPublicAddress);
        }
        let e = d.dial("256.1.1.1", 80, &[]).await.expect_err("refused");
        assert!(matches!(e, UpstreamError::BadNumericHost { .. }), "{e}");
    }

    #[tokio::test]
    async fn a_pinned_name_is_checked_like_a_resolved_one_and_a_rule_range_opens_it() {
        let mut config = UpstreamConfig::default();
        config
            .resolve
            .insert("internal.test".into(), "10.1.2.7".parse().expect("ip"));
        let d = Dialer::new(&config);
        let e = d
            .resolve("internal.test", 443, &[])
            .await
            .expect_err("refused");
        assert!(e.to_string().contains("10.1.2.7"), "{e}");
        let extra = [Cidr::parse("10.1.2.0/24").expect("cidr")];
        let addrs = d
            .resolve("internal.test", 443, &extra)
            .await
            .expect("opened");
        assert_eq!(
            addrs,
            vec!["10.1.2.7:443".parse::<SocketAddr>().expect("addr")]
        );
    }
}

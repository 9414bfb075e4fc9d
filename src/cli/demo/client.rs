//! The demo's sandbox: what `curl --proxy … --cacert …` does, in-process.
//!
//! `CONNECT host:port` to latchkey, TLS to latchkey trusting only latchkey's CA (so the check
//! proves the connection was intercepted), then one HTTP/1.1 request. Every step has a
//! deadline and every read a cap.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest CONNECT response head and response body the demo reads.
const MAX_HEAD: usize = 16 * 1024;
const MAX_BODY: usize = 1024 * 1024;
/// The whole exchange, connect to last body byte.
const DEADLINE: Duration = Duration::from_secs(15);

/// What the sandbox saw.
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    /// A response header as text ("" when absent or not text).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// TLS settings of a sandbox that trusts latchkey's CA and nothing else.
pub fn tls_trusting(ca_pem: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| format!("latchkey's CA certificate: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("latchkey's CA certificate: {e}"))?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// One request through the proxy at `proxy` to `https://host:port{path}`.
pub async fn send(
    proxy: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    host: &str,
    port: u16,
    req: http::request::Builder,
) -> Result<Reply, String> {
    match tokio::time::timeout(DEADLINE, exchange(proxy, tls, host, port, req)).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {}s", DEADLINE.as_secs())),
    }
}

// The demo plays the sandbox: this dials latchkey's own listener, never an upstream, so the
// guarded `upstream::Dialer` (which refuses latchkey's own address) is not the way here.
#[allow(clippy::disallowed_methods)]
async fn exchange(
    proxy: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    host: &str,
    port: u16,
    req: http::request::Builder,
) -> Result<Reply, String> {
    let mut tcp = tokio::net::TcpStream::connect(proxy)
        .await
        .map_err(|e| format!("cannot connect to latchkey at {proxy}: {e}"))?;
    let target = crate::wire::host::display_authority(host, port);
    let connect = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    tcp.write_all(connect.as_bytes())
        .await
        .map_err(|e| format!("CONNECT: {e}"))?;
    let head = read_head(&mut tcp).await?;
    if head.status != 200 {
        return Ok(Reply {
            status: head.status,
            headers: head.headers,
            body: Bytes::new(),
        });
    }
    let name = ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS with latchkey (trusting only latchkey's CA): {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("HTTP/1.1: {e}"))?;
    let driver = tokio::spawn(conn);
    let req = req
        .header(http::header::HOST, target)
        .header(http::header::USER_AGENT, "latchkey-demo")
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("request: {e}"))?;
    let res = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let body = Limited::new(res.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| format!("response body: {e}"))?
        .to_bytes();
    driver.abort();
    Ok(Reply {
        status,
        headers,
        body,
    })
}

struct Head {
    status: u16,
    headers: http::HeaderMap,
}

/// Reads the CONNECT response head, byte by byte so nothing of the TLS stream after it is
/// consumed.
async fn read_head(tcp: &mut tokio::net::TcpStream) -> Result<Head, String> {
    let mut buf = Vec::with_capacity(256);
    while !buf.ends_with(b"\r\n\r\n") {
        if buf.len() >= MAX_HEAD {
            return Err(format!("CONNECT answer head over {MAX_HEAD} bytes"));
        }
        let b = tcp
            .read_u8()
            .await
            .map_err(|e| format!("CONNECT answer: {e}"))?;
        buf.push(b);
    }
    let mut parsed = [httparse::EMPTY_HEADER; 32];
    let mut res = httparse::Response::new(&mut parsed);
    res.parse(&buf)
        .map_err(|e| format!("CONNECT answer: {e}"))?;
    let status = res.code.ok_or("CONNECT answer without a status")?;
    let mut headers = http::HeaderMap::new();
    for h in res.headers.iter() {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(h.name.as_bytes()),
            http::HeaderValue::from_bytes(h.value),
        ) {
            headers.append(name, value);
        }
    }
    Ok(Head { status, headers })
}

//! Upstreams: real HTTPS and plain HTTP servers on `127.0.0.1:0`.
//!
//! By default each answers every request with a JSON description of exactly what it received
//! (method, path with query, version, headers in order, body), so tests assert on what left the
//! proxy. A test may give its own [`Handler`] instead (`https_with`, `http_with`), for responses
//! an echo cannot produce (reflected secrets, compressed or streamed bodies). Every upstream
//! counts the TCP connections it accepted, so tests can assert that no upstream connection was
//! made at all, and records every request it received ([`Upstream::received`]), so tests can see
//! what left the proxy even when the response the client gets is redacted.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{json, Value};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use rustls_pki_types::pem::PemObject;

use super::ca::{TestCa, UPSTREAM_NAMES};

/// The body type handlers answer with.
pub type UpBody = BoxBody<Bytes, Infallible>;

/// What an upstream does with each request it received.
pub type Handler =
    Arc<dyn Fn(Received) -> Pin<Box<dyn Future<Output = Response<UpBody>> + Send>> + Send + Sync>;

/// Wraps an async function as a [`Handler`].
pub fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(Received) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<UpBody>> + Send + 'static,
{
    Arc::new(move |req| Box::pin(f(req)))
}

/// A whole body with a known length (sent with `content-length`).
pub fn full_body(bytes: impl Into<Bytes>) -> UpBody {
    Full::new(bytes.into()).boxed()
}

/// A body of these pieces, each its own frame, with no length known up front (sent chunked
/// over HTTP/1.1, as separate DATA frames over h2).
pub fn chunked_body(pieces: Vec<Bytes>) -> UpBody {
    let (tx, body) = channel_body(pieces.len().max(1));
    for piece in pieces {
        tx.try_send(piece).expect("chunk fits the channel");
    }
    body
}

/// A streamed body fed by the returned sender; it ends when the sender is dropped.
pub fn channel_body(capacity: usize) -> (mpsc::Sender<Bytes>, UpBody) {
    let (tx, rx) = mpsc::channel(capacity);
    (tx, ChannelBody { rx }.boxed())
}

struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|piece| piece.map(|bytes| Ok(Frame::data(bytes))))
    }
}

/// One request as an upstream received it.
#[derive(Clone)]
pub struct Received {
    pub method: String,
    /// Path and query, as sent.
    pub path: String,
    pub authority: Option<String>,
    pub version: String,
    /// Headers in order (values decoded lossily as UTF-8).
    pub headers: Vec<(String, String)>,
    /// The body; for an upload the proxy aborted, what arrived before the abort.
    pub body: Vec<u8>,
    /// Request trailers, if any arrived.
    pub trailers: Vec<(String, String)>,
    /// Whether the body ended cleanly (false: the proxy aborted or reset the upload).
    pub complete: bool,
    /// The client certificate (DER) the connection presented, on an upstream that asks for one.
    pub client_cert: Option<Vec<u8>>,
}

impl std::fmt::Debug for Received {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("authority", &self.authority)
            .field("version", &self.version)
            .field("headers", &self.headers)
            .field("body", &self.body_text())
            .field("trailers", &self.trailers)
            .field("complete", &self.complete)
            .field("client_cert", &self.client_cert.as_ref().map(Vec::len))
            .finish()
    }
}

impl Received {
    /// Every value of header `name` (case-insensitive), in order.
    pub fn header_values(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.header_values(name).first().copied()
    }

    /// The path without its query.
    pub fn path_only(&self) -> &str {
        self.path.split('?').next().unwrap_or_default()
    }

    /// The raw (still percent-encoded) value of every query parameter `name`.
    pub fn query_values(&self, name: &str) -> Vec<&str> {
        let Some((_, query)) = self.path.split_once('?') else {
            return Vec::new();
        };
        query
            .split('&')
            .filter_map(|pair| {
                let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
                (n == name).then_some(v)
            })
            .collect()
    }

    /// The body as text (lossy).
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One runtime for every upstream of the test binary; tests themselves are synchronous.
fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime for upstreams")
    })
}

pub struct Upstream {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    received: Arc<Mutex<Vec<Received>>>,
    task: JoinHandle<()>,
}

impl Upstream {
    /// An HTTPS echo server (http/1.1 and h2 via ALPN) whose certificate covers
    /// [`UPSTREAM_NAMES`] and is signed by `ca`.
    pub fn https(ca: &TestCa) -> Self {
        Self::https_with(ca, handler(echo))
    }

    /// An HTTPS server like [`Upstream::https`] that answers with `handler`.
    pub fn https_with(ca: &TestCa, handler: Handler) -> Self {
        let (chain, key) = ca.issue(UPSTREAM_NAMES);
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("upstream certificate");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        Self::start(handler, move |tcp, service| {
            let acceptor = acceptor.clone();
            async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    serve(TokioIo::new(tls), service).await;
                }
            }
        })
    }

    /// An HTTPS echo server like [`Upstream::https`] that requires a client certificate signed
    /// by `ca`; each request records the one presented. It speaks TLS 1.2 only, so a client
    /// without a certificate fails in the handshake itself (under TLS 1.3 the server's refusal
    /// arrives after the client's handshake is done, racing its first write).
    pub fn https_requiring_client_cert(ca: &TestCa) -> Self {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pki_types::CertificateDer::pem_file_iter(ca.pem_path()).expect("CA PEM")
        {
            roots
                .add(cert.expect("CA cert"))
                .expect("trust the test CA");
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .expect("client verifier");
        let (chain, key) = ca.issue(UPSTREAM_NAMES);
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS12])
            .expect("TLS 1.2")
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .expect("upstream certificate");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        Self::start(handler(echo), move |tcp, mut service| {
            let acceptor = acceptor.clone();
            async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    service.peer = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|c| c.to_vec());
                    serve(TokioIo::new(tls), service).await;
                }
            }
        })
    }

    /// A plain HTTP echo server.
    pub fn http() -> Self {
        Self::http_with(handler(echo))
    }

    /// A plain HTTP server that answers with `handler`.
    pub fn http_with(handler: Handler) -> Self {
        Self::start(handler, |tcp, service| async move {
            serve(TokioIo::new(tcp), service).await
        })
    }

    fn start<F, Fut>(handler: Handler, handle: F) -> Self
    where
        F: Fn(tokio::net::TcpStream, Service) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let std_listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind upstream on loopback");
        std_listener
            .set_nonblocking(true)
            .expect("non-blocking upstream listener");
        let addr = std_listener.local_addr().expect("upstream address");
        let connections = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(Mutex::new(Vec::new()));
        let service = Service {
            handler,
            received: received.clone(),
            peer: None,
        };
        let counter = connections.clone();
        let rt = runtime();
        let _guard = rt.enter();
        let listener =
            tokio::net::TcpListener::from_std(std_listener).expect("tokio upstream listener");
        let task = rt.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(handle(tcp, service.clone()));
            }
        });
        Upstream {
            addr,
            connections,
            received,
            task,
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `127.0.0.1:PORT`, as the audit record's `upstream` field should say.
    pub fn addr_string(&self) -> String {
        self.addr.to_string()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Every request received so far, in order of arrival.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("received requests").clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A connection's view of its upstream: the handler, and where to record requests.
#[derive(Clone)]
struct Service {
    handler: Handler,
    received: Arc<Mutex<Vec<Received>>>,
    /// The client certificate this connection presented (DER), if any.
    peer: Option<Vec<u8>>,
}

async fn serve<I>(io: TokioIo<I>, service: Service)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let _ = auto::Builder::new(TokioExecutor::new())
        .serve_connection(
            io,
            service_fn(move |req: Request<Incoming>| {
                let service = service.clone();
                async move {
                    let received = receive(req, &service.received, service.peer.clone()).await;
                    Ok::<_, Infallible>((service.handler)(received).await)
                }
            }),
        )
        .await;
}

/// Records the request as it arrives (head first, then each body frame), so that what arrived of
/// an upload the proxy aborted is recorded too, then returns it whole.
async fn receive(
    req: Request<Incoming>,
    log: &Mutex<Vec<Received>>,
    client_cert: Option<Vec<u8>>,
) -> Received {
    let (parts, mut body) = req.into_parts();
    let head = Received {
        method: parts.method.as_str().to_string(),
        path: parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
            .to_string(),
        authority: parts.uri.authority().map(|a| a.as_str().to_string()),
        version: format!("{:?}", parts.version),
        headers: parts
            .headers
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_string(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: Vec::new(),
        trailers: Vec::new(),
        complete: false,
        client_cert,
    };
    let index = {
        let mut log = log.lock().expect("received requests");
        log.push(head);
        log.len() - 1
    };
    loop {
        match body.frame().await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => log.lock().expect("received requests")[index]
                    .body
                    .extend_from_slice(&data),
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        log.lock().expect("received requests")[index].trailers = trailers
                            .iter()
                            .map(|(n, v)| {
                                (
                                    n.as_str().to_string(),
                                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                                )
                            })
                            .collect();
                    }
                }
            },
            Some(Err(_)) => break,
            None => {
                log.lock().expect("received requests")[index].complete = true;
                break;
            }
        }
    }
    log.lock().expect("received requests")[index].clone()
}

/// The default handler: a JSON description of the request.
pub async fn echo(req: Received) -> Response<UpBody> {
    let headers: Vec<Value> = req
        .headers
        .iter()
        .map(|(name, value)| json!([name, value]))
        .collect();
    let description = json!({
        "method": req.method,
        "path": req.path,
        "authority": req.authority,
        "version": req.version,
        "headers": headers,
        "body": String::from_utf8_lossy(&req.body),
    });
    Response::builder()
        .header("content-type", "application/json")
        .header("x-echo", "1")
        .body(full_body(description.to_string()))
        .expect("echo response")
}

/// What an echo upstream received, parsed from its JSON answer.
#[derive(Debug)]
pub struct Echo {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Echo {
    /// Parses an echo upstream's answer; panics with the text if it is not one.
    pub fn parse(text: &str) -> Echo {
        let v: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("expected an echo JSON body ({e}), got: {text:?}"));
        let field = |name: &str| {
            v[name]
                .as_str()
                .unwrap_or_else(|| panic!("echo field {name} missing in {text}"))
                .to_string()
        };
        let headers = v["headers"]
            .as_array()
            .expect("echo headers array")
            .iter()
            .map(|pair| {
                (
                    pair[0].as_str().expect("header name").to_string(),
                    pair[1].as_str().expect("header value").to_string(),
                )
            })
            .collect();
        Echo {
            method: field("method"),
            path: field("path"),
            headers,
            body: field("body"),
        }
    }

    /// Every value of header `name` (case-insensitive), in order.
    pub fn header_values(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn has_header(&self, name: &str) -> bool {
        !self.header_values(name).is_empty()
    }
}

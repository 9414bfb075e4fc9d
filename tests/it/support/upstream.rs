//! Echo upstreams: real HTTPS and plain HTTP servers on `127.0.0.1:0`.
//!
//! Each answers every request with a JSON description of exactly what it received (method, path
//! with query, version, headers in order, body), so tests assert on what left the proxy. Each
//! counts the TCP connections it accepted, so tests can assert that no upstream connection was
//! made at all.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{json, Value};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use super::ca::{TestCa, UPSTREAM_NAMES};

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
    task: JoinHandle<()>,
}

impl Upstream {
    /// An HTTPS echo server (http/1.1 and h2 via ALPN) whose certificate covers
    /// [`UPSTREAM_NAMES`] and is signed by `ca`.
    pub fn https(ca: &TestCa) -> Self {
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
        Self::start(move |tcp| {
            let acceptor = acceptor.clone();
            async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    serve(TokioIo::new(tls)).await;
                }
            }
        })
    }

    /// A plain HTTP echo server.
    pub fn http() -> Self {
        Self::start(|tcp| async move { serve(TokioIo::new(tcp)).await })
    }

    fn start<F, Fut>(handle: F) -> Self
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let std_listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind upstream on loopback");
        std_listener
            .set_nonblocking(true)
            .expect("non-blocking upstream listener");
        let addr = std_listener.local_addr().expect("upstream address");
        let connections = Arc::new(AtomicUsize::new(0));
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
                tokio::spawn(handle(tcp));
            }
        });
        Upstream {
            addr,
            connections,
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
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve<I>(io: TokioIo<I>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let _ = auto::Builder::new(TokioExecutor::new())
        .serve_connection(io, service_fn(echo))
        .await;
}

async fn echo(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let headers: Vec<Value> = parts
        .headers
        .iter()
        .map(|(name, value)| json!([name.as_str(), String::from_utf8_lossy(value.as_bytes())]))
        .collect();
    let description = json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"),
        "authority": parts.uri.authority().map(|a| a.as_str()),
        "version": format!("{:?}", parts.version),
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
    });
    let response = Response::builder()
        .header("content-type", "application/json")
        .header("x-echo", "1")
        .body(Full::new(Bytes::from(description.to_string())))
        .expect("echo response");
    Ok(response)
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

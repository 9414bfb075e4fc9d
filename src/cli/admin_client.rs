//! The admin API of a running latchkey, from the command line (`latchkey approvals`,
//! `latchkey sessions`): one plain HTTP/1 exchange per call, with the admin token, bounded in
//! time and size.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;

/// Where the running latchkey's admin API is, and the token for it: the flags of every command
/// that talks to it.
#[derive(clap::Args, Debug)]
pub struct AdminArgs {
    /// The admin API of the running latchkey (`serve --admin`).
    #[arg(
        id = "admin",
        long = "admin-url",
        env = "LATCHKEY_ADMIN_URL",
        default_value = "http://127.0.0.1:3129",
        global = true
    )]
    pub url: String,
    /// The admin token, from `env:VAR` or `file:PATH` (as `serve --admin-token`, or a policy's
    /// `[admin.tokens.NAME]` with the scopes the command needs).
    #[arg(
        id = "admin_token",
        long = "admin-token",
        env = "LATCHKEY_ADMIN_TOKEN",
        value_name = "SOURCE",
        global = true
    )]
    pub token: Option<String>,
}

/// How long one admin API exchange may take.
const DEADLINE: Duration = Duration::from_secs(15);
/// Largest admin API answer read.
const MAX_ANSWER: usize = 16 * 1024 * 1024;

pub(super) fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// The admin API of a running latchkey.
pub(super) struct Admin {
    addr: SocketAddr,
    authority: String,
    token: Option<String>,
    deadline: Duration,
}

impl Admin {
    /// `url` is `http://HOST:PORT`, or `HOST:PORT` as `serve --admin` takes it.
    pub(super) fn new(url: &str, token: Option<&str>) -> anyhow::Result<Self> {
        let flag = super::given::flag("admin");
        let full = if url.contains("://") {
            url.to_string()
        } else {
            format!("http://{url}")
        };
        let parsed = url::Url::parse(&full).with_context(|| {
            format!("{flag} {url:?} is not a URL (give http://HOST:PORT or HOST:PORT, as serve --admin)")
        })?;
        anyhow::ensure!(
            parsed.scheme() == "http",
            "{flag} {url}: only http:// is supported (the admin listener speaks plain HTTP; run this where it is reachable)"
        );
        let addrs = parsed
            .socket_addrs(|| Some(80))
            .with_context(|| format!("{flag} {url}: cannot resolve its host"))?;
        let addr = *addrs
            .first()
            .ok_or_else(|| anyhow::anyhow!("{flag} {url}: its host has no address"))?;
        let token = token.map(super::serve::read_token).transpose()?;
        Ok(Self {
            addr,
            authority: parsed[url::Position::BeforeHost..url::Position::AfterPort].to_string(),
            token,
            deadline: DEADLINE,
        })
    }

    /// The same API, with another limit on each exchange than [`DEADLINE`].
    pub(super) fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// A GET whose answer is plain text (`/readyz`, `/healthz`), not JSON.
    pub(super) async fn get_text(&self, path: &str) -> anyhow::Result<String> {
        self.exchange(http::Method::GET, path, None)
            .await
            .map(|v| match v {
                serde_json::Value::String(text) => text,
                other => other.to_string(),
            })
    }

    pub(super) async fn get(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        self.exchange(http::Method::GET, path, None).await
    }

    pub(super) async fn post(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        self.exchange(http::Method::POST, path, Some(body.to_string()))
            .await
    }

    pub(super) async fn delete(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        self.exchange(http::Method::DELETE, path, None).await
    }

    // This dials latchkey's own admin listener, never an upstream: the guarded dialer (which
    // refuses latchkey's own addresses) is not the way here.
    #[allow(clippy::disallowed_methods)]
    async fn exchange(
        &self,
        method: http::Method,
        path: &str,
        body: Option<String>,
    ) -> anyhow::Result<serde_json::Value> {
        let run = async {
            let tcp = tokio::net::TcpStream::connect(self.addr)
                .await
                .with_context(|| {
                    format!(
                        "cannot reach the admin API at {} ({}: is `latchkey serve` running with --admin there?)",
                        self.addr,
                        super::given::flag("admin")
                    )
                })?;
            let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
            tokio::spawn(conn);
            let mut req = http::Request::builder()
                .method(method)
                .uri(path)
                .header(http::header::HOST, &self.authority);
            if let Some(t) = &self.token {
                req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
            }
            if body.is_some() {
                req = req.header(http::header::CONTENT_TYPE, "application/json");
            }
            let req = req.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
            let res = send.send_request(req).await?;
            let status = res.status();
            let bytes = Limited::new(res.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("cannot read the admin API's answer: {e}"))?
                .to_bytes();
            let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
                let text = String::from_utf8_lossy(&bytes).trim().to_string();
                anyhow::ensure!(
                    status.is_success(),
                    "the admin API answered {status}: {text}"
                );
                return Ok(serde_json::Value::String(text));
            };
            if !status.is_success() {
                let why = value["error"].as_str().unwrap_or("no reason given");
                anyhow::bail!("the admin API answered {status}: {why}");
            }
            Ok(value)
        };
        tokio::time::timeout(self.deadline, run)
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "the admin API at {} did not answer within {:?}",
                    self.addr,
                    self.deadline
                )
            })?
    }
}

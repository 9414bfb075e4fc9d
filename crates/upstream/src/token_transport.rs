//! latchkey's own calls (token exchanges, STS, secret stores, credential endpoints) over the
//! pooled, guarded upstream clients: the implementation of signing's narrow [`TokenTransport`]
//! (a method, status, a body of at most [`MAX_ANSWER`] bytes).
//!
//! The exchange dials like every other upstream request, through a [`super::Connector`] and
//! its address guard, on the client for its route ([`Clients::get`]: the extra ranges and CA
//! it names); nothing here opens a socket itself. A call that is not `https://` is refused
//! unsent unless its route allows cleartext. Auditing is the caller's (the proxy wraps
//! [`TokenClient::send`] to record each exchange).

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::BodyExt;

use std::sync::Arc;

use super::{find_upstream_error, Clients, UpstreamAddr, UpstreamError, Way};
use crate::signing::exchange::{
    Answer, BoxFuture, Exchange, TokenTransport, TransportError, MAX_ANSWER,
};

/// Why an exchange got no usable answer, as an audit record tells them apart.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeFailure {
    /// No response: unreachable, refused by the address guard, a TLS failure.
    #[error("{0}")]
    Unreachable(String),
    /// No response headers within the timeout.
    #[error("timed out")]
    Timeout,
    /// The response came but its body could not be read (or was over [`MAX_ANSWER`]).
    #[error("cannot read the response: {why}")]
    Read { status: u16, why: String },
    /// The request could not be built (a header or URL latchkey cannot send).
    #[error("cannot build the request: {0}")]
    Build(String),
}

/// An answer and the address it came from.
#[derive(Debug)]
pub struct Sent {
    pub answer: Answer,
    pub upstream: Option<SocketAddr>,
}

/// latchkey's own calls, reached through the pooled upstream clients, with a response timeout.
#[derive(Clone)]
pub struct TokenClient {
    clients: Arc<Clients>,
    timeout: Duration,
}

/// Whether `ex` may go to `uri`: `https://`, or plain `http://` when its route allows it.
pub fn cleartext_refused(uri: &http::Uri, ex: &Exchange) -> bool {
    uri.scheme() != Some(&http::uri::Scheme::HTTPS)
        && !(ex.route.cleartext && uri.scheme() == Some(&http::uri::Scheme::HTTP))
}

impl TokenClient {
    pub fn new(clients: Arc<Clients>, timeout: Duration) -> Self {
        Self { clients, timeout }
    }

    /// Sends `ex` to `uri` (its parsed URL) and reads at most [`MAX_ANSWER`] bytes of answer.
    pub async fn send(&self, uri: http::Uri, ex: Exchange) -> Result<Sent, ExchangeFailure> {
        if cleartext_refused(&uri, &ex) {
            return Err(ExchangeFailure::Build(format!(
                "{} is not https://: latchkey's own calls carry credentials and secrets, never in cleartext",
                uri.scheme_str().unwrap_or("the URL")
            )));
        }
        let ca = ex.route.ca.clone();
        let way = Way {
            extra: ex.route.allow_private.clone(),
            http1: false,
            ca: ca.clone(),
            identity: None,
        };
        let client = self
            .clients
            .get(&way)
            .map_err(|e| ExchangeFailure::Build(e.to_string()))?;
        let mut req = http::Request::builder().method(ex.method).uri(uri);
        for (k, v) in ex.headers {
            req = req.header(k, v);
        }
        let body = http_body_util::Full::new(ex.body)
            .map_err(|never| match never {})
            .boxed();
        let req = req
            .body(body)
            .map_err(|e| ExchangeFailure::Build(e.to_string()))?;
        let res = match tokio::time::timeout(self.timeout, client.request(req)).await {
            Ok(Ok(res)) => res,
            Ok(Err(e)) => {
                let why = match (find_upstream_error(&e), &ca) {
                    // The fix for a call with its own CA is that CA, not `--upstream-ca`.
                    (Some(UpstreamError::Tls { host, source }), Some(ca)) => format!(
                        "TLS with {host} failed: {source}; its certificate must be signed by \
                         the CA in {} (the `ca` this call trusts)",
                        ca.display()
                    ),
                    (Some(u), _) => u.to_string(),
                    // hyper's own failures (a pooled connection the server closed): the whole
                    // chain, not only its outermost "client error (SendRequest)".
                    (None, _) => crate::reason::chain_text(&e),
                };
                return Err(ExchangeFailure::Unreachable(why));
            }
            Err(_) => return Err(ExchangeFailure::Timeout),
        };
        let status = res.status().as_u16();
        let upstream = res.extensions().get::<UpstreamAddr>().map(|a| a.0);
        // Token answers are small; refuse anything absurd rather than buffer it.
        let limited = http_body_util::Limited::new(res.into_body(), MAX_ANSWER);
        let body = limited
            .collect()
            .await
            .map_err(|e| ExchangeFailure::Read {
                status,
                why: e.to_string(),
            })?
            .to_bytes();
        Ok(Sent {
            answer: Answer { status, body },
            upstream,
        })
    }
}

impl TokenTransport for TokenClient {
    fn call(&self, ex: Exchange) -> BoxFuture<'_, Result<Answer, TransportError>> {
        Box::pin(async move {
            let uri: http::Uri = ex
                .url
                .parse()
                .map_err(|e| TransportError(format!("invalid URL: {e}")))?;
            self.send(uri, ex)
                .await
                .map(|s| s.answer)
                .map_err(|e| TransportError(e.to_string()))
        })
    }
}

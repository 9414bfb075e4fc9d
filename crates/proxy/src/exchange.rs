//! The token exchanger: how a request's credential reaches its token endpoint, and how
//! latchkey's own calls (secret stores, its AWS identity) reach theirs — through the proxy's
//! guarded upstream clients ([`upstream::token_transport`]), each exchange audited under the
//! rule it names (`credential:NAME`, `secret:NAME`, `latchkey:aws`) for the sandbox whose
//! request caused it, or for latchkey itself ([`OwnCalls`]: identity `latchkey`, client
//! `0.0.0.0:0`).
//!
//! Built per request as a borrow of the proxy (nothing allocated); it does work only when the
//! credential has no cached token.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use super::Proxy;
use crate::reason::Reason;
use crate::signing::exchange::{Answer, BoxFuture, Exchange, TokenTransport, TransportError};
use crate::upstream::token_transport::{cleartext_refused, ExchangeFailure, TokenClient};

/// The identity latchkey's own calls are recorded under (no sandbox caused them).
pub const OWN_IDENTITY: &str = "latchkey";

/// Token exchanges on behalf of one request's client and identity.
pub struct Exchanger<'a> {
    proxy: &'a Proxy,
    client: SocketAddr,
    identity: Arc<str>,
}

impl Proxy {
    /// The way the signing module reaches token endpoints: this proxy's guarded client, each
    /// exchange audited for the sandbox that caused it. Cheap: a borrow and the identity.
    pub fn exchanger(&self, client: SocketAddr, identity: Arc<str>) -> Exchanger<'_> {
        Exchanger {
            proxy: self,
            client,
            identity,
        }
    }
}

impl TokenTransport for Exchanger<'_> {
    fn call(&self, ex: Exchange) -> BoxFuture<'_, Result<Answer, TransportError>> {
        Box::pin(self.exchange(ex))
    }
}

/// latchkey's own calls that no request caused (a secret store's background refresh, its AWS
/// identity's): through the same guarded clients, recorded under identity `latchkey`. Holds
/// the proxy weakly (the proxy holds the secret store that holds this).
#[derive(Clone)]
pub struct OwnCalls {
    proxy: Weak<Proxy>,
}

impl OwnCalls {
    pub fn new(proxy: &Arc<Proxy>) -> Self {
        Self {
            proxy: Arc::downgrade(proxy),
        }
    }
}

impl TokenTransport for OwnCalls {
    fn call(&self, ex: Exchange) -> BoxFuture<'_, Result<Answer, TransportError>> {
        Box::pin(async move {
            let proxy = self
                .proxy
                .upgrade()
                .ok_or_else(|| TransportError("latchkey is shutting down".into()))?;
            let exchanger =
                proxy.exchanger(SocketAddr::from(([0, 0, 0, 0], 0)), Arc::from(OWN_IDENTITY));
            exchanger.exchange(ex).await
        })
    }
}

impl Exchanger<'_> {
    async fn exchange(&self, ex: Exchange) -> Result<Answer, TransportError> {
        let proxy = self.proxy;
        let policy = proxy.policy();
        let mut entry = crate::open_record(proxy, self.client, &self.identity, &policy).await;
        let uri: http::Uri = ex
            .url
            .parse()
            .map_err(|e| TransportError(format!("invalid URL: {e}")))?;
        let rule = ex.rule.clone();
        entry.set_method(ex.method.as_str());
        if let Some(scheme) = uri.scheme_str() {
            entry.set_scheme(scheme);
        }
        if let Some(host) = uri.host() {
            entry.set_host(host.to_ascii_lowercase());
        }
        entry.set_port(uri.port_u16().unwrap_or(443));
        entry.set_path(uri.path().to_string());
        entry.set_rule(&rule);
        // A token exchange carries key material (a client secret, a signed assertion), a
        // secret store's answer a secret: only inside TLS, whatever URL a key file names —
        // unless the route is one that has no TLS by design (instance metadata).
        if cleartext_refused(&uri, &ex) {
            entry.outcome(Reason::CredentialNeedsTls, Some(&rule), None);
            entry.finish();
            return Err(TransportError(format!(
                "{} is not https://: a credential never travels in cleartext",
                crate::audit::redact_query(&ex.url)
            )));
        }
        // The exchange's decision is on disk before its token endpoint is dialed.
        entry.outcome(Reason::Allowed, Some(&rule), None);
        if !entry.commit_decision().await {
            entry.outcome(Reason::AuditUnavailable, Some(&rule), None);
            return Err(TransportError(
                "the audit log cannot be written; the token exchange was not sent".into(),
            ));
        }
        let transport = TokenClient::new(proxy.clients().clone(), proxy.response_timeout);
        let sent = match transport.send(uri, ex).await {
            Ok(sent) => sent,
            Err(failure) => {
                let (reason, status) = match &failure {
                    ExchangeFailure::Timeout => (Reason::UpstreamTimeout, None),
                    ExchangeFailure::Read { status, .. } => {
                        (Reason::CredentialFailed, Some(*status))
                    }
                    ExchangeFailure::Unreachable(_) => (Reason::CredentialFailed, None),
                    // Not sent: the record is left as it stands, as before any dial.
                    ExchangeFailure::Build(_) => return Err(TransportError(failure.to_string())),
                };
                entry.outcome(reason, Some(&rule), status);
                entry.finish();
                return Err(TransportError(failure.to_string()));
            }
        };
        let status = sent.answer.status;
        entry.carried(0, sent.answer.body.len() as u64);
        proxy
            .metrics()
            .secret_fetches
            .fetch_add(1, Ordering::Relaxed);
        let reason = if (200..300).contains(&status) {
            Reason::Allowed
        } else {
            Reason::CredentialFailed
        };
        entry.outcome(reason, Some(&rule), Some(status));
        entry.set_upstream(sent.upstream);
        entry.finish();
        Ok(sent.answer)
    }
}

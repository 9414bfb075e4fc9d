//! Sessions at the proxy: recognising a presented session on any listener, and the one check
//! every request and gated connection under a session passes.
//!
//! - Proxy hop: `Proxy-Authorization: Basic base64(SESSION_ID:TOKEN)` ([`Proxy::session_by_header`]).
//! - SOCKS5: username `SESSION_ID`, password `TOKEN` ([`Proxy::session_by_user`]).
//! - Transparent and DNS-routed capture, where a client presents nothing: the source address a
//!   session was bound to ([`Proxy::session_by_source`]).
//!
//! Once admitted, the session rides on the request context ([`super::pipeline::Ctx::session`])
//! and the connection's [`Cut`] is attached to it, so revoking the session ends the
//! connection. [`check`] runs once per gated connection and once per request: the session is
//! still live (the store is read again while the watcher is not fresh, failing closed), its
//! profile still exists and the session still fits it under the policy in force; the record
//! then names the session, its profile, labels and reach.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::Proxy;
use crate::audit::Entry;
use crate::governance::sessions::{self, Live, Refused, Scoped, Sessions};
use crate::policy::Policy;
use crate::reason::{Reason, Refusal};
use crate::wire::cut::Cut;

impl Proxy {
    /// The sessions on the state store, set once when serving starts.
    pub fn sessions(&self) -> Option<&Arc<Sessions>> {
        self.sessions.get()
    }

    /// Sets the sessions (once; later calls are ignored).
    pub fn set_sessions(&self, sessions: Arc<Sessions>) {
        let _ = self.sessions.set(sessions);
    }

    /// The session a `Proxy-Authorization` value presents: `None` when it presents none (no
    /// header, or one that is not `Basic SESSION_ID:TOKEN`: static identities then apply).
    pub(crate) async fn session_by_header(
        &self,
        value: Option<&[u8]>,
        client: SocketAddr,
    ) -> Option<Result<Arc<Live>, Refusal>> {
        let (id, token) = sessions::presented(value?)?;
        Some(self.admit_token(&id, &token, client.ip()).await)
    }

    /// The session a SOCKS5 username and password present (`None`: the username is not a
    /// session id).
    pub(crate) async fn session_by_user(
        &self,
        user: &[u8],
        password: &[u8],
        client: SocketAddr,
    ) -> Option<Result<Arc<Live>, Refusal>> {
        let id = std::str::from_utf8(user)
            .ok()
            .filter(|u| sessions::is_session_id(u))?;
        Some(self.admit_token(id, password, client.ip()).await)
    }

    async fn admit_token(
        &self,
        id: &str,
        token: &[u8],
        client: IpAddr,
    ) -> Result<Arc<Live>, Refusal> {
        let Some(sessions) = self.sessions() else {
            return Err(Refusal::new(
                Reason::StateUnavailable,
                "a session was presented, and latchkey has no state store to check it in",
            ));
        };
        sessions
            .admit_token(id, token, client)
            .await
            .map_err(|e| refusal(&e))
    }

    /// The session bound to `client`'s address, if any (a store that cannot answer refuses:
    /// the client may be a bound session).
    pub(crate) async fn session_by_source(
        &self,
        client: SocketAddr,
    ) -> Result<Option<Arc<Live>>, Refusal> {
        let Some(sessions) = self.sessions() else {
            return Ok(None);
        };
        sessions
            .admit_source(client.ip())
            .await
            .map_err(|e| refusal(&e))
    }
}

/// The refusal an admission failure is.
pub(crate) fn refusal(e: &Refused) -> Refusal {
    Refusal::new(e.reason(), e.to_string())
}

/// The check of a request's (or a gated connection's) session, and its record's attribution:
/// the session still live, its profile defined, its narrowing still within the profile under
/// `policy`. Attaches `cut` (the connection's switch), so revoking the session ends the
/// connection. Guarantees on `Ok`: the record names the session, profile, labels and reach.
pub(crate) async fn check(
    proxy: &Proxy,
    policy: &Policy,
    live: &Live,
    cut: Option<&Arc<Cut>>,
    entry: &mut Entry,
) -> Result<Arc<Scoped>, Refusal> {
    let Some(sessions) = proxy.sessions() else {
        return Err(Refusal::new(
            Reason::StateUnavailable,
            "latchkey has no state store to check sessions in",
        ));
    };
    entry.set_session(&live.id, &live.profile);
    sessions.still_live(live).await.map_err(|e| refusal(&e))?;
    let scoped = live
        .scoped(policy)
        .map_err(|why| Refusal::new(Reason::ProxyAuthRequired, why))?;
    entry.set_ceiling(&live.labels, &scoped.reach);
    if let Some(cut) = cut {
        live.attach(cut, sessions::now_ms());
    }
    Ok(scoped)
}

//! Captured connections: ones that reach latchkey without a proxy hop, so the client never said
//! where it was going. Three listeners, one path:
//!
//! ```text
//! --transparent   redirected (or tproxy'd) by the firewall: original destination ───────┐
//! --https-listen  DNS-routed to latchkey: TLS, upstream port 443 ───────────────────────┤
//! --http-listen   DNS-routed to latchkey: plain HTTP, upstream port 80 ─────────────────┤
//!   caps, identity, first bytes (deadline, cap) ◀───────────────────────────────────────┘
//!     ├─ TLS: whole ClientHello, SNI ─▶ gate::open ─┬─ intercept (connect::complete)
//!     │                                             ├─ tunnel (the hello replayed as sent)
//!     │                                             └─ refused: a fatal TLS alert, closed (Alert)
//!     ├─ HTTP/1: first head, Host (host::named) ─▶ gate::open ─┬─ intercepted::serve_stream
//!     │                                                        └─ refused: its HTTP answer (RawHttp)
//!     └─ anything else: refused, closed
//! ```
//!
//! The listeners only find the name (the SNI, or the first request's `Host`) and the identity;
//! the one connection gate ([`super::gate`]) admits and decides it as it does a CONNECT (a plain
//! connection as its first request), and for a redirected connection checks that its original
//! destination is an address of that name.
//! Every connection leaves a record: a refused one here (where it was going in `original_dst`,
//! no `upstream`: nothing was dialed), an admitted one through the pipeline (one per request,
//! each with the connection's `original_dst`) or its tunnel. The identity is the one the
//! policy's source-address identities give the client (no token can be presented), or
//! `default` when the policy has none. Nothing is dialed for a refused connection; dials go
//! through `upstream` only (the tunnel, the pipeline's client).

mod first;
mod host;
mod origin;
mod stream;
pub mod tproxy;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_rustls::StartHandshake;

use super::connect;
use super::gate::{self, Connection, FirstRequest, Knock, Opened, Refuse};
use super::limits::ConnectionSlot;
use super::{intercepted, respond, Generation, Proxy, IDENTITY_DEFAULT};
use crate::audit::Entry;
use crate::reason::{Reason, Refusal};
use crate::upstream::guard::AddrClass;
use crate::upstream::UpstreamError;
use first::Kind;
use stream::Client;

/// Which captured listener accepted a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// `serve --transparent`: connections the host firewall redirected here; the original
    /// destination is recovered and must be an address of the SNI / Host.
    Transparent,
    /// `serve --https-listen`: TLS to latchkey itself (its resolver answered the name with
    /// latchkey's own address); the host is the SNI, the upstream port 443.
    Https,
    /// `serve --http-listen`: plain HTTP to latchkey itself; the host is the `Host` header, the
    /// upstream port 80.
    Http,
}

impl Capture {
    /// The `serve` flag that starts this listener.
    pub fn flag(self) -> &'static str {
        match self {
            Capture::Transparent => "--transparent",
            Capture::Https => "--https-listen",
            Capture::Http => "--http-listen",
        }
    }
}

/// Where a captured connection is going, as far as latchkey knows before its first byte.
struct Dest {
    /// The original destination of a redirected connection.
    original: Option<SocketAddr>,
    /// The port the upstream is dialed on.
    port: u16,
    /// The host a record names until the SNI / Host is known: the original destination's
    /// address, or (DNS-routed) the address of latchkey the client connected to.
    host: String,
}

impl Dest {
    /// Where a connection `capture` accepted on `local` is going.
    fn of(capture: Capture, stream: &TcpStream, local: SocketAddr) -> Self {
        match capture {
            Capture::Transparent => {
                let original = origin::original_destination(stream, local);
                Dest {
                    original: Some(original),
                    port: original.port(),
                    host: original.ip().to_string(),
                }
            }
            Capture::Https | Capture::Http => Dest {
                original: None,
                port: if capture == Capture::Https { 443 } else { 80 },
                host: local.ip().to_canonical().to_string(),
            },
        }
    }
}

/// One captured connection, identified, its first bytes read.
struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    identity: Arc<str>,
    /// The session bound to the client's address, if any, and the connection's switch.
    session: Option<Arc<crate::governance::sessions::Live>>,
    cut: Option<Arc<crate::wire::cut::Cut>>,
    policy: Arc<Generation>,
    dest: Dest,
    started: Instant,
    slot: ConnectionSlot,
    /// Every byte read from the client so far.
    seen: Vec<u8>,
}

impl Proxy {
    /// Accepts captured connections of kind `capture` until shutdown begins, under the same
    /// connection caps as the proxy hop.
    pub async fn serve_captured(self: Arc<Self>, listener: TcpListener, capture: Capture) {
        let Ok(listen) = listener.local_addr() else {
            tracing::error!(
                listener = capture.flag(),
                "listener has no address; not serving"
            );
            return;
        };
        self.clone()
            .accept_until_shutdown(listener, capture.flag(), |stream, peer, slot| {
                tokio::spawn(self.clone().captured(stream, peer, listen, capture, slot));
            })
            .await;
    }

    /// One captured connection: caps, destination, identity, first bytes, then TLS or HTTP.
    async fn captured(
        self: Arc<Self>,
        mut stream: TcpStream,
        peer: SocketAddr,
        listen: SocketAddr,
        capture: Capture,
        slot: Result<ConnectionSlot, String>,
    ) {
        let _ = stream.set_nodelay(true);
        let started = Instant::now();
        let policy = self.policy();
        let local = stream.local_addr().unwrap_or(listen);
        let dest = Dest::of(capture, &stream, local);
        let plain = capture == Capture::Http;
        let record = async |identity: &str, plain: bool| {
            self.captured_record(peer, identity, &policy, &dest, plain)
                .await
        };
        let slot = match slot {
            Ok(slot) => slot,
            Err(why) => {
                let listener = capture.flag();
                tracing::warn!(client.addr = %peer, why, listener, "connection refused: over limit");
                let refusal = Refusal::new(Reason::TooManyConnections, why);
                let entry = record(IDENTITY_DEFAULT, plain).await;
                return refuse(&mut stream, entry, &refusal, plain).await;
            }
        };
        // Compared with latchkey's own listen addresses, not with `listen`: a tproxy'd
        // connection's local address is its original destination (another host, never one of
        // them), while one dialed straight at a listener of latchkey's is a loop either way.
        if let Some(original) = dest.original {
            if self.is_own(original).await {
                let entry = record(IDENTITY_DEFAULT, false).await;
                let refusal = Refusal::new(
                    Reason::NotRedirected,
                    format!(
                        "the connection's original destination {original} is latchkey's own \
                         listener: the firewall did not redirect it here"
                    ),
                );
                return refuse(&mut stream, entry, &refusal, false).await;
            }
        }
        let (identity, session) = match self.captured_identity(&policy, peer).await {
            Ok(found) => found,
            Err(refusal) => {
                let entry = record("unidentified", false).await;
                return refuse(&mut stream, entry, &refusal, false).await;
            }
        };
        let mut seen = Vec::new();
        let sniffed = first::sniff(&mut stream, &mut seen, started + self.handshake_timeout).await;
        let kind = match sniffed {
            Ok(kind) => kind,
            Err(stalled) => {
                let why = stalled_why(stalled, self.handshake_timeout);
                let reason = if plain {
                    Reason::BadRequest
                } else {
                    Reason::NotTls
                };
                let entry = record(&identity, plain).await;
                return refuse(&mut stream, entry, &Refusal::new(reason, why), false).await;
            }
        };
        let cut = session
            .as_ref()
            .map(|_| Arc::new(crate::wire::cut::Cut::default()));
        let conn = |stream, seen| Conn {
            stream,
            peer,
            identity: identity.clone(),
            session: session.clone(),
            cut: cut.clone(),
            policy: policy.clone(),
            dest: Dest {
                original: dest.original,
                port: dest.port,
                host: dest.host.clone(),
            },
            started,
            slot,
            seen,
        };
        match (kind, capture) {
            (Kind::Tls, Capture::Transparent | Capture::Https) => {
                self.clone().captured_tls(conn(stream, seen)).await;
            }
            (Kind::Http, Capture::Transparent | Capture::Http) => {
                self.clone().captured_http(conn(stream, seen)).await;
            }
            (Kind::Tls, Capture::Http) => {
                let refusal = Refusal::new(
                    Reason::BadRequest,
                    "TLS on the plain-HTTP listener (--http-listen)",
                );
                refuse(&mut stream, record(&identity, true).await, &refusal, false).await;
            }
            (_, Capture::Http) => {
                let refusal = Refusal::new(Reason::BadRequest, "not an HTTP/1 request");
                refuse(&mut stream, record(&identity, true).await, &refusal, true).await;
            }
            (_, Capture::Transparent | Capture::Https) => {
                let what = if kind == Kind::Http {
                    "plain HTTP"
                } else {
                    "neither TLS nor HTTP"
                };
                let refusal = Refusal::new(
                    Reason::NotTls,
                    format!("{what} to {}:{}", dest.host, dest.port),
                );
                refuse(&mut stream, record(&identity, false).await, &refusal, false).await;
            }
        }
    }

    /// A TLS connection: its whole ClientHello, the SNI through the gate, then interception or
    /// (a `tunnel = true` rule) the hello replayed to the upstream and a relay.
    async fn captured_tls(self: Arc<Self>, conn: Conn) {
        let Conn {
            mut stream,
            peer,
            identity,
            session,
            cut,
            policy,
            dest,
            started,
            slot,
            mut seen,
        } = conn;
        let entry = self
            .captured_record(peer, &identity, &policy, &dest, false)
            .await;
        let deadline = started + self.handshake_timeout;
        let accepted = match first::read_hello(&mut stream, &mut seen, deadline).await {
            Ok(accepted) => accepted,
            Err(why) => return connect::not_intercepted(&self, entry, &dest.host, why),
        };
        let Some(sni) = accepted.client_hello().server_name().map(str::to_string) else {
            let why = (
                Reason::NoSni,
                format!(
                    "a ClientHello without SNI to {}:{}: there is no name to decide",
                    dest.host, dest.port
                ),
            );
            alert(&mut stream, why.0).await;
            return connect::not_intercepted(&self, entry, &dest.host, why);
        };
        let knock = Knock {
            client: peer,
            identity,
            session,
            cut: cut.clone(),
            host: &sni,
            port: dest.port,
            carries: Connection,
            original_dst: dest.original,
            head: Ok(()),
        };
        let gated = gate::open(&self, &policy, knock, entry, Alert(&mut stream)).await;
        match gated {
            Err(()) => {}
            Ok((Opened::Intercept(ctx), entry)) => {
                let client = Client::new(stream, Vec::new(), slot);
                let start = StartHandshake::from_parts(accepted, client);
                connect::complete(self, Arc::new(ctx), start, entry).await;
            }
            Ok((Opened::Tunnel(mut dialed), mut entry)) => {
                // The upstream gets the ClientHello exactly as the client sent it, then the rest.
                let replay = dialed.stream.write_all(&seen);
                match tokio::time::timeout(self.handshake_timeout, replay).await {
                    Ok(Ok(())) => entry.carried(seen.len() as u64, 0),
                    _ => {
                        entry.set_reason(Reason::UpstreamError);
                        return entry.finish();
                    }
                }
                drop(seen);
                let client = Client::new(stream, Vec::new(), slot);
                connect::tunnel(client, dialed.stream, entry, cut).await;
            }
        }
    }

    /// A plain-HTTP connection: its first request head, the `Host` through the gate, then every
    /// request (the first one replayed) through the pipeline, pinned to that host.
    async fn captured_http(self: Arc<Self>, conn: Conn) {
        let Conn {
            mut stream,
            peer,
            identity,
            session,
            cut,
            policy,
            dest,
            started,
            slot,
            mut seen,
        } = conn;
        let mut entry = self
            .captured_record(peer, &identity, &policy, &dest, true)
            .await;
        let deadline = started + self.limits.header_timeout;
        let head = match first::read_head(&mut stream, &mut seen, deadline).await {
            Ok(head) => head,
            Err(refusal) => return refuse(&mut stream, entry, &refusal, true).await,
        };
        let Ok(uri) = head.target.parse::<http::Uri>() else {
            let refusal = Refusal::new(Reason::BadRequest, "unsupported request target");
            return refuse(&mut stream, entry, &refusal, true).await;
        };
        let named = match host::named(&mut entry, &head, &uri, dest.port) {
            Ok(named) => named,
            Err(refusal) => return refuse(&mut stream, entry, &refusal, true).await,
        };
        let knock = Knock {
            client: peer,
            identity,
            session,
            cut,
            host: named.authority.host(),
            port: dest.port,
            carries: FirstRequest {
                method: &head.method,
                path: named.path,
            },
            original_dst: dest.original,
            head: Ok(()),
        };
        let answer = RawHttp(&mut stream);
        if let Ok((ctx, entry)) = gate::open(&self, &policy, knock, entry, answer).await {
            // From here each request leaves its own record, the first one included.
            entry.dismiss();
            let client = Client::new(stream, seen, slot);
            intercepted::serve_stream(self, Arc::new(ctx), client, false).await;
        }
    }

    /// The record of a captured connection before its requests are known: a connection-level
    /// record like a CONNECT's (the implicit CONNECT to where it was going), or for plain HTTP
    /// the start of its first request's. A redirected connection's `original_dst` names where
    /// the client sent it; `upstream` stays empty until something is dialed (a tunnel), so a
    /// refused connection's record names no address latchkey contacted.
    async fn captured_record(
        &self,
        peer: SocketAddr,
        identity: &str,
        policy: &Generation,
        dest: &Dest,
        plain: bool,
    ) -> Entry {
        let mut entry = crate::open_record(self, peer, identity, policy).await;
        if !plain {
            entry.set_method("CONNECT");
        }
        entry.set_scheme(if plain { "http" } else { "https" });
        entry.set_authority(&dest.host, dest.port);
        entry.set_original_dst(dest.original);
        entry
    }

    /// The client's identity: a captured connection presents no token, so it is the one the
    /// policy's source-address identities give its address (`default` without identities).
    async fn captured_identity(
        &self,
        policy: &Generation,
        peer: SocketAddr,
    ) -> Result<(Arc<str>, Option<Arc<crate::governance::sessions::Live>>), Refusal> {
        if policy.identities().is_empty() {
            return Ok((Arc::from(IDENTITY_DEFAULT), None));
        }
        // A session bound to this address first (a store that cannot answer refuses).
        if let Some(live) = self.session_by_source(peer).await? {
            return Ok((Arc::from(live.profile.as_str()), Some(live)));
        }
        crate::policy::identity::identify(policy.identities(), policy.secrets(), None, peer.ip())
            .await
            .map(|identity| (Arc::from(identity.name.as_str()), None))
            .map_err(|e| Refusal::new(Reason::ProxyAuthRequired, e.to_string()))
    }

    /// Whether `addr` is one of latchkey's own listen addresses, as the address guard knows
    /// them (a numeric host is never looked up).
    async fn is_own(&self, addr: SocketAddr) -> bool {
        let checked = self
            .dialer
            .resolve(&addr.ip().to_string(), addr.port(), &[])
            .await;
        match checked {
            Err(UpstreamError::Refused { refused, .. }) => refused.class == AddrClass::ProxyOwn,
            _ => false,
        }
    }
}

/// Why a connection whose first bytes stalled is refused, for the record.
fn stalled_why(stalled: first::Stalled, timeout: Duration) -> String {
    match stalled {
        first::Stalled::Timeout => format!("sent nothing within {}s", timeout.as_secs()),
        first::Stalled::Closed => "closed without sending a request".to_string(),
        first::Stalled::Full => "sent nothing latchkey recognises".to_string(),
        first::Stalled::Failed(e) => e,
    }
}

/// Ends a refused captured connection. `answer`: a plain-HTTP client gets the refusal's usual
/// answer (status, headers, sentence), its record that status; otherwise the connection is
/// closed and the record's status is null (dropped).
async fn refuse(stream: &mut TcpStream, entry: Entry, refusal: &Refusal, answer: bool) {
    if !answer {
        return dropped(entry, refusal);
    }
    let bytes = respond::refused_raw(entry, refusal);
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = stream.write_all(&bytes).await;
        let _ = stream.shutdown().await;
        // Read (bounded) what the client still sends, so closing does not reset the
        // connection before it read the answer.
        let _ = tokio::io::copy(&mut (&mut *stream).take(64 * 1024), &mut tokio::io::sink()).await;
    })
    .await;
}

/// Ends a refused TLS connection whose whole ClientHello was read with a fatal TLS alert, in
/// plaintext before any ServerHello (RFC 8446 6.2): no text can travel there, but a client
/// prints the alert (`tlsv1 alert access denied`), which tells a refusal from a network failure.
/// `access_denied` for what policy, the destination check or the address guard refused,
/// `internal_error` when latchkey cannot serve (audit log, state store), `handshake_failure`
/// otherwise (no SNI). The record says why.
async fn alert(stream: &mut TcpStream, reason: Reason) {
    let record = alert_record(reason);
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = stream.write_all(&record).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// The alert record [`alert`] sends: type 21, legacy version TLS 1.2, length 2, level fatal (2),
/// and the description for `reason`.
fn alert_record(reason: Reason) -> [u8; 7] {
    let description = match reason.status() {
        http::StatusCode::FORBIDDEN | http::StatusCode::PROXY_AUTHENTICATION_REQUIRED => 49,
        s if s.is_server_error() => 80,
        _ => 40,
    };
    [21, 3, 3, 0, 2, 2, description]
}

/// A refused captured TLS connection's answer: a fatal alert, the record's status null.
struct Alert<'s>(&'s mut TcpStream);

impl Refuse for Alert<'_> {
    type Answered = ();

    async fn refuse(self, entry: Entry, refusal: &Refusal) {
        alert(self.0, refusal.reason).await;
        dropped(entry, refusal);
    }
}

/// A refused captured plain-HTTP connection's answer: the refusal's HTTP answer and status.
struct RawHttp<'s>(&'s mut TcpStream);

impl Refuse for RawHttp<'_> {
    type Answered = ();

    async fn refuse(self, entry: Entry, refusal: &Refusal) {
        refuse(self.0, entry, refusal, true).await;
    }
}

/// Records a captured connection refused without an answer, and says so on the log.
fn dropped(mut entry: Entry, refusal: &Refusal) {
    entry.outcome(refusal.reason, refusal.rule.as_deref(), None);
    let message = entry.scrub_text(&refusal.message);
    let reason = refusal.reason.code();
    tracing::info!(audit.id = %entry.id(), reason, message, "captured connection refused");
    entry.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_tls_client_gets_the_alert_that_names_the_kind_of_refusal() {
        const ACCESS_DENIED: u8 = 49;
        const INTERNAL_ERROR: u8 = 80;
        const HANDSHAKE_FAILURE: u8 = 40;
        for (reason, description) in [
            (Reason::NoRule, ACCESS_DENIED),
            (Reason::IdentityNotAllowed, ACCESS_DENIED),
            (Reason::DestinationMismatch, ACCESS_DENIED),
            (Reason::NonPublicAddress, ACCESS_DENIED),
            (Reason::SecretValueUnbound, ACCESS_DENIED),
            (Reason::ProxyAuthRequired, ACCESS_DENIED),
            (Reason::AuditUnavailable, INTERNAL_ERROR),
            (Reason::UpstreamUnreachable, INTERNAL_ERROR),
            (Reason::NoSni, HANDSHAKE_FAILURE),
            (Reason::MissingPort, HANDSHAKE_FAILURE),
        ] {
            assert_eq!(
                alert_record(reason),
                [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, description],
                "{reason}"
            );
        }
    }
}

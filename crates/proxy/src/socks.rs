//! SOCKS5 (`serve --socks ADDR`): RFC 1928 CONNECT, with RFC 1929 username/password mapped to
//! identities, through the one connection gate ([`super::gate`]).
//!
//! ```text
//! accept ─▶ caps ─▶ greeting ─▶ method (0x00 | 0x02 ─▶ identify) ─▶ request (CONNECT only)
//!   ─▶ gate::open ─┬─ refused ─▶ reply 0x02/0x04/0x01 (SocksReply)
//!                  ├─ tunnel  ─▶ reply 0x00, raw relay
//!                  └─ intercept ─▶ reply 0x00, first byte:
//!                       0x16 ─▶ TLS interception
//!                       else ─▶ plain HTTP, pinned
//! ```
//!
//! Fail-closed rules kept here (the protocol's reading is in [`wire`]): every read before the
//! CONNECT is decided shares one deadline (`--header-timeout`); every length is a single byte,
//! read into fixed 255-byte buffers, so no client-sized allocation; the password is held in
//! zeroized memory and checked by the one credential check the proxy hop uses
//! (`policy::identity::identify`); a domain name is resolved by latchkey (socks5h), and an IP
//! literal is the host policy sees. Every connection leaves one record: a refusal here, the
//! gate's record, or (once served) each inner request's own.
//!
//! Depends on the proxy's shared state, `gate`, `connect` (tunnels, interception), `pipeline`
//! (`Ctx`), `intercepted` (plain HTTP on a pinned stream) and [`wire`]. It decides no policy
//! itself and never dials: a tunnel's dial is the gate's, through `upstream`.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::connect;
use super::gate::{self, Connection, Knock, Opened, Refuse};
use super::limits::{ConnectionSlot, Idle};
use super::pipeline::Ctx;
use super::{Generation, Proxy};
use crate::audit::Entry;
use crate::governance::sessions::Live;
use crate::reason::{Reason, Refusal};

mod wire;

use wire::{
    answer, as_proxy_authorization, read_credentials, read_greeting, read_request, reply_bytes,
    reply_for, send, Answer, Failed, Reply, AUTH_FAILED, AUTH_OK, AUTH_VERSION, METHOD_NONE,
    METHOD_NO_ACCEPTABLE, METHOD_USERPASS, TLS_HANDSHAKE, VERSION,
};

impl Proxy {
    /// Accepts SOCKS5 connections until shutdown begins, under the same connection caps as the
    /// proxy listener.
    pub async fn serve_socks(self: Arc<Self>, listener: TcpListener) {
        self.clone()
            .accept_until_shutdown(listener, "socks5", |stream, peer, slot| match slot {
                Ok(slot) => {
                    tokio::spawn(self.clone().socks_connection(stream, peer, slot));
                }
                Err(why) => {
                    tokio::spawn(self.clone().socks_over_limit(stream, peer, why));
                }
            })
            .await;
    }

    /// A connection over the caps: SOCKS5 has no answer before the greeting, so it is recorded
    /// and closed.
    async fn socks_over_limit(
        self: Arc<Self>,
        mut stream: TcpStream,
        peer: SocketAddr,
        why: String,
    ) {
        let policy = self.policy();
        let failed = Failed::new(Reason::TooManyConnections, Answer::Close, why);
        self.socks_refused(&mut stream, peer, None, &policy, failed)
            .await;
    }

    /// One SOCKS5 connection: negotiation, the gate, then the relay, interception or plain HTTP.
    async fn socks_connection(
        self: Arc<Self>,
        mut stream: TcpStream,
        peer: SocketAddr,
        _slot: ConnectionSlot,
    ) {
        let _ = stream.set_nodelay(true);
        // One policy for the negotiation and the decision, as for one CONNECT.
        let policy = self.policy();
        let deadline = Instant::now() + self.limits.header_timeout;
        let (identity, session) = match self
            .socks_identify(&mut stream, &policy, peer, deadline)
            .await
        {
            Ok(found) => found,
            Err(failed) => {
                let who = (failed.reason.status()
                    == http::StatusCode::PROXY_AUTHENTICATION_REQUIRED)
                    .then_some("unidentified");
                return self
                    .socks_refused(&mut stream, peer, who, &policy, failed)
                    .await;
            }
        };
        let request = match read_request(&mut stream, deadline).await {
            Ok(request) => request,
            Err(failed) => {
                return self
                    .socks_refused(&mut stream, peer, Some(&identity), &policy, failed)
                    .await
            }
        };
        let mut entry = crate::open_record(&self, peer, &identity, &policy).await;
        entry.set_method("CONNECT");
        entry.set_scheme("https");
        if request.port == 0 {
            entry.set_host(&request.host);
            let refusal = Refusal::new(
                Reason::MissingPort,
                format!("SOCKS5 CONNECT to {} names port 0", request.host),
            );
            return SocksReply(&mut stream).refuse(entry, &refusal).await;
        }
        // The connection's switch: revoking its session ends it.
        let cut = session
            .as_ref()
            .map(|_| Arc::new(crate::wire::cut::Cut::default()));
        let knock = Knock {
            client: peer,
            identity,
            session,
            cut: cut.clone(),
            host: &request.host,
            port: request.port,
            carries: Connection,
            original_dst: None,
            head: Ok(()),
        };
        let gated = gate::open(&self, &policy, knock, entry, SocksReply(&mut stream)).await;
        let Ok((opened, entry)) = gated else {
            return;
        };
        if send(&mut stream, &reply_bytes(Reply::Succeeded))
            .await
            .is_err()
        {
            // The record says what the gate decided; the client left before the reply.
            return entry.finish();
        }
        match opened {
            Opened::Tunnel(dialed) => {
                // The relay's idle timeout, as a CONNECT tunnel has on the proxy hop.
                let mut io = Idle::without_sniffer(stream, self.limits.idle_timeout);
                if let Some(cut) = &cut {
                    io = io.cut_by(cut.clone());
                }
                connect::serve_opened(self, Opened::Tunnel(dialed), io, entry, cut).await;
            }
            Opened::Intercept(pinned) => self.socks_serve(stream, pinned, entry).await,
        }
    }

    /// The greeting, the method and (for 0x02) the credentials: who is asking.
    ///
    /// Without identities in the policy everyone is `default` (0x00 preferred; credentials
    /// offered with 0x02 are read and ignored, as `Proxy-Authorization` is on the proxy hop).
    /// With identities, 0x02 is chosen when offered and its token must name one; a client that
    /// offers only 0x00 is accepted when a source-address identity matches it, refused (0xFF,
    /// `proxy_auth_required`) otherwise.
    async fn socks_identify(
        &self,
        io: &mut TcpStream,
        policy: &Generation,
        peer: SocketAddr,
        deadline: Instant,
    ) -> Result<(Arc<str>, Option<Arc<Live>>), Failed> {
        let offered = read_greeting(io, deadline).await?;
        let identities = policy.identities();
        let default = || -> Arc<str> { Arc::from(crate::policy::DEFAULT_IDENTITY) };
        let refused = |reason: Reason, detail: String| {
            Failed::new(reason, Answer::Method(METHOD_NO_ACCEPTABLE), detail)
        };
        if identities.is_empty() && offered.none {
            send(io, &[VERSION, METHOD_NONE]).await?;
            return Ok((default(), None));
        }
        if !offered.userpass {
            if identities.is_empty() {
                return Err(refused(
                    Reason::BadRequest,
                    "the greeting offers neither method 0x00 (none) nor 0x02 (username/password)"
                        .into(),
                ));
            }
            if !offered.none {
                return Err(refused(
                    Reason::ProxyAuthRequired,
                    "identities are configured and the greeting does not offer username/password (0x02)".into(),
                ));
            }
            // A session bound to this address first, then a source-address identity.
            match self.session_by_source(peer).await {
                Ok(Some(live)) => {
                    send(io, &[VERSION, METHOD_NONE]).await?;
                    return Ok((Arc::from(live.profile.as_str()), Some(live)));
                }
                Ok(None) => {}
                Err(r) => return Err(refused(r.reason, r.message)),
            }
            let found =
                crate::policy::identity::identify(identities, policy.secrets(), None, peer.ip())
                    .await;
            return match found {
                Ok(identity) => {
                    send(io, &[VERSION, METHOD_NONE]).await?;
                    Ok((Arc::from(identity.name.as_str()), None))
                }
                Err(e) => Err(refused(Reason::ProxyAuthRequired, e.to_string())),
            };
        }
        send(io, &[VERSION, METHOD_USERPASS]).await?;
        let credentials = read_credentials(io, deadline).await?;
        if identities.is_empty() {
            send(io, &[AUTH_VERSION, AUTH_OK]).await?;
            return Ok((default(), None));
        }
        // Username SESSION_ID, password TOKEN: a runtime session.
        if let Some(admitted) = self
            .session_by_user(&credentials.user, &credentials.password, peer)
            .await
        {
            return match admitted {
                Ok(live) => {
                    send(io, &[AUTH_VERSION, AUTH_OK]).await?;
                    Ok((Arc::from(live.profile.as_str()), Some(live)))
                }
                Err(r) => Err(Failed::new(r.reason, Answer::Auth(AUTH_FAILED), r.message)),
            };
        }
        let authorization = as_proxy_authorization(credentials.token());
        let found = crate::policy::identity::identify(
            identities,
            policy.secrets(),
            Some(authorization.as_bytes()),
            peer.ip(),
        )
        .await;
        match found {
            Ok(identity) => {
                send(io, &[AUTH_VERSION, AUTH_OK]).await?;
                Ok((Arc::from(identity.name.as_str()), None))
            }
            Err(e) => Err(Failed::new(
                Reason::ProxyAuthRequired,
                Answer::Auth(AUTH_FAILED),
                e.to_string(),
            )),
        }
    }

    /// Serves an intercepted authority once the reply is sent: TLS (its first byte 0x16) is
    /// intercepted as after a CONNECT; anything else is served as plain HTTP pinned to the
    /// authority, each request decided by the pipeline.
    async fn socks_serve(self: Arc<Self>, stream: TcpStream, pinned: Ctx, entry: Entry) {
        let Some((host, port)) = pinned.pinned.clone() else {
            return;
        };
        let mut first = [0u8; 1];
        let peeked =
            tokio::time::timeout(self.limits.header_timeout, stream.peek(&mut first)).await;
        match peeked {
            Ok(Ok(n)) if n > 0 && first[0] == TLS_HANDSHAKE => {
                connect::serve_opened(self, Opened::Intercept(pinned), stream, entry, None).await;
            }
            Ok(Ok(n)) if n > 0 => {
                // Each request leaves its own record from here.
                entry.dismiss();
                let mut ctx = Ctx::pinned_plain(pinned.client, pinned.identity, host, port)
                    .with_cut(pinned.cut);
                ctx.session = pinned.session;
                super::intercepted::serve_stream(self, Arc::new(ctx), stream, false).await;
            }
            Ok(Ok(_)) => gate_refused(
                entry,
                &Refusal::new(
                    Reason::BadRequest,
                    "the client closed the connection before sending a request",
                ),
            ),
            Ok(Err(e)) => gate_refused(
                entry,
                &Refusal::new(
                    Reason::BadRequest,
                    format!("the connection failed before a request: {e}"),
                ),
            ),
            Err(_) => gate_refused(
                entry,
                &Refusal::new(
                    Reason::HeaderTimeout,
                    "no request arrived within the header timeout after the SOCKS5 reply",
                ),
            ),
        }
    }

    /// Records a negotiation that failed before the gate, then answers it: under `identity` when
    /// one is known (or `unidentified` for failed credentials), as a connection otherwise.
    async fn socks_refused(
        &self,
        io: &mut TcpStream,
        peer: SocketAddr,
        identity: Option<&str>,
        policy: &Generation,
        failed: Failed,
    ) {
        let mut entry = match identity {
            Some(identity) => crate::open_record(self, peer, identity, policy).await,
            None => crate::open_connection_record(self, peer, policy).await,
        };
        if let Some(command) = failed.command {
            entry.set_method(command);
        }
        if let Some((host, port)) = &failed.target {
            entry.set_authority(host, *port);
        }
        let detail = entry.scrub_text(&failed.detail);
        tracing::info!(audit.id = %entry.id(), client.addr = %peer, reason = failed.reason.code(), detail, "SOCKS5 connection refused");
        entry.outcome(failed.reason, None, None);
        entry.finish();
        answer(io, &failed.answer.bytes()).await;
    }
}

/// A refused CONNECT's answer: the reply its reason gets (RFC 1928 §6), after the record.
struct SocksReply<'s>(&'s mut TcpStream);

impl Refuse for SocksReply<'_> {
    type Answered = ();

    async fn refuse(self, entry: Entry, refusal: &Refusal) {
        let reply = reply_for(refusal.reason);
        gate_refused(entry, refusal);
        answer(self.0, &reply_bytes(reply)).await;
    }
}

/// Records a refusal of the gate (or of what followed its reply). The SOCKS5 reply is not an
/// HTTP status, so the record has none.
fn gate_refused(mut entry: Entry, refusal: &Refusal) {
    let detail = entry.scrub_text(&refusal.message);
    tracing::info!(audit.id = %entry.id(), reason = refusal.reason.code(), detail, "SOCKS5 CONNECT refused");
    entry.outcome(refusal.reason, refusal.rule.as_deref(), None);
    entry.finish();
}

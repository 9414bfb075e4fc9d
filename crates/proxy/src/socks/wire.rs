//! SOCKS5's wire format as latchkey speaks it (RFC 1928, RFC 1929): the greeting, the
//! username/password sub-negotiation and the request, each read under the caller's deadline into
//! fixed 255-byte buffers (every length is one byte); the replies; and what a refused client is
//! owed. Pure protocol over any `AsyncRead`/`AsyncWrite`: depends on `reason` only, and knows
//! nothing of policy, identities or the proxy.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use base64::Engine;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use zeroize::Zeroizing;

use crate::reason::Reason;

pub(super) const VERSION: u8 = 0x05;
/// RFC 1929's sub-negotiation version.
pub(super) const AUTH_VERSION: u8 = 0x01;
pub(super) const METHOD_NONE: u8 = 0x00;
pub(super) const METHOD_USERPASS: u8 = 0x02;
pub(super) const METHOD_NO_ACCEPTABLE: u8 = 0xFF;
pub(super) const AUTH_OK: u8 = 0x00;
pub(super) const AUTH_FAILED: u8 = 0x01;
const CMD_CONNECT: u8 = 0x01;
const CMD_BIND: u8 = 0x02;
const CMD_UDP_ASSOCIATE: u8 = 0x03;
const ATYP_V4: u8 = 0x01;
const ATYP_NAME: u8 = 0x03;
const ATYP_V6: u8 = 0x04;
/// The first byte of a TLS record carrying a handshake (the ClientHello).
pub(super) const TLS_HANDSHAKE: u8 = 0x16;
/// How long an answer to a refused client may take to write before the socket is dropped.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// RFC 1928 §6 reply codes latchkey sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reply {
    Succeeded = 0x00,
    GeneralFailure = 0x01,
    NotAllowed = 0x02,
    HostUnreachable = 0x04,
    CommandNotSupported = 0x07,
    AddressTypeNotSupported = 0x08,
}

/// The reply a gate refusal gets: a policy (or address guard, or leak) denial is "not allowed
/// by ruleset", an upstream that cannot be reached is "host unreachable", anything else a
/// general failure.
///
/// The gate's refusal keeps the upstream failure's reason, not its I/O error kind, so a refused
/// connection and an unreachable host both answer 0x04.
pub(super) fn reply_for(reason: Reason) -> Reply {
    match reason {
        Reason::UpstreamUnreachable | Reason::UpstreamTimeout => Reply::HostUnreachable,
        r if r.status() == http::StatusCode::PROXY_AUTHENTICATION_REQUIRED
            || r.status() == http::StatusCode::FORBIDDEN =>
        {
            Reply::NotAllowed
        }
        _ => Reply::GeneralFailure,
    }
}

/// A reply to a request: the bound address is never disclosed (it would tell the sandbox
/// latchkey's uplink address), so it is always `0.0.0.0:0`.
pub(super) fn reply_bytes(reply: Reply) -> [u8; 10] {
    [VERSION, reply as u8, 0, ATYP_V4, 0, 0, 0, 0, 0, 0]
}

/// What a client is owed when its negotiation ends early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// The method selection message (`0xFF`: no acceptable method).
    Method(u8),
    /// The username/password status (`0x01`: failure).
    Auth(u8),
    /// A reply to the request.
    Reply(Reply),
    /// Nothing the protocol can say at this point: the connection just closes.
    Close,
}

impl Answer {
    pub(super) fn bytes(self) -> Vec<u8> {
        match self {
            Answer::Method(m) => vec![VERSION, m],
            Answer::Auth(s) => vec![AUTH_VERSION, s],
            Answer::Reply(r) => reply_bytes(r).to_vec(),
            Answer::Close => Vec::new(),
        }
    }
}

/// Why a negotiation ended before the gate could decide: the record's reason, what the client
/// is owed, what of the request was known, and a sentence for the log (never a password).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {detail}", reason.code())]
pub(super) struct Failed {
    pub(super) reason: Reason,
    pub(super) answer: Answer,
    /// The command as the record's method (`BIND`, `UDP_ASSOCIATE`), once the request was read.
    pub(super) command: Option<&'static str>,
    /// The host as sent and the port, once the request was read.
    pub(super) target: Option<(String, u16)>,
    pub(super) detail: String,
}

impl Failed {
    pub(super) fn new(reason: Reason, answer: Answer, detail: impl Into<String>) -> Self {
        Self {
            reason,
            answer,
            command: None,
            target: None,
            detail: detail.into(),
        }
    }
}

/// The methods a client's greeting offers (of the two latchkey speaks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Offered {
    pub(super) none: bool,
    pub(super) userpass: bool,
}

/// A CONNECT request as read: the host as sent (a name, or an IP literal's text) and the port.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Request {
    pub(super) host: String,
    pub(super) port: u16,
}

/// Reads exactly `buf.len()` bytes by `deadline`: a close is `bad_request`, the deadline
/// `header_timeout`.
async fn read_by<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut [u8],
    deadline: Instant,
    what: &str,
) -> Result<(), Failed> {
    match tokio::time::timeout_at(deadline, io.read_exact(buf)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Failed::new(
            Reason::BadRequest,
            Answer::Close,
            format!("the connection ended in the SOCKS5 {what}: {e}"),
        )),
        Err(_) => Err(Failed::new(
            Reason::HeaderTimeout,
            Answer::Close,
            format!("the SOCKS5 {what} did not arrive in time"),
        )),
    }
}

/// Reads the greeting (`VER NMETHODS METHODS`).
pub(super) async fn read_greeting<R: AsyncRead + Unpin>(
    io: &mut R,
    deadline: Instant,
) -> Result<Offered, Failed> {
    let mut head = [0u8; 2];
    read_by(io, &mut head, deadline, "greeting").await?;
    if head[0] != VERSION {
        return Err(Failed::new(
            Reason::BadRequest,
            Answer::Close,
            format!("not a SOCKS5 greeting (version byte {:#04x})", head[0]),
        ));
    }
    let mut methods = [0u8; 255];
    let methods = &mut methods[..usize::from(head[1])];
    read_by(io, methods, deadline, "greeting").await?;
    Ok(Offered {
        none: methods.contains(&METHOD_NONE),
        userpass: methods.contains(&METHOD_USERPASS),
    })
}

/// Reads RFC 1929's `VER ULEN UNAME PLEN PASSWD`; returns the token it presents: the password,
/// or the username when the password is empty (as for a Basic `Proxy-Authorization`).
/// A username/password sub-negotiation's two fields, as sent.
pub(super) struct Credentials {
    pub user: Zeroizing<Vec<u8>>,
    pub password: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values: the password is a token.
        f.write_str("Credentials { .. }")
    }
}

impl Credentials {
    /// The token an identity is matched by: the password, or the user when there is none.
    pub fn token(&self) -> &[u8] {
        if self.password.is_empty() {
            &self.user
        } else {
            &self.password
        }
    }
}

pub(super) async fn read_credentials<R: AsyncRead + Unpin>(
    io: &mut R,
    deadline: Instant,
) -> Result<Credentials, Failed> {
    let mut head = [0u8; 2];
    read_by(io, &mut head, deadline, "username/password").await?;
    if head[0] != AUTH_VERSION {
        return Err(Failed::new(
            Reason::BadRequest,
            Answer::Auth(AUTH_FAILED),
            format!(
                "not a username/password sub-negotiation (version byte {:#04x})",
                head[0]
            ),
        ));
    }
    let mut user = Zeroizing::new([0u8; 255]);
    let user = &mut user[..usize::from(head[1])];
    read_by(io, user, deadline, "username/password").await?;
    let mut len = [0u8; 1];
    read_by(io, &mut len, deadline, "username/password").await?;
    let mut pass = Zeroizing::new([0u8; 255]);
    let pass = &mut pass[..usize::from(len[0])];
    read_by(io, pass, deadline, "username/password").await?;
    Ok(Credentials {
        user: Zeroizing::new(user.to_vec()),
        password: Zeroizing::new(pass.to_vec()),
    })
}

/// Reads the request (`VER CMD RSV ATYP DST.ADDR DST.PORT`); anything but a CONNECT to a
/// well-formed address is a [`Failed`] carrying the reply it gets.
pub(super) async fn read_request<R: AsyncRead + Unpin>(
    io: &mut R,
    deadline: Instant,
) -> Result<Request, Failed> {
    let mut head = [0u8; 4];
    read_by(io, &mut head, deadline, "request").await?;
    let [version, command, _reserved, atyp] = head;
    if version != VERSION {
        return Err(Failed::new(
            Reason::BadRequest,
            Answer::Reply(Reply::GeneralFailure),
            format!("not a SOCKS5 request (version byte {version:#04x})"),
        ));
    }
    let host = match atyp {
        ATYP_V4 => {
            let mut a = [0u8; 4];
            read_by(io, &mut a, deadline, "request").await?;
            Ipv4Addr::from(a).to_string()
        }
        ATYP_V6 => {
            let mut a = [0u8; 16];
            read_by(io, &mut a, deadline, "request").await?;
            Ipv6Addr::from(a).to_string()
        }
        ATYP_NAME => {
            let mut len = [0u8; 1];
            read_by(io, &mut len, deadline, "request").await?;
            let mut name = [0u8; 255];
            let name = &mut name[..usize::from(len[0])];
            read_by(io, name, deadline, "request").await?;
            match std::str::from_utf8(name) {
                Ok(n) if !n.is_empty() => n.to_string(),
                _ => {
                    return Err(Failed::new(
                        Reason::BadRequest,
                        Answer::Reply(Reply::GeneralFailure),
                        "the requested domain name is empty or not UTF-8",
                    ))
                }
            }
        }
        other => {
            return Err(Failed::new(
                Reason::BadRequest,
                Answer::Reply(Reply::AddressTypeNotSupported),
                format!("address type {other:#04x} is not one of IPv4, domain name, IPv6"),
            ))
        }
    };
    let mut port = [0u8; 2];
    read_by(io, &mut port, deadline, "request").await?;
    let port = u16::from_be_bytes(port);
    let unsupported = match command {
        CMD_CONNECT => return Ok(Request { host, port }),
        CMD_BIND => Some("BIND"),
        CMD_UDP_ASSOCIATE => Some("UDP_ASSOCIATE"),
        _ => None,
    };
    Err(Failed {
        command: unsupported,
        target: Some((host, port)),
        ..Failed::new(
            Reason::BadRequest,
            Answer::Reply(Reply::CommandNotSupported),
            format!("SOCKS5 command {command:#04x} is not supported: latchkey relays CONNECT only"),
        )
    })
}

/// The `Proxy-Authorization` value that presents exactly `token` to the proxy hop's credential
/// check (Basic with an empty user: the token is then the password, whatever bytes it holds).
pub(super) fn as_proxy_authorization(token: &[u8]) -> Zeroizing<String> {
    let mut joined = Zeroizing::new(Vec::with_capacity(token.len() + 1));
    joined.push(b':');
    joined.extend_from_slice(token);
    let encoded = Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(&*joined));
    Zeroizing::new(format!("Basic {}", encoded.as_str()))
}

/// Writes what a refused client is owed (bounded in time), then closes.
pub(super) async fn answer<W: AsyncWrite + Unpin>(io: &mut W, bytes: &[u8]) {
    let _ = tokio::time::timeout(ANSWER_TIMEOUT, async {
        if !bytes.is_empty() {
            let _ = io.write_all(bytes).await;
        }
        let _ = io.shutdown().await;
    })
    .await;
}

/// Writes a message the negotiation goes on after; a client that cannot take it is gone.
pub(super) async fn send<W: AsyncWrite + Unpin>(io: &mut W, bytes: &[u8]) -> Result<(), Failed> {
    match tokio::time::timeout(ANSWER_TIMEOUT, io.write_all(bytes)).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(Failed::new(
            Reason::BadRequest,
            Answer::Close,
            "the client stopped reading during the SOCKS5 negotiation",
        )),
    }
}

#[cfg(test)]
#[path = "wire_props.rs"]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    async fn greeting(bytes: &[u8]) -> Result<Offered, Failed> {
        let mut io = bytes;
        read_greeting(&mut io, far()).await
    }

    async fn request(bytes: &[u8]) -> Result<Request, Failed> {
        let mut io = bytes;
        read_request(&mut io, far()).await
    }

    #[tokio::test]
    async fn a_greeting_says_which_of_latchkeys_methods_it_offers() {
        let got = greeting(&[5, 3, 0x00, 0x01, 0x02]).await;
        assert_eq!(
            got,
            Ok(Offered {
                none: true,
                userpass: true
            })
        );
        let got = greeting(&[5, 1, 0x02]).await;
        assert_eq!(
            got,
            Ok(Offered {
                none: false,
                userpass: true
            })
        );
        let got = greeting(&[5, 0]).await;
        assert_eq!(got, Ok(Offered::default()));
    }

    #[tokio::test]
    async fn a_greeting_of_another_version_or_cut_short_is_a_bad_request_that_just_closes() {
        for bytes in [&[4u8, 1, 0][..], b"GET / HTTP/1.1\r\n", &[5, 3, 0]] {
            let failed = greeting(bytes).await.expect_err("refused");
            assert_eq!(failed.reason, Reason::BadRequest, "{bytes:?}");
            assert_eq!(failed.answer, Answer::Close, "{bytes:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_greeting_is_a_header_timeout_at_the_deadline() {
        let (mut server, mut client) = tokio::io::duplex(64);
        client
            .write_all(&[5, 2, 0])
            .await
            .expect("partial greeting");
        let deadline = Instant::now() + Duration::from_secs(3);
        let failed = read_greeting(&mut server, deadline)
            .await
            .expect_err("timed out");
        assert_eq!(failed.reason, Reason::HeaderTimeout);
        assert!(Instant::now() >= deadline);
        drop(client);
    }

    #[tokio::test]
    async fn each_address_type_is_read_into_the_host_policy_sees() {
        let mut v4 = vec![5, 1, 0, 1, 10, 1, 2, 3];
        v4.extend_from_slice(&443u16.to_be_bytes());
        assert_eq!(
            request(&v4).await,
            Ok(Request {
                host: "10.1.2.3".into(),
                port: 443
            })
        );
        let mut name = vec![5, 1, 0, 3, 8];
        name.extend_from_slice(b"api.test");
        name.extend_from_slice(&8080u16.to_be_bytes());
        assert_eq!(
            request(&name).await,
            Ok(Request {
                host: "api.test".into(),
                port: 8080
            })
        );
        let mut v6 = vec![5, 1, 0, 4];
        v6.extend_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().expect("v6").octets());
        v6.extend_from_slice(&80u16.to_be_bytes());
        assert_eq!(
            request(&v6).await,
            Ok(Request {
                host: "2001:db8::1".into(),
                port: 80
            })
        );
    }

    #[tokio::test]
    async fn bind_and_udp_associate_are_refused_with_command_not_supported_naming_the_target() {
        for (cmd, name) in [(2u8, Some("BIND")), (3, Some("UDP_ASSOCIATE")), (9, None)] {
            let mut bytes = vec![5, cmd, 0, 1, 127, 0, 0, 1];
            bytes.extend_from_slice(&53u16.to_be_bytes());
            let failed = request(&bytes).await.expect_err("refused");
            assert_eq!(failed.answer, Answer::Reply(Reply::CommandNotSupported));
            assert_eq!(failed.command, name);
            assert_eq!(failed.target, Some(("127.0.0.1".into(), 53)));
            assert_eq!(failed.reason, Reason::BadRequest);
        }
    }

    #[tokio::test]
    async fn an_unknown_address_type_or_an_unreadable_name_gets_its_reply() {
        let failed = request(&[5, 1, 0, 9, 1, 2]).await.expect_err("refused");
        assert_eq!(failed.answer, Answer::Reply(Reply::AddressTypeNotSupported));
        let failed = request(&[5, 1, 0, 3, 0, 0, 80]).await.expect_err("empty");
        assert_eq!(failed.answer, Answer::Reply(Reply::GeneralFailure));
        let failed = request(&[5, 1, 0, 3, 2, 0xff, 0xfe, 0, 80])
            .await
            .expect_err("not UTF-8");
        assert_eq!(failed.answer, Answer::Reply(Reply::GeneralFailure));
        // A name longer than what arrived: the read ends with the stream, nothing allocated.
        let failed = request(&[5, 1, 0, 3, 255, b'a']).await.expect_err("short");
        assert_eq!(
            (failed.reason, failed.answer),
            (Reason::BadRequest, Answer::Close)
        );
    }

    #[tokio::test]
    async fn credentials_present_the_password_or_the_user_when_it_is_empty() {
        let mut io: &[u8] = &[1, 2, b'c', b'i', 3, b't', b':', b'k'];
        let token = read_credentials(&mut io, far()).await.expect("read");
        assert_eq!(token.token(), b"t:k");
        let mut io: &[u8] = &[1, 3, b't', b'o', b'k', 0];
        let token = read_credentials(&mut io, far()).await.expect("read");
        assert_eq!(token.token(), b"tok");
        let mut io: &[u8] = &[5, 1, b'x', 1, b'y'];
        let failed = read_credentials(&mut io, far()).await.expect_err("version");
        assert_eq!(failed.answer, Answer::Auth(AUTH_FAILED));
    }

    #[test]
    fn the_authorization_value_presents_exactly_the_token_to_the_proxy_hops_check() {
        for token in [&b"t:k"[..], b"plain", b"\xff\x00bytes"] {
            let value = as_proxy_authorization(token);
            let presented =
                crate::policy::identity::presented_token(value.as_bytes()).expect("a Basic value");
            assert_eq!(presented.as_slice(), token);
        }
    }

    #[test]
    fn refusals_map_to_the_reply_that_fits() {
        assert_eq!(reply_for(Reason::NoRule), Reply::NotAllowed);
        assert_eq!(reply_for(Reason::PortNotAllowed), Reply::NotAllowed);
        assert_eq!(reply_for(Reason::NonPublicAddress), Reply::NotAllowed);
        assert_eq!(reply_for(Reason::SecretValueUnbound), Reply::NotAllowed);
        assert_eq!(reply_for(Reason::ProxyAuthRequired), Reply::NotAllowed);
        assert_eq!(
            reply_for(Reason::UpstreamUnreachable),
            Reply::HostUnreachable
        );
        assert_eq!(reply_for(Reason::UpstreamTimeout), Reply::HostUnreachable);
        assert_eq!(reply_for(Reason::BadRequest), Reply::GeneralFailure);
        assert_eq!(reply_for(Reason::AuditUnavailable), Reply::GeneralFailure);
        assert_eq!(
            reply_bytes(Reply::Succeeded),
            [5, 0, 0, 1, 0, 0, 0, 0, 0, 0]
        );
    }
}

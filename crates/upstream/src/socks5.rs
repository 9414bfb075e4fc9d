//! The SOCKS5 side of `--upstream-proxy socks5://HOST:PORT`: RFC 1928 `CONNECT` to the checked
//! address (ATYP 1 or 4, never a name: latchkey resolved and guarded it) with no authentication
//! or RFC 1929 username/password. Every read is of a length the protocol fixes, so nothing the
//! upstream sends after the reply is consumed. The caller bounds it with `--connect-timeout`.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use zeroize::Zeroizing;

use crate::chain::{fetch_password, ChainError, UpstreamProxy};

const VERSION: u8 = 5;
const NO_AUTH: u8 = 0;
const USER_PASS: u8 = 2;
const NO_ACCEPTABLE: u8 = 0xff;

/// Greets, authenticates if the proxy asks, and asks for `CONNECT target`.
pub(crate) async fn connect(
    stream: &mut TcpStream,
    proxy: &UpstreamProxy,
    target: SocketAddr,
) -> Result<(), ChainError> {
    let name = proxy.url.to_string();
    let io = |source| ChainError::Io {
        proxy: name.clone(),
        target,
        source,
    };
    let bad = |why: String| ChainError::Protocol {
        proxy: name.clone(),
        target,
        why,
    };
    // Offer username/password only when latchkey has credentials to give.
    let greeting: &[u8] = if proxy.auth.is_some() {
        &[VERSION, 2, NO_AUTH, USER_PASS]
    } else {
        &[VERSION, 1, NO_AUTH]
    };
    stream.write_all(greeting).await.map_err(io)?;
    let mut choice = [0u8; 2];
    stream.read_exact(&mut choice).await.map_err(io)?;
    if choice[0] != VERSION {
        return Err(bad(format!("not a SOCKS5 answer (version {})", choice[0])));
    }
    match (choice[1], &proxy.auth) {
        (NO_AUTH, _) => {}
        (USER_PASS, Some(auth)) => {
            let password = fetch_password(proxy, auth).await?;
            if password.len() > 255 {
                return Err(ChainError::Password {
                    proxy: name.clone(),
                    why: "longer than 255 bytes, the most SOCKS5 can carry".to_string(),
                });
            }
            // RFC 1929: VER=1, ULEN, UNAME, PLEN, PASSWD (lengths checked at startup / above).
            let user = auth.user().as_bytes();
            let mut request = Zeroizing::new(Vec::with_capacity(3 + user.len() + password.len()));
            request.push(1);
            request.push(user.len() as u8);
            request.extend_from_slice(user);
            request.push(password.len() as u8);
            request.extend_from_slice(&password);
            stream.write_all(&request).await.map_err(io)?;
            let mut status = [0u8; 2];
            stream.read_exact(&mut status).await.map_err(io)?;
            if status[1] != 0 {
                return Err(ChainError::Refused {
                    proxy: name.clone(),
                    target,
                    answer: format!(
                        "SOCKS5 username/password authentication failed for user {:?}",
                        auth.user()
                    ),
                });
            }
        }
        (NO_ACCEPTABLE, _) | (USER_PASS, None) => {
            return Err(ChainError::Refused {
                proxy: name.clone(),
                target,
                answer: "SOCKS5: no acceptable authentication method (give the proxy's \
                         credentials with --upstream-proxy-credentials)"
                    .to_string(),
            })
        }
        (other, _) => {
            return Err(bad(format!(
                "chose authentication method {other} not offered"
            )))
        }
    }
    stream.write_all(&request(target)).await.map_err(io)?;
    let mut reply = [0u8; 4];
    stream.read_exact(&mut reply).await.map_err(io)?;
    if reply[0] != VERSION {
        return Err(bad(format!("not a SOCKS5 reply (version {})", reply[0])));
    }
    if reply[1] != 0 {
        return Err(ChainError::Refused {
            proxy: name.clone(),
            target,
            answer: format!("SOCKS5 reply {}: {}", reply[1], reply_text(reply[1])),
        });
    }
    // BND.ADDR and BND.PORT: read and dropped, exactly their length.
    let bound = match reply[3] {
        1 => 4,
        4 => 16,
        3 => {
            let mut len = [0u8; 1];
            stream.read_exact(&mut len).await.map_err(io)?;
            usize::from(len[0])
        }
        other => return Err(bad(format!("unknown bound address type {other}"))),
    };
    let mut rest = vec![0u8; bound + 2];
    stream.read_exact(&mut rest).await.map_err(io)?;
    Ok(())
}

/// `VER CMD=CONNECT RSV ATYP DST.ADDR DST.PORT`, by address only.
fn request(target: SocketAddr) -> Vec<u8> {
    let mut out = vec![VERSION, 1, 0];
    match target {
        SocketAddr::V4(v4) => {
            out.push(1);
            out.extend_from_slice(&v4.ip().octets());
        }
        SocketAddr::V6(v6) => {
            out.push(4);
            out.extend_from_slice(&v6.ip().octets());
        }
    }
    out.extend_from_slice(&target.port().to_be_bytes());
    out
}

/// RFC 1928 §6's reply codes.
fn reply_text(code: u8) -> &'static str {
    match code {
        1 => "general SOCKS server failure",
        2 => "connection not allowed by ruleset",
        3 => "network unreachable",
        4 => "host unreachable",
        5 => "connection refused",
        6 => "TTL expired",
        7 => "command not supported",
        8 => "address type not supported",
        _ => "unassigned reply code",
    }
}

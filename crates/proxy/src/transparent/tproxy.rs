//! The transparent listener's socket for nftables `tproxy` (`serve --transparent-tproxy`): a
//! TCP listener with `IP_TRANSPARENT` (IPv4) or `IPV6_TRANSPARENT` (IPv6, which carries a
//! dual-stack socket's IPv4-mapped connections too: the kernel keeps one flag for both), so the
//! kernel hands it connections addressed to other hosts. Such a connection's local address is
//! its original destination; `origin` reads it from there when `SO_ORIGINAL_DST` has nothing.
//! Setting the option needs `CAP_NET_ADMIN` or `CAP_NET_RAW`; without either the bind fails, it
//! never degrades.
//!
//! Opens a socket only; depends on nothing else in the crate.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};

/// Pending connections the kernel queues for the listener (std's `TcpListener::bind` uses 128;
/// a gateway takes a whole sandbox's connections).
const BACKLOG: i32 = 1024;

/// Why the tproxy listener could not be opened; each names the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum TproxyError {
    #[error("cannot open a TCP socket: {0}")]
    Socket(io::Error),
    #[error(
        "cannot set {option} ({err}): nftables `tproxy` needs it, and setting it needs \
         CAP_NET_ADMIN or CAP_NET_RAW (run latchkey with one of them, or leave out \
         --transparent-tproxy and capture with nftables `redirect`)"
    )]
    Transparent {
        option: &'static str,
        err: io::Error,
    },
    #[error("cannot listen on {addr}: {err}")]
    Bind { addr: SocketAddr, err: io::Error },
}

/// A non-blocking listener on `addr` that accepts tproxy'd connections (and redirected ones,
/// whose original destination `SO_ORIGINAL_DST` still gives).
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, TproxyError> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(TproxyError::Socket)?;
    let transparent = match addr {
        SocketAddr::V4(_) => socket
            .set_ip_transparent_v4(true)
            .map_err(|err| ("IP_TRANSPARENT", err)),
        SocketAddr::V6(_) => socket
            .set_ip_transparent_v6(true)
            .map_err(|err| ("IPV6_TRANSPARENT", err)),
    };
    transparent.map_err(|(option, err)| TproxyError::Transparent { option, err })?;
    let bind_err = |err| TproxyError::Bind { addr, err };
    // What std's `TcpListener::bind` does on Unix: a restarted latchkey can rebind at once.
    socket.set_reuse_address(true).map_err(bind_err)?;
    socket.bind(&addr.into()).map_err(bind_err)?;
    socket.listen(BACKLOG).map_err(bind_err)?;
    socket.set_nonblocking(true).map_err(bind_err)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::SockRef;

    /// Setting the option needs CAP_NET_ADMIN or CAP_NET_RAW: where the test runs without it, the bind must
    /// fail naming the option, never hand back a listener tproxy cannot reach.
    #[test]
    fn the_listener_is_transparent_or_the_bind_fails_naming_the_option() {
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let addr: SocketAddr = addr.parse().expect("addr");
            match bind(addr) {
                Ok(listener) => {
                    let sock = SockRef::from(&listener);
                    let on = match addr {
                        SocketAddr::V4(_) => sock.ip_transparent_v4(),
                        SocketAddr::V6(_) => sock.ip_transparent_v6(),
                    };
                    assert!(on.expect("read the option"), "{addr}: not transparent");
                    assert!(listener.local_addr().expect("addr").port() != 0);
                }
                Err(TproxyError::Transparent { option, .. }) => {
                    assert!(option.ends_with("_TRANSPARENT"), "{option}");
                }
                // No IPv6 on this host.
                Err(TproxyError::Socket(_) | TproxyError::Bind { .. }) if addr.is_ipv6() => {}
                Err(e) => panic!("{addr}: {e}"),
            }
        }
    }
}

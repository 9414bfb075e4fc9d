//! Where a redirected connection was going: the destination the client dialed before the host
//! firewall's NAT (nftables `redirect`/`dnat`, iptables `REDIRECT`/`DNAT`) sent it to latchkey,
//! read back with `SO_ORIGINAL_DST` (IPv4) or `IP6T_SO_ORIGINAL_DST` (IPv6). A connection NAT
//! did not rewrite has the socket's own local address as its destination: for one nftables
//! `tproxy` delivered (`--transparent-tproxy`), that is the original destination itself; for
//! one that reached the listener directly, it is latchkey's own listener, which the caller
//! refuses as not redirected.
//!
//! Reads socket options only; depends on nothing else in the crate.

use std::net::{IpAddr, SocketAddr};

use tokio::net::TcpStream;

/// The original destination of `stream`, whose local address is `local`. IPv4-mapped IPv6
/// addresses come back as IPv4, so they compare equal to what a resolver answers.
pub(super) fn original_destination(stream: &TcpStream, local: SocketAddr) -> SocketAddr {
    let v4 = || rustix::net::sockopt::ip_original_dst(stream).map(SocketAddr::V4);
    let v6 = || rustix::net::sockopt::ipv6_original_dst(stream).map(SocketAddr::V6);
    // A dual-stack socket carries IPv4 connections as IPv4-mapped addresses, and conntrack
    // keeps those under IPv4: ask the family the connection really has first.
    let nat = match local.ip().to_canonical() {
        IpAddr::V4(_) => v4().or_else(|_| v6()),
        IpAddr::V6(_) => v6().or_else(|_| v4()),
    };
    canonical(nat.unwrap_or(local))
}

fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_nat_did_not_rewrite_was_going_to_the_listener_itself() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        // A test client on loopback, not a way out.
        #[allow(clippy::disallowed_methods)]
        let _client = TcpStream::connect(addr).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let local = server.local_addr().expect("local");
        assert_eq!(original_destination(&server, local), addr);
    }

    #[test]
    fn ipv4_mapped_addresses_read_as_ipv4() {
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:443".parse().expect("addr");
        assert_eq!(canonical(mapped), "10.0.0.1:443".parse().expect("addr"));
    }
}

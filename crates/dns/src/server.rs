//! The resolver's sockets: UDP and TCP on the same address (`serve --dns ADDR`), every client
//! bounded. UDP: the per-client rate cap first, then at most [`MAX_IN_FLIGHT`] queries being
//! answered at once (a lookup in `real` style can take seconds). TCP (RFC 1035 §4.2.2: a 2-byte
//! length before each message): at most [`MAX_TCP_CONNECTIONS`] at once, messages of at most
//! [`MAX_TCP_MESSAGE`] bytes, [`TCP_READ_TIMEOUT`] for each, [`MAX_TCP_QUERIES`] per
//! connection. Once a second, the queries refused over the rate cap are recorded, one record
//! per client. Everything stops when the proxy begins its shutdown.
//!
//! Depends on `proxy` (shutdown, the resolver's state) and the rest of `dns`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;

use super::message::Transport;
use super::rate::RateLimiter;
use super::resolver::{Resolver, Style};
use crate::proxy::Proxy;
use crate::reason::Reason;

/// UDP queries being answered at once; past it a query is answered SERVFAIL (`too_busy`).
pub const MAX_IN_FLIGHT: usize = 256;
/// TCP connections open at once; past it a connection is closed (`too_many_connections`).
pub const MAX_TCP_CONNECTIONS: usize = 64;
/// Largest query accepted over TCP (a query is a few dozen bytes; UDP takes 4 KiB, see
/// [`UDP_BUFFER`]).
pub const MAX_TCP_MESSAGE: usize = 4096;
/// Time a TCP client has for each message, and between messages.
pub const TCP_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Queries one TCP connection may ask before latchkey closes it.
pub const MAX_TCP_QUERIES: usize = 100;
/// A datagram longer than this is read cut, and refused as malformed.
const UDP_BUFFER: usize = 4096;
/// How often refusals over the rate cap are recorded.
const RATE_RECORD_EVERY: Duration = Duration::from_secs(1);
/// Attempts at finding a port free for both UDP and TCP when `--dns` asks for port 0.
const PORT_ATTEMPTS: usize = 16;

/// How the resolver answers (`--dns-answer`, `--dns-self`, `--dns-rate`).
#[derive(Debug, Clone)]
pub struct DnsConfig {
    pub style: Style,
    /// Queries a second per client (and the burst allowed).
    pub rate: u32,
}

/// The resolver's sockets, bound (before the proxy is built, so the address guard knows them)
/// but not yet serving.
#[derive(Debug)]
pub struct DnsListener {
    udp: std::net::UdpSocket,
    tcp: std::net::TcpListener,
    config: DnsConfig,
}

impl DnsListener {
    /// Binds UDP and TCP on `addr`; port 0 picks one port free for both.
    pub fn bind(addr: SocketAddr, config: DnsConfig) -> std::io::Result<Self> {
        let mut last = None;
        let attempts = if addr.port() == 0 { PORT_ATTEMPTS } else { 1 };
        for _ in 0..attempts {
            let udp = std::net::UdpSocket::bind(addr)?;
            let bound = udp.local_addr()?;
            match std::net::TcpListener::bind(bound) {
                Ok(tcp) => {
                    udp.set_nonblocking(true)?;
                    tcp.set_nonblocking(true)?;
                    return Ok(Self { udp, tcp, config });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no port free for both UDP and TCP")))
    }

    /// The address both sockets are bound to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.udp.local_addr()
    }
}

/// Serves both sockets until the proxy begins its shutdown.
pub async fn serve(proxy: Arc<Proxy>, listener: DnsListener) -> std::io::Result<()> {
    let DnsListener { udp, tcp, config } = listener;
    let udp = Arc::new(UdpSocket::from_std(udp)?);
    let tcp = TcpListener::from_std(tcp)?;
    let resolver = Arc::new(Resolver::new(proxy.clone(), config.style));
    let rate = Arc::new(RateLimiter::new(config.rate));
    let records = tokio::spawn(record_rate_refusals(
        proxy.clone(),
        resolver.clone(),
        rate.clone(),
    ));
    let tcp_task = tokio::spawn(serve_tcp(
        proxy.clone(),
        tcp,
        resolver.clone(),
        rate.clone(),
    ));
    serve_udp(&proxy, udp, resolver, rate.clone()).await;
    let _ = tcp_task.await;
    let _ = records.await;
    Ok(())
}

async fn serve_udp(
    proxy: &Arc<Proxy>,
    socket: Arc<UdpSocket>,
    resolver: Arc<Resolver>,
    rate: Arc<RateLimiter>,
) {
    let mut stop = proxy.shutdown_signal();
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut buf = vec![0u8; UDP_BUFFER];
    loop {
        let (n, client) = tokio::select! {
            () = crate::proxy::stopped(&mut stop) => return,
            got = socket.recv_from(&mut buf) => match got {
                Ok(got) => got,
                // An ICMP error for an earlier reply surfaces here on Linux: not fatal. Any
                // error waits a moment, so a socket that keeps failing does not spin.
                Err(e) => {
                    tracing::debug!(error = %e, "dns: udp receive failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        if !rate.admit(client, Transport::Udp) {
            // Refused without a record of its own: counted, and recorded once a second.
            if let Some(reply) = super::message::refused(&buf[..n]) {
                let _ = socket.try_send_to(&reply, client);
            }
            continue;
        }
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            if let Some(reply) = resolver.busy(&buf[..n], client, Transport::Udp) {
                let _ = socket.try_send_to(&reply, client);
            }
            continue;
        };
        let packet = buf[..n].to_vec();
        let (socket, resolver) = (socket.clone(), resolver.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if let Some(reply) = resolver.handle(&packet, client, Transport::Udp).await {
                let _ = socket.send_to(&reply, client).await;
            }
        });
    }
}

async fn serve_tcp(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    resolver: Arc<Resolver>,
    rate: Arc<RateLimiter>,
) {
    let mut stop = proxy.shutdown_signal();
    let connections = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS));
    loop {
        let (stream, client) = tokio::select! {
            () = crate::proxy::stopped(&mut stop) => return,
            got = listener.accept() => match got {
                Ok(got) => got,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(error = %e, "dns: tcp accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            // A client over its rate gets no record of its own for this either.
            if rate.admit(client, Transport::Tcp) {
                resolver.connection_refused(client, Reason::TooManyConnections);
            }
            drop(stream);
            continue;
        };
        let (resolver, rate, proxy) = (resolver.clone(), rate.clone(), proxy.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let mut stop = proxy.shutdown_signal();
            tokio::select! {
                () = crate::proxy::stopped(&mut stop) => {}
                () = tcp_connection(stream, client, &resolver, &rate) => {}
            }
        });
    }
}

/// Serves one TCP connection: length-prefixed queries, each answered in turn.
async fn tcp_connection(
    mut stream: TcpStream,
    client: SocketAddr,
    resolver: &Resolver,
    rate: &RateLimiter,
) {
    let mut answered = 0;
    let mut buf = vec![0u8; MAX_TCP_MESSAGE];
    while answered < MAX_TCP_QUERIES {
        let mut len = [0u8; 2];
        match tokio::time::timeout(TCP_READ_TIMEOUT, stream.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            // The client closed the connection, or failed: nothing was asked.
            Ok(Err(_)) => break,
            Err(_) => {
                if answered == 0 {
                    resolver.connection_refused(client, Reason::HeaderTimeout);
                }
                break;
            }
        }
        let len = usize::from(u16::from_be_bytes(len));
        if len > MAX_TCP_MESSAGE {
            resolver.connection_refused(client, Reason::BadRequest);
            break;
        }
        let message = &mut buf[..len];
        match tokio::time::timeout(TCP_READ_TIMEOUT, stream.read_exact(message)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => break,
            Err(_) => {
                resolver.connection_refused(client, Reason::HeaderTimeout);
                break;
            }
        }
        answered += 1;
        let reply = if rate.admit(client, Transport::Tcp) {
            resolver.handle(message, client, Transport::Tcp).await
        } else {
            super::message::refused(message)
        };
        let Some(reply) = reply else { continue };
        let Ok(len) = u16::try_from(reply.len()) else {
            break;
        };
        let mut framed = Vec::with_capacity(reply.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(&reply);
        match tokio::time::timeout(TCP_READ_TIMEOUT, stream.write_all(&framed)).await {
            Ok(Ok(())) => {}
            _ => break,
        }
    }
    let _ = stream.shutdown().await;
}

/// Once a second, one record per client for its queries refused over the rate cap.
async fn record_rate_refusals(proxy: Arc<Proxy>, resolver: Arc<Resolver>, rate: Arc<RateLimiter>) {
    let mut stop = proxy.shutdown_signal();
    let mut tick = tokio::time::interval(RATE_RECORD_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopping = tokio::select! {
            () = crate::proxy::stopped(&mut stop) => true,
            _ = tick.tick() => false,
        };
        for refused in rate.take_refused() {
            resolver.rate_limited(refused);
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;

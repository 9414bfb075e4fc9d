//! The sandbox's side of a captured connection once latchkey knows what it is: the bytes it
//! already read to find out (a plain-HTTP head) handed out again before the rest, so hyper and
//! the raw-head sniffer see the request whole, and the connection's slot under the caps held
//! for exactly as long as the stream lives, through whichever task it is moved to.
//!
//! Depends on `limits` (the slot) only.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::super::limits::ConnectionSlot;

/// A client stream with `replay` to be read before anything new from `io`.
pub(super) struct Client<T> {
    replay: Vec<u8>,
    pos: usize,
    io: T,
    _slot: ConnectionSlot,
}

impl<T> Client<T> {
    pub(super) fn new(io: T, replay: Vec<u8>, slot: ConnectionSlot) -> Self {
        Self {
            replay,
            pos: 0,
            io,
            _slot: slot,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Client<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pos < this.replay.len() && buf.remaining() > 0 {
            let n = buf.remaining().min(this.replay.len() - this.pos);
            buf.put_slice(&this.replay[this.pos..this.pos + n]);
            this.pos += n;
            if this.pos == this.replay.len() {
                // Replayed whole: an idle connection keeps none of it.
                this.replay = Vec::new();
                this.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Client<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::limits::{ConnectionCounter, Limits};

    #[tokio::test]
    async fn replayed_bytes_come_first_then_the_stream_and_the_slot_lives_with_it() {
        let counter = Arc::new(ConnectionCounter::default());
        let slot = counter
            .acquire("10.0.0.1".parse().expect("ip"), &Limits::default())
            .expect("a slot");
        let (a, mut b) = tokio::io::duplex(64);
        let mut client = Client::new(a, b"GET / HTTP/1.1\r\n".to_vec(), slot);
        b.write_all(b"Host: x\r\n\r\n").await.expect("write");
        let mut got = vec![0u8; 27];
        client.read_exact(&mut got).await.expect("read");
        assert_eq!(got, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        client.write_all(b"ok").await.expect("write");
        let mut back = [0u8; 2];
        b.read_exact(&mut back).await.expect("read back");
        assert_eq!(&back, b"ok");
        assert_eq!(counter.open(), 1);
        drop(client);
        assert_eq!(counter.open(), 0);
    }
}

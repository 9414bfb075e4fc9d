//! What a WebSocket holds of a message not yet whole, charged to the buffer budget
//! (`--max-buffered-bytes`, [`super::budget`]) as its bytes arrive.
//!
//! The relay reads whole messages (tungstenite reassembles fragments, and buffers a large frame
//! until its last byte): until a message ends, its bytes sit in memory on the client's behalf.
//! [`Held`] wraps each side's connection and follows the frame headers in the bytes read
//! ([`Frames`]), so the bytes of the message in progress (every data frame since its first,
//! the current one as far as it has arrived) are charged to the client's share of the budget;
//! past it the read fails with [`HeldOver`], and the relay closes the socket `1013`
//! (`too_busy`). The charge goes back when the message is whole (the relay charges the message
//! itself while it checks it) or the socket ends.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::budget::{Charge, OverBudget};

/// The read failed because the message in progress would pass the buffer budget.
#[derive(Debug, thiserror::Error)]
#[error("cannot hold more of an unfinished WebSocket message: {0}")]
pub struct HeldOver(pub OverBudget);

/// Whether a relay read failed with [`HeldOver`].
pub fn is_held_over(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<HeldOver>())
}

/// Where the frame parser is in the byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a frame header: `have` bytes of it so far.
    Header { have: usize },
    /// Reading a frame's payload.
    Payload { left: u64, data: bool, fin: bool },
}

/// Follows RFC 6455 frame headers through a byte stream, however it is split, counting the
/// payload bytes of the data message in progress. It only measures: tungstenite parses and
/// validates the frames themselves.
#[derive(Debug, Clone)]
pub struct Frames {
    header: [u8; 14],
    state: State,
    /// Payload bytes of the unfinished data message so far.
    message: u64,
}

impl Default for Frames {
    fn default() -> Self {
        Self {
            header: [0; 14],
            state: State::Header { have: 0 },
            message: 0,
        }
    }
}

impl Frames {
    /// Feeds the next bytes read; returns the bytes of the unfinished message held after them.
    pub fn feed(&mut self, mut bytes: &[u8]) -> u64 {
        while !bytes.is_empty() {
            match self.state {
                State::Header { have } => {
                    let need = header_len(&self.header[..have]);
                    let take = (need - have).min(bytes.len());
                    self.header[have..have + take].copy_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    let have = have + take;
                    // The first two bytes tell how long the header is.
                    if have == header_len(&self.header[..have]) {
                        self.start_frame();
                    } else {
                        self.state = State::Header { have };
                    }
                }
                State::Payload { left, data, fin } => {
                    let take = left.min(bytes.len() as u64);
                    bytes = &bytes[take as usize..];
                    if data {
                        self.message = self.message.saturating_add(take);
                    }
                    self.state = State::Payload {
                        left: left - take,
                        data,
                        fin,
                    };
                    if left == take {
                        self.end_frame(data, fin);
                    }
                }
            }
        }
        self.message
    }

    /// A whole header has been read: its payload follows (or the frame is already over).
    fn start_frame(&mut self) {
        let h = &self.header;
        let fin = h[0] & 0x80 != 0;
        let data = h[0] & 0x0f < 0x8;
        let len = match h[1] & 0x7f {
            126 => u64::from(u16::from_be_bytes([h[2], h[3]])),
            127 => u64::from_be_bytes([h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]]),
            n => u64::from(n),
        };
        self.state = State::Payload {
            left: len,
            data,
            fin,
        };
        if len == 0 {
            self.end_frame(data, fin);
        }
    }

    fn end_frame(&mut self, data: bool, fin: bool) {
        if data && fin {
            // The message is whole: the relay takes it (and charges it) from here.
            self.message = 0;
        }
        self.state = State::Header { have: 0 };
    }
}

/// How long a frame header is, given its first bytes (2 until both length bytes are known).
fn header_len(first: &[u8]) -> usize {
    let Some(b1) = first.get(1) else {
        return 2;
    };
    let extended = match b1 & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if b1 & 0x80 != 0 { 4 } else { 0 };
    2 + extended + mask
}

/// A connection whose unfinished WebSocket message is charged to the buffer budget. Past the
/// budget one read fails with [`HeldOver`]; after it, what arrives is discarded.
pub struct Held<T> {
    inner: T,
    frames: Frames,
    charge: Charge,
    /// Once over the budget (the read that passed it failed), reads discard: the relay is
    /// closing the socket.
    over: Option<OverBudget>,
}

impl<T> Held<T> {
    pub fn new(inner: T, charge: Charge) -> Self {
        Self {
            inner,
            frames: Frames::default(),
            charge,
            over: None,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Held<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.over.is_some() {
            // The relay is closing the socket: what still comes is read and dropped, so the
            // connection ends with a FIN the client reads its close code before, not a reset.
            let mut scratch = [0u8; 8192];
            loop {
                let mut sink = ReadBuf::new(&mut scratch);
                ready!(Pin::new(&mut this.inner).poll_read(cx, &mut sink))?;
                if sink.filled().is_empty() {
                    return Poll::Ready(Ok(()));
                }
            }
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let held = this.frames.feed(&buf.filled()[before..]);
        let held = usize::try_from(held).unwrap_or(usize::MAX);
        if let Err(over) = this.charge.resize(held) {
            this.over = Some(over.clone());
            return Poll::Ready(Err(io::Error::other(HeldOver(over))));
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Held<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A frame as a client sends it (masked) or a server (not).
    fn frame(fin: bool, opcode: u8, payload: &[u8], masked: bool) -> Vec<u8> {
        let mut out = vec![(u8::from(fin) << 7) | opcode];
        let m = if masked { 0x80 } else { 0 };
        match payload.len() {
            n @ 0..=125 => out.push(m | n as u8),
            n @ 126..=65_535 => {
                out.push(m | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(m | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        if masked {
            out.extend_from_slice(&[1, 2, 3, 4]);
        }
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn an_unfinished_fragmented_message_is_held_until_its_last_fragment() {
        let mut f = Frames::default();
        assert_eq!(f.feed(&frame(false, 0x2, &[7; 300], true)), 300);
        // A ping between fragments holds nothing of the message.
        assert_eq!(f.feed(&frame(true, 0x9, b"hi", true)), 300);
        assert_eq!(f.feed(&frame(false, 0x0, &[7; 70_000], true)), 70_300);
        assert_eq!(f.feed(&frame(true, 0x0, &[7; 5], true)), 0);
        assert_eq!(f.feed(&frame(true, 0x1, b"whole", false)), 0);
    }

    #[test]
    fn a_large_frame_is_held_as_it_arrives() {
        let mut f = Frames::default();
        let big = frame(true, 0x2, &[1; 200_000], true);
        assert_eq!(f.feed(&big[..14 + 1000]), 1000);
        assert_eq!(f.feed(&big[14 + 1000..big.len() - 1]), 199_999);
        assert_eq!(f.feed(&big[big.len() - 1..]), 0);
    }

    proptest! {
        /// However the stream is split, the bytes held after each frame are the same.
        #[test]
        fn every_split_counts_the_same(
            frames in proptest::collection::vec((any::<bool>(), 0u8..3, prop_oneof![0usize..130, 65_530usize..65_540, Just(70_000usize)], any::<bool>()), 1..6),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let mut stream = Vec::new();
            let mut ends = Vec::new();
            let mut expected = Vec::new();
            let mut message = 0u64;
            for (fin, opcode, len, masked) in frames {
                stream.extend_from_slice(&frame(fin, opcode, &vec![0; len], masked));
                message += len as u64;
                if fin {
                    message = 0;
                }
                ends.push(stream.len());
                expected.push(message);
            }
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
            points.extend(&ends);
            points.sort_unstable();
            points.dedup();
            let mut f = Frames::default();
            let mut at = 0;
            let mut seen = Vec::new();
            for p in points {
                let held = f.feed(&stream[at..p]);
                if let Some(i) = ends.iter().position(|e| *e == p) {
                    seen.push((i, held));
                }
                at = p;
            }
            for (i, held) in seen {
                prop_assert_eq!(held, expected[i]);
            }
        }

        /// Any bytes at all: no panic, and what is held never passes what was fed.
        #[test]
        fn arbitrary_bytes_never_panic(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..16)) {
            let mut f = Frames::default();
            let mut fed = 0u64;
            for c in chunks {
                fed += c.len() as u64;
                prop_assert!(f.feed(&c) <= fed);
            }
        }
    }
}

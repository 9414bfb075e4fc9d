//! WebSocket through the interception: the handshake is an ordinary request (decided, brokered,
//! audited like any GET), and what follows is relayed message by message, never as raw bytes.
//!
//! - [`requested`]: whether a request asks to upgrade to a WebSocket (the decide phase asks
//!   the policy with it: only a rule with `websocket = true` allows one);
//! - [`Handshake::take`]: the sandbox's handshake checked (RFC 6455 §4.1) and its half of the
//!   upgrade taken before hyper's request is consumed;
//! - [`Handshake::restore`]: after hop-by-hop stripping, the upgrade headers put back on the
//!   upstream request, with `Sec-WebSocket-Extensions` left out so no extension
//!   (`permessage-deflate`) is negotiated: every message stays readable;
//! - [`Handshake::accept`]: the upstream's `101` checked (accept key, no extension, a protocol
//!   the sandbox offered) and the sandbox's `101` built from it;
//! - [`Relay`]: both upgraded streams, as tungstenite sockets; each text or binary message is
//!   reassembled whole (bounded by `--max-websocket-message`), checked for secret values and
//!   placeholders toward the upstream (placeholders replaced where the rule enables
//!   `placeholders = ["websocket"]`), scrubbed toward the sandbox, counted; the audit record is
//!   written when the socket closes. Each message toward the upstream is reserved against the
//!   socket's `bytes_up` budgets before it goes (`charge_up`: over them the socket closes
//!   `1008`, `budget_exhausted`); a message still arriving is held against the buffer budget
//!   ([`super::websocket_held`]: over it the socket closes `1013`, `too_busy`).
//!
//! Control frames are answered per hop (tungstenite replies to pings) and never forwarded, so
//! nothing the sandbox puts in a ping or a close reason reaches the upstream unchecked.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};
use tokio_tungstenite::WebSocketStream;

use super::body::FinishHook;
use super::budget::Budget;
use super::websocket_held::{is_held_over, Held};
use super::{mcp_socket, Generation};
use crate::audit::{Entry, WebSocketInfo};
use crate::governance::limits::Upload;
use crate::reason::{Reason, Refusal};
use crate::secrets::leak::{Binding, Checker};
use crate::secrets::placeholder::Place;
use crate::secrets::scrub::Scrubber;
use crate::secrets::{placeholder, SecretValue};

mod handshake;

pub use handshake::{requested, Halves, Handshake};

/// How long a closing handshake may take once one side has closed.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// What the relay checks messages toward the upstream against: the rule's binding, owned.
pub struct Guard {
    pub policy: Arc<Generation>,
    pub rule: String,
    pub bound: BTreeSet<String>,
    pub placeholders: Vec<Place>,
    pub host: String,
    /// The matcher for secret values toward the sandbox, when the host may reflect one.
    pub scan: Option<Arc<Scrubber>>,
    pub max_message: usize,
    pub budget: Arc<Budget>,
    pub client: IpAddr,
    /// The `bytes_up` budgets the socket is charged to: each message (and the close) is
    /// reserved before it goes upstream.
    pub upload: Option<Arc<Upload>>,
    /// The rule's `mcp`: every message is matched as JSON-RPC (`mcp_socket`).
    pub mcp: Option<mcp_socket::Rules>,
    /// The connection's switch: thrown when its session ends, closing the socket.
    pub cut: Option<Arc<crate::wire::cut::Cut>>,
}

/// Why the relay ended, for the record.
struct Ended {
    close_code: Option<u16>,
    closed_by: &'static str,
    refused: Option<Reason>,
}

/// Relays an accepted WebSocket in the background; the record is written when it ends.
///
/// Assumes: the `101` of [`Accepted`] is what the sandbox is being sent. Guarantees: whatever
/// happens (either side gone, a refused message, shutdown), the record is written exactly once
/// with the frames relayed and how the socket closed, after `on_finish` has run on it.
pub fn spawn(
    halves: Halves,
    guard: Guard,
    mut entry: Entry,
    on_finish: Option<FinishHook>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let Halves { sandbox, upstream } = halves;
    tokio::spawn(async move {
        let mut info = WebSocketInfo::default();
        let ended = match tokio::try_join!(sandbox, upstream) {
            Ok((s, u)) => relay(s, u, &guard, &mut entry, &mut info, shutdown).await,
            Err(e) => {
                tracing::warn!(audit.id = %entry.id(), error = %e, "WebSocket upgrade did not complete");
                Ended {
                    close_code: None,
                    closed_by: "latchkey",
                    refused: Some(Reason::UpstreamError),
                }
            }
        };
        info.close_code = ended.close_code;
        info.closed_by = ended.closed_by;
        entry.set_websocket(info);
        // A message latchkey would not forward (or a limit) ends the socket as a refusal.
        if let Some(reason) = ended.refused {
            entry.ended(reason);
        }
        if let Some(hook) = on_finish {
            hook(&mut entry);
        }
        entry.finish();
    });
}

/// A side's connection: its unfinished message is charged to the buffer budget as it arrives.
type Socket = WebSocketStream<Held<TokioIo<Upgraded>>>;

async fn relay(
    sandbox: Upgraded,
    upstream: Upgraded,
    guard: &Guard,
    entry: &mut Entry,
    info: &mut WebSocketInfo,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> Ended {
    let config = WebSocketConfig::default()
        .max_message_size(Some(guard.max_message))
        .max_frame_size(Some(guard.max_message));
    // Both sides' unfinished messages are held on the sandbox's behalf: its share.
    let held = |io| Held::new(TokioIo::new(io), guard.budget.start(guard.client));
    let mut sandbox: Socket =
        WebSocketStream::from_raw_socket(held(sandbox), Role::Server, Some(config)).await;
    let mut upstream: Socket =
        WebSocketStream::from_raw_socket(held(upstream), Role::Client, Some(config)).await;
    let counters = entry.counters();
    let mut used: BTreeSet<String> = BTreeSet::new();
    let mut mcp = guard.mcp.clone().map(mcp_socket::Socket::new);
    let ended = loop {
        tokio::select! {
            m = sandbox.next() => match m {
                Some(Ok(m)) => match mcp_then_up(mcp.as_mut(), m, entry, guard, &mut used).await {
                    Ok(Some(out)) => {
                        if let Err(refusal) = charge_up(guard, &out).await {
                            tracing::warn!(audit.id = %entry.id(), reason = refusal.reason.code(), message = %entry.scrub_text(&refusal.message), "WebSocket message refused");
                            let code = close_code_for(refusal.reason);
                            break refuse(&mut sandbox, &mut upstream, refusal.reason, code).await;
                        }
                        counters.up.fetch_add(payload_len(&out) as u64, Ordering::Relaxed);
                        info.frames_up += 1;
                        if upstream.send(out).await.is_err() {
                            break gone("upstream", &mut sandbox, None).await;
                        }
                    }
                    Ok(None) => {}
                    Err(Step::Close(frame)) => {
                        let code = frame.as_ref().map(|f| u16::from(f.code));
                        let frame = charge_close(guard, frame).await;
                        break closing(&mut upstream, &mut sandbox, frame, code, "sandbox").await;
                    }
                    Err(Step::Refuse(refusal)) => {
                        tracing::warn!(audit.id = %entry.id(), reason = refusal.reason.code(), message = %entry.scrub_text(&refusal.message), "WebSocket message refused");
                        let code = close_code_for(refusal.reason);
                        break refuse(&mut sandbox, &mut upstream, refusal.reason, code).await;
                    }
                    // A refused JSON-RPC call: answered on the socket, nothing goes upstream.
                    Err(Step::Answer(reply)) => {
                        if let Some(reply) = reply {
                            if sandbox.send(reply).await.is_err() {
                                break gone("sandbox", &mut upstream, None).await;
                            }
                        }
                    }
                },
                Some(Err(e)) => break read_failed(e, "sandbox", &mut sandbox, &mut upstream).await,
                None => break gone("sandbox", &mut upstream, None).await,
            },
            m = upstream.next() => match m {
                Some(Ok(m)) => match mcp_down(mcp.as_mut(), m).and_then(|m| down_message(m, guard, &counters)) {
                    Ok(Some(out)) => {
                        counters.down.fetch_add(payload_len(&out) as u64, Ordering::Relaxed);
                        info.frames_down += 1;
                        if sandbox.send(out).await.is_err() {
                            break gone("sandbox", &mut upstream, None).await;
                        }
                    }
                    Ok(None) => {}
                    Err(Step::Close(frame)) => {
                        let code = frame.as_ref().map(|f| u16::from(f.code));
                        let frame = frame.map(|f| scrub_close(f, guard.scan.as_deref()));
                        break closing(&mut sandbox, &mut upstream, frame, code, "upstream").await;
                    }
                    Err(Step::Refuse(refusal)) => {
                        break refuse(&mut sandbox, &mut upstream, refusal.reason, CloseCode::Error).await;
                    }
                    // Only the sandbox's messages are answered on their hop.
                    Err(Step::Answer(_)) => {}
                },
                Some(Err(e)) => break read_failed(e, "upstream", &mut sandbox, &mut upstream).await,
                None => break gone("upstream", &mut sandbox, None).await,
            },
            () = cut_thrown(guard.cut.as_deref()) => break cut_close(&mut sandbox, &mut upstream).await,
            () = super::stopped(&mut shutdown) => {
                let frame = || Some(CloseFrame { code: CloseCode::Away, reason: Utf8Bytes::from_static("latchkey is shutting down") });
                let _ = tokio::time::timeout(CLOSE_WAIT, async {
                    let _ = sandbox.close(frame()).await;
                    let _ = upstream.close(frame()).await;
                }).await;
                break Ended { close_code: Some(1001), closed_by: "latchkey", refused: None };
            }
        }
    };
    let ended = session_ended(ended, guard);
    if let Some(mcp) = mcp {
        mcp.record(entry);
    }
    if !used.is_empty() {
        entry.used_secrets(used);
    }
    ended
}

/// The session carrying the socket ended: a policy close (1008) both ways, bounded in time.
/// Its reason is filled in by [`session_ended`].
async fn cut_close(sandbox: &mut Socket, upstream: &mut Socket) -> Ended {
    let frame = || {
        Some(CloseFrame {
            code: CloseCode::Policy,
            reason: Utf8Bytes::from_static("latchkey: the session ended"),
        })
    };
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        let _ = sandbox.close(frame()).await;
        let _ = upstream.close(frame()).await;
    })
    .await;
    Ended {
        close_code: Some(1008),
        closed_by: "latchkey",
        refused: None,
    }
}

/// `ended`, saying so when the session carrying the socket ended: the relay may have stopped on
/// the cut IO before it saw the cut itself.
fn session_ended(mut ended: Ended, guard: &Guard) -> Ended {
    if ended.refused.is_none() {
        if let Some(why) = guard
            .cut
            .as_ref()
            .filter(|c| c.is_thrown())
            .and_then(|c| c.why())
        {
            ended.refused = Some(if why == Reason::SessionExpired.code() {
                Reason::SessionExpired
            } else {
                Reason::SessionRevoked
            });
            ended.closed_by = "latchkey";
        }
    }
    ended
}

/// Resolves when `cut` is thrown; never without one.
async fn cut_thrown(cut: Option<&crate::wire::cut::Cut>) {
    match cut {
        Some(cut) => cut.thrown().await,
        None => std::future::pending().await,
    }
}

/// A message from the sandbox: matched as JSON-RPC first under a rule with `mcp` (a refused
/// call is [`Step::Answer`]), then [`up_message`].
async fn mcp_then_up(
    mcp: Option<&mut mcp_socket::Socket>,
    m: Message,
    entry: &Entry,
    guard: &Guard,
    used: &mut BTreeSet<String>,
) -> Result<Option<Message>, Step> {
    let m = match mcp {
        None => m,
        Some(mcp) => match mcp.up(m, entry) {
            mcp_socket::Up::Forward(m) => m,
            mcp_socket::Up::Answered(reply) => return Err(Step::Answer(reply)),
            mcp_socket::Up::Refuse(refusal) => return Err(Step::Refuse(refusal)),
        },
    };
    up_message(m, guard, used).await
}

/// A message from the upstream, its `tools/list` results filtered under a rule with `mcp`.
fn mcp_down(mcp: Option<&mut mcp_socket::Socket>, m: Message) -> Result<Message, Step> {
    match mcp {
        Some(mcp) => mcp.down(m).map_err(Step::Refuse),
        None => Ok(m),
    }
}

/// What a message means for the relay besides being forwarded.
enum Step {
    Close(Option<CloseFrame>),
    Refuse(Refusal),
    /// Not forwarded: answered on this hop instead (`Some`: the answer), as MCP refusals are.
    Answer(Option<Message>),
}

/// A message from the sandbox as it goes upstream: checked, placeholders replaced. `None`:
/// nothing to forward (a ping or pong, answered on this hop).
async fn up_message(
    m: Message,
    guard: &Guard,
    used: &mut BTreeSet<String>,
) -> Result<Option<Message>, Step> {
    let (data, text) = match m {
        Message::Text(t) => (Bytes::from(t), true),
        Message::Binary(b) => (b, false),
        Message::Close(frame) => {
            // The close reason is the sandbox's text: it goes on only if it holds nothing.
            let frame = frame.map(|f| {
                if check(guard, f.reason.as_bytes()).is_ok_and(|n| n.is_empty()) {
                    f
                } else {
                    CloseFrame {
                        code: f.code,
                        reason: Utf8Bytes::default(),
                    }
                }
            });
            return Err(Step::Close(frame));
        }
        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => return Ok(None),
    };
    let mut held = guard.budget.start(guard.client);
    held.resize(data.len()).map_err(|e| {
        Step::Refuse(Refusal::new(
            Reason::TooBusy,
            format!("cannot hold a WebSocket message now: {e}"),
        ))
    })?;
    let names = check(guard, &data).map_err(Step::Refuse)?;
    if names.is_empty() {
        return Ok(Some(rebuild(data, text)?));
    }
    let store = guard.policy.secrets();
    let mut values: HashMap<String, SecretValue> = HashMap::with_capacity(names.len());
    for name in &names {
        let value = store.get(name).await.map_err(|e| {
            Step::Refuse(Refusal::new(
                Reason::SecretUnavailable,
                format!("secret '{name}' is unavailable: {e}"),
            ))
        })?;
        values.insert(name.clone(), value);
        used.insert(name.clone());
    }
    let replaced = placeholder::replace(&data, &values);
    Ok(Some(rebuild(Bytes::copy_from_slice(&replaced), text)?))
}

fn check(guard: &Guard, bytes: &[u8]) -> Result<BTreeSet<String>, Refusal> {
    let store = guard.policy.secrets();
    let scrubber = store.scrubber().map_err(|e| {
        Refusal::new(
            Reason::SecretUnavailable,
            format!("cannot search the message for secret values: {e}"),
        )
    })?;
    Checker {
        scrubber: scrubber.as_deref(),
        store,
        binding: Binding {
            rule: &guard.rule,
            bound: &guard.bound,
            placeholders: &guard.placeholders,
            captured: &BTreeSet::new(),
            withheld: &BTreeSet::new(),
        },
        host: &guard.host,
    }
    .message(bytes)
}

/// A text message stays text (it must still be UTF-8: a secret value that is not refuses it).
fn rebuild(data: Bytes, text: bool) -> Result<Message, Step> {
    if !text {
        return Ok(Message::Binary(data));
    }
    Utf8Bytes::try_from(data).map(Message::Text).map_err(|_| {
        Step::Refuse(Refusal::new(
            Reason::BadRequest,
            "a text message is not UTF-8 once its placeholders are replaced",
        ))
    })
}

/// A message from the upstream as the sandbox gets it: scrubbed when the host may reflect a
/// secret.
fn down_message(
    m: Message,
    guard: &Guard,
    counters: &crate::audit::Counters,
) -> Result<Option<Message>, Step> {
    let (data, text) = match m {
        Message::Text(t) => (Bytes::from(t), true),
        Message::Binary(b) => (b, false),
        Message::Close(frame) => return Err(Step::Close(frame)),
        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => return Ok(None),
    };
    let Some(scrubber) = guard.scan.as_deref() else {
        return Ok(Some(rebuild(data, text)?));
    };
    let (clean, names) = scrubber.scrub(&data);
    if names.is_empty() {
        return Ok(Some(rebuild(data, text)?));
    }
    counters
        .redactions
        .fetch_add(names.len() as u64, Ordering::Relaxed);
    // `[REDACTED:name]` is ASCII in place of whole matches: a text message stays UTF-8 unless
    // a secret value cut a character in two, which is refused rather than forwarded.
    rebuild(Bytes::from(clean), text).map(Some)
}

/// A close reason from the upstream, scrubbed like any message toward the sandbox.
fn scrub_close(f: CloseFrame, scan: Option<&Scrubber>) -> CloseFrame {
    let Some(scrubber) = scan else { return f };
    let (clean, names) = scrubber.scrub(f.reason.as_bytes());
    if names.is_empty() {
        return f;
    }
    CloseFrame {
        code: f.code,
        reason: Utf8Bytes::try_from(clean).unwrap_or_default(),
    }
}

/// The close code the sandbox gets for a message latchkey will not forward.
fn close_code_for(reason: Reason) -> CloseCode {
    match reason {
        Reason::TooBusy => CloseCode::Again,
        Reason::SecretUnavailable => CloseCode::Error,
        Reason::BadRequest => CloseCode::Invalid,
        _ => CloseCode::Policy,
    }
}

/// Reserves a message's bytes on the wire (frame header, mask and payload) against the
/// socket's `bytes_up` budgets before it goes upstream: `budget_exhausted` when they have no
/// room (the socket is then closed).
async fn charge_up(guard: &Guard, m: &Message) -> Result<(), Refusal> {
    let Some(upload) = &guard.upload else {
        return Ok(());
    };
    let len = wire_len(payload_len(m));
    if upload.fits(len) {
        upload.sent(len);
        return Ok(());
    }
    upload.send(len).await
}

/// The sandbox's close as it goes upstream, charged like a message; with no room left, a
/// bare close (no code, no reason: nothing of the sandbox's) goes instead.
async fn charge_close(guard: &Guard, frame: Option<CloseFrame>) -> Option<CloseFrame> {
    let Some(upload) = &guard.upload else {
        return frame;
    };
    let len = wire_len(frame.as_ref().map_or(0, |f| 2 + f.reason.len()));
    if upload.fits(len) {
        upload.sent(len);
        return frame;
    }
    upload.send(len).await.ok().and(frame)
}

/// A client frame's bytes on the wire for `payload` bytes: the 2-byte header, the extended
/// length, the 4-byte mask, the payload (latchkey sends each message as one frame).
fn wire_len(payload: usize) -> u64 {
    let extended = match payload {
        0..=125 => 0,
        126..=65_535 => 2,
        _ => 8,
    };
    (2 + extended + 4 + payload) as u64
}

fn payload_len(m: &Message) -> usize {
    match m {
        Message::Text(t) => t.len(),
        Message::Binary(b) => b.len(),
        _ => 0,
    }
}

/// One side closed: the close goes on to the other, and the closing handshakes finish
/// (bounded by [`CLOSE_WAIT`]).
async fn closing(
    to: &mut Socket,
    from: &mut Socket,
    frame: Option<CloseFrame>,
    code: Option<u16>,
    closed_by: &'static str,
) -> Ended {
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        let _ = to.close(frame).await;
        // Read to the end of both: tungstenite answers the close and waits for the reply.
        while let Some(Ok(_)) = to.next().await {}
        while let Some(Ok(_)) = from.next().await {}
    })
    .await;
    Ended {
        close_code: code,
        closed_by,
        refused: None,
    }
}

/// One side's connection ended without a closing handshake: the other is closed as "going away".
async fn gone(closed_by: &'static str, other: &mut Socket, code: Option<u16>) -> Ended {
    let frame = CloseFrame {
        code: CloseCode::Away,
        reason: Utf8Bytes::from_static("the other side went away"),
    };
    let _ = tokio::time::timeout(CLOSE_WAIT, other.close(Some(frame))).await;
    Ended {
        close_code: code,
        closed_by,
        refused: None,
    }
}

/// latchkey refuses to go on (a message it will not forward, a limit): both sides are closed,
/// the sandbox with `code` and the reason code as the close reason.
async fn refuse(
    sandbox: &mut Socket,
    upstream: &mut Socket,
    reason: Reason,
    code: CloseCode,
) -> Ended {
    let to_sandbox = CloseFrame {
        code,
        reason: Utf8Bytes::from(format!("latchkey: {}", reason.code())),
    };
    let to_upstream = CloseFrame {
        code: CloseCode::Away,
        reason: Utf8Bytes::default(),
    };
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        let _ = sandbox.close(Some(to_sandbox)).await;
        let _ = upstream.close(Some(to_upstream)).await;
    })
    .await;
    Ended {
        close_code: Some(u16::from(code)),
        closed_by: "latchkey",
        refused: Some(reason),
    }
}

/// A read failed: a message over `--max-websocket-message` (closed `1009`, `body_too_large`),
/// a protocol violation (`1002`), or the connection lost.
async fn read_failed(
    e: WsError,
    side: &'static str,
    sandbox: &mut Socket,
    upstream: &mut Socket,
) -> Ended {
    match e {
        WsError::Capacity(_) => {
            refuse(sandbox, upstream, Reason::BodyTooLarge, CloseCode::Size).await
        }
        // An unfinished message past the buffer budget: `1013`, try again later.
        WsError::Io(e) if is_held_over(&e) => {
            let ended = refuse(sandbox, upstream, Reason::TooBusy, CloseCode::Again).await;
            // Read (and drop) what that side still sends until it closes, so it gets the close.
            let other = if side == "sandbox" { sandbox } else { upstream };
            // (Below the WebSocket, which reads no more after the failed read: the connection
            // discards until the client closes it.)
            let _ = tokio::time::timeout(CLOSE_WAIT, async {
                use tokio::io::AsyncReadExt;
                let mut scratch = [0u8; 1];
                let _ = other.get_mut().read(&mut scratch).await;
            })
            .await;
            ended
        }
        WsError::Protocol(_) | WsError::Utf8(_) => {
            let reason = if side == "sandbox" {
                Reason::BadRequest
            } else {
                Reason::UpstreamError
            };
            refuse(sandbox, upstream, reason, CloseCode::Protocol).await
        }
        _ => {
            let other = if side == "sandbox" { upstream } else { sandbox };
            gone(side, other, None).await
        }
    }
}

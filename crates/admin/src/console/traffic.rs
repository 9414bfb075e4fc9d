//! The console's live traffic: `GET /ui/traffic/stream` is a server-sent event stream of the
//! audit log's outcome records as the writer commits them ([`audit::live`]), filtered on the
//! server by identity, session, profile, host, decision and reason; the page's script appends
//! each as a row. What it sends is the record as the log holds it: scrubbed when it was made, so
//! never a secret value.
//!
//! Bounded: at most [`MAX_WATCHERS`] streams at once (503 beyond), each a task feeding a
//! channel of [`QUEUE`] events to its connection; a watcher slower than the audit ring loses
//! the oldest records and is sent a `missed` event saying how many. A comment every
//! [`KEEPALIVE`] finds a closed connection and ends the task.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::mpsc;

use crate::audit::live::{Live, Seen};
use crate::audit::{Phase, Record};

/// Streams open at once, across every console user.
pub const MAX_WATCHERS: usize = 32;
/// Events queued for one connection before its task waits (and the audit ring absorbs).
const QUEUE: usize = 64;
/// How often an idle stream sends a comment line.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// How long one stream lives before it ends and the page reconnects (`retry: 3000`), which
/// asks the session again: a signed-out, expired or revoked session's stream stops within this.
const MAX_AGE: Duration = Duration::from_secs(300);
/// Longest filter value taken from the query string.
const MAX_VALUE: usize = 256;

/// Which records a watcher wants: every field given must match exactly.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Filter {
    pub identity: Option<String>,
    pub session: Option<String>,
    pub profile: Option<String>,
    pub host: Option<String>,
    pub decision: Option<String>,
    pub reason: Option<String>,
}

impl Filter {
    /// Reads `identity=…&session=…&profile=…&host=…&decision=…&reason=…`; an unknown key, a
    /// repeated key or an overlong value is an error naming it. Empty values mean "any".
    pub fn parse(query: &str) -> Result<Filter, String> {
        let mut f = Filter::default();
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            if value.len() > MAX_VALUE {
                return Err(format!("filter {key}: longer than {MAX_VALUE} bytes"));
            }
            let slot = match key.as_ref() {
                "identity" => &mut f.identity,
                "session" => &mut f.session,
                "profile" => &mut f.profile,
                "host" => &mut f.host,
                "decision" => &mut f.decision,
                "reason" => &mut f.reason,
                other => {
                    return Err(format!(
                    "unknown filter {other:?} (identity, session, profile, host, decision, reason)"
                ))
                }
            };
            if slot.is_some() {
                return Err(format!("filter {key} given twice"));
            }
            if !value.is_empty() {
                *slot = Some(value.into_owned());
            }
        }
        Ok(f)
    }

    /// Whether `r` is one this watcher wants.
    pub fn matches(&self, r: &Record) -> bool {
        fn is(want: &Option<String>, got: Option<&str>) -> bool {
            want.as_deref().is_none_or(|w| got == Some(w))
        }
        is(&self.identity, Some(&r.identity))
            && is(&self.session, r.session.as_deref())
            && is(&self.profile, r.profile.as_deref())
            && is(&self.host, r.host.as_deref())
            && is(&self.decision, Some(r.decision))
            && is(&self.reason, Some(r.reason))
    }
}

/// One record as an SSE `record` event: its JSON on one `data:` line (JSON never holds a raw
/// line break), the request id as the event id.
pub fn event(r: &Record) -> Option<Bytes> {
    let json = serde_json::to_string(r).ok()?;
    Some(Bytes::from(format!(
        "event: record\nid: {}\ndata: {json}\n\n",
        r.id.replace(['\r', '\n'], "")
    )))
}

/// The streams open now, for the [`MAX_WATCHERS`] bound.
#[derive(Default)]
pub struct Watchers {
    open: AtomicUsize,
}

/// A place among the open streams, given back when the stream's task ends.
struct Slot(Arc<Watchers>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Watchers {
    fn take(self: &Arc<Self>) -> Option<Slot> {
        let mut now = self.open.load(Ordering::Acquire);
        loop {
            if now >= MAX_WATCHERS {
                return None;
            }
            match self
                .open
                .compare_exchange(now, now + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(Slot(self.clone())),
                Err(seen) => now = seen,
            }
        }
    }
}

/// The body of one event stream: what its task sends, until either side ends.
pub struct Stream {
    rx: mpsc::Receiver<Bytes>,
}

impl HttpBody for Stream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|next| next.map(|b| Ok(Frame::data(b))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Starts a watcher for `filter`: `None` when [`MAX_WATCHERS`] streams are open already.
pub fn start(live: &Live, watchers: &Arc<Watchers>, filter: Filter) -> Option<Stream> {
    let slot = watchers.take()?;
    let mut watch = live.watch();
    let (tx, rx) = mpsc::channel::<Bytes>(QUEUE);
    tokio::spawn(async move {
        let _slot = slot;
        // Tells the page the stream is open (and retries after 3 s if it drops).
        if tx
            .send(Bytes::from_static(
                b"retry: 3000\nevent: open\ndata: {}\n\n",
            ))
            .await
            .is_err()
        {
            return;
        }
        let ends = tokio::time::Instant::now() + MAX_AGE;
        loop {
            if tokio::time::Instant::now() >= ends {
                return;
            }
            let next = tokio::time::timeout(KEEPALIVE, watch.next()).await;
            let frame = match next {
                Err(_) => Bytes::from_static(b": keepalive\n\n"),
                Ok(Seen::Closed) => return,
                Ok(Seen::Missed(n)) => {
                    Bytes::from(format!("event: missed\ndata: {{\"missed\":{n}}}\n\n"))
                }
                Ok(Seen::Record(r)) => {
                    if r.phase != Phase::Outcome || !filter.matches(&r) {
                        continue;
                    }
                    match event(&r) {
                        Some(e) => e,
                        None => continue,
                    }
                }
            };
            if tx.send(frame).await.is_err() {
                return;
            }
        }
    });
    Some(Stream { rx })
}

/// `/ui/traffic`: the filter form and the table the script fills from the stream. Without the
/// script the page still says where the stream is; the records themselves are in the log.
pub fn page(signed: &super::Signed, query: &str) -> http::Response<crate::Body> {
    use super::html::{self, esc};
    let filter = match Filter::parse(query) {
        Ok(f) => f,
        Err(why) => {
            return html::message(
                http::StatusCode::BAD_REQUEST,
                "Bad filter",
                &why,
                Some(signed),
                Some("/ui/traffic"),
            )
        }
    };
    let field = |name: &str, value: &Option<String>| {
        format!(
            "<label>{name} <input name=\"{name}\" value=\"{}\" size=\"14\"></label> ",
            esc(value.as_deref().unwrap_or_default())
        )
    };
    let mut body = String::from("<form method=\"get\" action=\"/ui/traffic\" class=\"filters\">");
    body.push_str(&field("identity", &filter.identity));
    body.push_str(&field("session", &filter.session));
    body.push_str(&field("profile", &filter.profile));
    body.push_str(&field("host", &filter.host));
    body.push_str(&field("decision", &filter.decision));
    body.push_str(&field("reason", &filter.reason));
    body.push_str("<button type=\"submit\">Filter</button></form>");
    // The stream's address carries the same filter; the script reads it from data-stream.
    let stream = if query.is_empty() {
        "/ui/traffic/stream".to_string()
    } else {
        format!("/ui/traffic/stream?{query}")
    };
    body.push_str(&format!(
        "<p id=\"traffic-state\" class=\"state\" data-stream=\"{}\">connecting to the live stream…</p>",
        esc(&stream)
    ));
    body.push_str(
        "<table id=\"traffic\" class=\"traffic\"><thead><tr><th>time</th><th>identity</th>\
<th>session</th><th>method</th><th>host</th><th>path</th><th>decision</th><th>reason</th>\
<th>status</th><th>rule</th></tr></thead><tbody></tbody></table>\
<p class=\"hint\">Newest first; click a row for the whole record and a link to explain it. \
The page shows requests from when it opened: <code>latchkey audit query</code> reads the log.</p>",
    );
    html::page(http::StatusCode::OK, "Live traffic", Some(signed), &body)
}

/// `/ui/traffic/stream`: the event stream for the filter in `query`.
pub fn stream_response(
    live: &Live,
    watchers: &Arc<Watchers>,
    signed: &super::Signed,
    query: &str,
) -> http::Response<crate::Body> {
    use http_body_util::BodyExt as _;
    let filter = match Filter::parse(query) {
        Ok(f) => f,
        Err(why) => {
            return super::html::message(
                http::StatusCode::BAD_REQUEST,
                "Bad filter",
                &why,
                Some(signed),
                None,
            )
        }
    };
    let Some(stream) = start(live, watchers, filter) else {
        return super::html::message(
            http::StatusCode::SERVICE_UNAVAILABLE,
            "Too many watchers",
            &format!("{MAX_WATCHERS} live streams are open already; close one and retry"),
            Some(signed),
            None,
        );
    };
    let mut res = http::Response::new(stream.boxed_unsync());
    let headers = res.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    res
}

/// `/ui/explain`: `/explain`'s answer for a request of the traffic page, as a table.
pub fn explain_page(
    proxy: &crate::proxy::Proxy,
    signed: &super::Signed,
    query: &str,
) -> http::Response<crate::Body> {
    let (status, value) = crate::explain_value(proxy, query);
    let body = super::html::fields(&value);
    super::html::page(status, "Explain", Some(signed), &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_read_strictly_and_match_exactly() {
        let f = Filter::parse("identity=agent&host=api.test&decision=&reason=no_rule")
            .expect("a filter");
        assert_eq!(f.identity.as_deref(), Some("agent"));
        assert_eq!(f.decision, None, "an empty value is any");
        for bad in [
            "who=x",
            "identity=a&identity=b",
            &format!("host={}", "a".repeat(300)),
        ] {
            assert!(Filter::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn slots_are_bounded_and_given_back() {
        let w = Arc::new(Watchers::default());
        let slots: Vec<Slot> = (0..MAX_WATCHERS)
            .map(|_| w.take().expect("a slot"))
            .collect();
        assert!(w.take().is_none());
        drop(slots);
        assert_eq!(w.open.load(Ordering::Acquire), 0);
        assert!(w.take().is_some());
    }
}

//! The one place that turns a refusal into what the sandbox sees, and writes its record.
//!
//! Every refused request ends here, whichever phase refused it: the pipeline, the CONNECT gate,
//! the proxy hop's identify step, and the connection-level answers hyper cannot give (over the
//! connection caps, a stalled header block). [`refuse`] builds the `http::Response`;
//! [`refuse_raw`] writes the same status, headers and sentence as HTTP/1.1 bytes for a socket
//! hyper does not (or no longer) serve. Both take their head from [`head`] and their HTTP/1
//! status line's reason phrase from [`reason_phrase`], so the two can never disagree on a header
//! or on what a client prints. It depends on `audit`, `reason` and `upstream`'s body type,
//! nothing that decides.
//!
//! The reason phrase is where the reason reaches a person: most clients discard the headers and
//! body of a refused CONNECT and print only the status line (`curl: (56) CONNECT tunnel failed,
//! response 403`), so an HTTP/1 refusal reads `403 Forbidden (latchkey: no_rule - no rule allows
//! api.example.com:443; see latchkey explain)`. HTTP/2 has no reason phrase: there the headers
//! and body carry it alone.

use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderMap, Response};

use super::body;
use crate::audit::Entry;
use crate::reason::{Reason, Refusal};
use crate::upstream::Body;

pub const DECISION_HEADER: &str = "x-latchkey-decision";
pub const RULE_HEADER: &str = "x-latchkey-rule";
pub const REASON_HEADER: &str = "x-latchkey-reason";
pub const ID_HEADER: &str = "x-latchkey-id";
/// On a request that waits for (or was refused by) a person: the approval's id.
pub const APPROVAL_HEADER: &str = "x-latchkey-approval";

/// The longest reason phrase latchkey writes, in bytes: room for the status's own phrase, the
/// code and a sentence, well under what any client buffers for a status line.
pub const PHRASE_MAX: usize = 200;

/// A refusal or failure: status from the reason, decision/rule/reason headers, and a plain-text
/// sentence. `message` must never contain a secret value: callers build it from names, hosts
/// and paths only.
pub fn refuse(reason: Reason, rule: Option<&str>, message: &str, id: &str) -> Response<Body> {
    let mut res = Response::new(body::full(sentence(reason, message)));
    *res.status_mut() = reason.status();
    *res.headers_mut() = head(reason, rule, id);
    // Written by hyper's HTTP/1 server in place of the canonical phrase; HTTP/2 ignores it.
    if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(reason_phrase(reason, message)) {
        res.extensions_mut().insert(phrase);
    }
    res
}

/// The same answer as [`refuse`], as the bytes of an HTTP/1.1 response that closes the
/// connection: for a socket hyper never served (over the connection caps) or has let go of (a
/// header block that stalled).
pub fn refuse_raw(reason: Reason, message: &str, id: &str) -> Vec<u8> {
    let text = sentence(reason, message);
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nconnection: close\r\n",
        reason.status().as_u16(),
        reason_phrase(reason, message)
    )
    .into_bytes();
    for (name, value) in &head(reason, None, id) {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("content-length: {}\r\n\r\n", text.len()).as_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

/// Ends a refused request: scrubs the message (a denial may quote a URL the sandbox pasted a
/// secret into), answers it and writes the record with the status the sandbox gets.
pub fn refused(mut entry: Entry, refusal: &Refusal) -> Response<Body> {
    let message = entry.scrub_text(&refusal.message);
    let rule = refusal.rule.as_deref();
    let mut res = refuse(refusal.reason, rule, &message, entry.id());
    if let Some(a) = entry.approval() {
        if let Ok(v) = HeaderValue::from_str(&a.id) {
            res.headers_mut().insert(APPROVAL_HEADER, v);
        }
    }
    if let Some(secs) = entry.retry_after() {
        res.headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    }
    rate_headers(res.headers_mut(), &entry);
    entry.outcome(refusal.reason, rule, Some(res.status().as_u16()));
    entry.finish();
    res
}

/// `x-ratelimit-limit`, `x-ratelimit-remaining` and `x-ratelimit-reset` (seconds until the
/// bucket is full), when a `[limits]` request rate was charged.
pub fn rate_headers(headers: &mut http::HeaderMap, entry: &Entry) {
    if let Some((limit, remaining, reset)) = entry.rate_headers() {
        headers.insert("x-ratelimit-limit", HeaderValue::from(limit));
        headers.insert("x-ratelimit-remaining", HeaderValue::from(remaining));
        headers.insert("x-ratelimit-reset", HeaderValue::from(reset));
    }
}

/// [`refused`] for a connection hyper does not serve: the record is written, and the bytes to
/// send (after which the connection closes) are returned.
pub fn refused_raw(mut entry: Entry, refusal: &Refusal) -> Vec<u8> {
    let message = entry.scrub_text(&refusal.message);
    let bytes = refuse_raw(refusal.reason, &message, entry.id());
    let rule = refusal.rule.as_deref();
    entry.outcome(refusal.reason, rule, Some(refusal.reason.status().as_u16()));
    entry.finish();
    bytes
}

/// Records a request hyper already answered (a head it could not parse) or that was never
/// answered: the outcome under the reason's status, no rule.
pub fn recorded(mut entry: Entry, reason: Reason) {
    entry.outcome(reason, None, Some(reason.status().as_u16()));
    entry.finish();
}

/// The reason phrase of a refusal's HTTP/1 status line: the status's own phrase, then
/// latchkey's code and `message`, e.g. `Forbidden (latchkey: no_rule - no rule allows
/// api.example.com:443; see latchkey explain)`; the hint only on a policy denial, the one kind
/// `explain` answers.
///
/// `message` must already be scrubbed (as [`refused`] does): the phrase carries nothing the
/// body does not. It is made fit for a status line (RFC 9112 allows HTAB, SP, visible ASCII and
/// obs-text; latchkey writes no obs-text, which clients decode differently): a line break or
/// other control character becomes a space, an em or en dash `-`, any other non-ASCII
/// character `?`. At most [`PHRASE_MAX`] bytes: the sentence is cut (marked `...`), never the
/// status phrase, the code or the closing parenthesis.
pub fn reason_phrase(reason: Reason, message: &str) -> String {
    let status = reason.status().canonical_reason().unwrap_or("Error");
    let code = reason.code();
    let hint = if reason.is_policy_denial() {
        "; see latchkey explain"
    } else {
        ""
    };
    let frame = status.len() + " (latchkey: ".len() + code.len() + " - ".len() + hint.len() + 1;
    let room = PHRASE_MAX.saturating_sub(frame);
    let mut text: String = message.trim().chars().map(phrase_char).collect();
    if text.len() > room {
        // Every character is ASCII now, so any byte index is a boundary.
        text.truncate(room.saturating_sub(3));
        text.push_str("...");
    }
    if text.is_empty() {
        format!("{status} (latchkey: {code}{hint})")
    } else {
        format!("{status} (latchkey: {code} - {text}{hint})")
    }
}

/// One character of a message as it may stand in a status line: see [`reason_phrase`].
fn phrase_char(c: char) -> char {
    match c {
        ' ' | '\t' | '!'..='~' => c,
        '\u{2012}'..='\u{2015}' | '\u{2212}' => '-',
        c if c.is_whitespace() || c.is_control() => ' ',
        _ => '?',
    }
}

/// `latchkey: denied: … (reason: CODE)` (or `upstream error: …` after policy allowed the
/// request). The code ends the sentence because clients that print a refused response's body
/// (the openai SDK's error for a plain-HTTP refusal) print nothing else of it.
fn sentence(reason: Reason, message: &str) -> String {
    let prefix = if reason.is_allow() {
        "upstream error"
    } else {
        "denied"
    };
    format!(
        "latchkey: {prefix}: {message} (reason: {})\n",
        reason.code()
    )
}

/// The headers of every refusal: latchkey's decision, rule and reason, the record's id, a
/// plain-text body that is never cached, and what the reason asks of the client (credentials
/// for `407`, a retry for the connection caps).
fn head(reason: Reason, rule: Option<&str>, id: &str) -> HeaderMap {
    let decision = if reason.is_allow() { "allow" } else { "deny" };
    let mut h = HeaderMap::with_capacity(8);
    h.insert(DECISION_HEADER, HeaderValue::from_static(decision));
    h.insert(
        RULE_HEADER,
        rule.and_then(|r| HeaderValue::from_str(r).ok())
            .unwrap_or(HeaderValue::from_static("none")),
    );
    h.insert(REASON_HEADER, HeaderValue::from_static(reason.code()));
    if let Ok(v) = HeaderValue::from_str(id) {
        h.insert(ID_HEADER, v);
    }
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    match reason {
        Reason::ProxyAuthRequired | Reason::SessionRevoked | Reason::SessionExpired => {
            h.insert(
                http::header::PROXY_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"latchkey\", charset=\"UTF-8\""),
            );
        }
        Reason::TooManyConnections => {
            h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        _ => {}
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_refusal_carries_the_same_status_headers_and_sentence_as_a_response() {
        let raw = refuse_raw(Reason::TooManyConnections, "too many", "id-1");
        let text = String::from_utf8(raw).expect("ascii");
        let (head_text, body_text) = text.split_once("\r\n\r\n").expect("a head");
        let mut lines = head_text.lines();
        assert_eq!(
            lines.next(),
            Some("HTTP/1.1 503 Service Unavailable (latchkey: too_many_connections - too many)")
        );
        let headers: Vec<&str> = lines.collect();
        let res = refuse(Reason::TooManyConnections, None, "too many", "id-1");
        for (name, value) in res.headers() {
            let line = format!("{}: {}", name, value.to_str().expect("ascii"));
            assert!(headers.contains(&line.as_str()), "{line} in {headers:?}");
        }
        assert!(headers.contains(&"connection: close"));
        assert!(headers.contains(&"retry-after: 1"));
        assert!(headers.contains(&"x-latchkey-rule: none"));
        assert_eq!(
            body_text,
            "latchkey: denied: too many (reason: too_many_connections)\n"
        );
        let length = format!("content-length: {}", body_text.len());
        assert!(headers.contains(&length.as_str()));
    }

    #[test]
    fn an_upstream_failure_says_so_and_keeps_the_rule() {
        let res = refuse(Reason::UpstreamTimeout, Some("api"), "slow", "id-2");
        assert_eq!(res.status(), http::StatusCode::GATEWAY_TIMEOUT);
        let h = res.headers();
        assert_eq!(h[DECISION_HEADER], "allow");
        assert_eq!(h[RULE_HEADER], "api");
        assert_eq!(h[REASON_HEADER], "upstream_timeout");
        assert_eq!(h[ID_HEADER], "id-2");
        assert!(!h.contains_key(http::header::RETRY_AFTER));
        assert_eq!(
            sentence(Reason::UpstreamTimeout, "slow"),
            "latchkey: upstream error: slow (reason: upstream_timeout)\n"
        );
    }

    #[test]
    fn a_policy_denial_names_its_code_and_sentence_in_the_status_line_and_points_to_explain() {
        let message = "no rule allows api.example.com:443";
        let res = refuse(Reason::NoRule, None, message, "id-3");
        let phrase = res
            .extensions()
            .get::<hyper::ext::ReasonPhrase>()
            .expect("a reason phrase");
        assert_eq!(
            phrase.as_bytes(),
            b"Forbidden (latchkey: no_rule - no rule allows api.example.com:443; see latchkey explain)"
        );
        let raw = String::from_utf8(refuse_raw(Reason::NoRule, message, "id-3")).expect("ascii");
        let status_line = raw.lines().next().expect("a status line");
        assert_eq!(
            status_line.as_bytes(),
            [b"HTTP/1.1 403 ".as_slice(), phrase.as_bytes()].concat(),
            "the raw answer and hyper's say the same"
        );
        // Not a policy denial: explain cannot say more, so the phrase does not send anyone there.
        assert_eq!(
            reason_phrase(Reason::UpstreamTimeout, "api.example.com did not answer"),
            "Gateway Timeout (latchkey: upstream_timeout - api.example.com did not answer)"
        );
        assert_eq!(
            reason_phrase(Reason::TooBusy, "  "),
            "Service Unavailable (latchkey: too_busy)"
        );
    }

    #[test]
    fn a_phrase_holds_no_line_break_no_non_ascii_and_is_cut_before_its_code_is() {
        let message = format!(
            "first\r\nHTTP/1.1 200 OK\r\nx: y \u{2014} caf\u{e9}\u{0}{}",
            "z".repeat(400)
        );
        let phrase = reason_phrase(Reason::PathNotAllowed, &message);
        assert!(phrase.len() <= PHRASE_MAX, "{} bytes", phrase.len());
        assert!(
            phrase.starts_with(
                "Forbidden (latchkey: path_not_allowed - first  HTTP/1.1 200 OK  x: y - caf? "
            ),
            "{phrase}"
        );
        assert!(phrase.ends_with("...; see latchkey explain)"), "{phrase}");
        assert!(hyper::ext::ReasonPhrase::try_from(phrase.as_bytes()).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn every_phrase_is_a_bounded_status_line_phrase_with_its_code(
            message in proptest::prelude::any::<String>(),
            i in 0..Reason::ALL.len(),
        ) {
            let reason = Reason::ALL[i];
            let phrase = reason_phrase(reason, &message);
            proptest::prop_assert!(phrase.len() <= PHRASE_MAX);
            proptest::prop_assert!(phrase
                .bytes()
                .all(|b| b == b'\t' || b == b' ' || (0x21..=0x7e).contains(&b)));
            let code = format!("(latchkey: {}", reason.code());
            proptest::prop_assert!(phrase.contains(&code));
            proptest::prop_assert!(phrase.ends_with(')'));
        }
    }
}

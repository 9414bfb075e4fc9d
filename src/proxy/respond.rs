//! The one place that turns a reason into the response the sandbox sees.

use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::Response;

use super::body;
use crate::reason::Reason;
use crate::upstream::Body;

pub const DECISION_HEADER: &str = "x-latchkey-decision";
pub const RULE_HEADER: &str = "x-latchkey-rule";
pub const REASON_HEADER: &str = "x-latchkey-reason";
pub const ID_HEADER: &str = "x-latchkey-id";

/// A refusal or failure: status from the reason, decision/rule/reason headers, and a plain-text
/// sentence. `message` must never contain a secret value: callers build it from names, hosts
/// and paths only.
pub fn refuse(reason: Reason, rule: Option<&str>, message: &str, id: &str) -> Response<Body> {
    let (decision, prefix) = if reason.is_allow() {
        ("allow", "upstream error")
    } else {
        ("deny", "denied")
    };
    let text = format!("latchkey: {prefix}: {message}\n");
    let mut res = Response::new(body::full(text));
    *res.status_mut() = reason.status();
    let h = res.headers_mut();
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
    if reason == Reason::ProxyAuthRequired {
        h.insert(
            http::header::PROXY_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"latchkey\", charset=\"UTF-8\""),
        );
    }
    res
}

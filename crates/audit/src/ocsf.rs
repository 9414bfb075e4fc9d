//! OCSF export (`--audit-format ocsf`): each audit record written as one event of the Open
//! Cybersecurity Schema Framework, version [`OCSF_VERSION`], so a SIEM reads latchkey's log
//! without a custom parser. The writer frames each event exactly like a JSON-lines record (the
//! hash chain's `seq` and `prev` go in front of its first field), so `latchkey audit verify`
//! checks an OCSF log the same way.
//!
//! Which class a record becomes:
//!
//! | record                                                | OCSF class                 | activity            |
//! |-------------------------------------------------------|----------------------------|---------------------|
//! | an HTTP request (any method), an allowed CONNECT      | HTTP Activity (4002)       | by method; other: 99 |
//! | a refused CONNECT, a connection with no request       | Network Activity (4001)    | Refuse (5), allowed: Traffic (6) |
//! | a DNS query to latchkey's resolver (`method = "DNS"`)  | DNS Activity (4003)        | Traffic (6), unanswered: Query (1) |
//!
//! An approval's answer (`method = "APPROVAL"`) is HTTP Activity "Other" about the request it
//! answered; a method OCSF does not enumerate is activity Other, named by the method, which is
//! also `unmapped.method`. Profiles used: `host` (`actor`), `security_control` (`action`, `disposition`,
//! `firewall_rule`, `policy`), on HTTP Activity carrying a trace id `trace`, and on a redirected
//! connection's events `network_proxy` (`proxy_endpoint`); each event lists them in
//! `metadata.profiles`.
//!
//! The mapping, field by field: `time` is `ts` in epoch milliseconds, `start_time`/`end_time`/
//! `duration` come from `duration_ms` (outcomes only); `metadata.uid` is the record's `id` (its
//! decision record's event adds `.decision`, so every event's uid is its own) and
//! `metadata.correlation_uid` the `id` alone, linking a request's two events; `actor.user` is the
//! identity (`actor.session.uid` the sandbox's session) and `metadata.labels` its labels as
//! `key=value`; `src_endpoint` is the client, `dst_endpoint` the host and the address dialed
//! (`upstream`: no address when nothing was dialed); on a connection the firewall redirected
//! to latchkey, `proxy_endpoint` is latchkey as the client reached it, at the address the client
//! sent it to (`original_dst`: where it was going, which latchkey may never have contacted);
//! `http_request.url` the target (query values redacted, as in the record); `http_response.code`
//! the status once known; `traffic.bytes_out`/`bytes_in` the bytes up/down. `action`
//! (Allowed/Denied) and `disposition` (Allowed, Blocked, or Detected for a request report-only
//! mode let through) say what latchkey did; `status` is Unknown on a decision record, Success on
//! an outcome that was allowed and answered below 500, Failure otherwise, with the reason code as
//! `status_code`. `severity` is Informational for allowed traffic, Low for a denial, Low too for
//! what report-only mode would have denied, and Medium for denials that stopped a secret or a
//! spoofed destination.
//!
//! Everything latchkey records that OCSF has no attribute for — the rule, reason, secret names,
//! policy digest, phase, limits, usage, websocket, mcp, reach, session/step/attempt, report-only verdict,
//! redactions, approval, labels — is also under `unmapped` with latchkey's own field names, so
//! nothing in the record is lost. Secret *names* only: the record holds no values.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::record::{ApprovalInfo, DnsInfo, LimitCharge, UsageInfo};
use super::{Phase, Record};
use crate::wire::host::{display_authority, Bracketed};

/// The OCSF schema version events follow (the latest 1.x published schema, checked by the
/// tests against its export).
pub const OCSF_VERSION: &str = "1.8.0";

/// Writes `record` as one OCSF event object (no newline).
pub(super) fn write_event(record: &Record, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    serde_json::to_writer(out, &event(record))
}

/// The class a record maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Http,
    Network,
    Dns,
}

impl Class {
    fn of(r: &Record) -> Class {
        match r.method.as_deref() {
            Some("DNS") if r.dns.is_some() => Class::Dns,
            None => Class::Network,
            Some("CONNECT") if r.decision != "allow" => Class::Network,
            Some(_) => Class::Http,
        }
    }

    fn uid(self) -> u32 {
        match self {
            Class::Network => 4001,
            Class::Http => 4002,
            Class::Dns => 4003,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Class::Network => "Network Activity",
            Class::Http => "HTTP Activity",
            Class::Dns => "DNS Activity",
        }
    }
}

/// Category 4, "Network Activity", holds all three classes.
const CATEGORY_UID: u32 = 4;
const CATEGORY_NAME: &str = "Network Activity";

/// HTTP Activity's activity for an HTTP method (RFC 9110 methods are case-sensitive: `get` is
/// not `GET`, and is "Other").
fn http_activity(method: &str) -> (u32, &'static str) {
    match method {
        "CONNECT" => (1, "Connect"),
        "DELETE" => (2, "Delete"),
        "GET" => (3, "Get"),
        "HEAD" => (4, "Head"),
        "OPTIONS" => (5, "Options"),
        "POST" => (6, "Post"),
        "PUT" => (7, "Put"),
        "TRACE" => (8, "Trace"),
        "PATCH" => (9, "Patch"),
        _ => (99, "Other"),
    }
}

/// Denials that stopped something worse than a path the policy does not cover: a secret going
/// where it is not bound, or a request to a destination other than the one it claimed.
fn is_serious(reason: &str) -> bool {
    matches!(
        reason,
        "secret_value_unbound"
            | "placeholder_not_bound"
            | "host_mismatch"
            | "sni_mismatch"
            | "destination_mismatch"
            | "non_public_address"
    )
}

#[derive(Serialize)]
struct Event<'a> {
    class_uid: u32,
    class_name: &'static str,
    category_uid: u32,
    category_name: &'static str,
    activity_id: u32,
    activity_name: Cow<'a, str>,
    type_uid: u32,
    type_name: String,
    time: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    start_time: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    end_time: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration: Option<u64>,
    severity_id: u32,
    severity: &'static str,
    status_id: u32,
    status: &'static str,
    status_code: &'a str,
    action_id: u32,
    action: &'static str,
    disposition_id: u32,
    disposition: &'static str,
    message: String,
    metadata: Metadata<'a>,
    actor: Actor<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    src_endpoint: Option<Endpoint<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dst_endpoint: Option<Endpoint<'a>>,
    /// Profile `network_proxy`: latchkey, at the address a redirected client sent its
    /// connection to.
    #[serde(skip_serializing_if = "Option::is_none")]
    proxy_endpoint: Option<Endpoint<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    http_request: Option<HttpRequest<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    http_response: Option<HttpResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    query: Option<DnsQuery<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    answers: Vec<DnsAnswer<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rcode_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rcode: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    traffic: Option<Traffic>,
    #[serde(skip_serializing_if = "Option::is_none")]
    firewall_rule: Option<Named<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<PolicyRef<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace: Option<Trace<'a>>,
    unmapped: Unmapped<'a>,
}

#[derive(Serialize)]
struct Metadata<'a> {
    version: &'static str,
    product: Product,
    uid: Cow<'a, str>,
    correlation_uid: &'a str,
    log_name: &'static str,
    profiles: Vec<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    labels: Vec<String>,
}

#[derive(Serialize)]
struct Product {
    name: &'static str,
    vendor_name: &'static str,
    version: &'static str,
}

#[derive(Serialize)]
struct Actor<'a> {
    user: User<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<Session<'a>>,
}

#[derive(Serialize)]
struct User<'a> {
    name: &'a str,
    uid: &'a str,
}

#[derive(Serialize)]
struct Session<'a> {
    uid: &'a str,
}

/// A network endpoint: an address when there is one, else a name.
#[derive(Serialize, Default)]
struct Endpoint<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    hostname: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    port: Option<u16>,
}

#[derive(Serialize)]
struct HttpRequest<'a> {
    /// One of the methods OCSF enumerates; any other is the activity's name (Other) and
    /// `unmapped.method`.
    #[serde(skip_serializing_if = "Option::is_none")]
    http_method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<Url<'a>>,
}

#[derive(Serialize)]
struct Url<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    scheme: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hostname: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    query_string: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url_string: Option<String>,
}

#[derive(Serialize)]
struct HttpResponse {
    code: u16,
}

#[derive(Serialize)]
struct DnsQuery<'a> {
    hostname: &'a str,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    qtype: Option<&'a str>,
}

#[derive(Serialize)]
struct DnsAnswer<'a> {
    rdata: &'a str,
    #[serde(rename = "type")]
    rtype: &'static str,
}

#[derive(Serialize)]
struct Traffic {
    bytes_in: u64,
    bytes_out: u64,
    bytes: u64,
}

#[derive(Serialize)]
struct Named<'a> {
    name: &'a str,
}

#[derive(Serialize)]
struct PolicyRef<'a> {
    uid: &'a str,
    name: &'static str,
}

#[derive(Serialize)]
struct Trace<'a> {
    uid: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    span: Option<Span<'a>>,
}

#[derive(Serialize)]
struct Span<'a> {
    uid: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_uid: Option<&'a str>,
    operation: String,
    start_time: u64,
    end_time: u64,
    duration: u64,
}

/// latchkey's own fields, under their own names.
#[derive(Serialize)]
struct Unmapped<'a> {
    phase: Phase,
    decision: &'a str,
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    rule: Option<&'a str>,
    /// A method OCSF has no value for (`PROPFIND`, `APPROVAL`).
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'a str>,
    secrets: &'a [String],
    policy: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reach: Option<&'a str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
    would_deny: bool,
    redactions: u64,
    #[serde(skip_serializing_if = "<[LimitCharge]>::is_empty")]
    limits: &'a [LimitCharge],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<&'a UsageInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    websocket: Option<&'a super::record::WebSocketInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mcp: Option<&'a super::record::McpInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    approval: Option<&'a ApprovalInfo>,
    /// A DNS record's transport and how many queries it stands for.
    #[serde(skip_serializing_if = "Option::is_none")]
    dns_transport: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dns_queries: Option<u64>,
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `ip:port` as an endpoint with an address; anything else as a name.
fn endpoint_of(addr: &str) -> Option<Endpoint<'_>> {
    if addr.is_empty() {
        return None;
    }
    Some(match addr.parse::<SocketAddr>() {
        Ok(a) => Endpoint {
            ip: Some(a.ip().to_string()),
            port: Some(a.port()),
            ..Endpoint::default()
        },
        Err(_) => Endpoint {
            name: Some(addr),
            ..Endpoint::default()
        },
    })
}

/// Where the request went: its host and port, and the address dialed when there was one.
fn destination(r: &Record) -> Option<Endpoint<'_>> {
    let dialed = r
        .upstream
        .as_deref()
        .and_then(|u| u.parse::<SocketAddr>().ok());
    let host = r.host.as_deref().filter(|h| !h.is_empty());
    if host.is_none() && dialed.is_none() {
        return None;
    }
    Some(Endpoint {
        hostname: host,
        name: None,
        ip: dialed.map(|a| a.ip().to_string()),
        port: dialed.map(|a| a.port()).or(r.port),
    })
}

/// latchkey as a redirected client reached it: a transparent interception answers at the
/// address the client sent the connection to (the record's `original_dst`).
fn interception(r: &Record) -> Option<Endpoint<'_>> {
    let original = r.original_dst.as_deref()?.parse::<SocketAddr>().ok()?;
    Some(Endpoint {
        name: Some("latchkey"),
        ip: Some(original.ip().to_string()),
        port: Some(original.port()),
        ..Endpoint::default()
    })
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "https" => Some(443),
        "http" => Some(80),
        _ => None,
    }
}

/// The request's URL: for CONNECT its authority (`host:port`), for a request the absolute URL
/// (the port only when it is not the scheme's default).
fn url_of(r: &Record) -> Option<Url<'_>> {
    let host = r.host.as_deref().filter(|h| !h.is_empty());
    let (path, query) = match r.path.as_deref() {
        Some(p) => match p.split_once('?') {
            Some((path, query)) => (Some(path), Some(query)),
            None => (Some(p), None),
        },
        None => (None, None),
    };
    let scheme = r.scheme.as_deref();
    let url_string = host.map(|h| {
        if r.method.as_deref() == Some("CONNECT") {
            return match r.port {
                Some(p) => display_authority(h, p),
                None => Bracketed(h).to_string(),
            };
        }
        let mut s = String::new();
        if let Some(scheme) = scheme {
            s.push_str(scheme);
            s.push_str("://");
        }
        s.push_str(&Bracketed(h).to_string());
        if let Some(p) = r.port.filter(|p| Some(*p) != scheme.and_then(default_port)) {
            s.push(':');
            s.push_str(&p.to_string());
        }
        s.push_str(r.path.as_deref().unwrap_or(""));
        s
    });
    if url_string.is_none() && path.is_none() {
        return None;
    }
    Some(Url {
        scheme,
        hostname: host,
        port: r.port,
        path: path.filter(|p| !p.is_empty()),
        query_string: query.filter(|q| !q.is_empty()),
        url_string,
    })
}

/// What `message` says: `allow GET https://host/path (rule r)`, `deny CONNECT host:443:
/// no_rule`.
fn message(r: &Record, url: Option<&Url<'_>>) -> String {
    let method = r.method.as_deref().unwrap_or("connection");
    let target = url
        .and_then(|u| u.url_string.as_deref())
        .or(r.host.as_deref())
        .unwrap_or("(no target)");
    let mut m = format!("{} {method} {target}", r.decision);
    if r.decision != "allow" || r.would_deny || r.reason != "allowed" {
        m.push_str(": ");
        m.push_str(r.reason);
    }
    if let Some(rule) = &r.rule {
        m.push_str(" (rule ");
        m.push_str(rule);
        m.push(')');
    }
    m
}

fn rcode(code: &str) -> (u32, &'static str) {
    match code {
        "NOERROR" => (0, "NoError"),
        "FORMERR" => (1, "FormError"),
        "SERVFAIL" => (2, "ServError"),
        "NXDOMAIN" => (3, "NXDomain"),
        "NOTIMP" => (4, "NotImp"),
        "REFUSED" => (5, "Refused"),
        _ => (99, "Other"),
    }
}

fn event(r: &Record) -> Event<'_> {
    let class = Class::of(r);
    let outcome = r.phase == Phase::Outcome;
    let allowed = r.decision == "allow";
    let method = r.method.as_deref().unwrap_or("");
    let (activity_id, activity_name) = activity(class, r, allowed, method);
    let time = epoch_ms(r.ts);
    let end = time.saturating_add(r.duration_ms);
    let (severity_id, severity) = if allowed && !r.would_deny {
        (1, "Informational")
    } else if !allowed && is_serious(r.reason) {
        (3, "Medium")
    } else {
        (2, "Low")
    };
    let succeeded =
        allowed && matches!(r.reason, "allowed" | "tunnel") && r.status.is_none_or(|s| s < 500);
    let (status_id, status) = match (outcome, succeeded) {
        (false, _) => (0, "Unknown"),
        (true, true) => (1, "Success"),
        (true, false) => (2, "Failure"),
    };
    let (action_id, action, disposition_id, disposition) = match (allowed, r.would_deny) {
        (true, false) => (1, "Allowed", 1, "Allowed"),
        (true, true) => (1, "Allowed", 15, "Detected"),
        (false, _) => (2, "Denied", 2, "Blocked"),
    };
    let trace = trace_of(r, class, method, (time, end));
    let mut profiles = vec!["host", "security_control"];
    if trace.is_some() {
        profiles.push("trace");
    }
    let proxy_endpoint = interception(r).filter(|_| class != Class::Dns);
    if proxy_endpoint.is_some() {
        profiles.push("network_proxy");
    }
    let url = (class == Class::Http).then(|| url_of(r)).flatten();
    let message = message(r, url.as_ref());
    let standard = http_activity(method).0 != 99;
    let http_request = (class == Class::Http).then(|| HttpRequest {
        http_method: standard.then_some(method),
        url,
    });
    let dns = r.dns.as_ref().filter(|_| class == Class::Dns);
    let (rcode_id, rcode_name) = match dns.and_then(|d| d.rcode).map(rcode) {
        Some((id, name)) => (Some(id), Some(name)),
        None => (None, None),
    };
    Event {
        class_uid: class.uid(),
        class_name: class.name(),
        category_uid: CATEGORY_UID,
        category_name: CATEGORY_NAME,
        activity_id,
        type_uid: class.uid() * 100 + activity_id,
        type_name: match activity_id {
            99 => format!("{}: Other", class.name()),
            _ => format!("{}: {activity_name}", class.name()),
        },
        activity_name,
        time,
        start_time: outcome.then_some(time),
        end_time: outcome.then_some(end),
        duration: outcome.then_some(r.duration_ms),
        severity_id,
        severity,
        status_id,
        status,
        status_code: r.reason,
        action_id,
        action,
        disposition_id,
        disposition,
        message,
        metadata: metadata(r, profiles),
        actor: Actor {
            user: User {
                name: &r.identity,
                uid: &r.identity,
            },
            session: r.session.as_deref().map(|uid| Session { uid }),
        },
        src_endpoint: endpoint_of(&r.client),
        dst_endpoint: match class {
            // latchkey's own resolver answered: no destination beyond it.
            Class::Dns => None,
            _ => destination(r),
        },
        proxy_endpoint,
        http_request,
        http_response: r
            .status
            .filter(|_| outcome && class == Class::Http)
            .map(|code| HttpResponse { code }),
        query: dns.and(r.host.as_deref()).map(|hostname| DnsQuery {
            hostname,
            qtype: dns.and_then(|d| d.qtype.as_deref()),
        }),
        answers: dns.map(answers).unwrap_or_default(),
        rcode_id,
        rcode: rcode_name,
        traffic: (outcome && class != Class::Dns).then(|| Traffic {
            bytes_in: r.bytes_down,
            bytes_out: r.bytes_up,
            bytes: r.bytes_up.saturating_add(r.bytes_down),
        }),
        firewall_rule: r.rule.as_deref().map(|name| Named { name }),
        policy: (!r.policy.is_empty()).then(|| PolicyRef {
            uid: &r.policy,
            name: "latchkey policy",
        }),
        trace,
        unmapped: unmapped(
            r,
            (class == Class::Http && !standard).then_some(method),
            dns,
        ),
    }
}

/// The event's activity: the HTTP method (99 for one OCSF does not name), traffic or a
/// refusal, a DNS query or its answer.
fn activity<'r>(
    class: Class,
    r: &'r Record,
    allowed: bool,
    method: &'r str,
) -> (u32, Cow<'r, str>) {
    match class {
        Class::Http => match http_activity(method) {
            (99, _) => (99, Cow::Borrowed(method)),
            (id, name) => (id, Cow::Borrowed(name)),
        },
        Class::Network if allowed => (6, Cow::Borrowed("Traffic")),
        Class::Network => (5, Cow::Borrowed("Refuse")),
        Class::Dns => match r.dns.as_ref().and_then(|d| d.rcode) {
            Some(_) => (6, Cow::Borrowed("Traffic")),
            None => (1, Cow::Borrowed("Query")),
        },
    }
}

/// The trace an HTTP record is part of, with its span on the outcome.
fn trace_of<'r>(
    r: &'r Record,
    class: Class,
    method: &'r str,
    (time, end): (u64, u64),
) -> Option<Trace<'r>> {
    let outcome = r.phase == Phase::Outcome;
    match (class, r.trace_id.as_deref()) {
        (Class::Http, Some(uid)) => Some(Trace {
            uid,
            span: r.span_id.as_deref().filter(|_| outcome).map(|span| Span {
                uid: span,
                parent_uid: r.parent_span_id.as_deref(),
                operation: match r.host.as_deref() {
                    Some(h) => format!("{method} {h}"),
                    None => method.to_string(),
                },
                start_time: time,
                end_time: end,
                duration: r.duration_ms,
            }),
        }),
        _ => None,
    }
}

fn metadata<'r>(r: &'r Record, profiles: Vec<&'static str>) -> Metadata<'r> {
    Metadata {
        version: OCSF_VERSION,
        product: Product {
            name: "latchkey",
            vendor_name: "latchkey",
            version: env!("CARGO_PKG_VERSION"),
        },
        uid: match r.phase {
            Phase::Outcome => Cow::Borrowed(&r.id),
            Phase::Decision => Cow::Owned(format!("{}.decision", r.id)),
        },
        correlation_uid: &r.id,
        log_name: "audit",
        profiles,
        labels: r.labels.iter().map(|(k, v)| format!("{k}={v}")).collect(),
    }
}

fn answers(d: &DnsInfo) -> Vec<DnsAnswer<'_>> {
    d.answer
        .iter()
        .map(|a| DnsAnswer {
            rdata: a,
            rtype: if a.contains(':') { "AAAA" } else { "A" },
        })
        .collect()
}

/// latchkey's own fields, which OCSF has no place for; `method` is a non-standard HTTP
/// method's name.
fn unmapped<'r>(r: &'r Record, method: Option<&'r str>, dns: Option<&'r DnsInfo>) -> Unmapped<'r> {
    Unmapped {
        phase: r.phase,
        decision: r.decision,
        reason: r.reason,
        rule: r.rule.as_deref(),
        method,
        secrets: &r.secrets,
        policy: &r.policy,
        reach: r.reach.as_deref(),
        labels: &r.labels,
        session: r.session.as_deref(),
        step: r.step.as_deref(),
        attempt: r.attempt,
        would_deny: r.would_deny,
        redactions: r.redactions,
        limits: &r.limits,
        usage: r.usage.as_ref(),
        websocket: r.websocket.as_ref(),
        mcp: r.mcp.as_ref(),
        approval: r.approval.as_ref(),
        dns_transport: dns.map(|d| d.transport),
        dns_queries: dns.map(|d| d.queries),
    }
}

#[cfg(test)]
#[path = "ocsf_tests.rs"]
mod tests;

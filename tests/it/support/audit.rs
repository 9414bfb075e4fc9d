//! The audit record schema, checked on every audit line any test reads.
//!
//! One JSON object per line with: `ts` (RFC 3339), `id`, `identity`, `client` (ip:port),
//! `method`, `scheme`, `host`, `port`, `path` (query values redacted), `decision`, `rule`,
//! `reason` (a known code), `secrets` (array of names), `redactions` (count of secret values
//! replaced in the response, 0 when none), `status` (number or null), `upstream` (ip:port or
//! null), `bytes_up`, `bytes_down`, `duration_ms`, `policy` (`sha256:` + hex), `would_deny`.
//!
//! A DNS query's record (`method = "DNS"`) has no scheme, port, path, status or upstream (all
//! `null`) and one more field, `dns`: `type` (the query type), `rcode` (what was sent, `null`
//! when nothing was), `answer` (addresses), `transport` (`udp`/`tcp`), `queries` (1, or the
//! count a `dns_rate_limited` record sums up). No other record has `dns`.
//!
//! Decisions: `allow` goes with `allowed`, `tunnel` and the failures that happen after policy
//! allowed the request ([`ALLOWED_BUT_FAILED`]); every other reason is a `deny`. `would_deny`
//! (boolean, always present) is true only on report-only records: `decision = "allow"` with the
//! policy denial it would have been as `reason` ([`REPORTABLE`]).

use std::net::SocketAddr;

use serde_json::Value;

pub const REASONS: &[&str] = &[
    "allowed",
    "tunnel",
    "no_rule",
    "port_not_allowed",
    "method_not_allowed",
    "path_not_allowed",
    "host_mismatch",
    "sni_mismatch",
    "not_tls",
    "tls_handshake_failed",
    "bad_request",
    "userinfo_in_url",
    "missing_port",
    "header_too_large",
    "ambiguous_path",
    "not_a_proxy_request",
    "upstream_unreachable",
    "upstream_tls",
    "upstream_error",
    "upstream_timeout",
    "placeholder_not_bound",
    "secret_value_unbound",
    "secret_unavailable",
    "uninspectable_body",
    // Network safety: the address guard, resource limits and request framing.
    "non_public_address",
    "ambiguous_framing",
    "uri_too_long",
    "header_timeout",
    "too_many_connections",
    // Identities: an unknown or missing token, a rule the identity may not use.
    "proxy_auth_required",
    "session_revoked",
    "session_expired",
    "identity_not_allowed",
    // Credentials: a token exchange or signing failed after policy allowed the request; a
    // presigned-URL query on a rule whose credential latchkey signs.
    "credential_failed",
    "presigned_query",
    // The audit log cannot be written: traffic is refused until it can.
    "audit_unavailable",
    "decompression_limit",
    // Request bodies: the buffer budget is full; a client stopped sending its body.
    "too_busy",
    "body_timeout",
    // A request body in a coding latchkey cannot read for secret values.
    "uninspectable_request_body",
    // Captured (gateway) connections: TLS without SNI, an original destination that is not an
    // address of the SNI / Host, a connection that was not redirected to the transparent port.
    "no_sni",
    "destination_mismatch",
    "not_redirected",
    // latchkey's resolver: a query type it does not answer; a client over --dns-rate.
    "dns_type_refused",
    "dns_rate_limited",
    // Approvals: a request waiting for a person, one a person denied, an identity over its
    // rate of approval requests, the state store down (fail closed), a held body too large.
    "approval_pending",
    "approval_denied",
    "rate_limited",
    "state_unavailable",
    "body_too_large",
    // Limits and budgets: a budget without room for the request's reservation, the state store
    // holding a limit's counters unreachable.
    "budget_exhausted",
    // A budget held only by other requests' reservations still in flight.
    "budget_reserved",
    "limits_unavailable",
    // A WebSocket handshake under a rule without `websocket = true`.
    "websocket_not_allowed",
    "mcp_not_allowed",
    // A credential would travel in cleartext; a rule's `schemes` leave the request's out.
    "credential_needs_tls",
    "scheme_not_allowed",
    // A `[[deny]]` table matched; a rule's `query`/`headers`/`body`/`graphql` predicate failed.
    "denied_by_rule",
    "predicate_mismatch",
];

/// DNS records (`method = "DNS"`) whose reason allows them no name and no query type: the
/// message could not be read, or was not read (over the rate cap, over the TCP connection cap,
/// too many in flight, a TCP connection that asked nothing in time).
const DNS_UNREAD: &[&str] = &[
    "bad_request",
    "dns_rate_limited",
    "too_many_connections",
    "too_busy",
    "header_timeout",
];

/// The response codes latchkey's resolver sends.
const DNS_RCODES: &[&str] = &[
    "NOERROR", "NXDOMAIN", "REFUSED", "FORMERR", "NOTIMP", "SERVFAIL",
];

/// Policy denials that report-only mode (`mode = "report"`, `--mode report`) lets through: such a
/// record says `decision = "allow"`, `would_deny = true` and the denial it would have been.
pub const REPORTABLE: &[&str] = &[
    "no_rule",
    "port_not_allowed",
    "method_not_allowed",
    "path_not_allowed",
    "identity_not_allowed",
    "websocket_not_allowed",
    "mcp_not_allowed",
    "scheme_not_allowed",
    "denied_by_rule",
    "predicate_mismatch",
];

/// Reasons for requests that policy allowed but that failed afterwards: the upstream failed, or
/// its response could not be inspected for secrets and was refused.
pub const ALLOWED_BUT_FAILED: &[&str] = &[
    "upstream_unreachable",
    "upstream_tls",
    "upstream_error",
    "upstream_timeout",
    "uninspectable_body",
    "decompression_limit",
    "credential_failed",
];

/// Target fields that may be `null` because the target is unknown for this reason: hyper rejected
/// the request before it could be parsed, an origin-form request names no scheme/host/port, a
/// CONNECT without a port has none. Every other record must carry its whole target.
fn nullable_target_fields(reason: &str) -> &'static [&'static str] {
    match reason {
        "bad_request" | "header_too_large" => &["method", "scheme", "host", "port", "path"],
        // Refused before a request could be read: a stalled header block, a connection over
        // the caps.
        "header_timeout" | "too_many_connections" => &["method", "scheme", "host", "port", "path"],
        // A SOCKS5 client refused at its method or username/password step, before it named a
        // target.
        "proxy_auth_required" => &["method", "scheme", "host", "port", "path"],
        "not_a_proxy_request" => &["scheme", "host", "port"],
        "missing_port" => &["port"],
        _ => &[],
    }
}

/// The whole lines of an audit file, parsed, with the hash chain checked: every line has
/// `seq` (one more than the line before) and `prev` (the SHA-256 hex of the line before; 64
/// zeros for seq 1); a checkpoint line has `checkpoint` {ts, records, last, key, sig}; every
/// other line is a record with `phase` (`decision` or `outcome`) that passes [`check_record`].
/// A partial last line (being written) is left out.
pub fn chained_lines(text: &str) -> Result<Vec<Value>, String> {
    let whole = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "",
    };
    let mut out = Vec::new();
    let mut prev: Option<(u64, String)> = None;
    for (i, line) in whole.lines().enumerate() {
        let n = i + 1;
        let v: Value = serde_json::from_str(line)
            .map_err(|e| format!("line {n} is not JSON ({e}): {line}"))?;
        let seq = v["seq"]
            .as_u64()
            .ok_or_else(|| format!("line {n} has no seq: {line}"))?;
        let link = v["prev"]
            .as_str()
            .ok_or_else(|| format!("line {n} has no prev: {line}"))?;
        match &prev {
            None if seq == 1 && link != "0".repeat(64) => {
                return Err(format!(
                    "line {n}: seq 1 does not start at the genesis hash"
                ))
            }
            None => {}
            Some((pseq, phash)) => {
                if seq != pseq + 1 {
                    return Err(format!("line {n}: seq {seq} follows seq {pseq}"));
                }
                if link != phash {
                    return Err(format!("line {n}: prev is not the hash of line {}", n - 1));
                }
            }
        }
        prev = Some((seq, sha256_hex(line.as_bytes())));
        if let Some(cp) = v.get("checkpoint") {
            for field in ["ts", "key", "sig"] {
                if !cp[field].is_string() {
                    return Err(format!("line {n}: checkpoint.{field} is not a string"));
                }
            }
            if !cp["records"].is_u64() || !cp["last"].is_boolean() {
                return Err(format!(
                    "line {n}: checkpoint records/last malformed: {line}"
                ));
            }
        } else {
            match v["phase"].as_str() {
                Some("decision" | "outcome") => {}
                other => return Err(format!("line {n}: phase is {other:?}: {line}")),
            }
            check_record(&v).map_err(|p| format!("line {n}: {p}\nrecord: {line}"))?;
        }
        out.push(v);
    }
    Ok(out)
}

fn sha256_hex(bytes: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Fields only an outcome record has (a decision line is written before they are known).
const DECISION_LEAVES_OUT: &[&str] = &[
    "status",
    "upstream",
    "bytes_up",
    "bytes_down",
    "duration_ms",
    "redactions",
    "limits",
    "usage",
    "websocket",
    "mcp",
    "captured",
    "dns",
];

/// Reasons decided before latchkey dials anything: their refusals have no `upstream`.
const REFUSED_BEFORE_DIAL: &[&str] = &[
    "no_rule",
    "port_not_allowed",
    "method_not_allowed",
    "path_not_allowed",
    "identity_not_allowed",
    "proxy_auth_required",
    "host_mismatch",
    "sni_mismatch",
    "not_tls",
    "no_sni",
    "destination_mismatch",
    "not_redirected",
    "too_many_connections",
];

/// `secret_sources` (name → kind, for names in `secrets` only) and `stale_secrets` (names in
/// `secrets`), when present: never empty, never anything but names and kinds.
fn check_secret_sources(obj: &serde_json::Map<String, Value>) -> Result<(), String> {
    const KINDS: &[&str] = &["env", "file", "exec", "vault", "aws-sm", "aws-ssm"];
    let secrets: Vec<&str> = obj
        .get("secrets")
        .and_then(Value::as_array)
        .map(|l| l.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(m) = obj.get("secret_sources") {
        let m = m
            .as_object()
            .filter(|m| !m.is_empty())
            .ok_or_else(|| format!("secret_sources is {m}"))?;
        for (name, kind) in m {
            if !secrets.contains(&name.as_str())
                || !kind.as_str().is_some_and(|k| KINDS.contains(&k))
            {
                return Err(format!(
                    "secret_sources has {name}: {kind} (secrets: {secrets:?})"
                ));
            }
        }
    }
    if let Some(l) = obj.get("stale_secrets") {
        let names = l
            .as_array()
            .filter(|l| !l.is_empty())
            .ok_or_else(|| format!("stale_secrets is {l}"))?;
        if names
            .iter()
            .any(|n| !n.as_str().is_some_and(|n| secrets.contains(&n)))
        {
            return Err(format!("stale_secrets is {l} (secrets: {secrets:?})"));
        }
    }
    Ok(())
}

/// Checks one audit record against the schema; `Err` names the first problem.
pub fn check_record(record: &Value) -> Result<(), String> {
    let obj = record
        .as_object()
        .ok_or_else(|| "record is not a JSON object".to_string())?;
    let get = |name: &str| {
        obj.get(name)
            .ok_or_else(|| format!("field {name:?} is missing"))
    };
    let string = |name: &str| -> Result<&str, String> {
        get(name)?
            .as_str()
            .ok_or_else(|| format!("field {name:?} is not a string"))
    };
    let count = |name: &str| -> Result<f64, String> {
        let n = get(name)?
            .as_f64()
            .ok_or_else(|| format!("field {name:?} is not a number"))?;
        if n < 0.0 {
            return Err(format!("field {name:?} is negative"));
        }
        Ok(n)
    };

    check_rfc3339(string("ts")?).map_err(|e| format!("ts: {e}"))?;
    match get("id")? {
        Value::String(s) if !s.is_empty() => {}
        Value::Number(_) => {}
        other => return Err(format!("id is not a non-empty string or number: {other}")),
    }
    if string("identity")?.is_empty() {
        return Err("identity is empty".into());
    }
    string("client")?
        .parse::<SocketAddr>()
        .map_err(|e| format!("client is not ip:port: {e}"))?;

    let reason = string("reason")?;
    if !REASONS.contains(&reason) {
        return Err(format!("reason {reason:?} is not a known code"));
    }
    let dns = get("method")? == "DNS";
    if dns {
        check_dns(obj, reason)?;
    } else if obj.contains_key("dns") {
        return Err("a record other than a DNS query's has a dns field".into());
    }
    // A DNS record's target was checked by `check_dns`.
    let nullable = |name: &str| -> Result<bool, String> {
        Ok((dns || nullable_target_fields(reason).contains(&name)) && get(name)?.is_null())
    };

    if !nullable("method")? && string("method")?.is_empty() {
        return Err("method is empty".into());
    }

    if !nullable("scheme")? {
        let scheme = string("scheme")?;
        if scheme != "http" && scheme != "https" {
            return Err(format!("scheme {scheme:?} is neither http nor https"));
        }
    }
    if !nullable("host")? {
        string("host")?;
    }
    if !nullable("port")? {
        let port = get("port")?
            .as_u64()
            .ok_or_else(|| "port is not an unsigned integer".to_string())?;
        if port > 65535 {
            return Err(format!("port {port} is out of range"));
        }
    }
    // A CONNECT has no path.
    let connect = get("method")? == "CONNECT";
    if !(nullable("path")? || (connect && get("path")?.is_null())) {
        check_redacted(string("path")?)?;
    }

    let decision = string("decision")?;
    let would_deny = get("would_deny")?
        .as_bool()
        .ok_or_else(|| "would_deny is not a boolean".to_string())?;
    let allow_reason =
        matches!(reason, "allowed" | "tunnel") || ALLOWED_BUT_FAILED.contains(&reason);
    match decision {
        // Report-only: let through, and the reason is the denial it would have been.
        "allow" if would_deny && !REPORTABLE.contains(&reason) => {
            return Err(format!(
                "would_deny with reason {reason:?}, which is not a reportable denial"
            ))
        }
        "allow" if would_deny => {}
        "deny" if would_deny => return Err("decision deny with would_deny true".into()),
        "allow" if !allow_reason => return Err(format!("decision allow with reason {reason:?}")),
        "deny" if allow_reason => return Err(format!("decision deny with reason {reason:?}")),
        "allow" | "deny" => {}
        _ => return Err(format!("decision {decision:?} is neither allow nor deny")),
    }
    match get("rule")? {
        Value::String(s) if !s.is_empty() => {}
        Value::Null if decision == "deny" => {}
        other => return Err(format!("rule is {other} (decision {decision})")),
    }
    let secrets = get("secrets")?
        .as_array()
        .ok_or_else(|| "secrets is not an array".to_string())?;
    if secrets.iter().any(|s| !s.is_string()) {
        return Err("secrets holds something other than names".into());
    }
    if obj.get("phase").and_then(Value::as_str) == Some("decision") {
        // A decision line holds what was decided; what only the outcome knows is not in it.
        for f in DECISION_LEAVES_OUT {
            if obj.contains_key(*f) {
                return Err(format!("a decision line carries the outcome's {f:?}"));
            }
        }
        if !string("policy")?.starts_with("sha256:") {
            return Err("policy is not a sha256: digest".into());
        }
        return Ok(());
    }
    match get("redactions")?.as_u64() {
        Some(_) => {}
        None => return Err("redactions is not a non-negative integer".into()),
    }
    match get("status")? {
        Value::Null => {}
        Value::Number(n) => match n.as_u64() {
            Some(100..=599) => {}
            _ => return Err(format!("status {n} is not an HTTP status")),
        },
        other => return Err(format!("status is {other}")),
    }
    match get("upstream")? {
        Value::Null => {}
        Value::String(s) => {
            s.parse::<SocketAddr>()
                .map_err(|e| format!("upstream {s:?} is not ip:port: {e}"))?;
        }
        other => return Err(format!("upstream is {other}")),
    }
    // `upstream` is only an address latchkey dialed: a refusal decided before any dial names
    // none (a redirected connection's destination is `original_dst`).
    if get("decision")? == "deny"
        && REFUSED_BEFORE_DIAL.contains(&reason)
        && !get("upstream")?.is_null()
    {
        return Err(format!(
            "a {reason} refusal dialed nothing, yet upstream is {}",
            get("upstream")?
        ));
    }
    match obj.get("original_dst") {
        None => {}
        Some(Value::String(s)) => {
            s.parse::<SocketAddr>()
                .map_err(|e| format!("original_dst {s:?} is not ip:port: {e}"))?;
        }
        Some(other) => return Err(format!("original_dst is {other} (absent, or ip:port)")),
    }
    count("bytes_up")?;
    count("bytes_down")?;
    count("duration_ms")?;
    if let Some(limits) = obj.get("limits") {
        check_limits(limits, reason)?;
    }
    if let Some(usage) = obj.get("usage") {
        check_usage(usage)?;
    }
    check_secret_sources(obj)?;
    if let Some(c) = obj.get("captured") {
        let names = c
            .as_array()
            .ok_or_else(|| format!("captured is {c}, not a list"))?;
        if names.is_empty() || names.iter().any(|n| !n.is_string()) {
            return Err(format!("captured is {c}"));
        }
    }
    if let Some(mcp) = obj.get("mcp") {
        check_mcp(mcp)?;
    }
    if let Some(ws) = obj.get("websocket") {
        check_websocket(ws, get("status")?)?;
    }
    let policy = string("policy")?;
    let digest = policy
        .strip_prefix("sha256:")
        .ok_or_else(|| format!("policy {policy:?} does not start with sha256:"))?;
    if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("policy {policy:?} is not a sha256 hex digest"));
    }
    Ok(())
}

/// `limits`: present only when some limit was charged; one object per limit and measure. A
/// record refused by a limit has exactly the refusing measure marked `refused`.
fn check_limits(limits: &Value, reason: &str) -> Result<(), String> {
    let list = limits
        .as_array()
        .filter(|l| !l.is_empty())
        .ok_or_else(|| format!("limits is {limits}, not a non-empty array"))?;
    let mut refused = 0;
    for c in list {
        let o = c
            .as_object()
            .ok_or_else(|| format!("limits holds {c}, not an object"))?;
        for f in ["limit", "key"] {
            match o.get(f) {
                Some(Value::String(s)) if !s.is_empty() => {}
                other => return Err(format!("limits[].{f} is {other:?}")),
            }
        }
        match o.get("measure").and_then(Value::as_str) {
            Some("requests" | "concurrency" | "bytes_up" | "llm_tokens" | "spend") => {}
            other => return Err(format!("limits[].measure is {other:?}")),
        }
        for f in ["charged", "used", "limit_value"] {
            if o.get(f).and_then(Value::as_u64).is_none() {
                return Err(format!("limits[].{f} is {:?}, not a count", o.get(f)));
            }
        }
        for f in ["refused", "unchecked"] {
            match o.get(f) {
                None | Some(Value::Bool(true)) => {}
                other => {
                    return Err(format!(
                        "limits[].{f} is {other:?} (present only when true)"
                    ))
                }
            }
        }
        refused += usize::from(o.contains_key("refused"));
    }
    let by_limit = matches!(
        reason,
        "rate_limited" | "budget_exhausted" | "budget_reserved" | "limits_unavailable"
    );
    if refused > 1 || ((refused == 1) != by_limit && reason != "rate_limited") {
        return Err(format!("{refused} limits refused with reason {reason}"));
    }
    Ok(())
}

/// `mcp`: the JSON-RPC messages of one POST under a rule with `mcp`.
fn check_mcp(mcp: &Value) -> Result<(), String> {
    let n = mcp["messages"]
        .as_u64()
        .ok_or_else(|| format!("mcp.messages is {:?}", mcp.get("messages")))?;
    let calls = mcp["calls"]
        .as_array()
        .ok_or_else(|| format!("mcp.calls is {:?}", mcp.get("calls")))?;
    if n == 0 || calls.is_empty() || calls.len() as u64 > n.min(64) {
        return Err(format!("mcp: {n} messages, {} calls", calls.len()));
    }
    for c in calls {
        let o = c.as_object().ok_or_else(|| format!("mcp call {c}"))?;
        if !(o["method"].is_string() || o["method"].is_null()) {
            return Err(format!("mcp call method {c}"));
        }
        if o.get("tool").is_some_and(|t| !t.is_string())
            || o.get("refused").is_some_and(|r| r != true)
            || o.keys()
                .any(|k| !matches!(k.as_str(), "method" | "tool" | "refused"))
        {
            return Err(format!("mcp call {c}"));
        }
    }
    Ok(())
}

/// `websocket`: only on an upgraded handshake; frames counted, how it closed.
fn check_websocket(ws: &Value, status: &Value) -> Result<(), String> {
    if status != 101 {
        return Err(format!("websocket on a record with status {status}"));
    }
    let o = ws
        .as_object()
        .ok_or_else(|| format!("websocket is {ws}, not an object"))?;
    for f in ["frames_up", "frames_down"] {
        if !o.get(f).is_some_and(Value::is_u64) {
            return Err(format!("websocket.{f} is {:?}", o.get(f)));
        }
    }
    match o.get("close_code") {
        Some(Value::Null) => {}
        Some(v) if v.as_u64().is_some_and(|c| (1000..5000).contains(&c)) => {}
        other => return Err(format!("websocket.close_code is {other:?}")),
    }
    match o.get("closed_by").and_then(Value::as_str) {
        Some("sandbox" | "upstream" | "latchkey") => {}
        other => return Err(format!("websocket.closed_by is {other:?}")),
    }
    if o.len() != 4 {
        return Err(format!("websocket has unknown fields: {ws}"));
    }
    Ok(())
}

/// `usage`: a model-provider call's tokens and cost.
fn check_usage(usage: &Value) -> Result<(), String> {
    let o = usage
        .as_object()
        .ok_or_else(|| format!("usage is {usage}, not an object"))?;
    match o.get("provider").and_then(Value::as_str) {
        Some("openai" | "anthropic" | "gemini") => {}
        other => return Err(format!("usage.provider is {other:?}")),
    }
    for f in ["input_tokens", "output_tokens", "cached_input_tokens"] {
        if o.get(f).and_then(Value::as_u64).is_none() {
            return Err(format!("usage.{f} is {:?}", o.get(f)));
        }
    }
    match o.get("model") {
        Some(Value::String(_) | Value::Null) => {}
        other => return Err(format!("usage.model is {other:?}")),
    }
    match o.get("cost") {
        Some(Value::Null) => {}
        Some(Value::Number(n)) if n.as_f64().is_some_and(|c| c >= 0.0) => {}
        other => return Err(format!("usage.cost is {other:?}")),
    }
    match o.get("source").and_then(Value::as_str) {
        Some("response" | "reserved") => {}
        other => return Err(format!("usage.source is {other:?}")),
    }
    Ok(())
}

/// The DNS part of a DNS query's record (see the module docs).
fn check_dns(obj: &serde_json::Map<String, Value>, reason: &str) -> Result<(), String> {
    for field in ["scheme", "port", "path", "status", "upstream"] {
        match obj.get(field) {
            Some(Value::Null) => {}
            other => return Err(format!("a DNS record has {field} = {other:?}, not null")),
        }
    }
    let unread = DNS_UNREAD.contains(&reason);
    match obj.get("host") {
        Some(Value::String(s)) if !s.is_empty() => {}
        Some(Value::Null) if unread => {}
        other => return Err(format!("a DNS record ({reason}) has host {other:?}")),
    }
    let dns = obj
        .get("dns")
        .and_then(Value::as_object)
        .ok_or_else(|| "a DNS record has no dns object".to_string())?;
    let field = |name: &str| {
        dns.get(name)
            .ok_or_else(|| format!("dns.{name} is missing"))
    };
    match field("type")? {
        Value::String(t) if !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric()) => {}
        Value::Null if unread => {}
        other => return Err(format!("dns.type is {other} ({reason})")),
    }
    let rcode = match field("rcode")? {
        Value::String(r) if DNS_RCODES.contains(&r.as_str()) => Some(r.as_str()),
        Value::Null if unread => None,
        other => return Err(format!("dns.rcode is {other} ({reason})")),
    };
    let expected = match reason {
        "allowed" => Some("NOERROR"),
        "no_rule" => Some("NXDOMAIN"),
        "dns_type_refused" | "dns_rate_limited" => Some("REFUSED"),
        _ => None,
    };
    if expected.is_some() && rcode != expected {
        return Err(format!("dns.rcode {rcode:?} with reason {reason}"));
    }
    let answer = field("answer")?
        .as_array()
        .ok_or_else(|| "dns.answer is not an array".to_string())?;
    for a in answer {
        a.as_str()
            .and_then(|s| s.parse::<std::net::IpAddr>().ok())
            .ok_or_else(|| format!("dns.answer holds {a}, not an address"))?;
    }
    if !answer.is_empty() && reason != "allowed" {
        return Err(format!("dns.answer holds addresses with reason {reason}"));
    }
    match field("transport")?.as_str() {
        Some("udp" | "tcp") => {}
        other => return Err(format!("dns.transport is {other:?}")),
    }
    match field("queries")?.as_u64() {
        Some(1) => {}
        Some(n) if n > 1 && reason == "dns_rate_limited" => {}
        other => return Err(format!("dns.queries is {other:?} ({reason})")),
    }
    Ok(())
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`
fn check_rfc3339(ts: &str) -> Result<(), String> {
    let b = ts.as_bytes();
    let digits = |range: std::ops::Range<usize>| {
        b.get(range.clone())
            .is_some_and(|s| s.iter().all(u8::is_ascii_digit))
    };
    let ok_date = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && (b[10] == b'T' || b[10] == b't')
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !ok_date {
        return Err(format!("{ts:?} is not RFC 3339"));
    }
    let mut rest = &ts[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return Err(format!("{ts:?} has an empty fraction"));
        }
        rest = &frac[n..];
    }
    let offset_ok = rest == "Z"
        || rest == "z"
        || (rest.len() == 6
            && (rest.starts_with('+') || rest.starts_with('-'))
            && rest.as_bytes()[3] == b':'
            && rest[1..3].bytes().all(|c| c.is_ascii_digit())
            && rest[4..6].bytes().all(|c| c.is_ascii_digit()));
    if offset_ok {
        Ok(())
    } else {
        Err(format!("{ts:?} has no valid UTC offset"))
    }
}

/// Every `key=value` in the query must have its value redacted.
fn check_redacted(path: &str) -> Result<(), String> {
    let Some((_, query)) = path.split_once('?') else {
        return Ok(());
    };
    for pair in query.split('&') {
        if let Some((_, value)) = pair.split_once('=') {
            if value != "REDACTED" {
                return Err(format!("path {path:?} holds an unredacted query value"));
            }
        }
    }
    Ok(())
}

/// Asserts that `record` has every field of `expected` (a JSON object) with the same value.
pub fn assert_record(record: &Value, expected: Value) {
    let expected = expected
        .as_object()
        .expect("expected fields as a JSON object");
    for (name, want) in expected {
        assert_eq!(
            record.get(name),
            Some(want),
            "audit field {name:?}: expected {want}, record: {record:#}"
        );
    }
}

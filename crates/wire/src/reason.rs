//! Stable reason codes: the one vocabulary shared by decisions, responses, logs and audit records.
//!
//! A code is a contract: scripts and dashboards match on it. Add codes freely; never rename one.
//! Also here, because every module that maps a failure to a reason needs it: [`Refusal`], and
//! the one walk over an error's chain of sources ([`find_cause`], [`chain_text`]).

use http::StatusCode;

/// Why a request was allowed, refused or failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A rule allowed the request and it was forwarded.
    Allowed,
    /// A `tunnel = true` rule allowed a raw CONNECT relay.
    Tunnel,
    /// No rule names this host.
    NoRule,
    /// A rule names the host, but not this port.
    PortNotAllowed,
    /// A rule names the host and port, but not this method.
    MethodNotAllowed,
    /// A rule names the host, port and method, but no path glob matches.
    PathNotAllowed,
    /// The inner request's Host / `:authority` differs from the CONNECT authority.
    HostMismatch,
    /// The TLS SNI differs from the CONNECT host.
    SniMismatch,
    /// The bytes after a CONNECT were not a TLS ClientHello.
    NotTls,
    /// The TLS handshake with the sandbox failed.
    TlsHandshakeFailed,
    /// The request could not be parsed or is not something a proxy accepts.
    BadRequest,
    /// An absolute-form URL carried `user:pass@`, a classic way to confuse host parsing.
    UserinfoInUrl,
    /// `CONNECT host` without a port.
    MissingPort,
    /// The request header block exceeded the limit.
    HeaderTooLarge,
    /// The path holds dot segments or encoded slashes that the upstream may resolve differently.
    AmbiguousPath,
    /// An origin-form request reached the proxy directly.
    NotAProxyRequest,
    /// The upstream could not be resolved or connected to.
    UpstreamUnreachable,
    /// The upstream's TLS certificate or handshake failed verification.
    UpstreamTls,
    /// The upstream connection failed while exchanging the request or response.
    UpstreamError,
    /// The upstream did not answer in time.
    UpstreamTimeout,
    /// A `__LATCHKEY_<name>__` placeholder for a secret this rule does not bind, or in a place
    /// the rule does not enable.
    PlaceholderNotBound,
    /// The sandbox sent a secret's value to a host no rule binds it to.
    SecretValueUnbound,
    /// A secret could not be produced (failing exec helper, unreadable file).
    SecretUnavailable,
    /// The response body could not be inspected for secrets: a content coding latchkey cannot
    /// decode, a transfer coding other than `chunked`, or a body that does not decode.
    UninspectableBody,
    /// The request's framing (Content-Length / Transfer-Encoding) is ambiguous: smuggling.
    AmbiguousFraming,
    /// The request target is longer than the limit.
    UriTooLong,
    /// The client did not send a complete header block in time (slowloris).
    HeaderTimeout,
    /// The connection caps (total or per client) are reached.
    TooManyConnections,
    /// The upstream resolved to an address that is not public unicast (or is latchkey itself).
    NonPublicAddress,
    /// Identities are configured and the client presented no known token or source address.
    ProxyAuthRequired,
    /// A rule would allow the request, but not for this identity.
    IdentityNotAllowed,
    /// The session the client presented was revoked (`DELETE /sessions/ID`): its requests are
    /// refused and its open connections were cut.
    SessionRevoked,
    /// The session the client presented has passed its `expires_at`.
    SessionExpired,
    /// A credential could not be applied: a token endpoint failed, key material is unusable.
    CredentialFailed,
    /// Presigned query authentication sent by the sandbox on a credentialed rule.
    PresignedQuery,
    /// The audit log cannot be written (disk full, sink gone): latchkey refuses traffic rather
    /// than let requests through unrecorded.
    AuditUnavailable,
    /// A scanned response body decodes to more than the per-response limit (a decompression
    /// bomb, or a body too large to inspect).
    DecompressionLimit,
    /// Holding this request's body would exceed the request-body buffer budget (global or the
    /// client's share): retry later.
    TooBusy,
    /// The client stopped sending its request body for longer than the body-progress timeout.
    BodyTimeout,
    /// The sandbox sent a request body in a coding latchkey does not read (`Content-Encoding:
    /// gzip`, compressed gRPC messages): its content could not be checked for secret values.
    UninspectableRequestBody,
    /// A captured (transparent or DNS-routed) TLS connection sent a ClientHello without SNI:
    /// there is no name for policy to decide.
    NoSni,
    /// A redirected connection's original destination is not an address of the name its SNI or
    /// Host carries: an allowed name cannot carry a connection to an arbitrary address.
    DestinationMismatch,
    /// A connection reached the transparent listener without being redirected to it (its
    /// original destination is latchkey's own listener, or could not be recovered).
    NotRedirected,
    /// latchkey's resolver refuses this DNS query type or class (TXT, NULL, ANY, SRV, MX, ...:
    /// what DNS tunnels ride on); it answers A and AAAA only.
    DnsTypeRefused,
    /// The client sent more DNS queries than `--dns-rate` allows per second.
    DnsRateLimited,
    /// The request waits for a person (an `ask` rule or `[ask] unknown`) and nobody answered
    /// within the hold: retry it after approval (`x-latchkey-approval` names the approval).
    ApprovalPending,
    /// A person denied this request's approval.
    ApprovalDenied,
    /// Over a rate limit: approval requests per identity, a `[limits]` request rate, or a
    /// concurrency cap whose queue wait ran out.
    RateLimited,
    /// The state store (approvals, grants) cannot be read or written: what needs it fails
    /// closed.
    StateUnavailable,
    /// A request body latchkey must hold whole (one waiting for approval) is over the limit.
    BodyTooLarge,
    /// A `[limits]` budget (bytes_up, llm_tokens, spend) has no room for this request's
    /// reservation in the current window.
    BudgetExhausted,
    /// A `[limits]` budget has no room for this request's reservation only because of other
    /// requests' reservations still in flight (what was spent leaves room): retry in a moment,
    /// or set the limit's `queue` to wait for them to settle.
    BudgetReserved,
    /// The state store holding a `[limits]` counter cannot answer, and the limit fails closed.
    LimitsUnavailable,
    /// A request asked to upgrade to a WebSocket under a rule without `websocket = true`.
    WebSocketNotAllowed,
    /// An MCP JSON-RPC message (a method, a tool, a tool argument) the rule's `mcp` does not allow.
    McpNotAllowed,
    /// A rule that brokers a credential (injects, binds secrets, signs, mints or captures) would
    /// allow the request, but latchkey would send it upstream in cleartext (`http://`, whatever
    /// the port): a credential leaves only inside TLS unless the rule says
    /// `dangerously_allow_cleartext = true`. Nothing is sent and no secret is rendered.
    CredentialNeedsTls,
    /// A rule would allow the request, but its `schemes` leave out the scheme latchkey would
    /// send it with (`schemes = ["https"]` and a plain `http://` request, or the reverse).
    SchemeNotAllowed,
    /// A `[[deny]]` table matched the request: denials are checked before any rule allows.
    DeniedByRule,
    /// A rule would allow the request, but one of its predicates (`query`, `headers`, `body`,
    /// `graphql`) does not hold.
    PredicateMismatch,
}

impl Reason {
    /// Every reason, for registry tests and documentation.
    pub const ALL: [Reason; 59] = [
        Reason::Allowed,
        Reason::Tunnel,
        Reason::NoRule,
        Reason::PortNotAllowed,
        Reason::MethodNotAllowed,
        Reason::PathNotAllowed,
        Reason::HostMismatch,
        Reason::SniMismatch,
        Reason::NotTls,
        Reason::TlsHandshakeFailed,
        Reason::BadRequest,
        Reason::UserinfoInUrl,
        Reason::MissingPort,
        Reason::HeaderTooLarge,
        Reason::AmbiguousPath,
        Reason::NotAProxyRequest,
        Reason::UpstreamUnreachable,
        Reason::UpstreamTls,
        Reason::UpstreamError,
        Reason::UpstreamTimeout,
        Reason::PlaceholderNotBound,
        Reason::SecretValueUnbound,
        Reason::SecretUnavailable,
        Reason::UninspectableBody,
        Reason::AmbiguousFraming,
        Reason::UriTooLong,
        Reason::HeaderTimeout,
        Reason::TooManyConnections,
        Reason::NonPublicAddress,
        Reason::ProxyAuthRequired,
        Reason::IdentityNotAllowed,
        Reason::SessionRevoked,
        Reason::SessionExpired,
        Reason::CredentialFailed,
        Reason::PresignedQuery,
        Reason::AuditUnavailable,
        Reason::DecompressionLimit,
        Reason::TooBusy,
        Reason::BodyTimeout,
        Reason::UninspectableRequestBody,
        Reason::NoSni,
        Reason::DestinationMismatch,
        Reason::NotRedirected,
        Reason::DnsTypeRefused,
        Reason::DnsRateLimited,
        Reason::ApprovalPending,
        Reason::ApprovalDenied,
        Reason::RateLimited,
        Reason::StateUnavailable,
        Reason::BodyTooLarge,
        Reason::BudgetExhausted,
        Reason::BudgetReserved,
        Reason::LimitsUnavailable,
        Reason::WebSocketNotAllowed,
        Reason::McpNotAllowed,
        Reason::CredentialNeedsTls,
        Reason::SchemeNotAllowed,
        Reason::DeniedByRule,
        Reason::PredicateMismatch,
    ];

    /// The stable snake_case code used in headers, logs and audit records.
    pub fn code(self) -> &'static str {
        match self {
            Reason::Allowed => "allowed",
            Reason::Tunnel => "tunnel",
            Reason::NoRule => "no_rule",
            Reason::PortNotAllowed => "port_not_allowed",
            Reason::MethodNotAllowed => "method_not_allowed",
            Reason::PathNotAllowed => "path_not_allowed",
            Reason::HostMismatch => "host_mismatch",
            Reason::SniMismatch => "sni_mismatch",
            Reason::NotTls => "not_tls",
            Reason::TlsHandshakeFailed => "tls_handshake_failed",
            Reason::BadRequest => "bad_request",
            Reason::UserinfoInUrl => "userinfo_in_url",
            Reason::MissingPort => "missing_port",
            Reason::HeaderTooLarge => "header_too_large",
            Reason::AmbiguousPath => "ambiguous_path",
            Reason::NotAProxyRequest => "not_a_proxy_request",
            Reason::UpstreamUnreachable => "upstream_unreachable",
            Reason::UpstreamTls => "upstream_tls",
            Reason::UpstreamError => "upstream_error",
            Reason::UpstreamTimeout => "upstream_timeout",
            Reason::PlaceholderNotBound => "placeholder_not_bound",
            Reason::SecretValueUnbound => "secret_value_unbound",
            Reason::SecretUnavailable => "secret_unavailable",
            Reason::UninspectableBody => "uninspectable_body",
            Reason::AmbiguousFraming => "ambiguous_framing",
            Reason::UriTooLong => "uri_too_long",
            Reason::HeaderTimeout => "header_timeout",
            Reason::TooManyConnections => "too_many_connections",
            Reason::NonPublicAddress => "non_public_address",
            Reason::ProxyAuthRequired => "proxy_auth_required",
            Reason::SessionRevoked => "session_revoked",
            Reason::SessionExpired => "session_expired",
            Reason::IdentityNotAllowed => "identity_not_allowed",
            Reason::CredentialFailed => "credential_failed",
            Reason::PresignedQuery => "presigned_query",
            Reason::AuditUnavailable => "audit_unavailable",
            Reason::DecompressionLimit => "decompression_limit",
            Reason::TooBusy => "too_busy",
            Reason::BodyTimeout => "body_timeout",
            Reason::UninspectableRequestBody => "uninspectable_request_body",
            Reason::NoSni => "no_sni",
            Reason::DestinationMismatch => "destination_mismatch",
            Reason::NotRedirected => "not_redirected",
            Reason::DnsTypeRefused => "dns_type_refused",
            Reason::DnsRateLimited => "dns_rate_limited",
            Reason::ApprovalPending => "approval_pending",
            Reason::ApprovalDenied => "approval_denied",
            Reason::RateLimited => "rate_limited",
            Reason::StateUnavailable => "state_unavailable",
            Reason::BudgetExhausted => "budget_exhausted",
            Reason::BudgetReserved => "budget_reserved",
            Reason::LimitsUnavailable => "limits_unavailable",
            Reason::BodyTooLarge => "body_too_large",
            Reason::WebSocketNotAllowed => "websocket_not_allowed",
            Reason::McpNotAllowed => "mcp_not_allowed",
            Reason::CredentialNeedsTls => "credential_needs_tls",
            Reason::SchemeNotAllowed => "scheme_not_allowed",
            Reason::DeniedByRule => "denied_by_rule",
            Reason::PredicateMismatch => "predicate_mismatch",
        }
    }

    /// The status latchkey answers with when it refuses or fails a request for this reason.
    pub fn status(self) -> StatusCode {
        match self {
            Reason::Allowed | Reason::Tunnel => StatusCode::OK,
            Reason::NoRule
            | Reason::PortNotAllowed
            | Reason::MethodNotAllowed
            | Reason::PathNotAllowed
            | Reason::HostMismatch
            | Reason::SniMismatch
            | Reason::PlaceholderNotBound
            | Reason::SecretValueUnbound
            | Reason::NonPublicAddress
            | Reason::IdentityNotAllowed
            | Reason::PresignedQuery
            | Reason::DestinationMismatch
            | Reason::DnsTypeRefused
            | Reason::ApprovalPending
            | Reason::ApprovalDenied
            | Reason::WebSocketNotAllowed
            | Reason::McpNotAllowed
            | Reason::CredentialNeedsTls
            | Reason::SchemeNotAllowed
            | Reason::DeniedByRule
            | Reason::PredicateMismatch => StatusCode::FORBIDDEN,
            Reason::DnsRateLimited
            | Reason::RateLimited
            | Reason::BudgetExhausted
            | Reason::BudgetReserved => StatusCode::TOO_MANY_REQUESTS,
            Reason::ProxyAuthRequired | Reason::SessionRevoked | Reason::SessionExpired => {
                StatusCode::PROXY_AUTHENTICATION_REQUIRED
            }
            Reason::SecretUnavailable
            | Reason::TooManyConnections
            | Reason::AuditUnavailable
            | Reason::TooBusy
            | Reason::StateUnavailable
            | Reason::LimitsUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Reason::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Reason::UriTooLong => StatusCode::URI_TOO_LONG,
            Reason::UninspectableRequestBody => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Reason::HeaderTimeout | Reason::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Reason::NotTls
            | Reason::TlsHandshakeFailed
            | Reason::BadRequest
            | Reason::UserinfoInUrl
            | Reason::MissingPort
            | Reason::AmbiguousPath
            | Reason::AmbiguousFraming
            | Reason::NotAProxyRequest
            | Reason::NoSni
            | Reason::NotRedirected => StatusCode::BAD_REQUEST,
            Reason::HeaderTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Reason::UpstreamUnreachable
            | Reason::UpstreamTls
            | Reason::UpstreamError
            | Reason::UninspectableBody
            | Reason::DecompressionLimit
            | Reason::CredentialFailed => StatusCode::BAD_GATEWAY,
            Reason::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// Denials that come from policy rules alone (and that report-only mode lets through):
    /// never the address guard, secrets, framing or interception checks, and never
    /// `credential_needs_tls` (a credential in cleartext is refused in every mode).
    pub fn is_policy_denial(self) -> bool {
        matches!(
            self,
            Reason::NoRule
                | Reason::PortNotAllowed
                | Reason::MethodNotAllowed
                | Reason::PathNotAllowed
                | Reason::IdentityNotAllowed
                | Reason::WebSocketNotAllowed
                | Reason::McpNotAllowed
                | Reason::SchemeNotAllowed
                | Reason::DeniedByRule
                | Reason::PredicateMismatch
        )
    }

    /// Whether policy allowed the request: upstream failures happen after an allow.
    pub fn is_allow(self) -> bool {
        matches!(
            self,
            Reason::Allowed
                | Reason::Tunnel
                | Reason::UpstreamUnreachable
                | Reason::UpstreamTls
                | Reason::UpstreamError
                | Reason::UpstreamTimeout
                | Reason::UninspectableBody
                | Reason::DecompressionLimit
                | Reason::CredentialFailed
        )
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code())
    }
}

/// A request latchkey will not pass on, or could not complete: why (a stable [`Reason`]), under
/// which rule, and one sentence for the sandbox. Every phase returns it with `?`; one place
/// drains the request body, scrubs the message, answers and records it.
///
/// `message` is built from names, hosts and paths, never from a secret value; it is still
/// scrubbed before anyone sees it, because a URL the sandbox sent may hold one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", reason.code())]
pub struct Refusal {
    pub reason: Reason,
    /// The rule that matched (or came closest), when there was one.
    pub rule: Option<String>,
    pub message: String,
}

impl Refusal {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            reason,
            rule: None,
            message: message.into(),
        }
    }

    /// Names the rule the request was under, unless a more specific phase already did.
    #[must_use]
    pub fn under(mut self, rule: &str) -> Self {
        if self.rule.is_none() {
            self.rule = Some(rule.to_string());
        }
        self
    }
}

impl From<(Reason, String)> for Refusal {
    fn from((reason, message): (Reason, String)) -> Self {
        Self::new(reason, message)
    }
}

/// `err` and each error it was caused by, outermost first: the one walk over a chain of sources.
pub fn causes<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(err), |e| e.source())
}

/// The first error of type `T` in `err`'s chain, `err` included: how a failure deep inside
/// hyper's client is traced back to the cause latchkey gave it (a guard refusal, a body the
/// detector cut off) and so to its reason.
pub fn find_cause<'a, T: std::error::Error + 'static>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    causes(err).find_map(|e| e.downcast_ref::<T>())
}

/// `a: b: c` from an error and its sources: the one line an error is reported as, everywhere (a
/// refusal's detail, a failed upload, the command line's last word). A cause the text already
/// ends with is left out: a `thiserror` message that quotes its source would otherwise print it
/// twice.
pub fn chain_text(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    for cause in causes(err).skip(1) {
        let cause = cause.to_string();
        if !out.ends_with(&cause) {
            out.push_str(": ");
            out.push_str(&cause);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_reason_has_a_unique_snake_case_code_and_a_status() {
        let mut seen = HashSet::new();
        for r in Reason::ALL {
            let code = r.code();
            assert!(seen.insert(code), "duplicate code {code}");
            assert!(code.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
            let s = r.status();
            if r.is_allow() && !matches!(r, Reason::Allowed | Reason::Tunnel) {
                assert!(s.is_server_error(), "{code}");
            } else if matches!(
                r,
                Reason::SecretUnavailable
                    | Reason::TooManyConnections
                    | Reason::AuditUnavailable
                    | Reason::TooBusy
                    | Reason::StateUnavailable
                    | Reason::LimitsUnavailable
            ) {
                assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
            } else if !r.is_allow() {
                assert!(s.is_client_error(), "{code}");
            }
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner")]
    struct Inner;

    #[test]
    fn a_cause_is_found_anywhere_in_the_chain_and_the_chain_reads_outermost_first() {
        let e = Outer(Inner);
        assert!(find_cause::<Inner>(&e).is_some());
        assert!(find_cause::<Outer>(&e).is_some());
        assert!(find_cause::<Refusal>(&e).is_none());
        assert_eq!(chain_text(&e), "outer: inner");
        assert_eq!(chain_text(&Inner), "inner");
    }
}

//! The authority a captured plain-HTTP connection names: its first request's `Host`, found
//! before the connection gate ([`super::super::gate`]) admits and decides it as that request.
//! Pure reading of the head; nothing here decides, resolves or dials.

use crate::audit::{redact_query, Entry};
use crate::reason::{Reason, Refusal};

use super::first::Head;

/// What a first request head names: the `Host` as sent, and the path policy matches.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Named<'h> {
    /// Its `host()` is the host as sent.
    pub authority: http::uri::Authority,
    /// Without the query, `/` at least.
    pub path: &'h str,
}

/// Finds the authority `head` names on a connection to `port`: exactly one `Host`, a
/// `host[:port]` without userinfo, naming no other port. The record names the method, the path
/// (its query redacted) and the `Host` as sent. `uri` is the head's target, parsed.
pub(super) fn named<'h>(
    entry: &mut Entry,
    head: &'h Head,
    uri: &'h http::Uri,
    port: u16,
) -> Result<Named<'h>, Refusal> {
    entry.set_method(&head.method);
    entry.set_path(redact_query(
        uri.path_and_query().map_or("/", |pq| pq.as_str()),
    ));
    let value = match head.hosts.as_slice() {
        [one] => one,
        [] => {
            return Err(Refusal::new(
                Reason::BadRequest,
                "a Host header is required: it names the host policy decides",
            ))
        }
        _ => {
            return Err(Refusal::new(
                Reason::BadRequest,
                "more than one Host header",
            ))
        }
    };
    entry.set_host(value);
    let authority = value.parse::<http::uri::Authority>().map_err(|_| {
        Refusal::new(
            Reason::BadRequest,
            format!("Host {value:?} is not host[:port]"),
        )
    })?;
    if authority.as_str().contains('@') {
        return Err(Refusal::new(
            Reason::UserinfoInUrl,
            "Host carries userinfo ('@')",
        ));
    }
    if let Some(named) = authority.port_u16().filter(|p| *p != port) {
        return Err(Refusal::new(
            Reason::HostMismatch,
            format!("Host names port {named}, but the connection is to port {port}"),
        ));
    }
    let path = match uri.path() {
        "" => "/",
        p => p,
    };
    Ok(Named { authority, path })
}

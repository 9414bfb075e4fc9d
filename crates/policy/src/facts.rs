//! What a rule grants beyond matching its requests — a secret or credential bound to its hosts,
//! `mode = "report"`, `allow_private`, `websocket`, `dangerously_allow_cleartext`, where
//! placeholders are replaced, headers kept, `ask`, `mcp`, `capture` — described once, in
//! [`GRANTS`]: for each kind, the facts a rule has of it, the lines reach lists for them,
//! whether gaining one widens what the rule allows, and how a change of it is worded.
//!
//! Reach ([`super::reach`]) lists these facts (its digest is over those lines), and the review
//! crate's `diff` compares them per host pattern: a new rule key that grants something beyond
//! matching is one [`Kind`] and one entry here, and both follow.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use super::ask::Ask;
use super::{Policy, Rule, Scheme};
use crate::signing::Credential;

/// What one reach line or one change of a policy diff is about; the order is the order a
/// reviewer reads changes in (secrets first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Secret,
    Credential,
    Host,
    Tunnel,
    Port,
    Method,
    Path,
    /// A `[[deny]]` table added, removed or changed (denials apply to every identity).
    Deny,
    /// A rule's predicates (`query`, `headers`, `body`, `graphql`) added, removed or changed.
    Predicate,
    ReportOnly,
    AllowPrivate,
    /// `websocket = true`: requests to the host may upgrade to a WebSocket.
    Websocket,
    Placeholders,
    KeepHeader,
    Ask,
    AskUnknown,
    /// A captured token newly bound to a host (`capture`).
    Capture,
    /// A rule's `mcp` table: adding one narrows (calls are matched), removing one widens; a
    /// changed table is both its old form removed and its new one added.
    Mcp,
    /// `dangerously_allow_cleartext = true` on a rule covering `http`: its credentials may go
    /// upstream in cleartext.
    Cleartext,
}

impl Kind {
    /// Whether a rule gaining a fact of this kind widens what it allows: true but for `ask`
    /// (a person must now approve) and `mcp` (calls are now matched). A kind that is no rule
    /// fact (`[ask] unknown`: anything may now be asked for) widens when gained too.
    pub fn widens_when_gained(self) -> bool {
        grant(self).is_none_or(|g| g.widens)
    }
}

/// One fact a rule has; it holds on each of the rule's host patterns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact {
    pub kind: Kind,
    /// The secret, credential, CIDR, place, header, captured token or `mcp` summary; empty
    /// for a flag (`websocket`, `mode = "report"`, …).
    pub detail: String,
    /// The credential's kind (`aws_sigv4`, …), for a `credential` fact whose credential exists.
    pub credential_kind: Option<String>,
    /// What reach lists for it, each line without the `rule NAME: ` prefix (none: reach does
    /// not list it).
    pub reach: Vec<String>,
}

impl Fact {
    /// A fact reach lists as one line.
    fn listed(kind: Kind, detail: impl Into<String>, line: String) -> Fact {
        Fact {
            kind,
            detail: detail.into(),
            credential_kind: None,
            reach: vec![line],
        }
    }
}

/// How a change of one fact on one host reads in a diff.
pub struct Changed<'a> {
    /// The host pattern as the rule writes it.
    pub host: &'a str,
    pub detail: &'a str,
    pub credential_kind: Option<&'a str>,
    /// Gained (true) or lost.
    pub added: bool,
}

impl Changed<'_> {
    /// `newly` or `no longer`.
    fn when(&self) -> &'static str {
        if self.added {
            "newly"
        } else {
            "no longer"
        }
    }
}

/// One kind of grant.
pub struct Grant {
    pub kind: Kind,
    /// Gaining it widens what a rule allows (false: it narrows).
    pub widens: bool,
    /// Adds the facts `rule` has of this kind (`credentials`: the policy's, for their kinds).
    facts: fn(&Rule, &HashMap<String, Arc<Credential>>, &mut Vec<Fact>),
    /// The diff's summary of a change of one such fact.
    pub change: fn(&Changed<'_>) -> String,
}

/// The secrets a rule binds, by name: a credential's key material and minted tokens are bound
/// too (`credential:NAME…`), and are the credential's fact.
fn secrets(rule: &Rule) -> impl Iterator<Item = &String> {
    rule.bound.iter().filter(|s| !s.starts_with("credential:"))
}

/// Every grant, one entry per kind of fact a rule can have.
pub const GRANTS: &[Grant] = &[
    Grant {
        kind: Kind::Secret,
        widens: true,
        facts: |rule, _, out| {
            for s in secrets(rule) {
                out.push(Fact {
                    kind: Kind::Secret,
                    detail: s.clone(),
                    credential_kind: None,
                    reach: rule
                        .hosts
                        .iter()
                        .map(|host| format!("secret {s} bound to {host}"))
                        .collect(),
                });
            }
        },
        change: |c| format!("secret {} {} bound to {}", c.detail, c.when(), c.host),
    },
    Grant {
        kind: Kind::Credential,
        widens: true,
        facts: |rule, credentials, out| {
            if let Some(c) = &rule.credential {
                let kind = credentials.get(c).map(|c| c.kind.label());
                let mut fact = Fact::listed(
                    Kind::Credential,
                    c,
                    format!("credential {c} ({})", kind.unwrap_or("unknown")),
                );
                fact.credential_kind = kind.map(str::to_string);
                out.push(fact);
            }
        },
        change: |c| {
            format!(
                "credential {} ({}) {} used on {}",
                c.detail,
                c.credential_kind.unwrap_or("unknown"),
                c.when(),
                c.host
            )
        },
    },
    Grant {
        kind: Kind::ReportOnly,
        widens: true,
        facts: |rule, _, out| {
            if rule.report {
                let line = "report-only: what it would deny goes through";
                out.push(Fact::listed(Kind::ReportOnly, "", line.to_string()));
            }
        },
        change: |c| {
            format!(
                "{}: a rule in mode = \"report\" {} (what it would deny goes through)",
                c.host,
                if c.added { "added" } else { "removed" }
            )
        },
    },
    Grant {
        kind: Kind::AllowPrivate,
        widens: true,
        facts: |rule, _, out| {
            for cidr in &rule.allow_private {
                let line = format!("allow_private {cidr}");
                out.push(Fact::listed(Kind::AllowPrivate, cidr.to_string(), line));
            }
        },
        change: |c| {
            format!(
                "{}: private range {} {} allowed",
                c.host,
                c.detail,
                c.when()
            )
        },
    },
    Grant {
        kind: Kind::Websocket,
        widens: true,
        facts: |rule, _, out| {
            if rule.websocket {
                let line = "websocket: upgrades allowed, messages relayed";
                out.push(Fact::listed(Kind::Websocket, "", line.to_string()));
            }
        },
        change: |c| format!("{}: WebSocket upgrades {} allowed", c.host, c.when()),
    },
    Grant {
        kind: Kind::Cleartext,
        widens: true,
        facts: |rule, _, out| {
            if rule.cleartext && rule.schemes.allows(Scheme::Http) {
                // A tunnel relays CONNECT bytes only: reach does not list it there.
                let line =
                    "dangerously_allow_cleartext: credentials may go upstream over plain http";
                let mut fact = Fact::listed(Kind::Cleartext, "", line.to_string());
                if rule.tunnel {
                    fact.reach.clear();
                }
                out.push(fact);
            }
        },
        change: |c| {
            format!(
                "{}: credentials {} sent over plain http (dangerously_allow_cleartext = true)",
                c.host,
                c.when()
            )
        },
    },
    Grant {
        kind: Kind::Placeholders,
        widens: true,
        facts: |rule, _, out| {
            let secrets = secrets(rule).next().is_some();
            if secrets || rule.credential.is_some() {
                for place in &rule.placeholders {
                    let line = format!("placeholders in {}", place.as_str());
                    let mut fact = Fact::listed(Kind::Placeholders, place.as_str(), line);
                    // Reach lists where a rule's own secrets' placeholders are replaced.
                    if !secrets {
                        fact.reach.clear();
                    }
                    out.push(fact);
                }
            }
        },
        change: |c| {
            format!(
                "{}: placeholders {} replaced in the {}",
                c.host,
                c.when(),
                c.detail
            )
        },
    },
    Grant {
        kind: Kind::KeepHeader,
        widens: true,
        facts: |rule, _, out| {
            for h in &rule.keep_headers {
                let line = format!("keeps header {h}");
                out.push(Fact::listed(Kind::KeepHeader, h.as_str(), line));
            }
        },
        change: |c| {
            format!(
                "{}: header {} {} passed through unstripped",
                c.host,
                c.detail,
                c.when()
            )
        },
    },
    Grant {
        kind: Kind::Ask,
        widens: false,
        facts: |rule, _, out| {
            if let Some(ask) = &rule.ask {
                let line = format!("asks a person ({})", ask_terms(ask));
                out.push(Fact::listed(Kind::Ask, "", line));
            }
        },
        change: |c| {
            if c.added {
                format!("{}: a person must now approve requests (ask)", c.host)
            } else {
                format!(
                    "{}: requests no longer wait for a person (ask removed)",
                    c.host
                )
            }
        },
    },
    Grant {
        kind: Kind::Capture,
        widens: true,
        facts: |rule, _, out| {
            let Some(c) = &rule.capture else { return };
            let mut hosts: Vec<String> = c
                .hosts
                .iter()
                .chain(&rule.hosts)
                .map(|h| h.to_string())
                .collect();
            hosts.sort();
            hosts.dedup();
            for f in &c.fields {
                let name = c.secret_name(f);
                let line = format!("captures {name} bound to {}", hosts.join(", "));
                out.push(Fact::listed(Kind::Capture, name, line));
            }
        },
        change: |c| {
            format!(
                "captured token {} {} bound to {}",
                c.detail,
                c.when(),
                c.host
            )
        },
    },
    Grant {
        kind: Kind::Mcp,
        widens: false,
        facts: |rule, _, out| {
            if let Some(m) = &rule.mcp {
                let summary = super::reach::mcp_summary(m);
                let line = format!("mcp: {summary}");
                out.push(Fact::listed(Kind::Mcp, summary, line));
            }
        },
        change: |c| {
            let now = if c.added { "now" } else { "no longer" };
            format!("{}: MCP calls {now} limited to {}", c.host, c.detail)
        },
    },
];

/// The entry of [`GRANTS`] for `kind` (`None`: not a rule fact — host, port, `[ask] unknown`…).
pub fn grant(kind: Kind) -> Option<&'static Grant> {
    GRANTS.iter().find(|g| g.kind == kind)
}

/// Every fact `rule` has, in [`GRANTS`] order.
pub fn of(rule: &Rule, credentials: &HashMap<String, Arc<Credential>>) -> Vec<Fact> {
    let mut out = Vec::new();
    for g in GRANTS {
        (g.facts)(rule, credentials, &mut out);
    }
    out
}

impl Policy {
    /// What `rule` grants beyond matching ([`GRANTS`]), with its credential's kind.
    pub fn facts(&self, rule: &Rule) -> Vec<Fact> {
        of(rule, &self.credentials)
    }
}

/// What an approver may grant: `scopes once, 1h`.
pub(super) fn ask_terms(ask: &Ask) -> String {
    let scopes: Vec<String> = ask.scopes.iter().map(ToString::to_string).collect();
    format!("scopes {}", scopes.join(", "))
}

//! Which schemes a rule covers, and the promise built on them: a credential never travels in
//! cleartext.
//!
//! A request's scheme is how latchkey sends it upstream, fixed by how it arrived, never by its
//! port: inside an intercepted CONNECT or a TLS connection on a gateway listener it is `https`
//! (TLS to the upstream); an absolute-form `http://` request on the proxy hop, or plain HTTP on
//! a gateway or SOCKS5 connection, is `http` (cleartext), `http://host:443` included.
//!
//! A rule that brokers a credential — injects a secret (in a header, a query parameter or basic
//! auth), binds secrets (their placeholders are replaced), signs or mints with a `credential`, or
//! captures tokens — covers `https` only, unless
//! it says `dangerously_allow_cleartext = true`. A cleartext request such a rule would otherwise
//! allow is refused by [`super::Policy::decide`] with `credential_needs_tls`, before anything is
//! sent. `schemes = ["https"]` (or `["http"]`, or both) states what a rule covers; a brokering
//! rule listing `http` without the dangerous key does not load.

use super::compile::FileCx;
use super::{Rule, Scheme};
use crate::reason::Reason;

/// The schemes a rule covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schemes {
    pub http: bool,
    pub https: bool,
}

impl Schemes {
    /// Plain HTTP and HTTPS: a rule that brokers nothing, by default.
    pub const BOTH: Schemes = Schemes {
        http: true,
        https: true,
    };
    /// HTTPS only: a rule that brokers a credential, by default.
    pub const HTTPS: Schemes = Schemes {
        http: false,
        https: true,
    };

    /// Whether a request latchkey sends with `scheme` is covered.
    pub fn allows(self, scheme: Scheme) -> bool {
        match scheme {
            Scheme::Http => self.http,
            Scheme::Https => self.https,
        }
    }

    /// The schemes covered, `http` first.
    pub fn iter(self) -> impl Iterator<Item = Scheme> {
        [(Scheme::Http, self.http), (Scheme::Https, self.https)]
            .into_iter()
            .filter_map(|(s, on)| on.then_some(s))
    }

    /// `"http", "https"`, for messages.
    pub fn listed(self) -> String {
        self.iter()
            .map(|s| format!("{:?}", s.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl Rule {
    /// Whether this rule puts a credential into a request: a secret it injects (a header, a
    /// query parameter or basic auth whose template names one) or binds for placeholders, a
    /// `credential` (signed, minted), or captured tokens. A literal injected value or
    /// `{{identity}}` is policy text, not a credential latchkey holds.
    pub fn brokers(&self) -> bool {
        !self.bound.is_empty() || self.credential.is_some() || self.capture.is_some()
    }

    /// Why a request this rule would allow, sent with a scheme it does not cover, is refused:
    /// `credential_needs_tls` for cleartext under a rule that brokers, else
    /// `scheme_not_allowed`.
    pub fn scheme_refusal(&self, scheme: Scheme) -> Reason {
        if scheme == Scheme::Http && self.brokers() {
            Reason::CredentialNeedsTls
        } else {
            Reason::SchemeNotAllowed
        }
    }

    /// What [`Self::brokers`], for messages: `secret(s) "openai" and credential "gh"`; `None`
    /// when it brokers nothing.
    pub fn brokered(&self) -> Option<String> {
        let secrets: Vec<String> = self
            .bound
            .iter()
            .filter(|n| !n.starts_with("credential:"))
            .map(|n| format!("{n:?}"))
            .collect();
        let mut parts = Vec::new();
        if !secrets.is_empty() {
            parts.push(format!("secret(s) {}", secrets.join(", ")));
        }
        if let Some(c) = &self.credential {
            parts.push(format!("credential {c:?}"));
        }
        if let Some(c) = &self.capture {
            let names: Vec<String> = c
                .fields
                .iter()
                .map(|f| format!("{:?}", c.secret_name(f)))
                .collect();
            parts.push(format!("captured token(s) {}", names.join(", ")));
        }
        (!parts.is_empty()).then(|| parts.join(" and "))
    }
}

/// A rule's `schemes` and `dangerously_allow_cleartext`, as read.
pub(super) struct RawSchemes {
    pub schemes: Option<toml::Spanned<Vec<toml::Spanned<String>>>>,
    pub cleartext: Option<toml::Spanned<bool>>,
}

/// What the rest of the rule says that `schemes` depends on.
struct RuleShape<'a> {
    /// `rules[N]`, for messages.
    pub at: &'a str,
    /// What the rule brokers ([`Rule::brokered`]'s words), `None` when nothing.
    pub brokers: Option<&'a str>,
    pub tunnel: bool,
}

const SCHEMES: &[&str] = &["https", "http"];

impl FileCx<'_> {
    /// Sets `rule`'s schemes and `dangerously_allow_cleartext` (its capture's too) from what
    /// `rules[index]` says, once the rest of it is known.
    pub(super) fn rule_schemes(&mut self, rule: &mut Rule, raw: RawSchemes, index: usize) {
        let brokered = rule.brokered();
        let shape = RuleShape {
            at: &format!("rules[{index}]"),
            brokers: brokered.as_deref(),
            tunnel: rule.tunnel,
        };
        (rule.schemes, rule.cleartext) = self.schemes(raw, &shape);
        if let Some(c) = rule.capture.as_mut() {
            c.cleartext = rule.cleartext;
        }
    }

    /// Validates `schemes` and `dangerously_allow_cleartext`: returns the schemes the rule covers
    /// and whether its credentials may travel in cleartext. Every problem is recorded.
    fn schemes(&mut self, raw: RawSchemes, rule: &RuleShape<'_>) -> (Schemes, bool) {
        let at = rule.at;
        let cleartext = raw.cleartext.as_ref().is_some_and(|c| *c.get_ref());
        let Some(list) = raw.schemes else {
            return match (rule.brokers, cleartext) {
                (Some(_), false) => (Schemes::HTTPS, false),
                _ => (Schemes::BOTH, cleartext),
            };
        };
        let span = list.span();
        let list = list.into_inner();
        if rule.tunnel {
            self.error(
                span.clone(),
                format!("{at}.schemes: a tunnel rule relays CONNECT bytes latchkey cannot see, so schemes do not apply; remove the key"),
            );
        }
        if list.is_empty() {
            self.error(
                span,
                format!(
                    "{at}.schemes: an empty list allows nothing; remove the key for the default"
                ),
            );
            return (Schemes::HTTPS, cleartext);
        }
        let mut out = Schemes {
            http: false,
            https: false,
        };
        for (i, s) in list.iter().enumerate() {
            let field = format!("{at}.schemes[{i}]");
            let text = s.get_ref();
            let slot = match text.as_str() {
                "https" => &mut out.https,
                "http" => &mut out.http,
                other => {
                    let hint = scheme_hint(other)
                        .map_or_else(String::new, |h| format!("; did you mean {h:?}?"));
                    self.error(
                        s.span(),
                        format!(
                            "{field}: unknown scheme {other:?}: use \"https\" or \"http\"{hint}"
                        ),
                    );
                    continue;
                }
            };
            if *slot {
                self.error(s.span(), format!("{field}: {text:?} is listed twice"));
            }
            *slot = true;
            if text == "http" && !cleartext {
                if let Some(what) = rule.brokers {
                    self.error(
                        s.span(),
                        format!("{field}: the rule brokers {what}, which over http would travel in cleartext to anyone on the path; remove \"http\" (a credential goes upstream only inside TLS), or set dangerously_allow_cleartext = true to accept that"),
                    );
                }
            }
        }
        (out, cleartext)
    }
}

/// The scheme a misspelt one most likely meant.
fn scheme_hint(text: &str) -> Option<&'static str> {
    let lower = text.trim().to_ascii_lowercase();
    let lower = lower.trim_end_matches("://");
    match lower {
        "https" | "wss" | "tls" | "ssl" | "h2" => Some("https"),
        "http" | "ws" | "h2c" => Some("http"),
        other => super::read::closest(other, SCHEMES),
    }
}

#[cfg(test)]
#[path = "schemes_tests.rs"]
mod tests;

//! Asking a person: the compiled form of a rule's `ask = { … }`, the policy-wide `[ask]` table
//! and the `[notify.NAME]` webhooks that tell approvers something waits for them.
//!
//! Policy only says *what* needs a person and who hears of it; holding requests, storing
//! approvals and delivering notifications is `governance`'s job.

use std::time::Duration;

use super::Origin;

/// How long a grant lasts once a person approves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// This one request (identity, method, URL and body hash): used once, then gone.
    Once,
    /// Every request of this identity under this rule to this host, for this long (`1h`, `30m`).
    For(Duration),
    /// Every request of this identity under this rule to this host until the identity's token
    /// changes (for an identity recognised by source address only: until its sources change).
    Session,
}

impl Scope {
    /// Parses `once`, `session` or a duration (`1h`, `30m`, `1d`; at least one second).
    pub fn parse(text: &str) -> Result<Scope, String> {
        match text.trim() {
            "once" => Ok(Scope::Once),
            "session" => Ok(Scope::Session),
            other => match humantime::parse_duration(other) {
                Ok(d) if d >= Duration::from_secs(1) => Ok(Scope::For(d)),
                Ok(_) => Err(format!("scope {other:?} is shorter than one second")),
                Err(_) => Err(format!(
                    "scope {other:?} is not \"once\", \"session\" or a duration such as \"1h\""
                )),
            },
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Once => f.write_str("once"),
            Scope::Session => f.write_str("session"),
            Scope::For(d) => f.write_str(&humantime::format_duration(*d).to_string()),
        }
    }
}

/// A rule's (or `[ask]`'s) terms for asking: how long to hold the request, what a person may
/// grant, what they are told, and which notifiers hear of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// How long the request waits for an answer before `approval_pending` (0: not held, the
    /// sandbox retries).
    pub hold: Duration,
    /// The scopes an approver may choose from; the first is the default. Never empty.
    pub scopes: Vec<Scope>,
    /// A sentence shown to the approver (from policy; no secret).
    pub message: Option<String>,
    /// The `[notify.NAME]` webhooks told of each approval request (empty: all of them).
    pub notify: Vec<String>,
}

impl Default for Ask {
    fn default() -> Self {
        Ask {
            hold: Duration::from_secs(30),
            scopes: vec![Scope::Once],
            message: None,
            notify: Vec::new(),
        }
    }
}

/// The policy-wide `[ask]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskPolicy {
    /// `unknown = true`: a request no rule allows becomes an approval request instead of a
    /// denial. Off by default: deny by default stays.
    pub unknown: bool,
    /// The terms for `unknown` requests, and the defaults a rule's `ask` starts from.
    pub terms: Ask,
    /// At most this many new approval requests per identity per `rate_window` (no approval
    /// spam); a request over the cap is refused `rate_limited` without asking anyone.
    pub rate: u32,
    pub rate_window: Duration,
    /// An approval nobody answered expires after this long (the retry then asks again).
    pub expire: Duration,
    /// Where `[ask]` was written, if it was.
    pub origin: Option<Origin>,
}

impl Default for AskPolicy {
    fn default() -> Self {
        AskPolicy {
            unknown: false,
            terms: Ask::default(),
            rate: 10,
            rate_window: Duration::from_secs(60),
            expire: Duration::from_secs(3600),
            origin: None,
        }
    }
}

/// The body a webhook receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyFormat {
    /// latchkey's own JSON event.
    Json,
    /// A Slack-compatible message (`text` and `blocks`, with approve/deny buttons: links, or
    /// with `signing_secret` interactive buttons answered in place).
    Slack,
}

/// `[notify.NAME]`: a webhook told of approval requests and decisions.
#[derive(Debug, Clone)]
pub struct Notifier {
    pub name: String,
    /// `https://…` (or `http://…`); sent through the guarded dialer like any upstream.
    pub url: url::Url,
    /// Whether `secret = "…"` was given: its value is in the secret store under
    /// [`notify_secret_key`] and signs every delivery (HMAC-SHA256).
    pub signed: bool,
    pub format: NotifyFormat,
    /// Whether `signing_secret = "…"` was given (`format = "slack"` only): Slack's request
    /// signing secret is in the secret store under [`slack_signing_key`], the message's buttons
    /// are interactive (no link) and `POST /slack/actions/NAME` answers them.
    pub interactive: bool,
    /// `approvers`: the Slack user IDs who may answer from the message; empty: anyone who can
    /// click in the channel. Only with `signing_secret`.
    pub approvers: Vec<String>,
    pub origin: Origin,
}

/// The secret store key of a notifier's signing secret (not a valid secret name, so never
/// clashes with one).
pub fn notify_secret_key(notifier: &str) -> String {
    format!("notify:{notifier}")
}

/// The secret store key of a Slack notifier's request signing secret (`signing_secret`); a
/// notifier name has no `:`, so it never clashes with [`notify_secret_key`].
pub fn slack_signing_key(notifier: &str) -> String {
    format!("notify:{notifier}:signing_secret")
}

/// Whether `id` has the form of a Slack user ID: `U` or `W`, then upper-case letters and
/// digits (`U012AB3CD`), at most 32 characters in all.
pub fn is_slack_user_id(id: &str) -> bool {
    let mut chars = id.chars();
    matches!(chars.next(), Some('U' | 'W'))
        && (3..=32).contains(&id.len())
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

/// Why a request needs a person: under which rule (`None`: `[ask] unknown`), on which terms.
#[derive(Debug, Clone, Copy)]
pub struct Asking<'p> {
    /// The rule with `ask` that allows the request; `None` when no rule allows it and
    /// `[ask] unknown = true` turned the denial into a question.
    pub rule: Option<&'p super::Rule>,
    pub terms: &'p Ask,
}

impl Asking<'_> {
    /// The name approvals and grants use for the rule: its name, or `unknown`.
    pub fn rule_name(&self) -> &str {
        self.rule.map_or(UNKNOWN, |r| r.name.as_str())
    }
}

/// The rule name of an approval for a request no rule allows.
pub const UNKNOWN: &str = "unknown";

impl super::Policy {
    /// Whether `decision` (from [`super::Policy::decide`]) needs a person: an allow under a rule
    /// with `ask`, or — with `[ask] unknown = true` — a policy denial (`no_rule`,
    /// `port_not_allowed`, `method_not_allowed`, `path_not_allowed`, `identity_not_allowed`).
    /// Every other refusal stays a refusal.
    pub fn asks<'p>(&'p self, decision: &super::Decision<'p>) -> Option<Asking<'p>> {
        match decision.rule {
            Some(rule) if decision.allowed() => rule.ask.as_ref().map(|terms| Asking {
                rule: Some(rule),
                terms,
            }),
            // A `[[deny]]` is never put to a person.
            _ if self.ask.unknown
                && decision.reason.is_policy_denial()
                && decision.reason != crate::reason::Reason::DeniedByRule =>
            {
                Some(Asking {
                    rule: None,
                    terms: &self.ask.terms,
                })
            }
            _ => None,
        }
    }

    /// The notifiers told of an approval asked on `terms`: those it names, or every one when it
    /// names none. Names are checked at load, so each named one exists.
    pub fn notifiers_for<'p>(&'p self, terms: &'p Ask) -> impl Iterator<Item = &'p Notifier> {
        self.notifiers
            .iter()
            .filter(move |n| terms.notify.is_empty() || terms.notify.contains(&n.name))
    }
}

//! Validation of the approvals keys: a rule's `ask = { … }`, the policy-wide `[ask]` table, the
//! `[notify.NAME]` webhooks and identities' `labels`. Every problem is reported at its
//! `file:line:col` with the field it concerns; only valid terms become an [`Ask`],
//! [`AskPolicy`] or [`Notifier`].
//!
//! Policy only: this knows nothing of how requests are held, approvals stored or webhooks
//! delivered (`governance`), and reads no secret value (a notifier's signing secret is
//! registered with the secret store like any other source).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use toml::Spanned;

use super::ask::{
    is_slack_user_id, notify_secret_key, slack_signing_key, Ask, AskPolicy, Notifier, NotifyFormat,
    Scope,
};
use super::compile::{line_col, FileCx, PolicyError};
use super::schema::{Entry, RawAsk, RawNotify, RawPolicyFile, StringMap};
use super::Origin;
use crate::secrets::Source;

/// The longest a request may be held: a held request keeps the client's connection open.
pub const MAX_HOLD: Duration = Duration::from_secs(10 * 60);
/// The longest grant scope and approval lifetime. Access wanted for longer is a policy change
/// for review (`latchkey approvals export`), not a standing approval.
pub const MAX_GRANT: Duration = Duration::from_secs(30 * 24 * 3600);
/// The shortest `[ask] expire`: a person needs time to see and answer.
pub const MIN_EXPIRE: Duration = Duration::from_secs(60);
/// At most this many labels per identity, each value at most [`MAX_LABEL_VALUE`] bytes: they
/// are copied into every approval and audit record.
pub const MAX_LABELS: usize = 32;
pub const MAX_LABEL_VALUE: usize = 256;
const MAX_LABEL_KEY: usize = 64;
/// An approver's message is one short sentence.
const MAX_MESSAGE: usize = 500;

/// What rules' `ask` tables resolve against.
pub(super) struct AskDefaults {
    /// `[ask]`'s terms: a rule's missing keys take these.
    pub terms: Ask,
    /// `[ask] expire`: no request is held longer than its approval lives.
    pub expire: Duration,
    /// Every `[notify.NAME]` declared (valid or not, so a broken one is reported once).
    pub notifiers: BTreeSet<String>,
}

/// A notifier's secret, to register under its store key ([`notify_secret_key`] for `secret`,
/// [`slack_signing_key`] for `signing_secret`): the file's index, the key, the span of the
/// value, the notifier's origin and the source.
pub(super) type NotifySecret = (usize, String, Range<usize>, Origin, Source);

/// A notifier's secret as one table gives it: store key, span of the value, source.
type FoundSecret = (String, Range<usize>, Source);

/// Compiles every file's `[notify.NAME]` tables and the one `[ask]` table. Returns the policy's
/// `[ask]`, its notifiers (sorted by name), what rules resolve against, and the signing secrets
/// to register.
pub(super) fn compile_asks(
    parsed: &mut [(&Path, &str, RawPolicyFile)],
    errors: &mut Vec<PolicyError>,
) -> (AskPolicy, Vec<Notifier>, AskDefaults, Vec<NotifySecret>) {
    let mut notifiers: Vec<Notifier> = Vec::new();
    let mut secrets = Vec::new();
    let mut declared: BTreeMap<String, Origin> = BTreeMap::new();
    for (fi, (file, text, raw)) in parsed.iter_mut().enumerate() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        for (name, entry) in std::mem::take(&mut raw.notify) {
            let d = cx.declare("notify", "notifier", name, &mut declared);
            let (name, origin) = (d.name, d.origin);
            let (notifier, found) = cx.notifier(&d.field, &name, entry, origin.clone());
            if d.unique {
                for (key, span, source) in found {
                    secrets.push((fi, key, span, origin.clone(), source));
                }
                notifiers.extend(notifier);
            }
        }
    }
    notifiers.sort_by(|a, b| a.name.cmp(&b.name));
    let names: BTreeSet<String> = declared.into_keys().collect();

    let mut policy = AskPolicy::default();
    let mut first: Option<Origin> = None;
    for (file, text, raw) in parsed.iter_mut() {
        let Some(entry) = raw.ask.take() else {
            continue;
        };
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        let origin = Origin {
            file: file.to_path_buf(),
            line: line_col(text, entry.span.start).0,
        };
        if let Some(first) = &first {
            cx.error(
                entry.span,
                format!("ask: a second [ask] table; the first is at {first}: a policy takes one [ask], so merge them"),
            );
            continue;
        }
        first = Some(origin.clone());
        if let Some(compiled) = cx.ask_policy(entry, &names, origin) {
            policy = compiled;
        }
    }
    let defaults = AskDefaults {
        terms: policy.terms.clone(),
        expire: policy.expire,
        notifiers: names,
    };
    (policy, notifiers, defaults, secrets)
}

impl FileCx<'_> {
    /// Validates one `[notify.NAME]`: the notifier if it is valid, and the sources of its
    /// secrets that parsed, each with its store key and span (registered even beside other
    /// problems, so a missing value is reported in the same run).
    fn notifier(
        &mut self,
        field: &str,
        name: &str,
        entry: Entry<RawNotify>,
        origin: Origin,
    ) -> (Option<Notifier>, Vec<FoundSecret>) {
        let before = self.errors.len();
        let raw = entry.raw;
        // A missing or mistyped url was reported while reading.
        let url = raw.url.as_ref().and_then(|u| self.notify_url(field, u));
        let mut secrets = Vec::new();
        for (key, store_key, given) in [
            ("secret", notify_secret_key(name), &raw.secret),
            (
                "signing_secret",
                slack_signing_key(name),
                &raw.signing_secret,
            ),
        ] {
            let Some(s) = given else { continue };
            let (ttl, timeout) = (Duration::from_secs(300), Duration::from_secs(10));
            match Source::parse(s.get_ref(), ttl, timeout) {
                Ok(source) => secrets.push((store_key, s.span(), source)),
                Err(e) => self.error(s.span(), format!("{field}.{key}: {e}")),
            }
        }
        let format = match &raw.format {
            None => Some(NotifyFormat::Json),
            Some(f) => {
                match f.get_ref().as_str() {
                    "json" => Some(NotifyFormat::Json),
                    "slack" => Some(NotifyFormat::Slack),
                    other => {
                        self.error(
                        f.span(),
                        format!("{field}.format: unknown format {other:?}: use \"json\" or \"slack\""),
                    );
                        None
                    }
                }
            }
        };
        let approvers = self.slack_terms(field, &raw, format);
        let valid = entry.complete && self.errors.len() == before;
        let notifier = match (url, format, valid) {
            (Some(url), Some(format), true) => Some(Notifier {
                name: name.to_string(),
                url,
                signed: raw.secret.is_some(),
                format,
                interactive: raw.signing_secret.is_some(),
                approvers,
                origin,
            }),
            _ => None,
        };
        (notifier, secrets)
    }

    /// Checks `signing_secret` (a `format = "slack"` notifier's only) and `approvers` (only
    /// beside `signing_secret`: a non-empty list of Slack user IDs, each once); the approvers.
    fn slack_terms(
        &mut self,
        field: &str,
        raw: &RawNotify,
        format: Option<NotifyFormat>,
    ) -> Vec<String> {
        if let (Some(s), Some(NotifyFormat::Json)) = (&raw.signing_secret, format) {
            self.error(
                s.span(),
                format!("{field}.signing_secret: only a format = \"slack\" notifier answers from its buttons; set format = \"slack\" or remove signing_secret"),
            );
        }
        let Some(list) = &raw.approvers else {
            return Vec::new();
        };
        if raw.signing_secret.is_none() {
            self.error(
                list.span(),
                format!("{field}.approvers: approvers need signing_secret: without it the buttons are links that whoever holds the message can open, so nobody could be held to the list"),
            );
            return Vec::new();
        }
        if list.get_ref().is_empty() {
            self.error(
                list.span(),
                format!("{field}.approvers: an empty list: nobody could answer; remove the key to let anyone who can click in the channel answer"),
            );
        }
        let mut approvers: Vec<String> = Vec::new();
        for (i, id) in list.get_ref().iter().enumerate() {
            let text = id.get_ref();
            if !is_slack_user_id(text) {
                self.error(
                    id.span(),
                    format!("{field}.approvers[{i}]: {text:?} is not a Slack user ID (U or W, then upper-case letters and digits, as in U012AB3CD)"),
                );
            } else if approvers.contains(text) {
                self.error(
                    id.span(),
                    format!("{field}.approvers[{i}]: {text:?} is listed twice"),
                );
            } else {
                approvers.push(text.clone());
            }
        }
        approvers
    }

    /// A webhook URL: absolute `http`/`https` with a host, no userinfo, query or fragment (a
    /// credential there would be logged and shown; `secret` signs deliveries instead).
    fn notify_url(&mut self, field: &str, raw: &Spanned<String>) -> Option<url::Url> {
        let at = format!("{field}.url");
        let problem = match url::Url::parse(raw.get_ref()) {
            Err(e) => Some(format!("not an absolute URL ({e})")),
            Ok(u) if !matches!(u.scheme(), "http" | "https") => Some(format!(
                "scheme {:?}: a webhook URL is http:// or https://",
                u.scheme()
            )),
            Ok(u) if u.host_str().is_none_or(str::is_empty) => Some("no host".to_string()),
            Ok(u) if !u.username().is_empty() || u.password().is_some() => Some(
                "it carries a user or password ('@'): credentials do not belong in a URL; use secret = \"env:…\" to sign deliveries".to_string(),
            ),
            Ok(u) if u.query().is_some() => Some(
                "it has a query ('?'): a token there would be logged and shown to approvers; use secret = \"env:…\" to sign deliveries".to_string(),
            ),
            Ok(u) if u.fragment().is_some() => Some("it has a fragment ('#')".to_string()),
            Ok(u) => return Some(u),
        };
        // The URL is not echoed: a mistyped one may still hold something private.
        if let Some(why) = problem {
            self.error(raw.span(), format!("{at}: {why}"));
        }
        None
    }

    /// Validates the `[ask]` table; `None` if it has a problem (recorded).
    fn ask_policy(
        &mut self,
        entry: Entry<RawAsk>,
        notifiers: &BTreeSet<String>,
        origin: Origin,
    ) -> Option<AskPolicy> {
        let before = self.errors.len();
        let raw = entry.raw;
        let defaults = AskPolicy::default();
        let expire = match &raw.expire {
            None => Some(defaults.expire),
            Some(e) => self.duration("ask.expire", e, MIN_EXPIRE, MAX_GRANT),
        };
        let rate = match &raw.rate {
            None => Some((defaults.rate, defaults.rate_window)),
            Some(r) => match parse_rate(r.get_ref()) {
                Ok(rate) => Some(rate),
                Err(why) => {
                    self.error(r.span(), format!("ask.rate: {why}"));
                    None
                }
            },
        };
        let terms = self.ask_terms(
            "ask",
            &raw,
            &defaults.terms,
            notifiers,
            expire.unwrap_or(defaults.expire),
        );
        if !entry.complete || self.errors.len() > before {
            return None;
        }
        let (rate, rate_window) = rate?;
        Some(AskPolicy {
            unknown: raw.unknown.is_some_and(|u| *u.get_ref()),
            terms: terms?,
            rate,
            rate_window,
            expire: expire?,
            origin: Some(origin),
        })
    }

    /// Validates `hold`, `scope`, `message` and `notify` of `[ask]` or a rule's `ask`; each key
    /// not given takes `base`'s value. `None` if any has a problem (recorded).
    pub(super) fn ask_terms(
        &mut self,
        field: &str,
        raw: &RawAsk,
        base: &Ask,
        notifiers: &BTreeSet<String>,
        expire: Duration,
    ) -> Option<Ask> {
        let before = self.errors.len();
        let mut terms = base.clone();
        if let Some(h) = &raw.hold {
            let parsed = self.duration(&format!("{field}.hold"), h, Duration::ZERO, MAX_HOLD);
            match parsed {
                Some(hold) if hold > expire => self.error(
                    h.span(),
                    format!(
                        "{field}.hold: {} is longer than [ask] expire ({}): the approval would expire while the request waits",
                        humantime::format_duration(hold),
                        humantime::format_duration(expire)
                    ),
                ),
                Some(hold) => terms.hold = hold,
                None => {}
            }
        }
        if let Some(list) = &raw.scope {
            terms.scopes = self.scopes(&format!("{field}.scope"), list);
        }
        if let Some(m) = &raw.message {
            let text = m.get_ref().trim();
            let why = if text.is_empty() {
                Some("empty; remove the key for no message".to_string())
            } else if text.len() > MAX_MESSAGE {
                Some(format!(
                    "longer than {MAX_MESSAGE} bytes: one short sentence"
                ))
            } else if text.chars().any(char::is_control) {
                Some("contains a control character (a newline?): one line".to_string())
            } else {
                None
            };
            match why {
                Some(why) => self.error(m.span(), format!("{field}.message: {why}")),
                None => terms.message = Some(text.to_string()),
            }
        }
        if let Some(list) = &raw.notify {
            terms.notify = self.notify_names(&format!("{field}.notify"), list, notifiers);
        }
        (self.errors.len() == before).then_some(terms)
    }

    /// A duration between `min` and `max`, reported at the value otherwise.
    fn duration(
        &mut self,
        field: &str,
        raw: &Spanned<String>,
        min: Duration,
        max: Duration,
    ) -> Option<Duration> {
        let fmt = |d| humantime::format_duration(d).to_string();
        let why = match humantime::parse_duration(raw.get_ref().trim()) {
            Err(_) => format!(
                "{:?} is not a duration like \"30s\" or \"5m\"",
                raw.get_ref()
            ),
            Ok(d) if d < min => format!("{:?} is shorter than {}", raw.get_ref(), fmt(min)),
            Ok(d) if d > max => format!("{:?} is longer than {}", raw.get_ref(), fmt(max)),
            Ok(d) => return Some(d),
        };
        self.error(raw.span(), format!("{field}: {why}"));
        None
    }

    /// `scope = ["once", "1h", "session"]`: non-empty, each a [`Scope`], no duplicates, a
    /// duration at most [`MAX_GRANT`].
    fn scopes(&mut self, field: &str, list: &Spanned<Vec<Spanned<String>>>) -> Vec<Scope> {
        if list.get_ref().is_empty() {
            self.error(
                list.span(),
                format!("{field}: an empty list offers the approver nothing; list at least one of \"once\", \"session\" or a duration such as \"1h\""),
            );
        }
        let mut out: Vec<Scope> = Vec::new();
        for (i, s) in list.get_ref().iter().enumerate() {
            let at = format!("{field}[{i}]");
            match Scope::parse(s.get_ref()) {
                Ok(Scope::For(d)) if d > MAX_GRANT => self.error(
                    s.span(),
                    format!(
                        "{at}: {:?} is longer than {}: access wanted for longer is a rule (latchkey approvals export), not a grant",
                        s.get_ref(),
                        humantime::format_duration(MAX_GRANT)
                    ),
                ),
                Ok(scope) if out.contains(&scope) => self.error(
                    s.span(),
                    format!("{at}: scope {:?} is listed twice", s.get_ref()),
                ),
                Ok(scope) => out.push(scope),
                Err(why) => self.error(s.span(), format!("{at}: {why}")),
            }
        }
        out
    }

    /// `notify = ["ops"]`: names of `[notify.NAME]` tables, each once.
    fn notify_names(
        &mut self,
        field: &str,
        list: &Spanned<Vec<Spanned<String>>>,
        notifiers: &BTreeSet<String>,
    ) -> Vec<String> {
        if list.get_ref().is_empty() {
            self.error(
                list.span(),
                format!("{field}: an empty list; remove the key to tell every [notify.*] webhook"),
            );
        }
        let mut out: Vec<String> = Vec::new();
        for (i, n) in list.get_ref().iter().enumerate() {
            let name = n.get_ref();
            if !notifiers.contains(name) {
                let known = if notifiers.is_empty() {
                    "the policy declares none".to_string()
                } else {
                    format!(
                        "declared: {}",
                        notifiers.iter().cloned().collect::<Vec<_>>().join(", ")
                    )
                };
                self.error(
                    n.span(),
                    format!(
                        "{field}[{i}]: unknown notifier {name:?}{}: declare [notify.{name}] with a url ({known})",
                        super::did_you_mean(name, notifiers.iter().map(String::as_str))
                    ),
                );
            } else if out.contains(name) {
                self.error(
                    n.span(),
                    format!("{field}[{i}]: notifier {name:?} is listed twice"),
                );
            } else {
                out.push(name.clone());
            }
        }
        out
    }

    /// `labels = { sandbox = "run-42" }`: keys `[a-z0-9_.-]`, string values of at most
    /// [`MAX_LABEL_VALUE`] bytes without control characters, at most [`MAX_LABELS`].
    pub(super) fn labels(
        &mut self,
        field: &str,
        raw: Option<Spanned<StringMap>>,
    ) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let Some(raw) = raw else {
            return out;
        };
        let span = raw.span();
        let labels = raw.into_inner();
        if labels.len() > MAX_LABELS {
            self.error(
                span,
                format!(
                    "{field}: {} labels; at most {MAX_LABELS} (they are copied into every approval)",
                    labels.len()
                ),
            );
        }
        for (k, v) in labels {
            let key = k.get_ref();
            let at = format!("{field}.{key}");
            let key_ok = !key.is_empty()
                && key.len() <= MAX_LABEL_KEY
                && key.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
                });
            if !key_ok {
                self.error(
                    k.span(),
                    format!("{at}: label keys use lower-case letters, digits, '_', '.' and '-' (at most {MAX_LABEL_KEY})"),
                );
                continue;
            }
            let value = v.get_ref();
            if value.len() > MAX_LABEL_VALUE {
                self.error(
                    v.span(),
                    format!("{at}: value longer than {MAX_LABEL_VALUE} bytes"),
                );
            } else if value.chars().any(char::is_control) {
                self.error(
                    v.span(),
                    format!("{at}: value contains a control character"),
                );
            } else {
                out.insert(key.clone(), value.clone());
            }
        }
        out
    }
}

/// `"10/min"`: at most N (≥ 1) new approval requests per identity per second, minute, hour or
/// day.
pub fn parse_rate(text: &str) -> Result<(u32, Duration), String> {
    let bad = || {
        format!("{text:?} is not a rate like \"10/min\" (N/s, N/min, N/h or N/day, N at least 1)")
    };
    let (n, unit) = text.trim().split_once('/').ok_or_else(bad)?;
    let n: u32 = n.trim().parse().map_err(|_| bad())?;
    let window = match unit.trim() {
        "s" | "sec" => 1,
        "min" => 60,
        "h" | "hour" => 3600,
        "day" => 86_400,
        _ => return Err(bad()),
    };
    if n == 0 {
        return Err(bad());
    }
    Ok((n, Duration::from_secs(window)))
}

//! Validation of `[profiles.NAME]` (compile phase 3c): each profile's rules (or the identity it
//! inherits), labels, required labels, TTL, limits, what a session may narrow, and sources. A
//! profile compiles to an [`Identity`] with [`Identity::profile`] set, in the same namespace as
//! the identities (a name is one or the other).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::compile::{FileCx, Parsed, PolicyError};
use super::identity::{Identity, RuleSet, DEFAULT_IDENTITY};
use super::identity_compile::rule_set;
use super::limits_compile::LimitNames;
use super::profile::{Narrowable, Profile};
use super::schema::{Entry, RawProfile};
use super::Origin;

/// The longest TTL a profile may allow: sessions are for tasks, not for standing access.
pub const MAX_PROFILE_TTL: Duration = Duration::from_secs(30 * 86_400);

/// What profiles name: the rules read, the `[limits.NAME]`, and the identities compiled.
pub(super) struct Names<'a> {
    pub rules: &'a HashMap<String, Origin>,
    pub limits: &'a LimitNames,
    pub identities: &'a [Identity],
}

/// Phase 3c: the valid profiles, as identities carrying their [`Profile`].
pub(super) fn compile_profiles(
    parsed: &mut Parsed<'_>,
    errors: &mut Vec<PolicyError>,
    names: Names<'_>,
) -> Vec<Identity> {
    let mut out: Vec<Identity> = Vec::new();
    let mut taken: BTreeSet<String> = names.identities.iter().map(|i| i.name.clone()).collect();
    for (file, text, raw) in parsed.iter_mut() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        for (name, entry) in std::mem::take(&mut raw.profiles) {
            if let Some(p) = profile(&mut cx, name, entry, &names, &mut taken) {
                out.push(p);
            }
        }
    }
    out
}

/// One `[profiles.NAME]`: the profile when valid.
fn profile(
    cx: &mut FileCx<'_>,
    name: Spanned<String>,
    entry: Entry<RawProfile>,
    names: &Names<'_>,
    taken: &mut BTreeSet<String>,
) -> Option<Identity> {
    let name_span = name.span();
    let name = name.into_inner();
    let field = format!("profiles.{name}");
    let before = cx.errors.len();
    if !crate::secrets::template::valid_name(&name) {
        cx.error(
            name_span.clone(),
            format!("{field}: profile names use letters, digits, '-' and single '_'"),
        );
    } else if name == DEFAULT_IDENTITY || !taken.insert(name.clone()) {
        cx.error(
            name_span.clone(),
            format!("{field}: {name:?} is already an identity or profile, or reserved (a name is one or the other)"),
        );
    }
    let mut raw = entry.raw;
    let mut labels = cx.labels(&format!("{field}.labels"), raw.labels.take());
    let mut limits = cx.limit_list(
        &format!("{field}.limits"),
        raw.limits.take(),
        names.limits,
        false,
    );
    let rules = match (raw.rules, &raw.inherits) {
        (Some(_), Some(i)) => {
            cx.error(
                i.span(),
                format!("{field}: give rules or inherits, not both"),
            );
            RuleSet::Named(BTreeSet::new())
        }
        (Some(list), None) => rule_set(cx, &field, list, names.rules),
        (None, Some(i)) => match names.identities.iter().find(|id| &id.name == i.get_ref()) {
            Some(id) => {
                // The identity's labels and limits come with its rules; the profile's own win.
                for (k, v) in &id.labels {
                    labels.entry(k.clone()).or_insert_with(|| v.clone());
                }
                for l in &id.limits {
                    if !limits.contains(l) {
                        limits.push(l.clone());
                    }
                }
                id.rules.clone()
            }
            None => {
                let known = names.identities.iter().map(|i| i.name.as_str());
                cx.error(
                    i.span(),
                    format!(
                        "{field}.inherits: unknown identity {:?}{}",
                        i.get_ref(),
                        super::did_you_mean(i.get_ref(), known)
                    ),
                );
                RuleSet::Named(BTreeSet::new())
            }
        },
        (None, None) => {
            cx.error(
                name_span.clone(),
                format!("{field}: list the rules its sessions may use (rules = [...]) or an identity to inherit them from (inherits = \"NAME\")"),
            );
            RuleSet::Named(BTreeSet::new())
        }
    };
    let max_ttl = ttl(cx, &field, raw.ttl);
    let require_labels = required_labels(cx, &field, raw.require_labels);
    let narrowable = narrowable(cx, &field, raw.narrow);
    let mut sources = Vec::new();
    if let Some(list) = &raw.sources {
        for (i, c) in list.get_ref().iter().enumerate() {
            match crate::wire::cidr::Cidr::parse(c.get_ref()) {
                Ok(cidr) => sources.push(cidr),
                Err(e) => cx.error(c.span(), format!("{field}.sources[{i}]: {e}")),
            }
        }
    }
    if !(entry.complete && cx.errors.len() == before) {
        return None;
    }
    Some(Identity {
        profile: Some(Arc::new(Profile {
            max_ttl: max_ttl?,
            require_labels,
            narrowable,
            inherits: raw.inherits.map(Spanned::into_inner),
        })),
        name,
        has_token: false,
        sources,
        rules,
        labels,
        limits,
    })
}

/// `ttl = "8h"`: at least a second, at most [`MAX_PROFILE_TTL`].
fn ttl(cx: &mut FileCx<'_>, field: &str, raw: Option<Spanned<String>>) -> Option<Duration> {
    // Missing: reported while reading (it is required).
    let raw = raw?;
    match humantime::parse_duration(raw.get_ref()) {
        Ok(d) if d >= Duration::from_secs(1) && d <= MAX_PROFILE_TTL => Some(d),
        Ok(_) => {
            cx.error(
                raw.span(),
                format!(
                    "{field}.ttl: between 1s and 30d (sessions are for tasks, not standing access)"
                ),
            );
            None
        }
        Err(e) => {
            cx.error(
                raw.span(),
                format!(
                    "{field}.ttl: {:?} is not a duration like \"8h\": {e}",
                    raw.get_ref()
                ),
            );
            None
        }
    }
}

fn required_labels(
    cx: &mut FileCx<'_>,
    field: &str,
    raw: Option<Spanned<Vec<Spanned<String>>>>,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (i, k) in raw
        .map(Spanned::into_inner)
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let key = k.get_ref();
        let ok = !key.is_empty()
            && key.len() <= 63
            && key.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
            });
        if !ok {
            cx.error(
                k.span(),
                format!("{field}.require_labels[{i}]: label keys use lower-case letters, digits, '_', '.' and '-'"),
            );
        } else if !out.contains(key) {
            out.push(key.clone());
        }
    }
    out
}

fn narrowable(
    cx: &mut FileCx<'_>,
    field: &str,
    raw: Option<Spanned<Vec<Spanned<String>>>>,
) -> Narrowable {
    let Some(list) = raw else {
        return Narrowable::ALL;
    };
    let mut n = Narrowable {
        hosts: false,
        secrets: false,
        limits: false,
    };
    for (i, item) in list.into_inner().into_iter().enumerate() {
        match item.get_ref().as_str() {
            "hosts" => n.hosts = true,
            "secrets" => n.secrets = true,
            "limits" => n.limits = true,
            other => cx.error(
                item.span(),
                format!("{field}.narrow[{i}]: unknown {other:?}; a session may narrow \"hosts\", \"secrets\" and \"limits\" (and always a shorter ttl)"),
            ),
        }
    }
    n
}

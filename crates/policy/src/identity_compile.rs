//! Validation of `[identities.NAME]` (compile phase 3b): each identity's token, sources, rules,
//! labels and limits, and `[identities.default]` with labels only (the labels of every client
//! of a policy without identities). An identity's token joins the secret sources like any other.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Range;

use toml::Spanned;

use super::compile::{line_col, FileCx, Keyed, Parsed, PolicyError};
use super::identity::{token_key, Identity, RuleSet, DEFAULT_IDENTITY};
use super::limits_compile::LimitNames;
use super::schema::{Entry, RawIdentity};
use super::Origin;
use crate::secrets::Source;

/// What identities name: the rules read (valid or not) and the `[limits.NAME]`.
pub(super) struct Names<'a> {
    pub rules: &'a HashMap<String, Origin>,
    pub limits: &'a LimitNames,
}

/// The identities read so far: the valid ones, every name taken, and `[identities.default]`
/// with labels only (where it was, and its labels).
#[derive(Default)]
struct Read {
    identities: Vec<Identity>,
    names: HashSet<String>,
    default_labels: Option<(usize, Range<usize>, BTreeMap<String, String>)>,
}

/// Phase 3b: the valid identities and the default identity's labels; an identity's token joins
/// `keyed`.
pub(super) fn compile_identities(
    parsed: &mut Parsed<'_>,
    errors: &mut Vec<PolicyError>,
    names: Names<'_>,
    keyed: &mut Keyed,
) -> (Vec<Identity>, BTreeMap<String, String>) {
    let mut read = Read::default();
    for (fi, (file, text, raw)) in parsed.iter_mut().enumerate() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        for (name, entry) in std::mem::take(&mut raw.identities) {
            if let Some((identity, token)) = identity(&mut cx, (fi, name), entry, &names, &mut read)
            {
                if let Some((key, at, source)) = token {
                    keyed.add(key, at, source);
                }
                if let Some(identity) = identity {
                    read.identities.push(identity);
                }
            }
        }
    }
    let Read {
        identities,
        default_labels,
        ..
    } = read;
    if let (Some((fi, span, _)), false) = (&default_labels, identities.is_empty()) {
        let (file, text, _) = &parsed[*fi];
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        let known: Vec<&str> = identities.iter().map(|i| i.name.as_str()).collect();
        cx.error(
            span.clone(),
            format!(
                "identities.{DEFAULT_IDENTITY}: its labels would never apply: a policy with identities ({}) identifies every client as one of them; put the labels on each identity",
                known.join(", ")
            ),
        );
    }
    let default_labels = default_labels.map(|(_, _, l)| l).unwrap_or_default();
    (identities, default_labels)
}

/// An identity's token source: its key, where it was declared and the source.
type Token = (String, (usize, Range<usize>, Origin), Source);

/// One `[identities.NAME]` (`at`: the file's index and the name): `None` for the default
/// identity's labels (kept in `read`), else the identity when valid and its token's source when
/// its name is unique.
fn identity(
    cx: &mut FileCx<'_>,
    at: (usize, Spanned<String>),
    mut entry: Entry<RawIdentity>,
    names: &Names<'_>,
    read: &mut Read,
) -> Option<(Option<Identity>, Option<Token>)> {
    let (fi, name) = at;
    let name_span = name.span();
    let name = name.into_inner();
    let field = format!("identities.{name}");
    let before = cx.errors.len();
    let mut unique = false;
    let labels_only = entry.raw.token.is_none()
        && entry.raw.sources.is_none()
        && entry.raw.rules.is_none()
        && entry.raw.limits.is_none();
    if name == DEFAULT_IDENTITY && labels_only && read.default_labels.is_none() {
        // The labels of every client of a policy without identities.
        let labels = cx.labels(&format!("{field}.labels"), entry.raw.labels.take());
        if entry.complete && cx.errors.len() == before {
            read.default_labels = Some((fi, name_span, labels));
        }
        return None;
    }
    if !crate::secrets::template::valid_name(&name) {
        cx.error(
            name_span.clone(),
            format!("{field}: identity names use letters, digits, '-' and single '_'"),
        );
    } else if name == DEFAULT_IDENTITY || !read.names.insert(name.clone()) {
        cx.error(
            name_span.clone(),
            format!("{field}: identity {name:?} is defined twice or reserved"),
        );
    } else {
        unique = true;
    }
    let mut raw_id = entry.raw;
    let labels = cx.labels(&format!("{field}.labels"), raw_id.labels.take());
    let id_limits = cx.limit_list(
        &format!("{field}.limits"),
        raw_id.limits.take(),
        names.limits,
        false,
    );
    let mut sources = Vec::new();
    if let Some(list) = &raw_id.sources {
        for (i, c) in list.get_ref().iter().enumerate() {
            match crate::wire::cidr::Cidr::parse(c.get_ref()) {
                Ok(cidr) => sources.push(cidr),
                Err(e) => cx.error(c.span(), format!("{field}.sources[{i}]: {e}")),
            }
        }
    }
    if raw_id.token.is_none() && sources.is_empty() {
        cx.error(
            name_span.clone(),
            format!("{field}: an identity needs a token, sources, or both"),
        );
    }
    // A missing or mistyped `rules` was reported while reading.
    let rule_set = match raw_id.rules {
        Some(list) => rule_set(cx, &field, list, names.rules),
        None => RuleSet::Named(BTreeSet::new()),
    };
    let mut token_source = None;
    if let Some(token) = &raw_id.token {
        let d = std::time::Duration::from_secs(300);
        match Source::parse(token.get_ref(), d, std::time::Duration::from_secs(10)) {
            Ok(source) => token_source = Some((token.span(), source)),
            Err(e) => cx.error(token.span(), format!("{field}.token: {e}")),
        }
    }
    let mut token = None;
    if let (Some((span, source)), true) = (token_source, unique) {
        let origin = Origin {
            file: cx.file.to_path_buf(),
            line: line_col(cx.text, name_span.start).0,
        };
        token = Some((token_key(&name), (fi, span, origin), source));
    }
    let identity = (entry.complete && cx.errors.len() == before).then(|| Identity {
        name,
        has_token: raw_id.token.is_some(),
        sources,
        rules: rule_set,
        labels,
        limits: id_limits,
        profile: None,
    });
    Some((identity, token))
}

/// An identity's `rules`: `["*"]` for every rule, else the rules named (each one known).
pub(super) fn rule_set(
    cx: &mut FileCx<'_>,
    field: &str,
    list: Spanned<Vec<Spanned<String>>>,
    rules: &HashMap<String, Origin>,
) -> RuleSet {
    let rules_span = list.span();
    let listed = list.into_inner();
    if listed.len() == 1 && listed[0].get_ref() == "*" {
        return RuleSet::All;
    }
    let mut set = BTreeSet::new();
    for (i, r) in listed.iter().enumerate() {
        if rules.contains_key(r.get_ref()) {
            set.insert(r.get_ref().clone());
        } else {
            cx.error(
                r.span(),
                format!(
                    "{field}.rules[{i}]: unknown rule {:?}{}",
                    r.get_ref(),
                    super::did_you_mean(r.get_ref(), rules.keys().map(String::as_str))
                ),
            );
        }
    }
    if listed.is_empty() {
        cx.error(
            rules_span,
            format!("{field}.rules: list the rules this identity may use, or [\"*\"]"),
        );
    }
    RuleSet::Named(set)
}

//! The shared AWS files (`~/.aws/config`, `~/.aws/credentials`): a small INI reader and the
//! resolution of one profile into a plan — the base keys (static, or a web identity) and the
//! roles to assume with them, in order. Knows no network: the calls are `aws_identity`'s.
//!
//! The reader takes `[section]` headers, `key = value` lines, whole-line comments (`#`, `;`)
//! and comments after a value when whitespace precedes them; an indented line under a key is a
//! nested property (`s3 =` / `  max_concurrent_requests = 4`) and is skipped. A line that is
//! none of these is an error naming the file and line, never the line's text (it may hold a
//! key). Config sections are `[default]` and `[profile NAME]`; credentials sections are
//! `[NAME]`; a profile's keys in the credentials file win over the same keys in config.

use std::collections::BTreeMap;

use zeroize::Zeroizing;

use crate::secrets::SecretValue;

/// One profile's settings.
pub(super) type Section = BTreeMap<String, Zeroizing<String>>;

/// Every profile of both files, merged.
#[derive(Default)]
pub(super) struct Profiles {
    pub sections: BTreeMap<String, Section>,
}

/// Which file a text came from (config names profiles `[profile NAME]`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum FileKind {
    Config,
    Credentials,
}

/// Parses one file into its sections, as written (`profile NAME` stays as it is).
pub(super) fn parse_ini(text: &str, path: &str) -> Result<Vec<(String, Section)>, String> {
    let mut out: Vec<(String, Section)> = Vec::new();
    let mut nested_ok = false;
    for (i, raw) in text.lines().enumerate() {
        let line_no = i + 1;
        let bad = |why: &str| format!("{path}:{line_no}: {why}");
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        if raw.starts_with([' ', '\t']) {
            // A nested property under `key =`; anything else indented is a continuation
            // line, which no setting latchkey reads uses.
            if nested_ok || !out.is_empty() {
                continue;
            }
            return Err(bad("an indented line outside any section"));
        }
        if let Some(rest) = trimmed.strip_prefix('[') {
            let Some(name) = rest.strip_suffix(']') else {
                return Err(bad("a section header without its closing ']'"));
            };
            let name = name.trim();
            if name.is_empty() {
                return Err(bad("an empty section name"));
            }
            out.push((
                name.split_whitespace().collect::<Vec<_>>().join(" "),
                Section::new(),
            ));
            nested_ok = false;
            continue;
        }
        let Some((key, value)) = trimmed.split_once('=') else {
            return Err(bad("expected [section] or key = value"));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(bad("a value without a key"));
        }
        let Some((_, section)) = out.last_mut() else {
            return Err(bad("a setting before any [section]"));
        };
        let value = strip_comment(value).trim();
        nested_ok = value.is_empty();
        section.insert(key.to_string(), Zeroizing::new(value.to_string()));
    }
    Ok(out)
}

/// A value without a trailing comment: `#` or `;` preceded by whitespace starts one.
fn strip_comment(value: &str) -> &str {
    let bytes = value.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if (*b == b'#' || *b == b';') && i > 0 && bytes[i - 1].is_ascii_whitespace() {
            return &value[..i];
        }
    }
    value
}

impl Profiles {
    /// Adds a file's sections; credentials files are added last so their keys win.
    pub fn add(&mut self, kind: FileKind, sections: Vec<(String, Section)>) {
        for (name, section) in sections {
            let profile = match kind {
                FileKind::Credentials => name,
                FileKind::Config if name == "default" => name,
                FileKind::Config => match name.strip_prefix("profile ") {
                    Some(p) => p.trim().to_string(),
                    // `[sso-session x]`, `[services x]`, or a bare name config does not read.
                    None => continue,
                },
            };
            self.sections.entry(profile).or_default().extend(section);
        }
    }

    pub fn get(&self, profile: &str, key: &str) -> Option<&str> {
        self.sections
            .get(profile)?
            .get(key)
            .map(|v| v.as_str())
            .filter(|v| !v.is_empty())
    }
}

/// Static keys, as a profile or the environment gives them.
pub(super) struct StaticKeys {
    pub akid: SecretValue,
    pub secret: SecretValue,
    pub token: Option<SecretValue>,
}

/// Where a profile's chain starts.
pub(super) enum Base {
    Static(StaticKeys),
    /// `role_arn` with `web_identity_token_file`: `AssumeRoleWithWebIdentity`.
    WebIdentity(WebIdentity),
}

/// A web identity: the role, the token file (read afresh at every call), the session name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WebIdentity {
    pub role_arn: String,
    pub token_file: String,
    pub session_name: String,
}

/// A role to assume with the keys before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RoleStep {
    pub profile: String,
    pub role_arn: String,
    pub session_name: String,
    pub external_id: Option<String>,
    pub duration_secs: u64,
}

/// A profile resolved: the base, then the roles to assume in order.
pub(super) struct Plan {
    pub base: Base,
    pub roles: Vec<RoleStep>,
}

/// What a profile gives.
pub(super) enum Resolved {
    /// Nothing to use (no such profile, or one without credentials): the chain goes on.
    Nothing(String),
    Plan(Plan),
    /// Configured but unusable: the chain stops here.
    Broken(String),
}

/// The longest `source_profile` chain followed.
const MAX_CHAIN: usize = 8;

/// Resolves `profile`: `explicit` when `AWS_PROFILE` named it (then its absence is an error).
pub(super) fn resolve(profiles: &Profiles, profile: &str, explicit: bool) -> Resolved {
    if !profiles.sections.contains_key(profile) {
        let why = format!("no profile {profile:?} in the shared files");
        return if explicit {
            Resolved::Broken(why)
        } else {
            Resolved::Nothing(why)
        };
    }
    let mut roles: Vec<RoleStep> = Vec::new();
    let mut current = profile.to_string();
    let base = loop {
        if roles.len() > MAX_CHAIN {
            return Resolved::Broken(format!(
                "profile {profile:?}: source_profile chain longer than {MAX_CHAIN} (a loop?)"
            ));
        }
        if !profiles.sections.contains_key(&current) {
            return Resolved::Broken(format!(
                "source_profile {current:?} is not in the shared files"
            ));
        }
        let get = |k: &str| profiles.get(&current, k).map(str::to_string);
        let Some(role_arn) = get("role_arn") else {
            match static_keys(profiles, &current) {
                Ok(Some(keys)) => break Base::Static(keys),
                Ok(None) if roles.is_empty() => {
                    return Resolved::Nothing(format!("profile {profile:?} has no credentials"))
                }
                Ok(None) => {
                    return Resolved::Broken(format!(
                        "source_profile {current:?} has no credentials"
                    ))
                }
                Err(why) => return Resolved::Broken(why),
            }
        };
        let session_name = get("role_session_name").unwrap_or_else(|| "latchkey".to_string());
        if let Some(token_file) = get("web_identity_token_file") {
            break Base::WebIdentity(WebIdentity {
                role_arn,
                token_file,
                session_name,
            });
        }
        let duration_secs = match get("duration_seconds").map(|d| d.parse::<u64>()) {
            None => 3600,
            Some(Ok(d)) if (900..=43200).contains(&d) => d,
            Some(_) => {
                return Resolved::Broken(format!(
                    "profile {current:?}: duration_seconds must be 900 to 43200"
                ))
            }
        };
        roles.push(RoleStep {
            profile: current.clone(),
            role_arn,
            session_name,
            external_id: get("external_id"),
            duration_secs,
        });
        match get("source_profile") {
            // A profile naming itself: its own static keys are the base.
            Some(s) if s == current => match static_keys(profiles, &current) {
                Ok(Some(keys)) => break Base::Static(keys),
                Ok(None) => {
                    return Resolved::Broken(format!(
                        "profile {current:?} is its own source_profile but has no static keys"
                    ))
                }
                Err(why) => return Resolved::Broken(why),
            },
            Some(s) => current = s,
            None if get("credential_source").is_some() => {
                return Resolved::Broken(format!(
                    "profile {current:?}: credential_source is not supported (use source_profile)"
                ))
            }
            None => {
                return Resolved::Broken(format!(
                    "profile {current:?}: role_arn needs source_profile or web_identity_token_file"
                ))
            }
        }
    };
    roles.reverse();
    Resolved::Plan(Plan { base, roles })
}

/// A profile's static keys: both or neither (one alone is an error naming the missing key).
fn static_keys(profiles: &Profiles, profile: &str) -> Result<Option<StaticKeys>, String> {
    let value = |k: &str| {
        profiles
            .get(profile, k)
            .map(|v| SecretValue::new(v.as_bytes().to_vec()))
    };
    match (value("aws_access_key_id"), value("aws_secret_access_key")) {
        (Some(akid), Some(secret)) => Ok(Some(StaticKeys {
            akid,
            secret,
            token: value("aws_session_token"),
        })),
        (None, None) => Ok(None),
        (Some(_), None) => Err(format!(
            "profile {profile:?} has aws_access_key_id but no aws_secret_access_key"
        )),
        (None, Some(_)) => Err(format!(
            "profile {profile:?} has aws_secret_access_key but no aws_access_key_id"
        )),
    }
}

//! Raw policy types: exactly what a policy file says, with source spans, before validation.
//!
//! Nothing here is trusted; `compile` turns these into a [`super::Policy`] or reports every
//! problem it finds. Unknown keys are errors (`deny_unknown_fields`), never silently ignored.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// One policy file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicyFile {
    #[serde(default)]
    pub rules: Vec<Spanned<RawRule>>,
}

/// One `[[rules]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    pub name: Spanned<String>,
    /// Free text for reviewers; shown by `explain`.
    #[serde(default)]
    pub description: Option<String>,
    pub hosts: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    pub ports: Option<Spanned<Vec<Spanned<i64>>>>,
    #[serde(default)]
    pub methods: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub paths: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub tunnel: Option<Spanned<bool>>,
    #[serde(default)]
    pub inject: Option<RawInject>,
}

/// `[rules.inject]`: what latchkey adds to an allowed request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInject {
    #[serde(default)]
    pub headers: BTreeMap<Spanned<String>, Spanned<String>>,
}

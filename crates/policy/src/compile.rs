//! Loading and validation: raw files in, a compiled [`Policy`] or every problem out.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::identity::Identity;
use super::limits_compile::LimitNames;
use super::schema::{self, RawPolicyFile, Report};
use super::{AskPolicy, HostPattern, Limit, Notifier, Origin, Policy, PriceTable, Rule};
use crate::secrets::{SecretStore, Source};
use crate::signing::Credential;

/// One problem in one file, located.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    pub file: PathBuf,
    pub line: usize,
    pub col: usize,
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file.display(),
            self.line,
            self.col,
            self.message
        )
    }
}

/// Every problem found while loading a policy directory.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read policy directory {dir}: {source}")]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("no *.toml policy files in {0}: write one (see policies/example.toml)")]
    Empty(PathBuf),
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<PolicyError>),
}

impl LoadError {
    /// The located problems, if the failure was in the files' content.
    pub fn problems(&self) -> &[PolicyError] {
        match self {
            LoadError::Invalid(v) => v,
            _ => &[],
        }
    }
}

/// Whether compiling reads the values of `env:` and `file:` secrets (and identity tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretLoading {
    /// Read every value now; a missing one is an error at its declaration. What `serve` uses.
    Read,
    /// Validate the sources' syntax only, read nothing: for evaluating decisions (`latchkey
    /// test`, `check --no-secrets`) on a machine without the keys. No value is checked, so such
    /// a policy is for deciding only: it must never serve traffic.
    Skip,
}

/// The `*.toml` files of a policy directory, read but not yet compiled.
#[derive(Debug, Default)]
pub struct PolicySources {
    /// `(path, text)`, sorted by path.
    pub files: Vec<(PathBuf, String)>,
    /// Files that could not be read.
    unreadable: Vec<PolicyError>,
}

impl PolicySources {
    /// Reads every `*.toml` file in `dir` (sorted by name; not recursive, so `policies/tests/`
    /// fixtures are not rules).
    pub fn read_dir(dir: &Path) -> Result<Self, LoadError> {
        let paths = toml_files(dir).map_err(|source| LoadError::Dir {
            dir: dir.to_path_buf(),
            source,
        })?;
        if paths.is_empty() {
            return Err(LoadError::Empty(dir.to_path_buf()));
        }
        let mut files = Vec::new();
        let mut unreadable = Vec::new();
        for path in paths {
            match std::fs::read_to_string(&path) {
                Ok(text) => files.push((path, text)),
                Err(e) => unreadable.push(PolicyError {
                    file: path,
                    line: 1,
                    col: 1,
                    message: format!("cannot read file: {e}"),
                }),
            }
        }
        Ok(Self { files, unreadable })
    }

    /// Files read elsewhere (`diff --git` reads them from a revision): `(name, text)`, where
    /// the name is what problems are reported against. `dir` names the set when it is empty.
    pub fn from_files(dir: &Path, mut files: Vec<(PathBuf, String)>) -> Result<Self, LoadError> {
        if files.is_empty() {
            return Err(LoadError::Empty(dir.to_path_buf()));
        }
        files.sort();
        Ok(Self {
            files,
            unreadable: Vec::new(),
        })
    }

    /// The files as `(path, text)` references, the shape [`compile_sources`] takes.
    pub fn as_refs(&self) -> Vec<(&Path, &str)> {
        self.files
            .iter()
            .map(|(p, t)| (p.as_path(), t.as_str()))
            .collect()
    }

    /// Compiles the files read; reports unreadable files along with every other problem.
    pub fn compile(&self, secrets: SecretLoading) -> Result<Policy, LoadError> {
        let mut errors = self.unreadable.clone();
        match compile_sources_with(&self.as_refs(), secrets) {
            Ok(policy) if errors.is_empty() => Ok(policy),
            Ok(_) => Err(LoadError::Invalid(errors)),
            Err(mut more) => {
                errors.append(&mut more);
                // Both lists come from the same sorted file list: file, then line and column.
                errors.sort_by(|a, b| (&a.file, a.line, a.col).cmp(&(&b.file, b.line, b.col)));
                Err(LoadError::Invalid(errors))
            }
        }
    }
}

/// The `*.toml` files directly in `dir`, sorted by name (not recursive: `tests/` holds cases).
pub fn toml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "toml") && path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}

/// Loads and compiles every `*.toml` file in `dir` (sorted by name; not recursive, so
/// `policies/tests/` fixtures are not rules), reading every secret value.
pub fn load_dir(dir: &Path) -> Result<Policy, LoadError> {
    PolicySources::read_dir(dir)?.compile(SecretLoading::Read)
}

/// Like [`load_dir`], but reads no secret value (see [`SecretLoading::Skip`]): for evaluating
/// decisions only, never for serving.
pub fn load_dir_for_evaluation(dir: &Path) -> Result<Policy, LoadError> {
    PolicySources::read_dir(dir)?.compile(SecretLoading::Skip)
}

/// Compiles policy sources given as `(file name, text)`, reading every secret value; used by
/// [`load_dir`] and tests.
pub fn compile_sources(sources: &[(&Path, &str)]) -> Result<Policy, Vec<PolicyError>> {
    compile_sources_with(sources, SecretLoading::Read)
}

/// Compiles policy sources given as `(file name, text)`.
pub fn compile_sources_with(
    sources: &[(&Path, &str)],
    loading: SecretLoading,
) -> Result<Policy, Vec<PolicyError>> {
    let mut errors = Vec::new();
    // Phase 1: parse and read every file, so rules may use secrets declared in any file.
    let (mut parsed, hasher) = parse_all(sources, &mut errors);
    // Phase 1b: Vault connections, which `vault:` sources name.
    let vault = super::vault_compile::compile(&mut parsed, &mut errors);
    // Phase 2: secrets, by name across files.
    let mut keyed = Keyed::default();
    let secret_names = compile_secrets(&mut parsed, &mut errors, &mut keyed);
    // Phase 2b: `[limits.NAME]` and `[prices."MODEL"]`, which rules, identities and credentials
    // name.
    let (limits, limit_names) = super::limits_compile::compile_limits(&mut parsed, &mut errors);
    let prices = super::limits_compile::compile_prices(&mut parsed, &mut errors);
    // Phase 2c: credentials; their key material joins the secret store under reserved names.
    let credentials = compile_credentials(
        &mut parsed,
        &mut errors,
        &limit_names,
        &secret_names,
        &mut keyed,
    );
    // Phase 2d: `[notify.NAME]` and `[ask]`, which rules' `ask` resolve against. A notifier's
    // signing secret joins the secret store like an identity token.
    let (ask, notifiers, ask_defaults, notify_secrets) =
        super::ask_compile::compile_asks(&mut parsed, &mut errors);
    for (fi, key, span, origin, source) in notify_secrets {
        keyed.add(key, (fi, span, origin), source);
    }
    // Phase 3: rules.
    let known = super::rule::Known {
        secrets: &secret_names,
        credentials: &credentials.names,
        asks: &ask_defaults,
        limits: &limit_names,
    };
    let (rules, rule_names) = compile_rules(&mut parsed, &mut errors, &known);
    // Phase 3a: `[[deny]]`, named apart from rules' names, and the tunnel rules that could
    // not enforce one.
    let denials = super::deny::compile_denials(&mut parsed, &mut errors, &mut rule_names.clone());
    super::deny::check_tunnels(&rules, &denials, &mut errors);
    // Phase 3b: identities, which name rules.
    let (mut identities, default_labels) = super::identity_compile::compile_identities(
        &mut parsed,
        &mut errors,
        super::identity_compile::Names {
            rules: &rule_names,
            limits: &limit_names,
        },
        &mut keyed,
    );
    // Phase 3c: profiles, which name rules, limits and the identities they inherit from.
    let profiles = super::profile_compile::compile_profiles(
        &mut parsed,
        &mut errors,
        super::profile_compile::Names {
            rules: &rule_names,
            limits: &limit_names,
            identities: &identities,
        },
    );
    identities.extend(profiles);
    // Phase 3d: admin tokens and attestation issuers, which name profiles.
    let (admin_tokens, attest, admin_oidc) =
        super::access::compile_access(&mut parsed, &mut errors, &identities, &mut keyed);
    // Phase 3e: every `vault:` source gets its connection's settings.
    super::vault_compile::resolve(&parsed, &mut errors, &mut keyed, &vault);
    // Phase 4: every secret read (or not), an error at each declaration it fails.
    let resolved = read_secrets(&parsed, &mut errors, &keyed, loading);
    if !resolved || !errors.is_empty() {
        // File order, then line and column; equal positions keep the order they were found in.
        let order = |file: &Path| sources.iter().position(|(p, _)| *p == file);
        errors.sort_by_key(|e| (order(&e.file), e.line, e.col));
        return Err(errors);
    }
    let secret_origins = keyed
        .at
        .iter()
        .map(|(k, (_, _, origin))| (k.clone(), origin.clone()))
        .collect();
    let mut secret_sources = keyed.sources;
    secret_sources.sort_by(|a, b| a.0.cmp(&b.0));

    let digest = hasher.finish();
    let hex = hex::encode(digest);
    Ok(index(Parts {
        admin_tokens,
        attest,
        admin_oidc,
        rules,
        denials,
        ask,
        notifiers,
        limits,
        credential_limits: credentials.limits,
        prices,
        identities,
        default_labels,
        credentials: credentials.compiled,
        secrets: secret_sources,
        secret_origins,
        digest: format!("sha256:{hex}"),
        files: sources.iter().map(|(p, _)| p.to_path_buf()).collect(),
    }))
}

/// Every file as parsed: its name, its text and what was read of it.
pub(super) type Parsed<'s> = Vec<(&'s Path, &'s str, RawPolicyFile)>;

/// Where a secret source was declared: the file's index in [`Parsed`], the span of its source
/// and its origin.
pub(super) type DeclaredAt = (usize, Range<usize>, Origin);

/// Every secret source the policy declares (secrets, credential material, notifier secrets and
/// identity tokens) under its key, with where each was declared, for an error reading it.
#[derive(Default)]
pub(super) struct Keyed {
    sources: Vec<(String, Source)>,
    at: HashMap<String, DeclaredAt>,
}

impl Keyed {
    pub(super) fn add(&mut self, key: String, at: DeclaredAt, source: Source) {
        self.at.insert(key.clone(), at);
        self.sources.push((key, source));
    }

    pub(super) fn sources_mut(&mut self) -> impl Iterator<Item = (&String, &mut Source)> {
        self.sources.iter_mut().map(|(k, s)| (&*k, s))
    }

    /// Where `key` was declared: the file's index, the span of its source.
    pub(super) fn at_of(&self, key: &str) -> Option<(usize, Range<usize>, &Origin)> {
        self.at.get(key).map(|(fi, span, o)| (*fi, span.clone(), o))
    }
}

/// The policy field a secret-source key was declared at (`secrets.NAME.source`,
/// `credentials.NAME.FIELD`, …), for messages.
pub fn field_of(name: &str) -> String {
    if let Some(id) = name.strip_prefix("identity:") {
        format!("identities.{id}.token")
    } else if let Some(n) = name.strip_prefix("notify:") {
        match n.split_once(':') {
            Some((n, key)) => format!("notify.{n}.{key}"),
            None => format!("notify.{n}.secret"),
        }
    } else if let Some(n) = name.strip_prefix("admin-token:") {
        format!("admin.tokens.{n}.token")
    } else if let Some((cred, f)) = name
        .strip_prefix("credential:")
        .and_then(|r| r.split_once(':'))
    {
        format!("credentials.{cred}.{f}")
    } else {
        format!("secrets.{name}.source")
    }
}

/// Phase 1: parses and reads every file, hashing each name and text into the digest. A syntax
/// error stops that file only; the others are still read and checked.
fn parse_all<'s>(
    sources: &[(&'s Path, &'s str)],
    errors: &mut Vec<PolicyError>,
) -> (Parsed<'s>, aws_lc_rs::digest::Context) {
    let mut hasher = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    let mut parsed: Parsed<'s> = Vec::new();
    for (file, text) in sources {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
        hasher.update(name.unwrap_or_default().as_bytes());
        hasher.update(&(text.len() as u64).to_be_bytes());
        hasher.update(text.as_bytes());
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        match schema::parse(text) {
            Ok(doc) => {
                let raw = schema::read_file(doc.as_table(), &mut cx);
                parsed.push((file, text, raw));
            }
            Err((span, message)) => cx.error(span, message),
        }
    }
    (parsed, hasher)
}

/// Phase 2: `[secrets.NAME]`, by name across files; returns every name declared. Every
/// declared name counts as declared, valid or not, so a broken secret is reported once and not
/// again at each rule that uses it.
fn compile_secrets(
    parsed: &mut Parsed<'_>,
    errors: &mut Vec<PolicyError>,
    keyed: &mut Keyed,
) -> HashSet<String> {
    let mut declared: BTreeMap<String, Origin> = BTreeMap::new();
    for (fi, (file, text, raw)) in parsed.iter_mut().enumerate() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        for (name, entry) in std::mem::take(&mut raw.secrets) {
            let d = cx.declare("secrets", "secret", name, &mut declared);
            let span = entry.raw.source.as_ref().map(|s| s.span());
            // A source that parsed is read (phase 4) even if its entry has other problems, so
            // a missing value is reported in the same run; any problem fails the whole load.
            let source = cx.secret(&d.field, entry.raw);
            if let (Some(source), Some(span), true) = (source, span, d.unique) {
                keyed.add(d.name, (fi, span, d.origin), source);
            }
        }
    }
    declared.keys().cloned().collect()
}

/// The credentials compiled: the valid ones, every name declared (valid or not) and the limits
/// each names.
struct Credentials {
    compiled: HashMap<String, Arc<Credential>>,
    names: HashSet<String>,
    limits: HashMap<String, Vec<String>>,
}

/// Phase 2c: `[credentials.NAME]`; their key material joins `keyed` under reserved names.
fn compile_credentials(
    parsed: &mut Parsed<'_>,
    errors: &mut Vec<PolicyError>,
    limit_names: &LimitNames,
    secrets: &HashSet<String>,
    keyed: &mut Keyed,
) -> Credentials {
    let mut out = Credentials {
        compiled: HashMap::new(),
        names: HashSet::new(),
        limits: HashMap::new(),
    };
    for (fi, (file, text, raw)) in parsed.iter_mut().enumerate() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        for (name, mut entry) in std::mem::take(&mut raw.credentials) {
            let name_span = name.span();
            let name = name.into_inner();
            let before = cx.errors.len();
            let attached = cx.limit_list(
                &format!("credentials.{name}.limits"),
                entry.raw.limits.take(),
                limit_names,
                false,
            );
            let unique =
                crate::secrets::template::valid_name(&name) && out.names.insert(name.clone());
            if !unique {
                cx.error(
                    name_span.clone(),
                    format!("credentials.{name}: credential names must be unique and use letters, digits, '-' and single '_'"),
                );
            }
            let origin = Origin {
                file: file.to_path_buf(),
                line: line_col(text, name_span.start).0,
            };
            let mut material = Vec::new();
            let compiled = cx.credential(&name, entry.raw, secrets, |key, span, source| {
                material.push((key, span, source));
            });
            if unique {
                for (key, span, source) in material {
                    keyed.add(key, (fi, span, origin.clone()), source);
                }
            }
            if let (Some(c), true) = (compiled, entry.complete && cx.errors.len() == before) {
                if !attached.is_empty() {
                    out.limits.insert(name.clone(), attached);
                }
                out.compiled.insert(name, Arc::new(c));
            }
        }
    }
    out
}

/// Phase 3: `[[rules]]`; returns the valid rules and every rule name read. A name counts once
/// it is read, whether or not its rule is valid, so a duplicate is reported even when either
/// copy has errors of its own.
fn compile_rules(
    parsed: &mut Parsed<'_>,
    errors: &mut Vec<PolicyError>,
    known: &super::rule::Known<'_>,
) -> (Vec<Rule>, HashMap<String, Origin>) {
    let mut rules: Vec<Rule> = Vec::new();
    let mut names: HashMap<String, Origin> = HashMap::new();
    for (file, text, raw) in parsed.iter_mut() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut *errors,
        };
        for (index, entry) in std::mem::take(&mut raw.rules).into_iter().enumerate() {
            // Computed once per rule: a location costs a scan from the start of the file.
            let origin = Origin {
                file: file.to_path_buf(),
                line: line_col(text, entry.span.start).0,
            };
            let field = format!("rules[{index}].name");
            let unique = entry.raw.name.as_ref().is_none_or(|name| {
                cx.claim_name(&mut names, name, &origin, (&field, "rule name", ""))
            });
            if let Some(rule) = cx.rule(index, entry, origin, known) {
                if unique {
                    rules.push(rule);
                }
            }
        }
    }
    (rules, names)
}

impl FileCx<'_> {
    /// Claims the `[[rules]]` or `[[deny]]` name `name` (trimmed) for the entry at `origin`;
    /// `false`, with an error at the name, when an earlier entry has it. `what` is (the field,
    /// what the name is called, a note after the name) for the message.
    pub(super) fn claim_name(
        &mut self,
        names: &mut HashMap<String, Origin>,
        name: &toml::Spanned<String>,
        origin: &Origin,
        what: (&str, &str, &str),
    ) -> bool {
        let (field, called, note) = what;
        let trimmed = name.get_ref().trim().to_string();
        match names.get(&trimmed) {
            Some(first) => {
                let message = format!(
                    "{field}: duplicate {called} {trimmed:?}{note}, first defined at {first}"
                );
                self.error(name.span(), message);
                false
            }
            None => {
                names.insert(trimmed, origin.clone());
                true
            }
        }
    }
}

/// Phase 4: reads env and file secrets now (unless `loading` skips them); a missing one is an
/// error at its declaration. Read even when there are other errors, so one run reports them
/// all. The values are dropped: the policy keeps the declarations, the proxy's runtime state
/// reads the values it serves. Returns whether every one was read.
fn read_secrets(
    parsed: &Parsed<'_>,
    errors: &mut Vec<PolicyError>,
    keyed: &Keyed,
    loading: SecretLoading,
) -> bool {
    let loaded = match loading {
        SecretLoading::Read => SecretStore::load(keyed.sources.clone()).map(drop),
        SecretLoading::Skip => Ok(()),
    };
    let Err(failures) = loaded else {
        return true;
    };
    for (name, why) in failures {
        if let Some((fi, span, _)) = keyed.at.get(&name) {
            let (file, text, _) = &parsed[*fi];
            let mut cx = FileCx {
                file,
                text,
                errors: &mut *errors,
            };
            cx.error(span.clone(), format!("{}: {why}", field_of(&name)));
        }
    }
    false
}

/// Everything a valid set of files compiled to, before it is indexed into a [`Policy`].
struct Parts {
    admin_tokens: Vec<super::access::AdminToken>,
    attest: Vec<super::access::Attest>,
    admin_oidc: Option<super::access::Oidc>,
    rules: Vec<Rule>,
    denials: Vec<Rule>,
    ask: AskPolicy,
    notifiers: Vec<Notifier>,
    limits: Vec<Limit>,
    credential_limits: HashMap<String, Vec<String>>,
    prices: PriceTable,
    identities: Vec<Identity>,
    default_labels: BTreeMap<String, String>,
    credentials: HashMap<String, Arc<Credential>>,
    secrets: Vec<(String, Source)>,
    secret_origins: HashMap<String, Origin>,
    digest: String,
    files: Vec<PathBuf>,
}

/// Builds the host index, ordering each host's rules by precedence (see the module docs).
fn index(parts: Parts) -> Policy {
    let Parts {
        admin_tokens,
        attest,
        admin_oidc,
        rules,
        denials,
        ask,
        notifiers,
        limits,
        credential_limits,
        prices,
        identities,
        default_labels,
        credentials,
        secrets,
        secret_origins,
        digest,
        files,
    } = parts;
    let ceilings = super::reach::ceilings(&rules, &identities, default_labels, &ask, &credentials);
    let mut exact: HashMap<String, Vec<usize>> = HashMap::new();
    let mut wildcard: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, rule) in rules.iter().enumerate() {
        for host in &rule.hosts {
            let list = match host {
                HostPattern::Exact(h) => exact.entry(h.clone()).or_default(),
                HostPattern::Wildcard(s) => wildcard.entry(s.clone()).or_default(),
            };
            if !list.contains(&i) {
                list.push(i);
            }
        }
    }
    // Stable sort keeps file order among equals.
    let key = |i: &usize| {
        let r: &Rule = &rules[*i];
        (r.paths.is_none(), r.methods.is_none())
    };
    for list in exact.values_mut().chain(wildcard.values_mut()) {
        list.sort_by_key(key);
    }
    let capturing = rules
        .iter()
        .enumerate()
        .filter(|(_, r)| r.capture.is_some())
        .map(|(i, _)| i)
        .collect();
    let (deny_exact, deny_wildcard) = super::deny::index(&denials);
    Policy {
        admin_tokens,
        attest,
        admin_oidc,
        rules,
        denials,
        deny_exact,
        deny_wildcard,
        capturing,
        identities,
        credentials,
        exact,
        wildcard,
        secrets,
        secret_origins,
        ask,
        notifiers,
        limits,
        credential_limits,
        prices: Arc::new(prices),
        ceilings,
        digest,
        files,
    }
}

/// One `[TABLE.NAME]` declaration's name, as [`FileCx::declare`] checked it.
pub(super) struct Declared {
    pub(super) name: String,
    /// `TABLE.NAME`: how the declaration's messages name it.
    pub(super) field: String,
    pub(super) origin: Origin,
    /// Valid and declared nowhere before: the declaration counts.
    pub(super) unique: bool,
}

/// The file being checked, and where its problems go.
pub(super) struct FileCx<'a> {
    pub(super) file: &'a Path,
    pub(super) text: &'a str,
    pub(super) errors: &'a mut Vec<PolicyError>,
}

impl FileCx<'_> {
    pub(super) fn error(&mut self, span: Range<usize>, message: String) {
        let (line, col) = line_col(self.text, span.start);
        self.errors.push(PolicyError {
            file: self.file.to_path_buf(),
            line,
            col,
            message,
        });
    }

    /// A `[TABLE.NAME]` declaration's name, checked the one way every such table is (`what`
    /// names one in messages: "secret", "limit", "notifier"): an invalid or repeated name is
    /// reported here, a first valid one recorded in `first_at`.
    pub(super) fn declare(
        &mut self,
        table: &str,
        what: &str,
        name: toml::Spanned<String>,
        first_at: &mut BTreeMap<String, Origin>,
    ) -> Declared {
        let span = name.span();
        let name = name.into_inner();
        let field = format!("{table}.{name}");
        let origin = Origin {
            file: self.file.to_path_buf(),
            line: line_col(self.text, span.start).0,
        };
        let mut unique = false;
        if !crate::secrets::template::valid_name(&name) {
            self.error(
                span,
                format!(
                    "{field}: {what} names use letters, digits, '-' and single '_' (at most 64)"
                ),
            );
        } else if let Some(first) = first_at.get(&name) {
            self.error(
                span,
                format!("{field}: duplicate {what} {name:?}, first declared at {first}"),
            );
        } else {
            first_at.insert(name.clone(), origin.clone());
            unique = true;
        }
        Declared {
            name,
            field,
            origin,
            unique,
        }
    }
}

impl Report for FileCx<'_> {
    fn error(&mut self, span: Range<usize>, message: String) {
        FileCx::error(self, span, message);
    }

    fn count(&self) -> usize {
        self.errors.len()
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    // Counted in chunks of u8 lanes, which vectorises: a 1,000-rule file asks for a location
    // per rule, and `matches('\n')` made that half of compile time.
    let line = before
        .as_bytes()
        .chunks(255)
        .map(|c| c.iter().fold(0u8, |n, &b| n + u8::from(b == b'\n')) as usize)
        .sum::<usize>()
        + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

#[cfg(test)]
pub(crate) fn compile_one(text: &str) -> Result<Policy, Vec<PolicyError>> {
    compile_sources(&[(Path::new("test.toml"), text)])
}

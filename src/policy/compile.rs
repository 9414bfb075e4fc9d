//! Loading and validation: raw files in, a compiled [`Policy`] or every problem out.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use globset::{GlobBuilder, GlobSetBuilder};
use http::{HeaderName, Method};

use super::host::normalize_host;
use super::identity::{token_key, Identity, RuleSet, DEFAULT_IDENTITY};
use super::schema::{RawPolicyFile, RawRule};
use super::{HostPattern, Origin, PathMatcher, Policy, Rule};
use crate::secrets::placeholder::Place;
use crate::secrets::{SecretStore, Source, Template};
use crate::signing::{Credential, JwtAlg, JwtClaim, Kind as CredentialKind, TokenCache};
use std::sync::Arc;

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
    /// test`, `check --no-secrets`) on a machine without the keys. The policy's secret store is
    /// empty, so such a policy can decide but never inject: it must never serve traffic.
    Skip,
}

/// The `*.toml` files of a policy directory, read but not yet compiled.
#[derive(Debug)]
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
        let paths = super::toml_files(dir).map_err(|source| LoadError::Dir {
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
                Err(LoadError::Invalid(errors))
            }
        }
    }
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
    let mut hasher = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);

    // Phase 1: parse every file, so rules may use secrets declared in any file.
    let mut parsed: Vec<(&Path, &str, RawPolicyFile)> = Vec::new();
    for (file, text) in sources {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
        hasher.update(name.unwrap_or_default().as_bytes());
        hasher.update(&(text.len() as u64).to_be_bytes());
        hasher.update(text.as_bytes());
        match toml::from_str::<RawPolicyFile>(text) {
            Ok(raw) => parsed.push((file, text, raw)),
            Err(e) => {
                let mut cx = FileCx {
                    file,
                    text,
                    errors: &mut errors,
                };
                // toml leaves the message empty for some errors (a control character in a
                // comment); never report an empty problem.
                let message = match e.message().trim() {
                    "" => "invalid TOML: a control character or malformed token here".to_string(),
                    m => m.to_string(),
                };
                cx.error(e.span().unwrap_or(0..0), message);
            }
        }
    }

    // Phase 2: secrets, by name across files.
    let mut secret_sources: Vec<(String, Source)> = Vec::new();
    let mut secret_at: HashMap<String, (usize, Range<usize>, Origin)> = HashMap::new();
    for (fi, (file, text, raw)) in parsed.iter_mut().enumerate() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut errors,
        };
        for (name, secret) in std::mem::take(&mut raw.secrets) {
            let name_span = name.span();
            let name = name.into_inner();
            let field = format!("secrets.{name}");
            if !crate::secrets::template::valid_name(&name) {
                cx.error(
                    name_span,
                    format!("{field}: secret names use letters, digits, '-' and single '_' (at most 64)"),
                );
                continue;
            }
            if let Some((_, _, first)) = secret_at.get(&name) {
                cx.error(
                    name_span,
                    format!("{field}: duplicate secret {name:?}, first declared at {first}"),
                );
                continue;
            }
            let secret = secret.into_inner();
            let mut duration = |key: &str, v: &Option<toml::Spanned<String>>, default: u64| match v
            {
                None => Some(std::time::Duration::from_secs(default)),
                Some(v) => match humantime::parse_duration(v.get_ref()) {
                    Ok(d) if !d.is_zero() => Some(d),
                    _ => {
                        cx.error(
                            v.span(),
                            format!(
                                "{field}.{key}: {:?} is not a duration like \"30s\" or \"5m\"",
                                v.get_ref()
                            ),
                        );
                        None
                    }
                },
            };
            let ttl = duration("ttl", &secret.ttl, 300);
            let timeout = duration("timeout", &secret.timeout, 10);
            let (Some(ttl), Some(timeout)) = (ttl, timeout) else {
                continue;
            };
            match Source::parse(secret.source.get_ref(), ttl, timeout) {
                Ok(source) => {
                    if !matches!(source, Source::Exec { .. })
                        && (secret.ttl.is_some() || secret.timeout.is_some())
                    {
                        cx.error(
                            secret.source.span(),
                            format!("{field}: ttl and timeout apply to exec: sources only"),
                        );
                        continue;
                    }
                    let origin = Origin {
                        file: file.to_path_buf(),
                        line: line_col(text, name_span.start).0,
                    };
                    secret_at.insert(name.clone(), (fi, secret.source.span(), origin));
                    secret_sources.push((name, source));
                }
                Err(e) => cx.error(secret.source.span(), format!("{field}.source: {e}")),
            }
        }
    }
    let secret_names: HashSet<String> = secret_at.keys().cloned().collect();

    // Phase 2c: credentials; their key material joins the secret store under reserved names.
    let mut credentials: HashMap<String, Arc<Credential>> = HashMap::new();
    for (fi, (file, text, raw)) in parsed.iter_mut().enumerate() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut errors,
        };
        for (name, raw_cred) in std::mem::take(&mut raw.credentials) {
            let name_span = name.span();
            let name = name.into_inner();
            if !crate::secrets::template::valid_name(&name) || credentials.contains_key(&name) {
                cx.error(
                    name_span,
                    format!("credentials.{name}: credential names must be unique and use letters, digits, '-' and single '_'"),
                );
                continue;
            }
            let origin_line = line_col(text, name_span.start).0;
            if let Some(c) = cx.credential(&name, raw_cred.into_inner(), |key, span, source| {
                secret_at.insert(
                    key.clone(),
                    (
                        fi,
                        span,
                        Origin {
                            file: file.to_path_buf(),
                            line: origin_line,
                        },
                    ),
                );
                secret_sources.push((key, source));
            }) {
                credentials.insert(name, Arc::new(c));
            }
        }
    }
    let credential_names: HashSet<String> = credentials.keys().cloned().collect();

    // Phase 3: rules.
    let mut rules: Vec<Rule> = Vec::new();
    let mut names: HashMap<String, Origin> = HashMap::new();
    for (file, text, raw) in parsed.iter_mut() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut errors,
        };
        for (index, raw_rule) in std::mem::take(&mut raw.rules).into_iter().enumerate() {
            let span = raw_rule.span();
            let raw_rule = raw_rule.into_inner();
            let name_span = raw_rule.name.span();
            if let Some(rule) = cx.rule(index, span, raw_rule, &secret_names, &credential_names) {
                if let Some(first) = names.get(&rule.name) {
                    cx.error(
                        name_span,
                        format!(
                            "rules[{index}].name: duplicate rule name {:?}, first defined at {first}",
                            rule.name
                        ),
                    );
                    continue;
                }
                names.insert(rule.name.clone(), rule.origin.clone());
                rules.push(rule);
            }
        }
    }
    // Phase 3b: identities, which name rules.
    let mut identities: Vec<Identity> = Vec::new();
    for (fi, (file, text, raw)) in parsed.iter_mut().enumerate() {
        let mut cx = FileCx {
            file,
            text,
            errors: &mut errors,
        };
        for (name, raw_id) in std::mem::take(&mut raw.identities) {
            let name_span = name.span();
            let name = name.into_inner();
            let field = format!("identities.{name}");
            if !crate::secrets::template::valid_name(&name) {
                cx.error(
                    name_span,
                    format!("{field}: identity names use letters, digits, '-' and single '_'"),
                );
                continue;
            }
            if name == DEFAULT_IDENTITY || identities.iter().any(|i| i.name == name) {
                cx.error(
                    name_span,
                    format!("{field}: identity {name:?} is defined twice or reserved"),
                );
                continue;
            }
            let raw_id = raw_id.into_inner();
            let before = cx.errors.len();
            let mut sources = Vec::new();
            if let Some(list) = &raw_id.sources {
                for (i, c) in list.get_ref().iter().enumerate() {
                    match crate::upstream::guard::Cidr::parse(c.get_ref()) {
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
            let rules_span = raw_id.rules.span();
            let listed = raw_id.rules.into_inner();
            let rule_set = if listed.len() == 1 && listed[0].get_ref() == "*" {
                RuleSet::All
            } else {
                let mut set = BTreeSet::new();
                for (i, r) in listed.iter().enumerate() {
                    if names.contains_key(r.get_ref()) {
                        set.insert(r.get_ref().clone());
                    } else {
                        cx.error(
                            r.span(),
                            format!("{field}.rules[{i}]: unknown rule {:?}", r.get_ref()),
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
            };
            if let Some(token) = &raw_id.token {
                let d = std::time::Duration::from_secs(300);
                match Source::parse(token.get_ref(), d, std::time::Duration::from_secs(10)) {
                    Ok(source) => {
                        let key = token_key(&name);
                        let origin = Origin {
                            file: file.to_path_buf(),
                            line: line_col(text, name_span.start).0,
                        };
                        secret_at.insert(key.clone(), (fi, token.span(), origin));
                        secret_sources.push((key, source));
                    }
                    Err(e) => cx.error(token.span(), format!("{field}.token: {e}")),
                }
            }
            if cx.errors.len() == before {
                identities.push(Identity {
                    name,
                    has_token: raw_id.token.is_some(),
                    sources,
                    rules: rule_set,
                });
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }

    // Phase 4: read env and file secrets now; a missing one is an error at its declaration.
    let loaded = match loading {
        SecretLoading::Read => SecretStore::load(secret_sources),
        SecretLoading::Skip => Ok(SecretStore::empty()),
    };
    let store = match loaded {
        Ok(store) => store,
        Err(failures) => {
            for (name, why) in failures {
                if let Some((fi, span, _)) = secret_at.get(&name) {
                    let (file, text, _) = &parsed[*fi];
                    let mut cx = FileCx {
                        file,
                        text,
                        errors: &mut errors,
                    };
                    let field = if let Some(id) = name.strip_prefix("identity:") {
                        format!("identities.{id}.token")
                    } else if let Some((cred, f)) = name
                        .strip_prefix("credential:")
                        .and_then(|r| r.split_once(':'))
                    {
                        format!("credentials.{cred}.{f}")
                    } else {
                        format!("secrets.{name}.source")
                    };
                    cx.error(span.clone(), format!("{field}: {why}"));
                }
            }
            return Err(errors);
        }
    };

    let digest = hasher.finish();
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    Ok(index(
        rules,
        identities,
        credentials,
        std::sync::Arc::new(store),
        format!("sha256:{hex}"),
        sources.iter().map(|(p, _)| p.to_path_buf()).collect(),
    ))
}

/// Builds the host index, ordering each host's rules by precedence (see the module docs).
fn index(
    rules: Vec<Rule>,
    identities: Vec<Identity>,
    credentials: HashMap<String, Arc<Credential>>,
    secrets: std::sync::Arc<SecretStore>,
    digest: String,
    files: Vec<PathBuf>,
) -> Policy {
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
    Policy {
        rules,
        identities,
        credentials,
        tokens: Arc::new(TokenCache::default()),
        exact,
        wildcard,
        secrets,
        digest,
        files,
    }
}

struct FileCx<'a> {
    file: &'a Path,
    text: &'a str,
    errors: &'a mut Vec<PolicyError>,
}

impl FileCx<'_> {
    fn error(&mut self, span: Range<usize>, message: String) {
        let (line, col) = line_col(self.text, span.start);
        self.errors.push(PolicyError {
            file: self.file.to_path_buf(),
            line,
            col,
            message,
        });
    }

    /// Validates one rule; records every problem and returns `None` if there was any.
    fn rule(
        &mut self,
        index: usize,
        span: Range<usize>,
        raw: RawRule,
        secrets: &HashSet<String>,
        credentials: &HashSet<String>,
    ) -> Option<Rule> {
        let before = self.errors.len();
        let at = |field: &str| format!("rules[{index}].{field}");

        let name = raw.name.get_ref().trim().to_string();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
        {
            self.error(
                raw.name.span(),
                format!(
                    "{}: rule name {:?} must be non-empty and use only letters, digits, '-', '_', '.', ':'",
                    at("name"),
                    raw.name.get_ref()
                ),
            );
        }

        let hosts_span = raw.hosts.span();
        let raw_hosts = raw.hosts.into_inner();
        if raw_hosts.is_empty() {
            self.error(
                hosts_span.clone(),
                format!("{}: a rule needs at least one host", at("hosts")),
            );
        }
        let mut hosts = Vec::new();
        for (i, h) in raw_hosts.iter().enumerate() {
            match parse_host_pattern(h.get_ref()) {
                Ok(p) => hosts.push(p),
                Err(msg) => self.error(h.span(), format!("{}: {msg}", at(&format!("hosts[{i}]")))),
            }
        }

        let ports = raw.ports.map(|ports| {
            let span = ports.span();
            let ports = ports.into_inner();
            if ports.is_empty() {
                self.error(
                    span,
                    format!(
                        "{}: an empty list allows nothing; remove the key for the default port",
                        at("ports")
                    ),
                );
            }
            let mut out = Vec::new();
            for (i, p) in ports.iter().enumerate() {
                match u16::try_from(*p.get_ref()) {
                    Ok(port) if port != 0 => out.push(port),
                    _ => self.error(
                        p.span(),
                        format!(
                            "{}: invalid port {}: must be 1 to 65535",
                            at(&format!("ports[{i}]")),
                            p.get_ref()
                        ),
                    ),
                }
            }
            out
        });

        let methods = raw.methods.map(|methods| {
            let span = methods.span();
            let methods = methods.into_inner();
            if methods.is_empty() {
                self.error(
                    span,
                    format!(
                        "{}: an empty list allows nothing; remove the key to allow every method",
                        at("methods")
                    ),
                );
            }
            let mut out = Vec::new();
            for (i, m) in methods.iter().enumerate() {
                let text = m.get_ref();
                let valid = !text.is_empty()
                    && text.chars().all(|c| {
                        c.is_ascii_uppercase() || c.is_ascii_digit() || c == '-' || c == '_'
                    });
                match Method::from_bytes(text.as_bytes()) {
                    Ok(method) if valid => out.push(method),
                    _ => {
                        let hint = if text.chars().any(|c| c.is_ascii_lowercase()) {
                            format!("; did you mean {:?}?", text.to_ascii_uppercase())
                        } else if text == "*" {
                            "; remove the key to allow every method".to_string()
                        } else {
                            String::new()
                        };
                        self.error(
                            m.span(),
                            format!(
                                "{}: invalid method {text:?}: methods are upper-case tokens{hint}",
                                at(&format!("methods[{i}]"))
                            ),
                        )
                    }
                }
            }
            out
        });

        let paths = raw.paths.and_then(|paths| {
            let span = paths.span();
            let paths = paths.into_inner();
            if paths.is_empty() {
                self.error(
                    span.clone(),
                    format!(
                        "{}: an empty list allows nothing; remove the key to allow every path",
                        at("paths")
                    ),
                );
            }
            let mut builder = GlobSetBuilder::new();
            let mut globs = Vec::new();
            for (i, p) in paths.iter().enumerate() {
                let text = p.get_ref();
                let field = at(&format!("paths[{i}]"));
                if !text.starts_with('/') {
                    self.error(
                        p.span(),
                        format!("{field}: path glob {text:?} must start with '/'"),
                    );
                    continue;
                }
                if text.contains('?') {
                    self.error(
                        p.span(),
                        format!(
                            "{field}: path glob {text:?} contains '?': globs match the path only, never the query"
                        ),
                    );
                    continue;
                }
                match GlobBuilder::new(text)
                    .literal_separator(true)
                    .backslash_escape(true)
                    .build()
                {
                    Ok(glob) => {
                        builder.add(glob);
                        globs.push(text.clone());
                    }
                    Err(e) => self.error(
                        p.span(),
                        format!("{field}: invalid path glob {text:?}: {}", e.kind()),
                    ),
                }
            }
            match builder.build() {
                Ok(set) => Some(PathMatcher { globs, set }),
                Err(e) => {
                    self.error(span, format!("{}: {e}", at("paths")));
                    None
                }
            }
        });

        let tunnel = raw.tunnel.map(|t| (*t.get_ref(), t.span()));
        if let Some((true, tspan)) = &tunnel {
            if methods.is_some() || paths.is_some() || raw.inject.is_some() {
                self.error(
                    tspan.clone(),
                    format!(
                        "{}: a tunnel rule relays encrypted bytes that latchkey cannot see, so it cannot restrict methods or paths or inject headers; remove those keys or set tunnel = false",
                        at("tunnel")
                    ),
                );
            }
        }

        let mut inject_headers = Vec::new();
        let mut inject_query = Vec::new();
        let mut inject_basic = None;
        let mut bound: BTreeSet<String> = BTreeSet::new();
        // A template's secrets must be declared; every referenced secret is bound.
        let mut template = |cx: &mut Self, field: &str, v: &toml::Spanned<String>| {
            match Template::parse(v.get_ref()) {
                Ok(t) => {
                    let mut ok = true;
                    for name in t.secrets() {
                        if !secrets.contains(name) {
                            cx.error(
                                v.span(),
                                format!("{field}: unknown secret {name:?}: declare [secrets.{name}] with a source"),
                            );
                            ok = false;
                        }
                        bound.insert(name.to_string());
                    }
                    ok.then_some(t)
                }
                Err(e) => {
                    cx.error(v.span(), format!("{field}: {e}"));
                    None
                }
            }
        };
        let mut injected_names: Vec<HeaderName> = Vec::new();
        if let Some(inject) = raw.inject {
            for (k, v) in inject.headers {
                let field = at(&format!("inject.headers.{}", k.get_ref()));
                let name = match HeaderName::from_bytes(k.get_ref().as_bytes()) {
                    Ok(n) => n,
                    Err(_) => {
                        self.error(
                            k.span(),
                            format!("{field}: invalid header name {:?}", k.get_ref()),
                        );
                        continue;
                    }
                };
                if crate::proxy::hop::is_hop_by_hop(&name) || name == http::header::HOST {
                    self.error(
                        k.span(),
                        format!(
                            "{field}: header {name} is managed by latchkey and cannot be injected"
                        ),
                    );
                    continue;
                }
                let literal_ok = v
                    .get_ref()
                    .bytes()
                    .all(|b| b == b'\t' || (b' '..=b'~').contains(&b));
                if !literal_ok {
                    self.error(
                        v.span(),
                        format!(
                            "{field}: header value is not valid (control characters or non-ASCII)"
                        ),
                    );
                    continue;
                }
                if let Some(t) = template(self, &field, &v) {
                    injected_names.push(name.clone());
                    inject_headers.push((name, t));
                }
            }
            for (k, v) in inject.query {
                let field = at(&format!("inject.query.{}", k.get_ref()));
                if k.get_ref().is_empty() {
                    self.error(k.span(), format!("{field}: empty query parameter name"));
                    continue;
                }
                if let Some(t) = template(self, &field, &v) {
                    inject_query.push((k.get_ref().clone(), t));
                }
            }
            if let Some(basic) = inject.basic_auth {
                let basic = basic.into_inner();
                if basic.user.get_ref().contains(':') {
                    self.error(
                        basic.user.span(),
                        format!(
                            "{}: a basic-auth user cannot contain ':'",
                            at("inject.basic_auth.user")
                        ),
                    );
                }
                let user = template(self, &at("inject.basic_auth.user"), &basic.user);
                let password = template(self, &at("inject.basic_auth.password"), &basic.password);
                if let (Some(u), Some(p)) = (user, password) {
                    injected_names.push(http::header::AUTHORIZATION);
                    inject_basic = Some((u, p));
                }
            }
        }
        if let Some(list) = raw.secrets {
            for (i, s) in list.into_inner().iter().enumerate() {
                if secrets.contains(s.get_ref()) {
                    bound.insert(s.get_ref().clone());
                } else {
                    self.error(
                        s.span(),
                        format!(
                            "{}: unknown secret {:?}: declare [secrets.{}] with a source",
                            at(&format!("secrets[{i}]")),
                            s.get_ref(),
                            s.get_ref()
                        ),
                    );
                }
            }
        }
        let placeholders = match raw.placeholders {
            None => vec![Place::Header],
            Some(list) => {
                let mut out = Vec::new();
                for (i, p) in list.into_inner().iter().enumerate() {
                    match Place::parse(p.get_ref()) {
                        Some(place) => out.push(place),
                        None => self.error(
                            p.span(),
                            format!(
                                "{}: unknown place {:?}: use header, basic_auth, query or body",
                                at(&format!("placeholders[{i}]")),
                                p.get_ref()
                            ),
                        ),
                    }
                }
                out
            }
        };
        let mut keep_headers = Vec::new();
        if let Some(list) = raw.keep_headers {
            for (i, h) in list.into_inner().iter().enumerate() {
                match HeaderName::from_bytes(h.get_ref().as_bytes()) {
                    Ok(n) => keep_headers.push(n),
                    Err(_) => self.error(
                        h.span(),
                        format!(
                            "{}: invalid header name {:?}",
                            at(&format!("keep_headers[{i}]")),
                            h.get_ref()
                        ),
                    ),
                }
            }
        }
        let credential = match &raw.credential {
            None => None,
            Some(c) if credentials.contains(c.get_ref()) => {
                let name = c.get_ref().clone();
                bound.insert(crate::signing::token_name(&name));
                for field in [
                    "access_key_id",
                    "secret_access_key",
                    "session_token",
                    "private_key",
                    "key",
                    "client_secret",
                ] {
                    bound.insert(crate::signing::field_key(&name, field));
                }
                Some(name)
            }
            Some(c) => {
                self.error(
                    c.span(),
                    format!(
                        "{}: unknown credential {:?}: declare [credentials.{}]",
                        at("credential"),
                        c.get_ref(),
                        c.get_ref()
                    ),
                );
                None
            }
        };
        let report = match &raw.mode {
            None => false,
            Some(m) => match m.get_ref().as_str() {
                "enforce" => false,
                "report" => true,
                other => {
                    self.error(
                        m.span(),
                        format!(
                            "{}: unknown mode {other:?}: use \"enforce\" or \"report\"",
                            at("mode")
                        ),
                    );
                    false
                }
            },
        };
        let mut allow_private = Vec::new();
        if let Some(list) = raw.allow_private {
            for (i, c) in list.into_inner().iter().enumerate() {
                match crate::upstream::guard::Cidr::parse(c.get_ref()) {
                    Ok(cidr) => allow_private.push(cidr),
                    Err(e) => self.error(
                        c.span(),
                        format!("{}: {e}", at(&format!("allow_private[{i}]"))),
                    ),
                }
            }
        }
        let wildcard_ok = raw
            .dangerously_inject_into_wildcard
            .as_ref()
            .is_some_and(|b| *b.get_ref());
        if !bound.is_empty()
            && !wildcard_ok
            && hosts.iter().any(|h| matches!(h, HostPattern::Wildcard(_)))
        {
            self.error(
                hosts_span.clone(),
                format!(
                    "{}: rule binds secret(s) {} to a wildcard host, so every matching host would receive them; name the hosts, or set dangerously_inject_into_wildcard = true",
                    at("hosts"),
                    bound.iter().map(|b| format!("{b:?}")).collect::<Vec<_>>().join(", ")
                ),
            );
        }
        if matches!(tunnel, Some((true, _))) && credential.is_some() {
            self.error(
                hosts_span.clone(),
                format!("{}: a tunnel rule cannot use a credential: latchkey cannot see inside the tunnel", at("credential")),
            );
        }
        if matches!(tunnel, Some((true, _))) && !bound.is_empty() && credential.is_none() {
            self.error(
                hosts_span.clone(),
                format!(
                    "{}: a tunnel rule cannot bind secrets: latchkey cannot see inside the tunnel",
                    at("secrets")
                ),
            );
        }

        if self.errors.len() > before {
            return None;
        }
        Some(Rule {
            name,
            description: raw.description,
            hosts,
            ports,
            methods,
            paths,
            tunnel: matches!(tunnel, Some((true, _))),
            inject_headers,
            inject_query,
            inject_basic,
            injected_names,
            bound,
            placeholders,
            keep_headers,
            allow_private,
            report,
            credential,
            origin: Origin {
                file: self.file.to_path_buf(),
                line: line_col(self.text, span.start).0,
            },
        })
    }
}

impl FileCx<'_> {
    /// Validates one `[credentials.NAME]`; `register` receives each key-material source.
    fn credential(
        &mut self,
        name: &str,
        raw: crate::policy::schema::RawCredential,
        mut register: impl FnMut(String, Range<usize>, Source),
    ) -> Option<Credential> {
        let before = self.errors.len();
        let field = |f: &str| format!("credentials.{name}.{f}");
        let kind = raw.kind.get_ref().clone();
        // Which keys each kind takes: (required, optional); key-material keys are sources.
        let (required, optional): (&[&str], &[&str]) = match kind.as_str() {
            "aws_sigv4" => (
                &["access_key_id", "secret_access_key"],
                &["session_token", "region", "service", "max_signed_body"],
            ),
            "github_app" => (
                &["app_id", "installation_id", "private_key"],
                &["api", "permissions", "repositories"],
            ),
            "google_service_account" => (&["key", "scopes"], &["token_uri"]),
            "oauth2_client_credentials" => (
                &["token_url", "client_id", "client_secret"],
                &["scope", "audience"],
            ),
            "jwt" => (&["alg", "key"], &["ttl", "header", "claims"]),
            other => {
                self.error(
                    raw.kind.span(),
                    format!("{}: unknown kind {other:?}: use aws_sigv4, github_app, google_service_account, oauth2_client_credentials or jwt", field("kind")),
                );
                return None;
            }
        };
        let present: Vec<(&str, Range<usize>)> = [
            (
                "access_key_id",
                raw.access_key_id.as_ref().map(|v| v.span()),
            ),
            (
                "secret_access_key",
                raw.secret_access_key.as_ref().map(|v| v.span()),
            ),
            (
                "session_token",
                raw.session_token.as_ref().map(|v| v.span()),
            ),
            ("region", raw.region.as_ref().map(|v| v.span())),
            ("service", raw.service.as_ref().map(|v| v.span())),
            (
                "max_signed_body",
                raw.max_signed_body.as_ref().map(|v| v.span()),
            ),
            ("app_id", raw.app_id.as_ref().map(|v| v.span())),
            (
                "installation_id",
                raw.installation_id.as_ref().map(|v| v.span()),
            ),
            ("private_key", raw.private_key.as_ref().map(|v| v.span())),
            ("api", raw.api.as_ref().map(|v| v.span())),
            ("permissions", raw.permissions.as_ref().map(|v| v.span())),
            ("repositories", raw.repositories.as_ref().map(|v| v.span())),
            ("key", raw.key.as_ref().map(|v| v.span())),
            ("scopes", raw.scopes.as_ref().map(|v| v.span())),
            ("token_uri", raw.token_uri.as_ref().map(|v| v.span())),
            ("token_url", raw.token_url.as_ref().map(|v| v.span())),
            ("client_id", raw.client_id.as_ref().map(|v| v.span())),
            (
                "client_secret",
                raw.client_secret.as_ref().map(|v| v.span()),
            ),
            ("scope", raw.scope.as_ref().map(|v| v.span())),
            ("audience", raw.audience.as_ref().map(|v| v.span())),
            ("alg", raw.alg.as_ref().map(|v| v.span())),
            ("ttl", raw.ttl.as_ref().map(|v| v.span())),
            ("header", raw.header.as_ref().map(|v| v.span())),
            ("claims", raw.claims.as_ref().map(|v| v.span())),
        ]
        .into_iter()
        .filter_map(|(k, s)| s.map(|s| (k, s)))
        .collect();
        for (k, span) in &present {
            if !required.contains(k) && !optional.contains(k) {
                self.error(
                    span.clone(),
                    format!("{}: does not apply to kind {kind:?}", field(k)),
                );
            }
        }
        for r in required {
            if !present.iter().any(|(k, _)| k == r) {
                self.error(
                    raw.kind.span(),
                    format!("{}: kind {kind:?} needs {r}", field(r)),
                );
            }
        }
        // Key material: a secret source, never the value itself.
        let mut source = |cx: &mut Self, f: &str, v: &Option<toml::Spanned<String>>| {
            if let Some(v) = v {
                match Source::parse(
                    v.get_ref(),
                    std::time::Duration::from_secs(300),
                    std::time::Duration::from_secs(10),
                ) {
                    Ok(src) => register(crate::signing::field_key(name, f), v.span(), src),
                    Err(e) => cx.error(
                        v.span(),
                        format!("{}: {e} (key material is never written inline)", field(f)),
                    ),
                }
            }
        };
        let url = |cx: &mut Self, f: &str, v: &Option<toml::Spanned<String>>| -> Option<String> {
            let v = v.as_ref()?;
            match http::Uri::try_from(v.get_ref().as_str()) {
                Ok(u) if u.scheme_str() == Some("https") && u.host().is_some() => {
                    Some(v.get_ref().clone())
                }
                _ => {
                    cx.error(
                        v.span(),
                        format!("{}: {:?} is not an https:// URL", field(f), v.get_ref()),
                    );
                    None
                }
            }
        };
        let compiled = match kind.as_str() {
            "aws_sigv4" => {
                source(self, "access_key_id", &raw.access_key_id);
                source(self, "secret_access_key", &raw.secret_access_key);
                source(self, "session_token", &raw.session_token);
                let max = match &raw.max_signed_body {
                    None => crate::proxy::SCAN_LIMIT,
                    Some(m) => match usize::try_from(*m.get_ref()) {
                        Ok(v) if v <= crate::proxy::SCAN_LIMIT => v,
                        _ => {
                            self.error(m.span(), format!("{}: must be 0 to {} bytes (latchkey buffers at most that much)", field("max_signed_body"), crate::proxy::SCAN_LIMIT));
                            0
                        }
                    },
                };
                let assume_role = raw.assume_role.map(|a| {
                    let span = a.span();
                    let a = a.into_inner();
                    if !a.role_arn.starts_with("arn:") {
                        self.error(
                            span.clone(),
                            format!(
                                "{}: role_arn {:?} is not an ARN",
                                field("assume_role"),
                                a.role_arn
                            ),
                        );
                    }
                    let duration = match a.duration.as_deref().map(humantime::parse_duration) {
                        None => std::time::Duration::from_secs(3600),
                        Some(Ok(d)) if (900..=43200).contains(&d.as_secs()) => d,
                        Some(_) => {
                            self.error(
                                span.clone(),
                                format!("{}: duration must be 15m to 12h", field("assume_role")),
                            );
                            std::time::Duration::from_secs(3600)
                        }
                    };
                    let endpoint = a
                        .sts_endpoint
                        .unwrap_or_else(|| "https://sts.amazonaws.com".to_string());
                    if http::Uri::try_from(endpoint.as_str()).map_or(true, |u| {
                        u.scheme_str() != Some("https") || u.host().is_none()
                    }) {
                        self.error(
                            span.clone(),
                            format!(
                                "{}: sts_endpoint {endpoint:?} is not an https:// URL",
                                field("assume_role")
                            ),
                        );
                    }
                    crate::signing::AssumeRole {
                        role_arn: a.role_arn,
                        session_name: a.session_name.unwrap_or_else(|| "latchkey".to_string()),
                        duration,
                        external_id: a.external_id,
                        sts_endpoint: endpoint,
                        sts_region: a.sts_region.unwrap_or_else(|| "us-east-1".to_string()),
                    }
                });
                CredentialKind::AwsSigV4 {
                    assume_role,
                    region: raw.region.map(|r| r.into_inner()),
                    service: raw.service.map(|r| r.into_inner()),
                    has_session_token: raw.session_token.is_some(),
                    max_signed_body: max,
                }
            }
            "github_app" => {
                source(self, "private_key", &raw.private_key);
                let api = match &raw.api {
                    None => Some("https://api.github.com".to_string()),
                    Some(_) => url(self, "api", &raw.api),
                };
                CredentialKind::GithubApp {
                    app_id: raw.app_id.map(|v| v.into_inner()).unwrap_or_default(),
                    installation_id: raw
                        .installation_id
                        .map(|v| v.into_inner())
                        .unwrap_or_default(),
                    api: api.unwrap_or_default(),
                    permissions: raw.permissions.map(|v| v.into_inner()),
                    repositories: raw.repositories.map(|v| v.into_inner()),
                }
            }
            "google_service_account" => {
                source(self, "key", &raw.key);
                let token_uri = url(self, "token_uri", &raw.token_uri);
                CredentialKind::GoogleServiceAccount {
                    scopes: raw.scopes.map(|v| v.into_inner()).unwrap_or_default(),
                    token_uri,
                }
            }
            "oauth2_client_credentials" => {
                source(self, "client_secret", &raw.client_secret);
                let token_url = url(self, "token_url", &raw.token_url);
                CredentialKind::OAuth2ClientCredentials {
                    token_url: token_url.unwrap_or_default(),
                    client_id: raw.client_id.map(|v| v.into_inner()).unwrap_or_default(),
                    scope: raw.scope.map(|v| v.into_inner()),
                    audience: raw.audience.map(|v| v.into_inner()),
                }
            }
            _ => {
                source(self, "key", &raw.key);
                let alg = raw.alg.as_ref().and_then(|a| {
                    let parsed = JwtAlg::parse(a.get_ref());
                    if parsed.is_none() {
                        self.error(
                            a.span(),
                            format!(
                                "{}: {:?} is not RS256, ES256, HS256 or EdDSA",
                                field("alg"),
                                a.get_ref()
                            ),
                        );
                    }
                    parsed
                });
                let ttl =
                    raw.ttl
                        .as_ref()
                        .and_then(|t| match humantime::parse_duration(t.get_ref()) {
                            Ok(d) if !d.is_zero() => Some(d),
                            _ => {
                                self.error(
                                    t.span(),
                                    format!(
                                        "{}: {:?} is not a duration like \"5m\"",
                                        field("ttl"),
                                        t.get_ref()
                                    ),
                                );
                                None
                            }
                        });
                let header = match &raw.header {
                    None => Some(http::header::AUTHORIZATION),
                    Some(h) => match HeaderName::from_bytes(h.get_ref().as_bytes()) {
                        Ok(n) => Some(n),
                        Err(_) => {
                            self.error(
                                h.span(),
                                format!(
                                    "{}: invalid header name {:?}",
                                    field("header"),
                                    h.get_ref()
                                ),
                            );
                            None
                        }
                    },
                };
                let mut claims = Vec::new();
                if let Some(c) = &raw.claims {
                    for (k, v) in c.get_ref() {
                        let json = match serde_json::to_value(v) {
                            Ok(j) => j,
                            Err(e) => {
                                self.error(
                                    c.span(),
                                    format!("{}: claim {k:?}: {e}", field("claims")),
                                );
                                continue;
                            }
                        };
                        match JwtClaim::parse(json) {
                            Ok(claim) => claims.push((k.clone(), claim)),
                            Err(e) => self
                                .error(c.span(), format!("{}: claim {k:?}: {e}", field("claims"))),
                        }
                    }
                }
                CredentialKind::Jwt {
                    alg: alg.unwrap_or(JwtAlg::Hs256),
                    ttl,
                    header: header.unwrap_or(http::header::AUTHORIZATION),
                    claims,
                }
            }
        };
        if self.errors.len() > before {
            return None;
        }
        Some(Credential {
            name: name.to_string(),
            kind: compiled,
        })
    }
}

/// Parses one `hosts` entry into a pattern, with a suggestion when it looks like a mistake.
fn parse_host_pattern(raw: &str) -> Result<HostPattern, String> {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Err("empty host".to_string());
    }
    if let Some((_, rest)) = trimmed.split_once("://") {
        let host = rest.split(['/', ':']).next().unwrap_or_default();
        return Err(format!(
            "{raw:?} is a URL: hosts take a bare host name; did you mean {host:?} (with ports/paths in their own keys)?"
        ));
    }
    if trimmed.contains('/') {
        return Err(format!(
            "{raw:?} contains '/': put paths in the rule's `paths` key"
        ));
    }
    if trimmed == "*" || trimmed == "*." {
        return Err(format!(
            "{raw:?} would match every host; did you mean \"*.example.com\"?"
        ));
    }
    if let Some(suffix) = trimmed.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err(format!(
                "{raw:?}: '*' is only allowed as the whole first label (\"*.example.com\")"
            ));
        }
        let suffix = normalize_host(suffix).map_err(|e| e.to_string())?;
        if suffix.parse::<std::net::IpAddr>().is_ok() {
            return Err(format!("{raw:?}: a wildcard cannot precede an IP address"));
        }
        if !suffix.contains('.') {
            return Err(format!(
                "{raw:?} would match a whole top-level domain; name the domain (\"*.example.{suffix}\")"
            ));
        }
        return Ok(HostPattern::Wildcard(suffix));
    }
    if trimmed.contains('*') {
        return Err(format!(
            "{raw:?}: '*' is only allowed as the whole first label (\"*.example.com\")"
        ));
    }
    if let Some((h, p)) = trimmed.rsplit_once(':') {
        if !h.contains(':') && p.chars().all(|c| c.is_ascii_digit()) {
            return Err(format!(
                "{raw:?} contains a port: write hosts = [{h:?}] and ports = [{p}]"
            ));
        }
    }
    normalize_host(trimmed)
        .map(HostPattern::Exact)
        .map_err(|e| e.to_string())
}

/// 1-based line and column (in characters) of a byte offset.
pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
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
pub(super) fn compile_one(text: &str) -> Result<Policy, Vec<PolicyError>> {
    compile_sources(&[(Path::new("test.toml"), text)])
}

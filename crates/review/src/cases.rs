//! Policy test cases: `policies/tests/*.toml` files that pin what a policy decides, run by
//! `latchkey test` in CI like any other test suite.
//!
//! ```toml
//! [[cases]]
//! name = "read the zen of GitHub"        # optional; defaults to "METHOD URL"
//! identity = "ci-agent"                  # optional
//! method = "GET"
//! url = "https://api.github.com/zen"
//! headers = { "x-api-version" = "2024-06-01" }  # optional: for `headers` predicates
//! content_type = "application/json"      # optional: the body's type (also a header)
//! body = '{"action": "read"}'            # optional: for `body` and `graphql` predicates
//! expect = "allow"                       # allow | deny | ask (waits for a person)
//! rule = "github-read"                   # optional: the deciding (or, on deny, closest) rule,
//!                                        #   or the `[[deny]]` that refuses it
//! ask_rule = "prod-writes"               # optional (ask only): the rule asking, or "unknown"
//! reason = "method_not_allowed"          # optional: the reason code
//! secrets = ["openai"]                   # optional (allow only): bound by the deciding rule
//! credential = "gh"                      # optional (allow only): the credential it uses
//! limits = ["openai-budget"]             # optional: exactly the limits charged, in order
//! ```
//!
//! A case file is validated as strictly as a policy file (unknown keys, unknown rules, reasons
//! and identities, malformed URLs are errors at `file:line:col`). A case runs through
//! [`crate::explain::explain_with`] with its headers and body, as the proxy decides a request:
//! denials and the rule's `query`/`headers` predicates on the head, then `body`/`graphql` on
//! the body (none given: an empty one). Pure evaluation, no network, no secret value.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use toml::Spanned;

use crate::explain::{explain, explain_with, Carried, ExplainError, Explanation, Verdict};
use crate::policy::compile::line_col;
use crate::policy::read::Fields;
use crate::policy::schema::Report;
use crate::policy::{Policy, PolicyError};
use crate::reason::Reason;

/// A case file as read: each case that read without a problem, with its index in the file.
#[derive(Debug)]
struct RawCaseFile {
    cases: Vec<(usize, Spanned<RawCase>)>,
}

#[derive(Debug)]
struct RawCase {
    name: Option<Spanned<String>>,
    identity: Option<Spanned<String>>,
    method: Spanned<String>,
    url: Spanned<String>,
    headers: BTreeMap<Spanned<String>, Spanned<String>>,
    content_type: Option<Spanned<String>>,
    body: Option<Spanned<String>>,
    expect: Spanned<String>,
    rule: Option<Spanned<String>>,
    reason: Option<Spanned<String>>,
    secrets: Option<Spanned<Vec<Spanned<String>>>>,
    credential: Option<Spanned<String>>,
    ask_rule: Option<Spanned<String>>,
    limits: Option<Spanned<Vec<Spanned<String>>>>,
}

/// One validated case.
#[derive(Clone, Debug)]
pub struct Case {
    /// `name`, or `METHOD URL`.
    pub name: String,
    pub file: PathBuf,
    pub line: usize,
    pub col: usize,
    pub identity: Option<String>,
    pub method: String,
    pub url: String,
    /// Request headers, for `headers` predicates (names as written; validated).
    pub headers: BTreeMap<String, String>,
    /// The body's content type (also sent as `content-type` unless `headers` gives one).
    pub content_type: Option<String>,
    /// The request body (none: an empty body, as the proxy decides a request without one).
    pub body: Option<String>,
    pub expect: Verdict,
    pub rule: Option<String>,
    pub reason: Option<Reason>,
    pub secrets: Option<Vec<String>>,
    /// The credential the deciding rule must use.
    pub credential: Option<String>,
    /// `expect = "ask"` only: the rule that asks, or `unknown`.
    pub ask_rule: Option<String>,
    /// Exactly the limits the request is charged to, in the order they are checked (`[]`:
    /// none; a denied request is charged to none).
    pub limits: Option<Vec<String>>,
}

impl Case {
    /// `file:line:col` of the case, for reports.
    pub fn location(&self) -> String {
        format!("{}:{}:{}", self.file.display(), self.line, self.col)
    }

    /// The request's headers as sent: `headers`, and `content_type` as `content-type` unless
    /// `headers` names one (names and values were validated when the case was read).
    pub fn header_map(&self) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (k, v) in &self.headers {
            if let (Ok(k), Ok(v)) = (
                http::HeaderName::from_bytes(k.as_bytes()),
                http::HeaderValue::from_str(v),
            ) {
                map.append(k, v);
            }
        }
        if let Some(ct) = &self.content_type {
            if let (false, Ok(v)) = (
                map.contains_key(http::header::CONTENT_TYPE),
                http::HeaderValue::from_str(ct),
            ) {
                map.insert(http::header::CONTENT_TYPE, v);
            }
        }
        map
    }

    /// The case's request explained with its headers and body.
    fn explain(&self, policy: &Policy) -> Result<Explanation, ExplainError> {
        let headers = self.header_map();
        let carried = Carried {
            headers: Some(&headers),
            content_type: self.body_type(),
            body: self.body.as_deref().unwrap_or_default().as_bytes(),
        };
        let identity = self.identity.as_deref();
        explain_with(policy, identity, &self.method, &self.url, carried)
    }

    /// The body's content type: `content_type`, else a `content-type` in `headers`.
    fn body_type(&self) -> Option<&str> {
        self.content_type.as_deref().or_else(|| {
            self.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
                .map(|(_, v)| v.as_str())
        })
    }
}

/// A case run: the explanation it got and every expectation that did not hold.
#[derive(Debug)]
pub struct CaseResult {
    pub case: Case,
    /// `None` only if the request could not be evaluated (see `failures`).
    pub explanation: Option<Explanation>,
    /// Empty: the case passed.
    pub failures: Vec<String>,
}

impl CaseResult {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Why a test directory could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum CasesError {
    #[error("cannot read test directory {dir}: {source}")]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("no *.toml test files in {0}: write one (see policies/tests/example.toml)")]
    Empty(PathBuf),
}

/// The cases of every `*.toml` file in `dir` (sorted by name), plus every problem in files
/// that are invalid. A file with any problem contributes no case.
pub fn load_cases_dir(
    dir: &Path,
    policy: &Policy,
) -> Result<(Vec<Case>, Vec<PolicyError>), CasesError> {
    let paths = crate::policy::toml_files(dir).map_err(|source| CasesError::Dir {
        dir: dir.to_path_buf(),
        source,
    })?;
    if paths.is_empty() {
        return Err(CasesError::Empty(dir.to_path_buf()));
    }
    let mut cases = Vec::new();
    let mut errors = Vec::new();
    for path in paths {
        match std::fs::read_to_string(&path) {
            Ok(text) => match parse_cases(&path, &text, policy) {
                Ok(mut more) => cases.append(&mut more),
                Err(mut more) => errors.append(&mut more),
            },
            Err(e) => errors.push(PolicyError {
                file: path,
                line: 1,
                col: 1,
                message: format!("cannot read file: {e}"),
            }),
        }
    }
    Ok((cases, errors))
}

struct Cx<'a> {
    file: &'a Path,
    text: &'a str,
    errors: Vec<PolicyError>,
}

impl Report for Cx<'_> {
    fn error(&mut self, span: Range<usize>, message: String) {
        Cx::error(self, span, message);
    }

    fn count(&self) -> usize {
        self.errors.len()
    }
}

/// The keys a case takes, for unknown-key reports and did-you-mean hints.
const CASE_KEYS: &[&str] = &[
    "name",
    "identity",
    "method",
    "url",
    "headers",
    "content_type",
    "body",
    "expect",
    "rule",
    "reason",
    "secrets",
    "credential",
    "ask_rule",
    "limits",
];

/// Reads a case file key by key (the policy files' reader): an unknown key or a wrong type is
/// reported where it sits, and every other case is still read and checked.
fn read_case_file(table: &toml_edit::Table, cx: &mut Cx<'_>) -> RawCaseFile {
    let root = Fields::new(table, 0..0, String::new(), &["cases"], cx);
    let mut cases = Vec::new();
    for (index, entry) in root
        .table_list_of("cases", CASE_KEYS, cx)
        .into_iter()
        .enumerate()
    {
        let Ok(f) = entry else { continue };
        let method = f.required(cx, "method", |f, r, k| f.string(r, k));
        let url = f.required(cx, "url", |f, r, k| f.string(r, k));
        let expect = f.required(cx, "expect", |f, r, k| f.string(r, k));
        // Without these three there is nothing to check the rest against; with them, the
        // case's own checks still run (and report) even beside an unknown key. A file with any
        // problem runs none of its cases.
        let (Some(method), Some(url), Some(expect)) = (method, url, expect) else {
            continue;
        };
        let case = RawCase {
            name: f.string(cx, "name"),
            identity: f.string(cx, "identity"),
            method,
            url,
            headers: f
                .string_map(cx, "headers")
                .map(|m| m.into_inner().into_iter().collect())
                .unwrap_or_default(),
            content_type: f.string(cx, "content_type"),
            body: f.string(cx, "body"),
            expect,
            rule: f.string(cx, "rule"),
            reason: f.string(cx, "reason"),
            secrets: f.strings(cx, "secrets"),
            credential: f.string(cx, "credential"),
            ask_rule: f.string(cx, "ask_rule"),
            limits: f.strings(cx, "limits"),
        };
        cases.push((index, Spanned::new(f.span.clone(), case)));
    }
    RawCaseFile { cases }
}

impl Cx<'_> {
    fn error(&mut self, span: Range<usize>, message: String) {
        let (line, col) = line_col(self.text, span.start);
        self.errors.push(PolicyError {
            file: self.file.to_path_buf(),
            line,
            col,
            message,
        });
    }
}

/// Parses and validates one case file against `policy`: every problem, located.
pub fn parse_cases(
    file: &Path,
    text: &str,
    policy: &Policy,
) -> Result<Vec<Case>, Vec<PolicyError>> {
    let mut cx = Cx {
        file,
        text,
        errors: Vec::new(),
    };
    let doc = match crate::policy::schema::parse(text) {
        Ok(doc) => doc,
        Err((span, message)) => {
            cx.error(span, message);
            return Err(cx.errors);
        }
    };
    let raw = read_case_file(doc.as_table(), &mut cx);
    if raw.cases.is_empty() && cx.errors.is_empty() {
        cx.error(
            0..0,
            "no [[cases]] in this file: add at least one case (method, url, expect)".to_string(),
        );
    }
    let mut cases = Vec::new();
    for (i, raw_case) in raw.cases {
        let span = raw_case.span();
        if let Some(case) = validate(&mut cx, i, span, raw_case.into_inner(), policy) {
            cases.push(case);
        }
    }
    if cx.errors.is_empty() {
        Ok(cases)
    } else {
        // Reported as found; shown in file order, like `check`.
        cx.errors.sort_by_key(|e| (e.line, e.col));
        Err(cx.errors)
    }
}

fn validate(
    cx: &mut Cx<'_>,
    index: usize,
    span: Range<usize>,
    raw: RawCase,
    policy: &Policy,
) -> Option<Case> {
    let before = cx.errors.len();
    let expect = expect_of(cx, index, &raw);
    check_ask_rule(cx, index, &raw, expect, policy);
    let reason = reason_of(cx, index, &raw);
    check_names(cx, index, &raw, expect, policy);
    let headers = headers_of(cx, index, &raw);
    check_request(cx, index, &raw, &span, policy);
    if cx.errors.len() > before {
        return None;
    }
    let (line, col) = line_col(cx.text, span.start);
    let method = raw.method.into_inner();
    let url = raw.url.into_inner();
    Some(Case {
        name: raw
            .name
            .map(|n| n.into_inner())
            .unwrap_or_else(|| format!("{method} {url}")),
        file: cx.file.to_path_buf(),
        line,
        col,
        identity: raw.identity.map(|i| i.into_inner()),
        method,
        url,
        headers,
        content_type: raw.content_type.map(|c| c.into_inner()),
        body: raw.body.map(|b| b.into_inner()),
        expect: expect?,
        rule: raw.rule.map(|r| r.into_inner()),
        reason,
        secrets: raw
            .secrets
            .map(|s| s.into_inner().into_iter().map(|n| n.into_inner()).collect()),
        credential: raw.credential.map(|c| c.into_inner()),
        ask_rule: raw.ask_rule.map(|r| r.into_inner()),
        limits: raw
            .limits
            .map(|l| l.into_inner().into_iter().map(|n| n.into_inner()).collect()),
    })
}

/// `cases[INDEX].FIELD`, as errors name a case's field.
fn at(index: usize, field: &str) -> String {
    format!("cases[{index}].{field}")
}

fn expect_of(cx: &mut Cx<'_>, index: usize, raw: &RawCase) -> Option<Verdict> {
    match raw.expect.get_ref().as_str() {
        "allow" => Some(Verdict::Allow),
        "deny" => Some(Verdict::Deny),
        "ask" => Some(Verdict::Ask),
        other => {
            cx.error(
                raw.expect.span(),
                format!(
                    "{}: {other:?} is not \"allow\", \"deny\" or \"ask\"",
                    at(index, "expect")
                ),
            );
            None
        }
    }
}

/// `ask_rule` names a rule that asks (or `unknown`), on a case that expects `ask`.
fn check_ask_rule(
    cx: &mut Cx<'_>,
    index: usize,
    raw: &RawCase,
    expect: Option<Verdict>,
    policy: &Policy,
) {
    let Some(r) = &raw.ask_rule else {
        return;
    };
    let name = r.get_ref();
    let rule = policy.rules().iter().find(|rule| &rule.name == name);
    let why = if expect.is_some_and(|e| e != Verdict::Ask) {
        Some("only a case with expect = \"ask\" has an asking rule".to_string())
    } else if name == crate::policy::ask::UNKNOWN {
        None
    } else {
        match rule {
            None => Some(format!(
                "unknown rule {name:?}{} (\"unknown\" names [ask] unknown = true)",
                crate::policy::did_you_mean(name, policy.rules().iter().map(|r| r.name.as_str()))
            )),
            Some(rule) if rule.ask.is_none() => Some(format!("rule {name:?} has no ask")),
            Some(_) => None,
        }
    };
    if let Some(why) = why {
        cx.error(r.span(), format!("{}: {why}", at(index, "ask_rule")));
    }
}

fn reason_of(cx: &mut Cx<'_>, index: usize, raw: &RawCase) -> Option<Reason> {
    raw.reason.as_ref().and_then(|r| {
        let found = Reason::ALL.iter().copied().find(|c| c.code() == r.get_ref());
        if found.is_none() {
            cx.error(
                r.span(),
                format!(
                    "{}: unknown reason code {:?}; policy decisions use allowed, tunnel, no_rule, port_not_allowed, method_not_allowed, path_not_allowed, identity_not_allowed, scheme_not_allowed, denied_by_rule, predicate_mismatch, credential_needs_tls, proxy_auth_required, userinfo_in_url, ambiguous_path",
                    at(index, "reason"),
                    r.get_ref()
                ),
            );
        }
        found
    })
}

/// The rule, credential and limits a case names exist; a denied case names no secret or
/// credential.
fn check_names(
    cx: &mut Cx<'_>,
    index: usize,
    raw: &RawCase,
    expect: Option<Verdict>,
    policy: &Policy,
) {
    if let Some(r) = &raw.rule {
        // A case may name the `[[deny]]` that refuses it, as a refusal names it.
        let named = |rule: &crate::policy::Rule| &rule.name == r.get_ref();
        if !policy.rules().iter().any(named) && !policy.denials().iter().any(named) {
            cx.error(
                r.span(),
                format!(
                    "{}: unknown rule {:?}{}",
                    at(index, "rule"),
                    r.get_ref(),
                    crate::policy::did_you_mean(
                        r.get_ref(),
                        policy
                            .rules()
                            .iter()
                            .chain(policy.denials())
                            .map(|r| r.name.as_str())
                    )
                ),
            );
        }
    }
    if let (Some(s), Some(Verdict::Deny)) = (&raw.secrets, expect) {
        cx.error(
            s.span(),
            format!(
                "{}: a denied request binds no secret; remove secrets or expect = \"allow\"",
                at(index, "secrets")
            ),
        );
    }
    if let Some(c) = &raw.credential {
        if expect == Some(Verdict::Deny) {
            cx.error(
                c.span(),
                format!(
                    "{}: a denied request uses no credential; remove credential or expect = \"allow\"",
                    at(index, "credential")
                ),
            );
        } else if policy.credential(c.get_ref()).is_none() {
            cx.error(
                c.span(),
                format!(
                    "{}: unknown credential {:?}{}",
                    at(index, "credential"),
                    c.get_ref(),
                    crate::policy::did_you_mean(
                        c.get_ref(),
                        policy.credentials().map(|c| c.name.as_str())
                    )
                ),
            );
        }
    }
    for (i, l) in raw
        .limits
        .iter()
        .flat_map(|l| l.get_ref().iter())
        .enumerate()
    {
        if policy.limit(l.get_ref()).is_none() {
            cx.error(
                l.span(),
                format!(
                    "{}: unknown limit {:?}{}",
                    at(index, &format!("limits[{i}]")),
                    l.get_ref(),
                    crate::policy::did_you_mean(
                        l.get_ref(),
                        policy.limits().iter().map(|l| l.name.as_str())
                    )
                ),
            );
        }
    }
}

fn headers_of(cx: &mut Cx<'_>, index: usize, raw: &RawCase) -> BTreeMap<String, String> {
    let mut headers = BTreeMap::new();
    for (k, v) in &raw.headers {
        if http::HeaderName::from_bytes(k.get_ref().as_bytes()).is_err() {
            cx.error(
                k.span(),
                format!(
                    "{}: invalid header name {:?}",
                    at(index, &format!("headers.{}", k.get_ref())),
                    k.get_ref()
                ),
            );
        } else if http::HeaderValue::from_str(v.get_ref()).is_err() {
            cx.error(
                v.span(),
                format!(
                    "{}: invalid header value (control characters or non-visible bytes)",
                    at(index, &format!("headers.{}", k.get_ref())),
                ),
            );
        } else {
            headers.insert(k.get_ref().clone(), v.get_ref().clone());
        }
    }
    if let Some(ct) = &raw.content_type {
        if http::HeaderValue::from_str(ct.get_ref()).is_err() {
            cx.error(
                ct.span(),
                format!(
                    "{}: invalid content type (control characters or non-visible bytes)",
                    at(index, "content_type")
                ),
            );
        }
    }
    headers
}

/// Evaluates the case once, to validate identity, method and URL where they are written.
fn check_request(
    cx: &mut Cx<'_>,
    index: usize,
    raw: &RawCase,
    span: &Range<usize>,
    policy: &Policy,
) {
    let identity = raw.identity.as_ref().map(|i| i.get_ref().as_str());
    if let Err(e) = explain(policy, identity, raw.method.get_ref(), raw.url.get_ref()) {
        let (span, field) = match &e {
            ExplainError::NoIdentities { .. } | ExplainError::UnknownIdentity { .. } => (
                raw.identity.as_ref().map_or(span.clone(), |i| i.span()),
                "identity",
            ),
            ExplainError::InvalidMethod(_) => (raw.method.span(), "method"),
            ExplainError::InvalidUrl { .. } => (raw.url.span(), "url"),
        };
        cx.error(span, format!("{}: {e}", at(index, field)));
    }
}

/// Runs one case against `policy`.
pub fn run_case(policy: &Policy, case: &Case) -> CaseResult {
    let e = match case.explain(policy) {
        Ok(e) => e,
        Err(err) => {
            return CaseResult {
                case: case.clone(),
                explanation: None,
                failures: vec![format!("cannot evaluate: {err}")],
            }
        }
    };
    let mut failures = Vec::new();
    let got_rule = |e: &Explanation| match &e.rule {
        Some(r) => format!("rule '{r}'"),
        None => "no rule".to_string(),
    };
    if e.decision != case.expect {
        let want = case.expect.as_str();
        failures.push(match (e.decision, &e.ask) {
            (Verdict::Ask, Some(ask)) => format!(
                "expected {want}, got ask: asks a person ({}) ({}: {})",
                ask.summary(),
                e.reason,
                e.message
            ),
            (Verdict::Allow, _) => format!(
                "expected {want}, got allow ({}: {})",
                got_rule(&e),
                e.message
            ),
            _ => format!("expected {want}, got deny ({}: {})", e.reason, e.message),
        });
    }
    if let Some(want) = &case.ask_rule {
        let got = e.ask.as_ref().map(|a| a.rule.as_str());
        if got != Some(want.as_str()) {
            failures.push(match got {
                Some(got) => format!("expected ask_rule '{want}', rule '{got}' asks"),
                None => format!("expected ask_rule '{want}', nobody is asked"),
            });
        }
    }
    if let Some(want) = &case.rule {
        if e.rule.as_deref() != Some(want.as_str()) {
            failures.push(format!("expected rule '{want}', got {}", got_rule(&e)));
        }
    }
    if let Some(want) = case.reason {
        if want.code() != e.reason {
            failures.push(format!(
                "expected reason {}, got {} ({})",
                want.code(),
                e.reason,
                e.message
            ));
        }
    }
    if let Some(want) = &case.secrets {
        let missing: Vec<&String> = want.iter().filter(|s| !e.secrets.contains(s)).collect();
        if !missing.is_empty() {
            let bound = if e.secrets.is_empty() {
                "none".to_string()
            } else {
                e.secrets.join(", ")
            };
            let hints: String = missing
                .iter()
                .map(|m| crate::policy::did_you_mean(m, e.secrets.iter().map(String::as_str)))
                .collect();
            failures.push(format!(
                "expected secret(s) {} bound, {} binds {bound}{hints}",
                Names(&missing),
                got_rule(&e)
            ));
        }
    }
    if let Some(want) = &case.credential {
        if e.credential.as_deref() != Some(want.as_str()) {
            failures.push(format!(
                "expected credential '{want}', {} uses {}",
                got_rule(&e),
                e.credential.as_deref().unwrap_or("none")
            ));
        }
    }
    if let Some(want) = &case.limits {
        let got: Vec<&str> = e.limits.iter().map(|l| l.name.as_str()).collect();
        if got != *want {
            let say = |v: &[&str]| {
                if v.is_empty() {
                    "none".to_string()
                } else {
                    v.join(", ")
                }
            };
            let want: Vec<&str> = want.iter().map(String::as_str).collect();
            failures.push(format!(
                "expected limits {}, {} charges {}",
                say(&want),
                got_rule(&e),
                say(&got)
            ));
        }
    }
    CaseResult {
        case: case.clone(),
        explanation: Some(e),
        failures,
    }
}

struct Names<'a>(&'a [&'a String]);

impl fmt::Display for Names<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|s| s.as_str()).collect();
        f.write_str(&names.join(", "))
    }
}

#[cfg(test)]
#[path = "cases_tests.rs"]
mod tests;

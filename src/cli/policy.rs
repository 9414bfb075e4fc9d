//! The policy commands a security team runs: `check`, `test` and `explain` (`--reach`: what an
//! identity could reach).
//!
//! Each takes a policies directory, prints a report (text, or JSON for CI) and returns the exit
//! code: 0 ok (or allow, for `explain`), 1 for errors, failing cases, a deny or an ask. Problems are
//! printed as `file:line:col: message` on stderr, warnings as `file:line:col: warning: message`.
//! `test` and `explain` never read secret values ([`SecretLoading::Skip`]); `check` reads them
//! unless told not to (`--no-secrets`), so it also catches a missing key.
//!
//! Uses `policy` only (pure evaluation): no proxy, no upstream, no network.

use std::path::Path;
use std::process::ExitCode;

use serde_json::json;

use crate::policy::{LoadError, Policy, PolicySources, SecretLoading};
use crate::review::cases::{load_cases_dir, run_case};
use crate::review::explain::{explain_with, Carried, Explanation, Outcome};
use crate::review::lint::lint;

/// How `check` prints its findings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckFormat {
    /// `file:line:col: message` lines and a summary.
    Text,
    /// One JSON object: `{ok, errors, warnings, rules, files, policy, secrets_read}`.
    Json,
}

/// Prints every problem of a failed load on stderr, then a one-line summary.
pub fn print_load_error(dir: &Path, e: &LoadError) {
    match e {
        LoadError::Invalid(problems) => {
            for p in problems {
                eprintln!("{p}");
            }
            eprintln!(
                "latchkey: error: {} problem(s) in policy {}",
                problems.len(),
                dir.display()
            );
        }
        other => eprintln!("latchkey: error: {other}"),
    }
}

/// Loads a policy for evaluation only (no secret value read), printing problems on failure.
fn load_for_evaluation(dir: &Path) -> Result<Policy, ExitCode> {
    PolicySources::read_dir(dir)
        .and_then(|s| s.compile(SecretLoading::Skip))
        .map_err(|e| {
            print_load_error(dir, &e);
            ExitCode::from(1)
        })
}

/// `latchkey check`: validate every file, report every error and warning. Exit 1 on any error;
/// warnings alone exit 0.
pub fn check(dir: &Path, format: CheckFormat, secrets: SecretLoading) -> ExitCode {
    let secrets_read = secrets == SecretLoading::Read;
    let sources = match PolicySources::read_dir(dir) {
        Ok(s) => s,
        Err(e) => return check_failed(dir, format, &e, 0, secrets_read),
    };
    let policy = match sources.compile(secrets) {
        Ok(p) => p,
        Err(e) => return check_failed(dir, format, &e, sources.files.len(), secrets_read),
    };
    // Secrets held in stores are fetched once too (not with --no-secrets), every failure said.
    if secrets_read {
        let unreachable = super::check_stores::fetch_once(&policy);
        if !unreachable.is_empty() {
            let e = LoadError::Invalid(unreachable);
            return check_failed(dir, format, &e, sources.files.len(), secrets_read);
        }
    }
    let warnings = lint(&policy, &sources.as_refs());
    match format {
        CheckFormat::Json => {
            let v = json!({
                "ok": true,
                "errors": [],
                "warnings": warnings,
                "rules": policy.rules().len(),
                "files": policy.files().len(),
                "policy": policy.digest(),
                "secrets_read": secrets_read,
                "ask_rules": policy.rules().iter().filter(|r| r.ask.is_some()).map(|r| r.name.as_str()).collect::<Vec<_>>(),
                "ask_unknown": policy.ask().unknown,
                "notifiers": policy.notifiers().iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
                "limits": policy.limits().iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
                "prices_overridden": policy.prices().overridden(),
            });
            println!("{v}");
        }
        CheckFormat::Text => {
            for w in &warnings {
                eprintln!("{w}");
            }
            let mut line = format!(
                "ok: {} rule(s) in {} file(s), policy {}",
                policy.rules().len(),
                policy.files().len(),
                policy.digest()
            );
            if let Some(asks) = asks_summary(&policy) {
                line.push_str(&format!("; {asks}"));
            }
            if !policy.limits().is_empty() {
                line.push_str(&format!("; {} limit(s)", policy.limits().len()));
            }
            if !warnings.is_empty() {
                line.push_str(&format!(", {} warning(s)", warnings.len()));
            }
            if !secrets_read {
                line.push_str(" (secret values not read)");
            }
            println!("{line}");
        }
    }
    ExitCode::SUCCESS
}

/// `asks a person: 2 rule(s) and unknown hosts; notifiers: ops` when the policy asks anyone.
fn asks_summary(policy: &Policy) -> Option<String> {
    let rules = policy.rules().iter().filter(|r| r.ask.is_some()).count();
    let unknown = policy.ask().unknown;
    let names: Vec<&str> = policy.notifiers().iter().map(|n| n.name.as_str()).collect();
    if rules == 0 && !unknown && names.is_empty() {
        return None;
    }
    let who = match (rules, unknown) {
        (0, false) => "nothing".to_string(),
        (0, true) => "requests no rule allows ([ask] unknown)".to_string(),
        (n, false) => format!("{n} rule(s)"),
        (n, true) => format!("{n} rule(s) and requests no rule allows ([ask] unknown)"),
    };
    let notifiers = if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    };
    Some(format!("asks a person: {who}; notifiers: {notifiers}"))
}

/// Reports a policy that did not load, in `format`; always exit 1.
fn check_failed(
    dir: &Path,
    format: CheckFormat,
    e: &LoadError,
    files: usize,
    secrets_read: bool,
) -> ExitCode {
    match format {
        CheckFormat::Text => print_load_error(dir, e),
        CheckFormat::Json => {
            let errors: Vec<serde_json::Value> = match e {
                LoadError::Invalid(problems) => problems
                    .iter()
                    .map(|p| {
                        json!({
                            "file": p.file.display().to_string(),
                            "line": p.line,
                            "col": p.col,
                            "message": p.message,
                        })
                    })
                    .collect(),
                // Not about a line of a file: the directory itself.
                other => vec![json!({
                    "file": dir.display().to_string(),
                    "line": 0,
                    "col": 0,
                    "message": other.to_string(),
                })],
            };
            let v = json!({
                "ok": false,
                "errors": errors,
                "warnings": [],
                "rules": 0,
                "files": files,
                "policy": null,
                "secrets_read": secrets_read,
            });
            println!("{v}");
        }
    }
    ExitCode::from(1)
}

/// `latchkey test`: run every case in `tests` (default `POLICIES/tests`) against the policy
/// (loaded without secret values). Exit 1 on any failing case or invalid test file.
pub fn test(policies: &Path, tests: Option<&Path>) -> ExitCode {
    let policy = match load_for_evaluation(policies) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let default_dir = policies.join("tests");
    let tests = tests.unwrap_or(&default_dir);
    let (cases, problems) = match load_cases_dir(tests, &policy) {
        Ok(found) => found,
        Err(e) => {
            eprintln!("latchkey: error: {e}");
            return ExitCode::from(1);
        }
    };
    for p in &problems {
        eprintln!("{p}");
    }
    println!(
        "running {} case(s) from {} against policy {} ({} rule(s); secret values not read)",
        cases.len(),
        tests.display(),
        policy.digest(),
        policy.rules().len()
    );
    let mut passed = 0;
    let mut failed = 0;
    let mut file = None;
    for case in &cases {
        if file != Some(&case.file) {
            file = Some(&case.file);
            println!("{}", case.file.display());
        }
        let result = run_case(&policy, case);
        if result.passed() {
            passed += 1;
            println!("PASS {}", case.name);
        } else {
            failed += 1;
            println!("FAIL {}: {}", case.name, result.failures.join("; "));
            println!("     at {}", case.location());
        }
    }
    let mut summary = format!("{passed} passed, {failed} failed");
    if !problems.is_empty() {
        summary.push_str(&format!(
            ", {} problem(s) in test files (their cases did not run)",
            problems.len()
        ));
    }
    println!("{summary}");
    if failed > 0 || !problems.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// What `explain --header/--body/--content-type` says the request carries.
#[derive(Debug, Default)]
pub struct Carrying {
    headers: http::HeaderMap,
    content_type: Option<String>,
    body: Vec<u8>,
}

impl Carrying {
    /// Reads `NAME:VALUE` headers, a body (`@FILE`: the file's bytes) and a content type
    /// (also sent as `content-type` unless a header gives one; a `content-type` header is the
    /// body's type otherwise).
    pub fn read(
        headers: &[String],
        body: Option<&str>,
        content_type: Option<String>,
    ) -> anyhow::Result<Carrying> {
        use anyhow::Context as _;
        let mut map = http::HeaderMap::new();
        for h in headers {
            let (name, value) = h.split_once(':').with_context(|| {
                format!("--header {h:?}: give it as NAME:VALUE, e.g. --header 'x-api-version: 2024-06-01'")
            })?;
            let name = http::HeaderName::from_bytes(name.trim().as_bytes())
                .with_context(|| format!("--header {h:?}: invalid header name"))?;
            let value = http::HeaderValue::from_str(value.trim())
                .with_context(|| format!("--header {h:?}: invalid header value"))?;
            map.append(name, value);
        }
        if let Some(ct) = &content_type {
            let value = http::HeaderValue::from_str(ct)
                .with_context(|| format!("--content-type {ct:?}: invalid header value"))?;
            if !map.contains_key(http::header::CONTENT_TYPE) {
                map.insert(http::header::CONTENT_TYPE, value);
            }
        }
        let content_type = content_type.or_else(|| {
            map.get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        });
        let body = match body {
            Some(b) => match b.strip_prefix('@') {
                Some(file) => std::fs::read(file)
                    .with_context(|| format!("--body @{file}: cannot read the file"))?,
                None => b.as_bytes().to_vec(),
            },
            None => Vec::new(),
        };
        Ok(Carrying {
            headers: map,
            content_type,
            body,
        })
    }

    fn as_carried(&self) -> Carried<'_> {
        Carried {
            headers: Some(&self.headers),
            content_type: self.content_type.as_deref(),
            body: &self.body,
        }
    }
}

/// `explain`'s words: `URL` (the method is GET) or `METHOD URL`.
pub fn method_and_url(words: &[String]) -> anyhow::Result<(&str, &str)> {
    match words {
        [url] if url.contains("://") => Ok(("GET", url.as_str())),
        [method, url] => Ok((method.as_str(), url.as_str())),
        _ => anyhow::bail!(
            "explain {:?}: give the request as [METHOD] URL with an absolute URL, e.g. \
             `latchkey explain https://api.github.com/zen` (METHOD defaults to GET) or \
             `latchkey explain POST https://api.github.com/repos`",
            words.join(" ")
        ),
    }
}

/// `latchkey explain`: the decision for one request, the rule, why every other candidate rule
/// did not decide it, and the secrets and headers that would apply (names only). Exit 0 on
/// allow, 1 on deny or ask (a request that waits for a person is not allowed yet; the JSON's
/// `decision` tells them apart).
pub fn explain(
    dir: &Path,
    identity: Option<&str>,
    json: bool,
    (method, url): (&str, &str),
    carried: &Carrying,
) -> anyhow::Result<ExitCode> {
    let policy = match load_for_evaluation(dir) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let e = explain_with(&policy, identity, method, url, carried.as_carried())?;
    if json {
        println!("{}", serde_json::to_string(&e)?);
    } else {
        print!("{}", render(&e));
    }
    Ok(if e.allowed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `latchkey explain --reach IDENTITY`: everything the identity could reach under the policy,
/// one item per line, then its `reach` digest (JSON: `{identity, reach, items}`). Exit 0; 1 when
/// the policy does not load; 2 for an identity the policy does not define (the message names
/// the ones it does).
pub fn explain_reach(dir: &Path, identity: &str, json: bool) -> ExitCode {
    let policy = match load_for_evaluation(dir) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let r = match crate::policy::reach::reach(&policy, identity) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("latchkey: error: {e}");
            return ExitCode::from(2);
        }
    };
    if json {
        // Field order as declared: identity, reach, items.
        match serde_json::to_string(&r) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("latchkey: error: cannot write JSON: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        print!("{}", render_reach(&r));
    }
    ExitCode::SUCCESS
}

/// The text form of a reach: one item per line, the digest last.
fn render_reach(r: &crate::policy::Reach) -> String {
    let mut out = String::new();
    for item in &r.items {
        out.push_str(item);
        out.push('\n');
    }
    out.push_str(&format!("reach: {}\n", r.reach));
    out
}

/// The text form of an explanation.
/// Which denial or predicate decided, when one did.
fn decided_by(e: &Explanation) -> Option<String> {
    let rule = e.rule.as_deref()?;
    if e.reason == crate::reason::Reason::DeniedByRule.code() {
        Some(format!(
            "by denial '{rule}' ([[deny]], checked before every rule)"
        ))
    } else if e.reason == crate::reason::Reason::PredicateMismatch.code() {
        Some(format!(
            "by a predicate of rule '{rule}' (see its predicates below)"
        ))
    } else {
        None
    }
}

fn render(e: &Explanation) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!("decision: {}", e.decision.as_str()));
    line(format!("reason:   {}", e.reason));
    match (&e.rule, &e.rule_origin) {
        (Some(r), Some(o)) => line(format!("rule:     {r} ({o})")),
        (Some(r), None) => line(format!("rule:     {r}")),
        _ => line("rule:     none".to_string()),
    }
    if let Some(d) = &e.description {
        line(format!("about:    {d}"));
    }
    line(format!("why:      {}", e.message));
    if let Some(by) = decided_by(e) {
        line(format!("decided:  {by}"));
    }
    if let Some(ask) = &e.ask {
        line(format!("ask:      asks a person ({})", ask.summary()));
        if let Some(m) = &ask.message {
            line(format!("          message: {m}"));
        }
    }
    if e.report_only {
        line(format!(
            "note:     rule '{}' is in report mode: latchkey lets this request through and audits it with would_deny = true",
            e.rule.as_deref().unwrap_or_default()
        ));
    }
    if e.identity != crate::policy::DEFAULT_IDENTITY {
        line(format!("identity: {}", e.identity));
    }
    if e.candidates.is_empty() {
        line("rules:    none names this host".to_string());
    } else {
        line("rules:    (in decision order)".to_string());
        // A rule with `ask` decides (once a person approves); tags follow the rules' decision.
        let allowed = e.reason == crate::reason::Reason::Allowed.code();
        let mut decided = false;
        for c in &e.candidates {
            let what = match c.outcome {
                Outcome::Matched if c.decides => "matched: decides".to_string(),
                Outcome::Matched if decided => {
                    "matched, but not reached: an earlier rule decides".to_string()
                }
                Outcome::Matched => "matched".to_string(),
                other => {
                    let tag = if c.decides && !allowed {
                        " (closest)"
                    } else if c.decides {
                        " (decides)"
                    } else {
                        ""
                    };
                    format!("{}: {}{tag}", other.as_str(), c.detail)
                }
            };
            decided |= c.decides && allowed;
            let kind = if c.denial { "deny " } else { "" };
            line(format!("  - {kind}{} ({}): {what}", c.rule, c.origin));
            for p in &c.predicates {
                line(format!("      {p}"));
            }
        }
    }
    if !e.injected.is_empty() {
        line(format!("injects:  {} (names only)", e.injected.join(", ")));
    }
    if !e.secrets.is_empty() {
        let named: Vec<String> = e
            .secrets
            .iter()
            .map(|n| match e.secret_sources.get(n) {
                Some(kind) => format!("{n} ({kind})"),
                None => n.clone(),
            })
            .collect();
        line(format!(
            "secrets:  {} (bound to this rule's hosts)",
            named.join(", ")
        ));
    }
    if let Some(c) = &e.credential {
        let kind = e.credential_kind.as_deref().unwrap_or("credential");
        if kind == "client_cert" {
            line(format!(
                "auth:     credential {c} ({kind}), a TLS client certificate its upstream connections present"
            ));
        } else {
            line(format!("auth:     credential {c} ({kind}), applied last"));
        }
    }
    for (i, l) in e.limits.iter().enumerate() {
        let head = if i == 0 { "limits:  " } else { "         " };
        line(format!("{head} {}", l.summary));
    }
    line(format!("policy:   {}", e.policy));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::compile_sources_with;

    #[test]
    fn the_text_explanation_lists_each_limit_charged_on_its_own_line() {
        let text = "[limits.rate]\nrequests = \"10/min\"\n[limits.spend]\nper = \"global\"\nspend = \"5 USD/day\"\n[[rules]]\nname = \"llm\"\nhosts = [\"llm.test\"]\nlimits = [\"rate\", \"spend\"]\n";
        let p = compile_sources_with(&[(Path::new("p.toml"), text)], SecretLoading::Skip)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let e = crate::review::explain::explain(&p, None, "POST", "https://llm.test/v1").unwrap();
        let out = render(&e);
        assert!(
            out.contains(
                "\nlimits:   rate (per identity): requests 10/min\n          spend (per global): spend 5 USD/day\n"
            ),
            "{out}"
        );
        let denied =
            crate::review::explain::explain(&p, None, "GET", "https://other.test/").unwrap();
        assert!(!render(&denied).contains("limits:"));
    }
}

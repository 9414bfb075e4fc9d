//! Predicates: what a rule requires of a request, or what selects a request for a denial,
//! beyond host, port, method and path — `query`, `headers`, `body` and `graphql`.
//!
//! ```toml
//! [[rules]]
//! name = "search"
//! hosts = ["api.example.com"]
//! paths = ["/v1/search"]
//! query = { required = ["q"], forbidden = ["include_private"], only = ["q", "page"] }
//! ```
//!
//! One compiled [`Predicates`] is evaluated two ways ([`Polarity`]): for an allow rule every
//! predicate is a *requirement* and must hold under every reading an upstream may give the
//! request (a query's `+` read as `+` or as a space); for a denial every predicate *selects*,
//! and holds under any reading. What cannot be read — a body over [`MAX_BODY`], a body that is
//! neither JSON nor a form, JSON with duplicate keys, a GraphQL document that does not parse —
//! fails a requirement and selects for a denial: both fail closed.
//!
//! Messages name the predicate and parameter names, never a value the request carried. Pure:
//! no I/O; validation of the policy keys is in `predicates_compile.rs`.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, Method};
use serde_json::Value;

use crate::graphql::{self, OperationKind};
use crate::secrets::query::decoded_pairs;
use crate::wire::json_keys;

/// Bodies larger than this are not evaluated (a requirement fails, a denial applies).
pub const MAX_BODY: usize = 1 << 20;

/// The longest parameter name a message quotes.
const QUOTED_NAME: usize = 64;

/// A value pattern: a glob (`*` matches anything, `/` included) or `re:REGEX`.
#[derive(Debug, Clone)]
pub enum Pattern {
    Glob {
        text: String,
        glob: globset::GlobMatcher,
    },
    Regex {
        text: String,
        re: regex::Regex,
    },
}

impl Pattern {
    pub fn is_match(&self, value: &str) -> bool {
        match self {
            Pattern::Glob { glob, .. } => glob.is_match(value),
            Pattern::Regex { re, .. } => re.is_match(value),
        }
    }

    /// As written in the policy (`re:` included).
    pub fn text(&self) -> &str {
        match self {
            Pattern::Glob { text, .. } | Pattern::Regex { text, .. } => text,
        }
    }
}

/// `query = { … }`.
#[derive(Debug, Clone, Default)]
pub struct QueryPredicate {
    pub required: Vec<String>,
    pub forbidden: Vec<String>,
    pub only: Option<Vec<String>>,
    pub values: Vec<(String, Pattern)>,
}

/// One `headers` entry's test.
#[derive(Debug, Clone)]
pub enum HeaderTest {
    Present,
    Absent,
    Matches(Pattern),
}

/// One `headers` entry.
#[derive(Debug, Clone)]
pub struct HeaderPredicate {
    pub name: HeaderName,
    pub test: HeaderTest,
}

/// One `body` entry: an RFC 6901 pointer and the pattern its value must match.
#[derive(Debug, Clone)]
pub struct BodyPredicate {
    pub pointer: String,
    pub pattern: Pattern,
}

/// `graphql = { … }`.
#[derive(Debug, Clone, Default)]
pub struct GraphqlPredicate {
    pub operations: Option<Vec<OperationKind>>,
    pub deny_fields: Vec<String>,
    pub max_depth: Option<usize>,
    /// Lowercase hex SHA-256 hashes of the persisted queries allowed (selected, on a denial).
    pub persisted: Option<Vec<String>>,
}

/// A rule's or a denial's predicates.
#[derive(Debug, Clone, Default)]
pub struct Predicates {
    pub query: Option<QueryPredicate>,
    pub headers: Vec<HeaderPredicate>,
    pub body: Vec<BodyPredicate>,
    pub graphql: Option<GraphqlPredicate>,
}

/// How predicates are read: an allow rule's requirements, or a denial's selectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polarity {
    /// Every predicate must hold under every reading; what cannot be read fails.
    Require,
    /// Every predicate must hold under some reading; what cannot be read holds.
    Select,
}

/// Whether the head predicates (`query`, `headers`) hold; `Err` says which did not, as a
/// phrase to follow the rule's name ("requires query parameter q").
impl Predicates {
    pub fn is_empty(&self) -> bool {
        self.query.is_none() && self.headers.is_empty() && !self.needs_body()
    }

    /// Whether some predicate reads the body (`body`, `graphql`): the decision waits for it.
    pub fn needs_body(&self) -> bool {
        !self.body.is_empty() || self.graphql.is_some()
    }

    /// The predicates decided from the request head: `query` and `headers`.
    pub fn head(
        &self,
        polarity: Polarity,
        query: Option<&str>,
        headers: Option<&HeaderMap>,
    ) -> Result<(), String> {
        if let Some(q) = &self.query {
            let readings = [false, true].map(|form| q.check(polarity, query.unwrap_or(""), form));
            combine(polarity, readings)?;
        }
        let empty = HeaderMap::new();
        let headers = headers.unwrap_or(&empty);
        for h in &self.headers {
            h.check(polarity, headers)?;
        }
        Ok(())
    }

    /// The predicates decided from the body: `body` and `graphql`.
    pub fn body(
        &self,
        polarity: Polarity,
        method: &Method,
        query: Option<&str>,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<(), String> {
        let unreadable = |why: String| match polarity {
            Polarity::Require => Err(why),
            Polarity::Select => Ok(()),
        };
        if !self.body.is_empty() {
            if body.len() > MAX_BODY {
                return unreadable(format!(
                    "requires a body latchkey can evaluate (at most {MAX_BODY} bytes)"
                ));
            }
            match Fields::read(content_type, body) {
                Ok(fields) => {
                    for b in &self.body {
                        b.check(polarity, &fields)?;
                    }
                }
                Err(why) => return unreadable(why),
            }
        }
        if let Some(g) = &self.graphql {
            match g.check(polarity, method, query, content_type, body) {
                Verdict::Holds => {}
                Verdict::Fails(why) => return Err(why),
                Verdict::Unreadable(why) => return unreadable(why),
            }
        }
        Ok(())
    }

    /// Each predicate in a line, for `explain` and the admin API.
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(q) = &self.query {
            out.extend(q.describe());
        }
        out.extend(self.headers.iter().map(HeaderPredicate::describe));
        out.extend(
            self.body
                .iter()
                .map(|b| format!("body field {} matches {}", b.pointer, b.pattern.text())),
        );
        if let Some(g) = &self.graphql {
            out.extend(g.describe());
        }
        out
    }
}

/// Both readings of a query combined: a requirement holds in both, a selector in either.
fn combine(polarity: Polarity, readings: [Result<(), String>; 2]) -> Result<(), String> {
    let [a, b] = readings;
    match polarity {
        Polarity::Require => a.and(b),
        Polarity::Select => a.or(b),
    }
}

/// A parameter name as a message may quote it.
fn quoted(name: &str) -> Cow<'_, str> {
    if name.chars().count() > QUOTED_NAME {
        Cow::Owned(format!("({} characters)", name.chars().count()))
    } else {
        Cow::Borrowed(name)
    }
}

impl QueryPredicate {
    /// One reading of `query` (`form`: `+` as a space).
    fn check(&self, polarity: Polarity, query: &str, form: bool) -> Result<(), String> {
        let pairs: Vec<(Cow<'_, str>, Cow<'_, str>)> = decoded_pairs(query, form).collect();
        let has = |name: &str| pairs.iter().any(|(n, _)| n == name);
        for r in &self.required {
            if !has(r) {
                return Err(format!("requires query parameter {r}"));
            }
        }
        for f in &self.forbidden {
            if has(f) {
                return Err(format!("forbids query parameter {f}"));
            }
        }
        if let Some(only) = &self.only {
            if let Some((n, _)) = pairs.iter().find(|(n, _)| !only.iter().any(|o| o == n)) {
                return Err(format!(
                    "allows no query parameter other than {} (got: {})",
                    only.join(", "),
                    quoted(n)
                ));
            }
        }
        for (name, pattern) in &self.values {
            let mut values = pairs.iter().filter(|(n, _)| n == name).map(|(_, v)| v);
            let holds = match polarity {
                // Every occurrence matches (use `required` to require one).
                Polarity::Require => values.all(|v| pattern.is_match(v)),
                // Some occurrence matches.
                Polarity::Select => values.any(|v| pattern.is_match(v)),
            };
            if !holds {
                return Err(format!(
                    "requires query parameter {name} to match {}",
                    pattern.text()
                ));
            }
        }
        Ok(())
    }

    fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.required.is_empty() {
            out.push(format!("query requires {}", self.required.join(", ")));
        }
        if !self.forbidden.is_empty() {
            out.push(format!("query forbids {}", self.forbidden.join(", ")));
        }
        if let Some(only) = &self.only {
            out.push(format!("query only {}", only.join(", ")));
        }
        for (name, p) in &self.values {
            out.push(format!("query {name} matches {}", p.text()));
        }
        out
    }
}

impl HeaderPredicate {
    fn check(&self, polarity: Polarity, headers: &HeaderMap) -> Result<(), String> {
        let name = &self.name;
        let mut values = headers.get_all(name).iter().peekable();
        match &self.test {
            HeaderTest::Present if values.peek().is_none() => {
                Err(format!("requires header {name}"))
            }
            HeaderTest::Absent if values.peek().is_some() => {
                Err(format!("requires header {name} to be absent"))
            }
            HeaderTest::Present | HeaderTest::Absent => Ok(()),
            HeaderTest::Matches(p) => {
                // A value that is not UTF-8 never matches.
                let text = |v: &http::HeaderValue| {
                    std::str::from_utf8(v.as_bytes()).is_ok_and(|s| p.is_match(s))
                };
                let holds = match polarity {
                    Polarity::Require => values.peek().is_some() && values.all(text),
                    Polarity::Select => values.any(text),
                };
                if holds {
                    Ok(())
                } else {
                    Err(format!("requires header {name} to match {}", p.text()))
                }
            }
        }
    }

    fn describe(&self) -> String {
        match &self.test {
            HeaderTest::Present => format!("header {} present", self.name),
            HeaderTest::Absent => format!("header {} absent", self.name),
            HeaderTest::Matches(p) => format!("header {} matches {}", self.name, p.text()),
        }
    }
}

/// A body as predicates read it.
enum Fields {
    Json(Value),
    /// `application/x-www-form-urlencoded`, decoded.
    Form(Vec<(String, String)>),
    /// No body: every pointer is absent.
    Empty,
}

impl Fields {
    /// A form when the content type says so; otherwise JSON (many APIs ignore the content
    /// type), refused when any object has two keys a loose parser takes for one.
    fn read(content_type: Option<&str>, body: &[u8]) -> Result<Fields, String> {
        let essence = content_type
            .and_then(|c| c.split(';').next())
            .map(|c| c.trim().to_ascii_lowercase());
        if essence.as_deref() == Some("application/x-www-form-urlencoded") {
            let text = String::from_utf8_lossy(body);
            let pairs = decoded_pairs(&text, true)
                .map(|(n, v)| (n.into_owned(), v.into_owned()))
                .collect();
            return Ok(Fields::Form(pairs));
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Fields::Empty);
        }
        let Ok(value) = serde_json::from_slice::<Value>(body) else {
            return Err("requires a JSON or form body (the body is not JSON or a form)".into());
        };
        json_keys::check_unambiguous(body)
            .map_err(|why| format!("requires an unambiguous JSON body ({why})"))?;
        Ok(Fields::Json(value))
    }

    /// The texts at `pointer`: a JSON scalar as its JSON text (a string as is), every value of
    /// a form field (`/name`, top level only). An object or array is no text.
    fn texts(&self, pointer: &str) -> Vec<Cow<'_, str>> {
        match self {
            Fields::Empty => Vec::new(),
            Fields::Form(pairs) => {
                let Some(name) = pointer.strip_prefix('/').filter(|n| !n.contains('/')) else {
                    return Vec::new();
                };
                let name = unescape(name);
                pairs
                    .iter()
                    .filter(|(n, _)| *n == name)
                    .map(|(_, v)| Cow::Borrowed(v.as_str()))
                    .collect()
            }
            Fields::Json(value) => match lookup(value, pointer) {
                Some(Value::String(s)) => vec![Cow::Borrowed(s.as_str())],
                Some(v @ (Value::Number(_) | Value::Bool(_) | Value::Null)) => {
                    vec![Cow::Owned(v.to_string())]
                }
                _ => Vec::new(),
            },
        }
    }
}

/// An RFC 6901 reference token unescaped (`~1` is `/`, `~0` is `~`).
fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// The value at an RFC 6901 `pointer`, keys matched as a loose parser would
/// ([`json_keys::field`]: the document was checked unambiguous, so at most one key matches).
pub(crate) fn lookup<'v>(value: &'v Value, pointer: &str) -> Option<&'v Value> {
    if pointer.is_empty() {
        return Some(value);
    }
    let mut at = value;
    for token in pointer.strip_prefix('/')?.split('/') {
        let token = unescape(token);
        at = match at {
            Value::Object(_) => json_keys::field(at, &token)?,
            Value::Array(items) => {
                // No leading zeros, no sign (RFC 6901 §4).
                let index = (token == "0" || !token.starts_with('0'))
                    .then(|| token.parse::<usize>().ok())
                    .flatten()?;
                items.get(index)?
            }
            _ => return None,
        };
    }
    Some(at)
}

impl BodyPredicate {
    fn check(&self, polarity: Polarity, fields: &Fields) -> Result<(), String> {
        let texts = fields.texts(&self.pointer);
        let holds = match polarity {
            Polarity::Require => {
                !texts.is_empty() && texts.iter().all(|t| self.pattern.is_match(t))
            }
            Polarity::Select => texts.iter().any(|t| self.pattern.is_match(t)),
        };
        if holds {
            Ok(())
        } else {
            Err(format!(
                "requires body field {} to match {}",
                self.pointer,
                self.pattern.text()
            ))
        }
    }
}

/// A GraphQL check's outcome.
enum Verdict {
    Holds,
    Fails(String),
    /// The request could not be analysed.
    Unreadable(String),
}

impl GraphqlPredicate {
    fn check(
        &self,
        polarity: Polarity,
        method: &Method,
        query: Option<&str>,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Verdict {
        if body.len() > MAX_BODY {
            return Verdict::Unreadable(format!(
                "requires a GraphQL request latchkey can evaluate (at most {MAX_BODY} bytes)"
            ));
        }
        let requests = match graphql::request_from(method, query, content_type, body) {
            Ok(r) if !r.is_empty() => r,
            Ok(_) => return Verdict::Unreadable("requires a GraphQL request".into()),
            Err(why) => return Verdict::Unreadable(format!("requires a GraphQL request ({why})")),
        };
        let mut first_failure = None;
        for request in &requests {
            let verdict = self.one(polarity, request);
            match (polarity, verdict) {
                (_, Verdict::Unreadable(why)) => return Verdict::Unreadable(why),
                (Polarity::Require, Verdict::Fails(why)) => return Verdict::Fails(why),
                (Polarity::Select, Verdict::Holds) => return Verdict::Holds,
                (_, Verdict::Fails(why)) => {
                    first_failure.get_or_insert(why);
                }
                (Polarity::Require, Verdict::Holds) => {}
            }
        }
        match first_failure {
            Some(why) if polarity == Polarity::Select => Verdict::Fails(why),
            _ => Verdict::Holds,
        }
    }

    /// One request of a (possibly batched) GraphQL call.
    fn one(&self, polarity: Polarity, request: &graphql::GraphqlRequest) -> Verdict {
        let listed = |hash: &str| {
            self.persisted
                .as_ref()
                .is_some_and(|l| l.iter().any(|h| h.eq_ignore_ascii_case(hash)))
        };
        if let Some(hash) = &request.persisted_hash {
            match polarity {
                Polarity::Require if self.persisted.is_some() && !listed(hash) => {
                    return Verdict::Fails("allows only the persisted queries it lists".into())
                }
                Polarity::Select if listed(hash) => return Verdict::Holds,
                _ => {}
            }
        }
        let Some(document) = &request.query else {
            return match (polarity, request.persisted_hash.as_deref()) {
                (Polarity::Require, Some(h)) if listed(h) => Verdict::Holds,
                (Polarity::Require, _) => Verdict::Fails(
                    "allows a persisted query without its document only when listed".into(),
                ),
                (Polarity::Select, _) => {
                    Verdict::Fails("selects only listed persisted queries".into())
                }
            };
        };
        let analysis = match graphql::analyze(document, request.operation_name.as_deref()) {
            Ok(a) => a,
            Err(why) => {
                return Verdict::Unreadable(format!(
                    "requires a GraphQL document latchkey can analyse ({why})"
                ))
            }
        };
        let checks = [
            self.operations.as_ref().map(|ops| {
                let allowed = |k: &OperationKind| ops.contains(k);
                let mut kinds = analysis.operations.iter().map(|(_, k)| k);
                let ok = match polarity {
                    Polarity::Require => kinds.all(allowed),
                    Polarity::Select => kinds.any(allowed),
                };
                (
                    ok,
                    format!("allows GraphQL operations {} only", kind_list(ops)),
                )
            }),
            (!self.deny_fields.is_empty()).then(|| {
                let hit = self
                    .deny_fields
                    .iter()
                    .find(|f| analysis.fields.contains(*f));
                let ok = match polarity {
                    Polarity::Require => hit.is_none(),
                    Polarity::Select => hit.is_some(),
                };
                let named = hit.map_or_else(|| self.deny_fields.join(", "), Clone::clone);
                (ok, format!("refuses GraphQL field {named}"))
            }),
            self.max_depth.map(|max| {
                let ok = match polarity {
                    Polarity::Require => analysis.depth <= max,
                    Polarity::Select => analysis.depth > max,
                };
                (ok, format!("allows GraphQL selections at most {max} deep"))
            }),
        ];
        for (ok, why) in checks.into_iter().flatten() {
            if !ok {
                return Verdict::Fails(why);
            }
        }
        Verdict::Holds
    }

    /// Each part in a line, for `explain`, `diff` and the admin API.
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(ops) = &self.operations {
            out.push(format!("graphql operations {}", kind_list(ops)));
        }
        if !self.deny_fields.is_empty() {
            out.push(format!(
                "graphql deny_fields {}",
                self.deny_fields.join(", ")
            ));
        }
        if let Some(max) = self.max_depth {
            out.push(format!("graphql max_depth {max}"));
        }
        if let Some(p) = &self.persisted {
            out.push(format!("graphql persisted {} hash(es)", p.len()));
        }
        out
    }
}

fn kind_list(ops: &[OperationKind]) -> String {
    ops.iter()
        .map(|k| match k {
            OperationKind::Query => "query",
            OperationKind::Mutation => "mutation",
            OperationKind::Subscription => "subscription",
        })
        .collect::<Vec<_>>()
        .join(", ")
}

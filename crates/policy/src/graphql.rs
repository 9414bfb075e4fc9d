//! GraphQL as a policy predicate sees it: which operations a request carries, which fields the
//! operation that would run selects, and how deep it nests.
//!
//! Two pure steps (no sockets, no I/O):
//! 1. [`request_from`] finds the GraphQL requests an HTTP request carries (GraphQL over HTTP: GET
//!    parameters, a JSON body or a batch of them, an `application/graphql` body). It refuses any
//!    form a server could read differently from latchkey: JSON keys that collide for a loose
//!    parser, a URL parameter twice or in another case, GraphQL parameters in both the URL and a
//!    JSON body, a body on a GET.
//! 2. [`analyze`] parses one document with `apollo-parser` (any syntax error is an error, never
//!    a best guess) and walks the operation that would run, expanding fragment spreads and inline
//!    fragments with an explicit stack.
//!
//! Errors name what is wrong and where (a JSON path, a parameter name, a byte offset), never a
//! value from the body: no query text, operation or fragment name, or hash.
//!
//! Every step is bounded: a document over [`MAX_DOCUMENT_BYTES`], nesting over [`MAX_DEPTH`]
//! (syntactic or after expansion), more than [`MAX_SELECTIONS`] selections after expansion, and a
//! fragment cycle are errors, found in time linear in the document (never a hang or a stack
//! overflow).
//!
//! ```
//! use latchkey_policy::graphql::{analyze, request_from, OperationKind};
//!
//! let body = br#"{"query": "query Q { viewer { x: login ...F } } fragment F on User { id }"}"#;
//! let requests = request_from(&http::Method::POST, None, Some("application/json"), body)?;
//! let query = requests[0].query.as_deref().unwrap_or_default();
//! let analysis = analyze(query, requests[0].operation_name.as_deref())?;
//! assert_eq!(analysis.operations, vec![(Some("Q".to_string()), OperationKind::Query)]);
//! assert!(analysis.fields.contains("login") && analysis.fields.contains("id"));
//! assert_eq!(analysis.depth, 2);
//! # Ok::<(), String>(())
//! ```

use std::collections::{BTreeSet, HashMap};

use apollo_parser::cst::{self, CstNode};
use apollo_parser::Parser;
use http::Method;
use serde_json::{Map, Value};

use crate::wire::json_keys;

/// The largest document [`analyze`] parses.
pub const MAX_DOCUMENT_BYTES: usize = 256 * 1024;
/// The deepest selection nesting [`analyze`] accepts (a top-level field is depth 1).
pub const MAX_DEPTH: usize = 64;
/// The most selections (fields, spreads, inline fragments) one operation may have once its
/// fragments are expanded.
pub const MAX_SELECTIONS: usize = 10_000;
/// apollo-parser's own nesting bound, which counts selection sets (a field's and an inline
/// fragment's alike), list and object values and list types together: three times
/// [`MAX_DEPTH`], so a document at that depth with an inline fragment at every level and nested
/// arguments still parses, and far below the ~2000 levels at which its recursive descent
/// overflows an 8 MiB stack (apollo-parser's own default is 500).
const PARSER_RECURSION_LIMIT: usize = 3 * MAX_DEPTH;

/// The three kinds of GraphQL operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperationKind {
    Query,
    Mutation,
    Subscription,
}

impl OperationKind {
    /// The keyword, as written in a document and in a policy (`query`, `mutation`,
    /// `subscription`).
    pub fn as_str(&self) -> &'static str {
        match self {
            OperationKind::Query => "query",
            OperationKind::Mutation => "mutation",
            OperationKind::Subscription => "subscription",
        }
    }

    /// The kind [`OperationKind::as_str`] names (exactly: `Query` is not a kind).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "query" => Some(OperationKind::Query),
            "mutation" => Some(OperationKind::Mutation),
            "subscription" => Some(OperationKind::Subscription),
            _ => None,
        }
    }
}

/// One GraphQL request as sent over HTTP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphqlRequest {
    /// The document, when sent.
    pub query: Option<String>,
    pub operation_name: Option<String>,
    /// `extensions.persistedQuery.sha256Hash` (64 lowercase hex digits), when sent.
    pub persisted_hash: Option<String>,
}

/// What a document asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Analysis {
    /// Every operation in the document, in document order: its name and kind (a shorthand
    /// `{ … }` is an anonymous query). Operations that would not run are listed too, so a
    /// predicate on kinds may refuse a document that merely holds a mutation.
    pub operations: Vec<(Option<String>, OperationKind)>,
    /// Every field name selected by the operation that would run, at any depth, through
    /// fragment spreads and inline fragments (field names, not aliases; `__typename` included).
    pub fields: BTreeSet<String>,
    /// The deepest selection nesting (a top-level field is depth 1), fragments expanded.
    pub depth: usize,
}

// ---------------------------------------------------------------------------------------------
// Analysis

/// Parses and analyses `document`; with `operation_name` only that operation's selections count.
///
/// GraphQL's rules for choosing the operation apply: a document with several operations needs
/// `operation_name`, an unknown name is an error, an anonymous operation must be the only one,
/// and two operations or fragments of one name are an error. A document that is not executable
/// (type system definitions), spreads an unknown fragment, or has a fragment cycle is an error.
///
/// Bounded: see the module documentation.
pub fn analyze(document: &str, operation_name: Option<&str>) -> Result<Analysis, String> {
    if document.len() > MAX_DOCUMENT_BYTES {
        return Err(format!(
            "the GraphQL document is {} bytes, over the limit of {MAX_DOCUMENT_BYTES}",
            document.len()
        ));
    }
    let tree = Parser::new(document)
        .recursion_limit(PARSER_RECURSION_LIMIT)
        .parse();
    if let Some(error) = tree.errors().next() {
        return Err(if error.is_limit() {
            format!(
                "the GraphQL document nests deeper than latchkey parses ({PARSER_RECURSION_LIMIT} levels)"
            )
        } else {
            format!(
                "the GraphQL document is not valid GraphQL: a syntax error at byte {} ({} in all)",
                error.index(),
                tree.errors().len()
            )
        });
    }
    let definitions = Definitions::of(&tree.document())?;
    let chosen = definitions.choose(operation_name)?;
    check_no_fragment_cycle(&definitions.fragments)?;
    let (fields, depth) = expand(&chosen.selections, &definitions.fragments)?;
    Ok(Analysis {
        operations: definitions
            .operations
            .iter()
            .map(|op| (op.name.clone(), op.kind))
            .collect(),
        fields,
        depth,
    })
}

/// One operation definition.
struct Operation {
    name: Option<String>,
    kind: OperationKind,
    selections: cst::SelectionSet,
    /// Where it starts, for messages.
    at: usize,
}

/// A document's executable definitions.
struct Definitions {
    operations: Vec<Operation>,
    fragments: HashMap<String, cst::SelectionSet>,
}

impl Definitions {
    /// Collects the operations and fragments; any other definition, a fragment defined twice,
    /// or a definition the parser left incomplete is an error.
    fn of(document: &cst::Document) -> Result<Self, String> {
        let mut operations = Vec::new();
        let mut fragments = HashMap::new();
        for definition in document.definitions() {
            let at = offset(definition.syntax());
            match definition {
                cst::Definition::OperationDefinition(op) => {
                    let kind = match op.operation_type() {
                        None => OperationKind::Query,
                        Some(t) if t.query_token().is_some() => OperationKind::Query,
                        Some(t) if t.mutation_token().is_some() => OperationKind::Mutation,
                        Some(t) if t.subscription_token().is_some() => OperationKind::Subscription,
                        Some(_) => return Err(incomplete("an operation type", at)),
                    };
                    operations.push(Operation {
                        name: op.name().map(|n| String::from(n.text())),
                        kind,
                        selections: op
                            .selection_set()
                            .ok_or_else(|| incomplete("an operation's selection set", at))?,
                        at,
                    });
                }
                cst::Definition::FragmentDefinition(fragment) => {
                    let name = fragment
                        .fragment_name()
                        .and_then(|n| n.name())
                        .ok_or_else(|| incomplete("a fragment's name", at))?;
                    let selections = fragment
                        .selection_set()
                        .ok_or_else(|| incomplete("a fragment's selection set", at))?;
                    if fragments
                        .insert(String::from(name.text()), selections)
                        .is_some()
                    {
                        return Err(format!(
                            "the GraphQL document defines a fragment twice (again at byte {at})"
                        ));
                    }
                }
                _ => {
                    return Err(format!(
                        "the GraphQL document holds a type system definition (at byte {at}): only operations and fragments can be executed"
                    ))
                }
            }
        }
        Ok(Definitions {
            operations,
            fragments,
        })
    }

    /// The operation that would run, by GraphQL's rules.
    fn choose(&self, operation_name: Option<&str>) -> Result<&Operation, String> {
        let ops = &self.operations;
        if ops.len() > 1 {
            if let Some(anonymous) = ops.iter().find(|op| op.name.is_none()) {
                return Err(format!(
                    "the GraphQL document has an anonymous operation (at byte {}) beside others: it must be the only one",
                    anonymous.at
                ));
            }
            let mut seen = BTreeSet::new();
            if let Some(again) = ops.iter().find(|op| !seen.insert(op.name.as_deref())) {
                return Err(format!(
                    "the GraphQL document names two operations alike (again at byte {})",
                    again.at
                ));
            }
        }
        match (operation_name, ops.as_slice()) {
            (_, []) => Err("the GraphQL document holds no operation".to_string()),
            (Some(name), _) => ops
                .iter()
                .find(|op| op.name.as_deref() == Some(name))
                .ok_or_else(|| {
                    "operationName names no operation of the GraphQL document".to_string()
                }),
            (None, [only]) => Ok(only),
            (None, _) => Err(format!(
                "the GraphQL document holds {} operations and no operationName says which runs",
                ops.len()
            )),
        }
    }
}

/// Walks `root` with an explicit stack, expanding fragment spreads and inline fragments: the
/// field names selected and the deepest field nesting.
fn expand(
    root: &cst::SelectionSet,
    fragments: &HashMap<String, cst::SelectionSet>,
) -> Result<(BTreeSet<String>, usize), String> {
    let mut fields = BTreeSet::new();
    let mut deepest = 0;
    let mut selections = 0usize;
    // (a selection set, the depth of the field it belongs to: 0 for the operation's own)
    let mut stack = vec![(root.clone(), 0usize)];
    while let Some((set, above)) = stack.pop() {
        for selection in set.selections() {
            selections += 1;
            if selections > MAX_SELECTIONS {
                return Err(format!(
                    "the GraphQL operation has over {MAX_SELECTIONS} selections once fragments are expanded"
                ));
            }
            let at = offset(selection.syntax());
            match selection {
                cst::Selection::Field(field) => {
                    let name = field.name().ok_or_else(|| incomplete("a field name", at))?;
                    let depth = above + 1;
                    if depth > MAX_DEPTH {
                        return Err(format!(
                            "the GraphQL operation nests fields deeper than {MAX_DEPTH} (at byte {at}, fragments expanded)"
                        ));
                    }
                    deepest = deepest.max(depth);
                    let name = name.text();
                    if !fields.contains(&*name) {
                        fields.insert(String::from(name));
                    }
                    if let Some(inner) = field.selection_set() {
                        stack.push((inner, depth));
                    }
                }
                cst::Selection::InlineFragment(inline) => {
                    let inner = inline
                        .selection_set()
                        .ok_or_else(|| incomplete("an inline fragment's selection set", at))?;
                    stack.push((inner, above));
                }
                cst::Selection::FragmentSpread(spread) => {
                    let inner =
                        spread_name(&spread, at).and_then(|name| fragment(fragments, &name, at))?;
                    stack.push((inner.clone(), above));
                }
            }
        }
    }
    Ok((fields, deepest))
}

/// Refuses a document whose fragments spread each other in a cycle, or spread an unknown
/// fragment (GraphQL's `NoFragmentCycles`, `KnownFragmentNames`): a depth-first search over
/// fragment names with an explicit stack.
fn check_no_fragment_cycle(fragments: &HashMap<String, cst::SelectionSet>) -> Result<(), String> {
    let mut graph: HashMap<&str, Vec<&str>> = HashMap::new();
    for (name, set) in fragments {
        let mut spread = Vec::new();
        for (target, at) in spreads_in(set)? {
            let (known, _) = fragments
                .get_key_value(&target)
                .ok_or_else(|| unknown_fragment(at))?;
            spread.push(known.as_str());
        }
        graph.insert(name.as_str(), spread);
    }

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Mark {
        OnPath,
        Done,
    }
    let mut marks: HashMap<&str, Mark> = HashMap::new();
    for &start in graph.keys() {
        if marks.contains_key(start) {
            continue;
        }
        marks.insert(start, Mark::OnPath);
        // (a fragment on the current path, how many of its spreads were followed)
        let mut path = vec![(start, 0usize)];
        while let Some(&(name, followed)) = path.last() {
            let next = graph.get(name).and_then(|edges| edges.get(followed));
            let Some(&next) = next else {
                marks.insert(name, Mark::Done);
                path.pop();
                continue;
            };
            if let Some(top) = path.last_mut() {
                top.1 += 1;
            }
            match marks.get(next) {
                Some(Mark::OnPath) => {
                    return Err(format!(
                        "the GraphQL document's fragments spread each other in a cycle ({} fragments long)",
                        path.len() - path.iter().position(|(n, _)| *n == next).unwrap_or(0)
                    ))
                }
                Some(Mark::Done) => {}
                None => {
                    marks.insert(next, Mark::OnPath);
                    path.push((next, 0));
                }
            }
        }
    }
    Ok(())
}

/// The fragment names spread anywhere inside `set` (at any nesting), with their offsets.
fn spreads_in(set: &cst::SelectionSet) -> Result<Vec<(String, usize)>, String> {
    let mut found = Vec::new();
    let mut stack = vec![set.clone()];
    while let Some(set) = stack.pop() {
        for selection in set.selections() {
            let at = offset(selection.syntax());
            match selection {
                cst::Selection::Field(field) => stack.extend(field.selection_set()),
                cst::Selection::InlineFragment(inline) => stack.extend(inline.selection_set()),
                cst::Selection::FragmentSpread(spread) => {
                    found.push((spread_name(&spread, at)?, at));
                }
            }
        }
    }
    Ok(found)
}

fn spread_name(spread: &cst::FragmentSpread, at: usize) -> Result<String, String> {
    spread
        .fragment_name()
        .and_then(|n| n.name())
        .map(|n| String::from(n.text()))
        .ok_or_else(|| incomplete("a fragment spread's name", at))
}

fn fragment<'a>(
    fragments: &'a HashMap<String, cst::SelectionSet>,
    name: &str,
    at: usize,
) -> Result<&'a cst::SelectionSet, String> {
    fragments.get(name).ok_or_else(|| unknown_fragment(at))
}

fn unknown_fragment(at: usize) -> String {
    format!("the GraphQL document spreads a fragment it does not define (at byte {at})")
}

fn incomplete(what: &str, at: usize) -> String {
    format!("the GraphQL document lacks {what} (at byte {at})")
}

fn offset(node: &cst::SyntaxNode) -> usize {
    usize::from(node.text_range().start())
}

// ---------------------------------------------------------------------------------------------
// Transport

/// The GraphQL-over-HTTP parameter names, as URL parameters and JSON keys.
const QUERY: usize = 0;
const OPERATION_NAME: usize = 1;
const EXTENSIONS: usize = 3;
const PARAMS: [&str; 4] = ["query", "operationName", "variables", "extensions"];

/// The requests an HTTP request carries (GraphQL over HTTP):
/// - GET `?query=…&operationName=…&extensions=…` (URL-decoded), with no body;
/// - POST `application/json` `{query, operationName, variables, extensions}`, or a JSON array
///   of those (a batch: every element is returned, in order), with no GraphQL parameter in the
///   URL (some servers prefer the URL's);
/// - POST `application/graphql`: the body is the document; `operationName` (and `variables`)
///   may be in the URL.
///
/// Anything else is an error naming why (not GraphQL, malformed JSON, a non-string query, JSON
/// keys a loose parser reads as one (`wire::json_keys::check_unambiguous`), a URL parameter
/// twice), never echoing values from the body. A request without a query must carry
/// `extensions.persistedQuery.sha256Hash`: a persisted query, which only the hash names.
pub fn request_from(
    method: &Method,
    query_string: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Vec<GraphqlRequest>, String> {
    let params = url_params(query_string)?;
    if method == Method::GET {
        if !body.is_empty() {
            return Err(
                "a GET with a body: GraphQL over GET carries everything in the URL".to_string(),
            );
        }
        let persisted_hash = match &params[EXTENSIONS] {
            Some(text) => {
                persisted_hash(&json_object(text.as_bytes(), "extensions")?, "extensions")?
            }
            None => None,
        };
        return complete(
            GraphqlRequest {
                query: params[QUERY].clone(),
                operation_name: params[OPERATION_NAME].clone(),
                persisted_hash,
            },
            "the URL",
        )
        .map(|request| vec![request]);
    }
    if method != Method::POST {
        return Err("only GET and POST carry GraphQL over HTTP".to_string());
    }
    match media_type(content_type)? {
        Media::Json => {
            if let Some(i) = (0..PARAMS.len()).find(|&i| params[i].is_some()) {
                return Err(format!(
                    "a POST with a JSON body and the GraphQL parameter {} in the URL: servers differ on which wins",
                    PARAMS[i]
                ));
            }
            json_requests(body)
        }
        Media::Graphql => {
            if let Some(i) = [QUERY, EXTENSIONS]
                .into_iter()
                .find(|&i| params[i].is_some())
            {
                return Err(format!(
                    "a POST with an application/graphql body and the parameter {} in the URL: servers differ on which wins",
                    PARAMS[i]
                ));
            }
            let document = std::str::from_utf8(body).map_err(|e| {
                format!(
                    "the application/graphql body is not UTF-8 (at byte {})",
                    e.valid_up_to()
                )
            })?;
            Ok(vec![GraphqlRequest {
                query: Some(document.to_string()),
                operation_name: params[OPERATION_NAME].clone(),
                persisted_hash: None,
            }])
        }
    }
}

enum Media {
    Json,
    Graphql,
}

/// The body's kind by its Content-Type: `application/json` (in UTF-8) or `application/graphql`.
fn media_type(content_type: Option<&str>) -> Result<Media, String> {
    let content_type =
        content_type.ok_or("a POST without a Content-Type: not GraphQL over HTTP")?;
    let mut parts = content_type.split(';');
    let essence = parts.next().unwrap_or_default().trim();
    for param in parts {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        let value = value.trim().trim_matches('"');
        if key.trim().eq_ignore_ascii_case("charset") && !value.eq_ignore_ascii_case("utf-8") {
            return Err("a GraphQL body in a charset other than UTF-8".to_string());
        }
    }
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(Media::Json)
    } else if essence.eq_ignore_ascii_case("application/graphql") {
        Ok(Media::Graphql)
    } else {
        Err("the Content-Type is neither application/json nor application/graphql: not GraphQL over HTTP".to_string())
    }
}

/// The GraphQL parameters of a query string, by index into [`PARAMS`], URL-decoded. A
/// parameter twice, or spelled in another case, or not UTF-8 once decoded is an error.
fn url_params(query_string: Option<&str>) -> Result<[Option<String>; 4], String> {
    let mut found: [Option<String>; 4] = Default::default();
    let Some(query_string) = query_string else {
        return Ok(found);
    };
    for (key, value) in url::form_urlencoded::parse(query_string.as_bytes()) {
        let Some(i) = PARAMS.iter().position(|p| p.eq_ignore_ascii_case(&key)) else {
            continue;
        };
        let name = PARAMS[i];
        if key != name {
            return Err(format!(
                "a URL parameter spelled {name} in another case: servers differ on whether it is {name}"
            ));
        }
        // form_urlencoded decodes bytes that are not UTF-8 to U+FFFD.
        if value.contains('\u{FFFD}') {
            return Err(format!(
                "the URL parameter {name} is not UTF-8 once decoded (or holds U+FFFD)"
            ));
        }
        if found[i].replace(value.into_owned()).is_some() {
            return Err(format!(
                "the URL parameter {name} appears twice: servers differ on which counts"
            ));
        }
    }
    Ok(found)
}

/// A JSON body: one request object, or a non-empty array of them.
fn json_requests(body: &[u8]) -> Result<Vec<GraphqlRequest>, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("the JSON body is not JSON: {e}"))?;
    json_keys::check_unambiguous(body).map_err(|e| format!("the JSON body is refused: {e}"))?;
    match value {
        Value::Object(object) => Ok(vec![json_request(&object, "$")?]),
        Value::Array(items) if items.is_empty() => {
            Err("the JSON body is an empty batch: no GraphQL request".to_string())
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let at = format!("$[{i}]");
                match item {
                    Value::Object(object) => json_request(object, &at),
                    _ => Err(format!("{at} in the JSON batch is not an object")),
                }
            })
            .collect(),
        _ => Err(
            "the JSON body is neither an object nor an array of objects: not GraphQL".to_string(),
        ),
    }
}

/// One request object of a JSON body (`at` is its JSON path). Keys are matched as a loose
/// parser would (`json_keys::get`: the body passed `check_unambiguous`).
fn json_request(object: &Map<String, Value>, at: &str) -> Result<GraphqlRequest, String> {
    let string = |key: &str| match json_keys::get(object, key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{at}.{key} is not a string")),
    };
    let extensions_at = format!("{at}.extensions");
    let persisted_hash = match json_keys::get(object, "extensions") {
        None | Some(Value::Null) => None,
        Some(Value::Object(extensions)) => persisted_hash(extensions, &extensions_at)?,
        Some(_) => return Err(format!("{extensions_at} is not an object")),
    };
    complete(
        GraphqlRequest {
            query: string("query")?,
            operation_name: string("operationName")?,
            persisted_hash,
        },
        at,
    )
}

/// A request with neither a query nor a persisted-query hash is not GraphQL.
fn complete(request: GraphqlRequest, at: &str) -> Result<GraphqlRequest, String> {
    if request.query.is_none() && request.persisted_hash.is_none() {
        return Err(format!(
            "{at} has neither a query nor extensions.persistedQuery.sha256Hash: not a GraphQL request"
        ));
    }
    Ok(request)
}

/// A JSON object given as text (the `extensions` URL parameter).
fn json_object(text: &[u8], at: &str) -> Result<Map<String, Value>, String> {
    let value = serde_json::from_slice(text).map_err(|e| format!("{at} is not JSON: {e}"))?;
    json_keys::check_unambiguous(text).map_err(|e| format!("{at} is refused: {e}"))?;
    match value {
        Value::Object(object) => Ok(object),
        _ => Err(format!("{at} is not a JSON object")),
    }
}

/// `persistedQuery.sha256Hash` of an `extensions` object (`at` is its path), when present: 64
/// lowercase hex digits, or an error.
fn persisted_hash(extensions: &Map<String, Value>, at: &str) -> Result<Option<String>, String> {
    let persisted = match json_keys::get(extensions, "persistedQuery") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(persisted)) => persisted,
        Some(_) => return Err(format!("{at}.persistedQuery is not an object")),
    };
    match json_keys::get(persisted, "sha256Hash") {
        Some(Value::String(hash))
            if hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) =>
        {
            Ok(Some(hash.clone()))
        }
        Some(_) => Err(format!(
            "{at}.persistedQuery.sha256Hash is not 64 lowercase hex digits"
        )),
        None => Err(format!("{at}.persistedQuery has no sha256Hash")),
    }
}

#[cfg(test)]
#[path = "graphql_tests.rs"]
mod tests;

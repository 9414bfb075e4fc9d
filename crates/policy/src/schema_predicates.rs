//! The raw forms of a rule's or a denial's predicates (`query`, `headers`, `body`, `graphql`)
//! and of a `[[deny]]` entry, read key by key like the rest of the schema; `predicates_compile`
//! checks the values. Nothing here is trusted.

use toml::Spanned;

use super::read::Fields;
use super::schema::{Report, StringMap};

/// A list of strings as read, each with its span.
pub type StrList = Option<Spanned<Vec<Spanned<String>>>>;

/// A rule's or a denial's predicates, each optional.
#[derive(Debug, Default)]
pub struct RawPredicates {
    pub query: Option<Spanned<RawQuery>>,
    /// `headers = { name = "glob" | "re:…" | "!present" | "!absent" }`.
    pub headers: Option<Spanned<StringMap>>,
    /// `body = { "/json/pointer" = "glob" | "re:…" }`.
    pub body: Option<Spanned<StringMap>>,
    pub graphql: Option<Spanned<RawGraphql>>,
}

/// `query = { required, forbidden, only, values }`.
#[derive(Debug, Default)]
pub struct RawQuery {
    pub required: StrList,
    pub forbidden: StrList,
    pub only: StrList,
    pub values: Option<Spanned<StringMap>>,
}

/// `graphql = { operations, deny_fields, max_depth, persisted }`.
#[derive(Debug, Default)]
pub struct RawGraphql {
    pub operations: StrList,
    pub deny_fields: StrList,
    pub max_depth: Option<Spanned<i64>>,
    pub persisted: StrList,
}

const QUERY_KEYS: &[&str] = &["required", "forbidden", "only", "values"];
const GRAPHQL_KEYS: &[&str] = &["operations", "deny_fields", "max_depth", "persisted"];

/// What a `[[deny]]` entry takes: the matchers of a rule and its predicates, nothing that
/// brokers, tunnels or asks.
pub(super) const DENY_KEYS: &[&str] = &[
    "name",
    "description",
    "hosts",
    "ports",
    "methods",
    "paths",
    "query",
    "headers",
    "body",
    "graphql",
];

/// Reads the predicate keys of a rule or a denial.
pub(super) fn read_predicates(t: &Fields<'_>, r: &mut dyn Report) -> RawPredicates {
    RawPredicates {
        query: t.table(r, "query", QUERY_KEYS).map(|q| {
            let raw = RawQuery {
                required: q.strings(r, "required"),
                forbidden: q.strings(r, "forbidden"),
                only: q.strings(r, "only"),
                values: q.string_map(r, "values"),
            };
            Spanned::new(q.span.clone(), raw)
        }),
        headers: t.string_map(r, "headers"),
        body: t.string_map(r, "body"),
        graphql: t.table(r, "graphql", GRAPHQL_KEYS).map(|g| {
            let raw = RawGraphql {
                operations: g.strings(r, "operations"),
                deny_fields: g.strings(r, "deny_fields"),
                max_depth: g.int(r, "max_depth"),
                persisted: g.strings(r, "persisted"),
            };
            Spanned::new(g.span.clone(), raw)
        }),
    }
}

/// A `[[deny]]` entry is read with every rule key known, so a key only a rule takes is
/// reported here with what a denial is for (not as a typo); the entry is then unusable.
pub(super) fn refuse_rule_only_keys(t: &Fields<'_>, path: &str, r: &mut dyn Report) {
    for key in super::schema::RULE_KEYS {
        if DENY_KEYS.contains(key) {
            continue;
        }
        if let Some((span, _)) = t.get(key) {
            r.error(
                span,
                format!(
                    "{path}.{key}: a denial only selects requests to refuse (name, description, hosts, ports, methods, paths, query, headers, body, graphql); `{key}` belongs in a [[rules]] entry"
                ),
            );
        }
    }
}

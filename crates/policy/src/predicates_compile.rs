//! Validating a rule's or a denial's predicates (`query`, `headers`, `body`, `graphql`): every
//! value is checked here, at load, each problem at its `file:line:col` naming the key
//! (`rules[3].query.values.page: …`); what passes becomes a [`Predicates`].

use std::sync::Arc;

use globset::GlobBuilder;
use http::HeaderName;
use toml::Spanned;

use super::compile::FileCx;
use super::graphql::OperationKind;
use super::predicates::{
    BodyPredicate, GraphqlPredicate, HeaderPredicate, HeaderTest, Pattern, Predicates,
    QueryPredicate,
};
use super::schema::StringMap;
use super::schema_predicates::{RawGraphql, RawPredicates, RawQuery, StrList};

/// The largest compiled regex (bytes of the program), so a policy cannot ask for a huge one.
const REGEX_SIZE: usize = 1 << 20;
/// The deepest `max_depth` accepted.
const MAX_DEPTH: i64 = 1000;

impl FileCx<'_> {
    /// A rule's or denial's predicates (`at` names it: `rules[3]`); `None` when it has none.
    /// Problems are recorded; the caller drops the entry when there were any.
    pub(super) fn predicates(&mut self, at: &str, raw: RawPredicates) -> Option<Arc<Predicates>> {
        let p = Predicates {
            query: raw.query.map(|q| self.query(&format!("{at}.query"), q)),
            headers: raw
                .headers
                .map(|h| self.headers(&format!("{at}.headers"), h))
                .unwrap_or_default(),
            body: raw
                .body
                .map(|b| self.body(&format!("{at}.body"), b))
                .unwrap_or_default(),
            graphql: raw
                .graphql
                .map(|g| self.graphql(&format!("{at}.graphql"), g)),
        };
        let none = p.query.is_none() && p.headers.is_empty() && p.body.is_empty();
        (!none || p.graphql.is_some()).then(|| Arc::new(p))
    }

    /// A list of names: not empty, no empty name.
    fn names(&mut self, at: &str, list: StrList) -> Option<Vec<String>> {
        let list = list?;
        if list.get_ref().is_empty() {
            self.error(
                list.span(),
                format!("{at}: an empty list says nothing; remove the key"),
            );
        }
        let mut out = Vec::new();
        for (i, n) in list.into_inner().into_iter().enumerate() {
            if n.get_ref().is_empty() {
                self.error(n.span(), format!("{at}[{i}]: a name must not be empty"));
            } else {
                out.push(n.into_inner());
            }
        }
        Some(out)
    }

    fn query(&mut self, at: &str, raw: Spanned<RawQuery>) -> QueryPredicate {
        let span = raw.span();
        let raw = raw.into_inner();
        let required = self
            .names(&format!("{at}.required"), raw.required)
            .unwrap_or_default();
        let forbidden = self
            .names(&format!("{at}.forbidden"), raw.forbidden)
            .unwrap_or_default();
        let only = self.names(&format!("{at}.only"), raw.only);
        let values = self.patterns(&format!("{at}.values"), raw.values.map(Spanned::into_inner));
        for r in required.iter().filter(|r| forbidden.contains(r)) {
            self.error(
                span.clone(),
                format!("{at}: parameter {r:?} is both required and forbidden, so nothing matches"),
            );
        }
        if let Some(only) = &only {
            for r in required.iter().filter(|r| !only.contains(r)) {
                self.error(
                    span.clone(),
                    format!("{at}: parameter {r:?} is required but not in `only`, so nothing matches; add it to `only`"),
                );
            }
        }
        QueryPredicate {
            required,
            forbidden,
            only,
            values: values
                .into_iter()
                .map(|(k, p)| (k.into_inner(), p))
                .collect(),
        }
    }

    /// `{ name = "glob" | "re:…" }` entries, each pattern compiled.
    fn patterns(&mut self, at: &str, map: Option<StringMap>) -> Vec<(Spanned<String>, Pattern)> {
        let mut out = Vec::new();
        for (key, value) in map.unwrap_or_default() {
            let field = format!("{at}.{}", key.get_ref());
            if let Some(p) = self.pattern(&field, &value) {
                out.push((key, p));
            }
        }
        out
    }

    /// One value pattern: `re:REGEX` (the `regex` crate: linear time, size-limited) or a glob.
    fn pattern(&mut self, field: &str, value: &Spanned<String>) -> Option<Pattern> {
        let text = value.get_ref().clone();
        let built = match text.strip_prefix("re:") {
            Some(re) => regex::RegexBuilder::new(re)
                .size_limit(REGEX_SIZE)
                .dfa_size_limit(REGEX_SIZE)
                .build()
                .map(|re| Pattern::Regex {
                    text: text.clone(),
                    re,
                })
                .map_err(|e| {
                    let e = e.to_string();
                    let last = e.lines().last().unwrap_or_default().trim().to_string();
                    format!("invalid regex {re:?}: {last}")
                }),
            None => GlobBuilder::new(&text)
                .backslash_escape(true)
                .build()
                .map(|g| Pattern::Glob {
                    text: text.clone(),
                    glob: g.compile_matcher(),
                })
                .map_err(|e| format!("invalid glob {text:?}: {}", e.kind())),
        };
        match built {
            Ok(p) => Some(p),
            Err(why) => {
                self.error(value.span(), format!("{field}: {why}"));
                None
            }
        }
    }

    fn headers(&mut self, at: &str, raw: Spanned<StringMap>) -> Vec<HeaderPredicate> {
        let mut out = Vec::new();
        for (key, value) in raw.into_inner() {
            let field = format!("{at}.{}", key.get_ref());
            let Ok(name) = HeaderName::from_bytes(key.get_ref().as_bytes()) else {
                self.error(key.span(), format!("{field}: not a valid header name"));
                continue;
            };
            let test = match value.get_ref().as_str() {
                "!present" => HeaderTest::Present,
                "!absent" => HeaderTest::Absent,
                other if other.starts_with('!') => {
                    self.error(
                        value.span(),
                        format!("{field}: unknown test {other:?}: use \"!present\", \"!absent\", a glob or \"re:REGEX\""),
                    );
                    continue;
                }
                _ => match self.pattern(&field, &value) {
                    Some(p) => HeaderTest::Matches(p),
                    None => continue,
                },
            };
            out.push(HeaderPredicate { name, test });
        }
        out
    }

    fn body(&mut self, at: &str, raw: Spanned<StringMap>) -> Vec<BodyPredicate> {
        let mut out = Vec::new();
        for (key, value) in raw.into_inner() {
            let pointer = key.get_ref();
            let field = format!("{at}.{pointer:?}");
            if let Err(why) = check_pointer(pointer) {
                self.error(key.span(), format!("{field}: {why}"));
                continue;
            }
            if let Some(pattern) = self.pattern(&field, &value) {
                out.push(BodyPredicate {
                    pointer: pointer.clone(),
                    pattern,
                });
            }
        }
        out
    }

    fn graphql(&mut self, at: &str, raw: Spanned<RawGraphql>) -> GraphqlPredicate {
        let span = raw.span();
        let raw = raw.into_inner();
        let operations = raw.operations.map(|ops| {
            if ops.get_ref().is_empty() {
                self.error(ops.span(), format!("{at}.operations: an empty list allows nothing; remove the key"));
            }
            let mut out = Vec::new();
            for (i, op) in ops.into_inner().into_iter().enumerate() {
                match op.get_ref().as_str() {
                    "query" => out.push(OperationKind::Query),
                    "mutation" => out.push(OperationKind::Mutation),
                    "subscription" => out.push(OperationKind::Subscription),
                    other => self.error(
                        op.span(),
                        format!("{at}.operations[{i}]: unknown operation {other:?}: use \"query\", \"mutation\" or \"subscription\""),
                    ),
                }
            }
            out
        });
        let deny_fields = self
            .names(&format!("{at}.deny_fields"), raw.deny_fields)
            .unwrap_or_default();
        let max_depth = raw.max_depth.and_then(|d| match *d.get_ref() {
            n @ 1..=MAX_DEPTH => usize::try_from(n).ok(),
            n => {
                self.error(
                    d.span(),
                    format!("{at}.max_depth: {n} is out of range: use 1 to {MAX_DEPTH}"),
                );
                None
            }
        });
        let persisted = raw.persisted.map(|list| {
            let mut out = Vec::new();
            for (i, h) in list.into_inner().into_iter().enumerate() {
                let hash = h.get_ref();
                if hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                    out.push(hash.to_ascii_lowercase());
                } else {
                    self.error(
                        h.span(),
                        format!("{at}.persisted[{i}]: expected a SHA-256 hash as 64 hex digits"),
                    );
                }
            }
            out
        });
        if operations.is_none()
            && deny_fields.is_empty()
            && max_depth.is_none()
            && persisted.is_none()
        {
            self.error(
                span,
                format!("{at}: says nothing; give operations, deny_fields, max_depth or persisted"),
            );
        }
        GraphqlPredicate {
            operations,
            deny_fields,
            max_depth,
            persisted,
        }
    }
}

/// An RFC 6901 JSON pointer as a `body` key: from `/`, `~` only as `~0` or `~1`.
fn check_pointer(pointer: &str) -> Result<(), String> {
    if !pointer.starts_with('/') {
        return Err("a JSON pointer starts with '/' (\"/action\", \"/target/owner\")".into());
    }
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err("'~' in a JSON pointer must be written ~0 (and '/' in a key ~1)".into());
        }
    }
    Ok(())
}

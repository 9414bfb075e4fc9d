//! GraphQL request analysis — TEMPORARY STAND-IN.
//!
//! The real module (parsing a GraphQL request and its document) is written on another branch;
//! this file only fixes its API so the `graphql` predicate compiles against it. Every call
//! fails, so a `graphql` predicate fails closed: an allow rule's requirement is never met and
//! a denial's selector always applies. Replaced wholesale when that branch merges.

use std::collections::BTreeSet;

use http::Method;

/// What an operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OperationKind {
    Query,
    Mutation,
    Subscription,
}

/// One GraphQL request of a call (a batch holds several).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphqlRequest {
    pub query: Option<String>,
    pub operation_name: Option<String>,
    pub persisted_hash: Option<String>,
}

/// What a document does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Analysis {
    pub operations: Vec<(Option<String>, OperationKind)>,
    pub fields: BTreeSet<String>,
    pub depth: usize,
}

const NOT_BUILT: &str = "graphql analysis is not built yet";

/// The GraphQL requests an HTTP request carries (GET query string or POST body).
pub fn request_from(
    _method: &Method,
    _query: Option<&str>,
    _content_type: Option<&str>,
    _body: &[u8],
) -> Result<Vec<GraphqlRequest>, String> {
    Err(NOT_BUILT.to_string())
}

/// Analyses one GraphQL document.
pub fn analyze(_document: &str) -> Result<Analysis, String> {
    Err(NOT_BUILT.to_string())
}

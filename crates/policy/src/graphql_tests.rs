//! GraphQL analysis: operations and the choice of the one that runs, fields through fragments
//! and aliases, depth, the bounds (size, nesting, expansion, cycles), every transport form of
//! GraphQL over HTTP and what it refuses; property tests that nothing panics and that depth is
//! exact.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

fn ok(document: &str) -> Analysis {
    analyze(document, None).unwrap_or_else(|e| panic!("{document}: {e}"))
}

fn named(document: &str, name: &str) -> Analysis {
    analyze(document, Some(name)).unwrap_or_else(|e| panic!("{document}: {e}"))
}

fn err(document: &str, name: Option<&str>) -> String {
    match analyze(document, name) {
        Ok(a) => panic!("{document}: analysed as {a:?}"),
        Err(e) => e,
    }
}

fn fields(analysis: &Analysis) -> Vec<&str> {
    analysis.fields.iter().map(String::as_str).collect()
}

fn post_json(body: &str) -> Result<Vec<GraphqlRequest>, String> {
    request_from(
        &Method::POST,
        None,
        Some("application/json"),
        body.as_bytes(),
    )
}

fn request(query: Option<&str>, name: Option<&str>, hash: Option<&str>) -> GraphqlRequest {
    GraphqlRequest {
        query: query.map(str::to_string),
        operation_name: name.map(str::to_string),
        persisted_hash: hash.map(str::to_string),
    }
}

const HASH: &str = "ecf4edb46db40b5132295c0291d62fb65d6759a9eedfa4d5d612dd5ec54a6b38";

// --- operations ---------------------------------------------------------------------------

#[test]
fn operation_kinds_round_trip_through_their_keywords() {
    for kind in [
        OperationKind::Query,
        OperationKind::Mutation,
        OperationKind::Subscription,
    ] {
        assert_eq!(OperationKind::parse(kind.as_str()), Some(kind));
    }
    assert_eq!(OperationKind::parse("Query"), None);
    assert_eq!(OperationKind::parse(""), None);
}

#[test]
fn each_kind_of_operation_is_recognised_named_or_anonymous() {
    let cases = [
        ("query Q { a }", Some("Q"), OperationKind::Query),
        ("query { a }", None, OperationKind::Query),
        ("mutation M { a }", Some("M"), OperationKind::Mutation),
        ("mutation { a }", None, OperationKind::Mutation),
        (
            "subscription S { a }",
            Some("S"),
            OperationKind::Subscription,
        ),
        ("subscription { a }", None, OperationKind::Subscription),
        (
            "query Q($id: ID!) @live { a(id: $id) }",
            Some("Q"),
            OperationKind::Query,
        ),
    ];
    for (document, name, kind) in cases {
        let analysis = ok(document);
        assert_eq!(
            analysis.operations,
            vec![(name.map(str::to_string), kind)],
            "{document}"
        );
        assert_eq!(fields(&analysis), ["a"], "{document}");
    }
}

#[test]
fn a_shorthand_selection_set_is_an_anonymous_query() {
    let analysis = ok("{ viewer { login } }");
    assert_eq!(analysis.operations, vec![(None, OperationKind::Query)]);
    assert_eq!(fields(&analysis), ["login", "viewer"]);
    assert_eq!(analysis.depth, 2);
}

#[test]
fn operation_name_chooses_whose_fields_count_and_every_operation_is_listed() {
    let document =
        "query Read { repository { name } } mutation Drop { deleteRepository(id: 1) { id } }";
    let read = named(document, "Read");
    let drop = named(document, "Drop");
    let listed = vec![
        (Some("Read".to_string()), OperationKind::Query),
        (Some("Drop".to_string()), OperationKind::Mutation),
    ];
    assert_eq!(read.operations, listed);
    assert_eq!(drop.operations, listed);
    assert_eq!(fields(&read), ["name", "repository"]);
    assert_eq!(fields(&drop), ["deleteRepository", "id"]);
}

#[test]
fn several_operations_without_operation_name_are_an_error() {
    let e = err("query A { a } query B { b }", None);
    assert!(
        e.contains("2 operations") && e.contains("operationName"),
        "{e}"
    );
}

#[test]
fn an_unknown_operation_name_is_an_error_that_does_not_echo_it() {
    let e = err("query A { a }", Some("SecretName"));
    assert!(e.contains("names no operation"), "{e}");
    assert!(!e.contains("SecretName"), "{e}");
    // An anonymous operation has no name to choose it by.
    err("{ a }", Some("A"));
}

#[test]
fn an_anonymous_operation_beside_others_and_duplicate_names_are_errors() {
    let e = err("{ a } query B { b }", Some("B"));
    assert!(e.contains("anonymous"), "{e}");
    let e = err("query A { a } mutation A { b }", Some("A"));
    assert!(e.contains("two operations alike"), "{e}");
}

#[test]
fn documents_that_are_not_executable_are_errors() {
    for document in ["", "   # a comment"] {
        err(document, None);
    }
    assert!(err("fragment F on T { a }", None).contains("no operation"));
    let e = err("type Query { a: Int } { a }", None);
    assert!(e.contains("type system definition"), "{e}");
    let e = err("query { a ", None);
    assert!(e.contains("not valid GraphQL"), "{e}");
    let e = err("query { a(x: \"secret-value\" }", None);
    assert!(!e.contains("secret-value"), "{e}");
}

// --- fields, fragments, aliases -------------------------------------------------------------

#[test]
fn an_alias_counts_as_the_field_it_names() {
    let analysis = ok("mutation { x: deleteRepository(id: 1) { y: id } __typename }");
    assert_eq!(fields(&analysis), ["__typename", "deleteRepository", "id"]);
}

#[test]
fn named_inline_and_nested_fragments_are_expanded() {
    let document = "
        query Q { viewer { ...User ... on Bot { botName } ... @include(if: true) { plain } } }
        fragment User on User { login ...Repos }
        fragment Repos on User { repositories { nodes { name ... on Repo { owner { login } } } } }
        fragment Unused on User { deleteRepository }
    ";
    let analysis = ok(document);
    assert_eq!(
        fields(&analysis),
        [
            "botName",
            "login",
            "name",
            "nodes",
            "owner",
            "plain",
            "repositories",
            "viewer"
        ]
    );
    // viewer(1) repositories(2) nodes(3) owner(4) login(5): fragments add no depth of their own.
    assert_eq!(analysis.depth, 5);
}

#[test]
fn a_fragment_spread_at_the_top_of_an_operation_counts() {
    let analysis = ok("mutation { ...Danger } fragment Danger on Mutation { x: deleteRepository }");
    assert_eq!(fields(&analysis), ["deleteRepository"]);
    assert_eq!(analysis.depth, 1);
}

#[test]
fn depth_counts_fields_through_fragments() {
    assert_eq!(ok("{ a }").depth, 1);
    assert_eq!(ok("{ a b { c } d }").depth, 2);
    assert_eq!(
        ok("{ a { ...F } } fragment F on T { b { ...G } } fragment G on T { c }").depth,
        3
    );
    assert_eq!(ok("{ ... on T { ... on T { ... on T { a } } } }").depth, 1);
}

#[test]
fn unknown_and_duplicate_fragments_are_errors() {
    assert!(err("{ ...Nope }", None).contains("does not define"));
    // Even in a fragment the operation does not use.
    assert!(err("{ a } fragment F on T { ...Nope }", None).contains("does not define"));
    assert!(err("{ ...F } fragment F on T { a } fragment F on T { b }", None).contains("twice"));
}

#[test]
fn a_fragment_cycle_is_an_error() {
    let e = err(
        "{ ...A } fragment A on T { a ...B } fragment B on T { b { ...A } }",
        None,
    );
    assert!(e.contains("cycle") && e.contains("2 fragments"), "{e}");
    let e = err("{ ...A } fragment A on T { ...A }", None);
    assert!(e.contains("cycle"), "{e}");
    // A cycle among fragments the operation does not use is still an invalid document.
    let e = err(
        "{ a } fragment A on T { ...B } fragment B on T { ...A }",
        None,
    );
    assert!(e.contains("cycle"), "{e}");
    // A diamond is no cycle.
    let analysis =
        ok("{ ...A ...B } fragment A on T { ...C } fragment B on T { ...C } fragment C on T { c }");
    assert_eq!(fields(&analysis), ["c"]);
}

// --- bounds -------------------------------------------------------------------------------

/// `f { f { … } }`: `depth` fields, each inside the one before; the innermost selects `inner`
/// beside nothing else when given.
fn fields_chain(depth: usize, inner: Option<&str>) -> String {
    let mut selection = "f".to_string();
    for _ in 1..depth {
        selection.push_str(" { f");
    }
    if let Some(inner) = inner {
        selection.push_str(&format!(" {{ {inner} }}"));
    }
    selection.push_str(&" }".repeat(depth.saturating_sub(1)));
    selection
}

fn chain(depth: usize) -> String {
    format!("{{ {} }}", fields_chain(depth, None))
}

#[test]
fn nesting_up_to_the_limit_is_analysed_and_beyond_it_refused() {
    assert_eq!(ok(&chain(MAX_DEPTH)).depth, MAX_DEPTH);
    let e = err(&chain(MAX_DEPTH + 1), None);
    assert!(e.contains("deeper than 64"), "{e}");
    let e = err(&chain(PARSER_RECURSION_LIMIT + 1), None);
    assert!(e.contains("nests deeper than latchkey parses"), "{e}");
}

#[test]
fn fragments_that_nest_past_the_limit_together_are_refused() {
    // Each fragment nests 40 deep; F spreads G at its bottom: 81 deep together.
    let document = format!(
        "{{ ...F }} fragment F on T {{ {} }} fragment G on T {{ {} }}",
        fields_chain(40, Some("...G")),
        fields_chain(40, None)
    );
    assert_eq!(
        ok(&format!("{{ {} }}", fields_chain(3, Some("g")))).depth,
        4
    );
    let e = err(&document, None);
    assert!(
        e.contains("deeper than 64") && e.contains("fragments expanded"),
        "{e}"
    );
}

#[test]
fn an_oversize_document_is_refused_before_parsing() {
    let document = format!("{{ a }}{}", " ".repeat(MAX_DOCUMENT_BYTES));
    let e = err(&document, None);
    assert!(e.contains("over the limit"), "{e}");
}

#[test]
fn fragment_expansion_past_the_selection_limit_is_refused_quickly() {
    // Each fragment spreads the next ten times: 10^6 selections if expanded.
    let mut document = "{ ...F0 }".to_string();
    for i in 0..6 {
        document.push_str(&format!(
            " fragment F{i} on T {{ {} }}",
            format!("...F{} ", i + 1).repeat(10)
        ));
    }
    document.push_str(" fragment F6 on T { a }");
    let started = Instant::now();
    let e = err(&document, None);
    assert!(e.contains("over 10000 selections"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(2));
    // A flat document past the limit too.
    let flat = format!("{{ {} }}", "a ".repeat(MAX_SELECTIONS + 1));
    assert!(err(&flat, None).contains("selections"));
    assert_eq!(
        ok(&format!("{{ {} }}", "a ".repeat(MAX_SELECTIONS))).depth,
        1
    );
}

#[test]
fn a_hundred_thousand_open_braces_are_refused_quickly() {
    for document in [
        "{".repeat(100_000),
        format!("{{ a(x: {}) }}", "[".repeat(100_000)),
        format!("query($v: {}) {{ a }}", "[".repeat(100_000)),
    ] {
        let started = Instant::now();
        let e = err(&document, None);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(!e.is_empty());
    }
}

// --- transport ------------------------------------------------------------------------------

#[test]
fn a_json_post_carries_one_request() {
    let got = post_json(r#"{"query": "{ a }", "operationName": "Q", "variables": {"x": 1}}"#);
    assert_eq!(got, Ok(vec![request(Some("{ a }"), Some("Q"), None)]));
    let got = post_json(r#"{"query": "{ a }", "operationName": null, "extensions": null}"#);
    assert_eq!(got, Ok(vec![request(Some("{ a }"), None, None)]));
}

#[test]
fn a_json_batch_returns_every_element_in_order() {
    let body = format!(
        r#"[{{"query": "{{ a }}"}}, {{"query": "mutation {{ b }}", "operationName": "M"}}, {{"extensions": {{"persistedQuery": {{"version": 1, "sha256Hash": "{HASH}"}}}}}}]"#
    );
    let got = post_json(&body);
    assert_eq!(
        got,
        Ok(vec![
            request(Some("{ a }"), None, None),
            request(Some("mutation { b }"), Some("M"), None),
            request(None, None, Some(HASH)),
        ])
    );
    assert!(post_json("[]").unwrap_err().contains("empty batch"));
    let e = post_json(r#"[{"query": "{ a }"}, 7]"#).unwrap_err();
    assert!(e.contains("$[1]"), "{e}");
    let e = post_json(r#"[{"query": "{ a }"}, {"variables": {}}]"#).unwrap_err();
    assert!(e.contains("$[1] has neither"), "{e}");
}

#[test]
fn a_persisted_query_may_come_without_its_document() {
    let body = format!(
        r#"{{"extensions": {{"persistedQuery": {{"version": 1, "sha256Hash": "{HASH}"}}}}}}"#
    );
    assert_eq!(post_json(&body), Ok(vec![request(None, None, Some(HASH))]));
    // Both: the hash is returned beside the document (automatic persisted queries register it).
    let body = format!(
        r#"{{"query": "{{ a }}", "extensions": {{"persistedQuery": {{"sha256Hash": "{HASH}"}}}}}}"#
    );
    assert_eq!(
        post_json(&body),
        Ok(vec![request(Some("{ a }"), None, Some(HASH))])
    );
    // Other extensions alone do not make a request.
    assert!(post_json(r#"{"extensions": {"tracing": true}}"#).is_err());
}

#[test]
fn a_malformed_persisted_query_hash_is_refused_without_echoing_it() {
    let upper = HASH.to_uppercase();
    for hash in [
        format!("\"{upper}\""),
        "\"abc\"".to_string(),
        "12".to_string(),
    ] {
        let body = format!(r#"{{"extensions": {{"persistedQuery": {{"sha256Hash": {hash}}}}}}}"#);
        let e = post_json(&body).unwrap_err();
        assert!(e.contains("64 lowercase hex"), "{e}");
        assert!(!e.contains(&upper), "{e}");
    }
    let e = post_json(r#"{"extensions": {"persistedQuery": {"version": 1}}}"#).unwrap_err();
    assert!(e.contains("no sha256Hash"), "{e}");
    let e = post_json(r#"{"extensions": {"persistedQuery": true}}"#).unwrap_err();
    assert!(e.contains("not an object"), "{e}");
    let e = post_json(r#"{"query": "{ a }", "extensions": []}"#).unwrap_err();
    assert!(e.contains("$.extensions is not an object"), "{e}");
}

#[test]
fn a_get_carries_url_decoded_parameters() {
    let got = request_from(
        &Method::GET,
        Some("query=query%20Q%7B%20a%20%7D&operationName=Q&variables=%7B%7D&other=1"),
        None,
        b"",
    );
    assert_eq!(
        got,
        Ok(vec![request(Some("query Q{ a }"), Some("Q"), None)])
    );
    let got = request_from(&Method::GET, Some("query=%7B+a+%7D"), None, b"");
    assert_eq!(got, Ok(vec![request(Some("{ a }"), None, None)]));
    let extensions = format!(
        "%7B%22persistedQuery%22%3A%7B%22version%22%3A1%2C%22sha256Hash%22%3A%22{HASH}%22%7D%7D"
    );
    let got = request_from(
        &Method::GET,
        Some(&format!("extensions={extensions}")),
        None,
        b"",
    );
    assert_eq!(got, Ok(vec![request(None, None, Some(HASH))]));
}

#[test]
fn an_ambiguous_get_is_refused() {
    let refused = [
        (Some("query=%7Ba%7D&query=%7Bb%7D"), &b""[..], "twice"),
        (Some("Query=%7Ba%7D"), b"", "another case"),
        (Some("query=%FF"), b"", "not UTF-8"),
        (
            Some("query=%7Ba%7D"),
            b"{\"query\": \"{ b }\"}",
            "with a body",
        ),
        (Some("other=1"), b"", "neither a query"),
        (None, b"", "neither a query"),
        (
            Some("extensions=%7B%22a%22%3A1%2C%22A%22%3A2%7D"),
            b"",
            "ambiguous",
        ),
        (Some("extensions=nope"), b"", "not JSON"),
    ];
    for (query_string, body, why) in refused {
        let e = request_from(&Method::GET, query_string, None, body).unwrap_err();
        assert!(e.contains(why), "{query_string:?}: {e}");
    }
}

#[test]
fn an_application_graphql_body_is_the_document() {
    let got = request_from(
        &Method::POST,
        Some("operationName=Q"),
        Some("application/graphql; charset=utf-8"),
        b"query Q { a }",
    );
    assert_eq!(
        got,
        Ok(vec![request(Some("query Q { a }"), Some("Q"), None)])
    );
    let e = request_from(
        &Method::POST,
        Some("query=%7Bb%7D"),
        Some("application/graphql"),
        b"{ a }",
    )
    .unwrap_err();
    assert!(e.contains("which wins"), "{e}");
    let e = request_from(
        &Method::POST,
        None,
        Some("application/graphql"),
        b"{ a \xff }",
    )
    .unwrap_err();
    assert!(e.contains("not UTF-8"), "{e}");
}

#[test]
fn content_types_are_matched_by_essence_and_charset() {
    for content_type in [
        "application/json",
        "Application/JSON; charset=UTF-8",
        "application/json;charset=\"utf-8\"",
    ] {
        let got = request_from(
            &Method::POST,
            None,
            Some(content_type),
            br#"{"query": "{ a }"}"#,
        );
        assert!(got.is_ok(), "{content_type}: {got:?}");
    }
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("application/json; charset=latin1"),
    ] {
        let got = request_from(&Method::POST, None, content_type, br#"{"query": "{ a }"}"#);
        assert!(got.is_err(), "{content_type:?}: {got:?}");
    }
}

#[test]
fn graphql_parameters_in_the_url_of_a_json_post_are_refused() {
    let e = request_from(
        &Method::POST,
        Some("query=%7Bb%7D"),
        Some("application/json"),
        br#"{"query": "{ a }"}"#,
    )
    .unwrap_err();
    assert!(e.contains("in the URL"), "{e}");
}

#[test]
fn duplicate_or_case_variant_json_keys_are_refused() {
    for body in [
        r#"{"query": "{ a }", "query": "mutation { b }"}"#,
        r#"{"query": "{ a }", "Query": "mutation { b }"}"#,
        r#"[{"query": "{ a }"}, {"query": "{ a }", "operationName": "A", "operationname": "B"}]"#,
        r#"{"query": "{ a }", "extensions": {"persistedQuery": {"sha256Hash": "x", "sha256hash": "y"}}}"#,
    ] {
        let e = post_json(body).unwrap_err();
        assert!(e.contains("ambiguous"), "{body}: {e}");
    }
    // A key a loose parser reads as `query` is read as `query`.
    assert_eq!(
        post_json(r#"{"QUERY": "{ a }"}"#),
        Ok(vec![request(Some("{ a }"), None, None)])
    );
}

#[test]
fn non_graphql_bodies_are_refused_without_echoing_values() {
    let refused = [
        ("not json at all", "not JSON"),
        (r#"{"query": 7}"#, "$.query is not a string"),
        (
            r#"{"query": {"secret": "s3cr3t"}}"#,
            "$.query is not a string",
        ),
        (
            r#"{"operationName": ["s3cr3t"], "query": "{ a }"}"#,
            "$.operationName is not a string",
        ),
        (r#"{"hello": "s3cr3t"}"#, "neither a query"),
        (r#""s3cr3t""#, "neither an object"),
        ("", "not JSON"),
    ];
    for (body, why) in refused {
        let e = post_json(body).unwrap_err();
        assert!(e.contains(why), "{body}: {e}");
        assert!(!e.contains("s3cr3t"), "{body}: {e}");
    }
    for method in [Method::PUT, Method::DELETE, Method::PATCH] {
        let e = request_from(
            &method,
            None,
            Some("application/json"),
            br#"{"query": "{ a }"}"#,
        )
        .unwrap_err();
        assert!(e.contains("only GET and POST"), "{e}");
    }
}

// --- properties -----------------------------------------------------------------------------

/// How one level of a generated document wraps the field below it.
#[derive(Debug, Clone, Copy)]
enum Wrap {
    Plain,
    Inline,
    Spread,
}

/// A document whose deepest field is at `levels.len()`, each level wrapped as generated, with
/// shallower siblings (`__typename`, aliases) along the way.
fn generated(levels: &[(String, Wrap, bool)]) -> String {
    let mut fragments = String::new();
    let mut inner = String::new();
    for (i, (name, wrap, sibling)) in levels.iter().enumerate().rev() {
        let selection = if inner.is_empty() {
            name.clone()
        } else {
            format!("{name} {{ {inner} }}")
        };
        let selection = if *sibling {
            format!("__typename alias{i}: {selection} extra")
        } else {
            selection
        };
        inner = match wrap {
            Wrap::Plain => selection,
            Wrap::Inline => format!("... on T{i} {{ {selection} }}"),
            Wrap::Spread => {
                fragments.push_str(&format!(" fragment F{i} on T {{ {selection} }}"));
                format!("...F{i}")
            }
        };
    }
    format!("query Generated {{ {inner} }}{fragments}")
}

fn level() -> impl Strategy<Value = (String, Wrap, bool)> {
    (
        "[a-z][a-zA-Z0-9_]{0,6}",
        prop_oneof![Just(Wrap::Plain), Just(Wrap::Inline), Just(Wrap::Spread)],
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn analyze_never_panics_on_arbitrary_text(document in ".{0,300}", name in proptest::option::of("[A-Za-z]{0,4}")) {
        let _ = analyze(&document, name.as_deref());
    }

    #[test]
    fn analyze_never_panics_on_graphql_like_text(document in "[{}()\\[\\]:.@$!=\"# a-zA-Z0-9_\n]{0,300}") {
        let _ = analyze(&document, None);
    }

    #[test]
    fn request_from_never_panics(
        method in prop_oneof![Just(Method::GET), Just(Method::POST), Just(Method::PUT)],
        query_string in proptest::option::of(".{0,80}"),
        content_type in proptest::option::of(prop_oneof![Just("application/json".to_string()), Just("application/graphql".to_string()), ".{0,30}"]),
        body in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let _ = request_from(&method, query_string.as_deref(), content_type.as_deref(), &body);
    }

    #[test]
    fn request_from_never_panics_on_json_like_bodies(body in "[\\[\\]{}\":, a-zA-Z0-9]{0,200}") {
        let _ = request_from(&Method::POST, None, Some("application/json"), body.as_bytes());
    }

    #[test]
    fn a_generated_document_has_exactly_its_depth(levels in proptest::collection::vec(level(), 1..=MAX_DEPTH)) {
        let document = generated(&levels);
        let analysis = analyze(&document, Some("Generated")).map_err(|e| TestCaseError::fail(format!("{document}: {e}")))?;
        prop_assert_eq!(analysis.depth, levels.len(), "{}", document);
        for (name, _, _) in &levels {
            prop_assert!(analysis.fields.contains(name), "{} lacks {}", document, name);
        }
        prop_assert!(!analysis.fields.iter().any(|f| f.starts_with("alias")));
    }

    #[test]
    fn a_generated_document_past_the_limit_is_refused(levels in proptest::collection::vec(level(), MAX_DEPTH + 1..=MAX_DEPTH + 8)) {
        prop_assert!(analyze(&generated(&levels), None).is_err());
    }
}

#[test]
fn pathological_documents_at_the_size_limit_are_answered_quickly() {
    let n = MAX_DOCUMENT_BYTES - 32;
    let chain_of = |last: &str| {
        let spreads: String = (0..8000)
            .map(|i| format!("fragment F{i} on T {{ ...F{} }} ", i + 1))
            .collect();
        format!("{{ ...F0 }} {spreads}fragment F8000 on T {{ {last} }}")
    };
    let cases = [
        ("{".repeat(n), None),
        ("}".repeat(n), None),
        ("@!$".repeat(n / 3), None),
        (format!("{{ a(x: {}) }}", "{a:".repeat(n / 3 - 8)), None),
        (format!("{{ {} }}", "... on T { ".repeat(n / 11 - 1)), None),
        (chain_of("a"), Some(1)),
        (chain_of("...F0"), None),
    ];
    for (document, depth) in cases {
        assert!(document.len() <= MAX_DOCUMENT_BYTES, "{}", document.len());
        let started = Instant::now();
        let got = analyze(&document, None);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(got.map(|a| a.depth).ok(), depth);
    }
}

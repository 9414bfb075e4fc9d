//! Validation reports every problem at once: unknown keys, wrong types and duplicates hide
//! nothing else, and an entry with any problem never becomes part of a policy.

use std::path::Path;

use proptest::prelude::*;

use super::compile::{compile_one, compile_sources};

fn errors(text: &str) -> Vec<String> {
    match compile_one(text) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn an_unknown_key_is_reported_with_the_closest_known_key_and_hides_nothing() {
    let e = errors(
        "[[rules]]\nname = \"a\"\nhosts = [\"a.com\"]\nmethds = [\"GET\"]\nports = [0]\npaths = [\"v1\"]\n",
    );
    assert_eq!(
        e,
        [
            "test.toml:4:1: rules[0]: unknown key `methds`; did you mean `methods`?",
            "test.toml:5:10: rules[0].ports[0]: invalid port 0: must be 1 to 65535",
            "test.toml:6:10: rules[0].paths[0]: path glob \"v1\" must start with '/'",
        ]
    );
}

#[test]
fn a_key_far_from_every_known_one_lists_the_known_keys() {
    let e = errors("[secrets.k]\nsource = \"exec:true\"\ncolour = \"blue\"\n");
    assert_eq!(
        e,
        ["test.toml:3:1: secrets.k: unknown key `colour`; known keys: source, ttl, timeout, refresh, stale_for"]
    );
}

#[test]
fn a_wrong_type_is_reported_at_its_value_and_the_other_fields_are_still_checked() {
    let e = errors(
        "[[rules]]\nname = \"a\"\nhosts = [\"a.com\", 7]\nports = \"443\"\nmethods = [\"get\"]\ntunnel = 1\n",
    );
    assert_eq!(
        e,
        [
            "test.toml:3:19: rules[0].hosts[1]: expected a string, found an integer",
            "test.toml:4:9: rules[0].ports: expected a list of integers, found a string",
            "test.toml:5:12: rules[0].methods[0]: invalid method \"get\": methods are upper-case tokens; did you mean \"GET\"?",
            "test.toml:6:10: rules[0].tunnel: expected true or false, found an integer",
        ]
    );
}

#[test]
fn a_scalar_where_a_list_belongs_suggests_the_list() {
    let e = errors("[[rules]]\nname = \"a\"\nhosts = \"a.com\"\n");
    assert_eq!(
        e,
        ["test.toml:3:9: rules[0].hosts: expected a list of strings, found a string; write hosts = [\"a.com\"]"]
    );
}

#[test]
fn a_rules_table_instead_of_a_list_of_tables_says_how_to_write_it() {
    let e = errors("[rules]\nname = \"a\"\nhosts = [\"a.com\"]\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("test.toml:1:1: rules: expected a list of tables, found a table; write each rule as [[rules]]"),
        "{e:?}"
    );
}

#[test]
fn a_duplicate_is_reported_whichever_copy_is_invalid() {
    // The first copy has an unknown key, the second a bad port: both problems and the duplicate.
    let e = errors(
        "[[rules]]\nname = \"x\"\nhosts = [\"a.com\"]\ncolor = 1\n\n[[rules]]\nname = \"x\"\nhosts = [\"b.com\"]\nports = [0]\n",
    );
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(e[0].starts_with("test.toml:4:1: rules[0]: unknown key `color`"));
    assert_eq!(
        e[1],
        "test.toml:7:8: rules[1].name: duplicate rule name \"x\", first defined at test.toml:1"
    );
    assert!(e[2].starts_with("test.toml:9:10: rules[1].ports[0]: invalid port 0"));
}

#[test]
fn an_invalid_secret_or_rule_is_reported_once_not_again_where_it_is_used() {
    // The secret and the rule are broken; the rule using the secret and the identity naming the
    // rule add nothing of their own.
    let e = errors(
        "[secrets.k]\nsource = \"vault:k\"\n\n[[rules]]\nname = \"r\"\nhosts = [\"a.com\"]\nports = [0]\n[rules.inject.headers]\nx-key = \"{{secret.k}}\"\n\n[identities.ci]\ntoken = \"exec:true\"\nrules = [\"r\"]\n",
    );
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with("test.toml:2:10: secrets.k.source:"),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("test.toml:7:10: rules[0].ports[0]:"),
        "{e:?}"
    );
}

#[test]
fn a_syntax_error_stops_its_own_file_only() {
    let e = compile_sources(&[
        (Path::new("a.toml"), "[[rules]]\nname = \"a\"\nhosts = [\n"),
        (Path::new("b.toml"), "[[rules]]\nname = \"b\"\nhosts = []\n"),
    ])
    .expect_err("both files are invalid");
    let e: Vec<String> = e.iter().map(|e| e.to_string()).collect();
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(e[0].starts_with("a.toml:4:1: invalid TOML: "), "{e:?}");
    assert!(!e[0].contains('\n'), "{e:?}");
    assert_eq!(
        e[1],
        "b.toml:3:9: rules[0].hosts: a rule needs at least one host"
    );
}

#[test]
fn a_misplaced_key_in_a_credential_is_reported_and_the_credential_is_not_used() {
    let e = errors(
        "[credentials.c]\nkind = \"jwt\"\nalg = \"HS256\"\nkey = \"exec:true\"\nregion = \"x\"\naudiance = 1\n",
    );
    assert_eq!(
        e,
        [
            "test.toml:5:10: credentials.c.region: does not apply to kind \"jwt\"",
            "test.toml:6:1: credentials.c: unknown key `audiance`; did you mean `audience`?",
        ]
    );
}

#[test]
fn aws_keys_are_named_both_or_neither_and_neither_signs_with_latchkeys_identity() {
    let e = errors(
        "[credentials.c]\nkind = \"aws_sigv4\"\naccess_key_id = \"env:A\"\n\n[credentials.d]\nkind = \"aws_sigv4\"\nsession_token = \"env:T\"\n",
    );
    let needs: Vec<&String> = e.iter().filter(|e| e.contains(" too ")).collect();
    assert_eq!(needs.len(), 2, "{e:?}");
    assert!(needs[0].contains("credentials.c.secret_access_key: needs secret_access_key too"));
    assert!(needs[1].contains("credentials.d.access_key_id: needs access_key_id too"));
    let policy = compile_one("[credentials.own]\nkind = \"aws_sigv4\"\nregion = \"us-east-1\"\n")
        .expect("no keys is valid");
    let own = policy.credential("own").expect("declared");
    assert!(matches!(
        own.kind,
        crate::signing::Kind::AwsSigV4 {
            static_keys: false,
            has_session_token: false,
            ..
        }
    ));
}

/// Keys no policy table knows, with values of every TOML type.
fn unknown_keys() -> impl Strategy<Value = Vec<(String, &'static str)>> {
    let key = "[a-z][a-z0-9_]{0,12}".prop_filter("not a rule key", |k| {
        !super::schema::RULE_KEYS.contains(&k.as_str())
    });
    let value = prop::sample::select(vec![
        "\"text\"",
        "7",
        "1.5",
        "true",
        "[\"GET\"]",
        "{ a = 1 }",
        "1979-05-27T07:32:00Z",
    ]);
    prop::collection::btree_map(key, value, 1..6).prop_map(|m| m.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Unknown keys anywhere in a rule are each reported at the key, together with a real error
    /// in the same rule, and nothing else is.
    #[test]
    fn proptest_every_unknown_key_is_reported_with_a_colocated_real_error(
        keys in unknown_keys(),
        at in prop::collection::vec(0usize..4, 6),
    ) {
        let mut lines: Vec<String> = vec![
            "name = \"r\"".into(),
            "hosts = [\"a.com\"]".into(),
            "ports = [70000]".into(),
            "methods = [\"GET\"]".into(),
        ];
        for (i, (key, value)) in keys.iter().enumerate() {
            lines.insert(at[i] % (lines.len() + 1), format!("{key} = {value}"));
        }
        let text = format!("[[rules]]\n{}\n", lines.join("\n"));
        let e = match compile_one(&text) {
            Ok(_) => panic!("a rule with unknown keys compiled:\n{text}"),
            Err(e) => e,
        };
        prop_assert_eq!(e.len(), keys.len() + 1, "{:?}\n{}", e, text);
        for (key, _) in &keys {
            let line = 2 + lines.iter().position(|l| l.starts_with(&format!("{key} = "))).unwrap_or(0);
            prop_assert!(
                e.iter().any(|p| p.line == line
                    && p.col == 1
                    && p.message.starts_with(&format!("rules[0]: unknown key `{key}`"))),
                "{key} at line {line} not reported: {e:?}\n{text}"
            );
        }
        let port_line = 2 + lines.iter().position(|l| l.starts_with("ports")).unwrap_or(0);
        prop_assert!(
            e.iter().any(|p| p.line == port_line && p.message.contains("invalid port 70000")),
            "{e:?}\n{text}"
        );
    }
}

#[test]
fn a_bad_ttl_does_not_hide_a_bad_source_in_the_same_secret() {
    let e = errors("[secrets.k]\nsource = \"vault:k\"\nttl = \"soon\"\n");
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with("test.toml:2:10: secrets.k.source: "),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("test.toml:3:7: secrets.k.ttl: \"soon\""),
        "{e:?}"
    );
}

#[test]
fn every_toml_spelling_of_a_valid_rule_compiles() {
    for text in [
        "[secrets.k]\nsource = \"exec:true\"\n[[rules]]\nname = \"a\"\nhosts = [\"a.com\"]\n[rules.inject.headers]\nx-key = \"{{secret.k}}\"\n",
        "[secrets.k]\nsource = \"exec:true\"\n[[rules]]\nname = \"a\"\nhosts = [\"a.com\"]\ninject.headers.x-key = \"{{secret.k}}\"\n",
        "secrets.k.source = \"exec:true\"\n[[rules]]\n\"name\" = \"a\"\nhosts = [\"a.com\"]\ninject = { headers = { x-key = \"{{secret.k}}\" } }\n",
        "secrets = { k = { source = \"exec:true\" } }\nrules = [{ name = \"a\", hosts = [\"a.com\"], inject = { headers = { x-key = \"{{secret.k}}\" } } }]\n",
    ] {
        let policy = super::compile::compile_sources_with(
            &[(Path::new("test.toml"), text)],
            super::SecretLoading::Skip,
        )
        .unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        let rule = &policy.rules()[0];
        assert_eq!(rule.name, "a", "{text}");
        assert_eq!(rule.inject_headers.len(), 1, "{text}");
        assert!(rule.bound.contains("k"), "{text}");
    }
}

#[test]
fn websocket_is_refused_where_it_cannot_work_and_placeholders_in_messages_need_it() {
    let e = errors(
        "[[rules]]\nname = \"t\"\nhosts = [\"a.com\"]\ntunnel = true\nwebsocket = true\n\n\
         [[rules]]\nname = \"p\"\nhosts = [\"b.com\"]\nmethods = [\"POST\"]\nwebsocket = true\n\n\
         [[rules]]\nname = \"q\"\nhosts = [\"c.com\"]\nplaceholders = [\"websocket\"]\n",
    );
    assert_eq!(e.len(), 3, "{e:#?}");
    assert!(
        e[0].starts_with("test.toml:5:13: rules[0].websocket: a tunnel rule"),
        "{e:#?}"
    );
    assert!(
        e[1].starts_with("test.toml:11:13: rules[1].websocket: a WebSocket handshake is a GET"),
        "{e:#?}"
    );
    assert!(
        e[2].starts_with(
            "test.toml:16:16: rules[2].placeholders: placeholders in websocket messages need"
        ),
        "{e:#?}"
    );
}

/// MCP over a WebSocket: a GET-only rule with `websocket = true` may carry `mcp` (its messages
/// ride the socket), where a GET-only rule without one may not.
#[test]
fn a_get_only_rule_carries_mcp_only_over_a_websocket() {
    let ws = "[[rules]]\nname = \"m\"\nhosts = [\"a.com\"]\nmethods = [\"GET\"]\nwebsocket = true\nmcp = { deny_tools = [\"delete_*\"] }\n";
    let policy = compile_one(ws).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(policy.rules[0].mcp.is_some());
    let e = errors(&ws.replace("websocket = true\n", "")).join("\n");
    assert!(e.contains("MCP messages are POSTs"), "{e}");
}

#[test]
fn mcp_and_capture_tables_are_checked_key_by_key() {
    let e = errors(
        "[secrets.idp_access_token]\nsource = \"env:X\"\n\n\
         [[rules]]\nname = \"m\"\nhosts = [\"a.com\"]\nmethods = [\"GET\"]\nmcp = { tools = [], tool = [\"x\"] }\n\n\
         [[rules]]\nname = \"c\"\nhosts = [\"*.b.com\"]\ncapture = { fields = [\"access_token\", \"bad name\"], as = \"idp\", ttl = \"soon\" }\n",
    );
    let text = e.join("\n");
    for needle in [
        "rules[0].mcp: unknown key `tool`; did you mean `tools`?",
        "rules[0].mcp: MCP messages are POSTs",
        "rules[0].mcp.tools: an empty list allows nothing",
        "rules[1].capture.fields: \"bad name\"",
        "rules[1].capture.as: captured token \"idp_access_token\" would have the name of a declared secret",
        "rules[1].capture: the rule's hosts include a wildcard",
        "rules[1].capture.ttl: \"soon\" is not a duration",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

//! Secret declarations that latchkey must refuse to start on, each reported as
//! `FILE:LINE:COL: message` with exit status 1, never with a secret value in the message.

use crate::support::{latchkey, problems_in, CliOutput};

const RULE_USING_OPENAI: &str = r#"
[[rules]]
name  = "openai"
hosts = ["api.test"]
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"
"#;

/// Runs `serve` on `main.toml` = `policy` with `env` set (and `unset` removed), expecting it to
/// refuse to start with exit status 1.
fn serve_refuses(policy: &str, env: &[(&str, &str)], unset: &[&str]) -> CliOutput {
    let mut builder = latchkey().policy("main.toml", policy);
    for (name, value) in env {
        builder = builder.env(name, value);
    }
    for name in unset {
        builder = builder.env_remove(name);
    }
    let out = builder.run_expecting_failure();
    assert_eq!(
        out.code(),
        Some(1),
        "serve on an invalid policy must exit 1: {out:#?}"
    );
    out
}

/// Asserts a `main.toml:LINE:COL:` problem on one of `lines` whose message holds every word.
fn assert_problem_at(out: &CliOutput, lines: &[u32], words: &[&str]) {
    let output = format!("{}{}", out.stdout, out.stderr);
    let problems = problems_in(&output, "main.toml");
    assert!(
        problems
            .iter()
            .any(|(l, c, m)| lines.contains(l) && *c >= 1 && words.iter().all(|w| m.contains(w))),
        "expected `main.toml:{lines:?}:COL: …{words:?}…`, got {problems:?} in:\n{output}"
    );
}

#[test]
fn an_env_secret_whose_variable_is_not_set_is_a_policy_error() {
    let policy =
        format!("[secrets.openai]\nsource = \"env:TEST_LATCHKEY_UNSET_VAR\"\n{RULE_USING_OPENAI}");
    let out = serve_refuses(&policy, &[], &["TEST_LATCHKEY_UNSET_VAR"]);
    assert_problem_at(
        &out,
        &[2],
        &[
            "secrets.openai.source",
            "env var TEST_LATCHKEY_UNSET_VAR is not set",
        ],
    );
}

#[test]
fn an_env_secret_set_to_an_empty_value_is_a_policy_error() {
    let policy = format!("[secrets.openai]\nsource = \"env:TEST_EMPTY_KEY\"\n{RULE_USING_OPENAI}");
    let out = serve_refuses(&policy, &[("TEST_EMPTY_KEY", "")], &[]);
    assert_problem_at(&out, &[2], &["secrets.openai.source"]);
}

#[test]
fn a_secret_shorter_than_eight_bytes_is_a_policy_error_that_does_not_print_it() {
    let short = "tiny7ch";
    let policy = format!("[secrets.openai]\nsource = \"env:TEST_SHORT_KEY\"\n{RULE_USING_OPENAI}");
    let out = serve_refuses(&policy, &[("TEST_SHORT_KEY", short)], &[]);
    assert_problem_at(&out, &[2], &["secrets.openai.source"]);
    assert!(
        !out.stderr.contains(short) && !out.stdout.contains(short),
        "the error printed the secret value: {out:#?}"
    );
}

#[test]
fn a_file_secret_that_cannot_be_read_is_a_policy_error() {
    let policy = format!(
        "[secrets.openai]\nsource = \"file:/nonexistent/latchkey-test/openai.key\"\n{RULE_USING_OPENAI}"
    );
    let out = serve_refuses(&policy, &[], &[]);
    assert_problem_at(&out, &[2], &["secrets.openai.source"]);
}

#[test]
fn an_unknown_secret_in_a_template_or_a_secrets_list_is_a_policy_error() {
    let policy = r#"[secrets.openai]
source = "env:TEST_OPENAI_KEY"

[[rules]]
name  = "openai"
hosts = ["api.test"]
[rules.inject.headers]
authorization = "Bearer {{secret.nosuch}}"
"#;
    let out = serve_refuses(
        policy,
        &[("TEST_OPENAI_KEY", "sk-test-OPENAI-4f9a1c7e2b8d")],
        &[],
    );
    assert_problem_at(&out, &[8], &["unknown secret \"nosuch\""]);

    let policy = r#"[secrets.openai]
source = "env:TEST_OPENAI_KEY"

[[rules]]
name    = "openai"
hosts   = ["api.test"]
secrets = ["openai", "missing"]
"#;
    let out = serve_refuses(
        policy,
        &[("TEST_OPENAI_KEY", "sk-test-OPENAI-4f9a1c7e2b8d")],
        &[],
    );
    assert_problem_at(&out, &[7], &["unknown secret \"missing\""]);
}

#[test]
fn an_unknown_key_in_a_secret_is_a_policy_error() {
    let policy = format!(
        "[secrets.openai]\nsource = \"env:TEST_OPENAI_KEY\"\ncolour = \"blue\"\n{RULE_USING_OPENAI}"
    );
    let out = serve_refuses(
        &policy,
        &[("TEST_OPENAI_KEY", "sk-test-OPENAI-4f9a1c7e2b8d")],
        &[],
    );
    assert_problem_at(&out, &[3], &["colour"]);
}

#[test]
fn binding_a_secret_to_a_wildcard_host_needs_the_dangerous_flag() {
    let env = [("TEST_OPENAI_KEY", "sk-test-OPENAI-4f9a1c7e2b8d")];
    // Lines 4-9: the rule, wherever the problem is pinned (its header, hosts, or template).
    let injecting = r#"[secrets.openai]
source = "env:TEST_OPENAI_KEY"

[[rules]]
name  = "wild"
hosts = ["*.wild.test"]
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"
"#;
    let out = serve_refuses(injecting, &env, &[]);
    assert_problem_at(
        &out,
        &[4, 5, 6, 7, 8],
        &["dangerously_inject_into_wildcard"],
    );

    let binding = r#"[secrets.openai]
source = "env:TEST_OPENAI_KEY"

[[rules]]
name    = "wild"
hosts   = ["*.wild.test"]
secrets = ["openai"]
"#;
    let out = serve_refuses(binding, &env, &[]);
    assert_problem_at(&out, &[4, 5, 6, 7], &["dangerously_inject_into_wildcard"]);

    // Said explicitly, it is allowed.
    let allowed = r#"[secrets.openai]
source = "env:TEST_OPENAI_KEY"

[[rules]]
name  = "wild"
hosts = ["*.wild.test"]
dangerously_inject_into_wildcard = true
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"
"#;
    let mut builder = latchkey().policy("main.toml", allowed);
    for (name, value) in env {
        builder = builder.env(name, value);
    }
    let _lk = builder.run();
}

#[test]
fn a_tunnel_rule_cannot_bind_a_secret() {
    let policy = r#"[secrets.openai]
source = "env:TEST_OPENAI_KEY"

[[rules]]
name    = "raw"
hosts   = ["tunnel.test"]
tunnel  = true
secrets = ["openai"]
"#;
    let out = serve_refuses(
        policy,
        &[("TEST_OPENAI_KEY", "sk-test-OPENAI-4f9a1c7e2b8d")],
        &[],
    );
    assert_problem_at(&out, &[4, 5, 6, 7, 8], &["tunnel"]);
}

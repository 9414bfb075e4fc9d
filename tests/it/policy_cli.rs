//! Policy validation (`serve` refusing to start, `check`) and `explain`.

use serde_json::Value;

use crate::support::{assert_problem, latchkey, policy_dir, problems_in, run_cli, CliOutput};

fn serve_refuses(files: &[(&str, &str)]) -> CliOutput {
    let mut builder = latchkey();
    for (name, contents) in files {
        builder = builder.policy(name, contents);
    }
    let out = builder.run_expecting_failure();
    assert_eq!(
        out.code(),
        Some(1),
        "serve on an invalid policy must exit 1: {out:#?}"
    );
    out
}

#[test]
fn serve_refuses_to_start_on_an_unknown_key() {
    let out = serve_refuses(&[(
        "main.toml",
        "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\ncolour = \"blue\"\n",
    )]);
    assert_problem(&out.stderr, "main.toml", 4, "colour");
}

#[test]
fn serve_refuses_to_start_on_duplicate_rule_names_across_two_files() {
    let out = serve_refuses(&[
        (
            "a.toml",
            "[[rules]]\nname = \"dup\"\nhosts = [\"api.test\"]\n",
        ),
        (
            "b.toml",
            "[[rules]]\nname = \"dup\"\nhosts = [\"other.test\"]\n",
        ),
    ]);
    let located = problems_in(&out.stderr, "a.toml")
        .into_iter()
        .chain(problems_in(&out.stderr, "b.toml"))
        .any(|(line, _, message)| line == 2 && message.contains("dup"));
    assert!(
        located,
        "expected a.toml:2 or b.toml:2 naming \"dup\" in:\n{}",
        out.stderr
    );
}

#[test]
fn serve_refuses_to_start_on_empty_hosts() {
    let out = serve_refuses(&[("main.toml", "[[rules]]\nname = \"api\"\nhosts = []\n")]);
    assert_problem(&out.stderr, "main.toml", 3, "hosts");
}

#[test]
fn serve_refuses_to_start_on_a_bad_path_glob() {
    let out = serve_refuses(&[(
        "main.toml",
        "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\npaths = [\"/v1/[a\"]\n",
    )]);
    assert_problem(&out.stderr, "main.toml", 4, "/v1/[a");
}

#[test]
fn serve_refuses_to_start_on_a_port_out_of_range() {
    let out = serve_refuses(&[(
        "main.toml",
        "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [70000]\n",
    )]);
    assert_problem(&out.stderr, "main.toml", 4, "70000");
}

#[test]
fn check_reports_every_problem_in_one_run() {
    let dir = policy_dir(&[
        (
            "a.toml",
            "[[rules]]\nname = \"empty\"\nhosts = []\n\n[[rules]]\nname = \"zero\"\nhosts = [\"api.test\"]\nports = [0]\n",
        ),
        (
            "b.toml",
            "[[rules]]\nname = \"glob\"\nhosts = [\"api.test\"]\npaths = [\"/v1/[a\"]\n",
        ),
    ]);
    let out = run_cli([
        "check".as_ref(),
        "--policies".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let output = format!("{}{}", out.stdout, out.stderr);
    assert_problem(&output, "a.toml", 3, "hosts");
    assert_problem(&output, "a.toml", 8, "port");
    assert_problem(&output, "b.toml", 4, "/v1/[a");
}

#[test]
fn check_refuses_a_tunnel_rule_that_sets_methods() {
    let dir = policy_dir(&[(
        "main.toml",
        "[[rules]]\nname = \"t\"\nhosts = [\"tunnel.test\"]\ntunnel = true\nmethods = [\"GET\"]\n",
    )]);
    let out = run_cli([
        "check".as_ref(),
        "--policies".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let output = format!("{}{}", out.stdout, out.stderr);
    assert!(
        !problems_in(&output, "main.toml").is_empty(),
        "expected a main.toml:LINE:COL: problem in:\n{output}"
    );
}

#[test]
fn check_accepts_a_valid_policy() {
    let dir = policy_dir(&[
        (
            "a.toml",
            r#"
[[rules]]
name    = "api"
hosts   = ["api.test", "*.wild.test"]
ports   = [443, 8443]
methods = ["GET", "POST"]
paths   = ["/v1/**", "/health"]
[rules.inject.headers]
x-test-injected = "literal value"
"#,
        ),
        (
            "b.toml",
            "[[rules]]\nname = \"tunnel\"\nhosts = [\"tunnel.test\"]\ntunnel = true\n",
        ),
    ]);
    let out = run_cli([
        "check".as_ref(),
        "--policies".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
}

const EXPLAIN_POLICY: &str = r#"
[[rules]]
name    = "api"
hosts   = ["api.test"]
methods = ["GET"]
paths   = ["/v1/**"]
"#;

fn explain(args: &[&str]) -> CliOutput {
    let dir = policy_dir(&[("main.toml", EXPLAIN_POLICY)]);
    let mut full: Vec<&std::ffi::OsStr> = vec![
        "explain".as_ref(),
        "--policies".as_ref(),
        dir.path().as_os_str(),
    ];
    full.extend(args.iter().map(|a| std::ffi::OsStr::new(*a)));
    run_cli(full)
}

fn explain_json(method: &str, url: &str) -> (Option<i32>, Value) {
    let out = explain(&["--json", method, url]);
    let v: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("explain --json printed no JSON ({e}): {out:#?}"));
    (out.code(), v)
}

#[test]
fn explain_json_allows_a_get_that_a_rule_covers() {
    let (code, v) = explain_json("GET", "https://api.test/v1/x");
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["decision"], "allow", "{v:#}");
    assert_eq!(v["rule"], "api", "{v:#}");
    assert!(v["reason"].as_str().is_some_and(|r| !r.is_empty()), "{v:#}");
}

#[test]
fn explain_denies_what_no_rule_covers_with_exit_status_1() {
    let out = explain(&["POST", "http://nothing.test/"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");

    for (method, url) in [
        ("POST", "http://nothing.test/"),
        ("POST", "https://api.test/v1/x"),
        ("GET", "https://api.test/v2/x"),
        ("GET", "https://api.test:8443/v1/x"),
    ] {
        let (code, v) = explain_json(method, url);
        assert_eq!(code, Some(1), "{method} {url}: {v:#}");
        assert_eq!(v["decision"], "deny", "{method} {url}: {v:#}");
        assert!(
            v["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{method} {url}: {v:#}"
        );
    }
}

/// Every problem in `tests/fixtures/every-error/` (one of each kind `check` can report), in the
/// order reported: file, then line, then column. `{dir}` stands for the policy directory.
const EVERY_ERROR: &[(&str, u32, u32, &str)] = &[
    ("a.toml", 3, 1, "unknown top-level key `rule`; did you mean `rules`?"),
    ("a.toml", 7, 10, "secrets.good.source: env var LATCHKEY_FIXTURE_GOOD is not set"),
    ("a.toml", 9, 1, "secrets.typo: missing key `source`"),
    ("a.toml", 10, 1, "secrets.typo: unknown key `sorce`; did you mean `source`?"),
    ("a.toml", 13, 10, "secrets.bad name!: secret names use letters, digits, '-' and single '_' (at most 64)"),
    ("a.toml", 17, 10, "secrets.ttl_on_env: ttl and timeout apply to exec: sources only"),
    ("a.toml", 22, 7, "secrets.bad_ttl.ttl: \"soon\" is not a duration like \"30s\" or \"5m\""),
    ("a.toml", 25, 10, "secrets.bad_source.source: vault: the path is MOUNT/PATH (a mount alone names no secret)"),
    ("a.toml", 28, 10, "secrets.typed.source: expected a string, found an integer"),
    ("a.toml", 36, 17, "credentials.aws.access_key_id: the value is not env:VAR, file:PATH, exec:COMMAND, vault:PATH#FIELD, aws-sm:NAME or aws-ssm:NAME (key material is never written inline)"),
    ("a.toml", 38, 1, "credentials.aws: unknown key `regin`; did you mean `region`?"),
    ("a.toml", 39, 19, "credentials.aws.max_signed_body: must be 0 to 8388608 bytes (latchkey buffers at most that much)"),
    ("a.toml", 40, 10, "credentials.aws.app_id: does not apply to kind \"aws_sigv4\""),
    ("a.toml", 42, 1, "credentials.aws.assume_role: missing key `role_arn`"),
    ("a.toml", 43, 1, "credentials.aws.assume_role: unknown key `rolearn`; did you mean `role_arn`?"),
    ("a.toml", 50, 19, "credentials.role.max_signed_body: expected an integer, found a string"),
    ("a.toml", 52, 1, "credentials.role.assume_role: role_arn \"role/x\" is not an ARN"),
    ("a.toml", 52, 1, "credentials.role.assume_role: duration must be 15m to 12h"),
    ("a.toml", 52, 1, "credentials.role.assume_role: sts_endpoint \"http://sts.test\" is not an https:// URL"),
    ("a.toml", 58, 8, "credentials.gh.installation_id: kind \"github_app\" needs installation_id"),
    ("a.toml", 61, 7, "credentials.gh.api: \"ftp://github.test\" is not an https:// URL"),
    ("a.toml", 63, 1, "credentials.nokind: missing key `kind`"),
    ("a.toml", 67, 8, "credentials.weird.kind: unknown kind \"kerberos\": use aws_sigv4, github_app, google_service_account, google_id_token, oauth2, oauth2_client_credentials, jwt, hmac or client_cert"),
    ("a.toml", 71, 7, "credentials.token.alg: \"none\" is not RS256, ES256, HS256 or EdDSA"),
    ("a.toml", 73, 7, "credentials.token.ttl: \"never\" is not a duration like \"5m\""),
    ("a.toml", 74, 10, "credentials.token.header: invalid header name \"bad header\""),
    ("a.toml", 75, 18, "credentials.token.claims: claim \"sub\": unknown template {{user}} in claim \"{{user}}\": use {{now}}, {{identity}} or {{host}}"),
    ("a.toml", 75, 36, "credentials.token.claims.exp: NaN is not a finite number"),
    ("a.toml", 81, 1, "rules[0]: unknown key `methds`; did you mean `methods`?"),
    ("a.toml", 82, 9, "rules[0].ports: expected a list of integers, found a string"),
    ("a.toml", 83, 12, "rules[0].methods[0]: invalid method \"get\": methods are upper-case tokens; did you mean \"GET\"?"),
    ("a.toml", 83, 19, "rules[0].methods[1]: invalid method \"*\": methods are upper-case tokens; remove the key to allow every method"),
    ("a.toml", 84, 10, "rules[0].paths[0]: path glob \"v1\" must start with '/'"),
    ("a.toml", 84, 16, "rules[0].paths[1]: path glob \"/v1?x\" contains '?': globs match the path only, never the query"),
    ("a.toml", 84, 25, "rules[0].paths[2]: invalid path glob \"/v1/[a\": unclosed character class; missing ']'"),
    ("a.toml", 85, 10, "rules[0].tunnel: expected true or false, found a string"),
    ("a.toml", 86, 15, "rules[0].description: expected a string, found an integer"),
    ("a.toml", 89, 8, "rules[1].name: duplicate rule name \"api\", first defined at {dir}/a.toml:78"),
    ("a.toml", 90, 10, "rules[1].hosts[0]: \"https://api.test/v1\" is a URL: hosts take a bare host name; did you mean \"api.test\" (with ports/paths in their own keys)?"),
    ("a.toml", 90, 33, "rules[1].hosts[1]: \"api.test/v1\" contains '/': put paths in the rule's `paths` key"),
    ("a.toml", 90, 48, "rules[1].hosts[2]: \"*\" would match every host; did you mean \"*.example.com\"?"),
    ("a.toml", 90, 53, "rules[1].hosts[3]: \"*.com\" would match a whole top-level domain; name the domain (\"*.example.com\")"),
    ("a.toml", 90, 62, "rules[1].hosts[4]: \"a.*.test\": '*' is only allowed as the whole first label (\"*.example.com\")"),
    ("a.toml", 90, 74, "rules[1].hosts[5]: \"api.test:8443\" contains a port: write hosts = [\"api.test\"] and ports = [8443]"),
    ("a.toml", 90, 91, "rules[1].hosts[6]: \"*.10.0.0.1\": a wildcard cannot precede an IP address"),
    ("a.toml", 90, 105, "rules[1].hosts[7]: host \"bad host\" contains whitespace or a control character"),
    ("a.toml", 90, 117, "rules[1].hosts[8]: expected a string, found an integer"),
    ("a.toml", 92, 1, "rules[2]: missing key `hosts`"),
    ("a.toml", 93, 8, "rules[2].name: rule name \"no hosts!\" must be non-empty and use only letters, digits, '-', '_', '.', ':'"),
    ("a.toml", 97, 9, "rules[3].hosts: a rule needs at least one host"),
    ("a.toml", 98, 9, "rules[3].ports: an empty list allows nothing; remove the key for the default port"),
    ("a.toml", 99, 11, "rules[3].methods: an empty list allows nothing; remove the key to allow every method"),
    ("a.toml", 100, 9, "rules[3].paths: an empty list allows nothing; remove the key to allow every path"),
    ("a.toml", 105, 10, "rules[4].ports[0]: invalid port 0: must be 1 to 65535"),
    ("a.toml", 105, 13, "rules[4].ports[1]: invalid port 70000: must be 1 to 65535"),
    ("a.toml", 105, 20, "rules[4].ports[2]: expected an integer, found a string"),
    ("a.toml", 109, 9, "rules[5].hosts: rule binds secret(s) \"good\", \"undeclared\" to a wildcard host, so every matching host would receive them; name the hosts, or set dangerously_inject_into_wildcard = true"),
    ("a.toml", 110, 20, "rules[5].secrets[1]: unknown secret \"missing\": declare [secrets.missing] with a source"),
    ("a.toml", 111, 17, "rules[5].placeholders[0]: unknown place \"cookie\": use header, basic_auth, query, body or websocket"),
    ("a.toml", 112, 17, "rules[5].keep_headers[0]: invalid header name \"bad header\""),
    ("a.toml", 113, 14, "rules[5].credential: unknown credential \"nope\": declare [credentials.nope]"),
    ("a.toml", 114, 8, "rules[5].mode: unknown mode \"audit\": use \"enforce\" or \"report\""),
    ("a.toml", 115, 18, "rules[5].allow_private[0]: 10.0.0.0/33: prefix length 33 is out of range for IPv4 (0-32)"),
    ("a.toml", 118, 1, "rules[5].inject: unknown key `header`; did you mean `headers`?"),
    ("a.toml", 121, 1, "rules[5].inject.headers.connection: header connection is managed by latchkey and cannot be injected"),
    ("a.toml", 122, 1, "rules[5].inject.headers.host: header host is managed by latchkey and cannot be injected"),
    ("a.toml", 123, 1, "rules[5].inject.headers.bad header: invalid header name \"bad header\""),
    ("a.toml", 124, 13, "rules[5].inject.headers.x-control: header value is not valid (control characters or non-ASCII)"),
    ("a.toml", 125, 16, "rules[5].inject.headers.x-undeclared: unknown secret \"undeclared\": declare [secrets.undeclared] with a source"),
    ("a.toml", 126, 14, "rules[5].inject.headers.x-template: invalid secret name \"\" in template"),
    ("a.toml", 127, 11, "rules[5].inject.headers.x-typed: expected a string, found an integer"),
    ("a.toml", 130, 1, "rules[5].inject.query.: empty query parameter name"),
    ("a.toml", 132, 1, "rules[5].inject.basic_auth: missing key `password`"),
    ("a.toml", 133, 8, "rules[5].inject.basic_auth.user: a basic-auth user cannot contain ':'"),
    ("a.toml", 134, 1, "rules[5].inject.basic_auth: unknown key `pasword`; did you mean `password`?"),
    ("a.toml", 138, 9, "rules[6].credential: a tunnel rule cannot use a credential: latchkey cannot see inside the tunnel"),
    ("a.toml", 139, 10, "rules[6].tunnel: a tunnel rule relays encrypted bytes that latchkey cannot see, so it cannot restrict methods or paths or inject headers; remove those keys or set tunnel = false"),
    ("a.toml", 145, 9, "rules[7].secrets: a tunnel rule cannot bind secrets: latchkey cannot see inside the tunnel"),
    ("a.toml", 155, 9, "identities.ci.token: env var LATCHKEY_FIXTURE_CI is not set"),
    ("a.toml", 156, 17, "identities.ci.rules[1]: unknown rule \"nope\""),
    ("a.toml", 157, 1, "identities.ci: unknown key `sauces`; did you mean `sources`?"),
    ("a.toml", 159, 13, "identities.default: identity \"default\" is defined twice or reserved"),
    ("a.toml", 163, 13, "identities.bad name!: identity names use letters, digits, '-' and single '_'"),
    ("a.toml", 167, 13, "identities.lonely: an identity needs a token, sources, or both"),
    ("a.toml", 168, 9, "identities.lonely.rules: list the rules this identity may use, or [\"*\"]"),
    ("a.toml", 170, 1, "identities.norules: missing key `rules`"),
    ("a.toml", 171, 26, "identities.norules.sources[1]: 10.0.0.0/99: prefix length 99 is out of range for IPv4 (0-32)"),
    ("a.toml", 174, 9, "identities.badtoken.token: the value is not env:VAR, file:PATH, exec:COMMAND, vault:PATH#FIELD, aws-sm:NAME or aws-ssm:NAME"),
    ("b.toml", 2, 10, "secrets.shared: duplicate secret \"shared\", first declared at {dir}/a.toml:30"),
    ("b.toml", 6, 8, "rules[0].name: duplicate rule name \"shared\", first defined at {dir}/a.toml:149"),
    ("b.toml", 7, 10, "rules[0].hosts[0]: \"*\" would match every host; did you mean \"*.example.com\"?"),
    ("b.toml", 10, 8, "rules[1].name: duplicate rule name \"api\", first defined at {dir}/a.toml:78"),
    ("b.toml", 13, 14, "credentials.aws: credential names must be unique and use letters, digits, '-' and single '_'"),
    ("b.toml", 18, 13, "identities.ci: identity \"ci\" is defined twice or reserved"),
    ("c.toml", 6, 1, "invalid TOML: invalid array expected `]`"),
    ("d.toml", 2, 9, "rules: expected a list of tables, found a string; write each rule as [[rules]]"),
    ("d.toml", 3, 14, "identities: expected a table, found a list"),
    ("e.toml", 4, 11, "ask.unknown: expected true or false, found a string"),
    ("e.toml", 5, 8, "ask.rate: \"10/week\" is not a rate like \"10/min\" (N/s, N/min, N/h or N/day, N at least 1)"),
    ("e.toml", 6, 10, "ask.expire: \"10s\" is shorter than 1m"),
    ("e.toml", 7, 8, "ask.hold: \"11m\" is longer than 10m"),
    ("e.toml", 8, 11, "ask.notify[0]: unknown notifier \"nobody\": declare [notify.nobody] with a url (declared: nourl, ops, query, scheme, userinfo)"),
    ("e.toml", 9, 9, "ask.scope: an empty list offers the approver nothing; list at least one of \"once\", \"session\" or a duration such as \"1h\""),
    ("e.toml", 10, 1, "ask: unknown key `quorum`; known keys: unknown, hold, scope, message, notify, rate, expire"),
    ("e.toml", 13, 7, "notify.userinfo.url: it carries a user or password ('@'): credentials do not belong in a URL; use secret = \"env:…\" to sign deliveries"),
    ("e.toml", 16, 7, "notify.query.url: it has a query ('?'): a token there would be logged and shown to approvers; use secret = \"env:…\" to sign deliveries"),
    ("e.toml", 17, 10, "notify.query.format: unknown format \"xml\": use \"json\" or \"slack\""),
    ("e.toml", 20, 7, "notify.scheme.url: scheme \"ftp\": a webhook URL is http:// or https://"),
    ("e.toml", 22, 1, "notify.nourl: missing key `url`"),
    ("e.toml", 23, 10, "notify.nourl.secret: env var LATCHKEY_FIXTURE_HOOK is not set"),
    ("e.toml", 27, 10, "notify.ops.secret: the value is not env:VAR, file:PATH, exec:COMMAND, vault:PATH#FIELD, aws-sm:NAME or aws-ssm:NAME"),
    ("e.toml", 32, 16, "rules[0].ask.hold: \"soon\" is not a duration like \"30s\" or \"5m\""),
    ("e.toml", 32, 41, "rules[0].ask.scope[1]: scope \"once\" is listed twice"),
    ("e.toml", 32, 49, "rules[0].ask.scope[2]: scope \"forever\" is not \"once\", \"session\" or a duration such as \"1h\""),
    ("e.toml", 32, 60, "rules[0].ask.scope[3]: \"400d\" is longer than 30days: access wanted for longer is a rule (latchkey approvals export), not a grant"),
    ("e.toml", 32, 79, "rules[0].ask.message: empty; remove the key for no message"),
    ("e.toml", 32, 93, "rules[0].ask.notify[0]: unknown notifier \"nobody\": declare [notify.nobody] with a url (declared: nourl, ops, query, scheme, userinfo)"),
    ("e.toml", 32, 110, "rules[0].ask.notify[2]: notifier \"ops\" is listed twice"),
    ("e.toml", 39, 1, "rules[1].ask: unknown key `rate`; known keys: hold, scope, message, notify"),
    ("e.toml", 40, 10, "rules[1].ask.notify: an empty list; remove the key to tell every [notify.*] webhook"),
    ("e.toml", 46, 7, "rules[2].ask: a tunnel rule cannot ask a person: latchkey cannot see inside the tunnel; remove ask or set tunnel = false"),
    ("e.toml", 52, 7, "rules[3].ask: a rule in mode = \"report\" lets requests through and cannot also hold them for a person; remove ask or mode"),
    ("e.toml", 52, 19, "rules[3].ask.message: contains a control character (a newline?): one line"),
    ("e.toml", 57, 12, "identities.labelled.labels.Owner: label keys use lower-case letters, digits, '_', '.' and '-' (at most 64)"),
    ("e.toml", 57, 31, "identities.labelled.labels.n: expected a string, found an integer"),
    ("e.toml", 57, 39, "identities.labelled.labels.nl: value contains a control character"),
    ("f.toml", 2, 1, "ask: a second [ask] table; the first is at {dir}/e.toml:3: a policy takes one [ask], so merge them"),
];

fn every_error_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/every-error")
}

/// The fixture's files, to hand to `latchkey serve`.
fn every_error_files() -> Vec<(&'static str, String)> {
    ["a.toml", "b.toml", "c.toml", "d.toml", "e.toml", "f.toml"]
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(every_error_dir().join(name))
                .unwrap_or_else(|e| panic!("read fixture {name}: {e}"));
            (name, text)
        })
        .collect()
}

/// `DIR/FILE:LINE:COL: MESSAGE` lines of `output`, as (dir, file, line, col, message).
fn located_lines(output: &str) -> Vec<(String, String, u32, u32, String)> {
    output
        .lines()
        .filter_map(|line| {
            let (path, rest) = line.split_once(".toml:")?;
            let (dir, file) = path.rsplit_once('/')?;
            let (line_no, rest) = rest.split_once(':')?;
            let (col, message) = rest.split_once(": ")?;
            Some((
                dir.to_string(),
                format!("{file}.toml"),
                line_no.parse().ok()?,
                col.parse().ok()?,
                message.to_string(),
            ))
        })
        .collect()
}

/// Asserts that `found` is exactly [`EVERY_ERROR`] for policy directory `dir`: every message,
/// each at its file, line and column, in order, and nothing else.
fn assert_every_error(dir: &str, found: &[(String, u32, u32, String)], output: &str) {
    let expected: Vec<(String, u32, u32, String)> = EVERY_ERROR
        .iter()
        .map(|(f, l, c, m)| (f.to_string(), *l, *c, m.replace("{dir}", dir)))
        .collect();
    for (i, want) in expected.iter().enumerate() {
        assert!(
            found.get(i) == Some(want),
            "problem #{i}: expected {want:?}, found {:?}\nall found:\n{found:#?}\noutput:\n{output}",
            found.get(i)
        );
    }
    assert_eq!(
        found.len(),
        expected.len(),
        "more problems than expected: {:#?}",
        &found[expected.len().min(found.len())..]
    );
}

#[test]
fn check_reports_one_of_every_problem_each_at_its_file_line_and_column() {
    let dir = every_error_dir();
    let out = run_cli(["check".as_ref(), "--policies".as_ref(), dir.as_os_str()]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let dir = dir.display().to_string();
    let found: Vec<_> = located_lines(&out.stderr)
        .into_iter()
        .map(|(d, f, l, c, m)| {
            assert_eq!(d, dir, "a problem outside the fixture: {f}:{l}:{c}: {m}");
            (f, l, c, m)
        })
        .collect();
    assert_every_error(&dir, &found, &out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "latchkey: error: {} problem(s) in policy {dir}",
            EVERY_ERROR.len()
        )),
        "{}",
        out.stderr
    );
}

#[test]
fn check_json_reports_one_of_every_problem_each_at_its_file_line_and_column() {
    let dir = every_error_dir();
    let out = run_cli([
        "check".as_ref(),
        "--policies".as_ref(),
        dir.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let v: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("check --format json printed no JSON ({e}): {out:#?}"));
    assert_eq!(v["ok"], false, "{v:#}");
    let dir = dir.display().to_string();
    let found: Vec<_> = v["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("no errors array: {v:#}"))
        .iter()
        .map(|e| {
            let file = e["file"].as_str().unwrap_or_default();
            let name = file
                .strip_prefix(&format!("{dir}/"))
                .unwrap_or_else(|| panic!("a problem outside the fixture: {e}"));
            let number = |k: &str| {
                e[k].as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or_else(|| panic!("{k} is not a number: {e}"))
            };
            let message = e["message"].as_str().unwrap_or_default().to_string();
            (name.to_string(), number("line"), number("col"), message)
        })
        .collect();
    assert_every_error(&dir, &found, &out.stdout);
}

#[test]
fn serve_refuses_to_start_and_prints_one_of_every_problem() {
    let files = every_error_files();
    let refs: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let out = serve_refuses(&refs);
    let lines = located_lines(&out.stderr);
    let dir = lines
        .first()
        .map(|(d, ..)| d.clone())
        .unwrap_or_else(|| panic!("no located problem in:\n{}", out.stderr));
    let found: Vec<_> = lines
        .into_iter()
        .map(|(d, f, l, c, m)| {
            assert_eq!(d, dir, "problems from two directories: {f}:{l}:{c}: {m}");
            (f, l, c, m)
        })
        .collect();
    assert_every_error(&dir, &found, &out.stderr);
}

/// Every place a policy names a secret, credential, rule or limit, each misspelt by one letter.
const MISSPELT: &str = r#"
[secrets.openai]
source = "env:LATCHKEY_FIXTURE_OPENAI"

[credentials.github-app]
kind = "jwt"
alg = "HS256"
key = "env:LATCHKEY_FIXTURE_OPENAI"

[limits.per-agent]
requests = "10/min"

[[rules]]
name = "openai"
hosts = ["api.openai.test"]
secrets = ["opnai"]
limits = ["per-agnt"]
[rules.inject.headers]
authorization = "Bearer {{secret.openia}}"

[[rules]]
name = "gh"
hosts = ["api.github.test"]
credential = "github-ap"

[identities.ci]
token = "env:LATCHKEY_FIXTURE_OPENAI"
rules = ["opena"]
"#;

#[test]
fn a_misspelt_name_gets_a_did_you_mean_wherever_the_policy_refers_to_it() {
    let dir = policy_dir(&[("main.toml", MISSPELT)]);
    let out = run_cli([
        "check".as_ref(),
        "--no-secrets".as_ref(),
        "--policies".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    for (line, text) in [
        (16, "rules[0].secrets[0]: unknown secret \"opnai\": declare [secrets.opnai] with a source; did you mean \"openai\"?"),
        (17, "rules[0].limits[0]: unknown limit \"per-agnt\"; declared: per-agent; did you mean \"per-agent\"?"),
        (19, "unknown secret \"openia\": declare [secrets.openia] with a source; did you mean \"openai\"?"),
        (24, "rules[1].credential: unknown credential \"github-ap\": declare [credentials.github-ap]; did you mean \"github-app\"?"),
        (28, "identities.ci.rules[0]: unknown rule \"opena\"; did you mean \"openai\"?"),
    ] {
        assert!(
            out.stderr
                .lines()
                .any(|l| l.contains(&format!("main.toml:{line}:")) && l.contains(text)),
            "line {line}: {text:?} not in:\n{}",
            out.stderr
        );
    }
    // A name nothing is close to gets no guess.
    let far = MISSPELT.replace("rules = [\"opena\"]", "rules = [\"zzzzzz\"]");
    let dir = policy_dir(&[("main.toml", &far)]);
    let out = run_cli([
        "check".as_ref(),
        "--no-secrets".as_ref(),
        "--policies".as_ref(),
        dir.path().as_os_str(),
    ]);
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("unknown rule \"zzzzzz\""))
        .unwrap_or_else(|| panic!("{out:#?}"));
    assert!(!line.contains("did you mean"), "{line}");
}

#[test]
fn explain_with_only_a_url_asks_about_a_get_and_a_misspelt_identity_gets_a_guess() {
    let out = explain(&["--format", "json", "https://api.test/v1/x"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let v: Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    assert_eq!(
        (&v["method"], &v["decision"]),
        (&"GET".into(), &"allow".into()),
        "{v:#}"
    );

    let out = explain(&["api.test/v1/x"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("[METHOD] URL") && out.stderr.contains("METHOD defaults to GET"),
        "{out:#?}"
    );

    let dir = policy_dir(&[(
        "main.toml",
        "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\n[identities.ci-agent]\ntoken = \"env:T\"\nrules = [\"api\"]\n",
    )]);
    let out = run_cli([
        "explain".as_ref(),
        "--policies".as_ref(),
        dir.path().as_os_str(),
        "--identity".as_ref(),
        "ci-agnet".as_ref(),
        "https://api.test/".as_ref(),
    ]);
    assert_ne!(out.code(), Some(0), "{out:#?}");
    assert!(
        out.stderr
            .contains("unknown identity \"ci-agnet\"; did you mean \"ci-agent\"?"),
        "{out:#?}"
    );
}

const GUARDED_POLICY: &str = r#"
[[deny]]
name        = "no-admin-action"
description = "Agents never run admin actions."
hosts       = ["api.test"]
methods     = ["POST"]
paths       = ["/v1/actions"]
body        = { "/action" = "admin*" }

[[rules]]
name    = "versioned"
hosts   = ["api.test"]
headers = { "x-api-version" = "2024-*" }
"#;

#[test]
fn explain_takes_headers_and_a_body_and_says_which_denial_or_predicate_decided() {
    let dir = policy_dir(&[("main.toml", GUARDED_POLICY)]);
    let body_file = dir.path().join("body.json");
    std::fs::write(&body_file, r#"{"action": "admin.wipe"}"#).expect("write body");
    let run = |extra: &[&str]| {
        let mut full: Vec<std::ffi::OsString> = vec![
            "explain".into(),
            "--policies".into(),
            dir.path().as_os_str().into(),
        ];
        full.extend(extra.iter().map(std::ffi::OsString::from));
        run_cli(full)
    };
    let url = "https://api.test/v1/actions";
    let out = run(&["POST", url]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stdout.contains("reason:   predicate_mismatch"),
        "{out:#?}"
    );
    assert!(
        out.stdout
            .contains("decided:  by a predicate of rule 'versioned'"),
        "{out:#?}"
    );
    let version = "--header=X-Api-Version: 2024-06-01";
    let out = run(&[
        version,
        "--content-type",
        "application/json",
        "--body",
        r#"{"action":"read"}"#,
        "POST",
        url,
    ]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let at_file = format!("--body=@{}", body_file.display());
    let out = run(&[
        version,
        "--content-type",
        "application/json",
        &at_file,
        "POST",
        url,
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(out.stdout.contains("reason:   denied_by_rule"), "{out:#?}");
    assert!(
        out.stdout.contains("decided:  by denial 'no-admin-action'"),
        "{out:#?}"
    );
    let out = run(&["--header", "no-colon", url]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(out.stderr.contains("give it as NAME:VALUE"), "{out:#?}");
}

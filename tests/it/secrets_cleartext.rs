//! A credential never travels in cleartext: a rule that brokers one (an injected header, a
//! placeholder's secret, a SigV4 signature, a captured token) applies only to requests latchkey
//! sends upstream over TLS. A plain `http://` request on any port it names (the TLS port too),
//! through the proxy hop, `--http-listen` or SOCKS5, is refused `403 credential_needs_tls` and
//! recorded, and the upstream sees no connection at all; the same rule over TLS (h1 and h2
//! inside the interception) brokers as before; `dangerously_allow_cleartext = true` is the one
//! way out, and `check`, `explain` and `diff` say so.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::clients::{assert_denial, curl, CurlOutput};
use crate::support::credentials::Bench;
use crate::support::{assert_record, latchkey, Latchkey, TestCa, Upstream, PINNED};
use crate::support::{policy_dir, run_cli};

const KEY: &str = "sk-cleartext-never-4b7e91c2d05a";
const AWS_ID: &str = "AKIACLEARTEXT7Q2W9E4R";
const AWS_SECRET: &str = "cleartext/aws+secret/7f3a9c1e55d0b2";

const CREDENTIALS: &str = r#"
[secrets.key]
source = "env:CLEARTEXT_TEST_KEY"

[credentials.aws]
kind = "aws_sigv4"
access_key_id = "env:CLEARTEXT_TEST_AWS_ID"
secret_access_key = "env:CLEARTEXT_TEST_AWS_SECRET"
region = "us-east-1"
service = "s3"
"#;

/// One rule per way of brokering; `TLS` and `PLAIN` are the upstreams' ports.
const RULES: &str = r#"
[[rules]]
name = "inject"
hosts = ["api.test"]
ports = [TLS, PLAIN, 443, 80]
methods = ["GET"]
[rules.inject.headers]
authorization = "Bearer {{secret.key}}"

[[rules]]
name = "placeholder"
hosts = ["other.test"]
ports = [TLS, PLAIN]
methods = ["GET"]
secrets = ["key"]

[[rules]]
name = "sigv4"
hosts = ["tunnel.test"]
ports = [TLS, PLAIN]
methods = ["GET", "PUT"]
credential = "aws"

[[rules]]
name = "idp"
hosts = ["wild.test"]
ports = [TLS, PLAIN]
methods = ["POST"]
capture = { fields = ["access_token"], as = "idp", hosts = ["a.wild.test"] }

[[rules]]
name = "app"
hosts = ["a.wild.test"]
ports = [TLS, PLAIN]
methods = ["GET"]
"#;

struct World {
    lk: Latchkey,
    tls: Upstream,
    plain: Upstream,
    _ca: TestCa,
    http_listen: SocketAddr,
    socks: SocketAddr,
}

fn world(rules: &str) -> World {
    let ca = TestCa::new();
    let tls = Upstream::https(&ca);
    let plain = Upstream::http();
    let policy = format!("{CREDENTIALS}{rules}")
        .replace("PLAIN", &plain.port().to_string())
        .replace("TLS", &tls.port().to_string());
    let mut builder = latchkey()
        .upstream_ca(&ca)
        .env("CLEARTEXT_TEST_KEY", KEY)
        .env("CLEARTEXT_TEST_AWS_ID", AWS_ID)
        .env("CLEARTEXT_TEST_AWS_SECRET", AWS_SECRET)
        .arg("--http-listen")
        .arg("127.0.0.1:0")
        .arg("--socks")
        .arg("127.0.0.1:0")
        .policy("main.toml", &policy);
    for host in PINNED {
        builder = builder.pin(host);
    }
    let lk = builder.run();
    let http_listen = listening(&lk, "latchkey: http-listen listening on ");
    let socks = listening(&lk, "latchkey: socks5 listening on ");
    World {
        lk,
        tls,
        plain,
        _ca: ca,
        http_listen,
        socks,
    }
}

/// The address of a listener, from its stderr line.
fn listening(lk: &Latchkey, line: &str) -> SocketAddr {
    assert!(
        lk.wait_stderr_contains(line, Duration::from_secs(5)),
        "no {line:?} on stderr:\n{}",
        lk.stderr_text()
    );
    lk.stderr_text()
        .lines()
        .find_map(|l| l.trim_end().strip_prefix(line))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address after {line:?}"))
}

impl World {
    fn curl(&self, args: &[&str]) -> CurlOutput {
        curl(&self.lk).args(args.iter().copied()).run()
    }

    /// Asserts no secret value is in latchkey's log or audit file, nor in `seen`.
    fn no_leak(&self, seen: &[&CurlOutput]) {
        let mut places = vec![
            ("stderr", self.lk.stderr_text()),
            ("audit", self.lk.audit_text()),
        ];
        for out in seen {
            places.push((
                "a response",
                String::from_utf8_lossy(&out.response.body).into(),
            ));
            places.push(("curl stderr", out.stderr.clone()));
        }
        for (what, text) in places {
            for secret in [KEY, AWS_ID, AWS_SECRET] {
                assert!(
                    !text.contains(secret),
                    "{what} holds a secret value:\n{text}"
                );
            }
        }
    }
}

/// Every record is a cleartext refusal under `rule`, named by its URL.
fn refused_in_cleartext(records: &[Value], expected: &[(&str, &str, u16)]) {
    assert_eq!(records.len(), expected.len(), "{records:#?}");
    for (record, (rule, host, port)) in records.iter().zip(expected) {
        assert_record(
            record,
            json!({"scheme": "http", "host": host, "port": port, "decision": "deny",
                   "rule": rule, "reason": "credential_needs_tls", "status": 403}),
        );
        assert!(
            record.get("upstream").is_none_or(Value::is_null),
            "nothing was dialed: {record:#}"
        );
        assert!(
            record
                .get("secrets")
                .is_none_or(|s| s.as_array().is_none_or(Vec::is_empty)),
            "no secret was used: {record:#}"
        );
    }
}

#[test]
fn an_injected_key_over_plain_http_is_refused_on_every_port_and_the_upstream_sees_nothing() {
    let w = world(RULES);
    let (tls, plain) = (w.tls.port(), w.plain.port());
    let urls = [
        (format!("http://api.test:{plain}/v1/models"), plain),
        // Cleartext to the TLS upstream's port and to 443: the port is not the scheme.
        (format!("http://api.test:{tls}/v1/models"), tls),
        ("http://api.test:443/v1/models".to_string(), 443),
        ("http://api.test/v1/models".to_string(), 80),
    ];
    let mut outs = Vec::new();
    for (url, _) in &urls {
        let out = w.curl(&["-H", "Authorization: Bearer sandbox-own", url]);
        assert_denial(&out.response, 403, Some("inject"), "credential_needs_tls");
        let body = out.response.text();
        assert!(
            body.contains("a credential never travels in cleartext") && body.contains("https://"),
            "{body}"
        );
        outs.push(out);
    }
    assert_eq!((w.plain.connections(), w.tls.connections()), (0, 0));
    let expected: Vec<(&str, &str, u16)> = urls
        .iter()
        .map(|(_, p)| ("inject", "api.test", *p))
        .collect();
    refused_in_cleartext(&w.lk.wait_audit(urls.len()), &expected);
    assert!(
        w.lk.decision_records().is_empty(),
        "nothing was committed to be sent"
    );
    w.no_leak(&outs.iter().collect::<Vec<_>>());
}

#[test]
fn the_same_rule_over_tls_injects_inside_the_interception_on_h1_and_h2() {
    let w = world(RULES);
    let url = format!("https://api.test:{}/v1/models", w.tls.port());
    let mut outs = Vec::new();
    for (flag, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let out = w.curl(&[flag, "-H", "Authorization: Bearer sandbox-own", &url]);
        assert_eq!(out.ok().status, 200, "{out:#?}");
        assert_eq!(out.http_version, version, "{out:#?}");
        outs.push(out);
    }
    let seen = w.tls.received();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    for r in &seen {
        let auth: Vec<&str> = r
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("authorization"))
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(auth, [format!("Bearer {KEY}")], "{r:#?}");
    }
    for record in w.lk.wait_audit(2) {
        assert_record(
            &record,
            json!({"scheme": "https", "rule": "inject", "reason": "allowed", "status": 200,
                   "secrets": ["key"]}),
        );
    }
    w.no_leak(&outs.iter().collect::<Vec<_>>());
}

#[test]
fn every_way_of_brokering_is_refused_in_cleartext_before_anything_is_sent() {
    let w = world(RULES);
    let plain = w.plain.port();
    let cases: Vec<(Vec<String>, &str, &str)> = vec![
        // A placeholder for a bound secret.
        (
            vec![
                "-H".into(),
                "Authorization: Bearer __LATCHKEY_key__".into(),
                format!("http://other.test:{plain}/v1/x"),
            ],
            "placeholder",
            "other.test",
        ),
        // A SigV4-signed upload.
        (
            vec![
                "-X".into(),
                "PUT".into(),
                "--data-binary".into(),
                "object bytes".into(),
                format!("http://tunnel.test:{plain}/bucket/key"),
            ],
            "sigv4",
            "tunnel.test",
        ),
        // The token endpoint of a capture.
        (
            vec![
                "--data".into(),
                "grant_type=client_credentials".into(),
                format!("http://wild.test:{plain}/token"),
            ],
            "idp",
            "wild.test",
        ),
    ];
    let mut outs = Vec::new();
    for (args, rule, _) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = w.curl(&args);
        assert_denial(&out.response, 403, Some(rule), "credential_needs_tls");
        outs.push(out);
    }
    // A captured token's placeholder, under a rule that brokers nothing: withheld from cleartext.
    let out = w.curl(&[
        "-H",
        "Authorization: Bearer __LATCHKEY_idp_access_token__",
        &format!("http://a.wild.test:{plain}/me"),
    ]);
    assert_eq!(out.response.status, 403, "{out:#?}");
    assert_eq!(
        out.response.header("x-latchkey-reason"),
        Some("credential_needs_tls")
    );
    outs.push(out);
    // Without a placeholder the same request goes on: that rule itself brokers nothing.
    let out = w.curl(&[&format!("http://a.wild.test:{plain}/me")]);
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let seen = w.plain.received();
    assert_eq!(
        seen.len(),
        1,
        "only the request that carried nothing: {seen:#?}"
    );
    assert_eq!(seen[0].path, "/me");

    let records = w.lk.wait_audit(cases.len() + 2);
    let expected: Vec<(&str, &str, u16)> = cases
        .iter()
        .map(|(_, rule, host)| (*rule, *host, plain))
        .collect();
    refused_in_cleartext(&records[..expected.len()], &expected);
    assert_record(
        &records[cases.len()],
        json!({"scheme": "http", "host": "a.wild.test", "rule": "app",
               "reason": "credential_needs_tls", "status": 403}),
    );
    w.no_leak(&outs.iter().collect::<Vec<_>>());
}

#[test]
fn plain_http_on_the_gateway_listeners_is_cleartext_whatever_the_port() {
    let w = world(RULES);
    // DNS-routed HTTP (`--http-listen`): the name from Host, port 80, sent in cleartext.
    let connect_to = format!(
        "api.test:80:{}:{}",
        w.http_listen.ip(),
        w.http_listen.port()
    );
    let out = w.curl(&[
        "--noproxy",
        "*",
        "--connect-to",
        &connect_to,
        "http://api.test/v1/models",
    ]);
    // The gateway's raw answer names no rule in its headers; the record does (below).
    assert_denial(&out.response, 403, None, "credential_needs_tls");
    assert!(
        out.response.text().contains("rule 'inject' brokers"),
        "{out:#?}"
    );
    // SOCKS5 carrying plain HTTP, to the TLS upstream's port: cleartext too.
    let socks = w.socks.to_string();
    let plain_url = format!("http://api.test:{}/v1/models", w.tls.port());
    let refused = w.curl(&["--socks5-hostname", &socks, &plain_url]);
    assert_denial(
        &refused.response,
        403,
        Some("inject"),
        "credential_needs_tls",
    );
    assert_eq!((w.plain.connections(), w.tls.connections()), (0, 0));
    // SOCKS5 carrying TLS: intercepted, brokered.
    let tls_url = format!("https://api.test:{}/v1/models", w.tls.port());
    let ok = w.curl(&["--socks5-hostname", &socks, &tls_url]);
    assert_eq!(ok.ok().status, 200, "{ok:#?}");
    assert_eq!(w.tls.connections(), 1);

    let records = w.lk.wait_audit(3);
    refused_in_cleartext(
        &records[..2],
        &[
            ("inject", "api.test", 80),
            ("inject", "api.test", w.tls.port()),
        ],
    );
    assert_record(
        &records[2],
        json!({"scheme": "https", "rule": "inject", "reason": "allowed", "secrets": ["key"]}),
    );
    w.no_leak(&[&out, &refused, &ok]);
}

const LEGACY: &str = r#"
[[rules]]
name = "legacy"
hosts = ["api.test"]
ports = [PLAIN]
methods = ["GET"]
dangerously_allow_cleartext = true
[rules.inject.headers]
authorization = "Bearer {{secret.key}}"
"#;

#[test]
fn dangerously_allow_cleartext_lets_it_through_and_check_warns_at_the_key() {
    let w = world(LEGACY);
    let out = w.curl(&[&format!("http://api.test:{}/v1/models", w.plain.port())]);
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let seen = w.plain.received();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert!(
        seen[0]
            .headers
            .iter()
            .any(|(n, v)| n.eq_ignore_ascii_case("authorization") && *v == format!("Bearer {KEY}")),
        "{seen:#?}"
    );
    assert_record(
        &w.lk.wait_audit(1)[0],
        json!({"scheme": "http", "rule": "legacy", "reason": "allowed", "secrets": ["key"]}),
    );

    let text = format!("{CREDENTIALS}{}", LEGACY.replace("PLAIN", "8080"));
    let dir = policy_dir(&[("legacy.toml", &text)]);
    let out = run_cli([
        "check",
        "--no-secrets",
        "--policies",
        &dir.path().display().to_string(),
    ]);
    assert_eq!(out.code(), Some(0), "a warning is not an error: {out:#?}");
    let line = text
        .lines()
        .position(|l| l.starts_with("dangerously_allow_cleartext"))
        .expect("the key")
        + 1;
    let want = format!("legacy.toml:{line}:31: warning: rule \"legacy\" sends secret(s) \"key\" upstream over plain http (dangerously_allow_cleartext = true)");
    assert!(
        out.stdout.contains(&want) || out.stderr.contains(&want),
        "want {want:?} in {out:#?}"
    );
}

#[test]
fn check_explain_and_diff_say_what_cleartext_means() {
    let presets = format!("{}/policies/presets", env!("CARGO_MANIFEST_DIR"));
    let out = run_cli([
        "explain",
        "--policies",
        &presets,
        "GET",
        "http://api.openai.com/v1/models",
    ]);
    assert_eq!(out.code(), Some(1), "a denial: {out:#?}");
    assert!(
        out.stdout.contains("decision: deny")
            && out.stdout.contains("reason:   credential_needs_tls"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("injects"), "{}", out.stdout);
    let out = run_cli([
        "explain",
        "--json",
        "--policies",
        &presets,
        "GET",
        "https://api.openai.com/v1/models",
    ]);
    let e: Value = serde_json::from_str(&out.stdout).expect("explain --json");
    assert_eq!(
        (e["decision"].as_str(), e["injected"][0].as_str()),
        (Some("allow"), Some("authorization"))
    );

    // check: a brokering rule listing http without the key is an error naming the fix.
    let https_only = format!(
        "{CREDENTIALS}{}",
        LEGACY.replace("PLAIN", "8080").replace(
            "dangerously_allow_cleartext = true",
            "schemes = [\"https\"]",
        )
    );
    let both = https_only.replace("schemes = [\"https\"]", "schemes = [\"https\", \"http\"]");
    let dir = policy_dir(&[("api.toml", &both)]);
    let out = run_cli([
        "check",
        "--no-secrets",
        "--policies",
        &dir.path().display().to_string(),
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let line = both
        .lines()
        .position(|l| l.starts_with("schemes"))
        .expect("schemes")
        + 1;
    assert!(
        out.stderr.contains(&format!(
            "api.toml:{line}:21: rules[0].schemes[1]: the rule brokers secret(s) \"key\""
        )) && out.stderr.contains("dangerously_allow_cleartext = true"),
        "{}",
        out.stderr
    );

    // diff: allowing cleartext widens.
    let old = policy_dir(&[("api.toml", &https_only)]);
    let cleartext = https_only.replace(
        "schemes = [\"https\"]",
        "schemes = [\"https\", \"http\"]\ndangerously_allow_cleartext = true",
    );
    let new = policy_dir(&[("api.toml", &cleartext)]);
    let out = run_cli([
        "diff",
        &old.path().display().to_string(),
        &new.path().display().to_string(),
    ]);
    assert_eq!(out.code(), Some(3), "a widening: {out:#?}");
    assert!(
        out.stdout.contains(
            "credentials newly sent over plain http (dangerously_allow_cleartext = true)"
        ),
        "{}",
        out.stdout
    );
}

/// A service-account key file naming a plain `http://` token endpoint: the signed assertion is
/// never sent there (the exchange is refused and recorded `credential_needs_tls`), so the
/// request it was for fails as a credential failure and reaches nobody.
#[test]
fn a_token_endpoint_in_cleartext_is_never_called() {
    let mut bench = Bench::new();
    let key = bench.rsa_key("gsa", false);
    let endpoint = Upstream::http();
    let sa = bench.path("sa.json");
    let json = json!({
        "type": "service_account",
        "private_key_id": "k1",
        "private_key": key.pem,
        "client_email": "agent@latchkey-test.iam.gserviceaccount.com",
        "token_uri": format!("http://api.test:{}/token", endpoint.port()),
    });
    std::fs::write(&sa, json.to_string()).expect("write SA JSON");
    let echo = bench.echo.port();
    let policy = format!(
        "[credentials.gsa]\nkind = \"google_service_account\"\nkey = \"file:{}\"\nscopes = [\"https://www.googleapis.com/auth/devstorage.read_only\"]\n\n[[rules]]\nname = \"gcs\"\nhosts = [\"api.test\"]\nports = [{echo}]\ncredential = \"gsa\"\n",
        sa.display()
    );
    let w = bench.start(&policy, &[]);
    let out = w.curl(&[&format!("https://api.test:{echo}/storage/v1/b")]);
    assert_eq!(out.response.status, 502, "{out:#?}");
    assert_eq!(
        out.response.header("x-latchkey-reason"),
        Some("credential_failed")
    );
    assert_eq!(
        endpoint.connections(),
        0,
        "the assertion never left in cleartext"
    );
    assert_eq!(w.bench.echo.connections(), 0);
    let exchange =
        w.lk.audit_records()
            .into_iter()
            .find(|r| r["rule"] == "credential:gsa")
            .unwrap_or_else(|| panic!("no exchange record: {}", w.lk.audit_text()));
    assert_record(
        &exchange,
        json!({"scheme": "http", "reason": "credential_needs_tls", "method": "POST"}),
    );
    assert!(!w.lk.audit_text().contains("BEGIN PRIVATE KEY"));
}

//! `[credentials.NAME]` validation: `latchkey check` accepts every kind with key material from
//! secret sources; it refuses key material written inline (without echoing it), an unknown kind
//! and a rule naming a credential that does not exist, each as `FILE:LINE:COL: message`.

use std::process::Command;
use std::time::Duration;

use crate::support::credentials::Bench;
use crate::support::latchkey::{wait_with_timeout, BIN, SCRUBBED_ENV};
use crate::support::{policy_dir, problems_in, CliOutput};

fn check(files: &[(&str, &str)], env: &[(&str, &str)]) -> CliOutput {
    let dir = policy_dir(files);
    let mut cmd = Command::new(BIN);
    cmd.arg("check").arg("--policies").arg(dir.path());
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    for (name, value) in env {
        cmd.env(name, value);
    }
    wait_with_timeout(&mut cmd, Duration::from_secs(20))
}

#[test]
fn check_accepts_every_credential_kind() {
    let mut bench = Bench::new();
    let rsa = bench.rsa_key("app", true);
    let ec = bench.ec_key("es");
    let sa = bench.path("sa.json");
    std::fs::write(
        &sa,
        serde_json::json!({
            "type": "service_account",
            "private_key_id": "kid-1",
            "private_key": bench.rsa_key("sa", false).pem,
            "client_email": "sa@p.iam.gserviceaccount.com",
            "token_uri": "https://oauth2.googleapis.com/token",
        })
        .to_string(),
    )
    .expect("write SA JSON");
    let policy = format!(
        r#"
[credentials.aws]
kind = "aws_sigv4"
access_key_id = "env:TEST_AWS_AKID"
secret_access_key = "env:TEST_AWS_SECRET"
session_token = "env:TEST_AWS_TOKEN"
region = "us-west-2"
service = "s3"
max_signed_body = 8388608

[credentials.gh]
kind = "github_app"
app_id = "12345"
installation_id = "678"
private_key = "file:{rsa}"
api = "https://gh-api.test:8443"
permissions = {{ contents = "read" }}
repositories = ["hello"]

[credentials.gsa]
kind = "google_service_account"
key = "file:{sa}"
scopes = ["https://www.googleapis.com/auth/cloud-platform"]
token_uri = "https://oauth.test:8443/token"

[credentials.cc]
kind = "oauth2_client_credentials"
token_url = "https://oauth.test:8443/token"
client_id = "latchkey-test"
client_secret = "env:TEST_CC_SECRET"
scope = "read write"

[credentials.j]
kind = "jwt"
alg = "ES256"
key = "file:{ec}"
ttl = "5m"
header = "x-service-token"
[credentials.j.claims]
iss = "latchkey"
sub = "{{{{identity}}}}"
aud = "{{{{host}}}}"
iat = "{{{{now}}}}"

[[rules]]
name = "s3"
hosts = ["s3.test"]
credential = "aws"

[[rules]]
name = "gh"
hosts = ["gh-api.test"]
credential = "gh"

[[rules]]
name = "gsa"
hosts = ["storage.test"]
credential = "gsa"

[[rules]]
name = "cc"
hosts = ["oauth-api.test"]
credential = "cc"

[[rules]]
name = "j"
hosts = ["jwt.test"]
credential = "j"
"#,
        rsa = rsa.private.display(),
        ec = ec.private.display(),
        sa = sa.display(),
    );
    let out = check(
        &[("main.toml", &policy)],
        &[
            ("TEST_AWS_AKID", "AKIDLATCHKEYCHECK001"),
            ("TEST_AWS_SECRET", "check-aws-secret-key-0123456789"),
            ("TEST_AWS_TOKEN", "check-aws-session-token-0123456789"),
            ("TEST_CC_SECRET", "check-client-secret-0123456789"),
        ],
    );
    assert_eq!(
        out.code(),
        Some(0),
        "check refused a valid policy: {out:#?}"
    );
}

/// `(line, message)` of the problems about `file`, for failure messages.
fn problems(out: &CliOutput, file: &str) -> Vec<(u32, String)> {
    problems_in(&format!("{}{}", out.stdout, out.stderr), file)
        .into_iter()
        .map(|(line, _, message)| (line, message))
        .collect()
}

#[test]
fn check_refuses_key_material_written_inline_without_echoing_it() {
    const INLINE: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYINLINEKEY";
    let policy = format!(
        "[credentials.aws]\nkind = \"aws_sigv4\"\naccess_key_id = \"env:TEST_AWS_AKID\"\n\
         secret_access_key = \"{INLINE}\"\nregion = \"us-west-2\"\nservice = \"s3\"\n\n\
         [[rules]]\nname = \"s3\"\nhosts = [\"s3.test\"]\ncredential = \"aws\"\n"
    );
    let out = check(&[("main.toml", &policy)], &[("TEST_AWS_AKID", "AKIDTEST")]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let found = problems(&out, "main.toml");
    assert!(
        found
            .iter()
            .any(|(line, m)| *line == 4 && m.contains("secret_access_key")),
        "expected main.toml:4:COL: …secret_access_key…, got {found:?}\n{out:#?}"
    );
    assert!(
        !out.stdout.contains(INLINE) && !out.stderr.contains(INLINE),
        "the inline key was echoed: {out:#?}"
    );
}

#[test]
fn check_refuses_an_unknown_credential_kind() {
    let policy = "[credentials.k]\nkind = \"kerberos\"\n\n[[rules]]\nname = \"r\"\n\
                  hosts = [\"api.test\"]\ncredential = \"k\"\n";
    let out = check(&[("main.toml", policy)], &[]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let found = problems(&out, "main.toml");
    assert!(
        found
            .iter()
            .any(|(line, m)| (1..=2).contains(line) && m.contains("kerberos")),
        "expected main.toml:1 or 2 naming \"kerberos\", got {found:?}\n{out:#?}"
    );
}

#[test]
fn check_refuses_a_rule_naming_a_credential_that_does_not_exist() {
    let policy = "[[rules]]\nname = \"r\"\nhosts = [\"api.test\"]\ncredential = \"nope\"\n";
    let out = check(&[("main.toml", policy)], &[]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let found = problems(&out, "main.toml");
    assert!(
        found
            .iter()
            .any(|(line, m)| *line == 4 && m.contains("nope")),
        "expected main.toml:4:COL: …nope…, got {found:?}\n{out:#?}"
    );
}

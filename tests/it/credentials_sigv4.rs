//! AWS SigV4 (`kind = "aws_sigv4"`): latchkey strips whatever auth the sandbox sent and signs
//! last with the real key. The upstream is `tests/clients/verify_sigv4.py`, which recomputes
//! every signature with botocore from what arrived and answers 200 or 403 with the difference;
//! the test reads its verdicts (events), not latchkey's word. Cases: GET with a query, a
//! DynamoDB-style JSON POST, S3 PUTs under and over `max_signed_body` (hashed vs.
//! `UNSIGNED-PAYLOAD`, fixed length and streamed), a session token, a real SDK (botocore) in the
//! sandbox signing with dummy keys, a presigned URL refused, region and service derived from
//! `*.amazonaws.com` hosts, and the verifier itself rejecting a forged signature.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::assert_denial;
use crate::support::assert_record;
use crate::support::credentials::{
    lists_secret, records_of, sha256_hex, Bench, CredWorld, PyServer,
};
use crate::support::latchkey::{wait_with_timeout, SCRUBBED_ENV};
use crate::support::secrets::assert_refusal;

const AKID: &str = "AKIDLATCHKEYTEST7Q2X";
const SECRET: &str = "lkTEST/sigv4+Secret/Key9f8e7d6c5b4a3210zz";
const TOKEN: &str = "IQoJb3JpZ2luX2VjELATCHKEY//////////test+session/tokenQ4w8==";

/// Auth a sandbox (or an SDK in it holding dummy keys) may send; all of it must be replaced.
const SANDBOX_AUTH: &[&str] = &[
    "-H",
    concat!(
        "Authorization: AWS4-HMAC-SHA256 ",
        "Credential=AKIDSANDBOXDUMMY0000/20200101/us-east-1/s3/aws4_request, ",
        "SignedHeaders=host;x-amz-date, ",
        "Signature=0000000000000000000000000000000000000000000000000000000000000000"
    ),
    "-H",
    "X-Amz-Date: 20200101T000000Z",
    "-H",
    "X-Amz-Security-Token: sandbox-dummy-session-token",
    "-H",
    "X-Amz-Content-SHA256: 0000000000000000000000000000000000000000000000000000000000000000",
];

struct Sigv4 {
    w: CredWorld,
    verifier: PyServer,
}

/// The verifier (knowing the real keys) and latchkey with four credentials: `aws` (s3 in
/// us-west-2, `max_signed_body = 1024`) for `s3.test`, `ddb` (dynamodb in us-east-1) for
/// `dynamodb.test`, `apigw` (execute-api in eu-central-1) for `apigw.test`, `derived` (no region
/// or service) for two `*.amazonaws.com` hosts; `aws` also for the echo upstream `api.test`.
fn sigv4_world(session_token: bool) -> Sigv4 {
    let bench = Bench::new();
    let mut verifier_env = vec![("VERIFY_AKID", AKID), ("VERIFY_SECRET", SECRET)];
    if session_token {
        verifier_env.push(("VERIFY_TOKEN", TOKEN));
    }
    let verifier = bench.server("verify_sigv4.py", &verifier_env);
    let port = verifier.port();
    let echo = bench.echo.port();
    let token = if session_token {
        "session_token = \"env:TEST_AWS_TOKEN\"\n"
    } else {
        ""
    };
    let policy = format!(
        r#"
[credentials.aws]
kind = "aws_sigv4"
access_key_id = "env:TEST_AWS_AKID"
secret_access_key = "env:TEST_AWS_SECRET"
{token}region = "us-west-2"
service = "s3"
max_signed_body = 1024

[credentials.ddb]
kind = "aws_sigv4"
access_key_id = "env:TEST_AWS_AKID"
secret_access_key = "env:TEST_AWS_SECRET"
{token}region = "us-east-1"
service = "dynamodb"

[credentials.derived]
kind = "aws_sigv4"
access_key_id = "env:TEST_AWS_AKID"
secret_access_key = "env:TEST_AWS_SECRET"
{token}

[credentials.apigw]
kind = "aws_sigv4"
access_key_id = "env:TEST_AWS_AKID"
secret_access_key = "env:TEST_AWS_SECRET"
{token}region = "eu-central-1"
service = "execute-api"

[[rules]]
name = "s3"
hosts = ["s3.test"]
ports = [{port}]
credential = "aws"

[[rules]]
name = "apigw"
hosts = ["apigw.test"]
ports = [{port}]
credential = "apigw"

[[rules]]
name = "aws-echo"
hosts = ["api.test"]
ports = [{echo}]
credential = "aws"

[[rules]]
name = "dynamodb"
hosts = ["dynamodb.test"]
ports = [{port}]
credential = "ddb"

[[rules]]
name = "aws-derived"
hosts = ["bucket.s3.us-west-2.amazonaws.com", "dynamodb.eu-west-1.amazonaws.com"]
ports = [{port}]
credential = "derived"
"#
    );
    let mut env = vec![("TEST_AWS_SECRET", SECRET)];
    if session_token {
        env.push(("TEST_AWS_TOKEN", TOKEN));
    }
    let w = bench.start_with(&policy, &env, &[("TEST_AWS_AKID", AKID)]);
    Sigv4 { w, verifier }
}

impl Sigv4 {
    fn url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.verifier.port())
    }

    /// The `n`th verdict (1-based), after waiting for it.
    fn verdict(&self, n: usize) -> Value {
        self.verifier.wait_events("verify", n)[n - 1].clone()
    }

    /// Asserts the `n`th verdict is valid and returns it.
    fn valid(&self, n: usize, what: &str) -> Value {
        let v = self.verdict(n);
        assert_eq!(
            v["valid"], true,
            "botocore rejects the signature of {what}: {v:#}"
        );
        assert_eq!(v["access_key"], AKID, "{what}: {v:#}");
        assert_eq!(
            v["authorization_count"], 1,
            "{what}: exactly one authorization must arrive: {v:#}"
        );
        v
    }

    /// A body of `len` printable bytes, written to the scratch dir; returns (path, bytes).
    fn body_file(&self, name: &str, len: usize) -> (String, Vec<u8>) {
        let body: Vec<u8> = (0..len)
            .map(|i| b"abcdefghij0123456789\n"[i % 21])
            .collect();
        let path = self.w.bench.path(name);
        std::fs::write(&path, &body).expect("write body");
        (path.to_str().expect("UTF-8 path").to_string(), body)
    }
}

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut all: Vec<&str> = SANDBOX_AUTH.to_vec();
    all.extend_from_slice(extra);
    all
}

#[test]
fn a_get_with_a_query_is_re_signed_so_botocore_accepts_it() {
    let s = sigv4_world(false);
    let url = s.url(
        "s3.test",
        "/bucket?list-type=2&prefix=photos%2F2024&max-keys=10",
    );

    let resp = s.w.curl_ok(&args(&[&url]));
    assert_eq!(resp.status, 200, "{resp:#?}");

    let v = s.valid(1, "a GET with a query");
    assert_eq!(v["service"], "s3", "{v:#}");
    assert_eq!(v["region"], "us-west-2", "{v:#}");
    assert_eq!(v["method"], "GET");
    assert_eq!(
        v["path"], "/bucket?list-type=2&prefix=photos%2F2024&max-keys=10",
        "the query must arrive as the sandbox sent it"
    );
    assert_eq!(
        v["token_sent"], false,
        "the sandbox's dummy session token must be stripped when none is configured: {v:#}"
    );

    let records = s.w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"host": "s3.test", "method": "GET", "rule": "s3", "decision": "allow",
               "reason": "allowed", "status": 200}),
    );
    assert!(
        lists_secret(&records[0], "credential:aws"),
        "the record must list the credential: {:#}",
        records[0]
    );
    s.w.sweep();
}

#[test]
fn query_shapes_aws_canonicalises_are_signed_as_aws_expects() {
    let s = sigv4_world(false);
    // A key without a value, a repeated key (sorted by value), an encoded slash, characters
    // AWS encodes (`*`) and leaves alone (`~`).
    let path = "/bucket?versions&prefix=z&prefix=a&delimiter=%2F&marker=a*b~c&max-keys=5";
    let resp = s.w.curl_ok(&args(&[&s.url("s3.test", path)]));
    assert_eq!(resp.status, 200, "{resp:#?}");
    let v = s.valid(1, "a GET with an unusual query");
    assert_eq!(v["path"], path, "the query must arrive as sent: {v:#}");
    s.w.lk.wait_audit(1);
    s.w.sweep();
}

#[test]
fn a_non_s3_path_is_signed_double_encoded_as_botocore_expects() {
    let s = sigv4_world(false);
    let path = "/prod/items/caf%C3%A9%20au%20lait?q=x%20y";
    let resp = s.w.curl_ok(&args(&[&s.url("apigw.test", path)]));
    assert_eq!(resp.status, 200, "{resp:#?}");
    let v = s.valid(1, "an execute-api GET with an encoded path");
    assert_eq!(
        (&v["service"], &v["region"]),
        (&json!("execute-api"), &json!("eu-central-1"))
    );
    assert_eq!(v["path"], path, "{v:#}");
    let records = s.w.lk.wait_audit(1);
    assert!(
        lists_secret(&records[0], "credential:apigw"),
        "{:#}",
        records[0]
    );
    s.w.sweep();
}

#[test]
fn an_s3_put_with_metadata_headers_and_expect_continue_is_signed_as_sent() {
    let s = sigv4_world(false);
    let (file, body) = s.body_file("meta.txt", 700);
    let resp = s.w.curl_ok(&args(&[
        "-X",
        "PUT",
        "-H",
        "Expect: 100-continue",
        "-H",
        "X-Amz-Meta-Owner: alice",
        "-H",
        "X-Amz-Meta-Owner: bob",
        "-H",
        "X-Amz-Meta-Note:   two   spaces  ",
        "-H",
        "X-Amz-Storage-Class: STANDARD_IA",
        "-H",
        "X-Amzn-Trace-Id: Root=1-67891233-abcdef012345678912345678",
        "-H",
        "User-Agent: aws-cli/2.0 latchkey-test",
        "--data-binary",
        &format!("@{file}"),
        &s.url("s3.test", "/bucket/meta.txt"),
    ]));
    assert_eq!(resp.status, 200, "{resp:#?}");
    let v = s.valid(1, "an S3 PUT with metadata and Expect: 100-continue");
    let signed = v["signed_headers"].as_array().expect("signed headers");
    for name in ["x-amz-meta-owner", "x-amz-meta-note", "x-amz-storage-class"] {
        assert!(signed.iter().any(|h| h == name), "{name} unsigned: {v:#}");
    }
    // What botocore never signs (a proxy or the SDK may change it): signing `expect` made S3
    // answer SignatureDoesNotMatch to every boto3 upload.
    for name in ["expect", "user-agent", "x-amzn-trace-id", "content-length"] {
        let want = name == "content-length";
        assert_eq!(
            signed.iter().any(|h| h == name),
            want,
            "{name} signed: {want}? {v:#}"
        );
    }
    assert_eq!(v["body_sha256"], sha256_hex(&body), "body changed: {v:#}");
    assert_eq!(v["content_sha256"], sha256_hex(&body), "{v:#}");
    s.w.lk.wait_audit(1);
    s.w.sweep();
}

#[test]
fn a_dynamodb_style_json_post_signs_the_target_header_and_the_body() {
    let s = sigv4_world(false);
    let body = r#"{"TableName":"latchkey-test","Key":{"id":{"S":"item-1"}}}"#;
    let url = s.url("dynamodb.test", "/");

    let resp = s.w.curl_ok(&args(&[
        "-X",
        "POST",
        "-H",
        "Content-Type: application/x-amz-json-1.0",
        "-H",
        "X-Amz-Target: DynamoDB_20120810.GetItem",
        "--data-binary",
        body,
        &url,
    ]));
    assert_eq!(resp.status, 200, "{resp:#?}");

    let v = s.valid(1, "a DynamoDB JSON POST");
    assert_eq!(v["service"], "dynamodb", "{v:#}");
    assert_eq!(v["region"], "us-east-1", "{v:#}");
    let signed = v["signed_headers"].as_array().expect("signed headers");
    assert!(
        signed.iter().any(|h| h == "x-amz-target"),
        "x-amz-target must be signed: {v:#}"
    );
    assert_eq!(
        v["body_sha256"],
        sha256_hex(body.as_bytes()),
        "the body must arrive unchanged: {v:#}"
    );

    let records = s.w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"host": "dynamodb.test", "method": "POST", "rule": "dynamodb", "status": 200}),
    );
    assert!(
        lists_secret(&records[0], "credential:ddb"),
        "{:#}",
        records[0]
    );
    s.w.sweep();
}

#[test]
fn an_s3_put_within_max_signed_body_signs_the_hash_of_the_body() {
    let s = sigv4_world(false);
    let (file, body) = s.body_file("small.txt", 600);
    let url = s.url("s3.test", "/bucket/photos/my%20cat.txt");

    let resp = s.w.curl_ok(&args(&[
        "-X",
        "PUT",
        "-H",
        "Expect:",
        "-H",
        "Content-Type: text/plain",
        "--data-binary",
        &format!("@{file}"),
        &url,
    ]));
    assert_eq!(resp.status, 200, "{resp:#?}");

    let v = s.valid(1, "an S3 PUT of 600 bytes");
    assert_eq!(v["path"], "/bucket/photos/my%20cat.txt", "{v:#}");
    assert_eq!(v["body_sha256"], sha256_hex(&body), "body changed: {v:#}");
    assert_eq!(
        v["content_sha256"],
        sha256_hex(&body),
        "a body within max_signed_body must be signed by its hash: {v:#}"
    );
    s.w.lk.wait_audit(1);
    s.w.sweep();
}

#[test]
fn an_s3_put_over_max_signed_body_is_sent_with_unsigned_payload() {
    let s = sigv4_world(false);
    let (file, body) = s.body_file("large.bin", 4096);

    // A known length over the limit.
    let resp = s.w.curl_ok(&args(&[
        "-X",
        "PUT",
        "-H",
        "Expect:",
        "--data-binary",
        &format!("@{file}"),
        &s.url("s3.test", "/bucket/large.bin"),
    ]));
    assert_eq!(resp.status, 200, "{resp:#?}");
    let v = s.valid(1, "an S3 PUT of 4096 bytes");
    assert_eq!(
        v["content_sha256"], "UNSIGNED-PAYLOAD",
        "a body over max_signed_body (1024) must be sent UNSIGNED-PAYLOAD: {v:#}"
    );
    assert_eq!(v["body_sha256"], sha256_hex(&body), "body changed: {v:#}");

    // A streamed upload (chunked, no length up front) over the limit.
    let resp = s.w.curl_ok(&args(&[
        "-H",
        "Expect:",
        "-H",
        "Transfer-Encoding: chunked",
        "-T",
        &file,
        &s.url("s3.test", "/bucket/streamed.bin"),
    ]));
    assert_eq!(resp.status, 200, "{resp:#?}");
    let v = s.valid(2, "a streamed S3 PUT of 4096 bytes");
    assert_eq!(v["method"], "PUT");
    assert_eq!(v["content_sha256"], "UNSIGNED-PAYLOAD", "{v:#}");
    assert_eq!(v["body_sha256"], sha256_hex(&body), "body changed: {v:#}");

    s.w.lk.wait_audit(2);
    s.w.sweep();
}

/// The sandbox's SDK chose `UNSIGNED-PAYLOAD`: kept (the body streams, nothing is buffered to
/// hash it); a hex hash it sent is replaced by the hash of what latchkey sends; any other value
/// is refused before the upstream.
#[test]
fn the_sandbox_payload_form_is_kept_and_its_own_hash_replaced() {
    let s = sigv4_world(false);
    let (file, body) = s.body_file("form.txt", 500);
    let put = |content_sha256: &str, key: &str| {
        s.w.curl_ok(&[
            "-X",
            "PUT",
            "-H",
            &format!("X-Amz-Content-SHA256: {content_sha256}"),
            "--data-binary",
            &format!("@{file}"),
            &s.url("s3.test", &format!("/bucket/{key}")),
        ])
    };
    let resp = put("UNSIGNED-PAYLOAD", "unsigned.txt");
    assert_eq!(resp.status, 200, "{resp:#?}");
    let v = s.valid(1, "a PUT declaring UNSIGNED-PAYLOAD");
    assert_eq!(v["content_sha256"], "UNSIGNED-PAYLOAD", "{v:#}");
    assert_eq!(v["body_sha256"], sha256_hex(&body), "{v:#}");

    let resp = put(&"ab".repeat(32), "hashed.txt");
    assert_eq!(resp.status, 200, "{resp:#?}");
    let v = s.valid(2, "a PUT with a wrong hex hash");
    assert_eq!(v["content_sha256"], sha256_hex(&body), "{v:#}");

    for bad in [
        "SHA256-OF-NOTHING",
        "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD",
    ] {
        let resp = put(bad, "bad.txt");
        assert_refusal(&resp, 400, "bad_request");
        assert!(resp.text().contains("x-amz-content-sha256"), "{resp:#?}");
    }
    let records = s.w.lk.wait_audit(4);
    assert_record(
        &records[3],
        json!({"rule": "s3", "decision": "deny", "reason": "bad_request", "status": 400,
               "upstream": null}),
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        s.verifier.events_of("verify").len(),
        2,
        "a refused PUT reached the upstream"
    );
    s.w.sweep();
}

#[test]
fn a_session_token_is_sent_once_and_signed() {
    let s = sigv4_world(true);
    let resp =
        s.w.curl_ok(&args(&[&s.url("s3.test", "/bucket/report.csv")]));
    assert_eq!(resp.status, 200, "{resp:#?}");

    let v = s.valid(1, "a GET with a session token");
    assert_eq!(v["token_sent"], true, "{v:#}");
    let signed = v["signed_headers"].as_array().expect("signed headers");
    assert!(
        signed.iter().any(|h| h == "x-amz-security-token"),
        "the session token must be signed: {v:#}"
    );

    // An upstream reflecting what it received (the echo): the session token reaches the sandbox
    // redacted.
    let resp =
        s.w.curl_ok(&[&format!("https://api.test:{}/reflect", s.w.echo_port())]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let seen = s.w.bench.echo.received();
    assert_eq!(seen[0].header_values("x-amz-security-token"), [TOKEN]);

    let records = s.w.lk.wait_audit(2);
    assert!(
        lists_secret(&records[0], "credential:aws"),
        "{:#}",
        records[0]
    );
    s.w.sweep();
}

#[test]
fn an_sdk_signing_with_dummy_keys_in_the_sandbox_is_re_signed_with_the_real_key() {
    let s = sigv4_world(false);
    let s3 = s.url("s3.test", "");
    let ddb = s.url("dynamodb.test", "");

    // botocore's S3 client: dummy key, dummy session token, its own x-amz-content-sha256.
    let out = s.w.python(
        "fake_aws_sdk.py",
        &["s3-put", &s3, "bucket", "reports/q1 2024.csv", "300"],
        &[],
    );
    let put: Value = serde_json::from_str(&out).expect("SDK output");
    assert_eq!(put["status"], 200, "PutObject through latchkey: {put:#}");
    let v = s.valid(1, "botocore's PutObject");
    assert_eq!(v["path"], "/bucket/reports/q1%202024.csv", "{v:#}");
    assert_eq!(v["token_sent"], false, "{v:#}");
    assert_ne!(v["content_sha256"], "UNSIGNED-PAYLOAD", "300 bytes: {v:#}");

    // Over max_signed_body: the SDK's hash is replaced by UNSIGNED-PAYLOAD.
    let out = s.w.python(
        "fake_aws_sdk.py",
        &["s3-put", &s3, "bucket", "big.bin", "3000"],
        &[],
    );
    let put: Value = serde_json::from_str(&out).expect("SDK output");
    assert_eq!(
        put["status"], 200,
        "large PutObject through latchkey: {put:#}"
    );
    let v = s.valid(2, "botocore's large PutObject");
    assert_eq!(v["content_sha256"], "UNSIGNED-PAYLOAD", "{v:#}");
    assert_eq!(v["body_len"], 3000, "{v:#}");

    // botocore's DynamoDB client (JSON 1.0 protocol, x-amz-target).
    let out = s.w.python("fake_aws_sdk.py", &["dynamodb-get", &ddb], &[]);
    let get: Value = serde_json::from_str(&out).expect("SDK output");
    assert_eq!(get["status"], 200, "GetItem through latchkey: {get:#}");
    let v = s.valid(3, "botocore's GetItem");
    assert_eq!(v["service"], "dynamodb", "{v:#}");
    assert_eq!(v["region"], "us-east-1", "{v:#}");

    let records = s.w.lk.wait_audit(3);
    for record in &records {
        assert_eq!(record["status"], 200, "{record:#}");
    }
    s.w.sweep();
}

#[test]
fn a_presigned_url_from_the_sandbox_is_refused_before_the_upstream() {
    let s = sigv4_world(false);
    let url =
        s.w.python(
            "fake_aws_sdk.py",
            &[
                "presign",
                &s.url("s3.test", ""),
                "bucket",
                "secret-report.csv",
            ],
            &[],
        )
        .trim()
        .to_string();
    assert!(
        url.contains("X-Amz-Signature="),
        "not a SigV4 presigned URL: {url}"
    );

    let resp = s.w.curl_ok(&[&url]);
    assert_denial(&resp, 403, Some("s3"), "presigned_query");

    let records = s.w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"host": "s3.test", "rule": "s3", "decision": "deny",
               "reason": "presigned_query", "status": 403, "upstream": null}),
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        s.verifier.events_of("verify").is_empty(),
        "a presigned request reached the upstream: {:#?}",
        s.verifier.events()
    );
    s.w.sweep();
}

#[test]
fn region_and_service_are_derived_from_an_amazonaws_host() {
    let s = sigv4_world(false);

    let resp = s.w.curl_ok(&args(&[
        &s.url("bucket.s3.us-west-2.amazonaws.com", "/photos/cat.jpg")
    ]));
    assert_eq!(resp.status, 200, "{resp:#?}");
    let v = s.valid(1, "a virtual-hosted S3 GET");
    assert_eq!(
        (&v["service"], &v["region"]),
        (&json!("s3"), &json!("us-west-2"))
    );

    let resp = s.w.curl_ok(&args(&[
        "-X",
        "POST",
        "-H",
        "Content-Type: application/x-amz-json-1.0",
        "-H",
        "X-Amz-Target: DynamoDB_20120810.ListTables",
        "--data-binary",
        "{}",
        &s.url("dynamodb.eu-west-1.amazonaws.com", "/"),
    ]));
    assert_eq!(resp.status, 200, "{resp:#?}");
    let v = s.valid(2, "a DynamoDB POST to its regional endpoint");
    assert_eq!(
        (&v["service"], &v["region"]),
        (&json!("dynamodb"), &json!("eu-west-1"))
    );

    let records = s.w.lk.wait_audit(2);
    for record in &records {
        assert!(lists_secret(record, "credential:derived"), "{record:#}");
    }
    s.w.sweep();
}

/// The verifier is only worth something if it rejects: botocore signing directly (no latchkey)
/// with the real keys passes, with a wrong secret fails.
#[test]
fn the_sigv4_verifier_accepts_botocore_and_rejects_a_forged_signature() {
    let bench = Bench::new();
    let verifier = bench.server(
        "verify_sigv4.py",
        &[("VERIFY_AKID", AKID), ("VERIFY_SECRET", SECRET)],
    );
    let endpoint = format!("https://localhost:{}", verifier.port());
    let sdk = |secret: &str| -> Value {
        let mut cmd = Command::new(crate::support::toolchain::python());
        cmd.arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/fake_aws_sdk.py"
        ))
        .args(["dynamodb-get", &endpoint]);
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        cmd.env_remove("LATCHKEY_PROXY")
            .env("LATCHKEY_CA", bench.ca.pem_path())
            .env("SDK_AKID", AKID)
            .env("SDK_SECRET", secret)
            .env("SDK_TOKEN", "");
        let out = wait_with_timeout(&mut cmd, Duration::from_secs(60));
        assert_eq!(out.code(), Some(0), "{out:#?}");
        serde_json::from_str(&out.stdout).expect("SDK output")
    };
    assert_eq!(sdk(SECRET)["status"], 200);
    assert_eq!(sdk("not-the-secret")["status"], 403);
    let events = verifier.wait_events("verify", 2);
    assert_eq!(events[0]["valid"], true, "{events:#?}");
    assert_eq!(events[1]["valid"], false, "{events:#?}");
}

/// A credential that cannot be used (its secret source is missing) fails closed with 502
/// `credential_failed` naming it, and nothing reaches the upstream.
#[test]
fn a_sigv4_credential_whose_secret_is_missing_fails_closed() {
    let bench = Bench::new();
    let verifier = bench.server(
        "verify_sigv4.py",
        &[("VERIFY_AKID", AKID), ("VERIFY_SECRET", SECRET)],
    );
    let port = verifier.port();
    let policy = format!(
        r#"
[credentials.aws_missing]
kind = "aws_sigv4"
access_key_id = "env:TEST_AWS_AKID"
secret_access_key = "exec:/bin/false"
region = "us-west-2"
service = "s3"

[[rules]]
name = "s3"
hosts = ["s3.test"]
ports = [{port}]
credential = "aws_missing"
"#
    );
    let w = bench.start_with(&policy, &[], &[("TEST_AWS_AKID", AKID)]);
    let resp = w.curl_ok(&[&format!("https://s3.test:{port}/bucket/key")]);
    assert_refusal(&resp, 502, "credential_failed");
    assert!(
        resp.text().contains("aws_missing"),
        "the refusal must name the credential: {resp:#?}"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(verifier.events().is_empty(), "{:#?}", verifier.events());
    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"rule": "s3", "decision": "allow", "reason": "credential_failed", "status": 502,
               "upstream": null}),
    );
    w.sweep();
}

#[test]
fn assume_role_trades_the_base_keys_at_sts_and_signs_with_the_role_keys_once() {
    const ROLE_AKID: &str = "ASIAROLEKEYFORLATCHKEY";
    const ROLE_SECRET: &str = "role/secret+Key0123456789abcdefghijklmn";
    const ROLE_TOKEN: &str = "IQoJroleSessionTokenForLatchkeyTests0123456789";
    let mut bench = Bench::new();
    // STS verifies the AssumeRole call with the base keys and hands out the role's keys ...
    let sts = bench.server(
        "verify_sigv4.py",
        &[
            ("VERIFY_AKID", AKID),
            ("VERIFY_SECRET", SECRET),
            (
                "VERIFY_STS_ISSUE",
                &format!("{ROLE_AKID}:{ROLE_SECRET}:{ROLE_TOKEN}"),
            ),
        ],
    );
    // ... and the service accepts only requests signed with those role keys.
    let service = bench.server(
        "verify_sigv4.py",
        &[
            ("VERIFY_AKID", ROLE_AKID),
            ("VERIFY_SECRET", ROLE_SECRET),
            ("VERIFY_TOKEN", ROLE_TOKEN),
        ],
    );
    bench.track("role secret", ROLE_SECRET);
    bench.track("role token", ROLE_TOKEN);
    let policy = format!(
        r#"
[credentials.role]
kind = "aws_sigv4"
access_key_id = "env:TEST_AWS_AKID"
secret_access_key = "env:TEST_AWS_SECRET"
region = "us-west-2"
service = "s3"
[credentials.role.assume_role]
role_arn = "arn:aws:iam::123456789012:role/agent"
session_name = "latchkey-test"
duration = "1h"
sts_endpoint = "https://sts.test:{sts}/"

[[rules]]
name = "s3-role"
hosts = ["s3.test"]
ports = [{svc}]
credential = "role"
"#,
        sts = sts.port(),
        svc = service.port()
    );
    let w = bench.start_with(
        &policy,
        &[("TEST_AWS_SECRET", SECRET)],
        &[("TEST_AWS_AKID", AKID)],
    );
    for i in 0..3 {
        let resp = w.curl_ok(&[&format!("https://s3.test:{}/bucket/obj{i}", service.port())]);
        assert_eq!(
            resp.status, 200,
            "request {i} signed with the role keys: {resp:#?}"
        );
    }
    let verdicts = service.wait_events("verify", 3);
    for v in &verdicts {
        assert_eq!(v["valid"], true, "{v:#}");
        assert_eq!(v["access_key"], ROLE_AKID, "{v:#}");
        assert_eq!(v["token_sent"], true, "{v:#}");
    }
    // One AssumeRole for three requests, signed with the base keys for sts/us-east-1.
    let calls = sts.wait_events("assume_role", 1);
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0]["role_arn"], "arn:aws:iam::123456789012:role/agent");
    assert_eq!(calls[0]["session_name"], "latchkey-test");
    assert_eq!(calls[0]["duration"], "3600");
    assert_eq!(calls[0]["service"], "sts");
    let sts_verdicts = sts.wait_events("verify", 1);
    assert_eq!(sts_verdicts[0]["valid"], true, "{:#}", sts_verdicts[0]);
    assert_eq!(sts_verdicts[0]["access_key"], AKID);
    let records = w.lk.wait_audit(4);
    assert_eq!(
        records_of(&records, "credential:role").len(),
        1,
        "{records:#?}"
    );
    w.sweep();
}

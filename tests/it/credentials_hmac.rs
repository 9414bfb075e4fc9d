//! The generic HMAC request signer (`kind = "hmac"`), verified by `tests/clients/fake_issuers.py`
//! (`/hmac/generic`: `x-signature` = hex HMAC-SHA256 over "METHOD\nPATH?QUERY\nTS\nSHA256(body)"
//! with `x-timestamp`; `/hmac/stripe`: Stripe's `stripe-signature: t=TS,v1=HEX` over
//! "TS.BODY"). The body is held whole to sign it; a key the verifier does not hold is refused by
//! it, so the check is real.

use crate::support::credentials::Bench;

const KEY: &str = "hmac-key-LATCHKEY-test-5f4e3d2c1b0a99";

const POLICY: &str = r#"
[credentials.generic]
kind = "hmac"
key = "env:TEST_HMAC_KEY"
message = "{{method}}\n{{path}}\n{{timestamp}}\n{{body_sha256}}"
headers = { "x-signature" = "{{signature}}", "x-timestamp" = "{{timestamp}}" }

[credentials.stripe]
kind = "hmac"
key = "env:TEST_HMAC_KEY"
algorithm = "sha256"
encoding = "hex"
timestamp = "unix"
message = "{{timestamp}}.{{body}}"
headers = { "stripe-signature" = "t={{timestamp}},v1={{signature}}" }

[credentials.wrong]
kind = "hmac"
key = "env:TEST_HMAC_WRONG"
message = "{{method}}\n{{path}}\n{{timestamp}}\n{{body_sha256}}"
headers = { "x-signature" = "{{signature}}", "x-timestamp" = "{{timestamp}}" }

[[rules]]
name = "generic"
hosts = ["jwt.test"]
ports = [PORT]
credential = "generic"

[[rules]]
name = "stripe"
hosts = ["jwt-es.test"]
ports = [PORT]
credential = "stripe"

[[rules]]
name = "wrong"
hosts = ["apigw.test"]
ports = [PORT]
credential = "wrong"
"#;

#[test]
fn hmac_signatures_over_method_path_and_body_verify_in_python() {
    let bench = Bench::new();
    let verifier = bench.server("fake_issuers.py", &[("FAKE_HMAC_KEY", KEY)]);
    let port = verifier.port();
    let policy = POLICY.replace("PORT", &port.to_string());
    let w = bench.start(
        &policy,
        &[
            ("TEST_HMAC_KEY", KEY),
            ("TEST_HMAC_WRONG", "not-the-key-LATCHKEY-0000000"),
        ],
    );
    let body = r#"{"amount": 2000, "currency": "eur"}"#;
    for (host, path) in [
        ("jwt.test", "/hmac/generic?page=2&q=a%20b"),
        ("jwt-es.test", "/hmac/stripe"),
    ] {
        let resp = w.curl_ok(&[
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "-H",
            "x-signature: sandbox-forged",
            "--data-binary",
            body,
            &format!("https://{host}:{port}{path}"),
        ]);
        assert_eq!(
            resp.status,
            200,
            "{host}: {resp:#?}\n{:#?}",
            verifier.events()
        );
        w.saw_response(host, &resp);
    }
    // A GET without a body signs the empty body's hash.
    let resp = w.curl_ok(&[&format!("https://jwt.test:{port}/hmac/generic")]);
    assert_eq!(resp.status, 200, "{resp:#?}\n{:#?}", verifier.events());
    // Signed with a key the verifier does not hold: refused upstream.
    let resp = w.curl_ok(&[&format!("https://apigw.test:{port}/hmac/generic")]);
    assert_eq!(resp.status, 401, "{resp:#?}");
    let events = verifier.wait_events("hmac", 4);
    let ok: Vec<bool> = events.iter().map(|e| e["ok"] == true).collect();
    assert_eq!(ok, [true, true, true, false], "{events:#?}");
    assert_eq!(events[0]["body_len"], body.len());
    w.lk.wait_audit(4);
    w.track_events(&verifier);
    w.sweep();
}

//! Attestation: a sandbox proves itself with a workload token instead of carrying a secret.
//! Tokens from a test issuer (PyJWT, `tests/clients/attest_tokens.py`) are verified against the
//! issuer's JWKS as `[attest.k8s]` says; a good token admits one session of its profile, with
//! labels mapped from its claims, the same session each time it is presented; a wrong
//! audience or issuer, an expired token, an unknown key, `alg: none`, HS256 keyed with the
//! public key, an algorithm that does not fit the key, a tampered payload, and a token without
//! a claim a required label maps from are all refused `407`. Revoking the session refuses the
//! token. No token reaches the log or the audit.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::sessions::{admin_json, revoke};
use crate::support::{curl, latchkey, Latchkey, TestCa, Upstream};

const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "latchkey-gw";

fn policy(port: u16, jwks: &str) -> String {
    format!(
        r#"
[[rules]]
name  = "other"
hosts = ["other.test"]
ports = [{port}]

[profiles.workload]
rules          = ["other"]
ttl            = "1h"
require_labels = ["namespace"]

[attest.k8s]
issuer   = "{ISSUER}"
jwks     = "{jwks}"
audience = "{AUDIENCE}"
profile  = "workload"
labels   = {{ namespace = "claim.kubernetes.io.namespace", pod = "claim.kubernetes.io.pod.name" }}
"#
    )
}

/// The test issuer's tokens, its JWKS written into `dir`.
fn tokens(dir: &std::path::Path) -> Value {
    let mut cmd = std::process::Command::new(crate::support::toolchain::python());
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/attest_tokens.py"
    ))
    .arg(dir)
    .arg(ISSUER)
    .arg(AUDIENCE);
    let out = crate::support::latchkey::wait_with_timeout(&mut cmd, Duration::from_secs(60));
    assert_eq!(out.code(), Some(0), "attest_tokens.py: {out:#?}");
    serde_json::from_str(out.stdout.trim()).expect("tokens JSON")
}

/// `curl` through `lk` to `url`, presenting `token` as `Proxy-Authorization: Bearer`.
fn get(lk: &Latchkey, token: &str, url: &str) -> crate::support::clients::CurlOutput {
    curl(lk)
        .args([
            "--proxy-header",
            &format!("Proxy-Authorization: Bearer {token}"),
            url,
        ])
        .run()
}

#[test]
fn a_workload_token_admits_one_session_and_every_trick_is_refused() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let keys = tempfile::tempdir().expect("dir");
    let t = tokens(keys.path());
    let jwks = keys.path().join("jwks.json");
    let lk = latchkey()
        .upstream_ca(&ca)
        .pin("other.test")
        .policy(
            "main.toml",
            &policy(upstream.port(), &format!("file:{}", jwks.display())),
        )
        .run();
    let port = upstream.port();
    let url = |p: &str| format!("https://other.test:{port}/{p}");
    let tok = |name: &str| t[name].as_str().unwrap_or_else(|| panic!("token {name}"));

    let first = get(&lk, tok("good"), &url("a1"));
    assert_eq!(first.ok().status, 200);
    let again = get(&lk, tok("good"), &url("a2"));
    assert_eq!(again.ok().status, 200);
    let ec = get(&lk, tok("good_ec"), &url("a3"));
    assert_eq!(ec.ok().status, 200, "{ec:#?}");
    let records = crate::sessions::records_for(&lk, "/a1", 1);
    let r = &records[0];
    assert_eq!(r["profile"], "workload", "{r:#}");
    assert_eq!(
        r["labels"],
        json!({"attest": "k8s", "namespace": "agents", "pod": "runner-7"}),
        "{r:#}"
    );
    let session = r["session"].as_str().expect("session").to_string();
    assert!(session.starts_with("ses_"));
    // The same token is the same session; another token another one.
    assert_eq!(
        crate::sessions::records_for(&lk, "/a2", 1)[0]["session"],
        session.as_str()
    );
    let r3 = &crate::sessions::records_for(&lk, "/a3", 1)[0];
    assert_ne!(r3["session"], session.as_str());
    // A claim the token lacks (its pod) leaves that label out.
    assert_eq!(r3["labels"], json!({"attest": "k8s", "namespace": "batch"}));
    let (_, shown) = admin_json(&lk, "GET", &format!("/sessions/{session}"), None, None);
    assert_eq!(shown["created_by"], "attest:k8s", "{shown:#}");

    for bad in [
        "wrong_aud",
        "wrong_iss",
        "expired",
        "unknown_kid",
        "alg_none",
        "hs256_pubkey",
        "rs_on_ec_kid",
        "tampered",
        "no_namespace",
    ] {
        let out = get(&lk, tok(bad), &url(bad));
        assert_eq!(out.response.status, 407, "{bad} was not refused: {out:#?}");
        assert!(
            out.response.header("x-latchkey-reason").is_some(),
            "{bad}: {out:#?}"
        );
    }
    // Revoked: the token no longer admits anything.
    revoke(&lk, &session);
    let after = get(&lk, tok("good"), &url("after"));
    assert_eq!(after.response.status, 407);
    assert_eq!(
        after.response.header("x-latchkey-reason"),
        Some("session_revoked")
    );

    // No token, nor its signature, in the log or the audit.
    let (audit, log) = (lk.audit_text(), lk.stderr_text());
    for name in ["good", "good_ec", "hs256_pubkey", "tampered", "expired"] {
        let token = tok(name);
        let signature = token.rsplit('.').next().unwrap_or_default();
        for (what, text) in [("audit", &audit), ("log", &log)] {
            assert!(!text.contains(token), "{name} token in the {what}");
            assert!(
                signature.is_empty() || !text.contains(signature),
                "{name} signature in the {what}"
            );
        }
    }
}

#[test]
fn an_issuers_keys_are_fetched_from_its_url_through_the_guarded_dialer() {
    use crate::support::upstream::{full_body, handler};
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let keys = tempfile::tempdir().expect("dir");
    let t = tokens(keys.path());
    let jwks = std::fs::read(keys.path().join("jwks.json")).expect("jwks");
    let issuer = Upstream::https_with(
        &ca,
        handler(move |req| {
            let body = if req.path_only() == "/keys" {
                jwks.clone()
            } else {
                b"{}".to_vec()
            };
            async move {
                http::Response::builder()
                    .header("content-type", "application/json")
                    .body(full_body(body))
                    .expect("response")
            }
        }),
    );
    let url = format!("https://api.test:{}/keys", issuer.port());
    let lk = latchkey()
        .upstream_ca(&ca)
        .pin("other.test")
        .pin("api.test")
        .policy("main.toml", &policy(upstream.port(), &url))
        .run();
    let good = t["good"].as_str().expect("good");
    let (_, raw) = crate::support::sessions::connect_as(
        lk.addr(),
        &format!("other.test:{}", upstream.port()),
        &format!("Bearer {good}"),
    );
    assert_eq!(raw.status, 200, "{}", String::from_utf8_lossy(&raw.body));
    let out = get(
        &lk,
        good,
        &format!("https://other.test:{}/via-url", upstream.port()),
    );
    assert_eq!(out.ok().status, 200, "{out:#?}");
    assert_eq!(issuer.received().len(), 1, "the JWKS was fetched once");
    // Cached: a second token from the same issuer needs no second fetch.
    let ec = get(
        &lk,
        t["good_ec"].as_str().expect("ec"),
        &format!("https://other.test:{}/again", upstream.port()),
    );
    assert_eq!(ec.ok().status, 200);
    assert_eq!(issuer.received().len(), 1, "the JWKS was cached");
}

//! OAuth2 grants beyond client credentials (`kind = "oauth2"`: `refresh_token` with rotation,
//! `password`, RFC 7523 `jwt_bearer`; `client_secret_basic`; `token_endpoint_headers`) and
//! Google ID tokens (`kind = "google_id_token"`). The token endpoints are
//! `tests/clients/fake_issuers.py` (`/oauth2/grant`, `/google/id`), which check each grant, the
//! client authentication, the extra header and the assertions (PyJWT); the resource is the echo
//! upstream, which reflects the token (the sandbox must see it redacted).

use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::assert_record;
use crate::support::credentials::{lists_secret, only_record, records_of, Bench, CredWorld};
use crate::support::secrets::redacted;

const CLIENT_ID: &str = "latchkey-o2";
const CLIENT_SECRET: &str = "o2-client-secret-LATCHKEY-4b1e9d";
const REFRESH: &str = "rt-initial-LATCHKEY-0c7f3a9e51d2";
const API_KEY: &str = "x-api-key-LATCHKEY-77e1c0ab";
const USER: &str = "svc-user@example.test";
const PASSWORD: &str = "pw-LATCHKEY-9a8b7c6d5e4f";
const JB_KEY: &str = "jb-hmac-LATCHKEY-test-key-0123456789abcdef";

fn bearer_tokens(w: &CredWorld) -> Vec<String> {
    w.bench
        .echo
        .received()
        .iter()
        .map(|r| {
            let values = r.header_values("authorization");
            assert_eq!(values.len(), 1, "one authorization per request: {r:#?}");
            values[0]
                .strip_prefix("Bearer ")
                .unwrap_or_else(|| panic!("not a Bearer credential: {r:#?}"))
                .to_string()
        })
        .collect()
}

fn minted(e: &Value) -> String {
    e["minted"]
        .as_str()
        .unwrap_or_else(|| panic!("nothing minted: {e:#}"))
        .to_string()
}

/// A refresh-token credential whose endpoint rotates the refresh token on every refresh: the
/// second refresh must present the rotated one (the configured one is revoked by then), with
/// the client in Basic auth and the extra header rendered from a `[secrets.X]`.
#[test]
fn a_rotated_refresh_token_is_used_for_the_next_refresh() {
    let bench = Bench::new();
    let issuers = bench.server(
        "fake_issuers.py",
        &[
            ("FAKE_O2_CLIENT_ID", CLIENT_ID),
            ("FAKE_O2_SECRET", CLIENT_SECRET),
            ("FAKE_O2_REFRESH", REFRESH),
            ("FAKE_O2_ROTATE", "1"),
            ("FAKE_O2_HEADER", &format!("x-api-key={API_KEY}")),
            // Cached for ~5 s before the 5-minute refresh margin.
            ("FAKE_O2_TTL", "305"),
        ],
    );
    let echo = bench.echo.port();
    let policy = format!(
        r#"
[secrets.o2_api_key]
source = "env:TEST_O2_API_KEY"

[credentials.o2_rt]
kind = "oauth2"
grant = "refresh_token"
token_url = "https://oauth.test:{port}/oauth2/grant"
client_id = "{CLIENT_ID}"
client_secret = "env:TEST_O2_SECRET"
client_auth = "client_secret_basic"
refresh_token = "env:TEST_O2_REFRESH"
token_endpoint_headers = {{ "x-api-key" = "{{{{secret.o2_api_key}}}}" }}

[[rules]]
name = "rt-api"
hosts = ["api.test"]
ports = [{echo}]
credential = "o2_rt"
"#,
        port = issuers.port()
    );
    let w = bench.start(
        &policy,
        &[
            ("TEST_O2_SECRET", CLIENT_SECRET),
            ("TEST_O2_REFRESH", REFRESH),
            ("TEST_O2_API_KEY", API_KEY),
        ],
    );
    let url = format!("https://api.test:{echo}/v1/items");
    let first = w.curl_ok(&[&url]);
    let minted_at = Instant::now();
    assert_eq!(first.status, 200, "{first:#?}\n{:#?}", issuers.events());
    assert!(
        first.text().contains(&redacted("credential:o2_rt")),
        "the echo reflects the token: the sandbox must see it redacted: {first:#?}"
    );
    w.saw_response("first", &first);
    let second = w.curl_ok(&[&url]);
    assert_eq!(second.status, 200, "{second:#?}");
    assert!(minted_at.elapsed() < Duration::from_secs(3), "too slow");
    assert_eq!(issuers.events_of("o2_exchange").len(), 1, "cached");

    thread::sleep(Duration::from_secs(6).saturating_sub(minted_at.elapsed()));
    let third = w.curl_ok(&[&url]);
    assert_eq!(third.status, 200, "{third:#?}\n{:#?}", issuers.events());
    let e = issuers.wait_events("o2_exchange", 2);
    for x in &e {
        assert_eq!(x["ok"], true, "{x:#}");
        assert_eq!(x["grant_type"], "refresh_token", "{x:#}");
        assert_eq!(x["client_auth"], "basic", "{x:#}");
        assert_eq!(x["client_id"], CLIENT_ID, "{x:#}");
        assert_eq!(x["x_header"], API_KEY, "{x:#}");
    }
    assert_eq!(e[0]["refresh_presented"], REFRESH);
    assert_eq!(
        e[1]["refresh_presented"], e[0]["minted_refresh"],
        "the second refresh must present the rotated refresh token: {e:#?}"
    );
    assert_eq!(
        bearer_tokens(&w),
        [minted(&e[0]), minted(&e[0]), minted(&e[1])]
    );
    let records = w.lk.wait_audit(5);
    assert_eq!(records_of(&records, "credential:o2_rt").len(), 2);
    for r in records_of(&records, "rt-api") {
        assert!(lists_secret(r, "credential:o2_rt"), "{r:#}");
    }
    w.track_events(&issuers);
    w.sweep();
}

/// The password grant (username and password from secret sources, client in the form) and the
/// RFC 7523 JWT-bearer grant (an HS256 assertion with iss/sub/aud templated, iat/exp/jti added).
#[test]
fn password_and_jwt_bearer_grants_get_tokens() {
    let bench = Bench::new();
    let issuers = bench.server(
        "fake_issuers.py",
        &[
            ("FAKE_O2_USER", USER),
            ("FAKE_O2_PASS", PASSWORD),
            ("FAKE_O2_JB_KEY", JB_KEY),
        ],
    );
    let (port, echo) = (issuers.port(), bench.echo.port());
    let policy = format!(
        r#"
[credentials.o2_pw]
kind = "oauth2"
grant = "password"
token_url = "https://oauth.test:{port}/oauth2/grant"
client_id = "{CLIENT_ID}"
username = "env:TEST_O2_USER"
password = "env:TEST_O2_PASS"

[credentials.o2_jb]
kind = "oauth2"
grant = "jwt_bearer"
token_url = "https://oauth.test:{port}/oauth2/grant"
alg = "HS256"
key = "env:TEST_O2_JB_KEY"
scope = "api.read"
[credentials.o2_jb.claims]
iss = "latchkey-client"
sub = "{{{{identity}}}}"
aud = "https://oauth.test:{port}/oauth2/grant"

[[rules]]
name = "pw-api"
hosts = ["api.test"]
ports = [{echo}]
credential = "o2_pw"

[[rules]]
name = "jb-api"
hosts = ["other.test"]
ports = [{echo}]
credential = "o2_jb"
"#
    );
    let w = bench.start(
        &policy,
        &[
            ("TEST_O2_USER", USER),
            ("TEST_O2_PASS", PASSWORD),
            ("TEST_O2_JB_KEY", JB_KEY),
        ],
    );
    for host in ["api.test", "other.test"] {
        let resp = w.curl_ok(&[&format!("https://{host}:{echo}/v1/items")]);
        assert_eq!(resp.status, 200, "{resp:#?}\n{:#?}", issuers.events());
    }
    let e = issuers.wait_events("o2_exchange", 2);
    assert!(e.iter().all(|x| x["ok"] == true), "{e:#?}");
    assert_eq!(e[0]["grant_type"], "password");
    assert_eq!(e[0]["client_id"], CLIENT_ID);
    let jb = &e[1];
    assert_eq!(
        jb["grant_type"],
        "urn:ietf:params:oauth:grant-type:jwt-bearer"
    );
    assert_eq!(jb["claims"]["iss"], "latchkey-client", "{jb:#}");
    assert_eq!(jb["claims"]["sub"], "default", "{jb:#}");
    let (iat, exp) = (
        jb["claims"]["iat"].as_u64().expect("iat"),
        jb["claims"]["exp"].as_u64().expect("exp"),
    );
    assert_eq!(exp - iat, 300, "the default assertion lifetime: {jb:#}");
    assert_eq!(
        jb["claims"]["jti"].as_str().map(str::len),
        Some(32),
        "{jb:#}"
    );
    assert_eq!(bearer_tokens(&w), [minted(&e[0]), minted(&e[1])]);
    let records = w.lk.wait_audit(4);
    assert_record(
        only_record(&records, "credential:o2_jb"),
        json!({"method": "POST", "host": "oauth.test", "path": "/oauth2/grant", "status": 200}),
    );
    w.track_events(&issuers);
    w.sweep();
}

/// A wrong password is a 502 `credential_failed` naming the credential, never the password.
#[test]
fn a_refused_password_grant_is_credential_failed() {
    let bench = Bench::new();
    let issuers = bench.server(
        "fake_issuers.py",
        &[("FAKE_O2_USER", USER), ("FAKE_O2_PASS", PASSWORD)],
    );
    let (port, echo) = (issuers.port(), bench.echo.port());
    let policy = format!(
        r#"
[credentials.o2_bad]
kind = "oauth2"
grant = "password"
token_url = "https://oauth.test:{port}/oauth2/grant"
username = "env:TEST_O2_USER"
password = "env:TEST_O2_WRONG"

[[rules]]
name = "bad-api"
hosts = ["api.test"]
ports = [{echo}]
credential = "o2_bad"
"#
    );
    let w = bench.start(
        &policy,
        &[
            ("TEST_O2_USER", USER),
            ("TEST_O2_WRONG", "wrong-pw-LATCHKEY-1234"),
        ],
    );
    let resp = w.curl_ok(&[&format!("https://api.test:{echo}/v1/items")]);
    crate::support::secrets::assert_refusal(&resp, 502, "credential_failed");
    assert!(resp.text().contains("o2_bad"), "{resp:#?}");
    assert!(w.bench.echo.received().is_empty());
    w.lk.wait_audit(2);
    w.track_events(&issuers);
    w.sweep();
}

const GSA_EMAIL: &str = "latchkey-id@latchkey-test.iam.gserviceaccount.com";
const GSA_KID: &str = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d";
const RUN_AUDIENCE: &str = "https://hello-abc123-uc.a.run.app";

/// `google_id_token`: the assertion carries `target_audience` (no scope) and is exchanged at
/// the key file's token URI; the `id_token` goes upstream as a Bearer token and is cached.
#[test]
fn a_google_id_token_is_minted_for_the_audience_and_cached() {
    let mut bench = Bench::new();
    let key = bench.rsa_key("gid", false);
    let issuers = bench.server(
        "fake_issuers.py",
        &[
            ("FAKE_GSA_PUBLIC_KEY", key.public.to_str().expect("UTF-8")),
            ("FAKE_GSA_EMAIL", GSA_EMAIL),
            ("FAKE_GSA_KID", GSA_KID),
            ("FAKE_GID_AUDIENCE", RUN_AUDIENCE),
        ],
    );
    let (port, echo) = (issuers.port(), bench.echo.port());
    let sa = bench.path("sa.json");
    std::fs::write(
        &sa,
        json!({
            "type": "service_account",
            "private_key_id": GSA_KID,
            "private_key": key.pem,
            "client_email": GSA_EMAIL,
            "token_uri": format!("https://oauth.test:{port}/google/id"),
        })
        .to_string(),
    )
    .expect("write SA JSON");
    let policy = format!(
        r#"
[credentials.run]
kind = "google_id_token"
key = "file:{sa}"
audience = "{RUN_AUDIENCE}"

[[rules]]
name = "cloud-run"
hosts = ["api.test"]
ports = [{echo}]
credential = "run"
"#,
        sa = sa.display()
    );
    let w = bench.start(&policy, &[]);
    for _ in 0..2 {
        let resp = w.curl_ok(&[
            "-H",
            "Authorization: Bearer sandbox-own",
            &format!("https://api.test:{echo}/invoke"),
        ]);
        assert_eq!(resp.status, 200, "{resp:#?}\n{:#?}", issuers.events());
        assert!(
            resp.text().contains(&redacted("credential:run")),
            "{resp:#?}"
        );
        w.saw_response("run", &resp);
    }
    let e = issuers.wait_events("gid_exchange", 1);
    assert_eq!(e.len(), 1, "the ID token is cached until its exp: {e:#?}");
    assert_eq!(e[0]["ok"], true, "{:#}", e[0]);
    assert_eq!(e[0]["claims"]["target_audience"], RUN_AUDIENCE);
    assert_eq!(bearer_tokens(&w), [minted(&e[0]), minted(&e[0])]);
    let records = w.lk.wait_audit(3);
    assert_record(
        only_record(&records, "credential:run"),
        json!({"method": "POST", "host": "oauth.test", "path": "/google/id", "status": 200}),
    );
    w.track_events(&issuers);
    w.sweep();
}

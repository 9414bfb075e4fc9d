//! Google service accounts (`kind = "google_service_account"`) and OAuth2 client credentials
//! (`kind = "oauth2_client_credentials"`): latchkey exchanges at a token endpoint and injects
//! `authorization: Bearer <token>`. The token endpoints are `tests/clients/fake_issuers.py`: the
//! Google one verifies the JWT-bearer assertion with the service account's public key (PyJWT:
//! RS256, kid, iss, scope, aud = the endpoint's URL, one-hour lifetime), the OAuth2 one checks
//! the client id, secret and scope. The resource is the echo upstream, which reflects the token
//! (the sandbox must see it redacted). Also: token endpoint failures are 502 `credential_failed`
//! naming the credential, and each exchange has its own audit record.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::assert_record;
use crate::support::credentials::{
    lists_secret, only_record, records_of, Bench, CredWorld, PyServer,
};
use crate::support::secrets::{assert_refusal, redacted};

const GSA_EMAIL: &str = "latchkey-test@latchkey-test.iam.gserviceaccount.com";
const GSA_KID: &str = "0f3c1e9d2b7a4c58e6d1f0a9b8c7d6e5f4a3b2c1";
const SCOPES: [&str; 2] = [
    "https://www.googleapis.com/auth/cloud-platform",
    "https://www.googleapis.com/auth/devstorage.read_only",
];

const CC_ID: &str = "latchkey-test";
const CC_SECRET: &str = "cc-secret-LATCHKEY-test-8d1f2e3a4b5c";
const CC_WRONG: &str = "cc-wrong-secret-LATCHKEY-test-77aa";

/// Bearer tokens the echo upstream received, in order.
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

fn minted(exchange: &Value) -> String {
    exchange["minted"]
        .as_str()
        .unwrap_or_else(|| panic!("no token minted: {exchange:#}"))
        .to_string()
}

// ---------------------------------------------------------------------------------------------
// Google service account

struct Google {
    w: CredWorld,
    issuers: PyServer,
}

/// Two service-account credentials with the same key: `gsa` whose JSON names the fake's token
/// URI (for api.test), `gsa_override` whose JSON names Google's and whose policy overrides it
/// (for other.test).
fn google_world() -> Google {
    let mut bench = Bench::new();
    let key = bench.rsa_key("gsa", false);
    let issuers = bench.server(
        "fake_issuers.py",
        &[
            ("FAKE_GSA_PUBLIC_KEY", key.public.to_str().expect("UTF-8")),
            ("FAKE_GSA_EMAIL", GSA_EMAIL),
            ("FAKE_GSA_KID", GSA_KID),
            ("FAKE_GSA_SCOPE", &SCOPES.join(" ")),
        ],
    );
    let port = issuers.port();
    let sa_json = |token_uri: &str| {
        json!({
            "type": "service_account",
            "project_id": "latchkey-test",
            "private_key_id": GSA_KID,
            "private_key": key.pem,
            "client_email": GSA_EMAIL,
            "client_id": "100000000000000000001",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": token_uri,
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "universe_domain": "googleapis.com",
        })
        .to_string()
    };
    let sa = bench.path("sa.json");
    std::fs::write(
        &sa,
        sa_json(&format!("https://oauth.test:{port}/google/token")),
    )
    .expect("write SA JSON");
    let sa_google = bench.path("sa-google.json");
    std::fs::write(&sa_google, sa_json("https://oauth2.googleapis.com/token"))
        .expect("write SA JSON");
    let echo = bench.echo.port();
    let scopes = format!("[\"{}\", \"{}\"]", SCOPES[0], SCOPES[1]);
    let policy = format!(
        r#"
[credentials.gsa]
kind = "google_service_account"
key = "file:{sa}"
scopes = {scopes}

[credentials.gsa_override]
kind = "google_service_account"
key = "file:{sa_google}"
scopes = {scopes}
token_uri = "https://oauth.test:{port}/google/override"

[[rules]]
name = "gcs"
hosts = ["api.test"]
ports = [{echo}]
credential = "gsa"

[[rules]]
name = "gcs-override"
hosts = ["other.test"]
ports = [{echo}]
credential = "gsa_override"
"#,
        sa = sa.display(),
        sa_google = sa_google.display(),
    );
    let w = bench.start(&policy, &[]);
    Google { w, issuers }
}

fn assert_good_assertion(exchange: &Value, path: &str) {
    assert_eq!(
        exchange["ok"], true,
        "the fake Google token endpoint rejected the assertion: {exchange:#}"
    );
    assert_eq!(exchange["jwt_header"]["alg"], "RS256", "{exchange:#}");
    assert_eq!(exchange["jwt_header"]["kid"], GSA_KID, "{exchange:#}");
    assert_eq!(exchange["claims"]["iss"], GSA_EMAIL, "{exchange:#}");
    assert_eq!(
        exchange["claims"]["scope"],
        SCOPES.join(" "),
        "{exchange:#}"
    );
    assert!(
        exchange["path"].as_str().is_some_and(|p| p == path),
        "exchanged at the wrong URI (want {path}): {exchange:#}"
    );
    assert!(
        exchange["content_type"]
            .as_str()
            .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded")),
        "{exchange:#}"
    );
}

#[test]
fn a_service_account_assertion_verifies_and_its_token_is_cached() {
    let g = google_world();
    let echo = g.w.echo_port();
    let gcs = format!("https://api.test:{echo}/storage/v1/b?project=latchkey-test");

    let first =
        g.w.curl_ok(&["-H", "Authorization: Bearer sandbox-own", &gcs]);
    assert_eq!(first.status, 200, "{first:#?}\n{:#?}", g.issuers.events());
    assert!(
        first.text().contains(&redacted("credential:gsa")),
        "the echo reflects the token: the sandbox must see it redacted: {first:#?}"
    );
    let second = g.w.curl_ok(&[&gcs]);
    assert_eq!(second.status, 200, "{second:#?}");
    let other =
        g.w.curl_ok(&[&format!("https://other.test:{echo}/storage/v1/b")]);
    assert_eq!(other.status, 200, "{other:#?}\n{:#?}", g.issuers.events());

    let exchanges = g.issuers.wait_events("google_exchange", 2);
    assert_eq!(
        exchanges.len(),
        2,
        "one exchange per credential: {exchanges:#?}"
    );
    assert_good_assertion(&exchanges[0], "/google/token");
    assert_good_assertion(&exchanges[1], "/google/override");
    assert_eq!(
        bearer_tokens(&g.w),
        [
            minted(&exchanges[0]),
            minted(&exchanges[0]),
            minted(&exchanges[1])
        ],
        "the upstream must receive each credential's minted token"
    );

    let records = g.w.lk.wait_audit(5);
    assert_record(
        only_record(&records, "credential:gsa"),
        json!({"method": "POST", "host": "oauth.test", "path": "/google/token", "status": 200}),
    );
    assert_record(
        only_record(&records, "credential:gsa_override"),
        json!({"method": "POST", "host": "oauth.test", "path": "/google/override",
               "status": 200}),
    );
    for record in records_of(&records, "gcs") {
        assert!(lists_secret(record, "credential:gsa"), "{record:#}");
    }
    assert!(lists_secret(
        only_record(&records, "gcs-override"),
        "credential:gsa_override"
    ));
    g.w.track_events(&g.issuers);
    g.w.sweep();
}

// ---------------------------------------------------------------------------------------------
// OAuth2 client credentials

fn cc_policy(name: &str, port: u16, path: &str, secret_var: &str, host: &str, echo: u16) -> String {
    format!(
        r#"
[credentials.{name}]
kind = "oauth2_client_credentials"
token_url = "https://oauth.test:{port}{path}"
client_id = "{CC_ID}"
client_secret = "env:{secret_var}"
scope = "read write"

[[rules]]
name = "rule-{name}"
hosts = ["{host}"]
ports = [{echo}]
credential = "{name}"
"#
    )
}

fn cc_issuers(bench: &Bench, ttl: u64) -> PyServer {
    cc_issuers_failing_first(bench, ttl, 0)
}

/// The OAuth2 fake, answering its first `fail_first` exchanges 503.
fn cc_issuers_failing_first(bench: &Bench, ttl: u64, fail_first: u32) -> PyServer {
    bench.server(
        "fake_issuers.py",
        &[
            ("FAKE_CC_CLIENT_ID", CC_ID),
            ("FAKE_CC_SECRET", CC_SECRET),
            ("FAKE_CC_SCOPE", "read write"),
            ("FAKE_CC_TTL", &ttl.to_string()),
            ("FAKE_CC_FAIL_FIRST", &fail_first.to_string()),
        ],
    )
}

#[test]
fn a_client_credentials_token_is_cached_then_refreshed_before_it_expires() {
    let bench = Bench::new();
    // expires_in = 305 s: cached for ~5 s before the 5-minute refresh window.
    let issuers = cc_issuers(&bench, 305);
    let echo = bench.echo.port();
    let policy = cc_policy(
        "cc_api",
        issuers.port(),
        "/oauth/token",
        "TEST_CC_SECRET",
        "api.test",
        echo,
    );
    let w = bench.start(&policy, &[("TEST_CC_SECRET", CC_SECRET)]);
    let url = format!("https://api.test:{echo}/v1/items");

    let first = w.curl_ok(&[&url]);
    let minted_at = Instant::now();
    assert_eq!(first.status, 200, "{first:#?}\n{:#?}", issuers.events());
    assert!(
        first.text().contains(&redacted("credential:cc_api")),
        "the echo reflects the token: the sandbox must see it redacted: {first:#?}"
    );
    let second = w.curl_ok(&[&url]);
    assert_eq!(second.status, 200, "{second:#?}");
    assert!(
        minted_at.elapsed() < Duration::from_secs(3),
        "too slow to test the cache"
    );
    assert_eq!(
        issuers.events_of("cc_exchange").len(),
        1,
        "{:#?}",
        issuers.events()
    );

    thread::sleep(Duration::from_secs(6).saturating_sub(minted_at.elapsed()));
    let third = w.curl_ok(&[&url]);
    assert_eq!(third.status, 200, "{third:#?}");

    let exchanges = issuers.wait_events("cc_exchange", 2);
    assert_eq!(
        exchanges.len(),
        2,
        "a token within 5 minutes of expiry must be replaced: {exchanges:#?}"
    );
    for exchange in &exchanges {
        assert_eq!(exchange["ok"], true, "{exchange:#}");
        assert_eq!(exchange["grant_type"], "client_credentials", "{exchange:#}");
        assert_eq!(exchange["client_id"], CC_ID, "{exchange:#}");
        assert_eq!(exchange["scope"], "read write", "{exchange:#}");
        assert_eq!(
            exchange["client_auth"], "form",
            "the client secret goes in the form: {exchange:#}"
        );
    }
    assert_eq!(
        bearer_tokens(&w),
        [
            minted(&exchanges[0]),
            minted(&exchanges[0]),
            minted(&exchanges[1])
        ]
    );

    let records = w.lk.wait_audit(5);
    let exchange_records = records_of(&records, "credential:cc_api");
    assert_eq!(exchange_records.len(), 2, "{records:#?}");
    for record in exchange_records {
        assert_record(
            record,
            json!({"method": "POST", "host": "oauth.test", "path": "/oauth/token",
                   "status": 200, "decision": "allow"}),
        );
    }
    for record in records_of(&records, "rule-cc_api") {
        assert!(lists_secret(record, "credential:cc_api"), "{record:#}");
    }
    w.track_events(&issuers);
    w.sweep();
}

#[test]
fn token_endpoint_failures_are_502_credential_failed_naming_the_credential() {
    let bench = Bench::new();
    let issuers = cc_issuers(&bench, 3600);
    let port = issuers.port();
    let echo = bench.echo.port();
    let policy = [
        cc_policy(
            "cc_fail500",
            port,
            "/oauth/fail500",
            "TEST_CC_SECRET",
            "api.test",
            echo,
        ),
        cc_policy(
            "cc_badjson",
            port,
            "/oauth/badjson",
            "TEST_CC_SECRET",
            "other.test",
            echo,
        ),
        cc_policy(
            "cc_wrongsecret",
            port,
            "/oauth/token",
            "TEST_CC_WRONG",
            "a.wild.test",
            echo,
        ),
        cc_policy(
            "cc_echo400",
            port,
            "/oauth/echo400",
            "TEST_CC_SECRET",
            "tunnel.test",
            echo,
        ),
    ]
    .concat();
    let w = bench.start(
        &policy,
        &[("TEST_CC_SECRET", CC_SECRET), ("TEST_CC_WRONG", CC_WRONG)],
    );

    let cases = [
        ("cc_fail500", "api.test", 500),
        ("cc_badjson", "other.test", 200),
        ("cc_wrongsecret", "a.wild.test", 401),
        // Quotes the client secret back in its error body: it must go no further.
        ("cc_echo400", "tunnel.test", 400),
    ];
    for (name, host, _) in cases {
        let resp = w.curl_ok(&[&format!("https://{host}:{echo}/v1/items")]);
        assert_refusal(&resp, 502, "credential_failed");
        assert!(
            resp.text().contains(name),
            "the refusal must name the credential {name}: {resp:#?}"
        );
    }
    assert!(
        w.bench.echo.received().is_empty(),
        "nothing may reach the upstream without a credential: {:#?}",
        w.bench.echo.received()
    );
    let exchanges = issuers.wait_events("cc_exchange", 4);
    assert!(exchanges.iter().all(|e| e["ok"] == false), "{exchanges:#?}");

    let records = w.lk.wait_audit(8);
    for (name, host, status) in cases {
        assert_record(
            only_record(&records, &format!("credential:{name}")),
            json!({"method": "POST", "host": "oauth.test", "status": status}),
        );
        assert_record(
            only_record(&records, &format!("rule-{name}")),
            json!({"host": host, "decision": "allow", "reason": "credential_failed",
                   "status": 502}),
        );
    }
    w.track_events(&issuers);
    w.sweep();
}

#[test]
fn concurrent_requests_share_one_failing_exchange() {
    let bench = Bench::new();
    let issuers = bench.server(
        "fake_issuers.py",
        &[("FAKE_DELAY_MS", "300"), ("FAKE_CC_SECRET", CC_SECRET)],
    );
    let echo = bench.echo.port();
    let policy = cc_policy(
        "cc_down",
        issuers.port(),
        "/oauth/fail500",
        "TEST_CC_SECRET",
        "api.test",
        echo,
    );
    let w = bench.start(&policy, &[("TEST_CC_SECRET", CC_SECRET)]);

    let responses = w.concurrent_gets(&format!("api.test:{echo}"), "/v1/items", 10);
    for resp in &responses {
        assert_refusal(resp, 502, "credential_failed");
    }
    thread::sleep(Duration::from_millis(300));
    let exchanges = issuers.events_of("cc_exchange");
    assert_eq!(
        exchanges.len(),
        1,
        "10 concurrent requests must share one exchange, failing or not: {exchanges:#?}"
    );
    let records = w.lk.wait_audit(11);
    assert_eq!(
        records_of(&records, "credential:cc_down").len(),
        1,
        "{records:#?}"
    );
    w.sweep();
}

#[test]
fn an_unreachable_token_endpoint_is_a_502_credential_failed() {
    let bench = Bench::new();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let echo = bench.echo.port();
    let policy = cc_policy(
        "cc_gone",
        closed,
        "/oauth/token",
        "TEST_CC_SECRET",
        "api.test",
        echo,
    );
    let w = bench.start(&policy, &[("TEST_CC_SECRET", CC_SECRET)]);

    let resp = w.curl_ok(&[&format!("https://api.test:{echo}/v1/items")]);
    assert_refusal(&resp, 502, "credential_failed");
    assert!(resp.text().contains("cc_gone"), "{resp:#?}");
    assert!(w.bench.echo.received().is_empty());
    let records = w.lk.wait_audit(2);
    assert_record(
        only_record(&records, "credential:cc_gone"),
        json!({"method": "POST", "host": "oauth.test", "port": closed, "status": null}),
    );
    assert_record(
        only_record(&records, "rule-cc_gone"),
        json!({"reason": "credential_failed", "status": 502}),
    );
    w.sweep();
}

/// Token endpoints are dialed like any upstream: with the address guard at its defaults, a
/// token endpoint on loopback is refused and receives nothing.
#[test]
fn token_endpoints_go_through_the_address_guard() {
    let bench = Bench::new().guarded();
    let issuers = cc_issuers(&bench, 3600);
    let echo = bench.echo.port();
    let policy = cc_policy(
        "cc_guarded",
        issuers.port(),
        "/oauth/token",
        "TEST_CC_SECRET",
        "api.test",
        echo,
    );
    let w = bench.start(&policy, &[("TEST_CC_SECRET", CC_SECRET)]);

    let resp = w.curl_ok(&[&format!("https://api.test:{echo}/v1/items")]);
    assert_refusal(&resp, 502, "credential_failed");
    thread::sleep(Duration::from_millis(300));
    assert!(
        issuers.events().is_empty(),
        "the token endpoint on loopback was reached past the address guard: {:#?}",
        issuers.events()
    );
    assert!(w.bench.echo.received().is_empty());
    let records = w.lk.wait_audit(2);
    assert_record(
        only_record(&records, "credential:cc_guarded"),
        json!({"method": "POST", "host": "oauth.test", "upstream": null, "status": null}),
    );
    w.sweep();
}

/// A failed exchange is not cached for good: once the token endpoint recovers, a later request
/// gets a token (latchkey may hold the failure for a few seconds, without calling the endpoint
/// again meanwhile).
#[test]
fn a_failed_exchange_is_retried_once_the_endpoint_recovers() {
    let bench = Bench::new();
    let issuers = cc_issuers_failing_first(&bench, 3600, 1);
    let echo = bench.echo.port();
    let policy = cc_policy(
        "cc_flaky",
        issuers.port(),
        "/oauth/token",
        "TEST_CC_SECRET",
        "api.test",
        echo,
    );
    let w = bench.start(&policy, &[("TEST_CC_SECRET", CC_SECRET)]);
    let url = format!("https://api.test:{echo}/v1/items");

    let first = w.curl_ok(&[&url]);
    assert_refusal(&first, 502, "credential_failed");
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut attempts = 1;
    loop {
        thread::sleep(Duration::from_millis(500));
        let resp = w.curl_ok(&[&url]);
        attempts += 1;
        if resp.status == 200 {
            break;
        }
        assert_refusal(&resp, 502, "credential_failed");
        assert!(
            Instant::now() < deadline,
            "the endpoint recovered 15 s ago and latchkey still answers {resp:#?}\n{:#?}",
            issuers.events()
        );
    }
    let exchanges = issuers.wait_events("cc_exchange", 2);
    assert_eq!(
        exchanges.len(),
        2,
        "one failed exchange, then one that succeeded: {exchanges:#?}"
    );
    assert_eq!(bearer_tokens(&w), [minted(&exchanges[1])]);
    w.lk.wait_audit(attempts + 2);
    w.track_events(&issuers);
    w.sweep();
}

/// A token with `expires_in` of 300 s or less is already inside the refresh window: each
/// request fetches its own (and uses it).
#[test]
fn a_token_expiring_within_five_minutes_is_used_once_per_fetch() {
    let bench = Bench::new();
    let issuers = cc_issuers(&bench, 60);
    let echo = bench.echo.port();
    let policy = cc_policy(
        "cc_short",
        issuers.port(),
        "/oauth/token",
        "TEST_CC_SECRET",
        "api.test",
        echo,
    );
    let w = bench.start(&policy, &[("TEST_CC_SECRET", CC_SECRET)]);
    let url = format!("https://api.test:{echo}/v1/items");

    for _ in 0..2 {
        let resp = w.curl_ok(&[&url]);
        assert_eq!(resp.status, 200, "{resp:#?}");
    }
    let exchanges = issuers.wait_events("cc_exchange", 2);
    assert_eq!(exchanges.len(), 2, "{exchanges:#?}");
    assert_eq!(
        bearer_tokens(&w),
        [minted(&exchanges[0]), minted(&exchanges[1])],
        "each request must carry the token fetched for it"
    );
    w.lk.wait_audit(4);
    w.track_events(&issuers);
    w.sweep();
}

/// A token endpoint answering 307 elsewhere: latchkey must not follow it, or the client secret
/// would be posted to a host the policy never named.
#[test]
fn a_token_endpoint_redirect_is_not_followed() {
    let bench = Bench::new();
    let elsewhere = cc_issuers(&bench, 3600);
    let redirect_to = format!("https://jwt.test:{}/oauth/token", elsewhere.port());
    let issuers = bench.server("fake_issuers.py", &[("FAKE_REDIRECT_TO", &redirect_to)]);
    let echo = bench.echo.port();
    let policy = cc_policy(
        "cc_moved",
        issuers.port(),
        "/oauth/redirect",
        "TEST_CC_SECRET",
        "api.test",
        echo,
    );
    let w = bench.start(&policy, &[("TEST_CC_SECRET", CC_SECRET)]);

    let resp = w.curl_ok(&[&format!("https://api.test:{echo}/v1/items")]);
    assert_refusal(&resp, 502, "credential_failed");
    issuers.wait_events("redirect", 1);
    thread::sleep(Duration::from_millis(300));
    assert!(
        elsewhere.events().is_empty(),
        "latchkey followed the token endpoint's redirect: {:#?}",
        elsewhere.events()
    );
    assert!(w.bench.echo.received().is_empty());
    w.lk.wait_audit(2);
    w.sweep();
}

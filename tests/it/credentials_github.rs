//! GitHub App (`kind = "github_app"`): latchkey mints the app JWT, exchanges it for an
//! installation token and injects that. The token endpoint and the API are
//! `tests/clients/fake_issuers.py`, which verifies the app JWT with the app's public key (PyJWT,
//! RS256, iss, iat/exp), issues `ghs_…` tokens with an `expires_at`, counts exchanges, and lets
//! API and git requests through only with a live token it issued. Cases: 50 concurrent requests
//! make one exchange; a token in its refresh window is replaced; git over HTTPS (a real `git`)
//! and another host get `Basic x-access-token:<token>`; a request policy denies mints nothing; a
//! rejected JWT is a 502 `credential_failed`.

use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::support::credentials::{
    audit_at_least, basic_x_access_token, lists_secret, only_record, records_of, Bench, CredWorld,
    PyServer,
};
use crate::support::secrets::assert_refusal;
use crate::support::{assert_denial, assert_record};

const APP_ID: &str = "12345";
const INSTALLATION: &str = "678";
const EXCHANGE_PATH: &str = "/app/installations/678/access_tokens";

struct Gh {
    w: CredWorld,
    issuers: PyServer,
}

/// The fake GitHub (token TTL `ttl` s, exchanges answered after `delay_ms`) and latchkey with
/// credential `gh_app` for the API host `gh-api.test`, the git host `github.test` and the echo
/// upstream `api.test`. `wrong_key`: the fake knows another app's public key.
fn github_world(ttl: u64, delay_ms: u64, wrong_key: bool) -> Gh {
    let mut bench = Bench::new();
    let key = bench.rsa_key("gh-app", true);
    let public = if wrong_key {
        bench.rsa_key("other-app", true).public
    } else {
        key.public.clone()
    };
    let issuers = bench.server(
        "fake_issuers.py",
        &[
            ("FAKE_GH_APP_ID", APP_ID),
            ("FAKE_GH_INSTALLATION_ID", INSTALLATION),
            ("FAKE_GH_PUBLIC_KEY", public.to_str().expect("UTF-8 path")),
            ("FAKE_GH_TTL", &ttl.to_string()),
            ("FAKE_DELAY_MS", &delay_ms.to_string()),
        ],
    );
    let port = issuers.port();
    let echo = bench.echo.port();
    let policy = format!(
        r#"
[credentials.gh_app]
kind = "github_app"
app_id = "{APP_ID}"
installation_id = "{INSTALLATION}"
private_key = "file:{key}"
api = "https://gh-api.test:{port}"
permissions = {{ contents = "read" }}
repositories = ["hello"]

[[rules]]
name = "github-api"
hosts = ["gh-api.test"]
ports = [{port}]
methods = ["GET", "HEAD"]
credential = "gh_app"

[[rules]]
name = "github-git"
hosts = ["github.test"]
ports = [{port}]
credential = "gh_app"

[[rules]]
name = "echo"
hosts = ["api.test"]
ports = [{echo}]
credential = "gh_app"
"#,
        key = key.private.display()
    );
    let w = bench.start(&policy, &[]);
    Gh { w, issuers }
}

impl Gh {
    fn api_url(&self, path: &str) -> String {
        format!("https://gh-api.test:{}{path}", self.issuers.port())
    }

    fn exchanges(&self) -> Vec<Value> {
        self.issuers.events_of("github_exchange")
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

/// What the fake saw of the app JWT and the exchange request, checked against the contract.
fn assert_good_exchange(exchange: &Value) {
    assert_eq!(
        exchange["ok"], true,
        "the fake GitHub rejected the exchange: {exchange:#}"
    );
    assert_eq!(exchange["jwt_header"]["alg"], "RS256", "{exchange:#}");
    let claims = &exchange["claims"];
    let iss = claims["iss"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| claims["iss"].to_string());
    assert_eq!(iss, APP_ID, "iss must be the app id: {exchange:#}");
    let iat = claims["iat"].as_i64().expect("numeric iat");
    let exp = claims["exp"].as_i64().expect("numeric exp");
    assert_eq!(exp - iat, 600, "iat = now-60, exp = now+540: {exchange:#}");
    assert!(
        iat <= now() - 30,
        "iat must be back-dated (clock skew): {exchange:#}"
    );
    assert_eq!(
        exchange["body"],
        json!({"permissions": {"contents": "read"}, "repositories": ["hello"]}),
        "the exchange must narrow the token as configured: {exchange:#}"
    );
    assert!(
        exchange["user_agent"]
            .as_str()
            .is_some_and(|ua| !ua.is_empty()),
        "GitHub refuses API requests without a User-Agent: {exchange:#}"
    );
}

#[test]
fn fifty_concurrent_requests_mint_exactly_one_installation_token() {
    let g = github_world(3600, 300, false);
    let authority = format!("gh-api.test:{}", g.issuers.port());

    let responses = g.w.concurrent_gets(&authority, "/repos/octo/hello", 50);
    for (i, resp) in responses.iter().enumerate() {
        assert_eq!(
            resp.status,
            200,
            "request {i} of 50: {resp:#?}\nexchanges: {:#?}",
            g.exchanges()
        );
    }

    thread::sleep(Duration::from_millis(200));
    let exchanges = g.exchanges();
    assert_eq!(
        exchanges.len(),
        1,
        "50 concurrent requests must share one token exchange: {exchanges:#?}"
    );
    assert_good_exchange(&exchanges[0]);
    let api = g.issuers.wait_events("api", 50);
    assert_eq!(api.len(), 50, "{api:#?}");
    for event in &api {
        assert_eq!(event["ok"], true, "{event:#}");
        assert_eq!(event["authorization_scheme"], "Bearer", "{event:#}");
        assert_eq!(event["token_index"], 0, "{event:#}");
    }

    let records = g.w.lk.wait_audit(51);
    let exchange = only_record(&records, "credential:gh_app");
    assert_record(
        exchange,
        json!({"method": "POST", "host": "gh-api.test", "port": g.issuers.port(),
               "path": EXCHANGE_PATH, "status": 201, "decision": "allow"}),
    );
    let api_records = records_of(&records, "github-api");
    assert_eq!(api_records.len(), 50, "{records:#?}");
    for record in api_records {
        assert_record(record, json!({"status": 200, "reason": "allowed"}));
        assert!(lists_secret(record, "credential:gh_app"), "{record:#}");
    }
    g.w.track_events(&g.issuers);
    g.w.sweep();
}

#[test]
fn an_installation_token_in_its_refresh_window_is_replaced() {
    // expires_at = now + 306 s (whole seconds): usable for 5-6 s before the refresh window.
    let g = github_world(306, 0, false);
    let url = g.api_url("/repos/octo/hello");

    let first = g.w.curl_ok(&[&url]);
    let minted_at = Instant::now();
    assert_eq!(first.status, 200, "{first:#?}");
    let second = g.w.curl_ok(&[&url]);
    assert_eq!(second.status, 200, "{second:#?}");
    assert!(
        minted_at.elapsed() < Duration::from_secs(3),
        "too slow to test the cache"
    );
    assert_eq!(
        g.exchanges().len(),
        1,
        "a token outside its refresh window must be reused: {:#?}",
        g.exchanges()
    );

    thread::sleep(Duration::from_secs(7).saturating_sub(minted_at.elapsed()));
    let third = g.w.curl_ok(&[&url]);
    assert_eq!(third.status, 200, "{third:#?}");
    let exchanges = g.exchanges();
    assert_eq!(
        exchanges.len(),
        2,
        "a token within 5 minutes of its expires_at must be replaced: {exchanges:#?}"
    );
    assert_good_exchange(&exchanges[1]);
    let tokens: Vec<Value> = g
        .issuers
        .wait_events("api", 3)
        .iter()
        .map(|e| e["token_index"].clone())
        .collect();
    assert_eq!(tokens, [json!(0), json!(0), json!(1)]);

    let records = g.w.lk.wait_audit(5);
    assert_eq!(
        records_of(&records, "credential:gh_app").len(),
        2,
        "{records:#?}"
    );
    g.w.track_events(&g.issuers);
    g.w.sweep();
}

#[test]
fn git_over_https_and_other_hosts_get_basic_x_access_token() {
    let g = github_world(3600, 0, false);
    let repo = format!("https://github.test:{}/octo/hello.git", g.issuers.port());

    // A request policy denies mints nothing.
    let denied =
        g.w.curl_ok(&["-X", "DELETE", &g.api_url("/repos/octo/hello")]);
    assert_denial(&denied, 403, None, "method_not_allowed");
    thread::sleep(Duration::from_millis(200));
    assert!(
        g.exchanges().is_empty(),
        "a denied request must not mint a token: {:#?}",
        g.exchanges()
    );

    // A real git client, holding no credential at all.
    let (code, stdout, stderr) = g.w.git(&["ls-remote", &repo]);
    assert_eq!(
        code,
        Some(0),
        "git ls-remote failed:\n{stderr}\n{:#?}",
        g.issuers.events()
    );
    assert!(
        stdout.contains("refs/heads/main"),
        "git ls-remote printed no refs: {stdout}"
    );
    let git = g.issuers.wait_events("git", 1);
    let last = git.last().expect("git event");
    assert_eq!(last["ok"], true, "{git:#?}");
    assert_eq!(last["scheme"], "Basic", "{git:#?}");
    assert_eq!(last["user"], "x-access-token", "{git:#?}");

    // Another host (the echo upstream): Basic, and the reflection reaches the sandbox redacted.
    let resp = g.w.curl_ok(&[
        "-H",
        "Authorization: token sandbox-own-token",
        &format!("https://api.test:{}/whoami", g.w.echo_port()),
    ]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let exchanges = g.exchanges();
    assert_eq!(
        exchanges.len(),
        1,
        "one token for every host: {exchanges:#?}"
    );
    assert_good_exchange(&exchanges[0]);
    let token = exchanges[0]["minted"].as_str().expect("minted token");
    let seen = g.w.bench.echo.received();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_eq!(
        seen[0].header_values("authorization"),
        [basic_x_access_token(token)],
        "{seen:#?}"
    );

    let records = audit_at_least(&g.w.lk, 3);
    assert_eq!(
        records_of(&records, "credential:gh_app").len(),
        1,
        "{records:#?}"
    );
    let git_records = records_of(&records, "github-git");
    assert!(!git_records.is_empty(), "{records:#?}");
    for record in git_records {
        assert!(lists_secret(record, "credential:gh_app"), "{record:#}");
    }
    assert!(lists_secret(
        only_record(&records, "echo"),
        "credential:gh_app"
    ));
    g.w.track_events(&g.issuers);
    g.w.sweep();
}

#[test]
fn an_exchange_the_token_endpoint_rejects_is_a_502_naming_the_credential() {
    let g = github_world(3600, 0, true);

    let resp = g.w.curl_ok(&[&g.api_url("/repos/octo/hello")]);
    assert_refusal(&resp, 502, "credential_failed");
    assert!(
        resp.text().contains("gh_app"),
        "the refusal must name the credential: {resp:#?}"
    );

    let exchanges = g.issuers.wait_events("github_exchange", 1);
    assert_eq!(
        exchanges[0]["ok"], false,
        "the fake must reject a JWT signed by another key: {exchanges:#?}"
    );
    assert!(
        g.issuers.events_of("api").is_empty(),
        "{:#?}",
        g.issuers.events()
    );

    let records = audit_at_least(&g.w.lk, 2);
    assert_record(
        only_record(&records, "credential:gh_app"),
        json!({"method": "POST", "host": "gh-api.test", "path": EXCHANGE_PATH, "status": 401}),
    );
    assert_record(
        only_record(&records, "github-api"),
        json!({"decision": "allow", "reason": "credential_failed", "status": 502}),
    );
    g.w.track_events(&g.issuers);
    g.w.sweep();
}

/// GitHub Enterprise Server: `api` carries a path prefix (`/api/v3`); the exchange goes under
/// it, and API requests to that host get the Bearer token.
#[test]
fn a_github_enterprise_api_with_a_path_prefix_exchanges_under_it() {
    let mut bench = Bench::new();
    let key = bench.rsa_key("ghe-app", true);
    let issuers = bench.server(
        "fake_issuers.py",
        &[
            ("FAKE_GH_APP_ID", APP_ID),
            ("FAKE_GH_INSTALLATION_ID", INSTALLATION),
            (
                "FAKE_GH_PUBLIC_KEY",
                key.public.to_str().expect("UTF-8 path"),
            ),
        ],
    );
    let port = issuers.port();
    let policy = format!(
        r#"
[credentials.ghe]
kind = "github_app"
app_id = "{APP_ID}"
installation_id = "{INSTALLATION}"
private_key = "file:{key}"
api = "https://gh-api.test:{port}/api/v3"

[[rules]]
name = "ghe"
hosts = ["gh-api.test"]
ports = [{port}]
credential = "ghe"
"#,
        key = key.private.display()
    );
    let w = bench.start(&policy, &[]);

    let resp = w.curl_ok(&[&format!(
        "https://gh-api.test:{port}/api/v3/repos/octo/hello"
    )]);
    assert_eq!(resp.status, 200, "{resp:#?}\n{:#?}", issuers.events());
    let exchange = &issuers.wait_events("github_exchange", 1)[0];
    assert_eq!(exchange["ok"], true, "{exchange:#}");
    let api = &issuers.wait_events("api", 1)[0];
    assert_eq!(api["authorization_scheme"], "Bearer", "{api:#}");

    let records = w.lk.wait_audit(2);
    assert_record(
        only_record(&records, "credential:ghe"),
        json!({"method": "POST", "path": "/api/v3/app/installations/678/access_tokens",
               "status": 201}),
    );
    w.track_events(&issuers);
    w.sweep();
}

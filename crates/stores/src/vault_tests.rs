//! The Vault client against a scripted transport: logins, renewal, re-login on 403, mount
//! discovery, fields, leases, and that no token or value is ever in a message.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::secrets::{Source, VaultAuth};
use crate::signing::exchange::{Answer, BoxFuture, Exchange, TransportError};

const TOKEN: &str = "hvs.latchkey-test-client-token-1";
const TOKEN2: &str = "hvs.latchkey-test-client-token-2";
const VALUE: &str = "s3cr3t-value-never-printed";

/// What the fake saw of one exchange.
#[derive(Clone, Debug)]
struct Seen {
    rule: String,
    /// `METHOD path?query`, the path after `/v1/`.
    call: String,
    headers: Vec<(String, String)>,
    body: String,
    route: crate::signing::exchange::Route,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Answers scripted per `METHOD path`: each answer once, the last one for good.
#[derive(Default)]
struct Fake {
    seen: Mutex<Vec<Seen>>,
    script: Mutex<HashMap<String, VecDeque<(u16, String)>>>,
    down: Mutex<bool>,
}

impl Fake {
    fn on(&self, call: &str, status: u16, body: serde_json::Value) -> &Self {
        self.script
            .lock()
            .unwrap()
            .entry(call.to_string())
            .or_default()
            .push_back((status, body.to_string()));
        self
    }

    fn calls(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.call.clone())
            .collect()
    }

    fn count(&self, call: &str) -> usize {
        self.calls().iter().filter(|c| *c == call).count()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl TokenTransport for Fake {
    fn call(&self, ex: Exchange) -> BoxFuture<'_, Result<Answer, TransportError>> {
        Box::pin(async move {
            if *self.down.lock().unwrap() {
                return Err(TransportError("connection refused".into()));
            }
            let path = ex.url.split_once("/v1/").map(|(_, p)| p).unwrap_or("?");
            let call = format!("{} {path}", ex.method);
            self.seen.lock().unwrap().push(Seen {
                rule: ex.rule.clone(),
                call: call.clone(),
                headers: ex
                    .headers
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_string()))
                    .collect(),
                body: String::from_utf8_lossy(&ex.body).into_owned(),
                route: ex.route.clone(),
            });
            let mut script = self.script.lock().unwrap();
            let (status, body) = match script.get_mut(&call) {
                Some(q) if q.len() > 1 => q.pop_front().unwrap(),
                Some(q) if q.len() == 1 => q[0].clone(),
                _ => (404, r#"{"errors":[]}"#.to_string()),
            };
            Ok(Answer {
                status,
                body: body.into(),
            })
        })
    }
}

fn conn(auth: VaultAuth) -> Arc<VaultConnection> {
    Arc::new(VaultConnection {
        name: String::new(),
        address: "http://127.0.0.1:8200".into(),
        ca: None,
        namespace: None,
        auth,
        allow_private: Vec::new(),
    })
}

fn token_auth() -> VaultAuth {
    std::env::set_var("LATCHKEY_VAULT_TEST_TOKEN", TOKEN);
    VaultAuth::Token {
        token: Box::new(Source::Env("LATCHKEY_VAULT_TEST_TOKEN".into())),
    }
}

fn approle() -> VaultAuth {
    std::env::set_var("LATCHKEY_VAULT_TEST_ROLE_ID", "role-id-0123456789");
    std::env::set_var("LATCHKEY_VAULT_TEST_SECRET_ID", "secret-id-0123456789");
    VaultAuth::AppRole {
        mount: "approle".into(),
        role_id: Box::new(Source::Env("LATCHKEY_VAULT_TEST_ROLE_ID".into())),
        secret_id: Box::new(Source::Env("LATCHKEY_VAULT_TEST_SECRET_ID".into())),
    }
}

fn at(conn: &Arc<VaultConnection>, spec: &str) -> Location {
    let rest = spec.strip_prefix("vault:").unwrap();
    let Source::Remote(remote) =
        Source::parse(&format!("vault:{rest}"), Duration::ZERO, Duration::ZERO).unwrap()
    else {
        panic!("not remote")
    };
    match remote.at {
        Location::Vault {
            connection,
            path,
            field,
            version,
            ..
        } => Location::Vault {
            connection,
            settings: Some(conn.clone()),
            path,
            field,
            version,
        },
        other => other,
    }
}

fn lookup(ttl: u64, renewable: bool) -> serde_json::Value {
    serde_json::json!({ "data": { "ttl": ttl, "renewable": renewable } })
}

fn auth(token: &str, ttl: u64, renewable: bool) -> serde_json::Value {
    serde_json::json!({ "auth": { "client_token": token, "lease_duration": ttl, "renewable": renewable } })
}

fn kv2_mount() -> serde_json::Value {
    serde_json::json!({ "data": { "path": "secret/", "type": "kv", "options": { "version": "2" } } })
}

fn kv2(data: serde_json::Value) -> serde_json::Value {
    serde_json::json!({ "data": { "data": data, "metadata": { "version": 1 } }, "lease_id": "", "lease_duration": 0 })
}

fn denied() -> serde_json::Value {
    serde_json::json!({ "errors": ["permission denied"] })
}

async fn value(vault: &Vault, loc: &Location) -> Result<(String, Option<Duration>), String> {
    let f = vault.fetch("app", loc).await?;
    Ok((
        String::from_utf8(f.value.expose().to_vec()).unwrap(),
        f.valid_for,
    ))
}

#[tokio::test]
async fn token_auth_looks_itself_up_then_reads_kv2_with_the_vault_headers() {
    let fake = Arc::new(Fake::default());
    fake.on("GET auth/token/lookup-self", 200, lookup(0, false))
        .on("GET sys/internal/ui/mounts/secret/app", 200, kv2_mount())
        .on(
            "GET secret/data/app",
            200,
            kv2(serde_json::json!({ "key": VALUE })),
        );
    let mut c = (*conn(token_auth())).clone();
    c.namespace = Some("team-a".into());
    let c = Arc::new(c);
    let vault = Vault::new(fake.clone());
    let (v, valid_for) = value(&vault, &at(&c, "vault:secret/app")).await.unwrap();
    assert_eq!((v.as_str(), valid_for), (VALUE, None));
    assert_eq!(
        fake.calls(),
        [
            "GET auth/token/lookup-self",
            "GET sys/internal/ui/mounts/secret/app",
            "GET secret/data/app"
        ]
    );
    for s in fake.seen() {
        assert_eq!(s.header("x-vault-token"), Some(TOKEN), "{s:?}");
        assert_eq!(s.header("x-vault-namespace"), Some("team-a"), "{s:?}");
        assert_eq!(s.header("x-vault-request"), Some("true"), "{s:?}");
        assert!(
            s.route.cleartext,
            "http:// to 127.0.0.1 is cleartext: {s:?}"
        );
    }
    let rules: Vec<String> = fake.seen().iter().map(|s| s.rule.clone()).collect();
    assert_eq!(rules, ["latchkey:vault", "secret:app", "secret:app"]);
    // A second read: the mount is remembered, the token kept (TTL 0: never expires).
    value(&vault, &at(&c, "vault:secret/app")).await.unwrap();
    assert_eq!(fake.count("GET sys/internal/ui/mounts/secret/app"), 1);
    assert_eq!(fake.count("GET auth/token/lookup-self"), 1);
}

#[tokio::test]
async fn an_approle_login_sends_the_role_and_secret_ids_from_their_sources() {
    let fake = Arc::new(Fake::default());
    fake.on("POST auth/approle/login", 200, auth(TOKEN, 0, false))
        .on("GET sys/internal/ui/mounts/secret/app", 200, kv2_mount())
        .on(
            "GET secret/data/app",
            200,
            kv2(serde_json::json!({ "key": VALUE })),
        );
    let vault = Vault::new(fake.clone());
    value(&vault, &at(&conn(approle()), "vault:secret/app"))
        .await
        .unwrap();
    let login = &fake.seen()[0];
    let body: serde_json::Value = serde_json::from_str(&login.body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({ "role_id": "role-id-0123456789", "secret_id": "secret-id-0123456789" })
    );
    assert_eq!(login.header("x-vault-token"), None);
    assert_eq!(login.header("content-type"), Some("application/json"));
}

#[tokio::test]
async fn a_jwt_login_sends_the_role_and_the_token_file_read_afresh_at_each_login() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "eyJ.first-jwt.sig\n").unwrap();
    let jwt = conn(VaultAuth::Jwt {
        mount: "jwt".into(),
        role: "latchkey".into(),
        token_file: file.clone(),
    });
    let fake = Arc::new(Fake::default());
    fake.on("POST auth/jwt/login", 200, auth(TOKEN, 0, false))
        .on("POST auth/jwt/login", 200, auth(TOKEN2, 0, false))
        .on("GET sys/internal/ui/mounts/secret/app", 200, kv2_mount())
        .on(
            "GET secret/data/app",
            200,
            kv2(serde_json::json!({ "key": VALUE })),
        )
        .on("GET secret/data/app", 403, denied())
        .on(
            "GET secret/data/app",
            200,
            kv2(serde_json::json!({ "key": VALUE })),
        );
    let vault = Vault::new(fake.clone());
    value(&vault, &at(&jwt, "vault:secret/app")).await.unwrap();
    let login = &fake.seen()[0];
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&login.body).unwrap(),
        serde_json::json!({ "role": "latchkey", "jwt": "eyJ.first-jwt.sig" })
    );
    // The token is refused on the next read: the new login reads the rotated file.
    std::fs::write(&file, "eyJ.second-jwt.sig\n").unwrap();
    value(&vault, &at(&jwt, "vault:secret/app")).await.unwrap();
    let jwts: Vec<String> = fake
        .seen()
        .iter()
        .filter(|s| s.call == "POST auth/jwt/login")
        .map(|s| {
            serde_json::from_str::<serde_json::Value>(&s.body).unwrap()["jwt"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(jwts, ["eyJ.first-jwt.sig", "eyJ.second-jwt.sig"]);
}

#[tokio::test(start_paused = true)]
async fn a_renewable_token_is_renewed_once_two_thirds_of_its_ttl_have_passed() {
    let fake = Arc::new(Fake::default());
    fake.on("POST auth/approle/login", 200, auth(TOKEN, 30, true))
        .on("POST auth/token/renew-self", 200, auth(TOKEN, 30, true))
        .on("GET sys/internal/ui/mounts/secret/app", 200, kv2_mount())
        .on(
            "GET secret/data/app",
            200,
            kv2(serde_json::json!({ "key": VALUE })),
        );
    let vault = Vault::new(fake.clone());
    let loc = at(&conn(approle()), "vault:secret/app");
    value(&vault, &loc).await.unwrap();
    tokio::time::advance(Duration::from_secs(19)).await;
    value(&vault, &loc).await.unwrap();
    assert_eq!(
        fake.count("POST auth/token/renew-self"),
        0,
        "before 2/3 of the TTL"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    value(&vault, &loc).await.unwrap();
    assert_eq!(
        fake.count("POST auth/token/renew-self"),
        1,
        "past 2/3 of the TTL"
    );
    let renew = fake
        .seen()
        .into_iter()
        .find(|s| s.call == "POST auth/token/renew-self")
        .unwrap();
    assert_eq!(
        (renew.rule.as_str(), renew.header("x-vault-token")),
        ("latchkey:vault", Some(TOKEN))
    );
    // Renewed for 30s from now: nothing more for 19s.
    tokio::time::advance(Duration::from_secs(19)).await;
    value(&vault, &loc).await.unwrap();
    assert_eq!(fake.count("POST auth/token/renew-self"), 1);
    assert_eq!(fake.count("POST auth/approle/login"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_token_at_its_max_ttl_or_expired_is_replaced_by_a_fresh_login() {
    let fake = Arc::new(Fake::default());
    fake.on("POST auth/approle/login", 200, auth(TOKEN, 30, true))
        .on("POST auth/approle/login", 200, auth(TOKEN2, 30, false))
        // The renewal no longer extends it (max TTL reached): 9s left.
        .on("POST auth/token/renew-self", 200, auth(TOKEN, 9, true))
        .on("GET sys/internal/ui/mounts/secret/app", 200, kv2_mount())
        .on(
            "GET secret/data/app",
            200,
            kv2(serde_json::json!({ "key": VALUE })),
        );
    let vault = Vault::new(fake.clone());
    let loc = at(&conn(approle()), "vault:secret/app");
    value(&vault, &loc).await.unwrap();
    tokio::time::advance(Duration::from_secs(21)).await;
    value(&vault, &loc).await.unwrap();
    assert_eq!(fake.count("POST auth/token/renew-self"), 1);
    assert_eq!(
        fake.count("POST auth/approle/login"),
        2,
        "{:?}",
        fake.calls()
    );
    let last = fake.seen().pop().unwrap();
    assert_eq!(last.header("x-vault-token"), Some(TOKEN2));
    // TOKEN2 does not renew: past its TTL the next read logs in again (no renewal tried).
    fake.on("POST auth/approle/login", 200, auth(TOKEN, 30, false));
    tokio::time::advance(Duration::from_secs(31)).await;
    value(&vault, &loc).await.unwrap();
    assert_eq!(fake.count("POST auth/token/renew-self"), 1);
    assert_eq!(fake.count("POST auth/approle/login"), 3);
}

#[tokio::test]
async fn a_refused_token_logs_in_again_and_the_read_is_retried_once() {
    let fake = Arc::new(Fake::default());
    fake.on("POST auth/approle/login", 200, auth(TOKEN, 0, false))
        .on("POST auth/approle/login", 200, auth(TOKEN2, 0, false))
        .on("GET sys/internal/ui/mounts/secret/app", 200, kv2_mount())
        .on(
            "GET secret/data/app",
            403,
            serde_json::json!({ "errors": ["invalid token"] }),
        )
        .on(
            "GET secret/data/app",
            200,
            kv2(serde_json::json!({ "key": VALUE })),
        );
    let vault = Vault::new(fake.clone());
    let loc = at(&conn(approle()), "vault:secret/app");
    assert_eq!(value(&vault, &loc).await.unwrap().0, VALUE);
    let reads: Vec<Option<String>> = fake
        .seen()
        .iter()
        .filter(|s| s.call == "GET secret/data/app")
        .map(|s| s.header("x-vault-token").map(str::to_string))
        .collect();
    assert_eq!(reads, [Some(TOKEN.to_string()), Some(TOKEN2.to_string())]);

    // Denied again after the fresh login: one retry only, and the error says why.
    let fake = Arc::new(Fake::default());
    fake.on("POST auth/approle/login", 200, auth(TOKEN, 0, false))
        .on("POST auth/approle/login", 200, auth(TOKEN2, 0, false))
        .on("GET sys/internal/ui/mounts/secret/app", 200, kv2_mount())
        .on("GET secret/data/app", 403, denied());
    let vault = Vault::new(fake.clone());
    let e = value(&vault, &loc).await.unwrap_err();
    assert_eq!(fake.count("GET secret/data/app"), 2);
    assert_eq!(
        e,
        "vault http://127.0.0.1:8200: GET secret/data/app: answered 403: permission denied"
    );
    assert_no_secrets(&e);
}

#[tokio::test]
async fn token_auth_does_not_retry_with_the_same_token() {
    let fake = Arc::new(Fake::default());
    fake.on("GET auth/token/lookup-self", 200, lookup(0, false))
        .on("GET sys/internal/ui/mounts/secret/app", 200, kv2_mount())
        .on("GET secret/data/app", 403, denied());
    let vault = Vault::new(fake.clone());
    let e = value(&vault, &at(&conn(token_auth()), "vault:secret/app"))
        .await
        .unwrap_err();
    assert!(e.contains("403: permission denied"), "{e}");
    assert_eq!(fake.count("GET secret/data/app"), 1);
    assert_eq!(fake.count("GET auth/token/lookup-self"), 2);
    assert_no_secrets(&e);
}

#[tokio::test]
async fn kv1_and_dynamic_mounts_read_the_path_as_it_is_and_only_a_lease_limits_validity() {
    let fake = Arc::new(Fake::default());
    fake.on("GET auth/token/lookup-self", 200, lookup(0, false))
        .on(
            "GET sys/internal/ui/mounts/kv/app",
            200,
            serde_json::json!({ "data": { "path": "kv/", "type": "kv", "options": { "version": "1" } } }),
        )
        // KV v1's lease_duration is a refresh hint, not a lease.
        .on("GET kv/app", 200, serde_json::json!({ "data": { "key": VALUE }, "lease_id": "", "lease_duration": 2764800 }))
        .on(
            "GET sys/internal/ui/mounts/database/creds/app",
            200,
            serde_json::json!({ "data": { "path": "database/", "type": "database", "options": null } }),
        )
        .on(
            "GET database/creds/app",
            200,
            serde_json::json!({ "data": { "username": "v-app-user-1", "password": VALUE }, "lease_id": "database/creds/app/abc", "lease_duration": 30, "renewable": true }),
        );
    let c = conn(token_auth());
    let vault = Vault::new(fake.clone());
    assert_eq!(
        value(&vault, &at(&c, "vault:kv/app")).await.unwrap(),
        (VALUE.to_string(), None)
    );
    assert_eq!(
        value(&vault, &at(&c, "vault:database/creds/app#password"))
            .await
            .unwrap(),
        (VALUE.to_string(), Some(Duration::from_secs(30)))
    );
    let e = value(&vault, &at(&c, "vault:kv/app?version=2"))
        .await
        .unwrap_err();
    assert!(
        e.contains("?version= is for KV v2") && e.contains("\"kv\""),
        "{e}"
    );
}

#[tokio::test]
async fn a_denied_mounts_endpoint_falls_back_to_kv2_then_the_plain_path() {
    let fake = Arc::new(Fake::default());
    fake.on("GET auth/token/lookup-self", 200, lookup(0, false))
        .on("GET sys/internal/ui/mounts/secret/app", 403, denied())
        .on(
            "GET secret/data/app",
            200,
            kv2(serde_json::json!({ "key": VALUE })),
        )
        .on("GET sys/internal/ui/mounts/kv/app", 403, denied())
        .on("GET kv/data/app", 404, serde_json::json!({ "errors": [] }))
        .on(
            "GET kv/app",
            200,
            serde_json::json!({ "data": { "key": VALUE } }),
        );
    let c = conn(token_auth());
    let vault = Vault::new(fake.clone());
    for _ in 0..2 {
        assert_eq!(
            value(&vault, &at(&c, "vault:secret/app")).await.unwrap().0,
            VALUE
        );
        assert_eq!(
            value(&vault, &at(&c, "vault:kv/app")).await.unwrap().0,
            VALUE
        );
    }
    // What answered is remembered: one discovery and one probe each.
    assert_eq!(fake.count("GET sys/internal/ui/mounts/secret/app"), 1);
    assert_eq!(fake.count("GET sys/internal/ui/mounts/kv/app"), 1);
    assert_eq!(fake.count("GET kv/data/app"), 1);
    assert_eq!(fake.count("GET kv/app"), 2);
    assert_eq!(fake.count("GET secret/data/app"), 2);

    let fake = Arc::new(Fake::default());
    fake.on("GET auth/token/lookup-self", 200, lookup(0, false))
        .on("GET sys/internal/ui/mounts/x/app", 403, denied());
    let vault = Vault::new(fake.clone());
    let e = value(&vault, &at(&c, "vault:x/app")).await.unwrap_err();
    assert!(
        e.starts_with("as KV v2: vault http://127.0.0.1:8200: GET x/data/app: answered 404"),
        "{e}"
    );
    assert!(
        e.contains("as a plain path: vault http://127.0.0.1:8200: GET x/app: answered 404"),
        "{e}"
    );
}

#[tokio::test]
async fn field_errors_list_field_names_never_values() {
    let fake = Arc::new(Fake::default());
    fake.on("GET auth/token/lookup-self", 200, lookup(0, false))
        .on("GET sys/internal/ui/mounts/secret/app", 200, kv2_mount())
        .on(
            "GET secret/data/app",
            200,
            kv2(serde_json::json!({ "user": "admin-user-name", "pass": VALUE, "port": 5432, "tls": true, "nested": { "x": VALUE } })),
        );
    let c = conn(token_auth());
    let vault = Vault::new(fake.clone());
    let e = value(&vault, &at(&c, "vault:secret/app"))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        "vault http://127.0.0.1:8200: secret/app: the secret has 5 fields (fields: \"nested\", \"pass\", \"port\", \"tls\", \"user\"): name one with #FIELD"
    );
    let e = value(&vault, &at(&c, "vault:secret/app#missing"))
        .await
        .unwrap_err();
    assert!(
        e.ends_with(
            "no field \"missing\" (fields: \"nested\", \"pass\", \"port\", \"tls\", \"user\")"
        ),
        "{e}"
    );
    let e = value(&vault, &at(&c, "vault:secret/app#nested"))
        .await
        .unwrap_err();
    assert!(
        e.ends_with("field \"nested\" is an object, not a string, number or boolean"),
        "{e}"
    );
    assert!(!e.contains(VALUE) && !e.contains("admin-user-name"), "{e}");
    assert_eq!(
        value(&vault, &at(&c, "vault:secret/app#port"))
            .await
            .unwrap()
            .0,
        "5432"
    );
    assert_eq!(
        value(&vault, &at(&c, "vault:secret/app#tls"))
            .await
            .unwrap()
            .0,
        "true"
    );
    assert_eq!(
        value(&vault, &at(&c, "vault:secret/app#pass"))
            .await
            .unwrap()
            .0,
        VALUE
    );
}

#[tokio::test(start_paused = true)]
async fn two_fields_of_one_dynamic_secret_come_from_the_same_lease() {
    let fake = Arc::new(Fake::default());
    let creds = |n: u32| serde_json::json!({ "data": { "username": format!("v-user-{n}"), "password": format!("pw-lease-{n}-0123") }, "lease_id": format!("database/creds/app/{n}"), "lease_duration": 30, "renewable": true });
    fake.on("GET auth/token/lookup-self", 200, lookup(0, false))
        .on(
            "GET sys/internal/ui/mounts/database/creds/app",
            200,
            serde_json::json!({ "data": { "path": "database/", "type": "database" } }),
        )
        .on("GET database/creds/app", 200, creds(1))
        .on("GET database/creds/app", 200, creds(2));
    let c = conn(token_auth());
    let vault = Arc::new(Vault::new(fake.clone()));
    let (user, pass) = (
        at(&c, "vault:database/creds/app#username"),
        at(&c, "vault:database/creds/app#password"),
    );
    // Fetched at once (as start-up fetches every secret): one read, one lease.
    let (u, p) = tokio::join!(value(&vault, &user), value(&vault, &pass));
    assert_eq!(
        u.unwrap(),
        ("v-user-1".to_string(), Some(Duration::from_secs(30)))
    );
    assert_eq!(
        p.unwrap(),
        ("pw-lease-1-0123".to_string(), Some(Duration::from_secs(30)))
    );
    assert_eq!(fake.count("GET database/creds/app"), 1);
    // Later, within the first two thirds: the same lease, valid for what is left of it.
    tokio::time::advance(Duration::from_secs(15)).await;
    assert_eq!(
        value(&vault, &pass).await.unwrap(),
        ("pw-lease-1-0123".to_string(), Some(Duration::from_secs(15)))
    );
    // In its last third: a new read, and both fields come from it.
    tokio::time::advance(Duration::from_secs(6)).await;
    assert_eq!(value(&vault, &user).await.unwrap().0, "v-user-2");
    assert_eq!(value(&vault, &pass).await.unwrap().0, "pw-lease-2-0123");
    assert_eq!(fake.count("GET database/creds/app"), 2);
}

#[tokio::test]
async fn cleartext_is_only_for_loopback_and_a_missing_connection_is_named() {
    let fake = Arc::new(Fake::default());
    let vault = Vault::new(fake.clone());
    let mut c = (*conn(token_auth())).clone();
    c.address = "http://vault.internal:8200".into();
    let e = value(&vault, &at(&Arc::new(c.clone()), "vault:secret/app"))
        .await
        .unwrap_err();
    assert!(e.contains("plain http:// is only for a loopback IP"), "{e}");
    assert!(fake.calls().is_empty(), "refused unsent");
    c.address = "https://vault.internal:8200/".into();
    fake.on("GET auth/token/lookup-self", 200, lookup(0, false));
    let _ = value(&vault, &at(&Arc::new(c), "vault:secret/app")).await;
    let s = &fake.seen()[0];
    assert!(!s.route.cleartext);
    assert!(s.call == "GET auth/token/lookup-self", "{s:?}");

    let Location::Vault {
        path,
        field,
        version,
        ..
    } = at(&conn(token_auth()), "vault:secret/app")
    else {
        unreachable!()
    };
    let loc = Location::Vault {
        connection: "ops".into(),
        settings: None,
        path,
        field,
        version,
    };
    let e = value(&vault, &loc).await.unwrap_err();
    assert_eq!(e, "no [vault.ops] connection is configured for this secret");
}

#[tokio::test]
async fn an_unreachable_server_or_a_failed_login_is_named_without_secrets() {
    let fake = Arc::new(Fake::default());
    *fake.down.lock().unwrap() = true;
    let vault = Vault::new(fake.clone());
    let e = value(&vault, &at(&conn(approle()), "vault:secret/app"))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        "vault http://127.0.0.1:8200: POST auth/approle/login: connection refused"
    );
    *fake.down.lock().unwrap() = false;
    fake.on(
        "POST auth/approle/login",
        400,
        serde_json::json!({ "errors": ["invalid role or secret ID"] }),
    );
    let e = value(&vault, &at(&conn(approle()), "vault:secret/app"))
        .await
        .unwrap_err();
    assert!(
        e.ends_with("POST auth/approle/login: answered 400: invalid role or secret ID"),
        "{e}"
    );
    assert_no_secrets(&e);
    let long = "x".repeat(5000);
    fake.on(
        "POST auth/approle/login",
        500,
        serde_json::json!({ "errors": [long] }),
    );
    fake.on(
        "POST auth/approle/login",
        500,
        serde_json::json!({ "errors": [long] }),
    );
    let e = value(&vault, &at(&conn(approle()), "vault:secret/app"))
        .await
        .unwrap_err();
    assert!(e.len() < 400, "capped: {}", e.len());
}

fn assert_no_secrets(text: &str) {
    for secret in [
        TOKEN,
        TOKEN2,
        VALUE,
        "secret-id-0123456789",
        "role-id-0123456789",
    ] {
        assert!(!text.contains(secret), "{text}");
    }
}

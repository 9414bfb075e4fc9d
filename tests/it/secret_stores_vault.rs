//! `vault:` secrets against a real OpenBao dev server (TLS on loopback, its own CA), read by
//! `stores::Stores` over latchkey's guarded client: token, AppRole and JWT logins; KV v2 latest
//! and pinned versions; a field error; a dynamic database secret (a Redis user, whose lease
//! expires mid-test) through the secret store, whose old value stays redacted; an expiring
//! AppRole token replaced by a fresh login; a wrong CA; a server that went away.
//!
//! Drives the crate API directly (`Fetch::fetch`, `SecretStore::get`): the `[vault]` policy
//! tables and `serve`'s wiring are tested where they are built.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use latchkey::secrets::{Fetch, Location, Remote, SecretStore, Source, VaultAuth, VaultConnection};
use latchkey::signing::exchange::{Answer, BoxFuture, Exchange, TokenTransport, TransportError};
use latchkey_stores::Stores;
use serde_json::json;

use crate::support::openbao::{self, OpenBao, ROOT_TOKEN};
use crate::support::redis::RedisServer;
use crate::support::toolchain;

const V1: &str = "kv-secret-version-one";
const V2: &str = "kv-secret-version-two";

/// Counts latchkey's calls by `METHOD path` while passing them on.
struct Counting {
    inner: Arc<dyn TokenTransport>,
    calls: Mutex<Vec<String>>,
}

impl Counting {
    fn new(inner: Arc<dyn TokenTransport>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            calls: Mutex::new(Vec::new()),
        })
    }

    fn count(&self, call: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| *c == call)
            .count()
    }
}

impl TokenTransport for Counting {
    fn call(&self, ex: Exchange) -> BoxFuture<'_, Result<Answer, TransportError>> {
        let path = ex.url.split_once("/v1/").map_or("", |(_, p)| p);
        self.calls
            .lock()
            .unwrap()
            .push(format!("{} {path}", ex.method));
        self.inner.call(ex)
    }
}

/// No AWS identity: these tests read Vault only.
fn no_aws() -> Arc<latchkey::signing::AwsIdentity> {
    Arc::new(latchkey::signing::AwsIdentity::new(
        std::iter::empty::<(String, String)>(),
        None,
        None,
    ))
}

fn conn(bao: &OpenBao, auth: VaultAuth) -> Arc<VaultConnection> {
    Arc::new(VaultConnection {
        name: String::new(),
        address: bao.address(),
        ca: Some(bao.ca()),
        namespace: None,
        auth,
        allow_private: vec![openbao::loopback()],
    })
}

fn at(
    conn: &Arc<VaultConnection>,
    path: &str,
    field: Option<&str>,
    version: Option<u64>,
) -> Location {
    Location::Vault {
        connection: String::new(),
        settings: Some(conn.clone()),
        path: path.into(),
        field: field.map(str::to_string),
        version,
    }
}

async fn read(stores: &Stores, at: &Location) -> Result<String, String> {
    let f = stores.fetch("app", at).await?;
    Ok(String::from_utf8(f.value.expose().to_vec()).unwrap())
}

/// A policy reading everything the tests put in.
async fn policy(bao: &OpenBao) {
    let rules = r#"
        path "secret/*" { capabilities = ["read"] }
        path "database/creds/*" { capabilities = ["read"] }
    "#;
    bao.ok("PUT", "sys/policies/acl/reader", json!({ "policy": rules }))
        .await;
}

/// KV v2 `secret/app` with two versions (`password` V1, then V2) and a `user` field.
async fn kv2(bao: &OpenBao) {
    for v in [V1, V2] {
        bao.ok(
            "POST",
            "secret/data/app",
            json!({ "data": { "password": v, "user": "app-user-name" } }),
        )
        .await;
    }
}

/// An AppRole `name` whose tokens live `ttl` (not renewable past it); its role and secret id
/// in files.
async fn approle(bao: &OpenBao, name: &str, ttl: &str) -> VaultAuth {
    let _ = bao
        .api(
            "POST",
            "sys/auth/approle",
            Some(json!({ "type": "approle" })),
        )
        .await;
    bao.ok(
        "POST",
        &format!("auth/approle/role/{name}"),
        json!({ "token_policies": ["reader"], "token_ttl": ttl, "token_max_ttl": ttl }),
    )
    .await;
    let role = bao
        .ok(
            "GET",
            &format!("auth/approle/role/{name}/role-id"),
            json!({}),
        )
        .await;
    let secret = bao
        .ok(
            "POST",
            &format!("auth/approle/role/{name}/secret-id"),
            json!({}),
        )
        .await;
    let role_id = bao.file(
        &format!("{name}-role-id"),
        role["data"]["role_id"].as_str().unwrap(),
    );
    let secret_id = bao.file(
        &format!("{name}-secret-id"),
        secret["data"]["secret_id"].as_str().unwrap(),
    );
    VaultAuth::AppRole {
        mount: "approle".into(),
        role_id: Box::new(Source::File(role_id)),
        secret_id: Box::new(Source::File(secret_id)),
    }
}

/// A JWT auth method trusting a fresh EC key, and a token it signed (PyJWT in the tests'
/// Python environment) in a file.
async fn jwt(bao: &OpenBao) -> VaultAuth {
    let script = r#"
import json, time, jwt
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives import serialization
k = ec.generate_private_key(ec.SECP256R1())
pub = k.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
now = int(time.time())
claims = {"iss": "latchkey-test", "sub": "latchkey", "aud": "latchkey", "iat": now, "exp": now + 3600}
print(json.dumps({"pub": pub, "jwt": jwt.encode(claims, k, algorithm="ES256")}))
"#;
    let out = std::process::Command::new(toolchain::python())
        .args(["-c", script])
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let made: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    bao.ok("POST", "sys/auth/jwt", json!({ "type": "jwt" }))
        .await;
    bao.ok(
        "POST",
        "auth/jwt/config",
        json!({ "jwt_validation_pubkeys": [made["pub"]], "bound_issuer": "latchkey-test" }),
    )
    .await;
    bao.ok(
        "POST",
        "auth/jwt/role/latchkey",
        json!({ "role_type": "jwt", "bound_audiences": ["latchkey"], "user_claim": "sub", "token_policies": ["reader"], "token_ttl": "1h" }),
    )
    .await;
    VaultAuth::Jwt {
        mount: "jwt".into(),
        role: "latchkey".into(),
        token_file: bao.file("jwt", made["jwt"].as_str().unwrap()),
    }
}

fn assert_clean(text: &str, secrets: &[&str]) {
    for s in secrets.iter().chain([&ROOT_TOKEN, &V1, &V2]) {
        assert!(!text.contains(s), "{text}");
    }
}

#[tokio::test]
async fn token_approle_and_jwt_logins_read_kv2_latest_and_pinned_versions() {
    let bao = OpenBao::start().await;
    policy(&bao).await;
    kv2(&bao).await;
    std::env::set_var("LATCHKEY_IT_VAULT_ROOT", ROOT_TOKEN);
    let token = VaultAuth::Token {
        token: Box::new(Source::Env("LATCHKEY_IT_VAULT_ROOT".into())),
    };
    let logins = [token, approle(&bao, "steady", "1h").await, jwt(&bao).await];
    let stores = Stores::new(Arc::new(bao.client()), no_aws());
    for auth in logins {
        let c = conn(&bao, auth);
        assert_eq!(
            read(&stores, &at(&c, "secret/app", Some("password"), None))
                .await
                .unwrap(),
            V2
        );
        assert_eq!(
            read(&stores, &at(&c, "secret/app", Some("password"), Some(1)))
                .await
                .unwrap(),
            V1
        );
        let e = read(&stores, &at(&c, "secret/app", None, None))
            .await
            .unwrap_err();
        assert_eq!(
            e,
            format!("vault {}: secret/app: the secret has 2 fields (fields: \"password\", \"user\"): name one with #FIELD", bao.address())
        );
        let e = read(&stores, &at(&c, "secret/missing", Some("x"), None))
            .await
            .unwrap_err();
        assert!(e.contains("GET secret/data/missing: answered 404"), "{e}");
        assert_clean(&e, &["app-user-name"]);
    }
}

#[tokio::test]
async fn a_dynamic_secret_is_renewed_before_its_lease_ends_and_the_old_value_stays_redacted() {
    let bao = OpenBao::start().await;
    policy(&bao).await;
    let redis = RedisServer::start();
    assert_eq!(
        redis.command(&["CONFIG", "SET", "requirepass", "redis-admin-pw-123"]),
        "+OK"
    );
    bao.ok("POST", "sys/mounts/database", json!({ "type": "database" }))
        .await;
    bao.ok(
        "POST",
        "database/config/redis",
        json!({ "plugin_name": "redis-database-plugin", "host": "127.0.0.1", "port": redis.port(),
                "username": "default", "password": "redis-admin-pw-123", "allowed_roles": "*" }),
    )
    .await;
    bao.ok(
        "POST",
        "database/roles/short",
        json!({ "db_name": "redis", "creation_statements": "[\"+@read\"]", "default_ttl": "3s", "max_ttl": "10s" }),
    )
    .await;
    let c = conn(&bao, approle(&bao, "steady", "1h").await);
    let remote = |field: &str| {
        Source::Remote(Box::new(Remote {
            at: at(&c, "database/creds/short", Some(field), None),
            refresh: Duration::from_secs(300),
            stale_for: Duration::ZERO,
        }))
    };
    let store = SecretStore::load(vec![
        ("db_user".into(), remote("username")),
        ("db_pass".into(), remote("password")),
    ])
    .unwrap();
    let counting = Counting::new(Arc::new(bao.client()));
    assert!(store.set_fetcher(Arc::new(Stores::new(counting.clone(), no_aws()))));
    assert!(store.fetch_remote().await.is_empty());
    let text = |v: latchkey::secrets::SecretValue| String::from_utf8(v.expose().to_vec()).unwrap();
    let (user1, pass1) = (
        text(store.get("db_user").await.unwrap()),
        text(store.get("db_pass").await.unwrap()),
    );
    // Both fields from one read, one lease: the pair logs in to Redis.
    assert_eq!(counting.count("GET database/creds/short"), 1);
    assert_eq!(redis.command(&["AUTH", &user1, &pass1]), "+OK");

    // The 3s lease: a new pair comes before it ends, and the old one is refused by then.
    let started = Instant::now();
    let (user2, pass2) = loop {
        let (u, p) = (
            text(store.get("db_user").await.unwrap()),
            text(store.get("db_pass").await.unwrap()),
        );
        if u != user1 && p != pass1 {
            break (u, p);
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no new lease after 15s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "renewed in {:?}",
        started.elapsed()
    );
    assert_eq!(
        redis.command(&["AUTH", &user2, &pass2]),
        "+OK",
        "one lease for both fields"
    );
    let scrubber = store.scrubber().unwrap().unwrap();
    let (out, names) = scrubber.scrub(format!("old {pass1} new {pass2}").as_bytes());
    let out = String::from_utf8_lossy(&out);
    assert!(!out.contains(&pass1) && !out.contains(&pass2), "{out}");
    assert_eq!(names.len(), 2, "{names:?}");
}

#[tokio::test]
async fn an_expiring_approle_token_is_replaced_by_a_fresh_login() {
    let bao = OpenBao::start().await;
    policy(&bao).await;
    kv2(&bao).await;
    let c = conn(&bao, approle(&bao, "short", "2s").await);
    let counting = Counting::new(Arc::new(bao.client()));
    let stores = Stores::new(counting.clone(), no_aws());
    let loc = at(&c, "secret/app", Some("password"), None);
    assert_eq!(read(&stores, &loc).await.unwrap(), V2);
    assert_eq!(counting.count("POST auth/approle/login"), 1);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(read(&stores, &loc).await.unwrap(), V2);
    assert_eq!(counting.count("POST auth/approle/login"), 2);
}

#[tokio::test]
async fn a_wrong_ca_is_a_tls_error_and_a_server_that_went_away_is_named_by_its_address() {
    let mut bao = OpenBao::start().await;
    policy(&bao).await;
    kv2(&bao).await;
    let stores = Stores::new(Arc::new(bao.client()), no_aws());
    std::env::set_var("LATCHKEY_IT_VAULT_ROOT_2", ROOT_TOKEN);
    let auth = VaultAuth::Token {
        token: Box::new(Source::Env("LATCHKEY_IT_VAULT_ROOT_2".into())),
    };
    let mut wrong = (*conn(&bao, auth.clone())).clone();
    wrong.ca = None;
    let e = read(
        &stores,
        &at(&Arc::new(wrong), "secret/app", Some("password"), None),
    )
    .await
    .unwrap_err();
    assert!(
        e.starts_with(&format!(
            "vault {}: GET auth/token/lookup-self: ",
            bao.address()
        )),
        "{e}"
    );
    assert!(e.to_lowercase().contains("certificate"), "a TLS error: {e}");
    assert_clean(&e, &[]);

    let c = conn(&bao, auth);
    assert_eq!(
        read(&stores, &at(&c, "secret/app", Some("password"), None))
            .await
            .unwrap(),
        V2
    );
    bao.kill();
    let e = read(&stores, &at(&c, "secret/app", Some("password"), Some(1)))
        .await
        .unwrap_err();
    assert!(
        e.starts_with(&format!(
            "vault {}: GET secret/data/app?version=1: ",
            bao.address()
        )),
        "{e}"
    );
    assert_clean(&e, &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewable_token_is_renewed_in_the_background_between_reads() {
    let bao = OpenBao::start().await;
    policy(&bao).await;
    kv2(&bao).await;
    // A renewable token that lives 3 s per renewal (up to a minute): token auth cannot log in
    // again with an expired one, so only a renewal between reads keeps it alive.
    let made = bao
        .ok(
            "POST",
            "auth/token/create",
            json!({ "policies": ["reader"], "ttl": "3s", "explicit_max_ttl": "60s", "renewable": true }),
        )
        .await;
    let child = made["auth"]["client_token"].as_str().unwrap().to_string();
    let file = bao.file("child-token", &child);
    let auth = VaultAuth::Token {
        token: Box::new(Source::File(file)),
    };
    let stores = Stores::new(Arc::new(bao.client()), no_aws());
    let c = conn(&bao, auth);
    let kv = at(&c, "secret/app", Some("password"), None);
    assert_eq!(read(&stores, &kv).await.unwrap(), V2);
    // Past the token's first TTL, and its second: nothing read meanwhile.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(
        read(&stores, &kv)
            .await
            .expect("the token was renewed in the background"),
        V2
    );
    let (status, looked) = bao
        .api("POST", "auth/token/lookup", Some(json!({ "token": child })))
        .await;
    assert_eq!(status, 200, "{looked}");
    // Renewed, by the keeper (nothing else renews it): its last renewal is after its creation.
    // (Its remaining `ttl` is whole seconds, 0 in the last second before the next renewal.)
    let created = looked["data"]["creation_time"].as_u64().unwrap_or(u64::MAX);
    assert!(
        looked["data"]["last_renewal_time"]
            .as_u64()
            .is_some_and(|renewed| renewed > created),
        "{looked}"
    );
}

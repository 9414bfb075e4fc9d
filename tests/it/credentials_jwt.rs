//! Generic JWTs (`kind = "jwt"`): latchkey signs a token from a claims template and injects it.
//! The upstream is `tests/clients/fake_issuers.py`, which verifies each JWT with PyJWT (HS256
//! with the shared key; ES256, RS256 and EdDSA with the public key) and checks aud = the host it was sent to and
//! a numeric iat near now; the test checks `sub` = the identity, per-identity caching with a
//! `ttl`, a named header carrying the bare token, and that a JWT signed with another key fails
//! verification.

use serde_json::{json, Value};

use crate::support::assert_record;
use crate::support::credentials::{lists_secret, Bench, CredWorld, PyServer};

const HS_KEY: &str = "jwt-hmac-LATCHKEY-test-key-0123456789abcdef0123";
const OTHER_HS_KEY: &str = "jwt-hmac-NOT-the-verifiers-key-9876543210fedcba";
const TOKEN_ALICE: &str = "tok-alice-LATCHKEY-5e1d9c3b7a20";
const TOKEN_BOB: &str = "tok-bob-LATCHKEY-8f2a6c4e0d13";

const POLICY: &str = r#"
[credentials.jwt_hs]
kind = "jwt"
alg = "HS256"
key = "env:TEST_JWT_KEY"
ttl = "5m"
[credentials.jwt_hs.claims]
iss = "latchkey"
sub = "{{identity}}"
aud = "{{host}}"
iat = "{{now}}"

[credentials.jwt_es]
kind = "jwt"
alg = "ES256"
key = "file:ES_KEY"
header = "x-service-token"
[credentials.jwt_es.claims]
iss = "latchkey"
sub = "{{identity}}"
aud = "{{host}}"
iat = "{{now}}"
scope = "reports:read"

[[rules]]
name = "jwt-hs"
hosts = ["jwt.test"]
ports = [PORT]
credential = "jwt_hs"

[[rules]]
name = "jwt-es"
hosts = ["jwt-es.test"]
ports = [PORT]
credential = "jwt_es"

[identities.alice]
token = "env:LK_TOKEN_ALICE"
rules = ["jwt-hs", "jwt-es"]

[identities.bob]
token = "env:LK_TOKEN_BOB"
rules = ["jwt-hs", "jwt-es"]
"#;

struct Jwt {
    w: CredWorld,
    verifier: PyServer,
}

fn jwt_world() -> Jwt {
    let mut bench = Bench::new();
    let es = bench.ec_key("jwt-es");
    let verifier = bench.server(
        "fake_issuers.py",
        &[
            ("FAKE_JWT_HS_KEY", HS_KEY),
            ("FAKE_JWT_ES_PUBLIC_KEY", es.public.to_str().expect("UTF-8")),
        ],
    );
    let policy = POLICY
        .replace("PORT", &verifier.port().to_string())
        .replace("ES_KEY", es.private.to_str().expect("UTF-8"));
    let w = bench.start(
        &policy,
        &[
            ("TEST_JWT_KEY", HS_KEY),
            ("LK_TOKEN_ALICE", TOKEN_ALICE),
            ("LK_TOKEN_BOB", TOKEN_BOB),
        ],
    );
    Jwt { w, verifier }
}

impl Jwt {
    /// GET `path` on `host` as `who` (`alice` or `bob`), sending auth of the sandbox's own.
    fn get_as(&self, who: &str, host: &str, path: &str, extra: &[&str]) -> Value {
        let token = if who == "alice" {
            TOKEN_ALICE
        } else {
            TOKEN_BOB
        };
        let user = format!("{who}:{token}");
        let url = format!("https://{host}:{}{path}", self.verifier.port());
        let mut args = vec![
            "--proxy-user",
            &user,
            "-H",
            "Authorization: Bearer sandbox-own-token",
        ];
        args.extend_from_slice(extra);
        args.push(&url);
        let resp = self.w.curl_ok(&args);
        assert_eq!(
            resp.status,
            200,
            "the verifier rejected the JWT for {who}: {resp:#?}\n{:#?}",
            self.verifier.events()
        );
        serde_json::from_slice(&resp.body).expect("verifier JSON")
    }
}

fn int(v: &Value) -> i64 {
    v.as_i64()
        .unwrap_or_else(|| panic!("{v} is not an integer"))
}

#[test]
fn an_hs256_jwt_carries_the_identity_and_host_and_is_cached_per_identity() {
    let j = jwt_world();
    for who in ["alice", "bob", "alice"] {
        j.get_as(who, "jwt.test", "/jwt/hs256", &[]);
    }

    let events = j.verifier.wait_events("jwt", 3);
    for (event, who) in events.iter().zip(["alice", "bob", "alice"]) {
        assert_eq!(event["ok"], true, "{event:#}");
        assert_eq!(event["jwt_header"]["alg"], "HS256", "{event:#}");
        let claims = &event["claims"];
        assert_eq!(claims["sub"], who, "sub = {{{{identity}}}}: {event:#}");
        assert_eq!(claims["aud"], "jwt.test", "aud = {{{{host}}}}: {event:#}");
        assert_eq!(claims["iss"], "latchkey", "{event:#}");
        assert_eq!(
            int(&claims["exp"]) - int(&claims["iat"]),
            300,
            "ttl = 5m: exp = iat + 300: {event:#}"
        );
    }
    assert_eq!(
        events[0]["presented"], events[2]["presented"],
        "within its ttl, alice's token is reused"
    );
    assert_ne!(
        events[0]["presented"], events[1]["presented"],
        "the cache must be keyed by identity when the claims use it"
    );

    let records = j.w.lk.wait_audit(3);
    for (record, who) in records.iter().zip(["alice", "bob", "alice"]) {
        assert_record(
            record,
            json!({"identity": who, "rule": "jwt-hs", "status": 200, "reason": "allowed"}),
        );
        assert!(lists_secret(record, "credential:jwt_hs"), "{record:#}");
    }
    j.w.track_events(&j.verifier);
    j.w.sweep();
}

#[test]
fn an_es256_jwt_goes_bare_in_its_named_header_and_replaces_the_sandboxs() {
    let j = jwt_world();
    let answer = j.get_as(
        "alice",
        "jwt-es.test",
        "/jwt/es256/bare/x-service-token",
        &["-H", "X-Service-Token: sandbox-forged-token"],
    );
    assert_eq!(answer["valid"], true, "{answer:#}");

    let event = &j.verifier.wait_events("jwt", 1)[0];
    assert_eq!(event["jwt_header"]["alg"], "ES256", "{event:#}");
    let claims = &event["claims"];
    assert_eq!(claims["sub"], "alice", "{event:#}");
    assert_eq!(claims["aud"], "jwt-es.test", "{event:#}");
    assert_eq!(claims["scope"], "reports:read", "{event:#}");
    assert!(claims["iat"].is_i64(), "iat must be a number: {event:#}");
    assert_eq!(
        event["authorization"],
        Value::Null,
        "the sandbox's authorization must be stripped on a credentialed rule: {event:#}"
    );

    let records = j.w.lk.wait_audit(1);
    assert!(
        lists_secret(&records[0], "credential:jwt_es"),
        "{:#}",
        records[0]
    );
    j.w.track_events(&j.verifier);
    j.w.sweep();
}

/// The verifier is only worth something if it rejects: a JWT signed with another HMAC key
/// reaches it (latchkey cannot know) and is refused there. Without identities, `sub` is
/// `default`.
#[test]
fn a_jwt_signed_with_another_key_fails_verification_upstream() {
    let bench = Bench::new();
    let verifier = bench.server("fake_issuers.py", &[("FAKE_JWT_HS_KEY", HS_KEY)]);
    let port = verifier.port();
    let policy = format!(
        r#"
[credentials.jwt_other]
kind = "jwt"
alg = "HS256"
key = "env:TEST_OTHER_JWT_KEY"
[credentials.jwt_other.claims]
sub = "{{{{identity}}}}"
aud = "{{{{host}}}}"
iat = "{{{{now}}}}"

[[rules]]
name = "jwt-other"
hosts = ["jwt.test"]
ports = [{port}]
credential = "jwt_other"
"#
    );
    let w = bench.start(&policy, &[("TEST_OTHER_JWT_KEY", OTHER_HS_KEY)]);
    let resp = w.curl_ok(&[&format!("https://jwt.test:{port}/jwt/hs256")]);
    assert_eq!(resp.status, 401, "{resp:#?}");
    let event = &verifier.wait_events("jwt", 1)[0];
    assert_eq!(event["ok"], false, "{event:#}");
    assert!(
        event["error"]
            .as_str()
            .is_some_and(|e| e.contains("Signature")),
        "{event:#}"
    );
    assert_eq!(event["claims"]["sub"], "default", "{event:#}");
    w.lk.wait_audit(1);
    w.track_events(&verifier);
    w.sweep();
}

/// RS256 (PKCS#1 and PKCS#8 RSA keys) and EdDSA (Ed25519): each token verifies upstream with
/// PyJWT against the public key, and carries the claims the template asked for.
#[test]
fn rs256_and_eddsa_jwts_verify_upstream_with_their_public_keys() {
    let mut bench = Bench::new();
    let rsa1 = bench.rsa_key("jwt-rs-pkcs1", true);
    let rsa8 = bench.rsa_key("jwt-rs-pkcs8", false);
    let ed = bench.ed_key("jwt-ed");
    // One verifier per RSA key; the same route checks RS256 against the key it was given.
    let v1 = bench.server(
        "fake_issuers.py",
        &[
            (
                "FAKE_JWT_RS_PUBLIC_KEY",
                rsa1.public.to_str().expect("UTF-8"),
            ),
            ("FAKE_JWT_ED_PUBLIC_KEY", ed.public.to_str().expect("UTF-8")),
        ],
    );
    let v8 = bench.server(
        "fake_issuers.py",
        &[(
            "FAKE_JWT_RS_PUBLIC_KEY",
            rsa8.public.to_str().expect("UTF-8"),
        )],
    );
    let credential = |name: &str, alg: &str, key: &std::path::Path| {
        format!(
            "[credentials.{name}]\nkind = \"jwt\"\nalg = \"{alg}\"\nkey = \"file:{}\"\n[credentials.{name}.claims]\nsub = \"{{{{identity}}}}\"\naud = \"{{{{host}}}}\"\niat = \"{{{{now}}}}\"\nalg_seen = \"{alg}\"\n",
            key.display()
        )
    };
    let rule = |name: &str, host: &str, port: u16, cred: &str| {
        format!("[[rules]]\nname = \"{name}\"\nhosts = [\"{host}\"]\nports = [{port}]\ncredential = \"{cred}\"\n")
    };
    let policy = [
        credential("jwt_rs1", "RS256", &rsa1.private),
        credential("jwt_rs8", "RS256", &rsa8.private),
        credential("jwt_ed", "EdDSA", &ed.private),
        rule("rs1", "jwt.test", v1.port(), "jwt_rs1"),
        rule("ed", "jwt-es.test", v1.port(), "jwt_ed"),
        rule("rs8", "jwt.test", v8.port(), "jwt_rs8"),
    ]
    .join("\n");
    let w = bench.start(&policy, &[]);

    let cases = [
        ("jwt.test", v1.port(), "/jwt/rs256", "RS256", &v1),
        ("jwt-es.test", v1.port(), "/jwt/eddsa", "EdDSA", &v1),
        ("jwt.test", v8.port(), "/jwt/rs256", "RS256", &v8),
    ];
    for (i, (host, port, path, alg, verifier)) in cases.iter().enumerate() {
        let resp = w.curl_ok(&[&format!("https://{host}:{port}{path}")]);
        assert_eq!(
            resp.status,
            200,
            "{alg} JWT rejected upstream: {resp:#?}\n{:#?}",
            verifier.events()
        );
        let answer: Value = serde_json::from_slice(&resp.body).expect("verifier JSON");
        assert_eq!(answer["valid"], true, "{answer:#}");
        assert_eq!(answer["claims"]["alg_seen"], *alg, "{answer:#}");
        assert_eq!(answer["claims"]["aud"], *host, "{answer:#}");
        assert_eq!(answer["claims"]["sub"], "default", "{answer:#}");
        let records = w.lk.wait_audit(i + 1);
        assert_record(&records[i], json!({"decision": "allow", "status": 200}));
    }
    let events = v1.wait_events("jwt", 2);
    assert!(
        events.iter().any(|e| e["jwt_header"]["alg"] == "EdDSA"),
        "{events:#?}"
    );
    assert!(
        events.iter().any(|e| e["jwt_header"]["alg"] == "RS256"),
        "{events:#?}"
    );
    w.track_events(&v1);
    w.track_events(&v8);
    w.sweep();
}

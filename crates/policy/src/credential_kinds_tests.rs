//! The OAuth2 grants, `google_id_token`, `hmac` and `client_cert` credential kinds: what compiles,
//! and errors that name the field.

use super::compile::compile_one;
use crate::signing::{ClientAuth, Grant, Kind};

fn errors(text: &str) -> Vec<String> {
    match compile_one(text) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

fn kind(text: &str, name: &str) -> Kind {
    let policy = compile_one(text).unwrap_or_else(|e| panic!("{e:?}"));
    policy.credential(name).expect("declared").kind.clone()
}

#[test]
fn oauth2_grants_compile_and_the_old_kind_is_an_alias_for_client_credentials() {
    let text = r#"
[secrets.api_key]
source = "exec:echo k"

[credentials.rt]
kind = "oauth2"
grant = "refresh_token"
token_url = "https://auth.example/token"
client_id = "app"
client_secret = "exec:echo s"
client_auth = "client_secret_basic"
refresh_token = "exec:echo r"
token_endpoint_headers = { "x-api-key" = "{{secret.api_key}}" }

[credentials.pw]
kind = "oauth2"
grant = "password"
token_url = "https://auth.example/token"
username = "exec:echo u"
password = "exec:echo p"

[credentials.jb]
kind = "oauth2"
grant = "jwt_bearer"
token_url = "https://auth.example/token"
alg = "HS256"
key = "exec:echo k"
claims = { iss = "me", sub = "{{identity}}", aud = "https://auth.example/token" }

[credentials.cc]
kind = "oauth2_client_credentials"
token_url = "https://auth.example/token"
client_id = "app"
client_secret = "exec:echo s"
"#;
    let Kind::OAuth2(rt) = kind(text, "rt") else {
        panic!("oauth2")
    };
    assert_eq!(rt.grant, Grant::RefreshToken);
    assert_eq!(rt.client_auth, ClientAuth::Basic);
    assert_eq!(rt.headers.len(), 1);
    assert_eq!(kind(text, "rt").label(), "oauth2");
    let Kind::OAuth2(jb) = kind(text, "jb") else {
        panic!("oauth2")
    };
    assert!(matches!(&jb.grant, Grant::JwtBearer { claims, ttl, .. }
        if claims.len() == 3 && ttl.as_secs() == 300));
    let cc = kind(text, "cc");
    assert_eq!(cc.label(), "oauth2_client_credentials");
    assert!(matches!(cc, Kind::OAuth2(o) if o.grant == Grant::ClientCredentials));
    assert!(matches!(kind(text, "pw"), Kind::OAuth2(o) if o.grant == Grant::Password));
}

#[test]
fn oauth2_errors_name_the_field_and_the_grant() {
    let e = errors(
        "[credentials.c]\nkind = \"oauth2\"\ngrant = \"password\"\ntoken_url = \"http://x.example/t\"\nusername = \"exec:echo u\"\nrefresh_token = \"exec:echo r\"\nclient_auth = \"jwt\"\ntoken_endpoint_headers = { \"x-k\" = \"{{secret.nope}}\" }\n",
    );
    assert_eq!(
        e,
        [
            "test.toml:3:9: credentials.c.password: grant \"password\" needs password",
            "test.toml:4:13: credentials.c.token_url: \"http://x.example/t\" is not an https:// URL",
            "test.toml:6:17: credentials.c.refresh_token: does not apply to grant \"password\"",
            "test.toml:7:15: credentials.c.client_auth: \"jwt\" is not client_secret_post or client_secret_basic",
            "test.toml:8:36: credentials.c.token_endpoint_headers.x-k: {{secret.nope}} names no [secrets.nope]",
        ]
    );
    let e = errors("[credentials.c]\nkind = \"oauth2\"\ngrant = \"implicit\"\ntoken_url = \"https://x.example/t\"\n");
    assert_eq!(e, ["test.toml:3:9: credentials.c.grant: unknown grant \"implicit\": use client_credentials, refresh_token, password or jwt_bearer"]);
    let e = errors("[credentials.c]\nkind = \"oauth2\"\ngrant = \"client_credentials\"\ntoken_url = \"https://x.example/t\"\nclient_id = \"a\"\nclient_secret = \"hunter2-inline\"\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("test.toml:6:17: credentials.c.client_secret:"),
        "{e:?}"
    );
    assert!(
        !e[0].contains("hunter2"),
        "an inline value is never echoed: {e:?}"
    );
}

#[test]
fn google_id_token_and_hmac_compile_and_check_their_templates() {
    let text = r#"
[credentials.run]
kind = "google_id_token"
key = "exec:echo {}"
audience = "https://svc-abc.a.run.app"

[credentials.stripe]
kind = "hmac"
key = "exec:echo k"
algorithm = "sha256"
message = "{{timestamp}}.{{body}}"
headers = { "stripe-signature" = "t={{timestamp}},v1={{signature}}" }
"#;
    assert!(
        matches!(kind(text, "run"), Kind::GoogleIdToken { audience, .. }
        if audience == "https://svc-abc.a.run.app")
    );
    let stripe = kind(text, "stripe");
    assert_eq!(stripe.label(), "hmac");
    let Kind::Hmac(h) = &stripe else {
        panic!("hmac")
    };
    assert!(h.uses_body());
    let e = errors(
        "[credentials.h]\nkind = \"hmac\"\nkey = \"exec:echo k\"\nalgorithm = \"md5\"\nmessage = \"{{verb}}\"\nheaders = { \"x-sig\" = \"{{path}}\" }\n",
    );
    assert_eq!(e.len(), 4, "{e:?}");
    assert!(
        e[0].starts_with(
            "test.toml:4:13: credentials.h.algorithm: \"md5\" is not sha256, sha512 or sha1"
        ),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("test.toml:5:11: credentials.h.message: unknown template {{verb}}"),
        "{e:?}"
    );
    assert!(
        e[2].starts_with("test.toml:6:11: credentials.h.headers: no header carries {{signature}}"),
        "{e:?}"
    );
    assert!(
        e[3].starts_with("test.toml:6:23: credentials.h.headers.x-sig: unknown template {{path}}"),
        "{e:?}"
    );
    let e = errors("[credentials.g]\nkind = \"google_id_token\"\nkey = \"exec:echo {}\"\n");
    assert_eq!(
        e,
        ["test.toml:2:8: credentials.g.audience: kind \"google_id_token\" needs audience"]
    );
}

#[test]
fn client_cert_takes_a_cert_and_a_key_both_secret_sources() {
    let text = r#"
[credentials.partner_tls]
kind = "client_cert"
cert = "exec:echo c"
key = "exec:echo k"

[[rules]]
name = "partner"
hosts = ["api.partner.example"]
credential = "partner_tls"
"#;
    assert!(matches!(kind(text, "partner_tls"), Kind::ClientCert));
    let bad = errors(
        r#"
[credentials.a]
kind = "client_cert"
cert = "-----BEGIN CERTIFICATE-----"
key = "exec:echo k"
alg = "RS256"

[credentials.b]
kind = "client_cert"
key = "exec:echo k"
"#,
    );
    for want in [
        "credentials.a.cert: ",
        "(key material is never written inline)",
        "credentials.a.alg: does not apply to kind \"client_cert\"",
        "credentials.b.cert: kind \"client_cert\" needs cert",
    ] {
        assert!(bad.iter().any(|e| e.contains(want)), "{want}: {bad:#?}");
    }
}

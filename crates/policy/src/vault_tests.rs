//! `[vault]` connections and secrets held in stores: what compiles, and every problem named at
//! its key.

use std::time::Duration;

use super::compile::compile_one;
use crate::secrets::{Location, Source, VaultAuth};

fn errors(text: &str) -> Vec<String> {
    match compile_one(text) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

fn source(text: &str, name: &str) -> Source {
    let policy = compile_one(text).unwrap_or_else(|e| panic!("{e:?}"));
    policy
        .secret_sources()
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, s)| s.clone())
        .unwrap_or_else(|| panic!("no secret {name}"))
}

const VAULT: &str = r#"
[vault]
address = "https://vault.internal:8200"
namespace = "team-a"
auth = { method = "approle", role_id = "env:PATH", secret_id = "file:/etc/hostname" }
allow_private = ["10.0.0.0/8"]

[vault.k8s]
address = "https://vault.other:8200/"
auth = { method = "kubernetes", role = "latchkey" }
"#;

#[test]
fn a_vault_source_gets_its_connection_and_the_secret_its_refresh_and_grace() {
    let text = format!(
        "{VAULT}\n[secrets.gh]\nsource = \"vault:secret/github#token\"\nrefresh = \"1m\"\nstale_for = \"10m\"\n\n[secrets.db]\nsource = \"vault.k8s:database/creds/ro#password\"\n"
    );
    let Source::Remote(gh) = source(&text, "gh") else {
        panic!("remote")
    };
    assert_eq!(gh.refresh, Duration::from_secs(60));
    assert_eq!(gh.stale_for, Duration::from_secs(600));
    let Location::Vault {
        settings: Some(c), ..
    } = &gh.at
    else {
        panic!("{gh:?}")
    };
    assert_eq!(c.address, "https://vault.internal:8200");
    assert_eq!(c.namespace.as_deref(), Some("team-a"));
    assert_eq!(c.allow_private.len(), 1);
    assert!(matches!(&c.auth, VaultAuth::AppRole { mount, .. } if mount == "approle"));
    let Source::Remote(db) = source(&text, "db") else {
        panic!("remote")
    };
    let Location::Vault {
        settings: Some(c), ..
    } = &db.at
    else {
        panic!("{db:?}")
    };
    assert_eq!(c.address, "https://vault.other:8200");
    match &c.auth {
        VaultAuth::Jwt {
            mount,
            role,
            token_file,
        } => {
            assert_eq!((mount.as_str(), role.as_str()), ("kubernetes", "latchkey"));
            assert!(token_file.ends_with("serviceaccount/token"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(db.refresh, crate::secrets::remote::DEFAULT_REFRESH);
    assert_eq!(db.stale_for, Duration::ZERO);
}

#[test]
fn a_source_naming_an_undeclared_connection_is_an_error_at_it() {
    let e = errors("[secrets.gh]\nsource = \"vault.prod:secret/github#token\"\n");
    assert_eq!(
        e,
        ["test.toml:2:10: secrets.gh.source: names the Vault connection [vault.prod], which no policy file declares (declared: none)"]
    );
    let e = errors(&format!(
        "{VAULT}\n[credentials.aws]\nkind = \"aws_sigv4\"\naccess_key_id = \"vault.nope:aws/creds/x#access_key\"\nsecret_access_key = \"vault:aws/creds/x#secret_key\"\n"
    ));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].contains("credentials.aws.access_key_id: names the Vault connection [vault.nope]")
            && e[0].contains("declared: [vault], [vault.k8s]"),
        "{e:?}"
    );
}

#[test]
fn every_problem_in_a_connection_is_named_at_its_key() {
    let e = errors(
        r#"
[vault]
address = "http://vault.internal:8200/v1"
ca = "/nonexistent/ca.pem"
auth = { method = "approle", role_id = "vault:secret/x#y", token = "env:X" }
allow_private = ["10.0.0.0/33"]
colour = "blue"

[vault.b]
address = "https://b.internal"
auth = { method = "magic" }

[vault.c]
auth = { method = "jwt", role = "r" }
"#,
    );
    let joined = e.join("\n");
    for want in [
        "vault: unknown key `colour`",
        "vault.address: \"http://vault.internal:8200/v1\": give only https://HOST[:PORT]",
        "vault.auth.role_id: a login secret comes from env:, file: or exec:, not from a store",
        "vault.auth.secret_id is required",
        "vault.auth.token: not used by method \"approle\"",
        "vault.allow_private:",
        "vault.b.auth.method: unknown method \"magic\"",
        "vault.c: address is required",
        "vault.c.auth.token_file is required",
    ] {
        assert!(joined.contains(want), "missing {want:?} in:\n{joined}");
    }
}

#[test]
fn http_is_refused_but_to_a_loopback_address() {
    let e = errors(
        "[vault]\naddress = \"http://vault.internal:8200\"\nauth = { method = \"token\", token = \"env:PATH\" }\n",
    );
    assert!(e[0].contains("cleartext"), "{e:?}");
    let text = "[vault]\naddress = \"http://127.0.0.1:8200\"\nauth = { method = \"token\", token = \"env:PATH\" }\n[secrets.a]\nsource = \"vault:secret/a#b\"\n";
    assert!(matches!(source(text, "a"), Source::Remote(_)));
}

#[test]
fn refresh_and_stale_for_are_for_stores_only_and_must_be_durations() {
    let e = errors("[secrets.a]\nsource = \"env:PATH\"\nrefresh = \"1m\"\n");
    assert!(
        e[0].contains("refresh and stale_for apply to vault:, aws-sm: and aws-ssm: sources only"),
        "{e:?}"
    );
    let e = errors("[secrets.a]\nsource = \"aws-sm:x\"\nrefresh = \"0s\"\nstale_for = \"soon\"\n");
    let joined = e.join("\n");
    assert!(
        joined.contains("secrets.a.refresh: \"0s\" is not a duration of at least 1s"),
        "{joined}"
    );
    assert!(
        joined.contains("secrets.a.stale_for: \"soon\" is not a duration"),
        "{joined}"
    );
}

#[test]
fn a_connection_declared_twice_is_refused() {
    let e = super::compile::compile_sources(&[
        (std::path::Path::new("a.toml"), "[vault]\naddress = \"https://a\"\nauth = { method = \"token\", token = \"env:PATH\" }\n"),
        (std::path::Path::new("b.toml"), "[vault]\naddress = \"https://b\"\nauth = { method = \"token\", token = \"env:PATH\" }\n"),
    ])
    .expect_err("twice");
    assert!(
        e[0].to_string()
            .contains("vault: declared again (first at a.toml:1)"),
        "{e:?}"
    );
}

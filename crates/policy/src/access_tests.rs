//! `[admin.oidc]`: what compiles, and every mistake named with file, line and field.

use std::path::Path;

use super::*;
use crate::{compile_sources_with, SecretLoading};

const GOOD: &str = r#"
[admin.oidc]
issuer        = "https://login.example.com/realms/ops"
client_id     = "latchkey-console"
client_secret = "env:LK_TEST_OIDC_SECRET"
redirect_uri  = "https://latchkey-admin.internal:3129/ui/oidc/callback"

[admin.oidc.roles.security]
claim  = "groups"
equals = "security"
scopes = ["read", "approvals:answer"]

[admin.oidc.roles.platform]
claim  = "realm_access.roles"
equals = "platform"
scopes = ["read", "sessions:write"]
"#;

#[test]
fn an_oidc_issuer_compiles_with_its_roles() {
    let p =
        compile_sources_with(&[(Path::new("a.toml"), GOOD)], SecretLoading::Skip).expect("valid");
    let o = p.admin_oidc().expect("oidc");
    assert_eq!(o.issuer, "https://login.example.com/realms/ops");
    assert_eq!(o.client_id, "latchkey-console");
    assert!(o.confidential);
    assert_eq!(o.redirect_uri.path(), OIDC_CALLBACK_PATH);
    assert_eq!(o.name_claim, "email");
    assert_eq!(o.origin.line, 2);
    let names: Vec<&str> = o.roles.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["security", "platform"]);
    assert_eq!(
        o.roles[0].scopes,
        BTreeSet::from([AdminScope::Read, AdminScope::ApprovalsAnswer])
    );
    assert_eq!(o.roles[1].claim, "realm_access.roles");
    // No client secret: a public client (PKCE alone).
    let public = GOOD.replace("client_secret = \"env:LK_TEST_OIDC_SECRET\"\n", "");
    let p = compile_sources_with(&[(Path::new("a.toml"), &public)], SecretLoading::Skip)
        .expect("valid");
    assert!(!p.admin_oidc().expect("oidc").confidential);
    // Without the table, none.
    let none = compile_sources_with(
        &[(
            Path::new("a.toml"),
            "[[rules]]\nname = \"r\"\nhosts = [\"a.test\"]\n",
        )],
        SecretLoading::Skip,
    )
    .expect("valid");
    assert!(none.admin_oidc().is_none());
}

fn errors_of(files: &[(&str, &str)]) -> String {
    let sources: Vec<(&Path, &str)> = files.iter().map(|(n, t)| (Path::new(*n), *t)).collect();
    let errs = compile_sources_with(&sources, SecretLoading::Skip).expect_err("invalid");
    errs.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn oidc_mistakes_are_named_with_file_line_and_field() {
    let bad = r#"
[admin.oidc]
issuer       = "http://login.example.com"
client_id    = ""
redirect_uri = "https://latchkey.internal/ui/login"
name_claim   = ""
scope        = "openid"

[admin.oidc.roles.a]
claim  = "claim.groups"
equals = ""
scopes = ["read", "everything"]

[admin.oidc.roles.b]
claim  = "groups"
equals = "x"
scopes = []
"#;
    let all = errors_of(&[("bad.toml", bad)]);
    for needle in [
        "bad.toml:3:",
        "admin.oidc.issuer: \"http://login.example.com\" must be an https URL",
        "admin.oidc.client_id: must not be empty",
        "admin.oidc.redirect_uri: \"https://latchkey.internal/ui/login\" must be this admin listener's http(s) URL with the path /ui/oidc/callback",
        "admin.oidc.name_claim: must not be empty",
        "scope",
        "admin.oidc.roles.a.claim: name the claim itself (\"groups\")",
        "admin.oidc.roles.a.equals: must not be empty",
        "admin.oidc.roles.a.scopes[1]: unknown scope \"everything\"",
        "admin.oidc.roles.b.scopes: no scope grants nothing",
    ] {
        assert!(all.contains(needle), "{needle:?} missing from:\n{all}");
    }
    // Required keys, and a role-less issuer nobody could sign in with.
    let bare = "[admin.oidc]\nclient_id = \"c\"\n";
    let all = errors_of(&[("bare.toml", bare)]);
    for needle in ["issuer", "redirect_uri", "no [admin.oidc.roles.NAME]"] {
        assert!(all.contains(needle), "{needle:?} missing from:\n{all}");
    }
    // One issuer only, across files.
    let all = errors_of(&[("a.toml", GOOD), ("b.toml", GOOD)]);
    assert!(
        all.contains("b.toml:2:")
            && all.contains("admin.oidc: defined twice (first in a.toml line 2)"),
        "{all}"
    );
    // A bad secret source is named.
    let all = errors_of(&[(
        "s.toml",
        &GOOD.replace("env:LK_TEST_OIDC_SECRET", "plain-text-secret"),
    )]);
    assert!(all.contains("admin.oidc.client_secret:"), "{all}");
}

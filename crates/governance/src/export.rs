//! `latchkey approvals export`: standing grants as policy rules plus the test cases that pin
//! them, so what a person approved at run time becomes a reviewed change to `policies/`.
//!
//! Each rule covers exactly the request that was approved (host, port, method, path; globs in
//! the path escaped), never more than the grant did: widening it is the reviewer's choice, in
//! the change request. A grant under a rule with `ask` is exported too (the reviewed rule then
//! needs no person for that request); secrets are never bound by an exported rule.

use std::fmt::Write as _;

use super::approvals::Grant;

/// The rules file and the test-case file for `grants` (duplicates of one request exported once).
pub fn export(grants: &[Grant]) -> (String, String) {
    let mut rules = String::from(
        "# Rules exported from latchkey's standing grants (`latchkey approvals export`).\n\
         # Each covers exactly the request a person approved; review before merging, and add\n\
         # each rule's name to its identity's `rules` list where the policy names identities.\n",
    );
    let mut cases = String::from(
        "# Test cases for the exported rules: each approved request must stay allowed.\n",
    );
    let mut seen = std::collections::BTreeSet::new();
    let mut names = std::collections::BTreeSet::new();
    for g in grants {
        let key = (&g.identity, &g.scheme, &g.host, g.port, &g.method, &g.path);
        if !seen.insert(key) {
            continue;
        }
        // Unique even if one approval left several grants.
        let mut name = format!("granted-{}", g.approval);
        let mut n = 1;
        while !names.insert(name.clone()) {
            n += 1;
            name = format!("granted-{}-{n}", g.approval);
        }
        let url = url_of(g);
        let _ =
            write!(
            rules,
            "\n# Approval {} (rule {}): identity {} asked {} {}; granted by {} for {}, on {}.\n\
             [[rules]]\n\
             name = {}\n\
             description = {}\n\
             hosts = [{}]\n",
            g.approval,
            g.rule,
            g.identity,
            g.method,
            url,
            g.by,
            g.scope,
            humantime::format_rfc3339_seconds(g.created),
            quote(&name),
            quote(&format!("approved at run time: {} {url} for identity {}", g.method, g.identity)),
            quote(&g.host),
        );
        if g.port != default_port(&g.scheme) {
            let _ = writeln!(rules, "ports = [{}]", g.port);
        }
        let _ = writeln!(rules, "methods = [{}]", quote(&g.method));
        let _ = writeln!(rules, "paths = [{}]", quote(&escape_glob(&g.path)));
        let _ = write!(
            cases,
            "\n[[cases]]\nname = {}\nmethod = {}\nurl = {}\n",
            quote(&format!("{name} keeps allowing {} {url}", g.method)),
            quote(&g.method),
            quote(&url),
        );
        if g.identity != crate::policy::DEFAULT_IDENTITY {
            // A runtime session's grant (`PROFILE@SESSION_ID`) is its profile's case.
            let identity = g
                .identity
                .split_once('@')
                .map_or(g.identity.as_str(), |(p, _)| p);
            let _ = writeln!(cases, "identity = {}", quote(identity));
        }
        let _ = writeln!(cases, "expect = \"allow\"\nrule = {}", quote(&name));
    }
    (rules, cases)
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "http" {
        80
    } else {
        443
    }
}

fn url_of(g: &Grant) -> String {
    let scheme = if g.scheme == "http" {
        crate::policy::Scheme::Http
    } else {
        crate::policy::Scheme::Https
    };
    crate::policy::display_url(scheme, &g.host, g.port, &g.path)
}

/// A TOML basic string.
fn quote(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// A path as a glob that matches only itself.
fn escape_glob(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '{' | '}' | '\\') {
            out.push('[');
            out.push(c);
            out.push(']');
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn grant(identity: &str, method: &str, path: &str, port: u16) -> Grant {
        Grant {
            approval: "0123456789abcdef".into(),
            identity: identity.into(),
            rule: "prod-writes".into(),
            scheme: "https".into(),
            host: "api.prod.test".into(),
            port,
            method: method.into(),
            path: path.into(),
            scope: "1h".into(),
            by: "ana".into(),
            created: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            expires: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_003_600),
        }
    }

    #[test]
    fn exported_rules_and_cases_compile_and_pass_against_each_other() {
        let grants = [
            grant("agent", "POST", "/v1/deploy", 443),
            grant("agent", "POST", "/v1/deploy", 443),
            grant("default", "DELETE", "/v1/items/[x]*", 8443),
        ];
        let (rules, cases) = export(&grants);
        assert_eq!(rules.matches("[[rules]]").count(), 2, "{rules}");
        assert!(rules.contains("ports = [8443]"), "{rules}");
        assert!(
            rules.contains(r#"paths = ["/v1/items/[[]x[]][*]"]"#),
            "{rules}"
        );
        let policy =
            crate::policy::compile_sources(&[(std::path::Path::new("granted.toml"), &rules)])
                .unwrap_or_else(|e| panic!("exported rules must compile: {e:?}\n{rules}"));
        fn target<'a>(
            method: &'a http::Method,
            path: &'a str,
            port: u16,
        ) -> crate::policy::Target<'a> {
            crate::policy::Target {
                identity: None,
                narrowing: None,
                websocket: false,
                scheme: crate::policy::Scheme::Https,
                host: "api.prod.test",
                port,
                method,
                path,
                query: None,
                headers: None,
            }
        }
        let (post, get, delete) = (http::Method::POST, http::Method::GET, http::Method::DELETE);
        assert!(policy.decide(&target(&post, "/v1/deploy", 443)).allowed());
        assert!(!policy.decide(&target(&get, "/v1/deploy", 443)).allowed());
        assert!(!policy.decide(&target(&post, "/v1/deploy/x", 443)).allowed());
        assert!(policy
            .decide(&target(&delete, "/v1/items/[x]*", 8443))
            .allowed());
        assert!(!policy
            .decide(&target(&delete, "/v1/items/xa", 8443))
            .allowed());
        assert_eq!(cases.matches("[[cases]]").count(), 2, "{cases}");
        assert!(cases.contains("identity = \"agent\""), "{cases}");
        assert!(!cases.contains("identity = \"default\""), "{cases}");
    }
}

//! Property tests: policy loading never panics on mutated files. Each case takes a valid policy
//! (the presets, the example, and a policy touching every section), applies up to 8 random edits
//! (deleted ranges, inserted TOML fragments or raw bytes, duplicated or swapped lines,
//! truncation), and compiles it; a policy that still compiles is then decided on and linted.

use std::path::Path;

use http::Method;
use proptest::prelude::*;
use proptest::sample::Index;

use crate::policy::Target;
use crate::policy::{compile_sources_with, SecretLoading};
use crate::policy::{load_dir_for_evaluation, Policy, Scheme};

const RICH: &str = r#"
[secrets.openai]
source = "env:OPENAI_API_KEY"

[secrets.maps]
source = "file:/run/secrets/maps-key"

[secrets.vault]
source  = "exec:vault kv get -field=token secret/agent"
ttl     = "5m"
timeout = "10s"

[[rules]]
name = "openai"
hosts = ["api.openai.com"]
methods = ["GET", "POST"]
paths = ["/v1/**", "/v1/files/*.json"]
placeholders = ["header", "body"]
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"

[[rules]]
name = "maps"
hosts = ["maps.example.com"]
ports = [443, 8443]
[rules.inject.query]
key = "{{secret.maps}}"

[[rules]]
name = "git"
hosts = ["git.example.com"]
keep_headers = ["cookie"]
[rules.inject.basic_auth]
user     = "x-access-token"
password = "{{secret.vault}}"

[[rules]]
name = "cdn"
hosts = ["*.cdn.example.com"]
mode = "report"

[[rules]]
name = "internal"
hosts = ["svc.internal.test"]
allow_private = ["10.0.0.0/8"]

[[rules]]
name = "tunnel"
hosts = ["tunnel.example.com"]
tunnel = true

[identities.ci]
sources = ["10.77.0.0/24"]
rules = ["openai", "cdn"]
"#;

const SEEDS: &[&str] = &[
    BASIC,
    RICH,
    include_str!("../../../../policies/example.toml"),
    include_str!("../../../../policies/presets/aws.toml"),
    include_str!("../../../../policies/presets/github.toml"),
    include_str!("../../../../policies/presets/openai.toml"),
    include_str!("../../../../policies/presets/bearer-apis.toml"),
];

/// Fragments that steer edits into TOML and latchkey syntax rather than plain noise.
const FRAGMENTS: &[&str] = &[
    "[[rules]]\n",
    "[rules.inject.headers]\n",
    "[rules.inject.query]\n",
    "[rules.inject.basic_auth]\n",
    "[secrets.x]\n",
    "[identities.a]\n",
    "[credentials.c]\n",
    "name = \"dup\"\n",
    "hosts = [\"*\"]\n",
    "hosts = []\n",
    "paths = [\"/**/[\"]\n",
    "ports = [0, 65536]\n",
    "methods = [\"get\"]\n",
    "tunnel = true\n",
    "source = \"exec:\"\n",
    "rules = [\"*\"]\n",
    "=",
    "\"",
    "'",
    "[",
    "]",
    "{",
    "}",
    ",",
    "\n",
    "#",
    "*",
    "**",
    "*.",
    "/",
    "{{secret.openai}}",
    "{{secret.nope}}",
    "{{",
    "}}",
    "{{host}}",
    "{{identity}}",
    "__LATCHKEY_openai__",
    "env:",
    "file:",
    "-1",
    "99999999999999999999",
    "1e400",
    "inf",
    "nan",
    "1979-05-27T07:32:00Z",
    "\"\"\"",
    "\\u0000",
    "\\",
    "\u{0}",
    "\u{feff}",
    "é",
    "\u{202e}",
    "xn--",
    "[::1]",
    "0x7f.1",
    "..",
    ";",
];

#[derive(Debug, Clone)]
enum Edit {
    Delete(Index, usize),
    Fragment(Index, Index),
    Byte(Index, u8),
    Replace(Index, u8),
    DuplicateLine(Index),
    SwapLines(Index, Index),
    Truncate(Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), 1..40usize).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<Index>(), any::<Index>()).prop_map(|(i, f)| Edit::Fragment(i, f)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Byte(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Replace(i, b)),
        any::<Index>().prop_map(Edit::DuplicateLine),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
        any::<Index>().prop_map(Edit::Truncate),
    ]
}

fn apply(seed: &str, edits: &[Edit]) -> Vec<u8> {
    let mut text = seed.as_bytes().to_vec();
    for e in edits {
        let at = |i: &Index, len: usize| i.index(len + 1);
        match e {
            Edit::Delete(i, n) => {
                let start = at(i, text.len());
                let end = (start + n).min(text.len());
                text.drain(start..end);
            }
            Edit::Fragment(i, f) => {
                let start = at(i, text.len());
                let frag = FRAGMENTS[f.index(FRAGMENTS.len())].as_bytes();
                text.splice(start..start, frag.iter().copied());
            }
            Edit::Byte(i, b) => {
                let start = at(i, text.len());
                text.insert(start, *b);
            }
            Edit::Replace(i, b) if !text.is_empty() => {
                let idx = i.index(text.len());
                text[idx] = *b;
            }
            Edit::Replace(..) => {}
            Edit::DuplicateLine(i) | Edit::SwapLines(i, _) | Edit::Truncate(i)
                if text.is_empty() =>
            {
                let _ = i;
            }
            Edit::DuplicateLine(i) => {
                let mut lines: Vec<Vec<u8>> =
                    text.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
                let idx = i.index(lines.len());
                let line = lines[idx].clone();
                lines.insert(idx, line);
                text = lines.join(&b'\n');
            }
            Edit::SwapLines(a, b) => {
                let mut lines: Vec<Vec<u8>> =
                    text.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
                let (a, b) = (a.index(lines.len()), b.index(lines.len()));
                lines.swap(a, b);
                text = lines.join(&b'\n');
            }
            Edit::Truncate(i) => {
                let idx = i.index(text.len());
                text.truncate(idx);
            }
        }
    }
    text
}

/// A policy that compiled must also decide and lint without panicking.
fn exercise(policy: &Policy, sources: &[(&Path, &str)]) {
    for (method, scheme, host, port, path) in [
        (
            Method::GET,
            Scheme::Https,
            "api.openai.com",
            443,
            "/v1/files/a.json",
        ),
        (Method::POST, Scheme::Https, "x.cdn.example.com", 443, "/"),
        (Method::GET, Scheme::Http, "example.com", 80, "/"),
        (
            Method::PUT,
            Scheme::Https,
            "api.example.com",
            443,
            "/v1/admin/x",
        ),
        (Method::GET, Scheme::Https, "tunnel.example.com", 443, "/"),
    ] {
        let _ = policy.decide(&target(&method, scheme, host, port, path));
        let _ = policy.decide_connect(host, port, None);
    }
    let _ = crate::lint::lint(policy, sources);
}

#[test]
fn every_seed_is_a_valid_policy() {
    for (i, seed) in SEEDS.iter().enumerate() {
        let sources = [(Path::new("seed.toml"), *seed)];
        let compiled = compile_sources_with(&sources, SecretLoading::Skip);
        assert!(compiled.is_ok(), "seed {i}: {:?}", compiled.err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// 1000 cases: a mutated policy text (up to 8 edits of one of the seeds) compiles or is
    /// refused with errors, never a panic; what compiles decides and lints.
    #[test]
    fn proptest_policy_loading_never_panics_on_mutated_text(
        seed in 0..SEEDS.len(),
        edits in proptest::collection::vec(edit(), 1..8),
    ) {
        let bytes = apply(SEEDS[seed], &edits);
        let text = String::from_utf8_lossy(&bytes);
        let sources = [(Path::new("mutated.toml"), text.as_ref())];
        match compile_sources_with(&sources, SecretLoading::Skip) {
            Ok(policy) => exercise(&policy, &sources),
            Err(errors) => {
                prop_assert!(!errors.is_empty(), "refused with no error");
                for e in &errors {
                    prop_assert!(!e.message.trim().is_empty(), "an empty error: {:?}", e);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// 256 cases: the same edits as raw bytes (so also invalid UTF-8), split over two files
    /// in a policy directory, loaded the way `serve` reads them; never a panic, and a
    /// refused load names at least one problem.
    #[test]
    fn proptest_policy_dir_loading_never_panics_on_mutated_files(
        seeds in (0..SEEDS.len(), 0..SEEDS.len()),
        edits in proptest::collection::vec(edit(), 1..8),
    ) {
        let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let a = apply(SEEDS[seeds.0], &edits);
        let b = apply(SEEDS[seeds.1], &edits[edits.len() / 2..]);
        std::fs::write(dir.path().join("a.toml"), &a)
            .and_then(|()| std::fs::write(dir.path().join("b.toml"), &b))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        match load_dir_for_evaluation(dir.path()) {
            Ok(policy) => {
                let a = String::from_utf8_lossy(&a);
                let b = String::from_utf8_lossy(&b);
                let pa = dir.path().join("a.toml");
                let pb = dir.path().join("b.toml");
                exercise(&policy, &[(pa.as_path(), a.as_ref()), (pb.as_path(), b.as_ref())]);
            }
            Err(e) => {
                for p in e.problems() {
                    prop_assert!(!p.message.trim().is_empty(), "an empty error: {:?}", p);
                }
            }
        }
    }
}

const BASIC: &str = r#"
[[rules]]
name = "api-read"
hosts = ["api.example.com"]
methods = ["GET", "HEAD"]
paths = ["/v1/**"]

[[rules]]
name = "api-admin"
hosts = ["api.example.com"]
methods = ["POST"]
paths = ["/v1/admin/*"]

[[rules]]
name = "wild"
hosts = ["*.cdn.example.com"]

[[rules]]
name = "plain"
hosts = ["plain.example.com"]
ports = [8080]
"#;

fn target<'a>(
    method: &'a Method,
    scheme: Scheme,
    host: &'a str,
    port: u16,
    path: &'a str,
) -> Target<'a> {
    Target {
        scheme,
        host,
        port,
        method,
        path,
        identity: None,
        narrowing: None,
        websocket: false,
        query: None,
        headers: None,
    }
}

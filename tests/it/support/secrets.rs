//! Support for the secret-brokering tests: test secrets, the encodings an upstream may reflect a
//! secret in, an upstream that reflects them, a leak sweep, and an incremental HTTP/1.1 reader for
//! streamed responses.
//!
//! - [`reflections`]: a value as an upstream would write it (raw, base64 in both alphabets at
//!   every alignment inside a longer blob, percent-encoded, JSON-escaped).
//! - [`leak_patterns`]: what must never reach the sandbox: the raw value and every encoded form,
//!   base64 cut down to the characters determined by the value alone (so a match does not
//!   depend on the bytes around it).
//! - [`secrets_handler`]: the upstream the secrets tests talk to (see its routes).
//! - [`SecretsWorld`]: a test CA, that upstream, latchkey with secrets in its environment, and a
//!   record of everything the sandbox saw, swept for leaks by [`SecretsWorld::sweep`].

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use bytes::Bytes;
use hyper::Response;
use rustls_pki_types::ServerName;
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::sync::Notify;

use super::clients::{connect_tunnel, curl, tls_config, CurlOutput, RawResponse};
use super::latchkey::{latchkey, wait_with_timeout, Latchkey, SCRUBBED_ENV};
use super::toolchain;
use super::upstream::{
    channel_body, chunked_body, echo, full_body, handler, Handler, Received, UpBody, Upstream,
};
use super::{TestCa, PINNED};

// ---------------------------------------------------------------------------------------------
// Test secrets. Distinctive, so a leak anywhere is unmistakable.

/// An OpenAI-style key: only URL-unreserved characters.
pub const OPENAI: &str = "sk-test-OPENAI-4f9a1c7e2b8d";
/// A value that percent-encoding and JSON escaping both change (`/`, `"`, `\`, space, `+`, `&`,
/// `<`, `>`).
pub const WEIRD: &str = r#"tok/with"quote\and space+plus&<gt>"#;
/// A Google-Maps-style key, injected into a query.
pub const MAPS: &str = "AIzaTEST-maps-7d3e9b1a5c";
/// A GitHub-token-style value, injected as a basic-auth password.
pub const GH: &str = "ghs_TESTgithubTOKEN0a1b2c3d";

/// The environment variables the test secrets are passed in, with their values.
pub const SECRET_ENV: &[(&str, &str)] = &[
    ("TEST_OPENAI_KEY", OPENAI),
    ("TEST_WEIRD_KEY", WEIRD),
    ("TEST_MAPS_KEY", MAPS),
    ("TEST_GH_KEY", GH),
];

/// The request-side tests' rules: `openai` injected on api.test, other.test open and binding
/// nothing (with the upstreams' ports as `PORT`, see [`Setup::ports`]).
pub const OPENAI_RULES: &str = r#"
[[rules]]
name  = "openai"
hosts = ["api.test"]
ports = [PORT]
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"

[[rules]]
name  = "other"
hosts = ["other.test"]
ports = [PORT]
"#;

/// `[secrets.NAME]` tables for some of the test secrets (`openai`, `weird`, `maps`, `gh`), each
/// sourced from its [`SECRET_ENV`] variable.
pub fn secrets_toml(names: &[&str]) -> String {
    names
        .iter()
        .map(|name| {
            let var = format!("TEST_{}_KEY", name.to_uppercase());
            assert!(
                SECRET_ENV.iter().any(|(v, _)| *v == var),
                "no test secret {name}"
            );
            format!("[secrets.{name}]\nsource = \"env:{var}\"\n\n")
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Encodings

/// Base64 of `value` at `alignment` (0, 1 or 2: its offset modulo 3 inside a longer blob), cut
/// to the characters that only bits of `value` determine: what any blob holding `value` at that
/// alignment contains, whatever surrounds it.
pub fn b64_core(value: &[u8], alignment: usize, url_safe: bool) -> String {
    let mut shifted = vec![0u8; alignment];
    shifted.extend_from_slice(value);
    let encoded = if url_safe {
        URL_SAFE_NO_PAD.encode(&shifted)
    } else {
        STANDARD.encode(&shifted)
    };
    // Character i carries bits 6i..6i+6; the value has bits 8a..8(a+n).
    let start = (8 * alignment).div_ceil(6);
    let end = (8 * (alignment + value.len())) / 6;
    encoded[start..end].to_string()
}

/// Percent-encoding of every byte but the unreserved `A-Za-z0-9-._~` (Python's
/// `quote(v, safe='')`), with upper- or lower-case hex; `form`: space as `+`.
pub fn percent(value: &[u8], upper: bool, form: bool) -> String {
    let mut out = String::new();
    for &b in value {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else if form && b == b' ' {
            out.push('+');
        } else if upper {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

/// The JSON string escaping of `value` without the quotes: `std` as serde_json writes it,
/// `slash` also escaping `/` (PHP), `go` also escaping `<`, `>`, `&` as `\u00XX` (Go's default).
pub fn json_escaped(value: &str, slash: bool, go: bool) -> String {
    let quoted = serde_json::to_string(value).expect("JSON string");
    let mut out = quoted[1..quoted.len() - 1].to_string();
    if slash {
        out = out.replace('/', "\\/");
    }
    if go {
        out = out
            .replace('<', "\\u003c")
            .replace('>', "\\u003e")
            .replace('&', "\\u0026");
    }
    out
}

/// A few bytes that make base64 blobs contain `+` and `/` (or `-` and `_`) around a value.
const FILLER: &[u8] = &[0xfb, 0xef, 0xbe];
const TAIL: &[u8] = b"\xfe\xff tail";

/// `value` as an upstream may write it into a response, one `(label, text)` per encoding.
pub fn reflections(value: &str) -> Vec<(String, String)> {
    let v = value.as_bytes();
    let mut out = vec![("raw".to_string(), value.to_string())];
    for (alphabet, url_safe) in [("std", false), ("url", true)] {
        // Offsets 0 (at the start of the blob), 1, 2 and 3 (offset 0 again, inside the blob).
        for offset in 0..=3 {
            let mut blob = FILLER
                .iter()
                .cycle()
                .take(offset)
                .copied()
                .collect::<Vec<u8>>();
            blob.extend_from_slice(v);
            blob.extend_from_slice(TAIL);
            let text = if url_safe {
                URL_SAFE_NO_PAD.encode(&blob)
            } else {
                STANDARD.encode(&blob)
            };
            out.push((format!("b64-{alphabet}-{offset}"), text));
        }
    }
    out.push(("pct-upper".into(), percent(v, true, false)));
    out.push(("pct-lower".into(), percent(v, false, false)));
    out.push(("pct-form".into(), percent(v, true, true)));
    out.push(("json".into(), json_escaped(value, false, false)));
    out.push(("json-slash".into(), json_escaped(value, true, false)));
    out.push(("json-go".into(), json_escaped(value, false, true)));
    out
}

/// Every form of `value` that must never reach the sandbox, `(label, text)`, without repeats.
pub fn leak_patterns(value: &str) -> Vec<(String, String)> {
    let v = value.as_bytes();
    let mut out = vec![("raw".to_string(), value.to_string())];
    for (alphabet, url_safe) in [("std", false), ("url", true)] {
        for alignment in 0..3 {
            out.push((
                format!("base64-{alphabet} at alignment {alignment}"),
                b64_core(v, alignment, url_safe),
            ));
        }
    }
    out.push(("percent upper".into(), percent(v, true, false)));
    out.push(("percent lower".into(), percent(v, false, false)));
    out.push(("form-encoded".into(), percent(v, true, true)));
    out.push(("JSON-escaped".into(), json_escaped(value, false, false)));
    out.push((
        "JSON-escaped with \\/".into(),
        json_escaped(value, true, false),
    ));
    out.push((
        "JSON-escaped Go-style".into(),
        json_escaped(value, false, true),
    ));
    let mut seen = std::collections::HashSet::new();
    out.retain(|(_, text)| seen.insert(text.clone()));
    out
}

pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

pub fn count(haystack: &[u8], needle: &[u8]) -> usize {
    if needle.is_empty() {
        return 0;
    }
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

/// The first leak of any of `secrets` (`(name, value)`) in `haystack`: `"name as label"`.
pub fn find_leak(haystack: &[u8], secrets: &[(String, String)]) -> Option<String> {
    secrets.iter().find_map(|(name, value)| {
        leak_patterns(value)
            .into_iter()
            .find(|(_, text)| contains(haystack, text.as_bytes()))
            .map(|(label, _)| format!("secret {name:?} ({label})"))
    })
}

/// Panics if `haystack` holds any form of any of `secrets`.
pub fn assert_no_leak(what: &str, haystack: &[u8], secrets: &[(String, String)]) {
    if let Some(leak) = find_leak(haystack, secrets) {
        panic!(
            "{leak} leaked into {what}:\n{}",
            String::from_utf8_lossy(haystack)
        );
    }
}

/// A response as one byte string: status, headers and body, for leak checks.
pub fn response_bytes(resp: &RawResponse) -> Vec<u8> {
    let mut out = format!("{}\n", resp.status).into_bytes();
    for (name, value) in &resp.headers {
        out.extend_from_slice(format!("{name}: {value}\n").as_bytes());
    }
    out.push(b'\n');
    out.extend_from_slice(&resp.body);
    out
}

// ---------------------------------------------------------------------------------------------
// The upstream

/// The credential an upstream received in `authorization` (after `Bearer `; a `Basic` value is
/// decoded to `user:password`).
pub fn credential_in(req: &Received) -> Option<String> {
    let auth = req.header("authorization")?;
    if let Some(token) = auth.strip_prefix("Bearer ") {
        return Some(token.to_string());
    }
    if let Some(basic) = auth.strip_prefix("Basic ") {
        let decoded = STANDARD.decode(basic.trim()).ok()?;
        return Some(String::from_utf8_lossy(&decoded).into_owned());
    }
    Some(auth.to_string())
}

fn query_param<'a>(req: &'a Received, name: &str) -> Option<&'a str> {
    req.query_values(name).first().copied()
}

/// The upstream of the secrets tests. Routes:
///
/// - `/reflect?ce=CODINGS&chunked=1`: reflects the credential in `authorization` and the value
///   of `x-weird` in every encoding of [`reflections`], one body line `N:label: <<text>>` and one
///   header `x-echo-N-label` each, compressed as `ce` says (a `content-encoding` value: `gzip`,
///   `deflate`, `br` in any case, several in the order applied; others such as `zstd` or
///   `x-custom` only label the body) and sent in 7-byte frames if `chunked=1`.
/// - `/history`: every credential received in `authorization` since the upstream started, raw,
///   one per line and as headers `x-history-N` (an upstream reflecting an old, rotated key).
/// - `/sse?ct=TYPE`: `text/event-stream` (or `TYPE`), streamed; sends one event holding the
///   `authorization` header, waits until `gate` is notified (at most 20 s), then sends a second
///   event and `[DONE]`.
/// - `/known`: every test secret of [`SECRET_ENV`], raw and in standard base64, whatever the
///   request carried (an upstream that learned keys elsewhere).
/// - `/v1/chat/completions`: an OpenAI-style chat completion whose content is
///   `you sent: <authorization header>`, gzip-compressed if the client accepts gzip.
/// - `/big?n=N`: N blocks of 16 KiB, each holding the credential once, in 8191-byte frames.
/// - anything else: the JSON echo.
pub fn secrets_handler(gate: Arc<Notify>) -> Handler {
    let history: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    handler(move |req: Received| {
        let gate = gate.clone();
        let history = history.clone();
        async move {
            if let Some(credential) = credential_in(&req) {
                history.lock().expect("history").push(credential);
            }
            match req.path_only() {
                "/reflect" => reflect(&req),
                "/history" => history_response(&history.lock().expect("history")),
                "/sse" => sse(&req, gate),
                "/known" => known(),
                "/v1/chat/completions" => chat_completion(&req),
                "/big" => big(&req),
                _ => echo(req).await,
            }
        }
    })
}

fn reflect(req: &Received) -> Response<UpBody> {
    let mut values = Vec::new();
    if let Some(credential) = credential_in(req) {
        values.push(credential);
    }
    if let Some(weird) = req.header("x-weird") {
        values.push(weird.to_string());
    }
    let mut response = Response::builder().header("content-type", "text/plain; charset=utf-8");
    let mut body = String::from("reflected values follow\n");
    for (i, value) in values.iter().enumerate() {
        for (label, text) in reflections(value) {
            body.push_str(&format!("{i}:{label}: <<{text}>>\n"));
            response = response.header(format!("x-echo-{i}-{label}"), text);
        }
    }
    body.push_str("end of reflection\n");
    let ce = query_param(req, "ce")
        .unwrap_or("identity")
        .replace("%2C", ",")
        .replace("%20", " ");
    let mut encoded = body.into_bytes();
    // Codings in the order they were applied, as `content-encoding` lists them.
    for coding in ce.split(',') {
        encoded = compress(&coding.trim().to_ascii_lowercase(), &encoded);
    }
    if ce != "identity" {
        response = response.header("content-encoding", ce.as_str());
    }
    let body = if query_param(req, "chunked") == Some("1") {
        chunked_body(encoded.chunks(7).map(Bytes::copy_from_slice).collect())
    } else {
        full_body(encoded)
    };
    response.body(body).expect("reflect response")
}

/// `body` compressed with content-coding `ce`; unknown codings leave it as it is.
pub fn compress(ce: &str, body: &[u8]) -> Vec<u8> {
    match ce {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(body).expect("gzip");
            e.finish().expect("gzip")
        }
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(body).expect("deflate");
            e.finish().expect("deflate")
        }
        "br" => {
            let mut out = Vec::new();
            {
                let mut e = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                e.write_all(body).expect("br");
            }
            out
        }
        _ => body.to_vec(),
    }
}

fn history_response(history: &[String]) -> Response<UpBody> {
    let mut response = Response::builder().header("content-type", "text/plain");
    let mut body = String::new();
    for (i, credential) in history.iter().enumerate() {
        body.push_str(&format!("{i}: {credential}\n"));
        response = response.header(format!("x-history-{i}"), credential.as_str());
    }
    response.body(full_body(body)).expect("history response")
}

fn sse(req: &Received, gate: Arc<Notify>) -> Response<UpBody> {
    let auth = req.header("authorization").unwrap_or_default().to_string();
    let (tx, body) = channel_body(8);
    tokio::spawn(async move {
        let event = |n: u32| Bytes::from(format!("data: {}\n\n", json!({"n": n, "auth": auth})));
        if tx.send(event(1)).await.is_err() {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), gate.notified()).await;
        let _ = tx.send(event(2)).await;
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    let content_type = query_param(req, "ct")
        .map(|ct| ct.replace("%2F", "/"))
        .unwrap_or_else(|| "text/event-stream".to_string());
    Response::builder()
        .header("content-type", content_type)
        .header("cache-control", "no-cache")
        .body(body)
        .expect("sse response")
}

fn known() -> Response<UpBody> {
    let mut body = String::new();
    for (var, value) in SECRET_ENV {
        body.push_str(&format!("{var} raw: {value}\n"));
        body.push_str(&format!("{var} base64: {}\n", STANDARD.encode(value)));
    }
    Response::builder()
        .header("content-type", "text/plain")
        .body(full_body(body))
        .expect("known response")
}

fn chat_completion(req: &Received) -> Response<UpBody> {
    let request: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let model = request["model"].as_str().unwrap_or("gpt-test").to_string();
    let auth = req.header("authorization").unwrap_or_default().to_string();
    let completion = json!({
        "id": "chatcmpl-latchkey-test",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": format!("you sent: {auth}")},
            "logprobs": null,
            "finish_reason": "stop",
        }],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    });
    let body = completion.to_string().into_bytes();
    let gzip = req
        .header("accept-encoding")
        .is_some_and(|ae| ae.contains("gzip"));
    let mut response = Response::builder()
        .header("content-type", "application/json")
        .header("x-echo-auth", auth.as_str());
    let body = if gzip {
        response = response.header("content-encoding", "gzip");
        compress("gzip", &body)
    } else {
        body
    };
    response.body(full_body(body)).expect("chat completion")
}

/// Size of one `/big` block.
pub const BIG_BLOCK: usize = 16 * 1024;

fn big(req: &Received) -> Response<UpBody> {
    let n: usize = query_param(req, "n")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let credential = credential_in(req).unwrap_or_default();
    let mut body = Vec::with_capacity(n * BIG_BLOCK);
    for i in 0..n {
        let mut block = vec![b'.'; BIG_BLOCK];
        // A different offset in every block, so occurrences fall across frame boundaries.
        let at = (i * 997) % (BIG_BLOCK - credential.len());
        block[at..at + credential.len()].copy_from_slice(credential.as_bytes());
        body.extend_from_slice(&block);
    }
    Response::builder()
        .header("content-type", "text/plain")
        .body(chunked_body(
            body.chunks(8191).map(Bytes::copy_from_slice).collect(),
        ))
        .expect("big response")
}

// ---------------------------------------------------------------------------------------------
// The world

/// What a policy may refer to: the upstream's port and a scratch directory for secret files and
/// helper scripts.
pub struct Setup {
    /// The HTTPS upstream's port (`PORT` in policies).
    pub port: u16,
    /// The plain HTTP upstream's port (`PLAIN_PORT` in policies).
    pub plain_port: u16,
    pub dir: PathBuf,
}

impl Setup {
    /// `policy` with `PLAIN_PORT` and `PORT` replaced by the upstreams' ports.
    pub fn ports(&self, policy: &str) -> String {
        policy
            .replace("PLAIN_PORT", &self.plain_port.to_string())
            .replace("PORT", &self.port.to_string())
    }
}

impl Setup {
    /// A path in the scratch directory, as a string for a policy.
    pub fn path(&self, name: &str) -> String {
        self.dir
            .join(name)
            .to_str()
            .expect("UTF-8 path")
            .to_string()
    }
}

pub struct SecretsWorld {
    pub lk: Latchkey,
    /// The HTTPS upstream ([`secrets_handler`]).
    pub upstream: Upstream,
    /// A plain HTTP upstream with the same routes.
    pub plain: Upstream,
    /// Kept for as long as the world lives: it signed the upstream's certificate.
    _ca: TestCa,
    /// Lets the `/sse` route send the rest of its events.
    pub gate: Arc<Notify>,
    /// The scratch directory of [`Setup`].
    pub dir: TempDir,
    /// `(name, value)` of every secret value this test used: what the sweep looks for.
    secrets: Mutex<Vec<(String, String)>>,
    /// Everything the sandbox side saw: responses, client output.
    seen: Mutex<Vec<(String, Vec<u8>)>>,
}

/// Starts the secrets upstream and latchkey with `env` in its environment (each value is also a
/// secret the sweep looks for) and `policy(setup)` as `main.toml`. `prepare` runs before latchkey
/// starts (to write secret files).
pub fn secrets_world(
    env: &[(&str, &str)],
    prepare: impl FnOnce(&Setup),
    policy: impl FnOnce(&Setup) -> String,
) -> SecretsWorld {
    let ca = TestCa::new();
    let gate = Arc::new(Notify::new());
    let upstream = Upstream::https_with(&ca, secrets_handler(gate.clone()));
    let plain = Upstream::http_with(secrets_handler(gate.clone()));
    let dir = tempfile::Builder::new()
        .prefix("latchkey-secrets")
        .tempdir()
        .expect("scratch dir for secrets");
    let setup = Setup {
        port: upstream.port(),
        plain_port: plain.port(),
        dir: dir.path().to_path_buf(),
    };
    prepare(&setup);
    let mut builder = latchkey()
        .upstream_ca(&ca)
        .policy("main.toml", &policy(&setup));
    for host in PINNED {
        builder = builder.pin(host);
    }
    let mut secrets = Vec::new();
    for (name, value) in env {
        builder = builder.env(name, value);
        secrets.push((name.to_string(), value.to_string()));
    }
    SecretsWorld {
        lk: builder.run(),
        upstream,
        plain,
        _ca: ca,
        gate,
        dir,
        secrets: Mutex::new(secrets),
        seen: Mutex::new(Vec::new()),
    }
}

/// The usual world: every [`SECRET_ENV`] variable in latchkey's environment, the `[secrets.*]`
/// of `names` ([`secrets_toml`]), and `rules` with the upstreams' ports ([`Setup::ports`]).
pub fn env_secrets_world(names: &[&str], rules: &str) -> SecretsWorld {
    secrets_world(
        SECRET_ENV,
        |_| {},
        |s| format!("{}{}", secrets_toml(names), s.ports(rules)),
    )
}

impl SecretsWorld {
    pub fn port(&self) -> u16 {
        self.upstream.port()
    }

    /// `https://HOST:PORT` of the upstream.
    pub fn url(&self, host: &str, path_and_query: &str) -> String {
        format!("https://{host}:{}{path_and_query}", self.port())
    }

    /// `http://HOST:PORT` of the plain HTTP upstream.
    pub fn plain_url(&self, host: &str, path_and_query: &str) -> String {
        format!("http://{host}:{}{path_and_query}", self.plain.port())
    }

    /// Adds a value the sweep must look for (a file or exec secret).
    pub fn track(&self, name: &str, value: &str) {
        self.secrets
            .lock()
            .expect("secrets")
            .push((name.to_string(), value.to_string()));
    }

    pub fn tracked(&self) -> Vec<(String, String)> {
        self.secrets.lock().expect("secrets").clone()
    }

    /// Records something the sandbox saw, for the sweep.
    pub fn saw(&self, what: &str, bytes: &[u8]) {
        self.seen
            .lock()
            .expect("seen")
            .push((what.to_string(), bytes.to_vec()));
    }

    pub fn saw_response(&self, what: &str, resp: &RawResponse) {
        self.saw(what, &response_bytes(resp));
    }

    /// Runs curl through latchkey (trusting only latchkey's CA) and records what it saw.
    pub fn curl(&self, args: &[&str]) -> CurlOutput {
        let out = curl(&self.lk).args(args.iter().copied()).run();
        let what = format!("the response to curl {args:?}");
        self.saw_response(&what, &out.response);
        self.saw(
            &format!("curl's stderr for {args:?}"),
            out.stderr.as_bytes(),
        );
        out
    }

    /// Runs curl and asserts it succeeded; returns the response.
    pub fn curl_ok(&self, args: &[&str]) -> RawResponse {
        let out = self.curl(args);
        out.ok().clone()
    }

    /// Runs a Python helper script from `tests/clients/` with `args`, latchkey's proxy URL and CA
    /// in the environment (`LATCHKEY_PROXY`, `LATCHKEY_CA`) plus `env`; returns its stdout after
    /// asserting it exited 0, and records its output.
    pub fn python(&self, script: &str, args: &[&str], env: &[(&str, &str)]) -> String {
        let path = format!("{}/tests/clients/{script}", env!("CARGO_MANIFEST_DIR"));
        let mut cmd = std::process::Command::new(toolchain::python());
        cmd.arg(&path).args(args);
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        cmd.env("LATCHKEY_PROXY", self.lk.proxy_url())
            .env("LATCHKEY_CA", self.lk.ca_pem_path());
        for (name, value) in env {
            cmd.env(name, value);
        }
        let out = wait_with_timeout(&mut cmd, Duration::from_secs(60));
        self.saw(&format!("{script} stdout"), out.stdout.as_bytes());
        self.saw(&format!("{script} stderr"), out.stderr.as_bytes());
        assert_eq!(out.code(), Some(0), "{script} failed: {out:#?}");
        out.stdout
    }

    /// The leak sweep: no tracked secret value, raw or encoded, in latchkey's stderr, stdout or
    /// audit file, nor in anything the sandbox saw.
    pub fn sweep(&self) {
        let secrets = self.tracked();
        assert_no_leak(
            "latchkey's stderr",
            self.lk.stderr_text().as_bytes(),
            &secrets,
        );
        assert_no_leak(
            "latchkey's stdout",
            self.lk.stdout_text().as_bytes(),
            &secrets,
        );
        assert_no_leak("the audit file", self.lk.audit_text().as_bytes(), &secrets);
        for (what, bytes) in self.seen.lock().expect("seen").iter() {
            assert_no_leak(what, bytes, &secrets);
        }
    }

    /// Requests the upstream received whose path starts with `prefix`.
    pub fn received(&self, prefix: &str) -> Vec<Received> {
        self.upstream
            .received()
            .into_iter()
            .filter(|r| r.path.starts_with(prefix))
            .collect()
    }

    /// The only request the upstream received whose path starts with `prefix`.
    pub fn received_one(&self, prefix: &str) -> Received {
        let mut all = self.received(prefix);
        assert_eq!(
            all.len(),
            1,
            "expected exactly one request to {prefix} upstream, got {all:#?}"
        );
        all.remove(0)
    }
}

/// Asserts a refusal by latchkey for a secrets reason (status, reason header, plain-text
/// sentence), without assuming its decision header.
pub fn assert_refusal(resp: &RawResponse, status: u16, reason: &str) {
    assert_eq!(resp.status, status, "status: {resp:#?}");
    assert_eq!(
        resp.header("x-latchkey-reason"),
        Some(reason),
        "x-latchkey-reason: {resp:#?}"
    );
    assert!(
        resp.text().starts_with("latchkey: "),
        "the refusal body is not latchkey's sentence: {resp:#?}"
    );
}

// ---------------------------------------------------------------------------------------------
// A streamed response, read as it arrives

/// A TLS connection to `authority` through latchkey (CONNECT, then a handshake trusting only
/// latchkey's CA, offering http/1.1 only).
pub fn tls_through(
    lk: &Latchkey,
    authority: &str,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let (mut tcp, resp) = connect_tunnel(lk.addr(), authority);
    assert_eq!(resp.status, 200, "CONNECT {authority}: {resp:#?}");
    let host = authority.split(':').next().expect("host");
    let config = tls_config(&lk.ca_pem_path(), &[b"http/1.1"]);
    let name = ServerName::try_from(host.to_string()).expect("server name");
    let mut conn = rustls::ClientConnection::new(config, name).expect("TLS client");
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp)
            .expect("TLS handshake with latchkey");
    }
    // Short reads, so StreamedResponse can check its deadline between them.
    tcp.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("read timeout");
    rustls::StreamOwned::new(conn, tcp)
}

enum Framing {
    Chunked(ChunkState),
    Length(usize),
    ToEof,
    Done,
}

enum ChunkState {
    Size,
    Data(usize),
    DataEnd,
    Trailers,
}

/// An HTTP/1.1 response read incrementally: [`StreamedResponse::read_until`] returns as soon
/// as the decoded body satisfies a predicate, so a test can tell what arrived before it let the
/// upstream continue.
pub struct StreamedResponse<S> {
    stream: S,
    raw: Vec<u8>,
    framing: Framing,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// The body decoded so far.
    pub body: Vec<u8>,
}

impl<S: Read> StreamedResponse<S> {
    /// Reads the response head (within `timeout`). The underlying socket must have a short read
    /// timeout (reads that time out are retried until the deadline).
    pub fn start(stream: S, timeout: Duration) -> Result<Self, String> {
        let mut this = StreamedResponse {
            stream,
            raw: Vec::new(),
            framing: Framing::ToEof,
            status: 0,
            headers: Vec::new(),
            body: Vec::new(),
        };
        let deadline = Instant::now() + timeout;
        let end = loop {
            if let Some(end) = this.raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            if !this.pump(deadline)? {
                return Err(format!(
                    "connection closed inside the response head: {:?}",
                    String::from_utf8_lossy(&this.raw)
                ));
            }
        };
        let head = String::from_utf8_lossy(&this.raw[..end]).into_owned();
        this.raw.drain(..end + 4);
        let mut lines = head.split("\r\n");
        this.status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line in {head:?}"))?;
        this.headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .collect();
        this.framing = if this
            .header("transfer-encoding")
            .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
        {
            Framing::Chunked(ChunkState::Size)
        } else if let Some(len) = this.header("content-length") {
            Framing::Length(len.parse().map_err(|_| "bad content-length".to_string())?)
        } else {
            Framing::ToEof
        };
        this.decode();
        Ok(this)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn is_done(&self) -> bool {
        matches!(self.framing, Framing::Done)
    }

    /// Reads until `done(body so far)` holds or the body ends; `Err` on timeout.
    pub fn read_until(
        &mut self,
        done: impl Fn(&[u8]) -> bool,
        timeout: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        while !done(&self.body) {
            if self.is_done() {
                return Err("the body ended first".into());
            }
            if !self.pump(deadline)? {
                self.framing = Framing::Done;
            }
            self.decode();
        }
        Ok(())
    }

    /// Reads the rest of the body.
    pub fn read_to_end(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        while !self.is_done() {
            if !self.pump(deadline)? {
                if let Framing::ToEof = self.framing {
                    self.framing = Framing::Done;
                    break;
                }
                return Err("connection closed before the end of the body".into());
            }
            self.decode();
        }
        Ok(())
    }

    /// One read into `raw`; `Ok(false)` at EOF, `Err` once `deadline` passes.
    fn pump(&mut self, deadline: Instant) -> Result<bool, String> {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.raw.extend_from_slice(&buf[..n]);
                    return Ok(true);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) =>
                {
                    if Instant::now() > deadline {
                        return Err("timed out".into());
                    }
                }
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(false),
                Err(e) => return Err(format!("read failed: {e}")),
            }
        }
    }

    /// Moves whatever `raw` holds of the body into `body`.
    fn decode(&mut self) {
        loop {
            match &mut self.framing {
                Framing::Done => return,
                Framing::ToEof => {
                    self.body.append(&mut self.raw);
                    return;
                }
                Framing::Length(left) => {
                    let n = (*left).min(self.raw.len());
                    self.body.extend(self.raw.drain(..n));
                    *left -= n;
                    if *left == 0 {
                        self.framing = Framing::Done;
                    }
                    return;
                }
                Framing::Chunked(state) => match state {
                    ChunkState::Size => {
                        let Some(end) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                            return;
                        };
                        let line = String::from_utf8_lossy(&self.raw[..end]).into_owned();
                        self.raw.drain(..end + 2);
                        let size = usize::from_str_radix(
                            line.split(';').next().unwrap_or_default().trim(),
                            16,
                        )
                        .unwrap_or_else(|_| panic!("bad chunk size line {line:?}"));
                        *state = if size == 0 {
                            ChunkState::Trailers
                        } else {
                            ChunkState::Data(size)
                        };
                    }
                    ChunkState::Data(left) => {
                        if self.raw.is_empty() {
                            return;
                        }
                        let n = (*left).min(self.raw.len());
                        self.body.extend(self.raw.drain(..n));
                        *left -= n;
                        if *left == 0 {
                            *state = ChunkState::DataEnd;
                        }
                    }
                    ChunkState::DataEnd => {
                        if self.raw.len() < 2 {
                            return;
                        }
                        self.raw.drain(..2);
                        *state = ChunkState::Size;
                    }
                    ChunkState::Trailers => {
                        let Some(end) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                            return;
                        };
                        self.raw.drain(..end + 2);
                        if end == 0 {
                            self.framing = Framing::Done;
                        }
                    }
                },
            }
        }
    }
}

/// The `[REDACTED:NAME]` marker.
pub fn redacted(name: &str) -> String {
    format!("[REDACTED:{name}]")
}

/// The `redactions` of an audit record, as a number.
pub fn redactions_of(record: &Value) -> u64 {
    record["redactions"]
        .as_u64()
        .unwrap_or_else(|| panic!("redactions is not a count: {record:#}"))
}

//! Support for the credential-minting tests: independent verifiers written in Python, test keys,
//! and a world that records everything the sandbox saw for the leak sweep.
//!
//! - [`PyServer`]: `tests/clients/verify_sigv4.py` (checks SigV4 with botocore) or
//!   `tests/clients/fake_issuers.py` (GitHub App / Google / OAuth2 token endpoints and APIs that
//!   check the tokens, JWTs verified with PyJWT), as an HTTPS server on `127.0.0.1:0` with a
//!   certificate from the test CA for [`CRED_HOSTS`]. Each prints one JSON event per request,
//!   collected by [`PyServer::events`].
//! - [`Bench`]: the test CA, a scratch dir (keys, certificates), the Rust echo upstream (for
//!   [`UPSTREAM_NAMES`](super::ca::UPSTREAM_NAMES)), and the secret values the sweep looks for;
//!   [`Bench::start`] runs latchkey with every test name pinned.
//! - [`CredWorld`]: latchkey plus the bench; clients run through it are recorded, and
//!   [`CredWorld::sweep`] checks that no key, secret, JWT or minted token appears in latchkey's
//!   output, its audit file or anything the sandbox saw.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use rustls_pki_types::ServerName;
use serde_json::Value;
use tempfile::TempDir;

use super::clients::{connect_tunnel, curl, read_response, tls_config, CurlOutput, RawResponse};
use super::latchkey::{latchkey, wait_with_timeout, Latchkey, SCRUBBED_ENV};
use super::secrets::{assert_no_leak, response_bytes};
use super::toolchain;
use super::{TestCa, Upstream, PINNED};

/// Names the Python verifiers' certificate covers; latchkey pins every one to 127.0.0.1.
pub const CRED_HOSTS: &[&str] = &[
    "s3.test",
    "dynamodb.test",
    "bucket.s3.us-west-2.amazonaws.com",
    "dynamodb.eu-west-1.amazonaws.com",
    "gh-api.test",
    "github.test",
    "oauth.test",
    "jwt.test",
    "jwt-es.test",
    "apigw.test",
    "sts.test",
    "localhost",
];

fn script(name: &str) -> String {
    format!("{}/tests/clients/{name}", env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------------------------
// Python verifier servers

/// A Python HTTPS server from `tests/clients/`, killed (by its own PID) on drop.
pub struct PyServer {
    name: String,
    child: Child,
    port: u16,
    events: Arc<Mutex<Vec<Value>>>,
    stderr: Arc<Mutex<String>>,
}

impl PyServer {
    /// Starts `tests/clients/SCRIPT --tls CERT KEY` with `env`, waits for its
    /// `listening on 127.0.0.1:PORT` line, then collects its JSON event lines.
    pub fn start(script_name: &str, cert: &Path, key: &Path, env: &[(&str, &str)]) -> PyServer {
        let mut cmd = Command::new(toolchain::python());
        cmd.arg(script(script_name))
            .arg("--tls")
            .arg(cert)
            .arg(key)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        for (name, value) in env {
            cmd.env(name, value);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!("spawn {} {script_name}: {e}", toolchain::python().display())
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let pipe = child.stderr.take().expect("stderr pipe");
        thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut text = sink.lock().expect("stderr buffer");
                text.push_str(&line);
                text.push('\n');
            }
        });
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let pipe = child.stdout.take().expect("stdout pipe");
        thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if let Some(port) = line.strip_prefix("listening on 127.0.0.1:") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(port.trim().parse::<u16>().expect("port"));
                    }
                    continue;
                }
                match serde_json::from_str::<Value>(&line) {
                    Ok(v) => sink.lock().expect("events").push(v),
                    Err(_) => eprintln!("verifier printed a non-JSON line: {line}"),
                }
            }
        });
        let port = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(port) => port,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                thread::sleep(Duration::from_millis(100));
                panic!(
                    "{script_name} did not start listening (are botocore, PyJWT and cryptography \
                     installed?):\n{}",
                    stderr.lock().expect("stderr")
                );
            }
        };
        PyServer {
            name: script_name.to_string(),
            child,
            port,
            events,
            stderr,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<Value> {
        self.events.lock().expect("events").clone()
    }

    /// Events whose `event` field is `kind`, in order.
    pub fn events_of(&self, kind: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == kind)
            .collect()
    }

    /// Waits up to 10 s for `n` events of `kind` and returns them all (maybe more than `n`).
    pub fn wait_events(&self, kind: &str, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let events = self.events_of(kind);
            if events.len() >= n {
                return events;
            }
            assert!(
                Instant::now() < deadline,
                "{} printed {} {kind:?} events, expected {n}: {events:#?}\nstderr:\n{}",
                self.name,
                events.len(),
                self.stderr_text()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to 10 s for `n` events of `kind` that `matches` (the process prints them as
    /// it answers, so they may trail the answer a little), and returns those.
    pub fn wait_events_where(
        &self,
        kind: &str,
        n: usize,
        matches: impl Fn(&Value) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let events: Vec<Value> = self.events_of(kind).into_iter().filter(&matches).collect();
            if events.len() >= n || Instant::now() >= deadline {
                return events;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.lock().expect("stderr").clone()
    }
}

impl Drop for PyServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Keys and certificates

use super::ca::pem;

/// Stands for the private key's path in the arguments given to `Bench::key_pair`.
const OUT: &str = "{private key file}";

/// A private key file and its public key file (PEM), made with the openssl CLI.
pub struct KeyFiles {
    pub private: PathBuf,
    pub public: PathBuf,
    /// The private key PEM.
    pub pem: String,
}

fn openssl(args: &[&str]) {
    let out = wait_with_timeout(
        Command::new(toolchain::tool("openssl")).args(args),
        Duration::from_secs(60),
    );
    assert_eq!(out.code(), Some(0), "openssl {args:?} failed: {out:#?}");
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

// ---------------------------------------------------------------------------------------------
// The bench: what exists before latchkey starts

pub struct Bench {
    pub ca: TestCa,
    pub dir: TempDir,
    /// The Rust echo upstream (api.test, other.test, tunnel.test, *.wild.test).
    pub echo: Upstream,
    cert: PathBuf,
    key: PathBuf,
    secrets: Vec<(String, String)>,
    /// Start latchkey with the address guard at its defaults (loopback refused).
    guarded: bool,
}

impl Default for Bench {
    fn default() -> Self {
        Self::new()
    }
}

impl Bench {
    pub fn new() -> Bench {
        let ca = TestCa::new();
        let echo = Upstream::https(&ca);
        let dir = tempfile::Builder::new()
            .prefix("latchkey-credentials")
            .tempdir()
            .expect("scratch dir");
        let (chain, key) = ca.issue(CRED_HOSTS);
        let cert = dir.path().join("verifier-cert.pem");
        let key_path = dir.path().join("verifier-key.pem");
        std::fs::write(&cert, pem("CERTIFICATE", &chain[0])).expect("write verifier cert");
        std::fs::write(&key_path, pem("PRIVATE KEY", key.secret_der())).expect("write key");
        Bench {
            ca,
            dir,
            echo,
            cert,
            key: key_path,
            secrets: Vec::new(),
            guarded: false,
        }
    }

    /// Latchkey will run with the address guard at its defaults: no `--allow-private` for
    /// loopback, so neither the upstreams nor the token endpoints here are reachable.
    pub fn guarded(mut self) -> Self {
        self.guarded = true;
        self
    }

    /// A path in the scratch dir.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts a verifier script with a certificate for [`CRED_HOSTS`].
    pub fn server(&self, script_name: &str, env: &[(&str, &str)]) -> PyServer {
        PyServer::start(script_name, &self.cert, &self.key, env)
    }

    /// A 2048-bit RSA key: PKCS#1 (`BEGIN RSA PRIVATE KEY`, as GitHub hands out) or PKCS#8
    /// (`BEGIN PRIVATE KEY`, as in a Google service-account JSON). Tracked for the sweep.
    pub fn rsa_key(&mut self, name: &str, pkcs1: bool) -> KeyFiles {
        if pkcs1 {
            self.key_pair(name, &["genrsa", "-traditional", "-out", OUT, "2048"])
        } else {
            self.key_pair(
                name,
                &[
                    "genpkey",
                    "-algorithm",
                    "RSA",
                    "-pkeyopt",
                    "rsa_keygen_bits:2048",
                    "-out",
                    OUT,
                ],
            )
        }
    }

    /// An Ed25519 key (PKCS#8). Tracked for the sweep.
    pub fn ed_key(&mut self, name: &str) -> KeyFiles {
        self.key_pair(name, &["genpkey", "-algorithm", "ed25519", "-out", OUT])
    }

    /// A P-256 key (PKCS#8). Tracked for the sweep.
    pub fn ec_key(&mut self, name: &str) -> KeyFiles {
        self.key_pair(
            name,
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                OUT,
            ],
        )
    }

    /// Runs `openssl generate…` with [`OUT`] standing for the private key file, then writes the
    /// public key beside it.
    fn key_pair(&mut self, name: &str, generate: &[&str]) -> KeyFiles {
        let private = self.path(&format!("{name}.pem"));
        let public = self.path(&format!("{name}.pub.pem"));
        let args: Vec<&str> = generate
            .iter()
            .map(|a| if *a == OUT { path_str(&private) } else { *a })
            .collect();
        openssl(&args);
        openssl(&[
            "pkey",
            "-in",
            path_str(&private),
            "-pubout",
            "-out",
            path_str(&public),
        ]);
        self.key_files(name, private, public)
    }

    fn key_files(&mut self, name: &str, private: PathBuf, public: PathBuf) -> KeyFiles {
        let pem = std::fs::read_to_string(&private).expect("read private key");
        self.track_pem(name, &pem);
        KeyFiles {
            private,
            public,
            pem,
        }
    }

    /// Tracks a value for the leak sweep.
    pub fn track(&mut self, name: &str, value: &str) {
        self.secrets.push((name.to_string(), value.to_string()));
    }

    /// Tracks a PEM private key: the whole text and each base64 line of its body (a partial
    /// leak shows up too).
    pub fn track_pem(&mut self, name: &str, pem: &str) {
        self.track(name, pem);
        for (i, line) in pem.lines().enumerate() {
            if !line.starts_with("-----") && line.len() >= 40 {
                self.track(&format!("{name} line {i}"), line);
            }
        }
    }

    /// Starts latchkey trusting the test CA, with [`PINNED`] and [`CRED_HOSTS`] pinned to
    /// 127.0.0.1, `policy` as `main.toml` and `env` in its environment (each value tracked).
    pub fn start(self, policy: &str, env: &[(&str, &str)]) -> CredWorld {
        self.start_with(policy, env, &[])
    }

    /// [`Bench::start`] with `public` also in latchkey's environment but not tracked (values that
    /// are not secret, such as an AWS access key id).
    pub fn start_with(
        mut self,
        policy: &str,
        env: &[(&str, &str)],
        public: &[(&str, &str)],
    ) -> CredWorld {
        let mut builder = latchkey().upstream_ca(&self.ca).policy("main.toml", policy);
        for host in PINNED.iter().chain(CRED_HOSTS) {
            builder = builder.pin(host);
        }
        if self.guarded {
            builder = builder.guarded();
        }
        for (name, value) in env {
            builder = builder.env(name, value);
            self.track(name, value);
        }
        for (name, value) in public {
            builder = builder.env(name, value);
        }
        CredWorld {
            lk: builder.run(),
            bench: self,
            seen: Mutex::new(Vec::new()),
            extra: Mutex::new(Vec::new()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The world

pub struct CredWorld {
    pub lk: Latchkey,
    pub bench: Bench,
    /// Everything the sandbox side saw: responses, client output.
    seen: Mutex<Vec<(String, Vec<u8>)>>,
    /// Values tracked after start (minted tokens, JWTs).
    extra: Mutex<Vec<(String, String)>>,
}

impl CredWorld {
    /// The Rust echo upstream's port.
    pub fn echo_port(&self) -> u16 {
        self.bench.echo.port()
    }

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
        self.saw_response(&format!("the response to curl {args:?}"), &out.response);
        self.saw(
            &format!("curl's stderr for {args:?}"),
            out.stderr.as_bytes(),
        );
        out
    }

    /// Runs curl and asserts it succeeded (whatever the status); returns the response.
    pub fn curl_ok(&self, args: &[&str]) -> RawResponse {
        self.curl(args).ok().clone()
    }

    /// Runs `tests/clients/SCRIPT ARGS` with `LATCHKEY_PROXY` and `LATCHKEY_CA` (latchkey's) plus
    /// `env`; asserts it exited 0, records its output, returns its stdout.
    pub fn python(&self, script_name: &str, args: &[&str], env: &[(&str, &str)]) -> String {
        let mut cmd = Command::new(toolchain::python());
        cmd.arg(script(script_name)).args(args);
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        cmd.env("LATCHKEY_PROXY", self.lk.proxy_url())
            .env("LATCHKEY_CA", self.lk.ca_pem_path());
        for (name, value) in env {
            cmd.env(name, value);
        }
        let out = wait_with_timeout(&mut cmd, Duration::from_secs(60));
        self.saw(&format!("{script_name} stdout"), out.stdout.as_bytes());
        self.saw(&format!("{script_name} stderr"), out.stderr.as_bytes());
        assert_eq!(out.code(), Some(0), "{script_name} failed: {out:#?}");
        out.stdout
    }

    /// Runs a real `git` through latchkey (`HTTPS_PROXY`, `GIT_SSL_CAINFO` = latchkey's CA, no
    /// user config, no prompts); returns (exit code, stdout, stderr), recorded.
    pub fn git(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let home = self.bench.path("git-home");
        std::fs::create_dir_all(&home).expect("git home");
        let mut cmd = Command::new(toolchain::tool("git"));
        cmd.args(args);
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        cmd.env("HOME", &home)
            .env("XDG_CONFIG_HOME", &home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_ASKPASS", "/bin/false")
            .env("HTTPS_PROXY", self.lk.proxy_url())
            .env("GIT_SSL_CAINFO", self.lk.ca_pem_path());
        let out = wait_with_timeout(&mut cmd, Duration::from_secs(60));
        self.saw(&format!("git {args:?} stdout"), out.stdout.as_bytes());
        self.saw(&format!("git {args:?} stderr"), out.stderr.as_bytes());
        (out.code(), out.stdout, out.stderr)
    }

    /// `n` GET requests for `path` to `authority` through latchkey, each on its own intercepted
    /// connection, sent at the same moment (after every TLS handshake is done). Recorded.
    pub fn concurrent_gets(&self, authority: &str, path: &str, n: usize) -> Vec<RawResponse> {
        let barrier = Arc::new(Barrier::new(n));
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let barrier = barrier.clone();
                let proxy = self.lk.addr();
                let ca = self.lk.ca_pem_path();
                let authority = authority.to_string();
                let path = path.to_string();
                thread::spawn(move || {
                    let (mut tcp, resp) = connect_tunnel(proxy, &authority);
                    assert_eq!(resp.status, 200, "CONNECT {authority}: {resp:#?}");
                    tcp.set_read_timeout(Some(Duration::from_secs(30)))
                        .expect("read timeout");
                    let host = authority.split(':').next().expect("host").to_string();
                    let config = tls_config(&ca, &[b"http/1.1"]);
                    let name = ServerName::try_from(host).expect("server name");
                    let mut conn = rustls::ClientConnection::new(config, name).expect("TLS");
                    while conn.is_handshaking() {
                        conn.complete_io(&mut tcp).expect("TLS handshake");
                    }
                    let mut tls = rustls::StreamOwned::new(conn, tcp);
                    barrier.wait();
                    write!(
                        tls,
                        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: concurrent\r\n\
                         Connection: close\r\n\r\n"
                    )
                    .expect("send request");
                    tls.flush().expect("flush");
                    read_response(&mut tls, false).expect("read response")
                })
            })
            .collect();
        let responses: Vec<RawResponse> = handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect();
        for (i, resp) in responses.iter().enumerate() {
            self.saw_response(&format!("concurrent response {i}"), resp);
        }
        responses
    }

    /// Tracks a value found after start (a minted token, a JWT).
    pub fn track(&self, name: &str, value: &str) {
        if !value.is_empty() {
            self.extra
                .lock()
                .expect("extra")
                .push((name.to_string(), value.to_string()));
        }
    }

    /// Tracks every token a verifier minted or was presented (`minted`, `presented` fields).
    pub fn track_events(&self, server: &PyServer) {
        for (i, event) in server.events().iter().enumerate() {
            for field in ["minted", "presented", "minted_refresh"] {
                let values = match &event[field] {
                    Value::Array(list) => list.iter().filter_map(Value::as_str).collect(),
                    v => v.as_str().into_iter().collect::<Vec<_>>(),
                };
                for value in values {
                    self.track(&format!("{} {field} #{i}", event["event"]), value);
                }
            }
        }
    }

    pub fn tracked(&self) -> Vec<(String, String)> {
        let mut all = self.bench.secrets.clone();
        all.extend(self.extra.lock().expect("extra").iter().cloned());
        all
    }

    /// The leak sweep: no tracked value, raw or encoded, in latchkey's stderr, stdout or audit
    /// file, nor in anything the sandbox saw.
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
}

/// The audit records whose `rule` is `rule`.
pub fn records_of<'a>(records: &'a [Value], rule: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["rule"] == rule).collect()
}

/// Whether an audit record's `secrets` lists `name`.
pub fn lists_secret(record: &Value, name: &str) -> bool {
    record["secrets"]
        .as_array()
        .is_some_and(|s| s.iter().any(|v| v == name))
}

/// `x-access-token:TOKEN` as a Basic credential.
pub fn basic_x_access_token(token: &str) -> String {
    format!(
        "Basic {}",
        STANDARD.encode(format!("x-access-token:{token}"))
    )
}

/// Lower-case hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Waits up to 5 s for at least `n` audit records and returns them all (for clients such as git
/// whose number of requests is theirs to choose).
pub fn audit_at_least(lk: &Latchkey, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let records = lk.audit_records();
        if records.len() >= n {
            return records;
        }
        assert!(
            Instant::now() < deadline,
            "expected at least {n} audit records, found {records:#?}\nstderr:\n{}",
            lk.stderr_text()
        );
        thread::sleep(Duration::from_millis(25));
    }
}

/// The single audit record for rule `rule`, with the others for context if there is not one.
pub fn only_record<'a>(records: &'a [Value], rule: &str) -> &'a Value {
    let found = records_of(records, rule);
    assert_eq!(
        found.len(),
        1,
        "expected exactly one audit record with rule {rule:?}: {records:#?}"
    );
    found[0]
}

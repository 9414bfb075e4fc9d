//! The binary under test: `latchkey serve` as a child process, and one-shot CLI runs.
//!
//! `latchkey()` writes policies into a temp dir and spawns
//! `latchkey serve --policies DIR --listen 127.0.0.1:0 --ca-dir DIR --audit PATH`, then waits for
//! the stderr line `latchkey: proxy listening on 127.0.0.1:PORT`. Stderr and stdout keep being
//! drained into buffers (`stderr_text`, `stdout_text`). The child gets this process's environment
//! minus [`SCRUBBED_ENV`], plus what the test sets with `.env(..)` (secrets sourced from `env:`).
//! The child is killed when the handle drops.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use super::ca::TestCa;
use super::toolchain;

pub const BIN: &str = env!("CARGO_BIN_EXE_latchkey");

const LISTENING: &str = "latchkey: proxy listening on ";

/// Environment variables of this machine that would change what latchkey or a client does.
pub const SCRUBBED_ENV: &[&str] = &[
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
];

pub fn latchkey() -> LatchkeyBuilder {
    LatchkeyBuilder {
        policies: Vec::new(),
        pins: Vec::new(),
        upstream_ca: None,
        env: Vec::new(),
        allow_loopback: true,
        resolves: Vec::new(),
        args: Vec::new(),
        listen: None,
        netns: None,
        audit: None,
        no_capabilities: false,
    }
}

pub struct LatchkeyBuilder {
    policies: Vec<(String, String)>,
    pins: Vec<String>,
    upstream_ca: Option<PathBuf>,
    /// `(name, Some(value))` sets a variable in latchkey's environment, `(name, None)` removes it.
    env: Vec<(String, Option<String>)>,
    /// Test upstreams live on loopback, which the address guard refuses: open 127.0.0.0/8 the
    /// way an operator opens an internal range, unless a test checks the guard itself.
    allow_loopback: bool,
    /// `--resolve host=ip` pins to addresses other than 127.0.0.1.
    resolves: Vec<(String, String)>,
    /// Extra command-line arguments.
    args: Vec<String>,
    /// `--listen` other than `127.0.0.1:0`.
    listen: Option<String>,
    /// Run inside this network namespace (`ip netns exec NAME latchkey serve ...`).
    netns: Option<String>,
    /// `--audit` other than `audit.jsonl` in the scratch directory.
    audit: Option<PathBuf>,
    /// Run under `setpriv` with every capability dropped.
    no_capabilities: bool,
}

impl LatchkeyBuilder {
    /// Sets `name=value` in latchkey's environment (for `env:` secret sources).
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), Some(value.to_string())));
        self
    }

    /// Makes sure `name` is not in latchkey's environment.
    pub fn env_remove(mut self, name: &str) -> Self {
        self.env.push((name.to_string(), None));
        self
    }

    /// Adds a policy file `name` (e.g. `"main.toml"`) with `contents`.
    pub fn policy(mut self, name: &str, contents: &str) -> Self {
        self.policies.push((name.to_string(), contents.to_string()));
        self
    }

    /// Runs without `--allow-private 127.0.0.0/8`: the address guard at its defaults.
    pub fn guarded(mut self) -> Self {
        self.allow_loopback = false;
        self
    }

    /// Pins `host` to `ip` (`--resolve host=ip`).
    pub fn resolve(mut self, host: &str, ip: &str) -> Self {
        self.resolves.push((host.to_string(), ip.to_string()));
        self
    }

    /// Adds command-line arguments to `serve`.
    /// Writes the audit log to `path` instead of the scratch directory's `audit.jsonl`.
    pub fn audit_to(mut self, path: &Path) -> Self {
        self.audit = Some(path.to_path_buf());
        self
    }

    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }

    /// Listens on `addr` (`--listen`) instead of `127.0.0.1:0`.
    pub fn listen(mut self, addr: &str) -> Self {
        self.listen = Some(addr.to_string());
        self
    }

    /// Runs latchkey inside the network namespace `name` (`ip netns exec NAME latchkey ...`);
    /// its listener is then reachable only from inside that namespace's network.
    pub fn netns(mut self, name: &str) -> Self {
        self.netns = Some(name.to_string());
        self
    }

    /// Runs latchkey with no capability at all (`setpriv --bounding-set -all`: this uid, but
    /// none of root's privileges), as a systemd unit with an empty `CapabilityBoundingSet=`.
    pub fn without_capabilities(mut self) -> Self {
        self.no_capabilities = true;
        self
    }

    /// Pins `host` to 127.0.0.1 (`--resolve host=127.0.0.1`).
    pub fn pin(mut self, host: &str) -> Self {
        self.pins.push(host.to_string());
        self
    }

    /// Trusts `ca` for upstream TLS (`--upstream-ca`).
    pub fn upstream_ca(mut self, ca: &TestCa) -> Self {
        self.upstream_ca = Some(ca.pem_path());
        self
    }

    fn prepare(&self) -> (TempDir, Command) {
        let dir = tempfile::Builder::new()
            .prefix("latchkey-it")
            .tempdir()
            .expect("temp dir for latchkey");
        let policies = dir.path().join("policies");
        std::fs::create_dir(&policies).expect("create policies dir");
        for (name, contents) in &self.policies {
            std::fs::write(policies.join(name), contents).expect("write policy file");
        }
        // As a systemd unit with an empty `CapabilityBoundingSet=`: this uid, none of root's
        // privileges (setpriv execs latchkey, so the child's PID is latchkey's).
        let setpriv = self.no_capabilities.then(|| {
            (
                toolchain::tool("setpriv"),
                [
                    "--bounding-set",
                    "-all",
                    "--inh-caps",
                    "-all",
                    "--ambient-caps",
                    "-all",
                    "--no-new-privs",
                    "--",
                    BIN,
                ],
            )
        });
        let mut cmd = match (&self.netns, setpriv) {
            (Some(ns), wrap) => {
                let mut cmd = Command::new(toolchain::tool("ip"));
                cmd.args(["netns", "exec", ns.as_str()]);
                match wrap {
                    Some((program, args)) => cmd.arg(program).args(args),
                    None => cmd.arg(BIN),
                };
                cmd
            }
            (None, Some((program, args))) => {
                let mut cmd = Command::new(program);
                cmd.args(args);
                cmd
            }
            (None, None) => Command::new(BIN),
        };
        cmd.arg("serve")
            .arg("--policies")
            .arg(&policies)
            .arg("--listen")
            .arg(self.listen.as_deref().unwrap_or("127.0.0.1:0"))
            .arg("--ca-dir")
            .arg(dir.path().join("ca"))
            .arg("--audit")
            .arg(
                self.audit
                    .clone()
                    .unwrap_or_else(|| dir.path().join("audit.jsonl")),
            );
        if let Some(ca) = &self.upstream_ca {
            cmd.arg("--upstream-ca").arg(ca);
        }
        for host in &self.pins {
            cmd.arg("--resolve").arg(format!("{host}=127.0.0.1"));
        }
        for (host, ip) in &self.resolves {
            cmd.arg("--resolve").arg(format!("{host}={ip}"));
        }
        if self.allow_loopback {
            cmd.arg("--allow-private").arg("127.0.0.0/8");
        }
        cmd.args(&self.args);
        // Tests run many latchkeys at once: never the fixed default admin port.
        if !self.args.iter().any(|a| a == "--admin") {
            cmd.arg("--admin").arg("127.0.0.1:0");
        }
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        for (name, value) in &self.env {
            match value {
                Some(value) => cmd.env(name, value),
                None => cmd.env_remove(name),
            };
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        (dir, cmd)
    }

    /// Spawns `latchkey serve` and waits until it is listening.
    pub fn run(self) -> Latchkey {
        let (dir, mut cmd) = self.prepare();
        let listen_ip = self.listen.as_deref().map(|addr| {
            addr.parse::<SocketAddr>()
                .unwrap_or_else(|e| panic!("--listen {addr:?} is not ip:port: {e}"))
                .ip()
        });
        let mut child = cmd.spawn().expect("spawn latchkey serve");
        let stderr = child.stderr.take().expect("latchkey stderr pipe");
        let stdout_buffer = Arc::new(Mutex::new(String::new()));
        let stdout = child.stdout.take().expect("latchkey stdout pipe");
        let stdout_sink = stdout_buffer.clone();
        thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = Vec::new();
            while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                stdout_sink
                    .lock()
                    .expect("stdout buffer")
                    .push_str(&String::from_utf8_lossy(&line));
                line.clear();
            }
        });
        let buffer = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = buffer.clone();
        thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.trim_end().strip_prefix(LISTENING) {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr.to_string());
                    }
                }
                let mut text = sink.lock().expect("stderr buffer");
                text.push_str(&line);
                text.push('\n');
            }
        });
        let deadline = Instant::now() + Duration::from_secs(15);
        let addr = loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(addr) => break addr,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = child.wait();
                    panic!(
                        "latchkey serve exited before listening:\n{}",
                        buffer.lock().expect("stderr buffer")
                    );
                }
            }
            if let Ok(Some(status)) = child.try_wait() {
                // Give the reader thread a moment to collect the last lines.
                thread::sleep(Duration::from_millis(100));
                panic!(
                    "latchkey serve exited ({status}) before listening:\n{}",
                    buffer.lock().expect("stderr buffer")
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "latchkey serve did not print {LISTENING:?} within 15 s:\n{}",
                    buffer.lock().expect("stderr buffer")
                );
            }
        };
        let proxy: SocketAddr = addr
            .parse()
            .unwrap_or_else(|e| panic!("listening address {addr:?} is not ip:port: {e}"));
        match listen_ip {
            Some(ip) => assert!(
                ip.is_unspecified() || proxy.ip() == ip,
                "latchkey listens on {proxy}, not on {ip}"
            ),
            None => assert!(
                proxy.ip().is_loopback(),
                "latchkey listens on {proxy}, not on loopback"
            ),
        }
        Latchkey {
            dir,
            child,
            proxy,
            stderr: buffer,
            stdout: stdout_buffer,
        }
    }

    /// Spawns `latchkey serve` expecting it to refuse to start; returns its exit status and
    /// stderr. Panics if it starts listening.
    pub fn run_expecting_failure(self) -> CliOutput {
        let (_dir, mut cmd) = self.prepare();
        let out = wait_with_timeout(&mut cmd, Duration::from_secs(15));
        assert!(
            !out.stderr.contains(LISTENING),
            "latchkey serve started listening on an invalid policy:\n{}",
            out.stderr
        );
        out
    }
}

pub struct Latchkey {
    dir: TempDir,
    child: Child,
    proxy: SocketAddr,
    stderr: Arc<Mutex<String>>,
    stdout: Arc<Mutex<String>>,
}

impl Latchkey {
    /// The proxy listener address.
    pub fn addr(&self) -> SocketAddr {
        self.proxy
    }

    /// `http://127.0.0.1:PORT`
    pub fn proxy_url(&self) -> String {
        format!("http://{}", self.proxy)
    }

    /// latchkey's CA certificate (`--ca-dir`/latchkey-ca.pem), created on startup.
    pub fn ca_pem_path(&self) -> PathBuf {
        self.dir.path().join("ca").join("latchkey-ca.pem")
    }

    pub fn ca_dir(&self) -> PathBuf {
        self.dir.path().join("ca")
    }

    /// A scratch directory that lives as long as this handle.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// Everything latchkey wrote to stderr so far.
    pub fn stderr_text(&self) -> String {
        self.stderr.lock().expect("stderr buffer").clone()
    }

    /// Everything latchkey wrote to stdout so far.
    pub fn stdout_text(&self) -> String {
        self.stdout.lock().expect("stdout buffer").clone()
    }

    /// The audit file as written so far, unparsed.
    /// The admin API address, from the `latchkey: admin listening on ADDR` line (waits 5 s).
    pub fn admin_addr(&self) -> SocketAddr {
        const ADMIN: &str = "latchkey: admin listening on ";
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(addr) = self
                .stderr_text()
                .lines()
                .find_map(|l| l.trim_end().strip_prefix(ADMIN).map(str::to_string))
            {
                return addr.parse().expect("admin address");
            }
            assert!(
                Instant::now() < deadline,
                "no admin line in stderr:\n{}",
                self.stderr_text()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn audit_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("audit.jsonl")).unwrap_or_default()
    }

    /// Waits up to `timeout` for stderr to contain `needle`; returns whether it did.
    pub fn wait_stderr_contains(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.stderr_text().contains(needle) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(25));
        }
    }

    /// Every whole audit line written so far (records of both phases and checkpoints), each
    /// parsed, its hash-chain link checked, and records checked against the schema.
    pub fn audit_lines(&self) -> Vec<Value> {
        let path = self.dir.path().join("audit.jsonl");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        super::audit::chained_lines(&text).unwrap_or_else(|problem| {
            panic!(
                "the audit log breaks its schema or chain: {problem}\nstderr:\n{}",
                self.stderr_text()
            )
        })
    }

    /// The request records written so far: one per request (its `outcome`), in order.
    /// Decision records (written before the upstream is dialed) and checkpoints are left out;
    /// [`Self::decision_records`] and [`Self::audit_lines`] have them.
    pub fn audit_records(&self) -> Vec<Value> {
        self.audit_lines()
            .into_iter()
            .filter(|l| l["phase"] == "outcome")
            .collect()
    }

    /// The decision records written so far.
    pub fn decision_records(&self) -> Vec<Value> {
        self.audit_lines()
            .into_iter()
            .filter(|l| l["phase"] == "decision")
            .collect()
    }

    /// Waits (up to 5 s) for `n` audit records, then checks that no extra record follows and that
    /// the file holds only whole lines. Returns the records.
    pub fn wait_audit(&self, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let records = self.audit_records();
            if records.len() >= n {
                break;
            }
            if Instant::now() > deadline {
                panic!(
                    "expected {n} audit records within 5 s, found {}: {records:#?}\nstderr:\n{}",
                    records.len(),
                    self.stderr_text()
                );
            }
            thread::sleep(Duration::from_millis(25));
        }
        // Exactly one record per request: give a duplicate the chance to show up.
        thread::sleep(Duration::from_millis(150));
        let records = self.audit_records();
        assert_eq!(
            records.len(),
            n,
            "expected exactly {n} audit records, found: {records:#?}"
        );
        let text =
            std::fs::read_to_string(self.dir.path().join("audit.jsonl")).expect("read audit file");
        assert!(
            text.ends_with('\n'),
            "audit file ends in a torn line: {text:?}"
        );
        records
    }
}

/// The process itself, for signal tests (reload on SIGHUP, graceful shutdown on SIGTERM/SIGINT).
impl Latchkey {
    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`"TERM"`, `"HUP"`, `"INT"`) to latchkey with `kill -SIGNAL PID`.
    pub fn signal(&self, signal: &str) {
        let status = Command::new(toolchain::tool("kill"))
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {} failed", self.pid());
    }

    /// Waits up to `timeout` for latchkey to exit; `None` if it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll latchkey") {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Latchkey {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The result of a one-shot process run.
#[derive(Debug)]
pub struct CliOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl CliOutput {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// Runs `latchkey ARGS...` to completion (at most 20 s).
pub fn run_cli<I, S>(args: I) -> CliOutput
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    wait_with_timeout(&mut cmd, Duration::from_secs(20))
}

/// A temp dir holding policy files, for `check` and `explain`.
pub fn policy_dir(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix("latchkey-policies")
        .tempdir()
        .expect("temp policy dir");
    for (name, contents) in files {
        std::fs::write(dir.path().join(name), contents).expect("write policy file");
    }
    dir
}

/// Runs `cmd` with stdout and stderr captured, killing it after `timeout`.
pub fn wait_with_timeout(cmd: &mut Command, timeout: Duration) -> CliOutput {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let stdout = drain(child.stdout.take().expect("stdout pipe"));
    let stderr = drain(child.stderr.take().expect("stderr pipe"));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} did not finish within {timeout:?}; stderr:\n{}",
                stderr.join().unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(10));
    };
    CliOutput {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

fn drain<R: Read + Send + 'static>(mut r: R) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = r.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

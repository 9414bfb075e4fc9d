//! `latchkey demo`: allow, deny, injection and redaction, shown on this machine, offline.
//!
//! ```text
//!  demo client (the sandbox) ──CONNECT──▶ latchkey serve ──TLS──▶ echo upstream
//!  trusts latchkey's CA only            demo policy,            echo.latchkey.demo on
//!                                       secret from file:       127.0.0.1:0, its own CA
//! ```
//!
//! The proxy is the real one: this binary's own `latchkey serve`, run as a child process with
//! the flags the demo prints (`--resolve`, `--upstream-ca`, `--allow-private 127.0.0.1/32`, its
//! CA, audit file and log inside the demo directory), so what the demo shows is exactly what
//! `serve` does. The echo upstream, the demo secret (random per run, in a 0600 file the policy
//! reads with `file:`) and the sandbox side run in this process, on loopback only.
//!
//! The demo checks every behaviour it prints and reports what it did not see; its secret is
//! never printed, and it checks that neither the audit file nor latchkey's log holds it.

mod client;
mod echo;

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncReadExt;
use zeroize::Zeroizing;

use crate::secrets::SecretValue;
use client::Reply;
use echo::{Echo, HOST};

/// Default `--listen`: next to `serve`'s 3128 (proxy) and 3129 (admin), so both can run.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:3130";
/// The secret's name in the demo policy, and so in its redaction marker.
pub const SECRET_NAME: &str = "demo_token";
/// The demo policy's one rule.
pub const RULE: &str = "echo-read";
/// Where the demo secret lives inside the demo directory (mode 0600).
pub const SECRET_FILE: &str = "secrets/demo-token";

/// How long latchkey may take to start listening, and to stop.
const START_DEADLINE: Duration = Duration::from_secs(20);
const STOP_DEADLINE: Duration = Duration::from_secs(10);
/// How long the audit records of the four checks may take to reach the file.
const AUDIT_DEADLINE: Duration = Duration::from_secs(10);
/// Most bytes of latchkey's stderr kept while looking for its listening line.
const MAX_LINE: usize = 4096;
const LISTENING: &[u8] = b"latchkey: proxy listening on ";

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{0}")]
    Setup(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("latchkey serve {0}")]
    Serve(String),
}

/// What `latchkey demo` was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// Keep the demo's files here; default: a new temp directory, removed on exit.
    pub dir: Option<PathBuf>,
    /// Where latchkey listens (loopback only; port 0 picks a free one).
    pub listen: SocketAddr,
    /// Exit after the self-check instead of staying up for pasted curl commands.
    pub once: bool,
}

/// Runs the demo. `Ok(true)` when every check passed (and, staying up, latchkey stopped
/// cleanly); `Ok(false)` when a check failed, after saying which and why.
pub fn run(opts: Options) -> Result<bool, DemoError> {
    if !opts.listen.ip().is_loopback() {
        return Err(DemoError::Setup(format!(
            "--listen {}: the demo listens on loopback only (127.0.0.1 or ::1)",
            opts.listen
        )));
    }
    // One thread: latchkey is started from it, and its parent-death signal is tied to the
    // thread that started it (see `Serve::start`).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| DemoError::Setup(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(demo(opts))
}

async fn demo(opts: Options) -> Result<bool, DemoError> {
    let ws = Workspace::new(opts.dir.as_deref())?;
    let secret = new_secret()?;
    let echo = Echo::start()?;
    let files = ws.write_files(&secret, &echo)?;
    let mut serve = Serve::start(&ws, &files, opts.listen).await?;
    let proxy = serve.addr;
    let result = self_check(&ws, &files, &secret, &echo, proxy).await;
    let passed = match result {
        Ok(passed) => passed,
        Err(e) => {
            serve.stop().await;
            return Err(e);
        }
    };
    if !passed || opts.once {
        let stopped = serve.stop().await;
        if !stopped {
            say(&format!(
                "FAILED: latchkey serve did not exit cleanly on SIGTERM (see {})\n",
                ws.path(LOG_FILE).display()
            ));
        }
        return Ok(passed && stopped);
    }
    say(&format!(
        "\nlatchkey is still running on {proxy} with the demo policy. Paste the curl commands above \
         into another shell;\n`tail -f {}` shows their records. Ctrl-C stops it{}.\n",
        sh_quote(&ws.path(AUDIT_FILE)),
        if ws.remove {
            " and removes the demo directory"
        } else {
            ""
        },
    ));
    let clean = serve.wait_for_stop().await;
    let leaked = ws.leaks(&secret, files.audit_offset);
    if let Some(problem) = &leaked {
        say(&format!("FAILED: {problem}\n"));
    }
    Ok(clean && leaked.is_none())
}

const AUDIT_FILE: &str = "audit.jsonl";
const LOG_FILE: &str = "latchkey.log";
const POLICY_FILE: &str = "policies/demo.toml";
const ECHO_CA_FILE: &str = "echo-ca.pem";
const CA_DIR: &str = "certs";

/// Prints to stdout, flushed, so a pipe sees each step as it happens.
fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// The demo directory: given with `--dir` (kept), or a fresh temp directory (removed on drop).
struct Workspace {
    root: PathBuf,
    remove: bool,
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// Paths and facts the later steps need.
struct Files {
    /// Where this run's records start in the audit file (a `--dir` may be reused).
    audit_offset: u64,
    ca_pem: String,
    policy: String,
    /// The echo upstream's port, which the policy's rule names.
    port: u16,
}

impl Workspace {
    fn new(dir: Option<&Path>) -> Result<Workspace, DemoError> {
        let (root, remove) = match dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| DemoError::Write {
                    path: dir.to_path_buf(),
                    source,
                })?;
                (dir.to_path_buf(), false)
            }
            None => {
                let dir =
                    std::env::temp_dir().join(format!("latchkey-demo-{}", crate::audit::new_id()));
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&dir)
                    .map_err(|source| DemoError::Write {
                        path: dir.clone(),
                        source,
                    })?;
                (dir, true)
            }
        };
        // Absolute, so the printed commands work from any shell's directory.
        let root = root
            .canonicalize()
            .map_err(|e| DemoError::Setup(format!("cannot resolve {}: {e}", root.display())))?;
        if root.to_str().is_none() {
            return Err(DemoError::Setup(format!(
                "{}: the demo directory's path must be UTF-8 (it is written into the policy)",
                root.display()
            )));
        }
        Ok(Workspace { root, remove })
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn write(&self, rel: &str, text: &[u8], mode: u32) -> Result<(), DemoError> {
        let path = self.path(rel);
        let err = |source| DemoError::Write {
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(err)?;
        }
        // A fresh file, so the mode holds even where an older file had another one.
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(err(e)),
            _ => {}
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .map_err(err)?;
        file.write_all(text).map_err(err)
    }

    /// Writes the secret, the echo's CA, the policy and latchkey's CA.
    fn write_files(&self, secret: &SecretValue, echo: &Echo) -> Result<Files, DemoError> {
        let policies = self.path("policies");
        if let Ok(entries) = std::fs::read_dir(&policies) {
            let others: Vec<String> = entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".toml") && n != "demo.toml")
                .collect();
            if !others.is_empty() {
                return Err(DemoError::Setup(format!(
                    "{} holds other policy files ({}), which latchkey would load too: \
                     give --dir an empty or demo-only directory",
                    policies.display(),
                    others.join(", ")
                )));
            }
        }
        self.write(SECRET_FILE, secret.expose(), 0o600)?;
        self.write(ECHO_CA_FILE, echo.ca_pem().as_bytes(), 0o644)?;
        let policy = policy_text(&self.path(SECRET_FILE), echo.port());
        self.write(POLICY_FILE, policy.as_bytes(), 0o644)?;
        let ca_dir = self.path(CA_DIR);
        crate::proxy::ca::init(&ca_dir)
            .map_err(|e| DemoError::Setup(format!("latchkey's CA: {e}")))?;
        let ca = crate::proxy::CertAuthority::load(&ca_dir)
            .map_err(|e| DemoError::Setup(format!("latchkey's CA: {e}")))?;
        let audit_offset = std::fs::metadata(self.path(AUDIT_FILE))
            .map(|m| m.len())
            .unwrap_or(0);
        Ok(Files {
            audit_offset,
            ca_pem: ca.cert_pem().to_string(),
            policy,
            port: echo.port(),
        })
    }

    /// Whether this run's audit records or latchkey's log hold the secret (they never should).
    fn leaks(&self, secret: &SecretValue, audit_offset: u64) -> Option<String> {
        let audit = std::fs::read(self.path(AUDIT_FILE)).unwrap_or_default();
        let audit = audit.get(audit_offset as usize..).unwrap_or_default();
        let log = std::fs::read(self.path(LOG_FILE)).unwrap_or_default();
        for (what, bytes) in [(AUDIT_FILE, audit), (LOG_FILE, &log[..])] {
            if contains(bytes, secret.expose()) {
                return Some(format!("{what} holds the demo secret's value"));
            }
        }
        None
    }
}

/// A random value for this run only: worthless outside it, long enough to redact reliably.
fn new_secret() -> Result<SecretValue, DemoError> {
    let mut raw = Zeroizing::new([0u8; 24]);
    aws_lc_rs::rand::fill(raw.as_mut())
        .map_err(|_| DemoError::Setup("no randomness for the demo secret".to_string()))?;
    let mut value = Zeroizing::new(b"lk-demo-".to_vec());
    for b in raw.iter() {
        value.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    Ok(SecretValue::new(value.to_vec()))
}

fn policy_text(secret_file: &Path, port: u16) -> String {
    let source = toml::Value::String(format!("file:{}", secret_file.display()));
    format!(
        r#"# latchkey demo policy, written by `latchkey demo` (rewritten on every run).
#
# One rule: GET on the demo's local echo upstream, with a credential injected that the
# sandbox never holds. Anything else is denied (deny by default) and audited.

[secrets.{SECRET_NAME}]
source = {source}   # random for each run, mode 0600; the demo never prints it

[[rules]]
name        = "{RULE}"
description = "GET on the demo's echo upstream, authenticated with the demo token."
hosts       = ["{HOST}"]
ports       = [{port}]
methods     = ["GET"]
[rules.inject.headers]
authorization = "Bearer {{{{secret.{SECRET_NAME}}}}}"
"#
    )
}

/// The child `latchkey serve` and where it listens.
struct Serve {
    child: tokio::process::Child,
    addr: SocketAddr,
}

impl Serve {
    /// Starts this binary's `latchkey serve` on the demo's files and waits for its listening
    /// line. Its stderr (the log) goes to `latchkey.log` in the demo directory.
    async fn start(ws: &Workspace, files: &Files, listen: SocketAddr) -> Result<Serve, DemoError> {
        let exe = std::env::current_exe()
            .map_err(|e| DemoError::Serve(format!("cannot find this binary: {e}")))?;
        let args: Vec<OsString> = vec![
            "serve".into(),
            "--policies".into(),
            ws.path("policies").into(),
            "--listen".into(),
            listen.to_string().into(),
            "--ca-dir".into(),
            ws.path(CA_DIR).into(),
            "--audit".into(),
            ws.path(AUDIT_FILE).into(),
            "--upstream-ca".into(),
            ws.path(ECHO_CA_FILE).into(),
            "--resolve".into(),
            format!("{HOST}=127.0.0.1").into(),
            "--allow-private".into(),
            "127.0.0.1/32".into(),
            "--admin".into(),
            "off".into(),
            "--shutdown-timeout".into(),
            "2s".into(),
        ];
        let mut shown = String::new();
        for a in std::iter::once(exe.as_os_str()).chain(args.iter().map(OsString::as_os_str)) {
            let _ = write!(shown, "{} ", sh_quote(Path::new(a)));
        }
        say(&format!(
            "latchkey demo: allow, inject, redact and deny, on this machine only (loopback, offline).\n\n\
             demo directory  {root}{kept}\n\
             policy          {policy}\n\
             demo secret     {secret} (random for this run, mode 0600; never printed)\n\
             echo upstream   https://{HOST}:{port} on 127.0.0.1, certificate from its own test CA ({echo_ca})\n\
             latchkey CA     {ca} (what a sandbox trusts)\n\
             audit log       {audit}\n\
             latchkey log    {log}\n\n\
             The policy:\n\n{policy_text}\n\
             The proxy is latchkey itself, started as:\n  {shown}\n\n",
            root = ws.root.display(),
            kept = if ws.remove {
                " (removed on exit; --dir DIR keeps the files)"
            } else {
                ""
            },
            policy = ws.path(POLICY_FILE).display(),
            secret = ws.path(SECRET_FILE).display(),
            port = files.port,
            echo_ca = ws.path(ECHO_CA_FILE).display(),
            ca = ws.path(CA_DIR).join(crate::proxy::ca::CA_CERT_FILE).display(),
            audit = ws.path(AUDIT_FILE).display(),
            log = ws.path(LOG_FILE).display(),
            policy_text = indent(&files.policy, "    "),
            shown = shown.trim_end(),
        ));

        let log_path = ws.path(LOG_FILE);
        let log = std::fs::File::create(&log_path).map_err(|source| DemoError::Write {
            path: log_path.clone(),
            source,
        })?;
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Only the flags above decide what this latchkey does, not the caller's LATCHKEY_*.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("LATCHKEY_") {
                cmd.env_remove(name);
            }
        }
        #[cfg(target_os = "linux")]
        // SAFETY: the closure runs in the forked child before exec and makes one prctl system
        // call, which allocates nothing and takes no lock (async-signal-safe).
        unsafe {
            // If the demo dies without stopping latchkey (kill -9), latchkey gets SIGTERM and
            // shuts down instead of holding the demo's port.
            cmd.pre_exec(|| {
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::TERM,
                ))
                .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| DemoError::Serve(format!("cannot start {}: {e}", exe.display())))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| DemoError::Serve("has no stderr pipe".to_string()))?;
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let copier = tokio::spawn(copy_log(stderr, log, ready_tx));

        let outcome = tokio::select! {
            addr = ready_rx => addr.ok(),
            _ = child.wait() => None,
            () = tokio::time::sleep(START_DEADLINE) => None,
        };
        match outcome.and_then(|a| a.parse::<SocketAddr>().ok()) {
            Some(addr) => Ok(Serve { child, addr }),
            None => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                // Its last words may still be in the pipe: let the copier reach the end.
                let _ = tokio::time::timeout(Duration::from_secs(2), copier).await;
                let tail = log_tail(&log_path);
                let hint = if tail.contains("cannot listen") {
                    "\n(is another `latchkey demo` running? `--listen 127.0.0.1:0` picks a free port)"
                } else {
                    ""
                };
                Err(DemoError::Serve(format!(
                    "did not start; the end of {}:\n{tail}{hint}",
                    log_path.display()
                )))
            }
        }
    }

    /// SIGTERM (latchkey writes every queued audit record and exits), then waits; kills it
    /// past the deadline. Returns whether it stopped on its own with success.
    async fn stop(&mut self) -> bool {
        let pid = self
            .child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        match tokio::time::timeout(STOP_DEADLINE, self.child.wait()).await {
            Ok(Ok(status)) => status.success(),
            _ => {
                let _ = self.child.kill().await;
                false
            }
        }
    }

    /// Stays up until Ctrl-C or SIGTERM (then stops latchkey), or until latchkey exits.
    async fn wait_for_stop(&mut self) -> bool {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = term => {}
            status = self.child.wait() => {
                say(&format!("\nlatchkey exited unexpectedly ({}); see {LOG_FILE} in the demo directory\n",
                    status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string())));
                return false;
            }
        }
        say("\nstopping latchkey\n");
        self.stop().await
    }
}

/// Copies latchkey's stderr to the log file, sending its listening address once seen.
async fn copy_log(
    mut stderr: tokio::process::ChildStderr,
    mut log: std::fs::File,
    ready: tokio::sync::oneshot::Sender<String>,
) {
    let mut ready = Some(ready);
    let mut line: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        let n = match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let _ = log.write_all(&buf[..n]);
        if ready.is_none() {
            continue;
        }
        for &b in &buf[..n] {
            if b != b'\n' {
                if line.len() < MAX_LINE {
                    line.push(b);
                }
                continue;
            }
            if let Some(addr) = line.strip_prefix(LISTENING) {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(String::from_utf8_lossy(addr).trim().to_string());
                }
            }
            line.clear();
        }
    }
}

/// The last lines of latchkey's log, for a start-up failure.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// One check: the request, what the sandbox saw, and whether it is what latchkey promises.
struct Check {
    title: &'static str,
    curl: String,
    reply: Option<Reply>,
    shown: String,
    problems: Vec<String>,
}

/// Runs the four checks, prints each with its curl equivalent, then the audit records.
async fn self_check(
    ws: &Workspace,
    files: &Files,
    secret: &SecretValue,
    echo: &Echo,
    proxy: SocketAddr,
) -> Result<bool, DemoError> {
    let tls = client::tls_trusting(&files.ca_pem).map_err(DemoError::Setup)?;
    let port = echo.port();
    let ca = ws.path(CA_DIR).join(crate::proxy::ca::CA_CERT_FILE);
    let curl = |extra: &str, path: &str| {
        format!(
            "curl -sS -i --noproxy '' --proxy {} --cacert {}{extra} https://{HOST}:{port}{path}",
            sh_word(&format!("http://{proxy}")),
            sh_quote(&ca)
        )
    };
    let expected = Zeroizing::new([b"Bearer ".as_slice(), secret.expose()].concat());
    let marker = format!("[REDACTED:{SECRET_NAME}]");

    let steps: [(&'static str, &'static str, http::Method, &str, String); 4] = [
        (
            "allow",
            "allow: a GET the policy allows reaches the echo",
            http::Method::GET,
            "/hello",
            curl("", "/hello"),
        ),
        (
            "inject",
            "inject: latchkey adds a credential the sandbox never held",
            http::Method::GET,
            "/whoami",
            curl("", "/whoami"),
        ),
        (
            "redact",
            "redact: the echo reflects that credential; latchkey scrubs it from the response",
            http::Method::GET,
            "/reflect",
            curl("", "/reflect"),
        ),
        (
            "deny",
            "deny: anything else is refused (deny by default), with the reason",
            http::Method::POST,
            "/hello",
            curl(" -X POST", "/hello"),
        ),
    ];

    let mut checks = Vec::new();
    let mut ids = Vec::new();
    for (i, (step, title, method, path, curl)) in steps.into_iter().enumerate() {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(echo::STEP_HEADER, step);
        let mut check = Check {
            title,
            curl,
            reply: None,
            shown: String::new(),
            problems: Vec::new(),
        };
        match client::send(proxy, tls.clone(), HOST, port, req).await {
            Ok(reply) => {
                ids.push(reply.header("x-latchkey-id").to_string());
                if contains(&reply_bytes(&reply), secret.expose()) {
                    check
                        .problems
                        .push("the response holds the demo secret's value".to_string());
                }
                check.reply = Some(reply);
                match step {
                    "allow" => judge_allow(&mut check, echo),
                    "inject" => judge_inject(&mut check, echo, &expected, secret.len()),
                    "redact" => judge_redact(&mut check, echo, &expected, &marker),
                    _ => judge_deny(&mut check, echo),
                }
            }
            Err(why) => check.problems.push(why),
        }
        say(&format!("{}. {}\n  $ {}\n", i + 1, check.title, check.curl));
        if !check.shown.is_empty() {
            say(&format!("  → {}\n", check.shown));
        }
        if check.problems.is_empty() {
            say("  ok\n\n");
        } else {
            for p in &check.problems {
                say(&format!("  FAILED: {p}\n"));
            }
            say("\n");
        }
        checks.push(check);
    }

    let mut failed = checks.iter().filter(|c| !c.problems.is_empty()).count();
    match audit_lines(ws, files.audit_offset, &ids).await {
        Ok(lines) => {
            say(&format!(
                "Audit records ({}), one per request; secrets appear by name only:\n",
                ws.path(AUDIT_FILE).display()
            ));
            for line in &lines {
                say(&format!("  {line}\n"));
            }
            let problems = judge_audit(&lines);
            for p in &problems {
                say(&format!("  FAILED: {p}\n"));
            }
            if !problems.is_empty() {
                failed += 1;
            }
        }
        Err(why) => {
            say(&format!("FAILED: {why}\n"));
            failed += 1;
        }
    }
    if let Some(problem) = ws.leaks(secret, files.audit_offset) {
        say(&format!("FAILED: {problem}\n"));
        failed += 1;
    }
    if failed == 0 {
        say("\nAll four checks passed: allow, inject, redact, deny.\n");
    } else {
        say(&format!(
            "\nlatchkey demo: {failed} check(s) failed (see FAILED above; latchkey's log: {}).\n",
            ws.path(LOG_FILE).display()
        ));
    }
    Ok(failed == 0)
}

fn reply_bytes(reply: &Reply) -> Vec<u8> {
    let mut all = reply.body.to_vec();
    for (name, value) in &reply.headers {
        all.extend_from_slice(name.as_str().as_bytes());
        all.extend_from_slice(value.as_bytes());
    }
    all
}

/// The reply, judged: every expectation not met becomes a problem.
fn expect(check: &mut Check, ok: bool, problem: impl FnOnce(&Reply) -> String) {
    if !ok {
        if let Some(r) = &check.reply {
            let p = problem(r);
            check.problems.push(p);
        }
    }
}

fn body_json(reply: &Reply) -> Value {
    serde_json::from_slice(&reply.body).unwrap_or(Value::Null)
}

fn judge_allow(check: &mut Check, echo: &Echo) {
    let Some(r) = &check.reply else { return };
    let json = body_json(r);
    // An allowed response carries only latchkey's id (the refusal headers are for denials).
    let id = r.header("x-latchkey-id");
    check.shown = format!(
        "{} from the echo upstream, which saw {} {}; x-latchkey-id: {id} (its audit record's id)",
        r.status,
        json["method"].as_str().unwrap_or("?"),
        json["path"].as_str().unwrap_or("?"),
    );
    let ok = r.status == 200
        && !id.is_empty()
        && r.header("x-latchkey-decision").is_empty()
        && json["echo"] == HOST
        && json["path"] == "/hello";
    let reached = echo.with_step("allow", |_| ()).is_some();
    expect(check, ok && reached, |r| {
        format!(
            "expected 200 from the echo with an x-latchkey-id, got {} {}{}",
            r.status,
            r.header("x-latchkey-reason"),
            if reached {
                ""
            } else {
                "; the echo received nothing"
            }
        )
    });
}

fn judge_inject(check: &mut Check, echo: &Echo, expected: &[u8], secret_len: usize) {
    let Some(r) = &check.reply else { return };
    let json = body_json(r);
    let scheme = json["authorization_received"]["scheme"]
        .as_str()
        .unwrap_or("");
    let bytes = json["authorization_received"]["credential_bytes"]
        .as_u64()
        .unwrap_or(0);
    // What left latchkey, as the echo recorded it, compared here without showing it.
    let got_secret = echo.with_step("inject", |s| {
        s.authorization.as_ref().is_some_and(|a| a.ct_eq(expected))
    });
    check.shown = if scheme.is_empty() {
        "the echo received no Authorization header".to_string()
    } else {
        format!(
            "the sandbox sent no Authorization header; the echo received \
             \"Authorization: {scheme} <{bytes} bytes>\" (the demo secret; its value is not shown)"
        )
    };
    let ok = r.status == 200
        && scheme == "Bearer"
        && bytes == secret_len as u64
        && got_secret == Some(true);
    expect(check, ok, |r| {
        format!(
            "expected the echo to receive \"Authorization: Bearer <the demo secret>\"; status {}, {}",
            r.status,
            match got_secret {
                None => "the echo received nothing",
                Some(false) => "the echo's Authorization was not the demo secret",
                Some(true) => "the echo's description of it is wrong",
            }
        )
    });
}

fn judge_redact(check: &mut Check, echo: &Echo, expected: &[u8], marker: &str) {
    let Some(r) = &check.reply else { return };
    let json = body_json(r);
    let reflected = json["headers"]["authorization"].as_str().unwrap_or("");
    let header = r.header("x-echo-authorization");
    let sent = echo.with_step("redact", |s| {
        s.authorization.as_ref().is_some_and(|a| a.ct_eq(expected))
    });
    check.shown = format!(
        "the echo sent its Authorization header back; the sandbox got \"authorization\": \"{reflected}\" \
         in the body and x-echo-authorization: {header}"
    );
    let ok = r.status == 200
        && reflected == format!("Bearer {marker}")
        && header == format!("Bearer {marker}")
        && sent == Some(true);
    expect(check, ok, |_| {
        format!(
            "expected the echo to reflect the demo secret and the sandbox to see \"Bearer {marker}\" instead{}",
            if sent == Some(true) { "" } else { " (the echo did not receive the secret)" }
        )
    });
}

fn judge_deny(check: &mut Check, echo: &Echo) {
    let Some(r) = &check.reply else { return };
    let text = r.text();
    let reached = echo.with_step("deny", |s| s.method.clone());
    check.shown = format!(
        "{}, x-latchkey-reason: {}, closest rule: {}: \"{}\"; {}",
        r.status,
        r.header("x-latchkey-reason"),
        r.header("x-latchkey-rule"),
        text.trim_end(),
        if reached.is_some() {
            "the request reached the echo"
        } else {
            "nothing reached the echo"
        }
    );
    let ok = r.status == 403
        && r.header("x-latchkey-decision") == "deny"
        && r.header("x-latchkey-reason") == "method_not_allowed"
        && r.header("x-latchkey-rule") == RULE
        && text.starts_with("latchkey: denied:")
        && reached.is_none();
    expect(check, ok, |r| {
        format!(
            "expected 403 method_not_allowed under rule {RULE}, got {} {}{}",
            r.status,
            r.header("x-latchkey-reason"),
            if reached.is_some() {
                "; the denied request reached the echo"
            } else {
                ""
            }
        )
    });
}

/// Waits for the records of the four requests (by `x-latchkey-id`), in request order.
async fn audit_lines(ws: &Workspace, offset: u64, ids: &[String]) -> Result<Vec<String>, String> {
    let deadline = tokio::time::Instant::now() + AUDIT_DEADLINE;
    loop {
        let text = std::fs::read(ws.path(AUDIT_FILE)).unwrap_or_default();
        let text = String::from_utf8_lossy(text.get(offset as usize..).unwrap_or_default());
        let found: Vec<String> = ids
            .iter()
            .filter_map(|id| {
                text.lines()
                    .find(|l| {
                        serde_json::from_str::<Value>(l)
                            .is_ok_and(|v| v["id"].as_str() == Some(id.as_str()))
                    })
                    .map(str::to_string)
            })
            .collect();
        if found.len() == ids.len() {
            return Ok(found);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "{} of {} audit records did not reach {AUDIT_FILE} within {}s",
                ids.len() - found.len(),
                ids.len(),
                AUDIT_DEADLINE.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The records say what happened: three allowed under the rule (the two that carried the
/// secret name it), one denied.
fn judge_audit(lines: &[String]) -> Vec<String> {
    let want = [
        ("allow", "allowed"),
        ("allow", "allowed"),
        ("allow", "allowed"),
        ("deny", "method_not_allowed"),
    ];
    if lines.len() != want.len() {
        return vec![format!("expected 4 audit records, found {}", lines.len())];
    }
    let mut problems = Vec::new();
    for (i, (line, (decision, reason))) in lines.iter().zip(want).enumerate() {
        let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
        if v["decision"] != decision || v["reason"] != reason || v["rule"] != RULE {
            problems.push(format!(
                "record {}: expected decision {decision}, reason {reason}, rule {RULE}",
                i + 1
            ));
        }
        let names_secret = v["secrets"]
            .as_array()
            .is_some_and(|s| s.iter().any(|n| n == SECRET_NAME));
        if decision == "allow" && !names_secret {
            problems.push(format!(
                "record {}: the injected secret is not named in \"secrets\"",
                i + 1
            ));
        }
    }
    if lines
        .get(2)
        .and_then(|l| serde_json::from_str::<Value>(l).ok())
        .and_then(|v| v["redactions"].as_u64())
        .unwrap_or(0)
        == 0
    {
        problems.push("record 3: no redaction counted".to_string());
    }
    problems
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

fn indent(text: &str, by: &str) -> String {
    text.lines()
        .map(|l| {
            if l.is_empty() {
                "\n".to_string()
            } else {
                format!("{by}{l}\n")
            }
        })
        .collect()
}

/// A word the shell reads back as `path`, quoted only when it needs to be.
fn sh_quote(path: &Path) -> String {
    sh_word(&path.to_string_lossy())
}

/// `s` as one shell word (no globbing, no splitting), quoted only when it needs to be.
fn sh_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_with_spaces_or_quotes_are_quoted_for_the_shell() {
        assert_eq!(sh_quote(Path::new("/tmp/a-b/c.pem")), "/tmp/a-b/c.pem");
        assert_eq!(sh_quote(Path::new("/tmp/a b")), "'/tmp/a b'");
        assert_eq!(sh_quote(Path::new("/tmp/it's")), "'/tmp/it'\\''s'");
        assert_eq!(sh_word("http://[::1]:3130"), "'http://[::1]:3130'");
        assert_eq!(sh_word("http://127.0.0.1:3130"), "http://127.0.0.1:3130");
    }

    #[test]
    fn the_demo_policy_loads_and_allows_only_get_on_the_echo() {
        let dir =
            std::env::temp_dir().join(format!("latchkey-demo-unit-{}", crate::audit::new_id()));
        std::fs::create_dir_all(dir.join("policies")).expect("dir");
        let secret = dir.join("token");
        std::fs::write(&secret, "lk-demo-0123456789abcdef").expect("secret");
        std::fs::write(dir.join("policies/demo.toml"), policy_text(&secret, 4443)).expect("policy");
        let policy = crate::policy::load_dir(&dir.join("policies"));
        let _ = std::fs::remove_dir_all(&dir);
        let policy = policy.expect("the demo policy is valid");
        assert_eq!(policy.rules().len(), 1);
        assert_eq!(policy.rules()[0].name, RULE);
    }

    #[test]
    fn secrets_are_long_random_and_distinct() {
        let a = new_secret().expect("secret");
        let b = new_secret().expect("secret");
        assert!(a.len() >= 32);
        assert!(a != b);
    }
}

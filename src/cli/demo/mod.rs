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
//! Nothing outside `cli` depends on the demo.

mod checks;
mod client;
mod echo;
mod serve;

use checks::*;
use serve::*;

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
    let start = value.len();
    value.resize(start + 2 * raw.len(), 0);
    hex::encode_to_slice(raw.as_ref(), &mut value[start..])
        .map_err(|_| DemoError::Setup("cannot write the demo secret".to_string()))?;
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

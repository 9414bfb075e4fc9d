//! Network namespaces for the gateway tests: a sandbox whose only way out is latchkey, and
//! upstreams that latchkey reaches over links of their own.
//!
//! [`Gateway::new`] builds three namespaces joined by veth pairs:
//!
//! ```text
//!   sandbox 10.200.0.2/30 ──── 10.200.0.1/30 latchkey 10.200.1.1/30 ──── 10.200.1.2/30 upstream
//! ```
//!
//! The sandbox's default route points at latchkey's address and latchkey's namespace does not
//! forward, so the only way out of the sandbox is latchkey's listener. Processes run inside a
//! namespace with `ip netns exec` ([`Netns::command`]); servers started that way
//! ([`NsProcess`], [`NsEcho`]) are killed by PID on drop, and every namespace is deleted on drop
//! (unique names: pid + counter), so a failing test cleans up too. Declare the [`Gateway`] first
//! and the processes after it: locals drop in reverse order, processes before namespaces.
//!
//! Creating namespaces needs root (CAP_NET_ADMIN): [`Netns::new`] checks once that
//! `ip netns add` is permitted and otherwise fails the test with a message saying so, and how to
//! exclude these tests explicitly.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::ca::TestCa;
use super::clients::{CurlOutput, RawResponse};
use super::latchkey::{wait_with_timeout, Latchkey, SCRUBBED_ENV};
use super::toolchain;

/// The sandbox end of the sandbox ↔ latchkey link.
pub const SANDBOX_IP: &str = "10.200.0.2";
/// latchkey's address on the sandbox link: the sandbox's only gateway.
pub const PROXY_IP: &str = "10.200.0.1";
/// latchkey's address on the upstream link.
pub const PROXY_UPLINK_IP: &str = "10.200.1.1";
/// The upstream namespace's address.
pub const UPSTREAM_IP: &str = "10.200.1.2";
/// The upstream link, which latchkey opens with `--allow-private` (it is RFC 1918 space).
pub const UPSTREAM_NET: &str = "10.200.1.0/30";

static NEXT: AtomicUsize = AtomicUsize::new(0);

fn unique(role: &str) -> String {
    format!(
        "lk{}-{}-{role}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// Runs `ip ARGS...`; `Err` carries its stderr.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new(toolchain::tool("ip"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Panics (once per test that needs a namespace) unless this process may create network
/// namespaces: a test that cannot build its topology fails, it is never counted as passed.
fn require_netns() {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    let probe = PROBE.get_or_init(|| {
        let name = unique("probe");
        ip(&["netns", "add", &name])?;
        let _ = ip(&["netns", "del", &name]);
        Ok(())
    });
    if let Err(why) = probe {
        panic!(
            "this test needs root / CAP_NET_ADMIN for network namespaces ({why}); run as root, \
             or exclude the namespace tests explicitly with `cargo test -- --skip gateway \
             --skip an_upstream_that_never_accepts_gets_504_after_the_connect_timeout`"
        );
    }
}

/// A network namespace of this test, deleted on drop.
pub struct Netns {
    name: String,
    /// `/etc/netns/NAME`, bind-mounted over `/etc` files by `ip netns exec`, if written.
    etc: Option<PathBuf>,
}

impl Netns {
    /// Creates a namespace with its loopback up. `role` shows up in the name.
    pub fn new(role: &str) -> Netns {
        require_netns();
        let name = unique(role);
        ip(&["netns", "add", &name]).unwrap_or_else(|e| panic!("{e}"));
        let ns = Netns { name, etc: None };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n NAME ARGS...`, panicking on failure.
    pub fn ip(&self, args: &[&str]) {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full).unwrap_or_else(|e| panic!("{e}"));
    }

    /// `ip netns exec NAME PROGRAM`, with the proxy and CA variables of this machine removed.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(toolchain::tool("ip"));
        cmd.args(["netns", "exec", self.name.as_str()]).arg(program);
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        cmd
    }

    /// Writes `/etc/netns/NAME/FILE`: processes started with [`Netns::command`] see it as
    /// `/etc/FILE` (e.g. a `resolv.conf` pointing at a test resolver). Removed on drop.
    pub fn etc_file(&mut self, file: &str, contents: &str) {
        let dir = PathBuf::from("/etc/netns").join(&self.name);
        std::fs::create_dir_all(&dir).expect("create /etc/netns/NAME");
        std::fs::write(dir.join(file), contents).expect("write /etc/netns/NAME/FILE");
        self.etc = Some(dir);
    }

    /// Loads an nftables ruleset (`nft -f FILE`) in the namespace, panicking on failure.
    pub fn nft(&self, ruleset: &str) {
        let file = tempfile::NamedTempFile::new().expect("nft ruleset file");
        std::fs::write(file.path(), ruleset).expect("write nft ruleset");
        let out = wait_with_timeout(
            self.command(toolchain::tool("nft"))
                .arg("-f")
                .arg(file.path()),
            Duration::from_secs(10),
        );
        assert_eq!(
            out.code(),
            Some(0),
            "nft -f in {}:\n{ruleset}\n{out:#?}",
            self.name
        );
    }

    /// Runs `sh -c SCRIPT` inside the namespace, panicking on failure; returns its stdout.
    pub fn sh(&self, script: &str) -> String {
        let out = wait_with_timeout(
            self.command(toolchain::tool("sh")).arg("-c").arg(script),
            Duration::from_secs(10),
        );
        assert_eq!(
            out.code(),
            Some(0),
            "sh -c {script:?} in {}: {out:#?}",
            self.name
        );
        out.stdout
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(dir) = &self.etc {
            let _ = std::fs::remove_dir_all(dir);
            // `/etc/netns` itself, if this left it empty (never anything else's files).
            let _ = std::fs::remove_dir("/etc/netns");
        }
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Joins `a` and `b` with a veth pair, gives each end its address (`10.200.0.1/30`) and brings
/// both up. Returns the interface names (in `a`, in `b`).
pub fn link(a: &Netns, a_addr: &str, b: &Netns, b_addr: &str) -> (String, String) {
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let (ia, ib) = (format!("veth{n}a"), format!("veth{n}b"));
    ip(&[
        "link", "add", &ia, "netns", &a.name, "type", "veth", "peer", "name", &ib, "netns", &b.name,
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    a.ip(&["addr", "add", a_addr, "dev", &ia]);
    b.ip(&["addr", "add", b_addr, "dev", &ib]);
    a.ip(&["link", "set", &ia, "up"]);
    b.ip(&["link", "set", &ib, "up"]);
    (ia, ib)
}

/// The three namespaces of a gateway deployment (see the module docs).
pub struct Gateway {
    pub sandbox: Netns,
    pub proxy: Netns,
    pub upstream: Netns,
    /// The upstream end of the latchkey ↔ upstream link, for extra addresses.
    pub upstream_if: String,
}

impl Gateway {
    pub fn new() -> Gateway {
        let sandbox = Netns::new("sandbox");
        let proxy = Netns::new("proxy");
        let upstream = Netns::new("upstream");
        link(
            &sandbox,
            &format!("{SANDBOX_IP}/30"),
            &proxy,
            &format!("{PROXY_IP}/30"),
        );
        let (_, upstream_if) = link(
            &proxy,
            &format!("{PROXY_UPLINK_IP}/30"),
            &upstream,
            &format!("{UPSTREAM_IP}/30"),
        );
        // The sandbox's only route leads to latchkey, which is a proxy, not a router.
        sandbox.ip(&["route", "add", "default", "via", PROXY_IP]);
        let forwarding =
            proxy.sh("echo 0 > /proc/sys/net/ipv4/ip_forward; cat /proc/sys/net/ipv4/ip_forward");
        assert_eq!(
            forwarding.trim(),
            "0",
            "latchkey's namespace forwards packets"
        );
        Gateway {
            sandbox,
            proxy,
            upstream,
            upstream_if,
        }
    }
}

/// A server process inside a namespace that prints `listening on ...` when ready. Its stdout
/// lines are kept; it is killed by PID on drop.
pub struct NsProcess {
    child: Child,
    what: String,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl NsProcess {
    /// Spawns `cmd` and waits (10 s) for its `listening on` line.
    pub fn spawn(mut cmd: Command, what: &str) -> NsProcess {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().expect("stdout pipe");
        let sink = stdout.clone();
        thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("listening on ") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(());
                    }
                }
                let mut text = sink.lock().expect("stdout buffer");
                text.push_str(&line);
                text.push('\n');
            }
        });
        let mut err = child.stderr.take().expect("stderr pipe");
        let sink = stderr.clone();
        thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .expect("stderr buffer")
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut process = NsProcess {
            child,
            what: what.to_string(),
            stdout,
            stderr,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if rx.recv_timeout(Duration::from_millis(50)).is_ok() {
                return process;
            }
            if let Ok(Some(status)) = process.child.try_wait() {
                thread::sleep(Duration::from_millis(100));
                panic!(
                    "{what} exited ({status}) before listening:\n{}",
                    process.stderr_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{what} did not start listening within 10 s:\n{}",
                process.stderr_text()
            );
        }
    }

    /// Everything it printed to stdout so far.
    pub fn output(&self) -> String {
        self.stdout.lock().expect("stdout buffer").clone()
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.lock().expect("stderr buffer").clone()
    }

    /// Stdout lines starting with `prefix`.
    pub fn count(&self, prefix: &str) -> usize {
        self.output()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .count()
    }
}

impl Drop for NsProcess {
    fn drop(&mut self) {
        // By PID: `ip netns exec` execs the program, so this is the server itself.
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "{} stdout:\n{}\nstderr:\n{}",
                self.what,
                self.output(),
                self.stderr_text()
            );
        }
    }
}

/// `tests/clients/echo_server.py` inside a namespace: answers every request with JSON naming
/// the server (`"server"`) and describing the request, and counts TCP connections.
pub struct NsEcho {
    process: NsProcess,
    /// Holds the certificate and key of an HTTPS echo.
    _dir: TempDir,
}

/// Options for [`NsEcho::start`].
#[derive(Default)]
pub struct EchoOptions<'a> {
    /// Serve HTTPS with a certificate for these names signed by this CA.
    pub tls: Option<(&'a TestCa, &'a [&'a str])>,
    /// Answer with `connection: close`, so every request needs a new upstream connection.
    pub close: bool,
}

impl NsEcho {
    /// Starts an echo server called `name` in `ns` on `ip:port`.
    pub fn start(ns: &Netns, name: &str, ip: &str, port: u16, options: EchoOptions) -> NsEcho {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/echo_server.py");
        let dir = tempfile::Builder::new()
            .prefix("latchkey-ns-echo")
            .tempdir()
            .expect("temp dir for echo server");
        let mut cmd = ns.command(toolchain::python());
        cmd.arg("-u")
            .arg(script)
            .arg(name)
            .arg(ip)
            .arg(port.to_string());
        if let Some((ca, names)) = options.tls {
            let (chain, key) = ca.issue(names);
            let mut chain_pem = String::new();
            for cert in &chain {
                chain_pem.push_str(&pem("CERTIFICATE", cert.as_ref()));
            }
            let cert_path = dir.path().join("cert.pem");
            let key_path = dir.path().join("key.pem");
            std::fs::write(&cert_path, chain_pem).expect("write echo certificate");
            std::fs::write(&key_path, pem("PRIVATE KEY", key.secret_der()))
                .expect("write echo key");
            cmd.arg("--tls").arg(&cert_path).arg(&key_path);
        }
        if options.close {
            cmd.arg("--close");
        }
        NsEcho {
            process: NsProcess::spawn(cmd, &format!("echo server {name} on {ip}:{port}")),
            _dir: dir,
        }
    }

    /// TCP connections it accepted so far.
    pub fn connections(&self) -> usize {
        self.process.count("connection from ")
    }
}

use super::ca::pem;

/// curl run inside `ns`: `curl -q -sS --max-time 20 --cacert LATCHKEY_CA ARGS...`, trusting only
/// latchkey's CA. Proxy settings come from `args` (`-x`) or `env` (`HTTPS_PROXY`).
pub fn curl_in(ns: &Netns, lk: &Latchkey, args: &[&str], env: &[(&str, &str)]) -> CurlOutput {
    let scratch = tempfile::Builder::new()
        .prefix("curl-ns")
        .tempdir_in(lk.scratch())
        .expect("curl scratch dir");
    let capath = scratch.path().join("capath");
    std::fs::create_dir(&capath).expect("empty capath");
    let headers = scratch.path().join("headers");
    let body = scratch.path().join("body");
    let mut cmd = ns.command(toolchain::tool("curl"));
    cmd.arg("-q")
        .arg("-sS")
        .arg("--max-time")
        .arg("20")
        .arg("--cacert")
        .arg(lk.ca_pem_path())
        .arg("--capath")
        .arg(&capath)
        .arg("-D")
        .arg(&headers)
        .arg("-o")
        .arg(&body)
        .arg("-w")
        .arg("%{http_version}")
        .args(args);
    for (name, value) in env {
        cmd.env(name, value);
    }
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(30));
    let head =
        String::from_utf8_lossy(&std::fs::read(&headers).unwrap_or_default()).replace("\r\n", "\n");
    let (status, headers) = head
        .split("\n\n")
        .filter(|block| block.starts_with("HTTP/"))
        .last()
        .map(|block| {
            let mut lines = block.lines();
            let status = lines
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let headers = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
                .collect();
            (status, headers)
        })
        .unwrap_or((0, Vec::new()));
    CurlOutput {
        exit: out.code(),
        response: RawResponse {
            status,
            headers,
            body: std::fs::read(&body).unwrap_or_default(),
        },
        http_version: out.stdout.trim().to_string(),
        stderr: out.stderr,
    }
}

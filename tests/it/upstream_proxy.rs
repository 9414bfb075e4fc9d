//! `--upstream-proxy`: latchkey chained through a real Squid on loopback. Squid sees only
//! `CONNECT ip:port` (the address latchkey checked) and ciphertext; latchkey's own TLS to the
//! upstream carries the injected credential end to end; a bypassed host never reaches Squid; a
//! Squid that refuses gives the sandbox a 502 naming the proxy; credentials go as Basic
//! `Proxy-Authorization` (Squid's own `basic_ncsa_auth` checks them); and the address guard
//! still refuses what the proxy could reach.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::support::latchkey::LatchkeyBuilder;
use crate::support::{curl, latchkey, toolchain, Latchkey, TestCa, Upstream};

const KEY: &str = "upstream-key-via-squid-0123456789";
const PROXY_PASSWORD: &str = "squid-pass-4242";

/// Debian's Basic-auth helper for Squid (package `squid`).
const NCSA_AUTH: &str = "/usr/lib/squid/basic_ncsa_auth";

/// A Squid in the foreground (`squid -N`) on a free loopback port, killed by its PID on drop.
struct Squid {
    child: Child,
    port: u16,
    dir: TempDir,
    /// Bytes of the access log written before the test began (the readiness probe's line).
    skip: usize,
}

/// What the Squid allows: CONNECT to `upstream_port` (or nothing), with or without Basic auth.
struct SquidConf {
    upstream_port: u16,
    deny: bool,
    user: Option<&'static str>,
}

impl Squid {
    fn start(conf: SquidConf) -> Squid {
        let squid = toolchain::tool("squid");
        let dir = tempfile::Builder::new()
            .prefix("squid-it")
            .tempdir()
            .expect("squid dir");
        // Squid started as root drops to its effective user (`proxy` on Debian): the logs it
        // writes there must be writable by it.
        make_world_writable(dir.path());
        let port = free_port();
        let d = dir.path().display();
        let mut text = format!(
            "http_port 127.0.0.1:{port}\npid_filename {d}/squid.pid\n\
             cache_log stdio:{d}/cache.log\naccess_log stdio:{d}/access.log\n\
             cache_store_log none\ncache deny all\ncoredump_dir {d}\n\
             visible_hostname latchkey-it\npinger_enable off\nshutdown_lifetime 0 seconds\n\
             acl CONNECT method CONNECT\nacl to_upstream port {}\n",
            conf.upstream_port
        );
        let mut allow = "http_access allow CONNECT to_upstream".to_string();
        if let Some(user) = conf.user {
            let hash = htpasswd(PROXY_PASSWORD);
            let file = dir.path().join("passwd");
            std::fs::write(&file, format!("{user}:{hash}\n")).expect("passwd");
            text.push_str(&format!(
                "auth_param basic program {NCSA_AUTH} {}\nauth_param basic realm latchkey-it\n\
                 acl authed proxy_auth REQUIRED\n",
                file.display()
            ));
            allow.push_str(" authed");
        }
        if !conf.deny {
            text.push_str(&format!("{allow}\n"));
        }
        text.push_str("http_access deny all\n");
        let conf_path = dir.path().join("squid.conf");
        std::fs::write(&conf_path, text).expect("squid.conf");
        let child = Command::new(squid)
            .arg("-N")
            .arg("-f")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn squid");
        let mut squid = Squid {
            child,
            port,
            dir,
            skip: 0,
        };
        squid.wait_listening();
        // The probe connection is logged (`error:transaction-end-before-headers`): wait for
        // its line and leave it out of what the test reads.
        let deadline = Instant::now() + Duration::from_secs(5);
        while squid.file("access.log").is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        squid.skip = squid.file("access.log").len();
        squid
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            #[allow(clippy::disallowed_methods)] // the test's readiness probe of its own Squid
            let probe = std::net::TcpStream::connect(("127.0.0.1", self.port));
            if probe.is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("squid exited ({status}): {}", self.file("cache.log"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("squid never listened: {}", self.file("cache.log"));
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    /// What Squid logged since it was ready.
    fn access_log(&self) -> String {
        let all = self.file("access.log");
        all.get(self.skip..).unwrap_or_default().to_string()
    }

    /// The access log once it has `n` lines (a CONNECT is logged when its tunnel closes).
    fn wait_access_lines(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let lines: Vec<String> = self.access_log().lines().map(str::to_string).collect();
            if lines.len() >= n || Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Squid {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn make_world_writable(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).expect("chmod");
}

/// An Apache MD5 hash Squid's `basic_ncsa_auth` accepts, made by `openssl passwd -apr1`.
fn htpasswd(password: &str) -> String {
    let out = Command::new(toolchain::tool("openssl"))
        .args(["passwd", "-apr1", password])
        .output()
        .expect("openssl passwd");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// latchkey with a rule for api.test (pinned to loopback) that injects `x-api-key`, trusting the
/// upstream's CA.
fn latchkey_for(ca: &TestCa, port: u16) -> LatchkeyBuilder {
    latchkey()
        .policy(
            "main.toml",
            &format!(
                "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{port}]\n\
                 [rules.inject.headers]\nx-api-key = \"{{{{secret.key}}}}\"\n\n\
                 [secrets.key]\nsource = \"env:UPSTREAM_PROXY_IT_KEY\"\n"
            ),
        )
        .env("UPSTREAM_PROXY_IT_KEY", KEY)
        .pin("api.test")
        .upstream_ca(ca)
}

fn get(lk: &Latchkey, port: u16) -> crate::support::clients::CurlOutput {
    curl(lk)
        .args([format!("https://api.test:{port}/v1/x")])
        .run()
}

fn connect_lines(log: &[String]) -> Vec<&String> {
    log.iter().filter(|l| l.contains(" CONNECT ")).collect()
}

#[test]
fn squid_carries_only_latchkeys_tls_to_the_checked_address() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let squid = Squid::start(SquidConf {
        upstream_port: port,
        deny: false,
        user: None,
    });
    let lk = latchkey_for(&ca, port)
        .arg("--upstream-proxy")
        .arg(&squid.url())
        .run();
    let resp = get(&lk, port);
    assert_eq!(resp.ok().status, 200, "{resp:#?}\n{}", lk.stderr_text());
    // The injected header arrived at the upstream: latchkey's TLS ran end to end through Squid.
    let received = upstream.received();
    assert_eq!(received.len(), 1, "{received:#?}");
    assert_eq!(received[0].header("x-api-key"), Some(KEY));
    // A CONNECT tunnel is logged when it closes: end latchkey (its pooled connection) first.
    drop(lk);
    let log = squid.wait_access_lines(1);
    assert!(!log.is_empty(), "squid logged nothing");
    for line in &log {
        assert!(
            line.contains(&format!(" CONNECT 127.0.0.1:{port} ")),
            "squid saw something other than CONNECT to the checked address: {line}"
        );
        assert!(
            !line.contains("api.test") && !line.contains("GET"),
            "{line}"
        );
    }
}

#[test]
fn a_bypassed_host_never_reaches_squid() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let squid = Squid::start(SquidConf {
        upstream_port: port,
        deny: false,
        user: None,
    });
    let lk = latchkey_for(&ca, port)
        .arg("--upstream-proxy")
        .arg(&squid.url())
        .arg("--upstream-proxy-bypass")
        .arg("10.0.0.0/8,api.test")
        .run();
    assert_eq!(get(&lk, port).ok().status, 200);
    assert_eq!(upstream.received()[0].header("x-api-key"), Some(KEY));
    drop(lk);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(squid.access_log(), "", "a bypassed host went through squid");
}

#[test]
fn a_squid_that_refuses_gives_a_502_naming_the_proxy() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let squid = Squid::start(SquidConf {
        upstream_port: port,
        deny: true,
        user: None,
    });
    let lk = latchkey_for(&ca, port)
        .arg("--upstream-proxy")
        .arg(&squid.url())
        .run();
    let out = get(&lk, port);
    let resp = out.ok();
    assert_eq!(resp.status, 502, "{resp:#?}");
    assert_eq!(
        resp.header("x-latchkey-reason"),
        Some("upstream_unreachable")
    );
    let text = resp.text();
    assert!(
        text.contains(&format!("upstream proxy {}", squid.url())) && text.contains("403"),
        "{text}"
    );
    assert_eq!(upstream.connections(), 0);
    let log = squid.wait_access_lines(1);
    assert_eq!(connect_lines(&log).len(), log.len(), "{log:?}");
}

#[test]
fn squid_basic_auth_takes_the_password_from_its_source_and_it_is_never_logged() {
    assert!(
        PathBuf::from(NCSA_AUTH).exists(),
        "{NCSA_AUTH} is missing (Debian package squid)"
    );
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let squid = Squid::start(SquidConf {
        upstream_port: port,
        deny: false,
        user: Some("alice"),
    });
    // Without credentials: Squid's 407, named, as a 502 upstream_unreachable.
    let lk = latchkey_for(&ca, port)
        .arg("--upstream-proxy")
        .arg(&squid.url())
        .run();
    let resp = get(&lk, port);
    assert_eq!(resp.ok().status, 502);
    assert!(resp.ok().text().contains("407"), "{resp:#?}");
    drop(lk);

    let lk = latchkey_for(&ca, port)
        .arg("--upstream-proxy")
        .arg(&squid.url())
        .arg("--upstream-proxy-credentials")
        .arg("alice:env:UPSTREAM_PROXY_IT_PASS")
        .env("UPSTREAM_PROXY_IT_PASS", PROXY_PASSWORD)
        .env("RUST_LOG", "debug")
        .run();
    let resp = get(&lk, port);
    assert_eq!(resp.ok().status, 200, "{resp:#?}\n{}", lk.stderr_text());
    assert_eq!(upstream.received()[0].header("x-api-key"), Some(KEY));
    let stderr = lk.stderr_text();
    let audit = lk.audit_text();
    drop(lk);
    assert!(!stderr.contains(PROXY_PASSWORD) && !audit.contains(PROXY_PASSWORD));
    let log = squid.wait_access_lines(2);
    assert!(
        log.iter()
            .any(|l| l.contains(" alice ") && l.contains(&format!("CONNECT 127.0.0.1:{port}"))),
        "{log:?}"
    );
}

#[test]
fn the_guard_still_refuses_a_private_address_the_proxy_could_reach() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let squid = Squid::start(SquidConf {
        upstream_port: port,
        deny: false,
        user: None,
    });
    // No --allow-private: api.test resolves to loopback, which Squid could reach.
    let lk = latchkey_for(&ca, port)
        .guarded()
        .arg("--upstream-proxy")
        .arg(&squid.url())
        .run();
    let resp = get(&lk, port);
    assert_eq!(resp.ok().status, 403, "{resp:#?}");
    assert_eq!(
        resp.ok().header("x-latchkey-reason"),
        Some("non_public_address")
    );
    drop(lk);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(squid.access_log(), "");
    assert_eq!(upstream.connections(), 0);
}

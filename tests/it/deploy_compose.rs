//! The shipped `docker/compose.yaml`, started for real on a Docker engine (Debian's docker.io,
//! in a network namespace of its own: [`support::docker`]), with latchkey's image built by the
//! shipped `docker/Dockerfile` from a host-built binary (`BINARY=prebuilt`) on a locally made
//! distroless-like runtime. The compose file runs unchanged; an override file adds only what a
//! test needs: an HTTPS upstream on the egress network with its own CA, a policy injecting a
//! secret into it, and the variables telling latchkey to trust that CA and reach its address.
//!
//! From inside the sandbox container it proves: a client honouring `HTTPS_PROXY` gets the
//! secret injected; one ignoring every proxy variable gets the same through latchkey's resolver
//! and DNS-routed listeners; a host no rule names is refused with latchkey's reason (and does
//! not even resolve); raw TCP, UDP, ICMP and ssh to the upstream's address fail (while the same
//! probes to latchkey succeed); the host's own listening ports are reachable until
//! `gateway-setup --host-guard` is applied, and not after, while the proxy and DNS keep
//! working. Then: the audit volume holds the records (no secret), the image is lean, non-root,
//! read-only and shell-less, `down` removes everything in seconds, and the host is as it was.
//!
//! Needs root (network namespaces, dockerd); skip with `--skip deploy_compose`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::ca::TestCa;
use crate::support::docker::{output, run_ok, write_public, Engine, HostState, BASE, RUNTIME};
use crate::support::latchkey::BIN;

/// The secret the policy injects; it must appear nowhere the sandbox or a reviewer reads.
const SECRET: &str = "lk-compose-secret-7Qx93vTz";
/// The upstream's fixed address on the egress network (latchkey opens it by --allow-private).
const UPSTREAM_IP: &str = "172.31.250.20";
/// latchkey's address on the sandbox network (compose.yaml's).
const LATCHKEY_IP: &str = "172.30.0.10";
/// The sandbox network's gateway: the host, as the sandbox sees it.
const SANDBOX_GATEWAY: &str = "172.30.0.1";
/// The egress network's gateway (the override's subnet): the host again, by another address.
const EGRESS_GATEWAY: &str = "172.31.250.1";
/// The port the "host" (the engine's namespace) listens on at 0.0.0.0.
const HOST_PORT: u16 = 8088;

/// The upstream: answers JSON saying whether the expected bearer token arrived (never echoing
/// it: latchkey would scrub it, and the check is the point).
const SERVER: &str = r#"
import http.server, json, ssl
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.headers.get("authorization", "") == "Bearer " + open("/up/expected").read()
        body = json.dumps({"path": self.path, "authorized": ok}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/up/cert.pem", "/up/key.pem")
s = http.server.ThreadingHTTPServer(("0.0.0.0", 443), H)
s.socket = ctx.wrap_socket(s.socket, server_side=True)
s.serve_forever()
"#;

const POLICY: &str = r#"
[secrets.upstream]
source = "env:UPSTREAM_TOKEN"

[[rules]]
name = "upstream-api"
hosts = ["api.upstream.test"]
methods = ["GET"]
[rules.inject.headers]
authorization = "Bearer {{secret.upstream}}"
"#;

/// Probes run in the sandbox with its Python: `tcp HOST PORT`, `udp HOST PORT`; prints `open`,
/// `answered` or the error.
const PROBE: &str = r#"
import socket, sys
kind, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    if kind == "tcp":
        socket.create_connection((host, port), timeout=3).close()
        print("open")
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(3)
        # A DNS query for example.com: any resolver answering it proves UDP got out.
        q = bytes.fromhex("abcd01000001000000000000076578616d706c6503636f6d0000010001")
        s.sendto(q, (host, port))
        s.recvfrom(512)
        print("answered")
except Exception as e:
    print(type(e).__name__, e)
"#;

struct Project<'a> {
    engine: &'a Engine,
    name: String,
    files: Vec<String>,
}

impl Project<'_> {
    fn compose(&self) -> Command {
        let mut cmd = self.engine.compose();
        cmd.current_dir(repo().join("docker"))
            .args(["-p", &self.name]);
        for f in &self.files {
            cmd.args(["-f", f]);
        }
        cmd
    }

    /// `docker-compose exec -T sandbox ARGS...`: (status success, stdout + stderr).
    fn sandbox(&self, args: &[&str]) -> (bool, String) {
        let out = output(self.compose().args(["exec", "-T", "sandbox"]).args(args));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    fn probe(&self, kind: &str, host: &str, port: u16) -> String {
        let port = port.to_string();
        self.sandbox(&["python3", "-c", PROBE, kind, host, &port])
            .1
            .trim()
            .to_string()
    }
}

impl Drop for Project<'_> {
    fn drop(&mut self) {
        let _ = output(self.compose().args(["down", "-v", "--timeout", "5"]));
    }
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The context for `docker build -f docker/Dockerfile --build-arg BINARY=prebuilt`: what the
/// Dockerfile copies, with the test binary stripped as the release build would be.
fn build_context() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a build context");
    std::fs::create_dir_all(dir.path().join("docker/prebuilt")).expect("mkdir");
    std::fs::create_dir_all(dir.path().join("policies/tests")).expect("mkdir");
    for file in ["policies/example.toml", "policies/tests/example.toml"] {
        std::fs::copy(repo().join(file), dir.path().join(file)).expect("copy a policy");
    }
    run_ok(
        Command::new("objcopy")
            .arg("--strip-all")
            .arg(BIN)
            .arg(dir.path().join("docker/prebuilt/latchkey")),
    );
    dir
}

/// The override: the upstream service, the test policy and the secret, nothing of the
/// shipped services' shape.
fn override_file(dir: &Path, ca: &TestCa) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let up = dir.join("up");
    let policies = dir.join("policies");
    for d in [dir, &up, &policies] {
        std::fs::create_dir_all(d).expect("mkdir");
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let (cert, key) = ca.issue_pem_files(&["api.upstream.test"], "compose-upstream");
    for (from, to) in [
        (cert, "cert.pem"),
        (key, "key.pem"),
        (ca.pem_path(), "ca.pem"),
    ] {
        write_public(&up.join(to), &std::fs::read(from).expect("read a PEM"));
    }
    write_public(&up.join("server.py"), SERVER.as_bytes());
    write_public(&up.join("expected"), SECRET.as_bytes());
    write_public(&policies.join("test.toml"), POLICY.as_bytes());
    let text = format!(
        r#"services:
  latchkey:
    environment:
      UPSTREAM_TOKEN: {SECRET}
      LATCHKEY_UPSTREAM_CA: /up/ca.pem
      LATCHKEY_ALLOW_PRIVATE: {UPSTREAM_IP}/32
    volumes:
      - {policies}:/etc/latchkey/policies:ro
      - {up}:/up:ro
  upstream:
    image: {BASE}
    init: true
    command: ["python3", "/up/server.py"]
    networks:
      egress:
        ipv4_address: {UPSTREAM_IP}
        aliases: [api.upstream.test]
    volumes:
      - {up}:/up:ro
networks:
  egress:
    ipam:
      config:
        - subnet: 172.31.250.0/24
"#,
        policies = policies.display(),
        up = up.display(),
    );
    let path = dir.join("override.yaml");
    std::fs::write(&path, text).expect("write the override");
    path.display().to_string()
}

fn json_field(text: &str, field: &str) -> Option<serde_json::Value> {
    let start = text.find('{')?;
    let value: serde_json::Value = serde_json::from_str(text[start..].trim()).ok()?;
    value.get(field).cloned()
}

#[test]
fn deploy_compose_up_confines_the_sandbox_to_latchkey_and_leaves_the_host_as_it_was() {
    let before = HostState::now();
    let started = Instant::now();
    let engine = Engine::start();
    engine.bases();
    eprintln!("engine and base images ready: {:.1?}", started.elapsed());

    // The image, with the shipped Dockerfile.
    let context = build_context();
    let t = Instant::now();
    run_ok(
        engine
            .docker()
            .args(["build", "-q", "-f"])
            .arg(repo().join("docker/Dockerfile"))
            .args(["--build-arg", &format!("BUILDER={BASE}")])
            .args(["--build-arg", &format!("RUNTIME={RUNTIME}")])
            .args(["--build-arg", "BINARY=prebuilt", "-t", "latchkey:local"])
            .arg(context.path()),
    );
    eprintln!("latchkey:local built: {:.1?}", t.elapsed());
    check_image(&engine);

    let ca = TestCa::new();
    let dir = tempfile::tempdir().expect("a directory for the override");
    let project = Project {
        engine: &engine,
        name: format!("lk{}", std::process::id()),
        files: vec!["compose.yaml".to_string(), override_file(dir.path(), &ca)],
    };
    let t = Instant::now();
    let up = output(project.compose().args(["up", "-d"]));
    assert!(
        up.status.success(),
        "docker-compose up failed:\n{}\nlatchkey's log:\n{}",
        String::from_utf8_lossy(&up.stderr),
        String::from_utf8_lossy(&output(project.compose().args(["logs", "latchkey"])).stdout)
    );
    eprintln!("compose up (sandbox healthy-gated): {:.1?}", t.elapsed());

    // The running service as compose.yaml confines it.
    let confined = run_ok(project.compose().args(["ps", "-q", "latchkey"]));
    let confined = run_ok(engine.docker().args([
        "inspect",
        confined.trim(),
        "--format",
        "{{.HostConfig.ReadonlyRootfs}} {{json .HostConfig.CapDrop}} {{.Config.User}} {{.State.Health.Status}}",
    ]));
    assert_eq!(
        confined.trim(),
        r#"true ["ALL"] 10001:10001 healthy"#,
        "latchkey's container: read-only root, no capability, non-root, healthy"
    );

    check_reach(&project);
    check_isolation(&project);
    check_host_guard(&project, &engine);
    check_audit(&project, &engine);

    let logs = output(project.compose().args(["logs", "--no-color"]));
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&logs.stdout),
        String::from_utf8_lossy(&logs.stderr)
    );
    assert!(
        !logs.contains(SECRET),
        "the secret is in the services' logs"
    );

    let t = Instant::now();
    run_ok(project.compose().args(["down", "-v", "--timeout", "10"]));
    let down = t.elapsed();
    eprintln!("compose down -v: {down:.1?}");
    assert!(
        down < Duration::from_secs(8),
        "down took {down:?}: a service ignores the stop signal (init: true forwards it)"
    );
    let label = format!("label=com.docker.compose.project={}", project.name);
    for what in [
        vec!["ps", "-aq", "--filter", &label],
        vec!["network", "ls", "-q", "--filter", &label],
        vec!["volume", "ls", "-q", "--filter", &label],
    ] {
        let left = run_ok(engine.docker().args(&what));
        assert!(
            left.trim().is_empty(),
            "after down, `docker {what:?}` lists {left}"
        );
    }
    drop(project);
    engine.stop();
    let after = HostState::now();
    assert_eq!(before, after, "the host changed while the engine ran");
    eprintln!("the whole compose test: {:.1?}", started.elapsed());
}

/// Lean, non-root, shell-less, health-checked by latchkey itself.
fn check_image(engine: &Engine) {
    let inspect = run_ok(engine.docker().args([
        "image",
        "inspect",
        "latchkey:local",
        "--format",
        "{{.Size}} {{.Config.User}} {{json .Config.Healthcheck.Test}}",
    ]));
    let mut words = inspect.split_whitespace();
    let size: u64 = words
        .next()
        .and_then(|s| s.parse().ok())
        .expect("image size");
    eprintln!("latchkey:local is {:.1} MB", size as f64 / 1e6);
    assert_eq!(words.next(), Some("10001:10001"), "the image runs as 10001");
    let health = words.collect::<Vec<_>>().join(" ");
    assert!(
        health.contains("\"/usr/local/bin/latchkey\",\"health\""),
        "HEALTHCHECK is not `latchkey health`: {health}"
    );
    // A debug build stripped is larger than the release one; either way nothing but the
    // binary, glibc and the CA roots.
    assert!(size < 80_000_000, "latchkey:local is {size} bytes");
    let shell = output(engine.docker().args([
        "run",
        "--rm",
        "--entrypoint",
        "/bin/sh",
        "latchkey:local",
        "-c",
        "true",
    ]));
    assert!(!shell.status.success(), "the image has a shell");
}

/// Both ways out of the sandbox reach the upstream with the secret injected; a denied host is
/// refused with latchkey's reason.
fn check_reach(project: &Project) {
    let (ok, text) = project.sandbox(&["curl", "-sS", "-i", "https://api.upstream.test/via-proxy"]);
    assert!(ok, "curl through HTTPS_PROXY failed: {text}");
    assert!(
        text.contains("x-latchkey-id:"),
        "not through latchkey: {text}"
    );
    assert_eq!(json_field(&text, "authorized"), Some(true.into()), "{text}");
    assert!(!text.contains(SECRET), "the sandbox saw the secret: {text}");

    // No proxy variable honoured: the name resolves to latchkey, whose 443 takes SNI.
    let (ok, text) = project.sandbox(&[
        "curl",
        "-sS",
        "--noproxy",
        "*",
        "https://api.upstream.test/dns-routed",
    ]);
    assert!(ok, "curl ignoring the proxy variables failed: {text}");
    assert_eq!(json_field(&text, "authorized"), Some(true.into()), "{text}");
    let (ok, text) = project.sandbox(&["getent", "hosts", "api.upstream.test"]);
    assert!(ok && text.contains(LATCHKEY_IP), "{text}");

    let (ok, text) = project.sandbox(&["curl", "-sS", "-i", "https://denied.example/"]);
    assert!(!ok, "a host no rule names was reached: {text}");
    assert!(
        text.contains("x-latchkey-reason: no_rule"),
        "the refusal does not carry latchkey's reason: {text}"
    );
    let (ok, text) = project.sandbox(&["getent", "hosts", "denied.example"]);
    assert!(!ok, "a host no rule names resolves: {text}");
}

/// Nothing but latchkey answers: every probe that reaches latchkey fails elsewhere.
fn check_isolation(project: &Project) {
    assert_eq!(project.probe("tcp", LATCHKEY_IP, 3128), "open");
    assert_eq!(project.probe("udp", LATCHKEY_IP, 53), "answered");
    for (kind, host, port) in [
        ("tcp", UPSTREAM_IP, 443),
        ("tcp", UPSTREAM_IP, 22),
        ("udp", UPSTREAM_IP, 53),
        ("udp", "1.1.1.1", 53),
        ("tcp", "1.1.1.1", 443),
    ] {
        let got = project.probe(kind, host, port);
        assert!(
            got != "open" && got != "answered",
            "the sandbox reached {kind} {host}:{port} directly: {got}"
        );
    }
    let (ok, text) = project.sandbox(&["ping", "-c1", "-W2", LATCHKEY_IP]);
    assert!(ok, "ICMP to latchkey (the control) failed: {text}");
    let (ok, text) = project.sandbox(&["ping", "-c1", "-W2", UPSTREAM_IP]);
    assert!(!ok, "ICMP reached the upstream: {text}");
    let (ok, text) = project.sandbox(&[
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=3",
        "-o",
        "StrictHostKeyChecking=no",
        UPSTREAM_IP,
        "true",
    ]);
    assert!(!ok && text.contains("ssh:"), "ssh got somewhere: {text}");
}

/// The host's listening port is open to the sandbox until the guard is applied, and only then
/// closed; latchkey keeps working through it.
fn check_host_guard(project: &Project, engine: &Engine) {
    let mut server = engine
        .in_netns("python3")
        .args([
            "-m",
            "http.server",
            &HOST_PORT.to_string(),
            "--bind",
            "0.0.0.0",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the host's listener");
    let deadline = Instant::now() + Duration::from_secs(10);
    // The hole, shown: without the guard the sandbox reaches the host on both gateways.
    while project.probe("tcp", SANDBOX_GATEWAY, HOST_PORT) != "open" {
        assert!(
            Instant::now() < deadline,
            "the host's listener never came up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(project.probe("tcp", EGRESS_GATEWAY, HOST_PORT), "open");

    // What the book says to run: the image prints the ruleset, the host's nft loads it.
    let rules = run_ok(engine.docker().args([
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "/usr/local/bin/latchkey",
        "latchkey:local",
        "gateway-setup",
        "--host-guard",
        "--interface",
        "lk-sandbox",
    ]));
    let mut nft = engine
        .in_netns("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("run nft");
    {
        use std::io::Write as _;
        nft.stdin
            .take()
            .expect("nft's stdin")
            .write_all(rules.as_bytes())
            .expect("feed nft");
    }
    assert!(nft.wait().expect("nft").success(), "nft refused:\n{rules}");

    for gateway in [SANDBOX_GATEWAY, EGRESS_GATEWAY] {
        let got = project.probe("tcp", gateway, HOST_PORT);
        assert_ne!(got, "open", "the host's port is still open on {gateway}");
    }
    let (ok, text) = project.sandbox(&["curl", "-sS", "https://api.upstream.test/after-guard"]);
    assert!(ok, "the proxy stopped working under the guard: {text}");
    let (ok, text) = project.sandbox(&[
        "curl",
        "-sS",
        "--noproxy",
        "*",
        "https://api.upstream.test/after-guard-dns",
    ]);
    assert!(
        ok,
        "DNS-routed requests stopped working under the guard: {text}"
    );
    let counters = run_ok(
        engine
            .in_netns("nft")
            .args(["list", "table", "inet", "latchkey_host"]),
    );
    assert!(
        !counters.contains("counter packets 0 "),
        "the guard dropped nothing:\n{counters}"
    );
    let _ = server.kill();
    let _ = server.wait();
}

/// The audit volume holds a decision for each request, with the rule and the secret's name,
/// never its value.
fn check_audit(project: &Project, engine: &Engine) {
    let volume = format!("{}_latchkey-audit:/audit:ro", project.name);
    let text = run_ok(engine.docker().args([
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        &volume,
        BASE,
        "cat",
        "/audit/audit.jsonl",
    ]));
    assert!(!text.contains(SECRET), "the audit log holds the secret");
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let outcome = |path: &str| {
        records.iter().find(|r| {
            r["phase"] == "outcome" && r["host"] == "api.upstream.test" && r["path"] == path
        })
    };
    for path in [
        "/via-proxy",
        "/dns-routed",
        "/after-guard",
        "/after-guard-dns",
    ] {
        let r = outcome(path).unwrap_or_else(|| panic!("no outcome record for {path}:\n{text}"));
        assert_eq!(r["decision"], "allow", "{r}");
        assert_eq!(r["rule"], "upstream-api", "{r}");
        assert_eq!(r["status"], 200, "{r}");
        assert_eq!(r["secrets"], serde_json::json!(["upstream"]), "{r}");
        assert_eq!(r["upstream"], format!("{UPSTREAM_IP}:443"), "{r}");
    }
    assert!(
        records
            .iter()
            .any(|r| r["host"] == "denied.example" && r["reason"] == "no_rule"),
        "no record refusing denied.example:\n{text}"
    );
}

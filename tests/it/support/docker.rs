//! A real Docker engine for the deployment tests, started by the test and stopped by PID, that
//! leaves the host as it found it.
//!
//! `dockerd` (Debian's `docker.io`, installed by [`toolchain`] like every tool) changes the
//! host it runs on: it turns IP forwarding on, sets the forward policy to DROP, adds iptables
//! chains and bridges, and leaves rules behind when it exits — enough to break the project's
//! own namespace tests. So [`Engine::start`] runs it inside a network namespace of its own
//! (`nsenter --net`, keeping the host's mounts and cgroups, which containers need): every sysctl,
//! rule, bridge and veth it makes lives and dies with that namespace. [`HostState`] records
//! what the host had before; the test compares it after [`Engine::stop`].
//!
//! No registry is reachable from these machines, so images are made locally: [`Engine::bases`]
//! imports a `debootstrap --variant=minbase` of Debian bookworm (cached as a tarball under
//! `target/tmp`, ~90 s once) as `debian:bookworm-slim`, and builds from it a distroless-like
//! runtime (glibc, libgcc, CA roots, no shell) for latchkey's image. The engine's data root is
//! kept under `target/tmp` too, so a second run reuses its layers.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::netns::Netns;
use super::toolchain;

/// Debian's docker CLI (20.10): it speaks BuildKit with `DOCKER_BUILDKIT=1`. A newer client on
/// `PATH` without the buildx plugin would fall back to the legacy builder.
pub const DOCKER: &str = "/usr/bin/docker";

/// The image tag the shipped compose file's sandbox uses, made here by debootstrap.
pub const BASE: &str = "debian:bookworm-slim";

/// The stand-in for a distroless runtime: glibc, libgcc_s and the CA roots, nothing else.
pub const RUNTIME: &str = "latchkey-test/cc:bookworm";

/// What the base image holds: the sandbox's clients and the upstream's Python.
const PACKAGES: &str = "ca-certificates,curl,python3,openssh-client,iputils-ping";

const TARGET_TMP: &str = env!("CARGO_TARGET_TMPDIR");

/// How long dockerd may take to answer after it starts.
const START: Duration = Duration::from_secs(60);

/// What a test compares on the host before and after it ran an engine: what dockerd would
/// change were it not confined to its namespace. Only Docker's own names are compared among
/// links, so another test's veth coming or going meanwhile is not a difference.
#[derive(Debug, PartialEq, Eq)]
pub struct HostState {
    ip_forward: String,
    /// `family name` of every nftables table (iptables-nft's `ip filter`, `ip nat` among them).
    tables: Vec<String>,
    /// Whether any chain is Docker's (`DOCKER`, `DOCKER-USER`, `DOCKER-ISOLATION-STAGE-1`).
    docker_chains: bool,
    /// Interfaces dockerd makes: `docker0`, `br-<id>`, the compose file's `lk-sandbox`.
    docker_links: Vec<String>,
}

impl HostState {
    /// The host's IPv4 forwarding, nftables tables and Docker-made interfaces, now.
    pub fn now() -> HostState {
        let ip_forward = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
            .expect("read /proc/sys/net/ipv4/ip_forward")
            .trim()
            .to_string();
        let tables = run_ok(Command::new(toolchain::tool("nft")).args(["list", "tables"]))
            .lines()
            .map(|l| l.trim().trim_start_matches("table ").to_string())
            .collect();
        let ruleset = run_ok(Command::new(toolchain::tool("nft")).args(["list", "ruleset"]));
        let docker_links = run_ok(Command::new(toolchain::tool("ip")).args(["-br", "link"]))
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(|name| name.split('@').next().unwrap_or(name).to_string())
            .filter(|name| name == "docker0" || name.starts_with("br-") || name == "lk-sandbox")
            .collect();
        HostState {
            ip_forward,
            tables,
            docker_chains: ruleset.contains("chain DOCKER"),
            docker_links,
        }
    }
}

/// `cmd`'s stdout, panicking with its stderr when it fails.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `cmd`'s output, panicking only when it cannot be run at all.
pub fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// A dockerd in a network namespace of its own, stopped (and the namespace deleted) on
/// [`Engine::stop`] or drop.
pub struct Engine {
    ns: Netns,
    daemon: Option<Child>,
    /// The socket, the exec root and the pid file: a short path (unix sockets are limited to
    /// 108 bytes), removed on drop.
    run: tempfile::TempDir,
    /// Held while the engine runs: one dockerd per data root.
    _lock: File,
}

impl Engine {
    /// Installs what is missing, then starts dockerd and waits until it answers.
    pub fn start() -> Engine {
        for tool in [
            "dockerd",
            "docker-compose",
            "debootstrap",
            "objcopy",
            "nsenter",
        ] {
            toolchain::tool(tool);
        }
        let root = Path::new(TARGET_TMP).join("docker");
        let data = root.join("data");
        std::fs::create_dir_all(&data).expect("create the engine's data root");
        let lock = File::create(root.join("lock")).expect("create the engine's lock file");
        lock.lock().expect("lock the engine's data root");
        kill_stale(&data);
        let ns = Netns::new("docker");
        let run = tempfile::Builder::new()
            .prefix("lkd")
            .tempdir_in("/tmp")
            .expect("a directory for dockerd's socket");
        let log = File::create(root.join("dockerd.log")).expect("create dockerd.log");
        let netns_path = format!("/var/run/netns/{}", ns.name());
        let daemon = Command::new(toolchain::tool("nsenter"))
            .arg(format!("--net={netns_path}"))
            .arg("dockerd")
            .arg("--data-root")
            .arg(&data)
            .arg("--exec-root")
            .arg(run.path().join("exec"))
            .arg("--pidfile")
            .arg(run.path().join("dockerd.pid"))
            .arg("-H")
            .arg(format!(
                "unix://{}",
                run.path().join("docker.sock").display()
            ))
            .env_remove("DOCKER_HOST")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup dockerd.log"))
            .stderr(log)
            .spawn()
            .expect("start dockerd");
        let engine = Engine {
            ns,
            daemon: Some(daemon),
            run,
            _lock: lock,
        };
        engine.wait_ready(&root.join("dockerd.log"));
        engine
    }

    fn wait_ready(&self, log: &Path) {
        let deadline = Instant::now() + START;
        loop {
            if output(
                self.docker()
                    .args(["version", "--format", "{{.Server.Version}}"]),
            )
            .status
            .success()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "dockerd did not answer within {START:?}; its log:\n{}",
                tail(log)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `DOCKER_HOST` for this engine.
    pub fn host(&self) -> String {
        format!("unix://{}", self.run.path().join("docker.sock").display())
    }

    /// `docker` talking to this engine, BuildKit on.
    pub fn docker(&self) -> Command {
        let mut cmd = Command::new(DOCKER);
        cmd.env("DOCKER_HOST", self.host())
            .env("DOCKER_BUILDKIT", "1");
        cmd
    }

    /// `docker-compose` (v1, Debian's) talking to this engine.
    pub fn compose(&self) -> Command {
        let mut cmd = Command::new(toolchain::tool("docker-compose"));
        cmd.env("DOCKER_HOST", self.host())
            .env("DOCKER_BUILDKIT", "1")
            .env("COMPOSE_DOCKER_CLI_BUILD", "1");
        cmd
    }

    /// A program run in the engine's namespace without `ip netns exec`'s remount of /sys.
    pub fn in_netns(&self, program: &str) -> Command {
        let mut cmd = Command::new(toolchain::tool("nsenter"));
        cmd.arg(format!("--net=/var/run/netns/{}", self.ns.name()))
            .arg(program);
        cmd
    }

    /// Makes `debian:bookworm-slim` (debootstrap, cached) and the distroless-like runtime,
    /// unless this engine has them already.
    pub fn bases(&self) {
        if !output(self.docker().args(["image", "inspect", BASE]))
            .status
            .success()
        {
            let tarball = base_tarball();
            let file = File::open(&tarball).expect("open the base tarball");
            let out = self
                .docker()
                .args(["import", "-", BASE])
                .stdin(file)
                .output()
                .expect("run docker import");
            assert!(
                out.status.success(),
                "docker import {}: {}",
                tarball.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if !output(self.docker().args(["image", "inspect", RUNTIME]))
            .status
            .success()
        {
            let dir = tempfile::tempdir().expect("a build context");
            // bookworm is usrmerged: the loader and libraries live under /usr/lib, and the
            // binaries' interpreter path /lib64/ld-linux-x86-64.so.2 gets a real file.
            let dockerfile = format!(
                "FROM {BASE} AS src\n\
                 FROM scratch\n\
                 COPY --from=src /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 /lib64/ld-linux-x86-64.so.2\n\
                 COPY --from=src /usr/lib/x86_64-linux-gnu/libc.so.6 /usr/lib/x86_64-linux-gnu/libm.so.6 \
                 /usr/lib/x86_64-linux-gnu/libgcc_s.so.1 /usr/lib/x86_64-linux-gnu/\n\
                 COPY --from=src /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\n"
            );
            std::fs::write(dir.path().join("Dockerfile"), dockerfile).expect("write Dockerfile");
            run_ok(
                self.docker()
                    .args(["build", "-q", "-t", RUNTIME])
                    .arg(dir.path()),
            );
        }
    }

    /// Stops dockerd (SIGTERM, then SIGKILL after 30 s) and deletes its namespace.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let Some(mut daemon) = self.daemon.take() else {
            return;
        };
        let pid = daemon.id().to_string();
        // nsenter execs dockerd: the child's PID is dockerd's.
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = daemon.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = daemon.kill();
        let _ = daemon.wait();
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Kills a dockerd (or its containerd) a crashed earlier run left on `data`: two daemons
/// cannot share a data root.
fn kill_stale(data: &Path) {
    let needle = data.display().to_string();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in procs.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&needle) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
    std::thread::sleep(Duration::from_millis(200));
}

/// The last lines of a log, for a failure message.
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The debootstrapped base as a tarball, made once (under a file lock) and kept.
fn base_tarball() -> PathBuf {
    let dir = Path::new(TARGET_TMP).join("docker-base");
    std::fs::create_dir_all(&dir).expect("create target/tmp/docker-base");
    let tarball = dir.join(format!("bookworm-{}.tar", PACKAGES.replace(',', "+")));
    if tarball.is_file() {
        return tarball;
    }
    let root = dir.join("root");
    let _ = std::fs::remove_dir_all(&root);
    let mirror = apt_mirror();
    let started = Instant::now();
    run_ok(
        Command::new(toolchain::tool("debootstrap"))
            .args([
                "--variant=minbase",
                &format!("--include={PACKAGES}"),
                "bookworm",
            ])
            .arg(&root)
            .arg(&mirror),
    );
    eprintln!(
        "debootstrap bookworm from {mirror}: {:.0?}",
        started.elapsed()
    );
    let partial = dir.join("partial.tar");
    run_ok(
        Command::new("tar")
            .arg("-C")
            .arg(&root)
            .args(["-cf"])
            .arg(&partial)
            .arg("."),
    );
    std::fs::rename(&partial, &tarball).expect("keep the base tarball");
    let _ = std::fs::remove_dir_all(&root);
    tarball
}

/// The Debian mirror apt itself uses (deb822 `URIs:` or a `deb URL bookworm` line), so the
/// base comes from where this machine is allowed to fetch.
fn apt_mirror() -> String {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        more.sort();
        files.extend(more);
    }
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for line in text.lines().map(str::trim) {
            let url = if let Some(rest) = line.strip_prefix("URIs:") {
                rest.split_whitespace().next()
            } else if let Some(rest) = line.strip_prefix("deb ") {
                rest.split_whitespace().find(|w| w.contains("://"))
            } else {
                None
            };
            if let Some(url) = url.filter(|u| !u.contains("security")) {
                return url.to_string();
            }
        }
    }
    panic!("no Debian mirror found in apt's sources (/etc/apt/sources.list[.d])")
}

/// Writes `text` to `path` with mode 0644 (read by a container's non-root user).
pub fn write_public(path: &Path, text: &[u8]) {
    use std::os::unix::fs::PermissionsExt as _;
    let mut file = File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    file.write_all(text)
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

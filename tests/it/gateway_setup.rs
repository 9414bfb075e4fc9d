//! `latchkey gateway-setup`: its rulesets pass real `nft -c`, bad flags are refused naming the
//! flag, and, applied for real in network namespaces, the sandbox's only way out is latchkey:
//!
//! - `--interface` (the gateway harness of `support::netns`, with IPv6 added and forwarding
//!   switched ON in latchkey's namespace, so that without the rules the sandbox does reach the
//!   upstream — checked first — and what stops it afterwards is the ruleset): TCP 443/80 land on
//!   a plain listener on the transparent port with their original destination, DNS (UDP and
//!   TCP) on the resolver port, the local port on itself; TCP 22, UDP 443, ICMP echo, a direct
//!   connection to the transparent port and any other port of latchkey's host get no answer and
//!   reach no upstream, over IPv4 and IPv6; applying twice leaves one table; `--remove` restores
//!   the direct route.
//! - `--cgroup` ([`cgroup`]: one namespace holding the sandbox's processes and latchkey, as on
//!   one host): the cgroup's sockets are captured the same way; a process outside the cgroup —
//!   where latchkey runs — is not.
//!
//! The listeners are `tests/clients/capture_server.py`, the client `tests/clients/capture_probe.py`
//! (TCP, UDP and raw ICMP). Needs root (namespaces, nft, cgroups), like `gateway.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::latchkey::{wait_with_timeout, CliOutput, BIN, SCRUBBED_ENV};
use crate::support::netns::{Gateway, Netns, NsProcess, PROXY_IP, SANDBOX_IP, UPSTREAM_IP};
use crate::support::toolchain::{python, tool};

mod cgroup;

pub(crate) const CLIENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients");

/// IPv6 addresses added to the gateway harness: the sandbox link and the upstream link.
const SANDBOX_IP6: &str = "fd00:200::2";
const PROXY_IP6: &str = "fd00:200::1";
const PROXY_UPLINK_IP6: &str = "fd00:201::1";
const UPSTREAM_IP6: &str = "fd00:201::2";

/// `gateway-setup`'s defaults.
const TRANSPARENT: u16 = 15001;
const RESOLVER: u16 = 15053;

/// `latchkey gateway-setup ARGS` inside `ns` (through nsenter, so `--cgroup` sees the cgroups).
fn setup_in(ns: &Netns, args: &[&str]) -> CliOutput {
    let mut cmd = nsenter(ns, BIN);
    cmd.arg("gateway-setup").args(args);
    wait_with_timeout(&mut cmd, Duration::from_secs(20))
}

/// `nsenter --net=NS PROGRAM`: inside `ns`'s network namespace but with this machine's mounts,
/// so `/sys/fs/cgroup` is there (`ip netns exec` mounts a fresh `/sys` without it).
fn nsenter(ns: &Netns, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(tool("nsenter"));
    cmd.arg(format!("--net=/run/netns/{}", ns.name()))
        .arg(program);
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    cmd
}

/// `latchkey gateway-setup ARGS` printing its ruleset (outside any namespace: it reads nothing
/// of the network).
fn printed(args: &[&str]) -> String {
    let mut cmd = Command::new(BIN);
    cmd.arg("gateway-setup").args(args);
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(20));
    assert_eq!(
        out.code(),
        Some(0),
        "gateway-setup {args:?}: {}",
        out.stderr
    );
    out.stdout
}

/// `nft -c -f FILE` (check only) inside `ns`, through nsenter so cgroup paths resolve.
fn nft_check(ns: &Netns, ruleset: &str) -> CliOutput {
    let file = tempfile::NamedTempFile::new().expect("ruleset file");
    std::fs::write(file.path(), ruleset).expect("write ruleset");
    let mut cmd = nsenter(ns, tool("nft"));
    cmd.arg("-c").arg("-f").arg(file.path());
    wait_with_timeout(&mut cmd, Duration::from_secs(20))
}

pub(crate) fn nft_tables(ns: &Netns) -> String {
    let mut cmd = ns.command(tool("nft"));
    cmd.args(["list", "tables"]);
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(20));
    assert_eq!(out.code(), Some(0), "nft list tables: {}", out.stderr);
    out.stdout
}

/// A cgroup (v2) of this test, two levels deep (`latchkey-test-PID-N/sandbox`), removed on drop.
struct TestCgroup {
    mount: PathBuf,
    parent: PathBuf,
    /// Its path relative to the cgroup2 root, as `--cgroup` takes it.
    rel: String,
}

impl TestCgroup {
    fn new() -> TestCgroup {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let info = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
        let mount = latchkey::cli::gateway_setup::cgroup2_mount_in(&info)
            .expect("a cgroup2 filesystem is mounted (the cgroup tests need one)");
        let top = format!(
            "latchkey-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let parent = mount.join(&top);
        let dir = parent.join("sandbox");
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("create cgroup {}: {e}", dir.display()));
        TestCgroup {
            mount,
            parent,
            rel: format!("{top}/sandbox"),
        }
    }

    fn dir(&self) -> PathBuf {
        self.mount.join(&self.rel)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(self.dir());
        let _ = std::fs::remove_dir(&self.parent);
    }
}

/// Runs `capture_probe.py` with `cmd` (a command for the interpreter, in the right namespace)
/// and returns each probe's outcome: `answer TEXT` or `none WHY`.
pub(crate) fn probe(mut cmd: Command, specs: &[String]) -> BTreeMap<String, String> {
    cmd.arg(Path::new(CLIENTS).join("capture_probe.py"))
        .args(["--timeout", "1"])
        .args(specs);
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(60));
    assert_eq!(out.code(), Some(0), "capture_probe: {out:#?}");
    out.stdout
        .lines()
        .filter_map(|l| {
            let (spec, outcome) = l.split_once(' ')?;
            Some((spec.to_string(), outcome.to_string()))
        })
        .collect()
}

/// Checks every `(probe, expected)` against `got`: `Some(TEXT)` must be answered with TEXT,
/// `None` must get no answer at all: silence until the timeout, or EPERM when the packet is the
/// host's own and its output chain dropped it (cgroup mode) — never a refusal, which would be
/// an answer from something. Panics listing every mismatch.
pub(crate) fn expect(
    when: &str,
    got: &BTreeMap<String, String>,
    want: &[(String, Option<String>)],
) {
    let mut problems = Vec::new();
    for (spec, answer) in want {
        let outcome = got.get(spec).map(String::as_str).unwrap_or("(not run)");
        let ok = match answer {
            Some(text) => outcome == format!("answer {text}"),
            None => {
                outcome.starts_with("none TimeoutError")
                    || outcome.starts_with("none PermissionError: [Errno 1]")
            }
        };
        if !ok {
            let wanted = answer
                .as_deref()
                .map_or("no answer".to_string(), |t| format!("answer {t}"));
            problems.push(format!("{spec}: wanted {wanted}, got {outcome}"));
        }
    }
    assert!(problems.is_empty(), "{when}:\n{}", problems.join("\n"));
}

/// The lines a capture server printed about traffic (not its `listening on` line), once at
/// least `n` are there (at most 5 s: its output is read by a thread), then a moment more so a
/// line too many would show.
pub(crate) fn traffic(server: &NsProcess, n: usize) -> Vec<String> {
    let lines = || -> Vec<String> {
        server
            .output()
            .lines()
            .filter(|l| !l.starts_with("listening on"))
            .map(str::to_string)
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while lines().len() < n && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    lines()
}

pub(crate) fn spec(proto: &str, host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("{proto}:[{host}]:{port}")
    } else {
        format!("{proto}:{host}:{port}")
    }
}

/// The interface of `ns` holding `addr`.
fn interface_of(ns: &Netns, addr: &str) -> String {
    let out = ns.sh(&format!("ip -o addr show to {addr}"));
    // "3: veth5b@if4    inet 10.200.0.1/30 ..."
    out.split_whitespace()
        .nth(1)
        .and_then(|name| name.split('@').next())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no interface holds {addr}: {out:?}"))
}

#[test]
fn every_ruleset_it_prints_passes_nft_check_and_a_broken_one_does_not() {
    let ns = Netns::new("nftcheck");
    let cgroup = TestCgroup::new();
    let cases: Vec<Vec<&str>> = vec![
        vec!["--interface", "veth0"],
        vec![
            "--interface",
            "br-sbx*",
            "--ports",
            "all",
            "--local-ports",
            "3128,1080,443",
        ],
        vec![
            "--interface",
            "eth1",
            "--ports",
            "80,443,8080",
            "--transparent-port",
            "9001",
            "--dns-port",
            "9053",
        ],
        vec!["--interface", "veth0", "--tproxy"],
        vec![
            "--interface",
            "br-sbx*",
            "--tproxy",
            "--ports",
            "all",
            "--local-ports",
            "3128,443",
        ],
        vec!["--cgroup", &cgroup.rel],
        vec![
            "--cgroup",
            &cgroup.rel,
            "--ports",
            "all",
            "--local-ports",
            "3128",
        ],
        vec!["--host-guard", "--interface", "lk-sandbox"],
        vec![
            "--host-guard",
            "--interface",
            "tap-sbx*",
            "--local-ports",
            "22,3128",
        ],
    ];
    for args in &cases {
        let text = printed(args);
        let check = nft_check(&ns, &text);
        assert_eq!(
            check.code(),
            Some(0),
            "nft -c refused the ruleset of gateway-setup {args:?}:\n{}\n{text}",
            check.stderr
        );
    }
    // The check is real: nft refuses a rule it does not know, and a cgroup that does not exist.
    let broken = printed(&["--interface", "veth0"]).replace("counter drop", "counter dorp");
    assert_ne!(nft_check(&ns, &broken).code(), Some(0));
    let missing = printed(&["--cgroup", &format!("{}-gone", cgroup.rel)]);
    let check = nft_check(&ns, &missing);
    assert_ne!(check.code(), Some(0), "{missing}");
    assert!(
        check.stderr.contains("cgroupv2 path fails"),
        "{}",
        check.stderr
    );
    assert!(
        nft_tables(&ns).trim().is_empty(),
        "nft -c changed the namespace's ruleset"
    );
}

#[test]
fn bad_flags_are_refused_with_the_flag_named() {
    let ns = Netns::new("badflags");
    for (args, code, says) in [
        (
            &["--ports", "80"][..],
            1,
            "exactly one of --interface IFACE",
        ),
        (
            &["--interface", "veth0", "--cgroup", "a/b"][..],
            1,
            "exactly one of --interface IFACE",
        ),
        (
            &["--interface", "veth0\"accept"][..],
            2,
            "invalid value 'veth0\"accept' for '--interface <IFACE>'",
        ),
        (
            &["--interface", "a-very-long-interface"][..],
            2,
            "longer than 15 bytes",
        ),
        (
            &["--interface", "v", "--ports", "53,443"][..],
            2,
            "53 is DNS",
        ),
        (
            &["--interface", "v", "--ports", "ssh"][..],
            2,
            "'--ports <LIST|all>'",
        ),
        (
            &["--interface", "v", "--dns-port", "70000"][..],
            2,
            "'--dns-port <PORT>'",
        ),
        (
            &["--interface", "v", "--local-ports", "15001"][..],
            1,
            "--local-ports 15001: that is the --transparent-port port",
        ),
        (
            &["--cgroup", "a/../b"][..],
            2,
            "'.' and '..' are not allowed",
        ),
        (&["--cgroup", "/"][..], 1, "that is the root cgroup"),
        (
            &["--cgroup", "latchkey-no-such-cgroup/x", "--apply"][..],
            1,
            "--cgroup \"latchkey-no-such-cgroup/x\": there is no cgroup at",
        ),
        (
            &["--cgroup", "a/b", "--tproxy"][..],
            1,
            "--tproxy works on traffic arriving on an interface",
        ),
        (
            &["--interface", "v", "--apply", "--remove"][..],
            2,
            "cannot be used with",
        ),
        (
            &["--host-guard"][..],
            1,
            "--host-guard needs --interface IFACE",
        ),
        (
            &["--host-guard", "--interface", "v", "--ports", "80"][..],
            2,
            "'--host-guard' cannot be used with '--ports",
        ),
        (
            &["--host-guard", "--cgroup", "a/b"][..],
            2,
            "'--host-guard' cannot be used with '--cgroup",
        ),
        (
            &["--host-guard", "--interface", "v", "--tproxy"][..],
            2,
            "cannot be used with",
        ),
    ] {
        let out = setup_in(&ns, args);
        assert_eq!(out.code(), Some(code), "gateway-setup {args:?}: {out:#?}");
        assert!(
            out.stderr.contains(says),
            "gateway-setup {args:?}: {}",
            out.stderr
        );
        assert!(
            out.stdout.is_empty(),
            "gateway-setup {args:?} printed: {}",
            out.stdout
        );
    }
    assert!(
        nft_tables(&ns).trim().is_empty(),
        "a refused run changed the ruleset"
    );
}

#[test]
fn applied_on_the_sandbox_interface_latchkey_is_the_only_route_over_ipv4_and_ipv6() {
    let gw = Gateway::new();
    let sandbox_if = interface_of(&gw.sandbox, SANDBOX_IP);
    let proxy_if = interface_of(&gw.proxy, PROXY_IP);
    // IPv6 beside the harness's IPv4, and forwarding on: without the rules, everything below
    // would reach the upstream.
    gw.sandbox.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{SANDBOX_IP6}/64"),
        "dev",
        &sandbox_if,
        "nodad",
    ]);
    gw.proxy.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{PROXY_IP6}/64"),
        "dev",
        &proxy_if,
        "nodad",
    ]);
    let uplink = interface_of(&gw.proxy, "10.200.1.1");
    gw.proxy.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{PROXY_UPLINK_IP6}/64"),
        "dev",
        &uplink,
        "nodad",
    ]);
    gw.upstream.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{UPSTREAM_IP6}/64"),
        "dev",
        &gw.upstream_if,
        "nodad",
    ]);
    gw.sandbox
        .ip(&["-6", "route", "add", "default", "via", PROXY_IP6]);
    gw.upstream
        .ip(&["route", "add", "10.200.0.0/30", "via", "10.200.1.1"]);
    gw.upstream.ip(&[
        "-6",
        "route",
        "add",
        "fd00:200::/64",
        "via",
        PROXY_UPLINK_IP6,
    ]);
    gw.proxy.sh(
        "echo 1 > /proc/sys/net/ipv4/ip_forward; echo 1 > /proc/sys/net/ipv6/conf/all/forwarding",
    );

    let mut capture = gw.proxy.command(python());
    capture
        .arg("-u")
        .arg(Path::new(CLIENTS).join("capture_server.py"))
        .arg("latchkey");
    for port in [TRANSPARENT, RESOLVER, 3128, 3129] {
        capture.arg(format!("tcp:0.0.0.0:{port}"));
        capture.arg(format!("tcp6:[::]:{port}"));
    }
    capture.arg(format!("udp:0.0.0.0:{RESOLVER}"));
    capture.arg(format!("udp6:[::]:{RESOLVER}"));
    let capture = NsProcess::spawn(capture, "capture server in latchkey's namespace");
    let mut upstream = gw.upstream.command(python());
    upstream
        .arg("-u")
        .arg(Path::new(CLIENTS).join("capture_server.py"))
        .arg("upstream");
    for port in [22, 80, 443, 53] {
        upstream.arg(format!("tcp:0.0.0.0:{port}"));
        upstream.arg(format!("tcp6:[::]:{port}"));
    }
    for port in [53, 443] {
        upstream.arg(format!("udp:0.0.0.0:{port}"));
        upstream.arg(format!("udp6:[::]:{port}"));
    }
    let upstream = NsProcess::spawn(upstream, "capture server in the upstream namespace");
    let sandbox = || gw.sandbox.command(python());
    // New IPv6 links need a moment (link-local addresses, neighbours) before they carry.
    let ping6 = vec![format!("ping:{UPSTREAM_IP6}")];
    let ready = (0..10).any(|_| {
        probe(sandbox(), &ping6)
            .values()
            .any(|o| o == "answer echo-reply")
    });
    assert!(ready, "IPv6 from the sandbox to the upstream never worked");

    let mut probes = Vec::new();
    let mut direct = Vec::new();
    for up in [UPSTREAM_IP, UPSTREAM_IP6] {
        for (proto, port) in [
            ("tcp", 443),
            ("tcp", 80),
            ("tcp", 22),
            ("udp", 443),
            ("udp", 53),
            ("tcp", 53),
        ] {
            probes.push(spec(proto, up, port));
            direct.push((spec(proto, up, port), Some(format!("upstream {port}"))));
        }
        probes.push(format!("ping:{up}"));
        direct.push((format!("ping:{up}"), Some("echo-reply".to_string())));
    }
    expect(
        "before gateway-setup, the sandbox reaches the upstream directly",
        &probe(sandbox(), &probes),
        &direct,
    );
    // One line per TCP or UDP probe (pings are answered by the kernel).
    let direct_lines = traffic(&upstream, 12).len();
    assert_eq!(direct_lines, 12, "{}", upstream.output());

    let apply = [
        "--interface",
        proxy_if.as_str(),
        "--local-ports",
        "3128",
        "--apply",
    ];
    for _ in 0..2 {
        let out = setup_in(&gw.proxy, &apply);
        assert_eq!(out.code(), Some(0), "gateway-setup --apply: {out:#?}");
        assert!(
            out.stderr.contains("applied table inet latchkey"),
            "{}",
            out.stderr
        );
    }
    let tables = nft_tables(&gw.proxy);
    assert_eq!(tables.matches("table inet latchkey").count(), 1, "{tables}");
    // Neighbour entries learnt before must be learnt again, through the rules (ND is allowed).
    gw.sandbox.ip(&["neigh", "flush", "all"]);
    gw.proxy.ip(&["neigh", "flush", "all"]);

    let mut probes = Vec::new();
    let mut want = Vec::new();
    for (up, own) in [(UPSTREAM_IP, PROXY_IP), (UPSTREAM_IP6, PROXY_IP6)] {
        for (proto, port, answer) in [
            ("tcp", 443, Some(format!("latchkey {TRANSPARENT}"))),
            ("tcp", 80, Some(format!("latchkey {TRANSPARENT}"))),
            ("udp", 53, Some(format!("latchkey {RESOLVER}"))),
            ("tcp", 53, Some(format!("latchkey {RESOLVER}"))),
            ("tcp", 22, None),
            ("udp", 443, None),
        ] {
            probes.push(spec(proto, up, port));
            want.push((spec(proto, up, port), answer));
        }
        for (port, answer) in [
            (3128, Some("latchkey 3128".to_string())),
            (3129, None),
            (TRANSPARENT, None),
            (RESOLVER, None),
        ] {
            probes.push(spec("tcp", own, port));
            want.push((spec("tcp", own, port), answer));
        }
        // DNS to any address at all is latchkey's.
        let anywhere = if up.contains(':') {
            "2001:db8::53"
        } else {
            "192.0.2.53"
        };
        probes.push(spec("udp", anywhere, 53));
        want.push((
            spec("udp", anywhere, 53),
            Some(format!("latchkey {RESOLVER}")),
        ));
        for host in [up, own] {
            probes.push(format!("ping:{host}"));
            want.push((format!("ping:{host}"), None));
        }
    }
    expect(
        "with the rules applied, from the sandbox",
        &probe(sandbox(), &probes),
        &want,
    );
    let after = traffic(&upstream, direct_lines);
    assert_eq!(
        after.len(),
        direct_lines,
        "the upstream was reached past the rules: {:#?}",
        &after[direct_lines.min(after.len())..]
    );
    // The transparent listener sees each connection's original destination: 443 and 80 over
    // IPv4 and IPv6, 3128 twice, TCP 53 twice, UDP 53 four times.
    let captured = traffic(&capture, 12).join("\n");
    for orig in [
        format!("{UPSTREAM_IP}:443"),
        format!("{UPSTREAM_IP}:80"),
        format!("[{UPSTREAM_IP6}]:443"),
        format!("[{UPSTREAM_IP6}]:80"),
    ] {
        assert!(
            captured
                .lines()
                .any(|l| l.starts_with(&format!("tcp {TRANSPARENT} from "))
                    && l.ends_with(&format!(" orig {orig}"))),
            "no redirected connection to {orig}:\n{captured}"
        );
    }
    assert!(
        captured
            .lines()
            .any(|l| l.starts_with(&format!("udp {RESOLVER} from {SANDBOX_IP}:"))),
        "{captured}"
    );

    // --remove deletes the table (twice: it is idempotent) and the direct route is back.
    for _ in 0..2 {
        let out = setup_in(&gw.proxy, &["--remove"]);
        assert_eq!(out.code(), Some(0), "gateway-setup --remove: {out:#?}");
    }
    assert!(!nft_tables(&gw.proxy).contains("latchkey"));
    let back = [
        (
            spec("tcp", UPSTREAM_IP, 22),
            Some("upstream 22".to_string()),
        ),
        (
            spec("tcp", UPSTREAM_IP, 443),
            Some("upstream 443".to_string()),
        ),
        (
            spec("tcp", UPSTREAM_IP6, 443),
            Some("upstream 443".to_string()),
        ),
    ];
    let specs: Vec<String> = back.iter().map(|(s, _)| s.clone()).collect();
    expect("after --remove", &probe(sandbox(), &specs), &back);
    assert_eq!(traffic(&upstream, direct_lines + 3).len(), direct_lines + 3);
}

//! `gateway-setup --cgroup`, applied for real: one namespace plays latchkey's host, where the
//! sandbox's processes (inside a cgroup of this test) and latchkey (outside it) both run; the
//! upstream is a namespace of its own. The cgroup's sockets are captured like a sandbox
//! interface's traffic, over IPv4 and IPv6; a process outside the cgroup is not.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::{expect, nsenter, probe, spec, traffic, TestCgroup, CLIENTS, RESOLVER, TRANSPARENT};
use crate::support::latchkey::{wait_with_timeout, BIN};
use crate::support::netns::{link, Netns, NsProcess};
use crate::support::toolchain::{python, tool};

const HOST_IP: &str = "10.201.0.1";
const UP_IP: &str = "10.201.0.2";
const HOST_IP6: &str = "fd00:202::1";
const UP_IP6: &str = "fd00:202::2";

#[test]
fn applied_to_a_cgroup_it_captures_that_cgroups_sockets_and_not_latchkeys_own() {
    let host = Netns::new("host");
    let up = Netns::new("upstream");
    let (host_if, up_if) = link(&host, &format!("{HOST_IP}/30"), &up, &format!("{UP_IP}/30"));
    host.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{HOST_IP6}/64"),
        "dev",
        &host_if,
        "nodad",
    ]);
    up.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{UP_IP6}/64"),
        "dev",
        &up_if,
        "nodad",
    ]);
    let cgroup = TestCgroup::new();

    let mut capture = host.command(python());
    capture
        .arg("-u")
        .arg(Path::new(CLIENTS).join("capture_server.py"))
        .arg("latchkey")
        .arg(format!("tcp:0.0.0.0:{TRANSPARENT}"))
        .arg(format!("tcp6:[::]:{TRANSPARENT}"))
        .arg(format!("tcp:0.0.0.0:{RESOLVER}"))
        // Where the output redirect sends DNS: a UDP reply from a wildcard socket could leave
        // from another address, which conntrack would not map back.
        .arg(format!("udp:127.0.0.1:{RESOLVER}"))
        .arg(format!("udp6:[::1]:{RESOLVER}"))
        .arg("tcp:127.0.0.1:3128")
        .arg("tcp:127.0.0.1:3129");
    let capture = NsProcess::spawn(capture, "capture server on latchkey's host");
    let mut upstream = up.command(python());
    upstream
        .arg("-u")
        .arg(Path::new(CLIENTS).join("capture_server.py"))
        .arg("upstream");
    for spec in [
        "tcp:0.0.0.0:443",
        "tcp:0.0.0.0:22",
        "udp:0.0.0.0:443",
        "udp:0.0.0.0:53",
    ] {
        upstream.arg(spec);
        upstream.arg(
            spec.replace("tcp:0.0.0.0", "tcp6:[::]")
                .replace("udp:0.0.0.0", "udp6:[::]"),
        );
    }
    let upstream = NsProcess::spawn(upstream, "capture server in the upstream namespace");
    // latchkey's place: the same host, outside the cgroup.
    let outside = || {
        let mut cmd = nsenter(&host, python());
        cmd.arg("-u");
        cmd
    };
    // New IPv6 links need a moment (link-local addresses, neighbours) before they carry.
    let ping6 = vec![format!("ping:{UP_IP6}")];
    let ready = (0..10).any(|_| {
        probe(outside(), &ping6)
            .values()
            .any(|o| o == "answer echo-reply")
    });
    assert!(
        ready,
        "IPv6 from latchkey's host to the upstream never worked"
    );

    let mut apply = nsenter(&host, BIN);
    apply.args([
        "gateway-setup",
        "--cgroup",
        &cgroup.rel,
        "--local-ports",
        "3128",
        "--apply",
    ]);
    let out = wait_with_timeout(&mut apply, Duration::from_secs(20));
    assert_eq!(
        out.code(),
        Some(0),
        "gateway-setup --cgroup --apply: {out:#?}"
    );

    // A process of the sandbox: joins the cgroup, then runs the probes.
    let in_cgroup = {
        let mut cmd: Command = nsenter(&host, tool("sh"));
        cmd.arg("-c")
            .arg("echo $$ > \"$0\" && exec \"$@\"")
            .arg(cgroup.dir().join("cgroup.procs"))
            .arg(python());
        cmd
    };
    let mut want = Vec::new();
    for up_ip in [UP_IP, UP_IP6] {
        want.extend([
            (
                spec("tcp", up_ip, 443),
                Some(format!("latchkey {TRANSPARENT}")),
            ),
            (spec("udp", up_ip, 53), Some(format!("latchkey {RESOLVER}"))),
            (spec("tcp", up_ip, 22), None),
            (spec("udp", up_ip, 443), None),
            (format!("ping:{up_ip}"), None),
        ]);
    }
    want.extend([
        (
            spec("tcp", "127.0.0.1", 3128),
            Some("latchkey 3128".to_string()),
        ),
        (spec("tcp", "127.0.0.1", 3129), None),
        (spec("tcp", "127.0.0.1", TRANSPARENT), None),
    ]);
    let probes: Vec<String> = want.iter().map(|(s, _)| s.clone()).collect();
    expect(
        "from a process in the sandbox's cgroup",
        &probe(in_cgroup, &probes),
        &want,
    );
    // 443 and DNS over both families, and the local port.
    let captured = traffic(&capture, 5);
    for orig in [format!("{UP_IP}:443"), format!("[{UP_IP6}]:443")] {
        assert!(
            captured
                .iter()
                .any(|l| l.starts_with(&format!("tcp {TRANSPARENT} from "))
                    && l.ends_with(&format!(" orig {orig}"))),
            "no redirected connection to {orig}: {captured:#?}"
        );
    }

    // Nothing of latchkey's own traffic is captured.
    let own = [
        (spec("tcp", UP_IP, 443), Some("upstream 443".to_string())),
        (spec("tcp", UP_IP, 22), Some("upstream 22".to_string())),
        (spec("tcp", UP_IP6, 443), Some("upstream 443".to_string())),
        (format!("ping:{UP_IP}"), Some("echo-reply".to_string())),
    ];
    let specs: Vec<String> = own.iter().map(|(s, _)| s.clone()).collect();
    expect("from outside the cgroup", &probe(outside(), &specs), &own);
    // The upstream saw those three connections and nothing of the sandbox's.
    let reached = traffic(&upstream, 3);
    assert_eq!(
        reached.len(),
        3,
        "the sandbox's cgroup reached the upstream: {reached:#?}"
    );
}

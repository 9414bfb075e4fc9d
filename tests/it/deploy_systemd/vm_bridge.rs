//! The VM-per-sandbox recipe of docs/src/deployment-hosts.md, run for real in network
//! namespaces: a "host" namespace holding a bridge `br-sbx` whose only port is a veth standing
//! in for a VM's tap (its other end in the "VM" namespace), an upstream namespace and another
//! namespace on links of their own, and forwarding ON in the host — so that without the rules
//! the VM does reach the other namespace and the host's own ports (checked first), and what
//! stops it afterwards is `gateway-setup`.
//!
//! Privileges as the units give them: `gateway-setup --interface br-sbx --apply` runs as uid
//! 65534 holding only CAP_NET_ADMIN (latchkey-gateway.service), `latchkey serve` with no
//! capability at all and the listeners of the shipped drop-in `gateway.conf`
//! (latchkey.service). Then from the VM, whose resolver is any address at all: a client that
//! knows nothing of proxies reaches an allowed HTTPS upstream by name through latchkey (DNS
//! answered by latchkey, TCP 443 captured, audited with the VM as the client); a name no rule
//! allows does not resolve; a TCP port of the host, the other namespace's TCP and UDP, UDP 443
//! to the upstream, ICMP and a direct connection to the transparent port get no answer, and
//! nothing reached the other namespace or the host's port. Nothing outside the namespaces
//! changes. Needs root, like the other gateway tests.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::{read, values};
use crate::gateway_setup::{expect, nft_tables, probe, spec, traffic, CLIENTS};
use crate::gateway_transparent::record_with;
use crate::support::latchkey::{wait_with_timeout, BIN, SCRUBBED_ENV};
use crate::support::netns::{curl_in, link, EchoOptions, Netns, NsEcho, NsProcess};
use crate::support::toolchain::{python, tool};
use crate::support::{assert_record, latchkey, TestCa};

const BRIDGE: &str = "br-sbx";
const BRIDGE_IP: &str = "10.201.0.1";
const VM_IP: &str = "10.201.0.2";
const HOST_UPLINK_IP: &str = "10.202.1.1";
const UPSTREAM_IP: &str = "10.202.1.2";
const UPSTREAM_NET: &str = "10.202.1.0/30";
const HOST_OTHER_IP: &str = "10.202.2.1";
const OTHER_IP: &str = "10.202.2.2";
/// A service of the host's own (an sshd, say), on every address.
const HOST_PORT: u16 = 2222;

/// `latchkey gateway-setup ARGS` in `ns` as latchkey-gateway.service runs it: a non-root uid
/// holding CAP_NET_ADMIN and nothing else.
fn gateway_setup_as_the_unit(ns: &Netns, args: &[&str]) -> crate::support::latchkey::CliOutput {
    let mut cmd = ns.command(tool("setpriv"));
    cmd.args([
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        "--bounding-set",
        "-all,+net_admin",
        "--inh-caps",
        "-all,+net_admin",
        "--ambient-caps",
        "+net_admin",
        "--no-new-privs",
        "--",
        BIN,
        "gateway-setup",
    ])
    .args(args);
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    wait_with_timeout(&mut cmd, Duration::from_secs(20))
}

fn capture_server(ns: &Netns, name: &str, specs: &[String]) -> NsProcess {
    let mut cmd = ns.command(python());
    cmd.arg("-u")
        .arg(Path::new(CLIENTS).join("capture_server.py"))
        .arg(name)
        .args(specs);
    NsProcess::spawn(cmd, &format!("capture server {name}"))
}

#[test]
fn a_vm_on_the_sandbox_bridge_reaches_an_allowed_upstream_through_latchkey_and_nothing_else() {
    let host = Netns::new("vmhost");
    let mut vm = Netns::new("vm");
    let upstream = Netns::new("vmup");
    let other = Netns::new("vmother");
    // The bridge, and the VM's "tap": a veth whose host end is a port of the bridge.
    host.ip(&["link", "add", BRIDGE, "type", "bridge"]);
    host.ip(&["addr", "add", &format!("{BRIDGE_IP}/24"), "dev", BRIDGE]);
    host.ip(&[
        "link",
        "add",
        "tap-sbx0",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        vm.name(),
    ]);
    host.ip(&["link", "set", "tap-sbx0", "master", BRIDGE]);
    host.ip(&["link", "set", "tap-sbx0", "up"]);
    host.ip(&["link", "set", BRIDGE, "up"]);
    vm.ip(&["addr", "add", &format!("{VM_IP}/24"), "dev", "eth0"]);
    vm.ip(&["link", "set", "eth0", "up"]);
    vm.ip(&["route", "add", "default", "via", BRIDGE_IP]);
    link(
        &host,
        &format!("{HOST_UPLINK_IP}/30"),
        &upstream,
        &format!("{UPSTREAM_IP}/30"),
    );
    link(
        &host,
        &format!("{HOST_OTHER_IP}/30"),
        &other,
        &format!("{OTHER_IP}/30"),
    );
    upstream.ip(&["route", "add", "10.201.0.0/24", "via", HOST_UPLINK_IP]);
    other.ip(&["route", "add", "10.201.0.0/24", "via", HOST_OTHER_IP]);
    host.sh("echo 1 > /proc/sys/net/ipv4/ip_forward");
    // The VM's resolver is an address nothing listens on: DNS to any address is latchkey's.
    vm.etc_file("resolv.conf", "nameserver 192.0.2.53\n");
    vm.etc_file("hosts", "127.0.0.1 localhost\n");

    let ca = TestCa::new();
    let tls = NsEcho::start(
        &upstream,
        "up-tls",
        UPSTREAM_IP,
        443,
        EchoOptions {
            tls: Some((&ca, &["up.test"])),
            ..EchoOptions::default()
        },
    );
    let other_server = capture_server(
        &other,
        "other",
        &[
            spec("tcp", "0.0.0.0", 8080),
            spec("udp", "0.0.0.0", 5353),
            spec("udp", "0.0.0.0", 443),
        ],
    );
    let host_server = capture_server(&host, "hostsvc", &[spec("tcp", "0.0.0.0", HOST_PORT)]);
    let from_vm = || vm.command(python());

    // Without the rules the VM reaches the other namespace and the host's port.
    let reachable = [
        (spec("tcp", OTHER_IP, 8080), Some("other 8080".to_string())),
        (spec("udp", OTHER_IP, 5353), Some("other 5353".to_string())),
        (
            spec("tcp", BRIDGE_IP, HOST_PORT),
            Some(format!("hostsvc {HOST_PORT}")),
        ),
    ];
    let specs: Vec<String> = reachable.iter().map(|(s, _)| s.clone()).collect();
    expect(
        "before gateway-setup, from the VM",
        &probe(from_vm(), &specs),
        &reachable,
    );
    assert_eq!(traffic(&other_server, 2).len(), 2);
    assert_eq!(traffic(&host_server, 1).len(), 1);

    // latchkey-gateway.service's command, with the unit's privileges.
    let out = gateway_setup_as_the_unit(&host, &["--interface", BRIDGE, "--apply"]);
    assert_eq!(out.code(), Some(0), "gateway-setup --apply: {out:#?}");
    assert!(
        out.stderr.contains("applied table inet latchkey"),
        "{}",
        out.stderr
    );
    assert_eq!(nft_tables(&host).trim(), "table inet latchkey");

    // latchkey.service + gateway.conf: the drop-in's listeners, no capability.
    let mut lk = latchkey()
        .guarded()
        .without_capabilities()
        .netns(host.name())
        .arg("--allow-private")
        .arg(UPSTREAM_NET)
        .resolve("up.test", UPSTREAM_IP)
        .resolve("evil.test", UPSTREAM_IP)
        .upstream_ca(&ca)
        .policy(
            "main.toml",
            "[[rules]]\nname = \"upstream\"\nhosts = [\"up.test\"]\nports = [443]\n",
        );
    let conf = read("gateway.conf");
    let env = values(&conf, "Environment");
    assert_eq!(env.len(), 3, "{env:?}");
    for pair in &env {
        let (name, value) = pair.split_once('=').expect("NAME=value");
        lk = lk.env(name, value);
    }
    let lk = lk.run();
    for what in ["transparent listening on 0.0.0.0:15001", "dns listening on"] {
        assert!(
            lk.wait_stderr_contains(what, Duration::from_secs(5)),
            "{what}:\n{}",
            lk.stderr_text()
        );
    }

    // A client that knows nothing of proxies: by name, through latchkey's resolver and the
    // transparent listener.
    let ok = curl_in(&vm, &lk, &["--noproxy", "*", "https://up.test/"], &[]);
    assert_eq!(ok.exit, Some(0), "{ok:#?}\n{}", lk.stderr_text());
    assert_eq!(ok.response.status, 200, "{ok:#?}");
    let body: serde_json::Value = serde_json::from_slice(&ok.response.body).expect("echo JSON");
    assert_eq!(body["server"], "up-tls");
    assert_eq!(tls.connections(), 1);
    let request = record_with(&lk, json!({"host": "up.test", "method": "GET"}));
    assert_record(
        &request,
        json!({"host": "up.test", "decision": "allow", "rule": "upstream", "status": 200}),
    );
    assert!(
        request["client"]
            .as_str()
            .is_some_and(|c| c.starts_with(&format!("{VM_IP}:"))),
        "{request:#}"
    );
    // A name no rule allows does not even resolve.
    let denied = curl_in(&vm, &lk, &["--noproxy", "*", "https://evil.test/"], &[]);
    assert_eq!(denied.exit, Some(6), "{denied:#?}");
    assert_eq!(tls.connections(), 1);

    // Nothing else answers, and nothing else arrives.
    let silent: Vec<(String, Option<String>)> = [
        spec("tcp", OTHER_IP, 8080),
        spec("udp", OTHER_IP, 5353),
        spec("udp", OTHER_IP, 443),
        spec("udp", UPSTREAM_IP, 443),
        spec("tcp", BRIDGE_IP, HOST_PORT),
        spec("tcp", HOST_OTHER_IP, HOST_PORT),
        spec("tcp", BRIDGE_IP, 15001),
        format!("ping:{OTHER_IP}"),
        format!("ping:{BRIDGE_IP}"),
    ]
    .into_iter()
    .map(|s| (s, None))
    .collect();
    let specs: Vec<String> = silent.iter().map(|(s, _)| s.clone()).collect();
    expect(
        "with the rules applied, from the VM",
        &probe(from_vm(), &specs),
        &silent,
    );
    assert_eq!(
        traffic(&other_server, 2).len(),
        2,
        "{}",
        other_server.output()
    );
    assert_eq!(
        traffic(&host_server, 1).len(),
        1,
        "{}",
        host_server.output()
    );
}

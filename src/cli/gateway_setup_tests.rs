//! Unit tests of `gateway-setup`'s flag values and ruleset text. The rules themselves are
//! checked by real nft, in network namespaces, in tests/it/gateway_setup.rs.

use clap::Parser;

use super::*;
use crate::cli::{Cli, Command};

fn parse(extra: &[&str]) -> Result<GatewaySetupArgs, String> {
    let cli = Cli::try_parse_from(["latchkey", "gateway-setup"].iter().chain(extra))
        .map_err(|e| e.to_string())?;
    match cli.command {
        Command::GatewaySetup(args) => Ok(args),
        other => panic!("parsed {other:?}"),
    }
}

fn args(extra: &[&str]) -> GatewaySetupArgs {
    parse(extra).unwrap_or_else(|e| panic!("gateway-setup {extra:?}: {e}"))
}

fn rules(extra: &[&str]) -> String {
    let a = args(extra);
    let o = options(&a).unwrap_or_else(|e| panic!("gateway-setup {extra:?}: {e}"));
    ruleset(&o, &command_line(&a))
}

#[test]
fn interface_names_are_linux_names_and_nothing_that_could_leave_the_nft_string() {
    for good in ["veth0", "lk-sbx_1.2", "eth0*", "a", "abcdefghijklmno"] {
        assert_eq!(parse_interface(good).as_deref(), Ok(good));
    }
    for (bad, says) in [
        ("", "must not be empty"),
        ("*", "must not be empty"),
        ("abcdefghijklmnop", "longer than 15 bytes"),
        ("eth0\" accept", "'\"' is not allowed"),
        ("eth 0", "' ' is not allowed"),
        ("eth/0", "'/' is not allowed"),
        ("e*th", "'*' is not allowed"),
        ("..", "not an interface name"),
    ] {
        let err = parse_interface(bad).err().unwrap_or_default();
        assert!(err.contains(says), "{bad:?}: {err}");
    }
    let err = parse(&["--interface", "veth0\"; flush ruleset"])
        .err()
        .unwrap_or_default();
    assert!(err.contains("--interface <IFACE>"), "{err}");
}

#[test]
fn cgroup_paths_are_checked_for_form() {
    for good in [
        "sandbox.slice/agent",
        "/sandbox.slice/agent",
        "a",
        "user@1000.service",
    ] {
        assert_eq!(parse_cgroup(good).as_deref(), Ok(good));
    }
    for (bad, says) in [
        ("a/../b", "'.' and '..'"),
        ("a//b", "no empty components"),
        ("a/b/", "no empty components"),
        ("a\"b", "'\"' is not allowed"),
        ("a b", "' ' is not allowed"),
        ("a\\x2db", "'\\\\' is not allowed"),
    ] {
        let err = parse_cgroup(bad).err().unwrap_or_default();
        assert!(err.contains(says), "{bad:?}: {err}");
    }
}

#[test]
fn port_lists_are_sorted_sets_of_real_ports_without_dns() {
    assert_eq!(parse_ports("all"), Ok(Ports::All));
    assert_eq!(parse_ports(" ALL "), Ok(Ports::All));
    assert_eq!(
        parse_ports("443, 80,8080,443"),
        Ok(Ports::List(vec![80, 443, 8080]))
    );
    for (bad, says) in [
        ("", "at least one port"),
        ("0", "\"0\" is not a port"),
        ("65536", "\"65536\" is not a port"),
        ("80,http", "\"http\" is not a port"),
        ("53,80", "53 is DNS"),
    ] {
        let err = parse_ports(bad).err().unwrap_or_default();
        assert!(err.contains(says), "{bad:?}: {err}");
    }
    assert_eq!(parse_local_ports(""), Ok(PortList(Vec::new())));
    assert_eq!(
        parse_local_ports("3128,1080"),
        Ok(PortList(vec![1080, 3128]))
    );
    assert!(parse_local_ports("53").is_err());
    let err = parse(&["--interface", "v", "--transparent-port", "0"])
        .err()
        .unwrap_or_default();
    assert!(err.contains("--transparent-port <PORT>"), "{err}");
}

#[test]
fn exactly_one_selector_and_distinct_listener_ports_are_required() {
    for extra in [&[][..], &["--interface", "v", "--cgroup", "a/b"][..]] {
        let err = options(&args(extra))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("exactly one of --interface IFACE"),
            "{extra:?}: {err}"
        );
    }
    let err = options(&args(&["--interface", "v", "--dns-port", "15001"]))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("are both 15001"), "{err}");
    let err = options(&args(&["--interface", "v", "--local-ports", "3128,15053"]))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("--local-ports 15053: that is the --dns-port port"),
        "{err}"
    );
    assert!(parse(&["--apply", "--remove"]).is_err());
}

#[test]
fn the_interface_ruleset_captures_80_443_and_dns_and_drops_the_rest_in_its_own_table() {
    let text = rules(&["--interface", "veth7"]);
    // Deleted and rebuilt in one transaction, whatever was there.
    assert!(
        text.contains("\ntable inet latchkey\ndelete table inet latchkey\ntable inet latchkey {\n"),
        "{text}"
    );
    assert_eq!(text.matches("table inet latchkey {").count(), 1, "{text}");
    for line in [
        "type filter hook prerouting priority -150; policy accept;",
        "iifname \"veth7\" jump from_sandbox",
        QUIC,
        "tcp dport { 80, 443 } accept",
        "meta l4proto { tcp, udp } th dport 53 accept",
        "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 accept",
        "type nat hook prerouting priority dstnat; policy accept;",
        "iifname \"veth7\" meta l4proto { tcp, udp } th dport 53 redirect to :15053",
        "iifname \"veth7\" tcp dport { 80, 443 } redirect to :15001",
        "iifname \"veth7\" jump to_latchkey",
        "tcp dport 15001 ct status dnat accept",
        "meta l4proto { tcp, udp } th dport 15053 ct status dnat accept",
        "type filter hook forward priority filter; policy accept;",
        "iifname \"veth7\" counter drop",
    ] {
        assert!(
            text.contains(&format!("\t{line}\n")),
            "missing {line:?}:\n{text}"
        );
    }
    // Each filter chain of the sandbox ends in a drop; nothing but ND and the listeners is
    // accepted on input.
    for chain in ["from_sandbox", "to_latchkey"] {
        let body = text
            .split(&format!("chain {chain} {{\n"))
            .nth(1)
            .and_then(|rest| rest.split("\t}").next())
            .unwrap_or_default();
        assert!(
            body.trim_end().ends_with("counter drop"),
            "{chain}:\n{body}"
        );
    }
    assert!(
        !text.contains("fib daddr"),
        "no local ports were asked for:\n{text}"
    );
    // DNS is redirected before the captured ports, so `--ports all` cannot swallow it.
    let dns = text.find("th dport 53 redirect").unwrap_or(usize::MAX);
    let tcp = text.find("redirect to :15001").unwrap_or(0);
    assert!(dns < tcp, "{text}");
}

#[test]
fn ports_all_and_local_ports_shape_the_capture() {
    let text = rules(&[
        "--interface",
        "br-sbx*",
        "--ports",
        "all",
        "--local-ports",
        "3128,443",
        "--transparent-port",
        "9001",
        "--dns-port",
        "9053",
    ]);
    for line in [
        "iifname \"br-sbx*\" jump from_sandbox",
        "meta l4proto tcp accept",
        "fib daddr type local tcp dport { 443, 3128 } accept",
        "iifname \"br-sbx*\" fib daddr type local tcp dport { 443, 3128 } accept",
        "iifname \"br-sbx*\" meta l4proto tcp redirect to :9001",
        "iifname \"br-sbx*\" meta l4proto { tcp, udp } th dport 53 redirect to :9053",
        "tcp dport { 443, 3128 } accept",
    ] {
        assert!(
            text.contains(&format!("\t{line}\n")),
            "missing {line:?}:\n{text}"
        );
    }
    // Local ports are left alone before anything is redirected.
    let local = text
        .find("\"br-sbx*\" fib daddr type local")
        .unwrap_or(usize::MAX);
    let redirect = text.find("redirect to :9001").unwrap_or(0);
    assert!(local < redirect, "{text}");
    assert!(
        text.contains(
            "# Made by: latchkey gateway-setup --interface br-sbx* --ports all \
                       --transparent-port 9001 --dns-port 9053 --local-ports 443,3128\n"
        ),
        "{text}"
    );
}

#[test]
fn the_cgroup_ruleset_works_on_output_and_names_the_cgroup_at_its_level() {
    let (selector, dir) = cgroup_selector(
        "/sandbox.slice/agent-1",
        Path::new("/sys/fs/cgroup/unified"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        dir,
        Path::new("/sys/fs/cgroup/unified/sandbox.slice/agent-1")
    );
    let o = Options {
        selector,
        ports: Ports::List(vec![80, 443]),
        transparent_port: 15001,
        dns_port: 15053,
        local_ports: PortList(vec![3128]),
        tproxy: false,
    };
    let text = ruleset(&o, "test");
    let from = "socket cgroupv2 level 2 \"unified/sandbox.slice/agent-1\"";
    for line in [
        "type nat hook output priority -100; policy accept;".to_string(),
        format!("{from} meta l4proto {{ tcp, udp }} th dport 53 redirect to :15053"),
        format!("{from} fib daddr type local tcp dport {{ 3128 }} accept"),
        format!("{from} tcp dport {{ 80, 443 }} redirect to :15001"),
        "type filter hook output priority filter; policy accept;".to_string(),
        format!("{from} jump from_sandbox"),
        QUIC.to_string(),
        "tcp dport 15001 ct status dnat accept".to_string(),
        "fib daddr type local tcp dport { 3128 } accept".to_string(),
        "counter drop".to_string(),
    ] {
        assert!(
            text.contains(&format!("\t{line}\n")),
            "missing {line:?}:\n{text}"
        );
    }
    assert!(
        !text.contains("prerouting") && !text.contains("iifname"),
        "{text}"
    );
}

#[test]
fn cgroup_paths_resolve_against_the_cgroup2_mount() {
    let unified = Path::new("/sys/fs/cgroup");
    let hybrid = Path::new("/sys/fs/cgroup/unified");
    let level_of = |given: &str, mount: &Path| match cgroup_selector(given, mount) {
        Ok((Selector::Cgroup { nft_path, level }, _)) => Ok((nft_path, level)),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e.to_string()),
    };
    assert_eq!(level_of("a/b/c", unified), Ok(("a/b/c".into(), 3)));
    assert_eq!(level_of("/a/b", unified), Ok(("a/b".into(), 2)));
    assert_eq!(
        level_of("/sys/fs/cgroup/a/b", unified),
        Ok(("a/b".into(), 2))
    );
    assert_eq!(level_of("a", hybrid), Ok(("unified/a".into(), 1)));
    assert_eq!(
        level_of("/sys/fs/cgroup/unified/a/b", hybrid),
        Ok(("unified/a/b".into(), 2))
    );
    for root in ["/", "/sys/fs/cgroup"] {
        let err = level_of(root, unified).err().unwrap_or_default();
        assert!(err.contains("root cgroup"), "{root:?}: {err}");
    }
    let err = level_of("a", Path::new("/cgroup2"))
        .err()
        .unwrap_or_default();
    assert!(
        err.contains("mounted at /cgroup2, outside /sys/fs/cgroup"),
        "{err}"
    );
}

#[test]
fn the_cgroup2_mount_is_read_from_mountinfo() {
    let hybrid = "\
25 30 0:23 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:25 / /sys/fs/cgroup/cpu rw,nosuid shared:11 - cgroup cgroup rw,cpu
";
    assert_eq!(
        cgroup2_mount_in(hybrid),
        Some(PathBuf::from("/sys/fs/cgroup/unified"))
    );
    let escaped = "30 1 0:26 / /mnt/my\\040cgroups rw - cgroup2 none rw\n";
    assert_eq!(
        cgroup2_mount_in(escaped),
        Some(PathBuf::from("/mnt/my cgroups"))
    );
    assert_eq!(
        cgroup2_mount_in("31 1 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw\n"),
        None
    );
}

#[test]
fn removal_deletes_only_latchkeys_table_and_succeeds_when_it_is_absent() {
    assert_eq!(
        removal(),
        "table inet latchkey\ndelete table inet latchkey\n"
    );
}

#[test]
fn tproxy_marks_the_captured_tcp_in_the_guard_and_nats_only_dns() {
    let text = rules(&["--interface", "veth7", "--tproxy", "--local-ports", "3128"]);
    for line in [
        "meta nfproto ipv4 tcp dport { 80, 443 } meta mark set 0x1 tproxy ip to :15001 accept",
        "meta nfproto ipv6 tcp dport { 80, 443 } meta mark set 0x1 tproxy ip6 to :15001 accept",
        "iifname \"veth7\" meta l4proto { tcp, udp } th dport 53 redirect to :15053",
        "meta mark 0x1 tcp dport { 80, 443 } accept",
        "meta l4proto { tcp, udp } th dport 15053 ct status dnat accept",
        "iifname \"veth7\" counter drop",
    ] {
        assert!(
            text.contains(&format!("\t{line}\n")),
            "missing {line:?}:\n{text}"
        );
    }
    // No NAT for the captured TCP, and the transparent port takes nothing redirected.
    assert!(!text.contains("redirect to :15001"), "{text}");
    assert!(!text.contains("dport 15001 ct status dnat"), "{text}");
    // DNS and the local ports come before the tproxy rules, so `--ports all` takes neither.
    let guard = text
        .split("chain from_sandbox {\n")
        .nth(1)
        .unwrap_or_default();
    let tproxy = guard.find("tproxy ip to").unwrap_or(0);
    assert!(
        guard.find("th dport 53 accept").unwrap_or(usize::MAX) < tproxy,
        "{guard}"
    );
    assert!(
        guard.find("dport { 3128 } accept").unwrap_or(usize::MAX) < tproxy,
        "{guard}"
    );
    // The policy routing is in the header, as comments nft skips.
    for line in [
        "#   ip -4 rule add fwmark 0x1 lookup 100",
        "#   ip -4 route add local 0.0.0.0/0 dev lo table 100",
        "#   ip -6 rule add fwmark 0x1 lookup 100",
        "#   ip -6 route add local ::/0 dev lo table 100",
    ] {
        assert!(
            text.contains(&format!("{line}\n")),
            "missing {line:?}:\n{text}"
        );
    }
    assert!(text.contains("--interface veth7 --ports 80,443"), "{text}");
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.ends_with(" --tproxy")),
        "{text}"
    );
    let all = rules(&["--interface", "veth7", "--tproxy", "--ports", "all"]);
    assert!(
        all.contains(
            "\tmeta nfproto ipv4 meta l4proto tcp meta mark set 0x1 tproxy ip to :15001 accept\n"
        ),
        "{all}"
    );
}

#[test]
fn tproxy_with_a_cgroup_is_refused_naming_why() {
    let a = args(&["--cgroup", "sandbox.slice/agent", "--tproxy"]);
    let err = options(&a).map(|_| ()).unwrap_err().to_string();
    assert!(
        err.contains("--tproxy works on traffic arriving on an interface"),
        "{err}"
    );
}

#[test]
fn the_host_guard_drops_what_the_sandbox_opens_on_this_host_in_its_own_table() {
    let text = super::host_guard::ruleset(
        "lk-sandbox",
        &PortList(vec![22, 3128]),
        "latchkey gateway-setup --host-guard --interface lk-sandbox --local-ports 22,3128",
    );
    // Its own table, rebuilt whole: never the gateway's `inet latchkey`.
    assert!(text.contains("table inet latchkey_host\ndelete table inet latchkey_host\n"));
    assert!(!text.contains("table inet latchkey\n"), "{text}");
    assert!(text.contains("type filter hook input priority filter - 10; policy accept;"));
    let chain = text
        .split("chain from_sandbox {")
        .nth(1)
        .expect("the from_sandbox chain");
    let lines: Vec<&str> = chain
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    // Answers first, the local ports, ND, then everything else dropped: nothing after the drop.
    assert_eq!(lines[0], "ct state established,related accept");
    assert_eq!(lines[1], "tcp dport { 22, 3128 } accept");
    assert!(lines[2].starts_with("icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert }"));
    assert!(lines[3].starts_with("counter drop"), "{lines:?}");
    assert_eq!(lines[4], "}");
    assert!(text.contains("iifname \"lk-sandbox\" jump from_sandbox"));
    // No local ports: no accept rule for any port.
    let none = super::host_guard::ruleset("br0", &PortList::default(), "x");
    assert!(!none.contains("dport"), "{none}");
    assert_eq!(
        super::host_guard::removal(),
        "table inet latchkey_host\ndelete table inet latchkey_host\n"
    );
}

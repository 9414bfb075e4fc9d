//! nftables `tproxy` to `serve --transparent --transparent-tproxy`: no NAT at all in latchkey's
//! namespace, the sandbox's TCP 80 and 443 marked in prerouting (mangle priority), handed to the
//! listener, and routed locally by the mark's table. The connection arrives with its real
//! destination as its local address (`SO_ORIGINAL_DST` has nothing: there is no NAT entry), and
//! goes through the same gate as a redirected one: allowed hosts reach their upstream, denied
//! ones and an allowed SNI / Host sent to another address are refused, a connection straight to
//! latchkey's listener is still `not_redirected`. Without `IP_TRANSPARENT` on the listener the
//! same rules deliver nothing, which shows the connections above came by tproxy; without
//! CAP_NET_ADMIN / CAP_NET_RAW latchkey refuses to start. `gateway-setup --tproxy --apply` is
//! then used for real: IPv4, and IPv6 and IPv4 on one dual-stack `[::]` listener.

use serde_json::json;

use super::ipv6::{add_ipv6, interface_with, PROXY_IP6, UPSTREAM_IP6};
use super::*;

/// The mark and routing table of the tproxy rules (those `gateway-setup --tproxy` uses).
const MARK: &str = "0x1";
const TABLE: &str = "100";

/// The sandbox's TCP 80 and 443 to anywhere but latchkey itself, tproxy'd to the transparent
/// listener; there is no nat chain.
fn tproxy_ruleset() -> String {
    format!(
        "table ip lk_tproxy {{\n\
         \tchain prerouting {{\n\
         \t\ttype filter hook prerouting priority mangle; policy accept;\n\
         \t\tip saddr {SANDBOX_IP} ip daddr != {PROXY_IP} tcp dport {{ 80, 443 }} meta mark set {MARK} tproxy to :{TRANSPARENT_PORT} accept\n\
         \t}}\n\
         }}\n"
    )
}

/// The tproxy rules and the policy routing in latchkey's namespace: marked packets are
/// delivered locally, where the transparent socket takes them.
fn tproxy_gateway(gw: &Gateway) {
    gw.proxy.nft(&tproxy_ruleset());
    gw.proxy
        .ip(&["rule", "add", "fwmark", MARK, "lookup", TABLE]);
    gw.proxy.ip(&[
        "route",
        "add",
        "local",
        "0.0.0.0/0",
        "dev",
        "lo",
        "table",
        TABLE,
    ]);
    let rules = gw.proxy.sh("nft list ruleset");
    for nat in ["nat", "redirect", "dnat", "masquerade"] {
        assert!(
            !rules.contains(nat),
            "latchkey's namespace has a {nat} rule, so SO_ORIGINAL_DST could answer:\n{rules}"
        );
    }
}

#[test]
fn tproxyd_connections_reach_allowed_hosts_and_the_gate_refuses_the_rest() {
    let gw = Gateway::new();
    let ca = TestCa::new();
    // OTHER_IP: reachable, opened for dialing, but no address of any allowed name.
    gw.upstream.ip(&[
        "addr",
        "add",
        &format!("{OTHER_IP}/32"),
        "dev",
        &gw.upstream_if,
    ]);
    gw.proxy.ip(&["route", "add", OTHER_IP, "via", UPSTREAM_IP]);
    let (plain, tls) = upstreams(&gw, &ca);
    let other_tls = NsEcho::start(
        &gw.upstream,
        "other-443",
        OTHER_IP,
        443,
        EchoOptions::default(),
    );
    let other_plain = NsEcho::start(
        &gw.upstream,
        "other-80",
        OTHER_IP,
        80,
        EchoOptions::default(),
    );
    tproxy_gateway(&gw);
    let listen = format!("{PROXY_IP}:{TRANSPARENT_PORT}");
    let lk = gateway_latchkey(
        &gw,
        &ca,
        &[
            "--transparent",
            &listen,
            "--transparent-tproxy",
            "--allow-private",
            "10.200.2.0/24",
        ],
    );

    // Allowed, HTTPS and plain HTTP: intercepted / pinned, dialed to the real destination.
    let out = direct_curl(
        &gw,
        &lk,
        ("up.test", 443, UPSTREAM_IP),
        "https://up.test/tp-tls",
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}\n{}", lk.stderr_text());
    assert!(resp.text().contains("\"server\": \"up-tls\""), "{resp:#?}");
    let record = record_with(&lk, json!({"path": "/tp-tls"}));
    assert_record(
        &record,
        json!({"method": "GET", "scheme": "https", "host": "up.test", "port": 443,
               "decision": "allow", "rule": "upstream", "reason": "allowed", "status": 200,
               "upstream": format!("{UPSTREAM_IP}:443"),
               "original_dst": format!("{UPSTREAM_IP}:443")}),
    );
    from_sandbox(&record);
    let out = direct_curl(
        &gw,
        &lk,
        ("up.test", 80, UPSTREAM_IP),
        "http://up.test/tp-plain",
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    assert!(resp.text().contains("\"server\": \"up\""), "{resp:#?}");
    assert_record(
        &record_with(&lk, json!({"path": "/tp-plain"})),
        json!({"method": "GET", "scheme": "http", "host": "up.test", "port": 80,
               "reason": "allowed", "status": 200, "upstream": format!("{UPSTREAM_IP}:80")}),
    );

    // Denied hosts: refused before anything is dialed.
    let out = direct_curl(
        &gw,
        &lk,
        ("evil.test", 443, UPSTREAM_IP),
        "https://evil.test/",
    );
    assert_ne!(out.exit, Some(0), "{out:#?}");
    assert_eq!(out.response.status, 0, "{out:#?}");
    assert_record(
        &record_with(&lk, json!({"host": "evil.test", "port": 443})),
        json!({"method": "CONNECT", "decision": "deny", "reason": "no_rule", "status": null,
               "upstream": null, "original_dst": format!("{UPSTREAM_IP}:443")}),
    );
    let out = direct_curl(
        &gw,
        &lk,
        ("evil.test", 80, UPSTREAM_IP),
        "http://evil.test/tp-x",
    );
    assert_denial(out.ok(), 403, Some("none"), "no_rule");
    assert_record(
        &record_with(&lk, json!({"path": "/tp-x"})),
        json!({"host": "evil.test", "decision": "deny", "reason": "no_rule", "status": 403,
               "upstream": null, "original_dst": format!("{UPSTREAM_IP}:80")}),
    );

    // An allowed name sent to another address: the tproxy'd local address is that address,
    // and it is no address of the name.
    for (port, url) in [
        (443, "https://up.test/tp-spoof"),
        (80, "http://up.test/tp-spoof"),
    ] {
        let out = direct_curl(&gw, &lk, ("up.test", port, OTHER_IP), url);
        if port == 80 {
            assert_denial(out.ok(), 403, Some("none"), "destination_mismatch");
        } else {
            assert_ne!(out.exit, Some(0), "{url}: {out:#?}");
            assert_eq!(out.response.status, 0, "{out:#?}");
        }
        assert_record(
            &record_with(
                &lk,
                json!({"host": "up.test", "port": port, "reason": "destination_mismatch"}),
            ),
            json!({"decision": "deny", "upstream": null,
                   "original_dst": format!("{OTHER_IP}:{port}")}),
        );
    }

    // Straight to the listener (the rule leaves latchkey's own address alone): its local
    // address is latchkey's own, which is no destination.
    let out = python_in(
        &gw.sandbox,
        RAW_CLIENT,
        &[
            PROXY_IP,
            &TRANSPARENT_PORT.to_string(),
            "GET / HTTP/1.1\r\nHost: up.test\r\n\r\n",
        ],
    );
    assert_eq!(out.stdout, "", "{out:#?}");
    assert_record(
        &record_with(&lk, json!({"reason": "not_redirected"})),
        json!({"host": PROXY_IP, "port": TRANSPARENT_PORT, "decision": "deny",
               "upstream": null}),
    );
    assert_eq!((plain.connections(), tls.connections()), (1, 1));
    assert_eq!(
        other_tls.connections() + other_plain.connections(),
        0,
        "latchkey dialed the spoofed destination"
    );
    lk.wait_audit(7);
}

#[test]
fn without_transparent_tproxy_the_same_rules_deliver_nothing() {
    let gw = Gateway::new();
    let ca = TestCa::new();
    let (plain, tls) = upstreams(&gw, &ca);
    tproxy_gateway(&gw);
    let listen = format!("{PROXY_IP}:{TRANSPARENT_PORT}");
    // A plain listener: tproxy finds no transparent socket and drops the packets.
    let lk = gateway_latchkey(&gw, &ca, &["--transparent", &listen]);
    let out = curl_in(
        &gw.sandbox,
        &lk,
        &[
            "--noproxy",
            "*",
            "--connect-timeout",
            "2",
            "--resolve",
            &format!("up.test:80:{UPSTREAM_IP}"),
            "http://up.test/never",
        ],
        &[],
    );
    assert_ne!(out.exit, Some(0), "{out:#?}");
    assert_eq!(out.response.status, 0, "{out:#?}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(lk.audit_records().is_empty(), "{:#?}", lk.audit_records());
    assert_eq!(plain.connections() + tls.connections(), 0);
}

/// `latchkey gateway-setup ARGS` in latchkey's namespace.
fn gateway_setup(gw: &Gateway, args: &[&str]) -> CliOutput {
    let mut cmd = gw.proxy.command(crate::support::latchkey::BIN);
    cmd.arg("gateway-setup").args(args);
    wait_with_timeout(&mut cmd, Duration::from_secs(20))
}

#[test]
fn gateway_setup_tproxy_applied_makes_latchkey_the_route_and_remove_undoes_it() {
    let gw = Gateway::new();
    let ca = TestCa::new();
    let (plain, tls) = upstreams(&gw, &ca);
    let ssh = NsEcho::start(&gw.upstream, "ssh", UPSTREAM_IP, 22, EchoOptions::default());
    let iface = interface_with(&gw.proxy, PROXY_IP);
    let apply = ["--interface", iface.as_str(), "--tproxy", "--apply"];
    // Twice: the second finds the routing in place and replaces the table.
    for _ in 0..2 {
        let out = gateway_setup(&gw, &apply);
        assert_eq!(out.code(), Some(0), "gateway-setup {apply:?}: {out:#?}");
    }
    let rules = gw.proxy.sh("ip -4 rule list; ip -6 rule list");
    assert_eq!(
        rules
            .matches(&format!("fwmark {MARK} lookup {TABLE}"))
            .count(),
        2,
        "one rule per family:\n{rules}"
    );
    assert!(
        gw.proxy
            .sh(&format!("ip -4 route show table {TABLE}"))
            .contains("local default dev lo"),
        "the marked packets' table"
    );
    let ruleset = gw.proxy.sh("nft list ruleset");
    assert!(ruleset.contains("tproxy ip to :15001"), "{ruleset}");
    assert!(!ruleset.contains("redirect to :15001"), "{ruleset}");

    let listen = format!("{PROXY_IP}:{TRANSPARENT_PORT}");
    let lk = gateway_latchkey(
        &gw,
        &ca,
        &["--transparent", &listen, "--transparent-tproxy"],
    );
    let out = direct_curl(
        &gw,
        &lk,
        ("up.test", 443, UPSTREAM_IP),
        "https://up.test/setup",
    );
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}\n{}", lk.stderr_text());
    assert_record(
        &record_with(&lk, json!({"path": "/setup"})),
        json!({"scheme": "https", "host": "up.test", "reason": "allowed",
               "upstream": format!("{UPSTREAM_IP}:443")}),
    );
    let out = direct_curl(
        &gw,
        &lk,
        ("up.test", 80, UPSTREAM_IP),
        "http://up.test/setup-plain",
    );
    assert_eq!(out.ok().status, 200, "{out:#?}");
    assert_record(
        &record_with(&lk, json!({"path": "/setup-plain"})),
        json!({"scheme": "http", "host": "up.test", "reason": "allowed",
               "upstream": format!("{UPSTREAM_IP}:80")}),
    );
    // TCP 22 is neither captured nor let through.
    let out = python_in(
        &gw.sandbox,
        RAW_CLIENT,
        &[UPSTREAM_IP, "22", "SSH-2.0-x\r\n"],
    );
    assert_ne!(out.code(), Some(0), "{out:#?}");
    assert_eq!(
        (plain.connections(), tls.connections(), ssh.connections()),
        (1, 1, 0)
    );
    assert_eq!(lk.audit_records().len(), 2, "{:#?}", lk.audit_records());

    // --remove --tproxy (twice: nothing left is no error) deletes the table and the routing.
    for _ in 0..2 {
        let out = gateway_setup(&gw, &["--remove", "--tproxy"]);
        assert_eq!(
            out.code(),
            Some(0),
            "gateway-setup --remove --tproxy: {out:#?}"
        );
    }
    let rules = gw.proxy.sh("ip -4 rule list; ip -6 rule list");
    assert!(!rules.contains("fwmark"), "{rules}");
    let table = gw
        .proxy
        .sh(&format!("ip -4 route show table {TABLE} 2>/dev/null; true"));
    assert!(table.trim().is_empty(), "{table}");
    assert!(!gw.proxy.sh("nft list tables").contains("latchkey"));
}

#[test]
fn without_cap_net_admin_or_net_raw_transparent_tproxy_refuses_to_start() {
    let policies = crate::support::latchkey::policy_dir(&[("main.toml", policy())]);
    let scratch = tempfile::tempdir().expect("scratch dir");
    // Root without CAP_NET_ADMIN and CAP_NET_RAW (either lets a socket set IP_TRANSPARENT):
    // dropped from the bounding set, so the exec'd latchkey has them in none of its sets.
    let mut cmd = Command::new(toolchain::tool("setpriv"));
    cmd.args(["--bounding-set", "-net_admin,-net_raw", "--"])
        .arg(crate::support::latchkey::BIN)
        .arg("serve")
        .arg("--policies")
        .arg(policies.path())
        .args(["--listen", "127.0.0.1:0", "--admin", "off"])
        .arg("--ca-dir")
        .arg(scratch.path().join("ca"))
        .arg("--audit")
        .arg(scratch.path().join("audit.jsonl"))
        .args(["--transparent", "127.0.0.1:0", "--transparent-tproxy"]);
    for var in crate::support::latchkey::SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(15));
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("--transparent-tproxy")
            && out.stderr.contains("cannot set IP_TRANSPARENT")
            && out.stderr.contains("CAP_NET_ADMIN"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("listening on"), "{}", out.stderr);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    // The same flags with the capability start (and are stopped at once).
    let mut lk = latchkey()
        .arg("--transparent")
        .arg("127.0.0.1:0")
        .arg("--transparent-tproxy")
        .policy("main.toml", policy())
        .run();
    assert!(
        lk.wait_stderr_contains("transparent listening on", Duration::from_secs(5)),
        "{}",
        lk.stderr_text()
    );
    lk.signal("TERM");
    assert!(lk.wait_exit(Duration::from_secs(10)).is_some());
}

#[test]
fn one_dual_stack_tproxy_listener_takes_ipv6_and_ipv4_from_gateway_setup_tproxy() {
    let gw = Gateway::new();
    let ca = TestCa::new();
    add_ipv6(&gw);
    let (plain, _tls) = upstreams(&gw, &ca);
    let plain6 = NsEcho::start(
        &gw.upstream,
        "up6",
        UPSTREAM_IP6,
        80,
        EchoOptions::default(),
    );
    let tls6 = NsEcho::start(
        &gw.upstream,
        "up6-tls",
        UPSTREAM_IP6,
        443,
        EchoOptions {
            tls: Some((&ca, &["up6.test"])),
            ..EchoOptions::default()
        },
    );
    let iface = interface_with(&gw.proxy, PROXY_IP);
    let out = gateway_setup(&gw, &["--interface", &iface, "--tproxy", "--apply"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    // IPV6_TRANSPARENT on [::]: the kernel's one flag covers its IPv4-mapped connections too.
    let listen = format!("[::]:{TRANSPARENT_PORT}");
    let lk = gateway_latchkey(
        &gw,
        &ca,
        &[
            "--transparent",
            &listen,
            "--transparent-tproxy",
            "--allow-private",
            "fd00:201::/64",
            "--resolve",
            &format!("up6.test={UPSTREAM_IP6}"),
        ],
    );
    let v6 = format!("[{UPSTREAM_IP6}]");
    let out = direct_curl(&gw, &lk, ("up6.test", 443, &v6), "https://up6.test/tp6");
    assert_eq!(out.ok().status, 200, "{out:#?}\n{}", lk.stderr_text());
    let out = direct_curl(&gw, &lk, ("up6.test", 80, &v6), "http://up6.test/tp6-plain");
    assert_eq!(out.ok().status, 200, "{out:#?}");
    for (path, port) in [("/tp6", 443), ("/tp6-plain", 80)] {
        assert_record(
            &record_with(&lk, json!({"path": path})),
            json!({"host": "up6.test", "port": port, "reason": "allowed",
                   "upstream": format!("[{UPSTREAM_IP6}]:{port}")}),
        );
    }
    // up.test has only an IPv4 address: sent to the IPv6 upstream, it is refused.
    let out = direct_curl(&gw, &lk, ("up.test", 443, &v6), "https://up.test/tp-spoof6");
    assert_ne!(out.exit, Some(0), "{out:#?}");
    assert_record(
        &record_with(&lk, json!({"reason": "destination_mismatch"})),
        json!({"method": "CONNECT", "host": "up.test", "port": 443, "upstream": null,
               "original_dst": format!("[{UPSTREAM_IP6}]:443")}),
    );
    // IPv4 on the same listener.
    let out = direct_curl(&gw, &lk, ("up.test", 80, UPSTREAM_IP), "http://up.test/tp4");
    assert_eq!(out.ok().status, 200, "{out:#?}");
    assert_record(
        &record_with(&lk, json!({"path": "/tp4"})),
        json!({"host": "up.test", "reason": "allowed", "upstream": format!("{UPSTREAM_IP}:80")}),
    );
    // Straight to latchkey's own address over IPv6: dropped by the rules, never captured.
    let out = python_in(
        &gw.sandbox,
        RAW_CLIENT,
        &[
            PROXY_IP6,
            &TRANSPARENT_PORT.to_string(),
            "GET / HTTP/1.1\r\n\r\n",
        ],
    );
    assert_ne!(out.code(), Some(0), "{out:#?}");
    assert_eq!(
        (
            plain.connections(),
            plain6.connections(),
            tls6.connections()
        ),
        (1, 1, 1)
    );
    assert_eq!(lk.wait_audit(4).len(), 4, "{:#?}", lk.audit_records());
    let out = gateway_setup(&gw, &["--remove", "--tproxy"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
}

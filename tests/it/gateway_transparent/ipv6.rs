//! IPv6 through the transparent listener: the original destination read with
//! `IP6T_SO_ORIGINAL_DST`, one dual-stack `[::]` listener taking IPv4 (IPv4-mapped) and IPv6.

use serde_json::json;

use super::*;

/// IPv6 on the gateway's two links (ULA addresses, no duplicate-address wait), beside the IPv4.
pub(super) const SANDBOX_IP6: &str = "fd00:200::2";
pub(super) const PROXY_IP6: &str = "fd00:200::1";
pub(super) const PROXY_UPLINK_IP6: &str = "fd00:201::1";
pub(super) const UPSTREAM_IP6: &str = "fd00:201::2";

/// The interface in `ns` that holds the IPv4 address `ip`.
pub(super) fn interface_with(ns: &Netns, ip: &str) -> String {
    let out = ns.sh("ip -o -4 addr show");
    out.lines()
        .find(|l| l.contains(&format!(" {ip}/")))
        .and_then(|l| l.split_whitespace().nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_string())
        .unwrap_or_else(|| panic!("no interface with {ip} in {}: {out}", ns.name()))
}

/// IPv6 on the gateway's two links beside the IPv4, the sandbox's default route via latchkey.
pub(super) fn add_ipv6(gw: &Gateway) {
    let sandbox_if = interface_with(&gw.sandbox, SANDBOX_IP);
    let proxy_if = interface_with(&gw.proxy, PROXY_IP);
    let uplink_if = interface_with(&gw.proxy, crate::support::netns::PROXY_UPLINK_IP);
    for (ns, addr, dev) in [
        (&gw.sandbox, SANDBOX_IP6, sandbox_if.as_str()),
        (&gw.proxy, PROXY_IP6, proxy_if.as_str()),
        (&gw.proxy, PROXY_UPLINK_IP6, uplink_if.as_str()),
        (&gw.upstream, UPSTREAM_IP6, gw.upstream_if.as_str()),
    ] {
        ns.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{addr}/64"),
            "dev",
            dev,
            "nodad",
        ]);
    }
    gw.sandbox
        .ip(&["-6", "route", "add", "default", "via", PROXY_IP6]);
}

#[test]
fn ipv6_connections_are_redirected_and_checked_like_ipv4_on_a_dual_stack_listener() {
    let gw = Gateway::new();
    let ca = TestCa::new();
    add_ipv6(&gw);
    gw.proxy.nft(&format!(
        "{}table ip6 lk_transparent6 {{\n\
         \tchain prerouting {{\n\
         \t\ttype nat hook prerouting priority dstnat; policy accept;\n\
         \t\tip6 saddr {SANDBOX_IP6} ip6 daddr != {PROXY_IP6} tcp dport {{ 80, 443 }} redirect to :{TRANSPARENT_PORT}\n\
         \t}}\n\
         }}\n",
        redirect_ruleset()
    ));
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
    // One listener on [::] takes both families: IPv4 arrives IPv4-mapped.
    let listen = format!("[::]:{TRANSPARENT_PORT}");
    let lk = gateway_latchkey(
        &gw,
        &ca,
        &[
            "--transparent",
            &listen,
            "--allow-private",
            "fd00:201::/64",
            "--resolve",
            &format!("up6.test={UPSTREAM_IP6}"),
        ],
    );
    let v6 = format!("[{UPSTREAM_IP6}]");

    let out = direct_curl(&gw, &lk, ("up6.test", 443, &v6), "https://up6.test/v6");
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let out = direct_curl(&gw, &lk, ("up6.test", 80, &v6), "http://up6.test/v6-plain");
    assert_eq!(out.ok().status, 200, "{out:#?}");
    for (path, port) in [("/v6", 443), ("/v6-plain", 80)] {
        let record = record_with(&lk, json!({"path": path}));
        assert_record(
            &record,
            json!({"host": "up6.test", "port": port, "reason": "allowed",
                   "upstream": format!("[{UPSTREAM_IP6}]:{port}"),
                   "original_dst": format!("[{UPSTREAM_IP6}]:{port}")}),
        );
        assert!(
            record["client"]
                .as_str()
                .is_some_and(|c| c.starts_with(&format!("[{SANDBOX_IP6}]:"))),
            "{record:#}"
        );
    }
    assert_eq!((plain6.connections(), tls6.connections()), (1, 1));

    // up.test has only an IPv4 address: sent to the IPv6 upstream, it is refused.
    let out = direct_curl(&gw, &lk, ("up.test", 443, &v6), "https://up.test/spoof6");
    assert_ne!(out.exit, Some(0), "{out:#?}");
    assert_record(
        &record_with(&lk, json!({"reason": "destination_mismatch"})),
        json!({"method": "CONNECT", "host": "up.test", "port": 443, "upstream": null,
               "original_dst": format!("[{UPSTREAM_IP6}]:443")}),
    );
    assert_eq!(tls6.connections(), 1, "the spoofed destination was dialed");

    // IPv4 on the same listener.
    let out = direct_curl(&gw, &lk, ("up.test", 80, UPSTREAM_IP), "http://up.test/v4");
    assert_eq!(out.ok().status, 200, "{out:#?}");
    assert_record(
        &record_with(&lk, json!({"path": "/v4"})),
        json!({"host": "up.test", "reason": "allowed", "upstream": format!("{UPSTREAM_IP}:80")}),
    );
    assert_eq!(plain.connections(), 1);

    // Straight to the wildcard listener over IPv6: latchkey's own address, not redirected.
    let out = python_in(
        &gw.sandbox,
        RAW_CLIENT,
        &[
            PROXY_IP6,
            &TRANSPARENT_PORT.to_string(),
            "GET / HTTP/1.1\r\nHost: up6.test\r\n\r\n",
        ],
    );
    assert_eq!(out.stdout, "", "{out:#?}");
    assert_record(
        &record_with(&lk, json!({"reason": "not_redirected"})),
        json!({"host": PROXY_IP6, "port": TRANSPARENT_PORT, "upstream": null}),
    );
    lk.wait_audit(5);
}

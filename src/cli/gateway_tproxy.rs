//! `gateway-setup --tproxy`: the nftables `tproxy` form of interface mode and the policy
//! routing it needs. Instead of NAT rewriting the destination, the guard before NAT marks the
//! sandbox's captured TCP and hands it to `serve --transparent --transparent-tproxy` (a socket
//! with `IP_TRANSPARENT`); the mark's routing table delivers every address locally, so the
//! packet reaches that socket instead of being forwarded. The connection keeps its real
//! destination as its local address, and no conntrack NAT entry is made for it.
//!
//! Only for `--interface`: tproxy works in prerouting, on traffic arriving from elsewhere; a
//! cgroup's traffic is this host's own output. Renders text and runs `ip`; uses nothing else of
//! the crate but its parent, `gateway_setup`.

use std::fmt::Write as _;
use std::process::Command;

use super::{set, Options, Ports, SetupError};

/// The packet mark the tproxy rules set and the policy routing rule matches.
pub const MARK: &str = "0x1";

/// The routing table the marked packets are looked up in: one route, every address local.
pub const ROUTE_TABLE: &str = "100";

/// One `ip` command of the policy routing: what adds it, what deletes it.
struct Route {
    add: [&'static str; 10],
    del: [&'static str; 10],
}

/// The policy routing, IPv4 and IPv6: a marked packet is routed to this host itself.
fn routing() -> [Route; 4] {
    let (m, t) = (MARK, ROUTE_TABLE);
    [
        Route {
            add: ["-4", "rule", "add", "fwmark", m, "lookup", t, "", "", ""],
            del: ["-4", "rule", "del", "fwmark", m, "lookup", t, "", "", ""],
        },
        Route {
            add: [
                "-4",
                "route",
                "add",
                "local",
                "0.0.0.0/0",
                "dev",
                "lo",
                "table",
                t,
                "",
            ],
            del: [
                "-4",
                "route",
                "del",
                "local",
                "0.0.0.0/0",
                "dev",
                "lo",
                "table",
                t,
                "",
            ],
        },
        Route {
            add: ["-6", "rule", "add", "fwmark", m, "lookup", t, "", "", ""],
            del: ["-6", "rule", "del", "fwmark", m, "lookup", t, "", "", ""],
        },
        Route {
            add: [
                "-6", "route", "add", "local", "::/0", "dev", "lo", "table", t, "",
            ],
            del: [
                "-6", "route", "del", "local", "::/0", "dev", "lo", "table", t, "",
            ],
        },
    ]
}

fn args(parts: &[&'static str; 10]) -> Vec<&'static str> {
    parts.iter().copied().filter(|p| !p.is_empty()).collect()
}

/// The `ip` commands that add the policy routing, one a line, as a shell would run them.
pub fn routing_commands() -> Vec<String> {
    routing()
        .iter()
        .map(|r| format!("ip {}", args(&r.add).join(" ")))
        .collect()
}

/// The ruleset header's lines for tproxy: the routing it needs besides the nft table.
pub fn header(out: &mut String) {
    let _ = writeln!(
        out,
        "# tproxy: run `latchkey serve --transparent ADDR --transparent-tproxy` (CAP_NET_ADMIN),"
    );
    let _ = writeln!(
        out,
        "# and route marked packets to this host (--apply adds these; --remove --tproxy deletes them):"
    );
    for line in routing_commands() {
        let _ = writeln!(out, "#   {line}");
    }
}

/// The guard's capture (prerouting, mangle priority, before any routing decision): the
/// captured TCP is marked and given to the transparent listener, per family.
pub fn guard_capture(out: &mut String, o: &Options) {
    let matched = match &o.ports {
        Ports::All => Some("meta l4proto tcp".to_string()),
        Ports::List(ports) => set(ports).map(|s| format!("tcp dport {s}")),
    };
    let Some(matched) = matched else { return };
    for (nfproto, family) in [("ipv4", "ip"), ("ipv6", "ip6")] {
        let _ = writeln!(
            out,
            "\t\tmeta nfproto {nfproto} {matched} meta mark set {MARK} tproxy {family} to :{} accept",
            o.transparent_port
        );
    }
}

/// Input (interface mode): the tproxy'd packets, which keep their real destination and port,
/// are told by the mark the guard set (a mark never crosses from the sandbox's namespace).
pub fn input_accept(out: &mut String, o: &Options) {
    let matched = match &o.ports {
        Ports::All => Some("meta l4proto tcp".to_string()),
        Ports::List(ports) => set(ports).map(|s| format!("tcp dport {s}")),
    };
    if let Some(matched) = matched {
        let _ = writeln!(out, "\t\tmeta mark {MARK} {matched} accept");
    }
}

/// Adds the policy routing; one already there is left as it is, so applying twice is fine.
pub fn apply_routing() -> Result<(), SetupError> {
    for route in routing() {
        ip(&args(&route.add), &["File exists"])?;
    }
    Ok(())
}

/// Deletes the policy routing; one already gone is no error.
pub fn remove_routing() -> Result<(), SetupError> {
    for route in routing() {
        ip(
            &args(&route.del),
            &["No such file or directory", "No such process"],
        )?;
    }
    Ok(())
}

/// Runs `ip ARGS`; a failure whose message contains one of `fine` (the state already being
/// what was asked for) counts as success.
fn ip(args: &[&str], fine: &[&str]) -> Result<(), SetupError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(SetupError::NoIp)?;
    let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if out.status.success() || fine.iter().any(|f| message.contains(f)) {
        return Ok(());
    }
    Err(SetupError::Ip {
        command: format!("ip {}", args.join(" ")),
        message: if message.is_empty() {
            format!("exited with {}", out.status)
        } else {
            message
        },
    })
}

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

/// One piece of the policy routing, for one family (`-4`, `-6`): a rule (marked packets use
/// the table) or the table's one route (every address is local).
struct Route {
    family: &'static str,
    rule: bool,
}

impl Route {
    /// `ip` arguments with `verb` (`add`, `del`, `list`).
    fn args(&self, verb: &'static str) -> Vec<&'static str> {
        let all = if self.family == "-4" {
            "0.0.0.0/0"
        } else {
            "::/0"
        };
        if self.rule {
            vec![
                self.family,
                "rule",
                verb,
                "fwmark",
                MARK,
                "lookup",
                ROUTE_TABLE,
            ]
        } else {
            vec![
                self.family,
                "route",
                verb,
                "local",
                all,
                "dev",
                "lo",
                "table",
                ROUTE_TABLE,
            ]
        }
    }
}

/// The policy routing, IPv4 and IPv6: a marked packet is routed to this host itself.
const ROUTING: [Route; 4] = [
    Route {
        family: "-4",
        rule: true,
    },
    Route {
        family: "-4",
        rule: false,
    },
    Route {
        family: "-6",
        rule: true,
    },
    Route {
        family: "-6",
        rule: false,
    },
];

/// The `ip` commands that add the policy routing, one a line, as a shell would run them.
pub fn routing_commands() -> Vec<String> {
    ROUTING
        .iter()
        .map(|r| format!("ip {}", r.args("add").join(" ")))
        .collect()
}

/// The ruleset header's lines for tproxy: the routing it needs besides the nft table.
pub fn header(out: &mut String) {
    let _ = writeln!(
        out,
        "# tproxy: run `latchkey serve --transparent ADDR --transparent-tproxy` (CAP_NET_ADMIN or CAP_NET_RAW),"
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

/// Adds the policy routing; what is already there is left as it is (the kernel would take a
/// second identical rule), so applying twice leaves one copy.
pub fn apply_routing() -> Result<(), SetupError> {
    for route in &ROUTING {
        if route.rule && !ip(&route.args("list"), &[])?.trim().is_empty() {
            continue;
        }
        ip(&route.args("add"), &["File exists"])?;
    }
    Ok(())
}

/// Deletes the policy routing; what is already gone is no error.
pub fn remove_routing() -> Result<(), SetupError> {
    const GONE: [&str; 3] = [
        "No such file or directory",
        "No such process",
        "FIB table does not exist",
    ];
    for route in &ROUTING {
        ip(&route.args("del"), &GONE)?;
    }
    Ok(())
}

/// Runs `ip ARGS` and returns its output; a failure whose message contains one of `fine` (the
/// state already being what was asked for) counts as success.
fn ip(args: &[&str], fine: &[&str]) -> Result<String, SetupError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(SetupError::NoIp)?;
    let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if out.status.success() || fine.iter().any(|f| message.contains(f)) {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
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

//! `latchkey gateway-setup --host-guard --interface IFACE`: the host closed to the sandboxes
//! on IFACE, when latchkey is not this host's process but a container or VM beside them.
//!
//! Docker's `internal: true` network (compose's quick start) and a bridge of VMs filter only
//! what the host *forwards*: a sandbox still reaches the host itself, through its gateway
//! address or any other address of the host, on every port the host listens on at 0.0.0.0
//! (sshd, a dashboard, the Docker API over TCP, a database). This ruleset drops, in the input
//! hook, every packet arriving on IFACE that opens something on this host, IPv4 and IPv6, ICMP
//! included, keeping only answers to connections the host opened itself (Docker's embedded
//! resolver forwards the sandbox's DNS queries to latchkey from the host), IPv6 neighbour
//! discovery on the link, and the `--local-ports` given (a latchkey on this host, say).
//!
//! It lives in its own table, `inet latchkey_host`, rebuilt whole by every apply and deleted
//! by `--host-guard --remove`, so it stands beside a `gateway-setup` ruleset (table `inet
//! latchkey`) and touches nothing else. It runs before the `filter` priority, so an accept in
//! another table (Docker's, a firewall's) cannot reopen what it drops.

use std::fmt::Write as _;

use super::{ports_text, PortList, Ports};

/// The host guard's table.
pub const TABLE: &str = "inet latchkey_host";

/// The nft script deleting the host guard's table, whether or not it exists.
pub fn removal() -> String {
    format!("table {TABLE}\ndelete table {TABLE}\n")
}

/// The whole nft script closing this host to `iface`, but for `local`.
pub fn ruleset(iface: &str, local: &PortList, made_by: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "#!/usr/sbin/nft -f");
    let _ = writeln!(out, "# Made by: {made_by}");
    let _ = writeln!(
        out,
        "# This host closed to the sandboxes on interface {iface}:"
    );
    if local.0.is_empty() {
        let _ = writeln!(out, "#   nothing they send reaches this host's own ports;");
    } else {
        let _ = writeln!(
            out,
            "#   only TCP {} of this host is reachable from them;",
            ports_text(&Ports::List(local.0.clone()))
        );
    }
    let _ = writeln!(
        out,
        "#   answers to connections this host opened, and IPv6 neighbour discovery, pass."
    );
    let _ = writeln!(
        out,
        "# Traffic between the sandboxes and latchkey's container on that network is not \
         this host's input: it is untouched."
    );
    let _ = writeln!(
        out,
        "# Remove with `latchkey gateway-setup --host-guard --remove`."
    );
    out.push_str(&removal());
    let _ = writeln!(out, "table {TABLE} {{");
    let _ = writeln!(
        out,
        "\tcomment \"latchkey gateway-setup --host-guard: sandboxes cannot reach this host\""
    );
    let _ = writeln!(out, "\tchain input {{");
    let _ = writeln!(
        out,
        "\t\ttype filter hook input priority filter - 10; policy accept;"
    );
    let _ = writeln!(out, "\t\tiifname \"{iface}\" jump from_sandbox");
    let _ = writeln!(out, "\t}}");
    let _ = writeln!(out, "\tchain from_sandbox {{");
    let _ = writeln!(out, "\t\tct state established,related accept");
    if !local.0.is_empty() {
        let _ = writeln!(
            out,
            "\t\ttcp dport {{ {} }} accept",
            local
                .0
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(
        out,
        "\t\ticmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert }} ip6 hoplimit 255 accept"
    );
    let _ = writeln!(
        out,
        "\t\tcounter drop comment \"a sandbox opening something on this host\""
    );
    let _ = writeln!(out, "\t}}");
    out.push_str("}\n");
    out
}

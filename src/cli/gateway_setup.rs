//! `latchkey gateway-setup`: the nftables ruleset that makes latchkey a sandbox's only route.
//!
//! The sandbox's traffic is picked out by the interface it arrives on (a veth or bridge of
//! latchkey's host) or by the cgroup of the socket sending it (processes on latchkey's own
//! host). Of that traffic, TCP to the captured ports (80 and 443 by default) is redirected to
//! `serve --transparent`, DNS (UDP and TCP 53, to any address) to `serve --dns`, TCP to the
//! `--local-ports` of latchkey's host is let through, and everything else is dropped: IPv4 and
//! IPv6, ICMP included, UDP 443 (QUIC) named on its own so a reader sees why HTTP/3 fails over
//! to TCP. Only IPv6 neighbour discovery on the sandbox's link survives (`--interface`), or the
//! link itself stops working.
//!
//! With `--tproxy` (interface mode only), the captured TCP is not NATed: the guard marks it and
//! hands it to the transparent listener with nftables `tproxy`, and a policy routing rule
//! (printed in the header; added by `--apply`, deleted by `--remove --tproxy`) delivers the
//! marked packets locally (`gateway_tproxy`).
//!
//! Everything lives in one table, `inet latchkey`, which every ruleset deletes and recreates in
//! the same `nft -f` transaction: applying twice, or after a change of flags, leaves exactly one
//! copy, and `--remove` touches nothing else on the host. Rules in other tables still run: a
//! drop here is final whatever they say, an accept here overrides nothing of theirs.
//!
//! Uses nothing else in the crate: it renders text and, with `--apply`, runs `nft -f -` (and,
//! for `--tproxy`, `ip`).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use super::args::GatewaySetupArgs;

#[path = "gateway_tproxy.rs"]
mod tproxy;

#[path = "gateway_host_guard.rs"]
pub mod host_guard;

/// The table every ruleset owns, whole.
pub const TABLE: &str = "inet latchkey";

/// Where nft looks up `socket cgroupv2` paths (fixed in nftables: `SYSFS_CGROUPSV2_PATH`).
const NFT_CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Linux's interface names are at most 15 bytes (`IFNAMSIZ` 16, with its NUL).
const IFNAME_MAX: usize = 15;

/// Longest `--cgroup` path accepted (Linux's `PATH_MAX` is 4096).
const CGROUP_PATH_MAX: usize = 4000;

/// The port DNS is captured on, always, whatever `--ports` says.
const DNS: u16 = 53;

/// QUIC dropped by a rule of its own, which says why to whoever lists the ruleset.
const QUIC: &str =
    "udp dport 443 counter drop comment \"QUIC (HTTP/3): clients fall back to TCP, which is captured\"";

/// The TCP ports redirected to the transparent listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ports {
    /// Every TCP port (but DNS, which goes to the resolver, and `--local-ports`).
    All,
    /// These ports, sorted, none of them 53.
    List(Vec<u16>),
}

/// A list of TCP ports (`--local-ports`), sorted and without repeats; may be empty.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PortList(pub Vec<u16>);

/// How the sandbox's packets are told apart from everything else on latchkey's host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Packets arriving on this interface (a trailing `*` matches every name with the prefix).
    Interface(String),
    /// Packets sent by sockets of this cgroup or of any cgroup below it.
    Cgroup {
        /// The path as nft looks it up, relative to `/sys/fs/cgroup`.
        nft_path: String,
        /// Its depth in the cgroup2 hierarchy (`socket cgroupv2 level N`).
        level: usize,
    },
}

/// Everything a ruleset is made of, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub selector: Selector,
    pub ports: Ports,
    pub transparent_port: u16,
    pub dns_port: u16,
    pub local_ports: PortList,
    /// `--tproxy`: captured TCP goes to the transparent listener by nftables `tproxy` (marked,
    /// policy-routed locally) instead of NAT `redirect`. Interface mode only.
    pub tproxy: bool,
}

/// What stops a ruleset from being rendered or applied. Each names the flag at fault.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(
        "give the sandbox's traffic with exactly one of --interface IFACE (it arrives on that \
         interface) or --cgroup PATH (processes of this host in that cgroup)"
    )]
    Selector,
    #[error("--transparent-port and --dns-port are both {0}: each listener needs its own port")]
    SamePort(u16),
    #[error(
        "--local-ports {port}: that is the {what} port, which must see only redirected \
         connections (a direct one would reach it without an original destination)"
    )]
    LocalPortClash { port: u16, what: &'static str },
    #[error(
        "--cgroup {0:?}: that is the root cgroup, which holds every process of the host, \
         latchkey's too; give the sandbox's own cgroup"
    )]
    RootCgroup(String),
    #[error(
        "--cgroup: the cgroup2 filesystem is mounted at {}, outside {NFT_CGROUP_ROOT}, where \
         nft looks cgroup paths up",
        .0.display()
    )]
    Cgroup2Elsewhere(PathBuf),
    #[error(
        "--cgroup: no cgroup2 filesystem is mounted on this host (`socket cgroupv2` needs it)"
    )]
    NoCgroup2,
    #[error(
        "--cgroup {given:?}: there is no cgroup at {} (create it and start the sandbox in it \
         first; paths are relative to the cgroup2 root, as /proc/PID/cgroup shows them)",
        .dir.display()
    )]
    NoCgroup { given: String, dir: PathBuf },
    #[error(
        "--tproxy works on traffic arriving on an interface (prerouting); a --cgroup's traffic \
         is this host's own output, where tproxy does not apply: leave out --tproxy (redirect \
         captures it)"
    )]
    TproxyCgroup,
    #[error(
        "--host-guard needs --interface IFACE: the interface the sandboxes' packets arrive on \
         (compose's quick start names its bridge lk-sandbox)"
    )]
    HostGuardInterface,
    #[error("cannot run ip ({0}); install the iproute2 package")]
    NoIp(std::io::Error),
    #[error("{command} failed: {message}")]
    Ip { command: String, message: String },
    #[error("cannot run nft ({0}); install the nftables package")]
    NoNft(std::io::Error),
    #[error("nft -f - refused the ruleset: {0}")]
    Nft(String),
}

/// `latchkey gateway-setup`: print the ruleset, or apply it (`--apply`), or delete latchkey's
/// table (`--remove`).
pub fn run(args: &GatewaySetupArgs) -> anyhow::Result<ExitCode> {
    if args.host_guard {
        return run_host_guard(args);
    }
    if args.remove {
        nft_apply(&removal())?;
        if args.tproxy {
            tproxy::remove_routing()?;
            eprintln!("latchkey: removed table {TABLE} and the tproxy policy routing");
        } else {
            eprintln!("latchkey: removed table {TABLE} (nothing else was touched)");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let options = options(args)?;
    let text = ruleset(&options, &command_line(args));
    if args.apply {
        if options.tproxy {
            // Before the rules that mark packets: a mark routed nowhere yet is not a gap, but
            // loading them first would cut the sandbox off until the routing lands.
            tproxy::apply_routing()?;
        }
        nft_apply(&text)?;
        eprintln!(
            "latchkey: applied table {TABLE}: TCP {} → :{}, DNS → :{}, everything else from {} \
             dropped",
            ports_text(&options.ports),
            options.transparent_port,
            options.dns_port,
            selector_text(&options.selector)
        );
    } else {
        print!("{text}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `--host-guard`: print, apply or remove the table closing this host to a sandbox interface.
fn run_host_guard(args: &GatewaySetupArgs) -> anyhow::Result<ExitCode> {
    if args.remove {
        nft_apply(&host_guard::removal())?;
        eprintln!(
            "latchkey: removed table {} (nothing else was touched)",
            host_guard::TABLE
        );
        return Ok(ExitCode::SUCCESS);
    }
    let iface = args
        .interface
        .as_deref()
        .ok_or(SetupError::HostGuardInterface)?;
    let local = args.local_ports.clone().unwrap_or_default();
    let mut made_by = format!("latchkey gateway-setup --host-guard --interface {iface}");
    if !local.0.is_empty() {
        let list: Vec<String> = local.0.iter().map(u16::to_string).collect();
        let _ = write!(made_by, " --local-ports {}", list.join(","));
    }
    let text = host_guard::ruleset(iface, &local, &made_by);
    if args.apply {
        nft_apply(&text)?;
        eprintln!(
            "latchkey: applied table {}: nothing arriving on {iface} opens anything on this host{}",
            host_guard::TABLE,
            if local.0.is_empty() {
                String::new()
            } else {
                format!(" but TCP {}", ports_text(&Ports::List(local.0.clone())))
            }
        );
    } else {
        print!("{text}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Validates the flags into [`Options`]. With `--apply`, a `--cgroup` must exist now (nft
/// resolves it to the cgroup's id when the rules load).
pub fn options(args: &GatewaySetupArgs) -> Result<Options, SetupError> {
    let selector = match (&args.interface, &args.cgroup) {
        (Some(iface), None) => Selector::Interface(iface.clone()),
        (None, Some(path)) => {
            let mount = cgroup2_mount();
            if args.apply && mount.is_none() {
                return Err(SetupError::NoCgroup2);
            }
            let mount = mount.unwrap_or_else(|| PathBuf::from(NFT_CGROUP_ROOT));
            let (selector, dir) = cgroup_selector(path, &mount)?;
            if args.apply {
                if !dir.join("cgroup.procs").is_file() {
                    return Err(SetupError::NoCgroup {
                        given: path.clone(),
                        dir,
                    });
                }
                warn_if_inside(&dir, &mount);
            }
            selector
        }
        _ => return Err(SetupError::Selector),
    };
    if args.tproxy && matches!(selector, Selector::Cgroup { .. }) {
        return Err(SetupError::TproxyCgroup);
    }
    if args.transparent_port == args.dns_port {
        return Err(SetupError::SamePort(args.dns_port));
    }
    let local_ports = args.local_ports.clone().unwrap_or_default();
    for (port, what) in [
        (args.transparent_port, "--transparent-port"),
        (args.dns_port, "--dns-port"),
    ] {
        if local_ports.0.contains(&port) {
            return Err(SetupError::LocalPortClash { port, what });
        }
    }
    Ok(Options {
        selector,
        ports: args.ports.clone(),
        transparent_port: args.transparent_port,
        dns_port: args.dns_port,
        local_ports,
        tproxy: args.tproxy,
    })
}

/// The nft script deleting latchkey's table, which succeeds whether or not the table exists.
pub fn removal() -> String {
    format!("table {TABLE}\ndelete table {TABLE}\n")
}

/// The whole nft script for `options`: a header saying what made it, then latchkey's table
/// deleted and rebuilt in the same transaction. `made_by` is the command line shown in the
/// header.
pub fn ruleset(options: &Options, made_by: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "#!/usr/sbin/nft -f");
    let _ = writeln!(out, "# Made by: {made_by}");
    let _ = writeln!(
        out,
        "# latchkey as the only route of {}:",
        selector_text(&options.selector)
    );
    let _ = writeln!(
        out,
        "#   TCP {} -> :{} (serve --transparent{}); DNS, UDP and TCP 53 -> :{} (serve --dns);",
        ports_text(&options.ports),
        options.transparent_port,
        if options.tproxy { ", by tproxy" } else { "" },
        options.dns_port
    );
    if !options.local_ports.0.is_empty() {
        let _ = writeln!(
            out,
            "#   TCP to this host's {} let through;",
            ports_text(&Ports::List(options.local_ports.0.clone()))
        );
    }
    let _ = writeln!(out, "#   everything else dropped, IPv4 and IPv6.");
    if options.tproxy {
        tproxy::header(&mut out);
    }
    let _ = writeln!(out, "# Remove with `latchkey gateway-setup --remove`.");
    out.push_str(&removal());
    let _ = writeln!(out, "table {TABLE} {{");
    let _ = writeln!(
        out,
        "\tcomment \"latchkey gateway-setup: the sandbox's only route is latchkey\""
    );
    match &options.selector {
        Selector::Interface(iface) => interface_chains(&mut out, options, iface),
        Selector::Cgroup { nft_path, level } => cgroup_chains(
            &mut out,
            options,
            &format!("socket cgroupv2 level {level} \"{nft_path}\""),
        ),
    }
    out.push_str("}\n");
    out
}

/// Interface mode: the sandbox's packets reach this host through prerouting. A guard before
/// NAT lets through only what is captured (or a local port) and ND; NAT redirects the captured
/// ports (`--tproxy`: the guard hands them to the listener, marked); input then accepts only
/// connections the redirect (or the mark) made, or a local port, so the sandbox cannot reach
/// the listeners' ports, or anything else of this host, directly; forward drops whatever would
/// be routed on.
fn interface_chains(out: &mut String, o: &Options, iface: &str) {
    let from = format!("iifname \"{iface}\"");
    let nd = "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 accept";
    let _ = writeln!(out, "\tchain guard {{");
    let _ = writeln!(
        out,
        "\t\ttype filter hook prerouting priority -150; policy accept;"
    );
    let _ = writeln!(out, "\t\t{from} jump from_sandbox");
    let _ = writeln!(out, "\t}}");
    let _ = writeln!(out, "\tchain from_sandbox {{");
    guard_rules(out, o, nd);
    let _ = writeln!(out, "\t}}");
    let _ = writeln!(out, "\tchain capture {{");
    let _ = writeln!(
        out,
        "\t\ttype nat hook prerouting priority dstnat; policy accept;"
    );
    capture_rules(out, o, &from);
    let _ = writeln!(out, "\t}}");
    let _ = writeln!(out, "\tchain input {{");
    let _ = writeln!(
        out,
        "\t\ttype filter hook input priority filter; policy accept;"
    );
    let _ = writeln!(out, "\t\t{from} jump to_latchkey");
    let _ = writeln!(out, "\t}}");
    let _ = writeln!(out, "\tchain to_latchkey {{");
    if o.tproxy {
        tproxy::input_accept(out, o);
    }
    listener_rules(out, o);
    if let Some(set) = set(&o.local_ports.0) {
        let _ = writeln!(out, "\t\ttcp dport {set} accept");
    }
    let _ = writeln!(out, "\t\t{nd}");
    let _ = writeln!(out, "\t\tcounter drop");
    let _ = writeln!(out, "\t}}");
    let _ = writeln!(out, "\tchain forward {{");
    let _ = writeln!(
        out,
        "\t\ttype filter hook forward priority filter; policy accept;"
    );
    let _ = writeln!(out, "\t\t{from} counter drop");
    let _ = writeln!(out, "\t}}");
}

/// Cgroup mode: the sandbox's packets are this host's own, so everything happens on output:
/// NAT redirects the captured ports to loopback, then a filter chain (after NAT) accepts only
/// what the redirect made, the local ports, and drops the rest. Sockets of other cgroups —
/// latchkey's — are never matched.
fn cgroup_chains(out: &mut String, o: &Options, from: &str) {
    let _ = writeln!(out, "\tchain capture {{");
    // `dstnat` names the prerouting priority only; on output the same value is spelled out.
    let _ = writeln!(
        out,
        "\t\ttype nat hook output priority -100; policy accept;"
    );
    capture_rules(out, o, from);
    let _ = writeln!(out, "\t}}");
    let _ = writeln!(out, "\tchain output {{");
    let _ = writeln!(
        out,
        "\t\ttype filter hook output priority filter; policy accept;"
    );
    let _ = writeln!(out, "\t\t{from} jump from_sandbox");
    let _ = writeln!(out, "\t}}");
    let _ = writeln!(out, "\tchain from_sandbox {{");
    let _ = writeln!(out, "\t\t{QUIC}");
    listener_rules(out, o);
    if let Some(set) = set(&o.local_ports.0) {
        let _ = writeln!(out, "\t\tfib daddr type local tcp dport {set} accept");
    }
    let _ = writeln!(out, "\t\tcounter drop");
    let _ = writeln!(out, "\t}}");
}

/// The guard before NAT (interface mode): QUIC dropped by name, DNS and the local ports let on
/// to NAT, then the captured traffic (let on to NAT, or `--tproxy`: handed to the transparent
/// listener here, after DNS and the local ports so `--ports all` takes neither), ND kept, the
/// rest dropped.
fn guard_rules(out: &mut String, o: &Options, nd: &str) {
    let _ = writeln!(out, "\t\t{QUIC}");
    let _ = writeln!(out, "\t\tmeta l4proto {{ tcp, udp }} th dport {DNS} accept");
    if let Some(set) = set(&o.local_ports.0) {
        let _ = writeln!(out, "\t\tfib daddr type local tcp dport {set} accept");
    }
    if o.tproxy {
        tproxy::guard_capture(out, o);
    } else {
        match &o.ports {
            Ports::All => {
                let _ = writeln!(out, "\t\tmeta l4proto tcp accept");
            }
            Ports::List(ports) => {
                if let Some(set) = set(ports) {
                    let _ = writeln!(out, "\t\ttcp dport {set} accept");
                }
            }
        }
    }
    let _ = writeln!(out, "\t\t{nd}");
    let _ = writeln!(out, "\t\tcounter drop");
}

/// The NAT rules, in order: DNS first (it wins over `--ports all`), then the local ports left
/// alone (so a port both local and captured reaches latchkey's own listener directly, e.g.
/// `--https-listen` on 443), then the captured ports. With `--tproxy`, DNS only: the guard
/// already gave the captured TCP to the listener.
fn capture_rules(out: &mut String, o: &Options, from: &str) {
    let _ = writeln!(
        out,
        "\t\t{from} meta l4proto {{ tcp, udp }} th dport {DNS} redirect to :{}",
        o.dns_port
    );
    if o.tproxy {
        return;
    }
    if let Some(set) = set(&o.local_ports.0) {
        let _ = writeln!(
            out,
            "\t\t{from} fib daddr type local tcp dport {set} accept"
        );
    }
    match &o.ports {
        Ports::All => {
            let _ = writeln!(
                out,
                "\t\t{from} meta l4proto tcp redirect to :{}",
                o.transparent_port
            );
        }
        Ports::List(ports) => {
            if let Some(set) = set(ports) {
                let _ = writeln!(
                    out,
                    "\t\t{from} tcp dport {set} redirect to :{}",
                    o.transparent_port
                );
            }
        }
    }
}

/// After NAT: the listeners accept only what the redirect sent them (`ct status dnat`); with
/// `--tproxy` nothing is redirected to the transparent port.
fn listener_rules(out: &mut String, o: &Options) {
    if !o.tproxy {
        let _ = writeln!(
            out,
            "\t\ttcp dport {} ct status dnat accept",
            o.transparent_port
        );
    }
    let _ = writeln!(
        out,
        "\t\tmeta l4proto {{ tcp, udp }} th dport {} ct status dnat accept",
        o.dns_port
    );
}

/// `{ 80, 443 }`, or `None` for no ports.
fn set(ports: &[u16]) -> Option<String> {
    if ports.is_empty() {
        return None;
    }
    let list: Vec<String> = ports.iter().map(u16::to_string).collect();
    Some(format!("{{ {} }}", list.join(", ")))
}

fn ports_text(ports: &Ports) -> String {
    match ports {
        Ports::All => "all ports".to_string(),
        Ports::List(list) => list
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

fn selector_text(selector: &Selector) -> String {
    match selector {
        Selector::Interface(iface) => format!("interface {iface}"),
        Selector::Cgroup { nft_path, .. } => format!("cgroup {NFT_CGROUP_ROOT}/{nft_path}"),
    }
}

/// The flags that shape the ruleset, as a command line for its header.
fn command_line(args: &GatewaySetupArgs) -> String {
    let mut line = String::from("latchkey gateway-setup");
    if let Some(iface) = &args.interface {
        let _ = write!(line, " --interface {iface}");
    }
    if let Some(path) = &args.cgroup {
        let _ = write!(line, " --cgroup {path}");
    }
    let _ = write!(line, " --ports {}", ports_arg(&args.ports));
    let _ = write!(
        line,
        " --transparent-port {} --dns-port {}",
        args.transparent_port, args.dns_port
    );
    if let Some(local) = &args.local_ports {
        if !local.0.is_empty() {
            let list: Vec<String> = local.0.iter().map(u16::to_string).collect();
            let _ = write!(line, " --local-ports {}", list.join(","));
        }
    }
    if args.tproxy {
        line.push_str(" --tproxy");
    }
    line
}

fn ports_arg(ports: &Ports) -> String {
    match ports {
        Ports::All => "all".to_string(),
        Ports::List(list) => list
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// Runs `nft -f -` with `script` on its stdin; `Err` carries nft's own message.
fn nft_apply(script: &str) -> Result<(), SetupError> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(SetupError::NoNft)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A write error (nft exited early) shows up as nft's own status and message below.
        let _ = stdin.write_all(script.as_bytes());
    }
    let out = child.wait_with_output().map_err(SetupError::NoNft)?;
    if out.status.success() {
        return Ok(());
    }
    let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
    Err(SetupError::Nft(if message.is_empty() {
        format!("nft exited with {}", out.status)
    } else {
        message
    }))
}

// ---------------------------------------------------------------------------------------------
// Flag values (clap value parsers: their errors name the flag)

/// `--interface`: a Linux interface name (1–15 of `A-Z a-z 0-9 - _ .`), with an optional
/// trailing `*` matching every interface whose name starts with the rest.
pub fn parse_interface(s: &str) -> Result<String, String> {
    let name = s.strip_suffix('*').unwrap_or(s);
    if name.is_empty() {
        return Err("an interface name must not be empty".into());
    }
    if name.len() > IFNAME_MAX {
        return Err(format!(
            "{s:?} is longer than {IFNAME_MAX} bytes, the longest interface name Linux has"
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("{s:?} is not an interface name"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "{s:?}: {c:?} is not allowed in an interface name (letters, digits, '-', '_', '.', \
             and a trailing '*' for a prefix)"
        ));
    }
    Ok(s.to_string())
}

/// `--cgroup`: a cgroup path, relative to the cgroup2 root (`sandbox.slice/agent`, or
/// `/sandbox.slice/agent` as /proc/PID/cgroup shows it), or the whole path under the cgroup2
/// mount (`/sys/fs/cgroup/sandbox.slice/agent`). Checked here for form only.
pub fn parse_cgroup(s: &str) -> Result<String, String> {
    if s.len() > CGROUP_PATH_MAX {
        return Err(format!("the path is longer than {CGROUP_PATH_MAX} bytes"));
    }
    if let Some(c) = s.chars().find(|c| {
        !(c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '.' | '@' | ':' | '+' | '='))
    }) {
        return Err(format!(
            "{s:?}: {c:?} is not allowed in a cgroup path here (letters, digits, and / - _ . @ : \
             + =)"
        ));
    }
    let rel = s.trim_start_matches('/');
    if rel.split('/').any(|c| c == "." || c == "..") {
        return Err(format!(
            "{s:?}: '.' and '..' are not allowed in a cgroup path"
        ));
    }
    if rel.contains("//") || rel.ends_with('/') {
        return Err(format!("{s:?}: a cgroup path has no empty components"));
    }
    Ok(s.to_string())
}

/// `--ports`: `all`, or a comma-separated list of TCP ports (1–65535, not 53: DNS always goes to
/// the resolver).
pub fn parse_ports(s: &str) -> Result<Ports, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(Ports::All);
    }
    let list = port_list(s)?;
    if list.is_empty() {
        return Err("give at least one port, or `all`".into());
    }
    if list.contains(&DNS) {
        return Err(format!(
            "{DNS} is DNS, which always goes to --dns-port; leave it out"
        ));
    }
    Ok(Ports::List(list))
}

/// `--local-ports`: a comma-separated list of TCP ports of latchkey's host (may be empty).
pub fn parse_local_ports(s: &str) -> Result<PortList, String> {
    let list = port_list(s)?;
    if list.contains(&DNS) {
        return Err(format!(
            "{DNS} is DNS, which always goes to --dns-port; leave it out"
        ));
    }
    Ok(PortList(list))
}

fn port_list(s: &str) -> Result<Vec<u16>, String> {
    let mut ports = BTreeSet::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match item.parse::<u16>() {
            Ok(p) if p > 0 => {
                ports.insert(p);
            }
            _ => return Err(format!("{item:?} is not a port (1-65535)")),
        }
    }
    Ok(ports.into_iter().collect())
}

// ---------------------------------------------------------------------------------------------
// cgroups

/// The cgroup2 mount point, from /proc/self/mountinfo (`/sys/fs/cgroup` on unified hosts,
/// `/sys/fs/cgroup/unified` on hybrid ones).
fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    cgroup2_mount_in(&info)
}

/// [`cgroup2_mount`] over a mountinfo text: the first mount whose type (after ` - `) is
/// cgroup2. Mount points escape space, tab, newline and backslash as octal.
pub fn cgroup2_mount_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (fields, tail) = line.split_once(" - ")?;
        if tail.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let point = fields.split_whitespace().nth(4)?;
        Some(PathBuf::from(
            point
                .replace("\\040", " ")
                .replace("\\011", "\t")
                .replace("\\012", "\n")
                .replace("\\134", "\\"),
        ))
    })
}

/// The selector for `given` on a host whose cgroup2 filesystem is mounted at `mount`, and the
/// cgroup's directory. The level is the path's depth below the cgroup2 root; the nft path is the
/// same cgroup seen from `/sys/fs/cgroup`.
pub fn cgroup_selector(given: &str, mount: &Path) -> Result<(Selector, PathBuf), SetupError> {
    let mount_text = mount.display().to_string();
    let rel = match given.strip_prefix(mount_text.trim_end_matches('/')) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
        _ => given,
    }
    .trim_matches('/');
    if rel.is_empty() {
        return Err(SetupError::RootCgroup(given.to_string()));
    }
    let prefix = mount
        .strip_prefix(NFT_CGROUP_ROOT)
        .map_err(|_| SetupError::Cgroup2Elsewhere(mount.to_path_buf()))?;
    let nft_path = Path::new(prefix).join(rel).display().to_string();
    let level = rel.split('/').count();
    Ok((Selector::Cgroup { nft_path, level }, mount.join(rel)))
}

/// Says so when this very process runs inside the sandbox's cgroup: a `latchkey serve` started
/// from the same shell would be captured by its own rules.
fn warn_if_inside(dir: &Path, mount: &Path) {
    let Ok(own) = std::fs::read_to_string("/proc/self/cgroup") else {
        return;
    };
    let Some(own) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
        return;
    };
    let own = mount.join(own.trim().trim_start_matches('/'));
    if own.starts_with(dir) {
        eprintln!(
            "latchkey: warning: this process runs inside {}: run latchkey serve outside that \
             cgroup, or its own traffic is captured too",
            dir.display()
        );
    }
}

#[cfg(test)]
#[path = "gateway_setup_tests.rs"]
mod tests;

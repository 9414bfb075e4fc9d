//! How `latchkey serve`'s flags are shown: each under a heading (listeners, policy, TLS and
//! upstreams, audit, state, limits and timeouts, gateway), `-h` one line for each common flag,
//! `--help` every flag with its full text, default, choices and variable.
//!
//! The flags themselves (names, variables, parsers, full help) stay in [`super::args`]; this
//! table only arranges them. A flag missing from it is shown under "Other" and fails the unit
//! test below, so each new flag gets a heading and a one-line summary.

use clap::{Arg, Command};

/// A heading, in the order `--help` shows them.
const POLICY: &str = "Policy";
const LISTENERS: &str = "Listeners";
const TLS: &str = "TLS and upstreams";
const AUDIT: &str = "Audit";
const STATE: &str = "State and approvals";
const LIMITS: &str = "Limits and timeouts";
const GATEWAY: &str = "Gateway";

/// Every serve flag (clap id): its heading, its one-line `-h` summary, and whether `-h` shows
/// it (the rest appear with `--help`).
const TABLE: &[(&str, &str, &str, bool)] = &[
    (
        "config",
        POLICY,
        "Read serve's flags from a TOML file",
        true,
    ),
    ("policies", POLICY, "Directory of *.toml policy files", true),
    (
        "mode",
        POLICY,
        "`enforce`, or `report`: denials pass, audited",
        true,
    ),
    ("listen", LISTENERS, "Address the proxy listens on", true),
    ("admin", LISTENERS, "Admin API address, or `off`", true),
    (
        "admin_token",
        LISTENERS,
        "Admin API bearer token (env:VAR or file:PATH)",
        true,
    ),
    (
        "console",
        LISTENERS,
        "Serve the operator console at /ui on the admin listener",
        false,
    ),
    (
        "socks",
        LISTENERS,
        "Also accept SOCKS5 on this address",
        false,
    ),
    (
        "ca_dir",
        TLS,
        "Directory of latchkey's CA (created if absent)",
        true,
    ),
    (
        "upstream_ca",
        TLS,
        "Extra PEM bundle trusted for upstream TLS",
        true,
    ),
    (
        "resolve",
        TLS,
        "Pin a host name to an address (HOST=IP)",
        true,
    ),
    (
        "allow_private",
        TLS,
        "Open a private address range (local upstreams)",
        true,
    ),
    (
        "upstream_proxy",
        TLS,
        "Chain through an egress proxy (http:// or socks5://)",
        false,
    ),
    (
        "upstream_proxy_credentials",
        TLS,
        "Upstream proxy USER:SOURCE (env:, file:, exec:)",
        false,
    ),
    (
        "upstream_proxy_bypass",
        TLS,
        "Hosts, .suffixes, IPs, CIDRs dialed directly",
        false,
    ),
    (
        "aws_imds",
        TLS,
        "latchkey's AWS identity may use EC2 instance metadata",
        false,
    ),
    (
        "connect_timeout",
        TLS,
        "Upstream TCP connect timeout",
        false,
    ),
    (
        "response_timeout",
        TLS,
        "Upstream response-headers timeout",
        false,
    ),
    ("audit", AUDIT, "Audit log path (`-` for stdout)", true),
    ("audit_format", AUDIT, "`jsonl` or `ocsf` records", false),
    (
        "audit_sync",
        AUDIT,
        "fdatasync each group of audit records",
        false,
    ),
    (
        "audit_rotate",
        AUDIT,
        "Start a new audit file at a size, an age or both",
        false,
    ),
    (
        "audit_keep",
        AUDIT,
        "Remove closed audit segments older than this",
        false,
    ),
    (
        "audit_key",
        AUDIT,
        "Key that signs audit checkpoints",
        false,
    ),
    (
        "audit_checkpoint_every",
        AUDIT,
        "A signed checkpoint after this many lines",
        false,
    ),
    (
        "audit_checkpoint_interval",
        AUDIT,
        "...or this long after an uncovered line",
        false,
    ),
    (
        "audit_ship",
        AUDIT,
        "Ship closed audit segments to s3://BUCKET/PREFIX",
        false,
    ),
    (
        "audit_ship_endpoint",
        AUDIT,
        "S3 endpoint for --audit-ship",
        false,
    ),
    (
        "audit_ship_region",
        AUDIT,
        "Region --audit-ship signs for",
        false,
    ),
    (
        "otlp",
        AUDIT,
        "Export one OpenTelemetry span per request to this URL",
        false,
    ),
    (
        "session_header",
        AUDIT,
        "Request header naming the sandbox's session",
        false,
    ),
    (
        "state",
        STATE,
        "Approvals state store (sqlite:PATH, redis://...)",
        true,
    ),
    (
        "approval_url",
        STATE,
        "Admin API URL approvers reach (one-click links)",
        false,
    ),
    (
        "session_proxy_url",
        STATE,
        "Proxy URL sandboxes reach, for POST /sessions' env",
        false,
    ),
    (
        "capture_key",
        STATE,
        "Key sealing captured OAuth tokens",
        false,
    ),
    (
        "secrets_startup",
        POLICY,
        "`refuse`, `wait` or `serve` when a stored secret is unreachable",
        false,
    ),
    ("workers", LIMITS, "Runtime worker threads", false),
    (
        "max_connections",
        LIMITS,
        "Most connections open at once",
        false,
    ),
    (
        "max_connections_per_client",
        LIMITS,
        "Most connections per client address",
        false,
    ),
    (
        "max_buffered_bytes",
        LIMITS,
        "Request-body bytes held at once",
        false,
    ),
    (
        "max_buffered_bytes_per_client",
        LIMITS,
        "One client's share of --max-buffered-bytes",
        false,
    ),
    (
        "max_decoded_body",
        LIMITS,
        "Largest decoded size of a scanned response body",
        false,
    ),
    (
        "max_websocket_message",
        LIMITS,
        "Largest WebSocket message relayed",
        false,
    ),
    (
        "header_timeout",
        LIMITS,
        "Time to send a request's headers",
        false,
    ),
    (
        "idle_timeout",
        LIMITS,
        "Close a connection idle this long",
        false,
    ),
    (
        "body_timeout",
        LIMITS,
        "Cut a request body that stalls this long",
        false,
    ),
    (
        "shutdown_timeout",
        LIMITS,
        "On SIGTERM, time for requests in flight",
        false,
    ),
    (
        "transparent",
        GATEWAY,
        "Accept firewall-redirected connections here",
        true,
    ),
    (
        "transparent_tproxy",
        GATEWAY,
        "Also accept nftables tproxy on --transparent",
        false,
    ),
    (
        "https_listen",
        GATEWAY,
        "DNS-routed mode: accept TLS sent to latchkey itself",
        false,
    ),
    (
        "http_listen",
        GATEWAY,
        "DNS-routed mode: accept plain HTTP sent to latchkey itself",
        false,
    ),
    (
        "dns",
        GATEWAY,
        "Run latchkey's allowlisting DNS resolver here",
        true,
    ),
    (
        "dns_answer",
        GATEWAY,
        "`self` or `real` addresses in DNS answers",
        false,
    ),
    (
        "dns_self",
        GATEWAY,
        "latchkey's address in `self` answers",
        false,
    ),
    (
        "dns_rate",
        GATEWAY,
        "DNS queries per second one client may send",
        false,
    ),
];

/// `serve` arranged: headings, one-line summaries for `-h`, full texts for `--help`.
pub fn arrange(serve: Command) -> Command {
    let total = serve.get_arguments().filter(|a| !is_builtin(a)).count();
    let shown = TABLE.iter().filter(|t| t.3).count();
    let ids: Vec<String> = serve
        .get_arguments()
        .filter(|a| !is_builtin(a))
        .map(|a| a.get_id().to_string())
        .collect();
    let mut serve = serve
        .after_help(format!(
            "{shown} of {total} flags shown; `latchkey serve --help` shows all"
        ))
        .after_long_help(
            "Every flag also reads its variable and, with --config FILE, a key of the same name \
             (a flag beats its variable, which beats the file).",
        );
    for id in ids {
        let (heading, short, show) = TABLE
            .iter()
            .find(|t| t.0 == id)
            .map_or(("Other", None, false), |t| (t.1, Some(t.2), t.3));
        serve = serve.mut_arg(id.as_str(), |a| arranged(a, heading, short, show));
    }
    serve
}

fn is_builtin(a: &Arg) -> bool {
    matches!(a.get_id().as_str(), "help" | "version")
}

/// One flag: its full text with the annotations clap would add (default, choices, variable)
/// for `--help`, and only the summary for `-h`, so `-h` stays one line a flag.
fn arranged(a: Arg, heading: &'static str, short: Option<&'static str>, show: bool) -> Arg {
    let full = a
        .get_long_help()
        .or_else(|| a.get_help())
        .map(ToString::to_string)
        .unwrap_or_default();
    let mut notes = Vec::new();
    let defaults: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|d| d.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() && !a.is_hide_default_value_set() {
        notes.push(format!("[default: {}]", defaults.join(",")));
    }
    let choices: Vec<String> = a
        .get_possible_values()
        .iter()
        .filter(|p| !p.is_hide_set())
        .map(|p| p.get_name().to_string())
        .collect();
    if !choices.is_empty() && !matches!(a.get_action(), clap::ArgAction::SetTrue) {
        notes.push(format!("[possible values: {}]", choices.join(", ")));
    }
    if let Some(env) = a.get_env() {
        notes.push(format!("[env: {}=]", env.to_string_lossy()));
    }
    let long = if notes.is_empty() {
        full.clone()
    } else {
        format!("{full}\n{}", notes.join(" "))
    };
    let short = short.map_or(full, str::to_string);
    let takes_values = a.get_action().takes_values();
    let a = a
        .help_heading(heading)
        .help(short)
        .long_help(long)
        .hide_short_help(!show)
        .hide_env(true);
    if takes_values {
        a.hide_default_value(true).hide_possible_values(true)
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::TABLE;

    #[test]
    fn every_serve_flag_has_a_heading_and_a_summary_and_nothing_else_is_listed() {
        let cli = super::super::args::Cli::command();
        let serve = cli.find_subcommand("serve").expect("serve");
        let ids: Vec<String> = serve
            .get_arguments()
            .filter(|a| !super::is_builtin(a))
            .map(|a| a.get_id().to_string())
            .collect();
        for id in &ids {
            assert!(
                TABLE.iter().any(|t| t.0 == id),
                "serve flag {id} has no heading in serve_help::TABLE"
            );
        }
        for t in TABLE {
            assert!(ids.iter().any(|i| i == t.0), "{} is not a serve flag", t.0);
            assert!(t.2.len() <= 64 && !t.2.ends_with('.'), "{:?}", t.2);
        }
    }
}

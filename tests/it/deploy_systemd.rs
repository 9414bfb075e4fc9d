//! The systemd units of `deploy/systemd/` (VMs and bare hosts), checked with systemd's own
//! tools — PID 1 here is not systemd, so nothing is started, but `systemd-analyze` reads the
//! units exactly as systemd would:
//!
//! - `systemd-analyze verify` passes every unit, alone and with each drop-in, with no output at
//!   all (it exits 0 on an unknown directive, only printing a warning, so any line fails the
//!   test); a copy with an unknown directive, or with a missing binary, is rejected, so the
//!   check can fail;
//! - `systemd-analyze security --offline=true` scores each unit (and the serve unit with each
//!   drop-in) at most the exposure measured when they were written: a weakened unit fails;
//! - the capabilities are the ones each mode needs: none for `serve` (explicit proxy, gateway
//!   capture on ports ≥ 1024), `CAP_NET_BIND_SERVICE` alone for DNS-routed mode,
//!   `CAP_NET_ADMIN` alone for `gateway-setup`, as a dynamic (non-root) user;
//! - every flag and `LATCHKEY_…` variable the units and their environment files use is one the
//!   built binary has (`latchkey serve --help`, `latchkey gateway-setup --help`).
//!
//! [`vm_bridge`] runs the VM-per-sandbox recipe for real in network namespaces.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::deploy_manifests::{check_serve_flags, help_of};
use crate::support::latchkey::{wait_with_timeout, CliOutput, BIN};
use crate::support::toolchain::tool;

mod vm_bridge;

/// Where the units expect the binary; the copies point at the one just built.
const INSTALLED_BIN: &str = "/usr/local/bin/latchkey";

const SERVE_UNIT: &str = "latchkey.service";
const GATEWAY_UNIT: &str = "latchkey-gateway.service";
/// Drop-ins for `latchkey.service`.
const DROP_INS: &[&str] = &["gateway.conf", "dns-routed.conf"];

/// The highest `systemd-analyze security` exposure each configuration may score: what was
/// measured with systemd 252 (Debian bookworm) when the units were written, also stated in
/// docs/src/deployment-hosts.md. (unit, drop-in, score).
const EXPOSURE: &[(&str, Option<&str>, f64)] = &[
    (SERVE_UNIT, None, 1.1),
    (SERVE_UNIT, Some("gateway.conf"), 1.1),
    (SERVE_UNIT, Some("dns-routed.conf"), 1.4),
    (GATEWAY_UNIT, None, 1.1),
];

pub(crate) fn systemd_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/systemd"))
}

pub(crate) fn read(file: &str) -> String {
    let path = systemd_dir().join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// A unit directory holding copies of both units (ExecStart on the built binary) and `drop_in`
/// in `latchkey.service.d/`; `edit` may change the serve unit's text.
fn unit_tree(drop_in: Option<&str>, edit: impl Fn(String) -> String) -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix("latchkey-systemd")
        .tempdir()
        .expect("temp unit dir");
    for unit in [SERVE_UNIT, GATEWAY_UNIT] {
        let mut text = read(unit).replace(INSTALLED_BIN, BIN);
        if unit == SERVE_UNIT {
            text = edit(text);
        }
        std::fs::write(dir.path().join(unit), text).expect("write unit copy");
    }
    if let Some(conf) = drop_in {
        let d = dir.path().join(format!("{SERVE_UNIT}.d"));
        std::fs::create_dir(&d).expect("drop-in dir");
        std::fs::write(d.join(conf), read(conf)).expect("write drop-in");
    }
    dir
}

/// `systemd-analyze ARGS` with `dir` first in the unit search path (so drop-ins in it load).
fn analyze(dir: &Path, args: &[&str]) -> CliOutput {
    let mut cmd = Command::new(tool("systemd-analyze"));
    cmd.args(args)
        .current_dir(dir)
        .env("SYSTEMD_UNIT_PATH", format!("{}:", dir.display()))
        .env("SYSTEMD_PAGER", "cat")
        .env("SYSTEMD_COLORS", "0")
        .env("SYSTEMD_LOG_COLOR", "0");
    wait_with_timeout(&mut cmd, Duration::from_secs(60))
}

/// `systemd-analyze verify` of `units` in `dir`: every problem, empty when it exited 0 and
/// printed nothing at all (an unknown key is only a warning: exit 0 with a line on stderr).
fn verify(dir: &Path, units: &[&str]) -> Vec<String> {
    let paths: Vec<String> = units
        .iter()
        .map(|u| dir.join(u).display().to_string())
        .collect();
    let mut args = vec!["verify"];
    args.extend(paths.iter().map(String::as_str));
    let out = analyze(dir, &args);
    let mut problems: Vec<String> = out
        .stdout
        .lines()
        .chain(out.stderr.lines())
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    if out.code() != Some(0) {
        problems.push(format!("systemd-analyze verify exited {:?}", out.code()));
    }
    problems
}

#[test]
fn the_units_pass_systemd_analyze_verify_alone_and_with_each_drop_in() {
    for drop_in in std::iter::once(None).chain(DROP_INS.iter().map(|d| Some(*d))) {
        let tree = unit_tree(drop_in, |t| t);
        let problems = verify(tree.path(), &[SERVE_UNIT, GATEWAY_UNIT]);
        assert!(
            problems.is_empty(),
            "systemd-analyze verify, drop-in {drop_in:?}:\n{}",
            problems.join("\n")
        );
    }
}

#[test]
fn verify_rejects_an_unknown_directive_and_a_missing_binary() {
    // A typo systemd would ignore at run time (exit 0, a warning): the check fails on it.
    let typo = unit_tree(None, |t| {
        t.replace("ProtectHome=yes", "ProtectHome=yes\nProtectHomes=yes")
    });
    let problems = verify(typo.path(), &[SERVE_UNIT]);
    assert!(
        problems.iter().any(|l| l.contains("Unknown key")),
        "{problems:#?}"
    );
    // An unknown directive in a drop-in too.
    let tree = unit_tree(Some("gateway.conf"), |t| t);
    let conf = tree.path().join(format!("{SERVE_UNIT}.d/gateway.conf"));
    let text = std::fs::read_to_string(&conf).expect("drop-in copy");
    std::fs::write(&conf, format!("{text}AmbientCapability=CAP_NET_ADMIN\n")).expect("edit");
    let problems = verify(tree.path(), &[SERVE_UNIT]);
    assert!(
        problems.iter().any(|l| l.contains("Unknown key")),
        "{problems:#?}"
    );
    // ExecStart on a binary that is not there: verify exits non-zero.
    let missing = unit_tree(None, |t| t.replace(BIN, "/nonexistent/latchkey"));
    let problems = verify(missing.path(), &[SERVE_UNIT]);
    assert!(
        problems.iter().any(|l| l.contains("exited Some(1)")),
        "{problems:#?}"
    );
}

/// The overall exposure `systemd-analyze security --offline=true` gives `unit` in `dir`.
fn exposure(dir: &Path, unit: &str) -> (f64, String) {
    let path = dir.join(unit).display().to_string();
    let out = analyze(dir, &["security", "--offline=true", "--no-pager", &path]);
    assert_eq!(
        out.code(),
        Some(0),
        "systemd-analyze security --offline=true {unit} (needs systemd >= 252): {out:#?}"
    );
    let needle = format!("Overall exposure level for {unit}: ");
    let score = out
        .stdout
        .lines()
        .find_map(|l| l.split_once(&needle))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no exposure score for {unit}:\n{}", out.stdout));
    (score, format!("{}\n{}", out.stdout, out.stderr))
}

#[test]
fn each_unit_scores_at_most_its_measured_exposure() {
    let mut problems = Vec::new();
    for (unit, drop_in, most) in EXPOSURE {
        let tree = unit_tree(*drop_in, |t| t);
        let (score, report) = exposure(tree.path(), unit);
        if score > *most {
            problems.push(format!(
                "{unit} with drop-in {drop_in:?}: exposure {score}, at most {most}:\n{report}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
    // The score moves: the serve unit without its sandboxing scores worse.
    let weak = unit_tree(None, |t| {
        t.lines()
            .filter(|l| {
                !l.starts_with("Protect") && !l.starts_with("Private") && !l.starts_with("System")
            })
            .collect::<Vec<_>>()
            .join("\n")
    });
    let (score, _) = exposure(weak.path(), SERVE_UNIT);
    assert!(score > 3.0, "the unsandboxed copy scored {score}");
}

/// `KEY=VALUE` lines of a unit file or drop-in (comments and section headers left out), with
/// `Environment=` values split into `(NAME, VALUE)`.
fn directives(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

fn values(text: &str, key: &str) -> Vec<String> {
    directives(text)
        .into_iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v)
        .collect()
}

#[test]
fn each_unit_holds_only_the_capabilities_its_mode_needs() {
    let serve = read(SERVE_UNIT);
    assert_eq!(values(&serve, "CapabilityBoundingSet"), [""]);
    assert_eq!(values(&serve, "AmbientCapabilities"), [""]);
    assert_eq!(values(&serve, "DynamicUser"), ["yes"]);
    assert_eq!(
        values(&serve, "RestrictAddressFamilies"),
        ["AF_INET AF_INET6 AF_UNIX"]
    );
    // gateway.conf adds listeners, not privileges.
    let gateway_conf = read("gateway.conf");
    for key in [
        "CapabilityBoundingSet",
        "AmbientCapabilities",
        "PrivateUsers",
    ] {
        assert!(values(&gateway_conf, key).is_empty(), "gateway.conf: {key}");
    }
    let routed = read("dns-routed.conf");
    assert_eq!(
        values(&routed, "CapabilityBoundingSet"),
        ["", "CAP_NET_BIND_SERVICE"]
    );
    assert_eq!(
        values(&routed, "AmbientCapabilities"),
        ["CAP_NET_BIND_SERVICE"]
    );
    let gateway = read(GATEWAY_UNIT);
    assert_eq!(values(&gateway, "CapabilityBoundingSet"), ["CAP_NET_ADMIN"]);
    assert_eq!(values(&gateway, "AmbientCapabilities"), ["CAP_NET_ADMIN"]);
    assert_eq!(values(&gateway, "DynamicUser"), ["yes"]);
    assert_eq!(
        values(&gateway, "RestrictAddressFamilies"),
        ["AF_NETLINK AF_UNIX"]
    );
    // The persistent state is where the unit's variables put it.
    for (var, dir) in [
        ("LATCHKEY_CA_DIR=/var/lib/latchkey/", "StateDirectory"),
        ("LATCHKEY_STATE=sqlite:/var/lib/latchkey/", "StateDirectory"),
        ("LATCHKEY_AUDIT=/var/log/latchkey/", "LogsDirectory"),
        ("LATCHKEY_POLICIES=/etc/latchkey/", "ConfigurationDirectory"),
    ] {
        assert!(
            values(&serve, "Environment")
                .iter()
                .any(|v| v.starts_with(var)),
            "{var}"
        );
        assert_eq!(values(&serve, dir), ["latchkey"], "{dir}");
    }
}

/// Every `LATCHKEY_…` name in `text` (not the family, `LATCHKEY_*`).
fn variables(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("LATCHKEY_") {
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !text[i + name.len()..].starts_with('*') {
            out.insert(name);
        }
    }
    out
}

#[test]
fn every_flag_and_variable_the_units_use_is_latchkeys() {
    let (serve_flags, serve_vars) = help_of("serve");
    let (setup_flags, setup_vars) = help_of("gateway-setup");
    assert!(setup_flags.contains("--apply"), "{setup_flags:?}");
    let mut problems = Vec::new();
    let files: &[(&str, &BTreeSet<String>)] = &[
        (SERVE_UNIT, &serve_vars),
        ("gateway.conf", &serve_vars),
        ("dns-routed.conf", &serve_vars),
        ("latchkey.env", &serve_vars),
        (GATEWAY_UNIT, &setup_vars),
        ("gateway.env", &setup_vars),
    ];
    let mut seen = 0;
    for (file, known) in files {
        let text = read(file);
        // What the file sets must be its command's; a comment may name the other's too.
        let (comments, settings): (Vec<&str>, Vec<&str>) =
            text.lines().partition(|l| l.trim_start().starts_with('#'));
        for var in variables(&settings.join("\n")) {
            seen += 1;
            if !known.contains(&var) {
                problems.push(format!("{file}: latchkey has no variable {var}"));
            }
        }
        for var in variables(&comments.join("\n")) {
            seen += 1;
            if !serve_vars.contains(&var) && !setup_vars.contains(&var) {
                problems.push(format!("{file}: latchkey has no variable {var}"));
            }
        }
        for (key, value) in directives(&text) {
            if !key.starts_with("Exec") || !value.contains("latchkey") {
                continue;
            }
            let words: Vec<String> = value.split_whitespace().map(str::to_string).collect();
            assert_eq!(words[0], INSTALLED_BIN, "{file}: {key}={value}");
            match words.get(1).map(String::as_str) {
                Some("serve") => {
                    problems.extend(check_serve_flags(file, &words[2..], &serve_flags));
                }
                Some("gateway-setup") => {
                    for flag in words[2..].iter().filter(|w| w.starts_with("--")) {
                        if !setup_flags.contains(flag.split('=').next().unwrap_or_default()) {
                            problems.push(format!("{file}: gateway-setup has no flag {flag}"));
                        }
                    }
                }
                other => problems.push(format!("{file}: {key} runs latchkey {other:?}")),
            }
        }
    }
    assert!(seen > 10, "only {seen} variables found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

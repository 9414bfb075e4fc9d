//! The container and Kubernetes deployments, checked for structure (Docker and a cluster cannot
//! run here): `docker/compose.yaml`, `docker/Dockerfile` and the Kustomize overlays of
//! `deploy/kubernetes/` (rendered) parse, and say what a gateway needs them to say —
//!
//! - compose: the sandbox is only on an `internal: true` network, its resolver is latchkey's
//!   address there, the trust it mounts is read-only and holds no CA key, its proxy and trust
//!   variables are exactly what the built binary's `latchkey env` renders for that address;
//!   latchkey listens on that address only, its admin API stays on loopback;
//! - Dockerfile: built with `cargo build --release --locked`, run as a non-root user, a
//!   HEALTHCHECK on `/readyz` at the admin address the image configures, state in volumes;
//! - Kubernetes: in [`kubernetes`] (rendered, schema-validated, NetworkPolicies evaluated);
//! - every `latchkey serve` flag and `LATCHKEY_…` variable used is one the binary has, and every
//!   probe path answers 200 on a real `latchkey serve`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

use crate::support::admin::admin_get;
use crate::support::latchkey::{wait_with_timeout, BIN};
use crate::support::{latchkey, run_cli};

mod kubernetes;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// Every YAML document of a file.
fn documents(rel: &str) -> Vec<Value> {
    let text = read(rel);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{rel}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => String::new(),
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| s.iter().map(text).collect())
        .unwrap_or_default()
}

fn mapping(v: &Value) -> Mapping {
    v.as_mapping().cloned().unwrap_or_default()
}

/// Whether every `key: value` of `selector` is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let selector = mapping(selector);
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// A flag's value in an argument list (`--flag=value` or `--flag value`).
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    args.iter().enumerate().find_map(|(i, a)| {
        if let Some(v) = a.strip_prefix(&format!("{flag}=")) {
            Some(v.to_string())
        } else if a == flag {
            args.get(i + 1).cloned()
        } else {
            None
        }
    })
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{addr:?} has no port"))
}

fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(h, _)| h)
}

// ---------------------------------------------------------------------------------------------
// The binary's own flags and variables

/// Long flags and `LATCHKEY_…` variables of `latchkey COMMAND --help`.
pub(crate) fn help_of(command: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut cmd = Command::new(BIN);
    cmd.args([command, "--help"])
        .env_clear()
        .env("COLUMNS", "200");
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(20));
    assert_eq!(
        out.code(),
        Some(0),
        "latchkey {command} --help: {}",
        out.stderr
    );
    let mut flags = BTreeSet::new();
    let mut vars = BTreeSet::new();
    for line in out.stdout.lines() {
        let line = line.trim_start();
        let line = line
            .strip_prefix('-')
            .filter(|rest| rest.chars().nth(1) == Some(','))
            .map_or(line, |rest| rest[2..].trim_start());
        if let Some(rest) = line.strip_prefix("--") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            flags.insert(format!("--{name}"));
        }
        for part in line.split("[env: ").skip(1) {
            vars.insert(
                part.split(['=', ']'])
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            );
        }
    }
    assert!(
        flags.contains("--listen") || command != "serve",
        "{flags:?}"
    );
    (flags, vars)
}

/// Checks that each flag `where` uses is a real `serve` flag; returns the problems.
pub(crate) fn check_serve_flags(
    where_: &str,
    args: &[String],
    known: &BTreeSet<String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for arg in args.iter().filter(|a| a.starts_with("--")) {
        let flag = arg.split('=').next().unwrap_or_default();
        if known.contains(flag) {
            continue;
        }
        problems.push(format!("{where_}: `latchkey serve` has no flag {flag}"));
    }
    problems
}

/// What `latchkey env --format json --proxy PROXY` renders, with its CA directory written as
/// `ca_dir` (the path the sandbox mounts latchkey's trust at).
fn env_rendered(proxy: &str, ca_dir: &str) -> BTreeMap<String, String> {
    let scratch = tempfile::tempdir().expect("temp CA dir");
    let real = scratch.path().canonicalize().expect("canonical temp dir");
    let init = run_cli(["ca", "init", "--ca-dir", &real.display().to_string()]);
    assert_eq!(init.code(), Some(0), "latchkey ca init: {}", init.stderr);
    let out = run_cli([
        "env",
        "--format",
        "json",
        "--proxy",
        proxy,
        "--ca-dir",
        &real.display().to_string(),
    ]);
    assert_eq!(out.code(), Some(0), "latchkey env: {}", out.stderr);
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("env's JSON");
    json.as_object()
        .expect("env renders one object")
        .iter()
        .map(|(k, v)| {
            let v = v.as_str().unwrap_or_default();
            (k.clone(), v.replace(&real.display().to_string(), ca_dir))
        })
        .collect()
}

/// Compares a sandbox's environment with what `latchkey env` renders; returns the problems.
fn check_sandbox_env(
    where_: &str,
    env: &BTreeMap<String, String>,
    rendered: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, value) in rendered {
        match env.get(name) {
            Some(v) if v == value => {}
            Some(v) => problems.push(format!(
                "{where_}: {name}={v:?}, latchkey env says {value:?}"
            )),
            None => problems.push(format!(
                "{where_}: {name} missing (latchkey env sets {value:?})"
            )),
        }
    }
    for name in env.keys().filter(|n| !rendered.contains_key(*n)) {
        problems.push(format!(
            "{where_}: {name} is not something latchkey env renders"
        ));
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// docker/

/// The Dockerfile's instructions (continuation lines joined, comments dropped), by stage.
fn dockerfile_stages() -> Vec<Vec<(String, String)>> {
    let mut stages: Vec<Vec<(String, String)>> = Vec::new();
    let mut pending = String::new();
    for line in read("docker/Dockerfile").lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(trimmed);
        let whole = std::mem::take(&mut pending);
        let (op, rest) = whole.split_once(' ').unwrap_or((&whole, ""));
        let op = op.to_ascii_uppercase();
        if op == "FROM" {
            stages.push(Vec::new());
        }
        if let Some(stage) = stages.last_mut() {
            stage.push((op, rest.trim().to_string()));
        }
    }
    stages
}

fn instruction<'a>(stage: &'a [(String, String)], op: &str) -> Vec<&'a str> {
    stage
        .iter()
        .filter(|(o, _)| o == op)
        .map(|(_, r)| r.as_str())
        .collect()
}

/// `ENV A=b C=d` instructions of a stage, as a map.
fn env_of(stage: &[(String, String)]) -> BTreeMap<String, String> {
    instruction(stage, "ENV")
        .iter()
        .flat_map(|rest| rest.split_whitespace())
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
        .collect()
}

/// A JSON-form instruction (`["a", "b"]`) as its words.
fn json_words(rest: &str) -> Vec<String> {
    serde_json::from_str(rest).unwrap_or_else(|e| panic!("not JSON form: {rest}: {e}"))
}

/// The Dockerfile's `ARG NAME=default` lines before its first `FROM` (what `FROM ${NAME}`
/// takes when no --build-arg is given).
fn global_args() -> BTreeMap<String, String> {
    read("docker/Dockerfile")
        .lines()
        .map(str::trim)
        .take_while(|l| !l.to_ascii_uppercase().starts_with("FROM "))
        .filter_map(|l| l.strip_prefix("ARG "))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
        .collect()
}

/// The stage named `name` (`FROM ... AS name`).
fn stage<'a>(stages: &'a [Vec<(String, String)>], name: &str) -> &'a [(String, String)] {
    stages
        .iter()
        .find(|s| {
            instruction(s, "FROM")
                .first()
                .is_some_and(|f| f.ends_with(&format!(" AS {name}")))
        })
        .unwrap_or_else(|| panic!("no stage {name}: {stages:?}"))
}

#[test]
fn the_dockerfile_builds_locked_runs_unprivileged_and_checks_readyz() {
    let stages = dockerfile_stages();
    let args = global_args();
    let (build, runtime) = (stage(&stages, "compiled"), stage(&stages, "runtime"));
    assert_eq!(instruction(build, "FROM")[0], "${BUILDER} AS compiled");
    assert!(
        args["BUILDER"].starts_with("rust:") && args["BUILDER"].ends_with("-slim-bookworm"),
        "the default builder is Rust on bookworm (the runtime's glibc): {args:?}"
    );
    assert_eq!(
        args["BINARY"], "compiled",
        "users build the binary in the image"
    );
    // The image is built by the very command CI runs, so CI proves the image's build works.
    let command = "cargo build --release --locked --bin latchkey";
    assert!(
        instruction(build, "RUN")
            .iter()
            .any(|r| r.contains(command)),
        "the build stage runs `{command}`"
    );
    let ci = read(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == command),
        ".ci/run runs the Dockerfile's build command `{command}`"
    );
    assert_eq!(
        env_of(build)
            .get("CARGO_PROFILE_RELEASE_STRIP")
            .map(String::as_str),
        Some("symbols"),
        "the image's binary is stripped"
    );
    assert_eq!(instruction(runtime, "FROM")[0], "${RUNTIME} AS runtime");
    assert!(
        args["RUNTIME"].starts_with("gcr.io/distroless/cc-debian12"),
        "the runtime is distroless (glibc, libgcc, CA roots; no shell): {args:?}"
    );
    assert!(
        instruction(runtime, "RUN").is_empty(),
        "the runtime stage runs nothing: it has no shell to run it with"
    );

    let user = instruction(runtime, "USER");
    let uid = user
        .last()
        .and_then(|u| u.split(':').next())
        .and_then(|u| u.parse::<u32>().ok())
        .unwrap_or(0);
    assert!(uid > 0, "runs as a numeric non-root user: {user:?}");

    let env = env_of(runtime);
    let (_, mut known_vars) = help_of("serve");
    // `latchkey health` (the HEALTHCHECK) reads the admin API's URL.
    known_vars.extend(help_of("health").1);
    for name in env.keys().filter(|k| k.starts_with("LATCHKEY_")) {
        assert!(
            known_vars.contains(name),
            "ENV {name}: neither serve nor health reads such a variable"
        );
    }
    let volumes: Vec<String> = instruction(runtime, "VOLUME")
        .iter()
        .flat_map(|v| json_words(v))
        .collect();
    let audit_dir = env["LATCHKEY_AUDIT"]
        .rsplit_once('/')
        .map(|(d, _)| d.to_string());
    for dir in [
        Some(env["LATCHKEY_CA_DIR"].clone()),
        Some(env["LATCHKEY_POLICIES"].clone()),
        audit_dir,
    ] {
        let dir = dir.unwrap_or_default();
        assert!(volumes.contains(&dir), "{dir} is not a VOLUME: {volumes:?}");
    }

    // The health check is latchkey's own (no curl, no shell), asking the admin API the image
    // configures (on loopback: never on the container's networks).
    let admin = &env["LATCHKEY_ADMIN"];
    assert!(admin.starts_with("127.0.0.1:"), "LATCHKEY_ADMIN={admin}");
    assert_eq!(
        env.get("LATCHKEY_ADMIN_URL"),
        Some(&format!("http://{admin}")),
        "`latchkey health` asks the admin API serve listens on"
    );
    let health = instruction(runtime, "HEALTHCHECK");
    let check = health.first().copied().unwrap_or_default();
    let (_, command) = check.split_once("CMD ").unwrap_or_default();
    let words = json_words(command);
    assert_eq!(
        words.get(..2),
        Some(&["/usr/local/bin/latchkey".to_string(), "health".to_string()][..]),
        "HEALTHCHECK {check}"
    );
    let entry = json_words(instruction(runtime, "ENTRYPOINT")[0]);
    assert!(
        entry.first().is_some_and(|p| p.ends_with("/latchkey"))
            && entry.get(1).map(String::as_str) == Some("serve"),
        "{entry:?}"
    );
}

#[test]
fn compose_puts_the_sandbox_behind_latchkey_on_an_internal_network() {
    let compose = &documents("docker/compose.yaml")[0];
    let services = &compose["services"];
    let (sandbox, lk) = (&services["sandbox"], &services["latchkey"]);
    let networks = &compose["networks"];

    // The sandbox: one network, internal.
    let nets: Vec<String> = match &sandbox["networks"] {
        Value::Sequence(s) => s.iter().map(text).collect(),
        Value::Mapping(m) => m.keys().map(text).collect(),
        other => panic!("sandbox networks: {other:?}"),
    };
    assert_eq!(
        nets.len(),
        1,
        "the sandbox is on exactly one network: {nets:?}"
    );
    let net = &nets[0];
    assert_eq!(
        networks[net.as_str()]["internal"],
        Value::Bool(true),
        "{net} is internal"
    );
    assert!(sandbox.get("network_mode").is_none() && sandbox.get("ports").is_none());

    // latchkey: on that network at a fixed address, and on one that is not internal.
    let address = text(&lk["networks"][net.as_str()]["ipv4_address"]);
    assert!(!address.is_empty(), "latchkey has a fixed address on {net}");
    let egress: Vec<String> = mapping(&lk["networks"])
        .keys()
        .map(text)
        .filter(|n| n != net)
        .collect();
    assert!(
        egress
            .iter()
            .any(|n| networks[n.as_str()]["internal"] != Value::Bool(true)),
        "latchkey has a way out: {egress:?}"
    );

    // The sandbox asks latchkey for names.
    assert_eq!(strings(&sandbox["dns"]), vec![address.clone()]);

    // latchkey listens on that address only, admin on loopback (the image's default).
    let args = strings(&lk["command"]);
    let (serve_flags, _) = help_of("serve");
    let mut problems = check_serve_flags("compose latchkey", &args, &serve_flags);
    for flag in [
        "--listen",
        "--dns",
        "--https-listen",
        "--http-listen",
        "--socks",
    ] {
        match flag_value(&args, flag) {
            Some(v) if host_of(&v) == address => {}
            other => problems.push(format!("{flag} is {other:?}, not on {address}")),
        }
    }
    assert_eq!(flag_value(&args, "--dns-answer").as_deref(), Some("self"));
    assert_eq!(flag_value(&args, "--dns-self"), Some(address.clone()));
    assert_eq!(
        flag_value(&args, "--admin"),
        None,
        "the admin API stays on loopback"
    );
    let dns = flag_value(&args, "--dns").unwrap_or_default();
    assert_eq!(port_of(&dns), 53, "resolv.conf takes no port");
    for (flag, port) in [("--https-listen", 443), ("--http-listen", 80)] {
        let v = flag_value(&args, flag).unwrap_or_default();
        assert_eq!(port_of(&v), port, "{flag}");
    }

    // Trust: certificates only, read-only, where the variables say; never the CA's volume.
    let lk_volumes = strings(&lk["volumes"]);
    let ca_dir = "/var/lib/latchkey/ca";
    let ca_volume = lk_volumes
        .iter()
        .find_map(|v| v.strip_suffix(&format!(":{ca_dir}")))
        .unwrap_or_else(|| panic!("latchkey mounts no volume at {ca_dir}: {lk_volumes:?}"))
        .to_string();
    let sandbox_volumes = strings(&sandbox["volumes"]);
    assert!(
        sandbox_volumes
            .iter()
            .all(|v| v.split(':').next() != Some(ca_volume.as_str())),
        "the sandbox mounts the CA's own volume (with its key): {sandbox_volumes:?}"
    );
    let trust = sandbox_volumes
        .iter()
        .find(|v| v.split(':').nth(1) == Some(ca_dir))
        .unwrap_or_else(|| panic!("the sandbox mounts no trust at {ca_dir}: {sandbox_volumes:?}"));
    assert!(trust.ends_with(":ro"), "{trust} is read-only");
    let trust_volume = trust.split(':').next().unwrap_or_default();
    let copier = &services["trust"];
    let entry = strings(&copier["entrypoint"]);
    let trust_dir = strings(&copier["volumes"])
        .iter()
        .find_map(|v| {
            v.strip_prefix(&format!("{trust_volume}:"))
                .map(|d| d.trim_end_matches(":ro").to_string())
        })
        .unwrap_or_else(|| panic!("the trust service does not mount {trust_volume}"));
    assert_eq!(
        entry.get(1..3),
        Some(&["ca".to_string(), "init".to_string()][..]),
        "the trust service runs `latchkey ca init`: {entry:?}"
    );
    assert!(
        entry.contains(&format!("--export={trust_dir}")),
        "it exports the public half (never the key) into {trust_dir}: {entry:?}"
    );

    // The sandbox's environment is what `latchkey env` renders for this proxy and path.
    let proxy = format!(
        "http://{address}:{}",
        port_of(&flag_value(&args, "--listen").unwrap_or_default())
    );
    let env: BTreeMap<String, String> = mapping(&sandbox["environment"])
        .iter()
        .map(|(k, v)| (text(k), text(v)))
        .collect();
    assert_eq!(env.get("HTTPS_PROXY"), Some(&proxy));
    problems.extend(check_sandbox_env(
        "compose sandbox",
        &env,
        &env_rendered(&proxy, ca_dir),
    ));
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // Order: the trust exists before latchkey, latchkey is healthy before the sandbox.
    assert_eq!(
        text(&lk["depends_on"]["trust"]["condition"]),
        "service_completed_successfully"
    );
    assert_eq!(
        text(&sandbox["depends_on"]["latchkey"]["condition"]),
        "service_healthy"
    );
}

#[test]
fn every_probe_path_the_deployments_use_answers_on_a_real_latchkey() {
    let mut paths = BTreeSet::new();
    for stage in dockerfile_stages() {
        for check in instruction(&stage, "HEALTHCHECK") {
            let (_, command) = check.split_once("CMD ").unwrap_or_default();
            let words = json_words(command);
            if words.get(1).map(String::as_str) == Some("health") {
                let live = words.iter().any(|w| w == "--live");
                paths.insert(if live { "/healthz" } else { "/readyz" }.to_string());
            }
        }
    }
    for (_, doc) in kubernetes::manifests() {
        for container in doc["spec"]["template"]["spec"]["containers"]
            .as_sequence()
            .cloned()
            .unwrap_or_default()
        {
            for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
                let path = text(&container[probe]["httpGet"]["path"]);
                if !path.is_empty() {
                    paths.insert(path);
                }
            }
        }
    }
    assert!(paths.contains("/readyz") && paths.len() >= 2, "{paths:?}");
    let lk = latchkey()
        .policy(
            "main.toml",
            "[[rules]]\nname = \"a\"\nhosts = [\"a.test\"]\n",
        )
        .run();
    for path in &paths {
        let resp = admin_get(&lk, path);
        assert_eq!(resp.status, 200, "GET {path} on the admin API: {resp:#?}");
    }
}

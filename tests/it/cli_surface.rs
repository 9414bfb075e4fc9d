//! The command line as a newcomer meets it: `serve -h` short and grouped, `--help` complete,
//! `serve --config FILE` with flags and variables over the file, errors that name the flag as
//! it was given, and completions and a man page from the same definitions.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::latchkey::{wait_with_timeout, BIN, SCRUBBED_ENV};
use crate::support::{latchkey, run_cli, CliOutput};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `latchkey ARGS` at 80 columns with no `LATCHKEY_*` variable, plus `env`.
fn cli(args: &[&str], env: &[(&str, &str)]) -> CliOutput {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_clear().env("COLUMNS", "80");
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    wait_with_timeout(&mut cmd, Duration::from_secs(20))
}

#[test]
fn serve_short_help_is_grouped_one_line_a_flag_and_under_40_lines() {
    let short = cli(&["serve", "-h"], &[]);
    assert_eq!(short.code(), Some(0), "{short:#?}");
    let lines: Vec<&str> = short.stdout.lines().collect();
    assert!(
        lines.len() < 40,
        "serve -h is {} lines:\n{}",
        lines.len(),
        short.stdout
    );
    for heading in [
        "Policy:",
        "Listeners:",
        "TLS and upstreams:",
        "Audit:",
        "Gateway:",
    ] {
        assert!(
            lines.contains(&heading),
            "no {heading} in:\n{}",
            short.stdout
        );
    }
    // One line a flag: every line after a flag's is another flag, a heading or blank.
    for pair in lines.windows(2) {
        if pair[0].trim_start().starts_with("--") {
            let next = pair[1].trim_start();
            assert!(
                next.is_empty() || next.starts_with('-'),
                "a flag's help runs onto a second line: {pair:?}"
            );
        }
    }
    let last = lines.last().copied().unwrap_or_default();
    assert!(last.contains("`latchkey serve --help` shows all"), "{last}");

    let long = cli(&["serve", "--help"], &[]);
    assert_eq!(long.code(), Some(0), "{long:#?}");
    let count = |text: &str| text.lines().filter(|l| l.starts_with("      --")).count();
    let (shown, all) = (count(&short.stdout), count(&long.stdout));
    assert!(shown < all && all >= 45, "-h shows {shown}, --help {all}");
    assert!(
        last.starts_with(&format!("{shown} of {all} flags shown")),
        "{last}"
    );
    for flag in [
        "--max-websocket-message",
        "--audit-ship-region",
        "--dns-rate",
        "--config",
    ] {
        assert!(long.stdout.contains(flag), "--help lacks {flag}");
    }
    assert!(
        long.stdout
            .contains("[default: 127.0.0.1:3128] [env: LATCHKEY_LISTEN=]"),
        "{}",
        long.stdout
    );
}

#[test]
fn help_texts_carry_no_notes_for_maintainers() {
    for args in [
        &["check", "--help"][..],
        &["explain", "--help"],
        &["learn", "--help"],
        &["audit", "query", "--help"],
        &["audit", "verify", "--help"],
        &["approvals", "list", "--help"],
    ] {
        let out = cli(args, &[]);
        assert_eq!(out.code(), Some(0), "{out:#?}");
        for note in [
            "Its variable",
            "README",
            "(as check's",
            "Read from no variable",
        ] {
            assert!(
                !out.stdout.contains(note),
                "{args:?}: {note:?} in:\n{}",
                out.stdout
            );
        }
    }
}

/// The state store `serve` reports opening (`latchkey: state in ...`), for a config file and
/// the given variables and flags.
fn state_opened(config: &Path, env: &[(&str, &str)], flags: &[&str]) -> String {
    let mut b = latchkey()
        .policy(
            "main.toml",
            "[[rules]]\nname = \"a\"\nhosts = [\"a.test\"]\n",
        )
        .arg("--config")
        .arg(&config.display().to_string());
    for f in flags {
        b = b.arg(f);
    }
    for (k, v) in env {
        b = b.env(k, v);
    }
    let lk = b.run();
    assert!(
        lk.wait_stderr_contains("latchkey: state in ", Duration::from_secs(10)),
        "{}",
        lk.stderr_text()
    );
    lk.stderr_text()
        .lines()
        .find_map(|l| l.strip_prefix("latchkey: state in "))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_config_file_sets_serve_flags_and_variables_and_flags_override_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = |name: &str| format!("sqlite:{}", dir.path().join(name).display());
    let config = dir.path().join("latchkey.toml");
    std::fs::write(
        &config,
        format!(
            "# a deployment\nstate = {:?}\nmax-connections = 64\n",
            db("file.db")
        ),
    )
    .expect("config");
    assert!(state_opened(&config, &[], &[]).ends_with("file.db"));
    let env = [("LATCHKEY_STATE", db("env.db"))];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert!(state_opened(&config, &env, &[]).ends_with("env.db"));
    let flag = format!("--state={}", db("flag.db"));
    assert!(state_opened(&config, &env, &[&flag]).ends_with("flag.db"));
    // LATCHKEY_CONFIG names the file as --config does.
    let out = cli(
        &["serve", "--policies", "/nonexistent"],
        &[("LATCHKEY_CONFIG", "/nonexistent/latchkey.toml")],
    );
    assert_eq!(out.code(), Some(2), "{out:#?}");
    assert!(
        out.stderr
            .contains("/nonexistent/latchkey.toml: cannot read the --config file"),
        "{out:#?}"
    );
}

#[test]
fn the_example_config_file_starts_a_proxy() {
    let example = repo().join("examples/latchkey.toml");
    let text = std::fs::read_to_string(&example).expect("examples/latchkey.toml");
    assert!(
        text.contains("resolve = [") && text.contains("audit-sync = false"),
        "{text}"
    );
    // The builder's own --listen, --ca-dir, --audit, --policies and --admin win over the file's.
    let lk = latchkey()
        .policy(
            "main.toml",
            "[[rules]]\nname = \"a\"\nhosts = [\"a.test\"]\n",
        )
        .arg("--config")
        .arg(&example.display().to_string())
        .run();
    assert!(lk.addr().ip().is_loopback());
}

#[test]
fn a_config_file_with_unknown_keys_and_bad_values_names_each_at_its_line_and_column() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("latchkey.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\nmax_connections = 10\nlisen = \"x\"\nworkers = \"two\"\naudit-sync = \"yes\"\n",
    )
    .expect("config");
    let out = cli(&["serve", "--config", &config.display().to_string()], &[]);
    assert_eq!(out.code(), Some(2), "{out:#?}");
    let shown = config.display().to_string();
    for line in [
        format!("{shown}:2:1: unknown key `max_connections`; did you mean \"max-connections\"?"),
        format!("{shown}:3:1: unknown key `lisen`; did you mean \"listen\"?"),
        format!("{shown}:4:11: workers = \"two\": invalid value 'two' for '--workers"),
        format!("{shown}:5:14: audit-sync: a switch takes true or false"),
    ] {
        assert!(
            out.stderr.contains(&line),
            "{line:?} not in:\n{}",
            out.stderr
        );
    }
    assert!(!out.stderr.contains("listening"), "{out:#?}");
}

#[test]
fn an_error_about_a_flag_names_it_as_given_on_the_command_line_in_a_variable_or_in_the_config() {
    // approvals' --admin-url takes serve's ADDR:PORT too, and a bad value names --admin-url.
    let out = cli(
        &["approvals", "--admin-url", "ftp://127.0.0.1:1", "list"],
        &[],
    );
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stderr
            .contains("--admin-url ftp://127.0.0.1:1: only http://"),
        "{out:#?}"
    );
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let out = cli(
        &["approvals", "list", "--admin-url", &closed.to_string()],
        &[],
    );
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stderr.contains(&format!(
            "cannot reach the admin API at {closed} (--admin-url"
        )),
        "{out:#?}"
    );
    let out = cli(&["approvals", "list"], &[("LATCHKEY_ADMIN_URL", "ftp://x")]);
    assert!(
        out.stderr
            .contains("LATCHKEY_ADMIN_URL ftp://x: only http://"),
        "{out:#?}"
    );

    // serve: the same value from the command line, a variable and the config file.
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("latchkey.toml");
    std::fs::write(&config, "\nallow-private = [\"10.1.2.3/24\"]\n").expect("config");
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).expect("policies");
    std::fs::write(
        policies.join("main.toml"),
        "[[rules]]\nname = \"a\"\nhosts = [\"a.test\"]\n",
    )
    .expect("policy");
    let base = [
        "serve",
        "--policies",
        policies.to_str().expect("utf-8"),
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "off",
    ];
    let run = |extra: &[&str], env: &[(&str, &str)]| {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let mut cmd = Command::new(BIN);
        cmd.args(&args).current_dir(dir.path());
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        wait_with_timeout(&mut cmd, Duration::from_secs(20))
    };
    let out = run(&["--allow-private", "10.1.2.3/24"], &[]);
    assert!(
        out.stderr.contains("--allow-private \"10.1.2.3/24\""),
        "{out:#?}"
    );
    let out = run(&[], &[("LATCHKEY_ALLOW_PRIVATE", "10.1.2.3/24")]);
    assert!(
        out.stderr
            .contains("LATCHKEY_ALLOW_PRIVATE \"10.1.2.3/24\""),
        "{out:#?}"
    );
    let out = run(&["--config", config.to_str().expect("utf-8")], &[]);
    assert!(
        out.stderr.contains(&format!(
            "{}:2:1: allow-private \"10.1.2.3/24\"",
            config.display()
        )),
        "{out:#?}"
    );
}

#[test]
fn completions_and_the_man_page_come_from_the_same_definitions_as_help() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = run_cli(["completions", shell]);
        assert_eq!(out.code(), Some(0), "{shell}: {out:#?}");
        for word in ["serve", "max-websocket-message", "gateway-setup"] {
            assert!(out.stdout.contains(word), "{shell} completions lack {word}");
        }
    }
    let out = run_cli(["man"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(
        out.stdout.contains(".TH latchkey 1") && out.stdout.contains("serve"),
        "{}",
        out.stdout
    );
    let out = run_cli(["man", "audit", "query"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(
        out.stdout.contains(".TH latchkey-audit-query 1") && out.stdout.contains("\\-\\-phase"),
        "{}",
        out.stdout
    );
    let out = run_cli(["man", "serv"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(out.stderr.contains("did you mean \"serve\""), "{out:#?}");
}

#[test]
fn machine_output_is_format_json_everywhere_and_old_spellings_still_work() {
    let policies = repo().join("policies");
    let p = policies.to_str().expect("utf-8");
    for args in [
        &[
            "explain",
            "--policies",
            p,
            "--format",
            "json",
            "GET",
            "https://api.github.com/zen",
        ][..],
        &[
            "explain",
            "--policies",
            p,
            "--json",
            "GET",
            "https://api.github.com/zen",
        ],
        &["check", "--policies", p, "--no-secrets", "--format", "json"],
    ] {
        let out = run_cli(args);
        serde_json::from_str::<serde_json::Value>(out.stdout.trim())
            .unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}): {out:#?}"));
    }
    // approvals list: --status (with --state still read), --format json.
    let out = cli(&["approvals", "list", "--help"], &[]);
    assert!(
        out.stdout.contains("--status") && out.stdout.contains("--format"),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains("--state") && !out.stdout.contains("--json"),
        "{}",
        out.stdout
    );
    let out = cli(
        &[
            "approvals",
            "list",
            "--state",
            "all",
            "--admin-url",
            "ftp://x",
        ],
        &[],
    );
    assert!(
        out.stderr.contains("only http://"),
        "--state still parses: {out:#?}"
    );
    let out = cli(&["audit", "query", "--help"], &[]);
    assert!(
        out.stdout.contains("[possible values: table, json]"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_misspelt_reason_code_gets_a_guess() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("audit.jsonl");
    std::fs::write(&log, "").expect("log");
    let out = run_cli([
        "audit".as_ref(),
        "query".as_ref(),
        log.as_os_str(),
        "--reason".as_ref(),
        "method_not_alowed".as_ref(),
    ]);
    assert_eq!(out.code(), Some(2), "{out:#?}");
    assert!(
        out.stderr.contains("did you mean \"method_not_allowed\"?"),
        "{out:#?}"
    );
}

#[test]
fn the_top_level_short_help_is_one_line_a_command() {
    let out = cli(&["-h"], &[]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let commands: Vec<&str> = out
        .stdout
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert!(commands.len() >= 15, "{}", out.stdout);
    for line in &commands {
        assert!(
            line.starts_with("  ") && !line.starts_with("   "),
            "a wrapped summary: {line:?}\n{}",
            out.stdout
        );
    }
    let long = cli(&["diff", "--help"], &[]);
    assert!(
        long.stdout.contains("Exit 0 when nothing widened"),
        "--help keeps the details: {}",
        long.stdout
    );
}

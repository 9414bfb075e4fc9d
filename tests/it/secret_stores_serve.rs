//! Secrets held in a store, through `latchkey serve` and `latchkey check`: a `vault:` secret
//! from a real OpenBao dev server (TLS, its own CA) is injected like any other, its record names
//! the source kind, latchkey's own calls to the store are recorded under identity `latchkey`;
//! when the store goes away the value is served stale within `stale_for` and then refused
//! (`503 secret_unavailable` naming the secret); start-up refuses, waits or serves per
//! `--secrets-startup`; a reload that declares a secret the store cannot give is refused;
//! `check` fetches once and reports an unreachable store at the declaration, `check
//! --no-secrets` needs no network. No value or token is ever in a log line, record or answer.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::openbao::{free_port, OpenBao, ROOT_TOKEN};
use crate::support::secrets::{assert_no_leak, assert_refusal, secrets_world, SecretsWorld};
use crate::support::{latchkey, policy_dir, run_cli};

const V1: &str = "vault-held-token-v1-4f2a9c0d";

const RULE: &str = r#"
[[rules]]
name  = "gh"
hosts = ["api.test"]
ports = [PORT]
[rules.inject.headers]
authorization = "Bearer {{secret.gh}}"
"#;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A started OpenBao holding `secret/gh` = `{token: V1}`.
fn bao_with_secret(rt: &tokio::runtime::Runtime) -> OpenBao {
    rt.block_on(async {
        let bao = OpenBao::start().await;
        bao.ok("POST", "secret/data/gh", json!({"data": {"token": V1}}))
            .await;
        bao
    })
}

/// `[vault]` for a server at `address` trusting `ca`, logging in with the root token.
fn vault_table(address: &str, ca: &str) -> String {
    format!(
        "[vault]\naddress = \"{address}\"\nca = \"{ca}\"\nallow_private = [\"127.0.0.0/8\"]\nauth = {{ method = \"token\", token = \"env:LK_VAULT_TOKEN\" }}\n"
    )
}

fn secret_gh(extra: &str) -> String {
    format!("[secrets.gh]\nsource = \"vault:secret/gh#token\"\n{extra}\n")
}

fn world(bao: &OpenBao, extra: &str) -> SecretsWorld {
    let table = vault_table(&bao.address(), &bao.ca().display().to_string());
    let w = secrets_world(
        &[("LK_VAULT_TOKEN", ROOT_TOKEN)],
        |_| {},
        |s| format!("{table}{}{}", secret_gh(extra), s.ports(RULE)),
    );
    w.track("gh", V1);
    w
}

fn injected(w: &SecretsWorld, path: &str) -> String {
    let resp = w.curl_ok(&[&w.url("api.test", path)]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    w.received_one(path)
        .header("authorization")
        .unwrap_or_else(|| panic!("no authorization reached the upstream"))
        .to_string()
}

/// The outcome record of the request for `path`, once written (latchkey's own calls to the
/// store have records of their own beside it).
fn outcome_for(w: &SecretsWorld, path: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let records = w.lk.audit_records();
        if let Some(r) = records
            .iter()
            .rev()
            .find(|r| r["phase"] == "outcome" && r["path"] == path)
        {
            return r.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no outcome record for {path}: {records:#?}"
        );
        thread::sleep(Duration::from_millis(25));
    }
}

/// Nothing latchkey wrote — its log, its records — holds the value or the Vault token.
fn assert_clean(w: &SecretsWorld) {
    for (what, text) in [
        ("latchkey's log", w.lk.stderr_text()),
        ("the audit log", w.lk.audit_text()),
    ] {
        assert_no_leak(what, text.as_bytes(), &w.tracked());
        assert!(!text.contains(ROOT_TOKEN), "{what} holds the Vault token");
    }
}

#[test]
fn a_vault_secret_is_injected_its_record_names_the_kind_and_the_store_calls_are_latchkeys_own() {
    let rt = runtime();
    let bao = bao_with_secret(&rt);
    let w = world(&bao, "");
    assert_eq!(injected(&w, "/v1/repos"), format!("Bearer {V1}"));
    let r = outcome_for(&w, "/v1/repos");
    assert_eq!(r["secrets"], json!(["gh"]), "{r}");
    assert_eq!(r["secret_sources"], json!({"gh": "vault"}), "{r}");
    assert!(r.get("stale_secrets").is_none(), "{r}");
    // The read itself: latchkey's own call, under the secret's rule, to the store's address.
    let all = w.lk.audit_records();
    let read = all
        .iter()
        .find(|r| r["rule"] == "secret:gh" && r["phase"] == "outcome")
        .unwrap_or_else(|| panic!("no record of the store read: {all:#?}"));
    assert_eq!(read["identity"], "latchkey", "{read}");
    assert_eq!(read["method"], "GET", "{read}");
    assert_eq!(read["status"], 200, "{read}");
    assert!(
        all.iter().any(|r| r["rule"] == "latchkey:vault"),
        "no record of the login: {all:#?}"
    );
    // The value is cached: a second request makes no second read.
    assert_eq!(injected(&w, "/v1/again"), format!("Bearer {V1}"));
    let reads =
        w.lk.audit_records()
            .iter()
            .filter(|r| r["path"] == "/v1/secret/data/gh" && r["phase"] == "outcome")
            .count();
    assert_eq!(reads, 1, "one read while the value is fresh");
    assert_clean(&w);
}

#[test]
fn when_the_store_goes_away_a_value_is_served_stale_within_stale_for_then_refused_by_name() {
    let rt = runtime();
    let mut bao = bao_with_secret(&rt);
    let w = world(&bao, "refresh = \"1s\"\nstale_for = \"3s\"");
    let fetched = Instant::now();
    assert_eq!(injected(&w, "/v1/fresh"), format!("Bearer {V1}"));
    bao.kill();
    // Past the refresh, within the grace: the last value, marked stale in the record.
    thread::sleep(Duration::from_millis(1500).saturating_sub(fetched.elapsed()));
    assert_eq!(injected(&w, "/v1/stale"), format!("Bearer {V1}"));
    let r = outcome_for(&w, "/v1/stale");
    assert_eq!(r["stale_secrets"], json!(["gh"]), "{r}");
    // Past refresh + stale_for: refused, naming the secret and where it is held.
    thread::sleep(Duration::from_millis(4600).saturating_sub(fetched.elapsed()));
    let out = w.curl(&[&w.url("api.test", "/v1/gone")]);
    assert_refusal(&out.response, 503, "secret_unavailable");
    let text = out.response.text();
    assert!(
        text.contains("\"gh\"") && text.contains("vault:secret/gh"),
        "the refusal names the secret and its store path: {text}"
    );
    assert!(
        w.received("/v1/gone").is_empty(),
        "nothing was sent upstream"
    );
    assert_clean(&w);
}

#[test]
fn start_up_refuses_or_serves_per_secrets_startup_when_the_store_is_down() {
    let dead = format!("https://127.0.0.1:{}", free_port());
    let ca = crate::support::TestCa::new();
    let policy = format!(
        "{}{}[[rules]]\nname = \"gh\"\nhosts = [\"api.test\"]\n[rules.inject.headers]\nauthorization = \"Bearer {{{{secret.gh}}}}\"\n",
        vault_table(&dead, &ca.pem_path().display().to_string()),
        secret_gh("")
    );
    let out = latchkey()
        .env("LK_VAULT_TOKEN", ROOT_TOKEN)
        .policy("main.toml", &policy)
        .run_expecting_failure();
    assert_eq!(out.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("secret \"gh\"")
            && out.stderr.contains("vault:secret/gh")
            && out.stderr.contains("--secrets-startup wait"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains(ROOT_TOKEN), "{}", out.stderr);
    // `serve`: it starts, says what it serves without, and refuses what needs it.
    let lk = latchkey()
        .env("LK_VAULT_TOKEN", ROOT_TOKEN)
        .policy("main.toml", &policy)
        .arg("--secrets-startup")
        .arg("serve")
        .run();
    assert!(
        lk.stderr_text().contains("serving without 1 secret(s)"),
        "{}",
        lk.stderr_text()
    );
}

#[test]
fn start_up_waits_for_a_store_that_comes_up_later() {
    let rt = runtime();
    let port = free_port();
    // The server's CA exists only once it runs: point latchkey at the file it will write.
    let dir = tempfile::tempdir().expect("tmp");
    let policy_text = move |ca: &str| {
        format!(
            "{}{}[[rules]]\nname = \"gh\"\nhosts = [\"api.test\"]\n[rules.inject.headers]\nauthorization = \"Bearer {{{{secret.gh}}}}\"\n",
            vault_table(&format!("https://127.0.0.1:{port}"), ca),
            secret_gh("")
        )
    };
    let ca_link = dir.path().join("vault-ca.pem");
    let policy = policy_text(&ca_link.display().to_string());
    let started = thread::spawn(move || {
        latchkey()
            .env("LK_VAULT_TOKEN", ROOT_TOKEN)
            .policy("main.toml", &policy)
            .arg("--secrets-startup")
            .arg("wait")
            .run()
    });
    thread::sleep(Duration::from_secs(2));
    assert!(
        !started.is_finished(),
        "latchkey listened before its secret was fetched"
    );
    let bao = rt.block_on(async {
        let bao = OpenBao::start_on(port).await;
        bao.ok("POST", "secret/data/gh", json!({"data": {"token": V1}}))
            .await;
        bao
    });
    std::fs::copy(bao.ca(), &ca_link).expect("the CA where latchkey looks");
    let lk = started
        .join()
        .expect("latchkey started once the store was up");
    let log = lk.stderr_text();
    assert!(
        log.contains("waiting for 1 secret(s) held in stores"),
        "{log}"
    );
    assert!(!log.contains(ROOT_TOKEN) && !log.contains(V1), "{log}");
}

#[test]
fn a_reload_declaring_a_secret_the_store_cannot_give_is_refused_and_the_policy_stays() {
    let rt = runtime();
    let bao = bao_with_secret(&rt);
    let w = world(&bao, "");
    assert_eq!(injected(&w, "/v1/before"), format!("Bearer {V1}"));
    let policies = w.lk.scratch().join("policies");
    std::fs::write(
        policies.join("more.toml"),
        "[secrets.missing]\nsource = \"vault:secret/nothing-here#token\"\n",
    )
    .expect("write a policy file");
    assert!(
        w.lk.wait_stderr_contains("policy reload refused", Duration::from_secs(10)),
        "{}",
        w.lk.stderr_text()
    );
    let log = w.lk.stderr_text();
    assert!(
        log.contains("secret \\\"missing\\\"") || log.contains("secret \"missing\""),
        "{log}"
    );
    // The policy in force (and its value) still serves.
    assert_eq!(injected(&w, "/v1/after"), format!("Bearer {V1}"));
    assert_clean(&w);
}

#[test]
fn check_fetches_every_stored_secret_once_and_no_secrets_needs_no_network() {
    let rt = runtime();
    let mut bao = bao_with_secret(&rt);
    let ca = bao.ca().display().to_string();
    let text = format!(
        "{}{}[secrets.other]\nsource = \"vault:secret/absent#token\"\n{}",
        vault_table(&bao.address(), &ca),
        secret_gh(""),
        RULE.replace("ports = [PORT]\n", "")
    );
    let dir = policy_dir(&[("main.toml", &text)]);
    let policies = dir.path().to_str().expect("utf-8 path");
    let out = run_cli_env(&["check", "--policies", policies]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    // The one that exists is fetched; the absent one is named at its declaration.
    assert!(
        out.stderr.contains("main.toml:") && out.stderr.contains("secrets.other.source"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("secrets.gh.source"), "{}", out.stderr);
    assert!(
        !out.stderr.contains(V1) && !out.stderr.contains(ROOT_TOKEN),
        "{}",
        out.stderr
    );
    // The store down: both are reported, at once.
    bao.kill();
    let out = run_cli_env(&["check", "--policies", policies]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    for name in ["secrets.gh.source", "secrets.other.source"] {
        assert!(out.stderr.contains(name), "{name}: {}", out.stderr);
    }
    let out = run_cli_env(&["check", "--no-secrets", "--policies", policies]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    // `explain` names the source kind (and reads nothing).
    let out = run_cli([
        "explain",
        "--policies",
        policies,
        "GET",
        "https://api.test/x",
    ]);
    assert!(out.stdout.contains("secrets:  gh (vault)"), "{out:#?}");
}

/// `run_cli` with the Vault token in the environment `check` reads.
fn run_cli_env(args: &[&str]) -> crate::support::CliOutput {
    let mut cmd = std::process::Command::new(crate::support::latchkey::BIN);
    cmd.args(args).env("LK_VAULT_TOKEN", ROOT_TOKEN);
    crate::support::latchkey::wait_with_timeout(&mut cmd, Duration::from_secs(60))
}

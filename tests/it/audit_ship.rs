//! Closed audit segments shipped off the box (`--audit-ship`) to a real S3 implementation on
//! loopback: `tests/clients/s3_moto.py` (moto in server mode over HTTPS, its IAM
//! authentication on, so every PUT must carry a valid SigV4 signature of its user). Objects
//! are listed and read back with boto3 (`tests/clients/s3_objects.py`), as an operator would
//! after the machine is gone.
//!
//! The store goes down by way of a [`Relay`] on a fixed loopback port in front of moto: taking
//! it down closes its listener and every connection through it (connection refused, as from a
//! store that is gone), bringing it up listens on the same port again, moto and its bucket
//! untouched.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::admin::{metrics, status};
use crate::support::credentials::{Bench, PyServer};
use crate::support::latchkey::LatchkeyBuilder;
use crate::support::latchkey::{wait_with_timeout, SCRUBBED_ENV};
use crate::support::toolchain;
use crate::support::{latchkey, raw_request, run_cli, Latchkey, Upstream};

const BUCKET: &str = "lk-bucket";

/// moto with its IAM user's key, and the test CA its certificate comes from.
struct Store {
    bench: Bench,
    moto: PyServer,
    akid: String,
    secret: String,
}

fn store() -> Store {
    let bench = Bench::new();
    let moto = bench.server("s3_moto.py", &[]);
    let keys = moto.wait_events("keys", 1)[0].clone();
    let field = |k: &str| keys[k].as_str().expect("key field").to_string();
    Store {
        akid: field("access_key_id"),
        secret: field("secret_access_key"),
        bench,
        moto,
    }
}

impl Store {
    /// The objects under `prefix`, each downloaded into `out` (named as the last part of its
    /// key): key → bytes.
    fn objects(&self, prefix: &str, out: &Path) -> BTreeMap<String, Vec<u8>> {
        std::fs::create_dir_all(out).expect("download dir");
        let mut cmd = Command::new(toolchain::python());
        cmd.arg(format!(
            "{}/tests/clients/s3_objects.py",
            env!("CARGO_MANIFEST_DIR")
        ))
        .arg(format!("https://localhost:{}", self.moto.port()))
        .arg(BUCKET)
        .arg(prefix)
        .arg(out);
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        cmd.env("AWS_ACCESS_KEY_ID", &self.akid)
            .env("AWS_SECRET_ACCESS_KEY", &self.secret)
            .env_remove("AWS_SESSION_TOKEN")
            .env("AWS_CA_BUNDLE", self.bench.ca.pem_path());
        let run = wait_with_timeout(&mut cmd, Duration::from_secs(60));
        assert_eq!(run.code(), Some(0), "s3_objects.py failed: {run:#?}");
        let listed: Value = serde_json::from_str(run.stdout.trim()).expect("s3_objects.py JSON");
        listed["objects"]
            .as_array()
            .expect("objects")
            .iter()
            .map(|o| {
                let key = o["key"].as_str().expect("key").to_string();
                let name = key.rsplit('/').next().expect("name").to_string();
                let bytes = std::fs::read(out.join(&name)).expect("downloaded object");
                assert_eq!(o["size"], bytes.len(), "{o}");
                (key, bytes)
            })
            .collect()
    }

    /// moto's record of every PUT under `prefix`.
    fn puts(&self, prefix: &str) -> Vec<Value> {
        let path = format!("/{BUCKET}/{prefix}/");
        self.moto
            .events_of("request")
            .into_iter()
            .filter(|e| {
                e["method"] == "PUT" && e["path"].as_str().is_some_and(|p| p.starts_with(&path))
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The relay: the store's network path, which the test can cut

struct RelayState {
    /// What the test asked for.
    want_up: bool,
    /// What the relay thread has done.
    listening: bool,
    /// Connections through the relay (both halves), shut down when it goes down.
    conns: Vec<TcpStream>,
}

struct Relay {
    port: u16,
    state: Arc<Mutex<RelayState>>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    /// Listens on a free loopback port and forwards each connection to `127.0.0.1:target`.
    fn start(target: u16) -> Relay {
        let first = TcpListener::bind("127.0.0.1:0").expect("relay port");
        let port = first.local_addr().expect("relay addr").port();
        let state = Arc::new(Mutex::new(RelayState {
            want_up: true,
            listening: true,
            conns: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, halt) = (state.clone(), stop.clone());
        thread::spawn(move || relay_loop(Some(first), port, target, &st, &halt));
        Relay { port, state, stop }
    }

    fn set(&self, up: bool) {
        self.state.lock().expect("relay state").want_up = up;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.state.lock().expect("relay state").listening != up {
            assert!(
                Instant::now() < deadline,
                "the relay did not go {}",
                if up { "up" } else { "down" }
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The store is unreachable: nothing listens on the port, open connections are cut.
    fn down(&self) {
        self.set(false);
    }

    fn up(&self) {
        self.set(true);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn relay_loop(
    mut listener: Option<TcpListener>,
    port: u16,
    target: u16,
    state: &Mutex<RelayState>,
    stop: &AtomicBool,
) {
    if let Some(l) = &listener {
        l.set_nonblocking(true).expect("nonblocking relay");
    }
    while !stop.load(Ordering::Relaxed) {
        let want_up = state.lock().expect("relay state").want_up;
        match (&listener, want_up) {
            (Some(_), false) => {
                listener = None;
                let mut s = state.lock().expect("relay state");
                for c in s.conns.drain(..) {
                    let _ = c.shutdown(Shutdown::Both);
                }
                s.listening = false;
            }
            (None, true) => {
                // The port was ours a moment ago; std sets SO_REUSEADDR, so it binds again.
                if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
                    l.set_nonblocking(true).expect("nonblocking relay");
                    listener = Some(l);
                    state.lock().expect("relay state").listening = true;
                }
            }
            _ => {}
        }
        let accepted = listener.as_ref().and_then(|l| l.accept().ok());
        match accepted {
            Some((client, _)) => {
                // The test plays the network between latchkey and the store.
                #[allow(clippy::disallowed_methods)]
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let mut s = state.lock().expect("relay state");
                for c in [&client, &server] {
                    if let Ok(c) = c.try_clone() {
                        s.conns.push(c);
                    }
                }
                drop(s);
                pipe(&client, &server);
                pipe(&server, &client);
            }
            None => thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Copies `from` to `to` on its own thread until either side closes.
fn pipe(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

// ---------------------------------------------------------------------------------------------
// latchkey, shipping

/// latchkey with a plain-HTTP `api.test` rule on `upstream`, rotating at 2 KiB and shipping to
/// `s3://lk-bucket/PREFIX` at `https://s3.test:PORT` (pinned to loopback, which the test
/// harness opens with `--allow-private 127.0.0.0/8`), signed with `secret`.
fn shipping(
    store: &Store,
    upstream: &Upstream,
    port: u16,
    prefix: &str,
    secret: &str,
) -> LatchkeyBuilder {
    latchkey()
        .upstream_ca(&store.bench.ca)
        .pin("api.test")
        .pin("s3.test")
        .policy(
            "main.toml",
            &format!(
                "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{}]\n",
                upstream.port()
            ),
        )
        .arg("--audit-rotate")
        .arg("2KiB")
        .arg("--audit-ship")
        .arg(&format!("s3://{BUCKET}/{prefix}"))
        .arg("--audit-ship-endpoint")
        .arg(&format!("https://s3.test:{port}"))
        .env("AWS_ACCESS_KEY_ID", &store.akid)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env_remove("AWS_SESSION_TOKEN")
}

/// `n` requests through latchkey, one after another, each answered 200.
fn drive(lk: &Latchkey, upstream: &Upstream, n: usize, tag: &str) {
    let port = upstream.port();
    for i in 0..n {
        let resp = raw_request(
            lk.addr(),
            format!(
                "GET http://api.test:{port}/{tag}/{i} HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        );
        assert_eq!(resp.status, 200, "{resp:#?}");
    }
}

/// The closed segments beside `active`, by file name.
fn segments(active: &Path) -> Vec<PathBuf> {
    let dir = active.parent().expect("audit dir");
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("audit dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("audit-") && n.ends_with(".jsonl"))
        })
        .collect();
    out.sort();
    out
}

fn name(p: &Path) -> String {
    p.file_name()
        .expect("file name")
        .to_string_lossy()
        .into_owned()
}

fn marker(seg: &Path) -> PathBuf {
    PathBuf::from(format!("{}.shipped", seg.display()))
}

/// Polls `/status` until `done(audit_ship)` holds (up to `timeout`).
fn wait_ship(lk: &Latchkey, timeout: Duration, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let s = status(lk)["audit_ship"].clone();
        if done(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: /status audit_ship did not get there within {timeout:?}: {s:#}\nstderr:\n{}",
            lk.stderr_text()
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Every local segment in `segs` is in `objects` under `prefix`, byte for byte.
fn assert_byte_identical(segs: &[PathBuf], objects: &BTreeMap<String, Vec<u8>>, prefix: &str) {
    for seg in segs {
        let key = format!("{prefix}/{}", name(seg));
        let local = std::fs::read(seg).expect("local segment");
        let remote = objects
            .get(&key)
            .unwrap_or_else(|| panic!("{key} is not in the bucket: {:?}", objects.keys()));
        assert!(
            remote == &local,
            "{key}: the object differs from the local segment"
        );
    }
}

/// `latchkey audit verify --json FILES…` with the key in `ca_dir`: the report, asserted intact.
fn verify_intact(files: &[&Path], key: &Path) -> Value {
    let mut args: Vec<String> = vec!["audit".into(), "verify".into(), "--json".into()];
    args.extend(files.iter().map(|f| f.display().to_string()));
    args.push("--audit-key".into());
    args.push(key.display().to_string());
    let out = run_cli(&args);
    let report: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("audit verify --json ({e}): {out:#?}"));
    assert_eq!(out.code(), Some(0), "not intact: {report:#}");
    assert_eq!(report["problems"], serde_json::json!([]), "{report:#}");
    report
}

// ---------------------------------------------------------------------------------------------

#[test]
fn segments_ship_as_they_close_spool_while_the_store_is_down_and_all_arrive_intact() {
    let store = store();
    let relay = Relay::start(store.moto.port());
    let upstream = Upstream::http();
    let prefix = "boxes/a";
    let lk = shipping(&store, &upstream, relay.port, prefix, &store.secret).run();
    let active = lk.scratch().join("audit.jsonl");

    // Store up: each segment is shipped as it closes.
    drive(&lk, &upstream, 8, "up");
    let shipped = wait_ship(&lk, Duration::from_secs(30), "store up", |s| {
        s["pending_segments"] == 0 && s["shipped_segments"].as_u64() >= Some(2)
    });
    assert_eq!(shipped["target"], format!("s3://{BUCKET}/{prefix}"));
    assert_eq!(shipped["last_error"], Value::Null, "{shipped:#}");
    let first = segments(&active);
    assert!(first.len() >= 2, "{first:?}");
    for seg in &first {
        assert!(
            marker(seg).exists(),
            "{} shipped but has no marker",
            name(seg)
        );
    }
    assert_eq!(
        shipped["last_shipped"].as_str(),
        first.last().map(|s| name(s)).as_deref()
    );
    let objects = store.objects(prefix, &lk.scratch().join("download-1"));
    assert_eq!(objects.len(), first.len(), "{:?}", objects.keys());
    assert_byte_identical(&first, &objects, prefix);
    // One signed PUT per segment, its payload hash in x-amz-content-sha256.
    let puts = store.puts(prefix);
    assert_eq!(puts.len(), first.len(), "{puts:#?}");
    for p in &puts {
        assert_eq!(p["status"], 200, "{p:#}");
        let sha = p["content_sha256"].as_str().unwrap_or_default();
        assert!(
            sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
            "{p:#}"
        );
    }

    // Store down: segments spool on disk, and latchkey says how far behind it is.
    relay.down();
    drive(&lk, &upstream, 8, "down");
    let behind = wait_ship(&lk, Duration::from_secs(30), "store down", |s| {
        s["pending_segments"].as_u64() >= Some(2) && s["last_error"].is_string()
    });
    let error = behind["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!(
            "cannot reach the store at https://s3.test:{}",
            relay.port
        )),
        "{behind:#}"
    );
    assert!(behind["pending_bytes"].as_u64() > Some(2048), "{behind:#}");
    assert!(behind["oldest_pending_age_s"].is_u64(), "{behind:#}");
    let m = metrics(&lk);
    assert!(
        m.value("latchkey_audit_ship_pending_segments", &[]) >= 2.0,
        "{}",
        m.text
    );
    assert!(
        m.value("latchkey_audit_ship_pending_bytes", &[]) > 2048.0,
        "{}",
        m.text
    );
    assert!(m.value("latchkey_audit_ship_uploads_total", &[("result", "failed")]) >= 1.0);
    let spooled: Vec<PathBuf> = segments(&active)
        .into_iter()
        .filter(|s| !first.contains(s))
        .collect();
    assert!(spooled.len() >= 2, "{spooled:?}");
    for seg in &spooled {
        assert!(
            !marker(seg).exists(),
            "{} marked while the store is down",
            name(seg)
        );
    }
    // The audit writer never waits on the store: every request so far is recorded.
    let closed = segments(&active);
    assert_eq!(in_phase(&closed, "outcome") + lk.audit_records().len(), 16);
    assert_eq!(
        in_phase(&closed, "decision") + lk.decision_records().len(),
        16
    );
    thread::sleep(Duration::from_secs(2));

    // Store up again: everything ships, nothing lost.
    relay.up();
    let caught_up = wait_ship(&lk, Duration::from_secs(90), "store back", |s| {
        s["pending_segments"] == 0 && s["last_error"].is_null()
    });
    assert_eq!(caught_up["pending_bytes"], 0, "{caught_up:#}");
    assert_eq!(caught_up["oldest_pending_age_s"], 0, "{caught_up:#}");
    let all = segments(&active);
    for seg in &all {
        assert!(marker(seg).exists(), "{} not marked", name(seg));
    }
    let m = metrics(&lk);
    assert_eq!(m.value("latchkey_audit_ship_pending_segments", &[]), 0.0);
    let download = lk.scratch().join("download-2");
    let objects = store.objects(prefix, &download);
    assert_eq!(objects.len(), all.len(), "{:?}", objects.keys());
    assert_byte_identical(&all, &objects, prefix);

    // The objects and the active file are one intact chain from its first record.
    let key = lk.ca_dir().join("latchkey-audit.key");
    let report = verify_intact(&[download.as_path(), active.as_path()], &key);
    assert_eq!(report["first_seq"], 1, "{report:#}");
    assert_eq!(report["starts_mid_chain"], false, "{report:#}");
    assert_eq!(
        report["files"].as_array().map(Vec::len),
        Some(all.len() + 1),
        "{report:#}"
    );
    assert!(
        lk.stderr_text().contains("audit segment shipped"),
        "{}",
        lk.stderr_text()
    );
}

/// The records of `phase` (one per request of each) in `files`.
fn in_phase(files: &[PathBuf], phase: &str) -> usize {
    let needle = format!("\"phase\":\"{phase}\"");
    files
        .iter()
        .map(|f| {
            std::fs::read_to_string(f)
                .expect("segment")
                .lines()
                .filter(|l| l.contains(&needle))
                .count()
        })
        .sum()
}

#[test]
fn a_wrong_secret_key_is_refused_by_the_store_retried_and_never_marked_shipped() {
    let store = store();
    let upstream = Upstream::http();
    let prefix = "boxes/wrong-key";
    let wrong = format!("{}x", store.secret);
    let lk = shipping(&store, &upstream, store.moto.port(), prefix, &wrong).run();
    let active = lk.scratch().join("audit.jsonl");
    drive(&lk, &upstream, 4, "w");

    // The same (oldest) segment is tried again after the backoff, each time refused.
    let deadline = Instant::now() + Duration::from_secs(30);
    let puts = loop {
        let puts = store.puts(prefix);
        if puts.len() >= 3 {
            break puts;
        }
        assert!(
            Instant::now() < deadline,
            "expected 3 refused PUTs, moto saw {puts:#?}\nlatchkey:\n{}",
            lk.stderr_text()
        );
        thread::sleep(Duration::from_millis(100));
    };
    let oldest = &segments(&active)[0];
    for p in &puts[..3] {
        assert_eq!(p["status"], 403, "{p:#}");
        assert_eq!(
            p["path"],
            format!("/{BUCKET}/{prefix}/{}", name(oldest)),
            "{p:#}"
        );
    }
    let s = wait_ship(&lk, Duration::from_secs(10), "wrong key", |s| {
        s["last_error"].is_string()
    });
    let error = s["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("403 SignatureDoesNotMatch"), "{s:#}");
    assert_eq!(s["shipped_segments"], 0, "{s:#}");
    assert!(s["pending_segments"].as_u64() >= Some(1), "{s:#}");
    for seg in segments(&active) {
        assert!(
            !marker(&seg).exists(),
            "{} marked though refused",
            name(&seg)
        );
    }
    assert!(store
        .objects(prefix, &lk.scratch().join("download"))
        .is_empty());
    // Neither key appears in what latchkey says.
    let said = format!("{}{s}", lk.stderr_text());
    for secret in [&wrong, &store.secret] {
        assert!(
            !said.contains(secret.as_str()),
            "a secret key in latchkey's output"
        );
    }
    assert!(
        said.contains("audit segment not shipped; retrying"),
        "{said}"
    );
}

#[test]
fn a_restart_ships_what_an_earlier_run_left_and_retention_removes_only_shipped_segments() {
    let store = store();
    let relay = Relay::start(store.moto.port());
    let upstream = Upstream::http();
    let prefix = "boxes/restart";
    let dir = tempfile::tempdir().expect("audit dir");
    let active = dir.path().join("audit.jsonl");
    let key = dir.path().join("audit.key");
    let run = || {
        shipping(&store, &upstream, relay.port, prefix, &store.secret)
            .audit_to(&active)
            .arg("--audit-key")
            .arg(key.to_str().expect("utf-8"))
            .arg("--audit-keep")
            .arg("1s")
            .run()
    };

    // Run 1, the store unreachable throughout: every segment stays, retention or not.
    relay.down();
    let lk = run();
    drive(&lk, &upstream, 8, "one");
    thread::sleep(Duration::from_millis(1500));
    drive(&lk, &upstream, 8, "one-more");
    let left = wait_ship(&lk, Duration::from_secs(30), "run 1", |s| {
        s["pending_segments"].as_u64() >= Some(4) && s["last_error"].is_string()
    });
    let run1 = segments(&active);
    assert_eq!(left["pending_segments"], run1.len(), "{left:#}");
    assert!(run1.iter().all(|s| !marker(s).exists()));
    drop(lk);

    // Run 2, the store back: what run 1 left is shipped at startup, before any rotation.
    relay.up();
    let lk = run();
    wait_ship(&lk, Duration::from_secs(60), "run 2 start", |s| {
        s["pending_segments"] == 0 && s["shipped_segments"].as_u64() >= Some(run1.len() as u64)
    });
    for seg in &run1 {
        assert!(marker(seg).exists(), "{} not marked", name(seg));
    }
    let objects = store.objects(prefix, &dir.path().join("download-1"));
    assert_byte_identical(&run1, &objects, prefix);

    // Store down again; new segments pile up. Once run 1's are shipped and older than 1s, the
    // next rotations remove them, and keep every unshipped one.
    relay.down();
    thread::sleep(Duration::from_millis(1200));
    drive(&lk, &upstream, 8, "two");
    let pending = wait_ship(&lk, Duration::from_secs(30), "run 2 down", |s| {
        s["pending_segments"].as_u64() >= Some(2)
    });
    let now = segments(&active);
    for seg in &run1 {
        assert!(!seg.exists(), "{} shipped and old, but kept", name(seg));
        assert!(!marker(seg).exists(), "{}'s marker outlived it", name(seg));
    }
    let unshipped: Vec<&PathBuf> = now.iter().filter(|s| !marker(s).exists()).collect();
    assert!(unshipped.len() as u64 >= pending["pending_segments"].as_u64().unwrap_or(0));
    thread::sleep(Duration::from_millis(1200));
    drive(&lk, &upstream, 4, "two-more");
    for seg in &unshipped {
        assert!(seg.exists(), "{} removed before it was shipped", name(seg));
    }

    // Up again: everything reaches the store; the bucket holds the whole chain.
    relay.up();
    wait_ship(&lk, Duration::from_secs(90), "run 2 back", |s| {
        s["pending_segments"] == 0 && s["last_error"].is_null()
    });
    let download = dir.path().join("download-2");
    let objects = store.objects(prefix, &download);
    let local = segments(&active);
    for seg in run1.iter().chain(unshipped.iter().copied()).chain(&local) {
        let key = format!("{prefix}/{}", name(seg));
        assert!(
            objects.contains_key(&key),
            "{key} never reached the store: {:?}",
            objects.keys()
        );
    }
    assert_byte_identical(&local, &objects, prefix);
    let report = verify_intact(&[download.as_path(), active.as_path()], &key);
    assert_eq!(report["first_seq"], 1, "{report:#}");
}

#[test]
fn shipping_refuses_to_start_without_a_file_rotation_keys_or_a_valid_url() {
    let base = || {
        latchkey()
            .policy("main.toml", "")
            .env("AWS_ACCESS_KEY_ID", "AKIATEST")
            .env("AWS_SECRET_ACCESS_KEY", "not-a-real-secret-value")
            .env_remove("AWS_SESSION_TOKEN")
    };
    for (what, b, expect) in [
        (
            "no rotation",
            base().arg("--audit-ship").arg("s3://lk-bucket/p"),
            "--audit-ship needs --audit-rotate",
        ),
        (
            "stdout",
            base()
                .audit_to(Path::new("-"))
                .arg("--audit-ship")
                .arg("s3://lk-bucket/p")
                .arg("--audit-rotate")
                .arg("1h"),
            "--audit-ship needs --audit to be a file",
        ),
        (
            "scheme",
            base()
                .arg("--audit-ship")
                .arg("https://lk-bucket/p")
                .arg("--audit-rotate")
                .arg("1h"),
            "the scheme must be s3://",
        ),
        (
            "bucket",
            base()
                .arg("--audit-ship")
                .arg("s3://LK_bucket/p")
                .arg("--audit-rotate")
                .arg("1h"),
            "bucket \"LK_bucket\": 'L' is not allowed",
        ),
        (
            "keys",
            base()
                .env_remove("AWS_SECRET_ACCESS_KEY")
                .arg("--audit-ship")
                .arg("s3://lk-bucket/p")
                .arg("--audit-rotate")
                .arg("1h"),
            "AWS_SECRET_ACCESS_KEY not set",
        ),
        (
            "endpoint alone",
            base().arg("--audit-ship-endpoint").arg("https://s3.test"),
            "--audit-ship-endpoint is set but --audit-ship is not",
        ),
    ] {
        let out = b.run_expecting_failure();
        assert_ne!(out.code(), Some(0), "{what}: {out:#?}");
        assert!(out.stderr.contains(expect), "{what}: {}", out.stderr);
        assert!(
            !out.stderr.contains("not-a-real-secret-value"),
            "{what}: {}",
            out.stderr
        );
    }
}

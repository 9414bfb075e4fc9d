//! The admin API as an operator's tools see it: plain HTTP/1.1 on latchkey's `--admin` listener,
//! `/status` as JSON, and `/metrics` parsed by Python's `prometheus_client`
//! (`tests/clients/parse_metrics.py`), the parser Prometheus users actually run.

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::clients::{dial, read_response, RawResponse};
use super::latchkey::Latchkey;
use super::toolchain;

/// Sends `METHOD PATH` to the admin listener at `addr` on a fresh connection and reads the
/// answer. `headers` are extra `(name, value)` pairs.
pub fn admin_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> RawResponse {
    let mut tcp = dial(addr);
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n"
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes()).expect("send admin request");
    read_response(&mut tcp, false)
        .unwrap_or_else(|e| panic!("read admin answer to {method} {path}: {e}"))
}

/// `GET path` on `lk`'s admin API, without a token.
pub fn admin_get(lk: &Latchkey, path: &str) -> RawResponse {
    admin_request(lk.admin_addr(), "GET", path, &[])
}

/// The body of an admin answer as JSON; panics with the answer if it is not JSON.
pub fn json_body(resp: &RawResponse) -> Value {
    serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("admin answer is not JSON ({e}): {resp:#?}"))
}

/// `GET /status`, asserted 200 and JSON.
pub fn status(lk: &Latchkey) -> Value {
    let resp = admin_get(lk, "/status");
    assert_eq!(resp.status, 200, "GET /status: {resp:#?}");
    json_body(&resp)
}

/// The policy digest `/status` reports.
pub fn digest(lk: &Latchkey) -> String {
    status(lk)["policy"]["digest"]
        .as_str()
        .unwrap_or_else(|| panic!("/status has no policy.digest: {:#}", status(lk)))
        .to_string()
}

/// `POST /reload`: the status and the JSON answer.
pub fn reload(lk: &Latchkey) -> (u16, Value) {
    let resp = admin_request(lk.admin_addr(), "POST", "/reload", &[]);
    (resp.status, json_body(&resp))
}

/// Polls `/status` (up to `timeout`) until `done(status)` holds; returns that status.
pub fn wait_status(lk: &Latchkey, timeout: Duration, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let s = status(lk);
        if done(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "/status did not reach the expected state within {timeout:?}: {s:#}\nstderr:\n{}",
            lk.stderr_text()
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (up to 5 s: the watcher polls every second and debounces 250 ms) for the policy digest
/// to differ from `old`; returns the new one.
pub fn wait_digest_change(lk: &Latchkey, old: &str) -> String {
    let s = wait_status(lk, Duration::from_secs(5), |s| {
        s["policy"]["digest"].as_str() != Some(old)
    });
    s["policy"]["digest"].as_str().expect("digest").to_string()
}

/// One sample of a metric family.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A metric family as `prometheus_client` parsed it (a counter's family name has no `_total`;
/// its samples do).
#[derive(Debug, Clone)]
pub struct Family {
    pub name: String,
    pub kind: String,
    pub samples: Vec<Sample>,
}

/// `/metrics`, parsed.
#[derive(Debug)]
pub struct Metrics {
    pub families: Vec<Family>,
    /// The exposition text as served, for failure messages.
    pub text: String,
}

impl Metrics {
    /// The family holding samples named `sample_name` (e.g. `latchkey_requests_total`).
    pub fn family_of(&self, sample_name: &str) -> &Family {
        self.families
            .iter()
            .find(|f| f.samples.iter().any(|s| s.name == sample_name))
            .or_else(|| {
                self.families
                    .iter()
                    .find(|f| sample_name.strip_suffix("_total") == Some(f.name.as_str()))
            })
            .or_else(|| self.families.iter().find(|f| f.name == sample_name))
            .unwrap_or_else(|| {
                panic!(
                    "no metric family for {sample_name}; families: {:?}\n{}",
                    self.families.iter().map(|f| &f.name).collect::<Vec<_>>(),
                    self.text
                )
            })
    }

    /// Every sample named `name` whose labels include all of `labels`.
    pub fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Sample> {
        self.families
            .iter()
            .flat_map(|f| &f.samples)
            .filter(|s| s.name == name)
            .filter(|s| labels.iter().all(|(k, v)| s.label(k) == Some(v)))
            .collect()
    }

    /// The sum of the samples named `name` with (at least) these labels; 0 when there are none
    /// (a counter that never counted may be absent).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples(name, labels).iter().map(|s| s.value).sum()
    }

    /// The value of the one sample named `name` with these labels; panics if there is not
    /// exactly one.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found = self.samples(name, labels);
        assert_eq!(
            found.len(),
            1,
            "expected one sample {name}{labels:?}, found {found:#?}\n{}",
            self.text
        );
        found[0].value
    }
}

/// `GET /metrics` with `headers` (e.g. an admin token), checked for a Prometheus text content
/// type and parsed by `tests/clients/parse_metrics.py`.
pub fn metrics_with(lk: &Latchkey, headers: &[(&str, &str)]) -> Metrics {
    let resp = admin_request(lk.admin_addr(), "GET", "/metrics", headers);
    assert_eq!(resp.status, 200, "GET /metrics: {resp:#?}");
    let content_type = resp.header("content-type").unwrap_or_default();
    assert!(
        content_type.starts_with("text/plain") || content_type.starts_with("text/openmetrics"),
        "content-type of /metrics: {content_type:?}"
    );
    parse_metrics(&resp.text())
}

/// `GET /metrics`, parsed.
pub fn metrics(lk: &Latchkey) -> Metrics {
    metrics_with(lk, &[])
}

/// Runs the Python parser on `text`; panics with its complaint if it does not parse.
pub fn parse_metrics(text: &str) -> Metrics {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/parse_metrics.py"
    );
    let mut child = Command::new(toolchain::python())
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn parse_metrics.py");
    let mut stdin = child.stdin.take().expect("stdin");
    let input = text.to_string();
    let writer = thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let out = child.wait_with_output().expect("parse_metrics.py output");
    let _ = writer.join();
    assert!(
        out.status.success(),
        "/metrics does not parse with prometheus_client: {}\n--- exposition ---\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("parse_metrics.py JSON");
    let families = v["families"]
        .as_array()
        .expect("families")
        .iter()
        .map(|f| Family {
            name: f["name"].as_str().expect("name").to_string(),
            kind: f["type"].as_str().expect("type").to_string(),
            samples: f["samples"]
                .as_array()
                .expect("samples")
                .iter()
                .map(|s| Sample {
                    name: s["name"].as_str().expect("sample name").to_string(),
                    labels: s["labels"]
                        .as_object()
                        .expect("labels")
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_str().expect("label").to_string()))
                        .collect(),
                    value: match &s["value"] {
                        Value::Number(n) => n.as_f64().expect("number"),
                        Value::String(s) if s == "+Inf" => f64::INFINITY,
                        Value::String(s) if s == "-Inf" => f64::NEG_INFINITY,
                        _ => f64::NAN,
                    },
                })
                .collect(),
        })
        .collect();
    Metrics {
        families,
        text: text.to_string(),
    }
}

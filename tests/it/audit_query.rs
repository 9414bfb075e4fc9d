//! Reading the audit log back: `latchkey audit query` and `latchkey audit summary` run as the
//! real binary over logs a real latchkey wrote (two identities, allowed and denied requests, a
//! secret injected), over a rotated set of segments, and over hand-made logs where a request
//! has only its decision record or a line is damaged. Every expectation is checked against the
//! records in the file, read here independently of the code under test.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::support::clients::{dial, read_response};
use crate::support::{curl, latchkey, run_cli, CliOutput, Latchkey, TestCa, Upstream, PINNED};

const TOKEN_CI: &str = "tok-ci-q7d1e0b9a4c2f8e6";
const TOKEN_LAB: &str = "tok-lab-q3a8c6e2d0b4f1a9";
const GH: &str = "ghs_QUERYtestTOKEN9f8e7d6c5b";
const LONG: &str = "/v1/repos/some-organisation/some-repository/issues/12345/comments/67890";

fn policy(port: u16) -> String {
    format!(
        r#"
[secrets.gh]
source = "env:LK_QUERY_GH"

[[rules]]
name    = "api"
hosts   = ["api.test"]
ports   = [{port}]
methods = ["GET"]
paths   = ["/v1/**"]
[rules.inject.headers]
authorization = "Bearer {{{{secret.gh}}}}"

[[rules]]
name  = "other"
hosts = ["other.test", "a.wild.test"]
ports = [{port}]

[identities.ci]
token  = "env:LK_TOKEN_CI"
rules  = ["api"]
labels = {{ env = "ci", owner = "team-a" }}

[identities.lab]
token = "env:LK_TOKEN_LAB"
rules = ["other"]
"#
    )
}

/// A latchkey that served nine requests: `ci` three allowed (a secret injected in each) and
/// three denied, `lab` two allowed and one denied.
struct Traffic {
    lk: Latchkey,
    _up: Upstream,
    _ca: TestCa,
}

impl Traffic {
    fn audit(&self) -> PathBuf {
        self.lk.scratch().join("audit.jsonl")
    }

    /// `latchkey audit query AUDIT ARGS...`
    fn query(&self, args: &[&str]) -> CliOutput {
        query(&[self.audit().to_str().expect("utf-8 path")], args)
    }

    /// The ids of the outcome records that pass `keep`, in the file's order.
    fn ids(&self, keep: impl Fn(&Value) -> bool) -> Vec<String> {
        self.lk
            .audit_records()
            .iter()
            .filter(|r| keep(r))
            .map(|r| r["id"].as_str().expect("id").to_string())
            .collect()
    }
}

fn traffic() -> Traffic {
    let ca = TestCa::new();
    let up = Upstream::https(&ca);
    let mut b = latchkey()
        .upstream_ca(&ca)
        .env("LK_TOKEN_CI", TOKEN_CI)
        .env("LK_TOKEN_LAB", TOKEN_LAB)
        .env("LK_QUERY_GH", GH)
        .policy("main.toml", &policy(up.port()));
    for host in PINNED {
        b = b.pin(host);
    }
    let lk = b.run();
    let port = up.port();
    let send = |who: &str, method: &str, host: &str, path: &str| {
        let token = if who == "ci" { TOKEN_CI } else { TOKEN_LAB };
        let out = curl(&lk)
            .args([
                "--proxy-user",
                &format!("{who}:{token}"),
                "-X",
                method,
                &format!("https://{host}:{port}{path}"),
            ])
            .run();
        out.response.status
    };
    assert_eq!(send("ci", "GET", "api.test", "/v1/one"), 200);
    assert_eq!(send("ci", "GET", "api.test", "/v1/two?token=abc"), 200);
    assert_eq!(send("ci", "GET", "api.test", LONG), 200);
    assert_eq!(send("ci", "POST", "api.test", "/v1/post"), 403);
    assert_eq!(send("ci", "GET", "api.test", "/v2/x"), 403);
    assert_eq!(send("ci", "GET", "other.test", "/x"), 403);
    assert_eq!(send("lab", "GET", "other.test", "/y"), 200);
    assert_eq!(send("lab", "GET", "a.wild.test", "/z"), 200);
    assert_eq!(send("lab", "GET", "api.test", "/v1/one"), 403);
    lk.wait_audit(9);
    Traffic {
        lk,
        _up: up,
        _ca: ca,
    }
}

fn query(files: &[&str], args: &[&str]) -> CliOutput {
    let mut all = vec!["audit", "query"];
    all.extend_from_slice(files);
    all.extend_from_slice(args);
    run_cli(all)
}

fn summary(files: &[&str], args: &[&str]) -> CliOutput {
    let mut all = vec!["audit", "summary"];
    all.extend_from_slice(files);
    all.extend_from_slice(args);
    run_cli(all)
}

/// The ids of a jsonl answer, after checking it ran clean.
fn ids_of(out: &CliOutput) -> Vec<String> {
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(out.stderr.is_empty(), "{out:#?}");
    out.stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            v["id"].as_str().expect("id").to_string()
        })
        .collect()
}

#[test]
fn each_query_filter_selects_exactly_the_requests_it_names_and_filters_combine() {
    let t = traffic();
    let all = t.ids(|_| true);
    assert_eq!(all.len(), 9);
    let jsonl = ["--format", "jsonl"];
    let q = |args: &[&str]| ids_of(&t.query(&[&jsonl[..], args].concat()));
    let s = |r: &Value, k: &str, v: &str| r[k] == v;

    assert_eq!(q(&[]), all, "one row per request, in the log's order");
    let ci = q(&["--identity", "ci"]);
    assert_eq!(ci.len(), 6);
    assert_eq!(ci, t.ids(|r| s(r, "identity", "ci")));
    let lab_allowed = q(&["--identity", "lab", "--decision", "allow"]);
    assert_eq!(lab_allowed.len(), 2);
    assert_eq!(
        lab_allowed,
        t.ids(|r| s(r, "identity", "lab") && s(r, "decision", "allow"))
    );
    let denied = q(&["--decision", "deny"]);
    assert_eq!(denied.len(), 4);
    assert_eq!(denied, t.ids(|r| s(r, "decision", "deny")));
    let not_allowed = q(&["--reason", "identity_not_allowed"]);
    assert_eq!(not_allowed.len(), 2);
    assert_eq!(
        not_allowed,
        t.ids(|r| s(r, "reason", "identity_not_allowed"))
    );
    assert_eq!(q(&["--reason", "method_not_allowed"]).len(), 1);
    let api = q(&["--rule", "api"]);
    assert!(api.len() >= 3, "the three allowed by api at least: {api:?}");
    assert_eq!(api, t.ids(|r| s(r, "rule", "api")));
    assert_eq!(q(&["--rule", "other"]), t.ids(|r| s(r, "rule", "other")));
    assert_eq!(q(&["--host", "*.test"]), all);
    let wild = q(&["--host", "*.wild.test"]);
    assert_eq!(wild, t.ids(|r| s(r, "host", "a.wild.test")));
    assert_eq!(wild.len(), 1);
    assert_eq!(q(&["--host", "OTHER.test"]).len(), 2);
    assert_eq!(q(&["--host", "*.other.test"]), Vec::<String>::new());
    let combined = q(&[
        "--identity",
        "ci",
        "--decision",
        "deny",
        "--host",
        "api.test",
    ]);
    assert_eq!(combined.len(), 2, "the POST and the path outside /v1/");
    assert_eq!(
        combined,
        t.ids(|r| s(r, "identity", "ci") && s(r, "decision", "deny") && s(r, "host", "api.test"))
    );

    // Time: relative, and an RFC 3339 cut at the fourth request's arrival.
    assert_eq!(q(&["--since", "1h"]), all);
    assert_eq!(q(&["--until", "1h"]), Vec::<String>::new());
    let records = t.lk.audit_records();
    let cut = records[3]["ts"].as_str().expect("ts").to_string();
    let at = |r: &Value| humantime::parse_rfc3339(r["ts"].as_str().expect("ts")).expect("ts");
    let cut_at = humantime::parse_rfc3339(&cut).expect("cut");
    let since = q(&["--since", &cut]);
    assert!(since.len() >= 6 && since.len() < 9, "{since:?}");
    assert_eq!(since, t.ids(|r| at(r) >= cut_at));
    assert_eq!(q(&["--until", &cut]), t.ids(|r| at(r) < cut_at));

    // Phases: every decision record (one per allowed request), every outcome, every line.
    let decisions: Vec<String> =
        t.lk.decision_records()
            .iter()
            .map(|r| r["id"].as_str().expect("id").to_string())
            .collect();
    assert_eq!(decisions.len(), 5);
    assert_eq!(q(&["--phase", "decision"]), decisions);
    assert_eq!(q(&["--phase", "outcome"]), all);
    let every = t.query(&["--format", "jsonl", "--phase", "any"]);
    assert_eq!(every.code(), Some(0), "{every:#?}");
    let stored: Vec<String> = std::fs::read_to_string(t.audit())
        .expect("audit")
        .lines()
        .filter(|l| !l.contains("\"checkpoint\":"))
        .map(str::to_string)
        .collect();
    assert_eq!(stored.len(), 14);
    assert_eq!(
        every.stdout.lines().collect::<Vec<_>>(),
        stored,
        "jsonl prints the lines exactly as stored"
    );

    assert_eq!(q(&["--limit", "2"]), all[..2]);
    assert_eq!(q(&["--identity", "lab", "--limit", "1"]), all[6..7]);
    assert!(
        !every.stdout.contains(GH) && !every.stdout.contains(TOKEN_CI),
        "a secret value in a query's output:\n{}",
        every.stdout
    );
}

/// `line` split into the table's cells (two or more spaces apart), with where each starts.
fn cells(line: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let start = i;
        while i < chars.len() && !(chars[i] == ' ' && chars.get(i + 1) == Some(&' ')) {
            i += 1;
        }
        out.push((start, chars[start..i].iter().collect()));
        while i < chars.len() && chars[i] == ' ' {
            i += 1;
        }
    }
    out
}

#[test]
fn the_table_aligns_its_columns_shows_redacted_queries_and_cuts_long_paths() {
    let t = traffic();
    let out = t.query(&["--identity", "ci"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 7, "a header and six rows:\n{}", out.stdout);
    let header = cells(lines[0]);
    let names: Vec<&str> = header.iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!(
        names,
        [
            "TS", "PHASE", "IDENTITY", "DECISION", "REASON", "METHOD", "HOST", "PATH", "STATUS",
            "RULE"
        ]
    );
    let records: Vec<Value> =
        t.lk.audit_records()
            .into_iter()
            .filter(|r| r["identity"] == "ci")
            .collect();
    let text = |v: &Value| match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    for (line, r) in lines[1..].iter().zip(&records) {
        let row = cells(line);
        assert_eq!(row.len(), header.len(), "{line}");
        for ((at, cell), (hat, name)) in row.iter().zip(&header) {
            assert_eq!(at, hat, "column {name} is not aligned:\n{}", out.stdout);
            let _ = cell;
        }
        let path = text(&r["path"]);
        let shown_path = if path.chars().count() > 48 {
            format!("{}…", path.chars().take(47).collect::<String>())
        } else {
            path.clone()
        };
        let want = [
            text(&r["ts"]),
            "outcome".to_string(),
            "ci".to_string(),
            text(&r["decision"]),
            text(&r["reason"]),
            text(&r["method"]),
            text(&r["host"]),
            shown_path,
            text(&r["status"]),
            text(&r["rule"]),
        ];
        let got: Vec<String> = row.into_iter().map(|(_, c)| c).collect();
        assert_eq!(got, want, "{line}");
    }
    let paths: Vec<String> = lines[1..].iter().map(|l| cells(l)[7].1.clone()).collect();
    assert_eq!(paths[0], "/v1/one");
    assert_eq!(paths[1], "/v1/two?token=REDACTED");
    assert_eq!(paths[2], format!("{}…", &LONG[..47]));
    assert_eq!(cells(lines[3])[8].1, "200");
}

#[test]
fn the_summary_counts_each_identitys_requests_denials_hosts_secrets_and_bytes() {
    let t = traffic();
    let records = t.lk.audit_records();
    let of =
        |who: &str| -> Vec<&Value> { records.iter().filter(|r| r["identity"] == who).collect() };
    let sum = |rs: &[&Value], k: &str| rs.iter().map(|r| r[k].as_u64().expect(k)).sum::<u64>();
    let seen = |rs: &[&Value]| {
        let mut ts: Vec<&str> = rs.iter().map(|r| r["ts"].as_str().expect("ts")).collect();
        ts.sort();
        (ts[0].to_string(), ts[ts.len() - 1].to_string())
    };
    let labels = |rs: &[&Value]| {
        rs.iter()
            .rev()
            .find_map(|r| r["labels"].as_object().filter(|m| !m.is_empty()))
            .map(|m| {
                let parts: Vec<String> = m
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().expect("label")))
                    .collect();
                format!("  {}", parts.join(" "))
            })
            .unwrap_or_default()
    };
    let (ci, lab) = (of("ci"), of("lab"));
    assert!(sum(&ci, "bytes_down") > 0 && sum(&lab, "bytes_down") > 0);
    let (ci_first, ci_last) = seen(&ci);
    let (lab_first, lab_last) = seen(&lab);
    let want = format!(
        "9 requests from 2 identities in 1 file

ci{ci_labels}
  seen       {ci_first} .. {ci_last}
  requests   6: 3 allowed, 3 denied
  denied     identity_not_allowed 1, method_not_allowed 1, path_not_allowed 1
  hosts      api.test 3
  secrets    gh 3
  bytes      up {ci_up}, down {ci_down}

lab{lab_labels}
  seen       {lab_first} .. {lab_last}
  requests   3: 2 allowed, 1 denied
  denied     identity_not_allowed 1
  hosts      a.wild.test 1, other.test 1
  bytes      up {lab_up}, down {lab_down}
",
        ci_labels = labels(&ci),
        lab_labels = labels(&lab),
        ci_up = sum(&ci, "bytes_up"),
        ci_down = sum(&ci, "bytes_down"),
        lab_up = sum(&lab, "bytes_up"),
        lab_down = sum(&lab, "bytes_down"),
    );
    let audit = t.audit();
    let path = audit.to_str().expect("utf-8 path");
    let out = summary(&[path], &[]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert_eq!(out.stdout, want);

    let out = summary(&[path], &["--format", "json"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let v: Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(v["requests"], 9);
    assert_eq!(v["files"], 1);
    assert_eq!(v["damaged_lines"], 0);
    assert_eq!(v["untracked_requests"], 0);
    let ids = v["identities"].as_array().expect("identities");
    assert_eq!(ids.len(), 2);
    let (j_ci, j_lab) = (&ids[0], &ids[1]);
    assert_eq!(j_ci["identity"], "ci");
    assert_eq!(j_ci["requests"], 6);
    assert_eq!(j_ci["allowed"], 3);
    assert_eq!(j_ci["denied"], 3);
    assert_eq!(j_ci["unfinished"], 0);
    assert_eq!(
        j_ci["denials"],
        serde_json::json!({"identity_not_allowed": 1, "method_not_allowed": 1, "path_not_allowed": 1})
    );
    assert_eq!(j_ci["hosts"], serde_json::json!({"api.test": 3}));
    assert_eq!(j_ci["secrets"], serde_json::json!({"gh": 3}));
    assert_eq!(j_ci["bytes_up"], sum(&ci, "bytes_up"));
    assert_eq!(j_ci["bytes_down"], sum(&ci, "bytes_down"));
    assert_eq!(j_ci["first_seen"], ci_first.as_str());
    assert_eq!(j_ci["last_seen"], ci_last.as_str());
    assert_eq!(j_ci["usage"], Value::Null);
    assert_eq!(j_lab["identity"], "lab");
    assert_eq!(
        j_lab["hosts"],
        serde_json::json!({"a.wild.test": 1, "other.test": 1})
    );
    assert_eq!(j_lab["secrets"], serde_json::json!({}));
    assert_eq!(
        j_lab["denials"],
        serde_json::json!({"identity_not_allowed": 1})
    );

    // Filters narrow the summary.
    let out = summary(&[path], &["--identity", "lab", "--format", "json"]);
    let v: Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(v["requests"], 3);
    assert_eq!(v["identities"].as_array().expect("identities").len(), 1);
    let out = summary(&[path], &["--until", "1h"]);
    assert_eq!(out.stdout, "0 requests from 0 identities in 1 file\n");
}

/// A hand-made chained log: `b` decided and finished, `a` decided and never finished (latchkey
/// was killed), `c` refused, `d` a model call with usage; a checkpoint between them.
fn hand_made(dir: &Path) -> PathBuf {
    let lines = [
        r#"{"seq":1,"prev":"0000","phase":"decision","ts":"2026-05-01T10:00:00.000Z","id":"a","identity":"ci","method":"GET","host":"api.test","path":"/v1/slow","decision":"allow","rule":"api","reason":"allowed","secrets":["gh"],"status":null,"bytes_up":0,"bytes_down":0,"labels":{"env":"ci"}}"#,
        r#"{"seq":2,"prev":"1111","phase":"decision","ts":"2026-05-01T10:00:01.000Z","id":"b","identity":"ci","method":"GET","host":"api.test","path":"/v1/fast","decision":"allow","rule":"api","reason":"allowed","secrets":["gh"],"status":null,"bytes_up":0,"bytes_down":0}"#,
        r#"{"seq":3,"prev":"2222","phase":"outcome","ts":"2026-05-01T10:00:01.000Z","id":"b","identity":"ci","method":"GET","host":"api.test","path":"/v1/fast","decision":"allow","rule":"api","reason":"allowed","secrets":["gh"],"status":200,"bytes_up":120,"bytes_down":900}"#,
        r#"{"seq":4,"prev":"3333","checkpoint":{"ts":"2026-05-01T10:00:02.000Z","records":3,"last":"3333","key":"ed25519:x","sig":"y"}}"#,
        r#"{"seq":5,"prev":"4444","phase":"outcome","ts":"2026-05-01T10:00:03.000Z","id":"c","identity":"ci","method":"DELETE","host":"api.test","path":"/v1/x","decision":"deny","rule":null,"reason":"method_not_allowed","secrets":[],"status":403,"bytes_up":0,"bytes_down":0}"#,
        r#"{"seq":6,"prev":"5555","phase":"decision","ts":"2026-05-01T10:00:04.000Z","id":"d","identity":"ci","method":"POST","host":"api.openai.test","path":"/v1/chat","decision":"allow","rule":"llm","reason":"allowed","secrets":["openai"],"status":null,"bytes_up":0,"bytes_down":0}"#,
        r#"{"seq":7,"prev":"6666","phase":"outcome","ts":"2026-05-01T10:00:04.000Z","id":"d","identity":"ci","method":"POST","host":"api.openai.test","path":"/v1/chat","decision":"allow","rule":"llm","reason":"allowed","secrets":["openai"],"status":200,"bytes_up":300,"bytes_down":700,"usage":{"provider":"openai","model":"gpt-test","input_tokens":40,"output_tokens":12,"cached_input_tokens":8,"cost":0.00125,"source":"response"},"labels":{"env":"ci","owner":"team-a"}}"#,
    ];
    let path = dir.join("audit.jsonl");
    std::fs::write(&path, format!("{}\n", lines.join("\n"))).expect("write log");
    path
}

#[test]
fn a_request_with_only_its_decision_record_shows_as_a_decision_row_after_the_finished_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = hand_made(dir.path());
    let path = log.to_str().expect("utf-8 path");
    let stored: Vec<String> = std::fs::read_to_string(&log)
        .expect("log")
        .lines()
        .map(str::to_string)
        .collect();

    let out = query(&[path], &["--format", "jsonl"]);
    assert_eq!(ids_of(&out), ["b", "c", "d", "a"]);
    let printed: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(printed[3], stored[0], "the decision record, as written");
    assert_eq!(printed[0], stored[2]);

    let table = query(&[path], &[]);
    assert_eq!(table.code(), Some(0), "{table:#?}");
    let rows: Vec<Vec<String>> = table
        .stdout
        .lines()
        .skip(1)
        .map(|l| cells(l).into_iter().map(|(_, c)| c).collect())
        .collect();
    let phases: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r[1].as_str(), r[7].as_str()))
        .collect();
    assert_eq!(
        phases,
        [
            ("outcome", "/v1/fast"),
            ("outcome", "/v1/x"),
            ("outcome", "/v1/chat"),
            ("decision", "/v1/slow")
        ]
    );
    assert_eq!(rows[3][8], "-", "no status: the request never finished");
    assert_eq!(rows[1][9], "-", "no rule");

    assert_eq!(
        ids_of(&query(
            &[path],
            &["--format", "jsonl", "--phase", "decision"]
        )),
        ["a", "b", "d"]
    );
    assert_eq!(
        ids_of(&query(
            &[path],
            &["--format", "jsonl", "--phase", "outcome"]
        )),
        ["b", "c", "d"]
    );
    assert_eq!(
        ids_of(&query(
            &[path],
            &[
                "--format",
                "jsonl",
                "--since",
                "2026-05-01T10:00:01Z",
                "--until",
                "2026-05-01T12:00:04+02:00"
            ]
        )),
        ["b", "c"],
        "since inclusive, until exclusive, an offset applied"
    );

    let out = summary(&[path], &[]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert_eq!(
        out.stdout,
        "4 requests from 1 identity in 1 file

ci  env=ci owner=team-a
  seen       2026-05-01T10:00:00.000Z .. 2026-05-01T10:00:04.000Z
  requests   4: 3 allowed (1 without an outcome record), 1 denied
  denied     method_not_allowed 1
  hosts      api.test 2, api.openai.test 1
  secrets    gh 2, openai 1
  bytes      up 420, down 1600
  usage      1 call, 40 input tokens (8 cached), 12 output tokens, $0.001250
"
    );
    let out = summary(&[path], &["--format", "json"]);
    let v: Value = serde_json::from_str(&out.stdout).expect("json");
    let ci = &v["identities"][0];
    assert_eq!(ci["unfinished"], 1);
    assert_eq!(
        ci["usage"],
        serde_json::json!({"calls": 1, "input_tokens": 40, "cached_input_tokens": 8, "output_tokens": 12, "cost": 0.00125})
    );
    assert_eq!(
        ci["labels"],
        serde_json::json!({"env": "ci", "owner": "team-a"})
    );
}

#[test]
fn a_damaged_line_is_named_with_its_file_and_line_the_rest_is_read_and_the_exit_code_is_2() {
    let t = traffic();
    let mut lines: Vec<String> = std::fs::read_to_string(t.audit())
        .expect("audit")
        .lines()
        .map(str::to_string)
        .collect();
    let whole = lines.len();
    let dir = tempfile::tempdir().expect("tempdir");
    let damaged = dir.path().join("audit.jsonl");
    lines.insert(2, "this is not json".to_string());
    lines.insert(
        5,
        r#"{"seq":99,"prev":"x","ts":"2026-05-01T10:00:00Z"}"#.to_string(),
    );
    let torn = lines[whole].clone();
    let mut text = format!("{}\n", lines.join("\n"));
    text.push_str(&torn[..torn.len() / 2]);
    std::fs::write(&damaged, text).expect("write");
    let name = damaged.display().to_string();

    let out = query(&[&name], &["--format", "jsonl"]);
    assert_eq!(out.code(), Some(2), "{out:#?}");
    let got: Vec<String> = out
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).expect("json")["id"]
                .as_str()
                .expect("id")
                .to_string()
        })
        .collect();
    assert_eq!(got, t.ids(|_| true), "every whole record is still read");
    assert!(
        out.stderr.contains(&format!("{name}:3: not JSON")),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains(&format!("{name}:6: not an audit record: no `id`")),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!("{name}:{}: torn", whole + 3)),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("3 damaged lines skipped"),
        "{}",
        out.stderr
    );

    let out = summary(&[&name], &["--format", "json"]);
    assert_eq!(out.code(), Some(2), "{out:#?}");
    let v: Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(v["requests"], 9);
    assert_eq!(v["damaged_lines"], 3);
    assert!(
        out.stderr.contains(&format!("{name}:3: not JSON")),
        "{}",
        out.stderr
    );
}

#[test]
fn bad_filters_are_refused_naming_the_flag_and_the_value() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = hand_made(dir.path());
    let path = log.to_str().expect("utf-8 path");
    let cases: [(&[&str], &[&str]); 4] = [
        (
            &["--reason", "no_such_reason"],
            &[
                "--reason",
                "no_such_reason",
                "unknown reason code",
                "method_not_allowed",
            ],
        ),
        (
            &["--since", "yesterday"],
            &["--since", "yesterday", "RFC 3339"],
        ),
        (&["--until", "2026-13-40"], &["--until", "2026-13-40"]),
        (
            &["--host", "https://api.test/"],
            &["--host", "https://api.test/", "without a scheme"],
        ),
    ];
    for (args, needles) in cases {
        let out = query(&[path], args);
        assert_eq!(out.code(), Some(2), "{args:?}: {out:#?}");
        assert!(out.stdout.is_empty(), "{out:#?}");
        for n in needles {
            assert!(
                out.stderr.contains(n),
                "{args:?}: {n:?} not in {}",
                out.stderr
            );
        }
    }
    let out = summary(&[path], &["--since", "soon"]);
    assert_eq!(out.code(), Some(2), "{out:#?}");
    assert!(
        out.stderr.contains("--since") && out.stderr.contains("soon"),
        "{}",
        out.stderr
    );
    let missing = dir.path().join("nothing.jsonl");
    let out = query(&[missing.to_str().expect("utf-8")], &[]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("cannot read") && out.stderr.contains("nothing.jsonl"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_rotated_log_is_read_across_its_segments_in_chain_order_however_the_files_are_given() {
    let up = Upstream::http();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut lk = latchkey()
        .pin("api.test")
        .audit_to(&dir.path().join("audit.jsonl"))
        .arg("--audit-rotate")
        .arg("1KiB")
        .policy(
            "main.toml",
            &format!(
                "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{}]\n",
                up.port()
            ),
        )
        .run();
    let port = up.port();
    for i in 0..12 {
        let mut tcp = dial(lk.addr());
        let req = format!(
            "GET http://api.test:{port}/r/{i} HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n"
        );
        tcp.write_all(req.as_bytes()).expect("send");
        assert_eq!(
            read_response(&mut tcp, false).expect("response").status,
            200
        );
    }
    lk.signal("TERM");
    assert!(lk
        .wait_exit(Duration::from_secs(15))
        .expect("exits")
        .success());

    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 4,
        "the log rotated into several segments: {files:?}"
    );
    let want: Vec<String> = (0..12).map(|i| format!("/r/{i}")).collect();
    let paths = |out: &CliOutput| -> Vec<String> {
        assert_eq!(out.code(), Some(0), "{out:#?}");
        out.stdout
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).expect("json")["path"]
                    .as_str()
                    .expect("path")
                    .to_string()
            })
            .collect()
    };
    let d = dir.path().to_str().expect("utf-8");
    assert_eq!(paths(&query(&[d], &["--format", "jsonl"])), want);
    // The files named one by one, newest first: still chain order.
    let reversed: Vec<String> = files
        .iter()
        .rev()
        .map(|p| p.display().to_string())
        .collect();
    let reversed: Vec<&str> = reversed.iter().map(String::as_str).collect();
    assert_eq!(paths(&query(&reversed, &["--format", "jsonl"])), want);
    let records: usize = files
        .iter()
        .map(|f| {
            std::fs::read_to_string(f)
                .expect("segment")
                .lines()
                .filter(|l| !l.contains("\"checkpoint\":"))
                .count()
        })
        .sum();
    assert_eq!(records, 24, "a decision and an outcome per request");
    let any = query(&[d], &["--format", "jsonl", "--phase", "any"]);
    assert_eq!(any.stdout.lines().count(), 24);
    let out = summary(&[d], &[]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(
        out.stdout.starts_with(&format!(
            "12 requests from 1 identity in {} files\n",
            files.len()
        )),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("  hosts      api.test 12\n"),
        "{}",
        out.stdout
    );
}

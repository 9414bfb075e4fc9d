//! A placeholder or a secret value cut across the boundaries of a streamed request body is found
//! all the same, and the upstream never receives it (nor the start of it): HTTP/2 DATA frames
//! (a hyper client writing each frame as the test says, one byte per frame included, and curl
//! `--http2`), HTTP/1.1 chunks (curl), the switch from the part of a body read before dialing
//! to the part that streams behind it, a JSON-escaped placeholder, and the 8 MiB edge of what
//! latchkey holds whole for a rule with body placeholders.
//!
//! (The Python clients' venv has no `h2`, so the h2 frame-by-frame client is hyper's.)

use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;
use serde_json::json;

use crate::request_streaming::{curl_upload, h2_through, runtime, wait_upstream, Frames};
use crate::support::assert_record;
use crate::support::secrets::{contains, env_secrets_world, SecretsWorld, MAPS, OPENAI};

const RULES: &str = r#"
# Binds openai and replaces its placeholder in bodies it holds whole (up to 8 MiB).
[[rules]]
name         = "api"
hosts        = ["api.test"]
ports        = [PORT]
secrets      = ["openai"]
placeholders = ["body"]

# Binds nothing.
[[rules]]
name  = "other"
hosts = ["other.test"]
ports = [PORT]
"#;

/// A body's DATA frames, each sent after its pause.
type Paced = Vec<(Duration, Bytes)>;

const PLACEHOLDER: &str = "__LATCHKEY_openai__";
const MIB: usize = 1024 * 1024;

fn world() -> SecretsWorld {
    env_secrets_world(&["openai", "maps"], RULES)
}

/// `POST https://authority/path` over h2 with one DATA frame per part, each sent after its
/// pause; returns the status, the reason header and the body text.
async fn h2_paced(
    w: &SecretsWorld,
    authority: &str,
    path: &str,
    parts: Paced,
) -> (u16, Option<String>, String) {
    let mut sender = h2_through(&w.lk, authority).await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let req = http::Request::post(format!("https://{authority}{path}"))
        .header("content-type", "application/json")
        .body(Frames(rx))
        .expect("request");
    let feed = tokio::spawn(async move {
        for (pause, data) in parts {
            tokio::time::sleep(pause).await;
            if tx.send(Frame::data(data)).await.is_err() {
                return;
            }
        }
    });
    let res = tokio::time::timeout(Duration::from_secs(60), sender.send_request(req))
        .await
        .expect("an answer in time")
        .expect("a response");
    feed.abort();
    let status = res.status().as_u16();
    let reason = res
        .headers()
        .get("x-latchkey-reason")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = res
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    (status, reason, String::from_utf8_lossy(&body).into_owned())
}

/// One part per byte of `text`.
fn bytewise(text: &str) -> Paced {
    text.bytes()
        .map(|b| (Duration::ZERO, Bytes::from(vec![b])))
        .collect()
}

fn now(text: impl Into<Vec<u8>>) -> (Duration, Bytes) {
    (Duration::ZERO, Bytes::from(text.into()))
}

/// Asserts that what the upstream got at `path` (if anything) holds no part of the needle
/// (`start`: its first bytes) and never ended cleanly.
fn assert_never_received(w: &SecretsWorld, what: &str, path: &str, start: &[u8]) {
    for seen in w.received(path) {
        assert!(
            !contains(&seen.body, start),
            "{what}: the upstream received {:?}",
            String::from_utf8_lossy(start)
        );
        assert!(!seen.complete, "{what}: the upstream request completed");
    }
}

#[test]
fn a_placeholder_or_secret_split_across_h2_data_frames_never_reaches_an_unbound_host() {
    let w = world();
    let rt = runtime();
    let authority = format!("other.test:{}", w.port());
    // Past the 64 KiB latchkey holds before dialing: the body streams through the detector.
    let pad = format!("{{\"pad\":\"{}\",\"k\":\"", "p".repeat(100_000));
    // Cut inside the prefix `__LATCHKEY_`: neither frame holds it whole.
    let (ph_a, ph_b) = PLACEHOLDER.split_at(6);
    let (sk_a, sk_b) = OPENAI.split_at(10);
    let escaped: String = PLACEHOLDER[..2]
        .bytes()
        .map(|b| format!("\\u{b:04x}"))
        .collect();
    let cases: Vec<(&str, Paced, &str, &[u8])> = vec![
        (
            "a placeholder across two DATA frames",
            vec![now(format!("{pad}{ph_a}")), now(format!("{ph_b}\"}}"))],
            "placeholder_not_bound",
            b"__LATCH",
        ),
        (
            "a placeholder cut after its first 2 bytes, far into a DATA frame",
            vec![
                now(format!("{pad}{}", &PLACEHOLDER[..2])),
                now(format!("{}\"}}", &PLACEHOLDER[2..])),
            ],
            "placeholder_not_bound",
            b"__",
        ),
        (
            "a placeholder cut one byte short of its prefix",
            vec![
                now(format!("{pad}{}", &PLACEHOLDER[..10])),
                now(format!("{}\"}}", &PLACEHOLDER[10..])),
            ],
            "placeholder_not_bound",
            b"__LATCH",
        ),
        (
            "a placeholder one byte per DATA frame",
            [
                vec![now(pad.clone())],
                bytewise(PLACEHOLDER),
                vec![now("\"}")],
            ]
            .concat(),
            "placeholder_not_bound",
            b"__LATCH",
        ),
        (
            "a JSON-escaped placeholder across two DATA frames",
            vec![
                now(format!("{pad}{escaped}LATCH")),
                now(format!("{}\"}}", &PLACEHOLDER[7..])),
            ],
            "placeholder_not_bound",
            b"LATCH",
        ),
        (
            "a secret across two DATA frames",
            vec![now(format!("{pad}{sk_a}")), now(format!("{sk_b}\"}}"))],
            "secret_value_unbound",
            sk_a.as_bytes(),
        ),
        (
            "a secret one byte per DATA frame",
            [vec![now(pad.clone())], bytewise(OPENAI), vec![now("\"}")]].concat(),
            "secret_value_unbound",
            &OPENAI.as_bytes()[..4],
        ),
        (
            // Small, but its second half comes late: the first is read before dialing, the
            // rest streams behind it.
            "a placeholder across the part read before dialing and the part that streams",
            vec![
                now(format!("{{\"k\":\"{ph_a}")),
                (
                    Duration::from_millis(600),
                    Bytes::from(format!("{ph_b}\"}}")),
                ),
            ],
            "placeholder_not_bound",
            b"__LATCH",
        ),
    ];
    for (i, (what, parts, reason, start)) in cases.iter().enumerate() {
        let path = format!("/split/{i}");
        let (status, got, body) = rt.block_on(h2_paced(&w, &authority, &path, parts.clone()));
        w.saw(what, body.as_bytes());
        assert_eq!(
            (status, got.as_deref()),
            (403, Some(*reason)),
            "{what}: {body}"
        );
        assert_never_received(&w, what, &path, start);
    }
    let records = w.lk.wait_audit(cases.len());
    for (record, (_, _, reason, _)) in records.iter().zip(&cases) {
        assert_record(
            record,
            json!({"rule": "other", "decision": "deny", "reason": reason, "status": 403}),
        );
    }
    w.sweep();
}

#[test]
fn a_placeholder_split_across_curl_upload_chunks_is_refused_h1_chunked_and_h2() {
    let w = world();
    let clean = "c".repeat(300_000);
    let (a, b) = PLACEHOLDER.split_at(4);
    for (i, flag) in ["--http1.1", "--http2"].iter().enumerate() {
        let path = format!("/upload/{i}");
        let mut up = curl_upload(&w.lk, flag, &w.url("other.test", &path));
        up.send(clean.as_bytes());
        wait_upstream(&w.upstream, &path, |r| r.body.len() >= clean.len() - 256);
        // The placeholder over two writes, cut inside its prefix, far into a chunk: its start
        // must not go on alone.
        up.send(format!("{}x:{a}", "d".repeat(5000)).as_bytes());
        std::thread::sleep(Duration::from_millis(150));
        up.send(format!("{b} rest:{}the-end", "e".repeat(100_000)).as_bytes());
        let (status, reason, body) = up.finish();
        w.saw(flag, body.as_bytes());
        assert_eq!(
            (status, reason.as_deref()),
            (403, Some("placeholder_not_bound")),
            "{flag}: {body}"
        );
        let what = format!("curl {flag}");
        assert_never_received(&w, &what, &path, b"__LATCH");
        assert!(!contains(&w.received_one(&path).body, b"the-end"), "{flag}");
    }
    let records = w.lk.wait_audit(2);
    for record in &records {
        assert_record(
            record,
            json!({"rule": "other", "decision": "deny", "reason": "placeholder_not_bound", "status": 403}),
        );
    }
    w.sweep();
}

/// A rule with body placeholders holds a body whole up to 8 MiB; a longer one streams, the
/// part already read going first. A value that straddles the 8 MiB frame edge, or the edge
/// between that part and the rest, is found.
#[test]
fn a_placeholder_or_secret_straddling_the_8_mib_edge_is_refused() {
    let w = world();
    let rt = runtime();
    let authority = format!("api.test:{}", w.port());
    let frame = 16 * 1024;
    let cases = [
        (
            "a placeholder across 8 MiB",
            PLACEHOLDER,
            8 * MIB - 5,
            "placeholder_not_bound",
        ),
        (
            "a placeholder across the held part's end",
            PLACEHOLDER,
            8 * MIB + frame - 7,
            "placeholder_not_bound",
        ),
        (
            "an unbound secret across 8 MiB",
            MAPS,
            8 * MIB - 9,
            "secret_value_unbound",
        ),
    ];
    for (i, (what, needle, at, reason)) in cases.iter().enumerate() {
        let mut body = vec![b'a'; *at];
        body.extend_from_slice(needle.as_bytes());
        body.extend_from_slice(&vec![b'b'; 4 * frame]);
        let parts: Paced = body
            .chunks(frame)
            .map(|c| (Duration::ZERO, Bytes::copy_from_slice(c)))
            .collect();
        let path = format!("/edge/{i}");
        let (status, got, text) = rt.block_on(h2_paced(&w, &authority, &path, parts));
        w.saw(what, text.as_bytes());
        assert_eq!(
            (status, got.as_deref()),
            (403, Some(*reason)),
            "{what}: {text}"
        );
        assert_never_received(&w, what, &path, &needle.as_bytes()[..5]);
    }
    let records = w.lk.wait_audit(cases.len());
    for (record, (_, _, _, reason)) in records.iter().zip(&cases) {
        assert_record(
            record,
            json!({"rule": "api", "decision": "deny", "reason": reason, "status": 403}),
        );
    }
    w.sweep();
}

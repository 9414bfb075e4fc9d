//! S3 uploads through SigV4 against an S3 implementation that verifies signatures:
//! `tests/clients/s3_moto.py` (moto's S3 in server mode, IAM authentication on, plus the
//! aws-chunked checks moto leaves out: chunk and trailer signatures, framing, decoded length,
//! checksum trailers). The sandbox runs real boto3 (default settings) with dummy keys through
//! latchkey, which holds the moto IAM user's real key. Every object must round-trip byte for
//! byte: 960 bytes, 9 MiB and a 20 MiB multipart upload, with flexible checksums on (boto3's
//! default: `STREAMING-UNSIGNED-PAYLOAD-TRAILER`, aws-chunked) and off, and the chunk-signed
//! streaming forms (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]`, built by the client since
//! boto3 does not send them). Malformed framing and chunks over latchkey's cap are refused
//! before anything is stored; the moto setup itself rejects a wrong signature (its own test).

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::assert_record;
use crate::support::credentials::{lists_secret, Bench, CredWorld, PyServer};
use crate::support::latchkey::{wait_with_timeout, SCRUBBED_ENV};
use crate::support::secrets::assert_refusal;

const MIB: usize = 1024 * 1024;
const BUCKET: &str = "lk-bucket";

/// The moto server's IAM user key.
fn keys(moto: &PyServer) -> (String, String) {
    let event = moto.wait_events("keys", 1)[0].clone();
    (
        event["access_key_id"].as_str().expect("akid").to_string(),
        event["secret_access_key"]
            .as_str()
            .expect("secret")
            .to_string(),
    )
}

struct S3 {
    w: CredWorld,
    moto: PyServer,
}

/// moto, and latchkey signing for `s3.test` with the moto user's key (`s3`, us-east-1).
fn s3_world() -> S3 {
    s3_world_with("", &[])
}

/// [`s3_world`] with more policy (`[secrets.*]` the `s3` rule does not bind) and the secret
/// environment it reads.
fn s3_world_with(extra: &str, env: &[(&str, &str)]) -> S3 {
    let bench = Bench::new();
    let moto = bench.server("s3_moto.py", &[]);
    let (akid, secret) = keys(&moto);
    let policy = format!(
        r#"
[credentials.s3]
kind = "aws_sigv4"
access_key_id = "env:TEST_AWS_AKID"
secret_access_key = "env:TEST_AWS_SECRET"
region = "us-east-1"
service = "s3"

[[rules]]
name = "s3"
hosts = ["s3.test"]
ports = [{port}]
credential = "s3"
{extra}"#,
        port = moto.port()
    );
    let mut secrets = vec![("TEST_AWS_SECRET", secret.as_str())];
    secrets.extend_from_slice(env);
    let w = bench.start_with(&policy, &secrets, &[("TEST_AWS_AKID", &akid)]);
    S3 { w, moto }
}

impl S3 {
    fn endpoint(&self) -> String {
        format!("https://s3.test:{}", self.moto.port())
    }

    /// `tests/clients/s3_boto3.py MODE ENDPOINT BUCKET ARGS...` through latchkey, dummy keys.
    fn boto(&self, mode: &str, args: &[&str]) -> Value {
        let endpoint = self.endpoint();
        let mut all = vec![mode, endpoint.as_str(), BUCKET];
        all.extend_from_slice(args);
        let out = self.w.python("s3_boto3.py", &all, &[]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("s3_boto3.py output ({e}): {out}"))
    }

    /// Uploads through latchkey and asserts the object came back byte for byte.
    fn round_trip(&self, what: &str, mode: &str, args: &[&str]) -> Value {
        let out = self.boto(mode, args);
        assert_eq!(
            out["ok"],
            true,
            "{what}: the object must round-trip byte for byte: {out:#}\nmoto: {:#?}\nlatchkey: {}",
            self.moto.events_of("request"),
            self.w.lk.stderr_text()
        );
        eprintln!("{what}: upload + read back in {} s", out["seconds"]);
        out
    }

    /// moto's record of each request for `path` (the object key path, query included).
    fn requests_for(&self, method: &str, prefix: &str) -> Vec<Value> {
        self.moto
            .events_of("request")
            .into_iter()
            .filter(|e| {
                e["method"] == method
                    && e["path"]
                        .as_str()
                        .is_some_and(|p| p.starts_with(&format!("/{BUCKET}/{prefix}")))
            })
            .collect()
    }

    /// Waits for `n` audit records and checks that each was signed with the credential and
    /// answered as `status` says.
    fn audited(&self, n: usize) -> Vec<Value> {
        let records = self.w.lk.wait_audit(n);
        for r in &records {
            assert_record(r, json!({"host": "s3.test", "rule": "s3"}));
            assert!(lists_secret(r, "credential:s3"), "{r:#}");
        }
        records
    }
}

/// What moto recorded about one upload request, asserted to have been accepted.
fn accepted(events: &[Value], form: &str, what: &str) {
    assert!(!events.is_empty(), "{what}: no upload reached moto");
    for e in events {
        assert_eq!(e["status"], 200, "{what}: moto refused: {e:#}");
        assert_eq!(e["content_sha256"], form, "{what}: {e:#}");
    }
}

#[test]
fn boto3_default_checksums_round_trip_small_large_and_multipart() {
    let s = s3_world();
    let started = Instant::now();
    let small = s.round_trip("960 bytes", "put", &["small.bin", "960", "when_supported"]);
    let nine = (9 * MIB).to_string();
    s.round_trip("9 MiB", "put", &["nine.bin", &nine, "when_supported"]);
    let twenty = (20 * MIB).to_string();
    let part = (8 * MIB).to_string();
    s.round_trip(
        "20 MiB in 8 MiB parts",
        "multipart",
        &["multi.bin", &twenty, &part, "when_supported"],
    );
    eprintln!(
        "checksums on: 960 B + 9 MiB + 20 MiB multipart (with GETs) in {:?}",
        started.elapsed()
    );
    assert_eq!(small["len_got"], 960);

    // boto3's default form arrived as such, its framing and CRC32 trailer checked by the
    // server, not stored as content.
    let form = "STREAMING-UNSIGNED-PAYLOAD-TRAILER";
    for (prefix, decoded) in [("small.bin", 960), ("nine.bin", 9 * MIB)] {
        let puts = s.requests_for("PUT", prefix);
        accepted(&puts, form, prefix);
        assert_eq!(puts[0]["decoded_length"], decoded, "{:#}", puts[0]);
        assert_eq!(puts[0]["content_encoding"], "aws-chunked", "{:#}", puts[0]);
        assert!(
            puts[0]["trailer"]["x-amz-checksum-crc32"].is_string(),
            "{:#}",
            puts[0]
        );
    }
    let parts = s.requests_for("PUT", "multi.bin?uploadId=");
    assert_eq!(parts.len(), 3, "{parts:#?}");
    accepted(&parts, form, "upload_part");
    // boto3 sends `Expect: 100-continue` on uploads; botocore never signs it, nor user-agent.
    let uploads = s.requests_for("PUT", "");
    assert!(
        uploads.iter().any(|e| e["expect"] == "100-continue"),
        "{uploads:#?}"
    );
    for e in &uploads {
        let signed = e["signed_headers"].as_array().expect("signed headers");
        for name in ["expect", "user-agent", "transfer-encoding"] {
            assert!(!signed.iter().any(|h| h == name), "{name} signed: {e:#}");
        }
        for name in [
            "host",
            "x-amz-date",
            "x-amz-content-sha256",
            "content-encoding",
        ] {
            assert!(signed.iter().any(|h| h == name), "{name} unsigned: {e:#}");
        }
    }
    // put, get, put, get, create, 3 parts, complete, get.
    let records = s.audited(10);
    for r in &records {
        assert_eq!(r["status"], 200, "{r:#}");
    }
    s.w.sweep();
}

#[test]
fn boto3_without_flexible_checksums_round_trips_small_large_and_multipart() {
    let s = s3_world();
    let started = Instant::now();
    let small = s.round_trip("960 bytes", "put", &["small.bin", "960", "when_required"]);
    let nine = (9 * MIB).to_string();
    s.round_trip("9 MiB", "put", &["nine.bin", &nine, "when_required"]);
    let twenty = (20 * MIB).to_string();
    let part = (8 * MIB).to_string();
    s.round_trip(
        "20 MiB in 8 MiB parts",
        "multipart",
        &["multi.bin", &twenty, &part, "when_required"],
    );
    eprintln!(
        "checksums off: 960 B + 9 MiB + 20 MiB multipart (with GETs) in {:?}",
        started.elapsed()
    );
    // boto3 hashes the body; latchkey signs the hash of what it sends when it holds the body
    // whole (within max_signed_body, 8 MiB by default), else UNSIGNED-PAYLOAD.
    let hash = small["sha256_sent"].as_str().expect("hash");
    accepted(&s.requests_for("PUT", "small.bin"), hash, "960 bytes");
    accepted(
        &s.requests_for("PUT", "nine.bin"),
        "UNSIGNED-PAYLOAD",
        "9 MiB",
    );
    let parts = s.requests_for("PUT", "multi.bin?uploadId=");
    assert_eq!(parts.len(), 3, "{parts:#?}");
    for p in &parts {
        assert_eq!(p["status"], 200, "{p:#}");
        assert_eq!(p["content_encoding"], Value::Null, "{p:#}");
    }
    let records = s.audited(10);
    for r in &records {
        assert_eq!(r["status"], 200, "{r:#}");
    }
    s.w.sweep();
}

#[test]
fn chunk_signed_uploads_are_re_signed_with_the_real_key_chunk_by_chunk() {
    let s = s3_world();
    let started = Instant::now();
    let k64 = (64 * 1024).to_string();
    // Plain form: many chunks and a short last one; -TRAILER form with a CRC32 trailer; a
    // 9 MiB upload in 1 MiB chunks (latchkey's cap); boto3's unsigned form built by hand.
    s.round_trip(
        "signed chunks",
        "chunk-signed",
        &["plain.bin", "300000", &k64, "plain"],
    );
    s.round_trip(
        "signed chunks and trailer",
        "chunk-signed",
        &["trailer.bin", "300000", &k64, "trailer"],
    );
    let nine = (9 * MIB).to_string();
    let one = MIB.to_string();
    s.round_trip(
        "9 MiB in 1 MiB signed chunks",
        "chunk-signed",
        &["nine.bin", &nine, &one, "trailer"],
    );
    s.round_trip(
        "unsigned trailer by hand",
        "chunk-signed",
        &["unsigned.bin", "100000", &k64, "unsigned-trailer"],
    );
    eprintln!(
        "chunk-signed: 300 kB ×2 + 9 MiB + 100 kB (with GETs) in {:?}",
        started.elapsed()
    );
    let plain = s.requests_for("PUT", "plain.bin");
    accepted(&plain, "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", "plain");
    // 300000 bytes in 64 KiB chunks: 5 data chunks and the final one, each signature checked.
    assert_eq!(plain[0]["chunks"], 6, "{:#}", plain[0]);
    let trailer = s.requests_for("PUT", "trailer.bin");
    accepted(
        &trailer,
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
        "trailer",
    );
    assert!(trailer[0]["trailer"]["x-amz-checksum-crc32"].is_string());
    let nine_put = s.requests_for("PUT", "nine.bin");
    accepted(
        &nine_put,
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
        "9 MiB",
    );
    assert_eq!(nine_put[0]["chunks"], 10, "{:#}", nine_put[0]);
    accepted(
        &s.requests_for("PUT", "unsigned.bin"),
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        "unsigned",
    );
    let records = s.audited(8);
    for r in &records {
        assert_eq!(r["status"], 200, "{r:#}");
    }
    s.w.sweep();
}

#[test]
fn bad_aws_chunked_framing_is_refused_and_nothing_is_stored() {
    let s = s3_world();
    let k64 = (64 * 1024).to_string();
    let cases: [(&str, &[&str], &str); 3] = [
        // The first chunk holds one byte more than its size line says.
        (
            "bad.bin",
            &["bad.bin", "200000", &k64, "malformed"],
            "no CRLF after its data",
        ),
        // Over latchkey's 1 MiB re-signing cap.
        (
            "huge.bin",
            &["huge.bin", "1100000", "1100000", "plain"],
            "at most 1048576 bytes",
        ),
        // The unsigned form promising a byte it never sends.
        (
            "short.bin",
            &["short.bin", "100000", &k64, "unsigned-short"],
            "x-amz-decoded-content-length says 100001",
        ),
    ];
    for (key, args, why) in cases {
        let out = s.boto("chunk-signed", args);
        assert_eq!(out["ok"], false, "{key}: {out:#}");
        assert_eq!(out["status"], 400, "{key}: {out:#}");
        let text = out["error"].as_str().unwrap_or_default();
        assert!(
            text.contains("bad_request") || text.contains("aws-chunked"),
            "{key}: {out:#}"
        );
        assert!(
            text.contains(why),
            "{key}: the refusal must say why: {out:#}"
        );
        let get = s.boto("get", &[key]);
        assert_eq!(get["status"], 404, "{key} was stored: {get:#}");
        assert!(
            s.requests_for("PUT", key)
                .iter()
                .all(|e| e["status"] != 200),
            "{key}: moto accepted it: {:#?}",
            s.moto.events_of("request")
        );
    }
    // Three refused uploads (and three GETs answered 404 by moto).
    let records = s.audited(6);
    let refused: Vec<&Value> = records.iter().filter(|r| r["method"] == "PUT").collect();
    assert_eq!(refused.len(), 3, "{records:#?}");
    for r in refused {
        assert_record(
            r,
            json!({"decision": "deny", "reason": "bad_request", "status": 400}),
        );
    }

    // A payload form latchkey does not sign is refused before the upstream (curl: no SDK
    // sends SigV4a through an HTTPS proxy by default).
    let resp = s.w.curl_ok(&[
        "-X",
        "PUT",
        "-H",
        "X-Amz-Content-SHA256: STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD",
        "--data-binary",
        "x",
        &format!("{}/{BUCKET}/ecdsa.bin", s.endpoint()),
    ]);
    assert_refusal(&resp, 400, "bad_request");
    assert!(resp.text().contains("SigV4a"), "{resp:#?}");
    // aws-chunked framing under a classic payload hash would be stored as the object.
    let resp = s.w.curl_ok(&[
        "-X",
        "PUT",
        "-H",
        "Content-Encoding: aws-chunked",
        "-H",
        "X-Amz-Content-SHA256: UNSIGNED-PAYLOAD",
        "--data-binary",
        "1\r\nx\r\n0\r\n\r\n",
        &format!("{}/{BUCKET}/mixed.bin", s.endpoint()),
    ]);
    assert_refusal(&resp, 400, "bad_request");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        s.requests_for("PUT", "ecdsa.bin").is_empty()
            && s.requests_for("PUT", "mixed.bin").is_empty(),
        "{:#?}",
        s.moto.events_of("request")
    );
    s.w.lk.wait_audit(8);
    s.w.sweep();
}

/// The server is only worth something if it rejects: boto3 straight to moto with the real key
/// passes, with a wrong secret fails; a chunk signed with another key fails though moto itself
/// would accept it (only the seed is moto's to check).
#[test]
fn the_moto_server_rejects_wrong_signatures_and_wrong_chunk_signatures() {
    let bench = Bench::new();
    let moto = bench.server("s3_moto.py", &[]);
    let (akid, secret) = keys(&moto);
    let endpoint = format!("https://localhost:{}", moto.port());
    let run = |secret: &str, args: &[&str]| -> Value {
        let mut cmd = Command::new(crate::support::toolchain::python());
        cmd.arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/s3_boto3.py"
        ))
        .arg(args[0])
        .arg(&endpoint)
        .arg(BUCKET)
        .args(&args[1..]);
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        cmd.env_remove("LATCHKEY_PROXY")
            .env("LATCHKEY_CA", bench.ca.pem_path())
            .env("SDK_AKID", &akid)
            .env("SDK_SECRET", secret);
        let out = wait_with_timeout(&mut cmd, Duration::from_secs(60));
        assert_eq!(out.code(), Some(0), "{out:#?}");
        serde_json::from_str(&out.stdout).expect("client output")
    };
    let good = run(&secret, &["put", "direct.bin", "960", "when_supported"]);
    assert_eq!(good["ok"], true, "{good:#}");
    let wrong = run(
        "not-the-secret",
        &["put", "wrong.bin", "960", "when_supported"],
    );
    assert_eq!(wrong["status"], 403, "{wrong:#}");
    assert!(
        wrong["error"]
            .as_str()
            .is_some_and(|e| e.contains("SignatureDoesNotMatch")),
        "{wrong:#}"
    );
    let chunks = run(
        &secret,
        &["chunk-signed", "c.bin", "200000", "65536", "trailer"],
    );
    assert_eq!(chunks["ok"], true, "{chunks:#}");
    let bad = run(
        &secret,
        &["chunk-signed", "c2.bin", "200000", "65536", "bad-chunk"],
    );
    assert_eq!(bad["status"], 403, "{bad:#}");
    assert!(
        bad["error"]
            .as_str()
            .is_some_and(|e| e.contains("chunk 1 signature does not match")),
        "{bad:#}"
    );
}

/// An aws-chunked body built here, every chunk signature (and the trailer's) a dummy: latchkey
/// must replace each one for moto's checker to accept it. Returns (body, framed).
fn framed_upload(len: usize, chunk: usize, signed: bool, trailer: bool) -> (Vec<u8>, Vec<u8>) {
    let data: Vec<u8> = (0..len).map(|i| (i * 131 % 251) as u8).collect();
    let dummy = "0".repeat(64);
    let mut out = Vec::new();
    let pieces: Vec<&[u8]> = data.chunks(chunk).chain([&[][..]]).collect();
    for p in pieces {
        if signed {
            out.extend(format!("{:x};chunk-signature={dummy}\r\n", p.len()).bytes());
        } else {
            out.extend(format!("{:x}\r\n", p.len()).bytes());
        }
        out.extend_from_slice(p);
        if !p.is_empty() {
            out.extend_from_slice(b"\r\n");
        }
    }
    if trailer {
        let mut crc = flate2::Crc::new();
        crc.update(&data);
        let b64 = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            crc.sum().to_be_bytes(),
        );
        out.extend(format!("x-amz-checksum-crc32:{b64}\r\n").bytes());
        if signed {
            out.extend(format!("x-amz-trailer-signature:{dummy}\r\n").bytes());
        }
    }
    out.extend_from_slice(b"\r\n");
    (data, out)
}

/// The same three forms from curl over HTTP/1.1 and HTTP/2 (the framing is in the body, so
/// the sandbox's HTTP version must not matter): the sandbox's chunk signatures are dummies.
#[test]
fn aws_chunked_bodies_over_http1_and_http2_are_re_signed_or_passed_intact() {
    let s = s3_world();
    let forms = [
        ("STREAMING-AWS4-HMAC-SHA256-PAYLOAD", true, false),
        ("STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER", true, true),
        ("STREAMING-UNSIGNED-PAYLOAD-TRAILER", false, true),
    ];
    let mut n = 0;
    for (version, flag) in [("1.1", "--http1.1"), ("2", "--http2")] {
        for (form, signed, trailer) in forms {
            n += 1;
            let key = format!("curl-{n}.bin");
            let (data, framed) = framed_upload(150_000, 64 * 1024, signed, trailer);
            let file = s.w.bench.path(&key);
            std::fs::write(&file, &framed).expect("write body");
            let mut args = vec![
                flag.to_string(),
                "-X".into(),
                "PUT".into(),
                "-H".into(),
                format!("X-Amz-Content-SHA256: {form}"),
                "-H".into(),
                "Content-Encoding: aws-chunked".into(),
                // curl's default for --data-binary is a form type, which moto parses as one.
                "-H".into(),
                "Content-Type: application/octet-stream".into(),
                "-H".into(),
                format!("X-Amz-Decoded-Content-Length: {}", data.len()),
                "--data-binary".into(),
                format!("@{}", file.display()),
            ];
            if trailer {
                args.extend(["-H".into(), "X-Amz-Trailer: x-amz-checksum-crc32".into()]);
            }
            args.push(format!("{}/{BUCKET}/{key}", s.endpoint()));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = s.w.curl(&args);
            assert_eq!(out.http_version, version, "{out:#?}");
            assert_eq!(
                out.response.status,
                200,
                "{form} over HTTP/{version}: {out:#?}\nmoto: {:#?}",
                s.moto.events_of("request")
            );
            accepted(&s.requests_for("PUT", &key), form, &key);
            let got = s.boto("get", &[&key]);
            assert_eq!(
                got["sha256_got"],
                crate::support::credentials::sha256_hex(&data),
                "{form} over HTTP/{version}: stored object differs: {got:#}"
            );
        }
    }
    let records = s.audited(12);
    for r in &records {
        assert_eq!(r["status"], 200, "{r:#}");
    }
    s.w.sweep();
}

/// A secret value the `s3` rule does not bind.
const LEAK: &str = "sk-test-S3LEAK-7c1d9e2f4a6b";

/// `chunks` in aws-chunked framing (dummy chunk signatures when `signed`), the final chunk, a
/// CRC32 trailer when `trailer`; returns (data, framed).
fn framed_chunks(chunks: &[&[u8]], signed: bool, trailer: bool) -> (Vec<u8>, Vec<u8>) {
    let data = chunks.concat();
    let dummy = "0".repeat(64);
    let mut out = Vec::new();
    for p in chunks.iter().copied().chain([&[][..]]) {
        match signed {
            true => out.extend(format!("{:x};chunk-signature={dummy}\r\n", p.len()).bytes()),
            false => out.extend(format!("{:x}\r\n", p.len()).bytes()),
        }
        out.extend_from_slice(p);
        if !p.is_empty() {
            out.extend_from_slice(b"\r\n");
        }
    }
    if trailer {
        let mut crc = flate2::Crc::new();
        crc.update(&data);
        let b64 = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            crc.sum().to_be_bytes(),
        );
        out.extend(format!("x-amz-checksum-crc32:{b64}\r\n").bytes());
        if signed {
            out.extend(format!("x-amz-trailer-signature:{dummy}\r\n").bytes());
        }
    }
    out.extend_from_slice(b"\r\n");
    (data, out)
}

/// A secret value or a placeholder cut across two aws-chunked chunks (neither chunk, nor the
/// framed bytes, holds it whole) is found in the data as S3 stores it: refused with its reason,
/// and nothing is stored. The checked form and the re-signed one.
#[test]
fn a_secret_or_placeholder_split_across_aws_chunks_is_refused_and_nothing_is_stored() {
    let s = s3_world_with(
        "\n[secrets.leak]\nsource = \"env:TEST_LEAK\"\n",
        &[("TEST_LEAK", LEAK)],
    );
    let placeholder = "__LATCHKEY_leak__";
    let cases = [
        (
            "leak-1.bin",
            LEAK,
            "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
            false,
            true,
            "secret_value_unbound",
        ),
        (
            "leak-2.bin",
            LEAK,
            "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
            true,
            false,
            "secret_value_unbound",
        ),
        (
            "leak-3.bin",
            placeholder,
            "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
            false,
            true,
            "placeholder_not_bound",
        ),
    ];
    for (key, needle, form, signed, trailer, reason) in cases {
        let pad = "p".repeat(1000);
        let (first, second) = needle.split_at(6);
        let a = format!("{pad}{first}");
        let b = format!("{second}{pad}");
        let (data, framed) = framed_chunks(&[a.as_bytes(), b.as_bytes()], signed, trailer);
        let file = s.w.bench.path(key);
        std::fs::write(&file, &framed).expect("write body");
        let mut args = vec![
            "--http1.1".to_string(),
            "-X".into(),
            "PUT".into(),
            "-H".into(),
            format!("X-Amz-Content-SHA256: {form}"),
            "-H".into(),
            "Content-Encoding: aws-chunked".into(),
            "-H".into(),
            "Content-Type: application/octet-stream".into(),
            "-H".into(),
            format!("X-Amz-Decoded-Content-Length: {}", data.len()),
            "--data-binary".into(),
            format!("@{}", file.display()),
        ];
        if trailer {
            args.extend(["-H".into(), "X-Amz-Trailer: x-amz-checksum-crc32".into()]);
        }
        args.push(format!("{}/{BUCKET}/{key}", s.endpoint()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = s.w.curl(&args);
        assert_refusal(&out.response, 403, reason);
        let get = s.boto("get", &[key]);
        assert_eq!(get["status"], 404, "{key} was stored: {get:#}");
        assert!(
            s.requests_for("PUT", key)
                .iter()
                .all(|e| e["status"] != 200),
            "{key}: moto accepted it"
        );
    }
    s.w.sweep();
}

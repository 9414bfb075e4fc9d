use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use http_body_util::BodyExt;

use super::upload::{write_marker, FileBody, Hashed};
use super::*;

fn parse_err(url: &str) -> String {
    Target::parse(url)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_else(|| panic!("{url} was accepted"))
}

#[test]
fn an_s3_url_gives_a_bucket_and_a_prefix_without_its_slashes() {
    let t = Target::parse("s3://audit-logs.example/boxes/ci-7/").expect("valid");
    assert_eq!(t.bucket, "audit-logs.example");
    assert_eq!(t.prefix, "boxes/ci-7");
    assert_eq!(t.to_string(), "s3://audit-logs.example/boxes/ci-7");
    assert_eq!(t.key("audit-1.jsonl"), "boxes/ci-7/audit-1.jsonl");
    assert_eq!(
        t.object_url("audit-1.jsonl"),
        "s3://audit-logs.example/boxes/ci-7/audit-1.jsonl"
    );
    let root = Target::parse("s3://abc").expect("no prefix");
    assert_eq!((root.prefix.as_str(), root.key("x")), ("", "x".to_string()));
    assert_eq!(root.to_string(), "s3://abc");
    assert_eq!(Target::parse("s3://abc/").expect("slash").prefix, "");
}

#[test]
fn a_url_that_is_not_s3_says_where_the_stores_address_goes() {
    let e = parse_err("https://s3.example.com/bucket/p");
    assert!(e.contains("the scheme must be s3://"), "{e}");
    assert!(e.contains("--audit-ship-endpoint"), "{e}");
    assert!(parse_err("bucket/prefix").contains("expected s3://BUCKET/PREFIX"));
    assert!(parse_err("s3://bucket/p?x=1").contains("query"));
}

#[test]
fn bucket_names_follow_s3s_rules_and_each_broken_rule_is_named() {
    for (bucket, why) in [
        ("", "no bucket name"),
        ("ab", "3 to 63 characters"),
        (&"a".repeat(64), "3 to 63 characters"),
        ("My-Bucket", "'M' is not allowed"),
        ("my_bucket", "'_' is not allowed"),
        ("-bucket", "begin and end"),
        ("bucket.", "begin and end"),
        ("my..bucket", "two adjacent dots"),
        ("192.168.5.4", "IP address"),
        ("xn--bucket", "reserved"),
        ("sthree-bucket", "reserved"),
        ("bucket-s3alias", "reserved"),
        ("bucket--ol-s3", "reserved"),
    ] {
        let e = parse_err(&format!("s3://{bucket}/p"));
        assert!(e.contains(why), "{bucket:?}: {e}");
        assert!(e.contains(&format!("bucket {bucket:?}")), "{e}");
    }
    for ok in ["abc", "a.b-c", "1bucket9", "log.s3.example.com"] {
        assert!(Target::parse(&format!("s3://{ok}")).is_ok(), "{ok}");
    }
}

#[test]
fn a_prefix_holds_only_safe_key_characters_in_non_empty_parts() {
    for (prefix, why) in [
        ("a//b", "empty part"),
        ("a/../b", "\"..\" part"),
        ("a/./b", "\".\" part"),
        ("a b", "' ' is not allowed"),
        ("a%2Fb", "'%' is not allowed"),
        ("ü", "'ü' is not allowed"),
    ] {
        let e = parse_err(&format!("s3://bucket/{prefix}"));
        assert!(e.contains(why), "{prefix:?}: {e}");
    }
    let t = Target::parse("s3://bucket/A-z_0.9/!*'()").expect("safe characters");
    assert_eq!(t.prefix, "A-z_0.9/!*'()");
}

#[test]
fn an_endpoint_is_an_origin_and_its_authority_is_what_host_carries() {
    let e = Endpoint::parse("https://S3.Test:9000").expect("valid");
    assert_eq!((e.host.as_str(), e.port), ("s3.test", 9000));
    assert_eq!(e.authority(), "s3.test:9000");
    assert_eq!(e.origin(), "https://s3.test:9000");
    let d = Endpoint::parse("https://minio.internal/").expect("default port");
    assert_eq!((d.port, d.authority()), (443, "minio.internal".to_string()));
    let v6 = Endpoint::parse("http://[::1]:9000").expect("v6");
    assert_eq!(
        (v6.host.as_str(), v6.authority()),
        ("::1", "[::1]:9000".to_string())
    );
    assert_eq!(
        Endpoint::aws("eu-west-1").origin(),
        "https://s3.eu-west-1.amazonaws.com"
    );
    for (url, why) in [
        ("ftp://s3.test", "scheme must be https"),
        ("https://s3.test/bucket", "origin only"),
        ("https://s3.test?x", "origin only"),
        ("https://key:secret@s3.test", "must not carry credentials"),
        ("not a url", "not a URL"),
    ] {
        let e = Endpoint::parse(url)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(why), "{url}: {e}");
        assert!(!e.contains("secret"), "an error quotes a credential: {e}");
    }
}

fn env_of(vars: &[(&str, &str)]) -> HashMap<String, String> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn config(audit: &Path, rotates: bool, vars: &[(&str, &str)]) -> Result<Config, String> {
    let env = env_of(vars);
    let lookup = move |name: &str| env.get(name).cloned();
    Config::from_flags(&Flags {
        url: "s3://lk-bucket/boxes",
        endpoint: Some("https://s3.test:9000"),
        region: "us-east-1",
        audit,
        rotates,
        env: &lookup,
    })
    .map_err(|e| e.to_string())
}

const KEYS: &[(&str, &str)] = &[
    ("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE"),
    ("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI-not-a-real-key"),
];

#[test]
fn shipping_needs_a_file_rotation_and_never_half_a_key_pair_and_says_which_is_missing() {
    let file = Path::new("/var/log/latchkey/audit.jsonl");
    let e = config(Path::new("-"), true, KEYS).err().unwrap_or_default();
    assert!(e.contains("--audit to be a file"), "{e}");
    let e = config(file, false, KEYS).err().unwrap_or_default();
    assert!(e.contains("--audit-rotate"), "{e}");
    assert!(e.contains("no segment ever closes"), "{e}");
    // No key at all: latchkey's own AWS identity signs (web identity, container, files…).
    assert!(config(file, true, &[]).is_ok());
    let e = config(file, true, &KEYS[..1]).err().unwrap_or_default();
    assert!(e.contains(": AWS_SECRET_ACCESS_KEY not set"), "{e}");
    let e = config(file, true, &[("AWS_ACCESS_KEY_ID", ""), KEYS[1]])
        .err()
        .unwrap_or_default();
    assert!(e.contains(": AWS_ACCESS_KEY_ID not set"), "{e}");
    assert!(!e.contains(KEYS[1].1), "an error holds a secret value: {e}");
    let c = config(file, true, KEYS).expect("valid");
    assert_eq!(c.target.to_string(), "s3://lk-bucket/boxes");
    assert_eq!(c.endpoint.origin(), "https://s3.test:9000");
    let mut with_token = KEYS.to_vec();
    with_token.push(("AWS_SESSION_TOKEN", "FwoGZX"));
    let c = config(file, true, &with_token).expect("valid");
    let shipper = Shipper::new(c);
    let debug = format!("{shipper:?}");
    assert!(
        !debug.contains(KEYS[1].1) && !debug.contains("FwoGZX"),
        "{debug}"
    );
}

#[test]
fn the_region_is_checked_and_names_the_aws_endpoint_by_default() {
    let env = env_of(KEYS);
    let lookup = move |name: &str| env.get(name).cloned();
    let flags = |region| Flags {
        url: "s3://lk-bucket",
        endpoint: None,
        region,
        audit: Path::new("audit.jsonl"),
        rotates: true,
        env: &lookup,
    };
    let c = Config::from_flags(&flags("eu-central-1")).expect("valid");
    assert_eq!(c.endpoint.origin(), "https://s3.eu-central-1.amazonaws.com");
    for bad in ["", "EU", "eu/west"] {
        let e = Config::from_flags(&flags(bad)).err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("--audit-ship-region")),
            "{bad}: {e:?}"
        );
    }
}

#[test]
fn retries_wait_one_second_doubling_up_to_a_minute() {
    let waits: Vec<u64> = (1..=9).map(|n| backoff(n).as_secs()).collect();
    assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
}

#[test]
fn an_s3_error_document_gives_its_code_and_message_and_nothing_else() {
    let doc =
        b"<?xml version=\"1.0\"?><Error><Code>SignatureDoesNotMatch</Code><Message>The request \
        signature we calculated does not match</Message><StringToSign>AWS4-HMAC-SHA256\n20261202\
        </StringToSign><AWSAccessKeyId>AKIAEXAMPLE</AWSAccessKeyId></Error>";
    let (code, message) = s3_error(doc);
    assert_eq!(code.as_deref(), Some("SignatureDoesNotMatch"));
    assert_eq!(
        message.as_deref(),
        Some("The request signature we calculated does not match")
    );
    let e = UploadError::Refused {
        status: 403,
        code,
        message,
    }
    .to_string();
    assert_eq!(
        e,
        "the store answered 403 SignatureDoesNotMatch: The request signature we calculated does not match"
    );
    assert!(!e.contains("AKIA") && !e.contains("AWS4-HMAC"), "{e}");
    assert_eq!(s3_error(b"<html>bad gateway</html>"), (None, None));
    let long = format!("<Error><Message>{}</Message></Error>", "x\n".repeat(400));
    let (_, m) = s3_error(long.as_bytes());
    assert!(m.is_some_and(|m| m.len() <= 300 && !m.contains('\n')));
}

#[test]
fn a_file_is_hashed_whole_in_pieces() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("seg.jsonl");
    std::fs::write(&p, b"abc").expect("write");
    let h = hash_file(&p).expect("hash");
    assert_eq!(h.len, 3);
    assert_eq!(
        h.sha256,
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    // Longer than one read: the same digest as hashing it at once.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&p, &big).expect("write");
    let h = hash_file(&p).expect("hash");
    let want = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &big);
    let want: String = want.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!((h.len, h.sha256), (big.len() as u64, want));
    let gone = hash_file(&dir.path().join("missing.jsonl"))
        .err()
        .map(|e| e.to_string());
    assert!(gone.is_some_and(|e| e.contains("missing.jsonl")));
}

#[tokio::test]
async fn a_file_body_streams_exactly_its_length_and_fails_when_the_file_is_short() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("seg.jsonl");
    let data: Vec<u8> = (0..150_000u32).map(|i| (i % 199) as u8).collect();
    std::fs::write(&p, &data).expect("write");
    let file = tokio::fs::File::open(&p).await.expect("open");
    let body = FileBody::new(file, data.len() as u64);
    assert_eq!(
        http_body::Body::size_hint(&body).exact(),
        Some(data.len() as u64)
    );
    let got = body.collect().await.expect("whole body").to_bytes();
    assert_eq!(got.as_ref(), data.as_slice());
    let file = tokio::fs::File::open(&p).await.expect("open");
    let short = FileBody::new(file, data.len() as u64 + 10);
    let e = short.collect().await.err().map(|e| e.to_string());
    assert!(
        e.as_deref().is_some_and(|e| e.contains("ended before")),
        "{e:?}"
    );
}

#[test]
fn the_marker_is_written_whole_beside_its_segment_and_is_no_segment_itself() {
    let dir = tempfile::tempdir().expect("tempdir");
    let active = dir.path().join("audit.jsonl");
    let t = std::time::SystemTime::now();
    let seg = crate::audit::segments::segment_path(&active, 1, t);
    std::fs::write(&seg, b"{}\n").expect("segment");
    let hashed = Hashed {
        len: 3,
        sha256: "ab".repeat(32),
    };
    write_marker(
        &seg,
        "s3://b/p/x",
        "https://s3.test",
        &hashed,
        Some("etag1"),
    )
    .expect("marker");
    let marker = crate::audit::segments::shipped_marker(&seg);
    let text = std::fs::read_to_string(&marker).expect("marker written");
    let v: serde_json::Value = serde_json::from_str(text.trim_end()).expect("one JSON line");
    assert_eq!(v["object"], "s3://b/p/x");
    assert_eq!(v["bytes"], 3);
    assert_eq!(v["etag"], "etag1");
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
    assert_eq!(
        crate::audit::segments::segments(&active).expect("segments"),
        vec![seg]
    );
}

#[test]
fn pending_segments_are_those_without_a_marker_oldest_first_and_counted_in_metrics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let active = dir.path().join("audit.jsonl");
    std::fs::write(&active, b"active\n").expect("active");
    let env = env_of(KEYS);
    let lookup = move |name: &str| env.get(name).cloned();
    let c = Config::from_flags(&Flags {
        url: "s3://lk-bucket/p",
        endpoint: Some("https://s3.test"),
        region: "us-east-1",
        audit: &active,
        rotates: true,
        env: &lookup,
    })
    .expect("valid");
    let shipper = Shipper::new(c);
    let metrics = std::sync::Arc::new(crate::metrics::Metrics::default());
    metrics.audit_ship.enable();
    let _ = shipper.metrics.set(metrics.clone());
    let t = std::time::SystemTime::now() - Duration::from_secs(5);
    let segs: Vec<_> = [1u64, 40, 90]
        .iter()
        .map(|seq| {
            let p = crate::audit::segments::segment_path(&active, *seq, t);
            std::fs::write(&p, vec![b'x'; *seq as usize]).expect("segment");
            p
        })
        .collect();
    std::fs::write(crate::audit::segments::shipped_marker(&segs[0]), "{}\n").expect("marker");
    let pending = shipper.pending().expect("spool");
    assert_eq!(
        pending.iter().map(|p| p.path.clone()).collect::<Vec<_>>(),
        segs[1..].to_vec()
    );
    let s = shipper.status();
    assert_eq!((s.pending_segments, s.pending_bytes), (2, 130));
    assert_eq!(s.target, "s3://lk-bucket/p");
    assert!(s.last_error.is_none() && s.last_shipped.is_none());
    let text = metrics.render(&crate::metrics::Gauges::default());
    assert!(
        text.contains("latchkey_audit_ship_pending_segments 2\n"),
        "{text}"
    );
    assert!(
        text.contains("latchkey_audit_ship_pending_bytes 130\n"),
        "{text}"
    );
    assert!(text.contains("latchkey_audit_ship_uploads_total{result=\"failed\"} 0\n"));
    // Without shipping the families are absent.
    let off = crate::metrics::Metrics::default().render(&crate::metrics::Gauges::default());
    assert!(!off.contains("latchkey_audit_ship"), "{off}");
}

//! latchkey's own AWS identity and the AWS secret stores against real implementations:
//! moto in server mode (`tests/clients/aws_moto.py`: Secrets Manager, SSM, STS on loopback,
//! reached at `AWS_ENDPOINT_URL` over plain http:// — allowed for a loopback endpoint only),
//! an IMDSv2 and a container-credentials stand-in (a tiny HTTP server here), and an
//! `aws_sigv4` credential without keys signing through `latchkey serve` for moto's S3, which
//! verifies the signature. No secret value may show in an error or in latchkey's output.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use latchkey::secrets::{Fetch, Location};
use latchkey::signing::{AwsIdentity, ImdsConfig};
use latchkey::upstream::token_transport::TokenClient;
use latchkey::upstream::{Cidr, Clients, Dialer, UpstreamConfig};
use latchkey_stores::Stores;

use crate::support::credentials::{Bench, PyServer};

fn moto() -> (Bench, PyServer) {
    let bench = Bench::new();
    let server = bench.server("aws_moto.py", &[]);
    (bench, server)
}

fn stores(env: &[(&str, &str)], imds: Option<ImdsConfig>) -> Stores {
    let config = UpstreamConfig {
        allow_private: vec![Cidr::parse("127.0.0.0/8").expect("cidr")],
        ..Default::default()
    };
    let clients = Clients::new(
        Arc::new(Dialer::new(&config)),
        Arc::new(latchkey::upstream::tls_config(None).expect("tls")),
        None,
    );
    let transport = TokenClient::new(Arc::new(clients), Duration::from_secs(10));
    let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    let home = tempfile::tempdir().expect("home").keep();
    Stores::new(
        Arc::new(transport),
        Arc::new(AwsIdentity::new(env, Some(home), imds)),
    )
}

fn sm(id: &str, stage: Option<&str>, json_key: Option<&str>) -> Location {
    Location::AwsSm {
        id: id.to_string(),
        json_key: json_key.map(str::to_string),
        stage: stage.map(str::to_string),
        version_id: None,
        region: None,
    }
}

fn ssm(name: &str, version: Option<u64>) -> Location {
    Location::AwsSsm {
        name: name.to_string(),
        version,
        region: None,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

async fn fetch(s: &Stores, at: &Location) -> Result<String, String> {
    s.fetch("lk", at)
        .await
        .map(|f| String::from_utf8(f.value.expose().to_vec()).expect("utf8"))
}

const VALUES: &[&str] = &[
    "plain-secret-v1",
    "plain-secret-v2",
    "json-secret-pw",
    "param-secret-v1",
    "param-secret-v2",
];

fn no_value_in(text: &str) {
    for v in VALUES {
        assert!(!text.contains(v), "{v} in {text}");
    }
}

#[test]
fn secrets_manager_and_ssm_are_read_with_keys_from_the_environment() {
    let (_bench, moto) = moto();
    let url = format!("http://127.0.0.1:{}", moto.port());
    let s = stores(
        &[
            ("AWS_ACCESS_KEY_ID", "AKIDFROMENV"),
            ("AWS_SECRET_ACCESS_KEY", "env-secret"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ENDPOINT_URL", &url),
        ],
        None,
    );
    runtime().block_on(async {
        assert_eq!(
            fetch(&s, &sm("lk/plain", None, None)).await.as_deref(),
            Ok("plain-secret-v2")
        );
        assert_eq!(
            fetch(&s, &sm("lk/plain", Some("AWSPREVIOUS"), None))
                .await
                .as_deref(),
            Ok("plain-secret-v1")
        );
        assert_eq!(
            fetch(&s, &sm("lk/json", None, Some("password")))
                .await
                .as_deref(),
            Ok("json-secret-pw")
        );
        let err = fetch(&s, &sm("lk/json", None, Some("pass")))
            .await
            .expect_err("no key");
        assert!(
            err.contains("username") && err.contains("password"),
            "{err}"
        );
        no_value_in(&err);
        assert_eq!(
            fetch(&s, &ssm("/lk/param", None)).await.as_deref(),
            Ok("param-secret-v2")
        );
        assert_eq!(
            fetch(&s, &ssm("/lk/param", Some(1))).await.as_deref(),
            Ok("param-secret-v1")
        );
        let err = fetch(&s, &sm("lk/absent", None, None))
            .await
            .expect_err("absent");
        assert!(
            err.contains("aws-sm:lk/absent") && err.contains("ResourceNotFoundException"),
            "{err}"
        );
    });
    let requests =
        moto.wait_events_where("request", 1, |r| r["target"] == "AmazonSSM.GetParameter");
    assert!(
        requests
            .iter()
            .any(|r| r["target"] == "AmazonSSM.GetParameter"),
        "{requests:#?}"
    );
    for r in &requests {
        let scope = r["credential"].as_str().expect("signed");
        assert!(
            scope.starts_with("AKIDFROMENV/") && scope.contains("/us-east-1/"),
            "{r}"
        );
    }
}

#[test]
fn web_identity_keys_from_moto_sts_read_secrets_manager() {
    let (bench, moto) = moto();
    let url = format!("http://127.0.0.1:{}", moto.port());
    let token = bench.path("web-identity-token");
    std::fs::write(&token, "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwb2QifQ.c2ln").expect("token");
    let s = stores(
        &[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token.to_str().expect("utf8")),
            ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/lk-role"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ENDPOINT_URL", &url),
        ],
        None,
    );
    runtime().block_on(async {
        assert_eq!(
            fetch(&s, &sm("lk/plain", None, None)).await.as_deref(),
            Ok("plain-secret-v2")
        );
    });
    let scope = moto
        .wait_events_where("request", 1, |r| {
            r["target"] == "secretsmanager.GetSecretValue"
        })
        .into_iter()
        .next()
        .expect("SM called");
    // Signed with STS's temporary keys, not anything static.
    let akid = scope["credential"].as_str().expect("signed");
    assert!(akid.starts_with("ASIA"), "{scope}");
}

/// A stand-in for IMDSv2 and the container endpoint: `PUT /latest/api/token` (with a TTL
/// header) gives a session token every metadata GET must carry; `GET /ecs` needs
/// `Authorization: ecs-auth-token`. Records each request line.
fn metadata_stand_in() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
            let line = head.lines().next().unwrap_or_default().to_string();
            log.lock().expect("log").push(line.clone());
            let creds = r#"{"Code":"Success","AccessKeyId":"AKIDSTANDIN","SecretAccessKey":"standin-secret","Token":"standin-token","Expiration":"2099-01-01T00:00:00Z"}"#;
            let has = |h: &str| head.contains(h);
            let (status, body) = if line.starts_with("put /latest/api/token") {
                if has("x-aws-ec2-metadata-token-ttl-seconds: 21600") {
                    ("200 OK", "imds-session")
                } else {
                    ("400 Bad Request", "")
                }
            } else if line.starts_with("get /latest/meta-data/")
                && !has("x-aws-ec2-metadata-token: imds-session")
            {
                ("401 Unauthorized", "")
            } else if line.starts_with("get /latest/meta-data/iam/security-credentials/ ") {
                ("200 OK", "standin-role")
            } else if line
                .starts_with("get /latest/meta-data/iam/security-credentials/standin-role ")
                || (line.starts_with("get /ecs ") && has("authorization: ecs-auth-token"))
            {
                ("200 OK", creds)
            } else {
                ("404 Not Found", "")
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, seen)
}

#[test]
fn imds_v2_and_container_stand_ins_give_the_keys_that_sign_secrets_manager() {
    let (_bench, moto) = moto();
    let url = format!("http://127.0.0.1:{}", moto.port());
    let (port, seen) = metadata_stand_in();
    let imds_url = format!("http://127.0.0.1:{port}");
    let base = [
        ("AWS_REGION", "us-east-1"),
        ("AWS_ENDPOINT_URL", url.as_str()),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds_url.as_str()),
    ];
    // Off unless configured: the stand-in is never called.
    let off = stores(&base, None);
    let err = runtime()
        .block_on(fetch(&off, &sm("lk/plain", None, None)))
        .expect_err("no identity");
    assert!(
        err.contains("imds: off") && err.contains("env: AWS_ACCESS_KEY_ID is not set"),
        "{err}"
    );
    assert!(seen.lock().expect("log").is_empty());

    let on = stores(&base, Some(ImdsConfig::default()));
    let got = runtime().block_on(fetch(&on, &sm("lk/plain", None, None)));
    assert_eq!(got.as_deref(), Ok("plain-secret-v2"));
    let lines = seen.lock().expect("log").clone();
    assert!(lines[0].starts_with("put /latest/api/token"), "{lines:?}");
    assert_eq!(lines.len(), 3, "{lines:?}");

    let ecs_url = format!("http://127.0.0.1:{port}/ecs");
    let mut env = base.to_vec();
    env.push(("AWS_CONTAINER_CREDENTIALS_FULL_URI", &ecs_url));
    env.push(("AWS_CONTAINER_AUTHORIZATION_TOKEN", "ecs-auth-token"));
    let ecs = stores(&env, None);
    let got = runtime().block_on(fetch(&ecs, &sm("lk/plain", None, None)));
    assert_eq!(got.as_deref(), Ok("plain-secret-v2"));
    assert!(seen
        .lock()
        .expect("log")
        .iter()
        .any(|l| l.starts_with("get /ecs ")));
    let signed = moto.wait_events_where("request", 2, |r| {
        r["target"] == "secretsmanager.GetSecretValue"
    });
    assert_eq!(signed.len(), 2, "{signed:#?}");
    for r in &signed {
        assert!(
            r["credential"]
                .as_str()
                .expect("signed")
                .starts_with("AKIDSTANDIN/"),
            "{r}"
        );
    }
}

#[test]
fn a_sigv4_credential_without_keys_signs_with_latchkeys_identity_through_serve() {
    let bench = Bench::new();
    let s3 = bench.server("s3_moto.py", &[]);
    let event = s3.wait_events("keys", 1)[0].clone();
    let akid = event["access_key_id"].as_str().expect("akid").to_string();
    let secret = event["secret_access_key"]
        .as_str()
        .expect("secret")
        .to_string();
    let policy = format!(
        r#"
[credentials.own]
kind = "aws_sigv4"
region = "us-east-1"
service = "s3"

[[rules]]
name = "s3"
hosts = ["s3.test"]
ports = [{port}]
credential = "own"
"#,
        port = s3.port()
    );
    // Keys only in latchkey's own environment (the standard variables), none in the policy.
    let w = bench.start_with(
        &policy,
        &[("AWS_SECRET_ACCESS_KEY", &secret)],
        &[("AWS_ACCESS_KEY_ID", &akid)],
    );
    let endpoint = format!("https://s3.test:{}", s3.port());
    let out = w.python(
        "s3_boto3.py",
        &[
            "put",
            &endpoint,
            "lk-bucket",
            "own.bin",
            "960",
            "when_supported",
        ],
        &[],
    );
    let out: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(out["ok"], true, "{out:#}\nlatchkey: {}", w.lk.stderr_text());
    let puts = s3.wait_events_where("request", 1, |e| e["method"] == "PUT");
    assert!(
        !puts.is_empty() && puts.iter().all(|e| e["status"] == 200),
        "{puts:#?}"
    );
    let records = w.lk.wait_audit(2);
    for r in &records {
        assert_eq!(r["rule"], "s3", "{r:#}");
        assert_eq!(r["status"], 200, "{r:#}");
    }
    let logged = format!("{} {records:?}", w.lk.stderr_text());
    assert!(
        !logged.contains(&secret),
        "the identity's secret key leaked"
    );
}

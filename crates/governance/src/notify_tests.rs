//! Unit tests of the outbox's payloads, signatures, backoff and one delivery against a real
//! loopback receiver.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_lc_rs::digest;
use serde_json::Value;

use super::*;
use crate::policy::Origin;
use crate::record::{Answer, State};
use crate::secrets::scrub::ScrubSecret;
use crate::secrets::Source;

const SECRET: &str = "sk-live-NOTIFYTESTSECRET123";

pub(crate) fn approval() -> Approval {
    let created = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    Approval {
        id: "ap_1234".into(),
        state: State::Pending,
        created,
        expires: created + Duration::from_secs(3600),
        identity: "agent".into(),
        labels: BTreeMap::from([("owner".into(), "ana".into()), ("env".into(), "ci".into())]),
        client: "10.0.0.5:40000".into(),
        method: "POST".into(),
        url: "https://api.prod.test/v1/items?token=REDACTED".into(),
        scheme: "https".into(),
        host: "api.prod.test".into(),
        port: 443,
        path: "/v1/items".into(),
        rule: "prod-writes".into(),
        denial: None,
        message: Some("Production write <b>".into()),
        scopes: vec!["once".into(), "1h".into()],
        body_bytes: 17,
        body_sha256: "ab".repeat(32),
        preview: Some(r#"{"name":"x"}"#.into()),
        request_id: "0123456789abcdef".into(),
        policy: "digest".into(),
        answer: None,
        fingerprint: "internal-fingerprint".into(),
        session: "internal-session".into(),
    }
}

fn links() -> Links {
    Links {
        approve: BTreeMap::from([
            (
                "once".into(),
                "https://admin.test/approvals/ap_1234/answer?o".into(),
            ),
            (
                "1h".into(),
                "https://admin.test/approvals/ap_1234/answer?h".into(),
            ),
        ]),
        deny: "https://admin.test/approvals/ap_1234/answer?d".into(),
    }
}

pub(crate) fn notice(event: &str, links: Option<Links>) -> Notice {
    Notice {
        notifier: "ops".into(),
        event: event.into(),
        approval: approval().public(),
        links,
        actions: None,
    }
}

pub(super) fn notifier(url: &str, signed: bool, format: NotifyFormat) -> Notifier {
    Notifier {
        name: "ops".into(),
        url: url::Url::parse(url).unwrap(),
        signed,
        format,
        interactive: false,
        approvers: Vec::new(),
        origin: Origin {
            file: "policies/notify.toml".into(),
            line: 1,
        },
    }
}

#[test]
fn json_payload_has_the_contract_fields_and_no_internal_hashes() {
    let body = render(
        NotifyFormat::Json,
        "ap_1234-approval.requested-ops",
        &notice(EVENT_REQUESTED, Some(links())),
        None,
    );
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["event"], "approval.requested");
    assert_eq!(v["delivery"], "ap_1234-approval.requested-ops");
    let a = &v["approval"];
    assert_eq!(a["id"], "ap_1234");
    assert_eq!(a["state"], "pending");
    assert_eq!(a["identity"], "agent");
    assert_eq!(a["labels"]["owner"], "ana");
    assert_eq!(a["url"], "https://api.prod.test/v1/items?token=REDACTED");
    assert_eq!(a["rule"], "prod-writes");
    assert_eq!(a["scopes"], serde_json::json!(["once", "1h"]));
    assert_eq!(a["body_bytes"], 17);
    assert!(
        a.get("fingerprint").is_none() && a.get("session").is_none(),
        "{a}"
    );
    assert!(!String::from_utf8_lossy(&body).contains("internal-"));
    assert_eq!(
        v["links"]["approve"]["1h"],
        "https://admin.test/approvals/ap_1234/answer?h"
    );
    assert_eq!(
        v["links"]["deny"],
        "https://admin.test/approvals/ap_1234/answer?d"
    );
    let without: Value = serde_json::from_slice(&render(
        NotifyFormat::Json,
        "d",
        &notice(EVENT_REQUESTED, None),
        None,
    ))
    .unwrap();
    assert!(without["links"].is_null());
}

#[test]
fn slack_payload_has_a_summary_details_and_one_button_per_link() {
    let body = render(
        NotifyFormat::Slack,
        "d",
        &notice(EVENT_REQUESTED, Some(links())),
        None,
    );
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        v["text"],
        "latchkey: identity agent asks to POST https://api.prod.test/v1/items?token=REDACTED \
         (rule prod-writes)"
    );
    let blocks = v["blocks"].as_array().unwrap();
    let details = blocks[1]["text"]["text"].as_str().unwrap();
    for part in [
        "*Identity:* agent",
        "*Request:* POST https://api.prod.test/v1/items",
        "*Rule:* prod-writes",
        "env=ci, owner=ana",
        "*Message:* Production write &lt;b&gt;",
        "17 bytes",
    ] {
        assert!(details.contains(part), "{part:?} not in {details}");
    }
    let preview = blocks[2]["text"]["text"].as_str().unwrap();
    assert!(preview.contains(r#"```{"name":"x"}```"#), "{preview}");
    let actions = blocks.last().unwrap();
    assert_eq!(actions["type"], "actions");
    let buttons = actions["elements"].as_array().unwrap();
    let urls: Vec<&str> = buttons.iter().map(|b| b["url"].as_str().unwrap()).collect();
    assert_eq!(
        urls,
        [
            "https://admin.test/approvals/ap_1234/answer?o",
            "https://admin.test/approvals/ap_1234/answer?h",
            "https://admin.test/approvals/ap_1234/answer?d",
        ]
    );
    assert!(buttons.iter().all(|b| b["type"] == "button"));
    assert_eq!(buttons[1]["text"]["text"], "Approve (1h)");
    assert_eq!(buttons[2]["text"]["text"], "Deny");
}

#[test]
fn slack_decided_says_who_decided_what_and_has_no_buttons() {
    let mut n = notice(EVENT_DECIDED, Some(links()));
    n.approval.state = State::Approved;
    n.approval.answer = Some(Answer {
        decision: "approve".into(),
        scope: Some("1h".into()),
        note: Some("looks fine".into()),
        by: "ana".into(),
        at: n.approval.created,
    });
    let v: Value = serde_json::from_slice(&render(NotifyFormat::Slack, "d", &n, None)).unwrap();
    let text = v["text"].as_str().unwrap();
    assert!(
        text.starts_with(
            "latchkey: ana approved (1h) identity agent to POST https://api.prod.test"
        ),
        "{text}"
    );
    assert!(text.ends_with(": looks fine"), "{text}");
    assert!(v["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|b| b["type"] != "actions"));
    n.approval.answer = Some(Answer {
        decision: "deny".into(),
        scope: None,
        note: None,
        by: "link".into(),
        at: n.approval.created,
    });
    let v: Value = serde_json::from_slice(&render(NotifyFormat::Slack, "d", &n, None)).unwrap();
    assert!(v["text"]
        .as_str()
        .unwrap()
        .starts_with("latchkey: link denied identity agent"));
}

/// HMAC-SHA256 written out from SHA-256 (RFC 2104), to check the signature without the code
/// under test's HMAC.
fn hmac_sha256(key: &[u8], message: &[u8]) -> String {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(digest::digest(&digest::SHA256, key).as_ref());
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let mut inner = pad(0x36);
    inner.extend_from_slice(message);
    let mut outer = pad(0x5c);
    outer.extend_from_slice(digest::digest(&digest::SHA256, &inner).as_ref());
    let tag = digest::digest(&digest::SHA256, &outer);
    tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn signature_is_hmac_sha256_over_timestamp_dot_body() {
    let secret = SecretValue::new(b"whsec-0123456789".to_vec());
    let body = br#"{"event":"approval.requested"}"#;
    let got = signature(&secret, "1800000000", body);
    let want = hmac_sha256(
        b"whsec-0123456789",
        b"1800000000.{\"event\":\"approval.requested\"}",
    );
    assert_eq!(got, format!("sha256={want}"));
    // RFC 4231 test case 2, so the reference itself is right.
    assert_eq!(
        hmac_sha256(b"Jefe", b"what do ya want for nothing?"),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
    assert_ne!(signature(&secret, "1800000001", body), got);
}

#[test]
fn backoff_doubles_from_one_second_up_to_five_minutes() {
    let secs: Vec<u64> = (0..11).map(|n| backoff(n).as_secs()).collect();
    assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
    assert_eq!(backoff(40), BACKOFF_CAP);
    assert_eq!(backoff(u32::MAX), BACKOFF_CAP);
}

#[test]
fn delivery_ids_are_stable_per_approval_event_and_notifier() {
    assert_eq!(
        delivery_id("ap_1", EVENT_REQUESTED, "ops"),
        "ap_1-approval.requested-ops"
    );
    assert_ne!(
        delivery_id("ap_1", EVENT_REQUESTED, "ops"),
        delivery_id("ap_1", EVENT_DECIDED, "ops")
    );
}

#[test]
fn secret_values_are_scrubbed_from_both_formats_and_the_json_stays_valid() {
    let scrubber = Scrubber::new(&[ScrubSecret {
        name: "openai",
        value: SECRET.as_bytes(),
    }])
    .unwrap();
    let mut n = notice(EVENT_REQUESTED, Some(links()));
    n.approval.preview = Some(format!(r#"{{"key":"{SECRET}"}}"#));
    n.approval.url = format!("https://api.prod.test/v1/{SECRET}");
    n.approval.message = Some(format!("quote \" and {SECRET}"));
    for format in [NotifyFormat::Json, NotifyFormat::Slack] {
        let body = render(format, "d", &n, Some(&scrubber));
        let text = String::from_utf8(body.clone()).unwrap();
        assert!(!text.contains(SECRET), "{text}");
        assert!(!text.contains("NOTIFYTESTSECRET"), "{text}");
        assert!(text.contains("[REDACTED:openai]"), "{text}");
        serde_json::from_slice::<Value>(&body).unwrap();
    }
}

#[test]
fn long_fields_are_clipped_for_slack() {
    assert_eq!(clip("abcdef", 6), "abcdef");
    assert_eq!(clip("abcdefg", 6), "abcde…");
    assert_eq!(clip("ééééééé", 3), "éé…");
    let mut n = notice(EVENT_REQUESTED, None);
    n.approval.preview = Some("x".repeat(10_000));
    let v: Value = serde_json::from_slice(&render(NotifyFormat::Slack, "d", &n, None)).unwrap();
    for b in v["blocks"].as_array().unwrap() {
        if let Some(t) = b["text"]["text"].as_str() {
            assert!(t.chars().count() <= 3000, "{} chars", t.chars().count());
        }
    }
}

/// One request as a receiver saw it.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub(super) headers: http::HeaderMap,
    pub(super) body: Vec<u8>,
}

/// A loopback HTTP receiver answering each request with the next status of `statuses` (the
/// last one repeated), recording what it received.
pub(super) async fn receiver(statuses: Vec<u16>) -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    use hyper::service::service_fn;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (record, statuses) = (Arc::clone(&record), statuses.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (record, statuses) = (Arc::clone(&record), statuses.clone());
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.unwrap().to_bytes().to_vec();
                        let n = {
                            let mut seen = record.lock().unwrap();
                            seen.push(Seen {
                                headers: parts.headers,
                                body,
                            });
                            seen.len()
                        };
                        let status = statuses[(n - 1).min(statuses.len() - 1)];
                        let res = http::Response::builder()
                            .status(status)
                            .body(http_body_util::Full::new(Bytes::from(vec![b'x'; 200_000])))
                            .unwrap();
                        Ok::<_, std::convert::Infallible>(res)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// The guarded client as `serve --allow-private 127.0.0.0/8` builds it.
pub(super) fn loopback_client() -> Client {
    let config = crate::upstream::UpstreamConfig {
        allow_private: vec![crate::upstream::Cidr::parse("127.0.0.0/8").unwrap()],
        ..Default::default()
    };
    let dialer = Arc::new(crate::upstream::Dialer::new(&config));
    let tls = Arc::new(crate::upstream::tls_config(None).unwrap());
    crate::upstream::client(crate::upstream::Connector::new(dialer, tls, Vec::new()))
}

fn secrets_with(name: &str, value: &str) -> (tempfile::TempDir, SecretStore) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret");
    std::fs::write(&path, value).unwrap();
    let source = Source::parse(
        &format!("file:{}", path.display()),
        Duration::from_secs(60),
        Duration::from_secs(5),
    )
    .unwrap();
    let store = SecretStore::load(vec![(name.to_string(), source)]).unwrap();
    (dir, store)
}

#[tokio::test]
async fn a_delivery_carries_the_headers_and_a_verifiable_signature() {
    let (addr, seen) = receiver(vec![200]).await;
    let (_dir, secrets) = secrets_with(&notify_secret_key("ops"), "whsec-unit-test-secret");
    let n = notifier(&format!("http://{addr}/hook"), true, NotifyFormat::Json);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_123);
    let id = delivery_id("ap_1234", EVENT_REQUESTED, "ops");
    let notice = notice(EVENT_REQUESTED, Some(links()));
    deliver(&loopback_client(), &n, &secrets, &id, &notice, now)
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    assert_eq!(h["content-type"], "application/json");
    assert_eq!(h["x-latchkey-event"], "approval.requested");
    assert_eq!(h["x-latchkey-delivery"], "ap_1234-approval.requested-ops");
    assert_eq!(h["x-latchkey-timestamp"], "1800000123");
    let mut signed = b"1800000123.".to_vec();
    signed.extend_from_slice(&seen[0].body);
    assert_eq!(
        h["x-latchkey-signature"].to_str().unwrap(),
        format!("sha256={}", hmac_sha256(b"whsec-unit-test-secret", &signed))
    );
    let v: Value = serde_json::from_slice(&seen[0].body).unwrap();
    assert_eq!(v["approval"]["id"], "ap_1234");
    // The signing secret is itself a secret: never in the body.
    assert!(!String::from_utf8_lossy(&seen[0].body).contains("whsec-unit-test-secret"));
}

#[tokio::test]
async fn an_interactive_notifier_never_gets_link_buttons_even_from_an_older_queued_notice() {
    let (addr, seen) = receiver(vec![200]).await;
    let mut n = notifier(&format!("http://{addr}/hook"), false, NotifyFormat::Slack);
    n.interactive = true;
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_123);
    // Queued with links before a reload gave the notifier its signing_secret.
    let queued = notice(EVENT_REQUESTED, Some(links()));
    deliver(
        &loopback_client(),
        &n,
        &SecretStore::empty(),
        "d",
        &queued,
        now,
    )
    .await
    .unwrap();
    let body = String::from_utf8(seen.lock().unwrap()[0].body.clone()).unwrap();
    assert!(!body.contains("/answer?"), "{body}");
    assert!(!body.contains("\"actions\""), "no button at all: {body}");
}

#[tokio::test]
async fn a_non_2xx_answer_or_a_missing_secret_is_an_error_and_unsigned_has_no_signature() {
    let (addr, seen) = receiver(vec![500, 204]).await;
    let url = format!("http://{addr}/hook");
    let client = loopback_client();
    let notice = notice(EVENT_REQUESTED, None);
    let now = SystemTime::now();
    let unsigned = notifier(&url, false, NotifyFormat::Slack);
    let empty = SecretStore::empty();
    let err = deliver(&client, &unsigned, &empty, "d1", &notice, now)
        .await
        .unwrap_err();
    assert!(
        matches!(err, DeliveryError::Status { status: 500, .. }),
        "{err}"
    );
    deliver(&client, &unsigned, &empty, "d1", &notice, now)
        .await
        .unwrap();
    let signed = notifier(&url, true, NotifyFormat::Json);
    let err = deliver(&client, &signed, &empty, "d2", &notice, now)
        .await
        .unwrap_err();
    assert!(matches!(err, DeliveryError::Secret { .. }), "{err}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "no request without the secret");
    assert!(seen
        .iter()
        .all(|s| !s.headers.contains_key("x-latchkey-signature")));
    assert_eq!(seen[0].headers["x-latchkey-delivery"], "d1");
    let v: Value = serde_json::from_slice(&seen[1].body).unwrap();
    assert!(v["text"]
        .as_str()
        .unwrap()
        .starts_with("latchkey: identity agent asks"));
}

#[tokio::test]
async fn the_guarded_client_refuses_loopback_without_allow_private() {
    let (addr, seen) = receiver(vec![200]).await;
    let dialer = Arc::new(crate::upstream::Dialer::new(&Default::default()));
    let tls = Arc::new(crate::upstream::tls_config(None).unwrap());
    let client = crate::upstream::client(crate::upstream::Connector::new(dialer, tls, Vec::new()));
    let n = notifier(&format!("http://{addr}/hook"), false, NotifyFormat::Json);
    let err = deliver(
        &client,
        &n,
        &SecretStore::empty(),
        "d",
        &notice(EVENT_REQUESTED, None),
        SystemTime::now(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, DeliveryError::Unreachable { .. }), "{err}");
    assert!(seen.lock().unwrap().is_empty());
}

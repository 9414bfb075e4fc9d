use std::sync::{Arc, Mutex};

use super::*;
use crate::secrets::{Fetch, Location};
use crate::signing::{Answer, Exchange, TransportError};
use crate::Stores;

/// A request as sent: rule, URL, headers, body.
type Sent = (String, String, Vec<(String, String)>, String);

/// Answers every call with one scripted answer; records the requests.
struct Fake {
    status: u16,
    body: String,
    seen: Mutex<Vec<Sent>>,
}

impl TokenTransport for Fake {
    fn call(
        &self,
        ex: Exchange,
    ) -> crate::signing::exchange::BoxFuture<'_, Result<Answer, TransportError>> {
        let headers = ex
            .headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        self.seen.lock().expect("lock").push((
            ex.rule.clone(),
            ex.url.clone(),
            headers,
            String::from_utf8_lossy(&ex.body).into_owned(),
        ));
        let answer = Answer {
            status: self.status,
            body: bytes::Bytes::from(self.body.clone()),
        };
        Box::pin(async move { Ok(answer) })
    }
}

fn stores(status: u16, body: &str, region: Option<&str>) -> (Stores, Arc<Fake>) {
    let fake = Arc::new(Fake {
        status,
        body: body.to_string(),
        seen: Mutex::default(),
    });
    let mut env = vec![
        ("AWS_ACCESS_KEY_ID".to_string(), "AKIDSTORE".to_string()),
        (
            "AWS_SECRET_ACCESS_KEY".to_string(),
            "store-secret".to_string(),
        ),
    ];
    if let Some(r) = region {
        env.push(("AWS_REGION".to_string(), r.to_string()));
    }
    let identity = AwsIdentity::new(env, None, None);
    (Stores::new(fake.clone(), Arc::new(identity)), fake)
}

fn sm(id: &str, json_key: Option<&str>, stage: Option<&str>, version_id: Option<&str>) -> Location {
    Location::AwsSm {
        id: id.to_string(),
        json_key: json_key.map(str::to_string),
        stage: stage.map(str::to_string),
        version_id: version_id.map(str::to_string),
        region: None,
    }
}

fn text(f: &Fetched) -> &str {
    std::str::from_utf8(f.value.expose()).expect("utf8")
}

#[tokio::test]
async fn secrets_manager_reads_the_string_signed_for_its_region() {
    let (s, fake) = stores(
        200,
        r#"{"Name":"db","SecretString":"s3cr3t-value"}"#,
        Some("eu-west-1"),
    );
    let got = s
        .fetch(
            "db_password",
            &sm("prod/db", None, Some("AWSPREVIOUS"), None),
        )
        .await
        .expect("fetched");
    assert_eq!(text(&got), "s3cr3t-value");
    assert!(got.valid_for.is_none());
    let seen = fake.seen.lock().expect("lock");
    let (rule, url, headers, body) = &seen[0];
    assert_eq!(rule, "secret:db_password");
    assert_eq!(url, "https://secretsmanager.eu-west-1.amazonaws.com");
    let header = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(
        header("x-amz-target"),
        Some("secretsmanager.GetSecretValue")
    );
    let auth = header("authorization").expect("signed");
    assert!(
        auth.contains("Credential=AKIDSTORE/") && auth.contains("/eu-west-1/secretsmanager/"),
        "{auth}"
    );
    let body: serde_json::Value = serde_json::from_str(body).expect("json");
    assert_eq!(
        body,
        serde_json::json!({"SecretId": "prod/db", "VersionStage": "AWSPREVIOUS"})
    );
}

#[tokio::test]
async fn a_json_key_is_taken_and_a_missing_one_lists_names_only() {
    let answer =
        r#"{"SecretString":"{\"user\":\"admin\",\"password\":\"pw-value-123\",\"port\":5432}"}"#;
    let (s, fake) = stores(200, answer, Some("us-east-1"));
    let got = s
        .fetch("db", &sm("db", Some("password"), None, Some("v-1")))
        .await
        .expect("key");
    assert_eq!(text(&got), "pw-value-123");
    assert!(fake.seen.lock().expect("lock")[0]
        .3
        .contains("\"VersionId\":\"v-1\""));
    let port = s
        .fetch("db", &sm("db", Some("port"), None, None))
        .await
        .expect("number");
    assert_eq!(text(&port), "5432");
    let err = s
        .fetch("db", &sm("db", Some("pass"), None, None))
        .await
        .err()
        .expect("absent");
    assert!(
        err.contains("no key \"pass\"") && err.contains("password, port, user"),
        "{err}"
    );
    assert!(
        !err.contains("pw-value-123") && !err.contains("admin"),
        "{err}"
    );
}

#[tokio::test]
async fn binary_secrets_are_decoded() {
    let (s, _) = stores(200, r#"{"SecretBinary":"AAEC/w=="}"#, Some("us-east-1"));
    let got = s
        .fetch("bin", &sm("bin", None, None, None))
        .await
        .expect("binary");
    assert_eq!(got.value.expose(), &[0u8, 1, 2, 255]);
}

#[tokio::test]
async fn aws_errors_are_named_capped_and_a_region_is_required() {
    let long = "x".repeat(500);
    let answer = format!(
        r#"{{"__type":"com.amazonaws#ResourceNotFoundException","Message":"not here {long}"}}"#
    );
    let (s, _) = stores(400, &answer, Some("us-east-1"));
    let err = s
        .fetch("db", &sm("prod/db", None, None, None))
        .await
        .err()
        .expect("error");
    assert!(
        err.starts_with(
            "aws-sm:prod/db: secretsmanager answered 400 ResourceNotFoundException: not here"
        ),
        "{err}"
    );
    assert!(err.len() < 320, "{}", err.len());

    let (s, fake) = stores(200, "{}", None);
    let err = s
        .fetch("db", &sm("prod/db", None, None, None))
        .await
        .err()
        .expect("no region");
    assert!(err.contains("no region"), "{err}");
    assert!(fake.seen.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn ssm_reads_a_decrypted_parameter_at_a_version() {
    let (s, fake) = stores(
        200,
        r#"{"Parameter":{"Name":"/app/key","Value":"ssm-value-9","Version":3}}"#,
        None,
    );
    let at = Location::AwsSsm {
        name: "/app/key".to_string(),
        version: Some(3),
        region: Some("ap-south-1".to_string()),
    };
    let got = s.fetch("app_key", &at).await.expect("param");
    assert_eq!(text(&got), "ssm-value-9");
    let seen = fake.seen.lock().expect("lock");
    assert_eq!(seen[0].1, "https://ssm.ap-south-1.amazonaws.com");
    let body: serde_json::Value = serde_json::from_str(&seen[0].3).expect("json");
    assert_eq!(
        body,
        serde_json::json!({"Name": "/app/key:3", "WithDecryption": true})
    );
    let header = |n: &str| {
        seen[0]
            .2
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        header("x-amz-target").as_deref(),
        Some("AmazonSSM.GetParameter")
    );
}

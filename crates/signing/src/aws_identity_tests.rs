use std::sync::Mutex;

use super::*;
use crate::exchange::{Answer, BoxFuture, Exchange, TransportError};

/// One request as the fake transport saw it.
#[derive(Clone, Debug)]
struct Seen {
    rule: String,
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: String,
    route: Route,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Answers by the first script entry whose method and URL suffix match; records every call.
#[derive(Default)]
struct Fake {
    script: Mutex<Vec<(&'static str, String, u16, String)>>,
    seen: Mutex<Vec<Seen>>,
}

impl Fake {
    fn on(self, method: &'static str, url_suffix: &str, status: u16, body: &str) -> Self {
        self.script.lock().expect("lock").push((
            method,
            url_suffix.to_string(),
            status,
            body.to_string(),
        ));
        self
    }
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

impl TokenTransport for Fake {
    fn call(&self, ex: Exchange) -> BoxFuture<'_, Result<Answer, TransportError>> {
        let seen = Seen {
            rule: ex.rule.clone(),
            method: ex.method.to_string(),
            url: ex.url.clone(),
            headers: ex
                .headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_string()))
                .collect(),
            body: String::from_utf8_lossy(&ex.body).into_owned(),
            route: ex.route.clone(),
        };
        self.seen.lock().expect("lock").push(seen);
        let script = self.script.lock().expect("lock");
        let hit = script.iter().find(|(m, suffix, _, _)| {
            *m == ex.method.as_str() && ex.url.ends_with(suffix.as_str())
        });
        let answer = hit.map(|(_, _, status, body)| Answer {
            status: *status,
            body: bytes::Bytes::from(body.clone()),
        });
        Box::pin(async move { answer.ok_or_else(|| TransportError("unreachable".into())) })
    }
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn identity(
    pairs: &[(&str, &str)],
    home: Option<PathBuf>,
    imds: Option<ImdsConfig>,
) -> AwsIdentity {
    AwsIdentity::new(env(pairs), home, imds)
}

fn text(v: &SecretValue) -> &str {
    std::str::from_utf8(v.expose()).expect("utf8")
}

fn rfc3339_in(secs: u64) -> String {
    humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(secs)).to_string()
}

fn sts_answer(akid: &str, secret: &str, expires_in: u64) -> String {
    format!(
        "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>\
         <AccessKeyId>{akid}</AccessKeyId><SecretAccessKey>{secret}</SecretAccessKey>\
         <SessionToken>tok-{akid}</SessionToken><Expiration>{}</Expiration>\
         </Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>",
        rfc3339_in(expires_in)
    )
}

fn creds_json(akid: &str, secret: &str, expires_in: u64) -> String {
    format!(
        r#"{{"Code":"Success","AccessKeyId":"{akid}","SecretAccessKey":"{secret}","Token":"tok-{akid}","Expiration":"{}"}}"#,
        rfc3339_in(expires_in)
    )
}

const NOTHING: &[(&str, &str)] = &[];

#[tokio::test]
async fn env_keys_come_first_need_no_call_and_never_show() {
    let id = identity(
        &[
            ("AWS_ACCESS_KEY_ID", "AKIDENV"),
            ("AWS_SECRET_ACCESS_KEY", "env-secret-value"),
            ("AWS_SESSION_TOKEN", "env-session-token"),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", "/nonexistent"),
            ("HOME_NOT_AWS", "ignored"),
        ],
        None,
        Some(ImdsConfig::default()),
    );
    let fake = Fake::default();
    let keys = id.keys(&fake).await.expect("keys");
    assert_eq!(text(&keys.access_key_id), "AKIDENV");
    assert_eq!(text(&keys.secret_access_key), "env-secret-value");
    assert_eq!(
        keys.session_token.as_ref().map(text),
        Some("env-session-token")
    );
    assert_eq!(keys.provider, "env");
    assert!(fake.seen().is_empty());
    let shown = format!("{keys:?} {id:?}");
    for secret in ["AKIDENV", "env-secret-value", "env-session-token"] {
        assert!(!shown.contains(secret), "{shown}");
    }
}

#[tokio::test]
async fn half_a_key_pair_in_env_is_an_error_naming_the_variable() {
    let id = identity(&[("AWS_ACCESS_KEY_ID", "AKIDHALF")], None, None);
    let err = id.keys(&Fake::default()).await.expect_err("refused");
    assert!(
        err.contains("env: AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"),
        "{err}"
    );
    assert!(!err.contains("AKIDHALF"), "{err}");
}

#[tokio::test]
async fn with_nothing_configured_every_provider_is_listed_and_imds_is_off() {
    let home = tempfile::tempdir().expect("tmp");
    let id = identity(NOTHING, Some(home.path().into()), None);
    let fake = Fake::default();
    let err = id.keys(&fake).await.expect_err("nothing");
    for part in [
        "env: AWS_ACCESS_KEY_ID is not set",
        "profile: no profile \"default\"",
        "web identity: AWS_WEB_IDENTITY_TOKEN_FILE is not set",
        "container: neither",
        "imds: off (enable with --aws-imds)",
    ] {
        assert!(err.contains(part), "{part}: {err}");
    }
    // IMDS is never called unless enabled.
    assert!(fake.seen().is_empty());
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

#[tokio::test]
async fn shared_files_give_static_keys_region_and_named_profiles() {
    let home = tempfile::tempdir().expect("tmp");
    let aws = home.path().join(".aws");
    std::fs::create_dir(&aws).expect("mkdir");
    write(
        &aws,
        "config",
        "[default]\nregion = eu-west-1 # comment\n\n[profile dev]\nregion=us-west-2\ns3 =\n  max_concurrent_requests = 4\naws_access_key_id = AKIDCONFIG\naws_secret_access_key = config-secret\n[sso-session x]\nregion = nowhere-1\n",
    );
    write(
        &aws,
        "credentials",
        "; comment\n[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = default-secret\n[dev]\naws_access_key_id = AKIDDEV\naws_secret_access_key = dev-secret\n",
    );
    let id = identity(NOTHING, Some(home.path().into()), None);
    let keys = id.keys(&Fake::default()).await.expect("keys");
    assert_eq!(
        (text(&keys.access_key_id), keys.provider),
        ("AKIDDEFAULT", "profile")
    );
    assert_eq!(id.region().as_deref(), Some("eu-west-1"));

    // AWS_PROFILE picks dev; its credentials-file keys win over config's.
    let id = identity(&[("AWS_PROFILE", "dev")], Some(home.path().into()), None);
    let keys = id.keys(&Fake::default()).await.expect("keys");
    assert_eq!(text(&keys.access_key_id), "AKIDDEV");
    assert_eq!(text(&keys.secret_access_key), "dev-secret");
    assert_eq!(id.region().as_deref(), Some("us-west-2"));
    // AWS_REGION wins over the profile.
    let id = identity(
        &[("AWS_PROFILE", "dev"), ("AWS_REGION", "ap-south-1")],
        Some(home.path().into()),
        None,
    );
    assert_eq!(id.region().as_deref(), Some("ap-south-1"));

    // A named profile that is absent stops the chain.
    let id = identity(&[("AWS_PROFILE", "nope")], Some(home.path().into()), None);
    let err = id.keys(&Fake::default()).await.expect_err("absent");
    assert!(err.contains("profile: no profile \"nope\""), "{err}");
    assert!(err.contains("tried before: env:"), "{err}");
}

#[tokio::test]
async fn explicit_file_variables_are_read_and_bad_lines_named_without_their_text() {
    let dir = tempfile::tempdir().expect("tmp");
    let creds = write(
        dir.path(),
        "creds",
        "[default]\naws_access_key_id AKIDBROKEN-secret-ish\n",
    );
    let id = identity(
        &[("AWS_SHARED_CREDENTIALS_FILE", creds.to_str().expect("utf8"))],
        None,
        None,
    );
    let err = id.keys(&Fake::default()).await.expect_err("bad line");
    assert!(
        err.contains(":2: expected [section] or key = value"),
        "{err}"
    );
    assert!(!err.contains("AKIDBROKEN"), "{err}");
}

#[tokio::test]
async fn a_role_profile_assumes_its_role_with_the_source_profiles_keys_in_order() {
    let dir = tempfile::tempdir().expect("tmp");
    let config = write(
        dir.path(),
        "config",
        "[profile app]\nrole_arn = arn:aws:iam::1:role/app\nsource_profile = middle\nrole_session_name = s-app\nexternal_id = ext-1\nregion = eu-central-1\n\
         [profile middle]\nrole_arn = arn:aws:iam::1:role/middle\nsource_profile = base\n\
         [profile base]\naws_access_key_id = AKIDBASE\naws_secret_access_key = base-secret\n",
    );
    // The first AssumeRole (middle) answers MIDDLE keys, the second (app) answers APP keys.
    let fake = Fake::default().on(
        "POST",
        "",
        200,
        &sts_answer("AKIDMIDDLE", "middle-secret", 3600),
    );
    let id = identity(
        &[
            ("AWS_CONFIG_FILE", config.to_str().expect("utf8")),
            ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/creds"),
            ("AWS_PROFILE", "app"),
        ],
        None,
        None,
    );
    let keys = id.keys(&fake).await.expect("keys");
    // Both answers were the same script entry: what matters is the requests.
    assert_eq!(text(&keys.access_key_id), "AKIDMIDDLE");
    assert_eq!(keys.provider, "profile");
    let seen = fake.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let (first, second) = (&seen[0], &seen[1]);
    for s in &seen {
        assert_eq!(s.rule, "latchkey:aws");
        assert_eq!(s.url, "https://sts.eu-central-1.amazonaws.com");
        assert_eq!(s.route, Route::default());
    }
    assert!(
        first
            .body
            .contains("RoleArn=arn%3Aaws%3Aiam%3A%3A1%3Arole%2Fmiddle"),
        "{}",
        first.body
    );
    let auth = first.header("authorization").expect("signed");
    assert!(
        auth.contains("Credential=AKIDBASE/") && auth.contains("/eu-central-1/sts/aws4_request"),
        "{auth}"
    );
    assert!(second.body.contains("role%2Fapp") && second.body.contains("ExternalId=ext-1"));
    assert!(second.body.contains("RoleSessionName=s-app"));
    let auth = second.header("authorization").expect("signed");
    assert!(auth.contains("Credential=AKIDMIDDLE/"), "{auth}");
    assert_eq!(
        second.header("x-amz-security-token"),
        Some("tok-AKIDMIDDLE")
    );
}

#[tokio::test]
async fn role_profiles_that_cannot_work_say_why() {
    let dir = tempfile::tempdir().expect("tmp");
    let config = write(
        dir.path(),
        "config",
        "[profile loop]\nrole_arn = arn:aws:iam::1:role/a\nsource_profile = loop2\n\
         [profile loop2]\nrole_arn = arn:aws:iam::1:role/b\nsource_profile = loop\n\
         [profile src]\nrole_arn = arn:aws:iam::1:role/c\ncredential_source = Ec2InstanceMetadata\n\
         [profile half]\naws_access_key_id = AKIDHALFPROFILE\n",
    );
    for (profile, want) in [
        ("loop", "chain longer than"),
        ("src", "credential_source is not supported"),
        ("half", "has aws_access_key_id but no aws_secret_access_key"),
    ] {
        let id = identity(
            &[
                ("AWS_CONFIG_FILE", config.to_str().expect("utf8")),
                ("AWS_PROFILE", profile),
            ],
            Some(dir.path().into()),
            None,
        );
        let err = id.keys(&Fake::default()).await.expect_err(profile);
        assert!(err.contains(want), "{profile}: {err}");
        assert!(!err.contains("AKIDHALFPROFILE"), "{err}");
    }
}

#[tokio::test]
async fn web_identity_is_unsigned_and_reads_the_token_file_afresh() {
    tokio::time::pause();
    let dir = tempfile::tempdir().expect("tmp");
    let token = write(dir.path(), "token", "eyJ.first-jwt.sig\n");
    let fake = Fake::default().on("POST", "", 200, &sts_answer("AKIDWEB", "web-secret", 600));
    let id = identity(
        &[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token.to_str().expect("utf8")),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/irsa"),
            ("AWS_ROLE_SESSION_NAME", "pod-1"),
            ("AWS_REGION", "us-west-2"),
        ],
        Some(dir.path().into()),
        None,
    );
    let keys = id.keys(&fake).await.expect("keys");
    assert_eq!(
        (text(&keys.access_key_id), keys.provider),
        ("AKIDWEB", "web identity")
    );
    let seen = fake.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].url, "https://sts.us-west-2.amazonaws.com");
    assert!(seen[0].header("authorization").is_none(), "unsigned");
    for part in [
        "Action=AssumeRoleWithWebIdentity",
        "WebIdentityToken=eyJ.first-jwt.sig",
        "RoleSessionName=pod-1",
    ] {
        assert!(seen[0].body.contains(part), "{part}: {}", seen[0].body);
    }
    // Cached until five minutes before expiry, then fetched with the token file as it is now.
    id.keys(&fake).await.expect("cached");
    assert_eq!(fake.seen().len(), 1);
    std::fs::write(&token, "eyJ.second-jwt.sig").expect("rotate");
    tokio::time::advance(Duration::from_secs(301)).await;
    id.keys(&fake).await.expect("refreshed");
    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen[1].body.contains("WebIdentityToken=eyJ.second-jwt.sig"));
}

#[tokio::test]
async fn web_identity_without_a_role_or_token_fails_and_sts_errors_show_no_answer_text() {
    let id = identity(&[("AWS_WEB_IDENTITY_TOKEN_FILE", "/x")], None, None);
    let err = id.keys(&Fake::default()).await.expect_err("no role");
    assert!(
        err.contains("web identity: AWS_WEB_IDENTITY_TOKEN_FILE is set but AWS_ROLE_ARN is not"),
        "{err}"
    );

    let dir = tempfile::tempdir().expect("tmp");
    let token = write(dir.path(), "token", "eyJ.secret-jwt.sig");
    let fake = Fake::default().on(
        "POST",
        "",
        403,
        "<ErrorResponse><Error><Code>AccessDenied</Code><Message>eyJ.secret-jwt.sig not valid</Message></Error></ErrorResponse>",
    );
    let id = identity(
        &[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token.to_str().expect("utf8")),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/irsa"),
        ],
        None,
        None,
    );
    let err = id.keys(&fake).await.expect_err("denied");
    assert!(
        err.contains("answered 403 (AccessDenied)") && err.contains("https://sts.amazonaws.com"),
        "{err}"
    );
    assert!(!err.contains("secret-jwt"), "{err}");
}

#[tokio::test]
async fn ecs_relative_uri_goes_to_the_agent_address_only_in_cleartext() {
    let fake = Fake::default().on(
        "GET",
        "/v2/credentials/abc",
        200,
        &creds_json("AKIDECS", "ecs-secret", 3600),
    );
    let id = identity(
        &[(
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "/v2/credentials/abc",
        )],
        None,
        None,
    );
    let keys = id.keys(&fake).await.expect("keys");
    assert_eq!(
        (text(&keys.access_key_id), keys.provider),
        ("AKIDECS", "container")
    );
    assert_eq!(keys.session_token.as_ref().map(text), Some("tok-AKIDECS"));
    let seen = fake.seen();
    assert_eq!(seen[0].url, "http://169.254.170.2/v2/credentials/abc");
    assert!(seen[0].route.cleartext);
    assert_eq!(
        seen[0].route.allow_private,
        only(IpAddr::from([169, 254, 170, 2]))
    );
    assert_eq!(seen[0].rule, "latchkey:aws");
    assert!(seen[0].header("authorization").is_none());
}

#[tokio::test]
async fn eks_pod_identity_full_uri_sends_the_token_file_and_odd_hosts_are_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let token = write(dir.path(), "token", "pod-identity-token\n");
    let fake = Fake::default().on(
        "GET",
        "/v1/credentials",
        200,
        &creds_json("AKIDPOD", "pod-secret", 3600),
    );
    let id = identity(
        &[
            (
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "http://169.254.170.23/v1/credentials",
            ),
            (
                "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
                token.to_str().expect("utf8"),
            ),
            ("AWS_CONTAINER_AUTHORIZATION_TOKEN", "ignored-when-file"),
        ],
        None,
        None,
    );
    let keys = id.keys(&fake).await.expect("keys");
    assert_eq!(text(&keys.access_key_id), "AKIDPOD");
    let seen = fake.seen();
    assert_eq!(seen[0].header("authorization"), Some("pod-identity-token"));
    assert_eq!(
        seen[0].route.allow_private,
        only(IpAddr::from([169, 254, 170, 23]))
    );

    for url in ["http://10.0.0.1/creds", "http://metadata.example/creds"] {
        let id = identity(&[("AWS_CONTAINER_CREDENTIALS_FULL_URI", url)], None, None);
        let fake = Fake::default();
        let err = id.keys(&fake).await.expect_err(url);
        assert!(
            err.contains("container:") && err.contains("plain http://"),
            "{err}"
        );
        assert!(fake.seen().is_empty());
    }
    // A bad answer is an error, not keys.
    let fake = Fake::default().on("GET", "/c", 200, r#"{"AccessKeyId":"AKIDONLY"}"#);
    let id = identity(
        &[("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://127.0.0.1:9/c")],
        None,
        None,
    );
    let err = id.keys(&fake).await.expect_err("half");
    assert!(
        err.contains("without AccessKeyId and SecretAccessKey") && !err.contains("AKIDONLY"),
        "{err}"
    );
}

#[tokio::test]
async fn imds_v2_takes_a_session_token_first_and_only_when_enabled() {
    let fake = Fake::default()
        .on("PUT", "/latest/api/token", 200, "imds-session-token")
        .on("GET", "/security-credentials/", 200, "my-role\n")
        .on(
            "GET",
            "/security-credentials/my-role",
            200,
            &creds_json("AKIDIMDS", "imds-secret", 3600),
        );
    let id = identity(NOTHING, None, Some(ImdsConfig::default()));
    let keys = id.keys(&fake).await.expect("keys");
    assert_eq!(
        (text(&keys.access_key_id), keys.provider),
        ("AKIDIMDS", "imds")
    );
    let seen = fake.seen();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen[0].method, "PUT");
    assert_eq!(seen[0].url, "http://169.254.169.254/latest/api/token");
    assert_eq!(
        seen[0].header("x-aws-ec2-metadata-token-ttl-seconds"),
        Some("21600")
    );
    for s in &seen[1..] {
        assert_eq!(s.method, "GET");
        assert_eq!(
            s.header("x-aws-ec2-metadata-token"),
            Some("imds-session-token")
        );
    }
    assert_eq!(
        seen[2].url,
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/my-role"
    );
    for s in &seen {
        assert!(s.route.cleartext);
        assert_eq!(
            s.route.allow_private,
            only(IpAddr::from([169, 254, 169, 254]))
        );
    }

    // The endpoint variable is honoured; a refused token PUT fails (no IMDSv1 fallback).
    let fake = Fake::default().on("PUT", "/latest/api/token", 403, "");
    let id = identity(
        &[(
            "AWS_EC2_METADATA_SERVICE_ENDPOINT",
            "http://127.0.0.1:8111/",
        )],
        None,
        Some(ImdsConfig::default()),
    );
    let err = id.keys(&fake).await.expect_err("no v1");
    assert!(
        err.contains("imds: http://127.0.0.1:8111/latest/api/token answered 403"),
        "{err}"
    );
    assert_eq!(fake.seen().len(), 1);
}

#[tokio::test]
async fn keys_near_expiry_are_fetched_again_once_and_a_failed_early_refresh_keeps_valid_keys() {
    tokio::time::pause();
    let fake = Fake::default().on("GET", "/c", 200, &creds_json("AKIDONE", "one-secret", 900));
    let id = identity(
        &[("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://127.0.0.1:9/c")],
        None,
        None,
    );
    let (a, b) = tokio::join!(id.keys(&fake), id.keys(&fake));
    assert!(a.is_ok() && b.is_ok());
    assert_eq!(fake.seen().len(), 1, "single flight");
    tokio::time::advance(Duration::from_secs(590)).await;
    id.keys(&fake).await.expect("cached");
    assert_eq!(fake.seen().len(), 1);
    tokio::time::advance(Duration::from_secs(20)).await;
    // Past the refresh point: the endpoint now fails, but the keys have 5 minutes left.
    fake.script.lock().expect("lock").clear();
    let keys = id.keys(&fake).await.expect("still valid");
    assert_eq!(text(&keys.access_key_id), "AKIDONE");
    assert_eq!(fake.seen().len(), 2);
    tokio::time::advance(Duration::from_secs(400)).await;
    let err = id.keys(&fake).await.expect_err("expired");
    assert!(
        err.contains("container: http://127.0.0.1:9/c: unreachable"),
        "{err}"
    );
}

#[test]
fn endpoints_follow_the_region_and_the_operators_overrides() {
    let id = identity(NOTHING, None, None);
    assert_eq!(
        id.endpoint("sts", None),
        ("https://sts.amazonaws.com".into(), Route::default())
    );
    assert_eq!(
        id.endpoint("secretsmanager", Some("eu-west-1")).0,
        "https://secretsmanager.eu-west-1.amazonaws.com"
    );
    let id = identity(
        &[
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:5000/"),
            ("AWS_ENDPOINT_URL_SSM", "https://ssm.internal.example"),
            ("AWS_ENDPOINT_URL_SECRETS_MANAGER", "http://10.1.2.3:80"),
        ],
        None,
        None,
    );
    let (url, route) = id.endpoint("sts", Some("us-east-1"));
    assert_eq!(url, "http://127.0.0.1:5000");
    assert!(route.cleartext);
    assert_eq!(route.allow_private, only(IpAddr::from([127, 0, 0, 1])));
    assert_eq!(
        id.endpoint("ssm", None),
        ("https://ssm.internal.example".into(), Route::default())
    );
    // Not loopback: no cleartext, so the transport refuses http:// unsent.
    assert_eq!(id.endpoint("secretsmanager", None).1, Route::default());
}

#[tokio::test]
async fn json_calls_are_signed_for_the_service_and_region() {
    let fake = Fake::default().on("POST", "", 200, "{}");
    let id = identity(
        &[
            ("AWS_ACCESS_KEY_ID", "AKIDJSON"),
            ("AWS_SECRET_ACCESS_KEY", "json-secret"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:5000"),
        ],
        None,
        None,
    );
    let answer = id
        .call_json(
            &fake,
            "secret:db".into(),
            "secretsmanager",
            "us-west-2",
            "secretsmanager.GetSecretValue",
            b"{\"SecretId\":\"db\"}".to_vec(),
        )
        .await
        .expect("answer");
    assert_eq!(answer.status, 200);
    let seen = &fake.seen()[0];
    assert_eq!(
        (seen.rule.as_str(), seen.url.as_str()),
        ("secret:db", "http://127.0.0.1:5000")
    );
    assert_eq!(
        seen.header("x-amz-target"),
        Some("secretsmanager.GetSecretValue")
    );
    assert_eq!(
        seen.header("content-type"),
        Some("application/x-amz-json-1.1")
    );
    let auth = seen.header("authorization").expect("signed");
    assert!(
        auth.contains("Credential=AKIDJSON/")
            && auth.contains("/us-west-2/secretsmanager/aws4_request"),
        "{auth}"
    );
    assert!(auth.contains("x-amz-target"), "{auth}");
    assert_eq!(seen.body, "{\"SecretId\":\"db\"}");
}

mod ini {
    use super::super::aws_profile::parse_ini;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_text_parses_or_fails_without_panicking(text in "\\PC{0,200}") {
            let _ = parse_ini(&text, "f");
        }

        #[test]
        fn written_sections_read_back(
            sections in proptest::collection::vec(
                ("[a-z][a-z0-9_-]{0,8}",
                 proptest::collection::btree_map("[a-z][a-z0-9_]{0,8}", "[A-Za-z0-9/+=._-]{0,20}", 0..4)),
                1..4)
        ) {
            let mut text = String::new();
            for (name, keys) in &sections {
                text.push_str(&format!("[{name}]\n# c\n"));
                for (k, v) in keys {
                    text.push_str(&format!("{k} = {v}\n"));
                }
            }
            let parsed = parse_ini(&text, "f").expect("parses");
            prop_assert_eq!(parsed.len(), sections.len());
            for ((name, keys), (pname, pkeys)) in sections.iter().zip(&parsed) {
                prop_assert_eq!(name, pname);
                let got: std::collections::BTreeMap<&str, &str> =
                    pkeys.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                let want: std::collections::BTreeMap<&str, &str> =
                    keys.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                prop_assert_eq!(got, want);
            }
        }
    }
}

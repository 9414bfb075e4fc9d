//! Where latchkey's own AWS calls go: service endpoints (with the operator's
//! `AWS_ENDPOINT_URL*` overrides), the container credential endpoint (ECS, EKS Pod Identity),
//! the instance metadata service (IMDSv2 only) — and a signed AWS JSON call for the stores.

use std::net::IpAddr;
use std::time::SystemTime;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method};

use super::{only, AwsIdentity, AwsKeys, Outcome};
use crate::exchange::{Answer, Exchange, Route, TokenTransport};
use crate::secrets::SecretValue;
use crate::sigv4;

/// The ECS agent's credential endpoint, which `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` is on.
const ECS_ENDPOINT: &str = "http://169.254.170.2";

/// The instance metadata service, when the operator opted in (`--aws-imds`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImdsConfig {
    /// `http://IP[:PORT]`; `AWS_EC2_METADATA_SERVICE_ENDPOINT` overrides it.
    pub endpoint: String,
}

impl Default for ImdsConfig {
    fn default() -> Self {
        Self {
            endpoint: "http://169.254.169.254".to_string(),
        }
    }
}

/// The env var overriding `service`'s endpoint (`AWS_ENDPOINT_URL_SECRETS_MANAGER`).
fn endpoint_var(service: &str) -> String {
    let id = match service {
        "secretsmanager" => "SECRETS_MANAGER",
        other => other,
    };
    format!(
        "AWS_ENDPOINT_URL_{}",
        id.to_ascii_uppercase().replace('-', "_")
    )
}

/// See [`AwsIdentity::endpoint`].
pub(super) fn endpoint<'a>(
    var: impl Fn(&str) -> Option<&'a str>,
    service: &str,
    region: Option<&str>,
) -> (String, Route) {
    if let Some(url) = var(&endpoint_var(service)).or(var("AWS_ENDPOINT_URL")) {
        let url = url.trim().trim_end_matches('/').to_string();
        let route = match ip_host(&url) {
            Some(ip) if ip.is_loopback() => Route {
                cleartext: true,
                allow_private: only(ip),
                ..Route::default()
            },
            _ => Route::default(),
        };
        return (url, route);
    }
    let url = match (service, region) {
        ("sts", None) => "https://sts.amazonaws.com".to_string(),
        (_, Some(r)) => format!("https://{service}.{r}.amazonaws.com"),
        (_, None) => format!("https://{service}.us-east-1.amazonaws.com"),
    };
    (url, Route::default())
}

/// The host of `url` when it is an IP literal.
fn ip_host(url: &str) -> Option<IpAddr> {
    let uri: http::Uri = url.parse().ok()?;
    uri.host()?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// The route of a metadata or container endpoint at `url`: plain `http://` to exactly its own
/// address (an IP literal), which the address guard would otherwise refuse.
fn metadata_route(url: &str, allowed: impl Fn(IpAddr) -> bool) -> Result<Route, String> {
    let uri: http::Uri = url.parse().map_err(|_| format!("{url:?} is not a URL"))?;
    let ip = ip_host(url);
    match (uri.scheme_str(), ip) {
        (Some("http"), Some(ip)) if allowed(ip) => Ok(Route {
            cleartext: true,
            allow_private: only(ip),
            ..Route::default()
        }),
        (Some("https"), ip) => Ok(Route {
            allow_private: ip.map(only).unwrap_or_default(),
            ..Route::default()
        }),
        _ => Err(format!(
            "{url} is not an endpoint latchkey calls over plain http:// (a loopback or the AWS link-local address, as an IP)"
        )),
    }
}

/// The container endpoints plain `http://` may reach: loopback, ECS, EKS Pod Identity.
fn container_address(ip: IpAddr) -> bool {
    ip.is_loopback()
        || ip == IpAddr::from([169, 254, 170, 2])
        || ip == IpAddr::from([169, 254, 170, 23])
        || ip == IpAddr::from([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23])
}

/// A GET (or PUT) to a metadata endpoint under [`super::RULE`].
async fn fetch(
    transport: &dyn TokenTransport,
    method: Method,
    url: &str,
    route: &Route,
    headers: Vec<(HeaderName, HeaderValue)>,
) -> Result<Bytes, String> {
    let answer = transport
        .call(Exchange {
            rule: super::RULE.to_string(),
            method,
            url: url.to_string(),
            headers,
            body: Bytes::new(),
            route: route.clone(),
        })
        .await
        .map_err(|why| format!("{url}: {why}"))?;
    if !(200..300).contains(&answer.status) {
        return Err(format!("{url} answered {}", answer.status));
    }
    Ok(answer.body)
}

fn sensitive(value: &str) -> Result<HeaderValue, String> {
    let mut v = HeaderValue::from_str(value.trim())
        .map_err(|_| "a token is not valid in a header".to_string())?;
    v.set_sensitive(true);
    Ok(v)
}

/// The credentials JSON both container and metadata endpoints answer.
fn creds_json(body: &[u8], from: &str) -> Result<(AwsKeys, Option<SystemTime>), String> {
    let json: serde_json::Value = serde_json::from_slice(body)
        .map_err(|_| format!("{from} answered something that is not JSON"))?;
    if let Some(code) = json.get("Code").and_then(|c| c.as_str()) {
        if code != "Success" {
            return Err(format!("{from} answered Code {:?}", cap(code)));
        }
    }
    let field = |k: &str| {
        json.get(k)
            .and_then(|v| v.as_str())
            .filter(|v| !v.is_empty())
            .map(|v| SecretValue::new(v.as_bytes().to_vec()))
    };
    let (Some(akid), Some(secret)) = (field("AccessKeyId"), field("SecretAccessKey")) else {
        return Err(format!(
            "{from} answered without AccessKeyId and SecretAccessKey"
        ));
    };
    let expires = json
        .get("Expiration")
        .and_then(|e| e.as_str())
        .and_then(|e| humantime::parse_rfc3339_weak(e).ok());
    Ok((
        AwsKeys {
            access_key_id: akid,
            secret_access_key: secret,
            session_token: field("Token"),
            provider: "container",
        },
        expires,
    ))
}

fn cap(s: &str) -> String {
    s.chars().take(64).collect()
}

/// ECS / EKS Pod Identity: the container credential endpoint.
pub(super) async fn container<'a>(
    var: impl Fn(&str) -> Option<&'a str>,
    transport: &dyn TokenTransport,
) -> Outcome {
    let url = match (
        var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"),
        var("AWS_CONTAINER_CREDENTIALS_FULL_URI"),
    ) {
        (Some(rel), _) => format!("{ECS_ENDPOINT}/{}", rel.trim().trim_start_matches('/')),
        (None, Some(full)) => full.trim().to_string(),
        (None, None) => {
            return Outcome::Skip(
                "neither AWS_CONTAINER_CREDENTIALS_RELATIVE_URI nor _FULL_URI is set".to_string(),
            )
        }
    };
    let route = match metadata_route(&url, container_address) {
        Ok(r) => r,
        Err(why) => return Outcome::Failed(why),
    };
    let token = match (
        var("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"),
        var("AWS_CONTAINER_AUTHORIZATION_TOKEN"),
    ) {
        (Some(file), _) => match std::fs::read_to_string(file) {
            Ok(t) => Some(zeroize::Zeroizing::new(t)),
            Err(e) => {
                return Outcome::Failed(format!(
                    "cannot read AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE {file}: {e}"
                ))
            }
        },
        (None, Some(t)) => Some(zeroize::Zeroizing::new(t.to_string())),
        (None, None) => None,
    };
    let mut headers = vec![(
        http::header::ACCEPT,
        HeaderValue::from_static("application/json"),
    )];
    if let Some(t) = token {
        match sensitive(&t) {
            Ok(v) => headers.push((http::header::AUTHORIZATION, v)),
            Err(why) => return Outcome::Failed(format!("the authorization token: {why}")),
        }
    }
    match fetch(transport, Method::GET, &url, &route, headers).await {
        Ok(body) => match creds_json(&body, &url) {
            Ok((keys, expires)) => Outcome::Found(keys, expires),
            Err(why) => Outcome::Failed(why),
        },
        Err(why) => Outcome::Failed(why),
    }
}

/// EC2 instance metadata, IMDSv2: a session token (PUT), the role name, the role's keys.
pub(super) async fn imds<'a>(
    cfg: &ImdsConfig,
    var: impl Fn(&str) -> Option<&'a str>,
    transport: &dyn TokenTransport,
) -> Outcome {
    let base = var("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        .unwrap_or(&cfg.endpoint)
        .trim()
        .trim_end_matches('/')
        .to_string();
    match imds_keys(&base, transport).await {
        Ok((keys, expires)) => Outcome::Found(keys, expires),
        Err(why) => Outcome::Failed(why),
    }
}

async fn imds_keys(
    base: &str,
    transport: &dyn TokenTransport,
) -> Result<(AwsKeys, Option<SystemTime>), String> {
    // Any IP: the operator named this endpoint explicitly (or it is the default).
    let route = metadata_route(base, |_| true)?;
    let token = fetch(
        transport,
        Method::PUT,
        &format!("{base}/latest/api/token"),
        &route,
        vec![(
            HeaderName::from_static("x-aws-ec2-metadata-token-ttl-seconds"),
            HeaderValue::from_static("21600"),
        )],
    )
    .await?;
    let token = zeroize::Zeroizing::new(
        String::from_utf8(token.to_vec()).map_err(|_| "the IMDS token is not text".to_string())?,
    );
    let auth = || -> Result<Vec<(HeaderName, HeaderValue)>, String> {
        Ok(vec![(
            HeaderName::from_static("x-aws-ec2-metadata-token"),
            sensitive(&token)?,
        )])
    };
    let list_url = format!("{base}/latest/meta-data/iam/security-credentials/");
    let roles = fetch(transport, Method::GET, &list_url, &route, auth()?).await?;
    let role = std::str::from_utf8(&roles)
        .ok()
        .and_then(|r| r.lines().map(str::trim).find(|l| !l.is_empty()))
        .map(str::to_string)
        .ok_or_else(|| "the instance has no IAM role".to_string())?;
    if !role
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"+=,.@_-".contains(&b))
    {
        return Err("IMDS answered a role name that is not one".to_string());
    }
    let url = format!("{list_url}{role}");
    let body = fetch(transport, Method::GET, &url, &route, auth()?).await?;
    let (mut keys, expires) = creds_json(&body, &url)?;
    keys.provider = "imds";
    Ok((keys, expires))
}

impl AwsIdentity {
    /// An AWS JSON 1.1 call (`X-Amz-Target: TARGET`: Secrets Manager, SSM) to `service` in
    /// `region`, signed with the identity's keys and sent under `rule`.
    pub async fn call_json(
        &self,
        transport: &dyn TokenTransport,
        rule: String,
        service: &str,
        region: &str,
        target: &str,
        body: Vec<u8>,
    ) -> Result<Answer, String> {
        let keys = self.keys(transport).await?;
        let (url, route) = self.endpoint(service, Some(region));
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-amz-json-1.1"),
        );
        headers.insert(
            HeaderName::from_static("x-amz-target"),
            HeaderValue::from_str(target).map_err(|_| format!("bad target {target:?}"))?,
        );
        sigv4::sign_post(
            &keys.sigv4(),
            sigv4::Scope { region, service },
            &url,
            &mut headers,
            &body,
        )
        .map_err(|why| format!("cannot sign {target}: {why}"))?;
        let mut ex = Exchange::post(
            rule,
            url.clone(),
            headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            Bytes::from(body),
        );
        ex.route = route;
        transport
            .call(ex)
            .await
            .map_err(|why| format!("{url}: {why}"))
    }
}

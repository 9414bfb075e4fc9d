//! latchkey's own AWS identity: the keys latchkey signs its own AWS calls with (Secrets
//! Manager, SSM, STS) and a credential's requests when it names no static keys — found once
//! from latchkey's environment by the standard provider chain, in the standard order:
//!
//! 1. `env`: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (/ `AWS_SESSION_TOKEN`);
//! 2. `profile`: the shared files (`AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`,
//!    `~/.aws/...`), profile `AWS_PROFILE` or `default`: static keys, `role_arn` +
//!    `source_profile` (STS `AssumeRole`, chained), `role_arn` + `web_identity_token_file`;
//! 3. `web identity`: `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN` (EKS IRSA): STS
//!    `AssumeRoleWithWebIdentity`, the token file read afresh at every call;
//! 4. `container`: `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` (ECS) or `..._FULL_URI` (EKS Pod
//!    Identity), with `AWS_CONTAINER_AUTHORIZATION_TOKEN[_FILE]`;
//! 5. `imds`: EC2 instance metadata, IMDSv2 only, and only when the operator opted in
//!    (`--aws-imds`): a proxy host is often not the instance whose role should sign.
//!
//! A provider that is not configured passes to the next; one that is configured but fails
//! stops the chain (as the AWS SDKs do), its error listing what was tried before it. Keys are
//! cached and fetched again five minutes before they expire (single flight); static keys never
//! expire. Every call goes through the [`TokenTransport`] under the rule `latchkey:aws`;
//! only the metadata and container endpoints (and an endpoint the operator pointed at a
//! loopback address) may be plain `http://`, each reachable at exactly its own address.
//!
//! This is latchkey's environment, never a sandbox's: a sandbox's AWS variables reach the
//! tools inside it, not the latchkey process, and its requests never choose these keys.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::aws_profile::{self, Base, FileKind, Profiles, Resolved, StaticKeys, WebIdentity};
use super::exchange::{Route, TokenTransport};
use super::sigv4;
use super::sts::{self, StsCall};
use super::REFRESH_MARGIN;
use crate::secrets::SecretValue;

#[path = "aws_endpoints.rs"]
mod endpoints;

pub use endpoints::ImdsConfig;

/// The audit rule of every call latchkey makes for its own AWS identity.
pub const RULE: &str = "latchkey:aws";

/// AWS keys: the secret parts never show in `Debug`.
#[derive(Clone)]
pub struct AwsKeys {
    pub access_key_id: SecretValue,
    pub secret_access_key: SecretValue,
    pub session_token: Option<SecretValue>,
    /// The provider that gave them (`env`, `profile`, `web identity`, `container`, `imds`).
    pub provider: &'static str,
}

impl std::fmt::Debug for AwsKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsKeys")
            .field("provider", &self.provider)
            .field("session_token", &self.session_token.is_some())
            .finish_non_exhaustive()
    }
}

impl AwsKeys {
    /// The keys as the signer takes them.
    pub fn sigv4(&self) -> sigv4::Keys<'_> {
        sigv4::Keys {
            akid: &self.access_key_id,
            secret: &self.secret_access_key,
            token: self.session_token.as_ref(),
        }
    }
}

/// Keys found and when to fetch them again (`None`: never).
struct Cached {
    keys: AwsKeys,
    refresh_at: Option<Instant>,
    expires_at: Option<Instant>,
}

/// latchkey's own AWS identity, built once from the environment (see the module docs).
pub struct AwsIdentity {
    /// The `AWS_*` variables of latchkey's environment (a snapshot).
    env: BTreeMap<String, String>,
    home: Option<PathBuf>,
    imds: Option<ImdsConfig>,
    cached: tokio::sync::Mutex<Option<Cached>>,
}

impl std::fmt::Debug for AwsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.env.keys().map(String::as_str).collect();
        f.debug_struct("AwsIdentity")
            .field("env", &names)
            .field("imds", &self.imds)
            .finish_non_exhaustive()
    }
}

/// What one provider gave.
enum Outcome {
    /// Not configured: the chain goes on (why, for the final error).
    Skip(String),
    Found(AwsKeys, Option<SystemTime>),
    /// Configured but failed: the chain stops.
    Failed(String),
}

impl AwsIdentity {
    /// The identity `env` (the `AWS_*` variables) and `home` describe; the instance metadata
    /// service is used only when `imds` is given.
    pub fn new(
        env: impl IntoIterator<Item = (String, String)>,
        home: Option<PathBuf>,
        imds: Option<ImdsConfig>,
    ) -> Self {
        Self {
            env: env
                .into_iter()
                .filter(|(k, _)| k.starts_with("AWS_"))
                .collect(),
            home,
            imds,
            cached: tokio::sync::Mutex::new(None),
        }
    }

    /// The identity of latchkey's own process environment.
    pub fn from_process_env(imds: Option<ImdsConfig>) -> Self {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        Self::new(std::env::vars(), home, imds)
    }

    fn var(&self, name: &str) -> Option<&str> {
        self.env
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    /// The region of latchkey's AWS configuration: `AWS_REGION`, `AWS_DEFAULT_REGION`, the
    /// profile's `region`.
    pub fn region(&self) -> Option<String> {
        if let Some(r) = self.var("AWS_REGION").or(self.var("AWS_DEFAULT_REGION")) {
            return Some(r.to_string());
        }
        let profiles = self.profiles().ok()?;
        profiles
            .get(&self.profile_name().0, "region")
            .map(str::to_string)
    }

    /// The URL of `service` (`sts`, `secretsmanager`, `ssm`) in `region`, and the route a
    /// call to it takes: `AWS_ENDPOINT_URL_<SERVICE>` or `AWS_ENDPOINT_URL` when set (plain
    /// `http://` only to a loopback address), else `https://SERVICE.REGION.amazonaws.com`
    /// (`https://sts.amazonaws.com` without a region).
    pub fn endpoint(&self, service: &str, region: Option<&str>) -> (String, Route) {
        endpoints::endpoint(|k| self.var(k), service, region)
    }

    /// The current keys: cached, or found again by the provider chain. The error names every
    /// provider tried and why, never a key.
    pub async fn keys(&self, transport: &dyn TokenTransport) -> Result<AwsKeys, String> {
        let mut cached = self.cached.lock().await;
        let now = Instant::now();
        if let Some(c) = cached.as_ref() {
            if c.refresh_at.is_none_or(|at| now < at) {
                return Ok(c.keys.clone());
            }
        }
        match self.chain(transport).await {
            Ok((keys, expires)) => {
                let left = expires.map(|e| {
                    e.duration_since(SystemTime::now())
                        .unwrap_or(Duration::ZERO)
                });
                *cached = Some(Cached {
                    keys: keys.clone(),
                    refresh_at: left.map(|l| now + l.saturating_sub(REFRESH_MARGIN)),
                    expires_at: left.map(|l| now + l),
                });
                Ok(keys)
            }
            // Keys still valid outlive a failed early refresh.
            Err(why) => match cached.as_ref() {
                Some(c) if c.expires_at.is_some_and(|e| now < e) => Ok(c.keys.clone()),
                _ => Err(why),
            },
        }
    }

    /// Runs the providers in order.
    async fn chain(
        &self,
        transport: &dyn TokenTransport,
    ) -> Result<(AwsKeys, Option<SystemTime>), String> {
        let mut tried: Vec<String> = Vec::new();
        for provider in ["env", "profile", "web identity", "container", "imds"] {
            let outcome = match provider {
                "env" => self.env_provider(),
                "profile" => self.profile_provider(transport).await,
                "web identity" => self.web_identity_provider(transport).await,
                "container" => endpoints::container(|k| self.var(k), transport).await,
                _ => match &self.imds {
                    None => Outcome::Skip("off (enable with --aws-imds)".to_string()),
                    Some(cfg) => endpoints::imds(cfg, |k| self.var(k), transport).await,
                },
            };
            match outcome {
                Outcome::Found(mut keys, expires) => {
                    keys.provider = provider;
                    return Ok((keys, expires));
                }
                Outcome::Skip(why) => tried.push(format!("{provider}: {why}")),
                Outcome::Failed(why) => {
                    let before = if tried.is_empty() {
                        String::new()
                    } else {
                        format!(" (tried before: {})", tried.join("; "))
                    };
                    return Err(format!(
                        "latchkey's AWS identity: {provider}: {why}{before}"
                    ));
                }
            }
        }
        Err(format!(
            "latchkey has no AWS credentials (tried {})",
            tried.join("; ")
        ))
    }

    fn env_provider(&self) -> Outcome {
        let secret = |k: &str| self.var(k).map(|v| SecretValue::new(v.as_bytes().to_vec()));
        match (secret("AWS_ACCESS_KEY_ID"), secret("AWS_SECRET_ACCESS_KEY")) {
            (Some(akid), Some(secret_key)) => Outcome::Found(
                AwsKeys {
                    access_key_id: akid,
                    secret_access_key: secret_key,
                    session_token: secret("AWS_SESSION_TOKEN"),
                    provider: "env",
                },
                None,
            ),
            (None, None) => Outcome::Skip("AWS_ACCESS_KEY_ID is not set".to_string()),
            (Some(_), None) => {
                Outcome::Failed("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not".into())
            }
            (None, Some(_)) => {
                Outcome::Failed("AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not".into())
            }
        }
    }

    /// The profile to read and whether `AWS_PROFILE` named it.
    fn profile_name(&self) -> (String, bool) {
        match self.var("AWS_PROFILE") {
            Some(p) => (p.to_string(), true),
            None => ("default".to_string(), false),
        }
    }

    fn file_path(&self, var: &str, name: &str) -> Option<PathBuf> {
        match self.var(var) {
            Some(p) => Some(match p.strip_prefix("~/") {
                Some(rest) => self.home.as_ref()?.join(rest),
                None => PathBuf::from(p),
            }),
            None => Some(self.home.as_ref()?.join(".aws").join(name)),
        }
    }

    /// Both shared files, merged (a missing file is empty; an unreadable one an error).
    fn profiles(&self) -> Result<Profiles, String> {
        let mut profiles = Profiles::default();
        for (var, name, kind) in [
            ("AWS_CONFIG_FILE", "config", FileKind::Config),
            (
                "AWS_SHARED_CREDENTIALS_FILE",
                "credentials",
                FileKind::Credentials,
            ),
        ] {
            let Some(path) = self.file_path(var, name) else {
                continue;
            };
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => zeroize::Zeroizing::new(t),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
            };
            let sections = aws_profile::parse_ini(&text, &path.display().to_string())?;
            profiles.add(kind, sections);
        }
        Ok(profiles)
    }

    async fn profile_provider(&self, transport: &dyn TokenTransport) -> Outcome {
        let profiles = match self.profiles() {
            Ok(p) => p,
            Err(why) => return Outcome::Failed(why),
        };
        let (name, explicit) = self.profile_name();
        let plan = match aws_profile::resolve(&profiles, &name, explicit) {
            Resolved::Nothing(why) => return Outcome::Skip(why),
            Resolved::Broken(why) => return Outcome::Failed(why),
            Resolved::Plan(plan) => plan,
        };
        let (mut keys, mut expires) = match plan.base {
            Base::Static(StaticKeys {
                akid,
                secret,
                token,
            }) => (
                AwsKeys {
                    access_key_id: akid,
                    secret_access_key: secret,
                    session_token: token,
                    provider: "profile",
                },
                None,
            ),
            Base::WebIdentity(w) => match self.web_identity(&w, transport).await {
                Ok(found) => found,
                Err(why) => return Outcome::Failed(format!("profile {name:?}: {why}")),
            },
        };
        for step in &plan.roles {
            let role = crate::AssumeRole {
                role_arn: step.role_arn.clone(),
                session_name: step.session_name.clone(),
                duration: Duration::from_secs(step.duration_secs),
                external_id: step.external_id.clone(),
                sts_endpoint: String::new(),
                sts_region: String::new(),
            };
            match self
                .sts(
                    transport,
                    "AssumeRole",
                    super::aws::assume_form(&role),
                    Some(&keys),
                )
                .await
            {
                Ok(found) => (keys, expires) = found,
                Err(why) => {
                    return Outcome::Failed(format!(
                        "profile {:?}: role {}: {why}",
                        step.profile, step.role_arn
                    ))
                }
            }
        }
        Outcome::Found(keys, expires)
    }

    async fn web_identity_provider(&self, transport: &dyn TokenTransport) -> Outcome {
        let (file, role) = match (
            self.var("AWS_WEB_IDENTITY_TOKEN_FILE"),
            self.var("AWS_ROLE_ARN"),
        ) {
            (None, _) => {
                return Outcome::Skip("AWS_WEB_IDENTITY_TOKEN_FILE is not set".to_string())
            }
            (Some(_), None) => {
                return Outcome::Failed(
                    "AWS_WEB_IDENTITY_TOKEN_FILE is set but AWS_ROLE_ARN is not".to_string(),
                )
            }
            (Some(f), Some(r)) => (f, r),
        };
        let w = WebIdentity {
            role_arn: role.to_string(),
            token_file: file.to_string(),
            session_name: self
                .var("AWS_ROLE_SESSION_NAME")
                .unwrap_or("latchkey")
                .to_string(),
        };
        match self.web_identity(&w, transport).await {
            Ok((keys, expires)) => Outcome::Found(keys, expires),
            Err(why) => Outcome::Failed(why),
        }
    }

    /// `AssumeRoleWithWebIdentity` with the token in `w.token_file`, read now.
    async fn web_identity(
        &self,
        w: &WebIdentity,
        transport: &dyn TokenTransport,
    ) -> Result<(AwsKeys, Option<SystemTime>), String> {
        let token = std::fs::read_to_string(&w.token_file)
            .map(zeroize::Zeroizing::new)
            .map_err(|e| {
                format!(
                    "cannot read the web identity token file {}: {e}",
                    w.token_file
                )
            })?;
        let token = token.trim();
        if token.is_empty() {
            return Err(format!(
                "the web identity token file {} is empty",
                w.token_file
            ));
        }
        let form = zeroize::Zeroizing::new(
            form_urlencoded::Serializer::new(String::new())
                .append_pair("Action", "AssumeRoleWithWebIdentity")
                .append_pair("Version", "2011-06-15")
                .append_pair("RoleArn", &w.role_arn)
                .append_pair("RoleSessionName", &w.session_name)
                .append_pair("WebIdentityToken", token)
                .finish(),
        );
        self.sts(
            transport,
            "AssumeRoleWithWebIdentity",
            form.to_string(),
            None,
        )
        .await
        .map_err(|why| format!("role {}: {why}", w.role_arn))
    }

    /// One STS call at the configured STS endpoint, signed with `keys` when given.
    async fn sts(
        &self,
        transport: &dyn TokenTransport,
        action: &str,
        form: String,
        keys: Option<&AwsKeys>,
    ) -> Result<(AwsKeys, Option<SystemTime>), String> {
        let region = self.region();
        let (endpoint, route) = self.endpoint("sts", region.as_deref());
        let call = StsCall {
            rule: RULE.to_string(),
            endpoint: &endpoint,
            route,
            region: region.as_deref().unwrap_or("us-east-1"),
        };
        let signing = keys.map(AwsKeys::sigv4);
        let got = sts::call(call, action, form, signing.as_ref(), transport).await?;
        let expires = got
            .expiration
            .as_deref()
            .and_then(|e| humantime::parse_rfc3339_weak(e).ok());
        Ok((
            AwsKeys {
                access_key_id: SecretValue::new(got.access_key_id.as_bytes().to_vec()),
                secret_access_key: SecretValue::new(got.secret_access_key.as_bytes().to_vec()),
                session_token: Some(SecretValue::new(got.session_token.as_bytes().to_vec())),
                provider: "sts",
            },
            expires,
        ))
    }
}

/// The single-address range of `ip`, as a route allows it.
fn only(ip: IpAddr) -> Vec<crate::wire::cidr::Cidr> {
    vec![crate::wire::cidr::Cidr::from(ip)]
}

#[cfg(test)]
#[path = "aws_identity_tests.rs"]
mod tests;

//! Where segments go: `--audit-ship s3://BUCKET/PREFIX`, the store's endpoint and region, and
//! the keys read once from the environment, each checked at startup with an error that names
//! the flag or variable at fault (never a key's value).

use std::path::{Path, PathBuf};

use crate::wire::host::Authority;

/// Why shipping cannot start. Messages name the flag or variable, never a credential's value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--audit-ship {url:?}: {why}")]
    Url { url: String, why: String },
    #[error("--audit-ship-endpoint {url:?}: {why}")]
    Endpoint { url: String, why: String },
    #[error("--audit-ship-region {region:?}: {why}")]
    Region { region: String, why: String },
    #[error(
        "--audit-ship: half a key pair in latchkey's environment: {missing} not set \
         (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and AWS_SESSION_TOKEN for temporary \
         keys, or neither: latchkey's AWS identity then comes from its shared files, web \
         identity, container credentials or, with --aws-imds, instance metadata)"
    )]
    Credentials { missing: String },
    #[error(
        "--audit-ship needs --audit to be a file: closed segments of a file are what is shipped, \
         and `-` (stdout) has none"
    )]
    NotAFile,
    #[error(
        "--audit-ship needs --audit-rotate (e.g. 100MiB or 1h): without rotation no segment ever \
         closes, so nothing would ever be shipped"
    )]
    NoRotation,
}

/// `s3://BUCKET/PREFIX`, checked: a bucket name S3 accepts and a prefix of safe key characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub bucket: String,
    /// Without leading or trailing `/`; empty for the bucket's root.
    pub prefix: String,
}

impl Target {
    pub fn parse(url: &str) -> Result<Target, ConfigError> {
        let bad = |why: String| ConfigError::Url {
            url: url.to_string(),
            why,
        };
        let rest = match url.split_once("://") {
            Some(("s3", rest)) => rest,
            Some((scheme, _)) => {
                return Err(bad(format!(
                    "the scheme must be s3:// (s3://BUCKET/PREFIX), not {scheme}://; give the \
                     store's own address with --audit-ship-endpoint"
                )))
            }
            None => return Err(bad("expected s3://BUCKET/PREFIX".to_string())),
        };
        if rest.contains(['?', '#']) {
            return Err(bad(
                "a query or fragment has no meaning here: s3://BUCKET/PREFIX".to_string(),
            ));
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        check_bucket(bucket).map_err(|why| bad(format!("bucket {bucket:?}: {why}")))?;
        let prefix = prefix.trim_matches('/');
        check_prefix(prefix).map_err(|why| bad(format!("prefix {prefix:?}: {why}")))?;
        Ok(Target {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// The object key of a segment file named `name`.
    pub fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    /// `s3://BUCKET/KEY` of a segment file named `name`.
    pub fn object_url(&self, name: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.key(name))
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// S3's bucket naming rules (general purpose buckets), which S3-compatible stores share.
fn check_bucket(b: &str) -> Result<(), String> {
    if b.is_empty() {
        return Err("no bucket name: s3://BUCKET/PREFIX".to_string());
    }
    if !(3..=63).contains(&b.len()) {
        return Err(format!("must be 3 to 63 characters long, not {}", b.len()));
    }
    if let Some(c) = b
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '.' || *c == '-'))
    {
        return Err(format!(
            "{c:?} is not allowed: only lower-case letters, digits, `.` and `-`"
        ));
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !alnum(b.chars().next()) || !alnum(b.chars().last()) {
        return Err("must begin and end with a letter or a digit".to_string());
    }
    if b.contains("..") {
        return Err("must not hold two adjacent dots".to_string());
    }
    if b.parse::<std::net::Ipv4Addr>().is_ok() {
        return Err("must not be formatted as an IP address".to_string());
    }
    for p in ["xn--", "sthree-", "amzn-s3-demo-"] {
        if b.starts_with(p) {
            return Err(format!("must not start with {p:?} (reserved)"));
        }
    }
    for s in ["-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"] {
        if b.ends_with(s) {
            return Err(format!("must not end with {s:?} (reserved)"));
        }
    }
    Ok(())
}

/// A prefix of S3's safe key characters (letters, digits, `!-_.*'()`), in `/`-separated parts
/// that are neither empty nor `.`/`..`: keys need no escaping and mean the same to every tool.
fn check_prefix(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Ok(());
    }
    if p.len() > 512 {
        return Err(format!("{} bytes is too long (at most 512)", p.len()));
    }
    for part in p.split('/') {
        if part.is_empty() {
            return Err("an empty part (`//`)".to_string());
        }
        if part == "." || part == ".." {
            return Err(format!("a {part:?} part"));
        }
        if let Some(c) = part
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "!-_.*'()".contains(*c)))
        {
            return Err(format!(
                "{c:?} is not allowed: only letters, digits, `/` and `!-_.*'()`"
            ));
        }
    }
    Ok(())
}

/// The store's address: `https://s3.REGION.amazonaws.com` unless `--audit-ship-endpoint` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub scheme: String,
    /// Lower-case; an IPv6 address without brackets.
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    pub fn parse(url: &str) -> Result<Endpoint, ConfigError> {
        let bad = |why: &str| ConfigError::Endpoint {
            url: url.to_string(),
            why: why.to_string(),
        };
        let u = url::Url::parse(url).map_err(|e| bad(&format!("not a URL: {e}")))?;
        let scheme = u.scheme();
        if scheme != "https" && scheme != "http" {
            return Err(bad("the scheme must be https:// (or http://)"));
        }
        if !u.username().is_empty() || u.password().is_some() {
            // Quoted without what it carries.
            let mut shown = u.clone();
            let _ = shown.set_username("");
            let _ = shown.set_password(None);
            return Err(ConfigError::Endpoint {
                url: format!("{}://…@{}", scheme, &shown[url::Position::BeforeHost..]),
                why: "must not carry credentials: keys come from AWS_ACCESS_KEY_ID / \
                      AWS_SECRET_ACCESS_KEY"
                    .to_string(),
            });
        }
        if !(u.path().is_empty() || u.path() == "/")
            || u.query().is_some()
            || u.fragment().is_some()
        {
            return Err(bad(
                "give the store's origin only (https://HOST[:PORT]); the bucket and prefix go in --audit-ship",
            ));
        }
        let host = match u.host() {
            Some(url::Host::Domain(d)) => d.to_ascii_lowercase(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(bad("no host")),
        };
        let port = u
            .port_or_known_default()
            .ok_or_else(|| bad("no port for this scheme"))?;
        Ok(Endpoint {
            scheme: scheme.to_string(),
            host,
            port,
        })
    }

    /// AWS's own S3 endpoint for `region`.
    pub fn aws(region: &str) -> Endpoint {
        Endpoint {
            scheme: "https".to_string(),
            host: format!("s3.{region}.amazonaws.com"),
            port: 443,
        }
    }

    fn default_port(&self) -> u16 {
        if self.scheme == "https" {
            443
        } else {
            80
        }
    }

    /// `host[:port]` as the `Host` header carries it (the port only when not the default).
    pub fn authority(&self) -> String {
        Authority {
            host: &self.host,
            port: self.port,
            default_port: Some(self.default_port()),
        }
        .to_string()
    }

    /// `scheme://authority`
    pub fn origin(&self) -> String {
        format!("{}://{}", self.scheme, self.authority())
    }
}

/// Checks latchkey's environment for a half-set static key pair (the other half is an
/// operator's mistake, said at start). The keys themselves come from latchkey's own AWS
/// identity when each upload is signed (`signing::AwsIdentity`: these variables first, then
/// the shared files, web identity, container credentials, and IMDSv2 with `--aws-imds`).
fn check_key_pair(env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
    let set = |name: &str| env(name).is_some_and(|v| !v.is_empty());
    match (set("AWS_ACCESS_KEY_ID"), set("AWS_SECRET_ACCESS_KEY")) {
        (true, false) => Err(ConfigError::Credentials {
            missing: "AWS_SECRET_ACCESS_KEY".into(),
        }),
        (false, true) => Err(ConfigError::Credentials {
            missing: "AWS_ACCESS_KEY_ID".into(),
        }),
        _ => Ok(()),
    }
}

/// The `serve` flags shipping reads, and the environment lookup for its keys.
pub struct Flags<'a> {
    /// `--audit-ship`
    pub url: &'a str,
    /// `--audit-ship-endpoint`
    pub endpoint: Option<&'a str>,
    /// `--audit-ship-region`
    pub region: &'a str,
    /// `--audit`
    pub audit: &'a Path,
    /// Whether `--audit-rotate` is set.
    pub rotates: bool,
    pub env: &'a dyn Fn(&str) -> Option<String>,
}

/// Everything the shipper needs, checked.
pub struct Config {
    pub target: Target,
    pub endpoint: Endpoint,
    pub region: String,
    /// The active audit file; closed segments are listed beside it.
    pub active: PathBuf,
}

impl Config {
    /// Checks the flags in the order an operator fixes them: the log, the URL, the store, the
    /// keys.
    pub fn from_flags(f: &Flags<'_>) -> Result<Config, ConfigError> {
        if f.audit == Path::new("-") {
            return Err(ConfigError::NotAFile);
        }
        if !f.rotates {
            return Err(ConfigError::NoRotation);
        }
        let target = Target::parse(f.url)?;
        let region = f.region.trim();
        if region.is_empty()
            || !region
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(ConfigError::Region {
                region: f.region.to_string(),
                why: "expected a region name such as us-east-1 (lower-case letters, digits, `-`)"
                    .to_string(),
            });
        }
        let endpoint = match f.endpoint {
            Some(url) => Endpoint::parse(url)?,
            None => Endpoint::aws(region),
        };
        check_key_pair(f.env)?;
        Ok(Config {
            target,
            endpoint,
            region: region.to_string(),
            active: f.audit.to_path_buf(),
        })
    }
}

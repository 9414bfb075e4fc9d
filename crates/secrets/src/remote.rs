//! Secrets held in an external store — Vault/OpenBao, AWS Secrets Manager, AWS SSM Parameter
//! Store — named by a source spec (`vault:MOUNT/PATH#FIELD`, `aws-sm:NAME#KEY`,
//! `aws-ssm:/NAME`) and fetched over the network by a [`Fetch`] the store is given
//! ([`super::SecretStore::set_fetcher`]). This module parses the specs and describes the
//! connections; it knows no sockets. How a fetched value is cached, refreshed, served stale
//! and retired is in `store_remote`.
//!
//! Errors name the part of a spec that is wrong, never the spec itself (an operator may have
//! written a value where a source belongs).

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::{SecretValue, Source};
use crate::wire::cidr::Cidr;

/// How long a fetched value is used when the policy says nothing (a lease or TTL the store
/// gives shortens it).
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(300);

/// The shortest accepted `refresh`: a store is not polled more often than this.
pub const MIN_REFRESH: Duration = Duration::from_secs(1);

/// A secret held in an external store.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Remote {
    pub at: Location,
    /// How long a fetched value is used before it is fetched again; a lease or TTL the store
    /// gives shortens it (to two thirds of the lease).
    pub refresh: Duration,
    /// How long past its refresh time the last value may still be served while the store
    /// cannot be reached (0: never). Never past a lease's end.
    pub stale_for: Duration,
}

/// Where in which store.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Location {
    /// `vault:PATH#FIELD` or `vault.NAME:PATH#FIELD`: KV v2 (version pinning optional), KV v1,
    /// or a dynamic secret (`database/creds/ROLE`) whose lease is honoured.
    Vault {
        /// The `[vault.NAME]` connection; `""` is `[vault]`, the default.
        connection: String,
        /// The connection's settings, filled in when the policy is compiled.
        settings: Option<Arc<VaultConnection>>,
        /// `MOUNT/PATH`, as written (no leading `/`).
        path: String,
        /// The field of the secret's data; `None` when the data has exactly one field.
        field: Option<String>,
        /// A KV v2 version (`?version=N`).
        version: Option<u64>,
    },
    /// `aws-sm:NAME_OR_ARN[?stage=S|?version_id=V][?region=R][#json_key]`.
    AwsSm {
        id: String,
        json_key: Option<String>,
        stage: Option<String>,
        version_id: Option<String>,
        /// From `?region=`, else the ARN's, else latchkey's AWS configuration.
        region: Option<String>,
    },
    /// `aws-ssm:/PARAM/NAME[?version=N][?region=R]` (a SecureString is decrypted).
    AwsSsm {
        name: String,
        version: Option<u64>,
        region: Option<String>,
    },
}

impl Location {
    /// The source kind, as `explain` and the audit record name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Location::Vault { .. } => "vault",
            Location::AwsSm { .. } => "aws-sm",
            Location::AwsSsm { .. } => "aws-ssm",
        }
    }

    /// Where, for messages: the store and path, never a value.
    pub fn describe(&self) -> String {
        match self {
            Location::Vault {
                connection, path, ..
            } if connection.is_empty() => format!("vault:{path}"),
            Location::Vault {
                connection, path, ..
            } => format!("vault.{connection}:{path}"),
            Location::AwsSm { id, .. } => format!("aws-sm:{id}"),
            Location::AwsSsm { name, .. } => format!("aws-ssm:{name}"),
        }
    }
}

/// A `[vault]` / `[vault.NAME]` connection.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct VaultConnection {
    /// `""` for `[vault]`.
    pub name: String,
    /// `https://HOST[:PORT]`, no path (plain `http://` only to a loopback address).
    pub address: String,
    /// A PEM bundle trusted for the server's certificate, on top of the usual roots.
    pub ca: Option<PathBuf>,
    /// The Vault Enterprise / OpenBao namespace (`X-Vault-Namespace`).
    pub namespace: Option<String>,
    pub auth: VaultAuth,
    /// Non-public ranges the server may be at, on top of `--allow-private`.
    pub allow_private: Vec<Cidr>,
}

/// How latchkey logs in to Vault.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum VaultAuth {
    /// A token from a secret source (`env:`, `file:`, `exec:`), renewed while renewable.
    Token { token: Box<Source> },
    /// AppRole: `auth/MOUNT/login` with a role id and secret id from secret sources.
    AppRole {
        mount: String,
        role_id: Box<Source>,
        secret_id: Box<Source>,
    },
    /// Kubernetes or JWT login: `auth/MOUNT/login` with `role` and the token in `token_file`
    /// (a projected service-account token, read afresh at every login).
    Jwt {
        mount: String,
        role: String,
        token_file: PathBuf,
    },
}

/// What a store answered for one secret.
pub struct Fetched {
    pub value: SecretValue,
    /// How long the value is good for at most (a lease, a TTL): it is fetched again before
    /// then, and served no later even when stale.
    pub valid_for: Option<Duration>,
}

/// A boxed future, as a dyn-compatible trait method returns it.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Fetches secrets from their stores. Implemented outside this crate (over latchkey's guarded,
/// audited client); `name` is the secret's name, for the audit record and messages. The error
/// says why, naming the store and path, never a value.
pub trait Fetch: Send + Sync {
    fn fetch<'a>(
        &'a self,
        name: &'a str,
        at: &'a Location,
    ) -> BoxFuture<'a, Result<Fetched, String>>;
}

/// Parses the part after `vault:` / `vault.NAME:`, `aws-sm:` or `aws-ssm:`; `kind` is the part
/// before the colon. `None` when `kind` is not a remote kind.
pub(super) fn parse(kind: &str, rest: &str) -> Option<Result<Remote, String>> {
    let at = if kind == "vault" {
        vault(String::new(), rest)
    } else if let Some(name) = kind.strip_prefix("vault.") {
        if !valid_connection_name(name) {
            return Some(Err(
                "vault.NAME: the connection name must be letters, digits, '-' and '_'".into(),
            ));
        }
        vault(name.to_string(), rest)
    } else if kind == "aws-sm" {
        aws_sm(rest)
    } else if kind == "aws-ssm" {
        aws_ssm(rest)
    } else {
        return None;
    };
    Some(at.map(|at| Remote {
        at,
        refresh: DEFAULT_REFRESH,
        stale_for: Duration::ZERO,
    }))
}

/// Whether `name` may name a `[vault.NAME]` connection.
pub fn valid_connection_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `BODY[?k=v&…][#FRAGMENT]`: the body, the query pairs and the fragment.
type Split<'s> = (&'s str, Vec<(&'s str, &'s str)>, Option<&'s str>);

fn split<'s>(kind: &str, rest: &'s str) -> Result<Split<'s>, String> {
    let (rest, fragment) = match rest.split_once('#') {
        Some((_, "")) => {
            return Err(format!(
                "{kind}: nothing after '#' (name a field or remove the '#')"
            ))
        }
        Some((r, f)) => (r, Some(f)),
        None => (rest, None),
    };
    let (body, query) = match rest.split_once('?') {
        Some((b, q)) => (b, q),
        None => (rest, ""),
    };
    let mut pairs = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .filter(|(_, v)| !v.is_empty())
            .ok_or_else(|| format!("{kind}: every option after '?' is KEY=VALUE"))?;
        if pairs.iter().any(|(seen, _)| *seen == k) {
            return Err(format!("{kind}: option {k:?} given twice"));
        }
        pairs.push((k, v));
    }
    if body.is_empty() {
        return Err(format!("{kind}: needs a name after the colon"));
    }
    if body.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{kind}: the name has whitespace or control characters"
        ));
    }
    Ok((body, pairs, fragment))
}

fn take<'s>(pairs: &mut Vec<(&'s str, &'s str)>, key: &str) -> Option<&'s str> {
    let i = pairs.iter().position(|(k, _)| *k == key)?;
    Some(pairs.remove(i).1)
}

fn no_more(kind: &str, pairs: &[(&str, &str)], known: &str) -> Result<(), String> {
    match pairs.first() {
        None => Ok(()),
        Some((k, _))
            if k.len() <= 20 && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
        {
            Err(format!("{kind}: unknown option {k:?} (known: {known})"))
        }
        Some(_) => Err(format!("{kind}: unknown option (known: {known})")),
    }
}

fn number(kind: &str, key: &str, v: &str) -> Result<u64, String> {
    v.parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{kind}: {key} must be a positive whole number"))
}

fn vault(connection: String, rest: &str) -> Result<Location, String> {
    let (path, mut pairs, field) = split("vault", rest)?;
    let version = take(&mut pairs, "version")
        .map(|v| number("vault", "version", v))
        .transpose()?;
    no_more("vault", &pairs, "version")?;
    if path.starts_with('/')
        || path.ends_with('/')
        || path
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err("vault: the path is MOUNT/PATH, with no leading or trailing '/', no empty, '.' or '..' segment".into());
    }
    if !path.contains('/') {
        return Err("vault: the path is MOUNT/PATH (a mount alone names no secret)".into());
    }
    Ok(Location::Vault {
        connection,
        settings: None,
        path: path.to_string(),
        field: field.map(str::to_string),
        version,
    })
}

/// The region of a Secrets Manager ARN (`arn:PARTITION:secretsmanager:REGION:…`).
fn arn_region(id: &str) -> Option<String> {
    let mut parts = id.split(':');
    (parts.next()? == "arn").then_some(())?;
    parts.next()?;
    (parts.next()? == "secretsmanager").then_some(())?;
    Some(parts.next()?.to_string()).filter(|r| is_region(r))
}

/// Whether `v` looks like an AWS region: lowercase words and a number, dash-separated
/// (`us-east-1`, `us-gov-west-1`, `ap-southeast-4`).
fn is_region(v: &str) -> bool {
    let parts: Vec<&str> = v.split('-').collect();
    v.len() <= 32
        && parts.len() >= 3
        && parts[..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && parts
            .last()
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn region(kind: &str, v: &str) -> Result<String, String> {
    if is_region(v) {
        Ok(v.to_string())
    } else {
        Err(format!("{kind}: region must look like us-east-1"))
    }
}

fn aws_sm(rest: &str) -> Result<Location, String> {
    let (id, mut pairs, json_key) = split("aws-sm", rest)?;
    let stage = take(&mut pairs, "stage").map(str::to_string);
    let version_id = take(&mut pairs, "version_id").map(str::to_string);
    let region = take(&mut pairs, "region")
        .map(|r| region("aws-sm", r))
        .transpose()?
        .or_else(|| arn_region(id));
    no_more("aws-sm", &pairs, "stage, version_id, region")?;
    if stage.is_some() && version_id.is_some() {
        return Err("aws-sm: give stage or version_id, not both".into());
    }
    Ok(Location::AwsSm {
        id: id.to_string(),
        json_key: json_key.map(str::to_string),
        stage,
        version_id,
        region,
    })
}

fn aws_ssm(rest: &str) -> Result<Location, String> {
    let (name, mut pairs, fragment) = split("aws-ssm", rest)?;
    if fragment.is_some() {
        return Err("aws-ssm: a parameter has no fields ('#' is not allowed)".into());
    }
    let version = take(&mut pairs, "version")
        .map(|v| number("aws-ssm", "version", v))
        .transpose()?;
    let region = take(&mut pairs, "region")
        .map(|r| region("aws-ssm", r))
        .transpose()?;
    no_more("aws-ssm", &pairs, "version, region")?;
    Ok(Location::AwsSsm {
        name: name.to_string(),
        version,
        region,
    })
}

#[cfg(test)]
#[path = "remote_tests.rs"]
mod tests;

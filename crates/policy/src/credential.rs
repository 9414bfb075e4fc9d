//! Validation of one `[credentials.NAME]` entry: which keys its kind takes, and its key material
//! (always a secret source, never a value).

use std::collections::HashSet;
use std::ops::Range;

use http::HeaderName;

use super::compile::FileCx;
use super::schema::{RawAssumeRole, RawCredential};
use crate::secrets::Source;
use crate::signing::{Credential, JwtAlg, JwtClaim, Kind as CredentialKind};

/// Receives each key-material source a credential names: its internal key, span and source.
pub(super) type Register<'r> = &'r mut dyn FnMut(String, Range<usize>, Source);

/// `credentials.NAME.FIELD`, as errors name a credential's key.
pub(super) fn field(name: &str, f: &str) -> String {
    format!("credentials.{name}.{f}")
}

/// The kinds, as the unknown-kind error lists them.
const KINDS: &str = "aws_sigv4, github_app, google_service_account, google_id_token, oauth2, oauth2_client_credentials, jwt, hmac or client_cert";

/// Which keys each kind takes: (required, optional); key-material keys are sources. `None`
/// for an unknown kind.
fn keys_of(kind: &str) -> Option<(&'static [&'static str], &'static [&'static str])> {
    Some(match kind {
        // Both keys or neither (then latchkey's own AWS identity signs): checked in `aws_sigv4`.
        "aws_sigv4" => (
            &[],
            &[
                "access_key_id",
                "secret_access_key",
                "session_token",
                "region",
                "service",
                "max_signed_body",
                "assume_role",
            ],
        ),
        "github_app" => (
            &["app_id", "installation_id", "private_key"],
            &["api", "permissions", "repositories"],
        ),
        "google_service_account" => (&["key", "scopes"], &["token_uri"]),
        "oauth2_client_credentials" => (
            &["token_url", "client_id", "client_secret"],
            &["scope", "audience", "client_auth", "token_endpoint_headers"],
        ),
        // Which of the optional keys each grant needs or takes: checked in `oauth2`.
        "oauth2" => (
            &["token_url", "grant"],
            &[
                "client_id",
                "client_secret",
                "client_auth",
                "scope",
                "audience",
                "token_endpoint_headers",
                "refresh_token",
                "username",
                "password",
                "alg",
                "key",
                "ttl",
                "claims",
            ],
        ),
        "google_id_token" => (&["key", "audience"], &["token_uri"]),
        "hmac" => (
            &["key", "message", "headers"],
            &["algorithm", "encoding", "timestamp", "max_signed_body"],
        ),
        "jwt" => (&["alg", "key"], &["ttl", "header", "claims"]),
        "client_cert" => (&["cert", "key"], &[]),
        _ => return None,
    })
}

impl FileCx<'_> {
    /// Validates one `[credentials.NAME]`; `register` receives each key-material source.
    pub(super) fn credential(
        &mut self,
        name: &str,
        raw: RawCredential,
        secrets: &HashSet<String>,
        mut register: impl FnMut(String, Range<usize>, Source),
    ) -> Option<Credential> {
        let before = self.errors.len();
        // A missing kind was reported while reading; without it no other key can be judged.
        let raw_kind = raw.kind.as_ref()?;
        let kind = raw_kind.get_ref().clone();
        let Some((required, optional)) = keys_of(&kind) else {
            self.error(
                raw_kind.span(),
                format!(
                    "{}: unknown kind {kind:?}: use {KINDS}",
                    field(name, "kind")
                ),
            );
            return None;
        };
        for (k, span) in &raw.keys {
            if !required.contains(k) && !optional.contains(k) {
                self.error(
                    span.clone(),
                    format!("{}: does not apply to kind {kind:?}", field(name, k)),
                );
            }
        }
        for r in required {
            if !raw.keys.iter().any(|(k, _)| k == r) {
                self.error(
                    raw_kind.span(),
                    format!("{}: kind {kind:?} needs {r}", field(name, r)),
                );
            }
        }
        let register: Register<'_> = &mut register;
        let compiled = match kind.as_str() {
            "aws_sigv4" => self.aws_sigv4(name, raw, register),
            "github_app" => self.github_app(name, raw, register),
            "google_service_account" => {
                self.key_source(name, "key", &raw.key, register);
                let token_uri = self.https_url(name, "token_uri", &raw.token_uri);
                CredentialKind::GoogleServiceAccount {
                    scopes: raw.scopes.map(|v| v.into_inner()).unwrap_or_default(),
                    token_uri,
                }
            }
            "oauth2" | "oauth2_client_credentials" => self.oauth2(name, raw, secrets, register),
            "google_id_token" => self.google_id_token(name, raw, register),
            "hmac" => self.hmac(name, raw, register),
            "client_cert" => {
                // Both PEM, read through the secret store: the key is key material, and the
                // certificate rotates with it.
                self.key_source(name, "cert", &raw.cert, register);
                self.key_source(name, "key", &raw.key, register);
                CredentialKind::ClientCert
            }
            _ => self.jwt(name, raw, register),
        };
        if self.errors.len() > before {
            return None;
        }
        Some(Credential {
            name: name.to_string(),
            kind: compiled,
        })
    }

    /// Key material: a secret source, never the value itself.
    pub(super) fn key_source(
        &mut self,
        name: &str,
        f: &str,
        v: &Option<toml::Spanned<String>>,
        register: Register<'_>,
    ) {
        let Some(v) = v else {
            return;
        };
        match Source::parse(
            v.get_ref(),
            std::time::Duration::from_secs(300),
            std::time::Duration::from_secs(10),
        ) {
            Ok(src) => register(crate::signing::field_key(name, f), v.span(), src),
            Err(e) => self.error(
                v.span(),
                format!(
                    "{}: {e} (key material is never written inline)",
                    field(name, f)
                ),
            ),
        }
    }

    /// An `https://` URL with a host, or an error.
    pub(super) fn https_url(
        &mut self,
        name: &str,
        f: &str,
        v: &Option<toml::Spanned<String>>,
    ) -> Option<String> {
        let v = v.as_ref()?;
        match http::Uri::try_from(v.get_ref().as_str()) {
            Ok(u) if u.scheme_str() == Some("https") && u.host().is_some() => {
                Some(v.get_ref().clone())
            }
            _ => {
                self.error(
                    v.span(),
                    format!(
                        "{}: {:?} is not an https:// URL",
                        field(name, f),
                        v.get_ref()
                    ),
                );
                None
            }
        }
    }

    fn aws_sigv4(
        &mut self,
        name: &str,
        raw: RawCredential,
        register: Register<'_>,
    ) -> CredentialKind {
        let static_keys = raw.access_key_id.is_some() || raw.secret_access_key.is_some();
        for (have, missing, other) in [
            (
                &raw.access_key_id,
                "secret_access_key",
                &raw.secret_access_key,
            ),
            (&raw.secret_access_key, "access_key_id", &raw.access_key_id),
            (&raw.session_token, "access_key_id", &raw.access_key_id),
        ] {
            if let (Some(have), None) = (have, other) {
                self.error(
                    have.span(),
                    format!(
                        "{}: needs {missing} too (name both keys, or neither to sign with latchkey's own AWS identity)",
                        field(name, missing)
                    ),
                );
            }
        }
        self.key_source(name, "access_key_id", &raw.access_key_id, register);
        self.key_source(name, "secret_access_key", &raw.secret_access_key, register);
        self.key_source(name, "session_token", &raw.session_token, register);
        let max = self.max_signed_body(name, &raw.max_signed_body);
        let assume_role = raw.assume_role.map(|a| self.assume_role(name, a));
        CredentialKind::AwsSigV4 {
            assume_role,
            region: raw.region.map(|r| r.into_inner()),
            service: raw.service.map(|r| r.into_inner()),
            static_keys,
            has_session_token: raw.session_token.is_some(),
            max_signed_body: max,
        }
    }

    /// `max_signed_body`: bytes held to sign a body (default and at most the scan limit).
    pub(super) fn max_signed_body(&mut self, name: &str, v: &Option<toml::Spanned<i64>>) -> usize {
        match v {
            None => crate::wire::limits::SCAN_LIMIT,
            Some(m) => match usize::try_from(*m.get_ref()) {
                Ok(v) if v <= crate::wire::limits::SCAN_LIMIT => v,
                _ => {
                    self.error(
                        m.span(),
                        format!(
                            "{}: must be 0 to {} bytes (latchkey buffers at most that much)",
                            field(name, "max_signed_body"),
                            crate::wire::limits::SCAN_LIMIT
                        ),
                    );
                    0
                }
            },
        }
    }

    fn assume_role(
        &mut self,
        name: &str,
        a: toml::Spanned<RawAssumeRole>,
    ) -> crate::signing::AssumeRole {
        let span = a.span();
        let a = a.into_inner();
        // A missing role_arn was reported while reading.
        let role_arn = a.role_arn.unwrap_or_default();
        if !role_arn.is_empty() && !role_arn.starts_with("arn:") {
            self.error(
                span.clone(),
                format!(
                    "{}: role_arn {:?} is not an ARN",
                    field(name, "assume_role"),
                    role_arn
                ),
            );
        }
        let duration = match a.duration.as_deref().map(humantime::parse_duration) {
            None => std::time::Duration::from_secs(3600),
            Some(Ok(d)) if (900..=43200).contains(&d.as_secs()) => d,
            Some(_) => {
                self.error(
                    span.clone(),
                    format!(
                        "{}: duration must be 15m to 12h",
                        field(name, "assume_role")
                    ),
                );
                std::time::Duration::from_secs(3600)
            }
        };
        let endpoint = a
            .sts_endpoint
            .unwrap_or_else(|| "https://sts.amazonaws.com".to_string());
        if http::Uri::try_from(endpoint.as_str()).map_or(true, |u| {
            u.scheme_str() != Some("https") || u.host().is_none()
        }) {
            self.error(
                span.clone(),
                format!(
                    "{}: sts_endpoint {endpoint:?} is not an https:// URL",
                    field(name, "assume_role")
                ),
            );
        }
        crate::signing::AssumeRole {
            role_arn,
            session_name: a.session_name.unwrap_or_else(|| "latchkey".to_string()),
            duration,
            external_id: a.external_id,
            sts_endpoint: endpoint,
            sts_region: a.sts_region.unwrap_or_else(|| "us-east-1".to_string()),
        }
    }

    fn github_app(
        &mut self,
        name: &str,
        raw: RawCredential,
        register: Register<'_>,
    ) -> CredentialKind {
        self.key_source(name, "private_key", &raw.private_key, register);
        let api = match &raw.api {
            None => Some("https://api.github.com".to_string()),
            Some(_) => self.https_url(name, "api", &raw.api),
        };
        CredentialKind::GithubApp {
            app_id: raw.app_id.map(|v| v.into_inner()).unwrap_or_default(),
            installation_id: raw
                .installation_id
                .map(|v| v.into_inner())
                .unwrap_or_default(),
            api: api.unwrap_or_default(),
            permissions: raw.permissions.map(|v| v.into_inner()),
            repositories: raw.repositories.map(|v| v.into_inner()),
        }
    }

    pub(super) fn jwt(
        &mut self,
        name: &str,
        raw: RawCredential,
        register: Register<'_>,
    ) -> CredentialKind {
        self.key_source(name, "key", &raw.key, register);
        let alg = raw.alg.as_ref().and_then(|a| {
            let parsed = JwtAlg::parse(a.get_ref());
            if parsed.is_none() {
                self.error(
                    a.span(),
                    format!(
                        "{}: {:?} is not RS256, ES256, HS256 or EdDSA",
                        field(name, "alg"),
                        a.get_ref()
                    ),
                );
            }
            parsed
        });
        let ttl = raw
            .ttl
            .as_ref()
            .and_then(|t| match humantime::parse_duration(t.get_ref()) {
                Ok(d) if !d.is_zero() => Some(d),
                _ => {
                    self.error(
                        t.span(),
                        format!(
                            "{}: {:?} is not a duration like \"5m\"",
                            field(name, "ttl"),
                            t.get_ref()
                        ),
                    );
                    None
                }
            });
        let header = match &raw.header {
            None => Some(http::header::AUTHORIZATION),
            Some(h) => match HeaderName::from_bytes(h.get_ref().as_bytes()) {
                Ok(n) => Some(n),
                Err(_) => {
                    self.error(
                        h.span(),
                        format!(
                            "{}: invalid header name {:?}",
                            field(name, "header"),
                            h.get_ref()
                        ),
                    );
                    None
                }
            },
        };
        let mut claims = Vec::new();
        for (k, span, json) in raw.claims.map(|c| c.into_inner()).unwrap_or_default() {
            match JwtClaim::parse(json) {
                Ok(claim) => claims.push((k, claim)),
                Err(e) => self.error(span, format!("{}: claim {k:?}: {e}", field(name, "claims"))),
            }
        }
        CredentialKind::Jwt {
            alg: alg.unwrap_or(JwtAlg::Hs256),
            ttl,
            header: header.unwrap_or(http::header::AUTHORIZATION),
            claims,
        }
    }
}

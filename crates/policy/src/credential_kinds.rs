//! Validation of the OAuth2 (`oauth2`, `oauth2_client_credentials`), `google_id_token` and
//! `hmac` credential kinds: which keys each grant needs, the templates of their headers and
//! messages. Errors name the field (`credentials.NAME.FIELD`); key material is always a secret
//! source (`credential::key_source`).

use std::collections::HashSet;
use std::time::Duration;

use http::HeaderName;

use super::compile::FileCx;
use super::credential::{field, Register};
use super::schema::{RawCredential, StringMap};
use crate::secrets::Template;
use crate::signing::{
    parse_hmac_template, ClientAuth, Grant, Hmac, HmacAlg, HmacEncoding, HmacPart, HmacTimestamp,
    HmacUse, Kind as CredentialKind, OAuth2,
};

/// The default lifetime of a JWT-bearer assertion.
const ASSERTION_TTL: Duration = Duration::from_secs(300);

impl FileCx<'_> {
    /// `oauth2` (any grant) and its alias `oauth2_client_credentials`.
    pub(super) fn oauth2(
        &mut self,
        name: &str,
        mut raw: RawCredential,
        secrets: &HashSet<String>,
        register: Register<'_>,
    ) -> CredentialKind {
        let alias = raw.grant.is_none();
        let grant_name = raw
            .grant
            .as_ref()
            .map_or("client_credentials".to_string(), |g| g.get_ref().clone());
        self.grant_keys(name, &raw, &grant_name);
        let client_auth = self.client_auth(name, &raw);
        for f in ["client_secret", "refresh_token", "username", "password"] {
            let v = match f {
                "client_secret" => &raw.client_secret,
                "refresh_token" => &raw.refresh_token,
                "username" => &raw.username,
                _ => &raw.password,
            };
            self.key_source(name, f, v, &mut *register);
        }
        let token_url = self.https_url(name, "token_url", &raw.token_url);
        let headers = self.header_templates(
            name,
            "token_endpoint_headers",
            raw.token_endpoint_headers.take(),
            secrets,
        );
        let grant = match grant_name.as_str() {
            "refresh_token" => Grant::RefreshToken,
            "password" => Grant::Password,
            "jwt_bearer" => {
                let ttl = raw.ttl.is_some();
                let jwt = RawCredential {
                    key: raw.key.take(),
                    alg: raw.alg.take(),
                    ttl: raw.ttl.take(),
                    claims: raw.claims.take(),
                    ..RawCredential::default()
                };
                match self.jwt(name, jwt, register) {
                    CredentialKind::Jwt {
                        alg,
                        ttl: t,
                        claims,
                        ..
                    } => Grant::JwtBearer {
                        alg,
                        ttl: t.filter(|_| ttl).unwrap_or(ASSERTION_TTL),
                        claims,
                    },
                    _ => Grant::ClientCredentials,
                }
            }
            _ => Grant::ClientCredentials,
        };
        CredentialKind::OAuth2(Box::new(OAuth2 {
            token_url: token_url.unwrap_or_default(),
            grant,
            client_id: raw.client_id.map(|v| v.into_inner()),
            has_client_secret: raw.client_secret.is_some(),
            client_auth,
            scope: raw.scope.map(|v| v.into_inner()),
            audience: raw.audience.map(|v| v.into_inner()),
            headers,
            alias,
        }))
    }

    /// The keys the grant needs, and the grant-specific keys it does not take.
    fn grant_keys(&mut self, name: &str, raw: &RawCredential, grant_name: &str) {
        // (grant, the keys it needs, the grant-specific keys it takes)
        let grants: [(&str, &[&str], &[&str]); 4] = [
            ("client_credentials", &["client_id", "client_secret"], &[]),
            ("refresh_token", &["refresh_token"], &["refresh_token"]),
            (
                "password",
                &["username", "password"],
                &["username", "password"],
            ),
            (
                "jwt_bearer",
                &["alg", "key"],
                &["alg", "key", "ttl", "claims"],
            ),
        ];
        let specific = [
            "refresh_token",
            "username",
            "password",
            "alg",
            "key",
            "ttl",
            "claims",
        ];
        let kind_span = raw.kind.as_ref().map(|k| k.span()).unwrap_or_default();
        match grants.iter().find(|(g, _, _)| *g == grant_name) {
            None => {
                let span = raw.grant.as_ref().map_or(kind_span.clone(), |g| g.span());
                self.error(
                    span,
                    format!(
                        "{}: unknown grant {grant_name:?}: use client_credentials, refresh_token, password or jwt_bearer",
                        field(name, "grant")
                    ),
                );
            }
            Some((g, needs, takes)) => {
                for (k, span) in &raw.keys {
                    if specific.contains(k) && !takes.contains(k) {
                        self.error(
                            span.clone(),
                            format!("{}: does not apply to grant {g:?}", field(name, k)),
                        );
                    }
                }
                for n in *needs {
                    if !raw.keys.iter().any(|(k, _)| k == n) {
                        let span = raw.grant.as_ref().map_or(kind_span.clone(), |g| g.span());
                        self.error(span, format!("{}: grant {g:?} needs {n}", field(name, n)));
                    }
                }
            }
        }
    }

    /// `client_auth`: `client_secret_post` (default) or `client_secret_basic`.
    fn client_auth(&mut self, name: &str, raw: &RawCredential) -> ClientAuth {
        match raw
            .client_auth
            .as_ref()
            .map(|a| (a.get_ref().as_str(), a.span()))
        {
            None | Some(("client_secret_post", _)) => ClientAuth::Post,
            Some(("client_secret_basic", span)) => {
                if raw.client_id.is_none() || raw.client_secret.is_none() {
                    self.error(
                        span,
                        format!(
                            "{}: client_secret_basic needs client_id and client_secret",
                            field(name, "client_auth")
                        ),
                    );
                }
                ClientAuth::Basic
            }
            Some((other, span)) => {
                self.error(
                    span,
                    format!(
                        "{}: {other:?} is not client_secret_post or client_secret_basic",
                        field(name, "client_auth")
                    ),
                );
                ClientAuth::Post
            }
        }
    }

    /// Header name → `{{secret.X}}` template, each secret a declared `[secrets.X]`.
    fn header_templates(
        &mut self,
        name: &str,
        f: &str,
        map: Option<toml::Spanned<StringMap>>,
        secrets: &HashSet<String>,
    ) -> Vec<(HeaderName, Template)> {
        let mut out = Vec::new();
        for (k, v) in map.map(|m| m.into_inner()).unwrap_or_default() {
            let Ok(h) = HeaderName::from_bytes(k.get_ref().as_bytes()) else {
                self.error(
                    k.span(),
                    format!("{}: invalid header name {:?}", field(name, f), k.get_ref()),
                );
                continue;
            };
            match Template::parse(v.get_ref()) {
                Ok(t) => {
                    for s in t.secrets() {
                        if !secrets.contains(s) {
                            self.error(
                                v.span(),
                                format!(
                                    "{}.{h}: {{{{secret.{s}}}}} names no [secrets.{s}]",
                                    field(name, f)
                                ),
                            );
                        }
                    }
                    out.push((h, t));
                }
                Err(e) => self.error(v.span(), format!("{}.{h}: {e}", field(name, f))),
            }
        }
        out
    }

    /// `google_id_token`: a service-account key and the audience the ID token is for.
    pub(super) fn google_id_token(
        &mut self,
        name: &str,
        raw: RawCredential,
        register: Register<'_>,
    ) -> CredentialKind {
        self.key_source(name, "key", &raw.key, register);
        let token_uri = self.https_url(name, "token_uri", &raw.token_uri);
        let audience = match &raw.audience {
            Some(a) if a.get_ref().is_empty() => {
                self.error(
                    a.span(),
                    format!("{}: must not be empty", field(name, "audience")),
                );
                String::new()
            }
            Some(a) => a.get_ref().clone(),
            None => String::new(),
        };
        CredentialKind::GoogleIdToken {
            audience,
            token_uri,
        }
    }

    /// `hmac`: the key, the message template, the signature's headers.
    pub(super) fn hmac(
        &mut self,
        name: &str,
        raw: RawCredential,
        register: Register<'_>,
    ) -> CredentialKind {
        self.key_source(name, "key", &raw.key, register);
        let algorithm = self.choice(
            name,
            &raw.algorithm,
            Choice {
                key: "algorithm",
                default: HmacAlg::Sha256,
                parse: HmacAlg::parse,
                allowed: "sha256, sha512 or sha1",
            },
        );
        let encoding = self.choice(
            name,
            &raw.encoding,
            Choice {
                key: "encoding",
                default: HmacEncoding::Hex,
                parse: HmacEncoding::parse,
                allowed: "hex or base64",
            },
        );
        let timestamp = self.choice(
            name,
            &raw.timestamp,
            Choice {
                key: "timestamp",
                default: HmacTimestamp::Seconds,
                parse: HmacTimestamp::parse,
                allowed: "unix, unix_ms or rfc3339",
            },
        );
        let message = match &raw.message {
            Some(m) => match parse_hmac_template(m.get_ref(), HmacUse::Message) {
                Ok(p) => p,
                Err(e) => {
                    self.error(m.span(), format!("{}: {e}", field(name, "message")));
                    Vec::new()
                }
            },
            None => Vec::new(),
        };
        let mut headers = Vec::new();
        let span = raw.headers.as_ref().map(|h| h.span());
        for (k, v) in raw.headers.map(|m| m.into_inner()).unwrap_or_default() {
            let Ok(h) = HeaderName::from_bytes(k.get_ref().as_bytes()) else {
                self.error(
                    k.span(),
                    format!(
                        "{}: invalid header name {:?}",
                        field(name, "headers"),
                        k.get_ref()
                    ),
                );
                continue;
            };
            match parse_hmac_template(v.get_ref(), HmacUse::Header) {
                Ok(p) => headers.push((h, p)),
                Err(e) => self.error(v.span(), format!("{}.{h}: {e}", field(name, "headers"))),
            }
        }
        let signs = headers
            .iter()
            .any(|(_, p)| p.contains(&HmacPart::Signature));
        if let (Some(span), false) = (span, signs) {
            self.error(
                span,
                format!(
                    "{}: no header carries {{{{signature}}}}",
                    field(name, "headers")
                ),
            );
        }
        let max = self.max_signed_body(name, &raw.max_signed_body);
        CredentialKind::Hmac(Box::new(Hmac {
            algorithm,
            encoding,
            message,
            timestamp,
            headers,
            max_signed_body: max,
        }))
    }

    /// One of a fixed set of words (`c`); its default when absent.
    fn choice<T>(&mut self, name: &str, v: &Option<toml::Spanned<String>>, c: Choice<T>) -> T {
        let Some(v) = v else {
            return c.default;
        };
        (c.parse)(v.get_ref()).unwrap_or_else(|| {
            self.error(
                v.span(),
                format!(
                    "{}: {:?} is not {}",
                    field(name, c.key),
                    v.get_ref(),
                    c.allowed
                ),
            );
            c.default
        })
    }
}

/// A key that takes one of a fixed set of words.
struct Choice<T> {
    key: &'static str,
    default: T,
    parse: fn(&str) -> Option<T>,
    /// The words, for the error: "sha256, sha512 or sha1".
    allowed: &'static str,
}

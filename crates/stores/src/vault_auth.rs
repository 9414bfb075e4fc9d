//! latchkey's login to one Vault/OpenBao connection: the client token, when it expires and
//! whether it renews.
//!
//! - **token**: the token is read from its source (`env:`, `file:` — a rotated file is read
//!   again —, `exec:`) and `auth/token/lookup-self` says its TTL and whether it renews.
//! - **approle**: `POST auth/MOUNT/login` with `role_id` and `secret_id` from their sources.
//! - **jwt** (Kubernetes or JWT): `POST auth/MOUNT/login` with `role` and the token in
//!   `token_file`, read afresh at every login (a projected service-account token rotates).
//!
//! Once two thirds of the token's TTL have passed, a renewable token is renewed
//! (`auth/token/renew-self`); one that is not (or whose renewal no longer extends it: its max
//! TTL is reached) is replaced by a fresh login. That happens in the background
//! ([`Session::keep`], run by the connection's keeper task in `vault`), so a token whose TTL is
//! shorter than the secrets' refresh stays alive between reads, and before a call when the
//! keeper has not got to it. An expired token is never used: the call logs in first. A call
//! refused with 403 "permission denied"/"invalid token" logs in again and is retried once (the
//! caller's part, [`Session::refused`]). Logins, renewals and the check of who holds the token
//! are one flight (a tokio mutex), so concurrent fetches make one login.
//!
//! The token is a [`SecretValue`] sent only to Vault, as `X-Vault-Token` (a sensitive header);
//! it is never logged and never in an error.

use std::time::Duration;

use http::Method;
use serde_json::json;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::secrets::{SecretStore, SecretValue, Source, VaultAuth, VaultConnection};
use crate::signing::TokenTransport;
use crate::vault_http::{self, AuthAnswer, Call, CallError, LookupAnswer, LOGIN_RULE};

/// How long a failed renewal (or early re-login) waits before it is tried again, while the
/// token in hand is still valid.
const RETRY_AUTH: Duration = Duration::from_secs(5);

/// A renewal must push the expiry out by more than this to count as extending it.
const EXTENDS_BY: Duration = Duration::from_secs(1);

/// One connection's login, behind its single flight.
pub(crate) struct Session {
    state: Mutex<State>,
    /// Told of every login, so the keeper starts watching a token as soon as there is one.
    logged_in: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    login: Option<Login>,
    /// The token / role id and secret id sources, loaded at the first login (`file:` sources
    /// are read again when the file changes).
    sources: Option<SecretStore>,
}

/// A client token latchkey holds.
pub(crate) struct Login {
    pub(crate) token: SecretValue,
    /// `None`: the token never expires (a TTL of 0).
    expires: Option<Instant>,
    /// When to renew or log in again; `None`: nothing to do before it expires.
    due: Option<Instant>,
    renewable: bool,
}

impl Login {
    fn new(token: SecretValue, ttl: u64, renewable: bool, now: Instant) -> Self {
        let ttl = Duration::from_secs(ttl);
        let live = !ttl.is_zero();
        Self {
            token,
            expires: live.then(|| now + ttl),
            due: live.then(|| now + ttl.mul_f64(2.0 / 3.0)),
            renewable,
        }
    }
}

/// What a session logs in to.
pub(crate) struct Target<'a> {
    pub(crate) transport: &'a dyn TokenTransport,
    pub(crate) conn: &'a VaultConnection,
}

impl Session {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State::default()),
            logged_in: tokio::sync::Notify::new(),
        }
    }

    /// A token to call with: the one in hand, renewed or replaced when due, or a fresh login.
    pub(crate) async fn token(&self, to: &Target<'_>) -> Result<SecretValue, String> {
        let mut st = self.state.lock().await;
        let now = Instant::now();
        let expired = |l: &Login| l.expires.is_some_and(|e| now >= e);
        match st.login.as_ref() {
            Some(l) if !expired(l) && l.due.is_none_or(|d| now < d) => {
                return Ok(l.token.clone());
            }
            Some(l) if !expired(l) => {
                if let Err(why) = refresh(to, &mut st, now).await {
                    if st.login.is_none() {
                        // Refused on renewal, and the fresh login failed.
                        return Err(why);
                    }
                    tracing::warn!(vault = %vault_http::address(to.conn), error = %why,
                        "renewing latchkey's Vault token failed; the token in hand is used until it expires");
                    if let Some(l) = st.login.as_mut() {
                        l.due = Some(now + RETRY_AUTH);
                    }
                }
            }
            _ => {
                let fresh = login(to, &mut st.sources).await?;
                st.login = Some(fresh);
                self.logged_in.notify_one();
            }
        }
        match st.login.as_ref() {
            Some(l) if !expired(l) => Ok(l.token.clone()),
            _ => Err(format!(
                "vault {}: latchkey's token has expired and could not be renewed",
                vault_http::address(to.conn)
            )),
        }
    }

    /// The background half of [`Session::token`]: renews (or replaces) the token in hand once
    /// it is due, and says when to look next (`None`: no login yet, or nothing ever due). Never
    /// the first login: a connection nobody has read from yet is left alone.
    pub(crate) async fn keep(&self, to: &Target<'_>) -> Option<Instant> {
        self.keep_once(to).await
    }

    /// Waits (at most `idle`) for a login.
    pub(crate) async fn wait_login(&self, idle: Duration) {
        let _ = tokio::time::timeout(idle, self.logged_in.notified()).await;
    }

    async fn keep_once(&self, to: &Target<'_>) -> Option<Instant> {
        let due = {
            let st = self.state.lock().await;
            st.login.as_ref()?.due?
        };
        if Instant::now() >= due {
            // Its failures are logged by `token` and retried when due again.
            let _ = self.token(to).await;
        }
        let st = self.state.lock().await;
        st.login.as_ref().and_then(|l| l.due)
    }

    /// A call made with `used` was refused as if the token were no good: logs in again (unless
    /// another call already did) and returns the token to retry with, or `None` when a retry
    /// cannot help (the login gave the same token back).
    pub(crate) async fn refused(
        &self,
        to: &Target<'_>,
        used: &SecretValue,
    ) -> Result<Option<SecretValue>, String> {
        let mut st = self.state.lock().await;
        if let Some(l) = &st.login {
            if l.token != *used {
                return Ok(Some(l.token.clone()));
            }
        }
        st.login = None;
        let fresh = login(to, &mut st.sources).await?;
        let same = fresh.token == *used;
        let token = fresh.token.clone();
        st.login = Some(fresh);
        self.logged_in.notify_one();
        Ok((!same).then_some(token))
    }
}

/// Renews the token in hand, or logs in again when it does not renew (any more).
async fn refresh(to: &Target<'_>, st: &mut State, now: Instant) -> Result<(), String> {
    let Some(held) = st.login.as_mut() else {
        return Ok(());
    };
    if held.renewable {
        match renew(to, &held.token).await {
            Ok((ttl, renewable)) => {
                let expires = now + Duration::from_secs(ttl);
                let extends = ttl > 0 && held.expires.is_none_or(|old| expires > old + EXTENDS_BY);
                if extends {
                    *held = Login::new(held.token.clone(), ttl, renewable, now);
                    return Ok(());
                }
                // At its max TTL: the renewal no longer extends it; log in again below.
                held.renewable = false;
            }
            Err(e) if e.token_refused() => st.login = None,
            Err(e) => return Err(e.describe(to.conn, &Method::POST, RENEW)),
        }
    }
    let old = st.login.as_ref().map(|l| l.token.clone());
    let mut fresh = login(to, &mut st.sources).await?;
    if let (Some(old), Some(held)) = (old, st.login.as_ref()) {
        if fresh.token == old {
            // The same token again (token auth, not rotated): nothing more to do until it
            // expires, and it does not renew any more.
            fresh.due = None;
            fresh.renewable = held.renewable;
        }
    }
    st.login = Some(fresh);
    Ok(())
}

const RENEW: &str = "auth/token/renew-self";
const LOOKUP: &str = "auth/token/lookup-self";

/// `auth/token/renew-self`: the new TTL and whether it renews again.
async fn renew(to: &Target<'_>, token: &SecretValue) -> Result<(u64, bool), CallError> {
    let call = Call {
        rule: LOGIN_RULE,
        method: Method::POST,
        path: RENEW,
        token: Some(token),
        body: Some(vault_http::json_body(&json!({}))),
    };
    let answer: AuthAnswer = vault_http::send(to.transport, to.conn, call).await?;
    let auth = answer
        .auth
        .ok_or_else(|| CallError::Invalid("no auth in the answer".into()))?;
    Ok((auth.lease_duration, auth.renewable))
}

/// Logs in as the connection's `auth` says.
async fn login(to: &Target<'_>, sources: &mut Option<SecretStore>) -> Result<Login, String> {
    let now = Instant::now();
    let addr = vault_http::address(to.conn);
    match &to.conn.auth {
        VaultAuth::Token { token } => {
            let token = source_value(sources, &[("token", token)], addr)
                .await?
                .remove(0);
            let call = Call {
                rule: LOGIN_RULE,
                method: Method::GET,
                path: LOOKUP,
                token: Some(&token),
                body: None,
            };
            let answer: LookupAnswer = vault_http::send(to.transport, to.conn, call)
                .await
                .map_err(|e| e.describe(to.conn, &Method::GET, LOOKUP))?;
            let data = answer.data.ok_or_else(|| {
                format!("vault {addr}: GET {LOOKUP}: answered no data about the token")
            })?;
            Ok(Login::new(token, data.ttl, data.renewable, now))
        }
        VaultAuth::AppRole {
            mount,
            role_id,
            secret_id,
        } => {
            let ids = source_value(
                sources,
                &[("role_id", role_id), ("secret_id", secret_id)],
                addr,
            )
            .await?;
            let (role_id, secret_id) = (
                text(&ids[0], "role_id", addr)?,
                text(&ids[1], "secret_id", addr)?,
            );
            let body = json!({ "role_id": role_id, "secret_id": secret_id });
            post_login(to, mount, &body, now).await
        }
        VaultAuth::Jwt {
            mount,
            role,
            token_file,
        } => {
            let jwt = tokio::fs::read(token_file).await.map_err(|e| {
                format!(
                    "vault {addr}: cannot read the login token file {}: {e}",
                    token_file.display()
                )
            })?;
            let jwt = SecretValue::new(jwt);
            let jwt = text(&jwt, "the login token file", addr)?.trim();
            if jwt.is_empty() {
                return Err(format!(
                    "vault {addr}: the login token file {} is empty",
                    token_file.display()
                ));
            }
            let body = json!({ "role": role, "jwt": jwt });
            post_login(to, mount, &body, now).await
        }
    }
}

/// `POST auth/MOUNT/login` with `body`; the answer's `auth` is the login.
async fn post_login(
    to: &Target<'_>,
    mount: &str,
    body: &serde_json::Value,
    now: Instant,
) -> Result<Login, String> {
    let path = format!("auth/{}/login", mount.trim_matches('/'));
    let call = Call {
        rule: LOGIN_RULE,
        method: Method::POST,
        path: &path,
        token: None,
        body: Some(vault_http::json_body(body)),
    };
    let answer: AuthAnswer = vault_http::send(to.transport, to.conn, call)
        .await
        .map_err(|e| e.describe(to.conn, &Method::POST, &path))?;
    let auth = answer.auth.ok_or_else(|| {
        format!(
            "vault {}: POST {path}: answered no auth",
            vault_http::address(to.conn)
        )
    })?;
    if auth.client_token.is_empty() {
        return Err(format!(
            "vault {}: POST {path}: answered no client token",
            vault_http::address(to.conn)
        ));
    }
    let token = SecretValue::new(auth.client_token.into_bytes());
    Ok(Login::new(token, auth.lease_duration, auth.renewable, now))
}

/// The values of the login's own secret sources, loading them on first use.
async fn source_value(
    sources: &mut Option<SecretStore>,
    wanted: &[(&str, &Source)],
    addr: &str,
) -> Result<Vec<SecretValue>, String> {
    if sources.is_none() {
        let load: Vec<(String, Source)> = wanted
            .iter()
            .map(|(key, source)| (key.to_string(), (*source).clone()))
            .collect();
        let store = SecretStore::load(load).map_err(|errors| {
            let why: Vec<String> = errors.iter().map(|(k, e)| format!("{k}: {e}")).collect();
            format!(
                "vault {addr}: cannot read the login secrets: {}",
                why.join("; ")
            )
        })?;
        *sources = Some(store);
    }
    let Some(store) = sources.as_ref() else {
        return Err(format!("vault {addr}: the login secrets are not loaded"));
    };
    let mut values = Vec::with_capacity(wanted.len());
    for (key, _) in wanted {
        let v = store
            .get(key)
            .await
            .map_err(|e| format!("vault {addr}: the login's {key}: {e}"))?;
        values.push(v);
    }
    Ok(values)
}

/// The value as text, for a JSON login body.
fn text<'v>(v: &'v SecretValue, what: &str, addr: &str) -> Result<&'v str, String> {
    std::str::from_utf8(v.expose()).map_err(|_| format!("vault {addr}: {what} is not UTF-8 text"))
}

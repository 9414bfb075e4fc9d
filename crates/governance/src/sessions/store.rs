//! Making, reading, listing, extending and revoking sessions in the state store: what the admin
//! API (`/sessions`) and `latchkey sessions` do.
//!
//! A session is made only from a profile of the policy in force, and only narrower than it
//! ([`crate::policy::profile::Profile::narrow`]); its token is returned once and kept as a keyed
//! hash. Revoking keeps a tombstone (so later attempts get `session_revoked`), writes an end
//! note every replica polls, publishes an event, and cuts this replica's connections at once.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    lock, now_ms, rfc3339_ms, End, SessionDoc, Sessions, CHANNEL, END_NOTE_TTL, ID_PREFIX, NS_ENDS,
    NS_SESSIONS, NS_SOURCES, TOKEN_PREFIX, TOMBSTONE,
};
use crate::policy::profile::{Asked, NarrowRequest, TooWide};
use crate::policy::Policy;
use crate::state::StateError;

/// `POST /sessions`'s body.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    pub profile: String,
    /// `"2h"`; default: the profile's longest.
    #[serde(default)]
    pub ttl: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The address the session is bound to: it may be used only from there, and a client
    /// there that presents nothing (transparent, DNS-routed) is this session.
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default)]
    pub narrow: NarrowRequest,
}

/// A session as the API shows it: never its token or the token's hash.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SessionView {
    pub id: String,
    pub profile: String,
    pub state: String,
    pub labels: BTreeMap<String, String>,
    pub created_at: String,
    pub expires_at: String,
    /// The latest an extension may reach.
    pub max_expires_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    pub narrow: NarrowRequest,
    /// The session's reach digest (its audit records' `reach`).
    pub reach: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_by: Option<String>,
}

impl SessionView {
    pub fn of(doc: &SessionDoc, now: u64) -> Self {
        let state = if doc.revoked_at.is_some() {
            "revoked"
        } else if now >= doc.expires_at {
            "expired"
        } else {
            "live"
        };
        Self {
            id: doc.id.clone(),
            profile: doc.profile.clone(),
            state: state.to_string(),
            labels: doc.labels.clone(),
            created_at: rfc3339_ms(doc.created_at),
            expires_at: rfc3339_ms(doc.expires_at),
            max_expires_at: rfc3339_ms(doc.max_expires_at),
            source: doc.source.map(|s| s.to_string()),
            narrow: doc.narrow.clone(),
            reach: doc.reach.clone(),
            created_by: doc.created_by.clone(),
            revoked_at: doc.revoked_at.map(rfc3339_ms),
            revoked_by: doc.revoked_by.clone(),
        }
    }
}

/// A session just made: its view and its token (shown this once).
#[derive(Debug)]
pub struct Created {
    pub session: SessionView,
    pub token: zeroize::Zeroizing<String>,
}

/// Why a session could not be made or changed; each says which field or id.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("unknown profile {name:?}{}; the policy defines: {}", crate::policy::did_you_mean(name, known.iter().map(String::as_str)), if known.is_empty() { "no profiles".to_string() } else { known.join(", ") })]
    UnknownProfile { name: String, known: Vec<String> },
    #[error("wider than its profile allows: {0}")]
    TooWide(TooWide),
    #[error("{0}")]
    BadRequest(String),
    #[error("source {ip} is already bound to live session {id}")]
    SourceTaken { ip: IpAddr, id: String },
    #[error("no session {0:?}")]
    NotFound(String),
    #[error("session {id:?} is {state}: it cannot be extended")]
    Ended { id: String, state: &'static str },
    #[error("{0}")]
    Store(#[from] StateError),
}

impl CreateError {
    /// The HTTP status the admin API answers with.
    pub fn status(&self) -> u16 {
        match self {
            CreateError::UnknownProfile { .. } | CreateError::NotFound(_) => 404,
            CreateError::TooWide(_) => 422,
            CreateError::BadRequest(_) => 400,
            CreateError::SourceTaken { .. } | CreateError::Ended { .. } => 409,
            CreateError::Store(_) => 503,
        }
    }
}

/// `GET /sessions` filters.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub profile: Option<String>,
    /// `key=value`: sessions carrying this label.
    pub label: Option<(String, String)>,
    /// `live`, `revoked`, `expired`.
    pub state: Option<String>,
    pub limit: usize,
}

/// How many sessions one `list` reads at most.
pub const MAX_LIST: usize = 10_000;

impl Sessions {
    /// Makes a session of `req.profile` under `policy`, narrower than the profile or refused.
    pub async fn create(
        &self,
        policy: &Policy,
        req: &CreateRequest,
        by: Option<&str>,
    ) -> Result<Created, CreateError> {
        let profiles = || {
            policy
                .identities()
                .iter()
                .filter(|i| i.profile.is_some())
                .map(|i| i.name.clone())
                .collect::<Vec<_>>()
        };
        let identity = policy
            .identity(&req.profile)
            .filter(|i| i.profile.is_some())
            .ok_or_else(|| CreateError::UnknownProfile {
                name: req.profile.clone(),
                known: profiles(),
            })?;
        let terms = identity
            .profile
            .as_ref()
            .ok_or_else(|| CreateError::BadRequest("not a profile".to_string()))?;
        let ttl = match &req.ttl {
            Some(t) => Some(humantime::parse_duration(t).map_err(|e| {
                CreateError::BadRequest(format!("ttl {t:?} is not a duration like \"2h\": {e}"))
            })?),
            None => None,
        };
        let source = match &req.source {
            Some(s) => Some(s.trim().parse::<IpAddr>().map_err(|_| {
                CreateError::BadRequest(format!("source {s:?} is not an IP address"))
            })?),
            None => None,
        }
        .map(|ip| ip.to_canonical());
        let granted = terms
            .narrow(
                identity,
                policy,
                Asked {
                    ttl,
                    labels: &req.labels,
                    source,
                    narrow: &req.narrow,
                },
            )
            .map_err(CreateError::TooWide)?;
        let reach = crate::policy::reach::session_reach(policy, identity, &granted.narrowing).reach;
        let (id, token) = (new_id()?, new_token()?);
        let now = now_ms();
        let doc = SessionDoc {
            id: id.clone(),
            profile: identity.name.clone(),
            token_hash: hex::encode(self.hash(token.as_bytes())),
            labels: granted.labels,
            created_at: now,
            expires_at: now + granted.ttl.as_millis() as u64,
            max_expires_at: now + terms.max_ttl.as_millis() as u64,
            source,
            narrow: req.narrow.clone(),
            reach,
            created_by: by.map(str::to_string),
            revoked_at: None,
            revoked_by: None,
        };
        if let Some(ip) = source {
            self.bind_source(ip, &id, granted.ttl).await?;
        }
        let bytes = serde_json::to_vec(&doc)
            .map_err(|e| CreateError::BadRequest(format!("cannot encode the session: {e}")))?;
        let kept = granted.ttl + TOMBSTONE;
        if !self
            .store
            .put_new(NS_SESSIONS, &id, &bytes, Some(kept))
            .await?
        {
            return Err(CreateError::BadRequest(
                "a session with this id exists (retry)".to_string(),
            ));
        }
        self.counters.created.fetch_add(1, Ordering::Relaxed);
        tracing::info!(session = %id, profile = %doc.profile, by = by.unwrap_or("-"), "session created");
        Ok(Created {
            session: SessionView::of(&doc, now),
            token,
        })
    }

    /// Binds `ip` to session `id` for `ttl`; refused if a live session holds it.
    async fn bind_source(&self, ip: IpAddr, id: &str, ttl: Duration) -> Result<(), CreateError> {
        let key = ip.to_string();
        if self
            .store
            .put_new(NS_SOURCES, &key, id.as_bytes(), Some(ttl))
            .await?
        {
            return Ok(());
        }
        // Held: by a session that is still live, or one that ended without unbinding.
        let holder = self
            .store
            .get(NS_SOURCES, &key)
            .await?
            .and_then(|v| String::from_utf8(v.doc).ok())
            .unwrap_or_default();
        let live = match self.read(&holder).await? {
            Some(doc) => doc.revoked_at.is_none() && now_ms() < doc.expires_at,
            None => false,
        };
        if live {
            return Err(CreateError::SourceTaken { ip, id: holder });
        }
        self.store
            .put(NS_SOURCES, &key, id.as_bytes(), Some(ttl))
            .await?;
        Ok(())
    }

    /// The stored session `id`, if any.
    pub async fn read(&self, id: &str) -> Result<Option<SessionDoc>, StateError> {
        if !super::admit::is_session_id(id) {
            return Ok(None);
        }
        Ok(self
            .store
            .get(NS_SESSIONS, id)
            .await?
            .and_then(|v| serde_json::from_slice(&v.doc).ok()))
    }

    /// `GET /sessions/ID`.
    pub async fn view(&self, id: &str) -> Result<Option<SessionView>, StateError> {
        Ok(self.read(id).await?.map(|d| SessionView::of(&d, now_ms())))
    }

    /// `GET /sessions`: newest first, filtered.
    pub async fn list(&self, filter: &Filter) -> Result<Vec<SessionView>, StateError> {
        let limit = filter.limit.clamp(1, MAX_LIST);
        let now = now_ms();
        let mut out = Vec::new();
        for (_, v) in self.store.list(NS_SESSIONS, MAX_LIST).await? {
            let Ok(doc) = serde_json::from_slice::<SessionDoc>(&v.doc) else {
                continue;
            };
            let view = SessionView::of(&doc, now);
            let keep = filter.profile.as_ref().is_none_or(|p| *p == view.profile)
                && filter
                    .label
                    .as_ref()
                    .is_none_or(|(k, v)| view.labels.get(k) == Some(v))
                && filter.state.as_ref().is_none_or(|s| *s == view.state);
            if keep {
                out.push(view);
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Revokes `id`: its next request is refused and every connection it holds is cut, here at
    /// once and on every replica within a poll. Revoking a revoked session changes nothing.
    pub async fn revoke(&self, id: &str, by: Option<&str>) -> Result<SessionView, CreateError> {
        let doc = self
            .update(id, |doc| {
                if doc.revoked_at.is_none() {
                    doc.revoked_at = Some(now_ms());
                    doc.revoked_by = by.map(str::to_string);
                }
                Ok(Some(TOMBSTONE))
            })
            .await?;
        if let Some(ip) = doc.source {
            let key = ip.to_string();
            let held = self.store.get(NS_SOURCES, &key).await?;
            if held.is_some_and(|v| v.doc == id.as_bytes()) {
                self.store.delete(NS_SOURCES, &key).await?;
            }
            let mut by_source = lock(&self.by_source);
            if by_source.get(&ip).is_some_and(|held| held == id) {
                by_source.remove(&ip);
            }
        }
        self.announce_end(id).await?;
        self.counters.revoked.fetch_add(1, Ordering::Relaxed);
        tracing::info!(session = %id, by = by.unwrap_or("-"), "session revoked");
        Ok(SessionView::of(&doc, now_ms()))
    }

    /// Tells every replica `id` ended, and ends it here.
    pub(super) async fn announce_end(&self, id: &str) -> Result<(), StateError> {
        self.store
            .put(NS_ENDS, id, b"revoked", Some(END_NOTE_TTL))
            .await?;
        let cached = lock(&self.cache).get(id).cloned();
        if let Some(live) = cached {
            live.end(End::Revoked);
        }
        // A wake-up only: pollers see the note even if the event is lost.
        let _ = self.store.publish(CHANNEL, &format!("end {id}")).await;
        Ok(())
    }

    /// Extends `id` to `ttl` from now, never past its profile's TTL from its creation.
    pub async fn extend(&self, id: &str, ttl: Duration) -> Result<SessionView, CreateError> {
        let now = now_ms();
        let doc = self
            .update(id, |doc| {
                if doc.revoked_at.is_some() {
                    return Err(CreateError::Ended {
                        id: doc.id.clone(),
                        state: "revoked",
                    });
                }
                if now >= doc.expires_at {
                    return Err(CreateError::Ended {
                        id: doc.id.clone(),
                        state: "expired",
                    });
                }
                let wanted = now + ttl.as_millis() as u64;
                if wanted > doc.max_expires_at {
                    return Err(CreateError::TooWide(TooWide(vec![format!(
                        "ttl {} would end after {}, the longest its profile allows from its creation",
                        humantime::format_duration(ttl),
                        rfc3339_ms(doc.max_expires_at)
                    )])));
                }
                doc.expires_at = wanted.max(doc.expires_at);
                Ok(Some(
                    Duration::from_millis(doc.expires_at.saturating_sub(now)) + TOMBSTONE,
                ))
            })
            .await?;
        if let Some(ip) = doc.source {
            let left = Duration::from_millis(doc.expires_at.saturating_sub(now));
            self.store
                .put(NS_SOURCES, &ip.to_string(), id.as_bytes(), Some(left))
                .await?;
        }
        let cached = lock(&self.cache).get(id).cloned();
        if let Some(live) = cached {
            live.expires_at.store(doc.expires_at, Ordering::Release);
        }
        let _ = self.store.publish(CHANNEL, &format!("extend {id}")).await;
        Ok(SessionView::of(&doc, now))
    }

    /// Compare-and-set `change` on `id` (retried when another writer got there first); the
    /// change returns the record's new time to live.
    async fn update(
        &self,
        id: &str,
        change: impl Fn(&mut SessionDoc) -> Result<Option<Duration>, CreateError>,
    ) -> Result<SessionDoc, CreateError> {
        if !super::admit::is_session_id(id) {
            return Err(CreateError::NotFound(id.to_string()));
        }
        for _ in 0..16 {
            let Some(v) = self.store.get(NS_SESSIONS, id).await? else {
                return Err(CreateError::NotFound(id.to_string()));
            };
            // Unreadable: the store's fault, not the caller's.
            let mut doc: SessionDoc = serde_json::from_slice(&v.doc).map_err(|e| {
                CreateError::Store(StateError::Backend {
                    store: self.store.describe().to_string(),
                    message: format!("session {id:?} is unreadable: {e}"),
                })
            })?;
            let ttl = change(&mut doc)?;
            let bytes = serde_json::to_vec(&doc)
                .map_err(|e| CreateError::BadRequest(format!("cannot encode the session: {e}")))?;
            if self
                .store
                .replace(NS_SESSIONS, id, v.version, &bytes, ttl)
                .await?
            {
                return Ok(doc);
            }
        }
        Err(CreateError::Store(StateError::Backend {
            store: self.store.describe().to_string(),
            message: format!("session {id:?} kept changing under 16 updates"),
        }))
    }
}

/// `ses_` and 32 hex digits of randomness.
fn new_id() -> Result<String, CreateError> {
    let mut b = [0u8; 16];
    random(&mut b)?;
    Ok(format!("{ID_PREFIX}{}", hex::encode(b)))
}

/// `lks_` and 43 base64url characters (32 random bytes).
fn new_token() -> Result<zeroize::Zeroizing<String>, CreateError> {
    use base64::Engine;
    let mut b = zeroize::Zeroizing::new([0u8; 32]);
    random(&mut b[..])?;
    Ok(zeroize::Zeroizing::new(format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&b[..])
    )))
}

fn random(out: &mut [u8]) -> Result<(), CreateError> {
    aws_lc_rs::rand::fill(out).map_err(|_| {
        CreateError::Store(StateError::Backend {
            store: "random".to_string(),
            message: "the system random generator failed".to_string(),
        })
    })
}

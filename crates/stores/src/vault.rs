//! Vault/OpenBao: reads `vault:MOUNT/PATH[?version=N][#FIELD]` for the secret store.
//!
//! Per connection (its settings as the policy compiled them: a connection changed by a reload
//! is a new client with a fresh login) a [`Client`] holds latchkey's login (`vault_auth`), the
//! mount each path is under, and the last read of each leased path.
//!
//! Reading a path:
//! 1. **The mount** (`GET sys/internal/ui/mounts/PATH`, remembered per path): KV v2, or
//!    anything else. When that endpoint is denied (403), KV v2 is tried at the first segment
//!    (`MOUNT/data/REST`), then the path as it is; what answered is remembered.
//! 2. **The read**: KV v2 `GET MOUNTdata/REST[?version=N]`, fields under `data.data`;
//!    anything else (KV v1, a dynamic secret such as `database/creds/ROLE`) `GET PATH`,
//!    fields under `data`. `?version=` is for KV v2 only.
//! 3. **The lease**: a read that comes with a lease (`lease_id` and `lease_duration`: a
//!    dynamic secret) is valid for the lease: `valid_for` is what is left of it, and the secret
//!    store fetches again before it ends. KV v1's `lease_duration` without a `lease_id` is only
//!    a refresh hint and is ignored (the secret's `refresh` applies), like KV v2, which has none.
//! 4. **The field**: `#FIELD` picks one (a string as it is, a number or boolean as its JSON
//!    text, an object or list refused); without one, the data must have exactly one field.
//!    Errors list field *names*, never values.
//!
//! **One lease per pair.** Two secrets naming two fields of one dynamic path
//! (`database/creds/app#username`, `…#password`) must be from the same lease: the last leased
//! read of each path is kept and every field is handed from it until two thirds of its lease
//! have passed; only then is the path read again (one flight per path), so a username and a
//! password fetched together are never from two leases.
//!
//! Nothing is revoked at shutdown: a lease ends on its own at its TTL (and Vault revokes it
//! then), and a login token expires at its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use tokio::time::Instant;

use crate::secrets::{Fetched, Location, VaultConnection};
use crate::signing::TokenTransport;
use crate::vault_auth::{Session, Target};
use crate::vault_fields::Fields;
use crate::vault_http::{self, Call, CallError, Kv2Data, MountAnswer, ReadAnswer};

/// How many connections' clients are kept (a reload that changes a connection adds one; the
/// least recently used goes).
const MAX_CLIENTS: usize = 16;

/// How many paths' mounts and leased reads one client remembers before it forgets them all.
const MAX_PATHS: usize = 1024;

/// Every Vault connection latchkey reads from, over one transport.
pub(crate) struct Vault {
    transport: Arc<dyn TokenTransport>,
    /// Most recently used last.
    clients: Mutex<Vec<Arc<Client>>>,
}

impl Vault {
    pub(crate) fn new(transport: Arc<dyn TokenTransport>) -> Self {
        Self {
            transport,
            clients: Mutex::new(Vec::new()),
        }
    }

    /// Reads the secret `at` names, for the secret `name`.
    pub(crate) async fn fetch(&self, name: &str, at: &Location) -> Result<Fetched, String> {
        let Location::Vault {
            connection,
            settings,
            path,
            field,
            version,
        } = at
        else {
            return Err(format!("{} is not a Vault secret", at.describe()));
        };
        let Some(conn) = settings else {
            let table = match connection.as_str() {
                "" => "[vault]".to_string(),
                c => format!("[vault.{c}]"),
            };
            return Err(format!(
                "no {table} connection is configured for this secret"
            ));
        };
        let client = self.client(conn);
        let read = Read {
            rule: format!("secret:{name}"),
            path,
            field: field.as_deref(),
            version: *version,
        };
        client.read(&read).await
    }

    /// The client for `conn`'s settings, made on first use.
    fn client(&self, conn: &Arc<VaultConnection>) -> Arc<Client> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let client = match clients.iter().position(|c| *c.conn == **conn) {
            Some(i) => clients.remove(i),
            None => {
                let client = Arc::new(Client::new(conn.clone(), self.transport.clone()));
                keep_alive(&client);
                client
            }
        };
        clients.push(client.clone());
        if clients.len() > MAX_CLIENTS {
            clients.remove(0);
        }
        client
    }
}

/// How often a keeper with nothing due looks again (a login may have come meanwhile).
const KEEPER_IDLE: Duration = Duration::from_secs(30);

/// The connection's keeper: renews latchkey's token in the background when it is due (see
/// `vault_auth`), until the client is dropped (a reload changed its connection and it left the
/// most recently used). Outside a runtime nothing starts: renewal then happens before calls.
fn keep_alive(client: &Arc<Client>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak = Arc::downgrade(client);
    handle.spawn(async move {
        loop {
            let Some(client) = weak.upgrade() else {
                return;
            };
            match client.session.keep(&client.target()).await {
                Some(due) => {
                    drop(client);
                    let wait = due
                        .saturating_duration_since(Instant::now())
                        .clamp(Duration::from_secs(1), KEEPER_IDLE);
                    tokio::time::sleep(wait).await;
                }
                // Nothing to watch yet (or ever): wake on the next login, or look again later
                // (a client dropped meanwhile lives at most that long).
                None => client.session.wait_login(KEEPER_IDLE).await,
            }
        }
    });
}

/// One secret's read.
pub(crate) struct Read<'a> {
    /// The audit rule: `secret:NAME`.
    pub(crate) rule: String,
    pub(crate) path: &'a str,
    pub(crate) field: Option<&'a str>,
    pub(crate) version: Option<u64>,
}

/// How a path is read.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Engine {
    /// KV v2 under `mount` (`secret/`, with its trailing `/`).
    Kv2 { mount: String },
    /// `GET PATH`: KV v1, or a dynamic secret; `kind` is the mount's type, for messages.
    Plain { kind: String },
}

/// The last leased read of a path.
struct Leased {
    fields: Arc<Fields>,
    read_at: Instant,
    lease: Duration,
}

type LeaseSlot = Arc<tokio::sync::Mutex<Option<Leased>>>;

/// One connection: its login, the mount of each path, the last leased read of each path.
pub(crate) struct Client {
    conn: Arc<VaultConnection>,
    transport: Arc<dyn TokenTransport>,
    session: Session,
    engines: Mutex<HashMap<String, Engine>>,
    leases: Mutex<HashMap<String, LeaseSlot>>,
}

impl Client {
    fn new(conn: Arc<VaultConnection>, transport: Arc<dyn TokenTransport>) -> Self {
        Self {
            conn,
            transport,
            session: Session::new(),
            engines: Mutex::new(HashMap::new()),
            leases: Mutex::new(HashMap::new()),
        }
    }

    fn target(&self) -> Target<'_> {
        Target {
            transport: &*self.transport,
            conn: &self.conn,
        }
    }

    fn addr(&self) -> &str {
        vault_http::address(&self.conn)
    }

    async fn read(&self, read: &Read<'_>) -> Result<Fetched, String> {
        let (fields, valid_for) = match self.engine(read).await? {
            Some(Engine::Kv2 { mount }) => (self.kv2(read, &mount).await?, None),
            Some(Engine::Plain { kind }) => {
                if read.version.is_some() {
                    return Err(format!(
                        "vault {}: {}: ?version= is for KV v2 secrets; this path is on a {kind:?} mount",
                        self.addr(),
                        read.path
                    ));
                }
                self.plain(read).await?
            }
            None => self.fallback(read).await?,
        };
        let value = fields
            .pick(read.field)
            .map_err(|why| format!("vault {}: {}: {why}", self.addr(), read.path))?;
        Ok(Fetched { value, valid_for })
    }

    /// The remembered engine of `read.path`, or what the mounts endpoint says (`None` when it
    /// is denied).
    async fn engine(&self, read: &Read<'_>) -> Result<Option<Engine>, String> {
        if let Some(e) = self.lock_engines().get(read.path) {
            return Ok(Some(e.clone()));
        }
        let api = format!("sys/internal/ui/mounts/{}", read.path);
        // Without the re-login retry: a 403 here is a token without access to the endpoint,
        // and the fallback's own reads log in again if the token is the problem.
        let token = self.session.token(&self.target()).await?;
        let call = Call::get(&read.rule, &api, &token);
        let answer: MountAnswer = match vault_http::send(&*self.transport, &self.conn, call).await {
            Ok(a) => a,
            Err(e) if e.status() == Some(403) => return Ok(None),
            Err(e) => return Err(e.describe(&self.conn, &Method::GET, &api)),
        };
        let Some(data) = answer.data else {
            return Err(format!(
                "vault {}: GET {api}: answered no mount for this path",
                self.addr()
            ));
        };
        let kv2 = data.kind == "kv" && data.options.and_then(|o| o.version).as_deref() == Some("2");
        let engine = if kv2 {
            Engine::Kv2 { mount: data.path }
        } else {
            Engine::Plain { kind: data.kind }
        };
        self.remember(read.path, engine.clone());
        Ok(Some(engine))
    }

    /// The mounts endpoint was denied: KV v2 at the first segment, else the path as it is.
    async fn fallback(&self, read: &Read<'_>) -> Result<(Arc<Fields>, Option<Duration>), String> {
        let mount = match read.path.split_once('/') {
            Some((first, _)) => format!("{first}/"),
            None => String::new(),
        };
        let kv2 = match self.kv2(read, &mount).await {
            Ok(fields) => {
                self.remember(read.path, Engine::Kv2 { mount });
                return Ok((fields, None));
            }
            Err(why) => why,
        };
        if read.version.is_some() {
            return Err(kv2);
        }
        match self.plain(read).await {
            Ok(read_as_is) => {
                let kind = "unknown (the mounts endpoint is denied)".to_string();
                self.remember(read.path, Engine::Plain { kind });
                Ok(read_as_is)
            }
            Err(plain) => Err(format!("as KV v2: {kv2}; as a plain path: {plain}")),
        }
    }

    /// A KV v2 read: the fields of the latest version or the pinned one.
    async fn kv2(&self, read: &Read<'_>, mount: &str) -> Result<Arc<Fields>, String> {
        let rest = read
            .path
            .strip_prefix(mount)
            .filter(|r| !r.is_empty())
            .ok_or_else(|| {
                format!(
                    "vault {}: {}: the path names the KV v2 mount {mount:?} itself, not a secret in it",
                    self.addr(),
                    read.path
                )
            })?;
        let api = match read.version {
            Some(v) => format!("{mount}data/{rest}?version={v}"),
            None => format!("{mount}data/{rest}"),
        };
        let answer: ReadAnswer<Kv2Data> = self.call(&read.rule, &api).await?;
        let data = answer.data.and_then(|d| d.data).ok_or_else(|| {
            format!(
                "vault {}: GET {api}: this version of the secret is deleted or destroyed",
                self.addr()
            )
        })?;
        Ok(Arc::new(Fields::from_json(data)))
    }

    /// `GET PATH`: KV v1 or a dynamic secret. A leased read is kept and handed out again until
    /// two thirds of its lease have passed (one flight per path).
    async fn plain(&self, read: &Read<'_>) -> Result<(Arc<Fields>, Option<Duration>), String> {
        let slot = self.lease_slot(read.path);
        let mut last = slot.lock().await;
        let now = Instant::now();
        if let Some(l) = last.as_ref() {
            let age = now.saturating_duration_since(l.read_at);
            if age < l.lease.mul_f64(2.0 / 3.0) {
                return Ok((l.fields.clone(), Some(l.lease - age)));
            }
        }
        let answer: ReadAnswer<serde_json::Map<String, serde_json::Value>> =
            self.call(&read.rule, read.path).await?;
        let data = answer
            .data
            .ok_or_else(|| format!("vault {}: GET {}: answered no data", self.addr(), read.path))?;
        let fields = Arc::new(Fields::from_json(data));
        if answer.lease_id.is_empty() || answer.lease_duration == 0 {
            *last = None;
            return Ok((fields, None));
        }
        let lease = Duration::from_secs(answer.lease_duration);
        *last = Some(Leased {
            fields: fields.clone(),
            read_at: now,
            lease,
        });
        Ok((fields, Some(lease)))
    }

    /// `GET api` with the session's token; a 403 that says the token is no good logs in again
    /// and retries once.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        rule: &str,
        api: &str,
    ) -> Result<T, String> {
        let failed = |e: CallError| e.describe(&self.conn, &Method::GET, api);
        let token = self.session.token(&self.target()).await?;
        let get = |token| Call::get(rule, api, token);
        let e = match vault_http::send(&*self.transport, &self.conn, get(&token)).await {
            Ok(v) => return Ok(v),
            Err(e) if e.token_refused() => e,
            Err(e) => return Err(failed(e)),
        };
        match self.session.refused(&self.target(), &token).await {
            Ok(Some(fresh)) => vault_http::send(&*self.transport, &self.conn, get(&fresh))
                .await
                .map_err(failed),
            Ok(None) => Err(failed(e)),
            Err(why) => Err(format!("{}; logging in again failed: {why}", failed(e))),
        }
    }

    fn lock_engines(&self) -> std::sync::MutexGuard<'_, HashMap<String, Engine>> {
        self.engines.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remember(&self, path: &str, engine: Engine) {
        let mut engines = self.lock_engines();
        if engines.len() >= MAX_PATHS {
            engines.clear();
        }
        engines.insert(path.to_string(), engine);
    }

    fn lease_slot(&self, path: &str) -> LeaseSlot {
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        if leases.len() >= MAX_PATHS && !leases.contains_key(path) {
            leases.clear();
        }
        leases.entry(path.to_string()).or_default().clone()
    }
}

#[cfg(test)]
#[path = "vault_tests.rs"]
mod tests;

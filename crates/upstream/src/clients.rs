//! The pooled clients latchkey sends through, one per distinct way out: the extra non-public
//! ranges a rule (or one of latchkey's own calls) opens, an extra CA a call trusts (a Vault
//! server's own), and whether only HTTP/1.1 is offered (a WebSocket handshake needs a
//! connection that can upgrade, which an h2 one cannot). Every one dials through the same
//! [`Dialer`] and its address guard; each distinct key gets its own pool, so a connection
//! opened under one set of ranges or roots is never reused under another.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::{client, tls_config_bundles, Cidr, Client, Connector, Dialer, UpstreamError};

/// What sets one pooled client apart from another.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Way {
    /// Non-public ranges opened on top of `--allow-private`.
    pub extra: Vec<Cidr>,
    /// Offer only HTTP/1.1.
    pub http1: bool,
    /// A PEM bundle trusted on top of the roots every client trusts.
    pub ca: Option<PathBuf>,
}

/// The clients made so far, by [`Way`].
pub struct Clients {
    dialer: Arc<Dialer>,
    tls: Arc<rustls::ClientConfig>,
    /// `--upstream-ca`, which every client's roots include.
    base_ca: Option<PathBuf>,
    default: Client,
    made: Mutex<HashMap<Way, Client>>,
}

impl Clients {
    /// The clients over `dialer`, trusting `tls`'s roots (built from `base_ca`).
    pub fn new(
        dialer: Arc<Dialer>,
        tls: Arc<rustls::ClientConfig>,
        base_ca: Option<&Path>,
    ) -> Self {
        let default = client(Connector::new(dialer.clone(), tls.clone(), Vec::new()));
        Self {
            dialer,
            tls,
            base_ca: base_ca.map(Path::to_path_buf),
            default,
            made: Mutex::new(HashMap::new()),
        }
    }

    /// The client for the default way out (no extra ranges, h2 offered, the usual roots).
    pub fn default_client(&self) -> &Client {
        &self.default
    }

    /// The TLS configuration every client starts from.
    pub fn tls(&self) -> &Arc<rustls::ClientConfig> {
        &self.tls
    }

    /// The dialer every client connects through.
    pub fn dialer(&self) -> &Arc<Dialer> {
        &self.dialer
    }

    /// The client for `way`, made on first use. Fails only when `way.ca` cannot be read.
    pub fn get(&self, way: &Way) -> Result<Client, UpstreamError> {
        if way.extra.is_empty() && !way.http1 && way.ca.is_none() {
            return Ok(self.default.clone());
        }
        if let Some(made) = self.lock().get(way) {
            return Ok(made.clone());
        }
        let mut tls = match &way.ca {
            // Read outside the lock: a slow file must not hold up every other request.
            Some(ca) => tls_config_with(self.base_ca.as_deref(), ca)?,
            None => (*self.tls).clone(),
        };
        if way.http1 {
            tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        }
        let made = client(Connector::new(
            self.dialer.clone(),
            Arc::new(tls),
            way.extra.clone(),
        ));
        Ok(self.lock().entry(way.clone()).or_insert(made).clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Way, Client>> {
        self.made.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The roots of [`tls_config`] with `base` (`--upstream-ca`) and `extra` both trusted.
fn tls_config_with(
    base: Option<&Path>,
    extra: &Path,
) -> Result<rustls::ClientConfig, UpstreamError> {
    match base {
        Some(base) => tls_config_bundles(&[base, extra]),
        None => tls_config_bundles(&[extra]),
    }
}

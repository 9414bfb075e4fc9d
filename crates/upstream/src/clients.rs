//! The pooled clients latchkey sends through, one per distinct way out: the extra non-public
//! ranges a rule (or one of latchkey's own calls) opens, an extra CA a call trusts (a Vault
//! server's own), and whether only HTTP/1.1 is offered (a WebSocket handshake needs a
//! connection that can upgrade, which an h2 one cannot). Every one dials through the same
//! [`Dialer`] and its address guard; each distinct key gets its own pool, so a connection
//! opened under one set of ranges or roots is never reused under another. A client identity
//! (mTLS, a `client_cert` credential) is part of the key too: a connection that presented one
//! certificate is never reused for another, nor for a request without one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::{
    client, tls_config_bundles, Cidr, Client, ClientIdentity, Connector, Dialer, IdentityError,
    UpstreamError,
};

/// What sets one pooled client apart from another.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Way {
    /// Non-public ranges opened on top of `--allow-private`.
    pub extra: Vec<Cidr>,
    /// Offer only HTTP/1.1.
    pub http1: bool,
    /// A PEM bundle trusted on top of the roots every client trusts.
    pub ca: Option<PathBuf>,
    /// The client certificate its connections present (compared by credential name and a
    /// digest of the certificate and key).
    pub identity: Option<ClientIdentity>,
}

/// The clients made so far, by [`Way`].
pub struct Clients {
    dialer: Arc<Dialer>,
    tls: Arc<rustls::ClientConfig>,
    /// `--upstream-ca`, which every client's roots include.
    base_ca: Option<PathBuf>,
    default: Client,
    made: Mutex<HashMap<Way, Client>>,
    /// The last identity made for each credential: parsed again only when its bytes change.
    identities: Mutex<HashMap<String, ClientIdentity>>,
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
            identities: Mutex::new(HashMap::new()),
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
        if way.extra.is_empty() && !way.http1 && way.ca.is_none() && way.identity.is_none() {
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
        // What `with_client_auth_cert` sets, on a configuration whose roots are already built.
        if let Some(identity) = &way.identity {
            tls.client_auth_cert_resolver = identity.resolver();
        }
        let made = client(Connector::new(
            self.dialer.clone(),
            Arc::new(tls),
            way.extra.clone(),
        ));
        let mut made_so_far = self.lock();
        // A rotated certificate replaces its credential's pools: the old identity is never
        // asked for again (requests still holding its client finish with it).
        if let Some(identity) = &way.identity {
            made_so_far.retain(|w, _| {
                w.identity
                    .as_ref()
                    .is_none_or(|i| i.name() != identity.name() || i == identity)
            });
        }
        Ok(made_so_far.entry(way.clone()).or_insert(made).clone())
    }

    /// The client identity of credential `name` from its PEM certificate and key as read now:
    /// the one made before when the bytes are the same, else parsed and checked anew.
    pub fn identity(
        &self,
        name: &str,
        cert: &[u8],
        key: &[u8],
    ) -> Result<ClientIdentity, IdentityError> {
        let known = |m: &HashMap<String, ClientIdentity>| {
            m.get(name).filter(|i| i.made_from(cert, key)).cloned()
        };
        if let Some(i) = known(&lock(&self.identities)) {
            return Ok(i);
        }
        let made = ClientIdentity::from_pem(name, cert, key)?;
        lock(&self.identities).insert(name.to_string(), made.clone());
        Ok(made)
    }

    /// How many pooled clients have been made (not counting the default one).
    pub fn made(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Way, Client>> {
        lock(&self.made)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain maps: a panic elsewhere while one was locked leaves it usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::UpstreamConfig;

    fn identity(name: &str) -> ClientIdentity {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["client.test".to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("self-sign");
        ClientIdentity::from_pem(name, cert.pem().as_bytes(), key.serialize_pem().as_bytes())
            .expect("identity")
    }

    #[test]
    fn each_identity_has_its_own_pool_and_a_rotated_one_replaces_the_old() {
        let clients = Clients::new(
            Arc::new(Dialer::new(&UpstreamConfig::default())),
            Arc::new(crate::tls_config(None).expect("tls")),
            None,
        );
        let with = |identity: Option<ClientIdentity>| Way {
            identity,
            ..Way::default()
        };
        let (a, b) = (identity("a"), identity("b"));
        clients.get(&with(Some(a.clone()))).expect("a");
        clients.get(&with(Some(a.clone()))).expect("a again");
        clients.get(&with(Some(b))).expect("b");
        // A rule without an identity keeps the default client: no pool is shared with one.
        clients.get(&with(None)).expect("none");
        assert_eq!(clients.made(), 2);
        // Credential "a" rotated: its new identity gets a new pool, the old one goes.
        let rotated = identity("a");
        assert_ne!(a, rotated);
        clients.get(&with(Some(rotated))).expect("rotated");
        assert_eq!(clients.made(), 2);
    }
}

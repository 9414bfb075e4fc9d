//! Shipping: closed audit segments uploaded to S3-compatible object storage
//! (`--audit-ship s3://BUCKET/PREFIX`), so the record outlives the machine.
//!
//! The spool is the segments on disk: a closed segment without its `SEGMENT.shipped` marker
//! (see [`crate::audit::segments`]) is pending, whether it closed a second ago or before a
//! restart. [`Shipper::run`] ships them oldest first, one PUT each (path-style,
//! `ENDPOINT/BUCKET/PREFIX/<file name>`, SigV4 over the body's SHA-256 with the keys read once
//! from the environment — [`upload`]), through latchkey's guarded upstream client, so the
//! address guard, `--resolve` and `--upstream-ca` apply as to every other dial. A 2xx answer
//! writes the marker (atomically); anything else is retried after a backoff (1 s doubling to
//! 60 s, forever) with the same oldest segment, so segments reach the store in chain order.
//! Retention (`--audit-keep`) never removes a segment without its marker while shipping is on.
//!
//! The audit writer never waits on shipping: the [`ShipTap`] it calls on rotation only wakes
//! the shipper (a `Notify`, no queue to fill). How far shipping lags is in [`Shipper::status`]
//! (`/status` → `audit_ship`) and in the `latchkey_audit_ship_*` metrics.
//!
//! Depends on `audit` (segment names, markers, the tap), `metrics`, `secrets` (the keys as
//! `SecretValue`s), `signing` (SigV4) and `upstream` (the client); never on `proxy`.

// The crates this one uses, under the module names the code knows them by.
use latchkey_audit as audit;
use latchkey_metrics as metrics;
use latchkey_signing as signing;
use latchkey_upstream as upstream;
use latchkey_wire as wire;
use latchkey_wire::reason;

mod target;
mod upload;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

pub use target::{Config, ConfigError, Endpoint, Flags, Target};
pub use upload::{hash_file, s3_error, UploadError};

use crate::audit::segments;
use crate::metrics::Metrics;
use crate::upstream::Client;

/// The first retry waits this long; each failure doubles it up to [`BACKOFF_MAX`].
pub const BACKOFF_START: Duration = Duration::from_secs(1);
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// With nothing pending and no rotation heard of, the spool is looked at again this often.
const IDLE_RESCAN: Duration = Duration::from_secs(30);

/// The wait before retry number `failures` (1 for the first failure): 1 s, 2 s, 4 s, … 60 s.
pub fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    BACKOFF_START.saturating_mul(1u32 << exp).min(BACKOFF_MAX)
}

/// A segment waiting to be shipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub path: PathBuf,
    pub bytes: u64,
    /// When it was closed (its last write).
    pub closed: SystemTime,
}

/// How far shipping lags, for `/status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Status {
    pub target: String,
    pub endpoint: String,
    pub pending_segments: u64,
    pub pending_bytes: u64,
    /// Seconds since the oldest pending segment closed (0 when none is pending).
    pub oldest_pending_age_s: u64,
    /// Segments this process shipped.
    pub shipped_segments: u64,
    /// The file name of the last segment shipped.
    pub last_shipped: Option<String>,
    /// Why the last attempt failed; `null` once a later one succeeds.
    pub last_error: Option<String>,
}

#[derive(Default)]
struct Progress {
    shipped: u64,
    last_shipped: Option<String>,
    last_error: Option<String>,
}

/// Ships closed segments; shared by the task that runs it, the audit tap and the admin API.
pub struct Shipper {
    config: Config,
    wake: Arc<tokio::sync::Notify>,
    progress: Mutex<Progress>,
    metrics: OnceLock<Arc<Metrics>>,
}

impl std::fmt::Debug for Shipper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys.
        f.debug_struct("Shipper")
            .field("target", &self.config.target.to_string())
            .field("endpoint", &self.config.endpoint.origin())
            .finish_non_exhaustive()
    }
}

/// The audit writer's side: hears of each rotation and wakes the shipper, nothing more.
pub struct ShipTap {
    wake: Arc<tokio::sync::Notify>,
}

impl crate::audit::Tap for ShipTap {
    fn segment_closed(&mut self, _segment: &Path) {
        // Stores a permit when the shipper is busy: the segment is found by its next scan.
        self.wake.notify_one();
    }
}

impl Shipper {
    pub fn new(config: Config) -> Arc<Shipper> {
        Arc::new(Shipper {
            config,
            wake: Arc::new(tokio::sync::Notify::new()),
            progress: Mutex::new(Progress::default()),
            metrics: OnceLock::new(),
        })
    }

    /// The tap to put in the audit log's `Options.taps`.
    pub fn tap(&self) -> Box<dyn crate::audit::Tap> {
        Box::new(ShipTap {
            wake: self.wake.clone(),
        })
    }

    /// `s3://BUCKET/PREFIX`
    pub fn target(&self) -> String {
        self.config.target.to_string()
    }

    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The closed segments without a marker, oldest first (also published to the metrics).
    pub fn pending(&self) -> std::io::Result<Vec<Pending>> {
        let mut out = Vec::new();
        for path in segments::segments(&self.config.active)? {
            if segments::shipped_marker(&path).exists() {
                continue;
            }
            // Gone since the listing (retention, an operator): not pending any more.
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            out.push(Pending {
                path,
                bytes: meta.len(),
                closed: meta.modified().unwrap_or_else(|_| SystemTime::now()),
            });
        }
        if let Some(m) = self.metrics.get() {
            let g = &m.audit_ship;
            g.set_pending(
                out.len() as u64,
                out.iter().map(|p| p.bytes).sum(),
                out.iter().map(|p| p.closed).min(),
            );
        }
        Ok(out)
    }

    /// How far shipping lags now (the spool is read again).
    pub fn status(&self) -> Status {
        let (pending, scan_error) = match self.pending() {
            Ok(p) => (p, None),
            Err(e) => (Vec::new(), Some(self.spool_error(&e))),
        };
        let now = SystemTime::now();
        let oldest = pending
            .iter()
            .map(|p| now.duration_since(p.closed).unwrap_or_default().as_secs())
            .max()
            .unwrap_or(0);
        let progress = self.progress();
        Status {
            target: self.target(),
            endpoint: self.config.endpoint.origin(),
            pending_segments: pending.len() as u64,
            pending_bytes: pending.iter().map(|p| p.bytes).sum(),
            oldest_pending_age_s: oldest,
            shipped_segments: progress.shipped,
            last_shipped: progress.last_shipped.clone(),
            last_error: scan_error.or_else(|| progress.last_error.clone()),
        }
    }

    fn spool_error(&self, e: &std::io::Error) -> String {
        format!(
            "cannot list the audit segments beside {}: {e}",
            self.config.active.display()
        )
    }

    /// Ships pending segments until `shutdown` turns true: at start (what an earlier run left),
    /// on every rotation, and after a failure once its backoff has passed. `client` is the
    /// guarded upstream client; each upload is signed with `aws`'s keys (latchkey's own AWS
    /// identity, whose calls go through `transport`); `metrics` get the
    /// `latchkey_audit_ship_*` values.
    pub async fn run(
        self: Arc<Self>,
        client: Client,
        aws: Arc<crate::signing::AwsIdentity>,
        transport: Arc<dyn crate::signing::TokenTransport>,
        metrics: Arc<Metrics>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        metrics.audit_ship.enable();
        let _ = self.metrics.set(metrics.clone());
        tracing::info!(audit.ship = %self.target(), endpoint = %self.config.endpoint.origin(), "shipping closed audit segments");
        let mut failures = 0u32;
        loop {
            if *shutdown.borrow() {
                return;
            }
            let next = match self.pending() {
                Ok(p) => p.into_iter().next(),
                Err(e) => {
                    let why = self.spool_error(&e);
                    tracing::warn!(error = %why, "audit shipping cannot read its spool");
                    self.progress().last_error = Some(why);
                    failures += 1;
                    if !self.pause(backoff(failures), &mut shutdown).await {
                        return;
                    }
                    continue;
                }
            };
            let Some(seg) = next else {
                failures = 0;
                tokio::select! {
                    () = self.wake.notified() => {}
                    () = tokio::time::sleep(IDLE_RESCAN) => {}
                    () = crate_shutdown(&mut shutdown) => return,
                }
                continue;
            };
            let name = seg
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let attempt = tokio::select! {
                r = async {
                    let keys = aws.keys(transport.as_ref()).await.map_err(UploadError::Keys)?;
                    upload::ship(&self.config, &client, &keys, &seg.path, &name).await
                } => r,
                () = crate_shutdown(&mut shutdown) => return,
            };
            match attempt {
                Ok(done) => {
                    failures = 0;
                    metrics.audit_ship.uploaded(true);
                    tracing::info!(segment = %name, object = %done.object, bytes = done.bytes, etag = done.etag.as_deref().unwrap_or(""), "audit segment shipped");
                    let mut p = self.progress();
                    p.shipped += 1;
                    p.last_shipped = Some(name);
                    p.last_error = None;
                }
                Err(e) => {
                    failures += 1;
                    metrics.audit_ship.uploaded(false);
                    let wait = backoff(failures);
                    let why = e.to_string();
                    tracing::warn!(segment = %name, attempts = failures, retry_in_s = wait.as_secs(), error = %why, "audit segment not shipped; retrying");
                    self.progress().last_error = Some(why);
                    if !self.pause(wait, &mut shutdown).await {
                        return;
                    }
                }
            }
        }
    }

    /// Waits `wait` before the next attempt; a rotation meanwhile only refreshes the pending
    /// counts (it does not cut the backoff short). `false` when shutdown began.
    async fn pause(
        &self,
        wait: Duration,
        shutdown: &mut tokio::sync::watch::Receiver<bool>,
    ) -> bool {
        let until = tokio::time::Instant::now() + wait;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => return true,
                () = self.wake.notified() => {
                    let _ = self.pending();
                }
                () = crate_shutdown(shutdown) => return false,
            }
        }
    }
}

/// Resolves once shutdown has begun (also when it began before this call) or the sender is gone.
async fn crate_shutdown(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

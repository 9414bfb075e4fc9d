//! The audit log's hash chain as the overview shows it: verified on the box, while the console
//! is looked at. Each overview asks the checker to go on ([`ChainCheck::current`]); it reads
//! only what the log gained since its last pass (`audit::verify::Follow`, off the runtime on a
//! blocking thread) and the page waits at most [`WAIT`] for it, else shows the last pass with
//! its age. Nobody looking, nothing is read. A log on stdout, or without a signing key, is
//! said to be so: it is verified offline, if at all (`latchkey audit verify`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};

use crate::audit::verify::{Follow, Report};
use crate::audit::AuditLog;

/// The longest an overview waits for the checker's pass.
pub const WAIT: Duration = Duration::from_millis(50);

/// One pass of the checker.
#[derive(Debug, Clone)]
pub struct Pass {
    pub at: Instant,
    pub took: Duration,
    pub outcome: Result<Report, String>,
}

/// What the overview can say of the chain.
#[derive(Debug, Clone)]
pub enum Shown {
    /// The log is not a file, or has no signing key: nothing to verify here.
    NotHere(&'static str),
    /// No pass has finished yet (a large log's first pass).
    Pending,
    Checked(Arc<Pass>),
}

pub struct ChainCheck {
    kick: Arc<Notify>,
    passes: watch::Receiver<Option<Arc<Pass>>>,
    not_here: Option<&'static str>,
}

impl ChainCheck {
    /// The checker of `audit`'s chain, its task started (idle until asked).
    pub fn start(audit: &AuditLog) -> Self {
        let (tx, passes) = watch::channel(None);
        let kick = Arc::new(Notify::new());
        let (file, key) = match (audit.file(), audit.public_key()) {
            (Some(f), Some(k)) => (f.to_path_buf(), k),
            (None, _) => {
                return Self {
                    kick,
                    passes,
                    not_here: Some(
                        "the log is written to stdout: verify it where it is kept (latchkey audit verify)",
                    ),
                }
            }
            (Some(_), None) => {
                return Self {
                    kick,
                    passes,
                    not_here: Some("the log has no signing key: its checkpoints are not signed"),
                }
            }
        };
        tokio::spawn(run(file, Follow::new(key), Arc::clone(&kick), tx));
        Self {
            kick,
            passes,
            not_here: None,
        }
    }

    /// Asks for a pass and waits at most [`WAIT`] for one; the latest pass either way.
    pub async fn current(&self) -> Shown {
        if let Some(why) = self.not_here {
            return Shown::NotHere(why);
        }
        let mut rx = self.passes.clone();
        rx.mark_unchanged();
        self.kick.notify_one();
        let _ = tokio::time::timeout(WAIT, rx.changed()).await;
        let latest = rx.borrow().clone();
        match latest {
            Some(p) => Shown::Checked(p),
            None => Shown::Pending,
        }
    }
}

/// The checker: one pass per kick (kicks while a pass runs make one more), each on a blocking
/// thread with the walk's state moved in and back.
async fn run(
    active: PathBuf,
    mut follow: Follow,
    kick: Arc<Notify>,
    tx: watch::Sender<Option<Arc<Pass>>>,
) {
    loop {
        kick.notified().await;
        let file = active.clone();
        let started = Instant::now();
        let joined = tokio::task::spawn_blocking(move || {
            let mut files = crate::audit::segments::segments(&file).unwrap_or_default();
            files.push(file);
            let outcome = follow.advance(&files).map_err(|e| e.to_string());
            (follow, outcome)
        })
        .await;
        let Ok((back, outcome)) = joined else {
            tracing::warn!("console: the audit chain check stopped (its thread panicked)");
            return;
        };
        follow = back;
        let pass = Pass {
            at: Instant::now(),
            took: started.elapsed(),
            outcome,
        };
        if tx.send(Some(Arc::new(pass))).is_err() {
            return;
        }
    }
}

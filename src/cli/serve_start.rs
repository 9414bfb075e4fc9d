//! `latchkey serve` once its [`Server`](super::serve::Server) runs: what lives on the state
//! store (governance, captured tokens, the limiter, the notification outbox), the gateway
//! listeners and the resolver started, and the stop (no new connections, requests in flight
//! given the deadline, limit counters flushed).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::given::flag;
use crate::proxy::transparent::Capture;
use crate::proxy::Proxy;
use crate::secrets::SecretValue;

/// Where approvers reach the admin API: `--approval-url`, else the admin listener's address.
fn public_url(
    approval_url: Option<String>,
    admin: Option<&std::net::TcpListener>,
) -> anyhow::Result<Option<url::Url>> {
    let admin_url = admin
        .and_then(|l| l.local_addr().ok())
        .map(|a| format!("http://{a}"));
    match approval_url.or(admin_url) {
        Some(u) => Ok(Some(url::Url::parse(&u).with_context(|| {
            format!("{} {u:?} is not a URL", flag("approval_url"))
        })?)),
        None => Ok(None),
    }
}

/// Opens the state store and starts what lives on it: governance (approvers reach the admin API
/// at [`public_url`]), the captured tokens (kept
/// ones read into the redaction set, others' followed), the limiter and the notification
/// outbox.
pub(super) async fn start_state(
    proxy: &Arc<Proxy>,
    state: &str,
    approval_url: Option<String>,
    admin: Option<&std::net::TcpListener>,
) -> anyhow::Result<()> {
    let store = crate::state::open(state)
        .await
        .with_context(|| format!("{}: cannot open the state store", flag("state")))?;
    tracing::info!(state = store.describe(), "state store open");
    eprintln!("latchkey: state in {}", store.describe());
    let public_url = public_url(approval_url, admin)?;
    let gov = crate::governance::Governance::open(store.clone(), public_url)
        .await
        .context("--state: cannot read the approvals' shared keys")?;
    // The keys governance keeps (approval links, fingerprints) never leave latchkey: no
    // upstream can reflect them, so they are not in the redaction set (each secret there
    // makes every scrubbed stream hold back tails that could begin it: a bidirectional
    // stream such as gRPC ping-pong would wait on them).
    proxy.set_governance(Arc::new(gov));
    proxy.captured_tokens().attach(store.clone());
    // Every kept token is in the redaction set before the first connection, and a token
    // another replica captures joins it as soon as that replica announces it.
    let redact: Arc<crate::secrets::captured::Redact> = {
        let p = proxy.clone();
        Arc::new(move |identity: &str, name: &str, value: &SecretValue| {
            p.policy().secrets().set_minted(name, identity, value)
        })
    };
    let kept = proxy
        .captured_tokens()
        .preload(&*redact)
        .await
        .context("--state: cannot read the captured tokens")?;
    if kept > 0 {
        tracing::info!(
            tokens = kept,
            "captured tokens read from the state store; each is redacted from the first response"
        );
    }
    tokio::spawn(
        proxy
            .captured_tokens()
            .follow(redact, proxy.shutdown_signal()),
    );
    proxy.set_limiter(crate::governance::limits::Limiter::new(store.clone()));
    // Runtime sessions: admitted on every listener, watched for ends on every replica.
    let sessions = crate::governance::sessions::Sessions::open(store.clone())
        .await
        .context("--state: cannot read the sessions' shared key")?;
    sessions.poll().await;
    tokio::spawn(sessions.clone().watch(proxy.shutdown_signal()));
    proxy.set_sessions(sessions);
    // The notification outbox, delivered through the guarded client.
    let worker = {
        let p = proxy.clone();
        crate::governance::notify::Worker::new(
            store,
            Arc::new(move || {
                let g = p.policy();
                (g.policy().clone(), g.secrets().clone())
            }),
            proxy.upstream_client(),
        )
    };
    tokio::spawn(worker.run(proxy.shutdown_signal()));
    Ok(())
}

/// Starts accepting on each gateway listener; the tasks end when the proxy shuts down.
pub(super) fn start_gateways(
    proxy: &Arc<Proxy>,
    captured: Vec<(std::net::TcpListener, Capture)>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut gateway = Vec::new();
    for (l, capture) in captured {
        let l = tokio::net::TcpListener::from_std(l)?;
        let addr = l.local_addr()?;
        tracing::info!(listen.addr = %addr, listener = capture.flag(), "gateway listener ready");
        eprintln!(
            "latchkey: {} listening on {addr}",
            capture.flag().trim_start_matches("--")
        );
        gateway.push(tokio::spawn(proxy.clone().serve_captured(l, capture)));
    }
    Ok(gateway)
}

/// Starts latchkey's resolver (`--dns`).
pub(super) fn start_dns(proxy: &Arc<Proxy>, dns: crate::dns::DnsListener) -> anyhow::Result<()> {
    let addr = dns.local_addr()?;
    tracing::info!(dns.addr = %addr, "dns resolver ready");
    eprintln!("latchkey: dns listening on {addr}");
    let proxy = proxy.clone();
    tokio::spawn(async move {
        if let Err(e) = crate::dns::serve(proxy, dns).await {
            tracing::error!(error = %e, "dns resolver stopped");
        }
    });
    Ok(())
}

/// Stops accepting (waiting for each `accepting` task to end), gives requests in flight
/// `deadline` to finish, then flushes the embedded limit counters changed since the last flush
/// to the state store.
pub(super) async fn stop(
    proxy: &Arc<Proxy>,
    accepting: Vec<tokio::task::JoinHandle<()>>,
    deadline: Duration,
) {
    tracing::info!(deadline = ?deadline, "shutting down: no new connections, finishing requests in flight");
    proxy.begin_shutdown();
    for task in accepting {
        let _ = task.await;
    }
    let left = proxy.drain(deadline).await;
    if left > 0 {
        tracing::warn!(
            connections = left,
            "shutdown deadline passed; closing remaining connections"
        );
    } else {
        tracing::info!("all connections finished");
    }
    if let Some(limiter) = proxy.limiter() {
        limiter.shutdown().await;
    }
}

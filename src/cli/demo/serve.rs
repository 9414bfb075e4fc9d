//! The demo's proxy: this binary's own `latchkey serve`, started as a child with the flags the
//! demo prints, its log copied to the demo directory.

use super::*;

/// The child `latchkey serve` and where it listens.
pub(super) struct Serve {
    child: tokio::process::Child,
    pub(super) addr: SocketAddr,
}

impl Serve {
    /// Starts this binary's `latchkey serve` on the demo's files and waits for its listening
    /// line. Its stderr (the log) goes to `latchkey.log` in the demo directory.
    pub(super) async fn start(
        ws: &Workspace,
        files: &Files,
        listen: SocketAddr,
    ) -> Result<Serve, DemoError> {
        let exe = std::env::current_exe()
            .map_err(|e| DemoError::Serve(format!("cannot find this binary: {e}")))?;
        let args: Vec<OsString> = vec![
            "serve".into(),
            "--policies".into(),
            ws.path("policies").into(),
            "--listen".into(),
            listen.to_string().into(),
            "--ca-dir".into(),
            ws.path(CA_DIR).into(),
            "--audit".into(),
            ws.path(AUDIT_FILE).into(),
            "--upstream-ca".into(),
            ws.path(ECHO_CA_FILE).into(),
            "--resolve".into(),
            format!("{HOST}=127.0.0.1").into(),
            "--allow-private".into(),
            "127.0.0.1/32".into(),
            "--admin".into(),
            "off".into(),
            "--shutdown-timeout".into(),
            "2s".into(),
        ];
        introduce(ws, files, &exe, &args);

        let log_path = ws.path(LOG_FILE);
        let log = std::fs::File::create(&log_path).map_err(|source| DemoError::Write {
            path: log_path.clone(),
            source,
        })?;
        let mut cmd = command(&exe, &args);
        let mut child = cmd
            .spawn()
            .map_err(|e| DemoError::Serve(format!("cannot start {}: {e}", exe.display())))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| DemoError::Serve("has no stderr pipe".to_string()))?;
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let copier = tokio::spawn(copy_log(stderr, log, ready_tx));

        let outcome = tokio::select! {
            addr = ready_rx => addr.ok(),
            _ = child.wait() => None,
            () = tokio::time::sleep(START_DEADLINE) => None,
        };
        match outcome.and_then(|a| a.parse::<SocketAddr>().ok()) {
            Some(addr) => Ok(Serve { child, addr }),
            None => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                // Its last words may still be in the pipe: let the copier reach the end.
                let _ = tokio::time::timeout(Duration::from_secs(2), copier).await;
                let tail = log_tail(&log_path);
                let hint = if tail.contains("cannot listen") {
                    "\n(is another `latchkey demo` running? `--listen 127.0.0.1:0` picks a free port)"
                } else {
                    ""
                };
                Err(DemoError::Serve(format!(
                    "did not start; the end of {}:\n{tail}{hint}",
                    log_path.display()
                )))
            }
        }
    }

    /// SIGTERM (latchkey writes every queued audit record and exits), then waits; kills it
    /// past the deadline. Returns whether it stopped on its own with success.
    pub(super) async fn stop(&mut self) -> bool {
        let pid = self
            .child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        match tokio::time::timeout(STOP_DEADLINE, self.child.wait()).await {
            Ok(Ok(status)) => status.success(),
            _ => {
                let _ = self.child.kill().await;
                false
            }
        }
    }

    /// Stays up until Ctrl-C or SIGTERM (then stops latchkey), or until latchkey exits.
    pub(super) async fn wait_for_stop(&mut self) -> bool {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = term => {}
            status = self.child.wait() => {
                say(&format!("\nlatchkey exited unexpectedly ({}); see {LOG_FILE} in the demo directory\n",
                    status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string())));
                return false;
            }
        }
        say("\nstopping latchkey\n");
        self.stop().await
    }
}

/// Says what the demo is about to do: its files, the policy, and the command it starts.
fn introduce(ws: &Workspace, files: &Files, exe: &Path, args: &[OsString]) {
    let mut shown = String::new();
    for a in std::iter::once(exe.as_os_str()).chain(args.iter().map(OsString::as_os_str)) {
        let _ = write!(shown, "{} ", sh_quote(Path::new(a)));
    }
    say(&format!(
        "latchkey demo: allow, inject, redact and deny, on this machine only (loopback, offline).\n\n\
         demo directory  {root}{kept}\n\
         policy          {policy}\n\
         demo secret     {secret} (random for this run, mode 0600; never printed)\n\
         echo upstream   https://{HOST}:{port} on 127.0.0.1, certificate from its own test CA ({echo_ca})\n\
         latchkey CA     {ca} (what a sandbox trusts)\n\
         audit log       {audit}\n\
         latchkey log    {log}\n\n\
         The policy:\n\n{policy_text}\n\
         The proxy is latchkey itself, started as:\n  {shown}\n\n",
        root = ws.root.display(),
        kept = if ws.remove {
            " (removed on exit; --dir DIR keeps the files)"
        } else {
            ""
        },
        policy = ws.path(POLICY_FILE).display(),
        secret = ws.path(SECRET_FILE).display(),
        port = files.port,
        echo_ca = ws.path(ECHO_CA_FILE).display(),
        ca = ws.path(CA_DIR).join(crate::proxy::ca::CA_CERT_FILE).display(),
        audit = ws.path(AUDIT_FILE).display(),
        log = ws.path(LOG_FILE).display(),
        policy_text = indent(&files.policy, "    "),
        shown = shown.trim_end(),
    ));
}

/// The child's command: `args`, no stdin or stdout, stderr piped, none of the caller's
/// `LATCHKEY_*` variables, and (Linux) SIGTERM when the demo dies.
fn command(exe: &Path, args: &[OsString]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // Only the flags above decide what this latchkey does, not the caller's LATCHKEY_*.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("LATCHKEY_") {
            cmd.env_remove(name);
        }
    }
    // The crate's one unsafe block (`unsafe_code` is denied everywhere else).
    // SAFETY: the closure runs in the forked child before exec and makes one prctl system
    // call, which allocates nothing and takes no lock (async-signal-safe).
    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    unsafe {
        // If the demo dies without stopping latchkey (kill -9), latchkey gets SIGTERM and
        // shuts down instead of holding the demo's port.
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
                .map_err(std::io::Error::from)
        });
    }
    cmd
}

/// Copies latchkey's stderr to the log file, sending its listening address once seen.
pub(super) async fn copy_log(
    mut stderr: tokio::process::ChildStderr,
    mut log: std::fs::File,
    ready: tokio::sync::oneshot::Sender<String>,
) {
    let mut ready = Some(ready);
    let mut line: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        let n = match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let _ = log.write_all(&buf[..n]);
        if ready.is_none() {
            continue;
        }
        for &b in &buf[..n] {
            if b != b'\n' {
                if line.len() < MAX_LINE {
                    line.push(b);
                }
                continue;
            }
            if let Some(addr) = line.strip_prefix(LISTENING) {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(String::from_utf8_lossy(addr).trim().to_string());
                }
            }
            line.clear();
        }
    }
}

/// The last lines of latchkey's log, for a start-up failure.
pub(super) fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

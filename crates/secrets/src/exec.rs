//! `exec:` secret helpers: run with `sh -c` in their own process group, output capped and
//! read into buffers that never reallocate, killed as a group on timeout or when the request
//! waiting for them goes away; stderr logged with the value scrubbed.

use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::store::{check_value, trim_newline, Slot, Source};
use super::{SecretError, SecretValue};

/// The most bytes an exec helper may print on stdout (and the most of its stderr logged).
const HELPER_OUTPUT_LIMIT: usize = 64 * 1024;

/// Kills a helper's process group when dropped, unless disarmed: on timeout, on an output
/// overrun, and when the request waiting for the helper goes away. Declared after the child,
/// so it runs before the child is dropped and reaped: until then the group id is the id of a
/// process that still exists and cannot have been reused.
struct HelperGroup(Option<u32>);

impl HelperGroup {
    /// The helper exited and was reaped: its id may be reused from now on.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for HelperGroup {
    fn drop(&mut self) {
        let Some(pid) = self.0.take() else {
            return;
        };
        // Never 0 or 1 (`kill(-1)` signals every process).
        let pgid = i32::try_from(pid)
            .ok()
            .filter(|&p| p > 1)
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pgid) = pgid {
            // ESRCH: the group is already gone, which is what we want.
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
    }
}

/// Reads `from` to its end, keeping the first `limit` bytes in `into` (which has room for
/// them, so it never reallocates and leaves no unwiped copy). Returns whether more came.
async fn read_capped(
    mut from: impl tokio::io::AsyncRead + Unpin,
    into: &mut Vec<u8>,
    limit: usize,
    stop_when_over: bool,
) -> std::io::Result<bool> {
    let mut buf = zeroize::Zeroizing::new([0u8; 4096]);
    let mut over = false;
    loop {
        let n = from.read(&mut buf[..]).await?;
        if n == 0 {
            return Ok(over);
        }
        let room = limit.saturating_sub(into.len());
        into.extend_from_slice(&buf[..n.min(room)]);
        if n > room {
            over = true;
            if stop_when_over {
                return Ok(true);
            }
        }
    }
}

/// Runs an exec helper with a timeout; its stderr goes to the log with the value scrubbed.
pub(super) async fn run_helper(slot: &Slot, timeout: Duration) -> Result<SecretValue, SecretError> {
    let Source::Exec { command, .. } = &slot.source else {
        return Err(slot.unavailable("not an exec source"));
    };
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        // Its own process group, so everything it starts can be killed with it.
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| slot.unavailable(&format!("cannot start helper: {e}")))?;
    let mut group = HelperGroup(child.id());
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(slot.unavailable("helper has no output pipes"));
    };
    // Sized up front (the limit plus one byte to tell an overrun): never reallocated.
    let mut stdout = zeroize::Zeroizing::new(Vec::with_capacity(HELPER_OUTPUT_LIMIT + 1));
    let mut stderr = zeroize::Zeroizing::new(Vec::with_capacity(HELPER_OUTPUT_LIMIT));
    let run = async {
        let read_out = async {
            match read_capped(out, &mut stdout, HELPER_OUTPUT_LIMIT, true).await {
                Ok(false) => Ok(()),
                // Stop waiting: `group` kills the helper as it drops.
                Ok(true) => Err(format!(
                    "helper printed more than {HELPER_OUTPUT_LIMIT} bytes"
                )),
                Err(e) => Err(format!("cannot read helper output: {e}")),
            }
        };
        let read_err = async {
            read_capped(err, &mut stderr, HELPER_OUTPUT_LIMIT, false)
                .await
                .map_err(|e| format!("cannot read helper stderr: {e}"))
        };
        tokio::try_join!(read_out, read_err)?;
        child
            .wait()
            .await
            .map_err(|e| format!("helper failed: {e}"))
    };
    let status = match tokio::time::timeout(timeout, run).await {
        Ok(Ok(status)) => {
            group.disarm();
            status
        }
        // `group` kills the helper and everything it started as it drops.
        Ok(Err(why)) => return Err(slot.unavailable(&why)),
        Err(_) => {
            return Err(slot.unavailable(&format!(
                "helper did not finish within {}s",
                timeout.as_secs_f32()
            )))
        }
    };
    // An exact-size copy; the buffer it came from is wiped as it drops.
    let value = zeroize::Zeroizing::new(trim_newline(stdout.to_vec()));
    drop(stdout);
    if !stderr.is_empty() {
        let raw = zeroize::Zeroizing::new(String::from_utf8_lossy(&stderr).into_owned());
        let text = match std::str::from_utf8(&value) {
            Ok(v) if !v.is_empty() => raw.replace(v, &format!("[REDACTED:{}]", slot.name)),
            _ => raw.to_string(),
        };
        tracing::warn!(secret = %slot.name, stderr = %text.trim_end(), "secret helper wrote to stderr");
    }
    if !status.success() {
        return Err(slot.unavailable(&format!("helper exited with {status}")));
    }
    let mut value = value;
    check_value(std::mem::take(&mut *value))
        .map_err(|e| slot.unavailable(&format!("helper output: {e}")))
}

//! A long-lived client session: Python `requests.Session` (`tests/clients/py_session.py`) kept
//! open across requests, so a test can change latchkey (reload its policy, signal it) between
//! two requests on the same keep-alive connection.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::Value;

use super::clients::RawResponse;
use super::latchkey::{Latchkey, SCRUBBED_ENV};
use super::toolchain;

pub struct PySession {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl PySession {
    /// A session through `lk` trusting latchkey's CA; `proxy` overrides the proxy URL (e.g. one
    /// with `NAME:TOKEN@` credentials).
    pub fn start(lk: &Latchkey, proxy: Option<&str>) -> Self {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/py_session.py");
        let mut cmd = Command::new(toolchain::python());
        cmd.arg(script)
            .arg(proxy.map_or_else(|| lk.proxy_url(), str::to_string))
            .arg(lk.ca_pem_path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        let mut child = cmd.spawn().expect("spawn py_session.py");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("session stdout"));
        PySession {
            child,
            stdin,
            stdout,
        }
    }

    /// Sends `METHOD URL` on the session and waits for its response (status 0 and the error in
    /// the body when the client itself failed).
    pub fn request(&mut self, method: &str, url: &str) -> RawResponse {
        let stdin = self.stdin.as_mut().expect("session still open");
        writeln!(stdin, "{method} {url}").expect("send to py_session.py");
        stdin.flush().expect("flush to py_session.py");
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .expect("read py_session.py");
        assert!(
            n > 0,
            "py_session.py exited before answering {method} {url}"
        );
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("py_session.py printed no JSON ({e}): {line:?}"));
        RawResponse {
            status: v["status"].as_u64().expect("status") as u16,
            headers: v["headers"]
                .as_array()
                .expect("headers")
                .iter()
                .map(|p| {
                    (
                        p[0].as_str().expect("name").to_string(),
                        p[1].as_str().expect("value").to_string(),
                    )
                })
                .collect(),
            body: v["body"].as_str().expect("body").as_bytes().to_vec(),
        }
    }
}

impl Drop for PySession {
    fn drop(&mut self) {
        // End of input ends the script.
        self.stdin.take();
        if self.child.try_wait().ok().flatten().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(50));
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

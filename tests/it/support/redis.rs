//! A real `redis-server` for the tests: started on a free loopback port in a temp dir, with no
//! persistence (`--save "" --appendonly no`), ready once it answers `PING`, killed on drop.
//!
//! The binary comes through [`toolchain::tool`] (Debian package `redis-server`): a machine
//! without it fails the test naming the package, never skips it.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::toolchain;

/// How long a started server may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// A running `redis-server` on `127.0.0.1`; killed (and its directory removed) on drop.
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers `PING`. Panics naming
    /// what failed (a missing binary, a server that exited, one that never answered).
    pub fn start() -> RedisServer {
        let mut last = String::new();
        // A port found free can be taken before the server binds it: try a few.
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("latchkey-redis-")
                .tempdir()
                .expect("a temp dir for redis-server");
            match spawn(dir.path(), free_port()) {
                Ok((child, port)) => return RedisServer { child, port, dir },
                Err(why) => last = why,
            }
        }
        panic!("redis-server did not start: {last}")
    }

    /// Kills the server and starts a new one on the same port (empty: nothing is persisted), as
    /// a Redis restart looks to its clients.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let started = Instant::now();
        loop {
            match spawn(self.dir.path(), self.port) {
                Ok((child, _)) => {
                    self.child = child;
                    return;
                }
                // The old socket may linger for a moment.
                Err(_) if started.elapsed() < READY_TIMEOUT => {
                    thread::sleep(Duration::from_millis(100))
                }
                Err(why) => panic!("redis-server did not restart on port {}: {why}", self.port),
            }
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Sends one command (RESP) and returns the first line of the reply, e.g. `+OK` or `:1`.
    pub fn command(&self, args: &[&str]) -> String {
        command(self.port, args).unwrap_or_else(|e| panic!("redis command {args:?}: {e}"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `redis-server` on `port` in `dir`; ready once it answers `PING`.
fn spawn(dir: &Path, port: u16) -> Result<(Child, u16), String> {
    let program = toolchain::tool("redis-server");
    let log = dir.join("redis.log");
    let mut child = Command::new(program)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(["--protected-mode", "no", "--daemonize", "no"])
        .arg("--logfile")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawning {program}: {e}"))?;
    match wait_ready(&mut child, port) {
        Ok(()) => Ok((child, port)),
        Err(why) => {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(&log).unwrap_or_else(|e| format!("(no log: {e})"));
            Err(format!("{why}; its log:\n{log}"))
        }
    }
}

fn free_port() -> u16 {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binding 127.0.0.1:0 for a free port");
    listener.local_addr().expect("the bound address").port()
}

fn wait_ready(child: &mut Child, port: u16) -> Result<(), String> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("redis-server exited with {status}"));
        }
        match command(port, &["PING"]) {
            Ok(reply) if reply == "+PONG" => return Ok(()),
            Ok(reply) => return Err(format!("PING answered {reply:?}")),
            Err(_) if started.elapsed() < READY_TIMEOUT => thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("no answer to PING on port {port}: {e}")),
        }
    }
}

/// A test helper talking to its own loopback server, not latchkey egress.
#[allow(clippy::disallowed_methods)]
fn command(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n") {
        if stream.read(&mut byte)? == 0 {
            break;
        }
        reply.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&reply).trim_end().to_string())
}

//! Real clients: curl and Python `requests` as child processes, and raw sockets (plain or
//! rustls) for requests no well-behaved client would send.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde_json::Value;

use super::latchkey::{wait_with_timeout, Latchkey, SCRUBBED_ENV};
use super::toolchain;

/// A response as a client saw it.
#[derive(Clone)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// The body as (lossy) text, so failure messages are readable.
impl std::fmt::Debug for RawResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawResponse")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body", &self.text())
            .finish()
    }
}

impl RawResponse {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Asserts a latchkey denial: status, the `x-latchkey-*` headers, a plain-text body.
/// `rule: None` only requires the `x-latchkey-rule` header to be present.
pub fn assert_denial(resp: &RawResponse, status: u16, rule: Option<&str>, reason: &str) {
    assert_eq!(resp.status, status, "status of denial: {resp:#?}");
    assert_eq!(
        resp.header("x-latchkey-decision"),
        Some("deny"),
        "x-latchkey-decision: {resp:#?}"
    );
    assert_eq!(
        resp.header("x-latchkey-reason"),
        Some(reason),
        "x-latchkey-reason: {resp:#?}"
    );
    match rule {
        Some(rule) => assert_eq!(
            resp.header("x-latchkey-rule"),
            Some(rule),
            "x-latchkey-rule: {resp:#?}"
        ),
        None => assert!(
            resp.header("x-latchkey-rule").is_some(),
            "x-latchkey-rule missing: {resp:#?}"
        ),
    }
    let content_type = resp.header("content-type").unwrap_or_default();
    assert!(
        content_type.starts_with("text/plain"),
        "content-type of denial: {resp:#?}"
    );
    assert!(
        resp.text().starts_with("latchkey: "),
        "denial body is not latchkey's sentence: {resp:#?}"
    );
}

// ---------------------------------------------------------------------------------------------
// curl

pub fn curl(lk: &Latchkey) -> Curl<'_> {
    Curl {
        lk,
        cacert: lk.ca_pem_path(),
        args: Vec::new(),
    }
}

/// `curl -sS -q -x PROXY --cacert CA --capath EMPTY ARGS...`: trusts only `cacert` (latchkey's CA
/// unless told otherwise), never the system store.
pub struct Curl<'a> {
    lk: &'a Latchkey,
    cacert: PathBuf,
    args: Vec<String>,
}

#[derive(Debug)]
pub struct CurlOutput {
    /// curl's exit code (0 on success).
    pub exit: Option<i32>,
    /// The final response (the last header block curl saw) and its body.
    pub response: RawResponse,
    /// `%{http_version}`: "1.1", "2", ...
    pub http_version: String,
    pub stderr: String,
}

impl CurlOutput {
    /// The response, after asserting curl itself succeeded.
    pub fn ok(&self) -> &RawResponse {
        assert_eq!(
            self.exit,
            Some(0),
            "curl failed: {}\n{self:#?}",
            self.stderr
        );
        &self.response
    }
}

impl Curl<'_> {
    pub fn cacert(mut self, path: &Path) -> Self {
        self.cacert = path.to_path_buf();
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn run(self) -> CurlOutput {
        let scratch = tempfile::Builder::new()
            .prefix("curl")
            .tempdir_in(self.lk.scratch())
            .expect("curl scratch dir");
        let empty_capath = scratch.path().join("capath");
        std::fs::create_dir(&empty_capath).expect("empty capath");
        let headers_file = scratch.path().join("headers");
        let body_file = scratch.path().join("body");
        let mut cmd = Command::new(toolchain::tool("curl"));
        cmd.arg("-q")
            .arg("-sS")
            .arg("--max-time")
            .arg("20")
            .arg("-x")
            .arg(self.lk.proxy_url())
            .arg("--cacert")
            .arg(&self.cacert)
            .arg("--capath")
            .arg(&empty_capath)
            .arg("-D")
            .arg(&headers_file)
            .arg("-o")
            .arg(&body_file)
            .arg("-w")
            .arg("%{http_version}")
            .args(&self.args);
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        let out = wait_with_timeout(&mut cmd, Duration::from_secs(30));
        let head = std::fs::read(&headers_file).unwrap_or_default();
        let body = std::fs::read(&body_file).unwrap_or_default();
        let (status, headers) = last_header_block(&String::from_utf8_lossy(&head));
        CurlOutput {
            exit: out.code(),
            response: RawResponse {
                status,
                headers,
                body,
            },
            http_version: out.stdout.trim().to_string(),
            stderr: out.stderr,
        }
    }
}

/// The status and headers of the last header block in a `curl -D` dump (which also holds the
/// proxy's CONNECT response).
fn last_header_block(dump: &str) -> (u16, Vec<(String, String)>) {
    let normalised = dump.replace("\r\n", "\n");
    let Some(block) = normalised
        .split("\n\n")
        .filter(|b| b.starts_with("HTTP/"))
        .last()
    else {
        return (0, Vec::new());
    };
    let mut lines = block.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    (status, headers)
}

// ---------------------------------------------------------------------------------------------
// Python requests

/// Runs `tests/clients/py_request.py PROXY CA METHOD URL [HEADER...]` and returns the response.
pub fn python_request(lk: &Latchkey, method: &str, url: &str, headers: &[&str]) -> RawResponse {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/py_request.py");
    let mut cmd = Command::new(toolchain::python());
    cmd.arg(script)
        .arg(lk.proxy_url())
        .arg(lk.ca_pem_path())
        .arg(method)
        .arg(url)
        .args(headers);
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(30));
    assert_eq!(out.code(), Some(0), "py_request.py failed: {out:#?}");
    let v: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("py_request.py printed no JSON ({e}): {out:#?}"));
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

// ---------------------------------------------------------------------------------------------
// Raw sockets

/// A TCP connection to the proxy with a read timeout.
// The test plays the sandbox: it dials the proxy, never an upstream.
#[allow(clippy::disallowed_methods)]
pub fn dial(proxy: SocketAddr) -> TcpStream {
    let tcp = TcpStream::connect(proxy).expect("connect to latchkey");
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    tcp
}

/// Sends `request` as is on a fresh connection and reads one response.
pub fn raw_request(proxy: SocketAddr, request: &[u8]) -> RawResponse {
    let mut tcp = dial(proxy);
    // The proxy may answer (and close) before reading everything: ignore write errors.
    let _ = tcp.write_all(request);
    read_response(&mut tcp, false).expect("read response from latchkey")
}

/// Sends `CONNECT authority` and reads the proxy's answer without reading past its head (the
/// tunnel's bytes stay in the socket). Returns the socket for what comes next.
pub fn connect_tunnel(proxy: SocketAddr, authority: &str) -> (TcpStream, RawResponse) {
    let mut tcp = dial(proxy);
    // A proxy over its connection caps answers `503` and closes as soon as it accepts, before
    // reading anything: the write may then fail (a broken pipe) while the answer is there to
    // read. Ignore write errors, as `raw_request` does; the read says what happened.
    let _ = write!(
        tcp,
        "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
    );
    let resp = read_response(&mut tcp, true).expect("read CONNECT response");
    (tcp, resp)
}

/// Reads one HTTP/1.x response: the head byte by byte (never past it), then the body by
/// content-length, chunked encoding, or to EOF. `connect`: a 2xx answer to CONNECT has no body.
pub fn read_response<R: Read>(r: &mut R, connect: bool) -> std::io::Result<RawResponse> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if r.read(&mut byte)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "connection closed inside the response head: {:?}",
                    String::from_utf8_lossy(&head)
                ),
            ));
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("bad status line {status_line:?}"),
            )
        })?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut resp = RawResponse {
        status,
        headers,
        body: Vec::new(),
    };
    if (connect && (200..300).contains(&status)) || status < 200 || status == 204 || status == 304 {
        return Ok(resp);
    }
    if let Some(len) = resp.header("content-length") {
        let len: usize = len.parse().map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "bad content-length")
        })?;
        resp.body = vec![0; len];
        r.read_exact(&mut resp.body)?;
    } else if resp
        .header("transfer-encoding")
        .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
    {
        resp.body = read_chunked(r)?;
    } else {
        let _ = r.read_to_end(&mut resp.body);
    }
    Ok(resp)
}

fn read_line<R: Read>(r: &mut R) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        if r.read(&mut byte)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        line.push(byte[0]);
    }
    line.truncate(line.len() - 2);
    Ok(String::from_utf8_lossy(&line).into_owned())
}

fn read_chunked<R: Read>(r: &mut R) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let size_line = read_line(r)?;
        let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "bad chunk size"))?;
        if size == 0 {
            // Trailers, then the final CRLF.
            while !read_line(r)?.is_empty() {}
            return Ok(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])?;
        read_line(r)?;
    }
}

/// A rustls client config trusting only the certificates in `ca_pem`, offering `alpn`.
pub fn tls_config(ca_pem: &Path, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_pem).expect("read CA PEM") {
        roots
            .add(cert.expect("CA certificate in PEM"))
            .expect("add CA to root store");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

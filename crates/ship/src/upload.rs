//! One segment, one PUT: the file hashed (SHA-256, read in 64 KiB pieces), the request signed
//! with SigV4 over that hash, the body streamed from the file, and on a 2xx answer the
//! `.shipped` marker written atomically (temp file, fsync, rename). Memory per upload is one
//! read buffer, whatever the segment's size.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, ReadBuf};

use super::target::Config;
use crate::audit::segments;
use crate::signing::{sigv4_sign, AwsKeys, SigV4Keys, SigV4Scope, SignPayload};
use crate::upstream::{find_upstream_error, BoxError, Client};

/// Bytes read from a segment at a time (hashing and sending alike).
const CHUNK: usize = 64 * 1024;
/// At most this much of the store's answer is read (an S3 error document is far smaller).
const MAX_ANSWER: usize = 16 * 1024;
/// The longest S3 error message quoted in `last_error`.
const MAX_MESSAGE: usize = 300;

/// Why one upload failed. Messages name the segment, the store and what it answered, never a
/// key or a signature.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot sign the upload: {0}")]
    Sign(String),
    #[error("no AWS keys to sign the upload with: {0}")]
    Keys(String),
    #[error("cannot reach the store at {origin}: {why}")]
    Unreachable { origin: String, why: String },
    #[error("the store at {origin} did not answer within {}s", timeout.as_secs())]
    Timeout { origin: String, timeout: Duration },
    #[error("the store answered {status}{}", detail(code, message))]
    Refused {
        status: u16,
        code: Option<String>,
        message: Option<String>,
    },
    #[error("uploaded, but cannot write the marker {path}: {source}")]
    Marker {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn detail(code: &Option<String>, message: &Option<String>) -> String {
    match (code, message) {
        (Some(c), Some(m)) => format!(" {c}: {m}"),
        (Some(c), None) => format!(" {c}"),
        (None, Some(m)) => format!(": {m}"),
        (None, None) => String::new(),
    }
}

/// A segment as read for its upload.
pub struct Hashed {
    pub len: u64,
    /// Lower-case hex SHA-256 of the whole file.
    pub sha256: String,
}

/// Reads `path` once, in [`CHUNK`]s, for its length and SHA-256 (blocking: call off the
/// async workers).
pub fn hash_file(path: &Path) -> Result<Hashed, UploadError> {
    let read_err = |source| UploadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(read_err)?;
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    let mut buf = vec![0u8; CHUNK];
    let mut len = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_err(e)),
        };
        ctx.update(&buf[..n]);
        len += n as u64;
    }
    Ok(Hashed {
        len,
        sha256: hex::encode(ctx.finish()),
    })
}

/// A request body read from a file as hyper asks for it: exactly `remaining` bytes, one
/// [`CHUNK`] buffer, an error if the file ends early.
pub struct FileBody {
    file: tokio::fs::File,
    remaining: u64,
    buf: Vec<u8>,
}

impl FileBody {
    pub fn new(file: tokio::fs::File, len: u64) -> FileBody {
        FileBody {
            file,
            remaining: len,
            buf: vec![0u8; CHUNK],
        }
    }
}

impl Body for FileBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.remaining == 0 {
            return Poll::Ready(None);
        }
        let want = usize::try_from(this.remaining).map_or(CHUNK, |r| r.min(CHUNK));
        let mut rb = ReadBuf::new(&mut this.buf[..want]);
        match Pin::new(&mut this.file).poll_read(cx, &mut rb) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(Ok(())) => {
                let filled = rb.filled();
                if filled.is_empty() {
                    return Poll::Ready(Some(Err(
                        "the segment ended before its hashed length".into()
                    )));
                }
                this.remaining -= filled.len() as u64;
                Poll::Ready(Some(Ok(Frame::data(Bytes::copy_from_slice(filled)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

/// What a successful upload left behind.
pub struct Shipped {
    pub object: String,
    pub bytes: u64,
    pub etag: Option<String>,
}

/// Uploads `segment` (named `name`) with one signed PUT, then writes its marker.
pub async fn ship(
    config: &Config,
    client: &Client,
    creds: &AwsKeys,
    segment: &Path,
    name: &str,
) -> Result<Shipped, UploadError> {
    let path = segment.to_path_buf();
    let hashed = tokio::task::spawn_blocking(move || hash_file(&path))
        .await
        .map_err(|e| UploadError::Read {
            path: segment.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        })??;
    let file = tokio::fs::File::open(segment)
        .await
        .map_err(|source| UploadError::Read {
            path: segment.to_path_buf(),
            source,
        })?;
    let ep = &config.endpoint;
    let path_and_query = format!("/{}/{}", config.target.bucket, config.target.key(name));
    let mut headers = HeaderMap::new();
    let value = |s: String| HeaderValue::from_str(&s).map_err(|e| UploadError::Sign(e.to_string()));
    // Set before signing, so the signed host is exactly the one hyper sends.
    headers.insert(HOST, value(ep.authority())?);
    headers.insert(CONTENT_LENGTH, value(hashed.len.to_string())?);
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    let keys = SigV4Keys {
        akid: &creds.access_key_id,
        secret: &creds.secret_access_key,
        token: creds.session_token.as_ref(),
    };
    let t = crate::signing::Target {
        method: "PUT",
        scheme: &ep.scheme,
        host: &ep.host,
        port: ep.port,
        identity: "",
    };
    sigv4_sign(
        &keys,
        SigV4Scope {
            region: &config.region,
            service: "s3",
        },
        &t,
        &mut headers,
        &path_and_query,
        SignPayload::Literal(&hashed.sha256),
        true,
    )
    .map_err(UploadError::Sign)?;
    let uri = format!("{}{path_and_query}", ep.origin());
    let mut req = http::Request::put(uri)
        .body(FileBody::new(file, hashed.len).boxed())
        .map_err(|e| UploadError::Sign(e.to_string()))?;
    *req.headers_mut() = headers;
    let origin = ep.origin();
    let timeout = attempt_timeout(hashed.len);
    let exchange = async {
        let res = client.request(req).await.map_err(|e| {
            let why = match find_upstream_error(&e) {
                Some(u) => u.to_string(),
                None => crate::reason::chain_text(&e),
            };
            UploadError::Unreachable {
                origin: origin.clone(),
                why,
            }
        })?;
        let status = res.status();
        let etag = res
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim_matches('"').to_string());
        let answer = read_answer(res.into_body()).await;
        Ok::<_, UploadError>((status, etag, answer))
    };
    let (status, etag, answer) =
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| UploadError::Timeout {
                origin: origin.clone(),
                timeout,
            })??;
    if !status.is_success() {
        let (code, message) = s3_error(&answer);
        return Err(UploadError::Refused {
            status: status.as_u16(),
            code,
            message,
        });
    }
    let object = config.target.object_url(name);
    write_marker(segment, &object, &origin, &hashed, etag.as_deref())?;
    Ok(Shipped {
        object,
        bytes: hashed.len,
        etag,
    })
}

/// How long one upload may take: a minute, plus a second per MiB (a 100 MiB segment at a
/// slow 1 MiB/s still fits).
fn attempt_timeout(len: u64) -> Duration {
    Duration::from_secs(60 + len / (1 << 20))
}

/// The first [`MAX_ANSWER`] bytes of the store's answer (the rest is dropped).
async fn read_answer(mut body: hyper::body::Incoming) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < MAX_ANSWER {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let room = MAX_ANSWER - out.len();
                    out.extend_from_slice(&data[..data.len().min(room)]);
                }
            }
            _ => break,
        }
    }
    out
}

/// `Code` and `Message` of an S3 error document (`<Error><Code>…</Code><Message>…</Message>`).
/// Nothing else is quoted: real S3 also echoes the string it signed, which is no one's business
/// in a log.
pub fn s3_error(answer: &[u8]) -> (Option<String>, Option<String>) {
    let text = String::from_utf8_lossy(answer);
    let field = |tag: &str| {
        let open = format!("<{tag}>");
        let close = format!("</{tag}>");
        let start = text.find(&open)? + open.len();
        let end = start + text[start..].find(&close)?;
        let clean: String = text[start..end]
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(MAX_MESSAGE)
            .collect();
        let clean = clean.trim().to_string();
        (!clean.is_empty()).then_some(clean)
    };
    (field("Code"), field("Message"))
}

/// Writes `SEGMENT.shipped` atomically: a temp file beside it, synced, renamed into place.
/// It says where the segment went, so an operator can find the object from the box.
pub fn write_marker(
    segment: &Path,
    object: &str,
    endpoint: &str,
    hashed: &Hashed,
    etag: Option<&str>,
) -> Result<(), UploadError> {
    use std::io::Write as _;
    let marker = segments::shipped_marker(segment);
    let mut tmp_name = marker.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let line = serde_json::json!({
        "object": object,
        "endpoint": endpoint,
        "bytes": hashed.len,
        "sha256": hashed.sha256,
        "etag": etag,
        "shipped_at": humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
    });
    let err = |source| UploadError::Marker {
        path: marker.clone(),
        source,
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.create(true).write(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&tmp).map_err(err)?;
    f.write_all(format!("{line}\n").as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    drop(f);
    std::fs::rename(&tmp, &marker).map_err(err)?;
    if let Some(dir) = marker.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

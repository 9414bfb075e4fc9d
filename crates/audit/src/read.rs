//! Reading an audit log back: the lines of a log's files in chain order, filters over them, one
//! row per request, and the per-identity summary (`latchkey audit query` and `latchkey audit
//! summary`, book "Audit": reading it).
//!
//! ```text
//! files (chain order) ─▶ Reader: one line at a time, checkpoints skipped, damage reported
//!   ─▶ Filter (every flag given, AND) ─▶ Requests: the outcome, or a decision left alone
//!   ─▶ rows (printed as stored, or as a table)  or  ─▶ Summary (per identity)
//! ```
//!
//! Memory stays bounded whatever the log's size: files are streamed a line at a time (a line
//! longer than [`MAX_LINE`] is damage, not a reason to grow), [`Requests`] holds only the
//! decisions still waiting for their outcome (at most [`MAX_PENDING`]), and [`Summary`] holds
//! per-identity counters, each map capped and its overflow counted.
//!
//! A line that is not a record (not JSON, not UTF-8, torn, missing `id` or `ts`) is reported as
//! [`Damage`] naming `FILE:LINE`, and reading goes on: a reader of a damaged log must be told,
//! and must still see the rest. This module never checks the hash chain (`audit verify` does)
//! and writes nothing. Depends on [`super::verify`] (file order) and [`crate::reason`].

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::verify::VerifyError;
mod summary;
pub use summary::*;
mod rows;
pub use rows::*;
mod filter;
pub use filter::*;

/// A line longer than this is damage (latchkey's records are a few KiB at most).
pub const MAX_LINE: usize = 1 << 20;
/// Decisions waiting for their outcome, and the bytes of their lines; past either, the oldest
/// is taken as left alone.
pub const MAX_PENDING: usize = 10_000;
pub const MAX_PENDING_BYTES: usize = 64 << 20;
/// Distinct identities a summary tracks; rows of further identities are counted only.
pub const MAX_IDENTITIES: usize = 10_000;
/// Distinct hosts per identity a summary tracks; requests to further hosts are counted only.
pub const MAX_HOSTS: usize = 10_000;
/// Distinct secret names, and distinct reasons, per identity.
pub const MAX_NAMES: usize = 1_000;

/// A failure to read what was given, or a filter that cannot be understood.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Files(#[from] VerifyError),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{value:?} is neither an RFC 3339 time (2026-05-01T10:00:00Z) nor a duration ago (1h, 30m, 7d): {why}")]
    Time { value: String, why: String },
    #[error("unknown reason code {code:?}; the codes are: {known}")]
    Reason { code: String, known: String },
    #[error("host pattern {pattern:?}: {why}")]
    Host { pattern: String, why: &'static str },
}

// ---------------------------------------------------------------------------------------------
// Lines

/// The fields a reader needs, as a record line holds them. Everything else stays in
/// [`Line::raw`].
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Fields {
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub ts: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub identity: String,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub decision: String,
    #[serde(default)]
    pub rule: Option<String>,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub secrets: Vec<String>,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub bytes_up: u64,
    #[serde(default)]
    pub bytes_down: u64,
    #[serde(default)]
    pub would_deny: bool,
    #[serde(default)]
    pub usage: Option<Usage>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The runtime session (or the session header's value, without `profile`).
    #[serde(default)]
    pub session: Option<String>,
    /// The profile of the runtime session the request was admitted under.
    #[serde(default)]
    pub profile: Option<String>,
    #[serde(default)]
    checkpoint: Option<serde::de::IgnoredAny>,
}

/// A record's `usage` (model-provider calls).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cached_input_tokens: u64,
    #[serde(default)]
    pub cost: Option<f64>,
}

/// One record line, as stored and as read.
#[derive(Debug, Clone)]
pub struct Line {
    /// The line exactly as stored, without its newline.
    pub raw: String,
    pub fields: Fields,
    /// `fields.ts`, parsed.
    pub at: SystemTime,
    /// `phase: "decision"` (a record without `phase` predates the two phases: an outcome).
    pub decision_phase: bool,
}

impl Line {
    pub fn id(&self) -> &str {
        self.fields.id.as_deref().unwrap_or_default()
    }

    pub fn ts(&self) -> &str {
        self.fields.ts.as_deref().unwrap_or_default()
    }

    /// A record line, a checkpoint (`None`), or why the text is not a record.
    fn parse(raw: String) -> Result<Option<Line>, String> {
        let fields: Fields = serde_json::from_str(&raw).map_err(|e| {
            if e.is_syntax() || e.is_eof() {
                format!("not JSON ({e})")
            } else {
                format!("not an audit record ({e})")
            }
        })?;
        if fields.checkpoint.is_some() {
            return Ok(None);
        }
        if fields.id.is_none() {
            return Err("not an audit record: no `id`".to_string());
        }
        let Some(ts) = fields.ts.as_deref() else {
            return Err("not an audit record: no `ts`".to_string());
        };
        let at = humantime::parse_rfc3339_weak(ts)
            .map_err(|e| format!("not an audit record: `ts` {ts:?}: {e}"))?;
        let decision_phase = match fields.phase.as_deref() {
            None | Some("outcome") => false,
            Some("decision") => true,
            Some(other) => return Err(format!("not an audit record: unknown `phase` {other:?}")),
        };
        Ok(Some(Line {
            raw,
            fields,
            at,
            decision_phase,
        }))
    }
}

/// A line that is not a record, and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub file: PathBuf,
    /// 1-based.
    pub line: u64,
    pub why: String,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.why)
    }
}

/// What [`Reader::next`] found.
#[derive(Debug)]
pub enum Item {
    Record(Box<Line>),
    Damaged(Damage),
}

/// The record lines of a log's files, one at a time, in chain order; checkpoints skipped.
pub struct Reader {
    files: std::vec::IntoIter<PathBuf>,
    current: Option<(PathBuf, BufReader<File>)>,
    line: u64,
    buf: Vec<u8>,
}

impl Reader {
    /// Files and directories as `audit verify` takes them (directories expanded to the audit
    /// files in them), put in chain order.
    pub fn open(inputs: &[PathBuf]) -> Result<Self, ReadError> {
        let files = super::verify::files_in_order(inputs)?;
        Ok(Self::from_files(files))
    }

    /// Files already in order.
    pub fn from_files(files: Vec<PathBuf>) -> Self {
        Self {
            files: files.into_iter(),
            current: None,
            line: 0,
            buf: Vec::new(),
        }
    }

    /// The next record or damaged line; `None` at the end of the last file.
    pub fn next_item(&mut self) -> Result<Option<Item>, ReadError> {
        loop {
            let Some((path, reader)) = &mut self.current else {
                let Some(path) = self.files.next() else {
                    return Ok(None);
                };
                let file = File::open(&path).map_err(|source| ReadError::Read {
                    path: path.clone(),
                    source,
                })?;
                self.current = Some((path, BufReader::new(file)));
                self.line = 0;
                continue;
            };
            self.buf.clear();
            let read =
                read_line(reader, &mut self.buf, MAX_LINE).map_err(|source| ReadError::Read {
                    path: path.clone(),
                    source,
                })?;
            let Some(read) = read else {
                self.current = None;
                continue;
            };
            self.line += 1;
            let damage = |why: String| Damage {
                file: path.clone(),
                line: self.line,
                why,
            };
            if read.overlong {
                return Ok(Some(Item::Damaged(damage(format!(
                    "a line longer than {MAX_LINE} bytes"
                )))));
            }
            let text = match std::str::from_utf8(&self.buf) {
                Ok(t) => t.to_string(),
                Err(_) => return Ok(Some(Item::Damaged(damage("not UTF-8".to_string())))),
            };
            if text.is_empty() {
                return Ok(Some(Item::Damaged(damage("an empty line".to_string()))));
            }
            match Line::parse(text) {
                Ok(Some(line)) => return Ok(Some(Item::Record(Box::new(line)))),
                Ok(None) => continue,
                Err(why) if !read.newline => {
                    return Ok(Some(Item::Damaged(damage(format!(
                        "torn: the file ends inside this line, {why}"
                    )))))
                }
                Err(why) => return Ok(Some(Item::Damaged(damage(why)))),
            }
        }
    }
}

struct LineRead {
    /// The line ended with `\n` (a file's last line may not).
    newline: bool,
    /// The line was longer than the limit; `buf` holds its start only.
    overlong: bool,
}

/// Reads one line into `buf` (without its `\n`), keeping at most `max` bytes of it and
/// skipping the rest; `None` at the end of the file.
fn read_line<R: BufRead>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<LineRead>> {
    let mut seen_any = false;
    let mut overlong = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok(seen_any.then_some(LineRead {
                newline: false,
                overlong,
            }));
        }
        seen_any = true;
        let (part, used, done) = match memchr::memchr(b'\n', chunk) {
            Some(i) => (&chunk[..i], i + 1, true),
            None => (chunk, chunk.len(), false),
        };
        let room = max.saturating_sub(buf.len());
        if part.len() > room {
            overlong = true;
        }
        buf.extend_from_slice(&part[..part.len().min(room)]);
        r.consume(used);
        if done {
            return Ok(Some(LineRead {
                newline: true,
                overlong,
            }));
        }
    }
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;

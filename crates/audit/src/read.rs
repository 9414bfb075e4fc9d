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
// Filters

/// `--since` / `--until`: an RFC 3339 time (UTC unless it carries an offset; a date alone is
/// its midnight UTC), or a duration meaning that long before `now` (`1h`, `30m`, `7d`).
pub fn parse_instant(value: &str, now: SystemTime) -> Result<SystemTime, ReadError> {
    let bad = |why: String| ReadError::Time {
        value: value.to_string(),
        why,
    };
    let v = value.trim();
    if v.starts_with(|c: char| c.is_ascii_digit()) && !v.contains(['-', ':']) {
        let ago = humantime::parse_duration(v).map_err(|e| bad(e.to_string()))?;
        return now
            .checked_sub(ago)
            .ok_or_else(|| bad("that is before the clock's epoch".to_string()));
    }
    if v.len() == 10 {
        return humantime::parse_rfc3339_weak(&format!("{v}T00:00:00Z"))
            .map_err(|e| bad(e.to_string()));
    }
    // humantime reads `Z` or no zone; an offset `±HH:MM` is applied here.
    let (base, offset) = match split_offset(v) {
        Some((base, secs)) => (base, secs),
        None => (v, 0),
    };
    let local = humantime::parse_rfc3339_weak(base).map_err(|e| bad(e.to_string()))?;
    let shifted = if offset >= 0 {
        local.checked_sub(Duration::from_secs(offset.unsigned_abs()))
    } else {
        local.checked_add(Duration::from_secs(offset.unsigned_abs()))
    };
    shifted.ok_or_else(|| bad("out of range".to_string()))
}

/// `2026-05-01T12:00:00+02:00` → (`2026-05-01T12:00:00`, +7200).
fn split_offset(v: &str) -> Option<(&str, i64)> {
    let b = v.as_bytes();
    if b.len() < 17 || !(v.contains('T') || v.contains(' ')) {
        return None;
    }
    let tail = &b[b.len() - 6..];
    let sign = match tail[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let digit = |i: usize| char::from(tail[i]).to_digit(10).map(i64::from);
    if tail[3] != b':' {
        return None;
    }
    let hours = digit(1)? * 10 + digit(2)?;
    let minutes = digit(4)? * 10 + digit(5)?;
    if hours > 23 || minutes > 59 {
        return None;
    }
    Some((&v[..v.len() - 6], sign * (hours * 3600 + minutes * 60)))
}

/// `--reason`: a known reason code ([`crate::reason::Reason::ALL`]), or an error listing them.
pub fn parse_reason(code: &str) -> Result<&'static str, ReadError> {
    use crate::reason::Reason;
    Reason::ALL
        .iter()
        .map(|r| r.code())
        .find(|c| *c == code)
        .ok_or_else(|| ReadError::Reason {
            code: code.to_string(),
            known: Reason::ALL
                .iter()
                .map(|r| r.code())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// `--host`: a host name, or a glob where `*` stands for any run of characters
/// (`*.example.com` matches every subdomain of example.com, not example.com itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern(String);

impl HostPattern {
    pub fn parse(pattern: &str) -> Result<Self, ReadError> {
        let bad = |why| ReadError::Host {
            pattern: pattern.to_string(),
            why,
        };
        if pattern.is_empty() {
            return Err(bad("empty"));
        }
        if pattern.chars().any(|c| c.is_whitespace() || c == '/') {
            return Err(bad(
                "a host has no spaces or slashes; give the host alone, without a scheme or a path",
            ));
        }
        let lower = pattern.to_ascii_lowercase();
        Ok(Self(lower.strip_suffix('.').unwrap_or(&lower).to_string()))
    }

    pub fn matches(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        glob(
            self.0.as_bytes(),
            host.strip_suffix('.').unwrap_or(&host).as_bytes(),
        )
    }
}

/// `*` matches one or more bytes; everything else matches itself. The classic wildcard match
/// with one backtrack point (the last `*`), linear in practice.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // The last `*` seen, and where the text it has taken ends.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if pattern.get(p) == Some(&b'*') {
            star = Some((p, t + 1));
            p += 1;
            t += 1;
        } else if pattern.get(p) == Some(&text[t]) {
            p += 1;
            t += 1;
        } else if let Some((sp, end)) = star {
            // Let that `*` take one byte more.
            if end >= text.len() {
                return false;
            }
            star = Some((sp, end + 1));
            p = sp + 1;
            t = end + 1;
        } else {
            return false;
        }
    }
    p == pattern.len()
}

/// What a filter may ask of a record's `decision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
        }
    }
}

/// Every filter given; a record must pass all of them. `since` is inclusive, `until` is not.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub identity: Option<String>,
    pub host: Option<HostPattern>,
    pub decision: Option<Verdict>,
    pub reason: Option<&'static str>,
    pub rule: Option<String>,
    pub since: Option<SystemTime>,
    pub until: Option<SystemTime>,
}

impl Filter {
    pub fn matches(&self, r: &Line) -> bool {
        let f = &r.fields;
        self.identity.as_ref().is_none_or(|i| *i == f.identity)
            && self
                .host
                .as_ref()
                .is_none_or(|h| f.host.as_deref().is_some_and(|host| h.matches(host)))
            && self.decision.is_none_or(|d| d.as_str() == f.decision)
            && self.reason.is_none_or(|c| c == f.reason)
            && self
                .rule
                .as_ref()
                .is_none_or(|rule| f.rule.as_ref() == Some(rule))
            && self.since.is_none_or(|t| r.at >= t)
            && self.until.is_none_or(|t| r.at < t)
    }
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

// ---------------------------------------------------------------------------------------------
// Rows

/// Which records become rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rows {
    /// One per request: its outcome record, or its decision record when no outcome followed
    /// (latchkey stopped while the request was in flight).
    #[default]
    PerRequest,
    /// Every decision record.
    Decision,
    /// Every outcome record.
    Outcome,
    /// Every record.
    Any,
}

/// Turns records into rows. Per request, an outcome comes out when it is read; a decision that
/// passed the filter waits for its outcome, and comes out itself only at the end of the log
/// (or, past [`MAX_PENDING`] or [`MAX_PENDING_BYTES`] waiting, when it is the oldest: a
/// request still open after ten thousand others is taken as left alone; should its outcome
/// come after all, it is a row of its own): only the end shows that no outcome followed.
pub struct Requests {
    rows: Rows,
    filter: Filter,
    pending: HashMap<String, u64>,
    order: BTreeMap<u64, Line>,
    next: u64,
    /// The bytes of the lines in `order`.
    held: usize,
}

impl Requests {
    pub fn new(rows: Rows, filter: Filter) -> Self {
        Self {
            rows,
            filter,
            pending: HashMap::new(),
            order: BTreeMap::new(),
            next: 0,
            held: 0,
        }
    }

    /// Takes one record; pushes the rows it releases onto `out`.
    pub fn push(&mut self, line: Line, out: &mut Vec<Line>) {
        match self.rows {
            Rows::Any => self.emit_if(line, out),
            Rows::Decision if line.decision_phase => self.emit_if(line, out),
            Rows::Outcome if !line.decision_phase => self.emit_if(line, out),
            Rows::Decision | Rows::Outcome => {}
            Rows::PerRequest if line.decision_phase => {
                if !self.filter.matches(&line) {
                    return;
                }
                let n = self.next;
                self.next += 1;
                if let Some(old) = self.pending.insert(line.id().to_string(), n) {
                    // The same id decided twice: keep the later one.
                    self.take(old);
                }
                self.held += line.raw.len();
                self.order.insert(n, line);
                while self.order.len() > MAX_PENDING || self.held > MAX_PENDING_BYTES {
                    let Some((_, oldest)) = self.order.pop_first() else {
                        break;
                    };
                    self.held -= oldest.raw.len();
                    self.pending.remove(oldest.id());
                    out.push(oldest);
                }
            }
            Rows::PerRequest => {
                if let Some(n) = self.pending.remove(line.id()) {
                    self.take(n);
                }
                self.emit_if(line, out);
            }
        }
    }

    /// The decisions no outcome followed, in log order.
    pub fn finish(&mut self, out: &mut Vec<Line>) {
        self.pending.clear();
        self.held = 0;
        out.extend(std::mem::take(&mut self.order).into_values());
    }

    /// Drops the waiting decision `n` (its outcome came, or a later decision replaced it).
    fn take(&mut self, n: u64) {
        if let Some(line) = self.order.remove(&n) {
            self.held -= line.raw.len();
        }
    }

    fn emit_if(&self, line: Line, out: &mut Vec<Line>) {
        if self.filter.matches(&line) {
            out.push(line);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Summary

/// Names and their counts, capped at a number of distinct names; the rest counted only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub counts: BTreeMap<String, u64>,
    /// Counted under a name not kept (past the cap).
    pub untracked: u64,
    cap: usize,
}

impl Counts {
    fn with_cap(cap: usize) -> Self {
        Self {
            counts: BTreeMap::new(),
            untracked: 0,
            cap,
        }
    }

    fn add(&mut self, name: &str) {
        if let Some(n) = self.counts.get_mut(name) {
            *n += 1;
        } else if self.counts.len() < self.cap {
            self.counts.insert(name.to_string(), 1);
        } else {
            self.untracked += 1;
        }
    }

    /// Highest count first, then by name.
    pub fn ranked(&self) -> Vec<(&str, u64)> {
        let mut v: Vec<(&str, u64)> = self.counts.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        v
    }
}

impl Serialize for Counts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.counts.serialize(s)
    }
}

/// Tokens and cost summed over an identity's model-provider calls.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct UsageTotals {
    /// Requests whose record has `usage`.
    pub calls: u64,
    pub input_tokens: u64,
    pub cached_input_tokens: u64,
    pub output_tokens: u64,
    /// USD, over the calls whose model has a price; `None` when none has.
    pub cost: Option<f64>,
}

/// One identity's requests, summed.
#[derive(Debug, Clone, Serialize)]
pub struct IdentitySummary {
    pub identity: String,
    /// One per request (its outcome, or its decision when no outcome followed).
    pub requests: u64,
    pub allowed: u64,
    pub denied: u64,
    /// Allowed requests with a decision record and no outcome: in flight when latchkey stopped.
    pub unfinished: u64,
    /// Denied requests by reason.
    pub denials: Counts,
    /// Report-only mode: allowed requests enforcement would have denied, by reason.
    pub would_deny: Counts,
    /// Allowed requests by host (DNS queries and approval answers reach no host: not here).
    pub hosts: Counts,
    /// Allowed requests to hosts past [`MAX_HOSTS`].
    pub hosts_untracked: u64,
    /// Allowed requests by secret named.
    pub secrets: Counts,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub usage: Option<UsageTotals>,
    /// The labels on the identity's latest record (by `ts`) that had any.
    pub labels: BTreeMap<String, String>,
    pub first_seen: String,
    pub last_seen: String,
    #[serde(skip)]
    first_at: Option<SystemTime>,
    #[serde(skip)]
    last_at: Option<SystemTime>,
    #[serde(skip)]
    labels_at: Option<SystemTime>,
}

impl IdentitySummary {
    fn new(identity: &str) -> Self {
        Self {
            identity: identity.to_string(),
            requests: 0,
            allowed: 0,
            denied: 0,
            unfinished: 0,
            denials: Counts::with_cap(MAX_NAMES),
            would_deny: Counts::with_cap(MAX_NAMES),
            hosts: Counts::with_cap(MAX_HOSTS),
            hosts_untracked: 0,
            secrets: Counts::with_cap(MAX_NAMES),
            bytes_up: 0,
            bytes_down: 0,
            usage: None,
            labels: BTreeMap::new(),
            first_seen: String::new(),
            last_seen: String::new(),
            first_at: None,
            last_at: None,
            labels_at: None,
        }
    }

    fn add(&mut self, row: &Line) {
        let f = &row.fields;
        self.requests += 1;
        let allowed = f.decision == "allow";
        if allowed {
            self.allowed += 1;
            if row.decision_phase {
                self.unfinished += 1;
            }
            if f.would_deny {
                self.would_deny.add(&f.reason);
            }
            let pseudo = matches!(f.method.as_deref(), Some("DNS" | "APPROVAL"));
            if let (Some(host), false) = (f.host.as_deref(), pseudo) {
                let before = self.hosts.untracked;
                self.hosts.add(host);
                self.hosts_untracked += self.hosts.untracked - before;
            }
            for s in &f.secrets {
                self.secrets.add(s);
            }
        } else {
            self.denied += 1;
            self.denials.add(&f.reason);
        }
        self.bytes_up = self.bytes_up.saturating_add(f.bytes_up);
        self.bytes_down = self.bytes_down.saturating_add(f.bytes_down);
        if let Some(u) = &f.usage {
            let t = self.usage.get_or_insert_with(UsageTotals::default);
            t.calls += 1;
            t.input_tokens = t.input_tokens.saturating_add(u.input_tokens);
            t.cached_input_tokens = t.cached_input_tokens.saturating_add(u.cached_input_tokens);
            t.output_tokens = t.output_tokens.saturating_add(u.output_tokens);
            if let Some(c) = u.cost.filter(|c| c.is_finite()) {
                let sum = t.cost.unwrap_or(0.0) + c;
                // Sums of prices in USD: nine decimals hold every price table's precision
                // without the binary-fraction noise of repeated addition.
                t.cost = Some((sum * 1e9).round() / 1e9);
            }
        }
        if !f.labels.is_empty() && self.labels_at.is_none_or(|t| row.at >= t) {
            self.labels.clone_from(&f.labels);
            self.labels_at = Some(row.at);
        }
        if self.first_at.is_none_or(|t| row.at < t) {
            self.first_at = Some(row.at);
            self.first_seen = row.ts().to_string();
        }
        if self.last_at.is_none_or(|t| row.at >= t) {
            self.last_at = Some(row.at);
            self.last_seen = row.ts().to_string();
        }
    }
}

/// Per identity, what its requests did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Sorted by identity.
    pub identities: Vec<IdentitySummary>,
    /// Requests of identities past [`MAX_IDENTITIES`], counted only.
    pub untracked_requests: u64,
    #[serde(skip)]
    by_name: BTreeMap<String, IdentitySummary>,
}

impl Summary {
    /// Adds one row (from [`Requests`] in [`Rows::PerRequest`]).
    pub fn add(&mut self, row: &Line) {
        let name = row.fields.identity.as_str();
        if let Some(s) = self.by_name.get_mut(name) {
            s.add(row);
        } else if self.by_name.len() < MAX_IDENTITIES {
            let mut s = IdentitySummary::new(name);
            s.add(row);
            self.by_name.insert(name.to_string(), s);
        } else {
            self.untracked_requests += 1;
        }
    }

    /// Done adding: the identities, in order.
    pub fn finish(&mut self) {
        self.identities = std::mem::take(&mut self.by_name).into_values().collect();
    }

    pub fn requests(&self) -> u64 {
        self.identities.iter().map(|s| s.requests).sum::<u64>() + self.untracked_requests
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).expect("test time")
    }

    #[test]
    fn since_and_until_read_rfc3339_with_or_without_an_offset_and_dates() {
        let now = at("2026-05-01T12:00:00Z");
        let cases = [
            ("2026-05-01T10:00:00Z", "2026-05-01T10:00:00Z"),
            ("2026-05-01T10:00:00.250Z", "2026-05-01T10:00:00.250Z"),
            ("2026-05-01T10:00:00", "2026-05-01T10:00:00Z"),
            ("2026-05-01 10:00:00", "2026-05-01T10:00:00Z"),
            ("2026-05-01T12:00:00+02:00", "2026-05-01T10:00:00Z"),
            ("2026-05-01T05:30:00-04:30", "2026-05-01T10:00:00Z"),
            ("2026-05-01", "2026-05-01T00:00:00Z"),
        ];
        for (given, want) in cases {
            assert_eq!(parse_instant(given, now).expect(given), at(want), "{given}");
        }
    }

    #[test]
    fn a_bare_duration_means_that_long_before_now() {
        let now = at("2026-05-01T12:00:00Z");
        assert_eq!(
            parse_instant("1h", now).expect("1h"),
            at("2026-05-01T11:00:00Z")
        );
        assert_eq!(
            parse_instant("30m", now).expect("30m"),
            at("2026-05-01T11:30:00Z")
        );
        assert_eq!(
            parse_instant("2d 1h", now).expect("2d 1h"),
            at("2026-04-29T11:00:00Z")
        );
    }

    #[test]
    fn a_bad_time_names_the_value_and_the_accepted_forms() {
        let now = at("2026-05-01T12:00:00Z");
        for bad in [
            "yesterday",
            "1 fortnight",
            "2026-13-01T00:00:00Z",
            "",
            "10:00",
        ] {
            let e = parse_instant(bad, now).expect_err(bad).to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
            assert!(e.contains("RFC 3339") && e.contains("1h"), "{e}");
        }
    }

    #[test]
    fn reason_codes_are_checked_against_the_registry() {
        for r in crate::reason::Reason::ALL {
            assert_eq!(parse_reason(r.code()).expect("known code"), r.code());
        }
        let e = parse_reason("no_such_reason")
            .expect_err("unknown")
            .to_string();
        assert!(
            e.starts_with("unknown reason code \"no_such_reason\""),
            "{e}"
        );
        assert!(
            e.contains("no_rule") && e.contains("method_not_allowed"),
            "{e}"
        );
    }

    #[test]
    fn host_globs_match_subdomains_and_exact_names_only_themselves() {
        let wild = HostPattern::parse("*.Example.com").expect("glob");
        assert!(wild.matches("api.example.com"));
        assert!(wild.matches("a.b.example.com"));
        assert!(wild.matches("API.EXAMPLE.COM."));
        assert!(!wild.matches("example.com"));
        assert!(!wild.matches("evilexample.com"));
        assert!(!wild.matches("api.example.com.evil"));
        let exact = HostPattern::parse("api.test").expect("exact");
        assert!(exact.matches("api.test"));
        assert!(!exact.matches("a.api.test"));
        assert!(!exact.matches("api.tes"));
        let mid = HostPattern::parse("api-*.test").expect("inner star");
        assert!(mid.matches("api-1.test"));
        assert!(mid.matches("api-eu-2.test"));
        assert!(!mid.matches("api-.test"));
        let two = HostPattern::parse("*.*.test").expect("two stars");
        assert!(two.matches("a.b.test"));
        assert!(!two.matches("a.test"));
        for bad in ["", "https://api.test", "api.test/v1", "a b"] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    fn line(json: &str) -> Line {
        Line::parse(json.to_string())
            .expect("record")
            .expect("not a checkpoint")
    }

    /// A record of identity `ci` allowed to api.test by `api`; `extra` (`"k":v,...`) overrides.
    fn rec(id: &str, phase: &str, extra: &str) -> Line {
        let mut v: serde_json::Value = serde_json::from_str(&format!(
            r#"{{"seq":1,"prev":"x","phase":"{phase}","ts":"2026-05-01T10:00:00.000Z","id":"{id}","identity":"ci","host":"api.test","decision":"allow","reason":"allowed","rule":"api"}}"#
        ))
        .expect("base record");
        let over: serde_json::Value =
            serde_json::from_str(&format!("{{{}}}", extra.trim_start_matches(','))).expect("extra");
        for (k, x) in over.as_object().expect("object") {
            v[k] = x.clone();
        }
        line(&v.to_string())
    }

    #[test]
    fn filters_combine_with_and() {
        let r = rec("a", "outcome", "");
        let pass = |f: Filter| f.matches(&r);
        assert!(pass(Filter::default()));
        assert!(pass(Filter {
            identity: Some("ci".into()),
            host: Some(HostPattern::parse("*.test").expect("glob")),
            decision: Some(Verdict::Allow),
            reason: Some("allowed"),
            rule: Some("api".into()),
            since: Some(at("2026-05-01T10:00:00Z")),
            until: Some(at("2026-05-01T10:00:01Z")),
        }));
        assert!(!pass(Filter {
            identity: Some("ci".into()),
            decision: Some(Verdict::Deny),
            ..Filter::default()
        }));
        assert!(!pass(Filter {
            rule: Some("other".into()),
            ..Filter::default()
        }));
        assert!(!pass(Filter {
            until: Some(at("2026-05-01T10:00:00Z")),
            ..Filter::default()
        }));
        assert!(!pass(Filter {
            since: Some(at("2026-05-01T10:00:00.001Z")),
            ..Filter::default()
        }));
    }

    #[test]
    fn lines_that_are_not_records_say_why_and_checkpoints_are_skipped() {
        assert!(
            Line::parse(r#"{"seq":3,"prev":"ab","checkpoint":{"records":2}}"#.into())
                .expect("checkpoint")
                .is_none()
        );
        let why = |s: &str| Line::parse(s.to_string()).expect_err(s);
        assert!(why("{\"seq\":1,").starts_with("not JSON"));
        assert!(why("[1,2]").starts_with("not an audit record"));
        assert!(why(r#"{"ts":"2026-05-01T10:00:00Z"}"#).contains("no `id`"));
        assert!(why(r#"{"id":"a"}"#).contains("no `ts`"));
        assert!(why(r#"{"id":"a","ts":"noon"}"#).contains("`ts` \"noon\""));
        assert!(why(r#"{"id":"a","ts":"2026-05-01T10:00:00Z","phase":"x"}"#).contains("phase"));
    }

    #[test]
    fn per_request_rows_are_outcomes_and_decisions_left_alone_come_last() {
        let mut q = Requests::new(Rows::PerRequest, Filter::default());
        let mut out = Vec::new();
        q.push(rec("a", "decision", ""), &mut out);
        q.push(rec("b", "decision", ""), &mut out);
        q.push(
            rec("c", "outcome", r#","decision":"deny","reason":"no_rule""#),
            &mut out,
        );
        q.push(rec("a", "outcome", ""), &mut out);
        q.finish(&mut out);
        let got: Vec<(&str, bool)> = out.iter().map(|l| (l.id(), l.decision_phase)).collect();
        assert_eq!(got, [("c", false), ("a", false), ("b", true)]);

        for (rows, want) in [
            (Rows::Decision, vec!["a", "b"]),
            (Rows::Outcome, vec!["c", "a"]),
            (Rows::Any, vec!["a", "b", "c", "a"]),
        ] {
            let mut q = Requests::new(rows, Filter::default());
            let mut out = Vec::new();
            for l in [
                rec("a", "decision", ""),
                rec("b", "decision", ""),
                rec("c", "outcome", ""),
                rec("a", "outcome", ""),
            ] {
                q.push(l, &mut out);
            }
            q.finish(&mut out);
            assert_eq!(
                out.iter().map(Line::id).collect::<Vec<_>>(),
                want,
                "{rows:?}"
            );
        }
    }

    #[test]
    fn waiting_decisions_are_bounded() {
        let mut q = Requests::new(Rows::PerRequest, Filter::default());
        let mut out = Vec::new();
        for i in 0..=MAX_PENDING {
            q.push(rec(&format!("d{i}"), "decision", ""), &mut out);
        }
        assert_eq!(
            out.len(),
            1,
            "the oldest comes out once the limit is passed"
        );
        assert_eq!(out[0].id(), "d0");
        q.finish(&mut out);
        assert_eq!(out.len(), MAX_PENDING + 1);
    }

    #[test]
    fn lines_are_read_whole_overlong_ones_cut_and_the_last_may_lack_its_newline() {
        let text = format!("ab\n{}\ncd", "x".repeat(20));
        let mut r = std::io::Cursor::new(text.into_bytes());
        let mut buf = Vec::new();
        let mut next = |buf: &mut Vec<u8>| {
            buf.clear();
            read_line(&mut r, buf, 8).expect("read").map(|l| {
                (
                    String::from_utf8_lossy(buf).to_string(),
                    l.newline,
                    l.overlong,
                )
            })
        };
        assert_eq!(next(&mut buf), Some(("ab".into(), true, false)));
        assert_eq!(next(&mut buf), Some(("xxxxxxxx".into(), true, true)));
        assert_eq!(next(&mut buf), Some(("cd".into(), false, false)));
        assert_eq!(next(&mut buf), None);
    }

    #[test]
    fn a_summary_counts_per_identity_and_caps_hosts() {
        let mut s = Summary::default();
        s.add(&rec(
            "a",
            "outcome",
            r#","secrets":["gh"],"bytes_up":10,"bytes_down":100,"labels":{"env":"ci"}"#,
        ));
        s.add(&rec("b", "decision", r#","secrets":["gh"]"#));
        s.add(&rec(
            "c",
            "outcome",
            r#","decision":"deny","reason":"no_rule","host":"evil.test""#,
        ));
        s.add(&rec(
            "d",
            "outcome",
            r#","usage":{"provider":"openai","input_tokens":7,"output_tokens":3,"cached_input_tokens":2,"cost":0.1,"source":"response"}"#,
        ));
        s.add(&rec(
            "e",
            "outcome",
            r#","usage":{"provider":"openai","input_tokens":1,"output_tokens":1,"cached_input_tokens":0,"cost":0.2,"source":"response"}"#,
        ));
        s.finish();
        assert_eq!(s.identities.len(), 1);
        let ci = &s.identities[0];
        assert_eq!(
            (ci.requests, ci.allowed, ci.denied, ci.unfinished),
            (5, 4, 1, 1)
        );
        assert_eq!(ci.hosts.ranked(), [("api.test", 4)]);
        assert_eq!(ci.secrets.ranked(), [("gh", 2)]);
        assert_eq!(ci.denials.ranked(), [("no_rule", 1)]);
        assert_eq!((ci.bytes_up, ci.bytes_down), (10, 100));
        assert_eq!(ci.labels.get("env").map(String::as_str), Some("ci"));
        assert_eq!(
            ci.usage,
            Some(UsageTotals {
                calls: 2,
                input_tokens: 8,
                cached_input_tokens: 2,
                output_tokens: 4,
                cost: Some(0.3),
            })
        );

        let mut c = Counts::with_cap(2);
        for h in ["a", "b", "c", "a", "d"] {
            c.add(h);
        }
        assert_eq!(c.ranked(), [("a", 2), ("b", 1)]);
        assert_eq!(c.untracked, 2);
    }
}

//! `latchkey audit verify`: walks the hash chain across a log's files in chain order, checks
//! every link and every checkpoint's signature with a trusted key, and reports what it finds
//! (book "Audit": verify). Depends on [`super::chain`] and [`super::key`].
//!
//! The [`Verdict`] tells four cases apart, each with its own exit code: `intact`; `torn_write`
//! (intact, but a write the writer cut short — a full disk — is sealed in it: a partial line
//! the writer ended with a newline and skipped, its chain going on from the line before, so no
//! record is lost or hidden); `wrong_key` (the chain holds, but checkpoints are validly signed
//! by a key other than the trusted one: the wrong `--key`, or a log re-signed elsewhere); and
//! `tampered` (any other damage).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::chain::{checkpoint_message, line_hash, Head, GENESIS};
use super::key::PublicKey;

/// Problems kept in a report beyond the first (the first is what matters; the rest may be
/// consequences of it).
const MAX_PROBLEMS: usize = 100;

/// What kind of damage a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A line's bytes changed (its successor's `prev` no longer matches), or a line is not a
    /// chained record at all.
    Edited,
    /// `seq` jumps forward: lines are missing.
    Deleted,
    /// `seq` goes back or repeats: lines were moved or duplicated.
    Reordered,
    /// A file ends in a partial line.
    Truncated,
    /// A checkpoint whose signature does not verify with the trusted key it names, or with
    /// any key.
    BadSignature,
    /// A checkpoint validly signed by a key other than the trusted one (not damage by itself:
    /// the verdict is `wrong_key`).
    ForeignKey,
    /// A partial line the writer sealed (a write cut short, then ended with a newline) where
    /// the chain goes on from the line before it (not damage: the verdict is `torn_write`).
    TornWrite,
}

impl Kind {
    /// Whether this is damage (the verdict `tampered`).
    pub fn is_damage(self) -> bool {
        !matches!(self, Kind::ForeignKey | Kind::TornWrite)
    }
}

/// What verify concludes, most serious first when several apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every link and every checkpoint holds.
    #[default]
    Intact,
    /// Intact but for writes the writer cut short and sealed.
    TornWrite,
    /// The chain holds, but checkpoints are signed by another key than the trusted one.
    WrongKey,
    /// Lines were edited, deleted, reordered or cut off, or a signature is false.
    Tampered,
}

impl Verdict {
    /// The exit code of `latchkey audit verify` (README "Tamper evidence").
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Intact => 0,
            Verdict::Tampered => 1,
            Verdict::WrongKey => 3,
            Verdict::TornWrite => 4,
        }
    }

    /// The verdict as the text report's first word.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Intact => "intact",
            Verdict::TornWrite => "TORN WRITE (sealed; chain intact)",
            Verdict::WrongKey => "WRONG KEY",
            Verdict::Tampered => "TAMPERED",
        }
    }
}

/// One problem, where it was found.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    pub kind: Kind,
    pub file: PathBuf,
    /// 1-based line number in `file`.
    pub line: usize,
    pub seq: Option<u64>,
    pub message: String,
}

/// What a verification found.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Report {
    /// What the problems amount to (`intact` when there are none).
    pub verdict: Verdict,
    /// The files, in the chain order they were read.
    pub files: Vec<PathBuf>,
    pub lines: u64,
    pub checkpoints: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// The chain does not start at seq 1: earlier segments were not given (or were removed
    /// by retention). Not damage by itself.
    pub starts_mid_chain: bool,
    /// The last checkpoint whose signature verified.
    pub signed_through: Option<u64>,
    /// Lines after that checkpoint, which no signature covers yet.
    pub unsigned_tail: u64,
    /// The last line is a checkpoint written at a clean stop.
    pub ended_cleanly: bool,
    pub problems: Vec<Problem>,
    /// Problems past [`MAX_PROBLEMS`], counted only.
    pub more_problems: u64,
}

impl Report {
    /// Nothing to report: every link and every checkpoint holds under the trusted key.
    pub fn intact(&self) -> bool {
        self.verdict == Verdict::Intact
    }

    /// The verdict the problems found amount to, the most serious first.
    fn conclude(&self) -> Verdict {
        let kinds = || self.problems.iter().map(|p| p.kind);
        if kinds().any(Kind::is_damage) {
            Verdict::Tampered
        } else if kinds().any(|k| k == Kind::ForeignKey) {
            Verdict::WrongKey
        } else if kinds().any(|k| k == Kind::TornWrite) {
            Verdict::TornWrite
        } else {
            Verdict::Intact
        }
    }

    fn problem(&mut self, kind: Kind, file: &Path, line: usize, seq: Option<u64>, message: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(Problem {
                kind,
                file: file.to_path_buf(),
                line,
                seq,
                message,
            });
        } else {
            self.more_problems += 1;
        }
    }
}

/// A failure to read what was given (not damage in the log).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no audit files in {0}")]
    Empty(PathBuf),
}

/// The files `inputs` name, directories expanded to the audit files in them (`*.jsonl`,
/// `*.json`, `*.log`), put in chain order by their first line's `seq` (a file whose first line
/// has none goes first, where its problem shows at once).
pub fn files_in_order(inputs: &[PathBuf]) -> Result<Vec<PathBuf>, VerifyError> {
    let mut files = Vec::new();
    for input in inputs {
        let meta = std::fs::metadata(input).map_err(|source| VerifyError::Read {
            path: input.clone(),
            source,
        })?;
        if meta.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(input)
                .map_err(|source| VerifyError::Read {
                    path: input.clone(),
                    source,
                })?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.is_file()
                        && p.extension()
                            .and_then(|e| e.to_str())
                            .is_some_and(|e| matches!(e, "jsonl" | "json" | "log"))
                })
                .collect();
            if found.is_empty() {
                return Err(VerifyError::Empty(input.clone()));
            }
            found.sort();
            files.extend(found);
        } else {
            files.push(input.clone());
        }
    }
    files.sort();
    files.dedup();
    let mut keyed: Vec<(Option<u64>, PathBuf)> = files
        .into_iter()
        .map(|f| (super::segments::first_seq(&f), f))
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    Ok(keyed.into_iter().map(|(_, f)| f).collect())
}

/// Verifies the chain across `files` (already in chain order: [`files_in_order`]) with
/// `trusted` as the only key whose checkpoints count.
pub fn verify(files: &[PathBuf], trusted: &PublicKey) -> Result<Report, VerifyError> {
    let mut walk = Walk {
        report: Report {
            files: files.to_vec(),
            ..Report::default()
        },
        prev: None,
        last_was_clean_checkpoint: false,
    };
    for file in files {
        let f = std::fs::File::open(file).map_err(|source| VerifyError::Read {
            path: file.clone(),
            source,
        })?;
        let mut reader = BufReader::new(f);
        let mut buf = Vec::new();
        let mut n = 0usize;
        loop {
            buf.clear();
            let read = reader
                .read_until(b'\n', &mut buf)
                .map_err(|source| VerifyError::Read {
                    path: file.clone(),
                    source,
                })?;
            if read == 0 {
                break;
            }
            n += 1;
            let Some(line) = buf.strip_suffix(b"\n") else {
                walk.report.problem(
                    Kind::Truncated,
                    file,
                    n,
                    None,
                    format!(
                        "{}:{n} is a partial line: the file was truncated here, or a write was cut short",
                        file.display()
                    ),
                );
                break;
            };
            walk.line(file, n, line, trusted);
        }
    }
    let mut report = walk.report;
    report.ended_cleanly = walk.last_was_clean_checkpoint;
    report.verdict = report.conclude();
    Ok(report)
}

/// A live log verified as it grows: each [`Follow::advance`] reads only what was appended
/// since the last one (files are followed by identity, so a rotation's rename is not read
/// twice), stops before a partial last line (the writer may be in the middle of it), and
/// reports the chain so far — what the console's overview shows. Memory: the walk's state and
/// one offset per file still present.
pub struct Follow {
    walk: Walk,
    trusted: PublicKey,
    /// (device, inode) → bytes and lines verified.
    done: std::collections::HashMap<(u64, u64), (u64, usize)>,
}

impl Follow {
    pub fn new(trusted: PublicKey) -> Self {
        Self {
            walk: Walk {
                report: Report::default(),
                prev: None,
                last_was_clean_checkpoint: false,
            },
            trusted,
            done: std::collections::HashMap::new(),
        }
    }

    /// Verifies what `files` (chain order: closed segments, then the active file) gained since
    /// the last call, and reports the whole chain seen so far.
    pub fn advance(&mut self, files: &[PathBuf]) -> Result<Report, VerifyError> {
        use std::io::{Seek, SeekFrom};
        use std::os::unix::fs::MetadataExt;
        let mut present = std::collections::HashSet::new();
        for file in files {
            let read_err = |source| VerifyError::Read {
                path: file.clone(),
                source,
            };
            let mut f = match std::fs::File::open(file) {
                Ok(f) => f,
                // Removed by retention between listing and opening: nothing left to verify.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(read_err(e)),
            };
            let meta = f.metadata().map_err(read_err)?;
            let id = (meta.dev(), meta.ino());
            present.insert(id);
            let (mut offset, mut n) = self.done.get(&id).copied().unwrap_or((0, 0));
            if meta.len() < offset {
                // Shorter than what was verified: truncated under us.
                self.walk.report.problem(
                    Kind::Truncated,
                    file,
                    n,
                    None,
                    format!(
                        "{} shrank to {} bytes after {offset} were verified: truncated",
                        file.display(),
                        meta.len()
                    ),
                );
                offset = meta.len();
            }
            f.seek(SeekFrom::Start(offset)).map_err(read_err)?;
            let mut reader = BufReader::new(f);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                let read = reader.read_until(b'\n', &mut buf).map_err(read_err)?;
                let Some(line) = buf.strip_suffix(b"\n") else {
                    break;
                };
                n += 1;
                offset += read as u64;
                self.walk.line(file, n, line, &self.trusted);
            }
            self.done.insert(id, (offset, n));
        }
        self.done.retain(|id, _| present.contains(id));
        let mut report = self.walk.report.clone();
        report.files = files.to_vec();
        report.ended_cleanly = self.walk.last_was_clean_checkpoint;
        report.verdict = report.conclude();
        Ok(report)
    }
}

/// Where [`verify`] is along the chain.
struct Walk {
    report: Report,
    /// The previous line's seq and hash, and where it was.
    prev: Option<(u64, String, PathBuf, usize)>,
    last_was_clean_checkpoint: bool,
}

impl Walk {
    /// One whole line, `n` of `file`.
    fn line(&mut self, file: &Path, n: usize, line: &[u8], trusted: &PublicKey) {
        self.report.lines += 1;
        let hash = line_hash(line);
        let head: Option<Head> = serde_json::from_slice(line).ok();
        if head.is_none()
            && sealed_torn_write(line, self.prev.as_ref(), self.report.last_seq.is_none())
        {
            self.report.problem(
                Kind::TornWrite,
                file,
                n,
                None,
                format!(
                    "{}:{n} is a write cut short (a full disk?) that latchkey sealed and skipped: the chain goes on from the line before it",
                    file.display()
                ),
            );
            // The chain does not count it: the next line links to the one before.
            return;
        }
        let Some(head) = head else {
            self.report.problem(
                Kind::Edited,
                file,
                n,
                None,
                format!(
                    "{}:{n} is not a chained audit line (not JSON, or no seq/prev): edited",
                    file.display()
                ),
            );
            // Resynchronise on the next line, whatever its seq.
            self.prev = None;
            self.last_was_clean_checkpoint = false;
            return;
        };
        let seq = head.seq;
        self.report.first_seq.get_or_insert(seq);
        self.link(file, n, &head);
        self.last_was_clean_checkpoint = false;
        if let Some(cp) = &head.checkpoint {
            self.report.checkpoints += 1;
            let message = checkpoint_message(seq, &head.prev, &cp.ts, cp.records, cp.last);
            if trusted.verifies(message.as_bytes(), &cp.sig) {
                self.report.signed_through = Some(seq);
                self.report.unsigned_tail = 0;
                self.last_was_clean_checkpoint = cp.last;
            } else {
                let (kind, by) = foreign_or_bad(&cp.key, message.as_bytes(), &cp.sig, trusted);
                self.report.problem(
                    kind,
                    file,
                    n,
                    Some(seq),
                    format!(
                        "{}:{n}: the checkpoint at seq {seq} does not verify: {by}",
                        file.display()
                    ),
                );
                self.report.unsigned_tail += 1;
            }
        } else {
            self.report.unsigned_tail += 1;
        }
        self.report.last_seq = Some(seq);
        self.prev = Some((seq, hash, file.to_path_buf(), n));
    }

    /// Whether line `n` of `file` links to the line before it: the next seq, chained to its
    /// hash (else edited, deleted before it, or reordered).
    fn link(&mut self, file: &Path, n: usize, head: &Head) {
        let seq = head.seq;
        let report = &mut self.report;
        match &self.prev {
            None if report.last_seq.is_none() => {
                if seq == 1 && head.prev != GENESIS {
                    report.problem(
                        Kind::Edited,
                        file,
                        n,
                        Some(seq),
                        format!(
                            "{}:{n}: seq 1 does not start from the genesis hash: edited",
                            file.display()
                        ),
                    );
                } else if seq > 1 {
                    report.starts_mid_chain = true;
                }
            }
            None => {}
            Some((pseq, phash, pfile, pline)) => {
                let expected = pseq + 1;
                if seq == expected {
                    if head.prev != *phash {
                        report.problem(
                            Kind::Edited,
                            pfile,
                            *pline,
                            Some(*pseq),
                            format!(
                                "seq {pseq} ({}:{pline}) was edited: its hash is not the prev of seq {seq} ({}:{n})",
                                pfile.display(),
                                file.display()
                            ),
                        );
                    }
                } else if seq > expected {
                    let last_missing = seq - 1;
                    let range = if last_missing == expected {
                        format!("seq {expected} is")
                    } else {
                        format!("seq {expected} to {last_missing} are")
                    };
                    report.problem(
                        Kind::Deleted,
                        file,
                        n,
                        Some(seq),
                        format!(
                            "{range} missing before {}:{n} (seq {seq}): deleted",
                            file.display()
                        ),
                    );
                } else {
                    report.problem(
                        Kind::Reordered,
                        file,
                        n,
                        Some(seq),
                        format!(
                            "{}:{n} has seq {seq} after seq {pseq}: reordered or duplicated",
                            file.display()
                        ),
                    );
                }
            }
        }
    }
}

/// Why a checkpoint does not verify under `trusted`: signed by the key it names when that is
/// another key ([`Kind::ForeignKey`]), else a false signature ([`Kind::BadSignature`]).
fn foreign_or_bad(named: &str, message: &[u8], sig: &str, trusted: &PublicKey) -> (Kind, String) {
    if named == trusted.to_string() {
        return (
            Kind::BadSignature,
            "the trusted key's signature does not match: the checkpoint or the chain before it was changed".to_string(),
        );
    }
    match PublicKey::parse(named) {
        Ok(other) if other.verifies(message, sig) => (
            Kind::ForeignKey,
            format!("it is signed by the key {named}, not the trusted {trusted}: verify with --key {named} if that key is yours (`latchkey audit key` where the log was written); if it is not, the log was re-signed"),
        ),
        _ => (
            Kind::BadSignature,
            format!("it names the key {named}, not the trusted {trusted}, and its signature does not verify under either"),
        ),
    }
}

/// Whether `line` (whole, not a chained record) is a write the writer cut short and sealed: a
/// prefix of the line that would continue the chain from `prev` (`{"seq":N+1,"prev":"HASH",…`),
/// or of the first line of a log (`at_start`). What follows it is checked against `prev` as
/// usual, so a fragment can hide nothing: the chain must go on as if it were not there.
fn sealed_torn_write(
    line: &[u8],
    prev: Option<&(u64, String, PathBuf, usize)>,
    at_start: bool,
) -> bool {
    let head = match prev {
        Some((seq, hash, _, _)) => format!("{{\"seq\":{},\"prev\":\"{hash}\"", seq + 1),
        None if at_start => format!("{{\"seq\":1,\"prev\":\"{GENESIS}\""),
        None => return false,
    };
    let head = head.as_bytes();
    !line.is_empty() && (line.starts_with(head) || head.starts_with(line))
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;

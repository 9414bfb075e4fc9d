//! `latchkey audit verify`: walks the hash chain across a log's files in chain order, checks
//! every link and every checkpoint's signature with a trusted key, and reports what it finds
//! (book "Audit": verify). Depends on [`super::chain`] and [`super::key`].

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
    /// A checkpoint whose signature does not verify with the trusted key.
    BadSignature,
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
    pub fn intact(&self) -> bool {
        self.problems.is_empty()
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
    let mut report = Report {
        files: files.to_vec(),
        ..Report::default()
    };
    // The previous line's seq and hash, and where it was.
    let mut prev: Option<(u64, String, PathBuf, usize)> = None;
    let mut last_was_clean_checkpoint = false;
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
            let whole = buf.last() == Some(&b'\n');
            let line = if whole {
                &buf[..buf.len() - 1]
            } else {
                &buf[..]
            };
            if !whole {
                report.problem(
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
            }
            report.lines += 1;
            let hash = line_hash(line);
            let head: Option<Head> = serde_json::from_slice(line).ok();
            let Some(head) = head else {
                report.problem(
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
                prev = None;
                last_was_clean_checkpoint = false;
                continue;
            };
            let seq = head.seq;
            report.first_seq.get_or_insert(seq);
            match &prev {
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
            last_was_clean_checkpoint = false;
            if let Some(cp) = &head.checkpoint {
                report.checkpoints += 1;
                let message = checkpoint_message(seq, &head.prev, &cp.ts, cp.records, cp.last);
                if trusted.verifies(message.as_bytes(), &cp.sig) {
                    report.signed_through = Some(seq);
                    report.unsigned_tail = 0;
                    last_was_clean_checkpoint = cp.last;
                } else {
                    let by = if cp.key == trusted.to_string() {
                        "the trusted key's signature does not match: the checkpoint or the chain before it was changed".to_string()
                    } else {
                        format!("it names the key {}, not the trusted {trusted}", cp.key)
                    };
                    report.problem(
                        Kind::BadSignature,
                        file,
                        n,
                        Some(seq),
                        format!(
                            "{}:{n}: the checkpoint at seq {seq} does not verify: {by}",
                            file.display()
                        ),
                    );
                    report.unsigned_tail += 1;
                }
            } else {
                report.unsigned_tail += 1;
            }
            report.last_seq = Some(seq);
            prev = Some((seq, hash, file.clone(), n));
        }
    }
    report.ended_cleanly = last_was_clean_checkpoint;
    Ok(report)
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;

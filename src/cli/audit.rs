//! `latchkey audit key` and `latchkey audit verify` (query and summary are
//! [`super::audit_query`]'s). Errors are `anyhow` here, at the edge.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::audit::key::{PublicKey, SigningKey, KEY_FILE};
use crate::audit::verify::{self, Report};

use super::args::AuditAction;

pub fn run(action: AuditAction) -> anyhow::Result<ExitCode> {
    match action {
        AuditAction::Key { ca_dir, audit_key } => key(&key_path(&ca_dir, audit_key)),
        AuditAction::Verify {
            files,
            key,
            ca_dir,
            audit_key,
            format,
            json,
        } => {
            let json = json || format == super::args::OutputFormat::Json;
            let trusted = match key {
                Some(k) => PublicKey::parse(&k)?,
                None => {
                    let path = key_path(&ca_dir, audit_key);
                    let local = SigningKey::load(&path).map_err(|e| {
                        anyhow::anyhow!("{e}; give the public key that signed the log with --key ed25519:… (`latchkey audit key` prints it on the machine that wrote it)")
                    })?;
                    *local.public()
                }
            };
            let files = verify::files_in_order(&files)?;
            let report = verify::verify(&files, &trusted)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", text(&report, &trusted));
            }
            // One exit code per verdict (README "Tamper evidence").
            Ok(ExitCode::from(report.verdict.exit_code()))
        }
        AuditAction::Query(args) => super::audit_query::query(&args),
        AuditAction::Summary(args) => super::audit_query::summary(&args),
    }
}

fn key_path(ca_dir: &Path, audit_key: Option<PathBuf>) -> PathBuf {
    audit_key.unwrap_or_else(|| ca_dir.join(KEY_FILE))
}

/// Prints the public key (creating the key pair if absent).
fn key(path: &Path) -> anyhow::Result<ExitCode> {
    let (key, outcome) = SigningKey::load_or_create(path)?;
    if outcome == crate::audit::key::KeyOutcome::Created {
        eprintln!("latchkey: created the audit signing key {}", path.display());
    }
    println!("{}", key.public());
    Ok(ExitCode::SUCCESS)
}

/// The report as a reviewer reads it: the verdict first, then what it rests on.
fn text(report: &Report, trusted: &PublicKey) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let span = match (report.first_seq, report.last_seq) {
        (Some(a), Some(b)) => format!("seq {a} to {b}"),
        _ => "no records".to_string(),
    };
    let _ = writeln!(
        out,
        "{}: {} lines in {} files ({span}), {} checkpoints, trusted key {trusted}",
        report.verdict.label(),
        report.lines,
        report.files.len(),
        report.checkpoints
    );
    // Damage first: what makes the verdict is what a reviewer reads first.
    let (damage, notes): (Vec<_>, Vec<_>) =
        report.problems.iter().partition(|p| p.kind.is_damage());
    let mut problems = damage.into_iter().chain(notes);
    if let Some(first) = problems.next() {
        let _ = writeln!(out, "first problem: {}", first.message);
        for p in problems {
            let _ = writeln!(out, "also: {}", p.message);
        }
        if report.more_problems > 0 {
            let _ = writeln!(out, "and {} more problems", report.more_problems);
        }
    }
    if report.starts_mid_chain {
        let _ = writeln!(
            out,
            "note: the chain starts at seq {} (earlier segments not given, or removed by --audit-keep)",
            report.first_seq.unwrap_or_default()
        );
    }
    match report.signed_through {
        Some(seq) => {
            let _ = writeln!(out, "signed through seq {seq}");
        }
        None => {
            let _ = writeln!(out, "warning: no checkpoint verifies: nothing is signed");
        }
    }
    if report.unsigned_tail > 0 {
        let _ = writeln!(
            out,
            "warning: {} lines after the last checkpoint are held by the chain only: latchkey is still writing them, stopped without a clean shutdown, or the log was truncated after seq {}",
            report.unsigned_tail,
            report.last_seq.unwrap_or_default()
        );
    } else if report.ended_cleanly {
        let _ = writeln!(out, "ends with the checkpoint of a clean stop");
    }
    out
}

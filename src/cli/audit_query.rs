//! `latchkey audit query` and `latchkey audit summary`: reading an audit log back
//! ([`crate::audit::read`] does the reading, filtering and summing; this file is flags and
//! printing). Both take the log's files and directories in any order and read them in chain
//! order; neither checks the chain (`latchkey audit verify` does).
//!
//! A damaged line (not JSON, torn, not a record) is named as `FILE:LINE` on stderr and skipped;
//! the results are printed all the same, and the exit code is 2 instead of 0 so a script
//! notices. Errors are `anyhow` here, at the edge.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

use crate::audit::read::{
    self, Damage, Filter, HostPattern, IdentitySummary, Item, Line, Reader, Requests, Rows,
    Summary, Verdict,
};

/// At most this many damaged lines are named on stderr; the rest are counted.
const MAX_WARNINGS: u64 = 20;
/// The table's column widths come from its first rows (at most this many), so a large query
/// streams instead of holding every row; later longer values are cut to fit.
const TABLE_SAMPLE: usize = 1_000;

/// `latchkey audit query` flags. The filters read no environment variable: each query is its
/// own question, asked on the command line. `--identity` and `--format` read
/// `LATCHKEY_QUERY_IDENTITY` and `LATCHKEY_QUERY_FORMAT` (as `check --format` reads
/// `LATCHKEY_CHECK_FORMAT`): `LATCHKEY_IDENTITY` and `LATCHKEY_FORMAT` are `explain`'s and `env`'s,
/// and the README lists flags without a variable by name, across commands.
#[derive(clap::Args, Debug)]
pub struct QueryArgs {
    /// Audit files or directories (an audit file, its rotated segments, or a directory holding
    /// them), in any order: they are read in chain order.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Only records of this identity.
    #[arg(long, env = "LATCHKEY_QUERY_IDENTITY", value_name = "NAME")]
    pub identity: Option<String>,
    /// Only records of this runtime session (`ses_…`).
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Only records admitted under a session of this profile.
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// Only records for this host; `*` matches any run of characters (`*.example.com`: every
    /// subdomain of example.com).
    #[arg(long, value_name = "HOST", value_parser = host_pattern)]
    pub host: Option<HostPattern>,
    /// Only allowed, or only denied, records.
    #[arg(long, value_enum)]
    pub decision: Option<DecisionArg>,
    /// Only records with this reason code (`no_rule`, `method_not_allowed`, ...).
    #[arg(long, value_name = "CODE", value_parser = reason_code)]
    pub reason: Option<&'static str>,
    /// Only records decided by this rule.
    #[arg(long, value_name = "NAME")]
    pub rule: Option<String>,
    /// Only requests that arrived at or after T: RFC 3339 (`2026-05-01T10:00:00Z`, UTC unless
    /// an offset is given) or a duration ago (`1h`, `30m`, `7d`).
    #[arg(long, value_name = "T", value_parser = instant)]
    pub since: Option<SystemTime>,
    /// Only requests that arrived before T (same forms as --since).
    #[arg(long, value_name = "T", value_parser = instant)]
    pub until: Option<SystemTime>,
    /// Which records: `request` (one per request: its outcome, or its decision record when
    /// no outcome followed), `decision`, `outcome`, or `any` (every record).
    #[arg(long, value_enum, default_value = "request")]
    pub phase: PhaseArg,
    /// `table` (aligned columns) or `json` (the matching lines exactly as stored, one JSON
    /// object a line).
    #[arg(
        long,
        env = "LATCHKEY_QUERY_FORMAT",
        value_enum,
        default_value = "table"
    )]
    pub format: QueryFormat,
    /// Print at most N rows.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
}

/// `latchkey audit summary` flags: as `query`'s, `--identity` and `--format` read
/// `LATCHKEY_SUMMARY_IDENTITY` and `LATCHKEY_SUMMARY_FORMAT`, the time filters nothing.
#[derive(clap::Args, Debug)]
pub struct SummaryArgs {
    /// Audit files or directories, in any order: they are read in chain order.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Only requests that arrived at or after T: RFC 3339 or a duration ago (`1h`).
    #[arg(long, value_name = "T", value_parser = instant)]
    pub since: Option<SystemTime>,
    /// Only requests that arrived before T.
    #[arg(long, value_name = "T", value_parser = instant)]
    pub until: Option<SystemTime>,
    /// Only this identity.
    #[arg(long, env = "LATCHKEY_SUMMARY_IDENTITY", value_name = "NAME")]
    pub identity: Option<String>,
    /// Only this profile's sessions.
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// `identity` (default), or `session`: each runtime session apart.
    #[arg(
        long,
        env = "LATCHKEY_SUMMARY_BY",
        value_enum,
        default_value = "identity"
    )]
    pub by: ByArg,
    /// `text` or `json`.
    #[arg(
        long,
        env = "LATCHKEY_SUMMARY_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub format: SummaryFormat,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByArg {
    Identity,
    Session,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum DecisionArg {
    Allow,
    Deny,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum PhaseArg {
    Request,
    Decision,
    Outcome,
    Any,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryFormat {
    Table,
    // JSON lines, exactly as stored (`jsonl`: an older spelling).
    #[value(name = "json", alias = "jsonl")]
    Jsonl,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SummaryFormat {
    Text,
    Json,
}

fn host_pattern(v: &str) -> Result<HostPattern, read::ReadError> {
    HostPattern::parse(v)
}

fn reason_code(v: &str) -> Result<&'static str, String> {
    read::parse_reason(v).map_err(|e| {
        let codes = crate::reason::Reason::ALL.map(|r| r.code());
        format!("{e}{}", crate::policy::did_you_mean(v, codes))
    })
}

pub(crate) fn instant(v: &str) -> Result<SystemTime, read::ReadError> {
    read::parse_instant(v, SystemTime::now())
}

pub fn query(args: &QueryArgs) -> anyhow::Result<ExitCode> {
    let filter = Filter {
        identity: args.identity.clone(),
        session: args.session.clone(),
        profile: args.profile.clone(),
        host: args.host.clone(),
        decision: args.decision.map(|d| match d {
            DecisionArg::Allow => Verdict::Allow,
            DecisionArg::Deny => Verdict::Deny,
        }),
        reason: args.reason,
        rule: args.rule.clone(),
        since: args.since,
        until: args.until,
    };
    let rows = match args.phase {
        PhaseArg::Request => Rows::PerRequest,
        PhaseArg::Decision => Rows::Decision,
        PhaseArg::Outcome => Rows::Outcome,
        PhaseArg::Any => Rows::Any,
    };
    let mut reader = Reader::open(&args.files)?;
    let mut requests = Requests::new(rows, filter);
    let mut damage = Warnings::default();
    let stdout = std::io::stdout();
    let mut out = Printer::new(args.format, stdout.lock(), args.limit);
    let mut released = Vec::new();
    let mut reading = true;
    while reading && !out.full() {
        match reader.next_item()? {
            Some(Item::Record(line)) => requests.push(*line, &mut released),
            Some(Item::Damaged(d)) => damage.warn(&d),
            None => {
                requests.finish(&mut released);
                reading = false;
            }
        }
        for row in released.drain(..) {
            if !out.row(&row)? {
                break;
            }
        }
    }
    out.finish()?;
    Ok(damage.finish())
}

pub fn summary(args: &SummaryArgs) -> anyhow::Result<ExitCode> {
    let filter = Filter {
        identity: args.identity.clone(),
        profile: args.profile.clone(),
        since: args.since,
        until: args.until,
        ..Filter::default()
    };
    let files = crate::audit::verify::files_in_order(&args.files)?;
    let mut reader = Reader::from_files(files.clone());
    let mut requests = Requests::new(Rows::PerRequest, filter);
    let mut summary = Summary::default();
    summary.by = match args.by {
        ByArg::Identity => read::GroupBy::Identity,
        ByArg::Session => read::GroupBy::Session,
    };
    let mut damage = Warnings::default();
    let mut released = Vec::new();
    loop {
        match reader.next_item()? {
            Some(Item::Record(line)) => requests.push(*line, &mut released),
            Some(Item::Damaged(d)) => damage.warn(&d),
            None => {
                requests.finish(&mut released);
                for row in released.drain(..) {
                    summary.add(&row);
                }
                break;
            }
        }
        for row in released.drain(..) {
            summary.add(&row);
        }
    }
    summary.finish();
    let text = match args.format {
        SummaryFormat::Text => summary_text(&summary, files.len()),
        SummaryFormat::Json => {
            let mut v = serde_json::to_value(&summary)?;
            if let Some(o) = v.as_object_mut() {
                o.insert("requests".into(), summary.requests().into());
                o.insert("files".into(), files.len().into());
                o.insert("damaged_lines".into(), damage.count.into());
            }
            format!("{}\n", serde_json::to_string_pretty(&v)?)
        }
    };
    let stdout = std::io::stdout();
    let mut lock = stdout.lock();
    if let Err(e) = lock.write_all(text.as_bytes()).and_then(|()| lock.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e.into());
        }
    }
    Ok(damage.finish())
}

/// Damaged lines met: the first few named on stderr, all counted.
#[derive(Default)]
struct Warnings {
    count: u64,
}

impl Warnings {
    fn warn(&mut self, d: &Damage) {
        self.count += 1;
        if self.count <= MAX_WARNINGS {
            eprintln!("latchkey: warning: {d}: skipped");
        }
    }

    /// 0 when the log read clean, 2 when a line was damaged (after the results).
    fn finish(self) -> ExitCode {
        if self.count == 0 {
            return ExitCode::SUCCESS;
        }
        if self.count > MAX_WARNINGS {
            eprintln!(
                "latchkey: warning: and {} more damaged lines",
                self.count - MAX_WARNINGS
            );
        }
        eprintln!(
            "latchkey: warning: {} damaged line{} skipped: the log is not intact (`latchkey audit verify` tells what happened)",
            self.count,
            if self.count == 1 { "" } else { "s" }
        );
        ExitCode::from(2)
    }
}

// ---------------------------------------------------------------------------------------------
// Query output

/// Columns of the table: header, and the most characters a value shows (longer ones are cut
/// with `…`). Every column has a cap, so the rows held for the widths stay small whatever a
/// line holds.
const COLUMNS: [(&str, usize); 10] = [
    ("TS", 30),
    ("PHASE", 8),
    ("IDENTITY", 24),
    ("DECISION", 8),
    ("REASON", 32),
    ("METHOD", 10),
    ("HOST", 40),
    ("PATH", 48),
    ("STATUS", 6),
    ("RULE", 32),
];

fn cells(row: &Line) -> [String; 10] {
    let f = &row.fields;
    let or_dash = |v: Option<&str>| match v {
        Some(v) if !v.is_empty() => v.to_string(),
        _ => "-".to_string(),
    };
    let phase = if row.decision_phase {
        "decision"
    } else {
        "outcome"
    };
    let raw = [
        row.ts().to_string(),
        phase.to_string(),
        or_dash(Some(&f.identity)),
        or_dash(Some(&f.decision)),
        or_dash(Some(&f.reason)),
        or_dash(f.method.as_deref()),
        or_dash(f.host.as_deref()),
        or_dash(f.path.as_deref()),
        f.status.map_or_else(|| "-".to_string(), |s| s.to_string()),
        or_dash(f.rule.as_deref()),
    ];
    let mut cut = raw;
    for (cell, (_, cap)) in cut.iter_mut().zip(COLUMNS) {
        *cell = fit(cell, cap);
    }
    cut
}

/// Prints rows as jsonl or as a table, stopping at `--limit`, quietly at a closed pipe.
struct Printer<W: Write> {
    format: QueryFormat,
    out: std::io::BufWriter<W>,
    left: Option<u64>,
    /// Table rows held until the widths are known.
    sample: Vec<[String; 10]>,
    widths: Option<[usize; 10]>,
    closed: bool,
}

impl<W: Write> Printer<W> {
    fn new(format: QueryFormat, out: W, limit: Option<u64>) -> Self {
        Self {
            format,
            out: std::io::BufWriter::new(out),
            left: limit,
            sample: Vec::new(),
            widths: None,
            closed: false,
        }
    }

    /// No more rows wanted (the limit is reached, or the reader went away).
    fn full(&self) -> bool {
        self.closed || self.left == Some(0)
    }

    /// Prints one row; false once no more are wanted.
    fn row(&mut self, row: &Line) -> anyhow::Result<bool> {
        if self.full() {
            return Ok(false);
        }
        if let Some(n) = &mut self.left {
            *n -= 1;
        }
        let written = match self.format {
            QueryFormat::Jsonl => writeln!(self.out, "{}", row.raw),
            QueryFormat::Table => {
                self.sample.push(cells(row));
                if self.widths.is_none() && self.sample.len() < TABLE_SAMPLE {
                    Ok(())
                } else {
                    self.flush_table()
                }
            }
        };
        self.check(written)?;
        Ok(!self.full())
    }

    /// Writes the held table rows (fixing the widths first, with the header).
    fn flush_table(&mut self) -> std::io::Result<()> {
        let widths = match self.widths {
            Some(w) => w,
            None => {
                let mut w = [0usize; 10];
                for (i, (name, cap)) in COLUMNS.iter().enumerate() {
                    let longest = self
                        .sample
                        .iter()
                        .map(|r| r[i].chars().count())
                        .max()
                        .unwrap_or(0)
                        .max(name.len());
                    w[i] = longest.min(*cap);
                }
                self.widths = Some(w);
                let header = COLUMNS.map(|(name, _)| name.to_string());
                write_table_row(&mut self.out, &header, &w)?;
                w
            }
        };
        for r in std::mem::take(&mut self.sample) {
            write_table_row(&mut self.out, &r, &widths)?;
        }
        Ok(())
    }

    fn finish(mut self) -> anyhow::Result<()> {
        if self.closed {
            return Ok(());
        }
        let flushed = if self.format == QueryFormat::Table && !self.sample.is_empty() {
            self.flush_table()
        } else {
            Ok(())
        };
        self.check(flushed)?;
        let flushed = self.out.flush();
        self.check(flushed)
    }

    /// A closed pipe (`| head`) ends the output quietly; any other write error is an error.
    fn check(&mut self, r: std::io::Result<()>) -> anyhow::Result<()> {
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err(anyhow::anyhow!("cannot write the results: {e}")),
        }
    }
}

fn write_table_row<W: Write>(
    out: &mut W,
    cells: &[String; 10],
    widths: &[usize; 10],
) -> std::io::Result<()> {
    let mut line = String::new();
    for (i, cell) in cells.iter().enumerate() {
        let last = i == cells.len() - 1;
        let cell = fit(cell, widths[i]);
        if last {
            line.push_str(&cell);
        } else {
            let pad = widths[i].saturating_sub(cell.chars().count());
            line.push_str(&cell);
            line.extend(std::iter::repeat_n(' ', pad + 2));
        }
    }
    writeln!(out, "{}", line.trim_end())
}

/// `v` cut to `width` characters, its last one `…` when cut.
fn fit(v: &str, width: usize) -> String {
    if v.chars().count() <= width {
        return v.to_string();
    }
    let mut s: String = v.chars().take(width.saturating_sub(1)).collect();
    s.push('…');
    s
}

// ---------------------------------------------------------------------------------------------
// Summary output

fn summary_text(s: &Summary, files: usize) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let n = s.requests();
    let _ = writeln!(
        out,
        "{n} request{} from {} identit{} in {files} file{}",
        plural(n),
        s.identities.len(),
        if s.identities.len() == 1 { "y" } else { "ies" },
        if files == 1 { "" } else { "s" },
    );
    if s.untracked_requests > 0 {
        let _ = writeln!(
            out,
            "({} requests of identities past the first {} are counted only)",
            s.untracked_requests,
            read::MAX_IDENTITIES
        );
    }
    for id in &s.identities {
        out.push('\n');
        identity_text(&mut out, id);
    }
    out
}

fn identity_text(out: &mut String, id: &IdentitySummary) {
    use std::fmt::Write as _;
    let name = match &id.session {
        Some(session) => format!("{session} ({})", id.identity),
        None if id.identity.is_empty() => "(none)".to_string(),
        None => id.identity.clone(),
    };
    let labels: Vec<String> = id.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if labels.is_empty() {
        let _ = writeln!(out, "{name}");
    } else {
        let _ = writeln!(out, "{name}  {}", labels.join(" "));
    }
    let _ = writeln!(out, "  seen       {} .. {}", id.first_seen, id.last_seen);
    let unfinished = if id.unfinished > 0 {
        format!(" ({} without an outcome record)", id.unfinished)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "  requests   {}: {} allowed{unfinished}, {} denied",
        id.requests, id.allowed, id.denied
    );
    counts_line(out, "denied", &id.denials.ranked(), id.denials.untracked);
    counts_line(
        out,
        "would deny",
        &id.would_deny.ranked(),
        id.would_deny.untracked,
    );
    counts_line(out, "hosts", &id.hosts.ranked(), id.hosts_untracked);
    counts_line(out, "secrets", &id.secrets.ranked(), id.secrets.untracked);
    let _ = writeln!(
        out,
        "  bytes      up {}, down {}",
        id.bytes_up, id.bytes_down
    );
    if let Some(u) = &id.usage {
        let cost = u.cost.map_or_else(String::new, |c| format!(", ${c:.6}"));
        let _ = writeln!(
            out,
            "  usage      {} call{}, {} input tokens ({} cached), {} output tokens{cost}",
            u.calls,
            plural(u.calls),
            u.input_tokens,
            u.cached_input_tokens,
            u.output_tokens
        );
    }
}

/// `  hosts      api.test 3, other.test 1` (nothing when there is nothing to count).
fn counts_line(out: &mut String, label: &str, ranked: &[(&str, u64)], untracked: u64) {
    use std::fmt::Write as _;
    if ranked.is_empty() && untracked == 0 {
        return;
    }
    let mut parts: Vec<String> = ranked.iter().map(|(k, n)| format!("{k} {n}")).collect();
    if untracked > 0 {
        parts.push(format!("(others) {untracked}"));
    }
    let _ = writeln!(out, "  {label:<10} {}", parts.join(", "));
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_cells_are_cut_with_an_ellipsis_and_short_ones_kept() {
        assert_eq!(fit("/v1/models", 20), "/v1/models");
        assert_eq!(fit("/v1/models/gpt", 6), "/v1/m…");
        assert_eq!(fit("ééééé", 3), "éé…");
    }

    #[test]
    fn table_rows_are_padded_to_the_widths_and_the_last_column_is_not() {
        let mut out = Vec::new();
        let cells = ["a", "bb", "c", "d", "e", "f", "g", "h", "i", "rule"].map(String::from);
        write_table_row(&mut out, &cells, &[3, 2, 1, 1, 1, 1, 1, 1, 1, 9]).expect("write");
        assert_eq!(
            String::from_utf8(out).expect("utf-8"),
            "a    bb  c  d  e  f  g  h  i  rule\n"
        );
    }
}

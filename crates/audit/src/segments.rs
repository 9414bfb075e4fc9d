//! The log's files: the active file every batch is appended to, and the closed segments that
//! rotation leaves beside it (book "Audit": rotate, keep, ship).
//!
//! The active file keeps the name given to `--audit` (`audit.jsonl`); rotation closes it with
//! a checkpoint and renames it `audit-<first seq, 12 digits>-<UTC closing time>.jsonl` in the
//! same directory, so closed segments sort in chain order by name. Retention removes closed
//! segments older than `--audit-keep`, except, while shipping is on, those not yet shipped
//! (a segment is shipped once `SEGMENT.shipped` exists beside it). Depends on nothing else.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// When the active file is closed: at a size, an age, or both (whichever comes first).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rotation {
    pub size: Option<u64>,
    pub age: Option<Duration>,
}

impl Rotation {
    /// Parses `100MiB`, `1GB`, `1h`, `30m`, or both joined by a comma (`100MiB,1h`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = Self::default();
        for part in text.split(',').map(str::trim) {
            if part.is_empty() {
                return Err(format!("`{text}`: an empty part"));
            }
            if part.starts_with(|c: char| c.is_ascii_digit()) && part.ends_with(['B', 'b']) {
                let bytes = parse_size(part)?;
                if bytes == 0 {
                    return Err(format!("`{part}`: a rotation size must be more than 0"));
                }
                out.size = Some(bytes);
            } else {
                let age = humantime::parse_duration(part).map_err(|e| {
                    format!("`{part}` is neither a size (100MiB) nor a duration (1h): {e}")
                })?;
                if age < Duration::from_secs(1) {
                    return Err(format!("`{part}`: a rotation age must be at least 1s"));
                }
                out.age = Some(age);
            }
        }
        Ok(out)
    }

    pub fn is_off(&self) -> bool {
        self.size.is_none() && self.age.is_none()
    }
}

/// `512KiB`, `100MiB`, `1GiB`, `10MB`, `1000B`.
fn parse_size(text: &str) -> Result<u64, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{text}`: not a number of bytes"))?;
    let mult: u64 = match unit {
        "B" | "b" => 1,
        "KB" | "kB" => 1000,
        "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "GiB" => 1 << 30,
        _ => {
            return Err(format!(
                "`{text}`: unknown unit `{unit}` (B, KB, KiB, MB, MiB, GB, GiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{text}`: too large"))
}

/// The closed segment name for the active file `active` whose first line is `first_seq`.
pub fn segment_path(active: &Path, first_seq: u64, closed: SystemTime) -> PathBuf {
    let (stem, ext) = stem_ext(active);
    let stamp = humantime::format_rfc3339_seconds(closed)
        .to_string()
        .replace(['-', ':'], "");
    let name = format!("{stem}-{first_seq:012}-{stamp}{ext}");
    active.with_file_name(name)
}

fn stem_ext(active: &Path) -> (String, String) {
    let name = active
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "audit.jsonl".into());
    match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => (stem.to_string(), format!(".{ext}")),
        _ => (name, String::new()),
    }
}

/// The closed segments of the log whose active file is `active`, oldest first.
pub fn segments(active: &Path) -> std::io::Result<Vec<PathBuf>> {
    let (stem, ext) = stem_ext(active);
    let dir = match active.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let prefix = format!("{stem}-");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.strip_prefix(&prefix)
                    .and_then(|rest| rest.strip_suffix(ext.as_str()))
                    .is_some_and(is_segment_tail)
            })
        })
        .collect();
    out.sort();
    Ok(out)
}

/// `000000000042-20261202T133600Z`
fn is_segment_tail(rest: &str) -> bool {
    let Some((seq, stamp)) = rest.split_once('-') else {
        return false;
    };
    seq.len() == 12 && seq.bytes().all(|b| b.is_ascii_digit()) && stamp.ends_with('Z')
}

/// The marker whose existence says `segment` has been shipped off the box.
pub fn shipped_marker(segment: &Path) -> PathBuf {
    let mut name = segment.as_os_str().to_owned();
    name.push(".shipped");
    PathBuf::from(name)
}

/// The `seq` of a file's first line, if it has one.
pub fn first_seq(path: &Path) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Seq {
        seq: u64,
    }
    use std::io::Read;
    // Regular files only (not /dev/full, a FIFO), and only a line's worth of it.
    let file = File::open(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut line = Vec::new();
    BufReader::new(file.take(1 << 20))
        .read_until(b'\n', &mut line)
        .ok()?;
    serde_json::from_slice::<Seq>(line.trim_ascii_end())
        .ok()
        .map(|s| s.seq)
}

/// Removes closed segments last modified more than `keep` ago; while `unshipped_too` is
/// false, a segment not yet shipped stays. Returns what was removed.
pub fn retain(active: &Path, keep: Duration, unshipped_too: bool) -> Vec<PathBuf> {
    let now = SystemTime::now();
    let mut removed = Vec::new();
    let Ok(list) = segments(active) else {
        return removed;
    };
    for seg in list {
        let old = std::fs::metadata(&seg)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age > keep);
        let marker = shipped_marker(&seg);
        if !old || (!unshipped_too && !marker.exists()) {
            continue;
        }
        match std::fs::remove_file(&seg) {
            Ok(()) => {
                let _ = std::fs::remove_file(&marker);
                removed.push(seg);
            }
            Err(e) => {
                tracing::warn!(file = %seg.display(), error = %e, "cannot remove an old audit segment")
            }
        }
    }
    removed
}

/// Opens `path` for appending, created 0600.
pub fn open_append(path: &Path) -> std::io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    opts.open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_parses_sizes_ages_and_both() {
        assert_eq!(
            Rotation::parse("100MiB").expect("size").size,
            Some(100 << 20)
        );
        assert_eq!(
            Rotation::parse("1h").expect("age").age,
            Some(Duration::from_secs(3600))
        );
        let both = Rotation::parse("10MB, 30m").expect("both");
        assert_eq!(
            (both.size, both.age),
            (Some(10_000_000), Some(Duration::from_secs(1800)))
        );
        for bad in [
            "",
            "0B",
            "10XB",
            "soon",
            "100ms",
            "1h,",
            "99999999999999999999GiB",
        ] {
            assert!(Rotation::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn segments_are_named_in_chain_order_and_listed_oldest_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let active = dir.path().join("audit.jsonl");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_000_000);
        let a = segment_path(&active, 1, t);
        let b = segment_path(&active, 1001, t);
        assert!(a
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("audit-000000000001-") && n.ends_with("Z.jsonl")));
        for p in [&b, &a] {
            std::fs::write(p, "x").expect("write");
        }
        std::fs::write(dir.path().join("audit-notes.jsonl"), "x").expect("write");
        std::fs::write(&active, "x").expect("write");
        assert_eq!(segments(&active).expect("list"), vec![a.clone(), b]);
        // Retention: nothing is old yet; an unshipped segment stays even when old.
        assert!(retain(&active, Duration::from_secs(3600), false).is_empty());
        std::thread::sleep(Duration::from_millis(20));
        assert!(retain(&active, Duration::from_millis(1), false).is_empty());
        std::fs::write(shipped_marker(&a), "").expect("marker");
        assert_eq!(
            retain(&active, Duration::from_millis(1), false),
            vec![a.clone()]
        );
        assert!(!shipped_marker(&a).exists());
        assert_eq!(retain(&active, Duration::from_millis(1), true).len(), 1);
    }
}

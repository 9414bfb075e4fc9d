//! Where audit lines go: a file opened for appending (created 0600), or standard output. Each
//! batch reaches the sink in one `write_all`, so lines never interleave. No other dependency.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use super::AuditError;

/// Opens `path` for appending (created with mode 0600), or stdout for `-`.
pub(super) fn open(path: &Path) -> Result<Box<dyn Write + Send>, AuditError> {
    if path == Path::new("-") {
        return Ok(Box::new(Stdout));
    }
    let mut opts = OpenOptions::new();
    opts.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let file = opts.open(path).map_err(|source| AuditError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Box::new(file))
}

/// Standard output, locked and flushed per batch.
struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stdout().lock().write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        out.write_all(buf)?;
        out.flush()
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().lock().flush()
    }
}

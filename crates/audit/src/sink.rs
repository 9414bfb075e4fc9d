//! Standard output as an audit sink (`--audit -`): each batch reaches it in one `write_all`,
//! so lines never interleave. Files are [`super::segments`]'. No other dependency.

use std::io::Write;

/// Standard output, locked and flushed per batch.
pub(super) struct Stdout;

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

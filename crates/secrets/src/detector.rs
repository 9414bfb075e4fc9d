//! The leak check of a request body that streams: secret values (raw, encoded, escaped) and
//! placeholders are found across chunk boundaries, and only a chunk's tail that could still
//! begin one is held back, so the upstream never receives part of a value before the check
//! fails. Trailers are checked like headers.
//!
//! Knows no HTTP body type and no policy: the proxy feeds it chunks ([`Detector::push`]) and
//! turns its [`Refusal`] into the body's error.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;

use super::decoded::{decoded_views, escape_byte, ESCAPE_RATIO};
use super::leak::{check_trailers, secret_refusal, Binding, Part};
use super::placeholder::{self, Place, PREFIX};
use super::scrub::{Scrubber, StreamScrubber};
use crate::reason::{Reason, Refusal};

/// Finds secret values and placeholders in a streamed body, across chunk boundaries, holding
/// back only what could still become a secret's variant.
pub struct Detector {
    scrubber: Option<Arc<Scrubber>>,
    stream: Option<StreamScrubber>,
    bound: BTreeSet<String>,
    host: String,
    rule: String,
    /// Raw bytes scanned but not yet passed on.
    held: Vec<u8>,
    /// Set once a secret the rule binds was seen: the scrubber's output is then not the raw
    /// bytes, so a fixed window (the longest variant less one byte) is held back instead.
    conservative: bool,
    redactions: usize,
    /// The end of the previous chunk, for a placeholder prefix split across chunks.
    tail: Vec<u8>,
    /// Whether the rule enables body placeholders (only for the message).
    body_placeholders: bool,
    /// The last raw bytes received, searched again with the next chunk once unescaped
    /// ([`super::decoded::unescaped`]), and the output held back for as long: an escaped value is longer than
    /// its variants, so none of it goes out before its end has been seen.
    esc_tail: Vec<u8>,
    esc_held: Vec<u8>,
    /// The most of a body held whole (for the message when a body placeholder streams).
    whole_limit: usize,
    /// The end of the output that could be the start of a placeholder: held back until the
    /// bytes after it show it is not one, so no part of a refused placeholder goes out.
    prefix_held: Vec<u8>,
}

impl Detector {
    /// A detector for one body to `host` under `rule`; `whole_limit` is the most latchkey holds
    /// whole (a body placeholder in a longer body is refused, and the message says why).
    pub fn new(
        scrubber: Option<Arc<Scrubber>>,
        rule: &Binding<'_>,
        host: &str,
        whole_limit: usize,
    ) -> Self {
        let stream = scrubber
            .as_ref()
            .filter(|s| !s.is_empty())
            .map(|s| s.stream());
        Self {
            scrubber,
            stream,
            bound: rule.bound.clone(),
            host: host.to_string(),
            rule: rule.rule.to_string(),
            held: Vec::new(),
            conservative: false,
            redactions: 0,
            tail: Vec::new(),
            body_placeholders: rule.placeholders.contains(&Place::Body),
            esc_tail: Vec::new(),
            esc_held: Vec::new(),
            whole_limit,
            prefix_held: Vec::new(),
        }
    }

    fn unbound_seen(&mut self) -> Result<(), Refusal> {
        let Some(stream) = &self.stream else {
            return Ok(());
        };
        if stream.redactions() == self.redactions {
            return Ok(());
        }
        self.redactions = stream.redactions();
        if let Some(name) = stream
            .redacted_names()
            .into_iter()
            .find(|n| !self.bound.contains(&**n))
        {
            return Err(Refusal::new(
                Reason::SecretValueUnbound,
                format!(
                    "the value of secret '{name}' was sent to host {}, which rule '{}' does not bind it to",
                    self.host, self.rule
                ),
            ));
        }
        self.conservative = true;
        Ok(())
    }

    /// A placeholder in a streamed body: never replaced there.
    fn placeholder_refusal(&self) -> Refusal {
        let why = if self.body_placeholders {
            format!("placeholder in a request body to host {} that is streamed (over {} MiB, or past latchkey's buffer budget): body placeholders are replaced only in bodies latchkey holds whole", self.host, self.whole_limit / (1024 * 1024))
        } else {
            format!(
                "placeholder in the request body to host {}: rule '{}' does not enable body placeholders",
                self.host, self.rule
            )
        };
        Refusal::new(Reason::PlaceholderNotBound, why)
    }

    /// Raw bytes an escaped value or placeholder prefix may span: the longest, escaped byte
    /// by byte.
    fn escape_window(&self) -> usize {
        match (&self.stream, &self.scrubber) {
            (Some(_), Some(s)) => s
                .max_pattern_len()
                .max(PREFIX.len())
                .saturating_mul(ESCAPE_RATIO),
            _ => 0,
        }
    }

    /// Scans a chunk; returns the bytes that may go upstream now.
    pub fn push(&mut self, chunk: Bytes) -> Result<Bytes, Refusal> {
        let out = self.push_escaped(chunk)?;
        Ok(self.hold_prefix(out))
    }

    /// Holds back the end of `out` that is the start of a placeholder's prefix.
    fn hold_prefix(&mut self, out: Bytes) -> Bytes {
        let starts = |all: &[u8]| {
            (1..PREFIX.len())
                .rev()
                .find(|&k| all.ends_with(&PREFIX[..k]))
                .unwrap_or(0)
        };
        if self.prefix_held.is_empty() {
            let k = starts(&out);
            self.prefix_held = out[out.len() - k..].to_vec();
            return out.slice(..out.len() - k);
        }
        let mut all = std::mem::take(&mut self.prefix_held);
        all.extend_from_slice(&out);
        let k = starts(&all);
        self.prefix_held = all.split_off(all.len() - k);
        Bytes::from(all)
    }

    /// [`Self::push`] before the placeholder hold-back.
    fn push_escaped(&mut self, chunk: Bytes) -> Result<Bytes, Refusal> {
        let window = self.escape_window();
        if window == 0 {
            return self.push_raw(chunk);
        }
        // The unescaped view of what came since the last check, with the window before it.
        let mut seen = std::mem::take(&mut self.esc_tail);
        seen.extend_from_slice(&chunk);
        if let Some(s) = self.scrubber.as_deref() {
            for d in decoded_views(&seen) {
                // An escaped placeholder is one once the upstream parses it.
                if placeholder::contains(&d) {
                    return Err(self.placeholder_refusal());
                }
                if let Some(r) =
                    secret_refusal(s, &self.bound, Part::Body, &d, &self.host, &self.rule)
                {
                    return Err(r);
                }
            }
        }
        self.esc_tail = seen.split_off(seen.len().saturating_sub(window));
        let out = self.push_raw(chunk)?;
        if out.is_empty() && self.esc_held.is_empty() {
            return Ok(out);
        }
        self.esc_held.extend_from_slice(&out);
        // An escaped value not yet complete has an escape in the window, or is still only a
        // literal prefix of a variant, which `push_raw` holds back itself.
        let pending = self.esc_tail.iter().copied().any(escape_byte);
        let ready = if pending {
            self.esc_held.len().saturating_sub(window)
        } else {
            self.esc_held.len()
        };
        let rest = self.esc_held.split_off(ready);
        Ok(Bytes::from(std::mem::replace(&mut self.esc_held, rest)))
    }

    /// [`Self::push`] without the unescaped view.
    fn push_raw(&mut self, chunk: Bytes) -> Result<Bytes, Refusal> {
        // A placeholder begins with PREFIX: look for it in the chunk and across its start.
        let keep = PREFIX.len() - 1;
        let mut seam = std::mem::take(&mut self.tail);
        seam.extend_from_slice(&chunk[..chunk.len().min(keep)]);
        if placeholder::contains(&seam) || placeholder::contains(&chunk) {
            return Err(self.placeholder_refusal());
        }
        // The next seam begins with the last bytes seen: the end of this chunk, or (a chunk
        // shorter than the prefix) the end of the seam, which holds all of it.
        self.tail = if chunk.len() >= keep {
            chunk[chunk.len() - keep..].to_vec()
        } else {
            seam[seam.len().saturating_sub(keep)..].to_vec()
        };

        let Some(stream) = self.stream.as_mut() else {
            return Ok(chunk);
        };
        let out = stream.push_bytes(chunk.clone());
        self.unbound_seen()?;
        if self.conservative {
            self.held.extend_from_slice(&chunk);
            let window = self
                .scrubber
                .as_ref()
                .map_or(0, |s| s.max_pattern_len().saturating_sub(1));
            let ready = self.held.len().saturating_sub(window);
            let rest = self.held.split_off(ready);
            return Ok(Bytes::from(std::mem::replace(&mut self.held, rest)));
        }
        // No redaction: the scrubber's output is exactly the raw bytes it settled.
        let pending = self.held.len() + chunk.len() - out.len();
        if pending <= chunk.len() {
            self.held = chunk[chunk.len() - pending..].to_vec();
        } else {
            let from_held = pending - chunk.len();
            let start = self.held.len() - from_held;
            self.held.drain(..start);
            self.held.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    /// The end of the body: scans what was held back and returns it.
    pub fn finish(&mut self) -> Result<Bytes, Refusal> {
        if let Some(stream) = self.stream.as_mut() {
            stream.finish();
            self.unbound_seen()?;
        }
        let mut out = std::mem::take(&mut self.prefix_held);
        out.extend_from_slice(&self.esc_held);
        self.esc_held = Vec::new();
        out.extend_from_slice(&self.held);
        self.held = Vec::new();
        Ok(Bytes::from(out))
    }

    /// Checks trailers like headers.
    pub fn trailers(&self, trailers: &HeaderMap) -> Result<(), Refusal> {
        check_trailers(
            self.scrubber.as_deref(),
            &self.bound,
            trailers,
            &self.host,
            &self.rule,
        )
    }
}

#[cfg(test)]
#[path = "detector_tests.rs"]
mod tests;

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

    /// Raw bytes an escaped value may span: the longest variant, escaped byte by byte.
    fn escape_window(&self) -> usize {
        match (&self.stream, &self.scrubber) {
            (Some(_), Some(s)) => s.max_pattern_len().saturating_mul(ESCAPE_RATIO),
            _ => 0,
        }
    }

    /// Scans a chunk; returns the bytes that may go upstream now.
    pub fn push(&mut self, chunk: Bytes) -> Result<Bytes, Refusal> {
        let window = self.escape_window();
        if window == 0 {
            return self.push_raw(chunk);
        }
        // The unescaped view of what came since the last check, with the window before it.
        let mut seen = std::mem::take(&mut self.esc_tail);
        seen.extend_from_slice(&chunk);
        if let Some(s) = self.scrubber.as_deref() {
            for d in decoded_views(&seen) {
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
            let why = if self.body_placeholders {
                format!("placeholder in a request body to host {} that is streamed (over {} MiB, or past latchkey's buffer budget): body placeholders are replaced only in bodies latchkey holds whole", self.host, self.whole_limit / (1024 * 1024))
            } else {
                format!(
                    "placeholder in the request body to host {}: rule '{}' does not enable body placeholders",
                    self.host, self.rule
                )
            };
            return Err(Refusal::new(Reason::PlaceholderNotBound, why));
        }
        self.tail = seam[seam.len().saturating_sub(keep)..].to_vec();

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
        let mut out = std::mem::take(&mut self.esc_held);
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
mod tests {
    use super::*;
    use crate::secrets::scrub::ScrubSecret;

    const SECRET: &[u8] = b"sk-test-OPENAI-4f9a1c7e2b8d";

    fn detector(bound: &[&str]) -> Detector {
        let scrubber = Arc::new(
            Scrubber::new(&[ScrubSecret {
                name: "openai",
                value: SECRET,
            }])
            .expect("scrubber"),
        );
        let bound: BTreeSet<String> = bound.iter().map(|s| s.to_string()).collect();
        let none = BTreeSet::new();
        let rule = Binding {
            rule: "report-only",
            bound: &bound,
            placeholders: &[],
            captured: &none,
            withheld: &none,
        };
        Detector::new(Some(scrubber), &rule, "api.test", 8 * 1024 * 1024)
    }

    /// Feeds `chunks`; returns what went out, or the refusal and what went out before it.
    fn run(d: &mut Detector, chunks: &[&[u8]]) -> (Vec<u8>, Option<Reason>) {
        let mut out = Vec::new();
        for c in chunks {
            match d.push(Bytes::copy_from_slice(c)) {
                Ok(b) => out.extend_from_slice(&b),
                Err(r) => return (out, Some(r.reason)),
            }
        }
        match d.finish() {
            Ok(b) => out.extend_from_slice(&b),
            Err(r) => return (out, Some(r.reason)),
        }
        (out, None)
    }

    #[test]
    fn a_secret_split_across_chunks_is_refused_before_any_of_it_goes_out() {
        let mut body = b"x".repeat(100);
        body.extend_from_slice(SECRET);
        body.extend_from_slice(b"tail");
        for cut in 1..body.len() {
            let mut d = detector(&[]);
            let (out, refused) = run(&mut d, &[&body[..cut], &body[cut..]]);
            assert_eq!(refused, Some(Reason::SecretValueUnbound), "cut at {cut}");
            assert!(
                !out.windows(4).any(|w| w == b"sk-t"),
                "cut at {cut}: part of the secret went out: {:?}",
                String::from_utf8_lossy(&out)
            );
        }
    }

    #[test]
    fn clean_bodies_pass_byte_exact_and_bound_secrets_pass_too() {
        let body: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let chunks: Vec<&[u8]> = body.chunks(333).collect();
        let (out, refused) = run(&mut detector(&[]), &chunks);
        assert_eq!((out, refused), (body.clone(), None));

        let mut with = body.clone();
        with.splice(2000..2000, SECRET.iter().copied());
        let chunks: Vec<&[u8]> = with.chunks(97).collect();
        let (out, refused) = run(&mut detector(&["openai"]), &chunks);
        assert_eq!(refused, None);
        assert_eq!(out, with, "a bound secret's bytes pass unchanged");
    }

    /// A value escaped byte by byte (`%XX`, `\u00XX`, half and half), split at every point:
    /// refused, and none of its escaped form goes out first.
    #[test]
    fn an_escaped_secret_split_across_chunks_is_refused_before_any_of_it_goes_out() {
        let pct: String = SECRET.iter().map(|b| format!("%{b:02x}")).collect();
        let uni: String = SECRET.iter().map(|b| format!("\\u{:04X}", b)).collect();
        let half: String = SECRET[..10]
            .iter()
            .map(|&b| (b as char).to_string())
            .chain(SECRET[10..].iter().map(|b| format!("\\u{b:04x}")))
            .collect();
        let qp: String = SECRET.iter().map(|b| format!("={b:02X}")).collect();
        for escaped in [pct, uni, half, qp] {
            let mut body = b"{\"a\":\"".to_vec();
            let start = body.len();
            body.extend_from_slice(escaped.as_bytes());
            body.extend_from_slice(b"\"}");
            for cut in 1..body.len() {
                let mut d = detector(&[]);
                let (out, refused) = run(&mut d, &[&body[..cut], &body[cut..]]);
                assert_eq!(
                    refused,
                    Some(Reason::SecretValueUnbound),
                    "{escaped} cut at {cut}"
                );
                assert!(
                    out.len() <= start,
                    "{escaped} cut at {cut}: {:?}",
                    String::from_utf8_lossy(&out)
                );
            }
            let mut d = detector(&["openai"]);
            let (out, refused) = run(&mut d, &[&body[..20], &body[20..]]);
            assert_eq!(
                (out, refused),
                (body.clone(), None),
                "bound: passes unchanged"
            );
        }
        // Escapes of ordinary text pass byte-exact, split anywhere.
        let body = br#"{"k":"caf\u00e9 100%25 \/"}"#.repeat(50);
        for cut in [1, 7, 100, 500] {
            let (out, refused) = run(&mut detector(&[]), &[&body[..cut], &body[cut..]]);
            assert_eq!((out, refused), (body.clone(), None));
        }
    }

    #[test]
    fn placeholders_are_refused_across_a_chunk_boundary() {
        let (_, refused) = run(&mut detector(&[]), &[b"aaa__LATCH", b"KEY_openai__"]);
        assert_eq!(refused, Some(Reason::PlaceholderNotBound));
    }
}

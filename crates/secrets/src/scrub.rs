//! Response scrubbing: every value of a secret in force, in every encoding an upstream is likely
//! to reflect it in, is replaced by `[REDACTED:<name>]` before the sandbox sees the response.
//!
//! This module owns the list of encodings looked for (the *variants* of a secret), the compiled
//! matcher over all of them, and the hold-back rule that lets a body be scrubbed chunk by chunk
//! with exactly the result of scrubbing it whole. It knows no sockets and no HTTP, logs nothing,
//! and must never print a secret or a variant: [`Scrubber`] and [`StreamScrubber`] have a
//! hand-written `Debug` that shows names and counts only.
//!
//! ```
//! use std::sync::Arc;
//! use latchkey_secrets::scrub::{ScrubSecret, Scrubber};
//!
//! let secret = ScrubSecret { name: "openai", value: b"sk-test-0123456789" };
//! let scrubber = Arc::new(Scrubber::new(&[secret])?);
//!
//! let (out, names) = scrubber.scrub(b"you sent sk-test-0123456789");
//! assert_eq!(out, b"you sent [REDACTED:openai]");
//! assert_eq!(names.len(), 1);
//!
//! // The same, over a body that arrives in pieces.
//! let mut stream = scrubber.stream();
//! let mut body = Vec::new();
//! body.extend_from_slice(&stream.push(b"you sent sk-test-01"));
//! body.extend_from_slice(&stream.push(b"23456789"));
//! body.extend_from_slice(&stream.finish());
//! assert_eq!(body, b"you sent [REDACTED:openai]");
//! # Ok::<(), latchkey_secrets::scrub::ScrubError>(())
//! ```
//!
//! # Variants
//!
//! For a secret value `v` the scrubber looks for:
//! - `v` itself;
//! - standard and URL-safe base64 of `v`, at each of the three alignments `v` can have inside a
//!   larger encoded blob (it may start at byte offset 0, 1 or 2 modulo 3). For alignment `a` the
//!   variant is the base64 of `a` filler bytes followed by `v`, cut down to the characters fully
//!   determined by the bytes of `v`; padding is therefore never part of a variant. The one or two
//!   characters at either end that mix secret bits with neighbouring bits stay in the output;
//!   they hold at most 4 bits of the secret each;
//! - percent-encoding with upper- and with lower-case hex, in the forms common encoders produce:
//!   every byte but the unreserved `A-Za-z0-9-._~` encoded (Python `quote(v, safe='')`); the
//!   same with `/` left alone (Python `quote(v)`); JavaScript `encodeURIComponent` (also leaves
//!   `!'()*`); only RFC 3986 reserved characters, `%` and bytes that cannot appear in a URL
//!   encoded; and form encoding (space as `+`);
//! - JSON string escaping, in every combination of: `/` as is or as `\/`; control characters as
//!   short escapes (`\n`, `\t`, …) where JSON has one or always as `\u00` and two hex digits;
//!   `\u` hex in lower or upper case; non-ASCII as is or as `\u` and four hex digits (UTF-16,
//!   so surrogate pairs above U+FFFF); and
//!   Go's HTML-safe escaping of `<`, `>`, `&`, U+2028 and U+2029. `"` and `\` are always escaped.
//!
//! Variants identical to another (of the same or an earlier secret) are kept once, the first
//! secret naming it. Variants shorter than [`MIN_VARIANT_LEN`] are skipped; secrets shorter than
//! [`MIN_SECRET_LEN`] are refused, since they would match noise.
//!
//! # Matching
//!
//! One Aho-Corasick automaton over all variants, leftmost-longest: where several variants match,
//! the one starting first wins, and of those the longest (so a secret that extends another is
//! redacted whole, under its own name). Matches do not overlap.
//!
//! The automaton alone reads a few hundred MB/s once there are more than a few dozen variants
//! (its vectorised prefilter stops at 64). So a sieve first samples the input every few
//! dozen bytes against a bit table of the variants' substrings and rules out the stretches that
//! cannot hold a variant; the automaton searches only the rest. The matches, and so the output,
//! are exactly those of the automaton over the whole input. Input built to defeat the sieve (dense
//! with pieces of variants) costs at worst one pass of the automaton.
//!
//! # Streaming
//!
//! Whether a variant starts at offset `s` depends only on the bytes `s..s + L`, where `L` is
//! [`Scrubber::max_pattern_len`]. So a match found in the bytes held so far is final once it
//! starts at least `L` bytes before their end, and bytes before `end - (L - 1)` that no final
//! match covers can be emitted as they are. [`StreamScrubber`] therefore holds back at most
//! `L - 1` bytes between chunks, and its output equals [`Scrubber::scrub`] of the whole body
//! for any chunking.
//!
//! # Copies of secret values
//!
//! The variant buffers this module builds are [`Zeroizing`] and sized up front so they never
//! reallocate; they are wiped as soon as the automaton is built, and the sieve's table (hashes of
//! variant substrings) is wiped on drop. The automaton keeps its own copy of every variant in
//! its transition tables, which `aho-corasick` neither exposes nor wipes: a [`Scrubber`] holds
//! the secrets for as long as it lives, so keep it no longer than the secrets are in force.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::ops::{ControlFlow, Range};
use std::sync::Arc;

use aho_corasick::{AhoCorasick, AhoCorasickKind, Input, Match, MatchKind};
use bytes::Bytes;
use zeroize::Zeroizing;

use super::sieve::Sieve;
use super::variants::variants_of;
#[cfg(test)]
use super::variants::{base64_aligned, json_escaped, percent_encoded, JsonStyle, PercentForm};

/// Secrets shorter than this are refused: they would match noise.
pub const MIN_SECRET_LEN: usize = 8;

/// Variants shorter than this are not looked for (for example a tiny base64 fragment).
pub const MIN_VARIANT_LEN: usize = 6;

/// Up to this many bytes of variants, the automaton is a full DFA: the fastest to search, and
/// still small at that size (a few MiB at most). Past it, `aho-corasick` picks a leaner form.
const DFA_PATTERN_BYTES_LIMIT: usize = 64 * 1024;

/// One secret value to scrub, by name. The value bytes are borrowed only during construction.
pub struct ScrubSecret<'a> {
    pub name: &'a str,
    pub value: &'a [u8],
}

/// Why a [`Scrubber`] could not be built. Messages name secrets, never their values.
#[derive(Debug, thiserror::Error)]
pub enum ScrubError {
    #[error("secret {name:?} is shorter than 8 bytes: too short to redact reliably")]
    TooShort { name: String },
    #[error("cannot build scanner: {0}")]
    Build(String),
}

/// Compiled matcher over every variant of every secret. Immutable; share it with [`Arc`].
///
/// `Debug` shows the secret names and counts, never a value or a variant.
pub struct Scrubber {
    /// Every variant of every secret; holds its own copy of them (see the module docs).
    matcher: AhoCorasick,
    /// Rules out the stretches of a haystack where no variant can be, so `matcher` runs only
    /// around candidates. `None` when there are too many variants for it to be selective.
    sieve: Option<Sieve>,
    /// For each pattern of `matcher`, by pattern id: the index into `names` of its secret.
    name_of_pattern: Vec<usize>,
    /// Distinct secret names, in the order first given.
    names: Vec<Arc<str>>,
    /// `[REDACTED:<name>]`, by index into `names`.
    replacements: Vec<Box<[u8]>>,
    max_pattern_len: usize,
    /// Every variant, sorted, to tell whether a chunk's tail could still begin one: a stream
    /// holds back only such a tail, so a server-sent event is not delayed by a full window.
    /// Wiped on drop.
    sorted: Vec<Zeroizing<Vec<u8>>>,
    /// Bytes some variant starts with: most tail positions are ruled out by one lookup.
    first_bytes: [bool; 256],
    /// The variants that could appear in a header name (token characters only), matched
    /// ignoring ASCII case: HTTP lower-cases header names, which must not hide a secret.
    /// `None` when no variant could.
    token_matcher: Option<(AhoCorasick, Vec<usize>)>,
}

impl Scrubber {
    /// Compiles a matcher over every variant of every secret. Refuses a secret shorter than
    /// [`MIN_SECRET_LEN`] bytes. Two secrets may share a name; they redact under it alike.
    pub fn new(secrets: &[ScrubSecret<'_>]) -> Result<Scrubber, ScrubError> {
        if let Some(short) = secrets.iter().find(|s| s.value.len() < MIN_SECRET_LEN) {
            return Err(ScrubError::TooShort {
                name: short.name.to_owned(),
            });
        }

        // Every variant of every secret, with the index of its secret's name.
        let mut names: Vec<Arc<str>> = Vec::new();
        let mut name_index: HashMap<&str, usize> = HashMap::new();
        let mut candidates: Vec<(Zeroizing<Vec<u8>>, usize)> = Vec::new();
        for secret in secrets {
            let index = *name_index.entry(secret.name).or_insert_with(|| {
                names.push(Arc::from(secret.name));
                names.len() - 1
            });
            candidates.extend(variants_of(secret.value).into_iter().map(|v| (v, index)));
        }

        // Long enough to mean something, and each once: the first secret to produce it names it.
        let mut seen: HashSet<&[u8]> = HashSet::new();
        let (patterns, name_of_pattern): (Vec<&[u8]>, Vec<usize>) = candidates
            .iter()
            .map(|(variant, index)| (variant.as_slice(), *index))
            .filter(|(variant, _)| variant.len() >= MIN_VARIANT_LEN && seen.insert(variant))
            .unzip();

        let pattern_bytes: usize = patterns.iter().map(|p| p.len()).sum();
        let kind = (pattern_bytes <= DFA_PATTERN_BYTES_LIMIT).then_some(AhoCorasickKind::DFA);
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .kind(kind)
            .build(&patterns)
            .map_err(|e| ScrubError::Build(e.to_string()))?;
        let max_pattern_len = patterns.iter().map(|p| p.len()).max().unwrap_or(0);
        let sieve = Sieve::build(&patterns);
        let mut sorted: Vec<Zeroizing<Vec<u8>>> = patterns
            .iter()
            .map(|p| Zeroizing::new(p.to_vec()))
            .collect();
        sorted.sort_by(|a, b| a.as_slice().cmp(b.as_slice()));
        let mut first_bytes = [false; 256];
        for p in &patterns {
            if let Some(&b) = p.first() {
                first_bytes[usize::from(b)] = true;
            }
        }
        let (tokens, token_names): (Vec<&[u8]>, Vec<usize>) = patterns
            .iter()
            .zip(&name_of_pattern)
            .filter(|(p, _)| p.iter().all(|&b| is_token_byte(b)))
            .map(|(p, i)| (*p, *i))
            .unzip();
        let token_matcher = if tokens.is_empty() {
            None
        } else {
            let m = AhoCorasick::builder()
                .ascii_case_insensitive(true)
                .build(&tokens)
                .map_err(|e| ScrubError::Build(e.to_string()))?;
            Some((m, token_names))
        };
        // Our copies of the variants are wiped here, as `candidates` drops.
        drop(candidates);

        let replacements = names
            .iter()
            .map(|name| format!("[REDACTED:{name}]").into_bytes().into_boxed_slice())
            .collect();
        Ok(Scrubber {
            matcher,
            sieve,
            name_of_pattern,
            names,
            replacements,
            max_pattern_len,
            sorted,
            first_bytes,
            token_matcher,
        })
    }

    /// The name of a secret whose value occurs in `name` in any ASCII case: for header and
    /// trailer names, which HTTP lower-cases (and which cannot hold a `[REDACTED:…]` marker,
    /// so a name that holds a secret is dropped, not rewritten).
    pub fn find_in_name(&self, name: &[u8]) -> Option<Arc<str>> {
        let (m, names) = self.token_matcher.as_ref()?;
        m.find(name)
            .map(|found| Arc::clone(&self.names[names[found.pattern()]]))
    }

    /// Whether `tail` is a proper prefix of some variant (it could become one with more bytes).
    fn could_start_variant(&self, tail: &[u8]) -> bool {
        let Some(&first) = tail.first() else {
            return false;
        };
        if !self.first_bytes[usize::from(first)] {
            return false;
        }
        // Variants that extend `tail` sort right after every variant <= `tail` (a variant equal
        // to `tail` included: it may also be the start of a longer one).
        let i = self.sorted.partition_point(|p| p.as_slice() <= tail);
        self.sorted.get(i).is_some_and(|p| p.starts_with(tail))
    }

    /// The first position of the last `max_pattern_len - 1` bytes from which the rest of
    /// `haystack` could still grow into a variant; `haystack.len()` when none could.
    fn unsettled_from(&self, haystack: &[u8]) -> usize {
        let window = haystack
            .len()
            .saturating_sub(self.max_pattern_len.saturating_sub(1));
        (window..haystack.len())
            .find(|&q| self.could_start_variant(&haystack[q..]))
            .unwrap_or(haystack.len())
    }

    /// Whether there is no secret to scrub (every input passes through unchanged).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Longest variant length in bytes: a stream holds back at most this minus one.
    pub fn max_pattern_len(&self) -> usize {
        self.max_pattern_len
    }

    /// Scrubs a whole buffer: the new bytes, and the name of each redaction made, in order
    /// (a name repeats when its secret was found more than once).
    pub fn scrub(&self, input: &[u8]) -> (Vec<u8>, Vec<Arc<str>>) {
        let mut out = Vec::with_capacity(input.len());
        let mut redacted = Vec::new();
        self.scrub_into(input, Flush::All, &mut out, |name| {
            redacted.push(Arc::clone(&self.names[name]));
        });
        (out, redacted)
    }

    /// The name of the secret whose variant occurs first in `input`, if any does. Used to refuse
    /// a request that carries a secret's value to a host it is not bound to.
    pub fn find(&self, input: &[u8]) -> Option<Arc<str>> {
        let mut first = None;
        self.for_each_match(input, |found| {
            first = Some(Arc::clone(
                &self.names[self.name_of_pattern[found.pattern()]],
            ));
            ControlFlow::Break(())
        });
        first
    }

    /// The name of the first secret found in `input` (in the order [`scrub`](Self::scrub)
    /// redacts them) for which `wanted` holds: the names `scrub` would report, searched for
    /// without building the scrubbed copy. The request-side leak check asks it "is any secret
    /// here that may not be?" over bodies up to 8 MiB.
    pub fn find_where(
        &self,
        input: &[u8],
        mut wanted: impl FnMut(&str) -> bool,
    ) -> Option<Arc<str>> {
        let mut first = None;
        self.for_each_match(input, |found| {
            let name = &self.names[self.name_of_pattern[found.pattern()]];
            if wanted(name) {
                first = Some(Arc::clone(name));
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        });
        first
    }

    /// [`find`](Self::find), ignoring ASCII case: for the short request parts that are
    /// case-folded on the way (host names, header names), where a secret may arrive already
    /// lowercased. Compares every variant with every position, so use it on short inputs only.
    pub fn find_ignore_ascii_case(&self, input: &[u8]) -> Option<Arc<str>> {
        if let Some(name) = self.find(input) {
            return Some(name);
        }
        let variant = self.sorted.iter().find(|v| {
            !v.is_empty()
                && input
                    .windows(v.len())
                    .any(|window| window.eq_ignore_ascii_case(v))
        })?;
        // The variant names its secret: it matches itself (or a variant inside it).
        self.find(variant)
    }

    /// A scrubber for one body that arrives in chunks.
    pub fn stream(self: &Arc<Self>) -> StreamScrubber {
        StreamScrubber {
            scrubber: Arc::clone(self),
            held: Vec::new(),
            redactions: 0,
            name_seen: vec![false; self.names.len()],
            redacted_names: Vec::new(),
        }
    }

    /// Appends to `out` the scrubbed form of as much of `haystack` as is settled, calls
    /// `redacted` with the name index of each redaction, and returns how many bytes of
    /// `haystack` it consumed. With [`Flush::All`] that is all of them; with
    /// [`Flush::Settled`] the rest (at most `max_pattern_len - 1` bytes) may still be the start
    /// of a variant and must be offered again with the bytes that follow.
    fn scrub_into(
        &self,
        haystack: &[u8],
        flush: Flush,
        out: &mut Vec<u8>,
        mut redacted: impl FnMut(usize),
    ) -> usize {
        if self.is_empty() {
            out.extend_from_slice(haystack);
            return haystack.len();
        }
        // A match starting before `settled` lies wholly in `haystack` with any longer rival, so
        // no later byte can change it; a byte before `settled` that no match covers is final.
        let settled = match flush {
            Flush::All => haystack.len(),
            // Only a tail that could still grow into a variant waits for more bytes: a match
            // that could be extended is such a tail too, so leftmost-longest is preserved.
            Flush::Settled => self.unsettled_from(haystack),
        };
        let mut cursor = 0;
        self.for_each_match(haystack, |found| {
            if flush == Flush::Settled && found.start() >= settled {
                return ControlFlow::Break(());
            }
            let name = self.name_of_pattern[found.pattern()];
            out.extend_from_slice(&haystack[cursor..found.start()]);
            out.extend_from_slice(&self.replacements[name]);
            redacted(name);
            cursor = found.end();
            ControlFlow::Continue(())
        });
        let consumed = settled.max(cursor);
        out.extend_from_slice(&haystack[cursor..consumed]);
        consumed
    }

    /// Calls `visit` with each match in `haystack`, in order, until it breaks: exactly the
    /// matches of `self.matcher.find_iter(haystack)` (leftmost-longest, non-overlapping), found
    /// faster by searching only the regions the sieve cannot rule out.
    ///
    /// Why that is the same sequence: every occurrence of a variant lies wholly inside one region
    /// (see [`Sieve`]), and regions do not overlap. So a search from the start of a region
    /// finds what a search from the end of the previous region's last match would, and no match
    /// of a region reaches into the next.
    fn for_each_match(&self, haystack: &[u8], mut visit: impl FnMut(Match) -> ControlFlow<()>) {
        if self.is_empty() {
            return;
        }
        let Some(sieve) = &self.sieve else {
            for found in self.matcher.find_iter(haystack) {
                if visit(found).is_break() {
                    return;
                }
            }
            return;
        };
        let mut search = |region: Range<usize>| {
            let input = Input::new(haystack).span(region);
            for found in self.matcher.find_iter(input) {
                visit(found)?;
            }
            ControlFlow::Continue(())
        };
        let mut region: Option<Range<usize>> = None;
        for window in sieve.candidate_windows(haystack, self.max_pattern_len) {
            region = match region {
                Some(current) if window.start <= current.end => Some(current.start..window.end),
                Some(current) => {
                    if search(current).is_break() {
                        return;
                    }
                    Some(window)
                }
                None => Some(window),
            };
        }
        if let Some(last) = region {
            let _ = search(last);
        }
    }
}

impl fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scrubber")
            .field("secrets", &self.names)
            .field("variants", &self.name_of_pattern.len())
            .field("max_pattern_len", &self.max_pattern_len)
            .finish_non_exhaustive()
    }
}

/// RFC 9110 `tchar`: the bytes a header name is made of.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// How much of a haystack [`Scrubber::scrub_into`] may consume.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flush {
    /// The end of the input: consume everything.
    All,
    /// More input may follow: keep back what could still be the start of a variant.
    Settled,
}

/// Scrubs one body chunk by chunk, without buffering it whole: the concatenated output of every
/// [`push`](Self::push) and the [`finish`](Self::finish) equals [`Scrubber::scrub`] of the
/// concatenated input, however the input was cut.
///
/// `Debug` shows counts only: held-back bytes may be part of a secret.
pub struct StreamScrubber {
    scrubber: Arc<Scrubber>,
    /// Bytes received but not yet settled: never more than `max_pattern_len - 1` after a push,
    /// and never more than twice that in between, whatever the size of the chunks.
    held: Vec<u8>,
    redactions: usize,
    /// By index into the scrubber's names: whether it is already in `redacted_names`.
    name_seen: Vec<bool>,
    redacted_names: Vec<Arc<str>>,
}

impl StreamScrubber {
    /// Feeds a chunk; returns the bytes now safe to emit (maybe none). Holds back at most
    /// `max_pattern_len() - 1` bytes, so a secret split across chunks is still caught.
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        let mut out = Vec::with_capacity(self.held.len() + chunk.len());
        // Taken out so it can be read while the counters are updated; put back before returning.
        let mut held = std::mem::take(&mut self.held);
        let mut rest = chunk;
        if !held.is_empty() {
            // Settle the held bytes with just enough of the chunk to decide every match that
            // starts in them, rather than copying the whole chunk behind them.
            let held_before = held.len();
            let hold_back = self.scrubber.max_pattern_len.saturating_sub(1);
            let (head, tail) = chunk.split_at(hold_back.min(chunk.len()));
            held.extend_from_slice(head);
            let consumed = self.scrub_part(&held, Flush::Settled, &mut out);
            if tail.is_empty() {
                held.drain(..consumed);
                self.held = held;
                return Bytes::from(out);
            }
            // `head` is a whole hold-back long, so everything held before it is settled and
            // `consumed` lies in `head`: a point from which a fresh search finds what a search
            // of all the input would.
            debug_assert!(consumed >= held_before);
            rest = &chunk[consumed - held_before..];
            held.clear();
        }
        let consumed = self.scrub_part(rest, Flush::Settled, &mut out);
        held.extend_from_slice(&rest[consumed..]);
        self.held = held;
        Bytes::from(out)
    }

    /// [`push`](Self::push) for a chunk the caller already holds as [`Bytes`]: when nothing is
    /// held and no secret starts in the settled part, that part is returned as a slice of
    /// `chunk`, without a copy (the common case: most bodies hold no secret).
    pub fn push_bytes(&mut self, chunk: Bytes) -> Bytes {
        if self.scrubber.is_empty() {
            return chunk;
        }
        if !self.held.is_empty() {
            return self.push(&chunk);
        }
        let settled = self.scrubber.unsettled_from(&chunk);
        let mut redacts = false;
        self.scrubber.for_each_match(&chunk, |found| {
            redacts = found.start() < settled;
            ControlFlow::Break(())
        });
        if redacts {
            return self.push(&chunk);
        }
        // Exactly what `scrub_into` would emit with no match before `settled`.
        self.held.extend_from_slice(&chunk[settled..]);
        chunk.slice(..settled)
    }

    /// End of the body: returns the remaining bytes, scrubbed. The scrubber is then empty; a
    /// later push starts a new body (the redaction counts carry on).
    pub fn finish(&mut self) -> Bytes {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::with_capacity(held.len());
        self.scrub_part(&held, Flush::All, &mut out);
        Bytes::from(out)
    }

    /// Redactions made so far.
    pub fn redactions(&self) -> usize {
        self.redactions
    }

    /// Names redacted so far, each once, in the order first redacted.
    pub fn redacted_names(&self) -> Vec<Arc<str>> {
        self.redacted_names.clone()
    }

    /// [`Scrubber::scrub_into`], counting the redactions.
    fn scrub_part(&mut self, part: &[u8], flush: Flush, out: &mut Vec<u8>) -> usize {
        let Self {
            scrubber,
            redactions,
            name_seen,
            redacted_names,
            ..
        } = self;
        scrubber.scrub_into(part, flush, out, |name| {
            *redactions += 1;
            if !name_seen[name] {
                name_seen[name] = true;
                redacted_names.push(Arc::clone(&scrubber.names[name]));
            }
        })
    }
}

impl fmt::Debug for StreamScrubber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamScrubber")
            .field("held_bytes", &self.held.len())
            .field("redactions", &self.redactions)
            .field("redacted_names", &self.redacted_names)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
#[path = "scrub_tests.rs"]
mod tests;

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
//! use latchkey::secrets::scrub::{ScrubSecret, Scrubber};
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
//! # Ok::<(), latchkey::secrets::scrub::ScrubError>(())
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
//!   short escapes (`\n`, `\t`, …) where JSON has one or always as `\u00XX`; `\u` hex in lower or
//!   upper case; non-ASCII as is or as `\uXXXX` (UTF-16, so surrogate pairs above U+FFFF); and
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
use base64::Engine as _;
use bytes::Bytes;
use zeroize::{Zeroize, Zeroizing};

/// Secrets shorter than this are refused: they would match noise.
pub const MIN_SECRET_LEN: usize = 8;

/// Variants shorter than this are not looked for (for example a tiny base64 fragment).
pub const MIN_VARIANT_LEN: usize = 6;

/// Up to this many bytes of variants, the automaton is a full DFA: the fastest to search, and
/// still small at that size (a few MiB at most). Past it, `aho-corasick` picks a leaner form.
const DFA_PATTERN_BYTES_LIMIT: usize = 64 * 1024;

/// The most bytes one byte of a secret becomes in any variant (a control character as `\u00XX`).
const MAX_EXPANSION: usize = 6;

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

/// A fast test that most of a haystack holds no variant, so the automaton need not read it.
///
/// Every `q`-byte substring (*gram*) of every variant is hashed into a bit table. A haystack is
/// sampled every `stride` bytes, `stride = shortest variant - q + 1`, so every occurrence of a
/// variant, being at least that long, contains a whole sampled gram, whose bit is set. Around a
/// sample whose bit is set, the window that could hold such an occurrence (`max_pattern_len`
/// either side) is a candidate; everywhere else is ruled out. With 128 table bits per gram,
/// about one sample in 128 of unrelated input is a false candidate.
struct Sieve {
    /// Gram length in bytes, 4 to 8.
    gram_len: usize,
    /// Distance between samples; at least 1.
    stride: usize,
    /// Keeps the low `gram_len` bytes of a little-endian `u64`.
    gram_mask: u64,
    /// `64 - log2(table bits)`: a hash's top bits index the table.
    hash_shift: u32,
    table: Box<[u64]>,
}

impl Sieve {
    /// Bits in the table per gram: the table's fill, so the false-candidate rate, is about 1/128.
    const BITS_PER_GRAM: usize = 128;
    const MIN_TABLE_BITS: usize = 1 << 12;
    /// 2 MiB. Past it the table would be too full to rule much out; the automaton then reads the
    /// whole haystack.
    const MAX_TABLE_BITS: usize = 1 << 24;

    fn build(patterns: &[&[u8]]) -> Option<Sieve> {
        let shortest = patterns.iter().map(|p| p.len()).min()?;
        // Long grams are more selective, short ones allow a longer stride; half the shortest
        // variant balances the two.
        let gram_len = (shortest / 2).clamp(4, 8);
        if shortest < gram_len {
            return None;
        }
        let stride = shortest - gram_len + 1;
        let grams: usize = patterns.iter().map(|p| p.len() - gram_len + 1).sum();
        let table_bits = grams
            .checked_mul(Self::BITS_PER_GRAM)?
            .next_power_of_two()
            .max(Self::MIN_TABLE_BITS);
        if table_bits > Self::MAX_TABLE_BITS {
            return None;
        }
        let mut sieve = Sieve {
            gram_len,
            stride,
            gram_mask: u64::MAX >> (8 * (8 - gram_len)),
            hash_shift: 64 - table_bits.trailing_zeros(),
            table: vec![0u64; table_bits / 64].into_boxed_slice(),
        };
        for pattern in patterns {
            for at in 0..=pattern.len() - gram_len {
                let bit = sieve.bit_of(sieve.gram_at(pattern, at));
                sieve.table[bit / 64] |= 1 << (bit % 64);
            }
        }
        Some(sieve)
    }

    /// The gram starting at `at`, as the low bytes of a little-endian `u64`. `at + gram_len`
    /// must not pass the end of `bytes`.
    #[inline]
    fn gram_at(&self, bytes: &[u8], at: usize) -> u64 {
        let word = match bytes.get(at..at + 8) {
            Some(eight) => {
                let mut word = [0u8; 8];
                word.copy_from_slice(eight);
                word
            }
            None => {
                let mut word = [0u8; 8];
                let tail = bytes.get(at..).unwrap_or_default();
                word[..tail.len()].copy_from_slice(tail);
                word
            }
        };
        u64::from_le_bytes(word) & self.gram_mask
    }

    #[inline]
    fn bit_of(&self, gram: u64) -> usize {
        (gram.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.hash_shift) as usize
    }

    #[inline]
    fn may_hold(&self, haystack: &[u8], at: usize) -> bool {
        let bit = self.bit_of(self.gram_at(haystack, at));
        self.table[bit / 64] & (1 << (bit % 64)) != 0
    }

    /// The windows of `haystack` that may hold a variant, in order of their start (they may
    /// overlap). Every occurrence of a variant lies wholly inside at least one of them.
    fn candidate_windows<'h>(
        &'h self,
        haystack: &'h [u8],
        max_pattern_len: usize,
    ) -> impl Iterator<Item = Range<usize>> + 'h {
        let samples = haystack
            .len()
            .checked_sub(self.gram_len)
            .map_or(0, |last| last / self.stride + 1);
        (0..samples)
            .map(move |i| i * self.stride)
            .filter(move |&at| self.may_hold(haystack, at))
            .map(move |at| {
                // An occurrence holding the gram at `at` starts no earlier than
                // `at + gram_len - max_pattern_len` and ends no later than `at + max_pattern_len`.
                let start = (at + self.gram_len).saturating_sub(max_pattern_len);
                let end = (at + max_pattern_len).min(haystack.len());
                start..end
            })
    }
}

impl Drop for Sieve {
    fn drop(&mut self) {
        self.table.zeroize();
    }
}

/// Every encoding of `value` the scrubber looks for, raw first, possibly with repeats and
/// variants too short to use (the caller drops those).
fn variants_of(value: &[u8]) -> Vec<Zeroizing<Vec<u8>>> {
    let mut variants = vec![Zeroizing::new(value.to_vec())];
    for engine in [
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for alignment in 0..3 {
            variants.push(base64_aligned(engine, value, alignment));
        }
    }
    // A form or style that would write the value unchanged adds nothing (the duplicate would
    // be dropped in `Scrubber::new`): skip building it. Tokens and API keys are mostly such
    // values, and the 42 copies would be most of the cost of building the matcher.
    for upper in [true, false] {
        for form in PercentForm::ALL {
            if !value.iter().all(|&b| form.keeps(b)) {
                variants.push(percent_encoded(value, form, upper));
            }
        }
    }
    // Printable ASCII without `"`, `\`, `/`, `<`, `>`, `&` is written as is by every style.
    let json_plain = value
        .iter()
        .all(|&b| (b' '..=b'~').contains(&b) && !b"\"\\/<>&".contains(&b));
    if json_plain {
        return variants;
    }
    for bits in 0..(1u8 << 5) {
        let style = JsonStyle {
            escape_slash: bits & 1 != 0,
            short_controls: bits & 2 != 0,
            upper_hex: bits & 4 != 0,
            escape_non_ascii: bits & 8 != 0,
            escape_html: bits & 16 != 0,
        };
        variants.push(json_escaped(value, style));
    }
    variants
}

/// The base64 characters fully determined by `value` when it starts at byte offset
/// `alignment` (0, 1 or 2) modulo 3 inside a larger encoded blob.
fn base64_aligned(
    engine: &base64::engine::GeneralPurpose,
    value: &[u8],
    alignment: usize,
) -> Zeroizing<Vec<u8>> {
    let mut shifted = Zeroizing::new(Vec::with_capacity(alignment + value.len()));
    shifted.resize(alignment, 0);
    shifted.extend_from_slice(value);
    let Some(encoded_len) = base64::encoded_len(shifted.len(), false) else {
        return Zeroizing::new(Vec::new());
    };
    let mut encoded = Zeroizing::new(vec![0u8; encoded_len]);
    if engine
        .encode_slice(shifted.as_slice(), encoded.as_mut_slice())
        .is_err()
    {
        return Zeroizing::new(Vec::new());
    }
    // Character i carries bits 6i..6i+6; the secret has bits 8a..8(a+n).
    let first = (8 * alignment).div_ceil(6);
    let end = (8 * (alignment + value.len())) / 6;
    encoded.copy_within(first..end, 0);
    encoded.truncate(end - first);
    encoded
}

/// Which bytes a percent-encoder leaves as they are.
#[derive(Clone, Copy)]
enum PercentForm {
    /// Python `quote(v, safe='')`: only the unreserved `A-Za-z0-9-._~`.
    Unreserved,
    /// Python `quote(v)`: unreserved and `/`.
    UnreservedAndSlash,
    /// JavaScript `encodeURIComponent`: unreserved and `!'()*`.
    UriComponent,
    /// Only RFC 3986 reserved characters, `%` and bytes never literal in a URL are encoded.
    ReservedOnly,
    /// `application/x-www-form-urlencoded`: unreserved kept, space as `+`.
    Form,
    /// Every byte but `A-Za-z0-9` (Rust `percent_encoding::NON_ALPHANUMERIC`, PHP-style
    /// over-encoders): `-` and `.` become `%2D`, `%2E`.
    Alphanumeric,
    /// Java `URLEncoder`: alphanumerics and `-._*` kept, space as `+`, `~` encoded.
    Java,
}

impl PercentForm {
    const ALL: [PercentForm; 7] = [
        PercentForm::Unreserved,
        PercentForm::UnreservedAndSlash,
        PercentForm::UriComponent,
        PercentForm::ReservedOnly,
        PercentForm::Form,
        PercentForm::Alphanumeric,
        PercentForm::Java,
    ];

    fn keeps(self, byte: u8) -> bool {
        let unreserved = byte.is_ascii_alphanumeric() || b"-._~".contains(&byte);
        match self {
            PercentForm::Unreserved | PercentForm::Form => unreserved,
            PercentForm::UnreservedAndSlash => unreserved || byte == b'/',
            PercentForm::UriComponent => unreserved || b"!'()*".contains(&byte),
            PercentForm::ReservedOnly => {
                byte.is_ascii_graphic() && !b":/?#[]@!$&'()*+,;=%".contains(&byte)
            }
            PercentForm::Alphanumeric => byte.is_ascii_alphanumeric(),
            PercentForm::Java => byte.is_ascii_alphanumeric() || b"-._*".contains(&byte),
        }
    }
}

fn percent_encoded(value: &[u8], form: PercentForm, upper: bool) -> Zeroizing<Vec<u8>> {
    let digits = hex_digits(upper);
    let mut out = Zeroizing::new(Vec::with_capacity(value.len() * MAX_EXPANSION));
    for &byte in value {
        if form.keeps(byte) {
            out.push(byte);
        } else if matches!(form, PercentForm::Form | PercentForm::Java) && byte == b' ' {
            out.push(b'+');
        } else {
            out.extend_from_slice(&[
                b'%',
                digits[usize::from(byte >> 4)],
                digits[usize::from(byte & 0xf)],
            ]);
        }
    }
    out
}

/// One way of writing a value inside a JSON string.
#[derive(Clone, Copy)]
struct JsonStyle {
    /// `/` as `\/`.
    escape_slash: bool,
    /// `\b`, `\f`, `\n`, `\r`, `\t` rather than `\u00XX`.
    short_controls: bool,
    /// Hex digits of `\u` escapes in upper case.
    upper_hex: bool,
    /// Every non-ASCII character as `\uXXXX` (Python's `ensure_ascii`).
    escape_non_ascii: bool,
    /// Go's HTML-safe escaping: `<`, `>`, `&`, U+2028 and U+2029 as `\uXXXX`.
    escape_html: bool,
}

/// `value` as it appears between the quotes of a JSON string written in `style`. Bytes that are
/// not UTF-8 are kept as they are (no JSON encoder writes them; a lenient one may pass them on).
fn json_escaped(value: &[u8], style: JsonStyle) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(value.len() * MAX_EXPANSION));
    for chunk in value.utf8_chunks() {
        for c in chunk.valid().chars() {
            let short = match c {
                '"' => Some(b'"'),
                '\\' => Some(b'\\'),
                '/' if style.escape_slash => Some(b'/'),
                '\u{8}' if style.short_controls => Some(b'b'),
                '\u{c}' if style.short_controls => Some(b'f'),
                '\n' if style.short_controls => Some(b'n'),
                '\r' if style.short_controls => Some(b'r'),
                '\t' if style.short_controls => Some(b't'),
                _ => None,
            };
            let as_unicode_escape = c < ' '
                || (style.escape_html && matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}'))
                || (style.escape_non_ascii && !c.is_ascii());
            if let Some(letter) = short {
                out.extend_from_slice(&[b'\\', letter]);
            } else if as_unicode_escape {
                let mut units = [0u16; 2];
                for &unit in c.encode_utf16(&mut units).iter() {
                    push_unicode_escape(&mut out, unit, style.upper_hex);
                }
            } else {
                let mut utf8 = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
            }
        }
        out.extend_from_slice(chunk.invalid());
    }
    out
}

fn push_unicode_escape(out: &mut Vec<u8>, unit: u16, upper: bool) {
    let digits = hex_digits(upper);
    let nibble = |shift: u16| digits[usize::from((unit >> shift) & 0xf)];
    out.extend_from_slice(&[b'\\', b'u', nibble(12), nibble(8), nibble(4), nibble(0)]);
}

fn hex_digits(upper: bool) -> &'static [u8; 16] {
    if upper {
        b"0123456789ABCDEF"
    } else {
        b"0123456789abcdef"
    }
}

#[cfg(test)]
#[path = "scrub_tests.rs"]
mod tests;

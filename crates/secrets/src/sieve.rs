//! The scrubber's sieve: a bit table of every variant's substrings that rules out the stretches
//! of a haystack where no variant can be, so the automaton reads only the rest (see the
//! [`super::scrub`] docs, "Matching"). Holds hashes of secret material: wiped on drop.

use std::ops::Range;

use zeroize::Zeroize;

/// A fast test that most of a haystack holds no variant, so the automaton need not read it.
///
/// Every `q`-byte substring (*gram*) of every variant is hashed into a bit table. A haystack is
/// sampled every `stride` bytes, `stride = shortest variant - q + 1`, so every occurrence of a
/// variant, being at least that long, contains a whole sampled gram, whose bit is set. Around a
/// sample whose bit is set, the window that could hold such an occurrence (`max_pattern_len`
/// either side) is a candidate; everywhere else is ruled out. With 128 table bits per gram,
/// about one sample in 128 of unrelated input is a false candidate.
pub(super) struct Sieve {
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

    pub(super) fn build(patterns: &[&[u8]]) -> Option<Sieve> {
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
    pub(super) fn candidate_windows<'h>(
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

//! What a record's text is scrubbed through: the one thing `audit` and `secrets` agree on.
//! Audit holds only this trait; `secrets` implements it for its store, so a record never sees
//! a secret store or a value, and neither crate depends on the other.

use std::borrow::Cow;

/// Replaces secret values in text with `[REDACTED:name]`. The record and the log see only what
/// this returns, never a secret store or a value; implemented where secrets are known (`secrets`, for
/// its store; the proxy gives each entry the store in force).
pub trait Scrub: Send + Sync {
    /// `text` with every secret value in force replaced; borrowed when there was none. Text
    /// that cannot be scanned comes back as `[REDACTED:unscannable]`, never as it was.
    fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str>;

    /// Scrubs several texts in place; an implementation may look up the secrets in force once
    /// for all of them (a record's URL fields are scrubbed together).
    fn scrub_in_place(&self, texts: &mut [&mut String]) {
        for t in texts.iter_mut() {
            if let Cow::Owned(clean) = self.scrub(t) {
                **t = clean;
            }
        }
    }
}

impl<F> Scrub for F
where
    F: for<'a> Fn(&'a str) -> Cow<'a, str> + Send + Sync,
{
    fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        self(text)
    }
}

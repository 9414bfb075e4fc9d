//! How an audit entry scrubs its text with the secrets in force without seeing them:
//! [`Scrub`] (defined in `wire`, which audit and secrets share) for [`SecretStore`]. Audit
//! depends on the trait only.

use std::borrow::Cow;

use crate::wire::redact::Scrub;
use crate::SecretStore;

/// What replaces a text that could not be scanned: none of it is kept.
const UNSCANNABLE: &str = "[REDACTED:unscannable]";

impl Scrub for SecretStore {
    fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match self.scrubber() {
            Ok(Some(s)) => scrub_one(&s, text),
            Ok(None) => Cow::Borrowed(text),
            Err(_) => Cow::Borrowed(UNSCANNABLE),
        }
    }

    /// One look-up of the secrets in force for every field of a record.
    fn scrub_in_place(&self, texts: &mut [&mut String]) {
        let scrubber = match self.scrubber() {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(_) => {
                for t in texts.iter_mut() {
                    **t = UNSCANNABLE.to_string();
                }
                return;
            }
        };
        for t in texts.iter_mut() {
            if let Cow::Owned(clean) = scrub_one(&scrubber, t) {
                **t = clean;
            }
        }
    }
}

/// `find` first: it visits the same matches `scrub` replaces, so a text without any (the usual
/// case) is neither copied nor allocated for.
fn scrub_one<'a>(s: &crate::scrub::Scrubber, text: &'a str) -> Cow<'a, str> {
    if s.find(text.as_bytes()).is_none() {
        return Cow::Borrowed(text);
    }
    let (out, names) = s.scrub(text.as_bytes());
    if names.is_empty() {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(String::from_utf8_lossy(&out).into_owned())
    }
}

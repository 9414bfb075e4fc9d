//! [`SecretValue`]: bytes that cannot be printed, serialised or compared in variable time.

use std::fmt;
use std::sync::Arc;

use zeroize::Zeroizing;

/// A secret's value. It has no `Display` and no `Serialize`; `Debug` prints a placeholder; the
/// bytes are wiped when the last clone drops; equality is constant-time. The only way to the
/// bytes is [`SecretValue::expose`], whose call sites are where a secret legitimately leaves
/// latchkey (an injected header) or is looked for (redaction).
///
/// Shared, not copied: a clone (every `SecretStore::get`, every token handed out) is a
/// reference count, so the hot path neither allocates nor leaves copies to wipe.
#[derive(Clone)]
pub struct SecretValue(Arc<Zeroizing<Vec<u8>>>);

impl SecretValue {
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(Arc::new(Zeroizing::new(bytes)))
    }

    /// The raw bytes. Keep the result short-lived and never format it.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Constant-time comparison with other bytes.
    pub fn ct_eq(&self, other: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        self.0.len() == other.len() && bool::from(self.0.as_slice().ct_eq(other))
    }
}

impl PartialEq for SecretValue {
    fn eq(&self, other: &Self) -> bool {
        self.ct_eq(&other.0)
    }
}

impl Eq for SecretValue {}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let v = SecretValue::new(b"sk-very-secret-value".to_vec());
        let printed = format!("{v:?} {:?} {:#?}", Some(&v), vec![v.clone()]);
        assert!(!printed.contains("very-secret"), "{printed}");
    }

    #[test]
    fn comparison_is_by_value() {
        let a = SecretValue::new(b"abcdefgh".to_vec());
        assert!(a.ct_eq(b"abcdefgh"));
        assert!(!a.ct_eq(b"abcdefgi"));
        assert!(!a.ct_eq(b"abcdefg"));
        assert_eq!(a, SecretValue::new(b"abcdefgh".to_vec()));
    }
}

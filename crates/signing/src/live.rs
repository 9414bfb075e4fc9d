//! The live credential state one policy generation runs with: its secrets' values (over the
//! redaction set every generation shares), the tokens minted for its credentials, and the
//! tokens captured from responses. The compiled policy holds none of it — only the
//! declarations — so a reload [`Live::reconcile`]s this state against the new declarations
//! instead of moving it: what is unchanged is shared, what changed is resolved anew, what was
//! removed is left behind with the requests still running on the old generation.

use std::sync::Arc;

use super::{field_key, TokenCache};
use crate::secrets::captured::Captured;
use crate::secrets::{SecretStore, Source};

/// A generation's secret values, minted tokens and captured tokens (see the module docs).
pub struct Live {
    secrets: Arc<SecretStore>,
    tokens: TokenCache,
    /// One for every generation: captured tokens are kept per identity, not per policy.
    captured: Arc<Captured>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

impl Live {
    /// The first generation's state: every declared `env:` and `file:` secret read now.
    /// Returns every failure by name.
    pub fn resolve(
        declared: &[(String, Source)],
        captured: Arc<Captured>,
    ) -> Result<Live, Vec<(String, String)>> {
        Ok(Live {
            secrets: Arc::new(SecretStore::load(declared.to_vec())?),
            tokens: TokenCache::default(),
            captured,
        })
    }

    /// The next generation's state, declaring `declared`: see [`SecretStore::reconcile`]. A
    /// credential keeps its tokens when `unchanged` says its definition is the same and the
    /// declarations of its key material kept their slots; the others mint anew. Nothing is in
    /// force until [`Live::take_over`]; a failure leaves everything as it was.
    pub fn reconcile(
        &self,
        declared: &[(String, Source)],
        unchanged: impl Fn(&str) -> bool,
    ) -> Result<Live, Vec<(String, String)>> {
        let secrets = self.secrets.reconcile(declared)?;
        let tokens = self.tokens.carry(|credential| {
            unchanged(credential) && secrets.same_slots(&self.secrets, &field_key(credential, ""))
        });
        Ok(Live {
            secrets: Arc::new(secrets),
            tokens,
            captured: self.captured.clone(),
        })
    }

    /// Puts this state in force in place of `previous`'s (see [`SecretStore::take_over`]).
    pub fn take_over(&self, previous: &Live) {
        self.secrets.take_over(&previous.secrets);
    }

    /// The secrets of this generation.
    pub fn secrets(&self) -> &Arc<SecretStore> {
        &self.secrets
    }

    /// The tokens minted for this generation's credentials.
    pub fn tokens(&self) -> &TokenCache {
        &self.tokens
    }

    /// The captured tokens (the same for every generation).
    pub fn captured(&self) -> &Arc<Captured> {
        &self.captured
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::SecretValue;
    use std::time::Duration;

    fn file(dir: &std::path::Path, name: &str, value: &str) -> Source {
        let p = dir.join(name);
        std::fs::write(&p, value).expect("write");
        Source::File(p)
    }

    async fn mint(live: &Live, credential: &str, value: &'static str) -> SecretValue {
        live.tokens()
            .get(credential, Duration::ZERO, || async move {
                Ok((
                    SecretValue::new(value.as_bytes().to_vec()),
                    Duration::from_secs(3600),
                ))
            })
            .await
            .expect("minted")
    }

    #[tokio::test]
    async fn a_credential_keeps_its_token_only_while_its_definition_and_key_material_stay() {
        let dir = tempfile::tempdir().expect("tmp");
        let declared = vec![
            (
                field_key("a", "key"),
                file(dir.path(), "a", "key-a-0123456789"),
            ),
            (
                field_key("b", "key"),
                file(dir.path(), "b", "key-b-0123456789"),
            ),
            (
                field_key("c", "key"),
                file(dir.path(), "c", "key-c-0123456789"),
            ),
        ];
        let old = Live::resolve(&declared, Arc::new(Captured::in_memory())).expect("resolve");
        for c in ["a", "b", "c"] {
            mint(&old, c, "first-token-0123").await;
        }
        // `b`'s key moves to another file; `c`'s definition changes; `a` is untouched.
        let mut next = declared.clone();
        next[1].1 = file(dir.path(), "b2", "key-b-moved-0123");
        let new = old.reconcile(&next, |c| c != "c").expect("reconcile");
        new.take_over(&old);
        assert_eq!(
            mint(&new, "a", "second-token-01").await.expose(),
            b"first-token-0123"
        );
        assert_eq!(
            mint(&new, "b", "second-token-01").await.expose(),
            b"second-token-01"
        );
        assert_eq!(
            mint(&new, "c", "second-token-01").await.expose(),
            b"second-token-01"
        );
        // The captured tokens are the same object in every generation.
        assert!(Arc::ptr_eq(old.captured(), new.captured()));
    }
}

//! Value templates: literal text with `{{secret.NAME}}` references, resolved per request.

use super::{SecretError, SecretStore};

/// A template could not be parsed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    #[error("unclosed '{{{{' in template")]
    Unclosed,
    #[error("unknown template {{{{{0}}}}}: use {{{{secret.NAME}}}} or {{{{identity}}}}")]
    UnknownKind(String),
    #[error("invalid secret name {0:?} in template")]
    BadName(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Secret(String),
    /// The name of the identity making the request.
    Identity,
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

/// Whether a secret name is well formed (also what placeholders may name).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !name.contains("__")
}

impl Template {
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find("{{") {
            if start > 0 {
                parts.push(Part::Lit(rest[..start].to_string()));
            }
            let after = &rest[start + 2..];
            let end = after.find("}}").ok_or(TemplateError::Unclosed)?;
            let inner = after[..end].trim();
            if inner == "identity" {
                parts.push(Part::Identity);
                rest = &after[end + 2..];
                continue;
            }
            let name = inner
                .strip_prefix("secret.")
                .ok_or_else(|| TemplateError::UnknownKind(inner.to_string()))?;
            if !valid_name(name) {
                return Err(TemplateError::BadName(name.to_string()));
            }
            parts.push(Part::Secret(name.to_string()));
            rest = &after[end + 2..];
        }
        if !rest.is_empty() {
            parts.push(Part::Lit(rest.to_string()));
        }
        Ok(Self { parts })
    }

    /// Names of the secrets referenced.
    pub fn secrets(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Secret(s) => Some(s.as_str()),
            Part::Lit(_) | Part::Identity => None,
        })
    }

    /// The template with every reference (`{{secret.NAME}}`, `{{identity}}`) replaced by
    /// `stand_in`: its literal shape, for checks made when a policy is compiled.
    pub fn shape(&self, stand_in: &str) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Lit(l) => l.as_str(),
                Part::Secret(_) | Part::Identity => stand_in,
            })
            .collect()
    }

    /// Renders the template. The result holds secret bytes: wipe it (it is `Zeroizing`).
    ///
    /// The values are fetched first and the output sized to fit them, so it is written once
    /// and never reallocated: growing it would leave unwiped copies of the secret behind.
    pub async fn render(
        &self,
        store: &SecretStore,
        identity: &str,
    ) -> Result<zeroize::Zeroizing<Vec<u8>>, SecretError> {
        self.render_where(store, identity, |_| Ok(())).await
    }

    /// Renders the template like [`Self::render`], each secret's value first checked by `fits`
    /// (where it goes may not hold every byte: a URL path). A value `fits` refuses makes the
    /// secret unavailable, the error naming the secret and why, never the value.
    pub async fn render_where(
        &self,
        store: &SecretStore,
        identity: &str,
        fits: impl Fn(&[u8]) -> Result<(), String>,
    ) -> Result<zeroize::Zeroizing<Vec<u8>>, SecretError> {
        // `SecretValue`s wipe themselves on drop.
        let mut values = Vec::with_capacity(self.secrets().count());
        for name in self.secrets() {
            let value = store.get(name).await?;
            fits(value.expose()).map_err(|why| SecretError::Unavailable {
                name: name.to_string(),
                why,
            })?;
            values.push(value);
        }
        let len: usize = self
            .parts
            .iter()
            .map(|p| match p {
                Part::Lit(l) => l.len(),
                Part::Identity => identity.len(),
                Part::Secret(_) => 0,
            })
            .sum::<usize>()
            + values.iter().map(|v| v.len()).sum::<usize>();
        let mut out = zeroize::Zeroizing::new(Vec::with_capacity(len));
        let mut values = values.iter();
        for part in &self.parts {
            match part {
                Part::Lit(l) => out.extend_from_slice(l.as_bytes()),
                Part::Secret(_) => {
                    if let Some(v) = values.next() {
                        out.extend_from_slice(v.expose());
                    }
                }
                Part::Identity => out.extend_from_slice(identity.as_bytes()),
            }
        }
        debug_assert_eq!(out.len(), out.capacity());
        Ok(out)
    }
}

/// The template as written (references by name; it holds no value).
impl std::fmt::Display for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for p in &self.parts {
            match p {
                Part::Lit(l) => f.write_str(l)?,
                Part::Secret(name) => write!(f, "{{{{secret.{name}}}}}")?,
                Part::Identity => f.write_str("{{identity}}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_literals_and_secret_references() {
        let t = Template::parse("Bearer {{secret.openai}}").expect("parse");
        assert_eq!(t.secrets().collect::<Vec<_>>(), ["openai"]);
        let t = Template::parse("{{ secret.a }}:{{secret.b}}").expect("parse");
        assert_eq!(t.secrets().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(
            Template::parse("plain").expect("parse").secrets().count(),
            0
        );
    }

    #[tokio::test]
    async fn render_sizes_its_buffer_once_for_every_part() {
        let dir = tempfile::tempdir().expect("tmp");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "sk-first-secret-0123456789\n").expect("write");
        std::fs::write(&b, "second-secret-abcdefghijklmnopqrstuvwxyz").expect("write");
        let store = SecretStore::load(vec![
            ("a".into(), crate::Source::File(a)),
            ("b".into(), crate::Source::File(b)),
        ])
        .expect("load");
        let t = Template::parse("Bearer {{secret.a}}:{{identity}}/{{ secret.b }}!").expect("parse");
        let out = t.render(&store, "ci-agent").await.expect("render");
        let want =
            b"Bearer sk-first-secret-0123456789:ci-agent/second-secret-abcdefghijklmnopqrstuvwxyz!";
        assert_eq!(&out[..], &want[..]);
        // Exactly sized: it was never grown, so no copy of a secret was left in a freed buffer.
        assert_eq!(out.capacity(), out.len());
        assert!(matches!(
            Template::parse("{{secret.nope}}")
                .expect("parse")
                .render(&store, "x")
                .await,
            Err(SecretError::Unknown(_))
        ));
    }

    #[test]
    fn shows_itself_as_written_and_its_literal_shape() {
        let t = Template::parse("/bot{{ secret.tg }}/{{identity}}").expect("parse");
        assert_eq!(t.to_string(), "/bot{{secret.tg}}/{{identity}}");
        assert_eq!(t.shape("x"), "/botx/x");
    }

    #[test]
    fn rejects_unknown_and_malformed_templates() {
        assert_eq!(Template::parse("{{secret.a"), Err(TemplateError::Unclosed));
        assert!(matches!(
            Template::parse("{{env.X}}"),
            Err(TemplateError::UnknownKind(_))
        ));
        assert!(matches!(
            Template::parse("{{secret.a b}}"),
            Err(TemplateError::BadName(_))
        ));
    }
}

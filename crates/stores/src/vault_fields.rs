//! The fields of one Vault read, as secret values, and picking the one a secret names.
//!
//! A string field is its text, a number or boolean its JSON text; an object, a list or `null`
//! is kept only as its kind, so an error can say what it is without showing it. Errors name
//! fields, never values.

use crate::secrets::SecretValue;

/// How many field names an error lists.
const MAX_NAMES: usize = 20;

/// The longest field name an error shows whole.
const MAX_NAME_LEN: usize = 64;

/// One read's fields, sorted by name.
pub(crate) struct Fields(Vec<(String, Field)>);

enum Field {
    Text(SecretValue),
    /// An object, a list or `null`: not a secret value latchkey can send.
    Other(&'static str),
}

impl Fields {
    /// The fields of `data` (its strings move into secret values, not copied).
    pub(crate) fn from_json(data: serde_json::Map<String, serde_json::Value>) -> Self {
        use serde_json::Value;
        let fields = data
            .into_iter()
            .map(|(name, v)| {
                let field = match v {
                    Value::String(s) => Field::Text(SecretValue::new(s.into_bytes())),
                    Value::Number(n) => Field::Text(SecretValue::new(n.to_string().into_bytes())),
                    Value::Bool(b) => Field::Text(SecretValue::new(b.to_string().into_bytes())),
                    Value::Object(_) => Field::Other("an object"),
                    Value::Array(_) => Field::Other("a list"),
                    Value::Null => Field::Other("null"),
                };
                (name, field)
            })
            .collect();
        Self(fields)
    }

    /// The field `field` names, or the only one when it names none.
    pub(crate) fn pick(&self, field: Option<&str>) -> Result<SecretValue, String> {
        let (name, found) = match field {
            Some(want) => self
                .0
                .iter()
                .find(|(name, _)| name == want)
                .ok_or_else(|| format!("no field {:?} ({})", short(want), self.names()))?,
            None => match self.0.as_slice() {
                [only] => only,
                [] => return Err("the secret has no fields".into()),
                _ => {
                    return Err(format!(
                        "the secret has {} fields ({}): name one with #FIELD",
                        self.0.len(),
                        self.names()
                    ))
                }
            },
        };
        match found {
            Field::Text(v) => Ok(v.clone()),
            Field::Other(kind) => Err(format!(
                "field {:?} is {kind}, not a string, number or boolean",
                short(name)
            )),
        }
    }

    /// `fields: a, b, c` (at most [`MAX_NAMES`]).
    fn names(&self) -> String {
        if self.0.is_empty() {
            return "the secret has no fields".into();
        }
        let mut names: Vec<String> = self
            .0
            .iter()
            .take(MAX_NAMES)
            .map(|(n, _)| format!("{:?}", short(n)))
            .collect();
        if self.0.len() > MAX_NAMES {
            names.push(format!("and {} more", self.0.len() - MAX_NAMES));
        }
        format!("fields: {}", names.join(", "))
    }
}

fn short(name: &str) -> &str {
    match name.char_indices().nth(MAX_NAME_LEN) {
        Some((at, _)) => &name[..at],
        None => name,
    }
}

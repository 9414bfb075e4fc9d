//! The price table: what a model's tokens cost, to turn LLM usage into money for `spend`
//! budgets. Latchkey ships a dated default (`prices.toml` beside this file, compiled in);
//! a policy's `[prices."MODEL"]` tables override or extend it.
//!
//! Prices are USD per million tokens. A model is found by its exact name, else by the longest
//! entry that is a prefix of it followed by `-` or `@` (so `gpt-4o-2024-08-06` costs what
//! `gpt-4o` costs, and `gpt-4o-mini` is its own entry). A model the table does not know has no
//! price: a `spend` budget refuses its calls rather than count them as free.

use std::collections::BTreeMap;

/// The default table's text, compiled in.
pub const DEFAULT_PRICES: &str = include_str!("prices.toml");

/// One model's prices, USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Input tokens served from the provider's prompt cache; `input` when not given.
    pub cached_input: Option<f64>,
}

impl Price {
    /// The cost in micro-USD (rounded up) of `input` fresh input tokens, `cached` cached input
    /// tokens and `output` output tokens.
    pub fn cost_micros(&self, input: u64, cached: u64, output: u64) -> u64 {
        // USD per million tokens is exactly micro-USD per token.
        let total = input as f64 * self.input
            + cached as f64 * self.cached_input.unwrap_or(self.input)
            + output as f64 * self.output;
        if total.is_finite() && total > 0.0 {
            total.ceil().min(u64::MAX as f64) as u64
        } else {
            0
        }
    }
}

/// The prices in force: the shipped default with the policy's overrides.
#[derive(Debug, Clone, PartialEq)]
pub struct PriceTable {
    /// Where the default came from, as its file says.
    pub source: String,
    /// The date the default was compiled (`YYYY-MM-DD`).
    pub date: String,
    models: BTreeMap<String, Price>,
    /// Models a policy set (for `check` and `explain`).
    overridden: Vec<String>,
}

/// A problem in a price table file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("price table: {0}")]
pub struct PriceError(pub String);

impl PriceTable {
    /// The shipped default table.
    pub fn shipped() -> Result<PriceTable, PriceError> {
        Self::parse(DEFAULT_PRICES)
    }

    /// Parses a table in the shipped file's format:
    ///
    /// ```text
    /// source = "…"
    /// date = "2026-12-02"
    /// [models."gpt-4o"]
    /// input = 2.5
    /// output = 10.0
    /// cached_input = 1.25
    /// ```
    pub fn parse(text: &str) -> Result<PriceTable, PriceError> {
        let doc: toml::Table = text.parse().map_err(|e| PriceError(format!("{e}")))?;
        let string = |key: &str| {
            doc.get(key)
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .ok_or_else(|| PriceError(format!("`{key}` (a string) is missing")))
        };
        let source = string("source")?;
        let date = string("date")?;
        let mut models = BTreeMap::new();
        let table = doc
            .get("models")
            .and_then(|m| m.as_table())
            .ok_or_else(|| PriceError("`[models.NAME]` tables are missing".to_string()))?;
        for (name, v) in table {
            let t = v
                .as_table()
                .ok_or_else(|| PriceError(format!("models.{name}: not a table")))?;
            let num = |key: &str| -> Result<Option<f64>, PriceError> {
                match t.get(key) {
                    None => Ok(None),
                    Some(toml::Value::Float(f)) if f.is_finite() && *f >= 0.0 => Ok(Some(*f)),
                    Some(toml::Value::Integer(i)) if *i >= 0 => Ok(Some(*i as f64)),
                    Some(_) => Err(PriceError(format!(
                        "models.{name}.{key}: a number of USD per million tokens, 0 or more"
                    ))),
                }
            };
            let price = Price {
                input: num("input")?
                    .ok_or_else(|| PriceError(format!("models.{name}.input is missing")))?,
                output: num("output")?
                    .ok_or_else(|| PriceError(format!("models.{name}.output is missing")))?,
                cached_input: num("cached_input")?,
            };
            // Lookup ignores ASCII case, so entries are kept lowercased.
            models.insert(name.to_ascii_lowercase(), price);
        }
        Ok(PriceTable {
            source,
            date,
            models,
            overridden: Vec::new(),
        })
    }

    /// A table pricing nothing.
    pub fn empty() -> PriceTable {
        PriceTable {
            source: "none".to_string(),
            date: "none".to_string(),
            models: BTreeMap::new(),
            overridden: Vec::new(),
        }
    }

    /// This table with a policy's `[prices."MODEL"]` entries set over it.
    #[must_use]
    pub fn with_overrides(mut self, overrides: Vec<(String, Price)>) -> PriceTable {
        for (model, price) in overrides {
            // Lookup ignores ASCII case, so entries are kept lowercased.
            let model = model.to_ascii_lowercase();
            self.overridden.push(model.clone());
            self.models.insert(model, price);
        }
        self.overridden.sort();
        self
    }

    /// The models a policy priced itself.
    pub fn overridden(&self) -> &[String] {
        &self.overridden
    }

    /// How many models the table prices.
    pub fn len(&self) -> usize {
        self.models.len()
    }

    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// The price of `model` and the entry that priced it: the exact name, else the longest
    /// entry that is a prefix of it followed by `-` or `@`. Matching ignores ASCII case and a
    /// `models/` prefix (Gemini's resource names).
    pub fn lookup(&self, model: &str) -> Option<(&str, &Price)> {
        let model = model.trim();
        let model = model.strip_prefix("models/").unwrap_or(model);
        let lower = model.to_ascii_lowercase();
        if let Some((k, p)) = self.models.get_key_value(lower.as_str()) {
            return Some((k.as_str(), p));
        }
        let mut cut = lower.len();
        while let Some(i) = lower[..cut].rfind(['-', '@']) {
            if let Some((k, p)) = self.models.get_key_value(&lower[..i]) {
                return Some((k.as_str(), p));
            }
            cut = i;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_table_parses_and_is_dated() {
        let t = PriceTable::shipped().unwrap();
        assert!(t.len() > 5);
        assert_eq!(t.date.len(), 10);
        assert!(!t.source.is_empty());
    }

    #[test]
    fn longest_prefix_at_a_separator() {
        let t = PriceTable::parse(
            "source = \"t\"\ndate = \"2026-01-01\"\n[models.gpt-4o]\ninput = 2.5\noutput = 10\n[models.gpt-4o-mini]\ninput = 0.15\noutput = 0.6\n",
        )
        .unwrap();
        assert_eq!(t.lookup("gpt-4o-2024-08-06").unwrap().0, "gpt-4o");
        assert_eq!(t.lookup("gpt-4o-mini-2024-07-18").unwrap().0, "gpt-4o-mini");
        assert_eq!(t.lookup("GPT-4o").unwrap().0, "gpt-4o");
        assert!(t.lookup("gpt-4").is_none());
        assert!(t.lookup("gpt-4ox").is_none());
    }

    #[test]
    fn an_entry_spelled_with_capitals_is_found() {
        let t = PriceTable::parse(
            "source = \"t\"\ndate = \"2026-01-01\"\n[models.\"My-Model\"]\ninput = 1\noutput = 2\n",
        )
        .unwrap()
        .with_overrides(vec![(
            "Local-LLM".to_string(),
            Price {
                input: 0.0,
                output: 0.0,
                cached_input: None,
            },
        )]);
        assert_eq!(t.lookup("my-model-2026").unwrap().0, "my-model");
        assert_eq!(t.lookup("LOCAL-LLM").unwrap().0, "local-llm");
    }

    #[test]
    fn cost_rounds_up_to_a_micro_dollar() {
        let p = Price {
            input: 2.5,
            output: 10.0,
            cached_input: Some(1.25),
        };
        // 1000 in * 2.5 + 100 cached * 1.25 + 500 out * 10 = 2500 + 125 + 5000
        assert_eq!(p.cost_micros(1000, 100, 500), 7625);
        assert_eq!(p.cost_micros(1, 0, 0), 3);
    }
}

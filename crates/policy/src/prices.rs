//! The price table: what a model's tokens cost, to turn LLM usage into money for `spend`
//! budgets. Latchkey ships a dated default (`prices.toml` beside this file, compiled in);
//! a policy's `[prices."MODEL"]` tables override or extend it.
//!
//! Prices are USD per million tokens. A model is found by its exact name, else by its name
//! without one trailing snapshot suffix (a date, a three-digit version or `latest`: so
//! `gpt-4o-2024-08-06` costs what `gpt-4o` costs). Never by a shorter prefix: `o3-pro` is
//! another model than `o3`, at another price. A model the table does not know has no price: a
//! `spend` budget refuses its calls rather than count them as free or as a cheaper sibling.

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

    /// The price of `model` and the entry that priced it: the exact name, else the name
    /// without one trailing snapshot suffix ([`snapshot_base`]: `gpt-4o-2024-08-06` is
    /// `gpt-4o`). Never a shorter sibling: `o3-pro` is not `o3`, `gpt-5-pro` is not `gpt-5`.
    /// Matching ignores ASCII case and a `models/` prefix (Gemini's resource names).
    pub fn lookup(&self, model: &str) -> Option<(&str, &Price)> {
        let model = model.trim();
        let model = model.strip_prefix("models/").unwrap_or(model);
        let lower = model.to_ascii_lowercase();
        if let Some((k, p)) = self.models.get_key_value(lower.as_str()) {
            return Some((k.as_str(), p));
        }
        let base = snapshot_base(&lower)?;
        self.models
            .get_key_value(base)
            .map(|(k, p)| (k.as_str(), p))
    }
}

/// `model` without its trailing snapshot suffix, if it has one: the providers' names for a
/// dated or versioned copy of one model, which costs what the model costs. A suffix is `-` or
/// `@` followed by a date (`2024-08-06`, `20240806`, or `0613`: month and day), a three-digit
/// version (`001`, Gemini's stable versions) or `latest`. Anything else (`-pro`, `-mini`,
/// `-preview-05-20`, `-2026`) names another model.
pub fn snapshot_base(model: &str) -> Option<&str> {
    let b = model.as_bytes();
    let digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
    let num = |s: &[u8]| s.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
    let month_day = |m: &[u8], d: &[u8]| (1..=12).contains(&num(m)) && (1..=31).contains(&num(d));
    let is_sep = |i: usize| matches!(b.get(i), Some(b'-' | b'@'));
    let n = b.len();
    // `-YYYY-MM-DD`
    if n > 11 && is_sep(n - 11) && b[n - 6] == b'-' && b[n - 3] == b'-' {
        let (y, m, d) = (&b[n - 10..n - 6], &b[n - 5..n - 3], &b[n - 2..]);
        if digits(y) && digits(m) && digits(d) && month_day(m, d) {
            return Some(&model[..n - 11]);
        }
    }
    // `-YYYYMMDD`
    if n > 9 && is_sep(n - 9) && digits(&b[n - 8..]) && month_day(&b[n - 4..n - 2], &b[n - 2..]) {
        return Some(&model[..n - 9]);
    }
    // `-MMDD`
    if n > 5 && is_sep(n - 5) && digits(&b[n - 4..]) && month_day(&b[n - 4..n - 2], &b[n - 2..]) {
        return Some(&model[..n - 5]);
    }
    // `-NNN`
    if n > 4 && is_sep(n - 4) && digits(&b[n - 3..]) {
        return Some(&model[..n - 4]);
    }
    // `-latest`
    if n > 7 && is_sep(n - 7) && &b[n - 6..] == b"latest" {
        return Some(&model[..n - 7]);
    }
    None
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
    fn only_a_snapshot_suffix_falls_back() {
        let t = PriceTable::parse(
            "source = \"t\"\ndate = \"2026-01-01\"\n[models.gpt-4o]\ninput = 2.5\noutput = 10\n[models.gpt-4o-mini]\ninput = 0.15\noutput = 0.6\n",
        )
        .unwrap();
        assert_eq!(t.lookup("gpt-4o-2024-08-06").unwrap().0, "gpt-4o");
        assert_eq!(t.lookup("gpt-4o-mini-2024-07-18").unwrap().0, "gpt-4o-mini");
        assert_eq!(t.lookup("GPT-4o").unwrap().0, "gpt-4o");
        assert!(t.lookup("gpt-4").is_none());
        assert!(t.lookup("gpt-4ox").is_none());
        // A variant is another model, never priced as its cheaper sibling.
        assert!(t.lookup("gpt-4o-pro").is_none());
        assert!(t.lookup("gpt-4o-mini-pro-2025-01-01").is_none());
        assert!(t.lookup("gpt-4o-2024-08-06-extra").is_none());
        assert!(t.lookup("gpt-4o-2024-13-06").is_none());
        assert!(t.lookup("gpt-4o-preview-05-20").is_none());
        assert!(t.lookup("gpt-4o-2026").is_none());
    }

    #[test]
    fn a_variant_of_a_shipped_model_is_unpriced() {
        let t = PriceTable::shipped().unwrap();
        for variant in [
            "o3-pro",
            "gpt-5-pro",
            "o3-deep-research",
            "gpt-5-codex",
            "claude-opus-4-5-thinking",
            "gemini-2.5-pro-preview-06-05",
            "o3-pro-2025-06-10",
        ] {
            assert!(
                t.lookup(variant).is_none(),
                "{variant} priced as {:?}",
                t.lookup(variant).map(|x| x.0)
            );
        }
        for (snapshot, base) in [
            ("gpt-4o-2024-08-06", "gpt-4o"),
            ("gpt-5-2025-08-07", "gpt-5"),
            ("o3-2025-04-16", "o3"),
            ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
            ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5"),
            ("claude-3-5-haiku-latest", "claude-3-5-haiku"),
            ("gemini-2.0-flash-001", "gemini-2.0-flash"),
            ("models/gemini-2.5-flash", "gemini-2.5-flash"),
        ] {
            assert_eq!(t.lookup(snapshot).map(|x| x.0), Some(base), "{snapshot}");
        }
    }

    #[test]
    fn snapshot_base_never_panics_and_only_shortens_at_a_separator() {
        for s in [
            "",
            "-",
            "@latest",
            "é-0613",
            "ééééé-20240101",
            "x-é01",
            "-2024-08-06",
            "a-1231",
            "a-1301",
            "a-0132",
        ] {
            if let Some(base) = snapshot_base(s) {
                assert!(!base.is_empty() && s.starts_with(base), "{s}");
            }
        }
        assert_eq!(snapshot_base("a-1231"), Some("a"));
        assert_eq!(snapshot_base("a-1301"), None);
    }

    proptest::proptest! {
        #[test]
        fn snapshot_base_is_a_separator_prefix(s in "[a-z0-9@é.-]{0,24}") {
            if let Some(base) = snapshot_base(&s) {
                proptest::prop_assert!(s.starts_with(base));
                proptest::prop_assert!(matches!(s.as_bytes()[base.len()], b'-' | b'@'));
            }
        }
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
        assert_eq!(t.lookup("my-model-20260101").unwrap().0, "my-model");
        assert!(t.lookup("my-model-2026").is_none());
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

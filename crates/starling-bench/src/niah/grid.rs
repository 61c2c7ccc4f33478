//! The benchmark grid as the command line gives it: context lengths (`1k`, `4k`, `30k`, `512`),
//! needle depths (percent) and compression methods (`none`, `keydiff@0.5`).

use serde_json::{json, Value};

use crate::error::BenchError;

/// Tokens in one `k` of a context length: `4k` is 4096 tokens, so `30k` (30,720) plus an answer
/// still fits a 32,768-token window.
pub const TOKENS_PER_K: usize = 1024;

/// Parses a context length: a token count (`512`) or a whole number of `k` (`4k`, `30K`).
pub fn parse_context_tokens(text: &str) -> Result<usize, BenchError> {
    let t = text.trim();
    let (digits, scale) = match t.strip_suffix(['k', 'K']) {
        Some(rest) => (rest, TOKENS_PER_K),
        None => (t, 1),
    };
    let value: usize = digits.parse().map_err(|_| {
        BenchError::Invalid(format!(
            "`{text}` is not a context length (examples: 512, 1k, 4k, 30k)"
        ))
    })?;
    let tokens = value
        .checked_mul(scale)
        .filter(|&n| n > 0)
        .ok_or_else(|| BenchError::Invalid(format!("context length `{text}` is out of range")))?;
    Ok(tokens)
}

/// A context length for tables and file names: `4k` when a whole number of `k`, else the count.
pub fn context_label(tokens: usize) -> String {
    if tokens.is_multiple_of(TOKENS_PER_K) {
        format!("{}k", tokens / TOKENS_PER_K)
    } else {
        tokens.to_string()
    }
}

/// Checks that every depth is a percentage in `[0, 100]`.
pub fn check_depths(depths_percent: &[f64]) -> Result<(), BenchError> {
    if depths_percent.is_empty() {
        return Err(BenchError::Invalid("no needle depth given".into()));
    }
    match depths_percent
        .iter()
        .find(|d| !(d.is_finite() && (0.0..=100.0).contains(*d)))
    {
        Some(bad) => Err(BenchError::Invalid(format!(
            "needle depth {bad} is outside 0..=100 (percent of the haystack)"
        ))),
        None => Ok(()),
    }
}

/// One compression method of the grid: `name` or `name@ratio` (ratio = share of tokens evicted).
#[derive(Debug, Clone, PartialEq)]
pub struct MethodSpec {
    /// The method name as `CompressionConfig` knows it (`none`, `keydiff`, `snapkv`, ...).
    pub name: String,
    /// The eviction ratio; 0 for `none` or a bare name.
    pub ratio: f64,
}

impl MethodSpec {
    /// Parses `name` or `name@ratio`. The name itself is checked later, by the compression
    /// config that [`MethodSpec::to_json`] feeds.
    pub fn parse(text: &str) -> Result<Self, BenchError> {
        let t = text.trim();
        let (name, ratio) = match t.split_once('@') {
            None => (t, 0.0),
            Some((name, ratio)) => {
                let ratio: f64 = ratio.trim().parse().map_err(|_| {
                    BenchError::Invalid(format!(
                        "`{text}`: the ratio after `@` must be a number (e.g. keydiff@0.5)"
                    ))
                })?;
                (name.trim(), ratio)
            }
        };
        if name.is_empty() {
            return Err(BenchError::Invalid(format!(
                "`{text}` names no method (e.g. none, keydiff@0.5)"
            )));
        }
        Ok(MethodSpec {
            name: name.to_owned(),
            ratio,
        })
    }

    /// The label used in tables, file names and results: `none` or `keydiff@0.5`.
    pub fn label(&self) -> String {
        if self.name == "none" || self.ratio == 0.0 {
            self.name.clone()
        } else {
            format!("{}@{}", self.name, self.ratio)
        }
    }

    /// The compression config JSON (`{"method":..,"ratio":..}`, other fields at their defaults).
    pub fn to_json(&self) -> Value {
        json!({ "method": self.name, "ratio": self.ratio })
    }

    /// A label safe in a file name (`keydiff@0.5` → `keydiff_0.5`).
    pub fn file_stem(&self) -> String {
        self.label()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    }
}

/// Parses a comma-separated list of methods, refusing duplicates (two runs with one label would
/// overwrite each other's table row and heatmap).
pub fn parse_methods(items: &[String]) -> Result<Vec<MethodSpec>, BenchError> {
    let mut methods: Vec<MethodSpec> = Vec::with_capacity(items.len());
    for item in items {
        let spec = MethodSpec::parse(item)?;
        if methods.iter().any(|m| m.label() == spec.label()) {
            return Err(BenchError::Invalid(format!(
                "method `{}` is listed twice",
                spec.label()
            )));
        }
        methods.push(spec);
    }
    if methods.is_empty() {
        return Err(BenchError::Invalid("no method given".into()));
    }
    Ok(methods)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_lengths_take_k_suffixes() {
        assert_eq!(parse_context_tokens("1k").unwrap(), 1024);
        assert_eq!(parse_context_tokens("30K").unwrap(), 30 * 1024);
        assert_eq!(parse_context_tokens(" 512 ").unwrap(), 512);
        for bad in ["", "k", "0", "1.5k", "-4k", "four"] {
            assert!(parse_context_tokens(bad).is_err(), "{bad}");
        }
        assert_eq!(context_label(4096), "4k");
        assert_eq!(context_label(300), "300");
    }

    #[test]
    fn depths_must_be_percentages() {
        assert!(check_depths(&[0.0, 25.0, 100.0]).is_ok());
        assert!(check_depths(&[]).is_err());
        assert!(check_depths(&[101.0]).is_err());
        assert!(check_depths(&[f64::NAN]).is_err());
    }

    #[test]
    fn methods_parse_with_and_without_ratio() {
        let none = MethodSpec::parse("none").unwrap();
        assert_eq!((none.name.as_str(), none.ratio), ("none", 0.0));
        assert_eq!(none.label(), "none");
        let kd = MethodSpec::parse(" keydiff@0.5 ").unwrap();
        assert_eq!((kd.name.as_str(), kd.ratio), ("keydiff", 0.5));
        assert_eq!(kd.label(), "keydiff@0.5");
        assert_eq!(kd.to_json(), json!({"method": "keydiff", "ratio": 0.5}));
        assert_eq!(
            MethodSpec::parse("streaming_llm@0.25").unwrap().file_stem(),
            "streaming_llm_0.25"
        );
        assert!(MethodSpec::parse("keydiff@half").is_err());
        assert!(MethodSpec::parse("@0.5").is_err());
    }

    #[test]
    fn duplicate_methods_are_refused() {
        let items = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_methods(&items(&["none", "snapkv@0.25"]))
                .unwrap()
                .len(),
            2
        );
        assert!(parse_methods(&items(&["keydiff@0.5", "keydiff@0.50"])).is_err());
        assert!(parse_methods(&[]).is_err());
    }
}

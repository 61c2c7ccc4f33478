//! Serde helpers that accept the loose shapes OpenAI-compatible clients send.

use serde::{Deserialize, Deserializer};

/// Reads `stop` given as `null`, a single string, or a list of strings (all legal in the OpenAI API).
pub(super) fn one_or_many_strings<'de, D>(deserializer: D) -> Result<Vec<String>, D::Error>
where
    D: Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Option::<OneOrMany>::deserialize(deserializer)? {
        None => Vec::new(),
        Some(OneOrMany::One(text)) => vec![text],
        Some(OneOrMany::Many(texts)) => texts,
    })
}

/// Reads `top_k` where `null`, `0` and vLLM's `-1` all mean "no limit".
pub(super) fn non_positive_as_none<'de, D>(deserializer: D) -> Result<Option<usize>, D::Error>
where
    D: Deserializer<'de>,
{
    match Option::<i64>::deserialize(deserializer)? {
        None => Ok(None),
        Some(k) if k <= 0 => Ok(None),
        Some(k) => usize::try_from(k)
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("top_k {k} does not fit in usize"))),
    }
}

//! Reading the `tokenizer.*` keys of a GGUF file into plain Rust values.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use super::TokenizerError;

/// llama.cpp token types (`tokenizer.ggml.token_type`).
pub(crate) mod token_type {
    /// A control token such as `<|im_start|>`: matched whole, special.
    pub(crate) const CONTROL: i64 = 3;
    /// A user-defined token such as `<tool_call>`: matched whole, not special.
    pub(crate) const USER_DEFINED: i64 = 4;
}

/// The tokenizer as a GGUF file describes it.
#[derive(Debug, Clone)]
pub(crate) struct GgufTokenizerMetadata {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE), `llama` (SentencePiece), ...
    pub(crate) model: String,
    /// `tokenizer.ggml.pre`: which split regex the vocabulary was trained with.
    pub(crate) pre: Option<String>,
    /// Token texts, indexed by id.
    pub(crate) tokens: Vec<String>,
    /// Token types, indexed by id (empty when the file has none).
    pub(crate) token_types: Vec<i64>,
    /// Merge rules `left right`, best first.
    pub(crate) merges: Vec<String>,
    /// Beginning-of-sequence id.
    pub(crate) bos_token_id: Option<u32>,
    /// End-of-sequence id.
    pub(crate) eos_token_id: Option<u32>,
    /// End-of-turn id, when the file names one.
    pub(crate) eot_token_id: Option<u32>,
    /// End-of-message id, when the file names one.
    pub(crate) eom_token_id: Option<u32>,
    /// Padding id.
    pub(crate) padding_token_id: Option<u32>,
    /// Whether encoding with special tokens prepends BOS.
    pub(crate) add_bos_token: bool,
    /// `tokenizer.ggml.scores`: each piece's score (SentencePiece vocabularies); empty when
    /// absent.
    pub(crate) scores: Vec<f32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub(crate) unknown_token_id: Option<u32>,
    /// `tokenizer.ggml.add_space_prefix`: whether SentencePiece prepends a space to the text
    /// (llama.cpp's default when absent: yes).
    pub(crate) add_space_prefix: bool,
    /// The Jinja chat template.
    pub(crate) chat_template: Option<String>,
}

impl GgufTokenizerMetadata {
    /// Reads the tokenizer keys; ids are checked against the vocabulary size.
    pub(crate) fn read(md: &HashMap<String, Value>) -> Result<Self, TokenizerError> {
        let model = required_string(md, "tokenizer.ggml.model")?;
        let tokens = string_array(md, "tokenizer.ggml.tokens")?.ok_or_else(|| {
            TokenizerError::MissingKey {
                key: "tokenizer.ggml.tokens".to_owned(),
            }
        })?;
        let token_types = match md.get("tokenizer.ggml.token_type") {
            Some(value) => integer_array(value, "tokenizer.ggml.token_type")?,
            None => Vec::new(),
        };
        let merges = string_array(md, "tokenizer.ggml.merges")?.unwrap_or_default();
        let scores = match md.get("tokenizer.ggml.scores") {
            Some(value) => float_array(value, "tokenizer.ggml.scores")?,
            None => Vec::new(),
        };
        let vocab_size = tokens.len();
        let id = |key: &str| token_id(md, key, vocab_size);
        Ok(GgufTokenizerMetadata {
            pre: optional_string(md, "tokenizer.ggml.pre")?,
            bos_token_id: id("tokenizer.ggml.bos_token_id")?,
            eos_token_id: id("tokenizer.ggml.eos_token_id")?,
            eot_token_id: id("tokenizer.ggml.eot_token_id")?,
            eom_token_id: id("tokenizer.ggml.eom_token_id")?,
            padding_token_id: id("tokenizer.ggml.padding_token_id")?,
            add_bos_token: optional_bool(md, "tokenizer.ggml.add_bos_token")?.unwrap_or(false),
            unknown_token_id: id("tokenizer.ggml.unknown_token_id")?,
            add_space_prefix: optional_bool(md, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true),
            scores,
            chat_template: optional_string(md, "tokenizer.chat_template")?,
            model,
            tokens,
            token_types,
            merges,
        })
    }

    /// The type of token `id` (normal when the file lists no types).
    pub(crate) fn token_type(&self, id: usize) -> i64 {
        self.token_types.get(id).copied().unwrap_or(1)
    }
}

fn wrong_type(key: &str, expected: &'static str) -> TokenizerError {
    TokenizerError::WrongType {
        key: key.to_owned(),
        expected,
    }
}

fn required_string(md: &HashMap<String, Value>, key: &str) -> Result<String, TokenizerError> {
    optional_string(md, key)?.ok_or_else(|| TokenizerError::MissingKey {
        key: key.to_owned(),
    })
}

fn optional_string(
    md: &HashMap<String, Value>,
    key: &str,
) -> Result<Option<String>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(wrong_type(key, "a string")),
    }
}

fn optional_bool(md: &HashMap<String, Value>, key: &str) -> Result<Option<bool>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(wrong_type(key, "a boolean")),
    }
}

fn string_array(
    md: &HashMap<String, Value>,
    key: &str,
) -> Result<Option<Vec<String>>, TokenizerError> {
    let Some(value) = md.get(key) else {
        return Ok(None);
    };
    let Value::Array(items) = value else {
        return Err(wrong_type(key, "an array of strings"));
    };
    items
        .iter()
        .map(|item| match item {
            Value::String(s) => Ok(s.clone()),
            _ => Err(wrong_type(key, "an array of strings")),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn integer_array(value: &Value, key: &str) -> Result<Vec<i64>, TokenizerError> {
    let Value::Array(items) = value else {
        return Err(wrong_type(key, "an array of integers"));
    };
    items
        .iter()
        .map(|item| integer(item).ok_or_else(|| wrong_type(key, "an array of integers")))
        .collect()
}

fn float_array(value: &Value, key: &str) -> Result<Vec<f32>, TokenizerError> {
    let Value::Array(items) = value else {
        return Err(wrong_type(key, "an array of floats"));
    };
    items
        .iter()
        .map(|item| match item {
            Value::F32(v) => Ok(*v),
            Value::F64(v) => Ok(*v as f32),
            _ => Err(wrong_type(key, "an array of floats")),
        })
        .collect()
}

/// Any GGUF integer type as i64 (files disagree on widths and signedness).
fn integer(value: &Value) -> Option<i64> {
    match value {
        Value::U8(v) => Some(i64::from(*v)),
        Value::I8(v) => Some(i64::from(*v)),
        Value::U16(v) => Some(i64::from(*v)),
        Value::I16(v) => Some(i64::from(*v)),
        Value::U32(v) => Some(i64::from(*v)),
        Value::I32(v) => Some(i64::from(*v)),
        Value::U64(v) => i64::try_from(*v).ok(),
        Value::I64(v) => Some(*v),
        _ => None,
    }
}

/// A token id key, checked to lie inside the vocabulary. Negative ids mean "none" (llama.cpp
/// writes -1 for an absent token).
fn token_id(
    md: &HashMap<String, Value>,
    key: &str,
    vocab_size: usize,
) -> Result<Option<u32>, TokenizerError> {
    let Some(value) = md.get(key) else {
        return Ok(None);
    };
    let id = integer(value).ok_or_else(|| wrong_type(key, "an integer token id"))?;
    if id < 0 {
        return Ok(None);
    }
    match u32::try_from(id) {
        Ok(id) if (id as usize) < vocab_size => Ok(Some(id)),
        _ => Err(TokenizerError::TokenIdOutOfRange {
            key: key.to_owned(),
            id: id as u64,
            vocab_size,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Value {
        Value::Array(
            items
                .iter()
                .map(|s| Value::String((*s).to_owned()))
                .collect(),
        )
    }

    fn minimal() -> HashMap<String, Value> {
        HashMap::from([
            (
                "tokenizer.ggml.model".to_owned(),
                Value::String("gpt2".to_owned()),
            ),
            (
                "tokenizer.ggml.tokens".to_owned(),
                strings(&["a", "b", "ab"]),
            ),
            ("tokenizer.ggml.merges".to_owned(), strings(&["a b"])),
        ])
    }

    #[test]
    fn reads_minimal_metadata_with_defaults() {
        let md = GgufTokenizerMetadata::read(&minimal()).unwrap();
        assert_eq!(md.model, "gpt2");
        assert_eq!(md.tokens.len(), 3);
        assert_eq!(md.pre, None);
        assert!(!md.add_bos_token);
        assert_eq!(md.token_type(1), 1);
    }

    #[test]
    fn missing_tokens_and_wrong_types_are_named() {
        let mut md = minimal();
        md.remove("tokenizer.ggml.tokens");
        let err = GgufTokenizerMetadata::read(&md).unwrap_err();
        assert!(err.to_string().contains("tokenizer.ggml.tokens"));

        let mut md = minimal();
        md.insert("tokenizer.ggml.pre".to_owned(), Value::U32(3));
        let err = GgufTokenizerMetadata::read(&md).unwrap_err();
        assert!(matches!(err, TokenizerError::WrongType { .. }), "{err}");
    }

    #[test]
    fn token_ids_are_range_checked_and_negative_means_none() {
        let mut md = minimal();
        md.insert("tokenizer.ggml.eos_token_id".to_owned(), Value::I32(-1));
        assert_eq!(GgufTokenizerMetadata::read(&md).unwrap().eos_token_id, None);
        md.insert("tokenizer.ggml.eos_token_id".to_owned(), Value::U32(3));
        let err = GgufTokenizerMetadata::read(&md).unwrap_err();
        assert!(
            matches!(err, TokenizerError::TokenIdOutOfRange { id: 3, .. }),
            "{err}"
        );
    }
}

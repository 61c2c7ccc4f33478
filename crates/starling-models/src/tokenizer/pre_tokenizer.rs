//! The pre-tokenizer split regexes named by `tokenizer.ggml.pre`.
//!
//! A byte-level BPE vocabulary was trained on text split by a particular regex; using another
//! one changes the ids. These are llama.cpp's regexes (llama-vocab.cpp, `llm_tokenizer_bpe`),
//! applied in order: each regex splits every piece left by the previous one, keeping both the
//! matches and the text between them, exactly as a `tokenizers` `Split(..., Isolated)` sequence
//! does. llama.cpp rewrote `(?i:'s|...)` as explicit character classes for `std::regex`; the
//! meaning is the same.

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use super::TokenizerError;

/// GPT-2's split: contractions, letter runs, number runs, other runs, trailing whitespace.
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's split (also Qwen2's with `\p{N}{1,3}` replaced by single digits).
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split: as Llama 3 but every digit on its own.
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How one family of vocabularies splits text before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PreTokenizerSpec {
    /// Regexes applied in order (see the module docs).
    pub(crate) regexes: &'static [&'static str],
    /// Whether a piece that is itself a token skips merging (llama.cpp's
    /// `tokenizer_ignore_merges`, HF's `ignore_merges`; set for Llama 3).
    pub(crate) ignore_merges: bool,
}

/// `tokenizer.ggml.pre` names and the split each one means.
const PRE_TOKENIZERS: &[(&[&str], PreTokenizerSpec)] = &[
    (
        // StarCoder-family vocabularies (SmolLM's among them) first isolate every digit.
        &["smollm", "starcoder", "refact", "command-r", "codeshell"],
        PreTokenizerSpec {
            regexes: &[r"\p{N}", GPT2_REGEX],
            ignore_merges: false,
        },
    ),
    (
        &["qwen2", "stablelm2", "deepseek-r1-qwen"],
        PreTokenizerSpec {
            regexes: &[QWEN2_REGEX],
            ignore_merges: false,
        },
    ),
    (
        &["llama-bpe", "llama3", "llama-v3"],
        PreTokenizerSpec {
            regexes: &[LLAMA3_REGEX],
            ignore_merges: true,
        },
    ),
    (
        &["gpt2", "gpt-2", "phi-2", "mpt", "olmo"],
        PreTokenizerSpec {
            regexes: &[GPT2_REGEX],
            ignore_merges: false,
        },
    ),
    (
        // llama.cpp's fallback when a file names no pre-tokenizer.
        &["default"],
        PreTokenizerSpec {
            regexes: &[
                r"[\p{P}\$\+<=>\^~\|]+",
                GPT2_REGEX,
                r"\p{N}+",
                r"[0-9][0-9][0-9]",
            ],
            ignore_merges: false,
        },
    ),
];

/// The split for a `tokenizer.ggml.pre` value (`None`, a missing key, means `default`).
pub(crate) fn spec_for(pre: Option<&str>) -> Result<PreTokenizerSpec, TokenizerError> {
    let name = pre.unwrap_or("default");
    PRE_TOKENIZERS
        .iter()
        .find(|(names, _)| names.contains(&name))
        .map(|(_, spec)| *spec)
        .ok_or_else(|| TokenizerError::UnknownPreTokenizer {
            pre: name.to_owned(),
            supported: supported_names(),
        })
}

/// All supported names, comma separated.
fn supported_names() -> String {
    let names: Vec<&str> = PRE_TOKENIZERS
        .iter()
        .flat_map(|(names, _)| names.iter().copied())
        .collect();
    names.join(", ")
}

/// The `tokenizers` pre-tokenizer for a spec: the regex splits, then the byte-to-unicode
/// mapping of byte-level BPE (with its own GPT-2 regex turned off, as the splits did that job).
pub(crate) fn build_pre_tokenizer(
    spec: PreTokenizerSpec,
) -> Result<PreTokenizerWrapper, TokenizerError> {
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(spec.regexes.len() + 1);
    for regex in spec.regexes {
        let split = Split::new(
            SplitPattern::Regex((*regex).to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Build {
            what: "pre-tokenizer regex",
            message: e.to_string(),
        })?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, true, false).into());
    Ok(Sequence::new(steps).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn pieces(pre: &str, text: &str) -> Vec<String> {
        let spec = spec_for(Some(pre)).unwrap();
        // Without the byte-level step, to read the raw pieces.
        let splits: Vec<PreTokenizerWrapper> = spec
            .regexes
            .iter()
            .map(|r| {
                Split::new(
                    SplitPattern::Regex((*r).to_owned()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .unwrap()
                .into()
            })
            .collect();
        let mut pretokenized = PreTokenizedString::from(text);
        Sequence::new(splits)
            .pre_tokenize(&mut pretokenized)
            .unwrap();
        pretokenized
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(piece, _, _)| piece.to_owned())
            .collect()
    }

    #[test]
    fn smollm_isolates_digits() {
        assert_eq!(pieces("smollm", "ab 123"), ["ab", " ", "1", "2", "3"]);
    }

    #[test]
    fn qwen2_keeps_newlines_with_punctuation_and_single_digits() {
        assert_eq!(
            pieces("qwen2", "x = 12;\n\ny"),
            ["x", " =", " ", "1", "2", ";\n\n", "y"]
        );
    }

    #[test]
    fn llama3_groups_three_digits_and_folds_contractions() {
        assert_eq!(pieces("llama-bpe", "1234 IT'S"), ["123", "4", " IT", "'S"]);
    }

    #[test]
    fn gpt2_and_default_are_known_and_unknown_is_an_error() {
        assert!(spec_for(Some("gpt2")).is_ok());
        assert_eq!(spec_for(None).unwrap(), spec_for(Some("default")).unwrap());
        let err = spec_for(Some("klingon")).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("klingon") && message.contains("qwen2"),
            "{message}"
        );
    }
}

//! Building a byte-level BPE `tokenizers::Tokenizer` from GGUF tokenizer metadata.

use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::AddedToken;

use super::gguf_metadata::{token_type, GgufTokenizerMetadata};
use super::pre_tokenizer::{build_pre_tokenizer, spec_for};
use super::TokenizerError;

/// The only GGUF tokenizer model implemented: GPT-2 style byte-level BPE.
const BYTE_LEVEL_BPE_MODEL: &str = "gpt2";

/// A `tokenizers` tokenizer equivalent to the one llama.cpp would build from this metadata.
///
/// Token texts in a `gpt2` vocabulary are already in the byte-to-unicode alphabet, so they go
/// into the BPE model as they are. Control tokens become special added tokens and user-defined
/// tokens plain added tokens, so both are matched whole in input text (as llama.cpp does when
/// parsing special tokens, and as transformers does for GGUF files).
pub(crate) fn build(md: &GgufTokenizerMetadata) -> Result<tokenizers::Tokenizer, TokenizerError> {
    if md.model != BYTE_LEVEL_BPE_MODEL {
        return Err(TokenizerError::Unsupported {
            model: md.model.clone(),
        });
    }
    let spec = spec_for(md.pre.as_deref())?;

    let vocab = vocab(md);
    let merges = parse_merges(&md.merges)?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Build {
            what: "BPE model",
            message: e.to_string(),
        })?;

    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(build_pre_tokenizer(spec)?));
    tokenizer.with_decoder(Some(ByteLevel::default()));

    let (special, plain) = added_tokens(md);
    tokenizer.add_special_tokens(&special);
    tokenizer.add_tokens(&plain);
    Ok(tokenizer)
}

/// Each token text with its id (the position in `tokenizer.ggml.tokens`).
pub(crate) fn vocab(md: &GgufTokenizerMetadata) -> Vocab {
    md.tokens
        .iter()
        .enumerate()
        .map(|(id, token)| (token.clone(), id as u32))
        .collect()
}

/// `left right` rules as pairs. Byte-level token texts never contain a space (it is spelled
/// `Ġ`), so a rule has exactly one.
fn parse_merges(rules: &[String]) -> Result<Merges, TokenizerError> {
    rules
        .iter()
        .enumerate()
        .map(|(index, rule)| match rule.split_once(' ') {
            Some((left, right))
                if !left.is_empty() && !right.is_empty() && !right.contains(' ') =>
            {
                Ok((left.to_owned(), right.to_owned()))
            }
            _ => Err(TokenizerError::BadMerge {
                index,
                merge: rule.clone(),
            }),
        })
        .collect()
}

/// (special, plain) added tokens: control tokens and user-defined tokens respectively.
pub(crate) fn added_tokens(md: &GgufTokenizerMetadata) -> (Vec<AddedToken>, Vec<AddedToken>) {
    let mut special = Vec::new();
    let mut plain = Vec::new();
    for (id, token) in md.tokens.iter().enumerate() {
        match md.token_type(id) {
            token_type::CONTROL => {
                special.push(AddedToken::from(token.clone(), true).normalized(false));
            }
            token_type::USER_DEFINED => {
                plain.push(AddedToken::from(token.clone(), false).normalized(false));
            }
            _ => {}
        }
    }
    (special, plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_must_be_two_tokens() {
        let ok = parse_merges(&["Ġ t".to_owned(), "i n".to_owned()]).unwrap();
        assert_eq!(ok[0], ("Ġ".to_owned(), "t".to_owned()));
        for bad in ["single", "a b c", " b", "a "] {
            let err = parse_merges(&[bad.to_owned()]).unwrap_err();
            assert!(
                matches!(err, TokenizerError::BadMerge { index: 0, .. }),
                "{bad}"
            );
        }
    }
}

//! Building a SentencePiece-BPE `tokenizers::Tokenizer` from GGUF tokenizer metadata
//! (`tokenizer.ggml.model = "llama"`: Gemma, Llama-2, Mistral).
//!
//! A SentencePiece BPE vocabulary carries no merge rules: its pieces have scores, and the
//! tokenizer repeatedly joins the adjacent pair whose concatenation is the highest-scoring piece.
//! That is a BPE whose merge ranks follow the merged pieces' scores, so the merges are derived
//! the way transformers' `SentencePieceExtractor` derives them (every split of every piece into
//! two pieces of the vocabulary, ranked by the piece's score, ties by the halves' ids), and the
//! rest is the SentencePiece pipeline: spaces become `▁` (and one is prepended when
//! `tokenizer.ggml.add_space_prefix` says so), characters without a piece fall back to their
//! UTF-8 bytes (`<0xNN>` pieces), and decoding reverses both.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{DecoderWrapper, NormalizerWrapper};

use super::gguf_bpe::{added_tokens, vocab};
use super::gguf_metadata::GgufTokenizerMetadata;
use super::TokenizerError;

/// The GGUF tokenizer model name of SentencePiece vocabularies.
pub(crate) const SENTENCEPIECE_MODEL: &str = "llama";

/// SentencePiece's visible space.
const SPACE_PIECE: &str = "\u{2581}";

/// A `tokenizers` tokenizer that encodes as SentencePiece BPE over this metadata's pieces.
pub(crate) fn build(md: &GgufTokenizerMetadata) -> Result<tokenizers::Tokenizer, TokenizerError> {
    if md.scores.len() != md.tokens.len() {
        return Err(TokenizerError::Build {
            what: "SentencePiece vocabulary",
            message: format!(
                "{} scores for {} pieces (tokenizer.ggml.scores)",
                md.scores.len(),
                md.tokens.len()
            ),
        });
    }
    let vocab = vocab(md);
    let merges = merges_from_scores(&md.tokens, &md.scores, &vocab);
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = md
        .unknown_token_id
        .and_then(|id| md.tokens.get(id as usize))
    {
        builder = builder.unk_token(unk.clone());
    }
    let bpe = builder.build().map_err(|e| TokenizerError::Build {
        what: "SentencePiece BPE model",
        message: e.to_string(),
    })?;

    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    let space = Replace::new(" ", SPACE_PIECE).map_err(|e| TokenizerError::Build {
        what: "SentencePiece normalizer",
        message: e.to_string(),
    })?;
    let mut normalizers = vec![NormalizerWrapper::from(space)];
    let unspace = Replace::new(SPACE_PIECE, " ").map_err(|e| TokenizerError::Build {
        what: "SentencePiece decoder",
        message: e.to_string(),
    })?;
    let mut decoders = vec![
        DecoderWrapper::Replace(unspace),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if md.add_space_prefix {
        normalizers.insert(0, NormalizerWrapper::from(Prepend::new(SPACE_PIECE.into())));
        decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    tokenizer.with_normalizer(Some(NormalizerSequence::new(normalizers)));
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));

    let (special, plain) = added_tokens(md);
    tokenizer.add_special_tokens(&special);
    tokenizer.add_tokens(&plain);
    Ok(tokenizer)
}

/// Every `(left, right)` whose concatenation is a piece, both halves pieces too, ranked by the
/// concatenation's score (highest first), then by the halves' ids: the order SentencePiece
/// merges in.
fn merges_from_scores(tokens: &[String], scores: &[f32], vocab: &Vocab) -> Merges {
    let ids: HashMap<&str, u32> = vocab.iter().map(|(t, &id)| (t.as_str(), id)).collect();
    let mut ranked: Vec<(f32, u32, u32, usize, usize)> = Vec::new();
    for (piece_id, piece) in tokens.iter().enumerate() {
        for (split, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(split);
            if let (Some(&l), Some(&r)) = (ids.get(left), ids.get(right)) {
                ranked.push((scores[piece_id], l, r, piece_id, split));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    ranked
        .into_iter()
        .map(|(_, _, _, piece_id, split)| {
            let (left, right) = tokens[piece_id].split_at(split);
            (left.to_owned(), right.to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_follow_the_merged_pieces_scores() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        // "bc" outscores "ab": it merges first; "abc" splits as a|bc and ab|c.
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let merges = merges_from_scores(&tokens, &scores, &vocab);
        let pair = |l: &str, r: &str| (l.to_owned(), r.to_owned());
        assert_eq!(
            merges,
            vec![
                pair("b", "c"),
                pair("a", "b"),
                pair("a", "bc"),
                pair("ab", "c")
            ]
        );
    }
}

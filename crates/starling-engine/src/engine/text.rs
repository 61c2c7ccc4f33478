//! Incremental detokenisation seen from the engine: a factory of per-sequence text streams, so the
//! engine works with any tokenizer (and tests can plug a trivial one).

/// Makes one [`TextStream`] per sequence.
pub trait TextDecoder: Send + Sync {
    /// A fresh stream for a sequence's generated tokens.
    fn stream(&self, skip_special_tokens: bool) -> Box<dyn TextStream>;
}

/// Turns a sequence's generated token ids into text, one token at a time, never splitting a
/// UTF-8 character.
pub trait TextStream: Send {
    /// Adds a token; returns the newly completed text (possibly empty).
    fn push(&mut self, token_id: u32) -> String;
    /// Returns whatever text is still held back at the end of the sequence.
    fn finish(&mut self) -> String;
}

use std::sync::Arc;

use starling_models::tokenizer::{IncrementalDecoder, Tokenizer};

/// The engine-side view of a model [`Tokenizer`].
pub struct TokenizerText(pub Arc<Tokenizer>);

impl TextDecoder for TokenizerText {
    fn stream(&self, skip_special_tokens: bool) -> Box<dyn TextStream> {
        Box::new(TokenizerStream {
            tokenizer: self.0.clone(),
            decoder: IncrementalDecoder::new(skip_special_tokens),
        })
    }
}

/// One sequence's incremental decoder plus the shared tokenizer it decodes with.
struct TokenizerStream {
    tokenizer: Arc<Tokenizer>,
    decoder: IncrementalDecoder,
}

impl TextStream for TokenizerStream {
    fn push(&mut self, token_id: u32) -> String {
        // Ids come from the model's own vocabulary, so decoding cannot fail short of a
        // tokenizer/model mismatch; log it rather than kill the request.
        self.decoder
            .push(&self.tokenizer, token_id)
            .unwrap_or_else(|e| {
                tracing::warn!("detokenising token {token_id}: {e}");
                String::new()
            })
    }

    fn finish(&mut self) -> String {
        self.decoder.flush(&self.tokenizer).unwrap_or_else(|e| {
            tracing::warn!("flushing detokeniser: {e}");
            String::new()
        })
    }
}

//! Streaming detokenization: turning generated ids into text one id at a time.
//!
//! Decoding ids one by one and concatenating is wrong in two ways: a multi-byte character can
//! be split over several byte tokens (decoding one alone yields U+FFFD), and some decoders
//! change a token's text depending on what precedes it (SentencePiece drops a leading space at
//! the start of a sequence). The prefix-offset/read-offset method (vLLM, TGI) avoids both:
//! decode a small window twice, with and without the new ids, and emit the difference only once
//! it no longer ends in an incomplete character.

use super::{Tokenizer, TokenizerError};

/// The replacement character a lossy UTF-8 decode puts where bytes are incomplete.
const REPLACEMENT_CHAR: char = '\u{FFFD}';

/// Per-sequence state for streaming decode. Holds no reference to the tokenizer, so an engine
/// can keep one per request and pass the shared tokenizer to each call.
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    /// Context and generated ids still inside the decode window.
    ids: Vec<u32>,
    /// Start of the window decoded for context.
    prefix_offset: usize,
    /// End of what has already been emitted.
    read_offset: usize,
    skip_special_tokens: bool,
}

impl IncrementalDecoder {
    /// A decoder with no context.
    pub fn new(skip_special_tokens: bool) -> Self {
        IncrementalDecoder {
            skip_special_tokens,
            ..IncrementalDecoder::default()
        }
    }

    /// A decoder whose first emitted text is read in the context of `context_ids` (typically
    /// the last few prompt ids), which are never emitted themselves.
    pub fn with_context(context_ids: &[u32], skip_special_tokens: bool) -> Self {
        IncrementalDecoder {
            ids: context_ids.to_vec(),
            prefix_offset: 0,
            read_offset: context_ids.len(),
            skip_special_tokens,
        }
    }

    /// Adds one id; returns the newly completed text (empty while a character is incomplete).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        let prefix_text = self.decode_window(tokenizer, self.read_offset)?;
        self.ids.push(id);
        let full_text = self.decode_window(tokenizer, self.ids.len())?;
        if full_text.ends_with(REPLACEMENT_CHAR) {
            return Ok(String::new());
        }
        let Some(delta) = new_suffix(&prefix_text, &full_text) else {
            return Ok(String::new());
        };
        let delta = delta.to_owned();
        self.advance();
        Ok(delta)
    }

    /// Returns whatever is still held back (e.g. a truncated character, as U+FFFD) and resets
    /// the window; call once when the sequence ends.
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> Result<String, TokenizerError> {
        let prefix_text = self.decode_window(tokenizer, self.read_offset)?;
        let full_text = self.decode_window(tokenizer, self.ids.len())?;
        let rest = new_suffix(&prefix_text, &full_text)
            .unwrap_or_default()
            .to_owned();
        self.advance();
        Ok(rest)
    }

    /// Decodes `ids[prefix_offset..end]`.
    fn decode_window(&self, tokenizer: &Tokenizer, end: usize) -> Result<String, TokenizerError> {
        tokenizer.decode(&self.ids[self.prefix_offset..end], self.skip_special_tokens)
    }

    /// Marks everything so far as emitted; what was new becomes the next context.
    fn advance(&mut self) {
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        // Drop ids that can no longer be part of any window, so memory stays bounded.
        if self.prefix_offset > 0 {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
    }
}

/// The part of `full` after `prefix`, when `full` grew past it. Decoders can rewrite the tail
/// of the prefix (rare; e.g. a cleanup rule); then the text past the prefix's length is still
/// the best guess, taken at a character boundary.
fn new_suffix<'a>(prefix: &str, full: &'a str) -> Option<&'a str> {
    if full.len() <= prefix.len() {
        return None;
    }
    if let Some(rest) = full.strip_prefix(prefix) {
        return Some(rest);
    }
    let mut start = prefix.len();
    while !full.is_char_boundary(start) {
        start += 1;
    }
    full.get(start..)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffix_handles_growth_and_rewrites() {
        assert_eq!(new_suffix("ab", "abc"), Some("c"));
        assert_eq!(new_suffix("ab", "ab"), None);
        assert_eq!(new_suffix("ab", "aXé"), Some("é"));
    }
}

//! Tokenizers for Starling models: byte-level BPE built from GGUF metadata, or any
//! `tokenizer.json` from a Hugging Face directory, behind one [`Tokenizer`] type.
//!
//! GGUF support covers `tokenizer.ggml.model = "gpt2"` (byte-level BPE) with the pre-tokenizer
//! regexes of llama.cpp for `smollm`, `qwen2`, `llama-bpe`, `gpt2` and `default` (see
//! `pre_tokenizer.rs`), and `llama` (SentencePiece BPE: Gemma, Llama-2; `gguf_spm.rs`, merges
//! derived from the pieces' scores). Other models are refused with
//! [`TokenizerError::Unsupported`]. Ids match Hugging Face transformers exactly on the fixture
//! strings in `tests/fixtures/tokenizer/` and on the Gemma-3 fixture's prompts
//! (`starling-engine/tests/hf_parity.rs`).

mod end_of_generation;
mod error;
mod gguf_bpe;
mod gguf_metadata;
mod gguf_spm;
mod hf_dir;
mod incremental;
mod pre_tokenizer;

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value as GgufValue;

pub use error::TokenizerError;
pub use incremental::IncrementalDecoder;

use end_of_generation::collect_end_of_generation_ids;
use gguf_metadata::GgufTokenizerMetadata;

/// Special tokens and how encoding treats them.
#[derive(Debug, Clone)]
pub(crate) struct SpecialTokens {
    pub(crate) bos_token_id: Option<u32>,
    pub(crate) bos_token: Option<String>,
    pub(crate) eos_token: Option<String>,
    /// Primary EOS first, then the other end-of-generation ids ascending.
    pub(crate) eos_token_ids: Vec<u32>,
    pub(crate) pad_token_id: Option<u32>,
    /// Prepend BOS ourselves in `encode(.., add_special_tokens = true)`.
    pub(crate) prepend_bos: bool,
}

/// A model's tokenizer: text ↔ ids, its special tokens and its chat template source.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    special: SpecialTokens,
    chat_template: Option<String>,
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes, from its metadata (as read by
    /// `candle_core::quantized::gguf_file::Content::read`).
    pub fn from_gguf_metadata(md: &HashMap<String, GgufValue>) -> Result<Self, TokenizerError> {
        let md = GgufTokenizerMetadata::read(md)?;
        let inner = if md.model == gguf_spm::SENTENCEPIECE_MODEL {
            gguf_spm::build(&md)?
        } else {
            gguf_bpe::build(&md)?
        };
        let named_eos = [md.eot_token_id, md.eom_token_id].into_iter().flatten();
        let eos_token_ids = collect_end_of_generation_ids(md.eos_token_id, named_eos, |text| {
            inner.token_to_id(text)
        });
        let text_of = |id: Option<u32>| id.and_then(|id| md.tokens.get(id as usize).cloned());
        let special = SpecialTokens {
            bos_token_id: md.bos_token_id,
            bos_token: text_of(md.bos_token_id),
            eos_token: text_of(md.eos_token_id),
            eos_token_ids,
            pad_token_id: md.padding_token_id,
            prepend_bos: md.add_bos_token && md.bos_token_id.is_some(),
        };
        Ok(Tokenizer {
            inner,
            special,
            chat_template: md.chat_template,
        })
    }

    /// Reads only the metadata of a GGUF file and builds its tokenizer.
    pub fn from_gguf_file(path: &Path) -> Result<Self, TokenizerError> {
        let io_error = |source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(io_error)?;
        let content = candle_core::quantized::gguf_file::Content::read(&mut file).map_err(|e| {
            TokenizerError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            }
        })?;
        Self::from_gguf_metadata(&content.metadata)
    }

    /// Loads `tokenizer.json` (and `tokenizer_config.json`, `chat_template.jinja`,
    /// `generation_config.json`, `config.json` when present) from a Hugging Face directory.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let files = hf_dir::load(dir)?;
        Ok(Tokenizer {
            inner: files.inner,
            special: files.special,
            chat_template: files.chat_template,
        })
    }

    /// Token ids for `text`. Special-token texts in `text` (e.g. `<|im_start|>`) become their
    /// ids. With `add_special_tokens`, BOS is prepended when the model asks for it.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode {
                message: e.to_string(),
            })?;
        let ids = encoding.get_ids();
        match self.special.bos_token_id {
            Some(bos) if add_special_tokens && self.special.prepend_bos => {
                let mut with_bos = Vec::with_capacity(ids.len() + 1);
                with_bos.push(bos);
                with_bos.extend_from_slice(ids);
                Ok(with_bos)
            }
            _ => Ok(ids.to_vec()),
        }
    }

    /// Text for `ids`; with `skip_special_tokens`, special tokens are left out. Invalid UTF-8
    /// (e.g. half a character) comes out as U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Decode {
                message: e.to_string(),
            })
    }

    /// Number of ids, added tokens included (the model's embedding rows may be more).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Beginning-of-sequence id, if the model has one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.special.bos_token_id
    }

    /// All ids that end generation: the primary EOS first, then the others ascending
    /// (e.g. SmolLM2: `<|im_end|>`, `<|endoftext|>`).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.special.eos_token_ids
    }

    /// True when `id` ends generation.
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.special.eos_token_ids.contains(&id)
    }

    /// Padding id, if the model names one.
    pub fn pad_token_id(&self) -> Option<u32> {
        self.special.pad_token_id
    }

    /// Whether `encode(.., true)` prepends BOS by itself (GGUF `add_bos_token`, or an HF
    /// config asking for BOS that its post-processor does not add).
    pub fn prepends_bos(&self) -> bool {
        self.special.prepend_bos
    }

    /// The id of a token text (added tokens included).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The text of an id as the vocabulary spells it (byte-level BPE: `Ġ` for a space).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The model's Jinja chat template source, if it ships one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// BOS text, for chat templates.
    pub fn bos_token(&self) -> Option<&str> {
        self.special.bos_token.as_deref()
    }

    /// Primary EOS text, for chat templates.
    pub fn eos_token(&self) -> Option<&str> {
        self.special.eos_token.as_deref()
    }
}

#[cfg(test)]
mod tests;

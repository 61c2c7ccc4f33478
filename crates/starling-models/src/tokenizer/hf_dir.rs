//! Loading a tokenizer from a Hugging Face model directory.
//!
//! `tokenizer.json` holds the tokenizer itself, including its post-processor (which is where
//! a Llama-style BOS gets added). Around it, `tokenizer_config.json` names the special tokens
//! and carries the chat template (newer exports put it in `chat_template.jinja`), and
//! `generation_config.json` / `config.json` list the ids that end generation.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::end_of_generation::collect_end_of_generation_ids;
use super::{SpecialTokens, TokenizerError};

/// Everything read from the directory.
pub(crate) struct HfTokenizerFiles {
    pub(crate) inner: tokenizers::Tokenizer,
    pub(crate) special: SpecialTokens,
    pub(crate) chat_template: Option<String>,
}

/// Reads `dir/tokenizer.json` and the optional files around it.
pub(crate) fn load(dir: &Path) -> Result<HfTokenizerFiles, TokenizerError> {
    let tokenizer_path = dir.join("tokenizer.json");
    if !tokenizer_path.is_file() {
        return Err(TokenizerError::Io {
            path: tokenizer_path,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "file not found"),
        });
    }
    let inner =
        tokenizers::Tokenizer::from_file(&tokenizer_path).map_err(|e| TokenizerError::Parse {
            path: tokenizer_path.clone(),
            message: e.to_string(),
        })?;
    let config = read_optional_json(&dir.join("tokenizer_config.json"))?;
    let generation = read_optional_json(&dir.join("generation_config.json"))?;
    let model_config = read_optional_json(&dir.join("config.json"))?;

    let token_field = |name: &str| config.as_ref().and_then(|c| token_content(c.get(name)?));
    let bos_token = token_field("bos_token");
    let eos_token = token_field("eos_token");
    let pad_token = token_field("pad_token");
    let lookup = |token: &Option<String>| token.as_deref().and_then(|t| inner.token_to_id(t));

    let bos_token_id = lookup(&bos_token).or_else(|| {
        first_id(generation.as_ref(), "bos_token_id")
            .or_else(|| first_id(model_config.as_ref(), "bos_token_id"))
    });
    let primary_eos = lookup(&eos_token)
        .or_else(|| first_id(model_config.as_ref(), "eos_token_id"))
        .or_else(|| first_id(generation.as_ref(), "eos_token_id"));
    let named_eos = all_ids(generation.as_ref(), "eos_token_id")
        .into_iter()
        .chain(all_ids(model_config.as_ref(), "eos_token_id"));
    let special_ids: Vec<u32> = inner
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, token)| token.special)
        .map(|(id, _)| id)
        .collect();
    // Only special added tokens count as end markers here: in a tokenizer.json a plain vocab
    // entry spelled "<|endoftext|>" is ordinary text.
    let eos_token_ids = collect_end_of_generation_ids(primary_eos, named_eos, |text| {
        inner
            .token_to_id(text)
            .filter(|id| special_ids.contains(id))
    });

    let add_bos_token = config
        .as_ref()
        .and_then(|c| c.get("add_bos_token"))
        .and_then(Json::as_bool)
        .unwrap_or(false);
    // The post-processor of most tokenizer.json files already adds BOS; add it by hand only
    // when the config asks for it and the post-processor does not.
    let post_processor_adds_bos = bos_token_id.is_some_and(|bos| {
        inner
            .encode("", true)
            .is_ok_and(|encoding| encoding.get_ids().first() == Some(&bos))
    });
    let pad_token_id =
        lookup(&pad_token).or_else(|| first_id(model_config.as_ref(), "pad_token_id"));

    let chat_template = read_chat_template(dir, config.as_ref())?;
    Ok(HfTokenizerFiles {
        special: SpecialTokens {
            bos_token_id,
            bos_token: bos_token.or_else(|| bos_token_id.and_then(|id| inner.id_to_token(id))),
            eos_token: eos_token.or_else(|| primary_eos.and_then(|id| inner.id_to_token(id))),
            eos_token_ids,
            pad_token_id,
            prepend_bos: add_bos_token && bos_token_id.is_some() && !post_processor_adds_bos,
        },
        chat_template,
        inner,
    })
}

/// Parses a JSON file if it exists.
fn read_optional_json(path: &Path) -> Result<Option<Json>, TokenizerError> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TokenizerError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TokenizerError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
}

/// A special token as tokenizer_config.json spells it: a string or `{"content": ...}`.
fn token_content(value: &Json) -> Option<String> {
    match value {
        Json::String(s) => Some(s.clone()),
        Json::Object(map) => map.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// Ids under `key`, which may be one integer or a list.
fn all_ids(config: Option<&Json>, key: &str) -> Vec<u32> {
    let to_id = |v: &Json| v.as_u64().and_then(|id| u32::try_from(id).ok());
    match config.and_then(|c| c.get(key)) {
        Some(Json::Array(items)) => items.iter().filter_map(to_id).collect(),
        Some(value) => to_id(value).into_iter().collect(),
        None => Vec::new(),
    }
}

fn first_id(config: Option<&Json>, key: &str) -> Option<u32> {
    all_ids(config, key).first().copied()
}

/// The chat template: `chat_template.jinja` if present, else tokenizer_config's
/// `chat_template` (a string, or a list of named templates of which `default` is used).
fn read_chat_template(dir: &Path, config: Option<&Json>) -> Result<Option<String>, TokenizerError> {
    let jinja: PathBuf = dir.join("chat_template.jinja");
    match fs::read_to_string(&jinja) {
        Ok(text) => return Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(TokenizerError::Io {
                path: jinja,
                source,
            })
        }
    }
    let Some(value) = config.and_then(|c| c.get("chat_template")) else {
        return Ok(None);
    };
    Ok(match value {
        Json::String(s) => Some(s.clone()),
        Json::Array(named) => {
            let template_of = |entry: &Json| entry.get("template")?.as_str().map(str::to_owned);
            named
                .iter()
                .find(|entry| entry.get("name").and_then(Json::as_str) == Some("default"))
                .and_then(template_of)
                .or_else(|| named.first().and_then(template_of))
        }
        _ => None,
    })
}

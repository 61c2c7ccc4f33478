//! ShareGPT conversations as benchmark requests, with vLLM's sampling rules, and the cached
//! chitchat-dataset conversion behind `--dataset sharegpt`.

use std::path::{Path, PathBuf};
use std::process::Command;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

use crate::client::StreamClient;
use crate::dataset::{BenchPrompt, BenchRequest};
use crate::error::BenchError;

/// The converter, shipped inside the binary so the cached dataset needs no checkout.
const CONVERTER_SOURCE: &str = include_str!("../../../scripts/chitchat_to_sharegpt.py");

/// File name of the converted dataset under `<home>/datasets/`.
pub const CACHED_FILE_NAME: &str = "chitchat_sharegpt.json";

/// vLLM's filters: prompts and completions shorter than this are dropped…
const MIN_LEN_TOKENS: usize = 4;
/// …as are prompts longer than this…
const MAX_PROMPT_LEN_TOKENS: usize = 1024;
/// …and pairs longer than this in total.
const MAX_TOTAL_LEN_TOKENS: usize = 2048;

#[derive(Deserialize)]
struct Turn {
    from: String,
    value: String,
}

#[derive(Deserialize)]
struct Conversation {
    conversations: Vec<Turn>,
}

/// Every conversation of a ShareGPT file as its (human turn, reply) exchanges, from the first
/// human turn while the roles alternate.
pub fn load_exchanges(path: &Path) -> Result<Vec<Vec<(String, String)>>, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|e| BenchError::io(path, e))?;
    let conversations: Vec<Conversation> =
        serde_json::from_str(&text).map_err(|source| BenchError::Json {
            context: format!("{} is not ShareGPT JSON", path.display()),
            source,
        })?;
    Ok(conversations
        .into_iter()
        .map(|c| {
            let mut exchanges = Vec::new();
            let mut turns = c.conversations.into_iter();
            while let (Some(human), Some(reply)) = (turns.next(), turns.next()) {
                if human.from != "human" || reply.from == "human" {
                    break;
                }
                exchanges.push((human.value, reply.value));
            }
            exchanges
        })
        .filter(|e| !e.is_empty())
        .collect())
}

/// The (first human turn, first reply) pairs of a ShareGPT file.
pub fn load_pairs(path: &Path) -> Result<Vec<(String, String)>, BenchError> {
    Ok(load_exchanges(path)?
        .into_iter()
        .filter_map(|e| e.into_iter().next())
        .collect())
}

/// Shuffles the pairs with `seed` and keeps the first `num_prompts` that pass vLLM's length
/// filters (and fit `max_model_len_tokens`), measuring lengths with the server's tokenizer; the
/// reply's length becomes the request's `max_tokens`.
pub async fn sample_requests(
    pairs: Vec<(String, String)>,
    num_prompts: usize,
    seed: u64,
    client: &StreamClient,
    max_model_len_tokens: usize,
) -> Result<Vec<BenchRequest>, BenchError> {
    let mut pairs = pairs;
    pairs.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    let mut requests = Vec::with_capacity(num_prompts);
    for (prompt, reply) in pairs {
        if requests.len() == num_prompts {
            break;
        }
        let prompt_len = client.count_tokens(&prompt).await?;
        let output_len = client.count_tokens(&reply).await?;
        let total = prompt_len + output_len;
        if prompt_len < MIN_LEN_TOKENS
            || output_len < MIN_LEN_TOKENS
            || prompt_len > MAX_PROMPT_LEN_TOKENS
            || total > MAX_TOTAL_LEN_TOKENS
            || total > max_model_len_tokens
        {
            continue;
        }
        requests.push(BenchRequest {
            prompt: BenchPrompt::Text(prompt),
            prompt_len_tokens: prompt_len,
            output_len_tokens: output_len,
        });
    }
    if requests.len() < num_prompts {
        return Err(BenchError::Invalid(format!(
            "the dataset has only {} usable conversations, {num_prompts} asked",
            requests.len()
        )));
    }
    Ok(requests)
}

/// The converted chitchat dataset under `<home>/datasets/`, fetched and converted on first use
/// by running the shipped converter with `python` (pip download, sha256 check, conversion).
pub fn ensure_cached(home: &Path, python: &std::ffi::OsStr) -> Result<PathBuf, BenchError> {
    let dir = home.join("datasets");
    let path = dir.join(CACHED_FILE_NAME);
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir).map_err(|e| BenchError::io(&dir, e))?;
    let script = dir.join("chitchat_to_sharegpt.py");
    std::fs::write(&script, CONVERTER_SOURCE).map_err(|e| BenchError::io(&script, e))?;
    let status = Command::new(python)
        .arg(&script)
        .arg("--output")
        .arg(&path)
        .status()
        .map_err(|e| BenchError::io(&script, e))?;
    if !status.success() || !path.is_file() {
        return Err(BenchError::Invalid(format!(
            "converting chitchat-dataset failed ({status}); run `python3 scripts/chitchat_to_sharegpt.py --output FILE` and pass --dataset FILE"
        )));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_take_the_first_human_turn_and_its_reply() {
        let dir = std::env::temp_dir().join(format!("starling-sharegpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.json");
        std::fs::write(
            &path,
            r#"[{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}, {"from": "human", "value": "x"}]},
                {"id": "b", "conversations": [{"from": "gpt", "value": "starts with the model"}, {"from": "human", "value": "no"}]},
                {"id": "c", "conversations": [{"from": "human", "value": "alone"}]}]"#,
        )
        .unwrap();
        let pairs = load_pairs(&path).unwrap();
        assert_eq!(pairs, vec![("hi".to_string(), "hello".to_string())]);
        std::fs::write(&path, "{").unwrap();
        assert!(matches!(load_pairs(&path), Err(BenchError::Json { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

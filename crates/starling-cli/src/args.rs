//! Flags shared by the commands that build an engine.

use clap::Args;

use crate::bytes::parse_bytes;

/// Which model to use.
#[derive(Args, Debug, Clone)]
pub struct ModelArg {
    /// An alias (`starling model list`), a GGUF file, or a Hugging Face model directory
    /// (config.json + *.safetensors + tokenizer.json). Aliases are fetched on first use.
    #[arg(long, short = 'm', default_value = starling_hub::DEFAULT_ALIAS)]
    pub model: String,
}

/// KV-cache and batching limits (vLLM's flag names).
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Longest context (prompt + output) in tokens; default: the model's own limit.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Memory for the KV cache, all layers (e.g. 2GiB, 512MiB, or bytes).
    #[arg(long, default_value = "2GiB", value_parser = parse_bytes)]
    pub kv_cache_memory: u64,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Most sequences in one step.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Most tokens in one step (decode tokens first, then prefill chunks).
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
}

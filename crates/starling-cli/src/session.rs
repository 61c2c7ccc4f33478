//! Opening a model: resolve the `--model` argument (fetching an alias), load weights, build the
//! tokenizer and the engine.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use starling_backend::Backend;
use starling_engine::engine::TokenizerText;
use starling_engine::scheduler::SchedulerConfig;
use starling_engine::{Engine, EngineConfig};
use starling_hub::DEFAULT_ALIAS;
use starling_hub::{resolve_model, FetchOptions, ModelLocation};
use starling_models::llama::{LatentRanks, LlamaModel};
use starling_models::tokenizer::Tokenizer;
use starling_models::{load_model, preset, LoadedModel, ModelConfig, WeightMap, PRESET_NAMES};

use crate::args::{EngineArgs, LoadFormat, ModelArg, CPU_KV_CACHE_DEFAULT_BYTES};

/// A model resolved and loaded from disk (weights still on the host).
pub struct OpenedModel {
    /// Where the model file or directory is.
    pub path: PathBuf,
    /// Weights, config and metadata.
    pub loaded: LoadedModel,
}

/// Resolves `arg` (alias, GGUF path or HF directory) and loads it.
pub fn open_model(arg: &str) -> Result<OpenedModel> {
    let options = FetchOptions::from_env()?;
    let location = resolve_model(arg, &options)?;
    let path = match location {
        ModelLocation::Gguf(p) | ModelLocation::HfDir(p) => p,
    };
    let loaded = load_model(&path).with_context(|| format!("loading {}", path.display()))?;
    Ok(OpenedModel { path, loaded })
}

/// Builds the tokenizer that matches a loaded model.
pub fn tokenizer_for(opened: &OpenedModel) -> Result<Tokenizer> {
    let tokenizer = match &opened.loaded.gguf_metadata {
        Some(metadata) => Tokenizer::from_gguf_metadata(metadata),
        None => Tokenizer::from_hf_dir(&opened.path),
    };
    tokenizer.with_context(|| format!("building the tokenizer of {}", opened.path.display()))
}

/// The tokenizer `--tokenizer` names: a directory holding `tokenizer.json` (a Hugging Face
/// model directory, or one with only the tokenizer files, as vLLM's `--tokenizer` takes) is read
/// without touching any weights; anything else is opened as a model (alias or GGUF file) and its
/// tokenizer taken.
fn tokenizer_from_arg(source: &str) -> Result<Tokenizer> {
    let dir = Path::new(source);
    if dir.is_dir() && dir.join("tokenizer.json").is_file() {
        return Tokenizer::from_hf_dir(dir)
            .with_context(|| format!("building the tokenizer of {}", dir.display()));
    }
    tokenizer_for(&open_model(source)?)
}

/// The engine configuration the flags describe, for `config`'s model; `kv_cache_memory_bytes` is
/// the budget already resolved (see [`kv_budget_bytes`]).
pub fn engine_config(
    args: &EngineArgs,
    config: &ModelConfig,
    kv_cache_memory_bytes: u64,
) -> EngineConfig {
    let max_model_len_tokens = args.max_model_len.unwrap_or(config.max_position_embeddings);
    EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: args.max_num_seqs,
            // Never smaller than the sequence count (the scheduler's own rule).
            max_num_batched_tokens: args.max_num_batched_tokens.max(args.max_num_seqs),
            max_model_len_tokens,
            block_size_tokens: args.block_size,
            admission: args.admission_policy.into(),
        },
        kv_cache_memory_bytes,
        kv_compression: args.cache_compression(),
        enable_prefix_caching: args.prefix_caching(),
        // Set from the model's source when the session starts (`model_identity`).
        model_identity: None,
    }
}

/// What identifies the weights of `source` in prefix-cache block hashes: where they come from
/// (a preset and seed for synthetic weights, else the path with the file's size and
/// modification time). The cache lives in one process, whose weights never change, so this
/// only has to tell engines apart; a persistent cache would need the weights' digest
/// (`starling_starkv::checkpoint::weights_identity`, a pass over every tensor).
fn model_identity(path: &std::path::Path, synthetic: bool) -> String {
    if synthetic {
        return format!("{}:seed=0", path.display());
    }
    let stamp = std::fs::metadata(path).ok().map(|m| {
        let modified = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        format!("{}:{modified}", m.len())
    });
    format!("{}:{}", path.display(), stamp.unwrap_or_default())
}

/// Memory kept free on a GPU beyond the utilisation share, for activations and workspaces.
const GPU_ACTIVATION_RESERVE_BYTES: u64 = 2 << 30;

/// The KV budget: `--kv-cache-memory` when given; on a device with its own memory (called after
/// the weights are loaded) what `--gpu-memory-utilization` leaves; else the CPU default.
pub fn kv_budget_bytes<B: Backend>(args: &EngineArgs, backend: &B) -> Result<u64> {
    if let Some(bytes) = args.kv_cache_memory {
        return Ok(bytes);
    }
    let Some((free, total)) = backend.memory_info() else {
        return Ok(CPU_KV_CACHE_DEFAULT_BYTES);
    };
    let util = args.gpu_memory_utilization;
    if !(util > 0.0 && util <= 1.0) {
        anyhow::bail!("--gpu-memory-utilization must be in (0, 1], got {util}");
    }
    let keep_free = ((1.0 - util) * total as f64) as u64 + GPU_ACTIVATION_RESERVE_BYTES;
    let budget = free.saturating_sub(keep_free);
    if budget == 0 {
        anyhow::bail!(
            "no GPU memory left for the KV cache: {} free of {}, {} to keep free at utilisation {util}",
            starling_kv::format_bytes(free),
            starling_kv::format_bytes(total),
            starling_kv::format_bytes(keep_free)
        );
    }
    Ok(budget)
}

/// A ready engine plus the tokenizer its requests are encoded with.
pub struct Session<B: Backend> {
    /// The engine.
    pub engine: Engine<B>,
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Milliseconds spent reading the model.
    pub load_ms: u64,
}

/// A model read (or, synthetic, described) and its tokenizer, before any engine: what
/// [`start_session`] builds an engine from. The demo loads one and starts several engines from
/// clones of it.
#[derive(Clone)]
pub struct ModelSource {
    /// The model's shapes (end-of-generation ids completed from the tokenizer).
    pub config: ModelConfig,
    /// The weights on the host; `None` for `--load-format synthetic`.
    pub weights: Option<WeightMap>,
    /// With synthetic weights: every layer caches latents of these ranks
    /// (`--synthetic-latent-share`); `None`: full K/V.
    pub synthetic_latent: Option<LatentRanks>,
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Where the model came from (`synthetic:<preset>` for presets).
    pub path: PathBuf,
    /// Milliseconds spent reading the model.
    pub load_ms: u64,
}

/// Resolves and reads `model_arg` (or builds a preset's config), with its tokenizer; checks
/// what can be checked before an engine exists (`--max-model-len` against the model's window,
/// STAR-KV needing real weights).
pub fn load_source(model_arg: &ModelArg, args: &EngineArgs) -> Result<ModelSource> {
    let (mut config, weights, tokenizer, path, load_ms) = match model_arg.load_format {
        LoadFormat::Auto => {
            let opened = open_model(&model_arg.model)?;
            let tokenizer = match &model_arg.tokenizer {
                Some(other) => tokenizer_from_arg(other)?,
                None => tokenizer_for(&opened)?,
            };
            let load_ms = opened.loaded.load_ms;
            (
                opened.loaded.config,
                Some(opened.loaded.weights),
                tokenizer,
                opened.path,
                load_ms,
            )
        }
        LoadFormat::Synthetic => {
            let config = preset(&model_arg.model).with_context(|| {
                format!(
                    "--load-format synthetic takes a preset: {}",
                    PRESET_NAMES.join(", ")
                )
            })?;
            let source = model_arg.tokenizer.as_deref().unwrap_or(DEFAULT_ALIAS);
            let tokenizer = tokenizer_from_arg(source)?;
            if tokenizer.vocab_size() > config.vocab_size {
                tracing::warn!(
                    "tokenizer of {source} has {} tokens, the {} preset {}: prompts with larger ids are refused",
                    tokenizer.vocab_size(),
                    model_arg.model,
                    config.vocab_size
                );
            }
            let path = PathBuf::from(format!("synthetic:{}", model_arg.model));
            (config, None, tokenizer, path, 0)
        }
    };
    let synthetic_latent = model_arg.synthetic_latent_ranks(&config)?;
    // The tokenizer knows every end-of-generation marker (e.g. Qwen's <|endoftext|> beside
    // <|im_end|>); the model config may list only the declared EOS.
    for &id in tokenizer.eos_token_ids() {
        if !config.eos_token_ids.contains(&id) && (id as usize) < config.vocab_size {
            config.eos_token_ids.push(id);
        }
    }
    if let Some(len) = args.max_model_len {
        if len > config.max_position_embeddings {
            anyhow::bail!(
                "--max-model-len {len} exceeds the model's context window of {} tokens",
                config.max_position_embeddings
            );
        }
    }
    if weights.is_none() && args.kv_compression.star_kv().is_some() {
        anyhow::bail!(
            "--kv-compression star_kv needs the model's real weights (its checkpoint is tied to \
             them), not --load-format synthetic (--synthetic-latent-share gives random latents \
             of a chosen share)"
        );
    }
    Ok(ModelSource {
        config,
        weights,
        synthetic_latent,
        tokenizer: Arc::new(tokenizer),
        path,
        load_ms,
    })
}

/// Resolves, loads (or, with `--load-format synthetic`, builds) and starts an engine on `backend`.
pub fn open_session<B: Backend + 'static>(
    backend: B,
    model_arg: &ModelArg,
    args: &EngineArgs,
) -> Result<Session<B>> {
    start_session(backend, load_source(model_arg, args)?, args)
}

/// Builds the model of `source` on `backend` (with the STAR-KV checkpoint or the synthetic
/// latents it asks for) and starts an engine on it, its cache sized from the layout the model
/// caches.
pub fn start_session<B: Backend + 'static>(
    backend: B,
    source: ModelSource,
    args: &EngineArgs,
) -> Result<Session<B>> {
    let ModelSource {
        config,
        weights,
        synthetic_latent,
        tokenizer,
        load_ms,
        path,
    } = source;
    let identity = model_identity(&path, weights.is_none());
    let started = std::time::Instant::now();
    let engine_config = engine_config(args, &config, 0);
    let text = Arc::new(TokenizerText(tokenizer.clone()));
    tracing::info!("engine on {}", backend.name());
    // The KV budget is what the device has left once the weights are resident, so the model is
    // built first; the engine then sizes its cache from the layout the model caches.
    let (model, star_kv) = match weights {
        Some(weights) => {
            let selection = engine_config.kv_compression.star_kv.as_ref();
            starling_engine::engine::load_model(&backend, &config, weights, selection)
                .with_context(|| match selection {
                    Some(s) => format!("STAR-KV checkpoint {}", s.checkpoint.display()),
                    None => "loading the model".to_owned(),
                })?
        }
        None => {
            let model = match synthetic_latent {
                // Every layer: the shape of the prior work's runs (no layer kept whole).
                Some(ranks) => {
                    let ranks = vec![Some(ranks); config.num_layers];
                    LlamaModel::synthetic_latent(&backend, &config, 0, &ranks)?
                }
                None => LlamaModel::synthetic(&backend, &config, 0)?,
            };
            (model, None)
        }
    };
    let load_ms = load_ms + started.elapsed().as_millis() as u64;
    let engine_config = EngineConfig {
        kv_cache_memory_bytes: kv_budget_bytes(args, &backend)?,
        model_identity: Some(identity),
        ..engine_config
    };
    let mut engine = Engine::with_loaded_model(backend, model, star_kv, Some(text), engine_config)?;
    // 0: every due compaction completes in the step that made it due.
    engine.set_compaction_step_budget(
        Some(args.compaction_step_budget_tokens).filter(|&tokens| tokens > 0),
    );
    let profiling = args.kernel_profile && engine.start_kernel_profile()?;
    if profiling {
        tracing::info!(
            "kernel profile on: every launch timed by site (/metrics \
             starling:kernel_gpu_seconds_total); decode steps eager, launches serialised"
        );
    } else if args.kernel_profile {
        tracing::warn!("no kernel profile on {}", engine.backend_name());
    }
    if args.cuda_graphs == crate::args::OnOff::On && !profiling {
        // The CPU backend has no graphs: the default `on` is then silently moot.
        if engine.enable_decode_graphs()? {
            tracing::info!("CUDA graphs for decode steps: on");
        } else {
            tracing::debug!("no decode graphs on {}", engine.backend_name());
        }
    }
    Ok(Session {
        engine,
        tokenizer,
        load_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::tokenizer_from_arg;

    /// A word-level tokenizer.json of three tokens (the `tokenizers` format, written by hand).
    const TOKENIZER_JSON: &str = r#"{"version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"hello": 0, "world": 1, "[UNK]": 2},
                  "unk_token": "[UNK]"}}"#;

    #[test]
    fn a_directory_holding_only_a_tokenizer_is_read_without_weights() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), TOKENIZER_JSON).unwrap();
        let source = dir.path().to_str().unwrap();
        let tokenizer = tokenizer_from_arg(source).unwrap();
        assert_eq!(tokenizer.encode("hello world", false).unwrap(), vec![0, 1]);
        // Without tokenizer.json the directory is opened as a model, and says what is missing.
        std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
        let err = format!("{:#}", tokenizer_from_arg(source).unwrap_err());
        assert!(err.contains(source), "{err}");
    }
}

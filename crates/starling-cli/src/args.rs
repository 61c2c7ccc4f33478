//! Flags shared by the commands that build an engine.

use anyhow::Context;
use clap::Args;

use crate::bytes::parse_bytes;

/// Which model to use.
#[derive(Args, Debug, Clone)]
pub struct ModelArg {
    /// An alias (`starling model list`), a GGUF file, or a Hugging Face model directory
    /// (config.json + *.safetensors + tokenizer.json). Aliases are fetched on first use.
    /// With `--load-format synthetic`: a preset name (llama2-7b, llama3-8b, qwen2.5-7b, …).
    #[arg(long, short = 'm', default_value = starling_hub::DEFAULT_ALIAS)]
    pub model: String,
    /// `auto` reads the weights; `synthetic` builds the `--model` preset's shapes with random
    /// weights made on the device (vLLM's dummy format): for performance runs, where weight
    /// values do not change speed.
    #[arg(long, value_enum, default_value_t = LoadFormat::Auto)]
    pub load_format: LoadFormat,
    /// Take the tokenizer from this model (alias or GGUF) or directory (an HF model directory,
    /// or one holding only tokenizer.json and its configs) instead of `--model`; default with
    /// `--load-format synthetic`: the default model's.
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// With `--load-format synthetic`: every layer caches STAR-KV latents keeping this share of
    /// its K/V elements (key rank per head `round(head_dim × share)`, value rank
    /// `round(kv_heads × head_dim × share)`, each padded to a multiple of 8), with random
    /// factors: the latent cache's capacity and speed at real shapes, without a checkpoint.
    /// 0.5 on llama2-7b is 64 per head and 2048, the prior work's 50% shape.
    #[arg(long, value_name = "SHARE")]
    pub synthetic_latent_share: Option<f64>,
}

impl ModelArg {
    /// How result files and plot titles name the model: the alias or preset as given, or the
    /// file (or directory) name of a path — never the path, since results leave the machine.
    pub fn display_name(&self) -> String {
        let path = std::path::Path::new(&self.model);
        if path.components().count() > 1 {
            if let Some(name) = path.file_name() {
                return name.to_string_lossy().into_owned();
            }
        }
        self.model.clone()
    }

    /// The latent ranks `--synthetic-latent-share` asks for, checked against the load format
    /// (`None` without the flag).
    pub fn synthetic_latent_ranks(
        &self,
        config: &starling_models::ModelConfig,
    ) -> anyhow::Result<Option<starling_models::llama::LatentRanks>> {
        let Some(share) = self.synthetic_latent_share else {
            return Ok(None);
        };
        if self.load_format != LoadFormat::Synthetic {
            anyhow::bail!(
                "--synthetic-latent-share builds random latent factors: it needs \
                 --load-format synthetic (a real model's latents come from a STAR-KV checkpoint, \
                 --kv-compression star_kv)"
            );
        }
        let ranks = starling_models::llama::LatentRanks::at_share(config, share)
            .context("--synthetic-latent-share")?;
        Ok(Some(ranks))
    }
}

/// How model weights are obtained.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadFormat {
    /// Read them from the model file or directory.
    Auto,
    /// Random values of the right shapes, made by the backend.
    Synthetic,
}

/// Where the model runs.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    /// CUDA if available, else CPU.
    Auto,
    /// The f32 CPU backend.
    Cpu,
    /// GPU 0 through the CUDA backend.
    Cuda,
}

/// Default KV-cache budget on the CPU.
pub const CPU_KV_CACHE_DEFAULT_BYTES: u64 = 2 << 30;

/// KV-cache and batching limits (vLLM's flag names).
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Longest context (prompt + output) in tokens; default: the model's own limit.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Compute device: `cuda` (GPU 0), `cpu`, or `auto` (CUDA when a driver and a GPU are present).
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,
    /// Memory for the KV cache, all layers (e.g. 2GiB, 512MiB, or bytes). Default: 2GiB on the
    /// CPU; on a GPU, what --gpu-memory-utilization leaves after the weights.
    #[arg(long, value_parser = parse_bytes)]
    pub kv_cache_memory: Option<u64>,
    /// Share of the GPU's memory Starling may use in all (weights, activations, KV cache), as
    /// vLLM's flag; ignored on the CPU and when --kv-cache-memory is given.
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Most sequences in one step.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Most tokens in one step (decode tokens first, then prefill chunks).
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// KV compression as JSON (vLLM-style additional config). Token eviction for every
    /// request, e.g. '{"method":"keydiff","ratio":0.5}' (methods: none, keydiff, knorm,
    /// streaming_llm, random, snapkv, tova; optional sink_tokens (4), window_tokens (32),
    /// every_n_tokens (64), seed), which a request may override with a `kv_compression` body
    /// field; or STAR-KV, '{"method":"star_kv","checkpoint":DIR,"rank_profile":"balanced"}'
    /// (a `starling calibrate` output), applied to the model's K/V projections at load and
    /// never selectable per request.
    #[arg(long, value_parser = parse_compression, default_value = r#"{"method":"none"}"#)]
    pub kv_compression: starling_evict::KvCompression,
    /// The KV cache's element type (vLLM's flag): `auto` stores the model's activation dtype
    /// (bf16 on CUDA, f32 on the CPU), dense K/V and STAR-KV latents alike; `fp8` (alias
    /// `fp8_e4m3`) stores full K/V in one byte per element (e4m3, scale 1, as vLLM's default),
    /// twice the blocks of bf16 (layers whose key bias e4m3 cannot hold stay in the activation
    /// dtype); with STAR-KV it stores the latents in fp8 too (CUDA: sm_89+); `int8` stores
    /// symmetric 8-bit integers with a half-precision scale per KV head row (or latent) and
    /// token, no layer exempt, and `int4` 4-bit integers (two per byte) with a half-precision
    /// scale per 32 elements of such a row (both CPU only so far). Given, it overrides a `kv_dtype` in
    /// --kv-compression's composed form.
    #[arg(long, value_parser = parse_kv_cache_dtype)]
    pub kv_cache_dtype: Option<starling_evict::KvCacheDtype>,
    /// When a waiting request may start: `optimistic` (as vLLM: when its first chunk fits;
    /// growth collisions preempt the newest; a compressing request once preempted waits until
    /// the free blocks cover its own peak), `optimistic-readmit` (the same for every preempted
    /// request, compressed or not) or `reserve-peak` (every request only while the projected peak
    /// of every running request and its own fit — fewer preemptions, above all with eviction).
    #[arg(long, value_enum, default_value_t = AdmissionArg::Optimistic)]
    pub admission_policy: AdmissionArg,
    /// Replay decode-only steps from CUDA graphs recorded per batch-size bucket (fewer kernel
    /// launches at small batch); prefill and mixed steps stay eager. Ignored on the CPU. A replay
    /// is bit-identical to the eager step (tests/graphs_gpu.rs, run on an H200).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub cuda_graphs: OnOff,
    /// Time every device launch by site (kernel name, or cuBLAS call and weight shape) for a
    /// per-kernel breakdown: `/metrics` reports `starling:kernel_gpu_seconds_total` and
    /// `starling:kernel_launches_total` per site, which `starling bench serve --kernel-profile`
    /// turns into a table. Decode steps run eager (no CUDA graphs) and launches serialise, so
    /// use it to see where time goes, not to measure throughput. Ignored on the CPU.
    #[arg(long)]
    pub kernel_profile: bool,
    /// Token eviction work one step may do while other requests run, in token-layers (a layer
    /// of a request holding n tokens costs n): a longer compaction is spread over steps, its
    /// request paused meanwhile, so no step waits long on another request's eviction. At least
    /// one layer a step; 0 = no limit (each compaction completes in the step that makes it due).
    #[arg(long, default_value_t = starling_engine::DEFAULT_COMPACTION_STEP_BUDGET_TOKENS)]
    pub compaction_step_budget_tokens: usize,
    /// Automatic prefix caching: full KV blocks are addressed by content and reused by later
    /// requests with the same prefix, so only the uncached rest of a prompt is computed. On by
    /// default in `starling serve` (as vLLM), off in the other commands unless given.
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Turns automatic prefix caching off (vLLM's flag).
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,
    /// Whether prefix caching is on when neither flag is given: set by the command (`serve`
    /// turns it on), not a flag.
    #[arg(skip)]
    pub prefix_caching_by_default: bool,
}

impl EngineArgs {
    /// The engine's one compression value: --kv-compression, with --kv-cache-dtype when given.
    pub fn cache_compression(&self) -> starling_evict::KvCompression {
        let mut setting = self.kv_compression.clone();
        if let Some(dtype) = self.kv_cache_dtype {
            setting.kv_dtype = dtype;
        }
        setting
    }

    /// Whether the engine caches prefixes: a flag if given, else the command's default.
    pub fn prefix_caching(&self) -> bool {
        if self.enable_prefix_caching {
            return true;
        }
        !self.no_enable_prefix_caching && self.prefix_caching_by_default
    }
}

/// A switch flag's values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnOff {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// `--admission-policy` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionArg {
    /// Admit while the first chunk fits.
    Optimistic,
    /// Admit while the projected peaks fit.
    ReservePeak,
    /// As optimistic, and every preempted request waits until its own peak fits.
    OptimisticReadmit,
}

impl From<AdmissionArg> for starling_engine::scheduler::AdmissionPolicy {
    fn from(arg: AdmissionArg) -> Self {
        match arg {
            AdmissionArg::Optimistic => Self::Optimistic,
            AdmissionArg::ReservePeak => Self::ReservePeak,
            AdmissionArg::OptimisticReadmit => Self::OptimisticReadmit,
        }
    }
}

/// Parses a `--kv-cache-dtype` name (its serde name; an unknown one is an error naming the valid
/// ones).
fn parse_kv_cache_dtype(text: &str) -> Result<starling_evict::KvCacheDtype, String> {
    use serde::Deserialize;
    let name = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(text);
    starling_evict::KvCacheDtype::deserialize(name).map_err(|e| e.to_string())
}

/// Parses and validates a `--kv-compression` JSON object (a STAR-KV profile name included).
fn parse_compression(text: &str) -> Result<starling_evict::KvCompression, String> {
    let setting = starling_evict::KvCompression::from_json(text).map_err(|e| e.to_string())?;
    if let Some(selection) = setting.star_kv() {
        selection
            .rank_profile
            .parse::<starling_starkv::ProfileRef>()
            .map_err(|e| e.to_string())?;
    }
    Ok(setting)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use starling_evict::KvCacheDtype;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        engine: EngineArgs,
        #[command(flatten)]
        model: ModelArg,
    }

    fn prefix_caching(flags: &[&str], by_default: bool) -> bool {
        let mut args = Cli::parse_from(std::iter::once("starling").chain(flags.iter().copied()));
        args.engine.prefix_caching_by_default = by_default;
        args.engine.prefix_caching()
    }

    #[test]
    fn prefix_caching_follows_the_flags_then_the_commands_default() {
        assert!(!prefix_caching(&[], false));
        assert!(prefix_caching(&[], true), "serve's default");
        assert!(!prefix_caching(&["--no-enable-prefix-caching"], true));
        assert!(prefix_caching(&["--enable-prefix-caching"], false));
        // The last of the two flags wins, as in vLLM.
        let both = ["--enable-prefix-caching", "--no-enable-prefix-caching"];
        assert!(!prefix_caching(&both, true));
        let both = ["--no-enable-prefix-caching", "--enable-prefix-caching"];
        assert!(prefix_caching(&both, false));
    }

    #[test]
    fn kv_cache_dtype_takes_auto_fp8_int8_or_int4_and_refuses_what_is_not_built_naming_auto() {
        let parse = |flags: &[&str]| {
            Cli::try_parse_from(std::iter::once("starling").chain(flags.iter().copied()))
                .map(|cli| cli.engine.cache_compression())
        };
        let default = parse(&[]).map_err(|e| e.to_string());
        assert_eq!(default.map(|c| c.kv_dtype), Ok(KvCacheDtype::Auto));
        let auto = parse(&["--kv-cache-dtype", "auto"]).map_err(|e| e.to_string());
        assert_eq!(auto.map(|c| c.kv_dtype), Ok(KvCacheDtype::Auto));
        let fp8 = parse(&["--kv-cache-dtype", "fp8"]).map_err(|e| e.to_string());
        assert_eq!(fp8.map(|c| c.kv_dtype), Ok(KvCacheDtype::Fp8));
        let int8 = parse(&["--kv-cache-dtype", "int8"]).map_err(|e| e.to_string());
        assert_eq!(int8.map(|c| c.kv_dtype), Ok(KvCacheDtype::Int8));
        let int4 = parse(&["--kv-cache-dtype", "int4"]).map_err(|e| e.to_string());
        assert_eq!(int4.map(|c| c.kv_dtype), Ok(KvCacheDtype::Int4));
        for bad in ["int2", "fp16"] {
            let err = match parse(&["--kv-cache-dtype", bad]) {
                Err(e) => e.to_string(),
                Ok(_) => panic!("--kv-cache-dtype {bad} accepted"),
            };
            assert!(err.contains(bad) && err.contains("auto"), "{err}");
        }
        // The flag and the JSON compose into one value.
        let composed = parse(&[
            "--kv-compression",
            r#"{"method":"keydiff","ratio":0.5}"#,
            "--kv-cache-dtype",
            "auto",
        ])
        .map_err(|e| e.to_string());
        assert_eq!(
            composed.map(|c| (c.eviction.method, c.kv_dtype)),
            Ok((
                starling_evict::CompressionMethod::KeyDiff,
                KvCacheDtype::Auto
            ))
        );
    }

    #[test]
    fn results_name_a_model_by_alias_or_file_name_never_by_path() {
        let name = |model: &str| {
            Cli::parse_from(["starling", "--model", model])
                .model
                .display_name()
        };
        assert_eq!(name("qwen2.5-coder-1.5b"), "qwen2.5-coder-1.5b");
        assert_eq!(name("models/qwen.gguf"), "qwen.gguf");
        assert_eq!(name("/data/hf/Qwen3-0.6B/"), "Qwen3-0.6B");
        assert_eq!(name("./smol.gguf"), "smol.gguf");
    }
}

//! `starling info`: architecture, parameter count, KV bytes per token, block count and max
//! concurrency for a memory budget.

use anyhow::Result;
use clap::Args;
use starling_kv::{format_bytes, preflight, CacheDtype, CacheLayout, LayerLayout};
use starling_models::{ModelConfig, RopeStyle};

use crate::args::{EngineArgs, LoadFormat, ModelArg};
use crate::session::{engine_config, open_model};

/// `starling info` flags.
#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    engine: EngineArgs,
}

/// The uncompressed cache layout of `config` with elements of `dtype`.
pub fn full_layout(config: &ModelConfig, dtype: CacheDtype) -> CacheLayout {
    CacheLayout::uniform(
        config.num_layers,
        LayerLayout::Full {
            num_kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
            dtype,
        },
    )
}

/// Runs `starling info`.
pub fn run(args: InfoArgs) -> Result<()> {
    let (config, source, load_ms) = match args.model.load_format {
        LoadFormat::Auto => {
            let opened = open_model(&args.model.model)?;
            let source = opened.path.display().to_string();
            (opened.loaded.config, source, opened.loaded.load_ms)
        }
        LoadFormat::Synthetic => (
            starling_models::preset(&args.model.model)?,
            "synthetic preset".to_string(),
            0,
        ),
    };
    let c = &config;
    println!("model:         {} ({source})", args.model.model);
    println!(
        "architecture:  {} — {} layers, d {}, FFN {}, {} q / {} kv heads × {}, vocab {}",
        c.architecture.name(),
        c.num_layers,
        c.hidden_size,
        c.intermediate_size,
        c.num_attention_heads,
        c.num_kv_heads,
        c.head_dim,
        c.vocab_size
    );
    println!(
        "positions:     context {} tokens, RoPE θ {} ({}){}",
        c.max_position_embeddings,
        c.rope.theta,
        match c.rope.style {
            RopeStyle::Interleaved => "interleaved",
            RopeStyle::Neox => "NeoX",
        },
        if c.rope.scaling.is_some() {
            ", scaled"
        } else {
            ""
        }
    );
    println!(
        "parameters:    {:.1} M (loaded in {} ms)",
        c.num_params() as f64 / 1e6,
        load_ms
    );
    let budget = args
        .engine
        .kv_cache_memory
        .unwrap_or(crate::args::CPU_KV_CACHE_DEFAULT_BYTES);
    let engine = engine_config(&args.engine, c, budget);
    let sched = &engine.scheduler;
    // The CPU backend stores the cache in f32; the bf16 figure is what a GPU cache costs.
    for dtype in [CacheDtype::F32, CacheDtype::BF16] {
        let layout = full_layout(c, dtype);
        println!(
            "KV cache {:>4}:  {} per token ({} per layer)",
            format!("{dtype:?}").to_lowercase(),
            format_bytes(layout.bytes_per_token()),
            format_bytes(layout.bytes_per_token() / c.num_layers.max(1) as u64),
        );
    }
    // The CPU backend caches f32, the CUDA backend bf16.
    let on_gpu = match args.engine.device {
        crate::args::DeviceArg::Cpu => false,
        crate::args::DeviceArg::Cuda => true,
        crate::args::DeviceArg::Auto => starling_cuda::cuda_available(),
    };
    let (dtype, dtype_name) = if on_gpu {
        (CacheDtype::BF16, "bf16, cuda")
    } else {
        (CacheDtype::F32, "f32, cpu")
    };
    let layout = full_layout(c, dtype);
    let pf = preflight(
        engine.kv_cache_memory_bytes,
        &layout,
        sched.block_size_tokens,
        sched.max_model_len_tokens,
    )?;
    println!(
        "budget:        {} ({dtype_name}) → {} blocks × {} tokens = {} tokens; max concurrency {:.2} at {} tokens",
        format_bytes(engine.kv_cache_memory_bytes),
        pf.sizing.num_blocks,
        pf.sizing.block_size_tokens,
        pf.sizing.capacity_tokens(),
        pf.max_concurrency,
        sched.max_model_len_tokens
    );
    Ok(())
}

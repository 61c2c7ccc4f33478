//! `starling info`: architecture, parameter count, KV bytes per token, block count and max
//! concurrency for a memory budget; with STAR-KV, the same per rank profile.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use starling_kv::{
    format_bytes, group_blocks_for_tokens, group_held_tokens, preflight, preflight_grouped,
    preflight_with_peak, CacheDtype, CacheGroups, CacheLayout, CacheSizing, LayerLayout,
    LATENT_RANK_MULTIPLE,
};
use starling_models::llama::fp8_exempt_layers_of;
use starling_models::{ModelConfig, RopeStyle};
use starling_starkv::checkpoint::{read_manifest, MANIFEST_FILE};
use starling_starkv::{
    uniform_allocation, BudgetTarget, CacheBudget, KvShape, ProfileRef, RankAllocation,
    RankProfile, UncompressedLayers,
};

use crate::args::{EngineArgs, LoadFormat, ModelArg};
use crate::session::{engine_config, open_model};

/// `starling info` flags.
#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    engine: EngineArgs,
    /// STAR-KV checkpoints to size the cache for: a `starling calibrate --output` directory
    /// (every profile found) or one profile's checkpoint. Default: the `--kv-compression`
    /// star_kv checkpoint, if any.
    #[arg(long, value_name = "DIR")]
    star_kv: Option<PathBuf>,
    /// Print what each STAR-KV profile would give from the budget math alone (uniform ranks,
    /// the first two and the last layer whole): for synthetic presets, or models not yet
    /// calibrated.
    #[arg(long)]
    star_kv_budget: bool,
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

/// The cache layout `--kv-cache-dtype fp8` gives `config`: fp8 full K/V, except the `exempt`
/// layers (key biases e4m3 cannot hold), which keep `auto_dtype` — every layer does when the
/// model mixes windowed and full layers, whose cache groups share one slot tensor per position
/// (`LlamaModel::block_layout`'s rule).
pub fn fp8_layout(config: &ModelConfig, auto_dtype: CacheDtype, exempt: &[usize]) -> CacheLayout {
    let mixed_windows = config
        .sliding_window
        .as_ref()
        .is_some_and(|w| w.layers.iter().any(|windowed| !windowed));
    if mixed_windows && !exempt.is_empty() {
        return full_layout(config, auto_dtype);
    }
    let mut layout = full_layout(config, CacheDtype::Fp8);
    keep_exempt_layers(&mut layout, exempt, auto_dtype);
    layout
}

/// The full layers of `layout` among `exempt` back in `auto_dtype` (fp8's per-layer rule; latent
/// layers carry no key bias and stay as they are).
fn keep_exempt_layers(layout: &mut CacheLayout, exempt: &[usize], auto_dtype: CacheDtype) {
    for &l in exempt {
        if let Some(layer) = layout
            .layers
            .get_mut(l)
            .filter(|layer| !layer.is_low_rank())
        {
            *layer = layer.with_dtype(auto_dtype);
        }
    }
}

/// `; layers 0, 1 stay bf16 (key bias over 32: too large for fp8)` for the fp8 line, or nothing.
fn fp8_exemption_note(layout: &CacheLayout, exempt: &[usize], auto_dtype: CacheDtype) -> String {
    if exempt.is_empty() {
        return String::new();
    }
    let list = |layers: &mut dyn Iterator<Item = usize>| {
        layers.map(|l| l.to_string()).collect::<Vec<_>>().join(", ")
    };
    let kept: Vec<usize> = (0..layout.layers.len())
        .filter(|&l| layout.layers[l].dtype() != CacheDtype::Fp8)
        .collect();
    let which = if kept.len() == layout.layers.len() {
        format!(
            "every layer stays (layers {} share its slots)",
            list(&mut exempt.iter().copied())
        )
    } else {
        format!("layers {} stay", list(&mut kept.into_iter()))
    };
    format!(
        "; {which} {} (key bias over {}: too large for fp8)",
        format!("{auto_dtype:?}").to_lowercase(),
        starling_models::llama::fp8_max_key_bias()
    )
}

/// Runs `starling info`.
pub fn run(args: InfoArgs) -> Result<()> {
    // The layers an fp8 cache leaves in the activation dtype follow from the weights (key
    // biases), by the rule the engine applies at load; synthetic weights have none.
    let (config, source, load_ms, fp8_exempt) = match args.model.load_format {
        LoadFormat::Auto => {
            let opened = open_model(&args.model.model)?;
            let source = opened.path.display().to_string();
            let loaded = opened.loaded;
            let exempt = fp8_exempt_layers_of(&loaded.config, &loaded.weights);
            (loaded.config, source, loaded.load_ms, exempt)
        }
        LoadFormat::Synthetic => (
            starling_models::preset(&args.model.model)?,
            "synthetic preset".to_string(),
            0,
            Vec::new(),
        ),
    };
    let c = &config;
    // Refused before anything is printed when the flags disagree.
    let synthetic_latent = args.model.synthetic_latent_ranks(c)?;
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
    let (auto_dtype, device) = if on_gpu {
        (CacheDtype::BF16, "cuda")
    } else {
        (CacheDtype::F32, "cpu")
    };
    // `--kv-cache-dtype fp8` / `int8` size K/V (and STAR-KV latents) at one byte per element,
    // int8 plus a scale per vector.
    let kv_dtype = args.engine.cache_compression().kv_dtype;
    let fp8 = kv_dtype == starling_evict::KvCacheDtype::Fp8;
    let dtype = match kv_dtype {
        starling_evict::KvCacheDtype::Auto => auto_dtype,
        starling_evict::KvCacheDtype::Fp8 => CacheDtype::Fp8,
        starling_evict::KvCacheDtype::Int8 => CacheDtype::Int8,
        starling_evict::KvCacheDtype::Int4 => CacheDtype::Int4,
    };
    let dtype_name = format!("{}, {device}", format!("{dtype:?}").to_lowercase());
    let dtype_name = dtype_name.as_str();
    let full = if fp8 {
        fp8_layout(c, auto_dtype, &fp8_exempt)
    } else {
        full_layout(c, dtype)
    };
    let pf = preflight(
        engine.kv_cache_memory_bytes,
        &full,
        sched.block_size_tokens,
        sched.max_model_len_tokens,
    );
    let dense_blocks = match &pf {
        Ok(pf) => {
            println!(
                "budget:        {} ({dtype_name}) → {} blocks × {} tokens = {} tokens; max concurrency {:.2} at {} tokens; longest bootable context {} tokens",
                format_bytes(engine.kv_cache_memory_bytes),
                pf.sizing.num_blocks,
                pf.sizing.block_size_tokens,
                pf.sizing.capacity_tokens(),
                pf.max_concurrency,
                sched.max_model_len_tokens,
                longest_context(pf.sizing.capacity_tokens(), c)
            );
            pf.sizing.num_blocks
        }
        // Under eviction or STAR-KV a context the dense cache refuses may still boot: say so
        // and keep going.
        Err(e) => {
            println!("budget:        full K/V: {e}");
            CacheSizing::from_budget(engine.kv_cache_memory_bytes, &full, sched.block_size_tokens)?
                .num_blocks
        }
    };
    let quantised_note = match dtype {
        CacheDtype::Fp8 => Some(format!(
            "e4m3, values rounded to nearest and saturated to ±448 when written{}",
            fp8_exemption_note(&full, &fp8_exempt, auto_dtype)
        )),
        CacheDtype::Int8 => Some(
            "symmetric int8, a half-precision scale per KV head row and token; CPU reference \
             only so far"
                .to_owned(),
        ),
        CacheDtype::Int4 => Some(
            "symmetric int4 (two per byte), a half-precision scale per 32 elements of a KV \
             head row and token; CPU reference only so far"
                .to_owned(),
        ),
        _ => None,
    };
    if let Some(note) = quantised_note {
        let auto = full_layout(c, auto_dtype);
        let auto_blocks =
            CacheSizing::from_budget(engine.kv_cache_memory_bytes, &auto, sched.block_size_tokens)?
                .num_blocks;
        println!(
            "{:<15}{} per token vs {} in {} → {} blocks vs {} ({:.2}×; {note})",
            format!("{} cache:", dtype_label(dtype)),
            format_bytes(full.bytes_per_token()),
            format_bytes(auto.bytes_per_token()),
            dtype_label(auto_dtype),
            dense_blocks,
            auto_blocks,
            dense_blocks as f64 / auto_blocks.max(1) as f64,
        );
    }
    // Whether the cache the flags configure boots: the exit status says it, so a script can
    // ask `starling info` before it starts a server.
    let mut refusal = pf.as_ref().err().map(|e| format!("full K/V: {e}"));
    if let Some(windowed) = print_window_fit(&engine, &full, c) {
        refusal = windowed.err();
    }
    if let Some(evicting) = print_eviction_fit(&engine, &full, c) {
        refusal = evicting.err();
    }
    let rows = star_kv_rows(&args, c)?;
    let configured_star_kv = args.engine.kv_compression.star_kv().is_some();
    if !rows.is_empty() {
        println!(
            "STAR-KV latent layout ({dtype_name}; what the engine allocates: ranks stored in multiples of {LATENT_RANK_MULTIPLE}, plus each token's position):"
        );
    }
    for row in rows {
        // Under fp8 the latents are fp8 too; the full layers follow the dense rule.
        let mut layout = row.allocation.cache_layout(dtype);
        if fp8 {
            keep_exempt_layers(&mut layout, &fp8_exempt, auto_dtype);
        }
        let bytes = layout.bytes_per_token();
        let ranks_bytes = dtype.bytes_for(row.allocation.elements_per_token());
        // (int8's and int4's scales are in `bytes`, not in the ranks alone.)
        let sized = CacheSizing::from_budget(
            engine.kv_cache_memory_bytes,
            &layout,
            sched.block_size_tokens,
        )?;
        println!(
            "  {:<13} {} per token vs {} ({:.1}% removed; the ranks alone {}) → {} blocks vs {} ({:.2}×), longest bootable context {} tokens; {}",
            row.profile.dir_name(),
            format_bytes(bytes),
            format_bytes(full.bytes_per_token()),
            100.0 * (1.0 - bytes as f64 / full.bytes_per_token().max(1) as f64),
            format_bytes(ranks_bytes),
            sized.num_blocks,
            dense_blocks,
            sized.num_blocks as f64 / dense_blocks.max(1) as f64,
            longest_context(sized.capacity_tokens(), c),
            row.source
        );
        if configured_star_kv && row.selected {
            refusal = preflight(
                engine.kv_cache_memory_bytes,
                &layout,
                sched.block_size_tokens,
                sched.max_model_len_tokens,
            )
            .err()
            .map(|e| format!("STAR-KV {}: {e}", row.profile.dir_name()));
        }
    }
    if let Some(ranks) = &synthetic_latent {
        refusal =
            print_synthetic_latent_row(&engine, c, ranks, auto_dtype, dtype_name, dense_blocks)?;
    }
    match refusal {
        Some(why) => bail!("the configured KV cache does not boot: {why}"),
        None => Ok(()),
    }
}

/// With `--synthetic-latent-share`: the latent layout every layer of the synthetic model
/// caches, sized from the budget beside the full one's `dense_blocks`. Returns why the
/// configured cache (these latents, under any engine-wide eviction) does not boot, if it
/// does not.
fn print_synthetic_latent_row(
    engine: &starling_engine::EngineConfig,
    config: &ModelConfig,
    ranks: &starling_models::llama::LatentRanks,
    dtype: CacheDtype,
    dtype_name: &str,
    dense_blocks: usize,
) -> Result<Option<String>> {
    let sched = &engine.scheduler;
    let layout = CacheLayout::uniform(config.num_layers, ranks.layout(dtype));
    let full = full_layout(config, dtype);
    let sized = CacheSizing::from_budget(
        engine.kv_cache_memory_bytes,
        &layout,
        sched.block_size_tokens,
    )?;
    let key_ranks = match (ranks.key_ranks.iter().min(), ranks.key_ranks.iter().max()) {
        (Some(lo), Some(hi)) if lo != hi => format!("{lo}-{hi}"),
        (Some(r), _) => r.to_string(),
        _ => "none".to_owned(),
    };
    println!(
        "synthetic latents ({dtype_name}; every layer, key rank {key_ranks} per head, value rank {}): {} per token vs {} ({:.1}% removed) → {} blocks vs {} ({:.2}×), longest bootable context {} tokens",
        ranks.value_rank,
        format_bytes(layout.bytes_per_token()),
        format_bytes(full.bytes_per_token()),
        100.0 * (1.0 - layout.bytes_per_token() as f64 / full.bytes_per_token().max(1) as f64),
        sized.num_blocks,
        dense_blocks,
        sized.num_blocks as f64 / dense_blocks.max(1) as f64,
        longest_context(sized.capacity_tokens(), config)
    );
    let peak = starling_engine::engine::eviction_peak_tokens(
        &engine.kv_compression.eviction,
        sched.max_model_len_tokens,
        sched.max_num_batched_tokens,
    );
    Ok(preflight_with_peak(
        engine.kv_cache_memory_bytes,
        &layout,
        sched.block_size_tokens,
        sched.max_model_len_tokens,
        peak,
    )
    .err()
    .map(|e| format!("synthetic latents: {e}")))
}

/// The longest context a cache of `capacity_tokens` slots boots (one sequence, every token
/// held), within the model's window.
fn longest_context(capacity_tokens: usize, config: &ModelConfig) -> usize {
    capacity_tokens.min(config.max_position_embeddings)
}

/// A sliding-window model's line: the window, which layers use it, and what a `max_model_len`
/// sequence holds — the window, a block and a chunk when every layer is windowed (its blocks
/// behind the window released), every slot when some layer is full. `None` without a window;
/// else whether the budget boots it (the refusal as text), as the engine's preflight decides.
fn print_window_fit(
    engine: &starling_engine::EngineConfig,
    layout: &starling_kv::CacheLayout,
    config: &ModelConfig,
) -> Option<std::result::Result<(), String>> {
    let window = config.sliding_window.as_ref()?;
    let windowed = window.layers.iter().filter(|w| **w).count();
    if engine.kv_compression.eviction.evicts() {
        println!(
            "sliding window: {} tokens on {windowed} of {} layers; under eviction every layer \
             keeps its slots in one block table (nothing released behind the window) and at \
             least the window's {} recent tokens are protected, so each window stays exact",
            window.tokens, config.num_layers, window.tokens
        );
        return None;
    }
    let local_rope = window
        .rope
        .as_ref()
        .map_or(String::new(), |r| format!(", RoPE θ {} there", r.theta));
    let sched = &engine.scheduler;
    let max_len = sched.max_model_len_tokens;
    let head = format!(
        "sliding window: {} tokens on {windowed} of {} layers{local_rope}",
        window.tokens, config.num_layers
    );
    let Some(peak) = starling_engine::engine::window_peak_tokens(
        config,
        sched.block_size_tokens,
        max_len,
        sched.max_num_batched_tokens,
    ) else {
        return Some(print_hybrid_fit(engine, layout, config, &head));
    };
    Some(
        match preflight_with_peak(
            engine.kv_cache_memory_bytes,
            layout,
            sched.block_size_tokens,
            max_len,
            peak,
        ) {
            Ok(pf) => {
                println!(
                    "{head}; every layer windowed: a {max_len}-token sequence holds at most {peak} \
                     tokens ({}: the window, a block and one {}-token chunk; blocks behind the \
                     window are released) → boots; max concurrency {:.2}",
                    format_bytes(layout.bytes_per_token() * peak as u64),
                    sched.max_num_batched_tokens,
                    pf.max_concurrency
                );
                Ok(())
            }
            Err(e) => {
                println!("{head}: {e}");
                Err(format!("sliding window: {e}"))
            }
        },
    )
}

/// A model mixing windowed and full layers (Gemma-3): its cache groups (the windowed layers'
/// blocks in tables of their own, released behind the window), what one `max_model_len`
/// sequence holds against keeping every slot, and whether the budget boots it.
fn print_hybrid_fit(
    engine: &starling_engine::EngineConfig,
    layout: &starling_kv::CacheLayout,
    config: &ModelConfig,
    head: &str,
) -> std::result::Result<(), String> {
    let sched = &engine.scheduler;
    let (max_len, bs, chunk) = (
        sched.max_model_len_tokens,
        sched.block_size_tokens,
        sched.max_num_batched_tokens,
    );
    let windows: Vec<_> = (0..config.num_layers)
        .map(|l| config.layer_window_tokens(l))
        .collect();
    let groups = CacheGroups::plan(&windows).map_err(|e| e.to_string())?;
    let Some(layer) = layout.layers.first() else {
        return Err("a model without layers".into());
    };
    let layer_bytes = layer.bytes_per_token();
    let full_layers = windows.iter().filter(|w| w.is_none()).count() as u64;
    let windowed_layers = config.num_layers as u64 - full_layers;
    let held = windows
        .iter()
        .find_map(|w| *w)
        .map_or(max_len, |w| group_held_tokens(Some(w), bs, max_len, chunk));
    let holds = layer_bytes * (full_layers * max_len as u64 + windowed_layers * held as u64);
    let blocks = group_blocks_for_tokens(&groups.windows(), bs, max_len, chunk);
    let block_layout = starling_kv::CacheLayout {
        layers: vec![layer.clone(); groups.num_slots()],
    };
    let verdict = preflight_grouped(
        engine.kv_cache_memory_bytes,
        &block_layout,
        bs,
        max_len,
        blocks,
    );
    let verdict_text = match &verdict {
        Ok(pf) => format!("boots; max concurrency {:.2}", pf.max_concurrency),
        Err(e) => format!("refused: {e}"),
    };
    println!(
        "{head}; windowed layers keep their blocks in tables of their own ({} block tables of \
         {} layers, {} padding), released behind the window: a {max_len}-token sequence holds \
         {} ({full_layers} full layers x {max_len} tokens + {windowed_layers} windowed x {held}: \
         the window, a block and one {chunk}-token chunk) vs {} with every slot kept ({:.2}x), \
         in {blocks} blocks of {} → {verdict_text}",
        groups.num_groups(),
        groups.num_slots(),
        groups.padding_layers(),
        format_bytes(holds),
        format_bytes(layout.bytes_per_token() * max_len as u64),
        (layout.bytes_per_token() * max_len as u64) as f64 / holds.max(1) as f64,
        format_bytes(block_layout.bytes_per_block(bs)),
    );
    verdict
        .map(|_| ())
        .map_err(|e| format!("sliding window: {e}"))
}

/// Under an evicting `--kv-compression`, what one `max_model_len` sequence holds at its peak
/// (kept tokens plus a chunk in flight) and whether the budget boots it, as the engine's
/// preflight decides. `None` without eviction; else whether it boots (the refusal as text).
fn print_eviction_fit(
    engine: &starling_engine::EngineConfig,
    layout: &starling_kv::CacheLayout,
    config: &ModelConfig,
) -> Option<std::result::Result<(), String>> {
    // As the engine runs it: a windowed model protects at least its window's recent tokens.
    let policy = &starling_engine::engine::protect_window(config, &engine.kv_compression.eviction);
    if !policy.evicts() {
        return None;
    }
    let sched = &engine.scheduler;
    let max_len = sched.max_model_len_tokens;
    let peak = starling_engine::engine::eviction_peak_tokens(
        policy,
        max_len,
        sched.max_num_batched_tokens,
    );
    match preflight_with_peak(
        engine.kv_cache_memory_bytes,
        layout,
        sched.block_size_tokens,
        max_len,
        peak,
    ) {
        Ok(pf) => {
            println!(
            "eviction:      {} at ratio {}: a {max_len}-token sequence holds at most {peak} tokens (kept + one {}-token chunk) → boots; max concurrency {:.2}; longest bootable context {} tokens",
            policy.method,
            policy.ratio,
            sched.max_num_batched_tokens,
            pf.max_concurrency,
            longest_context(
                starling_engine::engine::longest_evicting_context(
                    policy,
                    pf.sizing.capacity_tokens(),
                    sched.max_num_batched_tokens
                ),
                config
            )
        );
            Some(Ok(()))
        }
        Err(e) => {
            println!(
                "eviction:      {} at ratio {}: {e}",
                policy.method, policy.ratio
            );
            Some(Err(format!("eviction {}: {e}", policy.method)))
        }
    }
}

/// One STAR-KV profile's ranks and where they came from.
struct StarKvRow {
    profile: ProfileRef,
    allocation: RankAllocation,
    source: String,
    /// The profile `--kv-compression` names (the one the engine would load).
    selected: bool,
}

/// The profiles to print: from checkpoints (`--star-kv`, else a star_kv `--kv-compression`),
/// or from the budget math (`--star-kv-budget`); none otherwise.
fn star_kv_rows(args: &InfoArgs, config: &ModelConfig) -> Result<Vec<StarKvRow>> {
    let selection = args.engine.kv_compression.star_kv();
    let dir = args
        .star_kv
        .clone()
        .or_else(|| selection.map(|s| s.checkpoint.clone()));
    if let Some(dir) = dir {
        let selected = selection.map(|s| s.rank_profile.as_str());
        return checkpoint_rows(&dir, config, selected);
    }
    if !args.star_kv_budget {
        return Ok(Vec::new());
    }
    let shape = KvShape::of(config);
    let keep = UncompressedLayers::reference(config.num_layers);
    RankProfile::ALL
        .into_iter()
        .map(|profile| {
            let budget = CacheBudget::new(&shape, profile.target(), &keep)
                .with_context(|| format!("STAR-KV profile {profile}"))?;
            Ok(StarKvRow {
                profile: profile.into(),
                allocation: uniform_allocation(&shape, &budget, &keep)?,
                source: "uniform ranks from the budget alone".to_owned(),
                selected: false,
            })
        })
        .collect()
}

/// `fp8`, `int8`, `bf16`…
fn dtype_label(dtype: CacheDtype) -> String {
    format!("{dtype:?}").to_lowercase()
}

/// Rows from the manifests under `dir` (ranks only; the weights are not read), checked against
/// the model's shape.
fn checkpoint_rows(
    dir: &Path,
    config: &ModelConfig,
    selected: Option<&str>,
) -> Result<Vec<StarKvRow>> {
    // Every profile folder `starling calibrate` wrote: named profiles and shares alike.
    let dirs: Vec<PathBuf> = if dir.join(MANIFEST_FILE).is_file() {
        vec![dir.to_owned()]
    } else {
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|d| d.join(MANIFEST_FILE).is_file())
            .collect();
        found.sort();
        found
    };
    if dirs.is_empty() {
        bail!(
            "no STAR-KV checkpoint in {} (expected {MANIFEST_FILE} there or in a profile \
             sub-directory; see `starling calibrate`)",
            dir.display()
        );
    }
    let shape = KvShape::of(config);
    let mut rows = Vec::with_capacity(dirs.len());
    for path in dirs {
        let manifest = read_manifest(&path)?;
        if manifest.model.shape != shape {
            bail!(
                "STAR-KV checkpoint {} was made for {:?}, this model is {shape:?}",
                path.display(),
                manifest.model.shape
            );
        }
        let profile = match manifest.profile {
            Some(named) => ProfileRef::Named(named),
            None => ProfileRef::Removed(
                BudgetTarget::removed_permille(manifest.removed_permille)
                    .with_context(|| format!("STAR-KV checkpoint {}", path.display()))?,
            ),
        };
        let is_selected = selected.and_then(|s| s.parse::<ProfileRef>().ok()) == Some(profile);
        let mark = if is_selected { " (selected)" } else { "" };
        rows.push(StarKvRow {
            profile,
            allocation: manifest.allocation()?,
            source: format!("{} ranks, {}{mark}", manifest.rank_strategy, path.display()),
            selected: is_selected,
        });
    }
    Ok(rows)
}

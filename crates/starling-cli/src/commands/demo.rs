//! `starling demo`: the README's main job. A few chat prompts go through the engine together
//! (continuous batching) three times on the same KV memory budget — full K/V, token eviction,
//! and STAR-KV latents — and each arm's answers, bytes held and blocks left free are printed,
//! then a table side by side.
//!
//! The STAR-KV arm runs a checkpoint for the model: `--star-kv DIR`, or one the demo calibrates
//! on first use and caches under `$STARLING_HOME` (`demo/checkpoint.rs`). On synthetic presets
//! it runs random latents instead (`--synthetic-latent-share`, default 0.5).

mod arm;
mod checkpoint;

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use starling_backend::Backend;
use starling_evict::{
    CompressionConfig, KvCompression, StarKvCache, StarKvFactors, StarKvSelection,
};
use starling_kv::{format_bytes, CacheDtype};
use starling_models::llama::LatentRanks;
use starling_starkv::RankProfile;

use crate::args::{EngineArgs, ModelArg};
use crate::commands::generate::encode_prompt;
use crate::commands::info::full_layout;
use crate::device::{with_backend, BackendJob};
use crate::session::{load_source, start_session, ModelSource};
use arm::{run_arm, ArmOutcome};

const PROMPTS: [&str; 4] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "In one sentence, why do language models cache keys and values?",
    "Name three primary colors.",
];

/// The eviction arm's policy unless `--eviction` says otherwise: KeyDiff (no attention
/// scores needed, so it runs on any backend) at half the evictable tokens. The protected
/// recent window and the re-compression period are 16 tokens instead of the engine's 32 and
/// 64, which would protect every token of answers this short; at 8 the haiku loops.
const DEFAULT_EVICTION: &str =
    r#"{"method":"keydiff","ratio":0.5,"window_tokens":16,"every_n_tokens":16}"#;

/// The latent share of the STAR-KV arm on synthetic presets without `--synthetic-latent-share`.
const DEFAULT_SYNTHETIC_SHARE: f64 = 0.5;

/// The demo's context window unless `--max-model-len` says otherwise (within the model's).
const DEMO_MAX_MODEL_LEN_TOKENS: usize = 2048;

/// The demo's KV budget unless `--kv-cache-memory` says otherwise: full K/V for this many
/// `max_model_len` contexts. A whole device's memory would hold every arm's prompts a thousand
/// times over and cap every arm's longest context at the model's window; one and a half
/// contexts make the arms' block counts and longest contexts differ visibly.
const DEMO_BUDGET_CONTEXTS: f64 = 1.5;

/// `starling demo` flags.
#[derive(Args, Debug)]
pub struct DemoArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Most tokens per answer.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// The eviction arm's policy, as `--kv-compression` takes it (methods: keydiff, knorm,
    /// streaming_llm, random, snapkv, tova).
    #[arg(long, value_parser = parse_eviction, default_value = DEFAULT_EVICTION)]
    eviction: CompressionConfig,
    /// The STAR-KV arm's checkpoints: a `starling calibrate --output` folder. Default: one
    /// calibrated for the model on first use (whitened SVD, no distillation) and cached under
    /// $STARLING_HOME/star-kv/, keyed by the weights' identity.
    #[arg(long, value_name = "DIR")]
    star_kv: Option<PathBuf>,
    /// The STAR-KV arm's rank profile: aggressive, balanced or conservative (30, 15 or 8% of
    /// the K/V bytes removed).
    #[arg(long, value_parser = parse_profile, default_value = "balanced")]
    rank_profile: RankProfile,
    /// Engine flags. The demo's own defaults: `--max-model-len` 2048 (or the model's window if
    /// smaller) and a `--kv-cache-memory` of full K/V for one and a half such contexts, the
    /// same for every arm.
    #[command(flatten)]
    engine: EngineArgs,
}

fn parse_eviction(text: &str) -> Result<CompressionConfig, String> {
    let config = CompressionConfig::from_json(text).map_err(|e| e.to_string())?;
    if !config.evicts() {
        return Err("the eviction arm needs a method that evicts and a ratio above 0".into());
    }
    Ok(config)
}

fn parse_profile(name: &str) -> Result<RankProfile, String> {
    name.parse()
        .map_err(|e: starling_starkv::StarKvError| e.to_string())
}

/// Runs `starling demo`.
pub fn run(args: DemoArgs) -> Result<()> {
    if args.engine.kv_compression != KvCompression::default() {
        bail!(
            "the demo runs its own arms (plain, eviction, STAR-KV): set them with --eviction and \
             --star-kv / --rank-profile, not --kv-compression"
        );
    }
    with_backend(args.engine.device, args)
}

impl BackendJob for DemoArgs {
    fn run<B: Backend + 'static>(self, backend: B) -> Result<()> {
        demo(backend, self)
    }
}

/// One arm: its name, the engine-wide compression it runs with, and for synthetic presets the
/// latent ranks of its model.
struct ArmPlan {
    name: &'static str,
    detail: String,
    compression: KvCompression,
    synthetic_latent: Option<LatentRanks>,
}

fn demo<B: Backend + 'static>(backend: B, args: DemoArgs) -> Result<()> {
    let plain_model = ModelArg {
        synthetic_latent_share: None,
        ..args.model.clone()
    };
    let source = load_source(&plain_model, &args.engine)?;
    println!("device: {}", backend.name());
    println!(
        "model: {} (loaded in {} ms)",
        source.path.display(),
        source.load_ms
    );
    let star_kv = star_kv_plan(&backend, &source, &args)?;
    let plans = [
        ArmPlan {
            name: "plain",
            detail: "full K/V".to_owned(),
            compression: KvCompression::default(),
            synthetic_latent: None,
        },
        ArmPlan {
            name: "eviction",
            detail: format!(
                "{} at ratio {}, every {} tokens",
                args.eviction.method, args.eviction.ratio, args.eviction.every_n_tokens
            ),
            compression: KvCompression {
                eviction: args.eviction.clone(),
                ..KvCompression::default()
            },
            synthetic_latent: None,
        },
        star_kv,
    ];
    let prompts = PROMPTS
        .iter()
        .map(|p| encode_prompt(&source.tokenizer, p, true, None))
        .collect::<Result<Vec<_>>>()?;

    // Every arm gets the same budget, so the blocks differ only by the layout.
    let (max_model_len, budget_bytes) = demo_sizes(&args.engine, &source, backend.kv_cache_dtype());
    let mut backend = backend;
    let mut source = Some(source);
    let mut outcomes = Vec::with_capacity(plans.len());
    let last = plans.len() - 1;
    for (i, plan) in plans.iter().enumerate() {
        let engine_args = EngineArgs {
            kv_compression: plan.compression.clone(),
            kv_cache_memory: Some(budget_bytes),
            max_model_len: Some(max_model_len),
            ..args.engine.clone()
        };
        // The last arm takes the weights; the others work on copies.
        let model = if i == last {
            source.take()
        } else {
            source.clone()
        };
        let Some(model) = model else {
            bail!("the model was handed to an earlier arm");
        };
        let model = ModelSource {
            synthetic_latent: plan.synthetic_latent.clone(),
            ..model
        };
        let mut session = start_session(backend, model, &engine_args)?;
        let outcome = run_arm(&mut session.engine, &prompts, args.max_tokens)?;
        print_arm(plan, &outcome);
        outcomes.push(outcome);
        backend = session.engine.into_backend();
    }
    print_summary(&plans, &outcomes, budget_bytes);
    Ok(())
}

/// The context window and KV budget every arm runs with: the flags', else the demo's defaults
/// ([`DEMO_MAX_MODEL_LEN_TOKENS`], [`DEMO_BUDGET_CONTEXTS`] of full K/V in `dtype`).
fn demo_sizes(engine: &EngineArgs, source: &ModelSource, dtype: CacheDtype) -> (usize, u64) {
    let window = source.config.max_position_embeddings;
    let max_model_len = engine
        .max_model_len
        .unwrap_or(DEMO_MAX_MODEL_LEN_TOKENS.min(window));
    let budget = engine.kv_cache_memory.unwrap_or_else(|| {
        let tokens = (DEMO_BUDGET_CONTEXTS * max_model_len as f64).ceil() as u64;
        full_layout(&source.config, dtype)
            .bytes_per_token()
            .saturating_mul(tokens)
    });
    (max_model_len, budget)
}

/// The STAR-KV arm: the checkpoint (`--star-kv`, else the cached one, calibrated now if
/// missing) for real weights, random latents for synthetic presets.
fn star_kv_plan<B: Backend>(backend: &B, source: &ModelSource, args: &DemoArgs) -> Result<ArmPlan> {
    if source.weights.is_none() {
        let latent_model = ModelArg {
            synthetic_latent_share: Some(
                args.model
                    .synthetic_latent_share
                    .unwrap_or(DEFAULT_SYNTHETIC_SHARE),
            ),
            ..args.model.clone()
        };
        let ranks = latent_model.synthetic_latent_ranks(&source.config)?;
        return Ok(ArmPlan {
            name: "STAR-KV",
            detail: format!(
                "synthetic latents at share {}",
                latent_model.synthetic_latent_share.unwrap_or_default()
            ),
            compression: KvCompression::default(),
            synthetic_latent: ranks,
        });
    }
    // Refuses --synthetic-latent-share on real weights (their latents come from a checkpoint).
    args.model.synthetic_latent_ranks(&source.config)?;
    let (dir, how) = match &args.star_kv {
        Some(dir) => (dir.clone(), "given".to_owned()),
        None => {
            let cached = checkpoint::ensure(backend, source, &args.model.model, args.rank_profile)?;
            let how = match cached.calibrated_s {
                Some(s) => format!("calibrated now in {s:.1} s, cached"),
                None => "cached, reused".to_owned(),
            };
            (cached.dir, how)
        }
    };
    println!(
        "STAR-KV checkpoint: {} ({how}), profile {}",
        dir.display(),
        args.rank_profile
    );
    Ok(ArmPlan {
        name: "STAR-KV",
        detail: format!("{} latents", args.rank_profile),
        compression: KvCompression {
            star_kv: Some(StarKvSelection {
                checkpoint: dir,
                rank_profile: args.rank_profile.name().to_owned(),
                factors: StarKvFactors::Both,
                cache: StarKvCache::Latent,
            }),
            ..KvCompression::default()
        },
        synthetic_latent: None,
    })
}

fn print_arm(plan: &ArmPlan, outcome: &ArmOutcome) {
    println!("\n== {} ({}): {}", plan.name, plan.detail, outcome.report);
    for (prompt, answer) in PROMPTS.iter().zip(&outcome.answers) {
        println!("\n> {prompt}\n{answer}");
    }
    let evicted = if outcome.evicted_tokens > 0 {
        format!(", {} tokens evicted", outcome.evicted_tokens)
    } else {
        String::new()
    };
    println!(
        "\n{} requests held at most {} in {} blocks, and when done {} ({}); {} of {} blocks left free; {} tokens in {:.2} s ({:.1} tokens/s), {} preemptions{evicted}",
        outcome.answers.len(),
        format_bytes(outcome.peak_bytes()),
        outcome.peak_blocks,
        format_bytes(outcome.final_bytes()),
        kept(outcome),
        outcome.free_blocks_at_peak(),
        outcome.report.num_blocks,
        outcome.generated_tokens,
        outcome.elapsed_s,
        outcome.generated_tokens as f64 / outcome.elapsed_s.max(f64::MIN_POSITIVE),
        outcome.preemptions,
    );
}

/// `kept N of M tokens`: the slots the finished requests held against their lengths.
fn kept(outcome: &ArmOutcome) -> String {
    format!(
        "kept {} of {} tokens",
        outcome.final_tokens, outcome.final_logical_tokens
    )
}

/// The arms side by side (a table a script can read: `|`-separated, one row per arm).
fn print_summary(plans: &[ArmPlan], outcomes: &[ArmOutcome], budget_bytes: u64) {
    println!(
        "\nSame KV budget for every arm: {} (--kv-cache-memory)",
        format_bytes(budget_bytes)
    );
    println!(
        "| arm | KV per token | blocks | held at peak | held when done | blocks free at peak | longest context (tokens) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (plan, outcome) in plans.iter().zip(outcomes) {
        let report = &outcome.report;
        println!(
            "| {} | {} | {} | {} ({} blocks) | {} ({}) | {} | {} |",
            plan.name,
            format_bytes(report.bytes_per_token),
            report.num_blocks,
            format_bytes(outcome.peak_bytes()),
            outcome.peak_blocks,
            format_bytes(outcome.final_bytes()),
            kept(outcome),
            outcome.free_blocks_at_peak(),
            report.longest_context_tokens
        );
    }
}

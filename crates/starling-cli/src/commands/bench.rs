//! `starling bench ...`: measurements that go to bench/results/ (never timed tests).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use starling_engine::sampling::SamplingParams;

use crate::args::{EngineArgs, ModelArg};
use crate::device::{with_backend, BackendJob};
use crate::session::open_session;
use starling_backend::Backend;

/// `starling bench ...`
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Prefill and decode throughput of the engine at fixed batch sizes (synthetic prompts,
    /// greedy, fixed output length).
    Throughput(ThroughputArgs),
    /// GPU kernel timings: paged decode / prefill attention and the KV write, each with its
    /// bandwidth against the device copy bandwidth measured in the same run.
    Kernels(crate::commands::bench_gpu::KernelsArgs),
    /// GPU decode step time of synthetic real-shape models against the memory roofline.
    Decode(crate::commands::bench_gpu::DecodeArgs),
    /// GPU eviction compaction of one layer (KeyDiff), selected on the host (scores copied
    /// back) and on the device: what the engine thread waits and what the device spends.
    Compaction(crate::commands::bench_gpu::CompactionArgs),
    /// Serving benchmark against a running `starling serve` (vLLM benchmark_serving metrics).
    Serve(super::bench_serve::BenchServeArgs),
    /// The serving campaigns (concurrency, context length, long generation, scheduler) against
    /// several engines' server command lines (Starling's arms, vLLM) on the same KV memory:
    /// boots each, runs the points, writes JSON, markdown and PNGs into a dated folder.
    Campaign(super::bench_campaign::CampaignArgs),
    /// Needle in a haystack over context lengths × depths × KV-compression methods (Paul Graham
    /// essays, greedy): accuracy tables, heatmaps, KV bytes held.
    Niah(super::bench_niah::NiahArgs),
    /// KV-compression quality on held-out essay text: mean KL of next-token distributions
    /// against the uncompressed run, and perplexity.
    Quality(super::bench_quality::QualityArgs),
}

/// `starling bench throughput` flags.
#[derive(Args, Debug)]
pub struct ThroughputArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Batch sizes to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    batch_sizes: Vec<usize>,
    /// Prompt length of every request, tokens.
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Generated tokens per request.
    #[arg(long, default_value_t = 64)]
    output_tokens: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    output: Option<std::path::PathBuf>,
    #[command(flatten)]
    engine: EngineArgs,
}

/// One batch size's figures.
#[derive(Debug, serde::Serialize)]
struct ThroughputRow {
    batch_size: usize,
    prompt_tokens: usize,
    output_tokens: usize,
    prefill_s: f64,
    prefill_tokens_per_s: f64,
    decode_s: f64,
    decode_tokens_per_s: f64,
    decode_step_ms: f64,
}

/// Runs `starling bench ...`.
pub fn run(args: BenchArgs) -> Result<()> {
    match args.command {
        BenchCommand::Throughput(a) => throughput(a),
        BenchCommand::Serve(a) => super::bench_serve::run(a),
        BenchCommand::Campaign(a) => super::bench_campaign::run(a),
        BenchCommand::Kernels(a) => crate::commands::bench_gpu::kernels(a),
        BenchCommand::Decode(a) => crate::commands::bench_gpu::decode(a),
        BenchCommand::Compaction(a) => crate::commands::bench_gpu::compaction(a),
        BenchCommand::Niah(a) => super::bench_niah::run(a),
        BenchCommand::Quality(a) => super::bench_quality::run(a),
    }
}

fn throughput(args: ThroughputArgs) -> Result<()> {
    if args.output_tokens < 2 || args.prompt_tokens == 0 {
        bail!("need --prompt-tokens ≥ 1 and --output-tokens ≥ 2");
    }
    with_backend(args.engine.device, args)
}

impl BackendJob for ThroughputArgs {
    fn run<B: Backend + 'static>(self, backend: B) -> Result<()> {
        throughput_on(backend, self)
    }
}

fn throughput_on<B: Backend + 'static>(backend: B, args: ThroughputArgs) -> Result<()> {
    let mut session = open_session(backend, &args.model, &args.engine)?;
    let backend_name = session.engine.backend_name();
    let vocab = session.engine.model().config().vocab_size as u32;
    let mut rows = Vec::new();
    println!("| batch | prompt | output | prefill tok/s | decode tok/s | decode step ms |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for &batch in &args.batch_sizes {
        let params = SamplingParams {
            temperature: 0.0,
            max_tokens: Some(args.output_tokens),
            ignore_eos: true,
            ..SamplingParams::default()
        };
        let started = Instant::now();
        for r in 0..batch {
            // Deterministic, varied token ids away from the special-token range.
            let ids = (0..args.prompt_tokens as u32)
                .map(|i| 1000 + (i * 7919 + r as u32 * 104_729) % (vocab - 1000))
                .collect();
            session.engine.add_request(ids, params.clone())?;
        }
        let mut first_tokens = 0;
        let mut prefill_s = None;
        let mut decode_steps = 0usize;
        while session.engine.has_unfinished() {
            let outs = session.engine.step()?;
            if prefill_s.is_some() {
                decode_steps += 1;
            }
            first_tokens += outs.iter().filter(|o| o.num_output_tokens == 1).count();
            if prefill_s.is_none() && first_tokens == batch {
                prefill_s = Some(started.elapsed().as_secs_f64());
            }
        }
        let total_s = started.elapsed().as_secs_f64();
        let prefill_s = prefill_s.context("no request produced a token")?;
        let decode_s = total_s - prefill_s;
        let row = ThroughputRow {
            batch_size: batch,
            prompt_tokens: args.prompt_tokens,
            output_tokens: args.output_tokens,
            prefill_s,
            prefill_tokens_per_s: (batch * args.prompt_tokens) as f64 / prefill_s,
            decode_s,
            decode_tokens_per_s: (batch * (args.output_tokens - 1)) as f64 / decode_s,
            decode_step_ms: decode_s * 1e3 / decode_steps.max(1) as f64,
        };
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} |",
            row.batch_size,
            row.prompt_tokens,
            row.output_tokens,
            row.prefill_tokens_per_s,
            row.decode_tokens_per_s,
            row.decode_step_ms
        );
        rows.push(row);
    }
    if let Some(path) = args.output {
        let doc = serde_json::json!({
            "bench": "throughput",
            "model": args.model.model,
            "backend": backend_name,
            "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            "kv_cache": session.engine.cache_report(),
            "rows": rows,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

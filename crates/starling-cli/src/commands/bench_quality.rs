//! `starling bench quality`: what compression costs in next-token distributions, on held-out
//! essay text. Each window's prompt is followed by forced tokens (teacher forcing); the
//! uncompressed run and every method run side by side in one engine, and each forced position's
//! full distribution is compared with the uncompressed one as it arrives (mean KL) and scores the
//! forced token (perplexity).

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use starling_backend::Backend;
use starling_bench::niah::parse_methods;
use starling_bench::quality::{
    eval_windows, mean, EvalWindow, QualityReport, QualityRow, StreamSums, WindowScorer,
};
use starling_engine::sampling::{FinishReason, SamplingParams};
use starling_engine::{Engine, RequestOptions};
use starling_evict::CompressionConfig;

use super::bench_eval::{compression_for, essay_tokens, progress_bar, write_json, EssaysArg};
use crate::args::{EngineArgs, ModelArg};
use crate::device::{with_backend, BackendJob};
use crate::session::open_session;

/// `starling bench quality` flags.
#[derive(Args, Debug)]
pub struct QualityArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Compression methods compared with the uncompressed run, comma-separated: `name@ratio`
    /// (ratio = share of tokens evicted), e.g. keydiff@0.5,snapkv@0.25. `none` here checks that
    /// an uncompressed run matches the reference (KL ≈ 0).
    #[arg(long, value_delimiter = ',', default_value = "keydiff@0.5")]
    methods: Vec<String>,
    /// Prompt tokens per window (held-out essay text, no chat template).
    #[arg(long, default_value_t = 2048)]
    context_tokens: usize,
    /// Tokens forced after each prompt and scored.
    #[arg(long, default_value_t = 128)]
    eval_tokens: usize,
    /// Windows, consecutive and non-overlapping, from the start of the held-out essays.
    #[arg(long, default_value_t = 4)]
    num_windows: usize,
    /// Folder for quality.json and quality.md.
    #[arg(long)]
    output: PathBuf,
    #[command(flatten)]
    essays: EssaysArg,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Runs `starling bench quality`.
pub fn run(args: QualityArgs) -> Result<()> {
    with_backend(args.engine.device, args)
}

impl BackendJob for QualityArgs {
    fn run<B: Backend + 'static>(self, backend: B) -> Result<()> {
        quality(backend, self)
    }
}

/// One run: the reference (stream 0) or a method, and what it is called.
struct Stream {
    label: String,
    config: CompressionConfig,
}

fn quality<B: Backend + 'static>(backend: B, args: QualityArgs) -> Result<()> {
    let methods = parse_methods(&args.methods)?;
    let mut streams = vec![Stream {
        label: "none (reference)".to_owned(),
        config: CompressionConfig::default(),
    }];
    for spec in &methods {
        streams.push(Stream {
            label: spec.label(),
            config: compression_for(spec)?,
        });
    }
    let essays = args.essays.load()?;
    let mut session = open_session(backend, &args.model, &args.engine)?;
    let max_len = session.engine.scheduler_config().max_model_len_tokens;
    if args.context_tokens + args.eval_tokens > max_len {
        bail!(
            "--context-tokens {} + --eval-tokens {} exceeds max_model_len {max_len}",
            args.context_tokens,
            args.eval_tokens
        );
    }
    let span = args.context_tokens + args.eval_tokens;
    let held_out = essays.standard_split().held_out;
    let ids = essay_tokens(
        &session.tokenizer,
        held_out,
        span.saturating_mul(args.num_windows),
    )?;
    let windows = eval_windows(
        &ids,
        args.context_tokens,
        args.eval_tokens,
        args.num_windows,
    )?;
    std::fs::create_dir_all(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;

    let bar = progress_bar(windows.len() * streams.len(), "quality".to_owned());
    let mut totals = vec![StreamSums::default(); streams.len()];
    let mut kv_final: Vec<Vec<f64>> = vec![Vec::new(); streams.len()];
    for window in &windows {
        let (sums, kv) = run_window(&mut session.engine, &streams, window, &bar)?;
        for (s, stream_sums) in sums.iter().enumerate() {
            totals[s].add(stream_sums);
            kv_final[s].push(kv[s] as f64);
        }
    }
    bar.finish_and_clear();

    let bytes_per_token = session.engine.preflight().sizing.bytes_per_token;
    let expected_tokens = windows.len() * args.eval_tokens;
    let mut rows = Vec::with_capacity(streams.len());
    for (s, stream) in streams.iter().enumerate() {
        if totals[s].logprob_count != expected_tokens {
            bail!(
                "{}: {} of {expected_tokens} forced tokens were scored",
                stream.label,
                totals[s].logprob_count
            );
        }
        let kv_tokens = mean(&kv_final[s]).unwrap_or(0.0);
        rows.push(QualityRow {
            method: stream.label.clone(),
            compression: stream.config.to_json(),
            mean_kl_nats: (s > 0).then(|| totals[s].mean_kl()).flatten(),
            perplexity: totals[s].perplexity(),
            scored_tokens: totals[s].logprob_count,
            kv_tokens_final_mean: kv_tokens,
            kv_bytes_final_mean: kv_tokens * bytes_per_token as f64,
        });
    }
    let mut rows = rows.into_iter();
    let Some(reference) = rows.next() else {
        bail!("no reference run");
    };
    let report = QualityReport {
        model: args.model.model.clone(),
        device: session.engine.backend_name(),
        context_tokens: args.context_tokens,
        eval_tokens: args.eval_tokens,
        num_windows: windows.len(),
        kv_bytes_per_token: bytes_per_token,
        essays_sha256: essays.sha256(),
        reference,
        rows: rows.collect(),
    };
    let markdown = report.markdown();
    write_json(&args.output.join("quality.json"), &report)?;
    let path = args.output.join("quality.md");
    std::fs::write(&path, &markdown).with_context(|| format!("writing {}", path.display()))?;
    println!("{markdown}");
    eprintln!("results written to {}", args.output.display());
    Ok(())
}

/// Runs every stream on one window at once; returns each stream's sums and its KV slots held at
/// the end.
fn run_window<B: Backend>(
    engine: &mut Engine<B>,
    streams: &[Stream],
    window: &EvalWindow,
    bar: &indicatif::ProgressBar,
) -> Result<(Vec<StreamSums>, Vec<usize>)> {
    let params = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let mut stream_of = HashMap::with_capacity(streams.len());
    // The reference is submitted first, so first-come-first-served admission keeps it ahead and
    // few method rows wait for their reference row.
    for (s, stream) in streams.iter().enumerate() {
        let options = RequestOptions {
            compression: Some(stream.config.clone()),
            forced_output_ids: Some(window.eval_ids.clone()),
            return_full_logprobs: true,
        };
        let id = engine.add_request_with(window.context_ids.clone(), params.clone(), options)?;
        stream_of.insert(id, s);
    }
    let mut scorer = WindowScorer::new(window.eval_ids.clone(), streams.len() - 1);
    let mut kv_final = vec![0usize; streams.len()];
    while engine.has_unfinished() {
        for out in engine.step()? {
            let Some(&s) = stream_of.get(&out.seq_id) else {
                continue;
            };
            if let Some(row) = out.full_logprobs {
                let position = out
                    .num_output_tokens
                    .checked_sub(1)
                    .context("the engine reported a distribution before any output token")?;
                scorer.push(s, position, row)?;
            }
            kv_final[s] = out.kv_physical_tokens;
            if let Some(finished) = out.finished {
                if finished.reason != FinishReason::Length {
                    bail!(
                        "{}: the forced request ended with `{}`, not after its forced tokens",
                        streams[s].label,
                        finished.reason.as_str()
                    );
                }
                bar.inc(1);
            }
        }
    }
    Ok((scorer.finish()?, kv_final))
}

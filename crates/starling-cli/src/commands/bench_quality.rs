//! `starling bench quality`: what compression costs in next-token distributions, on held-out
//! essay text. Each window's prompt is followed by forced tokens (teacher forcing); the
//! uncompressed run and every method run side by side in one engine, and each forced position's
//! full distribution is compared with the uncompressed one as it arrives (mean KL) and scores the
//! forced token (perplexity). STAR-KV (`--kv-compression '{"method":"star_kv",…}'`) changes the
//! model itself, and `--kv-cache-dtype fp8` the whole cache, so their engines cannot run the
//! uncompressed reference: a first pass on the original weights and cache records the reference
//! distributions, and the compressed run is compared with those.

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
use crate::session::{open_session, Session};

/// `starling bench quality` flags.
#[derive(Args, Debug)]
pub struct QualityArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Compression methods compared with the uncompressed run, comma-separated: `name@ratio`
    /// (ratio = share of tokens evicted), e.g. keydiff@0.5,snapkv@0.25,tova@0.5 (any eviction
    /// method of --kv-compression). `none` checks that an uncompressed run matches the reference
    /// (KL ≈ 0).
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
    let reference = match engine_wide_compression(&args.engine) {
        Some(_) => {
            let mut recorded = None;
            with_backend(
                args.engine.device,
                ReferencePass {
                    args: &args,
                    recorded: &mut recorded,
                },
            )?;
            Some(recorded.context("the uncompressed reference pass recorded nothing")?)
        }
        None => None,
    };
    with_backend(args.engine.device, QualityJob { args, reference })
}

/// What every stream of an engine started with `engine` shares, when it is not the uncompressed
/// reference: a STAR-KV model (`star_kv balanced (distilled low-rank)`) or an fp8 cache
/// (`fp8 cache`). The reference then comes from a [`ReferencePass`].
fn engine_wide_compression(engine: &EngineArgs) -> Option<String> {
    let star_kv = engine
        .kv_compression
        .star_kv()
        .map(|s| format!("star_kv {} ({} low-rank)", s.rank_profile, s.factors.name()));
    let dtype = engine.cache_compression().kv_dtype;
    let dtype =
        (dtype != starling_evict::KvCacheDtype::Auto).then(|| format!("{} cache", dtype.name()));
    match (star_kv, dtype) {
        (Some(s), Some(d)) => Some(format!("{s} + {d}")),
        (s, d) => s.or(d),
    }
}

/// The main pass: the reference (unless recorded by a [`ReferencePass`]) and every method.
struct QualityJob {
    args: QualityArgs,
    reference: Option<RecordedReference>,
}

impl BackendJob for QualityJob {
    fn run<B: Backend + 'static>(self, backend: B) -> Result<()> {
        quality(backend, self.args, self.reference)
    }
}

/// The first pass under STAR-KV: the original model's distributions over the same windows.
struct ReferencePass<'a> {
    args: &'a QualityArgs,
    recorded: &'a mut Option<RecordedReference>,
}

impl BackendJob for ReferencePass<'_> {
    fn run<B: Backend + 'static>(self, backend: B) -> Result<()> {
        let mut engine_args = self.args.engine.clone();
        engine_args.kv_compression = starling_evict::KvCompression::default();
        engine_args.kv_cache_dtype = None;
        let mut prepared = prepare(backend, self.args, &engine_args)?;
        let streams = [Stream {
            label: "none (uncompressed reference)".to_owned(),
            config: CompressionConfig::default(),
        }];
        let bar = progress_bar(prepared.windows.len(), "reference".to_owned());
        let mut windows = Vec::with_capacity(prepared.windows.len());
        for window in &prepared.windows {
            let mut rows = vec![Vec::new(); window.eval_ids.len()];
            let kv = run_window(
                &mut prepared.session.engine,
                &streams,
                window,
                None,
                &bar,
                |_, position, row| {
                    if let Some(slot) = rows.get_mut(position) {
                        *slot = row;
                    }
                },
            )?;
            if rows.iter().any(Vec::is_empty) {
                bail!("the reference pass missed a forced position");
            }
            windows.push(ReferenceWindow {
                window: window.clone(),
                rows,
                kv_final_tokens: kv[0],
            });
        }
        bar.finish_and_clear();
        let bytes_per_token = prepared.session.engine.preflight().sizing.bytes_per_token;
        *self.recorded = Some(RecordedReference {
            windows,
            bytes_per_token,
        });
        Ok(())
    }
}

/// The uncompressed model's distributions, one row per forced position of each window.
struct RecordedReference {
    windows: Vec<ReferenceWindow>,
    /// What the reference's own cache stores per token (full K/V in the activation dtype).
    bytes_per_token: u64,
}

struct ReferenceWindow {
    window: EvalWindow,
    rows: Vec<Vec<f32>>,
    kv_final_tokens: usize,
}

/// One run: the reference (stream 0) or a method, and what it is called.
struct Stream {
    label: String,
    config: CompressionConfig,
}

/// An open engine with the evaluation windows cut from the held-out essays.
struct Prepared<B: Backend> {
    session: Session<B>,
    windows: Vec<EvalWindow>,
    essays_sha256: String,
}

fn prepare<B: Backend + 'static>(
    backend: B,
    args: &QualityArgs,
    engine_args: &EngineArgs,
) -> Result<Prepared<B>> {
    let essays = args.essays.load()?;
    let session = open_session(backend, &args.model, engine_args)?;
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
    Ok(Prepared {
        session,
        windows,
        essays_sha256: essays.sha256(),
    })
}

fn quality<B: Backend + 'static>(
    backend: B,
    args: QualityArgs,
    reference: Option<RecordedReference>,
) -> Result<()> {
    let methods = parse_methods(&args.methods)?;
    // Under STAR-KV (or an fp8 cache) every stream of this engine runs compressed: name it.
    let engine_wide = engine_wide_compression(&args.engine);
    let mut streams = vec![Stream {
        label: if engine_wide.is_some() {
            "none (uncompressed reference)".to_owned()
        } else {
            "none (reference)".to_owned()
        },
        config: CompressionConfig::default(),
    }];
    for spec in &methods {
        let label = match (&engine_wide, spec.name.as_str()) {
            (Some(model), "none") => model.clone(),
            (Some(model), _) => format!("{model} + {}", spec.label()),
            (None, _) => spec.label(),
        };
        streams.push(Stream {
            label,
            config: compression_for(spec)?,
        });
    }
    let engine_args = args.engine.clone();
    let mut prepared = prepare(backend, &args, &engine_args)?;
    let windows = std::mem::take(&mut prepared.windows);
    if let Some(recorded) = &reference {
        let same = recorded.windows.len() == windows.len()
            && recorded
                .windows
                .iter()
                .zip(&windows)
                .all(|(r, w)| r.window == *w);
        if !same {
            bail!(
                "the reference pass saw other windows than the compressed run (tokenizer changed?)"
            );
        }
    }
    std::fs::create_dir_all(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;

    let engine_streams = streams.len() - usize::from(reference.is_some());
    let bar = progress_bar(windows.len() * engine_streams, "quality".to_owned());
    let mut totals = vec![StreamSums::default(); streams.len()];
    let mut kv_final: Vec<Vec<f64>> = vec![Vec::new(); streams.len()];
    for (w, window) in windows.iter().enumerate() {
        let recorded = reference.as_ref().map(|r| &r.windows[w]);
        let mut scorer = WindowScorer::new(window.eval_ids.clone(), streams.len() - 1);
        if let Some(recorded) = recorded {
            for (position, row) in recorded.rows.iter().enumerate() {
                scorer.push(0, position, row.clone())?;
            }
        }
        let mut failure = None;
        let mut kv = run_window(
            &mut prepared.session.engine,
            &streams,
            window,
            recorded.map(|_| 0),
            &bar,
            |s, position, row| {
                if failure.is_none() {
                    if let Err(e) = scorer.push(s, position, row) {
                        failure = Some(e);
                    }
                }
            },
        )?;
        if let Some(e) = failure {
            return Err(e.into());
        }
        if let Some(recorded) = recorded {
            kv[0] = recorded.kv_final_tokens;
        }
        for (s, stream_sums) in scorer.finish()?.iter().enumerate() {
            totals[s].add(stream_sums);
            kv_final[s].push(kv[s] as f64);
        }
    }
    bar.finish_and_clear();

    let bytes_per_token = prepared.session.engine.preflight().sizing.bytes_per_token;
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
        // A recorded reference held its tokens in its own cache, not in this engine's.
        let stream_bytes_per_token = match &reference {
            Some(recorded) if s == 0 => recorded.bytes_per_token,
            _ => bytes_per_token,
        };
        rows.push(QualityRow {
            method: stream.label.clone(),
            compression: stream.config.to_json(),
            mean_kl_nats: (s > 0).then(|| totals[s].mean_kl()).flatten(),
            perplexity: totals[s].perplexity(),
            scored_tokens: totals[s].logprob_count,
            kv_tokens_final_mean: kv_tokens,
            kv_bytes_final_mean: kv_tokens * stream_bytes_per_token as f64,
        });
    }
    let mut rows = rows.into_iter();
    let Some(reference_row) = rows.next() else {
        bail!("no reference run");
    };
    let cache = prepared.session.engine.cache_report();
    let report = QualityReport {
        model: args.model.display_name(),
        device: prepared.session.engine.backend_name(),
        context_tokens: args.context_tokens,
        eval_tokens: args.eval_tokens,
        num_windows: windows.len(),
        kv_bytes_per_token: bytes_per_token,
        essays_sha256: prepared.essays_sha256.clone(),
        reference: reference_row,
        rows: rows.collect(),
        kv_cache: Some(serde_json::to_value(&cache)?),
        kv_cache_summary: Some(cache.to_string()),
    };
    let markdown = report.markdown();
    write_json(&args.output.join("quality.json"), &report)?;
    let path = args.output.join("quality.md");
    std::fs::write(&path, &markdown).with_context(|| format!("writing {}", path.display()))?;
    println!("{markdown}");
    eprintln!("results written to {}", args.output.display());
    Ok(())
}

/// Runs every stream on one window at once (all but `skip`, whose rows come from elsewhere),
/// handing each forced position's full distribution to `on_row(stream, position, row)`; returns
/// each stream's KV slots held at the end.
fn run_window<B: Backend>(
    engine: &mut Engine<B>,
    streams: &[Stream],
    window: &EvalWindow,
    skip: Option<usize>,
    bar: &indicatif::ProgressBar,
    mut on_row: impl FnMut(usize, usize, Vec<f32>),
) -> Result<Vec<usize>> {
    let params = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let mut stream_of = HashMap::with_capacity(streams.len());
    // The reference is submitted first, so first-come-first-served admission keeps it ahead and
    // few method rows wait for their reference row.
    for (s, stream) in streams.iter().enumerate() {
        if skip == Some(s) {
            continue;
        }
        let options = RequestOptions {
            compression: Some(stream.config.clone()),
            forced_output_ids: Some(window.eval_ids.clone()),
            return_full_logprobs: true,
            question_tokens: None,
        };
        let id = engine.add_request_with(window.context_ids.clone(), params.clone(), options)?;
        stream_of.insert(id, s);
    }
    let mut kv_final = vec![0usize; streams.len()];
    while engine.has_unfinished() {
        for out in engine.step()? {
            let Some(&s) = stream_of.get(&out.seq_id) else {
                continue;
            };
            if let Some(failure) = &out.error {
                bail!("{}: {}", streams[s].label, failure.message);
            }
            if let Some(row) = out.full_logprobs {
                let position = out
                    .num_output_tokens
                    .checked_sub(1)
                    .context("the engine reported a distribution before any output token")?;
                on_row(s, position, row);
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
    Ok(kv_final)
}

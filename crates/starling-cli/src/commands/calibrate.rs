//! `starling calibrate`: STAR-KV checkpoints for a model, one per rank profile, from the SVD of
//! its K/V projections. By default the SVD is whitened: the original model first runs over
//! calibration text (Paul Graham essays not held out for evaluation) and each layer's factors
//! minimise the error of the projection *outputs* on those activations, not of the weights
//! (`--no-whiten` keeps the weight-space SVD for ablations). Then the rank thresholds are
//! trained by knowledge distillation (16 steps unless `--distill-steps` says otherwise; 0 skips
//! it), KL(original ‖ compressed) on calibration windows (`starling_starkv::distill`), starting from `--strategy`'s ranks, and
//! projected onto each profile's budget exactly; the manifest records the steps and tokens.
//! With `--refine-steps N` the kept factors themselves are then trained on the same loss, at
//! the ranks already fixed (`starling_starkv::distill::refine_with`): the KV bytes per token
//! stay the profile's, and the manifest records the refinement and its last-step KL.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use starling_backend::Backend;
use starling_models::llama::LlamaModel;
use starling_models::tokenizer::Tokenizer;
use starling_models::{ModelConfig, WeightMap};
use starling_starkv::checkpoint::{weights_identity, CalibrationInfo};
use starling_starkv::distill::{
    distill_with, distilled_checkpoint, refine_with, refined_checkpoint, DistillConfig, Distiller,
    RefineConfig,
};
use starling_starkv::threshold::ThresholdInit;
use starling_starkv::{
    calibration_windows, svd_checkpoint, AttentionInputMoments, BudgetTarget, ModelFactors,
    RankProfile, RankStrategy, ThresholdConfig, UncompressedLayers, Whitener,
    DEFAULT_RELATIVE_FLOOR,
};

use super::bench_eval::{essay_tokens, EssaysArg};
use super::calibrate_profiles::parse_profiles;
use super::calibrate_torch::{
    chat_corpus_tokens, prose_corpus_tokens, DistillBackend, DistillText, JobKnobs, TorchArgs,
    TorchRunner, DEFAULT_TORCH_REFINE_LR, DEFAULT_TORCH_WINDOW_TOKENS,
};
use crate::args::DeviceArg;
use crate::device::{with_backend, BackendJob};
use crate::session::{open_model, tokenizer_for};

/// How ranks are spread over heads and layers.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrategyArg {
    /// The same share of every factor's maximum rank.
    Uniform,
    /// The globally largest singular values (optimal for the weight-reconstruction error).
    Greedy,
    /// Learned soft thresholds per key head and value layer (weight-reconstruction objective).
    Learned,
}

impl StrategyArg {
    fn strategy(self) -> RankStrategy {
        match self {
            Self::Uniform => RankStrategy::Uniform,
            Self::Greedy => RankStrategy::GreedyEnergy,
            Self::Learned => RankStrategy::LearnedThresholds(ThresholdConfig::default()),
        }
    }
}

/// `starling calibrate` flags.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// An alias (`starling model list`), a GGUF file, or a Hugging Face model directory.
    #[arg(long, short = 'm', default_value = starling_hub::DEFAULT_ALIAS)]
    model: String,
    /// Rank profiles to write, comma-separated: aggressive (30% of K/V cache bytes removed),
    /// balanced (15%), conservative (8%), or a share removed such as `55%` (written to
    /// DIR/removed-55pct/).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "aggressive,balanced,conservative"
    )]
    profiles: Vec<String>,
    /// How ranks are allocated under each profile's budget.
    #[arg(long, value_enum, default_value_t = StrategyArg::Greedy)]
    strategy: StrategyArg,
    /// Output directory; each profile's checkpoint goes to DIR/<profile>/ (replaced if present,
    /// so an interrupted run is simply run again).
    #[arg(long)]
    output: PathBuf,
    /// Seed recorded in the manifests. Calibration is deterministic without it (fixed,
    /// evenly spaced windows); it will drive sampling once distillation lands.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Factor the plain weights (the SVD of W) instead of whitening them by calibration
    /// activations (the SVD of W·C^{1/2}): the ablation baseline.
    #[arg(long)]
    no_whiten: bool,
    /// Calibration tokens the model runs over to measure each layer's attention-input
    /// statistics (rounded up to whole windows).
    #[arg(long, default_value_t = 16_384)]
    calibration_tokens: usize,
    /// Tokens per calibration window; each window runs from position 0 in its own cache.
    #[arg(long, default_value_t = 512)]
    window_tokens: usize,
    /// Knowledge-distillation steps per profile (one calibration window each, forward and
    /// backward on the CPU); 0 keeps the SVD allocation of `--strategy`. Default: 16 (the
    /// measured recipe: on Qwen2.5-Coder-1.5B it brought balanced from +3.3% to +2.4%
    /// perplexity, BENCHMARKS.md), or 0 with `--strategy learned`, which distillation cannot
    /// start from.
    #[arg(long)]
    distill_steps: Option<usize>,
    /// Adam's learning rate on the thresholds' logits (both backends). Default: 0.05.
    #[arg(long)]
    distill_lr: Option<f64>,
    /// How fast the budget price rises per step per unit of relative excess soft rank (both
    /// backends). Default: 2.0, set for runs of tens of steps; runs of hundreds may want less
    /// (the soft rank then swings less around the budget).
    #[arg(long)]
    distill_dual_rate: Option<f64>,
    /// Tokens per distillation (and refinement) window. Default: 128 on the CPU, 4096 with
    /// `--distill-backend torch`.
    #[arg(long)]
    distill_window_tokens: Option<usize>,
    /// Projection-refinement steps per profile, after its ranks are fixed (by `--strategy`
    /// or by `--distill-steps`): the kept factors are trained by knowledge distillation, one
    /// calibration window per step, forward and backward on the CPU. 0 keeps the SVD factors.
    #[arg(long, default_value_t = 0)]
    refine_steps: usize,
    /// Adam's step size for refinement, relative to each projection matrix's RMS entry.
    /// Default: 5e-3 on the CPU (about 0.5% of a matrix's typical entry per step), 1e-3 with
    /// `--distill-backend torch` (hundreds of steps, cosine-decayed to a tenth).
    #[arg(long)]
    refine_lr: Option<f64>,
    #[command(flatten)]
    torch: TorchArgs,
    /// Where the calibration forward passes run.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    device: DeviceArg,
    #[command(flatten)]
    essays: EssaysArg,
}

/// Runs `starling calibrate`.
pub fn run(args: CalibrateArgs) -> Result<()> {
    // Flags are checked before anything is loaded or fetched.
    parse_profiles(&args.profiles)?;
    refine_config(&args)?;
    with_backend(args.device, args)
}

impl BackendJob for CalibrateArgs {
    fn run<B: Backend + 'static>(self, backend: B) -> Result<()> {
        calibrate(&backend, self)
    }
}

/// The model a calibration reads: what it is called, its shapes, weights and tokenizer, and
/// the identity its checkpoints record.
pub struct CalibrationModel<'a> {
    /// The model argument (for the summary line).
    pub name: &'a str,
    /// Where the model came from.
    pub path: &'a Path,
    /// Its shapes.
    pub config: &'a ModelConfig,
    /// Its weights on the host.
    pub weights: &'a WeightMap,
    /// Its tokenizer (for the calibration text).
    pub tokenizer: &'a Tokenizer,
    /// `weights_identity(weights)`, which every checkpoint records and loading re-checks.
    pub identity: &'a str,
}

impl CalibrateArgs {
    /// The flags of a checkpoint the CLI calibrates for itself (the demo's, see
    /// `commands/demo/checkpoint.rs`): `profile` only, whitened SVD on `calibration_tokens` tokens in
    /// windows of 512, greedy ranks, no distillation or refinement, written under `output`.
    pub fn svd_only(
        model: &str,
        profile: RankProfile,
        calibration_tokens: usize,
        output: PathBuf,
    ) -> Self {
        Self {
            model: model.to_owned(),
            profiles: vec![profile.name().to_owned()],
            strategy: StrategyArg::Greedy,
            output,
            seed: 0,
            no_whiten: false,
            calibration_tokens,
            window_tokens: 512,
            distill_steps: Some(0),
            distill_lr: None,
            distill_dual_rate: None,
            distill_window_tokens: None,
            refine_steps: 0,
            refine_lr: None,
            torch: TorchArgs {
                distill_backend: DistillBackend::Cpu,
                distill_tokens: 0,
                refine_tokens: 0,
                distill_batch_windows: 1,
                distill_in_file_order: false,
                distill_budget: super::calibrate_torch::BudgetArg::Dual,
                distill_text: DistillText::EssaysAndChat,
                distill_chat_share: 0.5,
                python: "python3".into(),
                distill_time_limit_s: 0,
            },
            device: DeviceArg::Auto,
            essays: EssaysArg { essays_dir: None },
        }
    }
}

fn calibrate<B: Backend>(backend: &B, args: CalibrateArgs) -> Result<()> {
    let started = Instant::now();
    let bar = stage_bar(parse_profiles(&args.profiles)?.len() as u64 + 4);
    bar.set_message(format!("loading {}", args.model));
    let opened = open_model(&args.model)?;
    let tokenizer = tokenizer_for(&opened)?;
    bar.inc(1);

    bar.set_message("hashing the weights (model identity)");
    let identity = weights_identity(&opened.loaded.weights);
    bar.inc(1);
    let model = CalibrationModel {
        name: &args.model,
        path: &opened.path,
        config: &opened.loaded.config,
        weights: &opened.loaded.weights,
        tokenizer: &tokenizer,
        identity: &identity,
    };
    let lines = write_checkpoints(backend, &model, &args, &bar, started)?;
    for line in lines {
        println!("{line}");
    }
    Ok(())
}

/// Calibrates `model` as `args` say and writes one checkpoint per profile under
/// `args.output`; `bar` has two stages left for the text and the factors, and one per
/// profile. Returns the summary lines (the first: what was done and how long it took since
/// `started`).
pub fn write_checkpoints<B: Backend>(
    backend: &B,
    model: &CalibrationModel<'_>,
    args: &CalibrateArgs,
    bar: &ProgressBar,
    started: Instant,
) -> Result<Vec<String>> {
    let profiles = parse_profiles(&args.profiles)?;
    let distill = distill_config(args)?;
    let refine = refine_config(args)?;
    let torch = torch_phases(args)?;
    let config = model.config;
    let identity = model.identity;

    let text = if args.no_whiten && distill.is_none() && refine.is_none() && torch.is_none() {
        None
    } else {
        bar.set_message("tokenising the calibration essays");
        Some(CalibrationText::load(model.tokenizer, args)?)
    };
    let (whiteners, calibration) = match (&text, args.no_whiten) {
        (Some(text), false) => {
            let (whiteners, calibration) = activation_whiteners(backend, model, args, text, bar)?;
            (Some(whiteners), calibration)
        }
        _ => (None, CalibrationInfo::default()),
    };
    bar.inc(1);

    // The reference's choice: the first two layers and the last stay at full K/V.
    let keep = UncompressedLayers::reference(config.num_layers);
    let kind = if whiteners.is_some() {
        "whitened SVD"
    } else {
        "SVD"
    };
    bar.set_message(format!(
        "{kind} of {} layers' K/V projections",
        config.num_layers - keep.len()
    ));
    let factors = ModelFactors::compute(config, model.weights, &keep, whiteners.as_deref())
        .context("factoring the K/V projections")?;
    bar.inc(1);

    let strategy = args.strategy.strategy();
    let mut distiller = match (distill.is_some() || refine.is_some(), &text) {
        (true, Some(text)) => {
            bar.set_message("distillation: cutting the calibration text into windows");
            Some(
                Distiller::new(
                    config,
                    model.weights,
                    &factors,
                    &text.ids,
                    window_tokens(args),
                )
                .context("preparing distillation")?,
            )
        }
        _ => None,
    };
    let (runner, text_sources) = match (&torch, &text) {
        (Some(_), Some(text)) => {
            let mut sources = Vec::new();
            let mut ids = text.ids.clone();
            if args.torch.distill_text.with_prose() {
                bar.set_message("torch distillation: fetching and tokenising the long prose");
                let (with_prose, source) = prose_corpus_tokens(model.tokenizer, &ids)?;
                ids = with_prose;
                sources.push(source);
            }
            if args.torch.distill_text.with_chat() {
                bar.set_message("torch distillation: rendering and tokenising the conversations");
                let (with_chat, source) =
                    chat_corpus_tokens(model.tokenizer, &ids, args.torch.distill_chat_share)?;
                ids = with_chat;
                sources.push(source);
            }
            let targets: Vec<(String, BudgetTarget)> = profiles
                .iter()
                .map(|p| (p.name.clone(), p.target))
                .collect();
            let knobs = JobKnobs {
                window_tokens: window_tokens(args),
                refine_lr: refine_lr(args),
                thresholds: threshold_settings(args),
                seed: args.seed,
                init: match args.strategy {
                    StrategyArg::Uniform => ThresholdInit::Uniform,
                    _ => ThresholdInit::GreedyEnergy,
                },
            };
            let runner = TorchRunner::prepare(
                model,
                &factors,
                &ids,
                &targets,
                &args.output,
                &knobs,
                &args.torch,
            )?;
            (Some(runner), sources)
        }
        _ => (None, Vec::new()),
    };
    let mut lines = Vec::with_capacity(profiles.len());
    for choice in &profiles {
        let name = choice.name.as_str();
        let mut plan = choice.plan(strategy.clone(), args.seed);
        plan.calibration = calibration.clone();
        if let (Some(text), true) = (&text, distiller.is_some() || runner.is_some()) {
            if plan.calibration.data.is_empty() {
                plan.calibration.data = text.essay_names.clone();
                plan.calibration.dataset_sha256 = Some(text.dataset_sha256.clone());
            }
        }
        plan.calibration.data.extend(text_sources.iter().cloned());
        let mut checkpoint = match (&distill, distiller.as_mut(), &runner, &torch) {
            (_, _, Some(runner), Some(phases)) if phases.thresholds => {
                let (checkpoint, line) = runner
                    .thresholds(name, model, &factors, &plan, bar)
                    .with_context(|| format!("distilling profile {name} on torch"))?;
                lines.push(line);
                checkpoint
            }
            (Some(d), Some(distiller), _, _) => {
                bar.set_message(format!(
                    "{name}: distilling thresholds ({} steps of {} tokens)",
                    d.steps, d.window_tokens
                ));
                let (outcome, report) = distill_with(distiller, &factors, &plan, d)
                    .with_context(|| format!("distilling profile {name}"))?;
                let last_kl = report.steps.last().map_or(f64::NAN, |s| s.kl);
                lines.push(format!(
                    "{name:<13} distilled {} steps, last-step KL {last_kl:.4} nats/token",
                    report.steps.len()
                ));
                distilled_checkpoint(config, identity, &factors, &plan, &outcome, &report)
                    .with_context(|| format!("profile {name}"))?
            }
            _ => {
                bar.set_message(format!("{name}: allocating ranks ({})", strategy.name()));
                svd_checkpoint(config, identity, &factors, &plan)
                    .with_context(|| format!("profile {name}"))?
            }
        };
        if let (Some(runner), Some(phases)) = (&runner, &torch) {
            if phases.refine {
                let (refined, line) = runner
                    .refine(name, checkpoint, bar)
                    .with_context(|| format!("refining profile {name} on torch"))?;
                lines.push(line);
                checkpoint = refined;
            }
        }
        if let (Some(r), Some(distiller)) = (&refine, distiller.as_mut()) {
            let what = format!(
                "{name}: refining projections ({} steps of {} tokens)",
                r.steps,
                distiller.window_tokens()
            );
            bar.set_message(what.clone());
            let (refined, report) =
                refine_with(distiller, &checkpoint.projections, r, &mut |step| {
                    bar.set_message(format!(
                        "{what}: step {}/{} KL {:.4}",
                        step.step + 1,
                        r.steps,
                        step.kl
                    ));
                })
                .with_context(|| format!("refining profile {name}"))?;
            let (first, last) = (
                report.steps.first().map_or(f64::NAN, |s| s.kl),
                report.steps.last().map_or(f64::NAN, |s| s.kl),
            );
            lines.push(format!(
                "{name:<13} refined {} steps, last-step KL {last:.4} nats/token (first step {first:.4})",
                report.steps.len()
            ));
            checkpoint = refined_checkpoint(checkpoint, refined, &report)
                .with_context(|| format!("profile {name}"))?;
        }
        let dir = args.output.join(name);
        checkpoint
            .save(&dir)
            .with_context(|| format!("writing {}", dir.display()))?;
        let r = &checkpoint.manifest.compression;
        lines.push(format!(
            "{name:<13} KV {:>6} of {:>6} B/token (bf16, {:.1}% removed), parameter rate C {:.3} → {}",
            r.kv_bytes_per_token_compressed,
            r.kv_bytes_per_token_original,
            100.0 * r.kv_removed_share,
            r.parameter_compression_rate,
            dir.display()
        ));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let how = if calibration.tokens > 0 {
        format!(
            "whitened SVD ({} calibration tokens in {} windows of {}, {})",
            calibration.tokens,
            calibration.windows,
            calibration.window_tokens,
            backend.name()
        )
    } else {
        "weight SVD only".to_owned()
    };
    let distilled = match (&distill, &torch) {
        (_, Some(phases)) => format!(
            "torch: {} thresholds + {} refinement tokens per profile in windows of {}{}",
            if phases.thresholds {
                args.torch.distill_tokens
            } else {
                0
            },
            if phases.refine {
                args.torch.refine_tokens
            } else {
                0
            },
            window_tokens(args),
            if phases.thresholds {
                String::new()
            } else {
                format!(", ranks by {}", strategy.name())
            }
        ),
        (Some(d), None) => format!(
            "distilled {} steps × {} tokens from {}",
            d.steps,
            d.window_tokens,
            strategy.name()
        ),
        (None, None) => format!("ranks by {}, no distillation", strategy.name()),
    };
    let refined = match &refine {
        Some(r) => format!(
            ", projections refined {} steps × {} tokens",
            r.steps,
            window_tokens(args)
        ),
        None => String::new(),
    };
    lines.insert(
        0,
        format!(
            "{} ({}): {} of {} layers low-rank, {distilled}{refined}, {how}, {:.1} s",
            model.name,
            model.path.display(),
            config.num_layers - keep.len(),
            config.num_layers,
            started.elapsed().as_secs_f64()
        ),
    );
    Ok(lines)
}

/// Runs the original model over the calibration windows (essays not held out) and returns one
/// whitener per layer, with what the manifest records about the text.
fn activation_whiteners<B: Backend>(
    backend: &B,
    source: &CalibrationModel<'_>,
    args: &CalibrateArgs,
    text: &CalibrationText,
    bar: &ProgressBar,
) -> Result<(Vec<Whitener>, CalibrationInfo)> {
    let windows = calibration_windows(&text.ids, args.window_tokens, args.calibration_tokens)
        .context("--calibration-tokens")?;

    let config = source.config;
    let model = LlamaModel::load(backend, config, source.weights.clone())
        .context("loading the model for calibration")?;
    let mut moments = AttentionInputMoments::new(config);
    for (index, window) in windows.iter().enumerate() {
        bar.set_message(format!(
            "activation statistics: window {}/{} ({} tokens)",
            index + 1,
            windows.len(),
            window.len()
        ));
        moments
            .observe(backend, &model, window)
            .with_context(|| format!("calibration window {}", index + 1))?;
    }
    drop(model);
    bar.set_message("whitening: eigendecomposition of each layer's statistics");
    let whiteners = moments
        .whiteners(DEFAULT_RELATIVE_FLOOR)
        .context("whitening the K/V projections")?;
    let calibration = CalibrationInfo {
        data: text.essay_names.clone(),
        tokens: moments.tokens_seen(),
        dataset_sha256: Some(text.dataset_sha256.clone()),
        windows: moments.windows_seen(),
        window_tokens: args.window_tokens as u64,
        ..CalibrationInfo::default()
    };
    Ok((whiteners, calibration))
}

/// The calibration text: every essay not held out for evaluation, tokenised in order.
struct CalibrationText {
    ids: Vec<u32>,
    essay_names: Vec<String>,
    dataset_sha256: String,
}

impl CalibrationText {
    fn load(tokenizer: &Tokenizer, args: &CalibrateArgs) -> Result<Self> {
        let essays = args.essays.load()?;
        let haystack = essays.standard_split().haystack;
        // Every haystack essay (windows are spread over all of them): a token covers at least
        // one byte, so asking for as many tokens as there are bytes never stops early.
        let all_tokens = haystack.iter().map(|e| e.text.len() + 2).sum();
        Ok(Self {
            ids: essay_tokens(tokenizer, haystack, all_tokens)?,
            essay_names: haystack.iter().map(|e| e.name.clone()).collect(),
            dataset_sha256: essays.sha256(),
        })
    }
}

/// Distillation steps per profile when `--distill-steps` is not given (see its help).
const DEFAULT_DISTILL_STEPS: usize = 16;

/// The distillation settings the flags ask for: `None` for `--distill-steps 0`, or without the
/// flag under `--strategy learned`. The thresholds start from `--strategy`'s allocation where
/// distillation can (uniform or greedy).
fn distill_config(args: &CalibrateArgs) -> Result<Option<DistillConfig>> {
    if args.torch.distill_backend == DistillBackend::Torch {
        if args.distill_steps.is_some_and(|s| s > 0) {
            bail!("--distill-steps is the CPU backend's; --distill-backend torch counts --distill-tokens");
        }
        return Ok(None);
    }
    let steps = match (args.distill_steps, args.strategy) {
        (Some(0), _) | (None, StrategyArg::Learned) => return Ok(None),
        (Some(steps), _) => steps,
        (None, _) => DEFAULT_DISTILL_STEPS,
    };
    let init = match args.strategy {
        StrategyArg::Uniform => ThresholdInit::Uniform,
        StrategyArg::Greedy => ThresholdInit::GreedyEnergy,
        StrategyArg::Learned => {
            bail!("--distill-steps starts from --strategy uniform or greedy, not learned")
        }
    };
    Ok(Some(DistillConfig {
        steps,
        window_tokens: window_tokens(args),
        init,
        ..threshold_settings(args)
    }))
}

/// The refinement settings the flags ask for (`None` without `--refine-steps`).
fn refine_config(args: &CalibrateArgs) -> Result<Option<RefineConfig>> {
    if args.refine_steps == 0 {
        return Ok(None);
    }
    if args.torch.distill_backend == DistillBackend::Torch {
        bail!(
            "--refine-steps is the CPU backend's; --distill-backend torch counts --refine-tokens"
        );
    }
    let refine = RefineConfig {
        steps: args.refine_steps,
        learning_rate: refine_lr(args),
    };
    refine.validate().context("--refine-lr")?;
    Ok(Some(refine))
}

/// The thresholds' optimiser settings the flags ask for (the rest default).
pub(crate) fn threshold_settings(args: &CalibrateArgs) -> DistillConfig {
    let defaults = DistillConfig::default();
    DistillConfig {
        learning_rate: args.distill_lr.unwrap_or(defaults.learning_rate),
        dual_rate: args.distill_dual_rate.unwrap_or(defaults.dual_rate),
        ..defaults
    }
}

/// Which torch phases run (`None` on the CPU backend).
struct TorchPhases {
    thresholds: bool,
    refine: bool,
}

fn torch_phases(args: &CalibrateArgs) -> Result<Option<TorchPhases>> {
    let torch = &args.torch;
    if torch.distill_backend == DistillBackend::Cpu {
        return Ok(None);
    }
    let phases = TorchPhases {
        thresholds: torch.distill_tokens > 0,
        refine: torch.refine_tokens > 0,
    };
    if !phases.thresholds && !phases.refine {
        bail!("--distill-backend torch with --distill-tokens 0 and --refine-tokens 0 has nothing to run");
    }
    if phases.thresholds && args.strategy == StrategyArg::Learned {
        bail!("torch distillation starts from --strategy uniform or greedy, not learned");
    }
    if torch.distill_batch_windows == 0 {
        bail!("--distill-batch-windows must be at least 1");
    }
    if !(0.0..=1.0).contains(&torch.distill_chat_share) {
        bail!(
            "--distill-chat-share must be a share in [0, 1], not {}",
            torch.distill_chat_share
        );
    }
    threshold_settings(args)
        .validate()
        .context("--distill-lr / --distill-dual-rate")?;
    Ok(Some(phases))
}

/// `--distill-window-tokens`, or its default for the backend.
fn window_tokens(args: &CalibrateArgs) -> usize {
    args.distill_window_tokens
        .unwrap_or(match args.torch.distill_backend {
            DistillBackend::Cpu => 128,
            DistillBackend::Torch => DEFAULT_TORCH_WINDOW_TOKENS,
        })
}

/// `--refine-lr`, or its default for the backend.
fn refine_lr(args: &CalibrateArgs) -> f64 {
    args.refine_lr.unwrap_or(match args.torch.distill_backend {
        DistillBackend::Cpu => RefineConfig::DEFAULT_LEARNING_RATE,
        DistillBackend::Torch => DEFAULT_TORCH_REFINE_LR,
    })
}

/// A bar over the calibration stages, drawn on stderr when it is a terminal.
pub fn stage_bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    // The template is a constant; should it ever fail to parse, the default style is fine.
    if let Ok(style) = ProgressStyle::with_template("[{bar:30}] {pos}/{len} {msg} ({elapsed})") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: CalibrateArgs,
    }

    fn distill_steps(flags: &[&str]) -> Result<Option<usize>> {
        let argv = ["calibrate", "--output", "out"].iter().chain(flags);
        let args = Cli::try_parse_from(argv)?.args;
        Ok(distill_config(&args)?.map(|c| c.steps))
    }

    #[test]
    fn distillation_defaults_to_the_measured_recipe_except_from_learned_thresholds() {
        assert_eq!(distill_steps(&[]).unwrap(), Some(DEFAULT_DISTILL_STEPS));
        assert_eq!(
            distill_steps(&["--strategy", "uniform"]).unwrap(),
            Some(DEFAULT_DISTILL_STEPS)
        );
        assert_eq!(distill_steps(&["--distill-steps", "0"]).unwrap(), None);
        assert_eq!(distill_steps(&["--distill-steps", "3"]).unwrap(), Some(3));
        // Learned thresholds cannot seed distillation: off by default, refused when asked for.
        assert_eq!(distill_steps(&["--strategy", "learned"]).unwrap(), None);
        assert!(distill_steps(&["--strategy", "learned", "--distill-steps", "2"]).is_err());
    }

    fn args_of(flags: &[&str]) -> CalibrateArgs {
        let argv = ["calibrate", "--output", "out"].iter().chain(flags);
        Cli::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn the_torch_backend_counts_tokens_and_refuses_the_cpu_flags() {
        let cpu = args_of(&[]);
        assert!(torch_phases(&cpu).unwrap().is_none());
        assert_eq!((window_tokens(&cpu), refine_lr(&cpu)), (128, 5e-3));
        let torch = args_of(&["--distill-backend", "torch", "--refine-tokens", "1000"]);
        let phases = torch_phases(&torch).unwrap().unwrap();
        assert!(phases.thresholds && phases.refine);
        assert_eq!(
            distill_config(&torch).unwrap(),
            None,
            "no CPU distillation as well"
        );
        assert_eq!(
            (window_tokens(&torch), refine_lr(&torch)),
            (DEFAULT_TORCH_WINDOW_TOKENS, DEFAULT_TORCH_REFINE_LR)
        );
        for bad in [
            &["--distill-backend", "torch", "--distill-steps", "3"][..],
            &["--distill-backend", "torch", "--refine-steps", "3"],
            &["--distill-backend", "torch", "--distill-tokens", "0"],
            &["--distill-backend", "torch", "--strategy", "learned"],
            &["--distill-backend", "torch", "--distill-batch-windows", "0"],
            &["--distill-backend", "torch", "--distill-lr", "0"],
            &["--distill-backend", "torch", "--distill-dual-rate=-1"],
        ] {
            let args = args_of(bad);
            let refused = distill_config(&args).is_err()
                || refine_config(&args).is_err()
                || torch_phases(&args).is_err();
            assert!(refused, "{bad:?}");
        }
    }

    #[test]
    fn profiles_are_names_or_shares_each_once() {
        let names: Vec<String> = ["balanced", "55%", "removed-60pct"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let choices = parse_profiles(&names).unwrap();
        let dirs: Vec<&str> = choices.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(dirs, ["balanced", "removed-55pct", "removed-60pct"]);
        let plan = choices[1].plan(RankStrategy::GreedyEnergy, 0);
        assert_eq!((plan.profile, plan.target.permille()), (None, 550));
        assert_eq!(
            choices[0].plan(RankStrategy::Uniform, 0).profile,
            Some(RankProfile::Balanced)
        );
        // Balanced is 15%: naming it twice, as a name and as a share, is refused.
        let twice: Vec<String> = vec!["balanced".into(), "15%".into()];
        assert!(parse_profiles(&twice).is_err());
        assert!(parse_profiles(&["120%".to_owned()]).is_err());
    }
}

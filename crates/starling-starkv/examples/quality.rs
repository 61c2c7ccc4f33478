//! What each STAR-KV profile costs in next-token quality on the CPU, through the reference
//! path (reconstructed K/V weights): mean KL(original ‖ compressed) and perplexity on held-out
//! essays, per profile, for {weight SVD, whitened SVD} × {uniform, greedy, learned thresholds}
//! at equal KV bytes, and with `--distill-steps N` the ablation rows "whitened SVD | distilled
//! (from greedy / from uniform)": thresholds trained by knowledge distillation
//! (`starling_starkv::distill`) on the calibration essays, then projected onto the same budget.
//! Every row of a profile keeps exactly the same K/V elements per token (checked, not assumed).
//!
//!     cargo run --release -p starling-starkv --example quality -- \
//!         [--model smollm2-135m] [--eval-tokens 1024] [--eval-window 512] \
//!         [--calibration-tokens 16384] [--window-tokens 512] \
//!         [--profiles aggressive,balanced,conservative] [--factors weight,whitened] \
//!         [--distill-steps 0] [--distill-window-tokens 128] [--removed-permille 100,200]
//!         [--output DIR]
//!
//! `--removed-permille` adds a sweep over other removed shares (whitened SVD, greedy ranks), to
//! find where on the rate axis a quality target lies.
//! The model (alias, GGUF or HF directory) and the Paul Graham essays come through
//! `starling-hub` (fetched and verified if missing). Calibration windows are spread over the
//! essays not held out, exactly as `starling calibrate` picks them; distillation cuts the same
//! essays (all of them, in order) into consecutive windows, as `starling calibrate
//! --distill-steps` does; evaluation windows are consecutive from the start of the held-out
//! essays. `--factors` picks which SVD rows are scored (the distilled rows always use the
//! whitened factors). With `--output`, `quality.json` and `quality.md` are written there, with
//! the command line and the date.

use std::error::Error;
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use starling_backend::cpu::CpuBackend;
use starling_hub::{fetch_essays, resolve_model, Essay, FetchOptions, ModelLocation};
use starling_models::llama::LlamaModel;
use starling_models::tokenizer::Tokenizer;
use starling_models::{load_model, ModelConfig, WeightMap};
use starling_starkv::checkpoint::{weights_identity, StarKvCheckpoint};
use starling_starkv::distill::{
    distill_with, distilled_checkpoint, DistillConfig, DistillReport, DistillStep, Distiller,
};
use starling_starkv::threshold::ThresholdInit;
use starling_starkv::{
    apply_projections, calibration_windows, svd_checkpoint, AttentionInputMoments, BudgetTarget,
    CalibrationPlan, ModelFactors, RankProfile, RankStrategy, ThresholdConfig, UncompressedLayers,
    DEFAULT_RELATIVE_FLOOR,
};

type Res<T> = Result<T, Box<dyn Error>>;

/// Which SVD factors the SVD-only rows use.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FactorsKind {
    Weight,
    Whitened,
}

impl FactorsKind {
    fn label(self) -> &'static str {
        match self {
            Self::Weight => "weight SVD",
            Self::Whitened => "whitened SVD",
        }
    }
}

struct Options {
    model: String,
    eval_tokens: usize,
    eval_window: usize,
    calibration_tokens: usize,
    window_tokens: usize,
    profiles: Vec<RankProfile>,
    factors: Vec<FactorsKind>,
    distill_steps: usize,
    distill_window_tokens: usize,
    /// Extra targets outside the named profiles (per-mille of K/V bytes removed), scored with
    /// whitened factors and greedy ranks: where on the rate axis a quality target lies.
    sweep_permille: Vec<u32>,
    output: Option<PathBuf>,
}

fn parse_options() -> Res<Options> {
    let mut options = Options {
        model: "smollm2-135m".to_owned(),
        eval_tokens: 1024,
        eval_window: 512,
        calibration_tokens: 16_384,
        window_tokens: 512,
        profiles: RankProfile::ALL.to_vec(),
        factors: vec![FactorsKind::Weight, FactorsKind::Whitened],
        distill_steps: 0,
        distill_window_tokens: 128,
        sweep_permille: Vec::new(),
        output: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--model" => options.model = value,
            "--eval-tokens" => options.eval_tokens = value.parse()?,
            "--eval-window" => options.eval_window = value.parse()?,
            "--calibration-tokens" => options.calibration_tokens = value.parse()?,
            "--window-tokens" => options.window_tokens = value.parse()?,
            "--profiles" => options.profiles = parse_list(&value, |s| Ok(s.parse()?))?,
            "--factors" => options.factors = parse_list(&value, parse_factors)?,
            "--distill-steps" => options.distill_steps = value.parse()?,
            "--distill-window-tokens" => options.distill_window_tokens = value.parse()?,
            "--removed-permille" => {
                options.sweep_permille = parse_list(&value, |s| Ok(s.parse()?))?
            }
            "--output" => options.output = Some(PathBuf::from(value)),
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    Ok(options)
}

fn parse_factors(name: &str) -> Res<FactorsKind> {
    match name {
        "weight" => Ok(FactorsKind::Weight),
        "whitened" => Ok(FactorsKind::Whitened),
        _ => Err(format!("--factors takes weight and/or whitened, not `{name}`").into()),
    }
}

/// A comma-separated list, each item once, in order; empty items are skipped (so
/// `--factors ''` scores no SVD-only row).
fn parse_list<T: PartialEq>(value: &str, parse: impl Fn(&str) -> Res<T>) -> Res<Vec<T>> {
    let mut items = Vec::new();
    for name in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let item = parse(name)?;
        if items.contains(&item) {
            return Err(format!("`{name}` is listed twice in `{value}`").into());
        }
        items.push(item);
    }
    Ok(items)
}

/// The uncompressed model's outputs on the evaluation windows, which every row is scored
/// against.
struct Evaluation {
    windows: Vec<Vec<u32>>,
    reference: Vec<Vec<Vec<f32>>>,
}

/// One checkpoint's quality and size.
struct Scored {
    kl: f64,
    perplexity: f64,
    kv_bytes: u64,
    kept_elements: u64,
}

impl Evaluation {
    /// Scores `checkpoint` through the reference path (its projections replace the K/V
    /// weights).
    fn score(
        &self,
        config: &ModelConfig,
        weights: &WeightMap,
        checkpoint: &StarKvCheckpoint,
    ) -> Res<Scored> {
        let mut weights = weights.clone();
        apply_projections(config, &mut weights, &checkpoint.projections)?;
        let got = logits(config, weights, &self.windows)?;
        Ok(Scored {
            kl: mean_kl(&self.reference, &got),
            perplexity: perplexity(&got, &self.windows),
            kv_bytes: checkpoint
                .manifest
                .compression
                .kv_bytes_per_token_compressed,
            kept_elements: checkpoint.projections.allocation()?.elements_per_token(),
        })
    }
}

/// The K/V elements per token every row of one profile must keep: set by the profile's first
/// row, checked for every later one, so "equal KV bytes" is enforced rather than assumed.
struct EqualBudget {
    profile: RankProfile,
    kept_elements: Option<u64>,
}

impl EqualBudget {
    fn new(profile: RankProfile) -> Self {
        Self {
            profile,
            kept_elements: None,
        }
    }

    fn check(&mut self, row: &str, scored: &Scored) -> Res<()> {
        match self.kept_elements {
            None => self.kept_elements = Some(scored.kept_elements),
            Some(expected) if expected != scored.kept_elements => {
                return Err(format!(
                    "{}: row `{row}` keeps {} K/V elements per token, the profile's other rows \
                     {expected}",
                    self.profile, scored.kept_elements
                )
                .into())
            }
            Some(_) => {}
        }
        Ok(())
    }
}

/// The tables and the JSON rows, filled row by row.
struct Results {
    table: String,
    /// One line per distilled row: its steps, window and time per step.
    distill_table: String,
    rows: Vec<Value>,
}

impl Results {
    fn new(config: &ModelConfig, reference_ppl: f64) -> Self {
        let mut table = String::from(
            "| profile | factors | ranks | KV bytes/token (bf16) | mean KL (nats) | perplexity |\n\
             |---|---|---|---:|---:|---:|\n",
        );
        table.push_str(&format!(
            "| none | — | — | {} | — | {reference_ppl:.2} |\n",
            2 * kv_elements_per_token(config)
        ));
        Self {
            table,
            distill_table: String::from(
                "| profile | start | steps | window tokens | mean s/step | distillation s | \
                 first-step KL | last-step KL |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
            ),
            rows: Vec::new(),
        }
    }

    /// Records a distilled run's cost and training KL (soft-thresholded student, on its
    /// training window) in the distillation table.
    fn push_distillation(
        &mut self,
        profile: RankProfile,
        init: ThresholdInit,
        report: &DistillReport,
        window_tokens: usize,
        seconds: f64,
    ) {
        let steps = report.steps.len();
        let step_s = seconds / steps.max(1) as f64;
        let kl =
            |s: Option<&DistillStep>| s.map_or_else(|| "—".to_owned(), |s| format!("{:.4}", s.kl));
        self.distill_table.push_str(&format!(
            "| {profile} | {} | {steps} | {window_tokens} | {step_s:.1} | {seconds:.1} | {} | {} |\n",
            init_name(init),
            kl(report.steps.first()),
            kl(report.steps.last()),
        ));
    }

    fn push(
        &mut self,
        profile: RankProfile,
        factors: &str,
        ranks: &str,
        checkpoint: &StarKvCheckpoint,
        scored: &Scored,
        distillation: Value,
    ) {
        let line = format!(
            "| {profile} | {factors} | {ranks} | {} | {:.4} | {:.2} |",
            scored.kv_bytes, scored.kl, scored.perplexity
        );
        eprintln!("{line}");
        self.table.push_str(&line);
        self.table.push('\n');
        self.rows.push(json!({
            "profile": profile.name(),
            "factors": factors,
            "rank_strategy": ranks,
            "kv_removed_share": checkpoint.manifest.compression.kv_removed_share,
            "kv_bytes_per_token_bf16": scored.kv_bytes,
            "kept_elements_per_token": scored.kept_elements,
            "mean_kl_nats": scored.kl,
            "perplexity": scored.perplexity,
            "distillation": distillation,
        }));
    }
}

/// What a distilled row records about its run.
fn distillation_record(
    init: ThresholdInit,
    distill: &DistillConfig,
    report: &DistillReport,
    seconds: f64,
) -> Value {
    let steps = report.steps.len();
    let step_ms_mean =
        report.steps.iter().map(|s| s.elapsed_ms).sum::<u64>() as f64 / steps.max(1) as f64;
    json!({
        "init": init,
        "steps": steps,
        "window_tokens": distill.window_tokens,
        "windows_available": report.windows,
        "tokens_seen": report.tokens_seen,
        "learning_rate": distill.learning_rate,
        "sharpness": distill.sharpness,
        "dual_rate": distill.dual_rate,
        "step_ms_mean": step_ms_mean,
        "seconds": seconds,
        "first_step_kl_nats": report.steps.first().map(|s| s.kl),
        "last_step_kl_nats": report.steps.last().map(|s| s.kl),
        "target_elements": report.target_elements,
        "learned_hard_rank": report.learned_hard_rank,
        "step_log": report.steps,
    })
}

fn init_name(init: ThresholdInit) -> &'static str {
    match init {
        ThresholdInit::Uniform => "uniform",
        ThresholdInit::GreedyEnergy => "greedy",
    }
}

fn main() -> Res<()> {
    let options = parse_options()?;
    if options.profiles.is_empty() {
        return Err("--profiles is empty".into());
    }
    let started = Instant::now();
    let fetch = FetchOptions::from_env()?;
    let (path, tokenizer_dir) = match resolve_model(&options.model, &fetch)? {
        ModelLocation::Gguf(p) => (p, None),
        ModelLocation::HfDir(p) => (p.clone(), Some(p)),
    };
    let model = load_model(&path)?;
    let tokenizer = match (&model.gguf_metadata, tokenizer_dir) {
        (Some(metadata), _) => Tokenizer::from_gguf_metadata(metadata)?,
        (None, Some(dir)) => Tokenizer::from_hf_dir(&dir)?,
        (None, None) => return Err("no tokenizer for the model".into()),
    };
    let config = &model.config;
    let essays = fetch_essays(&fetch)?;
    let split = essays.standard_split();

    let held_out = essay_tokens(&tokenizer, split.held_out)?;
    let eval_windows: Vec<Vec<u32>> = calibration_windows(
        &held_out[..options.eval_tokens.min(held_out.len())],
        options.eval_window,
        options.eval_tokens,
    )?;
    let evaluation = Evaluation {
        reference: logits(config, model.weights.clone(), &eval_windows)?,
        windows: eval_windows,
    };
    let reference_ppl = perplexity(&evaluation.reference, &evaluation.windows);
    let eval_tokens: usize = evaluation.windows.iter().map(Vec::len).sum();
    eprintln!(
        "{eval_tokens} eval tokens in {} windows; reference perplexity {reference_ppl:.3}",
        evaluation.windows.len()
    );

    let calibration_started = Instant::now();
    let stream = essay_tokens(&tokenizer, split.haystack)?;
    let windows = calibration_windows(&stream, options.window_tokens, options.calibration_tokens)?;
    let backend = CpuBackend::new();
    let runner = LlamaModel::load(&backend, config, model.weights.clone())?;
    let mut moments = AttentionInputMoments::new(config);
    for window in &windows {
        moments.observe(&backend, &runner, window)?;
    }
    drop(runner);
    let whiteners = moments.whiteners(DEFAULT_RELATIVE_FLOOR)?;
    let calibration_s = calibration_started.elapsed().as_secs_f64();
    eprintln!(
        "statistics of {} tokens in {calibration_s:.1} s",
        moments.tokens_seen()
    );

    let keep = UncompressedLayers::reference(config.num_layers);
    let identity = weights_identity(&model.weights);
    let white = ModelFactors::compute(config, &model.weights, &keep, Some(&whiteners))?;
    let plain = if options.factors.contains(&FactorsKind::Weight) {
        Some(ModelFactors::compute(config, &model.weights, &keep, None)?)
    } else {
        None
    };
    let strategies = [
        RankStrategy::Uniform,
        RankStrategy::GreedyEnergy,
        RankStrategy::LearnedThresholds(ThresholdConfig::default()),
    ];
    let distill_inits = [ThresholdInit::GreedyEnergy, ThresholdInit::Uniform];
    // One distiller for every profile and start: its teacher outputs are cached per window,
    // and every run trains on the same windows (step i on window i).
    let mut distiller = if options.distill_steps > 0 {
        Some(Distiller::new(
            config,
            &model.weights,
            &white,
            &stream,
            options.distill_window_tokens,
        )?)
    } else {
        None
    };
    let mut results = Results::new(config, reference_ppl);
    for &profile in &options.profiles {
        let mut budget = EqualBudget::new(profile);
        for &kind in &options.factors {
            let factors = match kind {
                FactorsKind::Weight => plain.as_ref().ok_or("weight factors not computed")?,
                FactorsKind::Whitened => &white,
            };
            for strategy in &strategies {
                let plan = CalibrationPlan::for_profile(profile, strategy.clone(), 0);
                let checkpoint = svd_checkpoint(config, &identity, factors, &plan)?;
                let scored = evaluation.score(config, &model.weights, &checkpoint)?;
                budget.check(strategy.name(), &scored)?;
                results.push(
                    profile,
                    kind.label(),
                    strategy.name(),
                    &checkpoint,
                    &scored,
                    Value::Null,
                );
            }
        }
        let Some(distiller) = distiller.as_mut() else {
            continue;
        };
        for init in distill_inits {
            let distill = DistillConfig {
                steps: options.distill_steps,
                window_tokens: options.distill_window_tokens,
                init,
                ..DistillConfig::default()
            };
            let strategy = match init {
                ThresholdInit::Uniform => RankStrategy::Uniform,
                ThresholdInit::GreedyEnergy => RankStrategy::GreedyEnergy,
            };
            let plan = CalibrationPlan::for_profile(profile, strategy, 0);
            let distill_started = Instant::now();
            let (outcome, report) = distill_with(distiller, &white, &plan, &distill)?;
            let seconds = distill_started.elapsed().as_secs_f64();
            let checkpoint =
                distilled_checkpoint(config, &identity, &white, &plan, &outcome, &report)?;
            let scored = evaluation.score(config, &model.weights, &checkpoint)?;
            let ranks = format!("distilled (from {})", init_name(init));
            budget.check(&ranks, &scored)?;
            let record = distillation_record(init, &distill, &report, seconds);
            results.push_distillation(profile, init, &report, distill.window_tokens, seconds);
            results.push(
                profile,
                FactorsKind::Whitened.label(),
                &ranks,
                &checkpoint,
                &scored,
                record,
            );
        }
    }
    println!("{}", results.table);
    let mut sweep = Vec::new();
    if !options.sweep_permille.is_empty() {
        println!(
            "\n| removed (per-mille) | KV bytes/token | mean KL | perplexity | Δ perplexity |\n\
             |---:|---:|---:|---:|---:|"
        );
    }
    for &permille in &options.sweep_permille {
        let plan = CalibrationPlan {
            profile: None,
            target: BudgetTarget::removed_permille(permille)?,
            ..CalibrationPlan::for_profile(RankProfile::Balanced, RankStrategy::GreedyEnergy, 0)
        };
        let checkpoint = svd_checkpoint(config, &identity, &white, &plan)?;
        let scored = evaluation.score(config, &model.weights, &checkpoint)?;
        println!(
            "| {permille} | {} | {:.4} | {:.3} | {:+.1}% |",
            scored.kv_bytes,
            scored.kl,
            scored.perplexity,
            100.0 * (scored.perplexity / reference_ppl - 1.0)
        );
        sweep.push(json!({
            "removed_permille": permille,
            "kv_bytes_per_token": scored.kv_bytes,
            "mean_kl_nats": scored.kl,
            "perplexity": scored.perplexity,
        }));
    }
    if options.distill_steps > 0 {
        println!("{}", results.distill_table);
    }

    if let Some(dir) = &options.output {
        std::fs::create_dir_all(dir)?;
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        let date = utc_date(SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs());
        let distillation = (options.distill_steps > 0).then(|| {
            json!({
                "split": "haystack essays (not held out), all of them in order, cut into \
                          consecutive windows (as `starling calibrate --distill-steps`); \
                          step i trains on window i",
                "factors": "whitened SVD",
                "steps": options.distill_steps,
                "window_tokens": options.distill_window_tokens,
                "text_tokens": stream.len(),
                "starts": distill_inits.map(init_name),
            })
        });
        let report = json!({
            "command": command,
            "date_utc": date,
            "model": options.model,
            "model_path": path.display().to_string(),
            "weights_sha256": identity,
            "essays_sha256": essays.sha256(),
            "eval": {
                "split": "held-out essays, consecutive windows from the start",
                "tokens": eval_tokens,
                "window_tokens": options.eval_window,
                "reference_perplexity": reference_ppl,
            },
            "calibration": {
                "split": "haystack essays (not held out), evenly spaced windows",
                "tokens": moments.tokens_seen(),
                "window_tokens": options.window_tokens,
                "windows": moments.windows_seen(),
                "relative_eigenvalue_floor": DEFAULT_RELATIVE_FLOOR,
                "statistics_seconds": calibration_s,
            },
            "distillation": distillation,
            "uncompressed_layers": keep.to_vec(),
            "rows": results.rows,
            "removed_share_sweep": sweep,
            "total_seconds": started.elapsed().as_secs_f64(),
        });
        std::fs::write(
            dir.join("quality.json"),
            serde_json::to_string_pretty(&report)?,
        )?;
        let distilled_note = if options.distill_steps > 0 {
            format!(
                " Distilled rows: thresholds trained for {} steps of one {}-token window each \
                 (the first {} windows of the essays not held out, in order), KL(original ‖ \
                 compressed) plus the budget penalty, starting from the greedy or the uniform \
                 allocation of the whitened factors, then projected onto the same budget; \
                 per-step times are in quality.json.",
                options.distill_steps, options.distill_window_tokens, options.distill_steps,
            )
        } else {
            String::new()
        };
        let distill_section = if options.distill_steps > 0 {
            format!(
                "\n## Distillation runs\n\nTraining KL is the soft-thresholded student's on \
                 its training window (not the held-out KL above).\n\n{}",
                results.distill_table
            )
        } else {
            String::new()
        };
        let markdown = format!(
            "# STAR-KV quality: SVD factors, rank allocation and distillation, {}\n\n\
             Date (UTC): {date}. Command: `{command}`.\n\n\
             CPU reference path (K/V weights replaced by their rank-r reconstructions). \
             Evaluation: {eval_tokens} held-out tokens in windows of {}; calibration \
             statistics: {} tokens in {} windows of {} from the essays not held out.{distilled_note} \
             Every row of a profile keeps exactly the same K/V elements per token (checked).\n\n{}{}",
            options.model,
            options.eval_window,
            moments.tokens_seen(),
            moments.windows_seen(),
            options.window_tokens,
            results.table,
            distill_section,
        );
        std::fs::write(dir.join("quality.md"), markdown)?;
        eprintln!("written to {}", dir.display());
    }
    Ok(())
}
/// The uncompressed K/V elements per token of `config` (all layers).
fn kv_elements_per_token(config: &ModelConfig) -> usize {
    config.num_layers * 2 * config.kv_size()
}

/// Essays in order, each followed by a blank line, tokenised one by one without special
/// tokens (as `starling calibrate` and `bench quality` do).
fn essay_tokens(tokenizer: &Tokenizer, essays: &[Essay]) -> Res<Vec<u32>> {
    let mut ids = Vec::new();
    for essay in essays {
        let text = format!("{}\n\n", essay.text.trim_end());
        ids.extend(tokenizer.encode(&text, false)?);
    }
    Ok(ids)
}

/// Logits at every position of each window (each run from position 0 in its own cache).
fn logits(
    config: &ModelConfig,
    weights: WeightMap,
    windows: &[Vec<u32>],
) -> Res<Vec<Vec<Vec<f32>>>> {
    let backend = CpuBackend::new();
    let model = LlamaModel::load(&backend, config, weights)?;
    windows
        .iter()
        .map(|ids| Ok(model.sequence_logits(&backend, ids)?))
        .collect()
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    row.iter().map(|&x| x as f64 - max - sum.ln()).collect()
}

/// Mean over every position of every window of KL(p ‖ q).
fn mean_kl(p: &[Vec<Vec<f32>>], q: &[Vec<Vec<f32>>]) -> f64 {
    let (mut total, mut count) = (0.0, 0usize);
    for (pw, qw) in p.iter().zip(q) {
        for (a, b) in pw.iter().zip(qw) {
            let (la, lb) = (log_softmax(a), log_softmax(b));
            total += la
                .iter()
                .zip(&lb)
                .map(|(x, y)| x.exp() * (x - y))
                .sum::<f64>();
            count += 1;
        }
    }
    total / count.max(1) as f64
}

/// `exp` of the mean negative log-likelihood of each window's next tokens.
fn perplexity(logits: &[Vec<Vec<f32>>], windows: &[Vec<u32>]) -> f64 {
    let (mut nll, mut count) = (0.0, 0usize);
    for (rows, ids) in logits.iter().zip(windows) {
        for (row, &next) in rows.iter().zip(&ids[1..]) {
            nll -= log_softmax(row)[next as usize];
            count += 1;
        }
    }
    (nll / count.max(1) as f64).exp()
}

/// `YYYY-MM-DD` of a Unix time (Howard Hinnant's days-to-civil algorithm).
fn utc_date(unix_s: u64) -> String {
    let z = (unix_s / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

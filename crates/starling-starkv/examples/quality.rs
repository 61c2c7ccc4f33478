//! What each STAR-KV profile costs in next-token quality on the CPU, through the reference
//! path (reconstructed K/V weights), SVD only: mean KL(original ‖ compressed) and perplexity on
//! held-out essays, per profile, for {weight SVD, whitened SVD} × {uniform, greedy, learned
//! thresholds} at equal KV bytes (every row of a profile keeps exactly the same elements).
//!
//!     cargo run --release -p starling-starkv --example quality -- \
//!         [--model smollm2-135m] [--eval-tokens 1024] [--eval-window 512] \
//!         [--calibration-tokens 16384] [--window-tokens 512] [--output DIR]
//!
//! The model (alias, GGUF or HF directory) and the Paul Graham essays come through
//! `starling-hub` (fetched and verified if missing). Calibration windows are spread over the
//! essays not held out, exactly as `starling calibrate` picks them; evaluation windows are
//! consecutive from the start of the held-out essays. With `--output`, `quality.json` and
//! `quality.md` are written there, with the command line and the date.

use std::error::Error;
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use starling_backend::cpu::CpuBackend;
use starling_hub::{fetch_essays, resolve_model, Essay, FetchOptions, ModelLocation};
use starling_models::llama::LlamaModel;
use starling_models::tokenizer::Tokenizer;
use starling_models::{load_model, ModelConfig, WeightMap};
use starling_starkv::checkpoint::weights_identity;
use starling_starkv::{
    apply_projections, calibration_windows, svd_checkpoint, AttentionInputMoments, CalibrationPlan,
    ModelFactors, RankProfile, RankStrategy, ThresholdConfig, UncompressedLayers,
    DEFAULT_RELATIVE_FLOOR,
};

type Res<T> = Result<T, Box<dyn Error>>;

struct Options {
    model: String,
    eval_tokens: usize,
    eval_window: usize,
    calibration_tokens: usize,
    window_tokens: usize,
    output: Option<PathBuf>,
}

fn parse_options() -> Res<Options> {
    let mut options = Options {
        model: "smollm2-135m".to_owned(),
        eval_tokens: 1024,
        eval_window: 512,
        calibration_tokens: 16_384,
        window_tokens: 512,
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
            "--output" => options.output = Some(PathBuf::from(value)),
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    Ok(options)
}

fn main() -> Res<()> {
    let options = parse_options()?;
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
    let eval: Vec<Vec<u32>> = calibration_windows(
        &held_out[..options.eval_tokens.min(held_out.len())],
        options.eval_window,
        options.eval_tokens,
    )?;
    let reference = logits(config, model.weights.clone(), &eval)?;
    let reference_ppl = perplexity(&reference, &eval);
    eprintln!(
        "{} eval tokens in {} windows; reference perplexity {reference_ppl:.3}",
        options.eval_tokens,
        eval.len()
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
    let plain = ModelFactors::compute(config, &model.weights, &keep, None)?;
    let white = ModelFactors::compute(config, &model.weights, &keep, Some(&whiteners))?;
    let strategies = [
        RankStrategy::Uniform,
        RankStrategy::GreedyEnergy,
        RankStrategy::LearnedThresholds(ThresholdConfig::default()),
    ];
    let mut rows = Vec::new();
    let mut table = String::from(
        "| profile | factors | ranks | KV bytes/token (bf16) | mean KL (nats) | perplexity |\n\
         |---|---|---|---:|---:|---:|\n",
    );
    table.push_str(&format!(
        "| none | — | — | {} | — | {reference_ppl:.2} |\n",
        2 * kv_elements_per_token(config)
    ));
    for profile in RankProfile::ALL {
        for (factors_name, factors) in [("weight SVD", &plain), ("whitened SVD", &white)] {
            for strategy in &strategies {
                let plan = CalibrationPlan::for_profile(profile, strategy.clone(), 0);
                let checkpoint = svd_checkpoint(config, &identity, factors, &plan)?;
                let mut weights = model.weights.clone();
                apply_projections(config, &mut weights, &checkpoint.projections)?;
                let got = logits(config, weights, &eval)?;
                let kl = mean_kl(&reference, &got);
                let ppl = perplexity(&got, &eval);
                let bytes = checkpoint
                    .manifest
                    .compression
                    .kv_bytes_per_token_compressed;
                let line = format!(
                    "| {profile} | {factors_name} | {} | {bytes} | {kl:.4} | {ppl:.2} |",
                    strategy.name()
                );
                eprintln!("{line}");
                table.push_str(&line);
                table.push('\n');
                rows.push(json!({
                    "profile": profile.name(),
                    "factors": factors_name,
                    "rank_strategy": strategy.name(),
                    "kv_removed_share": checkpoint.manifest.compression.kv_removed_share,
                    "kv_bytes_per_token_bf16": bytes,
                    "mean_kl_nats": kl,
                    "perplexity": ppl,
                }));
            }
        }
    }
    println!("{table}");

    if let Some(dir) = &options.output {
        std::fs::create_dir_all(dir)?;
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        let date = utc_date(SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs());
        let report = json!({
            "command": command,
            "date_utc": date,
            "model": options.model,
            "model_path": path.display().to_string(),
            "weights_sha256": identity,
            "essays_sha256": essays.sha256(),
            "eval": {
                "split": "held-out essays, consecutive windows from the start",
                "tokens": eval.iter().map(Vec::len).sum::<usize>(),
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
            "uncompressed_layers": keep.to_vec(),
            "rows": rows,
            "total_seconds": started.elapsed().as_secs_f64(),
        });
        std::fs::write(
            dir.join("quality.json"),
            serde_json::to_string_pretty(&report)?,
        )?;
        let markdown = format!(
            "# STAR-KV SVD quality: weight vs whitened factors, {}\n\n\
             Date (UTC): {date}. Command: `{command}`.\n\n\
             CPU reference path (K/V weights replaced by their rank-r reconstructions). \
             Evaluation: {} held-out tokens in windows of {}; calibration statistics: {} \
             tokens in {} windows of {} from the essays not held out. Every row of a profile \
             keeps exactly the same K/V elements per token.\n\n{table}",
            options.model,
            eval.iter().map(Vec::len).sum::<usize>(),
            options.eval_window,
            moments.tokens_seen(),
            moments.windows_seen(),
            options.window_tokens,
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

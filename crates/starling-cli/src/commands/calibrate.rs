//! `starling calibrate`: STAR-KV checkpoints for a model, one per rank profile, from the SVD of
//! its K/V projections. Weight-only for now: the projections are the truncated SVD factors
//! (no calibration text, no distillation; the manifest records `distillation_steps: 0`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use starling_starkv::checkpoint::weights_identity;
use starling_starkv::{
    svd_checkpoint, CalibrationPlan, ModelFactors, RankProfile, RankStrategy, ThresholdConfig,
    UncompressedLayers,
};

use crate::session::open_model;

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
    /// Rank profiles to write, comma-separated: aggressive (80% of K/V cache bytes removed),
    /// balanced (70%), conservative (50%).
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
    /// Seed recorded in the manifests. The SVD path is deterministic; the seed will drive
    /// calibration-text sampling once distillation lands.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Runs `starling calibrate`.
pub fn run(args: CalibrateArgs) -> Result<()> {
    let profiles = parse_profiles(&args.profiles)?;
    let started = Instant::now();
    let bar = stage_bar(profiles.len() as u64 + 3);
    bar.set_message(format!("loading {}", args.model));
    let opened = open_model(&args.model)?;
    let config = &opened.loaded.config;
    bar.inc(1);

    bar.set_message("hashing the weights (model identity)");
    let identity = weights_identity(&opened.loaded.weights);
    bar.inc(1);

    // The reference's choice: the first two layers and the last stay at full K/V.
    let keep = UncompressedLayers::reference(config.num_layers);
    bar.set_message(format!(
        "SVD of {} layers' K/V projections",
        config.num_layers - keep.len()
    ));
    let factors = ModelFactors::compute(config, &opened.loaded.weights, &keep, None)
        .context("factoring the K/V projections")?;
    bar.inc(1);

    let strategy = args.strategy.strategy();
    let mut lines = Vec::with_capacity(profiles.len());
    for profile in profiles {
        bar.set_message(format!("{profile}: allocating ranks ({})", strategy.name()));
        let plan = CalibrationPlan::for_profile(profile, strategy.clone(), args.seed);
        let checkpoint = svd_checkpoint(config, &identity, &factors, &plan)
            .with_context(|| format!("profile {profile}"))?;
        let dir = args.output.join(profile.name());
        checkpoint
            .save(&dir)
            .with_context(|| format!("writing {}", dir.display()))?;
        let r = &checkpoint.manifest.compression;
        lines.push(format!(
            "{:<13} KV {:>6} of {:>6} B/token (bf16, {:.1}% removed), parameter rate C {:.3} → {}",
            profile.name(),
            r.kv_bytes_per_token_compressed,
            r.kv_bytes_per_token_original,
            100.0 * r.kv_removed_share,
            r.parameter_compression_rate,
            dir.display()
        ));
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!(
        "{} ({}): {} of {} layers low-rank, ranks by {}, SVD only (no distillation), {:.1} s",
        args.model,
        opened.path.display(),
        config.num_layers - keep.len(),
        config.num_layers,
        strategy.name(),
        started.elapsed().as_secs_f64()
    );
    for line in lines {
        println!("{line}");
    }
    Ok(())
}

/// The profiles named on the command line, in order, each once.
fn parse_profiles(names: &[String]) -> Result<Vec<RankProfile>> {
    let mut profiles = Vec::with_capacity(names.len());
    for name in names {
        let profile: RankProfile = name.trim().parse()?;
        if profiles.contains(&profile) {
            bail!("--profiles names `{profile}` twice");
        }
        profiles.push(profile);
    }
    if profiles.is_empty() {
        bail!("--profiles is empty");
    }
    Ok(profiles)
}

/// A bar over the calibration stages, drawn on stderr when it is a terminal.
fn stage_bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    // The template is a constant; should it ever fail to parse, the default style is fine.
    if let Ok(style) = ProgressStyle::with_template("[{bar:30}] {pos}/{len} {msg} ({elapsed})") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

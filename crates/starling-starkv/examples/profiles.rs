//! Weight-only STAR-KV figures for a real model: per profile and rank strategy, the KV bytes
//! per token, the parameter compression rate C and the weighted weight-reconstruction error.
//!
//!     cargo run --release -p starling-starkv --example profiles -- MODEL [OUT_DIR]
//!
//! `MODEL` is a GGUF file or a Hugging Face directory; with `OUT_DIR`, one greedy-energy
//! checkpoint per profile is written there (`OUT_DIR/<profile>`).

use std::error::Error;
use std::path::PathBuf;
use std::time::Instant;

use starling_kv::CacheDtype;
use starling_models::load_model;
use starling_starkv::checkpoint::weights_identity;
use starling_starkv::{
    allocate_ranks, svd_checkpoint, CacheBudget, CalibrationPlan, CompressionReport, ModelFactors,
    ModelSpectra, RankAllocation, RankProfile, RankStrategy, ThresholdConfig, UncompressedLayers,
};

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let model_path = PathBuf::from(args.next().ok_or("usage: profiles MODEL [OUT_DIR]")?);
    let out_dir = args.next().map(PathBuf::from);

    let started = Instant::now();
    let model = load_model(&model_path)?;
    let config = &model.config;
    let keep = UncompressedLayers::reference(config.num_layers);
    let factors = ModelFactors::compute(config, &model.weights, &keep, None)?;
    let spectra = ModelSpectra::of(&factors)?;
    println!(
        "{}: {} layers, {} KV heads × {}, hidden {}; load + SVD {:.1} s",
        model_path.display(),
        config.num_layers,
        config.num_kv_heads,
        config.head_dim,
        config.hidden_size,
        started.elapsed().as_secs_f64()
    );
    println!("profile      strategy            KV B/token (bf16)  removed  C       recon error");
    let strategies = [
        RankStrategy::Uniform,
        RankStrategy::GreedyEnergy,
        RankStrategy::LearnedThresholds(ThresholdConfig::default()),
    ];
    for profile in RankProfile::ALL {
        let budget = CacheBudget::new(&factors.shape(), profile.target(), &keep)?;
        for strategy in &strategies {
            let outcome = allocate_ranks(&spectra, &budget, strategy)?;
            let report = CompressionReport::of(&outcome.allocation, CacheDtype::BF16);
            println!(
                "{:<12} {:<19} {:>6} / {:<6}      {:>5.1}%  {:>6.3}  {:.2}",
                profile.name(),
                strategy.name(),
                report.kv_bytes_per_token_compressed,
                report.kv_bytes_per_token_original,
                100.0 * report.kv_removed_share,
                report.parameter_compression_rate,
                weighted_error(&spectra, &outcome.allocation),
            );
        }
        if let Some(dir) = &out_dir {
            let plan = CalibrationPlan::for_profile(profile, RankStrategy::GreedyEnergy, 0);
            let identity = weights_identity(&model.weights);
            svd_checkpoint(config, &identity, &factors, &plan)?.save(dir.join(profile.name()))?;
        }
    }
    Ok(())
}

/// `Σ_f w_f Σ_{i ≥ r_f} σ_i²`: average output rows lost, summed over factors.
fn weighted_error(spectra: &ModelSpectra, allocation: &RankAllocation) -> f64 {
    let ranks = allocation.layers().iter().flatten().flat_map(|r| {
        r.key_ranks
            .iter()
            .copied()
            .chain(std::iter::once(r.value_rank))
    });
    ranks
        .enumerate()
        .map(|(f, rank)| {
            (rank..spectra.max_rank(f))
                .map(|c| spectra.component_value(f, c))
                .sum::<f64>()
        })
        .sum()
}

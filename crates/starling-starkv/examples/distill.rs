//! Knowledge distillation of the STAR-KV thresholds on the CPU: learns one threshold per key
//! head and per value layer against KL(original ‖ compressed) on a text, prints the loss per
//! step, compares the distilled ranks with the greedy-energy ranks at equal KV bytes (on the
//! trained windows and on the next, held-out ones), and writes the ranks and a checkpoint.
//!
//!     cargo run --release -p starling-starkv --example distill -- \
//!         MODEL.gguf TEXT.txt [STEPS=16] [WINDOW=128] [PROFILE=balanced] [OUT=distilled]
//!
//! `MODEL` must be a GGUF file (its tokenizer is read from the metadata). `OUT` receives
//! `ranks.json` (per-layer ranks, thresholds and the step log) and the checkpoint files.

use std::error::Error;
use std::time::Instant;

use starling_models::load_model;
use starling_models::tokenizer::Tokenizer;
use starling_starkv::checkpoint::weights_identity;
use starling_starkv::distill::{distill_with, distilled_checkpoint, DistillConfig, Distiller};
use starling_starkv::{
    allocate_ranks, CacheBudget, CalibrationPlan, ModelFactors, ModelSpectra, RankProfile,
    RankStrategy, UncompressedLayers,
};

/// Held-out windows scored after training.
const HELD_OUT_WINDOWS: usize = 4;

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: distill MODEL.gguf TEXT.txt [STEPS] [WINDOW] [PROFILE] [OUT]";
    let model_path = args.next().ok_or(usage)?;
    let text_path = args.next().ok_or(usage)?;
    let steps: usize = args.next().map_or(Ok(16), |s| s.parse())?;
    let window_tokens: usize = args.next().map_or(Ok(128), |s| s.parse())?;
    let profile: RankProfile = args
        .next()
        .map_or(Ok(RankProfile::Balanced), |s| s.parse())?;
    let out = args.next().unwrap_or_else(|| "distilled".to_owned());

    let start = Instant::now();
    let model = load_model(&model_path)?;
    let metadata = model
        .gguf_metadata
        .as_ref()
        .ok_or("MODEL must be a GGUF file")?;
    let tokenizer = Tokenizer::from_gguf_metadata(metadata)?;
    let ids = tokenizer.encode(&std::fs::read_to_string(&text_path)?, false)?;
    let config = &model.config;
    let keep = UncompressedLayers::reference(config.num_layers);
    let factors = ModelFactors::compute(config, &model.weights, &keep, None)?;
    // One window per step, then the held-out ones: step i trains on window i only.
    let trained_windows = steps.max(1);
    let used = (trained_windows + HELD_OUT_WINDOWS) * window_tokens;
    if ids.len() < used {
        return Err(format!("{} tokens: {steps} steps need {used}", ids.len()).into());
    }
    let text = &ids[..used];
    let mut distiller = Distiller::new(config, &model.weights, &factors, text, window_tokens)?;
    println!(
        "{} tokens of {text_path} ({} windows of {window_tokens}); load + SVD {:.1} s",
        ids.len(),
        distiller.windows(),
        start.elapsed().as_secs_f64()
    );

    let plan = CalibrationPlan::for_profile(profile, RankStrategy::GreedyEnergy, 0);
    let distill = DistillConfig {
        steps,
        window_tokens,
        ..DistillConfig::default()
    };
    let (outcome, report) = distill_with(&mut distiller, &factors, &plan, &distill)?;
    println!("| step | window | KL (nats) | soft rank | hard rank | μ | ms |");
    println!("|---|---|---|---|---|---|---|");
    for s in &report.steps {
        println!(
            "| {} | {} | {:.5} | {:.1} | {} | {:.4} | {} |",
            s.step, s.window, s.kl, s.soft_rank, s.hard_rank, s.multiplier, s.elapsed_ms
        );
    }
    let mean_ms = report.steps.iter().map(|s| s.elapsed_ms).sum::<u64>() as f64
        / report.steps.len().max(1) as f64;
    println!(
        "target {} elements in the compressed layers; learned hard rank {}; {mean_ms:.0} ms/step",
        report.target_elements, report.learned_hard_rank
    );

    let spectra = ModelSpectra::of(&factors)?;
    let budget = CacheBudget::new(&factors.shape(), plan.target, factors.uncompressed())?;
    let greedy = allocate_ranks(&spectra, &budget, &RankStrategy::GreedyEnergy)?;
    let uniform = allocate_ranks(&spectra, &budget, &RankStrategy::Uniform)?;
    let trained = 0..trained_windows;
    let held_out = trained_windows..trained_windows + HELD_OUT_WINDOWS;
    println!("| {profile} ranks | KL trained windows | KL held-out windows |");
    println!("|---|---|---|");
    for (name, allocation) in [
        ("uniform", &uniform.allocation),
        ("greedy energy", &greedy.allocation),
        ("distilled", &outcome.allocation),
    ] {
        let on_trained = distiller.allocation_kl(allocation, trained.clone())?;
        let on_held_out = distiller.allocation_kl(allocation, held_out.clone())?;
        println!("| {name} | {on_trained:.5} | {on_held_out:.5} |");
    }

    std::fs::create_dir_all(&out)?;
    let ranks = serde_json::json!({
        "profile": profile.name(),
        "layers": outcome.allocation.layers(),
        "thresholds": outcome.thresholds,
        "report": report,
    });
    std::fs::write(
        std::path::Path::new(&out).join("ranks.json"),
        serde_json::to_string_pretty(&ranks)?,
    )?;
    let identity = weights_identity(&model.weights);
    let checkpoint = distilled_checkpoint(config, &identity, &factors, &plan, &outcome, &report)?;
    checkpoint.save(&out)?;
    println!("wrote {out}/ranks.json and the checkpoint");
    Ok(())
}

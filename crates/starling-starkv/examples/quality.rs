//! What each STAR-KV profile costs in next-token quality on the CPU, through the reference
//! path (reconstructed K/V weights): mean KL(original ‖ compressed) over positions and the
//! perplexity of the text, per profile and rank strategy, SVD only.
//!
//!     cargo run --release -p starling-starkv --example quality -- MODEL.gguf TEXT.txt [TOKENS]
//!
//! `MODEL` must be a GGUF file (its tokenizer is read from the metadata).

use std::error::Error;

use starling_backend::cpu::CpuBackend;
use starling_models::llama::LlamaModel;
use starling_models::tokenizer::Tokenizer;
use starling_models::{load_model, ModelConfig, WeightMap};
use starling_starkv::checkpoint::weights_identity;
use starling_starkv::{
    apply_projections, svd_checkpoint, CalibrationPlan, ModelFactors, RankProfile, RankStrategy,
    UncompressedLayers,
};

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: quality MODEL.gguf TEXT.txt [TOKENS]";
    let model_path = args.next().ok_or(usage)?;
    let text_path = args.next().ok_or(usage)?;
    let tokens: usize = args.next().map_or(Ok(512), |t| t.parse())?;

    let model = load_model(&model_path)?;
    let metadata = model
        .gguf_metadata
        .as_ref()
        .ok_or("MODEL must be a GGUF file")?;
    let tokenizer = Tokenizer::from_gguf_metadata(metadata)?;
    let mut ids = tokenizer.encode(&std::fs::read_to_string(&text_path)?, false)?;
    ids.truncate(tokens);
    let config = &model.config;
    let reference = logits(config, model.weights.clone(), &ids)?;
    println!(
        "{} tokens of {text_path}; reference perplexity {:.3}",
        ids.len(),
        perplexity(&reference, &ids)
    );

    let keep = UncompressedLayers::reference(config.num_layers);
    let factors = ModelFactors::compute(config, &model.weights, &keep, None)?;
    let identity = weights_identity(&model.weights);
    println!("| profile | strategy | KV removed | mean KL (nats) | perplexity |");
    println!("|---|---|---|---|---|");
    for profile in RankProfile::ALL {
        for strategy in [RankStrategy::Uniform, RankStrategy::GreedyEnergy] {
            let plan = CalibrationPlan::for_profile(profile, strategy.clone(), 0);
            let checkpoint = svd_checkpoint(config, &identity, &factors, &plan)?;
            let mut weights = model.weights.clone();
            apply_projections(config, &mut weights, &checkpoint.projections)?;
            let got = logits(config, weights, &ids)?;
            println!(
                "| {profile} | {} | {:.1}% | {:.4} | {:.3} |",
                strategy.name(),
                100.0 * checkpoint.manifest.compression.kv_removed_share,
                mean_kl(&reference, &got),
                perplexity(&got, &ids)
            );
        }
    }
    Ok(())
}

fn logits(
    config: &ModelConfig,
    weights: WeightMap,
    ids: &[u32],
) -> Result<Vec<Vec<f32>>, Box<dyn Error>> {
    let backend = CpuBackend::new();
    let model = LlamaModel::load(&backend, config, weights)?;
    Ok(model.sequence_logits(&backend, ids)?)
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    row.iter().map(|&x| x as f64 - max - sum.ln()).collect()
}

/// Mean over positions of KL(p ‖ q).
fn mean_kl(p: &[Vec<f32>], q: &[Vec<f32>]) -> f64 {
    let total: f64 = p
        .iter()
        .zip(q)
        .map(|(a, b)| {
            let (la, lb) = (log_softmax(a), log_softmax(b));
            la.iter()
                .zip(&lb)
                .map(|(x, y)| x.exp() * (x - y))
                .sum::<f64>()
        })
        .sum();
    total / p.len().max(1) as f64
}

/// `exp` of the mean negative log-likelihood of each next token.
fn perplexity(logits: &[Vec<f32>], ids: &[u32]) -> f64 {
    let nll: f64 = logits
        .iter()
        .zip(&ids[1..])
        .map(|(row, &next)| -log_softmax(row)[next as usize])
        .sum();
    (nll / (ids.len() - 1).max(1) as f64).exp()
}

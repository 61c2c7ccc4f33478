//! `--kv-cache-dtype fp8` on the CPU reference: the sizing counts one byte per element (so the
//! same budget holds four times the f32 blocks here, twice the bf16 ones on a GPU), the cache
//! holds e4m3-rounded K/V, the model's probabilities stay close to the full-precision cache's,
//! and eviction composes with it.

mod common;

use common::{
    assert_keydiff_composes, engine_in_dtype, tiny_model, tiny_weights, total_variation_per_dtype,
};
use starling_backend::cpu::CpuBackend;
use starling_engine::Engine;
use starling_evict::{CompressionConfig, KvCacheDtype};
use starling_kv::CacheDtype;
use starling_models::llama::{fp8_max_key_bias, LlamaModel};
use starling_models::ModelConfig;

const BLOCKS_F32: usize = 64;

fn engine(kv_dtype: KvCacheDtype, eviction: CompressionConfig) -> Engine<CpuBackend> {
    engine_of(tiny_model(), kv_dtype, eviction)
}

/// An engine on `model` whose budget holds `BLOCKS_F32` blocks of the model's f32 cache.
fn engine_of(
    model: LlamaModel<CpuBackend>,
    kv_dtype: KvCacheDtype,
    eviction: CompressionConfig,
) -> Engine<CpuBackend> {
    engine_in_dtype(model, kv_dtype, eviction, BLOCKS_F32)
}

#[test]
fn an_fp8_cache_holds_the_byte_ratio_more_blocks_and_says_so() {
    let auto = engine(KvCacheDtype::Auto, CompressionConfig::default());
    let fp8 = engine(KvCacheDtype::Fp8, CompressionConfig::default());
    let (a, f) = (auto.cache_report(), fp8.cache_report());
    assert_eq!(a.dtype, "f32");
    assert_eq!(f.dtype, "fp8");
    // f32 is 4 bytes, e4m3 1: exactly four times the blocks in the same budget.
    assert_eq!(a.num_blocks, BLOCKS_F32);
    assert_eq!(f.num_blocks, 4 * BLOCKS_F32);
    assert_eq!(
        fp8.cache_layout().layers[0].dtype(),
        CacheDtype::Fp8,
        "the layout allocated is the one sized"
    );
    assert_eq!(4 * f.bytes_per_token, a.bytes_per_token);
    assert!(f.to_string().contains("fp8"), "{f}");
}

#[test]
fn fp8_probabilities_track_the_full_precision_cache_and_eviction_composes() {
    // Both caches teacher-forced to the same tokens: compare each position's probabilities.
    let (mean, worst, rows) = total_variation_per_dtype(&[KvCacheDtype::Fp8], BLOCKS_F32)[0];
    println!(
        "fp8 vs f32 cache over {rows} positions: total variation mean {mean:.4}, max {worst:.4}"
    );
    // e4m3 keeps 3 mantissa bits (a relative error up to 1/16 per element). This test model is
    // deliberately sharp (weights scaled up 15x: attention logits of std ~6, near one-hot
    // outputs), so the distributions move measurably (0.13 mean when written); wrong bytes or
    // a misplaced row would move them by most of their mass (~0.9), and a cache that were not
    // rounded would not move them at all. Real models' quality: `starling bench quality` with
    // `--kv-cache-dtype fp8` (BENCHMARKS.md).
    assert!(mean > 0.0, "the fp8 cache changed nothing: was it rounded?");
    assert!(mean < 0.2 && worst < 0.6, "mean {mean:.4}, max {worst:.4}");

    // KeyDiff on top of fp8: the compactions run on byte-rounded keys and give blocks back.
    assert_keydiff_composes(KvCacheDtype::Fp8, BLOCKS_F32, 4 * BLOCKS_F32);
}

#[test]
fn layers_whose_key_bias_an_fp8_cache_cannot_hold_keep_the_activation_dtype() {
    // Qwen2-style biases; layer 1's key bias raised past what e4m3 holds (Qwen2.5's first
    // layers reach 354).
    let cfg = ModelConfig {
        attention_bias: true,
        ..ModelConfig::tiny_llama_for_tests()
    };
    let mut weights = tiny_weights(&cfg, 11).into_inner();
    let bias = weights
        .get_mut("model.layers.1.self_attn.k_proj.bias")
        .expect("a key bias");
    bias.data_mut()[3] = 4.0 * fp8_max_key_bias();
    let model = LlamaModel::load(&CpuBackend::new(), &cfg, weights.into_iter().collect()).unwrap();
    assert_eq!(model.fp8_exempt_layers(), vec![1]);
    let layout = model.cache_layout(CacheDtype::Fp8);
    let dtypes: Vec<CacheDtype> = layout.layers.iter().map(|l| l.dtype()).collect();
    assert_eq!(dtypes, vec![CacheDtype::Fp8, CacheDtype::F32]);
    // Without fp8 nothing changes.
    assert!(model
        .cache_layout(CacheDtype::F32)
        .layers
        .iter()
        .all(|l| l.dtype() == CacheDtype::F32));
    // The engine sizes and allocates what the layout says, and its report names the layer.
    let engine = engine_of(model, KvCacheDtype::Fp8, CompressionConfig::default());
    let report = engine.cache_report();
    assert!(
        report.dtype.starts_with("fp8") && report.dtype.contains("layers 1"),
        "{}",
        report.dtype
    );
    // One layer of 4 bytes and one of 1 per element: 64 * 8 / 5 blocks.
    assert_eq!(report.num_blocks, BLOCKS_F32 * 8 / 5);
}

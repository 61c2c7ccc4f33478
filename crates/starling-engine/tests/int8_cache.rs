//! `--kv-cache-dtype int8` on the CPU reference: symmetric int8 with a half-precision scale per
//! KV head row and token. The sizing counts the bytes and the scales, the model's probabilities
//! stay closer to the full-precision cache's than fp8's do, a key bias e4m3 cannot hold needs no
//! exemption (each row has its own scale), and eviction composes with it. `int4` (a scale per
//! group of 32 elements of a row) likewise: its sizing, and its coarser rounding.

mod common;

use common::{
    assert_keydiff_composes, engine_in_dtype, tiny_model, tiny_weights, total_variation,
    total_variation_per_dtype,
};
use starling_backend::cpu::CpuBackend;
use starling_engine::testing::{EngineTester, Trace};
use starling_engine::Engine;
use starling_evict::{CompressionConfig, KvCacheDtype};
use starling_kv::{CacheDtype, SCALE_BYTES};
use starling_models::llama::{fp8_max_key_bias, LlamaModel};
use starling_models::ModelConfig;

const BLOCKS_F32: usize = 64;

/// An engine on `model` whose budget holds `BLOCKS_F32` blocks of the model's f32 cache.
fn engine_of(
    model: LlamaModel<CpuBackend>,
    kv_dtype: KvCacheDtype,
    eviction: CompressionConfig,
) -> Engine<CpuBackend> {
    engine_in_dtype(model, kv_dtype, eviction, BLOCKS_F32)
}

fn engine(kv_dtype: KvCacheDtype, eviction: CompressionConfig) -> Engine<CpuBackend> {
    engine_of(tiny_model(), kv_dtype, eviction)
}

#[test]
fn an_int8_cache_counts_its_scales_and_tracks_the_full_precision_cache_closer_than_fp8() {
    let cfg = ModelConfig::tiny_llama_for_tests();
    let auto = engine(KvCacheDtype::Auto, CompressionConfig::default());
    let int8 = engine(KvCacheDtype::Int8, CompressionConfig::default());
    let (a, q) = (auto.cache_report(), int8.cache_report());
    assert_eq!((a.dtype.as_str(), q.dtype.as_str()), ("f32", "int8"));
    // Per layer and token: one byte per element plus a 2-byte scale per KV head's key and value.
    let elements = 2 * (cfg.num_kv_heads * cfg.head_dim) as u64 * cfg.num_layers as u64;
    let scales = 2 * cfg.num_kv_heads as u64 * cfg.num_layers as u64 * SCALE_BYTES;
    assert_eq!(a.bytes_per_token, 4 * elements);
    assert_eq!(q.bytes_per_token, elements + scales);
    assert_eq!(
        q.num_blocks as u64,
        BLOCKS_F32 as u64 * a.bytes_per_token / q.bytes_per_token
    );
    assert!(int8
        .cache_layout()
        .layers
        .iter()
        .all(|l| l.dtype() == CacheDtype::Int8));

    let moved = total_variation_per_dtype(&[KvCacheDtype::Int8, KvCacheDtype::Fp8], BLOCKS_F32);
    let ((int8_mean, int8_worst, rows), (fp8_mean, _, _)) = (moved[0], moved[1]);
    println!(
        "over {rows} positions, total variation vs the f32 cache: int8 mean {int8_mean:.4} (max \
         {int8_worst:.4}), fp8 mean {fp8_mean:.4}"
    );
    // The sharp test model (see fp8_cache.rs) moves under any rounding; int8's 127 steps per
    // row resolve finer than e4m3's 3 mantissa bits, wrong bytes or scales would move most of
    // the mass.
    assert!(
        int8_mean > 0.0,
        "the int8 cache changed nothing: was it rounded?"
    );
    assert!(
        int8_mean < fp8_mean,
        "int8 {int8_mean:.4} vs fp8 {fp8_mean:.4}"
    );
    assert!(int8_worst < 0.6, "max {int8_worst:.4}");

    // KeyDiff on top of int8: compactions run on the quantised keys and give blocks back.
    assert_keydiff_composes(KvCacheDtype::Int8, BLOCKS_F32, q.num_blocks);
}

#[test]
fn an_int4_cache_counts_a_scale_per_group_and_rounds_coarser_than_int8() {
    let cfg = ModelConfig::tiny_llama_for_tests();
    let auto = engine(KvCacheDtype::Auto, CompressionConfig::default());
    let int4 = engine(KvCacheDtype::Int4, CompressionConfig::default());
    let (a, q) = (auto.cache_report(), int4.cache_report());
    assert_eq!(q.dtype, "int4");
    // Per layer and token: half a byte per element plus a 2-byte scale per started group of
    // 32 elements of each KV head's key and value row.
    let elements = 2 * (cfg.num_kv_heads * cfg.head_dim) as u64 * cfg.num_layers as u64;
    let groups = 2 * (cfg.num_kv_heads * cfg.head_dim.div_ceil(32)) as u64 * cfg.num_layers as u64;
    assert_eq!(q.bytes_per_token, elements / 2 + groups * SCALE_BYTES);
    assert_eq!(
        q.num_blocks as u64,
        BLOCKS_F32 as u64 * a.bytes_per_token / q.bytes_per_token
    );

    let moved = total_variation_per_dtype(&[KvCacheDtype::Int4, KvCacheDtype::Int8], BLOCKS_F32);
    let ((int4_mean, int4_worst, rows), (int8_mean, _, _)) = (moved[0], moved[1]);
    println!(
        "over {rows} positions, total variation vs the f32 cache: int4 mean {int4_mean:.4} (max \
         {int4_worst:.4}), int8 mean {int8_mean:.4}"
    );
    // 15 levels per group of 32 resolve coarser than 255 per row, but wrong nibbles or scales
    // would move nearly all of the mass.
    assert!(
        int4_mean > int8_mean,
        "int4 {int4_mean:.4} vs int8 {int8_mean:.4}"
    );
    assert!(int4_mean < 0.5, "int4 mean {int4_mean:.4}");

    // KeyDiff on top of int4 compacts and gives blocks back.
    assert_keydiff_composes(KvCacheDtype::Int4, BLOCKS_F32, q.num_blocks);
}

#[test]
fn a_key_bias_fp8_cannot_hold_is_no_exemption_for_int8() {
    let cfg = ModelConfig {
        attention_bias: true,
        ..ModelConfig::tiny_llama_for_tests()
    };
    let mut weights = tiny_weights(&cfg, 11).into_inner();
    let bias = weights
        .get_mut("model.layers.1.self_attn.k_proj.bias")
        .expect("a key bias");
    bias.data_mut()[3] = 4.0 * fp8_max_key_bias();
    let load = || {
        LlamaModel::load(
            &CpuBackend::new(),
            &cfg,
            weights.clone().into_iter().collect(),
        )
        .unwrap()
    };
    let model = load();
    assert_eq!(model.fp8_exempt_layers(), vec![1]);
    assert!(model
        .cache_layout(CacheDtype::Int8)
        .layers
        .iter()
        .all(|l| l.dtype() == CacheDtype::Int8));

    // The biased layer under int8 keeps the distributions close: its rows carry their offset in
    // their own scale.
    let tester = EngineTester::default();
    let trace = Trace::seeded_greedy(9, 4, 128, 20..100, 8..16, 2);
    let reference = tester
        .run(
            &mut engine_of(load(), KvCacheDtype::Auto, CompressionConfig::default()),
            &trace,
        )
        .unwrap();
    let forced = trace.forced_to(&reference);
    let full = tester
        .run(
            &mut engine_of(load(), KvCacheDtype::Auto, CompressionConfig::default()),
            &forced,
        )
        .unwrap();
    let int8 = tester
        .run(
            &mut engine_of(load(), KvCacheDtype::Int8, CompressionConfig::default()),
            &forced,
        )
        .unwrap();
    let (mean, _, _) = total_variation(&full, &int8);
    assert!(mean > 0.0 && mean < 0.2, "mean {mean:.4}");
}

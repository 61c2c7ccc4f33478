//! The fp8 (e4m3) dense cache against the CPU reference, which holds the same e4m3 values in
//! f32 slots (`starling_backend::fp8`): the writes store exactly the CPU's bytes (saturation
//! included), every attention kernel (per-token, tensor-core decode, tiled prefill, splits,
//! windows, compacted sequences) reads them back to the bf16 cache's tolerance, and the
//! eviction scores, copies and compaction work on byte rows.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use starling_backend::cpu::CpuBackend;
use starling_backend::{
    AttentionDims, BackendCore, BatchMeta, HostTensor, KeyScoreKind, KvCacheOps, KvCacheSpec,
    ModelOps, RopeSpec, RopeStyle, WindowScoreSpec,
};
use starling_cuda::CudaBackend;
use starling_kv::CacheDtype;

use super::{
    assert_same, block_tables, check_prefill_batch_in, cpu_spec, filled_caches, gpu, rand_host,
    random_subset, rel_err, seq, PrefillSeq, F32_REL_TOL, KEYDIFF_ABS_TOL,
};

/// (KV heads, head_dim) of the fp8 cases: head widths that are multiples of 8 (what an fp8
/// cache takes), grouped and MHA.
const FP8_SHAPES: [(usize, usize); 3] = [(2, 128), (3, 64), (32, 128)];

fn fp8_spec(num_kv_heads: usize, head_dim: usize, num_blocks: usize) -> KvCacheSpec {
    KvCacheSpec::full(num_blocks, 16, num_kv_heads, head_dim, CacheDtype::Fp8)
}

/// Every slot's keys and values of a cache as f32: `read_keys` for the keys; for the values, the
/// raw words `gather_kv` returns (two e4m3 bytes per bf16 word on the GPU, which `to_host` carries
/// exactly for finite fp8 content) decoded on the host.
fn fp8_contents<B: KvCacheOps>(
    backend: &B,
    cache: &B::KvCache,
    spec: &KvCacheSpec,
    gpu_words: bool,
) -> (HostTensor, HostTensor) {
    let all: Vec<u32> = (0..spec.num_blocks as u32).collect();
    let (bs, n) = (spec.block_size_tokens, spec.num_slots());
    let keys = backend.read_keys(cache, &all, bs, n).unwrap();
    let rows = backend.gather_kv(cache, &all, bs, n).unwrap();
    let values = backend.to_host(&rows.values).unwrap();
    let values = if gpu_words {
        let data = values
            .data()
            .iter()
            .flat_map(|w| half::bf16::from_f32(*w).to_bits().to_le_bytes())
            .map(starling_backend::fp8::e4m3_to_f32)
            .collect();
        HostTensor::new(vec![n, values.shape()[1] * 2], data).unwrap()
    } else {
        values
    };
    let keys = HostTensor::new(vec![n, keys.data().len() / n.max(1)], keys.data().to_vec());
    (keys.unwrap(), values)
}

/// Both fp8 caches hold the same values, bit for bit.
fn assert_fp8_caches_equal(
    name: &str,
    gpu: &CudaBackend,
    cache_g: &<CudaBackend as BackendCore>::KvCache,
    cpu: &CpuBackend,
    cache_c: &<CpuBackend as BackendCore>::KvCache,
    spec: &KvCacheSpec,
) {
    let (kg, vg) = fp8_contents(gpu, cache_g, spec, true);
    let (kc, vc) = fp8_contents(cpu, cache_c, spec, false);
    assert_same(&format!("{name} (K)"), &kg, &kc);
    assert_same(&format!("{name} (V)"), &vg, &vc);
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn fp8_cache_writes_store_the_cpu_s_e4m3_bytes() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(51);
    for (heads, kv_heads, hd) in [(12usize, 2usize, 128usize), (9, 3, 64), (32, 32, 128)] {
        let dims = AttentionDims {
            cache_group: 0,
            window_tokens: None,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let spec = fp8_spec(kv_heads, hd, 40);
        let n = 300;
        let slots: Vec<u32> = (0..n as u32).map(|i| (i * 7) % 640).collect();
        let meta = BatchMeta::single_sequence(
            0,
            n,
            slots.clone(),
            (0..spec.num_blocks as u32).collect(),
            16,
            Vec::new(),
        );
        // Values up to ±600: beyond e4m3's ±448, which the writes saturate to. Every input is
        // bf16-exact, so both sides round the same number.
        let qkv = rand_host(&mut rng, vec![n, dims.qkv_size()], 600.0);
        let (bc, bg) = (
            cpu.prepare_batch(&meta, spec.num_blocks).unwrap(),
            gpu.prepare_batch(&meta, spec.num_blocks).unwrap(),
        );
        let mut cache_c = cpu.alloc_kv_cache(&cpu_spec(&spec)).unwrap();
        let mut cache_g = gpu.alloc_kv_cache(&spec).unwrap();
        cpu.write_kv(&mut cache_c, &qkv, &dims, &bc).unwrap();
        gpu.write_kv(&mut cache_g, &gpu.upload(&qkv).unwrap(), &dims, &bg)
            .unwrap();
        let label = format!("fp8 write_kv h{heads}/{kv_heads} d{hd}");
        assert_fp8_caches_equal(&label, &gpu, &cache_g, &cpu, &cache_c, &spec);
        let (keys, _) = fp8_contents(&gpu, &cache_g, &spec, true);
        assert!(
            keys.data().iter().any(|k| k.abs() == 448.0),
            "{label}: no saturation"
        );
        println!("{label:<40} exact");

        // The fused RoPE + write equals rope_qk, then write_kv, on the GPU, bit for bit.
        let rope = RopeSpec {
            inv_freqs: (0..hd / 2)
                .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / hd as f32))
                .collect(),
            style: RopeStyle::Neox,
        };
        let small = rand_host(&mut rng, vec![n, dims.qkv_size()], 4.0);
        let mut fused_qkv = gpu.upload(&small).unwrap();
        let mut fused = gpu.alloc_kv_cache(&spec).unwrap();
        gpu.rope_qk_write_kv(&mut fused_qkv, &mut fused, &dims, &rope, &bg)
            .unwrap();
        let mut two_qkv = gpu.upload(&small).unwrap();
        let mut two = gpu.alloc_kv_cache(&spec).unwrap();
        gpu.rope_qk(&mut two_qkv, &dims, &rope, &bg).unwrap();
        gpu.write_kv(&mut two, &two_qkv, &dims, &bg).unwrap();
        let (fk, fv) = fp8_contents(&gpu, &fused, &spec, true);
        let (tk, tv) = fp8_contents(&gpu, &two, &spec, true);
        assert_same(&format!("fused {label} (K)"), &fk, &tk);
        assert_same(&format!("fused {label} (V)"), &fv, &tv);
        // ... and the CPU's rotation written to its fp8 cache is the same within a rounding
        // of the rotated value (the GPU rounds it to bf16 first).
        let mut qkv_c = small.clone();
        cpu.rope_qk(&mut qkv_c, &dims, &rope, &bc).unwrap();
        let mut rotated_c = cpu.alloc_kv_cache(&cpu_spec(&spec)).unwrap();
        cpu.write_kv(&mut rotated_c, &qkv_c, &dims, &bc).unwrap();
        let (ck, _) = fp8_contents(&cpu, &rotated_c, &spec, false);
        let e = rel_err(&fk, &ck);
        println!("fused {label:<34} vs CPU rotation: rel err {e:.2e}");
        assert!(e < 2e-2, "fused {label} vs CPU: {e:.3e}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn fp8_cache_attention_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(52);
    let fp8 = CacheDtype::Fp8;
    let compacted = PrefillSeq {
        earlier: 3000,
        kept: Some(1000),
        new: 1,
    };
    // Tiled prefill, tensor-core decode (grouped), per-token decode (MHA at batch 64), splits.
    let mixed = [
        seq(0, 5),
        seq(1000, 1),
        seq(17, 130),
        seq(300, 64),
        seq(4999, 1),
        compacted,
        seq(100, 300),
        seq(1, 2),
    ];
    let shapes = [
        (12usize, 2usize, 128usize), // Qwen2.5-1.5B
        (9, 3, 64),                  // SmolLM2
        (32, 8, 128),                // Llama-3-8B
        (32, 32, 128),               // Llama-2-7B (MHA)
        (8, 1, 64),
    ];
    for (heads, kv_heads, hd) in shapes {
        for window in [None, Some(100)] {
            let dims = AttentionDims {
                cache_group: 0,
                window_tokens: window,
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
            };
            let shape = format!("h{heads}/{kv_heads} d{hd} window {window:?}");
            let label = format!("fp8 mixed {shape}");
            check_prefill_batch_in(&gpu, &cpu, &dims, &mixed, &mut rng, &label, fp8);
            for c in [1usize, 300, 5000] {
                let label = format!("fp8 decode batch 1 ctx {c} {shape}");
                check_prefill_batch_in(&gpu, &cpu, &dims, &[seq(c - 1, 1)], &mut rng, &label, fp8);
            }
            let batch: Vec<PrefillSeq> = (0..64)
                .map(|i| match i {
                    0 => seq(4999, 1),
                    1 => compacted,
                    _ => seq(rng.gen_range(0..400), 1),
                })
                .collect();
            let label = format!("fp8 decode batch 64 {shape}");
            check_prefill_batch_in(&gpu, &cpu, &dims, &batch, &mut rng, &label, fp8);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn fp8_cache_scores_copies_and_compaction_match_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(53);
    let lens = [7usize, 300, 3000];
    for (nkv, hd) in FP8_SHAPES {
        let spec = fp8_spec(nkv, hd, 260);
        let (mut cache_c, mut cache_g) = filled_caches(&gpu, &cpu, &spec, &mut rng);
        let name = format!("fp8 {nkv}x{hd}");
        assert_fp8_caches_equal(
            &format!("{name} filled"),
            &gpu,
            &cache_g,
            &cpu,
            &cache_c,
            &spec,
        );
        let (tables, free) = block_tables(&mut rng, &spec, &lens);
        let bs = spec.block_size_tokens;
        for (table, &len) in tables.iter().zip(&lens) {
            for kind in [KeyScoreKind::KNorm, KeyScoreKind::KeyDiff] {
                let got = gpu
                    .to_host(&gpu.key_scores(&cache_g, table, bs, len, kind).unwrap())
                    .unwrap();
                let want = cpu.key_scores(&cache_c, table, bs, len, kind).unwrap();
                let e = rel_err(&got, &want);
                println!("{name} key_scores {kind:?} len {len:<5} rel err {e:.2e}");
                assert!(e < 10.0 * F32_REL_TOL, "{name} {kind:?} len {len}: {e:.3e}");
                if kind == KeyScoreKind::KeyDiff {
                    let worst = got
                        .data()
                        .iter()
                        .zip(want.data())
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0f32, f32::max);
                    assert!(worst < KEYDIFF_ABS_TOL, "{name} len {len}: {worst:.3e}");
                }
            }
            let window = 16.min(len);
            let queries = rand_host(&mut rng, vec![window, nkv * 2 * hd], 4.0);
            let score = WindowScoreSpec {
                group: 2,
                scale: 1.0 / (hd as f32).sqrt(),
                pool_kernel_tokens: 7,
            };
            let got = gpu
                .to_host(
                    &gpu.window_scores(&cache_g, table, bs, len, &queries, &score)
                        .unwrap(),
                )
                .unwrap();
            let want = cpu
                .window_scores(&cache_c, table, bs, len, &queries, &score)
                .unwrap();
            let finite = |t: &HostTensor| {
                let data = t
                    .data()
                    .iter()
                    .map(|v| if v.is_finite() { *v } else { 0.0 });
                HostTensor::new(t.shape().to_vec(), data.collect()).unwrap()
            };
            let e = rel_err(&finite(&got), &finite(&want));
            println!("{name} window_scores len {len:<5} rel err {e:.2e}");
            assert!(e < 1e-3, "{name} window_scores len {len}: {e:.3e}");
        }
        // Block copies (whole byte blocks) and compaction (per-head byte segments).
        let pairs: Vec<(u32, u32)> = (0..8).map(|i| (tables[1][i % 3], free[i])).collect();
        cpu.copy_kv_blocks(&mut cache_c, &pairs).unwrap();
        gpu.copy_kv_blocks(&mut cache_g, &pairs).unwrap();
        assert_fp8_caches_equal(
            &format!("{name} copies"),
            &gpu,
            &cache_g,
            &cpu,
            &cache_c,
            &spec,
        );
        let keep: Vec<Vec<u32>> = (0..nkv)
            .map(|_| random_subset(&mut rng, 3000, 1200))
            .collect();
        cpu.compact_kv(&mut cache_c, &tables[2], bs, 3000, &keep)
            .unwrap();
        gpu.compact_kv(&mut cache_g, &tables[2], bs, 3000, &keep)
            .unwrap();
        assert_fp8_caches_equal(
            &format!("{name} compaction"),
            &gpu,
            &cache_g,
            &cpu,
            &cache_c,
            &spec,
        );
        // Gathered rows are raw words that scatter back unchanged (preemption's round trip).
        let rows = gpu.gather_kv(&cache_g, &tables[1], bs, 300).unwrap();
        assert_eq!(rows.keys.shape(), &[300, nkv * hd / 2]);
        gpu.scatter_kv(&mut cache_g, &tables[0], bs, &rows)
            .unwrap_err();
        let (before_k, before_v) = fp8_contents(&gpu, &cache_g, &spec, true);
        gpu.scatter_kv(&mut cache_g, &tables[1], bs, &rows).unwrap();
        let (after_k, after_v) = fp8_contents(&gpu, &cache_g, &spec, true);
        assert_same(&format!("{name} gather/scatter (K)"), &after_k, &before_k);
        assert_same(&format!("{name} gather/scatter (V)"), &after_v, &before_v);
        println!("{name} copies, compaction, gather/scatter: exact");
    }
}

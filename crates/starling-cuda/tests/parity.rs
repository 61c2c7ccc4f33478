//! GPU parity tests: every CUDA op against the CPU reference on fresh random inputs, outputs
//! poisoned before each run, error measured as ‖out − ref‖ / ‖ref‖ (device METHOD.md: bf16
//! operands land between 1e-3 and 1e-2). Inputs are rounded to bf16 before the CPU sees them, so
//! both sides compute on identical values.
//!
//! These need a GPU: they are `#[ignore]`d in CPU CI and run on the device through
//! `scripts/device/gpu_tests.sh` (`--include-ignored`).

use rand::{seq::SliceRandom, Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use starling_backend::cpu::CpuBackend;
use starling_backend::{
    AttentionDims, Backend, BackendCore, BatchMeta, HostTensor, KeyScoreKind, KvCacheOps,
    KvCacheSpec, KvRows, ModelOps, RopeSpec, RopeStyle, SeqBatchMeta,
};
use starling_cuda::CudaBackend;
use starling_kv::CacheDtype;

/// The device-side sampling op (one file, one job).
#[path = "parity/sampling.rs"]
mod sampling;

/// STAR-KV latent layers.
#[path = "parity/latent.rs"]
mod latent;

/// Per-head RMSNorm (Qwen3's q/k norm).
#[path = "parity/head_norm.rs"]
mod head_norm;

/// The fp8 (e4m3) dense cache: writes, attention, scores and row moves.
#[path = "parity/fp8.rs"]
mod fp8;

/// Eviction's selection on the device and compaction by scores.
#[path = "parity/select_keep.rs"]
mod select_keep;

/// fp8 (e4m3) STAR-KV latent caches: the write, attention, reconstruction and row moves.
#[path = "parity/fp8_latent.rs"]
mod fp8_latent;

/// The CPU reference's spec for a GPU cache of `spec`: f32 slots, or e4m3-rounded values in
/// them for an fp8 cache.
fn cpu_spec(spec: &KvCacheSpec) -> KvCacheSpec {
    match spec.layout.dtype() {
        CacheDtype::Fp8 => spec.clone(),
        _ => spec.with_dtype(CacheDtype::F32),
    }
}

/// bf16 operand tolerance on ‖out − ref‖ / ‖ref‖.
const BF16_REL_TOL: f64 = 1e-2;

fn gpu() -> CudaBackend {
    CudaBackend::new(0).expect("these tests need a CUDA GPU")
}

fn rand_host(rng: &mut ChaCha8Rng, shape: Vec<usize>, scale: f32) -> HostTensor {
    let n = shape.iter().product();
    let data = (0..n)
        .map(|_| half::bf16::from_f32(rng.gen_range(-scale..scale)).to_f32())
        .collect();
    HostTensor::new(shape, data).unwrap()
}

fn rel_err(out: &HostTensor, reference: &HostTensor) -> f64 {
    assert_eq!(out.shape(), reference.shape());
    assert!(
        out.data().iter().all(|v| v.is_finite()),
        "non-finite output"
    );
    let num: f64 = out
        .data()
        .iter()
        .zip(reference.data())
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let den: f64 = reference.data().iter().map(|b| (*b as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

fn check(name: &str, out: &HostTensor, reference: &HostTensor) {
    let e = rel_err(out, reference);
    println!("{name:<28} rel err {e:.2e}");
    assert!(e < BF16_REL_TOL, "{name}: relative error {e:.3e}");
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn elementwise_ops_match_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    // 100: not a multiple of 8 (the norms' scalar path); 16384: two 16-byte chunks per thread.
    for &(n, d) in &[
        (1usize, 576usize),
        (37, 1536),
        (300, 4096),
        (3, 100),
        (2, 16384),
    ] {
        let x = rand_host(&mut rng, vec![n, d], 2.0);
        let delta = rand_host(&mut rng, vec![n, d], 2.0);
        let w = rand_host(&mut rng, vec![d], 1.0);
        let (gx, gd, gw) = (
            gpu.upload(&x).unwrap(),
            gpu.upload(&delta).unwrap(),
            gpu.upload(&w).unwrap(),
        );
        check(
            "rms_norm",
            &gpu.to_host(&gpu.rms_norm(&gx, &gw, 1e-5).unwrap()).unwrap(),
            &cpu.rms_norm(&x, &w, 1e-5).unwrap(),
        );

        let (mut res_g, mut res_c) = (gpu.upload(&x).unwrap(), x.clone());
        let out_g = gpu.add_rms_norm(&mut res_g, &gd, &gw, 1e-5).unwrap();
        let out_c = cpu.add_rms_norm(&mut res_c, &delta, &w, 1e-5).unwrap();
        check("add_rms_norm (out)", &gpu.to_host(&out_g).unwrap(), &out_c);
        check(
            "add_rms_norm (residual)",
            &gpu.to_host(&res_g).unwrap(),
            &res_c,
        );

        let mut sum_g = gpu.upload(&x).unwrap();
        gpu.add_inplace(&mut sum_g, &gd).unwrap();
        let mut sum_c = x.clone();
        cpu.add_inplace(&mut sum_c, &delta).unwrap();
        check("add_inplace", &gpu.to_host(&sum_g).unwrap(), &sum_c);

        let gu = rand_host(&mut rng, vec![n, 2 * d], 3.0);
        check(
            "silu_mul",
            &gpu.to_host(&gpu.silu_mul(&gpu.upload(&gu).unwrap()).unwrap())
                .unwrap(),
            &cpu.silu_mul(&gu).unwrap(),
        );
        let gu_g = gpu.upload(&gu).unwrap();
        check(
            "gelu_tanh_mul",
            &gpu.to_host(&gpu.gelu_tanh_mul(&gu_g).unwrap()).unwrap(),
            &cpu.gelu_tanh_mul(&gu).unwrap(),
        );

        let (mut scaled_g, mut scaled_c) = (gpu.upload(&x).unwrap(), x.clone());
        gpu.scale_inplace(&mut scaled_g, 25.3).unwrap();
        cpu.scale_inplace(&mut scaled_c, 25.3).unwrap();
        check("scale_inplace", &gpu.to_host(&scaled_g).unwrap(), &scaled_c);

        let rows: Vec<u32> = (0..n as u32).rev().step_by(2).collect();
        check(
            "gather_rows",
            &gpu.to_host(&gpu.gather_rows(&gx, &rows).unwrap()).unwrap(),
            &cpu.gather_rows(&x, &rows).unwrap(),
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn linear_and_logits_match_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    // One or two rows with k % 8 == 0 take the matrix-vector kernels (gemv.cu; m = 1001 and 9
    // end in a partial block of rows; on an H200 one row takes two warps per column except at
    // m = 5000, see `gemv_ksplit`); k = 100 and more rows take cuBLAS.
    for &(n, k, m) in &[
        (1usize, 576usize, 1728usize),
        (1, 64, 1001),
        (1, 64, 5000),
        (2, 128, 9),
        (2, 1536, 256),
        (2, 8960, 1000),
        (3, 4096, 1000),
        (3, 100, 64),
        // cuBLAS, then the bias per element (1001 outputs: not whole 16-byte chunks).
        (4, 64, 1001),
        (17, 896, 1152),
        (256, 1536, 8960),
    ] {
        let x = rand_host(&mut rng, vec![n, k], 1.0);
        let w = rand_host(&mut rng, vec![m, k], 0.05);
        let b = rand_host(&mut rng, vec![m], 0.5);
        let (gx, gw, gb) = (
            gpu.upload(&x).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&b).unwrap(),
        );
        check(
            &format!("linear+bias {n}x{k}x{m}"),
            &gpu.to_host(&gpu.linear(&gx, &gw, Some(&gb)).unwrap())
                .unwrap(),
            &cpu.linear(&x, &w, Some(&b)).unwrap(),
        );
        check(
            "linear, no bias",
            &gpu.to_host(&gpu.linear(&gx, &gw, None).unwrap()).unwrap(),
            &cpu.linear(&x, &w, None).unwrap(),
        );
        check(
            "logits (f32 out)",
            &gpu.to_host(&gpu.logits(&gx, &gw).unwrap()).unwrap(),
            &cpu.logits(&x, &w).unwrap(),
        );
        check(
            "embedding",
            &gpu.to_host(&gpu.embedding(&gw, &[3, 0, 7, 3]).unwrap())
                .unwrap(),
            &cpu.embedding(&w, &[3, 0, 7, 3]).unwrap(),
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn linear_swiglu_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    // One or two rows with k % 8 == 0 take the fused matrix-vector kernel (gemv.cu); k = 100 and
    // more rows take cuBLAS and silu_mul.
    for &(n, k, f) in &[
        (1usize, 576usize, 1536usize),
        (2, 896, 4864),
        (1, 64, 3),
        (1, 64, 5000),
        (2, 100, 40),
        (5, 512, 256),
    ] {
        let x = rand_host(&mut rng, vec![n, k], 1.0);
        let w = rand_host(&mut rng, vec![2 * f, k], 0.1);
        let (gx, gw) = (gpu.upload(&x).unwrap(), gpu.upload(&w).unwrap());
        let out = gpu.to_host(&gpu.linear_swiglu(&gx, &gw).unwrap()).unwrap();
        assert_eq!(out.shape(), &[n, f]);
        check(
            &format!("linear_swiglu {n}x{k}x{f}"),
            &out,
            &cpu.linear_swiglu(&x, &w).unwrap(),
        );
    }
}

/// A random batch: sequences with prior context in shuffled blocks plus new tokens.
fn random_batch(
    rng: &mut ChaCha8Rng,
    seqs: &[(usize, usize)],
    bs: usize,
    num_blocks: usize,
) -> BatchMeta {
    let mut free: Vec<u32> = (0..num_blocks as u32).collect();
    for i in (1..free.len()).rev() {
        free.swap(i, rng.gen_range(0..=i));
    }
    batch_from_free_blocks(free, seqs, bs)
}

/// [`random_batch`] with blocks handed out in order (0, 1, 2, …): where a slot's position is its
/// index, every sequence's keys sit at consecutive positions across its blocks.
fn in_order_batch(seqs: &[(usize, usize)], bs: usize, num_blocks: usize) -> BatchMeta {
    batch_from_free_blocks((0..num_blocks as u32).rev().collect(), seqs, bs)
}

/// A batch of `seqs` (context, new tokens) whose blocks are popped from `free`.
fn batch_from_free_blocks(mut free: Vec<u32>, seqs: &[(usize, usize)], bs: usize) -> BatchMeta {
    let mut meta = BatchMeta {
        block_size_tokens: bs,
        ..Default::default()
    };
    for &(context, new) in seqs {
        let table: Vec<u32> = (0..context.div_ceil(bs))
            .map(|_| free.pop().unwrap())
            .collect();
        for t in context - new..context {
            meta.positions.push(t as u32 + 3);
            meta.slot_mapping
                .push(table[t / bs] * bs as u32 + (t % bs) as u32);
        }
        meta.seqs.push(SeqBatchMeta {
            query_start: meta.positions.len() - new,
            query_len: new,
            context_len_tokens: context,
            block_table: table,
        });
        meta.logits_rows.push((meta.positions.len() - 1) as u32);
    }
    meta
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn rope_write_kv_and_paged_attention_match_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let shapes = [
        (9usize, 3usize, 64usize, RopeStyle::Interleaved), // SmolLM2
        (12, 2, 128, RopeStyle::Neox),                     // Qwen2.5-1.5B
        (32, 32, 128, RopeStyle::Neox),                    // Llama-2-7B (MHA)
        (8, 1, 256, RopeStyle::Neox),                      // Gemma-like
    ];
    for (heads, kv_heads, hd, style) in shapes {
        let dims = AttentionDims {
            cache_group: 0,
            window_tokens: None,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let rope = RopeSpec {
            inv_freqs: (0..hd / 2)
                .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / hd as f32))
                .collect(),
            style,
        };
        let bs = 16;
        let num_blocks = 512;
        let spec = KvCacheSpec::full(num_blocks, bs, kv_heads, hd, CacheDtype::BF16);
        // Decode rows (1 new token, long and short contexts, incl. a split-K case) and prefill
        // chunks (several new tokens over earlier context).
        let seq_shapes: Vec<(usize, usize)> =
            vec![(1, 1), (700, 1), (3000, 1), (40, 40), (300, 77), (17, 5)];
        let meta = random_batch(&mut rng, &seq_shapes, bs, num_blocks);
        let n = meta.num_tokens();
        // Fill the whole context first (earlier tokens) with random K/V through write_kv.
        let mut cache_c = cpu
            .alloc_kv_cache(&spec.with_dtype(CacheDtype::F32))
            .unwrap();
        let mut cache_g = gpu.alloc_kv_cache(&spec).unwrap();
        let mut ctx_meta = BatchMeta {
            block_size_tokens: bs,
            ..Default::default()
        };
        for s in &meta.seqs {
            for t in 0..s.context_len_tokens - s.query_len {
                ctx_meta.positions.push(t as u32);
                ctx_meta
                    .slot_mapping
                    .push(s.block_table[t / bs] * bs as u32 + (t % bs) as u32);
            }
        }
        let m = ctx_meta.positions.len();
        ctx_meta.seqs.push(SeqBatchMeta {
            query_start: 0,
            query_len: m,
            context_len_tokens: m,
            block_table: (0..num_blocks as u32).collect(),
        });
        let ctx_qkv = rand_host(&mut rng, vec![m, dims.qkv_size()], 1.0);
        cpu.write_kv(
            &mut cache_c,
            &ctx_qkv,
            &dims,
            &cpu.prepare_batch(&ctx_meta, num_blocks).unwrap(),
        )
        .unwrap();
        gpu.write_kv(
            &mut cache_g,
            &gpu.upload(&ctx_qkv).unwrap(),
            &dims,
            &gpu.prepare_batch(&ctx_meta, num_blocks).unwrap(),
        )
        .unwrap();

        let qkv = rand_host(&mut rng, vec![n, dims.qkv_size()], 1.0);
        let (bc, bg) = (
            cpu.prepare_batch(&meta, num_blocks).unwrap(),
            gpu.prepare_batch(&meta, num_blocks).unwrap(),
        );
        let mut qkv_c = qkv.clone();
        let mut qkv_g = gpu.upload(&qkv).unwrap();
        cpu.rope_qk(&mut qkv_c, &dims, &rope, &bc).unwrap();
        gpu.rope_qk(&mut qkv_g, &dims, &rope, &bg).unwrap();
        let label = format!("rope h{heads}/{kv_heads} d{hd}");
        check(&label, &gpu.to_host(&qkv_g).unwrap(), &qkv_c);
        // The fused launch leaves qkv and the cache exactly as rope_qk, then write_kv, do.
        let mut fused_qkv = gpu.upload(&qkv).unwrap();
        let mut fused_cache = gpu.alloc_kv_cache(&spec).unwrap();
        gpu.rope_qk_write_kv(&mut fused_qkv, &mut fused_cache, &dims, &rope, &bg)
            .unwrap();
        let mut two_calls_cache = gpu.alloc_kv_cache(&spec).unwrap();
        gpu.write_kv(&mut two_calls_cache, &qkv_g, &dims, &bg)
            .unwrap();
        assert_same(
            &format!("fused {label}: qkv"),
            &gpu.to_host(&fused_qkv).unwrap(),
            &gpu.to_host(&qkv_g).unwrap(),
        );
        let (fused_k, fused_v) = whole_cache(&gpu, &fused_cache, &spec);
        let (two_k, two_v) = whole_cache(&gpu, &two_calls_cache, &spec);
        assert_same(&format!("fused {label}: keys"), &fused_k, &two_k);
        assert_same(&format!("fused {label}: values"), &fused_v, &two_v);
        // Continue from identical (bf16-rounded) inputs so attention is judged on its own.
        let qkv_c = HostTensor::new(
            qkv_c.shape().to_vec(),
            qkv_c
                .data()
                .iter()
                .map(|v| half::bf16::from_f32(*v).to_f32())
                .collect(),
        )
        .unwrap();
        let qkv_g = gpu.upload(&qkv_c).unwrap();
        cpu.write_kv(&mut cache_c, &qkv_c, &dims, &bc).unwrap();
        gpu.write_kv(&mut cache_g, &qkv_g, &dims, &bg).unwrap();
        let out_c = cpu.paged_attention(&qkv_c, &cache_c, &dims, &bc).unwrap();
        let out_g = gpu
            .to_host(&gpu.paged_attention(&qkv_g, &cache_g, &dims, &bg).unwrap())
            .unwrap();
        check(
            &format!("attention h{heads}/{kv_heads} d{hd}"),
            &out_g,
            &out_c,
        );
        // Per-row check too, so one wrong row cannot hide in the global norm.
        let w = dims.q_size();
        for r in 0..n {
            let row = |t: &HostTensor| {
                HostTensor::new(vec![1, w], t.data()[r * w..(r + 1) * w].to_vec()).unwrap()
            };
            let e = rel_err(&row(&out_g), &row(&out_c));
            assert!(e < 2.0 * BF16_REL_TOL, "attention row {r}: {e:.3e}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn synthetic_weights_have_the_requested_scale() {
    let gpu = gpu();
    let t = gpu.random_bf16(vec![1024, 1024], 7, 0.02, 0.0).unwrap();
    let h = gpu.to_host(&t).unwrap();
    let n = h.numel() as f64;
    let mean = h.data().iter().map(|&v| v as f64).sum::<f64>() / n;
    let std = (h
        .data()
        .iter()
        .map(|&v| (v as f64 - mean).powi(2))
        .sum::<f64>()
        / n)
        .sqrt();
    println!("synthetic mean {mean:.2e} std {std:.4}");
    assert!(mean.abs() < 1e-3 && (std - 0.02).abs() < 1e-3);
}

// ---- KV-cache management: block copies, gather/scatter, key read-back, compaction, key scores.
// Caches on both sides hold identical bf16-exact values, so every op that only moves data must
// agree bit for bit; key scores are f32 arithmetic in another summation order.

/// f32 arithmetic on identical inputs: ‖out − ref‖ / ‖ref‖ (device METHOD.md: far under 1e-3).
const F32_REL_TOL: f64 = 1e-5;
/// Per-score bound for KeyDiff cosines (in [−1, 1]); the mean direction sums thousands of unit
/// keys in another order on the GPU.
const KEYDIFF_ABS_TOL: f32 = 1e-4;

/// (KV heads, head_dim): GQA-sized (2 × 64, 8 × 128), MHA-sized (32 × 128), and a width that is
/// not a multiple of 8 (the kernels' element-wise fallback).
const KV_SHAPES: [(usize, usize); 4] = [(2, 64), (8, 128), (32, 128), (3, 36)];

/// A cache geometry; the odd head width also gets an odd block size, so whole blocks are not a
/// multiple of 8 elements either (the block copy's element-wise fallback).
fn kv_spec(num_kv_heads: usize, head_dim: usize, num_blocks: usize) -> KvCacheSpec {
    let block_size_tokens = if head_dim.is_multiple_of(8) { 16 } else { 15 };
    KvCacheSpec::full(
        num_blocks,
        block_size_tokens,
        num_kv_heads,
        head_dim,
        CacheDtype::BF16,
    )
}

/// A CPU and a GPU cache holding the same random bf16-exact K and V in every slot. Keys get a
/// per-channel offset (real keys share a strong mean direction, which KeyDiff measures against)
/// and every 97th slot holds a zero key (no direction: KeyDiff's special case).
fn filled_caches(
    gpu: &CudaBackend,
    cpu: &CpuBackend,
    spec: &KvCacheSpec,
    rng: &mut ChaCha8Rng,
) -> (
    <CpuBackend as BackendCore>::KvCache,
    <CudaBackend as BackendCore>::KvCache,
) {
    let (heads, head_dim) = spec.full_heads().expect("a full layout");
    let dims = AttentionDims {
        cache_group: 0,
        window_tokens: None,
        num_heads: heads,
        num_kv_heads: heads,
        head_dim,
        scale: 1.0,
    };
    let (n, kv, width) = (spec.num_slots(), dims.kv_size(), dims.qkv_size());
    let offset: Vec<f32> = (0..kv).map(|_| rng.gen_range(-0.5..0.5)).collect();
    let bf = |x: f32| half::bf16::from_f32(x).to_f32();
    let mut data = vec![0.0f32; n * width];
    for (s, row) in data.chunks_exact_mut(width).enumerate() {
        for i in 0..kv {
            row[i] = rng.gen_range(-1.0..1.0);
            row[kv + i] = if s % 97 == 5 {
                0.0
            } else {
                bf(rng.gen_range(-1.0..1.0) + offset[i])
            };
            row[2 * kv + i] = bf(rng.gen_range(-1.0..1.0));
        }
    }
    let qkv = HostTensor::new(vec![n, width], data).unwrap();
    let meta = BatchMeta::single_sequence(
        0,
        n,
        (0..n as u32).collect(),
        (0..spec.num_blocks as u32).collect(),
        spec.block_size_tokens,
        Vec::new(),
    );
    let mut cache_c = cpu.alloc_kv_cache(&cpu_spec(spec)).unwrap();
    let mut cache_g = gpu.alloc_kv_cache(spec).unwrap();
    let batch_c = cpu.prepare_batch(&meta, spec.num_blocks).unwrap();
    let batch_g = gpu.prepare_batch(&meta, spec.num_blocks).unwrap();
    cpu.write_kv(&mut cache_c, &qkv, &dims, &batch_c).unwrap();
    gpu.write_kv(&mut cache_g, &gpu.upload(&qkv).unwrap(), &dims, &batch_g)
        .unwrap();
    (cache_c, cache_g)
}

/// Every slot's K and V (`[num_slots, kv_size]` each) on the host, read through `gather_kv`
/// (itself checked against the CPU in `gather_scatter_and_read_keys_match_cpu`).
fn whole_cache<B: Backend>(
    backend: &B,
    cache: &B::KvCache,
    spec: &KvCacheSpec,
) -> (HostTensor, HostTensor) {
    let all: Vec<u32> = (0..spec.num_blocks as u32).collect();
    let rows = backend
        .gather_kv(cache, &all, spec.block_size_tokens, spec.num_slots())
        .unwrap();
    (
        backend.to_host(&rows.keys).unwrap(),
        backend.to_host(&rows.values).unwrap(),
    )
}

/// The rows of a full layer (no positions).
fn kv_rows<T>(keys: T, values: T) -> KvRows<T> {
    KvRows {
        keys,
        values,
        positions: Vec::new(),
    }
}

/// Bit-for-bit equality, naming the first differing element.
fn assert_same(name: &str, got: &HostTensor, want: &HostTensor) {
    assert_eq!(got.shape(), want.shape(), "{name}: shapes");
    if let Some(i) = got
        .data()
        .iter()
        .zip(want.data())
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        panic!(
            "{name}: element {i} is {} on the GPU, {} on the CPU",
            got.data()[i],
            want.data()[i]
        );
    }
}

/// Both whole caches equal, bit for bit.
fn assert_caches_equal(
    name: &str,
    gpu: &CudaBackend,
    cache_g: &<CudaBackend as BackendCore>::KvCache,
    cpu: &CpuBackend,
    cache_c: &<CpuBackend as BackendCore>::KvCache,
    spec: &KvCacheSpec,
) {
    let (kg, vg) = whole_cache(gpu, cache_g, spec);
    let (kc, vc) = whole_cache(cpu, cache_c, spec);
    assert_same(&format!("{name} (K)"), &kg, &kc);
    assert_same(&format!("{name} (V)"), &vg, &vc);
}

/// Block tables for sequences of `lens` tokens, drawn from a shuffled pool (so neighbouring
/// physical tokens live in unrelated blocks); returns the tables and the unused blocks.
fn block_tables(
    rng: &mut ChaCha8Rng,
    spec: &KvCacheSpec,
    lens: &[usize],
) -> (Vec<Vec<u32>>, Vec<u32>) {
    let mut free: Vec<u32> = (0..spec.num_blocks as u32).collect();
    free.shuffle(rng);
    let tables = lens
        .iter()
        .map(|&len| {
            (0..len.div_ceil(spec.block_size_tokens))
                .map(|_| free.pop().expect("enough blocks for the test's sequences"))
                .collect()
        })
        .collect();
    (tables, free)
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn kv_block_copies_match_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for (nkv, hd) in KV_SHAPES {
        let spec = kv_spec(nkv, hd, 64);
        let (mut cache_c, mut cache_g) = filled_caches(&gpu, &cpu, &spec, &mut rng);
        // Sources and destinations from disjoint halves of a shuffled pool; some sources are
        // copied to several destinations (forking one sequence into many).
        let mut blocks: Vec<u32> = (0..spec.num_blocks as u32).collect();
        blocks.shuffle(&mut rng);
        let (srcs, dsts) = blocks.split_at(spec.num_blocks / 2);
        let pairs: Vec<(u32, u32)> = dsts[..20]
            .iter()
            .map(|&d| (srcs[rng.gen_range(0..8)], d))
            .collect();
        cpu.copy_kv_blocks(&mut cache_c, &pairs).unwrap();
        gpu.copy_kv_blocks(&mut cache_g, &pairs).unwrap();
        let name = format!("copy_kv_blocks {nkv}x{hd}");
        assert_caches_equal(&name, &gpu, &cache_g, &cpu, &cache_c, &spec);
        println!("{name:<28} exact");

        // Dependent copies are refused and copy nothing.
        let (before_k, before_v) = whole_cache(&gpu, &cache_g, &spec);
        let chained = [(srcs[0], dsts[0]), (dsts[0], dsts[1])];
        let twice = [(srcs[0], dsts[0]), (srcs[1], dsts[0])];
        let outside = [(srcs[0], spec.num_blocks as u32)];
        for bad in [&chained[..], &twice[..], &outside[..]] {
            assert!(gpu.copy_kv_blocks(&mut cache_g, bad).is_err(), "{bad:?}");
        }
        let (after_k, after_v) = whole_cache(&gpu, &cache_g, &spec);
        assert_same("refused copies (K)", &after_k, &before_k);
        assert_same("refused copies (V)", &after_v, &before_v);
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn gather_scatter_and_read_keys_match_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let lens = [1usize, 16, 77, 300, 513];
    for (nkv, hd) in KV_SHAPES {
        let spec = kv_spec(nkv, hd, 96);
        let (mut cache_c, mut cache_g) = filled_caches(&gpu, &cpu, &spec, &mut rng);
        let (tables, _) = block_tables(&mut rng, &spec, &lens);
        let bs = spec.block_size_tokens;
        for (table, &len) in tables.iter().zip(&lens) {
            let name = format!("gather_kv {nkv}x{hd} len {len}");
            let g = gpu.gather_kv(&cache_g, table, bs, len).unwrap();
            let c = cpu.gather_kv(&cache_c, table, bs, len).unwrap();
            assert_same(&name, &gpu.to_host(&g.keys).unwrap(), &c.keys);
            assert_same(&name, &gpu.to_host(&g.values).unwrap(), &c.values);
            let keys_g = gpu.read_keys(&cache_g, table, bs, len).unwrap();
            let keys_c = cpu.read_keys(&cache_c, table, bs, len).unwrap();
            assert_same(&format!("read_keys {nkv}x{hd} len {len}"), &keys_g, &keys_c);
        }
        // Scatter fresh rows into each sequence in turn (the cache's old contents act as the
        // poison: the whole-cache comparison sees any slot left unwritten or written twice).
        for (table, &len) in tables.iter().zip(&lens) {
            let width = nkv * hd;
            let k = rand_host(&mut rng, vec![len, width], 1.0);
            let v = rand_host(&mut rng, vec![len, width], 1.0);
            let (kd, vd) = (gpu.upload(&k).unwrap(), gpu.upload(&v).unwrap());
            cpu.scatter_kv(&mut cache_c, table, bs, &kv_rows(k, v))
                .unwrap();
            gpu.scatter_kv(&mut cache_g, table, bs, &kv_rows(kd, vd))
                .unwrap();
            let name = format!("scatter_kv {nkv}x{hd} len {len}");
            assert_caches_equal(&name, &gpu, &cache_g, &cpu, &cache_c, &spec);
        }
        println!("gather/scatter/read_keys {nkv}x{hd}: exact");

        // A table listing a block twice (scatter would write it twice at once) and rows that do
        // not fit the table are refused and write nothing.
        let (before_k, before_v) = whole_cache(&gpu, &cache_g, &spec);
        let k = rand_host(&mut rng, vec![20, nkv * hd], 1.0);
        let rows = kv_rows(gpu.upload(&k).unwrap(), gpu.upload(&k).unwrap());
        let twice = [tables[3][0], tables[3][0]];
        assert!(gpu.scatter_kv(&mut cache_g, &twice, bs, &rows).is_err());
        assert!(gpu
            .scatter_kv(&mut cache_g, &tables[3][..1], bs, &rows)
            .is_err());
        let (after_k, after_v) = whole_cache(&gpu, &cache_g, &spec);
        assert_same("refused scatter (K)", &after_k, &before_k);
        assert_same("refused scatter (V)", &after_v, &before_v);
    }
}

/// `count` random, strictly ascending indices below `len`.
fn random_subset(rng: &mut ChaCha8Rng, len: usize, count: usize) -> Vec<u32> {
    let mut all: Vec<u32> = (0..len as u32).collect();
    all.shuffle(rng);
    let mut kept = all[..count].to_vec();
    kept.sort_unstable();
    kept
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn compaction_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let lens = [300usize, 77, 500];
    for (nkv, hd) in KV_SHAPES {
        let spec = kv_spec(nkv, hd, 96);
        let (mut cache_c, mut cache_g) = filled_caches(&gpu, &cpu, &spec, &mut rng);
        let (tables, _) = block_tables(&mut rng, &spec, &lens);
        let same_for_all = |kept: Vec<u32>| vec![kept; nkv];
        // (label, sequence, kept indices per head). Applied one after another to the same
        // caches; each compacts one sequence while the others must stay as they are.
        let cases: Vec<(&str, usize, Vec<Vec<u32>>)> = vec![
            (
                "random half, per-head sets",
                0,
                (0..nkv)
                    .map(|_| random_subset(&mut rng, 300, 150))
                    .collect(),
            ),
            ("keep all (identity)", 2, same_for_all((0..500).collect())),
            (
                "protected only (sink 4 + recent 16)",
                2,
                same_for_all((0..4).chain(484..500).collect()),
            ),
            (
                "dense suffix (sources overlap destinations)",
                0,
                same_for_all((75..300).collect()),
            ),
            (
                "all but one, per-head sets",
                1,
                (0..nkv).map(|_| random_subset(&mut rng, 77, 76)).collect(),
            ),
            ("keep nothing", 1, same_for_all(Vec::new())),
        ];
        for (label, seq, keep) in cases {
            let (table, len) = (&tables[seq], lens[seq]);
            cpu.compact_kv(&mut cache_c, table, spec.block_size_tokens, len, &keep)
                .unwrap();
            gpu.compact_kv(&mut cache_g, table, spec.block_size_tokens, len, &keep)
                .unwrap();
            let name = format!("compact_kv {nkv}x{hd} {label}");
            assert_caches_equal(&name, &gpu, &cache_g, &cpu, &cache_c, &spec);
            println!("{name:<60} exact");
        }

        // Invalid kept lists and tables are refused (checked on the host, as on the CPU) and
        // move nothing.
        let (before_k, before_v) = whole_cache(&gpu, &cache_g, &spec);
        let bs = spec.block_size_tokens;
        let ok = same_for_all(vec![0, 5, 9]);
        let mut unsorted = ok.clone();
        unsorted[0] = vec![5, 0, 9];
        let mut unequal = ok.clone();
        unequal[nkv - 1] = vec![0, 5];
        let too_far = same_for_all(vec![0, 5, 300]);
        let (table, len) = (&tables[0], lens[0]);
        let twice: Vec<u32> = table.iter().map(|_| table[0]).collect();
        assert!(gpu
            .compact_kv(&mut cache_g, table, bs, len, &unsorted)
            .is_err());
        assert!(gpu
            .compact_kv(&mut cache_g, table, bs, len, &unequal)
            .is_err());
        assert!(gpu
            .compact_kv(&mut cache_g, table, bs, len, &too_far)
            .is_err());
        assert!(gpu
            .compact_kv(&mut cache_g, table, bs, len, &ok[..nkv - 1])
            .is_err());
        assert!(gpu.compact_kv(&mut cache_g, &twice, bs, len, &ok).is_err());
        assert!(gpu
            .compact_kv(&mut cache_g, table, bs, len + bs, &ok)
            .is_err());
        let (after_k, after_v) = whole_cache(&gpu, &cache_g, &spec);
        assert_same("refused compaction (K)", &after_k, &before_k);
        assert_same("refused compaction (V)", &after_v, &before_v);
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn key_scores_match_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    let lens = [1usize, 7, 130, 1000, 3000];
    for (nkv, hd) in KV_SHAPES {
        let spec = kv_spec(nkv, hd, 300);
        let (cache_c, cache_g) = filled_caches(&gpu, &cpu, &spec, &mut rng);
        let (tables, _) = block_tables(&mut rng, &spec, &lens);
        let bs = spec.block_size_tokens;
        for (table, &len) in tables.iter().zip(&lens) {
            for kind in [KeyScoreKind::KNorm, KeyScoreKind::KeyDiff] {
                let got = gpu
                    .to_host(&gpu.key_scores(&cache_g, table, bs, len, kind).unwrap())
                    .unwrap();
                let want = cpu.key_scores(&cache_c, table, bs, len, kind).unwrap();
                let e = rel_err(&got, &want);
                let worst = got
                    .data()
                    .iter()
                    .zip(want.data())
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                println!("key_scores {kind:?} {nkv}x{hd} len {len:<5} rel err {e:.2e}, max abs {worst:.1e}");
                assert_eq!(got.shape(), &[nkv, len]);
                let tol = match kind {
                    KeyScoreKind::KNorm => F32_REL_TOL,
                    KeyScoreKind::KeyDiff => 10.0 * F32_REL_TOL,
                };
                assert!(e < tol, "{kind:?} {nkv}x{hd} len {len}: rel err {e:.3e}");
                if kind == KeyScoreKind::KeyDiff {
                    assert!(worst < KEYDIFF_ABS_TOL, "{nkv}x{hd} len {len}: {worst:.3e}");
                }
            }
        }
        let empty = gpu
            .key_scores(&cache_g, &tables[0], bs, 0, KeyScoreKind::KeyDiff)
            .unwrap();
        assert_eq!(empty.shape(), &[nkv, 0]);
        assert!(gpu
            .key_scores(&cache_g, &tables[0], bs, bs + 1, KeyScoreKind::KNorm)
            .is_err());
    }
}

/// Tolerance of the window scores, relative to the reference's norm (and, per element, to its
/// largest score).
const WINDOW_SCORE_REL_TOL: f64 = 1e-3;

/// Observation-window scores (SnapKV, TOVA) against the CPU reference, up to 30k tokens: random
/// bf16-exact keys through shuffled block tables, random bf16-exact queries wide enough that the
/// softmax is peaked, the device's scratch poisoned with NaN first. Window tokens must be +∞ on
/// both sides; the others finite and equal within f32 summation-order error.
#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn window_scores_match_cpu() {
    use starling_backend::WindowScoreSpec;
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(15);
    // (KV heads, group, head_dim, tokens, window, pool): Qwen2.5-1.5B's geometry at 30k (SnapKV)
    // and 28k (TOVA: one query, no pooling), Llama-3-like and MHA groups, an odd head width, the
    // widest head, a window covering the whole sequence, and sequences shorter than one tile.
    let cases: [(usize, usize, usize, usize, usize, usize); 8] = [
        (2, 6, 128, 30_000, 32, 7),
        (2, 6, 128, 28_000, 1, 1),
        (8, 4, 128, 3000, 32, 7),
        (4, 1, 64, 1000, 16, 5),
        (3, 3, 36, 777, 5, 3),
        (1, 8, 256, 500, 64, 7),
        (2, 2, 64, 40, 40, 7),
        (2, 7, 128, 31, 3, 1),
    ];
    for (nkv, group, hd, len, window, pool) in cases {
        let spec = kv_spec(nkv, hd, len.div_ceil(15) + 8);
        let (cache_c, cache_g) = filled_caches(&gpu, &cpu, &spec, &mut rng);
        let (tables, _) = block_tables(&mut rng, &spec, &[len]);
        let table = &tables[0];
        let queries = rand_host(&mut rng, vec![window, nkv * group * hd], 4.0);
        let score = WindowScoreSpec {
            group,
            scale: 1.0 / (hd as f32).sqrt(),
            pool_kernel_tokens: pool,
        };
        let bs = spec.block_size_tokens;
        // The partials, mass and score buffers come from the pool; NaN in them shows any
        // element a kernel fails to write.
        for _ in 0..3 {
            poison_pool(&gpu, 2 * nkv * len);
        }
        let got = gpu
            .to_host(
                &gpu.window_scores(&cache_g, table, bs, len, &queries, &score)
                    .unwrap(),
            )
            .unwrap();
        let want = cpu
            .window_scores(&cache_c, table, bs, len, &queries, &score)
            .unwrap();
        assert_eq!(got.shape(), &[nkv, len]);
        let prefix = len - window;
        let (mut num, mut den, mut worst, mut top) = (0.0f64, 0.0f64, 0.0f32, 0.0f32);
        for (h, (g_row, w_row)) in got
            .data()
            .chunks_exact(len)
            .zip(want.data().chunks_exact(len))
            .enumerate()
        {
            for (i, (&g, &w)) in g_row.iter().zip(w_row).enumerate() {
                if i >= prefix {
                    assert!(
                        g == f32::INFINITY && w == f32::INFINITY,
                        "head {h} token {i}: {g} {w}"
                    );
                    continue;
                }
                assert!(g.is_finite(), "head {h} token {i}: {g} on the GPU");
                num += ((g - w) as f64).powi(2);
                den += (w as f64).powi(2);
                worst = worst.max((g - w).abs());
                top = top.max(w.abs());
            }
        }
        let e = (num / den.max(1e-30)).sqrt();
        println!(
            "window_scores {nkv}x{hd} group {group} len {len:<6} window {window:<3} pool {pool}: rel err {e:.2e}, max abs {worst:.1e} of {top:.2e}"
        );
        // The CPU sums up to 30k softmax terms in sequence (error up to ~n·ε in the worst case),
        // the GPU in tiles: 1e-3 is far above either's rounding and far below any indexing bug.
        assert!(e < WINDOW_SCORE_REL_TOL, "rel err {e:.3e}");
        assert!(
            f64::from(worst) <= WINDOW_SCORE_REL_TOL * f64::from(top.max(1e-6)),
            "max abs {worst:.3e} of {top:.3e}"
        );
    }
    // Refused input leaves nothing half-done: a window longer than the sequence, a row width
    // that is not the cache's heads x group x head_dim.
    let spec = kv_spec(2, 64, 8);
    let (_, cache_g) = filled_caches(&gpu, &cpu, &spec, &mut rng);
    let table: Vec<u32> = (0..4).collect();
    let score = WindowScoreSpec {
        group: 2,
        scale: 0.125,
        pool_kernel_tokens: 7,
    };
    let long = rand_host(&mut rng, vec![65, 256], 1.0);
    assert!(gpu
        .window_scores(&cache_g, &table, 16, 64, &long, &score)
        .is_err());
    let narrow = rand_host(&mut rng, vec![4, 128], 1.0);
    assert!(gpu
        .window_scores(&cache_g, &table, 16, 64, &narrow, &score)
        .is_err());
}

/// Zero-row inputs (a non-final prefill chunk has no logits rows) are no-ops with the right
/// shape. Row kernels used to launch one block anyway and write a whole row into a one-element
/// placeholder, corrupting neighbouring device memory; with zero-row launches now invalid, a
/// missing guard makes this test fail instead.
#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn zero_row_ops_are_no_ops() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let d = 256;
    let x = g.upload(&rand_host(&mut rng, vec![4, d], 1.0)).unwrap();
    let w = g.upload(&rand_host(&mut rng, vec![d], 1.0)).unwrap();
    let none = g.gather_rows(&x, &[]).unwrap();
    let normed = g.rms_norm(&none, &w, 1e-5).unwrap();
    assert_eq!(g.to_host(&normed).unwrap().shape(), &[0, d]);
    let mut residual = g.gather_rows(&x, &[]).unwrap();
    let delta = g.gather_rows(&x, &[]).unwrap();
    let out = g.add_rms_norm(&mut residual, &delta, &w, 1e-5).unwrap();
    assert_eq!(g.to_host(&out).unwrap().shape(), &[0, d]);
    // The source rows are untouched by all of that.
    let back = g.to_host(&x).unwrap();
    let again = g
        .to_host(&g.gather_rows(&x, &[0, 1, 2, 3]).unwrap())
        .unwrap();
    assert_eq!(back.data(), again.data());
}

// ---- Tiled prefill attention: runs of ≥ 2 new tokens of a sequence go to the tensor-core kernel
// (prefill_attention.cu), single tokens to the per-token kernel, in one batch.

/// One sequence of a prefill parity batch: `earlier` context tokens written before the step,
/// optionally compacted down to `kept` physical tokens (token eviction: the visible counts are
/// then physical lengths, smaller than the positions), then `new` tokens this step.
#[derive(Clone, Copy, Debug)]
struct PrefillSeq {
    earlier: usize,
    kept: Option<usize>,
    new: usize,
}

const fn seq(earlier: usize, new: usize) -> PrefillSeq {
    PrefillSeq {
        earlier,
        kept: None,
        new,
    }
}

/// A fused QKV tensor of bf16-exact values; query columns are `q_scale` times wider than K and V,
/// so the softmax is peaked rather than nearly uniform (its max tracking is exercised).
fn rand_qkv(rng: &mut ChaCha8Rng, n: usize, dims: &AttentionDims, q_scale: f32) -> HostTensor {
    let (q, width) = (dims.q_size(), dims.qkv_size());
    let data = (0..n * width)
        .map(|i| {
            let s = if i % width < q { q_scale } else { 1.0 };
            half::bf16::from_f32(rng.gen_range(-s..s)).to_f32()
        })
        .collect();
    HostTensor::new(vec![n, width], data).unwrap()
}

/// Fills `elems` bf16 of fresh device memory with NaN and frees it: the stream-ordered pool hands
/// the block back to the next allocation of that size (the attention output), so a row the
/// kernels fail to write reads NaN (caught by `rel_err`) rather than an innocent zero. Stale
/// values from elsewhere would fail the per-row comparison anyway.
fn poison_pool(gpu: &CudaBackend, elems: usize) {
    let t = gpu.random_bf16(vec![elems], 1, 1.0, f32::NAN).unwrap();
    gpu.synchronize().unwrap();
    drop(t);
}

/// Writes each sequence's earlier context on both backends, compacts where asked (the same kept
/// sets on both), attends the new tokens and compares every row with the CPU reference.
fn check_prefill_batch(
    gpu: &CudaBackend,
    cpu: &CpuBackend,
    dims: &AttentionDims,
    seqs: &[PrefillSeq],
    rng: &mut ChaCha8Rng,
    label: &str,
) {
    check_prefill_batch_in(gpu, cpu, dims, seqs, rng, label, CacheDtype::BF16);
}

/// [`check_prefill_batch`] over a GPU cache of `dtype` (bf16 or fp8; the CPU reference holds
/// the same values).
fn check_prefill_batch_in(
    gpu: &CudaBackend,
    cpu: &CpuBackend,
    dims: &AttentionDims,
    seqs: &[PrefillSeq],
    rng: &mut ChaCha8Rng,
    label: &str,
    dtype: CacheDtype,
) {
    let bs = 16;
    let span = |s: &PrefillSeq| s.earlier.max(s.kept.unwrap_or(s.earlier) + s.new);
    let num_blocks = seqs.iter().map(|s| span(s).div_ceil(bs)).sum::<usize>() + 3;
    let spec = KvCacheSpec::full(num_blocks, bs, dims.num_kv_heads, dims.head_dim, dtype);
    let mut free: Vec<u32> = (0..num_blocks as u32).collect();
    free.shuffle(rng);
    let tables: Vec<Vec<u32>> = seqs
        .iter()
        .map(|s| {
            (0..span(s).div_ceil(bs))
                .map(|_| free.pop().unwrap())
                .collect()
        })
        .collect();
    let slot = |table: &[u32], t: usize| table[t / bs] * bs as u32 + (t % bs) as u32;

    // Earlier context, through write_kv on both sides (identical bf16 values).
    let mut cache_c = cpu.alloc_kv_cache(&cpu_spec(&spec)).unwrap();
    let mut cache_g = gpu.alloc_kv_cache(&spec).unwrap();
    let mut ctx = BatchMeta {
        block_size_tokens: bs,
        ..Default::default()
    };
    for (s, table) in seqs.iter().zip(&tables) {
        for t in 0..s.earlier {
            ctx.positions.push(t as u32);
            ctx.slot_mapping.push(slot(table, t));
        }
    }
    let m = ctx.positions.len();
    if m > 0 {
        ctx.seqs.push(SeqBatchMeta {
            query_start: 0,
            query_len: m,
            context_len_tokens: m,
            block_table: (0..num_blocks as u32).collect(),
        });
        let ctx_qkv = rand_qkv(rng, m, dims, 1.0);
        let (bc, bg) = (
            cpu.prepare_batch(&ctx, num_blocks).unwrap(),
            gpu.prepare_batch(&ctx, num_blocks).unwrap(),
        );
        cpu.write_kv(&mut cache_c, &ctx_qkv, dims, &bc).unwrap();
        gpu.write_kv(&mut cache_g, &gpu.upload(&ctx_qkv).unwrap(), dims, &bg)
            .unwrap();
    }
    for (s, table) in seqs.iter().zip(&tables) {
        if let Some(kept) = s.kept {
            let keep: Vec<Vec<u32>> = (0..dims.num_kv_heads)
                .map(|_| random_subset(rng, s.earlier, kept))
                .collect();
            cpu.compact_kv(&mut cache_c, table, bs, s.earlier, &keep)
                .unwrap();
            gpu.compact_kv(&mut cache_g, table, bs, s.earlier, &keep)
                .unwrap();
        }
    }

    // The step: new tokens at logical positions after `earlier`, physical slots after `kept`.
    let mut meta = BatchMeta {
        block_size_tokens: bs,
        ..Default::default()
    };
    for (s, table) in seqs.iter().zip(&tables) {
        let physical = s.kept.unwrap_or(s.earlier);
        let start = meta.positions.len();
        for i in 0..s.new {
            meta.positions.push((s.earlier + i) as u32);
            meta.slot_mapping.push(slot(table, physical + i));
        }
        meta.seqs.push(SeqBatchMeta {
            query_start: start,
            query_len: s.new,
            context_len_tokens: physical + s.new,
            block_table: table.clone(),
        });
        meta.logits_rows.push((meta.positions.len() - 1) as u32);
    }
    let n = meta.num_tokens();
    let qkv = rand_qkv(rng, n, dims, 3.0);
    let qkv_g = gpu.upload(&qkv).unwrap();
    let (bc, bg) = (
        cpu.prepare_batch(&meta, num_blocks).unwrap(),
        gpu.prepare_batch(&meta, num_blocks).unwrap(),
    );
    cpu.write_kv(&mut cache_c, &qkv, dims, &bc).unwrap();
    gpu.write_kv(&mut cache_g, &qkv_g, dims, &bg).unwrap();
    let out_c = cpu.paged_attention(&qkv, &cache_c, dims, &bc).unwrap();
    poison_pool(gpu, n * dims.q_size());
    let out_g = gpu
        .to_host(&gpu.paged_attention(&qkv_g, &cache_g, dims, &bg).unwrap())
        .unwrap();
    check(label, &out_g, &out_c);
    // Per row, naming the sequence, so one wrong tile or split cannot hide in the global norm.
    let w = dims.q_size();
    for (s, sm) in seqs.iter().zip(&meta.seqs) {
        for r in sm.query_start..sm.query_start + sm.query_len {
            let row = |t: &HostTensor| {
                HostTensor::new(vec![1, w], t.data()[r * w..(r + 1) * w].to_vec()).unwrap()
            };
            let e = rel_err(&row(&out_g), &row(&out_c));
            assert!(
                e < 2.0 * BF16_REL_TOL,
                "{label}: row {r} ({s:?}, token {}): {e:.3e}",
                r - sm.query_start
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn prefill_attention_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    // (query heads, KV heads, head_dim): groups 3, 6, 4, 1 (d128 and d64) and 8.
    let shapes = [
        (9usize, 3usize, 64usize), // SmolLM2
        (12, 2, 128),              // Qwen2.5-1.5B
        (32, 8, 128),              // Llama-3-8B
        (32, 32, 128),             // Llama-2-7B (MHA)
        (8, 8, 64),
        (16, 2, 64),
    ];
    // Mixed decode + prefill with contexts up to 1130 tokens: on an H200 the split planner cuts
    // these into several context splits (partials + combine), and chunks of 5, 64 and 130 tokens
    // leave partial tiles (128 rows: 128 / group tokens) for every group; 130 tokens also fill
    // whole tiles (group 1: 128 tokens, groups 4 and 8: 32 and 16). Two compacted sequences
    // (eviction kept 200 of 600 and 100 of 300 tokens) attend over physical lengths below their
    // positions.
    let mixed = [
        seq(0, 5),
        seq(1000, 1),
        seq(17, 130),
        seq(300, 64),
        seq(0, 1),
        seq(1000, 130),
        seq(300, 5),
        seq(1, 64),
        seq(17, 1),
        PrefillSeq {
            earlier: 600,
            kept: Some(200),
            new: 64,
        },
        seq(1, 1),
        PrefillSeq {
            earlier: 300,
            kept: Some(100),
            new: 1,
        },
        seq(1, 2),
    ];
    // Prefill only, contexts ≤ 512 tokens: one split, so the kernel normalises and writes the
    // output itself. The 300-token chunk spans several full 128-row tiles for every group (two
    // and a partial one at group 1), each of whose rows sees a different causal prefix of up to
    // 400 keys (seven key tiles, so the shared-memory ring wraps).
    let short = [
        seq(0, 130),
        seq(17, 64),
        seq(1, 5),
        seq(100, 300),
        seq(300, 2),
    ];
    for (heads, kv_heads, hd) in shapes {
        let dims = AttentionDims {
            cache_group: 0,
            window_tokens: None,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        for (name, seqs) in [("mixed", &mixed[..]), ("short", &short[..])] {
            let label = format!("prefill {name} h{heads}/{kv_heads} d{hd}");
            check_prefill_batch(&gpu, &cpu, &dims, seqs, &mut rng, &label);
        }
    }
}

/// On a Hopper GPU the prefill parity above ran the wgmma kernel at head width 128 when it was
/// asked for (`STARLING_PREFILL_KERNEL`, else the default): a fallback must not pass for it.
#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn prefill_runs_the_kernel_the_device_calls_for() {
    let gpu = gpu();
    let hopper = gpu.name().contains("sm_90");
    let want = match starling_cuda::HopperPrefill::requested() {
        starling_cuda::HopperPrefill::WgmmaWarpSpecialised if hopper => {
            "prefill_wgmma_ws_d128_bf16"
        }
        _ => "prefill_attention_d128_bf16",
    };
    assert_eq!(
        gpu.prefill_kernel_name(128).as_deref(),
        Some(want),
        "{}",
        gpu.name()
    );
    assert_eq!(
        gpu.prefill_kernel_name(64).as_deref(),
        Some("prefill_attention_d64_bf16")
    );
}

// ---- Tensor-core decode attention (decode_attention.cu): the decode rows of grouped-query
// models (2..=8 query heads per KV head, head_dim 64/128); MHA decode keeps attention.cu.

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn gqa_decode_attention_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    // (query heads, KV heads, head_dim): groups 2, 3, 4, 6 and 8, each at head widths 64 and 128;
    // and MHA, whose decode rows take the tensor-core kernel at batch 1 and the per-token kernel
    // at batch 64 (`MMA_MHA_MAX_DECODE_ROWS`).
    let shapes = [
        (8usize, 8usize, 128usize),
        (4, 4, 64),
        (4, 2, 64),
        (8, 4, 128),
        (9, 3, 64), // SmolLM2
        (6, 2, 128),
        (8, 2, 64),
        (32, 8, 128), // Llama-3-8B
        (12, 2, 64),
        (12, 2, 128), // Qwen2.5-1.5B
        (8, 1, 64),
        (16, 2, 128),
    ];
    // Decode rows see 1, 17, 300 and 5000 context positions (the new token included): alone,
    // the 5000-token row is cut into many splits (partials + combine) and 17 and 300 end inside
    // a key tile. Eviction kept 1000 of 3000 earlier tokens of the compacted sequence, so it
    // attends over a physical length below its position.
    let contexts = [1usize, 17, 300, 5000];
    let compacted = PrefillSeq {
        earlier: 3000,
        kept: Some(1000),
        new: 1,
    };
    for (heads, kv_heads, hd) in shapes {
        let dims = AttentionDims {
            cache_group: 0,
            window_tokens: None,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let shape = format!("h{heads}/{kv_heads} d{hd}");
        for &c in &contexts {
            let label = format!("gqa decode batch 1 ctx {c} {shape}");
            check_prefill_batch(&gpu, &cpu, &dims, &[seq(c - 1, 1)], &mut rng, &label);
        }
        let label = format!("gqa decode batch 1 compacted {shape}");
        check_prefill_batch(&gpu, &cpu, &dims, &[compacted], &mut rng, &label);
        // Batch 64: every context, the compacted sequence and random short ones (with few KV
        // heads the grid is small enough to be split too).
        let batch: Vec<PrefillSeq> = (0..64)
            .map(|i| match i {
                0..=3 => seq(contexts[i] - 1, 1),
                4 => compacted,
                _ => seq(rng.gen_range(0..400), 1),
            })
            .collect();
        let label = format!("gqa decode batch 64 {shape}");
        check_prefill_batch(&gpu, &cpu, &dims, &batch, &mut rng, &label);
        // Decode rows beside prefill chunks: one split plan for both kernels.
        let mixed = [seq(4999, 1), seq(100, 64), seq(16, 1), compacted, seq(0, 5)];
        let label = format!("gqa decode + prefill {shape}");
        check_prefill_batch(&gpu, &cpu, &dims, &mixed, &mut rng, &label);
    }
}

// ---- Sliding-window attention: every kernel (per-token decode, tensor-core decode, tiled
// prefill, the split combine) honours a layer's window.

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn windowed_attention_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    // Grouped d128 and d64 (tensor-core decode and prefill), MHA (per-token decode at batch > 4)
    // and head width 256 (Gemma-3: per-token kernel for every row).
    let shapes = [
        (12usize, 2usize, 128usize),
        (9, 3, 64),
        (32, 32, 128),
        (4, 1, 256),
        (8, 4, 256),
    ];
    // Decode rows at 1..5000 positions (the long one split), prefill chunks of 5..300 tokens
    // after 0..1000 earlier ones, and a compacted sequence (the window counts slots).
    let batch = [
        seq(4999, 1),
        seq(0, 5),
        seq(1000, 300),
        seq(16, 1),
        seq(17, 130),
        seq(300, 64),
        seq(0, 1),
        seq(599, 1),
        PrefillSeq {
            earlier: 600,
            kept: Some(200),
            new: 64,
        },
    ];
    // A window of one key, windows ending inside a key tile, one wider than a 128-row tile,
    // and one wider than every context (full attention).
    for window in [1usize, 17, 100, 512, 8192] {
        for (heads, kv_heads, hd) in shapes {
            let dims = AttentionDims {
                cache_group: 0,
                window_tokens: Some(window),
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
            };
            let label = format!("window {window} h{heads}/{kv_heads} d{hd}");
            check_prefill_batch(&gpu, &cpu, &dims, &batch, &mut rng, &label);
            let label = format!("window {window} decode batch 1 h{heads}/{kv_heads} d{hd}");
            check_prefill_batch(&gpu, &cpu, &dims, &[seq(4999, 1)], &mut rng, &label);
        }
    }
}

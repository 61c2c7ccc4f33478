//! GPU parity tests: every CUDA op against the CPU reference on fresh random inputs, outputs
//! poisoned before each run, error measured as ‖out − ref‖ / ‖ref‖ (device METHOD.md: bf16
//! operands land between 1e-3 and 1e-2). Inputs are rounded to bf16 before the CPU sees them, so
//! both sides compute on identical values.
//!
//! These need a GPU: they are `#[ignore]`d in CPU CI and run on the device through
//! `scripts/device/gpu_tests.sh` (`--include-ignored`).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use starling_backend::cpu::CpuBackend;
use starling_backend::{
    AttentionDims, Backend, BatchMeta, HostTensor, KvCacheSpec, RopeSpec, RopeStyle, SeqBatchMeta,
};
use starling_cuda::CudaBackend;

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
    for &(n, d) in &[(1usize, 576usize), (37, 1536), (300, 4096)] {
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
    for &(n, k, m) in &[
        (1usize, 576usize, 1728usize),
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
            "linear+bias",
            &gpu.to_host(&gpu.linear(&gx, &gw, Some(&gb)).unwrap())
                .unwrap(),
            &cpu.linear(&x, &w, Some(&b)).unwrap(),
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
        let spec = KvCacheSpec {
            num_blocks,
            block_size_tokens: bs,
            num_kv_heads: kv_heads,
            head_dim: hd,
        };
        // Decode rows (1 new token, long and short contexts, incl. a split-K case) and prefill
        // chunks (several new tokens over earlier context).
        let seq_shapes: Vec<(usize, usize)> =
            vec![(1, 1), (700, 1), (3000, 1), (40, 40), (300, 77), (17, 5)];
        let meta = random_batch(&mut rng, &seq_shapes, bs, num_blocks);
        let n = meta.num_tokens();
        // Fill the whole context first (earlier tokens) with random K/V through write_kv.
        let mut cache_c = cpu.alloc_kv_cache(&spec).unwrap();
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

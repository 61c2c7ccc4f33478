//! STAR-KV latent layers on the GPU against the CPU reference (`starling_backend::cpu::latent`):
//! the latent write, attention on latents (decode rows through the latent kernels, prefill
//! chunks through the reconstruction path, both in one batch and apart), reconstruction to full
//! K/V, and the latent cache's block operations (compaction, copies, gather/scatter: rows and
//! positions moved bit for bit).

use super::*;
use starling_backend::{BackendCore, KeepPlan, KvCacheOps, KvRows, LatentFactors, ModelOps};
use starling_cuda::LatentScoreKernel;
use starling_kv::LayerLayout;

/// (query heads, KV heads, head_dim, stored key rank per head, stored value rank, RoPE style).
pub(super) type LatentShape = (usize, usize, usize, Vec<usize>, usize, RopeStyle);

pub(super) fn latent_shapes() -> Vec<LatentShape> {
    vec![
        // Qwen2.5-Coder-1.5B at about half its K/V bytes.
        (12, 2, 128, vec![64, 72], 128, RopeStyle::Neox),
        // SmolLM2-135M's heads, interleaved RoPE (GGUF llama).
        (9, 3, 64, vec![24, 32, 16], 96, RopeStyle::Interleaved),
        // A head of rank 0 (keys of its bias alone), ranks not multiples of 16.
        (6, 6, 64, vec![0, 8, 64, 16, 40, 24], 8, RopeStyle::Neox),
        // MHA with interleaved RoPE, ranks at most half the head (the absorbed kernel's
        // four-m-tile variant).
        (4, 4, 64, vec![32, 16, 24, 8], 64, RopeStyle::Interleaved),
        // Interleaved RoPE at head width 128, four query heads per KV head, ranks filling one
        // and two 64-rank halves of the wgmma kernel's tiles (the second half in part).
        (8, 2, 128, vec![40, 96], 64, RopeStyle::Interleaved),
        // The prior work's MHA shape: 32 × 128, key rank 64 per head, values at half.
        (32, 32, 128, vec![64; 32], 2048, RopeStyle::Neox),
    ]
}

pub(super) fn latent_spec(
    ranks: &[usize],
    value_rank: usize,
    num_blocks: usize,
    dtype: CacheDtype,
) -> KvCacheSpec {
    KvCacheSpec {
        num_blocks,
        block_size_tokens: 16,
        layout: LayerLayout::LowRank {
            key_rank_per_head: ranks.to_vec(),
            value_rank,
            dtype,
        },
    }
}

pub(super) fn rope_for(head_dim: usize, style: RopeStyle) -> RopeSpec {
    RopeSpec {
        inv_freqs: (0..head_dim / 2)
            .map(|i| 1.0 / 1e4f32.powf(2.0 * i as f32 / head_dim as f32))
            .collect(),
        style,
    }
}

/// Factors on the host (bf16-exact) and their device copies.
pub(super) struct Factors {
    host: [HostTensor; 4],
    device: Vec<<CudaBackend as BackendCore>::Tensor>,
}

impl Factors {
    pub(super) fn new(
        gpu: &CudaBackend,
        rng: &mut ChaCha8Rng,
        dims: &AttentionDims,
        kw: usize,
        vw: usize,
    ) -> Self {
        let (hd, kv) = (dims.head_dim, dims.kv_size());
        // Scales that keep keys and values O(1) for latents in [-1, 1).
        let host = [
            rand_host(rng, vec![hd, kw.max(1)], 1.0 / (kw.max(1) as f32).sqrt()),
            rand_host(rng, vec![kv], 0.5),
            rand_host(rng, vec![kv, vw], 1.0 / (vw as f32).sqrt()),
            rand_host(rng, vec![kv], 0.5),
        ];
        let host = if kw == 0 {
            [
                HostTensor::zeros(vec![hd, 0]),
                host[1].clone(),
                host[2].clone(),
                host[3].clone(),
            ]
        } else {
            host
        };
        let device = host.iter().map(|t| gpu.upload(t).unwrap()).collect();
        Self { host, device }
    }

    pub(super) fn cpu(&self) -> LatentFactors<'_, HostTensor> {
        LatentFactors {
            key_up: &self.host[0],
            key_bias: Some(&self.host[1]),
            value_up: &self.host[2],
            value_bias: Some(&self.host[3]),
        }
    }

    pub(super) fn gpu(&self) -> LatentFactors<'_, <CudaBackend as BackendCore>::Tensor> {
        LatentFactors {
            key_up: &self.device[0],
            key_bias: Some(&self.device[1]),
            value_up: &self.device[2],
            value_bias: Some(&self.device[3]),
        }
    }
}

/// Every slot of both caches filled with the same latents (bf16-exact) and positions.
#[allow(clippy::too_many_arguments)]
pub(super) fn fill_latents(
    gpu: &CudaBackend,
    cpu: &CpuBackend,
    caches: (
        &mut <CpuBackend as BackendCore>::KvCache,
        &mut <CudaBackend as BackendCore>::KvCache,
    ),
    dims: &AttentionDims,
    rope: &RopeSpec,
    num_blocks: usize,
    width: usize,
    rng: &mut ChaCha8Rng,
    consecutive: bool,
) {
    let n = num_blocks * 16;
    let mut meta = BatchMeta::single_sequence(
        0,
        n,
        (0..n as u32).collect(),
        (0..num_blocks as u32).collect(),
        16,
        Vec::new(),
    );
    // Positions that are not the slot index (as after eviction), some past the slots; or the
    // slot index, so every block's 16 keys sit at consecutive positions (as in a sequence never
    // compacted: the rotary-absorbed kernel's fast path).
    meta.positions = (0..n as u32)
        .map(|s| {
            if consecutive {
                s
            } else {
                (s * 7 + 3) % (2 * n as u32)
            }
        })
        .collect();
    let rows = rand_host(rng, vec![n, width], 1.0);
    let mut c = rows.clone();
    let mut g = gpu.upload(&rows).unwrap();
    cpu.rope_q_write_latents(
        &mut c,
        caches.0,
        dims,
        rope,
        &cpu.prepare_batch(&meta, num_blocks).unwrap(),
    )
    .unwrap();
    gpu.rope_q_write_latents(
        &mut g,
        caches.1,
        dims,
        rope,
        &gpu.prepare_batch(&meta, num_blocks).unwrap(),
    )
    .unwrap();
}

/// A random batch of `shape` (context, new tokens) attends both caches; the GPU's rows must
/// match the CPU reference's.
#[allow(clippy::too_many_arguments)]
fn attend_and_check(
    gpu: &CudaBackend,
    cpu: &CpuBackend,
    (cache_c, cache_g): (
        &<CpuBackend as BackendCore>::KvCache,
        &<CudaBackend as BackendCore>::KvCache,
    ),
    factors: &Factors,
    dims: &AttentionDims,
    rope: &RopeSpec,
    shape: &[(usize, usize)],
    width: usize,
    rng: &mut ChaCha8Rng,
    name: &str,
    blocks_in_order: bool,
) {
    let num_blocks = cache_g.spec().num_blocks;
    let meta = if blocks_in_order {
        in_order_batch(shape, 16, num_blocks)
    } else {
        random_batch(rng, shape, 16, num_blocks)
    };
    let qkv = rand_host(rng, vec![meta.num_tokens(), width], 1.0);
    let (bc, bg) = (
        cpu.prepare_batch(&meta, num_blocks).unwrap(),
        gpu.prepare_batch(&meta, num_blocks).unwrap(),
    );
    let want = cpu
        .latent_attention(&qkv, cache_c, &factors.cpu(), dims, rope, &bc)
        .unwrap();
    let got = gpu
        .latent_attention(
            &gpu.upload(&qkv).unwrap(),
            cache_g,
            &factors.gpu(),
            dims,
            rope,
            &bg,
        )
        .unwrap();
    let got = gpu.to_host(&got).unwrap();
    report_rows(name, &meta, &got, &want);
    check(name, &got, &want);
}

/// Every slot of the two latent caches holds the same rows and positions, bit for bit.
fn assert_same_caches(
    name: &str,
    (cpu, gpu): (&CpuBackend, &CudaBackend),
    (cache_c, cache_g): (
        &<CpuBackend as BackendCore>::KvCache,
        &<CudaBackend as BackendCore>::KvCache,
    ),
    num_blocks: usize,
) {
    let all: Vec<u32> = (0..num_blocks as u32).collect();
    let c = cpu.gather_kv(cache_c, &all, 16, num_blocks * 16).unwrap();
    let g = gpu.gather_kv(cache_g, &all, 16, num_blocks * 16).unwrap();
    assert_same(
        &format!("{name} (key latents)"),
        &gpu.to_host(&g.keys).unwrap(),
        &c.keys,
    );
    assert_same(
        &format!("{name} (value latent)"),
        &gpu.to_host(&g.values).unwrap(),
        &c.values,
    );
    assert_eq!(g.positions, c.positions, "{name} (positions)");
}

/// Prints each sequence's relative error (query length, context) when the batch's is past the
/// tolerance, so a failure names the rows it comes from.
pub(super) fn report_rows(label: &str, meta: &BatchMeta, got: &HostTensor, want: &HostTensor) {
    if rel_err(got, want) < BF16_REL_TOL {
        return;
    }
    let width = want.shape()[1];
    for seq in &meta.seqs {
        let rows = seq.query_start * width..(seq.query_start + seq.query_len) * width;
        let (g, w) = (&got.data()[rows.clone()], &want.data()[rows]);
        let num: f64 = g.iter().zip(w).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let den: f64 = w.iter().map(|b| (*b as f64).powi(2)).sum();
        println!(
            "{label}: rows {}+{} (context {}): rel err {:.2e}",
            seq.query_start,
            seq.query_len,
            seq.context_len_tokens,
            (num / den.max(1e-30)).sqrt()
        );
    }
}

/// Reconstructs `len` tokens of `table` from the latent caches (`caches`: CPU, GPU) into a fresh
/// full cache on each side (bf16 on the GPU, f32 on the CPU; blocks in reverse order), checks
/// the keys and values, and returns the GPU destination and its table for further checks.
#[allow(clippy::too_many_arguments)]
pub(super) fn check_reconstruction(
    cpu: &CpuBackend,
    gpu: &CudaBackend,
    caches: (
        &<CpuBackend as BackendCore>::KvCache,
        &<CudaBackend as BackendCore>::KvCache,
    ),
    factors: &Factors,
    dims: &AttentionDims,
    rope: &RopeSpec,
    table: &[u32],
    len: usize,
    label: &str,
) -> (<CudaBackend as BackendCore>::KvCache, Vec<u32>) {
    let (cache_c, cache_g) = caches;
    let blocks = len.div_ceil(16);
    let dense = KvCacheSpec::full(
        blocks + 2,
        16,
        dims.num_kv_heads,
        dims.head_dim,
        CacheDtype::BF16,
    );
    let mut dense_c = cpu
        .alloc_kv_cache(&dense.with_dtype(CacheDtype::F32))
        .unwrap();
    let mut dense_g = gpu.alloc_kv_cache(&dense).unwrap();
    let dense_table: Vec<u32> = (2..2 + blocks as u32).rev().collect();
    cpu.reconstruct_kv(
        cache_c,
        &factors.cpu(),
        dims,
        rope,
        table,
        len,
        &mut dense_c,
        &dense_table,
    )
    .unwrap();
    gpu.reconstruct_kv(
        cache_g,
        &factors.gpu(),
        dims,
        rope,
        table,
        len,
        &mut dense_g,
        &dense_table,
    )
    .unwrap();
    let (k_c, k_g) = (
        cpu.gather_kv(&dense_c, &dense_table, 16, len).unwrap(),
        gpu.gather_kv(&dense_g, &dense_table, 16, len).unwrap(),
    );
    check(
        &format!("{label} reconstructed K"),
        &gpu.to_host(&k_g.keys).unwrap(),
        &k_c.keys,
    );
    check(
        &format!("{label} reconstructed V"),
        &gpu.to_host(&k_g.values).unwrap(),
        &k_c.values,
    );
    (dense_g, dense_table)
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn latent_write_attention_and_reconstruction_match_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    for (heads, kv_heads, hd, ranks, vw, style) in latent_shapes() {
        let dims = AttentionDims {
            cache_group: 0,
            window_tokens: None,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let kw: usize = ranks.iter().sum();
        let width = dims.q_size() + kw + vw;
        let rope = rope_for(hd, style);
        let mha = kv_heads == 32;
        let num_blocks = if mha { 160 } else { 512 };
        let spec = latent_spec(&ranks, vw, num_blocks, CacheDtype::BF16);
        let mut cache_c = cpu
            .alloc_kv_cache(&spec.with_dtype(CacheDtype::F32))
            .unwrap();
        let mut cache_g = gpu.alloc_kv_cache(&spec).unwrap();
        fill_latents(
            &gpu,
            &cpu,
            (&mut cache_c, &mut cache_g),
            &dims,
            &rope,
            num_blocks,
            width,
            &mut rng,
            false,
        );
        let label = format!("latent h{heads}/{kv_heads} d{hd} r{kw}+{vw}");

        // The write: Q rotated as rope_qk does, latents and positions stored bit for bit.
        assert_same_caches(
            &format!("{label}: written"),
            (&cpu, &gpu),
            (&cache_c, &cache_g),
            num_blocks,
        );

        let factors = Factors::new(&gpu, &mut rng, &dims, kw, vw);
        // Decode rows (short, long, split-K) and prefill chunks, together and apart.
        let mixed: Vec<(usize, usize)> = if mha {
            vec![(1, 1), (500, 1), (1200, 1), (40, 40), (300, 77)]
        } else {
            vec![(1, 1), (700, 1), (3000, 1), (40, 40), (300, 77), (17, 5)]
        };
        let decode: Vec<(usize, usize)> = mixed.iter().copied().filter(|s| s.1 == 1).collect();
        let prefill: Vec<(usize, usize)> = mixed.iter().copied().filter(|s| s.1 > 1).collect();
        // Every score kernel (the rotary-absorbed one differs only where a KV head has one
        // query head). Positions here are not consecutive: the register-factor kernel's table
        // path.
        let parts = [
            ("decode", &decode, LatentScoreKernel::Reconstruct),
            ("decode", &decode, LatentScoreKernel::RotaryAbsorbed),
            ("decode", &decode, LatentScoreKernel::RegisterFactors),
            ("decode", &decode, LatentScoreKernel::Wgmma),
            ("prefill", &prefill, LatentScoreKernel::Reconstruct),
            ("mixed", &mixed, LatentScoreKernel::Reconstruct),
            ("mixed", &mixed, LatentScoreKernel::RotaryAbsorbed),
            ("mixed", &mixed, LatentScoreKernel::RegisterFactors),
            ("mixed", &mixed, LatentScoreKernel::Wgmma),
        ];
        for (part, shape, kernel) in parts {
            gpu.set_latent_score_kernel(kernel);
            let name = format!("{label} {part} ({kernel:?})");
            let caches = (&cache_c, &cache_g);
            attend_and_check(
                &gpu, &cpu, caches, &factors, &dims, &rope, shape, width, &mut rng, &name, false,
            );
        }

        // Decode rows again over keys at consecutive positions within each block.
        fill_latents(
            &gpu,
            &cpu,
            (&mut cache_c, &mut cache_g),
            &dims,
            &rope,
            num_blocks,
            width,
            &mut rng,
            true,
        );
        for kernel in [
            LatentScoreKernel::Reconstruct,
            LatentScoreKernel::RotaryAbsorbed,
            LatentScoreKernel::RegisterFactors,
            LatentScoreKernel::Wgmma,
        ] {
            gpu.set_latent_score_kernel(kernel);
            let name = format!("{label} decode ({kernel:?}), consecutive positions");
            let caches = (&cache_c, &cache_g);
            attend_and_check(
                &gpu, &cpu, caches, &factors, &dims, &rope, &decode, width, &mut rng, &name, false,
            );
        }
        // Blocks in order too, so each sequence's keys are consecutive across its blocks: the
        // register-factor kernel's register path (whole tiles at p0 + j), and a mix of both
        // paths in the decode rows with prefill chunks.
        gpu.set_latent_score_kernel(LatentScoreKernel::RegisterFactors);
        for (part, shape) in [("decode", &decode), ("mixed", &mixed)] {
            let name = format!("{label} {part} (RegisterFactors), sequences in order");
            let caches = (&cache_c, &cache_g);
            attend_and_check(
                &gpu, &cpu, caches, &factors, &dims, &rope, shape, width, &mut rng, &name, true,
            );
        }
        gpu.set_latent_score_kernel(LatentScoreKernel::Reconstruct);

        // Reconstruction of one long sequence into a full cache.
        let len: usize = if mha { 700 } else { 2000 };
        let mut blocks: Vec<u32> = (0..num_blocks as u32).collect();
        blocks.shuffle(&mut rng);
        let table = &blocks[..len.div_ceil(16)];
        let (mut dense_g, dense_table) = check_reconstruction(
            &cpu,
            &gpu,
            (&cache_c, &cache_g),
            &factors,
            &dims,
            &rope,
            table,
            len,
            &label,
        );
        // A repeated destination block is refused and writes nothing.
        let twice = vec![dense_table[0]; dense_table.len()];
        assert!(gpu
            .reconstruct_kv(
                &cache_g,
                &factors.gpu(),
                &dims,
                &rope,
                table,
                len,
                &mut dense_g,
                &twice
            )
            .is_err());
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn latent_block_ops_match_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let (heads, kv_heads, hd) = (12, 2, 128);
    let (ranks, vw) = (vec![64, 72], 128);
    let dims = AttentionDims {
        cache_group: 0,
        window_tokens: None,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim: hd,
        scale: 0.1,
    };
    let width = dims.q_size() + 136 + vw;
    let num_blocks = 96;
    let spec = latent_spec(&ranks, vw, num_blocks, CacheDtype::BF16);
    let mut cache_c = cpu
        .alloc_kv_cache(&spec.with_dtype(CacheDtype::F32))
        .unwrap();
    let mut cache_g = gpu.alloc_kv_cache(&spec).unwrap();
    let rope = rope_for(hd, RopeStyle::Neox);
    fill_latents(
        &gpu,
        &cpu,
        (&mut cache_c, &mut cache_g),
        &dims,
        &rope,
        num_blocks,
        width,
        &mut rng,
        false,
    );
    let all: Vec<u32> = (0..num_blocks as u32).collect();
    let compare = |name: &str,
                   cache_c: &<CpuBackend as BackendCore>::KvCache,
                   cache_g: &<CudaBackend as BackendCore>::KvCache| {
        assert_same_caches(name, (&cpu, &gpu), (cache_c, cache_g), num_blocks)
    };
    // Compaction: one kept list for the whole slot, in a shuffled table.
    let mut blocks = all.clone();
    blocks.shuffle(&mut rng);
    for len in [1usize, 77, 513] {
        let table = &blocks[..len.div_ceil(16)];
        let keep = vec![random_subset(&mut rng, len, len / 2 + 1)];
        cpu.compact_kv(&mut cache_c, table, 16, len, &keep).unwrap();
        gpu.compact_kv(&mut cache_g, table, 16, len, &keep).unwrap();
        compare(&format!("latent compact len {len}"), &cache_c, &cache_g);
        // A full layer's per-head lists are refused.
        let per_head = vec![keep[0].clone(), keep[0].clone()];
        assert!(gpu
            .compact_kv(&mut cache_g, table, 16, len, &per_head)
            .is_err());
    }
    // Compaction by scores (selected on the device): one layer-wide list.
    for len in [300usize, 513] {
        let table = &blocks[..len.div_ceil(16)];
        let scores = rand_host(&mut rng, vec![kv_heads, len], 1.0);
        let plan = KeepPlan {
            physical_tokens: len,
            target_tokens: len / 2,
            first_evictable_tokens: 0,
            evictable_end_tokens: len,
            sink_tokens: 20,
            window_tokens: 32,
            layer_wide: true,
            lists: 1,
            skip_tokens: 16,
        };
        cpu.compact_kv_by_scores(&mut cache_c, table, 16, &scores, &plan)
            .unwrap();
        gpu.compact_kv_by_scores(
            &mut cache_g,
            table,
            16,
            &gpu.upload_f32(&scores).unwrap(),
            &plan,
        )
        .unwrap();
        compare(
            &format!("latent compact by scores len {len}"),
            &cache_c,
            &cache_g,
        );
    }
    // Block copies move positions with the rows.
    let pairs: Vec<(u32, u32)> = (0..10).map(|i| (blocks[i], blocks[50 + i])).collect();
    cpu.copy_kv_blocks(&mut cache_c, &pairs).unwrap();
    gpu.copy_kv_blocks(&mut cache_g, &pairs).unwrap();
    compare("latent copy_kv_blocks", &cache_c, &cache_g);
    // Scatter of fresh rows and positions, then the gather they round-trip through.
    let len: usize = 300;
    let table = &blocks[20..20 + len.div_ceil(16)];
    let keys = rand_host(&mut rng, vec![len, 136], 1.0);
    let values = rand_host(&mut rng, vec![len, vw], 1.0);
    let positions: Vec<u32> = (0..len as u32).map(|i| 40_000 + 3 * i).collect();
    cpu.scatter_kv(
        &mut cache_c,
        table,
        16,
        &KvRows {
            keys: keys.clone(),
            values: values.clone(),
            positions: positions.clone(),
        },
    )
    .unwrap();
    gpu.scatter_kv(
        &mut cache_g,
        table,
        16,
        &KvRows {
            keys: gpu.upload(&keys).unwrap(),
            values: gpu.upload(&values).unwrap(),
            positions: positions.clone(),
        },
    )
    .unwrap();
    compare("latent scatter_kv", &cache_c, &cache_g);
    assert_eq!(
        gpu.gather_kv(&cache_g, table, 16, len).unwrap().positions,
        positions
    );
}

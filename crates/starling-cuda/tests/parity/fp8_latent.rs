//! fp8 (e4m3) STAR-KV latent caches on the GPU against the CPU reference, which holds the same
//! e4m3 values in its f32 slots (`starling_backend::fp8`; `CpuKvCache::set_slot` rounds every
//! latent it stores). So:
//! - the write stores exactly the CPU's bytes (saturation to ±448 included), and exactly the
//!   e4m3 rounding of what the bf16 write stores, with the same rotated Q;
//! - attention (decode rows through `latent_scores_d*_fp8` / `latent_values_mt*_fp8`, prefill
//!   chunks through `latent_gather_rows_fp8` and the reconstruction) reads the same values as
//!   the CPU: the GPU converts each byte to bf16 exactly, so the only differences are the bf16
//!   latent kernels' own roundings (reconstructed keys, P, the merged weights, the GEMMs), and
//!   the bf16 latent tests' tolerance ([`BF16_REL_TOL`]) applies unchanged;
//! - the rotary-absorbed kernel has no fp8 instantiation: asking for it changes nothing, bit for
//!   bit;
//! - the row moves (compaction, block copies, gather/scatter) move the byte rows and positions
//!   bit for bit; gathered rows are raw words (two e4m3 per bf16 word) that only an fp8 scatter
//!   reads back.
//!
//! Run on a GPU (sm_89+): `cargo test -p starling-cuda --test parity -- --include-ignored
//! --nocapture fp8_latent`.

use super::latent::{
    check_reconstruction, fill_latents, latent_shapes, latent_spec, report_rows, rope_for, Factors,
};
use super::*;
use starling_backend::fp8::{e4m3_from_f32, e4m3_round, e4m3_to_f32};
use starling_backend::{BackendCore, KvCacheOps, KvRows, ModelOps};
use starling_cuda::LatentScoreKernel;

type CpuCache = <CpuBackend as BackendCore>::KvCache;
type GpuCache = <CudaBackend as BackendCore>::KvCache;

/// Every slot of a latent cache as f32: key latents `[slots, key width]`, value latents
/// `[slots, value width]`, positions.
struct Contents {
    keys: HostTensor,
    values: HostTensor,
    positions: Vec<u32>,
}

/// Raw words of an fp8 plane (as the GPU's `gather_kv` returns them: two e4m3 bytes per bf16
/// word, the lower element in the low byte) decoded to f32. `to_host` carries every such word
/// exactly: a finite e4m3 high byte never makes a bf16 NaN or infinity.
fn decode_words(words: &HostTensor) -> HostTensor {
    let &[n, w] = words.shape() else {
        panic!("words of shape {:?}", words.shape())
    };
    let data = words
        .data()
        .iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_bits().to_le_bytes())
        .map(e4m3_to_f32)
        .collect();
    HostTensor::new(vec![n, 2 * w], data).unwrap()
}

/// `rows` (f32, even width) as the raw words an fp8 cache's `scatter_kv` takes, each value
/// rounded to e4m3 as the CPU reference's scatter rounds it.
fn encode_words(rows: &HostTensor) -> HostTensor {
    let &[n, w] = rows.shape() else {
        panic!("rows of shape {:?}", rows.shape())
    };
    let data = rows
        .data()
        .chunks_exact(2)
        .map(|p| {
            let bits = u16::from_le_bytes([e4m3_from_f32(p[0]), e4m3_from_f32(p[1])]);
            half::bf16::from_bits(bits).to_f32()
        })
        .collect();
    HostTensor::new(vec![n, w / 2], data).unwrap()
}

fn all_blocks(cache_blocks: usize) -> Vec<u32> {
    (0..cache_blocks as u32).collect()
}

fn cpu_contents(cpu: &CpuBackend, cache: &CpuCache) -> Contents {
    let spec = cache.spec();
    let n = spec.num_slots();
    let rows = cpu
        .gather_kv(cache, &all_blocks(spec.num_blocks), 16, n)
        .unwrap();
    Contents {
        keys: rows.keys,
        values: rows.values,
        positions: rows.positions,
    }
}

/// An fp8 GPU cache's contents (raw words decoded), or a bf16 one's (`words == false`).
fn gpu_contents(gpu: &CudaBackend, cache: &GpuCache, words: bool) -> Contents {
    let spec = cache.spec();
    let n = spec.num_slots();
    let rows = gpu
        .gather_kv(cache, &all_blocks(spec.num_blocks), 16, n)
        .unwrap();
    let (keys, values) = (
        gpu.to_host(&rows.keys).unwrap(),
        gpu.to_host(&rows.values).unwrap(),
    );
    let (kw, vw) = spec.plane_widths();
    if words {
        // One byte per element: the gathered rows are half as many words as elements.
        assert_eq!(keys.shape(), &[n, kw / 2], "fp8 key words");
        assert_eq!(values.shape(), &[n, vw / 2], "fp8 value words");
    }
    let decode = |t: HostTensor| if words { decode_words(&t) } else { t };
    Contents {
        keys: decode(keys),
        values: decode(values),
        positions: rows.positions,
    }
}

fn assert_same_contents(name: &str, got: &Contents, want: &Contents) {
    assert_same(&format!("{name} (key latents)"), &got.keys, &want.keys);
    assert_same(&format!("{name} (value latent)"), &got.values, &want.values);
    assert_eq!(got.positions, want.positions, "{name} (positions)");
}

fn fp8_spec(ranks: &[usize], value_rank: usize, num_blocks: usize) -> KvCacheSpec {
    latent_spec(ranks, value_rank, num_blocks, CacheDtype::Fp8)
}

fn dims_of(heads: usize, kv_heads: usize, hd: usize) -> AttentionDims {
    AttentionDims {
        cache_group: 0,
        window_tokens: None,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn fp8_latent_write_stores_the_cpu_s_e4m3_bytes() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(61);
    for (heads, kv_heads, hd, ranks, vw, style) in latent_shapes() {
        let dims = dims_of(heads, kv_heads, hd);
        let kw: usize = ranks.iter().sum();
        let width = dims.q_size() + kw + vw;
        let rope = rope_for(hd, style);
        let num_blocks = 64;
        let spec = fp8_spec(&ranks, vw, num_blocks);
        // 300 tokens in scattered slots (7 is prime to the 1024 slots: all distinct), the rest
        // of the cache left zero on both sides.
        let n = 300;
        let slots: Vec<u32> = (0..n as u32).map(|i| (i * 7) % 1024).collect();
        let mut meta =
            BatchMeta::single_sequence(0, n, slots, all_blocks(num_blocks), 16, Vec::new());
        meta.positions = (0..n as u32).map(|i| 5 * i + 3).collect();
        // Latents up to ±600, past e4m3's ±448 that the write saturates to; bf16-exact, so both
        // sides round the same number.
        let rows = rand_host(&mut rng, vec![n, width], 600.0);
        let (bc, bg) = (
            cpu.prepare_batch(&meta, num_blocks).unwrap(),
            gpu.prepare_batch(&meta, num_blocks).unwrap(),
        );
        let mut cache_c = cpu.alloc_kv_cache(&spec).unwrap();
        let mut cache_g = gpu.alloc_kv_cache(&spec).unwrap();
        let mut bf16_g = gpu
            .alloc_kv_cache(&spec.with_dtype(CacheDtype::BF16))
            .unwrap();
        let mut qkv_c = rows.clone();
        let mut qkv_g = gpu.upload(&rows).unwrap();
        let mut qkv_bf16 = gpu.upload(&rows).unwrap();
        cpu.rope_q_write_latents(&mut qkv_c, &mut cache_c, &dims, &rope, &bc)
            .unwrap();
        gpu.rope_q_write_latents(&mut qkv_g, &mut cache_g, &dims, &rope, &bg)
            .unwrap();
        gpu.rope_q_write_latents(&mut qkv_bf16, &mut bf16_g, &dims, &rope, &bg)
            .unwrap();
        let label = format!("fp8 latent write h{heads}/{kv_heads} d{hd} r{kw}+{vw}");

        // The CPU's e4m3 values, bit for bit, saturation included.
        let got = gpu_contents(&gpu, &cache_g, true);
        assert_same_contents(&label, &got, &cpu_contents(&cpu, &cache_c));
        if kw > 0 {
            assert!(
                got.keys.data().iter().any(|k| k.abs() == 448.0),
                "{label}: no key latent saturated"
            );
        }
        assert!(
            got.values.data().iter().any(|v| v.abs() == 448.0),
            "{label}: no value latent saturated"
        );
        // ... which are the e4m3 rounding of what the bf16 write stores (one template), and the
        // rotated Q is the bf16 write's, bit for bit.
        let bf16 = gpu_contents(&gpu, &bf16_g, false);
        let rounded = |t: &HostTensor| {
            HostTensor::new(
                t.shape().to_vec(),
                t.data().iter().map(|&x| e4m3_round(x)).collect(),
            )
            .unwrap()
        };
        assert_same(
            &format!("{label} vs bf16 (K)"),
            &got.keys,
            &rounded(&bf16.keys),
        );
        assert_same(
            &format!("{label} vs bf16 (V)"),
            &got.values,
            &rounded(&bf16.values),
        );
        assert_eq!(got.positions, bf16.positions, "{label}: positions");
        assert_same(
            &format!("{label}: rotated Q"),
            &gpu.to_host(&qkv_g).unwrap(),
            &gpu.to_host(&qkv_bf16).unwrap(),
        );
        println!("{label:<44} exact");
    }
}

/// One random batch of `shape` (context, new tokens) attends both fp8 caches: the GPU with the
/// reconstruction kernel, and with the rotary-absorbed and register-factor kernels asked for (an
/// fp8 cache falls back to reconstruction: the same output, bit for bit), and with the wgmma
/// kernel; each against the CPU reference.
#[allow(clippy::too_many_arguments)]
fn attend_fp8_and_check(
    gpu: &CudaBackend,
    cpu: &CpuBackend,
    (cache_c, cache_g): (&CpuCache, &GpuCache),
    factors: &Factors,
    dims: &AttentionDims,
    rope: &RopeSpec,
    shape: &[(usize, usize)],
    width: usize,
    rng: &mut ChaCha8Rng,
    name: &str,
) {
    let num_blocks = cache_g.spec().num_blocks;
    let meta = random_batch(rng, shape, 16, num_blocks);
    let qkv = rand_host(rng, vec![meta.num_tokens(), width], 1.0);
    let (bc, bg) = (
        cpu.prepare_batch(&meta, num_blocks).unwrap(),
        gpu.prepare_batch(&meta, num_blocks).unwrap(),
    );
    let want = cpu
        .latent_attention(&qkv, cache_c, &factors.cpu(), dims, rope, &bc)
        .unwrap();
    let qkv_g = gpu.upload(&qkv).unwrap();
    let mut outs = Vec::new();
    for kernel in [
        LatentScoreKernel::Reconstruct,
        LatentScoreKernel::RotaryAbsorbed,
        LatentScoreKernel::RegisterFactors,
        LatentScoreKernel::Wgmma,
    ] {
        gpu.set_latent_score_kernel(kernel);
        let got = gpu
            .latent_attention(&qkv_g, cache_g, &factors.gpu(), dims, rope, &bg)
            .unwrap();
        outs.push(gpu.to_host(&got).unwrap());
    }
    gpu.set_latent_score_kernel(LatentScoreKernel::Reconstruct);
    assert_same(
        &format!("{name}: rotary asked = reconstruct"),
        &outs[1],
        &outs[0],
    );
    assert_same(
        &format!("{name}: register factors asked = reconstruct"),
        &outs[2],
        &outs[0],
    );
    report_rows(name, &meta, &outs[0], &want);
    check(name, &outs[0], &want);
    // The wgmma kernel (head width 128 on Hopper; elsewhere the reconstruction kernel again)
    // converts the same bytes to the same bf16 keys but sums its products in another order.
    report_rows(&format!("{name} (Wgmma)"), &meta, &outs[3], &want);
    check(&format!("{name} (Wgmma)"), &outs[3], &want);
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn fp8_latent_attention_and_reconstruction_match_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(62);
    for (heads, kv_heads, hd, ranks, vw, style) in latent_shapes() {
        let dims = dims_of(heads, kv_heads, hd);
        let kw: usize = ranks.iter().sum();
        let width = dims.q_size() + kw + vw;
        let rope = rope_for(hd, style);
        let mha = kv_heads == 32;
        let num_blocks = if mha { 160 } else { 512 };
        let spec = fp8_spec(&ranks, vw, num_blocks);
        let mut cache_c = cpu.alloc_kv_cache(&spec).unwrap();
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
        let label = format!("fp8 latent h{heads}/{kv_heads} d{hd} r{kw}+{vw}");
        assert_same_contents(
            &format!("{label}: written"),
            &gpu_contents(&gpu, &cache_g, true),
            &cpu_contents(&cpu, &cache_c),
        );

        let factors = Factors::new(&gpu, &mut rng, &dims, kw, vw);
        // Decode rows (short, long, split-K: the byte-tile rings over many tiles) and prefill
        // chunks (the fp8 gather into the reconstruction), together and apart.
        let mixed: Vec<(usize, usize)> = if mha {
            vec![(1, 1), (500, 1), (1200, 1), (40, 40), (300, 77)]
        } else {
            vec![(1, 1), (700, 1), (3000, 1), (40, 40), (300, 77), (17, 5)]
        };
        let decode: Vec<(usize, usize)> = mixed.iter().copied().filter(|s| s.1 == 1).collect();
        let prefill: Vec<(usize, usize)> = mixed.iter().copied().filter(|s| s.1 > 1).collect();
        for (part, shape) in [
            ("decode", &decode),
            ("prefill", &prefill),
            ("mixed", &mixed),
        ] {
            let name = format!("{label} {part}");
            attend_fp8_and_check(
                &gpu,
                &cpu,
                (&cache_c, &cache_g),
                &factors,
                &dims,
                &rope,
                shape,
                width,
                &mut rng,
                &name,
            );
        }

        // Reconstruction of one long sequence from fp8 latents into a bf16 full cache (what
        // eviction scores a latent layer on).
        let len: usize = if mha { 700 } else { 2000 };
        let mut blocks = all_blocks(num_blocks);
        blocks.shuffle(&mut rng);
        let table = &blocks[..len.div_ceil(16)];
        let (_, dense_table) = check_reconstruction(
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
        let dense = KvCacheSpec::full(dense_table.len() + 2, 16, kv_heads, hd, CacheDtype::BF16);
        let fg = factors.gpu();
        // Into an fp8 full cache: refused (the GPU scatters bf16 rows), nothing written.
        if hd % 8 == 0 {
            let mut fp8_dense = gpu
                .alloc_kv_cache(&dense.with_dtype(CacheDtype::Fp8))
                .unwrap();
            let err = gpu
                .reconstruct_kv(
                    &cache_g,
                    &fg,
                    &dims,
                    &rope,
                    table,
                    len,
                    &mut fp8_dense,
                    &dense_table,
                )
                .unwrap_err();
            println!("{label}: reconstruct_kv into fp8 refused: {err}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn fp8_latent_block_ops_match_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(63);
    let (heads, kv_heads, hd) = (12, 2, 128);
    // Key rows of 136 bytes (68 words: not a multiple of 8, so the row kernels take their
    // word-by-word path) and value rows of 128 bytes (64 words: vectorised).
    let (ranks, vw) = (vec![64, 72], 128);
    let kw = 136;
    let dims = dims_of(heads, kv_heads, hd);
    let width = dims.q_size() + kw + vw;
    let num_blocks = 96;
    let spec = fp8_spec(&ranks, vw, num_blocks);
    let mut cache_c = cpu.alloc_kv_cache(&spec).unwrap();
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
    let compare = |name: &str, cache_c: &CpuCache, cache_g: &GpuCache| {
        assert_same_contents(
            name,
            &gpu_contents(&gpu, cache_g, true),
            &cpu_contents(&cpu, cache_c),
        )
    };
    compare("fp8 latent written", &cache_c, &cache_g);
    // Compaction: one kept list for the whole slot (key bytes, value bytes and position move
    // together), in a shuffled table.
    let mut blocks = all_blocks(num_blocks);
    blocks.shuffle(&mut rng);
    for len in [1usize, 77, 513] {
        let table = &blocks[..len.div_ceil(16)];
        let keep = vec![random_subset(&mut rng, len, len / 2 + 1)];
        cpu.compact_kv(&mut cache_c, table, 16, len, &keep).unwrap();
        gpu.compact_kv(&mut cache_g, table, 16, len, &keep).unwrap();
        compare(&format!("fp8 latent compact len {len}"), &cache_c, &cache_g);
    }
    // Block copies move positions with the byte rows.
    let pairs: Vec<(u32, u32)> = (0..10).map(|i| (blocks[i], blocks[50 + i])).collect();
    cpu.copy_kv_blocks(&mut cache_c, &pairs).unwrap();
    gpu.copy_kv_blocks(&mut cache_g, &pairs).unwrap();
    compare("fp8 latent copy_kv_blocks", &cache_c, &cache_g);
    // Scatter of fresh rows (the GPU takes them as raw words, the CPU as f32 it rounds), then
    // the gather they round-trip through.
    let len: usize = 300;
    let table = &blocks[20..20 + len.div_ceil(16)];
    let keys = rand_host(&mut rng, vec![len, kw], 2.0);
    let values = rand_host(&mut rng, vec![len, vw], 2.0);
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
    let words = KvRows {
        keys: gpu.upload(&encode_words(&keys)).unwrap(),
        values: gpu.upload(&encode_words(&values)).unwrap(),
        positions: positions.clone(),
    };
    gpu.scatter_kv(&mut cache_g, table, 16, &words).unwrap();
    compare("fp8 latent scatter_kv", &cache_c, &cache_g);
    let gathered = gpu.gather_kv(&cache_g, table, 16, len).unwrap();
    assert_eq!(gathered.positions, positions);
    assert_eq!(gathered.keys.shape(), &[len, kw / 2]);
    // Scattering what was gathered changes nothing (preemption's round trip).
    gpu.scatter_kv(&mut cache_g, table, 16, &gathered).unwrap();
    compare("fp8 latent gather/scatter", &cache_c, &cache_g);
    // Refused, writing nothing: rows without their positions, and element-wide (bf16-shaped)
    // rows.
    let no_positions = KvRows {
        keys: gpu.upload(&encode_words(&keys)).unwrap(),
        values: gpu.upload(&encode_words(&values)).unwrap(),
        positions: Vec::new(),
    };
    assert!(gpu
        .scatter_kv(&mut cache_g, table, 16, &no_positions)
        .is_err());
    let elementwise = KvRows {
        keys: gpu.upload(&keys).unwrap(),
        values: gpu.upload(&values).unwrap(),
        positions: positions.clone(),
    };
    assert!(gpu
        .scatter_kv(&mut cache_g, table, 16, &elementwise)
        .is_err());
    compare("fp8 latent after refused scatters", &cache_c, &cache_g);
    println!("fp8 latent compaction, copies, gather/scatter: exact");
}

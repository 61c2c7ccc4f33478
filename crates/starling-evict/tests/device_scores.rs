//! `Backend::key_scores` (scores computed where the cache lives) against this crate's scorers of
//! the same names, on the CPU backend: read keys → split heads → `KeyDiff`/`KNorm` must give
//! exactly the scores `CpuBackend::key_scores` gives. The CPU reference does the same f32
//! operations in the same order, so the comparison is bit for bit; a change to either definition
//! fails here (device kernels are compared with the CPU reference, with a tolerance, in
//! starling-cuda's parity tests).

use rand::{seq::SliceRandom, Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use starling_backend::cpu::{CpuBackend, CpuKvCache};
use starling_backend::{AttentionDims, HostTensor, KeyScoreKind, KvCacheOps, KvCacheSpec};
use starling_evict::scorer::{KNorm, KeyDiff};
use starling_evict::{split_heads, HeadKeys, ScoreInput, Scorer};
use starling_kv::CacheDtype;

/// A cache of random keys around a per-channel offset (keys share a mean direction, as real
/// ones do), with every 11th slot a zero key, and a shuffled block table for `len` tokens.
fn random_sequence(rng: &mut ChaCha8Rng, spec: &KvCacheSpec, len: usize) -> (CpuKvCache, Vec<u32>) {
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
    let offset: Vec<f32> = (0..kv).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut data = vec![0.0f32; n * width];
    for (s, row) in data.chunks_exact_mut(width).enumerate() {
        for i in 0..kv {
            row[kv + i] = if s % 11 == 3 {
                0.0
            } else {
                rng.gen_range(-2.0..2.0) + offset[i]
            };
            row[2 * kv + i] = rng.gen_range(-1.0..1.0);
        }
    }
    let mut cache = CpuKvCache::new(spec.clone()).unwrap();
    let qkv = HostTensor::new(vec![n, width], data).unwrap();
    cache
        .write(&qkv, &dims, &(0..n as u32).collect::<Vec<_>>())
        .unwrap();
    let mut blocks: Vec<u32> = (0..spec.num_blocks as u32).collect();
    blocks.shuffle(rng);
    blocks.truncate(len.div_ceil(spec.block_size_tokens));
    (cache, blocks)
}

/// Asserts that head `h`'s row of the backend's `[heads, len]` scores equals what `scorer` gives
/// for `input`, bit for bit (so NaN or a -0.0 would show).
fn assert_head_equals(
    device: &HostTensor,
    scorer: &dyn Scorer,
    input: &ScoreInput<'_>,
    what: &str,
) {
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let len = device.shape()[1];
    let h = input.kv_head;
    let want = scorer.score(input).unwrap();
    let got = &device.data()[h * len..(h + 1) * len];
    assert_eq!(
        bits(got),
        bits(&want),
        "{what} head {h}: {got:?} vs {want:?}"
    );
}

#[test]
fn cpu_key_scores_equal_the_evict_scorers_bit_for_bit() {
    let backend = CpuBackend::new();
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    // (KV heads, head_dim, tokens): GQA- and MHA-like head counts, partial last blocks, one token.
    for (nkv, hd, len) in [(2, 64, 301), (8, 128, 77), (12, 16, 1), (3, 5, 40)] {
        let spec = KvCacheSpec::full(40, 8, nkv, hd, CacheDtype::F32);
        let (cache, table) = random_sequence(&mut rng, &spec, len);
        let keys = backend.read_keys(&cache, &table, 8, len).unwrap();
        let heads = split_heads(keys.data(), nkv, hd).unwrap();
        let scorers: [(KeyScoreKind, &dyn Scorer); 2] = [
            (KeyScoreKind::KeyDiff, &KeyDiff),
            (KeyScoreKind::KNorm, &KNorm),
        ];
        for (kind, scorer) in scorers {
            let device = backend.key_scores(&cache, &table, 8, len, kind).unwrap();
            assert_eq!(device.shape(), &[nkv, len]);
            for (h, head_keys) in heads.iter().enumerate() {
                let input = ScoreInput {
                    keys: HeadKeys::new(head_keys, hd).unwrap(),
                    queries: None,
                    layer: 0,
                    kv_head: h,
                };
                assert_head_equals(
                    &device,
                    scorer,
                    &input,
                    &format!("{kind:?} {nkv}x{hd} len {len}"),
                );
            }
        }
    }
}

/// `Backend::window_scores` on the CPU against the SnapKV and TOVA scorers, bit for bit: the
/// backend takes the queries as the model captures them (`[window, all query heads]`), the
/// scorers per KV head (`[window, group, head_dim]`).
#[test]
fn cpu_window_scores_equal_snapkv_and_tova_bit_for_bit() {
    use starling_backend::WindowScoreSpec;
    use starling_evict::scorer::{SnapKv, Tova};
    use starling_evict::WindowQueries;

    let backend = CpuBackend::new();
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    // (KV heads, group, head_dim, tokens, window): GQA and MHA groups, windows of one token, of
    // the whole sequence, and in between.
    for (nkv, group, hd, len, window) in [
        (2, 3, 16, 200, 32),
        (1, 1, 8, 40, 40),
        (3, 2, 12, 77, 1),
        (2, 6, 32, 301, 9),
    ] {
        let spec = KvCacheSpec::full(40, 8, nkv, hd, CacheDtype::F32);
        let (cache, table) = random_sequence(&mut rng, &spec, len);
        let width = nkv * group * hd;
        let q: Vec<f32> = (0..window * width)
            .map(|_| rng.gen_range(-3.0..3.0))
            .collect();
        let queries = HostTensor::new(vec![window, width], q).unwrap();
        let keys = backend.read_keys(&cache, &table, 8, len).unwrap();
        let heads = split_heads(keys.data(), nkv, hd).unwrap();
        let snapkv = SnapKv::default();
        let cases: [(usize, &dyn Scorer); 2] = [(snapkv.pool_kernel_tokens, &snapkv), (1, &Tova)];
        for (pool, scorer) in cases {
            if scorer.name() == "tova" && window != 1 {
                continue;
            }
            let score_spec = WindowScoreSpec {
                group,
                scale: 1.0 / (hd as f32).sqrt(),
                pool_kernel_tokens: pool,
            };
            let device = backend
                .window_scores(&cache, &table, 8, len, &queries, &score_spec)
                .unwrap();
            assert_eq!(device.shape(), &[nkv, len]);
            for (h, head_keys) in heads.iter().enumerate() {
                let per_head: Vec<f32> = queries
                    .data()
                    .chunks_exact(width)
                    .flat_map(|row| row[h * group * hd..(h + 1) * group * hd].iter().copied())
                    .collect();
                let input = ScoreInput {
                    keys: HeadKeys::new(head_keys, hd).unwrap(),
                    queries: Some(WindowQueries::new(&per_head, window, group, hd).unwrap()),
                    layer: 0,
                    kv_head: h,
                };
                let what = format!(
                    "{} {nkv}x{hd} group {group} len {len} window {window}",
                    scorer.name()
                );
                assert_head_equals(&device, scorer, &input, &what);
            }
        }
    }
}

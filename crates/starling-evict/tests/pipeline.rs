//! The whole eviction step on the CPU backend, as the engine will run it for one layer:
//! read keys → score each KV head → select → compact → shrink the block table. Checks that the
//! freed tail blocks return to the pool and that paged attention over the compacted cache equals
//! attention over exactly the kept tokens of each head.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use starling_backend::cpu::CpuBackend;
use starling_backend::{
    AttentionDims, BackendCore, BatchMeta, HostTensor, KvCacheOps, KvCacheSpec, ModelOps,
    SeqBatchMeta,
};
use starling_evict::{
    scorer_for, select_keep, split_heads, CompressionConfig, HeadKeys, ScoreInput,
};
use starling_kv::CacheDtype;
use starling_kv::{KvCacheManager, SeqId};

const BLOCK_TOKENS: usize = 4;
const DIMS: AttentionDims = AttentionDims {
    cache_group: 0,
    window_tokens: None,
    num_heads: 4,
    num_kv_heads: 2,
    head_dim: 8,
    scale: 0.353_553_38, // 1 / sqrt(8)
};

#[test]
fn keydiff_eviction_frees_blocks_and_attention_reads_only_kept_tokens() {
    let backend = CpuBackend::new();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut manager = KvCacheManager::new(16, BLOCK_TOKENS).unwrap();
    let seq = SeqId(1);
    let other = SeqId(2);
    let n = 30;
    manager.allocate_slots(other, 5).unwrap();
    manager.allocate_slots(seq, n).unwrap();
    let spec = KvCacheSpec::full(
        16,
        BLOCK_TOKENS,
        DIMS.num_kv_heads,
        DIMS.head_dim,
        CacheDtype::F32,
    );
    let mut cache = backend.alloc_kv_cache(&spec).unwrap();
    let random_rows = |rng: &mut ChaCha8Rng, rows: usize| {
        let data = (0..rows * DIMS.qkv_size())
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        HostTensor::new(vec![rows, DIMS.qkv_size()], data).unwrap()
    };
    let other_slots = manager.slot_mapping(other, 0..5).unwrap();
    let slots = manager.slot_mapping(seq, 0..n).unwrap();
    cache
        .write(&random_rows(&mut rng, 5), &DIMS, &other_slots)
        .unwrap();
    cache
        .write(&random_rows(&mut rng, n), &DIMS, &slots)
        .unwrap();
    let original = cache.clone();

    let config = CompressionConfig::from_json(
        r#"{"method":"keydiff","ratio":0.5,"sink_tokens":2,"window_tokens":4}"#,
    )
    .unwrap();
    let table: Vec<u32> = manager
        .table(seq)
        .unwrap()
        .block_ids()
        .iter()
        .map(|b| b.0)
        .collect();
    let keys = backend.read_keys(&cache, &table, BLOCK_TOKENS, n).unwrap();
    let scorer = scorer_for(&config).unwrap();
    let heads = split_heads(keys.data(), DIMS.num_kv_heads, DIMS.head_dim).unwrap();
    let scores: Vec<Vec<f32>> = heads
        .iter()
        .enumerate()
        .map(|(kv_head, k)| {
            let input = ScoreInput {
                keys: HeadKeys::new(k, DIMS.head_dim).unwrap(),
                queries: None,
                layer: 0,
                kv_head,
            };
            scorer.score(&input).unwrap()
        })
        .collect();
    // Protected 2 + 4 = 6; half of the other 24 evicted → 18 kept, in 5 blocks instead of 8.
    let keep_tokens = config.keep_tokens(n);
    assert_eq!(keep_tokens, 18);
    let keep = select_keep(&scores, n, keep_tokens, 2, 4).unwrap();
    assert_ne!(
        keep[0], keep[1],
        "heads should choose different tokens here"
    );
    backend
        .compact_kv(&mut cache, &table, BLOCK_TOKENS, n, &keep)
        .unwrap();
    let free_before = manager.num_free_blocks();
    assert_eq!(manager.shrink_physical(seq, keep_tokens).unwrap(), 3);
    assert_eq!(manager.num_free_blocks(), free_before + 3);
    manager.check_invariants().unwrap();
    let t = manager.table(seq).unwrap();
    assert_eq!(
        (t.logical_len_tokens(), t.physical_len_tokens()),
        (n, keep_tokens)
    );

    // The other sequence's K/V are untouched.
    for &s in &other_slots {
        for h in 0..DIMS.num_kv_heads {
            assert_eq!(cache.key(s as usize, h), original.key(s as usize, h));
            assert_eq!(cache.value(s as usize, h), original.value(s as usize, h));
        }
    }

    // One decode-style query row attending over the compacted sequence.
    let qkv = random_rows(&mut rng, 1);
    let table: Vec<u32> = t.block_ids().iter().map(|b| b.0).collect();
    let meta = BatchMeta {
        cache_groups: Vec::new(),
        positions: vec![n as u32],
        slot_mapping: vec![0],
        seqs: vec![SeqBatchMeta {
            query_start: 0,
            query_len: 1,
            context_len_tokens: keep_tokens,
            block_table: table,
        }],
        logits_rows: vec![0],
        block_size_tokens: BLOCK_TOKENS,
    };
    let batch = backend.prepare_batch(&meta, 16).unwrap();
    let out = backend
        .paged_attention(&qkv, &cache, &DIMS, &batch)
        .unwrap();
    let hd = DIMS.head_dim;
    let group = DIMS.num_heads / DIMS.num_kv_heads;
    for head in 0..DIMS.num_heads {
        let kv_head = head / group;
        let q = &qkv.data()[head * hd..(head + 1) * hd];
        let logits: Vec<f32> = keep[kv_head]
            .iter()
            .map(|&i| {
                let k = original.key(slots[i as usize] as usize, kv_head);
                q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * DIMS.scale
            })
            .collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let denom: f32 = logits.iter().map(|l| (l - max).exp()).sum();
        let mut want = vec![0.0f32; hd];
        for (&i, l) in keep[kv_head].iter().zip(&logits) {
            let v = original.value(slots[i as usize] as usize, kv_head);
            for (w, x) in want.iter_mut().zip(v) {
                *w += (l - max).exp() / denom * x;
            }
        }
        let got = &out.data()[head * hd..(head + 1) * hd];
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "head {head}: {got:?} vs {want:?}");
        }
    }
}

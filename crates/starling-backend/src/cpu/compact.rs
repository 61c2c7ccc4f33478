//! Token-eviction compaction of one sequence's paged K/V (CPU reference) and the key read-back
//! that scorers need.
//!
//! Compaction moves, for every KV head independently, the kept rows to the front of the
//! sequence's physical slots: physical index `i` of head `h` receives the `i`-th kept row of head
//! `h`. Kept indices are ascending, so physical order stays chronological (attention relies on
//! it). Slots past the kept count keep stale data; the caller shrinks the block table so they are
//! no longer read and its tail blocks return to the pool.

use super::attention::CpuKvCache;
use super::kv_checks::{check_compaction, physical_slots};
use crate::{AttentionDims, BackendError, HostTensor};

/// Compacts one sequence's K and V in one layer: physical index `i` of head `h` gets the `i`-th
/// kept row of head `h` (see the module docs). Validates everything before moving anything, so
/// an error leaves the cache untouched.
pub fn compact_kv(
    cache: &mut CpuKvCache,
    block_table: &[u32],
    block_size_tokens: usize,
    physical_len_tokens: usize,
    keep: &[Vec<u32>],
) -> Result<(), BackendError> {
    let spec = *cache.spec();
    let count = check_compaction(
        &spec,
        block_table,
        block_size_tokens,
        physical_len_tokens,
        keep,
    )?;
    let slots = physical_slots(
        &spec,
        block_table,
        block_size_tokens,
        physical_len_tokens,
        "compact_kv",
    )?;
    let (hd, nkv) = (spec.head_dim, spec.num_kv_heads);
    // Gather into a fused `[q | k | v]` scratch so the scatter is the cache's own write path;
    // a one-query-head-per-KV-head geometry keeps the unused Q part as small as the K part.
    let dims = AttentionDims {
        num_heads: nkv,
        num_kv_heads: nkv,
        head_dim: hd,
        scale: 1.0,
    };
    let (q_size, kv_size, width) = (dims.q_size(), dims.kv_size(), dims.qkv_size());
    let mut scratch = vec![0.0f32; count * width];
    for (i, row) in scratch.chunks_exact_mut(width).enumerate() {
        for (h, indices) in keep.iter().enumerate() {
            let src = slots[indices[i] as usize] as usize;
            let k_at = q_size + h * hd;
            let v_at = q_size + kv_size + h * hd;
            row[k_at..k_at + hd].copy_from_slice(cache.key(src, h));
            row[v_at..v_at + hd].copy_from_slice(cache.value(src, h));
        }
    }
    let scratch = HostTensor::new(vec![count, width], scratch)?;
    cache.write(&scratch, &dims, &slots[..count])
}

/// One sequence's keys of one layer, `[len_tokens, num_kv_heads, head_dim]`, in physical order.
pub fn read_keys(
    cache: &CpuKvCache,
    block_table: &[u32],
    block_size_tokens: usize,
    len_tokens: usize,
) -> Result<HostTensor, BackendError> {
    let spec = cache.spec();
    let slots = physical_slots(
        spec,
        block_table,
        block_size_tokens,
        len_tokens,
        "read_keys",
    )?;
    let mut data = Vec::with_capacity(len_tokens * spec.num_kv_heads * spec.head_dim);
    for &slot in &slots {
        for h in 0..spec.num_kv_heads {
            data.extend_from_slice(cache.key(slot as usize, h));
        }
    }
    HostTensor::new(vec![len_tokens, spec.num_kv_heads, spec.head_dim], data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KvCacheSpec;
    use rand::{seq::SliceRandom, Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const SPEC: KvCacheSpec = KvCacheSpec {
        num_blocks: 12,
        block_size_tokens: 4,
        num_kv_heads: 3,
        head_dim: 5,
    };

    /// A cache whose every slot holds distinct random K and V.
    fn random_cache(rng: &mut ChaCha8Rng) -> CpuKvCache {
        let mut cache = CpuKvCache::new(SPEC).unwrap();
        let dims = AttentionDims {
            num_heads: SPEC.num_kv_heads,
            num_kv_heads: SPEC.num_kv_heads,
            head_dim: SPEC.head_dim,
            scale: 1.0,
        };
        let n = SPEC.num_slots();
        let data = (0..n * dims.qkv_size())
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let qkv = HostTensor::new(vec![n, dims.qkv_size()], data).unwrap();
        let slots: Vec<u32> = (0..n as u32).collect();
        cache.write(&qkv, &dims, &slots).unwrap();
        cache
    }

    fn slot(table: &[u32], i: usize) -> usize {
        table[i / SPEC.block_size_tokens] as usize * SPEC.block_size_tokens
            + i % SPEC.block_size_tokens
    }

    /// Random kept subsets (same count per head, different sets) through random block tables:
    /// the front of each head holds exactly its kept rows in order, and no slot outside the
    /// sequence's first `count` physical slots changes.
    #[test]
    fn round_trip_keeps_exactly_the_selected_rows() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for _ in 0..40 {
            let before = random_cache(&mut rng);
            let mut cache = before.clone();
            let mut blocks: Vec<u32> = (0..SPEC.num_blocks as u32).collect();
            blocks.shuffle(&mut rng);
            let num_blocks = rng.gen_range(1..=6);
            let table = &blocks[..num_blocks];
            let len = rng.gen_range(1..=num_blocks * SPEC.block_size_tokens);
            let count = rng.gen_range(0..=len);
            let keep: Vec<Vec<u32>> = (0..SPEC.num_kv_heads)
                .map(|_| {
                    let mut all: Vec<u32> = (0..len as u32).collect();
                    all.shuffle(&mut rng);
                    let mut kept = all[..count].to_vec();
                    kept.sort_unstable();
                    kept
                })
                .collect();
            compact_kv(&mut cache, table, SPEC.block_size_tokens, len, &keep).unwrap();
            let written: Vec<usize> = (0..count).map(|i| slot(table, i)).collect();
            for (h, kept) in keep.iter().enumerate() {
                for (i, &src) in kept.iter().enumerate() {
                    let (dst, src) = (slot(table, i), slot(table, src as usize));
                    assert_eq!(cache.key(dst, h), before.key(src, h));
                    assert_eq!(cache.value(dst, h), before.value(src, h));
                }
                for s in (0..SPEC.num_slots()).filter(|s| !written.contains(s)) {
                    assert_eq!(cache.key(s, h), before.key(s, h), "slot {s} changed");
                    assert_eq!(cache.value(s, h), before.value(s, h), "slot {s} changed");
                }
            }
        }
    }

    #[test]
    fn keep_all_is_bit_identical() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let before = random_cache(&mut rng);
        let mut cache = before.clone();
        let table = [7u32, 2, 10];
        let len = 11;
        let keep = vec![(0..len as u32).collect::<Vec<_>>(); SPEC.num_kv_heads];
        compact_kv(&mut cache, &table, SPEC.block_size_tokens, len, &keep).unwrap();
        for s in 0..SPEC.num_slots() {
            for h in 0..SPEC.num_kv_heads {
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(cache.key(s, h)), bits(before.key(s, h)));
                assert_eq!(bits(cache.value(s, h)), bits(before.value(s, h)));
            }
        }
    }

    #[test]
    fn bad_inputs_are_errors_and_leave_the_cache_untouched() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let before = random_cache(&mut rng);
        let mut cache = before.clone();
        let table = [1u32, 4];
        let bs = SPEC.block_size_tokens;
        let ok = vec![vec![0u32, 2]; SPEC.num_kv_heads];
        let mut unsorted = ok.clone();
        unsorted[1] = vec![2, 0];
        let mut duplicate = ok.clone();
        duplicate[2] = vec![2, 2];
        let mut out_of_range = ok.clone();
        out_of_range[0] = vec![0, 6];
        let mut unequal = ok.clone();
        unequal[1] = vec![0];
        // (block table, block size, physical length, kept indices per head)
        type Case<'a> = (&'a [u32], usize, usize, Vec<Vec<u32>>);
        let cases: Vec<Case> = vec![
            (&table, bs, 6, unsorted),
            (&table, bs, 6, duplicate),
            (&table, bs, 6, out_of_range),
            (&table, bs, 6, unequal),
            (&table, bs, 6, ok[..2].to_vec()),
            (&table, bs, 9, ok.clone()),
            (&table, bs + 1, 6, ok.clone()),
            (&[1, 99], bs, 6, ok.clone()),
            (&[4, 4], bs, 6, ok.clone()),
        ];
        for (table, bs, len, keep) in cases {
            assert!(
                compact_kv(&mut cache, table, bs, len, &keep).is_err(),
                "{table:?} {bs} {len} {keep:?}"
            );
        }
        for s in 0..SPEC.num_slots() {
            for h in 0..SPEC.num_kv_heads {
                assert_eq!(cache.key(s, h), before.key(s, h));
            }
        }
        assert!(read_keys(&cache, &[1, 99], bs, 5).is_err());
        assert!(read_keys(&cache, &[1], bs, 5).is_err());
    }

    #[test]
    fn read_keys_follows_the_block_table() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let cache = random_cache(&mut rng);
        let table = [9u32, 0, 5];
        let len = 10;
        let keys = read_keys(&cache, &table, SPEC.block_size_tokens, len).unwrap();
        assert_eq!(keys.shape(), &[len, SPEC.num_kv_heads, SPEC.head_dim]);
        let hd = SPEC.head_dim;
        for i in 0..len {
            for h in 0..SPEC.num_kv_heads {
                let at = (i * SPEC.num_kv_heads + h) * hd;
                assert_eq!(&keys.data()[at..at + hd], cache.key(slot(&table, i), h));
            }
        }
    }
}

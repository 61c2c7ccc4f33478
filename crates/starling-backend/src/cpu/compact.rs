//! Token-eviction compaction of one sequence's paged cache (CPU reference) and the key read-back
//! that scorers need.
//!
//! Compaction moves the kept rows to the front of the sequence's physical slots. In a full
//! layer every KV head moves independently: physical index `i` of head `h` receives the `i`-th
//! kept row of head `h`. In a latent layer (one list) whole slots move: key latents, value
//! latent and position together. Kept indices are ascending, so physical order stays
//! chronological (attention relies on it). Slots past the kept count keep stale data; the
//! caller shrinks the block table so they are no longer read and its tail blocks return to the
//! pool.

use super::kv_cache::CpuKvCache;
use super::kv_checks::{check_compaction, full_layer_slots, physical_slots};
use crate::{BackendError, HostTensor};

/// Compacts one sequence's cache rows in one layer (see the module docs). Validates everything
/// before moving anything, so an error leaves the cache untouched.
pub fn compact_kv(
    cache: &mut CpuKvCache,
    block_table: &[u32],
    block_size_tokens: usize,
    physical_len_tokens: usize,
    keep: &[Vec<u32>],
) -> Result<(), BackendError> {
    let spec = cache.spec().clone();
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
    // Each list moves one segment of both planes: a head of a full layer, the whole row of a
    // latent one.
    let (kw, vw) = spec.plane_widths();
    let lists = keep.len().max(1);
    let (k_seg, v_seg) = (kw / lists, vw / lists);
    let mut k_rows = vec![0.0f32; count * kw];
    let mut v_rows = vec![0.0f32; count * vw];
    let mut positions = vec![0u32; count];
    for i in 0..count {
        for (h, indices) in keep.iter().enumerate() {
            let src = slots[indices[i] as usize] as usize;
            k_rows[i * kw + h * k_seg..i * kw + (h + 1) * k_seg]
                .copy_from_slice(&cache.key_row(src)[h * k_seg..(h + 1) * k_seg]);
            v_rows[i * vw + h * v_seg..i * vw + (h + 1) * v_seg]
                .copy_from_slice(&cache.value_row(src)[h * v_seg..(h + 1) * v_seg]);
            positions[i] = cache.position(src);
        }
    }
    for (i, &slot) in slots[..count].iter().enumerate() {
        cache.set_slot(
            slot as usize,
            &k_rows[i * kw..(i + 1) * kw],
            &v_rows[i * vw..(i + 1) * vw],
            positions[i],
        );
    }
    Ok(())
}

/// One sequence's keys of one full layer, `[len_tokens, num_kv_heads, head_dim]` in physical
/// order.
pub fn read_keys(
    cache: &CpuKvCache,
    block_table: &[u32],
    block_size_tokens: usize,
    len_tokens: usize,
) -> Result<HostTensor, BackendError> {
    let ((heads, head_dim), slots) = full_layer_slots(
        cache.spec(),
        block_table,
        block_size_tokens,
        len_tokens,
        "read_keys",
    )?;
    let mut data = Vec::with_capacity(len_tokens * heads * head_dim);
    for &slot in &slots {
        data.extend_from_slice(cache.key_row(slot as usize));
    }
    HostTensor::new(vec![len_tokens, heads, head_dim], data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_geometry::Geometry;
    use crate::AttentionDims;
    use rand::{seq::SliceRandom, Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const SPEC: Geometry = Geometry {
        num_blocks: 12,
        block_size_tokens: 4,
        num_kv_heads: 3,
        head_dim: 5,
    };

    /// A cache whose every slot holds distinct random K and V.
    fn random_cache(rng: &mut ChaCha8Rng) -> CpuKvCache {
        let mut cache = CpuKvCache::new(SPEC.spec()).unwrap();
        let dims = AttentionDims {
            cache_group: 0,
            window_tokens: None,
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

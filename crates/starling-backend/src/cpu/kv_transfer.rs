//! Moving K/V between blocks and between the paged cache and contiguous tensors (CPU
//! reference): whole-block copies (copy-on-write, forking, swapping) and one sequence's K/V
//! gathered into `[len, num_kv_heads * head_dim]` tensors or scattered back from them.

use super::kv_cache::CpuKvCache;
use super::kv_checks::{check_block_copies, check_distinct_blocks, physical_slots, scatter_len};
use crate::{BackendError, HostTensor, KvRows};

/// Copies whole blocks (both planes, positions) for each `(src, dst)` pair.
pub fn copy_kv_blocks(cache: &mut CpuKvCache, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
    check_block_copies(cache.spec().num_blocks, pairs)?;
    for &(src, dst) in pairs {
        cache.copy_block(src as usize, dst as usize);
    }
    Ok(())
}

/// One sequence's rows (both planes, and a latent layer's positions) in physical order.
pub fn gather_kv(
    cache: &CpuKvCache,
    block_table: &[u32],
    block_size_tokens: usize,
    len_tokens: usize,
) -> Result<KvRows<HostTensor>, BackendError> {
    let spec = cache.spec();
    let slots = physical_slots(
        spec,
        block_table,
        block_size_tokens,
        len_tokens,
        "gather_kv",
    )?;
    let (kw, vw) = spec.plane_widths();
    let mut k = Vec::with_capacity(len_tokens * kw);
    let mut v = Vec::with_capacity(len_tokens * vw);
    for &slot in &slots {
        k.extend_from_slice(cache.key_row(slot as usize));
        v.extend_from_slice(cache.value_row(slot as usize));
    }
    let positions = if spec.is_latent() {
        slots.iter().map(|&s| cache.position(s as usize)).collect()
    } else {
        Vec::new()
    };
    Ok(KvRows {
        keys: HostTensor::new(vec![len_tokens, kw], k)?,
        values: HostTensor::new(vec![len_tokens, vw], v)?,
        positions,
    })
}

/// Writes `rows` to physical indices `0..len` of one sequence (the inverse of [`gather_kv`]).
pub fn scatter_kv(
    cache: &mut CpuKvCache,
    block_table: &[u32],
    block_size_tokens: usize,
    rows: &KvRows<HostTensor>,
) -> Result<(), BackendError> {
    let spec = cache.spec().clone();
    let len_tokens = scatter_len(
        &spec,
        rows.keys.shape(),
        rows.values.shape(),
        rows.positions.len(),
    )?;
    let slots = physical_slots(
        &spec,
        block_table,
        block_size_tokens,
        len_tokens,
        "scatter_kv",
    )?;
    check_distinct_blocks(block_table, block_size_tokens, len_tokens, "scatter_kv")?;
    let (kw, vw) = spec.plane_widths();
    for (i, &slot) in slots.iter().enumerate() {
        cache.set_slot(
            slot as usize,
            &rows.keys.data()[i * kw..(i + 1) * kw],
            &rows.values.data()[i * vw..(i + 1) * vw],
            rows.positions.get(i).copied().unwrap_or(0),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_geometry::Geometry;
    use crate::AttentionDims;

    const SPEC: Geometry = Geometry {
        num_blocks: 6,
        block_size_tokens: 2,
        num_kv_heads: 2,
        head_dim: 3,
    };

    /// K of flat slot `s`, head `h`, element `e` is `100s + 10h + e`; V is its negation.
    fn labelled_cache() -> CpuKvCache {
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
        let (q, kv) = (dims.q_size(), dims.kv_size());
        let mut data = vec![0.0; n * dims.qkv_size()];
        for (s, row) in data.chunks_exact_mut(dims.qkv_size()).enumerate() {
            for i in 0..kv {
                let label = (100 * s + 10 * (i / SPEC.head_dim) + i % SPEC.head_dim) as f32;
                row[q + i] = label;
                row[q + kv + i] = -label;
            }
        }
        let qkv = HostTensor::new(vec![n, dims.qkv_size()], data).unwrap();
        cache
            .write(&qkv, &dims, &(0..n as u32).collect::<Vec<_>>())
            .unwrap();
        cache
    }

    fn k_label(cache: &CpuKvCache, slot: usize) -> f32 {
        cache.key(slot, 0)[0]
    }

    #[test]
    fn copy_kv_blocks_copies_whole_blocks() {
        let mut cache = labelled_cache();
        // Block b holds slots 2b and 2b+1.
        copy_kv_blocks(&mut cache, &[(1, 3), (1, 4), (0, 5)]).unwrap();
        let labels: Vec<f32> = (0..SPEC.num_slots()).map(|s| k_label(&cache, s)).collect();
        assert_eq!(
            labels,
            vec![0.0, 100.0, 200.0, 300.0, 400.0, 500.0, 200.0, 300.0, 200.0, 300.0, 0.0, 100.0]
        );
        // Every head and the values move too.
        assert_eq!(cache.key(7, 1), &[310.0, 311.0, 312.0]);
        assert_eq!(cache.value(11, 1), &[-110.0, -111.0, -112.0]);
    }

    #[test]
    fn invalid_copies_copy_nothing() {
        let mut cache = labelled_cache();
        assert!(copy_kv_blocks(&mut cache, &[(1, 3), (3, 4)]).is_err());
        assert!(copy_kv_blocks(&mut cache, &[(1, 3), (2, 6)]).is_err());
        for s in 0..SPEC.num_slots() {
            assert_eq!(k_label(&cache, s), 100.0 * s as f32);
        }
    }

    #[test]
    fn gather_kv_follows_the_block_table() {
        let cache = labelled_cache();
        let KvRows {
            keys: k, values: v, ..
        } = gather_kv(&cache, &[4, 1, 3], 2, 5).unwrap();
        assert_eq!(k.shape(), &[5, 6]);
        // Physical indices 0..5 live in slots 8, 9, 2, 3, 6.
        let firsts: Vec<f32> = k.data().chunks_exact(6).map(|r| r[0]).collect();
        assert_eq!(firsts, vec![800.0, 900.0, 200.0, 300.0, 600.0]);
        assert_eq!(
            &k.data()[6..12],
            &[900.0, 901.0, 902.0, 910.0, 911.0, 912.0]
        );
        assert_eq!(&v.data()[24..27], &[-600.0, -601.0, -602.0]);
        let empty = gather_kv(&cache, &[], 2, 0).unwrap();
        assert_eq!(empty.keys.shape(), &[0, 6]);
        assert!(empty.positions.is_empty());
        assert!(gather_kv(&cache, &[4, 1], 2, 5).is_err());
        assert!(gather_kv(&cache, &[4, 6], 2, 3).is_err());
    }

    #[test]
    fn scatter_kv_writes_exactly_the_sequence_slots() {
        let mut cache = labelled_cache();
        let rows = gather_kv(&cache, &[0, 1], 2, 3).unwrap();
        // Slots 0, 1, 2 (blocks 0 and 1) land in slots 10, 11, 6 (blocks 5 and 3).
        scatter_kv(&mut cache, &[5, 3], 2, &rows).unwrap();
        let labels: Vec<f32> = (0..SPEC.num_slots()).map(|s| k_label(&cache, s)).collect();
        assert_eq!(
            labels,
            vec![0.0, 100.0, 200.0, 300.0, 400.0, 500.0, 200.0, 700.0, 800.0, 900.0, 0.0, 100.0]
        );
        assert_eq!(cache.value(6, 1), &[-210.0, -211.0, -212.0]);
    }

    #[test]
    fn invalid_scatters_write_nothing() {
        let mut cache = labelled_cache();
        let rows = gather_kv(&cache, &[0, 1], 2, 3).unwrap();
        let with = |keys: HostTensor, values: HostTensor| KvRows {
            keys,
            values,
            positions: Vec::new(),
        };
        let short = with(rows.keys.clone(), HostTensor::zeros(vec![2, 6]));
        let narrow = with(HostTensor::zeros(vec![3, 5]), HostTensor::zeros(vec![3, 5]));
        let positioned = KvRows {
            positions: vec![0, 1, 2],
            ..with(rows.keys.clone(), rows.values.clone())
        };
        assert!(scatter_kv(&mut cache, &[5, 5], 2, &rows).is_err());
        assert!(scatter_kv(&mut cache, &[5], 2, &rows).is_err());
        assert!(scatter_kv(&mut cache, &[5, 3], 2, &short).is_err());
        assert!(scatter_kv(&mut cache, &[5, 3], 2, &narrow).is_err());
        assert!(scatter_kv(&mut cache, &[5, 3], 2, &positioned).is_err());
        assert!(scatter_kv(&mut cache, &[5, 3], 3, &rows).is_err());
        for s in 0..SPEC.num_slots() {
            assert_eq!(k_label(&cache, s), 100.0 * s as f32);
        }
    }
}

//! Causal attention over a full paged K/V cache, optionally limited to a sliding window (CPU
//! reference).

use rayon::prelude::*;

use super::kv_cache::CpuKvCache;
use super::matrix_dims;
use crate::{AttentionDims, BackendError, BatchMeta, HostTensor};

/// Causal paged attention over the batch; the CPU reference for the decode and prefill kernels.
/// A windowed layer (`dims.window_tokens`) sees, for a query in cache slot `i`, the slots
/// `i + 1 - window ..= i` (the sequence's earlier slots need not hold anything).
pub fn paged_attention(
    qkv: &HostTensor,
    cache: &CpuKvCache,
    dims: &AttentionDims,
    batch: &BatchMeta,
) -> Result<HostTensor, BackendError> {
    let (n, width) = matrix_dims(qkv, "attention input")?;
    if width != dims.qkv_size() || n != batch.num_tokens() {
        return Err(BackendError::Shape(format!(
            "attention: [{n}, {width}] for {} tokens of width {}",
            batch.num_tokens(),
            dims.qkv_size()
        )));
    }
    if cache.spec().full_heads() != Some((dims.num_kv_heads, dims.head_dim)) {
        return Err(BackendError::Shape(format!(
            "attention: {dims:?} over a cache of {:?}",
            cache.spec().layout
        )));
    }
    let hd = dims.head_dim;
    let group = dims.num_heads / dims.num_kv_heads.max(1);
    let bs = batch.block_size_tokens;
    // Row → (sequence, index of the row among the sequence's new tokens).
    let mut row_seq = Vec::with_capacity(n);
    let mut tables = Vec::with_capacity(batch.seqs.len());
    for (s, meta) in batch.seqs.iter().enumerate() {
        row_seq.extend((0..meta.query_len).map(|i| (s, i)));
        tables.push(batch.group_block_table(s, dims.cache_group)?);
    }
    let mut out = vec![0.0f32; n * dims.q_size()];
    out.par_chunks_mut(hd).enumerate().for_each_init(
        Vec::new,
        |scores: &mut Vec<f32>, (chunk, o)| {
            let (row, head) = (chunk / dims.num_heads, chunk % dims.num_heads);
            let (s, i) = row_seq[row];
            let meta = &batch.seqs[s];
            let visible = meta.context_len_tokens - meta.query_len + i + 1;
            let first = first_visible_key(visible, dims.window_tokens);
            let q = &qkv.data()[row * width + head * hd..row * width + (head + 1) * hd];
            let kv_head = head / group;
            let table = tables[s];
            let slot_of = |j: usize| table[j / bs] as usize * bs + j % bs;
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for j in first..visible {
                let k = cache.key(slot_of(j), kv_head);
                let dot: f32 = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * dims.scale;
                max = max.max(dot);
                scores.push(dot);
            }
            let mut denom = 0.0f32;
            for sc in scores.iter_mut() {
                *sc = (*sc - max).exp();
                denom += *sc;
            }
            for (j, p) in (first..visible).zip(scores.iter()) {
                let v = cache.value(slot_of(j), kv_head);
                let w = p / denom;
                for (acc, x) in o.iter_mut().zip(v) {
                    *acc += w * x;
                }
            }
        },
    );
    HostTensor::new(vec![n, dims.q_size()], out)
}

/// The first key a query seeing `visible` keys attends to: `visible - window` under a sliding
/// window, 0 without one.
pub fn first_visible_key(visible: usize, window_tokens: Option<usize>) -> usize {
    window_tokens.map_or(0, |w| visible.saturating_sub(w))
}

/// Naive dense causal attention (sliding-window when `dims` says so) over contiguous `[t, heads, head_dim]` Q, K, V of one sequence:
/// the reference the paged kernels are checked against.
pub fn dense_causal_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    num_tokens: usize,
    dims: &AttentionDims,
) -> Vec<f32> {
    let (hd, nh, nkv) = (dims.head_dim, dims.num_heads, dims.num_kv_heads);
    let group = nh / nkv;
    let mut out = vec![0.0f32; num_tokens * nh * hd];
    for t in 0..num_tokens {
        for h in 0..nh {
            let qv = &q[(t * nh + h) * hd..(t * nh + h + 1) * hd];
            let kvh = h / group;
            let first = first_visible_key(t + 1, dims.window_tokens);
            let scores: Vec<f32> = (first..=t)
                .map(|j| {
                    let kj = &k[(j * nkv + kvh) * hd..(j * nkv + kvh + 1) * hd];
                    qv.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * dims.scale
                })
                .collect();
            let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let denom: f32 = exps.iter().sum();
            let o = &mut out[(t * nh + h) * hd..(t * nh + h + 1) * hd];
            for (j, e) in (first..=t).zip(&exps) {
                let vj = &v[(j * nkv + kvh) * hd..(j * nkv + kvh + 1) * hd];
                for (acc, x) in o.iter_mut().zip(vj) {
                    *acc += e / denom * x;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KvCacheSpec, SeqBatchMeta};
    use rand::{seq::SliceRandom, Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use starling_kv::CacheDtype;

    /// Two sequences written in chunks through shuffled block tables; the paged result for every
    /// query row must equal dense causal attention over the same tokens.
    #[test]
    fn paged_equals_dense_reference_across_chunks_and_sequences() {
        // Full attention, and windows shorter than a block, than a chunk, than the sequences.
        for window_tokens in [None, Some(1), Some(3), Some(5), Some(9)] {
            paged_equals_dense_reference(window_tokens);
        }
    }

    fn paged_equals_dense_reference(window_tokens: Option<usize>) {
        let dims = AttentionDims {
            cache_group: 0,
            window_tokens,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            scale: 0.35,
        };
        let bs = 4;
        let spec = KvCacheSpec::full(16, bs, 2, 8, CacheDtype::F32);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut free: Vec<u32> = (0..16).collect();
        free.shuffle(&mut rng);
        let lens = [11usize, 6];
        let tables: Vec<Vec<u32>> = lens
            .iter()
            .map(|&l| (0..l.div_ceil(bs)).map(|_| free.pop().unwrap()).collect())
            .collect();
        let rows: Vec<Vec<f32>> = lens
            .iter()
            .map(|&l| {
                (0..l * dims.qkv_size())
                    .map(|_| rng.gen_range(-1.0..1.0))
                    .collect()
            })
            .collect();
        let mut cache = CpuKvCache::new(spec).unwrap();
        // Feed the sequences in two steps: chunks [0, 7) / [0, 6), then [7, 11) / nothing.
        let splits = [[7usize, 6], [11, 6]];
        let mut done = [0usize, 0];
        let mut last_out: Vec<Vec<f32>> = vec![vec![]; 2];
        for step in splits {
            let mut meta = BatchMeta {
                block_size_tokens: bs,
                ..Default::default()
            };
            let mut data = Vec::new();
            for s in 0..2 {
                let (from, to) = (done[s], step[s]);
                if from == to {
                    continue;
                }
                meta.seqs.push(SeqBatchMeta {
                    query_start: meta.positions.len(),
                    query_len: to - from,
                    context_len_tokens: to,
                    block_table: tables[s].clone(),
                });
                for t in from..to {
                    meta.positions.push(t as u32);
                    meta.slot_mapping
                        .push(tables[s][t / bs] * bs as u32 + (t % bs) as u32);
                    data.extend_from_slice(
                        &rows[s][t * dims.qkv_size()..(t + 1) * dims.qkv_size()],
                    );
                }
            }
            meta.validate(16).unwrap();
            let qkv = HostTensor::new(vec![meta.num_tokens(), dims.qkv_size()], data).unwrap();
            cache.write(&qkv, &dims, &meta.slot_mapping).unwrap();
            let out = paged_attention(&qkv, &cache, &dims, &meta).unwrap();
            for (i, sm) in meta.seqs.iter().enumerate() {
                let s = if meta.seqs.len() == 2 { i } else { 0 };
                let rows_out = &out.data()[sm.query_start * dims.q_size()
                    ..(sm.query_start + sm.query_len) * dims.q_size()];
                last_out[s].extend_from_slice(rows_out);
            }
            done = step;
        }
        for s in 0..2 {
            let l = lens[s];
            let (mut q, mut k, mut v) = (vec![], vec![], vec![]);
            for t in 0..l {
                let r = &rows[s][t * dims.qkv_size()..(t + 1) * dims.qkv_size()];
                q.extend_from_slice(&r[..dims.q_size()]);
                k.extend_from_slice(&r[dims.q_size()..dims.q_size() + dims.kv_size()]);
                v.extend_from_slice(&r[dims.q_size() + dims.kv_size()..]);
            }
            let want = dense_causal_attention(&q, &k, &v, l, &dims);
            assert_eq!(last_out[s].len(), want.len());
            for (a, b) in last_out[s].iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "window {window_tokens:?}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn write_rejects_out_of_range_slot() {
        let dims = AttentionDims {
            cache_group: 0,
            window_tokens: None,
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 2,
            scale: 1.0,
        };
        let spec = KvCacheSpec::full(1, 2, 1, 2, CacheDtype::F32);
        let mut cache = CpuKvCache::new(spec).unwrap();
        let qkv = HostTensor::zeros(vec![1, dims.qkv_size()]);
        assert!(cache.write(&qkv, &dims, &[2]).is_err());
    }
}

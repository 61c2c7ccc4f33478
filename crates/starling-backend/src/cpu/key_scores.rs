//! Eviction scores of one sequence's keys per KV head (CPU references of `Backend::key_scores`
//! and `Backend::window_scores`).
//!
//! The arithmetic is starling-evict's `KeyDiff`, `KNorm` and SnapKV/TOVA window scorers operation
//! for operation (same f32 sums in the same order), so on the CPU the two give bit-identical
//! scores (`starling-evict/tests/device_scores.rs` checks it); device kernels reduce in another
//! order and are compared with a tolerance.

use super::kv_cache::CpuKvCache;
use super::kv_checks::{check_window_scores, full_layer_slots, physical_slots};
use crate::{BackendError, HostTensor, KeyScoreKind, WindowScoreSpec};

/// Scores `[num_kv_heads, len_tokens]` of one sequence's keys, physical order (higher = keep).
pub fn key_scores(
    cache: &CpuKvCache,
    block_table: &[u32],
    block_size_tokens: usize,
    len_tokens: usize,
    kind: KeyScoreKind,
) -> Result<HostTensor, BackendError> {
    let ((heads, head_dim), slots) = full_layer_slots(
        cache.spec(),
        block_table,
        block_size_tokens,
        len_tokens,
        "key_scores",
    )?;
    let mut data = Vec::with_capacity(heads * len_tokens);
    for h in 0..heads {
        let rows: Vec<&[f32]> = slots.iter().map(|&s| cache.key(s as usize, h)).collect();
        match kind {
            KeyScoreKind::KNorm => data.extend(rows.iter().map(|k| -l2_norm(k))),
            KeyScoreKind::KeyDiff => data.extend(key_diff(&rows, head_dim)),
        }
    }
    HostTensor::new(vec![heads, len_tokens], data)
}

/// Observation-window scores `[num_kv_heads, len_tokens]` of one sequence (see
/// `Backend::window_scores`): O(window × group × len_tokens × head_dim) per KV head.
pub fn window_scores(
    cache: &CpuKvCache,
    block_table: &[u32],
    block_size_tokens: usize,
    len_tokens: usize,
    queries: &HostTensor,
    score: &WindowScoreSpec,
) -> Result<HostTensor, BackendError> {
    let spec = cache.spec();
    let window = check_window_scores(
        spec,
        block_table,
        block_size_tokens,
        len_tokens,
        queries,
        score,
    )?;
    let slots = physical_slots(
        spec,
        block_table,
        block_size_tokens,
        len_tokens,
        "window_scores",
    )?;
    let (num_kv_heads, hd) = spec.require_full("window_scores")?;
    let group = score.group;
    let row_width = num_kv_heads * group * hd;
    let n = len_tokens;
    let mut data = Vec::with_capacity(num_kv_heads * n);
    let mut logits = Vec::with_capacity(n);
    for h in 0..num_kv_heads {
        let rows: Vec<&[f32]> = slots.iter().map(|&s| cache.key(s as usize, h)).collect();
        let mut attention = vec![0.0f32; n];
        for j in 0..window {
            let visible = n - window + j + 1;
            let group_queries = &queries.data()[j * row_width + h * group * hd..][..group * hd];
            for q in group_queries.chunks_exact(hd) {
                logits.clear();
                logits.extend(rows[..visible].iter().map(|k| dot(q, k) * score.scale));
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let denom: f32 = logits.iter().map(|l| (l - max).exp()).sum();
                for (a, l) in attention.iter_mut().zip(&logits) {
                    *a += (l - max).exp() / denom;
                }
            }
        }
        let prefix = n - window;
        let half = score.pool_kernel_tokens / 2;
        data.extend((0..prefix).map(|i| {
            let (lo, hi) = (i.saturating_sub(half), (i + half + 1).min(prefix));
            attention[lo..hi]
                .iter()
                .copied()
                .fold(f32::NEG_INFINITY, f32::max)
        }));
        data.extend(std::iter::repeat_n(f32::INFINITY, window));
    }
    HostTensor::new(vec![num_kv_heads, n], data)
}

/// `−cos(k_i, m)`, `m` the mean of the unit keys (zero keys add nothing but count in the mean).
fn key_diff(rows: &[&[f32]], head_dim: usize) -> Vec<f32> {
    let mut mean = vec![0.0f32; head_dim];
    for k in rows {
        let norm = l2_norm(k);
        if norm > 0.0 {
            for (m, v) in mean.iter_mut().zip(*k) {
                *m += v / norm;
            }
        }
    }
    if !rows.is_empty() {
        mean.iter_mut().for_each(|m| *m /= rows.len() as f32);
    }
    let mean_norm = l2_norm(&mean);
    rows.iter()
        .map(|k| {
            let denom = l2_norm(k) * mean_norm;
            if denom > 0.0 {
                -dot(k, &mean) / denom
            } else {
                0.0
            }
        })
        .collect()
}

fn l2_norm(x: &[f32]) -> f32 {
    x.iter().map(|v| v * v).sum::<f32>().sqrt()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::test_geometry::Geometry;
    use crate::AttentionDims;

    const SPEC: Geometry = Geometry {
        num_blocks: 3,
        block_size_tokens: 2,
        num_kv_heads: 2,
        head_dim: 2,
    };

    /// A cache holding `keys[i]` (`[head 0 | head 1]`) at physical index `i` of table `[2, 0]`.
    fn cache_with(keys: &[[f32; 4]]) -> CpuKvCache {
        let mut cache = CpuKvCache::new(SPEC.spec()).unwrap();
        let dims = AttentionDims {
            cache_group: 0,
            window_tokens: None,
            num_heads: 2,
            num_kv_heads: 2,
            head_dim: 2,
            scale: 1.0,
        };
        // Fused rows [q(4) | k(4) | v(4)]; physical indices 0, 1, 2 are slots 4, 5, 0.
        let data = keys
            .iter()
            .flat_map(|k| [[0.0; 4], *k, [9.0; 4]].concat())
            .collect();
        let qkv = HostTensor::new(vec![keys.len(), 12], data).unwrap();
        cache.write(&qkv, &dims, &[4, 5, 0][..keys.len()]).unwrap();
        cache
    }

    fn assert_close(got: &HostTensor, want: &[f32]) {
        assert_eq!(got.shape(), &[2, want.len() / 2]);
        for (g, w) in got.data().iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{:?} vs {want:?}", got.data());
        }
    }

    #[test]
    fn hand_computed_scores() {
        // Head 0: (3, 0), (0, 2), (1, 1); head 1: (3, 4), (0, 1), (−6, 8).
        let cache = cache_with(&[
            [3.0, 0.0, 3.0, 4.0],
            [0.0, 2.0, 0.0, 1.0],
            [1.0, 1.0, -6.0, 8.0],
        ]);
        let knorm = key_scores(&cache, &[2, 0], 2, 3, KeyScoreKind::KNorm).unwrap();
        assert_close(
            &knorm,
            &[-3.0, -2.0, -std::f32::consts::SQRT_2, -5.0, -1.0, -10.0],
        );
        // Head 0: unit keys (1, 0), (0, 1), (1/√2, 1/√2) average to a (1, 1) direction: cosines
        // 1/√2, 1/√2, 1. Head 1: unit keys (0.6, 0.8), (0, 1), (−0.6, 0.8) average to (0, 0.867):
        // cosines 0.8, 1, 0.8.
        let keydiff = key_scores(&cache, &[2, 0], 2, 3, KeyScoreKind::KeyDiff).unwrap();
        let r = std::f32::consts::FRAC_1_SQRT_2;
        assert_close(&keydiff, &[-r, -r, -1.0, -0.8, -1.0, -0.8]);
    }

    #[test]
    fn window_scores_hand_computed() {
        // head_dim 2, scale 1. Head 0 keys (0, 0), (ln 3, 0), (0, 0); head 1 all zero. One window
        // query (group 1) at token 2 = (1, 0) for head 0, (5, 5) for head 1. Head 0 weights:
        // 1, 3, 1 over 5 → 0.2, 0.6 (window token → +∞); pool 3 over the two-token prefix gives
        // both 0.6. Head 1: uniform 1/3, so both 1/3.
        let l3 = 3.0f32.ln();
        let cache = cache_with(&[
            [0.0, 0.0, 0.0, 0.0],
            [l3, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
        ]);
        let q = HostTensor::new(vec![1, 4], vec![1.0, 0.0, 5.0, 5.0]).unwrap();
        let spec = |pool| WindowScoreSpec {
            group: 1,
            scale: 1.0,
            pool_kernel_tokens: pool,
        };
        let s = window_scores(&cache, &[2, 0], 2, 3, &q, &spec(1)).unwrap();
        let want = [0.2, 0.6, f32::INFINITY, 1.0 / 3.0, 1.0 / 3.0, f32::INFINITY];
        for (g, w) in s.data().iter().zip(want) {
            assert!(*g == w || (g - w).abs() < 1e-6, "{:?}", s.data());
        }
        let pooled = window_scores(&cache, &[2, 0], 2, 3, &q, &spec(3)).unwrap();
        assert!((pooled.data()[0] - 0.6).abs() < 1e-6, "{:?}", pooled.data());
        // Shapes and ranges are checked: a wider row, an even pool, a window past the sequence.
        let wide = HostTensor::new(vec![1, 6], vec![0.0; 6]).unwrap();
        assert!(window_scores(&cache, &[2, 0], 2, 3, &wide, &spec(1)).is_err());
        assert!(window_scores(&cache, &[2, 0], 2, 3, &q, &spec(2)).is_err());
        let long = HostTensor::new(vec![4, 4], vec![0.0; 16]).unwrap();
        assert!(window_scores(&cache, &[2, 0], 2, 3, &long, &spec(1)).is_err());
    }

    #[test]
    fn zero_keys_score_zero_and_count_in_the_mean() {
        // Head 0: (1, 0), (0, 0): mean (0.5, 0); the zero key has no direction → 0.
        // Head 1: all zero → mean 0 → every score 0.
        let cache = cache_with(&[[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]);
        let keydiff = key_scores(&cache, &[2, 0], 2, 2, KeyScoreKind::KeyDiff).unwrap();
        assert_close(&keydiff, &[-1.0, 0.0, 0.0, 0.0]);
        let empty = key_scores(&cache, &[2], 2, 0, KeyScoreKind::KeyDiff).unwrap();
        assert_eq!(empty.shape(), &[2, 0]);
        assert!(key_scores(&cache, &[2], 2, 3, KeyScoreKind::KNorm).is_err());
        assert!(key_scores(&cache, &[3], 2, 1, KeyScoreKind::KNorm).is_err());
    }
}

//! Token eviction inside the engine: when a request's cache holds more than its target, every
//! layer is scored per KV head, the survivors are compacted to the front of the request's blocks,
//! and the tail blocks go back to the pool (the scheduler's `shrink_physical`).
//!
//! The target is computed from the *logical* length (tokens the model has seen): a request at
//! ratio r keeps `keep_tokens(logical)`, so compressing again after more tokens arrive tops the
//! cache back down to the ratio instead of compounding it. A compression runs when the surplus
//! reaches `every_n_tokens` (during chunked prefill that is as blocks fill, so peak memory stays
//! bounded by target + one chunk) and once more when a prompt completes, so decoding starts
//! exactly at the target.

use starling_backend::{Backend, HostTensor, KeyScoreKind, KvCacheSpec};
use starling_evict::{
    scorer_for, select_keep, split_heads, CompressionConfig, CompressionMethod, HeadKeys,
    ScoreInput, Scorer, WindowQueries,
};
use starling_models::llama::{LlamaModel, QueryCapture};

use super::EngineError;

/// A request's eviction policy and its scorer.
pub(crate) struct SeqCompression {
    pub(crate) config: CompressionConfig,
    scorer: Box<dyn Scorer>,
}

impl SeqCompression {
    /// The policy of `config`; `None` when it never evicts (method `none` or ratio 0), so such
    /// requests take exactly the uncompressed path.
    pub(crate) fn new(config: &CompressionConfig) -> Option<Self> {
        scorer_for(config).map(|scorer| Self {
            config: config.clone(),
            scorer,
        })
    }

    /// Whether scoring needs the observation-window queries of the step (SnapKV).
    pub(crate) fn needs_queries(&self) -> bool {
        self.scorer.needs_queries()
    }

    /// The most slots a request that grows to `total_tokens` holds between compactions: its
    /// target at that length plus the surplus it may gather before the next compaction (less
    /// when the surplus could not arise). The transient prefill chunk is reserved by the
    /// scheduler once for all requests.
    pub(crate) fn peak_tokens(&self, total_tokens: usize) -> usize {
        let target = self.config.keep_tokens(total_tokens);
        (target + self.config.every_n_tokens).min(total_tokens)
    }

    /// The physical length to compress to after a step leaves the request with `logical` and
    /// `physical` tokens, or `None` when no compression is due. `prompt_completed` is true on
    /// the step that finished the prompt's prefill.
    pub(crate) fn due_target(
        &self,
        logical_tokens: usize,
        physical_tokens: usize,
        prompt_completed: bool,
    ) -> Option<usize> {
        let target = self.config.keep_tokens(logical_tokens);
        let surplus = physical_tokens.checked_sub(target).filter(|&s| s > 0)?;
        (surplus >= self.config.every_n_tokens || prompt_completed).then_some(target)
    }
}

/// Shapes of the attention the cache serves.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadShape {
    pub(crate) num_kv_heads: usize,
    pub(crate) head_dim: usize,
    /// Query heads per KV head.
    pub(crate) group: usize,
}

/// One request's compression in one step: its blocks, lengths and (SnapKV) captured queries.
pub(crate) struct CompressionJob<'a> {
    pub(crate) block_table: &'a [u32],
    pub(crate) block_size_tokens: usize,
    pub(crate) physical_tokens: usize,
    pub(crate) target_tokens: usize,
    /// The captured query rows of this request (indices into the capture's rows), oldest first;
    /// they are the request's last physical tokens.
    pub(crate) query_rows: Option<(&'a QueryCapture, std::ops::Range<usize>)>,
}

/// Compacts every layer of one request to `job.target_tokens` (per KV head in a full layer;
/// for a STAR-KV latent layer, whose value latent every head shares, the same tokens for all
/// heads: scored on its reconstructed keys, the heads' scores averaged). Returns the tokens
/// evicted per layer. The caller then shrinks the request's block table.
pub(crate) fn compress_layers<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    caches: &mut [B::KvCache],
    policy: &SeqCompression,
    job: &CompressionJob<'_>,
) -> Result<usize, EngineError> {
    let n = job.physical_tokens;
    let config = &policy.config;
    let cfg = model.config();
    let shape = HeadShape {
        num_kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
        group: cfg.num_attention_heads / cfg.num_kv_heads.max(1),
    };
    // A latent layer is scored on its keys reconstructed into a private full cache of the
    // sequence's length (physical index i in slot i), allocated once for all its layers.
    let mut scratch: Option<(B::KvCache, Vec<u32>)> = None;
    for (layer, cache) in caches.iter_mut().enumerate() {
        let Some(factors) = model.latent_factors(layer) else {
            let scores = layer_scores(backend, cache, job.block_table, policy, shape, job, layer)?;
            let keep = if config.head_wise {
                select_keep(
                    &scores,
                    n,
                    job.target_tokens,
                    config.sink_tokens,
                    config.window_tokens,
                )?
            } else {
                let keep = layer_wide_keep(&scores, n, job, config)?;
                vec![keep; shape.num_kv_heads]
            };
            backend.compact_kv(cache, job.block_table, job.block_size_tokens, n, &keep)?;
            continue;
        };
        if scratch.is_none() {
            let blocks = n.div_ceil(job.block_size_tokens).max(1);
            let spec = KvCacheSpec::full(
                blocks,
                job.block_size_tokens,
                shape.num_kv_heads,
                shape.head_dim,
                backend.kv_cache_dtype(),
            );
            scratch = Some((backend.alloc_kv_cache(&spec)?, (0..blocks as u32).collect()));
        }
        let Some((dense, dense_table)) = scratch.as_mut() else {
            continue;
        };
        backend.reconstruct_kv(
            cache,
            &factors,
            model.attention_dims(),
            model.rope(),
            job.block_table,
            n,
            dense,
            dense_table,
        )?;
        let scores = layer_scores(backend, dense, dense_table, policy, shape, job, layer)?;
        let keep = layer_wide_keep(&scores, n, job, config)?;
        backend.compact_kv(cache, job.block_table, job.block_size_tokens, n, &[keep])?;
    }
    Ok(n - job.target_tokens)
}

/// One kept-index list for every head of a layer: the heads' scores averaged per token.
fn layer_wide_keep(
    scores: &[Vec<f32>],
    n: usize,
    job: &CompressionJob<'_>,
    config: &CompressionConfig,
) -> Result<Vec<u32>, EngineError> {
    let mut keep = select_keep(
        &[mean_over_heads(scores, n)],
        n,
        job.target_tokens,
        config.sink_tokens,
        config.window_tokens,
    )?;
    Ok(keep.pop().unwrap_or_default())
}

/// One score vector per KV head of a full cache holding the sequence through `block_table`.
/// KeyDiff and KNorm are scored where the cache lives (only the scores cross to the host; the
/// backend's version equals the evict crate's, tested there), the others by the host scorer.
fn layer_scores<B: Backend>(
    backend: &B,
    cache: &B::KvCache,
    block_table: &[u32],
    policy: &SeqCompression,
    shape: HeadShape,
    job: &CompressionJob<'_>,
    layer: usize,
) -> Result<Vec<Vec<f32>>, EngineError> {
    let n = job.physical_tokens;
    let device_kind = match policy.config.method {
        CompressionMethod::KeyDiff => Some(KeyScoreKind::KeyDiff),
        CompressionMethod::KNorm => Some(KeyScoreKind::KNorm),
        _ => None,
    };
    match device_kind {
        Some(kind) => Ok(backend
            .key_scores(cache, block_table, job.block_size_tokens, n, kind)?
            .data()
            .chunks_exact(n.max(1))
            .map(<[f32]>::to_vec)
            .collect()),
        None => host_scores(backend, cache, block_table, policy, shape, job, layer),
    }
}

/// The per-token mean of every head's scores: one layer-wide ranking.
fn mean_over_heads(scores: &[Vec<f32>], n: usize) -> Vec<f32> {
    let mut mean = vec![0.0f32; n];
    for head in scores {
        mean.iter_mut().zip(head).for_each(|(m, s)| *m += s);
    }
    let heads = scores.len().max(1) as f32;
    mean.iter_mut().for_each(|m| *m /= heads);
    mean
}

/// Scores of one layer by the policy's host scorer, one vector per KV head (keys copied off
/// the backend only when the scorer reads them).
fn host_scores<B: Backend>(
    backend: &B,
    cache: &B::KvCache,
    block_table: &[u32],
    policy: &SeqCompression,
    shape: HeadShape,
    job: &CompressionJob<'_>,
    layer: usize,
) -> Result<Vec<Vec<f32>>, EngineError> {
    let n = job.physical_tokens;
    let heads = if policy.scorer.needs_keys() {
        let keys = backend.read_keys(cache, block_table, job.block_size_tokens, n)?;
        split_heads(keys.data(), shape.num_kv_heads, shape.head_dim)?
    } else {
        vec![vec![0.0; n * shape.head_dim]; shape.num_kv_heads]
    };
    let layer_queries = match &job.query_rows {
        Some((capture, rows)) => Some(window_queries(capture, layer, rows.clone(), shape)?),
        None => None,
    };
    heads
        .iter()
        .enumerate()
        .map(|(kv_head, keys)| {
            let queries = match &layer_queries {
                Some(per_head) => Some(WindowQueries::new(
                    &per_head[kv_head],
                    per_head[kv_head].len() / (shape.group * shape.head_dim),
                    shape.group,
                    shape.head_dim,
                )?),
                None => None,
            };
            Ok(policy.scorer.score(&ScoreInput {
                keys: HeadKeys::new(keys, shape.head_dim)?,
                queries,
                layer,
                kv_head,
            })?)
        })
        .collect()
}

/// Layer `layer`'s captured queries of `rows`, regrouped per KV head as
/// `[window, group, head_dim]` (what [`WindowQueries`] expects).
fn window_queries(
    capture: &QueryCapture,
    layer: usize,
    rows: std::ops::Range<usize>,
    shape: HeadShape,
) -> Result<Vec<Vec<f32>>, EngineError> {
    let q: &HostTensor = capture.layer(layer).ok_or_else(|| {
        EngineError::InvalidRequest(format!("no queries captured for layer {layer}"))
    })?;
    let width = shape.num_kv_heads * shape.group * shape.head_dim;
    let slice_width = shape.group * shape.head_dim;
    let mut per_head = vec![Vec::with_capacity(rows.len() * slice_width); shape.num_kv_heads];
    for r in rows {
        let row = q.data().get(r * width..(r + 1) * width).ok_or_else(|| {
            EngineError::InvalidRequest(format!("captured query row {r} out of range"))
        })?;
        for (head, part) in per_head.iter_mut().zip(row.chunks_exact(slice_width)) {
            head.extend_from_slice(part);
        }
    }
    Ok(per_head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_evict::CompressionMethod;

    fn policy(ratio: f64, every_n_tokens: usize) -> SeqCompression {
        SeqCompression::new(&CompressionConfig {
            method: CompressionMethod::KeyDiff,
            ratio,
            sink_tokens: 4,
            window_tokens: 8,
            every_n_tokens,
            seed: 0,
            head_wise: true,
        })
        .expect("evicting config")
    }

    #[test]
    fn none_and_ratio_zero_never_compress() {
        assert!(SeqCompression::new(&CompressionConfig::default()).is_none());
        let zero = CompressionConfig {
            method: CompressionMethod::KeyDiff,
            ..CompressionConfig::default()
        };
        assert!(SeqCompression::new(&zero).is_none());
    }

    #[test]
    fn target_follows_the_logical_length_and_waits_for_a_surplus() {
        let p = policy(0.5, 16);
        // 100 logical tokens: protected 12, evict floor(0.5 * 88) = 44 → keep 56.
        assert_eq!(p.due_target(100, 100, false), Some(56));
        // Already compressed to 56; 10 more tokens: target keep(110) = 61, surplus 5 < 16.
        assert_eq!(p.due_target(110, 66, false), None);
        // ... unless the prompt just completed.
        assert_eq!(p.due_target(110, 66, true), Some(61));
        // At or below target: nothing, even at prompt end.
        assert_eq!(p.due_target(110, 61, true), None);
        // Surplus reaches every_n_tokens.
        assert_eq!(p.due_target(142, 93, false), Some(77));
        // Short sequences are all protected.
        assert_eq!(p.due_target(12, 12, true), None);
    }
}

//! Replayed decode steps: the interface a backend offers for running a whole decode forward pass
//! as one recorded unit (a CUDA graph), so a small batch is not bound by per-op launch costs.
//!
//! The model stays backend-agnostic: the caller hands over its forward pass as a closure
//! ([`DeviceForward`]); the backend decides whether a step can be replayed, records the closure
//! once per batch-size bucket, and replays it on later steps. A step it cannot replay (prefill,
//! mixed, too large) comes back as `None` and the caller runs it eagerly.

use crate::{Backend, BackendCore, BackendError, BatchMeta};

/// A model's forward pass up to the device logits of `meta.logits_rows`, as the backend replays
/// it: `(backend, token_ids, meta, batch, caches) -> logits`. It must only issue backend ops
/// (no host copies), and read the token ids through [`crate::ModelOps::embedding_for_batch`].
pub type DeviceForward<'f, B> = dyn FnMut(
        &B,
        &[u32],
        &BatchMeta,
        &<B as BackendCore>::Batch,
        &mut [<B as BackendCore>::KvCache],
    ) -> Result<<B as BackendCore>::Tensor, BackendError>
    + 'f;

/// Recorded decode steps ([`DecodeGraphs`]), for a backend that can replay a whole decode
/// forward pass; the default runs every step eagerly, so a backend without graphs implements
/// this trait with an empty body.
pub trait GraphCapture: BackendCore {
    /// Recorded decode steps for one model over caches of `config`'s geometry, where the backend
    /// can replay them (see [`DecodeGraphs`]); `None` (the default) runs every step eagerly.
    fn decode_graphs(
        &self,
        config: &DecodeGraphConfig,
    ) -> Result<Option<Box<dyn DecodeGraphs<Self>>>, BackendError>
    where
        Self: Sized + Backend,
    {
        let _ = config;
        Ok(None)
    }
}

/// Limits that size the replay buffers once, when the graphs are created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeGraphConfig {
    /// Most sequences in one step (the largest bucket).
    pub max_num_seqs: usize,
    /// Longest context in tokens (sizes each row's block table).
    pub max_model_len_tokens: usize,
    /// Tokens per cache block.
    pub block_size_tokens: usize,
    /// Blocks in each layer's cache.
    pub num_cache_blocks: usize,
    /// The model's query heads per KV head (its attention group), which picks the decode
    /// attention kernel and so the split plan a replay must reproduce.
    pub query_heads_per_kv_head: usize,
    /// The model's KV heads (every layer's, full or latent).
    pub num_kv_heads: usize,
    /// Elements per attention head.
    pub head_dim: usize,
}

/// One decode step as the engine built it.
#[derive(Clone, Copy, Debug)]
pub struct DecodeStep<'a> {
    /// One token id per row.
    pub token_ids: &'a [u32],
    /// The step's metadata (validated by the runner).
    pub meta: &'a BatchMeta,
}

/// Recorded decode steps of one model over one set of caches. Created by
/// [`GraphCapture::decode_graphs`]; owned by the caller, which must always pass the same model's
/// forward pass (a recording holds that model's weights).
pub trait DecodeGraphs<B: Backend>: Send {
    /// Runs `step` by replaying a recording of `forward` (recording it first when its bucket has
    /// none) and returns the logits `[meta.logits_rows.len(), vocab]` in f32, in backend memory
    /// (for [`crate::DeviceSampling::sample_rows`]), or `None` when the
    /// step cannot be replayed and must run eagerly (not every sequence decodes one token, the
    /// batch is larger than the largest bucket, or recording failed earlier for its bucket).
    fn run(
        &mut self,
        backend: &B,
        step: DecodeStep<'_>,
        caches: &mut [B::KvCache],
        forward: &mut DeviceForward<'_, B>,
    ) -> Result<Option<B::Tensor>, BackendError>;

    /// The batch sizes steps are padded up to, ascending.
    fn buckets(&self) -> &[usize];
}

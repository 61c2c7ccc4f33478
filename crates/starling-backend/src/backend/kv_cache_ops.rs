//! The cache-management ops ([`KvCacheOps`]): block copies, gathers and scatters, compaction,
//! and the eviction statistics computed where the cache lives. None of them is part of a
//! forward pass; each defaults to an error naming it, so a backend (or a test double) that
//! only runs models need not implement them.

use crate::{
    AttentionDims, BackendCore, BackendError, HostTensor, KeepPlan, LatentFactors, RopeSpec,
};

/// One sequence's cache rows copied out in physical order ([`KvCacheOps::gather_kv`]) or to be
/// written back ([`KvCacheOps::scatter_kv`]): the key and value planes `[len, width]`, and for a
/// latent layer each row's position (empty for a full layer).
pub struct KvRows<T> {
    /// Key plane rows.
    pub keys: T,
    /// Value plane rows.
    pub values: T,
    /// Positions of a latent layer's rows; empty for a full layer.
    pub positions: Vec<u32>,
}

/// A per-token key statistic computed next to the cache ([`KvCacheOps::key_scores`]), so eviction can
/// rank tokens without copying every key to the host. Higher score = keep, as for the
/// `starling-evict` scorers of the same names, whose definitions these equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyScoreKind {
    /// KeyDiff: `−cos(k_i, m)` with `m` the mean over the head's tokens of `k_j / ‖k_j‖` (a zero
    /// key adds nothing to the sum but counts in the mean; a zero cosine denominator scores 0).
    KeyDiff,
    /// KNorm: `−‖k_i‖`.
    KNorm,
}

/// How [`KvCacheOps::window_scores`] turns a sequence's observation-window queries into one score
/// per token (SnapKV, TOVA).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowScoreSpec {
    /// Query heads per KV head: query head `q` reads KV head `q / group`.
    pub group: usize,
    /// Softmax scale of the window's logits (`1 / sqrt(head_dim)` for SnapKV and TOVA).
    pub scale: f32,
    /// Max-pool width over the tokens before the window (odd; 1 = no pooling).
    pub pool_kernel_tokens: usize,
}
/// The cache-management ops (copy-on-write, eviction, latent reconstruction). References:
/// `cpu::{kv_transfer, compact, key_scores, latent}`, argument checks in `cpu::kv_checks`.
pub trait KvCacheOps: BackendCore {
    /// Copies whole blocks, K and V of every head, from `src` to `dst` for each `(src, dst)` pair
    /// (copy-on-write when a shared block is about to be written, forking, swapping). Every block
    /// id must be in range, destinations distinct and no destination also a source, so the copies
    /// are independent of their order. Invalid input is an error and copies nothing.
    fn copy_kv_blocks(
        &self,
        cache: &mut Self::KvCache,
        pairs: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        let _ = (cache, pairs);
        Err(self.unsupported("copy_kv_blocks"))
    }

    /// One sequence's rows of one layer gathered into contiguous tensors in physical order: the
    /// key and value planes `[len_tokens, width]` ([`KvCacheSpec::plane_widths`]) and, for a
    /// latent layer, the positions.
    fn gather_kv(
        &self,
        cache: &Self::KvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
    ) -> Result<KvRows<Self::Tensor>, BackendError> {
        let _ = (cache, block_table, block_size_tokens, len_tokens);
        Err(self.unsupported("gather_kv"))
    }

    /// The inverse of [`KvCacheOps::gather_kv`]: writes `rows` (planes `[len, width]`, and `len`
    /// positions for a latent layer) to physical indices `0..len` of the sequence. The blocks
    /// those indices use must be distinct. Invalid input is an error and writes nothing.
    fn scatter_kv(
        &self,
        cache: &mut Self::KvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        rows: &KvRows<Self::Tensor>,
    ) -> Result<(), BackendError> {
        let _ = (cache, block_table, block_size_tokens, rows);
        Err(self.unsupported("scatter_kv"))
    }

    /// Token eviction: compacts one sequence's K and V in one layer. `keep[h]` lists, strictly
    /// ascending and below `physical_len_tokens`, the physical indices head `h` keeps (the same
    /// count for every head); physical index `i` of head `h` then holds its `i`-th kept row. A
    /// latent layer takes one list ([`KvCacheSpec::keep_lists`]): its key latents, value latent
    /// and positions move together.
    /// Slots past the kept count are left stale for the caller to release
    /// (`KvCacheManager::shrink_physical`). The blocks holding the `physical_len_tokens` must be
    /// distinct and not shared with another sequence (compaction writes in place: copy a shared
    /// block first, [`KvCacheOps::copy_kv_blocks`]). Invalid input is an error and moves nothing.
    fn compact_kv(
        &self,
        cache: &mut Self::KvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        physical_len_tokens: usize,
        keep: &[Vec<u32>],
    ) -> Result<(), BackendError> {
        let _ = (
            cache,
            block_table,
            block_size_tokens,
            physical_len_tokens,
            keep,
        );
        Err(self.unsupported("compact_kv"))
    }

    /// Token eviction by scores where they were computed: selects each list's kept tokens of
    /// one sequence in one layer from `scores` (`[num_kv_heads, plan.physical_tokens]` f32, as
    /// [`KvCacheOps::key_scores`] and [`KvCacheOps::window_scores`] return them) by `plan`
    /// ([`KeepPlan::keep_lists`] is the definition), then compacts as
    /// [`KvCacheOps::compact_kv`] does on the slots from `plan.skip_tokens` on. A device
    /// backend selects on the device, so a compaction never waits for its scores on the host;
    /// the default copies the scores to the host ([`KeepPlan::compact_on_host`]). Invalid input
    /// is an error and moves nothing.
    fn compact_kv_by_scores(
        &self,
        cache: &mut Self::KvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        scores: &Self::Tensor,
        plan: &KeepPlan,
    ) -> Result<(), BackendError> {
        let scores = self.to_host(scores)?;
        plan.compact_on_host(self, cache, block_table, block_size_tokens, &scores)
    }

    /// One sequence's keys of one (full) layer copied to the host as f32
    /// `[len_tokens, num_kv_heads, head_dim]` in physical order (input to eviction scorers); a
    /// latent layer is reconstructed first ([`KvCacheOps::reconstruct_kv`]).
    fn read_keys(
        &self,
        cache: &Self::KvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
    ) -> Result<HostTensor, BackendError> {
        let _ = (cache, block_table, block_size_tokens, len_tokens);
        Err(self.unsupported("read_keys"))
    }

    /// Eviction scores of one sequence's keys in one (full) layer, f32
    /// `[num_kv_heads, len_tokens]` in physical order, computed and left where the cache lives
    /// (see [`KeyScoreKind`]; [`BackendCore::to_host`] copies them out).
    fn key_scores(
        &self,
        cache: &Self::KvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
        kind: KeyScoreKind,
    ) -> Result<Self::Tensor, BackendError> {
        let _ = (cache, block_table, block_size_tokens, len_tokens, kind);
        Err(self.unsupported("key_scores"))
    }

    /// Observation-window scores (SnapKV, TOVA) of one sequence's keys in one layer, f32
    /// `[num_kv_heads, len_tokens]` in physical order, computed and left where the cache lives. `queries` is `[window, num_kv_heads * group * head_dim]`:
    /// row `j` holds the post-RoPE queries of physical token `len_tokens - window + j`, query
    /// head `q` at columns `q * head_dim ..`. Per KV head `h`, token `i` before the window
    /// scores the largest, over the pool around `i` (clipped to the tokens before the window),
    /// of `Σ_j Σ_g softmax(scale · q_{j, h·group+g} · k)[i]`, each softmax causal (query `j`
    /// sees tokens `0 ..= len_tokens - window + j`); window tokens score +∞. The CPU reference
    /// is `cpu::window_scores`, equal to starling-evict's SnapKV scorer.
    fn window_scores(
        &self,
        cache: &Self::KvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
        queries: &HostTensor,
        spec: &WindowScoreSpec,
    ) -> Result<Self::Tensor, BackendError> {
        let _ = (
            cache,
            block_table,
            block_size_tokens,
            len_tokens,
            queries,
            spec,
        );
        Err(self.unsupported("window_scores"))
    }

    /// Reconstructs physical indices `0..len_tokens` of one sequence of a latent layer
    /// (`latent`, through `block_table`) into full post-RoPE K/V: the keys and values
    /// [`latent_attention`](crate::ModelOps::latent_attention) attends to, written to physical indices
    /// `0..len_tokens` of `dense` (a full-layout cache of the model's KV heads) through
    /// `dense_table`, whose blocks must be distinct. Eviction scores a latent layer on these
    /// keys. Invalid input is an error and writes nothing.
    #[allow(clippy::too_many_arguments)]
    fn reconstruct_kv(
        &self,
        latent: &Self::KvCache,
        factors: &LatentFactors<'_, Self::Tensor>,
        dims: &AttentionDims,
        rope: &RopeSpec,
        block_table: &[u32],
        len_tokens: usize,
        dense: &mut Self::KvCache,
        dense_table: &[u32],
    ) -> Result<(), BackendError> {
        let _ = (
            latent,
            factors,
            dims,
            rope,
            block_table,
            len_tokens,
            dense,
            dense_table,
        );
        Err(self.unsupported("reconstruct_kv"))
    }
}

//! The op-level interface every compute backend implements. Models are written once against it.
//!
//! Activations are row-major `[tokens, features]` matrices. The op set is what a decoder-only
//! transformer with a paged KV cache needs; fused ops (QKV projection, residual add + RMSNorm,
//! SwiGLU) are ops of their own because they are one kernel each on a GPU.

use crate::sampling::{sample_host_rows, select_host_rows, RowOutcome, RowSamplingParams};
use crate::{BackendError, BatchMeta, DecodeGraphConfig, DecodeGraphs, HostTensor};

/// Rotary embedding flavour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Rotate adjacent pairs (2i, 2i+1): GPT-J / llama.cpp "normal" rope (GGUF llama files, whose
    /// Q/K rows the converter permuted).
    Interleaved,
    /// Rotate halves (i, i + d/2): GPT-NeoX / HF `rotate_half`.
    Neox,
}

/// Rotary embedding parameters shared by all layers.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    /// Inverse frequencies, `head_dim / 2` of them, scaling (e.g. Llama 3) already applied.
    pub inv_freqs: Vec<f32>,
    /// Pairing of rotated elements.
    pub style: RopeStyle,
}

/// Head geometry of one attention layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionDims {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Softmax scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

impl AttentionDims {
    /// Width of the query part of a fused QKV row.
    pub fn q_size(&self) -> usize {
        self.num_heads * self.head_dim
    }
    /// Width of the key (and of the value) part of a fused QKV row.
    pub fn kv_size(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
    /// Width of a fused QKV row: `[q | k | v]`.
    pub fn qkv_size(&self) -> usize {
        self.q_size() + 2 * self.kv_size()
    }
}

/// Geometry of one layer's paged K/V cache (the uncompressed "full" layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheSpec {
    /// Number of blocks in the pool.
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size_tokens: usize,
    /// Key/value heads stored per token.
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
}

impl KvCacheSpec {
    /// Token slots in the whole cache.
    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size_tokens
    }
}

/// A per-token key statistic computed next to the cache ([`Backend::key_scores`]), so eviction can
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

/// How [`Backend::window_scores`] turns a sequence's observation-window queries into one score
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

/// A compute backend: owns device buffers and runs the ops a model needs.
pub trait Backend: Send + Sync {
    /// A 2-D (or 1-D for vectors) tensor in the backend's memory and compute dtype.
    type Tensor: Send + Sync;
    /// One layer's paged K/V cache storage.
    type KvCache: Send + Sync;
    /// Step metadata in the backend's memory (uploaded once per step, read by every layer).
    type Batch: Send + Sync;

    /// Short name for logs ("cpu", "cuda:0").
    fn name(&self) -> String;

    /// Element type this backend stores the KV cache in (sizes the cache from a byte budget).
    fn kv_cache_dtype(&self) -> starling_kv::CacheDtype;

    /// `(free, total)` bytes of device memory, for backends that have their own (sizes the KV
    /// cache from a utilisation share); `None` for host memory.
    fn memory_info(&self) -> Option<(u64, u64)> {
        None
    }

    /// Copies a host tensor into backend memory (converting to the compute dtype).
    fn upload(&self, host: &HostTensor) -> Result<Self::Tensor, BackendError>;
    /// A tensor of N(`mean`, `std`) values (deterministic for a seed), for synthetic weights.
    /// The default makes it on the host and uploads it; device backends make it in place.
    fn random_tensor(
        &self,
        shape: Vec<usize>,
        seed: u64,
        std: f32,
        mean: f32,
    ) -> Result<Self::Tensor, BackendError> {
        let n: usize = shape.iter().product();
        let mut state = seed;
        let mut next = || {
            // SplitMix64: fast, and statistically fine for filler values.
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        };
        let data = (0..n)
            .map(|_| {
                let (u1, u2) = (next().max(f64::MIN_POSITIVE), next());
                let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                mean + std * normal as f32
            })
            .collect();
        self.upload(&HostTensor::new(shape, data)?)
    }
    /// Like [`Backend::upload`], but may reuse the host buffer (the CPU backend moves it instead
    /// of copying, so loading a model does not hold its weights twice).
    fn upload_owned(&self, host: HostTensor) -> Result<Self::Tensor, BackendError> {
        self.upload(&host)
    }

    /// Copies a tensor back to the host as f32.
    fn to_host(&self, t: &Self::Tensor) -> Result<HostTensor, BackendError>;
    /// Samples one token for each of `rows` from an f32 `[n, vocab]` logits tensor (as
    /// [`Backend::logits`] returns it) where the logits live, and returns, in `rows`' order, only
    /// each row's token id and raw log-probability (or why the row has no distribution). The
    /// reference is [`crate::sampling::sample_row`]; the default copies the logits to the host
    /// and runs it.
    fn sample_rows(
        &self,
        logits: &Self::Tensor,
        rows: &[RowSamplingParams],
    ) -> Result<Vec<RowOutcome>, BackendError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        sample_host_rows(&self.to_host(logits)?, rows)
    }
    /// The listed rows of an f32 `[n, vocab]` logits tensor, copied to the host in the listed
    /// order (the rows a host sampler still needs). The default copies the whole tensor first.
    fn logits_rows_to_host(
        &self,
        logits: &Self::Tensor,
        rows: &[u32],
    ) -> Result<HostTensor, BackendError> {
        select_host_rows(&self.to_host(logits)?, rows)
    }
    /// Allocates one layer's K/V cache, zero-filled.
    fn alloc_kv_cache(&self, spec: &KvCacheSpec) -> Result<Self::KvCache, BackendError>;
    /// Makes the step metadata available to the ops (validated against the cache size).
    fn prepare_batch(
        &self,
        meta: &BatchMeta,
        num_cache_blocks: usize,
    ) -> Result<Self::Batch, BackendError>;

    /// Rows of `table` (`[vocab, d]`) selected by `ids` → `[ids.len(), d]`.
    fn embedding(&self, table: &Self::Tensor, ids: &[u32]) -> Result<Self::Tensor, BackendError>;
    /// [`Backend::embedding`] of a step's token ids. A backend whose batch carries the ids in its
    /// own memory (the fixed inputs of a replayed decode step) reads them there, so the op can be
    /// recorded once and replayed with new ids; the default gathers `ids` as given.
    fn embedding_for_batch(
        &self,
        table: &Self::Tensor,
        ids: &[u32],
        batch: &Self::Batch,
    ) -> Result<Self::Tensor, BackendError> {
        let _ = batch;
        self.embedding(table, ids)
    }
    /// Recorded decode steps for one model over caches of `config`'s geometry, where the backend
    /// can replay them (see [`DecodeGraphs`]); `None` (the default) runs every step eagerly.
    fn decode_graphs(
        &self,
        config: &DecodeGraphConfig,
    ) -> Result<Option<Box<dyn DecodeGraphs<Self>>>, BackendError>
    where
        Self: Sized,
    {
        let _ = config;
        Ok(None)
    }
    /// `x · wᵀ (+ bias)`: `x` is `[n, k]`, `w` is `[m, k]` (PyTorch Linear layout) → `[n, m]`.
    fn linear(
        &self,
        x: &Self::Tensor,
        w: &Self::Tensor,
        bias: Option<&Self::Tensor>,
    ) -> Result<Self::Tensor, BackendError>;
    /// The final vocabulary projection `x · wᵀ` (no bias), returned in f32 whatever the compute
    /// dtype, because sampling and logprobs need full-precision logits.
    fn logits(&self, x: &Self::Tensor, w: &Self::Tensor) -> Result<Self::Tensor, BackendError>;
    /// Row-wise RMSNorm with a learned scale `w` (`[d]`).
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Tensor,
        eps: f32,
    ) -> Result<Self::Tensor, BackendError>;
    /// Fused residual step: `residual += delta`, then returns `rms_norm(residual, w)`.
    fn add_rms_norm(
        &self,
        residual: &mut Self::Tensor,
        delta: &Self::Tensor,
        w: &Self::Tensor,
        eps: f32,
    ) -> Result<Self::Tensor, BackendError>;
    /// `x += delta`, elementwise.
    fn add_inplace(&self, x: &mut Self::Tensor, delta: &Self::Tensor) -> Result<(), BackendError>;
    /// SwiGLU on a fused `[n, 2f]` gate|up tensor → `silu(gate) * up`, `[n, f]`.
    fn silu_mul(&self, gate_up: &Self::Tensor) -> Result<Self::Tensor, BackendError>;
    /// The MLP's first half: `silu_mul(linear(x, gate_up, None))` for a fused `[2f, k]` gate|up
    /// weight, `[n, f]` out. A backend may fuse the two (the CUDA one does at decode batch sizes,
    /// saving a kernel and a round trip of the `[n, 2f]` activations per layer).
    fn linear_swiglu(
        &self,
        x: &Self::Tensor,
        gate_up: &Self::Tensor,
    ) -> Result<Self::Tensor, BackendError> {
        self.silu_mul(&self.linear(x, gate_up, None)?)
    }
    /// Selected rows of `x`, in the given order.
    fn gather_rows(&self, x: &Self::Tensor, rows: &[u32]) -> Result<Self::Tensor, BackendError>;
    /// Applies RoPE in place to the Q and K parts of a fused `[n, qkv]` tensor at the batch's positions.
    fn rope_qk(
        &self,
        qkv: &mut Self::Tensor,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &Self::Batch,
    ) -> Result<(), BackendError>;
    /// Writes the K and V parts of a fused `[n, qkv]` tensor into the cache at the batch's slots.
    fn write_kv(
        &self,
        cache: &mut Self::KvCache,
        qkv: &Self::Tensor,
        dims: &AttentionDims,
        batch: &Self::Batch,
    ) -> Result<(), BackendError>;
    /// [`rope_qk`](Self::rope_qk), then [`write_kv`](Self::write_kv) of the rotated rows; a
    /// backend may fuse them (the CUDA one does). Afterwards `qkv` and the cache must be exactly
    /// what the two calls leave.
    fn rope_qk_write_kv(
        &self,
        qkv: &mut Self::Tensor,
        cache: &mut Self::KvCache,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &Self::Batch,
    ) -> Result<(), BackendError> {
        self.rope_qk(qkv, dims, rope, batch)?;
        self.write_kv(cache, qkv, dims, batch)
    }
    /// Causal attention of the Q part of `qkv` over each sequence's paged context → `[n, q_size]`.
    /// Query `i` of a sequence with `L` new tokens and context `C` sees physical slots
    /// `0 ..= C - L + i` (physical order is chronological; eviction keeps it so).
    fn paged_attention(
        &self,
        qkv: &Self::Tensor,
        cache: &Self::KvCache,
        dims: &AttentionDims,
        batch: &Self::Batch,
    ) -> Result<Self::Tensor, BackendError>;

    /// Token eviction: compacts one sequence's K and V in one layer. `keep[h]` lists, strictly
    /// ascending and below `physical_len_tokens`, the physical indices head `h` keeps (the same
    /// count for every head); physical index `i` of head `h` then holds its `i`-th kept row.
    /// Slots past the kept count are left stale for the caller to release
    /// (`KvCacheManager::shrink_physical`). The blocks holding the `physical_len_tokens` must be
    /// distinct and not shared with another sequence (compaction writes in place: copy a shared
    /// block first, [`Backend::copy_kv_blocks`]). Invalid input is an error and moves nothing.
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
        Err(BackendError::Device(format!(
            "compact_kv is not implemented on the {} backend",
            self.name()
        )))
    }

    /// One sequence's keys of one layer copied to the host as f32
    /// `[len_tokens, num_kv_heads, head_dim]` in physical order (input to eviction scorers).
    fn read_keys(
        &self,
        cache: &Self::KvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
    ) -> Result<HostTensor, BackendError> {
        let _ = (cache, block_table, block_size_tokens, len_tokens);
        Err(BackendError::Device(format!(
            "read_keys is not implemented on the {} backend",
            self.name()
        )))
    }

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
        Err(BackendError::Device(format!(
            "copy_kv_blocks is not implemented on the {} backend",
            self.name()
        )))
    }

    /// One sequence's K and V of one layer gathered into contiguous tensors, each
    /// `[len_tokens, num_kv_heads * head_dim]` in physical order.
    fn gather_kv(
        &self,
        cache: &Self::KvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
    ) -> Result<(Self::Tensor, Self::Tensor), BackendError> {
        let _ = (cache, block_table, block_size_tokens, len_tokens);
        Err(BackendError::Device(format!(
            "gather_kv is not implemented on the {} backend",
            self.name()
        )))
    }

    /// The inverse of [`Backend::gather_kv`]: writes `k` and `v` (each
    /// `[len, num_kv_heads * head_dim]`) to physical indices `0..len` of the sequence. The blocks
    /// those indices use must be distinct. Invalid input is an error and writes nothing.
    fn scatter_kv(
        &self,
        cache: &mut Self::KvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        k: &Self::Tensor,
        v: &Self::Tensor,
    ) -> Result<(), BackendError> {
        let _ = (cache, block_table, block_size_tokens, k, v);
        Err(BackendError::Device(format!(
            "scatter_kv is not implemented on the {} backend",
            self.name()
        )))
    }

    /// Eviction scores of one sequence's keys in one layer, f32 `[num_kv_heads, len_tokens]` in
    /// physical order, computed where the cache lives (see [`KeyScoreKind`]).
    fn key_scores(
        &self,
        cache: &Self::KvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
        kind: KeyScoreKind,
    ) -> Result<HostTensor, BackendError> {
        let _ = (cache, block_table, block_size_tokens, len_tokens, kind);
        Err(BackendError::Device(format!(
            "key_scores is not implemented on the {} backend",
            self.name()
        )))
    }

    /// Observation-window scores (SnapKV, TOVA) of one sequence's keys in one layer, f32
    /// `[num_kv_heads, len_tokens]` in physical order, computed where the cache lives so only
    /// the scores cross to the host. `queries` is `[window, num_kv_heads * group * head_dim]`:
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
    ) -> Result<HostTensor, BackendError> {
        let _ = (
            cache,
            block_table,
            block_size_tokens,
            len_tokens,
            queries,
            spec,
        );
        Err(BackendError::Device(format!(
            "window_scores is not implemented on the {} backend",
            self.name()
        )))
    }
}

//! The op-level interface every compute backend implements. Models are written once against it.
//!
//! Activations are row-major `[tokens, features]` matrices. The op set is what a decoder-only
//! transformer with a paged KV cache needs; fused ops (QKV projection, residual add + RMSNorm,
//! SwiGLU) are ops of their own because they are one kernel each on a GPU.

use crate::sampling::{sample_host_rows, select_host_rows, RowOutcome, RowSamplingParams};
use crate::{BackendError, BatchMeta, DecodeGraphConfig, DecodeGraphs, HostTensor};
use starling_kv::{CacheDtype, LayerLayout};

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

/// The columns of a row-major `[rows, width]` tensor that [`Backend::rms_norm_heads`]
/// normalises: `num_heads` consecutive heads of `head_dim` elements from column `first_col` on
/// (the query or key part of a fused Q/K/V row, so the projection stays one tensor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadSpan {
    /// The first column of the first head.
    pub first_col: usize,
    /// Heads in the span.
    pub num_heads: usize,
    /// Elements per head (the length of the norm's weight).
    pub head_dim: usize,
}

impl HeadSpan {
    /// The column just past the span.
    pub fn end_col(&self) -> usize {
        self.first_col + self.num_heads * self.head_dim
    }
}

/// One layer's paged cache: how many blocks of how many token slots, and what each slot stores
/// ([`LayerLayout`], the same description that sized the cache: full K/V, or STAR-KV latents
/// with each token's position). Every backend allocates from it.
///
/// Storage, on every backend: a *key plane* `[num_slots, key_width]` and a *value plane*
/// `[num_slots, value_width]` ([`plane_widths`](Self::plane_widths)), slot-major; a full layer's
/// key row is `num_kv_heads` heads of `head_dim`, a latent layer's is its heads' key latents
/// side by side (head `h` at the sum of the ranks before it) and its value row the one value
/// latent; a latent layer also stores one `u32` position per slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvCacheSpec {
    /// Number of blocks in the pool.
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size_tokens: usize,
    /// What one slot stores.
    pub layout: LayerLayout,
}

impl KvCacheSpec {
    /// A full (uncompressed) K/V layer of `num_kv_heads` heads of `head_dim` elements.
    pub fn full(
        num_blocks: usize,
        block_size_tokens: usize,
        num_kv_heads: usize,
        head_dim: usize,
        dtype: CacheDtype,
    ) -> Self {
        Self {
            num_blocks,
            block_size_tokens,
            layout: LayerLayout::Full {
                num_kv_heads,
                head_dim,
                dtype,
            },
        }
    }

    /// Token slots in the whole cache.
    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size_tokens
    }

    /// The same geometry stored in `dtype` (a backend's own: the CPU caches f32, CUDA bf16).
    pub fn with_dtype(&self, dtype: CacheDtype) -> Self {
        let layout = match &self.layout {
            LayerLayout::Full {
                num_kv_heads,
                head_dim,
                ..
            } => LayerLayout::Full {
                num_kv_heads: *num_kv_heads,
                head_dim: *head_dim,
                dtype,
            },
            LayerLayout::LowRank {
                key_rank_per_head,
                value_rank,
                ..
            } => LayerLayout::LowRank {
                key_rank_per_head: key_rank_per_head.clone(),
                value_rank: *value_rank,
                dtype,
            },
        };
        Self {
            layout,
            ..self.clone()
        }
    }

    /// Elements per slot of the key plane and of the value plane.
    pub fn plane_widths(&self) -> (usize, usize) {
        self.layout.plane_widths()
    }

    /// `(num_kv_heads, head_dim)` of a full layer; `None` for a latent one.
    pub fn full_heads(&self) -> Option<(usize, usize)> {
        match self.layout {
            LayerLayout::Full {
                num_kv_heads,
                head_dim,
                ..
            } => Some((num_kv_heads, head_dim)),
            LayerLayout::LowRank { .. } => None,
        }
    }

    /// The stored key rank of each KV head of a latent layer; `None` for a full one.
    pub fn latent_key_ranks(&self) -> Option<&[usize]> {
        match &self.layout {
            LayerLayout::LowRank {
                key_rank_per_head, ..
            } => Some(key_rank_per_head),
            LayerLayout::Full { .. } => None,
        }
    }

    /// Whether the layer stores latents.
    pub fn is_latent(&self) -> bool {
        self.layout.is_low_rank()
    }

    /// How many kept-index lists [`Backend::compact_kv`] takes: one per KV head for a full layer,
    /// one for a latent layer (its value latent is shared by every head, so every head keeps the
    /// same tokens).
    pub fn keep_lists(&self) -> usize {
        match self.full_heads() {
            Some((heads, _)) => heads,
            None => 1,
        }
    }

    /// The spec's geometry as a full layer, or an error naming `op` (the ops that only full
    /// layers support).
    pub fn require_full(&self, op: &str) -> Result<(usize, usize), BackendError> {
        self.full_heads().ok_or_else(|| {
            BackendError::Shape(format!(
                "{op} needs full K/V; this layer caches STAR-KV latents (reconstruct them first: \
                 Backend::reconstruct_kv)"
            ))
        })
    }

    /// The spec's key ranks as a latent layer, or an error naming `op`.
    pub fn require_latent(&self, op: &str) -> Result<&[usize], BackendError> {
        self.latent_key_ranks().ok_or_else(|| {
            BackendError::Shape(format!(
                "{op} works on STAR-KV latent layers; this layer caches full K/V"
            ))
        })
    }
}

/// The up-projections a latent layer's attention reconstructs keys and values with (the
/// STAR-KV factors the model keeps; the down-projections are part of its fused Q/K/V weight).
///
/// Keys of head `h` at a slot holding latent `z` (the head's stored rank `r_h` of the key row)
/// and position `p`: `RoPE(B_h z + b_h, p)`, with `B_h` = columns `[o_h, o_h + r_h)` of
/// `key_up` (`o_h` the sum of the ranks before `h`). Values: `B_v u + b_v` for the value latent
/// `u`, all heads at once.
pub struct LatentFactors<'a, T> {
    /// `[head_dim, Σ_h r_h]`: every head's `B_h` side by side, in the key row's order.
    pub key_up: &'a T,
    /// The model's key bias `[num_kv_heads * head_dim]`, added before RoPE.
    pub key_bias: Option<&'a T>,
    /// `[num_kv_heads * head_dim, r_v]`: `B_v`.
    pub value_up: &'a T,
    /// The model's value bias `[num_kv_heads * head_dim]`.
    pub value_bias: Option<&'a T>,
}

/// One sequence's cache rows copied out in physical order ([`Backend::gather_kv`]) or to be
/// written back ([`Backend::scatter_kv`]): the key and value planes `[len, width]`, and for a
/// latent layer each row's position (empty for a full layer).
pub struct KvRows<T> {
    /// Key plane rows.
    pub keys: T,
    /// Value plane rows.
    pub values: T,
    /// Positions of a latent layer's rows; empty for a full layer.
    pub positions: Vec<u32>,
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
    /// Per-head RMSNorm in place (Qwen3's q/k norm): every `head_dim` slice of `span`'s columns
    /// in every row of `x` becomes `v * rsqrt(mean(v²) + eps) * w`, with one weight `w`
    /// (`[head_dim]`) shared by the heads; columns outside the span are left as they are.
    /// Reference: [`crate::cpu::rms_norm_heads`].
    fn rms_norm_heads(
        &self,
        x: &mut Self::Tensor,
        w: &Self::Tensor,
        span: HeadSpan,
        eps: f32,
    ) -> Result<(), BackendError>;
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

    /// A latent (STAR-KV) layer's counterpart of [`rope_qk_write_kv`](Self::rope_qk_write_kv):
    /// `qkv` is the layer's fused projection `[n, q_size + key_width + value_width]` (`[q | key
    /// latents | value latent]`, widths from the cache's layout). RoPE rotates the Q part in
    /// place at the batch's positions; the latents are written unrotated to the batch's slots,
    /// together with each token's position (keys are rotated when attended). Afterwards `qkv`'s
    /// Q part is what [`rope_qk`](Self::rope_qk) would leave.
    fn rope_q_write_latents(
        &self,
        qkv: &mut Self::Tensor,
        cache: &mut Self::KvCache,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &Self::Batch,
    ) -> Result<(), BackendError> {
        let _ = (qkv, cache, dims, rope, batch);
        Err(self.unsupported("rope_q_write_latents"))
    }

    /// [`paged_attention`](Self::paged_attention) over a latent layer: each visible slot's keys
    /// are `RoPE(B_h z + b_h, position)` and its values `B_v u + b_v` ([`LatentFactors`]), from
    /// the latents and positions [`rope_q_write_latents`](Self::rope_q_write_latents) stored.
    /// `qkv` is that op's (rotated) input; the result is `[n, q_size]` in value space, as
    /// `paged_attention` returns it. A backend may reconstruct or work in latent space (the
    /// CUDA one absorbs `B_v`), as long as the function is the same.
    fn latent_attention(
        &self,
        qkv: &Self::Tensor,
        cache: &Self::KvCache,
        factors: &LatentFactors<'_, Self::Tensor>,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &Self::Batch,
    ) -> Result<Self::Tensor, BackendError> {
        let _ = (qkv, cache, factors, dims, rope, batch);
        Err(self.unsupported("latent_attention"))
    }

    /// Reconstructs physical indices `0..len_tokens` of one sequence of a latent layer
    /// (`latent`, through `block_table`) into full post-RoPE K/V: the keys and values
    /// [`latent_attention`](Self::latent_attention) attends to, written to physical indices
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

    /// The error of an op this backend does not implement.
    fn unsupported(&self, op: &str) -> BackendError {
        BackendError::Device(format!(
            "{op} is not implemented on the {} backend",
            self.name()
        ))
    }

    /// Token eviction: compacts one sequence's K and V in one layer. `keep[h]` lists, strictly
    /// ascending and below `physical_len_tokens`, the physical indices head `h` keeps (the same
    /// count for every head); physical index `i` of head `h` then holds its `i`-th kept row. A
    /// latent layer takes one list ([`KvCacheSpec::keep_lists`]): its key latents, value latent
    /// and positions move together.
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
        Err(self.unsupported("compact_kv"))
    }

    /// One sequence's keys of one (full) layer copied to the host as f32
    /// `[len_tokens, num_kv_heads, head_dim]` in physical order (input to eviction scorers); a
    /// latent layer is reconstructed first ([`Backend::reconstruct_kv`]).
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

    /// The inverse of [`Backend::gather_kv`]: writes `rows` (planes `[len, width]`, and `len`
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

    /// Eviction scores of one sequence's keys in one (full) layer, f32
    /// `[num_kv_heads, len_tokens]` in physical order, computed where the cache lives (see
    /// [`KeyScoreKind`]).
    fn key_scores(
        &self,
        cache: &Self::KvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
        kind: KeyScoreKind,
    ) -> Result<HostTensor, BackendError> {
        let _ = (cache, block_table, block_size_tokens, len_tokens, kind);
        Err(self.unsupported("key_scores"))
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

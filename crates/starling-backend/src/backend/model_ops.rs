//! The model ops ([`ModelOps`]): everything a decoder-only transformer's forward pass issues,
//! from the embedding gather to the logits, including writing and attending the paged cache.
//!
//! Activations are row-major `[tokens, features]` matrices. Fused ops (QKV projection, residual
//! add + RMSNorm, SwiGLU) are ops of their own because they are one kernel each on a GPU.

use crate::{BackendCore, BackendError};

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
    /// A sliding-window layer's reach: each query attends to its own key and the
    /// `window_tokens - 1` before it (in cache order); `None` attends over the whole context.
    pub window_tokens: Option<usize>,
    /// The cache group whose block tables and slots the layer reads and writes
    /// ([`crate::BatchMeta::cache_groups`]): 0 unless a hybrid sliding-window model keeps
    /// this layer's blocks in a table of their own.
    pub cache_group: usize,
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

/// The columns of a row-major `[rows, width]` tensor that [`ModelOps::rms_norm_heads`]
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

/// The ops of a forward pass. Reference: [`crate::cpu::CpuBackend`].
pub trait ModelOps: BackendCore {
    /// Rows of `table` (`[vocab, d]`) selected by `ids` → `[ids.len(), d]`.
    fn embedding(&self, table: &Self::Tensor, ids: &[u32]) -> Result<Self::Tensor, BackendError>;

    /// [`ModelOps::embedding`] of a step's token ids. A backend whose batch carries the ids in its
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

    /// GeGLU on a fused `[n, 2f]` gate|up tensor → `gelu(gate) * up` with GELU's tanh
    /// approximation (HF `gelu_pytorch_tanh`: Gemma), `[n, f]`.
    fn gelu_tanh_mul(&self, gate_up: &Self::Tensor) -> Result<Self::Tensor, BackendError>;

    /// `x *= factor`, elementwise (Gemma's embedding scale).
    fn scale_inplace(&self, x: &mut Self::Tensor, factor: f32) -> Result<(), BackendError>;

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
}

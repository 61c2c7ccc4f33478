//! One decoder layer: its weights in backend memory and its step (input norm, attention over
//! the paged cache, the MLP; Gemma's norms of the attention and MLP outputs where it has them).

use starling_backend::{AttentionDims, Backend, HeadSpan, RopeSpec};

use super::{LatentLayer, QueryCapture};
use crate::{MlpActivation, ModelError};

/// One decoder layer's weights in backend memory (Q/K/V and gate/up fused at load).
pub(super) struct DecoderLayer<B: Backend> {
    /// A sliding-window layer's reach ([`AttentionDims::window_tokens`]); `None`: full attention.
    pub(super) window_tokens: Option<usize>,
    /// The cache group whose block tables the layer reads ([`AttentionDims::cache_group`]).
    pub(super) cache_group: usize,
    /// The cache tensor the layer's K/V live in (`starling_kv::CacheGroups`: the layer's
    /// place in its group; the layer's index with one group).
    pub(super) cache_slot: usize,
    /// The layer's own RoPE when it differs from the model's (Gemma-3's windowed layers).
    pub(super) rope: Option<RopeSpec>,
    /// The MLP's gating activation.
    pub(super) activation: MlpActivation,
    /// Gemma's norms of the attention and MLP outputs; `None` for the Llama layout.
    pub(super) sandwich_norms: Option<SandwichNorms<B>>,
    pub(super) input_norm: B::Tensor,
    /// `[W_q; W_k; W_v]`, or for a latent layer `[W_q; A_k; A_v]` (the key latents of every
    /// head, then the value latent).
    pub(super) qkv_weight: B::Tensor,
    pub(super) qkv_bias: Option<B::Tensor>,
    /// The largest absolute value of the key-projection bias (0 without one): whether an fp8
    /// cache holds this layer's keys (`FP8_MAX_KEY_BIAS`).
    pub(super) key_bias_max_abs: f32,
    /// Qwen3's per-head RMSNorms of the queries and keys; `None` for the other architectures.
    pub(super) head_norms: Option<HeadNorms<B>>,
    /// A STAR-KV latent layer's ranks and up-projections; `None` for full K/V.
    pub(super) latent: Option<LatentLayer<B>>,
    pub(super) o_proj: B::Tensor,
    /// The MLP's input norm (HF `post_attention_layernorm` in the Llama layout,
    /// `pre_feedforward_layernorm` in Gemma's).
    pub(super) pre_mlp_norm: B::Tensor,
    pub(super) gate_up_proj: B::Tensor,
    pub(super) down_proj: B::Tensor,
}

/// Gemma's extra norms: of the attention output (before it joins the residual stream) and of
/// the MLP output (likewise).
pub(super) struct SandwichNorms<B: Backend> {
    pub(super) post_attention: B::Tensor,
    pub(super) post_feedforward: B::Tensor,
}

/// One layer's query and key head norms (`[head_dim]` weights, shared by the heads).
pub(super) struct HeadNorms<B: Backend> {
    pub(super) q: B::Tensor,
    pub(super) k: B::Tensor,
}

impl<B: Backend> HeadNorms<B> {
    /// Normalises the query and key heads of a fused `[n, q | k | v]` projection in place,
    /// before RoPE (Qwen3 rotates the normalised heads).
    fn apply(
        &self,
        backend: &B,
        qkv: &mut B::Tensor,
        dims: &AttentionDims,
        eps: f32,
    ) -> Result<(), ModelError> {
        let q = HeadSpan {
            first_col: 0,
            num_heads: dims.num_heads,
            head_dim: dims.head_dim,
        };
        let k = HeadSpan {
            first_col: dims.q_size(),
            num_heads: dims.num_kv_heads,
            head_dim: dims.head_dim,
        };
        backend.rms_norm_heads(qkv, &self.q, q, eps)?;
        backend.rms_norm_heads(qkv, &self.k, k, eps)?;
        Ok(())
    }
}

/// What every layer of one step reads besides its weights and cache.
pub(super) struct StepContext<'s, B: Backend> {
    pub(super) dims: &'s AttentionDims,
    pub(super) rope: &'s RopeSpec,
    pub(super) batch: &'s B::Batch,
    pub(super) eps: f32,
}

impl<B: Backend> DecoderLayer<B> {
    /// Whether an fp8 cache holds this layer's keys (`super::FP8_MAX_KEY_BIAS`).
    pub(super) fn fp8_keys_fit(&self) -> bool {
        super::fp8_holds_key_bias(self.key_bias_max_abs)
    }

    /// The layer's input RMSNorm of the residual stream, fused with adding the previous layer's
    /// MLP output `pending` when there is one.
    pub(super) fn input_norm(
        &self,
        backend: &B,
        residual: &mut B::Tensor,
        pending: Option<B::Tensor>,
        eps: f32,
    ) -> Result<B::Tensor, ModelError> {
        Ok(match pending {
            None => backend.rms_norm(residual, &self.input_norm, eps)?,
            Some(delta) => backend.add_rms_norm(residual, &delta, &self.input_norm, eps)?,
        })
    }

    /// Attention and MLP on the normed input `x`: writes the step's K/V (or latents) into
    /// `cache`, copies the post-RoPE query rows `queries` names, adds the attention output to
    /// `residual` and returns the MLP's output (which the next layer's input norm, or the head,
    /// adds to the residual stream).
    pub(super) fn step(
        &self,
        backend: &B,
        x: &B::Tensor,
        residual: &mut B::Tensor,
        cache: &mut B::KvCache,
        ctx: &StepContext<'_, B>,
        queries: Option<&mut QueryCapture>,
    ) -> Result<B::Tensor, ModelError> {
        let (batch, eps) = (ctx.batch, ctx.eps);
        let rope = self.rope.as_ref().unwrap_or(ctx.rope);
        let dims = &AttentionDims {
            window_tokens: self.window_tokens,
            cache_group: self.cache_group,
            ..*ctx.dims
        };
        let mut qkv = backend.linear(x, &self.qkv_weight, self.qkv_bias.as_ref())?;
        if let Some(norms) = &self.head_norms {
            norms.apply(backend, &mut qkv, dims, eps)?;
        }
        // The captured rows are read after the write: it leaves `qkv` as RoPE left it.
        match &self.latent {
            None => backend.rope_qk_write_kv(&mut qkv, cache, dims, rope, batch)?,
            Some(_) => backend.rope_q_write_latents(&mut qkv, cache, dims, rope, batch)?,
        }
        if let Some(capture) = queries {
            capture.record(backend, &qkv, dims.q_size())?;
        }
        let attn = match &self.latent {
            None => backend.paged_attention(&qkv, cache, dims, batch)?,
            Some(latent) => {
                backend.latent_attention(&qkv, cache, &latent.factors(), dims, rope, batch)?
            }
        };
        let mut attn_out = backend.linear(&attn, &self.o_proj, None)?;
        if let Some(norms) = &self.sandwich_norms {
            attn_out = backend.rms_norm(&attn_out, &norms.post_attention, eps)?;
        }
        let x = backend.add_rms_norm(residual, &attn_out, &self.pre_mlp_norm, eps)?;
        let act = match self.activation {
            MlpActivation::Silu => backend.linear_swiglu(&x, &self.gate_up_proj)?,
            MlpActivation::GeluTanh => {
                backend.gelu_tanh_mul(&backend.linear(&x, &self.gate_up_proj, None)?)?
            }
        };
        let out = backend.linear(&act, &self.down_proj, None)?;
        Ok(match &self.sandwich_norms {
            Some(norms) => backend.rms_norm(&out, &norms.post_feedforward, eps)?,
            None => out,
        })
    }
}

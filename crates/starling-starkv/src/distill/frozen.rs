//! The model's frozen weights as candle tensors (plain tensors, not variables: autograd never
//! computes gradients for them) and the forward pass of its decoder, with each compressed
//! layer's K and V projection weights supplied by the caller.

use candle_core::{Device, Tensor, D};
use starling_models::{LayerTensor, ModelConfig, WeightMap};

use super::frozen_linear::frozen_linear;
use super::rope::RopeTables;
use super::DistillError;

/// One decoder layer's frozen weights, `[out, in]` as stored.
struct FrozenLayer {
    input_norm: Tensor,
    q_proj: Tensor,
    k_proj: Tensor,
    v_proj: Tensor,
    /// `(q, k, v)` biases (Qwen2).
    qkv_bias: Option<(Tensor, Tensor, Tensor)>,
    o_proj: Tensor,
    post_attention_norm: Tensor,
    gate_proj: Tensor,
    up_proj: Tensor,
    down_proj: Tensor,
}

/// The K and V projection weights one layer uses instead of its own, `[kv_size, hidden]`.
pub(crate) struct KvWeights {
    /// Keys.
    pub(crate) key: Tensor,
    /// Values.
    pub(crate) value: Tensor,
}

/// A Llama-family decoder (RMSNorm, RoPE, GQA, optional QKV bias, SwiGLU, tied or untied
/// head) in candle ops over f32 host weights.
pub(crate) struct FrozenModel {
    config: ModelConfig,
    embed_tokens: Tensor,
    layers: Vec<FrozenLayer>,
    final_norm: Tensor,
    /// The embedding matrix again when tied (a shared handle, not a copy).
    lm_head: Tensor,
}

/// The candle tensor of weight `name`, checked to have `shape`.
fn tensor(weights: &WeightMap, name: &str, shape: &[usize]) -> Result<Tensor, DistillError> {
    weights
        .check_shape(name, shape)
        .map_err(crate::StarKvError::from)?;
    let host = weights
        .get(name)
        .ok_or_else(|| DistillError::InvalidArgument(format!("weight {name} is missing")))?;
    Ok(Tensor::from_slice(host.data(), shape, &Device::Cpu)?)
}

impl FrozenModel {
    /// Copies every tensor `config` implies out of `weights`.
    pub(crate) fn new(config: &ModelConfig, weights: &WeightMap) -> Result<Self, DistillError> {
        config.validate().map_err(crate::StarKvError::from)?;
        if config.architecture.has_qk_norm() {
            // This student forward has no per-head q/k norm; distilling through it would train
            // against a different model.
            return Err(DistillError::InvalidArgument(format!(
                "distillation does not support {} (per-head q/k norm)",
                config.architecture.name()
            )));
        }
        let layer_tensor =
            |t: LayerTensor, layer: usize| tensor(weights, &t.name(layer), &t.shape(config));
        let mut layers = Vec::with_capacity(config.num_layers);
        for l in 0..config.num_layers {
            let qkv_bias = if config.attention_bias {
                Some((
                    layer_tensor(LayerTensor::QBias, l)?,
                    layer_tensor(LayerTensor::KBias, l)?,
                    layer_tensor(LayerTensor::VBias, l)?,
                ))
            } else {
                None
            };
            layers.push(FrozenLayer {
                input_norm: layer_tensor(LayerTensor::InputNorm, l)?,
                q_proj: layer_tensor(LayerTensor::QProj, l)?,
                k_proj: layer_tensor(LayerTensor::KProj, l)?,
                v_proj: layer_tensor(LayerTensor::VProj, l)?,
                qkv_bias,
                o_proj: layer_tensor(LayerTensor::OProj, l)?,
                post_attention_norm: layer_tensor(LayerTensor::PostAttentionNorm, l)?,
                gate_proj: layer_tensor(LayerTensor::GateProj, l)?,
                up_proj: layer_tensor(LayerTensor::UpProj, l)?,
                down_proj: layer_tensor(LayerTensor::DownProj, l)?,
            });
        }
        let vocab_by_hidden = [config.vocab_size, config.hidden_size];
        let embed_tokens = tensor(weights, "model.embed_tokens.weight", &vocab_by_hidden)?;
        let lm_head = if config.tie_word_embeddings {
            embed_tokens.clone()
        } else {
            tensor(weights, "lm_head.weight", &vocab_by_hidden)?
        };
        Ok(Self {
            config: config.clone(),
            embed_tokens,
            layers,
            final_norm: tensor(weights, "model.norm.weight", &[config.hidden_size])?,
            lm_head,
        })
    }

    /// The embeddings of `ids`, `[T, hidden]`: the residual stream entering layer 0.
    pub(crate) fn embed(&self, ids: &[u32]) -> Result<Tensor, DistillError> {
        if let Some(&bad) = ids
            .iter()
            .find(|&&id| id as usize >= self.config.vocab_size)
        {
            return Err(DistillError::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        let ids = Tensor::from_slice(ids, ids.len(), &Device::Cpu)?;
        Ok(self.embed_tokens.index_select(&ids, 0)?)
    }

    /// Runs layers `from..` on the residual stream `residual` (`[T, hidden]`, positions
    /// `0..T`), with `overrides[l]` replacing layer `l`'s K/V weights when present, and returns
    /// the final normed hidden states `[T, hidden]`.
    pub(crate) fn run_layers(
        &self,
        from: usize,
        residual: &Tensor,
        overrides: &[Option<KvWeights>],
        rope: &RopeTables,
    ) -> Result<Tensor, DistillError> {
        let mut residual = residual.clone();
        for (l, layer) in self.layers.iter().enumerate().skip(from) {
            let kv = overrides.get(l).and_then(Option::as_ref);
            residual = self.layer(layer, &residual, kv, rope)?;
        }
        rms_norm(&residual, &self.final_norm, self.config.rms_norm_eps)
    }

    /// The residual stream entering layer `until` (layers `..until` with their own weights),
    /// and nothing tracked: the part of the model the student shares with the teacher.
    pub(crate) fn prefix(
        &self,
        ids: &[u32],
        until: usize,
        rope: &RopeTables,
    ) -> Result<Tensor, DistillError> {
        let mut residual = self.embed(ids)?;
        for layer in self.layers.iter().take(until) {
            residual = self.layer(layer, &residual, None, rope)?;
        }
        Ok(residual)
    }

    /// Logits `[T, vocab]` of final normed hidden states.
    pub(crate) fn logits(&self, hidden: &Tensor) -> Result<Tensor, DistillError> {
        frozen_linear(hidden, &self.lm_head)
    }

    /// One pre-norm decoder layer: `r + attn(norm(r))`, then `+ mlp(norm(·))`.
    fn layer(
        &self,
        layer: &FrozenLayer,
        residual: &Tensor,
        kv: Option<&KvWeights>,
        rope: &RopeTables,
    ) -> Result<Tensor, DistillError> {
        let c = &self.config;
        let eps = c.rms_norm_eps;
        let x = rms_norm(residual, &layer.input_norm, eps)?;
        // Student K/V weights are graph nodes (their gradient reaches `α`); the rest frozen.
        let (mut k, mut v) = match kv {
            Some(kv) => (linear(&x, &kv.key)?, linear(&x, &kv.value)?),
            None => (
                frozen_linear(&x, &layer.k_proj)?,
                frozen_linear(&x, &layer.v_proj)?,
            ),
        };
        let mut q = frozen_linear(&x, &layer.q_proj)?;
        if let Some((qb, kb, vb)) = &layer.qkv_bias {
            q = q.broadcast_add(qb)?;
            k = k.broadcast_add(kb)?;
            v = v.broadcast_add(vb)?;
        }
        let t = x.dim(0)?;
        let (heads, kv_heads, hd) = (c.num_attention_heads, c.num_kv_heads, c.head_dim);
        let q = rope.apply(&q.reshape((t, heads, hd))?)?;
        let k = rope.apply(&k.reshape((t, kv_heads, hd))?)?;
        let v = v.reshape((t, kv_heads, hd))?;
        let attn = causal_attention(&q, &k, &v, rope.causal_mask())?;
        let residual = (residual + frozen_linear(&attn, &layer.o_proj)?)?;
        let x = rms_norm(&residual, &layer.post_attention_norm, eps)?;
        let gate = frozen_linear(&x, &layer.gate_proj)?.silu()?;
        let act = (gate * frozen_linear(&x, &layer.up_proj)?)?;
        Ok((residual + frozen_linear(&act, &layer.down_proj)?)?)
    }
}

/// `x Wᵀ` for `x [T, in]`, `W [out, in]`, differentiable in both.
fn linear(x: &Tensor, weight: &Tensor) -> Result<Tensor, DistillError> {
    Ok(x.matmul(&weight.t()?)?)
}

/// `x / sqrt(mean(x²) + eps) · w`, per row.
fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor, DistillError> {
    let mean_sq = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (mean_sq + f64::from(eps))?.sqrt()?.recip()?;
    Ok(x.broadcast_mul(&inv)?.broadcast_mul(weight)?)
}

/// Causal softmax attention of `q [T, heads, hd]` over `k`, `v` `[T, kv_heads, hd]` (query
/// head `h` reads KV head `h / (heads / kv_heads)`), scaled by `1/√hd`; returns
/// `[T, heads · hd]`. `mask` is `[T, T]`, 0 on and below the diagonal, −∞ above.
fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
) -> Result<Tensor, DistillError> {
    let (t, heads, hd) = q.dims3()?;
    let kv_heads = k.dim(1)?;
    let group = heads / kv_heads;
    let repeat = |x: &Tensor| -> Result<Tensor, DistillError> {
        let x = x.transpose(0, 1)?.contiguous()?; // [kv_heads, T, hd]
        Ok(x.unsqueeze(1)?
            .broadcast_as((kv_heads, group, t, hd))?
            .contiguous()?
            .reshape((heads, t, hd))?)
    };
    let q = q.transpose(0, 1)?.contiguous()?; // [heads, T, hd]
    let (k, v) = (repeat(k)?, repeat(v)?);
    let scale = 1.0 / (hd as f64).sqrt();
    let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(mask)?;
    // The max is a constant shift of the softmax: detaching it changes no gradient.
    let max = scores.max_keepdim(D::Minus1)?.detach();
    let exp = scores.broadcast_sub(&max)?.exp()?;
    let probs = exp.broadcast_div(&exp.sum_keepdim(D::Minus1)?)?;
    let out = probs.matmul(&v)?; // [heads, T, hd]
    Ok(out
        .transpose(0, 1)?
        .contiguous()?
        .reshape((t, heads * hd))?)
}

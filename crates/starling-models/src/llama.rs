//! The Llama-family decoder (Llama 2/3, SmolLM2, Mistral-style, Qwen2 with Q/K/V bias), written once
//! against [`Backend`] ops. Attention receives the paged cache from the caller; the model owns no
//! KV state.

use starling_backend::{
    AttentionDims, Backend, BatchMeta, HostTensor, KvCacheSpec, RopeSpec, RopeStyle as OpRopeStyle,
};

use crate::config::{rope_inv_freqs, ModelConfig, RopeStyle};
use crate::loader::WeightMap;
use crate::ModelError;

/// One decoder layer's weights in backend memory (Q/K/V and gate/up fused at load).
struct DecoderLayer<B: Backend> {
    input_norm: B::Tensor,
    qkv_weight: B::Tensor,
    qkv_bias: Option<B::Tensor>,
    o_proj: B::Tensor,
    post_attention_norm: B::Tensor,
    gate_up_proj: B::Tensor,
    down_proj: B::Tensor,
}

/// A loaded decoder-only model on backend `B`.
pub struct LlamaModel<B: Backend> {
    config: ModelConfig,
    dims: AttentionDims,
    rope: RopeSpec,
    embed_tokens: B::Tensor,
    layers: Vec<DecoderLayer<B>>,
    final_norm: B::Tensor,
    /// `None` when the LM head is tied to the embedding matrix.
    lm_head: Option<B::Tensor>,
}

/// Concatenates matrices with equal column counts along rows (for fused projections).
fn concat_rows(parts: &[HostTensor]) -> Result<HostTensor, ModelError> {
    let cols = parts
        .first()
        .map(|p| *p.shape().last().unwrap_or(&0))
        .unwrap_or(0);
    let mut rows = 0;
    let mut data = Vec::with_capacity(parts.iter().map(|p| p.numel()).sum());
    for p in parts {
        let (r, c) = match p.shape() {
            [n] => (1, *n),
            [r, c] => (*r, *c),
            s => {
                return Err(ModelError::InvalidConfig(format!(
                    "cannot fuse tensor of shape {s:?}"
                )))
            }
        };
        if c != cols && p.shape().len() == 2 {
            return Err(ModelError::InvalidConfig(format!(
                "cannot fuse {c} columns with {cols}"
            )));
        }
        rows += r;
        data.extend_from_slice(p.data());
    }
    let shape = if parts.iter().all(|p| p.shape().len() == 1) {
        vec![data.len()]
    } else {
        vec![rows, cols]
    };
    Ok(HostTensor::new(shape, data)?)
}

impl<B: Backend> LlamaModel<B> {
    /// Takes every tensor the config implies out of `weights` and uploads it; a missing tensor or a
    /// wrong shape is an error naming the tensor.
    pub fn load(
        backend: &B,
        config: &ModelConfig,
        mut weights: WeightMap,
    ) -> Result<Self, ModelError> {
        config.validate()?;
        let (d, q, kv, f) = (
            config.hidden_size,
            config.q_size(),
            config.kv_size(),
            config.intermediate_size,
        );
        let embed = weights.take("model.embed_tokens.weight", &[config.vocab_size, d])?;
        let mut layers = Vec::with_capacity(config.num_layers);
        for l in 0..config.num_layers {
            let p = format!("model.layers.{l}");
            let wq = weights.take(&format!("{p}.self_attn.q_proj.weight"), &[q, d])?;
            let wk = weights.take(&format!("{p}.self_attn.k_proj.weight"), &[kv, d])?;
            let wv = weights.take(&format!("{p}.self_attn.v_proj.weight"), &[kv, d])?;
            let qkv_bias = if config.attention_bias {
                let bq = weights.take(&format!("{p}.self_attn.q_proj.bias"), &[q])?;
                let bk = weights.take(&format!("{p}.self_attn.k_proj.bias"), &[kv])?;
                let bv = weights.take(&format!("{p}.self_attn.v_proj.bias"), &[kv])?;
                Some(backend.upload(&concat_rows(&[bq, bk, bv])?)?)
            } else {
                None
            };
            let gate = weights.take(&format!("{p}.mlp.gate_proj.weight"), &[f, d])?;
            let up = weights.take(&format!("{p}.mlp.up_proj.weight"), &[f, d])?;
            layers.push(DecoderLayer {
                input_norm: backend
                    .upload(&weights.take(&format!("{p}.input_layernorm.weight"), &[d])?)?,
                qkv_weight: backend.upload(&concat_rows(&[wq, wk, wv])?)?,
                qkv_bias,
                o_proj: backend
                    .upload(&weights.take(&format!("{p}.self_attn.o_proj.weight"), &[d, q])?)?,
                post_attention_norm: backend.upload(
                    &weights.take(&format!("{p}.post_attention_layernorm.weight"), &[d])?,
                )?,
                gate_up_proj: backend.upload(&concat_rows(&[gate, up])?)?,
                down_proj: backend
                    .upload(&weights.take(&format!("{p}.mlp.down_proj.weight"), &[d, f])?)?,
            });
        }
        let final_norm = backend.upload(&weights.take("model.norm.weight", &[d])?)?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(backend.upload(&weights.take("lm_head.weight", &[config.vocab_size, d])?)?)
        };
        let style = match config.rope.style {
            RopeStyle::Interleaved => OpRopeStyle::Interleaved,
            RopeStyle::Neox => OpRopeStyle::Neox,
        };
        Ok(Self {
            dims: AttentionDims {
                num_heads: config.num_attention_heads,
                num_kv_heads: config.num_kv_heads,
                head_dim: config.head_dim,
                scale: 1.0 / (config.head_dim as f32).sqrt(),
            },
            rope: RopeSpec {
                inv_freqs: rope_inv_freqs(&config.rope, config.head_dim),
                style,
            },
            embed_tokens: backend.upload(&embed)?,
            layers,
            final_norm,
            lm_head,
            config: config.clone(),
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Attention head geometry (the same in every layer).
    pub fn attention_dims(&self) -> &AttentionDims {
        &self.dims
    }

    /// The per-layer cache geometry for a pool of `num_blocks` blocks.
    pub fn kv_cache_spec(&self, num_blocks: usize, block_size_tokens: usize) -> KvCacheSpec {
        KvCacheSpec {
            num_blocks,
            block_size_tokens,
            num_kv_heads: self.config.num_kv_heads,
            head_dim: self.config.head_dim,
        }
    }

    /// Runs the batch's tokens through the model, writing their K/V into `caches` (one per layer),
    /// and returns the logits `[meta.logits_rows.len(), vocab]` of the requested rows.
    pub fn forward(
        &self,
        backend: &B,
        token_ids: &[u32],
        meta: &BatchMeta,
        batch: &B::Batch,
        caches: &mut [B::KvCache],
    ) -> Result<HostTensor, ModelError> {
        if caches.len() != self.layers.len() || token_ids.len() != meta.num_tokens() {
            return Err(ModelError::InvalidConfig(format!(
                "forward: {} caches for {} layers, {} ids for {} batch rows",
                caches.len(),
                self.layers.len(),
                token_ids.len(),
                meta.num_tokens()
            )));
        }
        let eps = self.config.rms_norm_eps;
        let mut residual = backend.embedding(&self.embed_tokens, token_ids)?;
        let mut pending_delta: Option<B::Tensor> = None;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            let x = match pending_delta.take() {
                None => backend.rms_norm(&residual, &layer.input_norm, eps)?,
                Some(delta) => {
                    backend.add_rms_norm(&mut residual, &delta, &layer.input_norm, eps)?
                }
            };
            let mut qkv = backend.linear(&x, &layer.qkv_weight, layer.qkv_bias.as_ref())?;
            backend.rope_qk(&mut qkv, &self.dims, &self.rope, batch)?;
            backend.write_kv(cache, &qkv, &self.dims, batch)?;
            let attn = backend.paged_attention(&qkv, cache, &self.dims, batch)?;
            let attn_out = backend.linear(&attn, &layer.o_proj, None)?;
            let x =
                backend.add_rms_norm(&mut residual, &attn_out, &layer.post_attention_norm, eps)?;
            let gate_up = backend.linear(&x, &layer.gate_up_proj, None)?;
            let act = backend.silu_mul(&gate_up)?;
            pending_delta = Some(backend.linear(&act, &layer.down_proj, None)?);
        }
        if let Some(delta) = pending_delta {
            backend.add_inplace(&mut residual, &delta)?;
        }
        let last = backend.gather_rows(&residual, &meta.logits_rows)?;
        let normed = backend.rms_norm(&last, &self.final_norm, eps)?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        let logits = backend.linear(&normed, head, None)?;
        Ok(backend.to_host(&logits)?)
    }
}

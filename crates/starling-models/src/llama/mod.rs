//! The Llama-family decoder (Llama 2/3, SmolLM2, Mistral-style, Qwen2 with Q/K/V bias, Qwen3
//! with per-head Q/K norms), written once against [`Backend`] ops. Attention receives the paged
//! cache from the caller; the model owns no KV state.
//!
//! By concern: `load` (weights from a checkpoint or synthetic, fused at load), `latent` (STAR-KV
//! latent layers), `layer` (one decoder layer's step), `head` (the final norm and the logits),
//! `options` (what a forward pass copies to the host besides the logits), `forward` (the one
//! forward pass and the single-sequence reference runs built on it).

mod forward;
mod fp8_fit;
mod head;
mod latent;
mod layer;
mod load;
mod options;

use starling_backend::{AttentionDims, Backend, KvCacheSpec, LatentFactors, RopeSpec};
use starling_kv::{CacheDtype, CacheGroups, CacheLayout, LayerLayout};

use crate::config::ModelConfig;
use crate::ModelError;

pub use fp8_fit::{
    fp8_exempt_layers_of, fp8_holds_key_bias, fp8_max_key_bias, key_bias_max_abs, FP8_MAX_KEY_BIAS,
    FP8_MAX_KEY_BIAS_ENV,
};
pub use head::Logits;
pub use latent::{LatentLayerWeights, LatentRanks};
pub use options::{ActivationCapture, ForwardOptions, QueryCapture};

use latent::LatentLayer;
use layer::DecoderLayer;

/// A loaded decoder-only model on backend `B`.
pub struct LlamaModel<B: Backend> {
    config: ModelConfig,
    dims: AttentionDims,
    rope: RopeSpec,
    embed_tokens: B::Tensor,
    layers: Vec<DecoderLayer<B>>,
    /// Which layers share a block table, and the cache tensor each layer uses.
    cache_groups: CacheGroups,
    final_norm: B::Tensor,
    /// `None` when the LM head is tied to the embedding matrix.
    lm_head: Option<B::Tensor>,
    /// The backend's own cache dtype, which layers an fp8 cache cannot hold keep
    /// ([`fp8_exempt_layers`](Self::fp8_exempt_layers)).
    activation_cache_dtype: CacheDtype,
}

impl<B: Backend> LlamaModel<B> {
    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Attention head geometry (the same in every layer).
    pub fn attention_dims(&self) -> &AttentionDims {
        &self.dims
    }

    /// What each layer caches per token with `dtype` elements: full K/V, or the latent ranks of
    /// a STAR-KV layer. The one description the engine sizes, checks and allocates the cache
    /// from.
    /// With `dtype` fp8, the layers an fp8 cache cannot hold
    /// ([`fp8_exempt_layers`](Self::fp8_exempt_layers)) keep the backend's own dtype.
    pub fn cache_layout(&self, dtype: CacheDtype) -> CacheLayout {
        let layers = self
            .layers
            .iter()
            .map(|layer| match &layer.latent {
                None => LayerLayout::Full {
                    num_kv_heads: self.config.num_kv_heads,
                    head_dim: self.config.head_dim,
                    dtype: if dtype == CacheDtype::Fp8 && !layer.fp8_keys_fit() {
                        self.activation_cache_dtype
                    } else {
                        dtype
                    },
                },
                Some(latent) => latent.ranks.layout(dtype),
            })
            .collect();
        CacheLayout { layers }
    }

    /// The layers whose keys an fp8 cache cannot hold (a key bias above [`FP8_MAX_KEY_BIAS`]):
    /// under `--kv-cache-dtype fp8` they keep the activation dtype.
    pub fn fp8_exempt_layers(&self) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&l| !self.layers[l].fp8_keys_fit())
            .collect()
    }

    /// Which layers share a block table ([`CacheGroups`]): one group unless the model mixes
    /// sliding-window and full-attention layers (Gemma-3).
    pub fn cache_groups(&self) -> &CacheGroups {
        &self.cache_groups
    }

    /// Puts every layer back into one cache group with one cache tensor each, windowed layers
    /// included (they still attend over their window, but keep every slot): what token
    /// eviction on a sliding-window model needs, since a compaction keeps old tokens that a
    /// windowed group's release would have given back.
    pub fn keep_every_slot(&mut self) {
        self.cache_groups = CacheGroups::single(self.layers.len());
        for (l, layer) in self.layers.iter_mut().enumerate() {
            (layer.cache_group, layer.cache_slot) = (0, l);
        }
    }

    /// What one block of the cache holds per token slot, one entry per cache tensor: the
    /// per-layer [`cache_layout`](Self::cache_layout) with one cache group; with several, the
    /// group size's worth of the (identical) layers' layout, since a block serves the layers
    /// of whichever group owns it. What the engine sizes and allocates the cache from.
    pub fn block_layout(&self, dtype: CacheDtype) -> CacheLayout {
        let per_layer = self.cache_layout(dtype);
        if self.cache_groups.num_groups() == 1 {
            return per_layer;
        }
        // Cache tensors are shared across groups: one layer that keeps the activation dtype
        // keeps it for every slot.
        let slot = per_layer
            .layers
            .iter()
            .find(|l| l.dtype() != dtype)
            .or(per_layer.layers.first())
            .cloned();
        CacheLayout {
            layers: slot
                .map(|l| vec![l; self.cache_groups.num_slots()])
                .unwrap_or_default(),
        }
    }

    /// Every cache tensor's spec for a pool of `num_blocks` blocks (from
    /// [`block_layout`](Self::block_layout)).
    pub fn kv_cache_specs(
        &self,
        num_blocks: usize,
        block_size_tokens: usize,
        dtype: CacheDtype,
    ) -> Vec<KvCacheSpec> {
        self.block_layout(dtype)
            .layers
            .into_iter()
            .map(|layout| KvCacheSpec {
                num_blocks,
                block_size_tokens,
                layout,
            })
            .collect()
    }

    /// Allocates every cache tensor (zero-filled; one per layer unless [`Self::cache_groups`]
    /// shares them) for a pool of `num_blocks` blocks in the
    /// backend's cache dtype.
    pub fn alloc_kv_caches(
        &self,
        backend: &B,
        num_blocks: usize,
        block_size_tokens: usize,
    ) -> Result<Vec<B::KvCache>, ModelError> {
        self.kv_cache_specs(num_blocks, block_size_tokens, backend.kv_cache_dtype())
            .iter()
            .map(|spec| Ok(backend.alloc_kv_cache(spec)?))
            .collect()
    }

    /// The stored latent ranks of each layer (`None`: full K/V).
    pub fn latent_ranks(&self) -> Vec<Option<LatentRanks>> {
        self.layers
            .iter()
            .map(|l| l.latent.as_ref().map(|lat| lat.ranks.clone()))
            .collect()
    }

    /// Whether any layer caches STAR-KV latents.
    pub fn has_latent_layers(&self) -> bool {
        self.layers.iter().any(|l| l.latent.is_some())
    }

    /// Layer `layer`'s up-projections when it caches latents (what reconstructing its keys and
    /// values needs, e.g. to score them for eviction).
    pub fn latent_factors(&self, layer: usize) -> Option<LatentFactors<'_, B::Tensor>> {
        self.layers
            .get(layer)
            .and_then(|l| l.latent.as_ref())
            .map(LatentLayer::factors)
    }

    /// The rotary embedding every layer applies.
    pub fn rope(&self) -> &RopeSpec {
        &self.rope
    }
}
